/*
 * tools/kvvm-bench/bench_handoff.c: the handoff group (issue 35): a sequence handed between
 * clients of a kvvmd without a copy, beside the local way to get a second sequence of the
 * same pages.
 *
 *  - export + import of a 16k-token sequence (kvvm_seq_export, then kvvm_seq_import in the
 *    same client: the daemon's round trips, the descriptors, the imports and the mappings)
 *    against kvvm_seq_fork of it (the same pages mapped in a second window, copy on write),
 *    alternated within each trial; the new sequence is freed outside the timed region;
 *  - counted, not timed: the driver imports of one export + import (emulated device: its
 *    call counts; the frames are this client's own, sent held: none expected) against the
 *    frames handed over, and the system calls of one export + import (+ the free of the
 *    imported sequence) against one kvvm_seq_fork (+ its free) (bench_syscalls: a helper
 *    process with a client of its own);
 *  - the hand-off between processes: A exports, client B (a helper process, spawn.c, with a
 *    context of its own, driven through two pipes) imports the token
 *    and frees the sequence (untimed); per op the export's time in A plus the import's in B
 *    (the pipe between them not counted), against kvvm_seq_fork in A, alternated; counted:
 *    B's driver imports of one import (emulated device: all 256 frames, B never held them)
 *    and the system calls of B's import against kvvm_seq_fork of the imported sequence in B
 *    (bench_syscalls: the traced child is B, after a warm-up import);
 *  - then the shared prefix index's rows on the same daemon (bench_share.c): attach of 64
 *    blocks from the pool against a local attach and against a file:// store, and a lookup
 *    that asks the daemon against a local one.
 *
 * The group starts its own kvvmd (the one beside this binary: tools/kvvmd in a build tree,
 * bin/kvvmd installed) on a socket in a temporary directory, emulated unless --backend
 * cuda, and stops it at the end; without one the group says so and is skipped.
 * Workload: 2 regions, pages of 128 tokens, 16384 tokens: 128 pages per region, 256
 * frames, whatever the page (group_page): 64 KiB (512 B per token) on the emulated device
 * by default, --granule there, 2 MiB (16 KiB per token) on CUDA, so a GPU runs the same
 * workload in pages and frames as the emulated device.
 */
#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvvm.h"
#include "kvvm_testing.h"

#define G "handoff"
#define TOKENS 16384
#define TPP 128                         /* tokens per page */

struct daemon { pid_t pid; char dir[64], path[128]; };

/* kvvmd beside this binary, or -ENOENT. */
static int kvvmd_path(char *out, size_t n)
{
    char self[PATH_MAX];
    ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
    if (k <= 0)
        return -ENOENT;
    self[k] = 0;
    char *slash = strrchr(self, '/');
    if (!slash)
        return -ENOENT;
    *slash = 0;
    snprintf(out, n, "%s/kvvmd", self);
    return access(out, X_OK) == 0 ? 0 : -ENOENT;
}

/* The daemon's page: --granule on the emulated device (64 KiB without it), 2 MiB on CUDA
   (every current GPU's granule; kvvmd is given it as --page-size). */
static size_t group_page(const struct bench_ctx *b)
{
    if (b->backend == KVVM_BACKEND_CUDA)
        return (size_t)2 << 20;
    return b->granule ? b->granule : (size_t)64 << 10;
}

/* Starts kvvmd and waits for its ready line: a budget of 8192 pages (512 MiB at 64 KiB),
   an emulated device of 16384. 0; -errno. */
static int daemon_start(struct bench_ctx *b, struct daemon *d)
{
    char exe[PATH_MAX + 8];
    if (kvvmd_path(exe, sizeof exe))
        return -ENOENT;
    snprintf(d->dir, sizeof d->dir, "/tmp/kvvmbench.XXXXXX");
    if (!mkdtemp(d->dir))
        return -errno;
    snprintf(d->path, sizeof d->path, "%s/sock", d->dir);
    int po[2];
    if (pipe2(po, O_CLOEXEC))
        return -errno;
    size_t kib = group_page(b) >> 10;
    char page[32], budget[32], dev[32];
    snprintf(page, sizeof page, "%zuK", kib);
    snprintf(budget, sizeof budget, "%zuK", kib * 8192);
    snprintf(dev, sizeof dev, "%zuK", kib * 16384);
    const char *cuda[] = { exe, "--socket", d->path, "--backend", "cuda", "--page-size", page,
                           "--budget", budget, NULL };
    const char *emu[] = { exe, "--socket", d->path, "--backend", "emulated",
                          "--emu-device-bytes", dev, "--emu-granule", page, "--budget",
                          budget, NULL };
    d->pid = fork();
    if (d->pid < 0)
        return -errno;
    if (d->pid == 0) {
        dup2(po[1], 1);
        int nul = open("/dev/null", O_WRONLY);
        if (nul >= 0)
            dup2(nul, 2);
        execv(exe, (char *const *)(b->backend == KVVM_BACKEND_CUDA ? cuda : emu));
        _exit(127);
    }
    close(po[1]);
    char line[256];
    size_t k = 0;
    while (k + 1 < sizeof line && read(po[0], &line[k], 1) == 1 && line[k] != '\n')
        k++;
    line[k] = 0;
    close(po[0]);
    return strstr(line, "kvvmd: ready") ? 0 : -EIO;
}

static void daemon_stop(struct daemon *d)
{
    if (d->pid > 0) {
        kill(d->pid, SIGTERM);
        waitpid(d->pid, NULL, 0);
    }
    rmdir(d->dir);
}

struct run { kvvm *kv; kvvm_seq s; };

static int sample_handoff(void *arg, double *out)
{
    struct run *r = arg;
    kvvm_handoff t;
    kvvm_seq im;
    uint64_t t0 = bench_now_ns();
    int rc = kvvm_seq_export(r->kv, r->s, &t);
    if (!rc)
        rc = kvvm_seq_import(r->kv, &t, &im);
    uint64_t t1 = bench_now_ns();
    if (rc)
        return rc;
    *out = (double)(t1 - t0) / 1e3;
    return kvvm_seq_free(r->kv, im);
}

static int sample_fork(void *arg, double *out)
{
    struct run *r = arg;
    kvvm_seq ch;
    uint64_t t0 = bench_now_ns();
    int rc = kvvm_seq_fork(r->kv, r->s, &ch);
    uint64_t t1 = bench_now_ns();
    if (rc)
        return rc;
    *out = (double)(t1 - t0) / 1e3;
    return kvvm_seq_free(r->kv, ch);
}

/* The driver imports of one export + import of r's sequence (emulated device only). */
static int row_imports(struct bench_ctx *b, struct run *r)
{
    struct kvvm_testing_emu_calls c0, c1;
    double w;
    if (kvvm_testing_emu_calls(r->kv, &c0) == -ENODEV)
        return 0;                       /* a GPU: the driver does not count for us */
    int rc = sample_handoff(r, &w);
    if (!rc)
        rc = kvvm_testing_emu_calls(r->kv, &c1);
    if (!rc)
        bench_report(b, G, "driver imports per export+import (256 frames, counted)",
                     (double)(kvvm_testing_emu_count(&c1, "cuMemImportFromShareableHandle") -
                              kvvm_testing_emu_count(&c0, "cuMemImportFromShareableHandle")),
                     256, "the frames handed over", "imports", 1);
    return rc;
}

/* System calls (bench_syscalls, a helper with a client of its own): one export + import and
   the imported sequence's free (segment 0), one kvvm_seq_fork and the child's free (segment
   1), after an uncounted warm-up of each. arg: the client's struct bench_wire. */
int bench_handoff_sys(void *arg, const int *fds, int n_fds)
{
    struct run r = { 0 };
    struct kvvm_config c;
    double w;
    (void)fds;
    (void)n_fds;
    bench_wire_get(arg, &c);
    int rc = kvvm_open(&c, &r.kv);
    if (!rc)
        rc = kvvm_seq_create(r.kv, &r.s);
    if (!rc)
        rc = kvvm_seq_grow(r.kv, r.s, TOKENS);
    if (!rc)
        rc = sample_handoff(&r, &w);
    if (!rc)
        rc = sample_fork(&r, &w);
    bench_syscall_mark(0);
    if (!rc)
        rc = sample_handoff(&r, &w);
    bench_syscall_mark(1);
    if (!rc)
        rc = sample_fork(&r, &w);
    bench_syscall_mark(-1);
    if (r.kv)
        kvvm_close(r.kv);
    return rc;
}

static int row_syscalls(struct bench_ctx *b, const struct kvvm_config *c)
{
    uint64_t n[2] = { 0, 0 };
    struct bench_shm arg;
    int rc = bench_shm_new(&arg, sizeof(struct bench_wire));
    if (rc)
        return rc;
    if (!(rc = bench_wire_put(arg.p, c)))
        rc = bench_syscalls("handoff-sys", &arg, n, 2);
    bench_shm_free(&arg);
    if (rc == -EPERM || rc == -ECHILD) {
        printf("%-8s system calls per export+import: not counted (tracing refused here)\n", G);
        return 0;
    }
    if (!rc)
        bench_report(b, G, "system calls per export+import, 16k tokens (+ free)", (double)n[0],
                     (double)n[1], "kvvm_seq_fork (+ free)", "calls", 1);
    return rc;
}

/* ---- client B in another process: the import of A's export there ------------------------ */

/* A request to B: import t (and free it, untimed); with count, B's driver imports of it. */
struct xreq { kvvm_handoff t; int count; };
/* B's answer: 0 or -errno; the import's time, us; its driver imports (UINT64_MAX: not
   counted, a GPU). */
struct xrep { int rc; double us; uint64_t imports; };

struct xproc { pid_t pid; int to, from; };     /* B and the pipes to and from it */

static int io_full(int fd, void *p, size_t n, bool wr)
{
    for (size_t k = 0; k < n;) {
        ssize_t m = wr ? write(fd, (char *)p + k, n - k) : read(fd, (char *)p + k, n - k);
        if (m < 0 && errno == EINTR)
            continue;
        if (m <= 0)
            return m < 0 ? -errno : -EPIPE;
        k += (size_t)m;
    }
    return 0;
}

/* B's import of q->t, timed, then its free (untimed); counted with q->count. */
static void xproc_import(kvvm *kv, const struct xreq *q, struct xrep *p)
{
    struct kvvm_testing_emu_calls c0, c1;
    bool counted = q->count && kvvm_testing_emu_calls(kv, &c0) == 0;
    kvvm_seq im;
    uint64_t t0 = bench_now_ns();
    p->rc = kvvm_seq_import(kv, &q->t, &im);
    uint64_t t1 = bench_now_ns();
    if (p->rc)
        return;
    p->us = (double)(t1 - t0) / 1e3;
    p->imports = UINT64_MAX;
    if (counted && kvvm_testing_emu_calls(kv, &c1) == 0)
        p->imports = kvvm_testing_emu_count(&c1, "cuMemImportFromShareableHandle") -
                     kvvm_testing_emu_count(&c0, "cuMemImportFromShareableHandle");
    p->rc = kvvm_seq_free(kv, im);
}

/* B's life (a helper): a context of its own (opened at the first request), an answer per
   request, until the request pipe closes. arg: the client's struct bench_wire; fds: the
   request pipe's end, the answer pipe's. */
int bench_handoff_b(void *arg, const int *fds, int n_fds)
{
    kvvm *kv = NULL;
    struct kvvm_config c;
    int open_rc = 0;
    struct xreq q;
    if (n_fds != 2)
        return -EINVAL;
    bench_wire_get(arg, &c);
    while (io_full(fds[0], &q, sizeof q, false) == 0) {
        struct xrep p = { 0 };
        if (!kv && !open_rc)
            open_rc = kvvm_open(&c, &kv);
        p.rc = open_rc;
        if (!p.rc)
            xproc_import(kv, &q, &p);
        if (p.rc)
            fprintf(stderr, "kvvm-bench: handoff: client B: %s (%d)\n", kvvm_last_error(),
                    p.rc);
        if (io_full(fds[1], &p, sizeof p, true))
            break;
    }
    if (kv)
        kvvm_close(kv);
    return 0;
}

/* Starts B (a helper). 0; -errno. */
static int xproc_start(struct xproc *x, const struct kvvm_config *c)
{
    struct bench_shm arg;
    int rc = bench_shm_new(&arg, sizeof(struct bench_wire));
    if (rc)
        return rc;
    if (!(rc = bench_wire_put(arg.p, c)))
        rc = bench_helper_piped("handoff-b", &arg, &x->pid, &x->to, &x->from);
    bench_shm_free(&arg);
    if (rc)
        x->pid = 0;
    return rc;
}

static void xproc_stop(struct xproc *x)
{
    if (x->pid <= 0)
        return;
    close(x->to);                       /* B's request pipe ends: it closes and exits */
    close(x->from);
    waitpid(x->pid, NULL, 0);
    x->pid = 0;
}

/* A exports r's sequence, B imports the token (and frees it). *export_us: A's export;
   p: B's answer. An export B could not import is dropped. 0; -errno. */
static int xproc_handoff(struct xproc *x, struct run *r, int count, double *export_us,
                         struct xrep *p)
{
    struct xreq q = { .count = count };
    uint64_t t0 = bench_now_ns();
    int rc = kvvm_seq_export(r->kv, r->s, &q.t);
    uint64_t t1 = bench_now_ns();
    if (rc)
        return rc;
    *export_us = (double)(t1 - t0) / 1e3;
    rc = io_full(x->to, &q, sizeof q, true);
    if (!rc)
        rc = io_full(x->from, p, sizeof *p, false);
    if (!rc)
        rc = p->rc;
    if (rc)
        (void)kvvm_handoff_drop(r->kv, &q.t);
    return rc;
}

struct xrun { struct xproc *x; struct run *r; };

/* A's export + B's import, each timed where it runs (the pipe between them not counted). */
static int sample_xproc(void *arg, double *out)
{
    struct xrun *xr = arg;
    struct xrep p;
    double e;
    int rc = xproc_handoff(xr->x, xr->r, 0, &e, &p);
    if (!rc)
        *out = e + p.us;
    return rc;
}

/* The timed row (alternated with kvvm_seq_fork in A) and B's driver imports per import. */
static int row_xproc(struct bench_ctx *b, struct xproc *x, struct run *r)
{
    struct xrun xr = { x, r };
    struct bench_pair pr;
    struct xrep p;
    double w;
    int rc = sample_xproc(&xr, &w);     /* warm-up: B's context opened, its first import */
    if (!rc)
        rc = bench_pairs(b, sample_xproc, &xr, sample_fork, r, &pr);
    if (!rc)
        bench_report_pair(b, G, "export in A + import in B (another process), 16k tokens",
                          &pr, "kvvm_seq_fork", "us/op", 1);
    if (!rc)
        rc = xproc_handoff(x, r, 1, &w, &p);
    if (!rc && p.imports != UINT64_MAX)
        bench_report(b, G, "driver imports per import in B (256 frames, counted)",
                     (double)p.imports, 256, "the frames handed over", "imports", 1);
    return rc;
}

/* System calls of B's import (bench_syscalls: B is the traced child, a client of its own):
   segment 0 the import of an export of A's sequence, segment 1 kvvm_seq_fork of the
   imported sequence in B; after a warm-up import (a first export). */
struct xsys { struct bench_wire c; kvvm_handoff t[2]; };

int bench_handoff_xsys(void *arg, const int *fds, int n_fds)
{
    struct xsys *xs = arg;
    struct kvvm_config c;
    kvvm *kv = NULL;
    kvvm_seq w, im, ch;
    (void)fds;
    (void)n_fds;
    bench_wire_get(&xs->c, &c);
    int rc = kvvm_open(&c, &kv);
    if (!rc)
        rc = kvvm_seq_import(kv, &xs->t[0], &w);
    if (!rc)
        rc = kvvm_seq_free(kv, w);
    bench_syscall_mark(0);
    if (!rc)
        rc = kvvm_seq_import(kv, &xs->t[1], &im);
    bench_syscall_mark(1);
    if (!rc)
        rc = kvvm_seq_fork(kv, im, &ch);
    bench_syscall_mark(-1);
    if (!rc)
        rc = kvvm_seq_free(kv, ch);
    if (!rc)
        rc = kvvm_seq_free(kv, im);
    if (kv)
        kvvm_close(kv);
    return rc;
}

static int row_xsyscalls(struct bench_ctx *b, const struct kvvm_config *c, struct run *r)
{
    uint64_t n[2] = { 0, 0 };
    struct bench_shm arg;
    int rc = bench_shm_new(&arg, sizeof(struct xsys));
    if (rc)
        return rc;
    struct xsys *xs = arg.p;
    if ((rc = bench_wire_put(&xs->c, c)) || (rc = kvvm_seq_export(r->kv, r->s, &xs->t[0]))) {
        bench_shm_free(&arg);
        return rc;
    }
    if ((rc = kvvm_seq_export(r->kv, r->s, &xs->t[1]))) {
        (void)kvvm_handoff_drop(r->kv, &xs->t[0]);
        bench_shm_free(&arg);
        return rc;
    }
    rc = bench_syscalls("handoff-xsys", &arg, n, 2);
    for (int i = 0; rc && i < 2; i++)   /* what the helper may not have imported */
        (void)kvvm_handoff_drop(r->kv, &xs->t[i]);
    bench_shm_free(&arg);
    if (rc == -EPERM || rc == -ECHILD) {
        printf("%-8s system calls of an import in B: not counted (tracing refused here)\n",
               G);
        return 0;
    }
    if (!rc)
        bench_report(b, G, "system calls of an import in B, 16k tokens (counted)",
                     (double)n[0], (double)n[1], "kvvm_seq_fork in B", "calls", 1);
    return rc;
}

int bench_handoff(struct bench_ctx *b)
{
    struct daemon d = { 0 };
    int rc = daemon_start(b, &d);
    if (rc) {
        printf("%-8s skipped: no kvvmd could be started beside this binary (%s)\n", G,
               strerror(-rc));
        daemon_stop(&d);
        return 0;
    }
    struct kvvm_config c;
    bench_config(&c, b->backend, 0, 0, 2, group_page(b) / TPP, 4, TOKENS, 0);
    c.pool_socket = d.path;
    c.page_size = 0;
    c.emu_granule = 0;
    struct run r = { 0 };
    struct xproc x = { 0 };
    rc = xproc_start(&x, &c);           /* client B, a helper process */
    if (!rc)
        rc = kvvm_open(&c, &r.kv);
    if (!rc)
        rc = kvvm_seq_create(r.kv, &r.s);
    if (!rc)
        rc = kvvm_seq_grow(r.kv, r.s, TOKENS);
    if (!rc) {
        struct bench_pair p;
        rc = bench_pairs(b, sample_handoff, &r, sample_fork, &r, &p);
        if (!rc)
            bench_report_pair(b, G, "export+import, 16k tokens (256 frames)", &p,
                              "kvvm_seq_fork", "us/op", 1);
    }
    if (!rc)
        rc = row_imports(b, &r);
    if (!rc)
        rc = row_syscalls(b, &c);
    if (!rc)
        rc = row_xproc(b, &x, &r);
    if (!rc)
        rc = row_xsyscalls(b, &c, &r);
    if (!rc)                            /* the shared prefix index's rows (bench_share.c) */
        rc = bench_share_rows(b, &c, d.path, r.kv, r.s);
    if (rc)
        fprintf(stderr, "kvvm-bench: handoff: %s (%d)\n", kvvm_last_error(), rc);
    xproc_stop(&x);
    if (r.kv)
        kvvm_close(r.kv);
    daemon_stop(&d);
    return rc;
}
