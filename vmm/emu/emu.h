/*
 * vmm/emu/emu.h: the emulated device. It implements struct kcu_api with CUDA semantics over
 * memfd + mmap, so machines without a GPU run the same driver-level code path (docs/design.md,
 * "The emulated device"). This header is also the emulator's test API: device creation,
 * counters, driver-call counters, the mapping table, fault injection and call tracing.
 * Included by the emulator itself, tests and tools only; the library reaches the emulator
 * through vmm/drv_emu.h.
 *
 * Semantics (strict; every violation returns the real driver's error code):
 *  - One memfd per emulated device; a physical handle is a granule-aligned range of it.
 *    New handles are filled with a poison pattern (EMU_POISON), like uninitialized GPU memory;
 *    a handle's range is free after its release and last unmap, its memory returned to the
 *    system (hole-punched) in batches: once the free memory not yet returned exceeds half
 *    the device (a create reuses such memory first).
 *  - cuMemAddressReserve = mmap(PROT_NONE); cuMemMap = mmap(MAP_FIXED|MAP_SHARED) of the
 *    handle's range, PROT_NONE until cuMemSetAccess; cuMemUnmap = anonymous PROT_NONE again.
 *    cuMemMap requires offset == 0, size <= handle size, granule-aligned ptr and size, inside
 *    one reservation, onto unmapped pages only (else KCU_ERROR_INVALID_VALUE, the code the
 *    driver reference lists for cuMemMap). cuMemUnmap must cover whole
 *    mappings; cuMemSetAccess only fully mapped ranges.
 *  - Capacity is finite: cuMemCreate past it is KCU_ERROR_OUT_OF_MEMORY. Live mappings are
 *    bounded below vm.max_map_count (max_maps); past it cuMemMap is KCU_ERROR_OUT_OF_MEMORY
 *    with a logged message, never a failed mmap mid-operation.
 *  - Devices are process-wide like a real driver's: cuDeviceGet(ordinal) names a device
 *    created with emu_device_create(). Contexts are the devices' primary contexts; calls that
 *    need a context use the calling thread's current one (cuCtxSetCurrent), else
 *    KCU_ERROR_INVALID_CONTEXT.
 *  - Streams execute their operations in order on a worker thread each; the NULL (legacy)
 *    stream too, asynchronously to the caller, each op after the blocking streams' earlier
 *    work (and a blocking stream's op after the legacy work before it), as CUDA's legacy
 *    stream synchronizes. Events complete when reached.
 *    Copies translate device addresses through the mapping table when they execute; an
 *    address that is not mapped with access then is a sticky KCU_ERROR_ILLEGAL_ADDRESS (the
 *    device is dead: every later call returns it), exactly like a GPU fault.
 *  - Host memory in copies: pageable memory is as asynchronous as pinned memory (the copy
 *    reads or fills it when its stream reaches it), the least the driver documents ("might
 *    be synchronous with respect to host"), so a caller relying on staging at the call or
 *    a filled destination at return fails here. A host pointer inside a reservation (a
 *    device address, even where windows are CPU-readable) is KCU_ERROR_INVALID_VALUE.
 *  - Opaque mode: windows stay PROT_NONE even after set-access, so only the driver's copies
 *    can reach device bytes (they use the emulator's own view of the device's memfd, and a
 *    shareable or imported handle's own memfd through pread / pwrite).
 *  - Copied bytes are counted per direction.
 *  - Shareable handles (KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR only): a handle created
 *    with that type in requestedHandleTypes has a memfd of its own (its granules still
 *    count against the device's capacity); cuMemExportToShareableHandle hands out a new
 *    descriptor of it (any other handle: KCU_ERROR_INVALID_VALUE, another type:
 *    KCU_ERROR_NOT_SUPPORTED). cuMemImportFromShareableHandle, in any process, makes a
 *    handle of the current device mapping that memory (the device's granule must be the
 *    exporter's, else KCU_ERROR_INVALID_VALUE; a descriptor that is no emulated export:
 *    KCU_ERROR_INVALID_VALUE); it is released with cuMemRelease and its memory is not
 *    the importing device's (counted in imported/imported_bytes). A handle released in
 *    the exporter stays alive while an importer holds it or an export descriptor of it is
 *    still open (cuMemRelease's "shareable counterparts"), and stays accounted to the
 *    exporting device (lingering) until every importer has released and unmapped it or
 *    exited and every export descriptor is closed (an export is a dup of the allocation's
 *    export description, made at create, which holds a shared flock; an import is a dup
 *    of the descriptor it is given, or that descriptor itself through the backend face's
 *    import_take: vmm/drv_emu.h).
 */
#ifndef KVVM_VMM_EMU_EMU_H
#define KVVM_VMM_EMU_EMU_H

#include <stddef.h>
#include <stdint.h>
#include "vmm/cudrv.h"

#define EMU_POISON 0xA5          /* byte pattern of never-written device memory */

struct emu_device_params {
    size_t capacity;             /* bytes of device memory; rounded down to the granule */
    size_t granule;              /* 4 KiB .. 2 MiB, power of two; 0 = 2 MiB */
    int    opaque;               /* windows never CPU-accessible */
    size_t max_maps;             /* bound on live mappings; 0 = default (below max_map_count) */
};

/* Device memory "held by others" (another process, PyTorch's caching allocator): bytes of
   the device's capacity no cuMemCreate can have and cuMemGetInfo does not report free.
   Also from the environment: KVVM_EMU_HELD (bytes, K/M/G suffixes), applied to every
   emulated device when it is created. 0; -ENODEV no such device. */
int emu_device_set_held(int ordinal, size_t bytes);

/* The emulated driver's table. */
const struct kcu_api *emu_api(void);

/* Creates an emulated device; *ordinal is what cuDeviceGet takes. -EINVAL bad params,
   -ENOMEM memfd could not be made. */
int emu_device_create(const struct emu_device_params *p, int *ordinal);
/* Destroys a device once its primary context is released. Returns the number of objects it
   still held (handles, mappings, reservations, streams, events, pinned host ranges, and 1
   for a primary context still retained); 0 is clean. Those are freed and logged as leaks
   (streams first finish their queued work). -ENODEV no such device. */
int emu_device_destroy(int ordinal);

struct emu_counters {
    uint64_t handles, handle_bytes;          /* live physical handles and their bytes */
    uint64_t mappings, mapped_bytes;         /* live mappings */
    uint64_t reservations, reserved_bytes;
    uint64_t streams, events;
    uint64_t host_allocs, host_alloc_bytes;  /* cuMemAllocHost */
    uint64_t host_registered, host_registered_bytes;
    uint64_t copied_htod, copied_dtoh, copied_dtod, memset_bytes; /* since creation */
    /* successful operations (calls of every kind: struct emu_calls): creates, releases and
       maps count calls, unmaps counts mappings removed, set_access the runs applied (one
       per device and resulting access within a call) */
    uint64_t creates, releases, maps, unmaps, set_access;
    /* shareable handles: live imported handles and their bytes (their memory is the
       exporting device's: not in handles/handle_bytes), released shareable handles an
       importer or an export descriptor still holds (still in handles/handle_bytes), and
       successful exports and imports since creation */
    uint64_t imported, imported_bytes, lingering, exports, imports;
};
int emu_counters_get(int ordinal, struct emu_counters *out);

/* The driver entry points the emulator implements, one per field of struct kcu_api: its
   table, fault injection, call tracing and call counters are generated from this list. */
#define EMU_ENTRIES(X) \
    X(cuInit) X(cuDriverGetVersion) X(cuDeviceGetCount) X(cuDeviceGet) \
    X(cuDeviceGetAttribute) X(cuDeviceGetName) X(cuDeviceTotalMem) X(cuMemGetInfo) \
    X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent) \
    X(cuCtxGetCurrent) X(cuCtxSynchronize) X(cuMemGetAllocationGranularity) \
    X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemCreate) X(cuMemRelease) X(cuMemMap) \
    X(cuMemUnmap) X(cuMemSetAccess) X(cuMemExportToShareableHandle) \
    X(cuMemImportFromShareableHandle) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync) \
    X(cuMemcpyDtoDAsync) X(cuMemsetD8Async) X(cuStreamCreate) X(cuStreamDestroy) \
    X(cuStreamSynchronize) X(cuStreamQuery) X(cuStreamWaitEvent) X(cuStreamIsCapturing) \
    X(cuStreamGetCtx) \
    X(cuThreadExchangeStreamCaptureMode) \
    X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventQuery) \
    X(cuEventSynchronize) X(cuMemHostRegister) X(cuMemHostUnregister) X(cuMemAllocHost) \
    X(cuMemFreeHost) X(cuPointerGetAttribute) X(cuGetErrorString) X(cuGetErrorName)

/* Driver calls per entry point: every call made while a context of this device was current
   on the calling thread, counted at the call whether it then succeeds or fails (an
   injected failure too), since the device's creation or its last emu_calls_reset. libkvvm
   makes its context current before each of its calls, so all of its calls are counted
   except a cuCtxSetCurrent made while no context was current (the thread had none, e.g.
   the first of a public call), which no device sees. Operations a stream executes later
   are not calls; they are counted once, when submitted. */
struct emu_calls {
#define EMU_CALLS_FIELD(n) uint64_t n;
    EMU_ENTRIES(EMU_CALLS_FIELD)
#undef EMU_CALLS_FIELD
};
/* 0, -EINVAL out NULL, -ENODEV no such device. */
int emu_calls_get(int ordinal, struct emu_calls *out);
/* The calling thread's calls (every device's, counted as above) since it began. 0; -ENOMEM
   its counts could not be allocated (they are incomplete). */
int emu_thread_calls_get(struct emu_calls *out);
/* Zeroes the device's call counters. 0, -ENODEV. */
int emu_calls_reset(int ordinal);

/* Mapping table lookup, for invariant checkers: what is mapped at device address va.
   0 and the handle, offset within the handle and access flags; -ENOENT unmapped. */
int emu_lookup(kcu_deviceptr va, kcu_mem_handle *handle, size_t *offset, int *access);

/* Fault injection: the nth (1-based, counted from this call) future call of the named entry
   point (e.g. "cuMemMap") returns err without doing anything. Several may be armed at once.
   Also from the environment: KVVM_EMU_FAIL="cuMemMap:3:2,cuMemCreate:1:2" (entry:nth:err),
   read when the first emulated device is created. -EINVAL unknown entry point. */
int emu_fail_arm(const char *entry, unsigned long nth, kcu_result err);
void emu_fail_clear(void);

/* A gate, for tests of races with the library's own threads: once armed, the next call of
   the named entry point made by a thread other than the arming one waits at its start (before
   the emulator's lock, so every other call goes on) until emu_gate_open. emu_gate_wait
   returns once a call waits there (a condition, no time). One gate at a time: -EBUSY while
   one is armed, -EINVAL unknown entry point. */
int emu_gate_arm(const char *entry);
void emu_gate_wait(void);
void emu_gate_open(void);

/* The emulator's lock taken (take 1) or dropped (0) by the calling thread, for tests of what
   a fork() child finds when a parent's thread held it at the fork. */
void emu_lock_for_test(int take);

/* Call tracing, for fail-at-call-N sweeps: while on, every entry point call is recorded as
   (entry name, its occurrence index since emu_trace_start). */
struct emu_trace_entry { const char *entry; unsigned long nth; };
void emu_trace_start(void);
/* Stops tracing; returns the number of calls recorded and up to max of them in out. */
size_t emu_trace_stop(struct emu_trace_entry *out, size_t max);

/* Stream test hooks. set_capturing: the stream captures a CUDA graph while on, as if the
   calling thread had called cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL):
   cuStreamIsCapturing reports ACTIVE (INVALIDATED once a prohibited call broke it; the
   legacy stream reports CUDA_ERROR_STREAM_CAPTURE_IMPLICIT while a blocking stream
   captures); work submitted to s is captured, i.e. counted (emu_stream_counts) and never
   executed, and an event recorded on it cannot be queried or synchronized, nor waited for
   by a stream that does not capture (CUDA_ERROR_STREAM_CAPTURE_ISOLATION); the legacy
   stream cannot be used while a blocking stream captures (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
   querying or synchronizing calls (events, streams, the context) from a thread whose capture
   mode (cuThreadExchangeStreamCaptureMode) is GLOBAL, or THREAD_LOCAL in the capturing
   thread, fail with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidate the capture.
   Turning it off (or on again) ends (restarts) the capture. set_paused: the stream's worker
   executes nothing while on, so tests can observe queued (NOT_READY) work and change the
   mappings under it deterministically; anything that drains the stream (its synchronize,
   the legacy stream, cuCtxSynchronize) blocks until it is resumed. cuStreamDestroy returns
   at once, as the driver's does, and the stream drains afterwards (a paused one once
   resumed: set_paused still finds a destroyed stream that has work left), or at
   emu_device_destroy, which resumes it. Both: 0, or -EINVAL unknown stream (or NULL). */
int emu_stream_set_capturing(kcu_stream s, int on);
int emu_stream_set_paused(kcu_stream s, int on);
/* Operations (copies, memsets, event records and waits) submitted to s since it was
   created, and how many of them were captured. Either pointer may be NULL. 0, -EINVAL. */
int emu_stream_counts(kcu_stream s, uint64_t *submitted, uint64_t *captured);

#endif
