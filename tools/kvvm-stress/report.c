/*
 * report.c: what a run tells its user: latency percentiles, the progress line (terminal
 * only), the final summary table, the JSON report, the CSV occupancy trace and its SVG plot.
 * Nothing here talks to the library except the stats already gathered in struct results.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "../common/json.h"
#include "stress.h"

uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void lat_init(struct lat *l, const char *name)
{
    memset(l, 0, sizeof *l);
    l->name = name;
}

/* Keeps every sample up to LAT_RESERVOIR, then a uniform reservoir (algorithm R); count,
   sum and max stay exact. */
void lat_add(struct lat *l, uint64_t ns, uint64_t *rng)
{
    l->count++;
    l->sum_ns += ns;
    if (ns > l->max_ns)
        l->max_ns = ns;
    if (!l->samples) {
        l->samples = malloc(LAT_RESERVOIR * sizeof *l->samples);
        if (!l->samples)
            return;
    }
    if (l->n < LAT_RESERVOIR) {
        l->samples[l->n++] = ns;
        return;
    }
    uint64_t k = rng_next(rng) % l->count;
    if (k < LAT_RESERVOIR)
        l->samples[k] = ns;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

void lat_pct(struct lat *l, double *p50, double *p99, double *max)
{
    *p50 = *p99 = *max = 0;
    if (!l->n)
        return;
    qsort(l->samples, l->n, sizeof *l->samples, cmp_u64);
    *p50 = l->samples[(size_t)((l->n - 1) * 0.50)] / 1e3;
    *p99 = l->samples[(size_t)((l->n - 1) * 0.99)] / 1e3;
    *max = l->max_ns / 1e3;
}

void lat_free(struct lat *l)
{
    free(l->samples);
    l->samples = NULL;
}

int trace_add(struct results *r, const struct trace_pt *p)
{
    if (r->n_trace == r->cap_trace) {
        size_t c = r->cap_trace ? r->cap_trace * 2 : 4096;
        struct trace_pt *t = realloc(r->trace, c * sizeof *t);
        if (!t)
            return -ENOMEM;
        r->trace = t;
        r->cap_trace = c;
    }
    r->trace[r->n_trace++] = *p;
    return 0;
}

void record_error(struct results *r, uint64_t step, const char *op, int err, uint64_t req)
{
    r->unexpected_errors++;
    if (r->n_err < MAX_ERR_LOG)
        r->errs[r->n_err++] = (struct err_rec){ step, op, err, req };
}

static double ceil_div_d(double a, double b) { return ceil(a / b - 1e-9); }

static double mib(uint64_t b) { return b / 1048576.0; }

/* Rates are over the interval since the previous line. */
void progress_line(const struct opts *o, const struct results *r, const struct kvvm_stats *s,
                   double t, int final)
{
    static double pt;
    static uint64_t pso, psi, psp, pus, ptok;
    uint64_t dev = s->pages_device_total - s->pages_device_free;
    uint64_t host = s->pages_host_total - s->pages_host_free;
    uint64_t disk = s->pages_disk_total - s->pages_disk_free;
    double dt = t - pt > 1e-6 ? t - pt : 1e-6;
    char lim[32] = "";
    if (o->steps)
        snprintf(lim, sizeof lim, "/%llu", (unsigned long long)o->steps);
    fprintf(stderr,
            "\r\033[K[%5.1fs] step %llu%s  %.0f tok/s  pages dev %llu/%llu host %llu/%llu "
            "disk %llu/%llu  peak x%.2f  swap out/in %.0f/%.0f/s  spill/unspill %.0f/%.0f/s%s",
            t, (unsigned long long)r->steps, lim, (r->tokens_decoded - ptok) / dt,
            (unsigned long long)dev, (unsigned long long)s->pages_device_total,
            (unsigned long long)host, (unsigned long long)s->pages_host_total,
            (unsigned long long)disk, (unsigned long long)s->pages_disk_total,
            r->peak_oversub, (s->swap_outs - pso) / dt, (s->swap_ins - psi) / dt,
            (s->spills - psp) / dt, (s->unspills - pus) / dt, final ? "\n" : "");
    fflush(stderr);
    pt = t;
    pso = s->swap_outs;
    psi = s->swap_ins;
    psp = s->spills;
    pus = s->unspills;
    ptok = r->tokens_decoded;
}

static uint64_t d(uint64_t a, uint64_t b) { return a - b; }

void report_summary(FILE *f, const struct opts *o, const struct results *r, int status)
{
    const struct kvvm_stats *s = &r->st, *z = &r->st0;
    double t = r->elapsed_s > 0 ? r->elapsed_s : 1e-9;
    fprintf(f, "\nkvvm-stress summary (libkvvm %s, backend %s%s%s)\n", kvvm_version(),
            r->backend ? r->backend : "?", r->io_engine[0] ? ", I/O " : "", r->io_engine);
    fprintf(f, "  model        %s: %u layers, %u KV heads, head dim %u, %u-byte elements; "
            "layout %s (%u regions x %llu B/token)\n", o->preset, o->layers, o->kv_heads,
            o->head_dim, o->dtype_bytes, o->token_major ? "token-major" : "per-layer K/V",
            o->n_regions, (unsigned long long)o->bytes_per_token);
    fprintf(f, "  memory       page %llu KiB; device %llu pages (%.0f MiB), host %llu pages, "
            "disk %llu pages\n", (unsigned long long)(z->page_size / 1024),
            (unsigned long long)z->pages_device_total,
            mib(z->pages_device_total * z->page_size), (unsigned long long)z->pages_host_total,
            (unsigned long long)z->pages_disk_total);
    fprintf(f, "  preemption   asked %s, used %s%s%s\n", preempt_names[o->preempt],
            r->preempt_effective ? r->preempt_effective : "?",
            r->fallback_reason[0] ? " -- fell back: " : "", r->fallback_reason);
    fprintf(f, "  run          %llu step%s in %.1f s (%.0f steps/s), %llu tokens decoded "
            "(%.0f tokens/s), %llu prefilled, %llu recomputed\n",
            (unsigned long long)r->steps, r->steps == 1 ? "" : "s", r->elapsed_s, r->steps / t,
            (unsigned long long)r->tokens_decoded, r->tokens_decoded / t,
            (unsigned long long)r->tokens_prefilled, (unsigned long long)r->tokens_recomputed);
    fprintf(f, "  time         %.1f s in all: %.1f s of setup, %.1f s of steps, %.1f s of final "
            "verification%s\n", r->wall_s, r->setup_s, r->elapsed_s, r->drain_s,
            o->duration_s > 0 ? " (--duration bounds the setup and the steps)" : "");
    fprintf(f, "  requests     %llu arrived, %llu finished (forked branches included); "
            "%llu forks, %llu shares, %llu beam replacements, %llu truncates\n",
            (unsigned long long)r->requests_admitted,
            (unsigned long long)r->requests_finished, (unsigned long long)r->forks,
            (unsigned long long)r->shares, (unsigned long long)r->beam_replacements,
            (unsigned long long)r->truncates);
    fprintf(f, "  preemptions  %llu swap-outs, %llu swap-ins by the tool; library counted "
            "%llu swap-outs, %llu swap-ins (auto-swap included); %llu by recompute; %llu "
            "-ENOMEM handled\n", (unsigned long long)r->swap_outs,
            (unsigned long long)r->swap_ins, (unsigned long long)d(s->swap_outs, z->swap_outs),
            (unsigned long long)d(s->swap_ins, z->swap_ins),
            (unsigned long long)r->preempt_recompute, (unsigned long long)r->enomem_handled);
    /* sliding-window layers and the prefix cache */
    if (o->window)
        fprintf(f, "  window       %llu-token window every %u layers: %llu discard calls, %llu "
                "pages discarded (library); the discards spared %.1f%% of the pages (held + "
                "spared) on average, %.1f%% at peak (%llu pages)\n",
                (unsigned long long)o->window, o->window_every,
                (unsigned long long)r->discard_calls,
                (unsigned long long)d(s->pages_discarded, z->pages_discarded),
                r->n_oversub ? 100 * r->sum_discard_saving / r->n_oversub : 0,
                100 * r->peak_discard_saving, (unsigned long long)r->peak_discarded_now);
    if (o->prefix_cache > 0) {
        uint64_t look = r->cache_hits + r->cache_misses;
        fprintf(f, "  prefix cache %llu entries made, %llu evicted; %llu lookups: %llu hits "
                "(%.1f%%), %llu misses; library: %llu drops, %llu demotes; drain: %llu dropped "
                "entries -ESTALE, %llu verified\n", (unsigned long long)r->cache_puts,
                (unsigned long long)r->cache_evicted, (unsigned long long)look,
                (unsigned long long)r->cache_hits, look ? 100.0 * r->cache_hits / look : 0,
                (unsigned long long)r->cache_misses,
                (unsigned long long)d(s->cache_drops, z->cache_drops),
                (unsigned long long)d(s->cache_demotes, z->cache_demotes),
                (unsigned long long)r->cache_stale_checked,
                (unsigned long long)r->cache_verified);
    }
    if (o->store_url)
        fprintf(f, "  store        %llu entries written, %llu read (%llu found by lookups), "
                "%llu errors; %.1f MiB out, %.1f MiB in\n",
                (unsigned long long)d(s->store_puts, z->store_puts),
                (unsigned long long)d(s->store_gets, z->store_gets),
                (unsigned long long)d(s->store_hits, z->store_hits),
                (unsigned long long)d(s->store_errors, z->store_errors),
                d(s->store_bytes_out, z->store_bytes_out) / 1048576.0,
                d(s->store_bytes_in, z->store_bytes_in) / 1048576.0);
    if (o->prefix_keyed)
        fprintf(f, "  prefix keys  %llu attaches: %llu of %llu blocks asked attached (hit rate "
                "%.1f%%; %llu from host, %llu from disk, %llu from the pool's shared index, %llu "
                "attached from it without a copy; %.1f MiB copied onto the device by the "
                "attaches; attached bytes verified with their requests); %llu entries "
                "published in %llu calls; library: %llu entries now, %llu lookups, %llu hit "
                "blocks, %llu evictions, %llu entry pages spilled\n",
                (unsigned long long)r->pk_attach_calls, (unsigned long long)r->pk_attached,
                (unsigned long long)r->pk_asked,
                r->pk_asked ? 100.0 * r->pk_attached / r->pk_asked : 0,
                (unsigned long long)r->pk_from_host, (unsigned long long)r->pk_from_disk,
                (unsigned long long)r->pk_from_pool,
                (unsigned long long)d(s->pool_hit_blocks, z->pool_hit_blocks),
                r->pk_copied / 1048576.0,
                (unsigned long long)r->pk_published, (unsigned long long)r->pk_publish_calls,
                (unsigned long long)s->prefix_entries,
                (unsigned long long)d(s->prefix_lookups, z->prefix_lookups),
                (unsigned long long)d(s->prefix_hit_blocks, z->prefix_hit_blocks),
                (unsigned long long)d(s->prefix_evictions, z->prefix_evictions),
                (unsigned long long)d(s->prefix_spills, z->prefix_spills));
    if (o->pool_view)
        fprintf(f, "  pool view    %llu sequences, %llu block ids checked, %llu bad; %s; %llu "
                "block tables refused (-EAGAIN, not resident: skipped)\n",
                (unsigned long long)r->pv_seqs, (unsigned long long)r->pv_blocks,
                (unsigned long long)r->pv_bad_ids,
                o->pool_cpu ? "bytes compared" : "byte check SKIPPED (device memory not "
                "CPU-readable: CUDA or emu_opaque)", (unsigned long long)r->pv_eagain);
    if (o->pool_view && o->pool_cpu)
        fprintf(f, "  pool view    %llu bytes compared, %llu mismatched tokens\n",
                (unsigned long long)r->pv_bytes, (unsigned long long)r->pv_mismatches);
    if (o->pool_socket)
        fprintf(f, "  pool         %s on %s: %llu frames leased, %llu given back, %llu calls "
                "waited (%.1f ms); at the end: held %.1f MiB, pool %.1f MiB, free %.1f MiB, "
                "%u clients%s\n", o->client_name ? o->client_name : "this client",
                o->pool_socket, (unsigned long long)d(s->pool_leases, z->pool_leases),
                (unsigned long long)d(s->pool_returns, z->pool_returns),
                (unsigned long long)d(s->pool_waits, z->pool_waits),
                (double)d(s->pool_wait_ns, z->pool_wait_ns) / 1e6, mib(r->pool_end.held_bytes),
                mib(r->pool_end.pool_bytes), mib(r->pool_end.free_bytes),
                r->pool_end.n_clients, !r->pool_ok ? " (kvvm_pool_info failed)"
                : r->pool_end.connected ? "" : " (the daemon is gone)");
    fprintf(f, "\n  %-8s %12s %12s %14s %14s\n", "tier", "pages", "peak used", "moved in MiB",
            "moved out MiB");
    fprintf(f, "  %-8s %12llu %12llu %14.1f %14.1f\n", "device",
            (unsigned long long)z->pages_device_total, (unsigned long long)r->peak_dev,
            mib(d(s->bytes_to_device, z->bytes_to_device)),
            mib(d(s->bytes_to_host, z->bytes_to_host)));
    fprintf(f, "  %-8s %12llu %12llu %14.1f %14.1f\n", "host",
            (unsigned long long)z->pages_host_total, (unsigned long long)r->peak_host,
            mib(d(s->bytes_to_host, z->bytes_to_host)),
            mib(d(s->bytes_to_disk, z->bytes_to_disk)));
    fprintf(f, "  %-8s %12llu %12llu %14.1f %14.1f\n", "disk",
            (unsigned long long)z->pages_disk_total, (unsigned long long)r->peak_disk,
            mib(d(s->bytes_to_disk, z->bytes_to_disk)),
            mib(d(s->bytes_from_disk, z->bytes_from_disk)));
    fprintf(f, "\n  oversubscription: asked %.2f, measured peak %.2f (pages in use on device + "
            "host + disk / device pages)%s\n", o->oversubscribe, r->peak_oversub,
            r->peak_oversub >= 0.9 * o->oversubscribe ? "" : "  ** NOT REACHED **");
    fprintf(f, "                    measured mean %.2f over the run (the same ratio averaged "
            "over steps)\n", r->n_oversub ? r->sum_oversub / r->n_oversub : 0.0);
    fprintf(f, "                    steady mean %.2f over the %llu steps from the first at 0.9 x "
            "asked on (the ramp up excluded)\n", r->n_steady ? r->sum_steady / r->n_steady : 0.0,
            (unsigned long long)r->n_steady);
    fprintf(f, "                    peak held %.2f (the same, pages in flight between two tiers "
            "counted once)\n", r->peak_held);
    fprintf(f, "                    workload estimate peak %.2f (the tool's own page count, "
            "shared system prompt once, forks counted in full)\n", r->peak_logical_oversub);
    fprintf(f, "  disk round trip:  %llu spills, %llu unspills; %llu pages seen on disk before "
            "a swap-in, %llu of them in sequences verified afterwards\n",
            (unsigned long long)d(s->spills, z->spills),
            (unsigned long long)d(s->unspills, z->unspills),
            (unsigned long long)r->disk_pages_swapped_in,
            (unsigned long long)r->disk_pages_verified);
    fprintf(f, "\n  %-11s %10s %10s %10s %10s\n", "latency us", "count", "p50", "p99", "max");
    for (int i = 0; i < LAT_N; i++) {
        struct lat *l = (struct lat *)&r->lat[i];
        if (!l->count)
            continue;
        double p50, p99, mx;
        lat_pct(l, &p50, &p99, &mx);
        fprintf(f, "  %-11s %10llu %10.1f %10.1f %10.1f\n", l->name,
                (unsigned long long)l->count, p50, p99, mx);
    }
    /* elastic memory: frames created on the engine's thread, budget changes */
    fprintf(f, "\n  frames: %llu created on the engine's thread (%llu after the warm-up at "
            "step %llu, %.1f s), %llu released to the driver before close; %.1f MiB held at "
            "the end\n", (unsigned long long)d(s->frames_created_sync, z->frames_created_sync),
            (unsigned long long)(s->frames_created_sync - r->sync_at_warm),
            (unsigned long long)r->warm_step, r->warm_s,
            (unsigned long long)d(s->frames_released, z->frames_released),
            mib(s->device_bytes_held));
    for (uint32_t i = 0; i < r->n_budget; i++) {
        const struct budget_rec *b = &r->budget[i];
        fprintf(f, "  budget %5.1f s (step %llu): -> %.1f MiB: %s; back with the driver in "
                "%.2f ms; held %.1f -> %.1f MiB, %llu frames released, %llu sequences swapped "
                "out, pages in use %llu -> %llu\n", b->t, (unsigned long long)b->step,
                mib(b->bytes), b->rc ? kvvm_strerror(b->rc) : "done", b->back_ms,
                mib(b->held_before), mib(b->held_after),
                (unsigned long long)b->frames_released, (unsigned long long)b->swap_outs,
                (unsigned long long)b->pages_before, (unsigned long long)b->pages_after);
    }
    fprintf(f, "\n  verification: %llu sequences, %llu tokens, %.1f MiB read back; %llu "
            "mismatched tokens in %llu sequences; %llu checks skipped (no device room)\n",
            (unsigned long long)r->seqs_verified,
            (unsigned long long)r->tokens_verified, mib(r->bytes_verified),
            (unsigned long long)r->mismatches, (unsigned long long)r->mismatched_seqs,
            (unsigned long long)r->verify_skipped);
    fprintf(f, "  library: %llu checksum failures, %llu I/O errors; tool: %llu unexpected "
            "errors%s\n", (unsigned long long)d(s->checksum_failures, z->checksum_failures),
            (unsigned long long)d(s->io_errors, z->io_errors),
            (unsigned long long)r->unexpected_errors, r->aborted ? " (run aborted)" : "");
    for (uint32_t i = 0; i < r->n_err; i++)
        fprintf(f, "    step %llu: %s (request %llu): %s\n", (unsigned long long)r->errs[i].step,
                r->errs[i].op, (unsigned long long)r->errs[i].req,
                kvvm_strerror(r->errs[i].err));
    if (r->interrupted)
        fprintf(f, "  interrupted: %s after %llu steps (everything live was still verified)\n",
                r->interrupted == SIGINT ? "SIGINT" : "SIGTERM", (unsigned long long)r->steps);
    fprintf(f, "  result: %s (exit %d)\n", status == 0 ? "PASS" : "FAIL", status);
}

#define U(x) ((unsigned long long)(x))

int report_json(const char *path, const struct opts *o, const struct results *r, int status)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "w") : stdout;
    if (!f)
        return -errno;
    const struct kvvm_stats *s = &r->st, *z = &r->st0;
    double t = r->elapsed_s > 0 ? r->elapsed_s : 1e-9;
    fprintf(f, "{\n  \"tool\": \"kvvm-stress\",\n  \"library_version\": ");
    tool_json_string(f, kvvm_version());
    fprintf(f, ",\n  \"backend\": ");
    tool_json_string(f, r->backend);
    fprintf(f, ",\n  \"io_engine\": ");
    if (r->io_engine[0])
        tool_json_string(f, r->io_engine);
    else
        fprintf(f, "null");
    fprintf(f, ",\n  \"config\": {\"preset\": ");
    tool_json_string(f, o->preset);
    fprintf(f, ", \"layers\": %u, \"kv_heads\": %u, \"head_dim\": %u, \"dtype_bytes\": %u, "
            "\"layout\": \"%s\", \"n_regions\": %u, \"bytes_per_token\": %llu, "
            "\"page_size\": %llu, \"device_budget\": %llu, \"host_budget\": %llu, "
            "\"spill_budget\": %llu, \"spill_dir\": ", o->layers, o->kv_heads, o->head_dim,
            o->dtype_bytes, o->token_major ? "token" : "layer", o->n_regions,
            U(o->bytes_per_token), U(z->page_size), U(o->device_budget), U(o->host_budget),
            U(o->spill_budget));
    if (o->spill_dir)
        tool_json_string(f, o->spill_dir);
    else
        fprintf(f, "null");
    fprintf(f, ", \"oversubscribe\": %.3f, \"preempt\": \"%s\", \"stream\": %s, \"seed\": %llu, "
            "\"steps\": %llu, \"duration_s\": %.3f, \"max_seqs\": %u, \"max_tokens\": %llu, "
            "\"max_batch\": %u, \"quantum\": %u, \"verify_every\": %u, "
            "\"prompt_len\": {\"median\": %.1f, \"sigma\": %.3f, \"min\": %llu, \"max\": %llu}, "
            "\"output_len\": {\"median\": %.1f, \"sigma\": %.3f, \"min\": %llu, \"max\": %llu}, "
            "\"system_prompt\": %u, \"p_share\": %.3f, \"p_parallel\": %.3f, "
            "\"max_parallel\": %u, \"p_beam\": %.3f},\n",
            o->oversubscribe, preempt_names[o->preempt], o->stream ? "true" : "false",
            U(o->seed), U(o->steps), o->duration_s, o->max_seqs, U(o->max_tokens),
            o->max_batch, o->quantum, o->verify_every, o->prompt.median, o->prompt.sigma,
            U(o->prompt.min), U(o->prompt.max), o->output.median, o->output.sigma,
            U(o->output.min), U(o->output.max), o->system_prompt, o->p_share, o->p_parallel,
            o->max_parallel, o->p_beam);
    fprintf(f, "  \"library\": %s,\n", r->lib_json ? r->lib_json : "null");
    fprintf(f, "  \"preempt_effective\": \"%s\",\n  \"preempt_fallback\": ",
            r->preempt_effective ? r->preempt_effective : "?");
    if (r->fallback_reason[0]) {
        fprintf(f, "{\"to\": \"recompute\", \"reason\": ");
        tool_json_string(f, r->fallback_reason);
        fprintf(f, "}");
    } else {
        fprintf(f, "null");
    }
    fprintf(f, ",\n  \"run\": {\"steps\": %llu, \"elapsed_s\": %.3f, \"setup_s\": %.3f, "
            "\"drain_s\": %.3f, \"wall_s\": %.3f, \"steps_per_s\": %.1f, "
            "\"tokens_decoded\": %llu, \"tokens_per_s\": %.1f, \"tokens_prefilled\": %llu, "
            "\"tokens_recomputed\": %llu, \"tokens_written\": %llu, \"requests_admitted\": %llu, "
            "\"requests_finished\": %llu, \"forks\": %llu, \"shares\": %llu, "
            "\"beam_replacements\": %llu, \"truncates\": %llu, \"swap_outs\": %llu, "
            "\"swap_ins\": %llu, \"preempt_recompute\": %llu, \"enomem_handled\": %llu, "
            "\"batch_shrinks\": %llu, \"peak_running\": %u, \"peak_live_requests\": %u, "
            "\"aborted\": %s, \"interrupted\": %s},\n",
            U(r->steps), r->elapsed_s, r->setup_s, r->drain_s, r->wall_s, r->steps / t,
            U(r->tokens_decoded),
            r->tokens_decoded / t, U(r->tokens_prefilled), U(r->tokens_recomputed),
            U(r->tokens_written), U(r->requests_admitted), U(r->requests_finished),
            U(r->forks), U(r->shares), U(r->beam_replacements), U(r->truncates),
            U(r->swap_outs), U(r->swap_ins), U(r->preempt_recompute), U(r->enomem_handled),
            U(r->batch_shrinks), r->peak_running, r->peak_live, r->aborted ? "true" : "false",
            !r->interrupted ? "null" : r->interrupted == SIGINT ? "\"SIGINT\"" : "\"SIGTERM\"");
    /* sliding-window layers and the prefix cache */
    fprintf(f, "  \"window\": {\"tokens\": %llu, \"every\": %u, \"discard_calls\": %llu, "
            "\"pages_discarded\": %llu, \"saving_mean\": %.4f, \"saving_peak\": %.4f, "
            "\"spared_pages_peak\": %llu},\n", U(o->window), o->window_every,
            U(r->discard_calls), U(d(s->pages_discarded, z->pages_discarded)),
            r->n_oversub ? r->sum_discard_saving / r->n_oversub : 0, r->peak_discard_saving,
            U(r->peak_discarded_now));
    fprintf(f, "  \"prefix_cache\": {\"p\": %.3f, \"entries\": %u, \"puts\": %llu, "
            "\"evicted\": %llu, \"hits\": %llu, \"misses\": %llu, \"hit_rate\": %.4f, "
            "\"cache_drops\": %llu, \"cache_demotes\": %llu, \"stale_checked\": %llu, "
            "\"verified\": %llu},\n", o->prefix_cache, o->cache_entries, U(r->cache_puts),
            U(r->cache_evicted), U(r->cache_hits), U(r->cache_misses),
            r->cache_hits + r->cache_misses
                ? (double)r->cache_hits / (r->cache_hits + r->cache_misses) : 0,
            U(d(s->cache_drops, z->cache_drops)), U(d(s->cache_demotes, z->cache_demotes)),
            U(r->cache_stale_checked), U(r->cache_verified));
    fprintf(f, "  \"prefix_keyed\": {\"on\": %s, \"prompts\": %u, \"attach_calls\": %llu, "
            "\"blocks_asked\": %llu, \"blocks_attached\": %llu, \"hit_rate\": %.4f, "
            "\"published\": %llu, \"publish_calls\": %llu, \"prefix_entries\": %llu, "
            "\"prefix_lookups\": %llu, \"prefix_hit_blocks\": %llu, "
            "\"prefix_evictions\": %llu, \"from_host\": %llu, \"from_disk\": %llu, "
            "\"prefix_spills\": %llu, \"from_pool\": %llu, \"pool_hit_blocks\": %llu, "
            "\"attach_copied_bytes\": %llu},\n", o->prefix_keyed ? "true" : "false",
            o->pk_prompts,
            U(r->pk_attach_calls), U(r->pk_asked), U(r->pk_attached),
            r->pk_asked ? (double)r->pk_attached / r->pk_asked : 0, U(r->pk_published),
            U(r->pk_publish_calls), U(s->prefix_entries),
            U(d(s->prefix_lookups, z->prefix_lookups)),
            U(d(s->prefix_hit_blocks, z->prefix_hit_blocks)),
            U(d(s->prefix_evictions, z->prefix_evictions)), U(r->pk_from_host),
            U(r->pk_from_disk), U(d(s->prefix_spills, z->prefix_spills)), U(r->pk_from_pool),
            U(d(s->pool_hit_blocks, z->pool_hit_blocks)), U(r->pk_copied));
    fprintf(f, "  \"store\": {\"on\": %s, \"puts\": %llu, \"gets\": %llu, \"hits\": %llu, "
            "\"errors\": %llu, \"bytes_out\": %llu, \"bytes_in\": %llu},\n",
            o->store_url ? "true" : "false", U(d(s->store_puts, z->store_puts)),
            U(d(s->store_gets, z->store_gets)), U(d(s->store_hits, z->store_hits)),
            U(d(s->store_errors, z->store_errors)), U(d(s->store_bytes_out, z->store_bytes_out)),
            U(d(s->store_bytes_in, z->store_bytes_in)));
    fprintf(f, "  \"pool_view\": {\"on\": %s, \"bytes_checked\": %s, \"seqs\": %llu, "
            "\"block_ids\": %llu, \"bad_ids\": %llu, \"bytes\": %llu, \"mismatches\": %llu, "
            "\"eagain_skipped\": %llu},\n", o->pool_view ? "true" : "false",
            o->pool_cpu ? "true" : "false", U(r->pv_seqs), U(r->pv_blocks), U(r->pv_bad_ids),
            U(r->pv_bytes), U(r->pv_mismatches), U(r->pv_eagain));
    fprintf(f, "  \"pool\": {\"on\": %s, \"client\": ", o->pool_socket ? "true" : "false");
    if (o->client_name)
        tool_json_string(f, o->client_name);
    else
        fprintf(f, "null");
    fprintf(f, ", \"leases\": %llu, \"returns\": %llu, \"waits\": %llu, \"wait_ms\": %.3f, "
            "\"connected\": %s, \"pool_bytes\": %llu, \"free_bytes\": %llu, "
            "\"held_bytes\": %llu, \"limit_bytes\": %llu, \"reserve_bytes\": %llu, "
            "\"n_clients\": %u},\n", U(d(s->pool_leases, z->pool_leases)),
            U(d(s->pool_returns, z->pool_returns)), U(d(s->pool_waits, z->pool_waits)),
            (double)d(s->pool_wait_ns, z->pool_wait_ns) / 1e6,
            r->pool_ok && r->pool_end.connected ? "true" : "false", U(r->pool_end.pool_bytes),
            U(r->pool_end.free_bytes), U(r->pool_end.held_bytes), U(r->pool_end.limit_bytes),
            U(r->pool_end.reserve_bytes), r->pool_end.n_clients);
    fprintf(f, "  \"frames\": {\"created_sync\": %llu, \"created_sync_after_warmup\": %llu, "
            "\"warmup_step\": %llu, \"released\": %llu, \"device_bytes_held\": %llu},\n",
            U(d(s->frames_created_sync, z->frames_created_sync)),
            U(s->frames_created_sync - r->sync_at_warm), U(r->warm_step),
            U(d(s->frames_released, z->frames_released)), U(s->device_bytes_held));
    fprintf(f, "  \"budget_changes\": [");
    for (uint32_t i = 0; i < r->n_budget; i++) {
        const struct budget_rec *b = &r->budget[i];
        fprintf(f, "%s{\"t_s\": %.3f, \"step\": %llu, \"bytes\": %llu, \"rc\": %d, "
                "\"back_ms\": %.3f, \"held_before\": %llu, \"held_after\": %llu, "
                "\"frames_released\": %llu, \"swap_outs\": %llu, \"pages_before\": %llu, "
                "\"pages_after\": %llu}", i ? ", " : "", b->t, U(b->step), U(b->bytes), b->rc,
                b->back_ms, U(b->held_before), U(b->held_after), U(b->frames_released),
                U(b->swap_outs), U(b->pages_before), U(b->pages_after));
    }
    fprintf(f, "],\n");
    fprintf(f, "  \"library_counters\": {\"maps\": %llu, \"unmaps\": %llu, \"cow_copies\": %llu, "
            "\"swap_outs\": %llu, \"swap_ins\": %llu, \"spills\": %llu, \"unspills\": %llu, "
            "\"bytes_to_host\": %llu, \"bytes_to_device\": %llu, \"bytes_to_disk\": %llu, "
            "\"bytes_from_disk\": %llu, \"checksum_failures\": %llu, \"io_errors\": %llu},\n",
            U(d(s->maps, z->maps)), U(d(s->unmaps, z->unmaps)),
            U(d(s->cow_copies, z->cow_copies)), U(d(s->swap_outs, z->swap_outs)),
            U(d(s->swap_ins, z->swap_ins)), U(d(s->spills, z->spills)),
            U(d(s->unspills, z->unspills)), U(d(s->bytes_to_host, z->bytes_to_host)),
            U(d(s->bytes_to_device, z->bytes_to_device)),
            U(d(s->bytes_to_disk, z->bytes_to_disk)),
            U(d(s->bytes_from_disk, z->bytes_from_disk)),
            U(d(s->checksum_failures, z->checksum_failures)), U(d(s->io_errors, z->io_errors)));
    fprintf(f, "  \"bandwidth_bytes_per_s\": {\"device_to_host\": %.0f, \"host_to_device\": %.0f, "
            "\"host_to_disk\": %.0f, \"disk_to_host\": %.0f},\n",
            d(s->bytes_to_host, z->bytes_to_host) / t,
            d(s->bytes_to_device, z->bytes_to_device) / t,
            d(s->bytes_to_disk, z->bytes_to_disk) / t,
            d(s->bytes_from_disk, z->bytes_from_disk) / t);
    fprintf(f, "  \"latency_us\": {");
    for (int i = 0, first = 1; i < LAT_N; i++) {
        struct lat *l = (struct lat *)&r->lat[i];
        double p50, p99, mx;
        lat_pct(l, &p50, &p99, &mx);
        fprintf(f, "%s\"%s\": {\"count\": %llu, \"p50\": %.2f, \"p99\": %.2f, \"max\": %.2f}",
                first ? "" : ", ", l->name, U(l->count), p50, p99, mx);
        first = 0;
    }
    fprintf(f, "},\n");
    fprintf(f, "  \"occupancy_pages\": {\"page_size\": %llu, "
            "\"device_total\": %llu, \"device_peak\": %llu, \"host_total\": %llu, "
            "\"host_peak\": %llu, \"disk_total\": %llu, \"disk_peak\": %llu, "
            "\"inflight_peak\": %llu},\n",
            U(z->page_size), U(z->pages_device_total), U(r->peak_dev), U(z->pages_host_total),
            U(r->peak_host), U(z->pages_disk_total), U(r->peak_disk), U(r->peak_inflight));
    fprintf(f, "  \"tiers_used\": {\"device\": %s, \"host\": %s, \"disk\": %s},\n",
            r->peak_dev ? "true" : "false", r->peak_host ? "true" : "false",
            r->peak_disk ? "true" : "false");
    fprintf(f, "  \"oversubscription\": {\"target\": %.3f, \"measured_peak\": %.4f, "
            "\"measured_mean\": %.4f, \"steady_mean\": %.4f, \"steady_steps\": %llu, "
            "\"peak_held\": %.4f, \"workload_estimate_peak\": %.4f, \"reached\": %s},\n",
            o->oversubscribe, r->peak_oversub,
            r->n_oversub ? r->sum_oversub / r->n_oversub : 0.0,
            r->n_steady ? r->sum_steady / r->n_steady : 0.0, U(r->n_steady), r->peak_held,
            r->peak_logical_oversub,
            r->peak_oversub >= 0.9 * o->oversubscribe ? "true" : "false");
    fprintf(f, "  \"disk_round_trip\": {\"spills\": %llu, \"unspills\": %llu, "
            "\"pages_seen_on_disk_at_swap_in\": %llu, \"pages_verified_after_disk\": %llu},\n",
            U(d(s->spills, z->spills)), U(d(s->unspills, z->unspills)),
            U(r->disk_pages_swapped_in), U(r->disk_pages_verified));
    fprintf(f, "  \"verification\": {\"sequences_verified\": %llu, \"tokens_verified\": %llu, "
            "\"bytes_verified\": %llu, \"mismatches\": %llu, \"mismatched_sequences\": %llu, "
            "\"skipped_no_room\": %llu},\n",
            U(r->seqs_verified), U(r->tokens_verified), U(r->bytes_verified),
            U(r->mismatches), U(r->mismatched_seqs), U(r->verify_skipped));
    fprintf(f, "  \"errors\": {\"unexpected\": %llu, \"list\": [", U(r->unexpected_errors));
    for (uint32_t i = 0; i < r->n_err; i++) {
        fprintf(f, "%s{\"step\": %llu, \"op\": ", i ? ", " : "", U(r->errs[i].step));
        tool_json_string(f, r->errs[i].op);
        fprintf(f, ", \"request\": %llu, \"errno\": %d, \"message\": ", U(r->errs[i].req),
                r->errs[i].err);
        tool_json_string(f, kvvm_strerror(r->errs[i].err));
        fprintf(f, "}");
    }
    fprintf(f, "]},\n  \"exit_status\": %d\n}\n", status);
    int err = ferror(f) ? -EIO : 0;
    if (f != stdout && fclose(f))
        err = -errno;
    return err;
}

int report_trace(const char *path, const struct results *r)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -errno;
    fprintf(f, "step,time_s,device_pages,host_pages,disk_pages,inflight_pages,"
            "running,off_device,waiting\n");
    for (size_t i = 0; i < r->n_trace; i++) {
        const struct trace_pt *p = &r->trace[i];
        fprintf(f, "%llu,%.4f,%llu,%llu,%llu,%llu,%u,%u,%u\n", U(p->step), p->t, U(p->dev),
                U(p->host), U(p->disk), U(p->inflight), p->running, p->off_device, p->waiting);
    }
    int err = ferror(f) ? -EIO : 0;
    if (fclose(f))
        err = -errno;
    return err;
}

/* A tick spacing of 1, 2 or 5 x 10^k that divides [0, max] into about n intervals. */
static double nice_step(double max, int n)
{
    if (max <= 0)
        return 1;
    double raw = max / n, p = 1;
    while (p * 10 <= raw)
        p *= 10;
    while (p > raw)
        p /= 10;
    double m = raw / p;
    return p * (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10);
}

/* One panel of the plot: its box on the page and its y range (rounded up to a tick). */
struct panel {
    double top, height, ymax, ystep;
    uint64_t smax;
};
#define SVG_W 960.0
#define SVG_L 70.0      /* left margin: y tick labels */
#define SVG_R 150.0     /* right margin: the reference lines' labels, clear of the data */

static double px(const struct panel *p, double step)
{
    return SVG_L + (SVG_W - SVG_L - SVG_R) * step / (double)p->smax;
}
static double py(const struct panel *p, double v)
{
    return p->top + p->height - p->height * v / p->ymax;
}

/* Axes, round-number ticks on both (about yticks on y), the y label; step labels only on the bottom panel. */
static void svg_axes(FILE *f, struct panel *p, double data_max, int yticks,
                     const char *ylabel, int step_labels)
{
    p->ystep = nice_step(data_max > 0 ? data_max : 1, yticks);
    p->ymax = ceil_div_d(data_max > 0 ? data_max : 1, p->ystep) * p->ystep;
    double x0 = SVG_L, x1 = SVG_W - SVG_R, y1 = p->top + p->height;
    for (double v = 0; v <= p->ymax + p->ystep / 2; v += p->ystep) {
        fprintf(f, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#dddddd\"/>"
                "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%.0f</text>\n", x0, py(p, v),
                x1, py(p, v), x0 - 6, py(p, v) + 4, v);
    }
    double sstep = nice_step((double)p->smax, 6);
    for (double st = 0; st <= (double)p->smax + sstep / 1e6; st += sstep) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"black\"/>\n",
                px(p, st), y1, px(p, st), y1 + 4);
        if (step_labels)
            fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%.0f</text>\n",
                    px(p, st), y1 + 17, st);
    }
    fprintf(f, "<polyline fill=\"none\" stroke=\"black\" points=\"%.0f,%.0f %.0f,%.0f "
            "%.0f,%.0f\"/>\n", x0, p->top, x0, y1, x1, y1);
    fprintf(f, "<text x=\"16\" y=\"%.0f\" transform=\"rotate(-90 16 %.0f)\" "
            "text-anchor=\"middle\">%s</text>\n", p->top + p->height / 2,
            p->top + p->height / 2, ylabel);
}

/* The legend of a panel, in the right margin from its top down. */
static void svg_legend(FILE *f, const struct panel *p, int i, const char *color,
                       const char *name, int line)
{
    double x = SVG_W - SVG_R + 12, y = p->top + 4 + 18 * i;
    if (line)
        fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" "
                "stroke-width=\"2\"/>", x, y + 6, x + 14, y + 6, color);
    else
        fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"12\" fill=\"%s\"/>", x,
                y, color);
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">%s</text>\n", x + 20, y + 11, name);
}

/* A series as a polyline, each of at most `cols` columns taking its bucket's max. */
static void svg_series(FILE *f, const struct panel *p, const struct results *r, size_t cols,
                       const char *color, double (*val)(const struct trace_pt *))
{
    size_t n = r->n_trace;
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", color);
    for (size_t c = 0; c < cols; c++) {
        size_t a = c * n / cols, b = (c + 1) * n / cols;
        double v = 0;
        for (size_t i = a; i < b; i++)
            if (val(&r->trace[i]) > v)
                v = val(&r->trace[i]);
        fprintf(f, "%s%.1f,%.1f", c ? " " : "", px(p, (double)r->trace[b ? b - 1 : 0].step),
                py(p, v));
    }
    fprintf(f, "\"/>\n");
}

static double v_running(const struct trace_pt *t) { return t->running; }
static double v_waiting(const struct trace_pt *t) { return t->waiting; }
static double v_off(const struct trace_pt *t) { return t->off_device; }
static double v_inflight(const struct trace_pt *t) { return (double)t->inflight; }

/* Three panels over the steps, sharing the step axis: (1) a stacked area plot of pages in
   use per tier with the device capacity and X times it as reference lines; (2) requests
   running, waiting for their prefill and off the device; (3) pages in flight between
   tiers. At most ~1200 columns: each takes its bucket's max. Ticks fall on round numbers;
   legends and the reference lines' labels sit in the right margin, clear of the data. */
int report_svg(const char *path, const struct opts *o, const struct results *r)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -errno;
    const double H = 720;
    size_t n = r->n_trace, cols = n < 1200 ? n : 1200;
    double dev_total = (double)r->st0.pages_device_total;
    double xt = dev_total * o->oversubscribe;
    double pmax = dev_total > xt ? dev_total : xt, rmax = 1, imax = 1;
    for (size_t i = 0; i < n; i++) {
        const struct trace_pt *t = &r->trace[i];
        double v = (double)(t->dev + t->host + t->disk);
        pmax = v > pmax ? v : pmax;
        rmax = t->running > rmax ? t->running : rmax;
        rmax = t->waiting > rmax ? t->waiting : rmax;
        rmax = t->off_device > rmax ? t->off_device : rmax;
        imax = (double)t->inflight > imax ? (double)t->inflight : imax;
    }
    uint64_t smax = n && r->trace[n - 1].step ? r->trace[n - 1].step : 1;
    struct panel pp = { .top = 60, .height = 310, .smax = smax };
    struct panel pr = { .top = 410, .height = 150, .smax = smax };
    struct panel pi = { .top = 600, .height = 70, .smax = smax };
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "font-family=\"sans-serif\" font-size=\"12\">\n", SVG_W, H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%.0f\" y=\"24\" font-size=\"15\">kvvm-stress: %s, %s, preempt %s: "
            "measured peak x%.2f of asked x%.2f</text>\n", SVG_L, o->preset,
            r->backend ? r->backend : "?", r->preempt_effective ? r->preempt_effective : "?",
            r->peak_oversub, o->oversubscribe);

    /* panel 1: pages in use per tier, stacked: device at the bottom, host, disk on top */
    svg_axes(f, &pp, pmax * 1.02, 4, "pages in use", 0);
    const char *colors[3] = { "#4477aa", "#ee8866", "#aa3377" };
    const char *names[3] = { "device", "host", "disk" };
    for (int layer = 2; layer >= 0; layer--) {
        fprintf(f, "<polygon fill=\"%s\" fill-opacity=\"0.85\" points=\"%.1f,%.1f",
                colors[layer], px(&pp, 0), py(&pp, 0));
        for (size_t c = 0; c < cols; c++) {
            size_t a = c * n / cols, b = (c + 1) * n / cols;
            double v = 0;
            for (size_t i = a; i < b; i++) {
                double x = (double)r->trace[i].dev;
                if (layer >= 1) x += (double)r->trace[i].host;
                if (layer >= 2) x += (double)r->trace[i].disk;
                if (x > v) v = x;
            }
            fprintf(f, " %.1f,%.1f", px(&pp, (double)r->trace[b ? b - 1 : 0].step),
                    py(&pp, v));
        }
        fprintf(f, " %.1f,%.1f\"/>\n", px(&pp, (double)smax), py(&pp, 0));
    }
    for (int i = 0; i < 3; i++)         /* above the panel: the margin has the labels */
        fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"12\" fill=\"%s\"/>"
                "<text x=\"%.0f\" y=\"%.0f\">%s</text>\n", SVG_W - SVG_R - 230 + i * 80.0,
                pp.top - 18, colors[i], SVG_W - SVG_R - 212 + i * 80.0, pp.top - 8, names[i]);
    /* reference lines across the plot, their labels in the right margin at their height
       (moved apart when the two would overlap) */
    double yd = py(&pp, dev_total), yx = py(&pp, xt);
    double ly_x = yx, ly_d = yd;
    if (fabs(ly_d - ly_x) < 14) {
        ly_x = (yx < yd ? yx : yd) - 7;
        ly_d = ly_x + 14;
        if (xt < dev_total) {
            double tmp = ly_x;
            ly_x = ly_d;
            ly_d = tmp;
        }
    }
    double rx = SVG_W - SVG_R;
    fprintf(f, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"black\" "
            "stroke-dasharray=\"6,4\"/><text x=\"%.0f\" y=\"%.1f\">device: %.0f</text>\n",
            SVG_L, yd, rx, yd, rx + 6, ly_d + 4, dev_total);
    fprintf(f, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"gray\" "
            "stroke-dasharray=\"2,4\"/><text x=\"%.0f\" y=\"%.1f\" fill=\"gray\">asked x%.2f: "
            "%.0f</text>\n", SVG_L, yx, rx, yx, rx + 6,
            ly_x + 4, o->oversubscribe, xt);

    /* panel 2: requests */
    svg_axes(f, &pr, rmax * 1.05, 3, "requests", 0);
    svg_series(f, &pr, r, cols, "#228833", v_running);
    svg_series(f, &pr, r, cols, "#ccbb44", v_waiting);
    svg_series(f, &pr, r, cols, "#aa3377", v_off);
    svg_legend(f, &pr, 0, "#228833", "running", 1);
    svg_legend(f, &pr, 1, "#ccbb44", "waiting (queued)", 1);
    svg_legend(f, &pr, 2, "#aa3377", "off the device", 1);

    /* panel 3: pages in flight between tiers */
    svg_axes(f, &pi, imax * 1.05, 2, "in flight", 1);
    svg_series(f, &pi, r, cols, "#666666", v_inflight);
    svg_legend(f, &pi, 0, "#666666", "pages in flight", 1);
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">step</text>\n",
            (SVG_L + SVG_W - SVG_R) / 2, H - 8);
    fprintf(f, "</svg>\n");
    int err = ferror(f) ? -EIO : 0;
    if (fclose(f))
        err = -errno;
    return err;
}
