/*
 * tools/kvvm-bench/bench_view.c: the view group (issue 22): what the pool view
 * (KVVM_F_POOL_VIEW) costs, beside the same work measured in the same run.
 *
 *  - grow onto a new block: two contexts opened identically except KVVM_F_POOL_VIEW, pool
 *    thread off, alternated within each trial (the order swapped every trial). NSEQ
 *    sequences each grow BLOCKS times by one block (tokens_per_block: every grow maps a new
 *    page), in rounds of ROUND grows (one per sequence); kvvm_step runs between rounds, as an
 *    engine's step would, OUTSIDE the timed and counted region. Without the pool thread
 *    kvvm_step is what prepares the view's groups (n_regions ready frames mapped at a free
 *    id) and refills the ready frames, and it keeps at most 4 groups (docs/design.md "The
 *    pool view"); so ROUND = 4 grows per step lets every grow take a prepared group, and
 *    what is counted is the grow's own work on the engine's thread. Rows: time per grow with
 *    the view against without; driver calls per grow (every entry point the emulator counts,
 *    around the grows only) with against without.
 *  - block-table fill per block: kvvm_seq_block_table of one sequence of TBL blocks against
 *    memcpy of TBL int32 ids from an array the engine keeps itself; kvvm_batch_block_table
 *    (CSR) of BSEQ sequences of BBLK blocks against memcpy of the same number of ids.
 *  - map-ahead refilled by the frame pool thread: map and set-access calls on the engine's
 *    thread per grow into a new page, and the grows' time, pool thread on against off
 *    (ahead_rows).
 *  - virtual address space: reserved_bytes of kvvm_stats_json's device object with the view
 *    against without (same configuration).
 *
 * Workload: 2 regions (K and V), 4 KiB pages of 16 tokens (the emulated granule 4 KiB unless
 * --granule). The call counts need the emulated device (on CUDA the row is left out).
 */
#include "bench.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvvm.h"
#include "kvvm_testing.h"

#define G "view"
#define TPB 16
#define NREG 2
#define NSEQ 64
#define ROUND 4          /* grows between two kvvm_step: the groups kept prepared */
#define TBL 256          /* blocks of the block-table sequence */
#define BSEQ 64          /* batch: sequences */
#define BBLK 16          /* batch: blocks each */
#define MAXT 16          /* trials kept */

static int open_ctx(struct bench_ctx *b, int view, kvvm **kv)
{
    size_t gran = b->granule ? b->granule : 4096;
    struct kvvm_config c;
    /* the grows' pages, the block-table sequence and batch, and room for the reserve */
    bench_config(&c, b->backend, gran, 0, NREG, gran / TPB, NSEQ + 1, (uint64_t)TBL * TPB,
                 ((size_t)NSEQ * TBL / 4 + TBL + BSEQ * BBLK + 256) * NREG * gran);
    c.pool_thread = 0;
    if (view)
        c.flags |= KVVM_F_POOL_VIEW;
    return kvvm_open(&c, kv);
}

static uint64_t calls_total(kvvm *kv)
{
    struct kvvm_testing_emu_calls c;
    uint64_t t = 0;
    if (kvvm_testing_emu_calls(kv, &c))
        return 0;
    for (size_t i = 0; i < c.n; i++)
        t += c.count[i];
    return t;
}

/* One pass of the grow workload on kv: NSEQ sequences grown `blocks` times by one block,
   ROUND grows between two kvvm_step (not timed, not counted). *ns and *calls: per grow. */
static int grow_pass(kvvm *kv, int blocks, double *ns, double *calls, double *step_calls)
{
    kvvm_seq s[NSEQ];
    int rc = 0, n = 0;
    uint64_t t = 0, c = 0, cs = 0;
    for (; n < NSEQ && !rc; n++)
        rc = kvvm_seq_create(kv, &s[n]);
    if (!rc)
        rc = kvvm_step(kv);
    for (int blk = 1; blk <= blocks && !rc; blk++)
        for (int i = 0; i < NSEQ && !rc; i += ROUND) {
            uint64_t c0 = calls_total(kv), t0 = bench_now_ns();
            for (int j = i; j < i + ROUND && !rc; j++)
                rc = kvvm_seq_grow(kv, s[j], (uint64_t)blk * TPB);
            t += bench_now_ns() - t0;
            c += calls_total(kv) - c0;
            c0 = calls_total(kv);
            if (!rc)
                rc = kvvm_step(kv);
            cs += calls_total(kv) - c0;
        }
    for (int i = 0; i < n; i++)
        (void)kvvm_seq_free(kv, s[i]);
    (void)kvvm_sync(kv);
    (void)kvvm_step(kv);
    *ns = (double)t / ((double)NSEQ * blocks);
    *calls = (double)c / ((double)NSEQ * blocks);
    *step_calls = (double)cs / ((double)NSEQ * blocks);
    return rc;
}

static int grow_rows(struct bench_ctx *b, kvvm *kv_v, kvvm *kv_n, int trials, int blocks)
{
    double tv[MAXT], tn[MAXT], cv[MAXT], cn[MAXT], sv[MAXT], sn[MAXT];
    int rc = 0;
    for (int t = 0; t < trials && !rc; t++) {
        if (t % 2 == 0) {
            rc = grow_pass(kv_v, blocks, &tv[t], &cv[t], &sv[t]);
            if (!rc)
                rc = grow_pass(kv_n, blocks, &tn[t], &cn[t], &sn[t]);
        }
        else {
            rc = grow_pass(kv_n, blocks, &tn[t], &cn[t], &sn[t]);
            if (!rc)
                rc = grow_pass(kv_v, blocks, &tv[t], &cv[t], &sv[t]);
        }
    }
    if (rc)
        return rc;
    bench_report_trials(b, G, "grow onto a new block, view (steps between, untimed)", tv, tn,
                        trials, "the same grows, no view", "ns/op", 1);
    if (kvvm_testing_emu_calls(kv_v, &(struct kvvm_testing_emu_calls){ 0 }) == 0) {
        bench_report_trials(b, G, "driver calls per grow, view (engine thread)", cv, cn, trials,
                            "the same grows, no view", "calls", 1);
        bench_report_trials(b, G, "driver calls in the steps between, per grow, view", sv, sn,
                            trials, "the same steps, no view", "calls", 1);
    }
    return 0;
}

/* ---- map-ahead refilled by the frame pool thread (issue 19) ----
   Two contexts alike (no view, map_ahead AHEAD) but for pool_thread; NSEQ sequences grow
   one block at a time (every grow crosses into a new page), a kvvm_step and 1 ms (the
   forward pass a step stands for) after each round of NSEQ grows (untimed); cuMemMap + cuMemSetAccess made on this (the engine's) thread during
   the grows, per grow, and the grows' time. With the thread the refills run there; a grow
   outrunning its map-ahead (the thread late) still maps on the engine's thread. */
#define AHEAD 8
#define PASS_NS 1000000     /* 1 ms */
static int ahead_open(struct bench_ctx *b, int thread, int blocks, kvvm **kv)
{
    size_t gran = b->granule ? b->granule : 4096;
    struct kvvm_config c;
    bench_config(&c, b->backend, gran, 0, NREG, gran / TPB, NSEQ, (uint64_t)blocks * TPB,
                 ((size_t)NSEQ * (blocks + AHEAD) + 256) * NREG * gran);
    c.map_ahead = AHEAD;
    c.pool_thread = thread;
    return kvvm_open(&c, kv);
}

static uint64_t my_maps(void)
{
    struct kvvm_testing_emu_calls c;
    if (kvvm_testing_emu_thread_calls(&c))
        return 0;
    return kvvm_testing_emu_count(&c, "cuMemMap") + kvvm_testing_emu_count(&c, "cuMemSetAccess");
}

static int ahead_pass(kvvm *kv, int blocks, double *ns, double *calls)
{
    kvvm_seq s[NSEQ];
    int rc = 0, n = 0;
    uint64_t t = 0, c = 0;
    for (; n < NSEQ && !rc; n++)
        if (!(rc = kvvm_seq_create(kv, &s[n])))
            rc = kvvm_seq_grow(kv, s[n], TPB);
    if (!rc)
        rc = kvvm_sync(kv);
    for (int blk = 2; blk <= blocks && !rc; blk++) {
        uint64_t c0 = my_maps(), t0 = bench_now_ns();
        for (int i = 0; i < NSEQ && !rc; i++)
            rc = kvvm_seq_grow(kv, s[i], (uint64_t)blk * TPB);
        t += bench_now_ns() - t0;
        c += my_maps() - c0;
        if (!rc)
            rc = kvvm_step(kv);
        /* the forward pass a step stands for (untimed): on a GPU milliseconds */
        nanosleep(&(struct timespec){ .tv_nsec = PASS_NS }, NULL);
    }
    for (int i = 0; i < n; i++)
        (void)kvvm_seq_free(kv, s[i]);
    (void)kvvm_sync(kv);
    *ns = (double)t / ((double)NSEQ * (blocks - 1));
    *calls = (double)c / ((double)NSEQ * (blocks - 1));
    return rc;
}

static int ahead_rows(struct bench_ctx *b, int trials, int blocks)
{
    kvvm *kv[2] = { NULL, NULL };
    double tm[2][MAXT], cl[2][MAXT];
    int rc = ahead_open(b, 1, blocks, &kv[1]);
    if (!rc)
        rc = ahead_open(b, 0, blocks, &kv[0]);
    for (int t = 0; t < trials && !rc; t++)
        for (int j = 0; j < 2 && !rc; j++) {
            int k = t % 2 ? j : 1 - j;
            rc = ahead_pass(kv[k], blocks, &tm[k][t], &cl[k][t]);
        }
    if (!rc && kvvm_testing_emu_calls(kv[1], &(struct kvvm_testing_emu_calls){ 0 }) == 0) {
        bench_report_trials(b, G, "map+set-access calls per grow into a new page, map-ahead 8, "
                            "pool thread (engine thread)", cl[1], cl[0], trials,
                            "the same grows, no pool thread", "calls", 1);
        bench_report_trials(b, G, "grow into a new page, map-ahead 8, pool thread (steps "
                            "between, untimed)", tm[1], tm[0], trials,
                            "the same grows, no pool thread", "ns/op", 1);
    }
    for (int k = 0; k < 2; k++)
        if (kv[k])
            kvvm_close(kv[k]);
    return rc;
}

/* Keeps the compiler from dropping the baseline's copies. */
static volatile int32_t sink;

static int table_rows(struct bench_ctx *b, kvvm *kv, int trials, int reps)
{
    kvvm_seq one, bs[BSEQ];
    int32_t ids[TBL], own[TBL], dst[TBL];
    int32_t indptr[BSEQ + 1], *idx = calloc(BSEQ * BBLK, sizeof *idx);
    int32_t *own_b = calloc(BSEQ * BBLK, sizeof *own_b), *dst_b = calloc(BSEQ * BBLK, 4);
    int32_t last[BSEQ];
    double ts[MAXT], tm[MAXT], tb[MAXT], tbm[MAXT];
    int rc = idx && own_b && dst_b ? kvvm_seq_create(kv, &one) : -ENOMEM;
    int n = 0;
    if (!rc)
        rc = kvvm_seq_grow(kv, one, (uint64_t)TBL * TPB);
    for (; n < BSEQ && !rc; n++) {
        rc = kvvm_seq_create(kv, &bs[n]);
        if (!rc)
            rc = kvvm_seq_grow(kv, bs[n], (uint64_t)BBLK * TPB);
        else
            break;
    }
    if (!rc)
        rc = kvvm_seq_block_table(kv, one, 0, TBL, own);
    if (!rc)
        rc = kvvm_batch_block_table(kv, bs, BSEQ, indptr, own_b, BSEQ * BBLK, last);
    for (int t = 0; t < trials && !rc; t++) {
        uint64_t t0 = bench_now_ns();
        for (int r = 0; r < reps && !rc; r++)
            rc = kvvm_seq_block_table(kv, one, 0, TBL, ids);
        uint64_t t1 = bench_now_ns();
        for (int r = 0; r < reps; r++) {
            memcpy(dst, own, sizeof dst);
            sink = dst[r % TBL];
        }
        uint64_t t2 = bench_now_ns();
        for (int r = 0; r < reps && !rc; r++)
            rc = kvvm_batch_block_table(kv, bs, BSEQ, indptr, idx, BSEQ * BBLK, last);
        uint64_t t3 = bench_now_ns();
        for (int r = 0; r < reps; r++) {
            memcpy(dst_b, own_b, (size_t)BSEQ * BBLK * sizeof *dst_b);
            sink = dst_b[r % (BSEQ * BBLK)];
        }
        uint64_t t4 = bench_now_ns();
        ts[t] = (double)(t1 - t0) / ((double)reps * TBL);
        tm[t] = (double)(t2 - t1) / ((double)reps * TBL);
        tb[t] = (double)(t3 - t2) / ((double)reps * BSEQ * BBLK);
        tbm[t] = (double)(t4 - t3) / ((double)reps * BSEQ * BBLK);
    }
    if (!rc && (memcmp(ids, own, sizeof ids) || memcmp(idx, own_b, BSEQ * BBLK * sizeof *idx)))
        rc = -EIO;          /* the ids changed between calls: not the same work */
    if (!rc) {
        bench_report_trials(b, G, "kvvm_seq_block_table, 256 blocks (per block)", ts, tm,
                            trials, "memcpy of the engine's own ids", "ns/op", 1);
        bench_report_trials(b, G, "kvvm_batch_block_table, 64 x 16 blocks (per block)", tb,
                            tbm, trials, "memcpy of the engine's own ids", "ns/op", 1);
    }
    (void)kvvm_seq_free(kv, one);
    for (int i = 0; i < n; i++)
        (void)kvvm_seq_free(kv, bs[i]);
    free(idx);
    free(own_b);
    free(dst_b);
    return rc;
}

static int reserved_bytes(kvvm *kv, double *out)
{
    static char buf[65536];
    int rc = kvvm_stats_json(kv, buf, sizeof buf);
    const char *p = rc ? NULL : strstr(buf, "\"reserved_bytes\":");
    if (rc)
        return rc;
    if (!p)
        return -EIO;
    *out = strtod(p + strlen("\"reserved_bytes\":"), NULL);
    return 0;
}

int bench_view(struct bench_ctx *b)
{
    kvvm *kv_v = NULL, *kv_n = NULL;
    int trials = b->trials > MAXT ? MAXT : b->trials;
    int blocks = b->quick ? 8 : 32, reps = b->quick ? 200 : 2000;
    int rc = open_ctx(b, 1, &kv_v);
    if (!rc)
        rc = open_ctx(b, 0, &kv_n);
    if (!rc)
        rc = grow_rows(b, kv_v, kv_n, trials, blocks);
    if (!rc)
        rc = ahead_rows(b, trials, blocks);
    if (!rc)
        rc = table_rows(b, kv_v, trials, reps);
    double rv = 0, rn = 0;
    if (!rc)
        rc = reserved_bytes(kv_v, &rv);
    if (!rc)
        rc = reserved_bytes(kv_n, &rn);
    if (!rc)
        bench_report(b, G, "virtual address space reserved, view", rv / (1 << 20), rn / (1 << 20),
                     "the same context, no view", "MiB", 1);
    kvvm_close(kv_v);
    kvvm_close(kv_n);
    return rc;
}
