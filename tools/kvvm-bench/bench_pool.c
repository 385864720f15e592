/*
 * tools/kvvm-bench/bench_pool.c: the pool group (issue 34): a context whose frames come from
 * the pool daemon (kvvmd, pool_socket) against a local context doing the same work, in
 * alternated pairs (bench.h), and the daemon's own figures. docs/kvvm-bench.md "pool".
 *
 * The group starts a kvvmd — the one beside kvvm-bench, as an installed or built tree has
 * them — on a socket in a fresh temporary directory (the emulated device unless --backend
 * says otherwise; the granule of --granule, else 64 KiB), waits for its ready line and stops
 * it (SIGTERM) at the end. No kvvmd there: the group says so and is skipped.
 *
 * Rows (2 regions, 16 tokens per page, both contexts with the frame pool thread):
 *  - grow within a page: kvvm_seq_grow by one token that needs no new page, ns/op;
 *  - kvvm_step with 8 live sequences, ns/op;
 *  - grow onto a new page: a grow by one page per region (2 new frames) then a 1 ms pause
 *    standing for the engine's compute (the frame pool thread refills meanwhile), the p50 of
 *    200 grows per trial, us/op; the system calls of the engine's thread in those grows,
 *    counted (bench_syscalls), per grow; and the same p50 without the frame pool thread (the
 *    grow leases and imports, or creates, on the caller's thread);
 *  - giving back: B's grow that needs N = 256 frames while idle A, a process of its own,
 *    holds the whole pool in unprotected LIVE sequences (A has KVVM_F_AUTO_SWAP and a host
 *    tier: the daemon asks A, A swaps out and gives back) against A freeing as many frames
 *    itself as its reclaim would: the frames it keeps free, then enough of its sequences
 *    swapped out (kvvm_seq_swap_out of each, then kvvm_sync), each timed after A was idle
 *    100 ms, ms; twice: A with device marks 0 (it keeps no frame free: every frame B gets
 *    held a page of A, the issue's case), then A at its default marks (it keeps some
 *    free, which it gives without a copy); under each, the pages A copied per trial on
 *    each side, counted (the same pages: equal counts);
 *  - death: a client process (kvvm-bench --pool-hold, holding 64 frames) killed with
 *    SIGKILL; the time until kvvm_pool_info of another client shows its frames free, ms (no
 *    baseline).
 * KVVM_BENCH_POOL_GIVE set in the environment: the giving-back row alone (a trace of it).
 */
#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvvm.h"

#define G "pool"
#define NR 2
#define TOK 16                          /* tokens per page */
#define NSEQ 8
#define NEW_GROWS 200                   /* grows onto a new page per trial */
#define GIVE_N 256                      /* frames B needs from A */
#define HOLD_N 64                       /* frames the killed client holds */
#define POOL_FRAMES 1024                /* the daemon's pool */
#define A_PAGES 8                       /* pages per region of each of A's sequences */
#define GIVE_IDLE_US 100000             /* A idle before B's grow: 100 ms */

struct pool_env {
    struct bench_ctx *b;
    size_t gran;
    char dir[64], sock[96], self[4096];
    pid_t daemon;
};

static void pause_us(long us)
{
    struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };
    nanosleep(&ts, NULL);
}

/* A context's configuration: pool_socket NULL = local. limit: device_budget (the pool's
   client: its limit). */
static void ctx_config(struct pool_env *e, const char *sock, size_t budget, unsigned flags,
                       size_t host, int thread, struct kvvm_config *out)
{
    struct kvvm_config c;
    bench_config(&c, e->b->backend, e->gran, e->gran, NR, e->gran / TOK, 256,
                 (uint64_t)POOL_FRAMES * TOK, budget);
    c.emu_device_bytes = sock ? 0 : 2 * budget;
    c.pool_socket = sock;
    c.flags |= flags;
    c.host_budget = host;
    c.pool_timeout_ms = 10000;
    c.spill_dir = NULL;
    c.pool_thread = thread;
    *out = c;
}

static int ctx_open(struct pool_env *e, const char *sock, size_t budget, unsigned flags,
                    size_t host, int thread, kvvm **out)
{
    struct kvvm_config c;
    ctx_config(e, sock, budget, flags, host, thread, &c);
    return kvvm_open(&c, out);
}

/* ---- grow within a page, and kvvm_step ------------------------------------------------- */

struct small {
    kvvm *kv;
    kvvm_seq s[NSEQ];
    uint64_t len[NSEQ];
    int iters;
};

static int small_setup(struct small *m)
{
    for (int q = 0; q < NSEQ; q++) {
        int rc = kvvm_seq_create(m->kv, &m->s[q]);
        if (rc || (rc = kvvm_seq_grow(m->kv, m->s[q], 1)))
            return rc;
        m->len[q] = 1;
    }
    return kvvm_step(m->kv);
}

/* grows by one token inside the first page; back to 1 token (no page freed) when full */
static int sample_grow_small(void *arg, double *out)
{
    struct small *m = arg;
    uint64_t sum = 0;
    for (int i = 0; i < m->iters; i++) {
        int q = i % NSEQ, rc;
        if (m->len[q] + 1 >= TOK) {
            if ((rc = kvvm_seq_truncate(m->kv, m->s[q], 1)))
                return rc;
            m->len[q] = 1;
        }
        uint64_t t0 = bench_now_ns();
        rc = kvvm_seq_grow(m->kv, m->s[q], m->len[q] + 1);
        sum += bench_now_ns() - t0;
        if (rc)
            return rc;
        m->len[q]++;
    }
    *out = (double)sum / m->iters;
    return 0;
}

static int sample_step(void *arg, double *out)
{
    struct small *m = arg;
    uint64_t t0 = bench_now_ns();
    for (int i = 0; i < m->iters; i++) {
        int rc = kvvm_step(m->kv);
        if (rc)
            return rc;
    }
    *out = (double)(bench_now_ns() - t0) / m->iters;
    return 0;
}

/* ---- grow onto a new page ------------------------------------------------------------ */

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* NEW_GROWS grows of a page per region over NSEQ sequences, a 1 ms pause after each; the
   p50 in us; the sequences freed after (untimed) */
static int sample_grow_new(void *arg, double *out)
{
    kvvm *kv = arg;
    kvvm_seq s[NSEQ];
    uint64_t len[NSEQ] = { 0 };
    double lat[NEW_GROWS];
    int rc = 0, made = 0;
    for (; made < NSEQ && !rc; made++)
        rc = kvvm_seq_create(kv, &s[made]);
    for (int i = 0; i < NEW_GROWS && !rc; i++) {
        int q = i % NSEQ;
        uint64_t t0 = bench_now_ns();
        rc = kvvm_seq_grow(kv, s[q], len[q] + TOK);
        lat[i] = (double)(bench_now_ns() - t0) / 1e3;
        len[q] += TOK;
        if (!rc)
            rc = kvvm_step(kv);
        pause_us(1000);
    }
    for (int q = 0; q < made; q++)
        kvvm_seq_free(kv, s[q]);
    if (!rc) {
        qsort(lat, NEW_GROWS, sizeof *lat, cmp_d);
        *out = lat[NEW_GROWS / 2];
    }
    (void)kvvm_step(kv);
    return rc;
}

/* System calls of the engine's thread in NEW_GROWS grows onto a new page (bench_syscalls:
   in a helper, which opens its own contexts): segment 0 the pool client's, 1 the local
   context's. */
static int sys_grows(kvvm *kv, int segment)
{
    kvvm_seq s[NSEQ];
    uint64_t len[NSEQ] = { 0 };
    int rc = 0, made = 0;
    for (; made < NSEQ && !rc; made++)
        rc = kvvm_seq_create(kv, &s[made]);
    for (int i = 0; i < NEW_GROWS && !rc; i++) {
        int q = i % NSEQ;
        bench_syscall_mark(segment);
        rc = kvvm_seq_grow(kv, s[q], len[q] + TOK);
        bench_syscall_mark(-1);
        len[q] += TOK;
        if (!rc)
            rc = kvvm_step(kv);
        pause_us(1000);
    }
    return rc;
}

/* The traced helper (role pool-sys): arg holds the pool client's configuration, then the
   local context's. */
int bench_pool_sys(void *arg, const int *fds, int n_fds)
{
    const struct bench_wire *w = arg;
    struct kvvm_config pc, lc;
    kvvm *p, *l;
    (void)fds;
    (void)n_fds;
    bench_wire_get(&w[0], &pc);
    bench_wire_get(&w[1], &lc);
    int rc = kvvm_open(&pc, &p);
    if (rc)
        return rc;
    if (!(rc = kvvm_open(&lc, &l))) {
        rc = sys_grows(p, 0);
        if (!rc)
            rc = sys_grows(l, 1);
        kvvm_close(l);
    }
    kvvm_close(p);
    return rc;
}

/* System calls per grow onto a new page: a pool client against a local context, in a
   helper (bench_syscalls). */
static int count_grows(struct pool_env *e, uint64_t sys[2])
{
    struct bench_shm arg;
    int rc = bench_shm_new(&arg, 2 * sizeof(struct bench_wire));
    if (rc)
        return rc;
    struct bench_wire *w = arg.p;
    struct kvvm_config c;
    ctx_config(e, e->sock, 0, 0, 0, 1, &c);
    if (!(rc = bench_wire_put(&w[0], &c))) {
        ctx_config(e, NULL, (size_t)POOL_FRAMES * e->gran, 0, 0, 1, &c);
        rc = bench_wire_put(&w[1], &c);
    }
    if (!rc)
        rc = bench_syscalls("pool-sys", &arg, sys, 2);
    bench_shm_free(&arg);
    return rc;
}

/* ---- giving back ---------------------------------------------------------------------
   A is a process of its own, as two clients of a daemon are: a helper (give_a_start: the
   bench binary again, spawn.c), it holds the pool and serves the parent's commands on a
   pipe; B is the parent's. In one process the two contexts would share one emulated
   driver's lock and one address space, so B's imports and maps would wait for A's copies
   (and each mmap would flush A's threads' TLBs), which two processes never do. */

struct give {
    kvvm *b;                            /* B asks (the parent's) */
    pid_t a;                            /* A's process */
    int cmd, ans;                       /* pipes to and from A */
    int marks;                          /* A's device marks: 0 none (it keeps no frame
                                           free), 1 its defaults (it keeps some free) */
    uint64_t copied_give, copied_own;   /* pages A copied over the trials in the give-backs,
                                           and in its own swap-outs */
    int n_give, n_own;                  /* their trials */
};

enum { GIVE_OPEN = 'O', GIVE_FILL = 'F', GIVE_SWAP = 'S', GIVE_COUNT = 'C', GIVE_QUIT = 'Q' };

struct give_a {
    kvvm *a;
    kvvm_seq as[POOL_FRAMES / (NR * A_PAGES)];  /* A_PAGES pages per region each */
    int n_as;
    uint64_t to_host;                   /* A's bytes_to_host at its last refill's end */
    size_t page;                        /* its page size */
};

/* The pages A copied to the host since its last refill's end (its stats). */
static uint64_t give_copied(struct give_a *g)
{
    struct kvvm_stats st = { .size = sizeof st };
    return kvvm_stats(g->a, &st) ? 0 : (st.bytes_to_host - g->to_host) / g->page;
}

/* A: every sequence resident, written and unprotected (two steps), holding the pool */
static int give_fill_a(struct give_a *g)
{
    for (int i = 0; i < g->n_as; i++) {
        /* written since: a swap-out copies every page (a clean page's host copy would make
           it a mere unmap) */
        int rc = kvvm_seq_swap_in(g->a, g->as[i]);
        if (rc || (rc = kvvm_seq_prepare_write(g->a, g->as[i], 0, (uint64_t)A_PAGES * TOK)))
            return rc;
    }
    /* idle: its work done (kvvm_sync), so the connection thread may move them (a
       synchronous-mode context's sequences are quiet once a sync saw the device idle) */
    int rc = kvvm_step(g->a);
    if (!rc)
        rc = kvvm_step(g->a);
    if (!rc)
        rc = kvvm_sync(g->a);
    struct kvvm_stats st = { .size = sizeof st };
    if (!rc && !(rc = kvvm_stats(g->a, &st)))
        g->to_host = st.bytes_to_host;
    return rc;
}

/* A frees GIVE_N frames itself as its reclaim does: the frames it keeps free, then enough
   of its resident sequences swapped out (the same pages its give-back copies), ms in *out,
   the pages it copied in *copied */
static int give_swap_a(struct give_a *g, double *out, uint64_t *copied)
{
    int rc = give_fill_a(g);
    struct kvvm_stats st = { .size = sizeof st };
    if (rc || (rc = kvvm_stats(g->a, &st)))
        return rc;
    /* idle A keeps pages_device_free free by its marks (the sequences its own reclaim
       swapped out are not resident): the rest of GIVE_N comes from whole sequences */
    uint64_t per = NR * A_PAGES, owed = GIVE_N > st.pages_device_free
                                        ? GIVE_N - st.pages_device_free : 0;
    int want = (int)((owed + per - 1) / per);
    kvvm_seq pick[GIVE_N / (NR * A_PAGES)];
    int n = 0;
    for (int i = 0; i < g->n_as && n < want; i++) {
        struct kvvm_seq_info in = { .size = sizeof in };
        if (!kvvm_seq_info(g->a, g->as[i], &in) && in.resident)
            pick[n++] = g->as[i];
    }
    if (n < want)
        return -ENOMEM;
    pause_us(GIVE_IDLE_US);             /* idle, as before B's grow */
    uint64_t t0 = bench_now_ns();
    for (int i = 0; i < n && !rc; i++)
        rc = kvvm_seq_swap_out(g->a, pick[i]);
    if (!rc)
        rc = kvvm_sync(g->a);
    *out = (double)(bench_now_ns() - t0) / 1e6;
    *copied = give_copied(g);
    return rc;
}

struct give_reply {
    int rc;
    double ms;
    uint64_t copied;                    /* pages A copied (GIVE_SWAP, GIVE_COUNT) */
};

/* A's process: at GIVE_OPEN (once the rows before have closed their contexts) opens A
   (KVVM_F_AUTO_SWAP, a host tier, no frame pool thread: idle, no frame ahead; marks 0: its
   device marks 0, so idle it keeps no frame free) and fills the pool; answers
   {rc, ms, copied} to each command until GIVE_QUIT or EOF (GIVE_COUNT: the pages copied
   since the last refill, i.e. by the give-back that followed it). */
/* A's process (a helper, role pool-a): arg its configuration (struct bench_wire); fds the
   command pipe's end, the answer pipe's. */
int bench_pool_a(void *arg, const int *fds, int n_fds)
{
    struct kvvm_config cfg;
    if (n_fds != 2)
        return -EINVAL;
    bench_wire_get(arg, &cfg);
    int cmd = fds[0], ans = fds[1];
    struct give_a g = { .n_as = POOL_FRAMES / (NR * A_PAGES), .page = cfg.page_size };
    struct give_reply r = { 0 };
    char c;
    if (read(cmd, &c, 1) != 1 || c != GIVE_OPEN)
        return 0;
    r.rc = kvvm_open(&cfg, &g.a);
    for (int i = 0; !r.rc && i < g.n_as; i++)
        if (!(r.rc = kvvm_seq_create(g.a, &g.as[i])))
            r.rc = kvvm_seq_grow(g.a, g.as[i], (uint64_t)A_PAGES * TOK);
    if (r.rc)
        fprintf(stderr, "kvvm-bench: pool: client A: %s\n", kvvm_last_error());
    if (write(ans, &r, sizeof r) != (ssize_t)sizeof r || r.rc)
        return 1;
    while (read(cmd, &c, 1) == 1 && c != GIVE_QUIT) {
        r = (struct give_reply){ 0 };
        if (c == GIVE_COUNT)
            r.copied = give_copied(&g);
        else
            r.rc = c == GIVE_FILL ? give_fill_a(&g) : give_swap_a(&g, &r.ms, &r.copied);
        if (r.rc)
            fprintf(stderr, "kvvm-bench: pool: client A: %s\n", kvvm_last_error());
        if (write(ans, &r, sizeof r) != (ssize_t)sizeof r)
            break;
    }
    kvvm_close(g.a);
    return 0;
}

/* Sends command c to A and reads its reply (ms, copied: NULL not wanted). */
static int give_ask_a(struct give *g, char c, double *ms, uint64_t *copied)
{
    struct give_reply r;
    if (write(g->cmd, &c, 1) != 1 || read(g->ans, &r, sizeof r) != (ssize_t)sizeof r)
        return -EIO;
    if (ms)
        *ms = r.ms;
    if (copied)
        *copied = r.copied;
    return r.rc;
}

/* Starts A's process (a helper); at give_a_ready it opens A and holds the pool. */
static int give_a_start(struct pool_env *e, struct give *g)
{
    struct bench_shm arg;
    struct kvvm_config cfg;
    ctx_config(e, e->sock, 0, KVVM_F_AUTO_SWAP, (size_t)POOL_FRAMES * e->gran, 0, &cfg);
    if (!g->marks)
        cfg.device_min = cfg.device_low = cfg.device_high = 0;
    int rc = bench_shm_new(&arg, sizeof(struct bench_wire));
    if (rc)
        return rc;
    if (!(rc = bench_wire_put(arg.p, &cfg)))
        rc = bench_helper_piped("pool-a", &arg, &g->a, &g->cmd, &g->ans);
    bench_shm_free(&arg);
    return rc;
}

static int give_a_ready(struct give *g)
{
    return give_ask_a(g, GIVE_OPEN, NULL, NULL);
}

static void give_a_stop(struct give *g)
{
    if (g->a <= 0)
        return;
    char c = GIVE_QUIT;
    if (write(g->cmd, &c, 1) != 1)
        kill(g->a, SIGKILL);
    close(g->cmd);
    close(g->ans);
    waitpid(g->a, NULL, 0);
    g->a = 0;
}

static int sample_give_b(void *arg, double *out)
{
    struct give *g = arg;
    kvvm_seq s;
    int rc = give_ask_a(g, GIVE_FILL, NULL, NULL);
    if (rc || (rc = kvvm_seq_create(g->b, &s)))
        return rc;
    pause_us(GIVE_IDLE_US);             /* A idle: the daemon's reserve made again (A's
                                           refill took its ready frames) */
    uint64_t t0 = bench_now_ns();
    rc = kvvm_seq_grow(g->b, s, (uint64_t)(GIVE_N / NR) * TOK);
    *out = (double)(bench_now_ns() - t0) / 1e6;
    uint64_t copied = 0;
    if (!rc && !(rc = give_ask_a(g, GIVE_COUNT, NULL, &copied))) {
        g->copied_give += copied;
        g->n_give++;
    }
    kvvm_seq_free(g->b, s);
    (void)kvvm_step(g->b);
    (void)kvvm_trim(g->b, 0);           /* B's frames back to the daemon for A */
    return rc;
}

static int sample_give_a(void *arg, double *out)
{
    struct give *g = arg;
    uint64_t copied = 0;
    int rc = give_ask_a(g, GIVE_SWAP, out, &copied);
    if (!rc) {
        g->copied_own += copied;
        g->n_own++;
    }
    return rc;
}

/* ---- death --------------------------------------------------------------------------- */

struct death {
    struct pool_env *e;
    kvvm *obs;                          /* an observer client: kvvm_pool_info */
};

static int sample_death(void *arg, double *out)
{
    struct death *d = arg;
    struct kvvm_pool_info before = { .size = sizeof before }, now = { .size = sizeof now };
    int rc = kvvm_pool_info(d->obs, &before);
    if (rc)
        return rc;
    int fd[2];
    if (pipe2(fd, O_CLOEXEC))
        return -errno;
    pid_t pid = fork();
    if (pid < 0)
        return -errno;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        char wfd[16];
        int w = dup(fd[1]);             /* without O_CLOEXEC */
        snprintf(wfd, sizeof wfd, "%d", w);
        execl(d->e->self, "kvvm-bench", "--pool-hold", d->e->sock, wfd, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    char c = 0;
    ssize_t n;
    while ((n = read(fd[0], &c, 1)) < 0 && errno == EINTR)
        ;
    close(fd[0]);
    if (n != 1 || c != 'R') {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        fprintf(stderr, "kvvm-bench: pool: the holding client did not start\n");
        return -EIO;
    }
    uint64_t want = before.free_bytes;  /* its frames all back: free as before it */
    uint64_t t0 = bench_now_ns();
    kill(pid, SIGKILL);
    rc = -ETIMEDOUT;
    while (bench_now_ns() - t0 < 10000000000ull) {      /* a bound, not a condition */
        if ((rc = kvvm_pool_info(d->obs, &now)))
            break;
        if (now.free_bytes >= want) {
            *out = (double)(bench_now_ns() - t0) / 1e6;
            rc = 0;
            break;
        }
        rc = -ETIMEDOUT;
    }
    waitpid(pid, NULL, 0);
    return rc;
}

/* kvvm-bench --pool-hold SOCKET FD: a client holding HOLD_N frames mapped, 'R' on FD once
   it does, then waiting to be killed (the death row). */
int bench_daemon_hold(const char *sock, int fd)
{
    kvvm_set_log(NULL, NULL, KVVM_LOG_ERROR);
    struct pool_env e = { .gran = (size_t)64 * 1024 };
    struct bench_ctx b = { .backend = KVVM_BACKEND_AUTO };
    e.b = &b;
    kvvm *kv;
    kvvm_seq s;
    int rc = ctx_open(&e, sock, 0, 0, 0, 1, &kv);
    if (!rc)
        rc = kvvm_seq_create(kv, &s);
    if (!rc)
        rc = kvvm_seq_grow(kv, s, (uint64_t)(HOLD_N / NR) * TOK);
    if (rc) {
        fprintf(stderr, "kvvm-bench --pool-hold: %s\n", kvvm_last_error());
        return 1;
    }
    if (write(fd, "R", 1) != 1)
        return 1;
    for (;;)
        pause();
}

/* ---- the daemon ---------------------------------------------------------------------- */

static int daemon_start(struct pool_env *e)
{
    char dir[4096], bin[4200], budget[32], gran[32], dev[32];
    ssize_t n = readlink("/proc/self/exe", e->self, sizeof e->self - 1);
    if (n <= 0)
        return -errno;
    e->self[n] = 0;
    snprintf(dir, sizeof dir, "%s", e->self);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    snprintf(bin, sizeof bin, "%s/kvvmd", dir);
    if (access(bin, X_OK)) {
        printf("%-8s (no kvvmd beside kvvm-bench, %s: skipped)\n", G, bin);
        return 1;
    }
    snprintf(e->dir, sizeof e->dir, "/tmp/kvvm-bench-pool.XXXXXX");
    if (!mkdtemp(e->dir))
        return -errno;
    snprintf(e->sock, sizeof e->sock, "%s/sock", e->dir);
    snprintf(budget, sizeof budget, "%zu", (size_t)POOL_FRAMES * e->gran);
    snprintf(gran, sizeof gran, "%zu", e->gran);
    snprintf(dev, sizeof dev, "%zu", (size_t)2 * POOL_FRAMES * e->gran);
    const char *be = e->b->backend == KVVM_BACKEND_CUDA ? "cuda"
                   : e->b->backend == KVVM_BACKEND_AUTO ? "auto" : "emulated";
    int fd[2];
    if (pipe2(fd, O_CLOEXEC))
        return -errno;
    e->daemon = fork();
    if (e->daemon < 0)
        return -errno;
    if (e->daemon == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        dup2(fd[1], 1);
        execl(bin, "kvvmd", "--socket", e->sock, "--backend", be, "--budget", budget,
              "--page-size", gran, "--emu-granule", gran, "--emu-device-bytes", dev,
              (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    char line[256];
    size_t k = 0;
    while (k + 1 < sizeof line && read(fd[0], line + k, 1) == 1 && line[k] != '\n')
        k++;
    line[k] = 0;
    close(fd[0]);
    if (!strstr(line, "kvvmd: ready")) {
        fprintf(stderr, "kvvm-bench: pool: kvvmd did not start (its stdout: '%s')\n", line);
        waitpid(e->daemon, NULL, 0);
        rmdir(e->dir);
        return -EIO;
    }
    return 0;
}

static void daemon_stop(struct pool_env *e)
{
    kill(e->daemon, SIGTERM);
    waitpid(e->daemon, NULL, 0);
    rmdir(e->dir);
}

/* ---- the rows ------------------------------------------------------------------------ */

static int rows_small(struct pool_env *e)
{
    struct small p = { .iters = e->b->quick ? 2000 : 20000 }, l = p;
    struct bench_pair pr;
    int rc = ctx_open(e, e->sock, 0, 0, 0, 1, &p.kv);
    if (!rc)
        rc = ctx_open(e, NULL, (size_t)POOL_FRAMES * e->gran, 0, 0, 1, &l.kv);
    if (!rc && !(rc = small_setup(&p)) && !(rc = small_setup(&l)) &&
        !(rc = bench_pairs(e->b, sample_grow_small, &p, sample_grow_small, &l, &pr)))
        bench_report_pair(e->b, G, "grow within a page (no new page), pool client", &pr,
                          "local context", "ns/op", 1);
    if (!rc && !(rc = bench_pairs(e->b, sample_step, &p, sample_step, &l, &pr)))
        bench_report_pair(e->b, G, "kvvm_step (8 live sequences), pool client", &pr,
                          "local context", "ns/op", 1);
    if (!rc && !(rc = bench_pairs(e->b, sample_grow_new, p.kv, sample_grow_new, l.kv, &pr)))
        bench_report_pair(e->b, G, "grow onto a new page (2 frames), p50, pool client", &pr,
                          "local context", "us/op", 1);
    kvvm_close(p.kv);
    kvvm_close(l.kv);
    if (rc)
        return rc;
    uint64_t sys[2] = { 0, 0 };
    rc = count_grows(e, sys);
    if (rc == -EPERM || rc == -ECHILD)
        printf("%-8s system calls per grow: not counted (tracing refused here)\n", G);
    else if (rc)
        return rc;
    else
        bench_report(e->b, G, "system calls per grow onto a new page, pool client",
                     (double)sys[0] / NEW_GROWS, (double)sys[1] / NEW_GROWS, "local context",
                     "calls", 1);
    /* the same without the frame pool thread: the grow leases (a batch of 16 per request)
       and imports on the caller's thread, the local context creates there */
    rc = ctx_open(e, e->sock, 0, 0, 0, 0, &p.kv);
    if (!rc && (rc = ctx_open(e, NULL, (size_t)POOL_FRAMES * e->gran, 0, 0, 0, &l.kv))) {
        kvvm_close(p.kv);
        return rc;
    }
    if (!rc && !(rc = bench_pairs(e->b, sample_grow_new, p.kv, sample_grow_new, l.kv, &pr)))
        bench_report_pair(e->b, G, "grow onto a new page, p50, no frame pool thread", &pr,
                          "local context", "us/op", 1);
    kvvm_close(p.kv);
    kvvm_close(l.kv);
    return rc;
}

/* The giving-back row of g's A, and the pages A copied per trial on each side (the same
   pages: a row whose counts differ compares different work). */
static int rows_give(struct pool_env *e, struct give *g)
{
    struct bench_pair pr;
    int rc = give_a_ready(g);           /* A holds the pool */
    if (!rc)        /* leasing on its own thread, as A does */
        rc = ctx_open(e, e->sock, 0, 0, 0, 0, &g->b);
    if (!rc && !(rc = bench_pairs(e->b, sample_give_b, g, sample_give_a, g, &pr))) {
        char op[96];
        if (g->marks)
            snprintf(op, sizeof op, "giving back %d frames, A keeping frames free", GIVE_N);
        else
            snprintf(op, sizeof op, "giving back: B's grow needing %d frames A's pages hold",
                     GIVE_N);
        bench_report_pair(e->b, G, op, &pr, g->marks ? "A freeing as many itself"
                          : "A swaps the same pages out", "ms", 1);
        snprintf(op, sizeof op, "pages A copies per give-back (%s, counted)",
                 g->marks ? "keeping frames free" : "every frame a page");
        if (g->n_give && g->n_own)
            bench_report(e->b, G, op, (double)g->copied_give / g->n_give,
                         (double)g->copied_own / g->n_own, "per own swap-out", "pages", 1);
    }
    kvvm_close(g->b);
    give_a_stop(g);
    return rc;
}

static int rows_death(struct pool_env *e)
{
    struct death d = { .e = e };
    struct bench_pair pr;
    int rc = ctx_open(e, e->sock, 0, 0, 0, 0, &d.obs);   /* no frame pool thread: idle */
    if (!rc && !(rc = bench_pairs(e->b, sample_death, &d, NULL, NULL, &pr))) {
        char op[96];
        snprintf(op, sizeof op, "death: kill -9 of a client holding %d frames to all free",
                 HOLD_N);
        bench_report_pair(e->b, G, op, &pr, NULL, "ms", 1);
    }
    kvvm_close(d.obs);
    return rc;
}

int bench_daemon(struct bench_ctx *b)
{
    struct pool_env e = { .b = b, .gran = b->granule ? b->granule : (size_t)64 * 1024 };
    int rc = daemon_start(&e);
    if (rc)
        return rc > 0 ? 0 : rc;
    /* two A processes (helpers): A keeping no frame free (the row of the issue's goal),
       then A at its default marks */
    struct give g = { .marks = 0 }, gm = { .marks = 1 };
    if ((rc = give_a_start(&e, &g)) || (rc = give_a_start(&e, &gm))) {
        give_a_stop(&g);
        daemon_stop(&e);
        return rc;
    }
    /* KVVM_BENCH_POOL_GIVE=1: the giving-back row alone (a trace or a profile of it) */
    bool give_only = getenv("KVVM_BENCH_POOL_GIVE") != NULL;
    if ((give_only || !(rc = rows_small(&e))) && !(rc = rows_give(&e, &g)) &&
        !(rc = rows_give(&e, &gm)) && !give_only)
        rc = rows_death(&e);
    give_a_stop(&g);
    give_a_stop(&gm);
    if (rc)
        fprintf(stderr, "kvvm-bench: pool: %s\n", kvvm_last_error());
    daemon_stop(&e);
    return rc;
}
