/*
 * pool/client_frames.c: the handles a context's connection handed out, and their local uses
 * (contract in pool/client.h; the state in pool/client_int.h; the protocol's side:
 * pool/protocol.h "Held frames").
 *
 * Every handle paging holds from the pool is in by_h (handle -> the daemon's frame id,
 * tagged POOL_CLI_MAPPED for a frame mapped from an import or an attach, POOL_CLI_FOREIGN
 * for a frame of a daemon that went) with its local uses: the paging frames holding it. A
 * handle has one use when made (a lease's frame handed out, a frame imported); a frame an
 * import or attach receives held (the daemon saw that this client holds it already: the
 * same client's export imported again, blocks attached again while mapped) is the handle
 * by_id names for its id, with one more use, and paging adopts it as a second frame (one
 * handle mapped at several addresses, as the driver allows). The daemon counts the frame
 * once for this client, so only the last use gives it back: pool_cli_handle_put releases
 * the handle and sends RETURN when the uses reach 0. by_id holds the connected daemon's
 * ids only (a reconnection clears it): a held id it does not name is a malformed reply.
 */
#include "client_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/assert.h"
#include "common/log.h"

/* ---- the tables -------------------------------------------------------------------------- */

static size_t home(const struct pool_cli_tab *t, uint64_t key)
{
    return (size_t)(key * 0x9e3779b97f4a7c15ull >> 17) & (t->cap - 1);
}

/* key's entry, or SIZE_MAX. */
static size_t tab_find(const struct pool_cli_tab *t, uint64_t key)
{
    if (!t->cap)
        return SIZE_MAX;
    size_t i = home(t, key);
    while (t->key[i] && t->key[i] != key)
        i = (i + 1) & (t->cap - 1);
    return t->key[i] ? i : SIZE_MAX;
}

/* Enters key (absent, never 0) with val and one use. 0; -ENOMEM (nothing entered). */
static int tab_put(struct pool_cli_tab *t, uint64_t key, uint64_t val)
{
    KVVM_ASSERT(key != 0 && tab_find(t, key) == SIZE_MAX);
    if (2 * (t->n + 1) > t->cap) {
        struct pool_cli_tab g = { .cap = t->cap ? 2 * t->cap : 256 };
        g.key = calloc(g.cap, sizeof *g.key);
        g.val = calloc(g.cap, sizeof *g.val);
        g.use = calloc(g.cap, sizeof *g.use);
        if (!g.key || !g.val || !g.use) {
            free(g.key);
            free(g.val);
            free(g.use);
            return -ENOMEM;
        }
        for (size_t i = 0; i < t->cap; i++) {
            if (!t->key[i])
                continue;
            size_t j = home(&g, t->key[i]);
            while (g.key[j])
                j = (j + 1) & (g.cap - 1);
            g.key[j] = t->key[i];
            g.val[j] = t->val[i];
            g.use[j] = t->use[i];
            g.n++;
        }
        pool_cli_tab_free(t);
        *t = g;
    }
    size_t i = home(t, key);
    while (t->key[i])
        i = (i + 1) & (t->cap - 1);
    t->key[i] = key;
    t->val[i] = val;
    t->use[i] = 1;
    t->n++;
    return 0;
}

/* Empties entry i, moving back the entries after it that probed past it. */
static void tab_del(struct pool_cli_tab *t, size_t i)
{
    KVVM_ASSERT(t->key[i] && t->n > 0);
    t->key[i] = 0;
    t->n--;
    for (size_t j = (i + 1) & (t->cap - 1); t->key[j]; j = (j + 1) & (t->cap - 1)) {
        size_t h = home(t, t->key[j]);
        bool past = i <= j ? (h <= i || h > j) : (h <= i && h > j);
        if (past) {
            t->key[i] = t->key[j];
            t->val[i] = t->val[j];
            t->use[i] = t->use[j];
            t->key[j] = 0;
            i = j;
        }
    }
}

void pool_cli_tab_free(struct pool_cli_tab *t)
{
    free(t->key);
    free(t->val);
    free(t->use);
    *t = (struct pool_cli_tab){ 0 };
}

/* ---- handles ------------------------------------------------------------------------------ */

uint64_t pool_cli_map_get(const struct pool_cli *c, uint64_t key)
{
    size_t i = tab_find(&c->by_h, key);
    return i == SIZE_MAX ? 0 : c->by_h.val[i];
}

int pool_cli_handle_add(struct pool_cli *c, vmm_handle h, uint64_t id)
{
    int rc = tab_put(&c->by_h, h.h, id);
    if (rc || id == POOL_CLI_FOREIGN)
        return rc;
    if ((rc = tab_put(&c->by_id, id & ~POOL_CLI_MAPPED, h.h))) {
        tab_del(&c->by_h, tab_find(&c->by_h, h.h));
        return rc;
    }
    c->n_mapped += (id & POOL_CLI_MAPPED) != 0;
    return 0;
}

int pool_cli_handle_put(struct pool_cli *c, vmm_handle h)
{
    size_t i = tab_find(&c->by_h, h.h);
    KVVM_ASSERT(i != SIZE_MAX);             /* every frame paging holds came from here */
    if (i == SIZE_MAX)
        return vmm_phys_release(c->v, h) ? -EIO : 0;
    KVVM_ASSERT(c->by_h.use[i] > 0);
    if (c->by_h.use[i] > 1) {               /* another paging frame still maps it */
        c->by_h.use[i]--;
        return 0;
    }
    if (vmm_phys_release(c->v, h))
        return -EIO;                        /* refused: still ours, still in the tables */
    uint64_t id = c->by_h.val[i];
    tab_del(&c->by_h, i);
    if (id == POOL_CLI_FOREIGN)
        return 0;                           /* the daemon that leased it is gone */
    size_t k = tab_find(&c->by_id, id & ~POOL_CLI_MAPPED);
    KVVM_ASSERT(k != SIZE_MAX && c->by_id.val[k] == h.h);
    if (k != SIZE_MAX)
        tab_del(&c->by_id, k);
    if (id & POOL_CLI_MAPPED) {
        KVVM_ASSERT(c->n_mapped > 0);
        c->n_mapped--;
    }
    pool_cli_give_back_locked(c, id);       /* its last use: the daemon's count goes */
    return 0;
}

void pool_cli_handles_foreign(struct pool_cli *c)
{
    for (size_t i = 0; i < c->by_h.cap; i++)
        if (c->by_h.key[i])
            c->by_h.val[i] = POOL_CLI_FOREIGN;
    pool_cli_tab_free(&c->by_id);           /* the new daemon's ids name none of them */
    c->n_mapped = 0;                        /* a foreign frame is neither leased nor mapped */
}

/* ---- an import's or attach's frames ------------------------------------------------------- */

/* The handle of held frame id with one more use into *h. 0; -EPROTO: this client holds no
   frame of that id (a malformed reply). */
static int take_held_locked(struct pool_cli *c, uint64_t id, vmm_handle *h)
{
    size_t k = tab_find(&c->by_id, id);
    size_t i = k == SIZE_MAX ? SIZE_MAX : tab_find(&c->by_h, c->by_id.val[k]);
    if (i == SIZE_MAX)
        return -EPROTO;
    KVVM_ASSERT(c->by_h.use[i] > 0 && c->by_h.use[i] < UINT32_MAX);
    c->by_h.use[i]++;
    h->h = c->by_h.key[i];
    return 0;
}

/* Imports descriptor fd of frame id as *h, remembered as mapped. 0; -errno (nothing kept). */
static int import_one_locked(struct pool_cli *c, int fd, uint64_t id, vmm_handle *h)
{
    int rc = vmm_handle_import(c->v, fd, c->page, h);
    if (rc)
        return rc;
    if ((rc = pool_cli_handle_add(c, *h, id | POOL_CLI_MAPPED))) {
        (void)vmm_phys_release(c->v, *h);
        h->h = 0;
    }
    return rc;
}

/* One FRAMES message f (its descriptors fds[0..nfds), closed here) into hs and ids from
   *got on (at most n in all), *rc the first failure. */
static void frames_one_locked(struct pool_cli *c, const struct pool_frames *f, const int *fds,
                              int nfds, vmm_handle *hs, uint64_t *ids, uint32_t n,
                              uint32_t *got, int *rc)
{
    int k = 0;
    for (uint32_t i = 0; i < f->n; i++, (*got)++) {
        bool held = f->held >> i & 1;
        int fd = held ? -1 : fds[k++];
        if (*got >= n) {
            *rc = *rc ? *rc : -EPROTO;          /* more than announced */
        } else {
            hs[*got].h = 0;
            ids[*got] = held ? 0 : f->ids[i];   /* a count the daemon took */
            if (!*rc)
                *rc = held ? take_held_locked(c, f->ids[i], &hs[*got])
                           : import_one_locked(c, fd, f->ids[i], &hs[*got]);
        }
        if (fd >= 0)
            close(fd);
    }
    KVVM_ASSERT(k == nfds);                     /* pool_proto_check: one per id not held */
}

int pool_cli_frames_locked(struct pool_cli *c, vmm_handle *hs, uint64_t *ids, uint32_t n)
{
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    int fds[POOL_BATCH_MAX], nfds = 0, rc = 0;
    uint32_t got = 0;
    while (got < n) {
        if (pool_cli_recv_locked(c, POOL_MSG_FRAMES, buf, fds, N_FDS(fds), &nfds))
            return -EIO;
        frames_one_locked(c, (const void *)buf, fds, nfds, hs, ids, n, &got, &rc);
    }
    if (rc == -EPROTO) {                /* the connection ends: the daemon frees its counts */
        pool_cli_gone_locked(c, "a malformed reply (a held frame it does not hold, or more "
                             "frames than announced)");
        return -EIO;
    }
    return rc;
}

void pool_cli_frames_undo_locked(struct pool_cli *c, const vmm_handle *hs, const uint64_t *ids,
                                 uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        if (hs[i].h) {
            if (pool_cli_handle_put(c, hs[i]))
                klog_error("pool: a frame's release was refused; its handle is kept until "
                           "the context closes");
        } else if (ids && ids[i]) {
            pool_cli_give_back_locked(c, ids[i] | POOL_CLI_MAPPED);    /* counted, not used */
        }
    }
}
