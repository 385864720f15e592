/*
 * paging/window.c: a sequence's windows and their mappings: the window address of a slot's
 * region, mapping frames and pages into it (one vmm_map_run per contiguous run, i.e. one
 * set-access per run) and unmapping them, skipping holes; the _must forms for paths past
 * their point of no return. Layout: docs/design.md and paging/seq.c.
 */
#include "paging_int.h"
#include "ahead.h"
#include "window.h"

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
static int map_run(struct paging *pg, uint64_t va, const pg_frame_id *frames, uint32_t n)
{
    if (pg->ahq.busy)
        ahead_meet_va(pg, va, n);          /* the pool thread's refills own their ranges */
    vmm_handle hs[64] = { 0 };
    vmm_handle *h = n <= 64 ? hs : malloc(n * sizeof *h);
    if (!h)
        return -ENOMEM;
    for (uint32_t i = 0; i < n; i++)
        h[i] = frame_at(pg, frames[i])->h;
    pg_watch_map(pg, va, frames, n);        /* (window.h: watched frames) */
    int rc = vmm_map_run(pg->v, va, h, n, pg->p.page_size);
    if (h != hs)
        free(h);
    if (!rc)
        pg->c.maps += n;
    return rc;
}

/* PG_FRAME_NONE is a hole (a discarded page, discard.c): left unmapped, so each run of
   frames between holes is mapped on its own (one set-access per run). All or nothing. */
int win_map_frames(struct paging *pg, uint64_t va, const pg_frame_id *frames, uint32_t n)
{
    for (uint32_t i = 0, j; i < n; i = j) {
        if (pg_frame_is_none(frames[i])) {
            j = i + 1;
            continue;
        }
        for (j = i; j < n && !pg_frame_is_none(frames[j]); j++)
            ;
        int rc = map_run(pg, va + (uint64_t)i * pg->p.page_size, frames + i, j - i);
        if (rc) {
            win_unmap_frames_must(pg, va, frames, i);
            return rc;
        }
    }
    return 0;
}

int win_map_pages(struct paging *pg, uint32_t slot, uint32_t r, uint32_t first,
                  const pg_page_id *pages, uint32_t n)
{
    if (!n)
        return 0;
    pg_frame_id fs[64] = { 0 };
    pg_frame_id *f = n <= 64 ? fs : malloc(n * sizeof *f);
    if (!f)
        return -ENOMEM;
    for (uint32_t i = 0; i < n; i++)                            /* a hole stays a hole */
        f[i] = pg_page_is_none(pages[i]) ? PG_FRAME_NONE : page_at(pg, pages[i])->frame;
    int rc = win_map_frames(pg, pg_va(pg, r, slot, first), f, n);
    if (f != fs)
        free(f);
    return rc;
}

int win_unmap(struct paging *pg, uint64_t va, uint32_t n)
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
void win_unmap_must(struct paging *pg, uint64_t va, uint32_t n)
{
    if (win_unmap(pg, va, n) && win_unmap(pg, va, n))
        klog_error("paging: could not unmap %u pages at 0x%llx on an undo path", n,
                   (unsigned long long)va);
}

/* The runs of held entries: exactly one of ids (page ids) and fr (frame ids) is given
   (neither: nothing is held; the test also tells the static analyzer fr is not NULL). */
static bool held(const pg_page_id *ids, const pg_frame_id *fr, uint32_t i)
{
    return ids ? !pg_page_is_none(ids[i]) : fr && !pg_frame_is_none(fr[i]);
}

static int unmap_runs(struct paging *pg, uint64_t va, const pg_page_id *ids,
                      const pg_frame_id *fr, uint32_t n)
{
    bool first = true;
    for (uint32_t i = 0, j; i < n; i = j) {
        if (!held(ids, fr, i)) {
            j = i + 1;
            continue;
        }
        for (j = i; j < n && held(ids, fr, j); j++)
            ;
        uint64_t at = va + (uint64_t)i * pg->p.page_size;
        if (first) {
            int rc = win_unmap(pg, at, j - i);
            if (rc)
                return rc;
            first = false;
        } else {
            win_unmap_must(pg, at, j - i);
        }
    }
    return 0;
}

int win_unmap_holes(struct paging *pg, uint64_t va, const pg_page_id *ids, uint32_t n)
{
    return unmap_runs(pg, va, ids, NULL, n);
}

int win_unmap_frames(struct paging *pg, uint64_t va, const pg_frame_id *fr, uint32_t n)
{
    return unmap_runs(pg, va, NULL, fr, n);
}

static void unmap_runs_must(struct paging *pg, uint64_t va, const pg_page_id *ids,
                            const pg_frame_id *fr, uint32_t n)
{
    if (unmap_runs(pg, va, ids, fr, n) && unmap_runs(pg, va, ids, fr, n))
        klog_error("paging: could not unmap %u pages at 0x%llx on an undo path", n,
                   (unsigned long long)va);
}

void win_unmap_holes_must(struct paging *pg, uint64_t va, const pg_page_id *ids, uint32_t n)
{
    unmap_runs_must(pg, va, ids, NULL, n);
}

void win_unmap_frames_must(struct paging *pg, uint64_t va, const pg_frame_id *fr, uint32_t n)
{
    unmap_runs_must(pg, va, NULL, fr, n);
}
