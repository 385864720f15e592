/*
 * swap/worker.c: the background thread loop shared by swap/'s threads (contract in
 * worker.h).
 */
#include "worker.h"

#include <errno.h>
#include <time.h>
#include "common/log.h"

/* Waits (*mu held) for a wake, a stop, or the time the last round asked for. */
static void wait_request(struct swap_worker *w)
{
    while (!*w->stop && !w->wake) {
        if (!w->next_ns) {
            pthread_cond_wait(w->cv, w->mu);
            continue;
        }
        struct timespec t = { .tv_sec = (time_t)(w->next_ns / 1000000000u),
                              .tv_nsec = (long)(w->next_ns % 1000000000u) };
        if (pthread_cond_timedwait(w->cv, w->mu, &t) == ETIMEDOUT) {
            w->next_ns = 0;
            w->wake = true;
        }
    }
}

static void *worker_main(void *arg)
{
    struct swap_worker *w = arg;
    if (w->make_current && vmm_make_current(w->v))
        klog_warn("swap: the %s thread could not make the device context current", w->name);
    if (vmm_thread_capture_relaxed(w->v))
        klog_warn("swap: the %s thread could not set relaxed stream capture mode", w->name);
    pthread_mutex_lock(w->mu);
    for (;;) {
        wait_request(w);
        if (*w->stop)
            break;
        w->wake = false;
        w->active = true;
        w->next_ns = 0;
        pthread_mutex_unlock(w->mu);
        bool did = w->round(w->arg);
        pthread_mutex_lock(w->mu);
        if (!did && !w->wake)   /* a wake during the round: the next round plans anew */
            w->futile = true;
        w->active = false;
        pthread_cond_broadcast(w->cv);
    }
    pthread_mutex_unlock(w->mu);
    return NULL;
}

void swap_worker_wake(struct swap_worker *w)
{
    pthread_mutex_lock(w->mu);
    if (!w->futile) {
        w->wake = true;
        pthread_cond_broadcast(w->cv);
    }
    pthread_mutex_unlock(w->mu);
}

int swap_worker_start(struct swap_worker *w)
{
    int rc = -pthread_create(&w->thread, NULL, worker_main, w);
    if (!rc)
        w->running = true;
    return rc;
}

void swap_worker_stop(struct swap_worker *w)
{
    pthread_mutex_lock(w->mu);
    *w->stop = true;
    pthread_cond_broadcast(w->cv);
    pthread_mutex_unlock(w->mu);
    if (w->running)
        pthread_join(w->thread, NULL);
    w->running = false;
}
