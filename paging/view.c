/*
 * paging/view.c: the pool view (KVVM_F_POOL_VIEW): one block id per block, the same in
 * every region, for paged-attention kernels that take one block table for all layers.
 *
 * Layout: region r's view is n_ids pages at view.base + r * n_ids * page_size (inside the
 * context's reservation, after the windows and the scratch page). An id is a tuple of
 * frames, one per region: slot (id, r) maps the frame of region r's page of the block(s)
 * naming it, or nothing for a hole (a discarded page). The window and the view map the same
 * handle: no copy, the bytes written through one are the bytes read through the other.
 *
 * Ids are made lazily: the first block table that names a block whose frames no id of its
 * holder maps yet takes a free id and maps its slots (one map + set-access per region). So
 * a grow, on the engine's hot path, makes exactly the driver calls it makes without the
 * view. The block's id is then kept while its frames stay: a block table checks each id
 * against the block's frames (frame id and generation, so a recycled frame id holding a new
 * handle never passes) and makes a new id where they changed (copy-on-write, a hole filled
 * again, a swap-in). Forks share ids (view_fork); release paths let them go
 * (view_release: free, truncate, discard, drop; swap-out lets every id of the sequence go).
 *
 * Ordering: device work may use an id under the protection rule of window addresses, so
 * an id let go is DEAD, still mapped, until its death's epoch is quiet (the step fence
 * found complete: pg->ck.quiet_below) or a synchronization of the device or engine stream
 * came after it (pg->ck.n_syncs); view_reap then unmaps it and frees it. A slot of a region
 * that the id's only holder discarded is a zombie, unmapped under the same rule; a holder
 * sharing the id keeps its slot mapped. view_reap runs at step and sync, and when no id is
 * free (then after a synchronization).
 *
 * Frames: the driver keeps a released handle's memory while any mapping of it is left, so
 * a frame is released (trim, budget, the pool thread, pool.c) only when no slot maps it:
 * group_map and slot_unmap count the slots mapping each frame (pg_frame.vmaps), and the
 * release paths unmap the dead ids first, behind the rule above (waiting for it where the
 * call must give the memory back: kvvm_trim, kvvm_set_budget) or leave those frames held.
 *
 * Bound: ids named by block tables are at most max_seqs * pages_per_slot; the rest of
 * n_ids (fixed at open, core/open.c) is room for dead ids waiting for their reap.
 */
#include "paging_int.h"
#include "frames.h"
#include "clock.h"
#include "view.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "common/assert.h"
#include "common/log.h"

static uint64_t view_va(const struct paging *pg, uint32_t r, uint32_t id)
{
    return pg->view.base + ((uint64_t)r * pg->view.n_ids + id) * pg->p.page_size;
}

static struct pg_vslot *vslot(struct paging *pg, uint32_t id, uint32_t r)
{
    return &pg->view.slot[(size_t)id * pg->p.n_regions + r];
}

int view_init(struct paging *pg)
{
    struct pg_view *w = &pg->view;
    w->n_ids = pg->p.view_ids;
    w->base = pg->p.view_base;
    if (!w->n_ids)
        return 0;
    w->ids = calloc(w->n_ids, sizeof *w->ids);
    w->slot = calloc((size_t)w->n_ids * pg->p.n_regions, sizeof *w->slot);
    w->zq = calloc(w->n_ids, sizeof *w->zq);
    if (!w->ids || !w->slot || !w->zq) {
        free(w->ids);
        free(w->slot);
        free(w->zq);
        memset(w, 0, sizeof *w);
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < w->n_ids; i++)
        w->ids[i].next = i + 2 <= w->n_ids ? i + 2 : 0;
    w->free_head = 1;
    w->n_free = w->n_ids;
    /* groups kept prepared: a few blocks' worth, never a large share of the budget */
    uint32_t most = pg->p.max_frames / (4 * pg->p.n_regions);
    w->want = most < 4 ? most : 4;
    return 0;
}

/* Unmaps slot (id, r); false when the driver refused (the slot stays as it was). */
static bool slot_unmap(struct paging *pg, uint32_t id, uint32_t r)
{
    struct pg_vslot *sl = vslot(pg, id, r);
    if (sl->st == VS_UNMAPPED)
        return true;
    if (vmm_unmap(pg->v, view_va(pg, r, id), pg->p.page_size) && !vmm_dead(pg->v))
        return false;
    struct pg_frame *fr = frame_at(pg, sl->f);
    KVVM_ASSERT(fr->vmaps > 0 && fr->gen == sl->gen);  /* never released while mapped here */
    fr->vmaps--;
    if (sl->st == VS_ZOMBIE)
        pg->view.ids[id].zombies--;
    memset(sl, 0, sizeof *sl);
    return true;
}

void view_fini(struct paging *pg)
{
    struct pg_view *w = &pg->view;
    if (!w->n_ids)
        return;
    view_break_all(pg);             /* the prepared groups' frames back to the pool */
    for (uint32_t id = 0; id < w->n_ids; id++)
        for (uint32_t r = 0; r < pg->p.n_regions; r++)
            if (!slot_unmap(pg, id, r) && !slot_unmap(pg, id, r))
                klog_error("paging: pool view id %u of region %u could not be unmapped at "
                           "close", id, r);
    free(w->ids);
    free(w->slot);
    free(w->zq);
    memset(w, 0, sizeof *w);
}

/* ---- the life of an id -------------------------------------------------------------- */

static void vid_kill(struct paging *pg, uint32_t id)
{
    struct pg_vid *v = &pg->view.ids[id];
    v->state = VID_DEAD;
    v->dead_epoch = pg->epoch;
    v->dead_sync = pg->ck.n_syncs;
    v->next = pg->view.dead_head;
    pg->view.dead_head = id + 1;
    pg->view.n_dead++;
}

static void vid_put(struct paging *pg, uint32_t id)
{
    struct pg_vid *v = &pg->view.ids[id];
    KVVM_ASSERT(v->state == VID_LIVE && v->refs > 0);
    if (--v->refs == 0)
        vid_kill(pg, id);
}

/* No device work may use what was let go at (epoch, sync) any more. */
static bool reapable(const struct paging *pg, uint64_t epoch, uint64_t sync)
{
    return epoch < pg->ck.quiet_below || pg->ck.n_syncs > sync;
}

/* A dead id no block table handed out: nothing can use it. */
static bool vid_reapable(const struct paging *pg, const struct pg_vid *v)
{
    return !v->used || reapable(pg, v->dead_epoch, v->dead_sync);
}

/* Unmaps every slot of dead id; true when it is FREE now. */
static bool vid_bury(struct paging *pg, uint32_t id)
{
    bool ok = true;
    for (uint32_t r = 0; r < pg->p.n_regions; r++)
        ok &= slot_unmap(pg, id, r);
    return ok;
}

static void reap_dead(struct paging *pg)
{
    struct pg_view *w = &pg->view;
    uint32_t *pp = &w->dead_head;
    while (*pp) {
        uint32_t id = *pp - 1;
        struct pg_vid *v = &w->ids[id];
        if (!vid_reapable(pg, v) || !vid_bury(pg, id)) {
            pp = &v->next;
            continue;
        }
        *pp = v->next;
        w->n_dead--;
        v->state = VID_FREE;
        v->zombies = 0;
        v->next = w->free_head;
        w->free_head = id + 1;
        w->n_free++;
    }
}

static void reap_zombies(struct paging *pg)
{
    struct pg_view *w = &pg->view;
    uint32_t kept = 0;
    for (uint32_t i = 0; i < w->n_zq; i++) {
        uint32_t id = w->zq[i];
        struct pg_vid *v = &w->ids[id];
        if (v->state == VID_LIVE && v->zombies && reapable(pg, v->dead_epoch, v->dead_sync))
            for (uint32_t r = 0; r < pg->p.n_regions; r++)
                if (vslot(pg, id, r)->st == VS_ZOMBIE)
                    (void)slot_unmap(pg, id, r);        /* refused: the next reap */
        if (v->state == VID_LIVE && v->zombies)
            w->zq[kept++] = id;
        else
            v->in_zq = 0;       /* (a dead id's zombie slots go with it) */
    }
    w->n_zq = kept;
}

int view_reap(struct paging *pg, bool wait)
{
    struct pg_view *w = &pg->view;
    if (!w->n_ids || (!w->dead_head && !w->n_zq))
        return 0;
    if (wait) {
        int rc = pg->ck.stream ? vmm_stream_sync(pg->v, pg->ck.stream) : vmm_device_sync(pg->v);
        if (rc)
            return rc;
        pg->ck.n_syncs++;
    }
    reap_zombies(pg);
    reap_dead(pg);
    return 0;
}

/* A free id (reaping the dead, after a synchronization, when none is). -ENOMEM, -EIO. */
static int vid_take(struct paging *pg, uint32_t *id)
{
    struct pg_view *w = &pg->view;
    if (!w->free_head) {
        int rc = view_reap(pg, true);
        if (rc)
            return rc;
    }
    if (!w->free_head)
        return -ENOMEM;
    *id = w->free_head - 1;
    w->free_head = w->ids[*id].next;
    w->ids[*id].next = 0;
    w->n_free--;
    return 0;
}

static void vid_untake(struct paging *pg, uint32_t id)
{
    struct pg_view *w = &pg->view;
    w->ids[id].state = VID_FREE;
    w->ids[id].next = w->free_head;
    w->free_head = id + 1;
    w->n_free++;
}

/* Maps frames f[0..nr) at id's slots (region r: f[r]; PG_FRAME_NONE: a hole, left
   unmapped). All or nothing. */
static int group_map(struct paging *pg, uint32_t id, const pg_frame_id *f)
{
    uint32_t r;
    int rc = 0;
    for (r = 0; r < pg->p.n_regions; r++) {
        if (pg_frame_is_none(f[r]))
            continue;
        struct pg_frame *fr = frame_at(pg, f[r]);
        rc = vmm_map_run(pg->v, view_va(pg, r, id), &fr->h, 1, pg->p.page_size);
        if (rc)
            break;
        *vslot(pg, id, r) = (struct pg_vslot){ fr->h, f[r], fr->gen, VS_MAPPED };
        fr->vmaps++;
    }
    if (!rc)
        return 0;
    while (r-- > 0)
        if (!slot_unmap(pg, id, r) && !slot_unmap(pg, id, r))
            klog_error("paging: pool view id %u of region %u could not be unmapped on an "
                       "undo path", id, r);
    return rc;
}

/* A new id for block b of s: every region's page mapped at its slot. All or nothing. */
static int vid_new(struct paging *pg, struct pg_seq *s, uint32_t b, uint32_t *out)
{
    uint32_t id, nr = pg->p.n_regions;
    pg_frame_id fs[16] = { { 0 } }, *f = nr <= 16 ? fs : calloc(nr, sizeof *f);
    if (!f)
        return -ENOMEM;
    for (uint32_t r = 0; r < nr; r++) {
        pg_page_id p = pg_bt(pg, s, r)[b];
        f[r] = pg_page_is_none(p) ? PG_FRAME_NONE : page_at(pg, p)->frame;
    }
    int rc = vid_take(pg, &id);
    if (!rc && (rc = group_map(pg, id, f)) != 0)
        vid_untake(pg, id);
    if (f != fs)
        free(f);
    if (rc)
        return rc;
    struct pg_vid *v = &pg->view.ids[id];
    v->state = VID_LIVE;
    v->refs = 1;
    v->zombies = 0;
    v->used = 0;
    *out = id;
    return 0;
}

/* ---- prepared groups ---------------------------------------------------------------- */

/* One group: n_regions ready frames mapped at a free id. False: nothing done. */
static bool prepare_one(struct paging *pg)
{
    uint32_t nr = pg->p.n_regions, id;
    struct pg_view *w = &pg->view;
    if (pg->fr.n_ready < nr || !w->free_head)
        return false;
    pg_frame_id fs[16] = { { 0 } }, *f = nr <= 16 ? fs : calloc(nr, sizeof *f);
    if (!f)
        return false;
    (void)vid_take(pg, &id);                    /* one is free: no reap */
    uint32_t got = pool_take_ready(pg, nr, f);  /* nr are ready */
    bool ok = got == nr && group_map(pg, id, f) == 0;
    if (ok) {
        for (uint32_t r = 0; r < nr; r++) {
            frame_set_ahead(pg, f[r]);          /* free for accounting, stealable */
            frame_at(pg, f[r])->grp = id + 1;
        }
        struct pg_vid *v = &w->ids[id];
        v->state = VID_READY;
        v->refs = 0;
        v->used = 0;
        v->next = w->ready_head;
        w->ready_head = id + 1;
        w->n_groups++;
    } else {
        pool_give(pg, f, got);
        vid_untake(pg, id);
    }
    if (f != fs)
        free(f);
    return ok;
}

void paging_view_prepare(struct paging *pg)
{
    struct pg_view *w = &pg->view;
    if (!w->n_ids || vmm_dead(pg->v))
        return;
    while (w->n_groups < w->want && prepare_one(pg))
        ;
}

/* Pops a prepared group off its list. */
static uint32_t group_pop(struct paging *pg)
{
    struct pg_view *w = &pg->view;
    uint32_t id = w->ready_head - 1;
    w->ready_head = w->ids[id].next;
    w->ids[id].next = 0;
    w->n_groups--;
    return id;
}

uint32_t view_take_groups(struct paging *pg, uint32_t n, pg_frame_id *fresh, uint32_t stride,
                          uint32_t *gids)
{
    uint32_t k = 0;
    for (; k < n && pg->view.n_groups; k++) {
        uint32_t id = group_pop(pg);
        for (uint32_t r = 0; r < pg->p.n_regions; r++) {
            pg_frame_id f = vslot(pg, id, r)->f;
            frame_at(pg, f)->grp = 0;
            frame_set_used(pg, f);
            fresh[(size_t)r * stride + k] = f;
        }
        pg->view.ids[id].state = VID_LIVE;      /* refs 0 until view_end_groups */
        gids[k] = id;
    }
    if (k)
        pool_feed_ask(pg);          /* the thread prepares more at its next round */
    return k;
}

void view_end_groups(struct paging *pg, struct pg_seq *s, uint32_t first, const uint32_t *gids,
                     uint32_t n, bool ok)
{
    for (uint32_t i = 0; i < n; i++) {
        struct pg_vid *v = &pg->view.ids[gids[i]];
        if (ok) {
            v->refs = 1;
            s->bid[first + i] = gids[i] + 1;
        } else {
            v->used = 0;
            vid_kill(pg, gids[i]);  /* its frames are the failed grow's: unmapped at reap */
        }
    }
}

int view_break_group(struct paging *pg)
{
    if (!pg->view.n_groups)
        return -ENOMEM;
    uint32_t id = group_pop(pg);
    for (uint32_t r = 0; r < pg->p.n_regions; r++) {
        pg_frame_id f = vslot(pg, id, r)->f;
        frame_at(pg, f)->grp = 0;
        pool_give(pg, &f, 1);
    }
    pg->view.ids[id].used = 0;
    vid_kill(pg, id);               /* never handed out: unmapped at the next reap */
    return 0;
}

void view_break_all(struct paging *pg)
{
    if (!pg->view.n_groups)
        return;
    while (!view_break_group(pg))
        ;
    reap_dead(pg);      /* unmapped now: a release (trim, budget) then frees the memory */
}

/* ---- release paths ------------------------------------------------------------------ */

/* Block b of s has a page in some region other than `region` (UINT32_MAX: none counts). */
static bool other_pages(struct paging *pg, struct pg_seq *s, uint32_t region, uint32_t b)
{
    if (region == UINT32_MAX)
        return false;
    for (struct pg_bt_iter it = bt_range(pg, s, 0, pg->p.n_regions, b, b + 1); bt_next(&it);)
        if (it.r != region)
            return true;
    return false;
}

/* s alone holds id, and discarded its region r: the slot is a zombie. */
static void slot_zombie(struct paging *pg, uint32_t id, uint32_t r)
{
    struct pg_vid *v = &pg->view.ids[id];
    struct pg_vslot *sl = vslot(pg, id, r);
    if (sl->st != VS_MAPPED)
        return;
    sl->st = VS_ZOMBIE;
    v->zombies++;
    v->dead_epoch = pg->epoch;
    v->dead_sync = pg->ck.n_syncs;
    if (!v->in_zq) {
        v->in_zq = 1;
        pg->view.zq[pg->view.n_zq++] = id;
    }
}

void view_end_stale(struct paging *pg)
{
    struct pg_view *w = &pg->view;
    for (uint32_t id = 0; id < w->n_ids; id++) {
        if (w->ids[id].state != VID_LIVE)
            continue;
        /* a live holder's pages are in use: a slot mapping a ready frame names a frame no
           holder's block has any more (its copy-on-write, its region discarded by every
           holder); only a new block table would replace the id, and until then its slot
           kept the frame from the driver. Device work may still read it through a block
           table already handed out: a zombie, unmapped under the same rule. */
        for (uint32_t r = 0; r < pg->p.n_regions; r++) {
            const struct pg_vslot *sl = vslot(pg, id, r);
            if (sl->st == VS_MAPPED && frame_at(pg, sl->f)->state == FR_READY)
                slot_zombie(pg, id, r);
        }
    }
}

void view_release(struct paging *pg, struct pg_seq *s, uint32_t region, uint32_t first,
                  uint32_t end)
{
    if (!pg->view.n_ids || !s->bid)
        return;
    for (uint32_t b = first; b < end; b++) {
        if (!s->bid[b])
            continue;
        uint32_t id = s->bid[b] - 1;
        if (!other_pages(pg, s, region, b)) {
            vid_put(pg, id);
            s->bid[b] = 0;
        } else if (pg->view.ids[id].refs == 1) {
            slot_zombie(pg, id, region);
        }
    }
}

void view_fork(struct paging *pg, struct pg_seq *child, struct pg_seq *parent, uint32_t n)
{
    if (!pg->view.n_ids)
        return;
    for (uint32_t b = 0; b < n; b++) {
        child->bid[b] = parent->bid[b];
        if (parent->bid[b])
            pg->view.ids[parent->bid[b] - 1].refs++;
    }
}

/* ---- block tables ------------------------------------------------------------------- */

/* Whether id maps block b of s: every page's frame (and its generation) at its region's
   slot. A hole matches anything (a region discarded while another holder kept it). */
static bool vid_matches(struct paging *pg, uint32_t id, struct pg_seq *s, uint32_t b)
{
    if (pg->view.ids[id].state != VID_LIVE)
        return false;
    for (struct pg_bt_iter it = bt_range(pg, s, 0, pg->p.n_regions, b, b + 1); bt_next(&it);) {
        const struct pg_vslot *sl = vslot(pg, id, it.r);
        pg_frame_id f = page_at(pg, it.id)->frame;
        if (sl->st != VS_MAPPED || !pg_frame_eq(sl->f, f) || sl->gen != frame_at(pg, f)->gen)
            return false;
    }
    return true;
}

/* The id of block b of s (-1: a hole in every region), made when it has none. */
static int block_id(struct paging *pg, struct pg_seq *s, uint32_t b, int32_t *out)
{
    bool any = false;
    for (struct pg_bt_iter it = bt_range(pg, s, 0, pg->p.n_regions, b, b + 1); bt_next(&it);) {
        if (!page_has_frame(page_at(pg, it.id)))
            return -EAGAIN;             /* (a resident sequence's pages all have one) */
        any = true;
    }
    uint32_t old = s->bid[b], id;
    if (!any) {
        if (old)
            vid_put(pg, old - 1);
        s->bid[b] = 0;
        *out = -1;
        return 0;
    }
    if (old && vid_matches(pg, old - 1, s, b)) {
        pg->view.ids[old - 1].used = 1;
        *out = (int32_t)(old - 1);
        return 0;
    }
    int rc = vid_new(pg, s, b, &id);
    if (rc)
        return rc;
    if (old)
        vid_put(pg, old - 1);
    s->bid[b] = id + 1;
    pg->view.ids[id].used = 1;
    *out = (int32_t)id;
    return 0;
}

int paging_pool_view(const struct paging *pg, uint32_t region, uint64_t *addr,
                     uint32_t *n_ids)
{
    if (!pg->view.n_ids)
        return -EOPNOTSUPP;
    if (addr && region >= pg->p.n_regions)
        return -EINVAL;
    if (addr)
        *addr = view_va(pg, region, 0);
    if (n_ids)
        *n_ids = pg->view.n_ids;
    return 0;
}

/* s for a block table: live, not dropped, resident, settled. */
static int table_seq(struct paging *pg, uint64_t h, struct pg_seq **out)
{
    if (!pg->view.n_ids)
        return -EOPNOTSUPP;
    int rc = seq_lookup(pg, h, out);
    if (rc)
        return rc;
    if ((*out)->dropped)
        return -ESTALE;
    return (*out)->out ? -EAGAIN : 0;
}

static int table_fill(struct paging *pg, struct pg_seq *s, uint32_t first, uint32_t n,
                      int32_t *ids)
{
    int rc = defer_settle(pg, s);         /* a prefetch's copies before the engine's reads */
    for (uint32_t i = 0; i < n && !rc; i++)
        rc = block_id(pg, s, first + i, &ids[i]);
    return rc;
}

int paging_seq_block_table(struct paging *pg, uint64_t h, uint32_t first, uint32_t n,
                           int32_t *ids)
{
    struct pg_seq *s;
    int rc = table_seq(pg, h, &s);
    if (rc)
        return rc;
    if ((n && !ids) || first > s->n_pages || n > s->n_pages - first)
        return -EINVAL;
    return table_fill(pg, s, first, n, ids);
}

/* Tokens in s's last block (1..T; 0 for an empty sequence). */
static int32_t last_tokens(const struct paging *pg, const struct pg_seq *s)
{
    if (!s->n_pages)
        return 0;
    uint64_t t = pg->p.page_size / pg->p.bytes_per_token;
    return (int32_t)(s->length - (uint64_t)(s->n_pages - 1) * t);
}

int paging_batch_block_table(struct paging *pg, const uint64_t *hs, size_t n, int32_t *indptr,
                             int32_t *indices, size_t cap, int32_t *last_len)
{
    if (!pg->view.n_ids)
        return -EOPNOTSUPP;
    if ((n && !hs) || !indptr || (cap && !indices))
        return -EINVAL;
    struct pg_seq **ss = malloc((n ? n : 1) * sizeof *ss);
    if (!ss)
        return -ENOMEM;
    uint64_t total = 0;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        rc = table_seq(pg, hs[i], &ss[i]);
        if (!rc)
            total += ss[i]->n_pages;
    }
    if (!rc && total > INT32_MAX)
        rc = -EINVAL;
    if (rc)
        goto out;
    indptr[0] = 0;
    for (size_t i = 0; i < n; i++)
        indptr[i + 1] = indptr[i] + (int32_t)ss[i]->n_pages;
    if (total > cap)
        rc = -ENOSPC;
    for (size_t i = 0; i < n && !rc; i++) {
        rc = table_fill(pg, ss[i], 0, ss[i]->n_pages, indices + indptr[i]);
        if (!rc && last_len)
            last_len[i] = last_tokens(pg, ss[i]);
    }
out:
    free(ss);
    return rc;
}
