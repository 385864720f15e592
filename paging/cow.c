/*
 * paging/cow.c: copy-on-write, prepare_write, write and read.
 *
 * Copying the shared pages P of a range for writer W, in batches of up to PG_SCRATCH_PAGES
 * pages (runs of consecutive pages of a region):
 *   map fresh frames F at the scratch run (one mapped run: one set-access); copy each run
 *   va -> scratch on the engine stream (one copy per run, after the engine's earlier
 *   writes: stream order, or a device sync in synchronous mode); wait once for the engine's
 *   work (the copies and everything before them that may read W's mapping); unmap the
 *   scratch run, then per run unmap va and map F there (one unmap, one mapped run). Only
 *   W's window changes; the other holders keep P. One page takes the driver calls it took
 *   before; n pages in r runs take 2n maps, 1 + r set-accesses, r copies, one wait and
 *   1 + r unmaps, where page by page they took n of each (2n set-accesses and unmaps).
 * Mappings cannot be stream-ordered, hence the wait before the remaps (docs/api.md
 * "Ordering").
 */
#include "paging_int.h"
#include "frames.h"
#include "seqs.h"
#include "ahead.h"
#include "clock.h"
#include "window.h"

#include <errno.h>
#include <stdlib.h>
#include "common/log.h"

uint32_t cow_needed(struct paging *pg, struct pg_seq *s, uint32_t r0, uint32_t r1,
                    uint32_t i0, uint32_t i1)
{
    uint32_t n = 0;
    for (uint32_t r = r0; r < r1; r++) {
        const pg_page_id *bt = pg_bt(pg, s, r);
        for (uint32_t i = i0; i < i1 && i < s->n_pages; i++)
            n += pg_page_is_none(bt[i]) ||                  /* a hole: a new page */
                 page_sharers(page_at(pg, bt[i])) > 1;
    }
    return n;
}

/* One run of a batch: n consecutive shared pages of region r from page idx, copied into
   the batch's frames [off, off + n) (mapped at the scratch run from page off). */
struct cow_run {
    uint32_t r, idx, n, off;
};

/* Replaces the mappings of run c (n pages at va) by frames fr, as one unmap and one mapped
   run. On failure va maps the old pages again. */
static int remap_run(struct paging *pg, struct pg_seq *s, const struct cow_run *c,
                     const pg_frame_id *fr)
{
    uint32_t slot = pg_slot_of(pg, s);
    uint64_t va = pg_va(pg, c->r, slot, c->idx);
    int rc = win_unmap(pg, va, c->n);
    if (rc)
        return rc;
    rc = win_map_frames(pg, va, fr, c->n);
    if (rc && win_map_pages(pg, slot, c->r, c->idx, pg_bt(pg, s, c->r) + c->idx, c->n))
        klog_error("paging: could not restore a mapping after a failed remap");
    return rc;
}

/* The new pages of run c (frames fr, remapped) replace the old ones in the block table. */
static void run_commit(struct paging *pg, struct pg_seq *s, const struct cow_run *c,
                       const pg_frame_id *fr, struct cow_undo *u)
{
    pg_page_id *bt = pg_bt(pg, s, c->r);
    for (uint32_t k = 0; k < c->n; k++) {
        pg_page_id old = bt[c->idx + k];
        bt[c->idx + k] = page_new(pg, fr[k]);
        page_put(pg, old);
        u->rec[u->n++] = (struct cow_rec){ c->r, c->idx + k, old };
        pg->c.cow_copies++;
    }
}

/* Copies the runs into frames f (n pages, mapped at the scratch run for the copies): one
   copy per run, one wait for the engine, then each run remapped. Mappings cannot be
   stream-ordered, hence the wait before the remaps (docs/api.md "Ordering"). On failure the
   runs already remapped stay (recorded in u, for the caller's undo) and the frames of the
   others go back to the pool. */
static int cow_batch(struct paging *pg, struct pg_seq *s, const struct cow_run *runs,
                     uint32_t n_runs, const pg_frame_id *f, uint32_t n, struct cow_undo *u)
{
    uint64_t ps = pg->p.page_size;
    uint32_t slot = pg_slot_of(pg, s), j;
    int rc = win_map_frames(pg, pg->scratch_va, f, n);
    if (rc)
        return rc;
    pg_wrote(pg, pg->scratch_va, (uint64_t)n * ps);   /* (watched frames) */
    rc = pg_order_before_copy(pg);
    for (j = 0; !rc && j < n_runs; j++)
        rc = vmm_copy_dtod(pg->v, pg->scratch_va + runs[j].off * ps,
                           pg_va(pg, runs[j].r, slot, runs[j].idx), runs[j].n * ps,
                           pg->ck.stream);
    int wrc = pg_wait_engine(pg);
    if (wrc)
        (void)pg_wait_engine(pg);   /* a copy may still be queued: never unmap under it */
    if (!rc)
        rc = wrc;
    win_unmap_must(pg, pg->scratch_va, n);
    for (j = 0; !rc && j < n_runs; j++) {
        rc = remap_run(pg, s, &runs[j], f + runs[j].off);
        if (!rc)
            run_commit(pg, s, &runs[j], f + runs[j].off, u);
    }
    return rc;
}

static int undo_reserve(struct cow_undo *u, uint32_t more)
{
    if (u->n + more <= u->cap)
        return 0;
    uint32_t cap = u->cap ? 2 * u->cap : 8;
    while (cap < u->n + more)
        cap *= 2;
    struct cow_rec *n = realloc(u->rec, cap * sizeof *n);
    if (!n)
        return -ENOMEM;
    u->rec = n;
    u->cap = cap;
    return 0;
}

/* The next batch of the range from (*r, *i): runs of consecutive shared pages, at most
   PG_SCRATCH_PAGES pages in all (a run is cut there); advances the cursor. Returns the
   pages; *n_runs the runs. (A hole is filled by grow, never copied.) */
static uint32_t next_batch(struct paging *pg, struct pg_seq *s, uint32_t *r, uint32_t *i,
                           uint32_t r1, uint32_t i0, uint32_t i1, struct cow_run *runs,
                           uint32_t *n_runs)
{
    uint32_t n = 0, end = i1 < s->n_pages ? i1 : s->n_pages;
    *n_runs = 0;
    for (; *r < r1; (*r)++, *i = i0) {
        const pg_page_id *bt = pg_bt(pg, s, *r);
        for (; *i < end; (*i)++) {
            if (n == PG_SCRATCH_PAGES)
                return n;
            if (pg_page_is_none(bt[*i]) || page_sharers(page_at(pg, bt[*i])) <= 1)
                continue;
            struct cow_run *c = *n_runs ? &runs[*n_runs - 1] : NULL;
            if (c && c->r == *r && c->idx + c->n == *i)
                c->n++;
            else
                runs[(*n_runs)++] = (struct cow_run){ *r, *i, 1, n };
            n++;
        }
    }
    return n;
}

/* One batch: frames for its n pages, then cow_batch; the unused frames back on failure. */
static int cow_chunk(struct paging *pg, struct pg_seq *s, const struct cow_run *runs,
                     uint32_t n_runs, uint32_t n, struct cow_undo *u)
{
    pg_frame_id f[PG_SCRATCH_PAGES];
    uint32_t done = u->n;
    int rc = undo_reserve(u, n);
    if (!rc)
        rc = pool_take_except(pg, n, f, s);
    if (rc)
        return rc;
    rc = cow_batch(pg, s, runs, n_runs, f, n, u);
    if (rc)
        pool_give(pg, f + (u->n - done), n - (u->n - done));  /* runs commit in order */
    return rc;
}

int cow_range(struct paging *pg, struct pg_seq *s, uint32_t r0, uint32_t r1, uint32_t i0,
              uint32_t i1, struct cow_undo *u)
{
    uint32_t start = u->n, r = r0, i = i0, n, n_runs;
    struct cow_run runs[PG_SCRATCH_PAGES];
    while ((n = next_batch(pg, s, &r, &i, r1, i0, i1, runs, &n_runs)) != 0) {
        int rc = cow_chunk(pg, s, runs, n_runs, n, u);
        if (rc) {
            struct cow_undo part = { u->n - start, 0, u->rec + start };
            cow_undo(pg, s, &part);
            u->n = start;
            return rc;
        }
    }
    return 0;
}

void cow_undo(struct paging *pg, struct pg_seq *s, struct cow_undo *u)
{
    uint32_t slot = pg_slot_of(pg, s);
    while (u->n) {
        struct cow_rec *c = &u->rec[--u->n];
        pg_page_id *e = &pg_bt(pg, s, c->r)[c->idx];
        uint64_t va = pg_va(pg, c->r, slot, c->idx);
        /* the new page was written by nobody but this call: no fence needed */
        if (win_unmap(pg, va, 1) == 0 || win_unmap(pg, va, 1) == 0) {
            pg_frame_id of = page_at(pg, c->old_page)->frame;
            if (win_map_frames(pg, va, &of, 1))
                klog_error("paging: copy-on-write undo could not remap slot %u", slot);
        }
        page_put(pg, *e);
        page_get(pg, c->old_page);
        *e = c->old_page;
    }
}

void cow_commit(struct paging *pg, struct cow_undo *u)
{
    (void)pg;
    free(u->rec);
    u->rec = NULL;
    u->n = u->cap = 0;
}

/* Checks the pool can supply the copies of regions [r0, r1) x pages [i0, i1) of s. */
static int cow_check(struct paging *pg, struct pg_seq *s, uint32_t r0, uint32_t r1,
                     uint32_t i0, uint32_t i1)
{
    uint32_t need = cow_needed(pg, s, r0, r1, i0, i1);
    if (!need)
        return 0;
    ahead_yield(pg, s, 0, need);    /* s's own map-ahead counts as free (need_write) */
    if (pool_available(pg) - s->n_ahead * pg->p.n_regions < need && pg->df.defer) {
        int rc = defer_reap(pg, true);
        if (rc)
            return rc;
    }
    return pool_available(pg) - s->n_ahead * pg->p.n_regions < need ? pg_why_frames(pg, need)
                                                                     : 0;
}

/* COWs regions [r0, r1) x pages [i0, i1) of s, checking the pool first. */
static int cow_call(struct paging *pg, struct pg_seq *s, uint32_t r0, uint32_t r1,
                    uint32_t i0, uint32_t i1)
{
    int rc = cow_check(pg, s, r0, r1, i0, i1);
    if (rc)
        return rc;
    struct cow_undo u = { 0 };
    uint32_t mark = pg->fr.n_created;
    rc = cow_range(pg, s, r0, r1, i0, i1, &u);
    cow_commit(pg, &u);
    if (rc)
        pool_rollback(pg, mark);
    return rc;
}

int paging_seq_prepare_write(struct paging *pg, uint64_t h, uint64_t first, uint64_t end)
{
    struct pg_seq *s;
    int rc = seq_lookup(pg, h, &s);
    if (rc)
        return rc;
    if (first >= end || end > s->length)
        return -EINVAL;
    for (uint32_t r = 0; r < pg->p.n_regions; r++)
        if (first < s->kept[r])
            return -EINVAL;     /* discarded tokens (discard.c) */
    if (s->out)
        return -EBUSY;          /* the context swaps it in first */
    rc = defer_settle(pg, s);
    if (rc)
        return rc;
    uint64_t bpt = pg->p.bytes_per_token, ps = pg->p.page_size;
    rc = cow_call(pg, s, 0, pg->p.n_regions, (uint32_t)(first * bpt / ps),
                  (uint32_t)((end * bpt + ps - 1) / ps));
    if (!rc)
        seq_use(pg, s);
    return rc;
}

/* Checks a byte range of one region of s. */
static int io_check(struct paging *pg, uint64_t h, uint32_t region, uint64_t off,
                    const void *buf, size_t len, struct pg_seq **s)
{
    int rc = seq_lookup(pg, h, s);
    if (rc)
        return rc;
    if ((*s)->dropped)
        return -ESTALE;
    uint64_t bytes = (*s)->length * pg->p.bytes_per_token;
    if (!buf || region >= pg->p.n_regions || !len || off >= bytes || len > bytes - off)
        return -EINVAL;
    if (off < (*s)->kept[region] * pg->p.bytes_per_token)
        return -EINVAL;         /* discarded tokens (discard.c) */
    if ((*s)->out)
        return -EBUSY;          /* the context swaps it in first */
    return defer_settle(pg, *s);
}

/* The end of a copy between the device and a caller's host buffer. Synchronous mode: the
   copy is done. Stream mode: a pinned buffer (cuMemAllocHost, cuMemHostRegister) is read or
   filled when the engine stream reaches the copy, the CPU does not wait; for any other
   (pageable) buffer the driver promises neither staging at the call nor a filled
   destination at return ("for transfers between device memory and pageable host memory,
   the function might be synchronous with respect to host": CUDA Driver API, "API
   synchronization behavior"), so the engine stream is synchronized up to the copy. */
static int host_copy_done(struct paging *pg, const void *buf, size_t len)
{
    if (!pg->ck.stream)
        return pg_finish_copy(pg);
    int pinned = vmm_host_pinned(pg->v, buf, len);
    if (pinned < 0)
        return pinned;
    return pinned ? 0 : pg_finish_copy(pg);
}

int paging_seq_write(struct paging *pg, uint64_t h, uint32_t region, uint64_t offset,
                     const void *src, size_t len)
{
    struct pg_seq *s;
    int rc = io_check(pg, h, region, offset, src, len, &s);
    if (rc)
        return rc;
    uint64_t ps = pg->p.page_size;
    uint32_t i0 = (uint32_t)(offset / ps), i1 = (uint32_t)((offset + len + ps - 1) / ps);
    rc = cow_check(pg, s, region, region + 1, i0, i1);
    if (rc)
        return rc;
    struct cow_undo u = { 0 };
    uint32_t mark = pg->fr.n_created;
    rc = cow_range(pg, s, region, region + 1, i0, i1, &u);
    if (!rc)
        rc = pg_order_before_copy_seq(pg, s, region, i0, i1);
    if (!rc) {
        uint64_t va = paging_window(pg, region, pg_slot_of(pg, s)) + offset;
        pg_wrote(pg, va, len);   /* (window.h: watched frames) */
        rc = vmm_copy_htod(pg->v, va, src, len, pg->ck.stream);
        if (!rc && (rc = host_copy_done(pg, src, len)) != 0)
            (void)pg_wait_engine(pg);   /* the copy may still be queued: never undo under it */
    }
    if (rc) {
        /* the copies made for this write hold nothing else: drop them, keep the old pages */
        cow_undo(pg, s, &u);
        pool_rollback(pg, mark);
    } else {
        seq_use(pg, s);
    }
    cow_commit(pg, &u);
    return rc;
}

int paging_seq_read(struct paging *pg, uint64_t h, uint32_t region, uint64_t offset,
                    void *dst, size_t len)
{
    struct pg_seq *s;
    int rc = io_check(pg, h, region, offset, dst, len, &s);
    if (!rc) {
        uint64_t ps = pg->p.page_size;
        rc = pg_order_before_copy_seq(pg, s, region, (uint32_t)(offset / ps),
                                      (uint32_t)((offset + len + ps - 1) / ps));
    }
    if (rc)
        return rc;
    seq_use(pg, s);
    uint64_t va = paging_window(pg, region, pg_slot_of(pg, s)) + offset;
    rc = vmm_copy_dtoh(pg->v, dst, va, len, pg->ck.stream);
    return rc ? rc : host_copy_done(pg, dst, len);
}
