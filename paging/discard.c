/*
 * paging/discard.c: sliding-window discard and sequence classes (contract in paging.h,
 * "sliding-window discard and sequence classes").
 *
 * Holes: a discarded page leaves block-table entry PG_PAGE_NONE below n_pages; the window is
 * unmapped (after the step fence, through the pending-release list, like any release) and
 * the sequence's reference is dropped, so a page shared with a fork or a share target stays
 * with them. Holes of region r always lie in [0, pages wholly before kept[r]), plus, after a
 * truncate below first_kept, possibly the partial last page (seq.c's tail_fill makes it
 * again when the sequence grows past it). Every path over block tables skips holes.
 *
 * Classes: the policy (swap/) asks for the CACHED candidates and drops (or demotes) them
 * before it swaps LIVE sequences; this file only does what it is told. A drop releases the
 * pages and keeps the handle: the sequence is empty and -ESTALE for the calls that use its
 * bytes until set_class (or free).
 */
#include "paging_int.h"
#include "frames.h"
#include "seqs.h"
#include "ahead.h"
#include "transfers.h"
#include "clock.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "common/log.h"

void discard_clamp_kept(struct paging *pg, struct pg_seq *s)
{
    for (uint32_t r = 0; r < pg->p.n_regions; r++)
        if (s->kept[r] > s->length)
            s->kept[r] = s->length;
}

/* Drops the entries [0, end) of the regions of `region` of non-resident s (no window maps
   them: the references only). */
static void drop_out_entries(struct paging *pg, struct pg_seq *s, uint32_t region,
                             uint32_t end)
{
    for (struct pg_bt_iter it = bt_region(pg, s, region, 0, end); bt_next(&it);) {
        page_put_off(pg, it.id);        /* (the HOST-page and orphan counts follow) */
        *it.e = PG_PAGE_NONE;
    }
}

int paging_seq_discard(struct paging *pg, uint64_t h, uint32_t region, uint64_t first_kept)
{
    struct pg_seq *s;
    int rc = seq_lookup(pg, h, &s);
    if (rc)
        return rc;
    uint32_t nr = pg->p.n_regions;
    if ((region != UINT32_MAX && region >= nr) || first_kept > s->length)
        return -EINVAL;
    seq_room_void(s);                   /* holes may open in its last page */
    /* pages wholly before first_kept: [0, end); first_kept <= length keeps end <= n_pages */
    uint32_t end = (uint32_t)(first_kept * pg->p.bytes_per_token / pg->p.page_size);
    uint32_t lo = end, cnt = 0;
    for (struct pg_bt_iter it = bt_region(pg, s, region, 0, end); bt_next(&it);) {
        cnt++;
        lo = it.i < lo ? it.i : lo;
    }
    if (cnt && s->out) {
        drop_out_entries(pg, s, region, end);
    } else if (cnt) {
        rc = defer_settle(pg, s);
        if (!rc)
            rc = defer_release_region(pg, s, region, lo, end, false);
        if (rc)
            return rc;
        /* commit: nothing below fails */
        for (uint32_t r = 0; r < nr; r++)
            if (region == UINT32_MAX || r == region)
                memset(pg_bt(pg, s, r) + lo, 0, (end - lo) * sizeof *s->bt);
    }
    for (uint32_t r = 0; r < nr; r++)
        if ((region == UINT32_MAX || r == region) && s->kept[r] < first_kept)
            s->kept[r] = first_kept;
    pg->c.pages_discarded += cnt;
    return 0;
}

int paging_seq_first_kept(struct paging *pg, uint64_t h, uint32_t r, uint64_t *first_kept)
{
    struct pg_seq *s;
    int rc = seq_lookup(pg, h, &s);
    if (rc)
        return rc;
    if (r >= pg->p.n_regions)
        return -EINVAL;
    *first_kept = s->kept[r];
    return 0;
}

int paging_seq_page_tier(struct paging *pg, uint64_t h, uint32_t r, uint32_t i,
                         enum pg_tier *tier)
{
    struct pg_seq *s;
    int rc = seq_lookup(pg, h, &s);
    if (rc)
        return rc;
    if (r >= pg->p.n_regions || i >= s->n_pages)
        return -EINVAL;
    pg_page_id id = pg_bt(pg, s, r)[i];
    *tier = pg_page_is_none(id) ? PG_TIER_NONE : (enum pg_tier)page_at(pg, id)->tier;
    return 0;
}

int paging_seq_set_class(struct paging *pg, uint64_t h, uint32_t cls)
{
    struct pg_seq *s;
    int rc = seq_lookup(pg, h, &s);
    if (rc)
        return rc;
    if (cls > PG_SEQ_PINNED)
        return -EINVAL;
    s->cls = (uint8_t)cls;
    s->dropped = 0;             /* a dropped one is an empty sequence of that class now */
    return 0;
}

int paging_seq_class(struct paging *pg, uint64_t h)
{
    struct pg_seq *s;
    int rc = seq_lookup(pg, h, &s);
    return rc ? rc : s->cls;
}

int paging_seq_stale(struct paging *pg, uint64_t h)
{
    struct pg_seq *s;
    int rc = seq_lookup(pg, h, &s);
    return rc ? rc : s->dropped ? -ESTALE : 0;
}

/* The sequence of h when it is CACHED and not dropped (what a drop or a demotion acts on):
   -EINVAL another class or dropped, else seq_lookup's errors. */
static int cached_lookup(struct paging *pg, uint64_t h, struct pg_seq **out)
{
    int rc = seq_lookup(pg, h, out);
    if (!rc && ((*out)->cls != PG_SEQ_CACHED || (*out)->dropped))
        rc = -EINVAL;
    return rc;
}

int paging_seq_drop(struct paging *pg, uint64_t h, bool wait)
{
    struct pg_seq *s;
    int rc = cached_lookup(pg, h, &s);
    if (rc)
        return rc;
    if (s->in_job)
        return -EBUSY;          /* a prefetch the engine stream is not ordered after yet */
    if (s->out) {
        tier_drop_out(pg, s, 0, s->n_pages);
    } else {
        /* unprotected (what reclaim picks): ordered after the step fence on the copy
           stream, so a library thread never records on the engine stream */
        bool lib = !(s->used_valid && s->used_epoch >= pg->epoch);
        rc = defer_release_region(pg, s, UINT32_MAX, 0, s->n_pages, lib);
        if (rc)
            return rc;
        /* commit: nothing below fails */
        ahead_drop(pg, s, 0);
        for (uint32_t r = 0; r < pg->p.n_regions; r++)
            memset(pg_bt(pg, s, r), 0, s->n_pages * sizeof *s->bt);
    }
    s->n_pages = 0;
    s->length = 0;
    memset(s->kept, 0, pg->p.n_regions * sizeof *s->kept);
    s->dropped = 1;
    seq_room_void(s);
    pg->c.cache_drops++;
    if (wait && s->n_defer)
        (void)defer_flush_slot(pg, pg_slot_of(pg, s));   /* best effort: the drop is done */
    return 0;
}

/* The host slots a stash of resident CACHED s takes: its device pages that go down with
   it (a page another resident holder keeps stays on the device). -ENOSPC where a page it
   shares with non-resident holders would go down with it, where the drop leaves it on the
   device for them. */
static int stash_moves(struct paging *pg, struct pg_seq *s, uint32_t *moves)
{
    *moves = 0;
    for (struct pg_bt_iter it = bt_all(pg, s); bt_next(&it);) {
        const struct pg_page *p = page_at(pg, it.id);
        if (!page_moves_down(p))
            continue;
        if (p->refs > 1)
            return -ENOSPC;
        (*moves)++;
    }
    return 0;
}

int paging_seq_stash_slots(struct paging *pg, uint64_t h, uint32_t *slots)
{
    struct pg_seq *s;
    *slots = UINT32_MAX;
    int rc = cached_lookup(pg, h, &s);
    if (!rc && (s->out || !lower_on(pg, PG_LOWER_HOST)))
        rc = -ENOSPC;
    return rc ? rc : stash_moves(pg, s, slots);
}

int paging_seq_stash(struct paging *pg, uint64_t h)
{
    uint32_t moves;
    int rc = paging_seq_stash_slots(pg, h, &moves);
    if (rc)
        return rc;
    if (paging_host_free(pg) < moves)
        return -ENOSPC;                 /* no room as it is: no other page may move for it */
    uint64_t outs = pg->c.swap_outs, bytes = pg->c.bytes_to_host;
    rc = paging_swap_out(pg, h, true);
    pg->c.swap_outs = outs;             /* a drop to be: counted as one at its commit */
    pg->c.bytes_to_host = bytes;
    return rc;
}

int paging_seq_stash_drop(struct paging *pg, uint64_t h, const struct pg_use *use)
{
    struct pg_seq *s;
    int rc = seq_lookup(pg, h, &s);
    if (!rc && !s->out)
        rc = -EINVAL;                   /* not stashed (swapped in since) */
    if (!rc)
        rc = paging_seq_drop(pg, h, true);
    if (rc)
        return rc;
    seq_set_out(pg, s, false);          /* empty: resident, as a drop in place leaves it */
    paging_seq_use_set(pg, h, use);
    return 0;
}

int paging_seq_demote(struct paging *pg, uint64_t h)
{
    struct pg_seq *s;
    int rc = cached_lookup(pg, h, &s);
    if (!rc)
        rc = paging_swap_out(pg, h, true);
    if (!rc)
        pg->c.cache_demotes++;
    return rc;
}

size_t paging_cached_candidates(struct paging *pg, struct pg_cand *out, size_t max)
{
    size_t n = 0;
    for (uint32_t i = 0; i < pg->p.max_seqs && n < max; i++) {
        struct pg_seq *s = &pg->seqs[i];
        if (!s->live || s->cls != PG_SEQ_CACHED || s->dropped || s->out || s->n_defer ||
            s->in_job || (s->used_valid && s->used_epoch >= pg->epoch))
            continue;
        uint32_t frees = 0, dev = 0;
        for (uint32_t r = 0; r < pg->p.n_regions; r++)
            for (uint32_t j = 0; j < s->n_pages; j++) {
                pg_page_id id = pg_bt(pg, s, r)[j];
                if (pg_page_is_none(id))
                    continue;
                const struct pg_page *p = page_at(pg, id);
                dev += p->tier == PG_TIER_DEVICE;
                frees += p->tier == PG_TIER_DEVICE && p->refs == 1;
            }
        if (dev)
            out[n++] = (struct pg_cand){ seq_handle(pg, s), s->used_tick, frees, s->cls };
    }
    return n;
}
