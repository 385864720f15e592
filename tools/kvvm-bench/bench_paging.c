/*
 * tools/kvvm-bench/bench_paging.c: the paging group (issue 3, item 7), each figure beside a
 * baseline measured in the same run, on the emulated device (2 MiB granule unless noted):
 *  - growing S sequences token by token to T tokens (the whole ~1 GiB), against contiguous
 *    buffers grown by allocate-copy-free with doubling, and static preallocation at max:
 *    wall time, CPU time per grow call, peak physical bytes;
 *  - fork and share of a 64-page sequence: latency against a copying fork; pages added
 *    (no ratio: the copying fork's count is in the row's name);
 *  - pool page take+give rate, and beside it (no ratio: not the same work) what a page
 *    create+release costs; 256 single grows against one batch;
 *  - the decode step's grow (no new page; 8 regions, at 1k and 64k tokens) and grow_batch
 *    of 256, against the floor of any locked call (mutex lock + table lookup + unlock),
 *    alternated within each trial, medians and the ratio's spread over --trials.
 * The raw baselines below the public API (the pool, a page create, a device copy) come
 * through the testing interface (testing/kvvm_testing.h).
 */
#include "bench.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvvm.h"
#include "kvvm_testing.h"

#define G "paging"

static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int open_kv(kvvm **kv, uint32_t max_seqs, uint64_t max_tokens, uint64_t bpt,
                   size_t budget, size_t granule)
{
    struct kvvm_config c;
    kvvm_config_init(&c);
    c.backend = KVVM_BACKEND_EMULATED;
    c.max_seqs = max_seqs;
    c.max_tokens = max_tokens;
    c.bytes_per_token = bpt;
    c.device_budget = budget;
    c.emu_granule = granule;
    c.page_size = 0;
    c.emu_opaque = 0;
    return kvvm_open(&c, kv);
}

static uint64_t used_bytes(kvvm *kv)
{
    struct kvvm_stats st = { .size = sizeof st };
    kvvm_stats(kv, &st);
    return (st.pages_device_total - st.pages_device_free) * st.page_size;
}

/* ---- 1. token-by-token growth ------------------------------------------------------- */

struct grow_res { double wall_ms, cpu_ns_per_call, peak_bytes, quarter_bytes; };

/* Grows S sequences token by token to T tokens, `passes` times over in one context (all
   freed between passes), and times the last pass. Pass 1 pays for creating the physical
   frames; later passes reuse them, as an engine serving request after request does. */
static int grow_kvvm(uint32_t S, uint64_t T, uint64_t bpt, int passes, struct grow_res *res)
{
    kvvm *kv;
    memset(res, 0, sizeof *res);
    int rc = open_kv(&kv, S, T, bpt, (size_t)(S * T * bpt) + (64u << 20) + ((size_t)S << 21),
                     0);
    if (rc)
        return rc;
    kvvm_seq *h = calloc(S, sizeof *h);
    if (!h) {
        kvvm_close(kv);
        return -ENOMEM;
    }
    for (int pass = 1; pass <= passes && !rc; pass++) {
        uint64_t peak = 0;
        for (uint32_t i = 0; i < S && !rc; i++)
            rc = kvvm_seq_create(kv, &h[i]);
        uint64_t w0 = bench_now_ns(), c0 = cpu_ns();
        for (uint64_t t = 1; t <= T && !rc; t++) {
            for (uint32_t i = 0; i < S && !rc; i++)
                rc = kvvm_seq_grow(kv, h[i], t);
            if (!rc)
                rc = kvvm_step(kv);
            if ((t & 63) == 0 || t == T) {
                uint64_t u = used_bytes(kv);
                peak = u > peak ? u : peak;
            }
            if (t == T / 4)
                res->quarter_bytes = (double)used_bytes(kv);
        }
        uint64_t w1 = bench_now_ns(), c1 = cpu_ns();
        res->wall_ms = (double)(w1 - w0) / 1e6;
        res->cpu_ns_per_call = (double)(c1 - c0) / ((double)S * (double)T);
        res->peak_bytes = (double)peak;
        for (uint32_t i = 0; i < S; i++)
            if (h[i])
                kvvm_seq_free(kv, h[i]);
        memset(h, 0, S * sizeof *h);
        if (!rc)
            rc = kvvm_sync(kv);
    }
    free(h);
    kvvm_close(kv);
    return rc;
}

/* Contiguous buffers, grown by allocate-copy-free with doubling (host memory: the copy is
   what a device would do with cudaMalloc + cudaMemcpy + cudaFree, minus the driver). */
static int grow_doubling_pass(uint32_t S, uint64_t T, uint64_t bpt, struct grow_res *res)
{
    memset(res, 0, sizeof *res);
    char **buf = calloc(S, sizeof *buf);
    uint64_t *cap = calloc(S, sizeof *cap);
    uint64_t live = 0, peak = 0;
    int rc = 0;
    if (!buf || !cap) {
        rc = -ENOMEM;
        goto out;
    }
    uint64_t w0 = bench_now_ns(), c0 = cpu_ns();
    for (uint64_t t = 1; t <= T && !rc; t++) {
        for (uint32_t i = 0; i < S; i++) {
            uint64_t need = t * bpt;
            if (need <= cap[i])
                continue;
            uint64_t nc = cap[i] ? 2 * cap[i] : bpt * 16;
            char *n = malloc(nc);
            if (!n) {
                rc = -ENOMEM;
                break;
            }
            memset(n + cap[i], 0, nc - cap[i]);     /* touch it: physical, like a device */
            if (buf[i])
                memcpy(n, buf[i], (t - 1) * bpt);
            live += nc;
            peak = live > peak ? live : peak;        /* old and new both held here */
            free(buf[i]);
            live -= cap[i];
            buf[i] = n;
            cap[i] = nc;
        }
    }
    uint64_t w1 = bench_now_ns(), c1 = cpu_ns();
    res->wall_ms = (double)(w1 - w0) / 1e6;
    res->cpu_ns_per_call = (double)(c1 - c0) / ((double)S * (double)T);
    res->peak_bytes = (double)peak;
out:
    if (buf)
        for (uint32_t i = 0; i < S; i++)
            free(buf[i]);
    free(buf);
    free(cap);
    return rc;
}

/* As grow_kvvm: `passes` passes in one process, the last one timed (the allocator then
   reuses memory the earlier passes touched). */
static int grow_doubling(uint32_t S, uint64_t T, uint64_t bpt, int passes, struct grow_res *res)
{
    int rc = 0;
    for (int pass = 1; pass <= passes && !rc; pass++)
        rc = grow_doubling_pass(S, T, bpt, res);
    return rc;
}

static void report_grow(struct bench_ctx *b, const char *when, const struct grow_res *k,
                        const struct grow_res *d)
{
    char op[128];
    snprintf(op, sizeof op, "grow token-by-token, %s: wall", when);
    bench_report(b, G, op, k->wall_ms, d->wall_ms, "alloc-copy-free doubling", "ms", 1);
    snprintf(op, sizeof op, "grow token-by-token, %s: CPU per grow call", when);
    bench_report(b, G, op, k->cpu_ns_per_call, d->cpu_ns_per_call,
                 "alloc-copy-free doubling", "ns/op", 1);
    snprintf(op, sizeof op, "grow token-by-token, %s: peak physical", when);
    bench_report(b, G, op, k->peak_bytes / 1048576.0, d->peak_bytes / 1048576.0,
                 "alloc-copy-free doubling", "MiB", 1);
}

/* Cold: a fresh context, every physical frame created during the run. Warm: the second
   pass in the same context, frames reused (an engine's steady state); the baseline likewise
   runs twice in one process. */
static int bench_grow(struct bench_ctx *b)
{
    uint32_t S = b->quick ? 64 : 256;
    uint64_t T = b->quick ? 1024 : 4096, bpt = 1024;   /* 256 x 4096 x 1 KiB = 1 GiB */
    struct grow_res k, d, kw, dw;
    int rc = grow_kvvm(S, T, bpt, 1, &k);
    if (!rc)
        rc = grow_doubling(S, T, bpt, 1, &d);
    if (!rc)
        rc = grow_kvvm(S, T, bpt, 2, &kw);
    if (!rc)
        rc = grow_doubling(S, T, bpt, 2, &dw);
    if (rc)
        return rc;
    double live = (double)(S * T * bpt), stat = live;   /* static: max length = T here */
    report_grow(b, "cold", &k, &d);
    report_grow(b, "warm", &kw, &dw);
    bench_report(b, G, "peak physical, static prealloc beside",
                 k.peak_bytes / 1048576.0, stat / 1048576.0, "static at max length", "MiB", 1);
    /* at a quarter of the length, static preallocation still holds the maximum */
    bench_report(b, G, "physical at 1/4 of max length", k.quarter_bytes / 1048576.0,
                 stat / 1048576.0, "static at max length", "MiB", 1);
    bench_report(b, G, "live bytes at 1/4 of max length", live / 4 / 1048576.0, 0, "", "MiB", 1);
    return 0;
}

/* ---- 2. fork and share of a 64-page sequence ---------------------------------------- */

static int bench_fork(struct bench_ctx *b)
{
    kvvm *kv;
    const uint64_t bpt = 8192, pages = 64, ps = 2u << 20;
    const uint64_t T = pages * ps / bpt;
    int rc = open_kv(&kv, 8, T, bpt, (size_t)(4 * pages * ps), 0);
    if (rc)
        return rc;
    int n = b->trials > 0 ? b->trials : 5;
    double tf[n], ts[n], tc[n];
    double pf = 0, psh = 0, pc = 0;
    kvvm_seq p;
    rc = kvvm_seq_create(kv, &p);
    if (!rc)
        rc = kvvm_seq_grow(kv, p, T);
    for (int i = 0; i < n && !rc; i++) {
        kvvm_seq c;
        uint64_t u0 = used_bytes(kv), t0 = bench_now_ns();
        rc = kvvm_seq_fork(kv, p, &c);
        tf[i] = (double)(bench_now_ns() - t0) / 1e3;
        pf = (double)(used_bytes(kv) - u0) / (double)ps;
        if (!rc)
            rc = kvvm_seq_free(kv, c);
        if (!rc)
            rc = kvvm_seq_create(kv, &c);
        u0 = used_bytes(kv);
        t0 = bench_now_ns();
        if (!rc)
            rc = kvvm_seq_share(kv, c, p, T);
        ts[i] = (double)(bench_now_ns() - t0) / 1e3;
        psh = (double)(used_bytes(kv) - u0) / (double)ps;
        if (!rc)
            rc = kvvm_seq_free(kv, c);
        /* copying fork: a new sequence of the same length and a device copy of the bytes */
        uint64_t pa, ca;
        if (!rc)
            rc = kvvm_seq_create(kv, &c);
        u0 = used_bytes(kv);
        t0 = bench_now_ns();
        if (!rc)
            rc = kvvm_seq_grow(kv, c, T);
        if (!rc)
            rc = kvvm_seq_addr(kv, p, 0, &pa);
        if (!rc)
            rc = kvvm_seq_addr(kv, c, 0, &ca);
        if (!rc)
            rc = kvvm_testing_device_copy(kv, ca, pa, T * bpt);
        tc[i] = (double)(bench_now_ns() - t0) / 1e3;
        pc = (double)(used_bytes(kv) - u0) / (double)ps;
        if (!rc)
            rc = kvvm_seq_free(kv, c);
        kvvm_sync(kv);
    }
    kvvm_close(kv);
    if (rc)
        return rc;
    double mc = bench_median(tc, n);
    bench_report(b, G, "fork 64-page sequence", bench_median(tf, n), mc, "copying fork",
                 "us/op", 1);
    bench_report(b, G, "share 64-page sequence (whole pages)", bench_median(ts, n), mc,
                 "copying fork", "us/op", 1);
    /* page counts: no ratio (a copying fork adds every page; 0 of 64 is no speed-up) */
    char op[96];
    snprintf(op, sizeof op, "fork: pages added (a copying fork: %.0f)", pc);
    bench_report(b, G, op, pf, 0, NULL, "pages", 1);
    snprintf(op, sizeof op, "share: pages added (a copying fork: %.0f)", pc);
    bench_report(b, G, op, psh, 0, NULL, "pages", 1);
    return 0;
}

/* ---- 3. pool rate, no-page grow, single vs batched grow ----------------------------- */

static int bench_pool(struct bench_ctx *b)
{
    kvvm *kv;
    int rc = open_kv(&kv, 4, 1024, 4096, 64u << 20, 64u << 10);
    if (rc)
        return rc;
    int iters = b->quick ? 20000 : 200000;
    rc = kvvm_testing_pool_refill(kv, 8);
    uint64_t t0 = bench_now_ns();
    if (!rc)
        rc = kvvm_testing_pool_take_give(kv, iters);
    double take_ns = (double)(bench_now_ns() - t0) / iters;
    int citers = iters / 20;
    t0 = bench_now_ns();
    if (!rc)
        rc = kvvm_testing_page_create_release(kv, 64u << 10, citers);
    double create_ns = (double)(bench_now_ns() - t0) / citers;
    kvvm_close(kv);
    if (rc)
        return rc;
    /* two figures, no ratio: the pool exists so that a grow never creates a page; a
       nanosecond list operation "vs" a driver allocation says nothing about either */
    bench_report(b, G, "pool page take+give", take_ns, 0, NULL, "ns/op", 1);
    bench_report(b, G, "page create+release (what the pool saves)", create_ns, 0, NULL,
                 "ns/op", 1);
    return 0;
}

/* The floor of any locked call: n uncontended mutex lock + table lookup + unlock (ns/op). */
static pthread_mutex_t floor_mu = PTHREAD_MUTEX_INITIALIZER;
static volatile uint64_t floor_tab[4096], floor_sink;
static double floor_block(int n)
{
    uint64_t t0 = bench_now_ns();
    for (int i = 0; i < n; i++) {
        pthread_mutex_lock(&floor_mu);
        floor_sink += floor_tab[((uint32_t)i * 2654435761u) & 4095];
        pthread_mutex_unlock(&floor_mu);
    }
    return (double)(bench_now_ns() - t0) / n;
}

/* Reports the medians of v (the library) and f (the floor), trials each, measured
   alternately; the op names the ratio's spread (its 25th..75th percentile over trials). */
static void report_vs_floor(struct bench_ctx *b, const char *what, double *v, double *f,
                            int trials)
{
    double r[64], p25, p75;
    char op[160];
    for (int t = 0; t < trials; t++)
        r[t] = v[t] / f[t];
    bench_median(r, trials);                     /* sorts */
    p25 = r[trials / 4];
    p75 = r[(3 * trials) / 4 < trials ? (3 * trials) / 4 : trials - 1];
    snprintf(op, sizeof op, "%s (ratio p25..p75 %.2f..%.2f)", what, p25, p75);
    bench_report(b, G, op, bench_median(v, trials), bench_median(f, trials),
                 "mutex lock+lookup+unlock", "ns/op", 1);
}

/* The decode step's grow: tokens added inside the last page, 8 regions of 2 MiB pages
   (8192 tokens each), at 1k and at 64k tokens (the cost must not follow the length), one
   sequence and a batch of 256; each trial alternates a block of grows with a block of the
   floor. */
static int bench_nopage_grow(struct bench_ctx *b)
{
    enum { NR = 8, S = 256, N = 1000 };
    const uint64_t bpt = 256, T = 65536;
    int trials = b->trials > 0 ? b->trials : 5;
    if (trials > 64)
        trials = 64;
    struct kvvm_config c;
    kvvm_config_init(&c);
    c.backend = KVVM_BACKEND_EMULATED;
    c.n_regions = NR;
    c.bytes_per_token = bpt;
    c.max_seqs = S;
    c.max_tokens = T;
    c.page_size = 0;
    c.emu_granule = 0;                           /* 2 MiB */
    c.device_budget = (size_t)NR * (S + 16) * (2u << 20);
    c.emu_opaque = 0;
    kvvm *kv;
    int rc = kvvm_open(&c, &kv);
    if (rc)
        return rc;
    static const uint64_t at[2] = { 1024, 65536 - 8192 };
    static const char *name[2] = { "grow, no new page, 8 regions, 1k tokens",
                                   "grow, no new page, 8 regions, 64k tokens" };
    double v[2][64], f[2][64], med[2];
    kvvm_seq s[2];
    for (int k = 0; k < 2 && !rc; k++) {
        rc = kvvm_seq_create(kv, &s[k]);
        if (!rc)
            rc = kvvm_seq_grow(kv, s[k], at[k] + 1);
    }
    for (int t = 0; t < trials && !rc; t++) {
        for (int k = 0; k < 2 && !rc; k++) {
            uint64_t t0 = bench_now_ns();
            for (int i = 0; i < N && !rc; i++)
                rc = kvvm_seq_grow(kv, s[k], at[k] + 2 + (uint64_t)i);
            v[k][t] = (double)(bench_now_ns() - t0) / N;
            f[k][t] = floor_block(N);
            if (!rc)
                rc = kvvm_seq_truncate(kv, s[k], at[k] + 1);
            if (!rc)
                rc = kvvm_step(kv);
        }
    }
    for (int k = 0; k < 2 && !rc; k++) {
        double m[64];
        memcpy(m, v[k], sizeof m);
        med[k] = bench_median(m, trials);
        report_vs_floor(b, name[k], v[k], f[k], trials);
    }
    if (!rc)
        bench_report(b, G, "grow, no new page: 64k tokens vs 1k (flat = 1)", med[1], med[0],
                     "the same at 1k tokens", "ns/op", 1);
    for (int k = 0; k < 2 && !rc; k++)
        rc = kvvm_seq_free(kv, s[k]);
    /* a batch of 256 sequences, each one token more per call */
    kvvm_seq hs[S];
    uint64_t len[S];
    for (uint32_t i = 0; i < S && !rc; i++) {
        rc = kvvm_seq_create(kv, &hs[i]);
        len[i] = 1025;
        if (!rc)
            rc = kvvm_seq_grow(kv, hs[i], len[i]);
    }
    double bv[64], bf[64];
    for (int t = 0; t < trials && !rc; t++) {
        const int calls = b->quick ? 4 : 20;
        uint64_t t0 = bench_now_ns();
        for (int j = 0; j < calls && !rc; j++) {
            for (uint32_t i = 0; i < S; i++)
                len[i]++;
            rc = kvvm_seq_grow_batch(kv, hs, len, S);
        }
        bv[t] = (double)(bench_now_ns() - t0) / ((double)calls * S);
        bf[t] = floor_block(N);
        if (!rc)
            rc = kvvm_step(kv);
    }
    if (!rc)
        report_vs_floor(b, "grow_batch of 256, no new page, per sequence", bv, bf, trials);
    kvvm_close(kv);
    return rc;
}

static int bench_batch(struct bench_ctx *b)
{
    const uint32_t S = 256;
    const uint64_t T = b->quick ? 64 : 512, bpt = 4096;   /* a page every 512 tokens */
    kvvm *kv;
    int rc = open_kv(&kv, 2 * S, 2 * T, bpt, (size_t)2 * S * (4u << 20), 0);
    if (rc)
        return rc;
    kvvm_seq hs[2][S];
    uint64_t lens[S];
    for (uint32_t i = 0; i < S && !rc; i++) {
        rc = kvvm_seq_create(kv, &hs[0][i]);
        if (!rc)
            rc = kvvm_seq_create(kv, &hs[1][i]);
    }
    /* t = 1 maps a new page in every sequence; t > 1 needs none (512 tokens per page) */
    uint64_t single = 0, batch = 0, single1 = 0, batch1 = 0;
    for (uint64_t t = 1; t <= T && !rc; t++) {
        uint64_t t0 = bench_now_ns();
        for (uint32_t i = 0; i < S && !rc; i++)
            rc = kvvm_seq_grow(kv, hs[0][i], t);
        uint64_t t1 = bench_now_ns();
        for (uint32_t i = 0; i < S; i++)
            lens[i] = t;
        if (!rc)
            rc = kvvm_seq_grow_batch(kv, hs[1], lens, S);
        uint64_t t2 = bench_now_ns();
        if (t == 1) {
            single1 = t1 - t0;
            batch1 = t2 - t1;
        } else {
            single += t1 - t0;
            batch += t2 - t1;
        }
        if (!rc)
            rc = kvvm_step(kv);
    }
    kvvm_close(kv);
    if (rc)
        return rc;
    bench_report(b, G, "decode step, no new page: grow 256 (batch)",
                 (double)batch / (T - 1) / 1e3, (double)single / (T - 1) / 1e3,
                 "256 single kvvm_seq_grow", "us/step", 1);
    bench_report(b, G, "first step, new page each: grow 256 (batch)",
                 (double)batch1 / 1e3, (double)single1 / 1e3, "256 single kvvm_seq_grow",
                 "us/step", 1);
    return 0;
}

int bench_paging(struct bench_ctx *b)
{
    int rc = bench_nopage_grow(b);
    if (!rc)
        rc = bench_pool(b);
    if (!rc)
        rc = bench_batch(b);
    if (!rc)
        rc = bench_fork(b);
    if (!rc)
        rc = bench_grow(b);
    if (rc)
        fprintf(stderr, "bench paging: failed: %s\n", kvvm_strerror(rc));
    return rc;
}
