/*
 * store/cluster.c: the Redis Cluster backend (redis-cluster://; contract in store.h), over
 * redis.c's connections (store_rconn_*): one per master, each with its own backoff.
 *
 * Keys. The single server's name, kvvm1:{<layout>:<ns>}:<key>, has a hash tag that would
 * pin a namespace to one slot, so one master; a cluster's entries are named
 * kvvm1:<n_regions>:<bytes_per_token>:<page_size>:<ns>:<key> (store_cluster_key: no braces,
 * the whole name hashed), which spreads every namespace over every master.
 *
 * The slot map. CLUSTER SLOTS, asked of a node that answers (the masters known to be up
 * first, then the others, then the seeds of the URL), gives each slot range's master; the
 * map is read at open (the front lane; the read lane at its first request), and again after
 * a MOVED reply (at once) and after a node's failure (at most every CL_REFRESH_NS): that is
 * how a failover (a replica promoted) and a reshard are found. A batch is split by master
 * and each part sent as one pipeline; items answered MOVED are sent again after the refresh,
 * items answered ASK (a slot being migrated: this key is on the importing node already) are
 * sent to the node named, each command after an ASKING; CL_TRIES rounds at most, all within
 * the request's one deadline. What is still redirected after them, a master that is down, a
 * slot no master serves (a failover under way): those items fail (misses, writes not made),
 * never the call; bytes are checked as for one server, so a wrong byte is never handed out.
 *
 * Namespace drop: SCAN + UNLINK (one command per key: a cluster refuses a command whose
 * keys are in several slots) on every master of the map.
 */
#include <errno.h>
#include <hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/assert.h"
#include "common/log.h"
#include "store_int.h"

#define CL_SLOTS 16384u
#define CL_NONE 0xffffu
#define CL_NODES_MAX 256u
#define CL_TRIES 4                    /* rounds of a batch (redirections followed) */
#define CL_REFRESH_NS (100ull * 1000000u)

struct cnode {
    char host[64];
    int port;
    struct rstore *r;
    int failing;                      /* its last part timed out or found it down: its
                                         parts go after the others' (a stopped master must
                                         not spend the deadline of the healthy ones) */
};

struct cstore {
    struct store_redis_url u;         /* user, pass (owned; host/port unused) */
    char *seeds;                      /* "host:port,..." as in the URL (owned) */
    struct cnode *node;               /* [CL_NODES_MAX]; n_node in use */
    uint32_t n_node;
    uint16_t *slot;                   /* [CL_SLOTS]: the master's index, or CL_NONE */
    int have_map;
    uint64_t next_refresh;            /* know_ns before which a failure asks no refresh */
    int stale;                        /* the last batch asks a new map: 2 MOVED (at once),
                                         1 a node failed (rate-limited), 0 no */
    int down_logged;
    char where[128];                  /* the seeds, for messages */
};

/* ------------------------------------------------------------------ slots and nodes */

/* CRC16-CCITT (XMODEM), the cluster's key hash. */
static uint16_t crc16(const char *s, size_t n)
{
    uint16_t c = 0;
    for (size_t i = 0; i < n; i++) {
        c ^= (uint16_t)((uint8_t)s[i] << 8);
        for (int b = 0; b < 8; b++)
            c = (uint16_t)(c & 0x8000 ? (c << 1) ^ 0x1021 : c << 1);
    }
    return c;
}

unsigned store_cluster_slot(const char *key, size_t n)
{
    const char *o = memchr(key, '{', n);
    if (o) {                          /* a hash tag: the first {...} not empty */
        const char *e = memchr(o + 1, '}', n - (size_t)(o + 1 - key));
        if (e && e > o + 1)
            return crc16(o + 1, (size_t)(e - o - 1)) & (CL_SLOTS - 1);
    }
    return crc16(key, n) & (CL_SLOTS - 1);
}

/* The index of node host:port, connected lazily; CL_NONE when no room or no memory. */
static uint32_t node_get(struct cstore *c, const char *host, size_t hl, int port)
{
    for (uint32_t i = 0; i < c->n_node; i++)
        if (c->node[i].port == port && strlen(c->node[i].host) == hl &&
            !memcmp(c->node[i].host, host, hl))
            return i;
    if (c->n_node == CL_NODES_MAX || hl >= sizeof c->node[0].host)
        return CL_NONE;
    struct cnode *nd = &c->node[c->n_node];
    memcpy(nd->host, host, hl);
    nd->host[hl] = 0;
    nd->port = port;
    struct store_redis_url u = { nd->host, c->u.user, c->u.pass, port, 0 };
    if (store_rconn_new(&u, store_cluster_key, &nd->r))
        return CL_NONE;
    return c->n_node++;
}

/* "host:port" at s (n bytes) -> a node index, or CL_NONE. */
static uint32_t node_of_addr(struct cstore *c, const char *s, size_t n)
{
    const char *colon = s + n;
    while (colon > s && colon[-1] != ':')
        colon--;
    if (colon == s)
        return CL_NONE;
    int port = atoi(colon);
    return port > 0 && port < 65536 ? node_get(c, s, (size_t)(colon - 1 - s), port) : CL_NONE;
}

/* The map of a CLUSTER SLOTS reply (asked of node `from`). 0 or -EIO (not a map). */
static int map_read(struct cstore *c, const redisReply *rep, uint32_t from)
{
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements == 0)
        return -EIO;
    for (size_t i = 0; i < CL_SLOTS; i++)
        c->slot[i] = CL_NONE;
    for (size_t e = 0; e < rep->elements; e++) {
        const redisReply *r = rep->element[e];
        if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 ||
            r->element[0]->type != REDIS_REPLY_INTEGER ||
            r->element[1]->type != REDIS_REPLY_INTEGER ||
            r->element[2]->type != REDIS_REPLY_ARRAY || r->element[2]->elements < 2 ||
            r->element[2]->element[0]->type != REDIS_REPLY_STRING ||
            r->element[2]->element[1]->type != REDIS_REPLY_INTEGER)
            continue;
        long long lo = r->element[0]->integer, hi = r->element[1]->integer;
        const redisReply *h = r->element[2]->element[0];
        long long port = r->element[2]->element[1]->integer;
        if (lo < 0 || hi >= CL_SLOTS || lo > hi || port <= 0 || port > 65535)
            continue;
        uint32_t m = h->len ? node_get(c, h->str, h->len, (int)port)   /* "": the node asked */
                            : node_get(c, c->node[from].host, strlen(c->node[from].host),
                                       (int)port);
        KVVM_ASSERT(m == CL_NONE || m < c->n_node);
        for (long long s = lo; s <= hi; s++)
            c->slot[s] = (uint16_t)m;
    }
    return 0;
}

/* Whether index i of order[0..n) is already there. */
static int listed(const uint32_t *order, uint32_t n, uint32_t i)
{
    for (uint32_t k = 0; k < n; k++)
        if (order[k] == i)
            return 1;
    return 0;
}

/* Reads the slot map again: asks the masters of the map, then the other nodes, then the
   seeds, until one answers. 0, or the last failure (the map unchanged). -EACCES
   credentials refused, -EINVAL not a cluster node (refused CLUSTER SLOTS). */
static int map_refresh(struct cstore *c, uint64_t deadline)
{
    uint32_t order[CL_NODES_MAX], n = 0;
    for (uint32_t s = 0; c->have_map && s < CL_SLOTS; s++)   /* the masters first */
        if (c->slot[s] != CL_NONE && !listed(order, n, c->slot[s]))
            order[n++] = c->slot[s];
    for (const char *p = c->seeds; *p;) {                      /* then the seeds */
        size_t len = strcspn(p, ",");
        uint32_t i = node_of_addr(c, p, len);
        p += len + (p[len] == ',');
        (void)i;                     /* added to the nodes: listed below */
    }
    for (uint32_t i = 0; i < c->n_node; i++)
        if (!listed(order, n, i))
            order[n++] = i;
    uint32_t m = 0, rest[CL_NODES_MAX], nr = 0;   /* the failing nodes last */
    for (uint32_t k = 0; k < n; k++)
        if (c->node[order[k]].failing)
            rest[nr++] = order[k];
        else
            order[m++] = order[k];
    memcpy(order + m, rest, nr * sizeof *rest);
    int rc = -ETIMEDOUT;
    c->next_refresh = know_ns() + CL_REFRESH_NS;
    for (uint32_t k = 0; k < n && store_left_ns(deadline); k++) {
        redisReply *rep = NULL;
        rc = store_rconn_call(c->node[order[k]].r, (const char *[]){ "CLUSTER", "SLOTS" }, 2,
                              deadline, &rep);
        if (rc == -EACCES)
            return rc;
        if (rc)
            continue;
        if (rep->type == REDIS_REPLY_ERROR) {
            klog_error("kvvm store: redis-cluster node %s:%d refused CLUSTER SLOTS: %s",
                       c->node[order[k]].host, c->node[order[k]].port, rep->str);
            rc = strstr(rep->str, "cluster support disabled") ? -EINVAL : -EIO;
        } else {
            rc = map_read(c, rep, order[k]);
        }
        freeReplyObject(rep);
        if (rc == -EINVAL)
            return rc;
        if (!rc) {
            c->have_map = 1;
            if (c->down_logged)
                klog_info("kvvm store: redis-cluster %s is back", c->where);
            c->down_logged = 0;
            return 0;
        }
    }
    if (!c->down_logged && rc != -ETIMEDOUT)
        klog_warn("kvvm store: redis-cluster %s: no node answered with the slot map (%s); "
                  "requests fail fast until one does", c->where, strerror(-rc));
    c->down_logged = 1;
    return rc;
}

/* A map to route by: read when there is none (or a redirection / failure asked for it:
   force, or past the rate limit). 0 when there is a map. */
static int map_ready(struct cstore *c, int force, uint64_t deadline)
{
    if (c->have_map && !force)
        return 0;
    if (!c->have_map || force == 2 || know_ns() >= c->next_refresh)
        if (!map_refresh(c, deadline))
            c->stale = 0;
    return c->have_map ? 0 : -ENOTCONN;
}

/* The master of each entry's slot (CL_NONE: unserved). */
static void route(struct cstore *c, const struct store_layout *L, uint64_t ns,
                  const store_key *const *keys, size_t n, uint16_t *at)
{
    char k[STORE_NAME_MAX];
    for (size_t i = 0; i < n; i++) {
        at[i] = c->slot[store_cluster_slot(k, store_cluster_key(L, ns, keys[i], k))];
        KVVM_ASSERT(at[i] == CL_NONE || at[i] < c->n_node);   /* the map names known nodes */
    }
}

/* ------------------------------------------------------------------ batches */

/* The status the caller sees for a redirection left after the rounds. */
static int settle(int e)
{
    return e == STORE_MOVED || e == STORE_ASK ? -EIO : e;
}

/* Whether e asks for a new map: a redirection, or a node failing. */
static int wants_map(int e)
{
    return e == STORE_MOVED ? 2 : e == -ENOTCONN || e == -ETIMEDOUT ? 1 : 0;
}

typedef int (*part_fn)(struct store *, struct rstore *, const struct store_layout *, uint64_t,
                       struct store_item *, size_t, uint64_t);

/* Sends the items with todo[i] set to the node at[i] (a pipeline each; the nodes that are
   failing last), statuses back. Past the deadline a part is not sent (-ETIMEDOUT): its
   node's connection, not at fault, stays. */
static void send_parts(struct store *st, struct cstore *c, const struct store_layout *L,
                       uint64_t ns, struct store_item *items, size_t n, const uint16_t *at,
                       const uint8_t *todo, int asking, part_fn fn, uint64_t deadline,
                       struct store_item *sub, size_t *idx)
{
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t j = 0; j < c->n_node; j++) {
            struct cnode *nd = &c->node[j];
            size_t k = 0;
            if (nd->failing != pass)
                continue;
            for (size_t i = 0; i < n; i++)
                if (todo[i] && at[i] == j) {
                    sub[k] = items[i];
                    idx[k++] = i;
                }
            if (!k)
                continue;
            if (!store_left_ns(deadline)) {
                for (size_t t = 0; t < k; t++)
                    items[idx[t]].status = -ETIMEDOUT;
                continue;
            }
            int was = store_rconn_set_asking(nd->r, asking), bad = 0;
            fn(st, nd->r, L, ns, sub, k, deadline);
            (void)store_rconn_set_asking(nd->r, was);
            for (size_t t = 0; t < k; t++) {
                items[idx[t]].status = sub[t].status;
                bad |= sub[t].status == -ETIMEDOUT || sub[t].status == -ENOTCONN;
            }
            nd->failing = bad;
        }
}

static int c_items(struct store *st, const struct store_layout *L, uint64_t ns,
                   struct store_item *items, size_t n, uint64_t deadline, part_fn fn)
{
    struct cstore *c = st->be;
    uint16_t *at = malloc(n * sizeof *at);
    uint8_t *todo = malloc(n);
    const store_key **keys = malloc(n * sizeof *keys);
    struct store_item *sub = malloc(n * sizeof *sub);
    size_t *idx = malloc(n * sizeof *idx);
    int rc = at && todo && keys && sub && idx ? map_ready(c, c->stale, deadline) : -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        items[i].status = rc ? rc : -ENOTCONN;   /* an unserved slot: as a node down */
        if (keys)
            keys[i] = items[i].key;
    }
    for (int round = 0; !rc && round < CL_TRIES; round++) {
        if (round && map_ready(c, 2, deadline))
            break;
        route(c, L, ns, keys, n, at);
        int ask = 0;
        for (size_t i = 0; i < n; i++) {
            todo[i] = round == 0 || items[i].status == STORE_MOVED;
            ask |= items[i].status == STORE_ASK;
        }
        send_parts(st, c, L, ns, items, n, at, todo, 0, fn, deadline, sub, idx);
        /* ASK: to the importing node named (the last one each node's replies named) */
        for (uint32_t j = 0; j < c->n_node; j++) {
            const char *to = store_rconn_redir(c->node[j].r);
            uint32_t t = node_of_addr(c, to, strlen(to));
            ask = 0;
            for (size_t i = 0; i < n; i++) {
                todo[i] = at[i] == j && items[i].status == STORE_ASK && t != CL_NONE;
                at[i] = todo[i] ? (uint16_t)t : at[i];
                ask |= todo[i];
            }
            if (ask)
                send_parts(st, c, L, ns, items, n, at, todo, 1, fn, deadline, sub, idx);
        }
        int again = 0;
        for (size_t i = 0; i < n; i++)
            again |= items[i].status == STORE_MOVED;
        if (!again)
            break;
    }
    for (size_t i = 0; i < n; i++) {
        int w = wants_map(items[i].status);
        c->stale = w > c->stale ? w : c->stale;
        items[i].status = settle(items[i].status);
    }
    free(at);
    free(todo);
    free(keys);
    free(sub);
    free(idx);
    return 0;
}

static int c_put(struct store *st, const struct store_layout *L, uint64_t ns,
                 struct store_item *items, size_t n, uint64_t deadline)
{
    return c_items(st, L, ns, items, n, deadline, store_rconn_put);
}

static int c_get(struct store *st, const struct store_layout *L, uint64_t ns,
                 struct store_item *items, size_t n, struct store_lend *lend,
                 uint64_t deadline)
{
    (void)lend;                  /* as redis.c's r_get: never kept */
    return c_items(st, L, ns, items, n, deadline, store_rconn_get);
}

/* A batch of keys as items (no payload): status 0 the reply was > 0, -ENOENT 0. */
static int part_keys(struct store *st, struct rstore *r, const char *verb,
                     const struct store_layout *L, uint64_t ns, struct store_item *sub,
                     size_t k, uint64_t deadline)
{
    store_key *ks = malloc(k * sizeof *ks);
    uint8_t *p = calloc(k, 1);
    int *e = calloc(k, sizeof *e);
    int rc = ks && p && e ? 0 : -ENOMEM;
    for (size_t t = 0; !rc && t < k; t++)
        ks[t] = *sub[t].key;
    if (!rc)
        rc = store_rconn_keys(st, r, verb, L, ns, ks, k, p, e, deadline);
    for (size_t t = 0; t < k; t++)
        sub[t].status = rc < 0 ? rc : e[t] ? e[t] : p[t] ? 0 : -ENOENT;
    free(ks);
    free(p);
    free(e);
    return 0;
}

static int part_exists(struct store *st, struct rstore *r, const struct store_layout *L,
                       uint64_t ns, struct store_item *sub, size_t k, uint64_t deadline)
{
    return part_keys(st, r, "EXISTS", L, ns, sub, k, deadline);
}

static int part_unlink(struct store *st, struct rstore *r, const struct store_layout *L,
                       uint64_t ns, struct store_item *sub, size_t k, uint64_t deadline)
{
    return part_keys(st, r, "UNLINK", L, ns, sub, k, deadline);
}

/* present[i] (NULL allowed) for each key; the count, or the failure of the first key when
   no node answered for any. */
static int c_keys(struct store *st, const struct store_layout *L, uint64_t ns,
                  const store_key *keys, size_t n, uint8_t *present, uint64_t deadline,
                  part_fn fn)
{
    struct store_item *it = calloc(n, sizeof *it);
    if (!it)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++)
        it[i].key = &keys[i];
    c_items(st, L, ns, it, n, deadline, fn);
    int found = 0, answered = 0;
    for (size_t i = 0; i < n; i++) {
        found += it[i].status == 0;
        answered |= it[i].status == 0 || it[i].status == -ENOENT;
        if (present)
            present[i] = it[i].status == 0;
    }
    int rc = answered || !n ? found : it[0].status;
    free(it);
    return rc;
}

static int c_lookup(struct store *st, const struct store_layout *L, uint64_t ns,
                    const store_key *keys, size_t n, uint8_t *present, uint64_t deadline)
{
    return c_keys(st, L, ns, keys, n, present, deadline, part_exists);
}

static int c_del(struct store *st, const struct store_layout *L, uint64_t ns,
                 const store_key *keys, size_t n, uint64_t deadline)
{
    return c_keys(st, L, ns, keys, n, NULL, deadline, part_unlink);
}

/* SCAN + UNLINK on every master of the map; the count, or the first master's failure
   (what the others removed stays removed). */
static int c_del_ns(struct store *st, const struct store_layout *L, uint64_t ns,
                    uint64_t deadline)
{
    struct cstore *c = st->be;
    char pat[STORE_NAME_MAX];
    if (L)
        snprintf(pat, sizeof pat, "kvvm1:%u:%llu:%llu:%016llx:*", L->n_regions,
                 (unsigned long long)L->bytes_per_token, (unsigned long long)L->page_size,
                 (unsigned long long)ns);
    else
        snprintf(pat, sizeof pat, "kvvm1:*:%016llx:*", (unsigned long long)ns);
    int rc = map_ready(c, c->stale, deadline), removed = 0;
    uint32_t order[CL_NODES_MAX], m = 0;
    for (uint32_t s = 0; !rc && s < CL_SLOTS; s++)
        if (c->slot[s] != CL_NONE && !listed(order, m, c->slot[s]))
            order[m++] = c->slot[s];
    for (uint32_t k = 0; k < m; k++) {
        int r = store_rconn_del_ns(c->node[order[k]].r, pat, 1, deadline);
        if (r < 0 && !rc)
            rc = settle(r);
        c->stale = wants_map(r) > c->stale ? wants_map(r) : c->stale;
        removed += r > 0 ? r : 0;
    }
    return rc ? rc : removed;
}

static void c_close(struct store *st)
{
    struct cstore *c = st->be;
    for (uint32_t i = 0; c->node && i < c->n_node; i++)
        store_rconn_free(c->node[i].r);
    free(c->node);
    free(c->slot);
    free(c->seeds);
    free(c->u.user);
    free(c->u.pass);
    free(c);
}

static const struct store_ops cluster_ops = {
    "redis-cluster", c_put, c_get, c_lookup, c_del, c_del_ns, c_close, NULL,
};

int store_cluster_open(struct store *st, const struct store_redis_url *u, const char *seeds)
{
    struct cstore *c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    c->node = calloc(CL_NODES_MAX, sizeof *c->node);
    c->slot = malloc(CL_SLOTS * sizeof *c->slot);
    c->seeds = strdup(seeds);
    c->u.user = u->user ? strdup(u->user) : NULL;
    c->u.pass = u->pass ? strdup(u->pass) : NULL;
    snprintf(c->where, sizeof c->where, "%s", seeds);
    st->be = c;
    st->ops = &cluster_ops;
    if (!c->node || !c->slot || !c->seeds || (u->user && !c->u.user) ||
        (u->pass && !c->u.pass)) {
        c_close(st);
        st->be = NULL;
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < CL_SLOTS; i++)
        c->slot[i] = CL_NONE;
    if (st->flags & STORE_F_LANE)
        return 0;                     /* the read lane: the map at its first request */
    int rc = map_refresh(c, know_ns() + st->timeout_ns);
    if (rc == -EACCES || rc == -EINVAL) {
        c_close(st);
        st->be = NULL;
        return rc;
    }
    return 0;
}
