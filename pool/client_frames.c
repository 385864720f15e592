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

/* ---- the tables (common/ktab.h) ---------------------------------------------------------- */

/* by_h's value: the daemon's frame id (tagged) and the handle's local uses. */
struct by_h_val {
    uint64_t id;
    uint32_t use;
};

static struct by_h_val *h_val(const struct pool_cli *c, size_t i)
{
    return ktab_val(&c->by_h, i);
}

static uint64_t id_val(const struct pool_cli *c, size_t k)
{
    return *(const uint64_t *)ktab_val(&c->by_id, k);
}

/* Frees table t (by_h or by_id): the client's close (client.c) and a reconnection. */
void pool_cli_tab_free(struct ktab *t)
{
    ktab_free(t);
}

/* ---- handles ------------------------------------------------------------------------------ */

uint64_t pool_cli_map_get(const struct pool_cli *c, uint64_t key)
{
    size_t i = ktab_find(&c->by_h, key);
    return i == SIZE_MAX ? 0 : h_val(c, i)->id;
}

int pool_cli_handle_add(struct pool_cli *c, vmm_handle h, uint64_t id)
{
    bool foreign = id == POOL_CLI_FOREIGN;
    int rc = ktab_reserve(&c->by_h, 1, sizeof(struct by_h_val));
    if (rc || (!foreign && (rc = ktab_reserve(&c->by_id, 1, sizeof(uint64_t)))))
        return rc;
    /* commit: nothing below fails */
    *h_val(c, ktab_put(&c->by_h, h.h)) = (struct by_h_val){ .id = id, .use = 1 };
    if (foreign)
        return 0;
    *(uint64_t *)ktab_val(&c->by_id, ktab_put(&c->by_id, id & ~POOL_CLI_MAPPED)) = h.h;
    c->n_mapped += (id & POOL_CLI_MAPPED) != 0;
    return 0;
}

int pool_cli_handle_put(struct pool_cli *c, vmm_handle h)
{
    size_t i = ktab_find(&c->by_h, h.h);
    KVVM_ASSERT(i != SIZE_MAX);             /* every frame paging holds came from here */
    if (i == SIZE_MAX)
        return vmm_phys_release(c->v, h) ? -EIO : 0;
    struct by_h_val *v = h_val(c, i);
    KVVM_ASSERT(v->use > 0);
    if (v->use > 1) {                       /* another paging frame still maps it */
        v->use--;
        return 0;
    }
    if (vmm_phys_release(c->v, h))
        return -EIO;                        /* refused: still ours, still in the tables */
    uint64_t id = v->id;
    ktab_del(&c->by_h, i);
    if (id == POOL_CLI_FOREIGN)
        return 0;                           /* the daemon that leased it is gone */
    size_t k = ktab_find(&c->by_id, id & ~POOL_CLI_MAPPED);
    KVVM_ASSERT(k != SIZE_MAX && id_val(c, k) == h.h);
    if (k != SIZE_MAX)
        ktab_del(&c->by_id, k);
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
            h_val(c, i)->id = POOL_CLI_FOREIGN;
    pool_cli_tab_free(&c->by_id);           /* the new daemon's ids name none of them */
    c->n_mapped = 0;                        /* a foreign frame is neither leased nor mapped */
}

/* ---- an import's or attach's frames ------------------------------------------------------- */

/* The handle of held frame id with one more use into *h. 0; -EPROTO: this client holds no
   frame of that id (a malformed reply). */
static int take_held_locked(struct pool_cli *c, uint64_t id, vmm_handle *h)
{
    size_t k = ktab_find(&c->by_id, id);
    size_t i = k == SIZE_MAX ? SIZE_MAX : ktab_find(&c->by_h, id_val(c, k));
    if (i == SIZE_MAX)
        return -EPROTO;
    KVVM_ASSERT(h_val(c, i)->use > 0 && h_val(c, i)->use < UINT32_MAX);
    h_val(c, i)->use++;
    h->h = c->by_h.key[i];
    return 0;
}

/* Imported handle h of frame id remembered as mapped, into *out. 0; -errno (h released). */
static int imported_locked(struct pool_cli *c, vmm_handle h, uint64_t id, vmm_handle *out)
{
    int rc = pool_cli_handle_add(c, h, id | POOL_CLI_MAPPED);
    if (rc)
        (void)vmm_phys_release(c->v, h);
    else
        *out = h;
    return rc;
}

/* One FRAMES message f (its descriptors fds[0..nfds), one per frame not held, imported in
   one call or closed here) into hs and ids from *got on (at most n in all), *rc the first
   failure (-EPROTO, a malformed reply, before any other). */
static void frames_one_locked(struct pool_cli *c, const struct pool_frames *f, const int *fds,
                              int nfds, vmm_handle *hs, uint64_t *ids, uint32_t n,
                              uint32_t *got, int *rc)
{
    vmm_handle in[POOL_BATCH_MAX];
    size_t made = 0, k = 0;
    int err = 0;
    bool over = f->n > n - *got;                /* more than announced */
    if (over || *rc) {
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
        if (over) {
            *rc = -EPROTO;
            *got = n;
            return;
        }
    } else if (nfds > 0) {                      /* the importer's context checked once */
        err = vmm_handles_import(c->v, fds, (size_t)nfds, c->page, in, &made);
    }
    for (uint32_t i = 0; i < f->n; i++, (*got)++) {
        bool held = f->held >> i & 1;
        hs[*got].h = 0;
        ids[*got] = held ? 0 : f->ids[i];       /* a count the daemon took */
        int e = 0;
        if (held && !*rc)
            e = take_held_locked(c, f->ids[i], &hs[*got]);
        else if (!held && k < made)
            e = imported_locked(c, in[k++], f->ids[i], &hs[*got]);
        if (e && (!*rc || e == -EPROTO))
            *rc = e;
    }
    KVVM_ASSERT(k == made && made <= (size_t)nfds);
    if (err && !*rc)
        *rc = err;
}

int pool_cli_frames_locked(struct pool_cli *c, vmm_handle *hs, uint64_t *ids, uint32_t n)
{
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    int fds[POOL_BATCH_MAX], nfds = 0, rc = 0;
    uint32_t got = 0;
    pool_cli_req_begin(c);                  /* one request: every FRAMES is this call's */
    while (got < n) {
        if (pool_cli_recv_locked(c, POOL_MSG_FRAMES, buf, fds, N_FDS(fds), &nfds)) {
            pool_cli_req_end(c);
            return -EIO;
        }
        frames_one_locked(c, (const void *)buf, fds, nfds, hs, ids, n, &got, &rc);
    }
    pool_cli_req_end(c);
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
