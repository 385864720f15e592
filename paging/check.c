/*
 * paging/check.c: the invariant checker (core/debug.h states what it checks).
 *
 * The bookkeeping is checked against itself (refcounts vs holders, conservation of frames,
 * slots) and, where the driver can show its own tables (vmm_debug_mapping,
 * vmm_debug_objects: the emulated device), against them: the mapping at every window page
 * that should be mapped, a sample of pages that should not be, and the driver's live handle
 * / mapping counters. Where the driver cannot (CUDA: -EOPNOTSUPP), those checks are skipped.
 */
#include "paging_int.h"
#include "ahead.h"
#include "transfers.h"
#include "clock.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include "common/log.h"

struct ck {
    struct paging *pg;
    char *why;
    size_t len;
    bool drv;             /* the driver shows its tables (vmm_debug_*) */
    uint32_t *refs;       /* expected refs per page id - 1 */
    uint32_t *offs;       /* expected non-resident entries per page id - 1 */
    uint32_t *jobs;       /* expected transfer-job references per page id - 1 */
    uint64_t mapped;      /* window pages expected mapped */
    uint32_t *vmaps;      /* pool view slots mapping each frame (frame id - 1) */
    uint32_t dup_handles; /* held frames whose handle another held frame has too */
};

static int fail(struct ck *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(struct ck *k, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    klog_error("invariant violated: %s", buf);
    if (k->why && k->len)
        snprintf(k->why, k->len, "%s", buf);
    return -EUCLEAN;
}

/* The driver maps handle h at va with read-write access. */
static int ck_mapped(struct ck *k, uint64_t va, vmm_handle h, const char *what)
{
    k->mapped++;
    if (!k->drv)
        return 0;
    struct vmm_debug_mapping m;
    if (vmm_debug_mapping(k->pg->v, va, &m))
        return fail(k, "%s at 0x%llx is not mapped", what, (unsigned long long)va);
    if (m.h.h != h.h || m.offset != 0)
        return fail(k, "%s at 0x%llx maps handle %llu+%zu, descriptor says %llu", what,
                    (unsigned long long)va, m.h.h, m.offset, h.h);
    if (m.access != KCU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        return fail(k, "%s at 0x%llx has access %d, not read-write", what,
                    (unsigned long long)va, m.access);
    return 0;
}

static int ck_unmapped(struct ck *k, uint64_t va, const char *what)
{
    if (k->drv && vmm_debug_mapping(k->pg->v, va, NULL) == 0)
        return fail(k, "%s at 0x%llx is mapped but nothing holds it", what,
                    (unsigned long long)va);
    return 0;
}

static int ck_page_ref(struct ck *k, pg_page_id id, uint64_t va, const char *what)
{
    struct paging *pg = k->pg;
    if (pg_page_is_none(id) || id.v > pg->p.max_pages)
        return fail(k, "%s at 0x%llx holds page id %u out of range", what,
                    (unsigned long long)va, id.v);
    struct pg_page *p = page_at(pg, id);
    if (p->tier == PG_TIER_NONE)
        return fail(k, "%s holds page %u whose descriptor is free", what, id.v);
    k->refs[id.v - 1]++;
    if (!va || !page_has_frame(p))
        return 0;
    return ck_mapped(k, va, page_handle(pg, id), what);
}

static bool defer_covers(struct paging *pg, uint32_t slot, uint32_t idx)
{
    for (struct pg_defer *d = pg->df.defer; d; d = d->next)
        if (d->slot == slot && idx >= d->first && idx < d->end)
            return true;
    return false;
}

static int ck_seq(struct ck *k, struct pg_seq *s)
{
    struct paging *pg = k->pg;
    uint32_t slot = pg_slot_of(pg, s);
    if (s->n_pages != pg_pages_for(pg, s->length))
        return fail(k, "slot %u: %u pages for %llu tokens", slot, s->n_pages,
                    (unsigned long long)s->length);
    if (s->n_pages + s->n_ahead > pg->pages_per_slot)
        return fail(k, "slot %u: pages + map-ahead past the slot", slot);
    if (s->n_pages > s->bt_cap || s->bt_cap > pg->pages_per_slot)
        return fail(k, "slot %u: %u pages in block tables of %u entries (slot: %u)", slot,
                    s->n_pages, s->bt_cap, pg->pages_per_slot);
    if (s->dropped && (s->length || s->cls != PG_SEQ_CACHED))
        return fail(k, "slot %u: dropped but holds %llu tokens (class %u)", slot,
                    (unsigned long long)s->length, s->cls);
    for (uint32_t r = 0; r < pg->p.n_regions; r++)
        if (s->kept[r] > s->length)
            return fail(k, "slot %u region %u: first_kept %llu past the length %llu", slot, r,
                        (unsigned long long)s->kept[r], (unsigned long long)s->length);
    /* A page that maps nothing (a hole, a non-resident sequence's) may lie in the range of
       a refill in flight (ahead_covers): the job was planned in this slot before the page
       came without a map (the fork of a non-resident sequence into a slot freed with a job
       in flight; its swap-in later, skipping holes), and only a map meets a job (map_run
       settles it first). The job's commit undoes it: mapped or not, both are right. */
    for (uint32_t r = 0; r < pg->p.n_regions; r++) {
        const pg_page_id *bt = pg_bt(pg, s, r);
        for (uint32_t i = 0; i < pg->pages_per_slot; i++) {
            uint64_t va = pg_va(pg, r, slot, i);
            /* the tables hold bt_cap entries (seq_bt_reserve): the rest are none */
            pg_page_id e = i < s->bt_cap ? bt[i] : PG_PAGE_NONE;
            int rc = 0;
            if (i < s->n_pages && pg_page_is_none(e)) {
                /* a hole (discard.c): the page began below first_kept, nothing mapped */
                if ((uint64_t)i * pg->p.page_size >= s->kept[r] * pg->p.bytes_per_token)
                    rc = fail(k, "slot %u region %u: hole at page %u at or past first_kept "
                              "%llu", slot, r, i, (unsigned long long)s->kept[r]);
                else if (!defer_covers(pg, slot, i) && !ahead_covers(pg, slot, i))
                    rc = ck_unmapped(k, va, "discarded page");
            } else if (i < s->n_pages && (uint64_t)(i + 1) * pg->p.page_size <=
                                             s->kept[r] * pg->p.bytes_per_token) {
                rc = fail(k, "slot %u region %u: page %u lies wholly before first_kept %llu "
                          "but is held", slot, r, i, (unsigned long long)s->kept[r]);
            } else if (i < s->n_pages && s->out) {
                rc = ck_page_ref(k, e, 0, "non-resident page");
                if (!rc)
                    k->offs[e.v - 1]++;
                if (!rc && !defer_covers(pg, slot, i) && !ahead_covers(pg, slot, i))
                    rc = ck_unmapped(k, va, "non-resident sequence's page");
            } else if (i < s->n_pages && page_at(pg, e)->tier == PG_TIER_HOST)
                rc = fail(k, "slot %u: resident sequence holds host page %u", slot, e.v);
            else if (i < s->n_pages)
                rc = ck_page_ref(k, e, va, "block-table page");
            else if (!pg_page_is_none(e))
                rc = fail(k, "slot %u region %u: entry %u past the end is %u", slot, r, i,
                          e.v);
            else if (i < s->n_pages + s->n_ahead) {
                pg_frame_id f = pg_ahead(pg, s, r)[i - s->n_pages];
                if (frame_at(pg, f)->state != FR_AHEAD)
                    rc = fail(k, "slot %u: map-ahead frame %u not in the ahead state", slot,
                              f.v);
                else
                    rc = ck_mapped(k, va, frame_at(pg, f)->h, "map-ahead frame");
            } else if (i == s->n_pages + s->n_ahead && !defer_covers(pg, slot, i) &&
                       !ahead_covers(pg, slot, i))
                rc = ck_unmapped(k, va, "page past the end");
            if (rc)
                return rc;
        }
    }
    return 0;
}

static int ck_defer(struct ck *k)
{
    struct paging *pg = k->pg;
    uint32_t n = 0, copies = 0;
    for (struct pg_defer *d = pg->df.defer; d; d = d->next, n++) {
        uint32_t w = d->end - d->first;
        copies += d->kind == DF_COPY;
        if (d->kind == DF_COPY) {
            /* a copy out (hold.c): its pages mapped at its block of the copy run */
            if (d->slot != PG_COPY_SLOT || d->first >= pg->p.copy_blocks ||
                d->n != pg->p.n_regions)
                return fail(k, "copy out of run block %u (slot %u) names %u pages", d->first,
                            d->slot, d->n);
            for (uint32_t r = 0; r < d->n; r++) {
                int rc = ck_page_ref(k, d->pages[r],
                                     pg_copy_va(pg, d->first) + (uint64_t)r * pg->p.page_size,
                                     "copy out");
                if (rc)
                    return rc;
            }
            continue;
        }
        if (d->kind == DF_IN) {
            for (uint32_t i = 0; i < d->n; i++) {
                if (pg_page_is_none(d->pages[i]))
                    return fail(k, "swap-in job of slot %u names a hole", d->slot);
                int rc = ck_page_ref(k, d->pages[i], 0, "swap-in job");
                if (rc)
                    return rc;
                k->jobs[d->pages[i].v - 1]++;
            }
            continue;
        }
        if (d->n != w * pg->p.n_regions)
            return fail(k, "pending entry of slot %u names %u pages for %u", d->slot, d->n,
                        w * pg->p.n_regions);
        for (uint32_t r = 0; r < pg->p.n_regions; r++)
            for (uint32_t i = 0; i < w; i++) {
                if (pg_page_is_none(d->pages[r * w + i]))
                    continue;           /* a hole, or a region a discard left alone */
                int rc = ck_page_ref(k, d->pages[r * w + i], pg_va(pg, r, d->slot, d->first + i),
                                     d->kind == DF_OUT ? "swap-out job" : "pending release");
                if (rc)
                    return rc;
                if (d->kind == DF_OUT)
                    k->jobs[d->pages[r * w + i].v - 1]++;
            }
    }
    if (n != pg->df.n_defer)
        return fail(k, "%u pending releases listed, %u counted", n, pg->df.n_defer);
    if (copies + pg->df.n_copy_free != pg->p.copy_blocks)
        return fail(k, "copy run: %u blocks copying + %u free, of %u", copies,
                    pg->df.n_copy_free, pg->p.copy_blocks);
    return 0;
}

struct ck_handle { uint64_t h; uint8_t ext; };

static int cmp_handle(const void *a, const void *b)
{
    uint64_t x = ((const struct ck_handle *)a)->h, y = ((const struct ck_handle *)b)->h;
    return x < y ? -1 : x > y;
}

/* Frames sharing a handle (a pool client's frame received held: paging/handoff.c): both
   shared-external, so none is written in place or reused while another maps the handle.
   Counts the duplicates into k->dup_handles (the driver holds that many fewer handles). */
static int ck_shared_handles(struct ck *k)
{
    struct paging *pg = k->pg;
    struct ck_handle *h = malloc((pg->fr.n_held ? pg->fr.n_held : 1) * sizeof *h);
    uint32_t n = 0;
    if (!h)
        return -ENOMEM;
    for (uint32_t i = 0; i < pg->fr.cap_frames && n < pg->fr.n_held; i++) {
        const struct pg_frame *f = &pg->fr.frames[i];
        if (f->state != FR_NONE)
            h[n++] = (struct ck_handle){ f->h.h, f->ext };
    }
    qsort(h, n, sizeof *h, cmp_handle);
    int rc = 0;
    k->dup_handles = 0;
    for (uint32_t i = 1; i < n && !rc; i++) {
        if (h[i].h != h[i - 1].h)
            continue;
        k->dup_handles++;
        if (!h[i - 1].ext || !h[i].ext)
            rc = fail(k, "handle %llx is held by two frames, one not shared-external",
                      (unsigned long long)h[i].h);
    }
    free(h);
    return rc;
}

static int ck_frames(struct ck *k)
{
    struct paging *pg = k->pg;
    uint32_t st[4] = { 0 }, walk = 0;
    if (pg->fr.n_held > pg->p.max_frames)
        return fail(k, "%u frames held, budget %u", pg->fr.n_held, pg->p.max_frames);
    for (uint32_t i = 0; i < pg->fr.cap_frames; i++)
        st[pg->fr.frames[i].state & 3]++;
    for (pg_frame_id f = pg->fr.ready_head; !pg_frame_is_none(f) && walk <= pg->fr.n_held;
         f = frame_at(pg, f)->next) {
        if (frame_at(pg, f)->state != FR_READY)
            return fail(k, "frame %u on the ready list is not ready", f.v);
        walk++;
    }
    if (st[FR_NONE] != pg->fr.cap_frames - pg->fr.n_held || st[FR_READY] != pg->fr.n_ready ||
        walk != pg->fr.n_ready || st[FR_AHEAD] != pg->fr.n_ahead || st[FR_USED] != pg->fr.n_used)
        return fail(k, "frame conservation: held %u = ready %u (counted %u, list %u) + "
                    "ahead %u (%u) + used %u (%u), %u unset of %u", pg->fr.n_held,
                    st[FR_READY], pg->fr.n_ready, walk, st[FR_AHEAD], pg->fr.n_ahead,
                    st[FR_USED], pg->fr.n_used, st[FR_NONE], pg->fr.cap_frames);
    return ck_shared_handles(k);
}

static int ck_pages(struct ck *k)
{
    struct paging *pg = k->pg;
    uint32_t live = 0, dev = 0, hostp = 0, heldp = 0, orph = 0;
    uint32_t slots[PG_N_LOWER] = { 0 }, io[PG_N_LOWER] = { 0 };   /* per tier below */
    for (uint32_t i = 0; i < pg->p.max_pages; i++) {
        struct pg_page *p = &pg->pd.pages[i];
        if (p->tier == PG_TIER_NONE)
            continue;
        live++;
        hostp += page_host_held(p);
        heldp += page_held_only_host(p);
        /* entries outside sequences (hold.c) hold references that map nothing; that they
           match the holders' own records is the holders' check (prefix_check) */
        k->refs[i] += p->ents;
        k->offs[i] += p->ents;
        orph += page_orphan(p);
        if (page_in_dio(p)) {
            /* a disk I/O in flight holds one reference and one job */
            k->refs[i]++;
            k->jobs[i]++;
        }
        /* the tiers below: the slots it holds, the transfer it is */
        for (unsigned t = 0; t < PG_N_LOWER; t++) {
            if (!(lower_slots(p->tier) >> t & 1u))
                continue;
            if (!lower_on(pg, t))
                return fail(k, "page %u (tier %u) holds a slot of absent tier %u below", i + 1,
                            p->tier, t);
            slots[t]++;
        }
        if (lower_moving(p->tier) >= 0)
            io[lower_moving(p->tier)]++;
        if (p->refs != k->refs[i])
            return fail(k, "page %u has refcount %u but %u holders", i + 1, p->refs,
                        k->refs[i]);
        if (p->offs != k->offs[i] || p->jobs != k->jobs[i])
            return fail(k, "page %u counts %u non-resident holders and %u jobs, found %u and %u",
                        i + 1, p->offs, p->jobs, k->offs[i], k->jobs[i]);
        if (lower_moving(p->tier) >= 0 && !p->jobs)
            return fail(k, "page %u is in flight (tier %u) but no transfer job holds it",
                        i + 1, p->tier);
        if (p->tier == PG_TIER_HOST && !pg_frame_is_none(p->frame))
            return fail(k, "host page %u still names frame %u", i + 1, p->frame.v);
        if (page_has_frame(p)) {
            dev++;
            if (pg_frame_is_none(p->frame) || p->frame.v > pg->fr.cap_frames ||
                frame_at(pg, p->frame)->state != FR_USED ||
                !pg_page_eq(frame_at(pg, p->frame)->page, (pg_page_id){ i + 1 }))
                return fail(k, "page %u names frame %u which does not hold it", i + 1,
                            p->frame.v);
        }
    }
    if (live != pg->pd.n_pages_live || dev != pg->fr.n_used)
        return fail(k, "%u live pages (counted %u), %u device pages for %u used frames", live,
                    pg->pd.n_pages_live, dev, pg->fr.n_used);
    if (hostp != pg->pd.n_host_pages || orph != pg->pd.n_orphans)
        return fail(k, "%u HOST pages (counted %u), %u orphans (counted %u)", hostp,
                    pg->pd.n_host_pages, orph, pg->pd.n_orphans);
    if (heldp != pg->pd.n_held_host)
        return fail(k, "%u HOST pages only holders keep (counted %u)", heldp,
                    pg->pd.n_held_host);
    for (unsigned t = 0; t < PG_N_LOWER; t++)
        if (slots[t] != pg->xf.lower[t].n_slots || io[t] != pg->xf.lower[t].n_io)
            return fail(k, "%u pages hold slots of tier %u below (counted %u), %u move "
                        "between it and the tier above (counted %u)", slots[t], t,
                        pg->xf.lower[t].n_slots, io[t], pg->xf.lower[t].n_io);
    return 0;
}

static int ck_slots(struct ck *k)
{
    struct paging *pg = k->pg;
    uint32_t live = 0, dying = 0, free_n = 0, out = 0;
    for (uint32_t i = 0; i < pg->p.max_seqs; i++) {
        struct pg_seq *s = &pg->seqs[i];
        live += s->live;
        out += s->out;
        if (s->out && !s->live)
            return fail(k, "slot %u is non-resident but not live", i);
        dying += s->dying;
        if (s->live || s->dying) {
            int rc = s->bt ? ck_seq(k, s) : fail(k, "slot %u in use without a block table", i);
            if (rc)
                return rc;
        } else if (!defer_covers(pg, i, 0) && !ahead_covers(pg, i, 0)) {
            /* a refill planned at page 0 (the sequence was empty) may still be in flight
               after its sequence was freed: its commit undoes it */
            int rc = ck_unmapped(k, paging_window(pg, 0, i), "free slot's first page");
            if (rc)
                return rc;
        }
    }
    for (uint32_t s = pg->sq.slot_free_head; s && free_n <= pg->p.max_seqs;
         s = pg->seqs[s - 1].next_free)
        free_n++;
    if (live != pg->sq.n_live || dying != pg->sq.n_dying ||
        live + dying + free_n != pg->p.max_seqs)
        return fail(k, "slots: %u live (%u), %u dying (%u), %u free, of %u", live, pg->sq.n_live,
                    dying, pg->sq.n_dying, free_n, pg->p.max_seqs);
    if (out != pg->sq.n_out)
        return fail(k, "%u non-resident sequences (counted %u)", out, pg->sq.n_out);
    return 0;
}

/* The block-table entries naming each id (pg_seq.bid): only a live resident sequence's
   blocks below its length hold ids. */
static int ck_view_holders(struct ck *k, uint32_t *cnt)
{
    struct paging *pg = k->pg;
    for (uint32_t i = 0; i < pg->p.max_seqs; i++) {
        struct pg_seq *s = &pg->seqs[i];
        if (!s->bid) {
            if (s->live)
                return fail(k, "slot %u is live without pool view ids", i);
            continue;
        }
        for (uint32_t b = 0; b < s->bt_cap; b++) {
            uint32_t id1 = s->bid[b];
            if (!id1)
                continue;
            if (!s->live || s->out || b >= s->n_pages || id1 > pg->view.n_ids)
                return fail(k, "slot %u block %u names pool view id %u (live %u, out %u, "
                            "%u blocks)", i, b, id1 - 1, s->live, s->out, s->n_pages);
            cnt[id1 - 1]++;
        }
    }
    return 0;
}

/* One id: its state against its holders and lists, each slot against the driver. */
static int ck_view_id(struct ck *k, uint32_t id, uint32_t holders)
{
    struct paging *pg = k->pg;
    const struct pg_vid *v = &pg->view.ids[id];
    uint32_t zombies = 0;
    if (v->state == VID_LIVE ? v->refs != holders || !holders : holders || v->refs)
        return fail(k, "pool view id %u (state %u) has refs %u, %u holders", id, v->state,
                    v->refs, holders);
    for (uint32_t r = 0; r < pg->p.n_regions; r++) {
        const struct pg_vslot *sl = &pg->view.slot[(size_t)id * pg->p.n_regions + r];
        uint64_t va = pg->view.base + ((uint64_t)r * pg->view.n_ids + id) * pg->p.page_size;
        int rc = 0;
        if (sl->st == VS_UNMAPPED) {
            rc = ck_unmapped(k, va, "an unmapped pool view slot");
        } else if (v->state == VID_FREE) {
            rc = fail(k, "free pool view id %u maps region %u", id, r);
        } else {
            const struct pg_frame *f = frame_at(pg, sl->f);
            /* the pool never releases a frame a slot maps (the driver would keep its
               memory, the budget counting it returned) */
            if (f->gen != sl->gen || f->state == FR_NONE)
                return fail(k, "pool view id %u maps in region %u frame %u, which the pool "
                            "released", id, r, sl->f.v);
            k->vmaps[sl->f.v - 1]++;
            zombies += sl->st == VS_ZOMBIE;
            rc = ck_mapped(k, va, sl->h, "pool view slot");
            if (!rc && v->state == VID_READY &&
                (f->state != FR_AHEAD || f->grp != id + 1 || f->gen != sl->gen))
                rc = fail(k, "prepared pool view group %u: frame %u of region %u is in state "
                          "%u, group %u", id, sl->f.v, r, f->state, f->grp);
        }
        if (!rc && v->state == VID_READY && sl->st != VS_MAPPED)
            rc = fail(k, "prepared pool view group %u does not map region %u", id, r);
        if (rc)
            return rc;
    }
    if (zombies != v->zombies)
        return fail(k, "pool view id %u has %u zombie slots, counted %u", id, zombies,
                    v->zombies);
    return 0;
}

/* The pool view (view.c): the ids' states, lists and holders, their mappings. */
static int ck_view(struct ck *k)
{
    struct paging *pg = k->pg;
    struct pg_view *w = &pg->view;
    if (!w->n_ids)
        return 0;
    uint32_t *cnt = calloc(w->n_ids, sizeof *cnt);
    k->vmaps = calloc(pg->fr.cap_frames ? pg->fr.cap_frames : 1, sizeof *k->vmaps);
    if (!cnt || !k->vmaps) {
        free(cnt);
        free(k->vmaps);
        return -ENOMEM;
    }
    uint32_t n_free = 0, n_dead = 0, live = 0, groups = 0;
    int rc = ck_view_holders(k, cnt);
    for (uint32_t id = w->ready_head; !rc && id && groups <= w->n_ids; id = w->ids[id - 1].next)
        groups += w->ids[id - 1].state == VID_READY ? 1 : w->n_ids + 1;
    for (uint32_t i = 0; !rc && i < pg->fr.cap_frames; i++) {
        uint32_t g = pg->fr.frames[i].grp;
        if (g && (g > w->n_ids || w->ids[g - 1].state != VID_READY))
            rc = fail(k, "frame %u belongs to pool view group %u, which is not prepared",
                      i + 1, g - 1);
    }
    for (uint32_t id = w->free_head; !rc && id && n_free <= w->n_ids; id = w->ids[id - 1].next)
        n_free += w->ids[id - 1].state == VID_FREE ? 1 : w->n_ids + 1;
    for (uint32_t id = w->dead_head; !rc && id && n_dead <= w->n_ids; id = w->ids[id - 1].next)
        n_dead += w->ids[id - 1].state == VID_DEAD ? 1 : w->n_ids + 1;
    for (uint32_t id = 0; !rc && id < w->n_ids; id++) {
        live += w->ids[id].state == VID_LIVE;
        rc = ck_view_id(k, id, cnt[id]);
    }
    if (!rc && (n_free != w->n_free || n_dead != w->n_dead || groups != w->n_groups ||
                n_free + n_dead + live + groups != w->n_ids))
        rc = fail(k, "pool view ids: %u free (%u), %u dead (%u), %u prepared (%u), %u live, "
                  "of %u", n_free, w->n_free, n_dead, w->n_dead, groups, w->n_groups, live,
                  w->n_ids);
    for (uint32_t i = 0; !rc && i < pg->fr.cap_frames; i++)
        if (k->vmaps[i] != pg->fr.frames[i].vmaps)
            rc = fail(k, "frame %u: %u pool view slots map it, counted %u", i + 1,
                      k->vmaps[i], pg->fr.frames[i].vmaps);
    free(k->vmaps);
    k->vmaps = NULL;
    free(cnt);
    return rc;
}

static int ck_driver(struct ck *k)
{
    struct paging *pg = k->pg;
    struct vmm_debug_objects c;
    if (!k->drv)
        return 0;
    for (uint32_t i = 0; i < PG_SCRATCH_PAGES; i++) {
        int rc = ck_unmapped(k, pg->scratch_va + i * pg->p.page_size, "scratch page");
        if (rc)
            return rc;
    }
    for (uint32_t i = 0; i < pg->df.n_copy_free; i++)     /* the copy run's free blocks */
        for (uint32_t r = 0; r < pg->p.n_regions; r++) {
            int rc = ck_unmapped(k, pg_copy_va(pg, pg->df.copy_free[i]) +
                                        (uint64_t)r * pg->p.page_size, "free copy run page");
            if (rc)
                return rc;
        }
    /* the frame pool thread may be creating or releasing handles right now (the feed:
       read under its mutex, a handle made or released is counted in transit there) */
    pthread_mutex_lock(&pg->fr.feed.mu);
    int crc = vmm_debug_objects(pg->v, &c);
    uint64_t lo = (uint64_t)pg->fr.n_held - k->dup_handles + pg->fr.feed.n_in;
    uint64_t hi = lo + pg->fr.feed.creating + pg->fr.feed.releasing;
    pthread_mutex_unlock(&pg->fr.feed.mu);
    if (crc)
        return fail(k, "vmm_debug_objects failed: %d", crc);
    if (c.handles < lo || c.handles > hi || c.handle_bytes != c.handles * pg->p.page_size)
        return fail(k, "the driver holds %llu handles (%llu bytes), the pool %llu..%llu",
                    (unsigned long long)c.handles, (unsigned long long)c.handle_bytes,
                    (unsigned long long)lo, (unsigned long long)hi);
    /* the frame pool thread's map-ahead refills in flight may have mapped some of theirs */
    if (c.mapped_bytes < k->mapped * pg->p.page_size ||
        c.mapped_bytes > (k->mapped + pg->ahq.pages) * pg->p.page_size)
        return fail(k, "the emulator has %llu bytes mapped, the block tables %llu pages",
                    (unsigned long long)c.mapped_bytes, (unsigned long long)k->mapped);
    return 0;
}

int paging_check(struct paging *pg, char *why, size_t len)
{
    struct vmm_debug_objects probe;
    struct ck k = { pg, why, len, vmm_debug_objects(pg->v, &probe) != -EOPNOTSUPP, NULL, NULL,
                    NULL, 0, NULL, 0 };
    size_t np = pg->p.max_pages ? pg->p.max_pages : 1;
    k.refs = calloc(3 * np, sizeof *k.refs);
    if (!k.refs)
        return -ENOMEM;
    k.offs = k.refs + np;
    k.jobs = k.offs + np;
    int rc = ck_frames(&k);
    if (!rc)
        rc = ck_slots(&k);
    if (!rc)
        rc = ck_defer(&k);
    if (!rc)
        rc = ck_pages(&k);
    if (!rc)
        rc = ck_view(&k);
    if (!rc)
        rc = ck_driver(&k);
    free(k.refs);
    if (!rc && why && len)
        why[0] = 0;
    return rc;
}
