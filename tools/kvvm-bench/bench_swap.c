/*
 * tools/kvvm-bench/bench_swap.c: the swap group (issue 4, item 7), on the emulated device with
 * 2 MiB pages (one token = one page, one region):
 *  - swap-out and swap-in of one sequence of B pages, B = 1, 16, 256 (quick: 1, 16, 64):
 *    throughput = the bytes the stats count (bytes_to_host / bytes_to_device) over the wall
 *    time of the call plus kvvm_sync, against its fair baseline
 *      (b) a bare loop through the vmm layer (kvvm_testing_vmm_*) doing the same copies and the
 *          same map / set-access / unmap calls on an emulated device of its own;
 *    and, on a row of its own without a ratio,
 *      (a) memcpy of the same bytes between two host buffers (the emulator's copy is a memcpy:
 *          the physical floor, hot in cache for small B, so no fair baseline of a swap);
 *  - direct-reclaim latency: a grow of one page on a full device under KVVM_F_AUTO_SWAP with
 *    the watermarks at 0 (no background round), each one swapping out the least recently used
 *    sequence synchronously (p50 / p99 against the p50 / p99 of a grow with a ready frame).
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
    kvvm_config_init(&c);
    c.backend = KVVM_BACKEND_EMULATED;
    c.emu_granule = ps;
    c.page_size = ps;
    c.n_regions = 1;
    c.bytes_per_token = ps;
    c.max_seqs = max_seqs;
    c.max_tokens = 256;
    c.device_budget = (size_t)pages * ps;
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

/* MiB/s of the library's swap-out and swap-in of B pages (median of trials). */
static int lib_swap(struct bench_ctx *b, uint32_t B, double *out_mbs, double *in_mbs)
{
    kvvm *kv;
    int rc = open_kv(b, &kv, B, B, 4, 0, 0);
    if (rc)
        return rc;
    kvvm_seq s;
    int T = b->trials > 0 ? b->trials : 5;
    double vo[T], vi[T];
    rc = kvvm_seq_create(kv, &s);
    if (!rc)
        rc = kvvm_seq_grow(kv, s, B);
    if (!rc)
        rc = kvvm_step(kv);
    for (int t = 0; t < T && !rc; t++) {
        uint64_t b0 = stat_get(kv, 0), t0 = bench_now_ns();
        rc = kvvm_seq_swap_out(kv, s);
        if (!rc)
            rc = kvvm_sync(kv);
        uint64_t t1 = bench_now_ns(), b1 = stat_get(kv, 0);
        vo[t] = (b1 - b0) / MiB / ((t1 - t0) / 1e9);
        if (rc)
            break;
        b0 = stat_get(kv, 1);
        t0 = bench_now_ns();
        rc = kvvm_seq_swap_in(kv, s);
        if (!rc)
            rc = kvvm_sync(kv);
        t1 = bench_now_ns();
        b1 = stat_get(kv, 1);
        vi[t] = (b1 - b0) / MiB / ((t1 - t0) / 1e9);
        if (!rc)
            rc = kvvm_step(kv);
    }
    if (!rc) {
        *out_mbs = bench_median(vo, T);
        *in_mbs = bench_median(vi, T);
    }
    kvvm_close(kv);
    return rc;
}

/* (a) memcpy of B pages between two host buffers, both directions alike. */
static double raw_memcpy(struct bench_ctx *b, uint32_t B)
{
    size_t n = (size_t)B * page_of(b);
    char *x = malloc(n), *y = malloc(n);
    int T = b->trials > 0 ? b->trials : 5;
    double v[T];
    if (!x || !y) {
        free(x);
        free(y);
        return 0;
    }
    memset(x, 1, n);
    memset(y, 2, n);
    for (int t = 0; t < T; t++) {
        uint64_t t0 = bench_now_ns();
        memcpy(y, x, n);
        uint64_t t1 = bench_now_ns();
        v[t] = n / MiB / ((t1 - t0) / 1e9);
        x[t] = y[n - 1 - t];     /* keep the copy */
    }
    free(x);
    free(y);
    return bench_median(v, T);
}

/* (b) the bare mechanism through vmm: swap-out = B dtoh copies on a stream, sync, one unmap
   of the run; swap-in = one map (+ set-access) of the run, B htod copies, sync. */
static int bare_loop(struct bench_ctx *b, uint32_t B, double *out_mbs, double *in_mbs)
{
    size_t ps = page_of(b);
    struct kvvm_testing_vmm_params vp = { .backend = KVVM_BACKEND_EMULATED,
                                          .emu_capacity = (size_t)B * ps,
                             .emu_granule = ps };
    kvvm_testing_vmm *v;
    int rc = kvvm_testing_vmm_open(&vp, &v);
    if (rc)
        return rc;
    uint64_t base = 0;
    kvvm_testing_page *h = calloc(B, sizeof *h);
    kvvm_testing_stream st = NULL;
    char *host = NULL;
    uint32_t made = 0;
    int T = b->trials > 0 ? b->trials : 5;
    double vo[T], vi[T];
    rc = h ? kvvm_testing_vmm_reserve(v, (size_t)B * ps, &base) : -ENOMEM;
    if (!rc)
        rc = kvvm_testing_vmm_stream_create(v, &st);
    if (!rc)
        rc = kvvm_testing_vmm_host_alloc(v, (size_t)B * ps, (void **)&host);
    for (; !rc && made < B; made++)
        rc = kvvm_testing_vmm_phys_create(v, ps, &h[made]);
    if (!rc)
        rc = kvvm_testing_vmm_map_run(v, base, h, B, ps);
    for (int t = 0; t < T && !rc; t++) {
        uint64_t t0 = bench_now_ns();
        for (uint32_t i = 0; i < B && !rc; i++)
            rc = kvvm_testing_vmm_copy_dtoh(v, host + (size_t)i * ps, base + (uint64_t)i * ps,
                                            ps, st);
        if (!rc)
            rc = kvvm_testing_vmm_stream_sync(v, st);
        if (!rc)
            rc = kvvm_testing_vmm_unmap(v, base, (size_t)B * ps);
        uint64_t t1 = bench_now_ns();
        vo[t] = (double)B * ps / MiB / ((t1 - t0) / 1e9);
        if (!rc)
            rc = kvvm_testing_vmm_map_run(v, base, h, B, ps);
        for (uint32_t i = 0; i < B && !rc; i++)
            rc = kvvm_testing_vmm_copy_htod(v, base + (uint64_t)i * ps, host + (size_t)i * ps,
                                            ps, st);
        if (!rc)
            rc = kvvm_testing_vmm_stream_sync(v, st);
        uint64_t t2 = bench_now_ns();
        vi[t] = (double)B * ps / MiB / ((t2 - t1) / 1e9);
    }
    if (!rc) {
        *out_mbs = bench_median(vo, T);
        *in_mbs = bench_median(vi, T);
    }
    if (base)
        kvvm_testing_vmm_unmap(v, base, (size_t)B * ps);
    while (made-- > 0)
        kvvm_testing_vmm_phys_release(v, h[made]);
    if (host)
        kvvm_testing_vmm_host_free(v, host);
    if (st)
        kvvm_testing_vmm_stream_destroy(v, st);
    if (base)
        kvvm_testing_vmm_unreserve(v);
    kvvm_testing_vmm_close(v);
    free(h);
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
    char op[96];
    for (int k = 0; k < 3; k++) {
        uint32_t B = Bs[k];
        double lo = 0, li = 0, bo = 0, bi = 0;
        int rc = lib_swap(b, B, &lo, &li);
        if (rc) {
            fprintf(stderr, "bench swap: library swap of %u pages failed: %d\n", B, rc);
            return rc;
        }
        rc = bare_loop(b, B, &bo, &bi);
        if (rc) {
            fprintf(stderr, "bench swap: bare loop of %u pages failed: %d\n", B, rc);
            return rc;
        }
        double mc = raw_memcpy(b, B);
        /* the fair baseline is the bare loop: the same copies and map / unmap calls through
           the vmm layer without libkvvm's bookkeeping. memcpy (two host buffers, hot in
           cache for small B) is the copy's physical floor, shown on its own, no ratio. */
        snprintf(op, sizeof op, "swap-out %3u x %zu KiB", B, page_of(b) >> 10);
        bench_report(b, G, op, lo, bo, "same copies, bare vmm loop", "MiB/s", 0);
        snprintf(op, sizeof op, "swap-in  %3u x %zu KiB", B, page_of(b) >> 10);
        bench_report(b, G, op, li, bi, "same copies, bare vmm loop", "MiB/s", 0);
        snprintf(op, sizeof op, "memcpy   %3u x %zu KiB (host to host)", B, page_of(b) >> 10);
        bench_report(b, G, op, mc, 0, NULL, "MiB/s", 0);
    }
    double p50, p99, base, base99;
    int rc = reclaim_latency(b, &p50, &p99, &base, &base99);
    if (rc) {
        fprintf(stderr, "bench swap: direct reclaim run failed: %d\n", rc);
        return rc;
    }
    bench_report(b, G, "grow 1 page with direct reclaim: p50", p50, base, "grow with room p50",
                 "us/op", 1);
    bench_report(b, G, "grow 1 page with direct reclaim: p99", p99, base99,
                 "grow with room p99 (32 grows)", "us/op", 1);
    return 0;
}
