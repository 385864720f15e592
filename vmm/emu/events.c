/*
 * vmm/emu/events.c: events: records, queries, synchronization.
 * (Contract of the emulated device: vmm/emu/emu.h; internals: vmm/emu/emu_int.h.)
 */
#include "emu_int.h"

void emu_event_put_locked(struct kcu_event_st *ev)
{
    KVVM_ASSERT(ev->refs > 0);              /* a put matches a get or the create */
    if (--ev->refs == 0)
        free(ev);
}

struct kcu_event_st *emu_event_lookup_locked(kcu_event e)
{
    for (struct kcu_event_st *p = emu.events; p; p = p->next)
        if (p == e)
            return p;
    return NULL;
}

/* The event behind an entry point's event argument; unknown (or NULL):
   KCU_ERROR_INVALID_HANDLE. */
static kcu_result event_arg_locked(kcu_event e, struct kcu_event_st **ev)
{
    *ev = emu_event_lookup_locked(e);
    return *ev ? KCU_SUCCESS : KCU_ERROR_INVALID_HANDLE;
}

/* ---- events ------------------------------------------------------------------------- */

/* Flags: DEFAULT, BLOCKING_SYNC (1), DISABLE_TIMING (2), INTERPROCESS (4); others
   KCU_ERROR_INVALID_VALUE. */
kcu_result emu_cuEventCreate(kcu_event *event, unsigned int flags)
{
    BEGIN(cuEventCreate, F_INIT | F_CTX | F_STICKY);
    if (!event || (flags & ~7u)) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    struct kcu_event_st *ev = calloc(1, sizeof *ev);
    if (!ev) {
        r = KCU_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    ev->dev = cur;
    ev->flags = flags;
    ev->refs = 1;
    ev->next = emu.events;
    emu.events = ev;
    cur->c.events++;
    *event = ev;
out:
    return emu_leave(r);
}

void emu_event_unlink_locked(struct kcu_event_st *ev)
{
    for (struct kcu_event_st **pp = &emu.events; *pp; pp = &(*pp)->next) {
        if (*pp == ev) {
            *pp = ev->next;
            break;
        }
    }
    KVVM_ASSERT(ev->dev->c.events > 0);    /* unlinked once, after its create */
    ev->dev->c.events--;
}

/* A pending record is allowed (its resources go when it completes), as in the driver. */
kcu_result emu_cuEventDestroy(kcu_event event)
{
    BEGIN(cuEventDestroy, F_INIT);
    struct kcu_event_st *ev;
    if ((r = event_arg_locked(event, &ev)))
        goto out;
    emu_event_unlink_locked(ev);
    emu_event_put_locked(ev);
out:
    return emu_leave(r);
}

/* Event and stream must belong to the same device: else KCU_ERROR_INVALID_HANDLE. */
kcu_result emu_cuEventRecord(kcu_event event, kcu_stream stream)
{
    BEGIN(cuEventRecord, F_INIT);
    struct kcu_stream_st *s;
    struct emu_dev *d;
    struct kcu_event_st *ev;
    if ((r = event_arg_locked(event, &ev)))
        goto out;
    if ((r = emu_stream_arg_locked(stream, cur, &s, &d)))
        goto out;
    if (d != ev->dev) {
        r = KCU_ERROR_INVALID_HANDLE;
        goto out;
    }
    struct emu_op *op = malloc(sizeof *op);
    if (!op) {
        r = KCU_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    *op = (struct emu_op){ .kind = OP_EVENT, .ev = ev, .seq = ++ev->rec_seq };
    ev->refs++;
    ev->captured = false;          /* set again by emu_submit_locked if s is capturing */
    r = emu_submit_locked(s, d, op);
out:
    return emu_leave(r);
}

/* The event behind cuEventQuery's or cuEventSynchronize's argument: unknown:
   KCU_ERROR_INVALID_HANDLE; recorded inside a capture: KCU_ERROR_STREAM_CAPTURE_UNSUPPORTED;
   a capture that forbids the call: emu_capture_unsafe_locked's error. */
static kcu_result event_wait_arg_locked(kcu_event e, struct kcu_event_st **ev)
{
    kcu_result r = event_arg_locked(e, ev);
    if (!r && (*ev)->captured)
        r = KCU_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (!r)
        r = emu_capture_unsafe_locked();
    return r;
}

kcu_result emu_cuEventQuery(kcu_event event)
{
    BEGIN(cuEventQuery, F_INIT);
    struct kcu_event_st *ev;
    if ((r = event_wait_arg_locked(event, &ev)))
        goto out;
    if (ev->dev->sticky)
        r = ev->dev->sticky;
    else if (ev->done_seq < ev->rec_seq)
        r = KCU_ERROR_NOT_READY;
out:
    return emu_leave(r);
}

kcu_result emu_cuEventSynchronize(kcu_event event)
{
    BEGIN(cuEventSynchronize, F_INIT);
    struct kcu_event_st *ev;
    if ((r = event_wait_arg_locked(event, &ev)))
        goto out;
    KVVM_ASSERT(ev->refs > 0);             /* a listed event holds its create's ref */
    ev->refs++;                    /* survive a concurrent cuEventDestroy */
    uint64_t want = ev->rec_seq;
    while (ev->done_seq < want && !ev->dev->sticky)
        if (!emu_help_locked(ev->dev, NULL))
            pthread_cond_wait(&emu.cond, &emu.lock);
    r = ev->dev->sticky;
    emu_event_put_locked(ev);
out:
    return emu_leave(r);
}
