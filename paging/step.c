/*
 * paging/step.c: the epoch clock and the streams: paging_step, paging_sync,
 * paging_set_stream; the copy stream (tier_copy_stream) and its ordering after the engine
 * (tier_copies_after_engine, paging_stream_after_copies). Owns struct pg_clock.
 *
 * Every step ends an epoch (pg->epoch++): with an engine stream it records the step fence
 * there, so a later step that finds it complete marks the epochs before it quiet
 * (quiet_below), which lets defer.c release pages without waiting. An idle step (no
 * sequence used since the fence was recorded: pg->tick unchanged) records nothing and
 * moves the fence's epoch on instead, and once the fence was found complete asks the
 * driver nothing: an idle engine's steps make no driver call here. paging_sync waits for
 * the engine stream and the copy stream (sync mode: the device) and reaps every pending
 * release. Changing the engine stream synchronizes first, so no fence of the old stream is
 * left to order the new one.
 */
#include "paging_int.h"
#include "frames.h"
#include "clock.h"
#include "view.h"

#include <errno.h>
#include "common/log.h"

int pg_device_sync(struct paging *pg)
{
    int rc = vmm_device_sync(pg->v);
    if (rc)
        return rc;
    pg->ck.quiet_below = pg->epoch;
    pg->ck.n_syncs++;
    return 0;
}

int paging_step(struct paging *pg)
{
    if (vmm_dead(pg->v))
        return -EIO;
    int rc = defer_reap(pg, false);
    if (rc)
        return rc;
    if (pg->ck.stream) {
        if (!pg->ck.step_fence_ok) {
            rc = vmm_fence_create(pg->v, &pg->ck.step_fence);
            if (rc)
                return rc;
            pg->ck.step_fence_ok = 1;
        }
        bool idle = pg->ck.step_recorded && pg->tick == pg->ck.step_fence_tick;
        if (pg->ck.step_recorded && !(idle && pg->ck.step_fence_done) &&
            vmm_fence_query(pg->v, &pg->ck.step_fence) == 1) {
            pg->ck.step_fence_done = 1;
            if (pg->ck.step_fence_epoch > pg->ck.quiet_below)
                pg->ck.quiet_below = pg->ck.step_fence_epoch;
        }
        if (!idle) {
            rc = vmm_fence_record(pg->v, &pg->ck.step_fence, pg->ck.stream);
            if (rc)
                return rc;
            pg->ck.step_recorded = 1;
            pg->ck.step_fence_done = 0;
            pg->ck.step_fence_tick = pg->tick;
        }
        /* idle (no sequence used since the fence was recorded): the engine's work since then
           touches none of them (docs/api.md "Protection"), so the fence already covers
           every sequence used before this step; done, every epoch so far is quiet */
        pg->ck.step_fence_epoch = pg->epoch + 1;
        if (idle && pg->ck.step_fence_done)
            pg->ck.quiet_below = pg->ck.step_fence_epoch;
    }
    pg->epoch++;
    pool_refill(pg, pg->fr.chunk);
    rc = view_reap(pg, false);
    if (!pg->fr.feed.on)
        paging_view_prepare(pg);    /* without a pool thread: ahead, at the step */
    return rc;
}

/* Stream mode: the engine stream and the library's copy stream, never the whole device
   (cuCtxSynchronize waits for every stream of the context: the engine's other streams, e.g.
   NCCL's, too, which may wait for a peer that waits for this engine). The engine's work
   on pages is ordered on its stream, so that stream done = every epoch quiet. */
static int pg_streams_sync(struct paging *pg)
{
    int rc = vmm_stream_sync(pg->v, pg->ck.stream);
    if (!rc && pg->ck.copy_stream)
        rc = vmm_stream_sync(pg->v, pg->ck.copy_stream);
    if (rc)
        return rc;
    pg->ck.quiet_below = pg->epoch;
    pg->ck.n_syncs++;
    return 0;
}

int paging_sync(struct paging *pg)
{
    if (vmm_dead(pg->v))
        return -EIO;
    int rc = pg->ck.stream ? pg_streams_sync(pg) : pg_device_sync(pg);
    if (!rc)
        rc = defer_reap(pg, true);
    return rc ? rc : view_reap(pg, false);
}

int paging_set_stream(struct paging *pg, kcu_stream s)
{
    if (vmm_dead(pg->v))
        return -EIO;
    if (s) {
        int rc = vmm_stream_check_owner(pg->v, s);
        if (!rc)
            rc = vmm_stream_check_capture(pg->v, s);
        if (rc)
            return rc;
    }
    if (s == pg->ck.stream)
        return 0;
    int rc = paging_sync(pg);
    if (rc)
        return rc;
    pg->ck.stream = s;
    pg->ck.step_recorded = 0;
    return 0;
}

kcu_stream paging_stream(const struct paging *pg)
{
    return pg->ck.stream;
}

/* ---- the copy stream (the swap paths' copies) and its ordering after the engine ---- */

int tier_copy_stream(struct paging *pg)
{
    if (pg->ck.copy_stream)
        return 0;
    int rc = vmm_stream_create(pg->v, &pg->ck.copy_stream);
    if (rc)
        return rc;
    rc = vmm_fence_create(pg->v, &pg->ck.copy_fence);
    if (!rc) {
        pg->ck.copy_fence_ok = 1;
        return 0;
    }
    vmm_stream_destroy(pg->v, pg->ck.copy_stream);
    pg->ck.copy_stream = NULL;
    return rc;
}

/* Acquire before a reclaim acts (paging.h): the frames through the pool's owner, the copy
   stream and the fences here (the clock owns the copy stream). */
int paging_acquire(struct paging *pg, uint32_t frames, unsigned fences, uint32_t *mark)
{
    *mark = pg->fr.n_created;
    int rc = pool_make_ready(pg, frames, true);
    if (!rc)
        rc = tier_copy_stream(pg);      /* the moves' and the swap-in's copies */
    if (!rc)
        rc = vmm_fence_reserve(pg->v, fences);
    if (rc)
        pool_rollback(pg, *mark);       /* nothing moved: as if never created */
    return rc;
}

kcu_stream paging_copy_stream(const struct paging *pg)
{
    return pg->ck.copy_stream;
}

int paging_copy_fence_record(struct paging *pg, vmm_fence *f)
{
    int rc = tier_copy_stream(pg);
    return rc ? rc : vmm_fence_record(pg->v, f, pg->ck.copy_stream);
}

int paging_stream_after_copies(struct paging *pg, kcu_stream stream)
{
    if (!pg->ck.copy_stream)
        return 0;
    int rc = vmm_fence_record(pg->v, &pg->ck.copy_fence, pg->ck.copy_stream);
    return rc ? rc : vmm_stream_after(pg->v, stream, &pg->ck.copy_fence);
}

/* Orders the copy stream after the engine's work that may touch s's pages (s NULL: any
   work enqueued so far). A quiet s (used before an epoch known complete) needs nothing, in
   synchronous mode too (no context synchronization: what the reclaim thread moves there).
   An unprotected s (not used since the last step) was last touched
   by work before the last step's fence: the copy stream waits for that fence, and nothing
   is recorded on the engine stream, so a background thread never enqueues there (a capture
   may begin at any time on it: a record would become a graph node). Otherwise a fence is
   recorded on the engine stream now (the caller is the engine's own call). */
int tier_copies_after_engine(struct paging *pg, const struct pg_seq *s)
{
    if (s && (!s->used_valid || s->used_epoch < pg->ck.quiet_below))
        return 0;                       /* quiet: no engine work left on its pages */
    if (!pg->ck.stream)
        return vmm_device_sync(pg->v);
    if (s && s->used_epoch < pg->epoch && pg->ck.step_recorded)
        return vmm_stream_after(pg->v, pg->ck.copy_stream, &pg->ck.step_fence);
    if (!pg->ck.order_fence_ok) {
        int rc = vmm_fence_create(pg->v, &pg->ck.order_fence);
        if (rc)
            return rc;
        pg->ck.order_fence_ok = 1;
    }
    int rc = vmm_fence_record(pg->v, &pg->ck.order_fence, pg->ck.stream);
    return rc ? rc : vmm_stream_after(pg->v, pg->ck.copy_stream, &pg->ck.order_fence);
}
