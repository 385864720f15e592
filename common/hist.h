/*
 * common/hist.h: latency histograms with fixed buckets, for kvvm_metrics (core/metrics.c).
 *
 * Contract: khist_add records one duration with relaxed atomic adds into fixed buckets (no
 * lock, no system call, no allocation), so any thread may record on a hot path; the
 * caller measures the duration with the clock reads it already makes (know_ns).
 * khist_read copies a histogram with relaxed loads: a copy taken while others record may
 * miss their last adds, never invents one. The buckets are the upper bounds below
 * (Prometheus's `le`, in seconds): 1 us to 10 s in 1 / 2.5 / 5 steps, then +Inf; each
 * bucket counts the durations in (previous bound, bound], the exposition sums them
 * (cumulative buckets) and takes the count from the same sums (count == the +Inf bucket).
 */
#ifndef KVVM_COMMON_HIST_H
#define KVVM_COMMON_HIST_H

#include <stdint.h>

/* The buckets' upper bounds: X(nanoseconds, the `le` label as written). */
#define KHIST_BOUNDS(X)                                                                  \
    X(1000, "1e-06") X(2500, "2.5e-06") X(5000, "5e-06")                                 \
    X(10000, "1e-05") X(25000, "2.5e-05") X(50000, "5e-05")                              \
    X(100000, "0.0001") X(250000, "0.00025") X(500000, "0.0005")                         \
    X(1000000, "0.001") X(2500000, "0.0025") X(5000000, "0.005")                         \
    X(10000000, "0.01") X(25000000, "0.025") X(50000000, "0.05")                         \
    X(100000000, "0.1") X(250000000, "0.25") X(500000000, "0.5")                         \
    X(1000000000, "1") X(2500000000, "2.5") X(5000000000, "5") X(10000000000, "10")

enum {
#define KHIST_X(ns, le) KHIST_B_##ns,
    KHIST_BOUNDS(KHIST_X)
#undef KHIST_X
    KHIST_FINITE,                 /* buckets with a finite bound */
    KHIST_N = KHIST_FINITE + 1    /* and +Inf */
};

struct khist {
    uint64_t n[KHIST_N];          /* durations per bucket (not cumulative); atomic */
    uint64_t sum_ns;              /* their sum, ns; atomic */
};

/* The bucket of a duration of ns nanoseconds. */
static inline unsigned khist_bucket(uint64_t ns)
{
    static const uint64_t bound[KHIST_FINITE] = {
#define KHIST_X(b, le) (uint64_t)b##ull,
        KHIST_BOUNDS(KHIST_X)
#undef KHIST_X
    };
    unsigned i = 0;
    while (i < KHIST_FINITE && ns > bound[i])
        i++;
    return i;
}

static inline void khist_add(struct khist *h, uint64_t ns)
{
    __atomic_fetch_add(&h->n[khist_bucket(ns)], 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&h->sum_ns, ns, __ATOMIC_RELAXED);
}

static inline void khist_read(const struct khist *h, struct khist *out)
{
    for (unsigned i = 0; i < KHIST_N; i++)
        out->n[i] = __atomic_load_n(&h->n[i], __ATOMIC_RELAXED);
    out->sum_ns = __atomic_load_n(&h->sum_ns, __ATOMIC_RELAXED);
}

#endif
