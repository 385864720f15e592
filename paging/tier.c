/*
 * paging/tier.c: the host tier's shared steps: the copy stream and its ordering after the
 * engine, the transfer jobs (DF_OUT / DF_IN entries of the pending list) and their
 * completion, host slots, window mapping and copies for the swap paths (tier_out.c,
 * tier_in.c, orphan.c), and the residency queries (ready, need, candidates).
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

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "common/log.h"

int tier_copy_stream(struct paging *pg)
{
    if (pg->copy_stream)
        return 0;
    int rc = vmm_stream_create(pg->v, &pg->copy_stream);
    if (rc)
        return rc;
    rc = vmm_fence_create(pg->v, &pg->copy_fence);
    if (!rc) {
        pg->copy_fence_ok = 1;
        return 0;
    }
    vmm_stream_destroy(pg->v, pg->copy_stream);
    pg->copy_stream = NULL;
    return rc;
}

kcu_stream paging_copy_stream(const struct paging *pg)
{
    return pg->copy_stream;
}

int paging_copy_fence_record(struct paging *pg, vmm_fence *f)
{
    int rc = tier_copy_stream(pg);
    return rc ? rc : vmm_fence_record(pg->v, f, pg->copy_stream);
}

int paging_stream_after_copies(struct paging *pg, kcu_stream stream)
{
    if (!pg->copy_stream)
        return 0;
    int rc = vmm_fence_record(pg->v, &pg->copy_fence, pg->copy_stream);
    return rc ? rc : vmm_stream_after(pg->v, stream, &pg->copy_fence);
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
    if (s && (!s->used_valid || s->used_epoch < pg->quiet_below))
        return 0;                       /* quiet: no engine work left on its pages */
    if (!pg->stream)
        return vmm_device_sync(pg->v);
    if (s && s->used_epoch < pg->epoch && pg->step_recorded)
        return vmm_stream_after(pg->v, pg->copy_stream, &pg->step_fence);
    if (!pg->order_fence_ok) {
        int rc = vmm_fence_create(pg->v, &pg->order_fence);
        if (rc)
            return rc;
        pg->order_fence_ok = 1;
    }
    int rc = vmm_fence_record(pg->v, &pg->order_fence, pg->stream);
    return rc ? rc : vmm_stream_after(pg->v, pg->copy_stream, &pg->order_fence);
}

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
        page_get(pg, d->pages[i]);
        page_at(pg, d->pages[i])->jobs++;
    }
    pg->n_defer++;
    s->n_defer++;
    if (complete && defer_complete(pg, d) == 0)
        return;
    d->next = pg->defer;
    pg->defer = d;
}

void tier_complete_pages(struct paging *pg, struct pg_defer *d)
{
    for (uint32_t i = 0; i < d->n; i++) {
        if (pg_page_is_none(d->pages[i]))
            continue;                   /* a hole (discard.c) */
        struct pg_page *p = page_at(pg, d->pages[i]);
        p->jobs--;
        page_count(pg, p, -1);
        if (d->kind == DF_OUT && p->tier == PG_TIER_TO_HOST) {
            page_frame_drop(pg, p);
            p->tier = PG_TIER_HOST;
            pg->lower[PG_LOWER_HOST].n_io--;
        } else if (d->kind == DF_IN && p->tier == PG_TIER_TO_DEVICE) {
            page_release_slot(pg, p, PG_LOWER_HOST);
            p->tier = PG_TIER_DEVICE;
            pg->lower[PG_LOWER_HOST].n_io--;
        }
        page_count(pg, p, 1);
    }
}

void tier_drop_out(struct paging *pg, struct pg_seq *s, uint32_t first, uint32_t end)
{
    for (uint32_t r = 0; r < pg->p.n_regions; r++) {
        pg_page_id *bt = pg_bt(pg, s, r);
        for (uint32_t i = first; i < end; i++) {
            if (pg_page_is_none(bt[i]))
                continue;               /* a hole (discard.c) */
            struct pg_page *p = page_at(pg, bt[i]);
            page_count(pg, p, -1);
            p->offs--;
            page_count(pg, p, 1);
            page_put(pg, bt[i]);
            bt[i] = PG_PAGE_NONE;
        }
    }
}

int seq_settle(struct paging *pg, struct pg_seq *s)
{
    struct pg_defer *d = s->in_job;
    if (!d)
        return 0;
    int rc;
    if (pg->stream) {
        rc = vmm_stream_after(pg->v, pg->stream, &d->fence);
        if (!rc)
            s->in_job = NULL;
        return rc;
    }
    return defer_flush_slot(pg, pg_slot_of(pg, s));
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
    for (uint32_t r = 0; r < pg->p.n_regions; r++) {
        const pg_page_id *bt = pg_bt(pg, s, r);
        for (uint32_t i = 0; i < s->n_pages; i++)
            if (!pg_page_is_none(bt[i]) && page_at(pg, bt[i])->tier == PG_TIER_TO_HOST)
                return defer_reap(pg, true);
    }
    return 0;
}

/* Waits for and reaps every transfer job (DF_OUT / DF_IN: fences on the copy stream, which
   is ordered after engine work already enqueued, so the wait is bounded); pending releases
   stay pending. For a room or a count that exists once transfers already started complete. */
int tier_wait_all_jobs(struct paging *pg)
{
    for (;;) {
        const struct pg_defer *d = pg->defer;
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
    if (!rc && (rc = vmm_fence_record(pg->v, &d->fence, pg->copy_stream)))
        vmm_fence_destroy(pg->v, &d->fence);
    return rc;
}

/* ---- host slots, window and copies of the swap paths ---------------------------------- */

int tier_host_take(struct paging *pg, uint32_t n, pg_slot *out)
{
    for (uint32_t k = 0; k < n; k++) {
        int rc = lower_alloc(pg, PG_LOWER_HOST, PG_SLOT_NONE, &out[k]);
        if (rc) {
            tier_host_give(pg, out, k);
            return rc;
        }
    }
    return 0;
}

void tier_host_give(struct paging *pg, const pg_slot *hs, uint32_t n)
{
    while (n > 0)
        lower_free(pg, PG_LOWER_HOST, hs[--n]);
}

int tier_copy_out(struct paging *pg, pg_slot hslot, uint64_t va)
{
    return vmm_copy_dtoh(pg->v, lower_ptr(pg, PG_LOWER_HOST, hslot), va, pg->p.page_size,
                         pg->copy_stream);
}

int tier_copy_in(struct paging *pg, uint64_t va, pg_slot hslot)
{
    return vmm_copy_htod(pg->v, va, lower_ptr(pg, PG_LOWER_HOST, hslot), pg->p.page_size,
                         pg->copy_stream);
}

int tier_copy_finish(struct paging *pg, int rc)
{
    int src = vmm_stream_sync(pg->v, pg->copy_stream);
    if (src && !rc)
        (void)vmm_stream_sync(pg->v, pg->copy_stream);   /* queued still: never unmap under it */
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
    for (uint32_t r = 0; r < pg->p.n_regions; r++)
        for (uint32_t i = 0; i < s->n_pages; i++)
            n += !pg_page_is_none(pg_bt(pg, s, r)[i]) &&
                 page_at(pg, pg_bt(pg, s, r)[i])->tier == tier;
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
        int rc = seq_map_frames(pg, pg_va(pg, r, slot, 0), fr + (size_t)r * np, np);
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
        seq_unmap_frames_must(pg, pg_va(pg, nr, slot, 0), fr + (size_t)nr * np, np);
}

int tier_unmap_window(struct paging *pg, struct pg_seq *s)
{
    uint32_t slot = pg_slot_of(pg, s), np = s->n_pages;
    int rc = seq_unmap_holes(pg, pg_va(pg, 0, slot, 0), pg_bt(pg, s, 0), np);
    if (rc)
        return rc;
    for (uint32_t r = 1; r < pg->p.n_regions; r++)
        seq_unmap_holes_must(pg, pg_va(pg, r, slot, 0), pg_bt(pg, s, r), np);
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

/* ---- the policy's choices (swap/) -------------------------------------------------- */

void paging_set_policy(struct paging *pg, const struct pg_policy_ops *ops)
{
    pg->policy = ops ? *ops : (struct pg_policy_ops){ 0 };
}

int paging_host_room(struct paging *pg, uint32_t want, uint64_t excl)
{
    if (!lower_on(pg, PG_LOWER_HOST)) {
        pg->why.what |= PG_WHY_NO_HOST;
        return -ENOMEM;
    }
    if (paging_host_free(pg) >= want)
        return 0;
    int rc = pg->policy.host_room ? pg->policy.host_room(pg->policy.arg, want, excl) : -ENOMEM;
    return rc == -ENOMEM ? pg_why_host(pg, want) : rc;
}

/* Pages of tier t that could move down to the tier below for room, never pages excl
   holds: host pages that could be spilled (0 when the disk tier takes none). */
static uint64_t lower_movable(struct paging *pg, unsigned t, struct pg_seq *excl)
{
    return t == PG_LOWER_HOST ? disk_spillable(pg, excl) : 0;
}

void tier_room(struct paging *pg, struct pg_seq *s, uint32_t need, struct pg_room *r)
{
    r->need = need;
    for (unsigned t = 0; t < PG_N_LOWER; t++) {
        bool below = t + 1 < PG_N_LOWER;
        r->t[t].free = pg->lower[t].off ? 0 : lower_room(pg, t);
        r->t[t].freeing = below ? pg->lower[t + 1].n_io : 0;
        r->t[t].movable = below ? lower_movable(pg, t, s) : 0;
    }
}

int tier_plan(struct paging *pg, bool in, const struct pg_room *r)
{
    if (pg->policy.plan)
        return pg->policy.plan(pg->policy.arg, in, r);
    return in ? PG_MOVE_DIRECT : -ENOMEM;
}

/* ---- residency queries ------------------------------------------------------------- */

int paging_seq_ready(struct paging *pg, uint64_t h)
{
    struct pg_seq *s;
    int rc = seq_lookup(pg, h, &s);
    if (rc)
        return rc;
    if (s->out)
        return 0;
    if ((rc = paging_reap(pg)))
        return rc;
    for (struct pg_defer *d = pg->defer; d; d = d->next)
        if (d->slot == pg_slot_of(pg, s) && d->kind == DF_IN)
            return 0;
    /* pages another's swap-in still brings in, held without a job of s's own (a fork of a
       sequence whose prefetch is still copying) */
    for (uint32_t r = 0; r < pg->p.n_regions; r++)
        for (uint32_t i = 0; i < s->n_pages; i++)
            if (!pg_page_is_none(pg_bt(pg, s, r)[i]) &&
                page_at(pg, pg_bt(pg, s, r)[i])->tier == PG_TIER_TO_DEVICE)
                return 0;
    return 1;
}

/* Whether non-resident s holds pages on disk or with disk I/O in flight (read back first). */
static bool seq_on_disk(struct paging *pg, struct pg_seq *s)
{
    for (uint32_t r = 0; r < pg->p.n_regions && s->out; r++)
        for (uint32_t i = 0; i < s->n_pages; i++) {
            pg_page_id id = pg_bt(pg, s, r)[i];
            if (!pg_page_is_none(id) && (page_at(pg, id)->tier == PG_TIER_DISK ||
                                         page_in_dio(page_at(pg, id))))
                return true;
        }
    return false;
}

int paging_seq_stage_facts(struct paging *pg, uint64_t h, bool *disk, bool *borrow)
{
    struct pg_seq *s;
    int rc = seq_lookup(pg, h, &s);
    *disk = *borrow = false;
    if (rc)
        return rc;
    *disk = seq_on_disk(pg, s);
    *borrow = *disk && tier_stage_must_borrow(pg, s);
    return 0;
}

int paging_need(struct paging *pg, uint64_t h, uint64_t length, uint32_t *frames)
{
    struct pg_seq *s;
    int rc = seq_lookup(pg, h, &s);
    if (rc)
        return rc;
    if (length > pg->p.max_tokens)
        return pg_why_length(pg, length);
    uint32_t n = 0, nr = pg->p.n_regions;
    if (s->out)
        for (uint32_t r = 0; r < nr; r++)
            for (uint32_t i = 0; i < s->n_pages; i++) {
                if (pg_page_is_none(pg_bt(pg, s, r)[i]))
                    continue;           /* a hole (discard.c) */
                uint8_t t = page_at(pg, pg_bt(pg, s, r)[i])->tier;
                n += t != PG_TIER_DEVICE && t != PG_TIER_TO_DEVICE;
            }
    if (seq_on_disk(pg, s) && tier_stage_must_borrow(pg, s))
        n++;                            /* the frame a borrowed staging slot waits in */
    if (length > s->length) {
        uint32_t np = (uint32_t)pg_pages_for(pg, length);
        /* every new page takes a frame, its own map-ahead ones included: those count as
           free in paging_frames_free already (subtracting them here counted them twice) */
        n += (np - s->n_pages) * nr;
        if ((s->length * pg->p.bytes_per_token) % pg->p.page_size)
            n += cow_needed(pg, s, 0, nr, s->n_pages - 1, s->n_pages);
    }
    *frames = n;
    if (n > paging_frames_free(pg))
        pg_why_frames(pg, n);           /* the shortfall a refusal will name */
    return 0;
}

int paging_need_write(struct paging *pg, uint64_t h, uint32_t r0, uint32_t r1, uint64_t b0,
                      uint64_t b1, uint32_t *frames)
{
    struct pg_seq *s;
    int rc = paging_need(pg, h, 0, frames);
    if (rc || seq_lookup(pg, h, &s))
        return rc;
    uint64_t ps = pg->p.page_size;
    if (b0 < b1)
        *frames += cow_needed(pg, s, r0, r1, (uint32_t)(b0 / ps), (uint32_t)((b1 + ps - 1) / ps));
    return 0;
}

int paging_need_batch(struct paging *pg, const uint64_t *hs, const uint64_t *lengths, size_t n,
                      uint64_t *frames)
{
    uint8_t *seen = calloc(pg->p.max_pages ? pg->p.max_pages : 1, 1);
    struct pg_seq **ss = calloc(n ? n : 1, sizeof *ss);
    uint64_t k = 0, grow = 0;
    bool borrow = false;
    int rc = seen && ss ? 0 : -ENOMEM;
    for (size_t j = 0; j < n && !rc; j++) {
        if ((rc = seq_lookup(pg, hs[j], &ss[j])))
            break;
        struct pg_seq *s = ss[j];
        if (lengths[j] > pg->p.max_tokens) {
            rc = pg_why_length(pg, lengths[j]);
            break;
        }
        for (uint32_t r = 0; r < pg->p.n_regions && s->out; r++)
            for (uint32_t i = 0; i < s->n_pages; i++) {
                pg_page_id id = pg_bt(pg, s, r)[i];
                if (pg_page_is_none(id))
                    continue;           /* a hole (discard.c) */
                uint8_t t = page_at(pg, id)->tier;
                if (t != PG_TIER_DEVICE && t != PG_TIER_TO_DEVICE && !seen[id.v - 1])
                    k++;              /* a page shared in the batch comes back once */
                seen[id.v - 1] = 1;
            }
        /* the frame a borrowed staging slot waits in (paging_need's count): the members
           come in one after another, each gives it back */
        borrow |= seq_on_disk(pg, s) && tier_stage_must_borrow(pg, s);
    }
    k += borrow;
    /* the growth as paging_seq_grow_batch counts it: new pages, the holes and shared
       copies of the partial last pages (a page shared by members copied for all but one) */
    if (!rc)
        rc = seq_batch_frames(pg, ss, lengths, n, &grow);
    free(seen);
    free(ss);
    if (!rc)
        *frames = k + grow;
    if (!rc && k + grow > paging_frames_free(pg))
        pg_why_frames(pg, k + grow);    /* the shortfall a refusal will name */
    return rc;
}

bool paging_seq_resident(struct paging *pg, uint64_t h)
{
    struct pg_seq *s;
    return seq_lookup(pg, h, &s) == 0 && !s->out;
}

size_t paging_candidates(struct paging *pg, struct pg_cand *out, size_t max)
{
    size_t n = 0;
    for (uint32_t i = 0; i < pg->p.max_seqs && n < max; i++) {
        struct pg_seq *s = &pg->seqs[i];
        if (!s->live || s->out || s->n_defer || s->in_job ||
            (s->used_valid && s->used_epoch >= pg->epoch))
            continue;
        /* A sequence whose device pages are all shared frees nothing alone, but does with
           its siblings (paging_plan_add); one with none is no candidate. (Map-ahead
           frames count as free already.) The walk stops at the first device page (the
           first one, but for holes and pages another's swap-in still brings in): what a
           victim frees is asked for only while the policy walks its order. */
        bool dev = false;
        for (uint32_t r = 0; r < pg->p.n_regions && !dev; r++)
            for (uint32_t j = 0; j < s->n_pages && !dev; j++) {
                pg_page_id id = pg_bt(pg, s, r)[j];   /* PG_PAGE_NONE: a hole (discard.c) */
                dev = !pg_page_is_none(id) && page_at(pg, id)->tier == PG_TIER_DEVICE;
            }
        if (dev)
            out[n++] = (struct pg_cand){ seq_handle(pg, s), s->used_tick, 0 };
    }
    return n;
}

void tier_mark_begin(struct paging *pg)
{
    if (++pg->mark == 0) {              /* wrapped: no stale mark may pass for this walk */
        for (uint32_t i = 0; i < pg->p.max_pages; i++)
            pg->pages[i].mark = 0;
        pg->mark = 1;
    }
}

uint32_t paging_frames_pending(const struct paging *pg)
{
    uint32_t n = 0;
    for (const struct pg_defer *d = pg->defer; d; d = d->next)
        if (d->kind == DF_OUT)
            for (uint32_t i = 0; i < d->n; i++)
                n += !pg_page_is_none(d->pages[i]) &&
                     pg->pages[d->pages[i].v - 1].tier == PG_TIER_TO_HOST;
    return n;
}

uint32_t paging_orphans(const struct paging *pg)
{
    return tier_orphans(pg);
}

uint32_t paging_frames_free(const struct paging *pg)
{
    return pg->p.max_frames - pg->n_used;
}

size_t paging_host_free(const struct paging *pg)
{
    return lower_room(pg, PG_LOWER_HOST);
}

int paging_reap(struct paging *pg)
{
    return defer_reap(pg, false);
}

int paging_wait_releases(struct paging *pg)
{
    return pg->defer ? defer_reap(pg, true) : 0;
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
        n += (pg->lower[t].off ? 0 : lower_room(pg, t)) +
             (t + 1 < PG_N_LOWER ? pg->lower[t + 1].n_io : 0);
    return n;
}
