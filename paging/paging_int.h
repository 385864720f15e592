/*
 * paging/paging_int.h: the paging layer's private basics, shared by its .c files only:
 * the data (pg_types.h), refusal notes (pg_why_*), addresses, the block-table walk, handle
 * lookup, and the read-only views of a page's state. Every paging .c includes it, then
 * the headers of the owners whose functions it uses (and only those): frames.h, seqs.h,
 * ahead.h, transfers.h, clock.h, view.h, window.h.
 *
 *
 *   paging.c the paging context: create / destroy, counters; the frame pool thread's round
 *   pool.c   frames (physical handles: create ahead, ready list, take/give) and page
 *            descriptors (identity, refcount, tier, location; O(1) free list)
 *   step.c   the epoch clock and the streams: step (the step fence), sync, set_stream; the
 *            copy stream and its ordering after the engine
 *   defer.c  releases and transfer jobs that wait for a fence, their completion; quietness
 *            of a sequence; a prefetch's settle; copy ordering
 *   seq.c    slots, handles, block tables, map-ahead; grow, free, info
 *   ahead.c  map-ahead refilled by the frame pool thread (queue, plan, map, commit)
 *   window.c a slot's window address; mapping and unmapping frames in it by runs
 *   seq_share.c  truncate, fork, share (sequences sharing pages)
 *   cow.c    copy-on-write, prepare_write, write/read
 *   discard.c  discard, first_kept, the classes (set, drop, demote, cached candidates)
 *   check.c  the invariant checker (against the driver's tables through vmm's debug calls)
 *   host_tier.c   the host tier's shared steps: transfer jobs, host slots, window mapping and
 *            copies of the swap paths; the bridge to the policy (room facts)
 *   resident.c  residency queries (ready, need, stage facts, candidates, counts)
 *   host_out.c  sequence swap-out (direct, or staged through the host tier to disk)
 *   host_in.c   sequence swap-in (direct, or staged from disk through the host tier)
 *   orphan.c the orphan pages (device pages no resident sequence maps) and their move down
 *   disk_tier.c  the disk tier's mechanism: page writes and reads, their completions,
 *            damage (paging_disk_*; disk/ is the disk tier's own layer, disk_* its API)
 *   hold.c   holders outside sequences (the prefix cache's entries): their references,
 *            a sequence adopting held pages, their part of a reclaim plan
 *   view.c   the pool view (KVVM_F_POOL_VIEW): block ids, their mappings, their graveyard
 *   plan_marks.c   the reclaim plan's page marks (what a victim frees, the slots it takes)
 *   park.c   a call's reclaim moves as one operation each (move, back, orphan back), and
 *            its reclaim drop kept for its undo (parked frames, watched)
 * The owners: groups of the files above, each calling only the owners below it (the call
 * graph between owners has no cycle; scripts/paging-owners.py checks it from the objects,
 * the CTest paging_owners; inline functions of the headers are no calls). Top first; one
 * line each, parsed by the script:
 *   owner context: paging.c check.c
 *   owner seqs: seq.c seq_share.c cow.c discard.c hold.c resident.c park.c handoff.c
 *   owner transfers: host_tier.c host_in.c host_out.c disk_tier.c orphan.c plan_marks.c
 *   owner clock: step.c defer.c view.c
 *   owner frames: pool.c ahead.c
 *   owner window: window.c
 * The calls upward the graph allows, each named (the script takes them out of the cycle
 * check, and fails when one is no longer made: the list stays true). Map-ahead frames are
 * the frames owner's (ahead.c), but two holders of frames mapped ahead sit elsewhere:
 *   allow frames -> clock: view_break_group view_break_all
 *     the pool view's prepared groups (view.c) are frames mapped ahead too: a pool short
 *     of frames, or dropping every map-ahead, breaks them back into ready frames
 *   allow window -> frames: ahead_meet_va
 *     a window mapping meeting the range of a pool thread's refill in flight waits for it
 *     and undoes it (only while pg->ahq.busy), which unmaps through the window again
 * The parts of struct paging (members of pg->) each owner writes; a write to another
 * owner's part from a .c file (pg->part... = / op= / ++ / --, directly or through a
 * pointer to the part taken in that file) fails paging_owners too. paging.c writes any
 * at create and destroy; the elements of the descriptor arrays (pd.pages[i]: a page's
 * fields have their own writers, listed at struct pg_pages) are not parts' fields:
 *   part frames: fr pd ahq
 *   part seqs: sq wt
 *   part transfers: xf sp
 *   part clock: ck df view
 *   writes any: paging.c
 * struct paging is split the same way: one part per owner's state, each named with its
 * owner file and the functions other files change it through (pg_types.h, "struct
 * paging's parts"): fr and pd (pool.c), ck (step.c), df (defer.c), view (view.c), xf (host_tier.c), sp
 * (disk_tier.c), sq (seq.c), ahq (ahead.c). Reads are free; writes go through the owner.
 * No hooks: an owner calls another directly, so the graph shows every call.
 */
#ifndef KVVM_PAGING_PAGING_INT_H
#define KVVM_PAGING_PAGING_INT_H

#include <errno.h>
#include "common/assert.h"
#include "pg_types.h"

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
    (void)pg;
    return s->ahead ? s->ahead + (size_t)r * s->ahead_cap : NULL;
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
   it out, a sequence's (paging_disk_spill_seq) or, for pages only entries hold, the entries'
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
static inline bool page_in_dio(const struct pg_page *p)
{
    return p->tier == PG_TIER_TO_DISK || p->tier == PG_TIER_FROM_DISK;
}

#endif
