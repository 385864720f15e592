/*
 * tools/kvvm-bench/bench_prefix.c: the prefix group (issue 21): the prefix cache keyed by
 * content beside baselines measured in the same run.
 *
 *  - lookup per key: kvvm_prefix_lookup of chains of CHAIN keys (the public call: lock,
 *    call frame, one probe per key), per key, beside a bare open-addressing hash map of the
 *    same (namespace, 32-byte key) records looked up with the same keys in the same order
 *    (linear probing, load 1/2, the key's first word as hash: a map that does nothing but
 *    find). Goal: <= 1.5x. Also a miss (a chain not cached: the first key misses).
 *  - attach of CHAIN device blocks (kvvm_prefix_attach + kvvm_seq_free) beside
 *    kvvm_seq_share of the same pages from a sequence holding them (share + free).
 *  - memory per entry: the index's bytes (records and page ids, at its load) per entry.
 *
 * Workload: 1 region, 4 KiB pages of 16 tokens (the emulated granule 4 KiB unless
 * --granule), ENTRIES entries in chains of CHAIN blocks, their publishers freed.
 */
#include "bench.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvvm.h"
#include "kvvm_testing.h"

#define G "prefix"
#define CHAIN 64
#define NCHAINS 64
#define ENTRIES ((size_t)CHAIN * NCHAINS)
#define TPB 16

/* ---- the baseline: a bare open-addressing map of (ns, key) -> u32 ---------------------- */

struct bare_rec { uint64_t key[4]; uint64_t ns; uint32_t val, full; };
struct bare { struct bare_rec *r; uint32_t mask; };

static uint64_t bare_hash(const uint64_t *k, uint64_t ns) { return k[0] ^ ns; }

static int bare_init(struct bare *m, uint32_t n)
{
    uint32_t cap = 1;
    while (cap < 2 * n)
        cap *= 2;
    m->r = calloc(cap, sizeof *m->r);
    m->mask = cap - 1;
    return m->r ? 0 : -ENOMEM;
}

static void bare_put(struct bare *m, const kvvm_key *key, uint64_t ns, uint32_t v)
{
    uint64_t k[4];
    memcpy(k, key, sizeof k);
    uint32_t i = (uint32_t)bare_hash(k, ns) & m->mask;
    while (m->r[i].full)
        i = (i + 1) & m->mask;
    m->r[i] = (struct bare_rec){ { k[0], k[1], k[2], k[3] }, ns, v, 1 };
}

/* The leading keys present (as kvvm_prefix_lookup counts them). */
static size_t bare_lookup(const struct bare *m, uint64_t ns, const kvvm_key *keys, size_t n,
                          uint32_t *vals)
{
    size_t b;
    for (b = 0; b < n; b++) {
        uint64_t k[4];
        memcpy(k, &keys[b], sizeof k);
        uint32_t i = (uint32_t)bare_hash(k, ns) & m->mask;
        for (;; i = (i + 1) & m->mask) {
            const struct bare_rec *r = &m->r[i];
            if (!r->full)
                return b;
            if (r->key[0] == k[0] && r->key[1] == k[1] && r->ns == ns && r->key[2] == k[2] &&
                r->key[3] == k[3])
                break;
        }
        vals[b] = m->r[i].val;
    }
    return b;
}

/* ---- the library side ------------------------------------------------------------------ */

static int open_ctx(struct bench_ctx *b, kvvm **kv)
{
    size_t gran = b->granule ? b->granule : 4096;
    struct kvvm_config c;
    bench_config(&c, b->backend, gran, 0, 1, gran / TPB, 8, (uint64_t)CHAIN * TPB,
                 (ENTRIES + (size_t)4 * CHAIN) * gran);
    c.pool_thread = 0;
    return kvvm_open(&c, kv);
}

/* Chain j's keys (tokens j * 100000 + i). */
static void chain_keys(int j, kvvm_key *k)
{
    static int32_t tok[CHAIN * TPB];
    for (int i = 0; i < CHAIN * TPB; i++)
        tok[i] = j * 100000 + i;
    (void)kvvm_prefix_keys(tok, (size_t)CHAIN * TPB, TPB, NULL, 0, k, CHAIN);
}

static double lookup_ns(kvvm *kv, const kvvm_key *keys, int reps, int *bad)
{
    uint64_t t0 = bench_now_ns();
    for (int r = 0; r < reps; r++)
        for (int j = 0; j < NCHAINS; j++)
            *bad |= kvvm_prefix_lookup(kv, 1, keys + (size_t)j * CHAIN, CHAIN, NULL) != CHAIN;
    return (double)(bench_now_ns() - t0) / ((double)reps * ENTRIES);
}

/* The index alone (prefix_lookup under the context lock, no call frame). */
static double index_ns(kvvm *kv, const kvvm_key *keys, int reps, int *bad)
{
    uint64_t t0 = bench_now_ns();
    long r = kvvm_testing_prefix_index_lookups(kv, 1, keys, NCHAINS, CHAIN, reps);
    double ns = (double)(bench_now_ns() - t0) / ((double)reps * ENTRIES);
    *bad |= r != 0;
    return ns;
}

static double bare_ns(const struct bare *m, const kvvm_key *keys, int reps, int *bad)
{
    uint32_t vals[CHAIN];
    uint64_t t0 = bench_now_ns();
    for (int r = 0; r < reps; r++)
        for (int j = 0; j < NCHAINS; j++)
            *bad |= bare_lookup(m, 1, keys + (size_t)j * CHAIN, CHAIN, vals) != CHAIN;
    return (double)(bench_now_ns() - t0) / ((double)reps * ENTRIES);
}

static int populate(kvvm *kv, kvvm_key *keys, struct bare *m)
{
    for (int j = 0; j < NCHAINS; j++) {
        kvvm_seq s;
        int rc = kvvm_seq_create(kv, &s);
        if (!rc)
            rc = kvvm_seq_grow(kv, s, (uint64_t)CHAIN * TPB);
        chain_keys(j, keys + (size_t)j * CHAIN);
        if (!rc && kvvm_prefix_publish(kv, s, 1, keys + (size_t)j * CHAIN, CHAIN) != CHAIN)
            rc = -EIO;
        if (rc)
            return rc;
        (void)kvvm_seq_free(kv, s);
        for (int i = 0; i < CHAIN; i++)
            bare_put(m, &keys[(size_t)j * CHAIN + i], 1, (uint32_t)(j * CHAIN + i));
    }
    return 0;
}

/* attach of a chain into an empty sequence, then free; against share of the same pages. */
static int attach_vs_share(struct bench_ctx *b, kvvm *kv, const kvvm_key *keys, int trials)
{
    double *ta = calloc((size_t)trials, sizeof *ta), *ts = calloc((size_t)trials, sizeof *ts);
    kvvm_seq src, d;
    int rc = ta && ts ? kvvm_seq_create(kv, &src) : -ENOMEM;
    if (!rc)
        rc = kvvm_prefix_attach(kv, src, 1, keys, CHAIN) == CHAIN ? 0 : -EIO;
    for (int t = 0; !rc && t < trials; t++) {
        uint64_t t0 = bench_now_ns();
        rc = kvvm_seq_create(kv, &d);
        if (!rc)
            rc = kvvm_prefix_attach(kv, d, 1, keys, CHAIN) == CHAIN ? 0 : -EIO;
        if (!rc)
            rc = kvvm_seq_free(kv, d);
        uint64_t t1 = bench_now_ns();
        if (!rc)
            rc = kvvm_seq_create(kv, &d);
        if (!rc)
            rc = kvvm_seq_share(kv, d, src, (uint64_t)CHAIN * TPB);
        if (!rc)
            rc = kvvm_seq_free(kv, d);
        ta[t] = (double)(t1 - t0) / 1e3;
        ts[t] = (double)(bench_now_ns() - t1) / 1e3;
        (void)kvvm_sync(kv);
    }
    if (!rc)
        bench_report_trials(b, G, "attach 64 device blocks (+create, free)", ta, ts, trials,
                            "kvvm_seq_share of the same pages", "us/op", 1);
    free(ta);
    free(ts);
    return rc;
}

/* ---- lookup against the bare map, alternated ------------------------------------------ */

#define LK_MAX_TRIALS 64
#define LK_ROUNDS 20                    /* alternated rounds per trial */
enum { LK_LIB, LK_BARE, LK_INDEX, LK_N };

/* The 25th and 75th percentiles of v[0..n) (sorts v). */
static void quartiles(double *v, int n, double *p25, double *p75)
{
    (void)bench_median(v, n);           /* sorts */
    *p25 = v[(n - 1) / 4];
    *p75 = v[(3 * (n - 1) + 3) / 4];
}

/* Trials of the three lookups (the public call, the bare map, the index alone) over the same
   keys in the same order. A trial is LK_ROUNDS rounds of short samples (a few passes over
   every key), each round running the three in a rotated order, so that none always runs in
   another's wake and a burst of load on the machine falls on all three alike; a trial's
   figure per side is its median over the rounds (a round preempted on a loaded machine
   does not move it). Reports the medians over trials, the ratio of
   the medians, and the 25th..75th percentile of the per-trial ratios. */
static int lookup_rows(struct bench_ctx *b, kvvm *kv, const kvvm_key *keys,
                       const struct bare *m, int *bad)
{
    int trials = b->trials > 0 ? b->trials : (b->quick ? 3 : 9), passes = b->quick ? 1 : 4;
    double t[LK_N][LK_MAX_TRIALS], rl[LK_MAX_TRIALS], ri[LK_MAX_TRIALS], q[4];
    if (trials > LK_MAX_TRIALS)
        trials = LK_MAX_TRIALS;
    for (int i = 0; i < trials; i++) {
        double u[LK_N][LK_ROUNDS];
        for (int r = 0; r < LK_ROUNDS; r++)
            for (int k = 0; k < LK_N; k++) {
                int side = (r + k) % LK_N;
                if (side == LK_LIB)
                    u[side][r] = lookup_ns(kv, keys, passes, bad);
                else if (side == LK_BARE)
                    u[side][r] = bare_ns(m, keys, passes, bad);
                else
                    u[side][r] = index_ns(kv, keys, passes, bad);
            }
        for (int k = 0; k < LK_N; k++)
            t[k][i] = bench_median(u[k], LK_ROUNDS);
        rl[i] = t[LK_LIB][i] / t[LK_BARE][i];
        ri[i] = t[LK_INDEX][i] / t[LK_BARE][i];
    }
    if (*bad)
        return -EIO;
    double base = bench_median(t[LK_BARE], trials);
    bench_report(b, G, "lookup per key (chains of 64 hits, 4096 entries)",
                 bench_median(t[LK_LIB], trials), base, "bare open-addressing map", "ns/op", 1);
    bench_report(b, G, "index lookup per key (no call frame)", bench_median(t[LK_INDEX], trials),
                 base, "bare open-addressing map", "ns/op", 1);
    quartiles(rl, trials, &q[0], &q[1]);
    quartiles(ri, trials, &q[2], &q[3]);
    printf("%-8s lookup/bare per trial, 25th..75th percentile of %d trials of %d alternated "
           "rounds: public call %.2f..%.2f, index alone %.2f..%.2f\n", G, trials, LK_ROUNDS,
           q[0], q[1], q[2], q[3]);
    return 0;
}

int bench_prefix(struct bench_ctx *b)
{
    kvvm *kv = NULL;
    struct bare m = { 0 };
    kvvm_key *keys = calloc(ENTRIES, sizeof *keys), miss[CHAIN];
    int trials = b->trials > 0 ? b->trials : (b->quick ? 3 : 5);
    int reps = b->quick ? 20 : 200, bad = 0;
    int rc = keys ? bare_init(&m, ENTRIES) : -ENOMEM;
    if (!rc)
        rc = open_ctx(b, &kv);
    if (!rc)
        rc = populate(kv, keys, &m);
    if (!rc)
        rc = lookup_rows(b, kv, keys, &m, &bad);
    double tm[16];
    if (trials > 16)
        trials = 16;
    chain_keys(NCHAINS + 1, miss);
    for (int t = 0; !rc && t < trials; t++) {
        uint64_t t0 = bench_now_ns();
        for (int r = 0; r < reps * NCHAINS; r++)
            bad |= kvvm_prefix_lookup(kv, 1, miss, CHAIN, NULL) != 0;
        tm[t] = (double)(bench_now_ns() - t0) / ((double)reps * (double)NCHAINS);
    }
    if (!rc && bad)
        rc = -EIO;
    if (!rc) {
        bench_report_trials(b, G, "lookup of a missing chain (per call)", tm, NULL, trials,
                            NULL, "ns/op", 1);
        rc = attach_vs_share(b, kv, keys, trials);
    }
    if (!rc) {
        uint64_t entries = 0, bytes = 0;
        rc = kvvm_testing_prefix_memory(kv, &entries, &bytes);
        if (!rc && entries)
            bench_report(b, G, "index bytes per entry (slots, records, ticks, page ids)",
                         (double)bytes / (double)entries, 0, NULL, "B", 1);
    }
    kvvm_close(kv);
    free(m.r);
    free(keys);
    return rc;
}
