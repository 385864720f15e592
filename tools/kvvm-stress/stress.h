/*
 * tools/kvvm-stress/stress.h: the oversubscription stress tester's shared declarations.
 *
 * Contract: kvvm-stress drives libkvvm through the public API (include/kvvm.h) only, the way a
 * continuous-batching inference engine would, with real bytes in every token of every region.
 * It never dereferences a device address, so the same run works on the emulated device, in
 * its opaque mode and on a GPU. Files:
 *   main.c    options, presets, sizing, opening the context, exit status
 *   engine.c  the engine simulation: arrivals, scheduler, prefill, batched decode, forks,
 *             shared prompt, beams, preemption (swap / auto / recompute), the final drain
 *   verify.c  the byte pattern of (lineage, token, region), writes and verification
 *   report.c  latency samples, the progress line, the summary, JSON, CSV trace and SVG plot
 * Exit status: 0 = every verification passed and no unexpected error; 1 = a mismatch or an
 * unexpected error; 2 = bad usage or the context could not be opened.
 */
#ifndef KVVM_STRESS_H
#define KVVM_STRESS_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "kvvm.h"

enum preempt_mode { PREEMPT_SWAP = 0, PREEMPT_AUTO = 1, PREEMPT_RECOMPUTE = 2 };
extern const char *const preempt_names[3];

/* A long-tailed length distribution: log-normal with this median and sigma, clipped. */
struct dist {
    double median, sigma;
    uint64_t min, max;
};

#define STRESS_PK_PROMPTS_MAX 64   /* --prefix-prompts at most */

struct opts {
    const char *preset;             /* model preset name */
    uint32_t layers, kv_heads, head_dim, dtype_bytes;
    int      token_major;           /* --layout token: 1 region; else 2*layers regions */
    uint32_t n_regions;
    uint64_t bytes_per_token;       /* per region */
    size_t   page_size;             /* 0 = the device granule */
    int      page_size_auto;        /* not given: 64 KiB on the emulated device */
    int      backend;               /* enum kvvm_backend */
    int      stream;                /* --stream: engine stream mode */
    int      preempt;               /* enum preempt_mode, as asked */
    double   oversubscribe;         /* X */
    size_t   device_budget, host_budget, spill_budget; /* 0 = derived from X */
    const char *spill_dir;          /* NULL after --no-disk */
    uint64_t seed;
    uint64_t steps;                 /* 0 = no step limit */
    double   duration_s;            /* 0 = no time limit */
    struct dist prompt, output;
    uint32_t system_prompt;         /* tokens of the shared system prompt; 0 = none */
    double   p_share;               /* share of requests that start with the system prompt */
    double   p_parallel;            /* share of requests forked into parallel samples */
    uint32_t max_parallel;          /* siblings per parallel request, 2..n */
    double   p_beam;                /* per group and step: fork-and-truncate replacement */
    uint32_t max_batch;             /* running sequences at most */
    uint32_t quantum;               /* steps a request runs before it may be rotated out */
    uint32_t verify_every;          /* steps between sampled verifications; 0 = none */
    uint32_t max_seqs;              /* 0 = derived */
    uint64_t max_tokens;            /* 0 = derived */
    const char *json_path, *trace_path, *plot_path;
    int      quiet;                 /* no progress line even on a terminal */
    int      verbose;
    /* sliding-window layers and the prefix cache (engine.c "window" and "prefix cache") */
    uint64_t window;                /* tokens of a window layer's window; 0 = none */
    uint32_t window_every;          /* layers 0, K, 2K, ... are window layers (per-layer) */
    double   prefix_cache;          /* share of new requests that reuse a cached prompt */
    uint32_t cache_entries;         /* CACHED prefix entries kept at most */
    int      prefix_keyed;          /* --prefix-cache keyed: the library's keyed index */
    uint32_t pk_prompts;            /* --prefix-prompts: its shared prompts (default 4) */
    int      pool_view;             /* --pool-view: KVVM_F_POOL_VIEW, checked at verification */
    int      pool_cpu;              /* the pool view's bytes are CPU-readable (emulated) */
    const char *store_url;          /* --store URL: the shared store (with --prefix-cache
                                       keyed); NULL = none */
    /* --budget-schedule (elastic memory): at t seconds, kvvm_set_budget(frac x the budget
       at open); in time order */
#define MAX_BUDGET_EV 16
    uint32_t n_budget;
    struct budget_ev { double t, frac; } budget_sched[MAX_BUDGET_EV];
    int      metrics_port;          /* --metrics-port: 0..65535 (0: a free one); -1 = off */
    /* the pool (pool.c): --pool N coordinates N client processes; a client (or a single
       run with --pool-socket) opens its context on the daemon's socket */
    uint32_t pool_n;                /* --pool N: 0 = this process runs the engine */
    const char *pool_socket;        /* --pool-socket PATH: the daemon (joined, not started) */
    const char *client_name;        /* --client-name: shown by kvvmctl */
    int      pool_child;            /* --pool-child I (set by the coordinator); -1 = none */
    int      progress_fd;           /* --pool-progress-fd: "STEP SECONDS" lines; -1 = none */
};

/* Latency samples of one operation: exact count, sum and max; a reservoir for percentiles. */
#define LAT_RESERVOIR 65536
struct lat {
    const char *name;
    uint64_t count, sum_ns, max_ns;
    uint32_t n;                     /* samples held */
    uint64_t *samples;
};
enum lat_op { LAT_GROW, LAT_GROW_BATCH, LAT_FORK, LAT_SHARE, LAT_TRUNCATE, LAT_SWAP_OUT,
              LAT_SWAP_IN, LAT_FREE, LAT_WRITE, LAT_READ, LAT_STEP, LAT_N };

/* One point of the occupancy timeline (pages in use per tier). */
struct trace_pt {
    uint64_t step;
    double   t;
    uint64_t dev, host, disk, inflight;
    uint32_t running, off_device, waiting;
};

#define MAX_ERR_LOG 32
struct err_rec { uint64_t step; const char *op; int err; uint64_t req; };

/* Everything the run measured; filled by engine.c, printed by report.c. */
struct results {
    const char *backend, *preempt_effective;
    char     fallback_reason[256];   /* non-empty when the asked preemption fell back */
    char    *lib_json;               /* kvvm_stats_json at the end (malloc'ed) or NULL */
    char     io_engine[64];
    struct kvvm_stats st0, st;       /* at open and at the end */
    uint64_t steps;                  /* steps run */
    double   elapsed_s;              /* the steps' time */
    double   setup_s, drain_s, wall_s;   /* before the first step (the system prompt, the
                                        shared prompts), the final verification and freeing
                                        after the last, and the three together */
    uint64_t tokens_decoded, tokens_prefilled, tokens_recomputed, tokens_written;
    uint64_t requests_admitted, requests_finished, forks, shares, beam_replacements,
             truncates, swap_outs, swap_ins, preempt_recompute, enomem_handled,
             batch_shrinks;
    uint64_t peak_dev, peak_host, peak_disk, peak_inflight;  /* pages */
    double   peak_oversub;           /* max over steps of (dev+host+disk) / device pages */
    double   sum_oversub;            /* sum over sampled steps of the same ratio */
    uint64_t n_oversub;              /* steps sampled into sum_oversub */
    double   sum_steady;             /* the same sum from the first step whose ratio reached
                                        0.9 X on: the ramp up excluded, so the figure does
                                        not depend on how many steps a slow machine ran */
    uint64_t n_steady;               /* steps sampled into sum_steady */
    double   peak_held;              /* max of (dev+host+disk-inflight) / device pages: each
                                        page once, a page in flight between two tiers too */
    double   peak_logical_oversub;   /* max over steps of the workload's own page estimate */
    uint64_t peak_logical_pages;
    uint32_t peak_running, peak_live;
    uint64_t disk_pages_swapped_in;  /* pages seen on disk (seq_info) right before a swap-in */
    uint64_t disk_pages_verified;    /* of those, pages whose sequence later verified clean */
    uint64_t seqs_verified, tokens_verified, bytes_verified, mismatches, mismatched_seqs;
    uint64_t verify_skipped;         /* could not be made readable (-ENOMEM) before a check */
    uint64_t unexpected_errors;
    uint32_t n_err;
    struct err_rec errs[MAX_ERR_LOG];
    struct lat lat[LAT_N];
    struct trace_pt *trace;
    size_t   n_trace, cap_trace;
    /* sliding-window layers and the prefix cache */
    uint64_t discard_calls;          /* kvvm_seq_discard calls (one per window region) */
    double   peak_discard_saving;    /* max over steps of discarded / (held + discarded) */
    double   sum_discard_saving;     /* sum over steps of the same */
    uint64_t peak_discarded_now;     /* max over steps of the pages the discards spare */
    uint64_t cache_puts, cache_hits, cache_misses, cache_evicted;
    uint64_t cache_stale_checked;    /* dropped entries confirmed -ESTALE (never read) */
    uint64_t cache_verified;         /* entries (not dropped) whose bytes verified */
    /* --prefix-cache keyed */
    uint64_t pk_asked, pk_attached;  /* blocks asked of kvvm_prefix_attach, blocks attached */
    uint64_t pk_attach_calls, pk_published, pk_publish_calls; /* new entries published */
    uint64_t pk_from_host, pk_from_disk;  /* of pk_attached: blocks the lookup before the
                                             attach placed on the host / disk tier */
    uint64_t pk_from_pool;           /* of pk_attached: blocks the lookup placed in the pool
                                        daemon's shared index (KVVM_TIER_POOL: another
                                        client published them) */
    uint64_t pk_copied;              /* bytes_to_device moved by the attaches (bytes): 0 when
                                        every attached block was mapped, none copied */
    /* --pool-view */
    uint64_t pv_seqs, pv_blocks;     /* sequences and block ids checked */
    uint64_t pv_bytes;               /* bytes compared through the pool view */
    uint64_t pv_eagain;              /* block tables refused (-EAGAIN: not resident) */
    uint64_t pv_bad_ids, pv_mismatches;
    /* elastic memory: each budget change of the schedule, and the frames created on the
       engine's thread (frames_created_sync) at the end of the warm-up */
    struct budget_rec {
        double   t;                  /* seconds into the run */
        uint64_t step;
        size_t   bytes;              /* the budget asked for */
        int      rc;                 /* kvvm_set_budget's result */
        double   back_ms;            /* set_budget + kvvm_sync: until the memory is back */
        uint64_t held_before, held_after;       /* device_bytes_held */
        uint64_t frames_released, swap_outs;    /* what the change released and moved */
        uint64_t pages_before, pages_after;     /* device pages in use */
    } budget[MAX_BUDGET_EV];
    uint32_t n_budget;
    uint64_t sync_at_warm, warm_step; /* frames_created_sync at warm_step */
    double   warm_s;
    /* the pool (with pool_socket): kvvm_pool_info before the close */
    int      pool_ok;                /* pool_end was read */
    struct kvvm_pool_info pool_end;
    int      aborted;                /* the run stopped early on a fatal error */
    int      interrupted;            /* the signal (SIGINT, SIGTERM) that ended it early, or 0 */
};

/* main.c: set to the signal number by the first SIGINT/SIGTERM; the engine then stops at the
   next step boundary and drains as at the end of --duration. */
extern volatile sig_atomic_t stress_stop;

/* pool.c: --pool N, the coordinator (page: the page size asked, 0 = the device's; granule:
   the emulated device's). Returns the exit status. */
int stress_pool_main(const struct opts *o, int argc, char **argv, size_t page, size_t granule);

/* engine.c */
int stress_run(const struct opts *o, kvvm *kv, struct results *r);

/* verify.c: the byte pattern; fills len bytes of token `token` in `region` of `lineage`. */
void pattern_fill(uint64_t lineage, uint64_t token, uint32_t region, void *buf, size_t len);
/* Index of the first byte of buf that differs from the pattern, or -1 when it matches. */
long pattern_check(uint64_t lineage, uint64_t token, uint32_t region, const void *buf,
                   size_t len, uint64_t *expect_word, uint64_t *got_word);

/* metrics.c: --metrics-port's server of kvvm_metrics on 127.0.0.1 (tools/common/httpd.h),
   its address printed to info; stop prints what it answered. start: 0 or -errno (the
   reason printed). */
struct tool_httpd;
int  stress_metrics_start(kvvm *kv, int port, FILE *info, struct tool_httpd **out);
void stress_metrics_stop(struct tool_httpd *h, FILE *info);

/* report.c */
uint64_t now_ns(void);
void lat_init(struct lat *l, const char *name);
void lat_add(struct lat *l, uint64_t ns, uint64_t *rng);
void lat_pct(struct lat *l, double *p50_us, double *p99_us, double *max_us);
void lat_free(struct lat *l);
int  trace_add(struct results *r, const struct trace_pt *p);
void progress_line(const struct opts *o, const struct results *r, const struct kvvm_stats *st,
                   double t, int final);
void report_summary(FILE *f, const struct opts *o, const struct results *r, int exit_status);
int  report_json(const char *path, const struct opts *o, const struct results *r,
                 int exit_status);
int  report_trace(const char *path, const struct results *r);
int  report_svg(const char *path, const struct opts *o, const struct results *r);
void record_error(struct results *r, uint64_t step, const char *op, int err, uint64_t req);

/* Small deterministic generator (splitmix64 / xoshiro-free): one stream per run. */
static inline uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline double rng_unit(uint64_t *s) { return (rng_next(s) >> 11) * 0x1.0p-53; }

#endif
