/*
 * pool/client_share.c: a context's requests to the daemon's shared prefix index (contract
 * in pool/client.h "Shared prefix index"; the daemon's side: pool/server_prefix.c).
 *
 * Every request is one request per POOL_PREFIX_KEYS keys at most, under the connection's
 * mutex. Frames an attach receives are imported and remembered as mapped (as an import's),
 * so pool_cli_release gives each mapping up; a frame this client holds already (blocks
 * attached again while a sequence still maps them) comes held: its handle with one more
 * local use (pool/client_frames.c).
 */
#include "client_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/assert.h"

/* The socket, trying it again when the daemon went. 0; -EIO. */
static int live_locked(struct pool_cli *c)
{
    return c->fd >= 0 || !pool_cli_reconnect_locked(c) ? 0 : -EIO;
}

static int send_locked(struct pool_cli *c, const void *m)
{
    if (pool_proto_send(c->fd, m, NULL, 0, 0)) {
        pool_cli_gone_locked(c, "its socket refused a request");
        return -EIO;
    }
    return 0;
}

int pool_cli_prefix_publish(struct pool_cli *c, const struct pool_layout *lay, uint64_t ns,
                            const uint8_t *keys, uint32_t n, const vmm_handle *hs,
                            uint64_t serial)
{
    uint32_t nr = lay->n_regions;
    if (!n)
        return 0;
    if (!nr || nr > POOL_REGIONS_MAX)
        return -EINVAL;
    pthread_mutex_lock(&c->mu);
    int rc = live_locked(c) ? -ENOTCONN : 0;   /* gone before a byte was sent */
    pool_cli_req_begin(c);          /* from the first send: the reply may come before the read */
    for (size_t i = 0; !rc && i < (size_t)n * nr; i++) {
        uint64_t id = pool_cli_map_get(c, hs[i].h);
        if (!id || id == POOL_CLI_FOREIGN)
            rc = -ENOENT;               /* a frame of a daemon that went, or a local one */
    }
    struct pool_prefix_publish m = { .lay = *lay, .ns = ns, .total = nr, .serial = serial };
    pool_proto_hdr(&m.h, POOL_MSG_PREFIX_PUBLISH);
    m.lay.pad = 0;
    for (uint32_t k = 0; !rc && k < n; k++) {
        memcpy(m.key, keys + (size_t)k * POOL_KEY_BYTES, POOL_KEY_BYTES);
        for (uint32_t off = 0; !rc && off < nr; off += POOL_BATCH_MAX) {
            m.off = off;
            m.n = nr - off < POOL_BATCH_MAX ? nr - off : POOL_BATCH_MAX;
            m.last = k + 1 == n && off + m.n == nr;
            for (uint32_t i = 0; i < m.n; i++)
                m.ids[i] = pool_cli_map_get(c, hs[(size_t)k * nr + off + i].h) &
                           ~POOL_CLI_MAPPED;
            rc = send_locked(c, &m);
        }
    }
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    int fds[1], nfds = 0;
    if (!rc)
        rc = pool_cli_recv_locked(c, POOL_MSG_RESULT, buf, fds, N_FDS(fds), &nfds);
    if (!rc) {
        const struct pool_result *r = (const void *)buf;
        rc = r->err >= 0 ? r->err : -EPROTO;
    }
    pool_cli_req_end(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* One LOOKUP or ATTACH of keys[0..n) (n <= POOL_PREFIX_KEYS): its reply in *r. 0; -EIO. */
static int keys_ask_locked(struct pool_cli *c, unsigned type, const struct pool_layout *lay,
                           uint64_t ns, const uint8_t *keys, uint32_t n,
                           struct pool_prefix_found *r)
{
    struct pool_prefix_keys m = { .lay = *lay, .ns = ns, .n = n };
    pool_proto_hdr(&m.h, type);
    m.lay.pad = 0;
    memcpy(m.keys, keys, (size_t)n * POOL_KEY_BYTES);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    int fds[1], nfds = 0;
    pool_cli_req_begin(c);          /* from the send: its reply may come before the read */
    int rc = send_locked(c, &m);
    if (!rc)
        rc = pool_cli_recv_locked(c, POOL_MSG_PREFIX_FOUND, buf, fds, N_FDS(fds), &nfds);
    pool_cli_req_end(c);
    if (!rc)
        memcpy(r, buf, sizeof *r);
    if (!rc && (r->found > n || (type == POOL_MSG_PREFIX_ATTACH && !r->err &&
                                 r->total != r->found * lay->n_regions))) {
        pool_cli_gone_locked(c, "a malformed reply");
        rc = -EIO;
    }
    return rc;
}

size_t pool_cli_prefix_lookup(struct pool_cli *c, const struct pool_layout *lay, uint64_t ns,
                              const uint8_t *keys, size_t n)
{
    size_t found = 0;
    pthread_mutex_lock(&c->mu);
    int rc = live_locked(c);
    while (!rc && found < n) {
        uint32_t k = n - found < POOL_PREFIX_KEYS ? (uint32_t)(n - found) : POOL_PREFIX_KEYS;
        struct pool_prefix_found r;
        rc = keys_ask_locked(c, POOL_MSG_PREFIX_LOOKUP, lay, ns,
                             keys + found * POOL_KEY_BYTES, k, &r);
        if (!rc)
            found += r.found;
        if (!rc && r.found < k)
            break;
    }
    pthread_mutex_unlock(&c->mu);
    return found;
}

/* The frames of one ATTACH reply of total frames into hs (room for them). 0; -errno: the
   counts of the ones not taken given back, the ones taken in hs (h != 0: a local use each)
   for the caller to release. */
static int attach_frames_locked(struct pool_cli *c, vmm_handle *hs, uint32_t total)
{
    uint64_t *ids = calloc(total, sizeof *ids);
    if (!ids) {                 /* the frames come anyway: the connection ends (they go) */
        pool_cli_gone_locked(c, "out of memory for an attach");
        return -ENOMEM;
    }
    int rc = pool_cli_frames_locked(c, hs, ids, total);
    for (uint32_t i = 0; rc && i < total; i++)
        if (!hs[i].h && ids[i])
            pool_cli_give_back_locked(c, ids[i] | POOL_CLI_MAPPED);   /* gone: no-op */
    free(ids);
    return rc;
}

int pool_cli_prefix_attach(struct pool_cli *c, const struct pool_layout *lay, uint64_t ns,
                           const uint8_t *keys, size_t n, vmm_handle **out, size_t *found)
{
    uint32_t nr = lay->n_regions;
    vmm_handle *hs = NULL;
    size_t got = 0;
    *out = NULL;
    *found = 0;
    pthread_mutex_lock(&c->mu);
    int rc = live_locked(c);
    pool_cli_req_begin(c);          /* one request from the send to the last FRAMES */
    while (!rc && got < n) {
        uint32_t k = n - got < POOL_PREFIX_KEYS ? (uint32_t)(n - got) : POOL_PREFIX_KEYS;
        struct pool_prefix_found r;
        rc = keys_ask_locked(c, POOL_MSG_PREFIX_ATTACH, lay, ns, keys + got * POOL_KEY_BYTES,
                             k, &r);
        if (!rc && r.err)
            rc = r.err < 0 && r.err > -4096 ? r.err : -EPROTO;
        if (rc || !r.found)
            break;
        vmm_handle *more = realloc(hs, (got + r.found) * nr * sizeof *hs);
        if (!more) {            /* the frames come anyway: the connection ends (they go) */
            pool_cli_gone_locked(c, "out of memory for an attach");
            rc = -ENOMEM;
            break;
        }
        hs = more;
        memset(hs + got * nr, 0, (size_t)r.found * nr * sizeof *hs);
        rc = attach_frames_locked(c, hs + got * nr, r.total);
        if (rc) {
            got += r.found;             /* the imported ones: released below */
            break;
        }
        got += r.found;
        if (r.found < k)
            break;
    }
    pool_cli_req_end(c);
    pthread_mutex_unlock(&c->mu);
    if (rc) {
        for (size_t i = 0; i < got * nr; i++)
            if (hs[i].h)
                (void)pool_cli_release(c, hs[i]);   /* its mapping given up */
        free(hs);
        return rc;
    }
    *out = hs;
    *found = got;
    return 0;
}

int pool_cli_prefix_drop(struct pool_cli *c, const struct pool_layout *lay, uint64_t ns,
                         const uint8_t *keys, size_t n)
{
    pthread_mutex_lock(&c->mu);
    int rc = live_locked(c), dropped = 0;
    struct pool_prefix_drop m = { .lay = *lay, .ns = ns,
                                  .scope = keys ? POOL_DROP_KEYS : POOL_DROP_NS };
    pool_proto_hdr(&m.h, POOL_MSG_PREFIX_DROP);
    m.lay.pad = 0;
    for (size_t done = 0; !rc && (done < n || (!keys && !done));) {
        m.n = keys ? (uint32_t)(n - done < POOL_PREFIX_KEYS ? n - done : POOL_PREFIX_KEYS) : 0;
        if (keys)
            memcpy(m.keys, keys + done * POOL_KEY_BYTES, (size_t)m.n * POOL_KEY_BYTES);
        _Alignas(8) unsigned char buf[POOL_MSG_MAX];
        int fds[1], nfds = 0;
        pool_cli_req_begin(c);      /* from the send: its reply may come before the read */
        rc = send_locked(c, &m);
        if (!rc)
            rc = pool_cli_recv_locked(c, POOL_MSG_RESULT, buf, fds, N_FDS(fds), &nfds);
        pool_cli_req_end(c);
        if (!rc) {
            const struct pool_result *r = (const void *)buf;
            if (r->err < 0)
                rc = -EPROTO;
            else
                dropped += r->err;
        }
        done = keys ? done + m.n : 1;
    }
    pthread_mutex_unlock(&c->mu);
    return rc ? rc : dropped;
}
