/*
 * tests/test_model.c: model-based randomized test of the paging layer through the public API.
 *
 * A simple reference model runs beside the library: per sequence its length, the cookie tag
 * of every token in every region (the bytes it must read back) and its block table of model
 * page ids with refcounts (sharing tracked abstractly). Before each call the model computes
 * how many new pages the call needs (copy-on-write of shared pages the call touches, new
 * pages past the end, the partial page a share copies) and so predicts -ENOMEM exactly; after
 * each call it checks kvvm_debug_check, the free page count, every live sequence's info, and
 * the cookies of the sequence the call used (all of it) and of the same tokens in every other
 * sequence (so a write that leaks into a sharer shows). Everything is verified every 1000 ops.
 * A grow_batch needs what the same grows made one after another need: a shared partial page
 * whose holders are all in the batch is copied for all of them but one.
 *
 * Swap (the host tier, no auto-swap so every outcome stays predictable): swap_out and swap_in
 * with exact -ENOMEM prediction (host slots / device pages), pages tracked per tier (a page
 * moves to the host only when no resident sequence holds it; a device page left to swapped-out
 * holders stays on the device); fork, share, truncate and free of a swapped-out sequence;
 * calls that need a resident sequence swap it in first (model-predicted). The device and the
 * host tier are both small, so both run full.
 *
 * Disk (the *_disk configurations): a disk tier under a host tier of one full sequence (plus
 * a page per region), so host pages are pushed to disk constantly (by swap_out making room and
 * by the background spill thread at the host marks) and read back at swap-in. The disk is big
 * enough for every page, so the model keeps one "below the device" tier (host + disk) and
 * checks host free + disk free against it after kvvm_sync; spills and unspills are counted
 * cases of those configurations (from the stats).
 *
 * The test-only in-memory tier (tests/tier_mem.c, the +mem configuration): the same as a
 * disk configuration with that tier in the disk tier's place (one entry added to the list of
 * tiers below the device, nothing else of the library changed), every byte read back checked
 * the same way, and the tier's own count of misuses (a slot freed twice, a transfer on a
 * slot not taken, a slot left at close) 0 at close.
 *
 * Classes, drops and elastic memory (issue 18): sequences get a class (LIVE, CACHED, PINNED)
 * at birth or later; set_budget below the pages in use, and, where a CACHED sequence (or,
 * with KVVM_F_AUTO_SWAP, any other resident one) could be reclaimed, every call short of
 * pages, are not predicted: a success is followed page by page (kvvm_debug_page_tier: drops,
 * demotions, swap-outs), a failure must be -ENOMEM. Every call that fails, predicted or not,
 * must leave every sequence (its own too) as it was: tier, residency, class, dropped state
 * and length, and every prefix entry (below) as it was (a snapshot compare: the first rule
 * of docs/api.md). A dropped sequence is
 * -ESTALE for grow, grow_batch, fork, swap_in and prefetch, before anything moves.
 * Configurations: no flags (4k/1, 64k/4, 2m/4), KVVM_F_CACHE_DEMOTE (64k/1, 64k/1+disk),
 * KVVM_F_AUTO_SWAP | KVVM_F_CACHE_DEMOTE (4k/4, 2m/1, 4k/2+disk; background reclaim off:
 * device marks 0, so only the calls reclaim).
 *
 * The pool view (KVVM_F_POOL_VIEW: 8k/2+view, 16k/1+view+auto): pages of 2 and 4 emulated
 * granules of 4 KiB, tokens of half a page (the view needs page_size a multiple of
 * bytes_per_token: no token straddles pages there), trim and set_budget among the calls as
 * everywhere. After every op, every resident sequence's block table: -1 exactly for the
 * blocks discarded in every region, ids below kvvm_pool_blocks, blocks holding the same
 * model page in a region where both have one share an id only if they hold the same pages
 * in every such region, and each granule of each page at its id in the pool view maps what
 * the window maps there (handle and offset, read-write): the same bytes, by the driver.
 *
 * The prefix cache (the +prefix configurations: 4k/4+auto, 64k/1+demote, 4k/2+disk+auto
 * and both view ones; tokens of half a page there, so a block is a page):
 * publish (keys derived from the sequence's content, as an engine derives them from token
 * ids, under 3 namespaces), lookup (the hit and each block's tier), attach into empty
 * sequences (swapped out or not; the hit, the device room it needs, its bytes checked
 * against the entries' tags) and drop (keys, or a whole namespace). The model holds every
 * entry's pages (a reference each, so copy-on-write and room are predicted as for forks);
 * entries only entries hold are reclaimable (a call short of pages, or of host slots
 * without a disk tier, is then not predicted), and after every op each entry is checked
 * present with its pages in the model's tiers (kvvm_debug_prefix_entry: no LRU mark).
 * The failed-call snapshot includes every entry: present, its page's tier per region, and
 * the entry count.
 *
 * Matrix: page sizes {4 KiB, 64 KiB, 2 MiB} (emulated granule = page size) x regions {1, 4};
 * tokens of 3/8 page + 36 bytes straddle pages (4k/1, 64k/4, 2m/1+auto, 2m/4,
 * 64k/1+disk+demote). Large tokens are checked through probes (the
 * head and tail of each token and both sides of each page boundary inside it); tokens of at
 * most 4 KiB are checked byte for byte.
 *
 * Scale: KVVMTEST_SCALE (a factor on the op counts; default 1, 0.05 under AddressSanitizer);
 * KVVMTEST_MODEL_SOAK=1 runs 20 seeds x 100 000 ops per configuration (ctest label soak);
 * KVVMTEST_MODEL_SEED overrides the first seed; KVVMTEST_MODEL_KEEP_GOING=1 lists every broken
 * failed-call rule of a run (printed, counted, followed) instead of stopping at the first. Each configuration must hit every counted case at
 * least 100 times (scaled), but for the refused set_budget, the calls that moved others and
 * the failed calls where reclaim was possible (counted: they depend on the flags).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <setjmp.h>
#include <time.h>
#include <unistd.h>
#include "kvvm.h"
#include "testing/kvvm_testing.h"
#include "tier_mem.h"
#include "vmm/emu/emu.h"
#include "testing/kvvm_testing.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

#define MAXR 4
#define MAXS 8
#define PROBE 64                /* probe half-width in bytes */
#define FULL_BPT 4096           /* tokens up to this size are checked byte for byte */
#define PROBE_RUN (8 * PROBE)   /* the most bytes of adjacent probes verified by one read */

enum {
    C_CREATE, C_ENOSPC, C_GROW, C_GROW_BATCH, C_E2BIG, C_EINVAL, C_TRUNCATE, C_FORK,
    C_SHARE_ZERO, C_SHARE_ALL, C_SHARE_PARTIAL, C_COW_PARTIAL, C_COW_FULL, C_STRADDLE,
    C_ENOMEM, C_ENOMEM_BATCH, C_ZERO_TAIL, C_FREE_SHARED, C_PREP_WRITE, C_WRITE, C_FREE,
    C_SWAP_OUT, C_SWAP_IN, C_OUT_OPS, C_SWAP_ENOMEM, C_SPILL, C_UNSPILL,
    C_DISCARD, C_DROP, C_BUDGET, C_BUDGET_ENOMEM, C_SHRINK, C_STALE, C_RECLAIMED,
    C_FAILED_SAME, C_PUBLISH, C_LOOKUP, C_ATTACH, C_ATTACH_IN, C_PDROP, C_ENT_RECLAIMED, NC
};
static const char *const cname[NC] = {
    "create", "create/fork -ENOSPC", "grow", "grow_batch", "-E2BIG", "-EINVAL", "truncate",
    "fork", "share of 0 tokens", "share of all tokens", "share copying a partial page",
    "copy-on-write of a partial page", "copy-on-write of a full page",
    "token straddling pages written", "rollback after -ENOMEM", "grow_batch rollback after -ENOMEM",
    "share's zeroed tail read back", "free of a sequence with shared pages",
    "prepare_write + write", "write into a shared page", "free",
    "swap_out", "swap_in", "fork/share/truncate/free while swapped out",
    "swap -ENOMEM (device or host full)",
    "spill (host -> disk; disk configs)", "unspill (disk -> host; disk configs)",
    "discard releasing pages", "CACHED sequence dropped for a grow",
    "set_budget within the pages in use + trim", "set_budget refused (all protected)",
    "set_budget below the pages in use", "call on a dropped sequence (-ESTALE)",
    "call that moved or dropped others", "failed call with reclaim possible",
    "prefix publish (new entries)", "prefix lookup that hit", "prefix attach that hit",
    "prefix attach bringing pages up", "prefix drop (entries removed)",
    "prefix entry dropped or moved by a call",
};

struct mcfg {
    size_t ps;
    uint32_t nr;
    uint64_t bpt;
    uint32_t max_seqs;
    uint64_t max_tokens;
    uint32_t pages_per_region;      /* device budget = this * nr pages */
    bool disk;                      /* a disk tier under a small host tier */
    bool mem;                       /* ... the in-memory tier (tests/tier_mem.c) in its place */
    unsigned flags;                 /* KVVM_F_AUTO_SWAP, KVVM_F_CACHE_DEMOTE, KVVM_F_POOL_VIEW */
    size_t gran;                    /* the emulated granule (ps, or below it with the view) */
    bool pfx;                       /* prefix calls (tokens of half a page: blocks are pages) */
};

struct mseq {
    bool live;
    kvvm_seq h;
    uint32_t slot;
    uint64_t len;
    uint64_t zero_until;            /* bytes [len*bpt, zero_until) read zero (share's copy) */
    uint32_t *tag[MAXR];            /* per token: the tag of its cookies */
    int32_t *mp[MAXR];              /* per page index: model page id; HOLE = discarded */
    bool out;                       /* swapped out */
    uint64_t kept[MAXR];            /* first_kept per region (kvvm_seq_discard) */
    uint32_t cls;                   /* enum kvvm_seq_class */
    bool dropped;                   /* a dropped CACHED sequence: -ESTALE */
};

/* What "a failed call changes nothing" compares of every sequence: tier, residency,
   class, dropped state and length (disk configurations: host + disk as one tier, the spill
   thread moves pages between them at any time). */
struct snapent {
    bool live;
    uint64_t len;
    uint32_t dev, below, cls;
    int resident, dropped;
};
#define HOLE (-1)

/* The prefix cache (the configurations with pfx, tokens of half a page: a block is 2
   tokens): entries the model knows (every publish goes through it), each one block of
   pages, one per region, with the tags of its tokens (the bytes an attach must read), and
   the chains of keys published lately (lookup, attach and drop name them after their
   publisher is gone). Keys are derived from content, as an engine's: key i chains key
   i-1 with the tags of block i's tokens in every region. */
#define TPB 2                       /* tokens per block where pfx */
#define MAXE 40                     /* model entries */
#define MAXB 8                      /* blocks of a full sequence (max_tokens / TPB) */
#define MAXCH 12                    /* chains remembered */
#define NNS 3                       /* namespaces 1..NNS */
/* The prefix cache's calls (publish, lookup, attach, drop; the test's own flag, not the
   library's): tokens of half a page there, so that a block is a page; the configurations
   without it keep tokens that straddle pages. */
#define PFX (1u << 30)
#define MEM (1u << 29)              /* run_config_d: the +mem configuration (mcfg.mem) */
struct ment {
    bool live;
    uint64_t ns;
    kvvm_key key;
    int32_t mp[MAXR];               /* model page ids (one reference each) */
    uint32_t tag[MAXR][TPB];
};
struct mchain {
    uint64_t ns;
    uint32_t n;
    kvvm_key key[MAXB];
};
/* What the snapshot keeps of an entry: present, and its page's tier per region (1 device,
   2 below: host, or disk in the disk configurations, where the spill thread moves them). */
struct esnapent {
    bool live;
    uint8_t w[MAXR];
};

struct model {
    struct mcfg c;
    kvvm *kv;
    uint64_t total, used;           /* device pages (total: the budget now) */
    uint64_t total0;                /* the budget at open (set_budget stays at or below it) */
    uint64_t host_total, host_used; /* host slots (disk configs: host + disk slots) */
    uint64_t spills, unspills;      /* disk configs: the stats at the last check */
    char dir[64];                   /* disk configs: the spill directory */
    uint32_t *ref;                  /* per model page id */
    uint8_t *onhost;                /* per model page id: in the host tier */
    uint32_t *tmpdec;               /* planning: references a planned COW already dropped */
    int32_t *ids;                   /* free id stack */
    uint64_t nids;
    uint64_t maxpg;                 /* pages per region of a full sequence */
    struct mseq s[MAXS];
    uint64_t rng;
    uint32_t next_tag;
    uint64_t cnt[NC];
    bool probe;
    uint8_t *buf, *exp;
    size_t bufsz;
    uint64_t op;
    unsigned long seed;
    char where[160];
    struct snapent snap[MAXS];      /* the state before the call now running */
    uint64_t violations;            /* failed calls that changed something (keep_going) */
    struct ment e[MAXE];
    uint32_t *eref;                 /* per model page id: the entries' references */
    struct mchain ch[MAXCH];
    uint32_t nch;                   /* chains recorded so far (the ring: nch % MAXCH) */
    struct esnapent esnap[MAXE];    /* the entries before the call now running */
    uint64_t esnap_n;               /* prefix_entries then */
};

/* ---------------------------------------------------------------- helpers */

static uint64_t rnd(struct model *m)
{
    uint64_t x = m->rng;
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
    m->rng = x;
    return x * 0x2545f4914f6cdd1dull;
}

static uint64_t rndn(struct model *m, uint64_t n) { return n ? rnd(m) % n : 0; }

static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27; x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

/* Cookie bytes of tag t in region r at byte offset off (the token is implied by off and the
   tag names the lineage and the write). Never 0. */
static void gen(uint8_t *dst, uint32_t t, uint32_t r, uint64_t off, size_t len)
{
    uint64_t seed = ((uint64_t)t << 32) ^ ((uint64_t)r << 24);
    size_t i = 0;
    while (i < len) {
        uint64_t o = off + i;
        uint64_t w = mix64(seed ^ (o >> 3)) | 0x0101010101010101ull;
        if ((o & 7) == 0 && i + 8 <= len) {
            memcpy(dst + i, &w, 8);
            i += 8;
        } else {
            dst[i++] = (uint8_t)(w >> (8 * (o & 7)));
        }
    }
}

static uint64_t npages(const struct model *m, uint64_t len)
{
    return (len * m->c.bpt + m->c.ps - 1) / m->c.ps;
}

static bool straddles(const struct model *m, uint64_t t)
{
    return (t * m->c.bpt) / m->c.ps != ((t + 1) * m->c.bpt - 1) / m->c.ps;
}

#define MFAIL(m, ...) do {                                                     \
        char msg_[512];                                                        \
        snprintf(msg_, sizeof msg_, __VA_ARGS__);                              \
        cr_assert_fail("seed %lu op %lu (%s): %s", (m)->seed, (unsigned long)(m)->op, \
                       (m)->where, msg_);                                      \
    } while (0)
#define MCHECK(m, cond, ...) do { if (!(cond)) MFAIL(m, __VA_ARGS__); } while (0)

/* ---------------------------------------------------------------- driver refusals */

/* "A failed call changes nothing" under driver refusals (issue 31): before one call in
   REFUSE_ONE_IN of those the ops make (every call that may move pages: grow, grow_batch,
   share, prepare_write, write, swap_in, swap_out, fork, truncate, free, discard,
   set_budget), one driver entry point is armed to refuse (CUDA_ERROR_OUT_OF_MEMORY) at
   its nth call from then (nth 1..6), chosen among every entry point the emulated device
   has seen called so far (the library's threads' calls too), and the call is made, traced
   (emu_trace_start: every entry point call, on any thread, context or not). When the
   refusal fired within the call and the call failed, the failed call is checked against a
   snapshot taken just before it (unchanged: every sequence, its own too); then the refusal
   is cleared and the call made again, as the op would have made it (its prediction stands:
   nothing changed). A call that succeeded, refused or not, is the op's call. Counted per
   entry point and printed per configuration: injections, refusals that fired within the
   call, failed calls checked, absorbed (succeeded anyway), violations.
   What the library guarantees (docs/api.md, Conventions): a failed call changes nothing,
   whichever entry point the driver refused: a refusal of what a call creates
   (cuMemCreate, cuEventCreate, cuStreamCreate) is had before anything moves, and one of a
   map, set-access, copy or synchronization after the call's reclaim moved others is taken
   back (the moves undone: swap/undo.c). Every violation fails the test
   (KVVMTEST_MODEL_KEEP_GOING=1: counted per entry point and listed, the model follows the
   library and the op is abandoned, its prediction gone), but for the undo's documented
   limit: a call that reports -EIO "could not be undone" (a CACHED sequence dropped for the
   call, whose frames the call had written into before the refusal: no room anywhere held
   its bytes) is counted apart per entry point and printed, the context checked alive and
   consistent. KVVMTEST_MODEL_REFUSALS=off injects none (the model alone). */
#define REFUSE_ONE_IN 4
static void snap_take(struct model *m);
static void unchanged(struct model *m, int rc);
enum { N_ENTRY = sizeof(struct emu_calls) / sizeof(uint64_t) };
#define ENTRY_NAME(n) #n,
static const char *const entry_name[N_ENTRY] = { EMU_ENTRIES(ENTRY_NAME) };
#undef ENTRY_NAME
struct refusal_count {
    uint64_t armed, fired, checked, absorbed, violations, eio;
    uint64_t undo_lost;             /* changed, reported -EIO "could not be undone" */
    uint64_t traced;                /* its calls seen in the traced calls */
};
static struct refusal_count refusals[N_ENTRY];   /* this configuration's */
static struct {
    int entry;
    unsigned long nth;
    uint64_t violations0;
} refusal;
#define REFUSE_TRACE 65536
static struct emu_trace_entry refusal_trace[REFUSE_TRACE];
static bool undo_lost;              /* unchanged(): the call reported its undo's limit */
static jmp_buf op_abandon;          /* model_run's: the op after a followed violation */
static bool op_rewrites;            /* the call now running is made again (REFUSABLE_AGAIN) */

/* KVVMTEST_MODEL_REFUSALS=off: no refusal is injected (the model alone). */
static bool refusals_mode(const char *mode)
{
    const char *e = getenv("KVVMTEST_MODEL_REFUSALS");
    return e && !strcmp(e, mode);
}

/* Arms a refusal for the next call (one call in REFUSE_ONE_IN); true when armed. */
static bool refusal_arm(struct model *m)
{
    if (rndn(m, REFUSE_ONE_IN) || refusals_mode("off"))
        return false;
    struct emu_calls dev;
    MCHECK(m, emu_calls_get(kvvm_debug_emu_ordinal(m->kv), &dev) == 0, "emu_calls_get");
    /* three times in four one the calls were seen to make (in the traced calls), else
       any the device has seen called (each of them gets its turn) */
    bool in_calls = rndn(m, 4) != 0;
    int seen[N_ENTRY], n = 0;
    for (int pass = 0; pass < 2 && !n; pass++, in_calls = false)
        for (int e = 0; e < N_ENTRY; e++)
            if (in_calls ? refusals[e].traced != 0 : ((const uint64_t *)&dev)[e] != 0)
                seen[n++] = e;
    if (!n)
        return false;
    int e = seen[rndn(m, (uint64_t)n)];
    snap_take(m);                   /* the state the call starts from */
    refusal.entry = e;
    refusal.nth = 1 + (unsigned long)rndn(m, 6);
    refusal.violations0 = m->violations;
    emu_trace_start();
    MCHECK(m, emu_fail_arm(entry_name[e], refusal.nth, KCU_ERROR_OUT_OF_MEMORY) == 0,
           "emu_fail_arm(%s)", entry_name[e]);
    refusals[e].armed++;
    return true;
}

/* After the armed call returned rc: true when the refusal fired in it and it failed
   (checked: nothing changed), and the op makes the call again. */
static bool refusal_failed(struct model *m, int rc, const char *call)
{
    emu_fail_clear();
    size_t n = emu_trace_stop(refusal_trace, REFUSE_TRACE);
    if (n > REFUSE_TRACE)
        n = REFUSE_TRACE;
    bool fired = false;
    for (size_t i = 0; i < n; i++)
        for (int e = 0; e < N_ENTRY; e++)
            if (!strcmp(refusal_trace[i].entry, entry_name[e])) {
                refusals[e].traced++;
                fired |= e == refusal.entry && refusal_trace[i].nth == refusal.nth;
                break;
            }
    struct refusal_count *k = &refusals[refusal.entry];
    if (!fired)
        return false;               /* the call ran as the op's */
    k->fired++;
    if (rc >= 0) {                  /* (the prefix calls return counts) */
        k->absorbed++;
        return false;
    }
    char saved[sizeof m->where];
    memcpy(saved, m->where, sizeof saved);
    snprintf(m->where, sizeof m->where, "%.80s [%s refused at its call %lu: %s]", saved,
             entry_name[refusal.entry], refusal.nth, call);
    /* -ENOMEM, or the call's own error where it fails anyway (a fork with every slot in
       use: -ENOSPC); never a dead context (an out-of-memory refusal is not sticky). A
       staged disk swap reports a refused synchronization as -EIO (its I/O failed), the
       context alive: counted (eio) */
    /* the documented limit (docs/api.md, Conventions): a move the failed call could not take
       back (a drop whose frames the call had written into before the refusal) is reported
       -EIO with that cause; the context alive and consistent (check_state) */
    bool lost = rc == -EIO && strstr(kvvm_last_error(), "could not be undone") != NULL;
    if (rc == -EIO) {
        struct kvvm_stats st = { .size = sizeof st };
        MCHECK(m, kvvm_stats(m->kv, &st) == 0, "a refusal left the context dead");
        k->eio++;
    }
    undo_lost = lost;
    unchanged(m, rc);
    undo_lost = false;
    k->checked++;
    memcpy(m->where, saved, sizeof saved);
    uint64_t v = m->violations - refusal.violations0;
    if (!v)
        return true;
    if (lost) {
        k->undo_lost += v;
        m->violations -= v;         /* reported by the library: counted apart, printed */
    } else {
        k->violations += v;
    }
    /* followed (unchanged resynced the others): a call that may have written its own
       bytes before the refusal (a write whose copy was enqueued) is made again, which
       writes them as the model has them, as is one whose op predicts nothing
       (REFUSABLE_AGAIN); any other op ends here, its prediction gone */
    if (!op_rewrites)
        longjmp(op_abandon, 1);
    return true;
}

/* The call, with a refusal armed before it now and then (above); its result as the op
   would have had it. */
#define REFUSABLE(m, call) ({                                                  \
        int rr_ = 0;                                                           \
        bool again_ = true;                                                    \
        if (refusal_arm(m)) {                                                  \
            rr_ = (call);                                                      \
            again_ = refusal_failed(m, rr_, #call);                            \
        }                                                                      \
        if (again_)                                                            \
            rr_ = (call);                                                      \
        rr_;                                                                   \
    })

/* A call made again after a followed violation (refusal_failed): a write (its bytes may
   be written), or one whose op predicts nothing (set_budget below the pages in use: any
   outcome is followed), so that the op still counts. */
#define REFUSABLE_AGAIN(m, call) ({                                            \
        op_rewrites = true;                                                    \
        int rw_ = REFUSABLE(m, call);                                          \
        op_rewrites = false;                                                   \
        rw_;                                                                   \
    })

static void refusals_reset(void)
{
    memset(refusals, 0, sizeof refusals);
}

/* Prints the counts per entry point (those armed); some failed call must have been
   checked. Violations are the model's (unchanged: counted with KVVMTEST_MODEL_KEEP_GOING,
   else the first one fails the test). */
static void refusals_report(const char *name)
{
    uint64_t armed = 0, checked = 0, violations = 0, lost = 0;
    printf("  driver refusals (CUDA_ERROR_OUT_OF_MEMORY, one at a time) per entry point: "
           "injections, fired in the call, failed calls checked, absorbed, violations, "
           "-EIO returned, of those an undo's limit (changed, reported)\n");
    for (int e = 0; e < N_ENTRY; e++) {
        const struct refusal_count *k = &refusals[e];
        if (!k->armed)
            continue;
        printf("    %-34s %8lu %8lu %8lu %6lu %6lu %4lu %4lu\n", entry_name[e],
               (unsigned long)k->armed, (unsigned long)k->fired, (unsigned long)k->checked,
               (unsigned long)k->absorbed, (unsigned long)k->violations,
               (unsigned long)k->eio, (unsigned long)k->undo_lost);
        lost += k->undo_lost;
        armed += k->armed;
        checked += k->checked;
        violations += k->violations;
    }
    printf("  driver refusals: %lu injections, %lu failed calls checked, %lu violations "
           "(a failed call that changed something: none, or the test failed), %lu undo limits "
           "(-EIO \"could not be undone\": a dropped sequence's frames written before the "
           "refusal)\n", (unsigned long)armed, (unsigned long)checked,
           (unsigned long)violations, (unsigned long)lost);
    cr_expect(checked > 0 || refusals_mode("off"), "%s: no failed call under a driver "
              "refusal was checked", name);
}

/* ---------------------------------------------------------------- model pages */

static int32_t pg_alloc(struct model *m)
{
    MCHECK(m, m->nids > 0, "model out of pages (the library succeeded past its budget)");
    int32_t id = m->ids[--m->nids];
    m->ref[id] = 1;
    m->used++;
    return id;
}

static int32_t pg_alloc_host(struct model *m)
{
    MCHECK(m, m->nids > 0, "model out of page ids");
    int32_t id = m->ids[--m->nids];
    m->ref[id] = 1;
    m->onhost[id] = 1;
    m->host_used++;
    return id;
}

static void pg_put(struct model *m, int32_t id)
{
    if (--m->ref[id] == 0) {
        m->ids[m->nids++] = id;
        if (m->onhost[id])
            m->host_used--;
        else
            m->used--;
        m->onhost[id] = 0;
    }
}

/* Whether a resident live sequence other than `except` holds page id. */
static bool resident_holder(struct model *m, int32_t id, const struct mseq *except)
{
    for (int i = 0; i < MAXS; i++) {
        struct mseq *s = &m->s[i];
        if (!s->live || s->out || s == except)
            continue;
        uint64_t np = npages(m, s->len);
        for (uint32_t r = 0; r < m->c.nr; r++)
            for (uint64_t k = 0; k < np; k++)
                if (s->mp[r][k] == id)
                    return true;
    }
    return false;
}

static uint64_t mfree(const struct model *m) { return m->total - m->used; }

/* Copy-on-write need of the byte range [b0, b1) of region r (existing pages only), counting
   references a planned COW already dropped (tmpdec). With mark, the planned COWs are
   recorded in tmpdec (grow_batch plans sequences in order). */
static uint64_t need_cow(struct model *m, struct mseq *s, uint32_t r, uint64_t b0,
                         uint64_t b1, bool mark, int32_t *touched, int *ntouched)
{
    uint64_t n = 0, have = npages(m, s->len);
    if (b1 <= b0)
        return 0;
    for (uint64_t k = b0 / m->c.ps; k <= (b1 - 1) / m->c.ps && k < have; k++) {
        int32_t id = s->mp[r][k];
        if (id == HOLE) {               /* a grow makes a discarded last page again */
            n++;
            continue;
        }
        if (m->ref[id] - m->tmpdec[id] > 1) {
            n++;
            if (mark) {
                m->tmpdec[id]++;
                touched[(*ntouched)++] = id;
            }
        }
    }
    return n;
}

/* Applies copy-on-write over [b0, b1) of region r; counts the cases. */
static void apply_cow(struct model *m, struct mseq *s, uint32_t r, uint64_t b0, uint64_t b1)
{
    uint64_t have = npages(m, s->len);
    bool partial = (s->len * m->c.bpt) % m->c.ps != 0;
    if (b1 <= b0)
        return;
    for (uint64_t k = b0 / m->c.ps; k <= (b1 - 1) / m->c.ps && k < have; k++) {
        int32_t id = s->mp[r][k];
        if (id == HOLE) {
            s->mp[r][k] = pg_alloc(m);
            continue;
        }
        if (m->ref[id] > 1) {
            pg_put(m, id);
            s->mp[r][k] = pg_alloc(m);
            m->cnt[partial && k == have - 1 ? C_COW_PARTIAL : C_COW_FULL]++;
        }
    }
}

static uint64_t need_grow(struct model *m, struct mseq *s, uint64_t nl, bool mark,
                          int32_t *touched, int *ntouched)
{
    if (nl <= s->len)
        return 0;
    uint64_t n = 0;
    for (uint32_t r = 0; r < m->c.nr; r++)
        n += need_cow(m, s, r, s->len * m->c.bpt, nl * m->c.bpt, mark, touched, ntouched);
    return n + m->c.nr * (npages(m, nl) - npages(m, s->len));
}

/* ---------------------------------------------------------------- device I/O */

static void ensure_buf(struct model *m, size_t n)
{
    if (n <= m->bufsz)
        return;
    free(m->buf);
    free(m->exp);
    m->buf = malloc(n);
    m->exp = malloc(n);
    cr_assert(m->buf && m->exp);
    m->bufsz = n;
}

/* The byte ranges of token t that are written and checked: all of it for small tokens, else
   its head, its tail and both sides of every page boundary inside it. */
static int probes(const struct model *m, uint64_t t, uint64_t *off, uint64_t *len)
{
    uint64_t s = t * m->c.bpt, e = s + m->c.bpt;
    if (!m->probe) {
        off[0] = s;
        len[0] = m->c.bpt;
        return 1;
    }
    int n = 0;
    off[n] = s; len[n++] = PROBE;
    off[n] = e - PROBE; len[n++] = PROBE;
    for (uint64_t b = (s / m->c.ps + 1) * m->c.ps; b < e; b += m->c.ps) {
        uint64_t lo = b - PROBE < s ? s : b - PROBE, hi = b + PROBE > e ? e : b + PROBE;
        off[n] = lo;
        len[n++] = hi - lo;
    }
    return n;
}

static void dev_write(struct model *m, struct mseq *s, uint32_t r, uint64_t off, uint64_t len,
                      uint32_t tag)
{
    ensure_buf(m, len);
    gen(m->buf, tag, r, off, len);
    int rc = REFUSABLE_AGAIN(m, kvvm_seq_write(m->kv, s->h, r, off, m->buf, len));
    MCHECK(m, rc == 0, "kvvm_seq_write(r%u, %lu+%lu) after the range was made writable: %d",
           r, (unsigned long)off, (unsigned long)len, rc);
}

/* Writes tokens [a, b) of every region (probes only for large tokens) with a new tag each.
   The range must already be writable (grown or prepared): every write must succeed. */
static void write_tokens(struct model *m, struct mseq *s, uint64_t a, uint64_t b)
{
    uint64_t off[16], len[16];
    for (uint32_t r = 0; r < m->c.nr; r++) {
        uint32_t tag = ++m->next_tag;
        if (!m->probe && b > a) {
            dev_write(m, s, r, a * m->c.bpt, (b - a) * m->c.bpt, tag);
        } else {
            for (uint64_t t = a; t < b; t++) {
                int n = probes(m, t, off, len);
                for (int i = 0; i < n; i++)
                    dev_write(m, s, r, off[i], len[i], tag);
            }
        }
        for (uint64_t t = a; t < b; t++)
            s->tag[r][t] = tag;
    }
    for (uint64_t t = a; t < b; t++)
        if (straddles(m, t))
            m->cnt[C_STRADDLE]++;
}

static void check_bytes(struct model *m, struct mseq *s, uint32_t r, uint64_t off,
                        uint64_t len, const uint8_t *want, const char *what)
{
    int rc = kvvm_seq_read(m->kv, s->h, r, off, m->buf, len);
    MCHECK(m, rc == 0, "kvvm_seq_read(r%u, %lu+%lu): %d", r, (unsigned long)off,
           (unsigned long)len, rc);
    if (memcmp(m->buf, want, len)) {
        uint64_t i = 0;
        while (m->buf[i] == want[i])
            i++;
        uint64_t b = off + i;
        MFAIL(m, "%s: seq %ld region %u byte %lu (token %lu, page %lu) reads %#x, expected "
              "%#x", what, (long)(s - m->s), r, (unsigned long)b,
              (unsigned long)(b / m->c.bpt), (unsigned long)(b / m->c.ps), m->buf[i], want[i]);
    }
}

/* Verifies tokens [a, b) of s in every region. */
static void verify_tokens(struct model *m, struct mseq *s, uint64_t a, uint64_t b)
{
    if (b > s->len)
        b = s->len;
    if (a >= b)
        return;
    uint64_t off[16], len[16], a0 = a;
    if (!m->probe) {
        ensure_buf(m, (b - a) * m->c.bpt);
        for (uint32_t r = 0; r < m->c.nr; r++) {
            a = a0 > s->kept[r] ? a0 : s->kept[r];     /* discarded tokens: gone */
            if (a >= b)
                continue;
            for (uint64_t t = a; t < b; t++)
                gen(m->exp + (t - a) * m->c.bpt, s->tag[r][t], r, t * m->c.bpt, m->c.bpt);
            check_bytes(m, s, r, a * m->c.bpt, (b - a) * m->c.bpt, m->exp, "cookie");
        }
        return;
    }
    /* The probes in order, each run of adjacent or overlapping ones (a token's last probe
       and the next token's first are adjacent) read and compared at once: the same bytes
       against the same expected bytes, in half the reads. */
    ensure_buf(m, PROBE_RUN);
    for (uint32_t r = 0; r < m->c.nr; r++) {
        uint64_t lo = 0, hi = 0;           /* the run read so far: [lo, hi) */
        for (uint64_t t = a0 > s->kept[r] ? a0 : s->kept[r]; t < b; t++) {
            int n = probes(m, t, off, len);
            for (int i = 1; i < n; i++)    /* by offset (insertion: n <= 16) */
                for (int j = i; j > 0 && off[j - 1] > off[j]; j--) {
                    uint64_t o = off[j], l = len[j];
                    off[j] = off[j - 1], len[j] = len[j - 1];
                    off[j - 1] = o, len[j - 1] = l;
                }
            for (int i = 0; i < n; i++) {
                if (hi > lo && (off[i] > hi || off[i] + len[i] - lo > PROBE_RUN)) {
                    check_bytes(m, s, r, lo, hi - lo, m->exp, "cookie");
                    lo = hi = 0;
                }
                if (hi == lo)
                    lo = hi = off[i];
                gen(m->exp + (off[i] - lo), s->tag[r][t], r, off[i], len[i]);
                if (off[i] + len[i] > hi)
                    hi = off[i] + len[i];
            }
        }
        if (hi > lo)
            check_bytes(m, s, r, lo, hi - lo, m->exp, "cookie");
    }
}

/* Verifies what a call on s over tokens [a, b) may have touched: all of s, and the same
   tokens in every other live sequence (a sharer must not see s's write). */
static void verify_touched(struct model *m, struct mseq *s, uint64_t a, uint64_t b)
{
    for (int i = 0; i < MAXS; i++)
        if (m->s[i].live && !m->s[i].out && &m->s[i] != s)
            verify_tokens(m, &m->s[i], a, b);
    if (s && !s->out)
        verify_tokens(m, s, 0, s->len);
}

static bool ensure_in(struct model *m, struct mseq *s);
static void op_set_class(struct model *m, struct mseq *s);

/* Every sequence, swapped-out ones brought back where there is room. */
static void snap_take(struct model *m);

static void verify_all(struct model *m)
{
    snap_take(m);                   /* (between ops: the step may have settled copies) */
    for (int i = 0; i < MAXS; i++)         /* (a dropped one holds nothing: -ESTALE) */
        if (m->s[i].live && !m->s[i].dropped && ensure_in(m, &m->s[i]))
            verify_tokens(m, &m->s[i], 0, m->s[i].len);
}

/* Bytes [s->len*bpt, min(zero_until, nl*bpt)) of the tokens just grown must read zero
   (share zeroed them). Called after grow, before the new tokens are written. */
static void check_zero_tail(struct model *m, struct mseq *s, uint64_t old)
{
    uint64_t lo = old * m->c.bpt, hi = s->len * m->c.bpt;
    if (s->zero_until < hi)
        hi = s->zero_until;
    if (hi <= lo)
        return;
    uint64_t off[16], len[16];
    ensure_buf(m, m->probe ? 4 * PROBE : m->c.bpt);
    memset(m->exp, 0, m->probe ? 4 * PROBE : m->c.bpt);
    for (uint64_t t = old; t < s->len && t * m->c.bpt < hi; t++) {
        int n = probes(m, t, off, len);
        for (int i = 0; i < n; i++) {
            uint64_t o = off[i], e = off[i] + len[i];
            if (e > hi)
                e = hi;
            for (uint32_t r = 0; r < m->c.nr && o < e; r++)
                check_bytes(m, s, r, o, e - o, m->exp, "share's tail not zeroed");
        }
    }
    m->cnt[C_ZERO_TAIL]++;
}

/* ---------------------------------------------------------------- per-op checks */

static void snap_set(struct snapent *e, const struct kvvm_seq_info *in)
{
    *e = (struct snapent){ .live = true, .len = in->length, .dev = in->pages_device,
                           .below = in->pages_host + in->pages_disk, .cls = in->cls,
                           .resident = in->resident, .dropped = in->dropped };
}

/* kvvm_seq_info of model sequence i into *in and its snapshot entry; false: not live. */
static bool snap_info(struct model *m, int i, struct kvvm_seq_info *in)
{
    m->snap[i].live = false;
    if (!m->s[i].live)
        return false;
    memset(in, 0, sizeof *in);
    in->size = sizeof *in;
    int rc = kvvm_seq_info(m->kv, m->s[i].h, in);
    MCHECK(m, rc == 0, "kvvm_seq_info(seq %d): %d", i, rc);
    snap_set(&m->snap[i], in);
    return true;
}

static void check_entries(struct model *m);

static void check_state(struct model *m)
{
    char why[512] = "";
    int rc = kvvm_debug_check(m->kv, why, sizeof why);
    MCHECK(m, rc == 0, "invariant violated (%d): %.400s", rc, why);
    struct kvvm_stats st = { .size = sizeof st };
    rc = kvvm_stats(m->kv, &st);
    MCHECK(m, rc == 0, "kvvm_stats %d", rc);
    MCHECK(m, st.pages_device_free == mfree(m), "pages_device_free %lu, model %lu",
           (unsigned long)st.pages_device_free, (unsigned long)mfree(m));
    if (m->c.disk) {
        /* the spill thread works between calls: settle it, then count both tiers as one */
        rc = kvvm_sync(m->kv);
        MCHECK(m, rc == 0, "kvvm_sync %d", rc);
        rc = kvvm_stats(m->kv, &st);
        MCHECK(m, rc == 0 && st.pages_inflight == 0, "kvvm_stats %d, in flight %lu", rc,
               (unsigned long)st.pages_inflight);
        MCHECK(m, st.checksum_failures == 0 && st.io_errors == 0 && st.pages_damaged == 0,
               "disk errors: %lu checksum, %lu I/O", (unsigned long)st.checksum_failures,
               (unsigned long)st.io_errors);
        m->cnt[C_SPILL] += st.spills != m->spills;
        m->cnt[C_UNSPILL] += st.unspills != m->unspills;
        m->spills = st.spills;
        m->unspills = st.unspills;
        st.pages_host_free += st.pages_disk_free;
    }
    MCHECK(m, st.pages_host_free == m->host_total - m->host_used,
           "pages_host_free %lu, model %lu", (unsigned long)st.pages_host_free,
           (unsigned long)(m->host_total - m->host_used));
    for (int i = 0; i < MAXS; i++) {
        struct mseq *s = &m->s[i];
        struct kvvm_seq_info in;
        if (!snap_info(m, i, &in))      /* (the state the next op starts from) */
            continue;
        uint64_t np = npages(m, s->len);
        uint32_t shared = 0, onhost = 0;
        uint32_t holes = 0;
        uint64_t fk = UINT64_MAX;
        for (uint32_t r = 0; r < m->c.nr; r++) {
            fk = s->kept[r] < fk ? s->kept[r] : fk;
            for (uint64_t k = 0; k < np; k++) {
                if (s->mp[r][k] == HOLE) {
                    holes++;
                    continue;
                }
                shared += m->ref[s->mp[r][k]] > 1;
                onhost += m->onhost[s->mp[r][k]];
            }
        }
        MCHECK(m, in.first_kept == fk && in.dropped == s->dropped && in.cls == s->cls,
               "seq %d first_kept %lu, model %lu (dropped %d, model %d; class %u, model %u)",
               i, (unsigned long)in.first_kept, (unsigned long)fk, in.dropped, s->dropped,
               in.cls, s->cls);
        MCHECK(m, in.length == s->len, "seq %d length %lu, model %lu", i,
               (unsigned long)in.length, (unsigned long)s->len);
        MCHECK(m, in.slot == s->slot, "seq %d moved from slot %u to %u", i, s->slot, in.slot);
        MCHECK(m, in.pages_device == m->c.nr * np - onhost - holes,
               "seq %d pages_device %u, model %lu", i, in.pages_device,
               (unsigned long)(m->c.nr * np - onhost - holes));
        if (m->c.disk)
            in.pages_host += in.pages_disk, in.pages_disk = 0;
        MCHECK(m, in.pages_host == onhost, "seq %d pages_host %u, model %u", i, in.pages_host,
               onhost);
        MCHECK(m, in.pages_shared == shared, "seq %d pages_shared %u, model %u", i,
               in.pages_shared, shared);
        MCHECK(m, in.pages_disk == 0, "seq %d on disk", i);
        MCHECK(m, in.resident == !s->out, "seq %d resident %d, model %d", i, in.resident,
               !s->out);
        MCHECK(m, !in.resident || !onhost, "seq %d resident with host pages", i);
    }
    check_entries(m);
}

/* The pool view (KVVM_F_POOL_VIEW configurations): every resident sequence's block table
   against the model's pages, and the view's mappings against the window's (the header). */
struct vblk { int32_t id; int seq; uint64_t b; };

static void check_view_map(struct model *m, int i, uint64_t b, uint32_t r, int32_t id,
                           uint64_t base)
{
    uint64_t win;
    MCHECK(m, kvvm_seq_addr(m->kv, m->s[i].h, r, &win) == 0, "kvvm_seq_addr seq %d", i);
    for (size_t g = 0; g < m->c.ps; g += m->c.gran) {
        kcu_mem_handle hw = 0, hv = 0;
        size_t ow = 0, ov = 0;
        int aw = 0, av = 0;
        uint64_t wva = win + b * m->c.ps + g, vva = base + (uint64_t)id * m->c.ps + g;
        MCHECK(m, emu_lookup(wva, &hw, &ow, &aw) == 0, "seq %d block %lu region %u: the "
               "window is not mapped at +%zu", i, (unsigned long)b, r, g);
        MCHECK(m, emu_lookup(vva, &hv, &ov, &av) == 0, "seq %d block %lu region %u: id %d "
               "is not mapped in the pool view at +%zu", i, (unsigned long)b, r, id, g);
        MCHECK(m, hv == hw && ov == ow && av == KCU_MEM_ACCESS_FLAGS_PROT_READWRITE,
               "seq %d block %lu region %u: id %d maps handle %llu+%zu (access %d) at +%zu, "
               "the window handle %llu+%zu", i, (unsigned long)b, r, id,
               (unsigned long long)hv, ov, av, g, (unsigned long long)hw, ow);
    }
}

static void check_view(struct model *m)
{
    if (!(m->c.flags & KVVM_F_POOL_VIEW))
        return;
    uint32_t n_ids = 0;
    uint64_t base[MAXR];
    MCHECK(m, kvvm_pool_blocks(m->kv, &n_ids) == 0, "kvvm_pool_blocks");
    for (uint32_t r = 0; r < m->c.nr; r++)
        MCHECK(m, kvvm_pool_base(m->kv, r, &base[r]) == 0, "kvvm_pool_base(%u)", r);
    struct vblk seen[MAXS * 64];
    int32_t ids[64];
    size_t ns = 0;
    MCHECK(m, m->maxpg <= 64, "%lu blocks per sequence", (unsigned long)m->maxpg);
    for (int i = 0; i < MAXS; i++) {
        struct mseq *s = &m->s[i];
        if (!s->live || s->out || s->dropped)
            continue;
        uint64_t nb = npages(m, s->len);
        int rc = kvvm_seq_block_table(m->kv, s->h, 0, (uint32_t)nb, ids);
        MCHECK(m, rc == 0, "kvvm_seq_block_table(seq %d, %lu blocks): %d (%s)", i,
               (unsigned long)nb, rc, kvvm_last_error());
        for (uint64_t b = 0; b < nb; b++) {
            bool hole = true;
            for (uint32_t r = 0; r < m->c.nr; r++)
                hole &= s->mp[r][b] == HOLE;
            MCHECK(m, hole == (ids[b] == -1), "seq %d block %lu: id %d, %s in every region",
                   i, (unsigned long)b, ids[b], hole ? "discarded" : "not discarded");
            if (hole)
                continue;
            MCHECK(m, ids[b] >= 0 && (uint32_t)ids[b] < n_ids, "seq %d block %lu: id %d of "
                   "%u", i, (unsigned long)b, ids[b], n_ids);
            for (uint32_t r = 0; r < m->c.nr; r++)
                if (s->mp[r][b] != HOLE)
                    check_view_map(m, i, b, r, ids[b], base[r]);
            for (size_t k = 0; k < ns; k++) {
                const struct mseq *o = &m->s[seen[k].seq];
                bool same = true, both = false;
                for (uint32_t r = 0; r < m->c.nr; r++) {
                    int32_t p = s->mp[r][b], q = o->mp[r][seen[k].b];
                    if (p == HOLE || q == HOLE)
                        continue;
                    both = true;
                    same &= p == q;
                }
                MCHECK(m, seen[k].id != ids[b] || !both || same, "seq %d block %lu and seq %d "
                       "block %lu hold other pages under one id %d", i, (unsigned long)b,
                       seen[k].seq, (unsigned long)seen[k].b, ids[b]);
            }
            seen[ns++] = (struct vblk){ ids[b], i, b };
        }
    }
}

static int nlive(const struct model *m)
{
    int n = 0;
    for (int i = 0; i < MAXS; i++)
        n += m->s[i].live;
    return n;
}

static struct mseq *pick_live(struct model *m)
{
    int n = nlive(m);
    if (!n)
        return NULL;
    int k = (int)rndn(m, (uint64_t)n);
    for (int i = 0; i < MAXS; i++)
        if (m->s[i].live && k-- == 0)
            return &m->s[i];
    return NULL;
}

static struct mseq *free_entry(struct model *m)
{
    for (int i = 0; i < (int)m->c.max_seqs; i++)
        if (!m->s[i].live)
            return &m->s[i];
    return NULL;
}

static void seq_adopt(struct model *m, struct mseq *s, kvvm_seq h, uint64_t len)
{
    s->live = true;
    s->h = h;
    s->len = len;
    s->zero_until = 0;
    s->out = false;
    s->cls = KVVM_SEQ_LIVE;
    s->dropped = false;
    memset(s->kept, 0, sizeof s->kept);
    int rc = kvvm_seq_slot(m->kv, h, &s->slot);
    MCHECK(m, rc == 0, "kvvm_seq_slot: %d", rc);
}

/* ---------------------------------------------------------------- prefix entries */

static void ent_put(struct model *m, struct ment *e)
{
    for (uint32_t r = 0; r < m->c.nr; r++) {
        m->eref[e->mp[r]]--;
        pg_put(m, e->mp[r]);
    }
    e->live = false;
}

static struct ment *ent_find(struct model *m, uint64_t ns, const kvvm_key *k)
{
    for (int i = 0; i < MAXE; i++)
        if (m->e[i].live && m->e[i].ns == ns && !memcmp(&m->e[i].key, k, sizeof *k))
            return &m->e[i];
    return NULL;
}

static int ent_count(const struct model *m)
{
    int n = 0;
    for (int i = 0; i < MAXE; i++)
        n += m->e[i].live;
    return n;
}

/* Whether only entries hold e's pages: reclaim may drop it (or demote it). */
static bool ent_reclaimable(const struct model *m, const struct ment *e)
{
    for (uint32_t r = 0; r < m->c.nr; r++)
        if (m->ref[e->mp[r]] != m->eref[e->mp[r]])
            return false;
    return true;
}

/* Whether a call short of device pages may reclaim an entry (one on the device that only
   entries hold). */
static bool ents_reclaimable_dev(const struct model *m)
{
    for (int i = 0; i < MAXE; i++) {
        const struct ment *e = &m->e[i];
        bool dev = false;
        for (uint32_t r = 0; e->live && r < m->c.nr; r++)
            dev |= !m->onhost[e->mp[r]];
        if (dev && ent_reclaimable(m, e))
            return true;
    }
    return false;
}

/* Whether a call short of host slots may drop entries instead (no disk tier: entries whose
   pages are all on the host tier and that only entries hold; docs/api.md "Below the host
   tier"). */
static bool ents_host_droppable(const struct model *m)
{
    if (m->c.disk)
        return false;
    for (int i = 0; i < MAXE; i++) {
        const struct ment *e = &m->e[i];
        bool below = e->live;
        for (uint32_t r = 0; below && r < m->c.nr; r++)
            below = m->onhost[e->mp[r]];
        if (below && ent_reclaimable(m, e))
            return true;
    }
    return false;
}

/* The model's tier of page id: 1 device, 2 below (host, or host + disk). */
static uint8_t tier_of(const struct model *m, int32_t id)
{
    return m->onhost[id] ? 2 : 1;
}

/* The library's view of e (kvvm_debug_prefix_entry: no LRU mark): present, w its page's
   tier per region (3, disk, counted as 2: below). */
static bool ent_peek(struct model *m, const struct ment *e, uint8_t *w)
{
    uint8_t raw[MAXR] = { 0 };
    int rc = kvvm_debug_prefix_entry(m->kv, e->ns, &e->key, raw);
    MCHECK(m, rc == 0 || rc == 1, "kvvm_debug_prefix_entry: %d", rc);
    for (uint32_t r = 0; r < MAXR; r++)
        w[r] = rc == 1 && r < m->c.nr ? (raw[r] >= 2 ? 2 : raw[r]) : 0;
    return rc == 1;
}

static uint64_t lib_entries(struct model *m)
{
    struct kvvm_stats st = { .size = sizeof st };
    MCHECK(m, kvvm_stats(m->kv, &st) == 0, "kvvm_stats");
    return st.prefix_entries;
}

/* The entries' part of the snapshot: each one's presence and tiers, and the count. */
static void ent_snap(struct model *m)
{
    if (!m->c.pfx)
        return;
    for (int i = 0; i < MAXE; i++) {
        struct esnapent *x = &m->esnap[i];
        x->live = m->e[i].live;
        if (x->live)
            MCHECK(m, ent_peek(m, &m->e[i], x->w), "prefix entry %d (namespace %lu) is gone",
                   i, (unsigned long)m->e[i].ns);
    }
    m->esnap_n = lib_entries(m);
}

/* Every entry against the model (after each op): present, its pages where the model has
   them, the count; the snapshot the next op starts from. */
static void check_entries(struct model *m)
{
    if (!m->c.pfx)
        return;
    ent_snap(m);
    uint64_t n = 0;
    for (int i = 0; i < MAXE; i++) {
        const struct ment *e = &m->e[i];
        if (!e->live)
            continue;
        n++;
        for (uint32_t r = 0; r < m->c.nr; r++)
            MCHECK(m, m->esnap[i].w[r] == tier_of(m, e->mp[r]), "prefix entry %d region %u: "
                   "tier %u, model %u", i, r, m->esnap[i].w[r], tier_of(m, e->mp[r]));
    }
    MCHECK(m, m->esnap_n == n, "prefix_entries %lu, model %lu", (unsigned long)m->esnap_n,
           (unsigned long)n);
}

/* The rule of a failed call for the entries: each one present as before, its pages in
   the tiers they were in, no entry more or less. false: msg says what changed. */
static bool ents_unchanged(struct model *m, int rc, char *msg, size_t len)
{
    if (!m->c.pfx)
        return true;
    for (int i = 0; i < MAXE; i++) {
        const struct esnapent *x = &m->esnap[i];
        uint8_t w[MAXR];
        if (!x->live || !m->e[i].live)
            continue;
        bool there = ent_peek(m, &m->e[i], w);
        if (there && !memcmp(w, x->w, sizeof w))
            continue;
        snprintf(msg, len, "the call failed (%d) but changed prefix entry %d (namespace %lu): "
                 "%s, tiers %u %u %u %u -> %u %u %u %u", rc, i, (unsigned long)m->e[i].ns,
                 there ? "present" : "dropped", x->w[0], x->w[1], x->w[2], x->w[3], w[0],
                 w[1], w[2], w[3]);
        return false;
    }
    uint64_t n = lib_entries(m);
    if (n == m->esnap_n)
        return true;
    snprintf(msg, len, "the call failed (%d) but the prefix entries went from %lu to %lu", rc,
             (unsigned long)m->esnap_n, (unsigned long)n);
    return false;
}

/* The model follows the library's entries (after a call that may have reclaimed them):
   dropped ones release their pages, moved pages change tier. true: something changed. */
static bool ent_resync(struct model *m)
{
    bool moved = false;
    for (int i = 0; m->c.pfx && i < MAXE; i++) {
        struct ment *e = &m->e[i];
        uint8_t w[MAXR];
        if (!e->live)
            continue;
        if (!ent_peek(m, e, w)) {
            ent_put(m, e);
            m->cnt[C_ENT_RECLAIMED]++;
            moved = true;
            continue;
        }
        bool changed = false;
        for (uint32_t r = 0; r < m->c.nr; r++) {
            int32_t id = e->mp[r];
            bool down = w[r] >= 2;
            if (down == (m->onhost[id] != 0))
                continue;
            m->onhost[id] = down;
            if (down) {
                m->used--;
                m->host_used++;
            } else {
                m->used++;
                m->host_used--;
            }
            changed = true;
        }
        m->cnt[C_ENT_RECLAIMED] += changed;
        moved |= changed;
    }
    return moved;
}


/* ---------------------------------------------------------------- reclaim by a call */

/* The snapshot of every sequence (check_state takes it after every op, for free: the next
   op starts from that state; a call within an op that changed it takes it again). */
static void snap_take(struct model *m)
{
    struct kvvm_seq_info in;
    for (int i = 0; i < MAXS; i++)
        snap_info(m, i, &in);
    ent_snap(m);
}

/* The rule of a failed call: every sequence (the call's own too: a failed call changes
   nothing) is exactly as the snapshot taken before it. */
static bool in_set(const struct mseq *s, struct mseq *const *t, int nt)
{
    for (int i = 0; i < nt; i++)
        if (t[i] == s)
            return true;
    return false;
}

static void resync(struct model *m, struct mseq *const *t, int nt);
static void snap_take(struct model *m);

/* KVVMTEST_MODEL_KEEP_GOING=1: a broken failed-call rule is printed and counted (the test
   still fails at the end), the model follows the library and the run goes on, so one run
   lists every kind of violation instead of its first. */
static bool keep_going(void)
{
    const char *e = getenv("KVVMTEST_MODEL_KEEP_GOING");
    return e && !strcmp(e, "1");
}

static void unchanged(struct model *m, int rc)
{
    bool broken = false;
    for (int i = 0; i < MAXS; i++) {
        struct mseq *s = &m->s[i];
        const struct snapent *e = &m->snap[i];
        if (!s->live || !e->live)
            continue;
        struct kvvm_seq_info in = { .size = sizeof in };
        MCHECK(m, kvvm_seq_info(m->kv, s->h, &in) == 0, "kvvm_seq_info(seq %d)", i);
        if (in.length == e->len && in.pages_device == e->dev &&
            in.pages_host + in.pages_disk == e->below && in.cls == e->cls &&
            in.resident == e->resident && in.dropped == e->dropped)
            continue;
        char msg[400];
        snprintf(msg, sizeof msg, "the call failed (%d) but changed seq %d: length %lu -> %lu, "
                 "device pages %u -> %u, host/disk pages %u -> %u, class %u -> %u, resident "
                 "%d -> %d, dropped %d -> %d", rc, i, (unsigned long)e->len,
                 (unsigned long)in.length, e->dev, in.pages_device, e->below,
                 in.pages_host + in.pages_disk, e->cls, in.cls, e->resident, in.resident,
                 e->dropped, in.dropped);
        MCHECK(m, keep_going() || undo_lost, "%s", msg);
        if (!broken)
            printf("%s seed %lu op %lu (%s): %s\n", undo_lost ? "UNDO LIMIT (-EIO, could "
                   "not be undone)" : "VIOLATION", m->seed, (unsigned long)m->op, m->where,
                   msg);
        broken = true;
    }
    char emsg[400];
    if (!ents_unchanged(m, rc, emsg, sizeof emsg)) {
        MCHECK(m, keep_going() || undo_lost, "%s", emsg);
        if (!broken)
            printf("%s seed %lu op %lu (%s): %s\n", undo_lost ? "UNDO LIMIT (-EIO, could "
                   "not be undone)" : "VIOLATION", m->seed, (unsigned long)m->op, m->where,
                   emsg);
        broken = true;
    }
    if (broken) {
        m->violations++;
        resync(m, NULL, 0);
        snap_take(m);               /* the next failed call is compared with what is now */
    }
}

/* Whether a call short of device pages may reclaim others instead of failing: a CACHED
   sequence holding device pages (dropped, or demoted, with or without KVVM_F_AUTO_SWAP), or,
   with KVVM_F_AUTO_SWAP, any resident unpinned sequence but the call's own. The outcome is
   then not predicted: a success is followed by resync, a failure by others_unchanged. */
static bool may_reclaim(const struct model *m, struct mseq *const *t, int nt)
{
    if (ents_reclaimable_dev(m))
        return true;                /* an entry only entries hold, on the device */
    for (int i = 0; i < MAXS; i++) {
        const struct mseq *s = &m->s[i];
        if (!s->live || s->dropped || !s->len || in_set(s, t, nt))
            continue;
        if (s->cls == KVVM_SEQ_CACHED)
            return true;
        if (!(m->c.flags & KVVM_F_AUTO_SWAP))
            continue;
        if (!s->out && s->cls == KVVM_SEQ_LIVE)
            return true;
        uint64_t np = npages(m, s->len);        /* orphans: device pages of the swapped out */
        for (uint32_t r = 0; s->out && r < m->c.nr; r++)
            for (uint64_t k = 0; k < np; k++)
                if (s->mp[r][k] != HOLE && !m->onhost[s->mp[r][k]])
                    return true;
    }
    return false;
}

/* After a call that moved or dropped other sequences (not `self`, which the caller
   applies): the model follows the library, page by page (kvvm_debug_page_tier). */
static void resync(struct model *m, struct mseq *const *t, int nt)
{
    int rc = kvvm_sync(m->kv);
    MCHECK(m, rc == 0, "kvvm_sync: %d", rc);
    bool moved = false;
    for (int i = 0; i < MAXS; i++) {
        struct mseq *s = &m->s[i];
        if (!s->live || in_set(s, t, nt))
            continue;
        struct kvvm_seq_info in = { .size = sizeof in };
        MCHECK(m, kvvm_seq_info(m->kv, s->h, &in) == 0, "kvvm_seq_info(seq %d)", i);
        if (in.dropped && !s->dropped) {
            MCHECK(m, s->cls == KVVM_SEQ_CACHED, "seq %d of class %u dropped", i, s->cls);
            uint64_t np = npages(m, s->len);
            for (uint32_t r = 0; r < m->c.nr; r++)
                for (uint64_t k = 0; k < np; k++)
                    if (s->mp[r][k] != HOLE)
                        pg_put(m, s->mp[r][k]);
            s->len = 0;
            s->zero_until = 0;
            s->out = false;
            s->dropped = true;
            memset(s->kept, 0, sizeof s->kept);
            m->cnt[C_DROP]++;
            moved = true;
            continue;
        }
        if (in.resident == s->out) {
            MCHECK(m, s->cls != KVVM_SEQ_PINNED || in.resident, "PINNED seq %d moved", i);
            s->out = !in.resident;
            moved = true;
        }
        uint64_t np = npages(m, s->len);
        for (uint32_t r = 0; r < m->c.nr; r++)
            for (uint64_t k = 0; k < np; k++) {
                int32_t id = s->mp[r][k];
                int t = -1;
                rc = kvvm_debug_page_tier(m->kv, s->h, r, (uint32_t)k, &t);
                MCHECK(m, rc == 0 && (t == 0) == (id == HOLE), "seq %d r%u page %lu: tier %d "
                       "(%d), model %d", i, r, (unsigned long)k, t, rc, id);
                if (id == HOLE || (t >= 2) == (m->onhost[id] != 0))
                    continue;
                m->onhost[id] = t >= 2;
                if (t >= 2) {
                    m->used--;
                    m->host_used++;
                } else {
                    m->used++;
                    m->host_used--;
                }
                moved = true;
            }
    }
    moved |= ent_resync(m);
    m->cnt[C_RECLAIMED] += moved;
}

/* The end of a call whose outcome was not predicted (may_reclaim): rc 0 resyncs the model,
   a failure must be -ENOMEM with every sequence unchanged. true: it succeeded. */
static bool unpredicted_done(struct model *m, int rc, struct mseq *const *t, int nt,
                             const char *call)
{
    if (rc == 0) {
        resync(m, t, nt);
        return true;
    }
    MCHECK(m, rc == -ENOMEM, "%s (reclaim possible): %d (%s)", call, rc, kvvm_last_error());
    unchanged(m, rc);
    m->cnt[C_FAILED_SAME]++;
    return false;
}

/* ---------------------------------------------------------------- operations */

static void op_swap_out(struct model *m, struct mseq *s)
{
    snprintf(m->where, sizeof m->where, "swap_out seq %ld (%lu tokens, out %d)",
             (long)(s - m->s), (unsigned long)s->len, s->out);
    /* out already: its orphans (device pages no resident sequence holds) go down */
    uint64_t np = npages(m, s->len), down = 0;
    for (uint32_t r = 0; r < m->c.nr; r++)
        for (uint64_t k = 0; k < np; k++) {
            int32_t id = s->mp[r][k];
            down += id != HOLE && !m->onhost[id] && !resident_holder(m, id, s);
        }
    /* short of host slots, a call drops entries whose pages are all below instead (no disk
       tier): not predicted then */
    bool may = down > m->host_total - m->host_used && ents_host_droppable(m);
    int rc = REFUSABLE(m, kvvm_seq_swap_out(m->kv, s->h));
    if (may) {
        if (!unpredicted_done(m, rc, &s, 1, "swap_out"))
            return;
    } else if (down > m->host_total - m->host_used) {
        MCHECK(m, rc == -ENOMEM, "needs %lu host slots, %lu free: swap_out returned %d",
               (unsigned long)down, (unsigned long)(m->host_total - m->host_used), rc);
        m->cnt[C_SWAP_ENOMEM]++;
        unchanged(m, rc);
        verify_touched(m, s, 0, 0);
        return;
    }
    MCHECK(m, may || rc == 0, "needs %lu host slots, %lu free: swap_out returned %d",
           (unsigned long)down, (unsigned long)(m->host_total - m->host_used), rc);
    for (uint32_t r = 0; r < m->c.nr; r++)
        for (uint64_t k = 0; k < np; k++) {
            int32_t id = s->mp[r][k];
            if (id != HOLE && !m->onhost[id] && !resident_holder(m, id, s)) {
                m->onhost[id] = 1;
                m->used--;
                m->host_used++;
            }
        }
    if (s->out)
        return;
    s->out = true;
    m->cnt[C_SWAP_OUT]++;
}

/* swap_in with the model's prediction; true when s is resident afterwards. */
static bool ensure_in(struct model *m, struct mseq *s)
{
    if (!s->out)
        return true;
    char saved[sizeof m->where];
    memcpy(saved, m->where, sizeof saved);
    snprintf(m->where, sizeof m->where, "swap_in seq %ld (%lu tokens) [for: %.100s]",
             (long)(s - m->s), (unsigned long)s->len, saved);
    uint64_t np = npages(m, s->len), need = 0;
    for (uint32_t r = 0; r < m->c.nr; r++)
        for (uint64_t k = 0; k < np; k++)
            need += s->mp[r][k] != HOLE && m->onhost[s->mp[r][k]];
    bool may = need > mfree(m) && may_reclaim(m, &s, 1);
    int rc = REFUSABLE(m, kvvm_seq_swap_in(m->kv, s->h));
    if (may) {
        if (!unpredicted_done(m, rc, &s, 1, "swap_in")) {
            memcpy(m->where, saved, sizeof saved);
            return false;
        }
    } else if (need > mfree(m)) {
        MCHECK(m, rc == -ENOMEM, "needs %lu pages, %lu free: swap_in returned %d",
               (unsigned long)need, (unsigned long)mfree(m), rc);
        m->cnt[C_SWAP_ENOMEM]++;
        unchanged(m, rc);
        memcpy(m->where, saved, sizeof saved);
        return false;
    } else {
        MCHECK(m, rc == 0, "needs %lu pages, %lu free: swap_in returned %d",
               (unsigned long)need, (unsigned long)mfree(m), rc);
    }
    for (uint32_t r = 0; r < m->c.nr; r++)
        for (uint64_t k = 0; k < np; k++) {
            int32_t id = s->mp[r][k];
            if (id != HOLE && m->onhost[id]) {
                m->onhost[id] = 0;
                m->used++;
                m->host_used--;
            }
        }
    s->out = false;
    m->cnt[C_SWAP_IN]++;
    verify_tokens(m, s, 0, s->len);
    memcpy(m->where, saved, sizeof saved);
    snap_take(m);                   /* the state the rest of the call starts from */
    return true;
}

static void op_create(struct model *m)
{
    snprintf(m->where, sizeof m->where, "create");
    struct mseq *s = free_entry(m);
    kvvm_seq h = 0;
    int rc = kvvm_seq_create(m->kv, &h);
    if (!s) {
        MCHECK(m, rc == -ENOSPC, "create with every slot in use: %d", rc);
        m->cnt[C_ENOSPC]++;
        return;
    }
    MCHECK(m, rc == 0 && h != 0, "create: %d", rc);
    seq_adopt(m, s, h, 0);
    m->cnt[C_CREATE]++;
    if (rndn(m, 3) == 0)
        op_set_class(m, s);
}

static void apply_grow(struct model *m, struct mseq *s, uint64_t nl)
{
    uint64_t old = s->len, op = npages(m, old), np = npages(m, nl);
    for (uint32_t r = 0; r < m->c.nr; r++) {
        apply_cow(m, s, r, old * m->c.bpt, nl * m->c.bpt);
        for (uint64_t k = op; k < np; k++)
            s->mp[r][k] = pg_alloc(m);
    }
    s->len = nl;
    check_zero_tail(m, s, old);
    write_tokens(m, s, old, nl);
}

static void op_grow(struct model *m, struct mseq *s)
{
    uint64_t nl = s->len + 1 + rndn(m, 4);
    bool big = rndn(m, 25) == 0;
    if (big)
        nl = m->c.max_tokens + 1 + rndn(m, 3);
    else if (nl > m->c.max_tokens)
        nl = m->c.max_tokens;
    snprintf(m->where, sizeof m->where, "grow seq %ld %lu -> %lu", (long)(s - m->s),
             (unsigned long)s->len, (unsigned long)nl);
    if (!ensure_in(m, s))
        return;
    if (big) {
        int rc = kvvm_seq_grow(m->kv, s->h, nl);
        MCHECK(m, rc == -E2BIG, "grow past max_tokens: %d", rc);
        m->cnt[C_E2BIG]++;
        verify_touched(m, s, s->len ? s->len - 1 : 0, s->len);
        return;
    }
    uint64_t need = need_grow(m, s, nl, false, NULL, NULL);
    bool may = need > mfree(m) && may_reclaim(m, &s, 1);
    int rc = REFUSABLE(m, kvvm_seq_grow(m->kv, s->h, nl));
    if (may) {
        if (!unpredicted_done(m, rc, &s, 1, "grow")) {
            verify_touched(m, s, s->len ? s->len - 1 : 0, s->len);
            return;
        }
    } else if (need > mfree(m)) {
        MCHECK(m, rc == -ENOMEM, "needs %lu pages, %lu free: grow returned %d",
               (unsigned long)need, (unsigned long)mfree(m), rc);
        m->cnt[C_ENOMEM]++;
        unchanged(m, rc);
        verify_touched(m, s, s->len ? s->len - 1 : 0, s->len);
        return;
    } else {
        MCHECK(m, rc == 0, "needs %lu pages, %lu free: grow returned %d", (unsigned long)need,
               (unsigned long)mfree(m), rc);
    }
    uint64_t old = s->len;
    apply_grow(m, s, nl);
    m->cnt[C_GROW]++;
    verify_touched(m, s, old ? old - 1 : 0, nl);
}

static void op_grow_batch(struct model *m)
{
    struct mseq *set[4];
    kvvm_seq hs[4];
    uint64_t lens[4];
    int n = 0, want = 2 + (int)rndn(m, 3);
    for (int tries = 0; tries < 12 && n < want; tries++) {
        struct mseq *s = pick_live(m);
        bool dup = false;
        for (int i = 0; i < n; i++)
            dup |= set[i] == s;
        if (s && !dup && !s->dropped)
            set[n++] = s;
    }
    if (n < 2)
        return;
    snprintf(m->where, sizeof m->where, "grow_batch of %d: swap-ins", n);
    for (int i = 0; i < n; i++)
        if (!ensure_in(m, set[i]))
            return;
    for (int i = 0; i < n; i++)         /* a swap-in's reclaim may drop or move a member */
        if (set[i]->dropped || set[i]->out)
            return;
    bool big = rndn(m, 25) == 0;
    for (int i = 0; i < n; i++) {
        hs[i] = set[i]->h;
        lens[i] = set[i]->len + rndn(m, 4);
        if (lens[i] > m->c.max_tokens)
            lens[i] = m->c.max_tokens;
    }
    if (big)
        lens[rndn(m, (uint64_t)n)] = m->c.max_tokens + 1;
    snprintf(m->where, sizeof m->where, "grow_batch of %d", n);
    int32_t touched[4 * MAXR * 2];
    int nt = 0;
    uint64_t need = 0;
    for (int i = 0; i < n && !big; i++)
        need += need_grow(m, set[i], lens[i], true, touched, &nt);
    for (int i = 0; i < nt; i++)
        m->tmpdec[touched[i]] = 0;
    /* what a plan that copies every shared page each sequence touches would count (a page
       shared only by sequences of the batch needs one copy fewer: the last one keeps it) */
    uint64_t naive = 0;
    for (int i = 0; i < n && !big; i++)
        naive += need_grow(m, set[i], lens[i], false, NULL, NULL);
    snprintf(m->where, sizeof m->where, "grow_batch of %d (independent plans would need %lu)",
             n, (unsigned long)naive);
    bool may = !big && need > mfree(m) && may_reclaim(m, set, n);
    int rc = REFUSABLE(m, kvvm_seq_grow_batch(m->kv, hs, lens, (size_t)n));
    if (big) {
        MCHECK(m, rc == -E2BIG, "grow_batch with one past max_tokens: %d", rc);
        m->cnt[C_E2BIG]++;
        unchanged(m, rc);
    } else if (need > mfree(m) && (!may || !unpredicted_done(m, rc, set, n, "grow_batch"))) {
        if (!may) {
            MCHECK(m, rc == -ENOMEM, "needs %lu pages, %lu free: grow_batch returned %d",
                   (unsigned long)need, (unsigned long)mfree(m), rc);
            unchanged(m, rc);
        }
        m->cnt[C_ENOMEM_BATCH]++;
    } else {
        MCHECK(m, rc == 0, "needs %lu pages, %lu free: grow_batch returned %d (%s)",
               (unsigned long)need, (unsigned long)mfree(m), rc, kvvm_last_error());
        for (int i = 0; i < n; i++) {
            uint64_t old = set[i]->len;
            apply_grow(m, set[i], lens[i]);
            verify_touched(m, set[i], old ? old - 1 : 0, lens[i]);
        }
        m->cnt[C_GROW_BATCH]++;
        return;
    }
    for (int i = 0; i < n; i++)
        verify_touched(m, set[i], set[i]->len ? set[i]->len - 1 : 0, set[i]->len);
}

static void release_from(struct model *m, struct mseq *s, uint64_t nl)
{
    uint64_t np = npages(m, nl), op = npages(m, s->len);
    for (uint32_t r = 0; r < m->c.nr; r++)
        for (uint64_t k = np; k < op; k++)
            if (s->mp[r][k] != HOLE)
                pg_put(m, s->mp[r][k]);
}

static void op_truncate(struct model *m, struct mseq *s)
{
    uint64_t nl = rndn(m, 5) == 0 ? 0 : rndn(m, s->len + 1);
    snprintf(m->where, sizeof m->where, "truncate seq %ld %lu -> %lu", (long)(s - m->s),
             (unsigned long)s->len, (unsigned long)nl);
    if (rndn(m, 30) == 0) {
        int rc = kvvm_seq_truncate(m->kv, s->h, s->len + 1);
        MCHECK(m, rc == -EINVAL, "truncate longer: %d", rc);
        m->cnt[C_EINVAL]++;
        return;
    }
    int rc = REFUSABLE(m, kvvm_seq_truncate(m->kv, s->h, nl));
    MCHECK(m, rc == 0, "truncate: %d", rc);
    if (s->out)
        m->cnt[C_OUT_OPS]++;
    release_from(m, s, nl);
    s->len = nl;
    s->zero_until = 0;
    for (uint32_t r = 0; r < m->c.nr; r++)
        if (s->kept[r] > nl)
            s->kept[r] = nl;            /* truncate below first_kept sets it to nl */
    m->cnt[C_TRUNCATE]++;
    verify_touched(m, s, nl ? nl - 1 : 0, nl);
}

static void op_fork(struct model *m, struct mseq *p)
{
    snprintf(m->where, sizeof m->where, "fork seq %ld (%lu tokens)", (long)(p - m->s),
             (unsigned long)p->len);
    struct mseq *c = free_entry(m);
    kvvm_seq h = 0;
    int rc = REFUSABLE(m, kvvm_seq_fork(m->kv, p->h, &h));
    if (!c) {
        MCHECK(m, rc == -ENOSPC, "fork with every slot in use: %d", rc);
        m->cnt[C_ENOSPC]++;
        return;
    }
    MCHECK(m, rc == 0, "fork: %d", rc);
    seq_adopt(m, c, h, p->len);
    c->zero_until = p->zero_until;
    c->out = p->out;
    if (p->out)
        m->cnt[C_OUT_OPS]++;
    uint64_t np = npages(m, p->len);
    for (uint32_t r = 0; r < m->c.nr; r++) {
        memcpy(c->tag[r], p->tag[r], p->len * sizeof(uint32_t));
        for (uint64_t k = 0; k < np; k++) {
            c->mp[r][k] = p->mp[r][k];
            if (p->mp[r][k] != HOLE)
                m->ref[p->mp[r][k]]++;
        }
        c->kept[r] = p->kept[r];        /* fork copies the discard */
    }
    m->cnt[C_FORK]++;
    verify_touched(m, c, c->len ? c->len - 1 : 0, c->len);
    if (rndn(m, 3) == 0)
        op_set_class(m, c);
}

static void op_share(struct model *m, struct mseq *src)
{
    struct mseq *dst = NULL;
    for (int i = 0; i < MAXS && !dst; i++)
        if (m->s[i].live && m->s[i].len == 0 && &m->s[i] != src && !m->s[i].dropped)
            dst = &m->s[i];
    if (!dst) {
        if (!free_entry(m))
            return;
        op_create(m);
        for (int i = 0; i < MAXS && !dst; i++)
            if (m->s[i].live && m->s[i].len == 0 && &m->s[i] != src && !m->s[i].dropped)
                dst = &m->s[i];
        if (!dst)
            return;
        snap_take(m);
    }
    uint64_t k = rndn(m, 10), n;
    n = k < 2 ? 0 : k < 4 ? src->len : rndn(m, src->len + 1);
    snprintf(m->where, sizeof m->where, "share %lu of seq %ld (%lu tokens) into seq %ld",
             (unsigned long)n, (long)(src - m->s), (unsigned long)src->len,
             (long)(dst - m->s));
    if (k == 9 && rndn(m, 3) == 0) {
        int rc = kvvm_seq_share(m->kv, dst->h, src->h, src->len + 1);
        MCHECK(m, rc == -EINVAL, "share past the source's length: %d", rc);
        m->cnt[C_EINVAL]++;
        return;
    }
    bool partial = (n * m->c.bpt) % m->c.ps != 0;
    uint64_t need = 0, whole0 = n * m->c.bpt / m->c.ps;
    for (uint32_t r = 0; partial && r < m->c.nr; r++)
        need += src->mp[r][whole0] != HOLE;     /* a discarded partial page is not copied */
    /* from a swapped-out source the partial page is copied into the host tier */
    bool host_copy = src->out && n > 0;
    uint64_t avail = host_copy ? m->host_total - m->host_used : mfree(m);
    struct mseq *pair[2] = { src, dst };
    bool may = need > avail && (host_copy ? ents_host_droppable(m) : may_reclaim(m, pair, 2));
    int rc = REFUSABLE(m, kvvm_seq_share(m->kv, dst->h, src->h, n));
    if (may) {
        if (!unpredicted_done(m, rc, pair, 2, "share")) {
            verify_touched(m, src, n ? n - 1 : 0, n);
            return;
        }
    } else if (need > avail) {
        MCHECK(m, rc == -ENOMEM, "needs %lu pages, %lu free: share returned %d",
               (unsigned long)need, (unsigned long)avail, rc);
        m->cnt[C_ENOMEM]++;
        unchanged(m, rc);
        verify_touched(m, src, n ? n - 1 : 0, n);
        return;
    } else {
        MCHECK(m, rc == 0, "needs %lu pages, %lu free: share returned %d", (unsigned long)need,
               (unsigned long)avail, rc);
    }
    if (n > 0)
        dst->out = src->out;
    if (host_copy)
        m->cnt[C_OUT_OPS]++;
    uint64_t whole = n * m->c.bpt / m->c.ps;
    for (uint32_t r = 0; r < m->c.nr; r++) {
        memcpy(dst->tag[r], src->tag[r], n * sizeof(uint32_t));
        for (uint64_t p = 0; p < whole; p++) {
            dst->mp[r][p] = src->mp[r][p];
            if (src->mp[r][p] != HOLE)
                m->ref[src->mp[r][p]]++;
        }
        if (partial)
            dst->mp[r][whole] = src->mp[r][whole] == HOLE ? HOLE
                                : host_copy ? pg_alloc_host(m) : pg_alloc(m);
        dst->kept[r] = src->kept[r] < n ? src->kept[r] : n;   /* share keeps the discard */
    }
    dst->len = n;
    dst->zero_until = partial && need == m->c.nr ? npages(m, n) * m->c.ps : 0;
    if (n == 0)
        m->cnt[C_SHARE_ZERO]++;
    else if (n == src->len)
        m->cnt[C_SHARE_ALL]++;
    if (partial)
        m->cnt[C_SHARE_PARTIAL]++;
    verify_touched(m, dst, n ? n - 1 : 0, n);
    verify_touched(m, src, 0, 1);
}

static void op_prepare_write(struct model *m, struct mseq *s)
{
    if (!s->len)
        return;
    uint64_t a = rndn(m, s->len), b = a + 1 + rndn(m, 3);
    if (b > s->len)
        b = s->len;
    snprintf(m->where, sizeof m->where, "prepare_write seq %ld [%lu, %lu) of %lu",
             (long)(s - m->s), (unsigned long)a, (unsigned long)b, (unsigned long)s->len);
    if (!ensure_in(m, s))
        return;
    if (rndn(m, 40) == 0) {
        int rc = kvvm_seq_prepare_write(m->kv, s->h, a, s->len + 1);
        MCHECK(m, rc == -EINVAL, "prepare_write past length: %d", rc);
        rc = kvvm_seq_prepare_write(m->kv, s->h, a, a);
        MCHECK(m, rc == -EINVAL, "prepare_write of an empty range: %d", rc);
        m->cnt[C_EINVAL]++;
        return;
    }
    uint64_t need = 0, fkmax = 0;
    for (uint32_t r = 0; r < m->c.nr; r++)
        fkmax = s->kept[r] > fkmax ? s->kept[r] : fkmax;
    if (a < fkmax) {
        int rc = kvvm_seq_prepare_write(m->kv, s->h, a, b);
        MCHECK(m, rc == -EINVAL, "prepare_write below first_kept %lu: %d",
               (unsigned long)fkmax, rc);
        m->cnt[C_EINVAL]++;
        return;
    }
    for (uint32_t r = 0; r < m->c.nr; r++)
        need += need_cow(m, s, r, a * m->c.bpt, b * m->c.bpt, false, NULL, NULL);
    bool may = need > mfree(m) && may_reclaim(m, &s, 1);
    int rc = REFUSABLE(m, kvvm_seq_prepare_write(m->kv, s->h, a, b));
    if (may) {
        if (!unpredicted_done(m, rc, &s, 1, "prepare_write")) {
            verify_touched(m, s, a, b);
            return;
        }
    } else if (need > mfree(m)) {
        MCHECK(m, rc == -ENOMEM, "needs %lu pages, %lu free: prepare_write returned %d",
               (unsigned long)need, (unsigned long)mfree(m), rc);
        m->cnt[C_ENOMEM]++;
        unchanged(m, rc);
        verify_touched(m, s, a, b);
        return;
    } else {
        MCHECK(m, rc == 0, "needs %lu pages, %lu free: prepare_write returned %d",
               (unsigned long)need, (unsigned long)mfree(m), rc);
    }
    for (uint32_t r = 0; r < m->c.nr; r++)
        apply_cow(m, s, r, a * m->c.bpt, b * m->c.bpt);
    write_tokens(m, s, a, b);
    m->cnt[C_PREP_WRITE]++;
    verify_touched(m, s, a, b);
}

/* One write of whole tokens into one region with no prepare_write: it copies shared pages
   itself. */
static void op_write(struct model *m, struct mseq *s)
{
    if (!s->len)
        return;
    uint32_t r = (uint32_t)rndn(m, m->c.nr);
    uint64_t a = rndn(m, s->len), b = a + 1 + (m->probe ? 0 : rndn(m, 3));
    if (b > s->len)
        b = s->len;
    snprintf(m->where, sizeof m->where, "write seq %ld r%u [%lu, %lu) of %lu",
             (long)(s - m->s), r, (unsigned long)a, (unsigned long)b, (unsigned long)s->len);
    if (!ensure_in(m, s))
        return;
    uint64_t off = a * m->c.bpt, len = (b - a) * m->c.bpt;
    uint32_t tag = ++m->next_tag;
    ensure_buf(m, len);
    gen(m->buf, tag, r, off, len);
    if (a < s->kept[r]) {
        int rc = kvvm_seq_write(m->kv, s->h, r, off, m->buf, len);
        MCHECK(m, rc == -EINVAL, "write below first_kept %lu: %d", (unsigned long)s->kept[r],
               rc);
        m->cnt[C_EINVAL]++;
        return;
    }
    uint64_t need = need_cow(m, s, r, off, off + len, false, NULL, NULL);
    bool may = need > mfree(m) && may_reclaim(m, &s, 1);
    int rc = REFUSABLE_AGAIN(m, kvvm_seq_write(m->kv, s->h, r, off, m->buf, len));
    if (may) {
        if (!unpredicted_done(m, rc, &s, 1, "write")) {
            verify_touched(m, s, a, b);
            return;
        }
    } else if (need > mfree(m)) {
        MCHECK(m, rc == -ENOMEM, "needs %lu pages, %lu free: write returned %d",
               (unsigned long)need, (unsigned long)mfree(m), rc);
        m->cnt[C_ENOMEM]++;
        unchanged(m, rc);
        verify_touched(m, s, a, b);
        return;
    } else {
        MCHECK(m, rc == 0, "needs %lu pages, %lu free: write returned %d", (unsigned long)need,
               (unsigned long)mfree(m), rc);
    }
    apply_cow(m, s, r, off, off + len);
    for (uint64_t t = a; t < b; t++) {
        s->tag[r][t] = tag;
        if (straddles(m, t))
            m->cnt[C_STRADDLE]++;
    }
    if (need)
        m->cnt[C_WRITE]++;
    verify_touched(m, s, a, b);
}

static void op_free(struct model *m, struct mseq *s)
{
    snprintf(m->where, sizeof m->where, "free seq %ld (%lu tokens)", (long)(s - m->s),
             (unsigned long)s->len);
    int rc = REFUSABLE(m, kvvm_seq_free(m->kv, s->h));
    MCHECK(m, rc == 0, "free: %d", rc);
    uint64_t np = npages(m, s->len);
    bool shared = false;
    for (uint32_t r = 0; r < m->c.nr; r++)
        for (uint64_t k = 0; k < np; k++)
            shared |= s->mp[r][k] != HOLE && m->ref[s->mp[r][k]] > 1;
    if (s->out)
        m->cnt[C_OUT_OPS]++;
    release_from(m, s, 0);
    kvvm_seq dead = s->h;
    s->out = false;
    s->live = false;
    s->len = 0;
    m->cnt[shared ? C_FREE_SHARED : C_FREE]++;
    if (rndn(m, 8) == 0) {
        uint32_t slot;
        rc = kvvm_seq_slot(m->kv, dead, &slot);
        MCHECK(m, rc == -ENOENT, "a freed handle answered %d", rc);
    }
}

/* ---------------------------------------------------------------- discard and classes */

/* kvvm_seq_discard of one region or all: pages wholly before first_kept become holes (their
   references dropped, in any tier); a first_kept below an earlier one changes nothing. */
static void op_discard(struct model *m, struct mseq *s)
{
    bool all = rndn(m, 3) == 0;
    uint32_t region = all ? KVVM_ALL_REGIONS : (uint32_t)rndn(m, m->c.nr);
    uint64_t fk = s->len ? s->len - rndn(m, s->len < 8 ? s->len + 1 : 8) : 0;
    snprintf(m->where, sizeof m->where, "discard seq %ld r%d to %lu of %lu (out %d)",
             (long)(s - m->s), all ? -1 : (int)region, (unsigned long)fk,
             (unsigned long)s->len, s->out);
    if (rndn(m, 20) == 0) {
        int rc = kvvm_seq_discard(m->kv, s->h, region, s->len + 1);
        MCHECK(m, rc == -EINVAL, "discard past the length: %d", rc);
        m->cnt[C_EINVAL]++;
        return;
    }
    int rc = REFUSABLE(m, kvvm_seq_discard(m->kv, s->h, region, fk));
    MCHECK(m, rc == 0, "discard: %d", rc);
    uint64_t end = fk * m->c.bpt / m->c.ps;
    bool released = false;
    for (uint32_t r = 0; r < m->c.nr; r++) {
        if (!all && r != region)
            continue;
        for (uint64_t k = 0; k < end; k++)
            if (s->mp[r][k] != HOLE) {
                pg_put(m, s->mp[r][k]);
                s->mp[r][k] = HOLE;
                released = true;
            }
        if (s->kept[r] < fk)
            s->kept[r] = fk;
    }
    if (released)
        m->cnt[C_DISCARD]++;
    verify_touched(m, s, fk ? fk - 1 : 0, s->len);
}

/* Elastic memory (kvvm_trim, kvvm_set_budget) against the model: a trim never moves data; a
   budget between the pages in use and the budget at open releases unused frames only (nothing
   moves, the model's pages stay where they are); with every sequence resident and protected,
   a budget below the pages in use is -ENOMEM and changes nothing. */
static void op_budget(struct model *m)
{
    uint64_t nr = m->c.nr, ps = m->c.ps;
    snprintf(m->where, sizeof m->where, "budget: used %lu of %lu", (unsigned long)m->used,
             (unsigned long)m->total);
    int rc = kvvm_trim(m->kv, (size_t)rndn(m, 4) * ps);
    MCHECK(m, rc == 0, "kvvm_trim: %d", rc);
    uint64_t lo = m->used > nr ? m->used : nr;
    uint64_t b = lo + rndn(m, m->total0 - lo + 1);
    rc = REFUSABLE(m, kvvm_set_budget(m->kv, (size_t)(b * ps)));
    MCHECK(m, rc == 0, "kvvm_set_budget(%lu pages, %lu in use): %d", (unsigned long)b,
           (unsigned long)m->used, rc);
    m->total = b;
    rc = kvvm_sync(m->kv);
    MCHECK(m, rc == 0, "kvvm_sync: %d", rc);
    struct kvvm_stats st = { .size = sizeof st };
    MCHECK(m, kvvm_stats(m->kv, &st) == 0 && st.pages_device_total == b &&
           st.device_bytes_held <= b * ps, "after set_budget(%lu pages): total %lu, held %lu",
           (unsigned long)b, (unsigned long)st.pages_device_total,
           (unsigned long)st.device_bytes_held);
    m->cnt[C_BUDGET]++;
    bool all_in = m->used > nr && !ents_reclaimable_dev(m);
    for (int i = 0; i < MAXS && all_in; i++)    /* (a CACHED one: its drop is not predicted) */
        all_in = !m->s[i].live || (!m->s[i].out && m->s[i].cls != KVVM_SEQ_CACHED);
    if (!all_in)
        return;
    for (int i = 0; i < MAXS; i++)          /* a prefetch of a resident sequence protects it */
        if (m->s[i].live)
            MCHECK(m, kvvm_seq_prefetch(m->kv, m->s[i].h) == 0, "prefetch seq %d", i);
    uint64_t below = nr + rndn(m, m->used - nr);
    rc = REFUSABLE(m, kvvm_set_budget(m->kv, (size_t)(below * ps)));
    MCHECK(m, rc == -ENOMEM, "kvvm_set_budget(%lu pages) below the %lu in use, every "
           "sequence protected: %d", (unsigned long)below, (unsigned long)m->used, rc);
    unchanged(m, rc);
    MCHECK(m, kvvm_stats(m->kv, &st) == 0 && st.pages_device_total == b,
           "a refused set_budget changed the budget to %lu pages",
           (unsigned long)st.pages_device_total);
    m->cnt[C_BUDGET_ENOMEM]++;
}

/* A resident s made CACHED, then a grow of another sequence g short of pages: the library
   drops s (no copy) when its own pages cover the shortfall, else -ENOMEM and s stays. A
   dropped s is -ESTALE until set_class makes it an empty sequence again. */
static void op_cache_drop(struct model *m, struct mseq *s)
{
    struct mseq *g = NULL;
    for (int i = 0; i < MAXS && !g; i++)
        if (m->s[i].live && !m->s[i].out && &m->s[i] != s && m->s[i].len < m->c.max_tokens &&
            !m->s[i].dropped)
            g = &m->s[i];
    if (s->out || !s->len || !g || (m->c.flags & KVVM_F_AUTO_SWAP))
        return;
    for (int i = 0; i < MAXS; i++)      /* s the only candidate: the outcome is predicted */
        if (m->s[i].live && &m->s[i] != s && m->s[i].cls == KVVM_SEQ_CACHED)
            return;
    if (ents_reclaimable_dev(m))
        return;                         /* (an entry is a candidate too) */
    uint64_t frees = 0, np = npages(m, s->len);
    for (uint32_t r = 0; r < m->c.nr; r++)
        for (uint64_t k = 0; k < np; k++) {
            int32_t id = s->mp[r][k];
            frees += id != HOLE && m->ref[id] == 1 && !m->onhost[id];
        }
    /* a grow of g needing a little more than is free: half the time within s's pages */
    uint64_t target = mfree(m) + 1 + rndn(m, frees + 2), nl = g->len, need = 0;
    while (nl < m->c.max_tokens && need < target)
        need = need_grow(m, g, ++nl, false, NULL, NULL);
    if (need <= mfree(m))
        return;                         /* g cannot grow short of pages */
    snprintf(m->where, sizeof m->where, "cache drop seq %ld (%u frees) for grow seq %ld to "
             "%u (needs %u, %u free)", (long)(s - m->s), (unsigned)frees, (long)(g - m->s),
             (unsigned)nl, (unsigned)need, (unsigned)mfree(m));
    int rc = kvvm_seq_set_class(m->kv, s->h, KVVM_SEQ_CACHED);
    MCHECK(m, rc == 0, "set_class CACHED: %d", rc);
    s->cls = KVVM_SEQ_CACHED;           /* (as the library has it, should the op end early) */
    rc = kvvm_step(m->kv);              /* s unprotected: a candidate */
    MCHECK(m, rc == 0, "kvvm_step: %d", rc);
    rc = REFUSABLE(m, kvvm_seq_grow(m->kv, g->h, nl));
    struct kvvm_seq_info in = { .size = sizeof in };
    MCHECK(m, kvvm_seq_info(m->kv, s->h, &in) == 0, "info");
    if (need > mfree(m) + frees) {
        MCHECK(m, rc == -ENOMEM && !in.dropped, "needs %lu, %lu free + %lu droppable: grow "
               "returned %d, dropped %d", (unsigned long)need, (unsigned long)mfree(m),
               (unsigned long)frees, rc, in.dropped);
        m->cnt[C_ENOMEM]++;
    } else {
        MCHECK(m, rc == 0 && in.dropped && in.length == 0 && in.pages_device == 0,
               "needs %lu, %lu free + %lu droppable: grow returned %d, dropped %d",
               (unsigned long)need, (unsigned long)mfree(m), (unsigned long)frees, rc,
               in.dropped);
        release_from(m, s, 0);
        s->len = 0;
        s->zero_until = 0;
        memset(s->kept, 0, sizeof s->kept);
        uint64_t old = g->len;
        apply_grow(m, g, nl);
        uint8_t b[8];
        kvvm_seq c;
        MCHECK(m, kvvm_seq_read(m->kv, s->h, 0, 0, b, 1) == -ESTALE &&
               kvvm_seq_grow(m->kv, s->h, 1) == -ESTALE &&
               kvvm_seq_fork(m->kv, s->h, &c) == -ESTALE, "a dropped sequence is not stale");
        m->cnt[C_DROP]++;
        verify_touched(m, g, old ? old - 1 : 0, nl);
    }
    rc = kvvm_seq_set_class(m->kv, s->h, KVVM_SEQ_LIVE);   /* (revives a dropped one) */
    MCHECK(m, rc == 0, "set_class LIVE: %d", rc);
    s->cls = KVVM_SEQ_LIVE;
    verify_touched(m, s, 0, s->len);
}


/* kvvm_set_budget below the pages in use: drops CACHED sequences, demotes them
   (KVVM_F_CACHE_DEMOTE), swaps LIVE ones out, never moves a PINNED one, all or nothing. Not
   predicted: a success is followed page by page (resync), a failure must be -ENOMEM with
   every sequence and the budget as before. */
static void op_shrink(struct model *m)
{
    uint64_t nr = m->c.nr;
    if (m->used <= nr)
        return;
    uint64_t b = nr + rndn(m, m->used - nr);
    snprintf(m->where, sizeof m->where, "set_budget(%lu pages) below the %lu in use of %lu",
             (unsigned long)b, (unsigned long)m->used, (unsigned long)m->total);
    int rc = REFUSABLE_AGAIN(m, kvvm_set_budget(m->kv, (size_t)(b * m->c.ps)));
    if (rc == 0) {
        m->total = b;
        resync(m, NULL, 0);
        MCHECK(m, m->used <= b, "%lu pages in use after set_budget(%lu)",
               (unsigned long)m->used, (unsigned long)b);
        m->cnt[C_SHRINK]++;
        return;
    }
    MCHECK(m, rc == -ENOMEM, "set_budget below the pages in use: %d", rc);
    unchanged(m, rc);
    struct kvvm_stats st = { .size = sizeof st };
    MCHECK(m, kvvm_stats(m->kv, &st) == 0 && st.pages_device_total == m->total,
           "a refused set_budget changed the budget to %lu pages",
           (unsigned long)st.pages_device_total);
    m->cnt[C_FAILED_SAME]++;
}

/* kvvm_seq_set_class: LIVE, CACHED (reclaim drops or demotes it) or PINNED (never moved by
   reclaim). A dropped sequence comes back as an empty one of the class. */
static void op_set_class(struct model *m, struct mseq *s)
{
    uint64_t k = rndn(m, 20);
    uint32_t cls = k < 9 ? KVVM_SEQ_LIVE : k < 17 ? KVVM_SEQ_CACHED : KVVM_SEQ_PINNED;
    snprintf(m->where, sizeof m->where, "set_class seq %ld %u -> %u (dropped %d)",
             (long)(s - m->s), s->cls, cls, s->dropped);
    int rc = kvvm_seq_set_class(m->kv, s->h, (enum kvvm_seq_class)cls);
    MCHECK(m, rc == 0, "set_class: %d", rc);
    s->cls = cls;
    s->dropped = false;
}

/* A dropped CACHED sequence: share (as source), fork, grow, grow_batch, swap_in and
   prefetch are -ESTALE before anything moves (a grow far past the free pages, also after an
   explicit swap_out of it: its room check must not reclaim first); set_class revives it,
   free frees it. */
static void op_stale(struct model *m, struct mseq *s)
{
    uint64_t k = rndn(m, 8), nl = rndn(m, 2) ? m->c.max_tokens : 1 + rndn(m, m->c.max_tokens);
    snprintf(m->where, sizeof m->where, "dropped seq %ld: call %lu (grow to %lu)",
             (long)(s - m->s), (unsigned long)k, (unsigned long)nl);
    if (k == 0) {
        op_set_class(m, s);
        return;
    }
    if (k == 1) {
        op_free(m, s);
        return;
    }
    kvvm_seq c = 0, hs[2] = { s->h, 0 };
    uint64_t lens[2] = { nl, 0 };
    int rc, n = 1;
    struct mseq *o = pick_live(m);
    if (o && o != s && !o->dropped && !o->out) {
        hs[1] = o->h;
        lens[1] = o->len;
        n = 2;
    }
    if (k == 3) {                       /* explicitly swapped out (nothing to move) first */
        rc = kvvm_seq_swap_out(m->kv, s->h);
        MCHECK(m, rc == 0 || rc == -ESTALE, "swap_out of a dropped sequence: %d", rc);
        s->out |= rc == 0;
        snap_take(m);
    }
    switch (k) {
    case 2: case 3: rc = kvvm_seq_grow(m->kv, s->h, nl); break;
    case 4: rc = kvvm_seq_grow_batch(m->kv, hs, lens, (size_t)n); break;
    case 5: rc = kvvm_seq_fork(m->kv, s->h, &c); break;
    case 6: rc = kvvm_seq_swap_in(m->kv, s->h); break;
    default: rc = kvvm_seq_prefetch(m->kv, s->h); break;
    }
    if (rc != -ESTALE && keep_going()) {
        printf("VIOLATION seed %lu op %lu (%s): a call on a dropped sequence returned %d\n",
               m->seed, (unsigned long)m->op, m->where, rc);
        m->violations++;
        MCHECK(m, rc < 0, "a call on a dropped sequence succeeded");
    } else {
        MCHECK(m, rc == -ESTALE && c == 0, "a call on a dropped sequence returned %d", rc);
    }
    unchanged(m, rc);
    m->cnt[C_STALE]++;
}

/* ---------------------------------------------------------------- prefix calls */

/* Keys of s's blocks [0, n), derived from its content as an engine derives them from token
   ids: key i chains key i-1 with the tags of block i's tokens in every region (a tag and
   its position name the bytes: equal keys, equal bytes). */
static void seq_keys(const struct model *m, const struct mseq *s, uint32_t n, kvvm_key *k)
{
    uint64_t a = 0x6b76766d6d6f64ull, b = 31;
    for (uint32_t i = 0; i < n; i++) {
        for (uint32_t r = 0; r < m->c.nr; r++)
            for (uint32_t t = 0; t < TPB; t++) {
                a = mix64(a ^ ((uint64_t)s->tag[r][i * TPB + t] << 8 | r));
                b = mix64(b + a);
            }
        uint64_t w[4] = { a, b, mix64(a ^ b), 0 };
        memcpy(k[i].bytes, w, sizeof w);
    }
}

/* A chain of keys for lookup, attach or drop: one published lately (two times in three;
   now and then under another namespace), or a live sequence's keys; now and then cut
   short. Returns its length. */
static uint32_t pick_chain(struct model *m, uint64_t *ns, kvvm_key *k)
{
    uint32_t n = 0;
    if (m->nch && rndn(m, 3)) {
        /* (of three picks, the first whose head is still an entry: most hit) */
        const struct mchain *c = NULL;
        for (int tries = 0; tries < 3; tries++) {
            c = &m->ch[rndn(m, m->nch < MAXCH ? m->nch : MAXCH)];
            if (c->n && ent_find(m, c->ns, &c->key[0]))
                break;
        }
        n = c->n;
        memcpy(k, c->key, n * sizeof *k);
        *ns = rndn(m, 4) ? c->ns : 1 + rndn(m, NNS);
    } else {
        struct mseq *s = pick_live(m);
        if (!s || s->dropped)
            return 0;
        n = (uint32_t)(s->len / TPB);
        seq_keys(m, s, n, k);
        *ns = 1 + rndn(m, NNS);
    }
    if (rndn(m, 4) == 0)
        n = (uint32_t)rndn(m, n + 1);
    return n;
}

/* The leading keys the model has (ns), their entries in e. */
static uint32_t model_hits(struct model *m, uint64_t ns, const kvvm_key *k, uint32_t n,
                           struct ment **e)
{
    uint32_t h = 0;
    while (h < n && (e[h] = ent_find(m, ns, &k[h])) != NULL)
        h++;
    return h;
}

static void op_pdrop(struct model *m);

/* kvvm_prefix_publish of s's first blocks: the new entries share s's pages. */
static void op_publish(struct model *m, struct mseq *s)
{
    uint32_t full = (uint32_t)(s->len / TPB);
    uint32_t n = rndn(m, 2) ? full : (uint32_t)rndn(m, full + 1);
    uint64_t ns = 1 + rndn(m, NNS);
    kvvm_key k[MAXB + 1];
    snprintf(m->where, sizeof m->where, "publish seq %ld %u of %u blocks, namespace %lu "
             "(out %d, dropped %d)", (long)(s - m->s), n, full, (unsigned long)ns, s->out,
             s->dropped);
    if (s->dropped) {
        int rc = kvvm_prefix_publish(m->kv, s->h, ns, k, 0);
        MCHECK(m, rc == -ESTALE, "publish of a dropped sequence: %d", rc);
        unchanged(m, rc);
        m->cnt[C_STALE]++;
        return;
    }
    seq_keys(m, s, full, k);
    if (rndn(m, 40) == 0) {
        memset(&k[full], 0x5a, sizeof k[full]);
        int rc = kvvm_prefix_publish(m->kv, s->h, ns, k, full + 1);
        MCHECK(m, rc == -EINVAL, "publish past the full blocks: %d", rc);
        unchanged(m, rc);
        m->cnt[C_EINVAL]++;
        return;
    }
    bool hole = false, cut = false;
    for (uint32_t r = 0; r < m->c.nr; r++) {
        cut |= s->kept[r] > 0;
        for (uint32_t b = 0; b < n; b++)
            hole |= s->mp[r][b] == HOLE;
    }
    if (hole) {
        int rc = kvvm_prefix_publish(m->kv, s->h, ns, k, n);
        MCHECK(m, rc == -EINVAL, "publish of a discarded block: %d", rc);
        unchanged(m, rc);
        m->cnt[C_EINVAL]++;
        return;
    }
    if (cut)
        return;                         /* (tokens below first_kept: not vouched for) */
    int fresh = 0;
    for (uint32_t b = 0; b < n; b++)
        fresh += ent_find(m, ns, &k[b]) == NULL;
    if (ent_count(m) + fresh > MAXE) {
        op_pdrop(m);                    /* the model's room for entries */
        return;
    }
    int rc = REFUSABLE(m, kvvm_prefix_publish(m->kv, s->h, ns, k, n));
    MCHECK(m, rc == fresh, "publish: %d, model %d new entries (%s)", rc, fresh,
           kvvm_last_error());
    for (uint32_t b = 0, i = 0; b < n; b++) {
        if (ent_find(m, ns, &k[b]))
            continue;
        while (m->e[i].live)
            i++;
        struct ment *e = &m->e[i];
        *e = (struct ment){ .live = true, .ns = ns, .key = k[b] };
        for (uint32_t r = 0; r < m->c.nr; r++) {
            e->mp[r] = s->mp[r][b];
            m->ref[e->mp[r]]++;
            m->eref[e->mp[r]]++;
            for (uint32_t t = 0; t < TPB; t++)
                e->tag[r][t] = s->tag[r][b * TPB + t];
        }
    }
    if (n) {
        struct mchain *c = &m->ch[m->nch++ % MAXCH];
        c->ns = ns;
        c->n = n;
        memcpy(c->key, k, n * sizeof *k);
    }
    m->cnt[C_PUBLISH] += fresh > 0;
    verify_touched(m, s, 0, 0);
}

/* kvvm_prefix_lookup: the leading keys present, each one's tier (the lowest of its pages). */
static void op_lookup(struct model *m)
{
    uint64_t ns = 0;
    kvvm_key k[MAXB];
    struct ment *e[MAXB];
    uint8_t where[MAXB];
    uint32_t n = pick_chain(m, &ns, k), h = model_hits(m, ns, k, n, e);
    snprintf(m->where, sizeof m->where, "lookup of %u keys, namespace %lu (model: %u)", n,
             (unsigned long)ns, h);
    int rc = REFUSABLE(m, kvvm_prefix_lookup(m->kv, ns, k, n, where));
    MCHECK(m, rc == (int)h, "lookup: %d", rc);
    for (uint32_t b = 0; b < h; b++) {
        uint8_t want = 1, got = where[b] >= 2 ? 2 : where[b];
        for (uint32_t r = 0; r < m->c.nr; r++)
            want = tier_of(m, e[b]->mp[r]) > want ? tier_of(m, e[b]->mp[r]) : want;
        MCHECK(m, got == want && (m->c.disk || where[b] != 3), "lookup: block %u in tier %u, "
               "model %u", b, where[b], want);
    }
    m->cnt[C_LOOKUP] += h > 0;
}

/* kvvm_prefix_attach into an empty sequence: the model's hit, room as a swap-in's (the
   pages of the hit below the device come up; others may be reclaimed for them), the bytes
   checked against the entries' tags. */
static void op_attach(struct model *m)
{
    struct mseq *dst = NULL;
    for (int i = 0; i < MAXS && !dst; i++)
        if (m->s[i].live && m->s[i].len == 0 && !m->s[i].dropped)
            dst = &m->s[i];
    if (!dst) {
        if (!free_entry(m))
            return;
        op_create(m);
        for (int i = 0; i < MAXS && !dst; i++)
            if (m->s[i].live && m->s[i].len == 0 && !m->s[i].dropped)
                dst = &m->s[i];
        if (!dst)
            return;
        snap_take(m);
    }
    uint64_t ns = 0;
    kvvm_key k[MAXB];
    struct ment *e[MAXB];
    uint32_t n = pick_chain(m, &ns, k), h = model_hits(m, ns, k, n, e);
    uint64_t need = 0;
    for (uint32_t b = 0; b < h; b++)
        for (uint32_t r = 0; r < m->c.nr; r++)
            need += m->onhost[e[b]->mp[r]] != 0;    /* (distinct: one page per block) */
    snprintf(m->where, sizeof m->where, "attach of %u keys, namespace %lu into seq %ld (out "
             "%d; model: %u blocks, %lu pages up, %lu free)", n, (unsigned long)ns,
             (long)(dst - m->s), dst->out, h, (unsigned long)need, (unsigned long)mfree(m));
    bool may = need > mfree(m) && may_reclaim(m, &dst, 1);
    int rc = REFUSABLE(m, kvvm_prefix_attach(m->kv, dst->h, ns, k, n));
    if (may) {
        if (rc < 0) {
            MCHECK(m, rc == -ENOMEM, "attach (reclaim possible): %d", rc);
            unchanged(m, rc);
            m->cnt[C_FAILED_SAME]++;
            return;
        }
        resync(m, &dst, 1);
    } else if (need > mfree(m)) {
        MCHECK(m, rc == -ENOMEM, "attach needs %lu pages, %lu free: %d", (unsigned long)need,
               (unsigned long)mfree(m), rc);
        unchanged(m, rc);
        m->cnt[C_ENOMEM]++;
        return;
    }
    MCHECK(m, rc == (int)h, "attach: %d (%s)", rc, rc < 0 ? kvvm_last_error() : "");
    for (uint32_t b = 0; b < h; b++)
        for (uint32_t r = 0; r < m->c.nr; r++) {
            int32_t id = e[b]->mp[r];
            dst->mp[r][b] = id;
            m->ref[id]++;
            if (m->onhost[id]) {
                m->onhost[id] = 0;
                m->used++;
                m->host_used--;
            }
            for (uint32_t t = 0; t < TPB; t++)
                dst->tag[r][b * TPB + t] = e[b]->tag[r][t];
        }
    dst->len = (uint64_t)h * TPB;
    dst->zero_until = 0;
    if (h) {
        dst->out = false;
        m->cnt[C_ATTACH]++;
        m->cnt[C_ATTACH_IN] += need > 0;
    }
    verify_touched(m, dst, 0, dst->len);
}

/* kvvm_prefix_drop of a chain's keys, or of a whole namespace: the model's entries of them
   go (their pages stay with the sequences sharing them). */
static void op_pdrop(struct model *m)
{
    uint64_t ns = 1 + rndn(m, NNS);
    kvvm_key k[MAXB];
    uint32_t n = 0;
    int want = 0;
    bool all = rndn(m, 8) == 0;
    if (all) {
        for (int i = 0; i < MAXE; i++)
            want += m->e[i].live && m->e[i].ns == ns;
    } else {
        n = pick_chain(m, &ns, k);
        for (uint32_t b = 0; b < n; b++)
            want += ent_find(m, ns, &k[b]) != NULL;
    }
    snprintf(m->where, sizeof m->where, "prefix drop of %s%u keys, namespace %lu (model: %d)",
             all ? "all " : "", n, (unsigned long)ns, want);
    int rc = REFUSABLE(m, kvvm_prefix_drop(m->kv, ns, all ? NULL : k, n));
    MCHECK(m, rc == want, "prefix drop: %d", rc);
    for (int i = 0; i < MAXE; i++) {
        struct ment *e = &m->e[i];
        bool named = false;
        for (uint32_t b = 0; b < n && !named; b++)
            named = !memcmp(&e->key, &k[b], sizeof k[b]);
        if (e->live && e->ns == ns && (all || named))
            ent_put(m, e);
    }
    m->cnt[C_PDROP] += want > 0;
}

/* One prefix call (the pfx configurations). */
static void op_prefix(struct model *m)
{
    uint64_t k = rndn(m, 7);
    struct mseq *s = pick_live(m);
    if (k < 2 && s)
        op_publish(m, s);
    else if (k < 4)
        op_attach(m);
    else if (k < 6)
        op_lookup(m);
    else
        op_pdrop(m);
}

/* ---------------------------------------------------------------- driver */

static void model_open(struct model *m, const struct mcfg *c, unsigned long seed)
{
    memset(m, 0, sizeof *m);
    m->c = *c;
    m->seed = seed;
    m->rng = mix64(seed * 0x9e3779b97f4a7c15ull + 1) | 1;
    m->probe = c->bpt > FULL_BPT;
    struct kvvm_config k;
    kvvm_config_init(&k);
    k.backend = KVVM_BACKEND_EMULATED;
    k.emu_granule = c->gran;
    k.page_size = c->ps;
    k.n_regions = c->nr;
    k.bytes_per_token = c->bpt;
    k.max_seqs = c->max_seqs;
    k.max_tokens = c->max_tokens;
    k.device_budget = (size_t)c->pages_per_region * c->nr * c->ps;
    k.emu_device_bytes = 0;
    k.host_budget = (size_t)c->pages_per_region * c->nr * c->ps;   /* as many as the device */
    k.spill_dir = NULL;
    k.spill_budget = 0;             /* no disk tier (page descriptors scale with it) */
    size_t seq_pages = (c->max_tokens * c->bpt + c->ps - 1) / c->ps * c->nr;
    if (c->disk) {
        k.host_budget = (seq_pages + c->nr) * c->ps;
        k.spill_budget = (MAXS + 1) * seq_pages * c->ps;
    }
    if (c->mem) {                   /* the tier of tests/tier_mem.c in the disk tier's place */
        cr_assert_eq(tier_mem_use(k.spill_budget), 0, "tier_mem_use");
        k.spill_budget = 0;
    } else if (c->disk) {
        snprintf(m->dir, sizeof m->dir, "/var/tmp/kvvm_test_model.XXXXXX");
        cr_assert(mkdtemp(m->dir), "mkdtemp");
        k.spill_dir = m->dir;
    }
    k.flags = c->flags;
    if (c->flags & KVVM_F_AUTO_SWAP)    /* reclaim by the calls only: no background round */
        k.device_min = k.device_low = k.device_high = 0;
    k.map_ahead = 0;
    k.emu_opaque = 1;
    int rc = kvvm_open(&k, &m->kv);
    cr_assert_eq(rc, 0, "kvvm_open: %d", rc);
    struct kvvm_stats st = { .size = sizeof st };
    cr_assert_eq(kvvm_stats(m->kv, &st), 0);
    cr_assert_eq(st.pages_device_total, (uint64_t)c->pages_per_region * c->nr,
                 "pages_device_total %lu", (unsigned long)st.pages_device_total);
    m->total = m->total0 = st.pages_device_total;
    m->host_total = st.pages_host_total;
    if (c->disk) {
        cr_assert_eq(st.pages_disk_total, (MAXS + 1) * seq_pages);
        m->host_total += st.pages_disk_total;
    } else {
        cr_assert_eq(m->host_total, m->total, "pages_host_total %lu",
                     (unsigned long)st.pages_host_total);
    }
    uint64_t ids = m->total + m->host_total;
    m->ref = calloc(ids, sizeof *m->ref);
    m->tmpdec = calloc(ids, sizeof *m->tmpdec);
    m->eref = calloc(ids, sizeof *m->eref);
    uint32_t tpb = 0;
    cr_assert(!c->pfx || (kvvm_block_tokens(m->kv, &tpb) == 0 && tpb == TPB &&
                          c->max_tokens / TPB <= MAXB), "tokens per block %u", tpb);
    m->onhost = calloc(ids, 1);
    m->ids = calloc(ids, sizeof *m->ids);
    for (uint64_t i = 0; i < ids; i++)
        m->ids[m->nids++] = (int32_t)(ids - 1 - i);
    m->maxpg = npages(m, c->max_tokens);
    for (int i = 0; i < MAXS; i++)
        for (uint32_t r = 0; r < c->nr; r++) {
            m->s[i].tag[r] = calloc(c->max_tokens, sizeof(uint32_t));
            m->s[i].mp[r] = calloc(m->maxpg, sizeof(int32_t));
        }
}

static void model_close(struct model *m)
{
    snprintf(m->where, sizeof m->where, "close: every prefix entry dropped");
    for (uint64_t ns = 1; m->c.pfx && ns <= NNS; ns++) {
        int want = 0;
        for (int i = 0; i < MAXE; i++)
            want += m->e[i].live && m->e[i].ns == ns;
        int rc = kvvm_prefix_drop(m->kv, ns, NULL, 0);
        MCHECK(m, rc == want, "prefix drop of namespace %lu: %d, model %d", (unsigned long)ns,
               rc, want);
    }
    for (int i = 0; i < MAXE; i++)
        if (m->e[i].live)
            ent_put(m, &m->e[i]);
    for (int i = 0; i < MAXS; i++)
        if (m->s[i].live)
            op_free(m, &m->s[i]);
    kvvm_step(m->kv);
    check_state(m);
    MCHECK(m, m->used == 0 && m->host_used == 0, "model pages left");
    kvvm_close(m->kv);
    if (m->c.mem) {
        MCHECK(m, tier_mem_misuses() == 0, "the in-memory tier was misused %lu times",
               tier_mem_misuses());
    } else if (m->c.disk) {
        MCHECK(m, rmdir(m->dir) == 0, "spill dir %s not empty after kvvm_close", m->dir);
    }
    for (int i = 0; i < MAXS; i++)
        for (uint32_t r = 0; r < MAXR; r++) {
            free(m->s[i].tag[r]);
            free(m->s[i].mp[r]);
        }
    free(m->ref);
    free(m->tmpdec);
    free(m->eref);
    free(m->onhost);
    free(m->ids);
    free(m->buf);
    free(m->exp);
}

static void model_run(struct model *m, uint64_t ops)
{
    for (m->op = 0; m->op < ops; m->op++) {
        if (setjmp(op_abandon)) {
            /* a refused call broke the rule and the model followed it (refusal_failed):
               the op ends here */
            goto step;
        }
        if (m->c.pfx && rndn(m, 100) < 6) {
            op_prefix(m);
            goto step;
        }
        struct mseq *s = pick_live(m);
        uint64_t w = rndn(m, 100);
        if (!s || w < 7) {
            op_create(m);
        } else if (s->dropped) {
            op_stale(m, s);
        } else if (w < 27) {
            op_grow(m, s);
        } else if (w < 33) {
            op_grow_batch(m);
        } else if (w < 41) {
            op_truncate(m, s);
        } else if (w < 49) {
            op_fork(m, s);
        } else if (w < 61) {
            op_share(m, s);
        } else if (w < 73) {
            op_prepare_write(m, s);
        } else if (w < 85) {
            op_write(m, s);
        } else if (w < 90) {
            op_free(m, s);
        } else if (w < 95) {
            op_swap_out(m, s);
        } else if (w < 97) {
            snprintf(m->where, sizeof m->where, "swap_in");
            ensure_in(m, s);
        } else if (w < 98) {
            op_discard(m, s);
        } else if (w < 99) {
            op_cache_drop(m, s);
        } else if ((w = rndn(m, 8)) < 3) {
            op_set_class(m, s);
        } else if (w < 5) {
            op_shrink(m);
        } else if (w < 7) {
            op_budget(m);
        } else {
            snprintf(m->where, sizeof m->where, "verify seq %ld", (long)(s - m->s));
            if (ensure_in(m, s))
                verify_tokens(m, s, 0, s->len);
        }
step:;
        int rc = kvvm_step(m->kv);
        MCHECK(m, rc == 0, "kvvm_step: %d", rc);
        check_state(m);
        check_view(m);
        if (m->op % 1000 == 999) {
            snprintf(m->where, sizeof m->where, "periodic full verify");
            verify_all(m);
        }
    }
    snprintf(m->where, sizeof m->where, "final verify");
    verify_all(m);
}

static double scale(void)
{
    const char *e = getenv("KVVMTEST_SCALE");
    if (e && *e) {
        double v = strtod(e, NULL);
        if (v > 0)
            return v;
    }
    return SANITIZED ? 0.05 : 1.0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Runs one configuration: CI (one seed, ci_ops scaled) or soak (20 seeds x 100 000). */
static void run_config_d(const char *name, size_t ps, uint32_t nr, uint64_t ci_ops,
                         unsigned long seed0, bool disk, unsigned flags)
{
    /* the pool view's configurations: pages of several 4 KiB granules, tokens that fill
       them (no straddling then) */
    bool view = flags & KVVM_F_POOL_VIEW, pfx = flags & PFX, mem = flags & MEM;
    flags &= ~(PFX | MEM);
    disk |= mem;
    struct mcfg c = {
        .ps = ps, .nr = nr, .bpt = view || pfx ? ps / TPB : ps * 3 / 8 + 36, .max_seqs = MAXS,
        .max_tokens = 16, .pages_per_region = 16, .disk = disk, .flags = flags,
        .gran = view ? 4096 : ps, .pfx = pfx, .mem = mem,
    };
    const char *soak = getenv("KVVMTEST_MODEL_SOAK");
    const char *sd = getenv("KVVMTEST_MODEL_SEED");
    bool is_soak = soak && *soak && strcmp(soak, "0");
    int seeds = is_soak ? 20 : 1;
    double sc = scale();
    uint64_t ops = is_soak ? 100000 : (uint64_t)(ci_ops * sc);
    if (ops < 1000)
        ops = 1000;
    if (sd && *sd)
        seed0 = strtoul(sd, NULL, 0);
    uint64_t total[NC] = { 0 }, violations = 0;
    refusals_reset();
    double t0 = now_s();
    static struct model m;
    for (int i = 0; i < seeds; i++) {
        model_open(&m, &c, seed0 + (unsigned long)i);
        model_run(&m, ops);
        model_close(&m);
        for (int k = 0; k < NC; k++)
            total[k] += m.cnt[k];
        violations += m.violations;
    }
    double dt = now_s() - t0;
    printf("model %s: page %zu, %u regions, %lu bytes/token, %d seed(s) from %lu x %lu ops "
           "in %.1f s (%.1f us/op)\n", name, ps, nr, (unsigned long)c.bpt, seeds, seed0,
           (unsigned long)ops, dt, dt * 1e6 / ((double)ops * seeds));
    /* Each case at least 100 times at scale 1; below it, half the scaled figure: a reduced
       run's counts are few and the threads' timing moves them (2m/1+auto's shrinks that
       succeed: 8 to 15 in 12 000 ops at scale 0.1 on a loaded machine, whose 10 failed the
       KVVM_DEBUG stage now and then). A case never reached still fails. */
    uint64_t min = (uint64_t)(is_soak || sc >= 1 ? 100 : 50 * sc);
    if (min < 1)
        min = 1;
    char missing[512] = "";
    for (int k = 0; k < NC; k++) {
        if (!disk && (k == C_SPILL || k == C_UNSPILL))
            continue;
        if (!pfx && k >= C_PUBLISH)
            continue;
        printf("  %-40s %10lu\n", cname[k], (unsigned long)total[k]);
        /* counted, not required: how often these happen depends on the flags and on how
           often every sequence is resident and none CACHED */
        if (k == C_BUDGET_ENOMEM || k == C_RECLAIMED || k == C_FAILED_SAME ||
            k == C_ENT_RECLAIMED || k == C_ATTACH_IN)
            continue;
        if (k == C_STRADDLE && (view || pfx))   /* tokens fill pages: none straddles */
            continue;
        /* nor drops where reclaim demotes: under KVVM_F_AUTO_SWAP a CACHED sequence goes
           only as a reclaim victim (op_cache_drop's predicted drop is not run), and with
           KVVM_F_CACHE_DEMOTE it is demoted while the room below holds it
           (docs/design.md "Pressure and thresholds", Classes), which a disk tier leaves
           nearly always (4k/2+disk+auto at scale 0.2: 0 drops, ~900 demotions) */
        if ((k == C_DROP || k == C_STALE) && disk && (c.flags & KVVM_F_AUTO_SWAP) &&
            (c.flags & KVVM_F_CACHE_DEMOTE))
            continue;
        if (total[k] < min && strlen(missing) + strlen(cname[k]) + 3 < sizeof missing) {
            strcat(missing, cname[k]);
            strcat(missing, "; ");
        }
    }
    refusals_report(name);
    fflush(stdout);
    cr_expect(violations == 0, "%s: %lu failed calls changed something", name,
              (unsigned long)violations);
    cr_expect(missing[0] == 0, "%s: cases hit fewer than %lu times: %s", name,
              (unsigned long)min, missing);
}

static void run_config(const char *name, size_t ps, uint32_t nr, uint64_t ci_ops,
                       unsigned long seed0, unsigned flags)
{
    run_config_d(name, ps, nr, ci_ops, seed0, false, flags);
}

#define DEMOTE KVVM_F_CACHE_DEMOTE
#define AUTO (KVVM_F_AUTO_SWAP | KVVM_F_CACHE_DEMOTE)

/* CI budget: 1 560 000 ops over the matrix, weighted towards the cheap small pages. */
/* Flags: KVVM_F_CACHE_DEMOTE (DEMOTE) and KVVM_F_AUTO_SWAP with it (AUTO: every call short
   of pages may swap others out; those outcomes are followed, not predicted). An AUTO op costs
   about twice a predicted one (the swap traffic, and following it page by page): those
   configurations run half the ops they ran before, so the whole test takes as long. */
Test(model, page4k_1region) { run_config("4k/1", 4096, 1, 500000, 101, 0); }
Test(model, page4k_4regions)
{
    run_config("4k/4+auto+prefix", 4096, 4, 200000, 102, AUTO | PFX);
}
Test(model, page64k_1region)
{
    run_config("64k/1+demote+prefix", 65536, 1, 400000, 103, DEMOTE | PFX);
}
Test(model, page64k_4regions) { run_config("64k/4", 65536, 4, 340000, 104, 0); }
Test(model, page2m_1region) { run_config("2m/1+auto", 2u << 20, 1, 120000, 105, AUTO); }
Test(model, page2m_4regions) { run_config("2m/4", 2u << 20, 4, 160000, 106, 0); }
/* The disk tier under a small host tier (spill and unspill constantly). */
Test(model, page4k_2regions_disk)
{
    run_config_d("4k/2+disk+auto+prefix", 4096, 2, 100000, 107, true, AUTO | PFX);
}
/* The test-only in-memory tier (tests/tier_mem.c) in the disk tier's place. */
Test(model, page4k_2regions_mem)
{
    run_config_d("4k/2+mem+auto+prefix", 4096, 2, 100000, 111, true, AUTO | PFX | MEM);
}
Test(model, page64k_1region_disk)
{
    /* (no prefix calls: tokens that fill pages leave this configuration's host tier too
       little pressure to spill at KVVMTEST_SCALE=0.1; 4k/2+disk+auto+prefix has both) */
    run_config_d("64k/1+disk+demote", 65536, 1, 120000, 108, true, DEMOTE);
}
/* The pool view (issue 31): pages of 2 and 4 granules, block tables checked after every op. */
#define VIEW KVVM_F_POOL_VIEW
Test(model, page8k_2regions_view)
{
    run_config("8k/2+view+prefix", 8192, 2, 100000, 109, VIEW | PFX);
}
Test(model, page16k_1region_view_demote)
{
    run_config("16k/1+view+demote+prefix", 16384, 1, 120000, 110, VIEW | DEMOTE | PFX);
}
