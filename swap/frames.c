/*
 * swap/frames.c: the frame pool thread (contract in frames.h).
 *
 * One round: plan under the context lock (paging_feed_plan reserves the frames to create
 * within the budget and takes the ready frames above the high mark off the pool), then the
 * driver calls without it (paging_feed_work: a caller short of frames meanwhile waits for
 * the deliveries instead of creating its own), then the hand-over under it again
 * (paging_feed_drain). Rounds run on request only (a call left the pool below the low mark,
 * a step, a budget change), so an idle context makes no driver call.
 */
#include "frames.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include "common/log.h"

struct frames {
    struct paging *pg;
    struct vmm *v;
    pthread_mutex_t *lock;        /* the context lock */
    struct frames_params p;
    uint32_t low, high;           /* effective marks (context lock) */
    struct frames_counters c;     /* the thread's (context lock) */
    /* below: under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop, wake, active, running;
    pthread_t thread;
};

static void marks(struct frames *fr, uint32_t budget)
{
    uint32_t low = fr->p.low, high = fr->p.high;
    if (!low) {
        low = budget / 16;
        if (low < 2 * fr->p.n_regions)
            low = 2 * fr->p.n_regions;
    }
    if (!high) {
        high = budget / 8;
        if (high < 2 * low)
            high = 2 * low;
    }
    if (high < low)
        high = low;
    fr->low = low < budget ? low : budget;
    fr->high = high < budget ? high : budget;
}

/* paging's feed calls this (context lock held) when a call left too few frames ready. */
static void wake(void *arg)
{
    struct frames *fr = arg;
    pthread_mutex_lock(&fr->mu);
    if (!fr->wake) {
        fr->wake = true;
        pthread_cond_broadcast(&fr->cv);
    }
    pthread_mutex_unlock(&fr->mu);
}

static void round_once(struct frames *fr)
{
    struct pg_feed_plan pl;
    pthread_mutex_lock(fr->lock);
    int rc = paging_feed_plan(fr->pg, fr->high, fr->high, &pl);
    pthread_mutex_unlock(fr->lock);
    if (rc || (!pl.create && !pl.release))
        return;
    uint32_t made = paging_feed_work(fr->pg, &pl);   /* the driver calls: no lock */
    pthread_mutex_lock(fr->lock);
    paging_feed_drain(fr->pg);
    fr->c.rounds++;
    fr->c.created += made;
    fr->c.released += pl.release;
    pthread_mutex_unlock(fr->lock);
}

static void *pool_thread(void *arg)
{
    struct frames *fr = arg;
    if (vmm_make_current(fr->v))
        klog_warn("swap: the frame pool thread could not make the device context current");
    /* relaxed capture mode, as the reclaim thread (swap.c capture_relaxed): its driver calls
       must not invalidate an engine thread's graph capture */
    if (vmm_thread_capture_relaxed(fr->v))
        klog_warn("swap: the frame pool thread could not set relaxed stream capture mode");
    pthread_mutex_lock(&fr->mu);
    for (;;) {
        while (!fr->stop && !fr->wake)
            pthread_cond_wait(&fr->cv, &fr->mu);
        if (fr->stop)
            break;
        fr->wake = false;
        fr->active = true;
        pthread_mutex_unlock(&fr->mu);
        round_once(fr);
        pthread_mutex_lock(&fr->mu);
        fr->active = false;
        pthread_cond_broadcast(&fr->cv);
    }
    pthread_mutex_unlock(&fr->mu);
    return NULL;
}

int frames_create(struct paging *pg, struct vmm *v, pthread_mutex_t *lock,
                  const struct frames_params *p, struct frames **out)
{
    struct frames *fr = calloc(1, sizeof *fr);
    if (!fr)
        return -ENOMEM;
    fr->pg = pg;
    fr->v = v;
    fr->lock = lock;
    fr->p = *p;
    marks(fr, p->budget);
    pthread_mutex_init(&fr->mu, NULL);
    pthread_cond_init(&fr->cv, NULL);
    pthread_mutex_lock(lock);
    paging_feed_attach(pg, wake, fr, fr->low);
    pthread_mutex_unlock(lock);
    int rc = -pthread_create(&fr->thread, NULL, pool_thread, fr);
    if (rc) {
        pthread_mutex_lock(lock);
        paging_feed_detach(pg);
        pthread_mutex_unlock(lock);
        pthread_cond_destroy(&fr->cv);
        pthread_mutex_destroy(&fr->mu);
        free(fr);
        return rc;
    }
    fr->running = true;
    wake(fr);                     /* the first fill */
    frames_wait_idle(fr);
    *out = fr;
    return 0;
}

void frames_destroy(struct frames *fr)
{
    if (!fr)
        return;
    pthread_mutex_lock(&fr->mu);
    fr->stop = true;
    pthread_cond_broadcast(&fr->cv);
    pthread_mutex_unlock(&fr->mu);
    pthread_join(fr->thread, NULL);
    pthread_mutex_lock(fr->lock);
    paging_feed_detach(fr->pg);
    pthread_mutex_unlock(fr->lock);
    pthread_cond_destroy(&fr->cv);
    pthread_mutex_destroy(&fr->mu);
    free(fr);
}

void frames_set_budget(struct frames *fr, uint32_t budget)
{
    if (!fr)
        return;
    marks(fr, budget);
    paging_feed_set_low(fr->pg, fr->low);
    wake(fr);
}

void frames_after_step(struct frames *fr)
{
    if (fr)
        wake(fr);
}

void frames_wait_idle(struct frames *fr)
{
    if (!fr)
        return;
    pthread_mutex_lock(&fr->mu);
    while (fr->wake || fr->active)
        pthread_cond_wait(&fr->cv, &fr->mu);
    pthread_mutex_unlock(&fr->mu);
}

void frames_marks(const struct frames *fr, uint32_t *low, uint32_t *high)
{
    *low = fr ? fr->low : 0;
    *high = fr ? fr->high : 0;
}

void frames_counters(struct frames *fr, struct frames_counters *out)
{
    if (fr)
        *out = fr->c;
    else
        *out = (struct frames_counters){ 0 };
}
