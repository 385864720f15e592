/*
 * paging/handoff.c: a sequence's pages shared with other processes through the pool daemon
 * (contract in paging.h, "hand-offs": paging_seq_share_frames and _share_mark, one entry each
 * for a hand-off and the shared prefix index). Owner seqs.
 *
 * A shared frame (pg_frame.ext) is one another process may map: the exporter's frames once
 * exported, every frame an importer maps. Two rules make that safe, both kept by the pool
 * (pool.c) and page_sharers (paging_int.h): a page on a shared frame counts one sharer more
 * than its holders here, so any write (write, prepare_write, a grow into its partial page)
 * copies it first, in the writer's process; and when its page leaves a shared frame (freed,
 * copied on write, swapped out) the handle is released through the frame source (the
 * daemon learns it: a lease returned, or a mapping given up), never put on the ready list
 * for reuse. An import adopts the frames as a non-resident sequence holding device pages
 * (as the prefix cache's adopt does), which the caller swaps in: the swap-in maps device
 * pages as they are, so nothing is copied. A handle imported may be one this context's
 * frames hold already (the pool sends a frame its client holds "held": the client's own
 * export imported, blocks attached again while mapped): it is adopted as one more frame of
 * the same handle, mapped at a second address. Both frames are ext (the first since its
 * export or publish, the second as adopted), so neither is written in place nor reused,
 * and the source counts the handle's uses: the handle goes with its last frame.
 */
#include "paging_int.h"
#include "frames.h"
#include "seqs.h"
#include "ahead.h"
#include "clock.h"

#include <errno.h>
#include <stdlib.h>

/* The pool view maps frames by block ids of its own (view.c): shared frames are not made
   for it yet. */
static int handoff_ok(struct paging *pg)
{
    return pg->view.n_ids ? -EOPNOTSUPP : 0;
}

/* h's sequence for a hand-off or a publish to the pool: -ENOENT, -EOPNOTSUPP (the view),
   -ESTALE dropped. */
static int handoff_seq(struct paging *pg, uint64_t h, struct pg_seq **s)
{
    int rc = seq_lookup(pg, h, s);
    if (rc || (rc = handoff_ok(pg)))
        return rc;
    return (*s)->dropped ? -ESTALE : 0;
}

/* The handles of the first nb blocks' pages of resident s, every region, in a malloc'd
   array: by block (block b's regions together) or by region (region r's blocks together).
   The engine is ordered after s's prefetch; sync mode waits for the device work written
   before the call, stream mode leaves that to paging_share_fence's fence (never a wait of
   the engine stream on the engine's thread: issue 35). -EINVAL a block discarded, -EAGAIN
   a page not on the device, -ENOMEM. */
static int collect_frames(struct paging *pg, struct pg_seq *s, uint32_t nb, bool by_block,
                          vmm_handle **out)
{
    int rc;
    if ((rc = defer_settle(pg, s)) || (!pg->ck.stream && (rc = pg_wait_engine(pg))) ||
        (rc = defer_reap(pg, false)))
        return rc;
    uint32_t nr = pg->p.n_regions;
    vmm_handle *hs = malloc((size_t)nr * nb * sizeof *hs);
    if (!hs)
        return -ENOMEM;
    for (uint32_t b = 0; b < nb; b++)
        for (uint32_t r = 0; r < nr; r++) {
            pg_page_id id = pg_bt(pg, s, r)[b];
            rc = pg_page_is_none(id) ? -EINVAL
                 : page_at(pg, id)->tier != PG_TIER_DEVICE ? -EAGAIN : 0;
            if (rc) {
                free(hs);
                return rc;
            }
            hs[by_block ? (size_t)b * nr + r : (size_t)r * nb + b] = page_handle(pg, id);
        }
    *out = hs;
    return 0;
}

int paging_seq_handoff_frames(struct paging *pg, uint64_t h, vmm_handle **out, uint32_t *n,
                              uint64_t *length)
{
    struct pg_seq *s;
    int rc = handoff_seq(pg, h, &s);
    if (rc)
        return rc;
    if (s->out)
        return -EAGAIN;
    uint32_t np = s->n_pages;
    if (!np)
        return -ENODATA;
    if ((rc = collect_frames(pg, s, np, false, out)))
        return rc;
    *n = pg->p.n_regions * np;
    *length = s->length;
    return 0;
}

int paging_share_fence(struct paging *pg, vmm_fence *f)
{
    if (!pg->ck.stream)
        return 0;
    int rc = vmm_fence_create(pg->v, f);
    if (rc)
        return rc;
    if ((rc = vmm_fence_record(pg->v, f, pg->ck.stream))) {
        vmm_fence_destroy(pg->v, f);
        return rc;
    }
    return 1;
}

void paging_seq_handoff_mark(struct paging *pg, uint64_t h)
{
    struct pg_seq *s;
    if (seq_lookup(pg, h, &s))
        return;
    pg->room_gen++;                     /* pages shared now: no room fact holds */
    for (struct pg_bt_iter it = bt_all(pg, s); bt_next(&it);)
        pool_share_mark(pg, it.id);
}

int paging_seq_import(struct paging *pg, uint64_t h, const vmm_handle *hs, uint32_t n,
                      uint64_t length, bool *was_out)
{
    struct pg_seq *s;
    int rc = handoff_seq(pg, h, &s);
    if (rc)
        return rc;
    *was_out = s->out;
    if (s->length)
        return -EINVAL;
    uint32_t nr = pg->p.n_regions;
    uint64_t np = pg_pages_for(pg, length);
    if (length > pg->p.max_tokens || np > pg->pages_per_slot)
        return pg_why_length(pg, length);
    if (!np || np * nr != n)
        return -EINVAL;
    if ((rc = seq_bt_reserve(pg, s, np)))
        return rc;
    /* its window comes back as the swap-in maps it: no release of it may be pending */
    if (!s->out && (rc = defer_settle(pg, s)))
        return rc;
    if ((rc = defer_flush_slot(pg, pg_slot_of(pg, s))) || (rc = pool_adopt_room(pg, n)))
        return rc;
    /* commit: nothing below fails */
    ahead_drop(pg, s, 0);
    pg->room_gen++;
    for (uint32_t r = 0; r < nr; r++) {
        pg_page_id *bt = pg_bt(pg, s, r);
        for (uint32_t b = 0; b < np; b++)
            bt[b] = page_new_off(pg, pool_adopt_ext(pg, hs[(size_t)r * np + b]));
        s->kept[r] = 0;
    }
    seq_set_out(pg, s, true);
    s->n_pages = (uint32_t)np;
    s->length = length;
    s->stale_tail = 0;
    return 0;
}

int paging_seq_block_frames(struct paging *pg, uint64_t h, uint32_t nb, vmm_handle **out)
{
    struct pg_seq *s;
    int rc = handoff_seq(pg, h, &s);
    if (rc)
        return rc;
    if (s->out)
        return -EAGAIN;
    if (!nb || nb > s->n_pages)
        return -EINVAL;
    return collect_frames(pg, s, nb, true, out);
}

void paging_seq_block_mark(struct paging *pg, uint64_t h, uint32_t nb)
{
    struct pg_seq *s;
    if (seq_lookup(pg, h, &s))
        return;
    KVVM_ASSERT(nb <= s->n_pages);
    pg->room_gen++;                     /* pages shared now: no room fact holds */
    for (uint32_t r = 0; r < pg->p.n_regions; r++)
        for (uint32_t b = 0; b < nb && b < s->n_pages; b++)
            pool_share_mark(pg, pg_bt(pg, s, r)[b]);
}

static int share_frames(struct paging *pg, uint64_t h, uint32_t nb, struct pg_share_out *o)
{
    if (nb == PG_SHARE_ALL) {
        int rc = paging_seq_stale(pg, h);
        return rc ? rc : paging_seq_handoff_frames(pg, h, &o->hs, &o->n, &o->length);
    }
    int rc = paging_seq_block_frames(pg, h, nb, &o->hs);
    if (!rc)
        o->n = nb * pg->p.n_regions;
    return rc;
}

int paging_seq_share_frames(struct paging *pg, uint64_t h, uint32_t nb, struct pg_share_out *o)
{
    *o = (struct pg_share_out){ .hs = NULL };
    int rc = share_frames(pg, h, nb, o);
    if (rc)
        return rc;
    o->fenced = paging_share_fence(pg, &o->f);
    if (o->fenced < 0) {
        free(o->hs);
        o->hs = NULL;
        return o->fenced;
    }
    return 0;
}

void paging_seq_share_mark(struct paging *pg, uint64_t h, uint32_t nb)
{
    if (nb == PG_SHARE_ALL)
        paging_seq_handoff_mark(pg, h);
    else
        paging_seq_block_mark(pg, h, nb);
}
