/*
 * swap/swap.h: device reclaim policy (docs/design.md "Pressure and thresholds").
 *
 * Contract:
 *  - swap/ decides *which* sequences leave the device and how; paging/ counts what each move
 *    frees and takes (paging_plan_add) and moves them (paging_reclaim_drop, paging_reclaim_move,
 *    paging_reclaim_orphans); core/ only says how many frames a call needs
 *    and which sequences are its own. Victims: droppable CACHED sequences, then orphan pages
 *    (device pages no resident sequence maps), then unprotected LIVE sequences, each in
 *    least-recently-used order (paging's use clock). Protected sequences (used since the
 *    last step) and PINNED ones are never moved.
 *  - Direct reclaim (swap_make_room): a caller short of frames; plan, check, then act (below,
 *    "reclaim plans"): when the victims cannot cover the shortfall, -ENOMEM and nothing
 *    moved. It waits for the copies it started (the frames are free when it returns) and is
 *    timed into the stats.
 *  - Watermarks on the free device frames (fractions of the budget): swap_after_call wakes
 *    the background thread below `low` (it works until `high` is free, then sleeps: the
 *    hysteresis), and below `min` reclaims synchronously up to `low` itself.
 *  - The background thread (only with KVVM_F_AUTO_SWAP and a host tier) makes the device
 *    context current once, takes the context lock (the `lock` given at create) for each
 *    round of decisions, and waits for its copies with the lock dropped.
 *  - Host marks (only with a disk tier, paging_has_disk): free host slots below host `min`
 *    make the call start writes itself (up to `low`, not waiting for them); below `low` they
 *    wake the spill thread, which writes host pages to disk (the prefix cache's entries
 *    first, swap_cache_ops.spill, then the least recently used sequences') until
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
#include "common/hist.h"
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

/* ---- reclaim plans (plan.c): plan, check, then act ----
 * Every reclaim is one plan, computed whole and checked before anything moves: a call short
 * of frames (swap_make_room), the budget shrink (swap_reclaim_budget), the min watermark and
 * the background thread (a partial plan). The caller (core/) says only how many frames it
 * needs free and which sequences are its own (excl: never victims, and their pages never
 * count as freed: a non-resident one's device pages are pages it maps again); it has
 * checked its arguments and staleness first, and counted its frames with paging's need
 * functions (swap-ins, new pages, copy-on-write copies, shared partial last pages).
 * A plan lists the victims in plan order, each with its kind and the frames it
 * frees and the host/disk slots it takes, counted by paging (paging_plan_add) given the moves
 * before it: droppable CACHED sequences first (least recently used first; drops, or with
 * KVVM_F_CACHE_DEMOTE demotions in the room the swap-outs leave), then orphan pages, then
 * LIVE sequences (SWAP_PLAN_SWAP only), never PINNED, protected or excluded ones. Room below
 * is counted per victim with all the pages it copies down: a victim that does not fit is
 * skipped, and so is one after whose move the caller's own swap-in would have to borrow a
 * host slot to stage through that its need did not count (the caller's host pages never
 * spill meanwhile: paging_disk_keep, set while planning and acting); when the room fills before the shortfall is covered the plan is made again without
 * the least recently used victim taken. Acting moves them in the order the room model used
 * the room below: drops, orphans, swap-outs, then demotions (each kind in plan order). */
enum swap_step_kind { SWAP_DROP = 0, SWAP_DEMOTE, SWAP_OUT };
struct swap_step {
    uint64_t h;
    uint8_t  kind;                 /* enum swap_step_kind */
    uint32_t frees;                /* device frames it returns (given the steps before it) */
    uint32_t slots;                /* host/disk slots it takes (a demotion: at most) */
};
#define SWAP_PLAN_SWAP    1u       /* LIVE swap-outs, orphan moves, demotions allowed */
#define SWAP_PLAN_PARTIAL 2u       /* best effort (the background thread): what fits */
#define SWAP_PLAN_QUIET   4u       /* only quiet victims (paging_candidates' quiet): moving them
                                      synchronizes nothing (the thread, synchronous mode) */
struct swap_rplan {
    uint32_t want;                 /* device frames to be free (or coming) */
    uint32_t have;                 /* free and coming when planned */
    uint32_t frees, slots;         /* the steps' and orphans' totals */
    uint32_t orphans;              /* orphan pages moved (after the CACHED steps) */
    uint64_t room;                 /* slots below left unused by the plan */
    unsigned flags;
    struct swap_step *steps;       /* malloc'ed, in the order they are acted on */
    size_t n, cap;                 /* steps, room for them (reserved before paging counts) */
    uint64_t *keep;                /* excl, copied */
    size_t n_keep;
    uint32_t keep_dev;             /* the kept sequences' device pages when planned */
    uint32_t cache;                /* frames the cache's planned entry drops free (counted in
                                      frees; drops acted on right after the CACHED drops,
                                      demotions after the CACHED demotions) */
    uint32_t cache_slots;          /* slots below its planned demotions take */
    const struct swap_cache_ops *cache_ops;   /* whose plan that is (forgotten at free) */
};
/* Holders of device pages above swap/ that reclaim drops like CACHED sequences: the prefix
   cache (prefix/), which installs itself with swap_set_cache. Every plan asks it after the
   droppable CACHED sequences, before orphans and LIVE sequences. plan: counts dropping its
   reclaimable entries with a page on the device, in its own order, on paging's plan marks
   (paging_plan_pages) until `want` frames are counted or none is left; returns the frames
   counted and keeps that plan (one at a time; a new plan replaces it). demote
   (KVVM_F_CACHE_DEMOTE, a plan that may swap): turns planned drops into demotions while
   take(ctx, k) grants the k slots below an entry's device pages take, in plan order; returns
   the slots granted. act: drops the planned drops (their frames free at once), or (demotions)
   copies the planned demotions' pages down, dropping one whose move is refused. forget: the
   plan is not acted on (its marks die with the walk). spill (NULL: none): starts writing up to
   max of the host pages only its entries hold to the disk tier, in its own order, and returns
   how many started; every spill of the host tier (room.c swap_spill: a caller short of host
   slots, a plan's moves, the host marks, the spill thread) asks it before any sequence's
   pages, so those pages count as spillable in the room facts (paging_room_facts) and plans.
   host_drop (NULL: none): host room when no disk room takes a spill (room.c swap_host_room):
   counts (act false) the host slots that dropping its entries whose pages are all below the
   device (host or disk) frees, in its own order, until `want` are counted, never a pending
   plan's demotions; act true drops exactly those. Returns the slots counted (dropped). stash
   (a call's reclaim, instead of act false): moves each planned drop whose device pages the
   host tier's free slots take as they are, within *room (the room the plan left, taken), down
   there and keeps it until stash_end, drops the others now; returns those dropped now.
   stash_end: the call ended, commit: the stashed are dropped; else they come back to the
   device (returns how many could not). */
struct swap_cache_ops {
    void *arg;
    uint32_t (*plan)(void *arg, uint32_t want);
    uint32_t (*demote)(void *arg, bool (*take)(void *ctx, uint32_t k), void *ctx);
    void (*act)(void *arg, bool demotions);
    void (*forget)(void *arg);
    uint32_t (*spill)(void *arg, uint32_t max);
    uint32_t (*host_drop)(void *arg, uint32_t want, bool act);
    uint32_t (*stash)(void *arg, uint64_t *room);
    uint32_t (*stash_end)(void *arg, bool commit);
};
/* Installs ops (copied; NULL: none). */
void swap_set_cache(struct swap *sw, const struct swap_cache_ops *ops);
/* Plans making `want` frames free (flags above) without changing anything. 0: a plan (no
   steps when they are free already; short of want only with SWAP_PLAN_PARTIAL); -ENOMEM not
   enough can move; -ESTALE / -ENOENT a sequence of excl is a dropped CACHED one / no
   sequence (checked first). On error there is no plan to free. Context lock held; no other
   call in between. */
int  swap_reclaim_plan(struct swap *sw, uint32_t want, const uint64_t *excl, size_t n_excl,
                       unsigned flags, struct swap_rplan *out);
/* Acts on plan p (right after swap_reclaim_plan, context lock held throughout); *moved the
   sequences moved (orphans as one). wait: block until the frames are free (the copies and
   releases completed), else leave the copies in flight (the background thread waits
   without the lock). 0, -EIO; -ENOMEM only if the plan proved wrong (logged by none: a
   plan is exact). */
int  swap_reclaim_act(struct swap *sw, const struct swap_rplan *p, bool wait, uint32_t *moved);
void swap_rplan_free(struct swap_rplan *p);
/* Direct reclaim for a call: makes `want` device frames free by a plan not moving excl
   (LIVE swap-outs only with KVVM_F_AUTO_SWAP; drops always: a drop moves no data), waits for
   the copies, timed into the stats. 0: they are free; -ENOMEM: not enough can move (nothing
   moved); -EIO. */
int  swap_make_room(struct swap *sw, uint32_t want, const uint64_t *excl, size_t n_excl);
/* kvvm_prefix_attach's room made ahead (core/prefix_calls.c): while its store reads are in
   flight, after the first block proved a hit, up to `want` device frames free for dst's
   premap by the moves that move no data only: the plan's drops (droppable CACHED sequences,
   then the prefix cache's entries no sequence holds, in swap_reclaim_plan's order; never a
   LIVE swap-out, an orphan move, a demotion, nor anything protected, PINNED or excl), as
   many as cover it (SWAP_PLAN_PARTIAL: fewer when they do not), waiting for their releases.
   Not journalled: the call's locked part that takes the frames runs in a frame (enter ..
   leave) of its own after the reads, and other calls run in between, so these drops are
   made at once, as a cache replacement for blocks the store confirmed; the caller marks
   them lost in its locked part (swap_call_lost), which then fails -EIO as a call whose own
   reclaim dropped what no undo takes back. *dropped: the frames the drops free (0: none
   made). 0 (perhaps short of want), -ENOMEM (the driver refused a frame or fence: nothing
   moved), -EIO. */
int  swap_make_room_ahead(struct swap *sw, uint32_t want, const uint64_t *excl, size_t n_excl,
                          uint32_t *dropped);
/* swap_make_room for a pool client whose daemon limit is below its budget (want counts the
   frames above the limit too): the same plan, but no frame is made ready before the moves
   (a lease past the limit is refused); the frames they free are the call's. */
int  swap_make_room_free(struct swap *sw, uint32_t want, const uint64_t *excl, size_t n_excl);
/* kvvm_set_budget's shrink: makes `want` frames free as swap_make_room does (the same
   plan), whether or not KVVM_F_AUTO_SWAP is set. 0, -ENOMEM (nothing moved), -EIO. */
int  swap_reclaim_budget(struct swap *sw, uint32_t want);
/* A pool client giving frames back to the daemon (a take-back, a limit below what it
   holds): makes up to `want` frames free by a partial plan (whatever can move: droppable
   CACHED sequences and the prefix cache's entries first, then, live true, orphans and LIVE
   swap-outs; never protected or PINNED ones), waits for the copies; counted as a background
   round. *moved: sequences moved. 0 (perhaps short of want), -EIO. Not a call's reclaim:
   nothing is journalled. */
int  swap_reclaim_give(struct swap *sw, uint32_t want, bool live, uint32_t *moved);
/* The end of a public call (core/call.h, context lock held): a call that failed (rc < 0)
   after its reclaims moved others takes those moves back, so a failed call changes nothing
   (docs/api.md): every sequence a reclaim swapped out or demoted for it is swapped in
   again (its bytes came back from the host or disk tier) and gets its use stamp back. The
   journal is emptied either way. Returns rc, or -EIO (logged, the reason kept for
   kvvm_last_error) when a move could not be taken back: a swap-in the driver refused, or a
   move no undo takes back (a drop; never made while a call's reclaim can fail after it,
   see swap_make_room). The context stays consistent either way: a victim not swapped back
   in is a complete swapped-out sequence. */
int  swap_call_end(struct swap *sw, int rc);
/* The start of a public call (core/call.h enter, context lock held): what the call's moves
   drop that no undo takes back (entries dropped for a move's host room) is counted from
   here to swap_call_end, so that the call, failing after them, says so (-EIO). */
void swap_call_begin(struct swap *sw);
/* The running call (its frame: swap_call_begin .. end, no reclaim acting) depends on `n`
   moves made for it outside its journal that no undo takes back (swap_make_room_ahead's
   drops): should it fail, swap_call_end returns -EIO, as for a drop of its own reclaim. */
void swap_call_lost(struct swap *sw, uint32_t n);
/* Whether a call's reclaim is acting now with its journal on (swap_call_end takes its
   moves back should the call fail): the cache's demotions then keep what they moved until
   stash_end, as its stashed drops do. */
bool swap_journal_on(const struct swap *sw);
/* The budget is now `frames`: the device watermarks follow it. */
void swap_set_frames(struct swap *sw, uint32_t frames);
/* After a call that took frames: the watermark rules above. */
void swap_after_call(struct swap *sw);
/* At each step (protections ended: a round that found nothing may find something now). */
void swap_after_step(struct swap *sw);
/* Waits until no background round runs or is requested. Without the context lock. */
void swap_wait_idle(struct swap *sw);
void swap_counters(struct swap *sw, struct swap_counters *out);
/* The durations of the direct reclaims that moved something (direct_reclaims of them;
   common/hist.h). */
void swap_direct_hist(struct swap *sw, struct khist *out);

#endif
