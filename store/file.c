/*
 * store/file.c: the file backend (contract in store.h): one file per entry in a directory
 * that several processes (or machines, over a shared file system) use together.
 *
 * An entry is written whole under a temporary name (".<name>.<pid>.<n>.tmp", created with
 * O_EXCL) and renamed over its name: a reader sees the old value, the new one, or none,
 * never a part. Nothing is fsynced (a cache): a file torn by a crash fails its checksum and
 * is a miss. The data moves through an io_uring of this store: a batch opens its files,
 * submits every write (or read) at once and waits for the completions until the request's
 * deadline; a get's opens are on the ring too (each linked before its read, into the ring's
 * table of F_SLOTS files: no openat, fstat or close system call per file, which were a third
 * of a get's CPU on a paravirtualized test VM). disk/'s engine is not used: it drives one
 * preallocated spill file of fixed slots from its own thread, where this needs one file per
 * entry, per request, on the caller's thread.
 *
 * A file holds the 96-byte header, zeros up to offset 4096 (F_ALIGN), then the payload;
 * written with O_DIRECT, it is padded with zeros to a multiple of 4 KiB. The payload's own
 * 4 KiB block is what lets O_DIRECT move it straight between the file and the caller's
 * buffers when those are 4 KiB aligned in address and length (the usual case: pinned host
 * pages): one preadv / pwritev of [header block, caller's iovecs], no copy. Other buffers go
 * through a 4 KiB aligned staging buffer (one copy). A get that reads straight into the
 * caller's buffers checks them after the read: a value failing its checks has then been
 * written there (its status says it is not the entry's). A get does so only where the
 * caller lent them (store_get_lent), because of the orphan below.
 *
 * O_DIRECT: probed once per directory (a 4 KiB aligned write to a probe file); where the
 * directory refuses it (tmpfs before Linux 6.6, some FUSE and network file systems) entries
 * go through the page cache, logged at info, and always through the staging buffer. The
 * store keeps its staging buffer from batch to batch (up to STAGE_KEEP bytes): a fresh one
 * of tens of MiB is a fresh mapping, page-faulted and zeroed by the kernel on every batch,
 * which cost more than the I/O.
 *
 * A request whose I/O is not complete at its deadline returns (those items -ETIMEDOUT);
 * its staging buffer, descriptors and temporary files are kept, with the ring they were
 * submitted on, as the store's one orphan, freed when the last completion arrives (checked
 * at each later request, waited for at close and by store_reap). A data request waits at
 * most 10 ms for the orphan's completions, then fails (-ETIMEDOUT): a file system that
 * hangs gets one request's buffers, never more, and the requests behind it fail fast.
 *
 * The caller's buffers and the orphan. A read in flight cannot be taken back: an O_DIRECT
 * read the block layer holds, or one an io-wq worker sleeps in on a hung mount, ignores
 * IORING_OP_ASYNC_CANCEL (-EALREADY) until the device or the server answers, so waiting
 * for it (cancel, then reap) would break the deadline in exactly the case it is for; and
 * a read of the caller's buffers cannot be moved to the store's memory once submitted.
 * Reading every get through the staging would cost a copy of every byte on the common
 * path. So the memory a late read writes must be the orphan's: the staging is; the
 * caller's buffers are read into directly only when lent (store_get_lent), and then the
 * get sets kept and the orphan calls the lend's done once its last completion came
 * (orphan_reap), the caller neither reusing nor freeing them before (core/storeq.c hands
 * them over so). store_get (nothing lent) reads through the staging: no write into the
 * caller's memory after it returns. A put's late O_DIRECT write only reads the caller's
 * buffers into a temporary file that the orphan removes, never renames.
 * store_test_hang (a test hook) makes every I/O wait on a pipe, to test exactly this; the
 * byte a hung read takes from the pipe lands where the real read's first one would.
 *
 * A get runs in two halves (store_get_start): f_get_start opens and reads by the ring
 * without waiting (ring_begin), f_get_finish waits for the completions (ring_end, with the
 * deadline and the orphan as above); the lane's lock is held in between, so no other
 * request uses the ring meanwhile. store_get is the two in a row.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/assert.h"
#include "common/log.h"
#include "store_int.h"

#define F_ALIGN 4096u
#define F_QD 256u
#define F_SLOTS 128u             /* the ring's file table: a get's files opened in flight */
#define STAGE_KEEP (64u << 20)   /* the largest staging buffer kept between batches */

/* One file I/O of a batch. */
struct fio {
    int fd;                      /* -1: none (not opened, or closed) */
    char *buf;                   /* in the batch's staging buffer: the header block, and the
                                    payload unless iov */
    size_t len;                  /* bytes of staging */
    size_t xfer;                 /* bytes to transfer (the file's bytes) */
    struct iovec *iov;           /* vectored: [header block, the caller's iovecs], or NULL */
    int iovcnt;
    int res;                     /* bytes transferred or -errno; -EINPROGRESS until done */
    int checked;                 /* get: its value was checked (get_done) */
    int slot;                    /* get through the ring's file table: the slot its file is
                                    opened into by the ring (linked before the read; set at
                                    submission), else -1 */
    int open_res;                /* that open's result (0 or -errno) */
    int cqes;                    /* completions still owed for it (the open's and the read's) */
    char tmp[STORE_NAME_MAX + 48]; /* put: the temporary name while it exists, else "";
                                    get opened by the ring: the entry's name */
};

struct fbatch {
    size_t n;
    int write;
    char *staging;               /* owned by the batch (an orphan's, or one too large to
                                    keep), else NULL: the store's */
    unsigned owed;               /* submitted, not completed */
    /* Called for item i as its I/O completes (a get checks the value then, while the
       others' I/O goes on), or NULL; on_done_arg its argument. */
    void (*on_done)(void *arg, size_t i);
    void *on_done_arg;
    struct store_lend *lend;     /* a get's lent buffers (the caller's record, read while the
                                    request runs; kept set by orphan_take), or NULL */
    struct fio io[];
};

struct forphan {
    struct io_uring ring;
    struct fbatch *b;
    void (*done)(void *arg);     /* the lent buffers a read in flight writes: given back by
                                    done(done_arg) once the last completion came; or NULL */
    void *done_arg;
};

struct fstore {
    char *dir;
    int dfd;                     /* the directory, -1 until it could be opened */
    int direct;                  /* 1 O_DIRECT, 0 page cache, -1 not probed yet */
    int ring_ok;                 /* io_uring set up; else pread/pwrite (logged) */
    int fixed;                   /* the ring has a file table of F_SLOTS: gets open their
                                    files through the ring (no system call per file) */
    struct io_uring ring;
    struct forphan *orphan;      /* a timed-out batch still owed completions, or NULL */
    unsigned long seq;           /* temporary names */
    char *stage;                 /* the kept staging buffer (F_ALIGN aligned), or NULL */
    size_t stage_bytes;
    int hang;                    /* test hook (store_test_hang): I/O reads hang_fd[0]; 2:
                                    but a batch's first item's */
    int hang_fd[2];              /* a pipe, or -1 */
    int down_logged;
};

static int errno_status(int e)
{
    switch (e) {
    case ENOSPC: case EDQUOT: case EFBIG: return -ENOSPC;
    case EACCES: case EPERM: return -EACCES;
    case EROFS: return -EROFS;
    case ENOENT: return -ENOENT;
    case ETIMEDOUT: return -ETIMEDOUT;
    default: return -EIO;
    }
}

static void batch_free(struct fstore *f, struct fbatch *b)
{
    for (size_t i = 0; b && i < b->n; i++) {
        free(b->io[i].iov);
        if (b->io[i].fd >= 0)
            close(b->io[i].fd);
        if (b->write && b->io[i].tmp[0] && f->dfd >= 0)
            unlinkat(f->dfd, b->io[i].tmp, 0);
    }
    if (b)
        free(b->staging);
    free(b);
}

static struct fbatch *batch_new(size_t n, int write)
{
    struct fbatch *b = calloc(1, sizeof *b + n * sizeof b->io[0]);
    if (!b)
        return NULL;
    b->n = n;
    b->write = write;
    for (size_t i = 0; i < n; i++)
        b->io[i].fd = b->io[i].slot = -1, b->io[i].res = -EINPROGRESS;
    return b;
}

/* Sets each io's buffer in the store's staging buffer (grown when too small), or in one of
   the batch's own above STAGE_KEEP. 0 or -ENOMEM. */
static int batch_stage(struct fstore *f, struct fbatch *b)
{
    size_t total = F_ALIGN;
    for (size_t i = 0; i < b->n; i++)
        total += (b->io[i].len + F_ALIGN - 1) / F_ALIGN * F_ALIGN;
    char *base = f->stage;
    if (total > f->stage_bytes) {
        if (posix_memalign((void **)&base, F_ALIGN, total))
            return -ENOMEM;
        if (total > STAGE_KEEP) {
            b->staging = base;
        } else {
            free(f->stage);
            f->stage = base;
            f->stage_bytes = total;
        }
    }
    for (size_t i = 0, off = 0; i < b->n; i++) {
        b->io[i].buf = base + off;
        if (b->io[i].iov)        /* the header block leads the vector */
            b->io[i].iov[0] = (struct iovec){ b->io[i].buf, F_ALIGN };
        off += (b->io[i].len + F_ALIGN - 1) / F_ALIGN * F_ALIGN;
    }
    return 0;
}

/* A fresh ring for f (at open, and after a timed-out batch took the last one) and, where
   the kernel has them (Linux 5.19), its table of F_SLOTS files for the gets' opens. 0 or
   io_uring_queue_init's -errno. */
static int ring_init(struct fstore *f)
{
    int r = io_uring_queue_init(F_QD, &f->ring, 0);
    f->ring_ok = r == 0;
    f->fixed = f->ring_ok && io_uring_register_files_sparse(&f->ring, F_SLOTS) == 0;
    return r;
}

/* ------------------------------------------------------------------ the directory */

/* Whether the directory takes O_DIRECT: a 4 KiB aligned write to a probe file. */
static int probe_direct(struct fstore *f, unsigned flags)
{
    if (flags & STORE_F_TEST_NO_DIRECT) {
        klog_info("kvvm store: %s: O_DIRECT off (test hook); entries go through the page "
                  "cache", f->dir);
        return 0;
    }
    char name[64];
    snprintf(name, sizeof name, ".kvvm-probe.%d", (int)getpid());
    int fd = openat(f->dfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
    int ok = 0, e = errno;
    if (fd >= 0) {
        void *p = NULL;
        if (!posix_memalign(&p, F_ALIGN, F_ALIGN)) {
            memset(p, 0, F_ALIGN);
            ok = pwrite(fd, p, F_ALIGN, 0) == (ssize_t)F_ALIGN;
            e = errno;
            free(p);
        }
        close(fd);
        unlinkat(f->dfd, name, 0);
    }
    if (!ok)
        klog_info("kvvm store: %s refuses O_DIRECT (%s); entries go through the page cache",
                  f->dir, strerror(e));
    return ok;
}

/* The directory open (and probed). 0, or -ENOTCONN (missing or unreadable: down, logged
   once per outage). */
static int f_ready(struct store *st)
{
    struct fstore *f = st->be;
    if (f->dfd >= 0)
        return 0;
    f->dfd = open(f->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (f->dfd < 0) {
        if (!f->down_logged)
            klog_warn("kvvm store: directory %s is unavailable (%s); requests fail until it "
                      "is there", f->dir, strerror(errno));
        f->down_logged = 1;
        return -ENOTCONN;
    }
    if (f->down_logged)
        klog_info("kvvm store: directory %s is available", f->dir);
    f->down_logged = 0;
    if (f->direct < 0)
        f->direct = probe_direct(f, st->flags);
    return 0;
}

/* ------------------------------------------------------------------ I/O */

/* Reaps the orphan's completions, waiting for each at most wait_ns (UINT64_MAX: for ever);
   frees it once none is owed. 1 when there is none (any more). */
#define ORPHAN_WAIT_NS (10ull * 1000000u)  /* a request's wait for the orphan: short, so
                                            requests behind a hung file system fail fast */
static int orphan_reap(struct fstore *f, uint64_t wait_ns)
{
    struct forphan *o = f->orphan;
    struct io_uring_cqe *cqe;
    struct __kernel_timespec ts = { (long long)(wait_ns / 1000000000u),
                                    (long long)(wait_ns % 1000000000u) };
    while (o && o->b->owed &&
           (wait_ns == UINT64_MAX ? io_uring_wait_cqe(&o->ring, &cqe)
                                  : io_uring_wait_cqe_timeout(&o->ring, &cqe, &ts)) == 0) {
        io_uring_cqe_seen(&o->ring, cqe);
        o->b->owed--;
    }
    if (!o || o->b->owed)
        return !o;
    void (*done)(void *) = o->done;
    void *arg = o->done_arg;
    io_uring_queue_exit(&o->ring);
    batch_free(f, o->b);
    free(o);
    f->orphan = NULL;
    if (done)
        done(arg);               /* the kernel writes the caller's buffers no more */
    return 1;
}

/* Without io_uring: the I/Os one by one (no deadline: logged at open). */
static void run_sync(struct fbatch *b)
{
    for (size_t i = 0; i < b->n; i++) {
        struct fio *io = &b->io[i];
        if (io->fd < 0)
            continue;
        ssize_t r = io->iov ? (b->write ? pwritev(io->fd, io->iov, io->iovcnt, 0)
                                        : preadv(io->fd, io->iov, io->iovcnt, 0))
                  : b->write ? pwrite(io->fd, io->buf, io->xfer, 0)
                             : pread(io->fd, io->buf, io->xfer, 0);
        io->res = r < 0 ? -errno : (int)r;
    }
}

/* Whether a read of b may still write the caller's buffers: a direct one (only a lent get
   has them) whose completions are not all in (one never submitted counts too: simpler,
   and the wait is the orphan's anyway). */
static int reads_in_callers(const struct fbatch *b)
{
    for (size_t i = 0; !b->write && i < b->n; i++)
        if (b->io[i].iov && b->io[i].cqes)
            return 1;
    return 0;
}

/* The batch (and the ring it was submitted on) become the store's orphan, in the record o;
   the store takes a fresh ring (or the pread/pwrite path, logged at open, if none). A
   get's lent buffers that a read in flight writes are kept (lend->kept) until it is
   reaped: their done is the orphan's. */
static void orphan_take(struct fstore *f, struct fbatch *b, struct forphan *o)
{
    if (!b->staging) {           /* the kernel may still use it: the orphan's now */
        b->staging = f->stage;
        f->stage = NULL;
        f->stage_bytes = 0;
    }
    KVVM_ASSERT(!f->orphan);             /* one at a time: a request reaps the last first */
    KVVM_ASSERT(b->lend || !reads_in_callers(b));   /* direct reads only into lent buffers */
    o->ring = f->ring;
    o->b = b;
    o->done = NULL;
    if (b->lend && reads_in_callers(b)) {
        o->done = b->lend->done;
        o->done_arg = b->lend->arg;
        b->lend->kept = 1;
    }
    b->lend = NULL;              /* the caller's record: gone once the request returns */
    f->orphan = o;
    (void)ring_init(f);          /* refused: pread/pwrite, as logged at open */
}

#define F_OPEN_TAG (1ull << 63)   /* user data: the open linked before item i's read */

/* Queues io i's I/O on the ring: its read or write and, for a get whose file the ring
   opens, the open into slot i % F_SLOTS linked before it (the read then names the slot).
   0 (queued, or nothing to do), or -EAGAIN: the ring is full or the slot's last file is
   still being read (submit, reap, come back). */
static int prep_io(struct fstore *f, struct fbatch *b, size_t i)
{
    struct fio *io = &b->io[i];
    int opens = io->cqes == 2, fd = io->fd;
    unsigned slot = (unsigned)(i % F_SLOTS);
    if (!io->cqes)
        return 0;
    if (opens && ((i >= F_SLOTS && b->io[i - F_SLOTS].cqes) ||
                  io_uring_sq_space_left(&f->ring) < 2))
        return -EAGAIN;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&f->ring);
    if (!sqe)
        return -EAGAIN;
    if (opens) {                 /* no O_CLOEXEC: a table slot is no descriptor */
        io_uring_prep_openat_direct(sqe, f->dfd, io->tmp,
                                    O_RDONLY | (f->direct ? O_DIRECT : 0), 0, slot);
        io_uring_sqe_set_data64(sqe, (i + 1) | F_OPEN_TAG);
        sqe->flags |= IOSQE_IO_LINK;
        b->owed++;
        io->slot = (int)slot;
        fd = (int)slot;
        sqe = io_uring_get_sqe(&f->ring);
        KVVM_ASSERT(sqe);        /* two were free */
    }
    int hang = __atomic_load_n(&f->hang, __ATOMIC_RELAXED);
    if (hang == 1 || (hang == 2 && i > 0)) {     /* the test hook */
        /* one byte from the pipe, where the real I/O's first byte would land: a direct
           read's payload (the caller's buffer), else the staging (a write's too: its
           real I/O reads the caller's, writes none of it), so a late completion lands
           where a real one would */
        char *at = io->iov && !b->write ? io->iov[1].iov_base : io->buf;
        io_uring_prep_read(sqe, f->hang_fd[0], at, 1, (uint64_t)-1);
        opens = 0;               /* the pipe is a plain descriptor */
    } else if (io->iov && b->write) {
        io_uring_prep_writev(sqe, fd, io->iov, (unsigned)io->iovcnt, 0);
    } else if (io->iov) {
        io_uring_prep_readv(sqe, fd, io->iov, (unsigned)io->iovcnt, 0);
    } else if (b->write) {
        io_uring_prep_write(sqe, fd, io->buf, (unsigned)io->xfer, 0);
    } else {
        io_uring_prep_read(sqe, fd, io->buf, (unsigned)io->xfer, 0);
    }
    if (opens)
        sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(sqe, i + 1);
    b->owed++;
    return 0;
}

/* One completion of the batch: an item whose completions have all come (its open's, its
   I/O's) is done: its result set (a failed open's, when it failed: the read linked to it
   was cancelled) and on_done called. 1 when the item is done. */
static int reap_one(struct fbatch *b, const struct io_uring_cqe *cqe)
{
    uint64_t d = io_uring_cqe_get_data64(cqe);
    size_t i = (size_t)(d & ~F_OPEN_TAG) - 1;
    KVVM_ASSERT(i < b->n && b->io[i].cqes > 0);   /* one queued I/O's data */
    struct fio *io = &b->io[i];
    if (d & F_OPEN_TAG)
        io->open_res = cqe->res < 0 ? cqe->res : 0;
    else
        io->res = cqe->res;
    if (--io->cqes)
        return 0;
    if (io->open_res)
        io->res = io->open_res;
    if (b->on_done)              /* checked now: the CPU's work overlaps the I/O still owed */
        b->on_done(b->on_done_arg, i);
    return 1;
}

/* The ring's file table emptied of the batch's files (one system call): a file the ring
   opened stays open in its slot until then. */
static void slots_clear(struct fstore *f, const struct fbatch *b)
{
    int none[F_SLOTS];
    unsigned used = 0;
    for (size_t i = 0; i < b->n && used < F_SLOTS; i++)
        used += b->io[i].slot >= 0;
    if (!used)
        return;
    for (unsigned k = 0; k < F_SLOTS; k++)
        none[k] = -1;
    (void)io_uring_register_files_update(&f->ring, 0, none, b->n < F_SLOTS ? (unsigned)b->n
                                                                            : F_SLOTS);
}

/* A batch's run on the ring, between ring_begin and ring_end. */
struct frun {
    struct forphan *o;           /* the orphan's record, taken before any I/O: a timeout
                                    must not need memory */
    size_t next, done, want;     /* ios queued, completed, with I/O */
};

/* Queues what the ring takes of b's I/O and submits it, without waiting (a get's start).
   0, or -ENOMEM (nothing submitted, the batch still the caller's). */
static int ring_begin(struct fstore *f, struct fbatch *b, struct frun *run)
{
    *run = (struct frun){ malloc(sizeof *run->o), 0, 0, 0 };
    if (!run->o)
        return -ENOMEM;
    for (size_t i = 0; i < b->n; i++)
        run->want += b->io[i].cqes > 0;
    while (run->next < b->n && !prep_io(f, b, run->next))
        run->next++;
    (void)io_uring_submit(&f->ring);   /* a refusal: ring_end submits again and decides */
    return 0;
}

/* Submits the rest of b's I/O and waits for all of it until the deadline. 0; -ETIMEDOUT:
   the batch became the orphan (orphan_take). first: only until item 0 is done, and 0 at
   the deadline or on a failure of the ring (the batch left as it is: ring_end decides). */
static int ring_wait(struct fstore *f, struct fbatch *b, struct frun *run, uint64_t deadline,
                     bool first)
{
    struct forphan *o = run->o;
    size_t next = run->next, done = run->done, want = run->want;
    while (done < want && !(first && !b->io[0].cqes)) {
        while (next < b->n && !prep_io(f, b, next))
            next++;
        run->next = next;
        uint64_t left = store_left_ns(deadline);
        struct __kernel_timespec ts = { (long long)(left / 1000000000u),
                                        (long long)(left % 1000000000u) };
        struct io_uring_cqe *cqe;
        int r = left ? io_uring_submit_and_wait_timeout(&f->ring, &cqe, 1, &ts, NULL)
                     : (io_uring_submit(&f->ring), -ETIME);
        if (r == -ETIME || (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY)) {
            if (first)
                return 0;
            orphan_take(f, b, o);
            return -ETIMEDOUT;
        }
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&f->ring, head, cqe) {
            done += (size_t)reap_one(b, cqe);
            seen++;
        }
        io_uring_cq_advance(&f->ring, seen);
        KVVM_ASSERT(b->owed >= seen);
        b->owed -= seen;
        run->done = done;
    }
    if (first)
        return 0;
    KVVM_ASSERT(b->owed == 0 && done == want);   /* every I/O submitted was reaped */
    slots_clear(f, b);
    free(o);
    return 0;
}

/* Submits every io with I/O (io->cqes) and waits for them until the deadline. 0; -ENOMEM
   (nothing submitted, the batch still the caller's); -ETIMEDOUT: the batch became the
   orphan (orphan_take). */
static int ring_end(struct fstore *f, struct fbatch *b, struct frun *run, uint64_t deadline)
{
    return ring_wait(f, b, run, deadline, false);
}

static int run_ring(struct fstore *f, struct fbatch *b, uint64_t deadline)
{
    struct frun run;
    int rc = ring_begin(f, b, &run);
    return rc ? rc : ring_end(f, b, &run, deadline);
}

/* Runs the batch's I/O. 0; -ETIMEDOUT (the batch is owned by the orphan then); -ENOMEM
   (nothing ran; the batch is still the caller's). */
static int f_run(struct fstore *f, struct fbatch *b, uint64_t deadline)
{
    if (!f->ring_ok) {
        run_sync(b);
        return 0;
    }
    return run_ring(f, b, deadline);
}

/* ------------------------------------------------------------------ requests */

/* f_run for a request: on failure, the items still pending get its status and the batch is
   freed (-ENOMEM) or the orphan's (-ETIMEDOUT). 0 or that status. */
static int batch_run(struct fstore *f, struct fbatch *b, struct store_item *items,
                     uint64_t deadline)
{
    int rc = f_run(f, b, deadline);
    for (size_t i = 0; rc && i < b->n; i++)
        if (!items[i].status)
            items[i].status = rc;
    if (rc == -ENOMEM)
        batch_free(f, b);
    return rc;
}

static int data_ready(struct store *st, struct store_item *items, size_t n, uint64_t deadline)
{
    struct fstore *f = st->be;
    int rc = f_ready(st);
    uint64_t left = store_left_ns(deadline);
    if (!rc && !orphan_reap(f, left < ORPHAN_WAIT_NS ? left : ORPHAN_WAIT_NS))
        rc = -ETIMEDOUT;          /* the file system still owes an earlier request */
    if (rc)
        for (size_t i = 0; i < n; i++)
            items[i].status = rc;
    return rc;
}

static size_t io_len(const struct fstore *f, size_t vlen)
{
    return f->direct ? (vlen + F_ALIGN - 1) / F_ALIGN * F_ALIGN : vlen;
}

/* Sizes item it's I/O: its file bytes (the header block, then the payload) and, where
   O_DIRECT can use the caller's buffers (each 4 KiB aligned in address and length) and
   may (callers: a put's, a lent get's), the vector [header block, caller's iovecs]; else
   (or without memory for the vector) all of it is staged. */
static void io_plan(const struct fstore *f, struct fio *io, const struct store_item *it,
                    int callers)
{
    size_t payload = store_iov_len(it->iov, it->iovcnt);
    int direct = callers && f->direct == 1 && it->iovcnt > 0 && it->iovcnt < 1024;
    for (int k = 0; direct && k < it->iovcnt; k++)
        direct = (uintptr_t)it->iov[k].iov_base % F_ALIGN == 0 &&
                 it->iov[k].iov_len % F_ALIGN == 0;
    io->xfer = io->len = io_len(f, F_ALIGN + payload);
    if (direct && (io->iov = malloc(((size_t)it->iovcnt + 1) * sizeof *io->iov))) {
        io->iovcnt = it->iovcnt + 1;
        memcpy(io->iov + 1, it->iov, (size_t)it->iovcnt * sizeof *io->iov);
        io->len = F_ALIGN;
    }
}

/* Opens the temporary file of item i and stages its value. 0 or the item's status. */
static int put_prepare(struct store *st, struct fbatch *b, size_t i,
                       const struct store_layout *L, uint64_t ns, const struct store_item *it)
{
    struct fstore *f = st->be;
    struct fio *io = &b->io[i];
    char name[STORE_NAME_MAX];
    store_file_name(L, ns, it->key, name);
    snprintf(io->tmp, sizeof io->tmp, ".%s.%d.%lu.tmp", name, (int)getpid(), ++f->seq);
    io->fd = openat(f->dfd, io->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC |
                    (f->direct ? O_DIRECT : 0), 0644);
    if (io->fd < 0) {
        io->tmp[0] = 0;
        return errno_status(errno);
    }
    io->cqes = 1;
    store_hdr_make((uint8_t *)io->buf, L, ns, it->key, it->iov, it->iovcnt);
    memset(io->buf + STORE_HDR_BYTES, 0, F_ALIGN - STORE_HDR_BYTES);
    if (io->iov)
        return 0;                /* the payload goes from the caller's buffers */
    char *p = io->buf + F_ALIGN;
    for (int k = 0; k < it->iovcnt; k++) {
        memcpy(p, it->iov[k].iov_base, it->iov[k].iov_len);
        p += it->iov[k].iov_len;
    }
    memset(p, 0, (size_t)(io->buf + io->len - p));
    return 0;
}

/* After the write: publishes item i by rename, or removes its temporary file. */
static int put_finish(struct store *st, struct fbatch *b, size_t i,
                      const struct store_layout *L, uint64_t ns, const store_key *k)
{
    struct fstore *f = st->be;
    struct fio *io = &b->io[i];
    char name[STORE_NAME_MAX];
    int rc = io->res < 0 ? errno_status(-io->res) : (size_t)io->res < io->xfer ? -ENOSPC : 0;
    close(io->fd);
    io->fd = -1;
    store_file_name(L, ns, k, name);
    if (!rc && renameat(f->dfd, io->tmp, f->dfd, name) != 0)
        rc = errno_status(errno);
    if (rc)
        unlinkat(f->dfd, io->tmp, 0);
    io->tmp[0] = 0;
    return rc;
}

static int f_put(struct store *st, const struct store_layout *L, uint64_t ns,
                 struct store_item *items, size_t n, uint64_t deadline)
{
    struct fstore *f = st->be;
    if (data_ready(st, items, n, deadline))
        return 0;
    struct fbatch *b = batch_new(n, 1);
    for (size_t i = 0; b && i < n; i++)      /* a late write only reads them: harmless */
        io_plan(f, &b->io[i], &items[i], 1);
    if (!b || batch_stage(f, b)) {
        batch_free(f, b);
        for (size_t i = 0; i < n; i++)
            items[i].status = -ENOMEM;
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        items[i].status = put_prepare(st, b, i, L, ns, &items[i]);
    if (batch_run(f, b, items, deadline))
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (items[i].status)
            continue;
        items[i].status = put_finish(st, b, i, L, ns, items[i].key);
        if (!items[i].status)
            STORE_ADD(st, st_bytes_out, STORE_HDR_BYTES +
                                        store_iov_len(items[i].iov, items[i].iovcnt));
    }
    batch_free(f, b);
    return 0;
}

/* Sizes item it's read and opens its file: by the ring, linked before the read, where the
   ring has its file table (no system call per file here), else now. Straight into the
   caller's buffers only where they are lent. 0 or the item's status (-ENOENT: a miss).
   No fstat: a file shorter than the entry reads short, a miss (get_done), as its checksum
   would make it. */
static int get_prepare(struct fstore *f, struct fio *io, const struct store_layout *L,
                       uint64_t ns, const struct store_item *it, int lent)
{
    char name[STORE_NAME_MAX];
    if (f->fixed) {
        store_file_name(L, ns, it->key, io->tmp);
        io->cqes = 2;
    } else {
        store_file_name(L, ns, it->key, name);
        io->fd = openat(f->dfd, name, O_RDONLY | O_CLOEXEC | (f->direct ? O_DIRECT : 0));
        if (io->fd < 0)
            return errno_status(errno);
        io->cqes = 1;
    }
    io_plan(f, io, it, lent);
    return 0;
}

/* A get batch's items, for get_done. */
struct get_ctx {
    struct fbatch *b;
    struct store *st;
    const struct store_layout *L;
    uint64_t ns;
    struct store_item *items;
};

/* Item i's read completed: its value checked (and copied out of staging). */
static void get_done(void *arg, size_t i)
{
    struct get_ctx *c = arg;
    struct fbatch *b = c->b;
    struct store_item *it = &c->items[i];
    struct fio *io = &b->io[i];
    size_t want = store_iov_len(it->iov, it->iovcnt);
    io->checked = 1;
    if (it->status)
        return;
    if (io->res < 0) {
        it->status = errno_status(-io->res);
        return;
    }
    STORE_ADD(c->st, st_bytes_in, (uint64_t)io->res);
    struct iovec staged = { io->buf + F_ALIGN, want };
    if ((size_t)io->res < F_ALIGN + want)
        it->status = -EBADMSG;
    else if (io->iov)
        it->status = store_value_check_iov((const uint8_t *)io->buf, c->L, c->ns, it->key,
                                           it->iov, it->iovcnt);
    else if (!(it->status = store_value_check_iov((const uint8_t *)io->buf, c->L, c->ns,
                                                  it->key, &staged, 1)))
        store_iov_scatter(it->iov, it->iovcnt, staged.iov_base, want);
}

/* A get in flight between f_get_start and f_get_finish (the lane's lock held). */
struct fget {
    struct get_ctx gc;           /* get_done's: b->on_done_arg points here */
    struct frun run;             /* with io_uring */
    uint64_t deadline;
};

/* Opens (by the ring) and reads every item's file: submitted here, waited for by
   f_get_finish, so the caller works while the file system does (store_get_start). */
static void f_get_start(struct store *st, const struct store_layout *L, uint64_t ns,
                        struct store_item *items, size_t n, struct store_lend *lend,
                        uint64_t deadline, void **be)
{
    struct fstore *f = st->be;
    *be = NULL;
    if (data_ready(st, items, n, deadline))
        return;
    struct fget *g = calloc(1, sizeof *g);
    struct fbatch *b = g ? batch_new(n, 0) : NULL;
    int rc = b ? 0 : -ENOMEM;
    for (size_t i = 0; i < n && !rc; i++)
        items[i].status = get_prepare(f, &b->io[i], L, ns, &items[i], lend != NULL);
    if (!rc)
        rc = batch_stage(f, b);
    if (!rc) {
        g->gc = (struct get_ctx){ b, st, L, ns, items };
        g->deadline = deadline;
        b->on_done = get_done;
        b->on_done_arg = &g->gc;
        b->lend = lend;
        if (f->ring_ok && ring_begin(f, b, &g->run))
            rc = -ENOMEM;        /* nothing submitted */
    }
    if (rc) {
        batch_free(f, b);
        free(g);
        for (size_t i = 0; i < n; i++)
            items[i].status = rc;
        return;
    }
    *be = g;
}

/* The reads of f_get_start waited for (until its deadline) and checked. */
static void f_get_finish(struct store *st, void *be)
{
    struct fstore *f = st->be;
    struct fget *g = be;
    struct fbatch *b = g->gc.b;
    int rc = 0;
    if (f->ring_ok)              /* the ring of the start: no request ran in between */
        rc = ring_end(f, b, &g->run, g->deadline);
    else
        run_sync(b);
    for (size_t i = 0; i < b->n; i++) {
        if (rc && !g->gc.items[i].status)
            g->gc.items[i].status = rc;   /* -ETIMEDOUT: the batch is the orphan's */
        else if (!rc && !b->io[i].checked)   /* without io_uring: after the batch */
            get_done(&g->gc, i);
    }
    if (!rc)
        batch_free(f, b);
    free(g);
}

/* Item 0 of f_get_start's batch waited for (store_get_first). */
static int f_get_first(struct store *st, void *be)
{
    struct fstore *f = st->be;
    struct fget *g = be;
    struct fbatch *b = g->gc.b;
    if (!f->ring_ok || g->gc.items[0].status)
        return 0;                /* without io_uring: nothing runs before the finish */
    (void)ring_wait(f, b, &g->run, g->deadline, true);
    return !b->io[0].cqes && b->io[0].checked && !g->gc.items[0].status;
}

static int f_get(struct store *st, const struct store_layout *L, uint64_t ns,
                 struct store_item *items, size_t n, struct store_lend *lend,
                 uint64_t deadline)
{
    void *g;
    f_get_start(st, L, ns, items, n, lend, deadline, &g);
    if (g)
        f_get_finish(st, g);
    return 0;
}

static int f_lookup(struct store *st, const struct store_layout *L, uint64_t ns,
                    const store_key *keys, size_t n, uint8_t *present, uint64_t deadline)
{
    struct fstore *f = st->be;
    (void)deadline;
    int rc = f_ready(st), found = 0;
    char name[STORE_NAME_MAX];
    for (size_t i = 0; i < n && !rc; i++) {
        store_file_name(L, ns, &keys[i], name);
        present[i] = faccessat(f->dfd, name, F_OK, 0) == 0;
        found += present[i];
    }
    return rc ? rc : found;
}

static int f_del(struct store *st, const struct store_layout *L, uint64_t ns,
                 const store_key *keys, size_t n, uint64_t deadline)
{
    struct fstore *f = st->be;
    (void)deadline;
    int rc = f_ready(st), removed = 0;
    char name[STORE_NAME_MAX];
    for (size_t i = 0; i < n && !rc; i++) {
        store_file_name(L, ns, &keys[i], name);
        if (unlinkat(f->dfd, name, 0) == 0)
            removed++;
        else if (errno != ENOENT)
            rc = errno_status(errno);
    }
    return rc ? rc : removed;
}

/* Whether name is an entry of ns (and of L, when not NULL). */
static int ns_match(const char *name, const struct store_layout *L, uint64_t ns)
{
    char want[64];
    size_t len = strlen(name);
    if (L) {
        int n = snprintf(want, sizeof want, "kvvm1_%u_%llu_%llu_%016llx_", L->n_regions,
                         (unsigned long long)L->bytes_per_token,
                         (unsigned long long)L->page_size, (unsigned long long)ns);
        return n > 0 && !strncmp(name, want, (size_t)n) && len == (size_t)n + 64;
    }
    snprintf(want, sizeof want, "_%016llx_", (unsigned long long)ns);
    return !strncmp(name, "kvvm1_", 6) && len > 82 && !strncmp(name + len - 82, want, 18);
}

static int f_del_ns(struct store *st, const struct store_layout *L, uint64_t ns,
                    uint64_t deadline)
{
    struct fstore *f = st->be;
    (void)deadline;
    int rc = f_ready(st), removed = 0;
    int fd = rc ? -1 : openat(f->dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!rc && !d) {
        if (fd >= 0)
            close(fd);
        return errno_status(errno);
    }
    for (struct dirent *e; d && (e = readdir(d));)
        if (ns_match(e->d_name, L, ns) && unlinkat(f->dfd, e->d_name, 0) == 0)
            removed++;
    if (d)
        closedir(d);
    return rc ? rc : removed;
}

static void f_reap(struct store *st)
{
    orphan_reap(st->be, UINT64_MAX);
}

static void f_close(struct store *st)
{
    struct fstore *f = st->be;
    orphan_reap(f, UINT64_MAX);
    if (f->ring_ok)
        io_uring_queue_exit(&f->ring);
    if (f->dfd >= 0)
        close(f->dfd);
    free(f->stage);
    free(f->dir);
    if (f->hang_fd[0] >= 0) {
        close(f->hang_fd[0]);
        close(f->hang_fd[1]);
    }
    free(f);
}

static const struct store_ops file_ops = {
    "file", f_put, f_get, f_lookup, f_del, f_del_ns, f_close, f_reap, f_get_start,
    f_get_finish, f_get_first,
};

int store_file_test_hang(struct store *st, int on)
{
    if (on < 0 || on > 2)
        return -EINVAL;
    if (!st || st->ops != &file_ops)
        return -EINVAL;
    struct fstore *f = st->be;
    int rc = 0;
    if (on) {
        pthread_mutex_lock(&st->lock);
        if (f->hang_fd[0] < 0 && pipe2(f->hang_fd, O_CLOEXEC))
            rc = -errno;
        if (!rc)
            __atomic_store_n(&f->hang, on, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&st->lock);
        return rc;
    }
    /* off without the lock: a request hung in the lane holds it until the pipe has bytes
       (the pipe, made by an earlier on, stays until close) */
    __atomic_store_n(&f->hang, 0, __ATOMIC_RELAXED);
    int wfd = __atomic_load_n(&f->hang_fd[1], __ATOMIC_RELAXED);
    if (wfd >= 0) {
        static const char bytes[4096];
        rc = write(wfd, bytes, sizeof bytes) < 0 ? -errno : 0;
    }
    return rc;
}

int store_direct(const struct store *st)
{
    return st && st->ops == &file_ops && ((struct fstore *)st->be)->direct == 1;
}

int store_file_open(struct store *st, const char *path)
{
    struct fstore *f = calloc(1, sizeof *f);
    if (!f || !(f->dir = strdup(path))) {
        free(f);
        return -ENOMEM;
    }
    f->dfd = -1;
    f->direct = -1;
    f->hang_fd[0] = f->hang_fd[1] = -1;
    int r = ring_init(f);
    if (r)
        klog_warn("kvvm store: io_uring is unavailable (%s): %s is read and written with "
                  "pread/pwrite, whose time the store's timeout does not bound", strerror(-r),
                  path);
    else if (!f->fixed)
        klog_info("kvvm store: io_uring has no file table here (Linux 5.19): %s's gets open "
                  "their files one system call each", path);
    st->be = f;
    st->ops = &file_ops;
    (void)f_ready(st);           /* missing: down, logged; not an error */
    return 0;
}
