/*
 * tests/store_server.h: what the store's tests share (test_store.c, test_prefix_store.c): a
 * real redis-server started on 127.0.0.1 at a free port (a temporary directory, --save '',
 * a password, no eviction unless asked), killed and reaped at the end, and killed with the
 * test process if that ends first (a failed assertion, a crash); a temporary store
 * directory under /var/tmp for the file backend; a monotonic clock. Where redis-server is
 * not installed (scripts/install-deps.sh installs it) rsrv_start skips the test with the
 * reason. Include after harness.h.
 */
#ifndef KVVM_TESTS_STORE_SERVER_H
#define KVVM_TESTS_STORE_SERVER_H

#include <fcntl.h>
#include <hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PASS "kvvm-test-pw"

/* ------------------------------------------------------------------ a real redis-server */

struct rsrv {
    pid_t pid;
    int port;
    char dir[64];
    char url[128];
};

static inline int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof a;
    cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
              getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

static inline redisContext *raw_connect(int port)
{
    struct timeval tv = { 1, 0 };
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (!c || c->err) {
        if (c)
            redisFree(c);
        return NULL;
    }
    redisReply *r = redisCommand(c, "AUTH %s", PASS);
    int ok = r && r->type == REDIS_REPLY_STATUS;
    if (r)
        freeReplyObject(r);
    if (!ok) {
        redisFree(c);
        return NULL;
    }
    return c;
}

/* Starts redis-server on s->port (0: a free one); waits until it answers. */
static inline void rsrv_start(struct rsrv *s, const char *maxmemory)
{
    if (access("/usr/bin/redis-server", X_OK) != 0 && system("command -v redis-server "
                                                              ">/dev/null 2>&1") != 0)
        cr_skip_test("redis-server is not installed (scripts/install-deps.sh installs it)");
    if (!s->port)
        s->port = free_port();
    if (!s->dir[0]) {
        snprintf(s->dir, sizeof s->dir, "/tmp/kvvm-redis-XXXXXX");
        cr_assert(mkdtemp(s->dir));
    }
    char port[16];
    snprintf(port, sizeof port, "%d", s->port);
    snprintf(s->url, sizeof s->url, "redis://:%s@127.0.0.1:%d", PASS, s->port);
    pid_t parent = getpid();
    s->pid = fork();
    cr_assert(s->pid >= 0);
    if (s->pid == 0) {
        /* a test that ends before rsrv_stop (a failed assertion) takes its server along */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
            _exit(127);
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1",
               "--save", "", "--appendonly", "no", "--requirepass", PASS, "--dir", s->dir,
               "--maxmemory", maxmemory ? maxmemory : "0", "--maxmemory-policy", "noeviction",
               (char *)NULL);
        _exit(127);
    }
    /* until it answers or exits, however slow the machine (the test's TH_DEADLINE bounds it) */
    for (;;) {
        redisContext *c = raw_connect(s->port);
        if (c) {
            redisFree(c);
            return;
        }
        int st;
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
            s->pid = 0;
            cr_assert_fail("redis-server exited (status %d) before it answered on port %d",
                           st, s->port);
        }
        usleep(10000);
    }
}

/* Kills the server (SIGKILL: nothing to save) and reaps it; the directory stays. */
static inline void rsrv_kill(struct rsrv *s)
{
    if (s->pid > 0) {
        kill(s->pid, SIGCONT);
        kill(s->pid, SIGKILL);
        waitpid(s->pid, NULL, 0);
    }
    s->pid = 0;
}

static inline void rsrv_stop(struct rsrv *s)
{
    rsrv_kill(s);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", s->dir);
    if (s->dir[0] && system(cmd) != 0)
        cr_log_warn("could not remove %s", s->dir);
}

/* Sets the server's maxmemory to what it holds now plus room bytes (MEMORY STATS'
   total.allocated): puts past it are refused (noeviction). */
static inline void rsrv_room(const struct rsrv *s, long long room)
{
    redisContext *c = raw_connect(s->port);
    cr_assert(c);
    redisReply *info = redisCommand(c, "MEMORY STATS");
    cr_assert(info && info->type == REDIS_REPLY_ARRAY);
    long long used = 0;
    for (size_t i = 0; i + 1 < info->elements; i += 2)
        if (!strcmp(info->element[i]->str, "total.allocated"))
            used = info->element[i + 1]->integer;
    freeReplyObject(info);
    cr_assert(used > 0);
    freeReplyObject(redisCommand(c, "CONFIG SET maxmemory %lld", used + room));
    redisFree(c);
}

static inline char *file_url(char *dir, size_t dlen, char *url, size_t ulen)
{
    snprintf(dir, dlen, "/var/tmp/kvvm-store-XXXXXX");
    cr_assert(mkdtemp(dir));
    snprintf(url, ulen, "file://%s", dir);
    return url;
}

static inline void rmdir_all(const char *dir)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        cr_log_warn("could not remove %s", dir);
}

static inline uint64_t ms_since(uint64_t t0)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec - t0) / 1000000u;
}

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Test `name` of suites redis_suite and file_suite: fn(url) against a fresh redis-server,
   and against a fresh store directory; each with a hang guard of secs seconds. */
#define STORE_BOTH(redis_suite, file_suite, secs, name, fn)             \
    Test(redis_suite, name)                                             \
    {                                                                   \
        TH_DEADLINE(secs);                                              \
        struct rsrv s = { 0 };                                          \
        rsrv_start(&s, NULL);                                           \
        fn(s.url);                                                      \
        rsrv_stop(&s);                                                  \
    }                                                                   \
    Test(file_suite, name)                                              \
    {                                                                   \
        TH_DEADLINE(secs);                                              \
        char dir[64], url[96];                                          \
        fn(file_url(dir, sizeof dir, url, sizeof url));                 \
        rmdir_all(dir);                                                 \
    }

#endif
