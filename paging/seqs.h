/*
 * paging/seqs.h: the owner seqs' functions for the rest of paging/ (seq.c, discard.c,
 * cow.c, park.c; ahead.c's are in ahead.h): slots and their lifecycle, residency, block
 * tables, map-ahead, copy-on-write. Its part of struct paging (sq; the watch, wt) is in
 * pg_types.h; the lifecycle and residency counts change only through the inlines here.
 */
#ifndef KVVM_PAGING_SEQS_H
#define KVVM_PAGING_SEQS_H

#include "paging_int.h"

/* seq.c */
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

/* discard.c */
/* After a truncate: first_kept of every region at most the new length. */
void discard_clamp_kept(struct paging *pg, struct pg_seq *s);
/* A call's reclaim moves of CACHED s (paging_reclaim_move, park.c). paging_seq_stash: the
   stash's swap-out (async) when the host tier's free slots take s's device pages as they are
   (no other page moves for it), counted as no swap-out; -ENOSPC no room as it is (or
   non-resident, no host tier), else paging_swap_out's errors. paging_seq_stash_slots: the
   host slots the stash would take now (*slots): s's device pages that go down with it
   (those another resident holder keeps stay on the device); -ENOENT, -EINVAL not CACHED or
   dropped, -ENOSPC not stashable as it is (non-resident, no host tier, or a page it shares
   with non-resident holders would go down with it). paging_seq_demote: paging_swap_out
   (async), counted as cache_demotes; errors as swap_out. */
int  paging_seq_stash(struct paging *pg, uint64_t h);
int  paging_seq_stash_slots(struct paging *pg, uint64_t h, uint32_t *slots);
int  paging_seq_demote(struct paging *pg, uint64_t h);
/* The class of s, or -ENOENT (the candidates carry theirs: struct pg_cand). */
int  paging_seq_class(struct paging *pg, uint64_t h);

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

/* seq.c, for seq_share.c: a free slot for a new sequence (-ENOSPC none; waits for a dying slot's
   releases when that frees one) and its undo; whether the pool can supply n frames now
   (waiting for pending releases if that helps; -ENOMEM). */
int  seq_slot_take(struct paging *pg, struct pg_seq **out);
void seq_slot_untake(struct paging *pg, struct pg_seq *s);
int  pool_reserve_check(struct paging *pg, uint32_t n);

/* resident.c: what the swap-in of non-resident h needs of the tiers below: *disk its pages
   on disk (or with disk I/O in flight: read back first), *borrow its staged swap-in borrows
   a host slot (no free one, and none to be had by a spill: the frame it parks in is in
   paging_need's count). Both false for a resident one. -ENOENT. */
int  paging_seq_stage_facts(struct paging *pg, uint64_t h, bool *disk, bool *borrow);

/* resident.c: orphan pages (device pages held only by non-resident sequences). O(1):
   counted at the page transitions. */
uint32_t paging_orphans(const struct paging *pg);

/* park.c */
/* Frees a parked drop's record (NULL: nothing). */
void park_free(struct pg_park *k);
/* Frees the watch's arrays (paging_destroy). */
void park_fini(struct paging *pg);

/* paging_candidates' lists (discard.c): PG_CAND_CACHED's, up to max; returns how many. */
size_t paging_cached_candidates(struct paging *pg, struct pg_cand *out, size_t max);

/* paging_reclaim_drop's steps (paging.h says what each does): a drop (discard.c) and a
   drop parked for a call's undo (park.c). */
int  paging_seq_drop(struct paging *pg, uint64_t h, bool wait);
int  paging_seq_park(struct paging *pg, uint64_t h, struct pg_park **out);

/* paging_grow's steps (seq.c; paging.h says what each does). */
int paging_seq_grow(struct paging *pg, uint64_t h, uint64_t length);
int paging_seq_grow_in_place(struct paging *pg, uint64_t h, uint64_t length);
int paging_seq_grow_batch_in_place(struct paging *pg, const uint64_t *hs,
                                   const uint64_t *lengths, size_t n);
int paging_seq_grow_batch(struct paging *pg, const uint64_t *hs, const uint64_t *lengths,
                          size_t n);
/* paging_need's count of a share (seq_share.c; paging.h, PG_NEED_SHARE). */
int paging_need_share(struct paging *pg, uint64_t dst, uint64_t src, uint64_t n_tokens,
                      uint32_t *frames);

/* paging_seq_share_frames' and paging_seq_share_mark's steps (handoff.c; paging.h). */
int  paging_seq_handoff_frames(struct paging *pg, uint64_t h, vmm_handle **out, uint32_t *n,
                               uint64_t *length);
void paging_seq_handoff_mark(struct paging *pg, uint64_t h);
int  paging_seq_block_frames(struct paging *pg, uint64_t h, uint32_t nb, vmm_handle **out);
void paging_seq_block_mark(struct paging *pg, uint64_t h, uint32_t nb);

/* paging_seq_share_frames' fence (handoff.c; paging.h, "hand-offs"). */
int  paging_share_fence(struct paging *pg, vmm_fence *f);

/* -ESTALE when s is a dropped sequence, -ENOENT a bad handle, else 0 (discard.c; outside
   paging/, paging_seq_info with PG_INFO_LIVE). */
int  paging_seq_stale(struct paging *pg, uint64_t h);

#endif
