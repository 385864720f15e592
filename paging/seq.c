/*
 * paging/seq.c: sequences: slots and handles, block tables, window mappings, map-ahead;
 * grow (single and batch), truncate, free, fork, share.
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

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "common/log.h"

uint64_t paging_window(const struct paging *pg, uint32_t region, uint32_t slot)
{
    return pg->p.base + ((uint64_t)region * pg->p.max_seqs + slot) * pg->p.slot_bytes;
}

/* ---- mappings ----------------------------------------------------------------------- */

/* One run of frames (no hole) at va. */
static int map_run(struct paging *pg, uint64_t va, const uint32_t *frames, uint32_t n)
{
    vmm_handle hs[64] = { 0 };
    vmm_handle *h = n <= 64 ? hs : malloc(n * sizeof *h);
    if (!h)
        return -ENOMEM;
    for (uint32_t i = 0; i < n; i++)
        h[i] = frame_at(pg, frames[i])->h;
    int rc = vmm_map_run(pg->v, va, h, n, pg->p.page_size);
    if (h != hs)
        free(h);
    if (!rc)
        pg->c.maps += n;
    return rc;
}

/* Frame id 0 is a hole (a discarded page, discard.c): left unmapped, so each run of frames
   between holes is mapped on its own (one set-access per run). All or nothing. */
int seq_map_frames(struct paging *pg, uint64_t va, const uint32_t *frames, uint32_t n)
{
    for (uint32_t i = 0, j; i < n; i = j) {
        if (!frames[i]) {
            j = i + 1;
            continue;
        }
        for (j = i; j < n && frames[j]; j++)
            ;
        int rc = map_run(pg, va + (uint64_t)i * pg->p.page_size, frames + i, j - i);
        if (rc) {
            seq_unmap_holes_must(pg, va, frames, i);
            return rc;
        }
    }
    return 0;
}

int seq_map_pages(struct paging *pg, uint32_t slot, uint32_t r, uint32_t first,
                  const uint32_t *pages, uint32_t n)
{
    if (!n)
        return 0;
    uint32_t fs[64] = { 0 };
    uint32_t *f = n <= 64 ? fs : malloc(n * sizeof *f);
    if (!f)
        return -ENOMEM;
    for (uint32_t i = 0; i < n; i++)
        f[i] = pages[i] ? page_at(pg, pages[i])->frame : 0;     /* 0: a hole */
    int rc = seq_map_frames(pg, pg_va(pg, r, slot, first), f, n);
    if (f != fs)
        free(f);
    return rc;
}

int seq_unmap(struct paging *pg, uint64_t va, uint32_t n)
{
    if (!n)
        return 0;
    int rc = vmm_unmap(pg->v, va, (size_t)n * pg->p.page_size);
    if (!rc)
        pg->c.unmaps += n;
    return rc;
}

/* Unmaps on a path that must not fail (an undo, or freeing the scratch page): retries once
   (an injected or transient failure), then logs; a mapping left behind is then reported by
   the checker and by vmm_close. */
void seq_unmap_must(struct paging *pg, uint64_t va, uint32_t n)
{
    if (seq_unmap(pg, va, n) && seq_unmap(pg, va, n))
        klog_error("paging: could not unmap %u pages at 0x%llx on an undo path", n,
                   (unsigned long long)va);
}

int seq_unmap_holes(struct paging *pg, uint64_t va, const uint32_t *ids, uint32_t n)
{
    bool first = true;
    for (uint32_t i = 0, j; i < n; i = j) {
        if (!ids[i]) {
            j = i + 1;
            continue;
        }
        for (j = i; j < n && ids[j]; j++)
            ;
        uint64_t at = va + (uint64_t)i * pg->p.page_size;
        if (first) {
            int rc = seq_unmap(pg, at, j - i);
            if (rc)
                return rc;
            first = false;
        } else {
            seq_unmap_must(pg, at, j - i);
        }
    }
    return 0;
}

void seq_unmap_holes_must(struct paging *pg, uint64_t va, const uint32_t *ids, uint32_t n)
{
    if (seq_unmap_holes(pg, va, ids, n) && seq_unmap_holes(pg, va, ids, n))
        klog_error("paging: could not unmap %u pages at 0x%llx on an undo path", n,
                   (unsigned long long)va);
}

/* ---- map-ahead ---------------------------------------------------------------------- */

/* Unmaps map-ahead frames beyond the first `keep` (per region); they become ready. Nothing
   reaches them (they are past the end), so no fence is needed. */
void seq_drop_ahead(struct paging *pg, struct pg_seq *s, uint32_t keep)
{
    if (s->n_ahead <= keep)
        return;
    uint32_t n = s->n_ahead - keep, slot = pg_slot_of(pg, s);
    for (uint32_t r = 0; r < pg->p.n_regions; r++) {
        uint32_t *a = pg_ahead(pg, s, r) + keep;
        seq_unmap_must(pg, pg_va(pg, r, slot, s->n_pages + keep), n);
        pool_give(pg, a, n);
    }
    s->n_ahead = keep;
}

int seq_steal_ahead(struct paging *pg, struct pg_seq *except)
{
    if (!pg->n_ahead)
        return -ENOMEM;
    for (uint32_t i = 0; i < pg->p.max_seqs; i++) {
        struct pg_seq *s = &pg->seqs[i];
        if (s != except && s->n_ahead) {
            seq_drop_ahead(pg, s, s->n_ahead - 1);
            return 0;
        }
    }
    return -ENOMEM;
}

/* Best effort: maps ready frames ahead of s's end, up to map_ahead per region. */
static void seq_top_up_ahead(struct paging *pg, struct pg_seq *s)
{
    uint32_t nr = pg->p.n_regions, slot = pg_slot_of(pg, s);
    uint32_t room = pg->pages_per_slot - s->n_pages;
    uint32_t want = pg->p.map_ahead < room ? pg->p.map_ahead : room;
    if (s->n_ahead >= want)
        return;
    uint32_t k = want - s->n_ahead;
    if (k > pg->n_ready / nr)
        k = pg->n_ready / nr;
    if (!k)
        return;
    for (uint32_t r = 0; r < nr; r++) {
        uint32_t *a = pg_ahead(pg, s, r) + s->n_ahead;
        (void)pool_take_ready(pg, k, a);    /* k <= n_ready / nr: always k */
        uint64_t va = pg_va(pg, r, slot, s->n_pages + s->n_ahead);
        /* not scrubbed here: a map-ahead frame is unmapped at once when dropped, so no
           device work may target it; grow_region scrubs it when it becomes a page */
        if (seq_map_frames(pg, va, a, k)) {
            pool_give(pg, a, k);
            goto out_undo;
        }
        for (uint32_t i = 0; i < k; i++)
            frame_set_ahead(pg, a[i]);
        continue;
out_undo:
        while (r-- > 0) {
            uint32_t *b = pg_ahead(pg, s, r) + s->n_ahead;
            seq_unmap_must(pg, pg_va(pg, r, slot, s->n_pages + s->n_ahead), k);
            pool_give(pg, b, k);
        }
        return;
    }
    s->n_ahead += k;
}

/* ---- slots and handles -------------------------------------------------------------- */

int seq_lookup(struct paging *pg, uint64_t h, struct pg_seq **out)
{
    uint64_t slot1 = handle_slot1(h);
    uint32_t gen = handle_gen(h);
    if (!slot1 || slot1 > pg->p.max_seqs)
        return -ENOENT;
    struct pg_seq *s = &pg->seqs[slot1 - 1];
    if (!s->live || s->gen != gen)
        return -ENOENT;
    *out = s;
    return 0;
}

/* Takes a free slot (waiting for dying slots' releases if none is free). -ENOSPC, -ENOMEM. */
static int slot_take(struct paging *pg, struct pg_seq **out)
{
    if (!pg->slot_free_head && pg->n_dying) {
        int rc = defer_reap(pg, true);
        if (rc)
            return rc;
    }
    if (!pg->slot_free_head)
        return -ENOSPC;
    struct pg_seq *s = &pg->seqs[pg->slot_free_head - 1];
    if (!s->bt) {
        s->bt = calloc((size_t)pg->p.n_regions * pg->pages_per_slot, sizeof *s->bt);
        if (!s->bt)
            return -ENOMEM;
    }
    if (!s->kept && !(s->kept = calloc(pg->p.n_regions, sizeof *s->kept)))
        return -ENOMEM;
    if (pg->p.map_ahead && !s->ahead) {
        s->ahead = calloc((size_t)pg->p.n_regions * pg->p.map_ahead, sizeof *s->ahead);
        if (!s->ahead)
            return -ENOMEM;
    }
    pg->slot_free_head = s->next_free;
    s->next_free = 0;
    s->live = 1;
    s->length = 0;
    s->n_pages = 0;
    s->n_ahead = 0;
    s->used_valid = 0;
    memset(s->kept, 0, pg->p.n_regions * sizeof *s->kept);
    s->cls = PG_SEQ_LIVE;
    s->dropped = 0;
    pg->n_live++;
    *out = s;
    return 0;
}

/* Returns a slot taken by slot_take that was never used (undo). */
static void slot_untake(struct paging *pg, struct pg_seq *s)
{
    pg->n_live--;
    seq_slot_release(pg, s);
}

int paging_seq_create(struct paging *pg, uint64_t *h)
{
    struct pg_seq *s;
    int rc = slot_take(pg, &s);
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
        rc = seq_settle(pg, s);
    if (rc)
        return rc;
    if (s->out) {
        tier_drop_out(pg, s, 0, s->n_pages);
        s->out = 0;
    } else {
        seq_drop_ahead(pg, s, 0);
        rc = defer_release(pg, s, 0, s->n_pages);
        if (rc)
            return rc;
    }
    memset(s->bt, 0, (size_t)pg->p.n_regions * pg->pages_per_slot * sizeof *s->bt);
    s->n_pages = 0;
    s->length = 0;
    if (++s->gen == 0)
        s->gen = 1;
    pg->n_live--;
    if (s->n_defer) {
        s->live = 0;
        s->dying = 1;
        pg->n_dying++;
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
        if (pg_bt(pg, s, r)[idx])
            continue;
        if (!u->fill && !(u->fill = calloc(nr, sizeof *u->fill)))
            return -ENOMEM;
        uint32_t f;
        int rc = pool_take_except(pg, 1, &f, s);
        if (rc)
            return rc;
        uint64_t va = pg_va(pg, r, slot, idx);
        rc = seq_map_frames(pg, va, &f, 1);
        if (!rc && pg->p.scrub) {
            rc = vmm_memset(pg->v, va, 0, pg->p.page_size, pg->stream);
            if (!rc && !pg->stream)
                rc = vmm_stream_sync(pg->v, NULL);
            if (rc) {
                (void)pg_wait_engine(pg);   /* the memset may still run: never unmap under it */
                seq_unmap_must(pg, va, 1);
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
static int pool_reserve_check(struct paging *pg, uint32_t n)
{
    if (pool_available(pg) >= n)
        return 0;
    if (pg->defer) {
        int rc = defer_reap(pg, true);
        if (rc)
            return rc;
    }
    return pool_available(pg) >= n ? 0 : -ENOMEM;
}

/* Reverts a grow_apply of u->s. */
static void grow_undo(struct paging *pg, struct grow_undo *u)
{
    struct pg_seq *s = u->s;
    uint32_t slot = pg_slot_of(pg, s), n = u->new_np - u->old_np;
    cow_undo(pg, s, &u->cow);
    cow_commit(pg, &u->cow);
    if (u->n_fill && pg->p.scrub && pg->stream)
        (void)pg_wait_engine(pg);   /* tail_fill's scrub memsets may still run */
    for (uint32_t j = 0; j < u->n_fill; j++) {
        uint32_t *e = &pg_bt(pg, s, u->fill[j])[u->old_np - 1];
        seq_unmap_must(pg, pg_va(pg, u->fill[j], slot, u->old_np - 1), 1);
        page_put(pg, *e);
        *e = 0;
    }
    free(u->fill);
    u->fill = NULL;
    u->n_fill = 0;
    seq_drop_ahead(pg, s, 0);
    if (pg->p.scrub && pg->stream && n)
        (void)pg_wait_engine(pg);   /* the scrub memsets may still run: wait, then unmap */
    s->n_pages = u->old_np;
    s->length = u->old_len;
    for (uint32_t r = 0; r < pg->p.n_regions; r++) {
        uint32_t *bt = pg_bt(pg, s, r) + u->old_np;
        seq_unmap_must(pg, pg_va(pg, r, slot, u->old_np), n);
        for (uint32_t i = 0; i < n; i++) {
            page_put(pg, bt[i]);
            bt[i] = 0;
        }
    }
}

/* Maps region r's new pages [old_np, new_np): map-ahead frames first (already mapped),
   then `fresh` new frames in one run. Writes page ids into the block table. */
static int grow_region(struct paging *pg, struct pg_seq *s, uint32_t r, uint32_t k,
                       const uint32_t *fresh, uint32_t n_fresh)
{
    uint32_t slot = pg_slot_of(pg, s), at = s->n_pages + k;
    uint64_t va = pg_va(pg, r, slot, at);
    int rc = seq_map_frames(pg, va, fresh, n_fresh);
    if (rc)
        return rc;
    if (pg->p.scrub && k + n_fresh) {
        /* every new page (map-ahead ones included: they are scrubbed only now) is zeroed
           before the new owner can see it: on the engine stream, or synchronously. An undo
           waits for the engine before unmapping them. */
        rc = vmm_memset(pg->v, pg_va(pg, r, slot, s->n_pages), 0,
                        (size_t)(k + n_fresh) * pg->p.page_size, pg->stream);
        if (!rc && !pg->stream)
            rc = vmm_stream_sync(pg->v, NULL);
        if (rc) {
            /* a memset enqueued may still run, on the engine stream or the (asynchronous)
               legacy stream whose synchronize just failed */
            (void)pg_wait_engine(pg);
            seq_unmap_must(pg, va, n_fresh);
            return rc;
        }
    }
    uint32_t *bt = pg_bt(pg, s, r), *a = pg_ahead(pg, s, r);
    for (uint32_t i = 0; i < k; i++)
        bt[s->n_pages + i] = page_new(pg, a[i]);
    if (k && s->n_ahead > k)
        memmove(a, a + k, (s->n_ahead - k) * sizeof *a);
    for (uint32_t i = 0; i < n_fresh; i++)
        bt[at + i] = page_new(pg, fresh[i]);
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
    grow_frames(pg, s, len, &cow_idx);
    uint32_t *fresh = NULL;
    if (n_fresh) {
        fresh = malloc((size_t)n_fresh * nr * sizeof *fresh);
        if (!fresh)
            return -ENOMEM;
        rc = pool_take_except(pg, n_fresh * nr, fresh, s);
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
        if (rc) {
            grow_undo(pg, u);
            goto out_free;
        }
    }
    seq_use(pg, s);
    free(fresh);
    return 0;

out_regions:
    /* Region r failed whole. Regions [0, r) hold new pages at [old_np, new_np) (k of them
       map-ahead frames) and their remaining map-ahead was shifted to [new_np, ..); regions
       [r, nr) still have all their map-ahead at [old_np, ..). Undo to no map-ahead at all. */
    if (pg->p.scrub && pg->stream && r)
        (void)pg_wait_engine(pg);   /* regions [0, r)'s scrub memsets may still run */
    for (uint32_t q = 0; q < nr; q++) {
        uint32_t slot = pg_slot_of(pg, s), *a = pg_ahead(pg, s, q);
        uint32_t left = q < r ? s->n_ahead - k : s->n_ahead;
        uint32_t at = q < r ? u->new_np : u->old_np;
        if (q < r) {
            uint32_t *bt = pg_bt(pg, s, q) + u->old_np;
            seq_unmap_must(pg, pg_va(pg, q, slot, u->old_np), need);
            for (uint32_t i = 0; i < need; i++) {
                page_put(pg, bt[i]);
                bt[i] = 0;
            }
        }
        seq_unmap_must(pg, pg_va(pg, q, slot, at), left);
        pool_give(pg, a, left);
    }
    s->n_ahead = 0;
    if (fresh)
        pool_give(pg, fresh + (size_t)r * n_fresh, (nr - r) * n_fresh);
out_free:
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
        return -E2BIG;
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
        rc = seq_settle(pg, s);
    if (!rc)
        rc = pool_reserve_check(pg, grow_frames(pg, s, length, &cow_idx));
    if (rc)
        return rc;
    struct grow_undo u;
    uint32_t mark = pg->n_created;
    rc = grow_apply(pg, s, length, &u);
    if (rc) {
        pool_rollback(pg, mark);
        return rc;
    }
    grow_commit(pg, &u);
    seq_top_up_ahead(pg, s);
    return 0;
}

/* Appends the shared last pages (index idx) of s's regions to *cand. */
static int cow_candidates(struct paging *pg, struct pg_seq *s, uint32_t idx, uint32_t **cand,
                          uint32_t *n)
{
    uint32_t *c = realloc(*cand, (*n + pg->p.n_regions) * sizeof *c);
    if (!c)
        return -ENOMEM;
    *cand = c;
    for (uint32_t r = 0; r < pg->p.n_regions; r++) {
        uint32_t id = pg_bt(pg, s, r)[idx];
        if (id && page_sharers(page_at(pg, id)) > 1)
            c[(*n)++] = id;
    }
    return 0;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Copies a batch makes: k of a page's R holders writing it copy min(k, R - 1) times (the
   last holder left finds the page its own). */
static uint64_t batch_cow_frames(struct paging *pg, uint32_t *cand, uint32_t n)
{
    uint64_t need = 0;
    if (n)
        qsort(cand, n, sizeof *cand, cmp_u32);
    for (uint32_t i = 0, j; i < n; i = j) {
        for (j = i; j < n && cand[j] == cand[i]; j++)
            ;
        uint32_t k = j - i, r1 = page_sharers(page_at(pg, cand[i])) - 1;
        need += k < r1 ? k : r1;
    }
    return need;
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
    uint32_t *cand = NULL, n_cand = 0;
    if (!ss || !u || !seen)
        goto out_free;
    for (size_t i = 0; i < n; i++) {
        uint32_t cow_idx;
        rc = seq_lookup(pg, hs[i], &ss[i]);
        if (!rc && seen[pg_slot_of(pg, ss[i])]++)
            rc = -EINVAL;
        if (!rc)
            rc = grow_check(pg, ss[i], lengths[i]);
        if (!rc && ss[i]->out)
            rc = -EBUSY;
        if (!rc)
            rc = seq_settle(pg, ss[i]);
        if (rc)
            goto out_free;
        uint32_t all = grow_frames(pg, ss[i], lengths[i], &cow_idx), before = n_cand;
        /* the shared last pages are counted for the whole batch (holes stay in all) */
        if (cow_idx != UINT32_MAX && (rc = cow_candidates(pg, ss[i], cow_idx, &cand, &n_cand)))
            goto out_free;
        need += all - (n_cand - before);
    }
    need += batch_cow_frames(pg, cand, n_cand);
    rc = need > UINT32_MAX ? -ENOMEM : pool_reserve_check(pg, (uint32_t)need);
    if (rc)
        goto out_free;
    uint32_t mark = pg->n_created;
    for (done = 0; done < n; done++) {
        rc = grow_apply(pg, ss[done], lengths[done], &u[done]);
        if (rc)
            goto out_undo;
    }
    for (size_t i = 0; i < n; i++) {
        grow_commit(pg, &u[i]);
        seq_top_up_ahead(pg, ss[i]);
    }
    rc = 0;
    goto out_free;
out_undo:
    while (done-- > 0)
        grow_undo(pg, &u[done]);
    pool_rollback(pg, mark);
out_free:
    free(cand);
    free(ss);
    free(u);
    free(seen);
    return rc;
}

/* ---- truncate, fork, share ---------------------------------------------------------- */

int paging_seq_truncate(struct paging *pg, uint64_t h, uint64_t length)
{
    struct pg_seq *s;
    int rc = seq_lookup(pg, h, &s);
    if (rc)
        return rc;
    if (length > s->length)
        return -EINVAL;
    uint32_t np = (uint32_t)pg_pages_for(pg, length);
    if (s->out) {
        tier_drop_out(pg, s, np, s->n_pages);
        s->n_pages = np;
        s->length = length;
        seq_clamp_kept(pg, s);
        return 0;
    }
    rc = seq_settle(pg, s);
    if (rc)
        return rc;
    seq_drop_ahead(pg, s, 0);
    rc = defer_release(pg, s, np, s->n_pages);
    if (rc)
        return rc;
    for (uint32_t r = 0; r < pg->p.n_regions; r++)
        memset(pg_bt(pg, s, r) + np, 0, (s->n_pages - np) * sizeof *s->bt);
    s->n_pages = np;
    s->length = length;
    seq_clamp_kept(pg, s);
    return 0;
}

/* Maps src's pages [0, n) of every region into dst's window and takes a reference on each.
   All or nothing. */
static int map_shared(struct paging *pg, struct pg_seq *dst, struct pg_seq *src, uint32_t n)
{
    uint32_t slot = pg_slot_of(pg, dst), r;
    int rc = 0;
    for (r = 0; r < pg->p.n_regions; r++) {
        rc = seq_map_pages(pg, slot, r, 0, pg_bt(pg, src, r), n);
        if (rc)
            goto out_unmap;
    }
    for (r = 0; r < pg->p.n_regions; r++) {
        uint32_t *sb = pg_bt(pg, src, r), *db = pg_bt(pg, dst, r);
        for (uint32_t i = 0; i < n; i++) {
            if (sb[i])                  /* a hole (discarded) stays one */
                page_get(pg, sb[i]);
            db[i] = sb[i];
        }
    }
    return 0;
out_unmap:
    while (r-- > 0)
        seq_unmap_holes_must(pg, pg_va(pg, r, slot, 0), pg_bt(pg, src, r), n);
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
    if (!p->out && (rc = seq_settle(pg, p)))
        return rc;
    rc = slot_take(pg, &c);
    if (rc)
        return rc;
    if (p->out) {
        /* the child is non-resident like its parent: it holds the same pages, maps none */
        for (uint32_t r = 0; r < pg->p.n_regions; r++) {
            uint32_t *sb = pg_bt(pg, p, r), *db = pg_bt(pg, c, r);
            for (uint32_t i = 0; i < p->n_pages; i++) {
                if (sb[i])              /* a hole (discarded) stays one */
                    page_get_off(pg, sb[i]);
                db[i] = sb[i];
            }
        }
        c->out = 1;
        c->n_pages = p->n_pages;
        c->length = p->length;
        memcpy(c->kept, p->kept, pg->p.n_regions * sizeof *c->kept);   /* the discard */
        *child = seq_handle(pg, c);
        return 0;
    }
    rc = map_shared(pg, c, p, p->n_pages);
    if (rc) {
        slot_untake(pg, c);
        return rc;
    }
    c->n_pages = p->n_pages;
    c->length = p->length;
    memcpy(c->kept, p->kept, pg->p.n_regions * sizeof *c->kept);   /* the discard */
    *child = seq_handle(pg, c);
    return 0;
}

/* Copies src's partial page `idx` (rem bytes) into fresh frames mapped at dst's window in
   every region and zeroes the rest. All or nothing; frames consumed on success. */
static int share_partial(struct paging *pg, struct pg_seq *dst, struct pg_seq *src,
                         uint32_t idx, size_t rem, uint32_t *frames)
{
    uint32_t ds = pg_slot_of(pg, dst), ss = pg_slot_of(pg, src), r;
    int rc = pg_order_before_copy(pg);
    if (rc)
        return rc;
    for (r = 0; r < pg->p.n_regions; r++) {
        uint64_t va = pg_va(pg, r, ds, idx);
        if (!frames[r])
            continue;                   /* src's page is a hole (discarded): dst's too */
        rc = seq_map_frames(pg, va, &frames[r], 1);
        if (rc)
            goto out_unmap;
        rc = vmm_copy_dtod(pg->v, va, pg_va(pg, r, ss, idx), rem, pg->stream);
        if (!rc)
            rc = vmm_memset(pg->v, va + rem, 0, pg->p.page_size - rem, pg->stream);
        if (rc) {
            r++;
            goto out_unmap;
        }
    }
    rc = pg->stream ? 0 : pg_finish_copy(pg);
    if (rc)
        goto out_unmap;
    for (r = 0; r < pg->p.n_regions; r++) {
        pg_bt(pg, dst, r)[idx] = frames[r] ? page_new(pg, frames[r]) : 0;
        pg->c.share_copies += frames[r] != 0;
    }
    return 0;
out_unmap:
    /* the copies (on the engine stream, or synchronous) may still run: wait for them
       before unmapping their target */
    (void)pg_wait_engine(pg);
    while (r-- > 0)
        if (frames[r])
            seq_unmap_must(pg, pg_va(pg, r, ds, idx), 1);
    return rc;
}

/* Copies the first rem bytes of page id into a new host slot, zeroing the rest. */
static int share_host_copy(struct paging *pg, uint32_t id, size_t rem, pg_slot *slot)
{
    struct pg_page *p = page_at(pg, id);
    const struct pg_host_ops *ho = pg->p.host;
    int rc = ho->alloc(ho->arg, slot);
    if (rc)
        return rc;
    char *dst = ho->ptr(ho->arg, *slot);
    if (!page_has_frame(p) && p->tier != PG_TIER_HOST && p->tier != PG_TIER_TO_DISK) {
        rc = -EIO;                       /* on disk: the caller brings it back first */
        goto out_slot;
    } else if (p->tier == PG_TIER_HOST || p->tier == PG_TIER_TO_DISK) {
        memcpy(dst, ho->ptr(ho->arg, p->host_slot), rem);
    } else {
        /* on the device (mapped by a resident sharer, or an orphan): through the scratch */
        rc = pg_wait_engine(pg);
        if (!rc)
            rc = seq_map_frames(pg, pg->scratch_va, &p->frame, 1);
        if (rc)
            goto out_slot;
        /* on the engine stream (after its work), waiting for that stream only; the legacy
           stream would also wait for (or not be ordered with) unrelated streams */
        rc = vmm_copy_dtoh(pg->v, dst, pg->scratch_va, rem, pg->stream);
        int src = pg_finish_copy(pg);
        if (src && !rc)
            (void)pg_wait_engine(pg);   /* the copy may still be queued: never unmap under it */
        seq_unmap_must(pg, pg->scratch_va, 1);
        if (rc || (rc = src))
            goto out_slot;
    }
    memset(dst + rem, 0, pg->p.page_size - rem);
    return 0;
out_slot:
    ho->free(ho->arg, *slot);
    return rc;
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
    if (!rc && rem && !pg->p.host)
        rc = -ENOMEM;
    if (!rc && rem && pg->n_inflight)
        rc = defer_reap(pg, true);          /* the partial page's bytes settle first */
    uint32_t nk = 0;                    /* partial pages to copy: holes are not */
    if (!rc && rem) {
        /* a partial page on disk comes back to the host tier first */
        uint32_t ids[nr];
        for (r = 0; r < nr; r++)
            if (pg_bt(pg, src, r)[whole])
                ids[nk++] = pg_bt(pg, src, r)[whole];
        rc = disk_unspill(pg, ids, nk, src);
    }
    if (!rc && nk && pg->p.disk && paging_host_free(pg) < nk)
        rc = paging_host_room(pg, nk, seq_handle(pg, src));   /* src's pages stay */
    if (rc)
        return rc;
    for (r = 0; rem && r < nr; r++) {
        slots[r] = PG_SLOT_NONE;        /* none: a hole (discarded) */
        if (pg_bt(pg, src, r)[whole] &&
            (rc = share_host_copy(pg, pg_bt(pg, src, r)[whole], rem, &slots[r])))
            goto out_slots;
    }
    seq_drop_ahead(pg, dst, 0);
    for (r = 0; r < nr; r++) {
        uint32_t *sb = pg_bt(pg, src, r), *db = pg_bt(pg, dst, r);
        for (uint32_t i = 0; i < whole; i++) {
            if (sb[i])                  /* a hole (discarded) stays one */
                page_get_off(pg, sb[i]);
            db[i] = sb[i];
        }
        if (rem && slots[r].v == PG_SLOT_NONE.v) {
            db[whole] = 0;
        } else if (rem) {
            uint32_t id = pg->page_free_head;
            struct pg_page *p = page_at(pg, id);
            pg->page_free_head = p->next_free;
            *p = (struct pg_page){ .refs = 1, .offs = 1, .tier = PG_TIER_HOST,
                                   .host_slot = slots[r] };
            page_count(pg, p, 1);
            pg->n_pages_live++;
            pg->n_host++;
            db[whole] = id;
        }
    }
    dst->out = 1;
    dst->n_pages = whole + (rem ? 1 : 0);
    dst->length = n_tokens;
    return 0;
out_slots:
    while (r-- > 0)
        if (slots[r].v != PG_SLOT_NONE.v)
            pg->p.host->free(pg->p.host->arg, slots[r]);
    return rc;
}

static int share_resident(struct paging *pg, struct pg_seq *dst, struct pg_seq *src,
                          uint64_t n_tokens);

int paging_seq_share(struct paging *pg, uint64_t dh, uint64_t sh, uint64_t n_tokens)
{
    struct pg_seq *dst, *src;
    int rc = seq_lookup(pg, dh, &dst);
    if (!rc)
        rc = seq_lookup(pg, sh, &src);
    if (rc)
        return rc;
    if (dst->dropped || src->dropped)
        return -ESTALE;
    if (dst->length || n_tokens > src->length)
        return -EINVAL;
    if (!n_tokens)
        return 0;
    bool was_out = dst->out;
    if (was_out) {
        /* an empty non-resident sequence: nothing to bring back; resident again unless
           the call fails */
        rc = defer_flush_slot(pg, pg_slot_of(pg, dst));
        if (rc)
            return rc;
        dst->out = 0;
    }
    rc = src->out ? share_out(pg, dst, src, n_tokens) : share_resident(pg, dst, src, n_tokens);
    if (rc && was_out)
        dst->out = 1;
    for (uint32_t r = 0; !rc && r < pg->p.n_regions; r++)   /* src's discard, kept */
        dst->kept[r] = src->kept[r] < n_tokens ? src->kept[r] : n_tokens;
    return rc;
}

static int share_resident(struct paging *pg, struct pg_seq *dst, struct pg_seq *src,
                          uint64_t n_tokens)
{
    int rc = seq_settle(pg, src);
    if (rc)
        return rc;
    uint64_t bytes = n_tokens * pg->p.bytes_per_token;
    uint32_t whole = (uint32_t)(bytes / pg->p.page_size), nr = pg->p.n_regions;
    size_t rem = bytes % pg->p.page_size;
    uint32_t frames[nr], got[nr], nk = 0;
    memset(frames, 0, sizeof frames);   /* (0: no partial page to copy in that region) */
    memset(got, 0, sizeof got);
    for (uint32_t r = 0; rem && r < nr; r++)
        nk += pg_bt(pg, src, r)[whole] != 0;    /* a hole (discarded) is not copied */
    rc = defer_flush_slot(pg, pg_slot_of(pg, dst));
    if (!rc && nk)
        rc = pool_reserve_check(pg, nk);
    if (rc)
        return rc;
    seq_drop_ahead(pg, dst, 0);
    uint32_t mark = pg->n_created;
    if (nk && (rc = pool_take(pg, nk, got)))
        goto out_rollback;
    for (uint32_t r = 0, k = 0; rem && r < nr; r++)
        frames[r] = pg_bt(pg, src, r)[whole] ? got[k++] : 0;
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
    dst->n_pages = whole + (rem ? 1 : 0);
    dst->length = n_tokens;
    return 0;
out_shared:
    for (uint32_t r = 0; r < nr; r++) {
        seq_unmap_holes_must(pg, pg_va(pg, r, pg_slot_of(pg, dst), 0), pg_bt(pg, dst, r),
                             whole);
        for (uint32_t i = 0; i < whole; i++) {
            if (pg_bt(pg, dst, r)[i])
                page_put(pg, pg_bt(pg, dst, r)[i]);
            pg_bt(pg, dst, r)[i] = 0;
        }
    }
out_frames:
    if (nk)
        pool_give(pg, got, nk);
out_rollback:
    pool_rollback(pg, mark);
    return rc;
}

/* ---- info --------------------------------------------------------------------------- */

int paging_seq_info(struct paging *pg, uint64_t h, struct paging_seq_info *out)
{
    struct pg_seq *s;
    int rc = seq_lookup(pg, h, &s);
    if (rc)
        return rc;
    memset(out, 0, sizeof *out);
    out->length = s->length;
    out->slot = pg_slot_of(pg, s);
    out->resident = !s->out;
    out->dropped = s->dropped;
    out->cls = s->cls;
    out->first_kept = UINT64_MAX;
    for (uint32_t r = 0; r < pg->p.n_regions; r++) {
        const uint32_t *bt = pg_bt(pg, s, r);
        if (s->kept[r] < out->first_kept)
            out->first_kept = s->kept[r];
        for (uint32_t i = 0; i < s->n_pages; i++) {
            if (!bt[i])
                continue;               /* a hole: discarded, counted nowhere */
            const struct pg_page *p = page_at(pg, bt[i]);
            switch (p->tier) {
            case PG_TIER_DEVICE: case PG_TIER_TO_HOST: out->pages_device++; break;
            case PG_TIER_HOST: case PG_TIER_TO_DEVICE: case PG_TIER_TO_DISK:
                out->pages_host++; break;
            default: out->pages_disk++; break;
            }
            if (page_sharers(p) > 1)
                out->pages_shared++;
        }
    }
    return 0;
}
