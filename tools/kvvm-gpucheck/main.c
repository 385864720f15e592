/*
 * kvvm-gpucheck: what the real CUDA driver does where libkvvm depends on it, beside what the
 * emulated device does, in one table (docs/kvvm-gpucheck.md).
 *
 * Each probe runs in a child process of its own (this program re-executed with --child), on
 * the emulated device and, where one is present, on the GPU through libkvvm's own loader;
 * the parent never initializes CUDA. A row's verdict: ok (the driver did what the CUDA
 * documentation says and what the emulator does), DIFF (the driver and the emulator
 * differ: fix the emulator or write the difference down), UNEXPECTED (the driver did not do
 * what the documentation says), FAIL (a probe could not run, crashed or hung), info (a
 * figure, nothing to compare). Then the GPU suite: printed, or run with --all.
 *
 * Exit status: 0 no surprise; 1 a surprise (DIFF, UNEXPECTED, FAIL, an inconclusive probe,
 * a failed suite step); 2 bad usage; 77 (GC_EXIT_NO_GPU) no GPU present: no CUDA driver
 * library or no device. The emulator column was still run, and a failure there is 1.
 */
#include <errno.h>
#include <fnmatch.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpucheck.h"
#include "kvvm.h"

#define GC_EXIT_NO_GPU 77

/* Every row: the probe printing it and, for the real driver, the expected result (a
   pattern: '|' separates alternatives, fnmatch wildcards, a leading '!' negates; NULL =
   nothing documented). compare: the real driver must match the emulator. Sources of the
   expectations: docs/kvvm-gpucheck.md. */
static const struct rowdef {
    const char *id, *probe, *expect;
    bool compare;
} rowdefs[] = {
    { "loader.library", "loader", "ok", false },
    { "loader.driver_version", "loader", NULL, false },
    { "loader.entry_points", "loader", "all resolved", false },
    { "loader.newer_abi", "loader", NULL, false },
    { "loader.device", "loader", "ok", false },
    { "loader.vmm_supported", "loader", "1", false },
    { "loader.granularity", "loader", NULL, false },
    { "loader.max_reserve", "loader", NULL, false },
    { "vmm.map_onto_mapped", "vmm.map_onto_mapped", "!ok", true },
    { "vmm.map_overlapping", "vmm.map_overlapping", "!ok", true },
    { "vmm.partial_unmap", "vmm.partial_unmap", "!ok", true },
    { "vmm.unmap_spanning", "vmm.unmap_spanning", "ok", true },
    { "vmm.access_spanning", "vmm.access_spanning", "ok", true },
    { "vmm.alias", "vmm.alias", "ok", true },
    { "vmm.release_while_mapped", "vmm.release_while_mapped", "ok", true },
    { "vmm.map_offset", "vmm.map_offset", "!ok*", true },
    { "vmm.copy_unmapped", "vmm.copy_unmapped", "call:*|sync:*", true },
    { "vmm.copy_no_access", "vmm.copy_no_access", "call:*|sync:*", true },
    { "queued.map", "queued", NULL, true },
    { "queued.set_access", "queued", NULL, true },
    { "queued.unmap", "queued", NULL, true },
    { "queued.unmap_target", "queued.unmap_target", NULL, true },
    /* pageable memory: the driver's documented behaviour ("API synchronization behavior":
       device to pageable host returns once the copy has completed; pageable host memory is
       staged before the call returns), which libkvvm's stream mode relies on; the emulator
       is asynchronous for every host memory on purpose (stricter), so no comparison */
    { "pageable.dtoh", "pageable", "complete at return", false },
    { "pinned.dtoh", "pageable", "not complete at return", true },
    { "pageable.htod", "pageable", "staged at call", false },
    { "oom.budget_above_free", "oom.budget_above_free", "clamped create_at_open:ENOMEM", true },
    { "view.two_views", "view.two_views", "ok", true },
    { "share.export", "share", "ok", true },
    { "share.import_here", "share", "ok", true },
    { "share.second_process", "share", "ok", true },
    { "kernel.window_alias", "kernel.window_alias", "ok", false },
    { "capture.global_event", "capture.global_event", "*end:STREAM_CAPTURE_INVALIDATED",
      false },
    { "capture.relaxed_event", "capture.relaxed_event", "query:ok sync:ok end:ok", false },
    { "capture.global_ctxsync", "capture.global_ctxsync", "*end:STREAM_CAPTURE_INVALIDATED",
      false },
    { "capture.relaxed_ctxsync", "capture.relaxed_ctxsync", NULL, false },
    { "capture.libkvvm_reclaim", "capture.libkvvm_reclaim", "valid", false },
};
#define N_ROWS (sizeof rowdefs / sizeof rowdefs[0])

/* Differences from the emulator found on a GPU and written down in docs/kvvm-gpucheck.md
   ("Differences found"): the real driver's result that is then reported as "known". */
static const struct { const char *id, *cuda; } known_diffs[] = {
    { NULL, NULL },
};

struct cell {
    char result[160];
    char detail[1024];
};
static struct cell cells[2][N_ROWS];       /* [0] emulated, [1] cuda */

static int row_index(const char *id)
{
    for (size_t i = 0; i < N_ROWS; i++)
        if (!strcmp(rowdefs[i].id, id))
            return (int)i;
    return -1;
}

static bool match(const char *pat, const char *s)
{
    bool neg = *pat == '!';
    char buf[256];
    snprintf(buf, sizeof buf, "%s", pat + neg);
    bool hit = false;
    for (char *save = NULL, *alt = strtok_r(buf, "|", &save); alt && !hit;
         alt = strtok_r(NULL, "|", &save))
        hit = fnmatch(alt, s, 0) == 0;
    return hit != neg;
}

/* ---- the child side --------------------------------------------------------------------- */

static int child_main(const char *probe, const char *driver, const struct gc_opts *o)
{
    int emulated = !strcmp(driver, "emulated");
    if (!strcmp(probe, "loader"))
        return gc_probe_loader(emulated, o);
    if (!strcmp(probe, "share.peer"))          /* the second process of probe share */
        return gc_share_peer(emulated, o);
    for (size_t i = 0; i < gc_n_probes; i++) {
        if (strcmp(gc_probes[i].name, probe))
            continue;
        struct gc_dev d;
        char why[512];
        int err = gc_dev_open(&d, emulated, o, true, why, sizeof why);
        if (err) {
            gc_row(probe, "error: open", "%s", why);
            return 0;
        }
        gc_probes[i].run(&d);
        return 0;
    }
    fprintf(stderr, "kvvm-gpucheck: no probe '%s'\n", probe);
    return 2;
}

/* ---- the parent side -------------------------------------------------------------------- */

static char self[PATH_MAX];
static struct gc_opts opts = { .device = 0, .queue_ms = 1000, .capture_ms = 500 };
static int verbose, verbose_hint;

/* Runs one probe in a child; fills its rows into cells[col]. For the loader probe on cuda,
   *gpu gets "present" / "absent" / "unusable" and why the reason. */
static void run_probe(const char *probe, int col, char *gpu, char *why, size_t wlen)
{
    int fd[2];
    if (pipe(fd) != 0) {
        perror("kvvm-gpucheck: pipe");
        return;
    }
    char dev[16], qms[16], cms[16];
    snprintf(dev, sizeof dev, "%d", opts.device);
    snprintf(qms, sizeof qms, "%d", opts.queue_ms);
    snprintf(cms, sizeof cms, "%d", opts.capture_ms);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 1);
        dup2(fd[1], 2);
        close(fd[0]);
        close(fd[1]);
        /* A hung probe (a driver call that never returns) dies of SIGALRM. */
        alarm((unsigned)(60 + 4 * (opts.queue_ms + opts.capture_ms) / 1000));
        char *argv[] = { self, "--child", (char *)probe, "--driver",
                         col ? "cuda" : "emulated", "--device", dev, "--queue-ms", qms,
                         "--capture-ms", cms, NULL };
        execv(self, argv);
        _exit(127);
    }
    close(fd[1]);
    FILE *f = pid > 0 ? fdopen(fd[0], "r") : NULL;
    char line[2048];
    unsigned logs = 0;
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *save = NULL, *kind = strtok_r(line, "\t", &save);
        if (kind && !strcmp(kind, "ROW")) {
            char *id = strtok_r(NULL, "\t", &save), *res = strtok_r(NULL, "\t", &save);
            char *det = strtok_r(NULL, "", &save);
            int i = id ? row_index(id) : -1;
            for (size_t k = 0; k < N_ROWS && res; k++) {
                /* A row named after the probe itself ("error: open") stands for all its
                   rows not reported otherwise. */
                if (i >= 0 ? (int)k != i
                           : strcmp(rowdefs[k].probe, probe) || *cells[col][k].result)
                    continue;
                snprintf(cells[col][k].result, sizeof cells[col][k].result, "%s", res);
                snprintf(cells[col][k].detail, sizeof cells[col][k].detail, "%s",
                         det ? det : "");
            }
        } else if (kind && !strcmp(kind, "GPU") && gpu) {
            char *st = strtok_r(NULL, "\t", &save), *w = strtok_r(NULL, "", &save);
            snprintf(gpu, 16, "%s", st ? st : "?");
            snprintf(why, wlen, "%s", w ? w : "");
        } else {
            logs++;
            if (verbose)
                printf("  [%s/%s] %s\n", probe, col ? "cuda" : "emulated", kind ? kind : "");
        }
    }
    if (f)
        fclose(f);
    else
        close(fd[0]);
    int st = 0;
    while (pid > 0 && waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    char what[96] = "";
    if (pid < 0)
        snprintf(what, sizeof what, "FAIL: fork");
    else if (WIFSIGNALED(st))
        snprintf(what, sizeof what, WTERMSIG(st) == SIGALRM ? "hung (killed)" :
                 "crashed (signal %d)", WTERMSIG(st));
    else if (WEXITSTATUS(st))
        snprintf(what, sizeof what, "no result (exit %d)", WEXITSTATUS(st));
    for (size_t k = 0; k < N_ROWS; k++) {
        if (strcmp(rowdefs[k].probe, probe))
            continue;
        if (*cells[col][k].result) {
            /* Rows reported, then the process died or failed (a driver teardown after a
               sticky fault, a sanitizer report): said in the detail, the result stands. */
            if (*what) {
                size_t l = strlen(cells[col][k].detail);
                snprintf(cells[col][k].detail + l, sizeof cells[col][k].detail - l,
                         "; then the probe process: %s", what);
            }
            continue;
        }
        if (col && gpu && strcmp(gpu, "present"))
            continue;                       /* no GPU: the loader has no cuda rows */
        snprintf(cells[col][k].result, sizeof cells[col][k].result, "%s",
                 *what ? what : "no result");
    }
    if (logs && !verbose && verbose_hint++ == 0)
        printf("  (the probes logged lines: --verbose shows them)\n");
}

enum verdict { V_NONE, V_INFO, V_OK, V_KNOWN, V_DIFF, V_UNEXPECTED, V_INCONCL, V_FAIL };
static const char *vnames[] = { "-", "info", "ok", "known", "DIFF", "UNEXPECTED",
                                "INCONCLUSIVE", "FAIL" };

static bool failed(const char *r)
{
    return !*r || !strncmp(r, "error", 5) || !strncmp(r, "crashed", 7) ||
           !strncmp(r, "hung", 4) || !strncmp(r, "no result", 9) || !strncmp(r, "FAIL", 4);
}

/* A row of a probe that runs on the real driver only (no emulated column). */
static bool row_cuda_only(size_t i)
{
    for (size_t k = 0; k < gc_n_probes; k++)
        if (!strcmp(gc_probes[k].name, rowdefs[i].probe))
            return gc_probes[k].cuda_only;
    return false;
}

static enum verdict verdict(size_t i, bool gpu)
{
    const struct rowdef *rd = &rowdefs[i];
    const char *e = cells[0][i].result, *c = cells[1][i].result;
    bool cuda_only = row_cuda_only(i);
    if (!cuda_only && failed(e))
        return V_FAIL;
    if (!gpu)
        return V_NONE;
    if (failed(c))
        return V_FAIL;
    /* A compared row with either column inconclusive has nothing to compare: on a loaded or
       sanitized run the emulated queue can drain before its probe looks. */
    if (strstr(c, "inconclusive") || (rd->compare && !cuda_only && strstr(e, "inconclusive")))
        return V_INCONCL;
    if (rd->expect && !match(rd->expect, c))
        return V_UNEXPECTED;
    if (rd->compare && strcmp(e, c)) {
        for (size_t k = 0; known_diffs[k].id; k++)
            if (!strcmp(known_diffs[k].id, rd->id) && !strcmp(known_diffs[k].cuda, c))
                return V_KNOWN;
        return V_DIFF;
    }
    return rd->expect || rd->compare ? V_OK : V_INFO;
}

static int counts[8], surprises_rows;
static FILE *tsv;                          /* --tsv, written as the run goes */

static void print_header(void)
{
    printf("\n%-26s %-22s %-24s %-24s %s\n", "probe", "expected (cuda)", "emulated", "cuda",
           "verdict");
    printf("%.*s\n", 110, "------------------------------------------------------------"
           "------------------------------------------------------------");
    fflush(stdout);
}

/* Prints the rows of one probe, once both columns ran, and appends them to the TSV: a
   timeout or a crash of the tool later loses nothing already measured. */
static void emit_rows(const char *probe, bool gpu)
{
    for (size_t i = 0; i < N_ROWS; i++) {
        const struct rowdef *rd = &rowdefs[i];
        if (strcmp(rd->probe, probe))
            continue;
        enum verdict v = verdict(i, gpu);
        counts[v]++;
        surprises_rows += v >= V_DIFF;
        bool cuda_only = row_cuda_only(i);
        printf("%-26s %-22s %-24s %-24s %s\n", rd->id, rd->expect ? rd->expect : "(not documented)",
               cuda_only ? "n/a" : cells[0][i].result, gpu ? cells[1][i].result : "-",
               vnames[v]);
        if (*cells[0][i].detail && !cuda_only)
            printf("    emulated: %s\n", cells[0][i].detail);
        if (gpu && *cells[1][i].detail)
            printf("    cuda:     %s\n", cells[1][i].detail);
        if (tsv) {
            fprintf(tsv, "%s\t%s\t%s\t%s\t%s\n", rd->id, rd->expect ? rd->expect : "-",
                    cuda_only ? "n/a" : cells[0][i].result, gpu ? cells[1][i].result : "-",
                    vnames[v]);
            fflush(tsv);
        }
    }
    fflush(stdout);
}

static int print_summary(void)
{
    printf("\n%zu rows:", N_ROWS);
    for (int v = V_NONE; v <= V_FAIL; v++)
        if (counts[v])
            printf(" %d %s", counts[v], vnames[v]);
    printf("\n");
    return surprises_rows;
}

/* ---- the GPU suite ------------------------------------------------------------------------ */

struct step { const char *name; char cmd[PATH_MAX * 2]; int status; unsigned leaks; bool run; };
static struct step steps[4] = { { .name = "suite.ctest_gpu" }, { .name = "suite.bench_cuda" },
                                { .name = "suite.stress_cuda" },
                                { .name = "suite.stress_cuda_stream" } };

static void dir_of(const char *path, char *out, size_t len)
{
    snprintf(out, len, "%s", path);
    char *s = strrchr(out, '/');
    if (s)
        *s = 0;
}

static int suite(bool gpu, bool all, const char *build_dir, int stress_s)
{
    char bin[PATH_MAX], bdir[PATH_MAX + 8] = "", probe[PATH_MAX + 32];
    dir_of(self, bin, sizeof bin);
    if (build_dir)
        snprintf(bdir, sizeof bdir, "%s", build_dir);
    else {
        snprintf(probe, sizeof probe, "%s/../CTestTestfile.cmake", bin);
        if (access(probe, R_OK) == 0)
            snprintf(bdir, sizeof bdir, "%s/..", bin);
    }
    if (*bdir)
        snprintf(steps[0].cmd, sizeof steps[0].cmd,
                 "cd '%s' && ctest -L gpu --output-on-failure", bdir);
    snprintf(steps[1].cmd, sizeof steps[1].cmd, "'%s/kvvm-bench' --backend cuda --quick", bin);
    snprintf(steps[2].cmd, sizeof steps[2].cmd, "'%s/kvvm-stress' --backend cuda --duration %d",
             bin, stress_s);
    snprintf(steps[3].cmd, sizeof steps[3].cmd,
             "'%s/kvvm-stress' --backend cuda --duration %d --stream", bin, stress_s);
    printf("\nGPU suite%s:\n", all && gpu ? "" : all ? " (not run: no GPU present)"
                                                   : " (run these, or pass --all)");
    for (int i = 0; i < 4; i++)
        printf("  %s\n", *steps[i].cmd ? steps[i].cmd :
               "ctest -L gpu (no build tree found beside the tool: give --build-dir)");
    if (!all || !gpu)
        return 0;
    int surprises = 0;
    for (int i = 0; i < 4; i++) {
        if (!*steps[i].cmd)
            continue;
        printf("\n=== %s: %s\n", steps[i].name, steps[i].cmd);
        fflush(stdout);
        char cmd[sizeof steps[i].cmd + 8];
        snprintf(cmd, sizeof cmd, "%s 2>&1", steps[i].cmd);
        FILE *p = popen(cmd, "r");
        char line[4096];
        bool not_run = false;
        while (p && fgets(line, sizeof line, p)) {
            fputs(line, stdout);
            if (strcasestr(line, "leak"))
                steps[i].leaks++;
            /* ctest exits 0 when it finds no test or skips one: on a GPU both are failures */
            if (i == 0 && (strstr(line, "No tests were found") || strstr(line, "Skipped") ||
                           strstr(line, "Not Run")))
                not_run = true;
        }
        int st = p ? pclose(p) : -1;
        steps[i].status = st < 0 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (not_run && steps[i].status == 0) {
            printf("kvvm-gpucheck: ctest found no gpu test or skipped one: counted as a failure\n");
            steps[i].status = 1;
        }
        steps[i].run = true;
        if (tsv) {
            fprintf(tsv, "%s\texit 0, no leak line\t-\texit %d, %u leak lines\t%s\n",
                    steps[i].name, steps[i].status, steps[i].leaks,
                    steps[i].status || steps[i].leaks ? "FAIL" : "ok");
            fflush(tsv);
        }
    }
    printf("\n%-26s %-8s %-6s %s\n", "suite step", "exit", "leaks", "verdict");
    for (int i = 0; i < 4; i++) {
        if (!steps[i].run) {
            printf("%-26s %-8s %-6s %s\n", steps[i].name, "-", "-", "not run");
            continue;
        }
        bool bad = steps[i].status != 0 || steps[i].leaks;
        surprises += bad;
        printf("%-26s %-8d %-6u %s\n", steps[i].name, steps[i].status, steps[i].leaks,
               bad ? "FAIL" : "ok");
    }
    return surprises;
}

static const char *tsv_path;
static void usage(FILE *f)
{
    fprintf(f,
"usage: kvvm-gpucheck [options]\n"
"Probes the CUDA driver where libkvvm depends on it, beside the emulated device, and\n"
"prints one table (docs/kvvm-gpucheck.md). Needs a GPU for the cuda column; without one it\n"
"runs the emulated column, says that no GPU is present and exits 77.\n"
"  --all              also run the GPU suite (ctest -L gpu, kvvm-bench, kvvm-stress)\n"
"  --device N         CUDA device ordinal (default 0)\n"
"  --queue-ms N       queued copy work for the queued.* and pageable probes (default 1000)\n"
"  --capture-ms N     how long capture.libkvvm_reclaim keeps its capture open (default 500)\n"
"  --stress-s N       seconds of each kvvm-stress run with --all (default 30)\n"
"  --build-dir D      the build tree for ctest (default: the tool's ../ when it is one)\n"
"  --verbose          show the probes' log lines\n"
"  --detect           only say whether a GPU is present (the cuda loader probe): exit 0\n"
"                     present, 77 absent, 1 present but unusable\n"
"  --tsv FILE         also write the table to FILE as the run goes (tab-separated: id,\n"
"                     expected, emulated, cuda, verdict; then the suite steps)\n"
"exit: 0 as expected, 1 a surprise (DIFF, UNEXPECTED, FAIL, INCONCLUSIVE, a failed suite\n"
"step), 2 usage, 77 no GPU present (no CUDA driver library or no device)\n");
}

int main(int argc, char **argv)
{
    const char *child = NULL, *driver = "emulated", *build_dir = NULL;
    int all = 0, stress_s = 30, detect = 0;
    static const struct option lo[] = {
        { "all", no_argument, NULL, 'a' }, { "device", required_argument, NULL, 'd' },
        { "queue-ms", required_argument, NULL, 'q' },
        { "capture-ms", required_argument, NULL, 'c' },
        { "stress-s", required_argument, NULL, 's' },
        { "build-dir", required_argument, NULL, 'b' }, { "verbose", no_argument, NULL, 'v' },
        { "tsv", required_argument, NULL, 't' }, { "detect", no_argument, NULL, 'G' },
        { "child", required_argument, NULL, 'C' }, { "driver", required_argument, NULL, 'D' },
        { "help", no_argument, NULL, 'h' }, { 0, 0, 0, 0 },
    };
    int c;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'a': all = 1; break;
        case 'd': opts.device = atoi(optarg); break;
        case 'q': opts.queue_ms = atoi(optarg); break;
        case 'c': opts.capture_ms = atoi(optarg); break;
        case 's': stress_s = atoi(optarg); break;
        case 'b': build_dir = optarg; break;
        case 'v': verbose = 1; break;
        case 't': tsv_path = optarg; break;
        case 'G': detect = 1; break;
        case 'C': child = optarg; break;
        case 'D': driver = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc || opts.queue_ms < 1 || opts.capture_ms < 1 || stress_s < 1 ||
        opts.device < 0 || (strcmp(driver, "emulated") && strcmp(driver, "cuda"))) {
        usage(stderr);
        return 2;
    }
    if (child)
        return child_main(child, driver, &opts);

    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        perror("kvvm-gpucheck: /proc/self/exe");
        return 1;
    }
    self[n] = 0;
    double t0 = gc_now_ms();
    printf("kvvm-gpucheck %s: CUDA device %d, %d ms of queued copies, %d ms captures\n",
           kvvm_version(), opts.device, opts.queue_ms, opts.capture_ms);
    char gpu[16] = "?", why[512] = "";
    run_probe("loader", 1, gpu, why, sizeof why);
    if (!strcmp(gpu, "?"))
        snprintf(why, sizeof why, "the cuda loader probe reported nothing: %.100s",
                 cells[1][row_index("loader.library")].result);
    bool have_gpu = !strcmp(gpu, "present");
    if (!have_gpu)
        printf("%s: %s\n", !strcmp(gpu, "absent") ? "no GPU present (no CUDA driver library "
               "or no device)" : "CUDA driver present but unusable", why);
    if (detect) {               /* the loader alone: is there a GPU to check? */
        if (have_gpu)
            printf("GPU present: %s\n", cells[1][row_index("loader.device")].detail);
        return have_gpu ? 0 : !strcmp(gpu, "absent") ? GC_EXIT_NO_GPU : 1;
    }
    if (tsv_path) {
        if (!(tsv = fopen(tsv_path, "w")))
            fprintf(stderr, "kvvm-gpucheck: %s: %s\n", tsv_path, strerror(errno));
        else
            fprintf(tsv, "id\texpected\temulated\tcuda\tverdict\n");
    }
    run_probe("loader", 0, NULL, NULL, 0);
    print_header();
    emit_rows("loader", have_gpu);
    for (size_t i = 0; i < gc_n_probes; i++) {
        if (!gc_probes[i].cuda_only)
            run_probe(gc_probes[i].name, 0, NULL, NULL, 0);
        if (have_gpu)
            run_probe(gc_probes[i].name, 1, gpu, why, sizeof why);
        emit_rows(gc_probes[i].name, have_gpu);
    }
    int surprises = print_summary();
    surprises += suite(have_gpu, all, build_dir, stress_s);
    if (tsv)
        fclose(tsv);
    printf("\nkvvm-gpucheck: %.1f s, ", (gc_now_ms() - t0) / 1e3);
    if (!strcmp(gpu, "absent")) {
        printf("no GPU present (%s): the emulated column only%s; exit %d\n", why,
               surprises ? ", with failures" : "", surprises ? 1 : GC_EXIT_NO_GPU);
        return surprises ? 1 : GC_EXIT_NO_GPU;
    }
    if (!have_gpu) {
        printf("the CUDA driver is present but unusable (%s); exit 1\n", why);
        return 1;
    }
    printf("%d surprise%s; exit %d\n", surprises, surprises == 1 ? "" : "s", surprises ? 1 : 0);
    return surprises ? 1 : 0;
}
