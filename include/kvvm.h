/*
 * libkvvm: a KV cache memory manager for LLM inference engines.
 *
 * Every sequence gets KV memory that is contiguous in device virtual address space and grows
 * without copying. Physical memory is managed in pages (CUDA driver physical allocations) that
 * are reference-counted, shared between sequences (fork, shared prefixes), copied on write,
 * swapped to pinned host memory and spilled to disk under pressure.
 *
 * Conventions: every call returns 0 on success or a negative errno (docs/api.md "Errors",
 * and kvvm_strerror()); out-values go through pointers; a failed call changes
 * nothing. Every call taking a context also returns -EINVAL for kv NULL and -EIO once the
 * context is dead (not repeated below). The rules an engine must follow (protection,
 * ordering, threading, sizing) are in docs/api.md.
 * All calls on one context are safe to make from several threads. While the engine
 * stream (kvvm_set_stream) captures a CUDA graph, every call that would enqueue onto, record
 * on or synchronize it (grow, grow_batch, truncate, free, fork, share, prepare_write, write,
 * read, swap_out, swap_in, prefetch, step, sync, set_stream) returns -EBUSY; without an
 * engine stream they return -EBUSY while a blocking stream of the device captures (the
 * legacy stream cannot be used then) or a stream made by kvvm_stream_create captures (the
 * device cannot be synchronized then). The library's own threads use relaxed capture mode
 * and never enqueue on the engine stream, so a capture by the engine stays valid while
 * they run. Every call (kvvm_open and kvvm_close included) leaves the calling thread's
 * current CUDA context as it found it. In a fork() child of the process that opened a
 * context, every call on it returns -EIO (kvvm_close does nothing there): the context
 * belongs to the parent. Such a child cannot open one either (CUDA refuses a child of a
 * process that used it; so does the emulated device: -ENODEV): start it with exec, or fork
 * before the first kvvm_open.
 *
 * This is the only installed header. It is binding: fields may only be added at the end of
 * structs (each struct starts with its size), functions and flags only added.
 */
#ifndef KVVM_H
#define KVVM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(KVVM_STATIC_DEFINE)
#define KVVM_API
#elif defined(KVVM_BUILDING)
#define KVVM_API __attribute__((visibility("default")))
#else
#define KVVM_API
#endif

#define KVVM_VERSION_MAJOR 0
#define KVVM_VERSION_MINOR 3
#define KVVM_VERSION_PATCH 0

typedef struct kvvm kvvm;     /* opaque context: one device, one reserved virtual range */
typedef uint64_t kvvm_seq;    /* sequence handle; carries a generation, so a freed handle is
                                 detected (-ENOENT), never aliased; 0 is never a valid handle */

enum kvvm_backend {
    KVVM_BACKEND_AUTO = 0,      /* CUDA if usable, else emulated (logged) */
    KVVM_BACKEND_CUDA = 1,      /* real driver; -ENODEV if none */
    KVVM_BACKEND_EMULATED = 2   /* the in-process emulated device */
};

struct kvvm_config {
    size_t   size;              /* = sizeof(struct kvvm_config); set by kvvm_config_init */
    enum kvvm_backend backend;  /* KVVM_BACKEND */
    int      device;            /* CUDA device ordinal; KVVM_DEVICE */
    uint32_t n_regions;         /* regions per sequence (1 = token-major, 2*layers = per K/V) */
    uint64_t bytes_per_token;   /* bytes per token in each region */
    uint32_t max_seqs;          /* live sequences at once (slots) */
    uint64_t max_tokens;        /* per sequence */
    size_t   page_size;         /* bytes; 0 = the device granule; else a multiple of it */
    size_t   device_budget;     /* bytes of device memory for KV pages */
    size_t   host_budget;       /* bytes of pinned host memory for swapped pages; 0 = none */
    const char *spill_dir;      /* directory for the spill file; NULL = no disk tier */
    size_t   spill_budget;      /* bytes of disk for spilled pages */
    double   device_min, device_low, device_high; /* free fractions, 0 <= min <= low <= high <= 1 */
    double   host_min, host_low, host_high;
    unsigned flags;             /* KVVM_F_* below */
    size_t   emu_device_bytes;  /* emulated device capacity; 0 = device_budget */
    size_t   emu_granule;       /* emulated granule; 0 = 2 MiB */
    /* --- additions (after the fields of the original contract; docs/api.md) --- */
    uint32_t map_ahead;         /* pages per region mapped ahead of a growing sequence's end
                                   to hide map latency, refilled in batches (below half
                                   left: back up to map_ahead; by the frame pool thread
                                   when pool_thread is on); 0 = none. KVVM_MAP_AHEAD */
    int      emu_opaque;        /* emulated device: windows not CPU-accessible (copies only);
                                   proves a caller never dereferences device memory.
                                   KVVM_EMU_OPAQUE */
    /* --- additions of 0.2: the frame pool thread (docs/api.md "Elastic device memory") --- */
    int      pool_thread;       /* 1 (default): a library thread creates frames ahead of need
                                   and releases unused ones above pool_high; 0: frames are
                                   created on the caller's thread (at kvvm_step, and by a call
                                   that finds none ready). KVVM_POOL_THREAD */
    uint32_t pool_low;          /* pages: fewer ready than this wakes the thread, which refills
                                   to pool_high; 0 = max(2 x n_regions, budget / 16 pages).
                                   KVVM_POOL_LOW */
    uint32_t pool_high;         /* pages: the reserve of created, unused frames the thread
                                   keeps; 0 = max(2 x pool_low, budget / 8 pages).
                                   KVVM_POOL_HIGH */
    uint32_t pool_decay_ms;     /* ms: the thread releases the ready frames above pool_high
                                   that no call needed for this long (default 1000); 0: those
                                   unused since its previous round (at each step).
                                   KVVM_POOL_DECAY_MS */
    /* --- additions of 0.2: device memory held by others (docs/api.md "Device memory") --- */
    int      create_at_open;    /* 1: every frame of device_budget is created at open (vLLM's
                                   behaviour: the open fails with -ENOMEM when the device
                                   cannot give the whole budget) and kept: the pool thread
                                   never releases them; kvvm_trim and kvvm_set_budget still
                                   do. 0 (default): created as needed. KVVM_CREATE_AT_OPEN */
    /* --- additions of 0.3: the shared store (docs/api.md "Shared store") --- */
    const char *store_url;      /* NULL: none. "file:///dir": a directory several processes
                                   (or machines, over a shared file system) use together;
                                   "redis://[[user]:password@]host[:port][/db]": a Redis
                                   server (or anything speaking its protocol). KVVM_STORE_URL */
    uint32_t store_timeout_ms;  /* ms: the bound on one store request (default 1000; 0 =
                                   1000). KVVM_STORE_TIMEOUT_MS */
    /* --- additions of 0.4: one pool per GPU served by kvvmd (docs/api.md "The pool") --- */
    const char *pool_socket;    /* NULL: this process creates its own frames (as before). A
                                   path: every frame comes from the kvvmd on that socket.
                                   KVVM_POOL_SOCKET */
    const char *client_name;    /* shown by kvvmctl; NULL: "<program>-<pid>".
                                   KVVM_CLIENT_NAME */
    size_t   pool_reserve;      /* bytes of frames never asked back from this client
                                   (default 0). KVVM_POOL_RESERVE */
    uint32_t pool_timeout_ms;   /* ms: the longest a call waits for the daemon to find frames
                                   (default 1000), while other clients give back, and the
                                   longest kvvm_seq_import waits for a pending export.
                                   KVVM_POOL_TIMEOUT_MS */
    /* --- additions of 0.4: the store at scale (docs/api.md "Shared store") --- */
    size_t   store_queue_bytes; /* bytes of entries accepted by publish and not yet
                                   acknowledged by the store (default 64 MiB); past it a
                                   publish drops the oldest queued writes (counted in
                                   store_dropped), never waits. KVVM_STORE_QUEUE_BYTES */
};
#define KVVM_F_AUTO_SWAP  (1u << 0)  /* device reclaim by policy when a call needs pages */
#define KVVM_F_SCRUB      (1u << 1)  /* zero pages before they change owner */
#define KVVM_F_SPILL_ALLOW_TMPFS (1u << 2) /* accept a RAM-backed (tmpfs) spill_dir */
#define KVVM_F_SPILL_BUFFERED    (1u << 3) /* accept a spill_dir refusing O_DIRECT (page cache) */
#define KVVM_F_CACHE_DEMOTE      (1u << 4) /* reclaim demotes CACHED sequences to host/disk
                                              when the tiers below have room, instead of
                                              dropping them (see kvvm_seq_set_class) */
#define KVVM_F_POOL_VIEW         (1u << 5) /* every region also has a pool view: block
                                              tables for paged kernels ("Two views");
                                              page_size must be a multiple of
                                              bytes_per_token (kvvm_open: -EINVAL) */

/* Defaults for every field, then KVVM_* environment overrides (sizes take K/M/G suffixes;
   unknown or malformed values are logged and ignored); the engine's own assignments after
   this call win. The effective config is in kvvm_stats_json(). */
KVVM_API void kvvm_config_init(struct kvvm_config *cfg);
/* -EINVAL cfg or out NULL, cfg->size not set by kvvm_config_init, a bad config field
   (KVVM_F_POOL_VIEW with a page_size that is not a multiple of bytes_per_token too), a
   spill_dir without a host tier, a spill_dir refused (tmpfs, no O_DIRECT) (each logged with
   the reason); -ENOENT/-ENOTDIR/-EACCES/-EPERM/-EROFS the spill_dir (-EPERM: an immutable
   directory, or a security policy); -ENOSPC its file system cannot hold spill_budget
   (-EDQUOT a quota, -EFBIG its largest file); -EOPNOTSUPP KVVM_IO_ENGINE=io_uring cannot be set up; -ENODEV no
   usable CUDA device; -ENOMEM device/host memory or reservation could not be had; -EAGAIN
   a library thread could not be started; -EIO driver failure; -EINVAL a malformed store_url,
   -EACCES the store refused the credentials of store_url (a store that is down at open is
   not an error: it is logged, and the library reconnects by itself). */
KVVM_API int  kvvm_open(const struct kvvm_config *cfg, kvvm **out);
/* Frees everything: no mapping, handle, pinned memory, thread or file is left behind.
   Waits for outstanding device work first. NULL is a no-op. */
KVVM_API void kvvm_close(kvvm *kv);

/* Sequences. Length = tokens held; tokens [0, length) are addressable. */
/* -EINVAL out NULL, -ENOSPC no free slot (max_seqs live), -ENOMEM. */
KVVM_API int kvvm_seq_create(kvvm *kv, kvvm_seq *out);
/* In any tier. Its pages are released once no device work enqueued before may use them.
   -ENOENT, -EBUSY capturing stream, -ENOMEM (a pending-release record). */
KVVM_API int kvvm_seq_free(kvvm *kv, kvvm_seq s);
/* length >= current. Makes the sequence resident and the new tokens [old, new) writable: a
   shared page they touch is copied first (an append after a fork never writes into a
   sibling's page). Protects s. -ENOENT, -EINVAL shorter, -E2BIG past max_tokens, -ENOMEM no
   page (or no room to swap s in), -EBADMSG s's data was lost, -EBUSY capturing stream. */
KVVM_API int kvvm_seq_grow(kvvm *kv, kvvm_seq s, uint64_t length);
/* Grows n sequences in one call (a decode step): all or nothing (room for the whole batch is
   checked before a swapped-out one is brought back). Errors as kvvm_seq_grow; -EINVAL also
   for seqs or lengths NULL with n > 0, and a sequence named twice; n == 0: 0. */
KVVM_API int kvvm_seq_grow_batch(kvvm *kv, const kvvm_seq *seqs, const uint64_t *lengths,
                                 size_t n);
/* length <= current; in any tier. -ENOENT, -EINVAL longer, -EBUSY capturing stream,
   -ENOMEM (a pending-release record). */
KVVM_API int kvvm_seq_truncate(kvvm *kv, kvvm_seq s, uint64_t length);
/* Shares every page (no copy; in any tier: the child of a swapped-out parent is swapped out).
   -EINVAL child NULL, -ENOENT, -ENOSPC no free slot, -ENOMEM, -EBUSY capturing stream. */
KVVM_API int kvvm_seq_fork(kvvm *kv, kvvm_seq parent, kvvm_seq *child);
/* dst empty, n_tokens <= src's length: dst's first n_tokens become src's. Whole pages are
   shared where they are; the partial last page is copied, and its bytes past n_tokens are
   zeroed, so dst never sees src's later tokens. n_tokens 0: 0. -ENOENT either handle,
   -EINVAL dst not empty or n_tokens past src's length, -ENOMEM no page (resident src) or no
   host slot (swapped-out src) for the partial page, -EBADMSG that page was lost, -ESTALE
   dst or src a dropped CACHED sequence (kvvm_seq_set_class), -EBUSY capturing stream. */
KVVM_API int kvvm_seq_share(kvvm *kv, kvvm_seq dst, kvvm_seq src, uint64_t n_tokens);
/* Before rewriting tokens [first, end) < length: copy-on-write every shared page. Protects
   s. -ENOENT, -EINVAL first >= end or end past the length, -ENOMEM, -EBADMSG, -EBUSY. */
KVVM_API int kvvm_seq_prepare_write(kvvm *kv, kvvm_seq s, uint64_t first, uint64_t end);
/* host -> sequence bytes, via the driver. [offset, offset+len) within [0, length*bpt). A write
   into a shared page copies it first (the write never shows in a sibling). write, read,
   grow and prepare_write swap a swapped-out sequence in first (-ENOMEM when it cannot come
   back, or when the pages a write or prepare_write copies on write would not fit after it:
   checked before it comes back; it is then still swapped out).
   src is host memory (a device address is -EINVAL). Without a stream the bytes have moved
   when the call returns. With kvvm_set_stream the copy is ordered on the engine stream;
   for a pinned src (cuMemHostAlloc / cuMemAllocHost / cuMemHostRegister, as the driver
   reports it) the CPU does not wait and src must stay unchanged until the stream has
   passed the copy; for any other (pageable) src the call waits for the engine stream up to
   the copy, so src may be reused at once (the driver itself promises no staging).
   Protects s. -ENOENT; -EINVAL src NULL or not host memory, region out of range, len 0 or
   the range outside the sequence; -ENOMEM; -EBADMSG; -EBUSY capturing stream. */
KVVM_API int kvvm_seq_write(kvvm *kv, kvvm_seq s, uint32_t region, uint64_t offset,
                            const void *src, size_t len);
/* sequence bytes -> host, via the driver, after the engine's earlier work. dst is host
   memory (a device address is -EINVAL). Without a stream, and with a stream into pageable
   dst (the call then waits for the engine stream up to the copy), the bytes are in dst
   when the call returns; with a stream into pinned dst they are there once the stream has
   passed the copy (kvvm_sync, or a stream/event synchronization). Protects s. Errors as
   kvvm_seq_write (-ENOMEM only when s must be swapped in and cannot). */
KVVM_API int kvvm_seq_read(kvvm *kv, kvvm_seq s, uint32_t region, uint64_t offset,
                           void *dst, size_t len);
/* Off the device, ends protection. Pages no resident sequence maps are copied to the host
   tier (a page shared with a resident sequence stays on the device; a shared page is copied
   once); with an engine stream the copies are ordered after its work and the call does not
   wait for them (the device pages return to the pool when they completed), without one they
   are done on return. With a disk tier, a sequence with more pages to move than the host
   tier can take goes through the host tier to disk in batches (staged); such a call is
   synchronous in every mode (it waits for the copies and the disk writes) and leaves the
   pages on disk. Whether the pages fit (host room, counting host pages of other sequences
   that could be spilled, and disk room) is checked before anything moves. Already swapped
   out: its orphan pages (left on the device, no resident sequence maps them any more) go to
   the host tier, synchronously, then 0. -ENOENT; -ENOMEM the host and disk tiers cannot take the pages (nothing changed,
   nothing of other sequences moved); the room counts what transfers already started free
   once they complete (swap-in copies free their host slots, swap-out copies' pages can be
   spilled): with an engine stream, when the room is short and such copies are in flight,
   the call waits for them first (the CPU waits for the device work enqueued before them;
   bounded), so -ENOMEM never means "retry after kvvm_sync". -EBUSY the engine stream is
   capturing a graph; -EIO a staged disk write failed. fork, share, truncate
   and free work on a swapped-out sequence without bringing it back; grow, prepare_write,
   write and read bring it back first (it stays resident if the call then fails only when
   it cannot be put back, which is logged). */
KVVM_API int kvvm_seq_swap_out(kvvm *kv, kvvm_seq s);
/* Resident again at the same addresses, protected. Needs a device page for each of its
   pages not on the device (reclaiming others under KVVM_F_AUTO_SWAP). With an engine stream
   the stream waits for the copies (the CPU does not); without one they are done on return.
   A sequence with more pages on disk than the host tier can hold at once comes back in
   batches through the host tier (staged): synchronous in every mode (prefetch included),
   the bytes are in place on return. When the host tier and the disk are full, such a
   sequence still comes back: a host slot is borrowed to stage through, its page kept in a
   spare device frame meanwhile (one device page more, counted by kvvm_seq_need). Room is
   checked before anything moves (host slots held by copies in flight are waited for, as in
   kvvm_seq_swap_out). Resident already: 0 (protected). -ENOENT; -ENOMEM not enough device
   pages (nothing moved: no disk page read back, no page of another sequence spilled);
   -EBADMSG s's data was lost; -EBUSY capturing stream. */
KVVM_API int kvvm_seq_swap_in(kvvm *kv, kvvm_seq s);
/* Engine iteration boundary: records a fence on the engine's stream, ends the protection of
   the sequences used in the iteration before, reaps completions. -EBUSY capturing stream;
   -ENOMEM the step fence could not be made; -EIO a driver failure. */
KVVM_API int kvvm_step(kvvm *kv);
/* The engine's CUstream; NULL = synchronous mode. A stream of this device's primary context
   (CU_STREAM_LEGACY is accepted). Waits for the old stream's (or, from synchronous mode,
   the device's) work first. -EINVAL a stream of another context (or not a live stream), or
   CU_STREAM_PER_THREAD, which names a different stream in each thread; -EBUSY the current
   or the new stream is capturing a graph. */
KVVM_API int kvvm_set_stream(kvvm *kv, void *stream);
/* A stream of this device (emulated too). -EINVAL stream NULL, -ENOMEM, -EIO the driver
   refused. */
KVVM_API int kvvm_stream_create(kvvm *kv, void **stream);
/* Destroys a stream made by kvvm_stream_create on this context (kvvm_close destroys those
   left). -EINVAL any other stream (nothing destroyed: the engine's own streams are its to
   destroy); -EBUSY the stream is the engine stream set now (kvvm_set_stream another, or
   NULL, first). -EINVAL also for stream NULL. */
KVVM_API int kvvm_stream_destroy(kvvm *kv, void *stream);
/* Waits until everything started before it has completed: copies, disk I/O, deferred unmaps
   and background reclaim rounds. With an engine stream it synchronizes that stream and the
   library's own, never the device (the engine's other streams, e.g. NCCL's, are not waited
   for); without one, the device. -EBUSY capturing stream; -EIO a driver failure. */
KVVM_API int kvvm_sync(kvvm *kv);

/* Scheduling (additions). kvvm_seq_need: the device pages that making s resident and growing
   it to `length` (<= its length: no growth) would take (its own map-ahead pages included:
   they count in pages_device_free), and *fits = 1 when that many are free now without
   reclaim; a swap-in or grow that then fails -ENOMEM for lack of room never had fits = 1.
   -ENOENT, -E2BIG length past max_tokens, -EINVAL NULL. */
KVVM_API int kvvm_seq_need(kvvm *kv, kvvm_seq s, uint64_t length, uint64_t *pages, int *fits);
/* Starts a swap-in without waiting for it and without ordering the engine stream yet (the
   next call using s does that, as does kvvm_seq_swap_in); protects s. Errors as swap_in. */
KVVM_API int kvvm_seq_prefetch(kvvm *kv, kvvm_seq s);
/* 1 when s is resident and no swap-in copy of its pages (its own, or a sibling's bringing
   in pages they share) is still in flight, 0 not yet (or swapped out), -ENOENT. Never
   blocks. */
KVVM_API int kvvm_seq_ready(kvvm *kv, kvvm_seq s);
/* The check before handing out a view of s's window, in one call: *length and *first_kept
   as kvvm_seq_info reports them, and 1 when the window may be read now (resident, no
   swap-in copy in flight: kvvm_seq_ready's 1), 0 when not (swapped out, dropped, or a copy
   still in flight). Never blocks. -ENOENT, -EINVAL NULL pointer (nothing written). */
KVVM_API int kvvm_seq_view_state(kvvm *kv, kvvm_seq s, uint64_t *length,
                                 uint64_t *first_kept);
/* Makes `stream` (another stream of this device) wait, on the device, for every swap copy
   enqueued so far (s's included); the CPU does not wait. -ENOENT, -EINVAL NULL stream,
   -EBUSY capturing stream, -EIO. */
KVVM_API int kvvm_seq_wait_stream(kvvm *kv, kvvm_seq s, void *stream);

/* Addresses. Region r is an array of max_seqs slots of slot_bytes; a sequence never moves:
   token t of region r of s is at kvvm_seq_addr(s, r) + t * bytes_per_token. region_base and
   slot_bytes: -EINVAL NULL pointer or region out of range (fixed at open: they never return
   -EIO). seq_slot and seq_addr: -EINVAL NULL pointer or region out of range, -ENOENT. */
KVVM_API int kvvm_region_base(kvvm *kv, uint32_t region, uint64_t *addr);  /* device address */
KVVM_API int kvvm_slot_bytes(kvvm *kv, uint64_t *bytes);
KVVM_API int kvvm_seq_slot(kvvm *kv, kvvm_seq s, uint32_t *slot);
KVVM_API int kvvm_seq_addr(kvvm *kv, kvvm_seq s, uint32_t region, uint64_t *addr); /* token 0 */

struct kvvm_seq_info {
    size_t   size;              /* = sizeof(struct kvvm_seq_info), set by the caller */
    uint64_t length;            /* tokens */
    uint32_t slot;
    uint32_t pages_device, pages_host, pages_disk, pages_shared; /* distinct pages over
                                   [0, length) in every region; in-flight under the tier left */
    int      resident;          /* all of them mapped in this sequence's own window */
    /* --- additions of 0.2 --- */
    int      dropped;           /* 1 once a CACHED sequence was dropped (until set_class) */
    uint32_t cls;               /* its enum kvvm_seq_class */
    uint64_t first_kept;        /* smallest first_kept over its regions (0 = nothing
                                   discarded) */
};
/* -EINVAL info NULL or info->size not set, -ENOENT. In any tier. */
KVVM_API int kvvm_seq_info(kvvm *kv, kvvm_seq s, struct kvvm_seq_info *info);

struct kvvm_stats {
    size_t size;                /* = sizeof(struct kvvm_stats), set by the caller */
    uint64_t page_size, pages_device_total, pages_device_free,
             pages_host_total, pages_host_free, pages_disk_total, pages_disk_free,
             pages_inflight, maps, unmaps, cow_copies, swap_outs, swap_ins, spills, unspills,
             bytes_to_host, bytes_to_device, bytes_to_disk, bytes_from_disk,
             checksum_failures, io_errors;
    /* --- additions --- */
    uint64_t reclaim_runs;        /* background reclaim rounds that moved something */
    uint64_t reclaim_swap_outs;   /* sequences (or orphan batches) they moved */
    uint64_t direct_reclaims;     /* calls that reclaimed synchronously (below min, or short) */
    uint64_t direct_swap_outs;    /* sequences (or orphan batches) those moved */
    uint64_t direct_reclaim_ns;   /* time callers spent blocked in direct reclaim */
    uint64_t pages_orphan;        /* device pages held only by swapped-out sequences */
    uint64_t seqs_nonresident;    /* live sequences swapped out */
    uint64_t pages_damaged;       /* pages whose disk copy was lost (failed read/checksum):
                                     their sequences return -EBADMSG */
    /* --- additions of 0.2 --- */
    uint64_t frames_created_sync; /* frames created on a caller's thread (not ahead, by the
                                     library's pool thread) */
    uint64_t frames_released;     /* frames released to the driver before close */
    uint64_t device_bytes_held;   /* physical device bytes held from the driver now */
    uint64_t cache_drops;         /* CACHED sequences dropped (pages released, no copy) */
    uint64_t cache_demotes;       /* CACHED sequences demoted to host/disk */
    uint64_t pages_discarded;     /* block-table entries released by kvvm_seq_discard */
    /* --- additions: device memory as the driver reports it (docs/api.md "Device memory") --- */
    uint64_t device_mem_free;     /* bytes free on the device now (cuMemGetInfo at this call;
                                     memory held by other users of the GPU is not free) */
    uint64_t device_mem_total;    /* bytes of device memory */
    uint64_t device_budget;       /* the device budget in force, bytes (below the configured
                                     one after a clamp at open; kvvm_set_budget changes it) */
    uint64_t create_oom;          /* cuMemCreate out-of-memory failures: the device had less
                                     free memory than the budget promised */
    /* --- additions of 0.3: the prefix cache (docs/api.md "Prefix cache") --- */
    uint64_t prefix_entries;      /* entries in this context's prefix index now */
    uint64_t prefix_lookups;      /* kvvm_prefix_lookup and kvvm_prefix_attach calls */
    uint64_t prefix_hit_blocks;   /* blocks those calls found */
    uint64_t prefix_evictions;    /* entries reclaimed (dropped or demoted) */
    /* --- additions of 0.3: the shared store (docs/api.md "Shared store"); 0 without one --- */
    uint64_t store_puts;          /* entries written to the store */
    uint64_t store_gets;          /* entries read from it (checksum good) */
    uint64_t store_hits;          /* entries lookups found in it */
    uint64_t store_errors;        /* store requests that failed, timed out, or returned a
                                     value failing its checks (one per entry), and
                                     write-throughs given up (store down, staging full) */
    uint64_t store_bytes_out;     /* value bytes written (headers included) */
    uint64_t store_bytes_in;      /* value bytes read */
    /* --- additions of 0.3: prefix entries below the host tier --- */
    uint64_t prefix_spills;       /* pages only prefix entries hold written to the disk tier
                                     (writes started) */
    /* --- additions of 0.3.0 --- */
    uint64_t store_unused;        /* entries kvvm_prefix_attach read from the store whole and
                                     did not attach (no device room, a shorter local prefix,
                                     a failed call; the reason logged at info level) */
    /* --- additions of 0.4: the pool (0 without pool_socket) --- */
    uint64_t pool_leases;         /* frames received from the daemon */
    uint64_t pool_returns;        /* frames given back to it */
    uint64_t pool_waits;          /* calls that waited for the daemon */
    uint64_t pool_wait_ns;        /* ns those calls waited */
    uint64_t pool_hit_blocks;     /* blocks attached from the daemon's shared prefix index */
    uint64_t exports;             /* kvvm_seq_export calls that succeeded */
    uint64_t imports;             /* kvvm_seq_import calls that succeeded */
    /* --- additions of 0.4: the store at scale --- */
    uint64_t store_dropped;       /* queued writes dropped (store_queue_bytes reached) */
    uint64_t store_queue_bytes;   /* bytes of entries queued for the store now */
    uint64_t store_staging_bytes; /* pinned host bytes kept for kvvm_prefix_attach's reads
                                     from the store, now (at most 64 MiB; kvvm_trim frees) */
};
/* Fills min(out->size, sizeof) bytes. -EINVAL out NULL or out->size not set. */
KVVM_API int kvvm_stats(kvvm *kv, struct kvvm_stats *out);
/* The stats, the effective configuration and the backend as one JSON object.
   -EINVAL buf NULL or len 0; -ENOSPC: buf too small (buf then holds a truncated,
   NUL-terminated prefix). */
KVVM_API int kvvm_stats_json(kvvm *kv, char *buf, size_t len);

/* ---- metrics for operators (0.4; docs/api.md "Metrics for operators") ----
   The Prometheus text exposition (format 0.0.4) of every kvvm_stats figure, with # HELP and
   # TYPE per metric family: counters named kvvm_..._total (bytes kvvm_..._bytes_total,
   time kvvm_..._seconds_total), gauges never ending in _total, the figures of several
   tiers one family with a label tier="device|host|disk|store|pool" (pages_device_total
   becomes kvvm_pages{tier="device",state="total"}), and latency histograms (_bucket,
   _sum, _count) of direct reclaim, kvvm_prefix_attach and the store's requests. Returns
   the text's length, not counting its NUL (as snprintf). When len is greater than that,
   the text and its NUL are written to buf; otherwise NOTHING is written (a cut exposition
   would be a wrong one): len 0 (buf may be NULL then) asks for the length. The figures
   may grow between two calls: a caller sizing its buffer leaves room or calls again.
   -EINVAL kv NULL, or buf NULL with len > 0; -EIO as every call. */
KVVM_API int kvvm_metrics(kvvm *kv, char *buf, size_t len);

/* ---- the pool (0.4; docs/api.md "The pool") ----
   A context opened with pool_socket gets every frame from the kvvmd on that socket. */
struct kvvm_pool_info {
    size_t   size;              /* = sizeof(struct kvvm_pool_info), set by the caller */
    uint64_t pool_bytes;        /* the daemon's pool */
    uint64_t free_bytes;        /* held by no client and no entry */
    uint64_t held_bytes;        /* frames leased to this client (mapped or ready); frames
                                   it maps from shared entries or imports are not leased to
                                   it, so a zero-copy attach or import leaves this as is */
    uint64_t reserve_bytes, limit_bytes;
    uint32_t n_clients;
    int      connected;         /* 1 while the daemon answers */
    uint64_t shared_entries;    /* entries of the daemon's shared prefix index */
    uint64_t shared_bytes;      /* frames they hold (unimported exports not included) */
};
/* Fills min(info->size, sizeof) bytes with the pool's figures now (one request to the
   daemon; the last known figures once it is gone, connected 0). -EOPNOTSUPP without a
   pool; -EINVAL info NULL or info->size not set. */
KVVM_API int kvvm_pool_info(kvvm *kv, struct kvvm_pool_info *info);

/* ---- hand-off between processes (0.4; docs/api.md "Hand-off") ----
   A sequence handed, without a copy, to one import in any client of the same daemon (this
   one too): the daemon holds its frames, so the export survives the sequence's free and its
   process's exit or crash. Pages shared this way are copied on write on every side (write,
   prepare_write, a grow into the partial last page copy first, in the writer's process), so
   no client ever sees another's write. An export becomes visible to the importer only once
   the device work that wrote its bytes before the call is complete (kvvm_seq_export waits
   for the engine stream's work enqueued before it); bytes written after the call are never
   seen through it. */
typedef struct kvvm_handoff { uint8_t bytes[32]; } kvvm_handoff;  /* unguessable */
/* Hands s's pages, every region and the partial last block included, to one import: the
   token into *token (32 random bytes). s is unchanged (it copies on write from now on).
   -ENOENT s unknown, -EAGAIN s not resident (or a page of it not on the device), -EINVAL
   s empty or a page of it discarded, -EOPNOTSUPP no pool (or the pool view is on),
   -ENOMEM the daemon has no room for the record, -EIO the daemon is gone. */
KVVM_API int kvvm_seq_export(kvvm *kv, kvvm_seq s, kvvm_handoff *token);
/* A new sequence of the exported length sharing the exported pages (no copy:
   bytes_to_device is unchanged; the frames are not leased to this client, held_bytes
   unchanged; they count in this context's device budget while it maps them). Once: the
   token is then spent. -ENOENT unknown, spent or dropped token, -EINVAL another layout
   (n_regions, bytes_per_token, page_size; the export stays importable), -E2BIG longer than
   max_tokens, -ENOMEM no slot or no room in the budget, -EOPNOTSUPP no pool, -EIO the
   daemon is gone. A failed import leaves the export importable. */
KVVM_API int kvvm_seq_import(kvvm *kv, const kvvm_handoff *token, kvvm_seq *out);
/* Gives up an unimported export. -ENOENT spent, unknown or being imported; -EOPNOTSUPP no
   pool; -EIO the daemon is gone. */
KVVM_API int kvvm_handoff_drop(kvvm *kv, const kvvm_handoff *token);

/* ---- elastic device memory (0.2) ----
   kvvm_set_budget: changes the device budget at run time (a multiple of page_size, > 0, at
   most the device's capacity; the emulated device: emu_device_bytes). Growing takes effect
   at once; a growth past the frames held plus the device's free memory (cuMemGetInfo:
   memory other users of the GPU hold is not free) is -ENOMEM, the budget unchanged.
   Shrinking below the pages in use first drops CACHED sequences, then swaps out
   unprotected LIVE sequences in reclaim order (with or without KVVM_F_AUTO_SWAP), then
   releases every frame above the new budget to the driver. Whether enough can be freed is
   checked first: if not, -ENOMEM and nothing moved, the budget unchanged. The released
   memory is back with the driver once kvvm_sync returns.
   kvvm_trim: releases to the driver the device frames that hold no page (kept for reuse,
   mapped ahead, created ahead), keeping at most keep_bytes of them. Never moves data. Until
   a later call needs device pages, the library creates no frame ahead again.
   Both, with KVVM_F_POOL_VIEW: a frame an ended block id still maps is released once that id
   is unmapped, after the device work that may use it (they wait for the engine stream, in
   sync mode the device, when the step fence has not shown it done; kvvm_trim leaves such
   frames held while the engine stream captures a graph). */
KVVM_API int kvvm_set_budget(kvvm *kv, size_t device_budget);
KVVM_API int kvvm_trim(kvvm *kv, size_t keep_bytes);

/* ---- sliding-window discard (0.2) ----
   first_kept <= length. In `region` (or every region), releases and unmaps the pages lying
   wholly before token first_kept; no other address of the sequence changes, nor its length.
   Tokens [0, first_kept) of that region are gone: write/read there -EINVAL. A first_kept
   below an earlier one is a no-op. fork copies the discard; share of a discarded source
   keeps it; swap, spill, kvvm_seq_info and kvvm_seq_need count only the kept pages. A
   protected sequence's pages are released after the step fence like any release.
   Truncating to n below first_kept sets first_kept to n. */
#define KVVM_ALL_REGIONS UINT32_MAX
KVVM_API int kvvm_seq_discard(kvvm *kv, kvvm_seq s, uint32_t region, uint64_t first_kept);

/* ---- sequence classes for prefix caching (0.2) ---- */
enum kvvm_seq_class {
    KVVM_SEQ_LIVE = 0,     /* default: swapped out under pressure, least recently used first */
    KVVM_SEQ_CACHED = 1,   /* kept only for reuse (a prefix-cache entry that share/fork
                              read): when a call needs device pages it does not have,
                              dropped (pages released, nothing copied) before any LIVE
                              sequence is swapped, with or without KVVM_F_AUTO_SWAP; with
                              KVVM_F_CACHE_DEMOTE, demoted to host/disk instead when the
                              tiers below have room (a demotion is a swap: it needs
                              KVVM_F_AUTO_SWAP, or kvvm_set_budget) */
    KVVM_SEQ_PINNED = 2    /* never moved or dropped by reclaim or kvvm_set_budget (an
                              explicit kvvm_seq_swap_out still moves it) */
};
/* A dropped CACHED sequence keeps its handle: kvvm_seq_info reports dropped = 1 and length
   0; share (as source or target), fork, grow, grow_batch, read, write, swap_in and
   prefetch on it return -ESTALE
   until it is freed, or set to a class again (it is then an empty sequence of that class).
   Dropping honours the step fence like any release. */
KVVM_API int kvvm_seq_set_class(kvvm *kv, kvvm_seq s, enum kvvm_seq_class cls);

/* ---- blocks (0.3) ----
   A block is the token range one page holds in every region: block b of a sequence is its
   tokens [b * T, (b + 1) * T), T = page_size / bytes_per_token. -EINVAL NULL. */
KVVM_API int kvvm_block_tokens(kvvm *kv, uint32_t *tokens_per_block);

/* ---- prefix cache keyed by content (0.3; docs/api.md "Prefix cache") ----
   A key names one full block of KV together with everything before it: key i of a sequence
   names its tokens [0, (i + 1) * T) (an engine whose own blocks are smaller passes the key
   of its block that ends there). Engines pass their own chained digests (a digest shorter
   than 32 bytes zero-padded; at least 128 bits, collision resistant) or kvvm_prefix_keys'.
   Entries live in namespaces: an entry published under ns is seen only by calls naming ns. */
typedef struct kvvm_key { uint8_t bytes[32]; } kvvm_key;
/* For engines without a scheme: key i = XXH3-128(key i-1 || token ids of block i as
   little-endian int32 || salt), key -1 = the empty string, a key's first 16 bytes the
   digest's canonical (big-endian) form, the second 16 bytes zero (key i-1 enters the next
   digest as all its 32 bytes). Returns the number of keys written: the full blocks of
   n_tokens, at most cap (0 for tokens or keys NULL, or tokens_per_block 0). */
KVVM_API size_t kvvm_prefix_keys(const int32_t *tokens, size_t n_tokens,
                                 uint32_t tokens_per_block, const void *salt,
                                 size_t salt_len, kvvm_key *keys, size_t cap);
/* Enters s's blocks [0, n) (full blocks: n * T <= length; s in any tier) into the cache
   under keys[0..n): the cache holds their pages, shared with s (no copy; s copies on write
   as after a fork). A key already present keeps its entry and s its own pages. Returns the
   number of new entries (>= 0). With a store, the new entries are also written to it,
   off this thread, once their bytes are final (the call never waits for the store).
   -ENOENT; -EINVAL keys NULL with n > 0, n past s's full blocks, a block discarded in any
   region; -ESTALE s a dropped CACHED sequence; -EOPNOTSUPP page_size is not a multiple of
   bytes_per_token (a block does not fill its page); -ENOMEM no entry record. */
KVVM_API int kvvm_prefix_publish(kvvm *kv, kvvm_seq s, uint64_t ns, const kvvm_key *keys,
                                 size_t n);
/* The number of leading keys present, 0..n. Moves, copies and pins nothing (it marks them
   used for reclaim's LRU order). where (NULL allowed) receives for each of them its tier:
   KVVM_TIER_DEVICE, _HOST or _DISK (a block whose pages lie in several tiers: the lowest),
   or, past the local hit, _POOL for a block of the pool daemon's shared index (a context
   with pool_socket: one request per 64 keys), then _STORE for a block the shared store
   holds (one request to it).
   -EINVAL keys NULL with n > 0. */
KVVM_API int kvvm_prefix_lookup(kvvm *kv, uint64_t ns, const kvvm_key *keys, size_t n,
                                uint8_t *where);
/* dst empty: maps the longest present prefix of keys[0..n) into dst (device entries shared
   without a copy; host and disk entries brought to the device; past them, the store's
   blocks read, checked and brought up, then entered locally), sets dst's length to that
   many blocks * T and returns that number (0: a miss, not an error). All or nothing for
   what it reports: on failure dst is still empty (resident or swapped out as it was) and
   nothing else moved, but for the cache entries and CACHED sequences dropped for the
   store's blocks while they were read (a cache replacement, kept: a failure after them is
   -EIO, docs/api.md). Protects dst.
   -ENOENT; -EINVAL dst not empty or keys NULL with n > 0; -ESTALE dst a dropped CACHED
   sequence; -ENOMEM no device room for the blocks to bring up; -EBUSY capturing stream.
   A block whose disk copy is lost is a miss: its entry is dropped, the blocks before it
   attached. */
KVVM_API int kvvm_prefix_attach(kvvm *kv, kvvm_seq dst, uint64_t ns, const kvvm_key *keys,
                                size_t n);
/* Removes those entries (n == 0 and keys NULL: every entry of ns) from this context and
   from the store (keys NULL: ns's entries under this context's layout); sequences sharing
   their pages keep them. Returns the number removed from this context. -EINVAL keys NULL
   with n > 0. */
KVVM_API int kvvm_prefix_drop(kvvm *kv, uint64_t ns, const kvvm_key *keys, size_t n);
enum { KVVM_TIER_DEVICE = 1, KVVM_TIER_HOST = 2, KVVM_TIER_DISK = 3, KVVM_TIER_STORE = 4 };
/* 0.4: blocks of the pool daemon's shared prefix index (a context with pool_socket). */
enum { KVVM_TIER_POOL = 5 };
/* Entries that no sequence holds are reclaimed before any LIVE sequence is swapped (as
   CACHED sequences are): least recently looked up or attached first, and a block whose
   successor in a chain is cached after that successor (leaves first), dropped — or, with
   KVVM_F_CACHE_DEMOTE and a swap allowed (KVVM_F_AUTO_SWAP, kvvm_set_budget), demoted to
   the host tier when the room below holds them — never blocking a call that needs room.
   With a disk tier, the host pages only entries hold are spilled to disk like a swapped-out
   sequence's (first, in the same order); the entry stays (lookup says KVVM_TIER_DISK). */

enum kvvm_log_level { KVVM_LOG_DEBUG = 0, KVVM_LOG_INFO = 1, KVVM_LOG_WARN = 2,
                      KVVM_LOG_ERROR = 3, KVVM_LOG_OFF = 4 };
typedef void (*kvvm_log_fn)(int level, const char *msg, void *arg);
/* Process-wide (every context). Default: stderr at warnings; KVVM_LOG=debug|info|warn|
   error|off. fn NULL = stderr. fn runs on the thread that logs (a caller's or a library
   thread), one message at a time, and must not call libkvvm. */
/* ---- Two views of one pool: block tables for paged-attention kernels (0.3) ----
   With KVVM_F_POOL_VIEW (off by default: it maps every frame a second time), every region
   also has a pool view: block id i of region r is at kvvm_pool_base(r) + i * page_size and
   holds the same physical page as the contiguous window of the sequence(s) using it — no
   copy: bytes written through either view are the bytes read through the other. A block
   (the token range one page holds in every region: block b of a sequence is its tokens
   [b * T, (b + 1) * T), T = page_size / bytes_per_token) has ONE id, the same in every
   region (one block table for all layers: vLLM, FlashInfer, FlashAttention). Creating the
   mappings never costs a grow anything: a grow makes no more driver calls on the engine's
   thread with the view than without it (docs/api.md "Two views of one pool"). */
/* Device address of region r's pool view. -EOPNOTSUPP without KVVM_F_POOL_VIEW, -EINVAL
   NULL or region out of range. Fixed at open. */
KVVM_API int kvvm_pool_base(kvvm *kv, uint32_t region, uint64_t *addr);
/* Every id is < *n_ids (fixed at open). -EOPNOTSUPP, -EINVAL NULL. */
KVVM_API int kvvm_pool_blocks(kvvm *kv, uint32_t *n_ids);
/* ids[i] = the id of block first + i (first + n <= blocks covering the length); -1 for a
   block discarded in every region (one discarded in some regions keeps its id; its bytes
   in those regions are gone). The ids stay valid while s is resident and unchanged: a
   grow onto a new block adds ids; copy-on-write (write, prepare_write, grow into a shared
   partial block) gives that block a new id; swap-out, discard, truncate and free end
   them. Device work may use them under the same protection rule as addresses. -ENOENT,
   -EINVAL (NULL, range past the blocks), -EAGAIN s is not resident (swap it in first),
   -EOPNOTSUPP no pool view, -ESTALE a dropped CACHED sequence, -ENOMEM, -EIO. */
KVVM_API int kvvm_seq_block_table(kvvm *kv, kvvm_seq s, uint32_t first, uint32_t n,
                                  int32_t *ids);
/* FlashInfer's CSR form for a batch: indptr[0] = 0, indptr[i + 1] = indptr[i] + the blocks
   of seqs[i]; indices[indptr[i] ..] its ids; last_len[i] (may be NULL) the tokens in its
   last block (1..T; 0 for an empty sequence). -ENOSPC cap too small (indptr is then
   filled, and indptr[n] says how many are needed); else errors as kvvm_seq_block_table. */
KVVM_API int kvvm_batch_block_table(kvvm *kv, const kvvm_seq *seqs, size_t n, int32_t *indptr,
                                    int32_t *indices, size_t cap, int32_t *last_len);

KVVM_API void kvvm_set_log(kvvm_log_fn fn, void *arg, int level);
KVVM_API const char *kvvm_strerror(int err);
/* The reason of the calling thread's last failed call, in words (which argument and why, or
   what the layer that refused said), e.g. "kvvm_seq_grow: length 3 is shorter than the
   sequence's 8 tokens ...". Every call that returns a status clears it when it starts and
   sets it when it fails, so it is "" after a success (and before any failure); the void
   calls, kvvm_strerror, kvvm_backend_name and kvvm_version leave it as it is. The string is
   the thread's own and stays valid until its next libkvvm call. Never NULL. */
KVVM_API const char *kvvm_last_error(void);
KVVM_API const char *kvvm_backend_name(kvvm *kv);   /* "cuda" or "emulated" */
KVVM_API const char *kvvm_version(void);

#ifdef __cplusplus
}
#endif
#endif /* KVVM_H */
