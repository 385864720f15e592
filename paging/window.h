/*
 * paging/window.h: the owner window's functions for the rest of paging/ (window.c):
 * mapping frames and pages into a sequence's window and unmapping them, by runs, skipping
 * holes (the win_ prefix: the window owner's); and the watch's notes (inlines)
 * that the window's maps and the library's device writes make.
 */
#ifndef KVVM_PAGING_WINDOW_H
#define KVVM_PAGING_WINDOW_H

#include "paging_int.h"

/* window.c (win_*: the window owner's) */
int  win_map_pages(struct paging *pg, uint32_t slot, uint32_t r, uint32_t first,
                   const pg_page_id *pages, uint32_t n);
int  win_map_frames(struct paging *pg, uint64_t va, const pg_frame_id *frames, uint32_t n);
int  win_unmap(struct paging *pg, uint64_t va, uint32_t n);
void win_unmap_must(struct paging *pg, uint64_t va, uint32_t n);
/* Unmaps the pages at va + i * page_size for the i < n with ids[i] not PG_PAGE_NONE (holes
   are not mapped), one unmap per run. The first run's unmap may fail cleanly (returned,
   nothing unmapped); a later one is retried and logged (_must: every failure is). The
   _frames variants do the same over frame ids (PG_FRAME_NONE: a hole). */
int  win_unmap_holes(struct paging *pg, uint64_t va, const pg_page_id *ids, uint32_t n);
void win_unmap_holes_must(struct paging *pg, uint64_t va, const pg_page_id *ids, uint32_t n);
int  win_unmap_frames(struct paging *pg, uint64_t va, const pg_frame_id *fr, uint32_t n);
void win_unmap_frames_must(struct paging *pg, uint64_t va, const pg_frame_id *fr, uint32_t n);

/* The watch (park.c's part, struct pg_watch): the window's maps and the library's device
   writes note it. */
/* A library write into device memory [va, va + len) is about to be enqueued (a copy to
   the device, a memset): a watched frame mapped there is dirty. */
static inline void pg_wrote(struct paging *pg, uint64_t va, uint64_t len)
{
    struct pg_watch *w = &pg->wt;
    uint64_t ps = pg->p.page_size;
    for (uint32_t j = 0; j < w->n; j++)
        if (w->va[j] && w->va[j] < va + len && va < w->va[j] + ps)
            w->dirty[j] = 1;
}
/* Frames f[0..n) are being mapped at va (window.c): watched ones note the address. */
static inline void pg_watch_map(struct paging *pg, uint64_t va, const pg_frame_id *f,
                                uint32_t n)
{
    struct pg_watch *w = &pg->wt;
    for (uint32_t i = 0; w->n && i < n; i++)
        for (uint32_t j = 0; j < w->n; j++)
            if (pg_frame_eq(w->f[j], f[i]))
                w->va[j] = va + (uint64_t)i * pg->p.page_size;
}

#endif
