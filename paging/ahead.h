/*
 * paging/ahead.h: map-ahead refilled by the frame pool thread (ahead.c, owner seqs): its
 * part of struct paging (struct pg_ahq, pg->ahq) and ahead.c's functions for the rest of
 * paging/. The pool (pool.c) and the window mappings (window.c), owners below, reach it
 * through the hooks pg->fr.ahead_cancel and pg->fr.ahead_meet_va. Included by paging_int.h
 * only.
 */
#ifndef KVVM_PAGING_AHEAD_H
#define KVVM_PAGING_AHEAD_H

#include <stdbool.h>
#include <stdint.h>
#include "paging.h"

struct pg_seq;

/* The frame pool thread's map-ahead refills (ahead.c). A job: frames f[first + r * k + i]
   (handles alike) mapped, or being mapped, at page at + i of region r's window of slot. */
struct pg_ahead_job {
    uint32_t slot, gen;        /* the sequence planned for */
    uint32_t at, k;            /* its n_pages + n_ahead then; frames per region */
    uint32_t first;            /* its frames' offset in the round's f[] and h[] */
    uint32_t mapped;           /* regions [0, mapped) mapped (the work's; read when done) */
};
struct pg_ahq {
    uint32_t *slot, *gen;      /* queued sequences, n_q of them (max_seqs entries) */
    uint8_t  *queued;          /* per slot: in the queue */
    uint32_t n_q;
    struct pg_ahead_job *jobs; /* the round's, n_jobs of them */
    uint32_t n_jobs;
    uint32_t pages;            /* frames the jobs hold (the checker's slack on mappings) */
    pg_frame_id *f;            /* the round's frames and their handles */
    vmm_handle *h;
    bool busy;                 /* jobs planned and not committed or undone */
    bool done;                 /* [under feed.mu] their work finished */
};

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
