/*
 * paging/host_in.c: sequence swap-in, the host/disk -> device move of the host tier (contract
 * in paging.h, "host tier"; the shared steps are in host_tier.c).
 *
 * Every page is mapped again at the same window addresses: a page still on the device in its
 * own frame, a host page in a fresh frame with a host -> device copy on the copy stream. Disk
 * pages are read back into host slots first (paging_disk_unspill). A DF_IN job completes the move
 * (host slots freed) when its fence has completed; the engine stream waits for that fence (or,
 * synchronous mode, the call waits).
 *
 * Staging (disk tier): when s has more disk pages than the host tier can hold at once
 * (in_plan), they come back in batches through the free host slots (swap_in_staged), or
 * through one borrowed slot when none can be had. Synchronous; every page keeps its tier
 * until everything is in place, so undoing a failure is unmapping and pooling the fresh
 * frames.
 */
#include "paging_int.h"
#include "frames.h"
#include "seqs.h"
#include "transfers.h"
#include "clock.h"
#include "window.h"

#include <errno.h>
#include <stdlib.h>
#include "common/log.h"

/* Whether the ordinary swap-in of s can read its disk pages into host slots at once
   (paging_disk_unspill, spilling others' host pages for room) or must be staged: the policy
   chooses (tier_plan) from the room facts. Waits for disk I/O on s's pages first.
   -EBADMSG a page of s is damaged. */
static int in_plan(struct paging *pg, struct pg_seq *s, bool *staged)
{
    *staged = false;
    uint32_t nr = pg->p.n_regions, np = s->n_pages, nd = 0;
    for (uint32_t r = 0; r < nr; r++)
        paging_disk_settle(pg, pg_bt(pg, s, r), np);
    paging_disk_reap(pg);
    for (uint32_t r = 0; r < nr; r++) {
        uint32_t k;
        int rc = paging_disk_damaged(pg, pg_bt(pg, s, r), np, &k);
        if (rc)
            return rc;
        nd += k;
    }
    if (!nd)
        return 0;
    /* host slots held only by transfers already started come free (or spillable) once they
       complete: wait for them rather than stage or fail for want of a slot */
    if (nd > paging_host_free(pg) && pg->xf.lower[PG_LOWER_HOST].n_io) {
        int rc = tier_wait_all_jobs(pg);
        if (rc)
            return rc;
    }
    struct pg_room room;
    tier_room(pg, s, nd, &room);
    int mv = tier_plan(pg, true, &room);
    if (mv < 0)
        return mv;
    *staged = mv == PG_MOVE_STAGED;
    return 0;
}

bool tier_stage_must_borrow(struct paging *pg, struct pg_seq *s)
{
    const struct pg_lower *d = &pg->xf.lower[PG_LOWER_DISK];
    if (lower_room(pg, PG_LOWER_HOST) || d->n_io)
        return false;
    return d->off || !lower_room(pg, PG_LOWER_DISK) || !paging_disk_spillable(pg, s);
}

/* A host page whose slot can be borrowed (no transfer on it), or PG_PAGE_NONE. */
static pg_page_id borrow_page(struct paging *pg)
{
    for (uint32_t i = 0; i < pg->p.max_pages; i++) {
        const struct pg_page *p = &pg->pd.pages[i];
        if (p->refs && p->tier == PG_TIER_HOST && !p->jobs && p->staged == STG_NONE)
            return (pg_page_id){ i + 1 };
    }
    return PG_PAGE_NONE;
}

/* Copies the borrowed page's slot into frame f (mapped at the scratch page) and waits, or
   (back) the frame into the slot and unmaps it. Synchronous. */
static int borrow_park(struct paging *pg, pg_page_id id, pg_frame_id f, bool back)
{
    pg_slot hs = page_at(pg, id)->slot[PG_LOWER_HOST];
    int rc = 0;
    if (!back && (rc = win_map_frames(pg, pg->scratch_va, &f, 1)))
        return rc;
    rc = back ? tier_copy_out(pg, hs, pg->scratch_va) : tier_copy_in(pg, pg->scratch_va, hs);
    rc = tier_copy_finish(pg, rc);
    if (back || rc)
        win_unmap_must(pg, pg->scratch_va, 1);
    if (!rc && back)
        pg->c.bytes_to_host += pg->p.page_size;
    else if (!rc)
        pg->c.bytes_to_device += pg->p.page_size;
    if (rc && back)
        klog_error("paging: restoring host page %u from its parking frame failed (%d)", id.v,
                   rc);
    return rc;
}

/* s's disk pages in window order: ids, window addresses and disk slots; returns how many. */
static uint32_t in_disk_pages(struct paging *pg, struct pg_seq *s, pg_page_id *ids,
                              uint64_t *vas, pg_slot *ds)
{
    uint32_t k = 0, slot = pg_slot_of(pg, s);
    for (struct pg_bt_iter it = bt_all(pg, s); bt_next(&it);) {
        const struct pg_page *p = page_at(pg, it.id);
        if (p->tier == PG_TIER_DISK) {
            ids[k] = it.id;
            vas[k] = pg_va(pg, it.r, slot, it.i);
            ds[k++] = p->slot[PG_LOWER_DISK];
        }
    }
    return k;
}

/* The batches of a staged swap-in: each reads up to bmax disk pages into host slots (its
   own, or the borrowed page bw's), copies them to the device, waits and frees its slots. */
static int staged_in_batches(struct paging *pg, const pg_page_id *ids, const uint64_t *vas,
                             const pg_slot *ds, uint32_t ndk, uint32_t bmax, pg_slot *hs,
                             pg_page_id bw)
{
    for (uint32_t b = 0; b < ndk; b += bmax) {
        uint32_t m = ndk - b < bmax ? ndk - b : bmax;
        int rc = 0;
        if (!pg_page_is_none(bw))
            for (uint32_t j = 0; j < m; j++)
                hs[j] = page_at(pg, bw)->slot[PG_LOWER_HOST];
        else if ((rc = lower_take(pg, PG_LOWER_HOST, m, hs)))
            return rc;
        rc = paging_disk_stage_io(pg, false, ids + b, ds + b, hs, m);
        for (uint32_t j = 0; j < m && !rc; j++)
            rc = tier_copy_in(pg, vas[b + j], hs[j]);
        rc = tier_copy_finish(pg, rc);  /* the slots are reused next, or the window unmapped */
        if (pg_page_is_none(bw))
            lower_give(pg, PG_LOWER_HOST, hs, m);
        if (rc)
            return rc;
    }
    return 0;
}

/* Commit of a swap-in: s's entries map again (offs); each page coming back takes the next
   fresh frame. Staged (d NULL): a host or disk page becomes DEVICE, its slot freed. Direct:
   a host page becomes TO_DEVICE and the job d names it and the pages another's swap-in
   still brings in. Nothing fails. */
static void in_commit(struct paging *pg, struct pg_seq *s, struct pg_defer *d,
                      const pg_frame_id *fresh)
{
    uint32_t k = 0, j = 0;
    for (struct pg_bt_iter it = bt_all(pg, s); bt_next(&it);) {
        pg_page_id id = it.id;
        struct pg_page *p = page_at(pg, id);
        page_go_on(pg, id);             /* s's entry was a non-resident one */
        page_count(pg, p, -1);
        if (d && p->tier == PG_TIER_TO_DEVICE && j < d->n)
            d->pages[j++] = id;                   /* another's copy: ordered after it */
        if (p->tier == PG_TIER_HOST || (!d && p->tier == PG_TIER_DISK)) {
            page_frame_set(pg, id, fresh[k++]);
            if (d) {
                page_set_tier(p, PG_TIER_TO_DEVICE);
                pg->xf.lower[PG_LOWER_HOST].n_io++;
                d->pages[j++] = id;
            } else {
                page_release_slot(pg, p, (unsigned)lower_of(p->tier));
                page_set_tier(p, PG_TIER_DEVICE);
            }
        }
        page_count(pg, p, 1);
    }
    if (d)
        d->n = j;
    tier_seq_in(pg, s);
    pg->c.bytes_to_device += (uint64_t)k * pg->p.page_size;
}

/* Frames and a host slot for a staged swap-in of s moving need pages (ndk from disk): the
   borrowed page (*bw, PG_PAGE_NONE = none) and the batch size (*bmax). -ENOMEM. */
static int staged_in_room(struct paging *pg, struct pg_seq *s, uint32_t need, uint32_t ndk,
                          pg_page_id *bw, uint32_t *bmax)
{
    int rc;
    bool borrow = tier_stage_must_borrow(pg, s);
    *bw = borrow ? borrow_page(pg) : PG_PAGE_NONE;
    uint32_t extra = pg_page_is_none(*bw) ? 0 : 1;
    if (pg_page_is_none(*bw) && borrow)
        return -ENOMEM;
    if (pool_available(pg) < need + extra && pg->df.defer && (rc = defer_reap(pg, true)))
        return rc;
    if (pool_available(pg) < need + extra)
        return pg_why_frames(pg, need + extra);
    if (pg_page_is_none(*bw) && !paging_host_free(pg) &&
        (rc = paging_host_room(pg, 1, seq_handle(pg, s))))
        return rc;                      /* (pressure relief: spills another's host page) */
    *bmax = pg_page_is_none(*bw) ? (uint32_t)paging_host_free(pg) : 1;
    if (*bmax > ndk)
        *bmax = ndk;
    return 0;
}

/* A staged swap-in: s has more disk pages than the host tier can hold at once. Every page
   is mapped again in fresh frames first; host pages are copied host -> device; disk pages
   come back in batches of the free host slots (read, checksum verified, copied to the
   device, slots freed, next batch). Synchronous in every mode (async included): the bytes
   are in place on return, no copy is left for the engine stream to wait for. The pages
   keep their tiers until everything is in place; a failure unmaps the window, pools the
   fresh frames and frees the staging slots: s stays wholly non-resident, nothing changed
   (except that a page whose read failed is damaged, as for any failed read back:
   -EBADMSG). When no host slot can be had, one is borrowed (tier_stage_must_borrow) and
   the batches are of one page. -ENOMEM not enough frames or no host slot to stage through;
   -EIO. */
static int swap_in_staged(struct paging *pg, struct pg_seq *s)
{
    uint32_t nr = pg->p.n_regions, np = s->n_pages, slot = pg_slot_of(pg, s);
    uint32_t need = tier_count(pg, s, PG_TIER_HOST) + tier_count(pg, s, PG_TIER_DISK);
    uint32_t ndk = tier_count(pg, s, PG_TIER_DISK), bmax;
    pg_page_id bw;
    int rc = staged_in_room(pg, s, need, ndk, &bw, &bmax);
    if (rc)
        return rc;
    uint32_t extra = pg_page_is_none(bw) ? 0 : 1;
    pg_frame_id *fr = calloc((size_t)nr * np + need + 1, sizeof *fr);
    pg_page_id *ids = calloc((size_t)ndk + 1, sizeof *ids);
    uint64_t *vas = calloc((size_t)ndk + 1, sizeof *vas);
    pg_slot *ds = calloc((size_t)ndk + 1, sizeof *ds);
    pg_slot *hs = calloc((size_t)bmax + 1, sizeof *hs);
    uint32_t mark = pg->fr.n_created;
    rc = -ENOMEM;
    if (!fr || !ids || !vas || !ds || !hs)
        goto out_free;
    pg_frame_id *fresh = fr + (size_t)nr * np;
    if ((rc = pool_take(pg, need + extra, fresh)))
        goto out_rollback;
    if (!pg_page_is_none(bw) && (rc = borrow_park(pg, bw, fresh[need], false))) {
        pool_give(pg, fresh, need + extra);
        goto out_rollback;
    }
    tier_window_frames(pg, s, fresh, true, fr);
    in_disk_pages(pg, s, ids, vas, ds);
    if ((rc = tier_map_window(pg, slot, np, fr)))
        goto out_give;
    rc = tier_copy_host_in(pg, s);
    /* a borrowed slot may be one of s's host pages: its copy is done before it is reused */
    if (!rc && !pg_page_is_none(bw))
        rc = vmm_stream_sync(pg->v, pg->ck.copy_stream);
    if (!rc)
        rc = staged_in_batches(pg, ids, vas, ds, ndk, bmax, hs, bw);
    if (!rc)
        rc = vmm_stream_sync(pg->v, pg->ck.copy_stream);
    if (!rc && !pg_page_is_none(bw)) {
        extra = 0;                      /* unmapped by borrow_park, success or not */
        rc = borrow_park(pg, bw, fresh[need], true);
        pool_give(pg, fresh + need, 1);
    }
    if (rc) {
        (void)tier_copy_finish(pg, rc);   /* the copies made write into the window */
        tier_unmap_window_must(pg, slot, np, fr, nr);
        goto out_give;
    }
    in_commit(pg, s, NULL, fresh);
    pg->c.unspills += ndk;
    pg->c.bytes_from_disk += (uint64_t)ndk * pg->p.page_size;
    goto out_free;

out_give:
    if (extra) {
        (void)borrow_park(pg, bw, fresh[need], true);   /* a failure is logged */
        pool_give(pg, fresh + need, 1);
    }
    pool_give(pg, fresh, need);
out_rollback:
    pool_rollback(pg, mark);
out_free:
    free(fr);
    free(ids);
    free(vas);
    free(ds);
    free(hs);
    return rc;
}

/* Room for the ordinary swap-in of s: frames for its host and disk pages (before a disk
   page is read back or another sequence's host page spilled for room: a failed call moves
   nothing), then its disk pages read back into host slots. *busy: pages another sequence's
   swap-in is bringing in (TO_DEVICE), which s must be ordered after too. */
static int in_room(struct paging *pg, struct pg_seq *s, uint32_t *busy)
{
    int rc = 0;
    uint32_t need = tier_count(pg, s, PG_TIER_HOST) + tier_count(pg, s, PG_TIER_DISK);
    *busy = tier_count(pg, s, PG_TIER_TO_DEVICE);
    if (pool_available(pg) < need && pg->df.defer && (rc = defer_reap(pg, true)))
        return rc;
    if (pool_available(pg) < need)
        return pg_why_frames(pg, need);
    if (lower_on(pg, PG_LOWER_DISK))
        for (uint32_t r = 0; r < pg->p.n_regions && !rc; r++)
            rc = paging_disk_unspill(pg, pg_bt(pg, s, r), s->n_pages, s);
    return rc;
}

/* Orders the job d after its copies: the engine stream waits on its fence (stream mode,
   not a prefetch); synchronous mode (wait) waits for the copies. No pages: no fence. */
static int in_order(struct paging *pg, struct pg_defer *d, bool wait, bool async)
{
    if (wait)
        return vmm_stream_sync(pg->v, pg->ck.copy_stream);
    if (!d->n)
        return 0;                          /* nothing in flight for s: no fence */
    int rc = tier_job_fence(pg, d);
    if (!rc && pg->ck.stream && !async &&
        (rc = vmm_stream_after(pg->v, pg->ck.stream, &d->fence)))
        vmm_fence_destroy(pg->v, &d->fence);
    return rc;
}

/* The ordinary swap-in (every disk page of s fits the host tier: read back first). */
static int swap_in_direct(struct paging *pg, struct pg_seq *s, bool async)
{
    uint32_t nr = pg->p.n_regions, np = s->n_pages, slot = pg_slot_of(pg, s), busy;
    int rc = in_room(pg, s, &busy);
    if (rc)
        return rc;
    uint32_t need = tier_count(pg, s, PG_TIER_HOST);
    pg_frame_id *fr = calloc((size_t)nr * np + need + 1, sizeof *fr);
    struct pg_defer *d = tier_job_new(pg, s, DF_IN, need + busy);
    uint32_t mark = pg->fr.n_created;
    rc = -ENOMEM;
    if (!fr || !d)
        goto out_free;
    pg_frame_id *fresh = fr + (size_t)nr * np;
    if (need && (rc = pool_take(pg, need, fresh)))
        goto out_rollback;
    tier_window_frames(pg, s, fresh, false, fr);
    if ((rc = tier_map_window(pg, slot, np, fr)))
        goto out_give;
    bool wait = !pg->ck.stream && !async;
    rc = tier_copy_host_in(pg, s);
    if (!rc)
        rc = in_order(pg, d, wait, async);
    if (rc) {
        (void)tier_copy_finish(pg, rc);   /* the copies made write into the window */
        tier_unmap_window_must(pg, slot, np, fr, nr);
        goto out_give;
    }
    in_commit(pg, s, d, fresh);
    free(fr);
    if (!d->n) {
        free(d);                          /* every page was on the device already */
        return 0;
    }
    if (async)
        s->in_job = d;
    tier_job_start(pg, s, d, wait);
    return 0;

out_give:
    if (need)
        pool_give(pg, fresh, need);
out_rollback:
    pool_rollback(pg, mark);
out_free:
    free(fr);
    free(d);
    return rc;
}

int paging_swap_in(struct paging *pg, uint64_t h, bool async)
{
    struct pg_seq *s;
    int rc = seq_lookup(pg, h, &s);
    if (rc)
        return rc;
    if (!s->out) {
        rc = async ? 0 : defer_settle(pg, s);   /* a prefetch orders the engine later */
        if (!rc)
            seq_use(pg, s);                     /* protected, prefetch included */
        return rc;
    }
    rc = tier_wait_transfers(pg, s);
    if (!rc)
        rc = tier_copy_stream(pg);
    bool staged = false;
    if (!rc && lower_on(pg, PG_LOWER_DISK))
        rc = in_plan(pg, s, &staged);
    if (rc)
        return rc;
    return staged ? swap_in_staged(pg, s) : swap_in_direct(pg, s, async);
}
