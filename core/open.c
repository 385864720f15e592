/*
 * core/open.c: the context's lifetime, kvvm_open and kvvm_close.
 *
 * kvvm_open copies and checks the caller's config, opens the entries tier of the list
 * (core/tiers.c: the shared store of store_url), the device (vmm), reserves the layout,
 * opens the page tiers below the device (the host arena, the disk tier), then paging (its
 * frame source: core/frame_src.c), swap and the store's queue; each step is undone on
 * failure (out_<what> labels). kvvm_close tears it all down in the reverse order, the
 * threads first (joined without the lock). It names no tier: the list's entries do
 * (core/tiers.h).
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
    /* a struct from before 0.4: its defaults */
    if (in->size < offsetof(struct kvvm_config, pool_timeout_ms) + sizeof out->pool_timeout_ms)
        out->pool_timeout_ms = POOL_TIMEOUT_DEFAULT_MS;
    if (in->size < offsetof(struct kvvm_config, store_queue_bytes) +
                   sizeof out->store_queue_bytes)
        out->store_queue_bytes = STORE_QUEUE_DEFAULT_BYTES;
    out->size = sizeof *out;
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
    if (kv->pool)                   /* the daemon's pool: it arbitrates, not cuMemGetInfo */
        return 0;
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
    /* with a store: paging's copy run, where the store's copies read the pages of the
       entries published (one block of it per staging slot), at the reservation's end */
    uint64_t copy_at = reserve;
    uint32_t copy_blocks = core_tiers_copy_blocks(kv);
    reserve += (uint64_t)copy_blocks * c->n_regions * c->page_size;
    rc = vmm_reserve(kv->v, reserve, &kv->base);
    if (rc) {
        klog_error("kvvm_open: reserving %llu bytes of device address space failed (%d)",
                   (unsigned long long)reserve, rc);
        return rc;
    }
    rc = core_tiers_open(kv, CORE_TIER_PAGES);   /* the tiers below the device (tiers.c) */
    if (rc)
        goto out_unreserve;
    /* page descriptors: device pages + the pages the tiers below can hold */
    uint64_t slots = core_tiers_slots(kv);
    struct paging_params pp = {
        .n_regions = c->n_regions, .bytes_per_token = c->bytes_per_token,
        .max_seqs = c->max_seqs, .max_tokens = c->max_tokens, .page_size = c->page_size,
        .slot_bytes = kv->slot_bytes, .base = kv->base, .max_frames = (uint32_t)frames,
        .cap_frames = (uint32_t)cap,
        .max_pages = (uint32_t)(cap + (slots < UINT32_MAX / 2 ? slots : UINT32_MAX / 2)),
        .map_ahead = c->map_ahead, .scrub = !!(c->flags & KVVM_F_SCRUB),
        .view_ids = (uint32_t)view_ids, .view_base = kv->base + windows,
        .copy_blocks = copy_blocks, .copy_base = kv->base + copy_at,
        .feed = !!c->pool_thread, .prealloc = !!c->create_at_open,
    };
    core_tiers_params(kv, &pp);
    pp.src = core_frame_source(kv); /* the pool's frames, or this process's (frame_src.c) */
    rc = paging_create(kv->v, &pp, &kv->pg);
    if (rc)
        goto out_tiers;
    struct swap_params swp = {
        .frames = (uint32_t)frames, .min = c->device_min, .low = c->device_low,
        .high = c->device_high, .auto_swap = !!(c->flags & KVVM_F_AUTO_SWAP),
        .cache_demote = !!(c->flags & KVVM_F_CACHE_DEMOTE),
    };
    core_tiers_swap_params(kv, &swp);   /* the tiers': thread, host_slots and marks, disk */
    rc = swap_create(kv->pg, kv->v, &kv->lock, &swp, &kv->sw);
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
    rc = storeq_create(kv, &kv->sq);   /* the store's staging and thread (none without) */
    if (rc)
        goto out_frames;
    return 0;
out_frames:
    frames_destroy(kv->fr);
    kv->fr = NULL;
out_swap:
    swap_set_cache(kv->sw, NULL);   /* no plan may reach the index from here */
    prefix_destroy(kv->pfx);
out_swap_only:
    swap_destroy(kv->sw);
out_paging:
    paging_destroy(kv->pg);
out_tiers:
    core_tiers_close(kv, CORE_TIER_PAGES);
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
    if ((rc = core_pool_open(kv)))      /* with pool_socket: the daemon's pool (pool_client.c) */
        goto out_free;
    if (kv->cfg.client_name && !(kv->client_name = strdup(kv->cfg.client_name))) {
        rc = -ENOMEM;
        goto out_free;
    }
    kv->cfg.client_name = kv->client_name;
    if (kv->cfg.store_url && !(kv->store_url = strdup(kv->cfg.store_url))) {
        rc = -ENOMEM;
        goto out_free;
    }
    kv->cfg.store_url = kv->store_url;
    /* the entries tier (the shared store of store_url: a down store is not an error) */
    if ((rc = core_tiers_open(kv, CORE_TIER_ENTRIES)))
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
    if ((rc = core_pool_listen(kv))) {  /* the daemon's asks for frames back (pool_client.c) */
        kvvm_close(kv);
        return kerr(rc, "kvvm_open: the pool's connection thread could not start (%s)",
                    strerror(-rc));
    }
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
    core_tiers_close(kv, CORE_TIER_ENTRIES);
out_free:
    core_pool_close(kv);
    free(kv->store_url);
    free(kv->client_name);
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
    core_pool_unlisten(kv);         /* no ask served from now on: without the lock */
    storeq_destroy(kv->sq);         /* the queued store writes, bounded by the store's
                                       timeout; its thread joined: without the lock */
    swap_destroy(kv->sw);           /* joins the reclaim thread: without the lock */
    frames_destroy(kv->fr);         /* and the frame pool thread */
    pthread_mutex_lock(&kv->lock);
    paging_disk_wait(kv->pg);       /* no page I/O in flight: pages may be released */
    prefix_destroy(kv->pfx);        /* the entries' pages (after swap: no plan reaches it) */
    paging_destroy(kv->pg);
    core_pool_close(kv);            /* the frames paging gave back are the daemon's again */
    core_tiers_close(kv, CORE_TIER_ENTRIES);   /* the store (its queue is gone) */
    core_tiers_close(kv, CORE_TIER_PAGES);     /* the tiers below the device (tiers.c) */
    for (size_t i = 0; i < kv->n_streams; i++)
        vmm_stream_destroy(kv->v, kv->streams[i]);
    free(kv->streams);
    vmm_unreserve(kv->v);
    vmm_close_to(kv->v, prev);
    pthread_mutex_unlock(&kv->lock);
    pthread_mutex_destroy(&kv->lock);
    free(kv->store_url);
    free(kv->client_name);
    free(kv->spill_dir);
    free(kv);
}
