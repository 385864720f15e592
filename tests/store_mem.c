/*
 * tests/store_mem.c: a test-only store, entries in plain memory, added to the list of tiers
 * with one entry (core/tiers.h, core_tiers_add, CORE_TIER_ENTRIES): the proof that the
 * store is an entry of the list like the page tiers, and that core/storeq.c (the queue,
 * its staging, fences and thread) reaches it through the entry's operations only.
 *
 * A map (namespace, key, layout) -> bytes, shared by every context of the process (a cache
 * that outlives them, as store/'s are), under one mutex: puts come from the store thread,
 * gets and lookups from the callers without the context lock. A get is whole at its start
 * (nothing left in flight: a lend is never kept) and answered at its finish; a get that is
 * started twice or finished without a start counts a misuse. A value whose size is not the
 * item's is -EBADMSG, as store/'s contract says.
 */
#include "store_mem.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"

struct sm_entry {
    uint64_t ns;
    uint32_t n_regions;
    size_t page_size;
    kvvm_key key;
    unsigned char *bytes;
    size_t len;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct sm_entry *map;
static size_t n_map, cap_map;
static bool use;
static unsigned long misuses;
static unsigned open_layers;

/* A context's layer: its layout, its counters. */
struct sm_layer {
    uint32_t n_regions;
    size_t page_size;
    struct core_tier_stats st;    /* puts, gets, hits, errors, bytes_out, bytes_in (mu) */
    unsigned in_flight;           /* gets started, not finished (atomic) */
};

/* A get between its start and its finish (in struct core_entry_get's bytes). */
struct sm_get {
    unsigned magic;               /* SM_STARTED between start and finish */
    struct sm_layer *l;
    uint64_t ns;
    struct core_entry_item *items;
    size_t n;
    int hits;
};
#define SM_STARTED 0x5e6d6574u
_Static_assert(sizeof(struct sm_get) <= sizeof(((struct core_entry_get *)0)->be), "sm_get");

unsigned long store_mem_misuses(void)
{
    return __atomic_load_n(&misuses, __ATOMIC_RELAXED);
}

size_t store_mem_entries(void)
{
    pthread_mutex_lock(&mu);
    size_t n = n_map;
    pthread_mutex_unlock(&mu);
    return n;
}

unsigned store_mem_open_layers(void)
{
    return __atomic_load_n(&open_layers, __ATOMIC_RELAXED);
}

static void misuse(void)
{
    __atomic_add_fetch(&misuses, 1, __ATOMIC_RELAXED);
}

/* The entry of (l's layout, ns, k), or NULL (mu held). */
static struct sm_entry *find(const struct sm_layer *l, uint64_t ns, const kvvm_key *k)
{
    for (size_t i = 0; i < n_map; i++)
        if (map[i].ns == ns && map[i].n_regions == l->n_regions &&
            map[i].page_size == l->page_size && !memcmp(map[i].key.bytes, k->bytes, 32))
            return &map[i];
    return NULL;
}

static size_t iov_bytes(const struct core_entry_item *it)
{
    size_t n = 0;
    for (int i = 0; i < it->iovcnt; i++)
        n += it->iov[i].iov_len;
    return n;
}

/* Writes one item (mu held): replaces an entry of the same name. */
static int put_one(struct sm_layer *l, uint64_t ns, const struct core_entry_item *it)
{
    size_t len = iov_bytes(it), off = 0;
    unsigned char *b = malloc(len ? len : 1);
    if (!b)
        return -ENOMEM;
    for (int i = 0; i < it->iovcnt; i++) {
        memcpy(b + off, it->iov[i].iov_base, it->iov[i].iov_len);
        off += it->iov[i].iov_len;
    }
    struct sm_entry *e = find(l, ns, it->key);
    if (!e) {
        if (n_map == cap_map) {
            size_t cap = cap_map ? 2 * cap_map : 64;
            struct sm_entry *m = realloc(map, cap * sizeof *m);
            if (!m) {
                free(b);
                return -ENOMEM;
            }
            map = m;
            cap_map = cap;
        }
        e = &map[n_map++];
        *e = (struct sm_entry){ ns, l->n_regions, l->page_size, *it->key, NULL, 0 };
    }
    free(e->bytes);
    e->bytes = b;
    e->len = len;
    l->st.bytes_out += len;
    return 0;
}

static int m_put(void *layer, uint64_t ns, struct core_entry_item *items, size_t n)
{
    struct sm_layer *l = layer;
    int done = 0;
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < n; i++) {
        items[i].status = put_one(l, ns, &items[i]);
        done += !items[i].status;
        l->st.puts += !items[i].status;
        l->st.errors += !!items[i].status;
    }
    pthread_mutex_unlock(&mu);
    return done;
}

/* Reads one item (mu held). */
static int get_one(struct sm_layer *l, uint64_t ns, struct core_entry_item *it)
{
    const struct sm_entry *e = find(l, ns, it->key);
    if (!e)
        return -ENOENT;
    if (e->len != iov_bytes(it)) {
        l->st.errors++;
        return -EBADMSG;
    }
    size_t off = 0;
    for (int i = 0; i < it->iovcnt; i++) {
        memcpy(it->iov[i].iov_base, e->bytes + off, it->iov[i].iov_len);
        off += it->iov[i].iov_len;
    }
    l->st.gets++;
    l->st.bytes_in += e->len;
    return 0;
}

static void m_get_start(void *layer, uint64_t ns, struct core_entry_item *items, size_t n,
                        struct core_entry_lend *lend, struct core_entry_get *g)
{
    struct sm_get *q = (struct sm_get *)(void *)g->be.b;
    if (q->magic == SM_STARTED)
        misuse();                          /* started again before its finish */
    *q = (struct sm_get){ SM_STARTED, layer, ns, items, n, 0 };
    if (lend)
        lend->kept = 0;                    /* nothing is ever left in flight */
    __atomic_add_fetch(&((struct sm_layer *)layer)->in_flight, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < n; i++) {
        items[i].status = get_one(layer, ns, &items[i]);
        q->hits += !items[i].status;
    }
    pthread_mutex_unlock(&mu);
}

static int m_get_first(struct core_entry_get *g)
{
    struct sm_get *q = (struct sm_get *)(void *)g->be.b;
    if (q->magic != SM_STARTED) {
        misuse();
        return 0;
    }
    return q->n && q->items[0].status == 0;
}

static int m_get_finish(struct core_entry_get *g)
{
    struct sm_get *q = (struct sm_get *)(void *)g->be.b;
    if (q->magic != SM_STARTED) {
        misuse();                          /* a finish without its start */
        return -EINVAL;
    }
    q->magic = 0;
    __atomic_sub_fetch(&q->l->in_flight, 1, __ATOMIC_RELAXED);
    return q->hits;
}

static int m_lookup(void *layer, uint64_t ns, const kvvm_key *keys, size_t n, uint8_t *present)
{
    struct sm_layer *l = layer;
    int found = 0;
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < n; i++) {
        bool p = find(l, ns, &keys[i]) != NULL;
        if (present)
            present[i] = p;
        found += p;
    }
    l->st.hits += (uint64_t)found;
    pthread_mutex_unlock(&mu);
    return found;
}

static void drop_at(size_t i)
{
    free(map[i].bytes);
    map[i] = map[--n_map];
}

static int m_del(void *layer, uint64_t ns, const kvvm_key *keys, size_t n)
{
    struct sm_layer *l = layer;
    int gone = 0;
    pthread_mutex_lock(&mu);
    if (!keys) {
        for (size_t i = n_map; i-- > 0;)
            if (map[i].ns == ns && map[i].n_regions == l->n_regions &&
                map[i].page_size == l->page_size) {
                drop_at(i);
                gone++;
            }
    }
    for (size_t j = 0; keys && j < n; j++) {
        struct sm_entry *e = find(l, ns, &keys[j]);
        if (e) {
            drop_at((size_t)(e - map));
            gone++;
        }
    }
    pthread_mutex_unlock(&mu);
    return gone;
}

static void m_reap(void *layer)
{
    (void)layer;                           /* never keeps a lent buffer */
}

static const struct core_entry_ops mem_ops = {
    .put = m_put, .get_start = m_get_start, .get_first = m_get_first,
    .get_finish = m_get_finish, .lookup = m_lookup, .del = m_del, .reap = m_reap,
};

static int open_mem(kvvm *kv, void **layer, struct pg_tier_ops *ops)
{
    (void)ops;
    if (!use)
        return 0;                          /* off: the store of store_url, if any */
    struct sm_layer *l = calloc(1, sizeof *l);
    if (!l)
        return -ENOMEM;
    l->n_regions = kv->cfg.n_regions;
    l->page_size = kv->cfg.page_size;
    __atomic_add_fetch(&open_layers, 1, __ATOMIC_RELAXED);
    *layer = l;
    return 0;
}

static void close_mem(void *layer)
{
    struct sm_layer *l = layer;
    if (__atomic_load_n(&l->in_flight, __ATOMIC_RELAXED))
        misuse();                          /* a get started and never finished */
    __atomic_sub_fetch(&open_layers, 1, __ATOMIC_RELAXED);
    free(l);
}

static void stats_mem(void *layer, struct core_tier_stats *out)
{
    struct sm_layer *l = layer;
    pthread_mutex_lock(&mu);
    *out = (struct core_tier_stats){ .puts = l->st.puts, .gets = l->st.gets,
                                     .hits = l->st.hits, .errors = l->st.errors,
                                     .bytes_out = l->st.bytes_out, .bytes_in = l->st.bytes_in };
    pthread_mutex_unlock(&mu);
}

static void off_mem(kvvm *kv, char *b, size_t n, size_t *pos)
{
    (void)kv;
    json_put(b, n, pos, "; no mem store (store_mem_use not called)");
}

static void policy_mem(kvvm *kv, struct core_tier_policy *out)
{
    *out = (struct core_tier_policy){ .queue_bytes = kv->cfg.store_queue_bytes };
}

static const struct core_tier mem_store = {
    .name = "mem store", .kind = CORE_TIER_ENTRIES, .level = CORE_LEVEL_STORE,
    .open = open_mem, .close = close_mem, .stats = stats_mem, .off = off_mem,
    .policy = policy_mem, .ent = &mem_ops,
};

int store_mem_use(bool on)
{
    static bool added;
    if (!added) {
        int rc = core_tiers_add(&mem_store);     /* the one list entry */
        if (rc)
            return rc;
        added = true;
    }
    use = on;
    return 0;
}
