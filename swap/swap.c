/*
 * swap/swap.c: direct reclaim and the budget shrink (over plan.c's reclaim plans: the
 * victims are chosen there), watermarks, and the background reclaim and spill threads
 * (contract in swap.h); the host tier's choices are in room.c.
 */
#include "swap_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "common/assert.h"
#include "common/log.h"

static uint32_t frames_free(struct swap *sw)
{
    return paging_frames_free(sw->pg);
}

int swap_wait_copies(struct swap *sw)
{
    if (!sw->direct_fence_ok) {
        int rc = vmm_fence_create(sw->v, &sw->direct_fence);
        if (rc)
            return rc;
        sw->direct_fence_ok = true;
    }
    int rc = paging_copy_fence_record(sw->pg, &sw->direct_fence);
    if (!rc)
        rc = vmm_fence_wait(sw->v, &sw->direct_fence);
    return rc ? rc : paging_reap(sw->pg);
}

/* The fences acting on p and the call after it may make: a job per move, a release
   behind a fence per drop, the waits, and the caller's own swap-in and releases (an upper
   bound; vmm_fence_reserve caps it). */
static unsigned plan_fences(const struct swap_rplan *p)
{
    return (unsigned)(2 * p->n) + (p->orphans ? 2 : 0) + (p->cache ? 2 : 0) + 8;
}

/* Plans (flags), checks, acquires, and acts, waiting for the copies: the frames are free on
   return. Acquire (paging_acquire): the caller's `frames` (the ones it will take beyond
   those the moves free, created now within the budget) and the fences, before the first
   move, so that a driver refusing them fails the call with nothing moved. Timed into the
   stats when it moved something. *acted (NULL: not asked): the frames the plan acted on
   frees (0 when nothing was acted on). */
static int reclaim_now(struct swap *sw, uint32_t want, uint32_t frames, const uint64_t *excl,
                       size_t n_excl, unsigned flags, bool journal, uint32_t *acted)
{
    uint64_t t0 = know_ns();
    struct swap_rplan p;
    uint32_t moved = 0, mark;
    int rc = swap_reclaim_plan(sw, want, excl, n_excl, flags, &p);
    if (rc)
        return rc;                     /* nothing moved */
    if (p.n || p.orphans || p.cache)
        rc = paging_acquire(sw->pg, frames, plan_fences(&p), &mark);
    if (!rc && journal)
        rc = swap_undo_reserve(sw, p.n, p.orphans + want);   /* the moves' undo records */
    if (rc) {
        swap_rplan_free(&p);
        return rc;                     /* refused: nothing moved */
    }
    /* the moves start; what a driver may refuse for lack of resources was had, and the
       journal (journal: a call's reclaim) takes every move back if the call fails later
       (swap_call_end) */
    swap_undo_on(sw, journal);
    rc = swap_reclaim_act(sw, &p, true, &moved);
    if (acted)
        *acted = p.frees;
    swap_undo_on(sw, false);
    swap_rplan_free(&p);
    if (moved) {
        sw->c.direct_reclaims++;
        sw->c.direct_swap_outs += moved;
        uint64_t ns = know_ns() - t0;
        sw->c.direct_ns += ns;
        khist_add(&sw->direct_hist, ns);
    }
    return rc;
}

int swap_make_room(struct swap *sw, uint32_t want, const uint64_t *excl, size_t n_excl)
{
    /* a drop moves no data: without KVVM_F_AUTO_SWAP too */
    return reclaim_now(sw, want, want, excl, n_excl, sw->p.auto_swap ? SWAP_PLAN_SWAP : 0,
                       true, NULL);
}

int swap_make_room_free(struct swap *sw, uint32_t want, const uint64_t *excl, size_t n_excl)
{
    return reclaim_now(sw, want, 0, excl, n_excl, sw->p.auto_swap ? SWAP_PLAN_SWAP : 0,
                       true, NULL);
}

int swap_make_room_ahead(struct swap *sw, uint32_t want, const uint64_t *excl, size_t n_excl,
                         uint32_t *dropped)
{
    /* no SWAP_PLAN_SWAP: the droppable CACHED sequences, then the prefix cache's entries (the
       plan's order), nothing moved down; partial: what they cover. No journal: the call's
       frame ends before the reads do (swap.h) */
    *dropped = 0;
    return reclaim_now(sw, want, want, excl, n_excl, SWAP_PLAN_PARTIAL, false, dropped);
}

/* ---- budget changes (kvvm_set_budget) ----------------------------------------------- */

int swap_reclaim_budget(struct swap *sw, uint32_t want)
{
    /* the same plan as direct reclaim, with or without KVVM_F_AUTO_SWAP (API: a budget
       shrink swaps out regardless) */
    /* frames to free, none to take */
    return reclaim_now(sw, want, 0, NULL, 0, SWAP_PLAN_SWAP, true, NULL);
}

int swap_reclaim_give(struct swap *sw, uint32_t want, bool live, uint32_t *moved)
{
    /* best effort, as the background thread plans (in synchronous mode only quiet victims:
       no synchronization of the context from a thread other than the engine's), but
       waiting for the copies: the frames are given back right after */
    unsigned quiet = paging_stream(sw->pg) ? 0 : SWAP_PLAN_QUIET;
    struct swap_rplan p;
    *moved = 0;
    int rc = swap_reclaim_plan(sw, want, NULL, 0, SWAP_PLAN_PARTIAL | quiet |
                               (live ? SWAP_PLAN_SWAP : 0), &p);
    if (rc)
        return rc;
    rc = swap_reclaim_act(sw, &p, true, moved);
    swap_rplan_free(&p);
    if (*moved) {
        sw->c.reclaim_runs++;
        sw->c.reclaim_swap_outs += *moved;
    }
    return rc;
}

void swap_set_frames(struct swap *sw, uint32_t frames)
{
    sw->p.frames = frames;
    sw->min_free = (uint32_t)(sw->p.min * frames);
    sw->low_free = (uint32_t)(sw->p.low * frames);
    sw->high_free = (uint32_t)(sw->p.high * frames);
    if (sw->high_free > frames)
        sw->high_free = frames;
    KVVM_ASSERT(sw->min_free <= sw->low_free && sw->low_free <= sw->high_free);
}

static void spill_wake(struct swap *sw)
{
    if (!sw->spill.running)
        return;
    size_t f = paging_host_free(sw->pg);
    if (f >= sw->host_low_free)
        return;
    if (f < sw->host_min_free) {
        /* below min the caller starts writes itself (it does not wait for them), so the
           response to pressure does not depend on the thread being scheduled */
        uint32_t started;
        swap_spill(sw, (uint32_t)(sw->host_low_free - f), 0, &started);
    }
    swap_worker_wake(&sw->spill);
}

void swap_after_call(struct swap *sw)
{
    paging_disk_reap(sw->pg);
    spill_wake(sw);
    if (!sw->p.auto_swap)
        return;
    uint32_t f = frames_free(sw);
    if (f >= sw->low_free)
        return;
    if (f < sw->min_free) {
        (void)swap_make_room(sw, sw->low_free, NULL, 0);  /* best effort: the call succeeded */
        if (frames_free(sw) >= sw->low_free)
            return;
    }
    if (!sw->reclaim.running)
        return;
    swap_worker_wake(&sw->reclaim);
}

void swap_after_step(struct swap *sw)
{
    pthread_mutex_lock(&sw->mu);
    sw->reclaim.futile = false;
    sw->spill.futile = false;
    pthread_mutex_unlock(&sw->mu);
    swap_after_call(sw);
}

/* One round of the reclaim thread (its worker: context current, relaxed capture mode). */
static bool reclaim_round(void *arg)
{
    struct swap *sw = arg;
    uint32_t moved = 0;
    pthread_mutex_lock(sw->lock);
    /* Nothing here records on or enqueues onto the engine stream, so a round may run
       while the engine captures a graph: swapping out the unprotected victims orders
       the copy stream after the last step's fence (paging's copies_after_engine), and
       orphan pages have no engine work left (paging_reclaim_orphans). */
    struct swap_rplan p;
    /* synchronous mode: no engine stream to order after, and a context synchronization
       from this thread would invalidate a capture on any stream of the context (issue 20):
       only sequences whose device work is known complete move */
    unsigned quiet = paging_stream(sw->pg) ? 0 : SWAP_PLAN_QUIET;
    if (!swap_reclaim_plan(sw, sw->high_free, NULL, 0,
                           SWAP_PLAN_SWAP | SWAP_PLAN_PARTIAL | quiet, &p)) {
        /* best effort: a move refused ends the round; what moved stays moved (no call
           of the engine's fails for it) */
        (void)swap_reclaim_act(sw, &p, false, &moved);
        swap_rplan_free(&p);
    }
    /* (moved: a drop's release may wait for a fence on the copy stream too) */
    int wrc = (paging_frames_pending(sw->pg) || moved)
                  ? paging_copy_fence_record(sw->pg, &sw->thread_fence) : 1;
    if (moved) {
        sw->c.reclaim_runs++;
        sw->c.reclaim_swap_outs += moved;
    }
    pthread_mutex_unlock(sw->lock);
    if (wrc == 0) {
        /* the copies complete without the lock held; then the frames are pooled */
        vmm_fence_wait(sw->v, &sw->thread_fence);
        pthread_mutex_lock(sw->lock);
        paging_reap(sw->pg);
        pthread_mutex_unlock(sw->lock);
    }

    pthread_mutex_lock(sw->lock);
    spill_wake(sw);           /* the host tier just filled up */
    pthread_mutex_unlock(sw->lock);
    return moved != 0;        /* nothing moved: nothing movable until the next step */
}

/* One round of the spill thread (its worker: relaxed capture mode). */
static bool spill_round(void *arg)
{
    struct swap *sw = arg;
    bool any = false;
    for (;;) {
        uint32_t started = 0;
        pthread_mutex_lock(sw->lock);
        paging_disk_reap(sw->pg);
        size_t f = paging_host_free(sw->pg);
        if (f < sw->host_high_free)
            swap_spill(sw, (uint32_t)(sw->host_high_free - f), 0, &started);
        if (started)
            sw->c.spill_runs++;
        pthread_mutex_unlock(sw->lock);
        if (!started)
            break;
        any = true;
        paging_disk_wait_io(sw->pg);     /* the writes complete without the lock */
    }
    pthread_mutex_lock(sw->lock);
    paging_disk_reap(sw->pg);
    pthread_mutex_unlock(sw->lock);
    return any;               /* nothing started: nothing spillable until the next step */
}

int swap_create(struct paging *pg, struct vmm *v, pthread_mutex_t *lock,
                const struct swap_params *p, struct swap **out)
{
    struct swap *sw = calloc(1, sizeof *sw);
    if (!sw)
        return -ENOMEM;
    sw->pg = pg;
    sw->v = v;
    sw->lock = lock;
    sw->p = *p;
    sw->min_free = (uint32_t)(p->min * p->frames);
    sw->low_free = (uint32_t)(p->low * p->frames);
    sw->high_free = (uint32_t)(p->high * p->frames);
    if (sw->high_free > p->frames)
        sw->high_free = p->frames;
    sw->host_min_free = (uint32_t)(p->host_min * p->host_slots);
    sw->host_low_free = (uint32_t)(p->host_low * p->host_slots);
    sw->host_high_free = (uint32_t)(p->host_high * p->host_slots);
    if (sw->host_high_free > p->host_slots)
        sw->host_high_free = p->host_slots;
    KVVM_ASSERT(sw->min_free <= sw->low_free && sw->low_free <= sw->high_free);
    KVVM_ASSERT(sw->host_min_free <= sw->host_low_free &&
                sw->host_low_free <= sw->host_high_free);
    pthread_mutex_init(&sw->mu, NULL);
    pthread_cond_init(&sw->cv, NULL);
    sw->reclaim = (struct swap_worker){ .name = "reclaim", .v = v, .make_current = true,
                                        .round = reclaim_round, .arg = sw, .mu = &sw->mu,
                                        .cv = &sw->cv, .stop = &sw->stop };
    sw->spill = (struct swap_worker){ .name = "spill", .v = v, .round = spill_round,
                                      .arg = sw, .mu = &sw->mu, .cv = &sw->cv,
                                      .stop = &sw->stop };
    int rc = 0;
    if (p->disk && p->host_slots) {
        rc = swap_worker_start(&sw->spill);
        if (rc)
            goto out_free;
    }
    if (p->auto_swap && p->thread) {
        rc = vmm_fence_create(v, &sw->thread_fence);
        if (rc)
            goto out_spill;
        sw->thread_fence_ok = true;
        rc = swap_worker_start(&sw->reclaim);
        if (rc)
            goto out_fence;
    }
    /* paging asks the host tier's choices of room.c from now on */
    paging_set_policy(pg, &(struct pg_policy_ops){ .arg = sw, .host_room = swap_host_room,
                                                    .plan = swap_plan });
    *out = sw;
    return 0;
out_fence:
    vmm_fence_destroy(v, &sw->thread_fence);
out_spill:
    swap_worker_stop(&sw->spill);
out_free:
    pthread_cond_destroy(&sw->cv);
    pthread_mutex_destroy(&sw->mu);
    free(sw);
    return rc;
}

void swap_destroy(struct swap *sw)
{
    if (!sw)
        return;
    swap_worker_stop(&sw->reclaim);       /* (the one stop flag ends both threads) */
    swap_worker_stop(&sw->spill);
    paging_set_policy(sw->pg, NULL);
    if (sw->thread_fence_ok)
        vmm_fence_destroy(sw->v, &sw->thread_fence);
    if (sw->direct_fence_ok)
        vmm_fence_destroy(sw->v, &sw->direct_fence);
    pthread_cond_destroy(&sw->cv);
    pthread_mutex_destroy(&sw->mu);
    paging_park_end(sw->pg, sw->undo.parks, sw->undo.n_parks);  /* a dead context's call's */
    free(sw->undo.e);
    free(sw->undo.parks);
    free(sw->undo.park_orph);
    free(sw->undo.orph);
    free(sw);
}

void swap_wait_idle(struct swap *sw)
{
    if (!sw || (!sw->reclaim.running && !sw->spill.running))
        return;
    pthread_mutex_lock(&sw->mu);
    while (sw->reclaim.wake || sw->reclaim.active || sw->spill.wake || sw->spill.active)
        pthread_cond_wait(&sw->cv, &sw->mu);
    pthread_mutex_unlock(&sw->mu);
}

void swap_counters(struct swap *sw, struct swap_counters *out)
{
    *out = sw->c;
}

void swap_direct_hist(struct swap *sw, struct khist *out)
{
    khist_read(&sw->direct_hist, out);
}

void swap_set_cache(struct swap *sw, const struct swap_cache_ops *ops)
{
    if (ops)
        sw->cache = *ops;
    else
        memset(&sw->cache, 0, sizeof sw->cache);
}
