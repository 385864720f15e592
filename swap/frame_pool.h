/*
 * swap/frame_pool.h: the frame pool thread (docs/design.md "Ordering and fences": create
 * physical handles off the hot path) and its marks.
 *
 * Contract:
 *  - Policy only: when and how many frames to create ahead or give back to the driver.
 *    paging/ (its feed, paging.h) does the creating, releasing and handing over.
 *  - Marks, in frames: when a call leaves fewer than `low` frames ready in the pool, or at
 *    each step, the thread runs a round: it creates frames until `high` are ready (within the
 *    budget, never while kvvm_trim's suppression lasts) and releases to the driver the ready
 *    frames above `high` that no call needed since the previous round (a frame freed just
 *    before a burst of takes is reused, not released and created again). It calls cuMemCreate / cuMemRelease without the context lock,
 *    which it takes only to plan a round and to put delivered frames in the pool.
 *  - Each round also maps the map-ahead refills grows queued (paging/ahead.c:
 *    taken by paging_feed_begin or paging_feed_end under the context lock, mapped by
 *    paging_ahead_work without it,
 *    paging_ahead_commit under it).
 *  - The thread makes the device context current once and sets relaxed stream capture mode
 *    for itself (like the reclaim thread); it never touches a stream.
 *  - The marks follow the budget (frames_set_budget); 0 in the params = automatic:
 *    low = max(2 * n_regions, budget / 16), high = max(2 * low, budget / 8), both <= budget.
 *  - Lock order: context lock -> fr->mu -> paging's feed mutex. frames_create,
 *    frames_destroy and frames_wait_idle are called without the context lock, the others
 *    with it.
 */
#ifndef KVVM_SWAP_FRAME_POOL_H
#define KVVM_SWAP_FRAME_POOL_H

#include <pthread.h>
#include <stdint.h>
#include "paging/paging.h"
#include "vmm/vmm.h"
#include "worker.h"

struct frames_params {
    uint32_t budget;          /* device budget in frames */
    uint32_t n_regions;
    uint32_t low, high;       /* configured marks in frames; 0 = automatic */
    uint32_t decay_ms;        /* ready frames above high unused this long are released;
                                 0: at the next round (rounds run on request only) */
};

struct frames_counters {
    uint64_t rounds;          /* rounds that created or released something */
    uint64_t wakes;           /* requests for a round (a call short of frames, a step) */
    uint64_t created, released;
    uint64_t ahead_rounds;    /* rounds that mapped sequences' map-ahead refills */
};

struct frames;

/* Starts the thread, attaches it to the pool and waits for its first fill (so a context
   starts with its reserve). -ENOMEM, -EAGAIN (thread creation). */
int  frames_create(struct paging *pg, struct vmm *v, pthread_mutex_t *lock,
                   const struct frames_params *p, struct frames **out);
/* Stops and joins the thread, detaches it from the pool. NULL is a no-op. No lock held. */
void frames_destroy(struct frames *fr);
/* The budget changed: the marks follow; a round refills (context lock held). */
void frames_set_budget(struct frames *fr, uint32_t budget);
/* At each step (context lock held): a round when the pool is below the high mark, or when
   decay_ms = 0. NULL is a no-op. */
void frames_after_step(struct frames *fr);
/* Waits until no round runs or is requested. No lock held. NULL is a no-op. */
void frames_wait_idle(struct frames *fr);
void frames_marks(const struct frames *fr, uint32_t *low, uint32_t *high);
void frames_counters(struct frames *fr, struct frames_counters *out);

#endif
