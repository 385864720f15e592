/*
 * core/kvvm.c: the public calls on sequences, streams and addresses (include/kvvm.h).
 *
 * Each call: check its pointer arguments, take the context lock, refuse with -EIO once the
 * context is dead (a sticky driver error seen by vmm), call paging/ (which is all or
 * nothing), note a death, unlock (the frame of a call: core/call.h). The context's
 * lifetime is core/open.c, the stats core/stats.c, the errno texts core/errors.c. A call
 * that may move other sequences checks its arguments and staleness, counts the frames it
 * needs (paging's need functions), makes room (swap/'s reclaim plan, checked before anything
 * moves), and only then swaps in and acts (see core.h "Pressure"); the watermark rules run
 * after it. core/ decides nothing about victims.
 */
#include "core.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "common/assert.h"
#include "common/log.h"
#include "core/call.h"

/* ---- pressure: check, count, make room, then act ------------------------------------ */

/* Room for a call that needs `need` device frames (counted by paging's need functions)
   naming the sequences excl: its pending releases first (the call would wait for them
   anyway), then reclaim (swap/'s plan: checked before anything moves). A pool client
   below paging's budget by the daemon's limit counts those frames as needed too
   (core_pool_over_limit). 0: the frames are free; -ENOMEM and nothing moved; -EIO. */
static int make_room(kvvm *kv, uint64_t need, const uint64_t *excl, size_t n_excl)
{
    uint32_t over = core_pool_over_limit(kv);
    need += over;
    if (paging_frames_free(kv->pg) >= need)
        return 0;
    int rc = paging_wait_releases(kv->pg);
    if (rc || paging_frames_free(kv->pg) >= need)
        return rc;
    if (need > UINT32_MAX)
        rc = -ENOMEM;
    else if (over)
        rc = swap_make_room_free(kv->sw, (uint32_t)need, excl, n_excl);
    else
        rc = swap_make_room(kv->sw, (uint32_t)need, excl, n_excl);
    KVVM_ASSERT(rc || paging_frames_free(kv->pg) >= need);   /* swap_make_room's 0 */
    if (rc == -ENOMEM)
        paging_why(kv->pg, PG_WHY_NEED, need);  /* the -ENOMEM names the pages (core_explain) */
    return rc;
}

int core_make_room(kvvm *kv, uint64_t need, const uint64_t *excl, size_t n_excl)
{
    return make_room(kv, need, excl, n_excl);
}

/* Swaps s in, if it is out, after make_room counted it (and the caller checked the engine
   stream: stream_check); *swapped says it did. */
static int bring_in(kvvm *kv, kvvm_seq s, bool *swapped)
{
    *swapped = false;
    if (paging_seq_resident(kv->pg, s))
        return 0;
    int rc = paging_swap_in(kv->pg, s, false);
    *swapped = !rc;
    KVVM_ASSERT(rc || paging_seq_resident(kv->pg, s));
    return rc;
}

/* A call that swapped s in failed afterwards: put it back (best effort, logged). */
static void restore_out(kvvm *kv, kvvm_seq s, bool swapped)
{
    uint32_t moved;                 /* (s is resident: a swap-out) */
    if (swapped && paging_seq_swap_out(kv->pg, s, &moved))
        klog_warn("kvvm: a failed call leaves sequence %llx resident", (unsigned long long)s);
}

/* The public swap-in / prefetch: checks, room, swap-in; the watermark rules after it. */
static int swap_in_locked(kvvm *kv, kvvm_seq s, bool async)
{
    uint64_t need;
    int rc = core_seq_stale(kv, s);     /* a dropped CACHED sequence: -ESTALE */
    if (!rc)
        rc = paging_need(kv->pg, &(struct pg_need){ .of = PG_NEED_GROW, .h = s }, &need);
    if (!rc)
        rc = stream_check(kv);
    if (!rc)
        rc = make_room(kv, need, &s, 1);
    if (!rc)
        rc = paging_swap_in(kv->pg, s, async);
    KVVM_ASSERT(rc || async || paging_seq_resident(kv->pg, s));
    swap_after_call(kv->sw);
    return rc;
}

/* ---- sequences ---------------------------------------------------------------------- */

int kvvm_seq_create(kvvm *kv, kvvm_seq *out)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(out);
    CALL(kv, paging_seq_create(kv->pg, out));
}

/* A free, truncate or discard may release many frames mapped from the pool at once (an
   imported sequence's): their RETURNs go in messages of up to POOL_BATCH_MAX ids, where
   each frame's went in a message of its own (core_pool_returns_hold). */
static int seq_free_locked(kvvm *kv, kvvm_seq s)
{
    core_pool_returns_hold(kv, true);
    int rc = paging_seq_free(kv->pg, s);
    core_pool_returns_hold(kv, false);
    return rc;
}

int kvvm_seq_free(kvvm *kv, kvvm_seq s)
{
    klast_clear();
    NONNULL(kv);
    CALL_ENGINE(kv, seq_free_locked(kv, s));
}

static int grow_once(kvvm *kv, kvvm_seq s, uint64_t length)
{
    struct paging_seq_info pi;
    uint64_t need;
    bool swapped;
    int rc = paging_seq_info(kv->pg, s, PG_INFO_LIVE, &pi);   /* -ESTALE before any room */
    if (rc)
        return rc;
    if (length < pi.length)
        return kerr(-EINVAL, "kvvm_seq_grow: length %llu is shorter than the sequence's %llu "
                    "tokens (kvvm_seq_truncate shortens)", (unsigned long long)length,
                    (unsigned long long)pi.length);
    rc = paging_need(kv->pg, &(struct pg_need){ .of = PG_NEED_GROW, .h = s, .length = length },
                     &need);                     /* swap-in, new pages, copies */
    if (!rc && !pi.resident)
        rc = stream_check(kv);
    if (!rc)
        rc = make_room(kv, need, &s, 1);
    if (!rc)
        rc = bring_in(kv, s, &swapped);
    if (rc)
        return rc;
    rc = paging_grow(kv->pg, &s, &length, 1, 0);
    if (rc)
        restore_out(kv, s, swapped);
    swap_after_call(kv->sw);
    return rc;
}

/* A pool client learns a lower daemon limit (kvvmctl limit) from the reply that refused
   its lease: the grow, failed and changing nothing, is tried once more with room made
   under that limit (its own CACHED sequences dropped, as at a local budget). */
static int grow_locked(kvvm *kv, kvvm_seq s, uint64_t length)
{
    uint32_t over = core_pool_over_limit(kv);
    int rc = grow_once(kv, s, length);
    if (rc == -ENOMEM && core_pool_over_limit(kv) > over) {
        klast_clear();
        rc = grow_once(kv, s, length);
    }
    return rc;
}

/* A grow within the pages s holds moves nothing: no frame, no copy, so no capture check
   and no driver call (the decode step's cost: a lock and a lookup); any other grow checks
   the engine stream's capture first, as CALL_ENGINE does. */
static int grow_call(kvvm *kv, kvvm_seq s, uint64_t length)
{
    int rc = paging_grow(kv->pg, &s, &length, 1, PG_GROW_IN_PLACE);
    if (rc != -EAGAIN)
        return rc;
    rc = stream_check(kv);
    return rc ? rc : grow_locked(kv, s, length);
}

/* kvvm_seq_grow's full path (out of line: the hot path's frame stays small). */
static __attribute__((noinline)) int grow_full(kvvm *kv, kvvm_seq s, uint64_t length)
{
    klast_clear();
    if (!kv)
        return kerr(-EINVAL, "kvvm_seq_grow: kv is NULL");
    CALL_AS(kv, "kvvm_seq_grow", grow_call(kv, s, length));
}

int kvvm_seq_grow(kvvm *kv, kvvm_seq s, uint64_t length)
{
    if (__builtin_expect(kv != NULL, 1) && hot_enter(kv)) {   /* the decode step's grow */
        bool done = paging_seq_grow_fast(kv->pg, s, length);
        pthread_mutex_unlock(&kv->lock);
        if (done) {
            klast_clear();
            return 0;
        }
    }
    return grow_full(kv, s, length);
}

static int grow_batch_locked(kvvm *kv, const kvvm_seq *seqs, const uint64_t *lengths,
                             size_t n)
{
    bool *swapped = calloc(n, sizeof *swapped);
    uint64_t need = 0;
    bool any_out = false;
    int rc = swapped ? 0 : -ENOMEM;
    size_t i;
    for (i = 0; !rc && i < n; i++) {
        struct paging_seq_info pi;
        rc = paging_seq_info(kv->pg, seqs[i], PG_INFO_LIVE, &pi);
        if (!rc && lengths[i] < pi.length)
            rc = kerr(-EINVAL, "kvvm_seq_grow_batch: lengths[%zu] = %llu is shorter than "
                      "sequence seqs[%zu]'s %llu tokens", i, (unsigned long long)lengths[i],
                      i, (unsigned long long)pi.length);
        any_out |= !rc && !pi.resident;
    }
    for (i = 0; !rc && i < n; i++)
        for (size_t j = 0; !rc && j < i; j++)
            if (seqs[j] == seqs[i])
                rc = kerr(-EINVAL, "kvvm_seq_grow_batch: a sequence is named twice in seqs "
                          "(seqs[%zu] and seqs[%zu])", j, i);
    if (!rc && any_out)
        rc = stream_check(kv);
    /* the whole batch's frames (swap-ins, new pages, copies of shared partial last pages),
       room for them, then the swap-ins and the grow */
    if (!rc)
        rc = paging_need(kv->pg, &(struct pg_need){ .of = PG_NEED_BATCH, .hs = seqs,
                                                    .lengths = lengths, .n = n }, &need);
    if (!rc)
        rc = make_room(kv, need, seqs, n);
    for (i = 0; !rc && i < n; i++)
        rc = bring_in(kv, seqs[i], &swapped[i]);
    if (!rc)
        rc = paging_grow(kv->pg, seqs, lengths, n, PG_GROW_BATCH);
    if (rc && swapped)
        for (i = 0; i < n; i++)
            restore_out(kv, seqs[i], swapped[i]);
    free(swapped);
    swap_after_call(kv->sw);
    return rc;
}

/* As grow_call: a decode step's batch that moves nothing costs no driver call. */
static int grow_batch_call(kvvm *kv, const kvvm_seq *seqs, const uint64_t *lengths, size_t n)
{
    int rc = paging_grow(kv->pg, seqs, lengths, n, PG_GROW_BATCH | PG_GROW_IN_PLACE);
    if (rc != -EAGAIN)
        return rc;
    rc = stream_check(kv);
    return rc ? rc : grow_batch_locked(kv, seqs, lengths, n);
}

int kvvm_seq_grow_batch(kvvm *kv, const kvvm_seq *seqs, const uint64_t *lengths, size_t n)
{
    klast_clear();
    NONNULL(kv);
    if (n) {
        NONNULL(seqs);
        NONNULL(lengths);
    }
    if (!n)
        return 0;
    CALL(kv, grow_batch_call(kv, seqs, lengths, n));
}

static int truncate_locked(kvvm *kv, kvvm_seq s, uint64_t length)
{
    core_pool_returns_hold(kv, true);   /* as seq_free_locked */
    int rc = paging_seq_truncate(kv->pg, s, length);
    core_pool_returns_hold(kv, false);
    return rc;
}

int kvvm_seq_truncate(kvvm *kv, kvvm_seq s, uint64_t length)
{
    klast_clear();
    NONNULL(kv);
    CALL_ENGINE(kv, EXPLAIN_EINVAL(truncate_locked(kv, s, length),
                                   "kvvm_seq_truncate: length %llu is longer than the "
                                   "sequence (kvvm_seq_grow lengthens)",
                                   (unsigned long long)length));
}

int kvvm_seq_fork(kvvm *kv, kvvm_seq parent, kvvm_seq *child)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(child);
    CALL_ENGINE(kv, paging_seq_fork(kv->pg, parent, child));
}

static int share_locked(kvvm *kv, kvvm_seq dst, kvvm_seq src, uint64_t n_tokens)
{
    uint64_t ex[2] = { dst, src };
    uint64_t need;
    int rc = core_seq_stale(kv, dst);
    if (!rc)
        rc = core_seq_stale(kv, src);
    if (!rc)
        rc = paging_need(kv->pg, &(struct pg_need){ .of = PG_NEED_SHARE, .h = dst, .src = src,
                                                    .length = n_tokens }, &need);
    if (!rc)
        rc = make_room(kv, need, ex, 2);
    if (!rc)
        rc = paging_seq_share(kv->pg, dst, src, n_tokens);
    struct paging_seq_info d, r;
    if (rc == -EINVAL && !paging_seq_info(kv->pg, dst, 0, &d) &&
        !paging_seq_info(kv->pg, src, 0, &r))
        rc = kerr(rc, "kvvm_seq_share: %s (dst holds %llu tokens, must be empty; n_tokens "
                  "%llu, src holds %llu)", d.length ? "dst is not empty" : "n_tokens is past "
                  "src's length", (unsigned long long)d.length, (unsigned long long)n_tokens,
                  (unsigned long long)r.length);
    swap_after_call(kv->sw);
    return rc;
}

int kvvm_seq_share(kvvm *kv, kvvm_seq dst, kvvm_seq src, uint64_t n_tokens)
{
    klast_clear();
    NONNULL(kv);
    CALL_ENGINE(kv, share_locked(kv, dst, src, n_tokens));
}

/* Room for a write into regions [r0, r1), bytes [b0, b1), of s (a swap-in if it is out and
   the copies of the shared pages written: several for a range), then s brought in. */
static int write_room(kvvm *kv, kvvm_seq s, uint32_t r0, uint32_t r1, uint64_t b0,
                      uint64_t b1, bool *swapped)
{
    uint64_t need;
    *swapped = false;
    int rc = paging_need(kv->pg, &(struct pg_need){ .of = PG_NEED_WRITE, .h = s, .r0 = r0,
                                                    .r1 = r1, .b0 = b0, .b1 = b1 }, &need);
    if (!rc && !paging_seq_resident(kv->pg, s))
        rc = stream_check(kv);
    if (!rc)
        rc = make_room(kv, need, &s, 1);
    return rc ? rc : bring_in(kv, s, swapped);
}

static int prepare_write_locked(kvvm *kv, kvvm_seq s, uint64_t first, uint64_t end)
{
    bool swapped;
    struct paging_seq_info pi;
    int rc = paging_seq_info(kv->pg, s, PG_INFO_LIVE, &pi);
    if (!rc && first >= end)
        rc = kerr(-EINVAL, "kvvm_seq_prepare_write: first %llu must be below end %llu",
                  (unsigned long long)first, (unsigned long long)end);
    if (!rc && end > pi.length)
        rc = kerr(-EINVAL, "kvvm_seq_prepare_write: end %llu is past the sequence's length "
                  "%llu", (unsigned long long)end, (unsigned long long)pi.length);
    for (uint32_t r = 0; !rc && r < kv->cfg.n_regions; r++) {
        uint64_t fk;
        rc = paging_seq_first_kept(kv->pg, s, r, &fk);
        if (!rc && first < fk)
            rc = kerr(-EINVAL, "kvvm_seq_prepare_write: token %llu of region %u was "
                      "discarded (first_kept %llu, kvvm_seq_discard)",
                      (unsigned long long)first, r, (unsigned long long)fk);
    }
    if (!rc)
        rc = write_room(kv, s, 0, kv->cfg.n_regions, first * kv->cfg.bytes_per_token,
                        end * kv->cfg.bytes_per_token, &swapped);
    if (rc)
        return rc;
    rc = paging_seq_prepare_write(kv->pg, s, first, end);
    if (rc)
        restore_out(kv, s, swapped);
    swap_after_call(kv->sw);
    return rc;
}

int kvvm_seq_prepare_write(kvvm *kv, kvvm_seq s, uint64_t first, uint64_t end)
{
    klast_clear();
    NONNULL(kv);
    CALL_ENGINE(kv, prepare_write_locked(kv, s, first, end));
}

/* Whether a host buffer argument is device memory: inside this context's reservation, or
   known to the driver as device memory (the copy would fail with the driver's
   CUDA_ERROR_INVALID_VALUE, which names neither the call nor the argument). */
static bool host_arg_is_device(kvvm *kv, const void *buf, size_t len)
{
    uint64_t b = (uint64_t)(uintptr_t)buf, end = kv->base + (uint64_t)kv->cfg.n_regions *
                 kv->cfg.max_seqs * kv->slot_bytes + kv->cfg.page_size;
    return (b < end && b + len > kv->base) || vmm_ptr_is_device(kv->v, buf) == 1;
}

/* Validates an I/O range the way paging does, before any swap-in. */
static int io_pre(kvvm *kv, const char *call, kvvm_seq s, uint32_t region, uint64_t offset,
                  const void *buf, size_t len)
{
    struct paging_seq_info pi;
    int rc = paging_seq_info(kv->pg, s, 0, &pi);
    if (rc)
        return rc;
    if (pi.dropped)
        return -ESTALE;                 /* a dropped CACHED sequence */
    uint64_t bytes = pi.length * kv->cfg.bytes_per_token;
    if (!buf)
        return kerr(-EINVAL, "%s: the buffer is NULL", call);
    if (host_arg_is_device(kv, buf, len))
        return kerr(-EINVAL, "%s: %s %p is a device address, not host memory (%s copies "
                    "between host memory and the sequence; a device-to-device copy is the "
                    "engine's own, on its stream, at kvvm_seq_addr's address)", call,
                    strcmp(call, "kvvm_seq_write") ? "dst" : "src", buf, call);
    if (region >= kv->cfg.n_regions)
        return kerr(-EINVAL, "%s: region %u is out of range (n_regions %u)", call, region,
                    kv->cfg.n_regions);
    if (!len)
        return kerr(-EINVAL, "%s: len is 0", call);
    if (offset >= bytes || len > bytes - offset)
        return kerr(-EINVAL, "%s: bytes [%llu, +%zu) are outside the sequence's %llu bytes "
                    "per region (length %llu x bytes_per_token %llu)", call,
                    (unsigned long long)offset, len, (unsigned long long)bytes,
                    (unsigned long long)pi.length,
                    (unsigned long long)kv->cfg.bytes_per_token);
    uint64_t fk;
    rc = paging_seq_first_kept(kv->pg, s, region, &fk);
    if (!rc && offset < fk * kv->cfg.bytes_per_token)
        rc = kerr(-EINVAL, "%s: bytes from %llu of region %u lie below first_kept %llu "
                  "(token %llu): discarded by kvvm_seq_discard", call,
                  (unsigned long long)offset, region, (unsigned long long)fk,
                  (unsigned long long)(offset / kv->cfg.bytes_per_token));
    return rc;
}

static int write_locked(kvvm *kv, kvvm_seq s, uint32_t region, uint64_t offset,
                        const void *src, size_t len)
{
    bool swapped;
    int rc = io_pre(kv, "kvvm_seq_write", s, region, offset, src, len);
    if (!rc)
        rc = write_room(kv, s, region, region + 1, offset, offset + len, &swapped);
    if (rc)
        return rc;
    rc = paging_seq_write(kv->pg, s, region, offset, src, len);
    if (rc)
        restore_out(kv, s, swapped);
    swap_after_call(kv->sw);
    return rc;
}

int kvvm_seq_write(kvvm *kv, kvvm_seq s, uint32_t region, uint64_t offset, const void *src,
                   size_t len)
{
    klast_clear();
    NONNULL(kv);
    CALL_ENGINE(kv, write_locked(kv, s, region, offset, src, len));
}

static int read_locked(kvvm *kv, kvvm_seq s, uint32_t region, uint64_t offset, void *dst,
                       size_t len)
{
    bool swapped = false;
    uint64_t need;
    int rc = io_pre(kv, "kvvm_seq_read", s, region, offset, dst, len);
    if (!rc)
        rc = paging_need(kv->pg, &(struct pg_need){ .of = PG_NEED_GROW, .h = s }, &need);
    if (!rc && !paging_seq_resident(kv->pg, s))
        rc = stream_check(kv);
    if (!rc)
        rc = make_room(kv, need, &s, 1);
    if (!rc)
        rc = bring_in(kv, s, &swapped);
    if (rc)
        return rc;
    rc = paging_seq_read(kv->pg, s, region, offset, dst, len);
    if (rc)
        restore_out(kv, s, swapped);
    return rc;
}

int kvvm_seq_read(kvvm *kv, kvvm_seq s, uint32_t region, uint64_t offset, void *dst,
                  size_t len)
{
    klast_clear();
    NONNULL(kv);
    CALL_ENGINE(kv, read_locked(kv, s, region, offset, dst, len));
}

static int swap_out_locked(kvvm *kv, kvvm_seq s)
{
    int rc = stream_check(kv);
    uint32_t moved;                 /* (out already: the orphans it left moved down) */
    if (!rc)
        rc = paging_seq_swap_out(kv->pg, s, &moved);
    swap_after_call(kv->sw);        /* the host marks: spilling in the background */
    return rc;
}

int kvvm_seq_swap_out(kvvm *kv, kvvm_seq s)
{
    klast_clear();
    NONNULL(kv);
    CALL(kv, swap_out_locked(kv, s));
}

int kvvm_seq_swap_in(kvvm *kv, kvvm_seq s)
{
    klast_clear();
    NONNULL(kv);
    CALL(kv, swap_in_locked(kv, s, false));
}

int kvvm_seq_prefetch(kvvm *kv, kvvm_seq s)
{
    klast_clear();
    NONNULL(kv);
    CALL(kv, swap_in_locked(kv, s, true));
}

int kvvm_seq_ready(kvvm *kv, kvvm_seq s)
{
    klast_clear();
    NONNULL(kv);
    CALL(kv, paging_seq_ready(kv->pg, s));
}

static int view_state_locked(kvvm *kv, kvvm_seq s, uint64_t *length, uint64_t *first_kept)
{
    struct paging_seq_info pi;
    int rc = paging_seq_info(kv->pg, s, PG_INFO_BRIEF, &pi);   /* the length, not the pages */
    if (rc)
        return rc;
    int ready = pi.resident && !pi.dropped ? paging_seq_ready(kv->pg, s) : 0;
    if (ready < 0)
        return ready;
    *length = pi.length;
    *first_kept = pi.first_kept;
    return ready;
}

int kvvm_seq_view_state(kvvm *kv, kvvm_seq s, uint64_t *length, uint64_t *first_kept)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(length);
    NONNULL(first_kept);
    CALL(kv, view_state_locked(kv, s, length, first_kept));
}

static int wait_stream_locked(kvvm *kv, kvvm_seq s, void *stream)
{
    uint32_t slot;
    int rc = paging_seq_slot(kv->pg, s, &slot);
    if (!rc)
        rc = vmm_stream_check_capture(kv->v, (kcu_stream)stream);
    return rc ? rc : paging_stream_after_copies(kv->pg, (kcu_stream)stream);
}

int kvvm_seq_wait_stream(kvvm *kv, kvvm_seq s, void *stream)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(stream);
    CALL(kv, wait_stream_locked(kv, s, stream));
}

static int need_locked(kvvm *kv, kvvm_seq s, uint64_t length, uint64_t *pages, int *fits)
{
    uint64_t n;
    struct paging_counters c;
    int rc = paging_need(kv->pg, &(struct pg_need){ .of = PG_NEED_GROW, .h = s,
                                                    .length = length }, &n);
    if (rc)
        return rc;
    paging_counters(kv->pg, &c);
    *pages = n;
    *fits = n <= c.pages_free;
    return 0;
}

int kvvm_seq_need(kvvm *kv, kvvm_seq s, uint64_t length, uint64_t *pages, int *fits)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(pages);
    NONNULL(fits);
    CALL(kv, need_locked(kv, s, length, pages, fits));
}

/* ---- streams and steps -------------------------------------------------------------- */

static int step_locked(kvvm *kv)
{
    int rc = paging_step(kv->pg);
    if (!rc)
        rc = paging_disk_reap(kv->pg);
    if (!rc)
        swap_after_step(kv->sw);
    if (!rc)
        frames_after_step(kv->fr);
    return rc;
}

int kvvm_step(kvvm *kv)
{
    klast_clear();
    NONNULL(kv);
    CALL_ENGINE(kv, step_locked(kv));
}

static int sync_locked(kvvm *kv)
{
    int rc = paging_sync(kv->pg);
    int drc = paging_disk_wait(kv->pg);
    return rc ? rc : drc;
}

int kvvm_sync(kvvm *kv)
{
    klast_clear();
    NONNULL(kv);
    if (forked(kv))
        return -EIO;
    swap_wait_idle(kv->sw);         /* background rounds first, without the lock */
    frames_wait_idle(kv->fr);
    storeq_wait_idle(kv->sq);       /* the prefix cache's store writes (bounded) */
    core_pool_settle(kv);           /* shares of calls before it visible to other clients */
    CALL_ENGINE(kv, sync_locked(kv));
}

int kvvm_set_stream(kvvm *kv, void *stream)
{
    klast_clear();
    NONNULL(kv);
    CALL_ENGINE(kv, paging_set_stream(kv->pg, (kcu_stream)stream));
}

static int stream_create_call(kvvm *kv, void **stream)
{
    kcu_stream s = NULL;
    int rc = enter(kv);
    if (rc)
        return rc;
    if (kv->n_streams == kv->cap_streams) {
        size_t cap = kv->cap_streams ? 2 * kv->cap_streams : 4;
        kcu_stream *n = realloc(kv->streams, cap * sizeof *n);
        if (!n)
            return leave(kv, -ENOMEM);
        kv->streams = n;
        kv->cap_streams = cap;
    }
    rc = vmm_stream_create(kv->v, &s);
    if (!rc) {
        KVVM_ASSERT(kv->n_streams < kv->cap_streams);
        kv->streams[kv->n_streams++] = s;
        *stream = s;
    }
    return leave(kv, rc);
}

int kvvm_stream_create(kvvm *kv, void **stream)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(stream);
    return api_done(__func__, stream_create_call(kv, stream));
}

/* Only a stream kvvm_stream_create made on this context (-EINVAL otherwise: the engine's
   own streams are not ours to destroy), and not the engine stream set now (-EBUSY). */
static int stream_destroy_locked(kvvm *kv, kcu_stream s)
{
    size_t i;
    for (i = 0; i < kv->n_streams && kv->streams[i] != s; i++)
        ;
    if (i == kv->n_streams)
        return kerr(-EINVAL, "kvvm_stream_destroy: stream %p was not made by "
                    "kvvm_stream_create on this context (or is destroyed already); the "
                    "engine destroys its own streams", (void *)s);
    if (s == paging_stream(kv->pg))
        return kerr(-EBUSY, "kvvm_stream_destroy: stream %p is the engine stream now; "
                    "kvvm_set_stream another stream (or NULL) first", (void *)s);
    int rc = vmm_stream_destroy(kv->v, s);
    if (rc)
        return rc;
    kv->streams[i] = kv->streams[--kv->n_streams];
    return 0;
}

int kvvm_stream_destroy(kvvm *kv, void *stream)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(stream);
    CALL(kv, stream_destroy_locked(kv, (kcu_stream)stream));
}

/* ---- addresses ---------------------------------------------------------------------- */

int kvvm_region_base(kvvm *kv, uint32_t region, uint64_t *addr)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(addr);
    if (forked(kv))
        return -EIO;
    if (region >= kv->cfg.n_regions)
        return kerr(-EINVAL, "kvvm_region_base: region %u is out of range (n_regions %u)",
                    region, kv->cfg.n_regions);
    *addr = paging_window(kv->pg, region, 0);    /* immutable after open: no lock */
    return 0;
}

int kvvm_slot_bytes(kvvm *kv, uint64_t *bytes)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(bytes);
    if (forked(kv))
        return -EIO;
    *bytes = kv->slot_bytes;
    return 0;
}

int kvvm_seq_slot(kvvm *kv, kvvm_seq s, uint32_t *slot)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(slot);
    CALL(kv, paging_seq_slot(kv->pg, s, slot));
}

static int addr_locked(kvvm *kv, kvvm_seq s, uint32_t region, uint64_t *addr)
{
    uint32_t slot;
    int rc = paging_seq_slot(kv->pg, s, &slot);
    if (!rc)
        *addr = paging_window(kv->pg, region, slot);
    return rc;
}

int kvvm_seq_addr(kvvm *kv, kvvm_seq s, uint32_t region, uint64_t *addr)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(addr);
    if (region >= kv->cfg.n_regions)
        return kerr(-EINVAL, "kvvm_seq_addr: region %u is out of range (n_regions %u)",
                    region, kv->cfg.n_regions);
    CALL(kv, addr_locked(kv, s, region, addr));
}

static int info_locked(kvvm *kv, kvvm_seq s, struct kvvm_seq_info *info)
{
    struct paging_seq_info pi;
    int rc = paging_seq_info(kv->pg, s, 0, &pi);
    if (rc)
        return rc;
    struct kvvm_seq_info o = {
        .size = info->size, .length = pi.length, .slot = pi.slot,
        .pages_device = pi.pages_device, .pages_host = pi.pages_host,
        .pages_disk = pi.pages_disk, .pages_shared = pi.pages_shared,
        .resident = pi.resident,
        .dropped = pi.dropped, .cls = pi.cls, .first_kept = pi.first_kept,
    };
    memcpy(info, &o, info->size < sizeof o ? info->size : sizeof o);
    return 0;
}

int kvvm_seq_info(kvvm *kv, kvvm_seq s, struct kvvm_seq_info *info)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(info);
    if (info->size < offsetof(struct kvvm_seq_info, resident) + sizeof(int))
        return kerr(-EINVAL, "kvvm_seq_info: info->size %zu is too small; set it to "
                    "sizeof(struct kvvm_seq_info) (%zu)", info->size, sizeof *info);
    CALL(kv, info_locked(kv, s, info));
}

/* ---- elastic memory (kvvm_set_budget, kvvm_trim) ----------------------------------- */

/* -EINVAL (explained) unless b is a budget this context can have. */
static int budget_arg(kvvm *kv, size_t b, uint32_t *frames)
{
    size_t ps = kv->cfg.page_size, dev = vmm_device_bytes(kv->v);
    if (!b)
        return kerr(-EINVAL, "kvvm_set_budget: device_budget 0: at least one page per region "
                    "(%u x %zu bytes) is needed", kv->cfg.n_regions, ps);
    if (b % ps)
        return kerr(-EINVAL, "kvvm_set_budget: device_budget %zu is not a multiple of "
                    "page_size %zu", b, ps);
    if (b > dev || b / ps > paging_cap_frames(kv->pg))
        return kerr(-EINVAL, "kvvm_set_budget: device_budget %zu is larger than the device "
                    "(%zu bytes%s)", b, dev, strcmp(vmm_backend_name(kv->v), "emulated") ? ""
                    : ": emu_device_bytes, KVVM_EMU_DEVICE_BYTES");
    if (b / ps < kv->cfg.n_regions)
        return kerr(-EINVAL, "kvvm_set_budget: device_budget %zu holds fewer than one page of "
                    "%zu bytes per region (%u)", b, ps, kv->cfg.n_regions);
    *frames = (uint32_t)(b / ps);
    return 0;
}

/* Frames holding pages must fit in `frames`: completes pending releases, then swaps out
   (swap's direct-reclaim order and all-or-nothing check). */
static int budget_make_room(kvvm *kv, uint32_t frames)
{
    struct paging_counters c;
    paging_counters(kv->pg, &c);
    if (c.pages_used <= frames)
        return 0;
    int rc = c.deferred ? paging_sync(kv->pg) : 0;      /* releases behind the step fence */
    if (rc)
        return rc;
    paging_counters(kv->pg, &c);
    if (c.pages_used <= frames)
        return 0;
    rc = swap_reclaim_budget(kv->sw, (uint32_t)(c.pages_total - frames));
    if (rc == -ENOMEM) {        /* a normal outcome under load: the reason, not logged */
        klast_set("kvvm_set_budget: %llu pages are in use and only %u fit in "
                    "%zu bytes; not enough can be swapped out (protected or pinned "
                    "sequences, or no room in the host and disk tiers): the budget is "
                    "unchanged", (unsigned long long)c.pages_used, frames,
                    (size_t)frames * kv->cfg.page_size);
        return -ENOMEM;
    }
    return rc;
}

static int set_budget_locked(kvvm *kv, size_t b)
{
    uint32_t frames, released;
    int rc = budget_arg(kv, b, &frames);
    if (rc)
        return rc;
    paging_feed_quiesce(kv->pg);            /* no frame in the pool thread's hands */
    rc = kv->pool ? core_pool_budget_check(kv, b)   /* the pool: the daemon arbitrates */
                  : core_budget_fits(kv, b);        /* others may hold the device's memory */
    if (!rc)
        rc = budget_make_room(kv, frames);
    if (!rc)
        rc = paging_set_budget(kv->pg, frames, &released);
    if (rc)
        return rc;
    KVVM_ASSERT(frames >= kv->cfg.n_regions && (size_t)frames * kv->cfg.page_size == b);
    kv->cfg.device_budget = b;
    core_pool_set_limit(kv, b);             /* a pool client's limit is its budget */
    swap_set_frames(kv->sw, frames);        /* the watermarks follow */
    frames_set_budget(kv->fr, frames);      /* and the pool's marks (a refill round) */
    klog_info("kvvm_set_budget: %zu bytes (%u pages); %u frames released to the driver", b,
              frames, released);
    return 0;
}

int kvvm_set_budget(kvvm *kv, size_t device_budget)
{
    klast_clear();
    NONNULL(kv);
    CALL_ENGINE(kv, set_budget_locked(kv, device_budget));
}

static int trim_locked(kvvm *kv, size_t keep)
{
    paging_feed_quiesce(kv->pg);
    uint64_t k = keep / kv->cfg.page_size;
    uint32_t n = paging_trim(kv->pg, k > UINT32_MAX ? UINT32_MAX : (uint32_t)k);
    n += core_pool_trim(kv);        /* a pool client: its leased spares back to the daemon */
    size_t staged = storeq_trim(kv);    /* attach's kept staging (pinned host memory) */
    klog_debug("kvvm_trim: %u unused frames released to the driver, %zu bytes of the store's "
               "attach staging freed", n, staged);
    return 0;
}

int kvvm_trim(kvvm *kv, size_t keep_bytes)
{
    klast_clear();
    NONNULL(kv);
    CALL(kv, trim_locked(kv, keep_bytes));
}

/* ---- sliding-window discard and sequence classes (0.2) -------------------------------- */

static int discard_locked(kvvm *kv, kvvm_seq s, uint32_t region, uint64_t first_kept)
{
    struct paging_seq_info pi;
    int rc = paging_seq_info(kv->pg, s, 0, &pi);
    if (rc)
        return rc;
    if (region != KVVM_ALL_REGIONS && region >= kv->cfg.n_regions)
        return kerr(-EINVAL, "kvvm_seq_discard: region %u is out of range (n_regions %u, or "
                    "KVVM_ALL_REGIONS)", region, kv->cfg.n_regions);
    if (first_kept > pi.length)
        return kerr(-EINVAL, "kvvm_seq_discard: first_kept %llu is past the sequence's "
                    "length %llu", (unsigned long long)first_kept,
                    (unsigned long long)pi.length);
    core_pool_returns_hold(kv, true);   /* as seq_free_locked */
    rc = paging_seq_discard(kv->pg, s, region, first_kept);
    core_pool_returns_hold(kv, false);
    return rc;
}

int kvvm_seq_discard(kvvm *kv, kvvm_seq s, uint32_t region, uint64_t first_kept)
{
    klast_clear();
    NONNULL(kv);
    CALL_ENGINE(kv, discard_locked(kv, s, region, first_kept));
}

int kvvm_seq_set_class(kvvm *kv, kvvm_seq s, enum kvvm_seq_class cls)
{
    klast_clear();
    NONNULL(kv);
    if ((unsigned)cls > KVVM_SEQ_PINNED)
        return api_done(__func__, kerr(-EINVAL, "kvvm_seq_set_class: class %d is not "
                                       "KVVM_SEQ_LIVE, KVVM_SEQ_CACHED or KVVM_SEQ_PINNED",
                                       (int)cls));
    CALL(kv, paging_seq_set_class(kv->pg, s, (uint32_t)cls));
}

/* ---- names -------------------------------------------------------------------------- */

const char *kvvm_backend_name(kvvm *kv)
{
    return kv ? vmm_backend_name(kv->v) : "none";
}
