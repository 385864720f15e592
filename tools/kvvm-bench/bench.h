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

/* System calls of the calling thread, counted by tracing (syscount.c says how): fn(arg) runs
   in a forked child; every system call it makes after bench_syscall_mark(k) and before the
   next mark counts in counts[k] (k < 0 or >= n_segments: uncounted). fn opens its own
   context (a context does not survive a fork). 0, -EPERM (tracing refused here), or fn's
   failure as -errno. */
int bench_syscalls(int (*fn)(void *), void *arg, uint64_t *counts, int n_segments);
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
