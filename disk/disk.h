/*
 * disk/disk.h: the disk tier's engine — one spill file, its slots, asynchronous page I/O
 * (io_uring, or pread/pwrite on a worker thread) and per-page checksums.
 *
 * Contract:
 *  - One struct disk = one unnamed file in params.dir: O_TMPFILE (else created and unlinked
 *    at once), mode 0600, O_DIRECT, preallocated (fallocate) to floor(budget / page_size)
 *    page slots. It never has a name that outlives disk_open, so it vanishes with the
 *    process even on SIGKILL; it is never fsynced (the file dies with the process).
 *  - A RAM-backed directory (tmpfs, ramfs) is refused (-EINVAL, logged) unless
 *    DISK_F_ALLOW_TMPFS; a directory refusing O_DIRECT is refused (-EINVAL, logged) unless
 *    DISK_F_BUFFERED, which then uses the page cache and says so in the log.
 *  - Direct-I/O alignment comes from statx(STATX_DIOALIGN) when the kernel reports it, else
 *    the underlying device's logical block size (BLKSSZGET), else 4096. page_size and io_size
 *    must be multiples of the offset alignment and buffers aligned to the memory alignment
 *    (-EINVAL at open / submit otherwise).
 *  - Slots (disk_slot, a typed id; byte offset = idx * page_size) are allocated in clusters
 *    of cluster_pages consecutive slots: an allocation continues after a hint slot (the last
 *    slot of the same sequence) when it can, else in the allocator's current cluster, else in
 *    a wholly free cluster, else anywhere. Never over budget: -ENOMEM when too few are free
 *    (a full disk tier is pressure, never a crash); an allocation is all or nothing.
 *  - I/O is asynchronous: disk_submit() queues page requests and returns; the engine's own
 *    thread submits them (at most queue_depth I/Os in flight, each at most io_size bytes) and
 *    reaps their completions, so progress never depends on the caller polling. Each page
 *    request ends with exactly one completion, delivered either to params.on_complete (called
 *    on the engine thread with no lock held; it may submit, free slots and read stats, but
 *    must not call disk_wait_all or disk_close, which wait for it) or, when that is NULL,
 *    to a completion queue the caller drains with disk_reap() (thread safe). A
 *    completion's status is 0 only when every byte of the page was transferred by
 *    full-length completions (short transfers are resubmitted for the rest; -EAGAIN and
 *    -EINTR are retried up to DISK_MAX_RETRIES times). Otherwise it is the negative errno of
 *    the failure and only that page is affected: -EIO/-ENOSPC (counted in io_errors, logged),
 *    -EBADMSG on a checksum mismatch (counted in checksum_failures, logged), -ENODATA a read
 *    of a slot whose last write did not complete successfully.
 *  - Checksums: a successful write records, in memory, an XXH3 (64-bit, libxxhash) of the
 *    page's bytes seeded with its identity (page id, slot): disk_checksum. A read
 *    recomputes it over the bytes read and the identity the reader names; any mismatch is
 *    -EBADMSG. A failed read's buffer holds unspecified bytes: the status, not the bytes,
 *    is the truth.
 *  - A slot with I/O in flight cannot be freed (-EBUSY); buffers must stay untouched until
 *    their completion is delivered.
 *  - Thread safety: every function may be called from any thread, except disk_close, which
 *    must be the last call (it waits for everything in flight, then frees).
 *  - Engines: params.engine, else the KVVM_IO_ENGINE environment variable (io_uring|psync),
 *    else io_uring when io_uring_queue_init works and psync otherwise (one log line). An
 *    engine asked for explicitly that cannot be set up fails disk_open (-EOPNOTSUPP, logged).
 *    With io_uring the buffer range params.buf_base/buf_bytes (the host arena) is registered
 *    as fixed buffers of at most 1 GiB each and the file as a fixed file; when buffer
 *    registration is refused I/O uses plain buffers (logged once).
 *  - It knows nothing of sequences, tiers or policy; swap/ decides what to spill and when.
 */
#ifndef KVVM_DISK_DISK_H
#define KVVM_DISK_DISK_H

#include <stddef.h>
#include <stdint.h>

struct disk;

/* A disk slot id; DISK_SLOT_NONE names none. */
typedef struct { uint32_t idx; } disk_slot;
#define DISK_SLOT_NONE ((disk_slot){ UINT32_MAX })
static inline int disk_slot_valid(disk_slot s) { return s.idx != UINT32_MAX; }

enum disk_engine {
    DISK_ENGINE_AUTO = 0,       /* KVVM_IO_ENGINE, else io_uring, else psync */
    DISK_ENGINE_IO_URING = 1,
    DISK_ENGINE_PSYNC = 2
};

#define DISK_F_ALLOW_TMPFS  (1u << 0)  /* accept a RAM-backed directory */
#define DISK_F_BUFFERED     (1u << 1)  /* accept a directory refusing O_DIRECT (page cache) */
#define DISK_F_TEST_NO_URING (1u << 2) /* test hook: behave as if io_uring_queue_init failed */
#define DISK_F_TEST_NO_TMPFILE (1u << 3) /* test hook: behave as if O_TMPFILE were unsupported */

#define DISK_MAX_RETRIES 8              /* -EAGAIN/-EINTR resubmissions per I/O */

enum disk_op { DISK_WRITE = 1, DISK_READ = 2 };

/* One page completion. */
struct disk_cqe {
    void       *user;            /* the request's user pointer */
    uint64_t    page;            /* the request's page identity */
    disk_slot  slot;
    enum disk_op op;
    int         status;          /* 0, or -EIO/-ENOSPC/-EBADMSG/-ENODATA/-EINVAL/... */
};

typedef void (*disk_complete_fn)(void *arg, const struct disk_cqe *cqe);

struct disk_params {
    const char *dir;             /* directory for the file */
    size_t   budget;             /* bytes of disk; slots = budget / page_size */
    size_t   page_size;          /* bytes per slot and per page request */
    void    *buf_base;           /* buffers to register (the host arena), or NULL */
    size_t   buf_bytes;
    unsigned queue_depth;        /* I/Os in flight; 0 = 32 */
    size_t   io_size;            /* bytes per I/O; 0 = page_size; divides page_size */
    unsigned cluster_pages;      /* slots per allocation cluster; 0 = 16 */
    enum disk_engine engine;
    unsigned flags;              /* DISK_F_* */
    disk_complete_fn on_complete; /* NULL = completions go to the queue (disk_reap) */
    void    *on_complete_arg;
};

/* -EINVAL bad params, tmpfs refused, O_DIRECT refused (each logged with the reason);
   -ENOENT/-EACCES/-ENOTDIR the directory; -ENOSPC the file system cannot hold the budget;
   -EOPNOTSUPP the engine asked for explicitly cannot be set up; -ENOMEM. Nothing is left
   behind on failure. */
int  disk_open(const struct disk_params *p, struct disk **out);
/* Waits for all I/O in flight (completions still delivered), stops the engine thread,
   closes (and so deletes) the file. Undrained queued completions are dropped. NULL no-op. */
void disk_close(struct disk *dk);

const char *disk_engine_name(const struct disk *dk);   /* "io_uring" or "psync" */
int    disk_buffers_registered(const struct disk *dk); /* 1 fixed buffers in use, else 0 */
size_t disk_page_size(const struct disk *dk);
size_t disk_dio_align(const struct disk *dk);          /* offset alignment in use */
int    disk_direct(const struct disk *dk);             /* 1 O_DIRECT, 0 buffered */

/* Allocates n slots (all or nothing), clustered after hint (DISK_SLOT_NONE = no hint).
   -ENOMEM fewer than n free, -EINVAL n == 0 or out NULL. */
int disk_slot_alloc(struct disk *dk, size_t n, disk_slot hint, disk_slot *out);
/* -EINVAL not allocated, -EBUSY I/O in flight on it. Forgets the slot's checksum. */
int disk_slot_free(struct disk *dk, disk_slot s);

/* One page request. buf: page_size bytes, aligned (disk_dio_align's memory alignment). */
struct disk_req {
    enum disk_op op;
    disk_slot slot;             /* allocated slot */
    void      *buf;
    uint64_t   page;             /* the page's identity, part of its checksum */
    void      *user;             /* returned in the completion */
};
/* Queues n requests; they complete asynchronously, one completion each. Write checksums are
   computed here, on the caller's thread, while the engine already works on the pages before
   (disk_checksum). All or nothing: on error none was queued. -EINVAL a bad request (slot
   not allocated, misaligned buffer, bad op), -EBUSY a slot named twice in flight,
   -ESHUTDOWN closing. */
int disk_submit(struct disk *dk, const struct disk_req *reqs, size_t n);
/* Drains up to max queued completions; returns how many (0 when none), never blocks. */
size_t disk_reap(struct disk *dk, struct disk_cqe *out, size_t max);
/* Blocks until no request is in flight: every request submitted before the call (and any
   submitted meanwhile by other threads) has been delivered (callback returned, or queued for
   disk_reap). Returns 0, -EINVAL for NULL. */
int disk_wait_all(struct disk *dk);

struct disk_stats {
    uint64_t slots_total, slots_free;
    uint64_t inflight;           /* page requests queued or in flight */
    uint64_t writes, reads;      /* page requests completed successfully */
    uint64_t bytes_written, bytes_read;
    uint64_t failed;             /* page requests completed with an error */
    uint64_t io_errors;          /* pages failed by -EIO/-ENOSPC (or another I/O error) */
    uint64_t checksum_failures;
    uint64_t retries;            /* -EAGAIN/-EINTR resubmissions */
    uint64_t short_transfers;    /* short completions resubmitted for the rest */
    uint64_t submissions;        /* I/Os handed to the kernel (incl. resubmissions) */
};
void disk_stats_get(struct disk *dk, struct disk_stats *out);

/* The checksum a write records and a read verifies: XXH3 (64-bit) of len bytes at buf,
   seeded with the identity (page, s); the same bytes under another page id or in another
   slot give another value. Pure; any thread. */
uint64_t disk_checksum(const void *buf, size_t len, uint64_t page, disk_slot s);

/* --- test hooks ---------------------------------------------------------------------- */
enum disk_fault_kind {
    DISK_FAULT_ERROR = 1,       /* the I/O completes with err, nothing transferred */
    DISK_FAULT_SHORT = 2        /* the I/O transfers about half its bytes (aligned) */
};
/* Arms a fault on the nth (1-based) I/O submission counted from this call (resubmissions
   count). Up to 16 armed at once. -EINVAL bad kind/nth, -ENOSPC too many armed. */
int  disk_fault_arm(struct disk *dk, unsigned long nth, enum disk_fault_kind kind, int err);
void disk_fault_clear(struct disk *dk);
/* XORs 0xff into len bytes of slot s's data at offset off (through a separate descriptor,
   bypassing checksums). -EINVAL out of range, or the errno of the I/O. */
int  disk_test_corrupt(struct disk *dk, disk_slot s, size_t off, size_t len);

#endif
