/*
 * tests/test_metrics.c: kvvm_metrics (issue 37), the Prometheus text exposition.
 *   - snprintf's rule, but nothing written when the text does not fit: len 0 asks for the
 *     length, len == length writes nothing, len == length + 1 writes it all; bad arguments;
 *   - every struct kvvm_stats field has its series, and after real operations (swaps,
 *     direct reclaim, a file store's puts, gets and attaches) each series' value is the
 *     field's (kvvm_stats_json's), ns fields as exact seconds;
 *   - the format: # HELP and # TYPE once per family before its samples, names and labels
 *     by Prometheus's rules, counters _total, gauges not, tier labels from the five tiers;
 *   - the histograms: cumulative buckets, +Inf == _count, direct reclaim's count and sum
 *     equal to the stats' direct_reclaims and direct_reclaim_ns.
 * The series <-> field mapping is read from core_metrics_doc (the one table's rows), so the
 * test holds no copy of it.
 */
#include "harness.h"

#include <regex.h>
#include "core/core.h"

#define PS  KB
#define BPT 256u
#define T   16u                   /* tokens per block */
#define NR  2u

static char dir[64], url[96];

static void store_dir(void)
{
    snprintf(dir, sizeof dir, "/var/tmp/kvvm-metrics-XXXXXX");
    cr_assert(mkdtemp(dir));
    snprintf(url, sizeof url, "file://%s", dir);
}

static void store_rm(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        cr_log_warn("could not remove %s", dir);
}

/* A context of 8 device pages, 64 host pages, KVVM_F_AUTO_SWAP (direct reclaim), no pool
   thread (the figures stay still between two calls), a file store when url is set. */
static kvvm *open_ctx(int with_store)
{
    struct kvvm_config c;
    th_config(&c, PS, NR, BPT, 16, 8 * T, 8, 64, KVVM_F_AUTO_SWAP);
    c.pool_thread = 0;
    if (with_store) {
        c.store_url = url;
        c.store_timeout_ms = 5000;
    }
    return th_open(&c);
}

static char *metrics_text(kvvm *kv)
{
    int n = kvvm_metrics(kv, NULL, 0);
    cr_assert_gt(n, 0, "kvvm_metrics(len 0): %d (%s)", n, kvvm_last_error());
    char *b = malloc((size_t)n + 1);
    cr_assert(b);
    cr_assert_eq(kvvm_metrics(kv, b, (size_t)n + 1), n, "%s", kvvm_last_error());
    cr_assert_eq(strlen(b), (size_t)n);
    return b;
}

/* ---- the length rule and the arguments -------------------------------------------- */

TestSuite(metrics);

Test(metrics, length_rule_writes_all_or_nothing)
{
    TH_DEADLINE(60);
    kvvm *kv = open_ctx(0);
    int n = kvvm_metrics(kv, NULL, 0);
    cr_assert_gt(n, 100, "%d: %s", n, kvvm_last_error());
    cr_expect_str_empty(kvvm_last_error());
    char *b = malloc((size_t)n + 2);
    cr_assert(b);
    size_t lens[] = { 0, 1, (size_t)n / 2, (size_t)n };
    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
        memset(b, 'Z', (size_t)n + 2);
        cr_expect_eq(kvvm_metrics(kv, b, lens[i]), n, "len %zu", lens[i]);
        size_t j = 0;
        while (j < (size_t)n + 2 && b[j] == 'Z')
            j++;
        cr_expect_eq(j, (size_t)n + 2, "len %zu (<= the length %d): byte %zu was written",
                     lens[i], n, j);
    }
    memset(b, 'Z', (size_t)n + 2);
    cr_expect_eq(kvvm_metrics(kv, b, (size_t)n + 1), n);
    cr_expect_eq(b[n], 0, "no NUL at the length");
    cr_expect_eq(strlen(b), (size_t)n);
    cr_expect_eq(b[n + 1], 'Z', "a byte past the NUL was written");
    cr_expect(!strncmp(b, "# HELP kvvm_", 12), "%.40s", b);
    cr_expect_eq(b[n - 1], '\n', "the text ends a line");
    memset(b, 'Z', (size_t)n + 2);
    cr_expect_eq(kvvm_metrics(kv, b, (size_t)n + 2), n);   /* longer: the same */
    cr_expect_eq(strlen(b), (size_t)n);
    free(b);
    kvvm_close(kv);
}

Test(metrics, bad_arguments_are_refused_with_a_reason)
{
    TH_DEADLINE(60);
    char b[16];
    cr_expect_eq(kvvm_metrics(NULL, b, sizeof b), -EINVAL);
    cr_expect(strstr(kvvm_last_error(), "kv is NULL"), "%s", kvvm_last_error());
    cr_expect_eq(kvvm_metrics(NULL, NULL, 0), -EINVAL);
    kvvm *kv = open_ctx(0);
    cr_expect_eq(kvvm_metrics(kv, NULL, 10), -EINVAL);
    cr_expect(strstr(kvvm_last_error(), "kvvm_metrics") && strstr(kvvm_last_error(), "buf"),
              "%s", kvvm_last_error());
    cr_expect_gt(kvvm_metrics(kv, NULL, 0), 0);
    cr_expect_str_empty(kvvm_last_error());
    kvvm_close(kv);
}

/* ---- parsing ------------------------------------------------------------------------ */

#define MAXROWS 256
struct row { char series[160], field[48]; };   /* a doc row: series <- field ("" none) */
static struct row rows[MAXROWS];
static size_t n_rows;

/* core_metrics_doc's rows: | `series` | type | `field`... | meaning | */
static void doc_rows(void)
{
    size_t n = core_metrics_doc(NULL, 0);
    char *d = malloc(n + 1);
    cr_assert(d);
    cr_assert_eq(core_metrics_doc(d, n + 1), n);
    n_rows = 0;
    for (char *l = strtok(d, "\n"); l; l = strtok(NULL, "\n")) {
        char s[160] = "", f[48] = "";
        if (sscanf(l, "| `%159[^`]` | %*[a-z] | `%47[^`]`", s, f) < 1)
            continue;
        cr_assert_lt(n_rows, MAXROWS);
        snprintf(rows[n_rows].series, sizeof rows[n_rows].series, "%s", s);
        snprintf(rows[n_rows].field, sizeof rows[n_rows].field, "%s", f);
        n_rows++;
    }
    free(d);
}

/* The value of the sample named exactly `series` in text t (NULL: none). */
static const char *sample(const char *t, const char *series, char *val, size_t vlen)
{
    size_t sl = strlen(series);
    for (const char *l = t; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (!strncmp(l, series, sl) && l[sl] == ' ') {
            snprintf(val, vlen, "%.*s", (int)strcspn(l + sl + 1, "\n"), l + sl + 1);
            return val;
        }
    return NULL;
}

/* A number of kvvm_stats_json's "stats" object. */
static int json_stat(const char *json, const char *field, unsigned long long *v)
{
    char key[64];
    snprintf(key, sizeof key, "\"%s\":", field);
    const char *p = strstr(strstr(json, "\"stats\":{"), key);
    return p ? sscanf(p + strlen(key), "%llu", v) == 1 : 0;
}

/* "S.NNNNNNNNN" seconds or an integer, as nanoseconds (seconds) or itself. */
static unsigned long long value_of(const char *v, int seconds)
{
    unsigned long long s = 0, ns = 0;
    if (!seconds)
        return strtoull(v, NULL, 10);
    cr_assert_eq(sscanf(v, "%llu.%9llu", &s, &ns), 2, "not S.NNNNNNNNN: %s", v);
    cr_assert_eq(strlen(strchr(v, '.') + 1), 9, "not 9 decimals: %s", v);
    return s * 1000000000ull + ns;
}

static void keys_of(int32_t first, kvvm_key *k)
{
    int32_t tok[2 * T];
    for (size_t i = 0; i < 2 * T; i++)
        tok[i] = (int32_t)(first + (int32_t)i);
    cr_assert_eq(kvvm_prefix_keys(tok, 2 * T, T, NULL, 0, k, 2), 2);
}

/* Another context writes 2 blocks under keys k into the store (close waits for it). */
static void publisher(const kvvm_key *k)
{
    kvvm *kv = open_ctx(1);
    kvvm_seq s;
    uint8_t buf[2 * T * BPT];
    memset(buf, 0x5a, sizeof buf);
    cr_assert_eq(kvvm_seq_create(kv, &s), 0);
    cr_assert_eq(kvvm_seq_grow(kv, s, 2 * T), 0);
    for (uint32_t r = 0; r < NR; r++)
        cr_assert_eq(kvvm_seq_write(kv, s, r, 0, buf, sizeof buf), 0);
    cr_assert_eq(kvvm_prefix_publish(kv, s, 1, k, 2), 2, "%s", kvvm_last_error());
    kvvm_close(kv);
}

/* Operations that move every kind of figure: writes, explicit swaps, direct reclaim past
   the device budget, publishes into the store, lookups, a drop (the store's delete), an
   attach from the store (its gets; the blocks another context published). */
static void exercise(kvvm *kv)
{
    kvvm_key k[2], other[2];
    keys_of(77, k);
    keys_of(9000, other);
    publisher(other);
    kvvm_seq s[6];
    uint8_t buf[4 * T * BPT];
    memset(buf, 0x3c, sizeof buf);
    for (int i = 0; i < 6; i++) {
        cr_assert_eq(kvvm_seq_create(kv, &s[i]), 0);
        cr_assert_eq(kvvm_seq_grow(kv, s[i], 2 * T), 0, "grow %d: %s", i,
                     kvvm_last_error());   /* 6 x 2 x 2 pages > 8: direct reclaim */
        for (uint32_t r = 0; r < NR; r++)
            cr_assert_eq(kvvm_seq_write(kv, s[i], r, 0, buf, 2 * T * BPT), 0, "%s",
                         kvvm_last_error());
        cr_assert_eq(kvvm_step(kv), 0);   /* two steps end its protection: */
        cr_assert_eq(kvvm_step(kv), 0);   /* reclaim may take it */
    }
    cr_assert_eq(kvvm_seq_swap_in(kv, s[0]), 0, "%s", kvvm_last_error());
    cr_assert_eq(kvvm_seq_swap_out(kv, s[0]), 0, "%s", kvvm_last_error());
    cr_assert_eq(kvvm_seq_swap_in(kv, s[5]), 0, "%s", kvvm_last_error());
    cr_assert_eq(kvvm_prefix_publish(kv, s[5], 1, k, 2), 2, "%s", kvvm_last_error());
    cr_assert_eq(kvvm_sync(kv), 0);
    cr_assert_eq(kvvm_prefix_lookup(kv, 1, k, 2, NULL), 2, "%s", kvvm_last_error());
    kvvm_key none[2];
    keys_of(123456, none);
    cr_assert_eq(kvvm_prefix_lookup(kv, 1, none, 2, NULL), 0);   /* asks the store */
    cr_assert_eq(kvvm_prefix_drop(kv, 1, k, 2), 2, "%s", kvvm_last_error());
    kvvm_seq d;
    cr_assert_eq(kvvm_seq_create(kv, &d), 0);
    cr_assert_eq(kvvm_prefix_attach(kv, d, 1, other, 2), 2, "from the store: %s",
                 kvvm_last_error());
    cr_assert_eq(kvvm_sync(kv), 0);
}

/* ---- every field, its value --------------------------------------------------------- */

Test(metrics, every_stats_field_has_its_series_with_the_stats_value)
{
    TH_DEADLINE(120);
    store_dir();
    kvvm *kv = open_ctx(1);
    exercise(kv);
    doc_rows();
    char *t = metrics_text(kv);
    char json[8192];
    cr_assert_eq(kvvm_stats_json(kv, json, sizeof json), 0, "%s", kvvm_last_error());
    struct kvvm_stats st;
    th_stats(kv, &st);
    /* the operations moved what they should (else this test would compare zeros) */
    cr_expect_gt(st.direct_reclaims, 0);
    cr_expect_gt(st.swap_outs, 0);
    cr_expect_gt(st.store_puts, 0);
    cr_expect_gt(st.store_gets, 0);
    size_t fields = 0, nonzero = 0;
    for (size_t i = 0; i < n_rows; i++) {
        char v[64];
        if (!*rows[i].field)
            continue;                   /* a histogram: below */
        for (size_t j = 0; j < i; j++)
            cr_expect(strcmp(rows[j].field, rows[i].field), "%s twice", rows[i].field);
        fields++;
        unsigned long long want;
        cr_assert(json_stat(json, rows[i].field, &want), "%s is not a stats field",
                  rows[i].field);
        cr_expect(sample(t, rows[i].series, v, sizeof v), "no sample %s (%s)",
                  rows[i].series, rows[i].field);
        if (!sample(t, rows[i].series, v, sizeof v))
            continue;
        int secs = strstr(rows[i].series, "_seconds_total") != NULL;
        cr_expect_eq(value_of(v, secs), want, "%s = %s, kvvm_stats.%s = %llu",
                     rows[i].series, v, rows[i].field, want);
        nonzero += want != 0;
    }
    size_t n_fields = (sizeof st - offsetof(struct kvvm_stats, page_size)) / sizeof(uint64_t);
    cr_expect_eq(fields, n_fields, "%zu series for %zu fields of struct kvvm_stats", fields,
                 n_fields);
    cr_expect_geq(nonzero, 20, "only %zu figures moved", nonzero);
    free(t);
    kvvm_close(kv);
    store_rm();
}

/* ---- the format --------------------------------------------------------------------- */

static regex_t re_name, re_label, re_sample;

static void compile_res(void)
{
    cr_assert_eq(regcomp(&re_name, "^kvvm_[a-z0-9_]*[a-z0-9]$", REG_EXTENDED | REG_NOSUB), 0);
    cr_assert_eq(regcomp(&re_label, "^[a-zA-Z_][a-zA-Z0-9_]*=\"[^\"\\\\]*\"$",
                         REG_EXTENDED | REG_NOSUB), 0);
    /* name{labels} value, or name value */
    cr_assert_eq(regcomp(&re_sample, "^([a-zA-Z_:][a-zA-Z0-9_:]*)(\\{[^}]*\\})? "
                         "([0-9]+(\\.[0-9]+)?)$", REG_EXTENDED), 0);
}

static void check_labels(const char *series, const char *labels)
{
    char lb[256];
    snprintf(lb, sizeof lb, "%s", labels);
    for (char *sv, *l = strtok_r(lb, ",", &sv); l; l = strtok_r(NULL, ",", &sv)) {
        cr_expect_eq(regexec(&re_label, l, 0, NULL, 0), 0, "%s: label %s", series, l);
        cr_expect(strncmp(l, "__", 2), "%s: reserved label %s", series, l);
        if (!strncmp(l, "tier=", 5))
            cr_expect(!strcmp(l, "tier=\"device\"") || !strcmp(l, "tier=\"host\"") ||
                      !strcmp(l, "tier=\"disk\"") || !strcmp(l, "tier=\"store\"") ||
                      !strcmp(l, "tier=\"pool\""), "%s: %s", series, l);
    }
}

/* The family a sample belongs to (a histogram's _bucket/_sum/_count: its family). */
static int in_family(const char *name, const char *fam, const char *type)
{
    size_t fl = strlen(fam);
    if (!strcmp(type, "histogram"))
        return !strncmp(name, fam, fl) && (!strcmp(name + fl, "_bucket") ||
               !strcmp(name + fl, "_sum") || !strcmp(name + fl, "_count"));
    return !strcmp(name, fam);
}

Test(metrics, names_help_type_and_labels_follow_prometheus)
{
    TH_DEADLINE(60);
    compile_res();
    kvvm *kv = open_ctx(0);
    char *t = metrics_text(kv);
    char fam[128] = "", type[16] = "", help_of[128] = "";
    char seen[64][128];
    size_t n_fams = 0, n_samples = 0, tiers = 0;
    for (char *sv, *l = strtok_r(t, "\n", &sv); l; l = strtok_r(NULL, "\n", &sv)) {
        char a[128], b[64];
        if (!strncmp(l, "# HELP ", 7)) {
            cr_assert_eq(sscanf(l + 7, "%127s %63s", a, b), 2, "help text missing: %s", l);
            cr_expect_eq(regexec(&re_name, a, 0, NULL, 0), 0, "name %s", a);
            for (size_t i = 0; i < n_fams; i++)
                cr_expect(strcmp(seen[i], a), "family %s twice", a);
            cr_assert_lt(n_fams, 64);
            snprintf(seen[n_fams++], sizeof seen[0], "%s", a);
            snprintf(help_of, sizeof help_of, "%s", a);
            fam[0] = 0;
        } else if (!strncmp(l, "# TYPE ", 7)) {
            cr_assert_eq(sscanf(l + 7, "%127s %15s", fam, type), 2, "%s", l);
            cr_expect_str_eq(fam, help_of, "TYPE %s not right after its HELP", fam);
            size_t fl = strlen(fam);
            int total = fl > 6 && !strcmp(fam + fl - 6, "_total");
            if (!strcmp(type, "counter"))
                cr_expect(total, "counter %s does not end in _total", fam);
            else
                cr_expect(!total, "%s %s ends in _total", type, fam);
            cr_expect(!strcmp(type, "counter") || !strcmp(type, "gauge") ||
                      !strcmp(type, "histogram"), "type %s", type);
            if (strstr(fam, "bytes"))
                cr_expect(strstr(fam, "_bytes_total") || !strcmp(fam + fl - 6, "_bytes"),
                          "%s: bytes not the unit suffix", fam);
        } else {
            regmatch_t m[4];
            cr_assert_eq(regexec(&re_sample, l, 4, m, 0), 0, "not a sample line: %s", l);
            char name[128], labels[256] = "";
            snprintf(name, sizeof name, "%.*s", (int)(m[1].rm_eo - m[1].rm_so), l);
            if (m[2].rm_so >= 0)
                snprintf(labels, sizeof labels, "%.*s", (int)(m[2].rm_eo - m[2].rm_so - 2),
                         l + m[2].rm_so + 1);
            cr_expect(*fam && in_family(name, fam, type), "sample %s outside its family "
                      "(%s %s)", name, fam, type);
            check_labels(l, labels);
            tiers += strstr(labels, "tier=") != NULL;
            n_samples++;
        }
    }
    cr_expect_geq(n_fams, 30, "%zu families", n_fams);
    cr_expect_geq(n_samples, 51, "%zu samples", n_samples);
    cr_expect_geq(tiers, 10, "%zu samples with a tier label", tiers);
    regfree(&re_name);
    regfree(&re_label);
    regfree(&re_sample);
    free(t);
    kvvm_close(kv);
}

/* The buckets of histogram series `h` (name + labels before le, e.g. "x_bucket{op=\"put\","
   or "x_bucket{"): cumulative, le increasing, +Inf last and equal to _count. */
static unsigned long long check_hist(const char *t, const char *name, const char *labels,
                                     unsigned long long *sum_ns)
{
    char pre[256], v[64];
    snprintf(pre, sizeof pre, "%s_bucket{%s%sle=\"", name, labels, *labels ? "," : "");
    unsigned long long prev = 0, n_b = 0;
    double prev_le = 0;
    int inf = 0;
    for (const char *l = strstr(t, pre); l; l = strstr(l + 1, pre)) {
        const char *q = l + strlen(pre);
        double le = strncmp(q, "+Inf", 4) ? strtod(q, NULL) : 1e300;
        unsigned long long c = strtoull(strchr(q, ' ') + 1, NULL, 10);
        cr_expect_gt(le, prev_le, "%s: le not increasing at %.30s", name, q);
        cr_expect_geq(c, prev, "%s: not cumulative at %.30s", name, q);
        prev = c;
        prev_le = le;
        inf = !strncmp(q, "+Inf", 4);
        n_b++;
    }
    cr_expect(inf, "%s{%s}: +Inf is not the last bucket", name, labels);
    cr_expect_geq(n_b, 10, "%s: %llu buckets", name, n_b);
    char s[256];
    snprintf(s, sizeof s, "%s_count%s%s%s", name, *labels ? "{" : "", labels,
             *labels ? "}" : "");
    cr_assert(sample(t, s, v, sizeof v), "no %s", s);
    cr_expect_eq(strtoull(v, NULL, 10), prev, "%s %s != +Inf bucket %llu", s, v, prev);
    snprintf(s, sizeof s, "%s_sum%s%s%s", name, *labels ? "{" : "", labels,
             *labels ? "}" : "");
    cr_assert(sample(t, s, v, sizeof v), "no %s", s);
    *sum_ns = value_of(v, 1);
    return prev;
}

Test(metrics, histograms_count_what_the_stats_count)
{
    TH_DEADLINE(120);
    store_dir();
    kvvm *kv = open_ctx(1);
    exercise(kv);
    char *t = metrics_text(kv);
    struct kvvm_stats st;
    th_stats(kv, &st);
    unsigned long long sum, n;
    n = check_hist(t, "kvvm_direct_reclaim_duration_seconds", "", &sum);
    cr_expect_eq(n, st.direct_reclaims, "direct reclaims: histogram %llu, stats %llu", n,
                 (unsigned long long)st.direct_reclaims);
    cr_expect_eq(sum, st.direct_reclaim_ns, "direct reclaim time: %llu ns, stats %llu", sum,
                 (unsigned long long)st.direct_reclaim_ns);
    n = check_hist(t, "kvvm_prefix_attach_duration_seconds", "", &sum);
    cr_expect_eq(n, 1, "one attach: %llu", n);
    cr_expect_gt(sum, 0);
    static const char *const ops[] = { "op=\"put\"", "op=\"get\"", "op=\"lookup\"",
                                       "op=\"delete\"" };
    for (int i = 0; i < 4; i++) {
        n = check_hist(t, "kvvm_store_request_duration_seconds", ops[i], &sum);
        cr_expect_gt(n, 0, "no store request %s", ops[i]);   /* exercise made each kind */
    }
    free(t);
    kvvm_close(kv);
    store_rm();
}

/* The same context, unchanged between two calls, gives the same text (what len == length + 1
   relies on when a caller sized its buffer by a first call). */
Test(metrics, still_context_gives_the_same_text)
{
    TH_DEADLINE(60);
    kvvm *kv = open_ctx(0);
    char *a = metrics_text(kv), *b = metrics_text(kv);
    cr_expect_str_eq(a, b);
    free(a);
    free(b);
    kvvm_close(kv);
}
