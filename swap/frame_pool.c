/*
 * swap/frame_pool.c: the frame pool thread (contract in frame_pool.h).
 *
 * One round: plan under the context lock (paging_feed_begin reserves the frames to create
 * within the budget and takes the ready frames above the high mark off the pool), then the
 * driver calls without it (paging_feed_work: a caller short of frames meanwhile waits for
 * the deliveries instead of creating its own), then the hand-over under it again
 * (paging_feed_end). Rounds run on request (a call left the pool below the low mark, the
 * pool grew above the high mark, a step, a budget change) and, while ready frames above the
 * high mark wait for their decay, when it ends. The surplus released is what no call needed
 * for a whole idle window of decay_ms (pool.c's feed surplus): an engine that frees a batch
 * and starts the next one reuses the frames instead of releasing and creating them again,
 * and an engine gone idle hands its surplus back within one to two windows. decay_ms = 0:
 * every round releases what stayed unused since the previous one, and an idle context
 * makes no driver call. A round also maps the map-ahead refills grows queued (paging/ahead.c):
 * planned under the lock, mapped without it, committed under it.
 */
#include "frame_pool.h"

#include <errno.h>
#include <time.h>
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
    uint64_t window_ns;           /* CLOCK_MONOTONIC start of the idle window (the thread) */
    /* below: under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    uint64_t wakes;               /* frames_counters' wakes */
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

/* The pool growing above the high mark wakes the thread only when a decay is timed. */
static uint32_t wake_high(const struct frames *fr)
{
    return fr->p.decay_ms ? fr->high : UINT32_MAX;
}

/* paging's feed calls this (context lock held) when a call left too few frames ready. */
static void wake(void *arg)
{
    struct frames *fr = arg;
    pthread_mutex_lock(&fr->mu);
    fr->wakes++;
    if (!fr->w.wake) {
        fr->w.wake = true;
        pthread_cond_broadcast(&fr->cv);
    }
    pthread_mutex_unlock(&fr->mu);
}

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* The map-ahead refills a round took (paging_feed_begin or _end, lock held then): mapped
   without the lock, given to their sequences under it. */
static void ahead_work(struct frames *fr)
{
    paging_ahead_work(fr->pg);
    pthread_mutex_lock(fr->lock);
    paging_ahead_commit(fr->pg);
    fr->c.ahead_rounds++;
    pthread_mutex_unlock(fr->lock);
}

/* One round (the worker's; its futile flag is not used: a round runs on each request). It
   releases only when a whole idle window has passed, and asks for a round at the window's
   end while frames above the high mark wait for it. */
static bool round_once(void *arg)
{
    struct frames *fr = arg;
    struct pg_feed_plan pl;
    uint64_t now = now_ns(), decay = (uint64_t)fr->p.decay_ms * 1000000u;
    bool due = now - fr->window_ns >= decay;
    pthread_mutex_lock(fr->lock);
    int rc = paging_feed_begin(fr->pg, fr->high, due ? fr->high : PG_FEED_KEEP_ALL, &pl);
    if (!rc && due)
        fr->window_ns = now;
    if (decay && pl.ready > fr->high) {
        uint64_t end = fr->window_ns + decay;     /* past only when the plan failed */
        fr->w.next_ns = end > now ? end : now + decay;
    }
    if (rc || (!pl.create && !pl.release)) {     /* the map-ahead refills taken instead */
        pthread_mutex_unlock(fr->lock);
        if (pl.ahead)
            ahead_work(fr);
        return pl.ahead;
    }
    pthread_mutex_unlock(fr->lock);
    uint32_t made = paging_feed_work(fr->pg, &pl);   /* the driver calls: no lock */
    pthread_mutex_lock(fr->lock);
    bool ahead = paging_feed_end(fr->pg);   /* the hand-over, the view's groups, map-ahead */
    fr->c.rounds++;
    fr->c.created += made;
    fr->c.released += pl.release;
    pthread_mutex_unlock(fr->lock);
    if (ahead)
        ahead_work(fr);
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
    fr->window_ns = now_ns();
    pthread_mutex_init(&fr->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);   /* the decay's deadlines (worker.h) */
    pthread_cond_init(&fr->cv, &ca);
    pthread_condattr_destroy(&ca);
    /* the thread makes the context current and sets relaxed capture mode (worker.h) */
    fr->w = (struct swap_worker){ .name = "frame pool", .v = v, .make_current = true,
                                  .round = round_once, .arg = fr, .mu = &fr->mu,
                                  .cv = &fr->cv, .stop = &fr->stop };
    pthread_mutex_lock(lock);
    paging_feed_attach(pg, wake, fr, fr->low, wake_high(fr));
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
    paging_feed_set_marks(fr->pg, fr->low, wake_high(fr));
    wake(fr);
}

void frames_after_step(struct frames *fr)
{
    /* a round refills below the high mark, if the budget leaves room to create (a full
       device has nothing to refill with); at or above it only decay_ms = 0 releases at
       steps (the decay has its own deadline): no wake-up of the thread for nothing */
    if (fr && (!fr->p.decay_ms || paging_feed_short(fr->pg, fr->high)))
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
    if (!fr) {
        *out = (struct frames_counters){ 0 };
        return;
    }
    *out = fr->c;
    pthread_mutex_lock(&fr->mu);
    out->wakes = fr->wakes;
    pthread_mutex_unlock(&fr->mu);
}
