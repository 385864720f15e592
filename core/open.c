/*
 * core/open.c: the context's lifetime, kvvm_open and kvvm_close.
 *
 * kvvm_open copies and checks the caller's config, opens the device (vmm), reserves the
 * layout, builds the tiers (host arena, disk tier) and paging's ops tables over them, then
 * paging and swap; each step is undone on failure (out_<what> labels). kvvm_close tears it
 * all down in the reverse order, the reclaim thread first (joined without the lock).
 */
#include "core.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "common/assert.h"
#include "common/log.h"
#include "core/call.h"

/* ---- open / close ------------------------------------------------------------------- */

/* Copies the caller's config (it may be an older, shorter struct). -EINVAL bad size. */
static int config_copy(const struct kvvm_config *in, struct kvvm_config *out)
{
    size_t api_size = offsetof(struct kvvm_config, map_ahead);
    if (in->size < api_size || in->size > 4096) {
        klog_error("kvvm_open: cfg->size %zu is not sizeof(struct kvvm_config) (%zu); call "
                   "kvvm_config_init first", in->size, sizeof *out);
        return -EINVAL;
    }
    memset(out, 0, sizeof *out);
    memcpy(out, in, in->size < sizeof *out ? in->size : sizeof *out);
    if (in->size < offsetof(struct kvvm_config, pool_thread) + sizeof out->pool_thread)
        out->pool_thread = 1;       /* a struct from before 0.2: the default */
    out->size = sizeof *out;
    return 0;
}

/* The tiers' typed slot ids and paging's map one to one, none to none (each tier keeps its
   own type: host/ and disk/ never include paging's header). The only conversions. */
static host_slot host_of(pg_slot s)
{
    return pg_slot_is_none(s) ? HOST_SLOT_NONE : (host_slot){ s.v };
}
static spill_slot spill_of(pg_slot s)
{
    return pg_slot_is_none(s) ? SPILL_SLOT_NONE : (spill_slot){ s.v };
}
static pg_slot pg_of_host(host_slot s)
{
    return s.idx == HOST_SLOT_NONE.idx ? PG_SLOT_NONE : (pg_slot){ s.idx };
}
static pg_slot pg_of_spill(spill_slot s)
{
    return spill_slot_valid(s) ? (pg_slot){ s.idx } : PG_SLOT_NONE;
}

static int h_alloc(void *a, pg_slot *slot)
{
    host_slot s;
    int rc = host_slot_alloc(a, &s);
    if (!rc)
        *slot = pg_of_host(s);
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

static size_t h_n_free(void *a)
{
    return host_slots_free(a);
}

/* paging's disk ops over the spill engine: completions go to its queue (reaped by paging
   under the context lock), so the engine thread never takes the context lock. Slots map
   through spill_of / pg_of_spill; a page id travels as the request's page identity (its
   checksum seed) and its user cookie, and comes back as a pg_page_id in the completion. */
static int d_alloc(void *a, pg_slot hint, pg_slot *slot)
{
    spill_slot s;
    int rc = spill_slot_alloc(a, 1, spill_of(hint), &s);
    if (!rc)
        *slot = pg_of_spill(s);
    return rc;
}
static void d_free(void *a, pg_slot slot)
{
    int rc = spill_slot_free(a, spill_of(slot));
    KVVM_ASSERT(rc == 0);                    /* once, and with no I/O in flight on it */
    if (rc)
        klog_error("kvvm: freeing disk slot %u failed (%d)", slot.v, rc);
}
static int d_submit(void *a, bool write, pg_slot slot, void *buf, pg_page_id page)
{
    struct spill_req r = { .op = write ? SPILL_WRITE : SPILL_READ,
                           .slot = spill_of(slot), .buf = buf, .page = page.v,
                           .user = (void *)(uintptr_t)page.v };
    return spill_submit(a, &r, 1);
}
static size_t d_reap(void *a, struct pg_disk_done *out, size_t max)
{
    struct spill_cqe c[64];
    size_t n = spill_reap(a, c, max < 64 ? max : 64);
    for (size_t i = 0; i < n; i++)
        out[i] = (struct pg_disk_done){ { (uint32_t)(uintptr_t)c[i].user }, c[i].status,
                                        c[i].op == SPILL_WRITE };
    return n;
}
static void d_wait(void *a)
{
    spill_wait_all(a);
}
static size_t d_n_free(void *a)
{
    struct spill_stats st;
    spill_stats_get(a, &st);
    return st.slots_free;
}

static int open_spill(kvvm *kv)
{
    struct kvvm_config *c = &kv->cfg;
    if (!c->spill_dir)
        return 0;
    if (!host_slots_total(kv->host)) {
        return kerr(-EINVAL, "kvvm_open: spill_dir %s needs a host tier: set host_budget "
                    "(KVVM_HOST_BUDGET, e.g. 1G) to at least page_size %zu bytes; disk pages "
                    "come back through host slots", c->spill_dir, c->page_size);
    }
    struct spill_params sp = {
        .dir = c->spill_dir, .budget = c->spill_budget, .page_size = c->page_size,
        .buf_base = host_arena_base(kv->host), .buf_bytes = host_arena_bytes(kv->host),
        .flags = ((c->flags & KVVM_F_SPILL_ALLOW_TMPFS) ? SPILL_F_ALLOW_TMPFS : 0) |
                 ((c->flags & KVVM_F_SPILL_BUFFERED) ? SPILL_F_BUFFERED : 0),
    };
    int rc = spill_open(&sp, &kv->spill);
    if (rc) {
        klog_error("kvvm_open: the disk tier in %s could not be opened (%s)", c->spill_dir,
                   core_err_name(rc));
        return rc;
    }
    kv->disk_ops = (struct pg_disk_ops){ kv->spill, d_alloc, d_free, d_submit, d_reap,
                                         d_wait, d_n_free };
    return 0;
}

/* The device budget against the device's free memory (cuMemGetInfo: what other users of the
   GPU, e.g. PyTorch's caching allocator, hold is not free). A budget above it is clamped to
   the free memory, with a warning (the configured budget is a ceiling the engine chose
   before knowing what else runs on the GPU; kvvm_set_budget raises it later), unless every
   frame is to be created now (create_at_open) or not even one page per region is free:
   then -ENOMEM, explained. -EIO. */
static int open_budget(kvvm *kv)
{
    struct kvvm_config *c = &kv->cfg;
    size_t fr, tot, ps = c->page_size;
    int rc = vmm_mem_info(kv->v, &fr, &tot);
    if (rc)
        return rc;
    if (c->device_budget <= fr)
        return 0;
    if (c->create_at_open || fr / ps < c->n_regions)
        return kerr(-ENOMEM, "kvvm_open: device_budget %zu is more than the %zu bytes free "
                    "on the device (%zu total; other users of the GPU hold the rest)%s",
                    c->device_budget, fr, tot, c->create_at_open
                    ? ", and create_at_open asks for all of it now" : "");
    size_t b = fr / ps * ps;
    klog_warn("kvvm_open: device_budget %zu is more than the device's free memory (%zu of "
              "%zu bytes; other users of the GPU hold the rest): the budget is %zu bytes "
              "(%zu pages) until kvvm_set_budget raises it", c->device_budget, fr, tot, b,
              b / ps);
    c->device_budget = b;
    return 0;
}

int core_budget_fits(kvvm *kv, size_t b)
{
    struct paging_counters c;
    paging_counters(kv->pg, &c);
    size_t fr, tot, held = (size_t)c.frames_held * kv->cfg.page_size;
    if (b <= held)
        return 0;
    int rc = vmm_mem_info(kv->v, &fr, &tot);
    if (rc)
        return rc;
    if (b - held <= fr)
        return 0;
    klast_set("kvvm_set_budget: a budget of %zu bytes needs %zu bytes more than the %zu the "
              "context holds, and the device has %zu free (%zu total; other users of the GPU "
              "hold the rest): the budget is unchanged", b, b - held, held, fr, tot);
    return -ENOMEM;
}

/* The pool view's ids (KVVM_F_POOL_VIEW; 0 without): every block a block table can name
   (max_seqs * pages per slot) and room for ids waiting for their unmap (paging/view.c),
   one per n_regions frames the device can hold. Its bytes go at the reservation's end. */
static int open_view_ids(kvvm *kv, uint64_t cap, uint64_t *ids, uint64_t *reserve)
{
    struct kvvm_config *c = &kv->cfg;
    *ids = 0;
    if (!(c->flags & KVVM_F_POOL_VIEW))
        return 0;
    *ids = (uint64_t)c->max_seqs * (kv->slot_bytes / c->page_size) + cap / c->n_regions + 1;
    uint64_t bytes = *ids * c->page_size * c->n_regions;
    if (*ids > INT32_MAX || bytes / c->n_regions / c->page_size != *ids ||
        *reserve + bytes > (1ull << 47))
        return kerr(-EINVAL, "kvvm_open: the pool view (%llu block ids of %zu bytes in %u "
                    "regions) is larger than the address space allows: lower max_seqs or "
                    "max_tokens", (unsigned long long)*ids, c->page_size, c->n_regions);
    *reserve += bytes;
    return 0;
}

static int open_layout(kvvm *kv)
{
    struct kvvm_config *c = &kv->cfg;
    uint64_t reserve, view_ids;
    int rc = config_layout(c, vmm_granule(kv->v), &kv->slot_bytes, &reserve);
    if (rc)
        return rc;
    rc = open_budget(kv);
    if (rc)
        return rc;
    uint64_t frames = c->device_budget / c->page_size;
    /* the budget may grow up to the device's capacity (kvvm_set_budget) */
    uint64_t cap = vmm_device_bytes(kv->v) / c->page_size;
    if (cap > UINT32_MAX / 2)
        cap = UINT32_MAX / 2;
    if (cap < frames)
        cap = frames;
    uint64_t windows = reserve;
    rc = open_view_ids(kv, cap, &view_ids, &reserve);
    if (rc)
        return rc;
    rc = vmm_reserve(kv->v, reserve, &kv->base);
    if (rc) {
        klog_error("kvvm_open: reserving %llu bytes of device address space failed (%d)",
                   (unsigned long long)reserve, rc);
        return rc;
    }
    struct host_params hp = { .budget = c->host_budget, .page_size = c->page_size };
    rc = host_arena_open(kv->v, &hp, &kv->host);
    if (rc) {
        klog_error("kvvm_open: the host tier (%zu bytes) could not be made (%d)",
                   c->host_budget, rc);
        goto out_unreserve;
    }
    kv->host_ops = (struct pg_host_ops){ kv->host, h_alloc, h_free, h_ptr, h_n_free };
    rc = open_spill(kv);
    if (rc)
        goto out_host;
    /* page descriptors: device + host pages, + disk pages only when there is a disk tier */
    uint64_t slots = host_slots_total(kv->host) +
                     (c->spill_dir ? c->spill_budget / c->page_size : 0);
    struct paging_params pp = {
        .n_regions = c->n_regions, .bytes_per_token = c->bytes_per_token,
        .max_seqs = c->max_seqs, .max_tokens = c->max_tokens, .page_size = c->page_size,
        .slot_bytes = kv->slot_bytes, .base = kv->base, .max_frames = (uint32_t)frames,
        .cap_frames = (uint32_t)cap,
        .max_pages = (uint32_t)(cap + (slots < UINT32_MAX / 2 ? slots : UINT32_MAX / 2)),
        .map_ahead = c->map_ahead, .scrub = !!(c->flags & KVVM_F_SCRUB),
        .view_ids = (uint32_t)view_ids, .view_base = kv->base + windows,
        .feed = !!c->pool_thread, .prealloc = !!c->create_at_open,
        .host = host_slots_total(kv->host) ? &kv->host_ops : NULL,
        .disk = kv->spill ? &kv->disk_ops : NULL,
    };
    rc = paging_create(kv->v, &pp, &kv->pg);
    if (rc)
        goto out_spill;
    struct swap_params sp = {
        .frames = (uint32_t)frames, .min = c->device_min, .low = c->device_low,
        .high = c->device_high, .auto_swap = !!(c->flags & KVVM_F_AUTO_SWAP),
        .thread = host_slots_total(kv->host) > 0,
        .host_slots = (uint32_t)host_slots_total(kv->host), .host_min = c->host_min,
        .host_low = c->host_low, .host_high = c->host_high, .disk = kv->spill != NULL,
        .cache_demote = !!(c->flags & KVVM_F_CACHE_DEMOTE),
    };
    rc = swap_create(kv->pg, kv->v, &kv->lock, &sp, &kv->sw);
    if (rc)
        goto out_paging;
    rc = prefix_create(kv->pg, kv->sw, &kv->pfx);
    if (rc)
        goto out_swap_only;
    if (c->pool_thread) {
        struct frames_params fp = { .budget = (uint32_t)frames, .n_regions = c->n_regions,
                                    .low = c->pool_low,   /* create_at_open: keep them all */
                                    .high = c->create_at_open ? (uint32_t)frames : c->pool_high,
                                    .decay_ms = c->pool_decay_ms };
        rc = frames_create(kv->pg, kv->v, &kv->lock, &fp, &kv->fr);
        if (rc)
            goto out_swap;
    }
    return 0;
out_swap:
    swap_set_cache(kv->sw, NULL);   /* no plan may reach the index from here */
    prefix_destroy(kv->pfx);
out_swap_only:
    swap_destroy(kv->sw);
out_paging:
    paging_destroy(kv->pg);
out_spill:
    spill_close(kv->spill);
    kv->spill = NULL;
out_host:
    host_arena_close(kv->host);
out_unreserve:
    vmm_unreserve(kv->v);
    return rc;
}

unsigned kvvm__fork_gen;

static void fork_child(void)
{
    __atomic_add_fetch(&kvvm__fork_gen, 1, __ATOMIC_RELAXED);
}

static void fork_watch_once(void)
{
    if (pthread_atfork(NULL, NULL, fork_child))
        klog_warn("kvvm: pthread_atfork failed: a context used in a fork() child is not "
                  "detected");
}

static void fork_watch(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    (void)pthread_once(&once, fork_watch_once);
}

/* The shared store of cfg.store_url (none without one): a down store is not an error.
   -EINVAL malformed URL, -EACCES credentials refused, -ENOMEM (store_open logs why). */
static int open_store(kvvm *kv)
{
    if (!kv->cfg.store_url)
        return 0;
    if (!(kv->store_url = strdup(kv->cfg.store_url)))
        return -ENOMEM;
    kv->cfg.store_url = kv->store_url;
    if (!kv->cfg.store_timeout_ms)
        kv->cfg.store_timeout_ms = STORE_TIMEOUT_DEFAULT_MS;
    return store_open(kv->store_url, kv->cfg.store_timeout_ms, 0, &kv->store);
}

static int open_ctx(const struct kvvm_config *cfg, kvvm **out)
{
    fork_watch();
    kvvm *kv = calloc(1, sizeof *kv);
    if (!kv)
        return -ENOMEM;
    kv->pid = getpid();
    kv->fork_gen = __atomic_load_n(&kvvm__fork_gen, __ATOMIC_RELAXED);
    int rc = config_copy(cfg, &kv->cfg);
    if (!rc)
        rc = config_check(&kv->cfg);
    if (rc)
        goto out_free;
    if (kv->cfg.spill_dir && !(kv->spill_dir = strdup(kv->cfg.spill_dir))) {
        rc = -ENOMEM;
        goto out_free;
    }
    kv->cfg.spill_dir = kv->spill_dir;
    if ((rc = open_store(kv)))
        goto out_free;
    struct vmm_params vp = {
        .backend = kv->cfg.backend, .device = kv->cfg.device,
        .emu_capacity = kv->cfg.emu_device_bytes ? kv->cfg.emu_device_bytes
                                                 : kv->cfg.device_budget,
        .emu_granule = kv->cfg.emu_granule, .emu_opaque = kv->cfg.emu_opaque,
    };
    rc = vmm_open(&vp, &kv->v);
    if (rc)
        goto out_store;
    kv->vdead = vmm_dead_word(kv->v);
    if (kv->cfg.emu_device_bytes && !strcmp(vmm_backend_name(kv->v), "emulated") &&
        kv->cfg.device_budget > kv->cfg.emu_device_bytes) {
        rc = kerr(-EINVAL, "kvvm_open: device_budget %zu is larger than the emulated device "
                  "(emu_device_bytes %zu): lower device_budget (KVVM_DEVICE_BUDGET) or raise "
                  "emu_device_bytes (KVVM_EMU_DEVICE_BYTES)", kv->cfg.device_budget,
                  kv->cfg.emu_device_bytes);
        vmm_close(kv->v);
        goto out_store;
    }
    pthread_mutex_init(&kv->lock, NULL);
    kcu_context prev;               /* vmm_open left the caller's context current */
    rc = vmm_ctx_save(kv->v, &prev);
    if (!rc)
        rc = open_layout(kv);
    vmm_ctx_restore(kv->v, prev);
    if (rc)
        goto out_vmm;
    /* sizing hint: a sequence holds at least one page per region even at length 1 */
    uint64_t per_seq = (uint64_t)kv->cfg.n_regions * kv->cfg.page_size;
    if (per_seq && (uint64_t)kv->cfg.max_seqs * per_seq > kv->cfg.device_budget)
        klog_info("kvvm_open: a sequence holds >= %u pages of %llu bytes (one per region) "
                  "even at length 1: %llu of max_seqs %u fit in device_budget %llu at once",
                  kv->cfg.n_regions, (unsigned long long)kv->cfg.page_size,
                  (unsigned long long)(kv->cfg.device_budget / per_seq), kv->cfg.max_seqs,
                  (unsigned long long)kv->cfg.device_budget);
    *out = kv;
    return 0;
out_vmm:
    pthread_mutex_destroy(&kv->lock);
    vmm_close(kv->v);
out_store:
    store_close(kv->store);
out_free:
    free(kv->store_url);
    free(kv->spill_dir);
    free(kv);
    return rc;
}

int kvvm_open(const struct kvvm_config *cfg, kvvm **out)
{
    klast_clear();
    NONNULL(cfg);
    NONNULL(out);
    return api_done(__func__, open_ctx(cfg, out));
}

void kvvm_close(kvvm *kv)
{
    if (!kv || forked(kv))          /* a child leaves the parent's context alone */
        return;
    kcu_context prev;               /* restored at the end (kvvm.h) */
    (void)vmm_ctx_save(kv->v, &prev);
    swap_destroy(kv->sw);           /* joins the reclaim thread: without the lock */
    frames_destroy(kv->fr);         /* and the frame pool thread */
    pthread_mutex_lock(&kv->lock);
    paging_disk_wait(kv->pg);       /* no page I/O in flight: pages may be released */
    prefix_destroy(kv->pfx);        /* the entries' pages (after swap: no plan reaches it) */
    paging_destroy(kv->pg);
    spill_close(kv->spill);         /* the unnamed file goes with its descriptor */
    store_close(kv->store);
    host_arena_close(kv->host);
    for (size_t i = 0; i < kv->n_streams; i++)
        vmm_stream_destroy(kv->v, kv->streams[i]);
    free(kv->streams);
    vmm_unreserve(kv->v);
    vmm_close_to(kv->v, prev);
    pthread_mutex_unlock(&kv->lock);
    pthread_mutex_destroy(&kv->lock);
    free(kv->store_url);
    free(kv->spill_dir);
    free(kv);
}
