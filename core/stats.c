/*
 * core/stats.c: kvvm_stats and kvvm_stats_json.
 *
 * Every stat is one line of the KVVM_STATS list below (name, expression over the layers'
 * counters); the copy into struct kvvm_stats and the JSON members are expanded from it, so
 * the two cannot drift. The struct itself stays written out in include/kvvm.h (the public
 * ABI).
 */
#include "core.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>
#include "common/log.h"
#include "core/call.h"
#include "pool/client.h"

/* ---- stats -------------------------------------------------------------------------- */

/* The stats, as one list (mimalloc style): name, expression over c (paging counters), t[]
   (the tiers below the device, in level order: pages_host_* are the first's, pages_disk_*
   the second's) and sum (every tier's figures summed: the page tiers' failed transfers,
   the entries tier's store_* and its queue's). */
#define KVVM_STATS(X)                                                              \
    X(page_size, kv->cfg.page_size) X(pages_device_total, c.pages_total)           \
    X(pages_device_free, c.pages_free) X(pages_host_total, t[0].total)           \
    X(pages_host_free, t[0].free)                                                  \
    X(pages_disk_total, t[1].total) X(pages_disk_free, t[1].free)                  \
    X(pages_inflight, c.pages_inflight)                                            \
    X(maps, c.maps) X(unmaps, c.unmaps) X(cow_copies, c.cow_copies)                \
    X(swap_outs, c.swap_outs) X(swap_ins, c.swap_ins + kv->attach_swap_ins)       \
    X(spills, c.spills) X(unspills, c.unspills) X(bytes_to_host, c.bytes_to_host)  \
    X(bytes_to_device, c.bytes_to_device + kv->attach_bytes_in)                    \
    X(bytes_to_disk, c.bytes_to_disk) X(bytes_from_disk, c.bytes_from_disk)        \
    X(checksum_failures, sum.checksum_failures) X(io_errors, sum.io_errors)        \
    X(reclaim_runs, w.reclaim_runs) X(reclaim_swap_outs, w.reclaim_swap_outs)      \
    X(direct_reclaims, w.direct_reclaims) X(direct_swap_outs, w.direct_swap_outs)  \
    X(direct_reclaim_ns, w.direct_ns) X(pages_orphan, c.orphans)                   \
    X(seqs_nonresident, c.nonresident) X(pages_damaged, c.pages_damaged)          \
    X(frames_created_sync, c.frames_created_sync)                                  \
    X(frames_released, c.frames_released)                                          \
    X(device_bytes_held, c.frames_held * kv->cfg.page_size)                        \
    X(cache_drops, c.cache_drops) X(cache_demotes, c.cache_demotes)                \
    X(pages_discarded, c.pages_discarded)                                          \
    X(device_mem_free, mfree) X(device_mem_total, mtotal)                          \
    X(device_budget, (uint64_t)paging_budget(kv->pg) * kv->cfg.page_size)          \
    X(create_oom, vmm_create_ooms(kv->v))                                          \
    X(prefix_entries, x.entries) X(prefix_lookups, x.lookups)                      \
    X(prefix_hit_blocks, x.hit_blocks + sum.hit_blocks) X(prefix_evictions, x.evictions) \
    X(store_puts, sum.puts) X(store_gets, sum.gets) X(store_hits, sum.hits)        \
    X(store_errors, sum.errors) X(store_bytes_out, sum.bytes_out)                  \
    X(store_bytes_in, sum.bytes_in) X(prefix_spills, x.spills)                       \
    X(store_unused, kv->store_unused)                                              \
    X(pool_leases, pc.leases) X(pool_returns, pc.returns) X(pool_waits, pc.waits)   \
    X(pool_wait_ns, pc.wait_ns)                                                     \
    X(pool_hit_blocks, kv->pool_hit_blocks) X(exports, kv->n_exports) X(imports, kv->n_imports)       \
    X(store_dropped, sum.dropped) X(store_queue_bytes, sum.queue_bytes)              \
    X(store_staging_bytes, sum.staging_bytes)

/* Every field of the public struct is in the list (a field added to include/kvvm.h without
   its line here does not compile): the struct is size, then uint64_t stats only. */
enum {
#define X(n, e) KVVM_STAT_##n,
    KVVM_STATS(X)
#undef X
    KVVM_STATS_COUNT
};
_Static_assert(offsetof(struct kvvm_stats, page_size) + KVVM_STATS_COUNT * sizeof(uint64_t)
               == sizeof(struct kvvm_stats), "a struct kvvm_stats field is not in KVVM_STATS");

/* Members of kvvm_stats_json's "stats" that struct kvvm_stats does not have (the paging
   layer's own counters c). */
#define KVVM_STATS_JSON_ONLY(X) \
    X(frames_created, c.frames_created) X(share_copies, c.share_copies)             \
    X(deferred_releases, c.deferred)

static void stats_locked(kvvm *kv, struct kvvm_stats *o)
{
    struct paging_counters c;
    struct swap_counters w;
    struct core_tier_stats t[CORE_N_LEVELS], sum = { 0 };
    _Static_assert(PG_N_LOWER == 2, "pages_host_* and pages_disk_* are the two tiers'");
    struct prefix_counters x;
    paging_disk_reap(kv->pg);
    prefix_counters(kv->pfx, &x);
    paging_counters(kv->pg, &c);
    swap_counters(kv->sw, &w);
    for (unsigned i = 0; i < CORE_N_LEVELS; i++) {   /* every tier, in level order */
        core_tier_stats(kv, i, &t[i]);
#define ADD(f) sum.f += t[i].f;
        ADD(checksum_failures) ADD(io_errors) ADD(puts) ADD(gets) ADD(hits) ADD(errors)
        ADD(bytes_out) ADD(bytes_in) ADD(hit_blocks) ADD(dropped) ADD(queue_bytes)
        ADD(staging_bytes)
#undef ADD
    }
    struct pool_cli_counters pc;                /* zeros without a pool */
    core_pool_counters(kv, &pc);
    size_t mfree = 0, mtotal = 0;               /* 0 when the driver cannot say */
    if (vmm_mem_info(kv->v, &mfree, &mtotal))
        mfree = mtotal = 0;
    memset(o, 0, sizeof *o);
    o->size = sizeof *o;
#define X(n, e) o->n = (uint64_t)(e);
    KVVM_STATS(X)
#undef X
}

int kvvm_stats(kvvm *kv, struct kvvm_stats *out)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(out);
    if (out->size < sizeof(size_t) + sizeof(uint64_t))
        return kerr(-EINVAL, "kvvm_stats: out->size %zu is too small; set it to "
                    "sizeof(struct kvvm_stats) (%zu)", out->size, sizeof *out);
    struct kvvm_stats st;
    int rc = enter(kv);
    if (!rc) {
        stats_locked(kv, &st);
        size_t n = out->size < sizeof st ? out->size : sizeof st;
        st.size = out->size;
        memcpy(out, &st, n);
        rc = leave(kv, 0);
    }
    return api_done(__func__, rc);
}

static int stats_json_locked(kvvm *kv, char *buf, size_t len)
{
    struct kvvm_stats st;
    struct paging_counters c;
    size_t pos = 0;
    bool direct;
    stats_locked(kv, &st);
    const char *engine = core_tiers_engine(kv, &direct);
    paging_counters(kv->pg, &c);
    json_put(buf, len, &pos, "{\"version\":\"%s\",\"backend\":\"%s\",\"io_engine\":\"%s\","
             "\"spill_direct\":%s,\"stats\":{", kvvm_version(), vmm_backend_name(kv->v),
             engine, direct ? "true" : "false");
    int first = 1;
#define X(n, e) json_put(buf, len, &pos, "%s\"%s\":%llu", first ? "" : ",", #n, \
                         (unsigned long long)st.n); first = 0;
    KVVM_STATS(X)
#undef X
#define X(n, e) json_put(buf, len, &pos, ",\"%s\":%llu", #n, (unsigned long long)(e));
    KVVM_STATS_JSON_ONLY(X)
#undef X
    json_put(buf, len, &pos, "},\"layout\":{\"granule\":%zu,\"slot_bytes\":%llu,"
             "\"base\":%llu,\"reserved_bytes\":%zu},\"config\":{", vmm_granule(kv->v),
             (unsigned long long)kv->slot_bytes, (unsigned long long)kv->base,
             vmm_reserved_bytes(kv->v));
    config_json(&kv->cfg, buf, len, &pos);
    json_put(buf, len, &pos, "}}");
    if (pos >= len) {
        buf[len - 1] = 0;
        klast_set("kvvm_stats_json: buf of %zu bytes is too small; %zu are needed", len,
                  pos + 1);
        return -ENOSPC;
    }
    return 0;
}

int kvvm_stats_json(kvvm *kv, char *buf, size_t len)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(buf);
    if (!len)
        return kerr(-EINVAL, "kvvm_stats_json: len is 0");
    CALL(kv, stats_json_locked(kv, buf, len));
}
