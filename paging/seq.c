/*
 * paging/seq.c: sequences: slots and handles, block tables, map-ahead; grow (single and
 * batch), free, info (window mappings: window.c; truncate, fork and share: seq_share.c).
 *
 * Window layout: region r, slot s, page index i is at
 *   base + (r * max_seqs + s) * slot_bytes + i * page_size.
 * Every page of a sequence in the device tier is mapped at its window address; map-ahead
 * frames (not the sequence's pages, free for accounting) at [n_pages, n_pages + n_ahead).
 *
 * Every operation follows the same shape: validate; count the frames needed and check the
 * pool can supply them (waiting for pending releases if that would help); take the frames;
 * map (one vmm_map_run per contiguous run, i.e. one set-access per run); commit the block
 * tables last. Each step that fails undoes the steps before it.
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
#include <stdlib.h>
#include <string.h>
#include "common/log.h"

/* ---- slots and handles -------------------------------------------------------------- */

/* Block-table entries per region a slot starts with: one page's, so a sequence's tables
   follow its length from the first page on (doubling: a 64k-token sequence of 4 KiB pages
   reallocates them 8 times in its life, a copy of its ids each time, against a map per
   page); a slot taken again starts over. */
#define BT_FIRST 1u

int seq_bt_reserve(struct paging *pg, struct pg_seq *s, uint64_t n_pages)
{
    uint64_t most = pg->pages_per_slot ? pg->pages_per_slot : 1;
    if (n_pages <= s->bt_cap && s->bt)
        return 0;
    if (n_pages > most)
        return -E2BIG;                  /* (callers bound the length first) */
    uint64_t cap = s->bt_cap ? s->bt_cap : BT_FIRST;
    while (cap < n_pages)
        cap *= 2;
    if (cap > most)
        cap = most;
    uint32_t R = pg->p.n_regions, old = s->bt_cap;
    pg_page_id *bt = calloc((size_t)R * cap, sizeof *bt);
    uint32_t *bid = pg->view.n_ids ? calloc(cap, sizeof *bid) : NULL;
    if (!bt || (pg->view.n_ids && !bid)) {
        free(bt);
        free(bid);
        return -ENOMEM;
    }
    /* commit: nothing below fails */
    for (uint32_t r = 0; s->bt && r < R; r++)
        memcpy(bt + (size_t)r * cap, s->bt + (size_t)r * old, old * sizeof *bt);
    if (bid && s->bid)
        memcpy(bid, s->bid, old * sizeof *bid);
    free(s->bt);
    free(s->bid);
    s->bt = bt;
    s->bid = bid;
    s->bt_cap = (uint32_t)cap;
    return 0;
}

/* Takes a free slot (waiting for dying slots' releases if none is free). -ENOSPC, -ENOMEM. */
int seq_slot_take(struct paging *pg, struct pg_seq **out)
{
    if (!pg->sq.slot_free_head && pg->sq.n_dying) {
        int rc = defer_reap(pg, true);
        if (rc)
            return rc;
    }
    if (!pg->sq.slot_free_head)
        return -ENOSPC;
    struct pg_seq *s = &pg->seqs[pg->sq.slot_free_head - 1];
    if (s->bt_cap > BT_FIRST) {         /* a longer sequence's tables: not the next one's */
        free(s->bt);
        free(s->bid);
        s->bt = NULL;
        s->bid = NULL;
        s->bt_cap = 0;
    }
    int rc = seq_bt_reserve(pg, s, 0);           /* BT_FIRST entries, or the slot's */
    if (rc)
        return rc;
    if (!s->kept && !(s->kept = calloc(pg->p.n_regions, sizeof *s->kept)))
        return -ENOMEM;
    if (pg->p.map_ahead && !s->ahead) {
        s->ahead = calloc((size_t)pg->p.n_regions * pg->p.map_ahead, sizeof *s->ahead);
        if (!s->ahead)
            return -ENOMEM;
        s->ahead_cap = pg->p.map_ahead;
    }
    pg->sq.slot_free_head = s->next_free;
    s->next_free = 0;
    seq_set_life(pg, s, SEQ_LIVE);
    s->length = 0;
    s->n_pages = 0;
    s->n_ahead = 0;
    seq_room_void(s);
    s->used_valid = 0;
    memset(s->kept, 0, pg->p.n_regions * sizeof *s->kept);
    s->cls = PG_SEQ_LIVE;
    s->dropped = 0;
    s->stale_tail = 0;
    *out = s;
    return 0;
}

/* Returns a slot taken by slot_take that was never used (undo). */
void seq_slot_untake(struct paging *pg, struct pg_seq *s)
{
    seq_slot_release(pg, s);
}

int paging_seq_create(struct paging *pg, uint64_t *h)
{
    struct pg_seq *s;
    int rc = seq_slot_take(pg, &s);
    if (rc)
        return rc;
    *h = seq_handle(pg, s);
    return 0;
}

int paging_seq_slot(struct paging *pg, uint64_t h, uint32_t *slot)
{
    struct pg_seq *s;
    int rc = seq_lookup(pg, h, &s);
    if (rc)
        return rc;
    *slot = pg_slot_of(pg, s);
    return 0;
}

int paging_seq_free(struct paging *pg, uint64_t h)
{
    struct pg_seq *s;
    int rc = seq_lookup(pg, h, &s);
    if (!rc)
        rc = defer_settle(pg, s);
    if (rc)
        return rc;
    if (s->out) {
        tier_drop_out(pg, s, 0, s->n_pages);
        seq_set_out(pg, s, false);
    } else {
        ahead_drop(pg, s, 0);
        rc = defer_release(pg, s, 0, s->n_pages);
        if (rc)
            return rc;
    }
    memset(s->bt, 0, (size_t)pg->p.n_regions * s->bt_cap * sizeof *s->bt);
    s->n_pages = 0;
    s->length = 0;
    /* a dying slot is checked like a live one: no first_kept past its length 0 */
    memset(s->kept, 0, pg->p.n_regions * sizeof *s->kept);
    if (++s->gen == 0)
        s->gen = 1;
    if (s->n_defer) {
        seq_set_life(pg, s, SEQ_DYING);
    } else {
        seq_slot_release(pg, s);
    }
    return 0;
}

/* ---- grow --------------------------------------------------------------------------- */

struct grow_undo {
    struct pg_seq *s;
    uint64_t old_len;
    uint32_t old_np, new_np;
    struct cow_undo cow;
    uint32_t *fill, n_fill;    /* regions whose last-page hole tail_fill made again */
    bool outran;               /* it needed pages past s's map-ahead (ahead_refill) */
};

/* Ends a successful grow_apply: frees its undo records. */
static void grow_commit(struct paging *pg, struct grow_undo *u)
{
    cow_commit(pg, &u->cow);
    free(u->fill);
    u->fill = NULL;
    u->n_fill = 0;
}

/* A grow past a partial last page that is a hole (a truncate below first_kept left it; see
   discard.c): the tokens from the old length on are new, so the page is made again in every
   region where it is a hole (a fresh frame, scrubbed like any new page). Regions filled are
   recorded in u; grow_undo reverts them. -ENOMEM, -EIO. */
static int tail_fill(struct paging *pg, struct pg_seq *s, uint32_t idx, struct grow_undo *u)
{
    uint32_t nr = pg->p.n_regions, slot = pg_slot_of(pg, s);
    for (uint32_t r = 0; r < nr; r++) {
        if (!pg_page_is_none(pg_bt(pg, s, r)[idx]))
            continue;
        if (!u->fill && !(u->fill = calloc(nr, sizeof *u->fill)))
            return -ENOMEM;
        pg_frame_id f;
        int rc = pool_take_except(pg, 1, &f, s);
        if (rc)
            return rc;
        uint64_t va = pg_va(pg, r, slot, idx);
        rc = win_map_frames(pg, va, &f, 1);
        if (!rc && pg->p.scrub) {
            pg_wrote(pg, va, pg->p.page_size);   /* (window.h: watched frames) */
            rc = vmm_memset(pg->v, va, 0, pg->p.page_size, pg->ck.stream);
            if (!rc && !pg->ck.stream)
                rc = vmm_stream_sync(pg->v, NULL);
            if (rc) {
                (void)pg_wait_engine(pg);   /* the memset may still run: never unmap under it */
                win_unmap_must(pg, va, 1);
            }
        }
        if (rc) {
            pool_give(pg, &f, 1);
            return rc;
        }
        pg_bt(pg, s, r)[idx] = page_new(pg, f);
        u->fill[u->n_fill++] = r;
    }
    return 0;
}

/* KVVM_F_SCRUB: a grow over the partial last page idx (its own now: after tail_fill and
   copy-on-write) zeroes the page's bytes past the old length in every region, on the engine
   stream or synchronously. They are not the sequence's: a truncate left the old tokens
   there, and new tokens read as zero. -EIO. */
static int tail_scrub(struct paging *pg, struct pg_seq *s, uint32_t idx, uint64_t old_len)
{
    uint64_t ps = pg->p.page_size, off = (old_len * pg->p.bytes_per_token) % ps;
    uint32_t slot = pg_slot_of(pg, s);
    for (uint32_t r = 0; r < pg->p.n_regions; r++) {
        pg_wrote(pg, pg_va(pg, r, slot, idx) + off, ps - off);   /* (watched frames) */
        int rc = vmm_memset(pg->v, pg_va(pg, r, slot, idx) + off, 0, (size_t)(ps - off),
                            pg->ck.stream);
        if (rc)
            return rc;
    }
    return pg->ck.stream ? 0 : vmm_stream_sync(pg->v, NULL);
}

/* Frames a grow of s to len takes (new pages + copies of a shared last page). */
static uint32_t grow_frames(struct paging *pg, struct pg_seq *s, uint64_t len, uint32_t *cow_idx)
{
    uint32_t new_np = (uint32_t)pg_pages_for(pg, len);
    uint32_t n = (new_np - s->n_pages) * pg->p.n_regions;
    *cow_idx = UINT32_MAX;
    if (len > s->length && (s->length * pg->p.bytes_per_token) % pg->p.page_size) {
        *cow_idx = s->n_pages - 1;
        n += cow_needed(pg, s, 0, pg->p.n_regions, *cow_idx, *cow_idx + 1);
    }
    return n;
}

/* Checks the pool can supply n frames, waiting for pending releases if that helps. */
int pool_reserve_check(struct paging *pg, uint32_t n)
{
    if (pool_available(pg) >= n)
        return 0;
    if (pg->df.defer) {
        int rc = defer_reap(pg, true);
        if (rc)
            return rc;
    }
    return pool_available(pg) >= n ? 0 : pg_why_frames(pg, n);
}

/* Reverts a grow_apply of u->s. */
static void grow_undo(struct paging *pg, struct grow_undo *u)
{
    struct pg_seq *s = u->s;
    uint32_t slot = pg_slot_of(pg, s), n = u->new_np - u->old_np;
    cow_undo(pg, s, &u->cow);
    cow_commit(pg, &u->cow);
    if (u->n_fill && pg->p.scrub && pg->ck.stream)
        (void)pg_wait_engine(pg);   /* tail_fill's scrub memsets may still run */
    for (uint32_t j = 0; j < u->n_fill; j++) {
        pg_page_id *e = &pg_bt(pg, s, u->fill[j])[u->old_np - 1];
        win_unmap_must(pg, pg_va(pg, u->fill[j], slot, u->old_np - 1), 1);
        page_put(pg, *e);
        *e = PG_PAGE_NONE;
    }
    free(u->fill);
    u->fill = NULL;
    u->n_fill = 0;
    ahead_drop(pg, s, 0);
    view_release(pg, s, UINT32_MAX, u->old_np, u->new_np);    /* a prepared group's ids */
    if (pg->p.scrub && pg->ck.stream && n)
        (void)pg_wait_engine(pg);   /* the scrub memsets may still run: wait, then unmap */
    s->n_pages = u->old_np;
    s->length = u->old_len;
    for (uint32_t r = 0; r < pg->p.n_regions; r++) {
        pg_page_id *bt = pg_bt(pg, s, r) + u->old_np;
        win_unmap_must(pg, pg_va(pg, r, slot, u->old_np), n);
        for (uint32_t i = 0; i < n; i++) {
            page_put(pg, bt[i]);
            bt[i] = PG_PAGE_NONE;
        }
    }
}

/* Maps region r's new pages [old_np, new_np): map-ahead frames first (already mapped),
   then `fresh` new frames in one run. Writes page ids into the block table. */
static int grow_region(struct paging *pg, struct pg_seq *s, uint32_t r, uint32_t k,
                       const pg_frame_id *fresh, uint32_t n_fresh)
{
    uint32_t slot = pg_slot_of(pg, s), at = s->n_pages + k;
    uint64_t va = pg_va(pg, r, slot, at);
    int rc = win_map_frames(pg, va, fresh, n_fresh);
    if (rc)
        return rc;
    if (pg->p.scrub && k + n_fresh) {
        /* every new page (map-ahead ones included: they are scrubbed only now) is zeroed
           before the new owner can see it: on the engine stream, or synchronously. An undo
           waits for the engine before unmapping them. */
        pg_wrote(pg, pg_va(pg, r, slot, s->n_pages),   /* (watched frames) */
                 (uint64_t)(k + n_fresh) * pg->p.page_size);
        rc = vmm_memset(pg->v, pg_va(pg, r, slot, s->n_pages), 0,
                        (size_t)(k + n_fresh) * pg->p.page_size, pg->ck.stream);
        if (!rc && !pg->ck.stream)
            rc = vmm_stream_sync(pg->v, NULL);
        if (rc) {
            /* a memset enqueued may still run, on the engine stream or the (asynchronous)
               legacy stream whose synchronize just failed */
            (void)pg_wait_engine(pg);
            win_unmap_must(pg, va, n_fresh);
            return rc;
        }
    }
    pg_page_id *bt = pg_bt(pg, s, r);
    pg_frame_id *a = pg_ahead(pg, s, r);
    for (uint32_t i = 0; i < k; i++)
        bt[s->n_pages + i] = page_new(pg, a[i]);
    if (k && s->n_ahead > k)
        memmove(a, a + k, (s->n_ahead - k) * sizeof *a);
    for (uint32_t i = 0; i < n_fresh; i++)
        bt[at + i] = page_new(pg, fresh[i]);
    return 0;
}

/* Takes the frames of n_fresh new blocks (region r's of block i at fresh[r * n_fresh + i]):
   the pool view's prepared groups first (their ids in *gids, *ng of them: already mapped in
   the view), then the pool. All or nothing (the caller lets *gids die on failure). */
static int grow_take(struct paging *pg, struct pg_seq *s, uint32_t n_fresh, pg_frame_id *fresh,
                     uint32_t **gids, uint32_t *ng)
{
    uint32_t nr = pg->p.n_regions;
    *ng = 0;
    if (pg->view.n_groups) {
        if (!(*gids = malloc(n_fresh * sizeof **gids)))
            return -ENOMEM;
        *ng = view_take_groups(pg, n_fresh, fresh, n_fresh, *gids);
    }
    uint32_t rest = n_fresh - *ng;
    if (!rest)
        return 0;
    pg_frame_id *tmp = *ng ? malloc((size_t)rest * nr * sizeof *tmp) : fresh;
    int rc = tmp ? pool_take_except(pg, rest * nr, tmp, s) : -ENOMEM;
    if (rc) {
        for (uint32_t r = 0; r < nr; r++)        /* the groups' frames back */
            pool_give(pg, fresh + (size_t)r * n_fresh, *ng);
        if (tmp != fresh)
            free(tmp);
        return rc;
    }
    if (tmp != fresh) {
        for (uint32_t r = 0; r < nr; r++)
            memcpy(fresh + (size_t)r * n_fresh + *ng, tmp + (size_t)r * rest,
                   rest * sizeof *tmp);
        free(tmp);
    }
    return 0;
}

/* Grows s to len (validated by the caller); u receives the undo record. */
static int grow_apply(struct paging *pg, struct pg_seq *s, uint64_t len, struct grow_undo *u)
{
    uint32_t nr = pg->p.n_regions, cow_idx;
    /* a pending discard below the last page never blocks a grow (tail_fill maps there) */
    int rc = defer_flush_slot_from(pg, pg_slot_of(pg, s), s->n_pages ? s->n_pages - 1 : 0);
    if (rc)
        return rc;
    memset(u, 0, sizeof *u);
    u->s = s;
    u->old_len = s->length;
    u->old_np = s->n_pages;
    u->new_np = (uint32_t)pg_pages_for(pg, len);
    uint32_t need = u->new_np - s->n_pages;
    uint32_t k = need < s->n_ahead ? need : s->n_ahead;
    uint32_t n_fresh = need - k;
    u->outran = n_fresh > 0;
    /* the frames taken below (fresh ones, the last page's holes and copies) come from the
       pool but for s's own map-ahead, which counts as free: its surplus goes back first
       when the rest cannot supply them */
    ahead_yield(pg, s, k, grow_frames(pg, s, len, &cow_idx) - k * nr);
    pg_frame_id *fresh = NULL;
    uint32_t *gids = NULL, ng = 0;
    if (n_fresh) {
        fresh = malloc((size_t)n_fresh * nr * sizeof *fresh);
        if (!fresh)
            return -ENOMEM;
        rc = grow_take(pg, s, n_fresh, fresh, &gids, &ng);
        if (rc)
            goto out_free;
    }
    uint32_t r;
    for (r = 0; r < nr; r++) {
        rc = grow_region(pg, s, r, k, fresh ? fresh + (size_t)r * n_fresh : NULL, n_fresh);
        if (rc)
            goto out_regions;
    }
    s->n_ahead -= k;
    s->n_pages = u->new_np;
    s->length = len;
    if (cow_idx != UINT32_MAX) {
        rc = tail_fill(pg, s, cow_idx, u);
        if (!rc)
            rc = cow_range(pg, s, 0, nr, cow_idx, cow_idx + 1, &u->cow);
        if (!rc && pg->p.scrub && (rc = tail_scrub(pg, s, cow_idx, u->old_len)) != 0)
            (void)pg_wait_engine(pg);   /* a memset may still run: never undo under it */
        if (!rc)
            s->stale_tail = 0;
        if (rc) {
            grow_undo(pg, u);
            goto out_free;
        }
    }
    seq_use(pg, s);
    view_end_groups(pg, s, u->old_np + k, gids, ng, true);
    free(gids);
    free(fresh);
    return 0;

out_regions:
    /* Region r failed whole. Regions [0, r) hold new pages at [old_np, new_np) (k of them
       map-ahead frames) and their remaining map-ahead was shifted to [new_np, ..); regions
       [r, nr) still have all their map-ahead at [old_np, ..). Undo to no map-ahead at all. */
    if (pg->p.scrub && pg->ck.stream && r)
        (void)pg_wait_engine(pg);   /* regions [0, r)'s scrub memsets may still run */
    for (uint32_t q = 0; q < nr; q++) {
        uint32_t slot = pg_slot_of(pg, s);
        pg_frame_id *a = pg_ahead(pg, s, q);
        uint32_t left = q < r ? s->n_ahead - k : s->n_ahead;
        uint32_t at = q < r ? u->new_np : u->old_np;
        if (q < r) {
            pg_page_id *bt = pg_bt(pg, s, q) + u->old_np;
            win_unmap_must(pg, pg_va(pg, q, slot, u->old_np), need);
            for (uint32_t i = 0; i < need; i++) {
                page_put(pg, bt[i]);
                bt[i] = PG_PAGE_NONE;
            }
        }
        win_unmap_must(pg, pg_va(pg, q, slot, at), left);
        pool_give(pg, a, left);
    }
    s->n_ahead = 0;
    if (fresh)
        pool_give(pg, fresh + (size_t)r * n_fresh, (nr - r) * n_fresh);
out_free:
    view_end_groups(pg, s, 0, gids, ng, false);
    free(gids);
    free(fresh);
    return rc;
}

static int grow_check(struct paging *pg, struct pg_seq *s, uint64_t len)
{
    if (s->dropped)
        return -ESTALE;
    if (len < s->length)
        return -EINVAL;
    if (len > pg->p.max_tokens)
        return pg_why_length(pg, len);
    return 0;
}

int paging_seq_grow(struct paging *pg, uint64_t h, uint64_t length)
{
    struct pg_seq *s;
    uint32_t cow_idx;
    int rc = seq_lookup(pg, h, &s);
    if (!rc)
        rc = grow_check(pg, s, length);
    if (!rc && s->out)
        rc = -EBUSY;            /* the context swaps it in first */
    if (!rc)
        rc = defer_settle(pg, s);
    if (!rc && pg_pages_for(pg, length) > s->n_pages + s->n_ahead)
        ahead_settle_slot(pg, s);   /* past its map-ahead: the thread's refill first */
    if (!rc)
        rc = pool_reserve_check(pg, grow_frames(pg, s, length, &cow_idx));
    if (!rc)
        rc = seq_bt_reserve(pg, s, pg_pages_for(pg, length));
    if (rc)
        return rc;
    struct grow_undo u;
    uint32_t mark = pg->fr.n_created;
    rc = grow_apply(pg, s, length, &u);
    if (rc) {
        pool_rollback(pg, mark);
        return rc;
    }
    grow_commit(pg, &u);
    ahead_refill(pg, s, u.outran);
    return 0;
}

int paging_meta_bytes(struct paging *pg, uint64_t h, uint64_t *bytes, uint64_t *page_bytes)
{
    *page_bytes = sizeof(struct pg_page) + sizeof(struct pg_frame);
    struct pg_seq *s;
    int rc = seq_lookup(pg, h, &s);
    if (rc)
        return rc;
    uint64_t n = sizeof *s, R = pg->p.n_regions;
    if (s->bt)
        n += R * s->bt_cap * sizeof *s->bt;
    if (s->kept)
        n += R * sizeof *s->kept;
    if (s->bid)
        n += s->bt_cap * sizeof *s->bid;
    if (s->ahead)
        n += R * s->ahead_cap * sizeof *s->ahead;
    *bytes = n;
    return 0;
}

/* Whether growing s to length needs nothing (paging_seq_grow_in_place). No division on
   this path: the pages held end at `held` bytes, the old tokens at `used`; a partial last
   page (used < held) must be s's own in every region. */
static bool grows_in_place(struct paging *pg, struct pg_seq *s, uint64_t length)
{
    if (grow_check(pg, s, length) || s->out || s->in_job ||
        (s->stale_tail && pg->p.scrub && length > s->length))
        return false;                           /* (tail_scrub first) */
    uint64_t held = (uint64_t)s->n_pages * pg->p.page_size;
    uint64_t used = s->length * pg->p.bytes_per_token;
    if (length * pg->p.bytes_per_token > held)
        return false;                           /* a new page (grow_check bounds length) */
    return length == s->length || used == held ||
           !cow_needed(pg, s, 0, pg->p.n_regions, s->n_pages - 1, s->n_pages);
}

/* Records s's room fact after grows_in_place said yes for some length: the pages hold
   room tokens, and nothing grows_in_place checks changes until a void (pg_seq.room). A
   partial last page shared, or a hole there, gives no fact. */
static void seq_room_set(struct paging *pg, struct pg_seq *s)
{
    if (!s->n_pages || (s->stale_tail && pg->p.scrub) ||     /* (tail_scrub first) */
        cow_needed(pg, s, 0, pg->p.n_regions, s->n_pages - 1, s->n_pages))
        return;
    uint64_t held = (uint64_t)s->n_pages * pg->p.page_size / pg->p.bytes_per_token;
    s->room = held < pg->p.max_tokens ? held : pg->p.max_tokens;
    s->room_np = s->n_pages;
    s->room_gen = pg->room_gen;
}

/* s by its handle, or NULL; no reason recorded (the hot path's lookup). */
static inline struct pg_seq *seq_peek(struct paging *pg, uint64_t h)
{
    struct pg_seq_hot *s = paging_hot_peek(&pg->hot, h);
    return s ? (struct pg_seq *)(void *)s : NULL;       /* hot: the first member */
}

int paging_seq_grow_in_place(struct paging *pg, uint64_t h, uint64_t length)
{
    struct pg_seq *s;
    if (seq_lookup(pg, h, &s) || !grows_in_place(pg, s, length))
        return -EAGAIN;
    s->length = length;
    seq_use(pg, s);
    seq_room_set(pg, s);
    return 0;
}

int paging_seq_grow_batch_in_place(struct paging *pg, const uint64_t *hs,
                                   const uint64_t *lengths, size_t n)
{
    struct pg_seq *s;
    if (++pg->sq.batch_mark == 0) {                /* wrapped: no stale mark may match */
        for (uint32_t i = 0; i < pg->p.max_seqs; i++)
            pg->seqs[i].batch_mark = 0;
        pg->sq.batch_mark = 1;
    }
    for (size_t i = 0; i < n; i++) {
        s = seq_peek(pg, hs[i]);
        if (!s || s->batch_mark == pg->sq.batch_mark)                        /* twice */
            return -EAGAIN;
        if (!paging_hot_room_covers(&pg->hot, &s->hot, lengths[i])) {
            if (!grows_in_place(pg, s, lengths[i]))
                return -EAGAIN;
            seq_room_set(pg, s);
        }
        s->batch_mark = pg->sq.batch_mark;
    }
    for (size_t i = 0; i < n; i++) {
        s = seq_peek(pg, hs[i]);
        s->length = lengths[i];
        seq_use(pg, s);
    }
    return 0;
}

/* Appends the shared last pages (index idx) of s's regions to *cand. */
static int cow_candidates(struct paging *pg, struct pg_seq *s, uint32_t idx,
                          pg_page_id **cand, uint32_t *n)
{
    pg_page_id *c = realloc(*cand, (*n + pg->p.n_regions) * sizeof *c);
    if (!c)
        return -ENOMEM;
    *cand = c;
    for (struct pg_bt_iter it = bt_range(pg, s, 0, pg->p.n_regions, idx, idx + 1);
         bt_next(&it);)
        if (page_sharers(page_at(pg, it.id)) > 1)
            c[(*n)++] = it.id;
    return 0;
}

static int cmp_page(const void *a, const void *b)
{
    uint32_t x = ((const pg_page_id *)a)->v, y = ((const pg_page_id *)b)->v;
    return x < y ? -1 : x > y;
}

/* Copies a batch makes: k of a page's R holders writing it copy min(k, R - 1) times (the
   last holder left finds the page its own). */
static uint64_t batch_cow_frames(struct paging *pg, pg_page_id *cand, uint32_t n)
{
    uint64_t need = 0;
    if (n)
        qsort(cand, n, sizeof *cand, cmp_page);
    for (uint32_t i = 0, j; i < n; i = j) {
        for (j = i; j < n && pg_page_eq(cand[j], cand[i]); j++)
            ;
        uint32_t k = j - i, r1 = page_sharers(page_at(pg, cand[i])) - 1;
        need += k < r1 ? k : r1;
    }
    return need;
}

int seq_batch_frames(struct paging *pg, struct pg_seq *const *ss, const uint64_t *lengths,
                     size_t n, uint64_t *frames)
{
    pg_page_id *cand = NULL;
    uint32_t n_cand = 0;
    uint64_t need = 0;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        uint32_t cow_idx, before = n_cand;
        if (lengths[i] < ss[i]->length)
            continue;                   /* (a shrink is the grow's -EINVAL) */
        uint32_t all = grow_frames(pg, ss[i], lengths[i], &cow_idx);
        /* the shared last pages are counted for the whole batch (holes stay in all) */
        if (cow_idx != UINT32_MAX)
            rc = cow_candidates(pg, ss[i], cow_idx, &cand, &n_cand);
        need += all - (n_cand - before);
    }
    if (!rc)
        *frames = need + batch_cow_frames(pg, cand, n_cand);
    free(cand);
    return rc;
}

int paging_seq_grow_batch(struct paging *pg, const uint64_t *hs, const uint64_t *lengths,
                          size_t n)
{
    if (!n)
        return 0;
    struct pg_seq **ss = calloc(n, sizeof *ss);
    struct grow_undo *u = calloc(n, sizeof *u);
    uint8_t *seen = calloc(pg->p.max_seqs, 1);
    int rc = -ENOMEM;
    size_t done = 0;
    uint64_t need = 0;
    if (!ss || !u || !seen)
        goto out_free;
    for (size_t i = 0; i < n; i++) {
        rc = seq_lookup(pg, hs[i], &ss[i]);
        if (!rc && seen[pg_slot_of(pg, ss[i])]++)
            rc = -EINVAL;
        if (!rc)
            rc = grow_check(pg, ss[i], lengths[i]);
        if (!rc && ss[i]->out)
            rc = -EBUSY;
        if (!rc)
            rc = defer_settle(pg, ss[i]);
        if (rc)
            goto out_free;
        if (pg_pages_for(pg, lengths[i]) > ss[i]->n_pages + ss[i]->n_ahead)
            ahead_settle_slot(pg, ss[i]);
    }
    rc = seq_batch_frames(pg, ss, lengths, n, &need);
    if (!rc)
        rc = need > UINT32_MAX ? -ENOMEM : pool_reserve_check(pg, (uint32_t)need);
    for (size_t i = 0; !rc && i < n; i++)
        rc = seq_bt_reserve(pg, ss[i], pg_pages_for(pg, lengths[i]));
    if (rc)
        goto out_free;
    uint32_t mark = pg->fr.n_created;
    for (done = 0; done < n; done++) {
        rc = grow_apply(pg, ss[done], lengths[done], &u[done]);
        if (rc)
            goto out_undo;
    }
    for (size_t i = 0; i < n; i++) {
        grow_commit(pg, &u[i]);
        ahead_refill(pg, ss[i], u[i].outran);
    }
    rc = 0;
    goto out_free;
out_undo:
    while (done-- > 0)
        grow_undo(pg, &u[done]);
    pool_rollback(pg, mark);
out_free:
    free(ss);
    free(u);
    free(seen);
    return rc;
}

/* ---- info --------------------------------------------------------------------------- */

static void seq_brief(const struct paging *pg, const struct pg_seq *s,
                      struct paging_seq_info *out)
{
    memset(out, 0, sizeof *out);
    out->length = s->length;
    out->slot = pg_slot_of(pg, s);
    out->resident = !s->out;
    out->dropped = s->dropped;
    out->cls = s->cls;
    out->first_kept = UINT64_MAX;
    for (uint32_t r = 0; r < pg->p.n_regions; r++)
        if (s->kept[r] < out->first_kept)
            out->first_kept = s->kept[r];
}

int paging_seq_info(struct paging *pg, uint64_t h, unsigned how, struct paging_seq_info *out)
{
    struct pg_seq *s;
    int rc = seq_lookup(pg, h, &s);
    if (rc)
        return rc;
    if ((how & PG_INFO_LIVE) && s->dropped)
        return -ESTALE;                 /* as paging_seq_stale */
    if (how & PG_INFO_BRIEF) {
        seq_brief(pg, s, out);
        return 0;
    }
    seq_brief(pg, s, out);
    for (struct pg_bt_iter it = bt_all(pg, s); bt_next(&it);) {   /* a hole: counted nowhere */
        const struct pg_page *p = page_at(pg, it.id);
        switch (p->tier) {
        case PG_TIER_DEVICE: case PG_TIER_TO_HOST: out->pages_device++; break;
        case PG_TIER_HOST: case PG_TIER_TO_DEVICE: case PG_TIER_TO_DISK:
            out->pages_host++; break;
        default: out->pages_disk++; break;
        }
        if (page_sharers(p) > 1)
            out->pages_shared++;
    }
    return 0;
}

int paging_grow(struct paging *pg, const uint64_t *hs, const uint64_t *lengths, size_t n,
                unsigned how)
{
    if (how & PG_GROW_BATCH)
        return how & PG_GROW_IN_PLACE ? paging_seq_grow_batch_in_place(pg, hs, lengths, n)
                                      : paging_seq_grow_batch(pg, hs, lengths, n);
    KVVM_ASSERT(n == 1);
    return how & PG_GROW_IN_PLACE ? paging_seq_grow_in_place(pg, hs[0], lengths[0])
                                  : paging_seq_grow(pg, hs[0], lengths[0]);
}
