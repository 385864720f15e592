/*
 * paging/tier.c: the host tier's mechanism: sequence swap-out and swap-in, orphan pages,
 * and the transfer jobs that complete them (DF_OUT / DF_IN entries of the pending list).
 *
 * Residency: a sequence is resident (out == 0) when every block-table page is mapped in its
 * window, or non-resident (out == 1) when none is (its entries count in the pages' offs).
 * A page moves to the host only when no holder maps it any more (refs - offs == 0 once the
 * moving sequence's entries are off); so a page shared with a resident sibling stays on the
 * device and is copied at most once. A device page whose holders are all non-resident (an
 * orphan: its last resident holder left after the others were swapped out) is moved by
 * paging_reclaim_orphans.
 *
 * Ordering (docs/design.md "Ordering and fences"): swap copies run on a dedicated copy stream.
 * Device -> host copies wait for a fence recorded on the engine stream at the call (so they
 * read what the engine wrote, and the step fence that ended the sequence's protection is
 * behind them); the window is unmapped and the frames are pooled only when the copy fence
 * has completed. Host -> device copies write fresh frames mapped in the window; the engine
 * stream waits for a fence recorded after them (or, sync mode, the call waits). Every job
 * holds a reference on its pages, so no page of a transfer is freed before it completed;
 * its slot's window stays reserved (n_defer) until then.
 *
 * Staging (disk tier): a sequence with more pages than the host tier can take moves through
 * it in batches (swap_out_staged: device -> host slots -> disk; swap_in_staged: disk -> host
 * slots -> device). Both are synchronous and keep every page in its tier until the last
 * batch is done, so undoing a failure is freeing the slots taken (and, for swap-in, the
 * fresh frames); swap_out decides between the two paths, or -ENOMEM, before moving anything
 * (out_plan).
 */
#include "paging_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "common/log.h"

static int copy_stream(struct paging *pg)
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
    int rc = copy_stream(pg);
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
   work enqueued so far). An unprotected s (not used since the last step) was last touched
   by work before the last step's fence: the copy stream waits for that fence, and nothing
   is recorded on the engine stream, so a background thread never enqueues there (a capture
   may begin at any time on it: a record would become a graph node). Otherwise a fence is
   recorded on the engine stream now (the caller is the engine's own call). */
static int copies_after_engine(struct paging *pg, const struct pg_seq *s)
{
    if (!pg->stream)
        return vmm_device_sync(pg->v);
    if (s && (!s->used_valid || s->used_epoch < pg->quiet_below))
        return 0;
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

static struct pg_defer *job_new(struct paging *pg, struct pg_seq *s, uint8_t kind, uint32_t n)
{
    struct pg_defer *d = calloc(1, sizeof *d + (size_t)n * sizeof(uint32_t));
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
static void job_start(struct paging *pg, struct pg_seq *s, struct pg_defer *d, bool complete)
{
    for (uint32_t i = 0; i < d->n; i++) {
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
        struct pg_page *p = page_at(pg, d->pages[i]);
        p->jobs--;
        if (d->kind == DF_OUT && p->tier == PG_TIER_TO_HOST) {
            uint32_t f = p->frame;
            p->tier = PG_TIER_HOST;
            p->frame = 0;
            frame_at(pg, f)->page = 0;
            pool_give(pg, &f, 1);
            pg->n_inflight--;
        } else if (d->kind == DF_IN && p->tier == PG_TIER_TO_DEVICE) {
            pg->p.host->free(pg->p.host->arg, p->host_slot);
            p->host_slot = 0;
            p->tier = PG_TIER_DEVICE;
            pg->n_host--;
            pg->n_inflight--;
        }
    }
}

void tier_drop_out(struct paging *pg, struct pg_seq *s, uint32_t first, uint32_t end)
{
    for (uint32_t r = 0; r < pg->p.n_regions; r++) {
        uint32_t *bt = pg_bt(pg, s, r);
        for (uint32_t i = first; i < end; i++) {
            page_at(pg, bt[i])->offs--;
            page_put(pg, bt[i]);
            bt[i] = 0;
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
static int seq_wait_transfers(struct paging *pg, struct pg_seq *s)
{
    int rc = defer_flush_jobs(pg, pg_slot_of(pg, s));
    if (rc)
        return rc;
    for (uint32_t r = 0; r < pg->p.n_regions; r++) {
        const uint32_t *bt = pg_bt(pg, s, r);
        for (uint32_t i = 0; i < s->n_pages; i++)
            if (page_at(pg, bt[i])->tier == PG_TIER_TO_HOST)
                return defer_reap(pg, true);
    }
    return 0;
}

/* Waits for and reaps every transfer job (DF_OUT / DF_IN: fences on the copy stream, which
   is ordered after engine work already enqueued, so the wait is bounded); pending releases
   stay pending. For a room or a count that exists once transfers already started complete. */
static int wait_all_jobs(struct paging *pg)
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

/* ---- swap-out ------------------------------------------------------------------------ */

/* Whether s's entry for page p is the last mapping of it (so leaving moves it down). */
static bool moves_down(const struct pg_page *p)
{
    return p->tier == PG_TIER_DEVICE && p->refs - p->offs == 1;
}

static uint64_t seq_handle(struct paging *pg, struct pg_seq *s)
{
    return ((uint64_t)s->gen << 32) | (pg_slot_of(pg, s) + 1);
}

/* Host room for a swap-out moving `need` pages, checked before anything moves (a call that
   will fail moves nothing, not even other sequences' host pages: docs/api.md, a failed call
   changes nothing). With H free host slots, W spill writes in flight (their slots come
   free), S host pages of other non-resident sequences that could be spilled and D free disk
   slots:
     need <= H + W + min(S, D): the ordinary swap-out, after spilling others for room (the
                                 room is made here: paging_host_room);
     else D >= need:             a staged swap-out (*staged): the pages go through the free
                                 host slots to disk in batches (at least one slot is made
                                 free, by spilling one page of another sequence if need be);
     else -ENOMEM, nothing moved. */
static int out_plan(struct paging *pg, struct pg_seq *s, uint32_t need, bool *staged)
{
    *staged = false;
    if (!pg->p.disk)
        return -ENOMEM;
    paging_disk_reap(pg);
    uint64_t hf = paging_host_free(pg), w = pg->n_dio;
    uint64_t d = pg->disk_off ? 0 : pg->disk.n_free(pg->disk.arg);
    uint64_t sp = disk_spillable(pg, s);
    uint64_t spill = sp < d ? sp : d;
    if (need <= hf + w + spill)
        return paging_host_room(pg, need, seq_handle(pg, s));
    if (d < need)
        return -ENOMEM;
    if (hf + w == 0 && (sp == 0 || d == need))
        return -ENOMEM;                    /* no slot to stage through */
    int rc = hf ? 0 : paging_host_room(pg, 1, seq_handle(pg, s));
    if (rc)
        return rc;
    *staged = true;
    return 0;
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
    uint32_t nr = pg->p.n_regions, np = s->n_pages, slot = pg_slot_of(pg, s);
    uint32_t bmax = (uint32_t)paging_host_free(pg);
    if (!bmax)
        return -ENOMEM;
    if (bmax > need)
        bmax = need;
    uint32_t *ids = calloc(need, sizeof *ids);
    uint64_t *vas = calloc(need, sizeof *vas);
    uint64_t *ds = calloc(need, sizeof *ds);
    uint64_t *hs = malloc((size_t)bmax * sizeof *hs);
    uint32_t nd = 0, nh = 0, k = 0;
    int rc = -ENOMEM;
    if (!ids || !vas || !ds || !hs)
        goto out_free;
    for (uint32_t r = 0; r < nr; r++)
        for (uint32_t i = 0; i < np; i++) {
            uint32_t id = pg_bt(pg, s, r)[i];
            if (moves_down(page_at(pg, id)) && k < need) {
                ids[k] = id;
                vas[k++] = pg_va(pg, r, slot, i);
            }
        }
    for (; nd < need; nd++)
        if ((rc = pg->disk.alloc(pg->disk.arg, nd ? ds[nd - 1] : pg->disk_hint, &ds[nd])))
            goto out_slots;
    if ((rc = copies_after_engine(pg, s)))
        goto out_slots;
    for (uint32_t b = 0; b < need; b += nh) {
        uint32_t m = need - b < bmax ? need - b : bmax;
        for (nh = 0; nh < m; nh++)
            if ((rc = pg->p.host->alloc(pg->p.host->arg, &hs[nh])))
                goto out_slots;
        for (uint32_t j = 0; j < m && !rc; j++)
            rc = vmm_copy_dtoh(pg->v, pg->p.host->ptr(pg->p.host->arg, hs[j]), vas[b + j],
                               pg->p.page_size, pg->copy_stream);
        int src = vmm_stream_sync(pg->v, pg->copy_stream);
        if (!rc)
            rc = src;
        if (!rc)
            rc = disk_stage_io(pg, true, ids + b, ds + b, hs, m);
        if (rc)
            goto out_slots;
        while (nh > 0)
            pg->p.host->free(pg->p.host->arg, hs[--nh]);
        nh = m;                     /* the loop's step */
    }
    nh = 0;
    /* every page is on disk: unmap the window (the first unmap may fail cleanly) */
    if ((rc = seq_unmap(pg, pg_va(pg, 0, slot, 0), np)))
        goto out_slots;
    for (uint32_t r = 1; r < nr; r++)
        seq_unmap_must(pg, pg_va(pg, r, slot, 0), np);
    /* commit: nothing below fails */
    seq_drop_ahead(pg, s, 0);
    for (uint32_t j = 0; j < need; j++) {
        struct pg_page *p = page_at(pg, ids[j]);
        uint32_t f = p->frame;
        p->tier = PG_TIER_DISK;
        p->disk_slot = ds[j];
        p->frame = 0;
        frame_at(pg, f)->page = 0;
        pool_give(pg, &f, 1);
        pg->n_disk++;
    }
    for (uint32_t r = 0; r < nr; r++)
        for (uint32_t i = 0; i < np; i++)
            page_at(pg, pg_bt(pg, s, r)[i])->offs++;
    pg->disk_hint = ds[need - 1];
    s->out = 1;
    s->used_valid = 0;
    pg->c.swap_outs++;
    pg->c.bytes_to_host += (uint64_t)need * pg->p.page_size;
    pg->c.spills += need;
    pg->c.bytes_to_disk += (uint64_t)need * pg->p.page_size;
    rc = 0;
    goto out_free;

out_slots:
    while (nh > 0)
        pg->p.host->free(pg->p.host->arg, hs[--nh]);
    while (nd > 0)
        pg->disk.free(pg->disk.arg, ds[--nd]);
out_free:
    free(ids);
    free(vas);
    free(ds);
    free(hs);
    return rc;
}

int paging_swap_out(struct paging *pg, uint64_t h, bool async)
{
    struct pg_seq *s;
    int rc = seq_lookup(pg, h, &s);
    if (rc || s->out)
        return rc;
    if (!pg->p.host)
        return -ENOMEM;
    rc = seq_settle(pg, s);
    if (!rc)
        rc = seq_wait_transfers(pg, s);
    if (!rc)
        rc = copy_stream(pg);
    if (rc)
        return rc;
    uint32_t nr = pg->p.n_regions, np = s->n_pages, need = 0;
    uint32_t n = nr * np;
    /* A device page that a sibling's pending swap-out job still holds (the sibling left it
       behind, s mapping it): the job's reference is no holder, and s may be its last one.
       Wait for those jobs (and for a sibling's swap-in still bringing a page of s in), so
       the count of pages moving down is exact (else they would stay on the device,
       orphaned). */
    bool held = false;
    for (uint32_t r = 0; r < nr && !held; r++)
        for (uint32_t i = 0; i < np && !held; i++) {
            const struct pg_page *p = page_at(pg, pg_bt(pg, s, r)[i]);
            held = (p->tier == PG_TIER_DEVICE && p->jobs) || p->tier == PG_TIER_TO_DEVICE;
        }
    if (held && !async && (rc = wait_all_jobs(pg)))
        return rc;
    for (uint32_t r = 0; r < nr; r++)
        for (uint32_t i = 0; i < np; i++)
            need += moves_down(page_at(pg, pg_bt(pg, s, r)[i]));
    /* Stream mode: host slots held only by transfers already started (swap-in copies free
       theirs at completion; swap-out copies become host pages that can spill): wait for
       them rather than fail (include/kvvm.h, kvvm_seq_swap_out). Not for reclaim (async):
       it waits for copies without the context lock, and moves orphans itself. */
    if (paging_host_free(pg) < need && pg->n_inflight && !async && (rc = wait_all_jobs(pg)))
        return rc;
    bool staged = false;
    if (paging_host_free(pg) < need && (rc = out_plan(pg, s, need, &staged)))
        return rc;
    if (staged)
        return swap_out_staged(pg, s, need);
    struct pg_defer *d = job_new(pg, s, DF_OUT, n);
    uint64_t *slots = malloc((need ? need : 1) * sizeof *slots);
    uint32_t got = 0;
    rc = -ENOMEM;
    if (!d || !slots)
        goto out_free;
    for (; got < need; got++)
        if ((rc = pg->p.host->alloc(pg->p.host->arg, &slots[got])))
            goto out_slots;
    d->first = 0;
    d->end = np;
    for (uint32_t r = 0; r < nr; r++)
        memcpy(d->pages + (size_t)r * np, pg_bt(pg, s, r), np * sizeof(uint32_t));
    rc = copies_after_engine(pg, s);   /* the window is unmapped after the engine's work */
    if (rc)
        goto out_slots;
    uint32_t k = 0;
    for (uint32_t i = 0; i < n && k < need; i++) {
        uint32_t r = i / np, idx = i % np;
        if (!moves_down(page_at(pg, d->pages[i])))
            continue;
        rc = vmm_copy_dtoh(pg->v, pg->p.host->ptr(pg->p.host->arg, slots[k++]),
                           pg_va(pg, r, pg_slot_of(pg, s), idx), pg->p.page_size,
                           pg->copy_stream);
        if (rc) {
            vmm_stream_sync(pg->v, pg->copy_stream);   /* the copies made read into slots */
            goto out_slots;
        }
    }
    bool fenced = pg->stream || async;
    if (fenced && (rc = vmm_fence_create(pg->v, &d->fence)) == 0 &&
        (rc = vmm_fence_record(pg->v, &d->fence, pg->copy_stream)) != 0)
        vmm_fence_destroy(pg->v, &d->fence);
    if (!fenced && !rc)
        rc = vmm_stream_sync(pg->v, pg->copy_stream);   /* sync mode: done on return */
    if (rc) {
        vmm_stream_sync(pg->v, pg->copy_stream);
        goto out_slots;
    }
    /* commit: nothing below fails (the sync-mode completion keeps the job on failure) */
    seq_drop_ahead(pg, s, 0);
    k = 0;
    for (uint32_t i = 0; i < n; i++) {
        struct pg_page *p = page_at(pg, d->pages[i]);
        if (k < need && moves_down(p)) {
            p->tier = PG_TIER_TO_HOST;
            p->host_slot = slots[k++];
            pg->n_host++;
            pg->n_inflight++;
        }
        p->offs++;
    }
    s->out = 1;
    s->used_valid = 0;
    pg->c.swap_outs++;
    pg->c.bytes_to_host += (uint64_t)need * pg->p.page_size;
    free(slots);
    job_start(pg, s, d, !fenced);
    return 0;

out_slots:
    while (got-- > 0)
        pg->p.host->free(pg->p.host->arg, slots[got]);
out_free:
    free(slots);
    free(d);
    return rc;
}

/* ---- swap-in ------------------------------------------------------------------------- */

/* Whether s's disk pages fit the host tier for the ordinary swap-in (disk_unspill reads
   them all into host slots at once, spilling others' host pages for room): with H free
   host slots, W writes in flight, S spillable host pages of others and D free disk slots,
   the disk pages must number at most H + W + min(S, D); else *staged. Waits for disk I/O
   on s's pages first. -EBADMSG a page of s is damaged. */
static int in_plan(struct paging *pg, struct pg_seq *s, bool *staged)
{
    *staged = false;
    uint32_t nr = pg->p.n_regions, np = s->n_pages, nd = 0;
    bool dio = false;
    for (uint32_t r = 0; r < nr; r++)
        for (uint32_t i = 0; i < np; i++)
            dio |= page_in_dio(page_at(pg, pg_bt(pg, s, r)[i]));
    if (dio)
        paging_disk_wait(pg);
    else
        paging_disk_reap(pg);
    for (uint32_t r = 0; r < nr; r++)
        for (uint32_t i = 0; i < np; i++) {
            const struct pg_page *p = page_at(pg, pg_bt(pg, s, r)[i]);
            if (p->tier == PG_TIER_DISK && p->bad)
                return -EBADMSG;
            nd += p->tier == PG_TIER_DISK;
        }
    if (!nd)
        return 0;
    /* host slots held only by transfers already started come free (or spillable) once they
       complete: wait for them rather than stage or fail for want of a slot */
    if (nd > paging_host_free(pg) && pg->n_inflight) {
        int rc = wait_all_jobs(pg);
        if (rc)
            return rc;
    }
    uint64_t hf = paging_host_free(pg), w = pg->n_dio;
    uint64_t d = pg->disk_off ? 0 : pg->disk.n_free(pg->disk.arg);
    uint64_t sp = disk_spillable(pg, s);
    *staged = nd > hf + w + (sp < d ? sp : d);
    return 0;
}

/* Whether a staged swap-in of s finds no host slot to stage through and none can be made:
   no free slot, no spill write in flight to free one, and no host page of another sequence
   that could be spilled (or no disk slot to spill it to). It then borrows the slot of a
   host page, whose bytes wait in a spare device frame meanwhile (one frame more than the
   pages it brings back: paging_need counts it). */
static bool stage_must_borrow(struct paging *pg, struct pg_seq *s)
{
    if (paging_host_free(pg) || pg->n_dio)
        return false;
    uint64_t d = pg->disk_off ? 0 : pg->disk.n_free(pg->disk.arg);
    return !d || !disk_spillable(pg, s);
}

/* A host page whose slot can be borrowed (no transfer on it), or 0. */
static uint32_t borrow_page(struct paging *pg)
{
    for (uint32_t i = 0; i < pg->p.max_pages; i++) {
        const struct pg_page *p = &pg->pages[i];
        if (p->refs && p->tier == PG_TIER_HOST && !p->jobs && p->staged == STG_NONE)
            return i + 1;
    }
    return 0;
}

/* Copies the borrowed page's slot into frame f (mapped at the scratch page) and waits, or
   (back) the frame into the slot and unmaps it. Synchronous. */
static int borrow_park(struct paging *pg, uint32_t id, uint32_t f, bool back)
{
    void *hp = pg->p.host->ptr(pg->p.host->arg, page_at(pg, id)->host_slot);
    int rc = 0;
    if (!back && (rc = seq_map_frames(pg, pg->scratch_va, &f, 1)))
        return rc;
    rc = back ? vmm_copy_dtoh(pg->v, hp, pg->scratch_va, pg->p.page_size, pg->copy_stream)
              : vmm_copy_htod(pg->v, pg->scratch_va, hp, pg->p.page_size, pg->copy_stream);
    int src = vmm_stream_sync(pg->v, pg->copy_stream);
    if (src && !rc)
        (void)vmm_stream_sync(pg->v, pg->copy_stream);   /* queued still: never unmap under it */
    if (!rc)
        rc = src;
    if (back || rc)
        seq_unmap_must(pg, pg->scratch_va, 1);
    if (!rc && back)
        pg->c.bytes_to_host += pg->p.page_size;
    else if (!rc)
        pg->c.bytes_to_device += pg->p.page_size;
    if (rc && back)
        klog_error("paging: restoring host page %u from its parking frame failed (%d)", id, rc);
    return rc;
}

/* A staged swap-in: s has more disk pages than the host tier can hold at once. Every page
   is mapped again in fresh frames first; host pages are copied host -> device; disk pages
   come back in batches of the free host slots (read, checksum verified, copied to the
   device, slots freed, next batch). Synchronous in every mode (async included): the bytes
   are in place on return, no copy is left for the engine stream to wait for. The pages
   keep their tiers until everything is in place; a failure unmaps the window, pools the
   fresh frames and frees the staging slots: s stays wholly non-resident, nothing changed
   (except that a page whose read failed is damaged, as for any failed read back:
   -EBADMSG). When no host slot can be had, one is borrowed (stage_must_borrow) and the
   batches are of one page. -ENOMEM not enough frames or no host slot to stage through;
   -EIO. */
static int swap_in_staged(struct paging *pg, struct pg_seq *s)
{
    uint32_t nr = pg->p.n_regions, np = s->n_pages, slot = pg_slot_of(pg, s);
    uint32_t need = 0, ndk = 0;
    int rc;
    for (uint32_t r = 0; r < nr; r++)
        for (uint32_t i = 0; i < np; i++) {
            uint8_t t = page_at(pg, pg_bt(pg, s, r)[i])->tier;
            need += t == PG_TIER_HOST || t == PG_TIER_DISK;
            ndk += t == PG_TIER_DISK;
        }
    uint32_t bw = stage_must_borrow(pg, s) ? borrow_page(pg) : 0, extra = bw ? 1 : 0;
    if (!bw && stage_must_borrow(pg, s))
        return -ENOMEM;
    if (pool_available(pg) < need + extra && pg->defer && (rc = defer_reap(pg, true)))
        return rc;
    if (pool_available(pg) < need + extra)
        return -ENOMEM;
    if (!bw && !paging_host_free(pg) && (rc = paging_host_room(pg, 1, seq_handle(pg, s))))
        return rc;                      /* (pressure relief: spills another's host page) */
    uint32_t bmax = bw ? 1 : (uint32_t)paging_host_free(pg);
    if (bmax > ndk)
        bmax = ndk;
    uint32_t *fr = calloc((size_t)nr * np + need + 1, sizeof *fr);
    uint32_t *ids = malloc(((size_t)ndk + 1) * sizeof *ids);
    uint64_t *vas = calloc((size_t)ndk + 1, sizeof *vas);
    uint64_t *ds = malloc(((size_t)ndk + 1) * sizeof *ds);
    uint64_t *hs = malloc(((size_t)bmax + 1) * sizeof *hs);
    uint32_t mark = pg->n_created, r = 0, nh = 0, k = 0, kd = 0;
    rc = -ENOMEM;
    if (!fr || !ids || !vas || !ds || !hs)
        goto out_free;
    uint32_t *fresh = fr + (size_t)nr * np;
    if ((rc = pool_take(pg, need + extra, fresh)))
        goto out_rollback;
    if (bw && (rc = borrow_park(pg, bw, fresh[need], false))) {
        pool_give(pg, fresh, need + extra);
        goto out_rollback;
    }
    for (uint32_t q = 0; q < nr; q++)
        for (uint32_t i = 0; i < np; i++) {
            struct pg_page *p = page_at(pg, pg_bt(pg, s, q)[i]);
            bool moves = p->tier == PG_TIER_HOST || p->tier == PG_TIER_DISK;
            fr[(size_t)q * np + i] = moves ? fresh[k++] : p->frame;
            if (p->tier == PG_TIER_DISK) {
                ids[kd] = pg_bt(pg, s, q)[i];
                vas[kd] = pg_va(pg, q, slot, i);
                ds[kd++] = p->disk_slot;
            }
        }
    for (r = 0; r < nr; r++)
        if ((rc = seq_map_frames(pg, pg_va(pg, r, slot, 0), fr + (size_t)r * np, np)))
            goto out_unmap;
    r = nr;
    for (uint32_t q = 0; q < nr; q++)
        for (uint32_t i = 0; i < np; i++) {
            struct pg_page *p = page_at(pg, pg_bt(pg, s, q)[i]);
            if (p->tier == PG_TIER_HOST &&
                (rc = vmm_copy_htod(pg->v, pg_va(pg, q, slot, i),
                                    pg->p.host->ptr(pg->p.host->arg, p->host_slot),
                                    pg->p.page_size, pg->copy_stream)))
                goto out_sync;
        }
    /* a borrowed slot may be one of s's host pages: its copy is done before it is reused */
    if (bw && (rc = vmm_stream_sync(pg->v, pg->copy_stream)))
        goto out_sync;
    for (uint32_t b = 0; b < ndk; b += bmax) {
        uint32_t m = ndk - b < bmax ? ndk - b : bmax;
        for (nh = 0; nh < m; nh++)
            if (bw)
                hs[nh] = page_at(pg, bw)->host_slot;
            else if ((rc = pg->p.host->alloc(pg->p.host->arg, &hs[nh])))
                goto out_sync;
        if ((rc = disk_stage_io(pg, false, ids + b, ds + b, hs, m)))
            goto out_sync;
        for (uint32_t j = 0; j < m && !rc; j++)
            rc = vmm_copy_htod(pg->v, vas[b + j], pg->p.host->ptr(pg->p.host->arg, hs[j]),
                               pg->p.page_size, pg->copy_stream);
        int src = vmm_stream_sync(pg->v, pg->copy_stream);   /* the slots are reused next */
        if (!rc)
            rc = src;
        if (rc)
            goto out_sync;
        while (nh > 0 && !bw)
            pg->p.host->free(pg->p.host->arg, hs[--nh]);
        nh = 0;
    }
    if ((rc = vmm_stream_sync(pg->v, pg->copy_stream)))
        goto out_sync;
    if (bw) {
        extra = 0;                      /* unmapped by borrow_park, success or not */
        rc = borrow_park(pg, bw, fresh[need], true);
        pool_give(pg, fresh + need, 1);
        if (rc)
            goto out_sync;
    }
    /* commit: nothing below fails */
    k = 0;
    for (uint32_t q = 0; q < nr; q++)
        for (uint32_t i = 0; i < np; i++) {
            uint32_t id = pg_bt(pg, s, q)[i];
            struct pg_page *p = page_at(pg, id);
            p->offs--;
            if (p->tier == PG_TIER_HOST) {
                pg->p.host->free(pg->p.host->arg, p->host_slot);
                p->host_slot = 0;
                pg->n_host--;
            } else if (p->tier == PG_TIER_DISK) {
                pg->disk.free(pg->disk.arg, p->disk_slot);
                p->disk_slot = 0;
                pg->n_disk--;
            } else {
                continue;
            }
            p->tier = PG_TIER_DEVICE;
            p->frame = fresh[k++];
            frame_at(pg, p->frame)->page = id;
        }
    s->out = 0;
    seq_use(pg, s);
    pg->c.swap_ins++;
    pg->c.bytes_to_device += (uint64_t)need * pg->p.page_size;
    pg->c.unspills += ndk;
    pg->c.bytes_from_disk += (uint64_t)ndk * pg->p.page_size;
    rc = 0;
    goto out_free;

out_sync:
    vmm_stream_sync(pg->v, pg->copy_stream);     /* the copies made write into the window */
    while (nh > 0 && !bw)
        pg->p.host->free(pg->p.host->arg, hs[--nh]);
out_unmap:
    while (r-- > 0)
        seq_unmap_must(pg, pg_va(pg, r, slot, 0), np);
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

int paging_swap_in(struct paging *pg, uint64_t h, bool async)
{
    struct pg_seq *s;
    int rc = seq_lookup(pg, h, &s);
    if (rc)
        return rc;
    if (!s->out) {
        rc = async ? 0 : seq_settle(pg, s);   /* a prefetch orders the engine later */
        if (!rc)
            seq_use(pg, s);                     /* protected, prefetch included */
        return rc;
    }
    rc = seq_wait_transfers(pg, s);
    if (!rc)
        rc = copy_stream(pg);
    bool staged = false;
    if (!rc && pg->p.disk)
        rc = in_plan(pg, s, &staged);
    if (!rc && staged)
        return swap_in_staged(pg, s);
    if (rc)
        return rc;
    /* need: host pages to copy in; busy: pages another sequence's swap-in is bringing in
       (TO_DEVICE), which s must be ordered after too: its job names both */
    uint32_t nr = pg->p.n_regions, np = s->n_pages, slot = pg_slot_of(pg, s), need = 0;
    uint32_t busy = 0;
    /* the frames first (host and disk pages alike), before a disk page is read back or
       another sequence's host page spilled for room: a failed call moves nothing */
    for (uint32_t r = 0; r < nr; r++)
        for (uint32_t i = 0; i < np; i++) {
            uint8_t t = page_at(pg, pg_bt(pg, s, r)[i])->tier;
            need += t == PG_TIER_HOST || t == PG_TIER_DISK;
            busy += t == PG_TIER_TO_DEVICE;
        }
    if (pool_available(pg) < need && pg->defer && (rc = defer_reap(pg, true)))
        return rc;
    if (pool_available(pg) < need)
        return -ENOMEM;
    if (pg->p.disk)
        for (uint32_t r = 0; r < nr && !rc; r++)
            rc = disk_unspill(pg, pg_bt(pg, s, r), np, s);
    if (rc)
        return rc;
    need = 0;
    for (uint32_t r = 0; r < nr; r++)
        for (uint32_t i = 0; i < np; i++)
            need += page_at(pg, pg_bt(pg, s, r)[i])->tier == PG_TIER_HOST;
    uint32_t *fr = calloc((size_t)nr * np + need + 1, sizeof *fr);
    struct pg_defer *d = job_new(pg, s, DF_IN, need + busy);
    uint32_t mark = pg->n_created, r = 0;
    rc = -ENOMEM;
    if (!fr || !d)
        goto out_free;
    uint32_t *fresh = fr + (size_t)nr * np;
    if (need && (rc = pool_take(pg, need, fresh)))
        goto out_rollback;
    /* frames per window page: the page's own, or a fresh one for a host page */
    uint32_t k = 0;
    for (uint32_t q = 0; q < nr; q++)
        for (uint32_t i = 0; i < np; i++) {
            struct pg_page *p = page_at(pg, pg_bt(pg, s, q)[i]);
            fr[(size_t)q * np + i] = p->tier == PG_TIER_HOST ? fresh[k++] : p->frame;
        }
    for (r = 0; r < nr; r++)
        if ((rc = seq_map_frames(pg, pg_va(pg, r, slot, 0), fr + (size_t)r * np, np)))
            goto out_unmap;
    r = nr;
    k = 0;
    for (uint32_t q = 0; q < nr && k < need; q++)
        for (uint32_t i = 0; i < np && k < need; i++) {
            struct pg_page *p = page_at(pg, pg_bt(pg, s, q)[i]);
            if (p->tier != PG_TIER_HOST)
                continue;
            rc = vmm_copy_htod(pg->v, pg_va(pg, q, slot, i),
                               pg->p.host->ptr(pg->p.host->arg, p->host_slot),
                               pg->p.page_size, pg->copy_stream);
            k++;
            if (rc)
                goto out_sync;
        }
    bool wait = !pg->stream && !async;
    if (wait && (rc = vmm_stream_sync(pg->v, pg->copy_stream)))
        goto out_sync;
    if (!wait && need + busy) {           /* nothing in flight for s: no fence */
        rc = vmm_fence_create(pg->v, &d->fence);
        if (!rc && (rc = vmm_fence_record(pg->v, &d->fence, pg->copy_stream)) == 0 &&
            pg->stream && !async)
            rc = vmm_stream_after(pg->v, pg->stream, &d->fence);
        if (rc) {
            vmm_fence_destroy(pg->v, &d->fence);
            goto out_sync;
        }
    }
    /* commit */
    k = 0;
    uint32_t j = 0;
    for (uint32_t q = 0; q < nr; q++)
        for (uint32_t i = 0; i < np; i++) {
            uint32_t id = pg_bt(pg, s, q)[i];
            struct pg_page *p = page_at(pg, id);
            p->offs--;
            if (p->tier == PG_TIER_TO_DEVICE && j < d->n)
                d->pages[j++] = id;               /* another's copy: ordered after it */
            if (p->tier != PG_TIER_HOST)
                continue;
            p->tier = PG_TIER_TO_DEVICE;
            p->frame = fresh[k++];
            frame_at(pg, p->frame)->page = id;
            pg->n_inflight++;
            d->pages[j++] = id;
        }
    d->n = j;
    s->out = 0;
    seq_use(pg, s);
    pg->c.swap_ins++;
    pg->c.bytes_to_device += (uint64_t)need * pg->p.page_size;
    free(fr);
    if (!j) {
        free(d);                          /* every page was on the device already */
        return 0;
    }
    if (async)
        s->in_job = d;
    job_start(pg, s, d, wait);
    return 0;

out_sync:
    vmm_stream_sync(pg->v, pg->copy_stream);     /* the copies made write into the window */
out_unmap:
    while (r-- > 0)
        seq_unmap_must(pg, pg_va(pg, r, slot, 0), np);
    if (need)
        pool_give(pg, fresh, need);
out_rollback:
    pool_rollback(pg, mark);
out_free:
    free(fr);
    free(d);
    return rc;
}

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
            if (page_at(pg, pg_bt(pg, s, r)[i])->tier == PG_TIER_TO_DEVICE)
                return 0;
    return 1;
}

int paging_need(struct paging *pg, uint64_t h, uint64_t length, uint32_t *frames)
{
    struct pg_seq *s;
    int rc = seq_lookup(pg, h, &s);
    if (rc)
        return rc;
    if (length > pg->p.max_tokens)
        return -E2BIG;
    uint32_t n = 0, nr = pg->p.n_regions;
    bool disk = false;
    if (s->out)
        for (uint32_t r = 0; r < nr; r++)
            for (uint32_t i = 0; i < s->n_pages; i++) {
                uint8_t t = page_at(pg, pg_bt(pg, s, r)[i])->tier;
                n += t != PG_TIER_DEVICE && t != PG_TIER_TO_DEVICE;
                disk |= t == PG_TIER_DISK || page_in_dio(page_at(pg, pg_bt(pg, s, r)[i]));
            }
    if (disk && stage_must_borrow(pg, s))
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
    uint64_t k = 0;
    int rc = seen ? 0 : -ENOMEM;
    for (size_t j = 0; j < n && !rc; j++) {
        struct pg_seq *s;
        if ((rc = seq_lookup(pg, hs[j], &s)))
            break;
        if (lengths[j] > pg->p.max_tokens) {
            rc = -E2BIG;
            break;
        }
        for (uint32_t r = 0; r < pg->p.n_regions && s->out; r++)
            for (uint32_t i = 0; i < s->n_pages; i++) {
                uint32_t id = pg_bt(pg, s, r)[i];
                uint8_t t = page_at(pg, id)->tier;
                if (t != PG_TIER_DEVICE && t != PG_TIER_TO_DEVICE && !seen[id - 1])
                    k++;              /* a page shared in the batch comes back once */
                seen[id - 1] = 1;
            }
        if (lengths[j] > s->length)
            k += (pg_pages_for(pg, lengths[j]) - s->n_pages) * pg->p.n_regions;
    }
    free(seen);
    if (!rc)
        *frames = k;
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
        uint32_t frees = 0, dev = 0;
        for (uint32_t r = 0; r < pg->p.n_regions; r++)
            for (uint32_t j = 0; j < s->n_pages; j++) {
                const struct pg_page *p = page_at(pg, pg_bt(pg, s, r)[j]);
                frees += moves_down(p);
                dev += p->tier == PG_TIER_DEVICE;
            }
        /* A sequence whose device pages are all shared frees nothing alone, but does with
           its siblings (paging_frees_if_all); one with none is no candidate. (Map-ahead
           frames count as free already.) */
        if (!dev)
            continue;
        out[n++] = (struct pg_cand){ ((uint64_t)s->gen << 32) | (i + 1), s->used_tick, frees };
    }
    return n;
}

uint32_t paging_frees_if_all(struct paging *pg, const struct pg_cand *c, size_t n)
{
    /* A device page is freed when every resident holder of it is in the set: count the
       set's entries per page and compare with the page's resident holders. */
    uint32_t *cnt = calloc(pg->p.max_pages, sizeof *cnt), frees = 0;
    if (!cnt) {
        for (size_t k = 0; k < n; k++)
            frees += c[k].frees;       /* the lower bound */
        return frees;
    }
    for (size_t k = 0; k < n; k++) {
        struct pg_seq *s;
        if (seq_lookup(pg, c[k].h, &s))
            continue;
        for (uint32_t r = 0; r < pg->p.n_regions; r++)
            for (uint32_t j = 0; j < s->n_pages; j++) {
                uint32_t id = pg_bt(pg, s, r)[j];
                const struct pg_page *p = page_at(pg, id);
                if (p->tier == PG_TIER_DEVICE && ++cnt[id - 1] == p->refs - p->offs)
                    frees++;
            }
    }
    free(cnt);
    return frees;
}

uint32_t paging_frames_pending(const struct paging *pg)
{
    uint32_t n = 0;
    for (const struct pg_defer *d = pg->defer; d; d = d->next)
        if (d->kind == DF_OUT)
            for (uint32_t i = 0; i < d->n; i++)
                n += pg->pages[d->pages[i] - 1].tier == PG_TIER_TO_HOST;
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
    return pg->p.host ? pg->p.host->n_free(pg->p.host->arg) : 0;
}

int paging_reap(struct paging *pg)
{
    return defer_reap(pg, false);
}

/* ---- orphans ------------------------------------------------------------------------- */

static bool is_orphan(const struct pg_page *p)
{
    return p->tier == PG_TIER_DEVICE && p->refs && p->refs == p->offs;
}

/* Copies one orphan down through the scratch page. Synchronous; all or nothing.
   No engine work is left on an orphan: no window maps it and no release of it is pending
   (each holds a reference), and a window range is released only once the engine's work on
   it is complete (defer.c). So the copy is ordered after nothing but the copy stream's own
   earlier work, and nothing is recorded on or enqueued onto the engine stream: the reclaim
   thread calls this, and a graph capture may begin on the engine stream at any time. */
static int orphan_move(struct paging *pg, uint32_t id)
{
    struct pg_page *p = page_at(pg, id);
    uint64_t slot;
    if (pg->p.disk && !paging_host_free(pg))
        (void)paging_host_room(pg, 1, 0);
    int rc = pg->p.host->alloc(pg->p.host->arg, &slot);
    if (rc)
        return rc;
    rc = seq_map_frames(pg, pg->scratch_va, &p->frame, 1);
    if (rc)
        goto out_slot;
    rc = vmm_copy_dtoh(pg->v, pg->p.host->ptr(pg->p.host->arg, slot), pg->scratch_va,
                       pg->p.page_size, pg->copy_stream);
    int src = vmm_stream_sync(pg->v, pg->copy_stream);
    if (src && !rc)
        (void)vmm_stream_sync(pg->v, pg->copy_stream);   /* queued still: never unmap under it */
    if (!rc)
        rc = src;
    seq_unmap_must(pg, pg->scratch_va, 1);
    if (rc)
        goto out_slot;
    uint32_t f = p->frame;
    p->tier = PG_TIER_HOST;
    p->host_slot = slot;
    p->frame = 0;
    frame_at(pg, f)->page = 0;
    pool_give(pg, &f, 1);
    pg->n_host++;
    pg->c.bytes_to_host += pg->p.page_size;
    pg->c.orphans_moved++;
    return 0;
out_slot:
    pg->p.host->free(pg->p.host->arg, slot);
    return rc;
}

int paging_reclaim_orphans(struct paging *pg, uint32_t max, uint32_t *moved)
{
    *moved = 0;
    if (!pg->p.host)
        return 0;
    int rc = copy_stream(pg);
    for (uint32_t i = 0; !rc && i < pg->p.max_pages && *moved < max; i++)
        if (is_orphan(&pg->pages[i]) && (rc = orphan_move(pg, i + 1)) == 0)
            (*moved)++;
    return rc;
}

uint32_t tier_orphans(const struct paging *pg)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < pg->p.max_pages; i++)
        n += is_orphan(&pg->pages[i]);
    return n;
}

uint64_t paging_room_below(struct paging *pg)
{
    paging_disk_reap(pg);
    uint64_t d = (pg->p.disk && !pg->disk_off) ? pg->disk.n_free(pg->disk.arg) : 0;
    return paging_host_free(pg) + pg->n_dio + d;
}
