/*
 * swap/worker.h: one background thread of swap/ (the reclaim, spill and frame pool threads)
 * that sleeps until it is asked for a round, runs it, and says when it is idle.
 *
 * Contract:
 *  - The owner (struct swap, struct frames) keeps the mutex, the condition variable and the
 *    stop flag; workers of one owner share all three, so one stop ends them all and one wait
 *    covers them all. The flags below (wake, active, futile) and *stop are under *mu; the
 *    owner reads and clears them under *mu too.
 *  - The thread first makes the device context current (make_current) and sets relaxed stream
 *    capture mode for itself: in the default global mode its event queries and
 *    synchronizations during a graph capture by any engine thread would be prohibited and
 *    invalidate that capture (cuda.h, cuThreadExchangeStreamCaptureMode). A failure is a
 *    warning naming the thread, and the thread runs on.
 *  - Then, until *stop (a stop wins over a pending wake): wait for wake, clear it, mark
 *    active, run round(arg) without *mu (the round takes the owner's locks itself), then
 *    under *mu set futile when the round did nothing, clear active and broadcast *cv.
 *  - futile is only ever set here; what it means (no wake until the next step) and when it
 *    clears is the owner's. A wake that came while the round ran (swap_worker_wake) keeps
 *    the round from being futile: it planned before the request (a step that ended some
 *    sequences' protection), so the thread runs another round.
 *  - A round may ask for the next one at a time of its choosing: it sets next_ns (a
 *    CLOCK_MONOTONIC time; 0: none), and the thread then waits for a wake or that time,
 *    whichever comes first. An owner using it makes *cv with CLOCK_MONOTONIC.
 *  - Lock order: the owner's (context lock -> *mu); nothing here takes another lock.
 */
#ifndef KVVM_SWAP_WORKER_H
#define KVVM_SWAP_WORKER_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include "vmm/vmm.h"

struct swap_worker {
    /* set by the owner before swap_worker_start */
    const char *name;             /* for the warnings: "reclaim", "spill", "frame pool" */
    struct vmm *v;
    bool make_current;            /* make the device context current at the start */
    bool (*round)(void *arg);     /* one round, *mu not held; false: it did nothing */
    void *arg;
    pthread_mutex_t *mu;          /* the owner's */
    pthread_cond_t *cv;           /* the owner's: broadcast at the end of each round */
    bool *stop;                   /* the owner's (under *mu) */
    /* under *mu */
    bool wake;                    /* a round is asked for */
    bool active;                  /* a round runs */
    bool futile;                  /* a round did nothing (cleared by the owner) */
    uint64_t next_ns;             /* the thread's: set by a round, the next round's time */
    /* owner-side, set by swap_worker_start */
    bool running;                 /* the thread exists */
    pthread_t thread;
};

/* Asks w for a round (takes *mu) unless the last one found nothing to do (futile, until the
   owner clears it): at once when idle, after the current one when a round runs. */
void swap_worker_wake(struct swap_worker *w);
/* Starts the thread. -errno of pthread_create (nothing started). */
int  swap_worker_start(struct swap_worker *w);
/* Sets *stop under *mu, wakes every worker of the owner and joins this one (when it runs).
   No lock held. */
void swap_worker_stop(struct swap_worker *w);

#endif
