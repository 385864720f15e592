/* tests/test_handoff.c: sequence hand-off between processes through a real kvvmd
   (tests/pool_daemon.h): kvvm_seq_export in one process, kvvm_seq_import in another, the
   bytes equal and nothing copied (bytes_to_device, held_bytes unchanged), copy on write on
   every side (a write in one process never seen in another), an export surviving its
   exporter's exit and SIGKILL, tokens spent, forged, of another layout, dropped, the
   daemon dropping an unimported export before a take-back, stream mode (bytes written
   after the export are never seen), held frames (an import by the client that holds the
   frames imports nothing: pool/protocol.h "Held frames"), and the pool whole again once
   everyone exited. */
#include <sched.h>
#include "harness.h"
#include "pool_daemon.h"
#include "pool_share.h"

#define LEN  (5 * TPP + 7)              /* 5 full pages and a partial one, per region */

static uint64_t held(kvvm *kv)
{
    struct kvvm_pool_info pi = { .size = sizeof pi };
    return kvvm_pool_info(kv, &pi) ? UINT64_MAX : pi.held_bytes;
}

/* ---- the exporter: a process that makes a sequence, exports it ntok times, sends each
   token on tok_fd, then waits for a byte on go_fd ('c': check its own bytes are still the
   pattern, 'x': just exit) before closing. free_first: frees s and closes before sending
   (the exports outlive it). stream: runs on an engine stream, and right after the exports
   overwrites page 0 and grows into the partial page with other bytes (never seen through
   the exports). Its exit code names the failed check. */
struct exp_args {
    unsigned char pat;
    int ntok;
    bool free_first, stream;
};

static int exporter(const char *path, struct exp_args a, int tok_fd, int go_fd)
{
    struct kvvm_config c;
    cfg(&c, path, "exporter", BPT);
    kvvm *kv = NULL;
    kvvm_seq s;
    if (kvvm_open(&c, &kv))
        return 10;
    void *st = NULL;
    if (a.stream && (kvvm_stream_create(kv, &st) || kvvm_set_stream(kv, st)))
        return 11;
    if (kvvm_seq_create(kv, &s) || kvvm_seq_grow(kv, s, LEN) || fill(kv, s, LEN, a.pat))
        return 12;
    kvvm_handoff t[4];
    for (int k = 0; k < a.ntok; k++)
        if (kvvm_seq_export(kv, s, &t[k]))
            return 13;
    if (STAT(kv, exports) != (uint64_t)a.ntok)
        return 14;
    if (a.stream) {                     /* written after the export: never seen through it */
        if (kvvm_seq_grow(kv, s, LEN + 5) || fill(kv, s, LEN + 5, (unsigned char)(a.pat ^ 0x5a)))
            return 15;
        if (kvvm_sync(kv) || check(kv, s, LEN + 5, (unsigned char)(a.pat ^ 0x5a)))
            return 16;
    }
    if (a.free_first) {
        if (kvvm_seq_free(kv, s))
            return 17;
        kvvm_close(kv);
        kv = NULL;
    }
    for (int k = 0; k < a.ntok; k++)
        if (write(tok_fd, &t[k], sizeof t[k]) != (ssize_t)sizeof t[k])
            return 18;
    char go = get_byte(go_fd);
    if (go == 'c' && (a.free_first || check(kv, s, LEN, a.pat)))
        return 19;                      /* its own pages: the importers' writes unseen */
    if (kv)
        kvvm_close(kv);
    return 0;
}

struct exp_proc {
    pid_t pid;
    int tok, go;                        /* the parent's ends */
};

static struct exp_proc exp_start(const char *path, struct exp_args a, kvvm_handoff *t)
{
    int tp[2], gp[2];
    cr_assert_eq(pipe2(tp, O_CLOEXEC), 0);
    cr_assert_eq(pipe2(gp, O_CLOEXEC), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(tp[0]);
        close(gp[1]);
        _exit(exporter(path, a, tp[1], gp[0]));
    }
    close(tp[1]);
    close(gp[0]);
    for (int k = 0; k < a.ntok; k++)
        cr_assert_eq(read(tp[0], &t[k], sizeof t[k]), (ssize_t)sizeof t[k],
                     "the exporter sent its token %d (else its exit code names the check)", k);
    return (struct exp_proc){ pid, tp[0], gp[1] };
}

static void exp_finish(struct exp_proc *e, char go)
{
    put_byte(e->go, go);
    cr_expect_eq(pd_wait(e->pid), 0, "the exporter: its exit code names the check");
    close(e->tok);
    close(e->go);
}

/* ---- an importer: imports t, checks length and bytes (pat) with nothing copied, the
   token spent after; then writes (wpat) over page 0 of region 0 (its own copy from then:
   it reads its write back). */
static int importer(const char *path, const kvvm_handoff *t, unsigned char pat,
                    unsigned char wpat)
{
    struct kvvm_config c;
    cfg(&c, path, "importer", BPT);
    c.pool_thread = 0;                  /* no lease ahead in the background: held_bytes
                                           moves only with this thread's calls */
    kvvm *kv = NULL;
    if (kvvm_open(&c, &kv))
        return 30;
    uint64_t to_dev = STAT(kv, bytes_to_device), h0 = held(kv);
    kvvm_seq s, s2;
    if (kvvm_seq_import(kv, t, &s))
        return 31;
    struct kvvm_seq_info si = { .size = sizeof si };
    if (kvvm_seq_info(kv, s, &si) || si.length != LEN)
        return 32;
    if (STAT(kv, bytes_to_device) != to_dev || held(kv) != h0)
        return 33;                      /* no copy; the frames are not leased to it */
    if (STAT(kv, imports) != 1)
        return 34;
    if (check(kv, s, LEN, pat))
        return 35;
    if (kvvm_seq_import(kv, t, &s2) != -ENOENT || !*kvvm_last_error())
        return 36;                      /* once */
    /* prepare_write copies too: the pages it covers are this process's own after it */
    struct kvvm_seq_info s0 = { .size = sizeof s0 }, s1 = { .size = sizeof s1 };
    if (kvvm_seq_info(kv, s, &s0) || s0.pages_shared != s0.pages_device ||
        kvvm_seq_prepare_write(kv, s, TPP, 2 * TPP) || kvvm_seq_info(kv, s, &s1) ||
        s1.pages_shared != s0.pages_shared - NREG || check(kv, s, LEN, pat))
        return 41;
    if (wpat) {
        unsigned char b[PD_GRAN], r[PD_GRAN];
        memset(b, wpat, sizeof b);
        if (kvvm_seq_write(kv, s, 0, 0, b, sizeof b) || kvvm_seq_read(kv, s, 0, 0, r, sizeof r))
            return 37;
        if (memcmp(b, r, sizeof b) != 0)
            return 38;
        /* the partial page too: a grow into it copies first */
        if (kvvm_seq_grow(kv, s, LEN + 3) || kvvm_seq_write(kv, s, 1, (LEN - 1) * BPT, b, 4 * BPT))
            return 39;
    }
    if (kvvm_seq_free(kv, s))
        return 40;
    kvvm_close(kv);
    return 0;
}

static pid_t imp_start(const char *path, const kvvm_handoff *t, unsigned char pat,
                       unsigned char wpat)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0)
        _exit(importer(path, t, pat, wpat));
    return pid;
}

/* Polls (each INFO a round trip, no sleep) until the pool is whole and clientless: every
   frame back exactly, no record left. */
static void wait_pool_whole(const char *path)
{
    int ctl = control(path);
    for (;;) {
        struct pool_figures f = pc_info(ctl);
        if (f.free_bytes == f.pool_bytes && f.n_clients == 0)
            break;
        sched_yield();
    }
    close(ctl);
}

Test(handoff, export_import_across_processes_without_a_copy)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "4M");
    kvvm_handoff t;
    struct exp_proc e = exp_start(d.path, (struct exp_args){ .pat = 0x21, .ntok = 1 }, &t);
    pid_t b = imp_start(d.path, &t, 0x21, 0xb0);
    cr_expect_eq(pd_wait(b), 0, "the importer: its exit code names the check");
    exp_finish(&e, 'c');                /* the importer's writes: not in the exporter's pages */
    wait_pool_whole(d.path);
    pd_stop(&d);
}

Test(handoff, three_processes_copy_on_write)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "4M");
    kvvm_handoff t[2];
    struct exp_proc e = exp_start(d.path, (struct exp_args){ .pat = 0x33, .ntok = 2 }, t);
    pid_t b = imp_start(d.path, &t[0], 0x33, 0xbb);   /* B writes into the shared pages */
    cr_expect_eq(pd_wait(b), 0, "importer B: its exit code names the check");
    pid_t c = imp_start(d.path, &t[1], 0x33, 0);      /* C still reads A's bytes */
    cr_expect_eq(pd_wait(c), 0, "importer C: its exit code names the check");
    exp_finish(&e, 'c');
    wait_pool_whole(d.path);
    pd_stop(&d);
}

Test(handoff, export_survives_its_exporters_sigkill)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "4M");
    kvvm_handoff t;
    struct exp_proc e = exp_start(d.path, (struct exp_args){ .pat = 0x44, .ntok = 1 }, &t);
    cr_assert_eq(kill(e.pid, SIGKILL), 0);
    cr_expect_eq(pd_wait(e.pid), 128 + SIGKILL);
    close(e.tok);
    close(e.go);
    pid_t b = imp_start(d.path, &t, 0x44, 0x99);
    cr_expect_eq(pd_wait(b), 0, "the importer: its exit code names the check");
    wait_pool_whole(d.path);
    pd_stop(&d);
}

/* In its own process: forged, other layout (nothing spent), spent, dropped tokens. */
static int tokens(const char *path, const kvvm_handoff *t)
{
    struct kvvm_config c, c2;
    cfg(&c, path, "tokens", BPT);
    cfg(&c2, path, "other-layout", BPT / 2);
    kvvm *kv = NULL, *kv2 = NULL;
    kvvm_seq s;
    if (kvvm_open(&c, &kv) || kvvm_open(&c2, &kv2))
        return 50;
    kvvm_handoff f = t[0];
    f.bytes[17] ^= 1;
    if (kvvm_seq_import(kv, &f, &s) != -ENOENT || !strstr(kvvm_last_error(), "token"))
        return 51;
    if (kvvm_seq_import(kv2, &t[0], &s) != -EINVAL || !strstr(kvvm_last_error(), "layout"))
        return 52;
    if (kvvm_seq_import(kv, &t[0], &s) || check(kv, s, LEN, 0x55))
        return 53;                      /* the refused imports spent nothing */
    if (kvvm_seq_import(kv, &t[0], &s) != -ENOENT)
        return 54;
    if (kvvm_handoff_drop(kv, &t[1]))
        return 55;
    if (kvvm_seq_import(kv, &t[1], &s) != -ENOENT || kvvm_handoff_drop(kv, &t[1]) != -ENOENT)
        return 56;
    kvvm_close(kv2);
    kvvm_close(kv);
    return 0;
}

Test(handoff, forged_spent_other_layout_and_dropped_tokens)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "4M");
    kvvm_handoff t[2];
    /* the exporter frees its sequence and closes first: the exports outlive both */
    struct exp_proc e = exp_start(d.path, (struct exp_args){ .pat = 0x55, .ntok = 2,
                                                             .free_first = true }, t);
    pid_t p = fork();
    cr_assert_geq(p, 0);
    if (p == 0)
        _exit(tokens(d.path, t));
    cr_expect_eq(pd_wait(p), 0, "its exit code names the check");
    exp_finish(&e, 'x');
    wait_pool_whole(d.path);
    pd_stop(&d);
}

Test(handoff, stream_mode_bytes_written_after_the_export_never_seen)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "4M");
    kvvm_handoff t;
    struct exp_proc e = exp_start(d.path, (struct exp_args){ .pat = 0x66, .ntok = 1,
                                                             .stream = true }, &t);
    pid_t b = imp_start(d.path, &t, 0x66, 0);
    cr_expect_eq(pd_wait(b), 0, "the importer: its exit code names the check");
    exp_finish(&e, 'x');
    wait_pool_whole(d.path);
    pd_stop(&d);
}

/* A client that needs more than is free once the exporter left: the daemon drops the
   unimported export (its frames) rather than fail or ask anyone. */
static int needy(const char *path, uint64_t pages)
{
    struct kvvm_config c;
    cfg(&c, path, "needy", BPT);
    c.device_budget = 0;                /* the whole pool */
    c.max_tokens = 64 * TPP;
    kvvm *kv = NULL;
    kvvm_seq s;
    if (kvvm_open(&c, &kv))
        return 60;
    if (kvvm_seq_create(kv, &s) || kvvm_seq_grow(kv, s, pages * TPP))
        return 61;
    kvvm_close(kv);
    return 0;
}

Test(handoff, unimported_export_dropped_under_pressure)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "1M");                 /* 16 frames; the export holds 12 */
    kvvm_handoff t;
    struct exp_proc e = exp_start(d.path, (struct exp_args){ .pat = 0x77, .ntok = 1,
                                                             .free_first = true }, &t);
    exp_finish(&e, 'x');
    pid_t p = fork();
    cr_assert_geq(p, 0);
    if (p == 0)
        _exit(needy(d.path, 7));        /* 14 frames: only with the export's */
    cr_expect_eq(pd_wait(p), 0, "its exit code names the check");
    p = fork();
    cr_assert_geq(p, 0);
    if (p == 0) {
        struct kvvm_config c;
        cfg(&c, d.path, "late", BPT);
        kvvm *kv = NULL;
        kvvm_seq s;
        if (kvvm_open(&c, &kv))
            _exit(70);
        _exit(kvvm_seq_import(kv, &t, &s) == -ENOENT ? 0 : 71);
    }
    cr_expect_eq(pd_wait(p), 0, "the dropped export's import: -ENOENT");
    wait_pool_whole(d.path);
    pd_stop(&d);
}

Test(handoff, needs_a_pool)
{
    TH_DEADLINE(60);
    struct kvvm_config c;
    th_config(&c, (size_t)PD_GRAN, NREG, BPT, 4, 256, 16, 0, 0);
    kvvm *kv = th_open(&c);
    kvvm_seq s;
    kvvm_handoff t = { { 0 } };
    cr_assert_eq(kvvm_seq_create(kv, &s), 0);
    cr_assert_eq(kvvm_seq_grow(kv, s, 20), 0);
    cr_expect_eq(kvvm_seq_export(kv, s, &t), -EOPNOTSUPP);
    cr_expect(strstr(kvvm_last_error(), "pool_socket"), "%s", kvvm_last_error());
    cr_expect_eq(kvvm_seq_import(kv, &t, &s), -EOPNOTSUPP);
    cr_expect_eq(kvvm_handoff_drop(kv, &t), -EOPNOTSUPP);
    cr_expect_eq(kvvm_seq_export(kv, s, NULL), -EINVAL);
    kvvm_close(kv);
}

/* An importer that swaps its imported sequence out gives the frames up (the daemon frees
   them: nobody else holds them), and swaps it back in with every byte. */
static int swapper(const char *path, const kvvm_handoff *t, unsigned char pat)
{
    struct kvvm_config c;
    cfg(&c, path, "swapper", BPT);
    c.host_budget = 32 * (size_t)PD_GRAN;
    kvvm *kv = NULL;
    kvvm_seq s;
    if (kvvm_open(&c, &kv))
        return 80;
    if (kvvm_seq_import(kv, t, &s) || check(kv, s, LEN, pat))
        return 81;
    struct kvvm_pool_info pi = { .size = sizeof pi };
    if (kvvm_pool_info(kv, &pi) || pi.free_bytes + pi.held_bytes >= pi.pool_bytes)
        return 82;                      /* the imported frames: neither free nor ours */
    if (kvvm_seq_swap_out(kv, s) || kvvm_sync(kv))
        return 83;
    if (kvvm_pool_info(kv, &pi) || pi.free_bytes + pi.held_bytes != pi.pool_bytes)
        return 84;                      /* given up: free again, exactly */
    if (kvvm_seq_swap_in(kv, s) || check(kv, s, LEN, pat))
        return 85;
    kvvm_close(kv);
    return 0;
}

Test(handoff, imported_pages_swapped_out_give_their_frames_up)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "4M");
    kvvm_handoff t;
    struct exp_proc e = exp_start(d.path, (struct exp_args){ .pat = 0x88, .ntok = 1,
                                                             .free_first = true }, &t);
    exp_finish(&e, 'x');
    pid_t p = fork();
    cr_assert_geq(p, 0);
    if (p == 0)
        _exit(swapper(d.path, &t, 0x88));
    cr_expect_eq(pd_wait(p), 0, "its exit code names the check");
    wait_pool_whole(d.path);
    pd_stop(&d);
}

/* ---- ordering: an export's bytes are those of the device work before it, waited for off
   the engine's thread: tests/test_share_pending.c (the test that stood here required the
   export itself to synchronize the engine stream, the defect of issue 35). */

/* ---- the protocol, raw: a client cannot export a frame it neither leased nor maps, nor
   end an import it did not start; either drops only that client. A raw export and import
   hand the frames over (descriptors of the same allocation). */
Test(handoff, hostile_handoff_messages_drop_only_their_sender)
{
    TH_DEADLINE(60);
    struct pd d;
    pd_start(&d, "4M");
    int a = pc_client(d.path, "owner");
    uint64_t ids[2];
    int fds[2];
    cr_assert_eq(pc_lease(a, 2, ids, fds, NULL), 2u);
    close(fds[0]);
    close(fds[1]);
    int b = pc_client(d.path, "thief");             /* exports a frame of another client */
    raw_export(b, ids, 1, NULL);
    cr_expect(pc_dropped(b), "an export of a frame it does not hold drops it");
    close(b);
    int e = pc_client(d.path, "stranger");          /* ends an import it never started */
    struct pool_import_end ie = { .ok = 1 };
    pool_proto_hdr(&ie.h, POOL_MSG_IMPORT_END);
    cr_assert_eq(pool_proto_send(e, &ie, NULL, 0, 0), 0);
    cr_expect(pc_dropped(e), "an IMPORT_END of no import drops it");
    close(e);
    struct pool_exported x;                         /* the owner is unaffected */
    raw_export(a, ids, 2, &x);
    cr_assert_eq(x.err, 0, "%s", x.text);
    int c = pc_client(d.path, "importer");
    struct pool_import im = { .lay = { .n_regions = 1, .bytes_per_token = BPT,
                                       .page_size = PD_GRAN } };
    pool_proto_hdr(&im.h, POOL_MSG_IMPORT);
    memcpy(im.token, x.token, sizeof im.token);
    cr_assert_eq(pool_proto_send(c, &im, NULL, 0, 0), 0);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    cr_assert_eq(pc_recv(c, buf, NULL, NULL), POOL_MSG_IMPORTED);
    const struct pool_imported *r = (const void *)buf;
    cr_assert_eq(r->err, 0, "%s", r->text);
    cr_expect_eq(r->total, 2u);
    cr_expect_eq(r->length, 32u);
    int nf = 0;
    cr_assert_eq(pc_recv(c, buf, fds, &nf), POOL_MSG_FRAMES);
    cr_expect_eq(nf, 2);
    for (int i = 0; i < nf; i++)
        close(fds[i]);
    /* the owner gives its lease up; the importer holds them; it dies: all free */
    pc_return(a, ids, 2);
    struct pool_figures f = pc_info(a);
    cr_expect_eq(f.free_bytes, f.pool_bytes - 2 * PD_GRAN, "the importer's mappings hold them");
    close(c);                                       /* dies mid-import: importable again */
    int c2 = pc_client(d.path, "importer2");
    cr_assert_eq(pool_proto_send(c2, &im, NULL, 0, 0), 0);
    cr_assert_eq(pc_recv(c2, buf, NULL, NULL), POOL_MSG_IMPORTED);
    cr_expect_eq(((const struct pool_imported *)buf)->err, 0, "an importer's death gives "
                 "the export back");
    cr_assert_eq(pc_recv(c2, buf, fds, &nf), POOL_MSG_FRAMES);
    for (int i = 0; i < nf; i++)
        close(fds[i]);
    ie.ok = 1;
    memcpy(ie.token, x.token, sizeof ie.token);
    cr_assert_eq(pool_proto_send(c2, &ie, NULL, 0, 0), 0);   /* spent */
    close(c2);                                      /* its mappings go with it */
    for (;;) {
        f = pc_info(a);
        if (f.free_bytes == f.pool_bytes)
            break;
        sched_yield();
    }
    close(a);
    pd_stop(&d);
}

/* An import that cannot fit the importer's budget fails -ENOMEM having changed nothing:
   no sequence, its frames given back, and the export still importable by another. */
static int too_small(const char *path, const kvvm_handoff *t)
{
    struct kvvm_config c;
    cfg(&c, path, "small", BPT);
    c.device_budget = 4 * (size_t)PD_GRAN;          /* the export is 12 frames */
    c.pool_thread = 0;
    kvvm *kv = NULL;
    kvvm_seq s = 0;
    if (kvvm_open(&c, &kv))
        return 110;
    uint64_t h0 = held(kv);
    if (kvvm_seq_import(kv, t, &s) != -ENOMEM || !*kvvm_last_error())
        return 111;
    if (STAT(kv, imports) != 0 || held(kv) > h0)
        return 112;
    for (int i = 0; i < 4; i++)         /* max_seqs: every slot free again */
        if (kvvm_seq_create(kv, &s))
            return 113;
    kvvm_close(kv);
    return 0;
}

Test(handoff, import_past_the_budget_changes_nothing)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "4M");
    kvvm_handoff t;
    struct exp_proc e = exp_start(d.path, (struct exp_args){ .pat = 0xa1, .ntok = 1,
                                                             .free_first = true }, &t);
    exp_finish(&e, 'x');
    pid_t p = fork();
    cr_assert_geq(p, 0);
    if (p == 0)
        _exit(too_small(d.path, &t));
    cr_expect_eq(pd_wait(p), 0, "its exit code names the check");
    pid_t b = imp_start(d.path, &t, 0xa1, 0);
    cr_expect_eq(pd_wait(b), 0, "the importer after it: its exit code names the check");
    wait_pool_whole(d.path);
    pd_stop(&d);
}

/* ---- held frames (protocol version 4, pool/protocol.h "Held frames"): a client that
   imports frames it holds already (its own export) gets them held: no descriptor, no
   import, no count at the daemon; its handle takes one more local use, and the frame goes
   back with its last use. */

static kvvm *held_open(const char *path, size_t budget)
{
    struct kvvm_config c;
    cfg(&c, path, "held", BPT);
    c.pool_thread = 0;                  /* no lease ahead: the counters move with the calls */
    if (budget)
        c.device_budget = budget;
    kvvm *kv = NULL;
    cr_assert_eq(kvvm_open(&c, &kv), 0, "%s", kvvm_last_error());
    return kv;
}

static kvvm_seq held_seq(kvvm *kv, unsigned char pat)
{
    kvvm_seq s;
    cr_assert_eq(kvvm_seq_create(kv, &s), 0);
    cr_assert_eq(kvvm_seq_grow(kv, s, LEN), 0);
    cr_assert_eq(fill(kv, s, LEN, pat), 0);
    return s;
}

/* Issue 35: the daemon sent a descriptor for every frame of an import, so a client importing
   its own export imported again the 12 frames it holds (12 imports, 12 more handles), the
   measured cost of export + import (6-9x a fork). */
Test(handoff, import_in_exporting_client_imports_nothing)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "4M");
    kvvm *kv = held_open(d.path, 0);
    kvvm_seq s = held_seq(kv, 0x5c), s2;
    kvvm_handoff t;
    cr_assert_eq(kvvm_seq_export(kv, s, &t), 0, "%s", kvvm_last_error());
    struct emu_counters e0 = emu_of(kv);
    struct kvvm_pool_info p0 = pool_info_of(kv);
    uint64_t to_dev = STAT(kv, bytes_to_device);
    cr_assert_eq(kvvm_seq_import(kv, &t, &s2), 0, "%s", kvvm_last_error());
    struct emu_counters e1 = emu_of(kv);
    struct kvvm_pool_info p1 = pool_info_of(kv);
    cr_expect_eq(e1.imports - e0.imports, 0, "frames it holds imported again: %llu",
                 (unsigned long long)(e1.imports - e0.imports));
    cr_expect_eq(e1.imported, e0.imported, "no new handle");
    cr_expect_eq(p1.held_bytes, p0.held_bytes);
    cr_expect_eq(p1.free_bytes, p0.free_bytes);
    cr_expect_eq(STAT(kv, bytes_to_device), to_dev, "no copy");
    cr_expect_eq(STAT(kv, imports), 1);
    cr_expect_eq(check(kv, s2, LEN, 0x5c), 0);
    th_check(kv, "after the import of its own export");
    /* copy on write both ways, in one process: a write to either is unseen in the other */
    unsigned char b[PD_GRAN];
    memset(b, 0xe1, sizeof b);
    cr_assert_eq(kvvm_seq_write(kv, s2, 0, 0, b, sizeof b), 0);
    cr_expect_eq(check(kv, s, LEN, 0x5c), 0, "the importer's write seen by the exporter");
    memset(b, 0xe2, sizeof b);
    cr_assert_eq(kvvm_seq_write(kv, s, 1, PD_GRAN, b, sizeof b), 0);
    unsigned char r[PD_GRAN];
    cr_assert_eq(kvvm_seq_read(kv, s2, 1, PD_GRAN, r, sizeof r), 0);
    for (size_t i = 0; i < sizeof r; i++)
        cr_assert_eq(r[i], pat_at(0x5c, 1, PD_GRAN + i), "the exporter's write seen at %zu", i);
    th_check(kv, "after the writes");
    cr_assert_eq(kvvm_seq_free(kv, s2), 0);
    cr_assert_eq(kvvm_seq_free(kv, s), 0);
    th_check(kv, "after the frees");
    kvvm_close(kv);
    wait_pool_whole(d.path);
    pd_stop(&d);
}

/* A failed import of frames it holds (past its budget) changes nothing: each handle's use
   dropped again, nothing returned to the daemon, the export importable again. */
Test(handoff, failed_import_of_held_frames_changes_nothing)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "4M");
    kvvm *kv = held_open(d.path, 16 * (size_t)PD_GRAN);    /* s: 12 frames; the import 12 */
    kvvm_seq s = held_seq(kv, 0x6d), s2 = 0;
    kvvm_handoff t;
    cr_assert_eq(kvvm_seq_export(kv, s, &t), 0, "%s", kvvm_last_error());
    struct emu_counters e0 = emu_of(kv);
    struct kvvm_pool_info p0 = pool_info_of(kv);
    cr_assert_eq(kvvm_seq_import(kv, &t, &s2), -ENOMEM);
    cr_expect(*kvvm_last_error(), "a failed import says why");
    struct emu_counters e1 = emu_of(kv);
    struct kvvm_pool_info p1 = pool_info_of(kv);
    cr_expect_eq(e1.imports, e0.imports);
    cr_expect_eq(e1.imported, e0.imported);
    cr_expect_eq(p1.held_bytes, p0.held_bytes, "frames returned by the failed import");
    cr_expect_eq(p1.free_bytes, p0.free_bytes);
    cr_expect_eq(STAT(kv, imports), 0);
    cr_expect_eq(check(kv, s, LEN, 0x6d), 0);
    th_check(kv, "after the failed import");
    cr_assert_eq(kvvm_set_budget(kv, 32 * (size_t)PD_GRAN), 0, "%s",
                 kvvm_last_error());
    cr_assert_eq(kvvm_seq_import(kv, &t, &s2), 0, "importable again: %s", kvvm_last_error());
    cr_expect_eq(check(kv, s2, LEN, 0x6d), 0);
    cr_expect_eq(emu_of(kv).imports, e0.imports);
    th_check(kv, "after the import");
    cr_assert_eq(kvvm_seq_free(kv, s), 0);
    cr_assert_eq(kvvm_seq_free(kv, s2), 0);
    kvvm_close(kv);
    wait_pool_whole(d.path);
    pd_stop(&d);
}

/* A held frame's handle serves every local user: the frame stays the client's (and its
   bytes readable) until its last user goes, whichever goes first, and then goes back
   once; a client killed while its frames have several users frees every one. */
Test(handoff, held_frame_lives_until_last_local_user)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "4M");
    /* the client killed at the end, forked before this process opens a context (a child of a
       process that used the driver cannot use it): it opens at 's' */
    int go[2], start[2];
    cr_assert_eq(pipe2(go, O_CLOEXEC), 0);
    cr_assert_eq(pipe2(start, O_CLOEXEC), 0);
    pid_t p = fork();
    cr_assert_geq(p, 0);
    if (p == 0) {                       /* exports, imports: two users of each frame */
        struct kvvm_config c;
        cfg(&c, d.path, "killed", BPT);
        kvvm *k2 = NULL;
        kvvm_seq s, s2;
        kvvm_handoff t;
        close(start[1]);                /* the parent gone, the wait ends */
        close(go[0]);
        if (get_byte(start[0]) != 's' || kvvm_open(&c, &k2) || kvvm_seq_create(k2, &s) ||
            kvvm_seq_grow(k2, s, LEN) || kvvm_seq_export(k2, s, &t) ||
            kvvm_seq_import(k2, &t, &s2))
            _exit(1);
        put_byte(go[1], 'k');
        pause();
        _exit(2);
    }
    close(go[1]);
    close(start[0]);
    kvvm *kv = held_open(d.path, 0);
    for (int round = 0; round < 2; round++) {   /* the exporter's sequence goes first, then
                                                   the importer's */
        kvvm_seq s = held_seq(kv, (unsigned char)(0x70 + round)), s2;
        kvvm_handoff t;
        cr_assert_eq(kvvm_seq_export(kv, s, &t), 0, "%s", kvvm_last_error());
        cr_assert_eq(kvvm_seq_import(kv, &t, &s2), 0, "%s", kvvm_last_error());
        struct kvvm_pool_info p0 = pool_info_of(kv);
        kvvm_seq first = round ? s2 : s, last = round ? s : s2;
        cr_assert_eq(kvvm_seq_free(kv, first), 0);
        struct kvvm_pool_info p1 = pool_info_of(kv);
        cr_expect_eq(p1.held_bytes, p0.held_bytes, "a frame another sequence uses went back");
        cr_expect_eq(p1.free_bytes, p0.free_bytes);
        cr_expect_eq(check(kv, last, LEN, (unsigned char)(0x70 + round)), 0);
        th_check(kv, "one user left");
        cr_assert_eq(kvvm_seq_free(kv, last), 0);
        struct kvvm_pool_info p2 = pool_info_of(kv);
        cr_expect_eq(p2.held_bytes, p0.held_bytes - 12 * PD_GRAN, "its last user gone");
        cr_expect_eq(p2.free_bytes, p0.free_bytes + 12 * PD_GRAN, "every frame free, once");
        th_check(kv, "no user left");
    }
    kvvm_close(kv);
    wait_pool_whole(d.path);
    put_byte(start[1], 's');
    close(start[1]);
    cr_assert_eq(get_byte(go[0]), 'k', "the child imported its export");
    cr_assert_eq(kill(p, SIGKILL), 0);
    cr_expect_eq(pd_wait(p), 128 + SIGKILL);
    close(go[0]);
    wait_pool_whole(d.path);            /* every frame back, exactly */
    pd_stop(&d);
}

/* The daemon's side, raw: an import by the client that leased the frames sends every one
   held (no descriptor, nothing counted); a frame twice in one export goes to another
   importer once with a descriptor and once held, counted once: one RETURN gives it up, a
   second is malformed. */
Test(handoff, raw_frames_a_client_holds_come_held)
{
    TH_DEADLINE(60);
    struct pd d;
    pd_start(&d, "4M");
    int a = pc_client(d.path, "owner");
    uint64_t ids[3];
    int fds[3];
    cr_assert_eq(pc_lease(a, 3, ids, fds, NULL), 3u);
    for (int i = 0; i < 3; i++)
        close(fds[i]);
    struct pool_figures f0 = pc_info(a);
    struct pool_exported x;
    raw_export(a, ids, 3, &x);
    cr_assert_eq(x.err, 0, "%s", x.text);
    struct pool_import im = { .lay = raw_lay };
    pool_proto_hdr(&im.h, POOL_MSG_IMPORT);
    memcpy(im.token, x.token, sizeof im.token);
    cr_assert_eq(pool_proto_send(a, &im, NULL, 0, 0), 0);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    cr_assert_eq(pc_recv(a, buf, NULL, NULL), POOL_MSG_IMPORTED);
    cr_assert_eq(((const struct pool_imported *)buf)->err, 0);
    int nf = -1;
    cr_assert_eq(pc_recv(a, buf, fds, &nf), POOL_MSG_FRAMES);
    const struct pool_frames *fr = (const void *)buf;
    cr_expect_eq(fr->n, 3u);
    cr_expect_eq(fr->held, 7u, "every frame it leased goes held");
    cr_expect_eq(nf, 0, "no descriptor");
    for (unsigned i = 0; i < 3; i++)
        cr_expect_eq(fr->ids[i], ids[i]);
    struct pool_import_end ie = { .ok = 1 };
    pool_proto_hdr(&ie.h, POOL_MSG_IMPORT_END);
    memcpy(ie.token, x.token, sizeof ie.token);
    cr_assert_eq(pool_proto_send(a, &ie, NULL, 0, 0), 0);
    struct pool_figures f1 = pc_info(a);
    cr_expect_eq(f1.held_bytes, f0.held_bytes);
    cr_expect_eq(f1.free_bytes, f0.free_bytes, "nothing counted for the held frames");
    /* one frame twice in one export, imported by another client */
    uint64_t twice[2] = { ids[0], ids[0] };
    raw_export(a, twice, 2, &x);
    cr_assert_eq(x.err, 0, "%s", x.text);
    int b = pc_client(d.path, "importer");
    memcpy(im.token, x.token, sizeof im.token);
    cr_assert_eq(pool_proto_send(b, &im, NULL, 0, 0), 0);
    cr_assert_eq(pc_recv(b, buf, NULL, NULL), POOL_MSG_IMPORTED);
    cr_assert_eq(pc_recv(b, buf, fds, &nf), POOL_MSG_FRAMES);
    fr = (const void *)buf;
    cr_expect_eq(fr->n, 2u);
    cr_expect_eq(fr->held, 2u, "the second time held");
    cr_expect_eq(nf, 1);
    for (int i = 0; i < nf; i++)
        close(fds[i]);
    memcpy(ie.token, x.token, sizeof ie.token);
    cr_assert_eq(pool_proto_send(b, &ie, NULL, 0, 0), 0);
    pc_return(a, ids, 3);               /* the owner lets go: b's one mapping keeps ids[0] */
    cr_expect_eq(pc_info(a).free_bytes, f0.pool_bytes - PD_GRAN);
    pc_return(b, ids, 1);               /* counted once: given up once */
    cr_expect_eq(pc_info(b).free_bytes, f0.pool_bytes);
    pc_return(b, ids, 1);
    cr_expect(pc_dropped(b), "a second RETURN of a frame it mapped once drops it");
    close(b);
    cr_expect_eq(pc_info(a).n_clients, 1u, "the owner is served on");
    close(a);
    pd_stop(&d);
}

/* Issue 35 (stop 41's note): freeing an imported sequence gave each mapped frame up in a
   RETURN of its own, though a RETURN carries POOL_BATCH_MAX ids: 128 messages for this
   128-frame import. kvvm_seq_free (and truncate, discard) hold the RETURNs
   (core_pool_returns_hold): 2 messages. */
Test(handoff, free_of_an_import_gives_its_frames_back_in_batches)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "16M");
    const uint64_t len = 1024;          /* 64 pages a region: 128 frames */
    kvvm *a = held_open(d.path, 160 * (size_t)PD_GRAN);
    kvvm_seq s, im;
    cr_assert_eq(kvvm_seq_create(a, &s), 0);
    cr_assert_eq(kvvm_seq_grow(a, s, len), 0, "%s", kvvm_last_error());
    kvvm_handoff t;
    cr_assert_eq(kvvm_seq_export(a, s, &t), 0, "%s", kvvm_last_error());
    kvvm_close(a);                      /* the export holds the frames */
    kvvm *b = held_open(d.path, 160 * (size_t)PD_GRAN);
    uint64_t i0 = emu_of(b).imported;  /* its leased frames (each an import too) */
    cr_assert_eq(kvvm_seq_import(b, &t, &im), 0, "%s", kvvm_last_error());
    cr_assert_eq(emu_of(b).imported - i0, 2 * len / TPP, "every frame imported");
    uint64_t m0 = kvvm_debug_pool_return_msgs(b);
    cr_assert_eq(kvvm_seq_free(b, im), 0);
    uint64_t m = kvvm_debug_pool_return_msgs(b) - m0;
    cr_expect_eq(m, 2, "128 frames given up in 2 RETURNs of 64: %llu sent",
                 (unsigned long long)m);
    cr_expect_eq(emu_of(b).imported, i0, "every frame of the import released");
    th_check(b, "after the free");
    kvvm_close(b);
    wait_pool_whole(d.path);
    pd_stop(&d);
}

/* The daemon's open descriptors other than sockets (/proc/PID/fd): its frames' and
   exports'. Sockets are left out: a client's or a control connection's socket is closed by
   the daemon when it reads the hang-up, which may come after the client has gone (a
   loaded machine showed 11 against 10 that way). */
static int fd_count(pid_t pid)
{
    char path[64], link[64 + 256 + 2], to[16];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *dir = opendir(path);
    cr_assert(dir, "%s: %s", path, strerror(errno));
    int n = 0;
    for (struct dirent *e; (e = readdir(dir));) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(link, sizeof link, "%s/%s", path, e->d_name);
        ssize_t k = readlink(link, to, sizeof to);  /* "socket:[N]": the start will do */
        n += !(k >= 7 && memcmp(to, "socket:", 7) == 0); /* gone meanwhile: counted */
    }
    closedir(dir);
    return n;
}

/* kvvmd exports each frame once, when it makes it, sends that one descriptor with every
   grant and import of the frame and closes it when the frame dies. So after rounds of
   lease, export, import, free and exit, with the exporter killed by SIGKILL every other
   round, its open descriptors come back to their count at start (no reserve: a dead frame
   is released at once). The emulated device keeps a frame released while an importer
   holds it until its next look: a raw lease of one frame (a cuMemCreate) makes one while
   the count is above the start. */
Test(handoff, daemon_descriptors_back_to_start_after_clients_go)
{
    TH_DEADLINE(180);
    struct pd d;
    snprintf(d.dir, sizeof d.dir, "/tmp/kvvmpool.XXXXXX");
    cr_assert(mkdtemp(d.dir));
    char p[128];
    snprintf(p, sizeof p, "%s/sock", d.dir);
    const char *extra[] = { "--reserve-frames", "0", NULL };
    pd_start_at(&d, p, "4M", extra);
    pd_expect_ready(&d);
    int n0 = fd_count(d.pid);
    for (int r = 0; r < 8; r++) {
        unsigned char pat = (unsigned char)(0x31 + r);
        kvvm_handoff t;
        struct exp_proc e = exp_start(d.path, (struct exp_args){ .pat = pat, .ntok = 1 }, &t);
        if (r & 1) {
            cr_assert_eq(kill(e.pid, SIGKILL), 0);
            cr_expect_eq(pd_wait(e.pid), 128 + SIGKILL);
            close(e.tok);
            close(e.go);
        }
        pid_t b = imp_start(d.path, &t, pat, 0xb0);
        cr_expect_eq(pd_wait(b), 0, "round %d: the importer's exit code names the check", r);
        if (!(r & 1))
            exp_finish(&e, 'c');
        wait_pool_whole(d.path);
    }
    int n = fd_count(d.pid), pokes = 0;
    for (; n != n0 && pokes < 2; pokes++) {     /* one look reaps every frame let go */
        int c = pc_client(d.path, "poke");
        uint64_t id;
        int fd;
        cr_assert_eq(pc_lease(c, 1, &id, &fd, NULL), 1u);
        close(fd);
        close(c);
        wait_pool_whole(d.path);
        n = fd_count(d.pid);
    }
    cr_expect_eq(n, n0, "kvvmd's descriptors: %d at start, %d after 8 rounds (%d looks)", n0,
                 n, pokes);
    pd_stop(&d);
}
