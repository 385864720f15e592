/*
 * vmm/emu/device.c: the driver itself: cuInit, devices, primary contexts, the emulated
 * device's creation and destruction, its counters, and the driver table.
 * (Contract of the emulated device: vmm/emu/emu.h; internals: vmm/emu/emu_int.h.)
 */
#include "emu_int.h"

#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- init, devices, contexts -------------------------------------------------------- */

kcu_result emu_cuInit(unsigned int flags)
{
    BEGIN(cuInit, 0);
    if (flags != 0) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    emu.inited = true;
    emu_fork_watch();
out:
    return emu_leave(r);
}

kcu_result emu_cuDriverGetVersion(int *version)
{
    BEGIN(cuDriverGetVersion, 0);
    if (!version)
        r = KCU_ERROR_INVALID_VALUE;
    else
        *version = EMU_DRIVER_VERSION;
out:
    return emu_leave(r);
}

kcu_result emu_cuDeviceGetCount(int *count)
{
    BEGIN(cuDeviceGetCount, F_INIT);
    if (!count) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    int n = 0;
    for (int i = 0; i < EMU_MAX_DEVICES; i++)
        n += emu.devs[i] != NULL;
    *count = n;
out:
    return emu_leave(r);
}

kcu_result emu_cuDeviceGet(kcu_device *dev, int ordinal)
{
    BEGIN(cuDeviceGet, F_INIT);
    if (!dev)
        r = KCU_ERROR_INVALID_VALUE;
    else if (!emu_dev_get_locked(ordinal))
        r = KCU_ERROR_INVALID_DEVICE;
    else
        *dev = ordinal;
out:
    return emu_leave(r);
}

/* Only the VMM attribute is emulated; any other attribute is KCU_ERROR_INVALID_VALUE (the
   driver's code for an unknown attribute), so a caller relying on more fails loudly. */
kcu_result emu_cuDeviceGetAttribute(int *pi, int attrib, kcu_device dev)
{
    BEGIN(cuDeviceGetAttribute, F_INIT);
    if (pi && !emu_dev_get_locked(dev))
        r = KCU_ERROR_INVALID_DEVICE;
    else if (!pi || attrib != KCU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)
        r = KCU_ERROR_INVALID_VALUE;
    else
        *pi = 1;
out:
    return emu_leave(r);
}

kcu_result emu_cuDeviceGetName(char *name, int len, kcu_device dev)
{
    BEGIN(cuDeviceGetName, F_INIT);
    if (!name || len <= 0)
        r = KCU_ERROR_INVALID_VALUE;
    else if (!emu_dev_get_locked(dev))
        r = KCU_ERROR_INVALID_DEVICE;
    else
        snprintf(name, (size_t)len, "%s", EMU_DEVICE_NAME);
out:
    return emu_leave(r);
}

kcu_result emu_cuDeviceTotalMem(size_t *bytes, kcu_device dev)
{
    BEGIN(cuDeviceTotalMem, F_INIT);
    struct emu_dev *d = emu_dev_get_locked(dev);
    if (!bytes)
        r = KCU_ERROR_INVALID_VALUE;
    else if (!d)
        r = KCU_ERROR_INVALID_DEVICE;
    else
        *bytes = d->capacity;
out:
    return emu_leave(r);
}

/* free = capacity - bytes of live handles - bytes held by others (never below 0). */
kcu_result emu_cuMemGetInfo(size_t *free_bytes, size_t *total)
{
    BEGIN(cuMemGetInfo, F_INIT | F_CTX | F_STICKY);
    if (!free_bytes || !total) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    emu_share_reap_locked(cur);
    size_t used = (size_t)cur->c.handle_bytes + cur->held;
    *free_bytes = used < cur->capacity ? cur->capacity - used : 0;
    *total = cur->capacity;
out:
    return emu_leave(r);
}

int emu_device_set_held(int ordinal, size_t bytes)
{
    pthread_mutex_lock(&emu.lock);
    struct emu_dev *d = emu_dev_get_locked(ordinal);
    if (d)
        d->held = bytes;
    pthread_mutex_unlock(&emu.lock);
    return d ? 0 : -ENODEV;
}

/* KVVM_EMU_HELD: bytes with an optional K/M/G/T suffix; malformed: logged, 0. */
static size_t env_held(void)
{
    const char *e = getenv("KVVM_EMU_HELD");
    if (!e || !*e)
        return 0;
    char *end;
    unsigned long long v = strtoull(e, &end, 10);
    int shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    case 't': case 'T': shift = 40; end++; break;
    default: break;
    }
    if (*end || end == e) {
        klog_error("KVVM_EMU_HELD=%s is not a size; holding nothing", e);
        return 0;
    }
    return (size_t)(v << shift);
}

kcu_result emu_cuDevicePrimaryCtxRetain(kcu_context *ctx, kcu_device dev)
{
    BEGIN(cuDevicePrimaryCtxRetain, F_INIT);
    struct emu_dev *d = emu_dev_get_locked(dev);
    if (!ctx)
        r = KCU_ERROR_INVALID_VALUE;
    else if (!d)
        r = KCU_ERROR_INVALID_DEVICE;
    else {
        d->ctx_refs++;
        *ctx = &emu.ctx[dev];
    }
out:
    return emu_leave(r);
}

/* Releasing more often than retained: KCU_ERROR_INVALID_CONTEXT. The device's objects stay
   (emu_device_destroy accounts for them). */
kcu_result emu_cuDevicePrimaryCtxRelease(kcu_device dev)
{
    BEGIN(cuDevicePrimaryCtxRelease, F_INIT);
    struct emu_dev *d = emu_dev_get_locked(dev);
    if (!d)
        r = KCU_ERROR_INVALID_DEVICE;
    else if (d->ctx_refs <= 0)
        r = KCU_ERROR_INVALID_CONTEXT;
    else
        d->ctx_refs--;
out:
    return emu_leave(r);
}

kcu_result emu_cuCtxSetCurrent(kcu_context ctx)
{
    BEGIN(cuCtxSetCurrent, F_INIT);
    if (!ctx) {
        emu_t.ctx = NULL;
        goto out;
    }
    for (int i = 0; i < EMU_MAX_DEVICES; i++) {
        if (ctx == &emu.ctx[i] && emu.devs[i] && emu.devs[i]->ctx_refs > 0) {
            emu_t.ctx = ctx;
            emu_t.ctx_gen = ctx->gen;
            goto out;
        }
    }
    r = KCU_ERROR_INVALID_CONTEXT;
out:
    return emu_leave(r);
}

kcu_result emu_cuCtxGetCurrent(kcu_context *ctx)
{
    BEGIN(cuCtxGetCurrent, F_INIT);
    if (!ctx)
        r = KCU_ERROR_INVALID_VALUE;
    else
        *ctx = cur ? emu_t.ctx : NULL;
out:
    return emu_leave(r);
}

static size_t default_max_maps(void)
{
    const char *e = getenv("KVVM_EMU_MAX_MAPS");
    if (e && *e) {
        char *end;
        unsigned long long v = strtoull(e, &end, 10);
        if (*end == '\0' && v > 0)
            return (size_t)v;
        klog_error("KVVM_EMU_MAX_MAPS=%s is not a positive number; using the default", e);
    }
    size_t mmc = 65530;
    FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
    if (f) {
        unsigned long long v;
        if (fscanf(f, "%llu", &v) == 1)
            mmc = (size_t)v;
        fclose(f);
    }
    /* Each mapping can split its reservation's VMA (2 VMAs per mapping); keep 4096 VMAs for
       the rest of the process. */
    return mmc > 8192 ? (mmc - 4096) / 2 : mmc / 4;
}


/* ---- the table ---------------------------------------------------------------------- */

static const struct kcu_api emu_table = {
    .name = "emulated",
#define X(n) .n = emu_##n,
    EMU_ENTRIES(X)
#undef X
};

const struct kcu_api *emu_api(void)
{
    return &emu_table;
}

int emu_device_create(const struct emu_device_params *p, int *ordinal)
{
    if (!p || !ordinal)
        return -EINVAL;
    emu_create_cost_read();
    size_t gran = p->granule ? p->granule : (2u << 20);
    if (!is_pow2(gran) || gran < 4096 || gran > (2u << 20) ||
        (size_t)sysconf(_SC_PAGESIZE) > gran)
        return -EINVAL;
    size_t cap = p->capacity / gran * gran;
    if (cap == 0)
        return -EINVAL;
    struct emu_dev *d = calloc(1, sizeof *d);
    if (!d)
        return -ENOMEM;
    d->gran = gran;
    d->capacity = cap;
    d->ngran = cap / gran;
    d->opaque = p->opaque;
    d->held = env_held();
    d->max_maps = p->max_maps ? p->max_maps : default_max_maps();
    /* one allocation: the in-use bitmap, then the not-yet-returned one (memory.c) */
    d->bitmap = calloc(2 * ((d->ngran + 63) / 64), sizeof *d->bitmap);
    if (!d->bitmap)
        goto out_dev;
    d->unpunched = d->bitmap + (d->ngran + 63) / 64;
    d->memfd = memfd_create("kvvm-emu-device", MFD_CLOEXEC);
    if (d->memfd < 0)
        goto out_bitmap;
    if (ftruncate(d->memfd, (off_t)cap) != 0)
        goto out_fd;
    d->view = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, d->memfd, 0);
    if (d->view == MAP_FAILED)
        goto out_fd;

    pthread_mutex_lock(&emu.lock);
    if (!emu.env_read) {
        emu.env_read = true;
        emu_fail_env_locked();
    }
    int slot = -1;
    for (int i = 0; i < EMU_MAX_DEVICES && slot < 0; i++)
        if (!emu.devs[i])
            slot = i;
    if (slot < 0) {
        pthread_mutex_unlock(&emu.lock);
        munmap(d->view, cap);
        goto out_fd;
    }
    d->ordinal = slot;
    emu.devs[slot] = d;
    pthread_mutex_unlock(&emu.lock);
    *ordinal = slot;
    return 0;

out_fd:
    close(d->memfd);
out_bitmap:
    free(d->bitmap);
out_dev:
    free(d);
    return -ENOMEM;
}

/* Stops d's streams: live ones are leaks (their workers finish their queues first: they may
   touch our memory), destroyed ones drain (paused ones are resumed), the legacy stream's
   worker last (not a handle). Returns the leaks. */
static int destroy_streams_locked(struct emu_dev *d)
{
    int leaks = 0;
    for (;;) {
        struct kcu_stream_st *s = emu.streams;
        while (s && (s->dev != d || s->dying || s->legacy))
            s = s->next;
        if (!s)
            break;
        klog_error("emulated device %d: leaked stream %p", d->ordinal, (void *)s);
        leaks++;
        s->dying = true;
        emu_stream_teardown_locked(s);
    }
    for (;;) {
        bool any = false;
        for (struct kcu_stream_st *s = emu.streams; s; s = s->next)
            if (s->dev == d && s->detached) {
                any = true;
                s->paused = false;
                pthread_cond_signal(&s->cv);
            }
        if (!any)
            break;
        pthread_cond_wait(&emu.cond, &emu.lock);
    }
    if (d->legacy) {
        struct kcu_stream_st *s = d->legacy;
        d->legacy = NULL;
        s->dying = true;
        emu_stream_teardown_locked(s);
    }
    return leaks;
}

static int destroy_events_locked(struct emu_dev *d)
{
    int leaks = 0;
    for (struct kcu_event_st *ev = emu.events, *next; ev; ev = next) {
        next = ev->next;                /* saved before ev may be freed */
        if (ev->dev != d)
            continue;
        klog_error("emulated device %d: leaked event %p", d->ordinal, (void *)ev);
        leaks++;
        emu_event_unlink_locked(ev);
        emu_event_put_locked(ev);
    }
    return leaks;
}

/* Removes the mappings of d's memory, wherever they are, then d's reservations (with the
   mappings of other devices' memory inside them). Returns the leaks. */
static int destroy_maps_locked(struct emu_dev *d)
{
    int leaks = 0;
    for (size_t k = 0; k < emu.nresv; k++) {
        struct emu_resv *rv = emu.resvs[k];
        for (size_t i = 0; i < rv->ngran; i++) {
            struct emu_ent *e = emu_ent_get(rv, i);
            if (!e || !e->h1 || emu.handles[e->h1 - 1].dev != d)
                continue;
            size_t j = i;
            while (j < rv->ngran && emu_ent_map_id(rv, j) == e->map_id)
                j++;
            klog_error("emulated device %d: leaked mapping of %zu bytes at 0x%lx", d->ordinal,
                       (j - i) * rv->gran, (unsigned long)(rv->base + i * rv->gran));
            leaks++;
            if (mmap((void *)(rv->base + i * rv->gran), (j - i) * rv->gran, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) ==
                MAP_FAILED)
                klog_error("emulated device %d: the leaked range stays mapped (%d)",
                           d->ordinal, errno);
            emu_unmap_entries_locked(rv, i, j - i);
            i = j - 1;
        }
    }
    for (size_t k = 0; k < emu.nresv;) {
        struct emu_resv *rv = emu.resvs[k];
        if (rv->owner != d) {
            k++;
            continue;
        }
        klog_error("emulated device %d: leaked reservation of %zu bytes at 0x%lx", d->ordinal,
                   rv->size, (unsigned long)rv->base);
        leaks++;
        emu_unmap_entries_locked(rv, 0, rv->ngran);
        munmap((void *)rv->base, rv->size);
        emu_resv_remove_locked(rv);
        emu_resv_free_mem(rv);
    }
    return leaks;
}

/* Frees d's handles and pinned host ranges. Returns the leaks. */
static int destroy_memory_locked(struct emu_dev *d)
{
    int leaks = 0;
    for (size_t i = 0; i < emu.handles_cap; i++) {
        if (emu.handles[i].dev != d)
            continue;
        if (!emu.handles[i].lingering) {   /* a lingering one was released: no leak */
            klog_error("emulated device %d: leaked %shandle of %zu bytes", d->ordinal,
                       emu.handles[i].kind == EMU_H_IMPORTED ? "imported " : "",
                       emu.handles[i].ngran * d->gran);
            leaks++;
        }
        emu.handles[i].released = true;
        emu_handle_free_now_locked(i);
    }
    for (struct emu_host *h = emu.hosts, *next; h; h = next) {
        next = h->next;
        if (h->dev != d)
            continue;
        klog_error("emulated device %d: leaked pinned host range of %zu bytes at %p (%s)",
                   d->ordinal, h->n, (void *)h->p, h->alloc ? "cuMemAllocHost" :
                   "cuMemHostRegister");
        leaks++;
        emu_host_remove_locked(h);
        emu_host_release_locked(h);
    }
    return leaks;
}

int emu_device_destroy(int ordinal)
{
    pthread_mutex_lock(&emu.lock);
    struct emu_dev *d = emu_dev_get_locked(ordinal);
    if (!d) {
        pthread_mutex_unlock(&emu.lock);
        return -ENODEV;
    }
    int leaks = 0;
    if (d->ctx_refs > 0) {
        /* Counted as one leak; threads that still have it current lose it (gen bump). */
        klog_error("emulated device %d: leaked %d primary context retain(s)", ordinal,
                   d->ctx_refs);
        leaks++;
        d->ctx_refs = 0;
    }
    leaks += destroy_streams_locked(d);
    leaks += destroy_events_locked(d);
    leaks += destroy_maps_locked(d);
    leaks += destroy_memory_locked(d);
    emu.devs[ordinal] = NULL;
    emu.ctx[ordinal].gen++;
    pthread_cond_broadcast(&emu.cond);
    pthread_mutex_unlock(&emu.lock);
    munmap(d->view, d->capacity);
    close(d->memfd);
    free(d->bitmap);
    free(d);
    return leaks;
}

int emu_counters_get(int ordinal, struct emu_counters *out)
{
    if (!out)
        return -EINVAL;
    pthread_mutex_lock(&emu.lock);
    struct emu_dev *d = emu_dev_get_locked(ordinal);
    if (d) {
        emu_share_reap_locked(d);
        *out = d->c;
    }
    pthread_mutex_unlock(&emu.lock);
    return d ? 0 : -ENODEV;
}

/* ---- the backend face (vmm/drv_emu.h) ---------------------------------------------------- */

static int debug_objects(int ordinal, uint64_t *handles, uint64_t *handle_bytes,
                         uint64_t *mapped_bytes)
{
    struct emu_counters c;
    int rc = emu_counters_get(ordinal, &c);
    if (rc)
        return rc;
    *handles = c.handles + c.imported;             /* this process's live handles */
    *handle_bytes = c.handle_bytes + c.imported_bytes;
    *mapped_bytes = c.mapped_bytes;
    return 0;
}

static const struct kcu_debug emu_debug = {
    .mapping = emu_lookup,
    .objects = debug_objects,
    .import_take = emu_import_take,
};

int drv_emu_open(const struct drv_emu_params *p, const struct kcu_api **api,
                 const struct kcu_debug **dbg, int *ordinal)
{
    if (!p || !api || !dbg)
        return -EINVAL;
    struct emu_device_params ep = {
        .capacity = p->capacity,
        .granule = p->granule,
        .opaque = p->opaque,
    };
    int rc = emu_device_create(&ep, ordinal);
    if (rc)
        return rc;
    *api = &emu_table;
    *dbg = &emu_debug;
    return 0;
}

int drv_emu_close(int ordinal)
{
    return emu_device_destroy(ordinal);
}
