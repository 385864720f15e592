/*
 * paging/disk_tier.c: the disk tier's mechanism over its struct pg_tier_ops (an I/O tier;
 * contract in paging.h, "disk tier"): which host pages are written out, the TO_DISK /
 * FROM_DISK transitions, damage. Its names are paging_disk_* (the layer's callers' and the
 * transfers owner's): disk_* names are disk/'s own, the disk tier's layer.
 *
 * Every page I/O holds one reference and one job on its page (so the checker and
 * page_sharers see it as a transfer) until its completion is processed here.
 */
#include "paging_int.h"
#include "frames.h"
#include "transfers.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "common/log.h"

bool paging_has_disk(const struct paging *pg)
{
    return lower_on(pg, PG_LOWER_DISK);
}

uint32_t paging_disk_inflight(const struct paging *pg)
{
    return pg->xf.lower[PG_LOWER_DISK].n_io;
}

void paging_disk_wait_io(struct paging *pg)
{
    if (lower_on(pg, PG_LOWER_DISK))
        pg->xf.lower[PG_LOWER_DISK].ops.wait(pg->xf.lower[PG_LOWER_DISK].ops.arg);
}

static void dio_end(struct paging *pg, pg_page_id id)
{
    page_job_done(pg, id);
    lower_io_done(pg, PG_LOWER_DISK);
    page_put(pg, id);
}

/* A read back from disk failed: the page's data is lost, its holders are damaged. */
static void page_read_lost(struct paging *pg, struct pg_page *p, const struct pg_tier_done *d)
{
    if (!p->bad)
        pg->c.pages_damaged++;
    p->bad = 1;
    klog_error("paging: reading page %u back from disk failed (%d); the sequences "
               "holding it are damaged (-EBADMSG)", d->page.v, d->status);
}

static void paging_disk_complete(struct paging *pg, const struct pg_tier_done *d)
{
    struct pg_page *p = page_at(pg, d->page);
    page_count(pg, p, -1);
    if (p->staged == STG_BUSY) {
        /* a staged swap's I/O: the page keeps its tier, paging_disk_stage_io reads the outcome */
        p->staged = d->status ? STG_FAIL : STG_OK;
        if (d->status && !pg->sp.stage_rc)
            pg->sp.stage_rc = d->status;
        if (d->status && d->write) {
            if (!pg->xf.lower[PG_LOWER_DISK].off)
                klog_error("paging: a staged spill write failed (%d); spilling is disabled "
                           "for this context", d->status);
            pg->xf.lower[PG_LOWER_DISK].off = 1;
        } else if (d->status) {
            page_read_lost(pg, p, d);
        }
    } else if (d->write && p->tier == PG_TIER_TO_DISK) {
        if (d->status == 0) {
            page_release_slot(pg, p, PG_LOWER_HOST);
            page_set_tier(p, PG_TIER_DISK);
            pg->c.spills++;
            pg->c.bytes_to_disk += pg->p.page_size;
        } else {
            /* the host copy is intact: the page stays in the host tier */
            page_release_slot(pg, p, PG_LOWER_DISK);
            page_set_tier(p, PG_TIER_HOST);
            if (!pg->xf.lower[PG_LOWER_DISK].off)
                klog_error("paging: a spill write failed (%d); spilling is disabled for this "
                           "context, pages stay in the host tier", d->status);
            pg->xf.lower[PG_LOWER_DISK].off = 1;
        }
    } else if (!d->write && p->tier == PG_TIER_FROM_DISK) {
        if (d->status == 0) {
            page_release_slot(pg, p, PG_LOWER_DISK);
            page_set_tier(p, PG_TIER_HOST);
            pg->c.unspills++;
            pg->c.bytes_from_disk += pg->p.page_size;
        } else {
            page_release_slot(pg, p, PG_LOWER_HOST);
            page_set_tier(p, PG_TIER_DISK);
            page_read_lost(pg, p, d);
        }
    } else {
        klog_error("paging: disk completion for page %u in tier %u", d->page.v, p->tier);
        page_count(pg, p, 1);
        return;
    }
    page_count(pg, p, 1);
    dio_end(pg, d->page);
}

int paging_disk_reap(struct paging *pg)
{
    if (!lower_on(pg, PG_LOWER_DISK))
        return 0;
    struct pg_tier_done d[64];
    size_t n;
    const struct pg_tier_ops *o = &pg->xf.lower[PG_LOWER_DISK].ops;
    while ((n = o->reap(o->arg, d, 64)) > 0)
        for (size_t i = 0; i < n; i++)
            paging_disk_complete(pg, &d[i]);
    return 0;
}

int paging_disk_wait(struct paging *pg)
{
    if (!lower_on(pg, PG_LOWER_DISK))
        return 0;
    if (pg->xf.lower[PG_LOWER_DISK].n_io)
        pg->xf.lower[PG_LOWER_DISK].ops.wait(pg->xf.lower[PG_LOWER_DISK].ops.arg);
    return paging_disk_reap(pg);
}

/* HOST -> TO_DISK: allocates a disk slot and submits the write. -ENOMEM disk full. */
static int spill_page(struct paging *pg, pg_page_id id)
{
    struct pg_page *p = page_at(pg, id);
    pg_slot slot;
    /* clustered after the last slot allocated */
    int rc = lower_alloc(pg, PG_LOWER_DISK, pg->xf.lower[PG_LOWER_DISK].hint, &slot);
    if (rc)
        return rc;
    rc = lower_io(pg, PG_LOWER_DISK, true, slot,
                  lower_ptr(pg, PG_LOWER_HOST, p->slot[PG_LOWER_HOST]), id);
    if (rc) {
        lower_free(pg, PG_LOWER_DISK, slot);
        return rc;
    }
    pg->xf.lower[PG_LOWER_DISK].hint = slot;
    page_take_slot(pg, p, PG_LOWER_DISK, slot);
    page_count(pg, p, -1);
    page_set_tier(p, PG_TIER_TO_DISK);
    page_count(pg, p, 1);
    page_get_job(pg, id);
    pg->xf.lower[PG_LOWER_DISK].n_io++;
    return 0;
}

bool paging_disk_on(struct paging *pg)
{
    if (!lower_on(pg, PG_LOWER_DISK))
        return false;
    paging_disk_reap(pg);
    return !pg->xf.lower[PG_LOWER_DISK].off;
}

size_t paging_disk_candidates(struct paging *pg, struct pg_cand *out, size_t max)
{
    size_t n = 0;
    for (uint32_t i = 0; i < pg->p.max_seqs && n < max; i++) {
        struct pg_seq *s = &pg->seqs[i];
        if (s->live && s->out)
            out[n++] = (struct pg_cand){ seq_handle(pg, s), s->used_tick, 0, s->cls };
    }
    return n;
}

/* Whether sequence ex holds page id. */
static bool excl_holds(struct paging *pg, struct pg_seq *ex, pg_page_id id)
{
    for (uint32_t q = 0; q < pg->p.n_regions; q++)
        for (uint32_t j = 0; j < ex->n_pages; j++)
            if (pg_page_eq(pg_bt(pg, ex, q)[j], id))
                return true;
    return false;
}

void paging_disk_keep(struct paging *pg, const uint64_t *keep, size_t n)
{
    pg->sp.spill_keep = n ? keep : NULL;
    pg->sp.n_spill_keep = n;
}

/* Whether a sequence of the keep set (paging_disk_keep) other than those before index
   `below` of it holds page id (below = n_spill_keep: any of them). */
static bool kept_holds(struct paging *pg, pg_page_id id, size_t below)
{
    for (size_t k = 0; k < below; k++) {
        struct pg_seq *ks;
        if (!seq_lookup(pg, pg->sp.spill_keep[k], &ks) && excl_holds(pg, ks, id))
            return true;
    }
    return false;
}

int paging_disk_spill_seq(struct paging *pg, uint64_t h, uint32_t max, uint64_t excl,
                          uint32_t *started)
{
    *started = 0;
    if (!lower_on(pg, PG_LOWER_DISK) || pg->xf.lower[PG_LOWER_DISK].off)
        return -ENOMEM;
    struct pg_seq *s, *ex = NULL;
    int rc = seq_lookup(pg, h, &s);
    if (rc)
        return rc;
    if (excl && seq_lookup(pg, excl, &ex))
        ex = NULL;
    if (s == ex || !s->out)
        return 0;
    for (size_t k = 0; k < pg->sp.n_spill_keep; k++)
        if (pg->sp.spill_keep[k] == h)
            return 0;                   /* kept whole */
    for (uint32_t r = 0; r < pg->p.n_regions && *started < max && !rc; r++) {
        const pg_page_id *bt = pg_bt(pg, s, r);
        for (uint32_t i = 0; i < s->n_pages && *started < max; i++) {
            if (pg_page_is_none(bt[i]))
                continue;               /* a hole (discard.c) */
            const struct pg_page *p = page_at(pg, bt[i]);
            if (p->tier != PG_TIER_HOST)
                continue;
            /* a page the excluded sequence or the keep set also holds stays */
            if (p->refs > 1 && ((ex && excl_holds(pg, ex, bt[i])) ||
                                kept_holds(pg, bt[i], pg->sp.n_spill_keep)))
                continue;
            if ((rc = spill_page(pg, bt[i])))
                break;
            (*started)++;
        }
    }
    return *started ? 0 : rc;
}

uint32_t paging_held_host(struct paging *pg, const pg_page_id *ids, size_t n)
{
    uint32_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += page_held_only_host(page_at(pg, ids[i]));
    return k;
}

bool paging_held_host_any(const struct paging *pg)
{
    return pg->pd.n_held_host;
}

bool paging_held_spillable(const struct paging *pg)
{
    return pg->pd.n_held_host && lower_on(pg, PG_LOWER_DISK) &&
           !pg->xf.lower[PG_LOWER_DISK].off && lower_room(pg, PG_LOWER_DISK);
}

int paging_held_spill(struct paging *pg, const pg_page_id *ids, size_t n, uint32_t max,
                      uint32_t *started)
{
    *started = 0;
    if (!lower_on(pg, PG_LOWER_DISK) || pg->xf.lower[PG_LOWER_DISK].off)
        return -ENOMEM;
    int rc = 0;
    for (size_t i = 0; i < n && *started < max && !rc; i++)
        if (page_held_only_host(page_at(pg, ids[i])) && !(rc = spill_page(pg, ids[i])))
            (*started)++;
    return rc;
}

bool paging_held_damaged(struct paging *pg, const pg_page_id *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (page_at(pg, ids[i])->tier == PG_TIER_DISK && page_at(pg, ids[i])->bad)
            return true;
    return false;
}

void paging_disk_settle(struct paging *pg, const pg_page_id *ids, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)        /* ids[i] none: a hole (discard.c) */
        if (!pg_page_is_none(ids[i]) && page_in_dio(page_at(pg, ids[i]))) {
            paging_disk_wait(pg);
            return;
        }
}

int paging_disk_damaged(struct paging *pg, const pg_page_id *ids, uint32_t n, uint32_t *ndisk)
{
    *ndisk = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (pg_page_is_none(ids[i]))
            continue;                       /* a hole (discard.c) */
        const struct pg_page *p = page_at(pg, ids[i]);
        if (p->tier == PG_TIER_DISK && p->bad)
            return -EBADMSG;
        *ndisk += p->tier == PG_TIER_DISK;
    }
    return 0;
}


int paging_disk_unspill(struct paging *pg, const pg_page_id *ids, uint32_t n, struct pg_seq *excl)
{
    if (!lower_on(pg, PG_LOWER_DISK))
        return 0;
    uint32_t need;
    paging_disk_settle(pg, ids, n);
    int rc = paging_disk_damaged(pg, ids, n, &need);
    if (rc || !need)
        return rc;
    rc = paging_host_room(pg, need, excl ? seq_handle(pg, excl) : 0);
    if (rc)
        return rc;
    for (uint32_t i = 0; i < n && !rc; i++) {
        pg_page_id id = ids[i];
        if (pg_page_is_none(id))
            continue;
        struct pg_page *p = page_at(pg, id);
        if (p->tier != PG_TIER_DISK)
            continue;
        pg_slot hs;
        if ((rc = lower_alloc(pg, PG_LOWER_HOST, PG_SLOT_NONE, &hs)))
            break;
        rc = lower_io(pg, PG_LOWER_DISK, false, p->slot[PG_LOWER_DISK],
                      lower_ptr(pg, PG_LOWER_HOST, hs), id);
        if (rc) {
            lower_free(pg, PG_LOWER_HOST, hs);
            break;
        }
        page_take_slot(pg, p, PG_LOWER_HOST, hs);
        page_set_tier(p, PG_TIER_FROM_DISK);
        page_get_job(pg, id);
        pg->xf.lower[PG_LOWER_DISK].n_io++;
    }
    /* the bytes are needed now: wait for the reads (and whatever else is in flight) */
    paging_disk_wait(pg);
    if (rc)
        return rc;
    for (uint32_t i = 0; i < n; i++) {
        if (pg_page_is_none(ids[i]))
            continue;
        struct pg_page *p = page_at(pg, ids[i]);
        if (p->tier == PG_TIER_DISK)
            return p->bad ? -EBADMSG : -EIO;
    }
    return 0;
}

int paging_disk_stage_io(struct paging *pg, bool write, const pg_page_id *ids,
                  const pg_slot *dslots, const pg_slot *hslots, uint32_t n)
{
    int rc = 0;
    uint32_t k = 0;
    pg->sp.stage_rc = 0;
    for (; k < n; k++) {
        rc = lower_io(pg, PG_LOWER_DISK, write, dslots[k],
                      lower_ptr(pg, PG_LOWER_HOST, hslots[k]), ids[k]);
        if (rc)
            break;
        struct pg_page *p = page_at(pg, ids[k]);
        p->staged = STG_BUSY;
        page_get_job(pg, ids[k]);
        pg->xf.lower[PG_LOWER_DISK].n_io++;
    }
    if (k)
        paging_disk_wait(pg);   /* every completion is processed: no page stays STG_BUSY */
    for (uint32_t i = 0; i < k; i++) {
        struct pg_page *p = page_at(pg, ids[i]);
        if (p->staged != STG_OK && !rc)
            rc = pg->sp.stage_rc ? pg->sp.stage_rc : -EIO;
        p->staged = STG_NONE;
    }
    pg->sp.stage_rc = 0;
    if (rc && !write)
        for (uint32_t i = 0; i < k; i++)
            if (page_at(pg, ids[i])->bad)
                return -EBADMSG;
    return rc;
}

uint32_t paging_disk_spillable(struct paging *pg, struct pg_seq *excl)
{
    if (!lower_on(pg, PG_LOWER_DISK) || pg->xf.lower[PG_LOWER_DISK].off)
        return 0;
    /* Every HOST page is held by non-resident sequences and entries only (a resident
       sequence maps all its pages, and no transfer job holds a HOST page), so the spillable
       pages are the HOST pages less those excl or the keep set holds (paging_disk_spill_seq's
       rule; the pages only entries hold spill by paging_held_spill): O(their pages), not
       O(pool); a page two of them hold is counted once. A block table names a page at most
       once. */
    uint32_t n = pg->pd.n_host_pages;
    if (excl)
        for (uint32_t r = 0; r < pg->p.n_regions; r++)
            for (uint32_t i = 0; i < excl->n_pages; i++)
                if (!pg_page_is_none(pg_bt(pg, excl, r)[i]))    /* a hole (discard.c) */
                    n -= page_at(pg, pg_bt(pg, excl, r)[i])->tier == PG_TIER_HOST;
    for (size_t k = 0; k < pg->sp.n_spill_keep; k++) {
        struct pg_seq *ks;
        if (seq_lookup(pg, pg->sp.spill_keep[k], &ks) || ks == excl)
            continue;
        for (uint32_t r = 0; r < pg->p.n_regions; r++)
            for (uint32_t i = 0; i < ks->n_pages; i++) {
                pg_page_id id = pg_bt(pg, ks, r)[i];
                if (!pg_page_is_none(id) && page_at(pg, id)->tier == PG_TIER_HOST &&
                    !(excl && excl_holds(pg, excl, id)) && !kept_holds(pg, id, k))
                    n--;
            }
    }
    return n;
}
