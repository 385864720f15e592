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

#endif
