/*
 * pool/server_prefix.c: the daemon's shared prefix index. The counts: pool/server_int.h;
 * design: docs/design.md "Sharing frames between clients".
 *
 * An entry is a record of kind SRV_REC_PREFIX keyed by (layout, namespace, key), holding
 * one frame per region (nrec, as an export's), in a hash index (chains; doubled at a load of
 * one, never shrunk) and an LRU list. PUBLISH: a client sends each new entry's frame ids
 * (ids it leased or maps) in chunks; an entry whose key is present already is not made (the
 * first one stays); the call's last chunk is answered with the entries made. LOOKUP: the
 * leading keys present (no allocation). ATTACH: the same, and their frames follow
 * (srv_send_frames): each one the client holds already goes held (no descriptor, no
 * count), each other one is counted as the client's mapping (nmap, its maps set: RETURN
 * gives it up) and goes with a descriptor. Both touch the entries found, last key first,
 * so a chain's root is its most recently used entry; a published entry goes just older
 * than its parent (the call's previous key): reclaim, oldest first, takes leaves before the
 * entries they extend. An entry outlives its publisher (its exit gives back its lease of
 * each frame; the entry keeps the frame live) and goes by DROP, by reclaim when no client
 * maps any of its frames, or with the daemon. An entry published with a serial is pending
 * (server_share.c, protocol.h "PENDING and READY"): a miss for LOOKUP and ATTACH until its
 * READY, and it goes with its publisher if that goes first.
 */
#include "server_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/assert.h"

static uint64_t key_hash(const struct pool_layout *lay, uint64_t ns, const uint8_t *key)
{
    uint64_t h = ns * 0x9e3779b97f4a7c15ull ^ lay->n_regions ^ lay->bytes_per_token << 20 ^
                 lay->page_size << 40, k;
    for (size_t i = 0; i < POOL_KEY_BYTES; i += 8) {
        memcpy(&k, key + i, 8);
        h = (h ^ k) * 0xff51afd7ed558ccdull;
        h ^= h >> 33;
    }
    return h;
}

static bool lay_eq(const struct pool_layout *a, const struct pool_layout *b)
{
    return a->n_regions == b->n_regions && a->bytes_per_token == b->bytes_per_token &&
           a->page_size == b->page_size;
}

static struct srv_rec *entry_find(const struct pool_srv *s, const struct pool_layout *lay,
                                  uint64_t ns, const uint8_t *key)
{
    if (!s->nbuck)
        return NULL;
    for (struct srv_rec *r = s->pbuck[key_hash(lay, ns, key) & (s->nbuck - 1)]; r;
         r = r->hnext)
        if (r->ns == ns && lay_eq(&r->lay, lay) && !memcmp(r->token, key, POOL_KEY_BYTES))
            return r;
    return NULL;
}

static void lru_unlink(struct pool_srv *s, struct srv_rec *r)
{
    if (r->lprev)
        r->lprev->lnext = r->lnext;
    else
        s->lru_old = r->lnext;
    if (r->lnext)
        r->lnext->lprev = r->lprev;
    else
        s->lru_new = r->lprev;
    r->lprev = r->lnext = NULL;
}

/* r goes just older than before (NULL: the newest end). */
static void lru_insert(struct pool_srv *s, struct srv_rec *r, struct srv_rec *before)
{
    r->lnext = before;
    r->lprev = before ? before->lprev : s->lru_new;
    if (r->lprev)
        r->lprev->lnext = r;
    else
        s->lru_old = r;
    if (before)
        before->lprev = r;
    else
        s->lru_new = r;
}

/* The index doubles at a load of one; a failed growth keeps the chains longer. */
static void index_grow(struct pool_srv *s)
{
    if (s->npfx < s->nbuck)
        return;
    size_t nb = s->nbuck ? 2 * s->nbuck : 1024;
    struct srv_rec **b = calloc(nb, sizeof *b);
    if (!b)
        return;
    for (size_t i = 0; i < s->nbuck; i++)
        for (struct srv_rec *r = s->pbuck[i], *next; r; r = next) {
            next = r->hnext;
            size_t k = key_hash(&r->lay, r->ns, r->token) & (nb - 1);
            r->hnext = b[k];
            b[k] = r;
        }
    free(s->pbuck);
    s->pbuck = b;
    s->nbuck = nb;
}

/* Entry r leaves the index; its holds go (frames nothing else holds die). */
void srv_prefix_entry_drop(struct pool_srv *s, struct srv_rec *r)
{
    srv_pend_unlink(s, r);
    struct srv_rec **p = &s->pbuck[key_hash(&r->lay, r->ns, r->token) & (s->nbuck - 1)];
    while (*p != r)
        p = &(*p)->hnext;
    *p = r->hnext;
    lru_unlink(s, r);
    KVVM_ASSERT(s->npfx > 0 && s->pfx_frames >= r->n);
    s->npfx--;
    s->pfx_frames -= r->n;
    for (uint32_t i = 0; i < r->n; i++) {
        KVVM_ASSERT(s->frames[r->slots[i]].nrec > 0);
        s->frames[r->slots[i]].nrec--;
        srv_frame_settle(s, r->slots[i]);
    }
    free(r->slots);
    free(r);
}

static void pub_free(struct srv_client *c)
{
    if (c->pub)
        free(c->pub->slots);
    free(c->pub);
    c->pub = NULL;
}

void srv_prefix_client_gone(struct pool_srv *s, struct srv_client *c)
{
    (void)s;
    pub_free(c);
}

void srv_prefix_close(struct pool_srv *s)
{
    while (s->lru_old)
        srv_prefix_entry_drop(s, s->lru_old);
    free(s->pbuck);
    s->pbuck = NULL;
    s->nbuck = 0;
}

/* Frames dropping r frees now: none when a client maps any of them. */
static size_t entry_frees(const struct pool_srv *s, const struct srv_rec *r)
{
    size_t n = 0;
    for (uint32_t i = 0; i < r->n; i++) {
        const struct srv_frame *f = &s->frames[r->slots[i]];
        if (f->nmap)
            return 0;
        n += f->owner < 0 && f->nrec == 1;
    }
    return n;
}

size_t srv_prefix_reclaim(struct pool_srv *s, size_t need)
{
    size_t freed = 0, dropped = 0;
    for (struct srv_rec *r = s->lru_old, *next; r && freed < need; r = next) {
        next = r->lnext;
        if (!entry_frees(s, r))
            continue;
        size_t before = s->leased;
        srv_prefix_entry_drop(s, r);
        freed += before - s->leased;
        dropped++;
    }
    if (dropped)
        fprintf(stderr, "kvvmd: the pool is short: dropped %zu shared prefix entr%s no client "
                "maps (%zu frames)\n", dropped, dropped == 1 ? "y" : "ies", freed);
    return freed;
}

static int result(struct srv_client *c, int32_t err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int result(struct srv_client *c, int32_t err, const char *fmt, ...)
{
    struct pool_result r = { .err = err };
    pool_proto_hdr(&r.h, POOL_MSG_RESULT);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r.text, sizeof r.text, fmt, ap);
    va_end(ap);
    return pool_proto_send(c->fd, &r, NULL, 0, MSG_DONTWAIT);
}

/* The last chunk of c->pub arrived: the entry enters the index unless its key is there. */
static void publish_commit(struct pool_srv *s, struct srv_client *c)
{
    struct srv_rec *e = c->pub, *parent = c->pub_has_prev ?
        entry_find(s, &e->lay, e->ns, c->pub_prev) : NULL;
    c->pub = NULL;
    memcpy(c->pub_prev, e->token, POOL_KEY_BYTES);
    c->pub_has_prev = true;
    if (entry_find(s, &e->lay, e->ns, e->token)) {
        free(e->slots);             /* present: the first entry stays */
        free(e);
        return;
    }
    index_grow(s);
    KVVM_ASSERT(s->nbuck > 0 || s->npfx == 0);
    if (!s->nbuck) {                /* no index (memory): not entered */
        free(e->slots);
        free(e);
        return;
    }
    for (uint32_t i = 0; i < e->n; i++)
        s->frames[e->slots[i]].nrec++;
    size_t k = key_hash(&e->lay, e->ns, e->token) & (s->nbuck - 1);
    e->hnext = s->pbuck[k];
    s->pbuck[k] = e;
    e->serial = ++s->rec_serial;
    lru_insert(s, e, parent);       /* older than the entry it extends */
    s->npfx++;
    s->pfx_frames += e->n;
    c->pub_new++;
    if (e->pend)
        srv_pend_add(c, e);         /* a miss for every lookup until its READY */
}

int srv_on_prefix_publish(struct pool_srv *s, struct srv_client *c,
                          const struct pool_prefix_publish *m)
{
    if (c->role != POOL_ROLE_CLIENT || m->lay.page_size != s->page ||
        m->total != m->lay.n_regions)
        return -EPROTO;
    struct srv_rec *e = c->pub;
    if (!e) {
        if (m->off != 0)
            return -EPROTO;                 /* a chunk of no entry */
        e = calloc(1, sizeof *e);
        if (e)
            e->slots = malloc((size_t)m->total * sizeof *e->slots);
        if (!e || !e->slots) {
            free(e);
            return -EPROTO;                 /* cannot follow its chunks: as malformed */
        }
        e->kind = SRV_REC_PREFIX;
        e->lay = m->lay;
        e->lay.pad = 0;
        e->ns = m->ns;
        e->total = m->total;
        e->claimed = -1;
        e->from = c->pid;
        e->pend = m->serial;
        memcpy(e->token, m->key, POOL_KEY_BYTES);
        c->pub = e;
    } else if (m->off != e->n || m->total != e->total || m->ns != e->ns ||
               m->serial != e->pend || memcmp(m->key, e->token, POOL_KEY_BYTES) != 0) {
        return -EPROTO;                     /* out of order */
    }
    for (uint32_t i = 0; i < m->n; i++) {
        long slot = srv_frame_any(s, m->ids[i]);
        if (slot < 0 || !srv_holds(s, c, (size_t)slot))
            return -EPROTO;                 /* neither leased nor mapped by it */
        e->slots[e->n++] = (uint32_t)slot;
    }
    if (e->n == e->total)
        publish_commit(s, c);
    if (!m->last)
        return 0;
    uint32_t made = c->pub_new;
    c->pub_new = 0;
    c->pub_has_prev = false;
    return result(c, (int32_t)made, "%u new shared entr%s", made, made == 1 ? "y" : "ies");
}

/* The frames of entries e[0..k), in order, in full FRAMES messages (POOL_BATCH_MAX each,
   whatever the entries' sizes: one message per entry made an attach of 64 blocks of 2
   regions 64 messages, each a wake-up and a receive of the client). 0; -errno. */
static int send_entries(struct pool_srv *s, struct srv_client *c, struct srv_rec *const *e,
                        uint32_t k)
{
    uint32_t batch[POOL_BATCH_MAX], n = 0;
    int rc = 0;
    for (uint32_t i = 0; !rc && i < k; i++)
        for (uint32_t j = 0; !rc && j < e[i]->n; j++) {
            batch[n++] = e[i]->slots[j];
            if (n == POOL_BATCH_MAX) {
                rc = srv_send_frames(s, c, batch, n);
                n = 0;
            }
        }
    return rc || !n ? rc : srv_send_frames(s, c, batch, n);
}

int srv_on_prefix_keys(struct pool_srv *s, struct srv_client *c,
                       const struct pool_prefix_keys *m, bool attach)
{
    if (c->role != POOL_ROLE_CLIENT)
        return -EPROTO;
    struct srv_rec *found[POOL_PREFIX_KEYS];
    uint32_t k = 0, total = 0;
    while (k < m->n && (found[k] = entry_find(s, &m->lay, m->ns, m->keys[k])) &&
           !found[k]->pend) {               /* a pending entry is a miss */
        total += found[k]->n;
        k++;
    }
    for (uint32_t i = k; i-- > 0;) {        /* the root ends the newest */
        lru_unlink(s, found[i]);
        lru_insert(s, found[i], NULL);
    }
    struct pool_prefix_found r = { .found = k, .total = attach ? total : 0 };
    pool_proto_hdr(&r.h, POOL_MSG_PREFIX_FOUND);
    if (attach && total && srv_maps_reserve(c, total)) {
        r.err = -ENOMEM;
        r.found = r.total = 0;
        return pool_proto_send(c->fd, &r, NULL, 0, MSG_DONTWAIT);
    }
    int rc = pool_proto_send(c->fd, &r, NULL, 0, MSG_DONTWAIT);
    return rc || !attach ? rc : send_entries(s, c, found, k);
}

int srv_on_prefix_drop(struct pool_srv *s, struct srv_client *c,
                       const struct pool_prefix_drop *m)
{
    if (c->role != POOL_ROLE_CLIENT && c->role != POOL_ROLE_CONTROL)
        return -EPROTO;
    uint32_t n = 0;
    if (m->scope == POOL_DROP_KEYS) {
        for (uint32_t i = 0; i < m->n; i++) {
            struct srv_rec *r = entry_find(s, &m->lay, m->ns, m->keys[i]);
            if (r) {
                srv_prefix_entry_drop(s, r);
                n++;
            }
        }
    } else {
        for (struct srv_rec *r = s->lru_old, *next; r; r = next) {
            next = r->lnext;
            if (m->scope == POOL_DROP_ALL ||
                (r->ns == m->ns && (!m->lay.n_regions || lay_eq(&r->lay, &m->lay)))) {
                srv_prefix_entry_drop(s, r);
                n++;
            }
        }
    }
    if (n)
        fprintf(stderr, "kvvmd: %s (pid %d) dropped %u shared prefix entr%s\n",
                c->name[0] ? c->name : "kvvmctl", (int)c->pid, n, n == 1 ? "y" : "ies");
    return result(c, (int32_t)n, "%u shared prefix entr%s dropped", n, n == 1 ? "y" : "ies");
}
