/*
 * paging/view.h: the pool view's structures (struct pg_view, a part of struct paging owned
 * by view.c, owner clock) and view.c's functions for the rest of paging/. Included by
 * paging_int.h only.
 */
#ifndef KVVM_PAGING_VIEW_H
#define KVVM_PAGING_VIEW_H

#include <stdbool.h>
#include <stdint.h>
#include "paging.h"

struct pg_seq;

/* The pool view (view.c). Block id i of region r is at view.base + (r * n_ids + i) *
   page_size. An id is a tuple of frames, one per region (a hole: none), mapped at its place
   in each region's view; sequences name ids in pg_seq.bid, shared by forks. An id whose
   last holder lets go is DEAD: its mappings stay until no device work may use it (its
   death's epoch is quiet, or a synchronization came after it), then it is unmapped and FREE.
   A slot of a LIVE id whose region its only holder discarded is a zombie: mapped, waiting
   for the same condition. A READY id is a prepared group: n_regions frames taken off the
   ready list (FR_AHEAD: free for accounting, stolen back when the pool runs short), mapped
   ahead at its slots off the grow path, so a grow that takes it gives its new block an id
   whose mappings exist. */
enum { VID_FREE = 0, VID_LIVE, VID_DEAD, VID_READY };
enum { VS_UNMAPPED = 0, VS_MAPPED, VS_ZOMBIE };
struct pg_vid {
    uint32_t refs;         /* LIVE: pg_seq.bid entries naming it */
    uint8_t  state;        /* VID_* */
    uint8_t  in_zq;        /* on view.zq (it had zombie slots) */
    uint8_t  used;         /* a block table handed it out (device work may use it: a dead
                              id that never was is unmapped without waiting) */
    uint32_t zombies;      /* VS_ZOMBIE slots */
    uint32_t next;         /* FREE / DEAD / READY list: next id + 1 (0: end) */
    uint64_t dead_epoch;   /* DEAD (or the latest zombie): pg->epoch then */
    uint64_t dead_sync;    /*   and pg->ck.n_syncs then */
};
struct pg_vslot {
    vmm_handle  h;         /* mapped handle (VS_MAPPED, VS_ZOMBIE) */
    pg_frame_id f;         /* its frame then, */
    uint32_t    gen;       /*   and that frame's generation */
    uint8_t     st;        /* VS_* */
};
struct pg_view {
    uint32_t n_ids;        /* 0: no pool view */
    uint64_t base;
    struct pg_vid *ids;    /* n_ids */
    struct pg_vslot *slot; /* n_ids * n_regions, id-major */
    uint32_t free_head;    /* id + 1 */
    uint32_t dead_head;    /* id + 1 */
    uint32_t ready_head;   /* prepared groups (READY), id + 1 */
    uint32_t n_free, n_dead, n_groups;
    uint32_t want;         /* groups to keep prepared */
    uint32_t *zq, n_zq;    /* ids with zombie slots (n_ids entries) */
};

/* view.c (no-ops without a pool view) */
int  view_init(struct paging *pg);
/* After the device is synchronized: unmaps every view slot, frees the tables. */
void view_fini(struct paging *pg);
/* s's block-table entries [first, end) of region (UINT32_MAX: every region) are released
   (the block-table entries are cleared by the caller): the ids of blocks left with no page
   in any region are let go; a block keeping pages in other regions keeps its id, whose slot
   of that region is unmapped when no device work may use it (when s alone holds the id).
   Never fails. */
void view_release(struct paging *pg, struct pg_seq *s, uint32_t region, uint32_t first,
                  uint32_t end);
/* child (resident, fresh) shares parent's ids of blocks [0, n). */
void view_fork(struct paging *pg, struct pg_seq *child, struct pg_seq *parent, uint32_t n);
/* The slots of live ids that still map a frame back in the pool (a copy-on-write, or a
   discard by every holder, changed the block's frames; the id is replaced at the holder's
   next block table) become zombies, for view_reap: the release paths (trim, budget) call it
   so that such a frame can go back to the driver. Never fails. */
void view_end_stale(struct paging *pg);
/* Unmaps the dead ids and zombie slots no device work may use any more (wait: synchronizes
   the engine stream, or the device, first when there are some). -EIO only for a failed
   synchronization; a refused unmap leaves the id for the next reap. */
int  view_reap(struct paging *pg, bool wait);
/* Takes up to n prepared groups for new blocks [0, n) of a grow: region r's frame of group
   i goes to fresh[r * stride + i] (FR_USED), its id to gids[i]. Returns how many. */
uint32_t view_take_groups(struct paging *pg, uint32_t n, pg_frame_id *fresh, uint32_t stride,
                          uint32_t *gids);
/* After the grow: blocks [first, first + n) of s take ids gids[0..n) (ok), or the grow
   failed and the ids die unused (their frames are the grow's undo's). */
void view_end_groups(struct paging *pg, struct pg_seq *s, uint32_t first, const uint32_t *gids,
                     uint32_t n, bool ok);
/* Breaks one prepared group: its frames go back to the ready list. -ENOMEM none. */
int  view_break_group(struct paging *pg);
void view_break_all(struct paging *pg);

#endif
