/*
 * paging/defer.c: releases that wait for device work, and the ordering helpers.
 *
 * The rule (docs/api.md "Protection and residency"): the engine touches a sequence's memory only
 * while it is protected, i.e. between a call that uses it (used_epoch = epoch) and the next
 * step. So a window range may be unmapped and its pages released at once when
 *   - the sequence was never used, or
 *   - it was used before an epoch whose end is known complete (quiet_below: advanced by a
 *     device synchronization, or by the step fence found complete by query).
 * and no swap copy of the library's (a transfer job on the copy stream: a prefetch's copies
 * are not behind the step fence) may still touch the window.
 * Otherwise: with no engine stream, the device is synchronized first (the call blocks);
 * with an engine stream, a fence is recorded on it now and the release waits in the
 * pending list, reaped by step / sync / when the pool or a slot needs it. That fence also
 * covers s's transfer jobs: every call that releases pages of s orders the engine stream
 * after them first (defer_settle; a swap-in that is not a prefetch does it at once).
 */
#include "paging_int.h"
#include "frames.h"
#include "seqs.h"
#include "transfers.h"
#include "clock.h"
#include "view.h"
#include "window.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "common/log.h"

/* Whether a transfer job of s (a swap copy on the copy stream into or out of its window)
   may still run. The step fence does not cover those copies (a prefetch's are not ordered
   before the engine's later work), so they are asked for by their own fences. */
static bool defer_jobs_busy(struct paging *pg, struct pg_seq *s)
{
    if (!s->n_defer)
        return false;
    uint32_t slot = pg_slot_of(pg, s);
    for (struct pg_defer *d = pg->df.defer; d; d = d->next)
        if (d->slot == slot && d->kind != DF_RELEASE && d->fence.ev &&
            vmm_fence_query(pg->v, &d->fence) != 1)
            return true;
    return false;
}

/* Whether no device work may touch s's window any more: neither the engine's (the rule
   above) nor the library's own swap copies. */
bool defer_quiet(struct paging *pg, struct pg_seq *s)
{
    if (defer_jobs_busy(pg, s))
        return false;
    if (!s->used_valid || s->used_epoch < pg->ck.quiet_below)
        return true;
    if (s->used_epoch >= pg->epoch || !pg->ck.stream || !pg->ck.step_recorded)
        return false;
    if (vmm_fence_query(pg->v, &pg->ck.step_fence) != 1)
        return false;
    pg->ck.quiet_below = pg->ck.step_fence_epoch;
    return s->used_epoch < pg->ck.quiet_below;
}

/* A transfer job's page transitions after its fence (DF_OUT: TO_HOST -> HOST, the frame
   back to the pool; DF_IN: TO_DEVICE -> DEVICE, the host slot freed). */
static void job_complete_pages(struct paging *pg, struct pg_defer *d)
{
    for (uint32_t i = 0; i < d->n; i++) {
        if (pg_page_is_none(d->pages[i]))
            continue;                   /* a hole (discard.c) */
        struct pg_page *p = page_at(pg, d->pages[i]);
        page_job_done(pg, d->pages[i]);
        page_count(pg, p, -1);
        if (d->kind == DF_OUT && p->tier == PG_TIER_TO_HOST) {
            page_frame_drop(pg, p);
            page_set_tier(p, PG_TIER_HOST);
            lower_io_done(pg, PG_LOWER_HOST);
        } else if (d->kind == DF_IN && p->tier == PG_TIER_TO_DEVICE) {
            page_release_slot(pg, p, PG_LOWER_HOST);
            page_set_tier(p, PG_TIER_DEVICE);
            lower_io_done(pg, PG_LOWER_HOST);
        }
        page_count(pg, p, 1);
    }
}

/* Completes d: unmaps [first, end) in every region of its slot (a copy out: its run
   block), finishes the page transitions of a swap job, drops the page references. */
static int release_now(struct paging *pg, struct pg_defer *d)
{
    uint32_t n = d->end - d->first, r = 0;
    if (d->kind == DF_COPY) {
        int rc = win_unmap(pg, pg_copy_va(pg, d->first), pg->p.n_regions);
        if (rc)
            return rc;                  /* kept pending: nothing changed */
        defer_copy_run_give(pg, d->first);
    }
    /* the first unmap may fail cleanly; once one region is unmapped the rest must follow.
       PG_PAGE_NONE entries are holes (discarded pages, or a region a discard leaves
       alone): not mapped, no page held */
    if (n && d->kind != DF_IN) {
        for (; r < pg->p.n_regions; r++) {
            const pg_page_id *ids = d->pages + (size_t)r * n;
            uint32_t i = 0;
            while (i < n && pg_page_is_none(ids[i]))
                i++;
            if (i == n)
                continue;
            int rc = win_unmap_holes(pg, pg_va(pg, r, d->slot, d->first), ids, n);
            if (rc)
                return rc;
            break;
        }
        for (r++; r < pg->p.n_regions; r++)
            win_unmap_holes_must(pg, pg_va(pg, r, d->slot, d->first),
                                 d->pages + (size_t)r * n, n);
    }
    if (d->kind == DF_OUT || d->kind == DF_IN)
        job_complete_pages(pg, d);
    for (uint32_t i = 0; i < d->n; i++)
        if (!pg_page_is_none(d->pages[i]))
            page_put(pg, d->pages[i]);
    return 0;
}

/* region UINT32_MAX: every region; else the other regions' entries are PG_PAGE_NONE (left
   alone). */
static void gather_pages(struct paging *pg, struct pg_seq *s, uint32_t region, uint32_t first,
                         uint32_t end, pg_page_id *out)
{
    uint32_t n = end - first;
    for (uint32_t r = 0; r < pg->p.n_regions; r++)
        if (region == UINT32_MAX || r == region)
            memcpy(out + (size_t)r * n, pg_bt(pg, s, r) + first, n * sizeof *out);
        else
            memset(out + (size_t)r * n, 0, n * sizeof *out);
}

bool paging_seq_quiet(struct paging *pg, uint64_t h)
{
    struct pg_seq *s;
    return !seq_lookup(pg, h, &s) && defer_quiet(pg, s);
}

int defer_release(struct paging *pg, struct pg_seq *s, uint32_t first, uint32_t end)
{
    return defer_release_region(pg, s, UINT32_MAX, first, end, false);
}

/* An unprotected s in stream mode whose work may still run: d waits for a fence recorded
   on the library's copy stream after the step fence (which covers s's work), so nothing is
   recorded on the engine stream. -EBUSY no step fence to order after. */
static int fence_after_step(struct paging *pg, struct pg_seq *s, struct pg_defer *d)
{
    if (!pg->ck.step_recorded || (s->used_valid && s->used_epoch >= pg->epoch))
        return -EBUSY;
    int rc = vmm_fence_create(pg->v, &d->fence);
    if (rc)
        return rc;
    rc = paging_copy_fence_record(pg, &d->fence);       /* makes the copy stream */
    if (!rc)
        rc = vmm_stream_after(pg->v, paging_copy_stream(pg), &pg->ck.step_fence);
    if (!rc)
        rc = vmm_fence_record(pg->v, &d->fence, paging_copy_stream(pg));
    if (rc)
        vmm_fence_destroy(pg->v, &d->fence);
    return rc;
}

static int release_region(struct paging *pg, struct pg_seq *s, uint32_t region, uint32_t first,
                          uint32_t end, bool lib)
{
    uint32_t n = end - first;
    size_t np = (size_t)n * pg->p.n_regions;
    struct pg_defer *d = malloc(sizeof *d + np * sizeof d->pages[0]);
    if (!d)
        return -ENOMEM;
    gather_pages(pg, s, region, first, end, d->pages);
    d->kind = DF_RELEASE;
    d->n = (uint32_t)np;
    d->slot = pg_slot_of(pg, s);
    d->first = first;
    d->end = end;
    int rc = 0;
    if (!defer_quiet(pg, s) && !pg->ck.stream)
        rc = pg_device_sync(pg);
    if (rc)
        goto out_free;
    if (!pg->ck.stream || defer_quiet(pg, s)) {
        rc = release_now(pg, d);
        goto out_free;
    }
    if (lib) {
        if ((rc = fence_after_step(pg, s, d)))
            goto out_free;
        goto out_queue;
    }
    rc = vmm_fence_create(pg->v, &d->fence);
    if (rc)
        goto out_free;
    rc = vmm_fence_record(pg->v, &d->fence, pg->ck.stream);
    if (rc)
        goto out_fence;
out_queue:
    d->next = pg->df.defer;
    pg->df.defer = d;
    pg->df.n_defer++;
    s->n_defer++;
    return 0;
out_fence:
    vmm_fence_destroy(pg->v, &d->fence);
out_free:
    free(d);
    return rc;
}

int defer_release_region(struct paging *pg, struct pg_seq *s, uint32_t region, uint32_t first,
                         uint32_t end, bool lib)
{
    if (first >= end)
        return 0;
    int rc = release_region(pg, s, region, first, end, lib);
    if (!rc)        /* the pool view's ids go under the same fence rule (view.c) */
        view_release(pg, s, region, first, end);
    return rc;
}

void defer_add(struct paging *pg, struct pg_seq *s, struct pg_defer *d, bool complete)
{
    pg->df.n_defer++;
    s->n_defer++;
    if (complete && defer_complete(pg, d) == 0)
        return;
    d->next = pg->df.defer;
    pg->df.defer = d;
}

/* Completes one pending entry (its fence has completed). */
int defer_complete(struct paging *pg, struct pg_defer *d)
{
    int rc = release_now(pg, d);
    if (rc)
        return rc;
    if (d->slot == PG_COPY_SLOT) {      /* a copy out: no sequence's */
        vmm_fence_destroy(pg->v, &d->fence);
        KVVM_ASSERT(pg->df.n_defer > 0);
        pg->df.n_defer--;
        free(d);
        return 0;
    }
    struct pg_seq *s = &pg->seqs[d->slot];
    if (s->in_job == d)
        s->in_job = NULL;
    vmm_fence_destroy(pg->v, &d->fence);
    KVVM_ASSERT(pg->df.n_defer > 0 && s->n_defer > 0);
    pg->df.n_defer--;
    if (--s->n_defer == 0 && s->dying)
        seq_slot_release(pg, s);
    free(d);
    return 0;
}

/* Reaps entries matching slot (UINT32_MAX = any) and, with jobs_only, only transfer jobs;
   wait: block on each fence. */
static int reap_kind(struct paging *pg, uint32_t slot, bool wait, bool jobs_only)
{
    struct pg_defer **pp = &pg->df.defer;
    while (*pp) {
        struct pg_defer *d = *pp;
        if ((slot != UINT32_MAX && d->slot != slot) || (jobs_only && d->kind == DF_RELEASE)) {
            pp = &d->next;
            continue;
        }
        /* no fence: a job whose copies were waited for, its completion retried */
        int q = !d->fence.ev ? 1 : wait ? vmm_fence_wait(pg->v, &d->fence)
                                        : vmm_fence_query(pg->v, &d->fence);
        if (q < 0)
            return q;
        if (!wait && q == 0) {
            pp = &d->next;
            continue;
        }
        *pp = d->next;
        int rc = defer_complete(pg, d);
        if (rc) {
            d->next = *pp;       /* keep it pending: nothing of it was lost */
            *pp = d;
            return rc;
        }
    }
    return 0;
}

void defer_drop_all(struct paging *pg)
{
    bool dead = vmm_dead(pg->v);
    while (pg->df.defer) {
        struct pg_defer *d = pg->df.defer;
        pg->df.defer = d->next;
        uint32_t w = d->end - d->first;
        if (d->kind == DF_COPY) {
            if (!dead)
                win_unmap_must(pg, pg_copy_va(pg, d->first), pg->p.n_regions);
            defer_copy_run_give(pg, d->first);
        } else if (!dead && d->kind != DF_IN) {
            for (uint32_t r = 0; r < pg->p.n_regions; r++)
                win_unmap_holes_must(pg, pg_va(pg, r, d->slot, d->first),
                                     d->pages + (size_t)r * w, w);
        }
        if (d->kind == DF_OUT || d->kind == DF_IN)
            job_complete_pages(pg, d);
        for (uint32_t i = 0; i < d->n; i++)
            if (!pg_page_is_none(d->pages[i]))     /* none: a hole */
                page_put(pg, d->pages[i]);
        vmm_fence_destroy(pg->v, &d->fence);
        pg->df.n_defer--;
        if (d->slot == PG_COPY_SLOT) {
            free(d);
            continue;
        }
        struct pg_seq *s = &pg->seqs[d->slot];
        if (s->in_job == d)
            s->in_job = NULL;
        s->n_defer--;
        free(d);
    }
}

static int reap(struct paging *pg, uint32_t slot, bool wait)
{
    return reap_kind(pg, slot, wait, false);
}

int defer_flush_jobs(struct paging *pg, uint32_t slot)
{
    if (slot == PG_COPY_SLOT)           /* a copy out's (tier_wait_all_jobs): every job */
        return reap_kind(pg, UINT32_MAX, true, true);
    return pg->seqs[slot].n_defer ? reap_kind(pg, slot, true, true) : 0;
}

int defer_copy_run_take(struct paging *pg, uint32_t *run)
{
    /* the copies whose runs are taken complete in order on the copy stream: those done
       give theirs back at once (the store gives its staging slot back only after its copy
       completed, so a free slot finds a run block free or done: copy_blocks = slots) */
    if (!pg->df.n_copy_free && pg->df.defer) {
        int rc = defer_reap(pg, false);
        if (rc)
            return rc;
    }
    if (!pg->df.n_copy_free)
        return -EAGAIN;
    *run = pg->df.copy_free[--pg->df.n_copy_free];
    return 0;
}

void defer_copy_run_give(struct paging *pg, uint32_t run)
{
    KVVM_ASSERT(run < pg->p.copy_blocks && pg->df.n_copy_free < pg->p.copy_blocks);
    pg->df.copy_free[pg->df.n_copy_free++] = run;
}

void defer_copy_add(struct paging *pg, struct pg_defer *d)
{
    KVVM_ASSERT(d->kind == DF_COPY && d->slot == PG_COPY_SLOT);
    d->next = pg->df.defer;
    pg->df.defer = d;
    pg->df.n_defer++;
}

int defer_reap(struct paging *pg, bool wait)
{
    return pg->df.defer ? reap(pg, UINT32_MAX, wait) : 0;
}

int defer_flush_slot(struct paging *pg, uint32_t slot)
{
    return pg->seqs[slot].n_defer ? reap(pg, slot, true) : 0;
}

int defer_flush_slot_from(struct paging *pg, uint32_t slot, uint32_t idx)
{
    if (!pg->seqs[slot].n_defer)
        return 0;
    for (const struct pg_defer *d = pg->df.defer; d; d = d->next)
        if (d->slot == slot && (d->kind != DF_RELEASE || d->end > idx))
            return reap(pg, slot, true);
    return 0;               /* only releases below idx (discards): nothing to wait for */
}

int pg_order_before_copy(struct paging *pg)
{
    return pg->ck.stream ? 0 : pg_device_sync(pg);
}

int pg_order_before_copy_seq(struct paging *pg, struct pg_seq *s, uint32_t r, uint32_t i0,
                             uint32_t i1)
{
    if (pg->ck.stream)
        return 0;
    if (!defer_quiet(pg, s))
        return pg_device_sync(pg);
    for (struct pg_bt_iter it = bt_range(pg, s, r, r + 1, i0, i1 < s->n_pages ? i1 : s->n_pages);
         bt_next(&it);)
        if (page_sharers(page_at(pg, it.id)) > 1)
            return pg_device_sync(pg);    /* another holder may be in use */
    return 0;
}

int pg_finish_copy(struct paging *pg)
{
    return vmm_stream_sync(pg->v, pg->ck.stream);
}

int pg_wait_engine(struct paging *pg)
{
    return pg->ck.stream ? vmm_stream_sync(pg->v, pg->ck.stream) : pg_device_sync(pg);
}

/* (clock.h) the engine stream waits for s's prefetch (its DF_IN job's fence). */
int defer_settle(struct paging *pg, struct pg_seq *s)
{
    struct pg_defer *d = s->in_job;
    if (!d)
        return 0;
    int rc;
    if (pg->ck.stream) {
        rc = vmm_stream_after(pg->v, pg->ck.stream, &d->fence);
        if (!rc)
            s->in_job = NULL;
        return rc;
    }
    return defer_flush_slot(pg, pg_slot_of(pg, s));
}
