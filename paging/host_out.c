/*
 * paging/host_out.c: sequence swap-out, the device -> host move of the host tier (contract in
 * paging.h, "host tier"; the shared steps are in host_tier.c).
 *
 * A page leaves the device only when s's entry is its last mapping (page_moves_down); a page
 * still mapped by a resident sibling stays. The ordinary swap-out copies the moving pages
 * into new host slots on the copy stream and leaves a DF_OUT job: the window is unmapped and
 * the frames pooled when its fence has completed (at once in synchronous mode).
 *
 * Staging (disk tier): when the host tier cannot take the pages even after spilling others
 * (out_plan), they go device -> host slot -> disk in batches of the free host slots
 * (swap_out_staged). Synchronous; every page keeps its tier until the last batch is on disk,
 * so undoing a failure is freeing the slots taken.
 */
#include "paging_int.h"
#include "frames.h"
#include "ahead.h"
#include "transfers.h"
#include "clock.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* A swap-out moving `need` pages that the host tier cannot take as it is: the policy
   chooses (tier_plan) from the room facts, before anything moves (a call that will fail
   moves nothing, not even other sequences' host pages: docs/api.md, a failed call changes
   nothing). Direct: the room is made by spilling others (paging_host_room), or, where no
   disk room takes them, by the policy dropping what only holders keep there; staged
   (*staged): the pages go through the free host slots to disk in batches, at least one
   slot made free first; or -ENOMEM, nothing moved. */
static int out_plan(struct paging *pg, struct pg_seq *s, uint32_t need, bool *staged)
{
    *staged = false;
    if (!lower_on(pg, PG_LOWER_DISK))
        return paging_host_room(pg, need, seq_handle(pg, s));   /* the policy's drops */
    paging_disk_reap(pg);
    struct pg_room room;
    tier_room(pg, s, need, &room);
    int mv = tier_plan(pg, false, &room);
    if (mv == -ENOMEM)                  /* no disk room: the policy drops what it may */
        return paging_host_room(pg, need, seq_handle(pg, s));
    if (mv < 0)
        return mv;
    if (mv == PG_MOVE_DIRECT)
        return paging_host_room(pg, need, seq_handle(pg, s));
    int rc = room.t[PG_LOWER_HOST].free ? 0 : paging_host_room(pg, 1, seq_handle(pg, s));
    *staged = rc == 0;
    return rc;
}

/* The pages of s that leave the device (at most max) and their window addresses, in
   window order; returns how many. */
static uint32_t out_pages(struct paging *pg, struct pg_seq *s, uint32_t max, pg_page_id *ids,
                          uint64_t *vas)
{
    uint32_t k = 0, slot = pg_slot_of(pg, s);
    for (struct pg_bt_iter it = bt_all(pg, s); k < max && bt_next(&it);)
        if (page_moves_down(page_at(pg, it.id))) {
            ids[k] = it.id;
            vas[k++] = pg_va(pg, it.r, slot, it.i);
        }
    return k;
}

/* The batches of a staged swap-out: each copies up to bmax pages into host slots of its
   own, waits, writes them to disk and frees its slots (success or not). */
static int staged_out_batches(struct paging *pg, const pg_page_id *ids, const uint64_t *vas,
                              const pg_slot *ds, uint32_t need, uint32_t bmax, pg_slot *hs)
{
    int rc = 0;
    for (uint32_t b = 0; b < need && !rc; b += bmax) {
        uint32_t m = need - b < bmax ? need - b : bmax;
        if ((rc = lower_take(pg, PG_LOWER_HOST, m, hs)))
            break;
        for (uint32_t j = 0; j < m && !rc; j++)
            rc = tier_copy_out(pg, hs[j], vas[b + j]);
        rc = tier_copy_finish(pg, rc);  /* the slots are written to disk or given back */
        if (!rc)
            rc = paging_disk_stage_io(pg, true, ids + b, ds + b, hs, m);
        lower_give(pg, PG_LOWER_HOST, hs, m);
    }
    return rc;
}

/* A staged swap-out: the sequence has more pages to move than the host tier can take, so
   they go device -> host slot -> disk in batches of the free host slots (each batch written
   and its slots freed before the next), ending on disk. Synchronous in every mode: the
   caller waits for the copies and the writes. The device copies stay in place (mapped)
   until every page is on disk; only then is the window unmapped and are the frames pooled,
   so a failure anywhere frees the disk and host slots taken and leaves the sequence wholly
   resident, nothing changed. The copies are ordered after the engine's work
   (copies_after_engine) and complete before the unmap. -ENOMEM, -EIO (or the write's
   error: spilling is then disabled, as for any failed spill write). */
static int swap_out_staged(struct paging *pg, struct pg_seq *s, uint32_t need)
{
    uint32_t bmax = (uint32_t)paging_host_free(pg);
    if (!bmax)
        return -ENOMEM;
    if (bmax > need)
        bmax = need;
    pg_page_id *ids = calloc((size_t)need, sizeof *ids);
    uint64_t *vas = calloc((size_t)need, sizeof *vas);
    pg_slot *ds = calloc((size_t)need, sizeof *ds);
    pg_slot *hs = calloc((size_t)bmax, sizeof *hs);
    int rc = -ENOMEM;
    if (!ids || !vas || !ds || !hs)
        goto out_free;
    out_pages(pg, s, need, ids, vas);
    if ((rc = lower_take(pg, PG_LOWER_DISK, need, ds)))
        goto out_free;
    rc = tier_copies_after_engine(pg, s);
    if (!rc)
        rc = staged_out_batches(pg, ids, vas, ds, need, bmax, hs);
    /* every page is on disk: unmap the window (the first unmap may fail cleanly) */
    if (!rc)
        rc = tier_unmap_window(pg, s);
    if (rc) {
        lower_give(pg, PG_LOWER_DISK, ds, need);
        goto out_free;
    }
    /* commit: nothing below fails */
    ahead_drop(pg, s, 0);             /* the sequence's map-ahead (ahead.c) */
    for (uint32_t j = 0; j < need; j++) {
        struct pg_page *p = page_at(pg, ids[j]);
        page_count(pg, p, -1);
        page_frame_drop(pg, p);
        page_set_tier(p, PG_TIER_DISK);
        page_take_slot(pg, p, PG_LOWER_DISK, ds[j]);
        page_count(pg, p, 1);
    }
    for (struct pg_bt_iter it = bt_all(pg, s); bt_next(&it);)
        page_go_off(pg, it.id);
    pg->xf.lower[PG_LOWER_DISK].hint = ds[need - 1];
    tier_seq_out(pg, s);
    pg->c.bytes_to_host += (uint64_t)need * pg->p.page_size;
    pg->c.spills += need;
    pg->c.bytes_to_disk += (uint64_t)need * pg->p.page_size;
out_free:
    free(ids);
    free(vas);
    free(ds);
    free(hs);
    return rc;
}

/* Waits so that the count of s's pages moving down is exact, then counts them (*need).
   A device page that a sibling's pending swap-out job still holds (the sibling left it
   behind, s mapping it): the job's reference is no holder, and s may be its last one.
   Wait for those jobs (and for a sibling's swap-in still bringing a page of s in), else
   they would stay on the device, orphaned. Stream mode: host slots held only by transfers
   already started (swap-in copies free theirs at completion; swap-out copies become host
   pages that can spill) are waited for rather than failing (include/kvvm.h,
   kvvm_seq_swap_out). Not for reclaim (async): it waits for copies without the context
   lock, and moves orphans itself. */
static int out_prepare(struct paging *pg, struct pg_seq *s, bool async, uint32_t *need)
{
    int rc = defer_settle(pg, s);
    if (!rc)
        rc = tier_wait_transfers(pg, s);
    if (!rc)
        rc = tier_copy_stream(pg);
    if (rc)
        return rc;
    bool held = false;
    for (struct pg_bt_iter it = bt_all(pg, s); !held && bt_next(&it);) {
        const struct pg_page *p = page_at(pg, it.id);
        held = (p->tier == PG_TIER_DEVICE && p->jobs) || p->tier == PG_TIER_TO_DEVICE;
    }
    if (held && !async && (rc = tier_wait_all_jobs(pg)))
        return rc;
    *need = 0;
    for (struct pg_bt_iter it = bt_all(pg, s); bt_next(&it);)
        *need += page_moves_down(page_at(pg, it.id));
    if (paging_host_free(pg) < *need && pg->xf.lower[PG_LOWER_HOST].n_io && !async)
        rc = tier_wait_all_jobs(pg);
    return rc;
}

/* Enqueues the device -> host copies of the pages of d (s's window, region-major) that move
   down, into slots[0..need). On failure the copies made are waited for. */
static int out_copies(struct paging *pg, struct pg_seq *s, const struct pg_defer *d,
                      const pg_slot *slots, uint32_t need)
{
    uint32_t np = s->n_pages, slot = pg_slot_of(pg, s), k = 0;
    for (uint32_t i = 0; i < d->n && k < need; i++) {
        if (pg_page_is_none(d->pages[i]) || !page_moves_down(page_at(pg, d->pages[i])))
            continue;                   /* (a hole, discard.c) */
        int rc = tier_copy_out(pg, slots[k++], pg_va(pg, i / np, slot, i % np));
        if (rc) {
            (void)tier_copy_finish(pg, rc);   /* the copies made read into slots */
            return rc;
        }
    }
    return 0;
}

/* The ordinary swap-out: the moving pages go to new host slots; a DF_OUT job completes it
   (at once in synchronous mode, unless async). */
static int swap_out_direct(struct paging *pg, struct pg_seq *s, uint32_t need, bool async)
{
    uint32_t nr = pg->p.n_regions, np = s->n_pages, n = nr * np;
    struct pg_defer *d = tier_job_new(pg, s, DF_OUT, n);
    pg_slot *slots = malloc((need ? need : 1) * sizeof *slots);
    int rc = -ENOMEM;
    if (!d || !slots || (rc = lower_take(pg, PG_LOWER_HOST, need, slots)))
        goto out_free;
    d->first = 0;
    d->end = np;
    for (uint32_t r = 0; r < nr; r++)
        memcpy(d->pages + (size_t)r * np, pg_bt(pg, s, r), np * sizeof d->pages[0]);
    rc = tier_copies_after_engine(pg, s);   /* the window is unmapped after the engine's work */
    if (!rc)
        rc = out_copies(pg, s, d, slots, need);
    bool fenced = pg->ck.stream || async;
    if (!rc)
        rc = fenced ? tier_job_fence(pg, d)
                    : vmm_stream_sync(pg->v, pg->ck.copy_stream);  /* sync mode: done on return */
    if (rc) {
        (void)tier_copy_finish(pg, rc);   /* never give the slots back under the copies */
        lower_give(pg, PG_LOWER_HOST, slots, need);
        goto out_free;
    }
    /* commit: nothing below fails (the sync-mode completion keeps the job on failure) */
    ahead_drop(pg, s, 0);             /* the sequence's map-ahead (ahead.c) */
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (pg_page_is_none(d->pages[i]))
            continue;                   /* a hole (discard.c) */
        struct pg_page *p = page_at(pg, d->pages[i]);
        if (k < need && page_moves_down(p)) {
            page_count(pg, p, -1);
            page_set_tier(p, PG_TIER_TO_HOST);
            page_take_slot(pg, p, PG_LOWER_HOST, slots[k++]);
            pg->xf.lower[PG_LOWER_HOST].n_io++;
            page_count(pg, p, 1);
        }
        page_go_off(pg, d->pages[i]);
    }
    tier_seq_out(pg, s);
    pg->c.bytes_to_host += (uint64_t)need * pg->p.page_size;
    free(slots);
    tier_job_start(pg, s, d, !fenced);
    return 0;
out_free:
    free(slots);
    free(d);
    return rc;
}

int paging_swap_out(struct paging *pg, uint64_t h, bool async)
{
    struct pg_seq *s;
    int rc = seq_lookup(pg, h, &s);
    if (rc || s->out)
        return rc;
    if (!lower_on(pg, PG_LOWER_HOST)) {
        pg->why.what |= PG_WHY_NO_HOST;
        return -ENOMEM;
    }
    uint32_t need;
    if ((rc = out_prepare(pg, s, async, &need)))
        return rc;
    bool staged = false;
    if (paging_host_free(pg) < need && (rc = out_plan(pg, s, need, &staged)))
        return rc == -ENOMEM ? pg_why_host(pg, need) : rc;
    return staged ? swap_out_staged(pg, s, need) : swap_out_direct(pg, s, need, async);
}
