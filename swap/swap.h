/*
 * swap/swap.h: device reclaim policy (docs/design.md "Pressure and thresholds").
 *
 * Contract:
 *  - swap/ decides *which* sequences leave the device; paging/ moves them (paging_swap_out,
 *    paging_reclaim_orphans). Victims: first orphan pages (device pages no resident sequence
 *    maps), then unprotected resident sequences in least-recently-used order (paging's use
 *    clock). Protected sequences (used since the last step) are never moved.
 *  - Direct reclaim (swap_reclaim_direct): a caller short of frames; all or nothing: when the
 *    movable frames cannot cover the shortfall, -ENOMEM and nothing moved. It waits for the
 *    copies it started (the frames are free when it returns) and is timed into the stats.
 *  - Watermarks on the free device frames (fractions of the budget): swap_after_call wakes
 *    the background thread below `low` (it works until `high` is free, then sleeps: the
 *    hysteresis), and below `min` reclaims synchronously up to `low` itself.
 *  - The background thread (only with KVVM_F_AUTO_SWAP and a host tier) makes the device
 *    context current once, takes the context lock (the `lock` given at create) for each
 *    round of decisions, and waits for its copies with the lock dropped.
 *  - Host marks (only with a disk tier, paging_has_disk): free host slots below host `min`
 *    make the call start writes itself (up to `low`, not waiting for them); below `low` they
 *    wake the spill thread, which writes the least recently used host pages to disk until
 *    host `high` slots are free (or the disk is full), waiting for its writes with the
 *    context lock dropped; it never blocks a caller on disk I/O. A round that started
 *    nothing makes it idle until the next step. Direct reclaim makes its host room itself
 *    (swap_host_room, waiting for the writes: the caller needs those slots).
 *  - The host tier's choices are swap/'s too (room.c, swap_int.h): which host pages spill
 *    (least recently used first, the same LRU order as the device victims), how hard a
 *    caller short of host slots spills, direct vs staged swaps. swap_create installs them
 *    in paging (paging_set_policy), swap_destroy removes them.
 *  - Lock order: context lock -> swap's own mutex (sw->mu). Every function here except
 *    swap_create, swap_destroy and swap_wait_idle is called with the context lock held;
 *    those three are called without it.
 */
#ifndef KVVM_SWAP_SWAP_H
#define KVVM_SWAP_SWAP_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "paging/paging.h"
#include "vmm/vmm.h"

struct swap_params {
    uint32_t frames;               /* device budget in frames */
    double   min, low, high;       /* free fractions */
    bool     auto_swap;            /* KVVM_F_AUTO_SWAP */
    bool     thread;               /* start the background reclaim thread */
    uint32_t host_slots;           /* host tier size in slots */
    double   host_min, host_low, host_high;   /* free fractions of the host tier */
    bool     disk;                 /* a disk tier exists: start the spill thread */
    bool     cache_demote;         /* KVVM_F_CACHE_DEMOTE */
};

struct swap_counters {
    uint64_t reclaim_runs;         /* background rounds that moved something */
    uint64_t reclaim_swap_outs;    /* sequences moved by background rounds */
    uint64_t direct_reclaims;      /* direct reclaims that moved something */
    uint64_t direct_swap_outs;     /* sequences moved by direct reclaim */
    uint64_t direct_ns;            /* time spent in direct reclaim */
    uint64_t spill_runs;           /* spill thread rounds that started writes */
};

struct swap;

/* -ENOMEM, -EAGAIN (thread creation), -EIO. */
int  swap_create(struct paging *pg, struct vmm *v, pthread_mutex_t *lock,
                 const struct swap_params *p, struct swap **out);
/* Stops and joins the thread. Without the context lock. NULL is a no-op. */
void swap_destroy(struct swap *sw);

/* Makes `want` device frames free by moving victims not named in excl. 0: they are free;
   -ENOMEM: not enough can move (nothing moved); -EIO. */
int  swap_reclaim_direct(struct swap *sw, uint32_t want, const uint64_t *excl, size_t n_excl);
/* Classes (paging.h, "sequence classes"): every reclaim above drops unprotected CACHED
   sequences (least recently used first; with KVVM_F_CACHE_DEMOTE and room below, demotes
   them) before it swaps out any LIVE one, and never moves PINNED ones.
   swap_cached_frees: the frames dropping every droppable CACHED sequence not in excl would
   free (for an all-or-nothing check first). swap_drop_cached: drops (may_swap: or demotes)
   CACHED sequences not in excl until `want` frames are free, waiting for their releases;
   without KVVM_F_AUTO_SWAP too (a drop moves no data). All or nothing: -ENOMEM and nothing
   dropped when dropping every one could not make `want` free; -EIO. */
uint32_t swap_cached_frees(struct swap *sw, const uint64_t *excl, size_t n_excl);
int  swap_drop_cached(struct swap *sw, uint32_t want, const uint64_t *excl, size_t n_excl,
                      bool may_swap);
/* kvvm_set_budget's shrink: makes `want` frames free as swap_reclaim_direct does (same
   victims, order, all-or-nothing check), whether or not KVVM_F_AUTO_SWAP is set. 0, -ENOMEM
   (nothing moved), -EIO. */
int  swap_reclaim_budget(struct swap *sw, uint32_t want);
/* The budget is now `frames`: the device watermarks follow it. */
void swap_set_frames(struct swap *sw, uint32_t frames);
/* After a call that took frames: the watermark rules above. */
void swap_after_call(struct swap *sw);
/* At each step (protections ended: a round that found nothing may find something now). */
void swap_after_step(struct swap *sw);
/* Waits until no background round runs or is requested. Without the context lock. */
void swap_wait_idle(struct swap *sw);
void swap_counters(struct swap *sw, struct swap_counters *out);

#endif
