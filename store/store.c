/*
 * store/store.c: the store's front (contract in store.h): the URL, the arguments, the lock
 * taken with the deadline, the counters, the entry names and the value header.
 *
 * The value format is the one thing other tools must agree on, so it is written here once
 * (docs/api.md "Key layout" is its user-facing copy):
 *
 *     offset  bytes  field (integers little-endian)
 *          0      8  magic "KVVMST01"
 *          8      4  format version (1)
 *         12      4  header bytes (96)
 *         16      4  n_regions
 *         20      4  reserved, 0
 *         24      8  bytes_per_token
 *         32      8  page_size
 *         40      8  namespace
 *         48      8  payload bytes
 *         56     32  content key
 *         88      8  XXH3-64 (seed 0) of bytes [0, 88) followed by the payload
 *         96      -  payload
 *
 * The checksum is not disk/'s disk_checksum: that one is seeded with a page id and a slot
 * of one process's spill file, which a reader in another process cannot know; this one
 * depends only on the bytes a reader can see, and the fields it checks it against are in
 * the header it covers.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define XXH_STATIC_LINKING_ONLY      /* XXH3_state_t on the stack */
#ifdef KVVM_XXH_DISPATCH
#include <xxhash.h>
#include <xxh_x86dispatch.h>   /* XXH3_64bits_update -> its run-time dispatched variant */
#else
#define XXH_INLINE_ALL
#include <xxhash.h>
#endif

#include "common/assert.h"
#include "common/log.h"
#include "store_int.h"

/* ThreadSanitizer (clang 14, gcc 12) does not intercept pthread_mutex_clocklock: without a
   word from us it sees every unlock of st->lock as an unlock of an unlocked mutex and the
   fields it guards as raced. begin() tells it of each lock taken. */
#if defined(__SANITIZE_THREAD__)
#define STORE_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define STORE_TSAN 1
#endif
#endif
#ifdef STORE_TSAN
#include <sanitizer/tsan_interface.h>
#endif

static const char STORE_MAGIC[8] = { 'K', 'V', 'V', 'M', 'S', 'T', '0', '1' };
#define STORE_VERSION 1u
#define STORE_SUM_OFF 88

/* ------------------------------------------------------------------ names */

static void hex(char *out, const uint8_t *b, size_t n)
{
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = d[b[i] >> 4];
        out[2 * i + 1] = d[b[i] & 15];
    }
    out[2 * n] = 0;
}

static size_t name_fmt(const char *fmt, const struct store_layout *L, uint64_t ns,
                       const store_key *k, char out[STORE_NAME_MAX])
{
    char kh[65];
    hex(kh, k->bytes, sizeof k->bytes);
    int r = snprintf(out, STORE_NAME_MAX, fmt, L->n_regions,
                     (unsigned long long)L->bytes_per_token, (unsigned long long)L->page_size,
                     (unsigned long long)ns, kh);
    return r > 0 ? (size_t)r : 0;
}

size_t store_redis_key(const struct store_layout *L, uint64_t ns, const store_key *k,
                       char out[STORE_NAME_MAX])
{
    return name_fmt("kvvm1:{%u:%llu:%llu:%016llx}:%s", L, ns, k, out);
}

size_t store_cluster_key(const struct store_layout *L, uint64_t ns, const store_key *k,
                         char out[STORE_NAME_MAX])
{
    return name_fmt("kvvm1:%u:%llu:%llu:%016llx:%s", L, ns, k, out);
}

size_t store_file_name(const struct store_layout *L, uint64_t ns, const store_key *k,
                       char out[STORE_NAME_MAX])
{
    return name_fmt("kvvm1_%u_%llu_%llu_%016llx_%s", L, ns, k, out);
}

/* ------------------------------------------------------------------ values */

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

size_t store_iov_len(const struct iovec *iov, int n)
{
    size_t len = 0;
    for (int i = 0; i < n; i++)
        len += iov[i].iov_len;
    return len;
}

void store_iov_scatter(const struct iovec *iov, int n, const void *src, size_t len)
{
    const char *s = src;
    KVVM_ASSERT(len <= store_iov_len(iov, n));   /* the caller sized the iovecs */
    for (int i = 0; i < n && len; i++) {
        size_t c = iov[i].iov_len < len ? iov[i].iov_len : len;
        memcpy(iov[i].iov_base, s, c);
        s += c;
        len -= c;
    }
}

static uint64_t value_sum(const uint8_t *hdr, const struct iovec *iov, int n)
{
    XXH3_state_t s;
    XXH3_64bits_reset(&s);
    XXH3_64bits_update(&s, hdr, STORE_SUM_OFF);
    for (int i = 0; i < n; i++)
        XXH3_64bits_update(&s, iov[i].iov_base, iov[i].iov_len);
    return XXH3_64bits_digest(&s);
}

/* The header's first 88 bytes (no checksum). */
static void hdr_fields(uint8_t h[STORE_HDR_BYTES], const struct store_layout *L, uint64_t ns,
                       const store_key *k, uint64_t payload)
{
    memset(h, 0, STORE_HDR_BYTES);
    memcpy(h, STORE_MAGIC, sizeof STORE_MAGIC);
    put32(h + 8, STORE_VERSION);
    put32(h + 12, STORE_HDR_BYTES);
    put32(h + 16, L->n_regions);
    put64(h + 24, L->bytes_per_token);
    put64(h + 32, L->page_size);
    put64(h + 40, ns);
    put64(h + 48, payload);
    memcpy(h + 56, k->bytes, sizeof k->bytes);
}

void store_hdr_make(uint8_t hdr[STORE_HDR_BYTES], const struct store_layout *L, uint64_t ns,
                    const store_key *k, const struct iovec *iov, int n)
{
    hdr_fields(hdr, L, ns, k, store_iov_len(iov, n));
    put64(hdr + STORE_SUM_OFF, value_sum(hdr, iov, n));
}

int store_value_check_iov(const uint8_t *hdr, const struct store_layout *L, uint64_t ns,
                          const store_key *k, const struct iovec *iov, int n)
{
    uint8_t h[STORE_HDR_BYTES];
    hdr_fields(h, L, ns, k, store_iov_len(iov, n));
    if (memcmp(h, hdr, STORE_SUM_OFF) != 0)
        return -EBADMSG;         /* another layout, namespace, key or length: never ours */
    return value_sum(hdr, iov, n) == get64(hdr + STORE_SUM_OFF) ? 0 : -EBADMSG;
}

int store_value_check(const uint8_t *v, size_t vlen, const struct store_layout *L,
                      uint64_t ns, const store_key *k, size_t want)
{
    if (vlen < STORE_HDR_BYTES || vlen - STORE_HDR_BYTES < want)
        return -EBADMSG;
    struct iovec pay = { (void *)(v + STORE_HDR_BYTES), want };
    return store_value_check_iov(v, L, ns, k, &pay, 1);
}

uint64_t store_left_ns(uint64_t deadline)
{
    uint64_t now = know_ns();
    return now < deadline ? deadline - now : 0;
}

/* ------------------------------------------------------------------ URL */

/* Decodes %XX escapes of s[0..n) into a new string. NULL on a bad escape or no memory. */
static char *pct_dup(const char *s, size_t n, int *bad)
{
    char *o = malloc(n + 1), *p = o;
    if (!o)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (s[i] != '%') {
            *p++ = s[i];
        } else if (i + 2 < n && isxdigit((unsigned char)s[i + 1]) &&
                   isxdigit((unsigned char)s[i + 2])) {
            sscanf(s + i + 1, "%2x", &v);
            *p++ = (char)v;
            i += 2;
        } else {
            free(o);
            *bad = 1;
            return NULL;
        }
    }
    *p = 0;
    return o;
}

static int parse_uint(const char *s, size_t n, long max, int *out)
{
    long v = 0;
    if (n == 0 || n > 9)
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -EINVAL;
        v = v * 10 + (s[i] - '0');
    }
    if (v > max)
        return -EINVAL;
    *out = (int)v;
    return 0;
}

static void redis_url_free(struct store_redis_url *u)
{
    free(u->host);
    free(u->user);
    free(u->pass);
}

#define URL_BAD(...) (klog_error("kvvm store: " __VA_ARGS__), -EINVAL)

/* userinfo "user:pass" or ":pass" (percent-encoded). */
static int parse_userinfo(const char *s, size_t n, struct store_redis_url *u)
{
    const char *colon = memchr(s, ':', n);
    if (!colon)
        return URL_BAD("redis URL: the part before '@' must be [user]:password");
    int bad = 0;
    size_t ul = (size_t)(colon - s);
    if (ul && !(u->user = pct_dup(s, ul, &bad)))
        return bad ? URL_BAD("redis URL: a bad %%-escape in the user name") : -ENOMEM;
    if (!(u->pass = pct_dup(colon + 1, n - ul - 1, &bad)))
        return bad ? URL_BAD("redis URL: a bad %%-escape in the password") : -ENOMEM;
    if (!*u->pass)
        return URL_BAD("redis URL: an empty password");
    return 0;
}

/* host[:port] */
static int parse_hostport(const char *s, size_t n, struct store_redis_url *u)
{
    const char *colon = memchr(s, ':', n);
    size_t hl = colon ? (size_t)(colon - s) : n;
    if (hl == 0)
        return URL_BAD("redis URL: no host");
    for (size_t i = 0; i < hl; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9') || s[i] == '.' || s[i] == '-' || s[i] == '_'))
            return URL_BAD("redis URL: '%c' in the host name (IPv6 addresses are not "
                           "supported)", s[i]);
    u->port = 6379;
    if (colon && (parse_uint(colon + 1, n - hl - 1, 65535, &u->port) || u->port == 0))
        return URL_BAD("redis URL: the port must be a number from 1 to 65535");
    if (!(u->host = strndup(s, hl)))
        return -ENOMEM;
    return 0;
}

/* "redis://[[user]:password@]host[:port][/db]" after the scheme. */
static int parse_redis(const char *s, struct store_redis_url *u)
{
    const char *slash = strchr(s, '/');
    size_t auth_end = slash ? (size_t)(slash - s) : strlen(s);
    const char *at = memrchr(s, '@', auth_end);
    int rc;
    if (strpbrk(s, "?#"))
        return URL_BAD("redis URL: query and fragment parts are not supported");
    if (at && (rc = parse_userinfo(s, (size_t)(at - s), u)))
        return rc;
    const char *hp = at ? at + 1 : s;
    if ((rc = parse_hostport(hp, (size_t)(s + auth_end - hp), u)))
        return rc;
    u->db = 0;
    if (slash && slash[1] && parse_uint(slash + 1, strlen(slash + 1), 1 << 20, &u->db))
        return URL_BAD("redis URL: the database after '/' must be a number");
    return 0;
}

/* "redis-cluster://[[user]:password@]host[:port][,host[:port]...]" after the scheme: u gets
   the credentials and the first node, *seeds every node as "host:port,..." (malloc'd). */
static int parse_cluster(const char *s, struct store_redis_url *u, char **seeds)
{
    const char *at = strrchr(s, '@');
    int rc;
    if (strpbrk(s, "?#"))
        return URL_BAD("redis-cluster URL: query and fragment parts are not supported");
    if (strchr(at ? at : s, '/'))
        return URL_BAD("redis-cluster URL: nothing may follow the nodes (a cluster has "
                       "database 0 only)");
    if (at && (rc = parse_userinfo(s, (size_t)(at - s), u)))
        return rc;
    const char *p = at ? at + 1 : s;
    size_t cap = 3 * strlen(p) + 16, len = 0;
    if (!*p)
        return URL_BAD("redis-cluster URL: no node (host:port[,host:port...] expected)");
    if (!(*seeds = malloc(cap)))
        return -ENOMEM;
    for (;;) {
        size_t n = strcspn(p, ",");
        struct store_redis_url one = { 0 };
        if (!n)
            return URL_BAD("redis-cluster URL: an empty node in the list");
        if ((rc = parse_hostport(p, n, &one))) {
            redis_url_free(&one);
            return rc;
        }
        len += (size_t)snprintf(*seeds + len, cap - len, "%s%s:%d", len ? "," : "", one.host,
                                one.port);
        if (!u->host) {
            u->host = one.host;
            u->port = one.port;
            one.host = NULL;
        }
        redis_url_free(&one);
        if (!p[n])
            return 0;
        p += n + 1;
    }
}

static int open_url(struct store *st, const char *url)
{
    if (!strncmp(url, "file://", 7)) {
        const char *p = url + 7;
        if (!strncmp(p, "localhost/", 10))
            p += 9;
        if (*p != '/')
            return URL_BAD("file URL %s: file:///absolute/dir expected", url);
        if (strpbrk(p, "?#"))
            return URL_BAD("file URL %s: query and fragment parts are not supported", url);
        return store_file_open(st, p);
    }
    if (!strncmp(url, "redis-cluster://", 16)) {
        struct store_redis_url u = { 0 };
        char *seeds = NULL;
        int rc = parse_cluster(url + 16, &u, &seeds);
        if (!rc)
            rc = store_cluster_open(st, &u, seeds);
        redis_url_free(&u);
        free(seeds);
        return rc;
    }
    if (!strncmp(url, "redis://", 8)) {
        struct store_redis_url u = { 0 };
        int rc = parse_redis(url + 8, &u);
        if (!rc)
            rc = store_redis_open(st, &u);
        redis_url_free(&u);
        return rc;
    }
    char red[256];
    return URL_BAD("store URL %s: file:///dir, redis://[[user]:password@]host[:port][/db] or "
                   "redis-cluster://[[user]:password@]host:port[,host:port...] expected",
                   store_url_redact(url, red, sizeof red));
}

char *store_url_redact(const char *url, char *buf, size_t len)
{
    const char *sch = strstr(url, "://");
    const char *host = sch ? sch + 3 : url;
    const char *end = host + strcspn(host, "/");
    const char *at = memrchr(host, '@', (size_t)(end - host));
    const char *colon = at ? memchr(host, ':', (size_t)(at - host)) : NULL;
    if (!colon)
        snprintf(buf, len, "%s", url);
    else
        snprintf(buf, len, "%.*s***%s", (int)(colon + 1 - url), url, at);
    return buf;
}

static int open_one(const char *url, uint32_t timeout_ms, unsigned flags, struct store **out)
{
    struct store *st = calloc(1, sizeof *st);
    if (!st)
        return -ENOMEM;
    st->timeout_ns = (uint64_t)(timeout_ms ? timeout_ms : STORE_TIMEOUT_DEFAULT_MS) * 1000000u;
    st->flags = flags;
    pthread_mutex_init(&st->lock, NULL);
    int rc = open_url(st, url);
    if (rc) {
        pthread_mutex_destroy(&st->lock);
        free(st);
        return rc;
    }
    *out = st;
    return 0;
}

static void close_one(struct store *st)
{
    st->ops->close(st);
    pthread_mutex_destroy(&st->lock);
    free(st);
}

int store_open(const char *url, uint32_t timeout_ms, unsigned flags, struct store **out)
{
    if (!url || !out || (flags & STORE_F_LANE))
        return -EINVAL;
    struct store *st = NULL;
    int rc = open_one(url, timeout_ms, flags, &st);
    if (rc)
        return rc;
    /* the read lane: the URL parsed and the credentials checked by the front, so this
       open fails for memory alone */
    if ((rc = open_one(url, timeout_ms, flags | STORE_F_LANE, &st->reads))) {
        close_one(st);
        return rc;
    }
    *out = st;
    return 0;
}

void store_close(struct store *st)
{
    if (!st)
        return;
    if (st->reads)
        close_one(st->reads);
    close_one(st);
}

int store_test_hang(struct store *st, int on)
{
    if (!st || on < 0 || on > STORE_HANG_TAIL)
        return -EINVAL;
    int rc = store_file_test_hang(st, on == STORE_HANG_ALL || on == STORE_HANG_WRITES);
    if (!rc && st->reads)
        rc = store_file_test_hang(st->reads, on == STORE_HANG_ALL ? 1 : on == STORE_HANG_TAIL
                                                                     ? 2 : 0);
    return rc;
}

/* ------------------------------------------------------------------ operations */

/* The deadline of a request starting now; the lock taken by then. -ETIMEDOUT otherwise. */
static int begin(struct store *st, uint64_t *deadline)
{
    *deadline = know_ns() + st->timeout_ns;
    struct timespec ts = { (time_t)(*deadline / 1000000000u), (long)(*deadline % 1000000000u) };
#ifdef STORE_TSAN
    __tsan_mutex_pre_lock(&st->lock, __tsan_mutex_try_lock);
#endif
    int rc = pthread_mutex_clocklock(&st->lock, CLOCK_MONOTONIC, &ts);
#ifdef STORE_TSAN
    __tsan_mutex_post_lock(&st->lock, __tsan_mutex_try_lock |
                                      (rc ? __tsan_mutex_try_lock_failed : 0), 0);
#endif
    return rc ? -ETIMEDOUT : 0;
}

/* Records a request that began() with this deadline (its clock read is the start). */
static void timed(struct store *st, enum store_op op, uint64_t deadline)
{
    uint64_t t0 = deadline - st->timeout_ns, now = know_ns();
    khist_add(&st->st_hist[op], now > t0 ? now - t0 : 0);
}

static int items_ok(struct store *st, const struct store_layout *L,
                    const struct store_item *items, size_t n)
{
    if (!st || !L || (n && !items) || n > INT32_MAX)
        return -EINVAL;
    for (size_t i = 0; i < n; i++)
        if (!items[i].key || items[i].iovcnt < 0 || (items[i].iovcnt && !items[i].iov))
            return -EINVAL;
    return 0;
}

static void items_fail(struct store_item *items, size_t n, int err)
{
    for (size_t i = 0; i < n; i++)
        items[i].status = err;
}

/* Counts the items' outcomes: ok into *ok_counter, failures (a get's miss excepted). */
static int count(struct store *st, const struct store_item *items, size_t n,
                 uint64_t *ok_counter)
{
    int ok = 0;
    uint64_t err = 0;
    for (size_t i = 0; i < n; i++) {
        KVVM_ASSERT(items[i].status <= 0);   /* 0 or -errno, set by the backend */
        if (items[i].status == 0)
            ok++;
        else if (items[i].status != -ENOENT)
            err++;
    }
    __atomic_fetch_add(ok_counter, (uint64_t)ok, __ATOMIC_RELAXED);
    STORE_ADD(st, st_errors, err);
    return ok;
}

/* A put (lend unused) or a get (lend: the buffers lent, or NULL). */
static int run_items(struct store *st, const struct store_layout *L, uint64_t ns,
                     struct store_item *items, size_t n, int put, struct store_lend *lend)
{
    if (lend)
        lend->kept = 0;
    int rc = items_ok(st, L, items, n);
    if (rc)
        return rc;
    if (n == 0)
        return 0;
    uint64_t deadline;
    if (begin(st, &deadline)) {
        items_fail(items, n, -ETIMEDOUT);
    } else {
        if (put)
            st->ops->put(st, L, ns, items, n, deadline);
        else
            st->ops->get(st, L, ns, items, n, lend, deadline);
        KVVM_ASSERT(!lend || !lend->kept || st->ops->reap);   /* kept: reaped later */
        pthread_mutex_unlock(&st->lock);
    }
    timed(st, put ? STORE_OP_PUT : STORE_OP_GET, deadline);
    return count(st, items, n, put ? &st->st_puts : &st->st_gets);
}

int store_put(struct store *st, const struct store_layout *L, uint64_t ns,
              struct store_item *items, size_t n)
{
    return run_items(st, L, ns, items, n, 1, NULL);
}

/* The lane of a read: the read lane, where there is one. */
static struct store *rlane(struct store *st)
{
    return st && st->reads ? st->reads : st;
}

void store_get_start(struct store *st, const struct store_layout *L, uint64_t ns,
                     struct store_item *items, size_t n, struct store_lend *lend,
                     struct store_getreq *rq)
{
    struct store *lane = rlane(st);
    *rq = (struct store_getreq){ .lane = lane, .L = L, .ns = ns, .items = items, .n = n,
                                 .lend = lend };
    if (lend)
        lend->kept = 0;
    rq->rc = lend && !lend->done ? -EINVAL : items_ok(lane, L, items, n);
    if (rq->rc || !n)
        return;
    if (begin(lane, &rq->deadline)) {
        items_fail(items, n, -ETIMEDOUT);
        return;
    }
    rq->locked = 1;
    if (lane->ops->get_start) {
        rq->split = 1;
        lane->ops->get_start(lane, L, ns, items, n, lend, rq->deadline, &rq->be);
    }
}

int store_get_finish(struct store_getreq *rq)
{
    struct store *st = rq->lane;
    if (rq->rc || !rq->n)
        return rq->rc;
    if (rq->locked) {
        if (!rq->split)
            st->ops->get(st, rq->L, rq->ns, rq->items, rq->n, rq->lend, rq->deadline);
        else if (rq->be)
            st->ops->get_finish(st, rq->be);
        KVVM_ASSERT(!rq->lend || !rq->lend->kept || st->ops->reap);   /* reaped later */
        pthread_mutex_unlock(&st->lock);
        rq->locked = 0;
    }
    timed(st, STORE_OP_GET, rq->deadline);
    return count(st, rq->items, rq->n, &st->st_gets);
}

int store_get_first(struct store_getreq *rq)
{
    if (rq->rc || !rq->n || !rq->locked || !rq->split || !rq->be || !rq->lane->ops->get_first)
        return 0;
    return rq->lane->ops->get_first(rq->lane, rq->be);
}

int store_get_lent(struct store *st, const struct store_layout *L, uint64_t ns,
                   struct store_item *items, size_t n, struct store_lend *lend)
{
    struct store_getreq rq;
    store_get_start(st, L, ns, items, n, lend, &rq);
    return store_get_finish(&rq);
}

int store_get(struct store *st, const struct store_layout *L, uint64_t ns,
              struct store_item *items, size_t n)
{
    return store_get_lent(st, L, ns, items, n, NULL);
}

/* One lane's reap: its lock taken without a deadline (store_reap waits as long as the
   file system makes it). */
static void reap_one(struct store *st)
{
    if (!st->ops->reap)
        return;
    pthread_mutex_lock(&st->lock);
    st->ops->reap(st);
    pthread_mutex_unlock(&st->lock);
}

void store_reap(struct store *st)
{
    if (!st)
        return;
    if (st->reads)
        reap_one(st->reads);
    reap_one(st);
}

int store_lookup(struct store *st, const struct store_layout *L, uint64_t ns,
                 const store_key *keys, size_t n, uint8_t *present)
{
    if (!st || !L || (n && !keys) || n > INT32_MAX)
        return -EINVAL;
    st = rlane(st);
    uint8_t one[64], *p = present ? present : n <= sizeof one ? one : calloc(n, 1);
    if (!p)
        return -ENOMEM;
    memset(p, 0, n);
    uint64_t deadline = 0;
    int rc = n == 0 ? 0 : begin(st, &deadline);
    if (!rc && n) {
        rc = st->ops->lookup(st, L, ns, keys, n, p, deadline);
        pthread_mutex_unlock(&st->lock);
    }
    if (n)
        timed(st, STORE_OP_LOOKUP, deadline);
    KVVM_ASSERT(rc <= (int)n);          /* the keys present, at most all */
    if (rc < 0) {
        memset(p, 0, n);
        STORE_ADD(st, st_errors, n);
    } else {
        STORE_ADD(st, st_hits, (uint64_t)rc);
    }
    if (p != present && p != one)
        free(p);
    return rc;
}

int store_delete(struct store *st, const struct store_layout *L, uint64_t ns,
                 const store_key *keys, size_t n)
{
    if (!st || !L || (n && !keys) || n > INT32_MAX)
        return -EINVAL;
    if (n == 0)
        return 0;
    uint64_t deadline;
    int rc = begin(st, &deadline);
    if (!rc) {
        rc = st->ops->del(st, L, ns, keys, n, deadline);
        pthread_mutex_unlock(&st->lock);
    }
    timed(st, STORE_OP_DELETE, deadline);
    if (rc < 0)
        STORE_ADD(st, st_errors, 1);
    return rc;
}

int store_delete_ns(struct store *st, const struct store_layout *L, uint64_t ns)
{
    if (!st)
        return -EINVAL;
    uint64_t deadline;
    int rc = begin(st, &deadline);
    if (!rc) {
        rc = st->ops->del_ns(st, L, ns, deadline);
        pthread_mutex_unlock(&st->lock);
    }
    timed(st, STORE_OP_DELETE, deadline);
    if (rc < 0)
        STORE_ADD(st, st_errors, 1);
    return rc;
}

void store_stats_get(struct store *st, struct store_stats *out)
{
    if (!st || !out)
        return;
    const struct store *r = st->reads ? st->reads : st;
    int two = r != st;          /* the read lane's counters added to the front's */
#define LD(f) (__atomic_load_n(&st->st_##f, __ATOMIC_RELAXED) + \
               (two ? __atomic_load_n(&r->st_##f, __ATOMIC_RELAXED) : 0))
    *out = (struct store_stats){ LD(puts), LD(gets), LD(hits), LD(errors), LD(bytes_out),
                                 LD(bytes_in) };
#undef LD
}

void store_hist_get(struct store *st, enum store_op op, struct khist *out)
{
    KVVM_ASSERT(op < STORE_OP_N);
    if (!st) {
        *out = (struct khist){ { 0 }, 0 };
        return;
    }
    /* gets and lookups run on the read lane, where there is one (rlane) */
    const struct store *on = op == STORE_OP_GET || op == STORE_OP_LOOKUP ? rlane(st) : st;
    khist_read(&on->st_hist[op], out);
}

const char *store_kind(const struct store *st)
{
    return st ? st->ops->kind : "none";
}
