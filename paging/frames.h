/*
 * paging/frames.h: the device pool's structures (struct pg_frame, the feed, struct
 * pg_frames: a part of struct paging owned by pool.c, owner frames) and pool.c's frame
 * functions for the rest of paging/. Included by paging_int.h only. The owner frames calls
 * no owner above it: the holders of map-ahead frames answer through the hooks below.
 */
#ifndef KVVM_PAGING_FRAMES_H
#define KVVM_PAGING_FRAMES_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include "paging.h"

struct paging;
struct pg_seq;

enum pg_frame_state {
    FR_NONE = 0,       /* not created yet */
    FR_READY,          /* created, unmapped, on the ready list */
    FR_AHEAD,          /* mapped ahead of a sequence's end; free for accounting */
    FR_USED,           /* holds a page (pg_frame.page) */
};

struct pg_frame {
    vmm_handle h;
    uint8_t    state;      /* enum pg_frame_state */
    uint8_t    listed;     /* on the ready list now (a frame popped and given back, e.g. a
                              refused release, is FR_READY and off it) */
    pg_frame_id next;      /* FR_READY: next ready frame (none = end); FR_NONE: next free id */
    pg_page_id page;       /* FR_USED: the page id it holds */
    uint32_t   serial;     /* created on a caller's thread: pg->fr.n_created then (0: ahead, by
                              the pool thread); pool_rollback releases those above a mark */
    uint32_t   gen;        /* bumped when the id gives up its handle (frame_forget): a pool
                              view slot names (frame, gen), so a new handle under a recycled
                              frame id never passes for the one it mapped */
    uint32_t   grp;        /* FR_AHEAD in a prepared pool view group: its id + 1 (view.c) */
    uint8_t    ext;        /* shared with other processes (exported through the pool daemon,
                              or imported from it): its page is copied before any write, and
                              when the page leaves it the handle is released (the daemon
                              learns it), never put on the ready list (pool.c) */
    uint32_t   vmaps;      /* pool view slots mapping its handle (view.c, the one writer).
                              The driver keeps a released handle's memory while a mapping of
                              it is left, so the pool releases a frame only at 0: a dead
                              id's slots are unmapped first (view_reap, behind its fence) */
};

/* The pool's feed (pool.c): frames created and released off the caller's thread by the
   frame pool thread (swap/frames.c). Everything here is under mu, which is taken with or
   without the context lock (lock order: context lock -> mu): the thread creates and
   releases handles holding mu only around the hand-off, so a caller holding the context
   lock may wait on cv for frames being created. Budget accounting: frames being created
   (creating), created and not in the pool yet (n_in) and taken off the pool for release
   (releasing) count as held, so held frames never exceed the budget. */
struct pg_feed {
    pthread_mutex_t mu;
    pthread_cond_t  cv;        /* a delivery, a failure or a release happened */
    bool        on;            /* a thread feeds the pool (paging_feed_attach) */
    uint32_t    creating;      /* reserved by a plan, not delivered or failed yet */
    uint32_t    releasing;     /* taken off the pool, not released yet */
    uint32_t    n_in;          /* created, waiting in in[] for paging_feed_drain */
    uint32_t    unreleased;    /* of in[]: releases the driver refused (back to the pool) */
    vmm_handle *in;            /* cap_frames entries */
    void      (*wake)(void *); /* asks the thread for a round (called with the context lock) */
    void       *wake_arg;
    uint32_t    low;           /* wake when fewer frames than this are ready (0: never) */
    uint32_t    high;          /* the thread's high mark: the pool growing above it wakes
                                  the thread (UINT32_MAX: never) */
    uint32_t    ready_min;     /* fewest frames ready since the idle window began (the last
                                  plan that could release): only frames unused that whole
                                  time are surplus */
    bool        suppress;      /* kvvm_trim: create nothing ahead until a call takes frames */
    bool        asked;         /* a round was asked for since the last plan (context lock) */
};

/* frames [pool.c]: the device pool. Frame ids 1..cap_frames; held = ready + ahead + used
   <= max_frames (the budget, p.max_frames, changed by pool_set_max_frames: the one field of
   p the pool writes). Others change it through pool_take / pool_take_except /
   pool_take_ready, pool_make_ready, pool_give, pool_rollback, pool_refill, pool_release_ready,
   pool_drop_all_ahead, pool_set_max_frames, pool_feed_suppress (paging.c's
   paging_set_budget and paging_trim), frame_set_ahead / frame_set_used (view.c), and the
   feed's paging_feed_* (swap/frames.c). A frame's state: frame_move (pool.c); its page:
   page_frame_set / page_frame_drop (paging_int.h). */
struct pg_frames {
    struct pg_frame *frames;   /* cap_frames */
    uint32_t cap_frames;       /* the most frames the device can hold (budget limit) */
    uint32_t n_created;        /* frames created on a caller's thread (rollback mark) */
    uint32_t n_held, n_ready, n_ahead, n_used;
    pg_frame_id ready_head;    /* the ready list (PG_FRAME_NONE: empty) */
    pg_frame_id frame_free_head; /* FR_NONE ids (PG_FRAME_NONE: none) */
    uint32_t chunk;            /* [paging.c, at create] frames created ahead per refill
                                  without a pool thread */
    struct pg_feed feed;       /* [pool.c; swap/frames.c through paging_feed_*] */
    /* the holders of map-ahead frames (FR_AHEAD) live in an owner above the pool (seq.c's
       map-ahead, view.c's prepared groups): the pool asks them to give frames back through
       these hooks, set at create [paging.c], so it calls no owner above it; the swap-outs
       (tier_out.c, below the sequences too) drop a sequence's map-ahead through ahead_drop */
    int  (*ahead_steal)(struct paging *pg, struct pg_seq *except);       /* seq_steal_ahead */
    void (*ahead_drop)(struct paging *pg, struct pg_seq *s, uint32_t keep); /* seq_drop_ahead */
    void (*ahead_drop_all)(struct paging *pg);                      /* seq_drop_all_ahead */
    /* the frame pool thread's map-ahead refills in flight (ahead.c, an owner above): undone
       by the feed's quiesce (pool.c); a window mapping meeting one's range waits for it and
       undoes it (window.c: only while ahq.busy) */
    void (*ahead_cancel)(struct paging *pg);                        /* ahead_cancel */
    void (*ahead_meet_va)(struct paging *pg, uint64_t va, uint32_t n);  /* ahead_meet_va */
};

/* pool.c */
int  pool_init(struct paging *pg);
void pool_fini(struct paging *pg);
/* Asks the frame pool thread for a round (once until its next plan). */
void pool_feed_ask(struct paging *pg);
/* Frames available without moving data: ready + uncreated + ahead. */
uint32_t pool_available(const struct paging *pg);
/* Takes n frames (ready first, then created, then stolen from map-ahead) into out; all or
   nothing. -ENOMEM, -EIO. Frames come back FR_USED with no page yet. */
int  pool_take(struct paging *pg, uint32_t n, pg_frame_id *out);
/* As pool_take, never stealing the map-ahead of `except`. */
int  pool_take_except(struct paging *pg, uint32_t n, pg_frame_id *out, struct pg_seq *except);
/* Up to n frames ready within the budget, no steal. -EIO; made: a refused create -ENOMEM. */
int  pool_make_ready(struct paging *pg, uint32_t n, bool made);
/* Takes up to n ready frames (no create, no steal); returns how many. */
uint32_t pool_take_ready(struct paging *pg, uint32_t n, pg_frame_id *out);
void frame_set_ahead(struct paging *pg, pg_frame_id f);
void frame_set_used(struct paging *pg, pg_frame_id f);
/* Takes ready frame f back off the ready list (FR_USED, no page yet) when it is still
   there under generation gen (the same handle): false, nothing taken, otherwise. */
bool pool_take_frame(struct paging *pg, pg_frame_id f, uint32_t gen);
/* Ready frame f goes to the end of the ready list (taken last: a parked drop's frames,
   park.c). Nothing when it is not ready. */
void pool_ready_last(struct paging *pg, pg_frame_id f);
/* Returns frames that hold no page (unmapped) to the ready list. */
void pool_give(struct paging *pg, const pg_frame_id *f, uint32_t n);
/* Releases the frames a failed call created on its own thread since mark = pg->fr.n_created
   (they are all ready again), so it leaves no new handle behind (frames the pool thread
   delivered meanwhile stay: they are the reserve). */
void pool_rollback(struct paging *pg, uint32_t mark);
/* Without a pool thread: creates frames until `ready` are ready (bounded by the budget);
   best effort. With one (or suppressed by kvvm_trim): nothing. */
void pool_refill(struct paging *pg, uint32_t ready);
/* Releases ready frames until at most keep are ready, none that a pool view slot still
   maps (struct pg_frame.vmaps); returns how many it released. */
uint32_t pool_release_ready(struct paging *pg, uint32_t keep);
/* Ready frames that a pool view slot still maps (a dead id's, until no device work may use
   it): not released until it is unmapped (view_reap). */
uint32_t pool_ready_pinned(struct paging *pg);
/* Unmaps every sequence's map-ahead and breaks the pool view's prepared groups: those
   frames become ready (the holders' hook, seq_drop_all_ahead). */
void pool_drop_all_ahead(struct paging *pg);
/* The budget in frames (p.max_frames); the caller checked that the frames held fit. */
void pool_set_max_frames(struct paging *pg, uint32_t frames);
/* kvvm_trim's pause: no frame is created ahead until a call needs device pages. */
void pool_feed_suppress(struct paging *pg);
/* Shared frames (struct pg_frame.ext): room in the budget for n adopted frames (ready
   frames released to make it; -ENOMEM none), then each handle adopted as a new frame id,
   FR_USED, ext (its page then page_new's); pool_share_mark makes page id's frame ext (an
   export: the page is copied before any write from now). */
int  pool_adopt_room(struct paging *pg, uint32_t n);
pg_frame_id pool_adopt_ext(struct paging *pg, vmm_handle h);
void pool_share_mark(struct paging *pg, pg_page_id id);

#endif
