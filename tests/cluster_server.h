/*
 * tests/cluster_server.h: a real Redis Cluster for the store's tests (test_store_cluster.c):
 * redis-server nodes on 127.0.0.1 at free ports (their cluster bus ports, +10000, free too;
 * no port or bus port chosen twice within a cluster), a temporary directory (each node's
 * log, node-PORT.log, there), a password (requirepass and masterauth), --save '' and no
 * AOF, `redis-cli --cluster create` with the replicas asked for, then waited for until every
 * node says cluster_state:ok (and every replica's link to its master is up). A node is
 * waited for until it answers as itself (its process id) or exits; one that exits at start
 * (its port or bus port taken since it was chosen: another test's server, another
 * process's connection) is started again on a fresh port. No wait here has a time bound of
 * its own: the test's TH_DEADLINE bounds them, however slow the machine. Every server is
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
#define CL_RESTARTS 16           /* nodes started again (exited at start) before giving up */

struct rcluster {
    int n, masters;
    pid_t pid[CL_MAX];           /* 0: not running (killed, or exited and reaped) */
    int port[CL_MAX];            /* 0: not chosen yet */
    int restarts;                /* nodes started again on a fresh port: exited at start */
    char id[CL_MAX][48];         /* CLUSTER MYID */
    char dir[64];
    char url[512];               /* redis-cluster://:PASS@127.0.0.1:p0,127.0.0.1:p1 */
};

/* Test hooks (store_cluster/regress_node_port_taken_at_start): cl_test_candidate, when set,
   gives the ports cl_free_port tries instead of free_port's; cl_test_picked, when set, is
   called with each port chosen for a node just before the node starts (a test takes the
   port or its bus port there, as another process may). */
static int (*cl_test_candidate)(void) __attribute__((unused));
static void (*cl_test_picked)(int node, int port) __attribute__((unused));

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

/* Whether p or its bus port is a port or bus port of a node of c already: a node started
   a moment ago may not have bound its port yet, so free_port can hand it out again. */
static inline bool cl_port_clashes(const struct rcluster *c, int p)
{
    for (int i = 0; i < c->n; i++)
        if (c->port[i] && (p == c->port[i] || p == c->port[i] + 10000 ||
                           p + 10000 == c->port[i]))
            return true;
    return false;
}

/* A free port whose cluster bus port (+10000) is free as well, neither used by c. */
static inline int cl_free_port(const struct rcluster *c)
{
    for (;;) {
        int p = cl_test_candidate ? cl_test_candidate() : free_port();
        if (p > 0 && p + 10000 < 65536 && !cl_port_clashes(c, p) && port_free(p) &&
            port_free(p + 10000))
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

/* The last line of node i's log (what it said before it exited), or "". */
static inline const char *cl_log_tail(const struct rcluster *c, int port, char *buf,
                                      size_t len)
{
    char path[128];
    snprintf(path, sizeof path, "%s/node-%d.log", c->dir, port);
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return buf;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        size_t n = strcspn(line, "\n");
        if (n) {
            n = n < len ? n : len - 1;
            memcpy(buf, line, n);
            buf[n] = 0;
        }
    }
    fclose(f);
    return buf;
}

/* Whether live node i has exited: reaped, its pid cleared, the reason in why. */
static inline bool cl_exited(struct rcluster *c, int i, char *why, size_t len)
{
    int st;
    if (c->pid[i] <= 0 || waitpid(c->pid[i], &st, WNOHANG) != c->pid[i])
        return false;
    c->pid[i] = 0;
    char tail[256];
    snprintf(why, len, "status %d: %s", st, cl_log_tail(c, c->port[i], tail, sizeof tail));
    return true;
}

/* Waits until every live node (pid > 0) says cluster_state:ok, and every replica's link is
   up. No time bound of its own (the test's TH_DEADLINE); a node that exits fails the test
   at once, with its last log line. */
static inline void cl_wait_ok(struct rcluster *c)
{
    for (;;) {
        bool ok = true;
        for (int i = 0; ok && i < c->n; i++)
            if (c->pid[i] > 0)
                ok = cl_says(c->port[i], "CLUSTER INFO", "cluster_state:ok") &&
                     (cl_is_master(c->port[i]) ||
                      cl_says(c->port[i], "INFO replication", "master_link_status:up"));
        if (ok)
            return;
        char why[320];
        for (int i = 0; i < c->n; i++)
            cr_assert(!cl_exited(c, i, why, sizeof why), "node %d (port %d) exited (%s)", i,
                      c->port[i], why);
        usleep(10000);
    }
}

/* Starts node i on c->port[i] (output in its log); does not wait. */
static inline void cl_spawn(struct rcluster *c, int i)
{
    if (cl_test_picked)
        cl_test_picked(i, c->port[i]);
    char port[16], conf[128], log[128];
    snprintf(port, sizeof port, "%d", c->port[i]);
    snprintf(conf, sizeof conf, "%s/nodes-%d.conf", c->dir, c->port[i]);
    snprintf(log, sizeof log, "%s/node-%d.log", c->dir, c->port[i]);
    pid_t me = getpid();
    c->pid[i] = fork();
    cr_assert(c->pid[i] >= 0);
    if (c->pid[i] == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);   /* the test gone: its servers with it */
        if (getppid() != me)
            _exit(127);
        int out = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(out, 1);
        dup2(out, 2);
        execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1",
               "--cluster-enabled", "yes", "--cluster-config-file", conf,
               "--cluster-node-timeout", "1000", "--dir", c->dir, "--save", "",
               "--appendonly", "no", "--requirepass", PASS, "--masterauth", PASS,
               (char *)NULL);
        _exit(127);
    }
}

/* Waits until node i answers as itself (INFO's process_id: not another server that holds
   the port) or exits; false when it exited (reaped, the reason in why). No time bound of
   its own: the test's TH_DEADLINE. */
static inline bool cl_node_up(struct rcluster *c, int i, char *why, size_t len)
{
    char me[32];
    snprintf(me, sizeof me, "process_id:%d\r", (int)c->pid[i]);
    for (;;) {
        if (cl_says(c->port[i], "INFO server", me))
            return true;
        if (cl_exited(c, i, why, len))
            return false;
        usleep(10000);
    }
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
    for (int i = 0; i < c->n; i++) {
        c->port[i] = cl_free_port(c);
        cl_spawn(c, i);
    }
    char cmd[1024];
    int len = snprintf(cmd, sizeof cmd, "redis-cli -a %s --no-auth-warning --cluster create",
                       PASS);
    int ulen = snprintf(c->url, sizeof c->url, "redis-cluster://:%s@", PASS);
    for (int i = 0; i < c->n; i++) {
        char why[320];
        while (!cl_node_up(c, i, why, sizeof why)) {    /* its port taken: a fresh one */
            cr_assert(c->restarts < CL_RESTARTS, "redis-server exited at start %d times; "
                      "node %d, port %d: %s", c->restarts + 1, i, c->port[i], why);
            c->restarts++;
            c->port[i] = cl_free_port(c);
            cl_spawn(c, i);
        }
        redisReply *r = cl_cmd(c->port[i], "CLUSTER MYID");
        cr_assert(r && r->type == REDIS_REPLY_STRING);
        snprintf(c->id[i], sizeof c->id[i], "%s", r->str);
        freeReplyObject(r);
    }
    for (int i = 0; i < c->n; i++) {     /* the ports final: restarted nodes have new ones */
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

/* The index of the replica of master m (INFO replication's master_port), or -1. */
static inline int cl_replica_of(const struct rcluster *c, int m)
{
    char want[32];
    snprintf(want, sizeof want, "master_port:%d\r", c->port[m]);
    for (int i = 0; i < c->n; i++)
        if (i != m && c->pid[i] > 0 && cl_says(c->port[i], "INFO replication", want))
            return i;
    return -1;
}

/* Waits until node i says it is a master (a replica's promotion after its master died);
   no time bound of its own (the test's TH_DEADLINE); its exit fails the test. */
static inline void cl_wait_master(struct rcluster *c, int i)
{
    char why[320];
    while (!cl_is_master(c->port[i])) {
        cr_assert(!cl_exited(c, i, why, sizeof why), "node %d exited (%s)", i, why);
        usleep(10000);
    }
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
