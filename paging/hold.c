/*
 * paging/hold.c: holders of pages outside sequences (contract in paging.h, "holders outside
 * sequences"). The prefix cache (prefix/) keeps one block's pages in every region per entry
 * without a slot or a window: its references count in the pages' refs and offs like a
 * swapped-out sequence's (they map nothing, so a page whose last mapping holder leaves moves
 * down as usual, the entry following it), and in ents, so that a page only entries hold is
 * neither an orphan (reclaim drops entries, it does not copy them down) nor a spill
 * candidate's HOST page. A sequence adopts held pages as a non-resident sequence holding
 * them (as fork of a swapped-out parent does); the caller then swaps it in, which maps the
 * device pages as they are and brings the others up. The store's write-through copies a
 * published block out of its pages (paging_blocks_copy_out) through a mapping of its own in
 * the copy run, held by a DF_COPY job until the copy completed (pg_types.h).
 */
#include "paging_int.h"
#include "frames.h"
#include "seqs.h"
#include "ahead.h"
#include "transfers.h"
#include "clock.h"
#include "window.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "common/assert.h"

/* Blocks of s are pages only when a page holds whole tokens. */
static bool blocks_are_pages(const struct paging *pg)
{
    return pg->p.page_size % pg->p.bytes_per_token == 0;
}

/* The live, not dropped sequence h whose blocks are pages. -ENOENT, -ESTALE, -EOPNOTSUPP. */
static int block_seq(struct paging *pg, uint64_t h, struct pg_seq **out)
{
    int rc = seq_lookup(pg, h, out);
    if (rc)
        return rc;
    if ((*out)->dropped)
        return -ESTALE;
    return blocks_are_pages(pg) ? 0 : -EOPNOTSUPP;
}

int paging_seq_blocks(struct paging *pg, uint64_t h, uint32_t n, pg_page_id *ids)
{
    struct pg_seq *s;
    int rc = block_seq(pg, h, &s);
    if (rc)
        return rc;
    uint32_t nr = pg->p.n_regions;
    if ((uint64_t)n * pg->p.page_size > s->length * pg->p.bytes_per_token)
        return -EINVAL;                 /* past its full blocks */
    for (uint32_t b = 0; b < n; b++)
        for (uint32_t r = 0; r < nr; r++) {
            pg_page_id id = pg_bt(pg, s, r)[b];
            if (pg_page_is_none(id))
                return -EINVAL;         /* discarded in region r */
            ids[(size_t)b * nr + r] = id;
        }
    return 0;
}

void paging_hold(struct paging *pg, const pg_page_id *ids, size_t n)
{
    pg->room_gen++;                     /* pages gain a holder: no room fact holds */
    for (size_t i = 0; i < n; i++)
        page_get_ent(pg, ids[i]);
}

void paging_unhold(struct paging *pg, const pg_page_id *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        page_put_ent(pg, ids[i]);      /* the last reference frees the page at once */
}

void paging_params_get(const struct paging *pg, struct paging_params *out)
{
    *out = pg->p;
}

static uint8_t page_where(const struct pg_page *p)
{
    switch (p->tier) {
    case PG_TIER_DEVICE: case PG_TIER_TO_HOST: return PG_WHERE_DEVICE;
    case PG_TIER_HOST: case PG_TIER_TO_DEVICE: case PG_TIER_TO_DISK: return PG_WHERE_HOST;
    default: return PG_WHERE_DISK;
    }
}

struct pg_held_page paging_page_held(struct paging *pg, pg_page_id id)
{
    const struct pg_page *p = page_at(pg, id);
    return (struct pg_held_page){ .where = page_where(p), .others = p->refs - p->ents,
                                  .ents = p->tier == PG_TIER_NONE ? 0 : p->ents };
}

int paging_seq_adopt(struct paging *pg, uint64_t h, const pg_page_id *ids, uint32_t n,
                     bool *was_out)
{
    struct pg_seq *s;
    int rc = block_seq(pg, h, &s);
    if (rc)
        return rc;
    *was_out = s->out;
    if (s->length)
        return -EINVAL;
    uint64_t tokens = (uint64_t)n * (pg->p.page_size / pg->p.bytes_per_token);
    if (tokens > pg->p.max_tokens || n > pg->pages_per_slot)
        return -E2BIG;
    if ((rc = seq_bt_reserve(pg, s, n)))
        return rc;
    /* its window comes back as the swap-in maps it: no release of it may be pending */
    if (!s->out && (rc = defer_settle(pg, s)))
        return rc;
    rc = defer_flush_slot(pg, pg_slot_of(pg, s));
    if (rc)
        return rc;
    ahead_drop(pg, s, 0);
    uint32_t nr = pg->p.n_regions;
    for (uint32_t r = 0; r < nr; r++) {
        pg_page_id *bt = pg_bt(pg, s, r);
        for (uint32_t b = 0; b < n; b++) {
            bt[b] = ids[(size_t)b * nr + r];
            page_get_off(pg, bt[b]);
        }
        s->kept[r] = 0;
    }
    seq_set_out(pg, s, true);
    s->n_pages = n;
    s->length = tokens;
    s->stale_tail = 0;
    return 0;
}

void paging_seq_unadopt(struct paging *pg, uint64_t h, bool was_out)
{
    struct pg_seq *s;
    if (seq_lookup(pg, h, &s) || !s->out)
        return;
    tier_drop_out(pg, s, 0, s->n_pages);
    s->n_pages = 0;
    s->length = 0;
    /* an empty sequence, resident or swapped out as before the adoption (a swapped-out
       one's window holds nothing: adopt settled nothing of it) */
    seq_set_out(pg, s, was_out);
}

uint32_t paging_plan_pages(struct paging *pg, const pg_page_id *ids, size_t n, int d)
{
    uint32_t frees = 0;
    for (size_t i = 0; i < n; i++) {
        if (page_at(pg, ids[i])->tier != PG_TIER_DEVICE)
            continue;                   /* below the device: frees no frame */
        struct pg_page *p = plan_page(pg, ids[i]);
        if (d < 0)
            p->n_gone--;
        if (p->n_gone + 1 == p->refs && !p->kept)
            frees++;                    /* every reference is gone with this one */
        if (d > 0)
            p->n_gone++;
    }
    return frees;
}

int paging_held_down(struct paging *pg, const pg_page_id *ids, size_t n, uint32_t *moved)
{
    *moved = 0;
    if (!lower_on(pg, PG_LOWER_HOST))
        return -ENOMEM;
    int rc = tier_copy_stream(pg);
    for (size_t i = 0; !rc && i < n; i++) {
        struct pg_page *p = page_at(pg, ids[i]);
        if (p->tier != PG_TIER_DEVICE || p->refs != p->ents)
            continue;                   /* below already, or a sequence maps it */
        if (!(rc = tier_page_down(pg, ids[i])))
            (*moved)++;
    }
    return rc;
}

/* Status of block b of resident s for a copy out: all its pages on the device. */
static int block_on_device(struct paging *pg, struct pg_seq *s, uint32_t b)
{
    if (b >= s->n_pages)
        return -EINVAL;
    for (uint32_t r = 0; r < pg->p.n_regions; r++) {
        pg_page_id id = pg_bt(pg, s, r)[b];
        if (pg_page_is_none(id) || page_at(pg, id)->tier != PG_TIER_DEVICE)
            return -EAGAIN;
    }
    return 0;
}

/* Copies block b of s out (its pages, n_regions of them, into dst): the pages are mapped
   at a block of the copy run, copied from there on the copy stream (ordered by the caller)
   and held, with the run block, by a DF_COPY job until its fence completed. The copy never
   reads s's window: a copy-on-write remaps it, a free, discard or swap unmaps it, and a
   call of another thread may do either before the copy runs (issue 31). -EAGAIN no block
   of the copy run free, -ENOMEM, -EIO (nothing held then; the copy stream is waited for
   when a copy may have been queued). */
static int copy_block(struct paging *pg, struct pg_seq *s, uint32_t b, void *dst)
{
    uint32_t nr = pg->p.n_regions, run;
    struct pg_defer *d = calloc(1, sizeof *d + nr * sizeof d->pages[0]);
    pg_frame_id *fr = malloc(nr * sizeof *fr);
    int rc = -ENOMEM;
    if (!d || !fr)
        goto out_free;
    if ((rc = defer_copy_run_take(pg, &run)))
        goto out_free;
    for (uint32_t r = 0; r < nr; r++) {
        d->pages[r] = pg_bt(pg, s, r)[b];
        fr[r] = page_at(pg, d->pages[r])->frame;
    }
    uint64_t va = pg_copy_va(pg, run);
    if ((rc = vmm_fence_create(pg->v, &d->fence)))
        goto out_run;
    if ((rc = win_map_frames(pg, va, fr, nr)))
        goto out_fence;
    rc = vmm_copy_dtoh(pg->v, dst, va, (size_t)nr * pg->p.page_size, pg->ck.copy_stream);
    if (!rc)
        rc = vmm_fence_record(pg->v, &d->fence, pg->ck.copy_stream);
    if (rc) {
        (void)vmm_stream_sync(pg->v, pg->ck.copy_stream);  /* never unmap under the copy */
        win_unmap_must(pg, va, nr);
        goto out_fence;
    }
    /* commit: nothing below fails */
    d->kind = DF_COPY;
    d->slot = PG_COPY_SLOT;
    d->first = d->end = run;
    d->n = nr;
    for (uint32_t r = 0; r < nr; r++)
        page_get(pg, d->pages[r]);
    defer_copy_add(pg, d);
    free(fr);
    return 0;
out_fence:
    vmm_fence_destroy(pg->v, &d->fence);
out_run:
    defer_copy_run_give(pg, run);
out_free:
    free(d);
    free(fr);
    return rc;
}

int paging_blocks_copy_out(struct paging *pg, uint64_t h, const uint32_t *blocks, uint32_t n,
                           void *const *dst, int *status)
{
    struct pg_seq *s;
    int rc = block_seq(pg, h, &s);
    if (rc)
        return rc;
    if (s->out)
        return -EAGAIN;
    bool ordered = false;
    for (uint32_t i = 0; i < n; i++) {
        if ((status[i] = block_on_device(pg, s, blocks[i])))
            continue;
        if (!ordered) {
            rc = tier_copy_stream(pg);
            if (!rc)
                rc = tier_copies_after_engine(pg, s);
            if (rc)
                return rc;
            ordered = true;
        }
        status[i] = copy_block(pg, s, blocks[i], dst[i]);
        if (status[i] && status[i] != -EAGAIN)
            return status[i];
    }
    return 0;
}
