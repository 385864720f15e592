/*
 * engine.c: a continuous-batching inference engine, simulated over libkvvm's public API.
 *
 * Each step (one engine iteration, closed by kvvm_step):
 *   1. arrivals: new requests (long-tailed prompt and output lengths) join the live set while
 *      the KV held in every tier is below X x the device pages (and the workload's own page
 *      estimate below 1.25 X, so a library that holds nothing off the device does not make
 *      the queue grow without end);
 *   2. rotation (swap and auto modes): requests that ran for --quantum steps (half of it
 *      while prompts are queued) leave the device while others wait, so every live request
 *      makes progress although only about 1/X of them fit: swap mode by kvvm_seq_swap_out,
 *      auto mode by leaving the batch (the library reclaims least recently used, unprotected
 *      sequences);
 *   3. bring-in, queued prompts first, then round robin: swap-in (swap mode), prefill of new
 *      requests (create, share the system prompt, grow to the prompt, write every token),
 *      re-prefill of requests preempted by recompute (their bytes rewritten), re-entry (auto
 *      mode);
 *      parallel sampling forks a freshly prefilled request into siblings;
 *   4. decode: one kvvm_seq_grow_batch over the whole batch, then one token written per
 *      sequence and region; -ENOMEM preempts the most recently scheduled request (swap-out,
 *      or free-and-recompute) and retries;
 *   5. finished requests are verified and freed; beam-like groups replace a member by a fork
 *      of another, truncated a few tokens back (fork + truncate + copy-on-write + free);
 *   6. sampled verification; occupancy per tier recorded; kvvm_step.
 * At the end every live sequence is verified and freed.
 *
 * Preemption fallback: kvvm_seq_swap_out returning -EOPNOTSUPP (a library built without the
 * swap tier), kvvm_open refusing KVVM_F_AUTO_SWAP, or auto mode running out of device pages
 * while the library never swapped anything out switch the run to recompute, once, with a log
 * line and a JSON field. The measured oversubscription is whatever the library's counters
 * show; the tool never infers it from its own bookkeeping.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "stress.h"

const char *const preempt_names[3] = { "swap", "auto", "recompute" };

enum rstate { R_WAITING, R_RUNNING, R_IDLE, R_SWAPPED, R_PREEMPTED, R_SYSTEM };
static const char *const state_names[] = { "waiting", "running", "idle", "swapped",
                                           "preempted", "system" };

enum hev { EV_PREFILL, EV_REPREFILL, EV_FORK, EV_SWAP_OUT, EV_SWAP_IN, EV_IDLE, EV_RUN,
           EV_RECOMPUTE_FREE, EV_TRUNCATE, EV_VERIFY };
static const char *const ev_names[] = { "prefill", "re-prefill", "forked", "swap-out",
                                        "swap-in", "left batch", "joined batch",
                                        "preempted (freed)", "truncated", "verified" };

#define HIST 12
struct hist { uint64_t step; uint8_t ev; int8_t known; uint32_t d, h, k; uint64_t len; };

struct seg { uint64_t start, lineage; };   /* tokens from start on were written by lineage */

struct req {
    uint64_t id, lineage, parent;
    kvvm_seq seq;                  /* 0 when not materialized */
    int      state;
    uint64_t len, prompt, target;  /* tokens now, prompt (with system prompt), at the end */
    uint64_t sys_prefix;           /* system prompt tokens shared at creation (0 = none) */
    uint32_t group;                /* parallel/beam group, 0 = none */
    uint64_t sched_step, key;      /* when it joined the batch; FCFS key when off device */
    uint64_t arrival;              /* step it arrived */
    uint64_t disk_pages_pending;   /* seen on disk before a swap-in, not yet verified */
    struct seg *segs;
    uint32_t nseg, capseg;
    struct hist hist[HIST];
    uint32_t nhist;
    uint64_t wkept;                /* first_kept of its window regions (kvvm_seq_discard) */
    uint64_t cache_id, cache_len;  /* the prefix-cache entry it shares, and how much */
    uint32_t pid;                  /* --prefix-cache keyed: its shared prompt + 1, 0 = none */
};

struct eng {
    const struct opts *o;
    kvvm *kv;
    struct results *r;
    void *stream;
    uint64_t rng;                  /* the workload's decisions: depends on --seed only */
    uint64_t lat_rng;              /* latency reservoir sampling, kept apart from the workload */
    int eff;                       /* effective preemption mode */
    uint64_t step, next_id, next_lineage, next_group;
    uint64_t page;                 /* bytes */
    uint64_t max_fit;              /* longest request whose pages fill half the device */
    uint64_t dev_pages;
    struct req **live;             /* every request not finished, system prompt excluded */
    size_t nlive, caplive;
    struct req *sys;               /* the shared system prompt, or NULL */
    uint32_t seqs_in_use;          /* library slots held (system prompt included) */
    unsigned char *buf;            /* write/read staging */
    size_t bufsz;
    unsigned char *dbuf;           /* decode step writes (kept until the step's sync) */
    size_t dbufsz;
    kvvm_seq *bseqs;
    uint64_t *blens;
    struct req **breqs;
    struct kvvm_stats st;
    int fatal;
    int draining;                  /* final verification: one request at a time, no groups */
    int swap_enomem_logged, mismatch_lines;
    uint64_t t0;                   /* the first step's start (warm-up, budget schedule) */
    uint64_t deadline;             /* --duration: now_ns() past which no step and no
                                      prefill starts (from the run's start: the setup
                                      counts); 0 = none */
    struct req **cache;            /* prefix-cache entries (CACHED sequences), oldest first */
    uint32_t n_cache;
    uint64_t next_cache_id;
    uint32_t tpb;                  /* tokens per block (kvvm_block_tokens) */
    uint64_t pk_len[STRESS_PK_PROMPTS_MAX];   /* --prefix-cache keyed: each shared prompt's
                                                 tokens (o->pk_prompts of them) */
    uint64_t *pool_base;           /* --pool-view: kvvm_pool_base of each region */
    uint32_t pool_ids;             /* kvvm_pool_blocks */
};

/* ---- keyed prefix cache (--prefix-cache keyed) ---------------------------------------------
   o->pk_prompts shared prompts (--prefix-prompts, default 4) of 1, 2, 3, 4, 1, ... blocks;
   prompt p's tokens are written by lineage PK_LINEAGE + p, so a block's bytes are a function of (prompt, block, region, offset) and
   its token ids (tok_at) a function of the lineage that wrote each position: equal keys
   (kvvm_prefix_keys over the ids) name equal bytes, and verify_req checks attached blocks as
   it checks every other token. */
#define PK_NS 1
#define PK_LINEAGE (1ull << 62)

static int is_expected(int err) { return err == -ENOMEM || err == -ENOSPC; }

static void fail(struct eng *e, const char *op, int err, struct req *q)
{
    const char *why = kvvm_last_error();   /* the failed call's own words, if it left some */
    record_error(e->r, e->step, op, err, q ? q->id : 0);
    if (e->r->unexpected_errors <= 20)
        fprintf(stderr, "kvvm-stress: step %llu: %s%s%llu failed: %s (%d)%s%s\n",
                (unsigned long long)e->step, op, q ? " of request " : "",
                q ? (unsigned long long)q->id : 0ull, kvvm_strerror(err), err,
                why && *why ? ": " : "", why && *why ? why : "");
    if (err == -EIO || e->r->unexpected_errors > 100)
        e->fatal = 1;
}

static uint64_t lat_call_start(void) { return now_ns(); }
static void lat_end(struct eng *e, int op, uint64_t t)
{
    lat_add(&e->r->lat[op], now_ns() - t, &e->lat_rng);
}

/* Pages a request of len tokens needs, ignoring sharing (the workload's own estimate). */
static uint64_t pages_for(const struct eng *e, uint64_t len)
{
    uint64_t b = len * e->o->bytes_per_token;
    return (uint64_t)e->o->n_regions * ((b + e->page - 1) / e->page);
}

static void refresh_stats(struct eng *e)
{
    e->st.size = sizeof e->st;
    int err = kvvm_stats(e->kv, &e->st);
    if (err)
        fail(e, "kvvm_stats", err, NULL);
}

static void hist_add(struct eng *e, struct req *q, int ev, int query)
{
    struct hist *h = &q->hist[q->nhist % HIST];
    memset(h, 0, sizeof *h);
    h->step = e->step;
    h->ev = (uint8_t)ev;
    h->len = q->len;
    if (query && q->seq) {
        struct kvvm_seq_info in = { .size = sizeof in };
        if (kvvm_seq_info(e->kv, q->seq, &in) == 0) {
            h->known = 1;
            h->d = in.pages_device;
            h->h = in.pages_host;
            h->k = in.pages_disk;
        }
    }
    q->nhist++;
}

static int seg_push(struct req *q, uint64_t start, uint64_t lineage)
{
    if (q->nseg && q->segs[q->nseg - 1].start == start) {
        q->segs[q->nseg - 1].lineage = lineage;
        return 0;
    }
    if (q->nseg == q->capseg) {
        uint32_t c = q->capseg ? q->capseg * 2 : 4;
        struct seg *s = realloc(q->segs, c * sizeof *s);
        if (!s)
            return -ENOMEM;
        q->segs = s;
        q->capseg = c;
    }
    q->segs[q->nseg].start = start;
    q->segs[q->nseg].lineage = lineage;
    q->nseg++;
    return 0;
}

static void seg_truncate(struct req *q, uint64_t len)
{
    while (q->nseg > 1 && q->segs[q->nseg - 1].start >= len)
        q->nseg--;
}

static int live_add(struct eng *e, struct req *q)
{
    if (e->nlive == e->caplive) {
        size_t c = e->caplive ? e->caplive * 2 : 256;
        struct req **l = realloc(e->live, c * sizeof *l);
        if (!l)
            return -ENOMEM;
        e->live = l;
        e->caplive = c;
    }
    e->live[e->nlive++] = q;
    return 0;
}

static void req_destroy(struct req *q)
{
    if (!q)
        return;
    free(q->segs);
    free(q);
}

/* Removes q from the live list (order of the others is kept: the run stays reproducible and
   FCFS scans see a stable order). */
static void live_remove(struct eng *e, struct req *q)
{
    for (size_t i = 0; i < e->nlive; i++)
        if (e->live[i] == q) {
            memmove(&e->live[i], &e->live[i + 1], (e->nlive - i - 1) * sizeof *e->live);
            e->nlive--;
            return;
        }
}

static uint64_t sample_len(struct eng *e, const struct dist *d)
{
    double u1 = rng_unit(&e->rng), u2 = rng_unit(&e->rng);
    double z = sqrt(-2.0 * log(u1 > 0 ? u1 : 1e-300)) * cos(2 * M_PI * u2);
    double v = d->median * exp(d->sigma * z);
    uint64_t n = v < 1 ? 1 : (uint64_t)llround(v);
    if (n < d->min)
        n = d->min;
    if (n > d->max)
        n = d->max;
    return n;
}

/* ---- bytes ----------------------------------------------------------------------------- */

/* Stream mode: every host buffer of the tool is pageable (malloc), so kvvm_seq_write may
   reuse it as soon as the call returns (the driver stages it) and kvvm_seq_read returns with
   the bytes in place (include/kvvm.h): no write or read waits for the engine stream. The
   one kvvm_sync per step (before the occupancy is recorded) is for --seed reproducibility:
   device pages freed behind the stream (deferred unmaps after swap-outs) come back when the
   stream passes them, so without it the free counts the scheduler reads, and its decisions,
   would depend on timing. */

/* Writes tokens [a, b) of q in every region, each with the lineage its segment names. */
static int write_range(struct eng *e, struct req *q, uint64_t a, uint64_t b)
{
    const uint64_t bpt = e->o->bytes_per_token;
    const uint64_t per = e->bufsz / bpt;
    for (uint32_t r = 0; r < e->o->n_regions; r++) {
        uint32_t si = 0;
        for (uint64_t t = a; t < b;) {
            uint64_t n = b - t < per ? b - t : per;
            for (uint64_t i = 0; i < n; i++) {
                while (si + 1 < q->nseg && q->segs[si + 1].start <= t + i)
                    si++;
                pattern_fill(q->segs[si].lineage, t + i, r, e->buf + i * bpt, bpt);
            }
            uint64_t t1 = lat_call_start();
            int err = kvvm_seq_write(e->kv, q->seq, r, t * bpt, e->buf, n * bpt);
            lat_end(e, LAT_WRITE, t1);
            if (err) {
                fail(e, "kvvm_seq_write", err, q);
                return err;
            }
            e->r->tokens_written += n;
            t += n;
        }
    }
    return 0;
}

static void report_mismatch(struct eng *e, struct req *q, uint64_t t, uint32_t r, long byte,
                            uint64_t lin, uint64_t ew, uint64_t gw)
{
    if (e->mismatch_lines++ >= 20)
        return;
    const char *origin = lin == q->lineage ? "its own" :
                         (e->sys && lin == e->sys->lineage) ? "the shared system prompt's" :
                         "an ancestor's (inherited by fork)";
    fprintf(stderr,
            "kvvm-stress: MISMATCH request %llu (seq 0x%llx, %s, lineage %llu, parent %llu) "
            "token %llu region %u byte %ld: expected word 0x%016llx, got 0x%016llx; token "
            "written by %s lineage %llu\n  tier history:",
            (unsigned long long)q->id, (unsigned long long)q->seq, state_names[q->state],
            (unsigned long long)q->lineage, (unsigned long long)q->parent,
            (unsigned long long)t, r, byte, (unsigned long long)ew, (unsigned long long)gw,
            origin, (unsigned long long)lin);
    uint32_t first = q->nhist > HIST ? q->nhist - HIST : 0;
    for (uint32_t i = first; i < q->nhist; i++) {
        const struct hist *h = &q->hist[i % HIST];
        fprintf(stderr, " [step %llu %s len %llu", (unsigned long long)h->step,
                ev_names[h->ev], (unsigned long long)h->len);
        if (h->known)
            fprintf(stderr, " dev/host/disk pages %u/%u/%u", h->d, h->h, h->k);
        fprintf(stderr, "]");
    }
    fprintf(stderr, "\n");
}

/* ---- sliding-window layers (--window, --window-every) -------------------------------------
   Layers 0, K, 2K, ... of the per-layer layout attend to the last --window tokens only: their
   K and V regions discard (kvvm_seq_discard) the pages wholly before the window each time its
   start crosses a page. Their tokens below wkept are gone: never written, read or checked. */
static int is_window_region(const struct eng *e, uint32_t r)
{
    return e->o->window && !e->o->token_major && (r / 2) % e->o->window_every == 0;
}

static void window_discard(struct eng *e, struct req *q)
{
    const struct opts *o = e->o;
    if (!o->window || o->token_major || !q->seq || q->len <= o->window)
        return;
    uint64_t fk = q->len - o->window, tpp = e->page / o->bytes_per_token;
    if (!tpp)
        tpp = 1;
    if (fk / tpp <= q->wkept / tpp)
        return;                         /* no new whole page before the window */
    for (uint32_t r = 0; r < o->n_regions; r++) {
        if (!is_window_region(e, r))
            continue;
        int err = kvvm_seq_discard(e->kv, q->seq, r, fk);
        e->r->discard_calls++;
        if (err) {
            fail(e, "kvvm_seq_discard", err, q);
            return;
        }
    }
    q->wkept = fk;
}

/* Pages the discards of q spare now (the window regions' pages wholly before wkept). */
static uint64_t discarded_pages(const struct eng *e, const struct req *q)
{
    uint64_t n = 0;
    for (uint32_t r = 0; q->seq && r < e->o->n_regions; r++)
        if (is_window_region(e, r))
            n += q->wkept * e->o->bytes_per_token / e->page;
    return n;
}

/* --pool-view: q's block ids (kvvm_seq_block_table) are valid, and where device memory is
   CPU-readable (emulated, not emu_opaque) the bytes at pool_base(r) + id * page_size are the
   tokens' pattern (what verify_req read through the window). Returns the mismatches found. */
static uint64_t pool_check(struct eng *e, struct req *q)
{
    const uint64_t bpt = e->o->bytes_per_token, T = e->tpb;
    uint64_t nb = T ? (q->len + T - 1) / T : 0, bad = 0;
    if (!nb)
        return 0;
    int32_t *ids = malloc(nb * sizeof *ids);
    if (!ids)
        return 0;
    int err = kvvm_seq_block_table(e->kv, q->seq, 0, (uint32_t)nb, ids);
    if (err == -EAGAIN) {
        e->r->pv_eagain++;              /* not resident: expected, skipped */
        free(ids);
        return 0;
    }
    if (err) {
        fail(e, "kvvm_seq_block_table", err, q);
        free(ids);
        return 0;
    }
    int all_window = 1;                 /* -1 is right only for a block gone in every region */
    for (uint32_t r = 0; r < e->o->n_regions; r++)
        all_window &= is_window_region(e, r);
    if (e->stream && e->o->pool_cpu)
        kvvm_sync(e->kv);               /* the copies that moved those bytes are done */
    e->r->pv_seqs++;
    for (uint64_t b = 0; b < nb; b++) {
        int gone = all_window && (b + 1) * T <= q->wkept;
        if (ids[b] == -1 ? !gone : (ids[b] < 0 || (uint32_t)ids[b] >= e->pool_ids)) {
            if (e->r->pv_bad_ids++ < 10)
                fprintf(stderr, "kvvm-stress: MISMATCH pool view: request %llu block %llu "
                        "has id %d (ids < %u)\n", (unsigned long long)q->id,
                        (unsigned long long)b, ids[b], e->pool_ids);
            bad++;
            continue;
        }
        e->r->pv_blocks++;
        if (!e->o->pool_cpu || ids[b] < 0)
            continue;
        for (uint32_t r = 0; r < e->o->n_regions; r++) {
            const unsigned char *pb = (const unsigned char *)(uintptr_t)
                (e->pool_base[r] + (uint64_t)ids[b] * e->page);
            uint32_t si = 0;
            for (uint64_t t = b * T; t < (b + 1) * T && t < q->len; t++) {
                if (is_window_region(e, r) && t < q->wkept)
                    continue;           /* discarded in this region */
                while (si + 1 < q->nseg && q->segs[si + 1].start <= t)
                    si++;
                uint64_t ew = 0, gw = 0;
                long at = pattern_check(q->segs[si].lineage, t, r, pb + (t - b * T) * bpt,
                                        bpt, &ew, &gw);
                e->r->pv_bytes += bpt;
                if (at >= 0) {
                    if (e->r->pv_mismatches++ < 10)
                        fprintf(stderr, "kvvm-stress: MISMATCH pool view: request %llu token "
                                "%llu region %u (block id %d) byte %ld: expected 0x%016llx, "
                                "got 0x%016llx\n", (unsigned long long)q->id,
                                (unsigned long long)t, r, ids[b], at,
                                (unsigned long long)ew, (unsigned long long)gw);
                    bad++;
                }
            }
        }
    }
    free(ids);
    return bad;
}

/* Reads every token of q back and checks it. 0 = clean, 1 = mismatch, <0 = the read failed.
   q must be resident (or readable) now. */
static int verify_req(struct eng *e, struct req *q)
{
    const uint64_t bpt = e->o->bytes_per_token;
    const uint64_t per = e->bufsz / bpt;
    uint64_t bad = 0;
    for (uint32_t r = 0; r < e->o->n_regions; r++) {
        uint32_t si = 0;
        /* a window region's tokens below wkept were discarded: not checked */
        for (uint64_t t = is_window_region(e, r) ? q->wkept : 0; t < q->len;) {
            uint64_t n = q->len - t < per ? q->len - t : per;
            uint64_t t1 = lat_call_start();
            int err = kvvm_seq_read(e->kv, q->seq, r, t * bpt, e->buf, n * bpt);
            lat_end(e, LAT_READ, t1);
            if (err) {
                fail(e, "kvvm_seq_read", err, q);
                return err;
            }
            for (uint64_t i = 0; i < n; i++) {
                while (si + 1 < q->nseg && q->segs[si + 1].start <= t + i)
                    si++;
                uint64_t ew = 0, gw = 0;
                long b = pattern_check(q->segs[si].lineage, t + i, r, e->buf + i * bpt, bpt,
                                       &ew, &gw);
                if (b >= 0) {
                    bad++;
                    report_mismatch(e, q, t + i, r, b, q->segs[si].lineage, ew, gw);
                }
            }
            e->r->bytes_verified += n * bpt;
            t += n;
        }
    }
    if (e->pool_base)
        bad += pool_check(e, q);
    e->r->seqs_verified++;
    e->r->tokens_verified += q->len;
    hist_add(e, q, EV_VERIFY, 0);
    if (bad) {
        e->r->mismatches += bad;
        e->r->mismatched_seqs++;
        return 1;
    }
    e->r->disk_pages_verified += q->disk_pages_pending;
    q->disk_pages_pending = 0;
    return 0;
}

/* ---- sequence operations ------------------------------------------------------------------ */

static int do_free(struct eng *e, struct req *q)
{
    if (!q->seq)
        return 0;
    uint64_t t = lat_call_start();
    int err = kvvm_seq_free(e->kv, q->seq);
    lat_end(e, LAT_FREE, t);
    if (err)
        fail(e, "kvvm_seq_free", err, q);
    q->seq = 0;
    e->seqs_in_use--;
    return err;
}

static void fallback(struct eng *e, const char *why)
{
    if (e->eff == PREEMPT_RECOMPUTE)
        return;
    snprintf(e->r->fallback_reason, sizeof e->r->fallback_reason, "%s", why);
    fprintf(stderr, "kvvm-stress: --preempt %s unavailable: %s; preempting by recompute "
            "instead (victims are freed and re-prefilled later, no KV is held off the "
            "device, so the requested oversubscription cannot be reached)\n",
            preempt_names[e->eff], why);
    e->eff = PREEMPT_RECOMPUTE;
}

/* Preempts q by recompute: its KV is dropped now and rebuilt (bytes rewritten) later. */
static int preempt_recompute(struct eng *e, struct req *q)
{
    hist_add(e, q, EV_RECOMPUTE_FREE, 0);
    int err = do_free(e, q);
    q->state = R_PREEMPTED;
    q->key = q->arrival;           /* back at the head of the queue, as vLLM does */
    e->r->preempt_recompute++;
    return err;
}

/* Takes q (running) off the device the way the effective mode does. 0 or an unexpected
   error (already recorded). */
static int preempt_one(struct eng *e, struct req *q)
{
    if (e->eff == PREEMPT_SWAP) {
        uint64_t t = lat_call_start();
        int err = kvvm_seq_swap_out(e->kv, q->seq);
        if (!err) {
            lat_end(e, LAT_SWAP_OUT, t);
            q->state = R_SWAPPED;
            q->key = e->step;
            e->r->swap_outs++;
            hist_add(e, q, EV_SWAP_OUT, 1);
            return 0;
        }
        if (err == -EOPNOTSUPP) {
            fallback(e, "kvvm_seq_swap_out returned -EOPNOTSUPP (this libkvvm has no swap "
                        "tier yet)");
        } else if (err == -ENOMEM) {
            e->r->enomem_handled++;
            if (!e->swap_enomem_logged++)
                fprintf(stderr, "kvvm-stress: swap-out found the host and disk tiers full "
                        "(-ENOMEM); preempting that request by recompute (counted)\n");
        } else {
            fail(e, "kvvm_seq_swap_out", err, q);
            if (err == -EIO)
                return err;
        }
    } else if (e->eff == PREEMPT_AUTO) {
        q->state = R_IDLE;
        q->key = e->step;
        hist_add(e, q, EV_IDLE, 0);
        return 0;
    }
    return preempt_recompute(e, q);
}

/* Preempts q and, when it went to host (swap) or left the batch (auto), the running members
   of its group with it, as vLLM preempts a sequence group: siblings share pages, and a page
   stays on the device while one holder is resident. */
static int preempt(struct eng *e, struct req *q)
{
    int err = preempt_one(e, q);
    if (err || !q->group || (q->state != R_SWAPPED && q->state != R_IDLE))
        return err;
    for (size_t i = 0; i < e->nlive && !e->fatal; i++) {
        struct req *s = e->live[i];
        if (s != q && s->group == q->group && s->state == R_RUNNING)
            preempt_one(e, s);
    }
    return e->fatal ? -EIO : 0;
}

/* Swapped requests whose shared pages came back with a sibling that has since been freed
   hold device pages while not resident; a second swap-out moves them down. 1 = device pages
   were released. */
static int evict_orphans(struct eng *e)
{
    int moved = 0;
    for (size_t i = 0; i < e->nlive; i++) {
        struct req *q = e->live[i];
        struct kvvm_seq_info in = { .size = sizeof in };
        if (q->state != R_SWAPPED || kvvm_seq_info(e->kv, q->seq, &in) || !in.pages_device)
            continue;
        struct kvvm_seq_info after = { .size = sizeof after };
        if (kvvm_seq_swap_out(e->kv, q->seq) == 0 &&
            !kvvm_seq_info(e->kv, q->seq, &after) && after.pages_device < in.pages_device) {
            moved = 1;                  /* its orphans went down (not those a resident shares) */
            hist_add(e, q, EV_SWAP_OUT, 1);
        }
    }
    return moved;
}

/* Creates q's sequence and fills it: system prompt shared, grown to `len` tokens, every token
   written. -ENOMEM / -ENOSPC: nothing held, q unchanged; other errors recorded. */
static int cache_share(struct eng *e, struct req *q, kvvm_seq s, uint64_t *from);

static int32_t tok_at(const struct req *q, uint64_t i)
{
    uint32_t si = 0;
    while (si + 1 < q->nseg && q->segs[si + 1].start <= i)
        si++;
    uint64_t x = (q->segs[si].lineage * 0x9E3779B97F4A7C15ull) ^ (i * 0xC2B2AE3D27D4EB4Full);
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    return (int32_t)(uint32_t)x;
}

/* The keys of q's full blocks among its first n tokens (malloc'd in *keys; NULL when none). */
static size_t pk_keys(struct eng *e, const struct req *q, uint64_t n, kvvm_key **keys)
{
    size_t nb = e->tpb ? n / e->tpb : 0;
    *keys = NULL;
    if (!nb)
        return 0;
    int32_t *tok = malloc(nb * e->tpb * sizeof *tok);
    kvvm_key *k = malloc(nb * sizeof *k);
    if (!tok || !k) {
        free(tok);
        free(k);
        return 0;
    }
    for (uint64_t i = 0; i < nb * e->tpb; i++)
        tok[i] = tok_at(q, i);
    size_t got = kvvm_prefix_keys(tok, nb * e->tpb, e->tpb, NULL, 0, k, nb);
    free(tok);
    *keys = k;
    return got;
}

/* The context's bytes_to_device (what an attach copies onto the device), 0 if unreadable. */
static uint64_t pk_to_device(struct eng *e)
{
    struct kvvm_stats st = { .size = sizeof st };
    return kvvm_stats(e->kv, &st) ? 0 : st.bytes_to_device;
}

static int materialize(struct eng *e, struct req *q, uint64_t len, int op_ev)
{
    kvvm_key *keys = NULL;
    size_t nkeys = 0;
    kvvm_seq s = 0;
    int err = kvvm_seq_create(e->kv, &s);
    if (err) {
        if (!is_expected(err))
            fail(e, "kvvm_seq_create", err, q);
        return err;
    }
    e->seqs_in_use++;
    q->seq = s;
    uint64_t from = 0;
    if (q->sys_prefix) {
        uint64_t t = lat_call_start();
        err = kvvm_seq_share(e->kv, s, e->sys->seq, q->sys_prefix);
        lat_end(e, LAT_SHARE, t);
        if (err) {
            if (!is_expected(err))
                fail(e, "kvvm_seq_share", err, q);
            goto out_free;
        }
        e->r->shares++;
        from = q->sys_prefix;
    }
    q->wkept = 0;                      /* a new sequence: nothing discarded */
    if (q->cache_id && (err = cache_share(e, q, s, &from)))
        goto out_free;
    if (q->pid) {
        nkeys = pk_keys(e, q, q->prompt < len ? q->prompt : len, &keys);
        /* where the blocks are before the attach moves them (not with a store: its lookup
           would ask the store too) */
        uint8_t *where = nkeys && !e->o->store_url ? calloc(nkeys, 1) : NULL;
        if (where)
            (void)kvvm_prefix_lookup(e->kv, PK_NS, keys, nkeys, where);
        uint64_t to_dev = pk_to_device(e);
        uint64_t t = lat_call_start();
        err = kvvm_prefix_attach(e->kv, s, PK_NS, keys, nkeys);
        lat_end(e, LAT_SHARE, t);
        e->r->pk_copied += pk_to_device(e) - to_dev;
        if (err < 0) {
            free(where);
            if (!is_expected(err))
                fail(e, "kvvm_prefix_attach", err, q);
            goto out_free;
        }
        e->r->pk_attach_calls++;
        e->r->pk_asked += nkeys;
        e->r->pk_attached += (uint64_t)err;
        for (int i = 0; where && i < err; i++) {   /* verified with the rest of q below */
            e->r->pk_from_host += where[i] == KVVM_TIER_HOST;
            e->r->pk_from_disk += where[i] == KVVM_TIER_DISK;
            e->r->pk_from_pool += where[i] == KVVM_TIER_POOL;
        }
        free(where);
        from = (uint64_t)err * e->tpb;
        err = 0;
    }
    uint64_t t = lat_call_start();
    err = kvvm_seq_grow(e->kv, s, len);
    lat_end(e, LAT_GROW, t);
    if (err) {
        if (!is_expected(err))
            fail(e, "kvvm_seq_grow", err, q);
        goto out_free;
    }
    q->len = len;
    if ((err = write_range(e, q, from, len)))
        goto out_free;
    if (op_ev == EV_PREFILL)
        e->r->tokens_prefilled += len - from;
    else
        e->r->tokens_recomputed += len - from;
    hist_add(e, q, op_ev, 0);
    if (nkeys) {
        /* its full prompt blocks are written: later requests may attach them */
        int n = kvvm_prefix_publish(e->kv, s, PK_NS, keys, nkeys);
        e->r->pk_publish_calls++;
        if (n >= 0)
            e->r->pk_published += (uint64_t)n;
        else if (!is_expected(n))
            fail(e, "kvvm_prefix_publish", n, q);
    }
    free(keys);
    if (q->state != R_SYSTEM)
        window_discard(e, q);
    return 0;
out_free:
    free(keys);
    kvvm_seq_free(e->kv, s);
    e->seqs_in_use--;
    q->seq = 0;
    return err;
}

static struct req *req_new(struct eng *e)
{
    struct req *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    q->id = e->next_id++;
    q->lineage = e->next_lineage++;
    return q;
}

/* Forks a running request into a new sibling that continues from `len` tokens (after a
   truncate to len when len < a->len). NULL when no slot/page (expected) or on error. */
static struct req *fork_req(struct eng *e, struct req *a, uint64_t len)
{
    struct req *c = req_new(e);
    if (!c)
        return NULL;
    kvvm_seq s = 0;
    uint64_t t = lat_call_start();
    int err = kvvm_seq_fork(e->kv, a->seq, &s);
    lat_end(e, LAT_FORK, t);
    if (err) {
        if (!is_expected(err))
            fail(e, "kvvm_seq_fork", err, a);
        else
            e->r->enomem_handled++;
        goto out_req;
    }
    e->seqs_in_use++;
    e->r->forks++;
    c->seq = s;
    c->parent = a->id;
    c->group = a->group;
    c->prompt = a->prompt;
    c->target = a->target;
    c->sys_prefix = a->sys_prefix;
    c->len = a->len;
    c->wkept = a->wkept;               /* fork copies the discard */
    for (uint32_t i = 0; i < a->nseg; i++)
        if ((err = seg_push(c, a->segs[i].start, a->segs[i].lineage)))
            goto out_free;
    hist_add(e, c, EV_FORK, 0);
    if (len < c->len) {
        t = lat_call_start();
        err = kvvm_seq_truncate(e->kv, s, len);
        lat_end(e, LAT_TRUNCATE, t);
        if (err) {
            fail(e, "kvvm_seq_truncate", err, c);
            goto out_free;
        }
        e->r->truncates++;
        c->len = len;
        if (c->wkept > len)
            c->wkept = len;            /* truncate below first_kept sets it to len */
        seg_truncate(c, len);
        hist_add(e, c, EV_TRUNCATE, 0);
    }
    if ((err = seg_push(c, c->len, c->lineage)))
        goto out_free;
    c->state = R_RUNNING;
    c->sched_step = e->step;
    if (live_add(e, c))
        goto out_free;
    return c;
out_free:
    kvvm_seq_free(e->kv, s);
    e->seqs_in_use--;
out_req:
    req_destroy(c);
    return NULL;
}

static int bring_in(struct eng *e, struct req *q);

/* Makes q readable before a verification: swapped ones are swapped in; others that the
   library moved off the device (auto-swap) are made resident by a grow to their own length.
   0, or -ENOMEM (try later), or an error (recorded). */
static int make_readable(struct eng *e, struct req *q)
{
    if (q->state == R_SWAPPED)
        return bring_in(e, q);
    struct kvvm_seq_info in = { .size = sizeof in };
    int err = kvvm_seq_info(e->kv, q->seq, &in);
    if (err) {
        fail(e, "kvvm_seq_info", err, q);
        return err;
    }
    if (in.resident)
        return 0;
    uint64_t t = lat_call_start();
    err = kvvm_seq_grow(e->kv, q->seq, q->len);
    lat_end(e, LAT_GROW, t);
    if (err && err != -ENOMEM)
        fail(e, "kvvm_seq_grow", err, q);
    if (!err) {
        /* the library swapped it in (auto-swap): its disk pages came back */
        q->disk_pages_pending += in.pages_disk;
        e->r->disk_pages_swapped_in += in.pages_disk;
    }
    return err;
}

/* Verifies a live request, making it readable first; a request the library moved off the
   device that cannot come back now (-ENOMEM) is counted as skipped. */
static int verify_live(struct eng *e, struct req *q)
{
    int err = make_readable(e, q);
    if (err == -ENOMEM) {
        e->r->verify_skipped++;
        return 0;
    }
    return err ? err : verify_req(e, q);
}

/* Finished (or replaced) request: verified, then freed and forgotten. */
static void retire(struct eng *e, struct req *q, int finished)
{
    if (q->seq && !e->draining)
        verify_live(e, q);
    else if (q->seq)
        verify_req(e, q);      /* the drain made it readable */
    do_free(e, q);
    live_remove(e, q);
    if (finished)
        e->r->requests_finished++;
    req_destroy(q);
}

/* ---- scheduler --------------------------------------------------------------------------- */

static uint64_t logical_pages(struct eng *e)
{
    uint64_t p = 0;
    for (size_t i = 0; i < e->nlive; i++) {
        struct req *q = e->live[i];
        uint64_t len = q->state == R_WAITING ? q->prompt : q->len;
        p += pages_for(e, len - q->sys_prefix);   /* the shared prompt counted once */
    }
    if (e->sys)
        p += pages_for(e, e->sys->len);
    return p;
}

static uint64_t used_pages(const struct kvvm_stats *s)
{
    return (s->pages_device_total - s->pages_device_free) +
           (s->pages_host_total - s->pages_host_free) +
           (s->pages_disk_total - s->pages_disk_free);
}

/* Pages held in every tier, each once: a page in flight between two tiers (pages_inflight)
   holds room in both until its copy completes, and when that happens depends on timing; the
   difference does not, so admissions made on it stay the same from run to run. */
static uint64_t held_pages(const struct kvvm_stats *s)
{
    uint64_t u = used_pages(s);
    return u > s->pages_inflight ? u - s->pages_inflight : 0;
}

static struct req *cache_pick(struct eng *e);

static void arrivals(struct eng *e)
{
    const struct opts *o = e->o;
    double cap = o->oversubscribe * (double)e->dev_pages;
    uint64_t lp = logical_pages(e), waiting = 0;
    /* The queue's prompts, and a quarter of the growth still ahead of the requests that grow
       now (queued and running; they do not all peak at once). A swapped request grows only
       after it is back, when others have finished: counting its growth as well held the
       steady state about 6% of X lower (measured). The queued requests' growth keeps the
       first admission burst (one young cohort growing together) from overshooting X. */
    for (size_t i = 0; i < e->nlive; i++) {
        struct req *q = e->live[i];
        uint64_t now = q->state == R_WAITING ? q->prompt : q->len;
        if (q->state == R_WAITING)
            waiting += pages_for(e, q->prompt - q->sys_prefix);
        if (q->state == R_WAITING || q->state == R_RUNNING)
            waiting += (pages_for(e, q->target) - pages_for(e, now)) / 4;
    }
    uint32_t reserve = o->max_parallel + 2;
    /* Pages held in every tier (the library's count, sharing included) plus what the queue
       will prefill stay below X x device; the tool's own estimate bounds the queue when the
       library holds nothing off the device. */
    while (!e->fatal && (double)(held_pages(&e->st) + waiting) < cap &&
           (double)lp < 1.25 * cap && e->nlive + reserve + 1 + e->n_cache < o->max_seqs) {
        struct req *q = req_new(e);
        if (!q) {
            e->fatal = 1;
            return;
        }
        q->prompt = sample_len(e, &o->prompt);
        struct req *ce = cache_pick(e);         /* a prefix-cache entry to continue */
        if (ce)
            q->prompt = ce->len + q->prompt / 4 + 1;
        int share = !ce && !o->prefix_keyed && e->sys && rng_unit(&e->rng) < o->p_share;
        if (share)
            q->prompt += e->sys->len;
        uint32_t pid = 0;
        if (o->prefix_keyed) {
            pid = (uint32_t)(rng_next(&e->rng) % o->pk_prompts);
            q->prompt += e->pk_len[pid];
        }
        q->target = q->prompt + sample_len(e, &o->output);
        if (q->target > o->max_tokens)
            q->target = o->max_tokens;
        if (q->target > e->max_fit)     /* a request must fit in half the device */
            q->target = e->max_fit;
        if (q->prompt >= q->target)
            q->prompt = q->target - 1;
        if (share && q->prompt > e->sys->len) {
            q->sys_prefix = e->sys->len;
            seg_push(q, 0, e->sys->lineage);
        }
        if (o->prefix_keyed && e->pk_len[pid] && q->prompt > e->pk_len[pid]) {
            q->pid = pid + 1;
            seg_push(q, 0, PK_LINEAGE + pid);
        }
        if (ce) {
            q->cache_id = ce->id;
            q->cache_len = ce->len < q->prompt ? ce->len : q->prompt;
            for (uint32_t k = 0; k < ce->nseg && ce->segs[k].start < q->cache_len; k++)
                seg_push(q, ce->segs[k].start, ce->segs[k].lineage);
        }
        if (seg_push(q, ce ? q->cache_len : q->pid ? e->pk_len[pid] : q->sys_prefix,
                     q->lineage)) {
            req_destroy(q);
            e->fatal = 1;
            return;
        }
        q->state = R_WAITING;
        q->key = q->arrival = e->step;
        if (live_add(e, q)) {
            req_destroy(q);
            e->fatal = 1;
            return;
        }
        e->r->requests_admitted++;
        lp += pages_for(e, q->prompt - q->sys_prefix);
        waiting += pages_for(e, q->prompt - q->sys_prefix) +
                   (pages_for(e, q->target) - pages_for(e, q->prompt)) / 4;
    }
}

static uint32_t count_state(struct eng *e, int st)
{
    uint32_t n = 0;
    for (size_t i = 0; i < e->nlive; i++)
        n += e->live[i]->state == st;
    return n;
}

static int off_device(int st)
{
    return st == R_WAITING || st == R_IDLE || st == R_SWAPPED || st == R_PREEMPTED;
}

static void rotate(struct eng *e)
{
    if (e->eff == PREEMPT_RECOMPUTE)
        return;
    uint32_t waiting = 0, running = 0, queued = 0;
    for (size_t i = 0; i < e->nlive; i++) {
        waiting += off_device(e->live[i]->state);
        running += e->live[i]->state == R_RUNNING;
        queued += e->live[i]->state == R_WAITING;
    }
    if (!waiting)
        return;
    /* While prompts are queued (the live set still ramps up to X x device), half a quantum:
       the ramp takes about X quanta of steps, each moving a device's worth off it. */
    uint64_t quantum = queued ? (e->o->quantum + 1) / 2 : e->o->quantum;
    uint32_t max = running / 16 > 1 ? running / 16 : 1;
    if (max > waiting)
        max = waiting;
    for (uint32_t k = 0; k < max && !e->fatal; k++) {
        struct req *v = NULL;
        for (size_t i = 0; i < e->nlive; i++) {
            struct req *q = e->live[i];
            if (q->state == R_RUNNING && e->step - q->sched_step >= quantum &&
                (!v || q->sched_step < v->sched_step))
                v = q;
        }
        if (!v)
            break;
        int was = e->eff;
        preempt(e, v);
        if (was != e->eff)      /* fell back: recompute does not time-slice */
            break;
    }
}

static uint64_t headroom(struct eng *e, uint32_t running)
{
    return (uint64_t)e->o->n_regions * (running / 8 + 2);
}

static int bring_in(struct eng *e, struct req *q)
{
    int err = 0;
    switch (q->state) {
    case R_SWAPPED: {
        struct kvvm_seq_info in = { .size = sizeof in };
        uint64_t seen = 0;
        if (kvvm_seq_info(e->kv, q->seq, &in) == 0)
            seen = in.pages_disk;
        uint64_t t = lat_call_start();
        err = kvvm_seq_swap_in(e->kv, q->seq);
        if (!err)
            lat_end(e, LAT_SWAP_IN, t);
        if (err) {
            if (err == -ENOMEM)
                return err;
            fail(e, "kvvm_seq_swap_in", err, q);
            return err;
        }
        e->r->swap_ins++;
        q->disk_pages_pending += seen;
        e->r->disk_pages_swapped_in += seen;
        hist_add(e, q, EV_SWAP_IN, 1);
        q->state = R_RUNNING;
        q->sched_step = e->step;
        for (size_t i = 0; q->group && !e->draining && i < e->nlive; i++) {   /* its group */
            struct req *s = e->live[i];
            if (s != q && s->group == q->group && s->state == R_SWAPPED &&
                bring_in(e, s) == -ENOMEM)
                break;
        }
        /* Pages back from disk: verify a sample now (every sequence is verified before it is
           freed anyway). */
        if (q->disk_pages_pending && rng_next(&e->rng) % 4 == 0 && verify_req(e, q) < 0)
            return -EIO;
        return 0;
    }
    case R_IDLE: {
        /* auto mode: pages the library moved to disk come back at its next grow (its
           auto swap-in); they count as back from disk, verified with the request */
        struct kvvm_seq_info in = { .size = sizeof in };
        if (kvvm_seq_info(e->kv, q->seq, &in) == 0 && !in.resident) {
            q->disk_pages_pending += in.pages_disk;
            e->r->disk_pages_swapped_in += in.pages_disk;
        }
        q->state = R_RUNNING;
        q->sched_step = e->step;
        hist_add(e, q, EV_RUN, 0);
        for (size_t i = 0; q->group && i < e->nlive; i++) {
            struct req *s = e->live[i];
            if (s->group == q->group && s->state == R_IDLE) {
                s->state = R_RUNNING;
                s->sched_step = e->step;
                hist_add(e, s, EV_RUN, 0);
            }
        }
        return 0;
    }
    case R_PREEMPTED:
        if ((err = materialize(e, q, q->len, EV_REPREFILL)))
            return err;
        q->state = R_RUNNING;
        q->sched_step = e->step;
        return 0;
    case R_WAITING:
        if ((err = materialize(e, q, q->prompt, EV_PREFILL)))
            return err;
        q->state = R_RUNNING;
        q->sched_step = e->step;
        if (e->o->p_parallel > 0 && e->o->max_parallel >= 2 &&
            rng_unit(&e->rng) < e->o->p_parallel) {
            uint32_t n = 2 + (uint32_t)(rng_next(&e->rng) % (e->o->max_parallel - 1));
            q->group = (uint32_t)++e->next_group;
            for (uint32_t i = 1; i < n && !e->fatal; i++)
                fork_req(e, q, q->len);
        }
        return 0;
    }
    return 0;
}

/* Picks a victim to make device room in auto mode: an idle request (left the batch), oldest
   first; NULL when none. */
static struct req *idle_victim(struct eng *e)
{
    struct req *v = NULL;
    for (size_t i = 0; i < e->nlive; i++) {
        struct req *q = e->live[i];
        if (q->state == R_IDLE && q->seq && (!v || q->key < v->key))
            v = q;
    }
    return v;
}

/* A bring-in found no device page. Auto mode: when the library never swapped anything, it
   cannot reclaim, so fall back to recompute. Recompute mode: free an idle request (one that
   left the batch before a fallback). 1 = room was made, try again; 0 = wait. */
static int make_room(struct eng *e)
{
    if (e->eff == PREEMPT_AUTO) {
        refresh_stats(e);
        if (e->st.swap_outs == e->r->st0.swap_outs && idle_victim(e))
            fallback(e, "the library returned -ENOMEM under KVVM_F_AUTO_SWAP without "
                        "swapping anything out (no swap tier yet?)");
    }
    if (e->eff == PREEMPT_RECOMPUTE) {
        struct req *v = idle_victim(e);
        if (v) {
            preempt_recompute(e, v);
            return 1;
        }
    }
    if (e->eff == PREEMPT_SWAP && !count_state(e, R_RUNNING))
        return evict_orphans(e);
    return 0;
}

/* --duration is a bound on the run: past it, no step starts and a step's prefills stop (a
   first step's admission burst alone took 10 s of a 5 s run at load 20). */
static int past_deadline(const struct eng *e)
{
    return e->deadline && now_ns() >= e->deadline;
}

static void schedule_in(struct eng *e)
{
    uint32_t running = count_state(e, R_RUNNING);
    uint64_t run_pages = 0;
    for (size_t i = 0; i < e->nlive; i++)
        if (e->live[i]->state == R_RUNNING)
            run_pages += pages_for(e, e->live[i]->len + 1);
    uint64_t sys_pages = e->sys ? pages_for(e, e->sys->len) : 0;
    while (running < e->o->max_batch && !e->fatal && !past_deadline(e) && !stress_stop) {
        /* Swap and auto modes: queued prompts first (FCFS), then the others by key (the
           step they left the device: round robin). New requests taking the room rotation
           made is what grows the live set to X x device; the queue refills only as requests
           finish, so the swapped ones are not starved. Recompute mode holds nothing off the
           device, so its queue stays long: there, FCFS by key alone, or the preempted
           requests would never come back. */
        int first = e->eff != PREEMPT_RECOMPUTE;
        struct req *best = NULL;
        for (size_t i = 0; i < e->nlive; i++) {
            struct req *q = e->live[i];
            if (!off_device(q->state))
                continue;
            int qw = first && q->state == R_WAITING;
            int bw = first && best && best->state == R_WAITING;
            if (!best || (qw != bw ? qw : q->key < best->key))
                best = q;
        }
        if (!best)
            return;
        uint64_t need = pages_for(e, (best->state == R_WAITING ? best->prompt : best->len) + 1);
        uint64_t hr = headroom(e, running + 1);
        /* Room: the library's free count where the caller moves data itself; in auto mode
           the batch must fit the device (the library moves the others away). */
        if (e->eff == PREEMPT_AUTO) {
            if (run_pages + sys_pages + need + hr > e->dev_pages)
                return;
        } else if (running && best->state != R_IDLE) {
            refresh_stats(e);
            if (e->st.pages_device_free < need + hr)
                return;
        }
        int err = bring_in(e, best);
        if (err) {
            if (is_expected(err)) {
                e->r->enomem_handled++;
                if (err == -ENOMEM && make_room(e))
                    continue;
                return;
            }
            /* unexpected: drop the request so the run goes on */
            do_free(e, best);
            live_remove(e, best);
            req_destroy(best);
            continue;
        }
        running = count_state(e, R_RUNNING);
        run_pages = 0;
        for (size_t i = 0; i < e->nlive; i++)
            if (e->live[i]->state == R_RUNNING)
                run_pages += pages_for(e, e->live[i]->len + 1);
    }
}

static void decode(struct eng *e)
{
    size_t n = 0;
    for (size_t i = 0; i < e->nlive; i++) {
        struct req *q = e->live[i];
        if (q->state == R_RUNNING && q->len < q->target) {
            e->breqs[n] = q;
            n++;
        }
    }
    while (n && !e->fatal) {
        for (size_t i = 0; i < n; i++) {
            e->bseqs[i] = e->breqs[i]->seq;
            e->blens[i] = e->breqs[i]->len + 1;
        }
        uint64_t t = lat_call_start();
        int err = kvvm_seq_grow_batch(e->kv, e->bseqs, e->blens, n);
        lat_end(e, LAT_GROW_BATCH, t);
        if (!err)
            break;
        if (err != -ENOMEM) {
            fail(e, "kvvm_seq_grow_batch", err, NULL);
            return;
        }
        e->r->enomem_handled++;
        /* Auto mode: the library should have reclaimed idle sequences; recompute mode:
           idle ones go first. */
        if (make_room(e))
            continue;
        size_t vi = 0;
        for (size_t i = 1; i < n; i++)
            if (e->breqs[i]->sched_step > e->breqs[vi]->sched_step ||
                (e->breqs[i]->sched_step == e->breqs[vi]->sched_step &&
                 e->breqs[i]->id > e->breqs[vi]->id))
                vi = i;
        struct req *v = e->breqs[vi];
        if (n == 1 && e->eff == PREEMPT_AUTO) {
            preempt_recompute(e, v);   /* nothing else to give: the device is full of it */
        } else {
            if (e->eff == PREEMPT_AUTO)
                e->r->batch_shrinks++;
            if (preempt(e, v) && e->fatal)
                return;
        }
        /* v and possibly its group left the batch */
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (e->breqs[i]->state == R_RUNNING && e->breqs[i]->seq)
                e->breqs[m++] = e->breqs[i];
        n = m;
    }
    if (!n)
        return;
    /* One token per sequence and region, each from its own slot of the staging buffer. */
    const uint64_t bpt = e->o->bytes_per_token;
    size_t off = 0;
    for (size_t i = 0; i < n && !e->fatal; i++) {
        struct req *q = e->breqs[i];
        q->len++;
        for (uint32_t r = 0; r < e->o->n_regions; r++) {
            unsigned char *p = e->dbuf + off;
            if (off + bpt > e->dbufsz) {        /* cannot happen: sized for max_batch */
                p = e->buf;
            } else {
                off += bpt;
            }
            pattern_fill(q->lineage, q->len - 1, r, p, bpt);
            uint64_t t = lat_call_start();
            int err = kvvm_seq_write(e->kv, q->seq, r, (q->len - 1) * bpt, p, bpt);
            lat_end(e, LAT_WRITE, t);
            if (err) {
                fail(e, "kvvm_seq_write", err, q);
                break;
            }
        }
        e->r->tokens_written += e->o->n_regions;
        window_discard(e, q);
    }
    e->r->tokens_decoded += n;
}

static void cache_put(struct eng *e, struct req *q);

static void finish_and_beams(struct eng *e)
{
    for (size_t i = 0; i < e->nlive && !e->fatal;) {
        struct req *q = e->live[i];
        if (q->state == R_RUNNING && q->len >= q->target) {
            cache_put(e, q);    /* its prompt becomes a prefix-cache entry */
            retire(e, q, 1);
            continue;           /* live[i] is the next one now */
        }
        i++;
    }
    if (e->o->p_beam <= 0)
        return;
    size_t nl = e->nlive;
    for (size_t i = 0; i < nl && i < e->nlive && !e->fatal; i++) {
        struct req *a = e->live[i];
        if (!a->group || a->state != R_RUNNING || a->len < a->prompt + 2 ||
            rng_unit(&e->rng) >= e->o->p_beam)
            continue;
        struct req *b = NULL;   /* the beam dropped: a running sibling */
        for (size_t j = 0; j < e->nlive; j++) {
            struct req *q = e->live[j];
            if (q != a && q->group == a->group && q->state == R_RUNNING)
                b = q;
        }
        if (!b)
            continue;
        uint64_t back = 1 + rng_next(&e->rng) % 8;
        uint64_t len = a->len - back < a->prompt ? a->prompt : a->len - back;
        retire(e, b, 0);
        if (fork_req(e, a, len))
            e->r->beam_replacements++;
    }
}

static void sampled_verify(struct eng *e)
{
    if (!e->o->verify_every || e->step % e->o->verify_every)
        return;
    uint32_t running = count_state(e, R_RUNNING);
    if (!running)
        return;
    uint32_t k = (uint32_t)(rng_next(&e->rng) % running);
    for (size_t i = 0; i < e->nlive; i++)
        if (e->live[i]->state == R_RUNNING && k-- == 0) {
            verify_live(e, e->live[i]);
            return;
        }
}

/* --pool's victim (the one client given a progress pipe): reports "STEP SECONDS" every 4 steps
   and, at its kill point (half its steps, or half its duration: the coordinator's rule),
   reports it and holds there, its frames held, until the coordinator's SIGKILL (or a stop).
   So the kill lands mid-run however late a loaded coordinator reads the pipe: a victim that
   ran on could end its run before the kill (stress_pool failed so in CI under ASan). */
static void victim_progress(struct eng *e)
{
    const struct opts *o = e->o;
    uint64_t done = e->step + 1;
    double t = (double)(now_ns() - e->t0) / 1e9;
    int at_kill = o->steps ? done >= o->steps / 2 : t >= o->duration_s / 2;
    if (!(e->step % 4) || at_kill)
        dprintf(o->progress_fd, "%llu %.3f\n", (unsigned long long)done, t);
    while (at_kill && !stress_stop)
        usleep(20000);              /* until the SIGKILL: waiting for it, not for a time */
}

static void record_step(struct eng *e)
{
    refresh_stats(e);
    struct results *r = e->r;
    const struct kvvm_stats *s = &e->st;
    uint64_t dev = s->pages_device_total - s->pages_device_free;
    uint64_t host = s->pages_host_total - s->pages_host_free;
    uint64_t disk = s->pages_disk_total - s->pages_disk_free;
    if (dev > r->peak_dev) r->peak_dev = dev;
    if (host > r->peak_host) r->peak_host = host;
    if (disk > r->peak_disk) r->peak_disk = disk;
    if (s->pages_inflight > r->peak_inflight) r->peak_inflight = s->pages_inflight;
    double ov = s->pages_device_total ? (double)(dev + host + disk) / s->pages_device_total : 0;
    if (ov > r->peak_oversub)
        r->peak_oversub = ov;
    r->sum_oversub += ov;
    r->n_oversub++;
    if (r->n_steady || ov >= 0.9 * e->o->oversubscribe) {
        r->sum_steady += ov;
        r->n_steady++;
    }
    double held = s->pages_device_total ? (double)held_pages(s) / s->pages_device_total : 0;
    if (held > r->peak_held)
        r->peak_held = held;
    uint64_t lp = logical_pages(e);
    if (lp > r->peak_logical_pages) r->peak_logical_pages = lp;
    double lo = e->dev_pages ? (double)lp / e->dev_pages : 0;
    if (lo > r->peak_logical_oversub)
        r->peak_logical_oversub = lo;
    struct trace_pt p = { .step = e->step, .t = (now_ns() - e->t0) / 1e9, .dev = dev,
                          .host = host, .disk = disk, .inflight = s->pages_inflight };
    for (size_t i = 0; i < e->nlive; i++) {
        int st = e->live[i]->state;
        p.running += st == R_RUNNING;
        p.waiting += st == R_WAITING;
        p.off_device += st == R_IDLE || st == R_SWAPPED || st == R_PREEMPTED;
    }
    if (p.running > r->peak_running) r->peak_running = p.running;
    if (e->o->window) {                 /* what the discards spare, against what is held */
        uint64_t dn = 0;
        for (size_t i = 0; i < e->nlive; i++)
            dn += discarded_pages(e, e->live[i]);
        for (uint32_t i = 0; i < e->n_cache; i++)
            dn += discarded_pages(e, e->cache[i]);
        double sv = dn ? (double)dn / (double)(held_pages(s) + dn) : 0;
        if (sv > r->peak_discard_saving)
            r->peak_discard_saving = sv;
        r->sum_discard_saving += sv;
        if (dn > r->peak_discarded_now)
            r->peak_discarded_now = dn;
    }
    if (e->nlive > r->peak_live) r->peak_live = (uint32_t)e->nlive;
    if (e->o->trace_path || e->o->plot_path)
        trace_add(r, &p);
}

static void cache_drain(struct eng *e);

/* A pool client's final swap-in may lack room that other clients still running their steps
   hold in LIVE sequences (a take-back cannot make them give those): waits until the pool
   changes (more free, or fewer clients) and says to try again. 0 without a pool, when this
   is the pool's last client, or when nothing changed for POOL_DRAIN_WAIT_S seconds. */
#define POOL_DRAIN_WAIT_S 120
static int pool_room_changed(struct eng *e)
{
    struct kvvm_pool_info a = { .size = sizeof a }, b = { .size = sizeof b };
    if (!e->o->pool_socket || kvvm_pool_info(e->kv, &a) || !a.connected || a.n_clients <= 1)
        return 0;
    for (uint64_t end = now_ns() + POOL_DRAIN_WAIT_S * 1000000000ull; now_ns() < end;) {
        struct timespec ts = { 0, 20 * 1000 * 1000 };
        nanosleep(&ts, NULL);
        if (kvvm_pool_info(e->kv, &b) || !b.connected)
            return 0;
        if (b.n_clients < a.n_clients || b.free_bytes > a.free_bytes)
            return 1;
    }
    return 0;
}

static void drain(struct eng *e)
{
    /* Resident ones first, so their pages make room for the swapped ones. */
    e->draining = 1;
    for (int pass = 0; pass < 2 && !e->fatal; pass++) {
        for (size_t i = 0; i < e->nlive && !e->fatal;) {
            struct req *q = e->live[i];
            if (!q->seq) {
                live_remove(e, q);
                req_destroy(q);
                continue;
            }
            if (pass == 0 && (q->state == R_SWAPPED || q->state == R_IDLE)) {
                i++;
                continue;
            }
            int err = make_readable(e, q);
            if (err == -ENOMEM && pass == 1 && evict_orphans(e))
                err = make_readable(e, q);
            while (err == -ENOMEM && pass == 1 && pool_room_changed(e))
                err = make_readable(e, q);
            if (err == -ENOMEM && pass == 0) {
                i++;
                continue;
            }
            if (err && err != -ENOMEM) {
                do_free(e, q);
                live_remove(e, q);
                req_destroy(q);
                continue;
            }
            if (err == -ENOMEM) {
                record_error(e->r, e->step, "final swap-in (device full after drain)", err,
                             q->id);
                do_free(e, q);
                live_remove(e, q);
                req_destroy(q);
                continue;
            }
            retire(e, q, 0);
            kvvm_step(e->kv);
        }
    }
    cache_drain(e);
    if (e->sys && e->sys->seq) {
        if (make_readable(e, e->sys) == 0)
            verify_req(e, e->sys);
        do_free(e, e->sys);
    }
}

/* ---- prefix cache (--prefix-cache P, --cache-entries N) ------------------------------------
   A finished request's prompt is kept as an entry: a sequence sharing its pages
   (kvvm_seq_share), of class KVVM_SEQ_CACHED, so the library drops it (or demotes it, with
   KVVM_F_CACHE_DEMOTE) under pressure before it swaps a LIVE request. A share P of new requests
   continue an entry's prompt: their prefill shares it (a hit) unless the library dropped it
   (-ESTALE: a miss, the entry is freed and the prefix prefilled again, with the same bytes). A
   dropped entry is never read as valid: the drain checks each one is -ESTALE, and verifies the
   bytes of every entry that is not. */
static void cache_remove(struct eng *e, uint32_t i)
{
    struct req *c = e->cache[i];
    do_free(e, c);
    req_destroy(c);
    memmove(&e->cache[i], &e->cache[i + 1], (e->n_cache - i - 1) * sizeof *e->cache);
    e->n_cache--;
}

static struct req *cache_pick(struct eng *e)
{
    if (!e->n_cache || rng_unit(&e->rng) >= e->o->prefix_cache)
        return NULL;
    return e->cache[rng_next(&e->rng) % e->n_cache];
}

static void cache_put(struct eng *e, struct req *q)
{
    if (!e->cache || !q->seq || !q->prompt || e->draining)
        return;
    if (e->n_cache == e->o->cache_entries) {
        cache_remove(e, 0);             /* the oldest goes */
        e->r->cache_evicted++;
    }
    struct req *c = req_new(e);
    if (!c)
        return;
    kvvm_seq s;
    int err = kvvm_seq_create(e->kv, &s);
    if (err) {
        if (!is_expected(err))
            fail(e, "kvvm_seq_create", err, q);
        req_destroy(c);
        return;
    }
    e->seqs_in_use++;
    c->seq = s;
    c->state = R_SYSTEM;
    uint64_t t = lat_call_start();
    err = kvvm_seq_share(e->kv, s, q->seq, q->prompt);
    lat_end(e, LAT_SHARE, t);
    if (!err)
        err = kvvm_seq_set_class(e->kv, s, KVVM_SEQ_CACHED);
    if (err) {
        if (!is_expected(err))
            fail(e, "kvvm_seq_share (prefix-cache entry)", err, q);
        do_free(e, c);
        req_destroy(c);
        return;
    }
    c->id = ++e->next_cache_id;
    c->len = q->prompt;
    c->wkept = q->wkept < q->prompt ? q->wkept : q->prompt;
    for (uint32_t k = 0; k < q->nseg && q->segs[k].start < c->len; k++)
        seg_push(c, q->segs[k].start, q->segs[k].lineage);
    e->cache[e->n_cache++] = c;
    e->r->cache_puts++;
}

/* At q's prefill into s: shares the entry's prefix (a hit: *from = its length) or finds it
   dropped or gone (a miss: *from stays). 0, or the share's expected error (-ENOMEM). */
static int cache_share(struct eng *e, struct req *q, kvvm_seq s, uint64_t *from)
{
    uint32_t i;
    for (i = 0; i < e->n_cache && e->cache[i]->id != q->cache_id; i++)
        ;
    if (i == e->n_cache) {
        e->r->cache_misses++;           /* evicted meanwhile */
        return 0;
    }
    struct req *c = e->cache[i];
    uint64_t t = lat_call_start();
    int err = kvvm_seq_share(e->kv, s, c->seq, q->cache_len);
    lat_end(e, LAT_SHARE, t);
    if (err == -ESTALE) {
        e->r->cache_misses++;           /* the library dropped it under pressure */
        cache_remove(e, i);
        return 0;
    }
    if (err) {
        if (!is_expected(err))
            fail(e, "kvvm_seq_share (prefix-cache hit)", err, q);
        return err;
    }
    e->r->cache_hits++;
    e->r->shares++;
    *from = q->cache_len;
    q->wkept = c->wkept < q->cache_len ? c->wkept : q->cache_len;
    return 0;
}

static void cache_drain(struct eng *e)
{
    while (e->n_cache && !e->fatal) {
        struct req *c = e->cache[0];
        struct kvvm_seq_info in = { .size = sizeof in };
        int err = kvvm_seq_info(e->kv, c->seq, &in);
        if (!err && in.dropped) {
            unsigned char b[8];
            err = kvvm_seq_read(e->kv, c->seq, 0, 0, b, 1);
            if (err == -ESTALE) {
                e->r->cache_stale_checked++;
            } else {
                fprintf(stderr, "kvvm-stress: MISMATCH a dropped prefix-cache entry was read "
                        "(%d), not -ESTALE\n", err);
                e->r->mismatches++;
                e->r->mismatched_seqs++;
            }
        } else if (!err) {
            if (!in.resident)
                err = kvvm_seq_swap_in(e->kv, c->seq);     /* demoted */
            if (!err) {
                if (verify_req(e, c) == 0)
                    e->r->cache_verified++;
            } else if (err == -ENOMEM) {
                e->r->verify_skipped++;
            } else {
                fail(e, "kvvm_seq_swap_in (prefix-cache entry)", err, c);
            }
            kvvm_step(e->kv);
        } else {
            fail(e, "kvvm_seq_info (prefix-cache entry)", err, c);
        }
        cache_remove(e, 0);
    }
}

static int setup_sys(struct eng *e)
{
    if (!e->o->system_prompt)
        return 0;
    if (pages_for(e, e->o->system_prompt) > e->dev_pages / 4) {
        fprintf(stderr, "kvvm-stress: the system prompt (%u tokens) would take more than a "
                "quarter of the device; running without it\n", e->o->system_prompt);
        return 0;
    }
    struct req *q = req_new(e);
    if (!q)
        return -ENOMEM;
    q->state = R_SYSTEM;
    seg_push(q, 0, q->lineage);
    e->sys = q;
    int err = materialize(e, q, e->o->system_prompt, EV_PREFILL);
    if (err) {
        fprintf(stderr, "kvvm-stress: the system prompt (%u tokens) could not be set up: %s\n",
                e->o->system_prompt, kvvm_strerror(err));
        e->sys = NULL;
        req_destroy(q);
    }
    return err;
}

/* ---- elastic memory (--budget-schedule; frames created on the engine's thread) ---- */

/* The warm-up ends at 10% of the run (5 s at most; step 100 with --steps): from then on the
   frame pool thread should have created every frame (frames_created_sync stays). */
static void warm_mark(struct eng *e, double t, int *warm)
{
    const struct opts *o = e->o;
    double until = o->duration_s > 0 ? o->duration_s / 10 : 5;
    if (*warm || (o->steps ? e->step < (o->steps < 1000 ? o->steps / 10 : 100)
                           : t < (until < 5 ? until : 5)))
        return;
    *warm = 1;
    e->r->sync_at_warm = e->st.frames_created_sync;
    e->r->warm_step = e->step;
    e->r->warm_s = t;
}

static void budget_tick(struct eng *e, double t, uint32_t *next)
{
    const struct opts *o = e->o;
    struct results *r = e->r;
    if (*next >= o->n_budget || t < o->budget_sched[*next].t)
        return;
    const struct budget_ev *ev = &o->budget_sched[(*next)++];
    size_t pages = (size_t)(ev->frac * (double)r->st0.pages_device_total + 0.5);
    if (pages < 1)
        pages = 1;
    struct budget_rec *b = &r->budget[r->n_budget++];
    struct kvvm_stats s0 = e->st, s1 = { .size = sizeof s1 };
    b->t = t;
    b->step = e->step;
    b->bytes = pages * e->page;
    uint64_t t0 = now_ns();
    b->rc = kvvm_set_budget(e->kv, b->bytes);
    int src = kvvm_sync(e->kv);            /* the released memory is back with the driver */
    b->back_ms = (now_ns() - t0) / 1e6;
    if (b->rc && b->rc != -ENOMEM)
        fail(e, "kvvm_set_budget", b->rc, NULL);
    if (src)
        fail(e, "kvvm_sync", src, NULL);
    kvvm_stats(e->kv, &s1);
    b->held_before = s0.device_bytes_held;
    b->held_after = s1.device_bytes_held;
    b->frames_released = s1.frames_released - s0.frames_released;
    b->swap_outs = s1.swap_outs - s0.swap_outs;
    b->pages_before = s0.pages_device_total - s0.pages_device_free;
    b->pages_after = s1.pages_device_total - s1.pages_device_free;
    e->st = s1;
    if (o->verbose || b->rc)
        fprintf(stderr, "kvvm-stress: %.1f s: budget -> %zu pages: %s\n", t, pages,
                b->rc ? kvvm_strerror(b->rc) : "done");
}

int stress_run(const struct opts *o, kvvm *kv, struct results *r)
{
    struct eng E = { .o = o, .kv = kv, .r = r, .rng = o->seed ^ 0x5EED5EED5EEDull,
                     .lat_rng = o->seed ^ 0x1A7E1A7Eull,
                     .eff = o->preempt, .next_id = 0, .next_lineage = 1, .t0 = now_ns() };
    struct eng *e = &E;
    int err = 0;
    uint64_t t_start = E.t0;
    if (o->duration_s > 0)
        e->deadline = t_start + (uint64_t)(o->duration_s * 1e9);

    if (r->fallback_reason[0])      /* main.c could not open with auto-swap */
        e->eff = PREEMPT_RECOMPUTE;
    r->st0.size = sizeof r->st0;
    if ((err = kvvm_stats(kv, &r->st0))) {
        fail(e, "kvvm_stats", err, NULL);
        return err;
    }
    e->st = r->st0;
    e->page = r->st0.page_size;
    e->dev_pages = r->st0.pages_device_total;
    if (!e->page || !e->dev_pages) {
        fprintf(stderr, "kvvm-stress: the library reports no device pages\n");
        return -EINVAL;
    }
    e->max_fit = (e->dev_pages / 2 / o->n_regions) * e->page / o->bytes_per_token;
    if (e->max_fit < 2) {
        fprintf(stderr, "kvvm-stress: the device budget (%llu pages) cannot hold a request of "
                "2 tokens in %u regions\n", (unsigned long long)e->dev_pages, o->n_regions);
        return -EINVAL;
    }
    e->bufsz = o->bytes_per_token > (4u << 20) ? o->bytes_per_token : (4u << 20);
    e->dbufsz = (size_t)(o->max_seqs + 1) * o->n_regions * o->bytes_per_token;
    e->buf = malloc(e->bufsz);
    e->dbuf = malloc(e->dbufsz);
    e->bseqs = calloc(o->max_seqs + 1, sizeof *e->bseqs);
    e->blens = calloc(o->max_seqs + 1, sizeof *e->blens);
    e->breqs = calloc(o->max_seqs + 1, sizeof *e->breqs);
    if (!e->buf || !e->dbuf || !e->bseqs || !e->blens || !e->breqs) {
        err = -ENOMEM;
        goto out_free;
    }
    if (o->stream) {
        if ((err = kvvm_stream_create(kv, &e->stream))) {
            fail(e, "kvvm_stream_create", err, NULL);
            goto out_free;
        }
        if ((err = kvvm_set_stream(kv, e->stream))) {
            fail(e, "kvvm_set_stream", err, NULL);
            goto out_stream;
        }
    }
    if (o->prefix_cache > 0 && o->cache_entries &&
        !(e->cache = calloc(o->cache_entries, sizeof *e->cache))) {
        err = -ENOMEM;
        goto out_stream;
    }
    if ((err = kvvm_block_tokens(kv, &e->tpb))) {
        fail(e, "kvvm_block_tokens", err, NULL);
        goto out_stream;
    }
    for (uint32_t p = 0; o->prefix_keyed && p < o->pk_prompts; p++) {
        uint64_t blocks = e->tpb ? e->max_fit / 4 / e->tpb : 0;
        e->pk_len[p] = (blocks < p % 4 + 1 ? blocks : p % 4 + 1) * e->tpb;
        if (!e->pk_len[p] && !p)
            fprintf(stderr, "kvvm-stress: --prefix-cache keyed: a block (%u tokens) is more "
                    "than a quarter of the longest request; no shared prompts\n", e->tpb);
    }
    if (o->pool_view) {
        if (!(e->pool_base = calloc(o->n_regions, sizeof *e->pool_base))) {
            err = -ENOMEM;
            goto out_stream;
        }
        err = kvvm_pool_blocks(kv, &e->pool_ids);
        for (uint32_t r = 0; !err && r < o->n_regions; r++)
            err = kvvm_pool_base(kv, r, &e->pool_base[r]);
        if (err) {
            fail(e, "kvvm_pool_base", err, NULL);
            goto out_stream;
        }
    }
    if (setup_sys(e) && e->fatal)
        goto out_stream;

    int tty = isatty(2) && !o->quiet;
    uint64_t last_prog = 0;
    uint32_t next_budget = 0;
    int warm = 0;
    e->t0 = now_ns();
    for (e->step = 0; !e->fatal; e->step++) {
        double t = (now_ns() - e->t0) / 1e9;
        if ((o->steps && e->step >= o->steps) || past_deadline(e))
            break;
        if (stress_stop) {
            r->interrupted = stress_stop;
            fprintf(stderr, "%skvvm-stress: %s at step %llu: stopping; verifying and freeing "
                    "the live sequences, then the summary and reports (again to kill now)\n",
                    tty ? "\n" : "", stress_stop == SIGINT ? "SIGINT" : "SIGTERM",
                    (unsigned long long)e->step);
            break;
        }
        refresh_stats(e);
        warm_mark(e, t, &warm);
        budget_tick(e, t, &next_budget);
        arrivals(e);
        rotate(e);
        schedule_in(e);
        decode(e);
        finish_and_beams(e);
        sampled_verify(e);
        if (e->stream && (err = kvvm_sync(kv)))    /* see above write_range */
            fail(e, "kvvm_sync", err, NULL);
        record_step(e);
        uint64_t t1 = lat_call_start();
        err = kvvm_step(kv);
        lat_end(e, LAT_STEP, t1);
        if (err)
            fail(e, "kvvm_step", err, NULL);
        if (o->progress_fd >= 0)
            victim_progress(e);
        if (tty && now_ns() - last_prog > 250000000ull) {
            last_prog = now_ns();
            r->steps = e->step + 1;
            r->elapsed_s = (now_ns() - e->t0) / 1e9;
            progress_line(o, r, &e->st, r->elapsed_s, 0);
        }
    }
    r->steps = e->step;                 /* the steps that ran (started and ended) */
    uint64_t t_steps = now_ns();
    r->elapsed_s = (t_steps - e->t0) / 1e9;
    r->setup_s = (e->t0 - t_start) / 1e9;
    if (tty)
        progress_line(o, r, &e->st, r->elapsed_s, 1);
    if (!e->fatal)
        drain(e);
    else
        r->aborted = 1;
    uint64_t t_end = now_ns();
    r->drain_s = (t_end - t_steps) / 1e9;
    r->wall_s = (t_end - t_start) / 1e9;
    kvvm_sync(kv);
    r->st.size = sizeof r->st;
    kvvm_stats(kv, &r->st);
    if (o->pool_socket) {
        r->pool_end.size = sizeof r->pool_end;
        r->pool_ok = kvvm_pool_info(kv, &r->pool_end) == 0;
    }
    {
        size_t cap = 1 << 16;
        for (int tries = 0; tries < 6; tries++, cap *= 4) {
            char *b = malloc(cap);
            if (!b)
                break;
            int jerr = kvvm_stats_json(kv, b, cap);
            if (jerr == 0) {
                r->lib_json = b;
                break;
            }
            free(b);
            if (jerr != -ENOSPC)
                break;
        }
    }
    err = 0;
out_stream:
    if (e->stream) {
        kvvm_set_stream(kv, NULL);
        kvvm_stream_destroy(kv, e->stream);
    }
out_free:
    for (size_t i = 0; i < e->nlive; i++) {
        if (e->live[i]->seq)
            kvvm_seq_free(kv, e->live[i]->seq);
        req_destroy(e->live[i]);
    }
    if (e->sys) {
        if (e->sys->seq)
            kvvm_seq_free(kv, e->sys->seq);
        req_destroy(e->sys);
    }
    for (uint32_t i = 0; i < e->n_cache; i++) {
        kvvm_seq_free(kv, e->cache[i]->seq);
        req_destroy(e->cache[i]);
    }
    free(e->cache);
    free(e->pool_base);
    free(e->live);
    free(e->buf);
    free(e->dbuf);
    free(e->bseqs);
    free(e->blens);
    free(e->breqs);
    r->preempt_effective = preempt_names[e->eff];
    if (e->fatal)
        r->aborted = 1;
    return err;
}
