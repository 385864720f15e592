/*
 * core/tier_store.c: the shared store (store/: file://, redis://, redis-cluster://) as the
 * list's entries tier (core/tiers.h: CORE_TIER_ENTRIES at CORE_LEVEL_STORE, the prefix
 * cache's fourth tier): opened from the configuration's store_url (none: off), its
 * operations (struct core_entry_ops) the store's calls under this context's layout, its
 * stats the store's counters, its policy row store_queue_bytes and store_timeout_ms.
 *
 * The only file of core/ that includes store/store.h or calls a store_* function of it:
 * core/storeq.c (the queue, its staging, fences and thread: the tier's completion
 * mechanism) calls the entry's operations, and the rest of core iterates the list. The
 * check is tests/tool_headers.sh's second rule (ctest tool_headers): in core's .c and .h
 * files, a grep -E for '"store/', the functions store/store.h declares followed by '(',
 * store_key, 'struct store_', 'enum store_op' and its STORE_ macros finds this file only.
 * The core types have store/'s layouts (checked below), so items, keys and lends pass
 * through as they are.
 */
#include "core.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include "common/assert.h"
#include "store/store.h"

#define SAME(a, b, f) (offsetof(struct a, f) == offsetof(struct b, f))
_Static_assert(sizeof(kvvm_key) == sizeof(store_key), "kvvm_key and store_key differ");
_Static_assert(sizeof(struct core_entry_item) == sizeof(struct store_item) &&
               SAME(core_entry_item, store_item, key) &&
               SAME(core_entry_item, store_item, iov) &&
               SAME(core_entry_item, store_item, iovcnt) &&
               SAME(core_entry_item, store_item, status), "core_entry_item is not store_item");
_Static_assert(sizeof(struct core_entry_lend) == sizeof(struct store_lend) &&
               SAME(core_entry_lend, store_lend, done) &&
               SAME(core_entry_lend, store_lend, arg) &&
               SAME(core_entry_lend, store_lend, kept), "core_entry_lend is not store_lend");
_Static_assert(sizeof(struct store_getreq) <= sizeof(((struct core_entry_get *)0)->be),
               "a get in flight does not fit struct core_entry_get");
_Static_assert(CORE_STORE_TIMEOUT_DEFAULT_MS == STORE_TIMEOUT_DEFAULT_MS, "timeout default");
_Static_assert((int)CORE_ENTRY_PUT == STORE_OP_PUT && (int)CORE_ENTRY_GET == STORE_OP_GET &&
               (int)CORE_ENTRY_LOOKUP == STORE_OP_LOOKUP &&
               (int)CORE_ENTRY_DELETE == STORE_OP_DELETE && (int)CORE_ENTRY_N == STORE_OP_N,
               "core_entry_op is not store_op");

/* The layer: the store and the layout every entry is named under. */
struct tier_store {
    struct store *st;
    struct store_layout L;
    kvvm *kv;                     /* its kv->store (the tests' hooks) cleared at close */
};

static int s_put(void *layer, uint64_t ns, struct core_entry_item *items, size_t n)
{
    struct tier_store *t = layer;
    return store_put(t->st, &t->L, ns, (struct store_item *)items, n);
}

static struct store_getreq *getreq(struct core_entry_get *g)
{
    return (struct store_getreq *)(void *)g->be.b;
}

static void s_get_start(void *layer, uint64_t ns, struct core_entry_item *items, size_t n,
                        struct core_entry_lend *lend, struct core_entry_get *g)
{
    struct tier_store *t = layer;
    store_get_start(t->st, &t->L, ns, (struct store_item *)items, n,
                    (struct store_lend *)lend, getreq(g));
}

static int s_get_first(struct core_entry_get *g)
{
    return store_get_first(getreq(g));
}

static int s_get_finish(struct core_entry_get *g)
{
    return store_get_finish(getreq(g));
}

static int s_lookup(void *layer, uint64_t ns, const kvvm_key *keys, size_t n, uint8_t *present)
{
    struct tier_store *t = layer;
    return store_lookup(t->st, &t->L, ns, (const store_key *)keys, n, present);
}

static int s_del(void *layer, uint64_t ns, const kvvm_key *keys, size_t n)
{
    struct tier_store *t = layer;
    if (!keys)
        return store_delete_ns(t->st, &t->L, ns);
    return store_delete(t->st, &t->L, ns, (const store_key *)keys, n);
}

static void s_reap(void *layer)
{
    store_reap(((struct tier_store *)layer)->st);
}

static void s_hist(void *layer, enum core_entry_op op, struct khist *out)
{
    store_hist_get(((struct tier_store *)layer)->st, (enum store_op)op, out);
}

static char *s_redact(const char *url, char *buf, size_t len)
{
    return store_url_redact(url, buf, len);
}

static const struct core_entry_ops store_ops = {
    .put = s_put, .get_start = s_get_start, .get_first = s_get_first,
    .get_finish = s_get_finish, .lookup = s_lookup, .del = s_del, .reap = s_reap,
    .hist = s_hist, .redact = s_redact,
};

/* The shared store of cfg.store_url (none without one): a down store is not an error.
   -EINVAL malformed URL, -EACCES credentials refused, -ENOMEM (store_open logs why). */
static int open_store(kvvm *kv, void **layer, struct pg_tier_ops *ops)
{
    (void)ops;                          /* not a paging level */
    if (!kv->cfg.store_url)
        return 0;
    if (!kv->cfg.store_timeout_ms)
        kv->cfg.store_timeout_ms = STORE_TIMEOUT_DEFAULT_MS;
    struct tier_store *t = calloc(1, sizeof *t);
    if (!t)
        return -ENOMEM;
    t->L = (struct store_layout){ kv->cfg.n_regions, kv->cfg.bytes_per_token,
                                  kv->cfg.page_size };
    int rc = store_open(kv->cfg.store_url, kv->cfg.store_timeout_ms, 0, &t->st);
    if (rc) {
        free(t);
        return rc;
    }
    KVVM_ASSERT(t->st);                 /* opened: a store, down or not */
    t->kv = kv;
    kv->store = t->st;
    *layer = t;
    return 0;
}

static void close_store(void *layer)
{
    struct tier_store *t = layer;
    t->kv->store = NULL;
    store_close(t->st);
    free(t);
}

static void stats_store(void *layer, struct core_tier_stats *out)
{
    struct store_stats s;
    store_stats_get(((struct tier_store *)layer)->st, &s);
    *out = (struct core_tier_stats){ .puts = s.puts, .gets = s.gets, .hits = s.hits,
                                     .errors = s.errors, .bytes_out = s.bytes_out,
                                     .bytes_in = s.bytes_in };
}

static void off_store(kvvm *kv, char *b, size_t n, size_t *pos)
{
    (void)kv;
    json_put(b, n, pos, "; no store tier (store_url unset)");
}

static void policy_store(kvvm *kv, struct core_tier_policy *out)
{
    *out = (struct core_tier_policy){ .queue_bytes = kv->cfg.store_queue_bytes,
                                      .timeout_ms = kv->cfg.store_timeout_ms };
}

const struct core_tier core_tier_store = {
    .name = "store", .kind = CORE_TIER_ENTRIES, .level = CORE_LEVEL_STORE,
    .open = open_store, .close = close_store, .stats = stats_store, .off = off_store,
    .policy = policy_store, .ent = &store_ops,
};
