/* tests/test_share_pending.c: shares of a stream-mode client wait for its device work off the
   engine's thread (issue 35), through a real kvvmd (tests/pool_daemon.h) and real processes.
   A sharer (a child process) queues a write on its paused engine stream (a pinned source: the
   CPU does not wait), then kvvm_prefix_publish or kvvm_seq_export on a thread. A gate holds
   the next cuStreamSynchronize of another thread than the sharer's main one: a call that
   synchronizes the engine stream (the defect) stops there before it returns; a call that
   does not returns, and the thread's own synchronization of an idle stream reaches the gate
   instead. Either way the test goes on (no hang): the sharer's exit code names the check.
   While the stream is paused the share is pending: another process's lookup misses and an
   import is -EAGAIN (nothing spent); after the unpause and the sharer's kvvm_sync, they find
   the queued write's bytes. A sharer killed while its shares are pending takes them along:
   no client ever attaches or imports them; a failed wait for the device work (an injected
   driver error) drops them too. The daemon's side on the raw protocol: a pending entry is a
   miss until READY, READY ok 0 drops, an import of a pending export waits for its READY up
   to its wait_ms (then -EAGAIN, nothing spent; -ENOENT when the export is dropped). */
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include "harness.h"
#include "pool_daemon.h"
#include "pool_share.h"

#define NB   4u                         /* blocks shared */
#define LEN  (NB * TPP)
#define NS   21u

static void keys_of(kvvm_key *k)
{
    for (unsigned i = 0; i < NB; i++) {
        memset(&k[i], 0, sizeof k[i]);
        k[i].bytes[0] = 'P';
        k[i].bytes[1] = (uint8_t)i;
    }
}

/* The device's primary context current in the calling thread (for the test's own calls of
   the emulated driver). 0; -1. */
static int ctx_on(int ord)
{
    const struct kcu_api *a = emu_api();
    kcu_device d;
    kcu_context c;
    return a->cuDeviceGet(&d, ord) || a->cuDevicePrimaryCtxRetain(&c, d) ||
           a->cuCtxSetCurrent(c) ? -1 : 0;
}

/* Undoes ctx_on. */
static void ctx_off(int ord)
{
    const struct kcu_api *a = emu_api();
    kcu_device d;
    if (!a->cuDeviceGet(&d, ord) && !a->cuCtxSetCurrent(NULL))
        (void)a->cuDevicePrimaryCtxRelease(d);
}

enum { SHARE_PUBLISH = 1, SHARE_EXPORT = 2 };

struct sharer {
    kvvm *kv;
    kvvm_seq s;
    unsigned what;                      /* SHARE_* */
    int ord;
    void *idle;                         /* a stream with no work: its sync reaches the gate */
    kvvm_handoff t;
    int rc;
    atomic_int done;
};

static void *share_thread(void *arg)
{
    struct sharer *o = arg;
    kvvm_key k[NB];
    keys_of(k);
    int rc = 0;
    if ((o->what & SHARE_PUBLISH) && kvvm_prefix_publish(o->kv, o->s, NS, k, NB) != (int)NB)
        rc = 1;
    if (!rc && (o->what & SHARE_EXPORT) && kvvm_seq_export(o->kv, o->s, &o->t))
        rc = 2;
    o->rc = rc;
    atomic_store(&o->done, 1);
    if (ctx_on(o->ord) || emu_api()->cuStreamSynchronize((kcu_stream)o->idle))
        o->rc = o->rc ? o->rc : 3;
    ctx_off(o->ord);
    return NULL;
}

/* The sharer process: pattern 0x31 written and complete, then pattern 0x7c queued (paused
   stream, pinned source) and shared (what). Says 'p' (and sends the token) on out_fd once
   the call returned with the stream still paused; on 'g' from in_fd unpauses, kvvm_sync,
   says 'r'; on 'x' closes. Its exit code names the failed check. */
static int sharer(const char *path, unsigned what, int out_fd, int in_fd)
{
    struct kvvm_config c;
    cfg(&c, path, "sharer", BPT);
    c.pool_thread = 0;                  /* no library thread of its own but the pool's */
    struct sharer o = { .what = what };
    void *st = NULL;
    if (kvvm_open(&c, &o.kv) || kvvm_stream_create(o.kv, &st) || kvvm_set_stream(o.kv, st) ||
        kvvm_stream_create(o.kv, &o.idle))
        return 100;
    o.ord = kvvm_debug_emu_ordinal(o.kv);
    if (kvvm_seq_create(o.kv, &o.s) || kvvm_seq_grow(o.kv, o.s, LEN) ||
        fill(o.kv, o.s, LEN, 0x31) || kvvm_sync(o.kv))
        return 101;
    size_t bytes = (size_t)LEN * BPT;
    unsigned char *pin[NREG];
    if (ctx_on(o.ord))
        return 102;
    for (uint32_t r = 0; r < NREG; r++) {
        if (emu_api()->cuMemAllocHost((void **)&pin[r], bytes))
            return 103;
        for (size_t i = 0; i < bytes; i++)
            pin[r][i] = pat_at(0x7c, r, i);
    }
    if (emu_stream_set_paused((kcu_stream)st, 1))
        return 104;
    for (uint32_t r = 0; r < NREG; r++)     /* queued: the CPU does not wait (pinned) */
        if (kvvm_seq_write(o.kv, o.s, r, 0, pin[r], bytes))
            return 105;
    if (emu_gate_arm("cuStreamSynchronize"))
        return 106;
    pthread_t th;
    if (pthread_create(&th, NULL, share_thread, &o))
        return 107;
    emu_gate_wait();
    int early = atomic_load(&o.done);   /* the call returned, the engine's work undone */
    if (early) {
        put_byte(out_fd, 'p');
        if ((what & SHARE_EXPORT) && write(out_fd, &o.t, sizeof o.t) != (ssize_t)sizeof o.t)
            return 108;
        if (get_byte(in_fd) != 'g')
            early = 0;                  /* the test ended */
    }
    emu_stream_set_paused((kcu_stream)st, 0);
    emu_gate_open();
    pthread_join(th, NULL);
    if (!early)
        return 110;                     /* the call waited for the engine stream */
    if (o.rc)
        return 110 + o.rc;
    if (kvvm_sync(o.kv))
        return 115;
    put_byte(out_fd, 'r');
    if (get_byte(in_fd) != 'x')
        return 116;
    for (uint32_t r = 0; r < NREG; r++)
        (void)emu_api()->cuMemFreeHost(pin[r]);
    ctx_off(o.ord);
    kvvm_close(o.kv);
    return 0;
}

struct sharer_proc {
    pid_t pid;
    int out, in;                        /* its messages; ours to it */
};

static struct sharer_proc sharer_start(const char *path, unsigned what)
{
    int op[2], ip[2];
    cr_assert_eq(pipe2(op, O_CLOEXEC), 0);
    cr_assert_eq(pipe2(ip, O_CLOEXEC), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(op[0]);
        close(ip[1]);
        _exit(sharer(path, what, op[1], ip[0]));
    }
    close(op[1]);
    close(ip[0]);
    return (struct sharer_proc){ pid, op[0], ip[1] };
}

static void sharer_end(struct sharer_proc *p, int want)
{
    close(p->in);
    cr_expect_eq(pd_wait(p->pid), want, "the sharer: its exit code names the check");
    close(p->out);
}

/* ---- the other process: a lookup and attach (publish), or an import (export) ---------- */

/* expect: the blocks it must find (0: a miss, nothing attached); with them every byte is
   pat. */
static int attacher(const char *path, unsigned expect, unsigned char pat)
{
    struct kvvm_config c;
    cfg(&c, path, "attacher", BPT);
    kvvm *kv = NULL;
    kvvm_key k[NB];
    keys_of(k);
    if (kvvm_open(&c, &kv))
        return 30;
    if (kvvm_prefix_lookup(kv, NS, k, NB, NULL) != (int)expect)
        return 31;
    kvvm_seq s;
    if (kvvm_seq_create(kv, &s) || kvvm_prefix_attach(kv, s, NS, k, NB) != (int)expect)
        return 32;
    if (expect && (STAT(kv, pool_hit_blocks) != expect || check(kv, s, expect * TPP, pat)))
        return 33;
    kvvm_close(kv);
    return 0;
}

/* want: kvvm_seq_import's result; 0: every byte is pat, and a second import -ENOENT.
   wait_ms: its pool_timeout_ms, how long the import waits for a pending export. */
static int importer(const char *path, const kvvm_handoff *t, int want, unsigned char pat,
                    uint32_t wait_ms)
{
    struct kvvm_config c;
    cfg(&c, path, "importer", BPT);
    c.pool_timeout_ms = wait_ms;
    kvvm *kv = NULL;
    if (kvvm_open(&c, &kv))
        return 40;
    kvvm_seq s, s2;
    int rc = kvvm_seq_import(kv, t, &s);
    if (rc != want || (rc && !*kvvm_last_error()))
        return 41;
    if (!rc && check(kv, s, LEN, pat))
        return 42;
    if (!rc && kvvm_seq_import(kv, t, &s2) != -ENOENT)
        return 43;
    kvvm_close(kv);
    return 0;
}

static int run_attacher(const char *path, unsigned expect, unsigned char pat)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0)
        _exit(attacher(path, expect, pat));
    return pd_wait(pid);
}

static pid_t importer_start(const char *path, const kvvm_handoff *t, int want,
                            unsigned char pat, uint32_t wait_ms)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0)
        _exit(importer(path, t, want, pat, wait_ms));
    return pid;
}

static int run_importer(const char *path, const kvvm_handoff *t, int want, unsigned char pat)
{
    return pd_wait(importer_start(path, t, want, pat, 1));
}

/* Polls (each INFO a round trip, no sleep) until no client is connected and every frame
   not held by an entry is back: the daemon handled every death. */
__attribute__((noinline)) static struct pool_figures wait_clientless(const char *path)
{
    int ctl = control(path);
    struct pool_figures f;
    for (;;) {
        f = pc_info(ctl);
        if (f.n_clients == 0)
            break;
        sched_yield();
    }
    close(ctl);
    return f;
}

TestSuite(regress);

/* Bug (issue 35): with a pool and an engine stream, kvvm_prefix_publish synchronized the
   engine stream on the engine's thread (paging's collect_frames): the call blocked until all
   the engine's queued work was done. */
Test(regress, publish_waited_for_the_engine_stream_on_the_engines_thread)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "4M");
    struct sharer_proc p = sharer_start(d.path, SHARE_PUBLISH);
    cr_assert_eq(get_byte(p.out), 'p', "the publish returned with the engine stream paused "
                 "(else the sharer's exit code names the check)");
    cr_expect_eq(run_attacher(d.path, 0, 0), 0, "pending: another client's lookup and attach "
                 "miss (its exit code names the check)");
    put_byte(p.in, 'g');
    cr_assert_eq(get_byte(p.out), 'r');
    cr_expect_eq(run_attacher(d.path, NB, 0x7c), 0, "after kvvm_sync: found, with the queued "
                 "write's bytes (its exit code names the check)");
    put_byte(p.in, 'x');
    sharer_end(&p, 0);
    char out[512];
    cr_expect_eq(pd_ctl(d.path, "drop", out, sizeof out), 0, "kvvmctl drop: %s", out);
    pd_stop(&d);
}

/* The same bug in kvvm_seq_export. An import of the pending export is -EAGAIN once its
   wait (pool_timeout_ms, here 1 ms) ends with the stream still paused, and spends nothing;
   one with a long wait, started while the stream is paused, imports the queued write's
   bytes once the exporter's work completed (it waited for the READY, or came after it). */
Test(regress, export_waited_for_the_engine_stream_on_the_engines_thread)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "4M");
    struct sharer_proc p = sharer_start(d.path, SHARE_EXPORT);
    cr_assert_eq(get_byte(p.out), 'p', "the export returned with the engine stream paused "
                 "(else the sharer's exit code names the check)");
    kvvm_handoff t;
    cr_assert_eq(read(p.out, &t, sizeof t), (ssize_t)sizeof t);
    cr_expect_eq(run_importer(d.path, &t, -EAGAIN, 0), 0, "pending: -EAGAIN (its exit code "
                 "names the check)");
    pid_t w = importer_start(d.path, &t, 0, 0x7c, 60000);
    put_byte(p.in, 'g');
    cr_assert_eq(get_byte(p.out), 'r');
    cr_expect_eq(pd_wait(w), 0, "imported, with the queued write's bytes (its exit code names "
                 "the check)");
    put_byte(p.in, 'x');
    sharer_end(&p, 0);
    pd_stop(&d);
}

/* A sharer SIGKILLed while its entries and its export are pending: the daemon drops them
   (their bytes were never known complete); no client ever attaches or imports them. */
Test(regress, pending_shares_of_a_killed_sharer_are_never_seen)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "4M");
    struct sharer_proc p = sharer_start(d.path, SHARE_PUBLISH | SHARE_EXPORT);
    cr_assert_eq(get_byte(p.out), 'p', "the shares returned with the engine stream paused "
                 "(else the sharer's exit code names the check)");
    kvvm_handoff t;
    cr_assert_eq(read(p.out, &t, sizeof t), (ssize_t)sizeof t);
    cr_assert_eq(kill(p.pid, SIGKILL), 0);
    sharer_end(&p, 128 + SIGKILL);
    struct pool_figures f = wait_clientless(d.path);
    cr_expect_eq(f.shared_entries, 0, "its pending entries went with it");
    cr_expect_eq(f.free_bytes, f.pool_bytes, "and every frame they held");
    cr_expect_eq(run_attacher(d.path, 0, 0), 0, "a miss (its exit code names the check)");
    cr_expect_eq(run_importer(d.path, &t, -ENOENT, 0), 0, "no such export (its exit code "
                 "names the check)");
    pd_stop(&d);
}

/* A publisher whose wait for its fence fails (an injected driver error): its entries are
   dropped at the daemon, never seen; its own local entries and its call's result stay.
   Says 'p' once its kvvm_sync returned. */
static int failed_waiter(const char *path, int out_fd, int in_fd)
{
    struct kvvm_config c;
    cfg(&c, path, "failed-waiter", BPT);
    c.pool_thread = 0;
    kvvm *kv = NULL;
    kvvm_seq s;
    void *st = NULL;
    kvvm_key k[NB];
    keys_of(k);
    if (kvvm_open(&c, &kv) || kvvm_stream_create(kv, &st) || kvvm_set_stream(kv, st))
        return 50;
    if (kvvm_seq_create(kv, &s) || kvvm_seq_grow(kv, s, LEN) || fill(kv, s, LEN, 0x31) ||
        kvvm_sync(kv))
        return 51;
    if (emu_fail_arm("cuEventSynchronize", 1, KCU_ERROR_INVALID_HANDLE))
        return 52;                      /* the ready thread's wait: the next one */
    if (kvvm_prefix_publish(kv, s, NS, k, NB) != (int)NB)
        return 53;
    if (kvvm_sync(kv))
        return 54;                      /* its READY (ok 0) answered */
    emu_fail_clear();
    if (kvvm_prefix_lookup(kv, NS, k, NB, NULL) != (int)NB)
        return 55;                      /* the local entries stay */
    put_byte(out_fd, 'p');
    if (get_byte(in_fd) != 'x')
        return 56;
    kvvm_close(kv);
    return 0;
}

Test(pending, a_failed_wait_for_the_device_work_drops_the_entries)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "4M");
    int op[2], ip[2];
    cr_assert_eq(pipe2(op, O_CLOEXEC), 0);
    cr_assert_eq(pipe2(ip, O_CLOEXEC), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(op[0]);
        close(ip[1]);
        _exit(failed_waiter(d.path, op[1], ip[0]));
    }
    close(op[1]);
    close(ip[0]);
    struct sharer_proc p = { pid, op[0], ip[1] };
    cr_assert_eq(get_byte(p.out), 'p', "published and synced (else its exit code names the "
                 "check)");
    cr_expect_eq(run_attacher(d.path, 0, 0), 0, "never seen (its exit code names the check)");
    int ctl = control(d.path);
    cr_expect_eq(pc_info(ctl).shared_entries, 0u, "the daemon dropped them");
    close(ctl);
    put_byte(p.in, 'x');
    sharer_end(&p, 0);
    pd_stop(&d);
}

/* ---- the daemon's side, on the raw protocol ---------------------------------------------- */

static void raw_pub(int fd, uint8_t key, uint64_t id, uint64_t serial)
{
    struct pool_prefix_publish m = { .lay = raw_lay, .ns = 3, .total = 1, .n = 1, .last = 1,
                                     .serial = serial, .ids = { id } };
    pool_proto_hdr(&m.h, POOL_MSG_PREFIX_PUBLISH);
    m.key[0] = key;
    cr_assert_eq(pool_proto_send(fd, &m, NULL, 0, 0), 0);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    cr_assert_eq(pc_recv(fd, buf, NULL, NULL), POOL_MSG_RESULT);
    cr_assert_eq(((const struct pool_result *)buf)->err, 1, "one new entry");
}

/* READY of serial; returns the daemon's count of the shares it named. */
static int32_t raw_ready(int fd, uint64_t serial, bool ok)
{
    struct pool_ready m = { .serial = serial, .ok = ok };
    pool_proto_hdr(&m.h, POOL_MSG_READY);
    cr_assert_eq(pool_proto_send(fd, &m, NULL, 0, 0), 0);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    cr_assert_eq(pc_recv(fd, buf, NULL, NULL), POOL_MSG_RESULT);
    return ((const struct pool_result *)buf)->err;
}

static uint32_t raw_found(int fd, uint8_t key, unsigned type)
{
    struct pool_prefix_keys m = { .lay = raw_lay, .ns = 3, .n = 1 };
    pool_proto_hdr(&m.h, type);
    m.keys[0][0] = key;
    cr_assert_eq(pool_proto_send(fd, &m, NULL, 0, 0), 0);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    cr_assert_eq(pc_recv(fd, buf, NULL, NULL), POOL_MSG_PREFIX_FOUND);
    uint32_t found = ((const struct pool_prefix_found *)buf)->found;
    for (uint32_t i = 0; type == POOL_MSG_PREFIX_ATTACH && i < found; i++) {
        int fds[POOL_BATCH_MAX], nf = 0;
        cr_assert_eq(pc_recv(fd, buf, fds, &nf), POOL_MSG_FRAMES);
        for (int k = 0; k < nf; k++)
            close(fds[k]);
    }
    return found;
}

/* Sends an IMPORT of token that waits up to wait_ms for a pending export. */
static void raw_import_send(int fd, const uint8_t *token, uint32_t wait_ms)
{
    struct pool_import m = { .lay = raw_lay, .wait_ms = wait_ms };
    pool_proto_hdr(&m.h, POOL_MSG_IMPORT);
    memcpy(m.token, token, POOL_TOKEN_BYTES);
    cr_assert_eq(pool_proto_send(fd, &m, NULL, 0, 0), 0);
}

/* Its answer: 0 (then the frames are read, their descriptors closed, and the import ended
   ok: the token spent) or the daemon's -errno. */
static int32_t raw_import_answer(int fd)
{
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    cr_assert_eq(pc_recv(fd, buf, NULL, NULL), POOL_MSG_IMPORTED);
    struct pool_imported r;
    memcpy(&r, buf, sizeof r);
    for (uint32_t got = 0; !r.err && got < r.total;) {
        int fds[POOL_BATCH_MAX], nf = 0;
        cr_assert_eq(pc_recv(fd, buf, fds, &nf), POOL_MSG_FRAMES);
        for (int k = 0; k < nf; k++)
            close(fds[k]);
        got += (uint32_t)nf;
    }
    return r.err;
}

static int32_t raw_import(int fd, const uint8_t *token, uint32_t wait_ms)
{
    raw_import_send(fd, token, wait_ms);
    return raw_import_answer(fd);
}

static struct pool_exported raw_export_pending(int fd, uint64_t id, uint64_t serial)
{
    struct pool_export m = { .total = 1, .n = 1, .length = 16, .serial = serial,
                             .lay = raw_lay, .ids = { id } };
    pool_proto_hdr(&m.h, POOL_MSG_EXPORT);
    cr_assert_eq(pool_proto_send(fd, &m, NULL, 0, 0), 0);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    cr_assert_eq(pc_recv(fd, buf, NULL, NULL), POOL_MSG_EXPORTED);
    struct pool_exported x;
    memcpy(&x, buf, sizeof x);
    cr_assert_eq(x.err, 0, "%s", x.text);
    return x;
}

/* A pending entry is a miss for lookups and attaches until READY names its serial; READY
   ok 0 drops it; an IMPORT of a pending export is -EAGAIN at once (wait_ms 0) or at its
   deadline, spending nothing, and one waiting when the READY comes gets the export; a
   publisher that goes before READY takes its pending entry and export along (an import
   waiting for that export: -ENOENT). */
Test(pending, raw_pending_shares_are_invisible_until_ready)
{
    TH_DEADLINE(60);
    struct pd d;
    pd_start(&d, "4M");
    int a = pc_client(d.path, "publisher"), b = pc_client(d.path, "looker");
    int ctl = control(d.path);
    uint64_t ids[5];
    int fds[5];
    cr_assert_eq(pc_lease(a, 5, ids, fds, NULL), 5u);
    for (int i = 0; i < 5; i++)
        close(fds[i]);
    raw_pub(a, 'a', ids[0], 5);
    cr_expect_eq(raw_found(b, 'a', POOL_MSG_PREFIX_LOOKUP), 0u, "pending: a lookup misses");
    cr_expect_eq(raw_found(b, 'a', POOL_MSG_PREFIX_ATTACH), 0u, "pending: an attach misses");
    cr_expect_eq(raw_ready(a, 4, true), 0, "another serial names nothing");
    cr_expect_eq(raw_found(b, 'a', POOL_MSG_PREFIX_LOOKUP), 0u);
    cr_expect_eq(raw_ready(a, 5, true), 1);
    cr_expect_eq(raw_found(b, 'a', POOL_MSG_PREFIX_LOOKUP), 1u, "READY: found");
    raw_pub(a, 'b', ids[1], 6);
    cr_expect_eq(raw_ready(a, 6, false), 1);
    cr_expect_eq(raw_found(b, 'b', POOL_MSG_PREFIX_LOOKUP), 0u, "READY ok 0: dropped");
    cr_expect_eq(pc_info(b).shared_entries, 1u);
    /* an export that becomes ready while an import waits for it */
    struct pool_exported y = raw_export_pending(a, ids[4], 9);
    cr_expect_eq(raw_import(b, y.token, 0), -EAGAIN, "pending: -EAGAIN at once");
    cr_expect_eq(raw_import(b, y.token, 1), -EAGAIN, "pending past the deadline: -EAGAIN");
    raw_import_send(b, y.token, 60000);
    (void)pc_info(ctl);             /* b's IMPORT, sent before, is handled by now */
    cr_expect_eq(raw_ready(a, 9, true), 1);
    cr_expect_eq(raw_import_answer(b), 0, "the waiting import got the export at its READY");
    struct pool_import_end e = { .ok = 1 };
    pool_proto_hdr(&e.h, POOL_MSG_IMPORT_END);
    memcpy(e.token, y.token, sizeof e.token);
    cr_assert_eq(pool_proto_send(b, &e, NULL, 0, 0), 0);
    pc_return(b, ids + 4, 1);       /* b's mapping of it given up */
    /* pending when their publisher goes */
    raw_pub(a, 'c', ids[2], 7);
    struct pool_exported x = raw_export_pending(a, ids[3], 8);
    cr_expect_eq(raw_import(b, x.token, 0), -EAGAIN, "and spent nothing");
    raw_import_send(b, x.token, 60000);
    (void)pc_info(ctl);
    close(a);
    cr_expect_eq(raw_import_answer(b), -ENOENT, "the export it waited for went");
    while (pc_info(ctl).n_clients != 1)             /* a's death handled (each a round trip) */
        sched_yield();
    cr_expect_eq(raw_found(b, 'c', POOL_MSG_PREFIX_LOOKUP), 0u, "its pending entry went");
    cr_expect_eq(raw_import(b, x.token, 0), -ENOENT, "its pending export went");
    struct pool_figures f = pc_info(b);
    cr_expect_eq(f.shared_entries, 1u, "the READY entry stays");
    cr_expect_eq(f.free_bytes, f.pool_bytes - (uint64_t)PD_GRAN, "only its frame is held");
    close(b);
    close(ctl);
    pd_stop(&d);
}
