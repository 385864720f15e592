/*
 * paging/seq_share.c: the calls that make sequences share pages or shorten them: truncate, fork
 * (every page shared, copy on write later), share (a prefix: whole pages shared, the partial
 * last page copied). Same shape as seq.c: validate, count and take frames, map, commit the
 * block tables last, undo on failure; holes (discard.c) stay holes.
 */
#include "paging_int.h"
#include "frames.h"
#include "seqs.h"
#include "ahead.h"
#include "transfers.h"
#include "clock.h"
#include "view.h"
#include "window.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include "common/log.h"

/* ---- truncate, fork, share ---------------------------------------------------------- */

int paging_seq_truncate(struct paging *pg, uint64_t h, uint64_t length)
{
    struct pg_seq *s;
    int rc = seq_lookup(pg, h, &s);
    if (rc)
        return rc;
    if (length > s->length)
        return -EINVAL;
    seq_room_void(s);                   /* fewer pages, or a scrub-stale tail */
    uint32_t np = (uint32_t)pg_pages_for(pg, length);
    bool tail = length < s->length && (length * pg->p.bytes_per_token) % pg->p.page_size;
    if (s->out) {
        tier_drop_out(pg, s, np, s->n_pages);
        s->n_pages = np;
        s->length = length;
        s->stale_tail |= tail;
        discard_clamp_kept(pg, s);
        return 0;
    }
    rc = defer_settle(pg, s);
    if (rc)
        return rc;
    ahead_drop(pg, s, 0);
    rc = defer_release(pg, s, np, s->n_pages);
    if (rc)
        return rc;
    for (uint32_t r = 0; r < pg->p.n_regions; r++)
        memset(pg_bt(pg, s, r) + np, 0, (s->n_pages - np) * sizeof *s->bt);
    s->n_pages = np;
    s->length = length;
    s->stale_tail |= tail;
    discard_clamp_kept(pg, s);
    return 0;
}

/* dst's entries [0, n) of every region become src's (a hole, discarded, stays one), each
   page gaining a holder: one that maps it, or (off) one that maps nothing (non-resident). */
static void bt_share(struct paging *pg, struct pg_seq *dst, struct pg_seq *src, uint32_t n,
                     bool off)
{
    for (uint32_t r = 0; r < pg->p.n_regions; r++)
        memcpy(pg_bt(pg, dst, r), pg_bt(pg, src, r), (size_t)n * sizeof *dst->bt);
    for (struct pg_bt_iter it = bt_range(pg, src, 0, pg->p.n_regions, 0, n); bt_next(&it);) {
        if (off)
            page_get_off(pg, it.id);
        else
            page_get(pg, it.id);
    }
}

/* src's pages at page index idx (a share's partial page), holes (discarded: no copy)
   left out: their ids into ids[] (NULL: counted only); returns how many. */
static uint32_t partial_pages(struct paging *pg, struct pg_seq *src, uint32_t idx,
                              pg_page_id *ids)
{
    uint32_t n = 0;
    for (struct pg_bt_iter it = bt_range(pg, src, 0, pg->p.n_regions, idx, idx + 1);
         bt_next(&it); n++)
        if (ids)
            ids[n] = it.id;
    return n;
}

/* Maps src's pages [0, n) of every region into dst's window and takes a reference on each.
   All or nothing. */
static int map_shared(struct paging *pg, struct pg_seq *dst, struct pg_seq *src, uint32_t n)
{
    uint32_t slot = pg_slot_of(pg, dst), r;
    int rc = 0;
    for (r = 0; r < pg->p.n_regions; r++) {
        rc = win_map_pages(pg, slot, r, 0, pg_bt(pg, src, r), n);
        if (rc)
            goto out_unmap;
    }
    bt_share(pg, dst, src, n, false);
    return 0;
out_unmap:
    while (r-- > 0)
        win_unmap_holes_must(pg, pg_va(pg, r, slot, 0), pg_bt(pg, src, r), n);
    return rc;
}

int paging_seq_fork(struct paging *pg, uint64_t parent, uint64_t *child)
{
    struct pg_seq *p, *c;
    int rc = seq_lookup(pg, parent, &p);
    if (rc)
        return rc;
    if (p->dropped)
        return -ESTALE;
    if (!p->out && (rc = defer_settle(pg, p)))
        return rc;
    rc = seq_slot_take(pg, &c);
    if (rc)
        return rc;
    rc = seq_bt_reserve(pg, c, p->n_pages);
    if (rc) {
        seq_slot_untake(pg, c);
        return rc;
    }
    if (p->out) {
        /* the child is non-resident like its parent: it holds the same pages, maps none */
        bt_share(pg, c, p, p->n_pages, true);
        seq_set_out(pg, c, true);
        c->n_pages = p->n_pages;
        c->length = p->length;
        memcpy(c->kept, p->kept, pg->p.n_regions * sizeof *c->kept);   /* the discard */
        c->stale_tail = p->stale_tail;
        *child = seq_handle(pg, c);
        return 0;
    }
    rc = map_shared(pg, c, p, p->n_pages);
    if (rc) {
        seq_slot_untake(pg, c);
        return rc;
    }
    c->n_pages = p->n_pages;
    c->length = p->length;
    memcpy(c->kept, p->kept, pg->p.n_regions * sizeof *c->kept);   /* the discard */
    c->stale_tail = p->stale_tail;
    view_fork(pg, c, p, p->n_pages);      /* same frames: the same ids */
    *child = seq_handle(pg, c);
    return 0;
}

/* Copies src's partial page `idx` (rem bytes) into fresh frames mapped at dst's window in
   every region and zeroes the rest. All or nothing; frames consumed on success. */
static int share_partial(struct paging *pg, struct pg_seq *dst, struct pg_seq *src,
                         uint32_t idx, size_t rem, pg_frame_id *frames)
{
    uint32_t ds = pg_slot_of(pg, dst), ss = pg_slot_of(pg, src), r;
    int rc = pg_order_before_copy(pg);
    if (rc)
        return rc;
    for (r = 0; r < pg->p.n_regions; r++) {
        uint64_t va = pg_va(pg, r, ds, idx);
        if (pg_frame_is_none(frames[r]))
            continue;                   /* src's page is a hole (discarded): dst's too */
        rc = win_map_frames(pg, va, &frames[r], 1);
        if (rc)
            goto out_unmap;
        pg_wrote(pg, va, pg->p.page_size);   /* (window.h: watched frames) */
        rc = vmm_copy_dtod(pg->v, va, pg_va(pg, r, ss, idx), rem, pg->ck.stream);
        if (!rc)
            rc = vmm_memset(pg->v, va + rem, 0, pg->p.page_size - rem, pg->ck.stream);
        if (rc) {
            r++;
            goto out_unmap;
        }
    }
    rc = pg->ck.stream ? 0 : pg_finish_copy(pg);
    if (rc)
        goto out_unmap;
    for (r = 0; r < pg->p.n_regions; r++) {
        pg_bt(pg, dst, r)[idx] =
            pg_frame_is_none(frames[r]) ? PG_PAGE_NONE : page_new(pg, frames[r]);
        pg->c.share_copies += !pg_frame_is_none(frames[r]);
    }
    return 0;
out_unmap:
    /* the copies (on the engine stream, or synchronous) may still run: wait for them
       before unmapping their target */
    (void)pg_wait_engine(pg);
    while (r-- > 0)
        if (!pg_frame_is_none(frames[r]))
            win_unmap_must(pg, pg_va(pg, r, ds, idx), 1);
    return rc;
}

/* Copies the first rem bytes of page id into a new host slot, zeroing the rest. */
static int share_host_copy(struct paging *pg, pg_page_id id, size_t rem, pg_slot *slot)
{
    struct pg_page *p = page_at(pg, id);
    int rc = lower_alloc(pg, PG_LOWER_HOST, PG_SLOT_NONE, slot);
    if (rc)
        return rc;
    char *dst = lower_ptr(pg, PG_LOWER_HOST, *slot);
    if (!page_has_frame(p) && p->tier != PG_TIER_HOST && p->tier != PG_TIER_TO_DISK) {
        rc = -EIO;                       /* on disk: the caller brings it back first */
        goto out_slot;
    } else if (p->tier == PG_TIER_HOST || p->tier == PG_TIER_TO_DISK) {
        memcpy(dst, lower_ptr(pg, PG_LOWER_HOST, p->slot[PG_LOWER_HOST]), rem);
    } else {
        /* on the device (mapped by a resident sharer, or an orphan): through the scratch */
        rc = pg_wait_engine(pg);
        if (!rc)
            rc = win_map_frames(pg, pg->scratch_va, &p->frame, 1);
        if (rc)
            goto out_slot;
        /* on the engine stream (after its work), waiting for that stream only; the legacy
           stream would also wait for (or not be ordered with) unrelated streams */
        rc = vmm_copy_dtoh(pg->v, dst, pg->scratch_va, rem, pg->ck.stream);
        int src = pg_finish_copy(pg);
        if (src && !rc)
            (void)pg_wait_engine(pg);   /* the copy may still be queued: never unmap under it */
        win_unmap_must(pg, pg->scratch_va, 1);
        if (rc || (rc = src))
            goto out_slot;
    }
    memset(dst + rem, 0, pg->p.page_size - rem);
    return 0;
out_slot:
    lower_free(pg, PG_LOWER_HOST, *slot);
    return rc;
}

/* Whether the host room of share_out can be had, checked whole before anything moves (a
   spill for the read back, then no room left for the copies, was a failed call that moved
   other sequences' pages): the nk partial pages ids of src, those on disk (nd) read back
   into host slots first (room made by spilling others' host pages; the reads free their
   disk slots), then a host copy of each (room made the same way). -ENOMEM, -EBADMSG. */
static int share_out_check(struct paging *pg, struct pg_seq *src, const pg_page_id *ids,
                           uint32_t nk)
{
    uint32_t nd = 0;
    if (!lower_on(pg, PG_LOWER_DISK))
        return 0;                       /* nothing spills: host_room moves nothing */
    paging_disk_settle(pg, ids, nk);
    int rc = paging_disk_damaged(pg, ids, nk, &nd);
    if (rc || paging_host_free(pg) >= (uint64_t)nd + nk)
        return rc;
    struct pg_room r;
    tier_room(pg, src, nd, &r);
    struct pg_tier_room *h = &r.t[PG_LOWER_HOST], *d = &r.t[PG_LOWER_DISK];
    uint64_t hw = h->free + h->freeing, x = nd > hw ? nd - hw : 0;   /* spilled to read */
    if (x > h->movable || x > d->free)
        return pg_why_host(pg, (uint64_t)nd + nk);
    hw += x - nd;
    h->movable -= x;
    d->free += nd - x;
    uint64_t spill = h->movable < d->free ? h->movable : d->free;
    return nk > hw + spill ? pg_why_host(pg, (uint64_t)nd + nk) : 0;
}

/* share from a non-resident source: dst becomes non-resident too, holding src's whole pages
   and a host copy of the partial last one. */
static int share_out(struct paging *pg, struct pg_seq *dst, struct pg_seq *src,
                     uint64_t n_tokens)
{
    uint64_t bytes = n_tokens * pg->p.bytes_per_token;
    uint32_t whole = (uint32_t)(bytes / pg->p.page_size), nr = pg->p.n_regions, r;
    size_t rem = bytes % pg->p.page_size;
    pg_slot slots[nr];
    int rc = defer_flush_slot(pg, pg_slot_of(pg, dst));
    if (!rc)
        rc = defer_flush_slot(pg, pg_slot_of(pg, src));
    if (!rc && rem && !lower_on(pg, PG_LOWER_HOST))
        rc = -ENOMEM;
    if (!rc && rem && pg->xf.lower[PG_LOWER_HOST].n_io)
        rc = defer_reap(pg, true);          /* the partial page's bytes settle first */
    uint32_t nk = 0;                    /* partial pages to copy: holes are not */
    if (!rc && rem) {
        /* a partial page on disk comes back to the host tier first */
        pg_page_id ids[nr];
        nk = partial_pages(pg, src, whole, ids);
        rc = share_out_check(pg, src, ids, nk);
        if (!rc)
            rc = paging_disk_unspill(pg, ids, nk, src);
    }
    if (!rc && nk && lower_on(pg, PG_LOWER_DISK) && paging_host_free(pg) < nk)
        rc = paging_host_room(pg, nk, seq_handle(pg, src));   /* src's pages stay */
    if (rc)
        return rc;
    for (r = 0; rem && r < nr; r++) {
        slots[r] = PG_SLOT_NONE;        /* none: a hole (discarded) */
        if (!pg_page_is_none(pg_bt(pg, src, r)[whole]) &&
            (rc = share_host_copy(pg, pg_bt(pg, src, r)[whole], rem, &slots[r])))
            goto out_slots;
    }
    ahead_drop(pg, dst, 0);
    bt_share(pg, dst, src, whole, true);
    for (r = 0; rem && r < nr; r++) {
        pg_page_id *db = pg_bt(pg, dst, r);
        if (pg_slot_is_none(slots[r])) {
            db[whole] = PG_PAGE_NONE;
        } else {
            db[whole] = page_new_host(pg, slots[r]);
        }
    }
    seq_set_out(pg, dst, true);
    dst->n_pages = whole + (rem ? 1 : 0);
    dst->length = n_tokens;
    return 0;
out_slots:
    while (r-- > 0)
        if (!pg_slot_is_none(slots[r]))
            lower_free(pg, PG_LOWER_HOST, slots[r]);
    return rc;
}

static int share_resident(struct paging *pg, struct pg_seq *dst, struct pg_seq *src,
                          uint64_t n_tokens);

/* Both sequences of a share. -ENOENT. */
static int share_lookup(struct paging *pg, uint64_t dh, uint64_t sh, struct pg_seq **dst,
                        struct pg_seq **src)
{
    int rc = seq_lookup(pg, dh, dst);
    return rc ? rc : seq_lookup(pg, sh, src);
}

int paging_seq_share(struct paging *pg, uint64_t dh, uint64_t sh, uint64_t n_tokens)
{
    struct pg_seq *dst, *src;
    int rc = share_lookup(pg, dh, sh, &dst, &src);
    if (rc)
        return rc;
    if (dst->dropped || src->dropped)
        return -ESTALE;
    if (dst->length || n_tokens > src->length)
        return -EINVAL;
    if (!n_tokens)
        return 0;
    rc = seq_bt_reserve(pg, dst, pg_pages_for(pg, n_tokens));
    if (rc)
        return rc;
    bool was_out = dst->out;
    if (was_out) {
        /* an empty non-resident sequence: nothing to bring back; resident again unless
           the call fails */
        rc = defer_flush_slot(pg, pg_slot_of(pg, dst));
        if (rc)
            return rc;
        seq_set_out(pg, dst, false);
    }
    rc = src->out ? share_out(pg, dst, src, n_tokens) : share_resident(pg, dst, src, n_tokens);
    if (rc && was_out)
        seq_set_out(pg, dst, true);
    for (uint32_t r = 0; !rc && r < pg->p.n_regions; r++)   /* src's discard, kept */
        dst->kept[r] = src->kept[r] < n_tokens ? src->kept[r] : n_tokens;
    return rc;
}

int paging_need_share(struct paging *pg, uint64_t dh, uint64_t sh, uint64_t n_tokens,
                      uint32_t *frames)
{
    struct pg_seq *dst, *src;
    int rc = share_lookup(pg, dh, sh, &dst, &src);
    if (rc)
        return rc;
    uint64_t bytes = n_tokens * pg->p.bytes_per_token;
    uint32_t whole = (uint32_t)(bytes / pg->p.page_size), nk = 0;
    /* a resident src's partial page is copied into frames (a hole is not); a non-resident
       one's through the host tier */
    if (!src->out && bytes % pg->p.page_size && n_tokens <= src->length)
        nk = partial_pages(pg, src, whole, NULL);
    *frames = nk;
    return 0;
}

static int share_resident(struct paging *pg, struct pg_seq *dst, struct pg_seq *src,
                          uint64_t n_tokens)
{
    int rc = defer_settle(pg, src);
    if (rc)
        return rc;
    uint64_t bytes = n_tokens * pg->p.bytes_per_token;
    uint32_t whole = (uint32_t)(bytes / pg->p.page_size), nr = pg->p.n_regions;
    size_t rem = bytes % pg->p.page_size;
    pg_frame_id frames[nr], got[nr];
    uint32_t nk = 0;
    memset(frames, 0, sizeof frames);   /* (none: no partial page to copy in that region) */
    memset(got, 0, sizeof got);
    if (rem)
        nk = partial_pages(pg, src, whole, NULL);
    rc = defer_flush_slot(pg, pg_slot_of(pg, dst));
    if (!rc && nk)
        rc = pool_reserve_check(pg, nk);
    if (rc)
        return rc;
    ahead_drop(pg, dst, 0);
    uint32_t mark = pg->fr.n_created;
    if (nk && (rc = pool_take(pg, nk, got)))
        goto out_rollback;
    for (uint32_t r = 0, k = 0; rem && r < nr; r++)
        frames[r] = pg_page_is_none(pg_bt(pg, src, r)[whole]) ? PG_FRAME_NONE : got[k++];
    rc = map_shared(pg, dst, src, whole);
    if (rc)
        goto out_frames;
    if (rem) {
        rc = share_partial(pg, dst, src, whole, rem, frames);
        if (rc)
            goto out_shared;
        seq_use(pg, src);
        seq_use(pg, dst);
    }
    if (!dst->out)
        view_fork(pg, dst, src, whole);     /* the whole blocks: the same frames, ids */
    dst->n_pages = whole + (rem ? 1 : 0);
    dst->length = n_tokens;
    return 0;
out_shared:
    for (uint32_t r = 0; r < nr; r++)
        win_unmap_holes_must(pg, pg_va(pg, r, pg_slot_of(pg, dst), 0), pg_bt(pg, dst, r),
                             whole);
    for (struct pg_bt_iter it = bt_range(pg, dst, 0, nr, 0, whole); bt_next(&it);) {
        page_put(pg, it.id);
        *it.e = PG_PAGE_NONE;
    }
out_frames:
    if (nk)
        pool_give(pg, got, nk);
out_rollback:
    pool_rollback(pg, mark);
    return rc;
}

