/*
 * paging/transfers.h: the owner transfers' functions for the rest of paging/ (host_tier.c,
 * host_in.c, host_out.c, disk_tier.c, orphan.c, plan_marks.c): the tiers below the device (their
 * ops, a page's slots in them, transfers in flight), the swap paths' shared steps, the
 * reclaim plan's marks, the disk tier's mechanism. Its part of struct paging (xf, sp) is
 * in pg_types.h.
 */
#ifndef KVVM_PAGING_TRANSFERS_H
#define KVVM_PAGING_TRANSFERS_H

#include "paging_int.h"

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

/* host_tier.c */
/* A sequence's use stamp (struct pg_use, paging.h): get -ENOENT; set ignores a bad handle. */
int  paging_seq_use_get(struct paging *pg, uint64_t h, struct pg_use *out);
void paging_seq_use_set(struct paging *pg, uint64_t h, const struct pg_use *u);
/* `want` host slots free: 0 when they are, else the policy's host_room (-ENOMEM without a
   policy or a host tier). */
int  paging_host_room(struct paging *pg, uint32_t want, uint64_t excl);
/* Slots the tiers below the device can still take: free host slots, host slots that
   in-flight spill writes will free, and free disk slots (a page goes to a host slot, or
   through one to disk; spilling a host page trades a disk slot for a host slot). */
uint64_t paging_room_below(struct paging *pg);
/* Device pages held only by non-resident sequences. */
uint32_t tier_orphans(const struct paging *pg);
/* orphan.c: paging_undo_orphan's move (park.c adds the parks' rebase): page id (as
   paging_reclaim_orphans logged it) back from its host slot into a frame of the pool.
   -ESTALE, -ENOMEM, -EIO, nothing changed. */
int  paging_orphan_back(struct paging *pg, uint32_t id);
/* orphan.c: copies DEVICE page id, which no window maps and no device work may touch, to a
   new host slot through the scratch page (making host room with the policy when a disk
   tier exists), synchronously on the copy stream; all or nothing. -ENOMEM, -EIO. */
int  tier_page_down(struct paging *pg, pg_page_id id);
/* Drops the non-resident entries [first, end) of s (offs and references). */
void tier_drop_out(struct paging *pg, struct pg_seq *s, uint32_t first, uint32_t end);
/* The steps the swap paths (host_out.c, host_in.c, orphan.c) share. */
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
/* The page's plan state (plan_marks.c), reset when it is first seen in the current walk. */
struct pg_page *plan_page(struct paging *pg, pg_page_id id);
/* Starts a new walk of the pages' scratch marks (pg->xf.mark): every page's mark is stale. */
void tier_mark_begin(struct paging *pg);
/* Marks (in the current walk) every page the sequences keep[0..n) hold as kept. Returns how
   many of them are orphans. */
uint32_t tier_mark_kept(struct paging *pg, const uint64_t *keep, size_t n);
/* The plan's marks begun (paging_plan_begin, resident.c, around it): the orphan pages the
   plan may move, those no kept sequence holds. */
uint32_t plan_marks_begin(struct paging *pg, const uint64_t *keep, size_t n_keep);
/* The distinct device pages the sequences hs[0..n) hold (bad handles skipped). Uses the
   pages' scratch marks: not within a plan (between paging_plan_begin and its last
   paging_plan_add / paging_plan_remove). */
uint32_t paging_device_pages_of(struct paging *pg, const uint64_t *hs, size_t n);
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

/* disk_tier.c: the moves between the host and disk tiers */
/* Brings the DISK pages among ids[0..n) to the host tier (reads, waits, verifies); waits for
   pages TO_DISK first. excl: a sequence whose host pages must not be spilled for room.
   -EBADMSG a page is damaged, -ENOMEM no host room. */
int  paging_disk_unspill(struct paging *pg, const pg_page_id *ids, uint32_t n, struct pg_seq *excl);
/* Staged I/O: transfers page ids[i] between disk slot dslots[i] and host slot hslots[i]
   (write: host -> disk) for i < n, and waits for all of it. The pages keep their tier; the
   slots stay the caller's. 0, or the first error (submission or completion: -EIO, -EBADMSG,
   ...). A failed write disables spilling (as any spill write); a failed read marks the page
   damaged (as any read back). */
int  paging_disk_stage_io(struct paging *pg, bool write, const pg_page_id *ids,
                   const pg_slot *dslots, const pg_slot *hslots, uint32_t n);
/* Distinct HOST pages a spill could write out for room (0 when spilling is off), never
   pages excl holds. */
uint32_t paging_disk_spillable(struct paging *pg, struct pg_seq *excl);
/* Waits for the disk I/O in flight when a page of ids[0..n) has some (then reaped). */
void paging_disk_settle(struct paging *pg, const pg_page_id *ids, uint32_t n);
/* The one damaged-page check: -EBADMSG when a DISK page of ids[0..n) is damaged, else 0
   with *ndisk the DISK pages among them. */
int  paging_disk_damaged(struct paging *pg, const pg_page_id *ids, uint32_t n, uint32_t *ndisk);

/* paging_candidates' lists (disk_tier.c): PG_CAND_DISK's, up to max; returns how many. */
size_t paging_disk_candidates(struct paging *pg, struct pg_cand *out, size_t max);

/* paging_seq_swap_out's steps (paging.h, host tier): the swap-out (host_out.c; async for
   reclaim's moves, paging_reclaim_move) and a non-resident h's orphans moved down
   (orphan.c). */
int  paging_swap_out(struct paging *pg, uint64_t h, bool async);
/* The orphan pages of non-resident h (device pages it holds that no resident sequence
   maps: a sibling holding them came back and was freed or truncated since h's swap-out)
   copied to the host tier, synchronously; *moved gets the count. 0 with nothing moved for
   a resident h or one holding no orphan. The host room for all of them is had first (free
   slots, else spills or the drop of entries by the policy): -ENOMEM before anything moved
   when it cannot be; -ENOENT; -EIO. */
int  paging_seq_orphans_down(struct paging *pg, uint64_t h, uint32_t *moved);

#endif
