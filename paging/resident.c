/*
 * paging/resident.c: the residency queries (contract in paging.h): whether a sequence is
 * resident and ready, what making it resident and growing it needs (frames, the stage facts
 * of its pages below the device), the candidates of reclaim (the three lists, excluded and
 * filtered in one operation: paging_candidates), and the counts the policy
 * reads (orphans, free frames and host slots, frames pending), and a reclaim plan's start
 * (paging_plan_have: the caller's sequences checked and the frames it has; paging_plan_begin:
 * the keep set's facts and the room in one look, then the plan's marks and the keep set). They move nothing (some reap completed work first; the need functions
 * note a shortfall for paging_why).
 */
#include "paging_int.h"
#include "seqs.h"
#include "transfers.h"
#include "clock.h"

#include <errno.h>
#include <stdlib.h>

int paging_seq_ready(struct paging *pg, uint64_t h)
{
    struct pg_seq *s;
    int rc = seq_lookup(pg, h, &s);
    if (rc)
        return rc;
    if (s->out)
        return 0;
    if ((rc = paging_reap(pg)))
        return rc;
    bool any_in = false;
    for (struct pg_defer *d = pg->df.defer; d; d = d->next)
        if (d->kind == DF_IN) {
            if (d->slot == pg_slot_of(pg, s))
                return 0;
            any_in = true;
        }
    /* a page is TO_DEVICE only while a swap-in job holds it (host_in.c sets it with the job,
       the job's completion ends it): with none in flight, s is ready without a walk */
    if (!any_in) {
#ifdef KVVM_DEBUG
        for (struct pg_bt_iter it = bt_all(pg, s); bt_next(&it);)
            KVVM_ASSERT(page_at(pg, it.id)->tier != PG_TIER_TO_DEVICE);
#endif
        return 1;
    }
    /* pages another's swap-in still brings in, held without a job of s's own (a fork of a
       sequence whose prefetch is still copying) */
    for (struct pg_bt_iter it = bt_all(pg, s); bt_next(&it);)
        if (page_at(pg, it.id)->tier == PG_TIER_TO_DEVICE)
            return 0;
    return 1;
}

/* Whether non-resident s holds pages on disk or with disk I/O in flight (read back first). */
static bool resident_on_disk(struct paging *pg, struct pg_seq *s)
{
    if (!s->out)
        return false;
    for (struct pg_bt_iter it = bt_all(pg, s); bt_next(&it);)
        if (page_at(pg, it.id)->tier == PG_TIER_DISK || page_in_dio(page_at(pg, it.id)))
            return true;
    return false;
}

int paging_seq_stage_facts(struct paging *pg, uint64_t h, bool *disk, bool *borrow)
{
    struct pg_seq *s;
    int rc = seq_lookup(pg, h, &s);
    *disk = *borrow = false;
    if (rc)
        return rc;
    *disk = resident_on_disk(pg, s);
    *borrow = *disk && tier_stage_must_borrow(pg, s);
    return 0;
}

int paging_plan_have(struct paging *pg, const uint64_t *excl, size_t n, uint32_t *have)
{
    for (size_t i = 0; i < n; i++) {
        int rc = paging_seq_stale(pg, excl[i]);    /* the caller's own: no room for a stale */
        if (rc)
            return rc;
    }
    *have = paging_frames_free(pg) + paging_frames_pending(pg);
    return 0;
}

void paging_plan_begin(struct paging *pg, const uint64_t *keep, size_t n_keep,
                       struct pg_plan_start *out)
{
    *out = (struct pg_plan_start){ 0 };
    out->keep_dev = n_keep ? paging_device_pages_of(pg, keep, n_keep) : 0;
    for (size_t i = 0; i < n_keep; i++) {
        bool d, b;
        if (paging_seq_resident(pg, keep[i]) || paging_seq_stage_facts(pg, keep[i], &d, &b))
            continue;
        out->keep_out = true;
        out->keep_disk |= d;
        out->keep_borrow |= b;
    }
    paging_disk_keep(pg, keep, n_keep);
    paging_room_facts(pg, &out->room);
    out->disk = paging_has_disk(pg);
    out->orphans = plan_marks_begin(pg, keep, n_keep);
}

int paging_reclaim_cover(struct paging *pg, uint32_t want, const uint64_t *keep,
                         size_t n_keep, uint32_t keep_dev)
{
    uint32_t kd = n_keep ? paging_device_pages_of(pg, keep, n_keep) : 0;
    want += keep_dev > kd ? keep_dev - kd : 0;
    uint32_t fr = paging_frames_free(pg), o = 0;
    if (fr < want && paging_orphans(pg)) {
        int rc = paging_reclaim_orphans(pg, want - fr, keep, n_keep, &o);
        if (rc && rc != -ENOMEM)
            return rc;                  /* (-ENOMEM, the host tier full: said below) */
    }
    return paging_frames_free(pg) < want ? -ENOMEM : 0;
}

static int need_grow(struct paging *pg, uint64_t h, uint64_t length, uint32_t *frames)
{
    struct pg_seq *s;
    int rc = seq_lookup(pg, h, &s);
    if (rc)
        return rc;
    if (length > pg->p.max_tokens)
        return pg_why_length(pg, length);
    uint32_t n = 0, nr = pg->p.n_regions;
    if (s->out)
        for (struct pg_bt_iter it = bt_all(pg, s); bt_next(&it);) {
            uint8_t t = page_at(pg, it.id)->tier;
            n += t != PG_TIER_DEVICE && t != PG_TIER_TO_DEVICE;
        }
    if (resident_on_disk(pg, s) && tier_stage_must_borrow(pg, s))
        n++;                            /* the frame a borrowed staging slot waits in */
    if (length > s->length) {
        uint32_t np = (uint32_t)pg_pages_for(pg, length);
        /* every new page takes a frame, its own map-ahead ones included: those count as
           free in paging_frames_free already (subtracting them here counted them twice) */
        n += (np - s->n_pages) * nr;
        if ((s->length * pg->p.bytes_per_token) % pg->p.page_size)
            n += cow_needed(pg, s, 0, nr, s->n_pages - 1, s->n_pages);
    }
    *frames = n;
    if (n > paging_frames_free(pg))
        pg_why_frames(pg, n);           /* the shortfall a refusal will name */
    return 0;
}

static int need_write(struct paging *pg, uint64_t h, uint32_t r0, uint32_t r1, uint64_t b0,
                      uint64_t b1, uint32_t *frames)
{
    struct pg_seq *s;
    int rc = need_grow(pg, h, 0, frames);
    if (rc || seq_lookup(pg, h, &s))
        return rc;
    uint64_t ps = pg->p.page_size;
    if (b0 < b1)
        *frames += cow_needed(pg, s, r0, r1, (uint32_t)(b0 / ps), (uint32_t)((b1 + ps - 1) / ps));
    return 0;
}

static int need_batch(struct paging *pg, const uint64_t *hs, const uint64_t *lengths, size_t n,
                      uint64_t *frames)
{
    uint8_t *seen = calloc(pg->p.max_pages ? pg->p.max_pages : 1, 1);
    struct pg_seq **ss = calloc(n ? n : 1, sizeof *ss);
    uint64_t k = 0, grow = 0;
    bool borrow = false;
    int rc = seen && ss ? 0 : -ENOMEM;
    for (size_t j = 0; j < n && !rc; j++) {
        if ((rc = seq_lookup(pg, hs[j], &ss[j])))
            break;
        struct pg_seq *s = ss[j];
        if (lengths[j] > pg->p.max_tokens) {
            rc = pg_why_length(pg, lengths[j]);
            break;
        }
        for (struct pg_bt_iter it = bt_all(pg, s); s->out && bt_next(&it);) {
            uint8_t t = page_at(pg, it.id)->tier;
            if (t != PG_TIER_DEVICE && t != PG_TIER_TO_DEVICE && !seen[it.id.v - 1])
                k++;                    /* a page shared in the batch comes back once */
            seen[it.id.v - 1] = 1;
        }
        /* the frame a borrowed staging slot waits in (paging_need's count): the members
           come in one after another, each gives it back */
        borrow |= resident_on_disk(pg, s) && tier_stage_must_borrow(pg, s);
    }
    k += borrow;
    /* the growth as paging_seq_grow_batch counts it: new pages, the holes and shared
       copies of the partial last pages (a page shared by members copied for all but one) */
    if (!rc)
        rc = seq_batch_frames(pg, ss, lengths, n, &grow);
    free(seen);
    free(ss);
    if (!rc)
        *frames = k + grow;
    if (!rc && k + grow > paging_frames_free(pg))
        pg_why_frames(pg, k + grow);    /* the shortfall a refusal will name */
    return rc;
}

bool paging_seq_resident(struct paging *pg, uint64_t h)
{
    struct pg_seq *s;
    return seq_lookup(pg, h, &s) == 0 && !s->out;
}

static size_t resident_candidates(struct paging *pg, struct pg_cand *out, size_t max)
{
    size_t n = 0;
    for (uint32_t i = 0; i < pg->p.max_seqs && n < max; i++) {
        struct pg_seq *s = &pg->seqs[i];
        if (!s->live || s->out || s->n_defer || s->in_job ||
            (s->used_valid && s->used_epoch >= pg->epoch))
            continue;
        /* A sequence whose device pages are all shared frees nothing alone, but does with
           its siblings (paging_plan_add); one with none is no candidate. (Map-ahead
           frames count as free already.) The walk stops at the first device page (the
           first one, but for holes and pages another's swap-in still brings in): what a
           victim frees is asked for only while the policy walks its order. */
        bool dev = false;
        for (struct pg_bt_iter it = bt_all(pg, s); !dev && bt_next(&it);)
            dev = page_at(pg, it.id)->tier == PG_TIER_DEVICE;
        if (dev)
            out[n++] = (struct pg_cand){ seq_handle(pg, s), s->used_tick, 0, s->cls };
    }
    return n;
}

int paging_need(struct paging *pg, const struct pg_need *q, uint64_t *frames)
{
    uint32_t f = 0;
    int rc;
    switch (q->of) {
    case PG_NEED_BATCH:
        return need_batch(pg, q->hs, q->lengths, q->n, frames);
    case PG_NEED_WRITE:
        rc = need_write(pg, q->h, q->r0, q->r1, q->b0, q->b1, &f);
        break;
    case PG_NEED_SHARE:
        rc = paging_need_share(pg, q->h, q->src, q->length, &f);
        break;
    default:
        rc = need_grow(pg, q->h, q->length, &f);
        break;
    }
    *frames = f;
    return rc;
}

int paging_seq_swap_out(struct paging *pg, uint64_t h, uint32_t *moved)
{
    *moved = 0;
    if (!paging_seq_resident(pg, h) && !paging_seq_stale(pg, h))
        return paging_seq_orphans_down(pg, h, moved);   /* out already: what it left */
    return paging_swap_out(pg, h, false);
}

static bool cand_excluded(uint64_t h, const uint64_t *excl, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (excl[i] == h)
            return true;
    return false;
}

/* The list into an array doubled until it holds it all, then the filters, in the order swap/
   applied them (a quiet check, which asks a fence, only for those the others leave). */
size_t paging_candidates(struct paging *pg, const struct pg_cand_q *q, struct pg_cand **out)
{
    size_t (*fn)(struct paging *, struct pg_cand *, size_t) =
        q->of == PG_CAND_CACHED ? paging_cached_candidates
        : q->of == PG_CAND_DISK ? paging_disk_candidates
                                : resident_candidates;
    size_t max = 256, n, k = 0;
    struct pg_cand *c = NULL;
    for (;;) {
        struct pg_cand *nc = realloc(c, max * sizeof *c);
        if (!nc) {
            free(c);
            *out = NULL;
            return 0;
        }
        c = nc;
        n = fn(pg, c, max);
        if (n < max)
            break;
        max *= 2;
    }
    for (size_t i = 0; i < n; i++)
        if (!cand_excluded(c[i].h, q->excl, q->n_excl) &&
            (!q->live || c[i].cls == PG_SEQ_LIVE) &&
            (!q->quiet || paging_seq_quiet(pg, c[i].h)))
            c[k++] = c[i];
    *out = c;
    return k;
}

uint32_t paging_frames_pending(const struct paging *pg)
{
    uint32_t n = 0;
    for (const struct pg_defer *d = pg->df.defer; d; d = d->next)
        if (d->kind == DF_OUT)
            for (uint32_t i = 0; i < d->n; i++)
                n += !pg_page_is_none(d->pages[i]) &&
                     pg->pd.pages[d->pages[i].v - 1].tier == PG_TIER_TO_HOST;
    return n;
}

uint32_t paging_orphans(const struct paging *pg)
{
    return tier_orphans(pg);
}

uint32_t paging_frames_free(const struct paging *pg)
{
    return pg->p.max_frames - pg->fr.n_used;
}
