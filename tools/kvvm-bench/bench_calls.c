/*
 * tools/kvvm-bench/bench_calls.c: driver calls per library operation, as the emulated device
 * counts them (kvvm_testing_emu_calls, testing/kvvm_testing.h): what grow, fork,
 * copy-on-write, swap-out/in, a decode step and free ask of the driver. Counts, not times,
 * so a change in them is a change in the library; on a GPU each of them costs (cuMemCreate
 * of 2 MiB ~200 us, cuMemMap / cuMemSetAccess / cuMemUnmap tens of us). Work deferred to a fence (releases of freed
 * pages) lands in whichever later call reaps it, so each operation that defers work is
 * counted through the kvvm_sync that completes it; the frame reserve kvvm_step refills makes
 * the creates of a row depend on the rows before it (the table is one sequence of calls).
 *
 * Conditions (printed with the table): the emulated device, whatever --backend says (the CUDA
 * driver counts nothing); page = the granule (--granule, default 2 MiB); 2 regions per
 * sequence (K and V of one layer: every per-page count is per region, so it scales with
 * n_regions); no map-ahead; a host tier for swaps; no auto-swap. Each operation is counted
 * from its call to its return, plus the kvvm_sync (swap-out, swap-in, free) or kvvm_step
 * (decode step) named beside it. Columns: creates =
 * cuMemCreate, releases = cuMemRelease, maps = cuMemMap, set-acc = cuMemSetAccess, unmaps =
 * cuMemUnmap, copies = cuMemcpy*Async + cuMemsetD8Async, events = cuEventRecord / Query /
 * Synchronize + cuStreamWaitEvent, ctx = cuCtxGetCurrent + cuCtxSetCurrent (each public call
 * saves the caller's context, makes its own current and restores the caller's; a
 * cuCtxSetCurrent made while no context was current, e.g. on a library thread's first call,
 * counts nowhere), other = every other entry point (capture checks, stream synchronization).
 * An engine stream is set (kvvm_stream_create + kvvm_set_stream), so kvvm_step records its
 * fence there. creates <= maps: new pages come first from frames the pool created before (at
 * open, or freed by an earlier operation). Calls made on any thread with the context's device
 * current count (library threads too). Nothing is asserted (tests/test_emu.c's calls tests pin
 * the relations); with --json each cell is one record (unit "calls").
 */
#include "../common/json.h"
#include "bench.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "kvvm.h"
#include "kvvm_testing.h"

#define GROUP "calls"
#define REGIONS 2
#define N_PAGES 16       /* pages of the "grow by N" sequence, the one forked and swapped */
#define DECODE_SEQS 8    /* sequences of the decode step */

#define NCOL 10
#define NROWS 12
struct row {
    char op[64];         /* inline: rows are filled in the traced helper, another image */
    double v[NCOL];      /* per column below */
};

static const char *const cols[NCOL] = { "creates", "releases", "maps", "set-acc", "unmaps",
                                        "copies", "events", "ctx", "other", "syscalls" };

struct counting {
    kvvm *kv;
    int row;             /* the row being counted (its system call segment) */
    struct kvvm_testing_emu_calls c0;
    uint64_t tokens_per_page;
    void *stream;        /* the engine stream (kvvm_stream_create) */
};

/* Starts counting row r: the driver's counters read, then the system call segment opened
   (so reading them is not counted). */
static void mark_row(struct counting *k, int r)
{
    kvvm_testing_emu_calls(k->kv, &k->c0);
    k->row = r;
    bench_syscall_mark(r);
}
#define mark(k) mark_row((k), (k)->row)

/* The calls since mark() into r->v, divided by per (operations counted). */
static void take(struct counting *k, struct row *r, const char *op, double per)
{
    struct kvvm_testing_emu_calls c;
    bench_syscall_mark(-1);
    kvvm_testing_emu_calls(k->kv, &c);
    uint64_t total = 0, named;
    for (size_t i = 0; i < c.n; i++) {
        c.count[i] -= kvvm_testing_emu_count(&k->c0, c.name[i]);
        total += c.count[i];
    }
#define N(e) kvvm_testing_emu_count(&c, #e)
    uint64_t v[9] = {
        N(cuMemCreate), N(cuMemRelease), N(cuMemMap), N(cuMemSetAccess), N(cuMemUnmap),
        N(cuMemcpyHtoDAsync) + N(cuMemcpyDtoHAsync) + N(cuMemcpyDtoDAsync) + N(cuMemsetD8Async),
        N(cuEventRecord) + N(cuEventQuery) + N(cuEventSynchronize) + N(cuStreamWaitEvent),
        N(cuCtxGetCurrent) + N(cuCtxSetCurrent), 0
    };
#undef N
    named = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
    v[8] = total - named;
    snprintf(r->op, sizeof r->op, "%s", op);
    for (int i = 0; i < 9; i++)
        r->v[i] = (double)v[i] / per;
    r->v[9] = per;       /* the divisor, until the system calls are known */
    k->row++;
}

static int open_kv(size_t granule, struct counting *k, uint64_t tpp)
{
    size_t ps = granule ? granule : (2u << 20);
    struct kvvm_config c;
    bench_config(&c, KVVM_BACKEND_EMULATED, ps, ps, REGIONS, ps / tpp, DECODE_SEQS + 2,
                 4 * N_PAGES * tpp, (size_t)(DECODE_SEQS * 4 + 4 * N_PAGES) * REGIONS * ps);
    c.host_budget = (size_t)2 * N_PAGES * REGIONS * ps;
    c.map_ahead = 0;
    c.flags = 0;
    /* frames created on the calling thread, so each row's creates are that operation's own
       (the frame pool thread would create ahead at any moment; group frames measures it) */
    c.pool_thread = 0;
    int rc = kvvm_open(&c, &k->kv);
    if (rc)
        return rc;
    /* an engine stream, as an engine sets one: kvvm_step then records its fence there */
    void *st = NULL;
    if ((rc = kvvm_stream_create(k->kv, &st)) || (rc = kvvm_set_stream(k->kv, st))) {
        kvvm_close(k->kv);
        return rc;
    }
    k->stream = st;
    k->tokens_per_page = tpp;
    return 0;
}

/* grow by one page, by N, fork, COW write of one page and of a range, swap-out, swap-in,
   free. */
static int single_ops(struct counting *k, struct row *rows)
{
    kvvm_seq a, b, c;
    uint64_t tp = k->tokens_per_page;
    int rc = kvvm_seq_create(k->kv, &a);
    if (!rc)
        rc = kvvm_seq_create(k->kv, &c);
    if (rc)
        return rc;
    k->row = 0;
    mark(k);
    if ((rc = kvvm_seq_grow(k->kv, c, tp)))
        return rc;
    take(k, &rows[0], "grow by 1 page (new sequence)", 1);
    mark(k);
    if ((rc = kvvm_seq_grow(k->kv, a, N_PAGES * tp)))
        return rc;
    take(k, &rows[1], "grow by 16 pages (new sequence)", 1);
    mark(k);
    if ((rc = kvvm_seq_fork(k->kv, a, &b)))
        return rc;
    take(k, &rows[2], "fork of a 16-page sequence", 1);
    mark(k);
    if ((rc = kvvm_seq_prepare_write(k->kv, b, 0, 1)))
        return rc;
    take(k, &rows[3], "COW write (1 token on a shared page)", 1);
    mark(k);
    if ((rc = kvvm_seq_prepare_write(k->kv, b, tp, N_PAGES * tp)))
        return rc;
    take(k, &rows[4], "COW write of 15 shared pages (one call)", 1);
    if ((rc = kvvm_seq_free(k->kv, b)) || (rc = kvvm_sync(k->kv)))
        return rc;
    mark(k);
    if ((rc = kvvm_seq_swap_out(k->kv, a)) || (rc = kvvm_sync(k->kv)))
        return rc;
    take(k, &rows[5], "swap-out of 16 pages + kvvm_sync", 1);
    mark(k);
    if ((rc = kvvm_seq_swap_in(k->kv, a)) || (rc = kvvm_sync(k->kv)))
        return rc;
    take(k, &rows[6], "swap-in of 16 pages + kvvm_sync", 1);
    mark(k);
    if ((rc = kvvm_seq_free(k->kv, a)) || (rc = kvvm_sync(k->kv)))
        return rc;
    take(k, &rows[7], "free of a 16-page sequence + kvvm_sync", 1);
    return kvvm_seq_free(k->kv, c);
}

/* A decode step: every one of DECODE_SEQS sequences (each 1 token in) grows by one token
   (one grow_batch) and kvvm_step; averaged over one page's worth of steps, so each
   sequence crosses exactly one page boundary. */
static int decode_steps(struct counting *k, struct row *r)
{
    kvvm_seq s[DECODE_SEQS];
    uint64_t len[DECODE_SEQS];
    int rc = 0;
    for (int i = 0; i < DECODE_SEQS && !rc; i++) {
        len[i] = 1;
        rc = kvvm_seq_create(k->kv, &s[i]);
        if (!rc)
            rc = kvvm_seq_grow(k->kv, s[i], len[i]);
    }
    if (!rc)
        rc = kvvm_step(k->kv);
    mark(k);
    for (uint64_t t = 0; t < k->tokens_per_page && !rc; t++) {
        for (int i = 0; i < DECODE_SEQS; i++)
            len[i]++;
        rc = kvvm_seq_grow_batch(k->kv, s, len, DECODE_SEQS);
        if (!rc)
            rc = kvvm_step(k->kv);
    }
    if (!rc)
        take(k, r, "decode step: 8 seqs +1 token (grow_batch) + kvvm_step", (double)
             k->tokens_per_page);
    for (int i = 0; i < DECODE_SEQS; i++)
        kvvm_seq_free(k->kv, s[i]);
    return rc;
}

/* The hot path: 1000 grows of one token inside the last page, 1000 kvvm_step with nothing
   to do, 1000 kvvm_stats (what an engine calls per token or per step). The caller's context
   has 16 tokens per page: k here is one of 2048 tokens per page (open_kv's tpp argument). */
static int hot_ops(struct counting *k, struct row *rows)
{
    enum { N = 1000 };
    kvvm_seq s;
    int rc = kvvm_seq_create(k->kv, &s);
    if (!rc)
        rc = kvvm_seq_grow(k->kv, s, 1);
    if (!rc)
        rc = kvvm_step(k->kv);
    if (rc)
        return rc;
    mark(k);
    for (uint64_t i = 0; i < N && !rc; i++)      /* 2..1001 tokens: one page (see above) */
        rc = kvvm_seq_grow(k->kv, s, 2 + i);
    if (!rc)
        take(k, &rows[0], "grow +1 token in the last page (no new page)", N);
    mark(k);
    for (int i = 0; i < N && !rc; i++)
        rc = kvvm_step(k->kv);
    if (!rc)
        take(k, &rows[1], "kvvm_step, nothing to do", N);
    mark(k);
    for (int i = 0; i < N && !rc; i++) {
        struct kvvm_stats st = { .size = sizeof st };
        rc = kvvm_stats(k->kv, &st);
    }
    if (!rc)
        take(k, &rows[2], "kvvm_stats", N);
    if (!rc)
        rc = kvvm_seq_free(k->kv, s);
    return rc;
}

static void json_cell(struct bench_ctx *b, const char *op, const char *col, double v)
{
    if (!b->json)
        return;
    char name[160];
    snprintf(name, sizeof name, "%s: %s", op, col);
    fputs(b->n_json ? ",\n  {" : "\n  {", b->json);
    fputs("\"group\": ", b->json);
    tool_json_string(b->json, GROUP);
    fputs(", \"op\": ", b->json);
    tool_json_string(b->json, name);
    fprintf(b->json, ", \"value\": %.6g, \"unit\": \"calls\", \"baseline\": null, "
            "\"baseline_value\": null, \"ratio\": null}", v);
    b->n_json++;
}

static void print_rows(struct bench_ctx *b, const struct row *rows, int n, int traced)
{
    printf("%-8s driver calls per operation, counted by the emulated device (%d regions, "
           "page = granule, no map-ahead; bench_calls.c states the conditions); system calls "
           "of the calling thread, counted by tracing it (%s)\n", GROUP, REGIONS,
           traced ? "tools/kvvm-bench/syscount.c" : "tracing refused here: not counted");
    printf("%-8s %-56s", "", "operation");
    for (int i = 0; i < NCOL; i++)
        printf(" %8s", cols[i]);
    printf("\n");
    for (int r = 0; r < n; r++) {
        printf("%-8s %-56s", GROUP, rows[r].op);
        for (int i = 0; i < NCOL; i++) {
            if (i == 9 && !traced) {
                printf(" %8s", "-");
                continue;
            }
            printf(rows[r].v[i] == (double)(uint64_t)rows[r].v[i] ? " %8.0f" : " %8.2f",
                   rows[r].v[i]);
            json_cell(b, rows[r].op, cols[i], rows[r].v[i]);
        }
        printf("\n");
    }
    fflush(stdout);
}

struct calls_run {
    size_t granule;      /* --granule */
    struct row rows[NROWS];
    int n;               /* rows filled */
};

/* Every row, in a context of its own (run here, or in the traced helper: bench_calls_traced). */
static int calls_all(void *arg)
{
    struct calls_run *cr = arg;
    struct counting k = { 0 }, h = { 0 };
    int rc = open_kv(cr->granule, &k, 16);
    if (rc)
        return rc;
    if (kvvm_testing_emu_calls(k.kv, &k.c0) == -ENODEV) {
        kvvm_close(k.kv);
        return -ENODEV;
    }
    rc = single_ops(&k, cr->rows);
    if (!rc)
        rc = decode_steps(&k, &cr->rows[8]);
    kvvm_set_stream(k.kv, NULL);
    kvvm_stream_destroy(k.kv, k.stream);
    kvvm_close(k.kv);
    if (!rc)
        rc = open_kv(cr->granule, &h, 2048);
    if (rc)
        return rc;
    h.row = 9;
    rc = hot_ops(&h, &cr->rows[9]);
    if (!rc)
        cr->n = NROWS;
    kvvm_set_stream(h.kv, NULL);
    kvvm_stream_destroy(h.kv, h.stream);
    kvvm_close(h.kv);
    return rc;
}

/* The traced helper (role calls): arg is the struct calls_run, whose rows it fills. */
int bench_calls_traced(void *arg, const int *fds, int n_fds)
{
    (void)fds;
    (void)n_fds;
    return calls_all(arg);
}

int bench_calls(struct bench_ctx *b)
{
    struct bench_shm arg;               /* shared with the traced helper, which fills the rows */
    int rc = bench_shm_new(&arg, sizeof(struct calls_run));
    if (rc)
        return rc;
    struct calls_run *cr = arg.p;
    cr->granule = b->granule;
    uint64_t sys[NROWS];
    int traced = 1;
    rc = bench_syscalls("calls", &arg, sys, NROWS);
    if (rc == -EPERM || rc == -ECHILD) {
        traced = 0;                     /* no tracing here: the driver calls alone */
        memset(cr, 0, sizeof *cr);
        cr->granule = b->granule;
        rc = calls_all(cr);
    }
    if (rc == -ENODEV || rc == ENODEV)
        printf("%-8s skipped: the context is not on the emulated device\n", GROUP);
    else if (!rc) {
        for (int r = 0; traced && r < cr->n; r++)
            cr->rows[r].v[9] = (double)sys[r] / cr->rows[r].v[9];
        print_rows(b, cr->rows, cr->n, traced);
    }
    bench_shm_free(&arg);
    return rc == -ENODEV ? 0 : rc;
}
