/*
 * tests/cluster_server.h: a real Redis Cluster for the store's tests (test_store_cluster.c):
 * redis-server nodes on 127.0.0.1 at free ports (their cluster bus ports, +10000, free too),
 * a temporary directory, a password (requirepass and masterauth), --save '' and no AOF,
 * `redis-cli --cluster create` with the replicas asked for, then waited for until every node
 * says cluster_state:ok (and every replica's link to its master is up). Every server is
 * started with PR_SET_PDEATHSIG: a test that fails (or hits its deadline) takes its servers
 * with it; cl_stop kills and reaps them on the normal path. Where redis-server or redis-cli
 * is missing (scripts/install-deps.sh installs both) the test is skipped with the reason.
 * Include after harness.h and store_server.h.
 */
#ifndef KVVM_TESTS_CLUSTER_SERVER_H
#define KVVM_TESTS_CLUSTER_SERVER_H

#include <stdarg.h>
#include <sys/prctl.h>

#define CL_MAX 6

struct rcluster {
    int n, masters;
    pid_t pid[CL_MAX];
    int port[CL_MAX];
    char id[CL_MAX][48];         /* CLUSTER MYID */
    char dir[64];
    char url[512];               /* redis-cluster://:PASS@127.0.0.1:p0,127.0.0.1:p1 */
};

static inline int port_free(int p)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)p),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    int ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

/* A free port whose cluster bus port (+10000) is free as well. */
static inline int cl_free_port(void)
{
    for (;;) {
        int p = free_port();
        if (p + 10000 < 65536 && port_free(p + 10000))
            return p;
    }
}

/* A command to the node at port (authenticated); NULL when it does not answer. */
static inline redisReply *cl_cmd(int port, const char *fmt, ...)
{
    redisContext *c = raw_connect(port);
    if (!c)
        return NULL;
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    redisFree(c);
    return r;
}

/* Whether the node's reply to cmd (a bulk or status text) holds want. */
static inline bool cl_says(int port, const char *cmd, const char *want)
{
    redisReply *r = cl_cmd(port, cmd);
    bool ok = r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) &&
              strstr(r->str, want);
    if (r)
        freeReplyObject(r);
    return ok;
}

static inline long long cl_int(int port, const char *cmd)
{
    redisReply *r = cl_cmd(port, cmd);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    if (r)
        freeReplyObject(r);
    return v;
}

static inline bool cl_is_master(int port)
{
    return cl_says(port, "INFO replication", "role:master");
}

/* Waits until every live node (pid > 0) says cluster_state:ok, and every replica's link is
   up. A bound of 60 s of tries, so a broken cluster fails instead of hanging. */
static inline void cl_wait_ok(struct rcluster *c)
{
    for (int t = 0; t < 6000; t++) {
        bool ok = true;
        for (int i = 0; ok && i < c->n; i++)
            if (c->pid[i] > 0)
                ok = cl_says(c->port[i], "CLUSTER INFO", "cluster_state:ok") &&
                     (cl_is_master(c->port[i]) ||
                      cl_says(c->port[i], "INFO replication", "master_link_status:up"));
        if (ok)
            return;
        usleep(10000);
    }
    cr_assert_fail("the cluster did not reach cluster_state:ok");
}

static inline void cl_start(struct rcluster *c, int masters, int replicas)
{
    if (system("command -v redis-server >/dev/null 2>&1 && "
               "command -v redis-cli >/dev/null 2>&1") != 0)
        cr_skip_test("redis-server or redis-cli is not installed (scripts/install-deps.sh "
                     "installs both)");
    memset(c, 0, sizeof *c);
    c->masters = masters;
    c->n = masters * (1 + replicas);
    cr_assert(c->n <= CL_MAX);
    snprintf(c->dir, sizeof c->dir, "/tmp/kvvm-cluster-XXXXXX");
    cr_assert(mkdtemp(c->dir));
    pid_t me = getpid();
    for (int i = 0; i < c->n; i++) {
        c->port[i] = cl_free_port();
        char port[16], conf[128];
        snprintf(port, sizeof port, "%d", c->port[i]);
        snprintf(conf, sizeof conf, "%s/nodes-%d.conf", c->dir, c->port[i]);
        c->pid[i] = fork();
        cr_assert(c->pid[i] >= 0);
        if (c->pid[i] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);   /* the test gone: its servers with it */
            if (getppid() != me)
                _exit(127);
            int null = open("/dev/null", O_WRONLY);
            dup2(null, 1);
            dup2(null, 2);
            execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1",
                   "--cluster-enabled", "yes", "--cluster-config-file", conf,
                   "--cluster-node-timeout", "1000", "--dir", c->dir, "--save", "",
                   "--appendonly", "no", "--requirepass", PASS, "--masterauth", PASS,
                   (char *)NULL);
            _exit(127);
        }
    }
    char cmd[1024];
    int len = snprintf(cmd, sizeof cmd, "redis-cli -a %s --no-auth-warning --cluster create",
                       PASS);
    int ulen = snprintf(c->url, sizeof c->url, "redis-cluster://:%s@", PASS);
    for (int i = 0; i < c->n; i++) {
        redisContext *rc;
        for (int t = 0; !(rc = raw_connect(c->port[i])); t++) {
            cr_assert(t < 1000, "redis-server did not answer on port %d", c->port[i]);
            usleep(10000);
        }
        redisFree(rc);
        redisReply *r = cl_cmd(c->port[i], "CLUSTER MYID");
        cr_assert(r && r->type == REDIS_REPLY_STRING);
        snprintf(c->id[i], sizeof c->id[i], "%s", r->str);
        freeReplyObject(r);
        len += snprintf(cmd + len, sizeof cmd - (size_t)len, " 127.0.0.1:%d", c->port[i]);
        if (i < 2)
            ulen += snprintf(c->url + ulen, sizeof c->url - (size_t)ulen, "%s127.0.0.1:%d",
                             i ? "," : "", c->port[i]);
    }
    snprintf(cmd + len, sizeof cmd - (size_t)len,
             " --cluster-replicas %d --cluster-yes >/dev/null 2>&1", replicas);
    cr_assert_eq(system(cmd), 0, "%s failed", cmd);
    cl_wait_ok(c);
}

static inline void cl_kill(struct rcluster *c, int i)
{
    if (c->pid[i] > 0) {
        kill(c->pid[i], SIGCONT);
        kill(c->pid[i], SIGKILL);
        waitpid(c->pid[i], NULL, 0);
    }
    c->pid[i] = 0;
}

static inline void cl_stop(struct rcluster *c)
{
    for (int i = 0; i < c->n; i++)
        cl_kill(c, i);
    rmdir_all(c->dir);
}

/* The index of the node holding key now (EXISTS 1), or -1. */
static inline int cl_holder(const struct rcluster *c, const char *key)
{
    for (int i = 0; i < c->n; i++) {
        if (c->pid[i] <= 0 || !cl_is_master(c->port[i]))
            continue;
        redisReply *r = cl_cmd(c->port[i], "EXISTS %s", key);
        bool has = r && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
        if (r)
            freeReplyObject(r);
        if (has)
            return i;
    }
    return -1;
}

#endif
