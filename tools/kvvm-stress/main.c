/*
 * main.c: kvvm-stress options, model presets, workload sizing, opening the context and the
 * exit status. See docs/kvvm-stress.md for every option and every field of the report.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include "stress.h"

volatile sig_atomic_t stress_stop;

/* The first SIGINT/SIGTERM ends the run at the next step boundary (then the final drain,
   summary and reports, as at the end of --duration); a second one kills at once. */
static void on_signal(int sig)
{
    stress_stop = sig;
}

struct preset {
    const char *name;
    uint32_t layers, kv_heads, head_dim, dtype_bytes;
    size_t device_budget;
    struct dist prompt, output;
    uint32_t system_prompt;
};

#define MiB (1024ull * 1024)
#define GiB (1024ull * MiB)

/* Chat-like traffic: log-normal (long-tailed) prompts and outputs. */
static const struct preset presets[] = {
    { "tiny", 4, 4, 64, 2, 256 * MiB, { 200, 1.0, 8, 4096 }, { 100, 0.8, 4, 1024 }, 96 },
    { "llama3-8b", 32, 8, 128, 2, 1 * GiB, { 512, 1.0, 16, 8192 }, { 128, 0.8, 4, 2048 }, 256 },
    { "llama3-70b", 80, 8, 128, 2, 2 * GiB, { 512, 1.0, 16, 8192 }, { 128, 0.8, 4, 2048 }, 256 },
    /* tiny with long prompts and every other layer a 1024-token sliding window (--window) */
    { "tiny-sw", 4, 4, 64, 2, 256 * MiB, { 1500, 0.5, 256, 4096 }, { 400, 0.8, 16, 2048 }, 96 },
};

static void usage(FILE *f)
{
    fprintf(f,
"usage: kvvm-stress [options]\n"
"Simulates a continuous-batching inference engine over libkvvm with X times more live KV than\n"
"device memory, writes real bytes into every token and verifies them. Exit 0 = all verified.\n"
"\n"
"Model and layout:\n"
"  --preset NAME          tiny (default), llama3-8b, llama3-70b, tiny-sw (sliding window)\n"
"  --layers N --kv-heads N --head-dim N --dtype-bytes N   override the preset's shape\n"
"  --layout layer|token   per-layer K/V regions (default, 2*layers regions) or token-major\n"
"  --page-size SIZE       KV page size (default: 64K on the emulated device, else granule)\n"
"Memory and tiers:\n"
"  --backend auto|cuda|emulated   (default emulated)\n"
"  --oversubscribe X      live KV = X times the device budget, 0.1..1000 (default 4; at\n"
"                         X <= 1: host tier 1/4 of the device, no disk unless asked for)\n"
"  --device-budget SIZE   device bytes for KV pages (default per preset: 256M tiny)\n"
"  --host-budget SIZE     pinned host bytes (default: half the overflow, (X-1)/2 x device;\n"
"                         1/4 x device at X <= 1)\n"
"  --spill-dir DIR        spill file directory (default /var/tmp)\n"
"  --spill-budget SIZE    disk bytes (default 1.5 x the overflow)\n"
"  --no-disk              no disk tier (host budget then 1.25 x the overflow)\n"
"  --preempt swap|auto|recompute  how the scheduler preempts (default swap)\n"
"  --stream               run on an engine stream (kvvm_stream_create + kvvm_set_stream)\n"
"Workload:\n"
"  --seed N               exact reproducibility with --steps (default 1)\n"
"  --steps N              stop after N steps (default: none)\n"
"  --duration S           a bound of S > 0 seconds on the setup and the steps (default 60\n"
"                         unless --steps is given): past it no step or prefill starts; the\n"
"                         final verification of the live sequences follows (its time in\n"
"                         the summary); SIGINT/SIGTERM end any run early with the summary\n"
"                         and reports\n"
"  --prompt-len M[:S[:MIN:MAX]]   log-normal median, sigma, clip (tiny: 200:1.0:8:4096)\n"
"  --output-len M[:S[:MIN:MAX]]   (tiny: 100:0.8:4:1024)\n"
"  --system-prompt N      shared system prompt tokens, 0 = none (tiny: 96)\n"
"  --share P              share of requests that map it with kvvm_seq_share (0.5)\n"
"  --parallel P           share of requests forked into parallel samples (0.1)\n"
"  --max-parallel N       samples per parallel request, 2..N (4)\n"
"  --beam P               per step and grouped request: fork-and-truncate replacement (0.02)\n"
"  --max-batch N          running sequences at most (256)\n"
"  --quantum N            steps a request runs before rotation may take it off (32)\n"
"  --verify-every N       steps between sampled verifications, 0 = none (8)\n"
"  --max-seqs N --max-tokens N   context limits (default: derived from the workload)\n"
"Output:\n"
"  --json FILE            JSON report ('-' = stdout: then the summary goes to stderr)\n"
"  --trace FILE           CSV timeline of pages in use per tier (and FILE.svg plot)\n"
"  --plot FILE            SVG plot of the timeline (default: the trace's name + .svg)\n"
"  --quiet                no progress line (it is shown only on a terminal anyway)\n"
"  --verbose              library log at info level\n"
"  --metrics-port PORT    serve the library's Prometheus metrics (kvvm_metrics) on\n"
"                         http://127.0.0.1:PORT/metrics during the run (0: a free port;\n"
"                         the address is printed); loopback only\n"
"\n"
"Sliding-window layers and the prefix cache:\n"
"  --window N             window layers keep the last N tokens: the pages before it are\n"
"                         discarded (kvvm_seq_discard); 0 = none (tiny-sw: 1024)\n"
"  --window-every K       layers 0, K, 2K, ... are window layers (default 2)\n"
"  --prefix-cache P       finished prompts stay as CACHED entries; a share P of new requests\n"
"                         continue one (a hit shares it, a dropped one is a miss); 0 = off\n"
"  --cache-entries N      entries kept at most, oldest evicted (default 32)\n"
"  --prefix-cache keyed   the library's keyed prefix index instead: each request's prompt\n"
"                         starts with one of the shared system prompts; it attaches the cached\n"
"                         blocks (kvvm_prefix_attach), writes the rest, publishes its full\n"
"                         prompt blocks; the hit rate is reported, attached bytes verified\n"
"  --prefix-prompts N     with --prefix-cache keyed: N shared system prompts (1..64, default\n"
"                         4), of 1, 2, 3, 4, 1, ... blocks; more than the device keeps hot\n"
"                         sends entries below it (KVVM_FLAGS=cache_demote: to host, disk)\n"
"  --store URL            with --prefix-cache keyed: the shared store (file:///dir,\n"
"                         redis://[[user]:pw@]host[:port][/db] or redis-cluster://\n"
"                         [[user]:pw@]host:port[,host:port...]): full prompt blocks are\n"
"                         written through, attaches continue in the store; several stress\n"
"                         processes on one store share prompts (same --preset, token\n"
"                         layout and page size)\n"
"  --pool-view            open with KVVM_F_POOL_VIEW and verify every verified sequence's\n"
"                         block ids (kvvm_seq_block_table) and, where device memory is CPU-\n"
"                         readable (emulated, not emu_opaque), its bytes through the pool\n"
"                         view (else the byte check is reported skipped)\n"
"\n"
"Many processes on one pool (kvvmd):\n"
"  --pool N               start a kvvmd (the one beside kvvm-stress) whose pool is the device\n"
"                         budget, and N client processes (1..64), each this workload with its\n"
"                         own seed and a limit of 2/N of the pool (the limits add up to twice\n"
"                         the pool); the last one is killed (SIGKILL) half way; the others\n"
"                         verify every byte; reports per client and for the pool\n"
"  --pool-socket PATH     with --pool: join the kvvmd on PATH instead of starting one; alone:\n"
"                         this process is one client of that daemon\n"
"  --client-name NAME     the name kvvmctl shows for this client\n"
"\n"
"Elastic memory:\n"
"  --budget-schedule T:P[,T:P...]  at T seconds into the run (e.g. 10s), kvvm_set_budget to\n"
"                         P of the device budget at open (e.g. 50%% or 0.5; up to 16 changes,\n"
"                         T increasing); the summary and JSON show each change\n");
}

/* Size with an optional K/M/G/T suffix (binary), optional trailing "B"/"iB". */
static int parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0)
        return -EINVAL;
    double m = 1;
    switch (toupper((unsigned char)*end)) {
    case 'K': m = 1024.0; end++; break;
    case 'M': m = MiB; end++; break;
    case 'G': m = GiB; end++; break;
    case 'T': m = GiB * 1024.0; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'I')
        end++;
    if (*end == 'b' || *end == 'B')
        end++;
    if (*end)
        return -EINVAL;
    *out = (size_t)(v * m);
    return 0;
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end || *s == '-')
        return -EINVAL;
    *out = v;
    return 0;
}

static int parse_u32(const char *s, uint32_t *out)
{
    uint64_t v;
    if (parse_u64(s, &v) || v > UINT32_MAX)
        return -EINVAL;
    *out = (uint32_t)v;
    return 0;
}

static int parse_double(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v))
        return -EINVAL;
    *out = v;
    return 0;
}

static int parse_dist(const char *s, struct dist *d)
{
    char tmp[128];
    snprintf(tmp, sizeof tmp, "%s", s);
    char *parts[4] = { 0 };
    int n = 0;
    for (char *p = strtok(tmp, ":"); p && n < 4; p = strtok(NULL, ":"))
        parts[n++] = p;
    if (n == 0 || n == 3)
        return -EINVAL;
    struct dist v = *d;
    if (parse_double(parts[0], &v.median) || v.median < 1)
        return -EINVAL;
    if (n >= 2 && (parse_double(parts[1], &v.sigma) || v.sigma < 0))
        return -EINVAL;
    if (n == 4 && (parse_u64(parts[2], &v.min) || parse_u64(parts[3], &v.max) || !v.min ||
                   v.min > v.max))
        return -EINVAL;
    if (n < 4 && v.max < v.median)
        v.max = (uint64_t)ceil(v.median);
    *d = v;
    return 0;
}

static void extract_io_engine(struct results *r)
{
    const char *k = r->lib_json ? strstr(r->lib_json, "\"io_engine\"") : NULL;
    if (!k)
        return;
    k = strchr(k + 11, ':');
    if (!k)
        return;
    while (*++k == ' ')
        ;
    if (*k != '"')
        return;
    size_t i = 0;
    for (k++; *k && *k != '"' && i + 1 < sizeof r->io_engine; k++)
        r->io_engine[i++] = *k;
    r->io_engine[i] = 0;
}

/* --budget-schedule "10s:50%,20s:100%": times increasing, fractions in (0, 1]... of the
   budget at open (above 1 allowed: the device may hold more, the library refuses what it
   cannot have). -EINVAL malformed. */
static int parse_schedule(const char *arg, struct opts *o)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", arg);
    o->n_budget = 0;
    for (char *save, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *end;
        errno = 0;
        double t = strtod(tok, &end);
        if (errno || end == tok || t < 0)
            return -EINVAL;
        if (*end == 's')
            end++;
        if (*end++ != ':')
            return -EINVAL;
        char *pe;
        double f = strtod(end, &pe);
        if (pe == end)
            return -EINVAL;
        if (*pe == '%') {
            f /= 100;
            pe++;
        }
        if (*pe || f <= 0 || f > 64 || o->n_budget == MAX_BUDGET_EV ||
            (o->n_budget && t < o->budget_sched[o->n_budget - 1].t))
            return -EINVAL;
        o->budget_sched[o->n_budget++] = (struct budget_ev){ t, f };
    }
    return o->n_budget ? 0 : -EINVAL;
}

enum { O_PRESET = 256, O_LAYERS, O_HEADS, O_HDIM, O_DTYPE, O_LAYOUT, O_PAGE, O_BACKEND,
       O_OVER, O_DEV, O_HOST, O_SPILLDIR, O_SPILLB, O_NODISK, O_PREEMPT, O_STREAM, O_SEED,
       O_STEPS, O_DURATION, O_PROMPT, O_OUTPUT, O_SYS, O_SHARE, O_PAR, O_MAXPAR, O_BEAM,
       O_BATCH, O_QUANTUM, O_VERIFY, O_MAXSEQS, O_MAXTOK, O_JSON, O_TRACE, O_PLOT, O_QUIET,
       O_VERBOSE, O_HELP, O_BUDGET };
/* sliding-window layers and the prefix cache */
enum { O_WINDOW = 512, O_WINDOW_EVERY, O_PREFIX_CACHE, O_CACHE_ENTRIES, O_POOL_VIEW, O_STORE,
       O_PREFIX_PROMPTS, O_METRICS_PORT };
/* the pool (pool.c) */
enum { O_POOL = 768, O_POOL_SOCKET, O_CLIENT_NAME, O_POOL_CHILD, O_PROGRESS_FD };

static const struct option longopts[] = {
    { "preset", 1, 0, O_PRESET }, { "model", 1, 0, O_PRESET }, { "layers", 1, 0, O_LAYERS },
    { "kv-heads", 1, 0, O_HEADS }, { "head-dim", 1, 0, O_HDIM },
    { "dtype-bytes", 1, 0, O_DTYPE }, { "layout", 1, 0, O_LAYOUT },
    { "page-size", 1, 0, O_PAGE }, { "backend", 1, 0, O_BACKEND },
    { "oversubscribe", 1, 0, O_OVER }, { "device-budget", 1, 0, O_DEV },
    { "host-budget", 1, 0, O_HOST }, { "spill-dir", 1, 0, O_SPILLDIR },
    { "spill-budget", 1, 0, O_SPILLB }, { "no-disk", 0, 0, O_NODISK },
    { "preempt", 1, 0, O_PREEMPT }, { "stream", 0, 0, O_STREAM }, { "seed", 1, 0, O_SEED },
    { "steps", 1, 0, O_STEPS }, { "duration", 1, 0, O_DURATION },
    { "prompt-len", 1, 0, O_PROMPT }, { "output-len", 1, 0, O_OUTPUT },
    { "system-prompt", 1, 0, O_SYS }, { "share", 1, 0, O_SHARE }, { "parallel", 1, 0, O_PAR },
    { "max-parallel", 1, 0, O_MAXPAR }, { "beam", 1, 0, O_BEAM },
    { "max-batch", 1, 0, O_BATCH }, { "quantum", 1, 0, O_QUANTUM },
    { "verify-every", 1, 0, O_VERIFY }, { "max-seqs", 1, 0, O_MAXSEQS },
    { "max-tokens", 1, 0, O_MAXTOK }, { "json", 1, 0, O_JSON }, { "trace", 1, 0, O_TRACE },
    { "plot", 1, 0, O_PLOT }, { "quiet", 0, 0, O_QUIET }, { "verbose", 0, 0, O_VERBOSE },
    { "window", 1, 0, O_WINDOW }, { "window-every", 1, 0, O_WINDOW_EVERY },
    { "prefix-cache", 1, 0, O_PREFIX_CACHE }, { "cache-entries", 1, 0, O_CACHE_ENTRIES },
    { "pool-view", 0, 0, O_POOL_VIEW }, { "store", 1, 0, O_STORE },
    { "prefix-prompts", 1, 0, O_PREFIX_PROMPTS }, { "metrics-port", 1, 0, O_METRICS_PORT },
    { "help", 0, 0, O_HELP }, { "budget-schedule", 1, 0, O_BUDGET },
    { "pool", 1, 0, O_POOL }, { "pool-socket", 1, 0, O_POOL_SOCKET },
    { "client-name", 1, 0, O_CLIENT_NAME }, { "pool-child", 1, 0, O_POOL_CHILD },
    { "pool-progress-fd", 1, 0, O_PROGRESS_FD }, { 0, 0, 0, 0 }
};

/* What each option with a value accepts, for the message about a bad one. */
static const char *valid_values(int c)
{
    switch (c) {
    case O_PRESET: return "tiny, llama3-8b, llama3-70b or tiny-sw";
    case O_WINDOW: return "tokens from 0 (none) to 2^64-1";
    case O_WINDOW_EVERY: case O_CACHE_ENTRIES: return "an integer from 1 to 4294967295";
    case O_PREFIX_CACHE: return "a fraction from 0 to 1, or keyed";
    case O_PREFIX_PROMPTS: return "an integer from 1 to 64";
    case O_LAYERS: case O_HEADS: case O_HDIM: case O_DTYPE: case O_BATCH: case O_QUANTUM:
        return "an integer from 1 to 4294967295";
    case O_LAYOUT: return "layer (per-layer) or token (token-major)";
    case O_PAGE: return "a size that is a multiple of 4K, e.g. 64K or 2M";
    case O_BACKEND: return "auto, cuda or emulated";
    case O_OVER: return "a number from 0.1 to 1000";
    case O_DEV: return "a size > 0 with an optional K/M/G/T suffix, e.g. 256M";
    case O_HOST: case O_SPILLB: return "a size with an optional K/M/G/T suffix, e.g. 512M";
    case O_PREEMPT: return "swap, auto or recompute";
    case O_SEED: return "an integer from 0 to 2^64-1";
    case O_STEPS: return "an integer from 0 (no step limit) to 2^64-1";
    case O_DURATION: return "seconds > 0, e.g. 30 or 0.5";
    case O_PROMPT: case O_OUTPUT:
        return "MEDIAN[:SIGMA[:MIN:MAX]] with MEDIAN >= 1, SIGMA >= 0, 1 <= MIN <= MAX";
    case O_SYS: return "tokens from 0 (none) to 4294967295";
    case O_SHARE: case O_PAR: case O_BEAM: return "a fraction from 0 to 1";
    case O_MAXPAR: return "an integer from 2 to 64";
    case O_VERIFY: return "steps from 0 (no sampled verification) to 4294967295";
    case O_MAXSEQS: return "an integer from 8 to 4294967295";
    case O_MAXTOK: return "an integer >= 16";
    case O_METRICS_PORT: return "a TCP port from 0 (a free one) to 65535";
    case O_POOL: return "client processes from 1 to 64";
    case O_POOL_SOCKET: return "the path of a kvvmd's socket";
    case O_CLIENT_NAME: return "a name of 1 to 31 characters";
    case O_POOL_CHILD: case O_PROGRESS_FD: return "set by kvvm-stress --pool for its clients";
    }
    return "see --help";
}

static int bad_opt(const char *opt, int c, const char *val)
{
    fprintf(stderr, "kvvm-stress: bad value for --%s: '%s' (valid: %s)\n", opt, val,
            valid_values(c));
    return 2;
}
#define bad(name, val) bad_opt((name), c, (val))

/* An output file must be writable before the run starts, not after it: the file exists and
   is writable, or its directory exists and is. 0, or 2 with the reason printed. */
static int check_out_path(const char *opt, const char *path)
{
    struct stat st;
    if (!strcmp(path, "-") && !strcmp(opt, "json"))
        return 0;
    if (!*path) {
        fprintf(stderr, "kvvm-stress: --%s: empty file name\n", opt);
        return 2;
    }
    if (!stat(path, &st)) {
        if (S_ISDIR(st.st_mode)) {
            fprintf(stderr, "kvvm-stress: --%s %s: is a directory; give a file name\n", opt,
                    path);
            return 2;
        }
        if (access(path, W_OK)) {
            fprintf(stderr, "kvvm-stress: --%s %s: not writable: %s\n", opt, path,
                    strerror(errno));
            return 2;
        }
        return 0;
    }
    char dir[4096];
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) + (slash == path) : 1,
             slash ? path : ".");
    if (stat(dir, &st) || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "kvvm-stress: --%s %s: directory %s does not exist\n", opt, path,
                dir);
        return 2;
    }
    if (access(dir, W_OK | X_OK)) {
        fprintf(stderr, "kvvm-stress: --%s %s: cannot create a file in %s: %s\n", opt, path,
                dir, strerror(errno));
        return 2;
    }
    return 0;
}

/* The spill directory, in words, before kvvm_open would refuse it with an errno. */
static int check_spill_dir(const char *dir)
{
    struct stat st;
    if (stat(dir, &st)) {
        fprintf(stderr, "kvvm-stress: --spill-dir %s: %s; create it, give another directory "
                "on a local disk, or run without a disk tier (--no-disk)\n", dir,
                errno == ENOENT ? "no such directory" : strerror(errno));
        return 2;
    }
    if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "kvvm-stress: --spill-dir %s: not a directory (the spill file is "
                "created inside it)\n", dir);
        return 2;
    }
    if (access(dir, W_OK | X_OK)) {
        fprintf(stderr, "kvvm-stress: --spill-dir %s: this user cannot create files there "
                "(%s); give a writable directory or --no-disk\n", dir, strerror(errno));
        return 2;
    }
    return 0;
}

static size_t round_up(size_t v, size_t a) { return a ? (v + a - 1) / a * a : v; }

int main(int argc, char **argv)
{
    struct opts o = { 0 };
    const struct preset *ps = &presets[0];
    uint32_t layers = 0, heads = 0, hdim = 0, dtype = 0, sys = UINT32_MAX;
    struct dist prompt = { 0 }, output = { 0 };
    int have_prompt = 0, have_output = 0, have_duration = 0, no_disk = 0, have_spill_dir = 0;
    o.backend = KVVM_BACKEND_EMULATED;
    o.preempt = PREEMPT_SWAP;
    o.oversubscribe = 4.0;
    o.spill_dir = "/var/tmp";
    o.seed = 1;
    o.p_share = 0.5;
    o.p_parallel = 0.1;
    o.max_parallel = 4;
    o.p_beam = 0.02;
    o.max_batch = 256;
    o.quantum = 32;
    o.verify_every = 8;
    o.page_size_auto = 1;
    o.window_every = 2;
    o.cache_entries = 32;
    o.pk_prompts = 4;
    o.metrics_port = -1;
    o.pool_child = -1;
    o.progress_fd = -1;
    int have_window = 0, have_backend = 0;

    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        const char *name = NULL;
        for (const struct option *lo = longopts; lo->name; lo++)
            if (lo->val == c) {
                name = lo->name;
                break;
            }
        switch (c) {
        case O_PRESET:
            ps = NULL;
            for (size_t i = 0; i < sizeof presets / sizeof *presets; i++)
                if (!strcasecmp(optarg, presets[i].name))
                    ps = &presets[i];
            if (!ps)
                return bad(name, optarg);
            break;
        case O_LAYERS: if (parse_u32(optarg, &layers) || !layers) return bad(name, optarg); break;
        case O_HEADS: if (parse_u32(optarg, &heads) || !heads) return bad(name, optarg); break;
        case O_HDIM: if (parse_u32(optarg, &hdim) || !hdim) return bad(name, optarg); break;
        case O_DTYPE: if (parse_u32(optarg, &dtype) || !dtype) return bad(name, optarg); break;
        case O_LAYOUT:
            if (!strcmp(optarg, "token") || !strcmp(optarg, "token-major"))
                o.token_major = 1;
            else if (!strcmp(optarg, "layer") || !strcmp(optarg, "per-layer"))
                o.token_major = 0;
            else
                return bad(name, optarg);
            break;
        case O_PAGE:
            if (parse_size(optarg, &o.page_size))
                return bad(name, optarg);
            o.page_size_auto = 0;
            break;
        case O_BACKEND:
            have_backend = 1;
            if (!strcmp(optarg, "auto")) o.backend = KVVM_BACKEND_AUTO;
            else if (!strcmp(optarg, "cuda")) o.backend = KVVM_BACKEND_CUDA;
            else if (!strcmp(optarg, "emulated")) o.backend = KVVM_BACKEND_EMULATED;
            else return bad(name, optarg);
            break;
        case O_OVER:
            if (parse_double(optarg, &o.oversubscribe) || o.oversubscribe < 0.1 ||
                o.oversubscribe > 1000)
                return bad(name, optarg);
            break;
        case O_DEV:
            if (parse_size(optarg, &o.device_budget) || !o.device_budget)
                return bad(name, optarg);
            break;
        case O_HOST: if (parse_size(optarg, &o.host_budget)) return bad(name, optarg); break;
        case O_SPILLB: if (parse_size(optarg, &o.spill_budget)) return bad(name, optarg); break;
        case O_SPILLDIR: o.spill_dir = optarg; have_spill_dir = 1; break;
        case O_NODISK: no_disk = 1; break;
        case O_PREEMPT:
            if (!strcmp(optarg, "swap")) o.preempt = PREEMPT_SWAP;
            else if (!strcmp(optarg, "auto")) o.preempt = PREEMPT_AUTO;
            else if (!strcmp(optarg, "recompute")) o.preempt = PREEMPT_RECOMPUTE;
            else return bad(name, optarg);
            break;
        case O_STREAM: o.stream = 1; break;
        case O_SEED: if (parse_u64(optarg, &o.seed)) return bad(name, optarg); break;
        case O_STEPS: if (parse_u64(optarg, &o.steps)) return bad(name, optarg); break;
        case O_DURATION:
            if (parse_double(optarg, &o.duration_s) || o.duration_s <= 0)
                return bad(name, optarg);
            have_duration = 1;
            break;
        case O_PROMPT:
            prompt = ps ? ps->prompt : prompt;
            if (parse_dist(optarg, &prompt)) return bad(name, optarg);
            have_prompt = 1;
            break;
        case O_OUTPUT:
            output = ps ? ps->output : output;
            if (parse_dist(optarg, &output)) return bad(name, optarg);
            have_output = 1;
            break;
        case O_SYS: if (parse_u32(optarg, &sys)) return bad(name, optarg); break;
        case O_SHARE:
            if (parse_double(optarg, &o.p_share) || o.p_share < 0 || o.p_share > 1)
                return bad(name, optarg);
            break;
        case O_PAR:
            if (parse_double(optarg, &o.p_parallel) || o.p_parallel < 0 || o.p_parallel > 1)
                return bad(name, optarg);
            break;
        case O_MAXPAR:
            if (parse_u32(optarg, &o.max_parallel) || o.max_parallel < 2 || o.max_parallel > 64)
                return bad(name, optarg);
            break;
        case O_BEAM:
            if (parse_double(optarg, &o.p_beam) || o.p_beam < 0 || o.p_beam > 1)
                return bad(name, optarg);
            break;
        case O_BATCH:
            if (parse_u32(optarg, &o.max_batch) || !o.max_batch)
                return bad(name, optarg);
            break;
        case O_QUANTUM:
            if (parse_u32(optarg, &o.quantum) || !o.quantum)
                return bad(name, optarg);
            break;
        case O_VERIFY: if (parse_u32(optarg, &o.verify_every)) return bad(name, optarg); break;
        case O_MAXSEQS:
            if (parse_u32(optarg, &o.max_seqs) || o.max_seqs < 8)
                return bad(name, optarg);
            break;
        case O_MAXTOK:
            if (parse_u64(optarg, &o.max_tokens) || o.max_tokens < 16)
                return bad(name, optarg);
            break;
        case O_JSON: o.json_path = optarg; break;
        case O_TRACE: o.trace_path = optarg; break;
        case O_PLOT: o.plot_path = optarg; break;
        case O_QUIET: o.quiet = 1; break;
        case O_VERBOSE: o.verbose = 1; break;
        case O_WINDOW:
            if (parse_u64(optarg, &o.window))
                return bad(name, optarg);
            have_window = 1;
            break;
        case O_WINDOW_EVERY:
            if (parse_u32(optarg, &o.window_every) || !o.window_every)
                return bad(name, optarg);
            break;
        case O_PREFIX_CACHE:
            if (!strcmp(optarg, "keyed")) {
                o.prefix_keyed = 1;
                break;
            }
            if (parse_double(optarg, &o.prefix_cache) || o.prefix_cache < 0 ||
                o.prefix_cache > 1)
                return bad(name, optarg);
            break;
        case O_CACHE_ENTRIES:
            if (parse_u32(optarg, &o.cache_entries) || !o.cache_entries)
                return bad(name, optarg);
            break;
        case O_PREFIX_PROMPTS:
            if (parse_u32(optarg, &o.pk_prompts) || !o.pk_prompts ||
                o.pk_prompts > STRESS_PK_PROMPTS_MAX)
                return bad(name, optarg);
            break;
        case O_POOL_VIEW: o.pool_view = 1; break;
        case O_STORE: o.store_url = optarg; break;
        case O_METRICS_PORT: {
            uint32_t port;
            if (parse_u32(optarg, &port) || port > 65535)
                return bad(name, optarg);
            o.metrics_port = (int)port;
            break;
        }
        case O_HELP: case 'h': usage(stdout); return 0;
        case O_BUDGET: if (parse_schedule(optarg, &o)) return bad(name, optarg); break;
        case O_POOL:
            if (parse_u32(optarg, &o.pool_n) || !o.pool_n || o.pool_n > 64)
                return bad(name, optarg);
            break;
        case O_POOL_SOCKET:
            if (!*optarg)
                return bad(name, optarg);
            o.pool_socket = optarg;
            break;
        case O_CLIENT_NAME:
            if (!*optarg || strlen(optarg) > 31)
                return bad(name, optarg);
            o.client_name = optarg;
            break;
        case O_POOL_CHILD: {         /* a client of --pool: the engine, not a coordinator */
            uint32_t i;
            if (parse_u32(optarg, &i) || i >= 64)
                return bad(name, optarg);
            o.pool_child = (int)i;
            o.pool_n = 0;
            break;
        }
        case O_PROGRESS_FD: {
            uint32_t fd;
            if (parse_u32(optarg, &fd) || fd < 3 || fd > 65535 || fcntl((int)fd, F_GETFD) < 0)
                return bad(name, optarg);
            o.progress_fd = (int)fd;
            break;
        }
        default:
            fprintf(stderr, "kvvm-stress: see --help for every option and its values\n");
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kvvm-stress: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }

    /* ---- the model and the workload ---- */
    o.preset = ps->name;
    if (!have_window && !strcmp(ps->name, "tiny-sw"))
        o.window = 1024;
    o.layers = layers ? layers : ps->layers;
    o.kv_heads = heads ? heads : ps->kv_heads;
    o.head_dim = hdim ? hdim : ps->head_dim;
    o.dtype_bytes = dtype ? dtype : ps->dtype_bytes;
    if (layers || heads || hdim || dtype)
        o.preset = "custom";
    uint64_t per_layer = (uint64_t)o.kv_heads * o.head_dim * o.dtype_bytes;   /* K or V */
    if (o.token_major) {
        o.n_regions = 1;
        o.bytes_per_token = 2 * (uint64_t)o.layers * per_layer;
    } else {
        o.n_regions = 2 * o.layers;
        o.bytes_per_token = per_layer;
    }
    o.prompt = have_prompt ? prompt : ps->prompt;
    o.output = have_output ? output : ps->output;
    o.system_prompt = sys != UINT32_MAX ? sys : ps->system_prompt;
    if (!have_duration && !o.steps)
        o.duration_s = 60;

    /* Page size: the emulated device gets a 64 KiB granule unless told otherwise, so small
       models do not waste most of a 2 MiB page per region. */
    size_t granule = 64 * 1024;
    if (!o.page_size_auto) {
        granule = 2 * MiB;
        while (granule > 4096 && o.page_size % granule)
            granule /= 2;
        if (!o.page_size || o.page_size % 4096) {
            fprintf(stderr, "kvvm-stress: bad value for --page-size: %zu bytes (valid: %s)\n",
                    o.page_size, valid_values(O_PAGE));
            return 2;
        }
    }
    size_t page_est = o.page_size ? o.page_size :
                      (o.backend == KVVM_BACKEND_EMULATED ? granule : 2 * MiB);

    /* Tiers: live KV = X x device; the host holds half the overflow, the disk the rest. */
    if (!o.device_budget)
        o.device_budget = ps->device_budget;
    o.device_budget = round_up(o.device_budget, page_est);
    double X = o.oversubscribe;
    size_t overflow = X > 1 ? (size_t)((X - 1) * (double)o.device_budget) : 0;
    /* X <= 1: the live KV fits the device, so no disk tier unless one is asked for; a host
       tier of a quarter of the device takes the requests that rotation swaps out while
       others wait (X = 1 runs at the device's edge) */
    if (no_disk || (!overflow && !have_spill_dir && !o.spill_budget))
        o.spill_dir = NULL;
    if (!o.host_budget)
        o.host_budget = !overflow ? o.device_budget / 4
                                  : no_disk ? overflow + overflow / 4 : overflow / 2;
    o.host_budget = round_up(o.host_budget, page_est);
    if (o.spill_dir && !o.spill_budget)
        o.spill_budget = overflow + overflow / 2 > 64 * MiB ? overflow + overflow / 2 : 64 * MiB;
    o.spill_budget = o.spill_dir ? round_up(o.spill_budget, page_est) : 0;

    double mp = o.prompt.median * exp(o.prompt.sigma * o.prompt.sigma / 2);
    double mo = o.output.median * exp(o.output.sigma * o.output.sigma / 2);
    double mean_len = o.system_prompt * o.p_share + mp + mo / 2;
    double pages_req = o.n_regions * ceil(mean_len * o.bytes_per_token / page_est);
    double dev_pages = (double)o.device_budget / page_est;
    if (!o.max_tokens)
        o.max_tokens = o.system_prompt + o.prompt.max + o.output.max + 8;
    if (!o.max_seqs) {
        double live = X * dev_pages / (pages_req > 0 ? pages_req : 1);
        double n = 2 * live * (1 + o.p_parallel * o.max_parallel) + 16;
        o.max_seqs = n < 64 ? 64 : n > 4096 ? 4096 : (uint32_t)n;
    }
    if (o.prefix_keyed && o.window) {
        fprintf(stderr, "kvvm-stress: --prefix-cache keyed does not combine with --window "
                "(a published block must not be discarded)\n");
        return 2;
    }
    if (o.pk_prompts != 4 && !o.prefix_keyed) {
        fprintf(stderr, "kvvm-stress: --prefix-prompts needs --prefix-cache keyed\n");
        return 2;
    }
    if (o.store_url && !o.prefix_keyed) {
        fprintf(stderr, "kvvm-stress: --store needs --prefix-cache keyed (the store holds the "
                "keyed prefix cache's blocks)\n");
        return 2;
    }
    if (o.window && o.token_major) {
        fprintf(stderr, "kvvm-stress: --window needs the per-layer layout (--layout layer): "
                "a token-major region holds every layer\n");
        return 2;
    }
    if (o.prefix_cache > 0 && o.max_seqs + (uint64_t)o.cache_entries <= 65536)
        o.max_seqs += o.cache_entries;          /* the entries hold slots too */
    if (o.max_batch > o.max_seqs)
        o.max_batch = o.max_seqs;
    if (o.trace_path && !o.plot_path) {
        static char plot[4096];
        size_t l = strlen(o.trace_path);
        if (l > 4 && !strcmp(o.trace_path + l - 4, ".csv"))
            snprintf(plot, sizeof plot, "%.*s.svg", (int)(l - 4), o.trace_path);
        else
            snprintf(plot, sizeof plot, "%s.svg", o.trace_path);
        o.plot_path = plot;
    }

    int rc;
    if ((o.json_path && (rc = check_out_path("json", o.json_path))) ||
        (o.trace_path && (rc = check_out_path("trace", o.trace_path))) ||
        (o.plot_path && (rc = check_out_path("plot", o.plot_path))) ||
        (o.spill_dir && (rc = check_spill_dir(o.spill_dir))))
        return rc;
    if (o.pool_n) {
        if (o.trace_path || o.metrics_port >= 0) {
            fprintf(stderr, "kvvm-stress: --pool N: --%s is one process's; run one client "
                    "with --pool-socket PATH for it\n", o.trace_path ? "trace" : "metrics-port");
            return 2;
        }
        /* the pool is the device budget; each client's limit and workload derive from it */
        return stress_pool_main(&o, argc, argv, o.page_size_auto && o.backend ==
                                KVVM_BACKEND_EMULATED ? granule : o.page_size, granule);
    }
    /* --json -: stdout carries the JSON alone; the banner and the summary go to stderr */
    FILE *info = o.json_path && !strcmp(o.json_path, "-") ? stderr : stdout;

    kvvm_set_log(NULL, NULL, o.verbose ? KVVM_LOG_INFO : KVVM_LOG_WARN);

    struct kvvm_config cfg;
    kvvm_config_init(&cfg);
    cfg.backend = o.backend;
    cfg.n_regions = o.n_regions;
    cfg.bytes_per_token = o.bytes_per_token;
    cfg.max_seqs = o.max_seqs;
    cfg.max_tokens = o.max_tokens;
    cfg.page_size = o.page_size;
    cfg.device_budget = o.device_budget;
    cfg.host_budget = o.host_budget;
    cfg.spill_dir = o.spill_dir;
    cfg.spill_budget = o.spill_budget;
    cfg.emu_granule = granule;
    cfg.emu_device_bytes = 0;
    if (o.preempt == PREEMPT_AUTO)
        cfg.flags |= KVVM_F_AUTO_SWAP;
    if (o.pool_view)
        cfg.flags |= KVVM_F_POOL_VIEW;
    if (o.store_url)
        cfg.store_url = o.store_url;
    if (o.pool_socket) {        /* a pool client: the daemon's device, page size and shape */
        cfg.pool_socket = o.pool_socket;
        cfg.client_name = o.client_name;
        if (!have_backend)
            cfg.backend = KVVM_BACKEND_AUTO;
        if (o.page_size_auto)
            cfg.page_size = 0;
    }

    struct results r = { 0 };
    static const char *const lat_names[LAT_N] = { "grow", "grow_batch", "fork", "share",
        "truncate", "swap_out", "swap_in", "free", "write", "read", "step" };
    for (int i = 0; i < LAT_N; i++)
        lat_init(&r.lat[i], lat_names[i]);

    /* the library's threads (started by kvvm_open) block SIGINT/SIGTERM, so the signal
       reaches this thread, never a library thread's system call */
    sigset_t stop_sigs;
    sigemptyset(&stop_sigs);
    sigaddset(&stop_sigs, SIGINT);
    sigaddset(&stop_sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_sigs, NULL);
    kvvm *kv = NULL;
    int err = kvvm_open(&cfg, &kv);
    if (err && o.preempt == PREEMPT_AUTO && (err == -EOPNOTSUPP || err == -EINVAL)) {
        snprintf(r.fallback_reason, sizeof r.fallback_reason,
                 "kvvm_open refused KVVM_F_AUTO_SWAP (%s)", kvvm_strerror(err));
        fprintf(stderr, "kvvm-stress: --preempt auto unavailable: %s; preempting by recompute "
                "instead (no KV is held off the device)\n", r.fallback_reason);
        cfg.flags &= ~KVVM_F_AUTO_SWAP;
        err = kvvm_open(&cfg, &kv);
    }
    if (err) {
        fprintf(stderr, "kvvm-stress: kvvm_open failed (%d): %s\n", err,
                *kvvm_last_error() ? kvvm_last_error() : kvvm_strerror(err));
        return 2;
    }
    r.backend = kvvm_backend_name(kv);
    /* the pool view's bytes are read directly only where a window is process memory */
    o.pool_cpu = o.pool_view && !strcmp(r.backend, "emulated") && !cfg.emu_opaque;

    fprintf(info, "kvvm-stress: %s (%s layout, %u regions x %llu B/token), backend %s, device %.0f MiB, "
           "host %.0f MiB, disk %.0f MiB%s%s, x%.2f, preempt %s%s, seed %llu, %s%.0f%s\n",
           o.preset, o.token_major ? "token-major" : "per-layer", o.n_regions,
           (unsigned long long)o.bytes_per_token, r.backend, o.device_budget / (double)MiB,
           o.host_budget / (double)MiB, o.spill_budget / (double)MiB,
           o.spill_dir ? " in " : "", o.spill_dir ? o.spill_dir : "", o.oversubscribe,
           preempt_names[o.preempt], o.stream ? ", stream" : "", (unsigned long long)o.seed,
           o.steps ? "steps " : "duration ", o.steps ? (double)o.steps : o.duration_s,
           o.steps ? "" : " s");
    fflush(info);

    struct sigaction sa = { .sa_handler = on_signal, .sa_flags = SA_RESETHAND | SA_RESTART };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    struct tool_httpd *httpd = NULL;
    if (o.metrics_port >= 0 && stress_metrics_start(kv, o.metrics_port, info, &httpd)) {
        kvvm_close(kv);
        return 2;
    }
    pthread_sigmask(SIG_UNBLOCK, &stop_sigs, NULL);
    err = stress_run(&o, kv, &r);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    stress_metrics_stop(httpd, info);   /* before the context it reads goes */
    kvvm_close(kv);
    extract_io_engine(&r);

    /* a run interrupted (SIGINT/SIGTERM) is judged by what it verified: a signal in its first
       step, before any admission, leaves nothing decoded without any fault (CI under ASan) */
    if (!err && !r.aborted && r.steps && !r.tokens_decoded && !r.interrupted) {
        fprintf(stderr, "kvvm-stress: no token was decoded in %llu steps: the workload made no "
                "progress (device budget too small for the model, or every grow failed)\n",
                (unsigned long long)r.steps);
        record_error(&r, r.steps, "no progress (no token decoded)", -ENOMEM, 0);
    }
    int status = (err || r.mismatches || r.unexpected_errors || r.aborted) ? 1 : 0;
    report_summary(info, &o, &r, status);
    if (o.json_path && (err = report_json(o.json_path, &o, &r, status))) {
        fprintf(stderr, "kvvm-stress: cannot write %s: %s\n", o.json_path, strerror(-err));
        status = 1;
    }
    if (o.trace_path && (err = report_trace(o.trace_path, &r))) {
        fprintf(stderr, "kvvm-stress: cannot write %s: %s\n", o.trace_path, strerror(-err));
        status = 1;
    }
    if (o.plot_path && (err = report_svg(o.plot_path, &o, &r))) {
        fprintf(stderr, "kvvm-stress: cannot write %s: %s\n", o.plot_path, strerror(-err));
        status = 1;
    }
    for (int i = 0; i < LAT_N; i++)
        lat_free(&r.lat[i]);
    free(r.trace);
    free(r.lib_json);
    return status;
}
