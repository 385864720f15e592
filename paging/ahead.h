/*
 * paging/ahead.h: ahead.c's functions (owner frames) for the rest of paging/: map-ahead,
 * the frames mapped past a sequence's end (FR_AHEAD, free for accounting), on the caller's
 * thread (drops, steals, top-ups) and refilled by the frame pool thread. Map-ahead frames
 * are the frames owner's: the pool (pool.c) takes them back, the swap-outs drop them and
 * the window's mappings settle the refills in flight by calling these directly. Its part
 * of struct paging (struct pg_ahq, pg->ahq) is in pg_types.h.
 */
#ifndef KVVM_PAGING_AHEAD_H
#define KVVM_PAGING_AHEAD_H

#include "paging_int.h"

/* Map-ahead on the caller's thread (a sequence's frames mapped past its end, FR_AHEAD). */
/* Unmaps map-ahead frames beyond the first `keep` (per region); they become ready. */
void ahead_drop(struct paging *pg, struct pg_seq *s, uint32_t keep);
/* s's map-ahead counts as free (paging_frames_free and the need functions count it) but
   pool_take_except(s) cannot take it: when the pool without it cannot supply n frames,
   gives back s's map-ahead frames beyond the first keep per region (ahead_drop). */
void ahead_yield(struct paging *pg, struct pg_seq *s, uint32_t keep, uint32_t n);
/* Steals one layer (n_regions frames) of map-ahead from some sequence other than `except`
   (else the pool thread's refills in flight, else a prepared pool view group); the frames
   go to the ready list. -ENOMEM none. */
int  ahead_steal(struct paging *pg, struct pg_seq *except);
/* Unmaps every sequence's map-ahead and breaks the pool view's prepared groups. */
void ahead_drop_all(struct paging *pg);
/* Maps ready frames ahead of s's end on the caller's thread, in batches between two marks
   (ahead_deficit). Best effort. */
void ahead_top_up(struct paging *pg, struct pg_seq *s);

/* Map-ahead refilled by the frame pool thread. */
/* How many frames per region s's map-ahead lacks: 0 while at least half of map_ahead is
   left, else what brings it back up to map_ahead (both marks shrink with its slot's room). */
uint32_t ahead_deficit(const struct paging *pg, const struct pg_seq *s);
/* At a grow's end: queues s for the thread's refill, or tops it up here without one or
   when the grow outran s's map-ahead. */
void ahead_refill(struct paging *pg, struct pg_seq *s, bool outran);
/* Waits for the jobs in flight, then commits (keep) or undoes them all. No-op when none. */
void ahead_settle(struct paging *pg, bool keep);
/* ahead_settle(keep) when a job in flight is s's. */
void ahead_settle_slot(struct paging *pg, const struct pg_seq *s);
/* Before mapping n pages at window address va: undoes the jobs when one's range meets it. */
void ahead_meet_va(struct paging *pg, uint64_t va, uint32_t n);
/* Whether page i of slot's window lies in a job in flight (mapped or not: the checker). */
bool ahead_covers(const struct paging *pg, uint32_t slot, uint32_t i);
void ahead_fini(struct paging *pg);
/* The thread's round (paging_feed_begin / paging_feed_end, paging.c), context lock held:
   takes the ready frames of the queued sequences' refills into jobs (true: some), which
   paging_ahead_work then maps and paging_ahead_commit gives to their sequences. */
bool paging_ahead_plan(struct paging *pg);

#endif
