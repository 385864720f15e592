/*
 * paging/ahead.h: ahead.c's functions (owner seqs) for the rest of paging/: map-ahead
 * refilled by the frame pool thread. Its part of struct paging (struct pg_ahq, pg->ahq) is
 * in pg_types.h. The pool (pool.c) and the window mappings (window.c), owners below, reach
 * it through the hooks pg->fr.ahead_cancel and pg->fr.ahead_meet_va.
 */
#ifndef KVVM_PAGING_AHEAD_H
#define KVVM_PAGING_AHEAD_H

#include "paging_int.h"

/* How many frames per region s's map-ahead lacks: 0 while at least half of map_ahead is
   left, else what brings it back up to map_ahead (both marks shrink with its slot's room). */
uint32_t seq_ahead_deficit(const struct paging *pg, const struct pg_seq *s);
/* At a grow's end: queues s for the thread's refill, or tops it up here without one or
   when the grow outran s's map-ahead. */
void seq_ahead_refill(struct paging *pg, struct pg_seq *s, bool outran);
/* Waits for the jobs in flight, then commits (keep) or undoes them all. No-op when none. */
void ahead_settle(struct paging *pg, bool keep);
/* ahead_settle(pg, false): the pool's hook (pg->fr.ahead_cancel). */
void ahead_cancel(struct paging *pg);
/* ahead_settle(keep) when a job in flight is s's. */
void ahead_settle_slot(struct paging *pg, const struct pg_seq *s);
/* Before mapping n pages at window address va: undoes the jobs when one's range meets it. */
void ahead_meet_va(struct paging *pg, uint64_t va, uint32_t n);
/* Whether page i of slot's window lies in a job in flight (mapped or not: the checker). */
bool ahead_covers(const struct paging *pg, uint32_t slot, uint32_t i);
void ahead_fini(struct paging *pg);

#endif
