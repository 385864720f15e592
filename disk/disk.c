/*
 * disk/disk.c: the disk tier (contract in disk.h): open and close, page submission and
 * completion delivery, queries, stats and the test hooks. The file and its slots are in
 * disk_file.c, the checksum in checksum.c, the engine thread's scheduler in sched.c, the two ways
 * to issue an I/O in engine_psync.c and engine_uring.c; what they share is disk_int.h.
 *
 * Design
 *  - Requests: disk_submit() copies each page request into a struct disk_page and appends
 *    it to `pending` under the lock, then kicks the engine thread (sched.c). Write checksums
 *    are computed in disk_submit() on the caller's thread, page by page as each is handed
 *    over, so hashing overlaps the engine's I/O instead of delaying its reaping.
 *  - Completions go to params.on_complete on the engine thread, else to the `done` list that
 *    disk_reap() drains.
 *  - Engine choice: params.engine, else KVVM_IO_ENGINE, else io_uring when it can be set up,
 *    else psync.
 *
 * Locks: see disk_int.h.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/env.h"
#include "common/log.h"
#include "disk_int.h"

/* ---- open / close --------------------------------------------------------------------- */

static int engine_from_env(enum disk_engine *e)
{
    const char *s = kenv(KVVM_IO_ENGINE);
    if (!s || !*s)
        return 0;
    if (!strcmp(s, "io_uring"))
        *e = DISK_ENGINE_IO_URING;
    else if (!strcmp(s, "psync"))
        *e = DISK_ENGINE_PSYNC;
    else if (strcmp(s, "auto") != 0)
        klog_warn("KVVM_IO_ENGINE=%s is not one of io_uring|psync|auto; ignored", s);
    return 0;
}

/* Chooses and starts the engine (ring, thread). 0 or -errno (logged; nothing left running). */
static int engine_start(struct disk *dk, const struct disk_params *p)
{
    enum disk_engine want = p->engine;
    if (want == DISK_ENGINE_AUTO)
        engine_from_env(&want);
    dk->engine = DISK_ENGINE_PSYNC;
    if (want == DISK_ENGINE_AUTO || want == DISK_ENGINE_IO_URING) {
        int r = disk_uring_setup(dk, p);
        if (r == 0) {
            dk->engine = DISK_ENGINE_IO_URING;
        } else if (want == DISK_ENGINE_IO_URING) {
            klog_error("spill: the io_uring engine was asked for but io_uring cannot be set "
                       "up: %s (kernel.io_uring_disabled, seccomp or an old kernel?)",
                       strerror(-r));
            return -EOPNOTSUPP;
        } else {
            klog_warn("spill: io_uring unavailable (%s); using the psync engine "
                      "(pread/pwrite on a worker thread)", strerror(-r));
        }
    }
    int err = pthread_create(&dk->thread, NULL, dk->engine == DISK_ENGINE_IO_URING ?
                             disk_uring_thread : disk_psync_thread, dk);
    if (err) {
        disk_uring_teardown(dk);
        return -err;
    }
    dk->thread_up = 1;
    return 0;
}

/* The slot table, cluster counts and I/O slots. 0 or -ENOMEM (the caller frees). */
static int tables_alloc(struct disk *dk)
{
    dk->slots = calloc(dk->n_slots, sizeof(*dk->slots));
    dk->cl_free = calloc(dk->n_clusters, sizeof(*dk->cl_free));
    dk->ios = calloc(dk->qd, sizeof(*dk->ios));
    if (!dk->slots || !dk->cl_free || !dk->ios)
        return -ENOMEM;
    disk_slots_init(dk);
    for (unsigned k = 0; k < dk->qd; k++) {
        dk->ios[k].next = dk->io_free;
        dk->io_free = &dk->ios[k];
    }
    return 0;
}

int disk_open(const struct disk_params *p, struct disk **out)
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
    err = disk_dir_check(p);            /* first: a budget it cannot hold is -ENOSPC */
    if (err)
        return err;
    size_t n_slots = p->budget / p->page_size;
    if (n_slots >= UINT32_MAX) {
        klog_error("spill: spill_budget %zu bytes is %zu pages of %zu bytes; at most %u "
                   "pages are addressable", p->budget, n_slots, p->page_size, UINT32_MAX - 1);
        return -EINVAL;
    }

    struct disk *dk = calloc(1, sizeof(*dk));
    if (!dk)
        return -ENOMEM;
    dk->fd = -1;
    dk->page_size = p->page_size;
    dk->io_size = io_size;
    dk->n_slots = (uint32_t)n_slots;
    dk->cluster = p->cluster_pages ? p->cluster_pages : DISK_DEFAULT_CLUSTER;
    dk->n_clusters = (uint32_t)((n_slots + dk->cluster - 1) / dk->cluster);
    dk->qd = p->queue_depth ? p->queue_depth : DISK_DEFAULT_QD;
    dk->on_complete = p->on_complete;
    dk->on_complete_arg = p->on_complete_arg;
    dk->buf_base = p->buf_base;
    dk->buf_bytes = p->buf_base ? p->buf_bytes : 0;
    if (dk->qd > 4096) {
        err = -EINVAL;
        goto out_free;
    }
    err = pthread_mutex_init(&dk->lock, NULL);
    if (err) {
        err = -err;
        goto out_free;
    }
    err = pthread_cond_init(&dk->work_cv, NULL);
    if (err) {
        err = -err;
        goto out_mutex;
    }
    err = pthread_cond_init(&dk->idle_cv, NULL);
    if (err) {
        err = -err;
        goto out_work_cv;
    }
    err = tables_alloc(dk);
    if (err)
        goto out_tables;
    err = disk_file_create(dk, p);
    if (err)
        goto out_tables;
    err = engine_start(dk, p);
    if (err)
        goto out_close;
    klog_info("spill: %zu slots of %zu bytes in %s, engine %s, queue depth %u, io_size %zu, "
              "%s, alignment %zu", n_slots, dk->page_size, p->dir, disk_engine_name(dk),
              dk->qd, dk->io_size, dk->direct ? "O_DIRECT" : "buffered", dk->dio_off_align);
    *out = dk;
    return 0;

out_close:
    close(dk->fd);
out_tables:
    free(dk->slots);
    free(dk->cl_free);
    free(dk->ios);
    pthread_cond_destroy(&dk->idle_cv);
out_work_cv:
    pthread_cond_destroy(&dk->work_cv);
out_mutex:
    pthread_mutex_destroy(&dk->lock);
out_free:
    free(dk);
    return err;
}

void disk_close(struct disk *dk)
{
    if (!dk)
        return;
    disk_wait_all(dk);
    pthread_mutex_lock(&dk->lock);
    dk->stop = 1;
    pthread_mutex_unlock(&dk->lock);
    disk_engine_kick(dk);
    if (dk->thread_up)
        pthread_join(dk->thread, NULL);
    disk_uring_teardown(dk);
    while (dk->done_head) {
        struct disk_page *pr = dk->done_head;
        dk->done_head = pr->next;
        free(pr);
    }
    uint32_t used = 0;
    for (uint32_t i = 0; i < dk->n_slots; i++)
        used += dk->slots[i].used;
    if (used)
        klog_debug("spill: closing with %u slot(s) allocated", used);
    close(dk->fd);
    free(dk->slots);
    free(dk->cl_free);
    free(dk->ios);
    pthread_cond_destroy(&dk->idle_cv);
    pthread_cond_destroy(&dk->work_cv);
    pthread_mutex_destroy(&dk->lock);
    free(dk);
}

/* ---- submit / reap -------------------------------------------------------------------- */

int disk_submit(struct disk *dk, const struct disk_req *reqs, size_t n)
{
    if (!dk || (!reqs && n))
        return -EINVAL;
    if (n == 0)
        return 0;
    struct disk_page **pgs = calloc(n, sizeof(*pgs));
    if (!pgs)
        return -ENOMEM;
    int err = 0;
    size_t k;
    for (k = 0; k < n; k++) {
        const struct disk_req *r = &reqs[k];
        if ((r->op != DISK_WRITE && r->op != DISK_READ) || !r->buf ||
            (uintptr_t)r->buf % dk->dio_mem_align != 0) {
            err = -EINVAL;
            goto out_free;
        }
        pgs[k] = malloc(sizeof(**pgs));
        if (!pgs[k]) {
            err = -ENOMEM;
            goto out_free;
        }
        *pgs[k] = (struct disk_page){ .req = *r };
    }

    pthread_mutex_lock(&dk->lock);
    if (dk->stop) {
        err = -ESHUTDOWN;
    } else {
        for (k = 0; k < n && !err; k++) {
            uint32_t i = reqs[k].slot.idx;
            if (i >= dk->n_slots || !dk->slots[i].used)
                err = -EINVAL;
            else if (dk->slots[i].busy)
                err = -EBUSY;
            else
                dk->slots[i].busy = 1;   /* also catches a slot named twice in this batch */
        }
        if (err) {
            for (size_t j = 0; j + 1 < k; j++)
                dk->slots[reqs[j].slot.idx].busy = 0;
        }
    }
    if (!err) {
        for (k = 0; k < n; k++)
            if (reqs[k].op == DISK_WRITE)
                dk->slots[reqs[k].slot.idx].valid = 0;   /* the disk bytes are in flux */
        dk->inflight += n;        /* disk_wait_all now waits for all of them */
    }
    pthread_mutex_unlock(&dk->lock);
    if (err) {
        k = n;
        goto out_free;
    }
    /* Accepted. Checksum each write here, on the caller's thread, and hand the pages over
       one by one, so the engine's I/O overlaps the hashing of the pages behind. */
    for (k = 0; k < n; k++) {
        struct disk_page *pr = pgs[k];
        if (pr->req.op == DISK_WRITE)
            pr->sum = disk_checksum(pr->req.buf, dk->page_size, pr->req.page, pr->req.slot);
        pthread_mutex_lock(&dk->lock);
        /* Kick only on empty -> non-empty: until the engine takes the list, an earlier kick
           is still outstanding. */
        int kick = dk->pending_head == NULL;
        DISK_FIFO_PUSH(dk->pending_head, dk->pending_tail, pr);
        pthread_mutex_unlock(&dk->lock);
        if (kick)
            disk_engine_kick(dk);
    }
    free(pgs);
    return 0;

out_free:
    for (size_t j = 0; j < k && j < n; j++)
        free(pgs[j]);
    free(pgs);
    return err;
}

size_t disk_reap(struct disk *dk, struct disk_cqe *out, size_t max)
{
    size_t n = 0;
    if (!dk || !out)
        return 0;
    pthread_mutex_lock(&dk->lock);
    while (n < max && dk->done_head) {
        struct disk_page *pr = dk->done_head;
        DISK_FIFO_DROP(dk->done_head, dk->done_tail);
        out[n++] = (struct disk_cqe){ pr->req.user, pr->req.page, pr->req.slot, pr->req.op,
                                      pr->status };
        free(pr);
    }
    pthread_mutex_unlock(&dk->lock);
    return n;
}

int disk_wait_all(struct disk *dk)
{
    if (!dk)
        return -EINVAL;
    pthread_mutex_lock(&dk->lock);
    while (dk->inflight)
        pthread_cond_wait(&dk->idle_cv, &dk->lock);
    pthread_mutex_unlock(&dk->lock);
    return 0;
}

/* ---- queries, stats, test hooks ------------------------------------------------------- */

const char *disk_engine_name(const struct disk *dk)
{
    return dk->engine == DISK_ENGINE_IO_URING ? "io_uring" : "psync";
}
int disk_buffers_registered(const struct disk *dk) { return dk->bufs_registered; }
size_t disk_page_size(const struct disk *dk) { return dk->page_size; }
size_t disk_dio_align(const struct disk *dk) { return dk->dio_off_align; }
int disk_direct(const struct disk *dk) { return dk->direct; }

void disk_stats_get(struct disk *dk, struct disk_stats *o)
{
    memset(o, 0, sizeof(*o));
    pthread_mutex_lock(&dk->lock);
    o->slots_total = dk->n_slots;
    o->slots_free = dk->n_free;
    o->inflight = dk->inflight;
    pthread_mutex_unlock(&dk->lock);
#define LD(f) __atomic_load_n(&dk->f, __ATOMIC_RELAXED)
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

int disk_fault_arm(struct disk *dk, unsigned long nth, enum disk_fault_kind kind, int err)
{
    if (!dk || nth == 0 || (kind != DISK_FAULT_ERROR && kind != DISK_FAULT_SHORT) ||
        (kind == DISK_FAULT_ERROR && err >= 0))
        return -EINVAL;
    pthread_mutex_lock(&dk->lock);
    int r = 0;
    if (dk->n_faults == DISK_MAX_FAULTS) {
        r = -ENOSPC;
    } else {
        unsigned long base = __atomic_load_n(&dk->st_subs, __ATOMIC_RELAXED);
        dk->faults[dk->n_faults++] = (struct disk_fault){ base + nth, kind, err };
    }
    pthread_mutex_unlock(&dk->lock);
    return r;
}

void disk_fault_clear(struct disk *dk)
{
    pthread_mutex_lock(&dk->lock);
    dk->n_faults = 0;
    pthread_mutex_unlock(&dk->lock);
}

int disk_test_corrupt(struct disk *dk, disk_slot s, size_t off, size_t len)
{
    if (!dk || s.idx >= dk->n_slots || len == 0 || off + len > dk->page_size)
        return -EINVAL;
    size_t a = dk->dio_off_align > 4096 ? dk->dio_off_align : 4096;
    uint64_t pos = (uint64_t)s.idx * dk->page_size + off;
    uint64_t start = pos / a * a, end = (pos + len + a - 1) / a * a;
    size_t blen = (size_t)(end - start);
    void *buf;
    if (posix_memalign(&buf, a, blen) != 0)
        return -ENOMEM;
    int err = 0;
    if (pread(dk->fd, buf, blen, (off_t)start) != (ssize_t)blen) {
        err = errno ? -errno : -EIO;
        goto out_free;
    }
    for (size_t i = 0; i < len; i++)
        ((unsigned char *)buf)[pos - start + i] ^= 0xff;
    if (pwrite(dk->fd, buf, blen, (off_t)start) != (ssize_t)blen)
        err = errno ? -errno : -EIO;
out_free:
    free(buf);
    return err;
}
