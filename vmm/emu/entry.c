/*
 * vmm/emu/entry.c: the prologue every entry point runs (emu.lock, call counting and tracing,
 * fault injection, context and sticky-error checks), the state (emu), and the test API of
 * fault injection, tracing and call counters.
 * (Contract of the emulated device: vmm/emu/emu.h; internals: vmm/emu/emu_int.h.)
 */
#include "emu_int.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

const char *const emu_entry_names[E_COUNT] = {
#define X(n) #n,
    EMU_ENTRIES(X)
#undef X
};

/* ---- the emulator's state (struct emu_state, emu_int.h) ------------------------------- */

struct emu_state emu = {
    /* adaptive (glibc): a thread that finds it held spins briefly before it sleeps; the
       holders' sections are short, and a worker woken by a submit reacquires it in
       pthread_cond_wait while the submitting caller is still inside its entry point, which
       otherwise costs a futex sleep and a wake-up on each side per operation */
    .lock = PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP,
    .cond = PTHREAD_COND_INITIALIZER,
};

__thread struct emu_thread emu_t;

struct emu_dev *emu_dev_get_locked(int ordinal)
{
    if (ordinal < 0 || ordinal >= EMU_MAX_DEVICES)
        return NULL;
    return emu.devs[ordinal];
}

/* The device of the calling thread's current context, if that context is alive. */
static struct emu_dev *current_dev_locked(void)
{
    if (!emu_t.ctx)
        return NULL;
    int i = (int)(emu_t.ctx - emu.ctx);
    struct emu_dev *d = emu.devs[i];
    if (!d || emu_t.ctx_gen != emu_t.ctx->gen || d->ctx_refs <= 0)
        return NULL;
    return d;
}

static void trace_record_locked(int e)
{
    if (!emu.tracing)
        return;
    unsigned long nth = ++emu.trace_occ[e];
    if (emu.trace_n == emu.trace_cap) {
        size_t cap = emu.trace_cap ? 2 * emu.trace_cap : 1024;
        struct emu_trace_entry *t = realloc(emu.trace_buf, cap * sizeof *t);
        if (!t)
            return;                /* tracing is best effort under memory pressure */
        emu.trace_buf = t;
        emu.trace_cap = cap;
    }
    emu.trace_buf[emu.trace_n++] = (struct emu_trace_entry){ emu_entry_names[e], nth };
}

/* Counts this call against every armed failure of entry e; true (and *err) if one fires. */
static bool fault_check_locked(int e, kcu_result *err)
{
    bool fired = false;
    for (struct emu_fault **pp = &emu.faults; *pp;) {
        struct emu_fault *f = *pp;
        if (f->entry == e && --f->left == 0) {
            if (!fired) {
                *err = f->err;
                fired = true;
            }
            *pp = f->next;
            free(f);
            continue;
        }
        pp = &f->next;
    }
    return fired;
}

/* The gate (emu_gate_arm): on holds the armed entry + 1 (0: none), read without the lock by
   every call; the rest under mu. */
static struct {
    _Atomic int on;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t armer;
    bool waiting;
} gate = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };

static void gate_pass(int e)
{
    pthread_mutex_lock(&gate.mu);
    if (atomic_load(&gate.on) == e + 1 && !gate.waiting &&
        !pthread_equal(pthread_self(), gate.armer)) {
        gate.waiting = true;
        pthread_cond_broadcast(&gate.cv);
        while (atomic_load(&gate.on) == e + 1)
            pthread_cond_wait(&gate.cv, &gate.mu);
    }
    pthread_mutex_unlock(&gate.mu);
}

int emu_gate_arm(const char *entry)
{
    int e = -1;
    for (int i = 0; entry && i < E_COUNT; i++)
        if (!strcmp(emu_entry_names[i], entry))
            e = i;
    if (e < 0)
        return -EINVAL;
    pthread_mutex_lock(&gate.mu);
    int rc = atomic_load(&gate.on) ? -EBUSY : 0;
    if (!rc) {
        gate.armer = pthread_self();
        gate.waiting = false;
        atomic_store(&gate.on, e + 1);
    }
    pthread_mutex_unlock(&gate.mu);
    return rc;
}

void emu_gate_wait(void)
{
    pthread_mutex_lock(&gate.mu);
    while (atomic_load(&gate.on) && !gate.waiting)
        pthread_cond_wait(&gate.cv, &gate.mu);
    pthread_mutex_unlock(&gate.mu);
}

void emu_gate_open(void)
{
    pthread_mutex_lock(&gate.mu);
    atomic_store(&gate.on, 0);
    gate.waiting = false;
    pthread_cond_broadcast(&gate.cv);
    pthread_mutex_unlock(&gate.mu);
}

void emu_lock_for_test(int take)
{
    if (take)
        pthread_mutex_lock(&emu.lock);
    else
        pthread_mutex_unlock(&emu.lock);
}

/* A fork() child of a process that had called cuInit cannot use the driver (CUDA refuses
   it: cuInit and every call then fail with CUDA_ERROR_NOT_INITIALIZED), and neither can it
   use the emulator: its devices, streams and locks are the parent's, and a parent's thread
   may have held emu.lock at the fork. The child gets a fresh lock (no state behind it is
   read again: every entry point fails first) so that a call fails instead of hanging. */
static void fork_child(void)
{
    if (!emu.inited)
        return;
    atomic_store(&emu.forked, true);
    pthread_mutex_init(&emu.lock, NULL);
    pthread_cond_init(&emu.cond, NULL);
}

static void fork_watch_once(void)
{
    (void)pthread_atfork(NULL, NULL, fork_child);
}

void emu_fork_watch(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    (void)pthread_once(&once, fork_watch_once);
}

/* The one prologue: takes emu.lock (every entry point returns through emu_leave()), counts
   and records the call, fires armed failures, then checks initialization, context and
   sticky errors. */
kcu_result emu_enter(int e, int need, struct emu_dev **cur)
{
    if (atomic_load_explicit(&gate.on, memory_order_relaxed))
        gate_pass(e);
    pthread_mutex_lock(&emu.lock);
    *cur = NULL;
    /* the calls that need no cuInit (the version, the error strings) still answer */
    if (((need & F_INIT) || e == E_cuInit) &&
        atomic_load_explicit(&emu.forked, memory_order_relaxed))
        return KCU_ERROR_NOT_INITIALIZED;
    struct emu_dev *d = current_dev_locked();
    *cur = d;
    if (d) {
        d->calls[e]++;
        emu_thread_count(e);
    }
    trace_record_locked(e);
    kcu_result err = KCU_SUCCESS;
    /* err is never KCU_SUCCESS (emu_fail_arm and KVVM_EMU_FAIL refuse it); the check says
       so to the analyzer, which otherwise sees a success returned with *cur unset */
    if (fault_check_locked(e, &err) && err != KCU_SUCCESS)
        return err;
    if ((need & F_INIT) && !emu.inited)
        return KCU_ERROR_NOT_INITIALIZED;
    if ((need & F_CTX) && !d)
        return KCU_ERROR_INVALID_CONTEXT;
    if ((need & F_STICKY) && d && d->sticky)
        return d->sticky;
    return KCU_SUCCESS;
}

kcu_result emu_leave(kcu_result r)
{
    pthread_mutex_unlock(&emu.lock);
    emu_stream_kick();
    return r;
}

/* ---- test API: devices, counters, lookup, faults, tracing, stream hooks -------------- */

/* Arms the failures of KVVM_EMU_FAIL ("entry:nth:err,..."); malformed items are logged
   and skipped. */
void emu_fail_env_locked(void)
{
    const char *e = getenv("KVVM_EMU_FAIL");
    if (!e || !*e)
        return;
    char *copy = strdup(e), *save = NULL;
    if (!copy)
        return;
    for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char name[64];
        unsigned long nth;
        int err, used = 0;
        int entry = -1;
        if (sscanf(item, " %63[^:]:%lu:%d%n", name, &nth, &err, &used) == 3 &&
            item[used] == '\0') {
            for (int i = 0; i < E_COUNT; i++)
                if (!strcmp(emu_entry_names[i], name))
                    entry = i;
        }
        struct emu_fault *f = NULL;
        if (entry < 0 || nth == 0 || err == 0 || !(f = malloc(sizeof *f))) {
            klog_error("KVVM_EMU_FAIL: '%s' is not entry:nth:err (a driver entry point, "
                       "nth >= 1, a nonzero CUresult); ignored", item);
            continue;
        }
        *f = (struct emu_fault){ .entry = entry, .left = nth, .err = err, .next = emu.faults };
        emu.faults = f;
    }
    free(copy);
}

int emu_fail_arm(const char *entry, unsigned long nth, kcu_result err)
{
    if (!entry || nth == 0 || err == KCU_SUCCESS)
        return -EINVAL;
    int e = -1;
    for (int i = 0; i < E_COUNT; i++)
        if (!strcmp(emu_entry_names[i], entry))
            e = i;
    if (e < 0)
        return -EINVAL;
    struct emu_fault *f = malloc(sizeof *f);
    if (!f)
        return -ENOMEM;
    pthread_mutex_lock(&emu.lock);
    *f = (struct emu_fault){ .entry = e, .left = nth, .err = err, .next = emu.faults };
    emu.faults = f;
    pthread_mutex_unlock(&emu.lock);
    return 0;
}

void emu_fail_clear(void)
{
    pthread_mutex_lock(&emu.lock);
    while (emu.faults) {
        struct emu_fault *f = emu.faults;
        emu.faults = f->next;
        free(f);
    }
    pthread_mutex_unlock(&emu.lock);
}

void emu_trace_start(void)
{
    pthread_mutex_lock(&emu.lock);
    emu.trace_n = 0;
    memset(emu.trace_occ, 0, sizeof emu.trace_occ);
    emu.tracing = true;
    pthread_mutex_unlock(&emu.lock);
}

size_t emu_trace_stop(struct emu_trace_entry *out, size_t max)
{
    pthread_mutex_lock(&emu.lock);
    emu.tracing = false;
    size_t n = emu.trace_n;
    if (out)
        memcpy(out, emu.trace_buf, min_sz(n, max) * sizeof *out);
    emu.trace_n = 0;
    pthread_mutex_unlock(&emu.lock);
    return n;
}

int emu_calls_get(int ordinal, struct emu_calls *out)
{
    if (!out)
        return -EINVAL;
    pthread_mutex_lock(&emu.lock);
    struct emu_dev *d = emu_dev_get_locked(ordinal);
    if (d) {
#define X(n) out->n = d->calls[E_##n];
        EMU_ENTRIES(X)
#undef X
    }
    pthread_mutex_unlock(&emu.lock);
    return d ? 0 : -ENODEV;
}

/* This thread's calls with a device current (emu.h), E_COUNT counts allocated at its first
   (emu_thread_count), not in TLS: libkvvm.so's TLS block is all static (its initial-exec
   variables), and what it takes a later dlopen'ed library (libgomp) cannot have.
   EMU_CALLS_LOST: the allocation failed. */
#define EMU_CALLS_LOST ((uint64_t *)1)
static __thread uint64_t *thread_counts;
static pthread_key_t calls_key;      /* frees a thread's counts when it exits */
static pthread_once_t calls_once = PTHREAD_ONCE_INIT;
static int calls_key_err;
static void calls_key_make(void) { calls_key_err = pthread_key_create(&calls_key, free); }

/* The calling thread's counts, allocated at its first use; NULL when that failed. */
static uint64_t *thread_calls(void)
{
    if (!thread_counts) {
        uint64_t *c = NULL;
        if (!pthread_once(&calls_once, calls_key_make) && !calls_key_err)
            c = calloc(E_COUNT, sizeof *c);
        if (c && pthread_setspecific(calls_key, c)) {
            free(c);
            c = NULL;
        }
        thread_counts = c ? c : EMU_CALLS_LOST;
    }
    return thread_counts == EMU_CALLS_LOST ? NULL : thread_counts;
}

void emu_thread_count(int e)
{
    uint64_t *c = thread_calls();
    if (c)
        c[e]++;
}

int emu_thread_calls_get(struct emu_calls *out)
{
    const uint64_t *c = thread_calls();
    if (!c)
        return -ENOMEM;
#define X(n) out->n = c[E_##n];
    EMU_ENTRIES(X)
#undef X
    return 0;
}

int emu_calls_reset(int ordinal)
{
    pthread_mutex_lock(&emu.lock);
    struct emu_dev *d = emu_dev_get_locked(ordinal);
    if (d)
        memset(d->calls, 0, sizeof d->calls);
    pthread_mutex_unlock(&emu.lock);
    return d ? 0 : -ENODEV;
}
