/*
 * paging/orphan.c: orphan pages, device pages whose holders are all non-resident (their last
 * resident holder left after the others were swapped out, or a release that held one
 * completed). No window maps them, so they are copied to the host tier one at a time
 * through the scratch page (contract in paging.h, paging_reclaim_orphans).
 */
#include "paging_int.h"
#include "frames.h"
#include "transfers.h"
#include "clock.h"
#include "window.h"
#include "common/log.h"

#include <errno.h>
#include <stdlib.h>

/* Copies one orphan down through the scratch page. Synchronous; all or nothing.
   No engine work is left on an orphan: no window maps it and no release of it is pending
   (each holds a reference), and a window range is released only once the engine's work on
   it is complete (defer.c). So the copy is ordered after nothing but the copy stream's own
   earlier work, and nothing is recorded on or enqueued onto the engine stream: the reclaim
   thread calls this, and a graph capture may begin on the engine stream at any time. The
   same holds for a page only holders keep (hold.c, paging_held_down). */
int tier_page_down(struct paging *pg, pg_page_id id)
{
    struct pg_page *p = page_at(pg, id);
    pg_slot slot;
    /* room by the policy: spills, or, without disk room, the drop of entries no sequence
       holds whose pages are all below (the room a plan counted for this move) */
    if (!paging_host_free(pg))
        (void)paging_host_room(pg, 1, 0);
    int rc = lower_take(pg, PG_LOWER_HOST, 1, &slot);
    if (rc)
        return rc;
    rc = win_map_frames(pg, pg->scratch_va, &p->frame, 1);
    if (rc)
        goto out_slot;
    rc = tier_copy_finish(pg, tier_copy_out(pg, slot, pg->scratch_va));
    win_unmap_must(pg, pg->scratch_va, 1);
    if (rc)
        goto out_slot;
    page_count(pg, p, -1);
    page_frame_drop(pg, p);
    page_set_tier(p, PG_TIER_HOST);
    page_take_slot(pg, p, PG_LOWER_HOST, slot);
    page_count(pg, p, 1);
    pg->c.bytes_to_host += pg->p.page_size;
    return 0;
out_slot:
    lower_give(pg, PG_LOWER_HOST, &slot, 1);
    return rc;
}

int paging_reclaim_orphans(struct paging *pg, uint32_t max, const uint64_t *keep,
                           size_t n_keep, uint32_t *moved)
{
    *moved = 0;
    if (!lower_on(pg, PG_LOWER_HOST))
        return 0;
    int rc = tier_copy_stream(pg);
    if (n_keep) {
        tier_mark_begin(pg);
        tier_mark_kept(pg, keep, n_keep);
    }
    /* the scan stops at the last orphan (none: no scan) */
    uint32_t left = pg->pd.n_orphans;
    for (uint32_t i = 0; !rc && left && i < pg->p.max_pages && *moved < max; i++) {
        const struct pg_page *p = &pg->pd.pages[i];
        if (!page_orphan(p))
            continue;
        left--;
        if (n_keep && p->mark == pg->xf.mark && p->kept)
            continue;                   /* a kept sequence maps it again soon */
        uint32_t *log = pg->xf.orphan_log, *ln = pg->xf.orphan_log_n;
        if (log && *ln >= pg->xf.orphan_log_cap) {
            rc = -ENOMEM;               /* its undo record would not fit: not moved */
            break;
        }
        if ((rc = tier_page_down(pg, (pg_page_id){ i + 1 })) == 0) {
            (*moved)++;
            pg->c.orphans_moved++;
            if (log)
                log[(*ln)++] = i + 1;
        }
    }
    return rc;
}

int paging_seq_orphans_down(struct paging *pg, uint64_t h, uint32_t *moved)
{
    struct pg_seq *s;
    *moved = 0;
    int rc = seq_lookup(pg, h, &s);
    if (rc || !s->out || !pg->pd.n_orphans || !lower_on(pg, PG_LOWER_HOST))
        return rc;
    uint32_t need = 0;
    for (struct pg_bt_iter it = bt_all(pg, s); bt_next(&it);)
        need += page_orphan(page_at(pg, it.id));   /* a page twice in s: counted twice, */
    if (!need)                                     /* an upper bound of the slots */
        return 0;
    if ((rc = tier_copy_stream(pg)))
        return rc;
    /* room first: all or nothing for lack of room (spills, or entries' drops, by policy) */
    if (paging_host_free(pg) < need)
        (void)paging_host_room(pg, need, 0);
    if (paging_host_free(pg) < need)
        return pg_why_host(pg, need);
    pg_page_id *ids = malloc(need * sizeof *ids);
    if (!ids)
        return -ENOMEM;
    uint32_t n = 0;
    for (struct pg_bt_iter it = bt_all(pg, s); !rc && bt_next(&it);) {
        if (!page_orphan(page_at(pg, it.id)))
            continue;                   /* resident holder, in flight, or moved already */
        KVVM_ASSERT(n < need);
        if ((rc = tier_page_down(pg, it.id)) == 0)
            ids[n++] = it.id;
    }
    /* a refusal (a driver's map, a copy) part way: the pages moved come back, so the call
       changes nothing; one that cannot come back is left below (still s's, intact) */
    for (uint32_t i = n; rc && i-- > 0;)
        if (paging_orphan_back(pg, ids[i].v))
            klog_warn("paging: orphan page %u stays on the host tier after a failed move "
                      "of its sequence's orphans", ids[i].v);
    if (!rc) {
        *moved = n;
        pg->c.orphans_moved += n;
    }
    free(ids);
    return rc;
}

uint32_t tier_orphans(const struct paging *pg)
{
    return pg->pd.n_orphans;
}

void paging_orphan_log(struct paging *pg, uint32_t *ids, uint32_t cap, uint32_t *n)
{
    pg->xf.orphan_log = ids;
    pg->xf.orphan_log_cap = ids ? cap : 0;
    pg->xf.orphan_log_n = ids ? n : NULL;
}

/* tier_page_down's inverse for page pid, which no window maps (its holders: non-resident
   sequences, entries), through the scratch page: back from its host slot (read back first
   if it was spilled since) into a frame of the pool. All or nothing. */
static int page_back(struct paging *pg, pg_page_id pid)
{
    struct pg_page *p = page_at(pg, pid);
    if (p->tier == PG_TIER_DISK || p->tier == PG_TIER_TO_DISK) {
        int rc = paging_disk_unspill(pg, &pid, 1, NULL);     /* spilled since: read back */
        if (rc)
            return rc;
    }
    if (p->tier != PG_TIER_HOST || pg_slot_is_none(p->slot[PG_LOWER_HOST]) ||
        (lower_on(pg, PG_LOWER_DISK) && !pg_slot_is_none(p->slot[PG_LOWER_DISK])))
        return -ESTALE;
    pg_frame_id f;
    int rc = pool_take(pg, 1, &f);
    if (rc)
        return rc;
    rc = win_map_frames(pg, pg->scratch_va, &f, 1);
    if (!rc) {
        rc = tier_copy_finish(pg, tier_copy_in(pg, pg->scratch_va,
                                               p->slot[PG_LOWER_HOST]));
        win_unmap_must(pg, pg->scratch_va, 1);
    }
    if (rc) {
        pool_give(pg, &f, 1);
        return rc;
    }
    /* commit: nothing below fails */
    page_count(pg, p, -1);
    page_release_slot(pg, p, PG_LOWER_HOST);
    page_set_tier(p, PG_TIER_DEVICE);
    page_frame_set(pg, pid, f);
    page_count(pg, p, 1);
    return 0;
}

int paging_orphan_back(struct paging *pg, uint32_t id)
{
    pg_page_id pid = { id };
    const struct pg_page *p = page_at(pg, pid);
    if (!p->refs || p->refs != p->offs || p->offs <= p->ents)
        return -ESTALE;                 /* no longer an orphan's holders */
    int rc = page_back(pg, pid);
    KVVM_ASSERT(rc || page_orphan(p));
    return rc;
}

int paging_held_back(struct paging *pg, const pg_page_id *ids, const uint8_t *moved, size_t n)
{
    int first = 0;
    for (size_t i = 0; i < n; i++) {
        if (!moved[i])
            continue;
        const struct pg_page *p = page_at(pg, ids[i]);
        int rc = p->refs && p->refs == p->ents ? page_back(pg, ids[i]) : -ESTALE;
        first = first ? first : rc;
    }
    return first;
}
