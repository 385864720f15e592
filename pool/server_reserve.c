/*
 * pool/server_reserve.c: the daemon's frame reserve (server_int.h "srv_reserve"): fresh
 * frames created and exported ahead, and the release of frames that died, both on a thread
 * of their own, off the path of a client that waits for frames. Design: docs/design.md
 * "The pool daemon" ("The reserve").
 *
 * Why: a frame given back is never handed to another client (its old holder may still map
 * it); the asker gets a fresh one. Creating, poisoning and exporting a frame and releasing
 * the old one are the per-frame work of a take-back; here they run while the giver is still
 * swapping out and giving, so the grant mostly sends descriptors that are ready.
 *
 * Counts (under mu): live = the daemon's live frames (s->leased, mirrored here by the loop's
 * calls: take adds one, dispose takes one off), ready = fresh frames made ahead (held by no
 * client, free in the pool's figures), dying = released frames whose handle the thread
 * still has to release, making = creates in progress (the thread's or the loop's),
 * dropping = releases in progress (the thread's or the loop's). The device holds live +
 * ready + dying + making + dropping frames, and that never exceeds the pool (pool_frames):
 * the thread makes a frame only below it, and a take that must create with no ready frame
 * first waits for the thread's create in progress, then releases dying frames itself (or
 * waits for the thread's release in progress) while the sum would pass the pool. So the reserve lives inside the pool's
 * capacity: a pool whose frames are all leased has no reserve.
 *
 * Threads: the loop (take, dispose, figures) and the reserve thread; both call the vmm
 * (thread-safe, vmm.h), each handle is in one place at a time (ready, dying, a live frame).
 */
#include "server_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/assert.h"

struct srv_ready {
    vmm_handle h;
    int fd;                             /* its export (the caller closes after sending) */
};

struct srv_reserve {
    struct vmm *v;
    size_t page, pool, max;
    pthread_t thr;
    bool on, stop;
    pthread_mutex_t mu;
    pthread_cond_t work;                /* the thread: something to do */
    pthread_cond_t done;                /* the loop: the thread's create or release
                                           finished */
    size_t live, making;
    size_t dropping;                    /* releases the thread makes now (still on the
                                           device) */
    struct srv_ready *ready;            /* max of them */
    size_t n_ready;
    vmm_handle *dying;
    size_t n_dying, cap_dying;
    bool thr_making;                    /* the thread creates now */
    bool failed;                        /* its last create failed: no more until a change */
    bool busy;                          /* it changed counts since it last woke the loop */
    int evfd;                           /* wakes the loop (its figures) when it goes idle */
    struct srv_reserve_counts k;
};

/* A fresh frame: created (the emulator poisons it), exported. 0; -errno. */
static int frame_make(struct srv_reserve *r, struct srv_ready *out)
{
    int rc = vmm_phys_create(r->v, r->page, &out->h);
    if (rc)
        return rc;
    if ((rc = vmm_handle_export(r->v, out->h, &out->fd))) {
        (void)vmm_phys_release(r->v, out->h);
        return rc;
    }
    return 0;
}

/* Room for one more dying handle (mu held). 0; -ENOMEM. */
static int dying_grow_locked(struct srv_reserve *r)
{
    if (r->n_dying < r->cap_dying)
        return 0;
    size_t cap = r->cap_dying ? 2 * r->cap_dying : 64;
    vmm_handle *n = realloc(r->dying, cap * sizeof *n);
    if (!n)
        return -ENOMEM;
    r->dying = n;
    r->cap_dying = cap;
    return 0;
}

static void frame_drop(struct srv_reserve *r, vmm_handle h)
{
    if (vmm_phys_release(r->v, h))
        srv_say("a frame's release failed (the driver refused); it stays allocated");
}

/* Frames on the device now (mu held): never more than the pool. */
static size_t on_device_locked(const struct srv_reserve *r)
{
    return r->live + r->n_ready + r->n_dying + r->making + r->dropping;
}

/* The thread may make one more frame now (mu held). */
static bool room_locked(const struct srv_reserve *r)
{
    return !r->failed && r->n_ready + (r->thr_making ? 1 : 0) < r->max &&
           on_device_locked(r) < r->pool;
}

static void *reserve_main(void *arg)
{
    struct srv_reserve *r = arg;
    if (vmm_make_current(r->v))
        srv_say("reserve: the device context could not be made current on its thread");
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        if (r->n_dying) {                   /* releases first: they make room */
            vmm_handle h = r->dying[--r->n_dying];
            r->dropping++;
            pthread_mutex_unlock(&r->mu);
            frame_drop(r, h);
            pthread_mutex_lock(&r->mu);
            r->dropping--;
            r->k.released_ahead++;
            r->busy = true;
            pthread_cond_broadcast(&r->done);
            continue;
        }
        if (!room_locked(r)) {
            if (r->busy) {                  /* idle now: the figures may show it */
                uint64_t one = 1;
                r->busy = false;
                if (write(r->evfd, &one, sizeof one) < 0)
                    (void)0;                /* a full counter wakes the loop already */
            }
            pthread_cond_wait(&r->work, &r->mu);
            continue;
        }
        r->making++;
        r->thr_making = true;
        pthread_mutex_unlock(&r->mu);
        struct srv_ready f;
        int rc = frame_make(r, &f);
        pthread_mutex_lock(&r->mu);
        r->making--;
        r->thr_making = false;
        if (rc) {
            r->failed = true;               /* the device is short: the loop creates (and
                                               fails) on its own until frames change */
        } else {
            KVVM_ASSERT(r->n_ready < r->max);
            r->ready[r->n_ready++] = f;
            r->k.made_ahead++;
        }
        r->busy = true;
        pthread_cond_broadcast(&r->done);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

int srv_reserve_open(struct pool_srv *s, size_t max)
{
    struct srv_reserve *r = calloc(1, sizeof *r);
    if (!r)
        return -ENOMEM;
    r->v = s->v;
    r->page = s->page;
    r->pool = s->pool_frames;
    r->max = max < r->pool ? max : r->pool;
    if (r->max && !(r->ready = calloc(r->max, sizeof *r->ready))) {
        free(r);
        return -ENOMEM;
    }
    if ((r->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
        int rc = -errno;
        free(r->ready);
        free(r);
        return rc;
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->work, NULL);
    pthread_cond_init(&r->done, NULL);
    int rc = r->max ? -pthread_create(&r->thr, NULL, reserve_main, r) : 0;
    if (rc) {
        srv_say("reserve: no thread (%s): frames are created and released on the loop",
                strerror(-rc));
        r->max = 0;
    }
    r->on = r->max > 0;
    s->rsv = r;
    return 0;
}

void srv_reserve_close(struct pool_srv *s)
{
    struct srv_reserve *r = s->rsv;
    if (!r)
        return;
    if (r->on) {
        pthread_mutex_lock(&r->mu);
        r->stop = true;
        pthread_cond_signal(&r->work);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->thr, NULL);
    }
    KVVM_ASSERT(r->making == 0);
    while (r->n_dying)
        frame_drop(r, r->dying[--r->n_dying]);
    while (r->n_ready) {
        struct srv_ready *f = &r->ready[--r->n_ready];
        close(f->fd);
        frame_drop(r, f->h);
    }
    pthread_cond_destroy(&r->done);
    pthread_cond_destroy(&r->work);
    pthread_mutex_destroy(&r->mu);
    close(r->evfd);
    free(r->dying);
    free(r->ready);
    free(r);
    s->rsv = NULL;
}

int srv_reserve_take(struct pool_srv *s, vmm_handle *h, int *fd)
{
    struct srv_reserve *r = s->rsv;
    pthread_mutex_lock(&r->mu);
    KVVM_ASSERT(r->live == s->leased);
    while (!r->n_ready && r->thr_making)
        pthread_cond_wait(&r->done, &r->mu);    /* one create, nearly done: wait for it */
    if (r->n_ready) {
        struct srv_ready f = r->ready[--r->n_ready];
        r->live++;
        r->k.taken_ready++;
        pthread_cond_signal(&r->work);          /* one more to make */
        pthread_mutex_unlock(&r->mu);
        *h = f.h;
        *fd = f.fd;
        return 0;
    }
    /* none ready: made here, after releasing what would push the device over the pool */
    while (on_device_locked(r) + 1 > r->pool && (r->n_dying || r->dropping)) {
        if (!r->n_dying) {
            pthread_cond_wait(&r->done, &r->mu);    /* the thread's release in progress */
            continue;
        }
        vmm_handle d = r->dying[--r->n_dying];
        r->dropping++;
        pthread_mutex_unlock(&r->mu);
        frame_drop(r, d);
        pthread_mutex_lock(&r->mu);
        r->dropping--;
    }
    KVVM_ASSERT(on_device_locked(r) + 1 <= r->pool);
    r->making++;
    pthread_mutex_unlock(&r->mu);
    struct srv_ready f;
    int rc = frame_make(r, &f);
    pthread_mutex_lock(&r->mu);
    r->making--;
    if (!rc) {
        r->live++;
        r->k.made_inline++;
    }
    pthread_mutex_unlock(&r->mu);
    if (!rc) {
        *h = f.h;
        *fd = f.fd;
    }
    return rc;
}

void srv_reserve_dispose(struct pool_srv *s, vmm_handle h)
{
    struct srv_reserve *r = s->rsv;
    pthread_mutex_lock(&r->mu);
    KVVM_ASSERT(r->live > 0);
    r->live--;
    r->failed = false;                      /* the device has a frame less in use */
    if (r->on && !dying_grow_locked(r)) {
        r->dying[r->n_dying++] = h;
        pthread_cond_signal(&r->work);
        pthread_mutex_unlock(&r->mu);
        return;
    }
    pthread_mutex_unlock(&r->mu);
    frame_drop(r, h);                       /* no thread (or no memory for the queue) */
}

int srv_reserve_fd(const struct pool_srv *s)
{
    return s->rsv->evfd;
}

void srv_reserve_woken(struct pool_srv *s)
{
    uint64_t v;
    if (read(s->rsv->evfd, &v, sizeof v) < 0)
        (void)0;                            /* nothing to read: a spurious wake-up */
}

void srv_reserve_counts(struct pool_srv *s, struct srv_reserve_counts *out)
{
    struct srv_reserve *r = s->rsv;
    pthread_mutex_lock(&r->mu);
    *out = r->k;
    out->ready = r->n_ready;
    out->dying = r->n_dying;
    out->max = r->max;
    pthread_mutex_unlock(&r->mu);
}
