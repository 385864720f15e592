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
 *    imported sequence) against one kvvm_seq_fork (+ its free) (bench_syscalls: a forked
 *    child with a client of its own);
 *  - then the shared prefix index's rows on the same daemon (bench_share.c): attach of 64
 *    blocks from the pool against a local attach and against a file:// store, and a lookup
 *    that asks the daemon against a local one.
 *
 * The group starts its own kvvmd (the one beside this binary: tools/kvvmd in a build tree,
 * bin/kvvmd installed) on a socket in a temporary directory, emulated unless --backend
 * cuda, and stops it at the end; without one the group says so and is skipped.
 * Workload: 2 regions, 64 KiB pages of 128 tokens (512 B per token), 16384 tokens: 128
 * pages per region, 256 frames.
 */
#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvvm.h"
#include "kvvm_testing.h"

#define G "handoff"
#define TOKENS 16384
#define BPT 512

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

/* Starts kvvmd and waits for its ready line. 0; -errno. */
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
    const char *cuda[] = { exe, "--socket", d->path, "--backend", "cuda", "--budget", "512M",
                           NULL };
    const char *emu[] = { exe, "--socket", d->path, "--backend", "emulated",
                          "--emu-device-bytes", "1G", "--emu-granule", "64K", "--budget",
                          "512M", NULL };
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

/* System calls (bench_syscalls, a forked child with a client of its own): one export +
   import and the imported sequence's free (segment 0), one kvvm_seq_fork and the child's
   free (segment 1), after an uncounted warm-up of each. */
static int sys_child(void *arg)
{
    struct run r = { 0 };
    double w;
    int rc = kvvm_open(arg, &r.kv);
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

static int row_syscalls(struct bench_ctx *b, struct kvvm_config *c)
{
    uint64_t n[2] = { 0, 0 };
    int rc = bench_syscalls(sys_child, c, n, 2);
    if (rc == -EPERM || rc == -ECHILD) {
        printf("%-8s system calls per export+import: not counted (tracing refused here)\n", G);
        return 0;
    }
    if (!rc)
        bench_report(b, G, "system calls per export+import, 16k tokens (+ free)", (double)n[0],
                     (double)n[1], "kvvm_seq_fork (+ free)", "calls", 1);
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
    bench_config(&c, b->backend, 0, 0, 2, BPT, 4, TOKENS, 0);
    c.pool_socket = d.path;
    c.page_size = 0;
    c.emu_granule = 0;
    struct run r = { 0 };
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
    if (!rc)                            /* the shared prefix index's rows (bench_share.c) */
        rc = bench_share_rows(b, &c, d.path, r.kv, r.s);
    if (rc)
        fprintf(stderr, "kvvm-bench: handoff: %s (%d)\n", kvvm_last_error(), rc);
    if (r.kv)
        kvvm_close(r.kv);
    daemon_stop(&d);
    return rc;
}
