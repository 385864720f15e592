/*
 * prefix/prefix.c: the prefix index (contract in prefix.h). Two arrays:
 *  - slots (8 bytes: a 32-bit tag of the hash and a record index), open addressing with
 *    linear probing at load <= 1/2, deletion by backward shift (no tombstones): a probe reads
 *    this small array and touches a record only where the tag matches;
 *  - records (48 bytes: key, namespace, chain links), dense, with a free list: a record never
 *    moves, so a parent link, a reclaim plan and a slot name it by its index. Their LRU ticks
 *    and pages are parallel arrays (a lookup writes only the tick: the records stay clean).
 * The keys are digests already (docs/api.md: collision resistant, >= 128 bits): the hash is
 * the key's first word xor the namespace mixed (once per call), its low bits the home slot
 * and its high 32 the tag; the 32 bytes are never hashed, and a probe compares the first
 * word, the namespace, then the other 24 bytes. Slots are rebuilt (from the records) and
 * records grown only in publish, before anything changes (-ENOMEM then).
 */
#include "prefix.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/assert.h"
#include "common/log.h"

#define PFX_NONE UINT32_MAX
#define PFX_MIN_CAP 64u
#define PFX_MAX_RECS (1u << 30)
#define PLAN_DEMOTE (1u << 31)   /* a plan's record demoted, not dropped (records < 2^30) */

struct pfx_slot {
    uint32_t tag;                /* the low 32 bits of the record's hash (probe filter) */
    uint32_t rec;                /* its record, or PFX_NONE: an empty slot */
};

/* What a hit compares (key and namespace) and the cold chain links: 48 bytes. */
struct pfx_rec {
    uint64_t key[4];             /* the digest (zero-padded by the engine) */
    uint64_t ns;
    uint32_t parent;             /* record of its predecessor in its chain, or PFX_NONE;
                                    a free record: the next free one (PFX_NONE: the last) */
    uint32_t children;           /* records naming it as parent */
};
_Static_assert(sizeof(struct pfx_rec) == 48, "a record is 48 bytes");
#define TICK_FREE 0u             /* tick of a free record (the clock starts at 1) */

struct prefix {
    struct paging *pg;
    struct swap *sw;
    uint32_t nr;                 /* page ids per record (n_regions) */
    uint32_t scap, mask;         /* slots (a power of two, 0: none yet); scap - 1 */
    struct pfx_slot *slot;       /* scap slots */
    uint32_t rcap, n_full;       /* records allocated (0, or >= PFX_MIN_CAP); in use */
    uint32_t free_head;          /* the free list through pfx_rec.parent, or PFX_NONE */
    struct pfx_rec *rec;         /* rcap records */
    uint64_t *tick;              /* rcap: pc->clock at record i's last lookup or attach (its
                                    publish); TICK_FREE: a free record */
    pg_page_id *pages;           /* rcap * nr: record i's pages at i * nr, region order */
    uint64_t clock;              /* lookups and publishes so far (the LRU clock) */
    struct prefix_counters c;
    uint32_t *plan;              /* records a reclaim plan drops, in order (n_plan) */
    uint32_t n_plan;
    uint8_t *in_plan;            /* during a host drop: rcap flags, the plan's demotions */
    /* a call's reclaim (swap/undo.c): planned drops stashed on the host tier (cache_stash)
       until the call ends: removed at its success, brought back at its failure */
    uint32_t *stash, n_stash, stash_cap;
    uint8_t *stash_moved;        /* stash_cap * nr: which pages of each went down */
    uint8_t *stash_demoted;      /* stash_cap: a demotion (kept at commit), not a drop */
    uint32_t act_lost;           /* the journaled demotions that fell back to a drop */
    /* tests (prefix_test_limits): records never grow past max_recs (0: no cap); the
       fail_at-th allocation of the index (publish's) from the arming on fails (0: none);
       n_allocs counts them from the arming on */
    uint32_t max_recs, fail_at, n_allocs;
};

/* ---- allocation (the tests' injection point) ------------------------------------------- */

static bool alloc_fails(struct prefix *pc)
{
    return ++pc->n_allocs == pc->fail_at && pc->fail_at;
}

static void *pfx_calloc(struct prefix *pc, size_t n, size_t size)
{
    return alloc_fails(pc) ? NULL : calloc(n, size);
}

/* realloc of *p to n elements of size (*p unchanged on failure). -ENOMEM. */
static int pfx_grow(struct prefix *pc, void *p, size_t n, size_t size)
{
    void *q = alloc_fails(pc) ? NULL : realloc(*(void **)p, n * size);
    if (!q)
        return -ENOMEM;
    *(void **)p = q;
    return 0;
}

/* ---- the slots -------------------------------------------------------------------------- */

/* The namespace's share of the hash, once per call (splitmix64's finalizer). */
static inline uint64_t ns_mix(uint64_t ns)
{
    uint64_t h = ns + 0x9E3779B97F4A7C15ULL;
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ULL;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBULL;
    return h ^ (h >> 31);
}

/* The key's first word (a digest's: uniform already) xor the namespace's share. Home slot:
   the low bits; tag: the high 32. */
static inline uint64_t key_hash(uint64_t k0, uint64_t nsm)
{
    return k0 ^ nsm;
}

static inline uint32_t home_of(const struct prefix *pc, uint64_t h)
{
    return (uint32_t)h & pc->mask;
}

static inline uint32_t tag_of(uint64_t h)
{
    return (uint32_t)(h >> 32);
}

static inline void key_load(const void *keys, size_t i, uint64_t k[4])
{
    memcpy(k, (const uint8_t *)keys + i * PREFIX_KEY_BYTES, PREFIX_KEY_BYTES);
}

static inline bool rec_is(const struct pfx_rec *r, const uint64_t k[4], uint64_t ns)
{
    return r->key[0] == k[0] && r->key[1] == k[1] && r->ns == ns && r->key[2] == k[2] &&
           r->key[3] == k[3];
}

/* The slot of (k, ns), nsm = ns_mix(ns), or PFX_NONE. */
static inline uint32_t find_slot(const struct prefix *pc, const uint64_t k[4], uint64_t ns,
                                 uint64_t nsm)
{
    if (!pc->scap)
        return PFX_NONE;
    uint64_t h = key_hash(k[0], nsm);
    for (uint32_t i = home_of(pc, h), tag = tag_of(h);; i = (i + 1) & pc->mask) {
        struct pfx_slot s = pc->slot[i];
        if (s.rec == PFX_NONE)
            return PFX_NONE;
        if (s.tag == tag && rec_is(&pc->rec[s.rec], k, ns))
            return i;
    }
}

/* The record of (k, ns), or PFX_NONE. */
static inline uint32_t find(const struct prefix *pc, const uint64_t k[4], uint64_t ns,
                            uint64_t nsm)
{
    uint32_t i = find_slot(pc, k, ns, nsm);
    return i == PFX_NONE ? PFX_NONE : pc->slot[i].rec;
}

/* Enters record r (absent) in the first empty slot of its probe. */
static void slot_insert(struct prefix *pc, uint32_t r)
{
    uint64_t h = key_hash(pc->rec[r].key[0], ns_mix(pc->rec[r].ns));
    uint32_t i = home_of(pc, h);
    while (pc->slot[i].rec != PFX_NONE)
        i = (i + 1) & pc->mask;
    pc->slot[i] = (struct pfx_slot){ tag_of(h), r };
}

/* Empties slot i, shifting back the slots after it that may move (linear probing's
   deletion: every record stays reachable from its home without tombstones). */
static void slot_delete(struct prefix *pc, uint32_t i)
{
    for (uint32_t j = (i + 1) & pc->mask; pc->slot[j].rec != PFX_NONE; j = (j + 1) & pc->mask) {
        const struct pfx_rec *r = &pc->rec[pc->slot[j].rec];
        uint32_t home = home_of(pc, key_hash(r->key[0], ns_mix(r->ns)));
        if (((j - home) & pc->mask) >= ((j - i) & pc->mask)) {   /* home not in (i, j] */
            pc->slot[i] = pc->slot[j];
            i = j;
        }
    }
    pc->slot[i].rec = PFX_NONE;
}

/* New slots for scap (a power of two) records, filled from the records. -ENOMEM. */
static int slots_rebuild(struct prefix *pc, uint32_t scap)
{
    struct pfx_slot *slot = pfx_calloc(pc, scap, sizeof *slot);
    if (!slot)
        return -ENOMEM;
    for (uint32_t i = 0; i < scap; i++)
        slot[i].rec = PFX_NONE;
    free(pc->slot);
    pc->slot = slot;
    pc->scap = scap;
    pc->mask = scap - 1;
    for (uint32_t r = 0; r < pc->rcap; r++)
        if (pc->tick[r] != TICK_FREE)
            slot_insert(pc, r);
    return 0;
}

/* ---- the records ------------------------------------------------------------------------ */

/* rcap grown to cap records (the new ones free). -ENOMEM: rcap as it was (an array that did
   grow keeps its size: the next growth reuses it). */
static int recs_grow(struct prefix *pc, uint32_t cap)
{
    if (pfx_grow(pc, &pc->rec, cap, sizeof *pc->rec) ||
        pfx_grow(pc, &pc->tick, cap, sizeof *pc->tick) ||
        pfx_grow(pc, &pc->pages, (size_t)cap * pc->nr, sizeof *pc->pages))
        return -ENOMEM;
    for (uint32_t r = cap; r-- > pc->rcap;) {
        pc->tick[r] = TICK_FREE;
        pc->rec[r].parent = pc->free_head;
        pc->free_head = r;
    }
    pc->rcap = cap;
    return 0;
}

/* Room for `extra` more records: free records, and slots at load <= 1/2. -ENOMEM (also past
   the tests' cap). Changes no entry. */
static int reserve(struct prefix *pc, size_t extra)
{
    uint64_t live = (uint64_t)pc->n_full + extra, cap = PFX_MIN_CAP;
    if (live > PFX_MAX_RECS || (pc->max_recs && live > pc->max_recs))
        return -ENOMEM;
    if (live > pc->rcap) {
        while (cap < live)
            cap *= 2;
        if (pc->max_recs && cap > pc->max_recs)
            cap = pc->max_recs;
        int rc = recs_grow(pc, (uint32_t)cap);
        if (rc)
            return rc;
    }
    if (pc->scap && live * 2 <= pc->scap)
        return 0;
    for (cap = PFX_MIN_CAP; live * 2 > cap;)
        cap *= 2;
    return slots_rebuild(pc, (uint32_t)cap);
}

/* Takes a free record (reserve made one) for (k, ns), published at tick under parent. */
static uint32_t rec_take(struct prefix *pc, const uint64_t k[4], uint64_t ns, uint64_t tick,
                         uint32_t parent)
{
    uint32_t r = pc->free_head;
    KVVM_ASSERT(r < pc->rcap && pc->tick[r] == TICK_FREE);   /* reserve made one */
    pc->free_head = pc->rec[r].parent;
    pc->rec[r] = (struct pfx_rec){ .key = { k[0], k[1], k[2], k[3] }, .ns = ns,
                                   .parent = parent, .children = 0 };
    pc->tick[r] = tick;
    pc->n_full++;
    slot_insert(pc, r);
    return r;
}

/* Removes record i: its pages to their other holders (or freed). scan: relink its
   children, if any (none in a plan's leaves-first order or a namespace's whole drop). */
static void rec_remove(struct prefix *pc, uint32_t i, bool scan)
{
    KVVM_ASSERT(i < pc->rcap && pc->tick[i] != TICK_FREE && pc->n_full > 0);
    struct pfx_rec *r = &pc->rec[i];
    uint64_t k[4] = { r->key[0], r->key[1], r->key[2], r->key[3] };
    slot_delete(pc, find_slot(pc, k, r->ns, ns_mix(r->ns)));
    paging_unhold(pc->pg, &pc->pages[(size_t)i * pc->nr], pc->nr);
    KVVM_ASSERT(r->parent == PFX_NONE || pc->tick[r->parent] == TICK_FREE ||
                pc->rec[r->parent].children > 0);   /* its parent counts it */
    if (r->parent != PFX_NONE && pc->tick[r->parent] != TICK_FREE)   /* (a whole drop) */
        pc->rec[r->parent].children--;
    for (uint32_t j = 0; scan && r->children && j < pc->rcap; j++)
        if (pc->tick[j] != TICK_FREE && pc->rec[j].parent == i) {
            pc->rec[j].parent = PFX_NONE;   /* a chain's head now */
            r->children--;
        }
    KVVM_ASSERT(!scan || !r->children);  /* every child found and relinked */
    pc->tick[i] = TICK_FREE;
    r->parent = pc->free_head;
    r->children = 0;
    pc->free_head = i;
    pc->n_full--;
}

/* ---- the calls ---------------------------------------------------------------------- */

/* Keys of keys[0..n) not in ns (a key twice counted twice): the records a publish takes at
   most. */
static size_t absent(const struct prefix *pc, uint64_t ns, const void *keys, size_t n)
{
    uint64_t nsm = ns_mix(ns);
    size_t a = 0;
    for (size_t b = 0; b < n; b++) {
        uint64_t k[4];
        key_load(keys, b, k);
        a += find_slot(pc, k, ns, nsm) == PFX_NONE;
    }
    return a;
}

int prefix_publish(struct prefix *pc, uint64_t h, uint64_t ns, const void *keys, size_t n)
{
    struct paging *pg = pc->pg;
    if (n > UINT32_MAX)
        return -EINVAL;
    pg_page_id *ids = pfx_calloc(pc, (n ? n : 1) * pc->nr, sizeof *ids);
    if (!ids)
        return -ENOMEM;
    int rc = paging_seq_blocks(pg, h, (uint32_t)n, ids);   /* checks h and the blocks */
    if (!rc)
        rc = reserve(pc, absent(pc, ns, keys, n));
    if (rc) {
        free(ids);
        return rc;
    }
    /* commit: nothing below fails */
    uint64_t tick = ++pc->clock, nsm = ns_mix(ns);
    uint32_t prev = PFX_NONE;
    int added = 0;
    for (size_t b = 0; b < n; b++) {
        uint64_t k[4];
        key_load(keys, b, k);
        uint32_t i = find(pc, k, ns, nsm);
        if (i == PFX_NONE) {            /* a key present keeps its entry (and s its pages) */
            i = rec_take(pc, k, ns, tick, prev);
            pg_page_id *p = &pc->pages[(size_t)i * pc->nr];
            memcpy(p, &ids[b * pc->nr], pc->nr * sizeof *p);
            paging_hold(pg, p, pc->nr);
            if (prev != PFX_NONE)
                pc->rec[prev].children++;
            added++;
        }
        prev = i;
    }
    free(ids);
    return added;
}

/* The hot loop of a lookup: the leading keys of keys[0..n) present (n <= LOOKUP_RUN), their
   records in recs. Reads only: the ticks are written after the probes (a store into the
   ticks between the dependent loads of the probes costs more than a second pass). */
#define LOOKUP_RUN 64
static size_t lookup_run(const struct prefix *pc, uint64_t ns, uint64_t nsm, const void *keys,
                         size_t n, uint32_t *recs)
{
    const struct pfx_slot *slot = pc->slot;
    const struct pfx_rec *rec = pc->rec;
    uint32_t mask = pc->mask;
    const uint8_t *kp = keys;
    for (size_t b = 0; b < n; b++, kp += PREFIX_KEY_BYTES) {
        uint64_t k0;
        memcpy(&k0, kp, sizeof k0);
        uint64_t hh = key_hash(k0, nsm);
        uint32_t i = (uint32_t)hh & mask, tag = tag_of(hh);
        for (;; i = (i + 1) & mask) {
            struct pfx_slot s = slot[i];
            if (s.rec == PFX_NONE)
                return b;
            const struct pfx_rec *r = &rec[s.rec];
            if (s.tag == tag && r->key[0] == k0 && r->ns == ns &&
                !memcmp(&r->key[1], kp + 8, PREFIX_KEY_BYTES - 8)) {
                recs[b] = s.rec;
                break;
            }
        }
    }
    return n;
}

size_t prefix_lookup(struct prefix *pc, uint64_t ns, const void *keys, size_t n,
                     uint8_t *where, pg_page_id *ids, bool count)
{
    uint64_t tick = ++pc->clock, nsm = ns_mix(ns);
    uint32_t recs[LOOKUP_RUN];
    size_t b = 0;
    while (pc->scap && b < n) {
        size_t m = n - b < LOOKUP_RUN ? n - b : LOOKUP_RUN;
        size_t got = lookup_run(pc, ns, nsm, (const uint8_t *)keys + b * PREFIX_KEY_BYTES, m,
                                recs);
        for (size_t j = 0; j < got; j++)
            pc->tick[recs[j]] = tick;
        for (size_t j = 0; (where || ids) && j < got; j++) {
            const pg_page_id *p = &pc->pages[(size_t)recs[j] * pc->nr];
            if (where) {
                uint8_t w = 0;
                for (uint32_t r = 0; r < pc->nr; r++) {
                    uint8_t t = paging_page_held(pc->pg, p[r]).where;
                    w = t > w ? t : w;
                }
                where[b + j] = w;
            }
            if (ids)
                memcpy(&ids[(b + j) * pc->nr], p, pc->nr * sizeof *p);
        }
        b += got;
        if (got < m)
            break;
    }
    if (count) {
        pc->c.lookups++;
        pc->c.hit_blocks += b;
    }
    return b;
}

bool prefix_peek(struct prefix *pc, uint64_t ns, const void *key, uint8_t *where)
{
    uint32_t rec;
    if (!pc->scap || lookup_run(pc, ns, ns_mix(ns), key, 1, &rec) != 1)
        return false;
    KVVM_ASSERT(pc->tick[rec] != TICK_FREE);      /* a slot names a record in use */
    for (uint32_t r = 0; where && r < pc->nr; r++)
        where[r] = paging_page_held(pc->pg, pc->pages[(size_t)rec * pc->nr + r]).where;
    return true;
}

void prefix_count_hits(struct prefix *pc, size_t k)
{
    pc->c.lookups++;
    pc->c.hit_blocks += k;
}

size_t prefix_drop(struct prefix *pc, uint64_t ns, const void *keys, size_t n)
{
    size_t removed = 0;
    if (!keys) {                        /* every entry of ns: its chains go whole */
        for (uint32_t i = 0; i < pc->rcap; i++)
            if (pc->tick[i] != TICK_FREE && pc->rec[i].ns == ns) {
                rec_remove(pc, i, false);
                removed++;
            }
        return removed;
    }
    uint64_t nsm = ns_mix(ns);
    for (size_t b = 0; b < n; b++) {
        uint64_t k[4];
        key_load(keys, b, k);
        uint32_t i = find(pc, k, ns, nsm);
        if (i != PFX_NONE) {
            rec_remove(pc, i, true);
            removed++;
        }
    }
    return removed;
}

void prefix_counters(const struct prefix *pc, struct prefix_counters *out)
{
    *out = pc->c;
    out->entries = pc->n_full;
    out->bytes = (uint64_t)pc->scap * sizeof *pc->slot +
                 (uint64_t)pc->rcap * (sizeof *pc->rec + sizeof *pc->tick +
                                       pc->nr * sizeof *pc->pages);
}

uint32_t prefix_test_limits(struct prefix *pc, uint32_t max_records, uint32_t fail_alloc_at)
{
    uint32_t made = pc->n_allocs;
    pc->max_recs = max_records;
    pc->fail_at = fail_alloc_at;
    pc->n_allocs = 0;
    return made;
}
/* ---- reclaim (swap_cache_ops) --------------------------------------------------------- */

/* Whether only entries hold record i's pages (no sequence, release or transfer). */
static bool reclaimable(struct prefix *pc, uint32_t i)
{
    const pg_page_id *p = &pc->pages[(size_t)i * pc->nr];
    for (uint32_t r = 0; r < pc->nr; r++)
        if (paging_page_held(pc->pg, p[r]).others)
            return false;
    return true;
}

/* A binary min-heap of records by tick (least recently used on top). */
static void heap_push(const struct prefix *pc, uint32_t *h, uint32_t *n, uint32_t i)
{
    uint32_t k = (*n)++;
    while (k && pc->tick[h[(k - 1) / 2]] > pc->tick[i]) {
        h[k] = h[(k - 1) / 2];
        k = (k - 1) / 2;
    }
    h[k] = i;
}

static uint32_t heap_pop(const struct prefix *pc, uint32_t *h, uint32_t *n)
{
    KVVM_ASSERT(*n > 0);
    uint32_t top = h[0], last = h[--(*n)], k = 0;
    for (;;) {
        uint32_t c = 2 * k + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && pc->tick[h[c + 1]] < pc->tick[h[c]])
            c++;
        if (pc->tick[h[c]] >= pc->tick[last])
            break;
        h[k] = h[c];
        k = c;
    }
    h[k] = last;
    return top;
}

static void cache_forget(void *arg)
{
    struct prefix *pc = arg;
    free(pc->plan);
    pc->plan = NULL;
    pc->n_plan = 0;
}

/* A walk over candidate records, least recently used first, leaves first: a record comes
   after its children that must go first (rem: how many are left; strict: every child, so
   a record with a child that is no candidate never comes; else only candidate children). */
struct pfx_walk {
    uint32_t *rem, *heap, nh;
    uint8_t *cand;
};

static void walk_end(struct pfx_walk *w)
{
    free(w->rem);
    free(w->heap);
    free(w->cand);
}

/* -ENOMEM (nothing to walk). */
static int walk_begin(struct prefix *pc, struct pfx_walk *w,
                      bool (*is_cand)(struct prefix *pc, uint32_t i), bool strict)
{
    w->nh = 0;
    w->rem = malloc(pc->rcap * sizeof *w->rem);
    w->heap = malloc(pc->rcap * sizeof *w->heap);
    w->cand = calloc(pc->rcap, 1);
    if (!w->rem || !w->heap || !w->cand) {
        walk_end(w);
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < pc->rcap; i++) {
        w->rem[i] = strict && pc->tick[i] != TICK_FREE ? pc->rec[i].children : 0;
        w->cand[i] = pc->tick[i] != TICK_FREE && is_cand(pc, i);
    }
    for (uint32_t i = 0; !strict && i < pc->rcap; i++)
        if (w->cand[i] && pc->rec[i].parent != PFX_NONE)
            w->rem[pc->rec[i].parent]++;
    for (uint32_t i = 0; i < pc->rcap; i++)
        if (w->cand[i] && !w->rem[i])
            heap_push(pc, w->heap, &w->nh, i);
    return 0;
}

/* The next record of the walk (its parent may come next), or PFX_NONE. */
static uint32_t walk_next(struct prefix *pc, struct pfx_walk *w)
{
    if (!w->nh)
        return PFX_NONE;
    uint32_t i = heap_pop(pc, w->heap, &w->nh), p = pc->rec[i].parent;
    if (p != PFX_NONE && !--w->rem[p] && w->cand[p])
        heap_push(pc, w->heap, &w->nh, p);
    return i;
}

/* Whether one of record i's pages is on the device. */
static bool on_device(struct prefix *pc, uint32_t i)
{
    const pg_page_id *p = &pc->pages[(size_t)i * pc->nr];
    for (uint32_t r = 0; r < pc->nr; r++)
        if (paging_page_held(pc->pg, p[r]).where == PG_WHERE_DEVICE)
            return true;
    return false;
}

/* Plans dropping reclaimable entries, least recently used leaves first, until want frames
   are counted (a parent goes after all its children that are planned; a child left keeps
   its place as a chain's head). Entries with no page on the device are not planned: they
   free no frame, and where no disk takes spills their host pages are the host room the
   plan counts for its moves (swap_cache_ops.host_drop), which a stash of theirs (a call's
   reclaim keeps its planned drops until the call ends) would take away: issue 31, the
   call failed short of frames after its moves. */
static uint32_t cache_plan(void *arg, uint32_t want)
{
    struct prefix *pc = arg;
    struct pfx_walk w;
    uint32_t frees = 0, i;
    cache_forget(pc);
    if (!pc->n_full)
        return 0;
    pc->plan = malloc(pc->rcap * sizeof *pc->plan);
    if (!pc->plan || walk_begin(pc, &w, reclaimable, true)) {
        free(pc->plan);                 /* no plan: reclaim goes on without the cache */
        pc->plan = NULL;
        return 0;
    }
    while (frees < want && (i = walk_next(pc, &w)) != PFX_NONE) {
        if (!on_device(pc, i))
            continue;                   /* frees no frame: its host room stays (below) */
        frees += paging_plan_pages(pc->pg, &pc->pages[(size_t)i * pc->nr], pc->nr, 1);
        KVVM_ASSERT(pc->n_plan < pc->rcap);   /* a record once */
        pc->plan[pc->n_plan++] = i;
    }
    walk_end(&w);
    return frees;
}

/* Whether record i has a host page only entries hold (one swap_cache_ops.spill writes). */
static bool spillable(struct prefix *pc, uint32_t i)
{
    return paging_held_host(pc->pg, &pc->pages[(size_t)i * pc->nr], pc->nr) > 0;
}

/* Starts writing up to max host pages only entries hold to disk, least recently used
   entries first, leaves first among them (a parent's pages after its children's that spill
   too: every such page can go, so the room facts that count them as spillable hold).
   Returns the writes started. */
static uint32_t cache_spill(void *arg, uint32_t max)
{
    struct prefix *pc = arg;
    struct pfx_walk w;
    uint32_t started = 0, i;
    if (!paging_held_spillable(pc->pg) || walk_begin(pc, &w, spillable, false))
        return 0;                       /* (O(1) when there is nothing to write, or no room) */
    while (started < max && (i = walk_next(pc, &w)) != PFX_NONE) {
        uint32_t got;
        int rc = paging_held_spill(pc->pg, &pc->pages[(size_t)i * pc->nr], pc->nr,
                                   max - started, &got);
        started += got;
        pc->c.spills += got;
        if (rc)
            break;                      /* the disk is full (or gone): nothing more goes */
    }
    walk_end(&w);
    return started;
}

static bool stashed(const struct prefix *pc, uint32_t i);

/* Whether only entries hold record i's pages and none is on the device (host and disk
   pages: a host entry's successors spilled to disk go before it, leaves first), record i
   no demotion of the pending reclaim plan (a host drop may come from that plan's own
   moves, before its demotions; its drops are dropped already, or never acted on). */
static bool host_droppable(struct prefix *pc, uint32_t i)
{
    const pg_page_id *p = &pc->pages[(size_t)i * pc->nr];
    if ((pc->in_plan && pc->in_plan[i]) || stashed(pc, i) || !reclaimable(pc, i))
        return false;               /* (a stashed one: the call's journal keeps it) */
    for (uint32_t r = 0; r < pc->nr; r++)
        if (paging_page_held(pc->pg, p[r]).where == PG_WHERE_DEVICE)
            return false;
    return true;
}

/* Host slots that dropping record i frees: its HOST pages no other entry holds (a page two
   entries share, or one a write to disk is leaving, is not counted: a count never more
   than the drops free at once). */
static uint32_t host_frees(struct prefix *pc, uint32_t i)
{
    const pg_page_id *p = &pc->pages[(size_t)i * pc->nr];
    uint32_t n = 0;
    for (uint32_t r = 0; r < pc->nr; r++)
        n += paging_held_host(pc->pg, &p[r], 1) && paging_page_held(pc->pg, p[r]).ents == 1;
    return n;
}

/* The pending plan without the records removed since it was made: a host drop may come
   from that plan's own moves (a swap-out's host room) and take a planned drop whose pages
   are all below (a leaf planned before its parent on the device), which the plan's later
   steps (cache_stash after the moves) must not take again. No record is taken between a
   plan and its act (publish runs in no call that reclaims), so a free one is gone. */
static void plan_prune(struct prefix *pc)
{
    uint32_t n = 0;
    for (uint32_t k = 0; k < pc->n_plan; k++)
        if (pc->tick[pc->plan[k] & ~PLAN_DEMOTE] != TICK_FREE)
            pc->plan[n++] = pc->plan[k];
    pc->n_plan = n;
}

/* Counts (act false) or makes (act true) `want` host slots free by dropping entries whose
   pages are all below the device, least recently used first, leaves first (a parent after
   all its children), never a pending plan's demotions; returns the slots counted or freed
   (a count short of want: the caller drops nothing). The same walk both times: acting
   drops exactly the entries counted. */
static uint32_t cache_host_drop(void *arg, uint32_t want, bool act)
{
    struct prefix *pc = arg;
    struct pfx_walk w;
    uint32_t frees = 0, i;
    if (!want || !paging_held_host_any(pc->pg))
        return 0;                       /* (O(1) when no host page is only entries') */
    if (pc->n_plan && !(pc->in_plan = calloc(pc->rcap, 1)))
        return 0;
    for (uint32_t k = 0; k < pc->n_plan; k++)
        if (pc->plan[k] & PLAN_DEMOTE)
            pc->in_plan[pc->plan[k] & ~PLAN_DEMOTE] = 1;
    if (!walk_begin(pc, &w, host_droppable, true)) {
        while (frees < want && (i = walk_next(pc, &w)) != PFX_NONE) {
            frees += host_frees(pc, i);
            if (act) {
                rec_remove(pc, i, true);
                pc->c.evictions++;
            }
        }
        walk_end(&w);
    }
    free(pc->in_plan);
    pc->in_plan = NULL;
    if (act)
        plan_prune(pc);
    return frees;
}

/* Planned drops become demotions while take grants their device pages' slots below, the
   plan's last first: when the room is short, the entries dropped are the least recently
   used and the leaves (a chain keeps its head), as the plan's order says. */
static uint32_t cache_demote(void *arg, bool (*take)(void *ctx, uint32_t k), void *ctx)
{
    struct prefix *pc = arg;
    uint32_t slots = 0;
    for (uint32_t k = pc->n_plan; k-- > 0;) {
        const pg_page_id *p = &pc->pages[(size_t)pc->plan[k] * pc->nr];
        uint32_t dev = 0;
        for (uint32_t r = 0; r < pc->nr; r++)
            dev += paging_page_held(pc->pg, p[r]).where == PG_WHERE_DEVICE;
        if (dev && take(ctx, dev)) {
            pc->plan[k] |= PLAN_DEMOTE;
            slots += dev;
        }
    }
    return slots;
}

/* Drops the planned drops (demotions: false), or demotes the planned demotions (true; one
   whose pages cannot all go down is dropped: that frees at least as much). Leaves first:
   a planned record has no children left when its turn comes. */
static bool stash_push(struct prefix *pc, uint32_t i, bool demoted);

static void cache_act(void *arg, bool demotions)
{
    struct prefix *pc = arg;
    bool journal = demotions && pc->sw && swap_journal_on(pc->sw);
    for (uint32_t k = 0; k < pc->n_plan; k++) {
        uint32_t i = pc->plan[k] & ~PLAN_DEMOTE;
        if (!(pc->plan[k] & PLAN_DEMOTE) == demotions)
            continue;
        pc->c.evictions++;
        /* a call's reclaim (the journal on): the demotion is kept until the call ends, its
           pages brought back up should the call fail (cache_stash_end) */
        if (demotions && stash_push(pc, i, journal)) {
            if (journal)
                pc->stash_demoted[pc->n_stash - 1] = 1;
            continue;
        }
        rec_remove(pc, i, true);
        pc->act_lost += journal;        /* a drop: no undo brings it back */
    }
}

/* Room for one more stash record. */
static int stash_reserve(struct prefix *pc)
{
    if (pc->n_stash < pc->stash_cap)
        return 0;
    uint32_t cap = pc->stash_cap ? 2 * pc->stash_cap : 8;
    uint32_t *st = realloc(pc->stash, cap * sizeof *st);
    if (!st)
        return -ENOMEM;
    pc->stash = st;
    uint8_t *mv = realloc(pc->stash_moved, (size_t)cap * (pc->nr ? pc->nr : 1));
    if (!mv)
        return -ENOMEM;
    pc->stash_moved = mv;
    uint8_t *dm = realloc(pc->stash_demoted, cap);
    if (!dm)
        return -ENOMEM;
    pc->stash_demoted = dm;
    pc->stash_cap = cap;
    return 0;
}

static bool stashed(const struct prefix *pc, uint32_t i)
{
    for (uint32_t k = 0; k < pc->n_stash; k++)
        if (pc->stash[k] == i)
            return true;
    return false;
}

/* A call's reclaim drops its planned drops in two steps (swap_cache_ops.stash): a record
   whose device pages the host tier's free slots take as they are goes down there (its
   pages only; nothing else moves) and stays in the index until the call ends; the others
   are dropped now. Returns those dropped now (no undo takes them back). */
/* Moves record i's device pages that only entries hold to the host tier (paging_held_down)
   and, with record, keeps it in the stash (which pages went down: stash_end brings them
   back). false: it could not all go down (no stash room, no host room, a move refused; the
   pages moved stay below): the caller drops it. */
static bool stash_push(struct prefix *pc, uint32_t i, bool record)
{
    const pg_page_id *p = &pc->pages[(size_t)i * pc->nr];
    uint32_t moved;
    if (record && stash_reserve(pc))
        return false;
    uint8_t *mv = record ? &pc->stash_moved[(size_t)pc->n_stash * pc->nr] : NULL;
    for (uint32_t r = 0; mv && r < pc->nr; r++) {
        struct pg_held_page x = paging_page_held(pc->pg, p[r]);
        mv[r] = x.where == PG_WHERE_DEVICE && x.others == 0;   /* what held_down moves */
    }
    if (paging_held_down(pc->pg, p, pc->nr, &moved))
        return false;
    if (record) {
        pc->stash_demoted[pc->n_stash] = 0;
        pc->stash[pc->n_stash++] = i;
    }
    return true;
}

static uint32_t cache_stash(void *arg, uint64_t *room)
{
    struct prefix *pc = arg;
    uint32_t lost = pc->act_lost;
    pc->act_lost = 0;
    for (uint32_t k = 0; k < pc->n_plan; k++) {
        uint32_t i = pc->plan[k] & ~PLAN_DEMOTE, dev = 0;
        if ((pc->plan[k] & PLAN_DEMOTE) || stashed(pc, i))
            continue;
        const pg_page_id *p = &pc->pages[(size_t)i * pc->nr];
        for (uint32_t r = 0; r < pc->nr; r++)
            dev += paging_page_held(pc->pg, p[r]).where == PG_WHERE_DEVICE;
        if (dev <= paging_host_free(pc->pg) && dev <= *room && stash_push(pc, i, true)) {
            *room -= dev;
            continue;
        }
        rec_remove(pc, i, true);
        pc->c.evictions++;
        lost++;
    }
    return lost;
}

/* The call ends: its stashed records are dropped (commit) or brought back to the device
   (the undo of a failed call); its journaled demotions stay below (commit) or come back up
   too. Returns how many could not be brought back. */
static uint32_t cache_stash_end(void *arg, bool commit)
{
    struct prefix *pc = arg;
    uint32_t failed = 0;
    pc->act_lost = 0;
    for (uint32_t k = pc->n_stash; k-- > 0;) {
        uint32_t i = pc->stash[k];
        if (commit && !pc->stash_demoted[k]) {
            rec_remove(pc, i, true);
            pc->c.evictions++;
        } else if (!commit) {
            int rc = paging_held_back(pc->pg, &pc->pages[(size_t)i * pc->nr],
                                      &pc->stash_moved[(size_t)k * pc->nr], pc->nr);
            failed += rc != 0;
            pc->c.evictions -= pc->stash_demoted[k] && !rc;   /* (counted at the act) */
        }
    }
    pc->n_stash = 0;
    return failed;
}

/* ---- life ----------------------------------------------------------------------------- */

int prefix_create(struct paging *pg, struct swap *sw, struct prefix **out)
{
    struct paging_params pp;
    struct prefix *pc = calloc(1, sizeof *pc);
    if (!pc)
        return -ENOMEM;
    paging_params_get(pg, &pp);
    pc->pg = pg;
    pc->sw = sw;
    pc->nr = pp.n_regions;
    pc->free_head = PFX_NONE;
    if (sw)
        swap_set_cache(sw, &(struct swap_cache_ops){ pc, cache_plan, cache_demote,
                                                     cache_act, cache_forget, cache_spill,
                                                     cache_host_drop, cache_stash,
                                                     cache_stash_end });
    *out = pc;
    return 0;
}

void prefix_destroy(struct prefix *pc)
{
    if (!pc)
        return;
    for (uint32_t i = 0; i < pc->rcap; i++)
        if (pc->tick[i] != TICK_FREE)
            paging_unhold(pc->pg, &pc->pages[(size_t)i * pc->nr], pc->nr);
    cache_forget(pc);
    free(pc->stash);
    free(pc->stash_moved);
    free(pc->stash_demoted);
    free(pc->slot);
    free(pc->rec);
    free(pc->tick);
    free(pc->pages);
    free(pc);
}

/* ---- the checker ---------------------------------------------------------------------- */

static int ck_fail(char *why, size_t len, const char *fmt, uint32_t a, uint32_t b)
    __attribute__((format(printf, 3, 0)));
static int ck_fail(char *why, size_t len, const char *fmt, uint32_t a, uint32_t b)
{
    char msg[256];
    snprintf(msg, sizeof msg, fmt, a, b);
    klog_error("invariant violated: %s", msg);   /* the debug build aborts after it */
    if (why && len)
        snprintf(why, len, "%s", msg);
    return -EUCLEAN;
}

/* The slots: each names a record in use whose tag it carries, found by its key; as many as
   records in use, at load <= 1/2. */
static int check_slots(struct prefix *pc, char *why, size_t len)
{
    uint32_t used = 0;
    for (uint32_t i = 0; i < pc->scap; i++) {
        struct pfx_slot s = pc->slot[i];
        if (s.rec == PFX_NONE)
            continue;
        used++;
        if (s.rec >= pc->rcap || pc->tick[s.rec] == TICK_FREE)
            return ck_fail(why, len, "prefix slot %u names record %u, not an entry", i, s.rec);
        const struct pfx_rec *r = &pc->rec[s.rec];
        if (s.tag != tag_of(key_hash(r->key[0], ns_mix(r->ns))) ||
            find_slot(pc, r->key, r->ns, ns_mix(r->ns)) != i)
            return ck_fail(why, len, "prefix slot %u (record %u) is not found by its key", i,
                           s.rec);
    }
    if (used != pc->n_full || (pc->scap && (uint64_t)used * 2 > pc->scap))
        return ck_fail(why, len, "prefix index: %u slots used for %u entries", used,
                       pc->n_full);
    uint32_t free_n = 0;
    for (uint32_t r = pc->free_head; r != PFX_NONE && free_n <= pc->rcap; r = pc->rec[r].parent)
        if (r >= pc->rcap || pc->tick[r] != TICK_FREE || ++free_n > pc->rcap)
            return ck_fail(why, len, "prefix index: free list record %u (%u free)", r, free_n);
    if (free_n + pc->n_full != pc->rcap)
        return ck_fail(why, len, "prefix index: %u free records of %u", free_n, pc->rcap);
    return 0;
}

int prefix_check(struct prefix *pc, char *why, size_t len)
{
    struct paging_params pp;
    paging_params_get(pc->pg, &pp);
    uint32_t full = 0, max_pages = pp.max_pages;
    uint32_t *refs = calloc(max_pages ? max_pages : 1, sizeof *refs);
    uint32_t *kids = calloc(pc->rcap ? pc->rcap : 1, sizeof *kids);
    int rc = refs && kids ? check_slots(pc, why, len) : -ENOMEM;
    for (uint32_t i = 0; !rc && i < pc->rcap; i++) {
        const struct pfx_rec *r = &pc->rec[i];
        if (pc->tick[i] == TICK_FREE)
            continue;
        full++;
        if (r->parent != PFX_NONE && (r->parent >= pc->rcap ||
                                      pc->tick[r->parent] == TICK_FREE))
            rc = ck_fail(why, len, "prefix record %u names record %u, not an entry, as parent",
                         i, r->parent);
        if (!rc && r->parent != PFX_NONE)
            kids[r->parent]++;
        for (uint32_t k = 0; !rc && k < pc->nr; k++) {
            pg_page_id id = pc->pages[(size_t)i * pc->nr + k];
            if (pg_page_is_none(id) || id.v > max_pages ||
                !paging_page_held(pc->pg, id).ents)
                rc = ck_fail(why, len, "prefix record %u holds page %u, which is not held", i,
                             id.v);
            else
                refs[id.v - 1]++;
        }
    }
    for (uint32_t i = 0; !rc && i < pc->rcap; i++)
        if (pc->tick[i] != TICK_FREE && kids[i] != pc->rec[i].children)
            rc = ck_fail(why, len, "prefix record %u counts %u children", i,
                         pc->rec[i].children);
    if (!rc && full != pc->n_full)
        rc = ck_fail(why, len, "prefix index: %u entries counted %u", full, pc->n_full);
    for (uint32_t v = 1; !rc && v <= max_pages; v++)
        if (paging_page_held(pc->pg, (pg_page_id){ v }).ents != refs[v - 1])
            rc = ck_fail(why, len, "page %u: entries' references counted by paging differ "
                         "from the index's (%u)", v, refs[v - 1]);
    free(refs);
    free(kids);
    return rc == -ENOMEM ? 0 : rc;      /* no memory to check with: nothing to say */
}
