/*
 * tests/stream_random.c: a randomized stream-mode test (issue 9): several threads share one
 * context with an engine stream, KVVM_F_AUTO_SWAP (the reclaim thread and direct reclaim
 * running), a small host tier and a disk tier (the spill thread running; --no-disk: host
 * tier only), and do random grows with writes, forks, shares, prefetches (with ready polls),
 * swap-outs, swap-ins, reads, truncates and frees, and two patterns of issue 9 (prefetch,
 * step, then free or truncate; a sequence and its fork both swapped out and prefetched, then
 * the fork read). Every sequence's bytes are checked against
 * a reference model: the lineage that wrote each token (a fork or share copies the parent's,
 * an append writes the sequence's own), from which every byte's cookie follows.
 *
 * A plain program (no Criterion), so it also runs under ThreadSanitizer (scripts/test.sh).
 * Exit 0 = zero mismatches, zero context deaths (-EIO), no error other than -ENOMEM /
 * -ENOSPC (legal under pressure), no leak logged at close, the invariant checker holds, and
 * prefetch, spill and reclaim all happened. Prints its case counts. KVVMTEST_STREAM_ITERS
 * (ops per thread, default 5000) and KVVMTEST_STREAM_SEED (default 1) control the run.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "kvvm.h"
#include "testing/kvvm_testing.h"
#include "cookie.h"

#define KB 4096u
#define NR 2
#define BPT 1024u
#define MAXTOK 32u          /* 8 pages per region */
#define THREADS 4
#define PER 6               /* sequences per thread at most */

enum { OP_GROW, OP_FORK, OP_SHARE, OP_PREFETCH, OP_READY, OP_OUT, OP_IN, OP_READ, OP_TRUNC,
       OP_FREE, OP_PF_DROP, OP_PF_FAMILY, OP_N };
static const char *op_name[OP_N] = { "grow+write", "fork", "share", "prefetch", "ready poll",
                                     "swap_out", "swap_in", "read+verify", "truncate",
                                     "free", "prefetch+step+drop", "prefetch family" };

static kvvm *kv;
static int iters = 5000;
static uint64_t seed = 1;
static uint64_t n_ops[OP_N], n_nomem[OP_N], n_nospc, n_mismatch, n_deaths, n_errors,
                n_leaks, n_ready1, n_verified;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

#define COUNT(var) __atomic_add_fetch(&(var), 1, __ATOMIC_RELAXED)

static void report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void report(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&mu);
    fputs("stream_random: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    pthread_mutex_unlock(&mu);
    va_end(ap);
}

/* The reference model of one sequence: who wrote each token. */
struct seqm {
    kvvm_seq h;
    uint64_t len;
    uint32_t lin[MAXTOK];   /* lineage of token t: its bytes are cookie(lin[t], r, offset) */
};

/* Counts an outcome: 0 fine; -ENOMEM / -ENOSPC legal under pressure; -EIO a death. */
static bool ok(int rc, int op, int tid)
{
    if (rc == 0)
        return true;
    if (rc == -ENOMEM)
        COUNT(n_nomem[op]);
    else if (rc == -ENOSPC)
        COUNT(n_nospc);
    else if (rc == -EIO) {
        if (COUNT(n_deaths) == 1)
            report("thread %d: %s: the context died (-EIO)", tid, op_name[op]);
    } else {
        COUNT(n_errors);
        report("thread %d: %s: %d (%s)", tid, op_name[op], rc, kvvm_strerror(rc));
    }
    return false;
}

static int write_tokens(struct seqm *s, uint64_t from, uint64_t to)
{
    static __thread uint8_t buf[MAXTOK * BPT];
    for (uint32_t r = 0; r < NR; r++) {
        for (uint64_t t = from; t < to; t++)
            for (uint64_t o = t * BPT; o < (t + 1) * BPT; o++)
                buf[o - from * BPT] = cookie(s->lin[t], r, o);
        int rc = kvvm_seq_write(kv, s->h, r, from * BPT, buf, (to - from) * BPT);
        if (rc)
            return rc;
    }
    return 0;
}

static void verify(struct seqm *s, int tid)
{
    static __thread uint8_t buf[MAXTOK * BPT];
    for (uint32_t r = 0; r < NR && s->len; r++) {
        int rc = kvvm_seq_read(kv, s->h, r, 0, buf, s->len * BPT);
        if (!ok(rc, OP_READ, tid))
            return;
        uint64_t bad = 0, first = 0;
        for (uint64_t o = 0; o < s->len * BPT; o++)
            if (buf[o] != cookie(s->lin[o / BPT], r, o) && !bad++)
                first = o;
        if (bad) {
            if (COUNT(n_mismatch) <= 5)
                report("thread %d: mismatch: region %u, %llu of %llu bytes differ from byte "
                       "%llu (got %02x want %02x)", tid, r, (unsigned long long)bad,
                       (unsigned long long)(s->len * BPT), (unsigned long long)first,
                       buf[first], cookie(s->lin[first / BPT], r, first));
            return;
        }
    }
    COUNT(n_verified);
}

static uint64_t rnd_next(uint64_t *x)
{
    *x ^= *x << 13; *x ^= *x >> 7; *x ^= *x << 17;
    return *x;
}

static struct seqm *free_entry(struct seqm *s)
{
    for (int i = 0; i < PER; i++)
        if (!s[i].h)
            return &s[i];
    return NULL;
}

static void drop(struct seqm *q, int tid)
{
    int rc = kvvm_seq_free(kv, q->h);
    ok(rc, OP_FREE, tid);
    q->h = 0;
    q->len = 0;
}

static void *worker(void *arg)
{
    int tid = (int)(intptr_t)arg;
    struct seqm s[PER];
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + (uint64_t)tid * 0x632be59bd9b4e019ull + 1;
    uint32_t next_lin = (uint32_t)tid << 24;
    memset(s, 0, sizeof s);
    for (int it = 0; it < iters; it++) {
        uint64_t r = rnd_next(&x);
        struct seqm *q = &s[r % PER];
        int op = (int)((r >> 8) % 18);
        op = op < 4 ? OP_GROW : op < 5 ? OP_FORK : op < 6 ? OP_SHARE : op < 8 ? OP_PREFETCH :
             op < 9 ? OP_READY : op < 10 ? OP_OUT : op < 11 ? OP_IN : op < 13 ? OP_READ :
             op < 14 ? OP_TRUNC : op < 15 ? OP_FREE : op < 16 ? OP_PF_DROP :
             op < 17 ? OP_PF_FAMILY : OP_GROW;
        if (!q->h) {
            if (ok(kvvm_seq_create(kv, &q->h), OP_GROW, tid))
                q->len = 0;
            else
                q->h = 0;
            continue;
        }
        COUNT(n_ops[op]);
        switch (op) {
        case OP_GROW: {
            uint64_t to = q->len + 1 + (r >> 20) % 6;
            if (to > MAXTOK)
                to = MAXTOK;
            if (to <= q->len || !ok(kvvm_seq_grow(kv, q->h, to), op, tid))
                break;
            uint64_t from = q->len;
            uint32_t lin = next_lin++;
            for (uint64_t t = from; t < to; t++)
                q->lin[t] = lin;
            q->len = to;
            int rc = write_tokens(q, from, to);
            if (!ok(rc, op, tid)) {
                /* a write that found no room: the tokens are not the model's, cut them */
                if (ok(kvvm_seq_truncate(kv, q->h, from), OP_TRUNC, tid))
                    q->len = from;
                else
                    drop(q, tid);
            }
            break;
        }
        case OP_FORK: case OP_SHARE: {
            struct seqm *c = free_entry(s);
            if (!c)
                break;
            int rc;
            uint64_t n = q->len;
            if (op == OP_FORK) {
                rc = kvvm_seq_fork(kv, q->h, &c->h);
            } else {
                n = q->len ? 1 + (r >> 24) % q->len : 0;
                rc = kvvm_seq_create(kv, &c->h);
                if (ok(rc, op, tid) && (rc = kvvm_seq_share(kv, c->h, q->h, n)) != 0) {
                    kvvm_seq_free(kv, c->h);
                }
            }
            if (!ok(rc, op, tid)) {
                c->h = 0;
                break;
            }
            c->len = n;
            memcpy(c->lin, q->lin, sizeof c->lin);
            if ((r >> 40) % 2)
                verify(c, tid);
            break;
        }
        case OP_PREFETCH:
            ok(kvvm_seq_prefetch(kv, q->h), op, tid);
            break;
        case OP_READY: {
            int rc = kvvm_seq_ready(kv, q->h);
            if (rc == 1)
                COUNT(n_ready1);
            else if (rc < 0)
                ok(rc, op, tid);
            break;
        }
        case OP_OUT:
            ok(kvvm_seq_swap_out(kv, q->h), op, tid);
            break;
        case OP_IN:
            ok(kvvm_seq_swap_in(kv, q->h), op, tid);
            break;
        case OP_READ:
            verify(q, tid);
            break;
        case OP_TRUNC: {
            uint64_t to = q->len ? (r >> 20) % q->len : 0;
            if (ok(kvvm_seq_truncate(kv, q->h, to), op, tid))
                q->len = to;
            break;
        }
        case OP_FREE:
            drop(q, tid);
            break;
        case OP_PF_DROP:                /* the prefetch's copy may still be queued */
            ok(kvvm_seq_prefetch(kv, q->h), op, tid);
            kvvm_step(kv);
            if ((r >> 30) % 2) {
                drop(q, tid);
            } else if (ok(kvvm_seq_truncate(kv, q->h, 0), OP_TRUNC, tid)) {
                q->len = 0;
            }
            break;
        case OP_PF_FAMILY: {            /* q and a fork, both out, prefetched: read the fork */
            struct seqm *c = free_entry(s);
            if (!c || !ok(kvvm_seq_fork(kv, q->h, &c->h), OP_FORK, tid)) {
                if (c)
                    c->h = 0;
                break;
            }
            c->len = q->len;
            memcpy(c->lin, q->lin, sizeof c->lin);
            ok(kvvm_seq_swap_out(kv, q->h), OP_OUT, tid);
            ok(kvvm_seq_swap_out(kv, c->h), OP_OUT, tid);
            ok(kvvm_seq_prefetch(kv, q->h), op, tid);
            ok(kvvm_seq_prefetch(kv, c->h), op, tid);
            verify(c, tid);
            break;
        }
        }
        if (it % 3 == 0)
            kvvm_step(kv);
    }
    for (int i = 0; i < PER; i++)
        if (s[i].h) {
            kvvm_step(kv);
            verify(&s[i], tid);
            drop(&s[i], tid);
        }
    return NULL;
}

/* Warnings and errors go to stderr; a leak reported at close is a failure. */
static void log_fn(int level, const char *msg, void *arg)
{
    (void)level;
    (void)arg;
    if (strstr(msg, "leak"))
        COUNT(n_leaks);
    pthread_mutex_lock(&mu);
    fprintf(stderr, "kvvm: %s\n", msg);
    pthread_mutex_unlock(&mu);
}

int main(int argc, char **argv)
{
    bool disk = !(argc > 1 && !strcmp(argv[1], "--no-disk"));
    const char *e = getenv("KVVMTEST_STREAM_ITERS");
    if (e && atoi(e) > 0)
        iters = atoi(e);
    if ((e = getenv("KVVMTEST_STREAM_SEED")) && strtoull(e, NULL, 0))
        seed = strtoull(e, NULL, 0);
    char dir[] = "/var/tmp/kvvm_stream_random.XXXXXX";
    if (disk && !mkdtemp(dir)) {
        perror("stream_random: mkdtemp");
        return 1;
    }
    kvvm_set_log(log_fn, NULL, KVVM_LOG_WARN);
    struct kvvm_config c;
    kvvm_config_init(&c);
    c.backend = KVVM_BACKEND_EMULATED;
    c.emu_granule = KB;
    c.page_size = KB;
    c.n_regions = NR;
    c.bytes_per_token = BPT;
    c.max_seqs = THREADS * PER + 8;
    c.max_tokens = MAXTOK;
    /* THREADS x PER sequences of up to 16 pages (384) on a 64-page device */
    c.device_budget = 64 * KB;
    c.host_budget = (disk ? 96 : 512) * KB;
    c.flags = KVVM_F_AUTO_SWAP;
    c.device_min = 0.05;
    c.device_low = 0.20;
    c.device_high = 0.40;
    c.emu_opaque = 1;
    if (disk) {
        c.spill_dir = dir;
        c.spill_budget = 1024 * KB;
    }
    int rc = kvvm_open(&c, &kv);
    void *st = NULL;
    if (!rc)
        rc = kvvm_stream_create(kv, &st);
    if (!rc)
        rc = kvvm_set_stream(kv, st);
    if (rc) {
        fprintf(stderr, "stream_random: open: %d (%s)\n", rc, kvvm_strerror(rc));
        if (disk)
            rmdir(dir);
        return 1;
    }
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    rc = kvvm_sync(kv);
    if (rc)
        ok(rc, OP_READ, -1);
    char why[512] = "";
    bool inv = kvvm_debug_check(kv, why, sizeof why) == 0;
    if (!inv)
        report("invariant: %s", why);
    struct kvvm_stats sts = { .size = sizeof sts };
    kvvm_stats(kv, &sts);
    kvvm_set_stream(kv, NULL);
    kvvm_close(kv);
    int fails = 0;
    if (disk && rmdir(dir)) {
        perror("stream_random: the spill directory is not empty after close");
        fails++;
    }
    printf("stream_random%s: seed %llu, %d threads x %d ops\n", disk ? "" : " --no-disk",
           (unsigned long long)seed, THREADS, iters);
    for (int i = 0; i < OP_N; i++)
        printf("  %-12s %7llu  (-ENOMEM %llu)\n", op_name[i], (unsigned long long)n_ops[i],
               (unsigned long long)n_nomem[i]);
    printf("  ready polls answering 1: %llu; -ENOSPC (no slot): %llu; sequences verified: "
           "%llu\n", (unsigned long long)n_ready1, (unsigned long long)n_nospc,
           (unsigned long long)n_verified);
    printf("  library: %llu swap-outs, %llu swap-ins, %llu background reclaim runs, %llu "
           "direct reclaims, %llu spills, %llu unspills, %llu COW copies\n",
           (unsigned long long)sts.swap_outs, (unsigned long long)sts.swap_ins,
           (unsigned long long)sts.reclaim_runs, (unsigned long long)sts.direct_reclaims,
           (unsigned long long)sts.spills, (unsigned long long)sts.unspills,
           (unsigned long long)sts.cow_copies);
    printf("  mismatches %llu, calls failed -EIO (context dead) %llu, other errors %llu, "
           "leaks logged %llu, invariant %s\n", (unsigned long long)n_mismatch, (unsigned long long)n_deaths,
           (unsigned long long)n_errors, (unsigned long long)n_leaks, inv ? "ok" : "VIOLATED");
    fails += n_mismatch || n_deaths || n_errors || n_leaks || !inv;
    if (!n_ops[OP_PREFETCH] || !sts.swap_outs || (!sts.direct_reclaims && !sts.reclaim_runs) ||
        (disk && !sts.spills)) {
        fprintf(stderr, "stream_random: prefetch, swap, reclaim or spill did not happen: the "
                "run did not test\n");
        fails++;
    }
    return fails ? 1 : 0;
}
