/*
 * tests/test_classes.c: sliding-window discard (kvvm_seq_discard) and sequence classes
 * (kvvm_seq_set_class: LIVE / CACHED / PINNED, drops, demotes, -ESTALE), docs/api.md.
 *
 * Every test checks the context against the emulated device's own tables
 * (kvvm_debug_check) after each step that changes state, and the bytes of every kept token
 * against a cookie written through the public API (opaque mode: only via the driver).
 * Failed calls are checked to change nothing: the checker, kvvm_seq_info of every sequence
 * named, the stats' page counts and the emulator's handle and mapping counters.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "core/core.h"
#include "harness.h"

#define KiB 1024ull
#define BPT 1024ull                 /* bytes per token per region */
#define TPP 64ull                   /* tokens per 64 KiB page */
#define NR 2u
#define MAXTOK 2048ull

static kvvm *kv;
static int ord;

static void cfg_base(struct kvvm_config *c)
{
    kvvm_config_init(c);
    c->backend = KVVM_BACKEND_EMULATED;
    c->n_regions = NR;
    c->bytes_per_token = BPT;
    c->max_seqs = 8;
    c->max_tokens = MAXTOK;
    c->page_size = 64 * KiB;
    c->emu_granule = 64 * KiB;
    c->device_budget = 64 * 64 * KiB;
    c->host_budget = 0;
    c->map_ahead = 0;
    c->emu_opaque = 1;
    c->flags = 0;
    /* no frame pool thread: these tests compare the emulator's handle count before and after
       a call (and sweep fail-at-call-N over the caller's driver calls), which the thread's
       creates ahead would change at any moment; test_elastic covers the thread */
    c->pool_thread = 0;
}

static void open_cfg(const struct kvvm_config *c)
{
    int rc = kvvm_open(c, &kv);
    cr_assert_eq(rc, 0, "kvvm_open: %d (%s)", rc, kvvm_last_error());
    ord = kvvm_debug_emu_ordinal(kv);
    cr_assert_geq(ord, 0);
}

static void close_ctx(void)
{
    th_close(kv, ord);
    kv = NULL;
}

static void check(const char *where)
{
    th_check(kv, where);
}

static struct kvvm_seq_info info(kvvm_seq s)
{
    struct kvvm_seq_info in;
    memset(&in, 0, sizeof in);
    in.size = sizeof in;
    cr_assert_eq(kvvm_seq_info(kv, s, &in), 0);
    return in;
}

static struct kvvm_stats stats(void)
{
    struct kvvm_stats st;
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    cr_assert_eq(kvvm_stats(kv, &st), 0);
    return st;
}

static struct emu_counters emuc(void)
{
    struct emu_counters ec;
    cr_assert_eq(emu_counters_get(ord, &ec), 0);
    return ec;
}

/* The cookie of token t of region r of sequence tag: every byte says where it belongs. */
static uint8_t token_cookie(unsigned tag, uint32_t r, uint64_t t, uint64_t b)
{
    return (uint8_t)(tag * 131 + r * 31 + t * 7 + b);
}

static void fill(kvvm_seq s, unsigned tag, uint64_t t0, uint64_t t1)
{
    static uint8_t buf[MAXTOK * BPT];
    for (uint32_t r = 0; r < NR; r++) {
        for (uint64_t t = t0; t < t1; t++)
            for (uint64_t b = 0; b < BPT; b++)
                buf[(t - t0) * BPT + b] = token_cookie(tag, r, t, b);
        int rc = kvvm_seq_write(kv, s, r, t0 * BPT, buf, (t1 - t0) * BPT);
        cr_assert_eq(rc, 0, "write r%u [%llu,%llu): %d (%s)", r, (unsigned long long)t0,
                     (unsigned long long)t1, rc, kvvm_last_error());
    }
}

static void verify_r(kvvm_seq s, unsigned tag, uint32_t r, uint64_t t0, uint64_t t1,
                     const char *where)
{
    static uint8_t buf[MAXTOK * BPT];
    if (t0 >= t1)
        return;
    int rc = kvvm_seq_read(kv, s, r, t0 * BPT, buf, (t1 - t0) * BPT);
    cr_assert_eq(rc, 0, "%s: read r%u: %d (%s)", where, r, rc, kvvm_last_error());
    for (uint64_t t = t0; t < t1; t++)
        for (uint64_t b = 0; b < BPT; b += 97)
            cr_assert_eq(buf[(t - t0) * BPT + b], token_cookie(tag, r, t, b),
                         "%s: region %u token %llu byte %llu", where, r,
                         (unsigned long long)t, (unsigned long long)b);
}

static void verify(kvvm_seq s, unsigned tag, uint64_t t0, uint64_t t1, const char *where)
{
    for (uint32_t r = 0; r < NR; r++)
        verify_r(s, tag, r, t0, t1, where);
}

static kvvm_seq mkseq(unsigned tag, uint64_t len)
{
    kvvm_seq s;
    cr_assert_eq(kvvm_seq_create(kv, &s), 0);
    int rc = kvvm_seq_grow(kv, s, len);
    cr_assert_eq(rc, 0, "grow %llu: %d (%s)", (unsigned long long)len, rc, kvvm_last_error());
    fill(s, tag, 0, len);
    return s;
}

/* The state a failed call must leave as it was. */
struct snap {
    struct kvvm_seq_info in[4];
    uint64_t dev_free, host_free, discarded, drops;
    uint64_t handles, mappings, mapped_bytes;
};

static void snap(struct snap *sn, const kvvm_seq *s, int n)
{
    memset(sn, 0, sizeof *sn);
    for (int i = 0; i < n; i++)
        sn->in[i] = info(s[i]);
    struct kvvm_stats st = stats();
    sn->dev_free = st.pages_device_free;
    sn->host_free = st.pages_host_free;
    sn->discarded = st.pages_discarded;
    sn->drops = st.cache_drops;
    struct emu_counters ec = emuc();
    sn->handles = ec.handles;
    sn->mappings = ec.mappings;
    sn->mapped_bytes = ec.mapped_bytes;
}

static void expect_same(const struct snap *a, const kvvm_seq *s, int n, const char *where)
{
    struct snap b;
    snap(&b, s, n);
    for (int i = 0; i < n; i++)
        cr_assert(!memcmp(&a->in[i], &b.in[i], sizeof a->in[i]),
                  "%s: seq %d info changed (length %llu -> %llu, device %u -> %u, "
                  "first_kept %llu -> %llu, dropped %d -> %d)", where, i,
                  (unsigned long long)a->in[i].length, (unsigned long long)b.in[i].length,
                  a->in[i].pages_device, b.in[i].pages_device,
                  (unsigned long long)a->in[i].first_kept,
                  (unsigned long long)b.in[i].first_kept, a->in[i].dropped, b.in[i].dropped);
    cr_assert_eq(a->dev_free, b.dev_free, "%s: device free %llu -> %llu", where,
                 (unsigned long long)a->dev_free, (unsigned long long)b.dev_free);
    cr_assert_eq(a->host_free, b.host_free, "%s: host free changed", where);
    cr_assert_eq(a->discarded, b.discarded, "%s: pages_discarded changed", where);
    cr_assert_eq(a->drops, b.drops, "%s: cache_drops changed", where);
    cr_assert_eq(a->handles, b.handles, "%s: emulator handles %llu -> %llu", where,
                 (unsigned long long)a->handles, (unsigned long long)b.handles);
    cr_assert_eq(a->mapped_bytes, b.mapped_bytes, "%s: emulator mapped bytes %llu -> %llu",
                 where, (unsigned long long)a->mapped_bytes,
                 (unsigned long long)b.mapped_bytes);
    check(where);
}

/* Whether device address va is mapped (the emulator's table). */
static bool mapped(kvvm_seq s, uint32_t r, uint64_t page)
{
    uint64_t a;
    cr_assert_eq(kvvm_seq_addr(kv, s, r, &a), 0);
    return emu_lookup(a + page * 64 * KiB, NULL, NULL, NULL) == 0;
}

static void fini(void)
{
    emu_fail_clear();
    if (kv)
        close_ctx();
}

/* ======================================================================== discard */

TestSuite(discard, .fini = fini);

Test(discard, errors_change_nothing)
{
    struct kvvm_config c;
    cfg_base(&c);
    open_cfg(&c);
    kvvm_seq s = mkseq(1, 200), other;
    cr_assert_eq(kvvm_seq_create(kv, &other), 0);
    struct snap sn;
    snap(&sn, &s, 1);
    cr_assert_eq(kvvm_seq_discard(kv, s, NR, 10), -EINVAL);
    cr_assert(strstr(kvvm_last_error(), "region"), "%s", kvvm_last_error());
    cr_assert_eq(kvvm_seq_discard(kv, s, 0, 201), -EINVAL);
    cr_assert(strstr(kvvm_last_error(), "first_kept"), "%s", kvvm_last_error());
    cr_assert_eq(kvvm_seq_discard(kv, s, KVVM_ALL_REGIONS, 201), -EINVAL);
    cr_assert_eq(kvvm_seq_discard(kv, s + (1ull << 32), 0, 10), -ENOENT);
    cr_assert_eq(kvvm_seq_discard(NULL, s, 0, 10), -EINVAL);
    expect_same(&sn, &s, 1, "bad arguments");
    /* 0 and an empty sequence: no-ops */
    cr_assert_eq(kvvm_seq_discard(kv, s, KVVM_ALL_REGIONS, 0), 0);
    cr_assert_eq(kvvm_seq_discard(kv, other, KVVM_ALL_REGIONS, 0), 0);
    expect_same(&sn, &s, 1, "no-op");
    /* a first_kept inside the first page releases nothing but is recorded */
    cr_assert_eq(kvvm_seq_discard(kv, s, 0, 10), 0);
    cr_assert_eq(info(s).pages_device, sn.in[0].pages_device);
    uint8_t b[BPT];
    cr_assert_eq(kvvm_seq_read(kv, s, 0, 9 * BPT, b, BPT), -EINVAL);
    cr_assert(strstr(kvvm_last_error(), "first_kept"), "%s", kvvm_last_error());
    cr_assert_eq(kvvm_seq_write(kv, s, 0, 9 * BPT + 5, b, 10), -EINVAL);
    cr_assert_eq(kvvm_seq_prepare_write(kv, s, 5, 20), -EINVAL);
    cr_assert(strstr(kvvm_last_error(), "discarded"), "%s", kvvm_last_error());
    verify_r(s, 1, 0, 10, 200, "after discard in page 0");
    verify_r(s, 1, 1, 0, 200, "region 1 untouched");
    check("discard");
}

Test(discard, releases_whole_pages_only)
{
    struct kvvm_config c;
    cfg_base(&c);
    open_cfg(&c);
    kvvm_seq s = mkseq(2, 5 * TPP + 10);           /* 6 pages per region */
    struct kvvm_stats st0 = stats();
    uint64_t mb0 = emuc().mapped_bytes;
    cr_assert_eq(kvvm_seq_discard(kv, s, KVVM_ALL_REGIONS, 2 * TPP + 30), 0);
    struct kvvm_seq_info in = info(s);
    cr_assert_eq(in.length, 5 * TPP + 10, "length unchanged");
    cr_assert_eq(in.pages_device, 2 * 4, "pages 0 and 1 of each region released");
    cr_assert_eq(in.first_kept, 2 * TPP + 30);
    cr_assert(in.resident);
    struct kvvm_stats st = stats();
    cr_assert_eq(st.pages_discarded - st0.pages_discarded, 4);
    cr_assert_eq(st.pages_device_free - st0.pages_device_free, 4);
    cr_assert_eq(mb0 - emuc().mapped_bytes, 4 * 64 * KiB, "the emulator unmapped 4 pages");
    for (uint32_t r = 0; r < NR; r++) {
        cr_assert(!mapped(s, r, 0) && !mapped(s, r, 1) && mapped(s, r, 2), "r%u window", r);
    }
    uint64_t a0, a1;
    cr_assert_eq(kvvm_seq_addr(kv, s, 0, &a0), 0);
    verify(s, 2, 2 * TPP + 30, 5 * TPP + 10, "kept tokens");
    check("after discard");
    /* lower: a no-op; the same again: nothing more */
    cr_assert_eq(kvvm_seq_discard(kv, s, KVVM_ALL_REGIONS, TPP), 0);
    cr_assert_eq(info(s).first_kept, 2 * TPP + 30);
    cr_assert_eq(stats().pages_discarded - st0.pages_discarded, 4);
    /* grows on as usual, at the same address */
    cr_assert_eq(kvvm_seq_grow(kv, s, 8 * TPP), 0);
    fill(s, 2, 5 * TPP + 10, 8 * TPP);
    cr_assert_eq(kvvm_seq_addr(kv, s, 0, &a1), 0);
    cr_assert_eq(a0, a1);
    verify(s, 2, 2 * TPP + 30, 8 * TPP, "after grow");
    /* first_kept == length: every whole page goes */
    cr_assert_eq(kvvm_seq_discard(kv, s, KVVM_ALL_REGIONS, 8 * TPP), 0);
    cr_assert_eq(info(s).pages_device, 0);
    check("all discarded");
    cr_assert_eq(kvvm_seq_grow(kv, s, 8 * TPP + 5), 0);
    fill(s, 2, 8 * TPP, 8 * TPP + 5);
    verify(s, 2, 8 * TPP, 8 * TPP + 5, "grown past a fully discarded sequence");
    cr_assert_eq(kvvm_seq_free(kv, s), 0);
    check("freed");
}

Test(discard, one_region_only)
{
    struct kvvm_config c;
    cfg_base(&c);
    open_cfg(&c);
    kvvm_seq s = mkseq(3, 4 * TPP);
    cr_assert_eq(kvvm_seq_discard(kv, s, 1, 3 * TPP), 0);
    struct kvvm_seq_info in = info(s);
    cr_assert_eq(in.pages_device, 4 + 1);
    cr_assert_eq(in.first_kept, 0, "the smallest first_kept over the regions");
    verify_r(s, 3, 0, 0, 4 * TPP, "region 0 whole");
    verify_r(s, 3, 1, 3 * TPP, 4 * TPP, "region 1 kept");
    uint8_t b[BPT];
    cr_assert_eq(kvvm_seq_read(kv, s, 1, 0, b, BPT), -EINVAL);
    cr_assert_eq(kvvm_seq_read(kv, s, 0, 0, b, BPT), 0);
    check("one region");
    cr_assert_eq(kvvm_seq_discard(kv, s, 0, 2 * TPP), 0);
    cr_assert_eq(info(s).first_kept, 2 * TPP);
    cr_assert_eq(info(s).pages_device, 2 + 1);
    check("both regions, different first_kept");
}

Test(discard, fork_and_share_keep_it)
{
    struct kvvm_config c;
    cfg_base(&c);
    open_cfg(&c);
    kvvm_seq p = mkseq(4, 4 * TPP + 20), ch, d;
    cr_assert_eq(kvvm_seq_discard(kv, p, KVVM_ALL_REGIONS, 2 * TPP), 0);
    cr_assert_eq(kvvm_seq_fork(kv, p, &ch), 0);
    struct kvvm_seq_info ci = info(ch);
    cr_assert_eq(ci.first_kept, 2 * TPP);
    cr_assert_eq(ci.pages_device, 2 * 3);
    cr_assert_eq(ci.pages_shared, 2 * 3);
    uint8_t b[BPT];
    cr_assert_eq(kvvm_seq_read(kv, ch, 0, TPP * BPT, b, BPT), -EINVAL);
    verify(ch, 4, 2 * TPP, 4 * TPP + 20, "child");
    check("fork");
    cr_assert_eq(kvvm_seq_create(kv, &d), 0);
    cr_assert_eq(kvvm_seq_share(kv, d, p, 3 * TPP + 10), 0);
    struct kvvm_seq_info di = info(d);
    cr_assert_eq(di.first_kept, 2 * TPP);
    cr_assert_eq(di.pages_device, 2 * 2, "page 2 shared, page 3 copied");
    verify(d, 4, 2 * TPP, 3 * TPP + 10, "share target");
    check("share");
    /* a share of fewer tokens than first_kept: everything gone, nothing copied */
    kvvm_seq e;
    cr_assert_eq(kvvm_seq_create(kv, &e), 0);
    cr_assert_eq(kvvm_seq_share(kv, e, p, TPP + 10), 0);
    cr_assert_eq(info(e).pages_device, 0);
    cr_assert_eq(info(e).first_kept, TPP + 10);
    cr_assert_eq(kvvm_seq_grow(kv, e, TPP + 40), 0);   /* the hole page is made again */
    fill(e, 5, TPP + 10, TPP + 40);
    verify(e, 5, TPP + 10, TPP + 40, "grown after an all-discarded share");
    check("short share");
    /* the parent's discarded pages stay with nobody; freeing the parent keeps the child's */
    cr_assert_eq(kvvm_seq_free(kv, p), 0);
    verify(ch, 4, 2 * TPP, 4 * TPP + 20, "child after parent freed");
    check("parent freed");
}

Test(discard, truncate_below_first_kept)
{
    struct kvvm_config c;
    cfg_base(&c);
    open_cfg(&c);
    kvvm_seq s = mkseq(6, 5 * TPP);
    cr_assert_eq(kvvm_seq_discard(kv, s, KVVM_ALL_REGIONS, 3 * TPP + 40), 0);
    cr_assert_eq(kvvm_seq_truncate(kv, s, 2 * TPP + 20), 0);
    struct kvvm_seq_info in = info(s);
    cr_assert_eq(in.first_kept, 2 * TPP + 20);
    cr_assert_eq(in.pages_device, 0, "the last page is a hole");
    check("truncated below first_kept");
    uint8_t b[BPT];
    cr_assert_eq(kvvm_seq_read(kv, s, 0, (2 * TPP + 19) * BPT, b, BPT), -EINVAL);
    /* grown again from 2*TPP+20: new, valid tokens in a page made again */
    cr_assert_eq(kvvm_seq_grow(kv, s, 3 * TPP + 5), 0);
    cr_assert_eq(info(s).pages_device, 2 * 2);
    fill(s, 7, 2 * TPP + 20, 3 * TPP + 5);
    verify(s, 7, 2 * TPP + 20, 3 * TPP + 5, "regrown");
    check("regrown");
}

Test(discard, swap_counts_only_kept_pages)
{
    struct kvvm_config c;
    cfg_base(&c);
    c.host_budget = 32 * 64 * KiB;
    open_cfg(&c);
    kvvm_seq s = mkseq(8, 6 * TPP), f;
    cr_assert_eq(kvvm_seq_discard(kv, s, KVVM_ALL_REGIONS, 4 * TPP), 0);
    cr_assert_eq(kvvm_seq_fork(kv, s, &f), 0);
    cr_assert_eq(kvvm_seq_free(kv, f), 0);
    uint64_t h0 = stats().pages_host_free;
    cr_assert_eq(kvvm_seq_swap_out(kv, s), 0);
    struct kvvm_seq_info in = info(s);
    cr_assert_eq(in.pages_host, 4);
    cr_assert_eq(in.pages_device, 0);
    cr_assert_eq(h0 - stats().pages_host_free, 4, "only kept pages took host slots");
    check("swapped out");
    uint64_t need;
    int fits;
    cr_assert_eq(kvvm_seq_need(kv, s, 0, &need, &fits), 0);
    cr_assert_eq(need, 4);
    /* a fork and a discard of a swapped-out sequence */
    cr_assert_eq(kvvm_seq_fork(kv, s, &f), 0);
    cr_assert_eq(kvvm_seq_discard(kv, f, 0, 5 * TPP), 0);
    cr_assert_eq(info(f).pages_host, 3);
    check("discard while swapped out");
    cr_assert_eq(kvvm_seq_swap_in(kv, s), 0);
    cr_assert_eq(info(s).pages_device, 4);
    verify(s, 8, 4 * TPP, 6 * TPP, "after swap-in");
    cr_assert_eq(kvvm_seq_swap_in(kv, f), 0);
    verify_r(f, 8, 0, 5 * TPP, 6 * TPP, "fork r0");
    verify_r(f, 8, 1, 4 * TPP, 6 * TPP, "fork r1");
    check("swapped in");
}

Test(discard, spill_counts_only_kept_pages)
{
    char dir[] = "/var/tmp/kvvm-classes-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    struct kvvm_config c;
    cfg_base(&c);
    c.host_budget = 2 * 64 * KiB;           /* 2 host slots: the rest goes to disk */
    c.spill_dir = dir;
    c.spill_budget = 32 * 64 * KiB;
    c.flags = KVVM_F_SPILL_ALLOW_TMPFS | KVVM_F_SPILL_BUFFERED;
    open_cfg(&c);
    rmdir(dir);                            /* the spill file is unnamed */
    kvvm_seq s = mkseq(9, 8 * TPP);
    cr_assert_eq(kvvm_seq_discard(kv, s, KVVM_ALL_REGIONS, 5 * TPP), 0);
    cr_assert_eq(kvvm_seq_swap_out(kv, s), 0);  /* 6 kept pages: staged through 2 slots */
    struct kvvm_seq_info in = info(s);
    cr_assert_eq(in.pages_host + in.pages_disk, 6);
    check("spilled");
    cr_assert_eq(kvvm_seq_swap_in(kv, s), 0);
    verify(s, 9, 5 * TPP, 8 * TPP, "after unspill");
    check("unspilled");
}

/* Stream mode, engine work pending: a context on a new engine stream, paused, and a
   sequence of `pages` pages (cookie tag) protected in this step by a prepare_write of its
   last page (no copy: a pageable read or write would wait for the paused stream). */
static kvvm_seq protected_paused(void **st, unsigned tag, uint64_t pages)
{
    struct kvvm_config c;
    cfg_base(&c);
    open_cfg(&c);
    cr_assert_eq(kvvm_stream_create(kv, st), 0);
    cr_assert_eq(kvvm_set_stream(kv, *st), 0);
    kvvm_seq s = mkseq(tag, pages * TPP);
    cr_assert_eq(kvvm_sync(kv), 0);
    cr_assert_eq(emu_stream_set_paused((kcu_stream)*st, 1), 0);
    cr_assert_eq(kvvm_seq_prepare_write(kv, s, (pages - 1) * TPP, (pages - 1) * TPP + 1), 0);
    return s;
}

/* Stream mode: a protected sequence's discarded pages stay mapped until the step fence. */
Test(discard, protected_release_waits_for_step_fence)
{
    void *st;
    kvvm_seq s = protected_paused(&st, 10, 4);
    cr_assert_eq(kvvm_seq_discard(kv, s, KVVM_ALL_REGIONS, 2 * TPP), 0);
    cr_assert(mapped(s, 0, 0) && mapped(s, 1, 1), "released before the engine's work ended");
    cr_assert_eq(info(s).pages_device, 4, "the discarded pages are not counted");
    check("pending release");
    cr_assert_eq(kvvm_step(kv), 0);
    cr_assert(mapped(s, 0, 0), "released before the step fence completed");
    cr_assert_eq(emu_stream_set_paused((kcu_stream)st, 0), 0);
    cr_assert_eq(kvvm_sync(kv), 0);
    cr_assert(!mapped(s, 0, 0) && !mapped(s, 1, 1) && mapped(s, 0, 2));
    check("released");
    cr_assert_eq(kvvm_set_stream(kv, NULL), 0);
}

/* Stream mode, the decode pattern of a sliding-window layer: discard, then grow, in one
   step while the engine's work runs. The grow does not wait for the discard's fence (it maps
   nothing the discard releases). Regression: grow flushed every pending release of the slot,
   blocking on the engine stream (here, paused: for ever). */
Test(discard, grow_does_not_wait_for_discard_fence)
{
    TH_DEADLINE(60);
    void *st;
    kvvm_seq s = protected_paused(&st, 13, 4);
    cr_assert_eq(kvvm_seq_discard(kv, s, KVVM_ALL_REGIONS, 2 * TPP + 3), 0);
    cr_assert_eq(kvvm_seq_grow(kv, s, 4 * TPP + 1), 0);
    cr_assert(mapped(s, 0, 1), "the discarded page went before the fence");
    check("grown with a discard pending");
    cr_assert_eq(emu_stream_set_paused((kcu_stream)st, 0), 0);
    cr_assert_eq(kvvm_sync(kv), 0);
    cr_assert(!mapped(s, 0, 1) && mapped(s, 0, 4));
    check("released");
    cr_assert_eq(kvvm_set_stream(kv, NULL), 0);
}

TestSuite(regress, .fini = fini);

/* Bug: in stream mode, discard(ALL_REGIONS, 3) then free left the dying slot's first_kept
   at 3 with length 0: the checker failed ("first_kept 3 past the length 0"), a KVVM_DEBUG
   build aborted inside kvvm_seq_free. */
Test(regress, free_after_discard_left_dying_slot_first_kept)
{
    void *st;
    kvvm_seq s = protected_paused(&st, 14, 2);  /* its releases wait for the engine */
    cr_assert_eq(kvvm_seq_discard(kv, s, KVVM_ALL_REGIONS, 3), 0);
    cr_assert_eq(kvvm_seq_free(kv, s), 0);       /* the slot dies: its releases are pending */
    /* resumed before the check (a failed check must not leave close waiting on a paused
       stream); the slot stays dying until a call reaps its releases */
    cr_assert_eq(emu_stream_set_paused((kcu_stream)st, 0), 0);
    check("freed with a discard, slot dying");
    kvvm_seq n;                                  /* the slot comes back clean */
    cr_assert_eq(kvvm_sync(kv), 0);
    cr_assert_eq(kvvm_seq_create(kv, &n), 0);
    cr_assert_eq(info(n).first_kept, 0);
    check("slot reused");
    cr_assert_eq(kvvm_seq_free(kv, n), 0);
    cr_assert_eq(kvvm_set_stream(kv, NULL), 0);
}

/* A fault sweep of this file (th_sweep_run): a fresh context, in stream mode or not, the two
   sequences of the case and their state before the call. */
struct csweep {
    bool stream;
    kvvm_seq seq[2];
    struct snap sn;
};

static void csweep_open(struct csweep *w, const struct kvvm_config *c)
{
    open_cfg(c);
    void *st = NULL;
    if (w->stream) {
        cr_assert_eq(kvvm_stream_create(kv, &st), 0);
        cr_assert_eq(kvvm_set_stream(kv, st), 0);
    }
}

static void csweep_teardown(void *arg)
{
    struct csweep *w = arg;
    if (w->stream)
        cr_assert_eq(kvvm_set_stream(kv, NULL), 0);
    close_ctx();
}

/* Fail every driver call of a discard in turn (two errors): each failure changes nothing,
   the same call then succeeds. Stream mode (the deferred release: fence create/record) and
   synchronous mode (the device sync and unmaps). */
static void discard_setup(void *arg)
{
    struct csweep *w = arg;
    struct kvvm_config c;
    cfg_base(&c);
    csweep_open(w, &c);
    kvvm_seq s = mkseq(11, 5 * TPP), f;
    cr_assert_eq(kvvm_seq_fork(kv, s, &f), 0);    /* shared pages, too */
    w->seq[0] = s;
    w->seq[1] = f;
    snap(&w->sn, w->seq, 2);
}

static int discard_call(void *arg)
{
    struct csweep *w = arg;
    return kvvm_seq_discard(kv, w->seq[0], KVVM_ALL_REGIONS, 3 * TPP + 1);
}

static enum th_sweep_outcome discard_after(void *arg, int rc, const char *where)
{
    struct csweep *w = arg;
    kvvm_seq s = w->seq[0], f = w->seq[1];
    if (rc) {
        cr_assert_neq(rc, -EIO, "%s killed the context", where);
        expect_same(&w->sn, w->seq, 2, where);
        int rc2 = kvvm_seq_discard(kv, s, KVVM_ALL_REGIONS, 3 * TPP + 1);
        cr_assert_eq(rc2, 0, "%s: the retry failed: %d", where, rc2);
    }
    cr_assert_eq(info(s).pages_device, 2 * 2);
    verify(s, 11, 3 * TPP + 1, 5 * TPP, "kept");
    verify(f, 11, 0, 5 * TPP, "fork untouched");
    cr_assert_eq(kvvm_sync(kv), 0);
    check("sweep end");
    return rc ? TH_SWEEP_FAILED : TH_SWEEP_ABSORBED;
}

static void discard_sweep(bool stream)
{
    struct csweep w = { .stream = stream };
    const struct th_sweep sw = { stream ? "discard stream" : "discard sync", &w,
                                 discard_setup, discard_call, csweep_teardown, NULL,
                                 discard_after };
    th_sweep_run(&sw);
}

Test(discard, fault_sweep_sync)
{
    TH_DEADLINE(300);
    discard_sweep(false);
}

Test(discard, fault_sweep_stream)
{
    TH_DEADLINE(300);
    discard_sweep(true);
}

/* ======================================================================== classes */

TestSuite(classes, .fini = fini);

Test(classes, set_class_errors)
{
    struct kvvm_config c;
    cfg_base(&c);
    open_cfg(&c);
    kvvm_seq s = mkseq(1, 10);
    cr_assert_eq(info(s).cls, KVVM_SEQ_LIVE);
    cr_assert_eq(kvvm_seq_set_class(kv, s, (enum kvvm_seq_class)3), -EINVAL);
    cr_assert(strstr(kvvm_last_error(), "class"), "%s", kvvm_last_error());
    cr_assert_eq(kvvm_seq_set_class(kv, s, (enum kvvm_seq_class)-1), -EINVAL);
    cr_assert_eq(kvvm_seq_set_class(kv, s + (1ull << 32), KVVM_SEQ_CACHED), -ENOENT);
    cr_assert_eq(kvvm_seq_set_class(NULL, s, KVVM_SEQ_CACHED), -EINVAL);
    cr_assert_eq(info(s).cls, KVVM_SEQ_LIVE);
    cr_assert_eq(kvvm_seq_set_class(kv, s, KVVM_SEQ_PINNED), 0);
    cr_assert_eq(info(s).cls, KVVM_SEQ_PINNED);
    cr_assert_eq(kvvm_seq_set_class(kv, s, KVVM_SEQ_CACHED), 0);
    cr_assert_eq(info(s).cls, KVVM_SEQ_CACHED);
    cr_assert_eq(info(s).dropped, 0);
    cr_assert_str_eq(kvvm_strerror(-ESTALE) + 0, kvvm_strerror(ESTALE));
    cr_assert(strstr(kvvm_strerror(-ESTALE), "dropped"));
    check("classes");
}

/* Fills the device with a CACHED entry; a LIVE grow then needs its pages. */
static kvvm_seq fill_cached(unsigned tag, uint64_t len)
{
    kvvm_seq e = mkseq(tag, len);
    cr_assert_eq(kvvm_seq_set_class(kv, e, KVVM_SEQ_CACHED), 0);
    cr_assert_eq(kvvm_step(kv), 0);          /* unprotected */
    return e;
}

static void expect_stale(kvvm_seq e)
{
    kvvm_seq d, ch;
    uint8_t b[16];
    cr_assert_eq(kvvm_seq_create(kv, &d), 0);
    cr_assert_eq(kvvm_seq_share(kv, d, e, 0), -ESTALE);
    cr_assert_eq(kvvm_seq_share(kv, d, e, 1), -ESTALE);
    cr_assert_eq(kvvm_seq_share(kv, e, d, 0), -ESTALE);     /* into it: as target too */
    cr_assert_eq(kvvm_seq_fork(kv, e, &ch), -ESTALE);
    cr_assert_eq(kvvm_seq_grow(kv, e, 1), -ESTALE);
    cr_assert_eq(kvvm_seq_grow_batch(kv, &e, &(uint64_t){ 1 }, 1), -ESTALE);
    cr_assert_eq(kvvm_seq_read(kv, e, 0, 0, b, 1), -ESTALE);
    cr_assert_eq(kvvm_seq_write(kv, e, 0, 0, b, 1), -ESTALE);
    cr_assert_eq(kvvm_seq_swap_in(kv, e), -ESTALE);
    cr_assert_eq(kvvm_seq_prefetch(kv, e), -ESTALE);
    cr_assert(strstr(kvvm_last_error(), "ESTALE"), "%s", kvvm_last_error());
    cr_assert_eq(kvvm_seq_free(kv, d), 0);
}

/* Without KVVM_F_AUTO_SWAP a grow that needs pages drops a CACHED entry (no data moves). */
Test(classes, drop_without_auto_swap)
{
    struct kvvm_config c;
    cfg_base(&c);
    open_cfg(&c);
    kvvm_seq e = fill_cached(1, 12 * TPP);        /* 24 of 64 frames */
    kvvm_seq l = mkseq(2, 12 * TPP);              /* 48 */
    kvvm_seq x;
    cr_assert_eq(kvvm_seq_create(kv, &x), 0);
    uint64_t copied = emuc().copied_dtoh;
    int rc = kvvm_seq_grow(kv, x, 12 * TPP);      /* needs 24: only 16 free */
    cr_assert_eq(rc, 0, "grow: %d (%s)", rc, kvvm_last_error());
    cr_assert_eq(emuc().copied_dtoh, copied, "a drop copies nothing");
    struct kvvm_seq_info in = info(e);
    cr_assert_eq(in.dropped, 1);
    cr_assert_eq(in.length, 0);
    cr_assert_eq(in.pages_device, 0);
    cr_assert_eq(in.cls, KVVM_SEQ_CACHED);
    cr_assert_eq(stats().cache_drops, 1);
    check("dropped");
    verify(l, 2, 0, 12 * TPP, "the live sequence");
    expect_stale(e);
    check("stale calls");
    uint64_t dummy;
    int fits;
    cr_assert_eq(kvvm_seq_need(kv, e, 0, &dummy, &fits), 0);
    cr_assert_eq(kvvm_seq_truncate(kv, e, 0), 0);
    /* set to a class again: an empty sequence of that class */
    cr_assert_eq(kvvm_seq_set_class(kv, e, KVVM_SEQ_LIVE), 0);
    in = info(e);
    cr_assert_eq(in.dropped, 0);
    cr_assert_eq(in.cls, KVVM_SEQ_LIVE);
    cr_assert_eq(kvvm_seq_grow(kv, e, 5), 0);
    fill(e, 3, 0, 5);
    verify(e, 3, 0, 5, "revived");
    check("revived");
    /* with nothing CACHED left, a grow that cannot fit fails and changes nothing */
    kvvm_seq y;
    cr_assert_eq(kvvm_seq_create(kv, &y), 0);
    kvvm_seq all[3] = { l, x, y };
    struct snap sn;
    snap(&sn, all, 3);
    cr_assert_eq(kvvm_seq_grow(kv, y, 12 * TPP), -ENOMEM);
    expect_same(&sn, all, 3, "failed grow");
}

/* Not enough even after dropping every CACHED entry: -ENOMEM and nothing dropped. */
Test(classes, drop_all_or_nothing)
{
    struct kvvm_config c;
    cfg_base(&c);
    open_cfg(&c);
    kvvm_seq e = fill_cached(1, 4 * TPP);         /* 8 frames */
    kvvm_seq l = mkseq(2, 12 * TPP);              /* 24 frames */
    kvvm_seq x;
    cr_assert_eq(kvvm_seq_create(kv, &x), 0);
    kvvm_seq all[3] = { e, l, x };
    struct snap sn;
    snap(&sn, all, 3);
    cr_assert_eq(kvvm_seq_grow(kv, x, 21 * TPP), -ENOMEM);   /* 42 > 32 free + 8 */
    expect_same(&sn, all, 3, "nothing dropped");
    verify(e, 1, 0, 4 * TPP, "cached entry intact");
}

/* With KVVM_F_AUTO_SWAP: CACHED entries are dropped before any LIVE one is swapped. */
Test(classes, cached_before_live)
{
    struct kvvm_config c;
    cfg_base(&c);
    c.host_budget = 64 * 64 * KiB;
    c.flags = KVVM_F_AUTO_SWAP;
    c.device_min = c.device_low = c.device_high = 0;   /* no background rounds */
    open_cfg(&c);
    kvvm_seq l = mkseq(1, 10 * TPP);              /* LIVE, least recently used */
    cr_assert_eq(kvvm_step(kv), 0);
    kvvm_seq e = fill_cached(2, 10 * TPP);
    kvvm_seq x;
    cr_assert_eq(kvvm_seq_create(kv, &x), 0);
    cr_assert_eq(kvvm_seq_grow(kv, x, 20 * TPP), 0);   /* 40: 24 free, needs 16 */
    cr_assert_eq(info(e).dropped, 1);
    cr_assert(info(l).resident, "the LIVE sequence was swapped before the CACHED one");
    struct kvvm_stats st = stats();
    cr_assert_eq(st.cache_drops, 1);
    cr_assert_eq(st.swap_outs, 0);
    check("cached first");
    /* then LIVE sequences swap as before */
    cr_assert_eq(kvvm_step(kv), 0);
    kvvm_seq y;
    cr_assert_eq(kvvm_seq_create(kv, &y), 0);
    cr_assert_eq(kvvm_seq_grow(kv, y, 8 * TPP), 0);
    cr_assert(!info(l).resident);
    verify(l, 1, 0, 10 * TPP, "swapped live sequence");
    check("live swapped");
}

/* KVVM_F_CACHE_DEMOTE: demoted to the host tier (bytes kept) instead of dropped. */
Test(classes, demote)
{
    struct kvvm_config c;
    cfg_base(&c);
    c.host_budget = 64 * 64 * KiB;
    c.flags = KVVM_F_AUTO_SWAP | KVVM_F_CACHE_DEMOTE;
    c.device_min = c.device_low = c.device_high = 0;
    open_cfg(&c);
    kvvm_seq e = fill_cached(3, 10 * TPP);
    kvvm_seq l = mkseq(4, 10 * TPP);
    cr_assert_eq(kvvm_step(kv), 0);
    kvvm_seq x;
    cr_assert_eq(kvvm_seq_create(kv, &x), 0);
    cr_assert_eq(kvvm_seq_grow(kv, x, 20 * TPP), 0);
    struct kvvm_seq_info in = info(e);
    cr_assert_eq(in.dropped, 0);
    cr_assert(!in.resident);
    cr_assert_eq(in.pages_host, 20);
    cr_assert(info(l).resident);
    struct kvvm_stats st = stats();
    cr_assert_eq(st.cache_demotes, 1);
    cr_assert_eq(st.cache_drops, 0);
    check("demoted");
    cr_assert_eq(kvvm_seq_free(kv, x), 0);
    verify(e, 3, 0, 10 * TPP, "demoted entry read back");
    check("demoted read");
}

/* CACHE_DEMOTE without a host tier (no room below): dropped. */
Test(classes, demote_without_room_drops)
{
    struct kvvm_config c;
    cfg_base(&c);
    c.flags = KVVM_F_AUTO_SWAP | KVVM_F_CACHE_DEMOTE;
    open_cfg(&c);
    kvvm_seq e = fill_cached(3, 10 * TPP);
    kvvm_seq x;
    (void)mkseq(4, 10 * TPP);
    cr_assert_eq(kvvm_seq_create(kv, &x), 0);
    cr_assert_eq(kvvm_seq_grow(kv, x, 20 * TPP), 0);
    cr_assert_eq(info(e).dropped, 1);
    cr_assert_eq(stats().cache_demotes, 0);
    check("dropped, no room");
}

/* A page shared by a CACHED entry and a LIVE sequence is released only by its last holder. */
Test(classes, shared_page_survives_drop)
{
    struct kvvm_config c;
    cfg_base(&c);
    open_cfg(&c);
    kvvm_seq e = fill_cached(5, 8 * TPP + 10);    /* 18 frames */
    kvvm_seq l;
    cr_assert_eq(kvvm_seq_create(kv, &l), 0);
    cr_assert_eq(kvvm_seq_share(kv, l, e, 6 * TPP + 5), 0);   /* 12 shared + 2 copies */
    cr_assert_eq(info(l).pages_shared, 12);
    cr_assert_eq(kvvm_step(kv), 0);
    cr_assert_eq(kvvm_step(kv), 0);
    kvvm_seq x;
    cr_assert_eq(kvvm_seq_create(kv, &x), 0);
    uint64_t free0 = stats().pages_device_free;   /* 64 - 18 - 2 = 44 */
    cr_assert_eq(free0, 44);
    cr_assert_eq(kvvm_seq_grow(kv, x, 24 * TPP), 0);   /* 48: the drop frees 4 + 2 */
    cr_assert_eq(info(e).dropped, 1);
    struct kvvm_seq_info li = info(l);
    cr_assert_eq(li.pages_device, 14);
    cr_assert_eq(li.pages_shared, 0, "l is the last holder now");
    verify(l, 5, 0, 6 * TPP + 5, "shared pages after the drop");
    check("shared drop");
    cr_assert_eq(kvvm_seq_free(kv, l), 0);
    check("last holder gone");
}

/* Stream mode: a dropped entry whose last use the engine has not finished keeps its pages
   mapped until the step fence completes (the drop releases after it). */
Test(classes, drop_waits_for_step_fence)
{
    struct kvvm_config c;
    cfg_base(&c);
    open_cfg(&c);
    void *st;
    cr_assert_eq(kvvm_stream_create(kv, &st), 0);
    cr_assert_eq(kvvm_set_stream(kv, st), 0);
    kvvm_seq e = mkseq(6, 12 * TPP);
    cr_assert_eq(kvvm_seq_set_class(kv, e, KVVM_SEQ_CACHED), 0);
    cr_assert_eq(kvvm_sync(kv), 0);
    cr_assert_eq(emu_stream_set_paused((kcu_stream)st, 1), 0);
    /* used in this iteration (no copy: a pageable read would wait for the paused stream) */
    cr_assert_eq(kvvm_seq_prepare_write(kv, e, 0, 1), 0);
    cr_assert_eq(kvvm_step(kv), 0);              /* unprotected, the fence not reached */
    /* the drop as reclaim makes it from its thread (no wait: a direct reclaim would wait
       for the fence, i.e. for the paused stream) */
    emu_ctx_on(ord);
    pthread_mutex_lock(&kv->lock);
    struct pg_drop_done d;                       /* (reclaim's drop, not kept) */
    int rc = paging_reclaim_drop(kv->pg, e, false, false, NULL, &d);
    pthread_mutex_unlock(&kv->lock);
    emu_ctx_off(ord);
    cr_assert_eq(rc, 0, "drop: %d", rc);
    cr_assert_eq(info(e).dropped, 1);
    cr_assert(mapped(e, 0, 0), "a dropped page was unmapped before the step fence");
    check("drop pending");
    cr_assert_eq(emu_stream_set_paused((kcu_stream)st, 0), 0);
    cr_assert_eq(kvvm_sync(kv), 0);
    cr_assert(!mapped(e, 0, 0));
    check("drop done");
    cr_assert_eq(kvvm_set_stream(kv, NULL), 0);
}

/* PINNED is never moved by reclaim; an explicit swap_out still moves it. */
Test(classes, pinned_never_moved_by_reclaim)
{
    struct kvvm_config c;
    cfg_base(&c);
    c.host_budget = 64 * 64 * KiB;
    c.flags = KVVM_F_AUTO_SWAP;
    open_cfg(&c);
    kvvm_seq p = mkseq(8, 20 * TPP);
    cr_assert_eq(kvvm_seq_set_class(kv, p, KVVM_SEQ_PINNED), 0);
    cr_assert_eq(kvvm_step(kv), 0);
    cr_assert_eq(kvvm_step(kv), 0);
    kvvm_seq x;
    cr_assert_eq(kvvm_seq_create(kv, &x), 0);
    kvvm_seq both[2] = { p, x };
    struct snap sn;
    snap(&sn, both, 2);
    cr_assert_eq(kvvm_seq_grow(kv, x, 20 * TPP), -ENOMEM);   /* 40 > 24 free */
    expect_same(&sn, both, 2, "pinned not moved");
    for (int i = 0; i < 4; i++)
        cr_assert_eq(kvvm_step(kv), 0);
    cr_assert_eq(kvvm_sync(kv), 0);              /* background rounds included */
    cr_assert(info(p).resident, "reclaim moved a pinned sequence");
    cr_assert_eq(kvvm_seq_swap_out(kv, p), 0);
    cr_assert(!info(p).resident);
    cr_assert_eq(kvvm_seq_grow(kv, x, 20 * TPP), 0);
    check("pinned");
}

/* Fail every driver call of a drop in turn: each failure leaves the entry as it was (not
   dropped, its bytes intact), and the drop then succeeds. The drop is the policy's call
   (paging_reclaim_drop, not kept: paging_seq_drop, as reclaim and kvvm_set_budget make
   it), made with the context's lock held and its device context current (drop_enter /
   drop_leave). */
static void drop_setup(void *arg)
{
    struct csweep *w = arg;
    struct kvvm_config c;
    cfg_base(&c);
    csweep_open(w, &c);
    kvvm_seq e = mkseq(12, 3 * TPP + 7), l;
    cr_assert_eq(kvvm_seq_create(kv, &l), 0);
    cr_assert_eq(kvvm_seq_share(kv, l, e, 2 * TPP), 0);
    cr_assert_eq(kvvm_seq_set_class(kv, e, KVVM_SEQ_CACHED), 0);
    cr_assert_eq(kvvm_step(kv), 0);          /* unprotected, work maybe pending */
    w->seq[0] = e;
    w->seq[1] = l;
    snap(&w->sn, w->seq, 2);
}

static void drop_enter(void *arg)
{
    (void)arg;
    emu_ctx_on(ord);
    pthread_mutex_lock(&kv->lock);
}

static void drop_leave(void *arg)
{
    (void)arg;
    pthread_mutex_unlock(&kv->lock);
    emu_ctx_off(ord);
}

static int drop_call(void *arg)
{
    struct csweep *w = arg;
    struct pg_drop_done d;
    return paging_reclaim_drop(kv->pg, w->seq[0], false, true, NULL, &d);
}

static enum th_sweep_outcome drop_after(void *arg, int rc, const char *where)
{
    struct csweep *w = arg;
    kvvm_seq e = w->seq[0], l = w->seq[1];
    if (rc) {
        cr_assert_neq(rc, -EIO, "%s killed the context", where);
        expect_same(&w->sn, w->seq, 2, where);
        verify(e, 12, 0, 3 * TPP + 7, where);
        drop_enter(w);
        int rc2 = drop_call(w);
        drop_leave(w);
        cr_assert_eq(rc2, 0, "%s: the retry failed: %d", where, rc2);
    }
    cr_assert_eq(info(e).dropped, 1);
    verify(l, 12, 0, 2 * TPP, "the sharer");
    cr_assert_eq(kvvm_sync(kv), 0);
    check("sweep end");
    return rc ? TH_SWEEP_FAILED : TH_SWEEP_ABSORBED;
}

static void drop_sweep(bool stream)
{
    struct csweep w = { .stream = stream };
    const struct th_sweep sw = { stream ? "drop stream" : "drop sync", &w, drop_setup,
                                 drop_call, csweep_teardown, NULL, drop_after, NULL, 0,
                                 drop_enter, drop_leave };
    th_sweep_run(&sw);
}

Test(classes, fault_sweep_drop_sync)
{
    TH_DEADLINE(300);
    drop_sweep(false);
}

Test(classes, fault_sweep_drop_stream)
{
    TH_DEADLINE(300);
    drop_sweep(true);
}

/* ======================================================================== budget */

/* kvvm_set_budget's shrink drops CACHED sequences before it would swap a LIVE one, and
   never moves a PINNED one (docs/api.md "Elastic device memory"). No host tier: a LIVE
   sequence cannot move at all, so the shrink succeeds only through the drop. */
TestSuite(budget, .fini = fini);

Test(budget, drops_cached_before_live_and_never_pinned)
{
    struct kvvm_config c;
    cfg_base(&c);
    open_cfg(&c);
    kvvm_seq l = mkseq(21, 8 * TPP), e = mkseq(22, 8 * TPP);    /* 16 pages each */
    cr_assert_eq(kvvm_seq_set_class(kv, e, KVVM_SEQ_CACHED), 0);
    cr_assert_eq(kvvm_step(kv), 0);                             /* neither protected */
    /* 32 pages in use: 16 fit only if e goes */
    cr_assert_eq(kvvm_set_budget(kv, 16 * 64 * KiB), 0, "%s", kvvm_last_error());
    cr_assert_eq(kvvm_sync(kv), 0);
    struct kvvm_stats st = stats();
    cr_assert_eq(st.cache_drops, 1);
    cr_assert_eq(st.swap_outs, 0);
    cr_assert_eq(st.pages_device_total, 16);
    cr_assert_leq(st.device_bytes_held, 16 * 64 * KiB);
    cr_assert(info(e).dropped && info(l).resident && info(l).pages_device == 16);
    cr_assert_eq(kvvm_seq_grow(kv, e, 1), -ESTALE);
    verify(l, 21, 0, 8 * TPP, "after the shrink");
    check("after the shrink");
    /* a PINNED sequence is never moved by the budget: below its pages, -ENOMEM */
    cr_assert_eq(kvvm_seq_set_class(kv, l, KVVM_SEQ_PINNED), 0);
    cr_assert_eq(kvvm_step(kv), 0);
    cr_assert_eq(kvvm_set_budget(kv, 8 * 64 * KiB), -ENOMEM);
    st = stats();
    cr_assert_eq(st.pages_device_total, 16, "a refused shrink changed the budget");
    cr_assert(info(l).resident && info(l).pages_device == 16);
    verify(l, 21, 0, 8 * TPP, "after the refused shrink");
    check("after the refused shrink");
}

/* ======================================================================== regress */

/* Issue 18: a call that may move other sequences plans the whole reclaim, checks it, and
   only then acts (docs/design.md "Pressure and thresholds"). (The regress suite is
   declared above.) */

/* Bug: kvvm_set_budget's shrink with KVVM_F_CACHE_DEMOTE counted the CACHED sequence's
   frames as a drop (no room below) in its up-front check, then demoted it into the host
   slots the LIVE victim needed: -ENOMEM after the demotion. Dropping it and swapping the
   LIVE one out fits (issue 18, defect 1). */
Test(regress, set_budget_demoted_cached_then_failed_live)
{
    struct kvvm_config c;
    cfg_base(&c);
    c.host_budget = 8 * 64 * KiB;                 /* room for one of the two */
    c.flags = KVVM_F_CACHE_DEMOTE;                /* the shrink swaps without AUTO_SWAP */
    open_cfg(&c);
    kvvm_seq e = fill_cached(31, 4 * TPP);        /* 8 frames, least recently used */
    kvvm_seq l = mkseq(32, 4 * TPP);              /* 8 frames */
    kvvm_seq p = mkseq(33, TPP);                  /* 2 frames, never moved */
    cr_assert_eq(kvvm_seq_set_class(kv, p, KVVM_SEQ_PINNED), 0);
    cr_assert_eq(kvvm_step(kv), 0);
    int rc = kvvm_set_budget(kv, 2 * 64 * KiB);   /* only p's pages fit */
    cr_assert_eq(rc, 0, "set_budget: %d (%s)", rc, kvvm_last_error());
    cr_assert_eq(kvvm_sync(kv), 0);
    struct kvvm_seq_info ei = info(e), li = info(l), pi = info(p);
    cr_assert(ei.dropped, "the CACHED sequence is dropped, not demoted into l's slots");
    cr_assert(!li.resident && li.pages_host == 8, "the LIVE one is swapped out (host %u)",
              li.pages_host);
    cr_assert(pi.resident && pi.pages_device == 2);
    cr_assert_eq(stats().cache_demotes, 0);
    check("after the shrink");
    cr_assert_eq(kvvm_set_budget(kv, 64 * 64 * KiB), 0);
    verify(l, 32, 0, 4 * TPP, "the swapped LIVE sequence");
    verify(p, 33, 0, TPP, "the PINNED sequence");
}

/* A CACHED sequence d dropped by a grow of another, and a resident CACHED one e that a
   reclaim could drop; the device full. */
static void dropped_and_cached(kvvm_seq *d, kvvm_seq *e, kvvm_seq *l)
{
    *d = fill_cached(41, 4 * TPP);                /* 8 frames */
    *l = mkseq(42, 20 * TPP);                     /* 40 */
    kvvm_seq x;
    cr_assert_eq(kvvm_seq_create(kv, &x), 0);
    cr_assert_eq(kvvm_seq_grow(kv, x, 10 * TPP), 0);   /* 20 of 16 free: d is dropped */
    cr_assert(info(*d).dropped);
    *e = fill_cached(43, 2 * TPP);                /* the last 4 frames */
    cr_assert_eq(stats().pages_device_free, 0);
}

/* The calls that may move others, on the dropped d: -ESTALE, nothing moved. */
static void expect_stale_first(kvvm_seq d, const kvvm_seq *all, int n, const char *where)
{
    struct th_place before[4];
    char w[96];
    uint64_t len = 2 * TPP;
    uint8_t b[16] = { 0 };
    th_places(kv, all, n, before);
    int rc[5] = { kvvm_seq_grow(kv, d, len), kvvm_seq_grow_batch(kv, &d, &len, 1),
                  kvvm_seq_write(kv, d, 0, 0, b, sizeof b), kvvm_seq_prepare_write(kv, d, 0, 1),
                  kvvm_seq_swap_in(kv, d) };
    const char *name[5] = { "grow", "grow_batch", "write", "prepare_write", "swap_in" };
    for (int i = 0; i < 5; i++)
        cr_expect_eq(rc[i], -ESTALE, "%s: %s: %d, not -ESTALE", where, name[i], rc[i]);
    snprintf(w, sizeof w, "%s (the five calls)", where);
    th_places_same(kv, all, n, before, w);
    cr_assert_eq(stats().cache_drops, 1, "%s: only d was ever dropped", where);
    check(where);
}

/* Bug: kvvm_seq_grow of a dropped CACHED sequence that was then swapped out counted and
   made room first (the non-resident path), dropping another CACHED sequence, and only then
   returned -ESTALE (issue 18, defect 2). -ESTALE comes before any room is counted. */
Test(regress, grow_of_dropped_cached_reclaimed_before_estale)
{
    struct kvvm_config c;
    cfg_base(&c);
    c.host_budget = 16 * 64 * KiB;
    open_cfg(&c);
    kvvm_seq d, e, l;
    dropped_and_cached(&d, &e, &l);
    cr_assert_eq(kvvm_seq_swap_out(kv, d), 0);    /* an explicit swap-out of it */
    kvvm_seq all[3] = { d, e, l };
    expect_stale_first(d, all, 3, "swapped out");
    verify(e, 43, 0, 2 * TPP, "the CACHED sequence");
}

/* Bug: the same calls on a dropped CACHED sequence still resident checked their arguments
   against its length 0 before its staleness: kvvm_seq_prepare_write said -EINVAL where
   -ESTALE is due, and with a CACHED sequence to drop, dropped it first (issue 18,
   defect 2). */
Test(regress, prepare_write_of_dropped_cached_not_estale)
{
    struct kvvm_config c;
    cfg_base(&c);
    open_cfg(&c);
    kvvm_seq d, e, l;
    dropped_and_cached(&d, &e, &l);
    kvvm_seq all[3] = { d, e, l };
    expect_stale_first(d, all, 3, "resident");
    verify(e, 43, 0, 2 * TPP, "the CACHED sequence");
}

/* Bug: kvvm_seq_prepare_write needing several copy-on-write pages asked reclaim for one
   frame, dropped a CACHED sequence for it, and still failed -ENOMEM (kvvm_seq_write took
   the same path) (issue 18, defect 3). The copies are counted first: -ENOMEM with nothing
   dropped when they cannot fit, success when the drop covers them. */
Test(regress, prepare_write_cow_dropped_cached_then_enomem)
{
    struct kvvm_config c;
    cfg_base(&c);
    open_cfg(&c);
    kvvm_seq a = mkseq(51, 4 * TPP);              /* 8 frames */
    kvvm_seq f;
    cr_assert_eq(kvvm_seq_fork(kv, a, &f), 0);    /* shares all 8 */
    kvvm_seq e = fill_cached(52, TPP);            /* 2 frames */
    kvvm_seq l = mkseq(53, 27 * TPP);             /* 54: the device is full */
    cr_assert_eq(kvvm_step(kv), 0);
    cr_assert_eq(stats().pages_device_free, 0);
    kvvm_seq all[4] = { a, f, e, l };
    struct th_place before[4];
    th_places(kv, all, 4, before);
    /* 8 copies (4 pages x 2 regions); dropping e frees 2 */
    cr_assert_eq(kvvm_seq_prepare_write(kv, f, 0, 4 * TPP), -ENOMEM);
    th_places_same(kv, all, 4, before, "prepare_write");
    static uint8_t buf[4 * TPP * BPT];
    cr_assert_eq(kvvm_seq_write(kv, f, 0, 0, buf, sizeof buf), -ENOMEM);   /* 4 copies */
    th_places_same(kv, all, 4, before, "write");
    cr_assert_eq(stats().cache_drops, 0);
    verify(e, 52, 0, TPP, "the CACHED sequence");
    check("after the failed writes");
    /* two copies fit once e is dropped: then it is */
    cr_assert_eq(kvvm_step(kv), 0);               /* (the reads above protected e) */
    cr_assert_eq(kvvm_seq_prepare_write(kv, f, 0, TPP), 0, "%s", kvvm_last_error());
    cr_assert(info(e).dropped);
    verify(f, 51, 0, 4 * TPP, "the fork after its copies");
    check("after the copies");
}
