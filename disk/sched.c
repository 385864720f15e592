/*
 * disk/sched.c: the engine thread's scheduler, common to both engines (contract in disk.h).
 *
 * disk_submit() appends page requests to `pending` under the lock and kicks the engine
 * thread. The thread owns the run queue, retry list and I/O slots without a lock: it splits
 * each page into I/Os of io_size bytes, keeps at most queue_depth of them in flight, and
 * handles every completion in disk_io_complete(): -EAGAIN/-EINTR are retried (bounded), a
 * short transfer is resubmitted for the rest, any other error fails the page. When a page's
 * last I/O is done, page_done() records (write) or verifies (read) the checksum and delivers
 * the completion. The engines (engine_psync.c, engine_uring.c) differ only in how one I/O is
 * issued and reaped.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/assert.h"
#include "common/log.h"
#include "disk_int.h"

size_t disk_fault_check(struct disk *dk, struct disk_io *io)
{
    unsigned long n = STAT_ADD(dk, st_subs, 1) + 1;
    size_t len = io->len;
    io->inject = 0;
    pthread_mutex_lock(&dk->lock);
    for (int k = 0; k < dk->n_faults; k++) {
        if (dk->faults[k].at != n)
            continue;
        if (dk->faults[k].kind == DISK_FAULT_ERROR) {
            io->inject = dk->faults[k].err;
        } else {
            size_t half = (len / 2) / dk->dio_off_align * dk->dio_off_align;
            if (half > 0)
                len = half;
        }
        dk->faults[k] = dk->faults[--dk->n_faults];
        break;
    }
    pthread_mutex_unlock(&dk->lock);
    return len;
}

/* Delivers a finished page: checksum bookkeeping, stats, completion, slot released. */
static void page_done(struct disk *dk, struct disk_page *pr)
{
    struct disk_req *r = &pr->req;
    struct slot_info *si = &dk->slots[r->slot.idx];
    if (pr->status == 0 && r->op == DISK_READ) {
        pthread_mutex_lock(&dk->lock);
        uint64_t want = si->sum, want_page = si->page;
        pthread_mutex_unlock(&dk->lock);
        uint64_t got = disk_checksum(r->buf, dk->page_size, r->page, r->slot);
        if (want_page != r->page || got != want) {
            pr->status = -EBADMSG;
            STAT_ADD(dk, st_csum, 1);
            klog_error("spill: checksum mismatch reading page %" PRIu64 " from slot %u "
                       "(stored for page %" PRIu64 "): data lost", r->page, r->slot.idx,
                       want_page);
        }
    }
    if (pr->status == 0) {
        if (r->op == DISK_WRITE) {
            STAT_ADD(dk, st_writes, 1);
            STAT_ADD(dk, st_bytes_w, dk->page_size);
        } else {
            STAT_ADD(dk, st_reads, 1);
            STAT_ADD(dk, st_bytes_r, dk->page_size);
        }
    } else {
        STAT_ADD(dk, st_failed, 1);
    }

    struct disk_cqe cqe = { r->user, r->page, r->slot, r->op, pr->status };
    pthread_mutex_lock(&dk->lock);
    if (r->op == DISK_WRITE && pr->status == 0) {
        si->sum = pr->sum;
        si->page = r->page;
        si->valid = 1;
    }
    KVVM_ASSERT(si->busy);           /* set at submit, cleared once here */
    si->busy = 0;
    if (!dk->on_complete) {
        DISK_FIFO_PUSH(dk->done_head, dk->done_tail, pr);
        KVVM_ASSERT(dk->inflight > 0);
        if (--dk->inflight == 0)
            pthread_cond_broadcast(&dk->idle_cv);
        pthread_mutex_unlock(&dk->lock);
        return;
    }
    pthread_mutex_unlock(&dk->lock);
    /* Callback mode: the page counts as in flight until its callback has returned, so
       disk_wait_all also waits for the callbacks. */
    dk->on_complete(dk->on_complete_arg, &cqe);
    free(pr);
    pthread_mutex_lock(&dk->lock);
    KVVM_ASSERT(dk->inflight > 0);    /* counted at submit, until the callback returned */
    if (--dk->inflight == 0)
        pthread_cond_broadcast(&dk->idle_cv);
    pthread_mutex_unlock(&dk->lock);
}

static void io_put(struct disk *dk, struct disk_io *io)
{
    io->next = dk->io_free;
    dk->io_free = io;
    KVVM_ASSERT(dk->ios_busy > 0);
    dk->ios_busy--;
}

static void retry_push(struct disk *dk, struct disk_io *io)
{
    DISK_FIFO_PUSH(dk->retry_head, dk->retry_tail, io);
}

void disk_io_complete(struct disk *dk, struct disk_io *io, int res)
{
    struct disk_page *pr = io->pr;
    if (io->inject)
        res = io->inject;
    if ((res == -EAGAIN || res == -EINTR) && io->retries < DISK_MAX_RETRIES) {
        io->retries++;
        STAT_ADD(dk, st_retries, 1);
        retry_push(dk, io);
        return;
    }
    if (res == 0)
        res = -EIO;      /* no progress: past the end of the file or a dead device */
    if (res > 0 && (size_t)res < io->len) {
        io->off += (size_t)res;
        io->buf += (size_t)res;
        io->len -= (size_t)res;
        STAT_ADD(dk, st_short, 1);
        retry_push(dk, io);
        return;
    }
    if (res < 0) {
        if (pr->status == 0)
            pr->status = res;
        if (res != -EAGAIN && res != -EINTR)
            STAT_ADD(dk, st_io_errors, 1);
        klog_error("spill: %s of page %" PRIu64 " at slot %u failed: %s; only this page is "
                   "affected", pr->req.op == DISK_WRITE ? "write" : "read", pr->req.page,
                   pr->req.slot.idx, strerror(-res));
    }
    io_put(dk, io);
    KVVM_ASSERT(pr->ios_left > 0);   /* one completion per I/O of the page */
    if (--pr->ios_left == 0)
        page_done(dk, pr);
}

int disk_take_pending(struct disk *dk)
{
    pthread_mutex_lock(&dk->lock);
    if (dk->pending_head) {
        if (dk->run_tail)
            dk->run_tail->next = dk->pending_head;
        else
            dk->run_head = dk->pending_head;
        dk->run_tail = dk->pending_tail;
        dk->pending_head = dk->pending_tail = NULL;
    }
    int stop = dk->stop;
    pthread_mutex_unlock(&dk->lock);
    return stop;
}

/* A page that needs no I/O (a read of a slot without valid data) is completed here. */
struct disk_io *disk_next_io(struct disk *dk)
{
    struct disk_io *io;
    if ((io = dk->retry_head)) {      /* a retried I/O keeps its slot: first, always */
        DISK_FIFO_DROP(dk->retry_head, dk->retry_tail);
        return io;
    }
    if (!dk->io_free)
        return NULL;
    while (dk->run_head) {
        struct disk_page *pr = dk->run_head;
        uint32_t n_ios = (uint32_t)(dk->page_size / dk->io_size);
        if (pr->ios_next == 0) {
            if (pr->req.op == DISK_READ) {
                pthread_mutex_lock(&dk->lock);
                int valid = dk->slots[pr->req.slot.idx].valid;
                pthread_mutex_unlock(&dk->lock);
                if (!valid) {
                    DISK_FIFO_DROP(dk->run_head, dk->run_tail);
                    pr->status = -ENODATA;
                    page_done(dk, pr);
                    continue;
                }
            }
            pr->ios_left = n_ios;
        }
        io = dk->io_free;
        dk->io_free = io->next;
        dk->ios_busy++;
        KVVM_ASSERT(pr->ios_next < n_ios);  /* a page leaves the run list at its last I/O */
        uint32_t k = pr->ios_next++;
        io->pr = pr;
        io->off = (uint64_t)pr->req.slot.idx * dk->page_size + (uint64_t)k * dk->io_size;
        io->buf = (char *)pr->req.buf + (size_t)k * dk->io_size;
        io->len = dk->io_size;
        io->retries = 0;
        io->inject = 0;
        if (pr->ios_next == n_ios)
            DISK_FIFO_DROP(dk->run_head, dk->run_tail);
        return io;
    }
    return NULL;
}

int disk_engine_idle(const struct disk *dk)
{
    return !dk->run_head && !dk->retry_head && dk->ios_busy == 0;
}

void disk_engine_kick(struct disk *dk)
{
    if (dk->engine == DISK_ENGINE_IO_URING)
        disk_uring_kick(dk);
    else
        disk_psync_kick(dk);
}
