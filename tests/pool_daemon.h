/* tests/pool_daemon.h: a real kvvmd for the pool tests, started by the test in its own
   process (socket in a mkdtemp directory; the test waits for its ready line, never for a
   time), and a raw protocol client (pool/protocol.h) to talk to it as a client or as
   kvvmctl does. Header-only, static helpers (tests/harness.h's style). */
#ifndef KVVM_TESTS_POOL_DAEMON_H
#define KVVM_TESTS_POOL_DAEMON_H

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include "pool/protocol.h"

#ifndef KVVMTEST_KVVMD
#error "KVVMTEST_KVVMD (the kvvmd binary) must be defined by tests/CMakeLists.txt"
#endif

#define PD_GRAN (64u * 1024u)          /* the test daemon's granule and page */

struct pd {
    pid_t pid;
    char dir[64];
    char path[128];
    int out;                           /* its stdout (a pipe), after the ready line */
    int err;                           /* its stderr (a pipe) */
};

/* Reads fd until a newline; the line (without it) in buf. false on EOF. */
static inline bool pd_line(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    while (n + 1 < cap) {
        ssize_t r = read(fd, buf + n, 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        if (buf[n] == '\n') {
            buf[n] = 0;
            return true;
        }
        n++;
    }
    buf[n] = 0;
    return false;
}

/* Starts kvvmd on path with the test shape (emulated, granule PD_GRAN) and extra args;
   returns once it printed its ready line (asserted exactly). budget: "4M" etc. */
static inline void pd_start_at(struct pd *d, const char *path, const char *budget,
                               const char *const *extra)
{
    snprintf(d->path, sizeof d->path, "%s", path);
    int po[2], pe[2];
    cr_assert_eq(pipe2(po, O_CLOEXEC), 0);
    cr_assert_eq(pipe2(pe, O_CLOEXEC), 0);
    const char *argv[24] = { KVVMTEST_KVVMD, "--socket", d->path, "--backend", "emulated",
                             "--emu-device-bytes", "64M", "--emu-granule", "64K",
                             "--budget", budget };
    int k = 11;
    for (; extra && *extra && k < 22; extra++)
        argv[k++] = *extra;
    argv[k] = NULL;
    d->pid = fork();
    cr_assert_geq(d->pid, 0);
    if (d->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);   /* a test that dies takes its daemon along */
        dup2(po[1], 1);
        dup2(pe[1], 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(po[1]);
    close(pe[1]);
    d->out = po[0];
    d->err = pe[0];
}

static inline void pd_expect_ready(struct pd *d)
{
    char line[256], want[256];
    snprintf(want, sizeof want, "kvvmd: ready %s", d->path);
    bool got = pd_line(d->out, line, sizeof line);
    if (!got) {
        char e[1024] = "";
        ssize_t n = read(d->err, e, sizeof e - 1);
        e[n > 0 ? n : 0] = 0;
        cr_assert_fail("kvvmd printed no ready line (stdout '%s'); stderr: %s", line, e);
    }
    cr_assert_str_eq(line, want);
}

static inline void pd_start(struct pd *d, const char *budget)
{
    snprintf(d->dir, sizeof d->dir, "/tmp/kvvmpool.XXXXXX");
    cr_assert(mkdtemp(d->dir));
    char p[128];
    snprintf(p, sizeof p, "%s/sock", d->dir);
    pd_start_at(d, p, budget, NULL);
    pd_expect_ready(d);
}

/* Waits for the daemon to exit; its status (exit code, or 128 + signal). */
static inline int pd_wait(pid_t pid)
{
    int st;
    while (waitpid(pid, &st, 0) < 0)
        cr_assert_eq(errno, EINTR);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* SIGTERM, exit 0, socket gone, nothing more on stdout. */
static inline void pd_stop(struct pd *d)
{
    cr_assert_eq(kill(d->pid, SIGTERM), 0);
    cr_expect_eq(pd_wait(d->pid), 0, "kvvmd exits 0 on SIGTERM");
    struct stat st;
    cr_expect_neq(lstat(d->path, &st), 0, "kvvmd removed its socket");
    char rest[64];
    cr_expect_eq(read(d->out, rest, sizeof rest), 0, "one line only on stdout");
    close(d->out);
    close(d->err);
    if (d->dir[0])
        rmdir(d->dir);
}

#ifdef KVVMTEST_KVVMCTL
/* Runs kvvmctl on path with args; its stdout and stderr in out, its exit status returned. */
static inline int pd_ctl(const char *path, const char *args, char *out, size_t cap)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s --socket %s %s 2>&1", KVVMTEST_KVVMCTL, path, args);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
#endif

/* ---- a raw protocol connection ------------------------------------------------------- */

static inline int pc_connect(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_un a = { .sun_family = AF_UNIX };
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "connect %s: %s", path,
                 strerror(errno));
    return fd;
}

/* Receives one message; its type (0 when the daemon closed), fds in fds. */
static inline unsigned pc_recv(int fd, void *buf, int *fds, int *nfds)
{
    int nf = 0, tmp[POOL_BATCH_MAX];
    long n = pool_proto_recv(fd, buf, POOL_MSG_MAX, fds ? fds : tmp, POOL_BATCH_MAX, &nf, 0);
    if (nfds)
        *nfds = nf;
    if (n <= 0)
        return 0;
    unsigned type = 0;
    cr_assert_eq(pool_proto_check(buf, (size_t)n, nf, &type), 0, "the daemon's message");
    return type;
}

/* Connects and says HELLO (role, name, reserve, limit); the answer's type, *w the welcome. */
static inline unsigned pc_hello(int fd, unsigned role, const char *name, uint64_t reserve,
                                uint64_t limit, void *buf)
{
    struct pool_hello h = { .version = POOL_PROTO_VERSION, .role = role, .reserve = reserve,
                            .limit = limit };
    pool_proto_hdr(&h.h, POOL_MSG_HELLO);
    snprintf(h.name, sizeof h.name, "%s", name);
    cr_assert_eq(pool_proto_send(fd, &h, NULL, 0, 0), 0);
    return pc_recv(fd, buf, NULL, NULL);
}

static inline int pc_client(const char *path, const char *name)
{
    int fd = pc_connect(path);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    cr_assert_eq(pc_hello(fd, POOL_ROLE_CLIENT, name, 0, 0, buf), POOL_MSG_WELCOME);
    return fd;
}

/* The pool's figures as fd sees them. */
static inline struct pool_figures pc_info(int fd)
{
    struct pool_info m;
    pool_proto_hdr(&m.h, POOL_MSG_INFO);
    cr_assert_eq(pool_proto_send(fd, &m, NULL, 0, 0), 0);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    cr_assert_eq(pc_recv(fd, buf, NULL, NULL), POOL_MSG_INFO_REPLY);
    return ((struct pool_info_reply *)buf)->fig;
}

/* Leases n frames: their ids and descriptors; returns how many were granted. */
static inline unsigned pc_lease(int fd, unsigned n, uint64_t *ids, int *fds,
                                struct pool_frames *out)
{
    struct pool_lease m = { .n = n };
    pool_proto_hdr(&m.h, POOL_MSG_LEASE);
    cr_assert_eq(pool_proto_send(fd, &m, NULL, 0, 0), 0);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    int nf;
    cr_assert_eq(pc_recv(fd, buf, fds, &nf), POOL_MSG_FRAMES);
    const struct pool_frames *r = (const void *)buf;
    cr_assert_eq((int)r->n, nf);
    memcpy(ids, r->ids, r->n * sizeof *ids);
    if (out)
        memcpy(out, r, sizeof *out);
    return r->n;
}

static inline void pc_return(int fd, const uint64_t *ids, unsigned n)
{
    struct pool_return m = { .n = n };
    pool_proto_hdr(&m.h, POOL_MSG_RETURN);
    memcpy(m.ids, ids, n * sizeof *ids);
    cr_assert_eq(pool_proto_send(fd, &m, NULL, 0, 0), 0);
}

/* True once the daemon closed fd (a dropped client). Blocks until it does. */
static inline bool pc_dropped(int fd)
{
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    int nf;
    return pool_proto_recv(fd, buf, sizeof buf, NULL, 0, &nf, 0) == 0;
}

#endif
