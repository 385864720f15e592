/*
 * core/tiers.c: the tiers below the device, as one list (core/tiers.h; paging.h, "the tiers
 * below the device"): each entry opens its layer (host/, disk/ ...) for the context, adapts
 * it to paging's struct pg_tier_ops (kv->tier_ops[t]), says how many pages it can hold,
 * gives its stats and the text of its absence, and closes it. A new tier of a kind the list
 * has (a memory tier at level 0, an I/O tier at level 1, a store at CORE_LEVEL_STORE) is a
 * folder of its own and an entry here (or in a file beside it: the store's is
 * core/tier_store.c; or one added with core_tiers_add); a page tier at a new level needs
 * paging's page states and moves as well (docs/design.md). The rest of core iterates
 * kv->tier[] and names no tier. The entries tier (the store) is opened and closed apart
 * from the page tiers (core_tiers_open's kind: before the device, after paging), and adds
 * its queue's figures and checks (core/storeq.c) to its own.
 *
 * The tiers' typed slot ids and paging's map one to one, none to none (each tier keeps its
 * own type: host/ and disk/ never include paging's header); the conversions are here only.
 */
#include "core.h"

#include <errno.h>
#include "common/assert.h"
#include "common/log.h"
#include "disk/disk.h"
#include "host/host.h"

/* ---- the host tier: pinned host memory (host/), a memory tier ------------------------ */

static host_slot host_of(pg_slot s)
{
    return pg_slot_is_none(s) ? HOST_SLOT_NONE : (host_slot){ s.v };
}
static pg_slot pg_of_host(host_slot s)
{
    return s.idx == HOST_SLOT_NONE.idx ? PG_SLOT_NONE : (pg_slot){ s.idx };
}
static size_t h_room(void *a)
{
    return host_slots_free(a);
}
static int h_alloc(void *a, pg_slot hint, pg_slot *slot)
{
    (void)hint;                              /* any free slot: memory has no seek */
    host_slot s;
    int rc = host_slot_alloc(a, &s);
    if (!rc)
        *slot = pg_of_host(s);
    KVVM_ASSERT(rc || !pg_slot_is_none(*slot));   /* a slot taken is a real one */
    return rc;
}
static void h_free(void *a, pg_slot slot)
{
    int rc = host_slot_free(a, host_of(slot));
    KVVM_ASSERT(rc == 0);                    /* paging frees each host slot once */
    (void)rc;
}
static void *h_ptr(void *a, pg_slot slot)
{
    return host_slot_ptr(a, host_of(slot));
}

static int open_host(kvvm *kv, void **layer, struct pg_tier_ops *ops)
{
    const struct kvvm_config *c = &kv->cfg;
    struct host_params hp = { .budget = c->host_budget, .page_size = c->page_size };
    struct host_arena *a;
    int rc = host_arena_open(kv->v, &hp, &a);
    if (rc) {
        klog_error("kvvm_open: the host tier (%zu bytes) could not be made (%d)",
                   c->host_budget, rc);
        return rc;
    }
    *layer = a;                              /* open even with 0 slots: the check counts it */
    if (host_slots_total(a))                 /* else no host tier: swap_out is -ENOMEM */
        *ops = (struct pg_tier_ops){ .arg = a, .room = h_room, .alloc = h_alloc,
                                     .free = h_free, .ptr = h_ptr };
    return 0;
}

static uint64_t slots_host(kvvm *kv, void *layer)
{
    (void)kv;
    return host_slots_total(layer);
}

static void stats_host(void *layer, struct core_tier_stats *out)
{
    *out = (struct core_tier_stats){ .total = host_slots_total(layer),
                                     .free = host_slots_free(layer) };
}

static void off_host(kvvm *kv, char *b, size_t n, size_t *pos)
{
    json_put(b, n, pos, "; no host tier configured (host_budget %zu is below one page of "
             "%zu bytes): nothing can be swapped out", kv->cfg.host_budget, kv->cfg.page_size);
}

static void policy_host(kvvm *kv, struct core_tier_policy *out)
{
    *out = (struct core_tier_policy){ kv->cfg.host_min, kv->cfg.host_low, kv->cfg.host_high };
}

static void span_host(void *layer, void **base, size_t *bytes)
{
    *base = host_arena_base(layer);
    *bytes = host_arena_bytes(layer);
}

static void close_host(void *layer)
{
    host_arena_close(layer);
}

static const struct core_tier host_tier = {
    .name = "host", .kind = CORE_TIER_PAGES, .level = PG_LOWER_HOST, .open = open_host,
    .close = close_host,
    .slots = slots_host, .stats = stats_host, .off = off_host, .policy = policy_host,
    .span = span_host,
};

/* ---- the disk tier: spill files (disk/), an I/O tier ---------------------------------
 * Completions go to the spill engine's queue (reaped by paging under the context lock), so
 * the engine thread never takes the context lock. A page id travels as the request's page
 * identity (its checksum seed) and its user cookie, and comes back in the completion. */

static disk_slot disk_of(pg_slot s)
{
    return pg_slot_is_none(s) ? DISK_SLOT_NONE : (disk_slot){ s.v };
}
static pg_slot pg_of_disk(disk_slot s)
{
    return disk_slot_valid(s) ? (pg_slot){ s.idx } : PG_SLOT_NONE;
}
static size_t d_room(void *a)
{
    struct disk_stats st;
    disk_stats_get(a, &st);
    return st.slots_free;
}
static int d_alloc(void *a, pg_slot hint, pg_slot *slot)
{
    disk_slot s;
    int rc = disk_slot_alloc(a, 1, disk_of(hint), &s);
    if (!rc)
        *slot = pg_of_disk(s);
    KVVM_ASSERT(rc || !pg_slot_is_none(*slot));   /* a slot taken is a real one */
    return rc;
}
static void d_free(void *a, pg_slot slot)
{
    int rc = disk_slot_free(a, disk_of(slot));
    KVVM_ASSERT(rc == 0);                    /* once, and with no I/O in flight on it */
    if (rc)
        klog_error("kvvm: freeing disk slot %u failed (%d)", slot.v, rc);
}
static int d_io(void *a, enum disk_op op, pg_slot slot, void *buf, pg_page_id page)
{
    struct disk_req r = { .op = op, .slot = disk_of(slot), .buf = buf, .page = page.v,
                          .user = (void *)(uintptr_t)page.v };
    return disk_submit(a, &r, 1);
}
static int d_put(void *a, pg_slot slot, void *buf, pg_page_id page)
{
    return d_io(a, DISK_WRITE, slot, buf, page);
}
static int d_get(void *a, pg_slot slot, void *buf, pg_page_id page)
{
    return d_io(a, DISK_READ, slot, buf, page);
}
static size_t d_reap(void *a, struct pg_tier_done *out, size_t max)
{
    struct disk_cqe c[64];
    size_t n = disk_reap(a, c, max < 64 ? max : 64);
    for (size_t i = 0; i < n; i++)
        out[i] = (struct pg_tier_done){ { (uint32_t)(uintptr_t)c[i].user }, c[i].status,
                                        c[i].op == DISK_WRITE };
    return n;
}
static void d_wait(void *a)
{
    disk_wait_all(a);
}

static int open_disk(kvvm *kv, void **layer, struct pg_tier_ops *ops)
{
    const struct kvvm_config *c = &kv->cfg;
    if (!c->spill_dir)
        return 0;
    const struct core_tier_at *up = &kv->tier[PG_LOWER_DISK - 1];
    if (!core_tier_on(kv, PG_LOWER_DISK - 1) || !up->e->span) {
        return kerr(-EINVAL, "kvvm_open: spill_dir %s needs a host tier: set host_budget "
                    "(KVVM_HOST_BUDGET, e.g. 1G) to at least page_size %zu bytes; disk pages "
                    "come back through host slots", c->spill_dir, c->page_size);
    }
    void *base;
    size_t bytes;
    up->e->span(up->layer, &base, &bytes);   /* the I/O buffers: the tier above's slots */
    struct disk_params dp = {
        .dir = c->spill_dir, .budget = c->spill_budget, .page_size = c->page_size,
        .buf_base = base, .buf_bytes = bytes,
        .flags = ((c->flags & KVVM_F_SPILL_ALLOW_TMPFS) ? DISK_F_ALLOW_TMPFS : 0) |
                 ((c->flags & KVVM_F_SPILL_BUFFERED) ? DISK_F_BUFFERED : 0),
    };
    struct disk *dk;
    int rc = disk_open(&dp, &dk);
    if (rc) {
        klog_error("kvvm_open: the disk tier in %s could not be opened (%s)", c->spill_dir,
                   core_err_name(rc));
        return rc;
    }
    *layer = dk;
    *ops = (struct pg_tier_ops){ .arg = dk, .room = d_room, .alloc = d_alloc,
                                 .free = d_free, .put = d_put, .get = d_get, .reap = d_reap,
                                 .wait = d_wait };
    return 0;
}

static uint64_t slots_disk(kvvm *kv, void *layer)
{
    (void)layer;
    return kv->cfg.spill_budget / kv->cfg.page_size;
}

static void stats_disk(void *layer, struct core_tier_stats *out)
{
    struct disk_stats d;
    disk_stats_get(layer, &d);
    *out = (struct core_tier_stats){ .total = d.slots_total, .free = d.slots_free,
                                     .checksum_failures = d.checksum_failures,
                                     .io_errors = d.io_errors };
}

static const char *engine_disk(void *layer, bool *direct)
{
    *direct = disk_direct(layer);
    return disk_engine_name(layer);
}

static void off_disk(kvvm *kv, char *b, size_t n, size_t *pos)
{
    (void)kv;
    json_put(b, n, pos, "; no disk tier (spill_dir unset)");
}

static void close_disk(void *layer)
{
    disk_close(layer);                     /* the unnamed file goes with its descriptor */
}

static const struct core_tier disk_tier = {
    .name = "disk", .kind = CORE_TIER_PAGES, .level = PG_LOWER_DISK, .open = open_disk,
    .close = close_disk,
    .slots = slots_disk, .stats = stats_disk, .engine = engine_disk, .off = off_disk,
};

/* ---- the list ------------------------------------------------------------------------ */

/* In level order; entries added by core_tiers_add go in front of the built-in ones. */
#define CORE_TIERS_MAX 8
static const struct core_tier *tiers[CORE_TIERS_MAX] = { &host_tier, &disk_tier,
                                                         &core_tier_store };
static unsigned n_tiers = 3;

enum core_tier_kind core_tier_kind(unsigned t)
{
    return t < PG_N_LOWER ? CORE_TIER_PAGES : CORE_TIER_ENTRIES;
}

/* Why e cannot be in the list (NULL: it can). */
static const char *entry_bad(const struct core_tier *e)
{
    if (!e || !e->name || !e->open || !e->close || !e->stats || !e->off)
        return "every tier needs a name and open, close, stats and off";
    if (e->kind == CORE_TIER_PAGES)
        return e->level >= PG_N_LOWER ? "a page tier's level is below PG_N_LOWER" :
               !e->slots ? "a page tier needs slots" :
               e->ent ? "a page tier has no entry operations" : NULL;
    if (e->kind != CORE_TIER_ENTRIES)
        return "its kind is neither pages nor entries";
    const struct core_entry_ops *o = e->ent;
    if (e->level != CORE_LEVEL_STORE)
        return "an entries tier's level is CORE_LEVEL_STORE";
    if (e->slots || e->span || e->engine)
        return "an entries tier holds no pages (slots, span and engine are a page tier's)";
    if (!o || !o->put || !o->get_start || !o->get_first || !o->get_finish || !o->lookup ||
        !o->del || !o->reap)
        return "an entries tier needs put, get_start, get_first, get_finish, lookup, del "
               "and reap";
    return NULL;
}

int core_tiers_add(const struct core_tier *e)
{
    const char *bad = entry_bad(e);
    if (bad)
        return kerr(-EINVAL, "core_tiers_add: %s tier %s: %s", e && e->name ? "the" : "a",
                    e && e->name ? e->name : "without a name", bad);
    if (n_tiers == CORE_TIERS_MAX)
        return kerr(-ENOSPC, "core_tiers_add: the list holds %d tiers", CORE_TIERS_MAX);
    for (unsigned i = n_tiers++; i > 0; i--)
        tiers[i] = tiers[i - 1];
    tiers[0] = e;
    return 0;
}

bool core_tier_on(kvvm *kv, unsigned t)
{
    if (t < PG_N_LOWER)
        return kv->tier_ops[t].alloc;
    return t < CORE_N_LEVELS && kv->tier[t].layer;
}

void core_tier_stats(kvvm *kv, unsigned t, struct core_tier_stats *out)
{
    *out = (struct core_tier_stats){ 0 };
    if (t >= CORE_N_LEVELS || !kv->tier[t].e)
        return;
    kv->tier[t].e->stats(kv->tier[t].layer, out);
    if (kv->tier[t].e->kind == CORE_TIER_ENTRIES)
        storeq_stats_add(kv->sq, out);          /* its queue's figures */
}

int core_tier_check(kvvm *kv, unsigned t, char *why, size_t len)
{
    if (t >= CORE_N_LEVELS || !kv->tier[t].e || kv->tier[t].e->kind != CORE_TIER_ENTRIES)
        return 0;
    return storeq_check(kv->sq, why, len);
}

const struct core_tier *core_tiers_entries(kvvm *kv, void **layer)
{
    for (unsigned t = 0; t < CORE_N_LEVELS; t++)
        if (kv->tier[t].e && kv->tier[t].e->kind == CORE_TIER_ENTRIES) {
            *layer = kv->tier[t].layer;
            return kv->tier[t].e;
        }
    *layer = NULL;
    return NULL;
}

uint32_t core_tiers_copy_blocks(kvvm *kv)
{
    uint32_t n = 0;
    for (unsigned t = 0; t < CORE_N_LEVELS; t++) {
        const struct core_tier *e = kv->tier[t].e;
        struct core_tier_policy row = { 0 };
        if (!e || e->kind != CORE_TIER_ENTRIES)
            continue;
        if (e->policy)
            e->policy(kv, &row);
        n += storeq_stage_slots((size_t)kv->cfg.n_regions * kv->cfg.page_size,
                                (size_t)row.queue_bytes);
    }
    return n;
}

void core_tiers_hist(kvvm *kv, enum core_entry_op op, struct khist *out)
{
    void *layer;
    const struct core_tier *e = core_tiers_entries(kv, &layer);
    *out = (struct khist){ 0 };
    if (e && e->ent->hist)
        e->ent->hist(layer, op, out);
}

char *core_tiers_url_redact(const char *url, char *buf, size_t len)
{
    for (unsigned i = 0; i < n_tiers; i++)
        if (tiers[i]->ent && tiers[i]->ent->redact)
            return tiers[i]->ent->redact(url, buf, len);
    return (char *)url;
}

/* -EINVAL: tier e is on and the level above it is off (the reason as its entry says it). */
static int above_missing(kvvm *kv, const struct core_tier *e)
{
    const struct core_tier_at *up = &kv->tier[e->level - 1];
    const struct core_tier *a = up->e ? up->e : core_tiers_first(e->level - 1);
    char b[256];
    size_t pos = 0;
    b[0] = 0;
    if (a)
        a->off(kv, b, sizeof b, &pos);
    return kerr(-EINVAL, "kvvm_open: the %s tier needs the %s tier above it%s", e->name,
                a ? a->name : "", b);
}

/* Level t: the first of its entries that opens a layer takes it. */
static int open_level(kvvm *kv, unsigned t)
{
    bool pages = core_tier_kind(t) == CORE_TIER_PAGES;
    for (unsigned i = 0; i < n_tiers; i++) {
        const struct core_tier *e = tiers[i];
        struct pg_tier_ops none = { 0 }, *ops = pages ? &kv->tier_ops[t] : &none;
        void *layer = NULL;
        if (e->level != t)
            continue;
        KVVM_ASSERT(e->kind == core_tier_kind(t));   /* core_tiers_add checked it */
        int rc = e->open(kv, &layer, ops);
        if (rc)
            return rc;
        KVVM_ASSERT(pages || !none.alloc);  /* an entries tier gives paging nothing */
        if (!layer) {
            KVVM_ASSERT(!ops->alloc);       /* on means open */
            continue;
        }
        if (pages && t && ops->alloc && !core_tier_on(kv, t - 1)) {
            e->close(layer);           /* a tier's pages come and go through the one above */
            return above_missing(kv, e);
        }
        kv->tier[t] = (struct core_tier_at){ e, layer };
        return 0;
    }
    return 0;
}

int core_tiers_open(kvvm *kv, enum core_tier_kind kind)
{
    for (unsigned t = 0; t < CORE_N_LEVELS; t++) {
        if (core_tier_kind(t) != kind)
            continue;
        kv->tier[t] = (struct core_tier_at){ 0 };
        if (t < PG_N_LOWER)
            kv->tier_ops[t] = (struct pg_tier_ops){ 0 };
    }
    for (unsigned t = 0; t < CORE_N_LEVELS; t++) {
        if (core_tier_kind(t) != kind)
            continue;
        int rc = open_level(kv, t);
        if (rc) {
            if (t < PG_N_LOWER)
                kv->tier_ops[t] = (struct pg_tier_ops){ 0 };
            core_tiers_close(kv, kind);
            return rc;
        }
    }
    return 0;
}

uint64_t core_tiers_slots(kvvm *kv)
{
    uint64_t n = 0;
    for (unsigned t = 0; t < PG_N_LOWER; t++)
        if (core_tier_on(kv, t))
            n += kv->tier[t].e->slots(kv, kv->tier[t].layer);
    return n;
}

void core_tiers_close(kvvm *kv, enum core_tier_kind kind)
{
    for (unsigned t = CORE_N_LEVELS; t-- > 0;) {
        if (core_tier_kind(t) != kind)
            continue;
        if (kv->tier[t].e)
            kv->tier[t].e->close(kv->tier[t].layer);
        kv->tier[t] = (struct core_tier_at){ 0 };
        if (t < PG_N_LOWER)
            kv->tier_ops[t] = (struct pg_tier_ops){ 0 };
    }
}
void core_tiers_params(kvvm *kv, struct paging_params *pp)
{
    for (unsigned t = 0; t < PG_N_LOWER; t++)
        pp->tier[t] = core_tier_on(kv, t) ? &kv->tier_ops[t] : NULL;
}

void core_tiers_swap_params(kvvm *kv, struct swap_params *p)
{
    struct core_tier_stats h;
    struct core_tier_policy row = { 0 };
    const struct core_tier_at *first = &kv->tier[PG_LOWER_HOST];
    core_tier_stats(kv, PG_LOWER_HOST, &h);
    if (first->e && first->e->policy)
        first->e->policy(kv, &row);
    p->thread = h.total > 0;            /* the reclaim thread swaps out to the host tier */
    p->host_slots = (uint32_t)h.total;
    p->host_min = row.min;
    p->host_low = row.low;
    p->host_high = row.high;
    p->disk = core_tier_on(kv, PG_LOWER_DISK);   /* the spill thread writes to it */
}

const char *core_tiers_engine(kvvm *kv, bool *direct)
{
    *direct = false;
    for (unsigned t = 0; t < PG_N_LOWER; t++)
        if (kv->tier[t].e && kv->tier[t].e->engine)
            return kv->tier[t].e->engine(kv->tier[t].layer, direct);
    return "none";
}

struct disk *core_tiers_disk(kvvm *kv)
{
    for (unsigned t = 0; t < CORE_N_LEVELS; t++)
        if (kv->tier[t].e == &disk_tier)
            return kv->tier[t].layer;
    return NULL;
}

const struct core_tier *core_tiers_first(unsigned t)
{
    for (unsigned i = 0; i < n_tiers; i++)
        if (tiers[i]->level == t)
            return tiers[i];
    return NULL;
}
