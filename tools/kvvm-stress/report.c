/*
 * report.c: what a run tells its user: latency percentiles, the progress line (terminal
 * only), the final summary table, the JSON report, the CSV occupancy trace and its SVG plot.
 * Nothing here talks to the library except the stats already gathered in struct results.
 */
#include <errno.h>
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
    fprintf(f, "  run          %llu steps in %.1f s (%.0f steps/s), %llu tokens decoded "
            "(%.0f tokens/s), %llu prefilled, %llu recomputed\n",
            (unsigned long long)r->steps, r->elapsed_s, r->steps / t,
            (unsigned long long)r->tokens_decoded, r->tokens_decoded / t,
            (unsigned long long)r->tokens_prefilled, (unsigned long long)r->tokens_recomputed);
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
    fprintf(f, ",\n  \"run\": {\"steps\": %llu, \"elapsed_s\": %.3f, \"steps_per_s\": %.1f, "
            "\"tokens_decoded\": %llu, \"tokens_per_s\": %.1f, \"tokens_prefilled\": %llu, "
            "\"tokens_recomputed\": %llu, \"tokens_written\": %llu, \"requests_admitted\": %llu, "
            "\"requests_finished\": %llu, \"forks\": %llu, \"shares\": %llu, "
            "\"beam_replacements\": %llu, \"truncates\": %llu, \"swap_outs\": %llu, "
            "\"swap_ins\": %llu, \"preempt_recompute\": %llu, \"enomem_handled\": %llu, "
            "\"batch_shrinks\": %llu, \"peak_running\": %u, \"peak_live_requests\": %u, "
            "\"aborted\": %s, \"interrupted\": %s},\n",
            U(r->steps), r->elapsed_s, r->steps / t, U(r->tokens_decoded),
            r->tokens_decoded / t, U(r->tokens_prefilled), U(r->tokens_recomputed),
            U(r->tokens_written), U(r->requests_admitted), U(r->requests_finished),
            U(r->forks), U(r->shares), U(r->beam_replacements), U(r->truncates),
            U(r->swap_outs), U(r->swap_ins), U(r->preempt_recompute), U(r->enomem_handled),
            U(r->batch_shrinks), r->peak_running, r->peak_live, r->aborted ? "true" : "false",
            !r->interrupted ? "null" : r->interrupted == SIGINT ? "\"SIGINT\"" : "\"SIGTERM\"");
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
            "\"measured_mean\": %.4f, \"peak_held\": %.4f, \"workload_estimate_peak\": %.4f, "
            "\"reached\": %s},\n",
            o->oversubscribe, r->peak_oversub,
            r->n_oversub ? r->sum_oversub / r->n_oversub : 0.0, r->peak_held,
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

/* A stacked area plot of pages in use per tier over the steps, with the device capacity
   and X times it as reference lines. At most ~1200 columns: each takes its bucket's max. */
int report_svg(const char *path, const struct opts *o, const struct results *r)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -errno;
    const double W = 960, H = 480, L = 70, R = 20, T = 40, B = 50;
    size_t n = r->n_trace, cols = n < 1200 ? n : 1200;
    double dev_total = (double)r->st0.pages_device_total;
    double ymax = dev_total * (o->oversubscribe > 1 ? o->oversubscribe : 1) * 1.1;
    for (size_t i = 0; i < n; i++) {
        double v = (double)(r->trace[i].dev + r->trace[i].host + r->trace[i].disk);
        if (v > ymax)
            ymax = v * 1.05;
    }
    if (ymax <= 0)
        ymax = 1;
    uint64_t smax = n ? r->trace[n - 1].step : 1;
    if (!smax)
        smax = 1;
#define PX(s) (L + (W - L - R) * (double)(s) / (double)smax)
#define PY(v) (H - B - (H - T - B) * (double)(v) / ymax)
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%.0f\" y=\"22\" font-size=\"15\">kvvm-stress: pages in use per tier "
            "(%s, %s, measured peak x%.2f of asked x%.2f)</text>\n", L, o->preset,
            r->preempt_effective ? r->preempt_effective : "?", r->peak_oversub,
            o->oversubscribe);
    /* stacked: device at the bottom, host on it, disk on top */
    const char *colors[3] = { "#4477aa", "#ee8866", "#aa3377" };
    const char *names[3] = { "device", "host", "disk" };
    for (int layer = 2; layer >= 0; layer--) {
        fprintf(f, "<polygon fill=\"%s\" fill-opacity=\"0.85\" points=\"%.1f,%.1f", colors[layer],
                PX(0), PY(0));
        for (size_t c = 0; c < cols; c++) {
            size_t a = c * n / cols, b = (c + 1) * n / cols;
            double v = 0;
            for (size_t i = a; i < b; i++) {
                double x = (double)r->trace[i].dev;
                if (layer >= 1) x += (double)r->trace[i].host;
                if (layer >= 2) x += (double)r->trace[i].disk;
                if (x > v) v = x;
            }
            fprintf(f, " %.1f,%.1f", PX(r->trace[b ? b - 1 : 0].step), PY(v));
        }
        fprintf(f, " %.1f,%.1f\"/>\n", PX(smax), PY(0));
    }
    fprintf(f, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"black\" "
            "stroke-dasharray=\"6,4\"/><text x=\"%.0f\" y=\"%.1f\">device pages (%.0f)</text>\n",
            L, PY(dev_total), W - R, PY(dev_total), L + 6, PY(dev_total) - 4, dev_total);
    double xt = dev_total * o->oversubscribe;
    fprintf(f, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"gray\" "
            "stroke-dasharray=\"2,4\"/><text x=\"%.0f\" y=\"%.1f\" fill=\"gray\">asked x%.2f"
            "</text>\n", L, PY(xt), W - R, PY(xt), L + 6, PY(xt) - 4, o->oversubscribe);
    fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n",
            L, H - B, W - R, H - B);
    fprintf(f, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n",
            L, T, L, H - B);
    for (int i = 0; i <= 4; i++) {
        double v = ymax * i / 4;
        fprintf(f, "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%.0f</text>\n", L - 6,
                PY(v) + 4, v);
        fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%llu</text>\n",
                PX(smax * i / 4.0), H - B + 16, U(smax * i / 4));
    }
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">step</text>\n",
            (L + W - R) / 2, H - 12);
    fprintf(f, "<text x=\"16\" y=\"%.0f\" transform=\"rotate(-90 16 %.0f)\" "
            "text-anchor=\"middle\">pages</text>\n", (T + H - B) / 2, (T + H - B) / 2);
    for (int i = 0; i < 3; i++)
        fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"12\" height=\"12\" fill=\"%s\"/>"
                "<text x=\"%.0f\" y=\"%.0f\">%s</text>\n", W - R - 240 + i * 80.0, T - 2,
                colors[i], W - R - 224 + i * 80.0, T + 8, names[i]);
    fprintf(f, "</svg>\n");
#undef PX
#undef PY
    int err = ferror(f) ? -EIO : 0;
    if (fclose(f))
        err = -errno;
    return err;
}
