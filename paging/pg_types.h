/*
 * paging/pg_types.h: paging's data: struct paging and its parts, each part under its owner's
 * heading (the owners: paging_int.h's top), and the descriptors they hold (pages,
 * sequences, pending work, frames). Types only: each owner's functions, the ones the other
 * files may call, are in that owner's header (frames.h, seqs.h, ahead.h, transfers.h,
 * clock.h, view.h, window.h). struct paging embeds every part by value (one allocation;
 * the hot view first), so C needs every part's complete type where it is defined: the
 * types live here together, the functions apart, so that a file sees the functions of the
 * owners it includes and no others. Included through paging_int.h.
 */
#ifndef KVVM_PAGING_PG_TYPES_H
#define KVVM_PAGING_PG_TYPES_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include "paging.h"

/* The typed ids' predicates that only paging/ needs (the others: paging.h). */
static inline bool pg_frame_is_none(pg_frame_id f) { return f.v == 0; }
static inline bool pg_page_eq(pg_page_id a, pg_page_id b) { return a.v == b.v; }
static inline bool pg_frame_eq(pg_frame_id a, pg_frame_id b) { return a.v == b.v; }

struct pg_page {
    uint32_t refs;         /* block-table entries + pending releases / transfer jobs +
                              copies out (DF_COPY: counted in no other field, so they
                              count as sharers and map nothing in a window) */
    uint32_t offs;         /* of refs: entries of non-resident sequences (they map nothing);
                              refs - offs = holders mapping it in a window */
    uint32_t jobs;         /* of refs: transfer jobs (DF_OUT / DF_IN) */
    uint8_t  tier;         /* enum pg_tier; PG_TIER_NONE = descriptor free */
    pg_frame_id frame;     /* PG_TIER_DEVICE: frame id */
    pg_page_id next_free;  /* PG_TIER_NONE: next free descriptor id */
    pg_slot  slot[PG_N_LOWER]; /* its slot in each tier below the device that holds its
                              bytes (lower_slots(tier) says which): one while it rests in a
                              tier (HOST, DISK), or leaves or enters one from the device
                              (TO_HOST, TO_DEVICE: the host slot); both of a move between
                              two (TO_DISK, FROM_DISK: the source's slot is freed when the
                              transfer completed, the destination's if it failed) */
    uint8_t  bad;          /* PG_TIER_DISK: the disk copy is lost (damaged, -EBADMSG) */
    uint8_t  staged;       /* STG_*: a staged swap's disk I/O on the page (tier unchanged) */
    uint32_t mark, n_mark; /* a reclaim plan's scratch (plan_marks.c), valid while mark ==
                              pg->xf.mark (no array sized to the pool): n_mark resident holders
                              planned to leave, */
    uint32_t n_gone;       /*   n_gone references planned to be dropped, */
    uint8_t  kept;         /*   kept: a sequence the plan keeps holds it (same validity) */
    uint32_t ents;         /* of refs and of offs: holders outside sequences (the prefix
                              cache's entries, hold.c); they map nothing. refs == ents: no
                              sequence, release or transfer holds the page */
    uint8_t  ext;          /* its frame is shared with other processes (pg_frame.ext): one
                              more sharer (page_sharers), so every write copies it first.
                              Set with the frame [pool.c: page_new, pool_share_mark;
                              page_frame_set], cleared when the page leaves it */
};

/* A staged swap (host_tier.c) moves a page's bytes through a host slot it does not own: the page
   keeps its tier during the call, its I/O is tracked here (paging_disk_stage_io). */
enum { STG_NONE = 0, STG_BUSY, STG_OK, STG_FAIL };

/* Work that waits for a fence. Holds one reference on each page it names.
   DF_RELEASE: unmap window range [first, end) of slot in every region, drop the pages.
   DF_OUT:     a swap-out's completion: the same unmap, and each page still TO_HOST becomes
               HOST (its frame returns to the pool). The fence is on the copy stream.
   DF_IN:      a swap-in's completion: each page still TO_DEVICE becomes DEVICE (its host
               slot is freed); no window changes (first == end).
   DF_COPY:    a copy out of held pages (the store's write-through, hold.c): one block's
               n_regions pages, mapped at block `first` (== end) of the copy run, not in any
               window; slot is PG_COPY_SLOT (no sequence's). Its completion unmaps the run
               block, gives it back and drops the pages. Its references are plain ones (not
               jobs): a writer of such a page copies it first, so the copy reads the bytes of
               its start, and the page cannot move down, so its frame stays the page's. */
enum { DF_RELEASE = 0, DF_OUT, DF_IN, DF_COPY };
#define PG_COPY_SLOT UINT32_MAX
struct pg_defer {
    struct pg_defer *next;
    vmm_fence fence;
    uint32_t  slot;
    uint32_t  first, end;  /* page indices [first, end) in every region (DF_COPY: the run
                              block, first == end) */
    uint8_t   kind;
    uint32_t  n;           /* entries in pages[] */
    pg_page_id pages[];    /* DF_RELEASE/DF_OUT: n_regions * (end - first), region-major;
                              DF_COPY: n_regions, one per region */
};

/* The fields paging_seq_grow_fast (paging.h) reads and writes come first, packed into 64
   bytes (gen .. used_tick): the decode step's grow touches one cache line of a sequence.
   `hot` names them for core; paging's code uses the unnamed members. */
struct pg_seq {
    union {
        struct pg_seq_hot hot;
        struct { PG_SEQ_HOT_FIELDS };
    };
    /* the rest: pointers first, then the 32-bit and 8-bit fields, so that the struct is two
       cache lines (128 bytes: the hot view is 64-byte aligned, paging_create aligns the
       array) and the hot view is always one */
    struct pg_defer *in_job; /* a prefetch's DF_IN the engine stream does not wait for yet */
    pg_page_id *bt;        /* n_regions * bt_cap page ids, region-major (PG_PAGE_NONE: a
                              hole); made at the slot's take, grown with the sequence
                              (seq_bt_reserve), so it follows the length, not max_tokens */
    pg_frame_id *ahead;    /* n_regions * ahead_cap frame ids (region r's at r * ahead_cap) */
    uint32_t ahead_cap;    /* frames per region the array holds: map_ahead, or more after a
                              premap (paging_seq_premap) grew it; kept with the slot */
    /* discard and classes (discard.c) */
    uint64_t *kept;        /* n_regions first_kept values (tokens; 0 = nothing discarded);
                              made with bt. A block-table entry PG_PAGE_NONE below n_pages
                              is a hole: a discarded page (unmapped, no page held) */
    uint32_t *bid;         /* pool view only (view.c): bt_cap block ids + 1 (0 = none yet);
                              made and grown with bt. Held only while resident */
    uint32_t  bt_cap;      /* block-table entries per region allocated: n_pages <= bt_cap
                              <= pages_per_slot (bid, when the pool view is on, too) */
    uint32_t  next_free;   /* free slot list */
    uint32_t  batch_mark;  /* pg->sq.batch_mark while paging_seq_grow_batch_in_place checks a
                              batch naming it (a second naming is seen) */
    uint8_t   cls;         /* enum pg_seq_class */
    uint8_t   dropped;     /* a CACHED sequence whose pages were dropped: -ESTALE */
    uint8_t   stale_tail;  /* KVVM_F_SCRUB: a truncate left old tokens' bytes in the partial
                              last page; the next grow over them zeroes them (seq.c,
                              tail_scrub), so it does not grow in place */
};

/* One tier below the device as paging keeps it (paging.h, "the tiers below the device"):
   its ops and its counts. Moves between tier t and the tier above it (the device for the
   host tier) are tier t's transfers in flight (n_io). */
struct pg_lower {
    struct pg_tier_ops ops;    /* ops.alloc NULL: the tier is absent */
    uint32_t n_slots;          /* pages holding a slot of it (host: HOST, TO_HOST, TO_DEVICE,
                                  FROM_DISK, TO_DISK; disk: DISK, TO_DISK, FROM_DISK) */
    uint32_t n_io;             /* pages moving between it and the tier above (host: TO_HOST,
                                  TO_DEVICE; disk: TO_DISK, FROM_DISK) */
    uint8_t  off;              /* no more moves down into it (a write failed: disk) */
    pg_slot  hint;             /* the last slot allocated (clustering); PG_SLOT_NONE: none */
};

/* ---- frames [pool.c]: the device pool (frames.h: its functions) ---- */

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
   frame pool thread (swap/frame_pool.c). Everything here is under mu, which is taken with or
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
   feed's paging_feed_* (swap/frame_pool.c). A frame's state: frame_move (pool.c); its page:
   page_frame_set / page_frame_drop (frames.h). */
struct pg_frames {
    struct pg_frame *frames;   /* cap_frames */
    uint32_t cap_frames;       /* the most frames the device can hold (budget limit) */
    uint32_t n_created;        /* frames created on a caller's thread (rollback mark) */
    uint32_t n_held, n_ready, n_ahead, n_used;
    pg_frame_id ready_head;    /* the ready list (PG_FRAME_NONE: empty) */
    pg_frame_id frame_free_head; /* FR_NONE ids (PG_FRAME_NONE: none) */
    uint32_t chunk;            /* [paging.c, at create] frames created ahead per refill
                                  without a pool thread */
    struct pg_feed feed;       /* [pool.c; swap/frame_pool.c through paging_feed_*] */
};

/* pages [pool.c]: the page descriptors, their free list and counts. Others change it through
   page_new, page_new_off (handoff.c), page_new_host (seq_share.c), page_get, page_put,
   page_put_off; the counts through page_count (frames.h, around every change of a page's
   refs, offs or tier). A descriptor's own fields have their writers: refs, offs, ents, jobs
   [pool.c only: page_new*, page_get/put, page_get_off/put_off, page_go_off/on (the swap
   paths), page_get_ent/put_ent (hold.c), page_get_job/job_done (host_tier.c, defer.c,
   disk_tier.c: transfer jobs)], tier [page_set_tier,
   from pool.c, host_*.c, disk_tier.c, orphan.c], frame [page_frame_set / page_frame_drop], slot
   [page_take_slot / page_release_slot], bad, staged [disk_tier.c],
   mark.. kept [plan_marks.c; tier_mark_begin] */
struct pg_pages {
    struct pg_page *pages;     /* max_pages */
    pg_page_id page_free_head; /* free descriptors (PG_PAGE_NONE: none) */
    uint32_t n_pages_live;
    uint32_t n_host_pages;     /* [page_count] pages in tier HOST (the spillable ones) */
    uint32_t n_held_host;      /* [page_count] of them: those only holders outside sequences
                                  keep */
    uint32_t n_orphans;        /* [page_count] device pages held only by non-resident
                                  holders */
};

/* ---- seqs [seq.c ...] (seqs.h: its functions) ---- */

/* seqs [seq.c]: the slot list and the lifecycle counts (the array, seqs, is in the hot
   view). Others change it through seq_slot_take / seq_slot_untake (seq_share.c), and this
   header's seq_set_life (lifecycle: live, dying, n_live, n_dying), seq_slot_release (defer.c
   when a dying slot's last pending entry is done) and seq_set_out (residency, from the swap
   paths). A sequence's own fields (struct pg_seq): slots, block tables, map-ahead [seq.c];
   length and block tables also seq_share.c, discard.c, cow.c; n_defer, in_job [defer.c, host_tier.c] */
struct pg_seqs {
    uint32_t batch_mark;       /* the last batch paging_seq_grow_batch_in_place checked */
    uint32_t slot_free_head;   /* slot + 1; 0 = none */
    uint32_t n_live, n_dying;  /* [seq_set_life] */
    uint32_t n_out;            /* [seq_set_out] live non-resident sequences (out set) */
};

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

/* watch [park.c; window.c and the device writes through the inlines below]: the frames a
   call's parked drops freed (paging_seq_park), watched until the call ends: a frame mapped
   into a window and written through there by a library copy or memset is no longer the
   dropped sequence's bytes. Each keeps the window address of its last map (a write to an
   address it was mapped at before marks it then). */
struct pg_watch {
    pg_frame_id *f;            /* n watched frames */
    uint64_t   *va;            /* the window address of its last map (0: none since) */
    uint8_t    *dirty;         /* written through a mapping since parked */
    uint32_t    n, cap;
};

/* ---- clock [step.c defer.c view.c] (clock.h, view.h: their functions) ---- */

/* clock [step.c]: the engine stream, the copy stream (the swap paths' copies) and their
   fences. Others change it through paging_step, paging_sync, paging_set_stream,
   pg_device_sync, tier_copy_stream, tier_copies_after_engine, paging_copy_fence_record,
   paging_stream_after_copies (all step.c); quiet_below also defer.c (defer_quiet), n_syncs
   also view.c (view_reap's own sync): one owner, clock. */
struct pg_clock {
    kcu_stream stream;         /* engine stream; NULL = synchronous mode */
    vmm_fence step_fence;      /* recorded at the last step on the engine stream */
    uint8_t  step_fence_ok;    /* created */
    uint8_t  step_recorded;
    uint64_t step_fence_epoch; /* the step fence covers work of sequences used before it */
    uint64_t step_fence_tick;  /* pg->tick when it was recorded (an idle step, no use since,
                                  moves step_fence_epoch on without a record) */
    uint8_t  step_fence_done;  /* found complete since it was recorded */
    uint64_t quiet_below;      /* sequences with used_epoch < this have no device work left */
    kcu_stream copy_stream;    /* swap copies; made on first use (tier_copy_stream) */
    vmm_fence copy_fence;      /* re-recorded on copy_stream for stream waits */
    uint8_t  copy_fence_ok;
    vmm_fence order_fence;     /* re-recorded on the engine stream; copy_stream waits on it */
    uint8_t  order_fence_ok;
    uint64_t n_syncs;          /* device / engine-stream synchronizations so far */
};

/* defers [defer.c]: work waiting for a fence (owner clock). Others change it through
   defer_add (host_tier.c's transfer jobs), defer_release / defer_release_region, defer_reap,
   defer_flush_jobs / defer_flush_slot / defer_flush_slot_from, defer_complete. */
struct pg_defers {
    struct pg_defer *defer;    /* pending entries, newest first */
    uint32_t n_defer;
    uint32_t *copy_free;       /* the copy run's free blocks (p.copy_blocks of them; a DF_COPY
                                  job holds one from its start to its completion) */
    uint32_t n_copy_free;
};

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

/* ---- transfers [host_tier.c disk_tier.c ...] (transfers.h: their functions) ---- */

/* transfers [host_tier.c]: the tiers below the device (paging.h, "the tiers below the device"),
   the policy, the plan marks' walk (owner transfers). Others change it through
   page_take_slot / page_release_slot (n_slots) and lower_io_done (n_io), transfers.h;
   lower_take / lower_give (hint: host_tier.c, host_out.c, disk_tier.c); paging_set_policy;
   tier_mark_begin. Within the owner: n_io also the swap paths (host_out.c, host_in.c,
   disk_tier.c), off disk_tier.c, the orphan log orphan.c; ops set at create [paging.c]. */
struct pg_transfers {
    struct pg_lower lower[PG_N_LOWER];
    uint32_t mark;             /* the current walk of pg_page.mark (tier_mark_begin) */
    struct pg_policy_ops policy; /* swap/'s choices (paging_set_policy); .plan NULL: none */
    uint32_t *orphan_log;      /* [orphan.c] paging_orphan_log: the page ids moved down */
    uint32_t orphan_log_cap, *orphan_log_n;
};

/* spill [disk_tier.c]: spilling (owner transfers). Others change it through
   paging_disk_keep and paging_disk_stage_io. */
struct pg_spill {
    const uint64_t *spill_keep;   /* paging_disk_keep: sequences whose host pages stay */
    size_t   n_spill_keep;
    int      stage_rc;         /* first error of the staged I/O in progress
                                  (paging_disk_stage_io) */
};

/* ---- struct paging's parts: one per owner's state (the owners: paging_int.h's top) ----
   (each under its owner's heading above). Reads are free: any file of paging/ reads any
   part. Writes go through the part's owner:
   its file writes the fields (paging.c also sets them at create and takes them down at
   destroy), the other files call the functions each part names, or the owner's inlines
   in its header (page_count in frames.h, seq_set_life in seqs.h ...). */

/* The paging context: the hot view, what paging.c sets at create (never written after),
   the parts above (one per owner's state; the pool view, struct pg_view, is view.c's), and
   two records every file writes its own entries of: the counters and the current call's
   refusals. */
struct paging {
    union {                    /* first: paging_hot() (paging.h); seqs, n_slots, seq_size
                                  [paging.c]; room_gen [pool.c: page_get; hold.c:
                                  paging_hold; page_get_off]; epoch [step.c]; tick
                                  [seq_use] */
        struct paging_hot hot;
        struct { PAGING_HOT_FIELDS };
    };
    struct vmm *v;             /* [paging.c] */
    struct paging_params p;    /* [paging.c; pool.c: p.max_frames, pool_set_max_frames] */
    uint32_t pages_per_slot;   /* [paging.c] */
    uint64_t scratch_va;   /* [paging.c] the scratch run after the regions (PG_SCRATCH_PAGES
                              pages) */
    struct pg_frames fr;       /* owner frames: pool.c */
    struct pg_pages pd;        /* owner frames: pool.c */
    struct pg_clock ck;        /* owner clock: step.c */
    struct pg_defers df;       /* owner clock: defer.c */
    struct pg_view view;       /* owner clock: view.c; view.n_ids 0: no pool view */
    struct pg_transfers xf;    /* owner transfers: host_tier.c */
    struct pg_spill sp;        /* owner transfers: disk_tier.c */
    struct pg_seqs sq;         /* owner seqs: seq.c */
    struct paging_counters c;  /* [all: each file counts its own events] */
    struct paging_why why;     /* [paging.c resets per call; all: pg_why_*] the current
                                  call's refusals (paging_why) */
    struct pg_ahq ahq;         /* owner seqs: ahead.c (ahead.h): the pool thread's refills */
    struct pg_watch wt;        /* [park.c; window.c, writers: the inlines below] */
};

#endif
