/*
 * tools/kvvm-bench/bench.h: the benchmark tool's shared harness. Each benchmark group lives in
 * its own file and defines one entry point declared below; main.c runs the groups that exist
 * (weak symbols) and the user selected. A figure is reported beside a baseline measured in the
 * same run, as a ratio, only where the baseline does the same work by other means (a fair
 * one); a figure without one shows none. Nothing is asserted.
 */
#ifndef KVVM_BENCH_H
#define KVVM_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "kvvm.h"

struct bench_ctx {
    FILE *json;           /* JSON array being written, or NULL */
    int   n_json;         /* entries written so far */
    int   quick;          /* --quick: fewer iterations (for CI smoke runs) */
    int   trials;         /* trials per figure (median taken); default 5 */
    const char *spill_dir;/* --spill-dir (default /var/tmp) */
    int   backend;        /* --backend: enum kvvm_backend; default KVVM_BACKEND_EMULATED */
    size_t granule;       /* --granule: emulated granule in bytes; 0 = the default (2 MiB) */
};

/* Reports one figure: value in unit, beside baseline (same unit) measured in the same run.
   ratio = value / baseline is printed; lower_is_better says how to read it. A baseline of 0
   means none (printed as "-"): give none rather than an unfair one. */
void bench_report(struct bench_ctx *b, const char *group, const char *op, double value,
                  double baseline, const char *baseline_name, const char *unit,
                  int lower_is_better);

/* Helpers. */
uint64_t bench_now_ns(void);
double bench_median(double *v, int n);   /* sorts v */
struct kvvm_config;
/* kvvm_config_init, then the fields every group sets (backend: enum kvvm_backend;
   page_size 0: the granule); a group sets the rest after it. */
void bench_config(struct kvvm_config *c, int backend, size_t granule, size_t page_size,
                  uint32_t n_regions, uint64_t bytes_per_token, uint32_t max_seqs,
                  uint64_t max_tokens, size_t device_budget);

/* ---- rows measured in alternated pairs ----------------------------------------------------
   Every timed row takes --trials samples of the library's figure and, in the same trial,
   one of its same-work baseline, in alternating order (trial t runs the library first when
   t is even, the baseline first when odd), so neither always runs in the other's wake on a
   loaded machine. The row prints the medians, the ratio of the medians and the spread: the
   25th..75th percentile over trials of the per-trial ratio (of the value, when the row has
   no baseline). */
#define BENCH_MAX_TRIALS 200
struct bench_pair {
    int    n;                          /* trials recorded */
    double v[BENCH_MAX_TRIALS];        /* the library's figure, per trial */
    double base[BENCH_MAX_TRIALS];     /* the baseline's, same trial (0: none) */
};
/* One sample of a figure into *out: 0, or -errno. */
typedef int (*bench_sample_fn)(void *arg, double *out);
/* Records one trial's pair (dropped past BENCH_MAX_TRIALS). base 0: no baseline. */
void bench_pair_add(struct bench_pair *p, double v, double base);
/* Runs b->trials trials of lib and base (NULL: none) alternately into *p (reset first):
   0, or the first -errno of a sample (p then holds the trials before it). */
int bench_pairs(struct bench_ctx *b, bench_sample_fn lib, void *lib_arg,
                bench_sample_fn base, void *base_arg, struct bench_pair *p);
/* The same row from n trials' figures kept by a group in arrays of its own (v[t] and base[t]
   from the same trial; base NULL: no baseline). Neither array may have been sorted. */
void bench_report_trials(struct bench_ctx *b, const char *group, const char *op,
                         const double *v, const double *base, int n,
                         const char *baseline_name, const char *unit, int lower_is_better);
/* Reports p as one row (bench_report's columns, plus the spread and the trial count). */
void bench_report_pair(struct bench_ctx *b, const char *group, const char *op,
                       const struct bench_pair *p, const char *baseline_name,
                       const char *unit, int lower_is_better);

/* ---- helper processes (spawn.c) -----------------------------------------------------------
   A helper is this binary again, started with fork and exec of /proc/self/exe as
   `kvvm-bench --helper ROLE SHMFD [FD...]`, never a bare fork: a child forked from a process
   that used the CUDA driver cannot use it (cuInit fails CUDA_ERROR_NOT_INITIALIZED, and the
   emulated device refuses it too), and the groups run after contexts were opened here. The
   role's argument is plain bytes (no pointers: struct bench_wire for a configuration) in
   shared memory that the helper maps too, so it can write its results there. */
struct bench_shm { void *p; size_t len; int fd; };
/* len bytes of zeroed shared memory: 0, or -errno. */
int bench_shm_new(struct bench_shm *s, size_t len);
void bench_shm_free(struct bench_shm *s);
/* A kvvm_config as plain bytes: its strings copied inline, its pointers cleared. */
struct bench_wire {
    struct kvvm_config c;
    char spill_dir[256], store_url[512], pool_socket[108], client_name[64];
};
/* -ENAMETOOLONG: a string does not fit. */
int bench_wire_put(struct bench_wire *w, const struct kvvm_config *c);
/* *c as w holds it (its strings point into w). */
void bench_wire_get(const struct bench_wire *w, struct kvvm_config *c);
/* The roles (`kvvm-bench --helper ROLE`): fn(the argument, the descriptors kept open for it,
   their count), returning 0 or -errno (the helper's exit status is its errno). */
typedef int (*bench_role_fn)(void *arg, const int *fds, int n_fds);
#define BENCH_HELPER_FDS 4
/* Starts role with arg (its shared memory) and fds (at most BENCH_HELPER_FDS, kept open in
   the helper; the caller closes its copies) in a helper; *pid to wait for. 0, or -errno. */
int bench_helper_start(const char *role, const struct bench_shm *arg, const int *fds,
                       int n_fds, pid_t *pid);
/* A helper driven through two pipes: *to its requests' (written here), *from its answers'
   (read here); the role gets fds { the requests' end, the answers' end }. 0, or -errno. */
int bench_helper_piped(const char *role, const struct bench_shm *arg, pid_t *pid, int *to,
                       int *from);
/* In a forked child: becomes the helper (arg's and fds' descriptors kept across the exec).
   Never returns: status ENOEXEC if the exec failed. */
void bench_helper_exec(const char *role, const struct bench_shm *arg, const int *fds,
                       int n_fds) __attribute__((noreturn));
/* The roles, each in its group's file (weak: a group left out has none). */
int bench_handoff_b(void *arg, const int *fds, int n_fds) __attribute__((weak));
int bench_handoff_sys(void *arg, const int *fds, int n_fds) __attribute__((weak));
int bench_handoff_xsys(void *arg, const int *fds, int n_fds) __attribute__((weak));
int bench_share_sys(void *arg, const int *fds, int n_fds) __attribute__((weak));
int bench_calls_traced(void *arg, const int *fds, int n_fds) __attribute__((weak));
int bench_pool_a(void *arg, const int *fds, int n_fds) __attribute__((weak));
int bench_pool_sys(void *arg, const int *fds, int n_fds) __attribute__((weak));
/* main()'s entry of a helper (argv[1] is "--helper"): its exit status. */
int bench_helper_main(int argc, char **argv);

/* System calls of the calling thread, counted by tracing (syscount.c says how): role runs in
   a helper with arg (bench_helper_start; no descriptor); every system call it makes after
   bench_syscall_mark(k) and before the next mark counts in counts[k] (k < 0 or >=
   n_segments: uncounted). 0, -EPERM (tracing refused here), or the role's failure as
   -errno. */
int bench_syscalls(const char *role, const struct bench_shm *arg, uint64_t *counts,
                   int n_segments);
void bench_syscall_mark(int segment);

/* Benchmark groups (each in its own file; missing ones are skipped). Return 0 or -errno. */
int bench_vmm(struct bench_ctx *b) __attribute__((weak));     /* bench_vmm.c    (foundation) */
int bench_paging(struct bench_ctx *b) __attribute__((weak));  /* bench_paging.c (paging)     */
int bench_swap(struct bench_ctx *b) __attribute__((weak));    /* bench_swap.c   (swap)       */
int bench_spill(struct bench_ctx *b) __attribute__((weak));   /* bench_spill.c  (spill)      */
int bench_checksum(struct bench_ctx *b) __attribute__((weak)); /* bench_checksum.c (checksum) */
int bench_scale(struct bench_ctx *b) __attribute__((weak));   /* bench_scale.c  (policy cost vs pool size) */
int bench_calls(struct bench_ctx *b) __attribute__((weak));   /* bench_calls.c  (driver calls) */
int bench_frames(struct bench_ctx *b) __attribute__((weak));  /* bench_frames.c (frame pool) */
int bench_prefix(struct bench_ctx *b) __attribute__((weak));  /* bench_prefix.c (prefix cache) */
int bench_store(struct bench_ctx *b) __attribute__((weak));   /* bench_store.c  (shared store) */
int bench_view(struct bench_ctx *b) __attribute__((weak));    /* bench_view.c   (pool view) */
int bench_daemon(struct bench_ctx *b) __attribute__((weak));    /* bench_pool.c (group pool: kvvmd) */
/* kvvm-bench --pool-hold SOCKET FD (bench_pool.c's death row: a client to kill). */
int bench_daemon_hold(const char *sock, int fd) __attribute__((weak));
int bench_handoff(struct bench_ctx *b) __attribute__((weak)); /* bench_handoff.c (hand-off) */
/* The handoff group's shared prefix index rows (bench_share.c): a (a client of the daemon on
   sock, opened with base) publishes sequence s's first 64 blocks; 0 or -errno. */
typedef struct kvvm kvvm;
int bench_share_rows(struct bench_ctx *b, const struct kvvm_config *base, const char *sock,
                     kvvm *a, uint64_t s);

#endif
