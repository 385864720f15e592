/*
 * vmm/drv_emu.c: the emulated CUDA driver (contract in vmm/emu.h; design in docs/design.md,
 * "The emulated device").
 *
 * Design.
 *  - One process-global driver, like libcuda: devices, handles, reservations, host ranges,
 *    streams and events live in global tables guarded by one mutex, g_lock. Every entry point
 *    runs under it from its prologue (enter()) to its return; the only places that drop it
 *    are condition waits and the copy loop, which releases it between chunks so that a
 *    cuMemUnmap issued while a long copy runs takes effect between chunks (and the copy then
 *    faults, as a GPU would).
 *  - Device memory: one memfd per device plus the emulator's own MAP_SHARED read/write view
 *    of all of it. A physical handle is a contiguous granule range of the memfd (first-fit
 *    bitmap allocator with a next-fit cursor). Copies reach device bytes only through the
 *    view, after translating the device address through the mapping table, so the windows
 *    the caller sees can stay PROT_NONE (opaque mode) and copies still work.
 *  - Virtual memory: a reservation is an anonymous PROT_NONE mapping; each granule of it has
 *    an entry {handle, offset, mapping id, access} (two-level table, blocks allocated on first
 *    map so huge reservations cost nothing). cuMemMap = mmap(MAP_FIXED|MAP_SHARED) of the
 *    handle's memfd range, PROT_NONE until cuMemSetAccess.
 *  - Streams: one worker thread each, executing an in-order queue. The NULL stream is the
 *    legacy default stream: a worker of its own, made at its first use, that runs each op
 *    after the work every blocking stream had queued before it, while a blocking stream's
 *    op waits for the legacy work queued before it (CUDA's implicit synchronization; non-
 *    blocking streams do not synchronize with it, so neither do we). Like any stream it is
 *    asynchronous to the caller: a missing cuStreamSynchronize(NULL) shows up. A caller
 *    that synchronizes runs the ready legacy ops itself (same order, same dependencies), so
 *    a synchronous-mode caller costs no thread hand-off per op.
 *  - Error codes: taken from the driver API reference ("Virtual Memory Management",
 *    "Stream Management", ...). Where the reference lists only generic codes, the code the
 *    reference lists for bad arguments (CUDA_ERROR_INVALID_VALUE) is used and the check says
 *    "undocumented".
 *
 * Lock order: g_lock only (klog takes its own lock inside; it never calls back).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "emu.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/falloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define EMU_MAX_DEVICES   64
#define EMU_DRIVER_VERSION 12080
#define EMU_DEVICE_NAME   "kvvm emulated device"
#define XFER_CHUNK        (1u << 20)   /* bytes copied per lock hold */
#define ENT_BLOCK         4096         /* table entries per second-level block */

/* Access bits needed by a copy; KCU_MEM_ACCESS_FLAGS_PROT_READ = 1, READWRITE = 3. */
#define NEED_R 1
#define NEED_W 2

/* ---- entry points, prologue, fault injection, tracing ------------------------------- */

#define EMU_ENTRIES(X) \
    X(cuInit) X(cuDriverGetVersion) X(cuDeviceGetCount) X(cuDeviceGet) \
    X(cuDeviceGetAttribute) X(cuDeviceGetName) X(cuDeviceTotalMem) \
    X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent) \
    X(cuCtxGetCurrent) X(cuCtxSynchronize) X(cuMemGetAllocationGranularity) \
    X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemCreate) X(cuMemRelease) X(cuMemMap) \
    X(cuMemUnmap) X(cuMemSetAccess) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync) \
    X(cuMemcpyDtoDAsync) X(cuMemsetD8Async) X(cuStreamCreate) X(cuStreamDestroy) \
    X(cuStreamSynchronize) X(cuStreamQuery) X(cuStreamWaitEvent) X(cuStreamIsCapturing) X(cuStreamGetCtx) \
    X(cuThreadExchangeStreamCaptureMode) \
    X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventQuery) \
    X(cuEventSynchronize) X(cuMemHostRegister) X(cuMemHostUnregister) X(cuMemAllocHost) \
    X(cuMemFreeHost) X(cuPointerGetAttribute) X(cuGetErrorString) X(cuGetErrorName)

enum emu_entry {
#define X(n) E_##n,
    EMU_ENTRIES(X)
#undef X
    E_COUNT
};

static const char *const entry_names[E_COUNT] = {
#define X(n) #n,
    EMU_ENTRIES(X)
#undef X
};

struct emu_fault {                 /* one armed failure */
    int entry;
    unsigned long left;            /* calls of entry until it fires (1 = the next one) */
    kcu_result err;
    struct emu_fault *next;
};

/* ---- objects ------------------------------------------------------------------------ */

struct emu_dev {
    int ordinal;
    size_t capacity, gran, ngran;  /* bytes, bytes, granules (capacity = ngran * gran) */
    int opaque;
    size_t max_maps;               /* bound on live mappings of this device's memory */
    int memfd;
    unsigned char *view;           /* the emulator's RW MAP_SHARED view of the whole memfd */
    uint64_t *bitmap;              /* 1 = granule in use */
    size_t cursor;                 /* next-fit start, in granules */
    int ctx_refs;                  /* primary context retains */
    kcu_result sticky;             /* 0, or the fault that killed the device */
    struct kcu_stream_st *legacy;  /* the legacy default stream's worker; NULL until used */
    struct emu_counters c;
};

/* A physical handle: value = (gen << 32) | (slot + 1); never 0. */
struct emu_handle {
    struct emu_dev *dev;           /* NULL = free slot */
    uint32_t gen;                  /* bumped when the slot is freed */
    bool released;                 /* cuMemRelease done; memory lives until maps == 0 */
    size_t base, ngran;            /* granule range in the memfd */
    size_t maps;                   /* live mappings of it */
};

struct emu_ent {                   /* one granule of a reservation */
    uint32_t h1;                   /* handle slot + 1; 0 = unmapped */
    uint32_t access;               /* KCU_MEM_ACCESS_FLAGS_* */
    uint64_t off;                  /* granule index within the handle */
    uint64_t map_id;               /* identifies one cuMemMap call */
};

struct emu_resv {
    struct emu_dev *owner;         /* device whose context reserved it (leak accounting) */
    uintptr_t base;
    size_t size, gran, ngran;
    struct emu_ent **blk;          /* ngran / ENT_BLOCK (+1) blocks, NULL until used */
    uint32_t *blk_used;            /* mapped entries per block */
    size_t nblk;
    size_t live_maps;              /* mappings inside this reservation */
};

struct emu_host {                  /* pinned host range: cuMemAllocHost or cuMemHostRegister */
    struct emu_dev *dev;
    unsigned char *p;
    size_t n;
    bool alloc;                    /* from cuMemAllocHost (we own the pages) */
    bool locked;                   /* mlock succeeded */
    struct emu_host *next;
};

enum op_kind { OP_HTOD, OP_DTOH, OP_DTOD, OP_MEMSET, OP_EVENT, OP_WAIT };

struct emu_op {
    enum op_kind kind;
    kcu_deviceptr dst, src;
    void *hdst;
    const void *hsrc;
    size_t n;
    unsigned char val;
    struct kcu_event_st *ev;       /* OP_EVENT / OP_WAIT: holds a reference */
    uint64_t seq;                  /* record number (OP_EVENT) or awaited record (OP_WAIT) */
    uint64_t ticket;               /* position in its stream's queue (1, 2, ...) */
    /* implicit legacy-stream synchronization: a legacy op runs after the work each blocking
       stream had queued when it was submitted (bar: stream id, ticket); a blocking
       stream's op after the legacy work queued before it (legacy_wait: legacy ticket) */
    struct { uint64_t id, ticket; } *bar;
    size_t nbar;
    uint64_t legacy_wait;
    struct emu_op *next;
};

struct kcu_stream_st {
    struct emu_dev *dev;
    unsigned flags;
    pthread_t thread;
    pthread_cond_t cv;             /* work queued, unpaused, or exit requested */
    struct emu_op *head, *tail;    /* head = running or next op; popped when done */
    uint64_t queued, done;         /* tickets handed out / ops completed, in order */
    bool paused, exiting, dying;
    bool detached;                 /* destroyed by the caller: the worker frees s once drained */
    bool legacy;                   /* the device's legacy default stream (never a handle) */
    bool running;                  /* its head op executes now (the worker may wait in it) */
    uint64_t id;                   /* unique, never reused (barriers name streams by it) */
    /* emulated graph capture (emu_stream_set_capturing), begun in GLOBAL mode by cap_thread:
       work submitted meanwhile is captured (counted, never executed), like a graph's nodes;
       invalidated: an unsafe call broke it (cuStreamIsCapturing says INVALIDATED) */
    bool capturing, invalidated;
    pthread_t cap_thread;
    uint64_t captured;
    uint64_t submitted;            /* operations ever submitted (captured ones included) */
    struct kcu_stream_st *next;
};

struct kcu_event_st {
    struct emu_dev *dev;
    unsigned flags;
    uint64_t rec_seq;              /* records issued */
    uint64_t done_seq;             /* highest record reached */
    int refs;                      /* 1 for the user until destroyed + 1 per queued op */
    bool captured;                 /* last recorded inside a capture: query/sync refused */
    struct kcu_event_st *next;
};

struct kcu_ctx_st {                /* primary context of the device in the same slot */
    unsigned gen;                  /* bumped when the device is destroyed */
};

/* ---- globals (all guarded by g_lock) ------------------------------------------------ */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER;   /* some op completed */
static bool g_inited;
static struct emu_dev *g_devs[EMU_MAX_DEVICES];
static struct kcu_ctx_st g_ctx[EMU_MAX_DEVICES];
static struct emu_handle *g_h;
static size_t g_h_cap;
static struct emu_resv **g_resv;
static size_t g_nresv, g_resv_cap;
static struct emu_host *g_hosts;
static struct kcu_stream_st *g_streams;
static struct kcu_event_st *g_events;
static uint64_t g_map_id;
static struct emu_fault *g_faults;
static bool g_env_read;
static bool g_memlock_warned;

static bool g_tracing;
static struct emu_trace_entry *g_trace;
static size_t g_trace_n, g_trace_cap;
static unsigned long g_trace_occ[E_COUNT];

static __thread struct kcu_ctx_st *t_ctx;   /* the thread's current context */
static __thread unsigned t_ctx_gen;
static __thread int t_capmode;              /* KCU_STREAM_CAPTURE_MODE_*; GLOBAL = 0 */

/* ---- small helpers ------------------------------------------------------------------ */

static bool is_pow2(size_t x) { return x && !(x & (x - 1)); }
static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

static struct emu_dev *dev_get_locked(int ordinal)
{
    if (ordinal < 0 || ordinal >= EMU_MAX_DEVICES)
        return NULL;
    return g_devs[ordinal];
}

/* The device of the calling thread's current context, if that context is alive. */
static struct emu_dev *current_dev_locked(void)
{
    if (!t_ctx)
        return NULL;
    int i = (int)(t_ctx - g_ctx);
    struct emu_dev *d = g_devs[i];
    if (!d || t_ctx_gen != t_ctx->gen || d->ctx_refs <= 0)
        return NULL;
    return d;
}

static void trace_record_locked(int e)
{
    if (!g_tracing)
        return;
    unsigned long nth = ++g_trace_occ[e];
    if (g_trace_n == g_trace_cap) {
        size_t cap = g_trace_cap ? 2 * g_trace_cap : 1024;
        struct emu_trace_entry *t = realloc(g_trace, cap * sizeof *t);
        if (!t)
            return;                /* tracing is best effort under memory pressure */
        g_trace = t;
        g_trace_cap = cap;
    }
    g_trace[g_trace_n++] = (struct emu_trace_entry){ entry_names[e], nth };
}

/* Counts this call against every armed failure of entry e; true (and *err) if one fires. */
static bool fault_check_locked(int e, kcu_result *err)
{
    bool fired = false;
    for (struct emu_fault **pp = &g_faults; *pp;) {
        struct emu_fault *f = *pp;
        if (f->entry == e && --f->left == 0) {
            if (!fired) {
                *err = f->err;
                fired = true;
            }
            *pp = f->next;
            free(f);
            continue;
        }
        pp = &f->next;
    }
    return fired;
}

enum { F_INIT = 1,                  /* cuInit must have been called */
       F_CTX = 2,                   /* a current context is required */
       F_STICKY = 4 };              /* a dead current device fails the call */

/* The one prologue: takes g_lock (every entry point returns through leave()), records the
   call, fires armed failures, then checks initialization, context and sticky errors. */
static kcu_result enter(int e, int need, struct emu_dev **cur)
{
    pthread_mutex_lock(&g_lock);
    trace_record_locked(e);
    kcu_result err;
    if (fault_check_locked(e, &err))
        return err;
    if ((need & F_INIT) && !g_inited)
        return KCU_ERROR_NOT_INITIALIZED;
    struct emu_dev *d = current_dev_locked();
    *cur = d;
    if ((need & F_CTX) && !d)
        return KCU_ERROR_INVALID_CONTEXT;
    if ((need & F_STICKY) && d && d->sticky)
        return d->sticky;
    return KCU_SUCCESS;
}

static kcu_result leave(kcu_result r)
{
    pthread_mutex_unlock(&g_lock);
    return r;
}

#define BEGIN(name, need)                                         \
    struct emu_dev *cur;                                          \
    kcu_result r = enter(E_##name, (need), &cur);                 \
    (void)cur;                                                    \
    if (r != KCU_SUCCESS)                                         \
        goto out

/* ---- error strings ------------------------------------------------------------------ */

static const struct { kcu_result code; const char *name, *desc; } err_table[] = {
    { KCU_SUCCESS, "CUDA_SUCCESS", "no error" },
    { KCU_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument" },
    { KCU_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory" },
    { KCU_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error" },
    { KCU_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down" },
    { KCU_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY",
      "CUDA driver is a stub library" },
    { KCU_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected" },
    { KCU_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal" },
    { KCU_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context" },
    { KCU_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped" },
    { KCU_ERROR_NOT_MAPPED, "CUDA_ERROR_NOT_MAPPED", "resource not mapped" },
    { KCU_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle" },
    { KCU_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found" },
    { KCU_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready" },
    { KCU_ERROR_ECC_UNCORRECTABLE, "CUDA_ERROR_ECC_UNCORRECTABLE",
      "uncorrectable ECC error encountered" },
    { KCU_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
      "an illegal memory access was encountered" },
    { KCU_ERROR_LAUNCH_TIMEOUT, "CUDA_ERROR_LAUNCH_TIMEOUT",
      "the launch timed out and was terminated" },
    { KCU_ERROR_HARDWARE_STACK_ERROR, "CUDA_ERROR_HARDWARE_STACK_ERROR",
      "hardware stack error" },
    { KCU_ERROR_ILLEGAL_INSTRUCTION, "CUDA_ERROR_ILLEGAL_INSTRUCTION",
      "an illegal instruction was encountered" },
    { KCU_ERROR_MISALIGNED_ADDRESS, "CUDA_ERROR_MISALIGNED_ADDRESS",
      "misaligned address" },
    { KCU_ERROR_INVALID_ADDRESS_SPACE, "CUDA_ERROR_INVALID_ADDRESS_SPACE",
      "operation not supported on global/shared address space" },
    { KCU_ERROR_INVALID_PC, "CUDA_ERROR_INVALID_PC", "invalid program counter" },
    { KCU_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure" },
    { KCU_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
      "part or all of the requested memory range is already mapped" },
    { KCU_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
      "pointer does not correspond to a registered memory region" },
    { KCU_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted" },
    { KCU_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported" },
    { KCU_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
      "operation not permitted when stream is capturing" },
    { KCU_ERROR_STREAM_CAPTURE_ISOLATION, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
      "dependency created on uncaptured work in another stream" },
    { KCU_ERROR_STREAM_CAPTURE_IMPLICIT, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
      "operation would make the legacy stream depend on a capturing blocking stream" },
    { KCU_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error" },
};

static int err_index(kcu_result e)
{
    for (size_t i = 0; i < sizeof err_table / sizeof err_table[0]; i++)
        if (err_table[i].code == e)
            return (int)i;
    return -1;
}

/* Unknown error: *str = NULL and KCU_ERROR_INVALID_VALUE, as the driver documents. */
static kcu_result emu_cuGetErrorString(kcu_result error, const char **str)
{
    BEGIN(cuGetErrorString, 0);
    if (!str) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    int i = err_index(error);
    *str = i < 0 ? NULL : err_table[i].desc;
    r = i < 0 ? KCU_ERROR_INVALID_VALUE : KCU_SUCCESS;
out:
    return leave(r);
}

static kcu_result emu_cuGetErrorName(kcu_result error, const char **str)
{
    BEGIN(cuGetErrorName, 0);
    if (!str) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    int i = err_index(error);
    *str = i < 0 ? NULL : err_table[i].name;
    r = i < 0 ? KCU_ERROR_INVALID_VALUE : KCU_SUCCESS;
out:
    return leave(r);
}

/* ---- init, devices, contexts -------------------------------------------------------- */

static kcu_result emu_cuInit(unsigned int flags)
{
    BEGIN(cuInit, 0);
    if (flags != 0) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    g_inited = true;
out:
    return leave(r);
}

static kcu_result emu_cuDriverGetVersion(int *version)
{
    BEGIN(cuDriverGetVersion, 0);
    if (!version)
        r = KCU_ERROR_INVALID_VALUE;
    else
        *version = EMU_DRIVER_VERSION;
out:
    return leave(r);
}

static kcu_result emu_cuDeviceGetCount(int *count)
{
    BEGIN(cuDeviceGetCount, F_INIT);
    if (!count) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    int n = 0;
    for (int i = 0; i < EMU_MAX_DEVICES; i++)
        n += g_devs[i] != NULL;
    *count = n;
out:
    return leave(r);
}

static kcu_result emu_cuDeviceGet(kcu_device *dev, int ordinal)
{
    BEGIN(cuDeviceGet, F_INIT);
    if (!dev)
        r = KCU_ERROR_INVALID_VALUE;
    else if (!dev_get_locked(ordinal))
        r = KCU_ERROR_INVALID_DEVICE;
    else
        *dev = ordinal;
out:
    return leave(r);
}

/* Only the VMM attribute is emulated; any other attribute is KCU_ERROR_INVALID_VALUE (the
   driver's code for an unknown attribute), so a caller relying on more fails loudly. */
static kcu_result emu_cuDeviceGetAttribute(int *pi, int attrib, kcu_device dev)
{
    BEGIN(cuDeviceGetAttribute, F_INIT);
    if (!pi)
        r = KCU_ERROR_INVALID_VALUE;
    else if (!dev_get_locked(dev))
        r = KCU_ERROR_INVALID_DEVICE;
    else if (attrib == KCU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)
        *pi = 1;
    else
        r = KCU_ERROR_INVALID_VALUE;
out:
    return leave(r);
}

static kcu_result emu_cuDeviceGetName(char *name, int len, kcu_device dev)
{
    BEGIN(cuDeviceGetName, F_INIT);
    if (!name || len <= 0)
        r = KCU_ERROR_INVALID_VALUE;
    else if (!dev_get_locked(dev))
        r = KCU_ERROR_INVALID_DEVICE;
    else
        snprintf(name, (size_t)len, "%s", EMU_DEVICE_NAME);
out:
    return leave(r);
}

static kcu_result emu_cuDeviceTotalMem(size_t *bytes, kcu_device dev)
{
    BEGIN(cuDeviceTotalMem, F_INIT);
    struct emu_dev *d = dev_get_locked(dev);
    if (!bytes)
        r = KCU_ERROR_INVALID_VALUE;
    else if (!d)
        r = KCU_ERROR_INVALID_DEVICE;
    else
        *bytes = d->capacity;
out:
    return leave(r);
}

static kcu_result emu_cuDevicePrimaryCtxRetain(kcu_context *ctx, kcu_device dev)
{
    BEGIN(cuDevicePrimaryCtxRetain, F_INIT);
    struct emu_dev *d = dev_get_locked(dev);
    if (!ctx)
        r = KCU_ERROR_INVALID_VALUE;
    else if (!d)
        r = KCU_ERROR_INVALID_DEVICE;
    else {
        d->ctx_refs++;
        *ctx = &g_ctx[dev];
    }
out:
    return leave(r);
}

/* Releasing more often than retained: KCU_ERROR_INVALID_CONTEXT. The device's objects stay
   (emu_device_destroy accounts for them). */
static kcu_result emu_cuDevicePrimaryCtxRelease(kcu_device dev)
{
    BEGIN(cuDevicePrimaryCtxRelease, F_INIT);
    struct emu_dev *d = dev_get_locked(dev);
    if (!d)
        r = KCU_ERROR_INVALID_DEVICE;
    else if (d->ctx_refs <= 0)
        r = KCU_ERROR_INVALID_CONTEXT;
    else
        d->ctx_refs--;
out:
    return leave(r);
}

static kcu_result emu_cuCtxSetCurrent(kcu_context ctx)
{
    BEGIN(cuCtxSetCurrent, F_INIT);
    if (!ctx) {
        t_ctx = NULL;
        goto out;
    }
    for (int i = 0; i < EMU_MAX_DEVICES; i++) {
        if (ctx == &g_ctx[i] && g_devs[i] && g_devs[i]->ctx_refs > 0) {
            t_ctx = ctx;
            t_ctx_gen = ctx->gen;
            goto out;
        }
    }
    r = KCU_ERROR_INVALID_CONTEXT;
out:
    return leave(r);
}

static kcu_result emu_cuCtxGetCurrent(kcu_context *ctx)
{
    BEGIN(cuCtxGetCurrent, F_INIT);
    if (!ctx)
        r = KCU_ERROR_INVALID_VALUE;
    else
        *ctx = cur ? t_ctx : NULL;
out:
    return leave(r);
}

/* ---- physical memory allocator ------------------------------------------------------ */

static bool bit_get(const uint64_t *bm, size_t i) { return bm[i / 64] >> (i % 64) & 1; }
static void bit_set(uint64_t *bm, size_t i, bool v)
{
    if (v)
        bm[i / 64] |= 1ull << (i % 64);
    else
        bm[i / 64] &= ~(1ull << (i % 64));
}

/* Finds n free contiguous granules, next-fit from the cursor. -ENOMEM none. */
static int range_alloc_locked(struct emu_dev *d, size_t n, size_t *base)
{
    if (n > d->ngran)
        return -ENOMEM;
    for (int pass = 0; pass < 2; pass++) {
        size_t i = pass == 0 ? d->cursor : 0;
        size_t end = pass == 0 ? d->ngran : min_sz(d->cursor + n, d->ngran);
        while (i + n <= end) {
            if (d->bitmap[i / 64] == ~0ull && i % 64 == 0) {
                i += 64;
                continue;
            }
            size_t run = 0;
            while (run < n && !bit_get(d->bitmap, i + run))
                run++;
            if (run == n) {
                for (size_t k = 0; k < n; k++)
                    bit_set(d->bitmap, i + k, true);
                *base = i;
                d->cursor = (i + n) % d->ngran;
                return 0;
            }
            i += run + 1;
        }
    }
    return -ENOMEM;
}

static void range_free_locked(struct emu_dev *d, size_t base, size_t n)
{
    for (size_t k = 0; k < n; k++)
        bit_set(d->bitmap, base + k, false);
    /* Give the memory back; KEEP_SIZE keeps the memfd's length (the view stays valid). */
    if (fallocate(d->memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                  (off_t)(base * d->gran), (off_t)(n * d->gran)) != 0)
        klog_warn("emulated device %d: hole punch of %zu bytes failed: %s", d->ordinal,
                  n * d->gran, strerror(errno));
}

static kcu_mem_handle handle_value(size_t slot)
{
    return ((kcu_mem_handle)g_h[slot].gen << 32) | (kcu_mem_handle)(slot + 1);
}

/* A handle the user may still name (not released); NULL for stale or forged values. */
static struct emu_handle *handle_lookup_locked(kcu_mem_handle v, size_t *slot)
{
    uint64_t s1 = v & 0xffffffffu;
    if (s1 == 0 || s1 > g_h_cap)
        return NULL;
    struct emu_handle *h = &g_h[s1 - 1];
    if (!h->dev || h->gen != (uint32_t)(v >> 32) || h->released)
        return NULL;
    if (slot)
        *slot = s1 - 1;
    return h;
}

/* Frees the memory of a handle that is released and no longer mapped. */
static void handle_maybe_free_locked(size_t slot)
{
    struct emu_handle *h = &g_h[slot];
    if (!h->released || h->maps)
        return;
    struct emu_dev *d = h->dev;
    range_free_locked(d, h->base, h->ngran);
    d->c.handles--;
    d->c.handle_bytes -= h->ngran * d->gran;
    h->dev = NULL;
    if (++h->gen == 0)
        h->gen = 1;
}

static int handle_slot_alloc_locked(size_t *slot)
{
    static size_t scan;            /* next-fit: creates stay O(1) amortized */
    for (size_t k = 0; k < g_h_cap; k++) {
        size_t i = (scan + k) % g_h_cap;
        if (!g_h[i].dev) {
            *slot = i;
            scan = i + 1;
            return 0;
        }
    }
    size_t cap = g_h_cap ? 2 * g_h_cap : 256;
    if (cap > UINT32_MAX)
        return -ENOMEM;
    struct emu_handle *n = realloc(g_h, cap * sizeof *n);
    if (!n)
        return -ENOMEM;
    for (size_t i = g_h_cap; i < cap; i++)
        n[i] = (struct emu_handle){ .gen = 1 };
    g_h = n;
    *slot = g_h_cap;
    g_h_cap = cap;
    return 0;
}

/* Checks a CUmemAllocationProp as cuMemCreate does. */
static kcu_result prop_check_locked(const struct kcu_mem_alloc_prop *prop, struct emu_dev **d)
{
    if (!prop || prop->type != KCU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != KCU_MEM_LOCATION_TYPE_DEVICE)
        return KCU_ERROR_INVALID_VALUE;
    if (!(*d = dev_get_locked(prop->location.id)))
        return KCU_ERROR_INVALID_DEVICE;
    return KCU_SUCCESS;
}

static kcu_result emu_cuMemGetAllocationGranularity(size_t *granularity,
                                                    const struct kcu_mem_alloc_prop *prop,
                                                    int option)
{
    BEGIN(cuMemGetAllocationGranularity, F_INIT);
    struct emu_dev *d;
    if (!granularity || (option != KCU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                         option != KCU_MEM_ALLOC_GRANULARITY_RECOMMENDED)) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    if ((r = prop_check_locked(prop, &d)))
        goto out;
    *granularity = d->gran;
out:
    return leave(r);
}

/* ---- the driver's cost of cuMemCreate (KVVM_EMU_CREATE_NS) ----
   A GPU's cuMemCreate of 2 MiB takes ~200 us; the emulator's is a memset. KVVM_EMU_CREATE_NS
   (read at each emu_device_create, process-wide) makes every cuMemCreate first sleep that
   long, outside the emulator's lock (the real driver does not stop other threads' calls
   either): kvvm-bench's frames group measures grows with frames created ahead against
   created on the caller's thread with it. */
static long g_create_ns;

static void create_cost_read(void)
{
    const char *e = getenv("KVVM_EMU_CREATE_NS");
    long v = e && *e ? strtol(e, NULL, 10) : 0;
    __atomic_store_n(&g_create_ns, v > 0 && v < 1000000000L ? v : 0, __ATOMIC_RELAXED);
}

static void create_cost_spend(void)
{
    long ns = __atomic_load_n(&g_create_ns, __ATOMIC_RELAXED);
    if (ns > 0) {
        struct timespec ts = { 0, ns };
        while (nanosleep(&ts, &ts) && errno == EINTR)
            ;
    }
}

static kcu_result emu_cuMemCreate(kcu_mem_handle *handle, size_t size,
                                  const struct kcu_mem_alloc_prop *prop,
                                  unsigned long long flags)
{
    create_cost_spend();
    BEGIN(cuMemCreate, F_INIT | F_CTX | F_STICKY);
    struct emu_dev *d;
    size_t slot, base;
    if (!handle || flags != 0) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    if ((r = prop_check_locked(prop, &d)))
        goto out;
    if (prop->requestedHandleTypes != KCU_MEM_HANDLE_TYPE_NONE) {
        /* Shareable handles (POSIX fd, fabric) are not emulated. */
        r = KCU_ERROR_NOT_SUPPORTED;
        goto out;
    }
    if (prop->win32HandleMetaData || prop->allocFlags.compressionType ||
        prop->allocFlags.usage || size == 0 || size % d->gran) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    if (handle_slot_alloc_locked(&slot) || range_alloc_locked(d, size / d->gran, &base)) {
        r = KCU_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    /* Uninitialized GPU memory: fill with poison through the view. Allocating the pages
       first (one fallocate) is much cheaper than faulting them in one by one. */
    (void)fallocate(d->memfd, 0, (off_t)(base * d->gran), (off_t)size);
    memset(d->view + base * d->gran, EMU_POISON, size);
    g_h[slot] = (struct emu_handle){ .dev = d, .gen = g_h[slot].gen, .base = base,
                                     .ngran = size / d->gran };
    d->c.handles++;
    d->c.handle_bytes += size;
    d->c.creates++;
    *handle = handle_value(slot);
out:
    return leave(r);
}

/* Releasing a mapped handle is allowed (the memory is freed after its last unmap, as the
   driver documents). A stale, forged or already released handle: KCU_ERROR_INVALID_VALUE
   (the driver documents only INVALID_VALUE for bad arguments here). */
static kcu_result emu_cuMemRelease(kcu_mem_handle handle)
{
    BEGIN(cuMemRelease, F_INIT | F_STICKY);
    size_t slot;
    struct emu_handle *h = handle_lookup_locked(handle, &slot);
    if (!h) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    h->released = true;
    h->dev->c.releases++;
    handle_maybe_free_locked(slot);
out:
    return leave(r);
}

/* ---- reservations and the mapping table --------------------------------------------- */

static struct emu_resv *resv_find_locked(uintptr_t va)
{
    for (size_t i = 0; i < g_nresv; i++) {
        struct emu_resv *rv = g_resv[i];
        if (va >= rv->base && va - rv->base < rv->size)
            return rv;
    }
    return NULL;
}

/* The reservation holding all of [va, va + n), or NULL. */
static struct emu_resv *resv_find_range_locked(uintptr_t va, size_t n)
{
    struct emu_resv *rv = resv_find_locked(va);
    if (!rv || n > rv->size - (va - rv->base))
        return NULL;
    return rv;
}

static struct emu_ent *ent_get(struct emu_resv *rv, size_t i)
{
    struct emu_ent *b = rv->blk[i / ENT_BLOCK];
    return b ? &b[i % ENT_BLOCK] : NULL;
}

static bool ent_mapped(struct emu_resv *rv, size_t i)
{
    struct emu_ent *e = ent_get(rv, i);
    return e && e->h1;
}

static uint64_t ent_map_id(struct emu_resv *rv, size_t i)
{
    struct emu_ent *e = ent_get(rv, i);
    return e && e->h1 ? e->map_id : 0;
}

static int resv_add_locked(struct emu_resv *rv)
{
    if (g_nresv == g_resv_cap) {
        size_t cap = g_resv_cap ? 2 * g_resv_cap : 16;
        struct emu_resv **n = realloc(g_resv, cap * sizeof *n);
        if (!n)
            return -ENOMEM;
        g_resv = n;
        g_resv_cap = cap;
    }
    g_resv[g_nresv++] = rv;
    return 0;
}

static void resv_remove_locked(struct emu_resv *rv)
{
    for (size_t i = 0; i < g_nresv; i++) {
        if (g_resv[i] == rv) {
            g_resv[i] = g_resv[--g_nresv];
            return;
        }
    }
}

static void resv_free_mem(struct emu_resv *rv)
{
    for (size_t b = 0; b < rv->nblk; b++)
        free(rv->blk[b]);
    free(rv->blk);
    free(rv->blk_used);
    free(rv);
}

/* Reservations are aligned to at least the granule (mmap gives pages only), so the address
   space is over-reserved and trimmed. A nonzero addr is a hint, honoured when that exact
   range is free. Errors: size 0 or not a granule multiple, alignment not 0 or a power of
   two, flags != 0 -> KCU_ERROR_INVALID_VALUE; no address space -> KCU_ERROR_OUT_OF_MEMORY. */
static kcu_result emu_cuMemAddressReserve(kcu_deviceptr *ptr, size_t size, size_t alignment,
                                          kcu_deviceptr addr, unsigned long long flags)
{
    BEGIN(cuMemAddressReserve, F_INIT | F_CTX | F_STICKY);
    struct emu_resv *rv = NULL;
    void *base = MAP_FAILED;
    size_t align;
    if (!ptr || size == 0 || size % cur->gran || flags != 0 ||
        (alignment && !is_pow2(alignment))) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    align = alignment > cur->gran ? alignment : cur->gran;
    const int mflags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    if (addr && addr % align == 0) {
        base = mmap((void *)(uintptr_t)addr, size, PROT_NONE, mflags | MAP_FIXED_NOREPLACE,
                    -1, 0);
        if (base != MAP_FAILED && base != (void *)(uintptr_t)addr) {
            munmap(base, size);    /* a kernel without MAP_FIXED_NOREPLACE: not honoured */
            base = MAP_FAILED;
        }
    }
    if (base == MAP_FAILED) {
        if (size > SIZE_MAX - align) {
            r = KCU_ERROR_OUT_OF_MEMORY;
            goto out;
        }
        unsigned char *raw = mmap(NULL, size + align, PROT_NONE, mflags, -1, 0);
        if (raw == MAP_FAILED) {
            r = KCU_ERROR_OUT_OF_MEMORY;
            goto out;
        }
        uintptr_t a = ((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1);
        if (a > (uintptr_t)raw)
            munmap(raw, a - (uintptr_t)raw);
        size_t tail = (uintptr_t)raw + size + align - (a + size);
        if (tail)
            munmap((void *)(a + size), tail);
        base = (void *)a;
    }
    rv = calloc(1, sizeof *rv);
    if (!rv)
        goto out_unmap;
    rv->owner = cur;
    rv->base = (uintptr_t)base;
    rv->size = size;
    rv->gran = cur->gran;
    rv->ngran = size / cur->gran;
    rv->nblk = (rv->ngran + ENT_BLOCK - 1) / ENT_BLOCK;
    rv->blk = calloc(rv->nblk, sizeof *rv->blk);
    rv->blk_used = calloc(rv->nblk, sizeof *rv->blk_used);
    if (!rv->blk || !rv->blk_used || resv_add_locked(rv))
        goto out_free;
    cur->c.reservations++;
    cur->c.reserved_bytes += size;
    *ptr = (kcu_deviceptr)(uintptr_t)base;
    goto out;
out_free:
    free(rv->blk);
    free(rv->blk_used);
    free(rv);
out_unmap:
    munmap(base, size);
    r = KCU_ERROR_OUT_OF_MEMORY;
out:
    return leave(r);
}

/* (ptr, size) must name exactly one reservation with no live mapping; anything else is
   KCU_ERROR_INVALID_VALUE (the driver documents only INVALID_VALUE for bad ranges). */
static kcu_result emu_cuMemAddressFree(kcu_deviceptr ptr, size_t size)
{
    BEGIN(cuMemAddressFree, F_INIT | F_STICKY);
    struct emu_resv *rv = resv_find_locked((uintptr_t)ptr);
    if (!rv || rv->base != (uintptr_t)ptr || rv->size != size || rv->live_maps) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    resv_remove_locked(rv);
    munmap((void *)rv->base, rv->size);
    rv->owner->c.reservations--;
    rv->owner->c.reserved_bytes -= rv->size;
    resv_free_mem(rv);
out:
    return leave(r);
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

/* Errors (driver reference for cuMemMap lists INVALID_VALUE, INVALID_DEVICE, OUT_OF_MEMORY,
   NOT_PERMITTED, NOT_SUPPORTED; it does not list ALREADY_MAPPED):
   - stale/forged handle, offset != 0, flags != 0, size 0, ptr or size not granule aligned,
     size > handle size, range not inside one reservation, any granule already mapped, the
     reservation's granule differs from the handle's device's (emulator limit):
     KCU_ERROR_INVALID_VALUE;
   - live mappings at max_maps, or the kernel refusing the mmap: KCU_ERROR_OUT_OF_MEMORY. */
static kcu_result emu_cuMemMap(kcu_deviceptr ptr, size_t size, size_t offset,
                               kcu_mem_handle handle, unsigned long long flags)
{
    BEGIN(cuMemMap, F_INIT | F_CTX | F_STICKY);
    size_t slot;
    struct emu_handle *h = handle_lookup_locked(handle, &slot);
    if (!h || offset != 0 || flags != 0 || size == 0) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    struct emu_dev *d = h->dev;
    struct emu_resv *rv = resv_find_range_locked((uintptr_t)ptr, size);
    if (ptr % d->gran || size % d->gran || size > h->ngran * d->gran || !rv ||
        rv->gran != d->gran) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    size_t first = ((uintptr_t)ptr - rv->base) / rv->gran, n = size / rv->gran;
    for (size_t i = 0; i < n; i++) {
        if (ent_mapped(rv, first + i)) {
            r = KCU_ERROR_INVALID_VALUE;
            goto out;
        }
    }
    if (d->c.mappings >= d->max_maps) {
        klog_error("emulated device %d: %" PRIu64 " live mappings reached the bound of %zu "
                   "(below vm.max_map_count; set KVVM_EMU_MAX_MAPS or raise "
                   "vm.max_map_count): cuMemMap fails with out of memory",
                   d->ordinal, d->c.mappings, d->max_maps);
        r = KCU_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    for (size_t b = first / ENT_BLOCK; b <= (first + n - 1) / ENT_BLOCK; b++) {
        if (!rv->blk[b] && !(rv->blk[b] = calloc(ENT_BLOCK, sizeof(struct emu_ent)))) {
            r = KCU_ERROR_OUT_OF_MEMORY;
            goto out;
        }
    }
    void *m = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, d->memfd,
                   (off_t)(h->base * d->gran));
    if (m == MAP_FAILED) {
        klog_error("emulated device %d: mmap of a %zu-byte mapping failed: %s", d->ordinal,
                   size, strerror(errno));
        r = KCU_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    uint64_t id = ++g_map_id;
    for (size_t i = 0; i < n; i++) {
        struct emu_ent *e = ent_get(rv, first + i);
        *e = (struct emu_ent){ .h1 = (uint32_t)(slot + 1), .access =
                               KCU_MEM_ACCESS_FLAGS_PROT_NONE, .off = i, .map_id = id };
        rv->blk_used[(first + i) / ENT_BLOCK]++;
    }
    h->maps++;
    rv->live_maps++;
    d->c.mappings++;
    d->c.mapped_bytes += size;
    d->c.maps++;
out:
    return leave(r);
}

/* Removes every mapping in granules [first, first + n) of rv (validated by the caller):
   table entries cleared, handles' map counts dropped (freeing released ones). */
static void unmap_entries_locked(struct emu_resv *rv, size_t first, size_t n)
{
    uint64_t last_id = 0;
    for (size_t i = first; i < first + n; i++) {
        struct emu_ent *e = ent_get(rv, i);
        if (!e || !e->h1)
            continue;
        size_t slot = e->h1 - 1;
        struct emu_handle *h = &g_h[slot];
        struct emu_dev *d = h->dev;
        if (e->map_id != last_id) {
            last_id = e->map_id;
            h->maps--;
            rv->live_maps--;
            d->c.mappings--;
            d->c.unmaps++;
        }
        d->c.mapped_bytes -= rv->gran;
        *e = (struct emu_ent){ 0 };
        size_t b = i / ENT_BLOCK;
        if (--rv->blk_used[b] == 0) {
            free(rv->blk[b]);
            rv->blk[b] = NULL;
        }
        if (!h->maps)
            handle_maybe_free_locked(slot);
    }
}

/* The range must consist of whole mappings only (driver: "must be the entire contiguous
   address range that was mapped"); violations, misalignment, unmapped granules or a range
   outside one reservation: KCU_ERROR_INVALID_VALUE (the one documented argument error). */
static kcu_result emu_cuMemUnmap(kcu_deviceptr ptr, size_t size)
{
    BEGIN(cuMemUnmap, F_INIT | F_STICKY);
    struct emu_resv *rv = resv_find_range_locked((uintptr_t)ptr, size);
    if (!rv || size == 0 || ptr % rv->gran || size % rv->gran) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    size_t first = ((uintptr_t)ptr - rv->base) / rv->gran, n = size / rv->gran;
    for (size_t i = first; i < first + n; i++) {
        if (!ent_mapped(rv, i)) {
            r = KCU_ERROR_INVALID_VALUE;
            goto out;
        }
    }
    if ((first > 0 && ent_map_id(rv, first - 1) == ent_map_id(rv, first)) ||
        (first + n < rv->ngran && ent_map_id(rv, first + n) == ent_map_id(rv, first + n - 1))) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    void *m = mmap((void *)(uintptr_t)ptr, size, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    if (m == MAP_FAILED) {
        klog_error("emulated: replacing %zu mapped bytes at 0x%llx failed: %s", size, ptr,
                   strerror(errno));
        r = KCU_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    unmap_entries_locked(rv, first, n);
out:
    return leave(r);
}

static int prot_of(int access)
{
    switch (access) {
    case KCU_MEM_ACCESS_FLAGS_PROT_READ: return PROT_READ;
    case KCU_MEM_ACCESS_FLAGS_PROT_READWRITE: return PROT_READ | PROT_WRITE;
    default: return PROT_NONE;
    }
}

/* Errors: desc NULL, count 0, a location that is not a device, flags not PROT_NONE / READ /
   READWRITE, misaligned range, a range not fully mapped inside one reservation:
   KCU_ERROR_INVALID_VALUE; a location id that names no device: KCU_ERROR_INVALID_DEVICE.
   Only the entry naming the memory's own device is recorded: peer access is not emulated,
   so a copy on another device's stream faults. mprotect refused: KCU_ERROR_OUT_OF_MEMORY. */
static kcu_result emu_cuMemSetAccess(kcu_deviceptr ptr, size_t size,
                                     const struct kcu_mem_access_desc *desc, size_t count)
{
    BEGIN(cuMemSetAccess, F_INIT | F_STICKY);
    if (!desc || count == 0) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    for (size_t k = 0; k < count; k++) {
        int f = desc[k].flags;
        if (desc[k].location.type != KCU_MEM_LOCATION_TYPE_DEVICE ||
            (f != KCU_MEM_ACCESS_FLAGS_PROT_NONE && f != KCU_MEM_ACCESS_FLAGS_PROT_READ &&
             f != KCU_MEM_ACCESS_FLAGS_PROT_READWRITE)) {
            r = KCU_ERROR_INVALID_VALUE;
            goto out;
        }
        if (!dev_get_locked(desc[k].location.id)) {
            r = KCU_ERROR_INVALID_DEVICE;
            goto out;
        }
    }
    struct emu_resv *rv = resv_find_range_locked((uintptr_t)ptr, size);
    if (!rv || size == 0 || ptr % rv->gran || size % rv->gran) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    size_t first = ((uintptr_t)ptr - rv->base) / rv->gran, n = size / rv->gran;
    for (size_t i = first; i < first + n; i++) {
        if (!ent_mapped(rv, i)) {
            r = KCU_ERROR_INVALID_VALUE;
            goto out;
        }
    }
    /* Apply run by run (granules of one device and one resulting access). */
    size_t i = first;
    while (i < first + n) {
        struct emu_ent *e = ent_get(rv, i);
        struct emu_dev *d = g_h[e->h1 - 1].dev;
        int acc = (int)e->access;
        for (size_t k = 0; k < count; k++)
            if (desc[k].location.id == d->ordinal)
                acc = desc[k].flags;
        size_t j = i + 1;
        while (j < first + n) {
            struct emu_ent *f = ent_get(rv, j);
            struct emu_dev *fd = g_h[f->h1 - 1].dev;
            int facc = (int)f->access;
            for (size_t k = 0; k < count; k++)
                if (desc[k].location.id == fd->ordinal)
                    facc = desc[k].flags;
            if (fd != d || facc != acc)
                break;
            j++;
        }
        if (!d->opaque && mprotect((void *)(rv->base + i * rv->gran), (j - i) * rv->gran,
                                   prot_of(acc)) != 0) {
            klog_error("emulated device %d: mprotect failed: %s", d->ordinal,
                       strerror(errno));
            r = KCU_ERROR_OUT_OF_MEMORY;
            goto out;
        }
        for (size_t k = i; k < j; k++)
            ent_get(rv, k)->access = (uint32_t)acc;
        d->c.set_access++;
        i = j;
    }
out:
    return leave(r);
}

/* ---- copies ------------------------------------------------------------------------- */

/* Translates device address va for an access needing `need` by device d: a pointer into
   the memory's view and the length (<= want) of the contiguous run it starts. NULL and a
   reason when the address is not mapped with that access. */
static unsigned char *xlate_locked(struct emu_dev *d, kcu_deviceptr va, size_t want, int need,
                                   size_t *run, const char **why)
{
    struct emu_resv *rv = resv_find_locked((uintptr_t)va);
    if (!rv) {
        *why = "not a reserved address";
        return NULL;
    }
    size_t idx = ((uintptr_t)va - rv->base) / rv->gran;
    size_t in = ((uintptr_t)va - rv->base) % rv->gran;
    struct emu_ent *e = ent_get(rv, idx);
    if (!e || !e->h1) {
        *why = "not mapped";
        return NULL;
    }
    struct emu_handle *h = &g_h[e->h1 - 1];
    if (h->dev != d) {
        *why = "memory of another device (peer access is not emulated)";
        return NULL;
    }
    if (((int)e->access & need) != need) {
        *why = need & NEED_W ? "not writable (cuMemSetAccess)" : "not readable (cuMemSetAccess)";
        return NULL;
    }
    size_t len = rv->gran - in;
    for (size_t k = idx + 1; len < want && k < rv->ngran; k++) {
        struct emu_ent *f = ent_get(rv, k);
        if (!f || f->map_id != e->map_id || ((int)f->access & need) != need)
            break;
        len += rv->gran;
    }
    *run = min_sz(len, want);
    return h->dev->view + (h->base + e->off) * d->gran + in;
}

/* True when every byte of [va, va + n) is mapped (any access): copies are refused up front
   with KCU_ERROR_INVALID_VALUE on addresses the driver does not know. */
static bool range_known_locked(kcu_deviceptr va, size_t n)
{
    while (n) {
        struct emu_resv *rv = resv_find_locked((uintptr_t)va);
        if (!rv)
            return false;
        size_t idx = ((uintptr_t)va - rv->base) / rv->gran;
        if (!ent_mapped(rv, idx))
            return false;
        size_t step = min_sz(n, rv->gran - ((uintptr_t)va - rv->base) % rv->gran);
        va += step;
        n -= step;
    }
    return true;
}

static void device_fault_locked(struct emu_dev *d, kcu_deviceptr va, const char *why)
{
    if (!d->sticky)
        klog_error("emulated device %d: illegal address 0x%llx (%s): the device is dead, "
                   "every later call returns CUDA_ERROR_ILLEGAL_ADDRESS", d->ordinal, va, why);
    d->sticky = KCU_ERROR_ILLEGAL_ADDRESS;
}

/* Executes a copy or memset on device d, translating at execution time. The lock is dropped
   between chunks. A fault makes the device's error sticky and stops the copy. */
static void xfer_locked(struct emu_dev *d, struct emu_op *op)
{
    size_t done = 0;
    while (done < op->n && !d->sticky) {
        size_t chunk = min_sz(op->n - done, XFER_CHUNK), cd = 0;
        while (cd < chunk) {
            size_t pos = done + cd, want = chunk - cd, run = want, run2;
            unsigned char *dp = NULL, *sp = NULL;
            const char *why = NULL;
            if (op->kind != OP_DTOH) {
                dp = xlate_locked(d, op->dst + pos, want, NEED_W, &run, &why);
                if (!dp) {
                    device_fault_locked(d, op->dst + pos, why);
                    return;
                }
            }
            if (op->kind == OP_DTOH || op->kind == OP_DTOD) {
                sp = xlate_locked(d, op->src + pos, run, NEED_R, &run2, &why);
                if (!sp) {
                    device_fault_locked(d, op->src + pos, why);
                    return;
                }
                run = min_sz(run, run2);
            }
            switch (op->kind) {
            case OP_HTOD: memcpy(dp, (const unsigned char *)op->hsrc + pos, run); break;
            case OP_DTOH: memcpy((unsigned char *)op->hdst + pos, sp, run); break;
            case OP_DTOD: memmove(dp, sp, run); break;
            case OP_MEMSET: memset(dp, op->val, run); break;
            default: break;
            }
            cd += run;
        }
        done += chunk;
        switch (op->kind) {
        case OP_HTOD: d->c.copied_htod += chunk; break;
        case OP_DTOH: d->c.copied_dtoh += chunk; break;
        case OP_DTOD: d->c.copied_dtod += chunk; break;
        case OP_MEMSET: d->c.memset_bytes += chunk; break;
        default: break;
        }
        if (done < op->n) {        /* let map/unmap calls in between, as a GPU would */
            pthread_mutex_unlock(&g_lock);
            sched_yield();         /* the mutex is unfair: give waiters a real chance */
            pthread_mutex_lock(&g_lock);
        }
    }
}

static void event_put_locked(struct kcu_event_st *ev)
{
    if (--ev->refs == 0)
        free(ev);
}

/* Runs one op for device d (a stream's worker or the NULL stream's caller). */
static void op_free(struct emu_op *op)
{
    free(op->bar);
    free(op);
}

static void op_exec_locked(struct emu_dev *d, struct emu_op *op)
{
    switch (op->kind) {
    case OP_EVENT:
        if (op->seq > op->ev->done_seq)
            op->ev->done_seq = op->seq;
        break;
    case OP_WAIT:
        while (op->ev->done_seq < op->seq && !d->sticky)
            pthread_cond_wait(&g_cond, &g_lock);
        break;
    default:
        if (!d->sticky)
            xfer_locked(d, op);
        break;
    }
    if (op->ev)
        event_put_locked(op->ev);
    pthread_cond_broadcast(&g_cond);
}

/* ---- streams ------------------------------------------------------------------------ */

/* The stream with this id, if it still exists. */
static struct kcu_stream_st *stream_by_id_locked(uint64_t id)
{
    for (struct kcu_stream_st *p = g_streams; p; p = p->next)
        if (p->id == id)
            return p;
    return NULL;
}

/* Whether op's implicit legacy-stream dependencies are complete. */
static bool op_deps_done_locked(struct emu_dev *d, const struct emu_op *op)
{
    if (op->legacy_wait && d->legacy && d->legacy->done < op->legacy_wait)
        return false;
    for (size_t i = 0; i < op->nbar; i++) {
        struct kcu_stream_st *b = stream_by_id_locked(op->bar[i].id);
        if (b && b->done < op->bar[i].ticket)
            return false;
    }
    return true;
}

/* Removes s's head op, which just ran. */
static void op_pop_locked(struct kcu_stream_st *s, struct emu_op *op)
{
    s->head = op->next;
    if (!s->head)
        s->tail = NULL;
    s->done = op->ticket;
    op_free(op);
    pthread_cond_broadcast(&g_cond);
}

/* A caller about to wait for legacy-stream work runs the legacy stream's next op itself when
   it is ready (its implicit dependencies complete, not a wait still pending, the worker not
   in it): the same order and the same point in time as the worker would run it, without a
   thread hand-off per op (a synchronous-mode caller waits for each of its copies). True
   when it ran one. */
static bool legacy_help_locked(struct emu_dev *d)
{
    struct kcu_stream_st *s = d->legacy;
    struct emu_op *op = s ? s->head : NULL;
    if (!op || s->running || s->paused || !op_deps_done_locked(d, op) ||
        (op->kind == OP_WAIT && op->ev->done_seq < op->seq && !d->sticky))
        return false;
    s->running = true;             /* a copy drops the lock between chunks */
    op_exec_locked(d, op);
    s->running = false;
    op_pop_locked(s, op);
    return true;
}

static void *stream_main(void *arg)
{
    struct kcu_stream_st *s = arg;
    pthread_mutex_lock(&g_lock);
    for (;;) {
        while (s->head ? s->paused : !s->exiting)
            pthread_cond_wait(&s->cv, &g_lock);
        if (!s->head)
            break;
        struct emu_op *op = s->head;
        if (s->running || !op_deps_done_locked(s->dev, op)) {
            /* a synchronizing caller runs it (legacy_help_locked), or its dependencies
               are pending: some op completes, or a resume */
            pthread_cond_wait(&g_cond, &g_lock);
            continue;
        }
        s->running = true;
        op_exec_locked(s->dev, op);
        s->running = false;
        op_pop_locked(s, op);
    }
    if (s->detached) {
        /* cuStreamDestroy returned long ago: the drained stream goes (the device's destroy
           waits for this) */
        for (struct kcu_stream_st **pp = &g_streams; *pp; pp = &(*pp)->next)
            if (*pp == s) {
                *pp = s->next;
                break;
            }
        pthread_cond_destroy(&s->cv);
        free(s);
        pthread_cond_broadcast(&g_cond);
    }
    pthread_mutex_unlock(&g_lock);
    return NULL;
}

/* A live stream (not being destroyed), or NULL. */
static struct kcu_stream_st *stream_lookup_locked(kcu_stream s)
{
    for (struct kcu_stream_st *p = g_streams; p; p = p->next)
        if (p == s && !p->dying)
            return p;
    return NULL;
}

static struct kcu_event_st *event_lookup_locked(kcu_event e)
{
    for (struct kcu_event_st *p = g_events; p; p = p->next)
        if (p == e)
            return p;
    return NULL;
}

/* Waits until every stream of d (only blocking ones when blocking_only) has run all its
   work. A stream paused with emu_stream_set_paused blocks this forever (test hook). */
static void drain_locked(struct emu_dev *d, bool blocking_only)
{
    for (;;) {
        bool busy = false;
        for (struct kcu_stream_st *s = g_streams; s && !busy; s = s->next)
            busy = s->dev == d && s->head &&
                   !(blocking_only && (s->flags & KCU_STREAM_NON_BLOCKING));
        if (!busy)
            return;
        if (!legacy_help_locked(d))
            pthread_cond_wait(&g_cond, &g_lock);
    }
}

static void stream_wait_idle_locked(struct kcu_stream_st *s)
{
    while (s->head)
        if (!legacy_help_locked(s->dev))     /* s may wait for legacy work */
            pthread_cond_wait(&g_cond, &g_lock);
}

/* ---- stream capture ------------------------------------------------------------------ */
/* cuda.h, cuThreadExchangeStreamCaptureMode: while a capture begun in
   CU_STREAM_CAPTURE_MODE_GLOBAL is active, a thread whose mode is GLOBAL (the default), or
   THREAD_LOCAL in the capturing thread, "is prohibited from potentially unsafe API calls";
   a RELAXED thread is not. The emulated captures are GLOBAL ones. The unsafe calls emulated
   are the querying and synchronizing ones (cuEventQuery/Synchronize, cuStreamQuery/
   Synchronize, cuCtxSynchronize: what PyTorch's watchdog tripped over); a prohibited call
   fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture, as the
   driver does. */
static kcu_result capture_unsafe_locked(void)
{
    if (t_capmode == KCU_STREAM_CAPTURE_MODE_RELAXED)
        return KCU_SUCCESS;
    kcu_result r = KCU_SUCCESS;
    for (struct kcu_stream_st *s = g_streams; s; s = s->next)
        if (s->capturing && !s->invalidated &&
            (t_capmode == KCU_STREAM_CAPTURE_MODE_GLOBAL ||
             pthread_equal(s->cap_thread, pthread_self()))) {
            s->invalidated = true;
            r = KCU_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    return r;
}

/* cuda.h, cuStreamIsCapturing: "When a blocking stream is capturing, the legacy stream is
   in an unusable state until the blocking stream capture is terminated": work on it is
   CUDA_ERROR_STREAM_CAPTURE_IMPLICIT (and the capture is invalidated: an illegal
   dependency was attempted). query_only: cuStreamIsCapturing, which invalidates nothing. */
static kcu_result legacy_capture_locked(struct emu_dev *d, bool query_only)
{
    kcu_result r = KCU_SUCCESS;
    for (struct kcu_stream_st *s = g_streams; s; s = s->next)
        if (s->dev == d && s->capturing && !(s->flags & KCU_STREAM_NON_BLOCKING)) {
            if (!query_only)
                s->invalidated = true;
            r = KCU_ERROR_STREAM_CAPTURE_IMPLICIT;
        }
    return r;
}

/* The capture rules of a stream's query or synchronize: the capturing stream itself cannot
   be waited for (its work is not executed; "necessarily conflicts", in any mode), the legacy
   stream not while a blocking stream captures, and the call is an unsafe one. */
static kcu_result stream_capture_check_locked(struct kcu_stream_st *s, struct emu_dev *d)
{
    if (s && s->capturing) {
        s->invalidated = true;
        return KCU_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    kcu_result r = s ? KCU_SUCCESS : legacy_capture_locked(d, false);
    return r ? r : capture_unsafe_locked();
}

/* Per-thread, no context needed (the capture mode belongs to the thread). */
static kcu_result emu_cuThreadExchangeStreamCaptureMode(int *mode)
{
    BEGIN(cuThreadExchangeStreamCaptureMode, F_INIT);
    if (!mode || *mode < KCU_STREAM_CAPTURE_MODE_GLOBAL ||
        *mode > KCU_STREAM_CAPTURE_MODE_RELAXED) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    int old = t_capmode;
    t_capmode = *mode;
    *mode = old;
out:
    return leave(r);
}

/* Resolves the stream argument of a call: a live stream, or NULL / CU_STREAM_LEGACY /
   CU_STREAM_PER_THREAD for the default stream (needs a current context; the per-thread
   default stream is emulated as the legacy one, synchronously, which orders at least as
   strictly). KCU_ERROR_INVALID_HANDLE for an unknown stream. */
static kcu_result stream_arg_locked(kcu_stream stream, struct emu_dev *cur,
                                    struct kcu_stream_st **s, struct emu_dev **d)
{
    if (!stream || stream == KCU_STREAM_LEGACY || stream == KCU_STREAM_PER_THREAD) {
        if (!cur)
            return KCU_ERROR_INVALID_CONTEXT;
        *s = NULL;
        *d = cur;
        return KCU_SUCCESS;
    }
    if (!(*s = stream_lookup_locked(stream)))
        return KCU_ERROR_INVALID_HANDLE;
    *d = (*s)->dev;
    return (*d)->sticky;
}

static uint64_t g_stream_id;       /* last stream id handed out (g_lock) */

/* The device's legacy stream worker, made at its first use. NULL: out of memory. */
static struct kcu_stream_st *legacy_get_locked(struct emu_dev *d)
{
    if (d->legacy)
        return d->legacy;
    struct kcu_stream_st *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->dev = d;
    s->flags = KCU_STREAM_DEFAULT;
    s->legacy = true;
    s->id = ++g_stream_id;
    if (pthread_cond_init(&s->cv, NULL)) {
        free(s);
        return NULL;
    }
    if (pthread_create(&s->thread, NULL, stream_main, s)) {
        pthread_cond_destroy(&s->cv);
        free(s);
        return NULL;
    }
    s->next = g_streams;
    g_streams = s;
    d->legacy = s;
    return s;
}

/* A legacy op's barrier: the work every other blocking stream of d has queued now. */
static kcu_result legacy_barrier_locked(struct emu_dev *d, struct emu_op *op)
{
    size_t n = 0;
    for (struct kcu_stream_st *p = g_streams; p; p = p->next)
        n += p->dev == d && !p->legacy && !(p->flags & KCU_STREAM_NON_BLOCKING) &&
             p->done < p->queued;
    if (!n)
        return KCU_SUCCESS;
    if (!(op->bar = malloc(n * sizeof *op->bar)))
        return KCU_ERROR_OUT_OF_MEMORY;
    for (struct kcu_stream_st *p = g_streams; p; p = p->next)
        if (p->dev == d && !p->legacy && !(p->flags & KCU_STREAM_NON_BLOCKING) &&
            p->done < p->queued) {
            op->bar[op->nbar].id = p->id;
            op->bar[op->nbar++].ticket = p->queued;
        }
    return KCU_SUCCESS;
}

/* Queues op on s; NULL = the legacy stream, whose worker runs it after the blocking streams'
   earlier work (cuda.h: the legacy stream synchronizes with every blocking stream; the
   caller does not wait, as for any stream). Takes ownership of op. */
static kcu_result submit_locked(struct kcu_stream_st *s, struct emu_dev *d, struct emu_op *op)
{
    if (!s) {
        kcu_result r = legacy_capture_locked(d, false);
        if (!r && !(s = legacy_get_locked(d)))
            r = KCU_ERROR_OUT_OF_MEMORY;
        if (!r)
            r = legacy_barrier_locked(d, op);
        if (r) {
            if (op->ev)
                event_put_locked(op->ev);
            op_free(op);
            return r;
        }
    } else if (!(s->flags & KCU_STREAM_NON_BLOCKING) && d->legacy &&
               d->legacy->queued > d->legacy->done) {
        op->legacy_wait = d->legacy->queued;
    }
    s->submitted++;
    if (s->capturing) {
        /* captured into the (emulated) graph: not executed */
        s->captured++;
        if (op->kind == OP_EVENT)
            op->ev->captured = true;
        if (op->ev)
            event_put_locked(op->ev);
        op_free(op);
        return KCU_SUCCESS;
    }
    op->next = NULL;
    op->ticket = ++s->queued;
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    pthread_cond_signal(&s->cv);
    return KCU_SUCCESS;
}

/* True when [p, p + n) overlaps a reservation: device virtual memory, not host memory. */
static bool host_in_resv_locked(const void *p, size_t n)
{
    uintptr_t b = (uintptr_t)p;
    for (size_t i = 0; i < g_nresv; i++) {
        struct emu_resv *rv = g_resv[i];
        if (b < rv->base + rv->size && (b >= rv->base || rv->base - b < n))
            return true;
    }
    return false;
}

/* Common part of the four copy entry points. Zero bytes: success, nothing queued.
   Device ranges the driver does not know (not mapped), NULL host pointers, or a host side
   inside a reservation (a device address: on a GPU it is not host memory at all, even where
   the emulator's windows are CPU-readable): KCU_ERROR_INVALID_VALUE at call time; access is
   checked when the copy runs. */
static kcu_result copy_submit_locked(struct emu_dev *cur, kcu_stream stream, struct emu_op *tmpl)
{
    struct kcu_stream_st *s;
    struct emu_dev *d;
    kcu_result r = stream_arg_locked(stream, cur, &s, &d);
    if (r)
        return r;
    if (tmpl->n == 0)
        return KCU_SUCCESS;
    bool dw = tmpl->kind != OP_DTOH, sr = tmpl->kind == OP_DTOH || tmpl->kind == OP_DTOD;
    if ((tmpl->kind == OP_HTOD && !tmpl->hsrc) || (tmpl->kind == OP_DTOH && !tmpl->hdst) ||
        (dw && (tmpl->dst + tmpl->n < tmpl->dst || !range_known_locked(tmpl->dst, tmpl->n))) ||
        (sr && (tmpl->src + tmpl->n < tmpl->src || !range_known_locked(tmpl->src, tmpl->n))) ||
        (tmpl->kind == OP_HTOD && host_in_resv_locked(tmpl->hsrc, tmpl->n)) ||
        (tmpl->kind == OP_DTOH && host_in_resv_locked(tmpl->hdst, tmpl->n)))
        return KCU_ERROR_INVALID_VALUE;
    struct emu_op *op = malloc(sizeof *op);
    if (!op)
        return KCU_ERROR_OUT_OF_MEMORY;
    *op = *tmpl;
    /* Pageable host memory is treated like pinned memory: the copy reads or fills it when
       the stream reaches it, never at the call. The driver documents no more than "for
       transfers between device memory and pageable host memory, the function might be
       synchronous with respect to host" (CUDA Driver API, "API synchronization behavior",
       Async), so a caller that reuses a source or reads a destination before the stream
       got there is wrong on a GPU too; here it reads the wrong bytes every time. */
    return submit_locked(s, d, op);
}

static kcu_result emu_cuMemcpyHtoDAsync(kcu_deviceptr dst, const void *src, size_t bytes,
                                        kcu_stream stream)
{
    BEGIN(cuMemcpyHtoDAsync, F_INIT | F_CTX | F_STICKY);
    r = copy_submit_locked(cur, stream, &(struct emu_op){ .kind = OP_HTOD, .dst = dst,
                                                          .hsrc = src, .n = bytes });
out:
    return leave(r);
}

static kcu_result emu_cuMemcpyDtoHAsync(void *dst, kcu_deviceptr src, size_t bytes,
                                        kcu_stream stream)
{
    BEGIN(cuMemcpyDtoHAsync, F_INIT | F_CTX | F_STICKY);
    r = copy_submit_locked(cur, stream, &(struct emu_op){ .kind = OP_DTOH, .hdst = dst,
                                                          .src = src, .n = bytes });
out:
    return leave(r);
}

static kcu_result emu_cuMemcpyDtoDAsync(kcu_deviceptr dst, kcu_deviceptr src, size_t bytes,
                                        kcu_stream stream)
{
    BEGIN(cuMemcpyDtoDAsync, F_INIT | F_CTX | F_STICKY);
    r = copy_submit_locked(cur, stream, &(struct emu_op){ .kind = OP_DTOD, .dst = dst,
                                                          .src = src, .n = bytes });
out:
    return leave(r);
}

static kcu_result emu_cuMemsetD8Async(kcu_deviceptr dst, unsigned char value, size_t n,
                                      kcu_stream stream)
{
    BEGIN(cuMemsetD8Async, F_INIT | F_CTX | F_STICKY);
    r = copy_submit_locked(cur, stream, &(struct emu_op){ .kind = OP_MEMSET, .dst = dst,
                                                          .val = value, .n = n });
out:
    return leave(r);
}

static kcu_result emu_cuStreamCreate(kcu_stream *stream, unsigned int flags)
{
    BEGIN(cuStreamCreate, F_INIT | F_CTX | F_STICKY);
    if (!stream || (flags & ~(unsigned)KCU_STREAM_NON_BLOCKING)) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    struct kcu_stream_st *s = calloc(1, sizeof *s);
    if (!s) {
        r = KCU_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    s->dev = cur;
    s->flags = flags;
    s->id = ++g_stream_id;
    if (pthread_cond_init(&s->cv, NULL))
        goto out_free;
    if (pthread_create(&s->thread, NULL, stream_main, s))
        goto out_cond;
    s->next = g_streams;
    g_streams = s;
    cur->c.streams++;
    *stream = s;
    goto out;
out_cond:
    pthread_cond_destroy(&s->cv);
out_free:
    free(s);
    r = KCU_ERROR_OUT_OF_MEMORY;
out:
    return leave(r);
}

/* Stops s after its queued work ran, joins its worker and frees it. Called with g_lock held
   and s marked dying; drops the lock around the join. */
static void stream_teardown_locked(struct kcu_stream_st *s)
{
    s->exiting = true;
    s->paused = false;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&g_lock);
    pthread_join(s->thread, NULL);
    pthread_mutex_lock(&g_lock);
    for (struct kcu_stream_st **pp = &g_streams; *pp; pp = &(*pp)->next) {
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    }
    if (!s->legacy)
        s->dev->c.streams--;
    pthread_cond_destroy(&s->cv);
    free(s);
}

/* cuda.h, cuStreamDestroy: "In case the device is still doing work in the stream hStream
   when cuStreamDestroy() is called, the function will return immediately and the resources
   associated with hStream will be released automatically once the device has completed all
   work in hStream." So does the emulator: the handle is gone at once (no new work, counted
   no more), the worker drains the queue (a paused stream when resumed, or at the device's
   destroy) and frees the stream. NULL or unknown stream: KCU_ERROR_INVALID_HANDLE. */
static kcu_result emu_cuStreamDestroy(kcu_stream stream)
{
    BEGIN(cuStreamDestroy, F_INIT);
    struct kcu_stream_st *s = stream_lookup_locked(stream);
    if (!s) {
        r = KCU_ERROR_INVALID_HANDLE;
        goto out;
    }
    s->dying = true;
    s->detached = true;
    s->exiting = true;
    s->dev->c.streams--;
    pthread_detach(s->thread);
    pthread_cond_signal(&s->cv);
out:
    return leave(r);
}

static kcu_result emu_cuStreamSynchronize(kcu_stream stream)
{
    BEGIN(cuStreamSynchronize, F_INIT);
    struct kcu_stream_st *s;
    struct emu_dev *d;
    if ((r = stream_arg_locked(stream, cur, &s, &d)) || (r = stream_capture_check_locked(s, d)))
        goto out;
    if (s)
        stream_wait_idle_locked(s);
    else
        drain_locked(d, true);
    r = d->sticky;
out:
    return leave(r);
}

static kcu_result emu_cuStreamQuery(kcu_stream stream)
{
    BEGIN(cuStreamQuery, F_INIT);
    struct kcu_stream_st *s;
    struct emu_dev *d;
    if ((r = stream_arg_locked(stream, cur, &s, &d)) || (r = stream_capture_check_locked(s, d)))
        goto out;
    if (s) {
        r = s->head ? KCU_ERROR_NOT_READY : KCU_SUCCESS;
    } else {
        for (struct kcu_stream_st *p = g_streams; p; p = p->next)
            if (p->dev == d && p->head && !(p->flags & KCU_STREAM_NON_BLOCKING))
                r = KCU_ERROR_NOT_READY;
    }
out:
    return leave(r);
}

/* Waits for the event's most recent record at the time of the call; an event never
   recorded is no dependency. flags != 0: KCU_ERROR_INVALID_VALUE. */
static kcu_result emu_cuStreamWaitEvent(kcu_stream stream, kcu_event event, unsigned int flags)
{
    BEGIN(cuStreamWaitEvent, F_INIT);
    struct kcu_stream_st *s;
    struct emu_dev *d;
    struct kcu_event_st *ev = event_lookup_locked(event);
    if ((r = stream_arg_locked(stream, cur, &s, &d)))
        goto out;
    if (!ev) {
        r = KCU_ERROR_INVALID_HANDLE;
        goto out;
    }
    if (flags != 0) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    if (ev->captured && !(s && s->capturing)) {
        /* recorded inside a capture: a graph node, never executed; a wait from outside
           would cross the capture boundary (cuda.h, CUDA_ERROR_STREAM_CAPTURE_ISOLATION) */
        r = KCU_ERROR_STREAM_CAPTURE_ISOLATION;
        goto out;
    }
    if (ev->rec_seq == 0 || ev->done_seq >= ev->rec_seq)
        goto out;
    struct emu_op *op = malloc(sizeof *op);
    if (!op) {
        r = KCU_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    *op = (struct emu_op){ .kind = OP_WAIT, .ev = ev, .seq = ev->rec_seq };
    ev->refs++;
    r = submit_locked(s, d, op);
out:
    return leave(r);
}

/* The context a stream belongs to: its device's primary context; the default stream
   handles belong to the current context (KCU_ERROR_INVALID_CONTEXT without one). */
static kcu_result emu_cuStreamGetCtx(kcu_stream stream, kcu_context *ctx)
{
    BEGIN(cuStreamGetCtx, F_INIT);
    struct kcu_stream_st *s;
    struct emu_dev *d;
    if (!ctx) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    if ((r = stream_arg_locked(stream, cur, &s, &d)))
        goto out;
    *ctx = &g_ctx[d->ordinal];
out:
    return leave(r);
}

static kcu_result emu_cuStreamIsCapturing(kcu_stream stream, int *status)
{
    BEGIN(cuStreamIsCapturing, F_INIT);
    struct kcu_stream_st *s;
    struct emu_dev *d;
    if (!status) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    if ((r = stream_arg_locked(stream, cur, &s, &d)))
        goto out;
    if (!s && (r = legacy_capture_locked(d, true)))
        goto out;
    *status = !s || !s->capturing ? KCU_STREAM_CAPTURE_STATUS_NONE
              : s->invalidated   ? KCU_STREAM_CAPTURE_STATUS_INVALIDATED
                                 : KCU_STREAM_CAPTURE_STATUS_ACTIVE;
out:
    return leave(r);
}

static kcu_result emu_cuCtxSynchronize(void)
{
    BEGIN(cuCtxSynchronize, F_INIT | F_CTX);
    if ((r = capture_unsafe_locked()))
        goto out;
    drain_locked(cur, false);
    r = cur->sticky;
out:
    return leave(r);
}

/* ---- events ------------------------------------------------------------------------- */

/* Flags: DEFAULT, BLOCKING_SYNC (1), DISABLE_TIMING (2), INTERPROCESS (4); others
   KCU_ERROR_INVALID_VALUE. */
static kcu_result emu_cuEventCreate(kcu_event *event, unsigned int flags)
{
    BEGIN(cuEventCreate, F_INIT | F_CTX | F_STICKY);
    if (!event || (flags & ~7u)) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    struct kcu_event_st *ev = calloc(1, sizeof *ev);
    if (!ev) {
        r = KCU_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    ev->dev = cur;
    ev->flags = flags;
    ev->refs = 1;
    ev->next = g_events;
    g_events = ev;
    cur->c.events++;
    *event = ev;
out:
    return leave(r);
}

static void event_unlink_locked(struct kcu_event_st *ev)
{
    for (struct kcu_event_st **pp = &g_events; *pp; pp = &(*pp)->next) {
        if (*pp == ev) {
            *pp = ev->next;
            break;
        }
    }
    ev->dev->c.events--;
}

/* A pending record is allowed (its resources go when it completes), as in the driver. */
static kcu_result emu_cuEventDestroy(kcu_event event)
{
    BEGIN(cuEventDestroy, F_INIT);
    struct kcu_event_st *ev = event_lookup_locked(event);
    if (!ev) {
        r = KCU_ERROR_INVALID_HANDLE;
        goto out;
    }
    event_unlink_locked(ev);
    event_put_locked(ev);
out:
    return leave(r);
}

/* Event and stream must belong to the same device: else KCU_ERROR_INVALID_HANDLE. */
static kcu_result emu_cuEventRecord(kcu_event event, kcu_stream stream)
{
    BEGIN(cuEventRecord, F_INIT);
    struct kcu_stream_st *s;
    struct emu_dev *d;
    struct kcu_event_st *ev = event_lookup_locked(event);
    if (!ev) {
        r = KCU_ERROR_INVALID_HANDLE;
        goto out;
    }
    if ((r = stream_arg_locked(stream, cur, &s, &d)))
        goto out;
    if (d != ev->dev) {
        r = KCU_ERROR_INVALID_HANDLE;
        goto out;
    }
    struct emu_op *op = malloc(sizeof *op);
    if (!op) {
        r = KCU_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    *op = (struct emu_op){ .kind = OP_EVENT, .ev = ev, .seq = ++ev->rec_seq };
    ev->refs++;
    ev->captured = false;          /* set again by submit_locked if s is capturing */
    r = submit_locked(s, d, op);
out:
    return leave(r);
}

static kcu_result emu_cuEventQuery(kcu_event event)
{
    BEGIN(cuEventQuery, F_INIT);
    struct kcu_event_st *ev = event_lookup_locked(event);
    if (!ev)
        r = KCU_ERROR_INVALID_HANDLE;
    else if (ev->captured)
        r = KCU_ERROR_STREAM_CAPTURE_UNSUPPORTED;   /* recorded inside a capture */
    else if ((r = capture_unsafe_locked()))
        ;
    else if (ev->dev->sticky)
        r = ev->dev->sticky;
    else if (ev->done_seq < ev->rec_seq)
        r = KCU_ERROR_NOT_READY;
out:
    return leave(r);
}

static kcu_result emu_cuEventSynchronize(kcu_event event)
{
    BEGIN(cuEventSynchronize, F_INIT);
    struct kcu_event_st *ev = event_lookup_locked(event);
    if (!ev) {
        r = KCU_ERROR_INVALID_HANDLE;
        goto out;
    }
    if (ev->captured) {
        r = KCU_ERROR_STREAM_CAPTURE_UNSUPPORTED;   /* recorded inside a capture */
        goto out;
    }
    if ((r = capture_unsafe_locked()))
        goto out;
    ev->refs++;                    /* survive a concurrent cuEventDestroy */
    uint64_t want = ev->rec_seq;
    while (ev->done_seq < want && !ev->dev->sticky)
        if (!legacy_help_locked(ev->dev))
            pthread_cond_wait(&g_cond, &g_lock);
    r = ev->dev->sticky;
    event_put_locked(ev);
out:
    return leave(r);
}

/* ---- host memory -------------------------------------------------------------------- */

static void memlock_warn_locked(size_t bytes, int err)
{
    if (g_memlock_warned)
        return;
    g_memlock_warned = true;
    struct rlimit rl;
    char lim[32] = "unknown";
    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
        if (rl.rlim_cur == RLIM_INFINITY)
            snprintf(lim, sizeof lim, "unlimited");
        else
            snprintf(lim, sizeof lim, "%llu bytes", (unsigned long long)rl.rlim_cur);
    }
    klog_warn("emulated device: mlock of %zu bytes of pinned host memory failed (%s); "
              "RLIMIT_MEMLOCK is %s: pinned memory stays pageable (raise it with ulimit -l or "
              "limits.conf). Warned once.", bytes, strerror(err), lim);
}

static struct emu_host *host_overlap_locked(const unsigned char *p, size_t n)
{
    for (struct emu_host *h = g_hosts; h; h = h->next)
        if (p < h->p + h->n && h->p < p + n)
            return h;
    return NULL;
}

static void host_remove_locked(struct emu_host *x)
{
    for (struct emu_host **pp = &g_hosts; *pp; pp = &(*pp)->next) {
        if (*pp == x) {
            *pp = x->next;
            return;
        }
    }
}

static void host_release_locked(struct emu_host *h)
{
    if (h->alloc) {
        munmap(h->p, h->n);        /* also unlocks */
        h->dev->c.host_allocs--;
        h->dev->c.host_alloc_bytes -= h->n;
    } else {
        if (h->locked)
            munlock(h->p, h->n);
        h->dev->c.host_registered--;
        h->dev->c.host_registered_bytes -= h->n;
    }
    free(h);
}

/* Pins a new host range (mlock, best effort: a warning when RLIMIT_MEMLOCK refuses) and
   tracks it, counted as an allocation or a registration. */
static void host_pin_locked(struct emu_host *h)
{
    if (mlock(h->p, h->n) == 0)
        h->locked = true;
    else
        memlock_warn_locked(h->n, errno);
    h->next = g_hosts;
    g_hosts = h;
    if (h->alloc) {
        h->dev->c.host_allocs++;
        h->dev->c.host_alloc_bytes += h->n;
    } else {
        h->dev->c.host_registered++;
        h->dev->c.host_registered_bytes += h->n;
    }
}

static kcu_result emu_cuMemAllocHost(void **pp, size_t bytes)
{
    BEGIN(cuMemAllocHost, F_INIT | F_CTX | F_STICKY);
    if (!pp || bytes == 0) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    struct emu_host *h = calloc(1, sizeof *h);
    if (!h) {
        r = KCU_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        free(h);
        r = KCU_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    *h = (struct emu_host){ .dev = cur, .p = p, .n = bytes, .alloc = true };
    host_pin_locked(h);
    *pp = p;
out:
    return leave(r);
}

/* Like the driver, freeing pinned memory first waits for the device's work. A pointer that
   cuMemAllocHost did not return: KCU_ERROR_INVALID_VALUE. */
static kcu_result emu_cuMemFreeHost(void *p)
{
    BEGIN(cuMemFreeHost, F_INIT);
    struct emu_host *h = NULL;
    for (struct emu_host *x = g_hosts; x; x = x->next)
        if (x->alloc && x->p == p)
            h = x;
    if (!h) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    drain_locked(h->dev, false);
    host_remove_locked(h);
    host_release_locked(h);
out:
    return leave(r);
}

/* Flags: PORTABLE, DEVICEMAP, IOMEMORY, READ_ONLY (1, 2, 4, 8); others, NULL or 0 bytes:
   KCU_ERROR_INVALID_VALUE. Overlap with a registered or cuMemAllocHost range:
   KCU_ERROR_HOST_MEMORY_ALREADY_REGISTERED. */
static kcu_result emu_cuMemHostRegister(void *p, size_t bytes, unsigned int flags)
{
    BEGIN(cuMemHostRegister, F_INIT | F_CTX | F_STICKY);
    if (!p || bytes == 0 || (flags & ~15u)) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    if (host_overlap_locked(p, bytes)) {
        r = KCU_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
        goto out;
    }
    struct emu_host *h = calloc(1, sizeof *h);
    if (!h) {
        r = KCU_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    *h = (struct emu_host){ .dev = cur, .p = p, .n = bytes };
    host_pin_locked(h);
out:
    return leave(r);
}

/* p must be the start of a registration: else KCU_ERROR_HOST_MEMORY_NOT_REGISTERED. */
static kcu_result emu_cuMemHostUnregister(void *p)
{
    BEGIN(cuMemHostUnregister, F_INIT);
    struct emu_host *h = NULL;
    for (struct emu_host *x = g_hosts; x; x = x->next)
        if (!x->alloc && x->p == p)
            h = x;
    if (!h) {
        r = KCU_ERROR_HOST_MEMORY_NOT_REGISTERED;
        goto out;
    }
    host_remove_locked(h);
    host_release_locked(h);
out:
    return leave(r);
}

/* CU_POINTER_ATTRIBUTE_MEMORY_TYPE only (others: KCU_ERROR_INVALID_VALUE, undocumented):
   HOST inside a pinned host range (cuMemAllocHost, cuMemHostRegister), DEVICE at a mapped
   device address, else KCU_ERROR_INVALID_VALUE ("not allocated by, mapped by, or
   registered with a CUcontext": pageable memory, as the driver says). */
static kcu_result emu_cuPointerGetAttribute(void *data, int attribute, kcu_deviceptr ptr)
{
    BEGIN(cuPointerGetAttribute, F_INIT | F_CTX);
    if (!data || attribute != KCU_POINTER_ATTRIBUTE_MEMORY_TYPE) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    const unsigned char *b = (const unsigned char *)(uintptr_t)ptr;
    unsigned type = 0;
    for (struct emu_host *h = g_hosts; h && !type; h = h->next)
        if (b >= h->p && (size_t)(b - h->p) < h->n)
            type = KCU_MEMORYTYPE_HOST;
    if (!type && range_known_locked(ptr, 1))
        type = KCU_MEMORYTYPE_DEVICE;
    if (!type)
        r = KCU_ERROR_INVALID_VALUE;
    else
        *(unsigned *)data = type;
out:
    return leave(r);
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

/* ---- test API: devices, counters, lookup, faults, tracing, stream hooks -------------- */

/* Arms the failures of KVVM_EMU_FAIL ("entry:nth:err,..."); malformed items are logged
   and skipped. */
static void fail_env_locked(void)
{
    const char *e = getenv("KVVM_EMU_FAIL");
    if (!e || !*e)
        return;
    char *copy = strdup(e), *save = NULL;
    if (!copy)
        return;
    for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char name[64];
        unsigned long nth;
        int err, used = 0;
        int entry = -1;
        if (sscanf(item, " %63[^:]:%lu:%d%n", name, &nth, &err, &used) == 3 &&
            item[used] == '\0') {
            for (int i = 0; i < E_COUNT; i++)
                if (!strcmp(entry_names[i], name))
                    entry = i;
        }
        struct emu_fault *f = NULL;
        if (entry < 0 || nth == 0 || err == 0 || !(f = malloc(sizeof *f))) {
            klog_error("KVVM_EMU_FAIL: '%s' is not entry:nth:err (a driver entry point, "
                       "nth >= 1, a nonzero CUresult); ignored", item);
            continue;
        }
        *f = (struct emu_fault){ .entry = entry, .left = nth, .err = err, .next = g_faults };
        g_faults = f;
    }
    free(copy);
}

int emu_device_create(const struct emu_device_params *p, int *ordinal)
{
    if (!p || !ordinal)
        return -EINVAL;
    create_cost_read();
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
    d->max_maps = p->max_maps ? p->max_maps : default_max_maps();
    d->bitmap = calloc((d->ngran + 63) / 64, sizeof *d->bitmap);
    if (!d->bitmap)
        goto out_dev;
    d->memfd = memfd_create("kvvm-emu-device", MFD_CLOEXEC);
    if (d->memfd < 0)
        goto out_bitmap;
    if (ftruncate(d->memfd, (off_t)cap) != 0)
        goto out_fd;
    d->view = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, d->memfd, 0);
    if (d->view == MAP_FAILED)
        goto out_fd;

    pthread_mutex_lock(&g_lock);
    if (!g_env_read) {
        g_env_read = true;
        fail_env_locked();
    }
    int slot = -1;
    for (int i = 0; i < EMU_MAX_DEVICES && slot < 0; i++)
        if (!g_devs[i])
            slot = i;
    if (slot < 0) {
        pthread_mutex_unlock(&g_lock);
        munmap(d->view, cap);
        goto out_fd;
    }
    d->ordinal = slot;
    g_devs[slot] = d;
    pthread_mutex_unlock(&g_lock);
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

int emu_device_destroy(int ordinal)
{
    pthread_mutex_lock(&g_lock);
    struct emu_dev *d = dev_get_locked(ordinal);
    if (!d) {
        pthread_mutex_unlock(&g_lock);
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
    /* Streams first: their workers finish their queues (they may touch our memory). */
    for (;;) {
        struct kcu_stream_st *s = g_streams;
        while (s && (s->dev != d || s->dying || s->legacy))
            s = s->next;
        if (!s)
            break;
        klog_error("emulated device %d: leaked stream %p", ordinal, (void *)s);
        leaks++;
        s->dying = true;
        stream_teardown_locked(s);
    }
    /* and the streams destroyed earlier drain (paused ones are resumed) and go */
    for (;;) {
        bool any = false;
        for (struct kcu_stream_st *s = g_streams; s; s = s->next)
            if (s->dev == d && s->detached) {
                any = true;
                s->paused = false;
                pthread_cond_signal(&s->cv);
            }
        if (!any)
            break;
        pthread_cond_wait(&g_cond, &g_lock);
    }
    if (d->legacy) {                 /* the legacy stream's worker last (not a handle) */
        struct kcu_stream_st *s = d->legacy;
        d->legacy = NULL;
        s->dying = true;
        stream_teardown_locked(s);
    }
    for (struct kcu_event_st **pp = &g_events; *pp;) {
        struct kcu_event_st *ev = *pp;
        if (ev->dev != d) {
            pp = &ev->next;
            continue;
        }
        klog_error("emulated device %d: leaked event %p", ordinal, (void *)ev);
        leaks++;
        event_unlink_locked(ev);
        event_put_locked(ev);
    }
    /* Mappings of this device's memory, wherever they are. */
    for (size_t k = 0; k < g_nresv; k++) {
        struct emu_resv *rv = g_resv[k];
        for (size_t i = 0; i < rv->ngran; i++) {
            struct emu_ent *e = ent_get(rv, i);
            if (!e || !e->h1 || g_h[e->h1 - 1].dev != d)
                continue;
            size_t j = i;
            while (j < rv->ngran && ent_map_id(rv, j) == e->map_id)
                j++;
            klog_error("emulated device %d: leaked mapping of %zu bytes at 0x%lx", ordinal,
                       (j - i) * rv->gran, (unsigned long)(rv->base + i * rv->gran));
            leaks++;
            mmap((void *)(rv->base + i * rv->gran), (j - i) * rv->gran, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
            unmap_entries_locked(rv, i, j - i);
            i = j - 1;
        }
    }
    for (size_t k = 0; k < g_nresv;) {
        struct emu_resv *rv = g_resv[k];
        if (rv->owner != d) {
            k++;
            continue;
        }
        klog_error("emulated device %d: leaked reservation of %zu bytes at 0x%lx", ordinal,
                   rv->size, (unsigned long)rv->base);
        leaks++;
        /* Mappings of other devices' memory inside it go with it. */
        unmap_entries_locked(rv, 0, rv->ngran);
        munmap((void *)rv->base, rv->size);
        resv_remove_locked(rv);
        resv_free_mem(rv);
    }
    for (size_t i = 0; i < g_h_cap; i++) {
        if (g_h[i].dev != d)
            continue;
        klog_error("emulated device %d: leaked handle of %zu bytes", ordinal,
                   g_h[i].ngran * d->gran);
        leaks++;
        g_h[i].released = true;
        handle_maybe_free_locked(i);
    }
    for (struct emu_host *h = g_hosts, *next; h; h = next) {
        next = h->next;
        if (h->dev != d)
            continue;
        klog_error("emulated device %d: leaked pinned host range of %zu bytes at %p (%s)",
                   ordinal, h->n, (void *)h->p, h->alloc ? "cuMemAllocHost" :
                   "cuMemHostRegister");
        leaks++;
        host_remove_locked(h);
        host_release_locked(h);
    }
    g_devs[ordinal] = NULL;
    g_ctx[ordinal].gen++;
    pthread_cond_broadcast(&g_cond);
    pthread_mutex_unlock(&g_lock);
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
    pthread_mutex_lock(&g_lock);
    struct emu_dev *d = dev_get_locked(ordinal);
    if (d)
        *out = d->c;
    pthread_mutex_unlock(&g_lock);
    return d ? 0 : -ENODEV;
}

int emu_lookup(kcu_deviceptr va, kcu_mem_handle *handle, size_t *offset, int *access)
{
    int ret = -ENOENT;
    pthread_mutex_lock(&g_lock);
    struct emu_resv *rv = resv_find_locked((uintptr_t)va);
    if (rv) {
        size_t idx = ((uintptr_t)va - rv->base) / rv->gran;
        struct emu_ent *e = ent_get(rv, idx);
        if (e && e->h1) {
            if (handle)
                *handle = handle_value(e->h1 - 1);
            if (offset)
                *offset = e->off * rv->gran + ((uintptr_t)va - rv->base) % rv->gran;
            if (access)
                *access = (int)e->access;
            ret = 0;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return ret;
}

int emu_fail_arm(const char *entry, unsigned long nth, kcu_result err)
{
    if (!entry || nth == 0 || err == KCU_SUCCESS)
        return -EINVAL;
    int e = -1;
    for (int i = 0; i < E_COUNT; i++)
        if (!strcmp(entry_names[i], entry))
            e = i;
    if (e < 0)
        return -EINVAL;
    struct emu_fault *f = malloc(sizeof *f);
    if (!f)
        return -ENOMEM;
    pthread_mutex_lock(&g_lock);
    *f = (struct emu_fault){ .entry = e, .left = nth, .err = err, .next = g_faults };
    g_faults = f;
    pthread_mutex_unlock(&g_lock);
    return 0;
}

void emu_fail_clear(void)
{
    pthread_mutex_lock(&g_lock);
    while (g_faults) {
        struct emu_fault *f = g_faults;
        g_faults = f->next;
        free(f);
    }
    pthread_mutex_unlock(&g_lock);
}

void emu_trace_start(void)
{
    pthread_mutex_lock(&g_lock);
    g_trace_n = 0;
    memset(g_trace_occ, 0, sizeof g_trace_occ);
    g_tracing = true;
    pthread_mutex_unlock(&g_lock);
}

size_t emu_trace_stop(struct emu_trace_entry *out, size_t max)
{
    pthread_mutex_lock(&g_lock);
    g_tracing = false;
    size_t n = g_trace_n;
    if (out)
        memcpy(out, g_trace, min_sz(n, max) * sizeof *out);
    g_trace_n = 0;
    pthread_mutex_unlock(&g_lock);
    return n;
}

int emu_stream_set_capturing(kcu_stream stream, int on)
{
    pthread_mutex_lock(&g_lock);
    struct kcu_stream_st *s = stream_lookup_locked(stream);
    if (s) {
        s->capturing = on != 0;
        s->invalidated = false;
        s->cap_thread = pthread_self();
    }
    pthread_mutex_unlock(&g_lock);
    return s ? 0 : -EINVAL;
}

int emu_stream_counts(kcu_stream stream, uint64_t *submitted, uint64_t *captured)
{
    pthread_mutex_lock(&g_lock);
    struct kcu_stream_st *s = stream_lookup_locked(stream);
    if (s && submitted)
        *submitted = s->submitted;
    if (s && captured)
        *captured = s->captured;
    pthread_mutex_unlock(&g_lock);
    return s ? 0 : -EINVAL;
}

int emu_stream_set_paused(kcu_stream stream, int on)
{
    pthread_mutex_lock(&g_lock);
    struct kcu_stream_st *s = NULL;    /* a destroyed stream still draining too */
    for (struct kcu_stream_st *p = g_streams; p && !s; p = p->next)
        if (p == stream)
            s = p;
    if (s) {
        s->paused = on != 0;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&g_lock);
    return s ? 0 : -EINVAL;
}
