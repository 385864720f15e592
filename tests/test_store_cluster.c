/*
 * tests/test_store_cluster.c: the redis-cluster:// store (docs/api.md "Shared store", issue
 * 36) against a real Redis Cluster started by the test on 127.0.0.1 (tests/cluster_server.h):
 * one context publishes, others attach every byte; the entries spread over every master
 * (each holds at least a sixth); a slot migrated mid-run (ASK while its key is on the
 * importing node, MOVED once the slot is moved) is followed, no wrong byte; a namespace drop
 * removes the keys on every master; a stopped master costs misses and dropped writes, no
 * failed call; a master killed (SIGKILL): no call fails, and after its replica's promotion
 * the entries it had are served again and new ones work; a corrupted value is a counted
 * miss; bad URLs, a wrong password and a seed that is not a cluster node are refused at
 * open; a node whose port or bus port is taken at start is started again on a fresh one.
 */
#include "harness.h"

#include "core/core.h"
#include "store/store.h"
#include "store_server.h"
#include "cluster_server.h"

#define BPT 256u                 /* bytes per token: 16 tokens per 4 KiB page */
#define T   16u
#define NR  2u
#define NB  48u                  /* blocks of the main prompt */

static const struct store_layout LAY = { NR, BPT, KB };

static void cfg_cl(struct kvvm_config *c, const char *url, uint32_t tmo)
{
    th_config(c, KB, NR, BPT, 16, 64 * T, 512, 0, 0);
    c->pool_thread = 0;
    c->store_url = url;
    c->store_timeout_ms = tmo;
}

static void open_cl(struct tctx *t, const char *url)
{
    struct kvvm_config c;
    cfg_cl(&c, url, 2000);
    topen(t, &c);
}

static uint8_t pat(uint32_t lin, uint32_t r, uint64_t off)
{
    return (uint8_t)(lin * 41u + r * 101u + off * 11u + (off >> 9) + 9u);
}

static void keys_of(uint32_t lin, size_t n, kvvm_key *k)
{
    int32_t tok[64 * T];
    for (size_t i = 0; i < n * T; i++)
        tok[i] = (int32_t)(lin * 7919 + i);
    cr_assert_eq(kvvm_prefix_keys(tok, n * T, T, NULL, 0, k, n), n);
}

/* nb blocks of prompt lin, published under ns (all new). */
static void publish(struct tctx *t, uint64_t ns, uint32_t lin, size_t nb, kvvm_key *k)
{
    kvvm_seq s;
    size_t len = nb * T * BPT;
    cr_assert_eq(kvvm_seq_create(t->kv, &s), 0);
    cr_assert_eq(kvvm_seq_grow(t->kv, s, nb * T), 0);
    uint8_t *b = malloc(len);
    for (uint32_t r = 0; r < NR; r++) {
        for (size_t i = 0; i < len; i++)
            b[i] = pat(lin, r, i);
        cr_assert_eq(kvvm_seq_write(t->kv, s, r, 0, b, len), 0);
    }
    free(b);
    keys_of(lin, nb, k);
    cr_assert_eq(kvvm_prefix_publish(t->kv, s, ns, k, nb), (int)nb, "publish: %s",
                 kvvm_last_error());
}

/* Attaches keys[0..n) of prompt lin into a new sequence: the blocks attached (a failed call
   fails the test), every attached byte checked. */
static int attach_check(struct tctx *t, uint64_t ns, uint32_t lin, const kvvm_key *k,
                        size_t n)
{
    kvvm_seq d;
    cr_assert_eq(kvvm_seq_create(t->kv, &d), 0);
    int got = kvvm_prefix_attach(t->kv, d, ns, k, n);
    cr_assert_geq(got, 0, "attach failed: %d %s", got, kvvm_last_error());
    size_t len = (size_t)got * T * BPT;
    uint8_t *b = malloc(len + 1);
    for (uint32_t r = 0; r < NR && len; r++) {
        cr_assert_eq(kvvm_seq_read(t->kv, d, r, 0, b, len), 0);
        for (size_t i = 0; i < len; i++)
            cr_assert_eq(b[i], pat(lin, r, i), "a wrong byte: region %u offset %zu", r, i);
    }
    free(b);
    cr_assert_eq(kvvm_seq_free(t->kv, d), 0);
    return got;
}

static void name_of(uint64_t ns, const kvvm_key *k, char *out)
{
    store_key sk;
    memcpy(sk.bytes, k->bytes, sizeof sk.bytes);
    store_cluster_key(&LAY, ns, &sk, out);
}

/* ---------------------------------------------------------------- URLs */

Test(store_cluster, bad_urls_rejected_with_the_reason)
{
    TH_DEADLINE(20);
    static const char *bad[] = {
        "redis-cluster://", "redis-cluster://:pw@", "redis-cluster://127.0.0.1:1,",
        "redis-cluster://127.0.0.1:1,,127.0.0.1:2", "redis-cluster://127.0.0.1:1/0",
        "redis-cluster://127.0.0.1:99999", "redis-cluster://127.0.0.1:1?x",
        "redis-cluster://:@127.0.0.1:1", "redis-cluster://h%zz:pw@127.0.0.1:1",
        "redis-cluster://[::1]:1",
    };
    kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        struct store *st = NULL;
        cr_expect_eq(store_open(bad[i], 100, 0, &st), -EINVAL, "%s", bad[i]);
        struct kvvm_config c;
        kvvm *kv = NULL;
        cfg_cl(&c, bad[i], 100);
        cr_expect_eq(kvvm_open(&c, &kv), -EINVAL, "kvvm_open %s", bad[i]);
        cr_expect(strstr(kvvm_last_error(), "URL"), "%s: the reason: %s", bad[i],
                  kvvm_last_error());
    }
    kvvm_set_log(NULL, NULL, KVVM_LOG_WARN);
}

/* A seed that is a plain server (no cluster support): -EINVAL at open, said so. */
Test(store_cluster, a_seed_not_in_cluster_mode_is_refused)
{
    TH_DEADLINE(30);
    struct rsrv s = { 0 };
    rsrv_start(&s, NULL);
    char url[160];
    snprintf(url, sizeof url, "redis-cluster://:%s@127.0.0.1:%d", PASS, s.port);
    struct store *st = NULL;
    kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);
    cr_expect_eq(store_open(url, 2000, 0, &st), -EINVAL);
    kvvm_set_log(NULL, NULL, KVVM_LOG_WARN);
    rsrv_stop(&s);
}

/* ---------------------------------------------------------------- starting a cluster */

static int taken_fd[2] = { -1, -1 };
static int taken_port[2];
static int twice_port, candidates;

/* Binds 127.0.0.1:port without SO_REUSEADDR (a redis-server's bind there fails) and without
   listening (a connection there is refused at once). */
static int take_port(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    return fd;
}

/* Another process takes, once each, node 1's bus port and node 2's port between their
   choice and their start. */
static void take_after_pick(int node, int port)
{
    if (node == 1 && taken_fd[0] < 0)
        taken_fd[0] = take_port(taken_port[0] = port + 10000);
    if (node == 2 && taken_fd[1] < 0)
        taken_fd[1] = take_port(taken_port[1] = port);
}

/* free_port's first two answers the same port (node 0's, not bound yet when node 1's is
   chosen), then its own. */
static int same_port_twice(void)
{
    return candidates++ < 2 ? twice_port : free_port();
}

/* test_store_cluster's failover test failed now and then with "redis-server did not answer
   on port ..." after a fixed 10 s: a node had exited at start, its port taken (free_port
   can hand out again a port chosen a moment ago for a node that has not bound it yet, and
   another process may take a port or bus port between its choice and the node's start),
   and the start waited for it a fixed time. Now no port or bus port is chosen twice within
   a cluster, and a node that exits at start is started again on a fresh port. */
Test(store_cluster, regress_node_port_taken_at_start)
{
    TH_DEADLINE(60);
    twice_port = free_port();
    cl_test_candidate = same_port_twice;
    cl_test_picked = take_after_pick;
    struct rcluster c;
    cl_start(&c, 3, 0);
    cl_test_candidate = NULL;
    cl_test_picked = NULL;
    cr_expect_eq(c.restarts, 2, "nodes started again: %d", c.restarts);
    for (int i = 0; i < c.n; i++) {
        for (int j = 0; j < i; j++)
            cr_expect(c.port[i] != c.port[j] && c.port[i] != c.port[j] + 10000 &&
                      c.port[i] + 10000 != c.port[j], "nodes %d and %d: ports %d and %d",
                      j, i, c.port[j], c.port[i]);
        cr_expect(c.port[i] != taken_port[1] && c.port[i] + 10000 != taken_port[0],
                  "node %d on a taken port %d", i, c.port[i]);
        cr_expect(cl_says(c.port[i], "CLUSTER INFO", "cluster_state:ok"), "node %d", i);
    }
    struct tctx a;
    kvvm_key k[4];
    open_cl(&a, c.url);
    publish(&a, 3, 5, 4, k);
    cr_assert_eq(kvvm_sync(a.kv), 0);
    struct kvvm_stats st;
    tstats(&a, &st);
    cr_expect_eq(st.store_puts, 4);
    cr_expect_eq(st.store_errors, 0);
    tclose(&a);
    cl_stop(&c);
    close(taken_fd[0]);
    close(taken_fd[1]);
}

/* ---------------------------------------------------------------- 3 masters */

/* Each master's key count: at least a sixth of total each, total in all. */
static void spread(const struct rcluster *c, long long total)
{
    long long sum = 0;
    for (int i = 0; i < c->n; i++) {
        long long n = cl_int(c->port[i], "DBSIZE");
        cr_assert_geq(n, 0);
        cr_expect_geq(n * 6, total, "master %d holds %lld of %lld keys", i, n, total);
        sum += n;
    }
    cr_expect_eq(sum, total);
}

/* Moves key's slot from node src to dst: importing / migrating, the slot's keys migrated
   (after that, the source answers ASK for them); with done, the slot given to dst on every
   master (the source then answers MOVED). */
static void migrate(const struct rcluster *c, const char *key, int src, int dst, bool done)
{
    unsigned slot = store_cluster_slot(key, strlen(key));
    if (!done) {
        freeReplyObject(cl_cmd(c->port[dst], "CLUSTER SETSLOT %u IMPORTING %s", slot,
                               c->id[src]));
        freeReplyObject(cl_cmd(c->port[src], "CLUSTER SETSLOT %u MIGRATING %s", slot,
                               c->id[dst]));
        redisReply *ks = cl_cmd(c->port[src], "CLUSTER GETKEYSINSLOT %u 100", slot);
        cr_assert(ks && ks->type == REDIS_REPLY_ARRAY && ks->elements >= 1);
        for (size_t i = 0; i < ks->elements; i++) {
            redisReply *m = cl_cmd(c->port[src], "MIGRATE 127.0.0.1 %d %s 0 5000 AUTH %s",
                                   c->port[dst], ks->element[i]->str, PASS);
            cr_assert(m && m->type == REDIS_REPLY_STATUS, "MIGRATE: %s", m ? m->str : "-");
            freeReplyObject(m);
        }
        freeReplyObject(ks);
        redisReply *r = cl_cmd(c->port[src], "GET %s", key);
        cr_assert(r && r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "ASK ", 4),
                  "the source does not answer ASK: %s", r ? r->str : "-");
        freeReplyObject(r);
        return;
    }
    for (int i = 0; i < c->n; i++)
        freeReplyObject(cl_cmd(c->port[i], "CLUSTER SETSLOT %u NODE %s", slot, c->id[dst]));
    redisReply *r = cl_cmd(c->port[src], "GET %s", key);
    cr_assert(r && r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "MOVED ", 6),
              "the source does not answer MOVED: %s", r ? r->str : "-");
    freeReplyObject(r);
}

Test(store_cluster, publish_attach_spread_reshard_drop)
{
    TH_DEADLINE(60);
    struct rcluster c;
    cl_start(&c, 3, 0);
    struct store *st = NULL;
    char bad[512];
    snprintf(bad, sizeof bad, "redis-cluster://:wrong@127.0.0.1:%d", c.port[0]);
    kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);
    cr_expect_eq(store_open(bad, 20000, 0, &st), -EACCES, "a wrong password");
    kvvm_set_log(NULL, NULL, KVVM_LOG_WARN);

    kvvm_key k[NB];
    struct tctx a, b, d;
    open_cl(&a, c.url);
    publish(&a, 7, 1, NB, k);
    cr_assert_eq(kvvm_sync(a.kv), 0);
    struct kvvm_stats s;
    tstats(&a, &s);
    cr_expect_eq(s.store_puts, NB);
    cr_expect_eq(s.store_errors, 0);
    spread(&c, NB);

    /* another context: lookup (its map read now), attach every byte */
    open_cl(&b, c.url);
    uint8_t where[NB];
    cr_expect_eq(kvvm_prefix_lookup(b.kv, 7, k, NB, where), (int)NB);
    open_cl(&d, c.url);
    cr_expect_eq(attach_check(&d, 7, 1, k, NB), (int)NB);
    tclose(&d);

    /* a slot migrating: its key on the importing node, the source answering ASK */
    char key[STORE_NAME_MAX];
    name_of(7, &k[5], key);
    int src = cl_holder(&c, key), dst = (src + 1) % c.n;
    cr_assert_geq(src, 0);
    migrate(&c, key, src, dst, false);
    open_cl(&d, c.url);
    cr_expect_eq(attach_check(&d, 7, 1, k, 6), 6, "ASK not followed");
    tclose(&d);
    /* the slot moved: b's map is stale, the source answers MOVED */
    migrate(&c, key, src, dst, true);
    cr_expect_eq(attach_check(&b, 7, 1, k, NB), (int)NB, "MOVED not followed");
    tclose(&b);

    /* a corrupted value: a counted miss, the attach stops before it */
    name_of(7, &k[10], key);
    int h = cl_holder(&c, key);
    cr_assert_geq(h, 0);
    freeReplyObject(cl_cmd(c.port[h], "SETRANGE %s 200 corrupt", key));
    open_cl(&d, c.url);
    cr_expect_eq(attach_check(&d, 7, 1, k, NB), 10);
    tstats(&d, &s);
    cr_expect_eq(s.store_errors, 1, "store_errors %llu", (unsigned long long)s.store_errors);
    tclose(&d);

    /* a namespace drop: every master */
    cr_assert_geq(kvvm_prefix_drop(a.kv, 7, NULL, 0), 0);
    for (int i = 0; i < c.n; i++)
        cr_expect_eq(cl_int(c.port[i], "DBSIZE"), 0, "master %d keeps keys", i);

    /* a stopped master: publishes drop (bounded queue), lookups answer, nothing fails */
    struct kvvm_config cf;
    cfg_cl(&cf, c.url, 200);
    cf.store_queue_bytes = 4 * NR * KB;
    open_cl(&b, c.url);
    publish(&b, 8, 2, 8, k);
    cr_assert_eq(kvvm_sync(b.kv), 0);
    tclose(&b);
    topen(&d, &cf);
    kill(c.pid[0], SIGSTOP);
    kvvm_key j[16];
    for (uint32_t r = 0; r < 4; r++)
        publish(&d, 9, 10 + r, 16, j);
    tstats(&d, &s);
    cr_expect_gt(s.store_dropped, 0, "nothing dropped past the bound");
    int got = kvvm_prefix_lookup(d.kv, 8, k, 8, NULL);
    cr_expect_geq(got, 0);
    cr_expect_geq(attach_check(&d, 8, 2, k, 8), 0);
    kill(c.pid[0], SIGCONT);
    cr_assert_eq(kvvm_sync(d.kv), 0);
    tclose(&d);
    tclose(&a);
    cl_stop(&c);
}

/* ---------------------------------------------------------------- failover */

static long long dbsize_sum(const struct rcluster *c, bool masters)
{
    long long sum = 0;
    for (int i = 0; i < c->n; i++)
        if (c->pid[i] > 0 && cl_is_master(c->port[i]) == masters)
            sum += cl_int(c->port[i], "DBSIZE");
    return sum;
}

/* Whether a live node of was[] (the masters before the kill: not a replica promoted since)
   owns the entry's slot (EXISTS answers with an integer there, MOVED elsewhere): counts it
   in *owned, and in *there when it exists. */
static void live_owner(const struct rcluster *c, const bool *was, uint64_t ns,
                       const kvvm_key *k, int *owned, int *there)
{
    char key[STORE_NAME_MAX];
    name_of(ns, k, key);
    for (int i = 0; i < c->n; i++) {
        if (c->pid[i] <= 0 || !was[i])
            continue;
        redisReply *r = cl_cmd(c->port[i], "EXISTS %s", key);
        if (r && r->type == REDIS_REPLY_INTEGER) {
            *owned += 1;
            *there += r->integer == 1;
            freeReplyObject(r);
            return;
        }
        if (r)
            freeReplyObject(r);
    }
}

Test(store_cluster, master_killed_calls_succeed_replica_serves_after_failover)
{
    TH_DEADLINE(90);
    struct rcluster c;
    cl_start(&c, 3, 1);
    kvvm_key k[24], j[8];
    struct tctx a, b;
    open_cl(&a, c.url);
    publish(&a, 5, 2, 24, k);
    cr_assert_eq(kvvm_sync(a.kv), 0);
    while (dbsize_sum(&c, false) != 24)   /* until the replicas have them all (deadline) */
        usleep(10000);
    char key[STORE_NAME_MAX];
    name_of(5, &k[3], key);
    int victim = cl_holder(&c, key);
    cr_assert_geq(victim, 0);
    bool was[CL_MAX];
    for (int i = 0; i < c.n; i++)
        was[i] = cl_is_master(c.port[i]);
    int heir = cl_replica_of(&c, victim);
    cr_assert_geq(heir, 0, "master %d has no replica", victim);
    cl_kill(&c, victim);

    /* down: no call fails, what is attached is right */
    open_cl(&b, c.url);
    int got = kvvm_prefix_lookup(b.kv, 5, k, 24, NULL);
    cr_expect(got >= 0 && got < 24, "lookup: %d", got);
    cr_expect_lt(attach_check(&b, 5, 2, k, 24), 24);
    /* regress/a_master_down_gave_up_the_writes_queued_for_the_others: writes go on for the
       masters that answer: six batches queued back to back, each with entries for the dead
       master; none gives up the others queued behind it (before the fix, a put with any
       item failed for a down node gave up every batch queued behind it) */
    kvvm_key w[6][8];
    for (uint32_t r = 0; r < 6; r++)
        publish(&a, 5, 30 + r, 8, w[r]);
    cr_assert_eq(kvvm_sync(a.kv), 0);
    int owned = 0, there = 0;
    for (uint32_t r = 0; r < 6; r++)
        for (int i = 0; i < 8; i++)
            live_owner(&c, was, 5, &w[r][i], &owned, &there);
    cr_expect_gt(owned, 0);
    cr_expect_eq(there, owned, "%d of the %d entries for the live masters were written",
                 there, owned);
    tclose(&b);

    /* the replica promoted: its entries served again, new ones work (waited for: the
       promotion, then cluster_state:ok everywhere; right after the kill the others may
       still say ok, not having noticed yet) */
    cl_wait_master(&c, heir);
    cl_wait_ok(&c);
    open_cl(&b, c.url);
    cr_expect_eq(attach_check(&b, 5, 2, k, 24), 24, "the promoted replica's entries");
    tclose(&b);
    publish(&a, 6, 4, 8, j);
    cr_assert_eq(kvvm_sync(a.kv), 0);
    open_cl(&b, c.url);
    cr_expect_eq(attach_check(&b, 6, 4, j, 8), 8, "new entries after the failover");
    tclose(&b);
    tclose(&a);
    cl_stop(&c);
}
