/*
 * disk/sched.c: the engine thread's scheduler, common to both engines (contract in disk.h).
 *
 * spill_submit() appends page requests to `pending` under the lock and kicks the engine
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

size_t disk_fault_check(struct spill *sp, struct spill_io *io)
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
        uint64_t got = spill_checksum(r->buf, sp->page_size, r->page, r->slot);
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
    KVVM_ASSERT(si->busy);           /* set at submit, cleared once here */
    si->busy = 0;
    if (!sp->on_complete) {
        SPILL_FIFO_PUSH(sp->done_head, sp->done_tail, pg);
        KVVM_ASSERT(sp->inflight > 0);
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
    KVVM_ASSERT(sp->inflight > 0);    /* counted at submit, until the callback returned */
    if (--sp->inflight == 0)
        pthread_cond_broadcast(&sp->idle_cv);
    pthread_mutex_unlock(&sp->lock);
}

static void io_put(struct spill *sp, struct spill_io *io)
{
    io->next = sp->io_free;
    sp->io_free = io;
    KVVM_ASSERT(sp->ios_busy > 0);
    sp->ios_busy--;
}

static void retry_push(struct spill *sp, struct spill_io *io)
{
    SPILL_FIFO_PUSH(sp->retry_head, sp->retry_tail, io);
}

void disk_io_complete(struct spill *sp, struct spill_io *io, int res)
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
    KVVM_ASSERT(pg->ios_left > 0);   /* one completion per I/O of the page */
    if (--pg->ios_left == 0)
        page_done(sp, pg);
}

int disk_take_pending(struct spill *sp)
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

/* A page that needs no I/O (a read of a slot without valid data) is completed here. */
struct spill_io *disk_next_io(struct spill *sp)
{
    struct spill_io *io;
    if ((io = sp->retry_head)) {      /* a retried I/O keeps its slot: first, always */
        SPILL_FIFO_DROP(sp->retry_head, sp->retry_tail);
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
                    SPILL_FIFO_DROP(sp->run_head, sp->run_tail);
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
        KVVM_ASSERT(pg->ios_next < n_ios);  /* a page leaves the run list at its last I/O */
        uint32_t k = pg->ios_next++;
        io->pg = pg;
        io->off = (uint64_t)pg->req.slot.idx * sp->page_size + (uint64_t)k * sp->io_size;
        io->buf = (char *)pg->req.buf + (size_t)k * sp->io_size;
        io->len = sp->io_size;
        io->retries = 0;
        io->inject = 0;
        if (pg->ios_next == n_ios)
            SPILL_FIFO_DROP(sp->run_head, sp->run_tail);
        return io;
    }
    return NULL;
}

int disk_engine_idle(const struct spill *sp)
{
    return !sp->run_head && !sp->retry_head && sp->ios_busy == 0;
}

void disk_engine_kick(struct spill *sp)
{
    if (sp->engine == SPILL_ENGINE_IO_URING)
        disk_uring_kick(sp);
    else
        disk_psync_kick(sp);
}
