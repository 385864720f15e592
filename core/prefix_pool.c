/*
 * core/prefix_pool.c: the prefix cache's calls with a pool (cfg.pool_socket): the daemon's
 * shared prefix index (pool/client.h; docs/design.md "Sharing frames between clients").
 *
 * publish: after the local publish, the blocks' frames go to the daemon at once; only once
 * the daemon holds them are the pages marked shared (copy on write from then: bytes written
 * after the call are never seen through the entry), and also when the daemon went during
 * the request (its answer lost: it may have made the entries, shown to others at once).
 * Sync mode: paging waited for the device work before the call, the entries are visible
 * at once. Stream mode: nothing waits on the engine's thread: the entries go PENDING (a
 * miss for everyone) with a fence recorded on the engine stream after the work, and the
 * connection's ready thread makes them visible once the fence completed (pool/client.h
 * "Pending shares"; kvvm_sync waits for that). lookup: the daemon's leading keys from key
 * 0; past the local hit they are KVVM_TIER_POOL. attach: when the daemon has more leading
 * blocks than the local index, dst maps the daemon's frames as shared frames (adopted as a
 * non-resident sequence, then swapped in: device pages are mapped as they are, nothing
 * copied) and they become local entries too; any failure there leaves dst empty and the
 * local attach goes on. The daemon never makes a call fail.
 */
#include <errno.h>
#include <stdlib.h>

#include "call.h"
#include "common/assert.h"
#include "common/log.h"
#include "pool/client.h"

_Static_assert(sizeof(kvvm_key) == POOL_KEY_BYTES, "a key is the daemon's");

static struct pool_layout layout_of(const kvvm *kv)
{
    return (struct pool_layout){ .n_regions = kv->cfg.n_regions,
                                 .bytes_per_token = kv->cfg.bytes_per_token,
                                 .page_size = kv->cfg.page_size };
}

void core_pool_publish(kvvm *kv, kvvm_seq s, uint64_t ns, const kvvm_key *keys, size_t n)
{
    if (!kv->pool || !n)
        return;
    if (n > UINT32_MAX / kv->cfg.n_regions) {
        klog_info("kvvm_prefix_publish: %zu blocks: too many for one shared publish", n);
        return;
    }
    struct pg_share_out o;             /* the frames, then their fence */
    int rc = paging_seq_share_frames(kv->pg, s, (uint32_t)n, &o);
    if (rc && o.fenced < 0) {
        klog_info("kvvm_prefix_publish: the blocks are not entered into the pool's shared "
                  "index: no fence for the device work before the call (%s)",
                  core_err_name(rc));
        return;
    }
    if (rc) {
        klog_info("kvvm_prefix_publish: the blocks are not entered into the pool's shared "
                  "index: %s", rc == -EAGAIN ? "the sequence is not resident on the device"
                  : rc == -EOPNOTSUPP ? "the pool view does not map shared frames yet"
                  : core_err_name(rc));
        return;
    }
    vmm_handle *hs = o.hs;
    vmm_fence f = o.f;
    int fenced = o.fenced;
    struct pool_layout lay = layout_of(kv);
    uint64_t serial = fenced ? pool_cli_ready_serial(kv->pool) : 0;
    rc = pool_cli_prefix_publish(kv->pool, &lay, ns, (const uint8_t *)keys, (uint32_t)n, hs,
                                 serial);
    free(hs);
    if (rc < 0) {
        if (fenced)
            vmm_fence_destroy(kv->v, &f);
        klog_warn("kvvm_prefix_publish: the pool's shared index did not take the blocks "
                  "(%s)", rc == -ENOENT ? "a page's frame is not this daemon's"
                  : rc == -EIO ? "the daemon went during the request: the blocks are "
                  "treated as shared" : rc == -ENOTCONN ? "the daemon is gone"
                  : core_err_name(rc));
        /* its answer lost: the daemon may show entries of these frames to others, so no
           write may land in them (the pages copy on write, their frames are released,
           never reused) */
        if (rc == -EIO)
            paging_seq_share_mark(kv->pg, s, (uint32_t)n);
        return;
    }
    paging_seq_share_mark(kv->pg, s, (uint32_t)n);
    if (fenced)
        pool_cli_ready_after(kv->pool, serial, f);  /* visible once the fence completed */
}

size_t core_pool_lookup(kvvm *kv, uint64_t ns, const kvvm_key *keys, size_t n, size_t k,
                        uint8_t *where)
{
    if (!kv->pool || k >= n)
        return k;
    struct pool_layout lay = layout_of(kv);
    size_t p = pool_cli_prefix_lookup(kv->pool, &lay, ns, (const uint8_t *)keys, n);
    for (size_t i = k; where && i < p; i++)
        where[i] = KVVM_TIER_POOL;
    return p > k ? p : k;
}

/* The handles hs[0..n) mapped from the daemon and not adopted: each mapping given up. */
static void pool_release_all(kvvm *kv, vmm_handle *hs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        (void)pool_cli_release(kv->pool, hs[i]);
}

/* Empty dst maps the p blocks of key-major hs (shared frames) and comes in. 0; -errno (dst
   empty as it was, the handles released). */
static int pool_attach_in(kvvm *kv, kvvm_seq dst, vmm_handle *hs, size_t p)
{
    uint32_t nr = kv->cfg.n_regions;
    uint64_t need = 0;
    uint64_t tpb = kv->cfg.page_size / kv->cfg.bytes_per_token;
    vmm_handle *hr = malloc(p * nr * sizeof *hr);
    if (!hr) {
        pool_release_all(kv, hs, p * nr);
        return -ENOMEM;
    }
    for (size_t b = 0; b < p; b++)              /* region-major, as an import's */
        for (uint32_t r = 0; r < nr; r++)
            hr[(size_t)r * p + b] = hs[b * nr + r];
    bool was_out;
    int rc = paging_seq_import(kv->pg, dst, hr, (uint32_t)(p * nr), p * tpb, &was_out);
    free(hr);
    if (rc) {
        pool_release_all(kv, hs, p * nr);
        return rc;
    }
    rc = paging_need(kv->pg, &(struct pg_need){ .of = PG_NEED_GROW, .h = dst }, &need);
    if (!rc)
        rc = core_make_room(kv, need, &dst, 1);
    if (!rc)
        rc = paging_swap_in(kv->pg, dst, false);
    if (rc)
        paging_seq_unadopt(kv->pg, dst, was_out);  /* the frames go back through the source */
    return rc;
}

int core_pool_attach(kvvm *kv, kvvm_seq dst, uint64_t ns, const kvvm_key *keys, size_t n,
                     size_t k)
{
    if (!kv->pool || k >= n || stream_check(kv))
        return 0;
    if (n > UINT32_MAX / kv->cfg.n_regions)
        n = UINT32_MAX / kv->cfg.n_regions;
    struct pool_layout lay = layout_of(kv);
    vmm_handle *hs = NULL;
    size_t p = 0;
    int rc = pool_cli_prefix_attach(kv->pool, &lay, ns, (const uint8_t *)keys, n, &hs, &p);
    if (rc || p <= k) {
        if (!rc)
            pool_release_all(kv, hs, p * kv->cfg.n_regions);
        free(hs);
        return 0;                           /* the local prefix is as long */
    }
    rc = pool_attach_in(kv, dst, hs, p);
    free(hs);
    if (rc) {
        klog_info("kvvm_prefix_attach: the pool's %zu shared blocks did not attach (%s): "
                  "the local prefix (%zu blocks) does", p, core_err_name(rc), k);
        return 0;
    }
    (void)prefix_publish(kv->pfx, dst, ns, keys, p);   /* -ENOMEM: not entered, no harm */
    kv->pool_hit_blocks += p;
    return (int)p;
}

void core_pool_prefix_drop(kvvm *kv, uint64_t ns, const kvvm_key *keys, size_t n)
{
    if (!kv->pool)
        return;
    struct pool_layout lay = layout_of(kv);
    int rc = pool_cli_prefix_drop(kv->pool, &lay, ns, (const uint8_t *)keys, n);
    if (rc < 0)
        klog_warn("kvvm_prefix_drop: the pool's shared index did not drop the entries (%s)",
                  rc == -EIO ? "the daemon is gone" : core_err_name(rc));
}
