/*
 * core/call.h: the frame of every public call (included by core/ only).
 *
 * Contract: a public call returning a status starts with klast_clear(), checks its pointer
 * arguments with NONNULL, and runs its locked part through CALL / CALL_ENGINE: enter()
 * refuses with -EIO in a fork() child or once the context is dead (a sticky driver error
 * seen by vmm), takes kv->lock and arms vmm's lazy save of the caller's device context;
 * leave() notes a death, restores that context if a driver call replaced it, and unlocks; api_done() sets the thread's last error. The
 * helpers are static inline so each core file gets its own copy and no generic name
 * (enter, leave) becomes a symbol of the static library.
 */
#ifndef KVVM_CORE_CALL_H
#define KVVM_CORE_CALL_H

#include <errno.h>
#include <stdbool.h>
#include <unistd.h>
#include "core.h"
#include "common/log.h"

/* ---- arguments and the last error --------------------------------------------------- */
/* Every public call returning a status starts with klast_clear() and ends in api_done(): the
   thread's kvvm_last_error() is then "" after a success, else the reason. A bad argument is
   refused with kerr (logged at the call, kept as the reason). */
#define NONNULL(p) do { if (!(p)) return kerr(-EINVAL, "%s: %s is NULL", __func__, #p); } \
                   while (0)
/* A -EINVAL from a layer below that gave no reason: the call's own (logged, kept). */
#define EXPLAIN_EINVAL(rc, ...) \
    ((rc) == -EINVAL && !*kvvm_last_error() ? kerr((rc), __VA_ARGS__) : (rc))

/* Ends a public call: success clears the last error; a failure nothing explained gets the
   call's name and kvvm_strerror's text. */
static inline int api_done(const char *call, int rc)
{
    if (rc >= 0)
        klast_clear();
    else
        klast_set("%s: %s: %s", call, core_err_name(rc), kvvm_strerror(rc));
    return rc;
}

/* A fork() child of the process that opened kv: the context's threads, locks (perhaps held
   by a parent thread at the fork) and device context belong to the parent, so a child must
   touch none of it (no lock taken, no driver call: the emulated device's memory is shared
   with the parent). */
static inline bool fork_same(const kvvm *kv)
{
    return __builtin_expect(__atomic_load_n(&kvvm__fork_gen, __ATOMIC_RELAXED) ==
                            kv->fork_gen, 1);
}
static inline bool forked(const kvvm *kv)
{
    if (fork_same(kv))
        return false;
    klog_error("kvvm: a context is used in a child process (pid %ld) of the process that "
               "opened it (pid %ld): -EIO; a child must be started with exec (posix_spawn) "
               "to open a context of its own",
               (long)getpid(), (long)kv->pid);
    return true;
}

/* ---- locking and death -------------------------------------------------------------- */

static inline int enter(kvvm *kv)
{
    if (forked(kv))
        return -EIO;
    pthread_mutex_lock(&kv->lock);
    paging_why(kv->pg, PG_WHY_RESET, 0);           /* this call's refusals only (core_explain) */
    if (kv->dead || vmm_dead(kv->v)) {
        if (!kv->dead)
            klog_error("kvvm: the device context failed; every call returns -EIO now");
        kv->dead = true;
        pthread_mutex_unlock(&kv->lock);
        return -EIO;
    }
    /* the caller's current context comes back at leave(), if a driver call of this one
       replaced it: libkvvm never leaves its own context current in the engine's thread */
    vmm_call_begin();
    if (kv->sw)
        swap_call_begin(kv->sw);
    return 0;
}

/* The hot path's frame (a grow inside the pages a sequence holds, O(1) through paging's room
   fact): in the process that opened kv and while kv lives, takes the lock and returns true;
   else false, nothing taken. Its work (paging_seq_grow_fast) makes no driver call and
   records no refusal, so none of enter()'s arming or resets is needed; a "no" from it sends
   the call down the full path (CALL), which checks and explains everything again. Never in
   the debug build: there the invariant checker runs at the end of every call. */
static inline bool hot_enter(kvvm *kv)
{
#ifdef KVVM_DEBUG
    (void)kv;
    return false;
#else
    if (!fork_same(kv))
        return false;
    pthread_mutex_lock(&kv->lock);
    if (__builtin_expect(!__atomic_load_n(kv->vdead, __ATOMIC_ACQUIRE), 1))
        return true;                    /* (kv->dead implies the vmm's word: enter/leave) */
    pthread_mutex_unlock(&kv->lock);
    return false;
#endif
}

/* leave(kv, rc): `call` is the function that entered (for the debug build's checker). */
#define leave(kv, rc) leave_call((kv), (rc), __func__)
static inline int leave_call(kvvm *kv, int rc, const char *call)
{
    /* a failed call's reclaim taken back (swap_call_end: a failed call changes nothing) */
    if (kv->sw && !vmm_dead(kv->v))
        rc = swap_call_end(kv->sw, rc);
    if (vmm_dead(kv->v)) {
        if (!kv->dead)
            klog_error("kvvm: the device context failed; every call returns -EIO now");
        kv->dead = true;
        rc = -EIO;
    }
#ifdef KVVM_DEBUG
    core_debug_after_call(kv, call);    /* the invariant checker, lock held */
#else
    (void)call;
#endif
    vmm_call_end(kv->v);
    pthread_mutex_unlock(&kv->lock);
    return rc;
}

/* -EBUSY when the engine stream is capturing a graph (a swap would enqueue on it), or, in
   synchronous mode, when the legacy stream cannot be used because a blocking stream is
   capturing (cuda.h, cuStreamIsCapturing: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) or a stream
   made by kvvm_stream_create is capturing (the device cannot be synchronized). */
static inline int stream_check(kvvm *kv)
{
    kcu_stream es = paging_stream(kv->pg);
    int rc = vmm_stream_check_capture(kv->v, es);
    /* Synchronous mode synchronizes the device, which any capture in the context forbids
       (the CUDA programming guide: synchronizing a context while one of its streams
       captures is invalid, in every capture mode, and invalidates the capture): the streams
       kvvm_stream_create made are asked too (a non-blocking one leaves the legacy stream
       usable, so the query above does not see it). */
    for (size_t i = 0; !rc && !es && i < kv->n_streams; i++)
        rc = vmm_stream_check_capture(kv->v, kv->streams[i]);
    return rc;
}

/* A public call's locked part: expr's -ENOENT, -E2BIG and -ENOMEM get their numbers in the
   last error (core_explain, lock held). CALL_AS: the same for a function running the
   public call `name`'s full path (its hot path in the public function itself). */
#define CALL_AS(kv, name, expr) \
    do { int rc_ = enter(kv); \
         if (!rc_) rc_ = leave_call(kv, core_explain(kv, name, (expr)), name); \
         return api_done(name, rc_); } while (0)
#define CALL(kv, expr) CALL_AS(kv, __func__, expr)
/* CALL for a call that enqueues onto, records on or synchronizes the engine stream:
   -EBUSY, nothing changed, while that stream captures a CUDA graph (stream_check). */
#define CALL_ENGINE(kv, expr) \
    do { int rc_ = enter(kv); if (!rc_) { rc_ = stream_check(kv); \
         rc_ = leave(kv, rc_ ? rc_ : core_explain(kv, __func__, (expr))); } \
         return api_done(__func__, rc_); } while (0)

#endif
