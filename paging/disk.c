/*
 * paging/disk.c: the disk tier's mechanism over pg_disk_ops (contract in paging.h, "disk
 * tier"): which host pages are written out, the TO_DISK / FROM_DISK transitions, damage.
 *
 * Every page I/O holds one reference and one job on its page (so the checker and
 * page_sharers see it as a transfer) until its completion is processed here.
 */
#include "paging_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "common/log.h"

bool paging_has_disk(const struct paging *pg)
{
    return pg->disk.alloc != NULL;
}

uint32_t paging_disk_inflight(const struct paging *pg)
{
    return pg->n_dio;
}

void paging_disk_wait_io(struct paging *pg)
{
    if (pg->disk.alloc)
        pg->disk.wait(pg->disk.arg);
}

static void dio_end(struct paging *pg, uint32_t id)
{
    struct pg_page *p = page_at(pg, id);
    p->jobs--;
    pg->n_dio--;
    page_put(pg, id);
}

static void disk_complete(struct paging *pg, const struct pg_disk_done *d)
{
    struct pg_page *p = page_at(pg, d->page);
    if (p->staged == STG_BUSY) {
        /* a staged swap's I/O: the page keeps its tier, disk_stage_io reads the outcome */
        p->staged = d->status ? STG_FAIL : STG_OK;
        if (d->status && !pg->stage_rc)
            pg->stage_rc = d->status;
        if (d->status && d->write) {
            if (!pg->disk_off)
                klog_error("paging: a staged spill write failed (%d); spilling is disabled "
                           "for this context", d->status);
            pg->disk_off = 1;
        } else if (d->status) {
            if (!p->bad)
                pg->c.pages_damaged++;
            p->bad = 1;
            klog_error("paging: reading page %u back from disk failed (%d); the sequences "
                       "holding it are damaged (-EBADMSG)", d->page, d->status);
        }
    } else if (d->write && p->tier == PG_TIER_TO_DISK) {
        if (d->status == 0) {
            pg->p.host->free(pg->p.host->arg, p->host_slot);
            p->host_slot = 0;
            pg->n_host--;
            p->tier = PG_TIER_DISK;
            pg->c.spills++;
            pg->c.bytes_to_disk += pg->p.page_size;
        } else {
            /* the host copy is intact: the page stays in the host tier */
            pg->disk.free(pg->disk.arg, p->disk_slot);
            p->disk_slot = 0;
            pg->n_disk--;
            p->tier = PG_TIER_HOST;
            if (!pg->disk_off)
                klog_error("paging: a spill write failed (%d); spilling is disabled for this "
                           "context, pages stay in the host tier", d->status);
            pg->disk_off = 1;
        }
    } else if (!d->write && p->tier == PG_TIER_FROM_DISK) {
        if (d->status == 0) {
            pg->disk.free(pg->disk.arg, p->disk_slot);
            p->disk_slot = 0;
            pg->n_disk--;
            p->tier = PG_TIER_HOST;
            pg->c.unspills++;
            pg->c.bytes_from_disk += pg->p.page_size;
        } else {
            pg->p.host->free(pg->p.host->arg, p->host_slot);
            p->host_slot = 0;
            pg->n_host--;
            p->tier = PG_TIER_DISK;
            if (!p->bad)
                pg->c.pages_damaged++;
            p->bad = 1;
            klog_error("paging: reading page %u back from disk failed (%d); the sequences "
                       "holding it are damaged (-EBADMSG)", d->page, d->status);
        }
    } else {
        klog_error("paging: disk completion for page %u in tier %u", d->page, p->tier);
        return;
    }
    dio_end(pg, d->page);
}

int paging_disk_reap(struct paging *pg)
{
    if (!pg->disk.alloc)
        return 0;
    struct pg_disk_done d[64];
    size_t n;
    while ((n = pg->disk.reap(pg->disk.arg, d, 64)) > 0)
        for (size_t i = 0; i < n; i++)
            disk_complete(pg, &d[i]);
    return 0;
}

int paging_disk_wait(struct paging *pg)
{
    if (!pg->disk.alloc)
        return 0;
    if (pg->n_dio)
        pg->disk.wait(pg->disk.arg);
    return paging_disk_reap(pg);
}

/* HOST -> TO_DISK: allocates a disk slot and submits the write. -ENOMEM disk full. */
static int spill_page(struct paging *pg, uint32_t id)
{
    struct pg_page *p = page_at(pg, id);
    uint64_t slot;
    int rc = pg->disk.alloc(pg->disk.arg, pg->disk_hint, &slot);
    if (rc)
        return rc;
    rc = pg->disk.submit(pg->disk.arg, true, slot, pg->p.host->ptr(pg->p.host->arg,
                         p->host_slot), id);
    if (rc) {
        pg->disk.free(pg->disk.arg, slot);
        return rc;
    }
    pg->disk_hint = slot;
    p->disk_slot = slot;
    p->tier = PG_TIER_TO_DISK;
    page_get(pg, id);
    p->jobs++;
    pg->n_disk++;
    pg->n_dio++;
    return 0;
}

static int tick_cmp(const void *a, const void *b)
{
    const struct pg_seq *x = *(struct pg_seq *const *)a, *y = *(struct pg_seq *const *)b;
    return x->used_tick < y->used_tick ? -1 : x->used_tick > y->used_tick;
}

int paging_spill(struct paging *pg, uint32_t max, uint64_t excl, uint32_t *started)
{
    *started = 0;
    if (!pg->disk.alloc)
        return -ENOMEM;
    paging_disk_reap(pg);
    if (pg->disk_off)
        return -ENOMEM;
    struct pg_seq *ex = NULL;
    if (excl && seq_lookup(pg, excl, &ex))
        ex = NULL;
    struct pg_seq **v = malloc((pg->p.max_seqs + 1) * sizeof *v);
    if (!v)
        return -ENOMEM;
    uint32_t n = 0;
    for (uint32_t i = 0; i < pg->p.max_seqs; i++)
        if (pg->seqs[i].live && pg->seqs[i].out && &pg->seqs[i] != ex)
            v[n++] = &pg->seqs[i];
    qsort(v, n, sizeof *v, tick_cmp);
    int rc = 0;
    for (uint32_t k = 0; k < n && *started < max && !rc; k++) {
        struct pg_seq *s = v[k];
        for (uint32_t r = 0; r < pg->p.n_regions && *started < max && !rc; r++) {
            const uint32_t *bt = pg_bt(pg, s, r);
            for (uint32_t i = 0; i < s->n_pages && *started < max; i++) {
                uint32_t id = bt[i];
                if (!id)
                    continue;           /* a hole (discard.c) */
                struct pg_page *p = page_at(pg, id);
                if (p->tier != PG_TIER_HOST)
                    continue;
                /* a page the excluded sequence also holds stays */
                if (ex && p->refs > 1) {
                    bool mine = false;
                    for (uint32_t q = 0; q < pg->p.n_regions && !mine; q++)
                        for (uint32_t j = 0; j < ex->n_pages && !mine; j++)
                            mine = pg_bt(pg, ex, q)[j] == id;
                    if (mine)
                        continue;
                }
                if ((rc = spill_page(pg, id)))
                    break;
                (*started)++;
            }
        }
    }
    free(v);
    return *started ? 0 : (rc ? rc : 0);
}

int paging_host_room(struct paging *pg, uint32_t want, uint64_t excl)
{
    if (!pg->p.host)
        return -ENOMEM;
    for (int round = 0; round < 4; round++) {
        size_t have = paging_host_free(pg);
        if (have >= want)
            return 0;
        if (!pg->disk.alloc)
            return -ENOMEM;
        /* writes already in flight free their slots too */
        uint32_t started = 0;
        uint32_t need = (uint32_t)(want - have);
        uint32_t pend = pg->n_dio;   /* (outside disk_unspill every disk I/O is a write) */
        if (pend < need)
            paging_spill(pg, need - pend, excl, &started);
        if (!started && !pend)
            return -ENOMEM;
        paging_disk_wait(pg);
    }
    return paging_host_free(pg) >= want ? 0 : -ENOMEM;
}

int disk_unspill(struct paging *pg, const uint32_t *ids, uint32_t n, struct pg_seq *excl)
{
    if (!pg->disk.alloc)
        return 0;
    uint32_t need = 0;
    bool dio = false;
    for (uint32_t i = 0; i < n; i++)        /* ids[i] 0: a hole (discard.c) */
        dio |= ids[i] && page_in_dio(page_at(pg, ids[i]));
    if (dio)
        paging_disk_wait(pg);
    for (uint32_t i = 0; i < n; i++) {
        if (!ids[i])
            continue;
        struct pg_page *p = page_at(pg, ids[i]);
        if (p->tier == PG_TIER_DISK && p->bad)
            return -EBADMSG;
        need += p->tier == PG_TIER_DISK;
    }
    if (!need)
        return 0;
    if (excl)
        excl->used_tick = ++pg->tick;   /* its host pages are the last to spill */
    uint64_t eh = excl ? ((uint64_t)excl->gen << 32) | (pg_slot_of(pg, excl) + 1) : 0;
    int rc = paging_host_room(pg, need, eh);
    if (rc)
        return rc;
    for (uint32_t i = 0; i < n && !rc; i++) {
        uint32_t id = ids[i];
        if (!id)
            continue;
        struct pg_page *p = page_at(pg, id);
        if (p->tier != PG_TIER_DISK)
            continue;
        uint64_t hs;
        if ((rc = pg->p.host->alloc(pg->p.host->arg, &hs)))
            break;
        rc = pg->disk.submit(pg->disk.arg, false, p->disk_slot,
                             pg->p.host->ptr(pg->p.host->arg, hs), id);
        if (rc) {
            pg->p.host->free(pg->p.host->arg, hs);
            break;
        }
        p->host_slot = hs;
        p->tier = PG_TIER_FROM_DISK;
        page_get(pg, id);
        p->jobs++;
        pg->n_host++;
        pg->n_dio++;
    }
    /* the bytes are needed now: wait for the reads (and whatever else is in flight) */
    paging_disk_wait(pg);
    if (rc)
        return rc;
    for (uint32_t i = 0; i < n; i++) {
        if (!ids[i])
            continue;
        struct pg_page *p = page_at(pg, ids[i]);
        if (p->tier == PG_TIER_DISK)
            return p->bad ? -EBADMSG : -EIO;
    }
    return 0;
}

int disk_stage_io(struct paging *pg, bool write, const uint32_t *ids, const uint64_t *dslots,
                  const uint64_t *hslots, uint32_t n)
{
    int rc = 0;
    uint32_t k = 0;
    pg->stage_rc = 0;
    for (; k < n; k++) {
        rc = pg->disk.submit(pg->disk.arg, write, dslots[k],
                             pg->p.host->ptr(pg->p.host->arg, hslots[k]), ids[k]);
        if (rc)
            break;
        struct pg_page *p = page_at(pg, ids[k]);
        p->staged = STG_BUSY;
        page_get(pg, ids[k]);
        p->jobs++;
        pg->n_dio++;
    }
    if (k)
        paging_disk_wait(pg);   /* every completion is processed: no page stays STG_BUSY */
    for (uint32_t i = 0; i < k; i++) {
        struct pg_page *p = page_at(pg, ids[i]);
        if (p->staged != STG_OK && !rc)
            rc = pg->stage_rc ? pg->stage_rc : -EIO;
        p->staged = STG_NONE;
    }
    pg->stage_rc = 0;
    if (rc && !write)
        for (uint32_t i = 0; i < k; i++)
            if (page_at(pg, ids[i])->bad)
                return -EBADMSG;
    return rc;
}

uint32_t disk_spillable(struct paging *pg, struct pg_seq *excl)
{
    if (!pg->disk.alloc || pg->disk_off)
        return 0;
    uint8_t *seen = calloc(pg->p.max_pages, 1);
    if (!seen)
        return 0;
    /* pages excl holds never spill for its room (paging_spill's rule) */
    if (excl)
        for (uint32_t r = 0; r < pg->p.n_regions; r++)
            for (uint32_t i = 0; i < excl->n_pages; i++)
                if (pg_bt(pg, excl, r)[i])      /* 0: a hole (discard.c) */
                    seen[pg_bt(pg, excl, r)[i] - 1] = 1;
    uint32_t n = 0;
    for (uint32_t q = 0; q < pg->p.max_seqs; q++) {
        struct pg_seq *s = &pg->seqs[q];
        if (!s->live || !s->out || s == excl)
            continue;
        for (uint32_t r = 0; r < pg->p.n_regions; r++)
            for (uint32_t i = 0; i < s->n_pages; i++) {
                uint32_t id = pg_bt(pg, s, r)[i];
                if (!id)
                    continue;           /* a hole (discard.c) */
                if (!seen[id - 1] && page_at(pg, id)->tier == PG_TIER_HOST)
                    n++;
                seen[id - 1] = 1;
            }
    }
    free(seen);
    return n;
}
