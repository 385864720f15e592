/*
 * paging/paging.h: pages and sequences over the vmm layer.
 *
 * Contract:
 *  - A *page* is a logical KV page: an identity (pg_page_id) with a refcount (= the number of
 *    block-table entries and pending releases holding it), a tier (device / host / disk / in
 *    flight) and a location in that tier (a device frame, a host slot, a disk slot). The
 *    identity survives tier moves; sequences hold page ids, never handles or addresses.
 *  - A *frame* is one physical device allocation (vmm_handle) of page_size bytes. Frames are
 *    created ahead of need (by the frame pool thread through the feed below, or without
 *    one at create time and at each step), kept for reuse, and released when the budget
 *    shrinks, at kvvm_trim, or above the pool thread's high mark; at most max_frames
 *    (= device budget / page_size, changed by paging_set_budget) are held.
 *  - A *sequence* owns one slot: a fixed window of slot_bytes in each of n_regions regions.
 *    Its block table holds, per region, the page ids covering [0, length). Handles carry a
 *    generation: a freed or forged handle is -ENOENT, never aliased; 0 is never a handle.
 *  - Ordering (docs/api.md "Protection and residency", "Ordering"): a sequence is protected
 *    from a call that uses it until the next paging_step. Window pages that device work may still
 *    touch are unmapped (and their pages released) only after a fence on the engine stream
 *    has completed; with no engine stream the device is synchronized first instead.
 *  - Every call is all-or-nothing: on error nothing changed (no page, frame, slot or mapping
 *    leaked or lost). -ENOMEM when the device pool cannot supply a frame; this layer never
 *    decides which sequence to evict, which host pages to spill, how hard, or whether a swap
 *    is staged (that is swap/'s policy, asked through pg_policy_ops; the context retries).
 *    paging exposes candidates (paging_candidates: resident, cached, disk) and room facts
 *    (struct pg_room), and moves what it is told.
 *  - Not thread-safe: the caller (core/) serializes every call with its context lock.
 *  - Never includes a header of core/ or swap/.
 *
 * Errors of every sequence call: -ENOENT bad handle; -EINVAL bad argument (per docs/api.md);
 * -E2BIG past max_tokens; -ENOSPC no free slot; -ENOMEM no device frame; -EIO driver failure.
 */
#ifndef KVVM_PAGING_PAGING_H
#define KVVM_PAGING_PAGING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "vmm/vmm.h"

/* Typed ids (page and frame ids: index + 1, 0 = none) so pages, frames and slots cannot be
   mixed up: passing one where another is expected is a compile error. Test them with the
   predicates below, not through .v (an array index inside one function may use .v). */
typedef struct { uint32_t v; } pg_page_id;
typedef struct { uint32_t v; } pg_frame_id;
typedef struct { uint32_t v; } pg_slot;      /* slot number itself (0-based) */
#define PG_PAGE_NONE  ((pg_page_id){ 0 })     /* no page (a block table's hole) */
#define PG_FRAME_NONE ((pg_frame_id){ 0 })    /* no frame (a hole in a frame array) */
#define PG_SLOT_NONE  ((pg_slot){ UINT32_MAX })  /* no slot (a disk allocation's hint: none) */
static inline bool pg_page_is_none(pg_page_id p) { return p.v == 0; }
static inline bool pg_slot_is_none(pg_slot s) { return s.v == UINT32_MAX; }

/* Where a page's bytes are. In-flight states count under the tier they leave. */
enum pg_tier {
    PG_TIER_NONE = 0,        /* descriptor free */
    PG_TIER_DEVICE,          /* in a device frame, mapped in every holder's window */
    PG_TIER_HOST,            /* in a pinned host slot (swap) */
    PG_TIER_DISK,            /* in a spill file slot */
    PG_TIER_TO_HOST,         /* device -> host copy in flight */
    PG_TIER_TO_DEVICE,       /* host -> device copy in flight */
    PG_TIER_TO_DISK,         /* host -> disk write in flight */
    PG_TIER_FROM_DISK,       /* disk -> host read in flight */
};

/* ---- the tiers below the device: one list ----
 * The tiers below the device form a list, fastest first, indexed by PG_LOWER_*: the host
 * tier (pinned host memory, swap) and the disk tier (spill files). A page leaves the device
 * for the first and moves down the list one step at a time, through the tier above (a
 * spill write reads a host slot); it comes back up the same way. Each tier is one struct
 * pg_tier_ops that the caller (core/tiers.c, over host/, disk/ ...) provides: paging names
 * slots and page transfers, never allocates memory or opens files itself. A tier is either
 *  - a memory tier (ptr set; the host tier): its slots are host memory the device copies
 *    to and from on paging's copy stream, or
 *  - an I/O tier (put and get set; the disk tier): put writes a page from a buffer of the
 *    tier above (a host slot) to one of its slots, get reads it back; each returns 0 and
 *    queues the transfer (or -errno, nothing queued), and its completion comes back once
 *    through reap (never blocks). wait blocks until no transfer is in flight (thread safe;
 *    callable without the context lock). A page's transfer carries its page id (its
 *    checksum identity).
 * Absent tiers have no ops (params.tier[t] NULL); a tier needs every tier above it. */
enum { PG_LOWER_HOST = 0, PG_LOWER_DISK = 1, PG_N_LOWER = 2 };
struct pg_tier_done { pg_page_id page; int status; bool write; };
struct pg_tier_ops {
    void  *arg;
    size_t (*room)(void *arg);                      /* free slots now */
    /* -ENOMEM when the tier is full; hint (PG_SLOT_NONE: none) a slot to cluster after */
    int    (*alloc)(void *arg, pg_slot hint, pg_slot *slot);
    void   (*free)(void *arg, pg_slot slot);
    void  *(*ptr)(void *arg, pg_slot slot);         /* a memory tier's slot */
    int    (*put)(void *arg, pg_slot slot, void *buf, pg_page_id page);  /* I/O tier */
    int    (*get)(void *arg, pg_slot slot, void *buf, pg_page_id page);
    size_t (*reap)(void *arg, struct pg_tier_done *out, size_t max);
    void   (*wait)(void *arg);
};

/* The policy paging asks (swap/ provides it, installed by swap_create): paging names what
   a move needs, the policy chooses how it is had. Room facts for a swap of `need` pages that
   the host tier cannot take as it is, per tier below (t[PG_LOWER_*]): free, its free slots
   (0 for a tier that takes no moves down: spilling off); freeing, its slots that transfers
   between it and the tier below in flight will free (host: spill writes); movable, its
   pages that could move down to the tier below for room (host: host pages of other
   non-resident sequences that could be spilled; 0 when the tier below takes none, and for
   the last tier). */
struct pg_tier_room {
    uint64_t free, freeing, movable;
};
struct pg_room {
    uint64_t need;
    struct pg_tier_room t[PG_N_LOWER];
};
/* The slots tier t can have free for moves from the tier above, walking the tiers below in
   order: its free ones, those its transfers down in flight free, and its movable pages as
   far as the tiers below it can take them, the same way (the last tier: its free slots).
   For the host tier over the disk tier: H + W + min(S, D). */
static inline uint64_t pg_room_reach(const struct pg_room *r, unsigned t)
{
    uint64_t below = 0;                 /* what the tiers under u can take */
    for (unsigned u = PG_N_LOWER; u-- > t;) {
        const struct pg_tier_room *x = &r->t[u];
        below = x->free + x->freeing + (x->movable < below ? x->movable : below);
    }
    return below;
}
/* Every slot free or coming free in tier t and the tiers below it (no move counted). */
static inline uint64_t pg_room_total(const struct pg_room *r, unsigned t)
{
    uint64_t n = 0;
    for (unsigned u = t; u < PG_N_LOWER; u++)
        n += r->t[u].free + r->t[u].freeing;
    return n;
}
enum pg_move { PG_MOVE_DIRECT = 0, PG_MOVE_STAGED = 1 };
struct pg_policy_ops {
    void *arg;
    /* Makes `want` host slots free, spilling host pages of sequences other than excl (a
       handle, 0 = none), waiting for the writes. 0, or -ENOMEM when they cannot be had. */
    int (*host_room)(void *arg, uint32_t want, uint64_t excl);
    /* How a swap (in: swap-in, else swap-out) with room r moves: PG_MOVE_DIRECT (the
       ordinary move, room made with host_room), PG_MOVE_STAGED (through the host tier in
       batches), or -ENOMEM (nothing moves). Asked only with a disk tier. */
    int (*plan)(void *arg, bool in, const struct pg_room *r);
};

/* Pages of the scratch run after the windows (paging_params.base): copy-on-write maps the
   new frames of up to this many pages there at once for their copies (cow.c); the swap
   and prefix paths use its first page. Reserved address space only. */
#define PG_SCRATCH_PAGES 32u

/* Where frames come from (paging_params.src, never NULL; local: this process's cuMemCreate and
   cuMemRelease through the vmm). A pool client (core/pool_client.c over pool/client.c) leases them
   from the kvvmd daemon instead. create: one frame of page_size bytes; need > 0: a call
   needs it now, and need frames in all (this one included, within the budget: a pool
   client's lease asks for that many at once, up to a message's worth, and may wait up to
   pool_timeout_ms for a take-back of them), 0: a refill ahead of need (the frame pool
   thread, or a refill at open or at a step without it: what the pool has now); 0, -ENOMEM
   (none to be had now), -EIO. release: the frame is unmapped; 0, or -EIO refused (it stays the caller's). Both
   thread-safe: the two threads may call at once. */
struct pg_frame_src {
    int  (*create)(void *arg, vmm_handle *out, uint32_t need);
    int  (*release)(void *arg, vmm_handle h);
    void *arg;
};

struct paging_params {
    uint32_t n_regions;
    uint64_t bytes_per_token;    /* per region */
    uint32_t max_seqs;
    uint64_t max_tokens;
    size_t   page_size;          /* multiple of the granule */
    uint64_t slot_bytes;         /* multiple of page_size, >= max_tokens * bytes_per_token */
    uint64_t base;               /* reservation base: regions, then the scratch run
                                    (PG_SCRATCH_PAGES pages) */
    uint32_t max_frames;         /* device budget in pages (>= n_regions) */
    uint32_t cap_frames;         /* the most the budget may grow to (device capacity in
                                    pages, >= max_frames; 0 = max_frames) */
    uint32_t max_pages;          /* page descriptors (device + host + disk pages) */
    uint32_t map_ahead;          /* pages per region mapped ahead of a growing sequence */
    bool     scrub;              /* zero frames before they change owner */
    bool     feed;               /* a frame pool thread attaches after create
                                    (paging_feed_attach): no first chunk created here */
    bool     prealloc;           /* create every frame of max_frames now (-ENOMEM when the
                                    device cannot give them all) */
    uint32_t view_ids;           /* pool view (KVVM_F_POOL_VIEW): block ids per region; 0 =
                                    no pool view */
    uint64_t view_base;          /* its base: region r's view at view_base + r * view_ids *
                                    page_size (inside the reservation, after the scratch) */
    uint32_t copy_blocks;        /* the copy run: blocks of n_regions pages where the pages
                                    of paging_blocks_copy_out are mapped while their copies
                                    run (0: none, no copy out) */
    uint64_t copy_base;          /* its base (inside the reservation, after the view) */
    /* the tiers below the device (PG_LOWER_*; NULL: absent). Without a host tier swap_out
       is -ENOMEM; the disk tier needs a host tier (ignored without one). */
    const struct pg_tier_ops *tier[PG_N_LOWER];
    const struct pg_frame_src *src;  /* never NULL (core/frame_src.c: local or pool) */
};

struct paging_counters {
    uint64_t pages_total;        /* max_frames */
    uint64_t pages_free;         /* could be had without moving data (ready, ahead, uncreated) */
    uint64_t pages_used;         /* frames holding a page (pending releases included) */
    uint64_t pages_inflight;
    uint64_t frames_created;
    uint64_t maps, unmaps;       /* window page mappings made / removed */
    uint64_t cow_copies;         /* pages copied on write */
    uint64_t share_copies;       /* partial last pages copied by share */
    uint64_t deferred;           /* releases, swap jobs and copies out (DF_COPY) waiting for
                                    a fence now */
    uint64_t swap_outs, swap_ins;           /* sequences moved */
    uint64_t bytes_to_host, bytes_to_device;/* swap copies */
    uint64_t orphans;            /* device pages held only by non-resident sequences */
    uint64_t orphans_moved;      /* orphan pages copied to the host tier */
    uint64_t nonresident;        /* live sequences not resident */
    uint64_t spills, unspills;   /* pages written to / read back from disk */
    uint64_t bytes_to_disk, bytes_from_disk;
    uint64_t pages_lower[PG_N_LOWER]; /* pages holding a slot of each tier below (host:
                                    HOST, TO_HOST, TO_DEVICE...; disk: DISK, TO_DISK,
                                    FROM_DISK) */
    uint64_t pages_damaged;      /* pages whose disk copy was lost (failed read) */
    uint64_t frames_created_sync;/* frames created on a caller's thread */
    uint64_t frames_released;    /* frames released to the driver before close */
    uint64_t frames_held;        /* frames created and not released now */
    uint64_t cache_drops, cache_demotes; /* CACHED sequences dropped / demoted */
    uint64_t pages_discarded;    /* block-table entries released by discard */
};

struct paging_seq_info {
    uint64_t length;
    uint32_t slot;
    uint32_t pages_device, pages_host, pages_disk, pages_shared;
    bool     resident;
    bool     dropped;            /* a dropped CACHED sequence (discard.c) */
    uint8_t  cls;                /* enum pg_seq_class */
    uint64_t first_kept;         /* smallest first_kept over the regions */
};

struct paging;

/* Creates the pool (a first chunk of frames) and the slot table. -ENOMEM, -EIO. */
int  paging_create(struct vmm *v, const struct paging_params *p, struct paging **out);
/* Waits for the device, unmaps every window page, releases every frame. */
void paging_destroy(struct paging *pg);

int paging_seq_create(struct paging *pg, uint64_t *h);
int paging_seq_free(struct paging *pg, uint64_t h);
/* Every grow, one entry (core's kvvm_seq_grow and _grow_batch, prefix's attach): hs[i] to
   lengths[i], i < n. how: PG_GROW_BATCH the batch (all or nothing; -EINVAL also for a handle
   named twice), else the one sequence hs[0] (n 1); PG_GROW_IN_PLACE only the grow that
   needs nothing (the engine's decode step inside the last page): each sequence resident
   and settled, the length within the pages it holds, no shared or discarded partial last
   page to copy or fill; sets the lengths and protects them, O(n * n_regions), no
   allocation, no driver call; -EAGAIN and nothing changed for any other grow, an invalid
   one included (the grow without PG_GROW_IN_PLACE then does the work or says what is
   wrong). The steps are seqs.h's paging_seq_grow, _grow_in_place, _grow_batch and
   _grow_batch_in_place. */
#define PG_GROW_BATCH    1u
#define PG_GROW_IN_PLACE 2u
int paging_grow(struct paging *pg, const uint64_t *hs, const uint64_t *lengths, size_t n,
                unsigned how);
/* Map-ahead on request (ahead.c), for a caller that knows h will grow by `pages` pages per
   region soon (an attach whose store reads are in flight): maps ready frames past h's end
   until its map-ahead holds `pages` per region (within its slot), its array widened past
   map_ahead where needed. Best effort and invisible: no length change, no reclaim, no
   frame created; the frames stay free for accounting (another grow may steal them) and the
   next grow of h takes them first (no map, no set-access then). Returns the map-ahead
   pages per region h has now (0: h not live or not resident). paging_seq_premap_trim gives
   back what h holds past map_ahead (an attach that used fewer blocks). */
uint32_t paging_seq_premap(struct paging *pg, uint64_t h, uint32_t pages);
void paging_seq_premap_trim(struct paging *pg, uint64_t h);
/* ---- the hot path's grow, inlined into core's kvvm_seq_grow ---------------------------
   The decode step's grow (a token inside the last page) is the library's price on every
   token, so it is inlined into the public call: no call into paging, no frame of its own
   (an out-of-line call cost 0.09x of the lock + lookup + unlock floor; kvvm-bench, issue
   19). It reads and writes only the fields below, which struct pg_seq and struct paging
   begin with (paging_int.h: a union of the named view with the same fields, unnamed, so
   paging's code keeps writing s->length): core sees these fields and no other. Every other
   field stays paging's own. */

/* A sequence's first fields (64 bytes): its identity, length and room fact, and its use
   stamps. */
#define PG_SEQ_HOT_FIELDS                                                                     \
    uint32_t gen;        /* generation of the current (or last) owner; starts at 1 */       \
    uint8_t  live;       /* a handle names it */                                             \
    uint8_t  dying;      /* freed; the slot waits for its pending releases */                \
    uint8_t  used_valid;                                                                     \
    uint8_t  out;        /* non-resident: its window maps none of its pages (a pending      \
                            DF_OUT may still hold the mapping until its fence) */            \
    uint32_t n_defer;    /* pending releases over this slot's window */                      \
    uint32_t room_np;    /* (the room fact, below) */                                        \
    uint64_t length;     /* tokens */                                                        \
    uint32_t n_pages;    /* block-table entries per region = pages_for(length) */            \
    uint32_t n_ahead;    /* frames mapped ahead at [n_pages, n_pages + n_ahead), per region */ \
    /* The hot path's fact (paging_seq_grow_fast): s may grow to `room` tokens in place (its \
       pages hold them, its partial last page is its own in every region, no hole there, it  \
       is resident, settled and not scrub-stale) for as long as room_gen == pg->room_gen and  \
       n_pages == room_np. Set by the full in-place check; voided by seq_room_void (a change  \
       of s that could break it) or by pg->room_gen moving on (a page gained a holder). */   \
    uint64_t room;       /* tokens (<= max_tokens) */                                        \
    uint64_t room_gen;   /* 0: no fact */                                                    \
    uint64_t used_epoch; /* protected while used_epoch == epoch (used_valid) */              \
    uint64_t used_tick;  /* pg->tick at the last use (LRU order) */
/* may_alias: these views and paging's unnamed members are different struct types for the
   compiler's type-based alias analysis, which would otherwise let it reorder a write
   through one past a read through the other (it did: a sequence's used_valid read stale
   in the KVVM_DEBUG build). */
/* aligned(64): one cache line; struct pg_seq, which begins with it, is then a multiple of
   64 bytes, and its array (paging_create) 64-byte aligned. */
struct __attribute__((__may_alias__, __aligned__(64))) pg_seq_hot { PG_SEQ_HOT_FIELDS };

/* The context's first fields: what the hot path reads to find a sequence and stamp its use. */
struct pg_seq;
#define PAGING_HOT_FIELDS                                                                     \
    struct pg_seq *seqs;  /* max_seqs of them, seq_size bytes apart; immutable */             \
    uint32_t n_slots;     /* max_seqs (p.max_seqs, kept here for the hot path); immutable */  \
    uint32_t seq_size;    /* sizeof(struct pg_seq); immutable */                             \
    uint64_t room_gen;    /* starts at 1; + 1 whenever a page gains a holder (page_get,      \
                             page_get_off, paging_hold): voids every pg_seq room fact */     \
    uint64_t epoch;       /* number of steps so far */                                       \
    uint64_t tick;        /* uses so far (LRU clock) */
struct __attribute__((__may_alias__)) paging_hot { PAGING_HOT_FIELDS };

/* The hot view of pg (its first member). */
static inline struct paging_hot *paging_hot(struct paging *pg)
{
    return (struct paging_hot *)(void *)pg;
}

/* s is used now: protected until the next step, most recently used (LRU order). */
static inline void paging_hot_use(struct paging_hot *ph, struct pg_seq_hot *s)
{
    s->used_epoch = ph->epoch;
    if (__builtin_expect(!s->used_valid, 0))   /* set once: a load, not a store, per call */
        s->used_valid = 1;
    s->used_tick = ++ph->tick;
}

/* The sequence handle h names (slot + 1 | generation << 32), or NULL; no reason recorded. */
static inline struct pg_seq_hot *paging_hot_peek(struct paging_hot *ph, uint64_t h)
{
    uint32_t slot1 = (uint32_t)h;
    if (slot1 - 1u >= ph->n_slots)                  /* slot1 0 wraps: refused too */
        return NULL;
    struct pg_seq_hot *s =
        (struct pg_seq_hot *)(void *)((char *)ph->seqs + (size_t)(slot1 - 1) * ph->seq_size);
    return s->live && s->gen == (uint32_t)(h >> 32) ? s : NULL;
}

/* s's room fact holds and covers length. */
static inline bool paging_hot_room_covers(const struct paging_hot *ph,
                                          const struct pg_seq_hot *s, uint64_t length)
{
    return s->room_gen == ph->room_gen && s->room_np == s->n_pages && length >= s->length &&
           length <= s->room;
}

/* The hot path's grow (core calls it before anything else, lock held): true when h's room
   fact (a full check made by an earlier in-place grow, still valid) covers length, and
   then h has grown to length and is protected as a use; false, nothing changed, for any
   other case (the caller then takes the full path). O(1): a lookup, compares, stores; no
   reason recorded, no allocation, no driver call, no call at all. */
static inline bool paging_seq_grow_fast(struct paging *pg, uint64_t h, uint64_t length)
{
    struct paging_hot *ph = paging_hot(pg);
    struct pg_seq_hot *s = paging_hot_peek(ph, h);
    if (!s || !paging_hot_room_covers(ph, s, length))
        return false;
    s->length = length;
    paging_hot_use(ph, s);
    return true;
}

int paging_seq_truncate(struct paging *pg, uint64_t h, uint64_t length);
/* The metadata's bytes, for the testing interface (kvvm_testing_metadata), one query:
   *page_bytes those per device page (its page descriptor and its frame's), then *seq_bytes
   those s holds now (its slot's descriptor and every array allocated for it: block tables,
   discard marks, block ids, map-ahead frames). 0 or -ENOENT (*seq_bytes untouched). */
int paging_meta_bytes(struct paging *pg, uint64_t h, uint64_t *seq_bytes,
                      uint64_t *page_bytes);
int paging_seq_fork(struct paging *pg, uint64_t parent, uint64_t *child);
int paging_seq_share(struct paging *pg, uint64_t dst, uint64_t src, uint64_t n_tokens);
int paging_seq_prepare_write(struct paging *pg, uint64_t h, uint64_t first, uint64_t end);
int paging_seq_write(struct paging *pg, uint64_t h, uint32_t region, uint64_t offset,
                     const void *src, size_t len);
int paging_seq_read(struct paging *pg, uint64_t h, uint32_t region, uint64_t offset,
                    void *dst, size_t len);
int paging_seq_slot(struct paging *pg, uint64_t h, uint32_t *slot);
/* What s is, one query for every question of core's: how PG_INFO_LIVE first refuses a
   dropped CACHED sequence (-ESTALE, *out untouched: the stale check core makes before any
   room is counted or made); PG_INFO_BRIEF leaves the page counts out (pages_*: 0): no walk
   of the block table, O(regions); else the pages counted by tier, O(pages). -ENOENT. */
#define PG_INFO_LIVE  1u
#define PG_INFO_BRIEF 2u
int paging_seq_info(struct paging *pg, uint64_t h, unsigned how, struct paging_seq_info *out);
/* Device address of region r of slot s (no handle check). */
uint64_t paging_window(const struct paging *pg, uint32_t region, uint32_t slot);

/* Iteration boundary: records the step fence on the engine stream, ends protection, reaps
   completed releases, refills the pool off the grow path. -EIO. */
int paging_step(struct paging *pg);
/* Waits for all device work that may touch pages (synchronous mode: the device; stream
   mode: the engine stream and the library's own, never the device's other streams); every
   pending release is done when it returns. -EIO. */
int paging_sync(struct paging *pg);
/* The engine stream (NULL = synchronous mode). Synchronizes as paging_sync (for the old
   stream) when it changes. -EINVAL another context's stream or CU_STREAM_PER_THREAD,
   -EBUSY a capturing stream, -EIO. */
int paging_set_stream(struct paging *pg, kcu_stream s);
kcu_stream paging_stream(const struct paging *pg);
/* The copy stream of the swap copies (host_tier.c), NULL before its first use (test hook). */
kcu_stream paging_copy_stream(const struct paging *pg);

void paging_counters(const struct paging *pg, struct paging_counters *out);

/* What the refusals of the current call were about, for the caller's message (core/ resets
   it when a public call starts and explains -ENOENT, -E2BIG and -ENOMEM with it): the
   handle a lookup refused, a length past max_tokens, the device frames and host slots that
   a refused move or the last need computed asked for, a swap-out refused for want of a host
   tier. `what` says which fields hold something; the latest refusal of a kind wins. */
enum { PG_WHY_HANDLE = 1, PG_WHY_LENGTH = 2, PG_WHY_FRAMES = 4, PG_WHY_HOST = 8,
       PG_WHY_NO_HOST = 16 };
struct paging_why {
    unsigned what;           /* PG_WHY_* bits */
    uint64_t handle;         /* PG_WHY_HANDLE: not a live sequence (-ENOENT) */
    uint64_t length;         /* PG_WHY_LENGTH: past max_tokens (-E2BIG) */
    uint64_t frames;         /* PG_WHY_FRAMES: device frames needed */
    uint64_t host;           /* PG_WHY_HOST: free host slots needed */
};
/* One entry for the refusals: PG_WHY_GET returns them; PG_WHY_RESET clears them (a public
   call starts); PG_WHY_NEED notes a refusal for want of `frames` device frames, as the
   caller counted them (core's room for a call), where no layer below noted one this call.
   Returns the refusals after the operation. */
enum pg_why_op { PG_WHY_GET = 0, PG_WHY_RESET, PG_WHY_NEED };
const struct paging_why *paging_why(struct paging *pg, enum pg_why_op op, uint64_t frames);

/* ---- host tier (host_tier.c) ----
 * swap_out: the sequence leaves the device. Each of its pages that no resident holder maps is
 * copied device -> host on the copy stream (ordered after the engine's work: a fence on the
 * engine stream, or a device synchronization in synchronous mode) into a new host slot; a
 * page still mapped by a resident holder stays on the device. The window is unmapped and the
 * frames return to the pool when the copies have completed (at once in synchronous mode,
 * else by completion processing: step, sync, or a call that needs frames). Ends protection.
 * Already non-resident: 0. -ENOMEM no host tier or not enough free host slots; -EIO.
 * swap_in: maps every page again at the same addresses: pages on the device as they are,
 * host pages into new frames with a host -> device copy; host slots are freed when the
 * copies completed. Stream mode: the engine stream waits for the copies (no CPU wait);
 * sync mode: the bytes are in place on return. async (prefetch): the engine stream is not
 * ordered yet (the next call using the sequence does it) and sync mode does not wait.
 * Pages another sequence's swap-in is still bringing in are waited for like s's own copies
 * (s's job names them: not ready, settled, released, only after those copies); with
 * nothing to copy or wait for there is no job and no fence.
 * Protects the sequence (prefetch too). Resident: 0 (it is protected). -ENOMEM not enough
 * frames; -EIO.
 * async (swap_out, for reclaim): completion is deferred in synchronous mode too (the caller
 * waits for the copies itself, e.g. with paging_copy_fence_record, without its lock).
 * Staged (disk tier only): a swap_out moving more pages than the host tier can take, even
 * after spilling other sequences' host pages, moves them device -> host -> disk in batches
 * of the free host slots and ends with them on disk; a swap_in of more disk pages than the
 * host tier can hold at once reads them back in batches (read, copy to the device, free the
 * slots). Both are synchronous (async included): done on return, no job left pending.
 * swap_out checks first that the host and disk tiers can take what it needs (free host
 * slots, writes in flight, others' spillable host pages within the free disk slots; or, for
 * staging, the free disk slots): when they cannot it is -ENOMEM before anything moved.
 * When no host slot can be had at all (host tier and disk full), a staged swap-in borrows the
 * slot of a host page, parking its bytes in a spare frame (paging_need counts that frame).
 * Room is checked before anything moves: swap_in checks the frames before it reads a disk
 * page back. Host slots held only by copies in flight (stream mode, async) are waited for
 * when the room is short, as are a sibling's jobs on the pages a swap_out counts (swap_out
 * async, for reclaim, does not wait: it fails or leaves orphans for reclaim to move).
 * Both: all or nothing. A transfer still in flight on the sequence is waited for first.
 * The steps' swap_out is paging_swap_out (transfers.h; async for reclaim, through
 * paging_reclaim_move); core's public swap-out is paging_seq_swap_out: a live non-resident
 * h has what it left behind moved down (paging_seq_orphans_down below), any other h is
 * swapped out (paging_swap_out, not async); *moved the orphans moved (0 for a swap-out). */
int  paging_seq_swap_out(struct paging *pg, uint64_t h, uint32_t *moved);
int  paging_swap_in(struct paging *pg, uint64_t h, bool async);
/* A sequence's use stamp (protection and LRU place): what a reclaim's undo (swap/, a failed
   call's moves taken back) saves before a move and puts back after swapping the victim in
   again, so the victim is as unprotected and as old as before. */
struct pg_park;
struct pg_use {
    uint64_t epoch, tick;
    uint8_t valid;
};
/* A reclaim's move of victim h, one operation (swap/plan.c): *before gets h's use stamp
   (zero: none), then OUT swaps h out (async: the caller waits for the copies), DEMOTE
   demotes CACHED h (the same, counted as cache_demotes), STASH swaps CACHED h out (async,
   counted as none) for a drop at the call's success (paging_seq_stash_drop) when the host
   tier's free slots take its device pages as they are, within *room host slots (taken from
   it): 1, nothing done, when not (room NULL but for STASH). 0 moved; else paging_swap_out's
   errors, -ENOENT, -EINVAL not CACHED or dropped: nothing moved. */
enum pg_reclaim { PG_RECLAIM_OUT = 0, PG_RECLAIM_DEMOTE, PG_RECLAIM_STASH };
int  paging_reclaim_move(struct paging *pg, uint64_t h, enum pg_reclaim how, uint64_t *room,
                         struct pg_use *before);
/* Takes a reclaim's move back (swap/undo.c): h swapped in (not async) and given the use
   stamp it had before, as unprotected and as old as then. Errors as paging_swap_in. */
int  paging_reclaim_back(struct paging *pg, uint64_t h, const struct pg_use *before);
/* 1 when s is resident with no swap-in copy in flight, 0 not yet, <0 error. Reaps. */
int  paging_seq_ready(struct paging *pg, uint64_t h);
/* Frames a call would take, one entry for every count of core's room (struct pg_need says
   which). PG_NEED_GROW: making h resident and growing it to length (<= current: no growth);
   -ENOENT, -EINVAL (length past max_tokens is -E2BIG). PG_NEED_WRITE: making h resident
   and then writing bytes [b0, b1) of regions [r0, r1) (the copies of the shared pages
   written); -ENOENT. PG_NEED_BATCH: a grow of hs[i] to lengths[i] (i < n), swap-ins
   included (a page shared by several comes back once) and the copies of shared partial last
   pages as the batch's grow counts them: a check of room before any is swapped in; -ENOENT,
   -E2BIG, -ENOMEM. PG_NEED_SHARE: a share of src's first `length` tokens into h (the copies
   of a resident src's partial last page); -ENOENT. A count short of frames is noted for
   paging_why. */
enum pg_need_of { PG_NEED_GROW = 0, PG_NEED_WRITE, PG_NEED_BATCH, PG_NEED_SHARE };
struct pg_need {
    enum pg_need_of of;
    uint64_t h;                    /* GROW, WRITE; SHARE: dst */
    uint64_t length;               /* GROW: the length; SHARE: the tokens shared */
    uint64_t src;                  /* SHARE */
    uint32_t r0, r1;               /* WRITE: regions [r0, r1) ... */
    uint64_t b0, b1;               /* ... bytes [b0, b1) of each */
    const uint64_t *hs, *lengths;  /* BATCH */
    size_t n;
};
int  paging_need(struct paging *pg, const struct pg_need *q, uint64_t *frames);
/* stream waits (on the device) for every swap copy enqueued so far. -EIO. */
int  paging_stream_after_copies(struct paging *pg, kcu_stream stream);
bool paging_seq_resident(struct paging *pg, uint64_t h);
/* A live resident sequence that background reclaim may move. */
struct pg_cand {
    uint64_t h;
    uint64_t tick;        /* last use (smaller = less recently used) */
    uint32_t frees;       /* frames its move would return (PG_CAND_CACHED: its own drop;
                             the others: 0, ask paging_plan_add) */
    uint8_t  cls;         /* its class (enum pg_seq_class) */
};
/* Reclaim's candidates (one operation: the list, the caller's exclusions and filters), in
   slot order. `of`: PG_CAND_RESIDENT, unprotected resident sequences with no pending work
   on their window that hold device pages (frees 0: what victims free is paging_plan_add's;
   O(candidates), no page walk); PG_CAND_CACHED, unprotected resident CACHED ones with no
   transfer or release pending that hold device pages (frees: device pages only they hold);
   PG_CAND_DISK, spill candidates: live non-resident sequences, the holders of every HOST
   page (frees 0; O(slots)). Left out: those in excl[0..n_excl), those not LIVE when live,
   and when quiet those not quiet (asked of each one left, in order, after the others:
   quiet, no device work may touch its pages any more, known without a synchronization:
   never used, or used before an epoch a synchronization (or, stream mode, the step fence
   found complete) ended, and no swap copy on its window running; moving a quiet sequence
   synchronizes nothing, what a library thread may move in synchronous mode). Returns how
   many, in *out (malloc'ed, the caller frees it; NULL and 0 when memory is short). */
enum pg_cand_of { PG_CAND_RESIDENT = 0, PG_CAND_CACHED, PG_CAND_DISK };
struct pg_cand_q {
    enum pg_cand_of of;
    const uint64_t *excl;
    size_t n_excl;
    bool live;
    bool quiet;
};
size_t paging_candidates(struct paging *pg, const struct pg_cand_q *q, struct pg_cand **out);
/* Copies up to max orphan pages (device pages no resident sequence maps) to the host tier,
   never one that a sequence of keep[0..n_keep) holds, synchronously; *moved gets the
   count. -ENOMEM host tier full (after moving what fit).
   Touches only the library's copy stream (no engine work is left on an orphan): a library
   thread may call it while the engine stream captures a graph. */
int  paging_reclaim_orphans(struct paging *pg, uint32_t max, const uint64_t *keep,
                           size_t n_keep, uint32_t *moved);
/* While ids is set (NULL: off): paging_reclaim_orphans appends the id of every page it
   moves down to ids[*n] (up to cap; one past cap is not moved, the call ends -ENOMEM), for a
   reclaim's undo (swap/undo.c). */
void paging_orphan_log(struct paging *pg, uint32_t *ids, uint32_t cap, uint32_t *n);
/* Undoes one move of paging_reclaim_orphans: page id (as logged) comes back from its host
   slot into a frame of the pool, a device page again (an orphan, as it was), and each park
   of parks[0..n) (those made before it moved down) sharing it takes it in that frame.
   Synchronous, all or nothing. -ESTALE the page is no longer on the host tier as that move
   left it (spilled, freed), -ENOMEM no frame ready, -EIO. */
int  paging_undo_orphan(struct paging *pg, uint32_t id, struct pg_park *const *parks, size_t n);
/* Undoes paging_held_down for the pages ids[i] with moved[i] set (entries hold only them):
   each back from the host tier (read back from disk if spilled since) into a frame of the
   pool, a device page again. Synchronous; each page all or nothing; returns the first
   error (-ESTALE a page is no longer held by entries alone), the others done. */
int  paging_held_back(struct paging *pg, const pg_page_id *ids, const uint8_t *moved, size_t n);
/* ---- reclaim plans (plan_marks.c) ----
 * The page accounting of a reclaim plan (swap/ chooses the victims and their order): what
 * each move would free and take below, exactly, before anything moves. Nothing changes but
 * the pages' scratch marks, so no other walk of them (paging_reclaim_orphans with a keep
 * set) may run between paging_plan_begin and the last paging_plan_add / paging_plan_remove
 * of that plan.
 * paging_plan_begin starts one: keep[0..n_keep) are the sequences the plan must not take
 * frames from (the caller's own; a non-resident one's device pages are pages it maps again:
 * a move that copies one down takes a slot but frees no frame for the caller). It gives
 * the plan its start (struct pg_plan_start): the keep set's device pages and its stage facts
 * as its need counted them (a swap-in reading disk pages back, one borrowing a host slot:
 * no free one, none to be had by a spill, its parking frame counted by paging_need); then
 * it sets keep[] as the keep set (paging_disk_keep; the caller clears it when the plan is
 * made) and gives the room facts with it (paging_room_facts) and the orphan pages the plan
 * may move (those no kept sequence holds).
 * paging_plan_add counts moving h after the moves added before it (drop: paging_seq_drop,
 * else paging_swap_out or paging_seq_demote): *frees the device frames it returns (a page
 * whose last resident holder leaves by a swap-out, or whose every reference is dropped;
 * kept pages never), *slots the host or disk slots it takes (the pages it copies down),
 * *kslots how many of those are kept pages (a kept sequence then holds them below).
 * -ENOENT. paging_plan_remove takes the last h added back out (same drop). O(pages of h). */
/* A call's reclaim's first look (swap_reclaim_plan), one operation: each of the caller's
   sequences excl[0..n) not stale (paging_seq_stale, in order: the first error returned,
   *have untouched), then *have = the frames free plus those pending (paging_frames_free,
   paging_frames_pending). */
int  paging_plan_have(struct paging *pg, const uint64_t *excl, size_t n, uint32_t *have);
struct pg_plan_start {
    uint32_t keep_dev;           /* distinct device pages the keep set holds */
    bool keep_out;               /* a kept sequence is non-resident ... */
    bool keep_disk;              /* ... and one such has pages on disk (or disk I/O) */
    bool keep_borrow;            /* ... and one such's staged swap-in borrows a host slot */
    struct pg_room room;         /* the room facts, with the keep set in place */
    bool disk;                   /* a disk tier exists */
    uint32_t orphans;            /* orphan pages the plan may move */
};
void paging_plan_begin(struct paging *pg, const uint64_t *keep, size_t n_keep,
                       struct pg_plan_start *out);
int  paging_plan_add(struct paging *pg, uint64_t h, bool drop, uint32_t *frees,
                     uint32_t *slots, uint32_t *kslots);
void paging_plan_remove(struct paging *pg, uint64_t h, bool drop);
/* A plan's last step, its moves' copies waited for and reaped: the frames free must cover
   want and the keep set's device pages that came free since it was planned (it held
   keep_dev; the caller maps them again). Orphans the moves left (pages of victims that all
   moved, reaped since) move down for the shortfall (paging_reclaim_orphans, keep[] kept).
   0 covered; -ENOMEM not (a full host tier included); -EIO. */
int  paging_reclaim_cover(struct paging *pg, uint32_t want, const uint64_t *keep,
                          size_t n_keep, uint32_t keep_dev);
/* Device pages s holds (its own and shared), 0 for a bad handle: an upper bound of the
   slots its swap-out takes. */
uint32_t paging_seq_device_pages(struct paging *pg, uint64_t h);
/* Device frames free now (= paging_counters' pages_free), O(1). */
uint32_t paging_frames_free(const struct paging *pg);
/* Free host slots (0 without a host tier). */
size_t paging_host_free(const struct paging *pg);
/* Frames that in-flight swap-outs will return when they complete. */
uint32_t paging_frames_pending(const struct paging *pg);
/* Records f on the copy stream (creating the stream if needed). -EIO. */
int  paging_copy_fence_record(struct paging *pg, vmm_fence *f);
/* Reaps completed pending work without blocking. -EIO. */
int  paging_reap(struct paging *pg);
/* Acquire before anything moves (a call that makes room by moving others: core.h
   "Pressure"): what a driver may refuse for lack of resources is had here, while a refusal
   still changes nothing: up to `frames` ready frames (created within the budget's
   headroom: the frames the moves free are created ones already), the copy stream, and
   `fences` spare fences (vmm_fence_reserve). *mark: the pool's creation mark before it.
   -ENOMEM (a refusal: the frames it created released again), -EIO. */
int  paging_acquire(struct paging *pg, uint32_t frames, unsigned fences, uint32_t *mark);
/* Waits for the pending work (releases behind a fence, transfers) and reaps it, as a call
   short of frames does before it fails (pool_reserve_check): the frames those return are
   free then. -EIO. */
int  paging_wait_releases(struct paging *pg);

/* ---- disk tier (disk_tier.c) ----
 * Page lifecycle: HOST --write--> TO_DISK --full completion--> DISK (host slot freed);
 * DISK --read + checksum--> FROM_DISK --> HOST (disk slot freed). An I/O in flight holds a
 * reference (and a job) on its page, so a page freed meanwhile is released only when its
 * completion is processed. A failed write leaves the page HOST and disables spilling (logged);
 * a failed read (I/O error, checksum mismatch) leaves it DISK and *damaged*: every sequence
 * holding it gets -EBADMSG from swap-in until it is truncated below it or freed.
 * Completions are processed (under the context lock) by paging_disk_reap, which every
 * function here calls. */
/* Installs the policy (copied; NULL: none, then no room is ever made and no swap staged). */
void paging_set_policy(struct paging *pg, const struct pg_policy_ops *ops);
/* Starts writing up to max HOST pages of sequence h to disk, never a page excl (a handle,
   0 = none) also holds; *started gets the count. Does not wait. -ENOMEM the disk tier is
   full, disabled or absent, -ENOENT h (nothing started then). */
int  paging_disk_spill_seq(struct paging *pg, uint64_t h, uint32_t max, uint64_t excl,
                           uint32_t *started);
/* Until called again (n 0: none), keep[0..n) is the keep set: no spill writes a HOST page
   one of them holds, and the spillable counts (paging_room_facts, the swaps' own room
   facts) leave those pages out. A reclaim plan and its act set it to the caller's own
   sequences: what their need counted (pages in the host tier, a slot to stage through)
   stays so while the victims make their room. keep must stay valid while set. */
void paging_disk_keep(struct paging *pg, const uint64_t *keep, size_t n);
/* A reclaim's act (swap_reclaim_act), one operation: keep[0..n) set as the keep set
   (paging_disk_keep), fn(arg) run, the keep set cleared (n 0); returns fn's answer. */
int  paging_with_keep(struct paging *pg, const uint64_t *keep, size_t n, int (*fn)(void *),
                      void *arg);
/* Spilling is possible: a disk tier exists and no write failed (reaps first). */
bool paging_disk_on(struct paging *pg);
/* The room facts of the tiers below for a plan (need 0; struct pg_room): free host slots,
   spill writes in flight, host pages that could be spilled (every HOST page: none holds a
   resident sequence; less the keep set's, paging_disk_keep), free disk slots (0 without a
   disk tier or with spilling off). Reaps first. */
void paging_room_facts(struct paging *pg, struct pg_room *r);
/* Processes queued disk completions. */
int  paging_disk_reap(struct paging *pg);
/* Waits for every disk I/O in flight, then processes the completions. */
int  paging_disk_wait(struct paging *pg);
/* Waits for the disk I/O in flight only (no state change): without the context lock. */
void paging_disk_wait_io(struct paging *pg);
/* Pages with disk I/O in flight. */
uint32_t paging_disk_inflight(const struct paging *pg);
bool paging_has_disk(const struct paging *pg);

/* ---- sliding-window discard and sequence classes (discard.c) ----
 * A discarded page is a *hole*: block-table entry PG_PAGE_NONE below n_pages, unmapped, no
 * page. Holes of region r lie below its first_kept (pages wholly before it; after a
 * truncate below first_kept, also the partial last page, filled again by the next grow).
 * Every path over block tables skips holes: swap, spill, fork, share, info, need, checker.
 * Classes (values = enum kvvm_seq_class): reclaim drops (or demotes) unprotected resident
 * CACHED sequences before it swaps any LIVE one, and never moves PINNED ones. A dropped
 * sequence keeps its handle, holds nothing, has length 0, and is -ESTALE for grow, fork,
 * share (either side), write, read, swap-in and prefetch until set_class or free. */
enum pg_seq_class { PG_SEQ_LIVE = 0, PG_SEQ_CACHED = 1, PG_SEQ_PINNED = 2 };
/* Discards the pages of region (UINT32_MAX: every region) lying wholly before first_kept
   (<= length; below an earlier first_kept: no-op). Released after the step fence like any
   release; the non-resident sequence's pages are dropped at once. -ENOENT, -EINVAL
   (region, first_kept past the length), -ENOMEM (a pending-release record), -EIO. */
int  paging_seq_discard(struct paging *pg, uint64_t h, uint32_t region, uint64_t first_kept);
/* first_kept of region r of s (0 = nothing discarded). -ENOENT, -EINVAL region. */
int  paging_seq_first_kept(struct paging *pg, uint64_t h, uint32_t r, uint64_t *first_kept);
/* The tier of page i (< the sequence's pages) of region r of s, PG_TIER_NONE for a hole
   (the tests' model follows each page through reclaim with it). -ENOENT, -EINVAL. */
int  paging_seq_page_tier(struct paging *pg, uint64_t h, uint32_t r, uint32_t i,
                          enum pg_tier *tier);
/* Sets the class; a dropped sequence becomes an empty one of that class. -ENOENT, -EINVAL. */
int  paging_seq_set_class(struct paging *pg, uint64_t h, uint32_t cls);
/* A call's reclaim drops resident CACHED s in two steps (swap/undo.c): the stash
   (paging_reclaim_move, PG_RECLAIM_STASH), then at the call's success its commit: drops
   stashed s (paging_seq_drop, which counts the drop), which is then as a drop in place
   leaves a sequence (empty, resident, the use stamp `use` it had). -EINVAL s is not
   stashed (resident), else paging_seq_drop's errors. */
int  paging_seq_stash_drop(struct paging *pg, uint64_t h, const struct pg_use *use);
/* A reclaim's drop of CACHED s (swap/plan.c), as one operation. Not kept: dropped at once
   (paging_seq_drop, waiting when wait). Kept (a call's reclaim, its journal on):
   stashed where the host slots *room leaves take it (paging_reclaim_move, PG_RECLAIM_STASH:
   *room less its slots, done->use its use stamp), else (not stashable in that room, or the
   stash -ENOSPC) dropped and parked (paging_seq_park: done->park the record, NULL when
   nothing of its own was on the device). done->how says which (PG_DROPPED, PG_STASHED,
   PG_PARKED). Errors as the step that failed, which leaves s as it was.
   paging_seq_drop (seqs.h): drops CACHED s (any tier), its pages released (nothing copied)
   after the step fence: at once when no device work may touch them; for an unprotected
   sequence behind a fence on the library's copy stream ordered after the step fence (never
   a record on the engine stream: a library thread may call this); a protected one behind a
   fence on the engine stream (engine calls only); wait: block until released. Counts
   cache_drops. -ENOENT, -EINVAL not CACHED or dropped already, -EBUSY a transfer in flight
   on it (or no step fence to order after), -ENOMEM, -EIO.
   paging_seq_park (seqs.h): drops it (waiting) and returns the record of what it held, its
   freed frames watched until paging_park_end; -ENOMEM nothing dropped. */
enum pg_dropped { PG_DROPPED = 0, PG_STASHED, PG_PARKED };
struct pg_drop_done {
    enum pg_dropped how;
    struct pg_use use;             /* PG_STASHED: the stamp to give back (paging_reclaim_back) */
    struct pg_park *park;          /* PG_PARKED: the record (may be NULL) */
};
int  paging_reclaim_drop(struct paging *pg, uint64_t h, bool kept, bool wait, uint64_t *room,
                         struct pg_drop_done *done);
/* Takes a parked drop back when no byte of its frames can have changed since (each frame still
   ready under the same handle, not mapped and written through since; its shared pages still on
   the device, in the same frames or rebased): the sequence holds its pages again at the same
   addresses, not dropped. 0 (k NULL: nothing to do); -ESTALE it cannot be had (nothing
   changed), -ENOMEM, -EIO a map the driver refused (nothing changed). */
int  paging_park_undo(struct paging *pg, struct pg_park *k);
/* The watched frames of every park put last on the ready list again (frames given back
   since went after them): what the undo takes before the parks (paging_undo_orphan) takes
   the others first. */
void paging_park_frames_last(struct paging *pg);
/* The call ends: the records parks[0..n) are freed (NULL entries skipped) and no frame is
   watched any more. */
void paging_park_end(struct paging *pg, struct pg_park *const *parks, size_t n);

/* ---- the frame pool's feed and the budget (pool.c) ----
 * The feed lets a library thread (swap/frame_pool.c, the policy: when and how many) create and
 * release frames without the context lock: paging_feed_begin (context lock held) reserves
 * frames to create within the budget and takes ready frames off the pool for release;
 * paging_feed_work (no lock) makes the driver calls and hands the created frames over;
 * paging_feed_end (context lock) puts them in the pool. A caller short of ready frames
 * takes delivered ones, waits for those being created, and creates on its own thread only
 * when none are on their way (counted: frames_created_sync). */
struct pg_feed_plan {
    uint32_t create;             /* frames to create */
    uint32_t release;            /* handles in rel[] to release */
    vmm_handle *rel;             /* paging_feed_begin fills; freed by paging_feed_work */
    uint32_t ready;              /* frames ready after the plan */
    bool ahead;                  /* map-ahead refills taken instead (paging_ahead_work) */
};
/* Attaches the thread: from now on frames are created ahead by it. wake(arg) is called
   (context lock held) when a call leaves fewer than low frames ready, and when the pool grows
   above high (UINT32_MAX: never). -ENOMEM. */
int  paging_feed_attach(struct paging *pg, void (*wake)(void *), void *arg, uint32_t low,
                        uint32_t high);
/* Detaches it (after its last paging_feed_work): callers create on their own thread again. */
void paging_feed_detach(struct paging *pg);
void paging_feed_set_marks(struct paging *pg, uint32_t low, uint32_t high);
/* keep for a plan that releases nothing: the idle window goes on. */
#define PG_FEED_KEEP_ALL UINT32_MAX
/* Context lock held. Prepares the pool view's groups a grow took, then fills pl for a round
   that brings the ready frames up to `fill` (none while kvvm_trim's suppression lasts) and,
   unless keep is PG_FEED_KEEP_ALL, releases the ready frames above `keep` (keep >= fill)
   that stayed unused since the idle window began and that no pool view slot maps, and
   begins a new window. With pl->create = pl->release = 0 (or -ENOMEM: rel[] not allocated)
   the map-ahead refills are taken instead. */
int  paging_feed_begin(struct paging *pg, uint32_t fill, uint32_t keep,
                       struct pg_feed_plan *pl);
/* Without the context lock: releases pl->rel[], creates pl->create frames (stops at the
   first failure: the rest of the reservation is given back). Returns the number created. */
uint32_t paging_feed_work(struct paging *pg, struct pg_feed_plan *pl);
/* Context lock held: the delivered frames into the pool (released at once above the budget),
   the pool view's groups prepared, the map-ahead refills taken (true: some). */
bool paging_feed_end(struct paging *pg);
/* The map-ahead refills a round took (ahead.c): paging_ahead_work (no lock) maps them;
   paging_ahead_commit (context lock) gives each job to its sequence, or undoes it when the
   sequence changed meanwhile or the work failed. */
void paging_ahead_work(struct paging *pg);
void paging_ahead_commit(struct paging *pg);
/* Context lock held: waits until no frame is being created or released, then drains. */
void paging_feed_quiesce(struct paging *pg);
/* Whether a round would refill: fewer than `high` frames ready in the pool now, and a frame
   could be created within the budget (frames held and in transit below it). */
bool paging_feed_short(struct paging *pg, uint32_t high);
/* Context lock held. Sets the budget to `frames` (n_regions <= frames <= cap_frames) when
   the frames holding pages (pending releases included) fit in it, releasing every unused
   frame above it (ready ones first, then map-ahead, which is unmapped: nothing reaches it);
   *released gets the count; the pool view's slots mapping them are unmapped first (after a
   synchronization when device work may still use them). Call paging_feed_quiesce first. -EINVAL out of range, -ENOMEM
   more frames hold pages than `frames` (nothing changed), -EIO the driver refused a release
   (the budget unchanged; unused frames released before it stay released). */
int  paging_set_budget(struct paging *pg, uint32_t frames, uint32_t *released);
/* Context lock held. Releases unused frames (map-ahead unmapped first, then ready ones)
   until at most keep of them are left, and suppresses creating ahead until a call takes
   frames. A frame a pool view slot maps is released only once unmapped: dead ids are
   unmapped first, after a synchronization when device work may still use them (not while
   the engine stream captures a graph: those frames then stay). Never moves data. Returns
   the number released. Call paging_feed_quiesce first. */
uint32_t paging_trim(struct paging *pg, uint32_t keep);
/* paging_trim of up to n unused frames (a pool client giving frames back to the daemon):
   releases min(n, unused) of them, map-ahead first unmapped. Returns the number released.
   Context lock held; paging_feed_quiesce first. */
uint32_t paging_give(struct paging *pg, uint32_t n);
uint32_t paging_budget(const struct paging *pg);
uint32_t paging_cap_frames(const struct paging *pg);

/* ---- holders outside sequences: the prefix cache's entries (hold.c) ----
 * A holder keeps references on pages without a slot or a window (they count in the pages'
 * refs like a swapped-out sequence's, and in their own count, ents): the pages stay where
 * they are and follow their tier moves; a sequence writing one copies it on write. A page
 * only holders keep is no orphan: reclaim of the holders is their owner's (prefix/), through
 * the plan marks below; on the host tier it counts as spillable (the room facts), and the
 * owner writes it to disk when a spill asks (paging_held_spill, through swap/'s spill). */
enum { PG_WHERE_DEVICE = 1, PG_WHERE_HOST = 2, PG_WHERE_DISK = 3 };  /* = KVVM_TIER_* */
/* The pages of blocks [0, n) of s (a block = page b of every region; page_size a multiple
   of bytes_per_token), ids[b * n_regions + r]. -ENOENT, -ESTALE a dropped sequence,
   -EOPNOTSUPP blocks are not pages, -EINVAL n past s's full blocks or a block discarded in
   a region. */
int  paging_seq_blocks(struct paging *pg, uint64_t h, uint32_t n, pg_page_id *ids);
/* One holder's reference more on each of ids[0..n) (live pages); and back (a page whose
   last reference goes is freed at once: no window maps it). */
void paging_hold(struct paging *pg, const pg_page_id *ids, size_t n);
void paging_unhold(struct paging *pg, const pg_page_id *ids, size_t n);
/* The parameters paging was created with (their current values). */
void paging_params_get(const struct paging *pg, struct paging_params *out);
/* What the holders' owner sees of page id (1..paging_params' max_pages). */
struct pg_held_page {
    uint8_t  where;      /* PG_WHERE_* (in flight: the tier it leaves) */
    uint32_t others;     /* references but the holders' (sequences, releases, transfers) */
    uint32_t ents;       /* the holders' (0 for a free descriptor: the owner's checker) */
};
struct pg_held_page paging_page_held(struct paging *pg, pg_page_id id);
/* Empty s (length 0) becomes a non-resident sequence of n blocks holding pages ids (as
   paging_seq_blocks lays them out): swap it in to map them (paging_need counts the frames).
   -ENOENT, -ESTALE, -EINVAL not empty, -E2BIG past max_tokens, -EOPNOTSUPP, -EIO. */
int  paging_seq_adopt(struct paging *pg, uint64_t h, const pg_page_id *ids, uint32_t n,
                      bool *was_out);
/* Undoes paging_seq_adopt (s still non-resident): empty again, and resident again unless
   it was swapped out before (*was_out of the adoption): a failed attach changes nothing. */
void paging_seq_unadopt(struct paging *pg, uint64_t h, bool was_out);

/* ---- hand-offs: pages shared with other processes (paging/handoff.c) ----
   paging_seq_handoff_frames (seqs.h): the handles of resident s's pages, region-major
   (n_regions * n_pages; *out is the caller's to free), and its length. -ENOENT, -ESTALE,
   -EAGAIN s not resident or a page not on the device, -EINVAL a discarded page, -ENODATA
   empty, -EOPNOTSUPP with the pool view, -ENOMEM, -EIO. Nothing changes.
   paging_seq_handoff_mark (seqs.h): once the daemon holds them, s's pages are shared
   (copied before any write, their frames released, never reused, when the pages leave
   them).
   paging_seq_import: empty s becomes a non-resident sequence of length tokens holding n
   shared frames hs (the frame source's, e.g. imported from the daemon; region-major, n =
   n_regions * pages of length), which paging owns from then on: swap it in to map them (no
   copy: they are device pages). A handle may be one that frames of this context hold
   already (a pool client's frame received held: its own export imported, blocks attached
   again while mapped): it becomes one more frame of that handle (one handle mapped at
   several addresses, as the driver allows), and each frame's release goes through the
   source (which counts the uses). Every frame holding such a handle is shared, so none is
   written in place or reused. -EINVAL not empty or n wrong, -E2BIG, -ENOMEM no room in
   the budget (each such frame counted as any other), -EOPNOTSUPP, -EIO; on an error the
   handles stay the caller's. Undo with paging_seq_unadopt (the frames are then released
   through the source).
   Their bytes are complete only once the device work written before the call is: sync
   mode, the frames calls waited for it (a device synchronization, as before); stream mode
   they did not (the engine's thread never waits for the engine stream here), but ordered
   the engine stream after s's prefetch, and paging_share_fence then records the fence
   whose completion makes the bytes complete (docs/design.md "Sharing frames between
   clients", ordering).
   paging_share_fence (seqs.h): 1 and *f (the caller's to wait for and destroy) in stream
   mode; 0 in sync mode (nothing to wait for); -ENOMEM, -EIO (no fence).
   paging_seq_share_frames, one entry for both frames calls: nb PG_SHARE_ALL, a hand-off's
   (s checked not stale first, -ESTALE; then paging_seq_handoff_frames); else the shared
   prefix index's blocks [0, nb) (paging_seq_block_frames: as the hand-off's, key-major,
   block b's region r at b * n_regions + r; *n = nb * n_regions, *length untouched; -EINVAL
   nb 0 or past s's pages, a page discarded). paging_seq_share_mark: nb PG_SHARE_ALL,
   paging_seq_handoff_mark; else paging_seq_block_mark (those blocks only). */
#define PG_SHARE_ALL UINT32_MAX
struct pg_share_out {
    vmm_handle *hs;                /* the handles (the caller frees them) */
    uint32_t n;
    uint64_t length;               /* PG_SHARE_ALL: s's length */
    vmm_fence f;                   /* fenced 1: the caller's to wait for and destroy */
    int fenced;                    /* paging_share_fence's answer (<0: it failed) */
};
int  paging_seq_share_frames(struct paging *pg, uint64_t h, uint32_t nb,
                             struct pg_share_out *o);
void paging_seq_share_mark(struct paging *pg, uint64_t h, uint32_t nb);
int  paging_seq_import(struct paging *pg, uint64_t h, const vmm_handle *hs, uint32_t n,
                       uint64_t length, bool *was_out);
/* Copies the DEVICE pages among ids[0..n) that only holders keep to the host tier, one at
   a time through the scratch page, synchronously (the copy stream only: a library thread
   may call it); *moved the count. -ENOMEM no host tier or no host room (after moving what
   fit), -EIO. */
int  paging_held_down(struct paging *pg, const pg_page_id *ids, size_t n, uint32_t *moved);
/* The HOST pages among ids[0..n) that only holders keep. */
uint32_t paging_held_host(struct paging *pg, const pg_page_id *ids, size_t n);
/* O(1): whether any HOST page only holders keep exists. */
bool paging_held_host_any(const struct paging *pg);
/* O(1): whether any HOST page only holders keep exists and the disk tier takes a spill now
   (there, on, a slot free). */
bool paging_held_spillable(const struct paging *pg);
/* Starts writing the HOST pages among ids[0..n) that only holders keep to the disk tier, at
   most max (as paging_disk_spill_seq does a sequence's: not waiting for them); *started the
   count. 0, or -ENOMEM no disk tier, spilling disabled or the disk full (after starting
   *started), -EIO. */
int  paging_held_spill(struct paging *pg, const pg_page_id *ids, size_t n, uint32_t max,
                       uint32_t *started);
/* Whether one of ids[0..n) lost its disk copy (a read back failed: -EBADMSG). */
bool paging_held_damaged(struct paging *pg, const pg_page_id *ids, size_t n);
/* The shared store's write-through (core/): enqueues on the copy stream, ordered after the
   engine's work on s (tier_copies_after_engine: the engine's own call), copies of the pages
   that blocks blocks[0..n) of resident s hold now (those a publish just entered) into host
   memory: block blocks[i]'s page of region r at dst[i] + r * page_size. The copies read
   the pages, not s's window: each block's pages are mapped at a block of the copy run and
   held (references, the run block) by a DF_COPY job until its fence completed (reaped as
   any pending work), so nothing a later call does to s or to the pages (a copy-on-write,
   which gives the writer a new page; a free, discard or swap that unmaps the window; a
   drop of the entry) changes the bytes copied: they are those of the call. status[i] = 0
   queued, -EAGAIN a page of that block is not on the device (below it, or a hole) or no
   block of the copy run is free, -EINVAL past s's pages. The caller records a fence on the
   copy stream (paging_copy_fence_record) and waits for it before reading dst. -ENOENT,
   -ESTALE, -EOPNOTSUPP, -EAGAIN s not resident (nothing queued), -ENOMEM, -EIO (copies
   queued so far may still run: wait for the copy stream before reusing dst). */
int  paging_blocks_copy_out(struct paging *pg, uint64_t h, const uint32_t *blocks, uint32_t n,
                            void *const *dst, int *status);
/* A reclaim plan (between paging_plan_begin and its end) dropping (d = +1) one holder's
   references on ids[0..n), or taking that back (d = -1, last added first): the device frames
   the drop frees given the moves planned before it (every reference gone, none kept). */
uint32_t paging_plan_pages(struct paging *pg, const pg_page_id *ids, size_t n, int d);

/* ---- the pool view (view.c) ----
 * With view_ids > 0 every region also has a pool view: block id i of region r at
 * region r's base (paging_pool_view) + i * page_size maps the frame of the page of every
 * block whose id is i in that region (ids are the same in every region). A block's id is
 * made (its slots mapped) when a block table first names it, and kept while the block's
 * frames stay the same; forks share ids; a block whose frames change (copy-on-write, a
 * refilled hole, swap-in) gets a new id; swap-out, free, truncate and discard let ids go.
 * A let-go id is unmapped only when no device work may use it any more (the rule of
 * window releases).
 * Errors: -EOPNOTSUPP no pool view. */
/* The view's layout, one query (each answer NULL: not wanted): *addr region's base
   (-EINVAL region out of range), *n_ids the ids it has. */
int paging_pool_view(const struct paging *pg, uint32_t region, uint64_t *addr,
                     uint32_t *n_ids);
/* ids[i] = the id of block first + i (-1: a hole in every region). -ENOENT, -EINVAL (first
   + n past the blocks, ids NULL with n > 0), -EAGAIN s not resident, -ESTALE dropped,
   -ENOMEM no free id, -EIO (a mapping failed: ids of blocks that were unchanged are
   unchanged). */
int paging_seq_block_table(struct paging *pg, uint64_t h, uint32_t first, uint32_t n,
                           int32_t *ids);
/* FlashInfer's CSR form (docs/api.md): indptr[n + 1], indices[cap], last_len[n] (NULL: not
   wanted). -ENOSPC cap too small (indptr filled); else as paging_seq_block_table. */
int paging_batch_block_table(struct paging *pg, const uint64_t *hs, size_t n, int32_t *indptr,
                             int32_t *indices, size_t cap, int32_t *last_len);

/* The invariant checker (see core/debug.h). 0 or -EUCLEAN with the first violation in why. */
int paging_check(struct paging *pg, char *why, size_t len);

#endif
