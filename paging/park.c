/*
 * paging/park.c: a call's reclaim moves, each one operation for swap/ (paging_reclaim_move: the
 * use stamp saved, then the swap-out, demotion or stash; paging_reclaim_back, the undo's swap-in
 * with the stamp put back; paging_undo_orphan), and a call's reclaim drop kept for its undo
 * (contract in paging.h, paging_seq_park). A CACHED sequence dropped for a call that the host
 * tier has no free room to stash (swap/undo.c) is dropped at once, its frames to the pool for the
 * caller: the record keeps what it held (its pages and their frames) and the pool's frames it
 * freed are watched (struct pg_watch) until the call ends. When the call fails, the drop is taken
 * back where nothing can have written those frames since: each is still ready under the same
 * handle and no library copy or memset was enqueued to a window address it was mapped at. The
 * frames come back under new page descriptors, the pages it shared with others under theirs,
 * mapped at the same window addresses: the sequence holds the same bytes as before the drop. A
 * shared page the drop left to non-resident holders only (an orphan) may have moved down after it
 * and come back before the undo (swap/undo.c, the journal's reverse order): paging_undo_orphan
 * notes its new frame (park_rebase).
 */
#include "paging_int.h"
#include "frames.h"
#include "seqs.h"
#include "transfers.h"
#include "window.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

enum { PK_HOLE = 0, PK_OWN, PK_SHARED };

/* One block-table entry as the drop found it. */
struct pk_ent {
    uint8_t kind;          /* PK_* */
    uint32_t watch;        /* PK_OWN: its index in pg->wt */
    pg_page_id page;       /* PK_SHARED: the page (another holder keeps it) */
    pg_frame_id frame;     /* PK_OWN, PK_SHARED: the frame and its generation then */
    uint32_t gen;
};

struct pg_park {
    uint64_t h;
    uint64_t length;
    uint32_t n_pages;
    uint64_t *kept;        /* n_regions first_kept values */
    struct pk_ent e[];     /* n_regions * n_pages, region-major */
};

static int watch_reserve(struct paging *pg, uint32_t more)
{
    struct pg_watch *w = &pg->wt;
    if (w->n + more <= w->cap)
        return 0;
    uint32_t cap = w->n + more;
    pg_frame_id *f = realloc(w->f, cap * sizeof *f);
    if (f)
        w->f = f;
    uint64_t *va = f ? realloc(w->va, cap * sizeof *va) : NULL;
    if (va)
        w->va = va;
    uint8_t *d = va ? realloc(w->dirty, cap) : NULL;
    if (!d)
        return -ENOMEM;
    w->dirty = d;
    w->cap = cap;
    return 0;
}

/* Records s's entries (its own device pages' frames watched) before the drop. */
static struct pg_park *park_record(struct paging *pg, struct pg_seq *s, uint64_t h)
{
    uint32_t nr = pg->p.n_regions, np = s->n_pages;
    struct pg_park *k = calloc(1, sizeof *k + (size_t)nr * np * sizeof k->e[0]);
    uint64_t *kept = k ? malloc(nr * sizeof *kept) : NULL;
    if (!kept || watch_reserve(pg, nr * np)) {
        free(kept);
        free(k);
        return NULL;
    }
    *k = (struct pg_park){ h, s->length, np, kept };
    memcpy(kept, s->kept, nr * sizeof *kept);
    struct pg_watch *w = &pg->wt;
    for (uint32_t r = 0; r < nr; r++)
        for (uint32_t i = 0; i < np; i++) {
            pg_page_id id = pg_bt(pg, s, r)[i];
            struct pk_ent *x = &k->e[(size_t)r * np + i];
            if (pg_page_is_none(id))
                continue;
            const struct pg_page *p = page_at(pg, id);
            x->frame = p->frame;
            x->gen = pg_frame_is_none(p->frame) ? 0 : frame_at(pg, p->frame)->gen;
            x->page = id;
            x->kind = p->refs == 1 && !p->ext ? PK_OWN : PK_SHARED;   /* (ext: not ours) */
            if (x->kind == PK_OWN) {
                x->watch = w->n;
                w->f[w->n] = p->frame;
                w->va[w->n] = 0;
                w->dirty[w->n++] = 0;
            }
        }
    return k;
}

int paging_seq_park(struct paging *pg, uint64_t h, struct pg_park **out)
{
    struct pg_seq *s;
    *out = NULL;
    int rc = seq_lookup(pg, h, &s);
    if (rc)
        return rc;
    if (s->out || s->cls != PG_SEQ_CACHED || s->dropped)
        return paging_seq_drop(pg, h, true);    /* nothing of its own on the device */
    uint32_t w0 = pg->wt.n;
    struct pg_park *k = park_record(pg, s, h);
    if (!k)
        return -ENOMEM;                         /* nothing dropped */
    rc = paging_seq_drop(pg, h, true);
    if (rc) {
        pg->wt.n = w0;
        park_free(k);
        return rc;
    }
    /* the caller takes the other ready frames first: these are written last, if at all */
    for (size_t j = 0; j < (size_t)pg->p.n_regions * k->n_pages; j++)
        if (k->e[j].kind == PK_OWN)
            pool_ready_last(pg, k->e[j].frame);
    *out = k;
    return 0;
}

/* Whether every entry of k can come back as it was (see the file's comment). */
static bool park_intact(struct paging *pg, const struct pg_park *k, const struct pg_seq *s)
{
    if (!s->live || !s->dropped || s->out || s->n_pages || s->n_defer ||
        s->bt_cap < k->n_pages || s->cls != PG_SEQ_CACHED)
        return false;
    const struct pg_watch *w = &pg->wt;
    for (size_t j = 0; j < (size_t)pg->p.n_regions * k->n_pages; j++) {
        const struct pk_ent *x = &k->e[j];
        if (x->kind == PK_OWN) {
            const struct pg_frame *fr = frame_at(pg, x->frame);
            if (x->watch >= w->n || w->dirty[x->watch] || fr->state != FR_READY ||
                !fr->listed || fr->gen != x->gen)
                return false;
        } else if (x->kind == PK_SHARED) {
            const struct pg_page *p = page_at(pg, x->page);
            if (!p->refs || p->tier != PG_TIER_DEVICE || !pg_frame_eq(p->frame, x->frame) ||
                frame_at(pg, x->frame)->gen != x->gen)
                return false;
        }
    }
    return true;
}

/* Page id, one of k's shared pages that moved down as an orphan after the drop (the drop
   left it to non-resident holders) and came back since (orphan_back): k takes it back in the
   frame it has now. Nothing else changes. */
static void park_rebase(struct paging *pg, struct pg_park *k, uint32_t id)
{
    if (!k)
        return;
    const struct pg_page *p = page_at(pg, (pg_page_id){ id });
    if (!p->refs || p->tier != PG_TIER_DEVICE)
        return;                                 /* not back: park_intact says so */
    for (size_t j = 0; j < (size_t)pg->p.n_regions * k->n_pages; j++) {
        struct pk_ent *x = &k->e[j];
        if (x->kind != PK_SHARED || x->page.v != id)
            continue;
        x->frame = p->frame;
        x->gen = frame_at(pg, p->frame)->gen;
    }
}

void paging_park_frames_last(struct paging *pg)
{
    for (uint32_t i = 0; i < pg->wt.n; i++)
        pool_ready_last(pg, pg->wt.f[i]);
}

/* Gives back what undo_take took for entries [0, upto) (their new references). */
static void undo_untake(struct paging *pg, const struct pg_park *k, const pg_page_id *ids,
                        size_t upto)
{
    for (size_t j = upto; j-- > 0;)
        if (k->e[j].kind != PK_HOLE)
            page_put(pg, ids[j]);
}

int paging_park_undo(struct paging *pg, struct pg_park *k)
{
    struct pg_seq *s;
    if (!k)
        return 0;
    int rc = seq_lookup(pg, k->h, &s);
    if (rc || !park_intact(pg, k, s))
        return -ESTALE;
    uint32_t nr = pg->p.n_regions, np = k->n_pages, slot = pg_slot_of(pg, s);
    size_t n = (size_t)nr * np;
    pg_page_id *ids = calloc(n ? n : 1, sizeof *ids);
    if (!ids)
        return -ENOMEM;
    for (size_t j = 0; j < n; j++) {
        const struct pk_ent *x = &k->e[j];
        if (x->kind == PK_OWN) {
            bool took = pool_take_frame(pg, x->frame, x->gen);
            KVVM_ASSERT(took);                  /* park_intact: ready, same handle */
            ids[j] = page_new(pg, x->frame);
        } else if (x->kind == PK_SHARED) {
            page_get(pg, x->page);
            ids[j] = x->page;
        }
    }
    uint32_t r = 0;
    for (; r < nr && !rc; r++)
        rc = win_map_pages(pg, slot, r, 0, ids + (size_t)r * np, np);
    if (rc) {
        while (--r > 0)                         /* region r - 1 failed: nothing mapped */
            win_unmap_holes_must(pg, pg_va(pg, r - 1, slot, 0), ids + (size_t)(r - 1) * np,
                                 np);
        undo_untake(pg, k, ids, n);
        free(ids);
        return rc;
    }
    /* commit: nothing below fails */
    for (r = 0; r < nr; r++)
        memcpy(pg_bt(pg, s, r), ids + (size_t)r * np, np * sizeof *ids);
    memcpy(s->kept, k->kept, nr * sizeof *s->kept);
    s->n_pages = np;
    s->length = k->length;
    s->dropped = 0;
    seq_room_void(s);
    pg->c.cache_drops--;
    free(ids);
    return 0;
}

void park_free(struct pg_park *k)
{
    if (!k)
        return;
    free(k->kept);
    free(k);
}

void paging_park_end(struct paging *pg, struct pg_park *const *parks, size_t n)
{
    for (size_t i = 0; i < n; i++)
        park_free(parks[i]);
    pg->wt.n = 0;
}

int paging_undo_orphan(struct paging *pg, uint32_t id, struct pg_park *const *parks, size_t n)
{
    int rc = paging_orphan_back(pg, id);
    for (size_t j = 0; !rc && j < n; j++)
        park_rebase(pg, parks[j], id);
    return rc;
}

/* ---- a call's reclaim moves and their undo (paging.h, paging_reclaim_move) ---------- */

int paging_reclaim_move(struct paging *pg, uint64_t h, enum pg_reclaim how, uint64_t *room,
                        struct pg_use *before)
{
    uint32_t sl = 0;
    KVVM_ASSERT(how == PG_RECLAIM_STASH ? room != NULL : room == NULL);
    *before = (struct pg_use){ 0 };
    if (how == PG_RECLAIM_STASH &&
        (paging_seq_stash_slots(pg, h, &sl) || (uint64_t)sl > *room))
        return 1;                       /* not stashable as it is, or past the room */
    (void)paging_seq_use_get(pg, h, before);     /* a planned victim: it is live */
    int rc = how == PG_RECLAIM_OUT    ? paging_swap_out(pg, h, true)
             : how == PG_RECLAIM_DEMOTE ? paging_seq_demote(pg, h)
                                        : paging_seq_stash(pg, h);
    if (!rc && how == PG_RECLAIM_STASH)
        *room -= sl;
    return rc;
}

int paging_reclaim_drop(struct paging *pg, uint64_t h, bool kept, bool wait, uint64_t *room,
                        struct pg_drop_done *done)
{
    *done = (struct pg_drop_done){ .how = PG_DROPPED };
    int rc = -ENOSPC;
    if (kept && (rc = paging_reclaim_move(pg, h, PG_RECLAIM_STASH, room, &done->use)) == 1)
        rc = -ENOSPC;                  /* not stashable in the room left */
    else if (kept && !rc) {
        done->how = PG_STASHED;
        return 0;
    }
    if (rc == -ENOSPC && kept) {       /* kept for an undo, where it can be */
        rc = paging_seq_park(pg, h, &done->park);
        if (!rc)
            done->how = PG_PARKED;
    } else if (rc == -ENOSPC) {
        rc = paging_seq_drop(pg, h, wait);
    }
    return rc;
}

int paging_reclaim_back(struct paging *pg, uint64_t h, const struct pg_use *before)
{
    int rc = paging_swap_in(pg, h, false);
    if (!rc)
        paging_seq_use_set(pg, h, before);
    return rc;
}

void park_fini(struct paging *pg)
{
    free(pg->wt.f);
    free(pg->wt.va);
    free(pg->wt.dirty);
    memset(&pg->wt, 0, sizeof pg->wt);
}
