/*
 * paging/plan_marks.c: the page accounting of a reclaim plan (contract in paging.h, "reclaim
 * plans"). swap/ chooses the victims and the order; this file says, exactly and without
 * changing anything, what each move in that order would free and which slots below it
 * would take, on the pages' scratch marks (no array sized to the pool).
 *
 * Per device page, within one plan: n_mark = resident holders planned to leave (a drop or a
 * swap-out), n_gone = references planned to be dropped, kept = a sequence the plan keeps (the
 * caller's own) holds it. A swap-out that is the page's last resident holder copies it down
 * (one slot) and frees its frame; a drop frees the frame only when every reference is gone
 * (a drop moves no data: a page other non-resident holders keep stays, an orphan). A kept
 * page's frame never counts as freed: its holder needs it back (a swapped-out one is coming
 * back, and the frames it needs were counted on the page being on the device).
 */
#include "paging_int.h"
#include "transfers.h"

#include <errno.h>

struct pg_page *plan_page(struct paging *pg, pg_page_id id)
{
    struct pg_page *p = page_at(pg, id);
    if (p->mark != pg->xf.mark) {
        p->mark = pg->xf.mark;
        p->n_mark = 0;
        p->n_gone = 0;
        p->kept = 0;
    }
    return p;
}

/* Marks the device pages of keep[0..n) kept (this walk); *pages gets how many distinct
   ones; returns how many of them are orphans. */
static uint32_t mark_kept(struct paging *pg, const uint64_t *keep, size_t n, uint32_t *pages)
{
    uint32_t orphans = 0;
    *pages = 0;
    for (size_t k = 0; k < n; k++) {
        struct pg_seq *s;
        if (seq_lookup(pg, keep[k], &s))
            continue;
        for (struct pg_bt_iter it = bt_all(pg, s); bt_next(&it);) {
            if (page_at(pg, it.id)->tier != PG_TIER_DEVICE)
                continue;
            struct pg_page *p = plan_page(pg, it.id);
            if (!p->kept) {
                orphans += page_orphan(p);
                (*pages)++;
            }
            p->kept = 1;
        }
    }
    return orphans;
}

uint32_t tier_mark_kept(struct paging *pg, const uint64_t *keep, size_t n)
{
    uint32_t pages;
    return mark_kept(pg, keep, n, &pages);
}

uint32_t plan_marks_begin(struct paging *pg, const uint64_t *keep, size_t n_keep)
{
    tier_mark_begin(pg);
    uint32_t kept = tier_mark_kept(pg, keep, n_keep);
    return pg->pd.n_orphans > kept ? pg->pd.n_orphans - kept : 0;
}

/* Applies (d = +1) or reverts (d = -1) moving h; the frames it frees and slots it takes. */
static int plan_apply(struct paging *pg, uint64_t h, bool drop, int d, uint32_t *frees,
                      uint32_t *slots, uint32_t *kslots)
{
    struct pg_seq *s;
    int rc = seq_lookup(pg, h, &s);
    *frees = *slots = *kslots = 0;
    if (rc)
        return rc;
    for (struct pg_bt_iter it = bt_all(pg, s); bt_next(&it);) {
        if (page_at(pg, it.id)->tier != PG_TIER_DEVICE)
            continue;                   /* a page already below: nothing moves */
        struct pg_page *p = plan_page(pg, it.id);
        if (d < 0) {                    /* the state before this move: undo its counts */
            p->n_mark--;
            p->n_gone -= drop;
        }
        uint32_t mapping = p->refs - p->offs;
        bool last = p->n_mark + 1 == mapping;   /* the last resident holder leaves */
        if (drop) {
            if (p->n_gone + 1 == p->refs)
                (*frees)++;             /* (a kept page has a holder outside: never here) */
        } else if (last) {
            (*slots)++;                 /* copied down by this swap-out */
            *frees += !p->kept;
            *kslots += p->kept;
        }
        if (d > 0) {
            p->n_mark++;
            p->n_gone += drop;
        }
    }
    return 0;
}

int paging_plan_add(struct paging *pg, uint64_t h, bool drop, uint32_t *frees,
                    uint32_t *slots, uint32_t *kslots)
{
    return plan_apply(pg, h, drop, 1, frees, slots, kslots);
}

void paging_plan_remove(struct paging *pg, uint64_t h, bool drop)
{
    uint32_t f, sl, ks;
    (void)plan_apply(pg, h, drop, -1, &f, &sl, &ks);
}

uint32_t paging_device_pages_of(struct paging *pg, const uint64_t *hs, size_t n)
{
    uint32_t k;
    tier_mark_begin(pg);
    (void)mark_kept(pg, hs, n, &k);
    return k;
}

uint32_t paging_seq_device_pages(struct paging *pg, uint64_t h)
{
    struct pg_seq *s;
    uint32_t n = 0;
    if (seq_lookup(pg, h, &s))
        return 0;
    for (struct pg_bt_iter it = bt_all(pg, s); bt_next(&it);)
        n += page_at(pg, it.id)->tier == PG_TIER_DEVICE;
    return n;
}
