/*
 * swap/swap_int.h: swap/'s private parts, shared by its .c files only.
 *
 * Contract:
 *  - One LRU order for every choice swap/ makes: device victims (swap.c, victims) and spill
 *    victims (room.c, swap_spill) are sorted by swap_lru_sort on paging's use clock (the
 *    candidates' tick), least recently used first. paging only reports the ticks.
 *  - room.c is the host tier's policy: which host pages go to disk (swap_spill), how hard a
 *    caller short of host slots spills (swap_host_room), and whether a swap that the host
 *    tier cannot take as it is moves directly or staged (swap_plan). paging asks the last two
 *    through pg_policy_ops (installed by swap_create); swap.c calls them itself for reclaim
 *    and the host marks.
 *  - Called with the context lock held.
 */
#ifndef KVVM_SWAP_SWAP_INT_H
#define KVVM_SWAP_SWAP_INT_H

#include "swap.h"
#include "worker.h"

/* A move a call's reclaim made (undo.c): a sequence swapped out, demoted or stashed, with
   its use stamp from before the move. */
struct swap_undo_ent {
    uint64_t h;
    struct pg_use use;
    bool stash;                    /* a drop stashed (PG_RECLAIM_STASH): dropped at success */
};
/* The running call's journal: on while swap_make_room or swap_reclaim_budget acts (never
   for the reclaim thread's rounds), reserved before the first move (swap_undo_reserve) so
   that recording one never fails. lost: moves no undo can take back (a dropped CACHED
   sequence, a dropped prefix entry, orphan pages moved down). */
struct swap_undo {
    struct swap_undo_ent *e;
    size_t n, cap;
    struct pg_park **parks;        /* parked drops (paging_reclaim_drop), cap of them */
    size_t n_parks;
    uint32_t *park_orph;           /* of each park: n_orph when it was made (the orphans
                                      logged from there on moved down after it) */
    uint32_t *orph;                /* orphan pages moved down (paging_orphan_log) */
    uint32_t n_orph, orph_cap;
    const struct swap_cache_ops *cache;   /* whose entries are stashed (NULL: none) */
    uint32_t lost;
    bool on;
    bool in_call;                  /* a public call holds the lock (swap_call_begin .. end) */
};

struct swap {
    struct paging *pg;
    struct vmm *v;
    pthread_mutex_t *lock;         /* the context lock */
    struct swap_params p;
    uint32_t min_free, low_free, high_free;   /* in frames */
    struct swap_counters c;
    struct khist direct_hist;      /* direct reclaims that moved something, by duration (one
                                      per direct_reclaims; kvvm_metrics) */
    vmm_fence direct_fence;        /* used under the context lock only */
    vmm_fence thread_fence;        /* used by the thread only */
    bool direct_fence_ok, thread_fence_ok;
    uint32_t host_min_free, host_low_free, host_high_free;   /* in host slots */
    struct swap_cache_ops cache;   /* the prefix cache's entry reclaim (plan: NULL = none) */
    struct swap_undo undo;         /* the moves of the running call's reclaims (undo.c) */
    /* below: under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;             /* wake / idle changes */
    bool stop;
    struct swap_worker reclaim;    /* the reclaim thread (its flags under mu) */
    struct swap_worker spill;      /* the spill thread (its flags under mu) */
};

/* Records a fence on the copy stream, waits for it and reaps (direct reclaim: the frames of
   the copies started so far are free then). -EIO. */
int  swap_wait_copies(struct swap *sw);

/* The journal has room for `more` moves and `pages` orphan pages moved down beyond those
   recorded (before a plan acts). -ENOMEM, nothing moved. */
int  swap_undo_reserve(struct swap *sw, size_t more, uint32_t pages);
/* The journal on (a call's reclaim acts) or off; paging logs the orphans it moves while on. */
void swap_undo_on(struct swap *sw, bool on);
/* Records h's move (its use stamp from before it) when the journal is on. */
void swap_undo_note(struct swap *sw, uint64_t h, const struct pg_use *before);
/* Records a parked drop (the journal on; reserved); k may be NULL (nothing to record). */
void swap_undo_park(struct swap *sw, struct pg_park *k);
/* The plan's entry drops of ops, stashed (swap_cache_ops.stash) until the call ends;
   returns those dropped now. */
uint32_t swap_undo_cache_stash(struct swap *sw, const struct swap_cache_ops *ops,
                               uint64_t *room);
/* Records h's stashed drop (the journal on): dropped when the call succeeds. */
void swap_undo_stash(struct swap *sw, uint64_t h, const struct pg_use *before);
/* Whether the journal holds h's stashed drop (made earlier in the same reclaim). */
bool swap_undo_stashed(const struct swap *sw, uint64_t h);

/* Sorts c[0..n) least recently used first (the one LRU order). */
void swap_lru_sort(struct pg_cand *c, size_t n);
/* Starts writing up to max host pages to disk: the pages only the prefix cache's entries
   hold first (swap_cache_ops.spill, in its order), then least recently used non-resident
   sequences first, never pages excl (a handle, 0 = none) holds; *started gets the count.
   Does not wait. -ENOMEM the disk tier is full, disabled or absent and nothing started. */
int  swap_spill(struct swap *sw, uint32_t max, uint64_t excl, uint32_t *started);
/* Makes `want` host slots free, spilling (and waiting for the writes) if needed: up to four
   rounds, each starting only the writes that those already in flight do not cover.
   -ENOMEM when they cannot be had. (pg_policy_ops.host_room; arg = the swap context.) */
int  swap_host_room(void *pg, uint32_t want, uint64_t excl);
/* pg_policy_ops.plan (arg unused). */
int  swap_plan(void *arg, bool in, const struct pg_room *r);

#endif
