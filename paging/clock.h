/*
 * paging/clock.h: the owner clock's functions for the rest of paging/ (step.c, defer.c;
 * view.c's are in view.h): the device synchronization and the copy stream, work that waits
 * for a fence (releases, transfer jobs, copies out) and the copy ordering. Its part of
 * struct paging (ck, df) is in pg_types.h.
 */
#ifndef KVVM_PAGING_CLOCK_H
#define KVVM_PAGING_CLOCK_H

#include "paging_int.h"

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
int  defer_settle(struct paging *pg, struct pg_seq *s);
/* No device work may touch s's window any more, known without synchronizing anything:
   never used, or used before an epoch known complete (quiet_below), and no swap copy of
   the library's on it still running. */
bool defer_quiet(struct paging *pg, struct pg_seq *s);
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

/* paging_candidates' quiet filter (defer.c): no device work may touch h's pages any more,
   known without a synchronization (paging.h, struct pg_cand_q). false for a bad handle. */
bool paging_seq_quiet(struct paging *pg, uint64_t h);

#endif
