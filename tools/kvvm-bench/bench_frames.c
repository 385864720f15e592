/*
 * tools/kvvm-bench/bench_frames.c: the frames group (issue 13 item 6, second half): the
 * engine thread's time for a kvvm_seq_grow that needs new pages plus the kvvm_step after it
 * (without the pool thread the library creates frames in both: the grow's shortfall, and a
 * refill at the step), with frames created ahead by the frame pool thread (pool_thread = 1)
 * against created on the caller's thread (pool_thread = 0), p50 and p99 in the same run, as
 * ratios.
 *
 * Workload: 8 sequences of 2 regions, one page = 16 tokens; each call grows one sequence
 * (round robin) by a page per region (2 new frames), then kvvm_step and a short pause that
 * stands for the engine's compute between steps (1 ms: the thread refills meanwhile, as it
 * would during a real step; with a pause shorter than its creates the thread falls behind and
 * the grow waits for its deliveries); a sequence at its end is kept and a new one takes its turn
 * (not timed), so nothing is freed and every grow needs 2 frames never used before: the
 * budget holds them all (2 x grows + 64 frames), and both configurations create the same
 * frames, ahead on the thread or in the grow. Pool marks: 8 and 16 frames.
 * On the emulated device cuMemCreate is a memset; a GPU's takes ~200 us per 2 MiB. The
 * group sets KVVM_EMU_CREATE_NS (emulated driver cost, vmm/drv_emu.c) to 200000 unless it is
 * set already, and says so in the row names. 64 KiB granule unless --granule.
 */
#include "bench.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvvm.h"

#define G "frames"
#define NSEQ 8
#define NR 2
#define TOK_PER_PAGE 16
#define PAGES 32                  /* per region, per sequence at most */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static void pause_us(long us)
{
    struct timespec ts = { 0, us * 1000 };
    nanosleep(&ts, NULL);
}

struct fr_res { double p50_us, p99_us, sync_per_grow; };

static int run_one(struct bench_ctx *b, int thread, int n_grows, struct fr_res *out)
{
    size_t gran = b->granule ? b->granule : 64 * 1024;
    struct kvvm_config c;
    bench_config(&c, b->backend, gran, 0, NR, gran / TOK_PER_PAGE,
                 (uint32_t)(n_grows / PAGES + NSEQ + 1), (uint64_t)PAGES * TOK_PER_PAGE,
                 ((size_t)n_grows * NR + 64) * gran);
    c.emu_device_bytes = c.device_budget;
    c.pool_thread = thread;
    c.pool_low = 8;
    c.pool_high = 16;
    kvvm *kv;
    int rc = kvvm_open(&c, &kv);
    if (rc)
        return rc;
    uint64_t *lat = calloc((size_t)n_grows, sizeof *lat);
    kvvm_seq h[NSEQ] = { 0 };
    uint64_t len[NSEQ] = { 0 };
    struct kvvm_stats s0 = { .size = sizeof s0 }, s1 = { .size = sizeof s1 };
    if (!lat) {
        rc = -ENOMEM;
        goto out;
    }
    kvvm_stats(kv, &s0);
    for (int i = 0; i < n_grows && !rc; i++) {
        int q = i % NSEQ;
        if (len[q] >= c.max_tokens) {      /* full: kept, a new one takes its turn */
            h[q] = 0;
            len[q] = 0;
        }
        if (!h[q] && (rc = kvvm_seq_create(kv, &h[q])))
            break;
        uint64_t t0 = bench_now_ns();
        rc = kvvm_seq_grow(kv, h[q], len[q] + TOK_PER_PAGE);
        if (!rc)
            rc = kvvm_step(kv);
        lat[i] = bench_now_ns() - t0;
        len[q] += TOK_PER_PAGE;
        pause_us(1000);
    }
    kvvm_stats(kv, &s1);
    if (!rc) {
        qsort(lat, (size_t)n_grows, sizeof *lat, cmp_u64);
        out->p50_us = lat[n_grows / 2] / 1e3;
        out->p99_us = lat[(size_t)n_grows * 99 / 100] / 1e3;
        out->sync_per_grow = (double)(s1.frames_created_sync - s0.frames_created_sync) / n_grows;
    }
out:
    free(lat);
    kvvm_close(kv);
    return rc;
}

int bench_frames(struct bench_ctx *b)
{
    int set = !getenv("KVVM_EMU_CREATE_NS");
    if (set)
        setenv("KVVM_EMU_CREATE_NS", "200000", 1);
    long ns = strtol(getenv("KVVM_EMU_CREATE_NS"), NULL, 10);
    int n = b->quick ? 200 : 1000, trials = b->trials > 0 ? b->trials : (b->quick ? 1 : 3);
    double p50a[16], p99a[16], p50s[16], p99s[16], sa[16], ss[16];
    if (trials > 16)
        trials = 16;
    int rc = 0;
    for (int t = 0; t < trials && !rc; t++) {
        struct fr_res ra, rs;
        if (t % 2 ? (rc = run_one(b, 0, n, &rs)) || (rc = run_one(b, 1, n, &ra))
                  : (rc = run_one(b, 1, n, &ra)) || (rc = run_one(b, 0, n, &rs)))
            break;
        p50a[t] = ra.p50_us; p99a[t] = ra.p99_us; sa[t] = ra.sync_per_grow;
        p50s[t] = rs.p50_us; p99s[t] = rs.p99_us; ss[t] = rs.sync_per_grow;
    }
    if (set)
        unsetenv("KVVM_EMU_CREATE_NS");
    if (rc)
        return rc;
    char op[96], base[64];
    snprintf(base, sizeof base, "created on the caller's thread");
    snprintf(op, sizeof op, "grow (new pages) + step, p50 (pool thread, create %ld us)",
             ns / 1000);
    bench_report_trials(b, G, op, p50a, p50s, trials, base, "us/op", 1);
    snprintf(op, sizeof op, "grow (new pages) + step, p99 (pool thread, create %ld us)",
             ns / 1000);
    bench_report_trials(b, G, op, p99a, p99s, trials, base, "us/op", 1);
    bench_report_trials(b, G, "frames created on the caller's thread per grow (pool thread)",
                        sa, ss, trials, base, "frames", 1);
    return 0;
}
