/*
 * tests/test_paging.c: the context and paging layer through the public API (include/kvvm.h,
 * docs/api.md), checked against the emulated device's own tables (kvvm_debug_check) and with
 * content cookies read back through kvvm_seq_read.
 *
 * Every test runs on the emulated device in opaque mode with small granules (4 KiB unless a
 * test says otherwise), so a sequence of a few pages costs microseconds. A "shadow" per
 * sequence holds the bytes each region must read back; cookies are derived from (lineage,
 * region, token, byte offset), so a write that leaks into a sharer shows as a mismatch.
 *
 * Suites: errors (every error of docs/api.md these calls can return, each followed by a
 * check that nothing changed), layout, cow (the copy-on-write matrix, share edges, the
 * classic block-pool scenario), options (map-ahead, scrub, stream mode), config, sweep (the
 * trace-driven fail-at-call-N sweep; it lists every injection point that breaks a rule
 * before failing) and threads.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>
#include "kvvm.h"
#include "core/debug.h"
#include "vmm/emu/emu.h"
#include "emu_ctx.h"

#define MAXR 8      /* regions a test uses at most */
#define MAXS 64     /* sequences a snapshot holds at most */
#define KB 4096u

/* ---------------------------------------------------------------- cookies */

static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27; x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

/* Byte at offset off of region r written by lineage lin (bpt fixes the token). Never 0, so
   zero-fill checks cannot pass on cookie bytes. */
static inline uint8_t cookie(uint32_t lin, uint32_t r, uint64_t bpt, uint64_t off)
{
    uint64_t tok = off / bpt;
    uint64_t x = mix64(((uint64_t)lin << 40) ^ ((uint64_t)r << 32) ^ (tok << 12) ^
                       mix64(off >> 3));
    uint8_t b = (uint8_t)(x >> (8 * (off & 7)));
    return b ? b : 1;
}

static void cookie_fill(uint8_t *dst, uint32_t lin, uint32_t r, uint64_t bpt, uint64_t off,
                        size_t len)
{
    for (size_t i = 0; i < len; i++)
        dst[i] = cookie(lin, r, bpt, off + i);
}

/* ---------------------------------------------------------------- context helpers */

struct tctx {
    kvvm *kv;
    struct kvvm_config cfg;
    int ord;            /* emulated device ordinal */
    uint64_t cap;       /* bytes per region of a full sequence */
};

static void tcfg(struct kvvm_config *c, size_t ps, uint32_t nr, uint64_t bpt,
                 uint32_t max_seqs, uint64_t max_tokens, uint64_t pages)
{
    kvvm_config_init(c);
    c->backend = KVVM_BACKEND_EMULATED;
    c->emu_granule = ps;
    c->page_size = ps;
    c->n_regions = nr;
    c->bytes_per_token = bpt;
    c->max_seqs = max_seqs;
    c->max_tokens = max_tokens;
    c->device_budget = pages * ps;
    c->emu_device_bytes = 0;
    c->host_budget = 0;
    c->spill_dir = NULL;
    c->spill_budget = 0;
    c->flags = 0;
    c->map_ahead = 0;
    c->emu_opaque = 1;
}

static void topen(struct tctx *t, const struct kvvm_config *c)
{
    memset(t, 0, sizeof *t);
    t->cfg = *c;
    int rc = kvvm_open(c, &t->kv);
    cr_assert_eq(rc, 0, "kvvm_open: %d (%s)", rc, kvvm_strerror(rc));
    t->ord = kvvm_debug_emu_ordinal(t->kv);
    cr_assert_geq(t->ord, 0, "no emulated device ordinal");
    cr_assert_str_eq(kvvm_backend_name(t->kv), "emulated");
    t->cap = c->max_tokens * c->bytes_per_token;
}

static void tcheck(struct tctx *t, const char *where)
{
    char why[512] = "";
    int rc = kvvm_debug_check(t->kv, why, sizeof why);
    cr_assert_eq(rc, 0, "%s: invariant violated (%d): %s", where, rc, why);
}

static void tstats(struct tctx *t, struct kvvm_stats *st)
{
    memset(st, 0, sizeof *st);
    st->size = sizeof *st;
    int rc = kvvm_stats(t->kv, st);
    cr_assert_eq(rc, 0, "kvvm_stats: %d", rc);
}

static void tinfo(struct tctx *t, kvvm_seq s, struct kvvm_seq_info *in)
{
    memset(in, 0, sizeof *in);
    in->size = sizeof *in;
    int rc = kvvm_seq_info(t->kv, s, in);
    cr_assert_eq(rc, 0, "kvvm_seq_info: %d", rc);
}

static void tclose(struct tctx *t)
{
    int ord = t->ord;
    kvvm_close(t->kv);
    t->kv = NULL;
    struct emu_counters ec;
    if (emu_counters_get(ord, &ec) == 0)
        cr_expect(ec.handles == 0 && ec.mappings == 0 && ec.reservations == 0 &&
                  ec.streams == 0 && ec.events == 0,
                  "kvvm_close left handles %lu mappings %lu reservations %lu streams %lu "
                  "events %lu", (unsigned long)ec.handles, (unsigned long)ec.mappings,
                  (unsigned long)ec.reservations, (unsigned long)ec.streams,
                  (unsigned long)ec.events);
}

/* Soft mode (the fail-at-call-N sweep): state checks report and count failures instead of
   ending the test, so one run lists every injection point that breaks a rule. */
static bool soft;
static int soft_failures;
#define UCHK(cond, ...) do {                                   \
        if (cond) break;                                       \
        if (soft) { soft_failures++; cr_expect_fail(__VA_ARGS__); } \
        else cr_assert_fail(__VA_ARGS__);                      \
    } while (0)

static void scheck(struct tctx *t, const char *where)
{
    char why[512] = "";
    int rc = kvvm_debug_check(t->kv, why, sizeof why);
    UCHK(rc == 0, "%s: invariant violated (%d): %s", where, rc, why);
}

/* ---------------------------------------------------------------- shadows */

struct sh {
    kvvm_seq h;
    uint64_t len;
    uint8_t *exp[MAXR];     /* expected bytes per region, cap bytes each */
};

static void sh_init(struct tctx *t, struct sh *s)
{
    memset(s, 0, sizeof *s);
    for (uint32_t r = 0; r < t->cfg.n_regions; r++) {
        s->exp[r] = calloc(1, t->cap);
        cr_assert(s->exp[r]);
    }
}

static void sh_release(struct sh *s)
{
    for (int r = 0; r < MAXR; r++)
        free(s->exp[r]);
    memset(s, 0, sizeof *s);
}

static void sh_create(struct tctx *t, struct sh *s)
{
    sh_init(t, s);
    int rc = kvvm_seq_create(t->kv, &s->h);
    cr_assert_eq(rc, 0, "kvvm_seq_create: %d", rc);
    cr_assert_neq(s->h, 0, "handle 0 returned");
}

static void sh_grow(struct tctx *t, struct sh *s, uint64_t len)
{
    int rc = kvvm_seq_grow(t->kv, s->h, len);
    cr_assert_eq(rc, 0, "kvvm_seq_grow(%lu): %d", (unsigned long)len, rc);
    s->len = len;
}

/* In stream mode a write's copy may run after the call returned: its source buffer is kept
   until the test has synchronized (keep_flush). */
static bool keep_bufs;
static void *kept[256];
static int nkept;

static void keep_flush(void)
{
    for (int i = 0; i < nkept; i++)
        free(kept[i]);
    nkept = 0;
}

static void sh_write(struct tctx *t, struct sh *s, uint32_t r, uint64_t off, size_t len,
                     uint32_t lin)
{
    uint8_t *buf = malloc(len);
    cr_assert(buf);
    cookie_fill(buf, lin, r, t->cfg.bytes_per_token, off, len);
    int rc = kvvm_seq_write(t->kv, s->h, r, off, buf, len);
    cr_assert_eq(rc, 0, "kvvm_seq_write(r%u, %lu+%zu): %d", r, (unsigned long)off, len, rc);
    memcpy(s->exp[r] + off, buf, len);
    if (keep_bufs && nkept < 256)
        kept[nkept++] = buf;
    else
        free(buf);
}

/* Writes tokens [first, end) of every region with lineage lin. */
static void sh_fill(struct tctx *t, struct sh *s, uint64_t first, uint64_t end, uint32_t lin)
{
    uint64_t bpt = t->cfg.bytes_per_token;
    if (end <= first)
        return;
    for (uint32_t r = 0; r < t->cfg.n_regions; r++)
        sh_write(t, s, r, first * bpt, (end - first) * bpt, lin);
}

static void sh_grow_fill(struct tctx *t, struct sh *s, uint64_t len, uint32_t lin)
{
    uint64_t old = s->len;
    sh_grow(t, s, len);
    sh_fill(t, s, old, len, lin);
}

static void sh_verify(struct tctx *t, struct sh *s, const char *where)
{
    uint64_t n = s->len * t->cfg.bytes_per_token;
    if (!n)
        return;
    uint8_t *buf = malloc(n);
    cr_assert(buf);
    for (uint32_t r = 0; r < t->cfg.n_regions; r++) {
        memset(buf, 0x5a, n);
        int rc = kvvm_seq_read(t->kv, s->h, r, 0, buf, n);
        cr_assert_eq(rc, 0, "%s: kvvm_seq_read(r%u, 0+%lu): %d", where, r,
                     (unsigned long)n, rc);
        if (memcmp(buf, s->exp[r], n)) {
            uint64_t i = 0;
            while (buf[i] == s->exp[r][i])
                i++;
            UCHK(0, "%s: seq %#lx region %u byte %lu (token %lu, page %lu) reads "
                           "%#x, expected %#x", where, (unsigned long)s->h, r,
                           (unsigned long)i, (unsigned long)(i / t->cfg.bytes_per_token),
                           (unsigned long)(i / t->cfg.page_size), buf[i], s->exp[r][i]);
        }
    }
    free(buf);
}

static void sh_fork(struct tctx *t, struct sh *parent, struct sh *child)
{
    sh_init(t, child);
    int rc = kvvm_seq_fork(t->kv, parent->h, &child->h);
    cr_assert_eq(rc, 0, "kvvm_seq_fork: %d", rc);
    child->len = parent->len;
    for (uint32_t r = 0; r < t->cfg.n_regions; r++)
        memcpy(child->exp[r], parent->exp[r], t->cap);
}

static void sh_share(struct tctx *t, struct sh *dst, struct sh *src, uint64_t n)
{
    int rc = kvvm_seq_share(t->kv, dst->h, src->h, n);
    cr_assert_eq(rc, 0, "kvvm_seq_share(%lu): %d", (unsigned long)n, rc);
    dst->len = n;
    for (uint32_t r = 0; r < t->cfg.n_regions; r++)
        memcpy(dst->exp[r], src->exp[r], n * t->cfg.bytes_per_token);
}

static void sh_free(struct tctx *t, struct sh *s)
{
    int rc = kvvm_seq_free(t->kv, s->h);
    cr_assert_eq(rc, 0, "kvvm_seq_free: %d", rc);
    sh_release(s);
}

/* ---------------------------------------------------------------- snapshots */

struct snap {
    struct kvvm_stats st;
    int n;
    struct kvvm_seq_info in[MAXS];
    struct emu_counters ec;
};

static void snap_take(struct tctx *t, struct snap *sn, struct sh **ss, int n)
{
    memset(sn, 0, sizeof *sn);
    tstats(t, &sn->st);
    sn->n = n;
    for (int i = 0; i < n; i++)
        tinfo(t, ss[i]->h, &sn->in[i]);
    cr_assert_eq(emu_counters_get(t->ord, &sn->ec), 0);
}

/* A failed call changes nothing: gauges, every sequence's info, the emulator's live
   mappings and handles, the invariants, and every sequence's bytes. */
static void expect_unchanged(struct tctx *t, const struct snap *a, struct sh **ss, int n,
                             const char *where)
{
    struct snap b;
    char why[512] = "";
    int rc = kvvm_debug_check(t->kv, why, sizeof why);
    UCHK(rc == 0, "%s: invariant violated (%d): %s", where, rc, why);
    snap_take(t, &b, ss, n);
#define SAME(f) UCHK(a->st.f == b.st.f, "%s: stats." #f " changed %lu -> %lu", where, \
                     (unsigned long)a->st.f, (unsigned long)b.st.f)
    SAME(page_size); SAME(pages_device_total); SAME(pages_device_free);
    SAME(pages_host_total); SAME(pages_host_free); SAME(pages_disk_total);
    SAME(pages_disk_free); SAME(pages_inflight);
#undef SAME
    for (int i = 0; i < n; i++) {
        const struct kvvm_seq_info *x = &a->in[i], *y = &b.in[i];
#define SAMEI(f) UCHK(x->f == y->f, "%s: seq %d info." #f " changed %lu -> %lu", \
                      where, i, (unsigned long)x->f, (unsigned long)y->f)
        SAMEI(length); SAMEI(slot); SAMEI(pages_device); SAMEI(pages_host);
        SAMEI(pages_disk); SAMEI(pages_shared); SAMEI(resident);
#undef SAMEI
    }
    UCHK(a->ec.mappings == b.ec.mappings, "%s: emulator mappings %lu -> %lu", where,
         (unsigned long)a->ec.mappings, (unsigned long)b.ec.mappings);
    /* Physical handles: the pool may create frames ahead of need and keep them for reuse
       (never more than the budget); kvvm_debug_check above proved the emulator's live
       handles are exactly the pool's, so a new one here is pooled, not leaked. */
    UCHK(b.ec.handles <= t->cfg.device_budget / t->cfg.page_size,
         "%s: emulator handles %lu -> %lu, past the budget", where,
         (unsigned long)a->ec.handles, (unsigned long)b.ec.handles);
    for (int i = 0; i < n; i++)
        sh_verify(t, ss[i], where);
}

/* Pages a length covers in one region. */
static uint64_t pages_for(struct tctx *t, uint64_t len)
{
    uint64_t b = len * t->cfg.bytes_per_token, ps = t->cfg.page_size;
    return (b + ps - 1) / ps;
}

/* The common small context of the error tests: 4 KiB pages, 2 regions, tokens of 1000 bytes
   (they straddle pages), 4 slots, 40 tokens (10 pages per region), 12 pages. */
static void open_small(struct tctx *t)
{
    struct kvvm_config c;
    tcfg(&c, KB, 2, 1000, 4, 40, 12);
    topen(t, &c);
}

/* ================================================================ errors */

Test(errors, create_enospc_and_fork_enospc)
{
    struct tctx t;
    open_small(&t);
    struct sh s[4];
    struct sh *ss[4];
    for (int i = 0; i < 4; i++) {
        sh_create(&t, &s[i]);
        ss[i] = &s[i];
    }
    sh_grow_fill(&t, &s[0], 5, 1);
    struct snap a;
    snap_take(&t, &a, ss, 4);
    kvvm_seq x = 0xdead;
    cr_expect_eq(kvvm_seq_create(t.kv, &x), -ENOSPC, "create with every slot in use");
    cr_expect_eq(x, 0xdead, "a failed create wrote its out-value");
    expect_unchanged(&t, &a, ss, 4, "create -ENOSPC");
    cr_expect_eq(kvvm_seq_fork(t.kv, s[0].h, &x), -ENOSPC, "fork with every slot in use");
    expect_unchanged(&t, &a, ss, 4, "fork -ENOSPC");
    sh_free(&t, &s[3]);
    struct sh n;
    sh_create(&t, &n);
    sh_free(&t, &n);
    for (int i = 0; i < 3; i++)
        sh_free(&t, &s[i]);
    tcheck(&t, "end");
    tclose(&t);
}

/* Every call that takes a handle answers -ENOENT for 0, a freed handle (also after its slot
   was reused) and forged handles (one bit flipped), and changes nothing. */
Test(errors, enoent_freed_and_forged_handles)
{
    struct tctx t;
    open_small(&t);
    struct sh a, b, c;
    sh_create(&t, &a);
    sh_grow_fill(&t, &a, 7, 1);
    kvvm_seq dead = a.h;
    sh_free(&t, &a);
    sh_create(&t, &b);              /* likely reuses the freed slot */
    sh_grow_fill(&t, &b, 9, 2);
    sh_create(&t, &c);
    struct sh *ss[2] = { &b, &c };
    struct snap s0;
    snap_take(&t, &s0, ss, 2);

    kvvm_seq bad[70];
    int nbad = 0;
    bad[nbad++] = 0;
    bad[nbad++] = dead;
    for (int bit = 0; bit < 64; bit++) {
        kvvm_seq f = b.h ^ (1ull << bit);
        if (f != b.h && f != c.h && f != 0)
            bad[nbad++] = f;
    }
    uint8_t buf[64] = { 0 };
    uint64_t u64;
    uint32_t u32;
    struct kvvm_seq_info in = { .size = sizeof in };
    for (int i = 0; i < nbad; i++) {
        kvvm_seq h = bad[i], x = 0;
        uint64_t len1 = 12;
        char w[96];
        snprintf(w, sizeof w, "handle %#lx", (unsigned long)h);
        cr_expect_eq(kvvm_seq_free(t.kv, h), -ENOENT, "%s free", w);
        cr_expect_eq(kvvm_seq_grow(t.kv, h, 3), -ENOENT, "%s grow", w);
        kvvm_seq pair[2] = { b.h, h };
        uint64_t lens[2] = { len1, 3 };
        cr_expect_eq(kvvm_seq_grow_batch(t.kv, pair, lens, 2), -ENOENT, "%s grow_batch", w);
        cr_expect_eq(kvvm_seq_truncate(t.kv, h, 0), -ENOENT, "%s truncate", w);
        cr_expect_eq(kvvm_seq_fork(t.kv, h, &x), -ENOENT, "%s fork", w);
        cr_expect_eq(kvvm_seq_share(t.kv, h, b.h, 1), -ENOENT, "%s share dst", w);
        cr_expect_eq(kvvm_seq_share(t.kv, c.h, h, 0), -ENOENT, "%s share src", w);
        cr_expect_eq(kvvm_seq_prepare_write(t.kv, h, 0, 1), -ENOENT, "%s prepare_write", w);
        cr_expect_eq(kvvm_seq_write(t.kv, h, 0, 0, buf, 8), -ENOENT, "%s write", w);
        cr_expect_eq(kvvm_seq_read(t.kv, h, 0, 0, buf, 8), -ENOENT, "%s read", w);
        cr_expect_eq(kvvm_seq_slot(t.kv, h, &u32), -ENOENT, "%s slot", w);
        cr_expect_eq(kvvm_seq_addr(t.kv, h, 0, &u64), -ENOENT, "%s addr", w);
        cr_expect_eq(kvvm_seq_info(t.kv, h, &in), -ENOENT, "%s info", w);
        expect_unchanged(&t, &s0, ss, 2, w);
    }
    sh_free(&t, &b);
    sh_free(&t, &c);
    tcheck(&t, "end");
    tclose(&t);
}

Test(errors, einval_arguments)
{
    struct tctx t;
    open_small(&t);
    struct sh a, e;
    sh_create(&t, &a);
    sh_grow_fill(&t, &a, 10, 1);
    sh_create(&t, &e);
    struct sh *ss[2] = { &a, &e };
    struct snap s0;
    snap_take(&t, &s0, ss, 2);
    uint64_t bpt = t.cfg.bytes_per_token, n = a.len * bpt;
    uint8_t buf[16] = { 0 };
    uint64_t u64;
    uint32_t u32;
    kvvm_seq x;

#define EXPECT_EINVAL(call) do {                                            \
        int rc_ = (call);                                                   \
        cr_expect_eq(rc_, -EINVAL, "%s: %d, expected -EINVAL", #call, rc_); \
        expect_unchanged(&t, &s0, ss, 2, #call);                            \
    } while (0)

    EXPECT_EINVAL(kvvm_seq_create(t.kv, NULL));
    EXPECT_EINVAL(kvvm_seq_grow(t.kv, a.h, 9));                  /* shorter */
    EXPECT_EINVAL(kvvm_seq_truncate(t.kv, a.h, 11));             /* longer */
    EXPECT_EINVAL(kvvm_seq_fork(t.kv, a.h, NULL));
    EXPECT_EINVAL(kvvm_seq_share(t.kv, a.h, e.h, 0));            /* dst not empty */
    EXPECT_EINVAL(kvvm_seq_share(t.kv, e.h, a.h, 11));           /* past src length */
    EXPECT_EINVAL(kvvm_seq_prepare_write(t.kv, a.h, 3, 3));      /* empty */
    EXPECT_EINVAL(kvvm_seq_prepare_write(t.kv, a.h, 4, 3));      /* reversed */
    EXPECT_EINVAL(kvvm_seq_prepare_write(t.kv, a.h, 5, 11));     /* past length */
    EXPECT_EINVAL(kvvm_seq_prepare_write(t.kv, e.h, 0, 1));      /* empty sequence */
    EXPECT_EINVAL(kvvm_seq_write(t.kv, a.h, 2, 0, buf, 8));      /* region */
    EXPECT_EINVAL(kvvm_seq_write(t.kv, a.h, 0, n - 4, buf, 8));  /* past end */
    EXPECT_EINVAL(kvvm_seq_write(t.kv, a.h, 0, UINT64_MAX - 2, buf, 8)); /* overflow */
    EXPECT_EINVAL(kvvm_seq_write(t.kv, a.h, 0, 0, buf, 0));      /* empty */
    EXPECT_EINVAL(kvvm_seq_write(t.kv, a.h, 0, 0, NULL, 8));
    EXPECT_EINVAL(kvvm_seq_read(t.kv, a.h, 2, 0, buf, 8));
    EXPECT_EINVAL(kvvm_seq_read(t.kv, a.h, 1, n - 1, buf, 2));
    EXPECT_EINVAL(kvvm_seq_read(t.kv, a.h, 0, 0, buf, 0));
    EXPECT_EINVAL(kvvm_seq_read(t.kv, a.h, 0, 0, NULL, 8));
    EXPECT_EINVAL(kvvm_seq_read(t.kv, e.h, 0, 0, buf, 1));       /* length 0 */
    EXPECT_EINVAL(kvvm_seq_slot(t.kv, a.h, NULL));
    EXPECT_EINVAL(kvvm_seq_addr(t.kv, a.h, 2, &u64));
    EXPECT_EINVAL(kvvm_seq_addr(t.kv, a.h, 0, NULL));
    EXPECT_EINVAL(kvvm_region_base(t.kv, 2, &u64));
    EXPECT_EINVAL(kvvm_region_base(t.kv, 0, NULL));
    EXPECT_EINVAL(kvvm_slot_bytes(t.kv, NULL));
    EXPECT_EINVAL(kvvm_seq_info(t.kv, a.h, NULL));
    EXPECT_EINVAL(kvvm_stats(t.kv, NULL));
    EXPECT_EINVAL(kvvm_stats_json(t.kv, NULL, 100));
    {
        kvvm_seq two[2] = { a.h, a.h };
        uint64_t lens[2] = { 12, 13 };
        EXPECT_EINVAL(kvvm_seq_grow_batch(t.kv, two, lens, 2));  /* named twice */
        kvvm_seq pair[2] = { e.h, a.h };
        uint64_t sh[2] = { 3, 9 };
        EXPECT_EINVAL(kvvm_seq_grow_batch(t.kv, pair, sh, 2));   /* one shorter: none grows */
        EXPECT_EINVAL(kvvm_seq_grow_batch(t.kv, NULL, lens, 2));
        EXPECT_EINVAL(kvvm_seq_grow_batch(t.kv, pair, NULL, 2));
    }
    /* a context given as NULL is a NULL pointer argument */
    EXPECT_EINVAL(kvvm_seq_create(NULL, &x));
    EXPECT_EINVAL(kvvm_seq_grow(NULL, a.h, 12));
    EXPECT_EINVAL(kvvm_seq_slot(NULL, a.h, &u32));
#undef EXPECT_EINVAL
    sh_free(&t, &a);
    sh_free(&t, &e);
    tclose(&t);
}

Test(errors, e2big_past_max_tokens)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 2, 1000, 4, 40, 30);
    topen(&t, &c);
    struct sh a, b;
    sh_create(&t, &a);
    sh_grow_fill(&t, &a, 6, 1);
    sh_create(&t, &b);
    sh_grow_fill(&t, &b, 2, 2);
    struct sh *ss[2] = { &a, &b };
    struct snap s0;
    snap_take(&t, &s0, ss, 2);
    int rc = kvvm_seq_grow(t.kv, a.h, 41);
    cr_expect_eq(rc, -E2BIG, "grow past max_tokens: %d", rc);
    expect_unchanged(&t, &s0, ss, 2, "grow -E2BIG");
    rc = kvvm_seq_grow(t.kv, a.h, UINT64_MAX);
    cr_expect_eq(rc, -E2BIG, "grow to UINT64_MAX: %d", rc);
    expect_unchanged(&t, &s0, ss, 2, "grow UINT64_MAX");
    kvvm_seq pair[2] = { b.h, a.h };
    uint64_t lens[2] = { 4, 41 };
    rc = kvvm_seq_grow_batch(t.kv, pair, lens, 2);
    cr_expect_eq(rc, -E2BIG, "grow_batch with one past max_tokens: %d", rc);
    expect_unchanged(&t, &s0, ss, 2, "grow_batch -E2BIG (all or nothing)");
    sh_grow_fill(&t, &a, 40, 3);             /* exactly max_tokens is fine */
    sh_verify(&t, &a, "at max_tokens");
    sh_free(&t, &a);
    sh_free(&t, &b);
    tclose(&t);
}

/* A tiny budget: every call that needs a page answers -ENOMEM and changes nothing. */
Test(errors, enomem_changes_nothing)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 1, 1000, 8, 40, 4);          /* 4 pages in all */
    topen(&t, &c);
    struct sh a, b, f, e;
    sh_create(&t, &a);
    sh_grow_fill(&t, &a, 14, 1);              /* 14000 bytes: 4 pages, last partial */
    sh_fork(&t, &a, &f);                      /* fork needs no page */
    sh_create(&t, &b);
    sh_create(&t, &e);
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_assert_eq(st.pages_device_total, 4);
    cr_assert_eq(st.pages_device_free, 0, "free %lu", (unsigned long)st.pages_device_free);
    struct sh *ss[4] = { &a, &f, &b, &e };
    struct snap s0;
    snap_take(&t, &s0, ss, 4);
    uint8_t buf[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
    int rc;

#define EXPECT_ENOMEM(call) do {                                           \
        rc = (call);                                                       \
        cr_expect_eq(rc, -ENOMEM, "%s: %d, expected -ENOMEM", #call, rc);  \
        expect_unchanged(&t, &s0, ss, 4, #call);                           \
    } while (0)

    EXPECT_ENOMEM(kvvm_seq_grow(t.kv, b.h, 1));               /* a new page */
    EXPECT_ENOMEM(kvvm_seq_grow(t.kv, a.h, 15));              /* COW of the shared last page */
    EXPECT_ENOMEM(kvvm_seq_grow(t.kv, f.h, 16));
    EXPECT_ENOMEM(kvvm_seq_prepare_write(t.kv, a.h, 0, 1));   /* COW of page 0 */
    EXPECT_ENOMEM(kvvm_seq_prepare_write(t.kv, f.h, 13, 14));
    EXPECT_ENOMEM(kvvm_seq_write(t.kv, f.h, 0, 5000, buf, 8)); /* write into a shared page */
    EXPECT_ENOMEM(kvvm_seq_write(t.kv, a.h, 0, 13990, buf, 8));
    EXPECT_ENOMEM(kvvm_seq_share(t.kv, e.h, a.h, 13));        /* partial page copy */
    {
        kvvm_seq pair[2] = { a.h, b.h };
        uint64_t lens[2] = { 14, 1 };
        EXPECT_ENOMEM(kvvm_seq_grow_batch(t.kv, pair, lens, 2));
    }
#undef EXPECT_ENOMEM
    /* what needs no page still works: a share of 0 tokens, and a grow within the last page
       once the sharer is gone */
    rc = kvvm_seq_share(t.kv, e.h, a.h, 0);
    cr_expect_eq(rc, 0, "share of 0 tokens needs no page: %d", rc);
    sh_free(&t, &f);
    sh_grow_fill(&t, &a, 16, 2);              /* sole owner now: no copy, fits in page 3 */
    sh_verify(&t, &a, "after regrow");
    sh_free(&t, &a);
    sh_free(&t, &b);
    sh_free(&t, &e);
    tstats(&t, &st);
    cr_expect_eq(st.pages_device_free, 4);
    tcheck(&t, "end");
    tclose(&t);
}

/* A sticky driver error (a device fault) kills the context: the call that saw it and every
   later call return -EIO; kvvm_close still releases everything. */
Test(errors, eio_after_sticky_driver_error)
{
    struct tctx t;
    open_small(&t);
    struct sh a, b;
    sh_create(&t, &a);
    sh_grow_fill(&t, &a, 9, 1);
    sh_create(&t, &b);
    /* find the copy entry point a write uses */
    static struct emu_trace_entry tr[256];
    uint8_t buf[64];
    memset(buf, 7, sizeof buf);
    emu_trace_start();
    int rc = kvvm_seq_write(t.kv, a.h, 0, 100, buf, sizeof buf);
    size_t n = emu_trace_stop(tr, 256);
    cr_assert_eq(rc, 0);
    const char *copy = NULL;
    for (size_t i = 0; i < n && i < 256; i++)
        if (!strncmp(tr[i].entry, "cuMemcpy", 8))
            copy = tr[i].entry;
    cr_assert(copy, "kvvm_seq_write made no cuMemcpy* call (%zu calls traced)", n);
    cr_assert_eq(emu_fail_arm(copy, 1, KCU_ERROR_ILLEGAL_ADDRESS), 0);
    rc = kvvm_seq_write(t.kv, a.h, 0, 100, buf, sizeof buf);
    emu_fail_clear();
    cr_expect_eq(rc, -EIO, "write that met a device fault: %d", rc);
    uint64_t u64;
    uint32_t u32;
    kvvm_seq x;
    struct kvvm_seq_info in = { .size = sizeof in };
    struct kvvm_stats st = { .size = sizeof st };
    cr_expect_eq(kvvm_seq_create(t.kv, &x), -EIO, "create on a dead context");
    cr_expect_eq(kvvm_seq_grow(t.kv, a.h, 10), -EIO, "grow on a dead context");
    cr_expect_eq(kvvm_seq_grow(t.kv, b.h, 1), -EIO, "grow on a dead context");
    cr_expect_eq(kvvm_seq_fork(t.kv, a.h, &x), -EIO, "fork on a dead context");
    cr_expect_eq(kvvm_seq_share(t.kv, b.h, a.h, 3), -EIO, "share on a dead context");
    cr_expect_eq(kvvm_seq_prepare_write(t.kv, a.h, 0, 1), -EIO, "prepare_write");
    cr_expect_eq(kvvm_seq_write(t.kv, a.h, 0, 0, buf, 8), -EIO, "write on a dead context");
    cr_expect_eq(kvvm_seq_read(t.kv, a.h, 0, 0, buf, 8), -EIO, "read on a dead context");
    cr_expect_eq(kvvm_seq_truncate(t.kv, a.h, 1), -EIO, "truncate on a dead context");
    cr_expect_eq(kvvm_seq_slot(t.kv, a.h, &u32), -EIO, "seq_slot on a dead context");
    cr_expect_eq(kvvm_seq_addr(t.kv, a.h, 0, &u64), -EIO, "seq_addr on a dead context");
    cr_expect_eq(kvvm_seq_info(t.kv, a.h, &in), -EIO, "seq_info on a dead context");
    cr_expect_eq(kvvm_stats(t.kv, &st), -EIO, "stats on a dead context");
    char js[4096];
    cr_expect_eq(kvvm_stats_json(t.kv, js, sizeof js), -EIO, "stats_json on a dead context");
    cr_expect_eq(kvvm_step(t.kv), -EIO, "step on a dead context");
    cr_expect_eq(kvvm_sync(t.kv), -EIO, "sync on a dead context");
    cr_expect_eq(kvvm_seq_free(t.kv, a.h), -EIO, "free on a dead context");
    sh_release(&a);
    sh_release(&b);
    tclose(&t);
}

/* Backend CUDA where no driver can be loaded: -ENODEV, never a silent emulation. */
Test(errors, cuda_backend_without_a_gpu)
{
    struct kvvm_config c;
    tcfg(&c, 64 * 1024, 1, 512, 2, 64, 8);
    c.backend = KVVM_BACKEND_CUDA;
    c.page_size = 0;
    c.device_budget = 16u << 20;
    kvvm *kv = NULL;
    int rc = kvvm_open(&c, &kv);
    if (rc == 0) {
        cr_expect_str_eq(kvvm_backend_name(kv), "cuda", "CUDA asked, %s given",
                         kvvm_backend_name(kv));
        kvvm_close(kv);
        return;
    }
    cr_expect_eq(rc, -ENODEV, "CUDA backend with no usable driver: %d", rc);
}

Test(errors, open_rejects_bad_config)
{
    struct kvvm_config base, c;
    tcfg(&base, 64 * 1024, 2, 512, 4, 1024, 16);
    kvvm *kv = NULL;
    int rc = kvvm_open(&base, &kv);
    cr_assert_eq(rc, 0, "the base config is valid: %d", rc);
    kvvm_close(kv);

#define EXPECT_BAD(mut) do {                                                 \
        c = base; mut;                                                       \
        kv = NULL;                                                           \
        rc = kvvm_open(&c, &kv);                                             \
        cr_expect_eq(rc, -EINVAL, "%s: kvvm_open %d, expected -EINVAL", #mut, rc); \
        if (rc == 0) kvvm_close(kv);                                         \
    } while (0)

    EXPECT_BAD(c.page_size = 96 * 1024);           /* not a multiple of the granule */
    EXPECT_BAD(c.page_size = 32 * 1024);           /* below the granule */
    EXPECT_BAD(c.n_regions = 0);
    EXPECT_BAD(c.bytes_per_token = 0);
    EXPECT_BAD(c.max_seqs = 0);
    EXPECT_BAD(c.max_tokens = 0);
    EXPECT_BAD(c.device_budget = 64 * 1024);       /* less than one page per region */
    EXPECT_BAD((c.device_low = 0.5, c.device_high = 0.2));
    EXPECT_BAD((c.device_min = 0.6, c.device_low = 0.5));
    EXPECT_BAD(c.device_high = 1.5);
    EXPECT_BAD(c.device_min = -0.1);
    EXPECT_BAD((c.host_low = 0.9, c.host_high = 0.1));
    EXPECT_BAD(c.size = 3);
    EXPECT_BAD(c.backend = (enum kvvm_backend)7);
    EXPECT_BAD(c.emu_granule = 3000);              /* not a power of two */
#undef EXPECT_BAD
    rc = kvvm_open(NULL, &kv);
    cr_expect_eq(rc, -EINVAL, "NULL config: %d", rc);
    rc = kvvm_open(&base, NULL);
    cr_expect_eq(rc, -EINVAL, "NULL out: %d", rc);
}

Test(errors, stats_json_enospc_and_config)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 2, 1000, 4, 40, 12);
    c.device_budget = 12 * KB;
    c.max_seqs = 3;
    topen(&t, &c);
    char big[16384];
    int rc = kvvm_stats_json(t.kv, big, sizeof big);
    cr_assert_eq(rc, 0, "kvvm_stats_json: %d", rc);
    cr_expect(strstr(big, "device_budget"), "no device_budget in %s", big);
    cr_expect(strstr(big, "49152"), "effective device_budget (49152) missing: %s", big);
    cr_expect(strstr(big, "max_seqs"), "no max_seqs in %s", big);
    cr_expect(strstr(big, "bytes_per_token"), "no bytes_per_token in %s", big);
    cr_expect(strstr(big, "emulated"), "backend missing: %s", big);
    cr_expect(strstr(big, "pages_device_free"), "stats missing: %s", big);
    cr_expect_eq(big[0], '{');
    size_t full = strlen(big);
    cr_expect_eq(big[full - 1], '}', "not one JSON object: %s", big);
    char small[16];
    memset(small, 'x', sizeof small);
    rc = kvvm_stats_json(t.kv, small, sizeof small);
    cr_expect_eq(rc, -ENOSPC, "small buffer: %d", rc);
    cr_expect_eq(small[sizeof small - 1], '\0', "truncated prefix not NUL-terminated");
    cr_expect_eq(strncmp(small, big, sizeof small - 1), 0, "not a prefix: %.15s", small);
    /* a zero-length buffer cannot hold even the NUL: too small, or a bad argument */
    rc = kvvm_stats_json(t.kv, small, 0);
    cr_expect(rc == -ENOSPC || rc == -EINVAL, "zero-length buffer: %d", rc);
    char *exact = malloc(full + 1);
    rc = kvvm_stats_json(t.kv, exact, full + 1);
    cr_expect_eq(rc, 0, "buffer of exactly strlen+1: %d", rc);
    rc = kvvm_stats_json(t.kv, exact, full);
    cr_expect_eq(rc, -ENOSPC, "buffer one short: %d", rc);
    free(exact);
    tcheck(&t, "json");
    tclose(&t);
}

Test(config, env_overrides)
{
    struct kvvm_config c;
    setenv("KVVM_DEVICE_BUDGET", "64M", 1);
    setenv("KVVM_MAP_AHEAD", "3", 1);
    setenv("KVVM_EMU_OPAQUE", "1", 1);
    setenv("KVVM_BACKEND", "emulated", 1);
    kvvm_config_init(&c);
    cr_expect_eq(c.size, sizeof c);
    cr_expect_eq(c.device_budget, 64u << 20, "KVVM_DEVICE_BUDGET=64M gave %zu",
                 c.device_budget);
    cr_expect_eq(c.map_ahead, 3, "KVVM_MAP_AHEAD=3 gave %u", c.map_ahead);
    cr_expect_eq(c.emu_opaque, 1);
    cr_expect_eq(c.backend, KVVM_BACKEND_EMULATED);
    cr_expect(c.device_min <= c.device_low && c.device_low <= c.device_high &&
              c.device_high <= 1.0, "default watermarks out of order");
    /* malformed values are reported and ignored: the default stays */
    unsetenv("KVVM_DEVICE_BUDGET");
    kvvm_config_init(&c);
    size_t dflt = c.device_budget;
    setenv("KVVM_DEVICE_BUDGET", "12Q", 1);
    kvvm_config_init(&c);
    cr_expect_eq(c.device_budget, dflt, "malformed KVVM_DEVICE_BUDGET changed the budget");
    setenv("KVVM_DEVICE_BUDGET", "2G", 1);
    kvvm_config_init(&c);
    cr_expect_eq(c.device_budget, 2ull << 30);
    unsetenv("KVVM_DEVICE_BUDGET");
    unsetenv("KVVM_MAP_AHEAD");
    unsetenv("KVVM_BACKEND");

    /* the effective configuration reaches the JSON */
    struct tctx t;
    setenv("KVVM_DEVICE_BUDGET", "256K", 1);
    kvvm_config_init(&c);
    unsetenv("KVVM_DEVICE_BUDGET");
    cr_expect_eq(c.device_budget, 256u << 10);
    c.backend = KVVM_BACKEND_EMULATED;
    c.emu_granule = 64 * 1024;
    c.page_size = 0;
    c.n_regions = 2;
    c.bytes_per_token = 100;
    c.max_seqs = 2;
    c.max_tokens = 100;
    topen(&t, &c);
    char js[16384];
    cr_assert_eq(kvvm_stats_json(t.kv, js, sizeof js), 0);
    cr_expect(strstr(js, "262144"), "device_budget from the env missing: %s", js);
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_expect_eq(st.page_size, 64 * 1024, "page_size 0 = the granule");
    cr_expect_eq(st.pages_device_total, 4);
    tclose(&t);
}

/* ================================================================ layout */

static void check_addresses(struct tctx *t, struct sh *s, int n)
{
    uint64_t slot_bytes = 0;
    cr_assert_eq(kvvm_slot_bytes(t->kv, &slot_bytes), 0);
    cr_expect_geq(slot_bytes, t->cfg.max_tokens * t->cfg.bytes_per_token);
    cr_expect_eq(slot_bytes % t->cfg.page_size, 0, "slot_bytes %lu not page-aligned",
                 (unsigned long)slot_bytes);
    uint64_t base[MAXR];
    for (uint32_t r = 0; r < t->cfg.n_regions; r++) {
        cr_assert_eq(kvvm_region_base(t->kv, r, &base[r]), 0);
        cr_expect_eq(base[r] % t->cfg.page_size, 0);
        if (r)
            cr_expect(base[r] >= base[r - 1] + t->cfg.max_seqs * slot_bytes ||
                      base[r] + t->cfg.max_seqs * slot_bytes <= base[r - 1],
                      "regions %u and %u overlap", r - 1, r);
    }
    for (int i = 0; i < n; i++) {
        uint32_t slot;
        cr_assert_eq(kvvm_seq_slot(t->kv, s[i].h, &slot), 0);
        cr_expect_lt(slot, t->cfg.max_seqs);
        struct kvvm_seq_info in;
        tinfo(t, s[i].h, &in);
        cr_expect_eq(in.slot, slot);
        for (int j = 0; j < i; j++) {
            uint32_t o;
            kvvm_seq_slot(t->kv, s[j].h, &o);
            cr_expect_neq(o, slot, "two live sequences in slot %u", slot);
        }
        for (uint32_t r = 0; r < t->cfg.n_regions; r++) {
            uint64_t a;
            cr_assert_eq(kvvm_seq_addr(t->kv, s[i].h, r, &a), 0);
            cr_expect_eq(a, base[r] + slot * slot_bytes,
                         "region_base + slot * slot_bytes != seq_addr (r%u slot %u)", r, slot);
        }
    }
}

/* Token-major: 1 region, 1000-byte tokens straddle 4 KiB pages. */
Test(layout, token_major_straddling)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 1, 1000, 4, 64, 64);
    topen(&t, &c);
    struct sh s[3];
    for (int i = 0; i < 3; i++) {
        sh_create(&t, &s[i]);
        sh_grow_fill(&t, &s[i], 5 + 9 * i, 10 + i);
    }
    check_addresses(&t, s, 3);
    uint64_t a0;
    kvvm_seq_addr(t.kv, s[0].h, 0, &a0);
    /* a token straddling pages 0 and 1 (token 4: bytes 4000..4999) rewritten in place */
    sh_write(&t, &s[0], 0, 4000, 1000, 99);
    /* and writes/reads at odd offsets across the boundary */
    sh_write(&t, &s[1], 0, 4090, 13, 98);
    for (int i = 0; i < 3; i++)
        sh_verify(&t, &s[i], "token-major");
    sh_grow_fill(&t, &s[0], 60, 12);
    uint64_t a1;
    kvvm_seq_addr(t.kv, s[0].h, 0, &a1);
    cr_expect_eq(a0, a1, "a sequence moved when it grew");
    struct kvvm_seq_info in;
    tinfo(&t, s[0].h, &in);
    cr_expect_eq(in.pages_device, pages_for(&t, 60));
    cr_expect_eq(in.length, 60);
    cr_expect_eq(in.resident, 1);
    check_addresses(&t, s, 3);
    tcheck(&t, "token-major");
    for (int i = 0; i < 3; i++)
        sh_verify(&t, &s[i], "token-major end");
    for (int i = 0; i < 3; i++)
        sh_free(&t, &s[i]);
    tclose(&t);
}

/* Per-layer K/V: 2 * 4 layers = 8 regions of 256-byte tokens. */
Test(layout, per_layer_kv)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 8, 256, 4, 100, 128);
    topen(&t, &c);
    struct sh s[4];
    for (int i = 0; i < 4; i++) {
        sh_create(&t, &s[i]);
        sh_grow_fill(&t, &s[i], 17 + 20 * i, 20 + i);
    }
    check_addresses(&t, s, 4);
    for (int i = 0; i < 4; i++) {
        struct kvvm_seq_info in;
        tinfo(&t, s[i].h, &in);
        cr_expect_eq(in.pages_device, 8 * pages_for(&t, s[i].len),
                     "pages_device counts every region: %u", in.pages_device);
        sh_verify(&t, &s[i], "kv layout");
    }
    struct kvvm_stats st;
    tstats(&t, &st);
    uint64_t used = 0;
    for (int i = 0; i < 4; i++)
        used += 8 * pages_for(&t, s[i].len);
    cr_expect_eq(st.pages_device_free, st.pages_device_total - used);
    tcheck(&t, "kv layout");
    for (int i = 0; i < 4; i++)
        sh_free(&t, &s[i]);
    tstats(&t, &st);
    cr_expect_eq(st.pages_device_free, st.pages_device_total);
    tclose(&t);
}

/* Emulated addresses are host pointers: bytes written through the API are there (windows
   CPU-readable when not opaque). */
Test(layout, emulated_addresses_are_host_pointers)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 2, 1000, 4, 40, 20);
    c.emu_opaque = 0;
    topen(&t, &c);
    struct sh s;
    sh_create(&t, &s);
    sh_grow_fill(&t, &s, 13, 7);
    for (uint32_t r = 0; r < 2; r++) {
        uint64_t a;
        cr_assert_eq(kvvm_seq_addr(t.kv, s.h, r, &a), 0);
        cr_expect_eq(memcmp((const void *)(uintptr_t)a, s.exp[r], 13000), 0,
                     "bytes at seq_addr differ from what was written (r%u)", r);
    }
    sh_free(&t, &s);
    tclose(&t);
}

/* ================================================================ copy-on-write */

enum cow_mode { COW_FORK, COW_SHARE };
enum cow_where { W_FIRST, W_MIDDLE, W_LAST };
enum cow_who { WHO_PARENT, WHO_CHILD, WHO_APPEND };

/* Writes the bytes of page pg (within the sequence's length) in every region. With prep,
   prepare_write over the tokens covering those bytes first. */
static void write_page(struct tctx *t, struct sh *s, uint64_t pg, uint32_t lin, bool prep)
{
    uint64_t ps = t->cfg.page_size, bpt = t->cfg.bytes_per_token, end = s->len * bpt;
    uint64_t b0 = pg * ps, b1 = (pg + 1) * ps < end ? (pg + 1) * ps : end;
    cr_assert_lt(b0, b1);
    if (prep) {
        int rc = kvvm_seq_prepare_write(t->kv, s->h, b0 / bpt, (b1 + bpt - 1) / bpt);
        cr_assert_eq(rc, 0, "prepare_write: %d", rc);
    }
    for (uint32_t r = 0; r < t->cfg.n_regions; r++)
        sh_write(t, s, r, b0, b1 - b0, lin);
}

static void cow_case(uint32_t nr, enum cow_mode mode, enum cow_where where, enum cow_who who)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, nr, 1000, 4, 40, 24 * nr);
    topen(&t, &c);
    char w[96];
    snprintf(w, sizeof w, "%s regions=%u where=%d who=%d",
             mode == COW_FORK ? "fork" : "share", nr, (int)where, (int)who);
    struct sh p, ch;
    sh_create(&t, &p);
    sh_grow_fill(&t, &p, 18, 1);            /* 18000 bytes: pages 0..4, page 4 partial */
    uint64_t np = pages_for(&t, 18);
    cr_assert_eq(np, 5);
    if (mode == COW_FORK) {
        sh_fork(&t, &p, &ch);
    } else {
        sh_create(&t, &ch);
        sh_share(&t, &ch, &p, 18);
    }
    struct kvvm_seq_info ip, ic;
    tinfo(&t, p.h, &ip);
    tinfo(&t, ch.h, &ic);
    /* fork shares all 5 pages; share all 4 whole ones and copies the partial 5th */
    uint32_t shared0 = (uint32_t)((mode == COW_FORK ? 5 : 4) * nr);
    cr_expect_eq(ip.pages_shared, shared0, "%s: parent pages_shared %u", w, ip.pages_shared);
    cr_expect_eq(ic.pages_shared, shared0, "%s: child pages_shared %u", w, ic.pages_shared);
    cr_expect_eq(ic.pages_device, 5 * nr);
    tcheck(&t, w);
    struct kvvm_stats s0, s1;
    tstats(&t, &s0);
    cr_expect_eq(s0.pages_device_free, s0.pages_device_total - (mode == COW_FORK ? 5 : 6) * nr,
                 "%s: fork/share added pages beyond the partial copy", w);

    uint64_t pg = where == W_FIRST ? 0 : where == W_MIDDLE ? 2 : 4;
    switch (who) {
    case WHO_PARENT:
        write_page(&t, &p, pg, 2, true);
        break;
    case WHO_CHILD:
        write_page(&t, &ch, pg, 3, false);
        break;
    case WHO_APPEND:
        /* both append into the (shared, for fork) partial last page and beyond, then the
           child rewrites page pg */
        sh_grow_fill(&t, &p, 21, 4);
        sh_grow_fill(&t, &ch, 23, 5);
        sh_verify(&t, &p, w);
        sh_verify(&t, &ch, w);
        write_page(&t, &ch, pg, 6, false);
        break;
    }
    sh_verify(&t, &p, w);
    sh_verify(&t, &ch, w);
    tcheck(&t, w);
    tstats(&t, &s1);
    /* share copied the partial page 4: writing only it (not through prepare_write, whose
       straddling tokens reach page 3) splits nothing */
    if (!(mode == COW_SHARE && pg == 4 && who != WHO_PARENT))
        cr_expect_gt(s1.cow_copies, s0.cow_copies, "%s: no copy-on-write counted", w);
    tinfo(&t, p.h, &ip);
    tinfo(&t, ch.h, &ic);
    cr_expect_eq(ip.pages_shared, ic.pages_shared, "%s: sharers disagree", w);
    if (who == WHO_CHILD && !(mode == COW_SHARE && pg == 4))
        cr_expect_eq(ic.pages_shared, shared0 - nr, "%s: one page per region split, "
                     "pages_shared %u", w, ic.pages_shared);
    /* the parent goes on; the child still reads its own bytes */
    sh_grow_fill(&t, &p, 30, 7);
    sh_verify(&t, &ch, w);
    sh_free(&t, &p);
    sh_verify(&t, &ch, w);
    tinfo(&t, ch.h, &ic);
    cr_expect_eq(ic.pages_shared, 0, "%s: pages still shared after the parent's free", w);
    sh_free(&t, &ch);
    tstats(&t, &s1);
    cr_expect_eq(s1.pages_device_free, s1.pages_device_total, "%s: pages leaked", w);
    tcheck(&t, w);
    tclose(&t);
}

static void cow_matrix(uint32_t nr, enum cow_mode mode)
{
    for (int where = W_FIRST; where <= W_LAST; where++)
        for (int who = WHO_PARENT; who <= WHO_APPEND; who++)
            cow_case(nr, mode, (enum cow_where)where, (enum cow_who)who);
}

Test(cow, fork_1_region) { cow_matrix(1, COW_FORK); }
Test(cow, fork_4_regions) { cow_matrix(4, COW_FORK); }
Test(cow, share_1_region) { cow_matrix(1, COW_SHARE); }
Test(cow, share_4_regions) { cow_matrix(4, COW_SHARE); }

/* share copies the partial last page and zeroes its bytes past n_tokens. */
Test(cow, share_zeroes_past_n_tokens)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 2, 1000, 4, 40, 40);
    topen(&t, &c);
    struct sh src, dst;
    sh_create(&t, &src);
    sh_grow_fill(&t, &src, 20, 1);             /* page 2 = bytes 8192..12287 all cookies */
    sh_create(&t, &dst);
    sh_share(&t, &dst, &src, 9);               /* 9000 bytes: page 2 partial */
    sh_verify(&t, &dst, "after share");
    /* grow dst to the end of page 2 without writing: bytes 9000..12287 read zero */
    sh_grow(&t, &dst, 12);                     /* 12000 bytes */
    for (uint32_t r = 0; r < 2; r++)
        memset(dst.exp[r] + 9000, 0, 12000 - 9000);
    sh_verify(&t, &dst, "zeroed past n_tokens");
    /* src writes its later tokens again; dst unaffected and vice versa */
    sh_fill(&t, &src, 8, 12, 2);
    sh_fill(&t, &dst, 8, 12, 3);
    sh_verify(&t, &src, "src");
    sh_verify(&t, &dst, "dst");
    tcheck(&t, "share zero");
    sh_free(&t, &src);
    sh_free(&t, &dst);
    tclose(&t);
}

Test(cow, share_zero_and_all_tokens)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 2, 1024, 4, 40, 40);          /* 4 tokens per page: whole pages possible */
    topen(&t, &c);
    struct sh src, z, all, whole;
    sh_create(&t, &src);
    sh_grow_fill(&t, &src, 14, 1);             /* 3.5 pages */
    struct kvvm_stats s0, s1;
    tstats(&t, &s0);
    sh_create(&t, &z);
    sh_share(&t, &z, &src, 0);
    struct kvvm_seq_info in;
    tinfo(&t, z.h, &in);
    cr_expect_eq(in.length, 0);
    cr_expect_eq(in.pages_device, 0);
    tstats(&t, &s1);
    cr_expect_eq(s1.pages_device_free, s0.pages_device_free, "share of 0 tokens took pages");
    sh_grow_fill(&t, &z, 6, 2);
    sh_create(&t, &all);
    sh_share(&t, &all, &src, 14);
    tinfo(&t, all.h, &in);
    cr_expect_eq(in.length, 14);
    cr_expect_eq(in.pages_shared, 2 * 3, "share of all: whole pages shared, got %u",
                 in.pages_shared);
    sh_create(&t, &whole);
    tstats(&t, &s0);
    sh_share(&t, &whole, &src, 12);            /* exactly 3 pages: nothing copied */
    tstats(&t, &s1);
    cr_expect_eq(s1.pages_device_free, s0.pages_device_free,
                 "share of whole pages added a physical page");
    sh_fill(&t, &all, 0, 14, 3);
    sh_grow_fill(&t, &whole, 15, 4);
    sh_verify(&t, &src, "src");
    sh_verify(&t, &z, "zero");
    sh_verify(&t, &all, "all");
    sh_verify(&t, &whole, "whole");
    tcheck(&t, "share edge");
    sh_free(&t, &src);
    sh_free(&t, &z);
    sh_free(&t, &all);
    sh_free(&t, &whole);
    tstats(&t, &s1);
    cr_expect_eq(s1.pages_device_free, s1.pages_device_total);
    tclose(&t);
}

/* The classic block-pool scenario of issue 3, step by step. */
Test(cow, classic_block_pool)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 1, 1000, 4, 40, 8);           /* a pool of 8 pages */
    topen(&t, &c);
    struct kvvm_stats st;
    struct kvvm_seq_info ia, ib;
    tstats(&t, &st);
    cr_assert_eq(st.pages_device_total, 8);
    cr_expect_eq(st.pages_device_free, 8);
    struct sh a, b;
    sh_create(&t, &a);
    sh_grow_fill(&t, &a, 10, 1);               /* 10000 bytes: 3 pages */
    tstats(&t, &st);
    cr_expect_eq(st.pages_device_free, 5, "A takes 3: free %lu", (unsigned long)st.pages_device_free);
    sh_fork(&t, &a, &b);
    tstats(&t, &st);
    tinfo(&t, a.h, &ia);
    cr_expect_eq(st.pages_device_free, 5, "B forks A: free %lu", (unsigned long)st.pages_device_free);
    cr_expect_eq(ia.pages_shared, 3, "after fork A shares %u", ia.pages_shared);
    tcheck(&t, "fork");
    write_page(&t, &b, 2, 2, false);           /* B writes its last page */
    tstats(&t, &st);
    tinfo(&t, a.h, &ia);
    tinfo(&t, b.h, &ib);
    cr_expect_eq(st.pages_device_free, 4, "COW: free %lu", (unsigned long)st.pages_device_free);
    cr_expect_eq(ia.pages_shared, 2, "A's last page back to 1 reference: shared %u",
                 ia.pages_shared);
    cr_expect_eq(ib.pages_shared, 2);
    cr_expect_eq(ib.pages_device, 3);
    sh_verify(&t, &a, "A");
    sh_verify(&t, &b, "B");
    tcheck(&t, "cow");
    sh_free(&t, &a);
    tstats(&t, &st);
    tinfo(&t, b.h, &ib);
    cr_expect_eq(st.pages_device_free, 5, "A freed: free %lu", (unsigned long)st.pages_device_free);
    cr_expect_eq(ib.pages_shared, 0);
    sh_verify(&t, &b, "B after A freed");
    sh_free(&t, &b);
    tstats(&t, &st);
    cr_expect_eq(st.pages_device_free, 8, "B freed: free %lu", (unsigned long)st.pages_device_free);
    tcheck(&t, "end");
    tclose(&t);
}

/* A batch growing two sequences that share their partial last page needs one copy, not two:
   the first copies, the second is then the page's only holder (as with two kvvm_seq_grow
   calls). With exactly one free page the batch must succeed. */
Test(cow, grow_batch_of_sharers_needs_one_copy)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 1, 1000, 4, 40, 4);
    topen(&t, &c);
    struct sh a, b;
    sh_create(&t, &a);
    sh_grow_fill(&t, &a, 10, 1);               /* 3 pages, the last partial */
    sh_fork(&t, &a, &b);
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_assert_eq(st.pages_device_free, 1);
    kvvm_seq hs[2] = { a.h, b.h };
    uint64_t lens[2] = { 11, 12 };
    int rc = kvvm_seq_grow_batch(t.kv, hs, lens, 2);
    cr_expect_eq(rc, 0, "grow_batch of two sharers with one free page: %d", rc);
    if (rc == 0) {
        a.len = 11;
        b.len = 12;
        sh_fill(&t, &a, 10, 11, 2);
        sh_fill(&t, &b, 10, 12, 3);
        tstats(&t, &st);
        cr_expect_eq(st.pages_device_free, 0);
    }
    sh_verify(&t, &a, "a");
    sh_verify(&t, &b, "b");
    tcheck(&t, "batch of sharers");
    sh_free(&t, &a);
    sh_free(&t, &b);
    tclose(&t);
}

/* truncate releases whole pages past the new length; a grow after it reuses them. */
Test(cow, truncate_releases_pages)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 2, 1000, 4, 40, 24);
    topen(&t, &c);
    struct sh a, b;
    sh_create(&t, &a);
    sh_grow_fill(&t, &a, 30, 1);
    sh_fork(&t, &a, &b);
    struct kvvm_stats s0, s1;
    tstats(&t, &s0);
    int rc = kvvm_seq_truncate(t.kv, a.h, 5);
    cr_assert_eq(rc, 0);
    a.len = 5;
    tstats(&t, &s1);
    cr_expect_eq(s1.pages_device_free, s0.pages_device_free, "truncating a sharer freed pages");
    rc = kvvm_seq_truncate(t.kv, b.h, 0);
    cr_assert_eq(rc, 0);
    b.len = 0;
    kvvm_sync(t.kv);
    kvvm_step(t.kv);
    tstats(&t, &s1);
    cr_expect_eq(s1.pages_device_free, s1.pages_device_total - 2 * pages_for(&t, 5),
                 "free %lu", (unsigned long)s1.pages_device_free);
    sh_grow_fill(&t, &b, 12, 2);
    sh_grow_fill(&t, &a, 33, 3);
    sh_verify(&t, &a, "a");
    sh_verify(&t, &b, "b");
    tcheck(&t, "truncate");
    sh_free(&t, &a);
    sh_free(&t, &b);
    tclose(&t);
}

/* ================================================================ options */

Test(options, map_ahead_not_counted)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 2, 1000, 4, 40, 32);
    c.map_ahead = 2;
    topen(&t, &c);
    struct sh a;
    sh_create(&t, &a);
    sh_grow_fill(&t, &a, 3, 1);                /* 1 page per region */
    struct kvvm_seq_info in;
    tinfo(&t, a.h, &in);
    cr_expect_eq(in.pages_device, 2, "map-ahead pages counted as the sequence's: %u",
                 in.pages_device);
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_expect_eq(st.pages_device_free, st.pages_device_total - 2,
                 "map-ahead pages not counted as free: %lu", (unsigned long)st.pages_device_free);
    tcheck(&t, "map ahead");
    sh_grow_fill(&t, &a, 11, 2);               /* into the mapped-ahead pages */
    tinfo(&t, a.h, &in);
    cr_expect_eq(in.pages_device, 2 * 3);
    sh_verify(&t, &a, "map ahead");
    struct sh b;                               /* a fork does not inherit map-ahead pages */
    sh_fork(&t, &a, &b);
    tinfo(&t, b.h, &in);
    cr_expect_eq(in.pages_device, 6);
    cr_expect_eq(in.pages_shared, 6);
    sh_grow_fill(&t, &b, 14, 3);
    sh_verify(&t, &a, "a");
    sh_verify(&t, &b, "b");
    tcheck(&t, "map ahead fork");
    sh_free(&t, &a);
    sh_free(&t, &b);
    tstats(&t, &st);
    cr_expect_eq(st.pages_device_free, st.pages_device_total);
    tcheck(&t, "map ahead end");
    tclose(&t);
}

/* With KVVM_F_SCRUB a page reused by another sequence reads zero, never the old owner's. */
Test(options, scrub_zeroes_reused_pages)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 1, 1024, 4, 16, 4);
    c.flags = KVVM_F_SCRUB;
    topen(&t, &c);
    struct sh a, b;
    sh_create(&t, &a);
    sh_grow_fill(&t, &a, 16, 1);               /* all 4 pages */
    sh_free(&t, &a);
    kvvm_sync(t.kv);
    kvvm_step(t.kv);
    kvvm_step(t.kv);
    sh_create(&t, &b);
    sh_grow(&t, &b, 16);                       /* must reuse a's pages */
    sh_verify(&t, &b, "scrub: reused pages read zero");
    sh_fill(&t, &b, 0, 16, 2);
    sh_verify(&t, &b, "scrub: rewritten");
    sh_free(&t, &b);
    tcheck(&t, "scrub");
    tclose(&t);
}

/* Stream mode: copies ordered on the engine's stream, completed by kvvm_sync. */
Test(options, stream_mode)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 2, 1000, 4, 40, 40);
    topen(&t, &c);
    void *stream = NULL;
    cr_assert_eq(kvvm_stream_create(t.kv, &stream), 0);
    cr_assert(stream);
    cr_assert_eq(kvvm_set_stream(t.kv, stream), 0);
    keep_bufs = true;
    struct sh a, b;
    sh_create(&t, &a);
    sh_grow_fill(&t, &a, 18, 1);
    cr_assert_eq(kvvm_step(t.kv), 0);
    sh_fork(&t, &a, &b);
    write_page(&t, &b, 4, 2, false);           /* COW ordered on the stream */
    write_page(&t, &a, 1, 3, true);
    cr_assert_eq(kvvm_step(t.kv), 0);
    sh_grow_fill(&t, &b, 25, 4);
    uint8_t *rd = malloc(25000);
    memset(rd, 0, 25000);
    cr_assert_eq(kvvm_seq_read(t.kv, b.h, 1, 0, rd, 25000), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    cr_expect_eq(memcmp(rd, b.exp[1], 25000), 0, "stream read differs after sync");
    free(rd);
    keep_flush();
    keep_bufs = false;
    cr_assert_eq(kvvm_step(t.kv), 0);
    /* verify synchronously (sh_verify compares right after its read) */
    cr_assert_eq(kvvm_set_stream(t.kv, NULL), 0);
    sh_verify(&t, &a, "stream a");
    sh_verify(&t, &b, "stream b");
    tcheck(&t, "stream");
    cr_assert_eq(kvvm_set_stream(t.kv, stream), 0);
    sh_free(&t, &a);
    sh_free(&t, &b);
    cr_assert_eq(kvvm_step(t.kv), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    cr_assert_eq(kvvm_set_stream(t.kv, NULL), 0);
    cr_assert_eq(kvvm_stream_destroy(t.kv, stream), 0);
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_expect_eq(st.pages_device_free, st.pages_device_total);
    tcheck(&t, "stream end");
    tclose(&t);
}

/* ================================================================ fail-at-call-N sweep */

enum sweep_kind { SW_GROW, SW_FORK, SW_SHARE, SW_PREPARE, SW_WRITE, SW_BATCH };

struct sweep_state {
    struct tctx t;
    struct sh a, b, d;      /* a: the subject; b: a fork of a; d: empty share target */
    kvvm_seq out;
};

/* The same starting state every time: 2 regions; a of 18 tokens (page 4 partial) forked
   into b (every page shared); d empty. */
static void sweep_setup(struct sweep_state *s, enum sweep_kind k)
{
    (void)k;
    struct kvvm_config c;
    tcfg(&c, KB, 2, 1000, 6, 40, 40);
    topen(&s->t, &c);
    sh_create(&s->t, &s->a);
    sh_grow_fill(&s->t, &s->a, 18, 1);
    sh_fork(&s->t, &s->a, &s->b);
    sh_create(&s->t, &s->d);
    kvvm_step(s->t.kv);
    s->out = 0;
}

static int sweep_call(struct sweep_state *s, enum sweep_kind k)
{
    switch (k) {
    case SW_GROW:    return kvvm_seq_grow(s->t.kv, s->a.h, 27);   /* COW + new pages */
    case SW_FORK:    return kvvm_seq_fork(s->t.kv, s->a.h, &s->out);
    case SW_SHARE:   return kvvm_seq_share(s->t.kv, s->d.h, s->a.h, 13);
    case SW_PREPARE: return kvvm_seq_prepare_write(s->t.kv, s->a.h, 0, 18);
    case SW_WRITE: {                                            /* into shared pages 1..3 */
        static uint8_t buf[3 * KB];
        memset(buf, 0x3c, sizeof buf);
        return kvvm_seq_write(s->t.kv, s->b.h, 1, 5000, buf, sizeof buf);
    }
    case SW_BATCH: {                                            /* both sharers, + d */
        kvvm_seq hs[3] = { s->a.h, s->b.h, s->d.h };
        uint64_t lens[3] = { 21, 26, 5 };
        return kvvm_seq_grow_batch(s->t.kv, hs, lens, 3);
    }
    }
    return -EINVAL;
}

static void sweep_teardown(struct sweep_state *s)
{
    sh_release(&s->a);
    sh_release(&s->b);
    sh_release(&s->d);
    tclose(&s->t);
}

static void sweep(enum sweep_kind k, const char *name)
{
    struct sweep_state s;
    enum { MAXT = 4096 };
    static struct emu_trace_entry tr[MAXT];
    sweep_setup(&s, k);
    emu_trace_start();
    int rc = sweep_call(&s, k);
    size_t n = emu_trace_stop(tr, MAXT);
    cr_assert_eq(rc, 0, "%s: the traced call failed: %d", name, rc);
    cr_assert_gt(n, 0, "%s: no driver call traced", name);
    cr_assert_leq(n, MAXT);
    sweep_teardown(&s);

    const kcu_result errs[2] = { KCU_ERROR_OUT_OF_MEMORY, KCU_ERROR_INVALID_VALUE };
    unsigned failed = 0, tolerated = 0, broken = 0;
    soft = true;
    for (size_t i = 0; i < n; i++) {
        for (int e = 0; e < 2; e++) {
            char w[160];
            snprintf(w, sizeof w, "%s: %s #%lu -> %d", name, tr[i].entry, tr[i].nth, errs[e]);
            sweep_setup(&s, k);
            struct sh *ss[3] = { &s.a, &s.b, &s.d };
            struct snap s0;
            snap_take(&s.t, &s0, ss, 3);
            int before = soft_failures;
            cr_assert_eq(emu_fail_arm(tr[i].entry, tr[i].nth, errs[e]), 0, "%s: arm", w);
            rc = sweep_call(&s, k);
            emu_fail_clear();
            snprintf(w + strlen(w), sizeof w - strlen(w), " (returned %d)", rc);
            if (rc == 0) {
                /* the library absorbed the failure (a retry or a fallback): it must have
                   done the whole call correctly */
                tolerated++;
                printf("sweep %s: absorbed %s #%lu -> %d\n", name, tr[i].entry, tr[i].nth,
                       errs[e]);
                if (k == SW_WRITE)
                    memset(s.b.exp[1] + 5000, 0x3c, 3 * KB);
                scheck(&s.t, w);
                sh_verify(&s.t, &s.a, w);
                sh_verify(&s.t, &s.b, w);
            } else {
                failed++;
                UCHK(rc != -EIO, "%s: a non-sticky driver error killed the context", w);
                expect_unchanged(&s.t, &s0, ss, 3, w);
                /* and the same call then succeeds */
                rc = sweep_call(&s, k);
                UCHK(rc == 0, "%s: the call failed again without injection: %d", w, rc);
                if (k == SW_WRITE)
                    memset(s.b.exp[1] + 5000, 0x3c, 3 * KB);
                scheck(&s.t, w);
                sh_verify(&s.t, &s.a, w);
                sh_verify(&s.t, &s.b, w);
            }
            if (soft_failures != before) {
                broken++;
                printf("sweep %s: BROKEN at %s\n", name, w);
            }
            sweep_teardown(&s);
        }
    }
    soft = false;
    printf("sweep %s: %zu injection points x 2 errors: %u failed, %u absorbed, %u of them "
           "broke a rule\n", name, n, failed, tolerated, broken);
    fflush(stdout);
}

Test(sweep, grow) { sweep(SW_GROW, "grow"); }
Test(sweep, fork) { sweep(SW_FORK, "fork"); }
Test(sweep, share) { sweep(SW_SHARE, "share"); }
Test(sweep, prepare_write) { sweep(SW_PREPARE, "prepare_write"); }
Test(sweep, write) { sweep(SW_WRITE, "write"); }

/* Regression (issue 9, item 18): a write into shared pages whose synchronization failed
   undid its copy-on-write (the window mapped the shared pages again) while its copy was
   still queued: the copy then landed in the pages the fork sibling reads. Shown since the
   emulated legacy stream is asynchronous, as on a GPU. The write now waits for the copy
   before undoing: it fails, and neither sequence's bytes change. */
Test(cow, failed_write_sync_does_not_write_the_shared_pages)
{
    struct sweep_state s;
    sweep_setup(&s, SW_WRITE);
    cr_assert_eq(emu_fail_arm("cuStreamSynchronize", 1, KCU_ERROR_INVALID_VALUE), 0);
    int rc = sweep_call(&s, SW_WRITE);
    emu_fail_clear();
    cr_expect_neq(rc, 0, "the write succeeded although its synchronization failed");
    scheck(&s.t, "after the failed write");
    sh_verify(&s.t, &s.a, "the sibling after the failed write");
    if (rc)
        sh_verify(&s.t, &s.b, "the writer after the failed write");
    sweep_teardown(&s);
}
Test(sweep, grow_batch) { sweep(SW_BATCH, "grow_batch"); }

/* ================================================================ threads */

#define NTHR 4
#define THR_OPS 3000

struct thr {
    struct tctx *t;
    int id;
    unsigned seed;
    char err[256];
    unsigned long ops, enomem, enospc;
};

static unsigned rnd(unsigned *s)
{
    *s = *s * 1103515245u + 12345u;
    return *s >> 8;
}

/* A thread's own sequences: create, grow + write, fork, read-verify, truncate, free; other
   threads do the same on the same context at the same time. Failures are reported through
   err (Criterion asserts belong to the main thread). */
static void *thr_main(void *arg)
{
    struct thr *th = arg;
    struct tctx *t = th->t;
    uint64_t bpt = t->cfg.bytes_per_token;
    struct {
        kvvm_seq h;
        uint64_t len;
        uint8_t *exp;       /* region 0 and 1 share lineage; kept per region */
        uint8_t *exp1;
    } s[4];
    memset(s, 0, sizeof s);
    uint8_t *buf = malloc(t->cap);
    uint32_t lin = (uint32_t)th->id << 20;
    for (int i = 0; i < 4; i++) {
        s[i].exp = calloc(1, t->cap);
        s[i].exp1 = calloc(1, t->cap);
    }
    for (int op = 0; op < THR_OPS && !th->err[0]; op++) {
        int i = (int)(rnd(&th->seed) % 4);
        unsigned what = rnd(&th->seed) % 8;
        int rc = 0;
        th->ops++;
        if (!s[i].h) {
            rc = kvvm_seq_create(t->kv, &s[i].h);
            if (rc == -ENOSPC) { th->enospc++; s[i].h = 0; continue; }
            if (rc) { snprintf(th->err, sizeof th->err, "create %d", rc); break; }
            s[i].len = 0;
            continue;
        }
        switch (what) {
        case 0: case 1: case 2: {                           /* grow + write */
            uint64_t nl = s[i].len + 1 + rnd(&th->seed) % 6;
            if (nl > t->cfg.max_tokens)
                nl = t->cfg.max_tokens;
            rc = kvvm_seq_grow(t->kv, s[i].h, nl);
            if (rc == -ENOMEM) { th->enomem++; break; }
            if (rc) { snprintf(th->err, sizeof th->err, "grow %d", rc); break; }
            uint64_t o = s[i].len * bpt, n = (nl - s[i].len) * bpt;
            s[i].len = nl;
            if (!n)
                break;
            lin++;
            for (uint32_t r = 0; r < 2; r++) {
                cookie_fill(buf, lin, r, bpt, o, n);
                rc = kvvm_seq_write(t->kv, s[i].h, r, o, buf, n);
                if (rc == -ENOMEM) {
                    /* the new tokens stay unwritten: drop them again */
                    th->enomem++;
                    rc = kvvm_seq_truncate(t->kv, s[i].h, o / bpt);
                    if (rc)
                        snprintf(th->err, sizeof th->err, "truncate after -ENOMEM %d", rc);
                    s[i].len = o / bpt;
                    break;
                }
                if (rc) { snprintf(th->err, sizeof th->err, "write %d", rc); break; }
                memcpy((r ? s[i].exp1 : s[i].exp) + o, buf, n);
            }
            break;
        }
        case 3: {                                           /* fork into an empty place */
            int j = (i + 1) % 4;
            if (s[j].h)
                break;
            rc = kvvm_seq_fork(t->kv, s[i].h, &s[j].h);
            if (rc == -ENOSPC) { th->enospc++; s[j].h = 0; rc = 0; break; }
            if (rc) { snprintf(th->err, sizeof th->err, "fork %d", rc); s[j].h = 0; break; }
            s[j].len = s[i].len;
            memcpy(s[j].exp, s[i].exp, t->cap);
            memcpy(s[j].exp1, s[i].exp1, t->cap);
            break;
        }
        case 4: case 5: {                                   /* read-verify */
            if (!s[i].len)
                break;
            for (uint32_t r = 0; r < 2; r++) {
                rc = kvvm_seq_read(t->kv, s[i].h, r, 0, buf, s[i].len * bpt);
                if (rc) { snprintf(th->err, sizeof th->err, "read %d", rc); break; }
                if (memcmp(buf, r ? s[i].exp1 : s[i].exp, s[i].len * bpt)) {
                    snprintf(th->err, sizeof th->err, "thread %d seq %d region %u: cookies "
                             "differ", th->id, i, r);
                    break;
                }
            }
            break;
        }
        case 6: {                                           /* truncate */
            uint64_t nl = s[i].len ? rnd(&th->seed) % (s[i].len + 1) : 0;
            rc = kvvm_seq_truncate(t->kv, s[i].h, nl);
            if (rc) { snprintf(th->err, sizeof th->err, "truncate %d", rc); break; }
            s[i].len = nl;
            break;
        }
        case 7:                                             /* free */
            rc = kvvm_seq_free(t->kv, s[i].h);
            if (rc) { snprintf(th->err, sizeof th->err, "free %d", rc); break; }
            s[i].h = 0;
            s[i].len = 0;
            break;
        }
        if (op % 64 == 0)
            kvvm_step(t->kv);
    }
    for (int i = 0; i < 4; i++) {
        if (s[i].h && !th->err[0]) {
            int rc = kvvm_seq_free(t->kv, s[i].h);
            if (rc)
                snprintf(th->err, sizeof th->err, "final free %d", rc);
        }
        free(s[i].exp);
        free(s[i].exp1);
    }
    free(buf);
    return NULL;
}

Test(threads, four_threads_at_once)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 2, 1000, 14, 40, 96);
    topen(&t, &c);
    pthread_t tid[NTHR];
    struct thr th[NTHR];
    for (int i = 0; i < NTHR; i++) {
        memset(&th[i], 0, sizeof th[i]);
        th[i].t = &t;
        th[i].id = i + 1;
        th[i].seed = 1234u + 77u * (unsigned)i;
        cr_assert_eq(pthread_create(&tid[i], NULL, thr_main, &th[i]), 0);
    }
    unsigned long ops = 0, enomem = 0, enospc = 0;
    for (int i = 0; i < NTHR; i++) {
        pthread_join(tid[i], NULL);
        cr_expect_eq(th[i].err[0], 0, "thread %d: %s", i, th[i].err);
        ops += th[i].ops;
        enomem += th[i].enomem;
        enospc += th[i].enospc;
    }
    printf("threads: %lu ops, %lu -ENOMEM, %lu -ENOSPC\n", ops, enomem, enospc);
    kvvm_sync(t.kv);
    kvvm_step(t.kv);
    tcheck(&t, "after threads");
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_expect_eq(st.pages_device_free, st.pages_device_total, "pages leaked: %lu of %lu free",
                 (unsigned long)st.pages_device_free, (unsigned long)st.pages_device_total);
    tclose(&t);
}

/* Stream mode: the CPU does not wait for the engine stream (docs/api.md "Ordering"). With the
   engine stream paused, a write from pinned memory and a read into pinned memory return at
   once without their bytes moved; both arrive, in stream order, once the stream runs.
   Regression: write and read used to synchronize the whole engine stream, which would hang
   here. (Pageable buffers: pageable_buffers/stream_mode_waits_for_their_copy.) */
Test(options, stream_mode_cpu_does_not_wait)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 1, 1000, 4, 40, 40);
    topen(&t, &c);
    void *stream = NULL;
    cr_assert_eq(kvvm_stream_create(t.kv, &stream), 0);
    cr_assert_eq(kvvm_set_stream(t.kv, stream), 0);
    kvvm_seq s;
    cr_assert_eq(kvvm_seq_create(t.kv, &s), 0);
    cr_assert_eq(kvvm_seq_grow(t.kv, s, 8), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    cr_assert_eq(emu_stream_set_paused((kcu_stream)stream, 1), 0);
    const struct kcu_api *api = emu_api();
    char *src, *pin;
    const size_t n = 64;
    emu_ctx_on(t.ord);
    cr_assert_eq(api->cuMemAllocHost((void **)&src, n), KCU_SUCCESS);
    cr_assert_eq(api->cuMemAllocHost((void **)&pin, n), KCU_SUCCESS);
    memset(src, 'A', n);
    cr_assert_eq(kvvm_seq_write(t.kv, s, 0, 100, src, n), 0);
    memset(pin, 0, n);
    cr_assert_eq(kvvm_seq_read(t.kv, s, 0, 100, pin, n), 0);
    cr_expect_eq(pin[0], 0, "the read ran while the engine stream was paused");
    cr_assert_eq(emu_stream_set_paused((kcu_stream)stream, 0), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(pin[i], 'A', "byte %zu: %c (stream order broken)", i, pin[i]);
    cr_assert_eq(api->cuMemFreeHost(pin), KCU_SUCCESS);
    cr_assert_eq(api->cuMemFreeHost(src), KCU_SUCCESS);
    emu_ctx_off(t.ord);
    cr_assert_eq(kvvm_seq_free(t.kv, s), 0);
    cr_assert_eq(kvvm_set_stream(t.kv, NULL), 0);
    cr_assert_eq(kvvm_stream_destroy(t.kv, stream), 0);
    tcheck(&t, "stream no wait");
    tclose(&t);
}

/* ================================================================ hardening */

/* Opens a stream-mode context (the engine stream in *stream). */
static void topen_stream(struct tctx *t, const struct kvvm_config *c, void **stream)
{
    topen(t, c);
    cr_assert_eq(kvvm_stream_create(t->kv, stream), 0);
    cr_assert_eq(kvvm_set_stream(t->kv, *stream), 0);
}

/* Ends a stream-mode test: back to synchronous mode, the stream destroyed, context closed. */
static void tclose_stream(struct tctx *t, void *stream)
{
    cr_assert_eq(kvvm_set_stream(t->kv, NULL), 0);
    cr_assert_eq(kvvm_stream_destroy(t->kv, stream), 0);
    tclose(t);
}

/* KVVM_F_SCRUB + map-ahead + stream mode, engine stream paused: a grow's scrub of frames
   that then leave the sequence (free, truncate, map-ahead stolen by another grow) must not
   reach an unmapped address once the stream runs. Regression: map-ahead frames were
   scrubbed on the engine stream and unmapped at once when dropped, so the queued memset
   hit an unmapped range (a sticky ILLEGAL_ADDRESS: the context died). */
Test(harden, scrub_map_ahead_stream)
{
    struct kvvm_config c;
    struct tctx t;
    void *st;
    tcfg(&c, KB, 2, 1024, 4, 64, 24);     /* 4 tokens a page */
    c.flags = KVVM_F_SCRUB;
    c.map_ahead = 2;
    topen_stream(&t, &c, &st);
    kvvm_seq a, b, d;
    cr_assert_eq(kvvm_seq_create(t.kv, &a), 0);
    cr_assert_eq(kvvm_seq_create(t.kv, &b), 0);
    cr_assert_eq(kvvm_seq_create(t.kv, &d), 0);
    cr_assert_eq(emu_stream_set_paused((kcu_stream)st, 1), 0);
    cr_assert_eq(kvvm_seq_grow(t.kv, a, 9), 0);      /* 3 pages + map-ahead */
    cr_assert_eq(kvvm_seq_free(t.kv, a), 0);         /* map-ahead dropped at once */
    cr_assert_eq(kvvm_seq_grow(t.kv, b, 13), 0);     /* 4 pages + map-ahead */
    cr_assert_eq(kvvm_seq_truncate(t.kv, b, 4), 0);  /* map-ahead dropped */
    cr_assert_eq(kvvm_seq_grow(t.kv, d, 4), 0);
    /* takes every free frame: steals the others' map-ahead */
    struct kvvm_stats s0;
    tstats(&t, &s0);
    uint64_t all = (s0.pages_device_free / 2) * 4 + 4;
    if (all > 64)
        all = 64;
    cr_assert_eq(kvvm_seq_grow(t.kv, d, all), 0);
    cr_assert_eq(emu_stream_set_paused((kcu_stream)st, 0), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0, "the context died: a scrub reached an unmapped page");
    cr_assert_eq(kvvm_step(t.kv), 0);
    tcheck(&t, "scrub map-ahead");
    /* the new pages read zero */
    uint8_t buf[256];
    memset(buf, 0xee, sizeof buf);
    cr_assert_eq(kvvm_seq_read(t.kv, d, 1, 0, buf, sizeof buf), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    for (size_t i = 0; i < sizeof buf; i++)
        cr_assert_eq(buf[i], 0, "byte %zu not scrubbed", i);
    cr_assert_eq(kvvm_seq_free(t.kv, b), 0);
    cr_assert_eq(kvvm_seq_free(t.kv, d), 0);
    tclose_stream(&t, st);
}

/* While the engine stream captures a CUDA graph, every call that would enqueue onto, record
   on or synchronize it returns -EBUSY and changes nothing; all works once capture ends.
   Regression: only swap_in/swap_out/prefetch/wait_stream/set_stream(new) refused. */
Test(harden, capturing_engine_stream_refused)
{
    struct kvvm_config c;
    struct tctx t;
    void *st;
    tcfg(&c, KB, 2, 1024, 8, 64, 64);
    c.map_ahead = 1;
    topen_stream(&t, &c, &st);
    keep_bufs = true;
    struct sh a, d;
    sh_create(&t, &a);
    sh_create(&t, &d);
    sh_grow_fill(&t, &a, 9, 1);
    cr_assert_eq(kvvm_step(t.kv), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    struct sh *ss[] = { &a, &d };
    struct snap s0;
    snap_take(&t, &s0, ss, 2);
    uint8_t buf[64] = { 1 };
    kvvm_seq child = 0, sq = a.h;
    uint64_t len = 20;
    cr_assert_eq(emu_stream_set_capturing((kcu_stream)st, 1), 0);
    struct { const char *what; int rc; } r[] = {
        { "grow", kvvm_seq_grow(t.kv, a.h, 20) },
        { "grow_batch", kvvm_seq_grow_batch(t.kv, &sq, &len, 1) },
        { "truncate", kvvm_seq_truncate(t.kv, a.h, 2) },
        { "free", kvvm_seq_free(t.kv, a.h) },
        { "fork", kvvm_seq_fork(t.kv, a.h, &child) },
        { "share", kvvm_seq_share(t.kv, d.h, a.h, 6) },
        { "prepare_write", kvvm_seq_prepare_write(t.kv, a.h, 0, 4) },
        { "write", kvvm_seq_write(t.kv, a.h, 0, 0, buf, sizeof buf) },
        { "read", kvvm_seq_read(t.kv, a.h, 0, 0, buf, sizeof buf) },
        { "step", kvvm_step(t.kv) },
        { "sync", kvvm_sync(t.kv) },
        { "set_stream(NULL)", kvvm_set_stream(t.kv, NULL) },
        { "swap_out", kvvm_seq_swap_out(t.kv, a.h) },
    };
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
        cr_expect_eq(r[i].rc, -EBUSY, "%s while capturing: %d, not -EBUSY", r[i].what,
                     r[i].rc);
    cr_assert_eq(child, 0, "fork made a child while capturing");
    struct kvvm_seq_info in;
    tinfo(&t, a.h, &in);                     /* the non-enqueuing calls still work */
    cr_assert_eq(in.length, 9);
    tcheck(&t, "capturing");
    cr_assert_eq(emu_stream_set_capturing((kcu_stream)st, 0), 0);
    expect_unchanged(&t, &s0, ss, 2, "after refused calls");
    /* everything works again */
    sh_grow_fill(&t, &a, 20, 2);
    sh_share(&t, &d, &a, 6);
    struct sh ch;
    sh_fork(&t, &a, &ch);
    cr_assert_eq(kvvm_seq_prepare_write(t.kv, ch.h, 0, 4), 0);
    cr_assert_eq(kvvm_step(t.kv), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    sh_verify(&t, &a, "a after capture");
    sh_verify(&t, &d, "d after capture");
    sh_verify(&t, &ch, "child after capture");
    sh_free(&t, &ch);
    sh_free(&t, &d);
    sh_free(&t, &a);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    tcheck(&t, "end");
    keep_flush();
    keep_bufs = false;
    tclose_stream(&t, st);
}

/* Every call leaves the caller's current context as it found it (here: none), so the
   engine's thread never finds libkvvm's context current afterwards. */
Test(harden, caller_context_restored)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 2, 1024, 4, 64, 32);
    topen(&t, &c);
    const struct kcu_api *api = emu_api();
    cr_assert_eq(api->cuCtxSetCurrent(NULL), KCU_SUCCESS);
    kvvm_seq s;
    cr_assert_eq(kvvm_seq_create(t.kv, &s), 0);
    cr_assert_eq(kvvm_seq_grow(t.kv, s, 9), 0);
    uint8_t buf[32] = { 7 };
    cr_assert_eq(kvvm_seq_write(t.kv, s, 1, 0, buf, sizeof buf), 0);
    cr_assert_eq(kvvm_step(t.kv), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    kcu_context cur = (kcu_context)1;
    cr_assert_eq(api->cuCtxGetCurrent(&cur), KCU_SUCCESS);
    cr_assert_null(cur, "a kvvm call left its context current");
    /* another context current: it stays current */
    struct tctx t2;
    topen(&t2, &c);
    kvvm_seq s2;
    cr_assert_eq(kvvm_seq_create(t2.kv, &s2), 0);
    cr_assert_eq(kvvm_seq_grow(t2.kv, s2, 5), 0);
    kcu_device dev;
    kcu_context other;
    cr_assert_eq(api->cuDeviceGet(&dev, t2.ord), KCU_SUCCESS);
    cr_assert_eq(api->cuDevicePrimaryCtxRetain(&other, dev), KCU_SUCCESS);
    cr_assert_eq(api->cuCtxSetCurrent(other), KCU_SUCCESS);
    cr_assert_eq(kvvm_seq_read(t.kv, s, 1, 0, buf, sizeof buf), 0);
    cr_assert_eq(buf[0], 7);
    cr_assert_eq(kvvm_seq_free(t.kv, s), 0);
    cr_assert_eq(api->cuCtxGetCurrent(&cur), KCU_SUCCESS);
    cr_assert_eq(cur, other, "a kvvm call replaced the caller's context");
    cr_assert_eq(api->cuCtxSetCurrent(NULL), KCU_SUCCESS);
    cr_assert_eq(api->cuDevicePrimaryCtxRelease(dev), KCU_SUCCESS);
    cr_assert_eq(kvvm_seq_free(t2.kv, s2), 0);
    tclose(&t2);
    tclose(&t);
}

/* kvvm_stream_destroy destroys only streams kvvm_stream_create made on this context, never
   the engine stream set now. Regression: it destroyed any stream, the engine's own too. */
Test(harden, stream_destroy_only_own)
{
    struct kvvm_config c;
    struct tctx t, t2;
    tcfg(&c, KB, 2, 1024, 4, 64, 32);
    topen(&t, &c);
    topen(&t2, &c);
    void *mine, *theirs;
    cr_assert_eq(kvvm_stream_create(t.kv, &mine), 0);
    cr_assert_eq(kvvm_stream_create(t2.kv, &theirs), 0);
    /* the engine's own stream on the same device */
    const struct kcu_api *api = emu_api();
    kcu_device dev;
    kcu_context ctx;
    kcu_stream eng;
    cr_assert_eq(api->cuDeviceGet(&dev, t.ord), KCU_SUCCESS);
    cr_assert_eq(api->cuDevicePrimaryCtxRetain(&ctx, dev), KCU_SUCCESS);
    cr_assert_eq(api->cuCtxSetCurrent(ctx), KCU_SUCCESS);
    cr_assert_eq(api->cuStreamCreate(&eng, 0), KCU_SUCCESS);
    cr_assert_eq(kvvm_stream_destroy(t.kv, eng), -EINVAL);
    cr_assert_eq(kvvm_stream_destroy(t.kv, theirs), -EINVAL, "another context's stream");
    cr_assert_eq(api->cuStreamQuery(eng), KCU_SUCCESS, "the engine's stream was destroyed");
    /* the engine stream set now */
    cr_assert_eq(kvvm_set_stream(t.kv, eng), 0);
    kvvm_seq s;
    cr_assert_eq(kvvm_seq_create(t.kv, &s), 0);
    cr_assert_eq(kvvm_seq_grow(t.kv, s, 9), 0);
    cr_assert_eq(kvvm_stream_destroy(t.kv, eng), -EINVAL);
    cr_assert_eq(kvvm_set_stream(t.kv, mine), 0);
    cr_assert_eq(kvvm_stream_destroy(t.kv, mine), -EBUSY, "the engine stream set now");
    cr_assert_eq(kvvm_step(t.kv), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    cr_assert_eq(kvvm_set_stream(t.kv, NULL), 0);
    cr_assert_eq(kvvm_stream_destroy(t.kv, mine), 0);
    cr_assert_eq(kvvm_stream_destroy(t.kv, mine), -EINVAL, "destroyed twice");
    cr_assert_eq(kvvm_stream_destroy(t2.kv, theirs), 0);
    cr_assert_eq(kvvm_seq_free(t.kv, s), 0);
    cr_assert_eq(api->cuCtxSetCurrent(ctx), KCU_SUCCESS);
    cr_assert_eq(api->cuStreamDestroy(eng), KCU_SUCCESS);
    cr_assert_eq(api->cuCtxSetCurrent(NULL), KCU_SUCCESS);
    cr_assert_eq(api->cuDevicePrimaryCtxRelease(dev), KCU_SUCCESS);
    tclose(&t2);
    tclose(&t);
}

static unsigned long count_entry(const struct emu_trace_entry *e, size_t n, const char *name)
{
    unsigned long k = 0;
    for (size_t i = 0; i < n; i++)
        k += strcmp(e[i].entry, name) == 0;
    return k;
}

/* Synchronous mode: a write or read of a sequence with no device work since the last
   synchronization does not synchronize the device again; one used in this iteration
   does. Regression: every write and read called cuCtxSynchronize. */
Test(harden, sync_mode_quiet_io_skips_device_sync)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 2, 1024, 8, 64, 64);
    topen(&t, &c);
    struct sh s[4];
    for (int i = 0; i < 4; i++) {
        sh_create(&t, &s[i]);
        sh_grow_fill(&t, &s[i], 10, (uint32_t)i + 1);
    }
    cr_assert_eq(kvvm_step(t.kv), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    static struct emu_trace_entry tr[4096];
    uint8_t buf[512];
    emu_trace_start();
    for (int i = 0; i < 4; i++) {
        memset(buf, 0x40 + i, sizeof buf);
        cr_assert_eq(kvvm_seq_write(t.kv, s[i].h, 1, 100, buf, sizeof buf), 0);
        memcpy(s[i].exp[1] + 100, buf, sizeof buf);
    }
    size_t n = emu_trace_stop(tr, 4096);
    cr_assert_eq(count_entry(tr, n, "cuCtxSynchronize"), 0,
                 "quiet sequences: %lu device syncs", count_entry(tr, n, "cuCtxSynchronize"));
    /* s[0] was used in this iteration (by the write): the engine may be using it now */
    emu_trace_start();
    cr_assert_eq(kvvm_seq_read(t.kv, s[0].h, 1, 100, buf, sizeof buf), 0);
    n = emu_trace_stop(tr, 4096);
    cr_assert_geq(count_entry(tr, n, "cuCtxSynchronize"), 1, "a used sequence must sync");
    /* a fork's pages are shared with a sequence that may be in use: sync */
    struct sh ch;
    sh_fork(&t, &s[1], &ch);
    emu_trace_start();
    cr_assert_eq(kvvm_seq_read(t.kv, ch.h, 0, 0, buf, sizeof buf), 0);
    n = emu_trace_stop(tr, 4096);
    cr_assert_geq(count_entry(tr, n, "cuCtxSynchronize"), 1, "shared pages must sync");
    for (int i = 0; i < 4; i++)
        sh_verify(&t, &s[i], "quiet io");
    sh_verify(&t, &ch, "child");
    sh_free(&t, &ch);
    for (int i = 0; i < 4; i++)
        sh_free(&t, &s[i]);
    tcheck(&t, "end");
    tclose(&t);
}

/* Stream mode: the host copy of a non-resident source's partial page (share_host_copy) runs
   on the engine stream and waits for it only. A blocking stream of the engine's, paused,
   must not hold it up. Regression: it copied on the legacy stream, which waits for every
   blocking stream of the context (here: forever). */
Test(harden, share_host_copy_on_engine_stream, .timeout = 20)
{
    struct kvvm_config c;
    struct tctx t;
    void *st;
    tcfg(&c, KB, 2, 1024, 8, 64, 64);
    c.host_budget = 64 * KB;
    topen_stream(&t, &c, &st);
    keep_bufs = true;
    struct sh a, b, d;
    sh_create(&t, &a);
    sh_grow_fill(&t, &a, 6, 3);              /* 2 pages, the second partial */
    sh_fork(&t, &a, &b);                     /* b keeps a's pages on the device */
    cr_assert_eq(kvvm_step(t.kv), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    cr_assert_eq(kvvm_seq_swap_out(t.kv, a.h), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    struct kvvm_seq_info in;
    tinfo(&t, a.h, &in);
    cr_assert_eq(in.resident, 0);
    cr_assert_gt(in.pages_device, 0, "a's pages stay on the device (b holds them)");
    const struct kcu_api *api = emu_api();
    kcu_device dev;
    kcu_context ctx;
    kcu_stream other;
    cr_assert_eq(api->cuDeviceGet(&dev, t.ord), KCU_SUCCESS);
    cr_assert_eq(api->cuDevicePrimaryCtxRetain(&ctx, dev), KCU_SUCCESS);
    cr_assert_eq(api->cuCtxSetCurrent(ctx), KCU_SUCCESS);
    cr_assert_eq(api->cuStreamCreate(&other, 0), KCU_SUCCESS);   /* blocking */
    cr_assert_eq(emu_stream_set_paused(other, 1), 0);
    kcu_event ev;                            /* work queued on it, held by the pause */
    cr_assert_eq(api->cuEventCreate(&ev, 0), KCU_SUCCESS);
    cr_assert_eq(api->cuEventRecord(ev, other), KCU_SUCCESS);
    cr_assert_eq(api->cuStreamQuery(other), KCU_ERROR_NOT_READY);
    sh_create(&t, &d);
    sh_share(&t, &d, &a, 5);                 /* partial page copied through the host */
    cr_assert_eq(emu_stream_set_paused(other, 0), 0);
    cr_assert_eq(api->cuStreamSynchronize(other), KCU_SUCCESS);
    cr_assert_eq(api->cuEventDestroy(ev), KCU_SUCCESS);
    cr_assert_eq(api->cuStreamDestroy(other), KCU_SUCCESS);
    cr_assert_eq(api->cuCtxSetCurrent(NULL), KCU_SUCCESS);
    cr_assert_eq(api->cuDevicePrimaryCtxRelease(dev), KCU_SUCCESS);
    cr_assert_eq(kvvm_seq_swap_in(t.kv, d.h), 0);
    cr_assert_eq(kvvm_seq_swap_in(t.kv, a.h), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    sh_verify(&t, &d, "shared from a non-resident source");
    sh_verify(&t, &a, "source");
    sh_verify(&t, &b, "fork");
    sh_free(&t, &d);
    sh_free(&t, &b);
    sh_free(&t, &a);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    tcheck(&t, "end");
    keep_flush();
    keep_bufs = false;
    tclose_stream(&t, st);
}

struct infocap { int n; char msg[512]; };
static void infocap_fn(int level, const char *msg, void *arg)
{
    struct infocap *c = arg;
    if (level == KVVM_LOG_INFO && strstr(msg, "even at length 1")) {
        c->n++;
        snprintf(c->msg, sizeof c->msg, "%s", msg);
    }
}

/* kvvm_open says how many sequences fit at length 1 when max_seqs x n_regions pages exceed
   the device budget (a sizing hint; on a GPU the page is the 2 MiB granule). */
Test(harden, open_sizing_hint)
{
    struct kvvm_config c;
    struct tctx t;
    struct infocap ic = { 0 };
    tcfg(&c, KB, 2, 1024, 8, 64, 8);        /* 8 x 2 pages > 8: 4 fit */
    kvvm_set_log(infocap_fn, &ic, KVVM_LOG_INFO);
    topen(&t, &c);
    kvvm_set_log(NULL, NULL, KVVM_LOG_WARN);
    tclose(&t);
    cr_assert_eq(ic.n, 1, "no sizing hint logged");
    cr_assert(strstr(ic.msg, "4 of max_seqs 8"), "hint: %s", ic.msg);
    ic.n = 0;
    tcfg(&c, KB, 2, 1024, 4, 64, 8);        /* 4 x 2 = 8: all fit, no hint */
    kvvm_set_log(infocap_fn, &ic, KVVM_LOG_INFO);
    topen(&t, &c);
    kvvm_set_log(NULL, NULL, KVVM_LOG_WARN);
    tclose(&t);
    cr_assert_eq(ic.n, 0, "a hint although every sequence fits: %s", ic.msg);
}

/* As scrub_map_ahead_stream, the map-ahead frames taken by another sequence's grow (stolen:
   unmapped from the first sequence's window at once) while the engine stream is paused. */
Test(harden, scrub_map_ahead_stolen)
{
    struct kvvm_config c;
    struct tctx t;
    void *st;
    tcfg(&c, KB, 2, 1024, 4, 64, 24);       /* 4 tokens a page, 12 pages per region */
    c.flags = KVVM_F_SCRUB;
    c.map_ahead = 2;
    topen_stream(&t, &c, &st);
    kvvm_seq a, b, d;
    cr_assert_eq(kvvm_seq_create(t.kv, &a), 0);
    cr_assert_eq(kvvm_seq_create(t.kv, &b), 0);
    cr_assert_eq(kvvm_seq_create(t.kv, &d), 0);
    cr_assert_eq(emu_stream_set_paused((kcu_stream)st, 1), 0);
    cr_assert_eq(kvvm_seq_grow(t.kv, a, 5), 0);      /* 2 pages + 2 ahead */
    cr_assert_eq(kvvm_seq_grow(t.kv, b, 5), 0);      /* 2 pages + 2 ahead */
    struct kvvm_stats s0;
    tstats(&t, &s0);
    cr_assert_eq(s0.pages_device_free, 16, "free %lu", (unsigned long)s0.pages_device_free);
    /* d takes the 8 free per region: a's and b's map-ahead among them */
    cr_assert_eq(kvvm_seq_grow(t.kv, d, 32), 0);
    cr_assert_eq(emu_stream_set_paused((kcu_stream)st, 0), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0, "the context died: a scrub reached an unmapped page");
    cr_assert_eq(kvvm_step(t.kv), 0);
    tcheck(&t, "scrub stolen map-ahead");
    uint8_t buf[KB];
    for (uint32_t p = 0; p < 8; p++) {
        memset(buf, 0xee, sizeof buf);
        cr_assert_eq(kvvm_seq_read(t.kv, d, 1, (uint64_t)p * KB, buf, sizeof buf), 0);
        cr_assert_eq(kvvm_sync(t.kv), 0);
        for (size_t i = 0; i < sizeof buf; i++)
            cr_assert_eq(buf[i], 0, "page %u byte %zu not scrubbed", p, i);
    }
    cr_assert_eq(kvvm_seq_free(t.kv, a), 0);
    cr_assert_eq(kvvm_seq_free(t.kv, b), 0);
    cr_assert_eq(kvvm_seq_free(t.kv, d), 0);
    tclose_stream(&t, st);
}

static void *unpause_later(void *arg)
{
    usleep(200 * 1000);
    emu_stream_set_paused((kcu_stream)arg, 0);
    return NULL;
}

/* A grow that fails after region 0's pages were mapped and their scrub enqueued (region 1's
   map refused), the engine stream paused and resumed 200 ms later by another thread: the
   undo waits for the engine before unmapping them, so the context stays alive and a retry
   works. Regression: the undo unmapped at once; the memset then hit an unmapped range. */
Test(harden, scrub_grow_undo_stream)
{
    struct kvvm_config c;
    struct tctx t;
    void *st;
    tcfg(&c, KB, 2, 1024, 4, 64, 24);
    c.flags = KVVM_F_SCRUB;
    topen_stream(&t, &c, &st);
    kvvm_seq a;
    cr_assert_eq(kvvm_seq_create(t.kv, &a), 0);
    for (unsigned long nth = 1; nth <= 4; nth++) {
        kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);
        cr_assert_eq(emu_fail_arm("cuMemMap", nth, KCU_ERROR_OUT_OF_MEMORY), 0);
        cr_assert_eq(emu_stream_set_paused((kcu_stream)st, 1), 0);
        pthread_t th;
        cr_assert_eq(pthread_create(&th, NULL, unpause_later, st), 0);
        int rc = kvvm_seq_grow(t.kv, a, 8);             /* 2 pages per region */
        pthread_join(th, NULL);
        emu_fail_clear();
        kvvm_set_log(NULL, NULL, KVVM_LOG_WARN);
        cr_assert_eq(rc, -ENOMEM, "map %lu refused: %d", nth, rc);
        cr_assert_eq(kvvm_sync(t.kv), 0, "map %lu refused: the context died", nth);
        tcheck(&t, "after a failed grow");
    }
    cr_assert_eq(kvvm_seq_grow(t.kv, a, 8), 0);
    uint8_t buf[KB];
    memset(buf, 0xee, sizeof buf);
    cr_assert_eq(kvvm_seq_read(t.kv, a, 1, KB, buf, sizeof buf), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    for (size_t i = 0; i < sizeof buf; i++)
        cr_assert_eq(buf[i], 0, "byte %zu not scrubbed", i);
    cr_assert_eq(kvvm_seq_free(t.kv, a), 0);
    tclose_stream(&t, st);
}

/* A stream of another device's context cannot be the engine stream: our events and copies
   could not be ordered on it (a GPU answers INVALID_HANDLE later, leaving releases stuck). */
Test(options, foreign_stream_refused)
{
    struct kvvm_config c;
    struct tctx a, b;
    tcfg(&c, KB, 1, 1000, 4, 40, 40);
    topen(&a, &c);
    topen(&b, &c);
    void *sb = NULL, *sa = NULL;
    cr_assert_eq(kvvm_stream_create(b.kv, &sb), 0);
    cr_assert_eq(kvvm_stream_create(a.kv, &sa), 0);
    kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);
    cr_expect_eq(kvvm_set_stream(a.kv, sb), -EINVAL, "another device's stream was accepted");
    cr_expect_eq(kvvm_set_stream(a.kv, (void *)0x1234), -EINVAL, "a forged stream was accepted");
    cr_expect_eq(kvvm_set_stream(a.kv, sa), 0, "its own stream was refused");
    cr_expect_eq(kvvm_set_stream(a.kv, (void *)KCU_STREAM_LEGACY), 0, "the legacy handle");
    cr_expect_eq(kvvm_set_stream(a.kv, NULL), 0);
    cr_assert_eq(kvvm_stream_destroy(a.kv, sa), 0);
    cr_assert_eq(kvvm_stream_destroy(b.kv, sb), 0);
    tcheck(&a, "foreign stream");
    tclose(&b);
    tclose(&a);
}

/* ================================================================ issue 9: GPU readiness */

/* Regression (issue 9, item 11): with map_ahead = 0 every grow computed s->ahead + 0 on a
   NULL array (pg_ahead), undefined behaviour that clang's UBSan (pointer-overflow) reports
   on the first grow. Fails only in a UBSan build (scripts/test.sh's clang step). */
Test(map_ahead_zero, grow_has_no_null_arithmetic)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 2, 1000, 4, 40, 40);
    c.map_ahead = 0;
    topen(&t, &c);
    struct sh s;
    sh_create(&t, &s);
    sh_grow_fill(&t, &s, 9, 1);
    cr_assert_eq(kvvm_seq_truncate(t.kv, s.h, 3), 0);
    s.len = 3;
    sh_grow_fill(&t, &s, 12, 2);
    sh_verify(&t, &s, "map_ahead 0");
    tcheck(&t, "map_ahead 0");
    sh_free(&t, &s);
    tclose(&t);
}

/* Regression (issue 9, item 14): CU_STREAM_PER_THREAD names each calling thread's own
   stream; cuStreamGetCtx accepts it, so kvvm_set_stream took it. -EINVAL now. */
Test(per_thread_stream, rejected_as_engine_stream)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 1, 1000, 4, 40, 40);
    topen(&t, &c);
    kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);
    cr_expect_eq(kvvm_set_stream(t.kv, (void *)(uintptr_t)0x2), -EINVAL);
    cr_expect_eq(kvvm_set_stream(t.kv, (void *)(uintptr_t)0x1), 0, "CU_STREAM_LEGACY");
    cr_expect_eq(kvvm_set_stream(t.kv, NULL), 0);
    tclose(&t);
}

static void *sync_thread(void *arg)
{
    struct tctx *t = arg;
    return (void *)(intptr_t)kvvm_sync(t->kv);
}

/* Regression (issue 9, item 13): stream-mode kvvm_sync and kvvm_set_stream called
   cuCtxSynchronize, which waits for every stream of the context: here another stream of the
   engine (an NCCL stream, say) has work that cannot run (paused), and sync hung. Now they
   synchronize the engine stream and the library's own only; the test times out before. */
Test(stream_sync, does_not_wait_for_other_streams, .timeout = 30)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 1, 1000, 4, 40, 40);
    c.host_budget = 8 * KB;
    void *st, *other, *next;
    topen_stream(&t, &c, &st);
    cr_assert_eq(kvvm_stream_create(t.kv, &other), 0);
    cr_assert_eq(kvvm_stream_create(t.kv, &next), 0);
    struct sh s;
    sh_create(&t, &s);
    sh_grow_fill(&t, &s, 9, 1);
    cr_assert_eq(kvvm_step(t.kv), 0);
    cr_assert_eq(kvvm_seq_swap_out(t.kv, s.h), 0);     /* copies on the library's stream */
    const struct kcu_api *a = emu_api();
    kcu_event ev;
    emu_ctx_on(t.ord);
    cr_assert_eq(a->cuEventCreate(&ev, KCU_EVENT_DISABLE_TIMING), KCU_SUCCESS);
    cr_assert_eq(emu_stream_set_paused((kcu_stream)other, 1), 0);
    cr_assert_eq(a->cuEventRecord(ev, (kcu_stream)other), KCU_SUCCESS);   /* stuck work */
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, sync_thread, &t), 0);
    void *ret;
    pthread_join(th, &ret);
    cr_expect_eq((intptr_t)ret, 0, "kvvm_sync: %d", (int)(intptr_t)ret);
    struct kvvm_stats stt;
    tstats(&t, &stt);
    cr_expect_eq(stt.pages_inflight, 0, "kvvm_sync returned with copies in flight");
    cr_expect_eq(kvvm_set_stream(t.kv, next), 0);
    cr_expect_eq(kvvm_set_stream(t.kv, st), 0);
    cr_assert_eq(emu_stream_set_paused((kcu_stream)other, 0), 0);
    cr_assert_eq(a->cuEventSynchronize(ev), KCU_SUCCESS);
    cr_assert_eq(a->cuEventDestroy(ev), KCU_SUCCESS);
    emu_ctx_off(t.ord);
    sh_verify(&t, &s, "after swap-in");
    sh_free(&t, &s);
    cr_assert_eq(kvvm_stream_destroy(t.kv, other), 0);
    cr_assert_eq(kvvm_stream_destroy(t.kv, next), 0);
    tclose_stream(&t, st);
}

struct io_arg { struct tctx *t; kvvm_seq s; char *buf; size_t n; bool write; int rc;
                int done; };

static void *io_thread(void *p)
{
    struct io_arg *a = p;
    a->rc = a->write ? kvvm_seq_write(a->t->kv, a->s, 0, 100, a->buf, a->n)
                     : kvvm_seq_read(a->t->kv, a->s, 0, 100, a->buf, a->n);
    __atomic_store_n(&a->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* Runs a write or read from a pageable buffer in a thread while the engine stream is
   paused: it must not return before the stream ran its copy (the emulator, like the driver
   documentation, neither stages a pageable source nor fills a pageable destination at the
   call). Returns whether it returned early. */
static bool pageable_returns_early(struct tctx *t, void *st, struct io_arg *a)
{
    cr_assert_eq(emu_stream_set_paused((kcu_stream)st, 1), 0);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, io_thread, a), 0);
    bool early = false;
    for (int i = 0; i < 20 && !early; i++) {      /* up to 200 ms for a wrong early return */
        usleep(10000);
        early = __atomic_load_n(&a->done, __ATOMIC_ACQUIRE);
    }
    cr_assert_eq(emu_stream_set_paused((kcu_stream)st, 0), 0);
    pthread_join(th, NULL);
    (void)t;
    return early;
}

/* Regression (issue 9, item 16): stream mode relied on the driver to stage a pageable
   source at the call and fill a pageable destination by return; CUDA 12/13 documentation
   no longer promises either. A pageable buffer is now waited for; a pinned one is not
   (options/stream_mode_cpu_does_not_wait). */
Test(pageable_buffers, stream_mode_waits_for_their_copy, .timeout = 30)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 1, 1000, 4, 40, 40);
    void *st;
    topen_stream(&t, &c, &st);
    kvvm_seq s;
    cr_assert_eq(kvvm_seq_create(t.kv, &s), 0);
    cr_assert_eq(kvvm_seq_grow(t.kv, s, 8), 0);
    char *buf = malloc(64);
    cr_assert(buf);
    memset(buf, 'A', 64);
    struct io_arg w = { &t, s, buf, 64, true, -1, 0 };
    cr_expect(!pageable_returns_early(&t, st, &w), "a pageable write returned before its copy");
    cr_assert_eq(w.rc, 0);
    memset(buf, 'B', 64);                   /* reused at once: the copy must not see it */
    cr_assert_eq(kvvm_sync(t.kv), 0);
    memset(buf, 0, 64);
    struct io_arg r = { &t, s, buf, 64, false, -1, 0 };
    cr_expect(!pageable_returns_early(&t, st, &r), "a pageable read returned before its copy");
    cr_assert_eq(r.rc, 0);
    for (int i = 0; i < 64; i++)
        cr_assert_eq(buf[i], 'A', "byte %d: %c", i, buf[i]);
    /* a device address is not host memory (the emulator is as strict as the driver) */
    uint64_t va;
    cr_assert_eq(kvvm_seq_addr(t.kv, s, 0, &va), 0);
    kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);
    cr_expect_eq(kvvm_seq_write(t.kv, s, 0, 0, (void *)(uintptr_t)(va + 512), 64), -EINVAL);
    free(buf);
    cr_assert_eq(kvvm_seq_free(t.kv, s), 0);
    tclose_stream(&t, st);
}

/* Regression (issue 9, item 15): kvvm_open left the new context current in the caller's
   thread and kvvm_close set none current, whatever the caller had. */
Test(current_context, open_and_close_leave_the_callers)
{
    struct kvvm_config c;
    struct tctx a, b;
    tcfg(&c, KB, 1, 1000, 4, 40, 40);
    topen(&a, &c);
    const struct kcu_api *api = emu_api();
    kcu_context mine = NULL, cur = NULL;
    cr_assert_eq(api->cuCtxGetCurrent(&cur), KCU_SUCCESS);
    cr_expect_null(cur, "kvvm_open left its context current");
    emu_ctx_on(a.ord);                  /* the engine works on device a */
    cr_assert_eq(api->cuCtxGetCurrent(&mine), KCU_SUCCESS);
    topen(&b, &c);                           /* ... and opens a context on device b */
    cr_assert_eq(api->cuCtxGetCurrent(&cur), KCU_SUCCESS);
    cr_expect_eq(cur, mine, "kvvm_open changed the caller's current context");
    kvvm_seq s;
    cr_assert_eq(kvvm_seq_create(b.kv, &s), 0);
    cr_assert_eq(kvvm_seq_grow(b.kv, s, 4), 0);
    tclose(&b);
    cr_assert_eq(api->cuCtxGetCurrent(&cur), KCU_SUCCESS);
    cr_expect_eq(cur, mine, "kvvm_close changed the caller's current context");
    emu_ctx_off(a.ord);
    tclose(&a);
}

/* Regression (issue 9, item 17): in a fork() child every call must be -EIO (the context's
   threads, locks and device belong to the parent; the emulated device's memory is shared
   with it), and the parent must be unharmed. Before, the child's calls ran on the parent's
   state. */
Test(fork_child, gets_eio_parent_unharmed, .timeout = 30)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 2, 1000, 4, 40, 40);
    c.host_budget = 16 * KB;
    c.flags = KVVM_F_AUTO_SWAP;
    topen(&t, &c);
    struct sh s;
    sh_create(&t, &s);
    sh_grow_fill(&t, &s, 9, 1);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);
        kvvm_seq n = 0;
        uint64_t u;
        char b[8];
        struct kvvm_stats stt = { .size = sizeof stt };
        int bad = 0;
        bad += kvvm_seq_create(t.kv, &n) != -EIO;
        bad += kvvm_seq_grow(t.kv, s.h, 12) != -EIO;
        bad += kvvm_seq_free(t.kv, s.h) != -EIO;
        bad += kvvm_seq_read(t.kv, s.h, 0, 0, b, sizeof b) != -EIO;
        bad += kvvm_seq_swap_out(t.kv, s.h) != -EIO;
        bad += kvvm_step(t.kv) != -EIO;
        bad += kvvm_sync(t.kv) != -EIO;
        bad += kvvm_stats(t.kv, &stt) != -EIO;
        bad += kvvm_region_base(t.kv, 0, &u) != -EIO;
        bad += kvvm_slot_bytes(t.kv, &u) != -EIO;
        kvvm_close(t.kv);
        _exit(bad);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "the child: %d call(s) did not return -EIO (status %d)",
              WIFEXITED(status) ? WEXITSTATUS(status) : -1, status);
    sh_verify(&t, &s, "parent after the child");
    sh_grow_fill(&t, &s, 12, 2);
    sh_verify(&t, &s, "parent grows on");
    tcheck(&t, "after fork");
    sh_free(&t, &s);
    tclose(&t);
}
