/*
 * vmm/vmm.c: device virtual memory over the driver table (contract in vmm.h).
 *
 * Design notes
 *  - Backend choice (docs/api.md "Backend choice"): AUTO asks drv_cuda_load(); only its "no CUDA
 *    here" answer (-ENOENT) falls back to a fresh emulated device, and says so in the log.
 *    Any other CUDA failure is -ENODEV: a GPU machine must never run silently emulated.
 *  - Context: the device's primary context, retained for the vmm's life. Driver calls use
 *    the calling thread's current context, so every entry point makes ours current first:
 *    it asks the driver for the current context each time (cuCtxGetCurrent, a thread-local
 *    read in the driver) and sets ours only when it differs; nothing is cached here, since
 *    the engine may switch devices on the thread between two calls. The first entry
 *    point of a public call that switches saves the caller's context, and core/ restores
 *    it after the call (vmm_call_begin / vmm_call_end), so libkvvm never leaves its own
 *    context current in the engine's thread, and a call that makes no driver call makes
 *    none for the context either.
 *  - All or nothing: vmm_map_run maps page by page, then one cuMemSetAccess over the run;
 *    a failure at any step unmaps what this call mapped. Nothing else here is multi-step.
 *  - Errors: every driver failure is logged with its entry point and the driver's error
 *    name, and mapped OUT_OF_MEMORY -> -ENOMEM, INVALID_VALUE -> -EINVAL, else -EIO. Sticky
 *    errors (the context is lost: ILLEGAL_ADDRESS and the other device faults) mark the vmm
 *    dead; from then on every call returns -EIO without calling the driver.
 *  - Live object counts (handles, mappings, streams, fences, pinned host memory) are kept so
 *    vmm_close can log what the caller leaked, on the real driver as on the emulated one.
 */
#include "vmm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/assert.h"
#include "common/log.h"
#include "drv_cuda.h"
#include "drv_emu.h"
#include "spares.h"
#include "vmm_int.h"

void vmm_count(int64_t *c, int64_t d)
{
    int64_t now = __atomic_add_fetch(c, d, __ATOMIC_RELAXED);
    KVVM_ASSERT(now >= 0);            /* a release counted once, after its create */
    (void)now;                        /* read only by the debug build's assert */
}

/* --- errors ------------------------------------------------------------------------------ */

/* Errors after which the context is unusable (cuda.h documents them as leaving the process
   in an inconsistent state; the context must be destroyed). */
static bool sticky(kcu_result r)
{
    switch (r) {
    case KCU_ERROR_ILLEGAL_ADDRESS:
    case KCU_ERROR_ECC_UNCORRECTABLE:
    case KCU_ERROR_LAUNCH_TIMEOUT:
    case KCU_ERROR_HARDWARE_STACK_ERROR:
    case KCU_ERROR_ILLEGAL_INSTRUCTION:
    case KCU_ERROR_MISALIGNED_ADDRESS:
    case KCU_ERROR_INVALID_ADDRESS_SPACE:
    case KCU_ERROR_INVALID_PC:
    case KCU_ERROR_LAUNCH_FAILED:
    case KCU_ERROR_ASSERT:
    case KCU_ERROR_CONTAINED:
    case KCU_ERROR_TENSOR_MEMORY_LEAK:
    case KCU_ERROR_MPS_CLIENT_TERMINATED:
    case KCU_ERROR_EXTERNAL_DEVICE:
    case KCU_ERROR_CONTEXT_IS_DESTROYED:   /* e.g. the engine reset the device: every */
    case KCU_ERROR_DEINITIALIZED:          /* handle and mapping of ours is gone       */
        return true;
    default:
        return false;
    }
}

/* Logs a failed driver call at level (a sticky error always as an error) and returns its
   errno. */
static int drv_err_at(struct vmm *v, const char *entry, kcu_result r, int level)
{
    if (sticky(r) && !__atomic_exchange_n(&v->dead, 1, __ATOMIC_ACQ_REL))
        klog_error("%s: %s; the device context is lost, every later call fails with EIO",
                   entry, kcu_errstr(v->api, r));
    else
        klog(sticky(r) ? KVVM_LOG_ERROR : level, "%s: %s", entry, kcu_errstr(v->api, r));
    KVVM_ASSERT(r != KCU_SUCCESS);   /* only a failed call is reported */
    switch (r) {
    case KCU_ERROR_OUT_OF_MEMORY: return -ENOMEM;
    case KCU_ERROR_INVALID_VALUE: return -EINVAL;
    /* a call a graph capture forbids (one the caller could not see coming, e.g. a device
       synchronization while an engine's own non-blocking stream captures): the context is
       alive, so not -EIO ("dead"); the capture is invalidated by the driver */
    case KCU_ERROR_STREAM_CAPTURE_UNSUPPORTED:
    case KCU_ERROR_STREAM_CAPTURE_ISOLATION:
    case KCU_ERROR_STREAM_CAPTURE_IMPLICIT: return -EBUSY;
    default:                      return -EIO;
    }
}

/* Logs a failed driver call as an error and returns its errno. */
static int drv_err(struct vmm *v, const char *entry, kcu_result r)
{
    return drv_err_at(v, entry, r, KVVM_LOG_ERROR);
}
int vmm_drv_fail(struct vmm *v, const char *entry, kcu_result r)
{
    return drv_err_at(v, entry, r, KVVM_LOG_ERROR);
}

bool vmm_dead(const struct vmm *v)
{
    return __atomic_load_n(&v->dead, __ATOMIC_ACQUIRE) != 0;
}

const int *vmm_dead_word(const struct vmm *v)
{
    return &v->dead;
}

int vmm_make_current(struct vmm *v)
{
    if (vmm_dead(v))
        return -EIO;
    kcu_result r = v->api->cuCtxSetCurrent(v->ctx);
    if (r != KCU_SUCCESS)
        return drv_err(v, "cuCtxSetCurrent", r);
    return 0;
}

int vmm_thread_capture_relaxed(struct vmm *v)
{
    int mode = KCU_STREAM_CAPTURE_MODE_RELAXED;
    kcu_result r = v->api->cuThreadExchangeStreamCaptureMode(&mode);
    return r == KCU_SUCCESS ? 0 : drv_err(v, "cuThreadExchangeStreamCaptureMode", r);
}

/* The public call running on this thread (vmm_call_begin .. vmm_call_end): armed, and the
   caller's context once an entry point replaced it. initial-exec: a few bytes of static
   TLS, read without a __tls_get_addr call on the engine's hot path. A cache line of its
   own: where the TLS block's layout put it across a line (a TLS variable added elsewhere),
   every public call making a driver call cost ~30 ns more (kvvm-bench paging: an idle
   kvvm_step 91 -> 122 ns, kvvm_stats 145 -> 180 ns). */
static __thread struct {
    bool armed, saved;
    kcu_context prev;
} call_ctx __attribute__((tls_model("initial-exec"), aligned(64)));

void vmm_call_begin(void)
{
    call_ctx.armed = true;
    call_ctx.saved = false;
}

void vmm_call_end(struct vmm *v)
{
    if (call_ctx.saved)
        (void)v->api->cuCtxSetCurrent(call_ctx.prev);
    call_ctx.armed = call_ctx.saved = false;
}

/* The entry of every call: dead check, then our context current on this thread. The
   current context is asked of the driver each time (a thread-local read in the driver):
   the engine may have switched devices on this thread since our last call, and a cached
   answer would then run our copies in its context. */
int vmm_enter(struct vmm *v)
{
    if (vmm_dead(v))
        return -EIO;
    kcu_context cur = NULL;
    kcu_result r = v->api->cuCtxGetCurrent(&cur);
    if (r != KCU_SUCCESS)
        return drv_err(v, "cuCtxGetCurrent", r);
    if (cur == v->ctx)
        return 0;
    if (call_ctx.armed && !call_ctx.saved) {
        call_ctx.prev = cur;
        call_ctx.saved = true;
    }
    return vmm_make_current(v);
}

/* The entry of the release calls (void: nothing to report): a dead context has nothing
   left to release; otherwise a failure to make our context current does not stop the
   release from being attempted (the driver says whether it worked), so a transient error
   there cannot leak the object. */
static int enter_release(struct vmm *v)
{
    if (vmm_dead(v))
        return -EIO;
    (void)vmm_enter(v);
    return 0;
}

int vmm_ctx_save(struct vmm *v, kcu_context *prev)
{
    *prev = NULL;
    kcu_result r = v->api->cuCtxGetCurrent(prev);
    return r == KCU_SUCCESS ? 0 : drv_err(v, "cuCtxGetCurrent", r);
}

void vmm_ctx_restore(struct vmm *v, kcu_context prev)
{
    kcu_context cur = NULL;
    if (v->api->cuCtxGetCurrent(&cur) == KCU_SUCCESS && cur != prev)
        v->api->cuCtxSetCurrent(prev);
}

#define ENTER(v)                        \
    do {                                \
        int enter_err_ = vmm_enter(v);  \
        if (enter_err_)                 \
            return enter_err_;          \
    } while (0)

/* --- open / close ------------------------------------------------------------------------ */

static void alloc_prop(const struct vmm *v, struct kcu_mem_alloc_prop *prop)
{
    memset(prop, 0, sizeof *prop);
    prop->type = KCU_MEM_ALLOCATION_TYPE_PINNED;
    prop->requestedHandleTypes = v->shareable ? KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                                              : KCU_MEM_HANDLE_TYPE_NONE;
    prop->location.type = KCU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = v->dev;
}

/* A driver failure while opening: the device is unusable (-ENODEV), unless memory ran out. */
static int open_err(struct vmm *v, const char *entry, kcu_result r)
{
    const char *hint = r == KCU_ERROR_NOT_INITIALIZED && !strcmp(entry, "cuInit")
        ? ": is this a fork() child of a process that used the driver? The CUDA driver "
          "refuses such a child; fork before the first kvvm_open, or start the process with "
          "exec (posix_spawn)" : "";
    klog_error("%s backend: %s failed: %s%s", v->api->name, entry, kcu_errstr(v->api, r),
               hint);
    return r == KCU_ERROR_OUT_OF_MEMORY ? -ENOMEM : -ENODEV;
}

static int pick_backend(const struct vmm_params *p, struct vmm *v)
{
    char why[512];
    int err;

    if (p->backend == KVVM_BACKEND_CUDA || p->backend == KVVM_BACKEND_AUTO) {
        err = drv_cuda_load(&v->api, why, sizeof why);
        if (!err)
            return 0;
        if (p->backend == KVVM_BACKEND_CUDA) {
            klog_error("backend cuda requested but not usable: %s", why);
            return -ENODEV;
        }
        if (err != -ENOENT) {
            klog_error("backend auto: the CUDA driver is present but not usable (%s); "
                       "refusing to fall back to the emulated device", why);
            return -ENODEV;
        }
        klog_warn("backend auto: %s; using the emulated device", why);
    }

    struct drv_emu_params ep = {
        .capacity = p->emu_capacity,
        .granule = p->emu_granule,
        .opaque = p->emu_opaque,
    };
    err = drv_emu_open(&ep, &v->api, &v->dbg, &v->emu_ordinal);
    if (err) {
        klog_error("emulated device: cannot create (capacity %zu, granule %zu): %s",
                   p->emu_capacity, p->emu_granule, strerror(-err));
        v->emu_ordinal = -1;
        v->api = NULL;
        v->dbg = NULL;
        return err;
    }
    return 0;
}

/* Whether one cuMemUnmap may cover several adjacent mappings: libkvvm unmaps runs of pages
   that way, and the driver documentation does not state it ("the entire contiguous address
   range that was mapped"). Probed once at open on the CUDA backend (the emulated device
   allows it, its documented rule): two one-granule handles mapped side by side in a scratch
   reservation, one cuMemUnmap over both. A refusal, or a probe that cannot be set up (the
   device full), selects one cuMemUnmap per mapping in vmm_unmap, logged at info. 0, or
   -EIO the context is lost. */
static int probe_unmap_span(struct vmm *v)
{
    const struct kcu_api *a = v->api;
    struct kcu_mem_alloc_prop prop;
    alloc_prop(v, &prop);
    size_t g = v->granule;
    kcu_deviceptr va = 0;
    kcu_mem_handle h[2] = { 0, 0 };
    int made = 0, mapped = 0;
    const char *what = "cuMemAddressReserve";
    kcu_result r = a->cuMemAddressReserve(&va, 2 * g, g, 0, 0);
    for (; !r && made < 2; made += !r)
        r = a->cuMemCreate(&h[made], g, &prop, 0), what = "cuMemCreate";
    for (; !r && mapped < 2; mapped += !r)
        r = a->cuMemMap(va + (size_t)mapped * g, g, 0, h[mapped], 0), what = "cuMemMap";
    if (!r) {
        what = "cuMemUnmap";
        r = a->cuMemUnmap(va, 2 * g);
        if (!r)
            mapped = 0;
    }
    if (r) {
        v->unmap_each = 1;
        klog_info("vmm: one cuMemUnmap over adjacent mappings %s (%s: %s): libkvvm unmaps "
                  "each mapping with its own call", !strcmp(what, "cuMemUnmap")
                  ? "is refused by the driver" : "could not be probed", what,
                  kcu_errstr(a, r));
    } else {
        klog_debug("vmm: the driver unmaps adjacent mappings in one cuMemUnmap");
    }
    while (mapped-- > 0)
        a->cuMemUnmap(va + (size_t)mapped * g, g);
    while (made-- > 0)
        a->cuMemRelease(h[made]);
    if (va)
        a->cuMemAddressFree(va, 2 * g);
    return sticky(r) ? -EIO : 0;
}

int vmm_open(const struct vmm_params *p, struct vmm **out)
{
    if (!p || !out)
        return -EINVAL;
    if (p->backend != KVVM_BACKEND_AUTO && p->backend != KVVM_BACKEND_CUDA &&
        p->backend != KVVM_BACKEND_EMULATED)
        return -EINVAL;
    struct vmm *v = calloc(1, sizeof *v);
    if (!v)
        return -ENOMEM;
    v->emu_ordinal = -1;
    v->shareable = p->shareable != 0;
    vmm_spares_init(&v->spares);        /* before anything can fail: out_free finis it */

    int err = pick_backend(p, v);
    if (err)
        goto out_free;
    const struct kcu_api *a = v->api;
    int ordinal = v->emu_ordinal >= 0 ? v->emu_ordinal : p->device;

    kcu_result r = a->cuInit(0);
    if (r != KCU_SUCCESS) {
        err = open_err(v, "cuInit", r);
        goto out_emu;
    }
    /* the caller's current context is restored before returning (kvvm.h: no call leaves
       libkvvm's context current in the caller's thread) */
    kcu_context prev = NULL;
    r = a->cuCtxGetCurrent(&prev);
    if (r != KCU_SUCCESS) {
        err = open_err(v, "cuCtxGetCurrent", r);
        goto out_emu;
    }
    int count = 0;
    r = a->cuDeviceGetCount(&count);
    if (r != KCU_SUCCESS) {
        err = open_err(v, "cuDeviceGetCount", r);
        goto out_emu;
    }
    if (ordinal < 0 || ordinal >= count) {
        klog_error("%s backend: device %d does not exist (%d device%s)", a->name, ordinal,
                   count, count == 1 ? "" : "s");
        err = -ENODEV;
        goto out_emu;
    }
    r = a->cuDeviceGet(&v->dev, ordinal);
    if (r != KCU_SUCCESS) {
        err = open_err(v, "cuDeviceGet", r);
        goto out_emu;
    }
    if (a->cuDeviceGetName(v->dev_name, sizeof v->dev_name, v->dev) != KCU_SUCCESS)
        snprintf(v->dev_name, sizeof v->dev_name, "device %d", ordinal);
    int vmm_ok = 0;
    r = a->cuDeviceGetAttribute(&vmm_ok, KCU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                v->dev);
    if (r != KCU_SUCCESS) {
        err = open_err(v, "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)", r);
        goto out_emu;
    }
    if (!vmm_ok) {
        klog_error("%s backend: device %d (%s) does not support the CUDA virtual memory "
                   "management API (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED "
                   "is 0), which libkvvm needs", a->name, ordinal, v->dev_name);
        err = -ENODEV;
        goto out_emu;
    }
    r = a->cuDeviceTotalMem(&v->device_bytes, v->dev);
    if (r != KCU_SUCCESS) {
        err = open_err(v, "cuDeviceTotalMem", r);
        goto out_emu;
    }
    r = a->cuDevicePrimaryCtxRetain(&v->ctx, v->dev);
    if (r != KCU_SUCCESS) {
        err = open_err(v, "cuDevicePrimaryCtxRetain", r);
        goto out_emu;
    }
    r = a->cuCtxSetCurrent(v->ctx);
    if (r != KCU_SUCCESS) {
        err = open_err(v, "cuCtxSetCurrent", r);
        goto out_release_ctx;
    }
    struct kcu_mem_alloc_prop prop;
    alloc_prop(v, &prop);
    r = a->cuMemGetAllocationGranularity(&v->granule, &prop, KCU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r != KCU_SUCCESS) {
        err = open_err(v, "cuMemGetAllocationGranularity", r);
        goto out_release_ctx;
    }
    if (!v->granule || (v->granule & (v->granule - 1))) {
        klog_error("%s backend: granularity %zu is not a power of two", a->name, v->granule);
        err = -ENODEV;
        goto out_release_ctx;
    }
    char sz[32], gr[32];
    klog_info("vmm: %s backend, device %d (%s), %s, granule %s", a->name, ordinal,
              v->dev_name, kfmt_size(v->device_bytes, sz, sizeof sz),
              kfmt_size(v->granule, gr, sizeof gr));
    if (v->emu_ordinal < 0 && (err = probe_unmap_span(v)))
        goto out_release_ctx;
    if (prev != v->ctx && (r = a->cuCtxSetCurrent(prev)) != KCU_SUCCESS) {
        err = open_err(v, "cuCtxSetCurrent (the caller's context back)", r);
        goto out_release_ctx;
    }
    *out = v;
    return 0;

out_release_ctx:
    a->cuCtxSetCurrent(prev);
    a->cuDevicePrimaryCtxRelease(v->dev);
out_emu:
    if (v->emu_ordinal >= 0)
        drv_emu_close(v->emu_ordinal);
out_free:
    vmm_spares_fini(&v->spares);
    free(v);
    return err;
}

void vmm_close(struct vmm *v)
{
    if (!v)
        return;
    kcu_context prev = NULL;
    if (v->api->cuCtxGetCurrent(&prev) != KCU_SUCCESS)
        prev = NULL;
    vmm_close_to(v, prev);
}

void vmm_close_to(struct vmm *v, kcu_context prev)
{
    if (!v)
        return;
    const struct kcu_api *a = v->api;
    bool ctx_ok = !vmm_dead(v) && !vmm_enter(v);
    if (ctx_ok) {
        kcu_result r = a->cuCtxSynchronize();
        if (r != KCU_SUCCESS)
            drv_err(v, "cuCtxSynchronize", r);
    }
    vmm_spares_drain(v, &v->spares);    /* ours, not the caller's leaks */
    if (v->n_handles || v->n_mapped_bytes || v->n_streams || v->n_fences ||
        v->n_host_allocs || v->n_host_regs)
        klog_warn("vmm_close: the caller leaked %lld physical handle(s), %lld mapped "
                  "byte(s), %lld stream(s), %lld fence(s), %lld pinned allocation(s), "
                  "%lld registered host range(s)",
                  (long long)v->n_handles, (long long)v->n_mapped_bytes,
                  (long long)v->n_streams, (long long)v->n_fences,
                  (long long)v->n_host_allocs, (long long)v->n_host_regs);
    if (v->base && ctx_ok)
        vmm_unreserve(v);
    /* the caller's context back (ours only if it was the caller's: a primary context is
       shared with the runtime API; cuDevicePrimaryCtxRelease never pops it) */
    kcu_context cur = NULL;
    if (a->cuCtxGetCurrent(&cur) == KCU_SUCCESS && cur != prev)
        a->cuCtxSetCurrent(prev);
    kcu_result r = a->cuDevicePrimaryCtxRelease(v->dev);
    if (r != KCU_SUCCESS)
        klog_error("cuDevicePrimaryCtxRelease: %s", kcu_errstr(a, r));
    if (v->emu_ordinal >= 0) {
        int leaks = drv_emu_close(v->emu_ordinal);
        if (leaks > 0)
            klog_warn("vmm_close: the emulated device still held %d object(s)", leaks);
        else if (leaks < 0)
            klog_error("vmm_close: emu_device_destroy: %s", strerror(-leaks));
    }
    KVVM_ASSERT(v->spares.n == 0);   /* drained above: no fence is made after the close */
    vmm_spares_fini(&v->spares);
    free(v);
}

struct vmm_spares *vmm_spares_of(struct vmm *v) { return &v->spares; }
const char *vmm_backend_name(const struct vmm *v) { return v->api->name; }
const struct kcu_api *vmm_api(const struct vmm *v) { return v->api; }
size_t vmm_granule(const struct vmm *v) { return v->granule; }
size_t vmm_device_bytes(const struct vmm *v) { return v->device_bytes; }
int vmm_emu_ordinal(const struct vmm *v) { return v->emu_ordinal; }

/* --- debug view of the driver's tables ----------------------------------------------------- */

int vmm_debug_mapping(const struct vmm *v, uint64_t va, struct vmm_debug_mapping *out)
{
    if (!v->dbg || !v->dbg->mapping)
        return -EOPNOTSUPP;
    kcu_mem_handle h = 0;
    size_t off = 0;
    int acc = 0;
    int rc = v->dbg->mapping((kcu_deviceptr)va, &h, &off, &acc);
    if (!rc && out)
        *out = (struct vmm_debug_mapping){ .h = { h }, .offset = off, .access = acc };
    return rc;
}

int vmm_debug_objects(const struct vmm *v, struct vmm_debug_objects *out)
{
    if (!v->dbg || !v->dbg->objects)
        return -EOPNOTSUPP;
    struct vmm_debug_objects o;
    int rc = v->dbg->objects(v->emu_ordinal, &o.handles, &o.handle_bytes, &o.mapped_bytes);
    if (!rc)
        *out = o;
    return rc;
}
uint64_t vmm_reserved_base(const struct vmm *v) { return v->base; }
size_t vmm_reserved_bytes(const struct vmm *v) { return v->reserved; }

/* --- reservation, physical pages, mappings ------------------------------------------------ */

int vmm_reserve(struct vmm *v, size_t bytes, uint64_t *base)
{
    if (!base || !bytes || v->base)
        return -EINVAL;
    if (bytes > SIZE_MAX - v->granule)
        return -ENOMEM;
    KVVM_ASSERT(!v->reserved);          /* set and cleared with base */
    ENTER(v);
    size_t len = (bytes + v->granule - 1) & ~(v->granule - 1);
    kcu_deviceptr p = 0;
    kcu_result r = v->api->cuMemAddressReserve(&p, len, v->granule, 0, 0);
    if (r != KCU_SUCCESS)
        return drv_err(v, "cuMemAddressReserve", r);
    KVVM_ASSERT(len % v->granule == 0 && len >= bytes);
    v->base = p;
    v->reserved = len;
    *base = p;
    return 0;
}

void vmm_unreserve(struct vmm *v)
{
    if (!v->base || enter_release(v))
        return;
    if (__atomic_load_n(&v->n_mapped_bytes, __ATOMIC_RELAXED))
        klog_warn("vmm_unreserve: %lld byte(s) still mapped",
                  (long long)v->n_mapped_bytes);
    kcu_result r = v->api->cuMemAddressFree(v->base, v->reserved);
    if (r != KCU_SUCCESS) {
        drv_err(v, "cuMemAddressFree", r);
        return;
    }
    v->base = 0;
    v->reserved = 0;
}

/* The device is short of memory below the budget (others hold it): not an error of the
   driver or of the caller, a budget the device cannot honour. Logged once per vmm at info,
   with what the driver says is free; then only counted (vmm_create_ooms). */
static int create_oom(struct vmm *v)
{
    if (__atomic_fetch_add(&v->n_create_oom, 1, __ATOMIC_RELAXED) == 0) {
        size_t fr = 0, tot = 0;
        if (v->api->cuMemGetInfo(&fr, &tot) != KCU_SUCCESS)
            fr = tot = 0;
        char a[32], b[32];
        klog_info("vmm: cuMemCreate: the device is out of memory (%s free of %s): other "
                  "users of the GPU hold the rest of the budget; calls that need new frames "
                  "reclaim or fail with ENOMEM (logged once; counted in the stats' "
                  "create_oom)", kfmt_size(fr, a, sizeof a), kfmt_size(tot, b, sizeof b));
    } else {
        klog_debug("vmm: cuMemCreate: out of memory");
    }
    return -ENOMEM;
}

uint64_t vmm_create_ooms(const struct vmm *v)
{
    return __atomic_load_n(&v->n_create_oom, __ATOMIC_RELAXED);
}

int vmm_mem_info(struct vmm *v, size_t *free_bytes, size_t *total)
{
    if (!free_bytes || !total)
        return -EINVAL;
    ENTER(v);
    kcu_result r = v->api->cuMemGetInfo(free_bytes, total);
    return r == KCU_SUCCESS ? 0 : drv_err(v, "cuMemGetInfo", r);
}

int vmm_phys_create(struct vmm *v, size_t bytes, vmm_handle *out)
{
    if (!out || !bytes || bytes % v->granule)
        return -EINVAL;
    ENTER(v);
    struct kcu_mem_alloc_prop prop;
    alloc_prop(v, &prop);
    kcu_mem_handle h = 0;
    kcu_result r = v->api->cuMemCreate(&h, bytes, &prop, 0);
    if (r == KCU_ERROR_OUT_OF_MEMORY)
        return create_oom(v);
    if (r != KCU_SUCCESS)
        return drv_err(v, "cuMemCreate", r);
    vmm_count(&v->n_handles, 1);
    out->h = h;
    return 0;
}

int vmm_phys_release(struct vmm *v, vmm_handle h)
{
    if (enter_release(v))
        return -EIO;
    kcu_result r = v->api->cuMemRelease(h.h);
    if (r != KCU_SUCCESS) {
        drv_err(v, "cuMemRelease", r);
        return -EIO;
    }
    vmm_count(&v->n_handles, -1);
    return 0;
}

/* [va, va + len) inside the reservation (overflow-safe). */
static bool in_reservation(const struct vmm *v, uint64_t va, size_t len)
{
    return v->base && va >= v->base && va - v->base <= v->reserved &&
           len <= v->reserved - (va - v->base);
}

int vmm_map_run(struct vmm *v, uint64_t va, const vmm_handle *pages, size_t n,
                size_t page_size)
{
    if (!pages || !n || !page_size || page_size % v->granule || n > SIZE_MAX / page_size)
        return -EINVAL;
    size_t len = n * page_size;
    if (!in_reservation(v, va, len) || (va - v->base) % page_size)
        return -EINVAL;
    ENTER(v);
    const struct kcu_api *a = v->api;
    size_t k;
    int err;
    kcu_result r;
    __atomic_store_n(&v->map_unit, page_size, __ATOMIC_RELAXED);
    for (k = 0; k < n; k++) {
        r = a->cuMemMap(va + k * page_size, page_size, 0, pages[k].h, 0);
        if (r != KCU_SUCCESS) {
            err = drv_err(v, "cuMemMap", r);
            goto out_unmap;
        }
    }
    struct kcu_mem_access_desc d = {
        .location = { .type = KCU_MEM_LOCATION_TYPE_DEVICE, .id = v->dev },
        .flags = KCU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    r = a->cuMemSetAccess(va, len, &d, 1);
    if (r != KCU_SUCCESS) {
        err = drv_err(v, "cuMemSetAccess", r);
        goto out_unmap;
    }
    vmm_count(&v->n_mapped_bytes, (int64_t)len);
    return 0;

out_unmap:
    KVVM_ASSERT(err < 0 && k <= n);  /* k: the pages mapped before the failure */
    /* Page by page: an unmap failure must not keep the others mapped. */
    while (k-- > 0) {
        r = a->cuMemUnmap(va + k * page_size, page_size);
        if (r != KCU_SUCCESS) {
            klog_error("vmm_map_run: undo of page %zu at 0x%llx failed; it stays mapped",
                       k, (unsigned long long)(va + k * page_size));
            drv_err(v, "cuMemUnmap", r);
            vmm_count(&v->n_mapped_bytes, (int64_t)page_size);
        }
    }
    return err;
}

int vmm_unmap(struct vmm *v, uint64_t va, size_t bytes)
{
    if (!bytes || bytes % v->granule || (va - v->base) % v->granule ||
        !in_reservation(v, va, bytes))
        return -EINVAL;
    ENTER(v);
    size_t unit = __atomic_load_n(&v->map_unit, __ATOMIC_RELAXED);
    KVVM_ASSERT(unit % v->granule == 0); /* a page size vmm_map_run accepted */
    if (v->unmap_each && unit && bytes > unit && bytes % unit == 0) {
        /* one call per mapping (probe_unmap_span); a failure leaves the mappings after it
           mapped, those before unmapped (counted) */
        for (size_t off = 0; off < bytes; off += unit) {
            kcu_result r = v->api->cuMemUnmap(va + off, unit);
            if (r != KCU_SUCCESS)
                return drv_err(v, "cuMemUnmap", r);
            vmm_count(&v->n_mapped_bytes, -(int64_t)unit);
        }
        return 0;
    }
    kcu_result r = v->api->cuMemUnmap(va, bytes);
    if (r != KCU_SUCCESS)
        return drv_err(v, "cuMemUnmap", r);
    vmm_count(&v->n_mapped_bytes, -(int64_t)bytes);
    return 0;
}

bool vmm_unmaps_each(const struct vmm *v)
{
    return v->unmap_each != 0;
}

/* --- streams, fences ---------------------------------------------------------------------- */

int vmm_stream_create(struct vmm *v, kcu_stream *out)
{
    if (!out)
        return -EINVAL;
    ENTER(v);
    kcu_result r = v->api->cuStreamCreate(out, KCU_STREAM_NON_BLOCKING);
    if (r != KCU_SUCCESS)
        return drv_err(v, "cuStreamCreate", r);
    vmm_count(&v->n_streams, 1);
    return 0;
}

int vmm_stream_destroy(struct vmm *v, kcu_stream s)
{
    if (!s)
        return -EINVAL;
    ENTER(v);
    kcu_result r = v->api->cuStreamDestroy(s);
    if (r != KCU_SUCCESS)
        return drv_err(v, "cuStreamDestroy", r);
    vmm_count(&v->n_streams, -1);
    return 0;
}

int vmm_stream_sync(struct vmm *v, kcu_stream s)
{
    ENTER(v);
    kcu_result r = v->api->cuStreamSynchronize(s);
    return r == KCU_SUCCESS ? 0 : drv_err(v, "cuStreamSynchronize", r);
}

int vmm_stream_check_capture(struct vmm *v, kcu_stream s)
{
    ENTER(v);
    int st = KCU_STREAM_CAPTURE_STATUS_NONE;
    kcu_result r = v->api->cuStreamIsCapturing(s, &st);
    if (r == KCU_ERROR_STREAM_CAPTURE_UNSUPPORTED || r == KCU_ERROR_STREAM_CAPTURE_IMPLICIT)
        return -EBUSY;       /* the legacy stream queried while another stream captures */
    if (r != KCU_SUCCESS)
        return drv_err(v, "cuStreamIsCapturing", r);
    return st == KCU_STREAM_CAPTURE_STATUS_NONE ? 0 : -EBUSY;
}

int vmm_stream_check_owner(struct vmm *v, kcu_stream s)
{
    if (s == KCU_STREAM_PER_THREAD) {
        /* cuda.h, CU_STREAM_PER_THREAD: "an implicit stream with per-thread synchronization
           behavior": each thread that passes the handle gets its own stream, so our threads'
           copies and waits on it would be ordered with nothing the engine enqueues */
        klog_error("vmm: the per-thread default stream (CU_STREAM_PER_THREAD) cannot be the "
                   "engine stream: it is a different stream in each thread; pass the stream "
                   "itself (e.g. one from kvvm_stream_create)");
        return -EINVAL;
    }
    ENTER(v);
    kcu_context c = NULL;
    kcu_result r = v->api->cuStreamGetCtx(s, &c);
    if (r == KCU_ERROR_INVALID_HANDLE || r == KCU_ERROR_INVALID_CONTEXT) {
        klog_error("vmm: stream %p is not a live stream of this process's driver", (void *)s);
        return -EINVAL;
    }
    if (r != KCU_SUCCESS)
        return drv_err(v, "cuStreamGetCtx", r);
    if (c != v->ctx) {
        klog_error("vmm: stream %p belongs to another CUDA context than device %d's primary "
                   "context; libkvvm can only order its work on streams of its own device",
                   (void *)s, v->dev);
        return -EINVAL;
    }
    return 0;
}

int vmm_device_sync(struct vmm *v)
{
    ENTER(v);
    kcu_result r = v->api->cuCtxSynchronize();
    return r == KCU_SUCCESS ? 0 : drv_err(v, "cuCtxSynchronize", r);
}

int vmm_fence_create(struct vmm *v, vmm_fence *f)
{
    return !f ? -EINVAL : vmm_spares_take(&v->spares, f) ? 0 : vmm_fence_new(v, f);
}

int vmm_fence_new(struct vmm *v, vmm_fence *f)
{
    ENTER(v);
    /* Blocking sync: a thread waiting on a fence sleeps instead of spinning a core. */
    kcu_result r = v->api->cuEventCreate(&f->ev, KCU_EVENT_DISABLE_TIMING |
                                                 KCU_EVENT_BLOCKING_SYNC);
    if (r != KCU_SUCCESS)
        return drv_err(v, "cuEventCreate", r);
    vmm_count(&v->n_fences, 1);
    return 0;
}

void vmm_fence_destroy(struct vmm *v, vmm_fence *f)
{
    if (!f || !f->ev || enter_release(v))
        return;
    kcu_result r = v->api->cuEventDestroy(f->ev);
    if (r != KCU_SUCCESS) {
        drv_err(v, "cuEventDestroy", r);
        return;
    }
    f->ev = NULL;
    vmm_count(&v->n_fences, -1);
}

int vmm_fence_record(struct vmm *v, vmm_fence *f, kcu_stream s)
{
    if (!f || !f->ev)
        return -EINVAL;
    ENTER(v);
    kcu_result r = v->api->cuEventRecord(f->ev, s);
    return r == KCU_SUCCESS ? 0 : drv_err(v, "cuEventRecord", r);
}

int vmm_fence_query(struct vmm *v, const vmm_fence *f)
{
    if (!f || !f->ev)
        return -EINVAL;
    ENTER(v);
    kcu_result r = v->api->cuEventQuery(f->ev);
    if (r == KCU_SUCCESS)
        return 1;
    if (r == KCU_ERROR_NOT_READY)
        return 0;
    return drv_err(v, "cuEventQuery", r);
}

int vmm_fence_wait(struct vmm *v, const vmm_fence *f)
{
    if (!f || !f->ev)
        return -EINVAL;
    ENTER(v);
    kcu_result r = v->api->cuEventSynchronize(f->ev);
    return r == KCU_SUCCESS ? 0 : drv_err(v, "cuEventSynchronize", r);
}

int vmm_stream_after(struct vmm *v, kcu_stream s, const vmm_fence *f)
{
    if (!f || !f->ev)
        return -EINVAL;
    ENTER(v);
    kcu_result r = v->api->cuStreamWaitEvent(s, f->ev, 0);
    return r == KCU_SUCCESS ? 0 : drv_err(v, "cuStreamWaitEvent", r);
}

/* --- copies ------------------------------------------------------------------------------- */

int vmm_copy_htod(struct vmm *v, uint64_t dst, const void *src, size_t n, kcu_stream s)
{
    if (!src || !n)
        return -EINVAL;
    ENTER(v);
    kcu_result r = v->api->cuMemcpyHtoDAsync(dst, src, n, s);
    return r == KCU_SUCCESS ? 0 : drv_err(v, "cuMemcpyHtoDAsync", r);
}

int vmm_copy_dtoh(struct vmm *v, void *dst, uint64_t src, size_t n, kcu_stream s)
{
    if (!dst || !n)
        return -EINVAL;
    ENTER(v);
    kcu_result r = v->api->cuMemcpyDtoHAsync(dst, src, n, s);
    return r == KCU_SUCCESS ? 0 : drv_err(v, "cuMemcpyDtoHAsync", r);
}

int vmm_copy_dtod(struct vmm *v, uint64_t dst, uint64_t src, size_t n, kcu_stream s)
{
    if (!n)
        return -EINVAL;
    ENTER(v);
    kcu_result r = v->api->cuMemcpyDtoDAsync(dst, src, n, s);
    return r == KCU_SUCCESS ? 0 : drv_err(v, "cuMemcpyDtoDAsync", r);
}

int vmm_memset(struct vmm *v, uint64_t dst, unsigned char value, size_t n, kcu_stream s)
{
    if (!n)
        return -EINVAL;
    ENTER(v);
    kcu_result r = v->api->cuMemsetD8Async(dst, value, n, s);
    return r == KCU_SUCCESS ? 0 : drv_err(v, "cuMemsetD8Async", r);
}

/* --- pinned host memory -------------------------------------------------------------------- */

int vmm_host_alloc(struct vmm *v, size_t bytes, void **out)
{
    if (!out || !bytes)
        return -EINVAL;
    ENTER(v);
    kcu_result r = v->api->cuMemAllocHost(out, bytes);
    if (r != KCU_SUCCESS)
        return drv_err(v, "cuMemAllocHost", r);
    vmm_count(&v->n_host_allocs, 1);
    return 0;
}

void vmm_host_free(struct vmm *v, void *p)
{
    if (!p || enter_release(v))
        return;
    kcu_result r = v->api->cuMemFreeHost(p);
    if (r != KCU_SUCCESS) {
        drv_err(v, "cuMemFreeHost", r);
        return;
    }
    vmm_count(&v->n_host_allocs, -1);
}

int vmm_host_register(struct vmm *v, void *p, size_t bytes)
{
    if (!p || !bytes)
        return -EINVAL;
    ENTER(v);
    kcu_result r = v->api->cuMemHostRegister(p, bytes, KCU_MEMHOSTREGISTER_PORTABLE);
    if (r != KCU_SUCCESS)   /* a warning: the host arena falls back to pageable memory */
        return drv_err_at(v, "cuMemHostRegister", r, KVVM_LOG_WARN);
    vmm_count(&v->n_host_regs, 1);
    return 0;
}

static int host_type(struct vmm *v, const void *p, unsigned *type)
{
    kcu_result r = v->api->cuPointerGetAttribute(type, KCU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                                 (kcu_deviceptr)(uintptr_t)p);
    if (r == KCU_ERROR_INVALID_VALUE) {
        *type = 0;                  /* memory the driver does not know: pageable */
        return 0;
    }
    return r == KCU_SUCCESS ? 0 : drv_err(v, "cuPointerGetAttribute", r);
}

int vmm_host_pinned(struct vmm *v, const void *p, size_t n)
{
    if (!p || !n)
        return -EINVAL;
    ENTER(v);
    unsigned a = 0, b = 0;
    int rc = host_type(v, p, &a);
    if (!rc && a == KCU_MEMORYTYPE_HOST)
        rc = host_type(v, (const char *)p + n - 1, &b);
    if (rc)
        return rc;
    return a == KCU_MEMORYTYPE_HOST && b == KCU_MEMORYTYPE_HOST;
}

int vmm_ptr_is_device(struct vmm *v, const void *p)
{
    unsigned type = 0;
    if (!p || vmm_enter(v))
        return 0;
    kcu_result r = v->api->cuPointerGetAttribute(&type, KCU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                                 (kcu_deviceptr)(uintptr_t)p);
    return r == KCU_SUCCESS && type == KCU_MEMORYTYPE_DEVICE;
}

void vmm_host_unregister(struct vmm *v, void *p)
{
    if (!p || enter_release(v))
        return;
    kcu_result r = v->api->cuMemHostUnregister(p);
    if (r != KCU_SUCCESS) {
        drv_err(v, "cuMemHostUnregister", r);
        return;
    }
    vmm_count(&v->n_host_regs, -1);
}
