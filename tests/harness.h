/*
 * tests/harness.h: the helpers the Criterion tests share. It includes criterion.h, kvvm.h,
 * core/debug.h and vmm/emu/emu.h itself; a test includes it before its own definitions.
 *
 *   - KB (the tests' 4 KiB granule and page), soft mode and UCHK (a state check that, in
 *     a fault sweep, reports and counts instead of ending the test);
 *   - the content cookie (tests/cookie.h, shared with the plain threaded programs);
 *   - emu_ctx_on / emu_ctx_off: the device's primary context current around a test's own
 *     calls of the emulated driver (kvvm calls leave the caller's current context alone);
 *   - th_config: an emulated, opaque context of small pages (pool_decay_ms 0); th_open / th_check /
 *     th_stats / th_info / th_close on a kvvm *, and the same on a struct tctx (topen,
 *     tcheck, tstats, tinfo, tclose; topen_stream / tclose_stream: in stream mode);
 *   - th_dir_entries: the entries of a spill directory;
 *   - TH_DEADLINE: a test's hang guard (instead of Criterion's .timeout, which leaks);
 *   - th_sweep_run: the fail-at-call-N sweep (trace an operation's driver calls once, then
 *     fail each of them with each of the errors given, checking after each through
 *     callbacks);
 *   - with KVVM_HARNESS_SHADOW defined before the include: the per-sequence shadow of
 *     test_paging.c and test_core.c (struct sh: the bytes each region must read back,
 *     snapshots, expect_unchanged: "a failed call changes nothing").
 *
 * Everything here is static inline or marked unused, so a test that uses a part only
 * stays warning-free under -Werror.
 */
#ifndef KVVM_TESTS_HARNESS_H
#define KVVM_TESTS_HARNESS_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvvm.h"
#include "testing/kvvm_testing.h"
#include "vmm/emu/emu.h"
#include "cookie.h"
#include <unistd.h>

/* A test's hang guard: its worker dies by SIGALRM after `seconds` and Criterion reports the
   crash. Never Criterion's `.timeout`: its watchdog (BoxFort's timeout-posix.c, built into
   libcriterion) now and then leaves its 48-byte request unreachable, and LeakSanitizer then
   fails the whole binary after the synthesis (issue 25: test_classes under clang ASan, 3 runs
   in 8). tests/CMakeLists.txt refuses `.timeout =` in a test source. */
#define TH_DEADLINE(seconds) ((void)alarm(seconds))

#define KB 4096u    /* the tests' emulated granule and page */

/* ---------------------------------------------------------------- soft mode */

/* Soft mode (the fail-at-call-N sweeps): state checks report and count failures instead of
   ending the test, so one run lists every injection point that breaks a rule. */
static bool soft __attribute__((unused));
static int soft_failures __attribute__((unused));
#define UCHK(cond, ...) do {                                        \
        if (cond) break;                                            \
        if (soft) { soft_failures++; cr_expect_fail(__VA_ARGS__); } \
        else cr_assert_fail(__VA_ARGS__);                           \
    } while (0)

/* ---------------------------------------------------------------- emulator context */

/* Makes device ord's primary context current in the calling thread (for a test's own calls
   of the emulated driver's entry points); emu_ctx_off undoes it. */
static inline void emu_ctx_on(int ord)
{
    const struct kcu_api *a = emu_api();
    kcu_device d;
    kcu_context c;
    cr_assert_eq(a->cuDeviceGet(&d, ord), KCU_SUCCESS);
    cr_assert_eq(a->cuDevicePrimaryCtxRetain(&c, d), KCU_SUCCESS);
    cr_assert_eq(a->cuCtxSetCurrent(c), KCU_SUCCESS);
}

static inline void emu_ctx_off(int ord)
{
    const struct kcu_api *a = emu_api();
    kcu_device d;
    cr_assert_eq(a->cuDeviceGet(&d, ord), KCU_SUCCESS);
    cr_assert_eq(a->cuCtxSetCurrent(NULL), KCU_SUCCESS);
    cr_assert_eq(a->cuDevicePrimaryCtxRelease(d), KCU_SUCCESS);
}

/* The driver calls counted on device ord since its counters' reset (emu_calls_reset), each
   in *k; returns their sum. */
static inline uint64_t th_driver_calls(int ord, struct emu_calls *k)
{
    uint64_t total = 0;
    cr_assert_eq(emu_calls_get(ord, k), 0);
#define TH_CALLS_ADD(e) total += k->e;
    EMU_ENTRIES(TH_CALLS_ADD)
#undef TH_CALLS_ADD
    return total;
}

/* ---------------------------------------------------------------- contexts */

/* The emulated backend in opaque mode, granule = page = ps: nr regions of bpt-byte tokens,
   max_seqs sequences of up to max_tokens, dev_pages device and host_pages host pages, no
   spill directory. Other fields keep kvvm_config_init's values (and KVVM_* overrides). */
static inline void th_config(struct kvvm_config *c, size_t ps, uint32_t nr, uint64_t bpt,
                             uint32_t max_seqs, uint64_t max_tokens, uint64_t dev_pages,
                             uint64_t host_pages, unsigned flags)
{
    kvvm_config_init(c);
    c->backend = KVVM_BACKEND_EMULATED;
    c->emu_granule = ps;
    c->page_size = ps;
    c->n_regions = nr;
    c->bytes_per_token = bpt;
    c->max_seqs = max_seqs;
    c->max_tokens = max_tokens;
    c->device_budget = (size_t)(dev_pages * ps);
    c->host_budget = (size_t)(host_pages * ps);
    c->spill_dir = NULL;
    c->flags = flags;
    c->emu_opaque = 1;
    c->pool_decay_ms = 0;         /* the pool thread releases at rounds only: no timed round
                                     between a test's reads or in a sweep (the decay tests
                                     of test_elastic set their own) */
}

/* Opens a context of configuration c (any backend). */
static inline kvvm *th_open(const struct kvvm_config *c)
{
    kvvm *kv = NULL;
    int rc = kvvm_open(c, &kv);
    cr_assert_eq(rc, 0, "kvvm_open: %d (%s)", rc, kvvm_strerror(rc));
    return kv;
}

/* The invariant checker (kvvm_debug_check); a soft failure in soft mode. */
static inline void th_check(kvvm *kv, const char *where)
{
    char why[512] = "";
    int rc = kvvm_debug_check(kv, why, sizeof why);
    UCHK(rc == 0, "%s: invariant violated (%d): %s", where, rc, why);
}

static inline void th_stats(kvvm *kv, struct kvvm_stats *st)
{
    memset(st, 0, sizeof *st);
    st->size = sizeof *st;
    int rc = kvvm_stats(kv, st);
    cr_assert_eq(rc, 0, "kvvm_stats: %d", rc);
}

static inline void th_info(kvvm *kv, kvvm_seq s, struct kvvm_seq_info *in)
{
    memset(in, 0, sizeof *in);
    in->size = sizeof *in;
    int rc = kvvm_seq_info(kv, s, in);
    cr_assert_eq(rc, 0, "kvvm_seq_info: %d", rc);
}

/* Closes kv; on emulated device ord (none: ord < 0) nothing may be left behind. */
static inline void th_close(kvvm *kv, int ord)
{
    kvvm_close(kv);
    struct emu_counters ec;
    if (ord >= 0 && emu_counters_get(ord, &ec) == 0)
        cr_expect(ec.handles == 0 && ec.mappings == 0 && ec.reservations == 0 &&
                  ec.streams == 0 && ec.events == 0,
                  "kvvm_close left handles %lu mappings %lu reservations %lu streams %lu "
                  "events %lu", (unsigned long)ec.handles, (unsigned long)ec.mappings,
                  (unsigned long)ec.reservations, (unsigned long)ec.streams,
                  (unsigned long)ec.events);
}

/* Where a sequence is: what a failed call must leave as it was for every other sequence
   (docs/api.md: "no other sequence moved"), and what a call that moved some may be
   checked against. */
struct th_place {
    uint64_t length;
    uint32_t dev, host, disk;
    int resident, dropped, cls;
};

static inline void th_places(kvvm *kv, const kvvm_seq *s, int n, struct th_place *out)
{
    for (int i = 0; i < n; i++) {
        struct kvvm_seq_info in;
        th_info(kv, s[i], &in);
        out[i] = (struct th_place){ in.length, in.pages_device, in.pages_host, in.pages_disk,
                                    in.resident, in.dropped, (int)in.cls };
    }
}

/* Every sequence of s[0..n) is where a[] says (tiers, residency, class, dropped, length). */
static inline void th_places_same(kvvm *kv, const kvvm_seq *s, int n,
                                  const struct th_place *a, const char *where)
{
    struct th_place b;
    for (int i = 0; i < n; i++) {
        th_places(kv, &s[i], 1, &b);
        cr_expect(!memcmp(&a[i], &b, sizeof b), "%s: sequence %d moved: length %llu -> %llu, "
                  "device %u -> %u, host %u -> %u, disk %u -> %u, resident %d -> %d, "
                  "dropped %d -> %d, class %d -> %d", where, i,
                  (unsigned long long)a[i].length, (unsigned long long)b.length, a[i].dev,
                  b.dev, a[i].host, b.host, a[i].disk, b.disk, a[i].resident, b.resident,
                  a[i].dropped, b.dropped, a[i].cls, b.cls);
    }
}

/* A context with its configuration and emulated device ordinal. */
struct tctx {
    kvvm *kv;
    struct kvvm_config cfg;
    int ord;            /* emulated device ordinal */
    uint64_t cap;       /* bytes per region of a full sequence */
};

static inline void topen(struct tctx *t, const struct kvvm_config *c)
{
    memset(t, 0, sizeof *t);
    t->cfg = *c;
    int rc = kvvm_open(c, &t->kv);
    cr_assert_eq(rc, 0, "kvvm_open: %d (%s)", rc, kvvm_strerror(rc));
    t->ord = kvvm_debug_emu_ordinal(t->kv);
    cr_assert_geq(t->ord, 0, "no emulated device ordinal");
    cr_assert_str_eq(kvvm_backend_name(t->kv), "emulated");
    t->cap = c->max_tokens * c->bytes_per_token;
}

static inline void tcheck(struct tctx *t, const char *where) { th_check(t->kv, where); }
static inline void tstats(struct tctx *t, struct kvvm_stats *st) { th_stats(t->kv, st); }
static inline void tinfo(struct tctx *t, kvvm_seq s, struct kvvm_seq_info *in)
{
    th_info(t->kv, s, in);
}

static inline void tclose(struct tctx *t)
{
    th_close(t->kv, t->ord);
    t->kv = NULL;
}

/* Opens a stream-mode context (the engine stream in *stream). */
static inline void topen_stream(struct tctx *t, const struct kvvm_config *c, void **stream)
{
    topen(t, c);
    cr_assert_eq(kvvm_stream_create(t->kv, stream), 0);
    cr_assert_eq(kvvm_set_stream(t->kv, *stream), 0);
}

/* Ends a stream-mode test: back to synchronous mode, the stream destroyed, context closed. */
static inline void tclose_stream(struct tctx *t, void *stream)
{
    cr_assert_eq(kvvm_set_stream(t->kv, NULL), 0);
    cr_assert_eq(kvvm_stream_destroy(t->kv, stream), 0);
    tclose(t);
}

/* ---------------------------------------------------------------- files */

/* Entries of directory d other than . and .. (-1: it cannot be opened). */
static inline int th_dir_entries(const char *d)
{
    DIR *dd = opendir(d);
    if (!dd)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dd)))
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(dd);
    return n;
}

/* ---------------------------------------------------------------- fail-at-call-N sweep */

/* What an injected failure did to the operation (th_sweep's after callback says). */
enum th_sweep_outcome {
    TH_SWEEP_FAILED,        /* the operation failed (after checked that nothing changed) */
    TH_SWEEP_ABSORBED,      /* it succeeded anyway (a retry or a fallback) */
    TH_SWEEP_DEAD,          /* a sticky failure: the context is dead, nothing to check */
};

/* One operation to sweep. setup builds the same starting state every time, call runs the
   operation, teardown ends it; before (may be NULL) snapshots the state just before the
   armed call, after checks the state once the armed call returned rc (where names the
   point: "name: entry #nth -> error (returned rc)") with UCHK, and says what happened.
   errs/n_errs: the errors each point is failed with (none given: KCU_ERROR_OUT_OF_MEMORY,
   then KCU_ERROR_INVALID_VALUE). enter and leave (may be NULL) run just before and after the
   call, outside the tracing and the injection (a test that calls an internal entry point
   takes the context's lock and makes its device context current there). after also checks
   the traced run (where: "name: traced run"); its outcome is not counted. */
struct th_sweep {
    const char *name;
    void *arg;
    void (*setup)(void *arg);
    int (*call)(void *arg);
    void (*teardown)(void *arg);
    void (*before)(void *arg);
    enum th_sweep_outcome (*after)(void *arg, int rc, const char *where);
    const kcu_result *errs;
    int n_errs;
    void (*enter)(void *arg);
    void (*leave)(void *arg);
};

/* What a sweep visited: points are the traced driver calls, each failed with each error. */
struct th_sweep_count {
    size_t points;
    unsigned failed, absorbed, dead, broken;
};

/* Traces the driver calls of one run of the operation, then fails each in turn (its nth
   call of that entry point) with each error of sw->errs, in soft mode: every point whose
   checks failed is printed (BROKEN) and counted. Prints the counts and returns them; the
   test fails where any check did. */
static inline struct th_sweep_count th_sweep_run(const struct th_sweep *sw)
{
    enum { MAXT = 4096 };
    static struct emu_trace_entry tr[MAXT];
    struct th_sweep_count n = { 0 };
    char w[192];
    sw->setup(sw->arg);
    if (sw->enter)
        sw->enter(sw->arg);
    emu_trace_start();
    int rc = sw->call(sw->arg);
    n.points = emu_trace_stop(tr, MAXT);
    if (sw->leave)
        sw->leave(sw->arg);
    cr_assert_eq(rc, 0, "%s: the traced call failed: %d (%s)", sw->name, rc,
                 kvvm_last_error());
    cr_assert_gt(n.points, 0, "%s: no driver call traced", sw->name);
    cr_assert_leq(n.points, MAXT);
    snprintf(w, sizeof w, "%s: traced run", sw->name);
    sw->after(sw->arg, rc, w);
    sw->teardown(sw->arg);

    static const kcu_result both[2] = { KCU_ERROR_OUT_OF_MEMORY, KCU_ERROR_INVALID_VALUE };
    const kcu_result *errs = sw->n_errs ? sw->errs : both;
    int n_errs = sw->n_errs ? sw->n_errs : 2;
    soft = true;
    for (size_t i = 0; i < n.points; i++) {
        for (int e = 0; e < n_errs; e++) {
            snprintf(w, sizeof w, "%s: %s #%lu -> %d", sw->name, tr[i].entry, tr[i].nth,
                     errs[e]);
            sw->setup(sw->arg);
            if (sw->before)
                sw->before(sw->arg);
            int was = soft_failures;
            if (sw->enter)
                sw->enter(sw->arg);
            cr_assert_eq(emu_fail_arm(tr[i].entry, tr[i].nth, errs[e]), 0, "%s: arm", w);
            rc = sw->call(sw->arg);
            emu_fail_clear();
            if (sw->leave)
                sw->leave(sw->arg);
            snprintf(w + strlen(w), sizeof w - strlen(w), " (returned %d)", rc);
            switch (sw->after(sw->arg, rc, w)) {
            case TH_SWEEP_FAILED: n.failed++; break;
            case TH_SWEEP_DEAD: n.failed++; n.dead++; break;
            case TH_SWEEP_ABSORBED:
                n.absorbed++;
                printf("sweep %s: absorbed %s #%lu -> %d\n", sw->name, tr[i].entry,
                       tr[i].nth, errs[e]);
                break;
            }
            if (soft_failures != was) {
                n.broken++;
                printf("sweep %s: BROKEN at %s\n", sw->name, w);
            }
            sw->teardown(sw->arg);
        }
    }
    soft = false;
    printf("sweep %s: %zu injection points x %d errors: %u failed (%u of them dead: a sticky "
           "failure), %u absorbed, %u broke a rule\n", sw->name, n.points, n_errs, n.failed,
           n.dead, n.absorbed, n.broken);
    fflush(stdout);
    cr_assert_eq(n.broken, 0, "%s: %u injection points broke a rule", sw->name, n.broken);
    return n;
}

/* ---------------------------------------------------------------- the failed-call rule */

/* "A failed call changes nothing" (docs/api.md), as the sweeps of driver refusals check it:
   a snapshot of the sequences a test names (length, residency, pages per tier, class,
   dropped state) and of the prefix entries of keys[0..n_keys) in namespace ns (how many of
   the chain are present, and each one's tier). */
#define TH_SNAP_SEQS 16
#define TH_SNAP_KEYS 16
struct th_snap {
    size_t n;
    kvvm_seq h[TH_SNAP_SEQS];
    struct kvvm_seq_info in[TH_SNAP_SEQS];
    uint64_t ns;
    const kvvm_key *keys;
    size_t n_keys;
    int found;
    uint8_t where[TH_SNAP_KEYS];
};

/* Takes the snapshot of seqs[0..n) and of the entries keys[0..n_keys) under ns (keys NULL:
   no entries); the key array must outlive the snapshot. */
static inline void th_snap_take(kvvm *kv, struct th_snap *sn, const kvvm_seq *seqs, size_t n,
                                uint64_t ns, const kvvm_key *keys, size_t n_keys)
{
    cr_assert_leq(n, TH_SNAP_SEQS);
    cr_assert_leq(n_keys, TH_SNAP_KEYS);
    memset(sn, 0, sizeof *sn);
    sn->n = n;
    for (size_t i = 0; i < n; i++) {
        sn->h[i] = seqs[i];
        th_info(kv, seqs[i], &sn->in[i]);
    }
    sn->ns = ns;
    sn->keys = keys;
    sn->n_keys = keys ? n_keys : 0;
    if (sn->n_keys)
        sn->found = kvvm_prefix_lookup(kv, ns, keys, n_keys, sn->where);
}

/* UCHK that everything of sn is as it was. */
static inline void th_snap_same(kvvm *kv, const struct th_snap *sn, const char *where)
{
    for (size_t i = 0; i < sn->n; i++) {
        struct kvvm_seq_info in;
        const struct kvvm_seq_info *a = &sn->in[i];
        th_info(kv, sn->h[i], &in);
        UCHK(in.length == a->length && in.resident == a->resident &&
             in.pages_device == a->pages_device && in.pages_host == a->pages_host &&
             in.pages_disk == a->pages_disk && in.dropped == a->dropped && in.cls == a->cls,
             "%s: sequence %zu changed: length %lu -> %lu, resident %d -> %d, pages "
             "device/host/disk %u/%u/%u -> %u/%u/%u, dropped %d -> %d, class %u -> %u", where,
             i, (unsigned long)a->length, (unsigned long)in.length, a->resident, in.resident,
             a->pages_device, a->pages_host, a->pages_disk, in.pages_device, in.pages_host,
             in.pages_disk, a->dropped, in.dropped, a->cls, in.cls);
    }
    if (sn->n_keys) {
        uint8_t w[TH_SNAP_KEYS] = { 0 };
        int found = kvvm_prefix_lookup(kv, sn->ns, sn->keys, sn->n_keys, w);
        UCHK(found == sn->found, "%s: %d prefix entries present, were %d", where, found,
             sn->found);
        for (int i = 0; i < found && i < sn->found; i++)
            UCHK(w[i] == sn->where[i], "%s: prefix entry %d moved (tier %u, was %u)", where,
                 i, w[i], sn->where[i]);
    }
}

/* Driver refusals, one at a time: for each entry point of entries[0..n) and nth = 1, 2, ...
   until the refusal no longer fires within the call (traced): setup, arm
   (CUDA_ERROR_OUT_OF_MEMORY at its nth call), call, after (as th_sweep's: checks with UCHK,
   says what happened), teardown. Soft mode; prints and returns the counts; the test fails
   where a check did or where no refusal fired. A failed call changes nothing whichever
   entry point the driver refused (docs/api.md, Conventions): what a call creates (frames,
   events, streams: th_create_entries) is acquired before it moves anything, and a map,
   set-access, copy or synchronization refused after its reclaim moved others has those
   moves taken back (th_use_entries). */
static const char *const th_create_entries[] = { "cuMemCreate", "cuEventCreate",
                                                 "cuStreamCreate" };
static const char *const th_use_entries[] = {
    "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync",
    "cuMemcpyDtoDAsync", "cuMemsetD8Async", "cuStreamSynchronize", "cuCtxSynchronize",
    "cuEventRecord", "cuEventQuery", "cuEventSynchronize", "cuStreamWaitEvent",
};
static inline struct th_sweep_count th_refusals_run_on(const struct th_sweep *sw,
                                                       const char *const *entries,
                                                       size_t n_entries)
{
    enum { MAXT = 4096 };
    static struct emu_trace_entry tr[MAXT];
    struct th_sweep_count n = { 0 };
    char w[192];
    soft = true;
    for (size_t e = 0; e < n_entries; e++) {
        const char *entry = entries[e];
        for (unsigned long nth = 1;; nth++) {
            snprintf(w, sizeof w, "%s: %s #%lu refused", sw->name, entry, nth);
            sw->setup(sw->arg);
            if (sw->before)
                sw->before(sw->arg);
            int was = soft_failures;
            emu_trace_start();
            cr_assert_eq(emu_fail_arm(entry, nth, KCU_ERROR_OUT_OF_MEMORY), 0, "%s: arm", w);
            int rc = sw->call(sw->arg);
            emu_fail_clear();
            size_t k = emu_trace_stop(tr, MAXT), seen = 0;
            for (size_t i = 0; i < k && i < MAXT; i++)
                seen += !strcmp(tr[i].entry, entry);
            if (seen < nth) {           /* past its last call: nothing refused */
                sw->teardown(sw->arg);
                break;
            }
            n.points++;
            snprintf(w + strlen(w), sizeof w - strlen(w), " (returned %d)", rc);
            switch (sw->after(sw->arg, rc, w)) {
            case TH_SWEEP_FAILED: n.failed++; break;
            case TH_SWEEP_DEAD: n.failed++; n.dead++; break;
            case TH_SWEEP_ABSORBED: n.absorbed++; break;
            }
            if (soft_failures != was) {
                n.broken++;
                printf("refusals %s: BROKEN at %s\n", sw->name, w);
            }
            sw->teardown(sw->arg);
        }
    }
    soft = false;
    printf("refusals %s: %zu refused calls of %zu entry points (%s ...): %u failed, %u "
           "absorbed, %u broke a rule\n", sw->name, n.points, n_entries, entries[0], n.failed,
           n.absorbed, n.broken);
    fflush(stdout);
    cr_assert_gt(n.points, 0, "%s: no refusal fired within the call", sw->name);
    cr_assert_eq(n.broken, 0, "%s: %u refused calls broke a rule", sw->name, n.broken);
    return n;
}

/* th_refusals_run_on the entry points that create what a call needs. */
static inline struct th_sweep_count th_refusals_run(const struct th_sweep *sw)
{
    return th_refusals_run_on(sw, th_create_entries,
                              sizeof th_create_entries / sizeof *th_create_entries);
}

/* th_refusals_run_on the entry points that act on what exists (maps, copies, syncs). */
static inline struct th_sweep_count th_refusals_run_use(const struct th_sweep *sw)
{
    return th_refusals_run_on(sw, th_use_entries,
                              sizeof th_use_entries / sizeof *th_use_entries);
}

/* ---------------------------------------------------------------- shadows */
#ifdef KVVM_HARNESS_SHADOW
/* The shadow harness of the context and paging tests (test_core.c, test_paging.c): small
   granules (4 KiB unless a test says otherwise), a "shadow" per sequence that holds the bytes
   each region must read back; cookies are derived from (lineage, region, token, byte
   offset), so a write that leaks into a sharer shows as a mismatch. */
#include <unistd.h>

#define MAXR 8      /* regions a test uses at most */
#define MAXS 64     /* sequences a snapshot holds at most */
#define KB 4096u

/* Byte at offset off of region r written by lineage lin (bpt fixes the token). Never 0, so
   zero-fill checks cannot pass on cookie bytes. */
static inline uint8_t tok_cookie(uint32_t lin, uint32_t r, uint64_t bpt, uint64_t off)
{
    uint64_t tok = off / bpt;
    uint64_t x = mix64(((uint64_t)lin << 40) ^ ((uint64_t)r << 32) ^ (tok << 12) ^
                       mix64(off >> 3));
    uint8_t b = (uint8_t)(x >> (8 * (off & 7)));
    return b ? b : 1;
}

static inline void cookie_fill(uint8_t *dst, uint32_t lin, uint32_t r, uint64_t bpt, uint64_t off,
                        size_t len)
{
    for (size_t i = 0; i < len; i++)
        dst[i] = tok_cookie(lin, r, bpt, off + i);
}

/* An emulated context of ps-byte pages, `pages` device pages, nothing else. */
static inline void tcfg(struct kvvm_config *c, size_t ps, uint32_t nr, uint64_t bpt,
                 uint32_t max_seqs, uint64_t max_tokens, uint64_t pages)
{
    th_config(c, ps, nr, bpt, max_seqs, max_tokens, pages, 0, 0);
    c->emu_device_bytes = 0;
    c->spill_budget = 0;
    c->map_ahead = 0;
}

struct sh {
    kvvm_seq h;
    uint64_t len;
    uint8_t *exp[MAXR];     /* expected bytes per region, cap bytes each */
};

static inline void sh_init(struct tctx *t, struct sh *s)
{
    memset(s, 0, sizeof *s);
    for (uint32_t r = 0; r < t->cfg.n_regions; r++) {
        s->exp[r] = calloc(1, t->cap);
        cr_assert(s->exp[r]);
    }
}

static inline void sh_release(struct sh *s)
{
    for (int r = 0; r < MAXR; r++)
        free(s->exp[r]);
    memset(s, 0, sizeof *s);
}

static inline void sh_create(struct tctx *t, struct sh *s)
{
    sh_init(t, s);
    int rc = kvvm_seq_create(t->kv, &s->h);
    cr_assert_eq(rc, 0, "kvvm_seq_create: %d", rc);
    cr_assert_neq(s->h, 0, "handle 0 returned");
}

static inline void sh_grow(struct tctx *t, struct sh *s, uint64_t len)
{
    int rc = kvvm_seq_grow(t->kv, s->h, len);
    cr_assert_eq(rc, 0, "kvvm_seq_grow(%lu): %d", (unsigned long)len, rc);
    s->len = len;
}

/* In stream mode a write's copy may run after the call returned: its source buffer is kept
   until the test has synchronized (keep_flush). */
static bool keep_bufs __attribute__((unused));
static void *kept[256] __attribute__((unused));
static int nkept __attribute__((unused));

static inline void keep_flush(void)
{
    for (int i = 0; i < nkept; i++)
        free(kept[i]);
    nkept = 0;
}

static inline void sh_write(struct tctx *t, struct sh *s, uint32_t r, uint64_t off, size_t len,
                     uint32_t lin)
{
    uint8_t *buf = malloc(len);
    cr_assert(buf);
    cookie_fill(buf, lin, r, t->cfg.bytes_per_token, off, len);
    int rc = kvvm_seq_write(t->kv, s->h, r, off, buf, len);
    cr_assert_eq(rc, 0, "kvvm_seq_write(r%u, %lu+%zu): %d", r, (unsigned long)off, len, rc);
    memcpy(s->exp[r] + off, buf, len);
    if (keep_bufs && nkept < 256)
        kept[nkept++] = buf;
    else
        free(buf);
}

/* Writes tokens [first, end) of every region with lineage lin. */
static inline void sh_fill(struct tctx *t, struct sh *s, uint64_t first, uint64_t end,
                           uint32_t lin)
{
    uint64_t bpt = t->cfg.bytes_per_token;
    if (end <= first)
        return;
    for (uint32_t r = 0; r < t->cfg.n_regions; r++)
        sh_write(t, s, r, first * bpt, (end - first) * bpt, lin);
}

static inline void sh_grow_fill(struct tctx *t, struct sh *s, uint64_t len, uint32_t lin)
{
    uint64_t old = s->len;
    sh_grow(t, s, len);
    sh_fill(t, s, old, len, lin);
}

static inline void sh_verify(struct tctx *t, struct sh *s, const char *where)
{
    uint64_t n = s->len * t->cfg.bytes_per_token;
    if (!n)
        return;
    uint8_t *buf = malloc(n);
    cr_assert(buf);
    for (uint32_t r = 0; r < t->cfg.n_regions; r++) {
        memset(buf, 0x5a, n);
        int rc = kvvm_seq_read(t->kv, s->h, r, 0, buf, n);
        cr_assert_eq(rc, 0, "%s: kvvm_seq_read(r%u, 0+%lu): %d", where, r,
                     (unsigned long)n, rc);
        if (memcmp(buf, s->exp[r], n)) {
            uint64_t i = 0;
            while (buf[i] == s->exp[r][i])
                i++;
            UCHK(0, "%s: seq %#lx region %u byte %lu (token %lu, page %lu) reads "
                           "%#x, expected %#x", where, (unsigned long)s->h, r,
                           (unsigned long)i, (unsigned long)(i / t->cfg.bytes_per_token),
                           (unsigned long)(i / t->cfg.page_size), buf[i], s->exp[r][i]);
        }
    }
    free(buf);
}

static inline void sh_fork(struct tctx *t, struct sh *parent, struct sh *child)
{
    sh_init(t, child);
    int rc = kvvm_seq_fork(t->kv, parent->h, &child->h);
    cr_assert_eq(rc, 0, "kvvm_seq_fork: %d", rc);
    child->len = parent->len;
    for (uint32_t r = 0; r < t->cfg.n_regions; r++)
        memcpy(child->exp[r], parent->exp[r], t->cap);
}

static inline void sh_share(struct tctx *t, struct sh *dst, struct sh *src, uint64_t n)
{
    int rc = kvvm_seq_share(t->kv, dst->h, src->h, n);
    cr_assert_eq(rc, 0, "kvvm_seq_share(%lu): %d", (unsigned long)n, rc);
    dst->len = n;
    for (uint32_t r = 0; r < t->cfg.n_regions; r++)
        memcpy(dst->exp[r], src->exp[r], n * t->cfg.bytes_per_token);
}

static inline void sh_free(struct tctx *t, struct sh *s)
{
    int rc = kvvm_seq_free(t->kv, s->h);
    cr_assert_eq(rc, 0, "kvvm_seq_free: %d", rc);
    sh_release(s);
}

/* ---------------------------------------------------------------- snapshots */

struct snap {
    struct kvvm_stats st;
    int n;
    struct kvvm_seq_info in[MAXS];
    struct emu_counters ec;
};

static inline void snap_take(struct tctx *t, struct snap *sn, struct sh **ss, int n)
{
    memset(sn, 0, sizeof *sn);
    tstats(t, &sn->st);
    sn->n = n;
    for (int i = 0; i < n; i++)
        tinfo(t, ss[i]->h, &sn->in[i]);
    cr_assert_eq(emu_counters_get(t->ord, &sn->ec), 0);
}

/* A failed call changes nothing: gauges, every sequence's info, the emulator's live
   mappings and handles, the invariants, and every sequence's bytes. */
static inline void expect_unchanged(struct tctx *t, const struct snap *a, struct sh **ss, int n,
                             const char *where)
{
    struct snap b;
    char why[512] = "";
    int rc = kvvm_debug_check(t->kv, why, sizeof why);
    UCHK(rc == 0, "%s: invariant violated (%d): %s", where, rc, why);
    snap_take(t, &b, ss, n);
#define SAME(f) UCHK(a->st.f == b.st.f, "%s: stats." #f " changed %lu -> %lu", where, \
                     (unsigned long)a->st.f, (unsigned long)b.st.f)
    SAME(page_size); SAME(pages_device_total); SAME(pages_device_free);
    SAME(pages_host_total); SAME(pages_host_free); SAME(pages_disk_total);
    SAME(pages_disk_free); SAME(pages_inflight);
#undef SAME
    for (int i = 0; i < n; i++) {
        const struct kvvm_seq_info *x = &a->in[i], *y = &b.in[i];
#define SAMEI(f) UCHK(x->f == y->f, "%s: seq %d info." #f " changed %lu -> %lu", \
                      where, i, (unsigned long)x->f, (unsigned long)y->f)
        SAMEI(length); SAMEI(slot); SAMEI(pages_device); SAMEI(pages_host);
        SAMEI(pages_disk); SAMEI(pages_shared); SAMEI(resident);
#undef SAMEI
    }
    UCHK(a->ec.mappings == b.ec.mappings, "%s: emulator mappings %lu -> %lu", where,
         (unsigned long)a->ec.mappings, (unsigned long)b.ec.mappings);
    /* Physical handles: the pool may create frames ahead of need and keep them for reuse
       (never more than the budget); kvvm_debug_check above proved the emulator's live
       handles are exactly the pool's, so a new one here is pooled, not leaked. */
    UCHK(b.ec.handles <= t->cfg.device_budget / t->cfg.page_size,
         "%s: emulator handles %lu -> %lu, past the budget", where,
         (unsigned long)a->ec.handles, (unsigned long)b.ec.handles);
    for (int i = 0; i < n; i++)
        sh_verify(t, ss[i], where);
}

/* Pages a length covers in one region. */
static inline uint64_t pages_for(struct tctx *t, uint64_t len)
{
    uint64_t b = len * t->cfg.bytes_per_token, ps = t->cfg.page_size;
    return (b + ps - 1) / ps;
}

/* The common small context of the error tests: 4 KiB pages, 2 regions, tokens of 1000 bytes
   (they straddle pages), 4 slots, 40 tokens (10 pages per region), 12 pages. */
static inline void open_small(struct tctx *t)
{
    struct kvvm_config c;
    tcfg(&c, KB, 2, 1000, 4, 40, 12);
    topen(t, &c);
}

/* Writes the bytes of page pi (within the sequence's length) in every region. With prep,
   prepare_write over the tokens covering those bytes first. */
static inline void write_page(struct tctx *t, struct sh *s, uint64_t pi, uint32_t lin, bool prep)
{
    uint64_t ps = t->cfg.page_size, bpt = t->cfg.bytes_per_token, end = s->len * bpt;
    uint64_t b0 = pi * ps, b1 = (pi + 1) * ps < end ? (pi + 1) * ps : end;
    cr_assert_lt(b0, b1);
    if (prep) {
        int rc = kvvm_seq_prepare_write(t->kv, s->h, b0 / bpt, (b1 + bpt - 1) / bpt);
        cr_assert_eq(rc, 0, "prepare_write: %d", rc);
    }
    for (uint32_t r = 0; r < t->cfg.n_regions; r++)
        sh_write(t, s, r, b0, b1 - b0, lin);
}

#endif /* KVVM_HARNESS_SHADOW */

#endif /* KVVM_TESTS_HARNESS_H */
