/*
 * pool.c: kvvm-stress --pool N, the main job over the pool daemon (docs/kvvm-stress.md
 * "Many processes on one pool"). This process is the coordinator: it starts a kvvmd (the one
 * beside this program, as an installed or built tree has them) or joins the one on
 * --pool-socket, starts N client processes (this program again, each a pool client with its
 * own seed and a limit such that the limits add up to twice the pool), kills the last one with
 * SIGKILL once it has run half its steps (or half its duration), measures the time until the
 * daemon has its frames back, waits for the others (each verifies every byte it reads, as a
 * single run does) and reports per client and for the pool. It talks to the daemon only
 * through kvvmctl --json (the public tools), never through a private header.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "../common/json.h"
#include "stress.h"

#define POOL_MAX_CLIENTS 64
#define BACK_WAIT_NS (10ull * 1000000000ull)   /* frames back after the kill: at most */

struct client {
    pid_t pid;
    char name[32];
    char json[512], log[512];
    int progress;                   /* the victim's progress pipe (read end), else -1 */
    int status;                     /* waitpid's status */
    int done, killed;
    uint64_t peak_held;             /* bytes, as kvvmctl clients saw it */
    char *report;                   /* its JSON report, read at the end */
};

struct pool_run {
    const struct opts *o;
    char dir[256], sock[300], self_dir[4096];
    pid_t daemon;
    int started;                    /* 1: this process started the daemon */
    uint64_t pool_bytes, page_size, free_start, free_end, limit;
    /* frames the daemon's shared prefix entries hold (bytes; kvvmctl status shared_bytes):
       entries outlive the clients that published them, so "every frame back" counts them
       with the free ones. Set by each pool_status; _start after the first. */
    uint64_t shared_now, entries_now, shared_start;
    uint32_t clients_start, clients_end;
    int n;
    struct client c[POOL_MAX_CLIENTS];
    /* the victim */
    int victim;                     /* index, or -1 (one client: no kill) */
    uint64_t kill_step, killed_at_step, victim_held;
    double killed_at_s, back_ms;
    int back;                       /* 1: the daemon dropped it and has its frames */
    uint64_t free_before_kill, free_after_back;
    uint64_t peak_pool_held;
};

static volatile sig_atomic_t pool_stop;
static double mib(uint64_t b) { return (double)b / 1048576.0; }
static void pool_on_signal(int sig) { pool_stop = sig; }

/* Runs the sibling kvvmctl with args; its stdout in out (NUL-terminated). 0 on exit 0,
   else -1 (the reason in out when it said one). */
static int ctl(struct pool_run *p, const char *cmd, char *out, size_t cap)
{
    char bin[4200];
    snprintf(bin, sizeof bin, "%s/kvvmctl", p->self_dir);
    int fd[2];
    if (pipe2(fd, O_CLOEXEC))
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]);
        close(fd[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(fd[1], 1);
        dup2(fd[1], 2);
        execl(bin, "kvvmctl", "--socket", p->sock, "--json", cmd, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd[0], out + n, cap - 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0 || (n += (size_t)r) + 1 >= cap)
            break;
    }
    out[n] = 0;
    close(fd[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

/* The number after "key": in s (the first one from s), or def. */
static uint64_t num(const char *s, const char *key, uint64_t def)
{
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *q = s ? strstr(s, k) : NULL;
    if (!q)
        return def;
    q += strlen(k);
    while (*q == ' ')
        q++;
    return strtoull(q, NULL, 10);
}

static double dnum(const char *s, const char *key, double def)
{
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *q = s ? strstr(s, k) : NULL;
    return q ? strtod(q + strlen(k), NULL) : def;
}

/* The line of a client's report that starts with top-level key `top`, or NULL. */
static const char *top_line(const char *rep, const char *top)
{
    char k[64];
    snprintf(k, sizeof k, "\n  \"%s\": ", top);
    return rep ? strstr(rep, k) : NULL;
}

/* kvvmctl status: the pool's figures. 0 or -1. */
static int pool_status(struct pool_run *p, uint64_t *free_b, uint32_t *n_clients)
{
    char out[1024];
    if (ctl(p, "status", out, sizeof out))
        return -1;
    p->pool_bytes = num(out, "pool_bytes", 0);
    p->page_size = num(out, "page_size", 0);
    *free_b = num(out, "free_bytes", 0);
    p->shared_now = num(out, "shared_bytes", 0);
    p->entries_now = num(out, "shared_entries", 0);
    if (n_clients)
        *n_clients = (uint32_t)num(out, "n_clients", 0);
    return 0;
}

/* kvvmctl clients: each of ours' held bytes into its peak; whether `name` is listed. */
static int sample_clients(struct pool_run *p, const char *name, int *listed)
{
    char out[16384];
    if (ctl(p, "clients", out, sizeof out))
        return -1;
    *listed = 0;
    for (const char *q = strstr(out, "{\"name\":\""); q; q = strstr(q + 1, "{\"name\":\"")) {
        const char *nm = q + 9, *e = strchr(nm, '"');
        if (!e)
            break;
        uint64_t held = num(q, "held", 0);
        for (int i = 0; i < p->n; i++)
            if (strlen(p->c[i].name) == (size_t)(e - nm) && !memcmp(nm, p->c[i].name, e - nm) &&
                held > p->c[i].peak_held)
                p->c[i].peak_held = held;
        if (name && strlen(name) == (size_t)(e - nm) && !memcmp(nm, name, e - nm)) {
            *listed = 1;
            if (p->victim >= 0 && !strcmp(name, p->c[p->victim].name))
                p->victim_held = held;
        }
    }
    return 0;
}

/* Starts the sibling kvvmd on p->sock, shaped as a single run's device would be; waits for
   its ready line. 0, or -1 with the reason printed. */
static int start_daemon(struct pool_run *p, size_t pool, size_t page, size_t granule)
{
    char bin[4200], budget[32], ps[32], gran[32];
    snprintf(bin, sizeof bin, "%s/kvvmd", p->self_dir);
    if (access(bin, X_OK)) {
        fprintf(stderr, "kvvm-stress: --pool: no kvvmd beside kvvm-stress (%s: %s); build or "
                "install it, or join a running daemon with --pool-socket PATH\n", bin,
                strerror(errno));
        return -1;
    }
    snprintf(budget, sizeof budget, "%zu", pool);
    snprintf(ps, sizeof ps, "%zu", page);
    snprintf(gran, sizeof gran, "%zu", granule);
    const char *backend = p->o->backend == KVVM_BACKEND_EMULATED ? "emulated"
                        : p->o->backend == KVVM_BACKEND_CUDA ? "cuda" : "auto";
    const char *argv[16] = { bin, "--socket", p->sock, "--backend", backend, "--budget",
                             budget };
    int k = 7;
    if (page) {
        argv[k++] = "--page-size";
        argv[k++] = ps;
    }
    if (p->o->backend == KVVM_BACKEND_EMULATED) {
        argv[k++] = "--emu-granule";
        argv[k++] = gran;
        argv[k++] = "--emu-device-bytes";
        argv[k++] = budget;
    }
    argv[k] = NULL;
    char logp[300];
    snprintf(logp, sizeof logp, "%s/kvvmd.log", p->dir);
    int fd[2];
    if (pipe2(fd, O_CLOEXEC))
        return -1;
    p->daemon = fork();
    if (p->daemon < 0)
        return -1;
    if (p->daemon == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        int lf = open(logp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(fd[1], 1);
        if (lf >= 0)
            dup2(lf, 2);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    close(fd[1]);
    char line[512];
    size_t n = 0;
    while (n + 1 < sizeof line) {
        ssize_t r = read(fd[0], line + n, 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0 || line[n] == '\n')
            break;
        n++;
    }
    line[n] = 0;
    close(fd[0]);               /* it prints nothing more on stdout */
    char want[400];
    snprintf(want, sizeof want, "kvvmd: ready %s", p->sock);
    if (strcmp(line, want) != 0) {
        fprintf(stderr, "kvvm-stress: --pool: kvvmd did not start (it said '%s'); its log:\n",
                line);
        FILE *f = fopen(logp, "r");
        for (int ch; f && (ch = fgetc(f)) != EOF;)
            fputc(ch, stderr);
        if (f)
            fclose(f);
        return -1;
    }
    p->started = 1;
    return 0;
}

/* Starts client i: this program with the original arguments, then the client's own, which
   override them (getopt takes the last). */
static int start_client(struct pool_run *p, int i, int argc, char **argv)
{
    struct client *c = &p->c[i];
    char self[4200], idx[16], lim[32], seed[32], pfd[16];
    snprintf(self, sizeof self, "%s/kvvm-stress", p->self_dir);
    snprintf(c->name, sizeof c->name, "stress-%d", i);
    snprintf(c->json, sizeof c->json, "%s/client-%d.json", p->dir, i);
    snprintf(c->log, sizeof c->log, "%s/client-%d.log", p->dir, i);
    snprintf(idx, sizeof idx, "%d", i);
    snprintf(lim, sizeof lim, "%" PRIu64, p->limit);
    snprintf(seed, sizeof seed, "%" PRIu64, p->o->seed + (uint64_t)i);
    int pp[2] = { -1, -1 };
    c->progress = -1;
    if (i == p->victim && pipe2(pp, O_CLOEXEC))
        return -1;
    const char **av = calloc((size_t)argc + 24, sizeof *av);
    if (!av)
        return -1;
    int k = 0;
    av[k++] = self;
    for (int a = 1; a < argc; a++)
        av[k++] = argv[a];
    const char *extra[] = { "--pool-child", idx, "--pool-socket", p->sock, "--client-name",
                            c->name, "--device-budget", lim, "--seed", seed, "--json",
                            c->json, "--quiet" };
    for (size_t e = 0; e < sizeof extra / sizeof *extra; e++)
        av[k++] = extra[e];
    c->pid = fork();
    if (c->pid < 0) {
        free(av);
        return -1;
    }
    if (c->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);   /* the coordinator's death ends the run */
        int lf = open(c->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (lf >= 0) {
            dup2(lf, 1);
            dup2(lf, 2);
        }
        if (pp[1] >= 0) {
            int w = dup(pp[1]);             /* without O_CLOEXEC: it survives the exec */
            snprintf(pfd, sizeof pfd, "%d", w);
            av[k++] = "--pool-progress-fd";
            av[k++] = pfd;
        }
        av[k] = NULL;
        execv(self, (char *const *)av);
        _exit(127);
    }
    free(av);
    if (pp[1] >= 0) {
        close(pp[1]);
        c->progress = pp[0];
    }
    return 0;
}

/* The victim's progress: kills it (SIGKILL) at its kill point, then waits for the daemon to
   drop it (kvvmctl no longer lists it: its frames are back). 1 when the kill is done (or
   the victim ended before it), 0 not yet. */
static int victim_tick(struct pool_run *p, int timeout_ms)
{
    struct client *c = &p->c[p->victim];
    struct pollfd pf = { .fd = c->progress, .events = POLLIN };
    if (poll(&pf, 1, timeout_ms) <= 0)
        return 0;
    char buf[256];
    ssize_t r = read(c->progress, buf, sizeof buf - 1);
    if (r <= 0) {                   /* it ended (or failed) before its kill point */
        close(c->progress);
        c->progress = -1;
        return 1;
    }
    buf[r] = 0;
    /* lines "STEP SECONDS": the last complete one counts */
    char *last = NULL;
    for (char *s = buf, *nl; (nl = strchr(s, '\n')); s = nl + 1)
        last = s;
    if (!last)
        return 0;
    uint64_t step = strtoull(last, &last, 10);
    double t = strtod(last, NULL);
    int due = p->o->steps ? step >= p->kill_step : t >= p->o->duration_s / 2;
    if (!due)
        return 0;
    uint32_t n_cl;
    pool_status(p, &p->free_before_kill, &n_cl);
    int listed;
    sample_clients(p, c->name, &listed);
    uint64_t t0 = now_ns();
    kill(c->pid, SIGKILL);
    c->killed = 1;
    p->killed_at_step = step;
    p->killed_at_s = t;
    close(c->progress);
    c->progress = -1;
    /* waiting for the condition (kvvmctl no longer lists it), bounded */
    while (now_ns() - t0 < BACK_WAIT_NS) {
        if (sample_clients(p, c->name, &listed) == 0 && !listed) {
            p->back_ms = (double)(now_ns() - t0) / 1e6;
            p->back = 1;
            pool_status(p, &p->free_after_back, &n_cl);
            break;
        }
    }
    return 1;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    for (size_t r; b && (r = fread(b + n, 1, cap - n - 1, f)) > 0;) {
        n += r;
        if (n + 1 == cap) {
            char *nb = realloc(b, cap *= 2);
            if (!nb) {
                free(b);
                b = NULL;
                break;
            }
            b = nb;
        }
    }
    fclose(f);
    if (b)
        b[n] = 0;
    return b;
}

static void print_tail(const char *path)
{
    char *t = slurp(path);
    if (!t)
        return;
    size_t n = strlen(t);
    fprintf(stderr, "---- %s (last lines) ----\n%s", path, n > 3000 ? t + n - 3000 : t);
    free(t);
}

/* One client's part of the summary; 0 when it passed (the victim: killed as planned). */
static int client_summary(FILE *f, struct pool_run *p, int i)
{
    struct client *c = &p->c[i];
    if (c->killed) {
        fprintf(f, "  %-10s pid %-7d killed (SIGKILL) at step %" PRIu64 " (%.1f s), holding "
                "%.1f MiB: %s\n", c->name, (int)c->pid, p->killed_at_step, p->killed_at_s,
                mib(p->victim_held), "see the pool's line");
        return !(WIFSIGNALED(c->status) && WTERMSIG(c->status) == SIGKILL);
    }
    int code = WIFEXITED(c->status) ? WEXITSTATUS(c->status) : 128 + WTERMSIG(c->status);
    const char *run = top_line(c->report, "run"), *ver = top_line(c->report, "verification");
    const char *err = top_line(c->report, "errors"), *pl = top_line(c->report, "pool");
    fprintf(f, "  %-10s pid %-7d exit %d: %" PRIu64 " steps, %" PRIu64 " tokens decoded, "
            "%" PRIu64 " sequences verified (%.1f MiB), %" PRIu64 " mismatches, %" PRIu64
            " unexpected errors; %" PRIu64 " frames leased, %" PRIu64 " given back, %" PRIu64
            " waits (%.1f ms), peak held %.1f MiB\n", c->name, (int)c->pid, code,
            num(run, "steps", 0), num(run, "tokens_decoded", 0),
            num(ver, "sequences_verified", 0), mib(num(ver, "bytes_verified", 0)),
            num(ver, "mismatches", 0), num(err, "unexpected", 0), num(pl, "leases", 0),
            num(pl, "returns", 0), num(pl, "waits", 0), dnum(pl, "wait_ms", 0),
            mib(c->peak_held));
    const char *pk = top_line(c->report, "prefix_keyed");
    if (p->o->prefix_keyed && pk)       /* the prompts shared through the daemon's index */
        fprintf(f, "  %-10s prefix keys: %" PRIu64 " of %" PRIu64 " blocks asked attached (hit "
                "rate %.1f%%), %" PRIu64 " found in the pool's shared index, %" PRIu64
                " attached from it without a copy, %.1f MiB copied by the attaches; %" PRIu64
                " entries published\n", "", num(pk, "blocks_attached", 0),
                num(pk, "blocks_asked", 0), 100.0 * dnum(pk, "hit_rate", 0),
                num(pk, "from_pool", 0), num(pk, "pool_hit_blocks", 0),
                mib(num(pk, "attach_copied_bytes", 0)), num(pk, "published", 0));
    if (p->victim == i)
        fprintf(f, "  %-10s (the victim ended before its kill point: it was not killed)\n", "");
    return code != 0 || !c->report || num(ver, "mismatches", 1) || num(err, "unexpected", 1) ||
           !num(ver, "sequences_verified", 0) || p->victim == i;
}

/* Every frame the clients leased is back: free, or held by a shared prefix entry made during
   the run (the daemon keeps those after their publishers exit, by design). */
static int frames_back(const struct pool_run *p)
{
    return p->free_end + p->shared_now == p->free_start + p->shared_start;
}

static int pool_json(const char *path, struct pool_run *p, int status)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "w") : stdout;
    if (!f)
        return -errno;
    fprintf(f, "{\n  \"tool\": \"kvvm-stress\",\n  \"mode\": \"pool\",\n  \"library_version\": ");
    tool_json_string(f, kvvm_version());
    fprintf(f, ",\n  \"pool\": {\"socket\": ");
    tool_json_string(f, p->sock);
    fprintf(f, ", \"daemon_started\": %s, \"pool_bytes\": %" PRIu64 ", \"page_size\": %" PRIu64
            ", \"clients\": %d, \"limit_bytes\": %" PRIu64 ", \"limits_over_pool\": %.3f, "
            "\"free_bytes_start\": %" PRIu64 ", \"free_bytes_end\": %" PRIu64 ", "
            "\"clients_start\": %u, \"clients_end\": %u, \"all_frames_back\": %s, "
            "\"peak_held_bytes\": %" PRIu64 ", \"shared_entries_end\": %" PRIu64 ", "
            "\"shared_bytes_start\": %" PRIu64 ", \"shared_bytes_end\": %" PRIu64 "},\n",
            p->started ? "true" : "false", p->pool_bytes, p->page_size, p->n, p->limit,
            p->pool_bytes ? (double)p->limit * p->n / (double)p->pool_bytes : 0,
            p->free_start, p->free_end, p->clients_start, p->clients_end,
            frames_back(p) ? "true" : "false", p->peak_pool_held, p->entries_now,
            p->shared_start, p->shared_now);
    fprintf(f, "  \"kill\": ");
    if (p->victim < 0 || !p->c[p->victim].killed) {
        fprintf(f, "null,\n");
    } else {
        fprintf(f, "{\"client\": %d, \"name\": \"%s\", \"pid\": %d, \"at_step\": %" PRIu64
                ", \"at_s\": %.3f, \"held_bytes\": %" PRIu64 ", \"frames_back\": %s, "
                "\"back_ms\": ", p->victim, p->c[p->victim].name, (int)p->c[p->victim].pid,
                p->killed_at_step, p->killed_at_s, p->victim_held, p->back ? "true" : "false");
        if (p->back)
            fprintf(f, "%.3f", p->back_ms);
        else
            fprintf(f, "null");
        fprintf(f, ", \"free_bytes_before\": %" PRIu64 ", \"free_bytes_after\": %" PRIu64 "},\n",
                p->free_before_kill, p->free_after_back);
    }
    fprintf(f, "  \"clients\": [\n");
    for (int i = 0; i < p->n; i++) {
        struct client *c = &p->c[i];
        fprintf(f, "    {\"index\": %d, \"name\": \"%s\", \"pid\": %d, \"killed\": %s, "
                "\"exit\": %d, \"peak_held_bytes\": %" PRIu64 ", \"report\": ", i, c->name,
                (int)c->pid, c->killed ? "true" : "false",
                WIFEXITED(c->status) ? WEXITSTATUS(c->status) : 128 + WTERMSIG(c->status),
                c->peak_held);
        if (c->report && !c->killed) {
            size_t n = strlen(c->report);
            while (n && (c->report[n - 1] == '\n' || c->report[n - 1] == ' '))
                n--;
            fwrite(c->report, 1, n, f);
        } else {
            fprintf(f, "null");
        }
        fprintf(f, "}%s\n", i + 1 < p->n ? "," : "");
    }
    fprintf(f, "  ],\n  \"exit_status\": %d\n}\n", status);
    int err = ferror(f) ? -EIO : 0;
    if (f != stdout && fclose(f))
        err = -errno;
    return err;
}

/* Waits for every client; samples the pool meanwhile and runs the victim's kill. */
static void wait_clients(struct pool_run *p)
{
    int left = p->n, kill_done = p->victim < 0;
    uint64_t last_sample = 0;
    while (left) {
        if (pool_stop) {
            for (int i = 0; i < p->n; i++)
                if (!p->c[i].done)
                    kill(p->c[i].pid, SIGTERM);   /* each drains and reports */
            pool_stop = 0;
        }
        if (!kill_done)
            kill_done = victim_tick(p, 50);
        else
            usleep(20000);
        for (int i = 0; i < p->n; i++) {
            if (p->c[i].done)
                continue;
            if (waitpid(p->c[i].pid, &p->c[i].status, WNOHANG) == p->c[i].pid) {
                p->c[i].done = 1;
                left--;
            }
        }
        if (now_ns() - last_sample > 200000000ull) {    /* figures, not a condition */
            last_sample = now_ns();
            int listed;
            uint64_t fb;
            sample_clients(p, NULL, &listed);
            if (!pool_status(p, &fb, NULL) && p->pool_bytes - fb > p->peak_pool_held)
                p->peak_pool_held = p->pool_bytes - fb;
        }
    }
}

int stress_pool_main(const struct opts *o, int argc, char **argv, size_t page, size_t granule)
{
    FILE *info = o->json_path && !strcmp(o->json_path, "-") ? stderr : stdout;
    struct pool_run *p = calloc(1, sizeof *p);
    if (!p)
        return 2;
    p->o = o;
    p->n = (int)o->pool_n;
    p->victim = p->n >= 2 ? p->n - 1 : -1;
    p->kill_step = o->steps / 2;
    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) {
        perror("kvvm-stress: /proc/self/exe");
        free(p);
        return 2;
    }
    self[sl] = 0;
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = 0;
    snprintf(p->self_dir, sizeof p->self_dir, "%s", self);
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp)
        tmp = "/tmp";
    snprintf(p->dir, sizeof p->dir, "%s/kvvm-stress-pool.XXXXXX", tmp);
    if (strlen(p->dir) > 80 || !mkdtemp(p->dir)) {
        snprintf(p->dir, sizeof p->dir, "/tmp/kvvm-stress-pool.XXXXXX");
        if (!mkdtemp(p->dir)) {
            perror("kvvm-stress: --pool: mkdtemp");
            free(p);
            return 2;
        }
    }
    int status = 2;
    if (o->pool_socket) {
        snprintf(p->sock, sizeof p->sock, "%s", o->pool_socket);
    } else {
        snprintf(p->sock, sizeof p->sock, "%s/kvvmd.sock", p->dir);
        if (start_daemon(p, o->device_budget, page, granule))
            goto out;
    }
    int st0 = pool_status(p, &p->free_start, &p->clients_start);
    p->shared_start = p->shared_now;
    if (st0) {
        fprintf(stderr, "kvvm-stress: --pool: kvvmctl (beside kvvm-stress) gets no answer "
                "from the daemon on %s\n", p->sock);
        goto out;
    }
    /* each client's limit: twice the pool shared out, at most the pool: the limits add up to
       more than the pool, so the daemon arbitrates */
    p->limit = p->n >= 2 ? 2 * p->pool_bytes / p->n : p->pool_bytes;
    if (p->limit > p->pool_bytes)
        p->limit = p->pool_bytes;
    if (p->page_size)
        p->limit -= p->limit % p->page_size;
    fprintf(info, "kvvm-stress: pool of %d client%s on %s (%s): pool %.1f MiB in frames of "
            "%" PRIu64 " KiB, each client's limit %.1f MiB (%.2fx the pool in all), x%.2f of "
            "its limit each; %s\n", p->n, p->n == 1 ? "" : "s", p->sock,
            p->started ? "a kvvmd started here" : "a running kvvmd", mib(p->pool_bytes),
            p->page_size / 1024, mib(p->limit),
            p->pool_bytes ? (double)p->limit * p->n / (double)p->pool_bytes : 0, o->oversubscribe,
            p->victim < 0 ? "no client is killed (one client)" : "the last one is killed "
            "(SIGKILL) half way");
    fflush(info);

    struct sigaction sa = { .sa_handler = pool_on_signal };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    for (int i = 0; i < p->n; i++)
        if (start_client(p, i, argc, argv)) {
            fprintf(stderr, "kvvm-stress: --pool: cannot start client %d: %s\n", i,
                    strerror(errno));
            for (int j = 0; j < i; j++)
                kill(p->c[j].pid, SIGKILL);
            for (int j = 0; j < i; j++)
                waitpid(p->c[j].pid, NULL, 0);
            goto out;
        }
    wait_clients(p);
    /* the daemon drops a client that exited when it reads its socket's end: wait for that
       condition (bounded), then take the pool's figures */
    for (uint64_t t0 = now_ns(); now_ns() - t0 < BACK_WAIT_NS;) {
        if (!pool_status(p, &p->free_end, &p->clients_end) &&
            p->clients_end <= p->clients_start && (!p->started || frames_back(p)))
            break;
        usleep(1000);
    }

    status = 0;
    fprintf(info, "\nkvvm-stress pool summary (libkvvm %s)\n", kvvm_version());
    for (int i = 0; i < p->n; i++) {
        p->c[i].report = p->c[i].killed ? NULL : slurp(p->c[i].json);
        if (client_summary(info, p, i)) {
            status = 1;
            print_tail(p->c[i].log);
        }
    }
    if (p->victim >= 0 && p->c[p->victim].killed) {
        fprintf(info, "  kill       %s's frames back in the pool %s%.1f ms after the kill "
                "(free %.1f MiB before, %.1f MiB after)\n", p->c[p->victim].name,
                p->back ? "" : "NOT within 10 s: ", p->back ? p->back_ms : 10000.0,
                mib(p->free_before_kill), mib(p->free_after_back));
        status |= !p->back;
    }
    int exact = frames_back(p) && p->clients_end == p->clients_start;
    fprintf(info, "  pool       %.1f MiB; peak held %.1f MiB; free at the end %.1f MiB, and %.1f "
            "MiB held by %" PRIu64 " shared prefix entries (%.1f MiB at the start), of %.1f MiB "
            "free at the start%s; %u client%s left\n", mib(p->pool_bytes),
            mib(p->peak_pool_held), mib(p->free_end), mib(p->shared_now), p->entries_now,
            mib(p->shared_start), mib(p->free_start),
            exact ? " (every frame back)" : p->started ? " (FRAMES MISSING)"
                  : " (other clients of this daemon changed it: not checked)",
            p->clients_end, p->clients_end == 1 ? "" : "s");
    if (p->started && !exact)
        status = 1;
    fprintf(info, "  result     %s\n", status ? "FAIL" : "PASS: every byte of every surviving "
            "client verified, the killed client's frames back, the pool whole");
    if (o->json_path) {
        int err = pool_json(o->json_path, p, status);
        if (err) {
            fprintf(stderr, "kvvm-stress: cannot write %s: %s\n", o->json_path, strerror(-err));
            status = 1;
        }
    }
    for (int i = 0; i < p->n; i++)
        free(p->c[i].report);
out:
    if (p->started) {
        kill(p->daemon, SIGTERM);
        int st = 0;
        while (waitpid(p->daemon, &st, 0) < 0 && errno == EINTR)
            ;
        if (!WIFEXITED(st) || WEXITSTATUS(st)) {
            fprintf(stderr, "kvvm-stress: kvvmd did not exit 0 on SIGTERM (status %d)\n", st);
            snprintf(self, sizeof self, "%s/kvvmd.log", p->dir);
            print_tail(self);
            if (!status)
                status = 1;
        }
    }
    for (int i = 0; i < p->n; i++) {
        unlink(p->c[i].json);
        unlink(p->c[i].log);
    }
    char lp[300];
    snprintf(lp, sizeof lp, "%s/kvvmd.log", p->dir);
    unlink(lp);
    rmdir(p->dir);
    free(p);
    return status;
}
