/*
 * tools/kvvm-bench/bench_scale.c: the scale group: whether the policy's cost follows what
 * moves or the size of the pool. On the emulated device with 64 KiB pages (one token = one
 * page, one region, sequences of 16 pages) a context is filled at pool sizes 1x, 4x, 16x and
 * 64x (256 -> 16 384 device pages; host tier = a quarter of it, full; the least recently used
 * sequences spilled to disk), then, with the same 16 pages moving per call at every size:
 *  - swap-out: kvvm_seq_swap_out of a resident sequence while the host tier is full (the
 *    ordinary path after spilling 16 host pages of other sequences to disk for room);
 *  - reclaim: a kvvm_seq_grow of 16 pages on a full device (KVVM_F_AUTO_SWAP): the direct
 *    reclaim chooses and swaps out the least recently used resident sequence;
 *  - step: kvvm_step with nothing to reclaim (KVVM_F_AUTO_SWAP on, free frames above low);
 *  - stats: kvvm_stats (what an engine polls once a step).
 * Each figure is the median per call within a trial, then the median over --trials trials,
 * reported against the same operation at 1x in the same trial (ratio ~1 = flat; every
 * trial runs every size, in an order reversed every other trial). Between timed swap-outs
 * the sequence comes back and a disk-resident one makes the round trip (untimed), so the
 * host tier is full before every timed call.
 * The spill file goes to --spill-dir (tmpfs and buffered I/O accepted: the figure is the
 * policy's CPU cost, not the disk's).
 */
#include "bench.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvvm.h"

#define G "scale"
#define PS (64u << 10)
#define SEQ_PAGES 16u

struct scale_run {
    double out_us, step_us, stats_us, reclaim_us;
};

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double med(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n ? v[n / 2] : 0;
}

static int scale_one(struct bench_ctx *b, uint32_t mult, int iters, struct scale_run *out)
{
    uint32_t dev = 256 * mult, host = dev / 4;
    uint32_t n_dev = dev / SEQ_PAGES - 1;                 /* resident: room for one swap-in */
    uint32_t n_host = host / SEQ_PAGES + (uint32_t)iters + 4;  /* the oldest ones spill */
    uint32_t n_all = n_dev + n_host;
    struct kvvm_config c;
    bench_config(&c, KVVM_BACKEND_EMULATED, PS, PS, 1, PS, n_all + 2, SEQ_PAGES,
                 (size_t)dev * PS);
    c.host_budget = (size_t)host * PS;
    c.spill_dir = b->spill_dir ? b->spill_dir : "/var/tmp";
    c.spill_budget = (size_t)(n_host * SEQ_PAGES + 4 * SEQ_PAGES) * PS;
    c.flags = KVVM_F_AUTO_SWAP | KVVM_F_SPILL_ALLOW_TMPFS | KVVM_F_SPILL_BUFFERED;
    c.emu_opaque = 0;
    c.device_min = 0;
    c.device_low = 0.001;             /* below one sequence: no reclaim in the timed steps */
    c.device_high = 0.001;
    c.host_min = c.host_low = c.host_high = 0;   /* no spill thread: the calls spill */
    kvvm *kv;
    int rc = kvvm_open(&c, &kv);
    if (rc)
        return rc;
    kvvm_seq *s = calloc(n_all, sizeof *s);
    double *vo = calloc((size_t)iters, sizeof *vo), *vs = calloc((size_t)iters, sizeof *vs);
    double *vt = calloc((size_t)iters, sizeof *vt), *vr = calloc((size_t)iters, sizeof *vr);
    rc = s && vo && vs && vt && vr ? 0 : -ENOMEM;
    /* the host (and disk) sequences first, oldest first: each leaves the device at once */
    for (uint32_t i = 0; i < n_host && !rc; i++) {
        rc = kvvm_seq_create(kv, &s[n_dev + i]);
        if (!rc)
            rc = kvvm_seq_grow(kv, s[n_dev + i], SEQ_PAGES);
        if (!rc)
            rc = kvvm_step(kv);
        if (!rc)
            rc = kvvm_seq_swap_out(kv, s[n_dev + i]);
    }
    for (uint32_t i = 0; i < n_dev && !rc; i++) {
        rc = kvvm_seq_create(kv, &s[i]);
        if (!rc)
            rc = kvvm_seq_grow(kv, s[i], SEQ_PAGES);
    }
    if (!rc)
        rc = kvvm_step(kv);
    for (int t = 0; t < iters && !rc; t++) {
        /* a disk-resident sequence's round trip leaves the host tier full again */
        kvvm_seq d = s[n_dev + (uint32_t)t];
        rc = kvvm_seq_swap_in(kv, d);
        if (!rc)
            rc = kvvm_seq_swap_out(kv, d);
        if (!rc)
            rc = kvvm_step(kv);       /* ends the protections: the victim is movable */
        kvvm_seq v = s[(uint32_t)t % n_dev];
        uint64_t t0 = bench_now_ns();
        if (!rc)
            rc = kvvm_seq_swap_out(kv, v);
        uint64_t t1 = bench_now_ns();
        if (!rc)
            rc = kvvm_seq_swap_in(kv, v);
        uint64_t t2 = bench_now_ns();
        if (!rc)
            rc = kvvm_step(kv);
        uint64_t t3 = bench_now_ns();
        struct kvvm_stats st = { .size = sizeof st };
        if (!rc)
            rc = kvvm_stats(kv, &st);
        uint64_t t4 = bench_now_ns();
        vo[t] = (double)(t1 - t0) / 1e3;
        vs[t] = (double)(t3 - t2) / 1e3;
        vt[t] = (double)(t4 - t3) / 1e3;
        /* direct reclaim: the device full, a grow of 16 pages swaps out the least recently
           used resident sequence (then the victim comes back, untimed) */
        kvvm_seq x = 0, y = 0;
        if (!rc)
            rc = kvvm_seq_create(kv, &x);
        if (!rc)
            rc = kvvm_seq_grow(kv, x, SEQ_PAGES);
        if (!rc)
            rc = kvvm_seq_create(kv, &y);
        if (!rc)
            rc = kvvm_step(kv);
        uint64_t t5 = bench_now_ns();
        if (!rc)
            rc = kvvm_seq_grow(kv, y, SEQ_PAGES);
        vr[t] = (double)(bench_now_ns() - t5) / 1e3;
        if (x)
            kvvm_seq_free(kv, x);
        if (y)
            kvvm_seq_free(kv, y);
        for (uint32_t i = 0; i < n_dev && !rc; i++) {
            struct kvvm_seq_info in = { .size = sizeof in };
            rc = kvvm_seq_info(kv, s[i], &in);
            if (!rc && !in.resident)
                rc = kvvm_seq_swap_in(kv, s[i]);
        }
        if (!rc)
            rc = kvvm_step(kv);
    }
    if (!rc) {
        out->out_us = med(vo, iters);
        out->step_us = med(vs, iters);
        out->stats_us = med(vt, iters);
        out->reclaim_us = med(vr, iters);
    }
    free(vr);
    free(vo);
    free(vs);
    free(vt);
    free(s);
    kvvm_close(kv);
    return rc;
}

/* Each trial runs every pool size (the order reversed in every other trial), each figure
   the median of its `iters` calls; each size's row pairs its figure with the same trial's
   1x figure. */
int bench_scale(struct bench_ctx *b)
{
    static const uint32_t mult[] = { 1, 4, 16, 64 };
    enum { K = sizeof mult / sizeof mult[0] };
    int iters = b->quick ? 8 : 32;
    struct scale_run warm;
    struct bench_pair *p = calloc(4 * K, sizeof *p);
    if (!p)
        return -ENOMEM;
    /* a 1x warm-up run, not reported: the first context of the process pays for cold
       caches and page faults that the later sizes do not */
    int rc = scale_one(b, 1, iters, &warm);
    if (rc)
        fprintf(stderr, "bench scale: warm-up: %s\n", strerror(-rc));
    for (int t = 0; t < b->trials && !rc; t++) {
        struct scale_run r[K];
        for (int j = 0; j < K && !rc; j++) {
            int k = t % 2 ? K - 1 - j : j;
            rc = scale_one(b, mult[k], iters, &r[k]);
            if (rc)
                fprintf(stderr, "bench scale: %ux: %s\n", mult[k], strerror(-rc));
        }
        for (int k = 0; k < K && !rc; k++) {
            bench_pair_add(&p[0 * K + k], r[k].out_us, k ? r[0].out_us : 0);
            bench_pair_add(&p[1 * K + k], r[k].reclaim_us, k ? r[0].reclaim_us : 0);
            bench_pair_add(&p[2 * K + k], r[k].step_us, k ? r[0].step_us : 0);
            bench_pair_add(&p[3 * K + k], r[k].stats_us, k ? r[0].stats_us : 0);
        }
    }
    static const char *const what[4] = { "swap-out 16p", "reclaim 16p (grow)", "step",
                                         "stats" };
    for (int k = 0; k < K && !rc; k++)
        for (int m = 0; m < 4; m++) {
            char op[64];
            snprintf(op, sizeof op, "%s, %u dev pages", what[m], 256 * mult[k]);
            bench_report_pair(b, G, op, &p[m * K + k], k ? "1x" : NULL, "us", 1);
        }
    free(p);
    return rc;
}
