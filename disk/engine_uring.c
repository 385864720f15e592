/*
 * disk/engine_uring.c: the io_uring engine (contract in disk.h). The only library file that
 * includes liburing.h.
 *
 * One ring of 2 * queue_depth + 2 entries; the spill file registered as a fixed file and the
 * host arena as fixed buffers of at most 1 GiB each, when the kernel accepts (each refusal
 * logged, plain descriptor / plain buffers then). An eventfd polled in the ring wakes the
 * engine thread for new work, so it sleeps in io_uring_submit_and_wait alone.
 */
#include <errno.h>
#include <liburing.h>
#include <poll.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "disk_int.h"

#define DISK_POLL_TAG ((uint64_t)1)   /* user_data of the eventfd poll (ios are pointers,
                                          never 1) */

struct disk_uring {
    struct io_uring ring;
    int efd;                     /* wakes the engine for new work */
    int file_registered;         /* the spill file is fixed file 0 */
    size_t buf_chunk;            /* one registered iovec's length (bufs_registered) */
};

static int uring_arm_poll(struct disk_uring *ur)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&ur->ring);
    if (!sqe)
        return -EBUSY;
    io_uring_prep_poll_add(sqe, ur->efd, POLLIN);
    io_uring_sqe_set_data64(sqe, DISK_POLL_TAG);
    return 0;
}

/* The fixed buffer index holding [buf, buf + len), or -1. */
static int uring_fixed_index(const struct disk *dk, const char *buf, size_t len)
{
    if (!dk->bufs_registered || buf < dk->buf_base || buf + len > dk->buf_base + dk->buf_bytes)
        return -1;
    size_t rel = (size_t)(buf - dk->buf_base), chunk = dk->ur->buf_chunk;
    return rel / chunk == (rel + len - 1) / chunk ? (int)(rel / chunk) : -1;
}

static void uring_issue(struct disk *dk, struct disk_io *io)
{
    struct disk_uring *ur = dk->ur;
    size_t len = disk_fault_check(dk, io);
    struct io_uring_sqe *sqe = io_uring_get_sqe(&ur->ring);
    if (!sqe) {
        /* Cannot happen (the ring has room for qd I/Os + the poll); be safe anyway. */
        io_uring_submit(&ur->ring);
        sqe = io_uring_get_sqe(&ur->ring);
    }
    if (io->inject) {
        io_uring_prep_nop(sqe);
    } else {
        int fd = ur->file_registered ? 0 : dk->fd;
        int fixed = uring_fixed_index(dk, io->buf, len);
        bool wr = io->pr->req.op == DISK_WRITE;
        if (fixed >= 0 && wr)
            io_uring_prep_write_fixed(sqe, fd, io->buf, (unsigned)len, io->off, fixed);
        else if (fixed >= 0)
            io_uring_prep_read_fixed(sqe, fd, io->buf, (unsigned)len, io->off, fixed);
        else if (wr)
            io_uring_prep_write(sqe, fd, io->buf, (unsigned)len, io->off);
        else
            io_uring_prep_read(sqe, fd, io->buf, (unsigned)len, io->off);
        if (ur->file_registered)
            sqe->flags |= IOSQE_FIXED_FILE;
    }
    io_uring_sqe_set_data(sqe, io);
}

/* Reaps the ready completions (at most 64 I/Os per call) and handles them. Returns whether
   the eventfd poll fired (it must be armed again). */
static int uring_reap(struct disk *dk)
{
    struct disk_uring *ur = dk->ur;
    struct io_uring_cqe *cqe;
    unsigned head, seen = 0;
    struct disk_io *done[64];
    int res[64];
    unsigned nd = 0;
    int polled = 0;
    io_uring_for_each_cqe(&ur->ring, head, cqe) {
        seen++;
        if (cqe->user_data == DISK_POLL_TAG) {
            uint64_t v;
            if (read(ur->efd, &v, sizeof(v)) < 0) { /* drained: nothing to do */ }
            polled = 1;
            continue;
        }
        done[nd] = io_uring_cqe_get_data(cqe);
        res[nd] = cqe->res;
        if (++nd == 64)
            break;
    }
    io_uring_cq_advance(&ur->ring, seen);
    for (unsigned k = 0; k < nd; k++)
        disk_io_complete(dk, done[k], res[k]);
    return polled;
}

void *disk_uring_thread(void *arg)
{
    struct disk *dk = arg;
    struct disk_uring *ur = dk->ur;
    int poll_armed = 0;
    for (;;) {
        int stop = disk_take_pending(dk);
        if (!poll_armed && uring_arm_poll(ur) == 0)
            poll_armed = 1;
        struct disk_io *io;
        while ((io = disk_next_io(dk)))
            uring_issue(dk, io);
        if (stop && disk_engine_idle(dk)) {
            pthread_mutex_lock(&dk->lock);
            int more = dk->pending_head != NULL;
            pthread_mutex_unlock(&dk->lock);
            if (!more)
                break;
            continue;
        }
        int r = io_uring_submit_and_wait(&ur->ring, 1);
        if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
            klog_error("spill: io_uring_submit_and_wait failed: %s", strerror(-r));
            struct timespec ts = { 0, 1000000 };
            nanosleep(&ts, NULL);
        }
        if (uring_reap(dk))
            poll_armed = 0;
    }
    return NULL;
}

void disk_uring_kick(struct disk *dk)
{
    uint64_t one = 1;
    if (write(dk->ur->efd, &one, sizeof(one)) < 0) { /* counter saturated: already kicked */ }
}

/* Registers the host buffer range as fixed buffers of at most 1 GiB each. 0 or -errno. */
static int uring_register_buffers(struct disk *dk)
{
    size_t chunk = ((size_t)1 << 30) / dk->page_size * dk->page_size;
    if (chunk == 0)
        chunk = dk->page_size;
    size_t n = (dk->buf_bytes + chunk - 1) / chunk;
    struct iovec *iov = calloc(n, sizeof(*iov));
    if (!iov)
        return -ENOMEM;
    for (size_t k = 0; k < n; k++) {
        size_t off = k * chunk;
        iov[k].iov_base = dk->buf_base + off;
        iov[k].iov_len = dk->buf_bytes - off < chunk ? dk->buf_bytes - off : chunk;
    }
    int r = io_uring_register_buffers(&dk->ur->ring, iov, (unsigned)n);
    free(iov);
    if (r == 0) {
        dk->bufs_registered = 1;
        dk->ur->buf_chunk = chunk;
    }
    return r;
}

int disk_uring_setup(struct disk *dk, const struct disk_params *p)
{
    if (p->flags & DISK_F_TEST_NO_URING)
        return -ENOSYS;
    struct disk_uring *ur = calloc(1, sizeof(*ur));
    if (!ur)
        return -ENOMEM;
    int r = io_uring_queue_init(dk->qd * 2 + 2, &ur->ring, 0);
    if (r < 0)
        goto out_free;
    ur->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (ur->efd < 0) {
        r = -errno;
        goto out_ring;
    }
    dk->ur = ur;
    r = io_uring_register_files(&ur->ring, &dk->fd, 1);
    if (r == 0)
        ur->file_registered = 1;
    else
        klog_info("spill: io_uring refused the file as a fixed file (%s); using the plain "
                  "descriptor", strerror(-r));
    if (dk->buf_base && dk->buf_bytes && (r = uring_register_buffers(dk)) != 0)
        klog_warn("spill: io_uring refused to register %zu bytes of host buffers (%s; "
                  "memlock limit?); using unregistered buffers", dk->buf_bytes, strerror(-r));
    return 0;

out_ring:
    io_uring_queue_exit(&ur->ring);
out_free:
    free(ur);
    return r;
}

void disk_uring_teardown(struct disk *dk)
{
    if (!dk->ur)
        return;
    io_uring_queue_exit(&dk->ur->ring);
    close(dk->ur->efd);
    free(dk->ur);
    dk->ur = NULL;
}
