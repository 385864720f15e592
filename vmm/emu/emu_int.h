/*
 * vmm/emu/emu_int.h: the emulated CUDA driver's internals, shared by the files of vmm/emu/
 * (the contract it offers its callers: vmm/emu/emu.h; design: docs/design.md, "The emulated
 * device"). Not included outside vmm/emu/.
 *
 * Files: entry.c (the prologue of every entry point, the state (emu), fault injection,
 * tracing, call counters), device.c (cuInit, devices, contexts, device create/destroy, the
 * table and the backend face of vmm/drv_emu.h), memory.c (granule allocator, handles),
 * maps.c (reservations, the mapping table), copies.c, streams.c, capture.c (emulated graph
 * capture), events.c, host.c (pinned host memory), emu_errors.c (error strings).
 *
 * Contract of the emulated device (what it guarantees):
 *  - CUDA semantics, strictly: every entry point checks its arguments and state as the
 *    driver reference says and returns the real driver's error code; where the reference
 *    lists only generic codes, the code it lists for bad arguments (INVALID_VALUE) is used
 *    and the check says "undocumented". A violation the driver would catch is never
 *    tolerated, so code that passes here does not rely on emulator leniency.
 *  - One process-global driver, like libcuda: devices, handles, reservations, host ranges,
 *    streams and events live in one struct, emu (struct emu_state below, defined in
 *    entry.c).
 *  - Device memory: one memfd per device plus the emulator's own MAP_SHARED read/write view
 *    of all of it (memory.c). A physical handle is a contiguous granule range of the memfd
 *    (first-fit bitmap allocator with a next-fit cursor); a shareable or imported handle is
 *    a memfd of its own (emu_share.c), never mapped by the emulator. Copies reach device
 *    bytes only through the view or those memfds (pread / pwrite), after translating the
 *    device address through the mapping table (copies.c), so the windows the caller sees can
 *    stay PROT_NONE (opaque mode) and copies still work.
 *  - Virtual memory (maps.c): a reservation is an anonymous PROT_NONE mapping; each granule
 *    of it has an entry {handle, offset, mapping id, access} (two-level table, blocks
 *    allocated on first map so huge reservations cost nothing). cuMemMap =
 *    mmap(MAP_FIXED|MAP_SHARED) of the handle's memfd range, PROT_NONE until cuMemSetAccess.
 *  - Streams (streams.c): one worker thread each, executing an in-order queue. The NULL
 *    stream is the legacy default stream: a worker of its own, made at its first use, that
 *    runs each op after the work every blocking stream had queued before it, while a
 *    blocking stream's op waits for the legacy work queued before it (CUDA's implicit
 *    synchronization; non-blocking streams do not synchronize with it, so neither do we).
 *    Like any stream it is asynchronous to the caller: a missing cuStreamSynchronize(NULL)
 *    shows up. A caller that waits (a stream, event or context synchronize) runs the ready
 *    ops of the device's streams itself (emu_help_locked: same order, same dependencies, at
 *    a moment the worker could have run them), so a caller that copies and synchronizes
 *    costs no thread hand-off per op; work nobody waits for runs on the workers.
 *  - Every entry point is counted, traced and can be made to fail (entry.c) before it does
 *    anything: an injected failure changes no state.
 *
 * Locks and lock order: emu.lock only, one mutex over every table. Every entry point takes it
 * in its prologue (emu_enter(), through BEGIN) and drops it in emu_leave(); test API calls take it
 * themselves. Functions named *_locked are called with it held. The only places that drop
 * it while an operation is in progress are condition waits (emu.cond: some op completed;
 * a stream's cv: work queued, unpaused or exit requested), the join of a stream's worker,
 * and the copy loop, which releases it between chunks so that a cuMemUnmap issued while a
 * long copy runs takes effect between chunks (and the copy then faults, as a GPU would).
 * klog takes its own lock inside and never calls back (emu.lock -> klog's lock).
 *
 * What it never does: it never dereferences a caller's device address (copies go through
 * the view or a memfd), never executes captured work, never aborts or exits on a caller's
 * error (a device fault is a sticky KCU_ERROR_ILLEGAL_ADDRESS, as on a GPU), and never calls
 * up into libkvvm (it knows only cudrv.h and common/log.h).
 */
#ifndef KVVM_VMM_EMU_EMU_INT_H
#define KVVM_VMM_EMU_EMU_INT_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "vmm/emu/emu.h"
#include "common/assert.h"
#include "common/log.h"
#include "vmm/drv_emu.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <sys/types.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EMU_MAX_DEVICES   64
#define EMU_DRIVER_VERSION 12080
#define EMU_DEVICE_NAME   "kvvm emulated device"
#define XFER_CHUNK        (1u << 20)   /* bytes copied per lock hold */
#define EMU_FILL_BYTES    (64u << 10)  /* a fill pattern's bytes (emu_fd_fill) */
#define ENT_BLOCK         4096         /* table entries per second-level block */

/* Access bits needed by a copy; KCU_MEM_ACCESS_FLAGS_PROT_READ = 1, READWRITE = 3. */
#define NEED_R 1
#define NEED_W 2

/* ---- entry points, prologue, fault injection, tracing ------------------------------- */

/* EMU_ENTRIES (the entry point list) is in emu.h: the call counters are generated from it. */

enum emu_entry {
#define X(n) E_##n,
    EMU_ENTRIES(X)
#undef X
    E_COUNT
};

extern const char *const emu_entry_names[E_COUNT];

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
    size_t held;                   /* bytes held by others (emu_device_set_held) */
    int opaque;
    size_t max_maps;               /* bound on live mappings of this device's memory */
    int memfd;
    unsigned char *view;           /* the emulator's RW MAP_SHARED view of the whole memfd */
    uint64_t *bitmap;              /* 1 = granule in use */
    /* 1 = free granule whose memory was not returned yet (memory.c: returned in batches);
       n_unpunched of them. Allocated with bitmap (one block) */
    uint64_t *unpunched;
    size_t n_unpunched;
    size_t cursor;                 /* next-fit start, in granules */
    size_t n_lingering;            /* handles lingering (struct emu_handle) */
    int ctx_refs;                  /* primary context retains */
    kcu_result sticky;             /* 0, or the fault that killed the device */
    struct kcu_stream_st *legacy;  /* the legacy default stream's worker; NULL until used */
    struct emu_counters c;
    uint64_t calls[E_COUNT];       /* entry point calls made with this device current */
};

/* Kinds of physical handle (emu_share.c). */
enum { EMU_H_PLAIN = 0,            /* a granule range of the device's memfd */
       EMU_H_SHAREABLE,            /* created with KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR:
                                      its own memfd (exportable); granules still taken from
                                      the device's bitmap, so capacity is accounted alike */
       EMU_H_IMPORTED };           /* cuMemImportFromShareableHandle: another device's memory
                                      (its creator's accounting), mapped through its memfd */

/* A physical handle: value = (gen << 32) | (slot + 1); never 0. */
struct emu_handle {
    struct emu_dev *dev;           /* NULL = free slot; an imported one: the importer's */
    uint32_t gen;                  /* bumped when the slot is freed */
    bool released;                 /* cuMemRelease done; memory lives until maps == 0 */
    /* a released shareable handle an importer or an open export descriptor still holds
       (a descriptor of its export description, xfd's, which holds a shared flock): its
       memory stays accounted to the device until reaped */
    bool lingering;
    unsigned char kind;            /* EMU_H_* */
    size_t base, ngran;            /* granule range in the device (bitmap; memfd if PLAIN) */
    size_t maps;                   /* live mappings of it */
    int fd;                        /* SHAREABLE, IMPORTED: its own memfd; else unused */
    /* SHAREABLE: the export description (the memfd opened anew at create, holding a shared
       flock), of which every export is a dup, until the release closes it; else -1 */
    int xfd;
};

/* Where a copy reaches device bytes (emu_handle_loc): p, a pointer into the device's view
   (a plain handle); or, p NULL, offset off of memfd fd (a shareable or imported handle:
   read and written with pread / pwrite, never mapped by the emulator). */
struct emu_loc {
    unsigned char *p;
    int fd;
    off_t off;
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
    bool idle;                     /* the worker waits on cv for work (a submit must wake it) */
    /* wake-ups of the worker in flight: a submit that found it idle signals cv after
       dropping emu.lock (emu_leave), so the worker does not wake into a lock still held;
       atomic, and s is not freed until it is 0 (stream_unkicked) */
    unsigned kicks;
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

/* ---- the emulator's state: one instance, emu (defined in entry.c) ----------------------- */

/* Everything the process-global driver knows, in one place. Every field is guarded by
   emu.lock unless its comment says otherwise; so is every object reachable from it (devices,
   handles, reservations and their entries, host ranges, streams and their queued ops,
   events, armed faults). */
struct emu_state {
    pthread_mutex_t lock;          /* the one lock (see "Locks and lock order" above) */
    pthread_cond_t cond;           /* with lock: some op completed, a detached stream went */
    bool inited;                   /* cuInit was called (never reset) */
    /* a fork() child of a process that had called cuInit (set by the child handler of
       emu_fork_watch, without the lock): cuInit and every entry point that needs it fail
       with KCU_ERROR_NOT_INITIALIZED, as the driver's do in such a child */
    _Atomic bool forked;
    /* devices by ordinal, NULL = free slot; devs[i]->ordinal == i */
    struct emu_dev *devs[EMU_MAX_DEVICES];
    /* the primary context of the device in slot i; its gen is bumped when that device is
       destroyed, so a thread's current context (emu_t) made current at an older gen is dead */
    struct kcu_ctx_st ctx[EMU_MAX_DEVICES];
    /* physical handles: handles_cap slots (grown by doubling, never shrunk); slot i is free
       iff handles[i].dev == NULL; a handle's value names (gen, slot), so a stale one fails
       lookup */
    struct emu_handle *handles;
    size_t handles_cap;
    size_t handle_scan;            /* next-fit start of the free-slot search (taken mod cap) */
    /* live reservations, unordered (a removal moves the last one into the hole):
       resvs[0 .. nresv) of resv_cap allocated */
    struct emu_resv **resvs;
    size_t nresv, resv_cap;
    struct emu_host *hosts;        /* pinned host ranges (a list, newest first) */
    /* every stream with a worker: created ones, the devices' legacy streams, and destroyed
       ones still draining (such a worker unlinks and frees its stream, then signals cond) */
    struct kcu_stream_st *streams;
    uint64_t stream_id;            /* the last stream id handed out (ids are never reused) */
    struct kcu_event_st *events;   /* live events (a list); one goes when its refs reach 0 */
    uint64_t map_id;               /* the last mapping id handed out (one per cuMemMap) */
    struct emu_fault *faults;      /* armed failures (emu_fail_arm, KVVM_EMU_FAIL) */
    bool env_read;                 /* KVVM_EMU_FAIL was read (once, at the first device create) */
    bool memlock_warned;           /* the RLIMIT_MEMLOCK warning was logged (once) */
    /* the call trace (emu_trace_start/stop): while tracing, each entry point call appends
       {name, nth}, nth counted per entry point in trace_occ since the start;
       trace_buf[0 .. trace_n) of trace_cap allocated */
    bool tracing;
    struct emu_trace_entry *trace_buf;
    size_t trace_n, trace_cap;
    unsigned long trace_occ[E_COUNT];
    /* KVVM_EMU_CREATE_NS (memory.c), read at each device create: atomic, not under lock
       (cuMemCreate sleeps that long before it takes the lock) */
    long create_ns;
};

extern struct emu_state emu;

/* The calling thread's driver state (thread-local: no lock). */
struct emu_thread {
    struct kcu_ctx_st *ctx;        /* the current context (cuCtxSetCurrent); NULL = none */
    unsigned ctx_gen;              /* ctx->gen when it was made current: alive iff equal */
    int capmode;                   /* KCU_STREAM_CAPTURE_MODE_*; GLOBAL = 0 */
    struct kcu_stream_st *kick;    /* a worker to wake when this call leaves (s->kicks) */
};

extern __thread struct emu_thread emu_t;

/* ---- small helpers ------------------------------------------------------------------ */

static inline bool is_pow2(size_t x) { return x && !(x & (x - 1)); }
static inline size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

enum { F_INIT = 1,                  /* cuInit must have been called */
       F_CTX = 2,                   /* a current context is required */
       F_STICKY = 4 };              /* a dead current device fails the call */

/* Opens every entry point: emu_enter() takes emu.lock, records the call and runs the checks `need`
   asks for; on failure the entry point jumps to out:, which returns through emu_leave(). */
#define BEGIN(name, need)                                         \
    struct emu_dev *cur = NULL;                                   \
    kcu_result r = emu_enter(E_##name, (need), &cur);                 \
    (void)cur;                                                    \
    if (r != KCU_SUCCESS)                                         \
        goto out

/* The entry points (one per field of struct kcu_api, same signature). */
#define X(n) __typeof__(*((struct kcu_api *)0)->n) emu_##n;
    EMU_ENTRIES(X)
#undef X

/* entry.c */
/* Registers (once) the fork handler that sets emu.forked in a child of an initialized
   emulator; called by cuInit. */
void emu_fork_watch(void);
kcu_result emu_enter(int e, int need, struct emu_dev **cur);
kcu_result emu_leave(kcu_result r);
/* Counts entry point e in the calling thread's own counts (emu_thread_calls_get). */
void emu_thread_count(int e);
struct emu_dev *emu_dev_get_locked(int ordinal);
void emu_fail_env_locked(void);

/* memory.c */
kcu_mem_handle emu_handle_value(size_t slot);
struct emu_handle *emu_handle_lookup_locked(kcu_mem_handle v, size_t *slot);
void emu_handle_maybe_free_locked(size_t slot);
/* Frees a released, unmapped handle's slot and memory now (lingering or not). */
void emu_handle_free_now_locked(size_t slot);
/* Where a handle's memory is: its memfd and the offset in it (for cuMemMap). */
int emu_handle_fd(const struct emu_handle *h, off_t *off);
/* Where byte `byte` of handle h is for a copy (struct emu_loc). */
void emu_handle_loc(const struct emu_handle *h, size_t byte, struct emu_loc *at);
int emu_handle_slot_alloc_locked(size_t *slot);

/* emu_share.c */
/* A shareable handle's own memfd (fd), filled with EMU_POISON (written, no fault; no
   view), and its export description (xfd: emu_handle.xfd): 0; KCU_ERROR_OUT_OF_MEMORY. */
kcu_result emu_share_create_locked(struct emu_dev *d, size_t size, int *fd, int *xfd);
/* Closes a SHAREABLE handle's export description (at its release: no export follows). */
void emu_share_unexport(struct emu_handle *h);
/* Writes n bytes at off of memfd f, all of pat's value (pat: EMU_FILL_BYTES bytes of one
   value, or n if fewer), by a pwritev of pat many times, no mapping. False on a write
   error (errno). */
bool emu_fd_fill(int f, off_t off, size_t n, const unsigned char *pat);
/* True when the released shareable handle h is still held: an import of it (in any
   process) or an export not closed yet. */
bool emu_share_held_elsewhere(const struct emu_handle *h);
/* Closes a SHAREABLE or IMPORTED handle's memfd and export description (no view to
   unmap). */
void emu_share_close(struct emu_handle *h);
/* Frees d's lingering handles that no importer holds any more. */
void emu_share_reap_locked(struct emu_dev *d);
/* cuMemImportFromShareableHandle of descriptor fd (POSIX file-descriptor type) that takes
   fd over on success: the new handle keeps it as its memfd, no dup (closed at the
   release); on a failure the caller keeps fd. Counted, traced and refused by fault
   injection as cuMemImportFromShareableHandle (struct kcu_debug's import_take). */
kcu_result emu_import_take(kcu_mem_handle *handle, int fd);

/* maps.c */
bool emu_ent_mapped(struct emu_resv *rv, size_t i);
struct emu_ent *emu_ent_get(struct emu_resv *rv, size_t i);
struct emu_resv *emu_resv_find_locked(uintptr_t va);
uint64_t emu_ent_map_id(struct emu_resv *rv, size_t i);
void emu_resv_free_mem(struct emu_resv *rv);
void emu_resv_remove_locked(struct emu_resv *rv);
void emu_unmap_entries_locked(struct emu_resv *rv, size_t first, size_t n);

/* copies.c */
bool emu_range_known_locked(kcu_deviceptr va, size_t n);
void emu_xfer_locked(struct emu_dev *d, struct emu_op *op);

/* streams.c */
bool emu_help_locked(struct emu_dev *d, struct kcu_stream_st *want);
kcu_result emu_stream_arg_locked(kcu_stream stream, struct emu_dev *cur,
                                 struct kcu_stream_st **s, struct emu_dev **d);
kcu_result emu_submit_locked(struct kcu_stream_st *s, struct emu_dev *d, struct emu_op *op);
struct kcu_stream_st *emu_stream_lookup_locked(kcu_stream s);
void emu_drain_locked(struct emu_dev *d, bool blocking_only);
void emu_stream_teardown_locked(struct kcu_stream_st *s);
void emu_stream_kick(void);

/* capture.c */
kcu_result emu_capture_unsafe_locked(void);
kcu_result emu_ctx_capture_locked(struct emu_dev *d);
kcu_result emu_legacy_capture_locked(struct emu_dev *d, bool query_only);
kcu_result emu_stream_capture_check_locked(struct kcu_stream_st *s, struct emu_dev *d);

/* events.c */
struct kcu_event_st *emu_event_lookup_locked(kcu_event e);
void emu_event_put_locked(struct kcu_event_st *ev);
void emu_event_unlink_locked(struct kcu_event_st *ev);

/* host.c */
void emu_host_release_locked(struct emu_host *h);
void emu_host_remove_locked(struct emu_host *x);

/* memory.c: reads KVVM_EMU_CREATE_NS (the emulated cost of cuMemCreate). */
void emu_create_cost_read(void);

#endif
