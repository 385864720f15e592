/*
 * paging/paging.c: the paging context: paging_create / paging_destroy and its counters, and
 * the frame pool thread's round as the owners' steps in order (paging_feed_begin / _end: the
 * pool view's groups, the feed's plan or hand-over, the map-ahead refills), and a reclaim's
 * act run with the caller's keep set (paging_with_keep).
 *
 * paging_create sizes the context from its params (pages per slot, map-ahead bound, the
 * scratch run after the windows, the pool's refill chunk), copies the tiers' ops tables and
 * makes the slot free list and the pool. paging_destroy waits for the device, completes or
 * drops every pending release, drops every live sequence's pages and frees the fences, the
 * copy stream and the pool.
 */
#include "paging_int.h"
#include "frames.h"
#include "seqs.h"
#include "ahead.h"
#include "transfers.h"
#include "clock.h"
#include "view.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "common/log.h"

/* The hot view (paging.h) is each struct's first member: paging_hot() casts pg. */
_Static_assert(offsetof(struct paging, hot) == 0, "struct paging begins with its hot view");
_Static_assert(offsetof(struct pg_seq, hot) == 0, "struct pg_seq begins with its hot view");
_Static_assert(offsetof(struct pg_seq, used_tick) + 8 <= 64 && sizeof(struct pg_seq) % 64 == 0,
               "the hot path's fields of a sequence fit in one cache line");

const struct paging_why *paging_why(struct paging *pg, enum pg_why_op op, uint64_t frames)
{
    if (op == PG_WHY_RESET)
        pg->why.what = 0;   /* every field is read only under its PG_WHY_* bit */
    else if (op == PG_WHY_NEED && !(pg->why.what & PG_WHY_FRAMES))
        (void)pg_why_frames(pg, frames);
    return &pg->why;
}

void paging_counters(const struct paging *pg, struct paging_counters *out)
{
    *out = pg->c;
    out->pages_total = pg->p.max_frames;
    out->pages_used = pg->fr.n_used;
    out->pages_free = pg->p.max_frames - pg->fr.n_used;
    out->pages_inflight = 0;
    for (unsigned t = 0; t < PG_N_LOWER; t++)    /* moves between tiers, any two */
        out->pages_inflight += pg->xf.lower[t].n_io;
    pthread_mutex_lock((pthread_mutex_t *)&pg->fr.feed.mu);
    out->frames_held = pg->fr.n_held + pg->fr.feed.n_in + pg->fr.feed.releasing;
    pthread_mutex_unlock((pthread_mutex_t *)&pg->fr.feed.mu);
    out->deferred = pg->df.n_defer;
    for (unsigned t = 0; t < PG_N_LOWER; t++)
        out->pages_lower[t] = pg->xf.lower[t].n_slots;
    out->orphans = tier_orphans(pg);
    out->nonresident = pg->sq.n_out;
}

int paging_create(struct vmm *v, const struct paging_params *p, struct paging **out)
{
    /* 64-byte aligned, as the sequences' array: the hot view (paging.h, the first 40 bytes)
       is one cache line whatever the struct's size (calloc aligns to 16 only) */
    size_t pg_bytes = (sizeof(struct paging) + 63) & ~(size_t)63;
    struct paging *pg = aligned_alloc(64, pg_bytes);
    if (!pg)
        return -ENOMEM;
    memset(pg, 0, pg_bytes);
    pg->v = v;
    pg->p = *p;
    /* the tiers below: a tier is there when it and every tier above it are */
    for (unsigned t = 0; t < PG_N_LOWER && p->tier[t]; t++) {
        pg->xf.lower[t].ops = *p->tier[t];
        pg->p.tier[t] = &pg->xf.lower[t].ops;
    }
    for (unsigned t = 0; t < PG_N_LOWER; t++) {
        if (!lower_on(pg, t))
            pg->p.tier[t] = NULL;
        pg->xf.lower[t].hint = PG_SLOT_NONE;
    }
    pg->room_gen = 1;
    pg->pages_per_slot = (uint32_t)(p->slot_bytes / p->page_size);
    if (pg->p.map_ahead > pg->pages_per_slot)
        pg->p.map_ahead = pg->pages_per_slot;
    pg->scratch_va = p->base + (uint64_t)p->n_regions * p->max_seqs * p->slot_bytes;
    pg->fr.chunk = p->max_frames < 8 ? p->max_frames : 8;
    if (pg->fr.chunk < 2 * p->n_regions)
        pg->fr.chunk = p->max_frames < 2 * p->n_regions ? p->max_frames : 2 * p->n_regions;
    /* 64-byte aligned: each sequence's hot view (paging.h) is one cache line */
    pg->seqs = aligned_alloc(64, (size_t)p->max_seqs * sizeof *pg->seqs);
    if (pg->seqs)
        memset(pg->seqs, 0, (size_t)p->max_seqs * sizeof *pg->seqs);
    pg->n_slots = p->max_seqs;
    pg->seq_size = sizeof *pg->seqs;
    /* the copy run's blocks, all free */
    pg->df.copy_free = malloc((p->copy_blocks ? p->copy_blocks : 1) * sizeof *pg->df.copy_free);
    for (uint32_t i = 0; pg->df.copy_free && i < p->copy_blocks; i++)
        pg->df.copy_free[i] = p->copy_blocks - 1 - i;
    pg->df.n_copy_free = p->copy_blocks;
    int rc = -ENOMEM;
    if (!pg->seqs || !pg->df.copy_free)
        goto out_free;
    for (uint32_t i = 0; i < p->max_seqs; i++) {
        pg->seqs[i].gen = 1;
        pg->seqs[i].next_free = i + 2 <= p->max_seqs ? i + 2 : 0;
    }
    pg->sq.slot_free_head = 1;
    rc = pool_init(pg);
    if (!rc && (rc = view_init(pg)) != 0)
        pool_fini(pg);
    if (rc)
        goto out_free;
    if (p->prealloc || !p->feed)
        pool_refill(pg, p->prealloc ? p->max_frames : pg->fr.chunk);
    if (!p->feed)
        paging_view_prepare(pg);
    if (p->prealloc && pg->fr.n_held < p->max_frames && !vmm_dead(v)) {
        rc = -ENOMEM;
        goto out_pool;
    }
    if (vmm_dead(v)) {
        rc = -EIO;
        goto out_pool;
    }
    *out = pg;
    return 0;
out_pool:
    view_fini(pg);
    pool_fini(pg);
out_free:
    free(pg->df.copy_free);
    free(pg->seqs);
    free(pg);
    return rc;
}

void paging_destroy(struct paging *pg)
{
    if (!pg)
        return;
    ahead_settle(pg, false);        /* (the frame pool thread, stopped, left none) */
    vmm_device_sync(pg->v);
    pg->ck.quiet_below = pg->epoch + 1;
    defer_reap(pg, true);
    defer_drop_all(pg);             /* what the reap could not complete (a dead context) */
    for (uint32_t i = 0; i < pg->p.max_seqs; i++) {
        struct pg_seq *s = &pg->seqs[i];
        if (s->live && s->out) {
            tier_drop_out(pg, s, 0, s->n_pages);
        } else if (s->live) {
            ahead_drop(pg, s, 0);
            s->used_valid = 0;
            defer_release(pg, s, 0, s->n_pages);
        }
        free(s->bt);
        free(s->bid);
        free(s->ahead);
        free(s->kept);
    }
    ahead_fini(pg);
    if (pg->ck.step_fence_ok)
        vmm_fence_destroy(pg->v, &pg->ck.step_fence);
    if (pg->ck.order_fence_ok)
        vmm_fence_destroy(pg->v, &pg->ck.order_fence);
    if (pg->ck.copy_fence_ok)
        vmm_fence_destroy(pg->v, &pg->ck.copy_fence);
    if (pg->ck.copy_stream)
        vmm_stream_destroy(pg->v, pg->ck.copy_stream);
    view_fini(pg);                  /* every view slot unmapped before the frames go */
    pool_fini(pg);
    park_fini(pg);
    free(pg->df.copy_free);
    free(pg->seqs);
    free(pg);
}

/* ---- the budget: the pool's releases, the pool view's unmaps before them -------------- */

/* Before releasing the ready frames above keep: the pool view's slots that map some of them
   (ended ids; live ids' slots whose frame their block no longer has: view_end_stale) are
   unmapped where no device work may use them any more, and with wait, when that leaves
   fewer than the release wants, after a synchronization (the engine stream's; sync mode:
   the device's) — never while the engine stream captures a graph, which a synchronization
   would break: those frames then stay, held (the driver would keep their memory anyway).
   Here, in the context's owner, because it spans two owners: the clock's view_reap, then
   the frames' release (the pool calls no owner above it). */
static void ready_unpin(struct paging *pg, uint32_t keep, bool wait)
{
    if (pg->fr.n_ready <= keep || !pool_ready_pinned(pg))
        return;
    view_end_stale(pg);
    (void)view_reap(pg, false);
    if (!wait || pool_ready_pinned(pg) <= keep ||
        (pg->ck.stream && vmm_stream_check_capture(pg->v, pg->ck.stream)))
        return;
    if (view_reap(pg, true))
        klog_debug("paging: a synchronization for the pool view's unmaps failed: the frames "
                   "it still maps stay held");
}

int paging_set_budget(struct paging *pg, uint32_t frames, uint32_t *released)
{
    *released = 0;
    if (frames < pg->p.n_regions || frames > pg->fr.cap_frames)
        return -EINVAL;
    if (pg->fr.n_used > frames)
        return -ENOMEM;
    if (pg->fr.n_held > frames) {
        uint32_t over = pg->fr.n_held - frames;
        uint32_t keep = pg->fr.n_ready > over ? pg->fr.n_ready - over : 0;
        ready_unpin(pg, keep, true);
        *released += pool_release_ready(pg, keep);
    }
    if (pg->fr.n_held > frames) {
        pool_drop_all_ahead(pg);
        ready_unpin(pg, frames - pg->fr.n_used, true);
        *released += pool_release_ready(pg, frames - pg->fr.n_used);
    }
    /* a release, an unmap or the synchronization before it that the driver refused: the
       budget stays (unused frames released meanwhile are only reserve; they are created
       again on need). -EIO says the context is dead: only when it is; a refusal is
       transient, -ENOMEM as for a shrink that cannot be made */
    if (pg->fr.n_held > frames)
        return vmm_dead(pg->v) ? -EIO : -ENOMEM;
    pool_set_max_frames(pg, frames);
    return 0;
}

uint32_t paging_give(struct paging *pg, uint32_t n)
{
    uint32_t unused = pg->fr.n_ready + pg->fr.n_ahead;
    return n ? paging_trim(pg, unused > n ? unused - n : 0) : 0;
}

uint32_t paging_trim(struct paging *pg, uint32_t keep)
{
    pool_feed_suppress(pg);
    if (pg->fr.n_ahead && pg->fr.n_ready + pg->fr.n_ahead > keep)
        pool_drop_all_ahead(pg);
    ready_unpin(pg, keep, true);
    return pool_release_ready(pg, keep);
}

/* ---- the frame pool thread's round as one operation (paging.h, paging_feed_begin) ---- */

int paging_feed_begin(struct paging *pg, uint32_t fill, uint32_t keep, struct pg_feed_plan *pl)
{
    paging_view_prepare(pg);          /* groups a grow took: from the ready frames, then refill */
    int rc = paging_feed_plan(pg, fill, keep, pl);
    pl->ready = paging_pool_ready(pg);
    pl->ahead = (rc || (!pl->create && !pl->release)) && paging_ahead_plan(pg);
    return rc;
}

bool paging_feed_end(struct paging *pg)
{
    paging_feed_drain(pg);
    paging_view_prepare(pg);          /* the pool view's groups, off the engine's thread */
    return paging_ahead_plan(pg);
}

int paging_with_keep(struct paging *pg, const uint64_t *keep, size_t n, int (*fn)(void *),
                     void *arg)
{
    paging_disk_keep(pg, keep, n);
    int rc = fn(arg);
    paging_disk_keep(pg, NULL, 0);
    return rc;
}
