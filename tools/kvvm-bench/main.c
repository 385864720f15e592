/*
 * tools/kvvm-bench/main.c: the benchmark harness (bench.h). Parses the options, runs every
 * group that was linked in (its weak symbol is non-NULL) and selected with --only, prints one
 * aligned table row per figure and, with --json, writes the same records as a JSON array:
 *   [{"group":..., "op":..., "value":..., "unit":..., "baseline":..., "baseline_value":...,
 *     "ratio":..., "trials":..., "spread_lo":..., "spread_hi":...}, ...]
 * A figure without a baseline has "baseline": null, "baseline_value": null, "ratio": null;
 * a single count (no trials) "trials": 0 and null spreads.
 * Nothing is asserted: the exit status is 0 unless an option was bad or a group failed.
 */
#include "../common/json.h"
#include "bench.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvvm.h"
#include "kvvm_testing.h"

uint64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void bench_config(struct kvvm_config *c, int backend, size_t granule, size_t page_size,
                  uint32_t n_regions, uint64_t bytes_per_token, uint32_t max_seqs,
                  uint64_t max_tokens, size_t device_budget)
{
    kvvm_config_init(c);
    c->backend = (enum kvvm_backend)backend;
    c->emu_granule = granule;
    c->page_size = page_size;
    c->n_regions = n_regions;
    c->bytes_per_token = bytes_per_token;
    c->max_seqs = max_seqs;
    c->max_tokens = max_tokens;
    c->device_budget = device_budget;
}

double bench_median(double *v, int n)
{
    if (n <= 0)
        return 0.0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

static void json_number(FILE *f, double x)
{
    if (isfinite(x))
        fprintf(f, "%.6g", x);
    else
        fputs("null", f);
}

/* Prints a value with three significant figures or so, without exponents for usual ranges. */
static void fmt_value(char *buf, size_t len, double x)
{
    if (!isfinite(x))
        snprintf(buf, len, "-");
    else if (x >= 1000.0 || x == 0.0)
        snprintf(buf, len, "%.0f", x);
    else if (x >= 100.0)
        snprintf(buf, len, "%.1f", x);
    else if (x >= 1.0)
        snprintf(buf, len, "%.2f", x);
    else
        snprintf(buf, len, "%.3g", x);
}

#define ROW_FMT "%-8s %-52s %12s %-8s %-34s %12s %9s %13s\n"

static void print_header(void)
{
    printf(ROW_FMT, "group", "operation", "value", "unit", "baseline", "baseline", "ratio",
           "spread");
    printf("%.*s\n", 8 + 1 + 52 + 1 + 12 + 1 + 8 + 1 + 34 + 1 + 12 + 1 + 9 + 1 + 13,
           "------------------------------------------------------------------------------"
           "------------------------------------------------------------------------------");
}

/* One row. lo..hi: the spread over n trials (n 0: none, "-"). */
static void report_row(struct bench_ctx *b, const char *group, const char *op, double value,
                       double baseline, const char *baseline_name, const char *unit,
                       int lower_is_better, double lo, double hi, int n)
{
    int has_base = baseline != 0.0 && isfinite(baseline);
    double ratio = has_base ? value / baseline : NAN;
    char v[32], bv[32], r[32], span[40], slo[16], shi[16];

    fmt_value(v, sizeof v, value);
    fmt_value(bv, sizeof bv, has_base ? baseline : NAN);
    if (has_base) {
        /* "x" then a hint of which way is good, so a reader need not know the unit;
           0.1..100: two decimals; beyond, whole numbers ("1/1088x" = 1088 times smaller) */
        const char *hint = (lower_is_better ? ratio > 1.0 : ratio < 1.0) ? "-" : "+";
        if (ratio >= 100.0)
            snprintf(r, sizeof r, "%.0fx%s", ratio, hint);
        else if (ratio >= 0.1)
            snprintf(r, sizeof r, "%.2fx%s", ratio, hint);
        else if (ratio > 0.0)
            snprintf(r, sizeof r, "1/%.0fx%s", 1.0 / ratio, hint);
        else
            snprintf(r, sizeof r, "0x%s", hint);
    }
    else
        snprintf(r, sizeof r, "-");
    if (n > 0) {
        fmt_value(slo, sizeof slo, lo);
        fmt_value(shi, sizeof shi, hi);
        snprintf(span, sizeof span, "%s..%s", slo, shi);
    }
    else
        snprintf(span, sizeof span, "-");
    printf(ROW_FMT, group, op, v, unit, has_base && baseline_name ? baseline_name : "-", bv, r,
           span);
    fflush(stdout);

    if (!b || !b->json)
        return;
    fputs(b->n_json ? ",\n  {" : "\n  {", b->json);
    fputs("\"group\": ", b->json);
    tool_json_string(b->json, group);
    fputs(", \"op\": ", b->json);
    tool_json_string(b->json, op);
    fputs(", \"value\": ", b->json);
    json_number(b->json, value);
    fputs(", \"unit\": ", b->json);
    tool_json_string(b->json, unit);
    fputs(", \"baseline\": ", b->json);
    if (has_base)
        tool_json_string(b->json, baseline_name ? baseline_name : "");
    else
        fputs("null", b->json);
    fputs(", \"baseline_value\": ", b->json);
    json_number(b->json, has_base ? baseline : NAN);
    fputs(", \"ratio\": ", b->json);
    json_number(b->json, ratio);
    fprintf(b->json, ", \"trials\": %d, \"spread_lo\": ", n);
    json_number(b->json, n > 0 ? lo : NAN);
    fputs(", \"spread_hi\": ", b->json);
    json_number(b->json, n > 0 ? hi : NAN);
    fputc('}', b->json);
    b->n_json++;
}

void bench_report(struct bench_ctx *b, const char *group, const char *op, double value,
                  double baseline, const char *baseline_name, const char *unit,
                  int lower_is_better)
{
    report_row(b, group, op, value, baseline, baseline_name, unit, lower_is_better, 0, 0, 0);
}

/* ---- alternated pairs (bench.h) ----------------------------------------------------- */

void bench_pair_add(struct bench_pair *p, double v, double base)
{
    if (p->n >= BENCH_MAX_TRIALS)
        return;
    p->v[p->n] = v;
    p->base[p->n] = base;
    p->n++;
}

int bench_pairs(struct bench_ctx *b, bench_sample_fn lib, void *lib_arg,
                bench_sample_fn base, void *base_arg, struct bench_pair *p)
{
    p->n = 0;
    for (int t = 0; t < b->trials; t++) {
        double v = 0, w = 0;
        int rc;
        if (base && t % 2) {
            rc = base(base_arg, &w);
            if (!rc)
                rc = lib(lib_arg, &v);
        }
        else {
            rc = lib(lib_arg, &v);
            if (!rc && base)
                rc = base(base_arg, &w);
        }
        if (rc)
            return rc;
        bench_pair_add(p, v, w);
    }
    return 0;
}

void bench_report_trials(struct bench_ctx *b, const char *group, const char *op,
                         const double *v, const double *base, int n,
                         const char *baseline_name, const char *unit, int lower_is_better)
{
    struct bench_pair p = { 0 };
    for (int t = 0; t < n; t++)
        bench_pair_add(&p, v[t], base ? base[t] : 0);
    bench_report_pair(b, group, op, &p, baseline_name, unit, lower_is_better);
}

/* The p-th quantile of the sorted v[0..n), interpolated between ranks. */
static double rank(const double *v, int n, double p)
{
    double x = p * (n - 1);
    int i = (int)x;
    return i + 1 < n ? v[i] + (x - i) * (v[i + 1] - v[i]) : v[n - 1];
}

void bench_report_pair(struct bench_ctx *b, const char *group, const char *op,
                       const struct bench_pair *p, const char *baseline_name,
                       const char *unit, int lower_is_better)
{
    double v[BENCH_MAX_TRIALS], w[BENCH_MAX_TRIALS], r[BENCH_MAX_TRIALS];
    int n = p->n, has_base = n > 0;
    for (int t = 0; t < n; t++) {
        v[t] = p->v[t];
        w[t] = p->base[t];
        has_base &= w[t] > 0.0;
    }
    for (int t = 0; t < n; t++)
        r[t] = has_base ? v[t] / w[t] : v[t];
    double mv = bench_median(v, n), mw = has_base ? bench_median(w, n) : 0.0;
    bench_median(r, n);                             /* sorts */
    report_row(b, group, op, mv, mw, baseline_name, unit, lower_is_better,
               n ? rank(r, n, 0.25) : 0, n ? rank(r, n, 0.75) : 0, n);
}

/* Opens a context on the backend asked for: 0 and its name, or the error (the reason is then
   kvvm_last_error()). */
static int probe_backend(int backend, const char **name)
{
    struct kvvm_config c;
    kvvm_config_init(&c);
    c.backend = (enum kvvm_backend)backend;
    c.max_seqs = 1;
    c.max_tokens = 16;
    kvvm *kv = NULL;
    int rc = kvvm_open(&c, &kv);
    if (rc)
        return rc;
    *name = !strcmp(kvvm_backend_name(kv), "cuda") ? "cuda" : "emulated";
    kvvm_close(kv);
    if (backend == KVVM_BACKEND_CUDA && strcmp(*name, "cuda"))
        return -ENODEV;
    return 0;
}

struct group {
    const char *name;
    int (*fn)(struct bench_ctx *b);
};

static void usage(FILE *f, const char *argv0)
{
    fprintf(f,
"usage: %s [options]\n"
"Measures libkvvm's layers beside raw baselines taken in the same run (median of trials).\n"
"\n"
"  --quick              fewer iterations (a smoke run of a few seconds)\n"
"  --trials N           trials per figure, median reported (1..200; default 5, --quick 3)\n"
"  --json FILE          also write the figures as a JSON array of records\n"
"                       {group, op, value, unit, baseline, baseline_value, ratio}\n"
"  --only G[,G...]      run only these groups: vmm, paging, swap, spill, checksum,\n"
"                       scale, calls, frames, prefix, store, view,\n"
"                       pool, handoff (need kvvmd beside kvvm-bench)\n"
"  --backend B          auto | cuda | emulated (default emulated)\n"
"  --granule SIZE       emulated device granule, 4K..2M (default 2M)\n"
"  --spill-dir DIR      directory for the spill file and the file store (default\n"
"                       /var/tmp)\n"
"  --help               this text\n"
"\n"
"ratio = value / baseline (the medians); a trailing '+' means at least as good as the\n"
"baseline, '-' worse. Each timed row alternates the library and its baseline within every\n"
"trial; spread = the 25th..75th percentile over trials of the per-trial ratio (of the\n"
"value where the row has no baseline); '-': a single count, not a timing.\n"
"A figure without a fair baseline (one doing the same work by other means) shows none.\n"
"Times are ns/op, us/op (per call), us/step or ms (wall); bandwidths MiB/s; memory MiB.\n",
            argv0);
}

int main(int argc, char **argv)
{
    struct group groups[] = {
        { "vmm", bench_vmm }, { "paging", bench_paging },
        { "swap", bench_swap }, { "spill", bench_spill }, { "checksum", bench_checksum },
        { "scale", bench_scale },
        { "calls", bench_calls },
        { "frames", bench_frames },
        { "prefix", bench_prefix },
        { "store", bench_store },
        { "view", bench_view },
        { "pool", bench_daemon },
        { "handoff", bench_handoff },
    };
    enum { N_GROUPS = sizeof groups / sizeof groups[0] };
    int selected[N_GROUPS];
    struct bench_ctx b = { .trials = 0, .spill_dir = "/var/tmp",
                           .backend = KVVM_BACKEND_EMULATED };
    const char *json_path = NULL, *only = NULL;
    static const struct option opts[] = {
        { "quick", no_argument, NULL, 'q' },
        { "trials", required_argument, NULL, 't' },
        { "json", required_argument, NULL, 'j' },
        { "only", required_argument, NULL, 'o' },
        { "spill-dir", required_argument, NULL, 's' },
        { "backend", required_argument, NULL, 'b' },
        { "granule", required_argument, NULL, 'g' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    int c, rc = 0;

    /* a group's helper process (spawn.c), not an option for users */
    if (argc >= 2 && !strcmp(argv[1], "--helper"))
        return bench_helper_main(argc, argv);
    /* the pool group's client to kill (bench_pool.c), not an option for users */
    if (argc == 4 && !strcmp(argv[1], "--pool-hold") && bench_daemon_hold)
        return bench_daemon_hold(argv[2], atoi(argv[3]));
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        char *end;
        switch (c) {
        case 'q':
            b.quick = 1;
            break;
        case 't': {
            long n = strtol(optarg, &end, 10);
            if (*end || n < 1 || n > BENCH_MAX_TRIALS) {
                fprintf(stderr, "kvvm-bench: --trials wants 1..%d, got '%s'\n",
                        BENCH_MAX_TRIALS, optarg);
                return 2;
            }
            b.trials = (int)n;
            break;
        }
        case 'j':
            json_path = optarg;
            break;
        case 'o':
            only = optarg;
            break;
        case 's':
            b.spill_dir = optarg;
            break;
        case 'b':
            if (!strcmp(optarg, "auto"))
                b.backend = KVVM_BACKEND_AUTO;
            else if (!strcmp(optarg, "cuda"))
                b.backend = KVVM_BACKEND_CUDA;
            else if (!strcmp(optarg, "emulated"))
                b.backend = KVVM_BACKEND_EMULATED;
            else {
                fprintf(stderr, "kvvm-bench: --backend wants auto|cuda|emulated, got '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case 'g': {
            size_t g;
            if (kvvm_testing_parse_size(optarg, &g) || g < 4096 || g > (2u << 20) ||
                (g & (g - 1))) {
                fprintf(stderr, "kvvm-bench: --granule wants a power of two in 4K..2M, "
                                "got '%s'\n", optarg);
                return 2;
            }
            b.granule = g;
            break;
        }
        case 'h':
            usage(stdout, argv[0]);
            return 0;
        default:
            usage(stderr, argv[0]);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kvvm-bench: unexpected argument '%s'\n", argv[optind]);
        usage(stderr, argv[0]);
        return 2;
    }
    if (!b.trials)
        b.trials = b.quick ? 3 : 5;

    for (int i = 0; i < N_GROUPS; i++)
        selected[i] = only == NULL;
    if (only) {
        char *list = strdup(only), *save = NULL;
        if (!list)
            return 1;
        for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            int found = 0;
            for (int i = 0; i < N_GROUPS; i++)
                if (!strcmp(t, groups[i].name))
                    selected[i] = found = 1;
            if (!found) {
                fprintf(stderr, "kvvm-bench: unknown group '%s' (vmm, paging, swap, spill, checksum, "
                        "scale, calls, frames, prefix, store, view, pool)\n",
                        t);
                free(list);
                return 2;
            }
        }
        free(list);
    }

    if (json_path) {
        b.json = fopen(json_path, "w");
        if (!b.json) {
            fprintf(stderr, "kvvm-bench: cannot write %s: %s\n", json_path, strerror(errno));
            return 1;
        }
        fputc('[', b.json);
    }

    /* --backend cuda means a GPU: without one, fail here instead of running the groups on
       the emulated device under a "cuda" banner; auto says what it resolved to */
    const char *resolved = "emulated";
    if (b.backend != KVVM_BACKEND_EMULATED) {
        rc = probe_backend(b.backend, &resolved);
        if (rc) {
            fprintf(stderr, "kvvm-bench: --backend %s: no usable CUDA device (%s); run on a "
                    "GPU machine, or use --backend emulated\n",
                    b.backend == KVVM_BACKEND_CUDA ? "cuda" : "auto", kvvm_last_error());
            if (b.json)
                fclose(b.json);
            return 1;
        }
    }
    printf("kvvm-bench %s: %d trials (median)%s, backend %s%s%s",
           kvvm_version(), b.trials, b.quick ? ", quick" : "",
           b.backend == KVVM_BACKEND_AUTO ? "auto -> " : "", resolved,
           strcmp(resolved, "emulated") ? " (group vmm; paging, swap and spill measure their "
           "layers on the emulated device)" : "");
    if (b.granule)
        printf(", granule %zu KiB", b.granule >> 10);
    printf("\n\n");
    print_header();
    for (int i = 0; i < N_GROUPS; i++) {
        if (!selected[i])
            continue;
        if (!groups[i].fn) {
            if (only)
                printf("%-8s (not built into this kvvm-bench; skipped)\n", groups[i].name);
            continue;
        }
        int r = groups[i].fn(&b);
        if (r < 0) {
            fprintf(stderr, "kvvm-bench: group %s failed: %s\n", groups[i].name, strerror(-r));
            rc = 1;
        }
    }

    if (b.json) {
        fputs(b.n_json ? "\n]\n" : "]\n", b.json);
        if (fclose(b.json)) {
            fprintf(stderr, "kvvm-bench: writing %s: %s\n", json_path, strerror(errno));
            rc = 1;
        }
    }
    return rc;
}
