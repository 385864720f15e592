/*
 * vmm/emu/streams.c: streams: the in-order queues and their workers, the legacy stream's
 * implicit synchronization, stream entry points and cuCtxSynchronize.
 * (Contract of the emulated device: vmm/emu/emu.h; internals: vmm/emu/emu_int.h.)
 */
#include "emu_int.h"

#include <sched.h>

static void op_free(struct emu_op *op)
{
    free(op->bar);
    free(op);
}

/* Runs one op for device d (a stream's worker or the NULL stream's caller). */
static void op_exec_locked(struct emu_dev *d, struct emu_op *op)
{
    switch (op->kind) {
    case OP_EVENT:
        if (op->seq > op->ev->done_seq)
            op->ev->done_seq = op->seq;
        break;
    case OP_WAIT:
        while (op->ev->done_seq < op->seq && !d->sticky)
            pthread_cond_wait(&emu.cond, &emu.lock);
        break;
    default:
        if (!d->sticky)
            emu_xfer_locked(d, op);
        break;
    }
    if (op->ev)
        emu_event_put_locked(op->ev);
    pthread_cond_broadcast(&emu.cond);
}

/* ---- streams ------------------------------------------------------------------------ */

/* The stream with this id, if it still exists. */
static struct kcu_stream_st *stream_by_id_locked(uint64_t id)
{
    for (struct kcu_stream_st *p = emu.streams; p; p = p->next)
        if (p->id == id)
            return p;
    return NULL;
}

/* Whether op's implicit legacy-stream dependencies are complete. */
static bool op_deps_done_locked(struct emu_dev *d, const struct emu_op *op)
{
    if (op->legacy_wait && d->legacy && d->legacy->done < op->legacy_wait)
        return false;
    for (size_t i = 0; i < op->nbar; i++) {
        struct kcu_stream_st *b = stream_by_id_locked(op->bar[i].id);
        if (b && b->done < op->bar[i].ticket)
            return false;
    }
    return true;
}

/* Removes s's head op, which just ran. */
static void op_pop_locked(struct kcu_stream_st *s, struct emu_op *op)
{
    KVVM_ASSERT(op == s->head && op->ticket == s->done + 1);  /* in order, once */
    s->head = op->next;
    if (!s->head)
        s->tail = NULL;
    s->done = op->ticket;
    op_free(op);
    pthread_cond_broadcast(&emu.cond);
}

/* Whether a thread may run s's head op now, as s's worker would: there is one, s is not
   paused, nobody runs it (s->running), its implicit legacy dependencies are complete and
   it is not a wait for an event still pending (that would block inside the op). */
static bool op_ready_locked(const struct kcu_stream_st *s)
{
    const struct emu_op *op = s->head;
    return op && !s->running && !s->paused && op_deps_done_locked(s->dev, op) &&
           !(op->kind == OP_WAIT && op->ev->done_seq < op->seq && !s->dev->sticky);
}

/* Runs s's head op (op_ready_locked) in the calling thread and pops it. */
static void op_run_head_locked(struct kcu_stream_st *s)
{
    struct emu_op *op = s->head;
    s->running = true;             /* a copy drops the lock between chunks */
    op_exec_locked(s->dev, op);
    s->running = false;
    op_pop_locked(s, op);
}

/* A thread about to wait for device d's work (a stream, event or context synchronize) runs
   the next ready op of one of d's streams itself, want's first (NULL: none preferred), then
   the others' (what it waits for may depend on them): the same op, in the same order, at a
   moment its worker could have run it (the caller is blocked until that work is done), but
   without the hand-off to the worker and back that each op costs otherwise (a caller that
   copies and synchronizes waits for each of its copies). Work still runs on the workers
   whenever nobody waits for it: it stays asynchronous to the caller. True when it ran one. */
bool emu_help_locked(struct emu_dev *d, struct kcu_stream_st *want)
{
    if (want && op_ready_locked(want)) {
        op_run_head_locked(want);
        return true;
    }
    for (struct kcu_stream_st *s = emu.streams; s; s = s->next)
        if (s->dev == d && s != want && op_ready_locked(s)) {
            op_run_head_locked(s);
            return true;
        }
    return false;
}

/* Wakes the worker a submit of this thread's call found idle (emu_submit_locked), after the
   call dropped emu.lock: the worker then finds the lock free instead of waking into it and
   sleeping again until the caller leaves (a futex wait and wake more per operation). The
   queued op is under the lock already, so the worker either waits on cv now (and gets the
   signal) or sees the op before it waits. */
void emu_stream_kick(void)
{
    struct kcu_stream_st *s = emu_t.kick;
    if (!s)
        return;
    emu_t.kick = NULL;
    pthread_cond_signal(&s->cv);
    __atomic_sub_fetch(&s->kicks, 1, __ATOMIC_RELEASE);
}

/* Waits until no thread is still signalling s's worker (emu_stream_kick), before s is
   freed: between its emu_leave's unlock and its signal a thread holds no lock. */
static void stream_unkicked(struct kcu_stream_st *s)
{
    while (__atomic_load_n(&s->kicks, __ATOMIC_ACQUIRE))
        sched_yield();
}

static void *stream_main(void *arg)
{
    struct kcu_stream_st *s = arg;
    /* SCHED_BATCH (Linux; no privilege needed, failure ignored): a worker woken by a
       submit does not preempt the submitting thread on its CPU (the waker kept running
       costs two switches less per op), it runs on an idle CPU at once or when the CPU is
       next given up, with whatever work has been queued by then. When it runs is the
       device's affair: work stays asynchronous, and a caller that waits runs it itself. */
    struct sched_param prio = { 0 };
    (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &prio);
    pthread_mutex_lock(&emu.lock);
    for (;;) {
        while (s->head ? s->paused : !s->exiting) {
            s->idle = !s->head;
            pthread_cond_wait(&s->cv, &emu.lock);
            s->idle = false;
        }
        if (!s->head)
            break;
        struct emu_op *op = s->head;
        if (s->running || !op_deps_done_locked(s->dev, op)) {
            /* a synchronizing caller runs it (emu_help_locked), or its dependencies
               are pending: some op completes, or a resume */
            pthread_cond_wait(&emu.cond, &emu.lock);
            continue;
        }
        s->running = true;
        op_exec_locked(s->dev, op);
        s->running = false;
        op_pop_locked(s, op);
    }
    if (s->detached) {
        /* cuStreamDestroy returned long ago: the drained stream goes (the device's destroy
           waits for this) */
        for (struct kcu_stream_st **pp = &emu.streams; *pp; pp = &(*pp)->next)
            if (*pp == s) {
                *pp = s->next;
                break;
            }
        stream_unkicked(s);
        pthread_cond_destroy(&s->cv);
        free(s);
        pthread_cond_broadcast(&emu.cond);
    }
    pthread_mutex_unlock(&emu.lock);
    return NULL;
}

/* A live stream (not being destroyed), or NULL. */
struct kcu_stream_st *emu_stream_lookup_locked(kcu_stream s)
{
    for (struct kcu_stream_st *p = emu.streams; p; p = p->next)
        if (p == s && !p->dying)
            return p;
    return NULL;
}

/* Waits until every stream of d (only blocking ones when blocking_only) has run all its
   work. A stream paused with emu_stream_set_paused blocks this forever (test hook). */
void emu_drain_locked(struct emu_dev *d, bool blocking_only)
{
    for (;;) {
        bool busy = false;
        for (struct kcu_stream_st *s = emu.streams; s && !busy; s = s->next)
            busy = s->dev == d && s->head &&
                   !(blocking_only && (s->flags & KCU_STREAM_NON_BLOCKING));
        if (!busy)
            return;
        if (!emu_help_locked(d, NULL))
            pthread_cond_wait(&emu.cond, &emu.lock);
    }
}

static void stream_wait_idle_locked(struct kcu_stream_st *s)
{
    while (s->head)
        if (!emu_help_locked(s->dev, s))
            pthread_cond_wait(&emu.cond, &emu.lock);
}

/* Resolves the stream argument of a call: a live stream, or NULL / CU_STREAM_LEGACY /
   CU_STREAM_PER_THREAD for the default stream (needs a current context; the per-thread
   default stream is emulated as the legacy one, synchronously, which orders at least as
   strictly). KCU_ERROR_INVALID_HANDLE for an unknown stream. */
kcu_result emu_stream_arg_locked(kcu_stream stream, struct emu_dev *cur,
                                    struct kcu_stream_st **s, struct emu_dev **d)
{
    if (!stream || stream == KCU_STREAM_LEGACY || stream == KCU_STREAM_PER_THREAD) {
        if (!cur)
            return KCU_ERROR_INVALID_CONTEXT;
        *s = NULL;
        *d = cur;
        return KCU_SUCCESS;
    }
    if (!(*s = emu_stream_lookup_locked(stream)))
        return KCU_ERROR_INVALID_HANDLE;
    *d = (*s)->dev;
    return (*d)->sticky;
}

/* The device's legacy stream worker, made at its first use. NULL: out of memory. */
static struct kcu_stream_st *legacy_get_locked(struct emu_dev *d)
{
    if (d->legacy)
        return d->legacy;
    struct kcu_stream_st *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->dev = d;
    s->flags = KCU_STREAM_DEFAULT;
    s->legacy = true;
    s->id = ++emu.stream_id;
    if (pthread_cond_init(&s->cv, NULL)) {
        free(s);
        return NULL;
    }
    if (pthread_create(&s->thread, NULL, stream_main, s)) {
        pthread_cond_destroy(&s->cv);
        free(s);
        return NULL;
    }
    s->next = emu.streams;
    emu.streams = s;
    d->legacy = s;
    return s;
}

/* A legacy op's barrier: the work every other blocking stream of d has queued now. */
static kcu_result legacy_barrier_locked(struct emu_dev *d, struct emu_op *op)
{
    size_t n = 0;
    for (struct kcu_stream_st *p = emu.streams; p; p = p->next)
        n += p->dev == d && !p->legacy && !(p->flags & KCU_STREAM_NON_BLOCKING) &&
             p->done < p->queued;
    if (!n)
        return KCU_SUCCESS;
    if (!(op->bar = malloc(n * sizeof *op->bar)))
        return KCU_ERROR_OUT_OF_MEMORY;
    for (struct kcu_stream_st *p = emu.streams; p; p = p->next)
        if (p->dev == d && !p->legacy && !(p->flags & KCU_STREAM_NON_BLOCKING) &&
            p->done < p->queued) {
            op->bar[op->nbar].id = p->id;
            op->bar[op->nbar++].ticket = p->queued;
        }
    return KCU_SUCCESS;
}

/* Queues op on s; NULL = the legacy stream, whose worker runs it after the blocking streams'
   earlier work (cuda.h: the legacy stream synchronizes with every blocking stream; the
   caller does not wait, as for any stream). Takes ownership of op. */
kcu_result emu_submit_locked(struct kcu_stream_st *s, struct emu_dev *d, struct emu_op *op)
{
    if (!s) {
        kcu_result r = emu_legacy_capture_locked(d, false);
        if (!r && !(s = legacy_get_locked(d)))
            r = KCU_ERROR_OUT_OF_MEMORY;
        if (!r)
            r = legacy_barrier_locked(d, op);
        if (r) {
            if (op->ev)
                emu_event_put_locked(op->ev);
            op_free(op);
            return r;
        }
    } else if (!(s->flags & KCU_STREAM_NON_BLOCKING) && d->legacy &&
               d->legacy->queued > d->legacy->done) {
        op->legacy_wait = d->legacy->queued;
    }
    s->submitted++;
    if (s->capturing) {
        /* captured into the (emulated) graph: not executed */
        s->captured++;
        if (op->kind == OP_EVENT)
            op->ev->captured = true;
        if (op->ev)
            emu_event_put_locked(op->ev);
        op_free(op);
        return KCU_SUCCESS;
    }
    op->next = NULL;
    KVVM_ASSERT(s->queued >= s->done);
    op->ticket = ++s->queued;
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    if (s->idle && !s->paused) {
        /* its worker waits for work: woken when this call leaves (emu_stream_kick) */
        emu_stream_kick();         /* (one op per call: none is pending) */
        s->idle = false;
        emu_t.kick = s;
        __atomic_add_fetch(&s->kicks, 1, __ATOMIC_RELAXED);
    }
    return KCU_SUCCESS;
}

kcu_result emu_cuStreamCreate(kcu_stream *stream, unsigned int flags)
{
    BEGIN(cuStreamCreate, F_INIT | F_CTX | F_STICKY);
    if (!stream || (flags & ~(unsigned)KCU_STREAM_NON_BLOCKING)) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    struct kcu_stream_st *s = calloc(1, sizeof *s);
    if (!s) {
        r = KCU_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    s->dev = cur;
    s->flags = flags;
    s->id = ++emu.stream_id;
    if (pthread_cond_init(&s->cv, NULL))
        goto out_free;
    if (pthread_create(&s->thread, NULL, stream_main, s))
        goto out_cond;
    s->next = emu.streams;
    emu.streams = s;
    cur->c.streams++;
    *stream = s;
    goto out;
out_cond:
    pthread_cond_destroy(&s->cv);
out_free:
    free(s);
    r = KCU_ERROR_OUT_OF_MEMORY;
out:
    return emu_leave(r);
}

/* Stops s after its queued work ran, joins its worker and frees it. Called with emu.lock held
   and s marked dying; drops the lock around the join. */
void emu_stream_teardown_locked(struct kcu_stream_st *s)
{
    s->exiting = true;
    s->paused = false;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&emu.lock);
    pthread_join(s->thread, NULL);
    pthread_mutex_lock(&emu.lock);
    for (struct kcu_stream_st **pp = &emu.streams; *pp; pp = &(*pp)->next) {
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    }
    if (!s->legacy)
        s->dev->c.streams--;
    stream_unkicked(s);
    pthread_cond_destroy(&s->cv);
    free(s);
}

/* cuda.h, cuStreamDestroy: "In case the device is still doing work in the stream hStream
   when cuStreamDestroy() is called, the function will return immediately and the resources
   associated with hStream will be released automatically once the device has completed all
   work in hStream." So does the emulator: the handle is gone at once (no new work, counted
   no more), the worker drains the queue (a paused stream when resumed, or at the device's
   destroy) and frees the stream. NULL or unknown stream: KCU_ERROR_INVALID_HANDLE. */
kcu_result emu_cuStreamDestroy(kcu_stream stream)
{
    BEGIN(cuStreamDestroy, F_INIT);
    struct kcu_stream_st *s = emu_stream_lookup_locked(stream);
    if (!s) {
        r = KCU_ERROR_INVALID_HANDLE;
        goto out;
    }
    s->dying = true;
    s->detached = true;
    s->exiting = true;
    KVVM_ASSERT(s->dev->c.streams > 0);
    s->dev->c.streams--;
    pthread_detach(s->thread);
    pthread_cond_signal(&s->cv);
out:
    return emu_leave(r);
}

kcu_result emu_cuStreamSynchronize(kcu_stream stream)
{
    BEGIN(cuStreamSynchronize, F_INIT);
    struct kcu_stream_st *s;
    struct emu_dev *d;
    if ((r = emu_stream_arg_locked(stream, cur, &s, &d)) ||
        (r = emu_stream_capture_check_locked(s, d)))
        goto out;
    if (s)
        stream_wait_idle_locked(s);
    else
        emu_drain_locked(d, true);
    r = d->sticky;
out:
    return emu_leave(r);
}

kcu_result emu_cuStreamQuery(kcu_stream stream)
{
    BEGIN(cuStreamQuery, F_INIT);
    struct kcu_stream_st *s;
    struct emu_dev *d;
    if ((r = emu_stream_arg_locked(stream, cur, &s, &d)) ||
        (r = emu_stream_capture_check_locked(s, d)))
        goto out;
    if (s) {
        r = s->head ? KCU_ERROR_NOT_READY : KCU_SUCCESS;
    } else {
        for (struct kcu_stream_st *p = emu.streams; p; p = p->next)
            if (p->dev == d && p->head && !(p->flags & KCU_STREAM_NON_BLOCKING))
                r = KCU_ERROR_NOT_READY;
    }
out:
    return emu_leave(r);
}

/* Waits for the event's most recent record at the time of the call; an event never
   recorded is no dependency. flags != 0: KCU_ERROR_INVALID_VALUE. */
kcu_result emu_cuStreamWaitEvent(kcu_stream stream, kcu_event event, unsigned int flags)
{
    BEGIN(cuStreamWaitEvent, F_INIT);
    struct kcu_stream_st *s;
    struct emu_dev *d;
    struct kcu_event_st *ev = emu_event_lookup_locked(event);
    if ((r = emu_stream_arg_locked(stream, cur, &s, &d)))
        goto out;
    if (!ev) {
        r = KCU_ERROR_INVALID_HANDLE;
        goto out;
    }
    if (flags != 0) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    if (ev->captured && !(s && s->capturing)) {
        /* recorded inside a capture: a graph node, never executed; a wait from outside
           would cross the capture boundary (cuda.h, CUDA_ERROR_STREAM_CAPTURE_ISOLATION) */
        r = KCU_ERROR_STREAM_CAPTURE_ISOLATION;
        goto out;
    }
    if (ev->rec_seq == 0 || ev->done_seq >= ev->rec_seq)
        goto out;
    struct emu_op *op = malloc(sizeof *op);
    if (!op) {
        r = KCU_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    *op = (struct emu_op){ .kind = OP_WAIT, .ev = ev, .seq = ev->rec_seq };
    ev->refs++;
    r = emu_submit_locked(s, d, op);
out:
    return emu_leave(r);
}

/* The context a stream belongs to: its device's primary context; the default stream
   handles belong to the current context (KCU_ERROR_INVALID_CONTEXT without one). */
kcu_result emu_cuStreamGetCtx(kcu_stream stream, kcu_context *ctx)
{
    BEGIN(cuStreamGetCtx, F_INIT);
    struct kcu_stream_st *s;
    struct emu_dev *d;
    if (!ctx) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    if ((r = emu_stream_arg_locked(stream, cur, &s, &d)))
        goto out;
    *ctx = &emu.ctx[d->ordinal];
out:
    return emu_leave(r);
}

kcu_result emu_cuStreamIsCapturing(kcu_stream stream, int *status)
{
    BEGIN(cuStreamIsCapturing, F_INIT);
    struct kcu_stream_st *s;
    struct emu_dev *d;
    if (!status) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    if ((r = emu_stream_arg_locked(stream, cur, &s, &d)))
        goto out;
    if (!s && (r = emu_legacy_capture_locked(d, true)))
        goto out;
    *status = !s || !s->capturing ? KCU_STREAM_CAPTURE_STATUS_NONE
              : s->invalidated   ? KCU_STREAM_CAPTURE_STATUS_INVALIDATED
                                 : KCU_STREAM_CAPTURE_STATUS_ACTIVE;
out:
    return emu_leave(r);
}

kcu_result emu_cuCtxSynchronize(void)
{
    BEGIN(cuCtxSynchronize, F_INIT | F_CTX);
    kcu_result rc = emu_ctx_capture_locked(cur);
    kcu_result ru = emu_capture_unsafe_locked();
    if ((r = rc ? rc : ru))
        goto out;
    emu_drain_locked(cur, false);
    r = cur->sticky;
out:
    return emu_leave(r);
}

int emu_stream_counts(kcu_stream stream, uint64_t *submitted, uint64_t *captured)
{
    pthread_mutex_lock(&emu.lock);
    struct kcu_stream_st *s = emu_stream_lookup_locked(stream);
    if (s && submitted)
        *submitted = s->submitted;
    if (s && captured)
        *captured = s->captured;
    pthread_mutex_unlock(&emu.lock);
    return s ? 0 : -EINVAL;
}

int emu_stream_set_paused(kcu_stream stream, int on)
{
    pthread_mutex_lock(&emu.lock);
    struct kcu_stream_st *s = NULL;    /* a destroyed stream still draining too */
    for (struct kcu_stream_st *p = emu.streams; p && !s; p = p->next)
        if (p == stream)
            s = p;
    if (s) {
        s->paused = on != 0;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&emu.lock);
    return s ? 0 : -EINVAL;
}
