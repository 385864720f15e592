/* tests/test_prefix_pool.c: the daemon's shared prefix index through a real kvvmd
   (tests/pool_daemon.h) and real processes: kvvm_prefix_publish in one process,
   kvvm_prefix_lookup (KVVM_TIER_POOL) and kvvm_prefix_attach in others, every byte equal and
   nothing copied (bytes_to_device unchanged, pool_hit_blocks counted), copy on write (a write
   in one process never seen in another), entries surviving their publisher's exit and SIGKILL,
   namespaces and layouts never crossing, kvvmctl drop NS, unmapped entries reclaimed before a
   take-back and before unimported exports, stream mode (bytes written after the publish never
   seen), blocks attached again while mapped (held frames: nothing imported), an attach with
   a store too (the daemon's blocks first: the store read only for blocks it lacks), an
   attach whose import fails midway (nothing left behind), a publish whose answer was lost
   (through a proxy that swallows it), and the pool whole again once the entries are dropped
   and everyone exited. */
#include <poll.h>
#include <sched.h>
#include "harness.h"
#include "pool_daemon.h"
#include "pool_share.h"
#include "store_server.h"

#define NB   4u                         /* blocks published */

static void keys_of(kvvm_key *k, unsigned char salt)
{
    for (unsigned i = 0; i < NB; i++) {
        memset(&k[i], 0, sizeof k[i]);
        k[i].bytes[0] = 'K';
        k[i].bytes[1] = (uint8_t)i;
        k[i].bytes[2] = salt;
    }
}

/* ---- the publisher: publishes NB blocks of pat under ns (salt: its keys), says 'p' on
   ready_fd, then waits for a byte on go_fd ('c': check its own bytes are still pat; 'x':
   exit). free_first: frees s and closes before saying 'p'. stream: on an engine stream,
   and right after the publish overwrites every block (never seen through the entries). */
struct pub_args {
    unsigned char pat, salt;
    uint64_t ns;
    bool free_first, stream;
    bool churn;                         /* frees s, then a new sequence takes the device
                                           budget: the local entries are reclaimed and their
                                           frames must go back to the daemon, never reused
                                           here with the daemon's entries on them */
    const char *store_url;              /* non-NULL: the blocks go to this store too (its
                                           writes done by the close of free_first) */
};

static int publisher(const char *path, struct pub_args a, int ready_fd, int go_fd)
{
    struct kvvm_config c;
    cfg(&c, path, "publisher", BPT);
    c.store_url = a.store_url;
    if (a.churn)
        c.device_budget = (size_t)(NB + 2) * NREG * PD_GRAN;
    kvvm *kv = NULL;
    kvvm_seq s;
    kvvm_key k[NB];
    keys_of(k, a.salt);
    if (kvvm_open(&c, &kv))
        return 10;
    void *st = NULL;
    if (a.stream && (kvvm_stream_create(kv, &st) || kvvm_set_stream(kv, st)))
        return 11;
    if (kvvm_seq_create(kv, &s) || kvvm_seq_grow(kv, s, NB * TPP) || fill(kv, s, NB * TPP, a.pat))
        return 12;
    if (kvvm_prefix_publish(kv, s, a.ns, k, NB) != (int)NB)
        return 13;
    if (a.stream) {                     /* written after the publish: never seen through it */
        if (fill(kv, s, NB * TPP, (unsigned char)(a.pat ^ 0x5a)) || kvvm_sync(kv) ||
            check(kv, s, NB * TPP, (unsigned char)(a.pat ^ 0x5a)))
            return 14;
    }
    if (a.churn) {
        kvvm_seq s2;
        if (kvvm_seq_free(kv, s) || kvvm_seq_create(kv, &s2) ||
            kvvm_seq_grow(kv, s2, NB * TPP) ||
            fill(kv, s2, NB * TPP, (unsigned char)(a.pat ^ 0x33)) || kvvm_sync(kv))
            return 17;
        if (STAT(kv, prefix_evictions) == 0)
            return 18;                  /* the local entries went for s2 */
        s = s2;
        a.pat ^= 0x33;
    }
    if (a.free_first) {
        if (kvvm_seq_free(kv, s))
            return 15;
        kvvm_close(kv);
        kv = NULL;
    }
    put_byte(ready_fd, 'p');
    char go = get_byte(go_fd);
    unsigned char own = a.stream ? (unsigned char)(a.pat ^ 0x5a) : a.pat;
    if (go == 'c' && (a.free_first || check(kv, s, NB * TPP, own)))
        return 16;                      /* its own pages: the attachers' writes unseen */
    if (kv)
        kvvm_close(kv);
    return 0;
}

struct pub_proc {
    pid_t pid;
    int ready, go;
};

static struct pub_proc pub_start(const char *path, struct pub_args a)
{
    int rp[2], gp[2];
    cr_assert_eq(pipe2(rp, O_CLOEXEC), 0);
    cr_assert_eq(pipe2(gp, O_CLOEXEC), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(rp[0]);
        close(gp[1]);
        _exit(publisher(path, a, rp[1], gp[0]));
    }
    close(rp[1]);
    close(gp[0]);
    cr_assert_eq(get_byte(rp[0]), 'p', "the publisher published (else its exit code names "
                 "the check)");
    return (struct pub_proc){ pid, rp[0], gp[1] };
}

static void pub_finish(struct pub_proc *p, char go)
{
    put_byte(p->go, go);
    cr_expect_eq(pd_wait(p->pid), 0, "the publisher: its exit code names the check");
    close(p->ready);
    close(p->go);
}

/* ---- an attacher: looks up and attaches the NB blocks of salt under ns with layout bpt;
   expect: the blocks it must find (0: none, a miss); with them, every byte is pat, nothing
   copied, pool_hit_blocks counted; then writes wpat over block 0 of region 0 (its own copy:
   read back). */
static int attacher(const char *path, uint64_t ns, unsigned char salt, uint64_t bpt,
                    unsigned expect, unsigned char pat, unsigned char wpat)
{
    struct kvvm_config c;
    cfg(&c, path, "attacher", bpt);
    kvvm *kv = NULL;
    kvvm_key k[NB];
    keys_of(k, salt);
    if (kvvm_open(&c, &kv))
        return 30;
    uint8_t where[NB] = { 0 };
    if (kvvm_prefix_lookup(kv, ns, k, NB, where) != (int)expect)
        return 31;
    for (unsigned i = 0; i < expect; i++)
        if (where[i] != KVVM_TIER_POOL)
            return 32;
    uint64_t to_dev = STAT(kv, bytes_to_device);
    kvvm_seq s;
    if (kvvm_seq_create(kv, &s) || kvvm_prefix_attach(kv, s, ns, k, NB) != (int)expect)
        return 33;
    if (!expect) {
        kvvm_close(kv);
        return 0;
    }
    if (STAT(kv, bytes_to_device) != to_dev)
        return 34;                      /* no copy */
    if (STAT(kv, pool_hit_blocks) != expect)
        return 35;
    if (check(kv, s, expect * TPP, pat))
        return 36;
    if (wpat) {
        unsigned char b[PD_GRAN], r[PD_GRAN];
        memset(b, wpat, sizeof b);
        if (kvvm_seq_write(kv, s, 0, 0, b, sizeof b) || kvvm_seq_read(kv, s, 0, 0, r, sizeof r))
            return 37;
        if (memcmp(b, r, sizeof b) != 0)
            return 38;
    }
    if (kvvm_seq_free(kv, s))
        return 39;
    kvvm_close(kv);
    return 0;
}

/* An attacher forked before the test's process opens a context (a child of a process that
   used the driver cannot use it), run later by att_run (its exit code: attacher's). */
struct att_proc {
    pid_t pid;
    int go;
};

static struct att_proc att_start(const char *path, uint64_t ns, unsigned char salt,
                                 uint64_t bpt, unsigned expect, unsigned char pat,
                                 unsigned char wpat)
{
    int gp[2];
    cr_assert_eq(pipe2(gp, O_CLOEXEC), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(gp[1]);                   /* the test gone, the wait ends */
        _exit(get_byte(gp[0]) == 'a' ? attacher(path, ns, salt, bpt, expect, pat, wpat) : 29);
    }
    close(gp[0]);
    return (struct att_proc){ pid, gp[1] };
}

static int att_run(struct att_proc *a)
{
    put_byte(a->go, 'a');
    close(a->go);
    return pd_wait(a->pid);
}

static int run_attacher(const char *path, uint64_t ns, unsigned char salt, uint64_t bpt,
                        unsigned expect, unsigned char pat, unsigned char wpat)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0)
        _exit(attacher(path, ns, salt, bpt, expect, pat, wpat));
    return pd_wait(pid);
}

static struct pool_figures figures(const char *path)
{
    int ctl = control(path);
    struct pool_figures f = pc_info(ctl);
    close(ctl);
    return f;
}

/* Drops every entry (kvvmctl drop), then polls (each INFO a round trip, no sleep) until the
   pool is whole and clientless: every frame back exactly. */
static void drop_all_and_wait_whole(const char *path)
{
    char out[512];
    cr_expect_eq(pd_ctl(path, "drop", out, sizeof out), 0, "kvvmctl drop: %s", out);
    int ctl = control(path);
    for (;;) {
        struct pool_figures f = pc_info(ctl);
        if (f.free_bytes == f.pool_bytes && f.n_clients == 0 && f.shared_entries == 0)
            break;
        sched_yield();
    }
    close(ctl);
}

Test(prefix_pool, publish_in_a_attach_in_b_without_a_copy_c_reads_as_bytes)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "4M");
    struct pub_proc a = pub_start(d.path, (struct pub_args){ .pat = 0x21, .salt = 1, .ns = 7 });
    struct pool_figures f = figures(d.path);
    cr_expect_eq(f.shared_entries, NB, "kvvmd counts the entries");
    cr_expect_eq(f.shared_bytes, (uint64_t)NB * NREG * PD_GRAN, "and their frames");
    cr_expect_eq(run_attacher(d.path, 7, 1, BPT, NB, 0x21, 0xbb), 0,
                 "attacher B (writes into an attached block): its exit code names the check");
    cr_expect_eq(run_attacher(d.path, 7, 1, BPT, NB, 0x21, 0), 0,
                 "attacher C reads A's bytes: its exit code names the check");
    pub_finish(&a, 'c');                /* B's write: not in A's pages */
    drop_all_and_wait_whole(d.path);
    pd_stop(&d);
}

Test(prefix_pool, entries_survive_their_publishers_sigkill)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "4M");
    struct pub_proc a = pub_start(d.path, (struct pub_args){ .pat = 0x44, .salt = 2, .ns = 1 });
    cr_assert_eq(kill(a.pid, SIGKILL), 0);
    cr_expect_eq(pd_wait(a.pid), 128 + SIGKILL);
    close(a.ready);
    close(a.go);
    cr_expect_eq(run_attacher(d.path, 1, 2, BPT, NB, 0x44, 0xcc), 0, "attacher B");
    cr_expect_eq(run_attacher(d.path, 1, 2, BPT, NB, 0x44, 0), 0, "attacher C");
    drop_all_and_wait_whole(d.path);
    pd_stop(&d);
}

Test(prefix_pool, namespaces_and_layouts_never_cross)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "4M");
    struct pub_proc a = pub_start(d.path, (struct pub_args){ .pat = 0x55, .salt = 3, .ns = 10,
                                                             .free_first = true });
    pub_finish(&a, 'x');
    cr_expect_eq(run_attacher(d.path, 11, 3, BPT, 0, 0, 0), 0, "another namespace: a miss");
    cr_expect_eq(run_attacher(d.path, 10, 4, BPT, 0, 0, 0), 0, "other keys: a miss");
    cr_expect_eq(run_attacher(d.path, 10, 3, 2 * BPT, 0, 0, 0), 0, "another layout: a miss");
    cr_expect_eq(run_attacher(d.path, 10, 3, BPT, NB, 0x55, 0), 0, "the same: a hit");
    drop_all_and_wait_whole(d.path);
    pd_stop(&d);
}

Test(prefix_pool, kvvmctl_drop_ns)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "4M");
    struct pub_proc a = pub_start(d.path, (struct pub_args){ .pat = 0x61, .salt = 5, .ns = 5,
                                                             .free_first = true });
    pub_finish(&a, 'x');
    struct pub_proc b = pub_start(d.path, (struct pub_args){ .pat = 0x62, .salt = 5, .ns = 6,
                                                             .free_first = true });
    pub_finish(&b, 'x');
    cr_expect_eq(figures(d.path).shared_entries, 2 * NB);
    char out[512];
    cr_expect_eq(pd_ctl(d.path, "drop 5", out, sizeof out), 0, "kvvmctl drop 5: %s", out);
    cr_expect(strstr(out, "4 shared prefix entries dropped"), "it says what it dropped: %s",
              out);
    cr_expect_eq(figures(d.path).shared_entries, NB);
    cr_expect_eq(run_attacher(d.path, 5, 5, BPT, 0, 0, 0), 0, "ns 5 dropped: a miss");
    cr_expect_eq(run_attacher(d.path, 6, 5, BPT, NB, 0x62, 0), 0, "ns 6 kept: a hit");
    cr_expect_eq(pd_ctl(d.path, "drop nope", out, sizeof out), 2, "a bad NS: %s", out);
    drop_all_and_wait_whole(d.path);
    pd_stop(&d);
}

/* Grows a sequence of pages pages per region with the whole pool as its limit. */
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
    if (STAT(kv, pool_waits) == UINT64_MAX)
        return 62;
    kvvm_close(kv);
    return 0;
}

Test(prefix_pool, unmapped_entries_reclaimed_under_pressure)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "1M");                 /* 16 frames; the entries hold 8 */
    struct pub_proc a = pub_start(d.path, (struct pub_args){ .pat = 0x77, .salt = 6, .ns = 2,
                                                             .free_first = true });
    pub_finish(&a, 'x');
    cr_expect_eq(figures(d.path).free_bytes, 8u * PD_GRAN, "the entries hold their frames");
    pid_t p = fork();
    cr_assert_geq(p, 0);
    if (p == 0)
        _exit(needy(d.path, 7));        /* 14 frames: only with the entries' */
    cr_expect_eq(pd_wait(p), 0, "its exit code names the check");
    cr_expect_lt(figures(d.path).shared_entries, NB, "entries went for it");
    drop_all_and_wait_whole(d.path);
    pd_stop(&d);
}

Test(prefix_pool, local_entries_reclaimed_give_their_frames_back_not_reused)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "4M");
    struct pub_proc a = pub_start(d.path, (struct pub_args){ .pat = 0x2b, .salt = 8, .ns = 9,
                                                             .churn = true });
    /* regression: a lease of a client short by its own limit (the publisher's batch near
       its device_budget) made kvvmd drop unmapped entries though the pool had room */
    cr_expect_eq(figures(d.path).shared_entries, NB, "no entry dropped for a client's limit");
    int rc = run_attacher(d.path, 9, 8, BPT, NB, 0x2b, 0);
    cr_expect_eq(rc, 0, "the attacher reads the published bytes, not the publisher's later "
                 "ones (exit %d names the check)", rc);
    pub_finish(&a, 'c');
    drop_all_and_wait_whole(d.path);
    pd_stop(&d);
}

Test(prefix_pool, stream_mode_bytes_written_after_the_publish_never_seen)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "4M");
    struct pub_proc a = pub_start(d.path, (struct pub_args){ .pat = 0x19, .salt = 7, .ns = 3,
                                                             .stream = true });
    cr_expect_eq(run_attacher(d.path, 3, 7, BPT, NB, 0x19, 0), 0,
                 "the attacher reads the bytes of the publish, not the later ones");
    pub_finish(&a, 'c');
    drop_all_and_wait_whole(d.path);
    pd_stop(&d);
}

/* ---- the reclaim order, on the raw protocol: a chain's leaves go first ---- */


static uint32_t raw_lookup(int fd, unsigned n)
{
    struct pool_prefix_keys m = { .lay = raw_lay, .ns = 3, .n = n };
    pool_proto_hdr(&m.h, POOL_MSG_PREFIX_LOOKUP);
    for (unsigned i = 0; i < n; i++)
        m.keys[i][0] = (uint8_t)('a' + i);
    cr_assert_eq(pool_proto_send(fd, &m, NULL, 0, 0), 0);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    cr_assert_eq(pc_recv(fd, buf, NULL, NULL), POOL_MSG_PREFIX_FOUND);
    return ((const struct pool_prefix_found *)buf)->found;
}

/* Waits until the daemon lists no client (a closed one's leases gone), polling: each INFO
   is a round trip, no sleep. */
static void wait_no_clients(const char *path)
{
    int ctl = control(path);
    while (pc_info(ctl).n_clients != 0)
        sched_yield();
    close(ctl);
}

/* Client b asks n frames, waiting up to 5 s for a reclaim; returns how many were granted
   (their descriptors closed). */
static uint32_t raw_lease_wait(int b, uint32_t n)
{
    struct pool_lease m = { .n = n, .wait_ms = 5000 };
    pool_proto_hdr(&m.h, POOL_MSG_LEASE);
    cr_assert_eq(pool_proto_send(b, &m, NULL, 0, 0), 0);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    int fds[POOL_BATCH_MAX], nf = 0;
    cr_assert_eq(pc_recv(b, buf, fds, &nf), POOL_MSG_FRAMES);
    for (int i = 0; i < nf; i++)
        close(fds[i]);
    return ((const struct pool_frames *)buf)->n;
}

Test(prefix_pool, reclaim_takes_a_chains_leaves_first)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "1M");                 /* 16 frames */
    int a = pc_client(d.path, "raw-publisher");
    uint64_t ids[POOL_BATCH_MAX];
    int fds[POOL_BATCH_MAX];
    cr_assert_eq(pc_lease(a, 3, ids, fds, NULL), 3);
    for (int i = 0; i < 3; i++)
        close(fds[i]);
    raw_publish(a, 'a', ids[0], false);  /* a chain: a, a+b, a+b+c */
    raw_publish(a, 'b', ids[1], false);
    raw_publish(a, 'c', ids[2], true);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    cr_assert_eq(pc_recv(a, buf, NULL, NULL), POOL_MSG_RESULT);
    cr_expect_eq(((const struct pool_result *)buf)->err, 3, "three entries made");
    close(a);                           /* its leases go; the entries keep the frames (no
                                           lookup before: the publish's own order counts) */
    wait_no_clients(d.path);
    int b = pc_client(d.path, "raw-needy");
    cr_expect_eq(raw_lease_wait(b, 14), 14, "granted after one entry went (13 free)");
    cr_expect_eq(raw_lookup(b, 3), 2, "the chain's leaf went first: its root and middle stay");
    close(b);
    drop_all_and_wait_whole(d.path);
    pd_stop(&d);
}

/* The daemon's order when the pool is short: shared entries no client maps go before
   unimported exports, though the export here is the older record. */
Test(prefix_pool, unmapped_entries_go_before_unimported_exports)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "1M");                 /* 16 frames */
    int a = pc_client(d.path, "raw-sharer");
    uint64_t ids[POOL_BATCH_MAX];
    int fds[POOL_BATCH_MAX];
    cr_assert_eq(pc_lease(a, 2, ids, fds, NULL), 2);
    close(fds[0]);
    close(fds[1]);
    struct pool_exported x;
    raw_export(a, &ids[1], 1, &x);      /* the export first: the older record */
    cr_assert_eq(x.err, 0, "%s", x.text);
    raw_publish(a, 'a', ids[0], true);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    cr_assert_eq(pc_recv(a, buf, NULL, NULL), POOL_MSG_RESULT);
    cr_expect_eq(((const struct pool_result *)buf)->err, 1, "one entry made");
    close(a);                           /* its leases go; the entry and the export hold one
                                           frame each */
    wait_no_clients(d.path);
    int b = pc_client(d.path, "raw-needy");
    cr_expect_eq(raw_lease_wait(b, 15), 15, "granted after one record went (14 free)");
    cr_expect_eq(raw_lookup(b, 1), 0, "the unmapped entry went");
    int c = pc_client(d.path, "raw-importer");
    struct pool_import im = { .lay = raw_lay };
    pool_proto_hdr(&im.h, POOL_MSG_IMPORT);
    memcpy(im.token, x.token, sizeof im.token);
    cr_assert_eq(pool_proto_send(c, &im, NULL, 0, 0), 0);
    cr_assert_eq(pc_recv(c, buf, NULL, NULL), POOL_MSG_IMPORTED);
    cr_expect_eq(((const struct pool_imported *)buf)->err, 0, "the unimported export stayed: %s",
                 ((const struct pool_imported *)buf)->text);
    if (((const struct pool_imported *)buf)->err == 0) {
        int nf = 0;
        cr_assert_eq(pc_recv(c, buf, fds, &nf), POOL_MSG_FRAMES);
        for (int i = 0; i < nf; i++)
            close(fds[i]);
        struct pool_import_end ie = { .ok = 1 };
        pool_proto_hdr(&ie.h, POOL_MSG_IMPORT_END);
        memcpy(ie.token, x.token, sizeof ie.token);
        cr_assert_eq(pool_proto_send(c, &ie, NULL, 0, 0), 0);   /* spent */
    }
    close(c);
    close(b);
    drop_all_and_wait_whole(d.path);
    pd_stop(&d);
}

/* Regression (issue 35, attach from the pool 4-30x a local attach): the daemon answered an
   ATTACH with one FRAMES message per entry (an entry's regions), so 64 blocks of 2 regions
   came in 64 messages, each a wake-up, a poll and a receive of the attaching client. The
   frames of all the found entries come in full messages now: 4 entries of one frame in one
   message of 4. */
Test(prefix_pool, attach_sends_the_entries_frames_in_full_messages)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "1M");                 /* 16 frames */
    int a = pc_client(d.path, "raw-publisher");
    uint64_t ids[POOL_BATCH_MAX];
    int fds[POOL_BATCH_MAX];
    cr_assert_eq(pc_lease(a, 4, ids, fds, NULL), 4);
    for (int i = 0; i < 4; i++)
        close(fds[i]);
    for (int i = 0; i < 4; i++)         /* a chain: a, a+b, a+b+c, a+b+c+d */
        raw_publish(a, (uint8_t)('a' + i), ids[i], i == 3);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    cr_assert_eq(pc_recv(a, buf, NULL, NULL), POOL_MSG_RESULT);
    cr_expect_eq(((const struct pool_result *)buf)->err, 4, "four entries made");
    int b = pc_client(d.path, "raw-attacher");
    struct pool_prefix_keys m = { .lay = raw_lay, .ns = 3, .n = 4 };
    pool_proto_hdr(&m.h, POOL_MSG_PREFIX_ATTACH);
    for (unsigned i = 0; i < 4; i++)
        m.keys[i][0] = (uint8_t)('a' + i);
    cr_assert_eq(pool_proto_send(b, &m, NULL, 0, 0), 0);
    cr_assert_eq(pc_recv(b, buf, NULL, NULL), POOL_MSG_PREFIX_FOUND);
    const struct pool_prefix_found *r = (const void *)buf;
    cr_assert_eq(r->found, 4);
    cr_assert_eq(r->total, 4, "one frame per entry (one region)");
    int nf = 0;
    cr_assert_eq(pc_recv(b, buf, fds, &nf), POOL_MSG_FRAMES);
    for (int i = 0; i < nf; i++)
        close(fds[i]);
    const struct pool_frames *f = (const void *)buf;
    cr_expect_eq(f->n, 4, "the four entries' frames in one message, not %u per message", f->n);
    cr_expect_eq(nf, (int)f->n, "a descriptor per frame");
    for (uint32_t i = 0; i < f->n && i < 4; i++)
        cr_expect_eq(f->ids[i], ids[i], "in the entries' order");
    close(b);
    close(a);
    drop_all_and_wait_whole(d.path);
    pd_stop(&d);
}

/* Issue 35: the daemon sent a descriptor for every frame of an attach, so a client attaching
   blocks whose frames a sequence of its own still maps (its local entries gone: here the
   local index takes none) imported each frame again. They come held now (pool/protocol.h
   "Held frames"): no import, no count at the daemon, the same handle mapped again. */
Test(prefix_pool, attach_of_frames_already_mapped_imports_nothing)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "4M");
    struct pub_proc a = pub_start(d.path, (struct pub_args){ .pat = 0x4d, .salt = 9, .ns = 5 });
    struct att_proc later = att_start(d.path, 5, 9, BPT, NB, 0x4d, 0);
    struct kvvm_config c;
    cfg(&c, d.path, "reattacher", BPT);
    c.pool_thread = 0;                  /* no lease ahead: the counters move with the calls */
    kvvm *kv = NULL;
    cr_assert_eq(kvvm_open(&c, &kv), 0, "%s", kvvm_last_error());
    cr_assert_geq(kvvm_testing_prefix_limits(kv, 1, 0), 0);  /* no local entry for NB blocks:
                                                                 every attach asks the pool */
    kvvm_key k[NB];
    keys_of(k, 9);
    kvvm_seq s1, s2;
    struct emu_counters e0 = emu_of(kv);
    uint64_t to_dev = STAT(kv, bytes_to_device);
    cr_assert_eq(kvvm_seq_create(kv, &s1), 0);
    cr_assert_eq(kvvm_prefix_attach(kv, s1, 5, k, NB), (int)NB, "%s", kvvm_last_error());
    struct emu_counters e1 = emu_of(kv);
    struct kvvm_pool_info p1 = pool_info_of(kv);
    cr_expect_eq(e1.imports - e0.imports, NB * NREG, "the first attach maps new frames");
    cr_assert_eq(kvvm_seq_create(kv, &s2), 0);
    cr_assert_eq(kvvm_prefix_attach(kv, s2, 5, k, NB), (int)NB, "%s", kvvm_last_error());
    struct emu_counters e2 = emu_of(kv);
    struct kvvm_pool_info p2 = pool_info_of(kv);
    cr_expect_eq(e2.imports - e1.imports, 0, "frames it maps imported again: %llu",
                 (unsigned long long)(e2.imports - e1.imports));
    cr_expect_eq(e2.imported, e1.imported, "no new handle");
    cr_expect_eq(p2.free_bytes, p1.free_bytes);
    cr_expect_eq(p2.held_bytes, p1.held_bytes);
    cr_expect_eq(STAT(kv, bytes_to_device), to_dev, "no copy");
    cr_expect_eq(STAT(kv, pool_hit_blocks), 2 * NB);
    cr_expect_eq(check(kv, s1, NB * TPP, 0x4d), 0);
    cr_expect_eq(check(kv, s2, NB * TPP, 0x4d), 0);
    th_check(kv, "two sequences on the same handles");
    cr_assert_eq(kvvm_seq_free(kv, s1), 0);     /* s2 still maps every frame */
    cr_expect_eq(check(kv, s2, NB * TPP, 0x4d), 0);
    unsigned char b[PD_GRAN], r[PD_GRAN];
    memset(b, 0xa7, sizeof b);
    cr_assert_eq(kvvm_seq_write(kv, s2, 0, 0, b, sizeof b), 0);    /* copies first */
    cr_assert_eq(kvvm_seq_read(kv, s2, 0, 0, r, sizeof r), 0);
    cr_expect_eq(memcmp(b, r, sizeof b), 0);
    th_check(kv, "after the write");
    cr_assert_eq(kvvm_seq_free(kv, s2), 0);
    kvvm_close(kv);
    pub_finish(&a, 'c');                /* the write: not in the publisher's pages */
    cr_expect_eq(att_run(&later), 0, "the entries' bytes: its exit code names the check");
    drop_all_and_wait_whole(d.path);
    pd_stop(&d);
}

/* A client with a pool and a file:// store (frames created at open for a premap, no lease
   ahead: the counters move with the calls) beside a publisher process that published set
   13 (pattern 0x5e, namespace 8) to both, then freed its sequence and exited (its store
   writes done by its close). */
struct pool_store {
    struct pd d;
    char dir[64], url[96];
    struct pub_proc a;
    kvvm *kv;
    kvvm_key k[NB];
    kvvm_seq s;                         /* empty: the attach's destination */
};

static void pool_store_start(struct pool_store *p)
{
    pd_start(&p->d, "4M");
    file_url(p->dir, sizeof p->dir, p->url, sizeof p->url);
    p->a = pub_start(p->d.path, (struct pub_args){ .pat = 0x5e, .salt = 13, .ns = 8,
                                                   .free_first = true, .store_url = p->url });
    struct kvvm_config c;
    cfg(&c, p->d.path, "pool-and-store", BPT);
    c.pool_thread = 0;
    c.create_at_open = 1;
    c.store_url = p->url;
    cr_assert_eq(kvvm_open(&c, &p->kv), 0, "%s", kvvm_last_error());
    keys_of(p->k, 13);
    cr_assert_eq(kvvm_seq_create(p->kv, &p->s), 0);
}

/* The attached blocks' bytes checked, then everything stopped. */
static void pool_store_stop(struct pool_store *p)
{
    cr_expect_eq(check(p->kv, p->s, NB * TPP, 0x5e), 0);
    th_check(p->kv, "after the attach");
    cr_assert_eq(kvvm_seq_free(p->kv, p->s), 0);
    kvvm_close(p->kv);
    pub_finish(&p->a, 'x');
    rmdir_all(p->dir);
    drop_all_and_wait_whole(p->d.path);
    pd_stop(&p->d);
}

/* Regression: with a pool and a store, an attach whose local index was empty read the
   store's blocks, and premapped dst's pages for them once the first was a hit, before its
   locked part asked the daemon, whose prefix, as long, then won: every block read for
   nothing (store_unused), the premap's maps made and dropped again by the import. The
   daemon's prefix comes before the store's, as kvvm_prefix_lookup orders them: no read, no
   premap, dst's pages mapped once (counted on the emulator), none left mapped ahead. */
Test(regress, attach_read_the_store_when_the_daemon_had_the_blocks)
{
    TH_DEADLINE(120);
    static struct pool_store p;
    pool_store_start(&p);
    struct emu_counters e0 = emu_of(p.kv);
    cr_assert_eq(kvvm_prefix_attach(p.kv, p.s, 8, p.k, NB), (int)NB, "%s", kvvm_last_error());
    struct emu_counters e1 = emu_of(p.kv);
    cr_expect_eq(STAT(p.kv, pool_hit_blocks), NB, "the daemon's prefix attached");
    cr_expect_eq(STAT(p.kv, store_gets), 0, "the store read for blocks the daemon had: %llu",
                 (unsigned long long)STAT(p.kv, store_gets));
    cr_expect_eq(STAT(p.kv, store_unused), 0);
    cr_expect_eq(e1.maps - e0.maps, NB * NREG, "dst's pages mapped once, no premap: %llu maps",
                 (unsigned long long)(e1.maps - e0.maps));
    cr_expect_eq(e1.mappings - e0.mappings, NB * NREG, "dst's pages only stay mapped: %llu",
                 (unsigned long long)(e1.mappings - e0.mappings));
    pool_store_stop(&p);
}

/* With a pool and a store, blocks the daemon no longer has (kvvmctl drop) come from the
   store: read, copied to the device and attached, none unused. */
Test(prefix_pool, attach_over_the_store_when_the_daemon_lacks_the_blocks)
{
    TH_DEADLINE(120);
    static struct pool_store p;
    pool_store_start(&p);
    char out[512];
    cr_assert_eq(pd_ctl(p.d.path, "drop", out, sizeof out), 0, "kvvmctl drop: %s", out);
    cr_assert_eq(figures(p.d.path).shared_entries, 0);
    cr_assert_eq(kvvm_prefix_attach(p.kv, p.s, 8, p.k, NB), (int)NB, "%s", kvvm_last_error());
    cr_expect_eq(STAT(p.kv, pool_hit_blocks), 0);
    cr_expect_eq(STAT(p.kv, store_gets), NB, "the store's blocks read");
    cr_expect_eq(STAT(p.kv, store_unused), 0, "and attached");
    pool_store_stop(&p);
}

/* An attach whose import fails midway (the emulator's injected out of memory at the third
   import of its FRAMES message: two frames imported, the rest sent with descriptors)
   leaves nothing: dst empty (the local attach goes on: none here), every handle the attach
   imported released and every frame it was sent given back (the daemon's figures as
   before), and the next attach maps every block. */
Test(prefix_pool, attach_with_an_import_failing_midway_leaves_nothing)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "4M");
    struct pub_proc a = pub_start(d.path, (struct pub_args){ .pat = 0x6b, .salt = 11,
                                                             .ns = 6 });
    struct kvvm_config c;
    cfg(&c, d.path, "failing-attacher", BPT);
    c.pool_thread = 0;                  /* no lease ahead: the counters move with the calls */
    kvvm *kv = NULL;
    cr_assert_eq(kvvm_open(&c, &kv), 0, "%s", kvvm_last_error());
    kvvm_key k[NB];
    keys_of(k, 11);
    kvvm_seq s;
    cr_assert_eq(kvvm_seq_create(kv, &s), 0);
    struct emu_counters e0 = emu_of(kv);
    struct pool_figures f0 = figures(d.path);
    cr_assert_eq(emu_fail_arm("cuMemImportFromShareableHandle", 3, KCU_ERROR_OUT_OF_MEMORY),
                 0);
    cr_expect_eq(kvvm_prefix_attach(kv, s, 6, k, NB), 0, "nothing attached: %s",
                 kvvm_last_error());
    emu_fail_clear();
    struct emu_counters e1 = emu_of(kv);
    struct kvvm_seq_info si = { .size = sizeof si };
    cr_assert_eq(kvvm_seq_info(kv, s, &si), 0);
    cr_expect_eq(si.length, 0, "dst empty");
    cr_expect_eq(e1.imports - e0.imports, 2, "two imports made, the third refused");
    cr_expect_eq(e1.imported, e0.imported, "every import released");
    struct pool_figures f1 = figures(d.path);
    cr_expect_eq(f1.free_bytes, f0.free_bytes);
    cr_expect_eq(f1.held_bytes, f0.held_bytes);
    th_check(kv, "after the failed attach");
    cr_assert_eq(kvvm_prefix_attach(kv, s, 6, k, NB), (int)NB, "%s", kvvm_last_error());
    cr_expect_eq(check(kv, s, NB * TPP, 0x6b), 0);
    cr_assert_eq(kvvm_seq_free(kv, s), 0);
    kvvm_close(kv);
    pub_finish(&a, 'c');
    drop_all_and_wait_whole(d.path);
    pd_stop(&d);
}

/* ---- a lost reply: a proxy between one client and the daemon (a child process) that
   forwards every message both ways (descriptors included), except the daemon's RESULT
   answering the client's first PREFIX_PUBLISH call: it swallows it and closes both
   connections, so the client sees the daemon go mid-request after the daemon made the
   entries (a reply that timed out ends the same way). It serves one connection: the client
   finds no daemon again. */

/* One message from `from` to `to`; its type (0: the connection ended). */
static unsigned proxy_pass(int from, int to, bool forward)
{
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    int fds[POOL_BATCH_MAX], nf = 0;
    long n = pool_proto_recv(from, buf, sizeof buf, fds, POOL_BATCH_MAX, &nf, 0);
    unsigned type = 0;
    if (n > 0 && pool_proto_check(buf, (size_t)n, nf, &type) == 0 && forward &&
        pool_proto_send(to, buf, fds, nf, 0) != 0)
        type = 0;
    for (int i = 0; i < nf; i++)
        close(fds[i]);
    return n > 0 ? type : 0;
}

static void proxy_conn(int c, const char *daemon)
{
    int d = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    snprintf(a.sun_path, sizeof a.sun_path, "%.100s", daemon);
    if (d < 0 || connect(d, (struct sockaddr *)&a, sizeof a) != 0)
        _exit(80);
    bool armed = false;             /* the publish call's last chunk went: RESULT answers it */
    for (;;) {
        struct pollfd p[2] = { { .fd = c, .events = POLLIN }, { .fd = d, .events = POLLIN } };
        if (poll(p, 2, -1) < 0)
            continue;
        if (p[0].revents) {
            _Alignas(8) unsigned char peek[sizeof(struct pool_prefix_publish)];
            ssize_t k = recv(c, peek, sizeof peek, MSG_PEEK);
            const struct pool_prefix_publish *m = (const void *)peek;
            if (k == (ssize_t)sizeof peek && m->h.type == POOL_MSG_PREFIX_PUBLISH && m->last)
                armed = true;
            if (!proxy_pass(c, d, true))
                break;
        }
        if (p[1].revents) {
            unsigned t = proxy_pass(d, c, !armed);
            if (!t || (armed && t == POOL_MSG_RESULT))
                break;              /* the reply lost: both connections end */
        }
    }
    close(d);
    close(c);
}

static pid_t proxy_start(const char *daemon, char *path, size_t cap, char *dir)
{
    cr_assert(mkdtemp(dir));
    snprintf(path, cap, "%s/proxy", dir);
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    snprintf(a.sun_path, sizeof a.sun_path, "%.100s", path);
    int l = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    cr_assert(l >= 0);
    cr_assert_eq(bind(l, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(l, 4), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int c = accept(l, NULL, NULL);
        close(l);                   /* one connection: a reconnection finds no daemon */
        if (c >= 0)
            proxy_conn(c, daemon);
        _exit(0);
    }
    close(l);
    return pid;
}

/* A PREFIX_PUBLISH whose reply was lost (the daemon gone mid-request, or a reply past
   POOL_CLI_REPLY_MS) failed -EIO, and the publisher did not mark its pages shared, though
   the daemon had made the entries (serial 0: visible at once): once its local entries went
   (dropped here while the daemon is unreachable), its next write landed in place, in the
   frames the daemon's entries hold, and another client attaching them read it. */
Test(regress, lost_publish_reply_left_the_pages_written_in_place)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "4M");
    char dir[] = "/tmp/kvvm-proxy-XXXXXX", path[128];
    pid_t proxy = proxy_start(d.path, path, sizeof path, dir);
    struct kvvm_config c;
    cfg(&c, path, "publisher", BPT);
    c.create_at_open = 1;               /* frames for copies on write once it is cut off */
    struct att_proc att = att_start(d.path, 6, 12, BPT, NB, 0x3a, 0);
    kvvm *kv = NULL;
    cr_assert_eq(kvvm_open(&c, &kv), 0, "%s", kvvm_last_error());
    kvvm_key k[NB];
    keys_of(k, 12);
    kvvm_seq s;
    cr_assert_eq(kvvm_seq_create(kv, &s), 0);
    cr_assert_eq(kvvm_seq_grow(kv, s, NB * TPP), 0);
    cr_assert_eq(fill(kv, s, NB * TPP, 0x3a), 0);
    cr_assert_eq(kvvm_prefix_publish(kv, s, 6, k, NB), (int)NB, "%s", kvvm_last_error());
    cr_expect_eq(figures(d.path).shared_entries, NB, "the daemon made the entries");
    cr_assert_eq(kvvm_prefix_drop(kv, 6, k, NB), (int)NB);    /* local: the daemon is gone */
    cr_assert_eq(fill(kv, s, NB * TPP, 0xc5), 0, "%s", kvvm_last_error());   /* after the call */
    cr_expect_eq(check(kv, s, NB * TPP, 0xc5), 0);
    int st = att_run(&att);
    cr_expect_eq(st, 0, "the entries hold the bytes of the publish, not the write after it "
                 "(the attacher's exit code names the check: %d)", st);
    kvvm_close(kv);
    cr_expect_eq(pd_wait(proxy), 0, "the proxy served its one connection");
    unlink(path);
    rmdir(dir);
    drop_all_and_wait_whole(d.path);
    pd_stop(&d);
}
