/*
 * swap/spill.c: the disk tier's engine (contract in spill.h).
 *
 * Design
 *  - File: opened unnamed (O_TMPFILE, else create + unlink at once), O_DIRECT, fallocated to
 *    the slot count. Slot i lives at byte i * page_size.
 *  - Slots: a per-slot info array (allocated, busy, checksum) and a free count per cluster of
 *    cluster_pages slots. Allocation tries: after the hint, the current cluster, a wholly
 *    free cluster, then any cluster with room (after Linux's swap cluster allocator: a
 *    sequence's pages stay close, and concurrent streams do not interleave within a cluster).
 *  - Requests: spill_submit() copies each page request into a struct spill_page and appends
 *    it to `pending` under the lock, then kicks the engine thread. The engine thread owns the
 *    scheduler state (run queue, retry list, I/O slots) without a lock: it splits each page
 *    into I/Os of io_size bytes, keeps at most queue_depth of them in flight, and handles
 *    every completion in io_complete(): -EAGAIN/-EINTR are retried (bounded), a short
 *    transfer is resubmitted for the rest, any other error fails the page. When a page's last
 *    I/O is done, page_done() records (write) or verifies (read) the checksum and delivers
 *    the completion. Write checksums are computed in spill_submit() on the caller's thread,
 *    page by page as each is handed over, so hashing overlaps the engine's I/O instead of
 *    delaying its reaping.
 *  - Engines differ only in how one I/O is issued and reaped: io_uring (fixed file, fixed
 *    buffers when registered, an eventfd poll in the ring wakes the thread for new work) or
 *    psync (pread/pwrite on the engine thread itself, one at a time; a condition variable
 *    wakes it).
 *
 * Locks: sp->lock protects slot info, cluster counts, pending, done, inflight, faults and the
 * stop flag; sp->work_cv signals new work (psync), sp->idle_cv that nothing is in flight
 * any more (spill_wait_all; signalled only then, so waiters are not woken per page). The
 * engine's
 * run queue, retry list and I/O slots are the engine thread's alone. Stats are atomics.
 */
#include "spill.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <linux/fs.h>
#include <linux/magic.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"

#ifndef RAMFS_MAGIC
#define RAMFS_MAGIC 0x858458f6
#endif
#ifndef STATX_DIOALIGN
#define STATX_DIOALIGN 0x00002000U
#endif

#define SPILL_DEFAULT_QD      32
#define SPILL_DEFAULT_CLUSTER 16
#define SPILL_MAX_FAULTS      16
#define SPILL_POLL_TAG        ((uint64_t)1)   /* user_data of the eventfd poll (ios are
                                                 pointers, never 1) */

/* ---- checksum: XXH64 ------------------------------------------------------------------ */

#define XP1 0x9E3779B185EBCA87ULL
#define XP2 0xC2B2AE3D27D4EB4FULL
#define XP3 0x165667B19E3779F9ULL
#define XP4 0x85EBCA77C2B2AE63ULL
#define XP5 0x27D4EB2F165667C5ULL

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static inline uint64_t rd64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline uint32_t rd32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t xround(uint64_t acc, uint64_t in)
{
    acc += in * XP2;
    acc = rotl64(acc, 31);
    return acc * XP1;
}
static inline uint64_t xmerge(uint64_t acc, uint64_t v)
{
    acc ^= xround(0, v);
    return acc * XP1 + XP4;
}

static uint64_t xxh64(const void *data, size_t len, uint64_t seed)
{
    const unsigned char *p = data, *end = p + len;
    uint64_t h;
    if (len >= 32) {
        uint64_t v1 = seed + XP1 + XP2, v2 = seed + XP2, v3 = seed, v4 = seed - XP1;
        const unsigned char *limit = end - 32;
        do {
            v1 = xround(v1, rd64(p));
            v2 = xround(v2, rd64(p + 8));
            v3 = xround(v3, rd64(p + 16));
            v4 = xround(v4, rd64(p + 24));
            p += 32;
        } while (p <= limit);
        h = rotl64(v1, 1) + rotl64(v2, 7) + rotl64(v3, 12) + rotl64(v4, 18);
        h = xmerge(h, v1);
        h = xmerge(h, v2);
        h = xmerge(h, v3);
        h = xmerge(h, v4);
    } else {
        h = seed + XP5;
    }
    h += (uint64_t)len;
    while (p + 8 <= end) {
        h ^= xround(0, rd64(p));
        h = rotl64(h, 27) * XP1 + XP4;
        p += 8;
    }
    if (p + 4 <= end) {
        h ^= (uint64_t)rd32(p) * XP1;
        h = rotl64(h, 23) * XP2 + XP3;
        p += 4;
    }
    while (p < end) {
        h ^= (*p++) * XP5;
        h = rotl64(h, 11) * XP1;
    }
    h ^= h >> 33;
    h *= XP2;
    h ^= h >> 29;
    h *= XP3;
    h ^= h >> 32;
    return h;
}

/* The checksum of a page's bytes bound to its identity: the same bytes under another page
   id or in another slot do not verify. */
static uint64_t page_sum(const void *buf, size_t len, uint64_t page, spill_slot s)
{
    uint64_t seed = (page * XP5) ^ ((uint64_t)s.idx * XP2 + XP3);
    return xxh64(buf, len, seed);
}

/* ---- state ---------------------------------------------------------------------------- */

struct spill_page {
    struct spill_req req;
    uint64_t sum;                /* write: checksum of the bytes, computed before the I/O */
    uint32_t ios_next;           /* next I/O index to start (engine thread) */
    uint32_t ios_left;           /* I/Os not yet finished (engine thread) */
    int status;                  /* first error, 0 so far */
    struct spill_page *next;     /* pending / run queue / done list link */
};

struct spill_io {
    struct spill_page *pg;
    uint64_t off;                /* file offset of what is left to transfer */
    char    *buf;
    size_t   len;                /* bytes left */
    int      retries;
    int      inject;             /* injected result for the current issue (0 = none) */
    struct spill_io *next;       /* free / retry list link */
};

struct slot_info {
    uint64_t sum;                /* checksum of the last successful write */
    uint64_t page;               /* page id of that write */
    uint8_t  used;               /* allocated */
    uint8_t  busy;               /* a request on it is queued or in flight */
    uint8_t  valid;              /* sum/page describe the bytes on disk */
};

struct spill_fault {
    unsigned long at;            /* submission number it fires on */
    int kind, err;
};

struct spill {
    /* fixed after open */
    int fd;
    size_t page_size, io_size;
    uint32_t n_slots, cluster, n_clusters;
    size_t dio_mem_align, dio_off_align;
    int direct;
    unsigned qd;
    enum spill_engine engine;
    spill_complete_fn on_complete;
    void *on_complete_arg;
    char *buf_base;              /* registered buffer range */
    size_t buf_bytes, buf_chunk; /* chunk = one registered iovec's length */
    int bufs_registered, file_registered;
    struct io_uring ring;
    int ring_up;
    int efd;                     /* io_uring: wakes the engine for new work */
    pthread_t thread;
    int thread_up;

    pthread_mutex_t lock;
    pthread_cond_t work_cv;      /* new work (psync engine) */
    pthread_cond_t idle_cv;      /* inflight dropped to 0 */
    struct slot_info *slots;     /* [n_slots] */
    uint32_t *cl_free;           /* [n_clusters] free slots per cluster */
    uint32_t n_free;
    uint32_t cur_cl;             /* allocator's current cluster */
    uint32_t cl_cursor;          /* where the search for a free cluster resumes */
    struct spill_page *pending_head, *pending_tail;
    struct spill_page *done_head, *done_tail;
    uint64_t inflight;           /* pages submitted and not yet delivered */
    int stop;
    struct spill_fault faults[SPILL_MAX_FAULTS];
    int n_faults;

    /* engine thread only */
    struct spill_page *run_head, *run_tail;
    struct spill_io *io_free, *retry_head, *retry_tail;
    struct spill_io *ios;        /* [qd] */
    unsigned ios_busy;

    /* stats (atomic) */
    uint64_t st_writes, st_reads, st_bytes_w, st_bytes_r, st_failed, st_io_errors,
             st_csum, st_retries, st_short, st_subs;
};

#define STAT_ADD(sp, f, n) __atomic_fetch_add(&(sp)->f, (n), __ATOMIC_RELAXED)

/* ---- file ----------------------------------------------------------------------------- */

/* Opens an unnamed file in dir: O_TMPFILE, else create + unlink at once. 0 or -errno. */
static int spill_open_file(const char *dir, int direct, int no_tmpfile, int *fd_out)
{
    int flags = O_RDWR | O_CLOEXEC | (direct ? O_DIRECT : 0);
    int fd = no_tmpfile ? -1 : open(dir, flags | O_TMPFILE, 0600);
    if (fd >= 0) {
        *fd_out = fd;
        return 0;
    }
    int e = no_tmpfile ? EOPNOTSUPP : errno;
    if (e != EOPNOTSUPP && e != EISDIR && e != EINVAL)
        return -e;
    /* No O_TMPFILE here (or O_DIRECT refused; the named open below tells which). */
    static unsigned long counter;
    char path[4096];
    for (int tries = 0; tries < 16; tries++) {
        unsigned long c = __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
        int n = snprintf(path, sizeof(path), "%s/.kvvm-spill-%d-%lu-%llx", dir, (int)getpid(),
                         c, (unsigned long long)know_ns());
        if (n < 0 || (size_t)n >= sizeof(path))
            return -ENAMETOOLONG;
        fd = open(path, flags | O_CREAT | O_EXCL, 0600);
        if (fd >= 0) {
            if (unlink(path) != 0) {
                e = errno;
                close(fd);
                return -e;
            }
            klog_info("spill: %s has no O_TMPFILE; created and unlinked a file instead", dir);
            *fd_out = fd;
            return 0;
        }
        if (errno != EEXIST)
            return -errno;
    }
    return -EEXIST;
}

static size_t spill_sysfs_lbs(unsigned maj, unsigned min)
{
    static const char *const fmts[] = { "/sys/dev/block/%u:%u/queue/logical_block_size",
                                        "/sys/dev/block/%u:%u/../queue/logical_block_size" };
    for (size_t i = 0; i < 2; i++) {
        char path[128];
        snprintf(path, sizeof(path), fmts[i], maj, min);
        FILE *f = fopen(path, "re");
        if (!f)
            continue;
        unsigned long v = 0;
        int ok = fscanf(f, "%lu", &v) == 1;
        fclose(f);
        if (ok && v)
            return v;
    }
    return 0;
}

/* Direct-I/O alignment: statx(STATX_DIOALIGN), else the device's logical block size, else
   4096. */
static void spill_dio_alignment(struct spill *sp)
{
    struct statx stx;
    memset(&stx, 0, sizeof(stx));
    if (statx(sp->fd, "", AT_EMPTY_PATH, STATX_DIOALIGN | STATX_BASIC_STATS, &stx) == 0 &&
        (stx.stx_mask & STATX_DIOALIGN) && stx.stx_dio_offset_align) {
        sp->dio_off_align = stx.stx_dio_offset_align;
        sp->dio_mem_align = stx.stx_dio_mem_align ? stx.stx_dio_mem_align : 1;
        klog_debug("spill: direct-I/O alignment from statx: offset %zu, memory %zu",
                   sp->dio_off_align, sp->dio_mem_align);
        return;
    }
    size_t lbs = 0;
    struct stat st;
    if (fstat(sp->fd, &st) == 0) {
        char dev[64];
        snprintf(dev, sizeof(dev), "/dev/block/%u:%u", major(st.st_dev), minor(st.st_dev));
        int bfd = open(dev, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
        if (bfd >= 0) {
            int v = 0;
            if (ioctl(bfd, BLKSSZGET, &v) == 0 && v > 0)
                lbs = (size_t)v;
            close(bfd);
        }
        if (!lbs)
            lbs = spill_sysfs_lbs(major(st.st_dev), minor(st.st_dev));
    }
    if (!lbs)
        lbs = 4096;
    sp->dio_off_align = lbs;
    sp->dio_mem_align = lbs;
    klog_debug("spill: statx reports no direct-I/O alignment; using %zu bytes", lbs);
}

/* ---- slots ---------------------------------------------------------------------------- */

/* Takes slot i (free). Caller holds the lock. */
static void slot_take_locked(struct spill *sp, uint32_t i)
{
    sp->slots[i].used = 1;
    sp->slots[i].valid = 0;
    sp->cl_free[i / sp->cluster]--;
    sp->n_free--;
}

static uint32_t cluster_end(const struct spill *sp, uint32_t c)
{
    uint64_t e = (uint64_t)(c + 1) * sp->cluster;
    return e > sp->n_slots ? sp->n_slots : (uint32_t)e;
}

static uint32_t cluster_size(const struct spill *sp, uint32_t c)
{
    return cluster_end(sp, c) - c * sp->cluster;
}

/* First free slot in [from, cluster c's end), or UINT32_MAX. */
static uint32_t cluster_scan(const struct spill *sp, uint32_t c, uint32_t from)
{
    if (sp->cl_free[c] == 0)
        return UINT32_MAX;
    uint32_t start = c * sp->cluster;
    if (from < start)
        from = start;
    for (uint32_t i = from; i < cluster_end(sp, c); i++)
        if (!sp->slots[i].used)
            return i;
    return UINT32_MAX;
}

/* One slot, near hint when possible. Caller holds the lock and has checked n_free > 0. */
static uint32_t slot_alloc_one_locked(struct spill *sp, uint32_t hint)
{
    uint32_t i;
    if (hint < sp->n_slots) {
        uint32_t c = hint / sp->cluster;
        if ((i = cluster_scan(sp, c, hint + 1)) != UINT32_MAX)
            return i;
        /* Continue into the next cluster only if nobody else has started it. */
        if (c + 1 < sp->n_clusters && sp->cl_free[c + 1] == cluster_size(sp, c + 1)) {
            sp->cur_cl = c + 1;
            return (c + 1) * sp->cluster;
        }
    }
    if ((i = cluster_scan(sp, sp->cur_cl, 0)) != UINT32_MAX)
        return i;
    for (uint32_t k = 0; k < sp->n_clusters; k++) {
        uint32_t c = (sp->cl_cursor + k) % sp->n_clusters;
        if (sp->cl_free[c] == cluster_size(sp, c)) {
            sp->cur_cl = c;
            sp->cl_cursor = (c + 1) % sp->n_clusters;
            return c * sp->cluster;
        }
    }
    for (uint32_t k = 0; k < sp->n_clusters; k++) {
        uint32_t c = (sp->cl_cursor + k) % sp->n_clusters;
        if ((i = cluster_scan(sp, c, 0)) != UINT32_MAX) {
            sp->cur_cl = c;
            return i;
        }
    }
    return UINT32_MAX;   /* not reached when n_free > 0 */
}

int spill_slot_alloc(struct spill *sp, size_t n, spill_slot hint, spill_slot *out)
{
    if (!sp || !out || n == 0)
        return -EINVAL;
    pthread_mutex_lock(&sp->lock);
    if (n > sp->n_free) {
        pthread_mutex_unlock(&sp->lock);
        return -ENOMEM;
    }
    uint32_t h = hint.idx;
    for (size_t k = 0; k < n; k++) {
        uint32_t i = slot_alloc_one_locked(sp, h);
        slot_take_locked(sp, i);
        out[k].idx = i;
        h = i;
    }
    pthread_mutex_unlock(&sp->lock);
    return 0;
}

int spill_slot_free(struct spill *sp, spill_slot s)
{
    if (!sp)
        return -EINVAL;
    pthread_mutex_lock(&sp->lock);
    int err = 0;
    if (s.idx >= sp->n_slots || !sp->slots[s.idx].used) {
        err = -EINVAL;
    } else if (sp->slots[s.idx].busy) {
        err = -EBUSY;
    } else {
        sp->slots[s.idx].used = 0;
        sp->slots[s.idx].valid = 0;
        sp->cl_free[s.idx / sp->cluster]++;
        sp->n_free++;
    }
    pthread_mutex_unlock(&sp->lock);
    if (err == -EINVAL)
        klog_error("spill: free of slot %u that is not allocated", s.idx);
    return err;
}

/* ---- engine: common scheduling ------------------------------------------------------- */

static void engine_issue(struct spill *sp, struct spill_io *io);

/* Decides whether this submission is faulted; returns the length to issue (len, or a short
   one) and sets io->inject for an injected error. */
static size_t fault_check(struct spill *sp, struct spill_io *io)
{
    unsigned long n = STAT_ADD(sp, st_subs, 1) + 1;
    size_t len = io->len;
    io->inject = 0;
    pthread_mutex_lock(&sp->lock);
    for (int k = 0; k < sp->n_faults; k++) {
        if (sp->faults[k].at != n)
            continue;
        if (sp->faults[k].kind == SPILL_FAULT_ERROR) {
            io->inject = sp->faults[k].err;
        } else {
            size_t half = (len / 2) / sp->dio_off_align * sp->dio_off_align;
            if (half > 0)
                len = half;
        }
        sp->faults[k] = sp->faults[--sp->n_faults];
        break;
    }
    pthread_mutex_unlock(&sp->lock);
    return len;
}

/* Delivers a finished page: checksum bookkeeping, stats, completion, slot released. */
static void page_done(struct spill *sp, struct spill_page *pg)
{
    struct spill_req *r = &pg->req;
    struct slot_info *si = &sp->slots[r->slot.idx];
    if (pg->status == 0 && r->op == SPILL_READ) {
        pthread_mutex_lock(&sp->lock);
        uint64_t want = si->sum, want_page = si->page;
        pthread_mutex_unlock(&sp->lock);
        uint64_t got = page_sum(r->buf, sp->page_size, r->page, r->slot);
        if (want_page != r->page || got != want) {
            pg->status = -EBADMSG;
            STAT_ADD(sp, st_csum, 1);
            klog_error("spill: checksum mismatch reading page %" PRIu64 " from slot %u "
                       "(stored for page %" PRIu64 "): data lost", r->page, r->slot.idx,
                       want_page);
        }
    }
    if (pg->status == 0) {
        if (r->op == SPILL_WRITE) {
            STAT_ADD(sp, st_writes, 1);
            STAT_ADD(sp, st_bytes_w, sp->page_size);
        } else {
            STAT_ADD(sp, st_reads, 1);
            STAT_ADD(sp, st_bytes_r, sp->page_size);
        }
    } else {
        STAT_ADD(sp, st_failed, 1);
    }

    struct spill_cqe cqe = { r->user, r->page, r->slot, r->op, pg->status };
    pthread_mutex_lock(&sp->lock);
    if (r->op == SPILL_WRITE && pg->status == 0) {
        si->sum = pg->sum;
        si->page = r->page;
        si->valid = 1;
    }
    si->busy = 0;
    if (!sp->on_complete) {
        pg->next = NULL;
        if (sp->done_tail)
            sp->done_tail->next = pg;
        else
            sp->done_head = pg;
        sp->done_tail = pg;
        if (--sp->inflight == 0)
            pthread_cond_broadcast(&sp->idle_cv);
        pthread_mutex_unlock(&sp->lock);
        return;
    }
    pthread_mutex_unlock(&sp->lock);
    /* Callback mode: the page counts as in flight until its callback has returned, so
       spill_wait_all also waits for the callbacks. */
    sp->on_complete(sp->on_complete_arg, &cqe);
    free(pg);
    pthread_mutex_lock(&sp->lock);
    if (--sp->inflight == 0)
        pthread_cond_broadcast(&sp->idle_cv);
    pthread_mutex_unlock(&sp->lock);
}

static void io_put(struct spill *sp, struct spill_io *io)
{
    io->next = sp->io_free;
    sp->io_free = io;
    sp->ios_busy--;
}

static void retry_push(struct spill *sp, struct spill_io *io)
{
    io->next = NULL;
    if (sp->retry_tail)
        sp->retry_tail->next = io;
    else
        sp->retry_head = io;
    sp->retry_tail = io;
}

/* One I/O's completion (res: bytes or -errno). */
static void io_complete(struct spill *sp, struct spill_io *io, int res)
{
    struct spill_page *pg = io->pg;
    if (io->inject)
        res = io->inject;
    if ((res == -EAGAIN || res == -EINTR) && io->retries < SPILL_MAX_RETRIES) {
        io->retries++;
        STAT_ADD(sp, st_retries, 1);
        retry_push(sp, io);
        return;
    }
    if (res == 0)
        res = -EIO;      /* no progress: past the end of the file or a dead device */
    if (res > 0 && (size_t)res < io->len) {
        io->off += (size_t)res;
        io->buf += (size_t)res;
        io->len -= (size_t)res;
        STAT_ADD(sp, st_short, 1);
        retry_push(sp, io);
        return;
    }
    if (res < 0) {
        if (pg->status == 0)
            pg->status = res;
        if (res != -EAGAIN && res != -EINTR)
            STAT_ADD(sp, st_io_errors, 1);
        klog_error("spill: %s of page %" PRIu64 " at slot %u failed: %s; only this page is "
                   "affected", pg->req.op == SPILL_WRITE ? "write" : "read", pg->req.page,
                   pg->req.slot.idx, strerror(-res));
    }
    io_put(sp, io);
    if (--pg->ios_left == 0)
        page_done(sp, pg);
}

/* Moves newly submitted pages to the engine's run queue. Returns the stop flag. */
static int take_pending(struct spill *sp)
{
    pthread_mutex_lock(&sp->lock);
    if (sp->pending_head) {
        if (sp->run_tail)
            sp->run_tail->next = sp->pending_head;
        else
            sp->run_head = sp->pending_head;
        sp->run_tail = sp->pending_tail;
        sp->pending_head = sp->pending_tail = NULL;
    }
    int stop = sp->stop;
    pthread_mutex_unlock(&sp->lock);
    return stop;
}

/* The next I/O to issue (a retry first, then the next piece of the head page), or NULL.
   A page that needs no I/O (a read of a slot without valid data) is completed here. */
static struct spill_io *next_io(struct spill *sp)
{
    struct spill_io *io;
    if ((io = sp->retry_head)) {      /* a retried I/O keeps its slot: first, always */
        sp->retry_head = io->next;
        if (!sp->retry_head)
            sp->retry_tail = NULL;
        return io;
    }
    if (!sp->io_free)
        return NULL;
    while (sp->run_head) {
        struct spill_page *pg = sp->run_head;
        uint32_t n_ios = (uint32_t)(sp->page_size / sp->io_size);
        if (pg->ios_next == 0) {
            if (pg->req.op == SPILL_READ) {
                pthread_mutex_lock(&sp->lock);
                int valid = sp->slots[pg->req.slot.idx].valid;
                pthread_mutex_unlock(&sp->lock);
                if (!valid) {
                    sp->run_head = pg->next;
                    if (!sp->run_head)
                        sp->run_tail = NULL;
                    pg->status = -ENODATA;
                    page_done(sp, pg);
                    continue;
                }
            }
            pg->ios_left = n_ios;
        }
        io = sp->io_free;
        sp->io_free = io->next;
        sp->ios_busy++;
        uint32_t k = pg->ios_next++;
        io->pg = pg;
        io->off = (uint64_t)pg->req.slot.idx * sp->page_size + (uint64_t)k * sp->io_size;
        io->buf = (char *)pg->req.buf + (size_t)k * sp->io_size;
        io->len = sp->io_size;
        io->retries = 0;
        io->inject = 0;
        if (pg->ios_next == n_ios) {
            sp->run_head = pg->next;
            if (!sp->run_head)
                sp->run_tail = NULL;
        }
        return io;
    }
    return NULL;
}

static int engine_idle(const struct spill *sp)
{
    return !sp->run_head && !sp->retry_head && sp->ios_busy == 0;
}

/* ---- engine: psync -------------------------------------------------------------------- */

static void *psync_thread(void *arg)
{
    struct spill *sp = arg;
    for (;;) {
        int stop = take_pending(sp);
        struct spill_io *io = next_io(sp);
        if (!io) {
            pthread_mutex_lock(&sp->lock);
            if (!sp->pending_head && engine_idle(sp)) {
                if (stop || sp->stop) {
                    pthread_mutex_unlock(&sp->lock);
                    break;
                }
                pthread_cond_wait(&sp->work_cv, &sp->lock);
            }
            pthread_mutex_unlock(&sp->lock);
            continue;
        }
        engine_issue(sp, io);
    }
    return NULL;
}

static void psync_issue(struct spill *sp, struct spill_io *io)
{
    size_t len = fault_check(sp, io);
    ssize_t r;
    if (io->inject) {
        r = io->inject;
    } else {
        if (io->pg->req.op == SPILL_WRITE)
            r = pwrite(sp->fd, io->buf, len, (off_t)io->off);
        else
            r = pread(sp->fd, io->buf, len, (off_t)io->off);
        if (r < 0)
            r = -errno;
    }
    io_complete(sp, io, (int)r);
}

/* ---- engine: io_uring ----------------------------------------------------------------- */

static int uring_arm_poll(struct spill *sp)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&sp->ring);
    if (!sqe)
        return -EBUSY;
    io_uring_prep_poll_add(sqe, sp->efd, POLLIN);
    io_uring_sqe_set_data64(sqe, SPILL_POLL_TAG);
    return 0;
}

static void uring_issue(struct spill *sp, struct spill_io *io)
{
    size_t len = fault_check(sp, io);
    struct io_uring_sqe *sqe = io_uring_get_sqe(&sp->ring);
    if (!sqe) {
        /* Cannot happen (the ring has room for qd I/Os + the poll); be safe anyway. */
        io_uring_submit(&sp->ring);
        sqe = io_uring_get_sqe(&sp->ring);
    }
    if (io->inject) {
        io_uring_prep_nop(sqe);
    } else {
        int fd = sp->file_registered ? 0 : sp->fd;
        int fixed = -1;
        if (sp->bufs_registered && io->buf >= sp->buf_base &&
            io->buf + len <= sp->buf_base + sp->buf_bytes) {
            size_t rel = (size_t)(io->buf - sp->buf_base);
            if (rel / sp->buf_chunk == (rel + len - 1) / sp->buf_chunk)
                fixed = (int)(rel / sp->buf_chunk);
        }
        bool wr = io->pg->req.op == SPILL_WRITE;
        if (fixed >= 0 && wr)
            io_uring_prep_write_fixed(sqe, fd, io->buf, (unsigned)len, io->off, fixed);
        else if (fixed >= 0)
            io_uring_prep_read_fixed(sqe, fd, io->buf, (unsigned)len, io->off, fixed);
        else if (wr)
            io_uring_prep_write(sqe, fd, io->buf, (unsigned)len, io->off);
        else
            io_uring_prep_read(sqe, fd, io->buf, (unsigned)len, io->off);
        if (sp->file_registered)
            sqe->flags |= IOSQE_FIXED_FILE;
    }
    io_uring_sqe_set_data(sqe, io);
}

static void *uring_thread(void *arg)
{
    struct spill *sp = arg;
    int poll_armed = 0;
    for (;;) {
        int stop = take_pending(sp);
        if (!poll_armed && uring_arm_poll(sp) == 0)
            poll_armed = 1;
        struct spill_io *io;
        while ((io = next_io(sp)))
            engine_issue(sp, io);
        if (stop && engine_idle(sp)) {
            pthread_mutex_lock(&sp->lock);
            int more = sp->pending_head != NULL;
            pthread_mutex_unlock(&sp->lock);
            if (!more)
                break;
            continue;
        }
        int r = io_uring_submit_and_wait(&sp->ring, 1);
        if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
            klog_error("spill: io_uring_submit_and_wait failed: %s", strerror(-r));
            struct timespec ts = { 0, 1000000 };
            nanosleep(&ts, NULL);
        }
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        struct spill_io *done[64];
        int res[64];
        unsigned nd = 0;
        io_uring_for_each_cqe(&sp->ring, head, cqe) {
            seen++;
            if (cqe->user_data == SPILL_POLL_TAG) {
                uint64_t v;
                if (read(sp->efd, &v, sizeof(v)) < 0) { /* drained: nothing to do */ }
                poll_armed = 0;
                continue;
            }
            done[nd] = io_uring_cqe_get_data(cqe);
            res[nd] = cqe->res;
            if (++nd == 64)
                break;
        }
        io_uring_cq_advance(&sp->ring, seen);
        for (unsigned k = 0; k < nd; k++)
            io_complete(sp, done[k], res[k]);
    }
    return NULL;
}

static void engine_issue(struct spill *sp, struct spill_io *io)
{
    if (sp->engine == SPILL_ENGINE_IO_URING)
        uring_issue(sp, io);
    else
        psync_issue(sp, io);
}

static void engine_kick(struct spill *sp)
{
    if (sp->engine == SPILL_ENGINE_IO_URING) {
        uint64_t one = 1;
        if (write(sp->efd, &one, sizeof(one)) < 0) { /* counter saturated: already kicked */ }
    } else {
        pthread_mutex_lock(&sp->lock);
        pthread_cond_signal(&sp->work_cv);
        pthread_mutex_unlock(&sp->lock);
    }
}

/* Sets up the ring, registers the file and buffers. 0 or -errno (the ring is down then). */
static int uring_setup(struct spill *sp, const struct spill_params *p)
{
    if (p->flags & SPILL_F_TEST_NO_URING)
        return -ENOSYS;
    int r = io_uring_queue_init(sp->qd * 2 + 2, &sp->ring, 0);
    if (r < 0)
        return r;
    sp->ring_up = 1;
    sp->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (sp->efd < 0) {
        r = -errno;
        io_uring_queue_exit(&sp->ring);
        sp->ring_up = 0;
        return r;
    }
    r = io_uring_register_files(&sp->ring, &sp->fd, 1);
    if (r == 0)
        sp->file_registered = 1;
    else
        klog_info("spill: io_uring refused the file as a fixed file (%s); using the plain "
                  "descriptor", strerror(-r));
    if (sp->buf_base && sp->buf_bytes) {
        size_t chunk = ((size_t)1 << 30) / sp->page_size * sp->page_size;
        if (chunk == 0)
            chunk = sp->page_size;
        size_t n = (sp->buf_bytes + chunk - 1) / chunk;
        struct iovec *iov = calloc(n, sizeof(*iov));
        if (!iov) {
            r = -ENOMEM;
        } else {
            for (size_t k = 0; k < n; k++) {
                size_t off = k * chunk;
                iov[k].iov_base = sp->buf_base + off;
                iov[k].iov_len = sp->buf_bytes - off < chunk ? sp->buf_bytes - off : chunk;
            }
            r = io_uring_register_buffers(&sp->ring, iov, (unsigned)n);
            free(iov);
        }
        if (r == 0) {
            sp->bufs_registered = 1;
            sp->buf_chunk = chunk;
        } else {
            klog_warn("spill: io_uring refused to register %zu bytes of host buffers (%s; "
                      "memlock limit?); using unregistered buffers", sp->buf_bytes,
                      strerror(-r));
        }
    }
    return 0;
}

/* ---- open / close --------------------------------------------------------------------- */

static int engine_from_env(enum spill_engine *e)
{
    const char *s = getenv("KVVM_IO_ENGINE");
    if (!s || !*s)
        return 0;
    if (!strcmp(s, "io_uring"))
        *e = SPILL_ENGINE_IO_URING;
    else if (!strcmp(s, "psync"))
        *e = SPILL_ENGINE_PSYNC;
    else if (strcmp(s, "auto") != 0)
        klog_warn("KVVM_IO_ENGINE=%s is not one of io_uring|psync|auto; ignored", s);
    return 0;
}

int spill_open(const struct spill_params *p, struct spill **out)
{
    int err;
    if (!p || !out || !p->dir || !p->page_size || p->budget < p->page_size)
        return -EINVAL;
    size_t io_size = p->io_size ? p->io_size : p->page_size;
    if (io_size > p->page_size || p->page_size % io_size != 0 || io_size > (1u << 30)) {
        klog_error("spill: io_size %zu must divide page_size %zu (and be at most 1 GiB)",
                   io_size, p->page_size);
        return -EINVAL;
    }
    size_t n_slots = p->budget / p->page_size;
    if (n_slots >= UINT32_MAX)
        return -EINVAL;

    struct statfs sfs;
    if (statfs(p->dir, &sfs) != 0) {
        err = -errno;
        klog_error("spill: spill directory %s: %s", p->dir, strerror(errno));
        return err;
    }
    if ((sfs.f_type == TMPFS_MAGIC || sfs.f_type == RAMFS_MAGIC) &&
        !(p->flags & SPILL_F_ALLOW_TMPFS)) {
        klog_error("spill: spill directory %s is RAM-backed (%s): spilling there would take "
                   "memory, not free it. Use a directory on a local disk (e.g. /var/tmp), or "
                   "opt in with the flag KVVM_F_SPILL_ALLOW_TMPFS (environment: "
                   "KVVM_SPILL_ALLOW_TMPFS=1 or KVVM_FLAGS=spill_allow_tmpfs)", p->dir, sfs.f_type == TMPFS_MAGIC ? "tmpfs" : "ramfs");
        return -EINVAL;
    }

    struct spill *sp = calloc(1, sizeof(*sp));
    if (!sp)
        return -ENOMEM;
    sp->fd = -1;
    sp->efd = -1;
    sp->page_size = p->page_size;
    sp->io_size = io_size;
    sp->n_slots = (uint32_t)n_slots;
    sp->cluster = p->cluster_pages ? p->cluster_pages : SPILL_DEFAULT_CLUSTER;
    sp->n_clusters = (uint32_t)((n_slots + sp->cluster - 1) / sp->cluster);
    sp->qd = p->queue_depth ? p->queue_depth : SPILL_DEFAULT_QD;
    sp->on_complete = p->on_complete;
    sp->on_complete_arg = p->on_complete_arg;
    sp->buf_base = p->buf_base;
    sp->buf_bytes = p->buf_base ? p->buf_bytes : 0;
    if (sp->qd > 4096) {
        err = -EINVAL;
        goto out_free;
    }
    err = pthread_mutex_init(&sp->lock, NULL);
    if (err) {
        err = -err;
        goto out_free;
    }
    err = pthread_cond_init(&sp->work_cv, NULL);
    if (err) {
        err = -err;
        goto out_mutex;
    }
    err = pthread_cond_init(&sp->idle_cv, NULL);
    if (err) {
        err = -err;
        goto out_work_cv;
    }
    sp->slots = calloc(n_slots, sizeof(*sp->slots));
    sp->cl_free = calloc(sp->n_clusters, sizeof(*sp->cl_free));
    sp->ios = calloc(sp->qd, sizeof(*sp->ios));
    if (!sp->slots || !sp->cl_free || !sp->ios) {
        err = -ENOMEM;
        goto out_tables;
    }
    for (uint32_t c = 0; c < sp->n_clusters; c++)
        sp->cl_free[c] = cluster_size(sp, c);
    sp->n_free = (uint32_t)n_slots;
    for (unsigned k = 0; k < sp->qd; k++) {
        sp->ios[k].next = sp->io_free;
        sp->io_free = &sp->ios[k];
    }

    /* The file. */
    sp->direct = 1;
    int no_tmpfile = !!(p->flags & SPILL_F_TEST_NO_TMPFILE);
    err = spill_open_file(p->dir, 1, no_tmpfile, &sp->fd);
    if (err == -EINVAL) {
        int fd2;
        if (spill_open_file(p->dir, 0, no_tmpfile, &fd2) == 0) {
            if (!(p->flags & SPILL_F_BUFFERED)) {
                close(fd2);
                klog_error("spill: %s refuses O_DIRECT; refusing to spill through the page "
                           "cache unless buffered mode is opted in with the flag "
                           "KVVM_F_SPILL_BUFFERED (environment: KVVM_FLAGS=spill_buffered)",
                           p->dir);
                err = -EINVAL;
                goto out_tables;
            }
            klog_warn("spill: %s refuses O_DIRECT; spilling through the page cache "
                      "(buffered mode, opted in)", p->dir);
            sp->fd = fd2;
            sp->direct = 0;
            err = 0;
        }
    }
    if (err) {
        klog_error("spill: cannot create the spill file in %s: %s", p->dir, strerror(-err));
        goto out_tables;
    }
    if (sp->direct) {
        spill_dio_alignment(sp);
    } else {
        sp->dio_off_align = 1;
        sp->dio_mem_align = 1;
    }
    if (sp->page_size % sp->dio_off_align || sp->io_size % sp->dio_off_align) {
        klog_error("spill: page_size %zu / io_size %zu not multiples of the direct-I/O "
                   "alignment %zu of %s", sp->page_size, sp->io_size, sp->dio_off_align,
                   p->dir);
        err = -EINVAL;
        goto out_close;
    }
    off_t fbytes = (off_t)(n_slots * sp->page_size);
    if (fallocate(sp->fd, 0, 0, fbytes) != 0) {
        err = -errno;
        if (err == -EOPNOTSUPP) {
            klog_info("spill: %s cannot preallocate; the file is sparse", p->dir);
            if (ftruncate(sp->fd, fbytes) != 0) {
                err = -errno;
                goto out_close;
            }
        } else {
            klog_error("spill: cannot reserve %lld bytes in %s: %s", (long long)fbytes,
                       p->dir, strerror(-err));
            goto out_close;
        }
    }

    /* The engine. */
    enum spill_engine want = p->engine;
    if (want == SPILL_ENGINE_AUTO)
        engine_from_env(&want);
    if (want == SPILL_ENGINE_AUTO || want == SPILL_ENGINE_IO_URING) {
        int r = uring_setup(sp, p);
        if (r == 0) {
            sp->engine = SPILL_ENGINE_IO_URING;
        } else if (want == SPILL_ENGINE_IO_URING) {
            klog_error("spill: the io_uring engine was asked for but io_uring cannot be set "
                       "up: %s (kernel.io_uring_disabled, seccomp or an old kernel?)",
                       strerror(-r));
            err = -EOPNOTSUPP;
            goto out_close;
        } else {
            klog_warn("spill: io_uring unavailable (%s); using the psync engine "
                      "(pread/pwrite on a worker thread)", strerror(-r));
            sp->engine = SPILL_ENGINE_PSYNC;
        }
    } else {
        sp->engine = SPILL_ENGINE_PSYNC;
    }
    err = pthread_create(&sp->thread, NULL,
                         sp->engine == SPILL_ENGINE_IO_URING ? uring_thread : psync_thread, sp);
    if (err) {
        err = -err;
        goto out_ring;
    }
    sp->thread_up = 1;
    klog_info("spill: %zu slots of %zu bytes in %s, engine %s, queue depth %u, io_size %zu, "
              "%s, alignment %zu", n_slots, sp->page_size, p->dir, spill_engine_name(sp),
              sp->qd, sp->io_size, sp->direct ? "O_DIRECT" : "buffered", sp->dio_off_align);
    *out = sp;
    return 0;

out_ring:
    if (sp->ring_up) {
        io_uring_queue_exit(&sp->ring);
        close(sp->efd);
    }
out_close:
    close(sp->fd);
out_tables:
    free(sp->slots);
    free(sp->cl_free);
    free(sp->ios);
    pthread_cond_destroy(&sp->idle_cv);
out_work_cv:
    pthread_cond_destroy(&sp->work_cv);
out_mutex:
    pthread_mutex_destroy(&sp->lock);
out_free:
    free(sp);
    return err;
}

void spill_close(struct spill *sp)
{
    if (!sp)
        return;
    spill_wait_all(sp);
    pthread_mutex_lock(&sp->lock);
    sp->stop = 1;
    pthread_mutex_unlock(&sp->lock);
    engine_kick(sp);
    if (sp->thread_up)
        pthread_join(sp->thread, NULL);
    if (sp->ring_up) {
        io_uring_queue_exit(&sp->ring);
        close(sp->efd);
    }
    while (sp->done_head) {
        struct spill_page *pg = sp->done_head;
        sp->done_head = pg->next;
        free(pg);
    }
    uint32_t used = 0;
    for (uint32_t i = 0; i < sp->n_slots; i++)
        used += sp->slots[i].used;
    if (used)
        klog_debug("spill: closing with %u slot(s) allocated", used);
    close(sp->fd);
    free(sp->slots);
    free(sp->cl_free);
    free(sp->ios);
    pthread_cond_destroy(&sp->idle_cv);
    pthread_cond_destroy(&sp->work_cv);
    pthread_mutex_destroy(&sp->lock);
    free(sp);
}

/* ---- submit / reap -------------------------------------------------------------------- */

int spill_submit(struct spill *sp, const struct spill_req *reqs, size_t n)
{
    if (!sp || (!reqs && n))
        return -EINVAL;
    if (n == 0)
        return 0;
    struct spill_page **pgs = calloc(n, sizeof(*pgs));
    if (!pgs)
        return -ENOMEM;
    int err = 0;
    size_t k;
    for (k = 0; k < n; k++) {
        const struct spill_req *r = &reqs[k];
        if ((r->op != SPILL_WRITE && r->op != SPILL_READ) || !r->buf ||
            (uintptr_t)r->buf % sp->dio_mem_align != 0) {
            err = -EINVAL;
            goto out_free;
        }
        pgs[k] = malloc(sizeof(**pgs));
        if (!pgs[k]) {
            err = -ENOMEM;
            goto out_free;
        }
        *pgs[k] = (struct spill_page){ .req = *r };
    }

    pthread_mutex_lock(&sp->lock);
    if (sp->stop) {
        err = -ESHUTDOWN;
    } else {
        for (k = 0; k < n && !err; k++) {
            uint32_t i = reqs[k].slot.idx;
            if (i >= sp->n_slots || !sp->slots[i].used)
                err = -EINVAL;
            else if (sp->slots[i].busy)
                err = -EBUSY;
            else
                sp->slots[i].busy = 1;   /* also catches a slot named twice in this batch */
        }
        if (err) {
            for (size_t j = 0; j + 1 < k; j++)
                sp->slots[reqs[j].slot.idx].busy = 0;
        }
    }
    if (!err) {
        for (k = 0; k < n; k++)
            if (reqs[k].op == SPILL_WRITE)
                sp->slots[reqs[k].slot.idx].valid = 0;   /* the disk bytes are in flux */
        sp->inflight += n;        /* spill_wait_all now waits for all of them */
    }
    pthread_mutex_unlock(&sp->lock);
    if (err) {
        k = n;
        goto out_free;
    }
    /* Accepted. Checksum each write here, on the caller's thread, and hand the pages over
       one by one, so the engine's I/O overlaps the hashing of the pages behind. */
    for (k = 0; k < n; k++) {
        struct spill_page *pg = pgs[k];
        if (pg->req.op == SPILL_WRITE)
            pg->sum = page_sum(pg->req.buf, sp->page_size, pg->req.page, pg->req.slot);
        pthread_mutex_lock(&sp->lock);
        /* Kick only on empty -> non-empty: until the engine takes the list, an earlier kick
           is still outstanding. */
        int kick = sp->pending_head == NULL;
        if (sp->pending_tail)
            sp->pending_tail->next = pg;
        else
            sp->pending_head = pg;
        sp->pending_tail = pg;
        pthread_mutex_unlock(&sp->lock);
        if (kick)
            engine_kick(sp);
    }
    free(pgs);
    return 0;

out_free:
    for (size_t j = 0; j < k && j < n; j++)
        free(pgs[j]);
    free(pgs);
    return err;
}

size_t spill_reap(struct spill *sp, struct spill_cqe *out, size_t max)
{
    size_t n = 0;
    if (!sp || !out)
        return 0;
    pthread_mutex_lock(&sp->lock);
    while (n < max && sp->done_head) {
        struct spill_page *pg = sp->done_head;
        sp->done_head = pg->next;
        if (!sp->done_head)
            sp->done_tail = NULL;
        out[n++] = (struct spill_cqe){ pg->req.user, pg->req.page, pg->req.slot, pg->req.op,
                                       pg->status };
        free(pg);
    }
    pthread_mutex_unlock(&sp->lock);
    return n;
}

int spill_wait_all(struct spill *sp)
{
    if (!sp)
        return -EINVAL;
    pthread_mutex_lock(&sp->lock);
    while (sp->inflight)
        pthread_cond_wait(&sp->idle_cv, &sp->lock);
    pthread_mutex_unlock(&sp->lock);
    return 0;
}

/* ---- queries, stats, test hooks ------------------------------------------------------- */

const char *spill_engine_name(const struct spill *sp)
{
    return sp->engine == SPILL_ENGINE_IO_URING ? "io_uring" : "psync";
}
int spill_buffers_registered(const struct spill *sp) { return sp->bufs_registered; }
size_t spill_page_size(const struct spill *sp) { return sp->page_size; }
size_t spill_dio_align(const struct spill *sp) { return sp->dio_off_align; }
int spill_direct(const struct spill *sp) { return sp->direct; }

void spill_stats_get(struct spill *sp, struct spill_stats *o)
{
    memset(o, 0, sizeof(*o));
    pthread_mutex_lock(&sp->lock);
    o->slots_total = sp->n_slots;
    o->slots_free = sp->n_free;
    o->inflight = sp->inflight;
    pthread_mutex_unlock(&sp->lock);
#define LD(f) __atomic_load_n(&sp->f, __ATOMIC_RELAXED)
    o->writes = LD(st_writes);
    o->reads = LD(st_reads);
    o->bytes_written = LD(st_bytes_w);
    o->bytes_read = LD(st_bytes_r);
    o->failed = LD(st_failed);
    o->io_errors = LD(st_io_errors);
    o->checksum_failures = LD(st_csum);
    o->retries = LD(st_retries);
    o->short_transfers = LD(st_short);
    o->submissions = LD(st_subs);
#undef LD
}

int spill_fault_arm(struct spill *sp, unsigned long nth, enum spill_fault_kind kind, int err)
{
    if (!sp || nth == 0 || (kind != SPILL_FAULT_ERROR && kind != SPILL_FAULT_SHORT) ||
        (kind == SPILL_FAULT_ERROR && err >= 0))
        return -EINVAL;
    pthread_mutex_lock(&sp->lock);
    int r = 0;
    if (sp->n_faults == SPILL_MAX_FAULTS) {
        r = -ENOSPC;
    } else {
        unsigned long base = __atomic_load_n(&sp->st_subs, __ATOMIC_RELAXED);
        sp->faults[sp->n_faults++] = (struct spill_fault){ base + nth, kind, err };
    }
    pthread_mutex_unlock(&sp->lock);
    return r;
}

void spill_fault_clear(struct spill *sp)
{
    pthread_mutex_lock(&sp->lock);
    sp->n_faults = 0;
    pthread_mutex_unlock(&sp->lock);
}

int spill_test_corrupt(struct spill *sp, spill_slot s, size_t off, size_t len)
{
    if (!sp || s.idx >= sp->n_slots || len == 0 || off + len > sp->page_size)
        return -EINVAL;
    size_t a = sp->dio_off_align > 4096 ? sp->dio_off_align : 4096;
    uint64_t pos = (uint64_t)s.idx * sp->page_size + off;
    uint64_t start = pos / a * a, end = (pos + len + a - 1) / a * a;
    size_t blen = (size_t)(end - start);
    void *buf;
    if (posix_memalign(&buf, a, blen) != 0)
        return -ENOMEM;
    int err = 0;
    if (pread(sp->fd, buf, blen, (off_t)start) != (ssize_t)blen) {
        err = errno ? -errno : -EIO;
        goto out_free;
    }
    for (size_t i = 0; i < len; i++)
        ((unsigned char *)buf)[pos - start + i] ^= 0xff;
    if (pwrite(sp->fd, buf, blen, (off_t)start) != (ssize_t)blen)
        err = errno ? -errno : -EIO;
out_free:
    free(buf);
    return err;
}
