/*
 * paging/host_tier.c: the host tier's shared steps: the transfer jobs (DF_OUT / DF_IN entries
 * of the pending list; defer.c completes them), host slots, window mapping and copies for
 * the swap paths (host_out.c, host_in.c, orphan.c), and the bridge to the policy (its room
 * facts and choices). The copy stream and its ordering after the engine are step.c's (the
 * clock owns both streams); the residency queries are resident.c's.
 *
 * Residency: a sequence is resident (out == 0) when every block-table page is mapped in its
 * window, or non-resident (out == 1) when none is (its entries count in the pages' offs).
 * A page moves to the host only when no holder maps it any more (refs - offs == 0 once the
 * moving sequence's entries are off); so a page shared with a resident sibling stays on the
 * device and is copied at most once. A device page whose holders are all non-resident (an
 * orphan: its last resident holder left after the others were swapped out) is moved by
 * paging_reclaim_orphans (orphan.c).
 *
 * Ordering (docs/design.md "Ordering and fences"): swap copies run on a dedicated copy stream.
 * Device -> host copies wait for a fence recorded on the engine stream at the call (so they
 * read what the engine wrote, and the step fence that ended the sequence's protection is
 * behind them); the window is unmapped and the frames are pooled only when the copy fence
 * has completed. Host -> device copies write fresh frames mapped in the window; the engine
 * stream waits for a fence recorded after them (or, sync mode, the call waits). Every job
 * holds a reference on its pages, so no page of a transfer is freed before it completed;
 * its slot's window stays reserved (n_defer) until then.
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

struct pg_defer *tier_job_new(struct paging *pg, struct pg_seq *s, uint8_t kind, uint32_t n)
{
    struct pg_defer *d = calloc(1, sizeof *d + (size_t)n * sizeof d->pages[0]);
    if (d) {
        d->kind = kind;
        d->slot = pg_slot_of(pg, s);
        d->n = n;
    }
    return d;
}

/* Takes the job's references and accounts it to s's window. complete: the copies are done
   (sync mode): the job is completed now; if that fails (an unmap refused), it stays pending
   with no fence and is completed by the next reap, the call still succeeds (the bytes have
   moved). Else it waits in the pending list for its fence (on the copy stream). */
void tier_job_start(struct paging *pg, struct pg_seq *s, struct pg_defer *d, bool complete)
{
    for (uint32_t i = 0; i < d->n; i++) {
        if (pg_page_is_none(d->pages[i]))
            continue;                   /* a hole (discard.c) */
        page_get_job(pg, d->pages[i]);
    }
    defer_add(pg, s, d, complete);
}

void tier_drop_out(struct paging *pg, struct pg_seq *s, uint32_t first, uint32_t end)
{
    for (struct pg_bt_iter it = bt_range(pg, s, 0, pg->p.n_regions, first, end);
         bt_next(&it);) {
        page_put_off(pg, it.id);
        *it.e = PG_PAGE_NONE;
    }
}

/* Waits for the transfers on s's window and for the swap-outs of pages it holds that are
   still in flight (their frames are not free yet and their host copies not done). Pending
   releases of the window are left alone: they cover pages past s's end, which a swap does
   not touch. */
int tier_wait_transfers(struct paging *pg, struct pg_seq *s)
{
    int rc = defer_flush_jobs(pg, pg_slot_of(pg, s));
    if (rc)
        return rc;
    for (struct pg_bt_iter it = bt_all(pg, s); bt_next(&it);)
        if (page_at(pg, it.id)->tier == PG_TIER_TO_HOST)
            return defer_reap(pg, true);
    return 0;
}

/* Waits for and reaps every transfer job (DF_OUT / DF_IN: fences on the copy stream, which
   is ordered after engine work already enqueued, so the wait is bounded); pending releases
   stay pending. For a room or a count that exists once transfers already started complete. */
int tier_wait_all_jobs(struct paging *pg)
{
    for (;;) {
        const struct pg_defer *d = pg->df.defer;
        while (d && d->kind == DF_RELEASE)
            d = d->next;
        if (!d)
            return 0;
        int rc = defer_flush_jobs(pg, d->slot);
        if (rc)
            return rc;
    }
}

int tier_job_fence(struct paging *pg, struct pg_defer *d)
{
    int rc = vmm_fence_create(pg->v, &d->fence);
    if (!rc && (rc = vmm_fence_record(pg->v, &d->fence, pg->ck.copy_stream)))
        vmm_fence_destroy(pg->v, &d->fence);
    return rc;
}

/* ---- slots of the tiers below, window and copies of the swap paths -------------------- */

int lower_take(struct paging *pg, unsigned t, uint32_t n, pg_slot *out)
{
    for (uint32_t k = 0; k < n; k++) {
        pg_slot hint = k ? out[k - 1] : pg->xf.lower[t].hint;
        int rc = lower_alloc(pg, t, hint, &out[k]);
        if (rc) {
            lower_give(pg, t, out, k);
            return rc;
        }
    }
    return 0;
}

void lower_give(struct paging *pg, unsigned t, const pg_slot *s, uint32_t n)
{
    while (n > 0)
        lower_free(pg, t, s[--n]);
}

int tier_copy_out(struct paging *pg, pg_slot hslot, uint64_t va)
{
    return vmm_copy_dtoh(pg->v, lower_ptr(pg, PG_LOWER_HOST, hslot), va, pg->p.page_size,
                         pg->ck.copy_stream);
}

int tier_copy_in(struct paging *pg, uint64_t va, pg_slot hslot)
{
    pg_wrote(pg, va, pg->p.page_size);   /* (window.h: watched frames) */
    return vmm_copy_htod(pg->v, va, lower_ptr(pg, PG_LOWER_HOST, hslot), pg->p.page_size,
                         pg->ck.copy_stream);
}

int tier_copy_finish(struct paging *pg, int rc)
{
    int src = vmm_stream_sync(pg->v, pg->ck.copy_stream);
    if (src)        /* refused, failed copy or not: queued still, never unmap under it */
        (void)vmm_stream_sync(pg->v, pg->ck.copy_stream);
    return rc ? rc : src;
}

int tier_copy_host_in(struct paging *pg, struct pg_seq *s)
{
    uint32_t slot = pg_slot_of(pg, s);
    for (uint32_t q = 0; q < pg->p.n_regions; q++)
        for (uint32_t i = 0; i < s->n_pages; i++) {
            if (pg_page_is_none(pg_bt(pg, s, q)[i]))
                continue;               /* a hole (discard.c) */
            const struct pg_page *p = page_at(pg, pg_bt(pg, s, q)[i]);
            int rc = p->tier == PG_TIER_HOST ? tier_copy_in(pg, pg_va(pg, q, slot, i),
                                                            p->slot[PG_LOWER_HOST]) : 0;
            if (rc)
                return rc;
        }
    return 0;
}

uint32_t tier_count(struct paging *pg, struct pg_seq *s, uint8_t tier)
{
    uint32_t n = 0;
    for (struct pg_bt_iter it = bt_all(pg, s); bt_next(&it);)
        n += page_at(pg, it.id)->tier == tier;
    return n;
}

void tier_window_frames(struct paging *pg, struct pg_seq *s, const pg_frame_id *fresh,
                        bool disk, pg_frame_id *fr)
{
    uint32_t k = 0, np = s->n_pages;
    for (uint32_t q = 0; q < pg->p.n_regions; q++)
        for (uint32_t i = 0; i < np; i++) {
            pg_page_id id = pg_bt(pg, s, q)[i];
            /* NULL: a hole */
            const struct pg_page *p = pg_page_is_none(id) ? NULL : page_at(pg, id);
            bool moves = p && (p->tier == PG_TIER_HOST || (disk && p->tier == PG_TIER_DISK));
            fr[(size_t)q * np + i] = !p ? PG_FRAME_NONE : moves ? fresh[k++] : p->frame;
        }
}

int tier_map_window(struct paging *pg, uint32_t slot, uint32_t np, const pg_frame_id *fr)
{
    for (uint32_t r = 0; r < pg->p.n_regions; r++) {
        int rc = win_map_frames(pg, pg_va(pg, r, slot, 0), fr + (size_t)r * np, np);
        if (rc) {
            tier_unmap_window_must(pg, slot, np, fr, r);
            return rc;
        }
    }
    return 0;
}

void tier_unmap_window_must(struct paging *pg, uint32_t slot, uint32_t np,
                            const pg_frame_id *fr, uint32_t nr)
{
    while (nr-- > 0)
        win_unmap_frames_must(pg, pg_va(pg, nr, slot, 0), fr + (size_t)nr * np, np);
}

int tier_unmap_window(struct paging *pg, struct pg_seq *s)
{
    uint32_t slot = pg_slot_of(pg, s), np = s->n_pages;
    int rc = win_unmap_holes(pg, pg_va(pg, 0, slot, 0), pg_bt(pg, s, 0), np);
    if (rc)
        return rc;
    for (uint32_t r = 1; r < pg->p.n_regions; r++)
        win_unmap_holes_must(pg, pg_va(pg, r, slot, 0), pg_bt(pg, s, r), np);
    return 0;
}

void tier_seq_out(struct paging *pg, struct pg_seq *s)
{
    view_release(pg, s, UINT32_MAX, 0, s->n_pages);     /* a swap-out ends its ids */
    seq_set_out(pg, s, true);
    s->used_valid = 0;
    pg->c.swap_outs++;
}

void tier_seq_in(struct paging *pg, struct pg_seq *s)
{
    seq_set_out(pg, s, false);
    seq_use(pg, s);
    pg->c.swap_ins++;
}

int paging_seq_use_get(struct paging *pg, uint64_t h, struct pg_use *out)
{
    struct pg_seq *s;
    int rc = seq_lookup(pg, h, &s);
    if (!rc)
        *out = (struct pg_use){ s->used_epoch, s->used_tick, s->used_valid };
    return rc;
}

void paging_seq_use_set(struct paging *pg, uint64_t h, const struct pg_use *u)
{
    struct pg_seq *s;
    if (seq_lookup(pg, h, &s))
        return;
    KVVM_ASSERT(u->valid <= 1 && u->epoch <= pg->epoch);
    s->used_epoch = u->epoch;
    s->used_tick = u->tick;
    s->used_valid = u->valid;
}

/* ---- the policy's choices (swap/) -------------------------------------------------- */

void paging_set_policy(struct paging *pg, const struct pg_policy_ops *ops)
{
    pg->xf.policy = ops ? *ops : (struct pg_policy_ops){ 0 };
}

int paging_host_room(struct paging *pg, uint32_t want, uint64_t excl)
{
    if (!lower_on(pg, PG_LOWER_HOST)) {
        pg->why.what |= PG_WHY_NO_HOST;
        return -ENOMEM;
    }
    if (paging_host_free(pg) >= want)
        return 0;
    int rc = pg->xf.policy.host_room ? pg->xf.policy.host_room(pg->xf.policy.arg, want, excl)
                                     : -ENOMEM;
    return rc == -ENOMEM ? pg_why_host(pg, want) : rc;
}

/* Pages of tier t that could move down to the tier below for room, never pages excl
   holds: host pages that could be spilled (0 when the disk tier takes none). */
static uint64_t lower_movable(struct paging *pg, unsigned t, struct pg_seq *excl)
{
    return t == PG_LOWER_HOST ? paging_disk_spillable(pg, excl) : 0;
}

void tier_room(struct paging *pg, struct pg_seq *s, uint32_t need, struct pg_room *r)
{
    r->need = need;
    for (unsigned t = 0; t < PG_N_LOWER; t++) {
        bool below = t + 1 < PG_N_LOWER;
        r->t[t].free = pg->xf.lower[t].off ? 0 : lower_room(pg, t);
        r->t[t].freeing = below ? pg->xf.lower[t + 1].n_io : 0;
        r->t[t].movable = below ? lower_movable(pg, t, s) : 0;
    }
}

int tier_plan(struct paging *pg, bool in, const struct pg_room *r)
{
    if (pg->xf.policy.plan)
        return pg->xf.policy.plan(pg->xf.policy.arg, in, r);
    return in ? PG_MOVE_DIRECT : -ENOMEM;
}

void tier_mark_begin(struct paging *pg)
{
    if (++pg->xf.mark == 0) {              /* wrapped: no stale mark may pass for this walk */
        for (uint32_t i = 0; i < pg->p.max_pages; i++)
            pg->pd.pages[i].mark = 0;
        pg->xf.mark = 1;
    }
}

void paging_room_facts(struct paging *pg, struct pg_room *r)
{
    paging_disk_reap(pg);
    tier_room(pg, NULL, 0, r);
}

uint64_t paging_room_below(struct paging *pg)
{
    paging_disk_reap(pg);
    uint64_t n = 0;
    for (unsigned t = 0; t < PG_N_LOWER; t++)
        n += (pg->xf.lower[t].off ? 0 : lower_room(pg, t)) +
             (t + 1 < PG_N_LOWER ? pg->xf.lower[t + 1].n_io : 0);
    return n;
}

/* ---- pending work ------------------------------------------------------------------- */

int paging_reap(struct paging *pg)
{
    return defer_reap(pg, false);
}

int paging_wait_releases(struct paging *pg)
{
    return pg->df.defer ? defer_reap(pg, true) : 0;
}

size_t paging_host_free(const struct paging *pg)
{
    return lower_room(pg, PG_LOWER_HOST);
}
