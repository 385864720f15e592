/*
 * pool/client_ready.c: pending shares made visible off the engine's thread (contract in
 * pool/client.h "Pending shares"; the protocol: protocol.h "PENDING and READY").
 *
 * kvvm_prefix_publish and kvvm_seq_export (stream mode) send their shares to the daemon at
 * the call, PENDING under a serial, and queue the fence they recorded on the engine stream
 * after the shares' device work. The ready thread (started at the first queue) takes the
 * jobs in order: it waits for the job's fence holding no lock (the engine stream may be
 * busy for long: nothing else waits on it), then sends READY under the connection's mutex
 * and reads the daemon's RESULT (so once rd_done covers a serial, other clients see its
 * shares). kvvm_sync and kvvm_close wait for rd_done to reach what was queued before them.
 */
#include "client_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/assert.h"
#include "common/log.h"

uint64_t pool_cli_ready_serial(struct pool_cli *c)
{
    pthread_mutex_lock(&c->mu);
    uint64_t s = ++c->rd_next;
    pthread_mutex_unlock(&c->mu);
    return s;
}

/* READY for serial (ok: visible), its RESULT read. The daemon gone: nothing to tell (the
   shares went with it). */
static void ready_send_locked(struct pool_cli *c, uint64_t serial, bool ok)
{
    if (c->fd < 0)
        return;
    struct pool_ready m = { .serial = serial, .ok = ok };
    pool_proto_hdr(&m.h, POOL_MSG_READY);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    int fds[1], nfds = 0;
    (void)pool_cli_ask_locked(c, &m, POOL_MSG_RESULT, buf, fds, N_FDS(fds), &nfds);
}

/* Waits for f (no lock held) and destroys it: true when the work before it completed. */
static bool fence_done(struct pool_cli *c, uint64_t serial, vmm_fence *f)
{
    int rc = vmm_fence_wait(c->v, f);
    vmm_fence_destroy(c->v, f);
    if (rc)
        klog_error("pool: the wait for the device work before shared record(s) %llu failed "
                   "(%d): the daemon drops them, no other client ever sees them",
                   (unsigned long long)serial, rc);
    return rc == 0;
}

static void *ready_main(void *arg)
{
    struct pool_cli *c = arg;
    if (vmm_make_current(c->v))
        klog_warn("pool: the ready thread could not make the device context current");
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->rd_n && !c->rd_stop)
            pthread_cond_wait(&c->rd_cv, &c->mu);
        if (!c->rd_n)
            break;                          /* stopped, the queue empty */
        struct pool_cli_rd_job j = c->rd_jobs[0];
        pthread_mutex_unlock(&c->mu);
        bool ok = fence_done(c, j.serial, &j.f);
        pthread_mutex_lock(&c->mu);
        ready_send_locked(c, j.serial, ok);
        KVVM_ASSERT(c->rd_n > 0 && c->rd_jobs[0].serial == j.serial);
        memmove(c->rd_jobs, c->rd_jobs + 1, --c->rd_n * sizeof *c->rd_jobs);
        c->rd_done = j.serial;
        pthread_cond_broadcast(&c->rd_cv);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* Queues job j (mu held), starting the thread at the first. 0; -errno (not queued). */
static int queue_locked(struct pool_cli *c, const struct pool_cli_rd_job *j)
{
    if (c->rd_n == c->rd_cap) {
        size_t cap = c->rd_cap ? 2 * c->rd_cap : 16;
        struct pool_cli_rd_job *n = realloc(c->rd_jobs, cap * sizeof *n);
        if (!n)
            return -ENOMEM;
        c->rd_jobs = n;
        c->rd_cap = cap;
    }
    if (!c->rd_on) {
        int rc = -pthread_create(&c->rd_thr, NULL, ready_main, c);
        if (rc)
            return rc;
        c->rd_on = true;
    }
    c->rd_jobs[c->rd_n++] = *j;
    c->rd_queued = j->serial;
    pthread_cond_broadcast(&c->rd_cv);
    return 0;
}

void pool_cli_ready_after(struct pool_cli *c, uint64_t serial, vmm_fence f)
{
    struct pool_cli_rd_job j = { .serial = serial, .f = f };
    pthread_mutex_lock(&c->mu);
    KVVM_ASSERT(serial > c->rd_queued);
    int rc = c->rd_stop ? -ESHUTDOWN : queue_locked(c, &j);
    pthread_mutex_unlock(&c->mu);
    if (!rc)
        return;
    klog_info("pool: no ready thread (%s): this call waits for its device work itself",
              rc == -ENOMEM ? "out of memory" : "it did not start");
    pool_cli_ready_wait(c);                 /* READYs go in serial order */
    bool ok = fence_done(c, serial, &j.f);
    pthread_mutex_lock(&c->mu);
    ready_send_locked(c, serial, ok);
    if (serial > c->rd_done)
        c->rd_done = serial;
    if (serial > c->rd_queued)
        c->rd_queued = serial;
    pthread_cond_broadcast(&c->rd_cv);
    pthread_mutex_unlock(&c->mu);
}

void pool_cli_ready_wait(struct pool_cli *c)
{
    pthread_mutex_lock(&c->mu);
    uint64_t want = c->rd_queued;
    while (c->rd_done < want && c->rd_on)
        pthread_cond_wait(&c->rd_cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

void pool_cli_ready_stop(struct pool_cli *c)
{
    pthread_mutex_lock(&c->mu);
    c->rd_stop = true;                      /* the thread ends once the queue is empty */
    bool on = c->rd_on;
    pthread_cond_broadcast(&c->rd_cv);
    pthread_mutex_unlock(&c->mu);
    if (on)
        pthread_join(c->rd_thr, NULL);
    pthread_mutex_lock(&c->mu);
    c->rd_on = false;
    KVVM_ASSERT(c->rd_n == 0);
    free(c->rd_jobs);
    c->rd_jobs = NULL;
    c->rd_cap = 0;
    pthread_mutex_unlock(&c->mu);
}
