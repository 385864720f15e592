/*
 * tests/test_store.c: the shared store layer (store/store.h) against real parts: a real
 * redis-server started on 127.0.0.1 at a free port (a temporary directory, --save '', a
 * password), stopped at the end of each test; and a real directory under /var/tmp for the
 * file backend. Fault tests stop the server (SIGSTOP), kill and restart it, fill it
 * (maxmemory), corrupt its values with another client, refuse the password, and open the
 * store while it is down. Where redis-server is not installed (scripts/install-deps.sh
 * installs it) the Redis tests skip with the reason.
 */
#include "harness.h"

#include <fcntl.h>
#include <hiredis.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"
#include "store/store.h"
#include "store_server.h"

/* ------------------------------------------------------------------ entries */

static const struct store_layout L1 = { 2, 512, 4096 }, L2 = { 2, 512, 8192 };

static store_key key_of(uint64_t i)
{
    store_key k;
    for (int b = 0; b < 32; b++)
        k.bytes[b] = (uint8_t)(i * 131 + (uint64_t)b * 7 + (i >> 8));
    memcpy(k.bytes, &i, sizeof i);
    return k;
}

/* The payload of entry i: len bytes of a pattern that differs per entry and offset. */
static void fill(uint8_t *p, size_t len, uint64_t i)
{
    for (size_t o = 0; o < len; o++)
        p[o] = (uint8_t)((o * 2654435761u) >> 13 ^ i * 97);
}

/* n entries of two iovecs each (the two "regions" of a block). */
struct batch {
    size_t n, half;
    store_key *keys;
    uint8_t *bytes;              /* n * 2 * half */
    struct iovec *iov;           /* 2 per item */
    struct store_item *items;
};

static void batch_make(struct batch *b, size_t n, size_t half, uint64_t first)
{
    b->n = n;
    b->half = half;
    b->keys = calloc(n, sizeof *b->keys);
    b->bytes = malloc(n * 2 * half);
    b->iov = calloc(2 * n, sizeof *b->iov);
    b->items = calloc(n, sizeof *b->items);
    cr_assert(b->keys && b->bytes && b->iov && b->items);
    for (size_t i = 0; i < n; i++) {
        b->keys[i] = key_of(first + i);
        fill(b->bytes + i * 2 * half, 2 * half, first + i);
        b->iov[2 * i] = (struct iovec){ b->bytes + i * 2 * half, half };
        b->iov[2 * i + 1] = (struct iovec){ b->bytes + i * 2 * half + half, half };
        b->items[i] = (struct store_item){ &b->keys[i], &b->iov[2 * i], 2, 1 };
    }
}

/* The same keys, with zeroed buffers to read into. */
static void batch_blank(struct batch *dst, const struct batch *src)
{
    batch_make(dst, src->n, src->half, 0);
    for (size_t i = 0; i < src->n; i++)
        dst->keys[i] = src->keys[i];
    memset(dst->bytes, 0xaa, src->n * 2 * src->half);
}

static void batch_free(struct batch *b)
{
    free(b->keys);
    free(b->bytes);
    free(b->iov);
    free(b->items);
}

/* A batch to write and one of the same keys to read into. */
static void pair_make(struct batch *w, struct batch *r, size_t n, size_t half, uint64_t first)
{
    batch_make(w, n, half, first);
    batch_blank(r, w);
}

static void pair_free(struct batch *w, struct batch *r)
{
    batch_free(w);
    batch_free(r);
}

/* Repeats a put (or a get) of n items until all succeed, for up to 2 s: the store comes
   back by itself. Returns the last count. */
static int retry_all(struct store *st, int put, uint64_t ns, struct store_item *items,
                     size_t n)
{
    int got = 0;
    for (int i = 0; i < 100 && got != (int)n; i++) {
        got = put ? store_put(st, &L1, ns, items, n) : store_get(st, &L1, ns, items, n);
        if (got != (int)n)
            usleep(20000);
    }
    return got;
}

static void expect_same(const struct batch *a, const struct batch *b, size_t i)
{
    cr_expect(!memcmp(a->bytes + i * 2 * a->half, b->bytes + i * 2 * b->half, 2 * a->half),
              "entry %zu: the bytes read differ from the bytes written", i);
}

static struct store *sopen(const char *url, uint32_t timeout_ms)
{
    struct store *st = NULL;
    int rc = store_open(url, timeout_ms, 0, &st);
    cr_assert_eq(rc, 0, "store_open(%s): %d", url, rc);
    return st;
}

/* A server and a store on it. */
static struct store *redis_up(struct rsrv *s, uint32_t timeout_ms)
{
    rsrv_start(s, NULL);
    return sopen(s->url, timeout_ms);
}

static struct store_stats sstats(struct store *st)
{
    struct store_stats s;
    store_stats_get(st, &s);
    return s;
}

/* Log capture: the last warning or info line of the library. */
static char logged[4096];
static void log_cap(int level, const char *msg, void *arg)
{
    (void)level;
    (void)arg;
    size_t l = strlen(logged);
    snprintf(logged + l, sizeof logged - l, "%s\n", msg);
}

/* ------------------------------------------------------------------ both backends */

/* Put n entries, get them back byte for byte; the counters follow. */
static void round_trip(const char *url)
{
    struct store *st = sopen(url, 2000);
    struct batch w, r;
    pair_make(&w, &r, 16, 4096, 100);
    cr_assert_eq(store_put(st, &L1, 7, w.items, w.n), 16);
    for (size_t i = 0; i < w.n; i++)
        cr_expect_eq(w.items[i].status, 0);
    cr_assert_eq(store_get(st, &L1, 7, r.items, r.n), 16);
    for (size_t i = 0; i < r.n; i++) {
        cr_expect_eq(r.items[i].status, 0, "get %zu: %d", i, r.items[i].status);
        expect_same(&w, &r, i);
    }
    struct store_stats s = sstats(st);
    cr_expect_eq(s.puts, 16);
    cr_expect_eq(s.gets, 16);
    cr_expect_eq(s.errors, 0);
    cr_expect_eq(s.bytes_out, 16 * (STORE_HDR_BYTES + 8192));
    cr_expect_geq(s.bytes_in, 16 * (STORE_HDR_BYTES + 8192));
    /* a miss is not an error */
    store_key other = key_of(999);
    struct iovec io = { r.bytes, 8192 };
    struct store_item miss = { &other, &io, 1, 1 };
    cr_expect_eq(store_get(st, &L1, 7, &miss, 1), 0);
    cr_expect_eq(miss.status, -ENOENT);
    cr_expect_eq(sstats(st).errors, 0);
    pair_free(&w, &r);
    store_close(st);
}

/* lookup of n keys: which exist, in one call; hits counted. */
static void lookup_n(const char *url)
{
    struct store *st = sopen(url, 2000);
    struct batch w;
    batch_make(&w, 10, 1024, 0);
    struct store_item even[5];
    for (size_t i = 0; i < 5; i++)
        even[i] = w.items[2 * i];
    cr_assert_eq(store_put(st, &L1, 1, even, 5), 5);
    uint8_t present[10];
    cr_assert_eq(store_lookup(st, &L1, 1, w.keys, 10, present), 5);
    for (size_t i = 0; i < 10; i++)
        cr_expect_eq(present[i], i % 2 == 0, "key %zu present %u", i, present[i]);
    cr_expect_eq(sstats(st).hits, 5);
    cr_expect_eq(store_lookup(st, &L1, 1, w.keys, 0, present), 0);
    batch_free(&w);
    store_close(st);
}

/* Another namespace or another layout never sees an entry; delete_ns removes only its own,
   delete removes the keys named. */
static void isolated(const char *url)
{
    struct store *st = sopen(url, 2000);
    struct batch a, b, r;
    batch_make(&a, 4, 2048, 0);
    batch_make(&b, 4, 2048, 0);          /* the same keys */
    batch_blank(&r, &a);
    cr_assert_eq(store_put(st, &L1, 1, a.items, 4), 4);
    cr_assert_eq(store_put(st, &L1, 2, b.items, 4), 4);
    uint8_t present[4];
    cr_expect_eq(store_lookup(st, &L1, 3, a.keys, 4, present), 0, "another namespace");
    cr_expect_eq(store_lookup(st, &L2, 1, a.keys, 4, present), 0, "another layout");
    struct store_layout L3 = L1;
    L3.n_regions = 4;
    cr_expect_eq(store_lookup(st, &L3, 1, a.keys, 4, present), 0, "another n_regions");
    L3 = L1;
    L3.bytes_per_token = 256;
    cr_expect_eq(store_lookup(st, &L3, 1, a.keys, 4, present), 0, "another bytes_per_token");
    cr_expect_eq(store_get(st, &L2, 1, r.items, 4), 0);
    for (size_t i = 0; i < 4; i++)
        cr_expect_eq(r.items[i].status, -ENOENT);
    cr_expect_eq(store_get(st, &L1, 3, r.items, 4), 0);
    /* delete by key list: 2 of ns 1 */
    cr_expect_eq(store_delete(st, &L1, 1, a.keys, 2), 2);
    cr_expect_eq(store_lookup(st, &L1, 1, a.keys, 4, present), 2);
    cr_expect(!present[0] && !present[1] && present[2] && present[3]);
    /* delete by namespace: ns 1 only */
    cr_expect_eq(store_delete_ns(st, &L1, 1), 2);
    cr_expect_eq(store_lookup(st, &L1, 1, a.keys, 4, present), 0);
    cr_expect_eq(store_lookup(st, &L1, 2, a.keys, 4, present), 4, "ns 2 kept");
    cr_expect_eq(store_delete_ns(st, NULL, 2), 4, "every layout of ns 2");
    cr_expect_eq(store_lookup(st, &L1, 2, a.keys, 4, present), 0);
    batch_free(&a);
    batch_free(&b);
    batch_free(&r);
    store_close(st);
}

/* A reader expecting another length gets -EBADMSG (counted), and its buffers untouched. */
static void wrong_length(const char *url)
{
    struct store *st = sopen(url, 2000);
    struct batch w;
    batch_make(&w, 1, 4096, 5);
    cr_assert_eq(store_put(st, &L1, 1, w.items, 1), 1);
    uint8_t buf[4096];
    memset(buf, 0x55, sizeof buf);
    struct iovec io = { buf, sizeof buf };
    struct store_item it = { &w.keys[0], &io, 1, 1 };
    cr_expect_eq(store_get(st, &L1, 1, &it, 1), 0);
    cr_expect_eq(it.status, -EBADMSG);
    cr_expect_eq(sstats(st).errors, 1);
    for (size_t i = 0; i < sizeof buf; i++)
        cr_assert_eq(buf[i], 0x55, "byte %zu of a refused value was written", i);
    batch_free(&w);
    store_close(st);
}

/* Two processes: a child opens its own store and puts; the parent gets every byte. */
static void two_processes(const char *url)
{
    struct batch w, r;
    pair_make(&w, &r, 12, 8192, 4000);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        struct store *st = NULL;
        int ok = store_open(url, 2000, 0, &st) == 0 &&
                 store_put(st, &L1, 9, w.items, w.n) == (int)w.n;
        store_close(st);
        _exit(ok ? 0 : 1);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child's puts failed");
    struct store *st = sopen(url, 2000);
    cr_assert_eq(store_get(st, &L1, 9, r.items, r.n), (int)r.n);
    for (size_t i = 0; i < r.n; i++)
        expect_same(&w, &r, i);
    pair_free(&w, &r);
    store_close(st);
}

/* A get in two halves (store_get_start, store_get_first, store_get_finish): the first
   item's outcome is known before the finish (1 a hit, 0 a miss), the finish returns what a
   store_get does and the bytes are right; the lane is free again after it (a plain get
   works); the counters count it once. */
static void two_halves(const char *url)
{
    struct store *st = sopen(url, 2000);
    struct batch w, r, m;
    pair_make(&w, &r, 16, 4096, 300);
    cr_assert_eq(store_put(st, &L1, 7, w.items, w.n), 16);
    struct store_getreq rq;
    store_get_start(st, &L1, 7, r.items, r.n, NULL, &rq);
    int first = store_get_first(&rq);
    cr_expect_eq(first, 1, "the first item of a batch of hits: %d", first);
    cr_expect_eq(store_get_finish(&rq), 16);
    for (size_t i = 0; i < r.n; i++) {
        cr_expect_eq(r.items[i].status, 0, "get %zu: %d", i, r.items[i].status);
        expect_same(&w, &r, i);
    }
    batch_make(&m, 4, 4096, 900);                /* never written */
    store_get_start(st, &L1, 7, m.items, m.n, NULL, &rq);
    cr_expect_eq(store_get_first(&rq), 0, "a miss reported as a hit");
    cr_expect_eq(store_get_finish(&rq), 0);
    for (size_t i = 0; i < m.n; i++)
        cr_expect_eq(m.items[i].status, -ENOENT);
    cr_expect_eq(store_get(st, &L1, 7, r.items, r.n), 16, "the lane was left locked");
    struct store_stats s = sstats(st);
    cr_expect_eq(s.gets, 32);
    cr_expect_eq(s.errors, 0);
    batch_free(&m);
    pair_free(&w, &r);
    store_close(st);
}

#define BOTH(name, fn) STORE_BOTH(store_redis, store_file, 30, name, fn)

BOTH(put_get_round_trip, round_trip)
BOTH(lookup_of_n_keys, lookup_n)
BOTH(namespaces_and_layouts_isolated, isolated)
BOTH(other_length_is_a_counted_miss, wrong_length)
BOTH(two_processes_share_entries, two_processes)
BOTH(get_in_two_halves_first_outcome_then_all, two_halves)

/* ------------------------------------------------------------------ Redis faults */

/* Another client flips a payload byte: the get is a miss, counted; the other item is read
   whole. (The corrupt value's buffer may have been written: a get receives a value straight
   into the caller's buffers and checks it there, as store.h says; that it never reaches a
   sequence is test_prefix_store's corrupted_value_is_a_counted_miss.) */
Test(store_redis, corrupted_value_is_a_counted_miss)
{
    TH_DEADLINE(30);
    struct rsrv s = { 0 };
    struct store *st = redis_up(&s, 2000);
    struct batch w, r;
    pair_make(&w, &r, 2, 4096, 1);
    cr_assert_eq(store_put(st, &L1, 4, w.items, 2), 2);
    char name[STORE_NAME_MAX];
    store_redis_key(&L1, 4, &w.keys[0], name);
    redisContext *c = raw_connect(s.port);
    cr_assert(c);
    redisReply *v = redisCommand(c, "GET %s", name);
    cr_assert(v && v->type == REDIS_REPLY_STRING && v->len == STORE_HDR_BYTES + 8192);
    v->str[STORE_HDR_BYTES + 5000] ^= 1;
    freeReplyObject(redisCommand(c, "SET %s %b", name, v->str, (size_t)v->len));
    freeReplyObject(v);
    redisFree(c);
    cr_expect_eq(store_get(st, &L1, 4, r.items, 2), 1);
    cr_expect_eq(r.items[0].status, -EBADMSG);
    cr_expect_eq(r.items[1].status, 0);
    expect_same(&w, &r, 1);
    cr_expect_eq(sstats(st).errors, 1);
    cr_expect_eq(sstats(st).gets, 1);
    pair_free(&w, &r);
    store_close(st);
    rsrv_stop(&s);
}

/* Values larger than a receive (1 MiB, two iovecs each) and an error reply in the middle of
   the pipeline (another client made one name a list: WRONGTYPE): each item gets its own
   status, the others every byte, and the connection serves the next batch. */
Test(store_redis, large_values_and_an_error_reply_in_one_batch)
{
    TH_DEADLINE(60);
    struct rsrv s = { 0 };
    struct store *st = redis_up(&s, 5000);
    struct batch w, r;
    pair_make(&w, &r, 4, 512u << 10, 700);
    cr_assert_eq(store_put(st, &L1, 6, w.items, 4), 4);
    char name[STORE_NAME_MAX];
    store_redis_key(&L1, 6, &w.keys[2], name);
    redisContext *c = raw_connect(s.port);
    cr_assert(c);
    freeReplyObject(redisCommand(c, "DEL %s", name));
    freeReplyObject(redisCommand(c, "RPUSH %s x", name));
    redisFree(c);
    for (int round = 0; round < 2; round++) {
        memset(r.bytes, 0, 4 * 2 * r.half);
        cr_expect_eq(store_get(st, &L1, 6, r.items, 4), 3, "round %d", round);
        cr_expect_eq(r.items[2].status, -EIO);
        for (size_t i = 0; i < 4; i++)
            if (i != 2) {
                cr_expect_eq(r.items[i].status, 0, "item %zu", i);
                expect_same(&w, &r, i);
            }
    }
    cr_expect_eq(sstats(st).gets, 6);
    pair_free(&w, &r);
    store_close(st);
    rsrv_stop(&s);
}

/* A value copied under another entry's name (another key in its header) is refused. */
Test(store_redis, value_under_another_name_is_a_counted_miss)
{
    TH_DEADLINE(30);
    struct rsrv s = { 0 };
    struct store *st = redis_up(&s, 2000);
    struct batch w, r;
    pair_make(&w, &r, 2, 4096, 1);
    cr_assert_eq(store_put(st, &L1, 4, w.items, 2), 2);
    char n0[STORE_NAME_MAX], n1[STORE_NAME_MAX];
    store_redis_key(&L1, 4, &w.keys[0], n0);
    store_redis_key(&L1, 4, &w.keys[1], n1);
    redisContext *c = raw_connect(s.port);
    cr_assert(c);
    freeReplyObject(redisCommand(c, "COPY %s %s REPLACE", n1, n0));
    redisFree(c);
    cr_expect_eq(store_get(st, &L1, 4, r.items, 2), 1);
    cr_expect_eq(r.items[0].status, -EBADMSG);
    cr_expect_eq(sstats(st).errors, 1);
    pair_free(&w, &r);
    store_close(st);
    rsrv_stop(&s);
}

/* Whether process pid is gone: none, or a zombie its new parent has not reaped yet. */
static bool proc_gone(pid_t pid)
{
    char path[64], st[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return true;
    size_t n = fread(st, 1, sizeof st - 1, f);
    fclose(f);
    st[n] = 0;
    const char *e = strrchr(st, ')');      /* "pid (comm) S ...": the state after the name */
    return !e || e[1] == 0 || e[2] == 'Z';
}

/* A test that failed an assertion before rsrv_stop left its redis-server running for good
   (seen after a loaded run: one from a timed-out setup, reparented to init, an hour later).
   The server now dies with the process that started it. */
Test(store_redis, regress_redis_server_outlived_a_failed_test)
{
    TH_DEADLINE(120);
    if (system("command -v redis-server >/dev/null 2>&1") != 0)
        cr_skip_test("redis-server is not installed (scripts/install-deps.sh installs it)");
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t child = fork();
    cr_assert_geq(child, 0);
    if (child == 0) {                   /* a test ending without its rsrv_stop */
        struct rsrv s = { 0 };
        rsrv_start(&s, NULL);
        _exit(write(p[1], &s, sizeof s) == (ssize_t)sizeof s ? 1 : 2);
    }
    close(p[1]);
    struct rsrv s;
    ssize_t got = read(p[0], &s, sizeof s);
    close(p[0]);
    int st;
    cr_assert_eq(waitpid(child, &st, 0), child);
    cr_assert_eq(got, (ssize_t)sizeof s, "the child started no redis-server (status %d)", st);
    while (!proc_gone(s.pid))           /* until it is gone: however slow the machine */
        usleep(10000);
    s.pid = 0;                          /* not ours to kill or reap: its directory only */
    rsrv_stop(&s);
}

Test(store_redis, wrong_password_is_eacces)
{
    TH_DEADLINE(30);
    struct rsrv s = { 0 };
    rsrv_start(&s, NULL);
    char url[128];
    struct store *st = NULL;
    snprintf(url, sizeof url, "redis://:wrong@127.0.0.1:%d", s.port);
    cr_expect_eq(store_open(url, 20000, 0, &st), -EACCES);
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", s.port);
    cr_expect_eq(store_open(url, 20000, 0, &st), -EACCES, "no password for a server needing one");
    snprintf(url, sizeof url, "redis://nobody:%s@127.0.0.1:%d", PASS, s.port);
    cr_expect_eq(store_open(url, 20000, 0, &st), -EACCES, "an unknown ACL user");
    snprintf(url, sizeof url, "redis://:%s@127.0.0.1:%d/999", PASS, s.port);
    cr_expect_eq(store_open(url, 20000, 0, &st), -EINVAL, "a database the server lacks");
    snprintf(url, sizeof url, "redis://default:%s@127.0.0.1:%d/3", PASS, s.port);
    cr_expect_eq(store_open(url, 20000, 0, &st), 0, "user default, db 3");
    store_close(st);
    rsrv_stop(&s);
}

Test(store, malformed_urls_are_einval)
{
    TH_DEADLINE(30);
    static const char *const bad[] = {
        "", "redis://", "redis://:@127.0.0.1:1", "redis://127.0.0.1:0",
        "redis://127.0.0.1:99999", "redis://127.0.0.1:port", "redis://127.0.0.1:1/db",
        "http://127.0.0.1", "file://relative/dir", "file:", "file://", "redis://pw@h:1",
        "redis://[::1]:6379", "redis://h:1?x=1", "redis://:p%zz@h:1", "rediss://h:1",
        "file:///tmp?x", "redis://h o:1",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        struct store *st = NULL;
        cr_expect_eq(store_open(bad[i], 100, 0, &st), -EINVAL, "%s", bad[i]);
    }
    struct store *st;
    cr_expect_eq(store_open(NULL, 100, 0, &st), -EINVAL);
}

/* Down at open: the open succeeds (logged), requests fail fast and are counted, and once a
   server is there the store reconnects by itself. */
Test(store_redis, down_at_open_then_reconnects)
{
    TH_DEADLINE(30);
    struct rsrv s = { .port = free_port() };
    char url[128];
    snprintf(url, sizeof url, "redis://:%s@127.0.0.1:%d", PASS, s.port);
    logged[0] = 0;
    kvvm_set_log(log_cap, NULL, KVVM_LOG_INFO);
    struct store *st = sopen(url, 500);
    cr_expect(strstr(logged, "unavailable"), "log: %s", logged);
    struct batch w, r;
    pair_make(&w, &r, 4, 1024, 0);
    uint64_t t0 = now_ns();
    cr_expect_eq(store_put(st, &L1, 1, w.items, 4), 0);
    cr_expect_eq(store_get(st, &L1, 1, r.items, 4), 0);
    cr_expect_leq(ms_since(t0), 3 * 500, "failing requests took %llu ms",
                  (unsigned long long)ms_since(t0));
    for (size_t i = 0; i < 4; i++)
        cr_expect(w.items[i].status == -ENOTCONN || w.items[i].status == -ETIMEDOUT,
                  "status %d", w.items[i].status);
    cr_expect_eq(sstats(st).errors, 8);
    cr_expect(store_lookup(st, &L1, 1, w.keys, 4, NULL) < 0);
    rsrv_start(&s, NULL);
    cr_expect_eq(retry_all(st, 1, 1, w.items, 4), 4, "the store did not come back");
    cr_expect_eq(store_get(st, &L1, 1, r.items, 4), 4);
    cr_expect(strstr(logged, "is back"), "log: %s", logged);
    pair_free(&w, &r);
    store_close(st);
    rsrv_stop(&s);
    kvvm_set_log(NULL, NULL, KVVM_LOG_WARN);
}

/* A stopped server (SIGSTOP): every call returns within its timeout (bound 3x against
   timing flakes), fails and is counted; after SIGCONT the store works again. */
Test(store_redis, stopped_server_calls_return_in_time)
{
    TH_DEADLINE(30);
    struct rsrv s = { 0 };
    rsrv_start(&s, NULL);
    const uint32_t tmo = 250;
    struct store *st = sopen(s.url, tmo);
    struct batch w, r;
    pair_make(&w, &r, 8, 64 << 10, 0);
    cr_assert_eq(store_put(st, &L1, 1, w.items, 8), 8);
    kill(s.pid, SIGSTOP);
    uint64_t worst = 0;
    for (int round = 0; round < 6; round++) {
        uint64_t t0 = now_ns();
        int rc = round % 3 == 0 ? store_put(st, &L1, 1, w.items, 8)
               : round % 3 == 1 ? store_get(st, &L1, 1, r.items, 8)
                                : store_lookup(st, &L1, 1, w.keys, 8, NULL);
        uint64_t ms = ms_since(t0);
        worst = ms > worst ? ms : worst;
        cr_expect(rc <= 0, "round %d: %d", round, rc);
        usleep(100000);              /* past the backoff: the next call tries to reconnect */
    }
    cr_expect_leq(worst, 3 * tmo, "a call took %llu ms with a %u ms timeout",
                  (unsigned long long)worst, tmo);
    cr_expect_geq(sstats(st).errors, 6);
    kill(s.pid, SIGCONT);
    cr_expect_eq(retry_all(st, 0, 1, r.items, 8), 8, "the store did not recover after SIGCONT");
    for (size_t i = 0; i < 8; i++)
        expect_same(&w, &r, i);
    pair_free(&w, &r);
    store_close(st);
    rsrv_stop(&s);
}

/* A fake server: PING's +PONG on the store's two connections (the front lane's at open, the
   read lane's at its first request), then on the second, for the GETs, a value of another
   length than asked (read and dropped: a miss) and the start of a second one, and then
   nothing until the test ends (a stall). */
struct stall_srv {
    int lfd, stop[2];
};

static void *stall_run(void *arg)
{
    struct stall_srv *s = arg;
    static char val[3 * 1024];
    char buf[4096];
    int fd[2] = { -1, -1 }, ok = 1;
    memset(val, 'x', sizeof val);
    for (int c = 0; c < 2 && ok; c++) {
        fd[c] = accept(s->lfd, NULL, NULL);
        ok = fd[c] >= 0 && read(fd[c], buf, sizeof buf) > 0 && write(fd[c], "+PONG\r\n", 7) == 7;
    }
    if (ok && read(fd[1], buf, sizeof buf) > 0 && write(fd[1], "$1000\r\n", 7) == 7 &&
        write(fd[1], val, 1000) == 1000 && write(fd[1], "\r\n", 2) == 2) {
        char line[32];
        int n = snprintf(line, sizeof line, "$%d\r\n", STORE_HDR_BYTES + 8192);
        if (write(fd[1], line, (size_t)n) == n)
            (void)!write(fd[1], val, sizeof val);         /* part of the value: the stall */
    }
    (void)!read(s->stop[0], buf, 1);                     /* until the test ends */
    for (int c = 0; c < 2; c++)
        if (fd[c] >= 0)
            close(fd[c]);
    return NULL;
}

/* A server that stops in the middle of a get batch's replies, after the stream began (the
   wait then spins awake for a while before it sleeps: g_await): the call still returns
   within its timeout, the dropped value a miss, the rest timed out, all counted. */
Test(store_redis, stall_mid_stream_returns_in_time)
{
    TH_DEADLINE(30);
    struct stall_srv s;
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t alen = sizeof a;
    s.lfd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert(s.lfd >= 0 && pipe(s.stop) == 0);
    cr_assert_eq(bind(s.lfd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(s.lfd, 1), 0);
    cr_assert_eq(getsockname(s.lfd, (struct sockaddr *)&a, &alen), 0);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, stall_run, &s), 0);
    char url[64];
    snprintf(url, sizeof url, "redis://127.0.0.1:%d", ntohs(a.sin_port));
    const uint32_t tmo = 300;
    struct store *st = sopen(url, tmo);
    struct batch w, r;
    pair_make(&w, &r, 3, 4096, 0);
    uint64_t t0 = now_ns();
    cr_expect_eq(store_get(st, &L1, 1, r.items, 3), 0);
    uint64_t ms = ms_since(t0);
    cr_expect_leq(ms, 3 * tmo, "the get took %llu ms with a %u ms timeout",
                  (unsigned long long)ms, tmo);
    cr_expect_eq(r.items[0].status, -EBADMSG, "a value of another length: %d",
                 r.items[0].status);
    cr_expect_eq(r.items[1].status, -ETIMEDOUT, "the stalled value: %d", r.items[1].status);
    cr_expect_eq(r.items[2].status, -ETIMEDOUT);
    cr_expect_eq(sstats(st).errors, 3);
    store_close(st);
    cr_assert_eq(write(s.stop[1], "x", 1), 1);
    pthread_join(th, NULL);
    close(s.lfd);
    close(s.stop[0]);
    close(s.stop[1]);
    pair_free(&w, &r);
}

/* Killed and restarted: requests in between fail (counted); later puts land. */
Test(store_redis, restarted_server_reconnects)
{
    TH_DEADLINE(30);
    struct rsrv s = { 0 };
    struct store *st = redis_up(&s, 500);
    struct batch w, r;
    pair_make(&w, &r, 4, 4096, 50);
    cr_assert_eq(store_put(st, &L1, 1, w.items, 4), 4);
    rsrv_kill(&s);
    cr_expect_eq(store_put(st, &L1, 1, w.items, 4), 0);
    uint64_t errs = sstats(st).errors;
    cr_expect_geq(errs, 4);
    rsrv_start(&s, NULL);          /* same port, same password, empty */
    cr_expect_eq(retry_all(st, 1, 1, w.items, 4), 4, "later puts did not land");
    cr_expect_eq(store_get(st, &L1, 1, r.items, 4), 4);
    for (size_t i = 0; i < 4; i++)
        expect_same(&w, &r, i);
    pair_free(&w, &r);
    store_close(st);
    rsrv_stop(&s);
}

/* maxmemory reached: puts fail with -ENOSPC and are counted; the caller's bytes and the
   entries already stored are untouched. */
Test(store_redis, full_server_puts_fail_counted)
{
    TH_DEADLINE(30);
    struct rsrv s = { 0 };
    rsrv_start(&s, NULL);
    rsrv_room(&s, 1 << 20);
    struct store *st = sopen(s.url, 2000);
    struct batch w, copy, r;
    batch_make(&w, 24, 64 << 10, 0);        /* 24 x 128 KiB: three times the room */
    batch_make(&copy, 24, 64 << 10, 0);
    int ok = 0, full = 0;
    for (size_t i = 0; i < w.n; i++) {
        int n = store_put(st, &L1, 1, &w.items[i], 1);
        ok += n;
        full += w.items[i].status == -ENOSPC;
    }
    cr_expect_gt(ok, 0);
    cr_expect_gt(full, 0, "no put was refused");
    cr_expect_eq(ok + full, 24);
    cr_expect_eq(sstats(st).errors, (uint64_t)full);
    cr_expect(!memcmp(w.bytes, copy.bytes, 24 * 2 * (64 << 10)), "the caller's bytes changed");
    batch_blank(&r, &w);
    cr_expect_eq(store_get(st, &L1, 1, r.items, 24), ok, "stored entries were lost");
    for (size_t i = 0; i < 24; i++)
        if (w.items[i].status == 0)
            expect_same(&w, &r, i);
    batch_free(&w);
    batch_free(&copy);
    batch_free(&r);
    store_close(st);
    rsrv_stop(&s);
}

/* ------------------------------------------------------------------ file backend */

/* Another writer overwrites a byte of the file: a miss, counted, never the bytes. */
Test(store_file, corrupted_file_is_a_counted_miss)
{
    TH_DEADLINE(30);
    char dir[64], url[96], path[256], name[STORE_NAME_MAX];
    struct store *st = sopen(file_url(dir, sizeof dir, url, sizeof url), 1000);
    struct batch w, r;
    pair_make(&w, &r, 2, 4096, 3);
    cr_assert_eq(store_put(st, &L1, 1, w.items, 2), 2);
    store_file_name(&L1, 1, &w.keys[0], name);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY);
    cr_assert(fd >= 0);
    uint8_t x = 0x5a;
    cr_assert_eq(pwrite(fd, &x, 1, 4096 + 3000), 1);       /* the payload is at 4 KiB */
    close(fd);
    cr_expect_eq(store_get(st, &L1, 1, r.items, 2), 1);
    cr_expect_eq(r.items[0].status, -EBADMSG);
    expect_same(&w, &r, 1);
    cr_expect_eq(sstats(st).errors, 1);
    cr_expect_eq(sstats(st).gets, 1);
    /* a truncated file (a torn write) and a file renamed over another entry's name */
    char path1[256];
    store_file_name(&L1, 1, &w.keys[1], name);
    snprintf(path1, sizeof path1, "%s/%s", dir, name);
    cr_assert_eq(rename(path1, path), 0);
    cr_expect_eq(store_get(st, &L1, 1, r.items, 1), 0);
    cr_expect_eq(r.items[0].status, -EBADMSG);
    cr_assert_eq(truncate(path, 1000), 0);
    cr_expect_eq(store_get(st, &L1, 1, r.items, 1), 0);
    cr_expect_eq(r.items[0].status, -EBADMSG);
    cr_expect_eq(sstats(st).errors, 3);
    pair_free(&w, &r);
    store_close(st);
    rmdir_all(dir);
}

/* Atomic publish: nothing but the entries' names is left in the directory; a put over an
   entry replaces it. O_DIRECT where the directory takes it (an ext4 /var/tmp does). */
Test(store_file, publish_by_rename_and_replace)
{
    TH_DEADLINE(30);
    char dir[64], url[96];
    struct store *st = sopen(file_url(dir, sizeof dir, url, sizeof url), 1000);
    struct batch w, w2, r;
    batch_make(&w, 5, 3000, 10);             /* not a multiple of 4 KiB: padded files */
    batch_make(&w2, 5, 3000, 77);
    for (size_t i = 0; i < 5; i++)
        w2.keys[i] = w.keys[i];
    batch_blank(&r, &w);
    cr_assert_eq(store_put(st, &L1, 1, w.items, 5), 5);
    cr_assert_eq(store_put(st, &L1, 1, w2.items, 5), 5);
    cr_assert_eq(store_get(st, &L1, 1, r.items, 5), 5);
    for (size_t i = 0; i < 5; i++)
        expect_same(&w2, &r, i);
    cr_expect_eq(th_dir_entries(dir), 5, "%d entries in the directory (temporary files "
                 "left?)", th_dir_entries(dir));
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));)
        cr_expect(e->d_name[0] == '.' ? !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")
                                      : !strncmp(e->d_name, "kvvm1_", 6), "%s", e->d_name);
    if (d)
        closedir(d);
    cr_log_info("store_file: O_DIRECT %s in %s", store_direct(st) ? "on" : "off", dir);
    batch_free(&w);
    batch_free(&w2);
    batch_free(&r);
    store_close(st);
    rmdir_all(dir);
}

/* A lend's done (store_get_lent): counts its calls (atomic: the store may call it on
   another thread). */
static void lent_back(void *arg)
{
    __atomic_fetch_add((int *)arg, 1, __ATOMIC_RELAXED);
}

/* Caller buffers 4 KiB aligned (pinned host pages): O_DIRECT moves the payload straight
   between them and the file (no staging; a get's lent: store_get_lent). Read back through
   aligned and unaligned buffers alike; the file is as documented (header, zeros to 4 KiB,
   payload); a corrupted payload read straight into the caller's buffers is still refused
   and counted. */
Test(store_file, aligned_buffers_go_direct)
{
    TH_DEADLINE(30);
    char dir[64], url[96], path[256], name[STORE_NAME_MAX];
    struct store *st = sopen(file_url(dir, sizeof dir, url, sizeof url), 1000);
    const size_t n = 4, half = 8192;
    uint8_t *src, *dst;
    cr_assert_eq(posix_memalign((void **)&src, 4096, n * 2 * half), 0);
    cr_assert_eq(posix_memalign((void **)&dst, 4096, n * 2 * half), 0);
    struct batch w, r;
    pair_make(&w, &r, n, half, 300);
    memcpy(src, w.bytes, n * 2 * half);
    for (size_t i = 0; i < 2 * n; i++) {      /* the same entries, from aligned buffers */
        w.iov[i].iov_base = src + i * half;
        r.iov[i].iov_base = dst + i * half;
    }
    cr_assert_eq(store_put(st, &L1, 1, w.items, n), (int)n);
    store_file_name(&L1, 1, &w.keys[0], name);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "rb");
    uint8_t hdr[8], pay[64];
    cr_assert(fp && fread(hdr, 1, 8, fp) == 8 && fseek(fp, 4096, SEEK_SET) == 0 &&
              fread(pay, 1, sizeof pay, fp) == sizeof pay);
    fclose(fp);
    cr_expect(!memcmp(hdr, "KVVMST01", 8));
    cr_expect(!memcmp(pay, src, sizeof pay), "the payload is not at offset 4096");
    int back = 0;
    struct store_lend lend = { lent_back, &back, 0 };
    cr_assert_eq(store_get_lent(st, &L1, 1, r.items, n, &lend), (int)n, "status %d",
                 r.items[0].status);
    cr_expect(!memcmp(src, dst, n * 2 * half));
    struct batch u;                           /* unaligned readers see the same */
    batch_blank(&u, &w);
    cr_assert_eq(store_get(st, &L1, 1, u.items, n), (int)n);
    for (size_t i = 0; i < n; i++)
        expect_same(&w, &u, i);
    int fd = open(path, O_WRONLY);
    uint8_t x = 0x33;
    cr_assert(fd >= 0 && pwrite(fd, &x, 1, 4096 + half + 17) == 1);
    close(fd);
    cr_expect_eq(store_get_lent(st, &L1, 1, r.items, n, &lend), (int)n - 1);
    cr_expect_eq(r.items[0].status, -EBADMSG);
    cr_expect(!lend.kept && !back, "a lent get that completed kept its buffers");
    cr_expect_eq(sstats(st).errors, 1);
    if (!store_direct(st))
        cr_log_warn("%s refuses O_DIRECT: the direct path was not exercised", dir);
    batch_free(&u);
    pair_free(&w, &r);
    free(src);
    free(dst);
    store_close(st);
    rmdir_all(dir);
}

/* The open files in the fd table now (an fd leaked by a get shows here). */
static int open_fds(void)
{
    return th_dir_entries("/proc/self/fd");
}

/* A get batch larger than the ring's file table (its files opened by the ring, linked
   before their reads, a slot reused once its last read completed): every entry read whole
   and its own, straight into aligned lent buffers (O_DIRECT) and through the staging alike,
   with misses (removed files), a file cut short inside its payload (no fstat: the short
   read is the miss) and another entry's file under an entry's name among them; no
   descriptor left open. A slot reused too early would serve another entry's file: its
   checksum fails (EBADMSG) and the count is short. */
Test(store_file, a_batch_past_the_file_table_gets_each_entry_its_own)
{
    TH_DEADLINE(60);
    char dir[64], url[96], path[256], path2[256], name[STORE_NAME_MAX];
    struct store *st = sopen(file_url(dir, sizeof dir, url, sizeof url), 5000);
    const size_t n = 300, half = 4096;
    uint8_t *dst;
    cr_assert_eq(posix_memalign((void **)&dst, 4096, n * 2 * half), 0);
    struct batch w, r, u;
    pair_make(&w, &r, n, half, 1000);
    batch_blank(&u, &w);
    for (size_t i = 0; i < 2 * n; i++)
        r.iov[i].iov_base = dst + i * half;
    cr_assert_eq(store_put(st, &L1, 1, w.items, n), (int)n);
    size_t gone = 0;
    for (size_t i = 5; i < n; i += 37, gone++) {      /* misses, spread over the batch */
        store_file_name(&L1, 1, &w.keys[i], name);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        cr_assert_eq(unlink(path), 0);
    }
    store_file_name(&L1, 1, &w.keys[100], name);      /* cut inside its payload */
    snprintf(path, sizeof path, "%s/%s", dir, name);
    cr_assert_eq(truncate(path, 4096 + half), 0);
    store_file_name(&L1, 1, &w.keys[200], name);      /* entry 201's file under 200's name */
    snprintf(path, sizeof path, "%s/%s", dir, name);
    store_file_name(&L1, 1, &w.keys[201], name);
    snprintf(path2, sizeof path2, "%s/%s", dir, name);
    cr_assert(unlink(path) == 0 && link(path2, path) == 0);
    int fds = open_fds(), back = 0;
    struct store_lend lend = { lent_back, &back, 1 };
    for (int pass = 0; pass < 2; pass++) {
        struct batch *b = pass ? &u : &r;
        memset(pass ? u.bytes : dst, 0xaa, n * 2 * half);
        cr_expect_eq(pass ? store_get(st, &L1, 1, b->items, n)
                          : store_get_lent(st, &L1, 1, b->items, n, &lend),
                     (int)(n - gone - 2), "pass %d", pass);
        for (size_t i = 0; i < n; i++) {
            int want = i % 37 == 5 ? -ENOENT : i == 100 || i == 200 ? -EBADMSG : 0;
            cr_expect_eq(b->items[i].status, want, "pass %d entry %zu: %d", pass, i,
                         b->items[i].status);
            if (!want)
                cr_expect(!memcmp(w.bytes + i * 2 * half, (pass ? u.bytes : dst) + i * 2 * half,
                                  2 * half), "pass %d entry %zu: not its bytes", pass, i);
        }
    }
    cr_expect_eq(open_fds(), fds, "descriptors left open by the gets");
    cr_expect(!lend.kept && !back, "a lent get that completed kept its buffers");
    cr_expect_eq(sstats(st).errors, 4);
    if (!store_direct(st))
        cr_log_warn("%s refuses O_DIRECT: the direct path was not exercised", dir);
    batch_free(&u);
    pair_free(&w, &r);
    free(dst);
    store_close(st);
    rmdir_all(dir);
}

/* The O_DIRECT fallback is explicit: logged, and the entries still round-trip (and read
   back through a store that uses O_DIRECT). */
Test(store_file, buffered_fallback_is_logged_and_works)
{
    TH_DEADLINE(30);
    char dir[64], url[96];
    file_url(dir, sizeof dir, url, sizeof url);
    logged[0] = 0;
    kvvm_set_log(log_cap, NULL, KVVM_LOG_INFO);
    struct store *st = NULL;
    cr_assert_eq(store_open(url, 1000, STORE_F_TEST_NO_DIRECT, &st), 0);
    cr_expect_eq(store_direct(st), 0);
    cr_expect(strstr(logged, "page cache"), "log: %s", logged);
    struct batch w, r;
    pair_make(&w, &r, 3, 5000, 1);
    cr_assert_eq(store_put(st, &L1, 1, w.items, 3), 3);
    struct store *st2 = sopen(url, 1000);
    cr_assert_eq(store_get(st2, &L1, 1, r.items, 3), 3);
    for (size_t i = 0; i < 3; i++)
        expect_same(&w, &r, i);
    if (!store_direct(st2))
        cr_log_warn("%s refuses O_DIRECT: the direct path was not exercised", dir);
    pair_free(&w, &r);
    store_close(st);
    store_close(st2);
    rmdir_all(dir);
    kvvm_set_log(NULL, NULL, KVVM_LOG_WARN);
}

/* A missing directory at open: the store is down (logged), requests fail and are counted;
   once the directory exists, it works. */
Test(store_file, missing_directory_is_down_not_an_error)
{
    TH_DEADLINE(30);
    char dir[64], url[128], sub[96];
    file_url(dir, sizeof dir, url, sizeof url);
    snprintf(sub, sizeof sub, "%s/later", dir);
    snprintf(url, sizeof url, "file://%s", sub);
    logged[0] = 0;
    kvvm_set_log(log_cap, NULL, KVVM_LOG_INFO);
    struct store *st = sopen(url, 1000);
    cr_expect(strstr(logged, "unavailable"), "log: %s", logged);
    struct batch w;
    batch_make(&w, 2, 1024, 0);
    cr_expect_eq(store_put(st, &L1, 1, w.items, 2), 0);
    cr_expect_eq(w.items[0].status, -ENOTCONN);
    cr_expect_eq(sstats(st).errors, 2);
    cr_assert_eq(mkdir(sub, 0700), 0);
    cr_expect_eq(store_put(st, &L1, 1, w.items, 2), 2);
    batch_free(&w);
    store_close(st);
    rmdir_all(dir);
    kvvm_set_log(NULL, NULL, KVVM_LOG_WARN);
}

/* A hung file system: a batch returns at its deadline (bound 3x against timing flakes);
   while its I/O is still owed, later data requests fail fast; once it completes, its
   buffers and temporary files are released and the store works again. */
Test(store_file, hung_io_returns_in_time_and_recovers)
{
    TH_DEADLINE(30);
    char dir[64], url[96];
    const uint32_t tmo = 200;
    struct store *st = sopen(file_url(dir, sizeof dir, url, sizeof url), tmo);
    struct batch w, r;
    pair_make(&w, &r, 3, 8192, 20);
    cr_assert_eq(store_put(st, &L1, 1, w.items, 3), 3);
    cr_assert_eq(store_test_hang(st, 1), 0);
    uint64_t t0 = now_ns();
    cr_expect_eq(store_get(st, &L1, 1, r.items, 3), 0);
    cr_expect_leq(ms_since(t0), 3 * tmo, "a hung get took %llu ms",
                  (unsigned long long)ms_since(t0));
    for (size_t i = 0; i < 3; i++)
        cr_expect_eq(r.items[i].status, -ETIMEDOUT, "get %zu: %d", i, r.items[i].status);
    t0 = now_ns();
    cr_expect_eq(store_get(st, &L1, 1, r.items, 3), 0, "a get behind the hung batch");
    cr_expect_lt(ms_since(t0), tmo, "it did not fail fast");
    cr_expect_eq(r.items[0].status, -ETIMEDOUT);
    /* puts go by their own lane (ring): a hung put of their own, then one behind it */
    t0 = now_ns();
    cr_expect_eq(store_put(st, &L1, 1, w.items, 3), 0);
    cr_expect_leq(ms_since(t0), 3 * tmo, "a hung put took %llu ms",
                  (unsigned long long)ms_since(t0));
    t0 = now_ns();
    cr_expect_eq(store_put(st, &L1, 1, w.items, 3), 0, "a put behind the hung batch");
    cr_expect_lt(ms_since(t0), tmo, "it did not fail fast");
    cr_expect_eq(w.items[0].status, -ETIMEDOUT);
    cr_expect_eq(sstats(st).errors, 12);
    cr_assert_eq(store_test_hang(st, 0), 0);
    cr_expect_eq(retry_all(st, 0, 1, r.items, 3), 3, "the store did not recover");
    for (size_t i = 0; i < 3; i++)
        expect_same(&w, &r, i);
    /* a put that hangs leaves no temporary file once its I/O is over */
    cr_assert_eq(store_test_hang(st, 1), 0);
    cr_expect_eq(store_put(st, &L1, 1, w.items, 3), 0);
    cr_assert_eq(store_test_hang(st, 0), 0);
    cr_expect_eq(store_lookup(st, &L1, 1, w.keys, 3, NULL), 3);
    cr_expect_eq(retry_all(st, 1, 1, w.items, 1), 1);     /* reaps the orphan */
    cr_expect_eq(th_dir_entries(dir), 3, "temporary files left: %d entries",
                 th_dir_entries(dir));
    pair_free(&w, &r);
    store_close(st);
    rmdir_all(dir);
}

/* A store on an O_DIRECT directory with n entries of two aligned 4 KiB pages (w, written
   through a store of a long timeout: the load of a shared machine fails no setup), and r
   reading them into dst (aligned: a get may read straight into it). NULL (skipped, the
   reason printed) where the directory refuses O_DIRECT. */
static struct store *direct_pair(char *dir, size_t dlen, char *url, size_t ulen, uint32_t tmo,
                                 size_t n, struct batch *w, struct batch *r, uint8_t **dst)
{
    struct store *st = sopen(file_url(dir, dlen, url, ulen), tmo);
    if (!store_direct(st)) {
        store_close(st);
        rmdir_all(dir);
        return NULL;
    }
    cr_assert_eq(posix_memalign((void **)dst, 4096, n * 2 * 4096), 0);
    pair_make(w, r, n, 4096, 40);
    for (size_t i = 0; i < 2 * n; i++)
        r->iov[i].iov_base = *dst + i * 4096;
    struct store *wst = sopen(url, 20000);
    cr_assert_eq(store_put(wst, &L1, 1, w->items, n), (int)n);
    store_close(wst);
    return st;
}

/* The first byte of dst[0..len) that is not c, or len. */
static size_t first_not(const uint8_t *dst, size_t len, uint8_t c)
{
    size_t o = 0;
    while (o < len && dst[o] == c)
        o++;
    return o;
}

/* Regression: a get that read with O_DIRECT straight into the caller's buffers and timed
   out returned with those reads still in flight; its orphan kept only the store's staging,
   so the late completion wrote into memory the caller owned again (core/storeq.c's next
   attach's staging, or a buffer freed and reused). The caller's cookie, written after the
   call, must survive the late read's completion and its reaping (store_close). */
Test(store_file, timed_out_direct_get_keeps_callers_buffers_until_reaped)
{
    TH_DEADLINE(30);
    char dir[64], url[96];
    const size_t n = 2, len = n * 2 * 4096;
    struct batch w, r;
    uint8_t *dst = NULL;
    struct store *st = direct_pair(dir, sizeof dir, url, sizeof url, 200, n, &w, &r, &dst);
    if (!st)
        cr_skip_test("/var/tmp refuses O_DIRECT: no direct read to leave in flight");
    cr_assert_eq(store_test_hang(st, STORE_HANG_ALL), 0);
    cr_expect_eq(store_get(st, &L1, 1, r.items, n), 0);
    for (size_t i = 0; i < n; i++)
        cr_expect_eq(r.items[i].status, -ETIMEDOUT, "get %zu: %d", i, r.items[i].status);
    memset(dst, 0x5c, len);              /* the caller's again: its next use */
    cr_assert_eq(store_test_hang(st, 0), 0);    /* the hung reads complete now */
    store_close(st);                     /* waits for them: reaped */
    size_t o = first_not(dst, len, 0x5c);
    cr_expect_eq(o, len, "the timed-out get wrote byte %zu of the caller's buffer (0x%02x) "
                 "after it returned", o, o < len ? dst[o] : 0);
    pair_free(&w, &r);
    free(dst);
    rmdir_all(dir);
}

/* The other side: a lent get reads straight into the caller's buffers (no copy: the hung
   read's byte lands there, not in the store's staging) and, timed out with those reads in
   flight, keeps them: kept set, done not called until the late read completed and a later
   get reaped it, then once. A lent get that completes in time keeps nothing. */
Test(store_file, timed_out_lent_get_gives_the_buffers_back_once_reaped)
{
    TH_DEADLINE(30);
    char dir[64], url[96];
    const size_t n = 2, len = n * 2 * 4096;
    struct batch w, r, u;
    uint8_t *dst = NULL;
    struct store *st = direct_pair(dir, sizeof dir, url, sizeof url, 200, n, &w, &r, &dst);
    if (!st)
        cr_skip_test("/var/tmp refuses O_DIRECT: no direct read to leave in flight");
    int back = 0;
    struct store_lend lend = { lent_back, &back, 1 };
    struct store *slow = sopen(url, 20000);     /* completes in time, however loaded */
    cr_assert_eq(store_get_lent(slow, &L1, 1, r.items, n, &lend), (int)n);
    store_close(slow);
    cr_expect(!lend.kept && !back, "a lent get that completed kept its buffers");
    cr_expect(!memcmp(w.bytes, dst, len), "the entries read differ from those written");
    cr_assert_eq(store_test_hang(st, STORE_HANG_ALL), 0);
    memset(dst, 0x5c, len);
    cr_expect_eq(store_get_lent(st, &L1, 1, r.items, n, &lend), 0);
    cr_expect_eq(lend.kept, 1, "a lent get timed out with reads in flight, kept nothing");
    cr_expect_eq(__atomic_load_n(&back, __ATOMIC_RELAXED), 0, "given back while in flight");
    cr_assert_eq(store_test_hang(st, 0), 0);    /* the hung reads complete now */
    batch_blank(&u, &w);                 /* its own buffers, not lent */
    cr_expect_eq(retry_all(st, 0, 1, u.items, n), (int)n, "the store did not recover");
    cr_expect_eq(__atomic_load_n(&back, __ATOMIC_RELAXED), 1, "not given back once, reaped");
    cr_expect_lt(first_not(dst, len, 0x5c), len, "the lent get did not read straight into "
                 "the caller's buffers");
    store_close(st);
    cr_expect_eq(back, 1, "given back again at close");
    batch_free(&u);
    pair_free(&w, &r);
    free(dst);
    rmdir_all(dir);
}

/* ------------------------------------------------------------------ through kvvm_open */

static int kopen_url(const char *url, kvvm **kv)
{
    struct kvvm_config c;
    th_config(&c, KB, 1, 64, 4, 256, 16, 0, 0);
    c.store_url = url;
    c.store_timeout_ms = 300;
    return kvvm_open(&c, kv);
}

Test(store_config, kvvm_open_refuses_only_bad_urls_and_credentials)
{
    TH_DEADLINE(30);
    kvvm *kv = NULL;
    cr_expect_eq(kopen_url("redis://h:1?x", &kv), -EINVAL);
    cr_expect_eq(kopen_url("nfs://x", &kv), -EINVAL);
    char url[128];
    snprintf(url, sizeof url, "redis://:%s@127.0.0.1:%d", PASS, free_port());
    cr_expect_eq(kopen_url(url, &kv), 0, "a server down at open is not an error");
    cr_expect(kv && kv->store && !strcmp(store_kind(kv->store), "redis"));
    kvvm_close(kv);
    struct rsrv s = { 0 };
    rsrv_start(&s, NULL);
    snprintf(url, sizeof url, "redis://:nope@127.0.0.1:%d", s.port);
    cr_expect_eq(kopen_url(url, &kv), -EACCES);
    cr_expect_eq(kopen_url(s.url, &kv), 0);
    /* the effective config names the store without its password */
    char json[8192];
    cr_assert_eq(kvvm_stats_json(kv, json, sizeof json), 0);
    cr_expect(strstr(json, "\"store_url\":\"redis://:***@127.0.0.1:"), "%s", json);
    cr_expect(!strstr(json, PASS), "the password is in the JSON: %s", json);
    cr_expect(strstr(json, "\"store_timeout_ms\":300"), "%s", json);
    kvvm_close(kv);
    rsrv_stop(&s);
}

Test(store_config, environment_sets_the_store)
{
    TH_DEADLINE(30);
    char dir[64], url[96];
    file_url(dir, sizeof dir, url, sizeof url);
    setenv("KVVM_STORE_URL", url, 1);
    setenv("KVVM_STORE_TIMEOUT_MS", "1234", 1);
    struct kvvm_config c;
    kvvm_config_init(&c);
    cr_expect_str_eq(c.store_url, url);
    cr_expect_eq(c.store_timeout_ms, 1234);
    unsetenv("KVVM_STORE_URL");
    unsetenv("KVVM_STORE_TIMEOUT_MS");
    kvvm_config_init(&c);
    cr_expect_null(c.store_url);
    cr_expect_eq(c.store_timeout_ms, 1000);
    kvvm *kv;
    cr_assert_eq(kopen_url(url, &kv), 0);
    cr_expect(kv->store && !strcmp(store_kind(kv->store), "file"));
    kvvm_close(kv);
    rmdir_all(dir);
}
