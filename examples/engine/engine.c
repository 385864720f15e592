/*
 * engine.c: a small inference engine's KV cache, driven through libkvvm's public API.
 *
 * No model runs here: the "model" writes, for every token of every sequence, bytes derived
 * from (request, sample, token, region) into the KV cache, and the engine reads every
 * sequence back when it finishes and checks every byte. What it shows is how an engine uses
 * libkvvm:
 *
 *   - one kvvm context with a device budget smaller than the work (oversubscribed), a
 *     pinned host tier and a spill file on disk below it;
 *   - stream mode: the engine's stream (kvvm_stream_create + kvvm_set_stream) orders the
 *     library's copies, and the CPU calls kvvm_sync before it looks at bytes that
 *     stream-ordered copies moved;
 *   - continuous batching: requests arrive over time; each one's sequence starts with the
 *     shared system prompt (kvvm_seq_share), then its own prompt is prefilled;
 *   - parallel sampling: some requests fork their prefilled sequence (kvvm_seq_fork) into
 *     several samples that decode independently (copy-on-write keeps them apart);
 *   - admission by kvvm_seq_need: a waiting sequence comes in only when the device pages it
 *     needs are free beyond what the running batch needs for its next token;
 *   - preemption by kvvm_seq_swap_out / kvvm_seq_swap_in: a sequence that ran for a quantum
 *     leaves the device while others wait (round robin), and when the batch's next token
 *     does not fit (-ENOMEM) the most recently admitted sequence is swapped out;
 *   - kvvm_step once per engine iteration.
 *
 * Every unexpected error and every wrong byte ends the run with a message and exit status 1.
 */
#define _POSIX_C_SOURCE 200809L   /* clock_gettime */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <kvvm.h>

/* ---- the workload ------------------------------------------------------------------- */

#define N_REGIONS       4     /* 2 layers x (K, V): one region per layer and K/V */
#define TOKENS_PER_PAGE 256   /* bytes_per_token = page / 256 */
#define SYSTEM_TOKENS   300   /* the shared system prompt (not a page multiple: share copies
                                 the partial last page of every region) */
#define MAX_TOKENS      1024
#define MAX_SEQS        48    /* live sequences at once, the system prompt's included */
#define SAMPLES         3     /* parallel sampling: every third request forks into 3 */
#define QUANTUM         16    /* iterations a sequence runs before it yields to waiters */
#define DEVICE_PAGES    64
#define HOST_PAGES      32
#define SPILL_PAGES     1024

enum state {
    WAITING,                  /* not admitted yet */
    RUNNING,                  /* on the device, in the batch */
    SWAPPED,                  /* preempted by swap-out: holds its handle and slot */
    DROPPED,                  /* preempted when the tiers were full: freed, recomputed later */
    FINISHED
};

struct seq {
    kvvm_seq h;               /* 0 while the request has not been admitted */
    uint32_t req, sample;     /* sample 0 is the request's first sequence */
    uint64_t len;             /* tokens written */
    uint64_t prompt, target;  /* tokens after prefill (system prompt included), at the end */
    enum state state;
    uint64_t queued_at;       /* iteration it arrived or was swapped out (FCFS order) */
    uint64_t admitted_at;     /* iteration it last came onto the device */
};

struct engine {
    kvvm *kv;
    void *stream;             /* the engine stream, NULL in synchronous mode */
    int direct;               /* device windows are CPU-readable (emulated, not opaque) */
    uint64_t page, bpt;       /* bytes per page, bytes per token and region */
    kvvm_seq sys;             /* the system prompt's sequence */
    struct seq *seqs;         /* n_req * SAMPLES entries: request r, sample s at r*SAMPLES+s */
    uint32_t n_req;
    uint64_t iter;
    uint32_t live;            /* sequences holding a handle */
    unsigned char *buf, *expect;
    /* what the run did */
    uint64_t admitted, forked, finished, rotated, preempted, swapped_in, bytes_verified;
    uint64_t direct_checks, peak_pages, swap_in_retries, dropped;
};

static uint64_t rng_state;

static uint64_t rng(void)     /* xorshift64*: the workload depends on --seed only */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1DULL;
}

static uint64_t uniform(uint64_t lo, uint64_t hi) { return lo + rng() % (hi - lo + 1); }

static void die(const struct engine *e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "engine: iteration %" PRIu64 ": ", e ? e->iter : 0);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

/* Every libkvvm call returns 0 or a negative errno; kvvm_strerror says what it means. */
#define CHECK(e, call)                                                                 \
    do {                                                                               \
        int err_ = (call);                                                             \
        if (err_)                                                                      \
            die(e, "%s failed: %s (%d)", #call, kvvm_strerror(err_), err_);            \
    } while (0)

/* ---- the bytes the "model" writes --------------------------------------------------- */

static uint64_t mix(uint64_t x)   /* splitmix64's finalizer */
{
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* Who wrote token t of q: the system prompt, the request's prompt (shared by its samples)
   or one sample's decode. A byte of the wrong owner, token or region never matches. */
static uint64_t owner(const struct seq *q, uint64_t t)
{
    if (t < SYSTEM_TOKENS)
        return 0;
    if (t < q->prompt)
        return (uint64_t)(q->req + 1) << 8 | 0xFF;
    return (uint64_t)(q->req + 1) << 8 | q->sample;
}

static void fill_token(uint64_t who, uint64_t t, uint32_t region, unsigned char *p, size_t n)
{
    uint64_t seed = mix(who ^ mix(t << 8 | region));
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = mix(seed + i);
        memcpy(p + i, &v, n - i < 8 ? n - i : 8);
    }
}

/* Writes tokens [a, b) of q in every region: one kvvm_seq_write per region, the tokens of a
   region being contiguous at offset t * bytes_per_token. In stream mode the write is
   ordered on the engine stream; the buffer is pageable (malloc), so the driver staged it
   and it may be reused at once. */
static void write_tokens(struct engine *e, const struct seq *q, uint64_t a, uint64_t b)
{
    for (uint32_t r = 0; r < N_REGIONS; r++) {
        for (uint64_t t = a; t < b; t++)
            fill_token(owner(q, t), t, r, e->buf + (t - a) * e->bpt, e->bpt);
        CHECK(e, kvvm_seq_write(e->kv, q->h, r, a * e->bpt, e->buf, (b - a) * e->bpt));
    }
}

/* Reads every token of q back and checks every byte. A pageable destination holds the
   bytes when kvvm_seq_read returns, in both modes (a pinned one would need kvvm_sync). */
static void verify(struct engine *e, const struct seq *q)
{
    for (uint32_t r = 0; r < N_REGIONS; r++) {
        CHECK(e, kvvm_seq_read(e->kv, q->h, r, 0, e->buf, q->len * e->bpt));
        for (uint64_t t = 0; t < q->len; t++) {
            fill_token(owner(q, t), t, r, e->expect, e->bpt);
            const unsigned char *got = e->buf + t * e->bpt;
            if (memcmp(got, e->expect, e->bpt) == 0)
                continue;
            size_t i = 0;
            while (got[i] == e->expect[i])
                i++;
            die(e, "MISMATCH: request %" PRIu32 " sample %" PRIu32 " region %" PRIu32
                " token %" PRIu64 " byte %zu: read 0x%02x, expected 0x%02x", q->req, q->sample,
                r, t, i, got[i], e->expect[i]);
        }
        e->bytes_verified += q->len * e->bpt;
    }
}

/* Direct CPU access (emulated device, windows not opaque): token t of region r lies at
   kvvm_seq_addr(r) + t * bytes_per_token. The sequence must be protected (used since the
   last kvvm_step), and in stream mode the writes that put the bytes there are queued on the
   stream: kvvm_sync first. */
static void check_direct(struct engine *e, const struct seq *q)
{
    if (e->stream)
        CHECK(e, kvvm_sync(e->kv));
    uint64_t t = q->len - 1;
    for (uint32_t r = 0; r < N_REGIONS; r++) {
        uint64_t addr;
        CHECK(e, kvvm_seq_addr(e->kv, q->h, r, &addr));
        fill_token(owner(q, t), t, r, e->expect, e->bpt);
        if (memcmp((const void *)(uintptr_t)(addr + t * e->bpt), e->expect, e->bpt))
            die(e, "MISMATCH (direct access): request %" PRIu32 " sample %" PRIu32
                " region %" PRIu32 " token %" PRIu64, q->req, q->sample, r, t);
    }
    e->direct_checks++;
}

/* ---- scheduling --------------------------------------------------------------------- */

static uint64_t free_pages(struct engine *e)
{
    struct kvvm_stats st = { .size = sizeof st };
    CHECK(e, kvvm_stats(e->kv, &st));
    return st.pages_device_free;
}

/* Device pages the running batch needs for its next token (kvvm_seq_need counts one
   sequence alone: siblings sharing a last page each count a copy, an over-estimate). */
static uint64_t batch_reserve(struct engine *e)
{
    uint64_t sum = 0;
    for (uint32_t i = 0; i < e->n_req * SAMPLES; i++) {
        struct seq *q = &e->seqs[i];
        if (q->state != RUNNING)
            continue;
        uint64_t pages;
        int fits;
        CHECK(e, kvvm_seq_need(e->kv, q->h, q->len + 1, &pages, &fits));
        sum += pages;
    }
    return sum;
}

static uint32_t samples_of(uint32_t req) { return req % SAMPLES == 0 ? SAMPLES : 1; }

/* The waiting sequence to admit next: the one queued first among the swapped-out sequences
   and the arrived requests that have sequence slots for all their samples (a swapped-out
   sequence holds its slot: when the slots are taken, only those can come in). */
static struct seq *queue_head(struct engine *e)
{
    struct seq *best = NULL;
    for (uint32_t i = 0; i < e->n_req * SAMPLES; i++) {
        struct seq *q = &e->seqs[i];
        int waiting = q->state == SWAPPED ||
                      (q->state == DROPPED && e->live < MAX_SEQS) ||
                      (q->state == WAITING && q->sample == 0 &&
                       e->live + samples_of(q->req) <= MAX_SEQS);
        if (waiting && q->queued_at <= e->iter && (!best || q->queued_at < best->queued_at))
            best = q;
    }
    return best;
}

/* 0, or -ENOMEM: the host and disk tiers cannot take q's pages now (it stays resident).
   Host slots busy with pages in flight to disk count as taken until that I/O completes,
   which kvvm_sync waits for. */
static int swap_out(struct engine *e, struct seq *q)
{
    int err = kvvm_seq_swap_out(e->kv, q->h);
    if (err == -ENOMEM) {
        CHECK(e, kvvm_sync(e->kv));
        err = kvvm_seq_swap_out(e->kv, q->h);
    }
    if (err && err != -ENOMEM)
        die(e, "kvvm_seq_swap_out failed: %s (%d)", kvvm_strerror(err), err);
    if (!err) {
        q->state = SWAPPED;
        q->queued_at = e->iter;
    }
    return err;
}

/* Prefill: a new sequence gets the system prompt's pages (share), then tokens up to len
   are written (a new request's prompt, or everything a dropped sequence had). share copies
   the partial last page of every region, so what the rest costs is known only afterwards:
   kvvm_seq_need says. 1 done, 0 not now (nothing held). */
static int prefill(struct engine *e, struct seq *q, uint64_t len, uint64_t reserve)
{
    CHECK(e, kvvm_seq_create(e->kv, &q->h));
    int err = kvvm_seq_share(e->kv, q->h, e->sys, SYSTEM_TOKENS);
    uint64_t pages = 0;
    int fits = 0;
    if (!err)
        CHECK(e, kvvm_seq_need(e->kv, q->h, len + 1, &pages, &fits));
    if (err == -ENOMEM || (!err && pages + reserve > free_pages(e))) {
        CHECK(e, kvvm_seq_free(e->kv, q->h));       /* try again next iteration */
        q->h = 0;
        return 0;
    }
    if (err)
        die(e, "kvvm_seq_share failed: %s (%d)", kvvm_strerror(err), err);
    CHECK(e, kvvm_seq_grow(e->kv, q->h, len));
    q->len = len;
    write_tokens(e, q, SYSTEM_TOKENS, len);
    q->state = RUNNING;
    q->admitted_at = e->iter;
    e->live++;
    return 1;
}

/* A new request: prefill its prompt, then fork it into its samples. */
static int admit_new(struct engine *e, struct seq *q, uint64_t reserve)
{
    uint32_t n = samples_of(q->req);
    if (!prefill(e, q, q->prompt, reserve))
        return 0;
    e->admitted++;
    /* Parallel sampling: the samples share every page of the prefilled prompt. */
    for (uint32_t s = 1; s < n; s++) {
        struct seq *c = q + s;
        CHECK(e, kvvm_seq_fork(e->kv, q->h, &c->h));
        c->len = q->len;
        c->state = RUNNING;
        c->admitted_at = e->iter;
        e->live++;
        e->forked++;
    }
    return 1;
}

/* Brings waiting sequences in, oldest first, while the pages each one needs are free
   beyond what the running batch needs for its next token. Stops at the first that does
   not fit, so nothing overtakes it. */
static void admit(struct engine *e)
{
    uint64_t reserve = batch_reserve(e);
    struct seq *q;
    while ((q = queue_head(e))) {
        if (q->state == WAITING) {
            if (!admit_new(e, q, reserve))
                return;
        } else if (q->state == DROPPED) {
            if (!prefill(e, q, q->len, reserve))   /* recompute: write its tokens again */
                return;
        } else {
            uint64_t pages;
            int fits;
            CHECK(e, kvvm_seq_need(e->kv, q->h, q->len + 1, &pages, &fits));
            if (pages + reserve > free_pages(e))
                return;
            /* Pages on disk come back through the host tier: -ENOMEM also when its slots
               are all busy with pages in flight to disk. kvvm_sync waits for those. */
            int err = kvvm_seq_swap_in(e->kv, q->h);
            if (err == -ENOMEM) {
                CHECK(e, kvvm_sync(e->kv));
                err = kvvm_seq_swap_in(e->kv, q->h);
                e->swap_in_retries++;
            }
            if (err == -ENOMEM)
                return;                     /* still swapped out: next iteration */
            if (err)
                die(e, "kvvm_seq_swap_in failed: %s (%d)", kvvm_strerror(err), err);
            q->state = RUNNING;
            q->admitted_at = e->iter;
            e->swapped_in++;
        }
        reserve = batch_reserve(e);
    }
}

/* Round robin: while others wait, the sequence that has run longest yields once it has
   run for a quantum. */
static void rotate(struct engine *e)
{
    if (!queue_head(e))
        return;
    struct seq *oldest = NULL;
    for (uint32_t i = 0; i < e->n_req * SAMPLES; i++) {
        struct seq *q = &e->seqs[i];
        if (q->state == RUNNING && (!oldest || q->admitted_at < oldest->admitted_at))
            oldest = q;
    }
    if (oldest && e->iter - oldest->admitted_at >= QUANTUM && swap_out(e, oldest) == 0)
        e->rotated++;
}

/* Preemption by recompute, when the tiers below cannot take a sequence: free it; its
   tokens are written again when it comes back (a real engine recomputes them). */
static void drop(struct engine *e, struct seq *q)
{
    CHECK(e, kvvm_seq_free(e->kv, q->h));
    q->h = 0;
    q->state = DROPPED;
    q->queued_at = e->iter;
    e->live--;
    e->dropped++;
}

/* A swapped-out sequence can still hold device pages: a page it shared with a sibling
   stays on the device while the sibling is resident, and remains there (an orphan) when
   the sibling finishes. With the tiers below full they cannot move: drop the oldest such
   sequence. 1 dropped one, 0 there is none. */
static int drop_orphans(struct engine *e)
{
    struct seq *victim = NULL;
    for (uint32_t i = 0; i < e->n_req * SAMPLES; i++) {
        struct seq *q = &e->seqs[i];
        struct kvvm_seq_info in = { .size = sizeof in };
        if (q->state != SWAPPED)
            continue;
        CHECK(e, kvvm_seq_info(e->kv, q->h, &in));
        if (in.pages_device && (!victim || q->queued_at < victim->queued_at))
            victim = q;
    }
    if (victim)
        drop(e, victim);
    return victim != NULL;
}

/* One decode step: every running sequence grows by one token (one kvvm_seq_grow_batch,
   all or nothing). When that does not fit, the most recently admitted sequence is swapped
   out; the pages it frees come back once its copies complete, which kvvm_sync waits for. */
static void decode(struct engine *e)
{
    static kvvm_seq hs[MAX_SEQS];
    static uint64_t lens[MAX_SEQS];
    for (;;) {
        size_t n = 0;
        struct seq *youngest = NULL;
        for (uint32_t i = 0; i < e->n_req * SAMPLES; i++) {
            struct seq *q = &e->seqs[i];
            if (q->state != RUNNING)
                continue;
            hs[n] = q->h;
            lens[n++] = q->len + 1;
            if (!youngest || q->admitted_at >= youngest->admitted_at)
                youngest = q;
        }
        if (!n)
            return;
        int err = kvvm_seq_grow_batch(e->kv, hs, lens, n);
        if (!err)
            break;
        if (err != -ENOMEM)
            die(e, "kvvm_seq_grow_batch of %zu sequences failed: %s (%d)", n,
                kvvm_strerror(err), err);
        if (n > 1 && swap_out(e, youngest))
            drop(e, youngest);
        else if (n == 1 && !drop_orphans(e))
            die(e, "kvvm_seq_grow_batch of 1 sequence failed: %s (%d), and nothing can be "
                "dropped", kvvm_strerror(err), err);
        e->preempted++;
        CHECK(e, kvvm_sync(e->kv));
    }
    struct seq *probe = NULL;
    for (uint32_t i = 0; i < e->n_req * SAMPLES; i++) {
        struct seq *q = &e->seqs[i];
        if (q->state != RUNNING)
            continue;
        write_tokens(e, q, q->len, q->len + 1);
        q->len++;
        probe = q;
    }
    if (e->direct && probe && e->iter % 64 == 0)
        check_direct(e, probe);
}

/* Finished sequences: read back, check, free. */
static void retire(struct engine *e)
{
    for (uint32_t i = 0; i < e->n_req * SAMPLES; i++) {
        struct seq *q = &e->seqs[i];
        if (q->state != RUNNING || q->len < q->target)
            continue;
        verify(e, q);
        CHECK(e, kvvm_seq_free(e->kv, q->h));
        q->h = 0;
        q->state = FINISHED;
        e->live--;
        e->finished++;
    }
}

static void record_peak(struct engine *e)
{
    struct kvvm_stats st = { .size = sizeof st };
    CHECK(e, kvvm_stats(e->kv, &st));
    uint64_t held = (st.pages_device_total - st.pages_device_free) +
                    (st.pages_host_total - st.pages_host_free) +
                    (st.pages_disk_total - st.pages_disk_free);
    if (held > e->peak_pages)
        e->peak_pages = held;
}

/* ---- setup and the main loop -------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr,
            "usage: engine [options]\n"
            "  --requests N     requests to serve (default 48, 1..10000)\n"
            "  --seed N         workload seed (default 1)\n"
            "  --spill-dir DIR  directory of the spill file (default /var/tmp; it must not\n"
            "                   be tmpfs and must take O_DIRECT)\n"
            "  --no-spill       no disk tier\n"
            "  --sync           synchronous mode (no engine stream)\n"
            "  --cuda           run on the GPU (default: the emulated device)\n");
}

static int parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    uint64_t n_req = 48, seed = 1;
    const char *spill_dir = "/var/tmp";
    int sync_mode = 0, cuda = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--requests") && v && !parse_u64(v, 1, 10000, &n_req))
            i++;
        else if (!strcmp(a, "--seed") && v && !parse_u64(v, 0, UINT64_MAX, &seed))
            i++;
        else if (!strcmp(a, "--spill-dir") && v)
            spill_dir = argv[++i];
        else if (!strcmp(a, "--no-spill"))
            spill_dir = NULL;
        else if (!strcmp(a, "--sync"))
            sync_mode = 1;
        else if (!strcmp(a, "--cuda"))
            cuda = 1;
        else {
            fprintf(stderr, "engine: bad option or value: %s%s%s\n", a, v ? " " : "",
                    v ? v : "");
            usage();
            return 2;
        }
    }

    static struct engine eng;
    struct engine *e = &eng;
    rng_state = mix(seed) | 1;

    /* A small configuration: 64 KiB pages on the emulated device (2 MiB, the granule, on a
       GPU), 4 regions of page/256 bytes per token, a device budget far below the work. */
    struct kvvm_config cfg;
    kvvm_config_init(&cfg);   /* defaults, then KVVM_* variables; what follows wins */
    e->page = cuda ? 2u << 20 : 64u << 10;
    e->bpt = e->page / TOKENS_PER_PAGE;
    cfg.backend = cuda ? KVVM_BACKEND_CUDA : KVVM_BACKEND_EMULATED;
    cfg.emu_granule = e->page;
    cfg.page_size = e->page;
    cfg.n_regions = N_REGIONS;
    cfg.bytes_per_token = e->bpt;
    cfg.max_seqs = MAX_SEQS;
    cfg.max_tokens = MAX_TOKENS;
    cfg.device_budget = DEVICE_PAGES * e->page;
    cfg.host_budget = HOST_PAGES * e->page;
    cfg.spill_dir = spill_dir;                  /* the disk tier needs the host tier */
    cfg.spill_budget = spill_dir ? SPILL_PAGES * e->page : 0;
    cfg.flags &= ~KVVM_F_AUTO_SWAP;             /* this engine decides what leaves the device */
    int err = kvvm_open(&cfg, &e->kv);
    if (err) {
        fprintf(stderr, "engine: kvvm_open failed: %s (%d)%s\n", kvvm_strerror(err), err,
                spill_dir ? "; the log above says why (a spill directory that is tmpfs or "
                            "refuses O_DIRECT: try --spill-dir DIR or --no-spill)" : "");
        return 1;
    }
    e->direct = !cuda && !cfg.emu_opaque;
    if (!sync_mode) {
        CHECK(e, kvvm_stream_create(e->kv, &e->stream));
        CHECK(e, kvvm_set_stream(e->kv, e->stream));
    }

    e->n_req = (uint32_t)n_req;
    e->seqs = calloc(e->n_req * SAMPLES, sizeof *e->seqs);
    uint64_t max_bytes = MAX_TOKENS * e->bpt;
    e->buf = malloc(max_bytes);
    e->expect = malloc(e->bpt);
    if (!e->seqs || !e->buf || !e->expect)
        die(e, "out of host memory");
    uint64_t tokens_total = 0;
    for (uint32_t r = 0; r < e->n_req; r++) {
        uint64_t prompt = SYSTEM_TOKENS + uniform(16, 300);
        uint64_t target = prompt + uniform(16, 400);
        for (uint32_t s = 0; s < SAMPLES; s++) {
            struct seq *q = &e->seqs[r * SAMPLES + s];
            q->req = r;
            q->sample = s;
            q->prompt = prompt;
            q->queued_at = 2 * (uint64_t)r;         /* one arrival every two iterations */
            if (s < samples_of(r)) {
                q->target = target;
                tokens_total += target;
            }
        }
    }

    /* The system prompt: written once, shared by every request. */
    CHECK(e, kvvm_seq_create(e->kv, &e->sys));
    CHECK(e, kvvm_seq_grow(e->kv, e->sys, SYSTEM_TOKENS));
    struct seq sysq = { .h = e->sys, .len = SYSTEM_TOKENS, .prompt = SYSTEM_TOKENS };
    write_tokens(e, &sysq, 0, SYSTEM_TOKENS);
    e->live = 1;

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t want = 0;
    for (uint32_t r = 0; r < e->n_req; r++)
        want += samples_of(r);
    while (e->finished < want) {
        rotate(e);
        admit(e);
        decode(e);
        retire(e);
        record_peak(e);
        CHECK(e, kvvm_step(e->kv));   /* the iteration boundary */
        if (++e->iter > 1000000)
            die(e, "no progress: %" PRIu64 " of %" PRIu64 " sequences finished",
                e->finished, want);
    }
    verify(e, &sysq);
    CHECK(e, kvvm_seq_free(e->kv, e->sys));

    /* The end: wait for the stream's work, stop using the stream, then destroy it. */
    CHECK(e, kvvm_sync(e->kv));
    struct kvvm_stats st = { .size = sizeof st };
    CHECK(e, kvvm_stats(e->kv, &st));
    if (e->stream) {
        CHECK(e, kvvm_set_stream(e->kv, NULL));
        CHECK(e, kvvm_stream_destroy(e->kv, e->stream));
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;

    printf("libkvvm %s, %s device, %s mode, %" PRIu64 " KiB pages, device %u pages, "
           "host %u pages, disk %s\n", kvvm_version(), kvvm_backend_name(e->kv),
           e->stream ? "stream" : "synchronous", e->page >> 10, DEVICE_PAGES, HOST_PAGES,
           spill_dir ? spill_dir : "none");
    printf("requests %" PRIu32 " (%" PRIu64 " forked samples), %" PRIu64 " tokens, %" PRIu64
           " iterations, %.2f s\n", e->n_req, e->forked, tokens_total, e->iter, secs);
    printf("preemption: %" PRIu64 " rotations, %" PRIu64 " out of room, %" PRIu64
           " swap-ins (%" PRIu64 " after a kvvm_sync), %" PRIu64 " dropped and recomputed "
           "(tiers full); peak KV held %.1fx the device pages\n", e->rotated, e->preempted,
           e->swapped_in, e->swap_in_retries, e->dropped, (double)e->peak_pages / DEVICE_PAGES);
    printf("library: %" PRIu64 " swap-outs, %" PRIu64 " swap-ins, %" PRIu64 " spills, %"
           PRIu64 " unspills, %" PRIu64 " copy-on-write copies\n", st.swap_outs, st.swap_ins,
           st.spills, st.unspills, st.cow_copies);
    printf("verified: %" PRIu64 " sequences, %" PRIu64 " bytes read back, all correct; direct "
           "CPU checks: %" PRIu64 "%s\n", e->finished + 1, e->bytes_verified,
           e->direct_checks, e->direct ? "" : " (windows not CPU-accessible)");
    kvvm_close(e->kv);
    free(e->seqs);
    free(e->buf);
    free(e->expect);
    return 0;
}
