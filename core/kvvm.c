/*
 * core/kvvm.c: the public calls of include/kvvm.h.
 *
 * Each call: check its pointer arguments, take the context lock, refuse with -EIO once the
 * context is dead (a sticky driver error seen by vmm), call paging/ (which is all or
 * nothing), note a death, unlock. Calls that need device frames retry after direct reclaim
 * under KVVM_F_AUTO_SWAP (see core.h "Pressure"); the watermark rules run after them.
 */
#include "core.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "common/log.h"

/* ---- errors ------------------------------------------------------------------------- */
/* Every public call returning a status starts with klast_clear() and ends in api_done(): the
   thread's kvvm_last_error() is then "" after a success, else the reason. A bad argument is
   refused with kerr (logged at the call, kept as the reason). */
#define NONNULL(p) do { if (!(p)) return kerr(-EINVAL, "%s: %s is NULL", __func__, #p); } \
                   while (0)
/* A -EINVAL from a layer below that gave no reason: the call's own (logged, kept). */
#define EXPLAIN_EINVAL(rc, ...) \
    ((rc) == -EINVAL && !*kvvm_last_error() ? kerr((rc), __VA_ARGS__) : (rc))

static const char *err_name(int err);

/* Ends a public call: success clears the last error; a failure nothing explained gets the
   call's name and kvvm_strerror's text. */
static int api_done(const char *call, int rc)
{
    if (rc >= 0)
        klast_clear();
    else
        klast_set("%s: %s: %s", call, err_name(rc), kvvm_strerror(rc));
    return rc;
}

/* A fork() child of the process that opened kv: the context's threads, locks (perhaps held
   by a parent thread at the fork) and device context belong to the parent, so a child must
   touch none of it (no lock taken, no driver call: the emulated device's memory is shared
   with the parent). */
static bool forked(const kvvm *kv)
{
    if (getpid() == kv->pid)
        return false;
    klog_error("kvvm: a context is used in a child process (pid %ld) of the process that "
               "opened it (pid %ld): -EIO; open a new context in the child",
               (long)getpid(), (long)kv->pid);
    return true;
}

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

static int h_alloc(void *a, uint64_t *slot)
{
    host_slot s;
    int rc = host_slot_alloc(a, &s);
    if (!rc)
        *slot = s.idx;
    return rc;
}
static void h_free(void *a, uint64_t slot)
{
    host_slot_free(a, (host_slot){ (uint32_t)slot });
}
static void *h_ptr(void *a, uint64_t slot)
{
    return host_slot_ptr(a, (host_slot){ (uint32_t)slot });
}

static size_t h_n_free(void *a)
{
    return host_slots_free(a);
}

/* paging's disk ops over the spill engine: completions go to its queue (reaped by paging
   under the context lock), so the engine thread never takes the context lock. */
static int d_alloc(void *a, uint64_t hint, uint64_t *slot)
{
    spill_slot s, h = hint > UINT32_MAX ? SPILL_SLOT_NONE : (spill_slot){ (uint32_t)hint };
    int rc = spill_slot_alloc(a, 1, h, &s);
    if (!rc)
        *slot = s.idx;
    return rc;
}
static void d_free(void *a, uint64_t slot)
{
    int rc = spill_slot_free(a, (spill_slot){ (uint32_t)slot });
    if (rc)
        klog_error("kvvm: freeing disk slot %llu failed (%d)", (unsigned long long)slot, rc);
}
static int d_submit(void *a, bool write, uint64_t slot, void *buf, uint32_t page)
{
    struct spill_req r = { .op = write ? SPILL_WRITE : SPILL_READ,
                           .slot = { (uint32_t)slot }, .buf = buf, .page = page,
                           .user = (void *)(uintptr_t)page };
    return spill_submit(a, &r, 1);
}
static size_t d_reap(void *a, struct pg_disk_done *out, size_t max)
{
    struct spill_cqe c[64];
    size_t n = spill_reap(a, c, max < 64 ? max : 64);
    for (size_t i = 0; i < n; i++)
        out[i] = (struct pg_disk_done){ (uint32_t)(uintptr_t)c[i].user, c[i].status,
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
                   err_name(rc));
        return rc;
    }
    kv->disk_ops = (struct pg_disk_ops){ kv->spill, d_alloc, d_free, d_submit, d_reap,
                                         d_wait, d_n_free };
    return 0;
}

static int open_layout(kvvm *kv)
{
    struct kvvm_config *c = &kv->cfg;
    uint64_t reserve;
    int rc = config_layout(c, vmm_granule(kv->v), &kv->slot_bytes, &reserve);
    if (rc)
        return rc;
    rc = vmm_reserve(kv->v, reserve, &kv->base);
    if (rc) {
        klog_error("kvvm_open: reserving %llu bytes of device address space failed (%d)",
                   (unsigned long long)reserve, rc);
        return rc;
    }
    uint64_t frames = c->device_budget / c->page_size;
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
    /* the budget may grow up to the device's capacity (kvvm_set_budget) */
    uint64_t cap = vmm_device_bytes(kv->v) / c->page_size;
    if (cap > UINT32_MAX / 2)
        cap = UINT32_MAX / 2;
    if (cap < frames)
        cap = frames;
    struct paging_params pp = {
        .n_regions = c->n_regions, .bytes_per_token = c->bytes_per_token,
        .max_seqs = c->max_seqs, .max_tokens = c->max_tokens, .page_size = c->page_size,
        .slot_bytes = kv->slot_bytes, .base = kv->base, .max_frames = (uint32_t)frames,
        .cap_frames = (uint32_t)cap,
        .max_pages = (uint32_t)(cap + (slots < UINT32_MAX / 2 ? slots : UINT32_MAX / 2)),
        .map_ahead = c->map_ahead, .scrub = !!(c->flags & KVVM_F_SCRUB),
        .feed = !!c->pool_thread,
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
    };
    rc = swap_create(kv->pg, kv->v, &kv->lock, &sp, &kv->sw);
    if (rc)
        goto out_paging;
    if (c->pool_thread) {
        struct frames_params fp = { .budget = (uint32_t)frames, .n_regions = c->n_regions,
                                    .low = c->pool_low, .high = c->pool_high };
        rc = frames_create(kv->pg, kv->v, &kv->lock, &fp, &kv->fr);
        if (rc)
            goto out_swap;
    }
    return 0;
out_swap:
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

static int open_ctx(const struct kvvm_config *cfg, kvvm **out)
{
    kvvm *kv = calloc(1, sizeof *kv);
    if (!kv)
        return -ENOMEM;
    kv->pid = getpid();
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
    struct vmm_params vp = {
        .backend = kv->cfg.backend, .device = kv->cfg.device,
        .emu_capacity = kv->cfg.emu_device_bytes ? kv->cfg.emu_device_bytes
                                                 : kv->cfg.device_budget,
        .emu_granule = kv->cfg.emu_granule, .emu_opaque = kv->cfg.emu_opaque,
    };
    rc = vmm_open(&vp, &kv->v);
    if (rc)
        goto out_free;
    if (kv->cfg.emu_device_bytes && !strcmp(vmm_backend_name(kv->v), "emulated") &&
        kv->cfg.device_budget > kv->cfg.emu_device_bytes) {
        rc = kerr(-EINVAL, "kvvm_open: device_budget %zu is larger than the emulated device "
                  "(emu_device_bytes %zu): lower device_budget (KVVM_DEVICE_BUDGET) or raise "
                  "emu_device_bytes (KVVM_EMU_DEVICE_BYTES)", kv->cfg.device_budget,
                  kv->cfg.emu_device_bytes);
        vmm_close(kv->v);
        goto out_free;
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
out_free:
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
    paging_destroy(kv->pg);
    spill_close(kv->spill);         /* the unnamed file goes with its descriptor */
    host_arena_close(kv->host);
    for (size_t i = 0; i < kv->n_streams; i++)
        vmm_stream_destroy(kv->v, kv->streams[i]);
    free(kv->streams);
    vmm_unreserve(kv->v);
    vmm_close_to(kv->v, prev);
    pthread_mutex_unlock(&kv->lock);
    pthread_mutex_destroy(&kv->lock);
    free(kv->spill_dir);
    free(kv);
}

/* ---- locking and death -------------------------------------------------------------- */

static int enter(kvvm *kv)
{
    if (forked(kv))
        return -EIO;
    pthread_mutex_lock(&kv->lock);
    if (kv->dead || vmm_dead(kv->v)) {
        if (!kv->dead)
            klog_error("kvvm: the device context failed; every call returns -EIO now");
        kv->dead = true;
        pthread_mutex_unlock(&kv->lock);
        return -EIO;
    }
    /* the caller's current context comes back at leave(): libkvvm never leaves its own
       context current in the engine's thread */
    int rc = vmm_ctx_save(kv->v, &kv->ctx_prev);
    if (rc) {
        pthread_mutex_unlock(&kv->lock);
        return rc;
    }
    return 0;
}

static int leave(kvvm *kv, int rc)
{
    if (vmm_dead(kv->v)) {
        if (!kv->dead)
            klog_error("kvvm: the device context failed; every call returns -EIO now");
        kv->dead = true;
        rc = -EIO;
    }
    vmm_ctx_restore(kv->v, kv->ctx_prev);
    pthread_mutex_unlock(&kv->lock);
    return rc;
}

#define CALL(kv, expr) \
    do { int rc_ = enter(kv); if (!rc_) rc_ = leave(kv, (expr)); \
         return api_done(__func__, rc_); } while (0)
/* CALL for a call that enqueues onto, records on or synchronizes the engine stream:
   -EBUSY, nothing changed, while that stream captures a CUDA graph (stream_check). */
#define CALL_ENGINE(kv, expr) \
    do { int rc_ = enter(kv); if (!rc_) { rc_ = stream_check(kv); \
         rc_ = leave(kv, rc_ ? rc_ : (expr)); } return api_done(__func__, rc_); } while (0)

/* ---- pressure ----------------------------------------------------------------------- */

/* Direct reclaim of `want` free frames for a call naming excl (KVVM_F_AUTO_SWAP only). */
static int reclaim(kvvm *kv, uint32_t want, const uint64_t *excl, size_t n_excl)
{
    if (!(kv->cfg.flags & KVVM_F_AUTO_SWAP))
        return -ENOMEM;
    return swap_reclaim_direct(kv->sw, want, excl, n_excl);
}

/* Evaluates expr; while it is -ENOMEM and reclaim makes room (need frames, a little more on
   each retry), evaluates it again. */
#define WITH_RECLAIM(kv, need, excl, n_excl, expr) ({                                  \
        int r_ = (expr);                                                               \
        for (uint32_t t_ = 0; r_ == -ENOMEM && t_ < 8; t_++) {                         \
            if (reclaim((kv), (need) + t_ * (kv)->cfg.n_regions, (excl), (n_excl)))    \
                break;                                                                 \
            r_ = (expr);                                                               \
        }                                                                              \
        r_; })

/* -EBUSY when the engine stream is capturing a graph (a swap would enqueue on it), or, in
   synchronous mode, when the legacy stream cannot be used because a blocking stream is
   capturing (cuda.h, cuStreamIsCapturing: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT). */
static int stream_check(kvvm *kv)
{
    return vmm_stream_check_capture(kv->v, paging_stream(kv->pg));
}

static int swap_in_locked(kvvm *kv, kvvm_seq s, bool async, const uint64_t *excl,
                          size_t n_excl)
{
    uint32_t need;
    int rc = paging_need(kv->pg, s, 0, &need);
    if (!rc)
        rc = stream_check(kv);
    if (rc)
        return rc;
    return WITH_RECLAIM(kv, need, excl, n_excl, paging_swap_in(kv->pg, s, async));
}

/* The public swap-in / prefetch: the watermark rules after it (never between the steps of
   a call that swaps in several sequences: they would evict each other). */
static int swap_in_call(kvvm *kv, kvvm_seq s, bool async)
{
    int rc = swap_in_locked(kv, s, async, &s, 1);
    swap_after_call(kv->sw);
    return rc;
}

/* Makes s resident for a call that uses it; *swapped says it was not. */
static int make_resident(kvvm *kv, kvvm_seq s, const uint64_t *excl, size_t n_excl,
                         bool *swapped)
{
    *swapped = false;
    struct paging_seq_info pi;
    int rc = paging_seq_info(kv->pg, s, &pi);
    if (rc || pi.resident)
        return rc;
    rc = swap_in_locked(kv, s, false, excl, n_excl);
    *swapped = !rc;
    return rc;
}

/* Before a write into regions [r0, r1), bytes [b0, b1), of a swapped-out s: room for the
   swap-in and the copies of the shared pages it writes, so a write that cannot fit does
   not swap in (and out again). */
static int write_room(kvvm *kv, kvvm_seq s, uint32_t r0, uint32_t r1, uint64_t b0,
                      uint64_t b1)
{
    uint32_t need;
    struct paging_counters c;
    if (paging_seq_resident(kv->pg, s))
        return 0;
    int rc = paging_need_write(kv->pg, s, r0, r1, b0, b1, &need);
    if (rc)
        return rc;
    paging_counters(kv->pg, &c);
    return c.pages_free < need ? reclaim(kv, need, &s, 1) : 0;
}

/* A call that swapped s in failed afterwards: put it back (best effort, logged). */
static void restore_out(kvvm *kv, kvvm_seq s, bool swapped)
{
    if (swapped && paging_swap_out(kv->pg, s, false))
        klog_warn("kvvm: a failed call leaves sequence %llx resident", (unsigned long long)s);
}

/* ---- sequences ---------------------------------------------------------------------- */

int kvvm_seq_create(kvvm *kv, kvvm_seq *out)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(out);
    CALL(kv, paging_seq_create(kv->pg, out));
}

int kvvm_seq_free(kvvm *kv, kvvm_seq s)
{
    klast_clear();
    NONNULL(kv);
    CALL_ENGINE(kv, paging_seq_free(kv->pg, s));
}

static int grow_locked(kvvm *kv, kvvm_seq s, uint64_t length)
{
    struct paging_seq_info pi;
    uint32_t need;
    bool swapped = false;
    int rc = paging_seq_info(kv->pg, s, &pi);
    if (rc)
        return rc;
    if (length < pi.length)
        return kerr(-EINVAL, "kvvm_seq_grow: length %llu is shorter than the sequence's %llu "
                    "tokens (kvvm_seq_truncate shortens)", (unsigned long long)length,
                    (unsigned long long)pi.length);
    rc = paging_need(kv->pg, s, length, &need);
    if (!rc && !pi.resident) {
        /* room for both first, so a grow that cannot fit does not swap in */
        if (need > pi.pages_host + pi.pages_disk) {
            struct paging_counters c;
            paging_counters(kv->pg, &c);
            if (c.pages_free < need && (rc = reclaim(kv, need, &s, 1)))
                return rc;
        }
        rc = make_resident(kv, s, &s, 1, &swapped);
        if (!rc)
            rc = paging_need(kv->pg, s, length, &need);
    }
    if (rc)
        return rc;
    rc = WITH_RECLAIM(kv, need, &s, 1, paging_seq_grow(kv->pg, s, length));
    if (rc)
        restore_out(kv, s, swapped);
    swap_after_call(kv->sw);
    return rc;
}

int kvvm_seq_grow(kvvm *kv, kvvm_seq s, uint64_t length)
{
    klast_clear();
    NONNULL(kv);
    CALL_ENGINE(kv, grow_locked(kv, s, length));
}

static int grow_batch_locked(kvvm *kv, const kvvm_seq *seqs, const uint64_t *lengths,
                             size_t n)
{
    bool *swapped = calloc(n ? n : 1, sizeof *swapped);
    uint64_t need = 0;
    int rc = swapped ? 0 : -ENOMEM;
    size_t i;
    for (i = 0; !rc && i < n; i++) {
        struct paging_seq_info pi;
        rc = paging_seq_info(kv->pg, seqs[i], &pi);
        if (!rc && lengths[i] < pi.length)
            rc = kerr(-EINVAL, "kvvm_seq_grow_batch: lengths[%zu] = %llu is shorter than "
                      "sequence seqs[%zu]'s %llu tokens", i, (unsigned long long)lengths[i],
                      i, (unsigned long long)pi.length);
    }
    /* room for the whole batch first (as grow does), so a batch that cannot fit swaps
       nothing in (it could not always put them back) */
    bool any_out = false;
    for (i = 0; !rc && i < n; i++)
        any_out |= !paging_seq_resident(kv->pg, seqs[i]);
    if (!rc && any_out) {
        uint64_t lb;
        struct paging_counters c;
        rc = paging_need_batch(kv->pg, seqs, lengths, n, &lb);
        paging_counters(kv->pg, &c);
        if (!rc && c.pages_free < lb)
            rc = lb > UINT32_MAX ? -ENOMEM : reclaim(kv, (uint32_t)lb, seqs, n);
    }
    for (i = 0; !rc && i < n; i++)
        rc = make_resident(kv, seqs[i], seqs, n, &swapped[i]);
    for (i = 0; !rc && i < n; i++) {
        uint32_t k;
        rc = paging_need(kv->pg, seqs[i], lengths[i], &k);
        need += k;
    }
    if (!rc) {
        uint32_t nd = need > UINT32_MAX ? UINT32_MAX : (uint32_t)need;
        rc = WITH_RECLAIM(kv, nd, seqs, n, paging_seq_grow_batch(kv->pg, seqs, lengths, n));
        rc = EXPLAIN_EINVAL(rc, "kvvm_seq_grow_batch: a sequence is named twice in seqs");
    }
    if (rc && swapped)
        for (i = 0; i < n; i++)
            restore_out(kv, seqs[i], swapped[i]);
    free(swapped);
    swap_after_call(kv->sw);
    return rc;
}

int kvvm_seq_grow_batch(kvvm *kv, const kvvm_seq *seqs, const uint64_t *lengths, size_t n)
{
    klast_clear();
    NONNULL(kv);
    if (n) {
        NONNULL(seqs);
        NONNULL(lengths);
    }
    if (!n)
        return 0;
    CALL_ENGINE(kv, grow_batch_locked(kv, seqs, lengths, n));
}

int kvvm_seq_truncate(kvvm *kv, kvvm_seq s, uint64_t length)
{
    klast_clear();
    NONNULL(kv);
    CALL_ENGINE(kv, EXPLAIN_EINVAL(paging_seq_truncate(kv->pg, s, length),
                                   "kvvm_seq_truncate: length %llu is longer than the "
                                   "sequence (kvvm_seq_grow lengthens)",
                                   (unsigned long long)length));
}

int kvvm_seq_fork(kvvm *kv, kvvm_seq parent, kvvm_seq *child)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(child);
    CALL_ENGINE(kv, paging_seq_fork(kv->pg, parent, child));
}

static int share_locked(kvvm *kv, kvvm_seq dst, kvvm_seq src, uint64_t n_tokens)
{
    uint64_t ex[2] = { dst, src };
    int rc = WITH_RECLAIM(kv, kv->cfg.n_regions, ex, 2,
                          paging_seq_share(kv->pg, dst, src, n_tokens));
    struct paging_seq_info d, r;
    if (rc == -EINVAL && !paging_seq_info(kv->pg, dst, &d) &&
        !paging_seq_info(kv->pg, src, &r))
        rc = kerr(rc, "kvvm_seq_share: %s (dst holds %llu tokens, must be empty; n_tokens "
                  "%llu, src holds %llu)", d.length ? "dst is not empty" : "n_tokens is past "
                  "src's length", (unsigned long long)d.length, (unsigned long long)n_tokens,
                  (unsigned long long)r.length);
    swap_after_call(kv->sw);
    return rc;
}

int kvvm_seq_share(kvvm *kv, kvvm_seq dst, kvvm_seq src, uint64_t n_tokens)
{
    klast_clear();
    NONNULL(kv);
    CALL_ENGINE(kv, share_locked(kv, dst, src, n_tokens));
}

static int prepare_write_locked(kvvm *kv, kvvm_seq s, uint64_t first, uint64_t end)
{
    bool swapped;
    struct paging_seq_info pi;
    int rc = paging_seq_info(kv->pg, s, &pi);
    if (!rc && first >= end)
        rc = kerr(-EINVAL, "kvvm_seq_prepare_write: first %llu must be below end %llu",
                  (unsigned long long)first, (unsigned long long)end);
    if (!rc && end > pi.length)
        rc = kerr(-EINVAL, "kvvm_seq_prepare_write: end %llu is past the sequence's length "
                  "%llu", (unsigned long long)end, (unsigned long long)pi.length);
    if (!rc)
        rc = write_room(kv, s, 0, kv->cfg.n_regions, first * kv->cfg.bytes_per_token,
                        end * kv->cfg.bytes_per_token);
    if (!rc)
        rc = make_resident(kv, s, &s, 1, &swapped);
    if (rc)
        return rc;
    rc = WITH_RECLAIM(kv, 1, &s, 1, paging_seq_prepare_write(kv->pg, s, first, end));
    if (rc)
        restore_out(kv, s, swapped);
    swap_after_call(kv->sw);
    return rc;
}

int kvvm_seq_prepare_write(kvvm *kv, kvvm_seq s, uint64_t first, uint64_t end)
{
    klast_clear();
    NONNULL(kv);
    CALL_ENGINE(kv, prepare_write_locked(kv, s, first, end));
}

/* Validates an I/O range the way paging does, before any swap-in. */
static int io_pre(kvvm *kv, const char *call, kvvm_seq s, uint32_t region, uint64_t offset,
                  const void *buf, size_t len)
{
    struct paging_seq_info pi;
    int rc = paging_seq_info(kv->pg, s, &pi);
    if (rc)
        return rc;
    uint64_t bytes = pi.length * kv->cfg.bytes_per_token;
    if (!buf)
        return kerr(-EINVAL, "%s: the buffer is NULL", call);
    if (region >= kv->cfg.n_regions)
        return kerr(-EINVAL, "%s: region %u is out of range (n_regions %u)", call, region,
                    kv->cfg.n_regions);
    if (!len)
        return kerr(-EINVAL, "%s: len is 0", call);
    if (offset >= bytes || len > bytes - offset)
        return kerr(-EINVAL, "%s: bytes [%llu, +%zu) are outside the sequence's %llu bytes "
                    "per region (length %llu x bytes_per_token %llu)", call,
                    (unsigned long long)offset, len, (unsigned long long)bytes,
                    (unsigned long long)pi.length,
                    (unsigned long long)kv->cfg.bytes_per_token);
    return 0;
}

static int write_locked(kvvm *kv, kvvm_seq s, uint32_t region, uint64_t offset,
                        const void *src, size_t len)
{
    bool swapped;
    int rc = io_pre(kv, "kvvm_seq_write", s, region, offset, src, len);
    if (!rc)
        rc = write_room(kv, s, region, region + 1, offset, offset + len);
    if (!rc)
        rc = make_resident(kv, s, &s, 1, &swapped);
    if (rc)
        return rc;
    rc = WITH_RECLAIM(kv, 1, &s, 1, paging_seq_write(kv->pg, s, region, offset, src, len));
    if (rc)
        restore_out(kv, s, swapped);
    swap_after_call(kv->sw);
    return rc;
}

int kvvm_seq_write(kvvm *kv, kvvm_seq s, uint32_t region, uint64_t offset, const void *src,
                   size_t len)
{
    klast_clear();
    NONNULL(kv);
    CALL_ENGINE(kv, write_locked(kv, s, region, offset, src, len));
}

static int read_locked(kvvm *kv, kvvm_seq s, uint32_t region, uint64_t offset, void *dst,
                       size_t len)
{
    bool swapped;
    int rc = io_pre(kv, "kvvm_seq_read", s, region, offset, dst, len);
    if (!rc)
        rc = make_resident(kv, s, &s, 1, &swapped);
    if (rc)
        return rc;
    rc = paging_seq_read(kv->pg, s, region, offset, dst, len);
    if (rc)
        restore_out(kv, s, swapped);
    return rc;
}

int kvvm_seq_read(kvvm *kv, kvvm_seq s, uint32_t region, uint64_t offset, void *dst,
                  size_t len)
{
    klast_clear();
    NONNULL(kv);
    CALL_ENGINE(kv, read_locked(kv, s, region, offset, dst, len));
}

static int swap_out_locked(kvvm *kv, kvvm_seq s)
{
    int rc = stream_check(kv);
    if (!rc)
        rc = paging_swap_out(kv->pg, s, false);
    swap_after_call(kv->sw);        /* the host marks: spilling in the background */
    return rc;
}

int kvvm_seq_swap_out(kvvm *kv, kvvm_seq s)
{
    klast_clear();
    NONNULL(kv);
    CALL(kv, swap_out_locked(kv, s));
}

int kvvm_seq_swap_in(kvvm *kv, kvvm_seq s)
{
    klast_clear();
    NONNULL(kv);
    CALL(kv, swap_in_call(kv, s, false));
}

int kvvm_seq_prefetch(kvvm *kv, kvvm_seq s)
{
    klast_clear();
    NONNULL(kv);
    CALL(kv, swap_in_call(kv, s, true));
}

int kvvm_seq_ready(kvvm *kv, kvvm_seq s)
{
    klast_clear();
    NONNULL(kv);
    CALL(kv, paging_seq_ready(kv->pg, s));
}

static int wait_stream_locked(kvvm *kv, kvvm_seq s, void *stream)
{
    uint32_t slot;
    int rc = paging_seq_slot(kv->pg, s, &slot);
    if (!rc)
        rc = vmm_stream_check_capture(kv->v, (kcu_stream)stream);
    return rc ? rc : paging_stream_after_copies(kv->pg, (kcu_stream)stream);
}

int kvvm_seq_wait_stream(kvvm *kv, kvvm_seq s, void *stream)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(stream);
    CALL(kv, wait_stream_locked(kv, s, stream));
}

static int need_locked(kvvm *kv, kvvm_seq s, uint64_t length, uint64_t *pages, int *fits)
{
    uint32_t n;
    struct paging_counters c;
    int rc = paging_need(kv->pg, s, length, &n);
    if (rc)
        return rc;
    paging_counters(kv->pg, &c);
    *pages = n;
    *fits = n <= c.pages_free;
    return 0;
}

int kvvm_seq_need(kvvm *kv, kvvm_seq s, uint64_t length, uint64_t *pages, int *fits)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(pages);
    NONNULL(fits);
    CALL(kv, need_locked(kv, s, length, pages, fits));
}

/* ---- streams and steps -------------------------------------------------------------- */

static int step_locked(kvvm *kv)
{
    int rc = paging_step(kv->pg);
    if (!rc)
        rc = paging_disk_reap(kv->pg);
    if (!rc)
        swap_after_step(kv->sw);
    if (!rc)
        frames_after_step(kv->fr);
    return rc;
}

int kvvm_step(kvvm *kv)
{
    klast_clear();
    NONNULL(kv);
    CALL_ENGINE(kv, step_locked(kv));
}

static int sync_locked(kvvm *kv)
{
    int rc = paging_sync(kv->pg);
    int drc = paging_disk_wait(kv->pg);
    return rc ? rc : drc;
}

int kvvm_sync(kvvm *kv)
{
    klast_clear();
    NONNULL(kv);
    if (forked(kv))
        return -EIO;
    swap_wait_idle(kv->sw);         /* background rounds first, without the lock */
    frames_wait_idle(kv->fr);
    CALL_ENGINE(kv, sync_locked(kv));
}

int kvvm_set_stream(kvvm *kv, void *stream)
{
    klast_clear();
    NONNULL(kv);
    CALL_ENGINE(kv, paging_set_stream(kv->pg, (kcu_stream)stream));
}

static int stream_create_call(kvvm *kv, void **stream)
{
    kcu_stream s = NULL;
    int rc = enter(kv);
    if (rc)
        return rc;
    if (kv->n_streams == kv->cap_streams) {
        size_t cap = kv->cap_streams ? 2 * kv->cap_streams : 4;
        kcu_stream *n = realloc(kv->streams, cap * sizeof *n);
        if (!n)
            return leave(kv, -ENOMEM);
        kv->streams = n;
        kv->cap_streams = cap;
    }
    rc = vmm_stream_create(kv->v, &s);
    if (!rc) {
        kv->streams[kv->n_streams++] = s;
        *stream = s;
    }
    return leave(kv, rc);
}

int kvvm_stream_create(kvvm *kv, void **stream)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(stream);
    return api_done(__func__, stream_create_call(kv, stream));
}

/* Only a stream kvvm_stream_create made on this context (-EINVAL otherwise: the engine's
   own streams are not ours to destroy), and not the engine stream set now (-EBUSY). */
static int stream_destroy_locked(kvvm *kv, kcu_stream s)
{
    size_t i;
    for (i = 0; i < kv->n_streams && kv->streams[i] != s; i++)
        ;
    if (i == kv->n_streams)
        return kerr(-EINVAL, "kvvm_stream_destroy: stream %p was not made by "
                    "kvvm_stream_create on this context (or is destroyed already); the "
                    "engine destroys its own streams", (void *)s);
    if (s == paging_stream(kv->pg))
        return kerr(-EBUSY, "kvvm_stream_destroy: stream %p is the engine stream now; "
                    "kvvm_set_stream another stream (or NULL) first", (void *)s);
    int rc = vmm_stream_destroy(kv->v, s);
    if (rc)
        return rc;
    kv->streams[i] = kv->streams[--kv->n_streams];
    return 0;
}

int kvvm_stream_destroy(kvvm *kv, void *stream)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(stream);
    CALL(kv, stream_destroy_locked(kv, (kcu_stream)stream));
}

/* ---- addresses ---------------------------------------------------------------------- */

int kvvm_region_base(kvvm *kv, uint32_t region, uint64_t *addr)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(addr);
    if (forked(kv))
        return -EIO;
    if (region >= kv->cfg.n_regions)
        return kerr(-EINVAL, "kvvm_region_base: region %u is out of range (n_regions %u)",
                    region, kv->cfg.n_regions);
    *addr = paging_window(kv->pg, region, 0);    /* immutable after open: no lock */
    return 0;
}

int kvvm_slot_bytes(kvvm *kv, uint64_t *bytes)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(bytes);
    if (forked(kv))
        return -EIO;
    *bytes = kv->slot_bytes;
    return 0;
}

int kvvm_seq_slot(kvvm *kv, kvvm_seq s, uint32_t *slot)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(slot);
    CALL(kv, paging_seq_slot(kv->pg, s, slot));
}

static int seq_addr_locked(kvvm *kv, kvvm_seq s, uint32_t region, uint64_t *addr)
{
    uint32_t slot;
    int rc = paging_seq_slot(kv->pg, s, &slot);
    if (!rc)
        *addr = paging_window(kv->pg, region, slot);
    return rc;
}

int kvvm_seq_addr(kvvm *kv, kvvm_seq s, uint32_t region, uint64_t *addr)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(addr);
    if (region >= kv->cfg.n_regions)
        return kerr(-EINVAL, "kvvm_seq_addr: region %u is out of range (n_regions %u)",
                    region, kv->cfg.n_regions);
    CALL(kv, seq_addr_locked(kv, s, region, addr));
}

static int seq_info_locked(kvvm *kv, kvvm_seq s, struct kvvm_seq_info *info)
{
    struct paging_seq_info pi;
    int rc = paging_seq_info(kv->pg, s, &pi);
    if (rc)
        return rc;
    struct kvvm_seq_info o = {
        .size = info->size, .length = pi.length, .slot = pi.slot,
        .pages_device = pi.pages_device, .pages_host = pi.pages_host,
        .pages_disk = pi.pages_disk, .pages_shared = pi.pages_shared,
        .resident = pi.resident,
    };
    memcpy(info, &o, info->size < sizeof o ? info->size : sizeof o);
    return 0;
}

int kvvm_seq_info(kvvm *kv, kvvm_seq s, struct kvvm_seq_info *info)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(info);
    if (info->size < offsetof(struct kvvm_seq_info, resident) + sizeof(int))
        return kerr(-EINVAL, "kvvm_seq_info: info->size %zu is too small; set it to "
                    "sizeof(struct kvvm_seq_info) (%zu)", info->size, sizeof *info);
    CALL(kv, seq_info_locked(kv, s, info));
}

/* ---- elastic memory (kvvm_set_budget, kvvm_trim) ----------------------------------- */

/* -EINVAL (explained) unless b is a budget this context can have. */
static int budget_arg(kvvm *kv, size_t b, uint32_t *frames)
{
    size_t ps = kv->cfg.page_size, dev = vmm_device_bytes(kv->v);
    if (!b)
        return kerr(-EINVAL, "kvvm_set_budget: device_budget 0: at least one page per region "
                    "(%u x %zu bytes) is needed", kv->cfg.n_regions, ps);
    if (b % ps)
        return kerr(-EINVAL, "kvvm_set_budget: device_budget %zu is not a multiple of "
                    "page_size %zu", b, ps);
    if (b > dev || b / ps > paging_cap_frames(kv->pg))
        return kerr(-EINVAL, "kvvm_set_budget: device_budget %zu is larger than the device "
                    "(%zu bytes%s)", b, dev, strcmp(vmm_backend_name(kv->v), "emulated") ? ""
                    : ": emu_device_bytes, KVVM_EMU_DEVICE_BYTES");
    if (b / ps < kv->cfg.n_regions)
        return kerr(-EINVAL, "kvvm_set_budget: device_budget %zu holds fewer than one page of "
                    "%zu bytes per region (%u)", b, ps, kv->cfg.n_regions);
    *frames = (uint32_t)(b / ps);
    return 0;
}

/* Frames holding pages must fit in `frames`: completes pending releases, then swaps out
   (swap's direct-reclaim order and all-or-nothing check). */
static int budget_make_room(kvvm *kv, uint32_t frames)
{
    struct paging_counters c;
    paging_counters(kv->pg, &c);
    if (c.pages_used <= frames)
        return 0;
    int rc = c.deferred ? paging_sync(kv->pg) : 0;      /* releases behind the step fence */
    if (rc)
        return rc;
    paging_counters(kv->pg, &c);
    if (c.pages_used <= frames)
        return 0;
    rc = swap_reclaim_budget(kv->sw, (uint32_t)(c.pages_total - frames));
    if (rc == -ENOMEM) {        /* a normal outcome under load: the reason, not logged */
        klast_set("kvvm_set_budget: %llu pages are in use and only %u fit in "
                    "%zu bytes; not enough can be swapped out (protected or pinned "
                    "sequences, or no room in the host and disk tiers): the budget is "
                    "unchanged", (unsigned long long)c.pages_used, frames,
                    (size_t)frames * kv->cfg.page_size);
        return -ENOMEM;
    }
    return rc;
}

static int set_budget_locked(kvvm *kv, size_t b)
{
    uint32_t frames, released;
    int rc = budget_arg(kv, b, &frames);
    if (rc)
        return rc;
    paging_feed_quiesce(kv->pg);            /* no frame in the pool thread's hands */
    rc = budget_make_room(kv, frames);
    if (!rc)
        rc = paging_set_budget(kv->pg, frames, &released);
    if (rc)
        return rc;
    kv->cfg.device_budget = b;
    swap_set_frames(kv->sw, frames);        /* the watermarks follow */
    frames_set_budget(kv->fr, frames);      /* and the pool's marks (a refill round) */
    klog_info("kvvm_set_budget: %zu bytes (%u pages); %u frames released to the driver", b,
              frames, released);
    return 0;
}

int kvvm_set_budget(kvvm *kv, size_t device_budget)
{
    klast_clear();
    NONNULL(kv);
    CALL_ENGINE(kv, set_budget_locked(kv, device_budget));
}

static int trim_locked(kvvm *kv, size_t keep)
{
    paging_feed_quiesce(kv->pg);
    uint64_t k = keep / kv->cfg.page_size;
    uint32_t n = paging_trim(kv->pg, k > UINT32_MAX ? UINT32_MAX : (uint32_t)k);
    klog_debug("kvvm_trim: %u unused frames released to the driver", n);
    return 0;
}

int kvvm_trim(kvvm *kv, size_t keep_bytes)
{
    klast_clear();
    NONNULL(kv);
    CALL(kv, trim_locked(kv, keep_bytes));
}

/* ---- stats -------------------------------------------------------------------------- */

/* The stats, as one list (mimalloc style): name, expression over c (paging counters). */
#define KVVM_STATS(X)                                                              \
    X(page_size, kv->cfg.page_size) X(pages_device_total, c.pages_total)           \
    X(pages_device_free, c.pages_free) X(pages_host_total, host_slots_total(kv->host)) \
    X(pages_host_free, host_slots_free(kv->host))                                  \
    X(pages_disk_total, d.slots_total) X(pages_disk_free, d.slots_free)            \
    X(pages_inflight, c.pages_inflight)                                            \
    X(maps, c.maps) X(unmaps, c.unmaps) X(cow_copies, c.cow_copies)                \
    X(swap_outs, c.swap_outs) X(swap_ins, c.swap_ins) X(spills, c.spills)             \
    X(unspills, c.unspills)                                                        \
    X(bytes_to_host, c.bytes_to_host) X(bytes_to_device, c.bytes_to_device)        \
    X(bytes_to_disk, c.bytes_to_disk) X(bytes_from_disk, c.bytes_from_disk)        \
    X(checksum_failures, d.checksum_failures) X(io_errors, d.io_errors)            \
    X(reclaim_runs, w.reclaim_runs) X(reclaim_swap_outs, w.reclaim_swap_outs)      \
    X(direct_reclaims, w.direct_reclaims) X(direct_swap_outs, w.direct_swap_outs)  \
    X(direct_reclaim_ns, w.direct_ns) X(pages_orphan, c.orphans)                   \
    X(seqs_nonresident, c.nonresident) X(pages_damaged, c.pages_damaged)          \
    X(frames_created_sync, c.frames_created_sync)                                  \
    X(frames_released, c.frames_released)                                          \
    X(device_bytes_held, c.frames_held * kv->cfg.page_size)                        \
    X(cache_drops, c.cache_drops) X(cache_demotes, c.cache_demotes)                \
    X(pages_discarded, c.pages_discarded)

static void stats_locked(kvvm *kv, struct kvvm_stats *o)
{
    struct paging_counters c;
    struct swap_counters w;
    struct spill_stats d = { 0 };
    paging_disk_reap(kv->pg);
    paging_counters(kv->pg, &c);
    swap_counters(kv->sw, &w);
    if (kv->spill)
        spill_stats_get(kv->spill, &d);
    memset(o, 0, sizeof *o);
    o->size = sizeof *o;
#define X(n, e) o->n = (uint64_t)(e);
    KVVM_STATS(X)
#undef X
}

int kvvm_stats(kvvm *kv, struct kvvm_stats *out)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(out);
    if (out->size < sizeof(size_t) + sizeof(uint64_t))
        return kerr(-EINVAL, "kvvm_stats: out->size %zu is too small; set it to "
                    "sizeof(struct kvvm_stats) (%zu)", out->size, sizeof *out);
    struct kvvm_stats st;
    int rc = enter(kv);
    if (!rc) {
        stats_locked(kv, &st);
        size_t n = out->size < sizeof st ? out->size : sizeof st;
        st.size = out->size;
        memcpy(out, &st, n);
        rc = leave(kv, 0);
    }
    return api_done(__func__, rc);
}

static int stats_json_locked(kvvm *kv, char *buf, size_t len)
{
    struct kvvm_stats st;
    struct paging_counters c;
    size_t pos = 0;
    stats_locked(kv, &st);
    paging_counters(kv->pg, &c);
    json_put(buf, len, &pos, "{\"version\":\"%s\",\"backend\":\"%s\",\"io_engine\":\"%s\","
             "\"spill_direct\":%s,\"stats\":{", kvvm_version(), vmm_backend_name(kv->v),
             kv->spill ? spill_engine_name(kv->spill) : "none",
             kv->spill && spill_direct(kv->spill) ? "true" : "false");
    int first = 1;
#define X(n, e) json_put(buf, len, &pos, "%s\"%s\":%llu", first ? "" : ",", #n, \
                         (unsigned long long)st.n); first = 0;
    KVVM_STATS(X)
#undef X
    json_put(buf, len, &pos, ",\"frames_created\":%llu,\"share_copies\":%llu,"
             "\"deferred_releases\":%llu},\"layout\":{\"granule\":%zu,\"slot_bytes\":%llu,"
             "\"base\":%llu,\"reserved_bytes\":%zu},\"config\":{",
             (unsigned long long)c.frames_created, (unsigned long long)c.share_copies,
             (unsigned long long)c.deferred, vmm_granule(kv->v),
             (unsigned long long)kv->slot_bytes, (unsigned long long)kv->base,
             vmm_reserved_bytes(kv->v));
    config_json(&kv->cfg, buf, len, &pos);
    json_put(buf, len, &pos, "}}");
    if (pos >= len) {
        buf[len - 1] = 0;
        klast_set("kvvm_stats_json: buf of %zu bytes is too small; %zu are needed", len,
                  pos + 1);
        return -ENOSPC;
    }
    return 0;
}

int kvvm_stats_json(kvvm *kv, char *buf, size_t len)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(buf);
    if (!len)
        return kerr(-EINVAL, "kvvm_stats_json: len is 0");
    CALL(kv, stats_json_locked(kv, buf, len));
}

/* ---- names -------------------------------------------------------------------------- */

const char *kvvm_backend_name(kvvm *kv)
{
    return kv ? vmm_backend_name(kv->v) : "none";
}

/* The errno's name, for messages ("-ENOENT"). */
static const char *err_name(int err)
{
    switch (err < 0 ? -err : err) {
#define N(e) case e: return "-" #e;
    N(EINVAL) N(ENOENT) N(E2BIG) N(ENOSPC) N(ENOMEM) N(EBADMSG) N(EIO) N(ENODEV) N(EBUSY)
    N(EOPNOTSUPP) N(EUCLEAN) N(ENOTDIR) N(EACCES) N(EPERM) N(EROFS) N(ENAMETOOLONG)
    N(ELOOP) N(EDQUOT) N(EFBIG) N(EMFILE) N(ENFILE) N(EAGAIN) N(ENOSYS)
#undef N
    }
    return "error";
}

/* Describes the errno itself, for every call that can return it (docs/api.md lists which
   call returns which); kvvm_last_error() has the reason of the last failure. */
const char *kvvm_strerror(int err)
{
    switch (err < 0 ? -err : err) {
    case 0: return "success";
    case EINVAL: return "invalid argument: a NULL pointer, a region, length or byte range "
                        "outside the sequence, a share target that is not empty, a sequence "
                        "named twice, a stream not of this context, or a bad config field "
                        "(kvvm_last_error() says which)";
    case ENOENT: return "not found: an unknown or freed sequence handle, or a missing file "
                        "or directory (spill_dir)";
    case E2BIG: return "too long: a length past max_tokens";
    case ENOSPC: return "no space: no free sequence slot (max_seqs live sequences), a full "
                        "spill device (spill_budget cannot be reserved), or a JSON buffer "
                        "too small (kvvm_stats_json)";
    case ENOMEM: return "out of memory: no device page can be had (nothing reclaimable), no "
                        "room in the host or disk tier, or host memory or the address "
                        "reservation could not be had";
    case EBADMSG: return "data lost: this sequence's disk copy failed its checksum or could "
                         "not be read";
    case EIO: return "I/O error: the context is dead (a sticky driver error or an "
                     "unrecoverable fault; every later call fails, close it), or a disk "
                     "write or read of the spill file failed";
    case ENODEV: return "no usable CUDA device (no driver, no GPU, or a device ordinal out "
                        "of range)";
    case EBUSY: return "busy: the engine stream is capturing a CUDA graph (calls that "
                       "would enqueue on it are refused until the capture ends), or the "
                       "stream to destroy is the engine stream now";
    case EOPNOTSUPP: return "not supported: the I/O engine asked for (KVVM_IO_ENGINE) or a "
                            "file system feature the spill file needs is unavailable";
    case EUCLEAN: return "an internal invariant does not hold (a libkvvm bug: please report "
                         "it)";
    case ENOTDIR: return "not a directory: spill_dir, or a component of its path, is not a "
                         "directory";
    case EACCES: return "permission denied: this process may not create the spill file in "
                        "spill_dir";
    case EPERM: return "operation not permitted: this process may not create or reserve "
                       "the spill file in spill_dir";
    case EROFS: return "read-only file system: spill_dir is on a read-only mount";
    case ENAMETOOLONG: return "file name too long: spill_dir's path";
    case EDQUOT: return "disk quota exceeded: spill_budget cannot be reserved in spill_dir";
    case EFBIG: return "file too large: spill_budget exceeds what spill_dir's file system "
                       "allows in one file";
    }
    return strerror(err < 0 ? -err : err);
}

