/*
 * paging/paging_int.h: the paging layer's private structures, shared by its .c files only.
 *
 *   paging.c the paging context: create / destroy, counters
 *   pool.c   frames (physical handles: create ahead, ready list, take/give) and page
 *            descriptors (identity, refcount, tier, location; O(1) free list)
 *   step.c   the epoch clock and the streams: step (the step fence), sync, set_stream; the
 *            copy stream and its ordering after the engine
 *   defer.c  releases and transfer jobs that wait for a fence, their completion; quietness
 *            of a sequence; a prefetch's settle; copy ordering
 *   seq.c    slots, handles, block tables, map-ahead; grow, free, info
 *   ahead.c  map-ahead refilled by the frame pool thread (queue, plan, map, commit)
 *   window.c a slot's window address; mapping and unmapping frames in it by runs
 *   share.c  truncate, fork, share (sequences sharing pages)
 *   cow.c    copy-on-write, prepare_write, write/read
 *   discard.c  discard, first_kept, the classes (set, drop, demote, cached candidates)
 *   check.c  the invariant checker (against the driver's tables through vmm's debug calls)
 *   tier.c   the host tier's shared steps: transfer jobs, host slots, window mapping and
 *            copies of the swap paths; the bridge to the policy (room facts)
 *   resident.c  residency queries (ready, need, stage facts, candidates, counts)
 *   tier_out.c  sequence swap-out (direct, or staged through the host tier to disk)
 *   tier_in.c   sequence swap-in (direct, or staged from disk through the host tier)
 *   orphan.c the orphan pages (device pages no resident sequence maps) and their move down
 *   tier_disk.c  the disk tier's mechanism: page writes and reads, their completions,
 *            damage (tier_disk_*; disk/ is the disk tier's own layer, spill_* its API)
 *   hold.c   holders outside sequences (the prefix cache's entries): their references,
 *            a sequence adopting held pages, their part of a reclaim plan
 *   view.c   the pool view (KVVM_F_POOL_VIEW): block ids, their mappings, their graveyard
 *   plan.c   the reclaim plan's page marks (what a victim frees, the slots it takes)
 *   park.c   a call's reclaim drop kept for its undo (parked frames, watched)
 * The owners: groups of the files above, each calling only the owners below it (the call
 * graph between owners has no cycle; scripts/paging-owners.py checks it from the objects,
 * the CTest paging_owners; inline functions of this header are no calls). Top first; one
 * line each, parsed by the script:
 *   owner context: paging.c check.c
 *   owner seqs: seq.c ahead.c share.c cow.c discard.c hold.c resident.c park.c handoff.c
 *   owner transfers: tier.c tier_in.c tier_out.c tier_disk.c orphan.c plan.c
 *   owner clock: step.c defer.c view.c
 *   owner frames: pool.c
 *   owner window: window.c
 * struct paging is split the same way: one part per owner's state, each named with its
 * owner file and the functions other files change it through ("struct paging's parts"
 * below): fr and pd (pool.c), ck (step.c), df (defer.c), view (view.c), xf (tier.c), sp
 * (tier_disk.c), sq (seq.c). Reads are free; writes go through the owner. An owner below
 * asks one above through a hook it is given at create (the pool's ahead_* hooks into the
 * map-ahead), never by a call.
 */
#ifndef KVVM_PAGING_PAGING_INT_H
#define KVVM_PAGING_PAGING_INT_H

#include <errno.h>
#include <pthread.h>
#include "common/assert.h"
#include "paging.h"
#include "frames.h"         /* the device pool: its structures, pool.c's frame functions */
#include "view.h"           /* the pool view: its structures, view.c's functions */
#include "ahead.h"          /* the pool thread's map-ahead refills: ahead.c's part, functions */

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
    uint32_t mark, n_mark; /* a reclaim plan's scratch (plan.c), valid while mark ==
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

/* A staged swap (tier.c) moves a page's bytes through a host slot it does not own: the page
   keeps its tier during the call, its I/O is tracked here (tier_disk_stage_io). */
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
    pg_frame_id *ahead;    /* n_regions * map_ahead frame ids */
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

/* ---- struct paging's parts: one per owner's state (the owners: this file's top) ----
   (frames [pool.c], the device pool, is in frames.h; the pool view [view.c] in view.h)
   Reads are free: any file of paging/ reads any part. Writes go through the part's owner:
   its file writes the fields (paging.c also sets them at create and takes them down at
   destroy), the other files call the functions each part names, or the owner's inlines
   in this header (page_count, seq_set_life ...). */

/* pages [pool.c]: the page descriptors, their free list and counts. Others change it through
   page_new, page_new_off (handoff.c), page_new_host (share.c), page_get, page_put,
   page_put_off; the counts through page_count (this header, around every change of a page's
   refs, offs or tier). A descriptor's own fields have their writers: refs [pool.c, hold.c],
   offs [the swap paths, share.c, hold.c, page_put_off, page_new_off], jobs [tier.c,
   tier_disk.c], tier [page_set_tier, from pool.c, tier*.c, orphan.c], frame [page_frame_set /
   page_frame_drop], slot [page_take_slot / page_release_slot], bad, staged [tier_disk.c],
   mark.. kept [plan.c; tier_mark_begin], ents [hold.c] */
struct pg_pages {
    struct pg_page *pages;     /* max_pages */
    pg_page_id page_free_head; /* free descriptors (PG_PAGE_NONE: none) */
    uint32_t n_pages_live;
    uint32_t n_host_pages;     /* [page_count] pages in tier HOST (the spillable ones) */
    uint32_t n_held_host;      /* [page_count] of them: those only holders outside sequences
                                  keep */
    uint32_t n_orphans;        /* [page_count] device pages held only by non-resident
                                  holders */
    uint32_t *orphan_log;      /* [orphan.c] paging_orphan_log: the page ids moved down */
    uint32_t orphan_log_cap, *orphan_log_n;
};

/* seqs [seq.c]: the slot list and the lifecycle counts (the array, seqs, is in the hot
   view). Others change it through seq_slot_take / seq_slot_untake (share.c), and this
   header's seq_set_life (lifecycle: live, dying, n_live, n_dying), seq_slot_release (defer.c
   when a dying slot's last pending entry is done) and seq_set_out (residency, from the swap
   paths). A sequence's own fields (struct pg_seq): slots, block tables, map-ahead [seq.c];
   length and block tables also share.c, discard.c, cow.c; n_defer, in_job [defer.c, tier.c] */
struct pg_seqs {
    uint32_t batch_mark;       /* the last batch paging_seq_grow_batch_in_place checked */
    uint32_t slot_free_head;   /* slot + 1; 0 = none */
    uint32_t n_live, n_dying;  /* [seq_set_life] */
    uint32_t n_out;            /* [seq_set_out] live non-resident sequences (out set) */
};

/* clock [step.c]: the engine stream, the copy stream (the swap paths' copies) and their
   fences. Others change it through paging_step, paging_sync, paging_set_stream,
   pg_device_sync, tier_copy_stream, tier_copies_after_engine, paging_copy_fence_record,
   paging_stream_after_copies (all step.c); quiet_below also defer.c (seq_quiet), n_syncs
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
   defer_add (tier.c's transfer jobs), defer_release / defer_release_region, defer_reap,
   defer_flush_jobs / defer_flush_slot / defer_flush_slot_from, defer_complete. */
struct pg_defers {
    struct pg_defer *defer;    /* pending entries, newest first */
    uint32_t n_defer;
    uint32_t *copy_free;       /* the copy run's free blocks (p.copy_blocks of them; a DF_COPY
                                  job holds one from its start to its completion) */
    uint32_t n_copy_free;
};

/* transfers [tier.c]: the tiers below the device (paging.h, "the tiers below the device"),
   the policy, the plan marks' walk (owner transfers). Others change it through
   page_take_slot / page_release_slot (n_slots) and lower_io_done (n_io), this header;
   lower_take / lower_give (hint: tier.c, tier_out.c, tier_disk.c); paging_set_policy;
   tier_mark_begin. Within the owner: n_io also the swap paths (tier_out.c, tier_in.c,
   tier_disk.c), off tier_disk.c; ops set at create [paging.c]. */
struct pg_transfers {
    struct pg_lower lower[PG_N_LOWER];
    uint32_t mark;             /* the current walk of pg_page.mark (tier_mark_begin) */
    struct pg_policy_ops policy; /* swap/'s choices (paging_set_policy); .plan NULL: none */
};

/* spill [tier_disk.c]: spilling (owner transfers). Others change it through
   paging_spill_keep and tier_disk_stage_io. */
struct pg_spill {
    const uint64_t *spill_keep;   /* paging_spill_keep: sequences whose host pages stay */
    size_t   n_spill_keep;
    int      stage_rc;         /* first error of the staged I/O in progress
                                  (tier_disk_stage_io) */
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
    struct pg_transfers xf;    /* owner transfers: tier.c */
    struct pg_spill sp;        /* owner transfers: tier_disk.c */
    struct pg_seqs sq;         /* owner seqs: seq.c */
    struct paging_counters c;  /* [all: each file counts its own events] */
    struct paging_why why;     /* [paging.c resets per call; all: pg_why_*] the current
                                  call's refusals (paging_why) */
    struct pg_ahq ahq;         /* owner seqs: ahead.c (ahead.h): the pool thread's refills */
    struct pg_watch wt;        /* [park.c; window.c, writers: the inlines below] */
};

/* Frees the watch's arrays (paging_destroy). */
void park_fini(struct paging *pg);
/* A library write into device memory [va, va + len) is about to be enqueued (a copy to
   the device, a memset): a watched frame mapped there is dirty. */
static inline void pg_wrote(struct paging *pg, uint64_t va, uint64_t len)
{
    struct pg_watch *w = &pg->wt;
    uint64_t ps = pg->p.page_size;
    for (uint32_t j = 0; j < w->n; j++)
        if (w->va[j] && w->va[j] < va + len && va < w->va[j] + ps)
            w->dirty[j] = 1;
}
/* Frames f[0..n) are being mapped at va (window.c): watched ones note the address. */
static inline void pg_watch_map(struct paging *pg, uint64_t va, const pg_frame_id *f,
                                uint32_t n)
{
    struct pg_watch *w = &pg->wt;
    for (uint32_t i = 0; w->n && i < n; i++)
        for (uint32_t j = 0; j < w->n; j++)
            if (pg_frame_eq(w->f[j], f[i]))
                w->va[j] = va + (uint64_t)i * pg->p.page_size;
}

/* Note a refusal's facts for paging_why; each returns the error it explains. */
static inline int pg_why_handle(struct paging *pg, uint64_t h)
{
    pg->why.what |= PG_WHY_HANDLE;
    pg->why.handle = h;
    return -ENOENT;
}
static inline int pg_why_length(struct paging *pg, uint64_t length)
{
    pg->why.what |= PG_WHY_LENGTH;
    pg->why.length = length;
    return -E2BIG;
}
static inline int pg_why_frames(struct paging *pg, uint64_t frames)
{
    pg->why.what |= PG_WHY_FRAMES;
    pg->why.frames = frames;
    return -ENOMEM;
}
static inline int pg_why_host(struct paging *pg, uint64_t slots)
{
    pg->why.what |= PG_WHY_HOST;
    pg->why.host = slots;
    return -ENOMEM;
}

static inline uint64_t pg_pages_for(const struct paging *pg, uint64_t tokens)
{
    uint64_t b = tokens * pg->p.bytes_per_token;
    return (b + pg->p.page_size - 1) / pg->p.page_size;
}
static inline uint64_t pg_va(const struct paging *pg, uint32_t r, uint32_t slot, uint32_t idx)
{
    return paging_window(pg, r, slot) + (uint64_t)idx * pg->p.page_size;
}
static inline pg_page_id *pg_bt(const struct paging *pg, struct pg_seq *s, uint32_t r)
{
    (void)pg;
    return s->bt + (size_t)r * s->bt_cap;
}
/* The one walk over a sequence's block-table entries, holes (PG_PAGE_NONE, discard.c)
   skipped, region-major:
       for (struct pg_bt_iter it = bt_all(pg, s); bt_next(&it);)
           use(it.r, it.i, it.id);      (it.e: the entry itself, for a caller that clears it)
   bt_range walks regions [r0, r1) x page indices [i0, i1) (i1 <= s->bt_cap). The entries
   may be cleared during the walk (the next entry is read when it is reached); nothing
   else of s may change. Inline, no call: as cheap as the two hand-written loops. */
struct pg_bt_iter {
    pg_page_id *e;         /* the current entry */
    pg_page_id id;         /* *e then (never PG_PAGE_NONE) */
    uint32_t r, i;         /* its region and page index */
    uint32_t r1, i0, i1, cap;
    pg_page_id *bt;
};
static inline struct pg_bt_iter bt_range(const struct paging *pg, struct pg_seq *s,
                                         uint32_t r0, uint32_t r1, uint32_t i0, uint32_t i1)
{
    (void)pg;
    if (r0 >= r1)
        i1 = i0;                         /* empty: the first bt_next ends it */
    /* i starts one before i0 (unsigned: i0 = 0 wraps, the first ++ makes it 0) */
    return (struct pg_bt_iter){ .r = r0, .i = i0 - 1, .r1 = r1, .i0 = i0, .i1 = i1,
                                .cap = s->bt_cap, .bt = s->bt };
}
static inline struct pg_bt_iter bt_all(const struct paging *pg, struct pg_seq *s)
{
    return bt_range(pg, s, 0, pg->p.n_regions, 0, s->n_pages);
}
/* region UINT32_MAX: every region (the convention of discard's and release's region). */
static inline struct pg_bt_iter bt_region(const struct paging *pg, struct pg_seq *s,
                                          uint32_t region, uint32_t i0, uint32_t i1)
{
    return region == UINT32_MAX ? bt_range(pg, s, 0, pg->p.n_regions, i0, i1)
                                : bt_range(pg, s, region, region + 1, i0, i1);
}
static inline bool bt_next(struct pg_bt_iter *it)
{
    for (;;) {
        if (++it->i >= it->i1) {
            if (it->i0 >= it->i1 || ++it->r >= it->r1)
                return false;
            it->i = it->i0;
        }
        it->e = it->bt + (size_t)it->r * it->cap + it->i;
        if (!pg_page_is_none(*it->e)) {
            it->id = *it->e;
            return true;
        }
    }
}
/* Region r's map-ahead frames. With map_ahead = 0 there is no array (s->ahead is NULL) and
   the result is NULL: arithmetic on a null pointer, even + 0, is undefined (C11 6.5.6), so
   callers add an offset only when they index at least one frame. */
static inline pg_frame_id *pg_ahead(const struct paging *pg, struct pg_seq *s, uint32_t r)
{
    return s->ahead ? s->ahead + (size_t)r * pg->p.map_ahead : NULL;
}
static inline uint32_t pg_slot_of(const struct paging *pg, const struct pg_seq *s)
{
    return (uint32_t)(s - pg->seqs);
}
/* The one sequence-handle encoding: generation in the high 32 bits, slot + 1 in the low
   (so 0 is never a handle). seq_lookup decodes and checks it. */
static inline uint64_t seq_handle(const struct paging *pg, const struct pg_seq *s)
{
    return ((uint64_t)s->gen << 32) | (pg_slot_of(pg, s) + 1);
}
static inline uint32_t handle_slot1(uint64_t h) { return (uint32_t)(h & 0xffffffffu); }
static inline uint32_t handle_gen(uint64_t h) { return (uint32_t)(h >> 32); }
/* The live sequence h names, or -ENOENT (its reason noted). Inline: every entry point
   of every owner looks its handle up. */
static inline int seq_lookup(struct paging *pg, uint64_t h, struct pg_seq **out)
{
    uint64_t slot1 = handle_slot1(h);
    uint32_t gen = handle_gen(h);
    if (!slot1 || slot1 > pg->p.max_seqs)
        return pg_why_handle(pg, h);
    struct pg_seq *s = &pg->seqs[slot1 - 1];
    if (!s->live || s->gen != gen)
        return pg_why_handle(pg, h);
    *out = s;
    return 0;
}

/* New page descriptor in the device tier holding frame f (refs 1). */
pg_page_id page_new(struct paging *pg, pg_frame_id frame);
/* The same, held by one non-resident holder (refs 1, offs 1): an imported sequence's page
   before the swap-in maps it (handoff.c). */
pg_page_id page_new_off(struct paging *pg, pg_frame_id frame);
/* New page descriptor in the host tier holding host slot `slot`, held by one non-resident
   holder (refs 1, offs 1): a non-resident share's copy of a partial page (share.c). A free
   descriptor must exist (the caller checked). */
pg_page_id page_new_host(struct paging *pg, pg_slot slot);
void page_get(struct paging *pg, pg_page_id page);
/* Drops one reference; at zero the frame returns to the ready list, the descriptor is freed. */
void page_put(struct paging *pg, pg_page_id page);
/* Drops the reference of a non-resident holder (page_get_off's undo: offs and refs). */
void page_put_off(struct paging *pg, pg_page_id page);
static inline struct pg_page *page_at(struct paging *pg, pg_page_id id)
{
    return &pg->pd.pages[id.v - 1];
}
static inline struct pg_frame *frame_at(struct paging *pg, pg_frame_id id)
{
    return &pg->fr.frames[id.v - 1];
}
static inline vmm_handle page_handle(struct paging *pg, pg_page_id page)
{
    return frame_at(pg, page_at(pg, page)->frame)->h;
}
/* A device page held only by non-resident holders: no window maps it (orphan.c). */
static inline bool page_orphan(const struct pg_page *p)
{
    return p->tier == PG_TIER_DEVICE && p->refs && p->refs == p->offs && p->offs > p->ents;
}
/* A HOST page (its holders are non-resident sequences, entries, or both): a spill can write
   it out, a sequence's (paging_spill_seq) or, for pages only entries hold, the entries'
   owner's (paging_held_spill). */
static inline bool page_host_held(const struct pg_page *p)
{
    return p->tier == PG_TIER_HOST && p->refs;
}
/* A HOST page that only holders outside sequences keep: no sequence's spill writes it, the
   holders' owner's does (paging_held_spill). */
static inline bool page_held_only_host(const struct pg_page *p)
{
    return page_host_held(p) && p->refs == p->ents;
}
/* Keeps the counts of HOST pages and orphans at the page's state transitions, so no query
   walks the descriptors: page_count(pg, p, -1) before a change of p's refs, offs or tier,
   page_count(pg, p, +1) after (the checker recounts both). */
static inline void page_count(struct paging *pg, const struct pg_page *p, int d)
{
    if (page_host_held(p))
        pg->pd.n_host_pages += (uint32_t)d;
    if (page_held_only_host(p))
        pg->pd.n_held_host += (uint32_t)d;
    if (page_orphan(p))
        pg->pd.n_orphans += (uint32_t)d;
}
/* One more holder of the page among non-resident sequences (a reference it maps nothing
   with: fork or share of a non-resident sequence). */
static inline void page_get_off(struct paging *pg, pg_page_id id)
{
    struct pg_page *p = page_at(pg, id);
    pg->room_gen++;                     /* a page shared now: no room fact holds */
    page_count(pg, p, -1);
    p->refs++;
    p->offs++;
    page_count(pg, p, 1);
}
/* The tiers below the device (paging.h): whether tier t is there, its free slots (0 when
   absent), and its slots and transfers (ops, through these only). */
static inline bool lower_on(const struct paging *pg, unsigned t)
{
    return pg->xf.lower[t].ops.alloc != NULL;
}
static inline size_t lower_room(const struct paging *pg, unsigned t)
{
    return lower_on(pg, t) ? pg->xf.lower[t].ops.room(pg->xf.lower[t].ops.arg) : 0;
}
static inline int lower_alloc(struct paging *pg, unsigned t, pg_slot hint, pg_slot *slot)
{
    return pg->xf.lower[t].ops.alloc(pg->xf.lower[t].ops.arg, hint, slot);
}
static inline void lower_free(struct paging *pg, unsigned t, pg_slot slot)
{
    pg->xf.lower[t].ops.free(pg->xf.lower[t].ops.arg, slot);
}
static inline void *lower_ptr(struct paging *pg, unsigned t, pg_slot slot)
{
    return pg->xf.lower[t].ops.ptr(pg->xf.lower[t].ops.arg, slot);
}
/* An I/O tier's transfer of page id between its slot and buf (write: put, else get). */
static inline int lower_io(struct paging *pg, unsigned t, bool write, pg_slot slot, void *buf,
                           pg_page_id id)
{
    const struct pg_tier_ops *o = &pg->xf.lower[t].ops;
    return (write ? o->put : o->get)(o->arg, slot, buf, id);
}
/* The page states below the device (enum pg_tier) as the list sees them. lower_of: the
   tier a state rests in (HOST, DISK), else -1. lower_moving: the tier whose transfer a
   state is, between it and the tier above (TO_HOST, TO_DEVICE: the host tier's; TO_DISK,
   FROM_DISK: the disk tier's), else -1. lower_slots: the tiers whose slot a page in the
   state holds, a bit per tier. */
static inline int lower_of(uint8_t tier)
{
    return tier == PG_TIER_HOST ? PG_LOWER_HOST : tier == PG_TIER_DISK ? PG_LOWER_DISK : -1;
}
static inline int lower_moving(uint8_t tier)
{
    switch (tier) {
    case PG_TIER_TO_HOST: case PG_TIER_TO_DEVICE:  return PG_LOWER_HOST;
    case PG_TIER_TO_DISK: case PG_TIER_FROM_DISK:  return PG_LOWER_DISK;
    default:                                       return -1;
    }
}
static inline unsigned lower_slots(uint8_t tier)
{
    const unsigned h = 1u << PG_LOWER_HOST, d = 1u << PG_LOWER_DISK;
    switch (tier) {
    case PG_TIER_HOST: case PG_TIER_TO_HOST: case PG_TIER_TO_DEVICE:  return h;
    case PG_TIER_DISK:                                                return d;
    case PG_TIER_TO_DISK: case PG_TIER_FROM_DISK:                     return h | d;
    default:                                                          return 0;
    }
}
/* The page state machine (enum pg_tier): the moves a page's tier may make, a bit per
   destination. A new descriptor becomes a device page (page_new) or a host one (share of a
   non-resident partial page); a page is freed (NONE) only at rest, never in flight; a move
   in flight ends where it was going, or (a failed spill write or read back) where it was. */
static inline bool page_tier_edge(uint8_t from, uint8_t to)
{
#define PG_T(t) (1u << (t))
    unsigned next;
    switch (from) {
    case PG_TIER_NONE:      next = PG_T(PG_TIER_DEVICE) | PG_T(PG_TIER_HOST); break;
    case PG_TIER_DEVICE:    next = PG_T(PG_TIER_NONE) | PG_T(PG_TIER_TO_HOST) |
                                   PG_T(PG_TIER_HOST) | PG_T(PG_TIER_DISK); break;
    case PG_TIER_HOST:      next = PG_T(PG_TIER_NONE) | PG_T(PG_TIER_TO_DEVICE) |
                                   PG_T(PG_TIER_DEVICE) | PG_T(PG_TIER_TO_DISK); break;
    case PG_TIER_DISK:      next = PG_T(PG_TIER_NONE) | PG_T(PG_TIER_FROM_DISK) |
                                   PG_T(PG_TIER_DEVICE); break;
    case PG_TIER_TO_HOST:   next = PG_T(PG_TIER_HOST); break;
    case PG_TIER_TO_DEVICE: next = PG_T(PG_TIER_DEVICE); break;
    case PG_TIER_TO_DISK:   next = PG_T(PG_TIER_DISK) | PG_T(PG_TIER_HOST); break;
    case PG_TIER_FROM_DISK: next = PG_T(PG_TIER_HOST) | PG_T(PG_TIER_DISK); break;
    default:                next = 0; break;
    }
    return (next & PG_T(to)) != 0;
#undef PG_T
}
/* The one writer of a page's tier: asserts (debug build) the move is an edge above. */
static inline void page_set_tier(struct pg_page *p, uint8_t to)
{
    KVVM_ASSERT(page_tier_edge(p->tier, to));
    p->tier = to;
}
/* A page holds no slot of any tier below (PG_SLOT_NONE: page_take_slot asserts it). */
static inline void page_slots_none(struct pg_page *p)
{
    for (unsigned t = 0; t < PG_N_LOWER; t++)
        p->slot[t] = PG_SLOT_NONE;
}
/* The page takes slot s of tier t (counted in the tier's n_slots): a slot of a tier that is
   there, and the page held none of it. */
static inline void page_take_slot(struct paging *pg, struct pg_page *p, unsigned t, pg_slot s)
{
    KVVM_ASSERT(lower_on(pg, t) && !pg_slot_is_none(s) && pg_slot_is_none(p->slot[t]));
    p->slot[t] = s;
    pg->xf.lower[t].n_slots++;
}
/* Frees the page's slot in tier t and its count there; the page's tier is the caller's
   (it still is one holding a slot of t: the slot given back is the one it took). */
static inline void page_release_slot(struct paging *pg, struct pg_page *p, unsigned t)
{
    KVVM_ASSERT(!pg_slot_is_none(p->slot[t]) && (lower_slots(p->tier) & (1u << t)) &&
                pg->xf.lower[t].n_slots > 0);
    lower_free(pg, t, p->slot[t]);
    p->slot[t] = PG_SLOT_NONE;
    pg->xf.lower[t].n_slots--;
}
/* The end of a move between tier t and the one above (n_io, lower_moving). */
static inline void lower_io_done(struct paging *pg, unsigned t)
{
    KVVM_ASSERT(pg->xf.lower[t].n_io > 0);
    pg->xf.lower[t].n_io--;
}
/* The page leaves its frame, which returns to the ready list (the tier is the caller's). */
static inline void page_frame_drop(struct paging *pg, struct pg_page *p)
{
    pg_frame_id f = p->frame;
    KVVM_ASSERT(!pg_frame_is_none(f) &&
                pg_page_eq(frame_at(pg, f)->page,
                           (pg_page_id){ (uint32_t)(p - pg->pd.pages) + 1 }));
    p->frame = PG_FRAME_NONE;
    p->ext = 0;
    frame_at(pg, f)->page = PG_PAGE_NONE;
    pool_give(pg, &f, 1);
}
/* Page id takes frame f (already FR_USED). Typed: a page id and a frame id cannot be
   swapped silently. */
static inline void page_frame_set(struct paging *pg, pg_page_id id, pg_frame_id f)
{
    KVVM_ASSERT(frame_at(pg, f)->state == FR_USED && pg_page_is_none(frame_at(pg, f)->page) &&
                pg_frame_is_none(page_at(pg, id)->frame));
    page_at(pg, id)->frame = f;
    page_at(pg, id)->ext = frame_at(pg, f)->ext;
    frame_at(pg, f)->page = id;
}

/* window.c (the seq_ prefix: they map a sequence's pages) */
int  seq_map_pages(struct paging *pg, uint32_t slot, uint32_t r, uint32_t first,
                   const pg_page_id *pages, uint32_t n);
int  seq_map_frames(struct paging *pg, uint64_t va, const pg_frame_id *frames, uint32_t n);
int  seq_unmap(struct paging *pg, uint64_t va, uint32_t n);
void seq_unmap_must(struct paging *pg, uint64_t va, uint32_t n);
/* Unmaps the pages at va + i * page_size for the i < n with ids[i] not PG_PAGE_NONE (holes
   are not mapped), one unmap per run. The first run's unmap may fail cleanly (returned,
   nothing unmapped); a later one is retried and logged (_must: every failure is). The
   _frames variants do the same over frame ids (PG_FRAME_NONE: a hole). */
int  seq_unmap_holes(struct paging *pg, uint64_t va, const pg_page_id *ids, uint32_t n);
void seq_unmap_holes_must(struct paging *pg, uint64_t va, const pg_page_id *ids, uint32_t n);
int  seq_unmap_frames(struct paging *pg, uint64_t va, const pg_frame_id *fr, uint32_t n);
void seq_unmap_frames_must(struct paging *pg, uint64_t va, const pg_frame_id *fr, uint32_t n);
/* seq.c */
void seq_drop_ahead(struct paging *pg, struct pg_seq *s, uint32_t keep);
/* Steals one layer (n_regions frames) of map-ahead from some sequence other than `except`;
   the frames go to the ready list. -ENOMEM none. */
/* s's map-ahead counts as free (paging_frames_free and the need functions count it) but
   pool_take_except(s) cannot take it: when the pool without it cannot supply n frames,
   gives back s's map-ahead frames beyond the first keep per region (seq_drop_ahead). */
void seq_ahead_yield(struct paging *pg, struct pg_seq *s, uint32_t keep, uint32_t n);
int  seq_steal_ahead(struct paging *pg, struct pg_seq *except);
/* Unmaps every sequence's map-ahead and breaks the pool view's prepared groups. */
void seq_drop_all_ahead(struct paging *pg);
/* Maps ready frames ahead of s's end on the caller's thread, in batches between two marks
   (seq_ahead_deficit). Best effort. */
void seq_top_up_ahead(struct paging *pg, struct pg_seq *s);
/* Frames a grow_batch of ss[i] to lengths[i] takes from the pool (lengths below the
   current one count nothing): new pages, and the holes and shared copies of the partial
   last pages, a page shared by k members copied min(k, sharers - 1) times. -ENOMEM. */
int  seq_batch_frames(struct paging *pg, struct pg_seq *const *ss, const uint64_t *lengths,
                      size_t n, uint64_t *frames);
/* Block tables (bt, and bid with the pool view) with room for n_pages entries per region:
   grown by doubling (capped at pages_per_slot), entries beyond n_pages zero. Called before
   a call's point of no return wherever n_pages may grow. 0, or -ENOMEM with nothing
   changed. */
int  seq_bt_reserve(struct paging *pg, struct pg_seq *s, uint64_t n_pages);
/* Every write of s->out goes through here, so the count of non-resident sequences
   (paging_counters' nonresident) is kept, not walked for (the checker recounts it). Only a
   live sequence is non-resident: seq free clears out before the slot is let go. */
/* A slot's lifecycle: FREE (on the free list) -> LIVE (seq_slot_take) -> FREE (freed with
   no release pending over its window, or the take undone), or LIVE -> DYING (freed with
   releases pending) -> FREE (its last release completed). seq_set_life is the one writer
   of live and dying and of the counts n_live, n_dying; the debug build asserts each move
   is one of these, that a slot leaves LIVE resident and is FREE with nothing pending. */
enum pg_seq_life { SEQ_FREE = 0, SEQ_LIVE, SEQ_DYING };
static inline enum pg_seq_life seq_life(const struct pg_seq *s)
{
    KVVM_ASSERT(!(s->live && s->dying));
    return s->dying ? SEQ_DYING : s->live ? SEQ_LIVE : SEQ_FREE;
}
static inline void seq_set_life(struct paging *pg, struct pg_seq *s, enum pg_seq_life to)
{
    enum pg_seq_life from = seq_life(s);
    KVVM_ASSERT(to == SEQ_LIVE ? from == SEQ_FREE
                               : from == SEQ_LIVE || (from == SEQ_DYING && to == SEQ_FREE));
    KVVM_ASSERT(to == SEQ_LIVE || !s->out);
    KVVM_ASSERT(to != SEQ_FREE || !s->n_defer);
    KVVM_ASSERT(to != SEQ_DYING || s->n_defer);
    KVVM_ASSERT(from != SEQ_LIVE || pg->sq.n_live > 0);
    KVVM_ASSERT(from != SEQ_DYING || pg->sq.n_dying > 0);
    pg->sq.n_live += (to == SEQ_LIVE) - (from == SEQ_LIVE);
    pg->sq.n_dying += (to == SEQ_DYING) - (from == SEQ_DYING);
    s->live = to == SEQ_LIVE;
    s->dying = to == SEQ_DYING;
}
/* s changed in a way that may break its room fact (pg_seq.room): swapped, truncated, a
   page discarded, dropped, a slot taken. */
static inline void seq_room_void(struct pg_seq *s)
{
    s->room_gen = 0;
}
/* The slot of s, whose last pending entry is done (or that had none), becomes FREE and
   goes back to the slot list (seq.c and defer.c call it). */
static inline void seq_slot_release(struct paging *pg, struct pg_seq *s)
{
    seq_set_life(pg, s, SEQ_FREE);
    s->length = 0;
    s->n_pages = 0;
    s->used_valid = 0;
    s->next_free = pg->sq.slot_free_head;
    pg->sq.slot_free_head = pg_slot_of(pg, s) + 1;
}
static inline void seq_set_out(struct paging *pg, struct pg_seq *s, bool out)
{
    KVVM_ASSERT(s->live || !out);       /* only a live sequence is non-resident */
    KVVM_ASSERT(!s->out || out || pg->sq.n_out > 0);
    seq_room_void(s);
    if (s->out && !out)
        pg->sq.n_out--;
    else if (!s->out && out)
        pg->sq.n_out++;
    s->out = out;
}
static inline void seq_use(struct paging *pg, struct pg_seq *s)
{
    paging_hot_use(&pg->hot, &s->hot);
}

/* tier.c */
/* Device pages held only by non-resident sequences. */
uint32_t tier_orphans(const struct paging *pg);
/* orphan.c: copies DEVICE page id, which no window maps and no device work may touch, to a
   new host slot through the scratch page (making host room with the policy when a disk
   tier exists), synchronously on the copy stream; all or nothing. -ENOMEM, -EIO. */
int  tier_page_down(struct paging *pg, pg_page_id id);
/* Drops the non-resident entries [first, end) of s (offs and references). */
void tier_drop_out(struct paging *pg, struct pg_seq *s, uint32_t first, uint32_t end);
/* The steps the swap paths (tier_out.c, tier_in.c, orphan.c) share. */
struct pg_defer *tier_job_new(struct paging *pg, struct pg_seq *s, uint8_t kind, uint32_t n);
/* Takes the job's references; complete: done now (sync mode), else pending on its fence. */
void tier_job_start(struct paging *pg, struct pg_seq *s, struct pg_defer *d, bool complete);
/* Creates and records d's fence on the copy stream (nothing left on failure). -EIO. */
int  tier_job_fence(struct paging *pg, struct pg_defer *d);
/* Waits for the transfers on s's window and for swap-outs of its pages still in flight. */
int  tier_wait_transfers(struct paging *pg, struct pg_seq *s);
/* Waits for and reaps every transfer job; releases stay pending. */
int  tier_wait_all_jobs(struct paging *pg);
/* n slots of tier t below the device, all or nothing (-ENOMEM), each clustered after the
   one before (the first after the tier's hint; a memory tier ignores hints); and back. */
int  lower_take(struct paging *pg, unsigned t, uint32_t n, pg_slot *out);
void lower_give(struct paging *pg, unsigned t, const pg_slot *s, uint32_t n);
/* One page copy on the copy stream between host slot and device address va. */
int  tier_copy_out(struct paging *pg, pg_slot hslot, uint64_t va);
int  tier_copy_in(struct paging *pg, uint64_t va, pg_slot hslot);
/* Waits for the copy stream after copies enqueued with result rc (never returns while a
   copy may still run: safe to unmap); rc, else the wait's error. */
int  tier_copy_finish(struct paging *pg, int rc);
/* Enqueues the host -> device copy of every HOST page of s into its window. -EIO. */
int  tier_copy_host_in(struct paging *pg, struct pg_seq *s);
/* Entries of s in tier t. */
uint32_t tier_count(struct paging *pg, struct pg_seq *s, uint8_t tier);
/* The frame per window page of s (region-major, n_regions * n_pages): the page's own, or the
   next of fresh for a HOST page (and a DISK page if disk). */
void tier_window_frames(struct paging *pg, struct pg_seq *s, const pg_frame_id *fresh,
                        bool disk, pg_frame_id *fr);
/* Maps fr at window pages [0, np) of slot in every region; all or nothing. */
int  tier_map_window(struct paging *pg, uint32_t slot, uint32_t np, const pg_frame_id *fr);
/* The page's plan state (plan.c), reset when it is first seen in the current walk. */
struct pg_page *plan_page(struct paging *pg, pg_page_id id);
/* Starts a new walk of the pages' scratch marks (pg->xf.mark): every page's mark is stale. */
void tier_mark_begin(struct paging *pg);
/* Marks (in the current walk) every page the sequences keep[0..n) hold as kept. Returns how
   many of them are orphans. */
uint32_t tier_mark_kept(struct paging *pg, const uint64_t *keep, size_t n);
/* Unmaps [0, np) of slot in regions [0, nr) (must succeed). */
void tier_unmap_window_must(struct paging *pg, uint32_t slot, uint32_t np,
                            const pg_frame_id *fr, uint32_t nr);
/* Unmaps [0, np) of slot in every region: the first may fail (nothing changed), not the rest. */
int  tier_unmap_window(struct paging *pg, struct pg_seq *s);
/* Residency flips of a committed swap (the pages' offs are the caller's). */
void tier_seq_out(struct paging *pg, struct pg_seq *s);
void tier_seq_in(struct paging *pg, struct pg_seq *s);
/* A staged swap-in of s finds no host slot to stage through and none can be made: no free
   slot, no spill write in flight to free one, no host page of another that could be spilled
   (or no disk slot for it). It then borrows a host page's slot, parking its bytes in a
   spare device frame (paging_need counts that frame). */
bool tier_stage_must_borrow(struct paging *pg, struct pg_seq *s);
/* The room facts for a swap of need pages of s (tier_plan asks the policy with them). */
void tier_room(struct paging *pg, struct pg_seq *s, uint32_t need, struct pg_room *r);
/* The policy's choice for a swap with room r (no policy: direct for a swap-in, -ENOMEM for
   a swap-out). */
int  tier_plan(struct paging *pg, bool in, const struct pg_room *r);
/* Whether s's entry for page p is the last mapping of it (so leaving moves it down). */
static inline bool page_moves_down(const struct pg_page *p)
{
    return p->tier == PG_TIER_DEVICE && p->refs - p->offs == 1;
}
/* Holders that see the page's bytes (transfer jobs excluded; copies out, DF_COPY, included:
   their bytes are those of the copy's start): > 1 means shared. */
static inline uint32_t page_sharers(const struct pg_page *p)
{
    return p->refs - p->jobs + p->ext;
}
/* The page has a device frame (DEVICE, TO_HOST, TO_DEVICE). */
static inline bool page_has_frame(const struct pg_page *p)
{
    return p->tier == PG_TIER_DEVICE || p->tier == PG_TIER_TO_HOST ||
           p->tier == PG_TIER_TO_DEVICE;
}

/* tier_disk.c: the moves between the host and disk tiers */
/* Brings the DISK pages among ids[0..n) to the host tier (reads, waits, verifies); waits for
   pages TO_DISK first. excl: a sequence whose host pages must not be spilled for room.
   -EBADMSG a page is damaged, -ENOMEM no host room. */
int  tier_disk_unspill(struct paging *pg, const pg_page_id *ids, uint32_t n, struct pg_seq *excl);
/* Staged I/O: transfers page ids[i] between disk slot dslots[i] and host slot hslots[i]
   (write: host -> disk) for i < n, and waits for all of it. The pages keep their tier; the
   slots stay the caller's. 0, or the first error (submission or completion: -EIO, -EBADMSG,
   ...). A failed write disables spilling (as any spill write); a failed read marks the page
   damaged (as any read back). */
int  tier_disk_stage_io(struct paging *pg, bool write, const pg_page_id *ids,
                   const pg_slot *dslots, const pg_slot *hslots, uint32_t n);
/* Distinct HOST pages a spill could write out for room (0 when spilling is off), never
   pages excl holds. */
uint32_t tier_disk_spillable(struct paging *pg, struct pg_seq *excl);
/* Waits for the disk I/O in flight when a page of ids[0..n) has some (then reaped). */
void tier_disk_settle(struct paging *pg, const pg_page_id *ids, uint32_t n);
/* The one damaged-page check: -EBADMSG when a DISK page of ids[0..n) is damaged, else 0
   with *ndisk the DISK pages among them. */
int  tier_disk_damaged(struct paging *pg, const pg_page_id *ids, uint32_t n, uint32_t *ndisk);
static inline bool page_in_dio(const struct pg_page *p)
{
    return p->tier == PG_TIER_TO_DISK || p->tier == PG_TIER_FROM_DISK;
}

/* step.c */
/* Synchronizes the device; every epoch so far is quiet. */
int  pg_device_sync(struct paging *pg);
/* The copy stream (the swap paths' copies; made on first use). -EIO */
int  tier_copy_stream(struct paging *pg);
/* Orders the copy stream after the engine's work that may touch s's pages (NULL: any). */
int  tier_copies_after_engine(struct paging *pg, const struct pg_seq *s);

/* defer.c */
/* Orders the engine after a prefetch of s (stream: a wait on the engine stream; sync: waits
   for the copies). Every call that uses s's bytes or window calls it first. Only the
   engine's own calls do (it enqueues on the engine stream): the library's threads never
   reach it, their victims have no pending swap-in (paging_candidates). */
int  seq_settle(struct paging *pg, struct pg_seq *s);
/* No device work may touch s's window any more, known without synchronizing anything:
   never used, or used before an epoch known complete (quiet_below), and no swap copy of
   the library's on it still running. */
bool seq_quiet(struct paging *pg, struct pg_seq *s);
/* Releases window pages [first, end) of every region of s (unmap + page_put), now if no
   device work may touch them, else after a fence recorded now on the engine stream (the
   pending release then holds the slot's window: the slot of a freed sequence is reused only
   after it). The block table entries are the caller's to clear. -ENOMEM, -EIO (nothing
   changed then). */
int  defer_release(struct paging *pg, struct pg_seq *s, uint32_t first, uint32_t end);
/* As defer_release, for one region (UINT32_MAX: every region; block-table holes,
   PG_PAGE_NONE, are skipped). lib: the caller may be a library thread and s is not
   protected: a fence is recorded on the copy stream after the step fence, never on the
   engine stream (-EBUSY when there is none to order after). */
int  defer_release_region(struct paging *pg, struct pg_seq *s, uint32_t region, uint32_t first,
                          uint32_t end, bool lib);
/* Accounts entry d (references taken) to s's window and adds it to the pending list;
   complete: completes it now instead (kept pending when that fails). */
void defer_add(struct paging *pg, struct pg_seq *s, struct pg_defer *d, bool complete);
/* Completes a pending entry whose fence completed and frees it (unlinked by the caller). */
int  defer_complete(struct paging *pg, struct pg_defer *d);
/* Reaps completed releases (wait: waits for all first). */
int  defer_reap(struct paging *pg, bool wait);
/* The copy run (paging_params.copy_base): a free block of it for a copy out (DF_COPY),
   reaping completed copies when none is free; -EAGAIN none (nothing changed). Its address;
   giving one back (its pages unmapped); queuing a DF_COPY job (its references taken, its
   fence recorded), which gives the block back at its completion. */
int  defer_copy_run_take(struct paging *pg, uint32_t *run);
void defer_copy_run_give(struct paging *pg, uint32_t run);
static inline uint64_t pg_copy_va(const struct paging *pg, uint32_t run)
{
    return pg->p.copy_base + (uint64_t)run * pg->p.n_regions * pg->p.page_size;
}
void defer_copy_add(struct paging *pg, struct pg_defer *d);
/* paging_destroy, after the device was synchronized and a reap: frees every entry still
   pending (a dead context cannot ask its fences; or an unmap was refused), unmapping best
   effort (not at all on a dead context), so no host memory is left behind. */
void defer_drop_all(struct paging *pg);
/* Waits for and reaps the transfer jobs (DF_OUT / DF_IN) of slot; releases stay pending. */
int  defer_flush_jobs(struct paging *pg, uint32_t slot);
/* Waits for and reaps the releases over slot's window. */
int  defer_flush_slot(struct paging *pg, uint32_t slot);
/* As defer_flush_slot, unless every pending entry of slot is a release lying wholly below
   page index idx (a discard's, which a grow from idx never maps again): then no wait. */
int  defer_flush_slot_from(struct paging *pg, uint32_t slot, uint32_t idx);
/* Makes copies that read pages see the engine's earlier work (sync mode: device sync). */
int  pg_order_before_copy(struct paging *pg);
/* As pg_order_before_copy for a copy of pages [i0, i1) of region r of s: no device sync
   when no device work may touch them any more (s quiet, the rule of defer.c's file comment,
   and each page held by s alone: a page's former holders synchronized when they let it go). */
int  pg_order_before_copy_seq(struct paging *pg, struct pg_seq *s, uint32_t r, uint32_t i0,
                              uint32_t i1);
/* Sync mode: waits for copies just enqueued. */
int  pg_finish_copy(struct paging *pg);
/* Waits until device work enqueued so far that may touch the window is done. */
int  pg_wait_engine(struct paging *pg);

/* discard.c */
/* After a truncate: first_kept of every region at most the new length. */
void seq_clamp_kept(struct paging *pg, struct pg_seq *s);

/* cow.c: copy-on-write over regions [r0, r1) x page indices [i0, i1) of s. */
struct cow_undo {
    uint32_t n, cap;
    struct cow_rec { uint32_t r, idx; pg_page_id old_page; } *rec;
};
/* Shared pages (refs > 1) in the range. */
uint32_t cow_needed(struct paging *pg, struct pg_seq *s, uint32_t r0, uint32_t r1,
                    uint32_t i0, uint32_t i1);
/* Copies every shared page of the range; all or nothing. u (zeroed by the caller) records
   what was done so cow_undo can revert it; cow_commit frees the record. -ENOMEM, -EIO. */
int  cow_range(struct paging *pg, struct pg_seq *s, uint32_t r0, uint32_t r1, uint32_t i0,
               uint32_t i1, struct cow_undo *u);
void cow_undo(struct paging *pg, struct pg_seq *s, struct cow_undo *u);
void cow_commit(struct paging *pg, struct cow_undo *u);

/* seq.c, for share.c: a free slot for a new sequence (-ENOSPC none; waits for a dying slot's
   releases when that frees one) and its undo; whether the pool can supply n frames now
   (waiting for pending releases if that helps; -ENOMEM). */
int  seq_slot_take(struct paging *pg, struct pg_seq **out);
void seq_slot_untake(struct paging *pg, struct pg_seq *s);
int  pool_reserve_check(struct paging *pg, uint32_t n);

#endif
