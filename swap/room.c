/*
 * swap/room.c: the host tier's policy (contract in swap_int.h): spill victims (the prefix
 * cache's entries first, in its own order, then sequences in LRU order), how hard a caller
 * short of host slots spills, and direct vs staged swaps. paging moves the pages
 * (paging_disk_spill_seq, paging_held_spill, the swap paths); nothing here touches a page
 * itself.
 */
#include "swap_int.h"

#include <errno.h>
#include <stdlib.h>

static int lru_cmp(const void *a, const void *b)
{
    const struct pg_cand *x = a, *y = b;
    return x->tick < y->tick ? -1 : x->tick > y->tick;
}

void swap_lru_sort(struct pg_cand *c, size_t n)
{
    if (n > 1)
        qsort(c, n, sizeof *c, lru_cmp);
}

int swap_spill(struct swap *sw, uint32_t max, uint64_t excl, uint32_t *started)
{
    struct paging *pg = sw->pg;
    *started = 0;
    if (!paging_disk_on(pg))
        return -ENOMEM;
    if (sw->cache.spill)                /* pages no sequence holds: none is excl's */
        *started = sw->cache.spill(sw->cache.arg, max);
    if (*started >= max)
        return 0;
    struct pg_cand *c;
    size_t n = paging_candidates(pg, &(struct pg_cand_q){ .of = PG_CAND_DISK }, &c);
    if (!c)
        return *started ? 0 : -ENOMEM;
    swap_lru_sort(c, n);
    int rc = 0;
    for (size_t k = 0; k < n && *started < max && !rc; k++) {
        uint32_t got = 0;
        rc = paging_disk_spill_seq(pg, c[k].h, max - *started, excl, &got);
        *started += got;
    }
    free(c);
    return *started ? 0 : rc;
}

/* `want` host slots free by dropping the prefix cache's entries whose pages are all on the
   host tier (swap_cache_ops.host_drop): counted whole first, dropped only when they cover
   the shortfall (else -ENOMEM, nothing dropped). Within a public call (its reclaim, or its
   own move: a swap-out, a swap-in's staging) the drops are moves no undo takes back (their
   host slots are what the move takes): counted lost, so that the call, should it fail
   after, says so (swap_call_end: -EIO); the threads' drops are no call's. */
static int host_drop(struct swap *sw, uint32_t want)
{
    size_t have = paging_host_free(sw->pg);
    if (have >= want)
        return 0;
    uint32_t need = (uint32_t)(want - have);
    if (!sw->cache.host_drop || sw->cache.host_drop(sw->cache.arg, need, false) < need)
        return -ENOMEM;
    sw->cache.host_drop(sw->cache.arg, need, true);
    sw->undo.lost += sw->undo.on || sw->undo.in_call;
    return paging_host_free(sw->pg) >= want ? 0 : -ENOMEM;
}

/* Whether spilling (writes in flight, spillable pages with disk slots for them) can make
   the host tier's free slots `want`. */
static bool spills_cover(struct paging *pg, uint32_t want)
{
    if (!paging_disk_on(pg))
        return false;
    struct pg_room f;
    paging_room_facts(pg, &f);
    return pg_room_reach(&f, 0) >= want;    /* the first tier below, the host tier's */
}

int swap_host_room(void *arg, uint32_t want, uint64_t excl)
{
    struct swap *sw = arg;
    struct paging *pg = sw->pg;
    /* no disk room takes the spills: entries no sequence holds go instead (docs/api.md:
       they never block a call that needs room) */
    if (paging_host_free(pg) < want && !spills_cover(pg, want))
        return host_drop(sw, want);
    for (int round = 0; round < 4; round++) {
        size_t have = paging_host_free(pg);
        if (have >= want)
            return 0;
        if (!paging_has_disk(pg))
            return host_drop(sw, want);
        /* writes already in flight free their slots too (outside a swap-in's read back
           every disk I/O is a write) */
        uint32_t started = 0;
        uint32_t need = (uint32_t)(want - have);
        uint32_t pend = paging_disk_inflight(pg);
        if (pend < need)
            swap_spill(sw, need - pend, excl, &started);
        if (!started && !pend)
            return host_drop(sw, want);
        paging_disk_wait(pg);
    }
    return host_drop(sw, want);
}

/* With H free host slots, W writes in flight, S spillable host pages of others (the room
   facts t[PG_LOWER_HOST].free, .freeing, .movable) and D free disk slots
   (t[PG_LOWER_DISK].free), a swap of `need` pages moves directly when
   need <= H + W + min(S, D) (pg_room_reach of the first tier below: the room is made by
   spilling others). Else a swap-in is staged;
   a swap-out is staged when the disk can take every page (D >= need) and a host slot can be
   had to stage through (one free or coming free, or a page of another to spill with a disk
   slot to spare), else it is -ENOMEM before anything moved. */
int swap_plan(void *arg, bool in, const struct pg_room *r)
{
    (void)arg;
    if (r->need <= pg_room_reach(r, 0))
        return PG_MOVE_DIRECT;
    /* staged: the host and disk pair's own way (host_in.c, host_out.c) */
    const struct pg_tier_room *h = &r->t[PG_LOWER_HOST], *d = &r->t[PG_LOWER_DISK];
    if (in)
        return PG_MOVE_STAGED;
    if (d->free < r->need)
        return -ENOMEM;
    if (h->free + h->freeing == 0 && (h->movable == 0 || d->free == r->need))
        return -ENOMEM;                    /* no slot to stage through */
    return PG_MOVE_STAGED;
}
