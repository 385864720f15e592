/*
 * prefix/prefix.c: the prefix index (contract in prefix.h). Records of 48 bytes (key,
 * namespace, LRU tick: what a lookup reads and writes) in an open-addressed table (linear
 * probing, tombstones, rebuilt in publish when live records and tombstones pass half the
 * capacity); each record's chain links and pages in parallel arrays (cold: publish, drop
 * and reclaim use them). Records never move between rebuilds, so a parent link is
 * a record index (a rebuild maps them). The keys are digests already: the home slot comes
 * from their first words mixed with the namespace, no hashing of the 32 bytes.
 */
#include "prefix.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common/log.h"

#define PFX_NONE UINT32_MAX
#define PFX_MIN_CAP 64u
#define PLAN_DEMOTE (1u << 31)   /* a plan's record demoted, not dropped (records < 2^30) */

/* What a lookup reads and writes, and nothing else: 48 bytes (the cold chain links are in
   a parallel array), so the table is as small as a bare map's. */
struct pfx_rec {
    uint64_t key[4];             /* the digest (zero-padded by the engine) */
    uint64_t ns;
    uint64_t tick;               /* pc->clock at its last lookup or attach (its publish);
                                    TICK_EMPTY: a free record, TICK_TOMB: a removed one */
};
_Static_assert(sizeof(struct pfx_rec) == 48, "a record is 48 bytes");
#define TICK_EMPTY 0u
#define TICK_TOMB UINT64_MAX     /* (the clock starts at 1 and never gets there) */

struct pfx_link {
    uint32_t parent;             /* record of its predecessor in its chain, or PFX_NONE */
    uint32_t children;           /* records naming it as parent */
};

static inline bool rec_full(const struct pfx_rec *r)
{
    return r->tick != TICK_EMPTY && r->tick != TICK_TOMB;
}

struct prefix {
    struct paging *pg;
    struct swap *sw;
    uint32_t nr;                 /* page ids per record (n_regions) */
    uint32_t cap, mask;          /* records (a power of two; 0: no table yet) */
    uint32_t n_full, n_tomb;
    struct pfx_rec *rec;         /* cap records */
    struct pfx_link *link;       /* cap chain links, record i's at i */
    pg_page_id *pages;           /* cap * nr: record i's pages at i * nr, region order */
    uint64_t clock;              /* lookups and publishes so far (the LRU clock) */
    struct prefix_counters c;
    uint32_t *plan;              /* records a reclaim plan drops, in order (n_plan) */
    uint32_t n_plan;
};

/* ---- the table ---------------------------------------------------------------------- */

static inline uint64_t rec_hash(const uint64_t k[4], uint64_t ns)
{
    uint64_t h = k[0] ^ (k[1] * 0x9E3779B97F4A7C15ULL) ^ (ns * 0xC2B2AE3D27D4EB4FULL);
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ULL;
    return h ^ (h >> 29);
}

static inline void key_load(const void *keys, size_t i, uint64_t k[4])
{
    memcpy(k, (const uint8_t *)keys + i * PREFIX_KEY_BYTES, PREFIX_KEY_BYTES);
}

/* The record of (k, ns), or PFX_NONE. */
static inline uint32_t find(const struct prefix *pc, const uint64_t k[4], uint64_t ns)
{
    if (!pc->cap)
        return PFX_NONE;
    for (uint32_t i = (uint32_t)rec_hash(k, ns) & pc->mask;; i = (i + 1) & pc->mask) {
        const struct pfx_rec *r = &pc->rec[i];
        if (r->tick == TICK_EMPTY)
            return PFX_NONE;
        if (r->key[0] == k[0] && r->key[1] == k[1] && r->ns == ns && r->key[2] == k[2] &&
            r->key[3] == k[3] && r->tick != TICK_TOMB)
            return i;
    }
}

/* A free record for (k, ns), known absent: the first tombstone or empty one of its probe. */
static uint32_t free_slot(struct prefix *pc, const uint64_t k[4], uint64_t ns)
{
    uint32_t i = (uint32_t)rec_hash(k, ns) & pc->mask;
    while (rec_full(&pc->rec[i]))
        i = (i + 1) & pc->mask;
    return i;
}

/* Rebuilds the table with cap records (every live one moved, links mapped). -ENOMEM. */
static int rebuild(struct prefix *pc, uint32_t cap)
{
    struct pfx_rec *rec = calloc(cap, sizeof *rec);
    struct pfx_link *link = calloc(cap, sizeof *link);
    pg_page_id *pages = calloc((size_t)cap * pc->nr, sizeof *pages);
    uint32_t *map = malloc((pc->cap ? pc->cap : 1) * sizeof *map);
    if (!rec || !link || !pages || !map) {
        free(rec);
        free(link);
        free(pages);
        free(map);
        return -ENOMEM;
    }
    struct prefix old = *pc;
    pc->rec = rec;
    pc->link = link;
    pc->pages = pages;
    pc->cap = cap;
    pc->mask = cap - 1;
    pc->n_tomb = 0;
    for (uint32_t i = 0; i < old.cap; i++) {
        map[i] = PFX_NONE;
        if (!rec_full(&old.rec[i]))
            continue;
        uint32_t j = free_slot(pc, old.rec[i].key, old.rec[i].ns);
        rec[j] = old.rec[i];
        link[j] = old.link[i];
        memcpy(&pages[(size_t)j * pc->nr], &old.pages[(size_t)i * pc->nr],
               pc->nr * sizeof *pages);
        map[i] = j;
    }
    for (uint32_t j = 0; j < cap; j++)
        if (rec_full(&rec[j]) && link[j].parent != PFX_NONE)
            link[j].parent = map[link[j].parent];
    free(old.rec);
    free(old.link);
    free(old.pages);
    free(map);
    return 0;
}

/* Room for `extra` more records at load <= 1/2 (tombstones counted). -ENOMEM. */
static int reserve(struct prefix *pc, size_t extra)
{
    uint64_t used = (uint64_t)pc->n_full + pc->n_tomb + extra;
    if (pc->cap && used * 2 <= pc->cap)
        return 0;
    uint64_t live = (uint64_t)pc->n_full + extra, cap = PFX_MIN_CAP;
    while (live * 2 > cap)              /* at most half full after the rebuild */
        cap *= 2;
    if (cap > (1u << 30))
        return -ENOMEM;
    return rebuild(pc, (uint32_t)cap);
}

/* Removes record i: its pages to their other holders (or freed). scan: relink its
   children, if any (none in a plan's leaves-first order or a namespace's whole drop). */
static void rec_remove(struct prefix *pc, uint32_t i, bool scan)
{
    struct pfx_link *l = &pc->link[i];
    paging_unhold(pc->pg, &pc->pages[(size_t)i * pc->nr], pc->nr);
    if (l->parent != PFX_NONE && rec_full(&pc->rec[l->parent]))
        pc->link[l->parent].children--;
    for (uint32_t j = 0; scan && l->children && j < pc->cap; j++)
        if (rec_full(&pc->rec[j]) && pc->link[j].parent == i) {
            pc->link[j].parent = PFX_NONE;  /* a chain's head now */
            l->children--;
        }
    pc->rec[i].tick = TICK_TOMB;
    *l = (struct pfx_link){ PFX_NONE, 0 };
    pc->n_full--;
    pc->n_tomb++;
    /* a tombstone run ending in an empty record is empty itself: probes stop there anyway */
    for (uint32_t j = i; pc->rec[j].tick == TICK_TOMB &&
                         pc->rec[(j + 1) & pc->mask].tick == TICK_EMPTY;
         j = (j - 1) & pc->mask) {
        pc->rec[j].tick = TICK_EMPTY;
        pc->n_tomb--;
    }
}

/* ---- the calls ---------------------------------------------------------------------- */

int prefix_publish(struct prefix *pc, uint64_t h, uint64_t ns, const void *keys, size_t n)
{
    struct paging *pg = pc->pg;
    if (n > UINT32_MAX)
        return -EINVAL;
    pg_page_id *ids = malloc((n ? n : 1) * pc->nr * sizeof *ids);
    if (!ids)
        return -ENOMEM;
    int rc = paging_seq_blocks(pg, h, (uint32_t)n, ids);   /* checks h and the blocks */
    if (!rc)
        rc = reserve(pc, n);
    if (rc) {
        free(ids);
        return rc;
    }
    /* commit: nothing below fails */
    uint64_t tick = ++pc->clock;
    uint32_t prev = PFX_NONE;
    int added = 0;
    for (size_t b = 0; b < n; b++) {
        uint64_t k[4];
        key_load(keys, b, k);
        uint32_t i = find(pc, k, ns);
        if (i == PFX_NONE) {            /* a key present keeps its entry (and s its pages) */
            i = free_slot(pc, k, ns);
            pc->n_tomb -= pc->rec[i].tick == TICK_TOMB;
            pc->rec[i] = (struct pfx_rec){ .key = { k[0], k[1], k[2], k[3] }, .ns = ns,
                                           .tick = tick };
            pc->link[i] = (struct pfx_link){ .parent = prev, .children = 0 };
            pg_page_id *p = &pc->pages[(size_t)i * pc->nr];
            memcpy(p, &ids[b * pc->nr], pc->nr * sizeof *p);
            paging_hold(pg, p, pc->nr);
            if (prev != PFX_NONE)
                pc->link[prev].children++;
            pc->n_full++;
            added++;
        }
        prev = i;
    }
    free(ids);
    return added;
}

size_t prefix_lookup(struct prefix *pc, uint64_t ns, const void *keys, size_t n,
                     uint8_t *where, pg_page_id *ids, bool count)
{
    uint64_t tick = ++pc->clock;
    size_t b;
    for (b = 0; b < n; b++) {
        uint64_t k[4];
        key_load(keys, b, k);
        uint32_t i = find(pc, k, ns);
        if (i == PFX_NONE)
            break;
        pc->rec[i].tick = tick;
        const pg_page_id *p = &pc->pages[(size_t)i * pc->nr];
        if (where) {
            uint8_t w = 0;
            for (uint32_t r = 0; r < pc->nr; r++) {
                uint8_t t = paging_page_where(pc->pg, p[r]);
                w = t > w ? t : w;
            }
            where[b] = w;
        }
        if (ids)
            memcpy(&ids[b * pc->nr], p, pc->nr * sizeof *p);
    }
    if (count) {
        pc->c.lookups++;
        pc->c.hit_blocks += b;
    }
    return b;
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
        for (uint32_t i = 0; i < pc->cap; i++)
            if (rec_full(&pc->rec[i]) && pc->rec[i].ns == ns) {
                rec_remove(pc, i, false);
                removed++;
            }
        return removed;
    }
    for (size_t b = 0; b < n; b++) {
        uint64_t k[4];
        key_load(keys, b, k);
        uint32_t i = find(pc, k, ns);
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
    out->bytes = (uint64_t)pc->cap * (sizeof *pc->rec + sizeof *pc->link +
                                      pc->nr * sizeof *pc->pages);
}

/* ---- reclaim (swap_cache_ops) --------------------------------------------------------- */

/* Whether only entries hold record i's pages (no sequence, release or transfer). */
static bool reclaimable(struct prefix *pc, uint32_t i)
{
    const pg_page_id *p = &pc->pages[(size_t)i * pc->nr];
    for (uint32_t r = 0; r < pc->nr; r++)
        if (paging_page_holders(pc->pg, p[r]))
            return false;
    return true;
}

/* A binary min-heap of records by tick (least recently used on top). */
static void heap_push(const struct prefix *pc, uint32_t *h, uint32_t *n, uint32_t i)
{
    uint32_t k = (*n)++;
    while (k && pc->rec[h[(k - 1) / 2]].tick > pc->rec[i].tick) {
        h[k] = h[(k - 1) / 2];
        k = (k - 1) / 2;
    }
    h[k] = i;
}

static uint32_t heap_pop(const struct prefix *pc, uint32_t *h, uint32_t *n)
{
    uint32_t top = h[0], last = h[--(*n)], k = 0;
    for (;;) {
        uint32_t c = 2 * k + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && pc->rec[h[c + 1]].tick < pc->rec[h[c]].tick)
            c++;
        if (pc->rec[h[c]].tick >= pc->rec[last].tick)
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

/* Plans dropping reclaimable entries, least recently used leaves first, until want frames
   are counted. rem[i]: record i's children not planned yet (a parent goes after them). */
static uint32_t cache_plan(void *arg, uint32_t want)
{
    struct prefix *pc = arg;
    cache_forget(pc);
    if (!pc->n_full)
        return 0;
    uint32_t *rem = malloc(pc->cap * sizeof *rem), *heap = malloc(pc->cap * sizeof *heap);
    uint8_t *cand = calloc(pc->cap, 1);
    pc->plan = malloc(pc->cap * sizeof *pc->plan);
    uint32_t nh = 0, frees = 0;
    if (!rem || !heap || !cand || !pc->plan) {
        free(pc->plan);                 /* no plan: reclaim goes on without the cache */
        pc->plan = NULL;
        goto out;
    }
    for (uint32_t i = 0; i < pc->cap; i++) {
        if (!rec_full(&pc->rec[i]))
            continue;
        rem[i] = pc->link[i].children;
        cand[i] = reclaimable(pc, i);
        if (cand[i] && !rem[i])
            heap_push(pc, heap, &nh, i);
    }
    while (nh && frees < want) {
        uint32_t i = heap_pop(pc, heap, &nh);
        frees += paging_plan_pages(pc->pg, &pc->pages[(size_t)i * pc->nr], pc->nr, 1);
        pc->plan[pc->n_plan++] = i;
        uint32_t p = pc->link[i].parent;
        if (p != PFX_NONE && !--rem[p] && cand[p])
            heap_push(pc, heap, &nh, p);
    }
out:
    free(rem);
    free(heap);
    free(cand);
    return frees;
}

/* Planned drops become demotions while take grants their device pages' slots below. */
static uint32_t cache_demote(void *arg, bool (*take)(void *ctx, uint32_t k), void *ctx)
{
    struct prefix *pc = arg;
    uint32_t slots = 0;
    for (uint32_t k = 0; k < pc->n_plan; k++) {
        const pg_page_id *p = &pc->pages[(size_t)pc->plan[k] * pc->nr];
        uint32_t dev = 0;
        for (uint32_t r = 0; r < pc->nr; r++)
            dev += paging_page_where(pc->pg, p[r]) == PG_WHERE_DEVICE;
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
static void cache_act(void *arg, bool demotions)
{
    struct prefix *pc = arg;
    for (uint32_t k = 0; k < pc->n_plan; k++) {
        uint32_t i = pc->plan[k] & ~PLAN_DEMOTE, moved;
        if (!(pc->plan[k] & PLAN_DEMOTE) == demotions)
            continue;
        if (!demotions || paging_held_down(pc->pg, &pc->pages[(size_t)i * pc->nr], pc->nr,
                                           &moved))
            rec_remove(pc, i, true);
        pc->c.evictions++;
    }
    if (demotions)
        cache_forget(pc);
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
    if (sw)
        swap_set_cache(sw, &(struct swap_cache_ops){ pc, cache_plan, cache_demote,
                                                     cache_act, cache_forget });
    *out = pc;
    return 0;
}

void prefix_destroy(struct prefix *pc)
{
    if (!pc)
        return;
    for (uint32_t i = 0; i < pc->cap; i++)
        if (rec_full(&pc->rec[i]))
            paging_unhold(pc->pg, &pc->pages[(size_t)i * pc->nr], pc->nr);
    cache_forget(pc);
    free(pc->rec);
    free(pc->link);
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

int prefix_check(struct prefix *pc, char *why, size_t len)
{
    uint32_t full = 0, tomb = 0, max_pages = paging_max_pages(pc->pg);
    uint32_t *refs = calloc(max_pages ? max_pages : 1, sizeof *refs);
    uint32_t *kids = calloc(pc->cap ? pc->cap : 1, sizeof *kids);
    int rc = refs && kids ? 0 : -ENOMEM;
    for (uint32_t i = 0; !rc && i < pc->cap; i++) {
        const struct pfx_rec *r = &pc->rec[i];
        const struct pfx_link *l = &pc->link[i];
        full += rec_full(r);
        tomb += r->tick == TICK_TOMB;
        if (!rec_full(r))
            continue;
        if (find(pc, r->key, r->ns) != i)
            rc = ck_fail(why, len, "prefix record %u is not found by its key (%u)", i, 0);
        else if (l->parent != PFX_NONE && (l->parent >= pc->cap ||
                                           !rec_full(&pc->rec[l->parent])))
            rc = ck_fail(why, len, "prefix record %u names record %u, not an entry, as parent",
                         i, l->parent);
        if (!rc && l->parent != PFX_NONE)
            kids[l->parent]++;
        for (uint32_t k = 0; !rc && k < pc->nr; k++) {
            pg_page_id id = pc->pages[(size_t)i * pc->nr + k];
            if (pg_page_is_none(id) || id.v > max_pages || !paging_page_ents(pc->pg, id))
                rc = ck_fail(why, len, "prefix record %u holds page %u, which is not held", i,
                             id.v);
            else
                refs[id.v - 1]++;
        }
    }
    for (uint32_t i = 0; !rc && i < pc->cap; i++)
        if (rec_full(&pc->rec[i]) && kids[i] != pc->link[i].children)
            rc = ck_fail(why, len, "prefix record %u counts %u children", i,
                         pc->link[i].children);
    if (!rc && (full != pc->n_full || tomb != pc->n_tomb))
        rc = ck_fail(why, len, "prefix index: %u entries counted %u", full, pc->n_full);
    if (!rc && pc->cap && (uint64_t)(full + tomb) * 2 > pc->cap)
        rc = ck_fail(why, len, "prefix index: %u records used of %u", full + tomb, pc->cap);
    for (uint32_t v = 1; !rc && v <= max_pages; v++)
        if (paging_page_ents(pc->pg, (pg_page_id){ v }) != refs[v - 1])
            rc = ck_fail(why, len, "page %u: entries' references counted by paging differ "
                         "from the index's (%u)", v, refs[v - 1]);
    free(refs);
    free(kids);
    return rc == -ENOMEM ? 0 : rc;      /* no memory to check with: nothing to say */
}
