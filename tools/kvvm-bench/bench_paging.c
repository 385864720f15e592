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
#include <stdio.h>
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

/* An emulated-device configuration: pages of the granule (0: 2 MiB), n_regions regions. */
static void bench_cfg(struct kvvm_config *c, size_t granule, uint32_t nr, uint64_t bpt,
                      uint32_t max_seqs, uint64_t max_tokens, size_t budget)
{
    bench_config(c, KVVM_BACKEND_EMULATED, granule, 0, nr, bpt, max_seqs, max_tokens, budget);
    c->emu_opaque = 0;
}

static int open_kv(kvvm **kv, uint32_t max_seqs, uint64_t max_tokens, uint64_t bpt,
                   size_t budget, size_t granule)
{
    struct kvvm_config c;
    bench_cfg(&c, granule, 1, bpt, max_seqs, max_tokens, budget);
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

static void report_grow(struct bench_ctx *b, const char *when, struct bench_pair *p)
{
    char op[128];
    snprintf(op, sizeof op, "grow token-by-token, %s: wall", when);
    bench_report_pair(b, G, op, &p[0], "alloc-copy-free doubling", "ms", 1);
    snprintf(op, sizeof op, "grow token-by-token, %s: CPU per grow call", when);
    bench_report_pair(b, G, op, &p[1], "alloc-copy-free doubling", "ns/op", 1);
    snprintf(op, sizeof op, "grow token-by-token, %s: peak physical", when);
    bench_report_pair(b, G, op, &p[2], "alloc-copy-free doubling", "MiB", 1);
}

static void add_grow(struct bench_pair *p, const struct grow_res *k, const struct grow_res *d)
{
    bench_pair_add(&p[0], k->wall_ms, d->wall_ms);
    bench_pair_add(&p[1], k->cpu_ns_per_call, d->cpu_ns_per_call);
    bench_pair_add(&p[2], k->peak_bytes / 1048576.0, d->peak_bytes / 1048576.0);
}

/* Cold: a fresh context, every physical frame created during the run. Warm: the second
   pass in the same context, frames reused (an engine's steady state); the baseline likewise
   runs twice in one process. Each trial runs the library and the baseline, the order
   alternated. 128 sequences of 2048 tokens of 1 KiB (256 MiB; quick: 64 x 1024). */
static int bench_grow(struct bench_ctx *b)
{
    uint32_t S = b->quick ? 64 : 128;
    uint64_t T = b->quick ? 1024 : 2048, bpt = 1024;
    struct bench_pair *p = calloc(6, sizeof *p);
    struct grow_res k = { 0 }, d, kw, dw;
    int rc = p ? 0 : -ENOMEM;
    for (int t = 0; t < b->trials && !rc; t++) {
        for (int j = 0; j < 2 && !rc; j++) {
            if ((j ^ t) & 1) {
                rc = grow_doubling(S, T, bpt, 1, &d);
                if (!rc)
                    rc = grow_doubling(S, T, bpt, 2, &dw);
            } else {
                rc = grow_kvvm(S, T, bpt, 1, &k);
                if (!rc)
                    rc = grow_kvvm(S, T, bpt, 2, &kw);
            }
        }
        if (!rc) {
            add_grow(p, &k, &d);
            add_grow(p + 3, &kw, &dw);
        }
    }
    if (!rc) {
        double live = (double)(S * T * bpt), stat = live;   /* static: max length = T here */
        report_grow(b, "cold", p);
        report_grow(b, "warm", p + 3);
        bench_report(b, G, "peak physical, static prealloc beside",
                     k.peak_bytes / 1048576.0, stat / 1048576.0, "static at max length", "MiB",
                     1);
        /* at a quarter of the length, static preallocation still holds the maximum */
        bench_report(b, G, "physical at 1/4 of max length", k.quarter_bytes / 1048576.0,
                     stat / 1048576.0, "static at max length", "MiB", 1);
        bench_report(b, G, "live bytes at 1/4 of max length", live / 4 / 1048576.0, 0, "",
                     "MiB", 1);
    }
    free(p);
    return rc;
}

/* ---- 2. fork and share of a 64-page sequence ---------------------------------------- */

enum { FK_FORK = 0, FK_SHARE, FK_COPY };

/* One of the three ways to a second sequence holding p's T tokens, timed (us), then freed;
   *pages: the device pages it added. */
static int fork_way(kvvm *kv, kvvm_seq p, uint64_t T, uint64_t bpt, int way, double *us,
                    double *pages)
{
    kvvm_seq c;
    uint64_t pa, ca, u0 = 0, t0 = 0;
    int rc = 0;
    if (way != FK_FORK)
        rc = kvvm_seq_create(kv, &c);
    u0 = used_bytes(kv);
    t0 = bench_now_ns();
    if (rc)
        return rc;
    if (way == FK_FORK)
        rc = kvvm_seq_fork(kv, p, &c);
    else if (way == FK_SHARE)
        rc = kvvm_seq_share(kv, c, p, T);
    else {  /* copying fork: a new sequence of the same length and a device copy */
        rc = kvvm_seq_grow(kv, c, T);
        if (!rc)
            rc = kvvm_seq_addr(kv, p, 0, &pa);
        if (!rc)
            rc = kvvm_seq_addr(kv, c, 0, &ca);
        if (!rc)
            rc = kvvm_testing_device_copy(kv, ca, pa, T * bpt);
    }
    *us = (double)(bench_now_ns() - t0) / 1e3;
    *pages = (double)(used_bytes(kv) - u0) / (double)(2u << 20);
    if (!rc)
        rc = kvvm_seq_free(kv, c);
    if (!rc)
        rc = kvvm_sync(kv);
    return rc;
}

/* Each trial: fork, share and the copying fork, in an order rotated per trial. */
static int bench_fork(struct bench_ctx *b)
{
    kvvm *kv;
    const uint64_t bpt = 8192, pages = 64, ps = 2u << 20;
    const uint64_t T = pages * ps / bpt;
    int rc = open_kv(&kv, 8, T, bpt, (size_t)(4 * pages * ps), 0);
    if (rc)
        return rc;
    struct bench_pair pf = { 0 }, psh = { 0 };
    double added[3] = { 0, 0, 0 };
    kvvm_seq p;
    rc = kvvm_seq_create(kv, &p);
    if (!rc)
        rc = kvvm_seq_grow(kv, p, T);
    for (int t = 0; t < b->trials && !rc; t++) {
        double us[3];
        for (int j = 0; j < 3 && !rc; j++) {
            int way = (t + j) % 3;
            rc = fork_way(kv, p, T, bpt, way, &us[way], &added[way]);
        }
        bench_pair_add(&pf, us[FK_FORK], us[FK_COPY]);
        bench_pair_add(&psh, us[FK_SHARE], us[FK_COPY]);
    }
    kvvm_close(kv);
    if (rc)
        return rc;
    bench_report_pair(b, G, "fork 64-page sequence", &pf, "copying fork", "us/op", 1);
    bench_report_pair(b, G, "share 64-page sequence (whole pages)", &psh, "copying fork",
                      "us/op", 1);
    /* page counts: no ratio (a copying fork adds every page; 0 of 64 is no speed-up) */
    char op[96];
    snprintf(op, sizeof op, "fork: pages added (a copying fork: %.0f)", added[FK_COPY]);
    bench_report(b, G, op, added[FK_FORK], 0, NULL, "pages", 1);
    snprintf(op, sizeof op, "share: pages added (a copying fork: %.0f)", added[FK_COPY]);
    bench_report(b, G, op, added[FK_SHARE], 0, NULL, "pages", 1);
    return 0;
}

/* ---- 3. pool rate ------------------------------------------------------------------ */

struct pool_arg { kvvm *kv; long iters; size_t bytes; };

static int sample_take_give(void *arg, double *out)
{
    struct pool_arg *a = arg;
    uint64_t t0 = bench_now_ns();
    int rc = kvvm_testing_pool_take_give(a->kv, a->iters);
    *out = (double)(bench_now_ns() - t0) / (double)a->iters;
    return rc;
}

static int sample_create_release(void *arg, double *out)
{
    struct pool_arg *a = arg;
    uint64_t t0 = bench_now_ns();
    int rc = kvvm_testing_page_create_release(a->kv, a->bytes, a->iters);
    *out = (double)(bench_now_ns() - t0) / (double)a->iters;
    return rc;
}

static int bench_pool(struct bench_ctx *b)
{
    kvvm *kv;
    int rc = open_kv(&kv, 4, 1024, 4096, 64u << 20, 64u << 10);
    if (rc)
        return rc;
    long iters = b->quick ? 20000 : 200000;
    struct pool_arg tg = { kv, iters, 0 }, cr = { kv, iters / 20, 64u << 10 };
    struct bench_pair p1, p2;
    rc = kvvm_testing_pool_refill(kv, 8);
    if (!rc)
        rc = bench_pairs(b, sample_take_give, &tg, NULL, NULL, &p1);
    if (!rc)
        rc = bench_pairs(b, sample_create_release, &cr, NULL, NULL, &p2);
    kvvm_close(kv);
    if (rc)
        return rc;
    /* two figures, no ratio: the pool exists so that a grow never creates a page; a
       nanosecond list operation "vs" a driver allocation says nothing about either */
    bench_report_pair(b, G, "pool page take+give", &p1, NULL, "ns/op", 1);
    bench_report_pair(b, G, "page create+release (what the pool saves)", &p2, NULL, "ns/op",
                      1);
    return 0;
}

/* ---- 4. the decode step's calls against the length ---------------------------------- */

/* The floor of any locked call: n uncontended mutex lock + table lookup + unlock (ns/op):
   the least a call on a shared context can cost, the same work a grow in place must do. */
#define FLOOR_NAME "mutex lock+lookup+unlock"
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

/* Sequence lengths of the sweep; a context per length, each with one sequence grown alone
   and BATCH grown together. 8 regions of 64 KiB pages, 16 bytes per token and region: 4096
   tokens per page, so 64k tokens hold 16 pages per region (128 per sequence) and every grow
   below stays inside the last page. */
#define NL 4
#define NR 8
#define BATCH 64
#define LEN_PS (64u << 10)
#define LEN_BPT 16u
static const uint64_t sweep_len[NL] = { 1024, 4096, 16384, 65536 };
static const char *const sweep_name[NL] = { "1k", "4k", "16k", "64k" };

struct lenctx {
    kvvm *kv;
    uint64_t L;
    kvvm_seq one;
    kvvm_seq bs[BATCH];
    uint64_t blen[BATCH];
};

static int len_open(struct lenctx *c, uint64_t L)
{
    struct kvvm_config cf;
    uint64_t pages = (L + 4096) / 4096 + 1;
    bench_cfg(&cf, LEN_PS, NR, LEN_BPT, BATCH + 2, 65536 + 8192,
              (size_t)NR * (BATCH + 2) * pages * LEN_PS);
    memset(c, 0, sizeof *c);
    c->L = L;
    int rc = kvvm_open(&cf, &c->kv);
    if (!rc)
        rc = kvvm_seq_create(c->kv, &c->one);
    if (!rc)
        rc = kvvm_seq_grow(c->kv, c->one, L + 1);
    for (int i = 0; i < BATCH && !rc; i++) {
        c->blen[i] = L + 1;
        rc = kvvm_seq_create(c->kv, &c->bs[i]);
        if (!rc)
            rc = kvvm_seq_grow(c->kv, c->bs[i], c->blen[i]);
    }
    if (!rc)
        rc = kvvm_step(c->kv);
    if (!rc)
        rc = kvvm_sync(c->kv);
    return rc;
}

/* n grows of one token each inside the last page, then back (untimed): ns per grow. */
static int len_grow(struct lenctx *c, int n, double *ns)
{
    int rc = 0;
    uint64_t t0 = bench_now_ns();
    for (int i = 0; i < n && !rc; i++)
        rc = kvvm_seq_grow(c->kv, c->one, c->L + 2 + (uint64_t)i);
    *ns = (double)(bench_now_ns() - t0) / n;
    if (!rc)
        rc = kvvm_seq_truncate(c->kv, c->one, c->L + 1);
    return rc;
}

/* calls grow_batch calls of BATCH sequences, one token each: ns per sequence. */
static int len_batch(struct lenctx *c, int calls, double *ns)
{
    int rc = 0;
    uint64_t t0 = bench_now_ns();
    for (int j = 0; j < calls && !rc; j++) {
        for (int i = 0; i < BATCH; i++)
            c->blen[i]++;
        rc = kvvm_seq_grow_batch(c->kv, c->bs, c->blen, BATCH);
    }
    *ns = (double)(bench_now_ns() - t0) / ((double)calls * BATCH);
    for (int i = 0; i < BATCH && !rc; i++) {
        c->blen[i] = c->L + 1;
        rc = kvvm_seq_truncate(c->kv, c->bs[i], c->blen[i]);
    }
    return rc;
}

/* n kvvm_step calls with nothing to do: ns per step. */
static int time_steps(kvvm *kv, int n, double *ns)
{
    int rc = 0;
    uint64_t t0 = bench_now_ns();
    for (int i = 0; i < n && !rc; i++)
        rc = kvvm_step(kv);
    *ns = (double)(bench_now_ns() - t0) / n;
    return rc;
}

static void report_sweep(struct bench_ctx *b, const char *what, struct bench_pair *vs_floor,
                         struct bench_pair *vs_1k)
{
    char op[128];
    for (int k = 0; k < NL; k++) {
        snprintf(op, sizeof op, "%s, %s tokens", what, sweep_name[k]);
        bench_report_pair(b, G, op, &vs_floor[k], FLOOR_NAME, "ns/op", 1);
    }
    snprintf(op, sizeof op, "%s: 64k tokens vs 1k (flat = 1)", what);
    bench_report_pair(b, G, op, &vs_1k[NL - 1], "the same at 1k tokens", "ns/op", 1);
}

/* Each trial visits the lengths (forward, then backward in the next trial); at each, a
   block of grows then a block of the floor, a block of grow_batch then the floor, a block
   of steps. The 64k-vs-1k rows pair each trial's 64k block with its 1k block. */
static int bench_length(struct bench_ctx *b)
{
    struct lenctx *c = calloc(NL, sizeof *c);
    struct bench_pair *pgr = calloc(NL, sizeof *pgr), *pb = calloc(NL, sizeof *pb);
    struct bench_pair *ps = calloc(NL, sizeof *ps), *l1 = calloc(NL, sizeof *l1);
    struct bench_pair *lb = calloc(NL, sizeof *lb);
    int rc = c && pgr && pb && ps && l1 && lb ? 0 : -ENOMEM;
    const int N = 1000, calls = b->quick ? 4 : 16, steps = b->quick ? 200 : 1000;
    for (int k = 0; k < NL && !rc; k++) {
        double w;             /* a warm-up block of each kind, untimed */
        rc = len_open(&c[k], sweep_len[k]);
        if (!rc)
            rc = len_grow(&c[k], N, &w);
        if (!rc)
            rc = len_batch(&c[k], calls, &w);
        if (!rc)
            rc = time_steps(c[k].kv, steps, &w);
    }
    for (int t = 0; t < b->trials && !rc; t++) {
        double g[NL], gb[NL], st[NL];
        for (int j = 0; j < NL && !rc; j++) {
            int k = t % 2 ? NL - 1 - j : j;
            rc = len_grow(&c[k], N, &g[k]);
            double f = floor_block(N);
            bench_pair_add(&pgr[k], g[k], f);
            if (!rc)
                rc = len_batch(&c[k], calls, &gb[k]);
            f = floor_block(N);
            bench_pair_add(&pb[k], gb[k], f);
            if (!rc)
                rc = time_steps(c[k].kv, steps, &st[k]);
        }
        for (int k = 0; k < NL && !rc; k++) {
            bench_pair_add(&l1[k], g[k], g[0]);
            bench_pair_add(&lb[k], gb[k], gb[0]);
            bench_pair_add(&ps[k], st[k], k ? st[0] : 0);
        }
    }
    if (!rc) {
        report_sweep(b, "grow, no new page, 8 regions", pgr, l1);
        char what[64];
        snprintf(what, sizeof what, "grow_batch of %d, no new page, per seq", BATCH);
        report_sweep(b, what, pb, lb);
        for (int k = 0; k < NL; k++) {
            char op[128];
            snprintf(op, sizeof op, "step, %d seqs of %s tokens, nothing to do", BATCH + 1,
                     sweep_name[k]);
            bench_report_pair(b, G, op, &ps[k], k ? "the same at 1k tokens" : NULL, "ns/op",
                              1);
        }
    }
    for (int k = 0; c && k < NL; k++)
        if (c[k].kv)
            kvvm_close(c[k].kv);
    free(c);
    free(pgr);
    free(pb);
    free(ps);
    free(l1);
    free(lb);
    return rc;
}

/* grow_batch of 256 sequences at 1k tokens (the decode step of a full batch), per
   sequence, against the floor, alternated within each trial. */
static int bench_batch256(struct bench_ctx *b)
{
    enum { S = 256 };
    struct kvvm_config cf;
    bench_cfg(&cf, LEN_PS, NR, LEN_BPT, S, 65536, (size_t)NR * S * 2 * LEN_PS);
    kvvm *kv;
    int rc = kvvm_open(&cf, &kv);
    if (rc)
        return rc;
    kvvm_seq hs[S];
    uint64_t len[S];
    struct bench_pair p;
    const int calls = b->quick ? 4 : 16;
    for (uint32_t i = 0; i < S && !rc; i++) {
        len[i] = 1025;
        rc = kvvm_seq_create(kv, &hs[i]);
        if (!rc)
            rc = kvvm_seq_grow(kv, hs[i], len[i]);
    }
    if (!rc)
        rc = kvvm_step(kv);
    p.n = 0;
    for (int t = 0; t < b->trials && !rc; t++) {
        double f = t % 2 ? floor_block(1000) : 0;
        uint64_t t0 = bench_now_ns();
        for (int j = 0; j < calls && !rc; j++) {
            for (uint32_t i = 0; i < S; i++)
                len[i]++;
            rc = kvvm_seq_grow_batch(kv, hs, len, S);
        }
        double v = (double)(bench_now_ns() - t0) / ((double)calls * S);
        if (!(t % 2))
            f = floor_block(1000);
        bench_pair_add(&p, v, f);
        for (uint32_t i = 0; i < S && !rc; i++) {
            len[i] = 1025;
            rc = kvvm_seq_truncate(kv, hs[i], len[i]);
        }
    }
    if (!rc)
        bench_report_pair(b, G, "grow_batch of 256, no new page, 8 regions, 1k tokens, per seq",
                          &p, FLOOR_NAME, "ns/op", 1);
    kvvm_close(kv);
    return rc;
}

/* ---- 5. kvvm_step with the device full ---------------------------------------------- */

/* 16 sequences of 16k tokens (8 regions, 64 KiB pages: 4 pages per region each) in two
   contexts: one whose device budget is exactly their pages (full), one with as much again
   free (room). A block of steps in each, alternated within each trial. */
static int bench_step_full(struct bench_ctx *b)
{
    enum { S = 16 };
    const uint64_t T = 16384;
    kvvm *kv[2] = { NULL, NULL };
    int rc = 0;
    for (int k = 0; k < 2 && !rc; k++) {
        struct kvvm_config cf;
        bench_cfg(&cf, LEN_PS, NR, LEN_BPT, S, T,
                  (size_t)(k ? 2 : 1) * S * NR * (T * LEN_BPT / LEN_PS) * LEN_PS);
        rc = kvvm_open(&cf, &kv[k]);
        for (int i = 0; i < S && !rc; i++) {
            kvvm_seq s;
            rc = kvvm_seq_create(kv[k], &s);
            if (!rc)
                rc = kvvm_seq_grow(kv[k], s, T);
        }
        if (!rc)
            rc = kvvm_step(kv[k]);
    }
    struct bench_pair p = { 0 };
    const int steps = b->quick ? 200 : 1000;
    for (int t = 0; t < b->trials && !rc; t++) {
        double v[2];
        for (int j = 0; j < 2 && !rc; j++) {
            int k = t % 2 ? 1 - j : j;
            rc = time_steps(kv[k], steps, &v[k]);
        }
        bench_pair_add(&p, v[0], v[1]);
    }
    if (!rc)
        bench_report_pair(b, G, "step, 16 seqs of 16k tokens, device full", &p,
                          "the same with room", "ns/op", 1);
    for (int k = 0; k < 2; k++)
        if (kv[k])
            kvvm_close(kv[k]);
    return rc;
}

/* ---- 6. stats, free and close against the number of sequences ----------------------- */

/* A context of n one-page sequences (1 region, 4 KiB pages, no frame pool thread: the
   frames are the caller's work, the same per sequence at every n): the median of 64
   kvvm_stats calls, then every sequence freed and the releases completed (kvvm_sync), per
   sequence, then kvvm_close with as many live, per sequence. */
#define NSEQ_PS 4096u
static int nseq_one(uint32_t n, double out[3])
{
    struct kvvm_config cf;
    bench_cfg(&cf, NSEQ_PS, 1, NSEQ_PS, n, 4, (size_t)(n + 8) * NSEQ_PS);
    cf.pool_thread = 0;
    kvvm *kv;
    int rc = kvvm_open(&cf, &kv);
    if (rc)
        return rc;
    kvvm_seq *s = calloc(n, sizeof *s);
    rc = s ? 0 : -ENOMEM;
    for (uint32_t i = 0; i < n && !rc; i++) {
        rc = kvvm_seq_create(kv, &s[i]);
        if (!rc)
            rc = kvvm_seq_grow(kv, s[i], 1);
    }
    if (!rc)
        rc = kvvm_step(kv);
    double v[64];
    for (int i = 0; i < 64 && !rc; i++) {
        struct kvvm_stats st = { .size = sizeof st };
        uint64_t t0 = bench_now_ns();
        rc = kvvm_stats(kv, &st);
        v[i] = (double)(bench_now_ns() - t0);
    }
    if (!rc)
        out[0] = bench_median(v, 64);
    uint64_t t0 = bench_now_ns();
    for (uint32_t i = 0; i < n && !rc; i++)
        rc = kvvm_seq_free(kv, s[i]);
    if (!rc)
        rc = kvvm_sync(kv);
    out[1] = (double)(bench_now_ns() - t0) / n;
    /* a second set, left live for the close */
    for (uint32_t i = 0; i < n && !rc; i++) {
        rc = kvvm_seq_create(kv, &s[i]);
        if (!rc)
            rc = kvvm_seq_grow(kv, s[i], 1);
    }
    free(s);
    t0 = bench_now_ns();
    kvvm_close(kv);
    out[2] = (double)(bench_now_ns() - t0) / n;
    return rc;
}

static int bench_nseqs(struct bench_ctx *b)
{
    static const uint32_t ns[] = { 64, 256, 1024, 4096 };
    const int K = b->quick ? 3 : 4;          /* quick: up to 1024 */
    static const char *const what[3] = { "kvvm_stats", "free, per sequence",
                                         "close, per sequence" };
    static const char *const unit[3] = { "ns/op", "ns/op", "ns/op" };
    struct bench_pair *p = calloc(3 * 4, sizeof *p);
    int rc = p ? 0 : -ENOMEM;
    for (int t = 0; t < b->trials && !rc; t++) {
        double v[4][3];
        for (int j = 0; j < K && !rc; j++) {
            int k = t % 2 ? K - 1 - j : j;
            rc = nseq_one(ns[k], v[k]);
        }
        for (int k = 0; k < K && !rc; k++)
            for (int m = 0; m < 3; m++)
                bench_pair_add(&p[m * K + k], v[k][m], k ? v[0][m] : 0);
    }
    for (int m = 0; m < 3 && !rc; m++)
        for (int k = 0; k < K; k++) {
            char op[96];
            snprintf(op, sizeof op, "%s, %u sequences", what[m], ns[k]);
            bench_report_pair(b, G, op, &p[m * K + k], k ? "the same at 64 sequences" : NULL,
                              unit[m], 1);
        }
    free(p);
    return rc;
}

/* ---- 7. metadata per sequence and per page ------------------------------------------ */

/* The same 1k-token sequence (8 regions, 64 KiB pages) in contexts of max_tokens 1k and
   64k: bytes of metadata it holds (counts, no trials). */
static int meta_of(uint64_t max_tokens, uint64_t len, uint64_t *seq_b, uint64_t *page_b)
{
    struct kvvm_config cf;
    bench_cfg(&cf, LEN_PS, NR, LEN_BPT, 2, max_tokens,
              (size_t)NR * (max_tokens * LEN_BPT / LEN_PS + 2) * LEN_PS);
    kvvm *kv;
    kvvm_seq s;
    int rc = kvvm_open(&cf, &kv);
    if (rc)
        return rc;
    rc = kvvm_seq_create(kv, &s);
    if (!rc)
        rc = kvvm_seq_grow(kv, s, len);
    if (!rc)
        rc = kvvm_testing_metadata(kv, s, seq_b, page_b);
    kvvm_close(kv);
    return rc;
}

static int bench_meta(struct bench_ctx *b)
{
    uint64_t s1, s64, s64l, p1, pb;
    int rc = meta_of(1024, 1024, &s1, &p1);
    if (!rc)
        rc = meta_of(65536, 1024, &s64, &pb);
    if (!rc)
        rc = meta_of(65536, 65536, &s64l, &pb);
    if (rc)
        return rc;
    bench_report(b, G, "metadata per sequence: 1k tokens, max_tokens 64k", (double)s64,
                 (double)s1, "the same at max_tokens 1k", "bytes", 1);
    bench_report(b, G, "metadata per sequence: 64k tokens, max_tokens 64k", (double)s64l,
                 (double)s1, "1k tokens at max_tokens 1k", "bytes", 1);
    bench_report(b, G, "metadata per device page (page + frame)", (double)pb, 0, NULL,
                 "bytes", 1);
    return 0;
}

/* ---- 8. single grows against one batch, with and without a new page ----------------- */

/* S sequences grown one token per step, T steps per trial, by S single kvvm_seq_grow calls
   and by one kvvm_seq_grow_batch of the S others, the order alternated per trial. Step 1 of
   each trial maps a new page in every sequence (they start empty: truncated to 0 between
   trials), the later steps none (512 tokens per page). */
static int bench_batch(struct bench_ctx *b)
{
    enum { S = 256 };
    const uint64_t T = b->quick ? 64 : 512, bpt = 4096;
    kvvm *kv;
    int rc = open_kv(&kv, 2 * S, 2 * T, bpt, (size_t)2 * S * (4u << 20), 0);
    if (rc)
        return rc;
    kvvm_seq hs[2][S];
    uint64_t lens[S];
    struct bench_pair later = { 0 }, first = { 0 };
    for (uint32_t i = 0; i < S && !rc; i++) {
        rc = kvvm_seq_create(kv, &hs[0][i]);
        if (!rc)
            rc = kvvm_seq_create(kv, &hs[1][i]);
    }
    for (int tr = 0; tr < b->trials && !rc; tr++) {
        uint64_t single = 0, batch = 0, single1 = 0, batch1 = 0;
        for (uint64_t t = 1; t <= T && !rc; t++) {
            uint64_t ds = 0, db = 0;
            for (int j = 0; j < 2 && !rc; j++) {
                uint64_t t0 = bench_now_ns();
                if ((j ^ tr) & 1) {
                    for (uint32_t i = 0; i < S; i++)
                        lens[i] = t;
                    rc = kvvm_seq_grow_batch(kv, hs[1], lens, S);
                    db = bench_now_ns() - t0;
                } else {
                    for (uint32_t i = 0; i < S && !rc; i++)
                        rc = kvvm_seq_grow(kv, hs[0][i], t);
                    ds = bench_now_ns() - t0;
                }
            }
            if (t == 1) {
                single1 = ds;
                batch1 = db;
            } else {
                single += ds;
                batch += db;
            }
            if (!rc)
                rc = kvvm_step(kv);
        }
        bench_pair_add(&later, (double)batch / (double)(T - 1) / 1e3,
                       (double)single / (double)(T - 1) / 1e3);
        bench_pair_add(&first, (double)batch1 / 1e3, (double)single1 / 1e3);
        for (int k = 0; k < 2; k++)
            for (uint32_t i = 0; i < S && !rc; i++)
                rc = kvvm_seq_truncate(kv, hs[k][i], 0);
        if (!rc)
            rc = kvvm_step(kv);
        if (!rc)
            rc = kvvm_sync(kv);
    }
    kvvm_close(kv);
    if (rc)
        return rc;
    bench_report_pair(b, G, "decode step, no new page: grow 256 (batch)", &later,
                      "256 single kvvm_seq_grow", "us/step", 1);
    bench_report_pair(b, G, "first step, new page each: grow 256 (batch)", &first,
                      "256 single kvvm_seq_grow", "us/step", 1);
    return 0;
}

int bench_paging(struct bench_ctx *b)
{
    int rc = bench_length(b);
    if (!rc)
        rc = bench_batch256(b);
    if (!rc)
        rc = bench_step_full(b);
    if (!rc)
        rc = bench_nseqs(b);
    if (!rc)
        rc = bench_meta(b);
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
