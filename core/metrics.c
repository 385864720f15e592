/*
 * core/metrics.c: kvvm_metrics, the Prometheus text exposition (format 0.0.4) of the stats.
 *
 * Every field of struct kvvm_stats is one line of the KVVM_METRICS table below: the field,
 * the series it becomes (metric name and labels), its type and its help text. The
 * exposition and docs/api.md's metrics table (core_metrics_doc; CTest metrics_doc compares
 * them) are expanded from it, so neither can drift from the struct: a field added to
 * include/kvvm.h without its line here does not compile (the _Static_assert below: one
 * line per field, each naming a field, no field twice).
 *
 * Naming (prometheus.io "Metric and label naming"): every name starts with kvvm_; a counter
 * (a figure that only grows) ends in _total, a counter of bytes in _bytes_total, of time in
 * _seconds_total (the stats' nanoseconds written as seconds, exactly); a gauge never ends
 * in _total; figures of several tiers or modes are one family with a label (tier="device",
 * "host", "disk", "store", "pool"). The rows of one family share its type and help (the H_*
 * texts) and need not be adjacent: the exposition groups them.
 *
 * The latency histograms (KVVM_HISTS) come from common/hist.h's fixed buckets, recorded
 * with relaxed atomics where the layers already read the clock: direct reclaim
 * (swap/swap.c), kvvm_prefix_attach (core/prefix_calls.c), the store's requests (store/store.c),
 * the calls' waits for the pool daemon (pool/client.c).
 */
#include "core.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>
#include "common/assert.h"
#include "common/log.h"
#include "core/call.h"

/* ---- the table ---------------------------------------------------------------------- */

enum mtype { M_COUNTER, M_GAUGE, M_SECONDS /* a counter of ns, written in seconds */ };

/* Help texts of the families with several rows (one text per family). */
#define H_PAGES "Pages by tier and state: total (the tier's capacity), free, inflight " \
    "(device pages with a device-host copy in flight), orphan (device pages held only by " \
    "swapped-out sequences), damaged (pages whose disk copy was lost)."
#define H_TIER_BYTES "Bytes copied to a tier (direction=\"to\": device and host by swaps " \
    "and attaches, disk by spills, store by write-through, headers included) or read from " \
    "it (direction=\"from\")."
#define H_RECLAIMS "Reclaim rounds that moved something: by the background reclaim thread " \
    "(mode=\"background\") or on a caller's thread (mode=\"direct\": below min, or short " \
    "of pages)."
#define H_RECLAIM_OUTS "Sequences (or batches of orphan pages) reclaim moved off the " \
    "device, by mode as kvvm_reclaims_total."
#define H_DEVICE_MEM "Device memory: held (physical memory this context holds from the " \
    "driver), free and total (as the driver reports them; 0 when it cannot say), budget " \
    "(the device budget in force)."

#define TIER(t, k, v) "tier=\"" t "\"," k "=\"" v "\""
#define LBL(k, v) k "=\"" v "\""

/* X(field of struct kvvm_stats, metric name, type, labels, help). */
#define KVVM_METRICS(X)                                                                  \
    X(page_size, "kvvm_page_size_bytes", M_GAUGE, "", "Bytes per KV page.")              \
    X(pages_device_total, "kvvm_pages", M_GAUGE, TIER("device", "state", "total"), H_PAGES) \
    X(pages_device_free, "kvvm_pages", M_GAUGE, TIER("device", "state", "free"), H_PAGES) \
    X(pages_host_total, "kvvm_pages", M_GAUGE, TIER("host", "state", "total"), H_PAGES)  \
    X(pages_host_free, "kvvm_pages", M_GAUGE, TIER("host", "state", "free"), H_PAGES)    \
    X(pages_disk_total, "kvvm_pages", M_GAUGE, TIER("disk", "state", "total"), H_PAGES)  \
    X(pages_disk_free, "kvvm_pages", M_GAUGE, TIER("disk", "state", "free"), H_PAGES)    \
    X(pages_inflight, "kvvm_pages", M_GAUGE, TIER("device", "state", "inflight"), H_PAGES) \
    X(maps, "kvvm_maps_total", M_COUNTER, "", "Pages mapped into the sequences' windows.") \
    X(unmaps, "kvvm_unmaps_total", M_COUNTER, "", "Pages unmapped from the windows.")    \
    X(cow_copies, "kvvm_cow_copies_total", M_COUNTER, "", "Pages copied on write.")      \
    X(swap_outs, "kvvm_swap_outs_total", M_COUNTER, "",                                  \
      "Sequences moved off the device.")                                                 \
    X(swap_ins, "kvvm_swap_ins_total", M_COUNTER, "",                                    \
      "Sequences moved onto the device (a kvvm_prefix_attach that maps blocks counts one).") \
    X(spills, "kvvm_spills_total", M_COUNTER, "", "Pages written to the disk tier.")     \
    X(unspills, "kvvm_unspills_total", M_COUNTER, "", "Pages read back from the disk tier.") \
    X(bytes_to_host, "kvvm_tier_bytes_total", M_COUNTER, TIER("host", "direction", "to"), \
      H_TIER_BYTES)                                                                      \
    X(bytes_to_device, "kvvm_tier_bytes_total", M_COUNTER,                               \
      TIER("device", "direction", "to"), H_TIER_BYTES)                                   \
    X(bytes_to_disk, "kvvm_tier_bytes_total", M_COUNTER, TIER("disk", "direction", "to"), \
      H_TIER_BYTES)                                                                      \
    X(bytes_from_disk, "kvvm_tier_bytes_total", M_COUNTER,                               \
      TIER("disk", "direction", "from"), H_TIER_BYTES)                                   \
    X(checksum_failures, "kvvm_disk_checksum_failures_total", M_COUNTER, "",             \
      "Disk tier reads whose checksum did not match.")                                   \
    X(io_errors, "kvvm_disk_io_errors_total", M_COUNTER, "", "Disk tier I/Os that failed.") \
    X(reclaim_runs, "kvvm_reclaims_total", M_COUNTER, LBL("mode", "background"), H_RECLAIMS) \
    X(reclaim_swap_outs, "kvvm_reclaim_swap_outs_total", M_COUNTER,                      \
      LBL("mode", "background"), H_RECLAIM_OUTS)                                         \
    X(direct_reclaims, "kvvm_reclaims_total", M_COUNTER, LBL("mode", "direct"), H_RECLAIMS) \
    X(direct_swap_outs, "kvvm_reclaim_swap_outs_total", M_COUNTER, LBL("mode", "direct"), \
      H_RECLAIM_OUTS)                                                                    \
    X(direct_reclaim_ns, "kvvm_direct_reclaim_seconds_total", M_SECONDS, "",             \
      "Time callers spent blocked in direct reclaim.")                                   \
    X(pages_orphan, "kvvm_pages", M_GAUGE, TIER("device", "state", "orphan"), H_PAGES)   \
    X(seqs_nonresident, "kvvm_sequences_nonresident", M_GAUGE, "",                       \
      "Live sequences swapped out (off the device).")                                    \
    X(pages_damaged, "kvvm_pages", M_GAUGE, TIER("disk", "state", "damaged"), H_PAGES)   \
    X(frames_created_sync, "kvvm_frames_created_sync_total", M_COUNTER, "",              \
      "Device frames created on a caller's thread (not ahead by the frame pool thread).") \
    X(frames_released, "kvvm_frames_released_total", M_COUNTER, "",                      \
      "Device frames released to the driver before close.")                              \
    X(device_bytes_held, "kvvm_device_memory_bytes", M_GAUGE, LBL("state", "held"),      \
      H_DEVICE_MEM)                                                                      \
    X(cache_drops, "kvvm_cache_drops_total", M_COUNTER, "",                              \
      "CACHED sequences dropped (pages released, nothing copied).")                      \
    X(cache_demotes, "kvvm_cache_demotes_total", M_COUNTER, "",                          \
      "CACHED sequences demoted to the host or disk tier.")                              \
    X(pages_discarded, "kvvm_pages_discarded_total", M_COUNTER, "",                      \
      "Block-table entries released by kvvm_seq_discard.")                               \
    X(device_mem_free, "kvvm_device_memory_bytes", M_GAUGE, LBL("state", "free"),        \
      H_DEVICE_MEM)                                                                      \
    X(device_mem_total, "kvvm_device_memory_bytes", M_GAUGE, LBL("state", "total"),      \
      H_DEVICE_MEM)                                                                      \
    X(device_budget, "kvvm_device_memory_bytes", M_GAUGE, LBL("state", "budget"),        \
      H_DEVICE_MEM)                                                                      \
    X(create_oom, "kvvm_device_create_oom_total", M_COUNTER, "",                         \
      "Device frame creations that failed for lack of device memory below the budget.")  \
    X(prefix_entries, "kvvm_prefix_entries", M_GAUGE, "",                                \
      "Entries in the prefix cache's index.")                                            \
    X(prefix_lookups, "kvvm_prefix_lookups_total", M_COUNTER, "",                        \
      "kvvm_prefix_lookup and kvvm_prefix_attach calls.")                                \
    X(prefix_hit_blocks, "kvvm_prefix_hit_blocks_total", M_COUNTER, "",                  \
      "Blocks prefix lookups and attaches found (locally or in the store).")             \
    X(prefix_evictions, "kvvm_prefix_evictions_total", M_COUNTER, "",                    \
      "Prefix entries reclaimed under pressure (dropped or demoted).")                   \
    X(store_puts, "kvvm_store_puts_total", M_COUNTER, "",                                \
      "Entries written to the shared store.")                                            \
    X(store_gets, "kvvm_store_gets_total", M_COUNTER, "",                                \
      "Entries read from the shared store whole, checksum good.")                        \
    X(store_hits, "kvvm_store_hits_total", M_COUNTER, "",                                \
      "Entries lookups found in the shared store.")                                      \
    X(store_errors, "kvvm_store_errors_total", M_COUNTER, "",                            \
      "Store requests that failed, timed out or returned a bad value (one per entry), "  \
      "and write-throughs given up.")                                                    \
    X(store_bytes_out, "kvvm_tier_bytes_total", M_COUNTER, TIER("store", "direction", "to"), \
      H_TIER_BYTES)                                                                      \
    X(store_bytes_in, "kvvm_tier_bytes_total", M_COUNTER,                                \
      TIER("store", "direction", "from"), H_TIER_BYTES)                                  \
    X(prefix_spills, "kvvm_prefix_spills_total", M_COUNTER, "",                          \
      "Pages only prefix entries hold written to the disk tier.")                        \
    X(store_unused, "kvvm_store_unused_total", M_COUNTER, "",                            \
      "Entries kvvm_prefix_attach read from the store and did not attach.")              \
    X(pool_leases, "kvvm_pool_leases_total", M_COUNTER, "",                              \
      "Frames received from the pool daemon.")                                           \
    X(pool_returns, "kvvm_pool_returns_total", M_COUNTER, "",                            \
      "Frames given back to the pool daemon.")                                           \
    X(pool_waits, "kvvm_pool_waits_total", M_COUNTER, "",                                \
      "Calls that waited for the pool daemon to find frames.")                           \
    X(pool_wait_ns, "kvvm_pool_wait_seconds_total", M_SECONDS, "",                       \
      "Time calls waited for the pool daemon.")                                          \
    X(pool_hit_blocks, "kvvm_pool_hit_blocks_total", M_COUNTER, "",                      \
      "Blocks attached from the pool daemon's shared prefix index, without a copy.")     \
    X(exports, "kvvm_exports_total", M_COUNTER, "",                                      \
      "Sequences handed off with kvvm_seq_export.")                                      \
    X(imports, "kvvm_imports_total", M_COUNTER, "",                                      \
      "Sequences taken over with kvvm_seq_import.")                                      \
    X(store_dropped, "kvvm_store_dropped_total", M_COUNTER, "",                          \
      "Queued store writes dropped because store_queue_bytes was reached.")              \
    X(store_queue_bytes, "kvvm_store_queue_bytes", M_GAUGE, "",                          \
      "Bytes of entries queued for the store now.")                                      \
    X(store_staging_bytes, "kvvm_store_staging_bytes", M_GAUGE, "",                      \
      "Pinned host bytes kept for attaches' reads from the store now.")

/* One line per field of struct kvvm_stats, no field twice (a second KVVM_METRIC_ of a name
   is a redeclaration), each a field (offsetof in the table below): together, every field
   has exactly one line. The struct is size, then uint64_t stats only (core/stats.c). */
enum {
#define X(f, name, type, labels, help) KVVM_METRIC_##f,
    KVVM_METRICS(X)
#undef X
    KVVM_METRICS_COUNT
};
_Static_assert(offsetof(struct kvvm_stats, page_size) + KVVM_METRICS_COUNT * sizeof(uint64_t)
               == sizeof(struct kvvm_stats),
               "a struct kvvm_stats field has no line in KVVM_METRICS (core/metrics.c)");

struct metric {
    const char *field, *name, *labels, *help;
    size_t off;                   /* of the field in struct kvvm_stats */
    enum mtype type;
};

static const struct metric metrics[] = {
#define X(f, n, t, l, h) { #f, n, l, h, offsetof(struct kvvm_stats, f), t },
    KVVM_METRICS(X)
#undef X
};

/* The histograms: X(source, metric name, labels, help); the sources are read by
   hists_read. */
enum hsrc { HS_DIRECT, HS_ATTACH, HS_STORE_PUT, HS_STORE_GET, HS_STORE_LOOKUP,
            HS_STORE_DELETE, HS_POOL_WAIT, HS_N };
#define H_STORE_REQ "Shared store requests by duration, the wait for the store's lock " \
    "included (one batch of entries each)."
#define KVVM_HISTS(X)                                                                    \
    X(HS_DIRECT, "kvvm_direct_reclaim_duration_seconds", "",                             \
      "Direct reclaims that moved something, by duration (the caller waits for them).")  \
    X(HS_ATTACH, "kvvm_prefix_attach_duration_seconds", "",                              \
      "kvvm_prefix_attach calls by duration (reading the store's blocks included).")     \
    X(HS_STORE_PUT, "kvvm_store_request_duration_seconds", LBL("op", "put"), H_STORE_REQ) \
    X(HS_STORE_GET, "kvvm_store_request_duration_seconds", LBL("op", "get"), H_STORE_REQ) \
    X(HS_STORE_LOOKUP, "kvvm_store_request_duration_seconds", LBL("op", "lookup"),       \
      H_STORE_REQ)                                                                       \
    X(HS_STORE_DELETE, "kvvm_store_request_duration_seconds", LBL("op", "delete"),       \
      H_STORE_REQ)                                                                       \
    X(HS_POOL_WAIT, "kvvm_pool_wait_duration_seconds", "",                               \
      "Calls that waited for the pool daemon (kvvm_pool_waits_total), by duration.")

struct hist_row {
    enum hsrc src;
    const char *name, *labels, *help;
};

static const struct hist_row hists[] = {
#define X(s, n, l, h) { s, n, l, h },
    KVVM_HISTS(X)
#undef X
};

static const char *const le[KHIST_FINITE] = {
#define X(ns, s) s,
    KHIST_BOUNDS(X)
#undef X
};

static const char *type_name(enum mtype t)
{
    return t == M_GAUGE ? "gauge" : "counter";
}

/* ---- the exposition ----------------------------------------------------------------- */

struct snap {
    struct kvvm_stats st;
    struct khist h[HS_N];
};

static void hists_read(kvvm *kv, struct snap *s)
{
    swap_direct_hist(kv->sw, &s->h[HS_DIRECT]);
    khist_read(&kv->attach_hist, &s->h[HS_ATTACH]);
    core_tiers_hist(kv, CORE_ENTRY_PUT, &s->h[HS_STORE_PUT]);   /* the store tier's */
    core_tiers_hist(kv, CORE_ENTRY_GET, &s->h[HS_STORE_GET]);
    core_tiers_hist(kv, CORE_ENTRY_LOOKUP, &s->h[HS_STORE_LOOKUP]);
    core_tiers_hist(kv, CORE_ENTRY_DELETE, &s->h[HS_STORE_DELETE]);
    core_pool_wait_hist(kv, &s->h[HS_POOL_WAIT]);
}

/* Whether row i's family (name) appeared in an earlier row: it was written with that. */
#define SEEN_BEFORE(tab, i) seen_before((tab)[i].name, &(tab)[0].name, sizeof *(tab), (i))
static int seen_before(const char *name, const char *const *first, size_t stride, size_t i)
{
    for (size_t j = 0; j < i; j++)
        if (!strcmp(*(const char *const *)((const char *)first + j * stride), name))
            return 1;
    return 0;
}

static void put_head(char *buf, size_t len, size_t *pos, const char *name, const char *help,
                     const char *type)
{
    KVVM_ASSERT(!strpbrk(help, "\\\n"));   /* nothing the format would escape */
    json_put(buf, len, pos, "# HELP %s %s", name, help);
    json_put(buf, len, pos, "\n# TYPE %s %s\n", name, type);
}

static void put_sample(char *buf, size_t len, size_t *pos, const struct metric *m,
                       const struct kvvm_stats *st)
{
    uint64_t v;
    memcpy(&v, (const char *)st + m->off, sizeof v);
    json_put(buf, len, pos, "%s%s%s%s ", m->name, *m->labels ? "{" : "", m->labels,
             *m->labels ? "}" : "");
    if (m->type == M_SECONDS)
        json_put(buf, len, pos, "%llu.%09llu\n", (unsigned long long)(v / 1000000000u),
                 (unsigned long long)(v % 1000000000u));
    else
        json_put(buf, len, pos, "%llu\n", (unsigned long long)v);
}

static void put_hist(char *buf, size_t len, size_t *pos, const struct hist_row *r,
                     const struct khist *h)
{
    const char *sep = *r->labels ? "," : "";
    uint64_t cum = 0;
    for (unsigned b = 0; b < KHIST_N; b++) {
        cum += h->n[b];
        json_put(buf, len, pos, "%s_bucket{%s%sle=\"%s\"} %llu\n", r->name, r->labels, sep,
                 b < KHIST_FINITE ? le[b] : "+Inf", (unsigned long long)cum);
    }
    const char *o = *r->labels ? "{" : "", *c = *r->labels ? "}" : "";
    json_put(buf, len, pos, "%s_sum%s%s%s %llu.%09llu\n", r->name, o, r->labels, c,
             (unsigned long long)(h->sum_ns / 1000000000u),
             (unsigned long long)(h->sum_ns % 1000000000u));
    json_put(buf, len, pos, "%s_count%s%s%s %llu\n", r->name, o, r->labels, c,
             (unsigned long long)cum);
}

/* The whole exposition of s into buf (json_put: what fits of len; returns the length). */
static size_t render(const struct snap *s, char *buf, size_t len)
{
    size_t pos = 0, nm = sizeof metrics / sizeof *metrics, nh = sizeof hists / sizeof *hists;
    for (size_t i = 0; i < nm; i++) {
        if (SEEN_BEFORE(metrics, i))
            continue;
        put_head(buf, len, &pos, metrics[i].name, metrics[i].help,
                 type_name(metrics[i].type));
        for (size_t k = i; k < nm; k++) {
            if (strcmp(metrics[k].name, metrics[i].name) != 0)
                continue;
            KVVM_ASSERT(metrics[k].type == metrics[i].type &&
                        !strcmp(metrics[k].help, metrics[i].help));   /* one family */
            put_sample(buf, len, &pos, &metrics[k], &s->st);
        }
    }
    for (size_t i = 0; i < nh; i++) {
        if (SEEN_BEFORE(hists, i))
            continue;
        put_head(buf, len, &pos, hists[i].name, hists[i].help, "histogram");
        for (size_t k = i; k < nh; k++)
            if (!strcmp(hists[k].name, hists[i].name))
                put_hist(buf, len, &pos, &hists[k], &s->h[hists[k].src]);
    }
    return pos;
}

int kvvm_metrics(kvvm *kv, char *buf, size_t len)
{
    klast_clear();
    NONNULL(kv);
    if (!buf && len)
        return kerr(-EINVAL, "kvvm_metrics: buf is NULL and len is %zu (len 0 asks for the "
                    "length)", len);
    struct snap s;
    s.st.size = sizeof s.st;
    int rc = kvvm_stats(kv, &s.st);
    if (rc)
        return api_done(__func__, rc);
    hists_read(kv, &s);
    size_t n = render(&s, NULL, 0);
    if (n >= (size_t)INT32_MAX)
        return api_done(__func__, kerr(-EOVERFLOW, "kvvm_metrics: %zu bytes", n));
    if (len > n) {                       /* all of it and its NUL, or nothing */
        size_t w = render(&s, buf, len);
        KVVM_ASSERT(w == n && buf[n] == 0);   /* the same snapshot, the same text */
        (void)w;
    }
    return api_done(__func__, (int)n);
}

/* ---- docs/api.md's table ------------------------------------------------------------ */

static void doc_labels(char *buf, size_t len, size_t *pos, const char *name,
                       const char *labels)
{
    json_put(buf, len, pos, "| `%s%s%s%s` ", name, *labels ? "{" : "", labels,
             *labels ? "}" : "");
}

size_t core_metrics_doc(char *buf, size_t len)
{
    size_t pos = 0, nm = sizeof metrics / sizeof *metrics, nh = sizeof hists / sizeof *hists;
    json_put(buf, len, &pos, "| series | type | `kvvm_stats` field | meaning |\n"
             "|---|---|---|---|\n");
    for (size_t i = 0; i < nm; i++) {
        if (SEEN_BEFORE(metrics, i))
            continue;
        for (size_t k = i; k < nm; k++) {
            const struct metric *m = &metrics[k];
            if (strcmp(m->name, metrics[i].name) != 0)
                continue;
            doc_labels(buf, len, &pos, m->name, m->labels);
            json_put(buf, len, &pos, "| %s | `%s`%s | %s |\n", type_name(m->type), m->field,
                     m->type == M_SECONDS ? " (ns, as seconds)" : "",
                     k == i ? m->help : "");
        }
    }
    for (size_t i = 0; i < nh; i++) {
        if (SEEN_BEFORE(hists, i))
            continue;
        for (size_t k = i; k < nh; k++) {
            if (strcmp(hists[k].name, hists[i].name) != 0)
                continue;
            doc_labels(buf, len, &pos, hists[k].name, hists[k].labels);
            json_put(buf, len, &pos, "| histogram | | %s |\n", k == i ? hists[k].help : "");
        }
    }
    return pos;
}
