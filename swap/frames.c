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
    bool stop;
    struct swap_worker w;         /* the pool thread (its wake/active flags under mu) */
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
    if (!fr->w.wake) {
        fr->w.wake = true;
        pthread_cond_broadcast(&fr->cv);
    }
    pthread_mutex_unlock(&fr->mu);
}

/* One round (the worker's; its futile flag is not used: a round runs on each request). */
static bool round_once(void *arg)
{
    struct frames *fr = arg;
    struct pg_feed_plan pl;
    pthread_mutex_lock(fr->lock);
    int rc = paging_feed_plan(fr->pg, fr->high, fr->high, &pl);
    pthread_mutex_unlock(fr->lock);
    if (rc || (!pl.create && !pl.release))
        return false;
    uint32_t made = paging_feed_work(fr->pg, &pl);   /* the driver calls: no lock */
    pthread_mutex_lock(fr->lock);
    paging_feed_drain(fr->pg);
    fr->c.rounds++;
    fr->c.created += made;
    fr->c.released += pl.release;
    pthread_mutex_unlock(fr->lock);
    return true;
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
    /* the thread makes the context current and sets relaxed capture mode (worker.h) */
    fr->w = (struct swap_worker){ .name = "frame pool", .v = v, .make_current = true,
                                  .round = round_once, .arg = fr, .mu = &fr->mu,
                                  .cv = &fr->cv, .stop = &fr->stop };
    pthread_mutex_lock(lock);
    paging_feed_attach(pg, wake, fr, fr->low);
    pthread_mutex_unlock(lock);
    int rc = swap_worker_start(&fr->w);
    if (rc) {
        pthread_mutex_lock(lock);
        paging_feed_detach(pg);
        pthread_mutex_unlock(lock);
        pthread_cond_destroy(&fr->cv);
        pthread_mutex_destroy(&fr->mu);
        free(fr);
        return rc;
    }
    wake(fr);                     /* the first fill */
    frames_wait_idle(fr);
    *out = fr;
    return 0;
}

void frames_destroy(struct frames *fr)
{
    if (!fr)
        return;
    swap_worker_stop(&fr->w);
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
    while (fr->w.wake || fr->w.active)
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
