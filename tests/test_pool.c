/* tests/test_pool.c: the pool daemon, kvvmd, as a real process (tests/pool_daemon.h) and
   its protocol over a real socket: the ready line, socket mode and SIGTERM cleanup, a stale
   socket replaced, a second daemon on a live socket refused, leases whose frames a client
   imports and maps (bytes through its window), a client killed with SIGKILL giving every
   frame back, malformed and hostile messages dropping only their sender, versions,
   reserves and limits, and kvvmctl. */
#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include "harness.h"
#include "pool/client.h"
#include "pool_daemon.h"
#include "vmm/vmm.h"

#define FRAMES 64                               /* the pool: 4 MiB of 64 KiB frames */

Test(pool, ready_line_socket_mode_and_sigterm_cleanup)
{
    TH_DEADLINE(60);
    struct pd d;
    pd_start(&d, "4M");
    struct stat st;
    cr_assert_eq(lstat(d.path, &st), 0);
    cr_expect(S_ISSOCK(st.st_mode));
    cr_expect_eq(st.st_mode & 0777, 0600, "the socket is 0600 (mode %o)", st.st_mode & 0777);
    int c = pc_client(d.path, "ready-test");
    uint64_t ids[4];
    int fds[4];
    cr_assert_eq(pc_lease(c, 4, ids, fds, NULL), 4);
    for (int i = 0; i < 4; i++)
        close(fds[i]);
    pd_stop(&d);                                /* with a client holding frames */
    cr_expect(pc_dropped(c));
    close(c);
}

Test(pool, stale_socket_file_replaced)
{
    TH_DEADLINE(60);
    struct pd d = { 0 };
    snprintf(d.dir, sizeof d.dir, "/tmp/kvvmpool.XXXXXX");
    cr_assert(mkdtemp(d.dir));
    char p[100];
    snprintf(p, sizeof p, "%s/sock", d.dir);
    int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);  /* bound, never listening, then closed */
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    snprintf(a.sun_path, sizeof a.sun_path, "%s", p);
    cr_assert_eq(bind(s, (struct sockaddr *)&a, sizeof a), 0);
    close(s);
    pd_start_at(&d, p, "4M", NULL);
    pd_expect_ready(&d);
    int c = pc_client(d.path, "after-stale");
    close(c);
    pd_stop(&d);
}

Test(pool, second_daemon_on_a_live_socket_refused)
{
    TH_DEADLINE(60);
    struct pd d, d2 = { 0 };
    pd_start(&d, "4M");
    pd_start_at(&d2, d.path, "4M", NULL);
    cr_expect_eq(pd_wait(d2.pid), 1, "the second kvvmd exits 1");
    char line[512];
    cr_expect_not(pd_line(d2.out, line, sizeof line), "no ready line: '%s'", line);
    cr_expect(pd_line(d2.err, line, sizeof line));
    cr_expect(strstr(line, "already answers"), "stderr names the cause: %s", line);
    close(d2.out);
    close(d2.err);
    int c = pc_client(d.path, "still-served");     /* the first one goes on */
    cr_expect_eq(pc_info(c).pool_bytes, FRAMES * PD_GRAN);
    close(c);
    pd_stop(&d);
}

Test(pool, refuses_a_path_that_is_no_socket)
{
    TH_DEADLINE(60);
    struct pd d = { 0 };
    snprintf(d.dir, sizeof d.dir, "/tmp/kvvmpool.XXXXXX");
    cr_assert(mkdtemp(d.dir));
    char p[100];
    snprintf(p, sizeof p, "%s/file", d.dir);
    FILE *f = fopen(p, "w");
    cr_assert(f);
    fclose(f);
    pd_start_at(&d, p, "4M", NULL);
    cr_expect_eq(pd_wait(d.pid), 1);
    struct stat st;
    cr_expect_eq(lstat(p, &st), 0, "a regular file is never removed");
    unlink(p);
    rmdir(d.dir);
}

/* The bytes of a leased frame, through the client's own window: each frame imported and
   mapped, a pattern written and read back through copies, and no two clients share a
   frame (patterns of two clients stay apart). */
static struct vmm *client_vmm(void)
{
    struct vmm_params p = { .backend = KVVM_BACKEND_EMULATED, .emu_capacity = 64u << 20,
                            .emu_granule = PD_GRAN, .emu_opaque = 1 };
    struct vmm *v = NULL;
    cr_assert_eq(vmm_open(&p, &v), 0);
    return v;
}

static void map_and_fill(struct vmm *v, const int *fds, unsigned n, vmm_handle *h,
                         uint64_t base, unsigned char pat)
{
    for (unsigned i = 0; i < n; i++) {
        cr_assert_eq(vmm_handle_import(v, fds[i], PD_GRAN, &h[i]), 0);  /* takes fds[i] */
    }
    cr_assert_eq(vmm_map_run(v, base, h, n, PD_GRAN), 0);
    cr_assert_eq(vmm_memset(v, base, pat, (size_t)n * PD_GRAN, NULL), 0);
    cr_assert_eq(vmm_stream_sync(v, NULL), 0);
}

static void expect_fill(struct vmm *v, uint64_t base, unsigned n, unsigned char pat)
{
    size_t bytes = (size_t)n * PD_GRAN;
    unsigned char *b = malloc(bytes);
    cr_assert(b);
    cr_assert_eq(vmm_copy_dtoh(v, b, base, bytes, NULL), 0);
    cr_assert_eq(vmm_stream_sync(v, NULL), 0);
    for (size_t i = 0; i < bytes; i++)
        cr_assert_eq(b[i], pat, "byte %zu: %#x, want %#x", i, b[i], pat);
    free(b);
}

Test(pool, leased_frames_hold_a_clients_bytes)
{
    TH_DEADLINE(60);
    struct pd d;
    pd_start(&d, "4M");
    int a = pc_client(d.path, "a"), b = pc_client(d.path, "b");
    uint64_t ia[8], ib[8];
    int fa[8], fb[8];
    cr_assert_eq(pc_lease(a, 8, ia, fa, NULL), 8);
    cr_assert_eq(pc_lease(b, 8, ib, fb, NULL), 8);
    struct vmm *v = client_vmm();
    uint64_t base;
    cr_assert_eq(vmm_reserve(v, 16 * PD_GRAN, &base), 0);
    vmm_handle ha[8], hb[8];
    map_and_fill(v, fa, 8, ha, base, 0x3a);
    map_and_fill(v, fb, 8, hb, base + 8 * PD_GRAN, 0x5b);
    expect_fill(v, base, 8, 0x3a);
    expect_fill(v, base + 8 * PD_GRAN, 8, 0x5b);
    struct pool_figures f = pc_info(a);
    cr_expect_eq(f.held_bytes, 8 * PD_GRAN);
    cr_expect_eq(f.free_bytes, (FRAMES - 16) * PD_GRAN);
    cr_expect_eq(f.n_clients, 2);
    /* a's frames go back (unmapped and released first, as the client library does) */
    cr_assert_eq(vmm_unmap(v, base, 8 * PD_GRAN), 0);
    for (int i = 0; i < 8; i++)
        cr_assert_eq(vmm_phys_release(v, ha[i]), 0);
    pc_return(a, ia, 8);
    f = pc_info(a);
    cr_expect_eq(f.held_bytes, 0);
    cr_expect_eq(f.free_bytes, (FRAMES - 8) * PD_GRAN);
    expect_fill(v, base + 8 * PD_GRAN, 8, 0x5b);     /* b's are untouched */
    cr_assert_eq(vmm_unmap(v, base + 8 * PD_GRAN, 8 * PD_GRAN), 0);
    for (int i = 0; i < 8; i++)
        cr_assert_eq(vmm_phys_release(v, hb[i]), 0);
    vmm_unreserve(v);
    vmm_close(v);
    close(a);
    close(b);
    pd_stop(&d);
}

/* A dry pool grants what it has and says so with its figures. */
Test(pool, dry_pool_grants_fewer_with_figures)
{
    TH_DEADLINE(60);
    struct pd d;
    pd_start(&d, "1M");                               /* 16 frames */
    int a = pc_client(d.path, "a");
    uint64_t ids[POOL_BATCH_MAX];
    int fds[POOL_BATCH_MAX];
    struct pool_frames r;
    cr_assert_eq(pc_lease(a, 20, ids, fds, &r), 16);
    cr_expect_eq(r.err, -ENOMEM);
    cr_expect_eq(r.fig.free_bytes, 0);
    cr_expect_eq(r.fig.pool_bytes, 16 * PD_GRAN);
    for (int i = 0; i < 16; i++)
        close(fds[i]);
    cr_assert_eq(pc_lease(a, 1, ids, fds, &r), 0);
    cr_expect_eq(r.err, -ENOMEM);
    close(a);
    pd_stop(&d);
}

/* Descriptors process pid holds now (/proc/pid/fd). */
static size_t fds_of(pid_t pid)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(dir);
    cr_assert(d);
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* A frame given back dies: the reserve closes its export and releases it when the loop is
   idle (issue 34: a RETURN makes no system call per frame in the daemon). Leased and given
   back 64 times over, 1,024 frames died: the daemon's descriptors come back to what its
   reserve holds (3 a frame on the emulated device: memfd, export description, export),
   never one a dead frame's export kept open (polled until they do; the deadline fails). */
Test(pool, dead_frames_exports_closed_at_their_release)
{
    TH_DEADLINE(60);
    struct pd d;
    snprintf(d.dir, sizeof d.dir, "/tmp/kvvmpool.XXXXXX");
    cr_assert(mkdtemp(d.dir));
    char p[128];
    snprintf(p, sizeof p, "%s/sock", d.dir);
    const char *extra[] = { "--reserve-frames", "16", NULL };
    pd_start_at(&d, p, "1M", extra);                  /* 16 frames, a reserve of 16 */
    pd_expect_ready(&d);
    int a = pc_client(d.path, "a");
    uint64_t ids[POOL_BATCH_MAX];
    int fds[POOL_BATCH_MAX];
    for (int k = 0; k < 64; k++) {
        cr_assert_eq(pc_lease(a, 16, ids, fds, NULL), 16);
        for (int i = 0; i < 16; i++)
            close(fds[i]);
        pc_return(a, ids, 16);
    }
    cr_assert_eq(pc_info(a).free_bytes, 16 * PD_GRAN, "every frame given back");
    /* idle: 16 ready frames, none dying; a few more for its sockets, epoll, stdio */
    while (fds_of(d.pid) > 3 * 16 + 32)
        sched_yield();
    close(a);
    pd_stop(&d);
}

/* The connection is the lease: SIGKILL of a client that imported and mapped its frames
   gives every one back; the daemon's free count returns exactly (polled, no sleep). */
Test(pool, killed_client_gives_every_frame_back)
{
    TH_DEADLINE(60);
    struct pd d;
    pd_start(&d, "4M");
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(sv[0]);
        int c = pc_client(d.path, "victim");
        uint64_t ids[24];
        int fds[24];
        if (pc_lease(c, 24, ids, fds, NULL) != 24)
            _exit(3);
        struct vmm *v = client_vmm();
        uint64_t base;
        vmm_handle h[24];
        if (vmm_reserve(v, 24 * PD_GRAN, &base))
            _exit(4);
        map_and_fill(v, fds, 24, h, base, 0x77);
        char x = 'k';
        if (write(sv[1], &x, 1) != 1)
            _exit(5);
        for (;;)
            pause();
    }
    close(sv[1]);
    char x;
    cr_assert_eq(read(sv[0], &x, 1), 1, "the victim leased and mapped its frames");
    int ctl = pc_connect(d.path);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    cr_assert_eq(pc_hello(ctl, POOL_ROLE_CONTROL, "test", 0, 0, buf), POOL_MSG_WELCOME);
    struct pool_figures f = pc_info(ctl);
    cr_expect_eq(f.free_bytes, (FRAMES - 24) * PD_GRAN);
    cr_expect_eq(f.n_clients, 1, "a control connection is no client");
    kill(pid, SIGKILL);
    cr_expect_eq(pd_wait(pid), 128 + SIGKILL);
    while ((f = pc_info(ctl)).free_bytes != FRAMES * PD_GRAN || f.n_clients != 0)
        sched_yield();                          /* a condition, not a time: TH_DEADLINE */
    close(ctl);
    close(sv[0]);
    pd_stop(&d);
}

/* Malformed or hostile messages drop their sender only. */
static void expect_dropped_for(const char *path, const void *msg, size_t len, int fd_to_send,
                               const char *what)
{
    int c = pc_client(path, what);
    if (len) {
        char cbuf[CMSG_SPACE(sizeof(int))];
        memset(cbuf, 0, sizeof cbuf);
        struct iovec io = { (void *)msg, len };
        struct msghdr m = { .msg_iov = &io, .msg_iovlen = 1 };
        if (fd_to_send >= 0) {
            m.msg_control = cbuf;
            m.msg_controllen = sizeof cbuf;
            struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
            cm->cmsg_level = SOL_SOCKET;
            cm->cmsg_type = SCM_RIGHTS;
            cm->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(cm), &fd_to_send, sizeof(int));
        }
        cr_assert_eq(sendmsg(c, &m, 0), (ssize_t)len, "%s", what);
    }
    cr_expect(pc_dropped(c), "%s: the daemon drops the sender", what);
    close(c);
}

Test(pool, malformed_messages_drop_only_their_sender)
{
    TH_DEADLINE(60);
    struct pd d;
    pd_start(&d, "4M");
    int good = pc_client(d.path, "good");
    uint64_t gids[3];
    int gfds[3];
    cr_assert_eq(pc_lease(good, 3, gids, gfds, NULL), 3);

    unsigned char junk[100];
    memset(junk, 0xee, sizeof junk);
    expect_dropped_for(d.path, junk, sizeof junk, -1, "garbage");
    struct pool_lease l = { .n = 1 };
    pool_proto_hdr(&l.h, POOL_MSG_LEASE);
    expect_dropped_for(d.path, &l, sizeof l - 4, -1, "truncated");
    unsigned char big[POOL_MSG_MAX + 64] = { 0 };
    memcpy(big, &l, sizeof l);
    expect_dropped_for(d.path, big, sizeof big, -1, "oversized");
    expect_dropped_for(d.path, &l, sizeof l, 0, "a descriptor where none is expected");
    l.n = POOL_BATCH_MAX + 1;
    expect_dropped_for(d.path, &l, sizeof l, -1, "a count out of range");
    struct pool_return r = { .n = 1, .ids = { gids[0] } };
    pool_proto_hdr(&r.h, POOL_MSG_RETURN);
    expect_dropped_for(d.path, &r, sizeof r, -1, "returning another client's frame");
    struct pool_info_reply ir = { 0 };
    pool_proto_hdr(&ir.h, POOL_MSG_INFO_REPLY);
    expect_dropped_for(d.path, &ir, sizeof ir, -1, "a daemon's message");
    struct pool_hello h2 = { .version = POOL_PROTO_VERSION, .role = POOL_ROLE_CLIENT };
    pool_proto_hdr(&h2.h, POOL_MSG_HELLO);
    expect_dropped_for(d.path, &h2, sizeof h2, -1, "a second hello");

    /* lease before hello */
    int c = pc_connect(d.path);
    l.n = 1;
    cr_assert_eq(pool_proto_send(c, &l, NULL, 0, 0), 0);
    cr_expect(pc_dropped(c), "a lease before hello");
    close(c);

    /* the good client is served on, its frames its own */
    struct pool_figures f = pc_info(good);
    cr_expect_eq(f.held_bytes, 3 * PD_GRAN);
    cr_expect_eq(f.free_bytes, (FRAMES - 3) * PD_GRAN);
    cr_expect_eq(f.n_clients, 1);
    pc_return(good, gids, 3);
    cr_expect_eq(pc_info(good).free_bytes, FRAMES * PD_GRAN);
    for (int i = 0; i < 3; i++)
        close(gfds[i]);
    close(good);
    pd_stop(&d);
}

/* A client saying HELLO at protocol version v to a fresh daemon is refused: -EPROTO, the
   text naming `named` and the daemon's version, the client dropped. The daemon's REFUSED. */
static struct pool_refused hello_refused(unsigned v, const char *named)
{
    struct pd d;
    pd_start(&d, "4M");
    int c = pc_connect(d.path);
    struct pool_hello h = { .version = v, .role = POOL_ROLE_CLIENT };
    pool_proto_hdr(&h.h, POOL_MSG_HELLO);
    cr_assert_eq(pool_proto_send(c, &h, NULL, 0, 0), 0);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    cr_assert_eq(pc_recv(c, buf, NULL, NULL), POOL_MSG_REFUSED);
    struct pool_refused r;
    memcpy(&r, buf, sizeof r);
    cr_expect_eq(r.err, -EPROTO);
    char ours[32];
    snprintf(ours, sizeof ours, "version %u", POOL_PROTO_VERSION);
    cr_expect(strstr(r.why, named) && strstr(r.why, ours), "%s", r.why);
    cr_expect(pc_dropped(c));
    close(c);
    pd_stop(&d);
    return r;
}

Test(pool, another_protocol_version_refused_naming_both)
{
    TH_DEADLINE(60);
    (void)hello_refused(99, "99");
}

/* The sharing messages (EXPORT .. PREFIX_DROP) were added to the protocol without bumping its
   version: a client of the version before them (1: leases only) was welcomed, and a daemon of
   that version would have dropped a sharing client as malformed at its first EXPORT instead of
   refusing it at HELLO naming both versions. */
Test(pool, protocol_version_bumped_for_sharing_messages)
{
    TH_DEADLINE(60);
    cr_assert_geq(POOL_PROTO_VERSION, 2u);
    struct pool_refused r = hello_refused(1, "version 1");
    cr_expect_eq(r.version, POOL_PROTO_VERSION);
}

/* Pending shares (PREFIX_PUBLISH's and EXPORT's serial, READY) changed two message sizes
   and added a type without bumping the version: a version 2 client was welcomed, and a
   version 2 daemon would have dropped a version 3 client as malformed at its first publish
   instead of refusing it at HELLO naming both versions. */
Test(pool, protocol_version_bumped_for_pending_shares)
{
    TH_DEADLINE(60);
    cr_assert_geq(POOL_PROTO_VERSION, 3u);
    (void)hello_refused(2, "version 2");
}

/* Held frames (FRAMES's held mask: a frame the client holds already comes without a
   descriptor) changed FRAMES's size and meaning: a version 3 client would take a held id's
   missing descriptor for a malformed reply, and a version 3 daemon would send a descriptor
   for every frame. */
Test(pool, protocol_version_bumped_for_held_frames)
{
    TH_DEADLINE(60);
    cr_assert_geq(POOL_PROTO_VERSION, 4u);
    (void)hello_refused(3, "version 3");
}

/* A LEASE's need (version 5) changed LEASE's size: a version 4 client's lease would be
   malformed to a version 5 daemon (dropped at its first lease) instead of refused at HELLO
   naming both versions. */
Test(pool, protocol_version_bumped_for_lease_need)
{
    TH_DEADLINE(60);
    cr_assert_geq(POOL_PROTO_VERSION, 5u);
    (void)hello_refused(4, "version 4");
}

Test(pool, reserves_are_promised_or_refused)
{
    TH_DEADLINE(60);
    struct pd d;
    pd_start(&d, "1M");                                 /* 16 frames */
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    int a = pc_connect(d.path);
    cr_assert_eq(pc_hello(a, POOL_ROLE_CLIENT, "a", 10 * PD_GRAN, 0, buf), POOL_MSG_WELCOME);
    int b = pc_connect(d.path);
    cr_assert_eq(pc_hello(b, POOL_ROLE_CLIENT, "b", 7 * PD_GRAN, 0, buf), POOL_MSG_REFUSED);
    cr_expect_eq(((struct pool_refused *)buf)->err, -ENOSPC);
    close(b);
    /* a third client gets what a did not reserve, never a's reserve */
    int c = pc_client(d.path, "c");
    uint64_t ids[16];
    int fds[16];
    cr_expect_eq(pc_lease(c, 16, ids, fds, NULL), 6);
    for (int i = 0; i < 6; i++)
        close(fds[i]);
    cr_expect_eq(pc_lease(a, 16, ids, fds, NULL), 10);
    for (int i = 0; i < 10; i++)
        close(fds[i]);
    close(a);
    close(c);
    pd_stop(&d);
}

/* ---- kvvmctl ------------------------------------------------------------------------- */

Test(pool, kvvmctl_status_clients_limit)
{
    TH_DEADLINE(60);
    struct pd d;
    pd_start(&d, "4M");
    char out[4096];
    int a = pc_client(d.path, "engine-a");
    uint64_t ids[POOL_BATCH_MAX];
    int fds[POOL_BATCH_MAX];
    cr_assert_eq(pc_lease(a, 5, ids, fds, NULL), 5);
    for (int i = 0; i < 5; i++)
        close(fds[i]);
    cr_assert_eq(pd_ctl(d.path, "--json status", out, sizeof out), 0, "%s", out);
    char want[256];
    snprintf(want, sizeof want, "\"pool_bytes\":%u,\"free_bytes\":%u", FRAMES * PD_GRAN,
             (FRAMES - 5) * PD_GRAN);
    cr_expect(strstr(out, want), "%s", out);
    cr_expect(strstr(out, "\"n_clients\":1,"), "%s", out);
    cr_assert_eq(pd_ctl(d.path, "status", out, sizeof out), 0, "%s", out);
    cr_expect(strstr(out, "clients  1"), "%s", out);
    cr_assert_eq(pd_ctl(d.path, "--json clients", out, sizeof out), 0, "%s", out);
    snprintf(want, sizeof want, "{\"name\":\"engine-a\",\"pid\":%d,\"held\":%u,", (int)getpid(),
             5 * PD_GRAN);
    cr_expect(strstr(out, want), "%s", out);
    cr_assert_eq(pd_ctl(d.path, "limit engine-a 384K", out, sizeof out), 0, "%s", out);
    struct pool_frames r;
    cr_expect_eq(pc_lease(a, 4, ids, fds, &r), 1, "the limit (6 frames) allows one more");
    cr_expect_eq(r.err, -ENOMEM);
    cr_expect_eq(r.fig.limit_bytes, 6 * PD_GRAN);
    close(fds[0]);
    cr_expect_eq(pd_ctl(d.path, "limit nobody 1M", out, sizeof out), 1, "%s", out);
    cr_expect(strstr(out, "no client named 'nobody'"), "%s", out);
    cr_expect_eq(pd_ctl(d.path, "limit engine-a lots", out, sizeof out), 2, "%s", out);
    cr_expect_eq(pd_ctl(d.path, "frobnicate", out, sizeof out), 2, "%s", out);
    close(a);
    pd_stop(&d);
    cr_expect_eq(pd_ctl(d.path, "status", out, sizeof out), 1, "%s", out);
    cr_expect(strstr(out, "no kvvmd answers"), "%s", out);
}

/* ---- contexts as clients (kvvm_open with pool_socket) ------------------------------------ */

#define BPT 4096u                       /* bytes per token: 16 tokens per 64 KiB page */

static void pool_cfg(struct kvvm_config *c, const char *path, const char *name,
                     uint64_t budget_pages)
{
    th_config(c, PD_GRAN, 2, BPT, 4, 256, budget_pages, 0, 0);
    c->pool_socket = path;
    c->client_name = name;
    c->page_size = 0;                   /* the daemon's */
    c->emu_granule = 0;                 /* the daemon's device */
}

/* An engine in its own process: opens a pool client, grows a sequence over `pages` pages
   per region, writes a pattern through its window, reads it back, checks its pool figures
   and stats. Returns 0, or the number of the check that failed (its exit code). */
static int engine(const char *path, const char *name, unsigned char pat, unsigned pages,
                  int ready_fd, bool stay)
{
    struct kvvm_config c;
    pool_cfg(&c, path, name, 16);
    kvvm *kv = NULL;
    if (kvvm_open(&c, &kv))
        return 10;
    kvvm_seq s;
    uint64_t len = (uint64_t)pages * (PD_GRAN / BPT);
    size_t bytes = (size_t)(len * BPT);
    unsigned char *w = malloc(bytes), *r = malloc(bytes);
    if (!w || !r || kvvm_seq_create(kv, &s) || kvvm_seq_grow(kv, s, len))
        return 11;
    for (uint32_t reg = 0; reg < 2; reg++) {
        for (size_t i = 0; i < bytes; i++)
            w[i] = (unsigned char)(pat + reg + i * 7);
        if (kvvm_seq_write(kv, s, reg, 0, w, bytes) || kvvm_seq_read(kv, s, reg, 0, r, bytes))
            return 12;
        if (memcmp(w, r, bytes))
            return 13;
    }
    struct kvvm_pool_info pi = { .size = sizeof pi };
    if (kvvm_pool_info(kv, &pi) || !pi.connected || pi.pool_bytes != FRAMES * PD_GRAN ||
        pi.held_bytes < 2ull * pages * PD_GRAN || pi.n_clients < 1 ||
        pi.limit_bytes != 16 * PD_GRAN)
        return 14;
    struct kvvm_stats st = { .size = sizeof st };
    if (kvvm_stats(kv, &st) || st.pool_leases < 2ull * pages)
        return 15;
    if (ready_fd >= 0) {
        char x = 'r';
        if (write(ready_fd, &x, 1) != 1)
            return 16;
    }
    while (stay)
        pause();
    kvvm_close(kv);
    free(w);
    free(r);
    return 0;
}

static int control(const char *path)
{
    int ctl = pc_connect(path);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    cr_assert_eq(pc_hello(ctl, POOL_ROLE_CONTROL, "test", 0, 0, buf), POOL_MSG_WELCOME);
    return ctl;
}

/* Polls (no sleep: each INFO is a round trip) until the pool is whole and clientless. */
static void wait_pool_whole(int ctl)
{
    for (;;) {
        struct pool_figures f = pc_info(ctl);
        if (f.free_bytes == f.pool_bytes && f.n_clients == 0)
            return;
        sched_yield();
    }
}

Test(pool, contexts_in_processes_keep_their_bytes)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "4M");
    pid_t p[3];
    for (int i = 0; i < 3; i++) {
        p[i] = fork();
        cr_assert_geq(p[i], 0);
        if (p[i] == 0) {
            char name[16];
            snprintf(name, sizeof name, "engine-%d", i);
            _exit(engine(d.path, name, (unsigned char)(0x10 * (i + 1)), 5, -1, false));
        }
    }
    for (int i = 0; i < 3; i++)
        cr_expect_eq(pd_wait(p[i]), 0, "engine %d: its exit code names the check", i);
    int ctl = control(d.path);
    wait_pool_whole(ctl);                   /* each closed: every frame back */
    close(ctl);
    pd_stop(&d);
}

Test(pool, killed_context_gives_every_frame_back)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "4M");
    int pp[2];
    cr_assert_eq(pipe2(pp, O_CLOEXEC), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0)
        _exit(engine(d.path, "victim", 0x42, 6, pp[1], true));
    close(pp[1]);
    char x;
    cr_assert_eq(read(pp[0], &x, 1), 1, "the engine grew and checked its bytes (status %d)",
                 x == 'r' ? 0 : pd_wait(pid));
    int ctl = control(d.path);
    struct pool_figures f = pc_info(ctl);
    cr_expect_leq(f.free_bytes, (FRAMES - 12) * PD_GRAN, "it holds its 12 pages' frames");
    cr_expect_eq(f.n_clients, 1);
    kill(pid, SIGKILL);
    cr_expect_eq(pd_wait(pid), 128 + SIGKILL);
    wait_pool_whole(ctl);
    close(ctl);
    close(pp[0]);
    pd_stop(&d);
}

Test(pool, open_checks_page_size_and_path)
{
    TH_DEADLINE(60);
    struct pd d;
    pd_start(&d, "4M");
    struct kvvm_config c;
    pool_cfg(&c, d.path, "ps", 16);
    c.page_size = 2 * PD_GRAN;
    c.emu_granule = PD_GRAN;
    kvvm *kv = NULL;
    cr_expect_eq(kvvm_open(&c, &kv), -EINVAL);
    cr_expect_null(kv);
    cr_expect(strstr(kvvm_last_error(), "131072") && strstr(kvvm_last_error(), "65536"),
              "names both page sizes: %s", kvvm_last_error());
    pool_cfg(&c, d.path, "big-reserve", 16);
    c.pool_reserve = 8u << 20;
    cr_expect_eq(kvvm_open(&c, &kv), -ENOSPC, "%s", kvvm_last_error());
    char p[160];
    snprintf(p, sizeof p, "%s.none", d.path);
    pool_cfg(&c, p, "nobody-there", 16);
    cr_expect_eq(kvvm_open(&c, &kv), -ECONNREFUSED);
    cr_expect(strstr(kvvm_last_error(), "no kvvmd answers"), "%s", kvvm_last_error());
    pd_stop(&d);
    pool_cfg(&c, d.path, "after-stop", 16);     /* the socket is gone */
    cr_expect_eq(kvvm_open(&c, &kv), -ECONNREFUSED);
}

Test(pool, pool_info_needs_a_pool)
{
    struct kvvm_config c;
    th_config(&c, PD_GRAN, 1, BPT, 2, 64, 4, 0, 0);
    kvvm *kv = th_open(&c);
    struct kvvm_pool_info pi = { .size = sizeof pi };
    cr_expect_eq(kvvm_pool_info(kv, &pi), -EOPNOTSUPP);
    cr_expect(strstr(kvvm_last_error(), "no pool"), "%s", kvvm_last_error());
    pi.size = 0;
    cr_expect_eq(kvvm_pool_info(kv, &pi), -EINVAL);
    struct kvvm_stats st = { .size = sizeof st };
    cr_assert_eq(kvvm_stats(kv, &st), 0);
    cr_expect_eq(st.pool_leases + st.pool_returns + st.pool_waits + st.pool_wait_ns, 0);
    kvvm_close(kv);
}

/* A dry pool: the grow fails -ENOMEM naming the pool's numbers and changes nothing; frames
   another client gives back (kvvm_trim) let it through. Both contexts in this process. */
Test(pool, dry_pool_fails_enomem_naming_the_pool)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "1M");                                 /* 16 frames */
    struct kvvm_config ca, cb;
    pool_cfg(&ca, d.path, "hog", 0);                    /* limit: the whole pool */
    ca.n_regions = 1;
    kvvm *a = th_open(&ca);
    kvvm_seq sa;
    cr_assert_eq(kvvm_seq_create(a, &sa), 0);
    cr_assert_eq(kvvm_seq_grow(a, sa, 16 * (PD_GRAN / BPT)), 0, "%s", kvvm_last_error());
    pool_cfg(&cb, d.path, "late", 4);
    cb.n_regions = 1;
    kvvm *b = th_open(&cb);
    kvvm_seq sb;
    cr_assert_eq(kvvm_seq_create(b, &sb), 0);
    cr_expect_eq(kvvm_seq_grow(b, sb, 8), -ENOMEM);
    cr_expect(strstr(kvvm_last_error(), "pool on") &&
              strstr(kvvm_last_error(), "0 of 1048576 bytes free"), "%s", kvvm_last_error());
    struct kvvm_seq_info in = { .size = sizeof in };
    cr_assert_eq(kvvm_seq_info(b, sb, &in), 0);
    cr_expect_eq(in.length, 0, "the failed grow changed nothing");
    struct kvvm_pool_info pi = { .size = sizeof pi };
    cr_assert_eq(kvvm_pool_info(b, &pi), 0);
    cr_expect_eq(pi.free_bytes, 0);
    cr_expect_eq(pi.held_bytes, 0);
    cr_expect_eq(pi.n_clients, 2);
    /* a gives its frames back: b grows */
    cr_assert_eq(kvvm_seq_free(a, sa), 0);
    cr_assert_eq(kvvm_trim(a, 0), 0);
    cr_expect_eq(kvvm_seq_grow(b, sb, 8), 0, "%s", kvvm_last_error());
    struct kvvm_stats st = { .size = sizeof st };
    cr_assert_eq(kvvm_stats(a, &st), 0);
    cr_expect_geq(st.pool_returns, 16);
    cr_expect_geq(st.pool_leases, 16);
    kvvm_close(b);
    kvvm_close(a);
    int ctl = control(d.path);
    wait_pool_whole(ctl);
    close(ctl);
    pd_stop(&d);
}

/* kill -9 of a client at random points (between and inside its operations: the child
   reports each step on a pipe, the parent kills it after a random number of them, so the
   kill lands anywhere from mid-open to mid-lease to mid-grow): every round, the daemon's
   free count returns exactly and it serves on. */
static int churn(const char *path, int prog)
{
    struct kvvm_config c;
    pool_cfg(&c, path, "churn", 16);
    kvvm *kv = NULL;
    if (kvvm_open(&c, &kv))
        return 10;
    unsigned char buf[4096];
    memset(buf, 0x6d, sizeof buf);
    for (unsigned i = 0;; i++) {
        kvvm_seq s;
        if (kvvm_seq_create(kv, &s))
            return 11;
        uint64_t len = 1 + (i * 37) % 100;
        if (kvvm_seq_grow(kv, s, len) || kvvm_seq_write(kv, s, 0, 0, buf, sizeof buf))
            return 12;
        char x = 'p';
        if (write(prog, &x, 1) != 1)
            return 13;
        if (i % 3 == 0 && kvvm_trim(kv, 0))
            return 14;
        if (kvvm_seq_free(kv, s))
            return 15;
    }
}

Test(pool, sigkill_at_random_points_loop)
{
    TH_DEADLINE(250);
    struct pd d;
    pd_start(&d, "4M");
    int ctl = control(d.path);
    unsigned seed = 12345;
    for (int round = 0; round < 120; round++) {
        int pp[2];
        cr_assert_eq(pipe2(pp, O_CLOEXEC), 0);
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
            close(pp[0]);
            _exit(churn(d.path, pp[1]));
        }
        close(pp[1]);
        seed = seed * 1103515245u + 12345u;
        unsigned steps = (seed >> 16) % 8;          /* 0: it may still be opening */
        char x;
        for (unsigned i = 0; i < steps; i++)
            cr_assert_eq(read(pp[0], &x, 1), 1, "round %d: the client failed (status %d)",
                         round, pd_wait(pid));
        kill(pid, SIGKILL);
        cr_expect_eq(pd_wait(pid), 128 + SIGKILL, "round %d", round);
        close(pp[0]);
        wait_pool_whole(ctl);
    }
    struct pool_figures f = pc_info(ctl);
    cr_expect_eq(f.free_bytes, FRAMES * PD_GRAN);
    close(ctl);
    pd_stop(&d);
}

/* The daemon killed under a client: the client keeps the frames it holds (its bytes read
   back), a grow that needs more fails -ENOMEM saying the daemon is gone and changes
   nothing, kvvm_pool_info says connected 0, and the context closes cleanly. */
Test(pool, daemon_killed_client_keeps_what_it_holds)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "4M");
    struct kvvm_config c;
    pool_cfg(&c, d.path, "survivor", 16);
    c.n_regions = 1;
    c.pool_thread = 0;                      /* leases on this thread: no round in flight */
    kvvm *kv = th_open(&c);
    kvvm_seq s;
    uint64_t len = 2 * (PD_GRAN / BPT);
    size_t bytes = (size_t)(len * BPT);
    unsigned char *w = malloc(bytes), *r = malloc(bytes);
    cr_assert(w && r);
    for (size_t i = 0; i < bytes; i++)
        w[i] = (unsigned char)(i * 13 + 1);
    cr_assert_eq(kvvm_seq_create(kv, &s), 0);
    cr_assert_eq(kvvm_seq_grow(kv, s, len), 0, "%s", kvvm_last_error());
    cr_assert_eq(kvvm_seq_write(kv, s, 0, 0, w, bytes), 0);
    cr_assert_eq(kvvm_trim(kv, 0), 0);      /* no spare frame left to grow into */
    kill(d.pid, SIGKILL);
    cr_expect_eq(pd_wait(d.pid), 128 + SIGKILL);
    cr_assert_eq(kvvm_seq_read(kv, s, 0, 0, r, bytes), 0);
    cr_expect_eq(memcmp(w, r, bytes), 0, "the frames it holds keep its bytes");
    cr_expect_eq(kvvm_seq_grow(kv, s, 2 * len + 3 * (PD_GRAN / BPT)), -ENOMEM);
    cr_expect(strstr(kvvm_last_error(), "is gone"), "%s", kvvm_last_error());
    struct kvvm_seq_info in = { .size = sizeof in };
    cr_assert_eq(kvvm_seq_info(kv, s, &in), 0);
    cr_expect_eq(in.length, len, "the failed grow changed nothing");
    struct kvvm_pool_info pi = { .size = sizeof pi };
    cr_assert_eq(kvvm_pool_info(kv, &pi), 0);
    cr_expect_eq(pi.connected, 0);
    cr_expect_eq(pi.held_bytes, 2 * PD_GRAN);
    cr_assert_eq(kvvm_seq_read(kv, s, 0, 0, r, bytes), 0);
    cr_expect_eq(memcmp(w, r, bytes), 0);
    cr_assert_eq(kvvm_seq_free(kv, s), 0);
    kvvm_close(kv);
    free(w);
    free(r);
    unlink(d.path);
    close(d.out);
    close(d.err);
    rmdir(d.dir);
}

/* The daemon killed and a new one started on the same socket: the client reconnects by
   itself at its next lease, keeps the frames it held from the old daemon (never returned
   to the new one, which would drop it for naming frames it does not hold), grows with the
   new daemon's frames, and gives those back at close. */
Test(pool, client_reconnects_to_a_restarted_daemon)
{
    TH_DEADLINE(120);
    struct pd d, d2 = { 0 };
    pd_start(&d, "4M");
    struct kvvm_config c;
    pool_cfg(&c, d.path, "phoenix", 16);
    c.n_regions = 1;
    c.pool_thread = 0;
    kvvm *kv = th_open(&c);
    kvvm_seq s;
    uint64_t tpp = PD_GRAN / BPT;
    unsigned char w[BPT], r[BPT];
    memset(w, 0x3c, sizeof w);
    cr_assert_eq(kvvm_seq_create(kv, &s), 0);
    cr_assert_eq(kvvm_seq_grow(kv, s, 2 * tpp), 0, "%s", kvvm_last_error());
    cr_assert_eq(kvvm_seq_write(kv, s, 0, 0, w, sizeof w), 0);
    cr_assert_eq(kvvm_trim(kv, 0), 0);
    kill(d.pid, SIGKILL);
    cr_expect_eq(pd_wait(d.pid), 128 + SIGKILL);
    close(d.out);
    close(d.err);
    pd_start_at(&d2, d.path, "4M", NULL);       /* replaces the stale socket */
    pd_expect_ready(&d2);
    cr_expect_eq(kvvm_seq_grow(kv, s, 5 * tpp), 0, "%s", kvvm_last_error());
    cr_assert_eq(kvvm_seq_read(kv, s, 0, 0, r, sizeof r), 0);
    cr_expect_eq(memcmp(w, r, sizeof w), 0, "the old daemon's frames keep their bytes");
    struct kvvm_pool_info pi = { .size = sizeof pi };
    cr_assert_eq(kvvm_pool_info(kv, &pi), 0);
    cr_expect_eq(pi.connected, 1);
    cr_expect_eq(pi.n_clients, 1);
    cr_expect_geq(pi.held_bytes, 3 * PD_GRAN, "the new daemon's leases");
    cr_assert_eq(kvvm_seq_free(kv, s), 0);
    cr_assert_eq(kvvm_trim(kv, 0), 0);          /* old frames released, new ones returned */
    int ctl = control(d2.path);
    struct pool_figures f = pc_info(ctl);
    cr_expect_eq(f.n_clients, 1, "still a client: no frame of the old daemon was returned");
    kvvm_close(kv);
    wait_pool_whole(ctl);
    close(ctl);
    pd_stop(&d2);
    rmdir(d.dir);
}

/* kvvm_set_budget of a pool client is its limit in the daemon: raised, its grows get the
   daemon's frames past the old limit (kvvmctl clients shows it); past the pool, refused
   with the pool named and nothing changed. */
Test(pool, set_budget_is_the_clients_limit)
{
    TH_DEADLINE(120);
    struct pd d;
    pd_start(&d, "1M");                                 /* 16 frames */
    struct kvvm_config c;
    pool_cfg(&c, d.path, "elastic", 4);
    c.n_regions = 1;
    kvvm *kv = th_open(&c);
    kvvm_seq s;
    uint64_t tpp = PD_GRAN / BPT;
    cr_assert_eq(kvvm_seq_create(kv, &s), 0);
    cr_assert_eq(kvvm_seq_grow(kv, s, 4 * tpp), 0, "%s", kvvm_last_error());
    cr_expect_eq(kvvm_seq_grow(kv, s, 6 * tpp), -ENOMEM, "the budget (4 pages)");
    cr_assert_eq(kvvm_set_budget(kv, 8 * PD_GRAN), 0, "%s", kvvm_last_error());
    cr_expect_eq(kvvm_seq_grow(kv, s, 6 * tpp), 0, "the daemon's limit followed: %s",
                 kvvm_last_error());
    char out[4096];
    cr_assert_eq(pd_ctl(d.path, "--json clients", out, sizeof out), 0, "%s", out);
    char want[128];
    snprintf(want, sizeof want, "\"limit\":%u,", 8 * PD_GRAN);
    cr_expect(strstr(out, want), "%s", out);
    cr_expect_eq(kvvm_set_budget(kv, 32 * PD_GRAN), -EINVAL);
    cr_expect(strstr(kvvm_last_error(), "more than the pool"), "%s", kvvm_last_error());
    struct kvvm_pool_info pi = { .size = sizeof pi };
    cr_assert_eq(kvvm_pool_info(kv, &pi), 0);
    cr_expect_eq(pi.limit_bytes, 8 * PD_GRAN, "unchanged by the refused call");
    kvvm_close(kv);
    int cfd = control(d.path);
    wait_pool_whole(cfd);
    close(cfd);
    pd_stop(&d);
}

/* ---- regressions ------------------------------------------------------------------------ */

/* A daemon that answers one client's HELLO, then its INFO with descriptors attached (none are
   expected), then goes. */
struct fake_daemon {
    int lfd;
    char path[108];
};

static void *fake_daemon_run(void *arg)
{
    struct fake_daemon *d = arg;
    int c = accept(d->lfd, NULL, NULL);
    cr_assert(c >= 0);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    int nfds = 0;
    cr_assert_gt(pool_proto_recv(c, buf, sizeof buf, NULL, 0, &nfds, 0), 0);   /* HELLO */
    struct pool_welcome w = { .version = POOL_PROTO_VERSION, .backend = POOL_BACKEND_EMULATED,
                              .page_size = PD_GRAN, .granule = PD_GRAN,
                              .pool_bytes = FRAMES * PD_GRAN, .emu_device_bytes = 64u << 20 };
    pool_proto_hdr(&w.h, POOL_MSG_WELCOME);
    cr_assert_eq(pool_proto_send(c, &w, NULL, 0, 0), 0);
    cr_assert_gt(pool_proto_recv(c, buf, sizeof buf, NULL, 0, &nfds, 0), 0);   /* INFO */
    struct pool_info_reply r = { .fig = { .pool_bytes = FRAMES * PD_GRAN } };
    pool_proto_hdr(&r.h, POOL_MSG_INFO_REPLY);
    int fds[8];
    for (int i = 0; i < 8; i++)
        cr_assert((fds[i] = memfd_create("fake", MFD_CLOEXEC)) >= 0);
    cr_assert_eq(pool_proto_send(c, &r, fds, 8, 0), 0);
    for (int i = 0; i < 8; i++)
        close(fds[i]);
    close(c);
    return NULL;
}

static int open_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    cr_assert(d);
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* pool_cli_info (and the limit request) took their reply into a one-descriptor array while
   the receive accepted up to POOL_BATCH_MAX descriptors: a reply carrying several wrote past
   the array on the stack (AddressSanitizer: stack-buffer-overflow). The reply is malformed:
   the client takes the daemon for gone and closes every descriptor it received. */
Test(regress, info_reply_carrying_descriptors_overran_the_clients_array)
{
    struct fake_daemon d;
    char dir[] = "/tmp/kvvm-fake-XXXXXX";
    cr_assert(mkdtemp(dir));
    snprintf(d.path, sizeof d.path, "%s/sock", dir);
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    snprintf(a.sun_path, sizeof a.sun_path, "%s", d.path);
    d.lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    cr_assert(d.lfd >= 0);
    cr_assert_eq(bind(d.lfd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(d.lfd, 1), 0);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, fake_daemon_run, &d), 0);

    struct pool_cli_params p = { .path = d.path, .name = "victim" };
    struct pool_cli *c = NULL;
    struct pool_welcome w;
    cr_assert_eq(pool_cli_open(&p, &c, &w), 0);
    cr_assert_eq(unlink(d.path), 0);        /* no reconnection: the daemon is gone */
    int before = open_fds();
    struct pool_figures f;
    int connected = 1;
    cr_assert_eq(pool_cli_info(c, &f, &connected), 0);
    cr_expect_eq(connected, 0, "a reply with descriptors where none belong is malformed");
    pthread_join(t, NULL);
    cr_expect_leq(open_fds(), before - 1, "descriptors received with the reply were kept");
    pool_cli_close(c);
    close(d.lfd);
    rmdir(dir);
}

/* A daemon that welcomes one client and answers its IMPORT with one frame sent held under
   an id the client never held, then reads until the client closes the connection. */
static void *fake_held_run(void *arg)
{
    struct fake_daemon *d = arg;
    int c = accept(d->lfd, NULL, NULL);
    cr_assert(c >= 0);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    int nfds = 0;
    cr_assert_gt(pool_proto_recv(c, buf, sizeof buf, NULL, 0, &nfds, 0), 0);   /* HELLO */
    struct pool_welcome w = { .version = POOL_PROTO_VERSION, .backend = POOL_BACKEND_EMULATED,
                              .page_size = PD_GRAN, .granule = PD_GRAN,
                              .pool_bytes = FRAMES * PD_GRAN, .emu_device_bytes = 64u << 20 };
    pool_proto_hdr(&w.h, POOL_MSG_WELCOME);
    cr_assert_eq(pool_proto_send(c, &w, NULL, 0, 0), 0);
    unsigned type = 0;
    cr_assert_gt(pool_proto_recv(c, buf, sizeof buf, NULL, 0, &nfds, 0), 0);
    cr_assert_eq(pool_proto_check(buf, sizeof(struct pool_import), 0, &type), 0);
    cr_assert_eq(type, POOL_MSG_IMPORT);
    struct pool_imported r = { .total = 1, .length = 16 };
    pool_proto_hdr(&r.h, POOL_MSG_IMPORTED);
    cr_assert_eq(pool_proto_send(c, &r, NULL, 0, 0), 0);
    struct pool_frames f = { .n = 1, .ids = { 1ull << 32 | 7 }, .held = 1 };
    pool_proto_hdr(&f.h, POOL_MSG_FRAMES);
    cr_assert_eq(pool_proto_send(c, &f, NULL, 0, 0), 0);
    long n;
    while ((n = pool_proto_recv(c, buf, sizeof buf, NULL, 0, &nfds, 0)) > 0)
        ;                               /* an IMPORT_END would say it took the frame */
    cr_expect_eq(n, 0, "the client closed the connection");
    close(c);
    return NULL;
}

/* Held frames (pool/protocol.h): the parser refuses a FRAMES whose held mask names ids past
   its count or whose descriptors are not one per id not held; a held id the client does not
   hold (a daemon's bug, or not a kvvmd) is a malformed reply: the client drops the
   connection (as gone: no IMPORT_END, no RETURN), its import fails -EIO, nothing kept. */
/* regress/connection_thread_woken_by_replies: a reply is its requester's, which holds mu
   and reads it; the connection thread, polling the same socket, used to wake at each one
   and wait for mu (and, while the requester imported a lease's frames one lock each, be
   woken and queue again at each). Now it waits for the request's end instead and takes mu
   only for a kick or an unasked message: 200 round trips make no look. */
static uint32_t give_none(void *arg, uint32_t n)
{
    (void)arg;
    (void)n;
    return 0;
}

/* A client of the daemon on path, its own emulated device *v attached and its connection
   thread listening (asks answered with nothing given), for the two tests below. */
static struct pool_cli *listening_client(const char *path, const char *name, struct vmm **v,
                                         struct pool_welcome *w)
{
    struct pool_cli_params p = { .path = path, .name = name };
    struct pool_cli *c = NULL;
    cr_assert_eq(pool_cli_open(&p, &c, w), 0);
    *v = client_vmm();
    pool_cli_attach(c, *v);
    cr_assert_eq(pool_cli_listen(c, give_none, NULL), 0);
    return c;
}

Test(regress, connection_thread_woken_by_replies)
{
    TH_DEADLINE(60);
    struct pd d;
    pd_start(&d, "4M");
    struct vmm *v;
    struct pool_welcome w;
    struct pool_cli *c = listening_client(d.path, "replies", &v, &w);
    struct pool_cli_counters k0, k1;
    pool_cli_counters(c, &k0);
    for (int i = 0; i < 200; i++) {
        struct pool_figures f;
        int connected = 0;
        cr_assert_eq(pool_cli_info(c, &f, &connected), 0);
        cr_assert(connected);
    }
    pool_cli_counters(c, &k1);
    cr_expect_leq(k1.listen_looks - k0.listen_looks, 2,
                  "200 replies woke the connection thread into mu %llu times",
                  (unsigned long long)(k1.listen_looks - k0.listen_looks));
    pool_cli_close(c);
    vmm_close(v);
    pd_stop(&d);
}

/* regress/prefix_replies_wake_the_connection_thread: the shared prefix index's requests
   (pool/client_share.c) sent, then began their request at the read: a reply that came
   before it (the daemon answers while the sender returns from sendmsg) woke the connection
   thread into mu, and the requester's unlock then woke it again (a futex call on the
   caller's thread); an ATTACH's request also ended between its FOUND and its FRAMES. Now
   each is a request from its send to its last reply: 200 lookups and 200 attaches of keys
   the index lacks make no look. */
Test(regress, prefix_replies_wake_the_connection_thread)
{
    TH_DEADLINE(60);
    struct pd d;
    pd_start(&d, "4M");
    struct vmm *v;
    struct pool_welcome w;
    struct pool_cli *c = listening_client(d.path, "prefix-replies", &v, &w);
    struct pool_layout lay = { .n_regions = 2, .bytes_per_token = 512,
                               .page_size = w.page_size };
    uint8_t keys[4 * POOL_KEY_BYTES];
    memset(keys, 0x5a, sizeof keys);
    struct pool_cli_counters k0, k1;
    pool_cli_counters(c, &k0);
    for (int i = 0; i < 200; i++) {
        vmm_handle *hs = NULL;
        size_t found = 1;
        cr_assert_eq(pool_cli_prefix_lookup(c, &lay, 1, keys, 4), 0);
        cr_assert_eq(pool_cli_prefix_attach(c, &lay, 1, keys, 4, &hs, &found), 0);
        cr_assert_eq(found, 0);
        free(hs);
    }
    pool_cli_counters(c, &k1);
    cr_expect_leq(k1.listen_looks - k0.listen_looks, 2,
                  "400 prefix replies woke the connection thread into mu %llu times",
                  (unsigned long long)(k1.listen_looks - k0.listen_looks));
    pool_cli_close(c);
    vmm_close(v);
    pd_stop(&d);
}

Test(pool, malformed_held_ids_drop_the_connection)
{
    TH_DEADLINE(60);
    struct pool_frames m = { .n = 2 };
    pool_proto_hdr(&m.h, POOL_MSG_FRAMES);
    unsigned type = 0;
    m.held = 4;                         /* a bit past n */
    cr_expect_eq(pool_proto_check(&m, sizeof m, 2, &type), -EPROTO);
    m.held = 1;                         /* one descriptor due */
    cr_expect_eq(pool_proto_check(&m, sizeof m, 2, &type), -EPROTO);
    cr_expect_eq(pool_proto_check(&m, sizeof m, 0, &type), -EPROTO);
    cr_expect_eq(pool_proto_check(&m, sizeof m, 1, &type), 0);
    m.held = 3;
    cr_expect_eq(pool_proto_check(&m, sizeof m, 0, &type), 0);
    m.n = POOL_BATCH_MAX;
    m.held = ~0ull;
    cr_expect_eq(pool_proto_check(&m, sizeof m, 0, &type), 0, "64 held ids");

    struct fake_daemon d;
    char dir[] = "/tmp/kvvm-fake-XXXXXX";
    cr_assert(mkdtemp(dir));
    snprintf(d.path, sizeof d.path, "%s/sock", dir);
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    snprintf(a.sun_path, sizeof a.sun_path, "%s", d.path);
    d.lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    cr_assert(d.lfd >= 0);
    cr_assert_eq(bind(d.lfd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(d.lfd, 1), 0);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, fake_held_run, &d), 0);
    struct pool_cli_params p = { .path = d.path, .name = "victim" };
    struct pool_cli *c = NULL;
    struct pool_welcome w;
    cr_assert_eq(pool_cli_open(&p, &c, &w), 0);
    cr_assert_eq(unlink(d.path), 0);        /* no reconnection */
    struct vmm *v = client_vmm();
    pool_cli_attach(c, v);
    struct pool_layout lay = { .n_regions = 1, .bytes_per_token = BPT, .page_size = PD_GRAN };
    uint8_t token[POOL_TOKEN_BYTES] = { 1 };
    vmm_handle *hs = NULL;
    uint32_t n = 0;
    uint64_t len = 0;
    char why[256] = "";
    cr_expect_eq(pool_cli_import(c, token, &lay, &hs, &n, &len, why, sizeof why), -EIO, "%s",
                 why);
    cr_expect_null(hs);
    pthread_join(t, NULL);                  /* it saw the connection closed */
    struct pool_figures f;
    int connected = 1;
    cr_assert_eq(pool_cli_info(c, &f, &connected), 0);
    cr_expect_eq(connected, 0, "a held id it does not hold is malformed");
    cr_expect_eq(f.held_bytes, 0, "nothing kept");
    pool_cli_close(c);
    vmm_close(v);
    close(d.lfd);
    rmdir(dir);
}

/* ---- a lease's need (protocol version 5) ---------------------------------------------- */

/* Sends a LEASE of n frames that waits wait_ms for a take-back and says its call needs
   need frames (n included). */
static void lease_need_send(int fd, unsigned n, unsigned wait_ms, unsigned need)
{
    struct pool_lease m = { .n = n, .wait_ms = wait_ms, .need = need };
    pool_proto_hdr(&m.h, POOL_MSG_LEASE);
    cr_assert_eq(pool_proto_send(fd, &m, NULL, 0, 0), 0);
}

/* The victim v (holding ids[0..16)) reads the daemon's RECLAIM (its n into *asked), gives
   back the first `give` frames and answers. */
static void victim_gives(int v, const uint64_t *ids, unsigned give, uint32_t *asked)
{
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    cr_assert_eq(pc_recv(v, buf, NULL, NULL), POOL_MSG_RECLAIM);
    const struct pool_reclaim *r = (const void *)buf;
    *asked = r->n;
    pc_return(v, ids, give);
    struct pool_reclaimed a = { .seq = r->seq, .given = give };
    pool_proto_hdr(&a.h, POOL_MSG_RECLAIMED);
    cr_assert_eq(pool_proto_send(v, &a, NULL, 0, 0), 0);
}

/* The asker's FRAMES: how many (their descriptors closed). */
static unsigned frames_got(int fd)
{
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    int fds[POOL_BATCH_MAX], nf = 0;
    cr_assert_eq(pc_recv(fd, buf, fds, &nf), POOL_MSG_FRAMES);
    for (int i = 0; i < nf; i++)
        close(fds[i]);
    return ((const struct pool_frames *)buf)->n;
}

/* A daemon of 16 frames (d), all leased to client v; client b's call needs 12 and leases
   4 with a deadline of ms; v gives the 12 it is asked for (ids: v's frames). Client c is
   connected and holds none. Returns the frames v was asked for; *got: b's first grant. */
static uint32_t need_of_12(struct pd *d, uint32_t ms, int *v, int *b, int *c,
                           uint64_t ids[16], unsigned *got)
{
    pd_start(d, "1M");                                  /* 16 frames */
    *v = pc_client(d->path, "victim");
    *b = pc_client(d->path, "asker");
    *c = pc_client(d->path, "other");
    int fds[16];
    cr_assert_eq(pc_lease(*v, 16, ids, fds, NULL), 16);
    for (int i = 0; i < 16; i++)
        close(fds[i]);
    lease_need_send(*b, 4, ms, 12);
    uint32_t asked = 0;
    victim_gives(*v, ids, 12, &asked);
    *got = frames_got(*b);
    return asked;
}

/* Issue 34 (giving back): a call needing 12 frames leases 4 at a time; the daemon asks the
   victim for all 12 in the first round (one RECLAIM, not one per lease), and the 8 given
   past the first lease are the asker's: another client's lease gets none of them, the
   asker's next lease gets them at once with no second round. */
Test(pool, lease_need_asked_in_one_round_surplus_held_for_the_asker)
{
    TH_DEADLINE(60);
    struct pd d;
    int v, b, c;
    uint64_t ids[16];
    int fds[16];
    unsigned got;
    uint32_t asked = need_of_12(&d, 30000, &v, &b, &c, ids, &got);
    cr_expect_eq(asked, 12, "the victim asked for the call's whole need at once");
    cr_expect_eq(got, 4);
    cr_expect_eq(pc_lease(c, 8, ids + 12, fds, NULL), 0, "the asker's surplus is held");
    lease_need_send(b, 8, 30000, 8);
    cr_expect_eq(frames_got(b), 8, "the surplus granted to the asker at once");
    struct pool_figures f = pc_info(b);
    cr_expect_eq(f.held_bytes, 12ull * PD_GRAN);
    cr_expect_eq(f.free_bytes, 0);
    close(b);
    close(c);
    close(v);
    pd_stop(&d);
}

/* The credit ends at the lease's deadline: the frames given for the asker's call that it
   did not lease again go to whoever asks then (waited for as a condition: another
   client's lease polled until it gets them; TH_DEADLINE guards it). */
Test(pool, lease_need_credit_ends_at_the_deadline)
{
    TH_DEADLINE(60);
    struct pd d;
    int v, b, c;
    uint64_t ids[16], got[16];
    int fds[16];
    unsigned first;
    uint32_t asked = need_of_12(&d, 200, &v, &b, &c, ids, &first);
    cr_expect_eq(asked, 12);
    cr_expect_eq(first, 4);
    unsigned n;
    while ((n = pc_lease(c, 8, got, fds, NULL)) == 0)
        sched_yield();                          /* until the credit's deadline passed */
    for (unsigned i = 0; i < n; i++)
        close(fds[i]);
    cr_expect_eq(n, 8, "the other client gets the frames once the credit ended");
    close(b);
    close(c);
    close(v);
    pd_stop(&d);
}
