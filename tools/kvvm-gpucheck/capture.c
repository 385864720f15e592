/*
 * tools/kvvm-gpucheck/capture.c: the capture matrix (e), real driver only (the emulated
 * device has no stream capture). A capture in CU_STREAM_CAPTURE_MODE_GLOBAL is open on one
 * thread while another thread makes calls the driver may count as "potentially unsafe";
 * the capture's fate is read from cuStreamEndCapture. The last probe runs libkvvm itself
 * (auto-swap, background reclaim) while another thread captures: the capture must stay
 * valid. Contract in gpucheck.h; meaning and expectations in docs/kvvm-gpucheck.md.
 */
#include "gpucheck.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvvm.h"

#define MiB ((size_t)1 << 20)

#define SETUP(expr) do { kcu_result r_ = (expr); if (r_) { \
        gc_row(id, "error: setup", "%s: %s", #expr, gc_err(d->a, r_)); return; } } while (0)

static const char *cap_status(int st)
{
    return st == KCU_STREAM_CAPTURE_STATUS_NONE ? "none"
         : st == KCU_STREAM_CAPTURE_STATUS_ACTIVE ? "active"
         : st == KCU_STREAM_CAPTURE_STATUS_INVALIDATED ? "invalidated" : "?";
}

struct other {
    struct gc_dev *d;
    struct gc_extra *x;
    int relaxed, ctxsync;
    kcu_event ev;                  /* recorded and complete on a stream that is not captured */
    pthread_barrier_t ready;       /* passed once the thread has its context (and mode) */
    pthread_barrier_t go;          /* passed once the capture is open */
    kcu_result r1, r2, rmode;
};

static void *other_main(void *p)
{
    struct other *o = p;
    const struct kcu_api *a = o->d->a;
    a->cuCtxSetCurrent(o->d->ctx);
    if (o->relaxed) {
        int m = GC_CAPTURE_MODE_RELAXED;
        o->rmode = o->x->exchange_mode(&m);
    }
    pthread_barrier_wait(&o->ready);
    pthread_barrier_wait(&o->go);
    if (o->ctxsync) {
        o->r1 = a->cuCtxSynchronize();
    } else {
        o->r1 = a->cuEventQuery(o->ev);
        o->r2 = a->cuEventSynchronize(o->ev);
    }
    return NULL;
}

static void capture_other(struct gc_dev *d, const char *id, int relaxed, int ctxsync)
{
    struct gc_extra x;
    char why[256];
    if (gc_extra_load(&x, why, sizeof why)) {
        gc_row(id, "error: setup", "%s", why);
        return;
    }
    const struct kcu_api *a = d->a;
    kcu_mem_handle h;
    kcu_stream e, c;
    struct other o = { .d = d, .x = &x, .relaxed = relaxed, .ctxsync = ctxsync };
    SETUP(gc_create(d, d->g, &h));
    SETUP(gc_map(d, d->base, d->g, h));
    SETUP(gc_access(d, d->base, d->g));
    SETUP(a->cuStreamCreate(&e, KCU_STREAM_NON_BLOCKING));
    SETUP(a->cuStreamCreate(&c, KCU_STREAM_NON_BLOCKING));
    SETUP(a->cuEventCreate(&o.ev, KCU_EVENT_DISABLE_TIMING));
    SETUP(a->cuMemsetD8Async(d->base, 0, d->g, e));
    SETUP(a->cuEventRecord(o.ev, e));
    SETUP(a->cuStreamSynchronize(e));
    pthread_barrier_init(&o.ready, NULL, 2);
    pthread_barrier_init(&o.go, NULL, 2);
    pthread_t t;
    if (pthread_create(&t, NULL, other_main, &o)) {
        gc_row(id, "error: setup", "pthread_create failed");
        return;
    }
    pthread_barrier_wait(&o.ready);
    kcu_result rb = x.begin_capture(c, GC_CAPTURE_MODE_GLOBAL);
    kcu_result rm = rb ? rb : a->cuMemsetD8Async(d->base, 1, d->g, c);
    pthread_barrier_wait(&o.go);
    /* A call of the other thread that waits for the capturing stream would wait forever:
       after 5 s the capture is ended anyway (which may release it), and that is reported. */
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 5;
    bool blocked = pthread_timedjoin_np(t, NULL, &dl) != 0;
    int st = -1;
    kcu_result ri = a->cuStreamIsCapturing(c, &st);
    void *graph = NULL;
    kcu_result re = rb ? rb : x.end_capture(c, &graph);
    if (graph)
        x.graph_destroy(graph);
    if (blocked) {
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += 5;
        if (pthread_timedjoin_np(t, NULL, &dl) != 0) {
            gc_row(id, "hung", "the other thread's %s did not return, even after the capture "
                   "ended (%s)", ctxsync ? "cuCtxSynchronize" : "event calls",
                   gc_err(a, re));
            _exit(0);               /* a thread stuck in the driver: do not tear down */
        }
    }
    pthread_barrier_destroy(&o.ready);
    pthread_barrier_destroy(&o.go);
    char res[160];
    if (rb)
        snprintf(res, sizeof res, "error: begin:%s", gc_err(a, rb));
    else if (ctxsync)
        snprintf(res, sizeof res, "ctxsync:%s end:%s", blocked ? "blocked" : gc_err(a, o.r1),
                 gc_err(a, re));
    else
        snprintf(res, sizeof res, "query:%s sync:%s end:%s", gc_err(a, o.r1),
                 blocked ? "blocked" : gc_err(a, o.r2), gc_err(a, re));
    gc_row(id, res, "other thread in %s mode (exchange: %s) called %s during a GLOBAL capture "
           "on a third stream; memset into the capture: %s; status before end: %s (%s)",
           relaxed ? "RELAXED" : "GLOBAL (default)", relaxed ? gc_err(a, o.rmode) : "-",
           ctxsync ? "cuCtxSynchronize" : "cuEventQuery + cuEventSynchronize on a completed "
           "event of an uncaptured stream", gc_err(a, rm), cap_status(st), gc_err(a, ri));
}

void gc_capture_global_event(struct gc_dev *d)
{
    capture_other(d, "capture.global_event", 0, 0);
}

void gc_capture_relaxed_event(struct gc_dev *d)
{
    capture_other(d, "capture.relaxed_event", 1, 0);
}

void gc_capture_global_ctxsync(struct gc_dev *d)
{
    capture_other(d, "capture.global_ctxsync", 0, 1);
}

void gc_capture_relaxed_ctxsync(struct gc_dev *d)
{
    capture_other(d, "capture.relaxed_ctxsync", 1, 1);
}

/* ---- libkvvm under a capture ----------------------------------------------------------- */

struct capturer {
    struct gc_dev *d;
    struct gc_extra *x;
    pthread_barrier_t started;
    atomic_int done;
    kcu_result rb, re, rlast;
    int nodes;
};

/* Opens a GLOBAL capture on a stream of its own and adds a memset node every 5 ms for
   capture_ms, then ends it. */
static void *capturer_main(void *p)
{
    struct capturer *c = p;
    const struct kcu_api *a = c->d->a;
    kcu_stream s = NULL;
    a->cuCtxSetCurrent(c->d->ctx);
    c->rb = a->cuStreamCreate(&s, KCU_STREAM_NON_BLOCKING);
    if (!c->rb)
        c->rb = c->x->begin_capture(s, GC_CAPTURE_MODE_GLOBAL);
    pthread_barrier_wait(&c->started);
    if (!c->rb) {
        double end = gc_now_ms() + c->d->o->capture_ms;
        while (gc_now_ms() < end && !c->rlast) {
            c->rlast = a->cuMemsetD8Async(c->d->base, (unsigned char)c->nodes, c->d->g, s);
            c->nodes++;
            nanosleep(&(struct timespec){ 0, 5000000 }, NULL);
        }
        void *graph = NULL;
        c->re = c->x->end_capture(s, &graph);
        if (graph)
            c->x->graph_destroy(graph);
    }
    atomic_store(&c->done, 1);
    return NULL;
}

void gc_capture_libkvvm(struct gc_dev *d)
{
    const char *id = "capture.libkvvm_reclaim";
    struct gc_extra x;
    char why[256];
    if (gc_extra_load(&x, why, sizeof why)) {
        gc_row(id, "error: setup", "%s", why);
        return;
    }
    kcu_mem_handle h;
    SETUP(gc_create(d, d->g, &h));
    SETUP(gc_map(d, d->base, d->g, h));
    SETUP(gc_access(d, d->base, d->g));

    /* 1 GiB of device pages (at most a quarter of the device), twice that of host,
       sequences of a fifth of the budget: every other grow takes the device below the low
       mark (30% free) and wakes the reclaim thread, which works until 60% are free. */
    size_t total = 0, budget = 1024 * MiB;
    d->a->cuDeviceTotalMem(&total, d->dev);
    if (total && budget > total / 4)
        budget = total / 4 / d->g * d->g;
    struct kvvm_config cfg;
    kvvm_config_init(&cfg);
    cfg.backend = KVVM_BACKEND_CUDA;
    cfg.device = d->o->device;
    cfg.n_regions = 1;
    cfg.page_size = d->g;
    cfg.bytes_per_token = d->g / 32;
    cfg.max_seqs = 64;
    cfg.max_tokens = budget / 5 / cfg.bytes_per_token;
    cfg.device_budget = budget;
    cfg.host_budget = 2 * budget;
    cfg.spill_dir = NULL;
    cfg.device_min = 0.02;
    cfg.device_low = 0.3;
    cfg.device_high = 0.6;
    cfg.flags |= KVVM_F_AUTO_SWAP;
    kvvm *kv = NULL;
    int err = kvvm_open(&cfg, &kv);
    if (err) {
        gc_row(id, "error: setup", "kvvm_open: %s", kvvm_strerror(err));
        return;
    }
    void *es = NULL;
    if ((err = kvvm_stream_create(kv, &es)) || (err = kvvm_set_stream(kv, es))) {
        gc_row(id, "error: setup", "engine stream: %s", kvvm_strerror(err));
        kvvm_close(kv);
        return;
    }
    /* This thread drives libkvvm during the capture: relaxed, so its own calls cannot
       invalidate it; the library's threads must look after themselves. */
    int mode = GC_CAPTURE_MODE_RELAXED;
    kcu_result rmode = x.exchange_mode(&mode);

    struct capturer c = { .d = d, .x = &x };
    pthread_barrier_init(&c.started, NULL, 2);
    pthread_t t;
    if (pthread_create(&t, NULL, capturer_main, &c)) {
        gc_row(id, "error: setup", "pthread_create failed");
        kvvm_close(kv);
        return;
    }
    pthread_barrier_wait(&c.started);
    struct kvvm_stats s0 = { .size = sizeof s0 }, s1 = { .size = sizeof s1 };
    kvvm_stats(kv, &s0);
    enum { LIVE = 6 };
    kvvm_seq seqs[LIVE] = { 0 };
    unsigned long steps = 0, grows = 0, errors = 0;
    int first_err = 0;
    for (unsigned i = 0; !atomic_load(&c.done); i++) {
        kvvm_seq *q = &seqs[i % LIVE];
        if (*q)
            kvvm_seq_free(kv, *q);
        *q = 0;
        int r = kvvm_seq_create(kv, q);
        if (!r)
            r = kvvm_seq_grow(kv, *q, cfg.max_tokens);
        grows += !r;
        int r2 = kvvm_step(kv);
        steps += !r2;
        /* An engine iteration's worth of device time: the reclaim thread gets its turn. */
        nanosleep(&(struct timespec){ 0, 5000000 }, NULL);
        if (r || r2) {
            errors++;
            if (!first_err)
                first_err = r ? r : r2;
        }
    }
    pthread_join(t, NULL);
    pthread_barrier_destroy(&c.started);
    kvvm_stats(kv, &s1);
    int rs = kvvm_sync(kv);
    kvvm_close(kv);
    unsigned long long bg = s1.reclaim_swap_outs - s0.reclaim_swap_outs;
    char res[96];
    if (c.rb)
        snprintf(res, sizeof res, "error: begin:%s", gc_err(d->a, c.rb));
    else if (c.re)
        snprintf(res, sizeof res, "invalidated:%s", gc_err(d->a, c.re));
    else
        snprintf(res, sizeof res, bg ? "valid" : "inconclusive");
    gc_row(id, res, "GLOBAL capture of %d memset nodes over %d ms (last: %s) while libkvvm "
           "ran %lu grows and %lu steps (%lu errors, first: %s) on a relaxed thread "
           "(exchange: %s); background reclaim moved %llu, direct %llu; kvvm_sync after: %s",
           c.nodes, d->o->capture_ms, gc_err(d->a, c.rlast), grows, steps, errors,
           first_err ? kvvm_strerror(first_err) : "none", gc_err(d->a, rmode), bg,
           (unsigned long long)(s1.direct_swap_outs - s0.direct_swap_outs),
           rs ? kvvm_strerror(rs) : "ok");
}
