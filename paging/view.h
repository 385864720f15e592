/*
 * paging/view.h: view.c's functions (owner clock) for the rest of paging/: the pool view.
 * Its part of struct paging (struct pg_view, pg->view) is in pg_types.h.
 */
#ifndef KVVM_PAGING_VIEW_H
#define KVVM_PAGING_VIEW_H

#include "paging_int.h"

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
/* Prepares groups ahead (context lock held; off the grow path: the frame pool thread's
   round, paging_feed_begin / paging_feed_end, a step, create): n_regions ready frames each,
   mapped at a free id, so a grow taking one gives its new block an id already mapped. Best
   effort (stops at the first refusal, leaving nothing half done); a no-op without a pool
   view. */
void paging_view_prepare(struct paging *pg);
void view_break_all(struct paging *pg);

#endif
