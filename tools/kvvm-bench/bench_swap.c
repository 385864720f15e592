/*
 * tools/kvvm-bench/bench_swap.c: the swap group (issue 4, item 7; trustworthy rows: issue 19),
 * on the emulated device, one region:
 *  - swap-out and swap-in of one sequence of B pages of the granule (2 MiB unless --granule),
 *    B = 1, 16, 256 (quick: 1, 16, 64), and of one sequence of 1k..64k tokens in 64 KiB
 *    pages of 256 tokens (4..256 pages; quick: up to 16k): throughput = the bytes the stats
 *    count (bytes_to_host / bytes_to_device) over the wall time of the call plus kvvm_sync,
 *    against the bare loop: the same driver calls through the vmm layer (a copy per page on
 *    a stream, its synchronization, the run unmapped; the run mapped, a copy per page,
 *    synchronization: what the calls group counts for the library's swaps) on an emulated
 *    device of its own. Both stay open over the trials, warmed by one untimed round each, and
 *    alternate within every trial; memcpy of the same bytes between two warm host buffers
 *    is shown on a row of its own without a ratio (the copy's physical floor);
 *  - direct-reclaim latency: a grow of one page on a full device under KVVM_F_AUTO_SWAP with
 *    the watermarks at 0 (no background round), each one swapping out the least recently used
 *    sequence synchronously (p50 / p99 against the p50 / p99 of a grow with a ready frame,
 *    both taken in the same context in each trial).
 */
#include "bench.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvvm.h"
#include "kvvm_testing.h"

#define G "swap"
#define MiB (1024.0 * 1024.0)

static size_t page_of(struct bench_ctx *b)
{
    return b->granule ? b->granule : (2u << 20);
}

static int open_kv(struct bench_ctx *b, kvvm **kv, uint32_t pages, uint32_t host_pages,
                   uint32_t max_seqs, unsigned flags, int no_marks)
{
    struct kvvm_config c;
    size_t ps = page_of(b);
    bench_config(&c, KVVM_BACKEND_EMULATED, ps, ps, 1, ps, max_seqs, 256, (size_t)pages * ps);
    c.host_budget = (size_t)host_pages * ps;
    c.flags = flags;
    c.emu_opaque = 0;
    if (no_marks)       /* no watermark reclaim: every shortfall is a direct reclaim */
        c.device_min = c.device_low = c.device_high = 0;
    return kvvm_open(&c, kv);
}

static uint64_t stat_get(kvvm *kv, int to_device)
{
    struct kvvm_stats st = { .size = sizeof st };
    kvvm_stats(kv, &st);
    return to_device ? st.bytes_to_device : st.bytes_to_host;
}

/* One sequence of `pages` pages of ps bytes (tokens_per_page tokens each) in a context of
   its own (device and host room for it), swapped out and in by the library; and the same
   moves by a bare loop through the vmm layer on a device of its own. Both stay open over
   the trials. */
struct swap_case {
    size_t ps;
    uint32_t pages;
    uint64_t tpp;                   /* tokens per page */
    kvvm *kv;
    kvvm_seq s;
    kvvm_testing_vmm *v;            /* the bare loop's */
    uint64_t base;
    kvvm_testing_page *h;
    uint32_t made;
    kvvm_testing_stream st;
    char *host;
    char *m0, *m1;                  /* memcpy's buffers */
};

static int case_open(struct swap_case *c)
{
    struct kvvm_config cf;
    bench_config(&cf, KVVM_BACKEND_EMULATED, c->ps, c->ps, 1, c->ps / c->tpp, 4,
                 (uint64_t)c->pages * c->tpp, (size_t)c->pages * c->ps);
    cf.host_budget = (size_t)c->pages * c->ps;
    int rc = kvvm_open(&cf, &c->kv);
    if (!rc)
        rc = kvvm_seq_create(c->kv, &c->s);
    if (!rc)
        rc = kvvm_seq_grow(c->kv, c->s, (uint64_t)c->pages * c->tpp);
    if (!rc)
        rc = kvvm_step(c->kv);
    if (rc)
        return rc;
    struct kvvm_testing_vmm_params vp = { .backend = KVVM_BACKEND_EMULATED,
                                          .emu_capacity = (size_t)c->pages * c->ps,
                                          .emu_granule = c->ps };
    size_t n = (size_t)c->pages * c->ps;
    if ((rc = kvvm_testing_vmm_open(&vp, &c->v)))
        return rc;
    c->h = calloc(c->pages, sizeof *c->h);
    c->m0 = malloc(n);
    c->m1 = malloc(n);
    rc = c->h && c->m0 && c->m1 ? 0 : -ENOMEM;
    if (!rc)
        rc = kvvm_testing_vmm_reserve(c->v, n, &c->base);
    if (!rc)
        rc = kvvm_testing_vmm_stream_create(c->v, &c->st);
    if (!rc)
        rc = kvvm_testing_vmm_host_alloc(c->v, n, (void **)&c->host);
    for (; !rc && c->made < c->pages; c->made++)
        rc = kvvm_testing_vmm_phys_create(c->v, c->ps, &c->h[c->made]);
    if (!rc)
        rc = kvvm_testing_vmm_map_run(c->v, c->base, c->h, c->pages, c->ps);
    if (!rc) {
        memset(c->host, 3, n);
        memset(c->m0, 1, n);
        memset(c->m1, 2, n);
    }
    return rc;
}

static void case_close(struct swap_case *c)
{
    if (c->kv)
        kvvm_close(c->kv);
    if (c->v) {
        size_t n = (size_t)c->pages * c->ps;
        if (c->base)
            kvvm_testing_vmm_unmap(c->v, c->base, n);
        while (c->made-- > 0)
            kvvm_testing_vmm_phys_release(c->v, c->h[c->made]);
        if (c->host)
            kvvm_testing_vmm_host_free(c->v, c->host);
        if (c->st)
            kvvm_testing_vmm_stream_destroy(c->v, c->st);
        if (c->base)
            kvvm_testing_vmm_unreserve(c->v);
        kvvm_testing_vmm_close(c->v);
    }
    free(c->h);
    free(c->m0);
    free(c->m1);
}

/* The library: swap-out + kvvm_sync, swap-in + kvvm_sync (MiB/s of the bytes the stats
   count), then a step (ends the swap-in's protection). */
static int lib_round(struct swap_case *c, double *out_mbs, double *in_mbs)
{
    uint64_t b0 = stat_get(c->kv, 0), t0 = bench_now_ns();
    int rc = kvvm_seq_swap_out(c->kv, c->s);
    if (!rc)
        rc = kvvm_sync(c->kv);
    uint64_t t1 = bench_now_ns();
    *out_mbs = (double)(stat_get(c->kv, 0) - b0) / MiB / ((double)(t1 - t0) / 1e9);
    if (rc)
        return rc;
    b0 = stat_get(c->kv, 1);
    t0 = bench_now_ns();
    rc = kvvm_seq_swap_in(c->kv, c->s);
    if (!rc)
        rc = kvvm_sync(c->kv);
    t1 = bench_now_ns();
    *in_mbs = (double)(stat_get(c->kv, 1) - b0) / MiB / ((double)(t1 - t0) / 1e9);
    return rc ? rc : kvvm_step(c->kv);
}

/* The bare mechanism through vmm, what the library asks of the driver (the calls group
   counts it): swap-out = a dtoh copy per page on a stream, its synchronization, one unmap
   of the run; swap-in = the run mapped (a map per page, one set-access), an htod copy per
   page, synchronization. */
static int bare_round(struct swap_case *c, double *out_mbs, double *in_mbs)
{
    size_t ps = c->ps, n = (size_t)c->pages * ps;
    int rc = 0;
    uint64_t t0 = bench_now_ns();
    for (uint32_t i = 0; i < c->pages && !rc; i++)
        rc = kvvm_testing_vmm_copy_dtoh(c->v, c->host + (size_t)i * ps,
                                        c->base + (uint64_t)i * ps, ps, c->st);
    if (!rc)
        rc = kvvm_testing_vmm_stream_sync(c->v, c->st);
    if (!rc)
        rc = kvvm_testing_vmm_unmap(c->v, c->base, n);
    uint64_t t1 = bench_now_ns();
    *out_mbs = (double)n / MiB / ((double)(t1 - t0) / 1e9);
    if (!rc)
        rc = kvvm_testing_vmm_map_run(c->v, c->base, c->h, c->pages, ps);
    for (uint32_t i = 0; i < c->pages && !rc; i++)
        rc = kvvm_testing_vmm_copy_htod(c->v, c->base + (uint64_t)i * ps,
                                        c->host + (size_t)i * ps, ps, c->st);
    if (!rc)
        rc = kvvm_testing_vmm_stream_sync(c->v, c->st);
    uint64_t t2 = bench_now_ns();
    *in_mbs = (double)n / MiB / ((double)(t2 - t1) / 1e9);
    return rc;
}

/* memcpy of the same bytes between two host buffers (warm): the copy's physical floor. */
static double memcpy_round(struct swap_case *c)
{
    size_t n = (size_t)c->pages * c->ps;
    uint64_t t0 = bench_now_ns();
    memcpy(c->m1, c->m0, n);
    uint64_t t1 = bench_now_ns();
    c->m0[0] = c->m1[n - 1];      /* keep the copy */
    return (double)n / MiB / ((double)(t1 - t0) / 1e9);
}

/* One warm-up round of each, untimed, then per trial the library and the bare loop in
   alternating order, and memcpy. */
static int case_run(struct bench_ctx *b, struct swap_case *c, struct bench_pair *po,
                    struct bench_pair *pi, struct bench_pair *pm)
{
    double lo, li, bo, bi;
    int rc = case_open(c);
    if (!rc)
        rc = lib_round(c, &lo, &li);
    if (!rc)
        rc = bare_round(c, &bo, &bi);
    (void)memcpy_round(c);
    po->n = pi->n = pm->n = 0;
    for (int t = 0; t < b->trials && !rc; t++) {
        if (t % 2) {
            rc = bare_round(c, &bo, &bi);
            if (!rc)
                rc = lib_round(c, &lo, &li);
        } else {
            rc = lib_round(c, &lo, &li);
            if (!rc)
                rc = bare_round(c, &bo, &bi);
        }
        bench_pair_add(po, lo, bo);
        bench_pair_add(pi, li, bi);
        bench_pair_add(pm, memcpy_round(c), 0);
    }
    case_close(c);
    return rc;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Grows of one page on a full device: each reclaims (swaps out) the LRU sequence. */
static int reclaim_latency(struct bench_ctx *b, double *p50, double *p99, double *base50,
                           double *base99)
{
    enum { DEV = 32 };
    int n = b->quick ? 64 : 256;
    kvvm *kv;
    int rc = open_kv(b, &kv, DEV, 2 * (uint32_t)n + DEV, (uint32_t)n + DEV, KVVM_F_AUTO_SWAP, 1);
    if (rc)
        return rc;
    double *lat = calloc((size_t)n, sizeof *lat), *free_lat = calloc((size_t)n, sizeof *lat);
    kvvm_seq *s = calloc((size_t)n + DEV, sizeof *s);
    rc = lat && free_lat && s ? 0 : -ENOMEM;
    /* create every frame once, then fill the device with one-page sequences (the baseline:
       a grow with a ready frame), unprotected after a step */
    for (int i = 0; i < DEV && !rc; i++) {
        rc = kvvm_seq_create(kv, &s[i]);
        if (!rc)
            rc = kvvm_seq_grow(kv, s[i], 1);
    }
    for (int i = 0; i < DEV && !rc; i++)
        rc = kvvm_seq_free(kv, s[i]);
    if (!rc)
        rc = kvvm_sync(kv);
    for (int i = 0; i < DEV && !rc; i++) {
        rc = kvvm_seq_create(kv, &s[i]);
        uint64_t t0 = bench_now_ns();
        if (!rc)
            rc = kvvm_seq_grow(kv, s[i], 1);
        free_lat[i] = (bench_now_ns() - t0) / 1e3;
    }
    if (!rc)
        rc = kvvm_step(kv);
    if (!rc)
        rc = kvvm_sync(kv);
    for (int i = 0; i < n && !rc; i++) {
        kvvm_seq q;
        rc = kvvm_seq_create(kv, &q);
        uint64_t t0 = bench_now_ns();
        if (!rc)
            rc = kvvm_seq_grow(kv, q, 1);
        lat[i] = (bench_now_ns() - t0) / 1e3;
        s[DEV + i] = q;
        if (!rc)
            rc = kvvm_step(kv);
    }
    if (!rc) {
        qsort(lat, (size_t)n, sizeof *lat, cmp_d);
        qsort(free_lat, DEV, sizeof *lat, cmp_d);
        *p50 = lat[n / 2];
        *p99 = lat[(n * 99) / 100];
        *base50 = free_lat[DEV / 2];
        *base99 = free_lat[(DEV * 99) / 100];
    }
    free(lat);
    free(free_lat);
    free(s);
    kvvm_close(kv);
    return rc;
}

int bench_swap(struct bench_ctx *b)
{
    const uint32_t full[3] = { 1, 16, 256 }, quick[3] = { 1, 16, 64 };
    const uint32_t *Bs = b->quick ? quick : full;
    struct bench_pair po, pi, pm;
    char op[96];
    int rc = 0;
    for (int k = 0; k < 3 && !rc; k++) {
        struct swap_case c = { .ps = page_of(b), .pages = Bs[k], .tpp = 1 };
        uint32_t B = Bs[k];
        rc = case_run(b, &c, &po, &pi, &pm);
        if (rc) {
            fprintf(stderr, "bench swap: swap of %u pages failed: %d\n", B, rc);
            return rc;
        }
        /* the fair baseline is the bare loop: the same copies and map / unmap calls through
           the vmm layer without libkvvm's bookkeeping. memcpy (two host buffers) is the
           copy's physical floor, shown on its own, no ratio. */
        snprintf(op, sizeof op, "swap-out %3u x %zu KiB", B, page_of(b) >> 10);
        bench_report_pair(b, G, op, &po, "same copies, bare vmm loop", "MiB/s", 0);
        snprintf(op, sizeof op, "swap-in  %3u x %zu KiB", B, page_of(b) >> 10);
        bench_report_pair(b, G, op, &pi, "same copies, bare vmm loop", "MiB/s", 0);
        snprintf(op, sizeof op, "memcpy   %3u x %zu KiB (host to host)", B, page_of(b) >> 10);
        bench_report_pair(b, G, op, &pm, NULL, "MiB/s", 0);
    }
    /* against the sequence's length: 64 KiB pages of 256 tokens (1k tokens = 4 pages, 64k
       = 256), each beside the bare loop moving the same pages */
    static const uint64_t lens[4] = { 1024, 4096, 16384, 65536 };
    static const char *const names[4] = { "1k", "4k", "16k", "64k" };
    for (int k = 0; k < (b->quick ? 3 : 4) && !rc; k++) {
        struct swap_case c = { .ps = 64u << 10, .pages = (uint32_t)(lens[k] / 256),
                               .tpp = 256 };
        rc = case_run(b, &c, &po, &pi, &pm);
        if (rc) {
            fprintf(stderr, "bench swap: swap of %s tokens failed: %d\n", names[k], rc);
            return rc;
        }
        snprintf(op, sizeof op, "swap-out, %s tokens (64 KiB pages)", names[k]);
        bench_report_pair(b, G, op, &po, "same copies, bare vmm loop", "MiB/s", 0);
        snprintf(op, sizeof op, "swap-in, %s tokens (64 KiB pages)", names[k]);
        bench_report_pair(b, G, op, &pi, "same copies, bare vmm loop", "MiB/s", 0);
    }
    struct bench_pair p50 = { 0 }, p99 = { 0 };
    for (int t = 0; t < b->trials && !rc; t++) {
        double v50 = 0, v99 = 0, b50 = 0, b99 = 0;
        rc = reclaim_latency(b, &v50, &v99, &b50, &b99);
        bench_pair_add(&p50, v50, b50);
        bench_pair_add(&p99, v99, b99);
    }
    if (rc) {
        fprintf(stderr, "bench swap: direct reclaim run failed: %d\n", rc);
        return rc;
    }
    bench_report_pair(b, G, "grow 1 page with direct reclaim: p50", &p50, "grow with room p50",
                      "us/op", 1);
    bench_report_pair(b, G, "grow 1 page with direct reclaim: p99", &p99,
                      "grow with room p99 (32 grows)", "us/op", 1);
    return 0;
}
