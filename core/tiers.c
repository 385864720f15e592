/*
 * core/tiers.c: the tiers below the device, as one list (paging.h, "the tiers below the
 * device"): each entry opens its layer (host/, disk/ ...) for the context, adapts it to
 * paging's struct pg_tier_ops (kv->tier_ops[t]), says how many pages it can hold, and
 * closes it. A new tier is a folder of
 * its own, its PG_LOWER_* index, and an entry here.
 *
 * The tiers' typed slot ids and paging's map one to one, none to none (each tier keeps its
 * own type: host/ and disk/ never include paging's header); the conversions are here only.
 */
#include "core.h"

#include <errno.h>
#include "common/assert.h"
#include "common/log.h"

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

static int open_host(kvvm *kv, struct pg_tier_ops *ops)
{
    const struct kvvm_config *c = &kv->cfg;
    struct host_params hp = { .budget = c->host_budget, .page_size = c->page_size };
    int rc = host_arena_open(kv->v, &hp, &kv->host);
    if (rc) {
        klog_error("kvvm_open: the host tier (%zu bytes) could not be made (%d)",
                   c->host_budget, rc);
        return rc;
    }
    if (host_slots_total(kv->host))          /* else no host tier: swap_out is -ENOMEM */
        *ops = (struct pg_tier_ops){ .arg = kv->host, .room = h_room, .alloc = h_alloc,
                                     .free = h_free, .ptr = h_ptr };
    return 0;
}

static uint64_t slots_host(kvvm *kv)
{
    return host_slots_total(kv->host);
}

static void close_host(kvvm *kv)
{
    host_arena_close(kv->host);
    kv->host = NULL;
}

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

static int open_disk(kvvm *kv, struct pg_tier_ops *ops)
{
    const struct kvvm_config *c = &kv->cfg;
    if (!c->spill_dir)
        return 0;
    if (!host_slots_total(kv->host)) {
        return kerr(-EINVAL, "kvvm_open: spill_dir %s needs a host tier: set host_budget "
                    "(KVVM_HOST_BUDGET, e.g. 1G) to at least page_size %zu bytes; disk pages "
                    "come back through host slots", c->spill_dir, c->page_size);
    }
    struct disk_params dp = {
        .dir = c->spill_dir, .budget = c->spill_budget, .page_size = c->page_size,
        .buf_base = host_arena_base(kv->host), .buf_bytes = host_arena_bytes(kv->host),
        .flags = ((c->flags & KVVM_F_SPILL_ALLOW_TMPFS) ? DISK_F_ALLOW_TMPFS : 0) |
                 ((c->flags & KVVM_F_SPILL_BUFFERED) ? DISK_F_BUFFERED : 0),
    };
    int rc = disk_open(&dp, &kv->disk);
    if (rc) {
        klog_error("kvvm_open: the disk tier in %s could not be opened (%s)", c->spill_dir,
                   core_err_name(rc));
        return rc;
    }
    *ops = (struct pg_tier_ops){ .arg = kv->disk, .room = d_room, .alloc = d_alloc,
                                 .free = d_free, .put = d_put, .get = d_get, .reap = d_reap,
                                 .wait = d_wait };
    return 0;
}

static uint64_t slots_disk(kvvm *kv)
{
    return kv->cfg.spill_dir ? kv->cfg.spill_budget / kv->cfg.page_size : 0;
}

static void close_disk(kvvm *kv)
{
    disk_close(kv->disk);                  /* the unnamed file goes with its descriptor */
    kv->disk = NULL;
}

/* ---- the list ------------------------------------------------------------------------ */

static const struct core_tier {
    int  (*open)(kvvm *kv, struct pg_tier_ops *ops);   /* 0 with no ops: the tier is off */
    uint64_t (*slots)(kvvm *kv);                        /* pages it can hold (0: off) */
    void (*close)(kvvm *kv);
} tiers[] = {
    [PG_LOWER_HOST] = { open_host, slots_host, close_host },
    [PG_LOWER_DISK] = { open_disk, slots_disk, close_disk },
};
_Static_assert(sizeof tiers / sizeof tiers[0] == PG_N_LOWER, "one entry per tier below");

int core_tiers_open(kvvm *kv)
{
    for (unsigned t = 0; t < PG_N_LOWER; t++) {
        kv->tier_ops[t] = (struct pg_tier_ops){ 0 };
        int rc = tiers[t].open(kv, &kv->tier_ops[t]);
        if (rc) {
            while (t-- > 0)
                tiers[t].close(kv);
            return rc;
        }
    }
    return 0;
}

uint64_t core_tiers_slots(kvvm *kv)
{
    uint64_t n = 0;
    for (unsigned t = 0; t < PG_N_LOWER; t++)
        n += tiers[t].slots(kv);
    return n;
}

void core_tiers_close(kvvm *kv)
{
    for (unsigned t = PG_N_LOWER; t-- > 0;)
        tiers[t].close(kv);
}

void core_tiers_params(kvvm *kv, struct paging_params *pp)
{
    for (unsigned t = 0; t < PG_N_LOWER; t++)
        pp->tier[t] = kv->tier_ops[t].alloc ? &kv->tier_ops[t] : NULL;
}
