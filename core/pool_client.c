/*
 * core/pool_client.c: the context as a client of the pool daemon kvvmd (cfg.pool_socket): the
 * connection at open (pool/client.h), paging's frame source over it, kvvm_pool_info, the
 * pool's stats and its part of a -ENOMEM message. docs/api.md "The pool".
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "call.h"
#include "common/assert.h"
#include "pool/client.h"

/* "<program>-<pid>" (the default client name). */
static void default_name(char *b, size_t n)
{
    extern char *program_invocation_short_name;
    snprintf(b, n, "%s-%ld", program_invocation_short_name, (long)getpid());
}

int core_pool_open(kvvm *kv)
{
    struct kvvm_config *c = &kv->cfg;
    if (!c->pool_socket)
        return 0;
    if (!(kv->pool_socket = strdup(c->pool_socket)))
        return -ENOMEM;
    c->pool_socket = kv->pool_socket;
    char name[POOL_NAME_MAX];
    if (c->client_name)
        snprintf(name, sizeof name, "%s", c->client_name);
    else
        default_name(name, sizeof name);
    struct pool_cli_params p = { .path = c->pool_socket, .name = name,
                                 .reserve = c->pool_reserve, .limit = c->device_budget,
                                 .page_size = c->page_size, .wait_ms = c->pool_timeout_ms };
    struct pool_welcome w;
    int rc = pool_cli_open(&p, &kv->pool, &w);
    if (rc)
        return rc;
    enum kvvm_backend b = w.backend == POOL_BACKEND_EMULATED ? KVVM_BACKEND_EMULATED
                                                             : KVVM_BACKEND_CUDA;
    if (c->backend != KVVM_BACKEND_AUTO && c->backend != b) {
        rc = kerr(-EINVAL, "kvvm_open: backend %s, but the kvvmd on '%s' serves the %s "
                  "device: use backend auto (or %s)",
                  c->backend == KVVM_BACKEND_CUDA ? "cuda" : "emulated", c->pool_socket,
                  b == KVVM_BACKEND_CUDA ? "cuda" : "emulated",
                  b == KVVM_BACKEND_CUDA ? "cuda" : "emulated");
        goto out_close;
    }
    c->backend = b;
    c->page_size = (size_t)w.page_size;
    if (b == KVVM_BACKEND_EMULATED) {       /* the daemon's device: its shape is ours */
        c->emu_device_bytes = (size_t)w.emu_device_bytes;
        c->emu_granule = (size_t)w.granule;
    }
    /* device_budget is this client's limit: 0 the whole pool, never more than the pool */
    if (!c->device_budget || c->device_budget > w.pool_bytes) {
        if (c->device_budget)
            klog_info("kvvm_open: device_budget %zu is more than the pool (%llu bytes on "
                      "'%s'): the limit is the pool", c->device_budget,
                      (unsigned long long)w.pool_bytes, c->pool_socket);
        c->device_budget = (size_t)w.pool_bytes;
    }
    kv->pool_src = (struct pg_frame_src){ .create = pool_cli_create,
                                          .release = pool_cli_release, .arg = kv->pool };
    return 0;
out_close:
    pool_cli_close(kv->pool);
    kv->pool = NULL;
    return rc;
}

/* Frames a give frees and releases at a time: their RETURN goes before the next chunk's
   swap-outs start, so the asker maps chunk k while this client copies chunk k + 1. */
#define GIVE_CHUNK POOL_BATCH_MAX

/* The daemon asks for n frames back (a take-back for another client, or a limit below
   what this one holds), on the connection thread: under the context lock like the other
   background work, the frames leased and not taken first, then the ready ones, then what
   the reclaim frees (CACHED sequences and prefix entries; LIVE swap-outs with
   KVVM_F_AUTO_SWAP) in chunks of GIVE_CHUNK frames, each chunk's frames released to the
   daemon in one RETURN (pool_cli_hold_returns) before the next chunk's reclaim. Returns
   the frames given. */
static uint32_t core_pool_give(void *arg, uint32_t n)
{
    kvvm *kv = arg;
    pthread_mutex_lock(&kv->lock);
    if (kv->dead || vmm_dead(kv->v)) {
        pthread_mutex_unlock(&kv->lock);
        return 0;
    }
    paging_feed_quiesce(kv->pg);        /* no frame in the frame pool thread's hands */
    pool_cli_hold_returns(kv->pool, true);
    uint32_t given = pool_cli_trim(kv->pool), moved = 0;
    if (given < n)
        given += paging_give(kv->pg, n - given);
    while (given < n && kv->sw) {
        pool_cli_returns_flush(kv->pool);
        /* free frames are ready frames (given above) or never created: make a chunk of
           the frames in use free, then give those */
        uint32_t chunk = n - given < GIVE_CHUNK ? n - given : GIVE_CHUNK, m = 0;
        uint32_t want = paging_frames_free(kv->pg) + chunk;
        int rc = swap_reclaim_give(kv->sw, want, kv->cfg.flags & KVVM_F_AUTO_SWAP, &m);
        moved += m;
        if (rc)
            klog_warn("pool: the take-back's reclaim failed (%s); giving what is free",
                      strerror(-rc));
        uint32_t g = paging_give(kv->pg, chunk);
        given += g;
        if (rc || !g)
            break;
    }
    pool_cli_hold_returns(kv->pool, false);     /* the last RETURN before the answer */
    pthread_mutex_unlock(&kv->lock);
    klog_info("pool: the daemon asked for %u frame%s back: %u given (%u sequence%s moved)", n,
              n == 1 ? "" : "s", given, moved, moved == 1 ? "" : "s");
    return given;
}

int core_pool_listen(kvvm *kv)
{
    return kv->pool ? pool_cli_listen(kv->pool, core_pool_give, kv) : 0;
}

void core_pool_settle(kvvm *kv)
{
    if (kv->pool)
        pool_cli_ready_wait(kv->pool);
}

void core_pool_unlisten(kvvm *kv)
{
    pool_cli_unlisten(kv->pool);
}

const struct pg_frame_src *core_pool_source(kvvm *kv)
{
    if (!kv->pool)
        return NULL;
    pool_cli_attach(kv->pool, kv->v);
    return &kv->pool_src;
}

int core_pool_budget_check(kvvm *kv, size_t b)
{
    struct pool_figures f;
    int connected;
    if (!kv->pool)
        return 0;
    pool_cli_last(kv->pool, &f, &connected, NULL);
    if (b > f.pool_bytes)
        return kerr(-EINVAL, "kvvm_set_budget: %zu bytes is more than the pool on '%s' "
                    "(%llu bytes): the budget is unchanged", b, kv->cfg.pool_socket,
                    (unsigned long long)f.pool_bytes);
    return 0;
}

void core_pool_set_limit(kvvm *kv, size_t b)
{
    if (kv->pool)
        (void)pool_cli_set_limit(kv->pool, b);
}

uint32_t core_pool_over_limit(kvvm *kv)
{
    struct pool_figures f;
    int connected;
    if (!kv->pool)
        return 0;
    pool_cli_last(kv->pool, &f, &connected, NULL);
    uint64_t lim = f.limit_bytes / kv->cfg.page_size, budget = paging_budget(kv->pg);
    return connected && f.limit_bytes && lim < budget ? (uint32_t)(budget - lim) : 0;
}

uint32_t core_pool_trim(kvvm *kv)
{
    return kv->pool ? pool_cli_trim(kv->pool) : 0;
}

void core_pool_close(kvvm *kv)
{
    pool_cli_close(kv->pool);
    kv->pool = NULL;
    free(kv->pool_socket);
    kv->pool_socket = NULL;
}

void core_pool_returns_hold(kvvm *kv, bool on)
{
    if (kv->pool)
        pool_cli_hold_returns(kv->pool, on);
}

void core_pool_counters(kvvm *kv, struct pool_cli_counters *out)
{
    if (kv->pool)
        pool_cli_counters(kv->pool, out);
    else
        memset(out, 0, sizeof *out);
}

void core_pool_wait_hist(kvvm *kv, struct khist *out)
{
    pool_cli_wait_hist(kv->pool, out);
}

void core_pool_explain(kvvm *kv, char *b, size_t n, size_t *pos)
{
    if (!kv->pool)
        return;
    struct pool_figures f;
    int connected, err;
    pool_cli_last(kv->pool, &f, &connected, &err);
    if (!connected)
        json_put(b, n, pos, "; the pool daemon on %s is gone: no new frames",
                 kv->cfg.pool_socket);
    else
        json_put(b, n, pos, "; pool on %s: %llu of %llu bytes free, this client holds %llu "
                 "(limit %llu, reserve %llu)", kv->cfg.pool_socket,
                 (unsigned long long)f.free_bytes, (unsigned long long)f.pool_bytes,
                 (unsigned long long)f.held_bytes, (unsigned long long)f.limit_bytes,
                 (unsigned long long)f.reserve_bytes);
    if (connected && err == -ETIMEDOUT)
        json_put(b, n, pos, "; other clients did not give frames back within pool_timeout_ms "
                 "(%u ms)", kv->cfg.pool_timeout_ms);
    else if (connected && f.held_bytes < f.limit_bytes && kv->cfg.pool_timeout_ms)
        json_put(b, n, pos, "; no other client could give frames back (each holds its "
                 "reserve, or only what it may not give)");
}

int kvvm_pool_info(kvvm *kv, struct kvvm_pool_info *info)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(info);
    if (info->size < sizeof(size_t) + sizeof(uint64_t))
        return kerr(-EINVAL, "kvvm_pool_info: info->size %zu is too small; set it to "
                    "sizeof(struct kvvm_pool_info) (%zu)", info->size, sizeof *info);
    if (forked(kv))
        return api_done(__func__, -EIO);
    if (!kv->pool)
        return api_done(__func__, kerr(-EOPNOTSUPP, "kvvm_pool_info: this context has no "
                                       "pool (opened without pool_socket)"));
    /* no context lock: the connection has its own, and a request may take a while */
    struct pool_figures f;
    struct kvvm_pool_info o = { .size = info->size };
    int connected;
    (void)pool_cli_info(kv->pool, &f, &connected);
    o.pool_bytes = f.pool_bytes;
    o.free_bytes = f.free_bytes;
    o.held_bytes = f.held_bytes;
    o.reserve_bytes = f.reserve_bytes;
    o.limit_bytes = f.limit_bytes;
    o.n_clients = f.n_clients;
    o.connected = connected;
    o.shared_entries = f.shared_entries;
    o.shared_bytes = f.shared_bytes;
    KVVM_ASSERT(o.held_bytes <= o.pool_bytes || !connected);
    memcpy(info, &o, info->size < sizeof o ? info->size : sizeof o);
    return api_done(__func__, 0);
}
