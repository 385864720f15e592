/*
 * vmm/vmm.h: device virtual memory over the driver table (cudrv.h).
 *
 * Contract:
 *  - One struct vmm = one device (its primary context retained) and one reserved virtual
 *    range. It knows physical handles, mappings, streams, fences and copies; it knows nothing
 *    of pages' owners, sequences or policy (those are paging/ and swap/).
 *  - Every multi-step operation is all-or-nothing: if step k of n fails, steps 1..k-1 are
 *    undone, nothing leaks, and the error is returned.
 *  - It never dereferences a device address: bytes move only through the driver's copies.
 *  - Errors are negative errno: -EINVAL bad argument (a bug in the caller), -ENOMEM device
 *    memory or mappings exhausted, -ENODEV no usable device, -EIO a driver failure (sticky
 *    errors mark the vmm dead: vmm_dead() then returns true and every call returns -EIO),
 *    -EBUSY a call a graph capture forbids (CUDA_ERROR_STREAM_CAPTURE_*: not a failure of
 *    the device).
 *    Every driver failure is logged with the entry point and the driver's error name.
 *  - Thread-safe in the sense of the driver: calls may come from any thread; vmm_* functions
 *    make the device's context current on the calling thread themselves.
 */
#ifndef KVVM_VMM_VMM_H
#define KVVM_VMM_VMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kvvm.h"
#include "cudrv.h"

struct vmm;

struct vmm_params {
    enum kvvm_backend backend;  /* AUTO: docs/api.md "Backend choice" */
    int    device;              /* CUDA ordinal (ignored on the emulated device) */
    size_t emu_capacity;        /* emulated device bytes */
    size_t emu_granule;         /* emulated granule; 0 = 2 MiB */
    int    emu_opaque;          /* emulated windows not CPU-accessible */
    int    shareable;           /* vmm_phys_create makes exportable handles (POSIX file
                                   descriptors: vmm_handle_export), e.g. the pool daemon's */
};

/* Physical handle of one page (typed so it cannot be mixed with addresses). */
typedef struct { kcu_mem_handle h; } vmm_handle;
/* A point in a stream's work: complete once everything enqueued before it has run. */
typedef struct { kcu_event ev; } vmm_fence;

/* Opens the driver (cuda: dlopen of KVVM_CUDA_LIBRARY or libcuda.so.1; emulated: a new
   emulated device), initializes it, checks VMM support, retains the primary context.
   -ENODEV no usable device (AUTO fell through, or CUDA asked and missing), -ENOMEM, -EIO. */
int vmm_open(const struct vmm_params *p, struct vmm **out);
/* Synchronizes, releases the context and (emulated) destroys the device. The caller must
   have released its handles, mappings, streams and fences first; leftovers are logged.
   The calling thread's current context is left as it was at the call (vmm_close), or set
   to prev (vmm_close_to: the context a caller saved before its own earlier calls). */
void vmm_close(struct vmm *v);
void vmm_close_to(struct vmm *v, kcu_context prev);

const char *vmm_backend_name(const struct vmm *v);    /* "cuda" or "emulated" */
const struct kcu_api *vmm_api(const struct vmm *v);   /* the driver table in use */
size_t vmm_granule(const struct vmm *v);
size_t vmm_device_bytes(const struct vmm *v);         /* total device memory */
int    vmm_emu_ordinal(const struct vmm *v);          /* emulated device ordinal, or -1 */
bool   vmm_dead(const struct vmm *v);                 /* a sticky driver error was seen */
/* The word vmm_dead reads (nonzero: dead), for a hot path that reads it without a call
   (__atomic_load_n, acquire). Valid for v's lifetime. */
const int *vmm_dead_word(const struct vmm *v);
/* Makes the device context current on the calling thread (library threads call this once). */
int vmm_make_current(struct vmm *v);
/* Sets the calling thread's stream capture mode to relaxed (library threads call this once):
   in the default global mode, a thread's event query or synchronize during another
   thread's graph capture is prohibited and invalidates that capture. -EIO. */
int vmm_thread_capture_relaxed(struct vmm *v);
/* The caller's current context, saved and restored around kvvm_open and kvvm_close, so
   libkvvm never leaves its context current in the engine's thread (works on a dead vmm
   too, so a close can restore it). -EIO. */
int  vmm_ctx_save(struct vmm *v, kcu_context *prev);
void vmm_ctx_restore(struct vmm *v, kcu_context prev);
/* The same around any other public call, lazily: vmm_call_begin arms the calling thread;
   the first entry point of the call that must make our context current saves the caller's
   (so a call that makes no driver call makes none for the context either); vmm_call_end
   restores it when one was saved, dead vmm or not. Library threads never arm (they keep
   our context current). Public calls do not nest on a thread. */
void vmm_call_begin(void);
void vmm_call_end(struct vmm *v);

/* The one reserved virtual range: bytes rounded up to the granule. -ENOMEM, -EIO. */
int  vmm_reserve(struct vmm *v, size_t bytes, uint64_t *base);
void vmm_unreserve(struct vmm *v);                    /* all mappings must be gone */
uint64_t vmm_reserved_base(const struct vmm *v);
size_t   vmm_reserved_bytes(const struct vmm *v);

/* Free and total memory of the device as the driver reports them now (cuMemGetInfo: memory
   held by other processes and by other users of this process, e.g. PyTorch, is not free).
   -EINVAL NULL, -EIO. */
int  vmm_mem_info(struct vmm *v, size_t *free_bytes, size_t *total);

/* Physical pages. bytes: a multiple of the granule. -ENOMEM device full (the device's memory
   is short of the budget: logged once at info, not as an error, and counted), -EIO. */
int  vmm_phys_create(struct vmm *v, size_t bytes, vmm_handle *out);
/* True when the driver refused one cuMemUnmap over several adjacent mappings at open (the
   CUDA backend probes it): vmm_unmap then makes one call per mapping. */
bool vmm_unmaps_each(const struct vmm *v);
/* cuMemCreate out-of-memory failures so far. */
uint64_t vmm_create_ooms(const struct vmm *v);
/* Release: 0, or -EIO when the driver refused (the handle is still the caller's). */
int  vmm_phys_release(struct vmm *v, vmm_handle h);

/* Shareable handles (vmm/share.c), POSIX file descriptors: what the pool daemon hands its
   clients. vmm_handle_export: a new descriptor of h (the caller's to close); h must have
   been made by a vmm opened with params.shareable (else -EINVAL, the driver's refusal).
   vmm_handle_import: a handle of this device for the allocation fd names (bytes: its size,
   a multiple of the granule), in this process or another; release it with
   vmm_phys_release. The import takes fd over, whatever the outcome (fd >= 0): the caller
   never uses or closes fd after the call. On success the emulated device's handle keeps fd
   as its allocation's descriptor (no dup; the release closes it) and on CUDA fd is closed
   after cuMemImportFromShareableHandle (the driver keeps the allocation); on any failure
   fd is closed before the return. fd < 0: -EINVAL, nothing closed. The allocation lives
   while any process holds a handle or a mapping of it, whoever released first. -EINVAL,
   -ENOMEM, -EIO.
   vmm_handles_import: n imports in one call, fds[i] as out[i], each taken over as by
   vmm_handle_import; it stops at the first failure: *done handles made (out[0..*done), the
   caller's to release), the descriptors from the failed one on closed. Any fds[i] < 0:
   -EINVAL, nothing closed, nothing made. */
int  vmm_handle_export(struct vmm *v, vmm_handle h, int *fd);
int  vmm_handle_import(struct vmm *v, int fd, size_t bytes, vmm_handle *out);
int  vmm_handles_import(struct vmm *v, const int *fds, size_t n, size_t bytes,
                        vmm_handle *out, size_t *done);

/* Maps n pages of page_size bytes at va, va + page_size, ... with one set-access (read and
   write) over the whole run. va inside the reservation, page-aligned, the range unmapped.
   All or nothing. -EINVAL, -ENOMEM (mapping bound), -EIO. */
int vmm_map_run(struct vmm *v, uint64_t va, const vmm_handle *pages, size_t n,
                size_t page_size);
/* Unmaps [va, va + bytes), which must be whole mappings: one cuMemUnmap, or one per mapping
   where the driver refused a span at open (vmm_unmaps_each; a failure then leaves the
   mappings from the failing one on mapped). The caller has waited for every fence of work
   that may touch the range. -EINVAL, -EIO. */
int vmm_unmap(struct vmm *v, uint64_t va, size_t bytes);

/* Streams. vmm_stream_create makes a non-blocking stream of this device. */
int vmm_stream_create(struct vmm *v, kcu_stream *out);
int vmm_stream_destroy(struct vmm *v, kcu_stream s);
int vmm_stream_sync(struct vmm *v, kcu_stream s);
/* -EBUSY when s is capturing a CUDA graph. */
int vmm_stream_check_capture(struct vmm *v, kcu_stream s);
/* -EINVAL when s belongs to another context than this device's (another device's stream,
   or a stream of a context the caller created itself): our events and copies could not be
   ordered on it. The legacy default-stream handles (NULL, CU_STREAM_LEGACY) belong to the
   current context. The per-thread default stream (CU_STREAM_PER_THREAD) is -EINVAL: it
   names each calling thread's own stream, so the library's threads could order nothing
   against the engine's. */
int vmm_stream_check_owner(struct vmm *v, kcu_stream s);
int vmm_device_sync(struct vmm *v);

/* Fences (events). record: the fence completes after all work enqueued on s so far.
   query: 1 complete, 0 not yet, <0 error. wait: blocks the CPU. after: s waits for f on the
   device (the CPU does not). */
int  vmm_fence_create(struct vmm *v, vmm_fence *f);
/* Makes sure at least n (at most VMM_SPARE_FENCES) spare fences exist, which
   vmm_fence_create hands out before it asks the driver: a call creates the fences its
   moves and its own work will make before it moves anything (a refused cuEventCreate then
   fails it with nothing changed). -ENOMEM, -EIO. */
#define VMM_SPARE_FENCES 64u
int  vmm_fence_reserve(struct vmm *v, unsigned n);
void vmm_fence_destroy(struct vmm *v, vmm_fence *f);
int  vmm_fence_record(struct vmm *v, vmm_fence *f, kcu_stream s);
int  vmm_fence_query(struct vmm *v, const vmm_fence *f);
int  vmm_fence_wait(struct vmm *v, const vmm_fence *f);
int  vmm_stream_after(struct vmm *v, kcu_stream s, const vmm_fence *f);

/* Asynchronous copies on stream s (NULL = the default stream, synchronous w.r.t. the host
   for our purposes only after vmm_stream_sync). Counted by the driver. -EINVAL, -EIO. */
int vmm_copy_htod(struct vmm *v, uint64_t dst, const void *src, size_t n, kcu_stream s);
int vmm_copy_dtoh(struct vmm *v, void *dst, uint64_t src, size_t n, kcu_stream s);
int vmm_copy_dtod(struct vmm *v, uint64_t dst, uint64_t src, size_t n, kcu_stream s);
int vmm_memset(struct vmm *v, uint64_t dst, unsigned char value, size_t n, kcu_stream s);

/* Pinned host memory: allocate (cuMemAllocHost) or register existing memory
   (cuMemHostRegister; a refusal is logged as a warning, not an error: the host arena falls
   back to pageable memory). -ENOMEM, -EINVAL, -EIO. */
int  vmm_host_alloc(struct vmm *v, size_t bytes, void **out);
void vmm_host_free(struct vmm *v, void *p);
int  vmm_host_register(struct vmm *v, void *p, size_t bytes);
void vmm_host_unregister(struct vmm *v, void *p);
/* Whether the driver knows [p, p + n) as pinned host memory (its first and last byte):
   1 yes, 0 no (pageable memory: not an error, nothing logged), -EIO. */
int  vmm_host_pinned(struct vmm *v, const void *p, size_t n);
/* Whether the driver knows p as device memory (a device address handed where host memory is
   expected): 1 yes, 0 no or unknown (the query's failure is no error: nothing logged, the
   copy that follows reports its own). */
int  vmm_ptr_is_device(struct vmm *v, const void *p);

/* Debug view of the driver's own tables, for the invariant checker (paging/check.c): what
   the library's bookkeeping can be checked against. Only the emulated device can answer
   (the driver table's debug hooks, struct kcu_debug); on CUDA the answer is "unknown",
   -EOPNOTSUPP, and the checker skips those checks.
   vmm_debug_mapping: what is mapped at va (out may be NULL): 0 mapped, -ENOENT unmapped,
   -EOPNOTSUPP unknown. vmm_debug_objects: the driver's live handles, their bytes and the
   mapped bytes of this device: 0, -EOPNOTSUPP. */
struct vmm_debug_mapping {
    vmm_handle h;               /* the handle mapped there */
    size_t offset;              /* bytes from the handle's start to va */
    int access;                 /* KCU_MEM_ACCESS_FLAGS_* */
};
struct vmm_debug_objects {
    uint64_t handles, handle_bytes, mapped_bytes;
};
int vmm_debug_mapping(const struct vmm *v, uint64_t va, struct vmm_debug_mapping *out);
int vmm_debug_objects(const struct vmm *v, struct vmm_debug_objects *out);

#endif
