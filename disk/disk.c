/*
 * disk/disk.c: the disk tier (contract in disk.h): open and close, page submission and
 * completion delivery, queries, stats and the test hooks. The file and its slots are in
 * file.c, the checksum in checksum.c, the engine thread's scheduler in sched.c, the two ways
 * to issue an I/O in engine_psync.c and engine_uring.c; what they share is disk_int.h.
 *
 * Design
 *  - Requests: spill_submit() copies each page request into a struct spill_page and appends
 *    it to `pending` under the lock, then kicks the engine thread (sched.c). Write checksums
 *    are computed in spill_submit() on the caller's thread, page by page as each is handed
 *    over, so hashing overlaps the engine's I/O instead of delaying its reaping.
 *  - Completions go to params.on_complete on the engine thread, else to the `done` list that
 *    spill_reap() drains.
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

static int engine_from_env(enum spill_engine *e)
{
    const char *s = kenv(KVVM_IO_ENGINE);
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

/* Chooses and starts the engine (ring, thread). 0 or -errno (logged; nothing left running). */
static int engine_start(struct spill *sp, const struct spill_params *p)
{
    enum spill_engine want = p->engine;
    if (want == SPILL_ENGINE_AUTO)
        engine_from_env(&want);
    sp->engine = SPILL_ENGINE_PSYNC;
    if (want == SPILL_ENGINE_AUTO || want == SPILL_ENGINE_IO_URING) {
        int r = disk_uring_setup(sp, p);
        if (r == 0) {
            sp->engine = SPILL_ENGINE_IO_URING;
        } else if (want == SPILL_ENGINE_IO_URING) {
            klog_error("spill: the io_uring engine was asked for but io_uring cannot be set "
                       "up: %s (kernel.io_uring_disabled, seccomp or an old kernel?)",
                       strerror(-r));
            return -EOPNOTSUPP;
        } else {
            klog_warn("spill: io_uring unavailable (%s); using the psync engine "
                      "(pread/pwrite on a worker thread)", strerror(-r));
        }
    }
    int err = pthread_create(&sp->thread, NULL, sp->engine == SPILL_ENGINE_IO_URING ?
                             disk_uring_thread : disk_psync_thread, sp);
    if (err) {
        disk_uring_teardown(sp);
        return -err;
    }
    sp->thread_up = 1;
    return 0;
}

/* The slot table, cluster counts and I/O slots. 0 or -ENOMEM (the caller frees). */
static int tables_alloc(struct spill *sp)
{
    sp->slots = calloc(sp->n_slots, sizeof(*sp->slots));
    sp->cl_free = calloc(sp->n_clusters, sizeof(*sp->cl_free));
    sp->ios = calloc(sp->qd, sizeof(*sp->ios));
    if (!sp->slots || !sp->cl_free || !sp->ios)
        return -ENOMEM;
    disk_slots_init(sp);
    for (unsigned k = 0; k < sp->qd; k++) {
        sp->ios[k].next = sp->io_free;
        sp->io_free = &sp->ios[k];
    }
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
    err = disk_dir_check(p);            /* first: a budget it cannot hold is -ENOSPC */
    if (err)
        return err;
    size_t n_slots = p->budget / p->page_size;
    if (n_slots >= UINT32_MAX) {
        klog_error("spill: spill_budget %zu bytes is %zu pages of %zu bytes; at most %u "
                   "pages are addressable", p->budget, n_slots, p->page_size, UINT32_MAX - 1);
        return -EINVAL;
    }

    struct spill *sp = calloc(1, sizeof(*sp));
    if (!sp)
        return -ENOMEM;
    sp->fd = -1;
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
    err = tables_alloc(sp);
    if (err)
        goto out_tables;
    err = disk_file_create(sp, p);
    if (err)
        goto out_tables;
    err = engine_start(sp, p);
    if (err)
        goto out_close;
    klog_info("spill: %zu slots of %zu bytes in %s, engine %s, queue depth %u, io_size %zu, "
              "%s, alignment %zu", n_slots, sp->page_size, p->dir, spill_engine_name(sp),
              sp->qd, sp->io_size, sp->direct ? "O_DIRECT" : "buffered", sp->dio_off_align);
    *out = sp;
    return 0;

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
    disk_engine_kick(sp);
    if (sp->thread_up)
        pthread_join(sp->thread, NULL);
    disk_uring_teardown(sp);
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
            pg->sum = spill_checksum(pg->req.buf, sp->page_size, pg->req.page, pg->req.slot);
        pthread_mutex_lock(&sp->lock);
        /* Kick only on empty -> non-empty: until the engine takes the list, an earlier kick
           is still outstanding. */
        int kick = sp->pending_head == NULL;
        SPILL_FIFO_PUSH(sp->pending_head, sp->pending_tail, pg);
        pthread_mutex_unlock(&sp->lock);
        if (kick)
            disk_engine_kick(sp);
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
        SPILL_FIFO_DROP(sp->done_head, sp->done_tail);
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
