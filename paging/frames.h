/*
 * paging/frames.h: the owner frames' functions for the rest of paging/ (pool.c; map-ahead,
 * ahead.c, in ahead.h): the device pool (take, give, refill, release, the feed's budget)
 * and the page descriptors (new, get, put; their holder counts, tier and frame, with the
 * counts kept at their state changes). Its part of struct paging (fr, pd) is in
 * pg_types.h.
 */
#ifndef KVVM_PAGING_FRAMES_H
#define KVVM_PAGING_FRAMES_H

#include "paging_int.h"

/* pool.c */
/* The feed's plan and hand-over (paging_feed_begin and paging_feed_end, paging.c, around
   them): paging_feed_plan fills pl (paging.h) without the view's groups or the map-ahead;
   paging_feed_drain puts the delivered frames into the pool (released at once above the
   budget). Context lock held. */
int  paging_feed_plan(struct paging *pg, uint32_t fill, uint32_t keep, struct pg_feed_plan *pl);
/* Frames ready in the pool now (delivered ones included after a drain). */
uint32_t paging_pool_ready(const struct paging *pg);
/* Whether a frame could be created within the budget now (frames held and in transit
   below it). */
bool paging_pool_can_create(struct paging *pg);
void paging_feed_drain(struct paging *pg);
/* Context lock held: ready frames above keep that no call needed since the window began. */
uint32_t paging_feed_surplus(const struct paging *pg, uint32_t keep);
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
   frames become ready (ahead_drop_all). */
void pool_drop_all_ahead(struct paging *pg);
/* The budget in frames (p.max_frames); the caller checked that the frames held fit. */
void pool_set_max_frames(struct paging *pg, uint32_t frames);
/* kvvm_trim's pause: no frame is created ahead until a call needs device pages. */
void pool_feed_suppress(struct paging *pg);
/* Shared frames (struct pg_frame.ext): room in the budget for n adopted frames (ready
   frames released to make it; -ENOMEM none), then each handle adopted as a new frame id,
   FR_USED, ext (its page then page_new's; a handle another frame holds too is adopted the
   same: both are ext, each released through the source once); pool_share_mark makes page
   id's frame ext (an export: the page is copied before any write from now). */
int  pool_adopt_room(struct paging *pg, uint32_t n);
pg_frame_id pool_adopt_ext(struct paging *pg, vmm_handle h);
void pool_share_mark(struct paging *pg, pg_page_id id);

/* pages [pool.c] */
/* New page descriptor in the device tier holding frame f (refs 1). */
pg_page_id page_new(struct paging *pg, pg_frame_id frame);
/* The same, held by one non-resident holder (refs 1, offs 1): an imported sequence's page
   before the swap-in maps it (handoff.c). */
pg_page_id page_new_off(struct paging *pg, pg_frame_id frame);
/* New page descriptor in the host tier holding host slot `slot`, held by one non-resident
   holder (refs 1, offs 1): a non-resident share's copy of a partial page (seq_share.c). A free
   descriptor must exist (the caller checked). */
pg_page_id page_new_host(struct paging *pg, pg_slot slot);
void page_get(struct paging *pg, pg_page_id page);
/* Drops one reference; at zero the frame returns to the ready list, the descriptor is freed. */
void page_put(struct paging *pg, pg_page_id page);
/* Drops the reference of a non-resident holder (page_get_off's undo: offs and refs). */
void page_put_off(struct paging *pg, pg_page_id page);
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
/* A page's holder counts (refs, offs, ents, jobs) are written here only (pool.c), each change
   with the counts above kept (page_count around it):
   page_get_off: one more holder among non-resident sequences (a reference it maps nothing
   with: fork or share of a non-resident sequence). page_go_off / page_go_on: a holder's
   entry stops mapping the page (its sequence leaves the device) / maps it again (a
   swap-in; the page had such an entry). page_get_ent / page_put_ent: a holder outside
   sequences (hold.c: the prefix cache's entries) takes a reference / drops it (the last
   reference frees the page, as page_put). */
void page_get_off(struct paging *pg, pg_page_id id);
void page_go_off(struct paging *pg, pg_page_id id);
void page_go_on(struct paging *pg, pg_page_id id);
void page_get_ent(struct paging *pg, pg_page_id id);
void page_put_ent(struct paging *pg, pg_page_id id);
/* A transfer job (host_tier.c's DF_OUT / DF_IN, disk_tier.c's reads and writes) holds its
   page: page_get_job takes a reference counted in jobs too; page_job_done ends the count
   when the transfer completed (jobs is counted in no page state: the caller then makes the
   page's transition and drops the reference itself, page_put, as its release does). */
void page_get_job(struct paging *pg, pg_page_id id);
void page_job_done(struct paging *pg, pg_page_id id);
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

#endif
