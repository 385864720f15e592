/*
 * tests/test_paging.c: the paging layer through the public API (include/kvvm.h,
 * docs/api.md): shared pages, copy-on-write, truncate, fork and share, failure atomicity
 * under injected driver failures, threads, and the paging side of stream mode, checked
 * against the emulated device's own tables (kvvm_debug_check) and with content cookies read
 * back through kvvm_seq_read (the shadow harness of tests/harness.h, shared with
 * tests/test_core.c, which has the context's errors, config, layout and options).
 *
 * Suites: cow (the copy-on-write matrix, share edges, the classic block-pool scenario),
 * sweep (the trace-driven fail-at-call-N sweep; it lists every injection point that breaks
 * a rule before failing), threads, regress (one test per fixed defect, named after it) and
 * the issue 9 ones (map_ahead_zero, stream_sync, pageable_buffers).
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#define KVVM_HARNESS_SHADOW
#include "harness.h"
#include "testing/kvvm_testing.h"

/* ================================================================ copy-on-write */

enum cow_mode { COW_FORK, COW_SHARE };
enum cow_where { W_FIRST, W_MIDDLE, W_LAST };
enum cow_who { WHO_PARENT, WHO_CHILD, WHO_APPEND };

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

    uint64_t pi = where == W_FIRST ? 0 : where == W_MIDDLE ? 2 : 4;
    switch (who) {
    case WHO_PARENT:
        write_page(&t, &p, pi, 2, true);
        break;
    case WHO_CHILD:
        write_page(&t, &ch, pi, 3, false);
        break;
    case WHO_APPEND:
        /* both append into the (shared, for fork) partial last page and beyond, then the
           child rewrites page pi */
        sh_grow_fill(&t, &p, 21, 4);
        sh_grow_fill(&t, &ch, 23, 5);
        sh_verify(&t, &p, w);
        sh_verify(&t, &ch, w);
        write_page(&t, &ch, pi, 6, false);
        break;
    }
    sh_verify(&t, &p, w);
    sh_verify(&t, &ch, w);
    tcheck(&t, w);
    tstats(&t, &s1);
    /* share copied the partial page 4: writing only it (not through prepare_write, whose
       straddling tokens reach page 3) splits nothing */
    if (!(mode == COW_SHARE && pi == 4 && who != WHO_PARENT))
        cr_expect_gt(s1.cow_copies, s0.cow_copies, "%s: no copy-on-write counted", w);
    tinfo(&t, p.h, &ip);
    tinfo(&t, ch.h, &ic);
    cr_expect_eq(ip.pages_shared, ic.pages_shared, "%s: sharers disagree", w);
    if (who == WHO_CHILD && !(mode == COW_SHARE && pi == 4))
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

/* A copy-on-write of a range is batched (cow.c): one scratch run, one wait, the remaps in
   runs. The driver calls of one prepare_write over n shared pages (one region, so each
   page is one copy) against n prepare_writes of one page each: fewer calls in all, one copy
   per run and one set-access per mapped run; the same pages copied, the same bytes after. */
static uint64_t cow_range_calls(bool one_call, uint32_t n, struct emu_calls *k,
                                uint64_t *copies)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 1, 512, 4, 64, 24);              /* 8 tokens per page */
    c.pool_thread = 0;          /* its refills would count among this thread's driver calls */
    topen(&t, &c);
    struct sh a, b;
    struct kvvm_stats s0, s1;
    sh_create(&t, &a);
    sh_grow_fill(&t, &a, 8 * n, 1);                /* n full pages */
    sh_fork(&t, &a, &b);                           /* every page shared */
    tstats(&t, &s0);
    emu_ctx_on(t.ord);
    cr_assert_eq(emu_calls_reset(t.ord), 0);
    if (one_call)
        cr_assert_eq(kvvm_seq_prepare_write(t.kv, a.h, 0, 8 * n), 0);
    for (uint32_t p = 0; !one_call && p < n; p++)
        cr_assert_eq(kvvm_seq_prepare_write(t.kv, a.h, 8 * p, 8 * (p + 1)), 0);
    uint64_t total = th_driver_calls(t.ord, k);
    emu_ctx_off(t.ord);
    tstats(&t, &s1);
    *copies = s1.cow_copies - s0.cow_copies;
    sh_fill(&t, &a, 0, 8 * n, 2);                 /* the writer's own pages now */
    sh_verify(&t, &a, "writer");
    sh_verify(&t, &b, "the other holder");
    tcheck(&t, "after the copy-on-write");
    sh_free(&t, &b);
    sh_free(&t, &a);
    tclose(&t);
    return total;
}

Test(cow, range_makes_fewer_driver_calls_than_single_pages)
{
    struct emu_calls kr, ks;
    uint64_t cr, cs;
    uint64_t range = cow_range_calls(true, 6, &kr, &cr);
    uint64_t single = cow_range_calls(false, 6, &ks, &cs);
    cr_expect_eq(cr, 6, "the range copied %lu pages", (unsigned long)cr);
    cr_expect_eq(cs, 6, "the single pages copied %lu pages", (unsigned long)cs);
    cr_expect_lt(range, single, "a copy-on-write of 6 pages made %lu driver calls, 6 of one "
                 "page %lu", (unsigned long)range, (unsigned long)single);
    cr_expect_eq(kr.cuMemcpyDtoDAsync, 1, "one run, %lu copies",
                 (unsigned long)kr.cuMemcpyDtoDAsync);
    cr_expect_eq(kr.cuMemSetAccess, 2, "the scratch run and the window run: %lu set-accesses",
                 (unsigned long)kr.cuMemSetAccess);
    cr_expect_eq(kr.cuMemUnmap, 2, "the scratch run and the window run: %lu unmaps",
                 (unsigned long)kr.cuMemUnmap);
    cr_expect_eq(ks.cuMemcpyDtoDAsync, 6, "%lu copies of single pages",
                 (unsigned long)ks.cuMemcpyDtoDAsync);
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

/* The sweep's checks (th_sweep_run calls them around each injected failure). */
struct sweep_run {
    struct sweep_state s;
    enum sweep_kind k;
    struct snap s0;         /* the state just before the armed call */
};

static void run_setup(void *arg)
{
    struct sweep_run *r = arg;
    sweep_setup(&r->s, r->k);
}

static int run_call(void *arg)
{
    struct sweep_run *r = arg;
    return sweep_call(&r->s, r->k);
}

static void run_teardown(void *arg)
{
    struct sweep_run *r = arg;
    sweep_teardown(&r->s);
}

static void run_before(void *arg)
{
    struct sweep_run *r = arg;
    struct sh *ss[3] = { &r->s.a, &r->s.b, &r->s.d };
    snap_take(&r->s.t, &r->s0, ss, 3);
}

/* Absorbed (a retry or a fallback): the library must have done the whole call correctly.
   Failed: nothing changed, not -EIO (a non-sticky error must not kill the context), and the
   same call then succeeds. */
static enum th_sweep_outcome run_after(void *arg, int rc, const char *w)
{
    struct sweep_run *r = arg;
    struct sweep_state *s = &r->s;
    bool failed = rc != 0;
    if (failed) {
        struct sh *ss[3] = { &s->a, &s->b, &s->d };
        UCHK(rc != -EIO, "%s: a non-sticky driver error killed the context", w);
        expect_unchanged(&s->t, &r->s0, ss, 3, w);
        rc = sweep_call(s, r->k);
        UCHK(rc == 0, "%s: the call failed again without injection: %d", w, rc);
    }
    if (r->k == SW_WRITE)
        memset(s->b.exp[1] + 5000, 0x3c, 3 * KB);
    tcheck(&s->t, w);
    sh_verify(&s->t, &s->a, w);
    sh_verify(&s->t, &s->b, w);
    return failed ? TH_SWEEP_FAILED : TH_SWEEP_ABSORBED;
}

static void sweep(enum sweep_kind k, const char *name)
{
    struct sweep_run r = { .k = k };
    const struct th_sweep sw = { name, &r, run_setup, run_call, run_teardown, run_before,
                                 run_after };
    th_sweep_run(&sw);
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
    tcheck(&s.t, "after the failed write");
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

/* ================================================================ regressions */

/* KVVM_F_SCRUB + map-ahead + stream mode, engine stream paused: a grow's scrub of frames
   that then leave the sequence (free, truncate, map-ahead stolen by another grow) must not
   reach an unmapped address once the stream runs. Regression: map-ahead frames were
   scrubbed on the engine stream and unmapped at once when dropped, so the queued memset
   hit an unmapped range (a sticky ILLEGAL_ADDRESS: the context died). */
/* Bug: dropped map-ahead frames were unmapped at once under their queued scrub. */
Test(regress, dropped_map_ahead_unmapped_under_queued_scrub)
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

/* As regress/dropped_map_ahead_unmapped_under_queued_scrub, the map-ahead frames taken by
   another sequence's grow (stolen: unmapped from the first sequence's window at once) while
   the engine stream is paused. */
/* Bug: map-ahead frames stolen by another grow were unmapped under their queued scrub. */
Test(regress, stolen_map_ahead_unmapped_under_queued_scrub)
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
/* Bug: a failed grow's undo unmapped pages whose scrub was still queued on the stream. */
Test(regress, grow_undo_unmapped_under_queued_scrub)
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
/* Bug: in synchronous mode every write and read called cuCtxSynchronize. */
Test(regress, sync_io_synchronized_device_every_call)
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
/* Bug: share's host copy ran on the legacy stream, waiting for every blocking stream. */
Test(regress, share_host_copy_on_legacy_stream)
{
    TH_DEADLINE(20);
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

/* Map-ahead is refilled in batches between a low and a high mark (seq.c,
   ahead_top_up), not one page per crossing: a sequence of 2 regions with map_ahead 4
   grows a page at a time across 12 pages; the refills after the first are one mapped run
   per region every third crossing (the mark is 2 left, back up to 4), so the grows make
   at most 2 + 2 * 12 / 3 set-accesses where a page-per-crossing refill made 2 + 2 * 12.
   Every frame is still mapped once (the maps are unchanged), and the bytes are right. */
Test(map_ahead, refilled_in_batches_between_marks)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 2, 512, 4, 128, 64);             /* 8 tokens per page */
    c.map_ahead = 4;
    c.pool_thread = 0;          /* its refills would count among this thread's driver calls */
    topen(&t, &c);
    struct sh s;
    struct emu_calls k;
    sh_create(&t, &s);
    sh_grow_fill(&t, &s, 4, 1);                   /* 1 page, 4 ahead */
    cr_assert_eq(kvvm_step(t.kv), 0);
    cr_assert_eq(emu_calls_reset(t.ord), 0);
    emu_ctx_on(t.ord);
    for (uint64_t p = 1; p <= 12; p++) {
        sh_grow(&t, &s, 8 * p + 4);              /* one page crossed per grow */
        cr_assert_eq(kvvm_step(t.kv), 0);        /* an engine's step: the pool refills */
    }
    th_driver_calls(t.ord, &k);
    emu_ctx_off(t.ord);
    cr_expect_leq(k.cuMemSetAccess, 2 + 2 * 12 / 3, "12 crossings with map_ahead 4: %lu "
                  "set-accesses (mapped runs)", (unsigned long)k.cuMemSetAccess);
    cr_expect_eq(k.cuMemMap, 2 * 12, "each new page's frame is mapped once per region: %lu "
                 "maps", (unsigned long)k.cuMemMap);
    sh_fill(&t, &s, 4, s.len, 2);
    sh_verify(&t, &s, "after the crossings");
    tcheck(&t, "map-ahead in batches");
    sh_free(&t, &s);
    tclose(&t);
}

/* An idle kvvm_step (no sequence used since the last step fence was recorded) records no
   new fence: the engine's work since then touches none of the sequences (docs/api.md
   "Protection"), so the fence already covers them; once it was found complete the step
   asks the driver nothing about it. It used to record and query the fence at every step
   (and on the emulated device each record woke the stream's worker: the idle step's
   system calls). A step after a use records again, and a sequence freed after idle steps
   is released at once (its epoch is quiet), with its pages back in the pool. */
Test(stream_step, idle_step_records_no_fence)
{
    struct kvvm_config c;
    struct tctx t;
    void *st = NULL;
    struct emu_calls k;
    tcfg(&c, KB, 2, 512, 4, 64, 16);
    c.pool_thread = 0;
    topen_stream(&t, &c, &st);
    struct sh a;
    sh_create(&t, &a);
    sh_grow_fill(&t, &a, 12, 1);
    cr_assert_eq(kvvm_step(t.kv), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);             /* the fence's work is done */
    cr_assert_eq(kvvm_step(t.kv), 0);             /* finds the fence complete */
    emu_ctx_on(t.ord);
    cr_assert_eq(emu_calls_reset(t.ord), 0);
    for (int i = 0; i < 10; i++)
        cr_assert_eq(kvvm_step(t.kv), 0);
    th_driver_calls(t.ord, &k);
    cr_expect_eq(k.cuEventRecord + k.cuEventQuery, 0, "10 idle steps: %lu records, %lu "
                 "queries of the step fence", (unsigned long)k.cuEventRecord,
                 (unsigned long)k.cuEventQuery);
    cr_assert_eq(emu_calls_reset(t.ord), 0);
    sh_grow_fill(&t, &a, 13, 2);                  /* a use: the next step records */
    cr_assert_eq(kvvm_step(t.kv), 0);
    th_driver_calls(t.ord, &k);
    emu_ctx_off(t.ord);
    cr_expect_eq(k.cuEventRecord, 1, "a step after a use recorded %lu fences",
                 (unsigned long)k.cuEventRecord);
    sh_verify(&t, &a, "after idle steps");        /* (a read: a use too) */
    cr_assert_eq(kvvm_step(t.kv), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(kvvm_step(t.kv), 0);         /* idle: the fence found complete */
    struct kvvm_stats s0, s1;
    tstats(&t, &s0);
    sh_free(&t, &a);
    tstats(&t, &s1);
    cr_expect_eq(s1.pages_device_free, s0.pages_device_free + 2 * 2, "a sequence freed after "
                 "idle steps gave %ld pages back at once (4 expected)",
                 (long)(s1.pages_device_free - s0.pages_device_free));
    tcheck(&t, "after idle steps");
    tclose_stream(&t, st);
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
Test(stream_sync, does_not_wait_for_other_streams)
{
    TH_DEADLINE(30);
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
Test(pageable_buffers, stream_mode_waits_for_their_copy)
{
    TH_DEADLINE(30);
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

/* KVVM_F_SCRUB after truncate then grow: the kept last page still held the truncated
   tokens' bytes, and the grow handed them out as new tokens (docs/api.md: new tokens read as
   zero). A grow within the kept page (which would otherwise grow in place) and one past it;
   in synchronous and stream mode, and on a forked sequence whose last page is shared (the
   grow copies it first: the parent keeps its bytes). */
static void scrub_tail_case(bool stream, bool forked)
{
    struct kvvm_config c;
    struct tctx t;
    void *st = NULL;
    tcfg(&c, KB, 2, 16, 4, 1024, 32);       /* 256 tokens a page */
    c.flags = KVVM_F_SCRUB;
    if (stream)
        topen_stream(&t, &c, &st);
    else
        topen(&t, &c);
    kvvm_seq a, b;
    uint8_t page[KB], back[KB];
    memset(page, 0xab, sizeof page);
    cr_assert_eq(kvvm_seq_create(t.kv, &a), 0);
    cr_assert_eq(kvvm_seq_grow(t.kv, a, 300), 0);          /* 2 pages a region */
    for (uint32_t r = 0; r < 2; r++)
        cr_assert_eq(kvvm_seq_write(t.kv, a, r, 0, page, KB), 0);
    b = a;
    if (forked)
        cr_assert_eq(kvvm_seq_fork(t.kv, a, &b), 0);
    cr_assert_eq(kvvm_seq_truncate(t.kv, b, 10), 0);
    cr_assert_eq(kvvm_seq_grow(t.kv, b, 200), 0);          /* within the kept page */
    for (uint32_t r = 0; r < 2; r++) {
        memset(back, 0x55, sizeof back);
        cr_assert_eq(kvvm_seq_read(t.kv, b, r, 0, back, 200 * 16), 0);
        cr_assert_eq(kvvm_sync(t.kv), 0);
        for (size_t i = 10 * 16; i < 200 * 16; i++)
            cr_assert_eq(back[i], 0, "grow(200), region %u: byte %zu (token %zu) holds a "
                         "truncated token's byte %#x", r, i, i / 16, back[i]);
    }
    cr_assert_eq(kvvm_seq_truncate(t.kv, b, 10), 0);
    cr_assert_eq(kvvm_seq_grow(t.kv, b, 1000), 0);
    for (uint32_t r = 0; r < 2; r++) {
        memset(back, 0x55, sizeof back);
        cr_assert_eq(kvvm_seq_read(t.kv, b, r, 0, back, KB), 0);
        cr_assert_eq(kvvm_sync(t.kv), 0);
        for (size_t i = 0; i < 10 * 16; i++)
            cr_assert_eq(back[i], 0xab, "region %u: kept byte %zu lost", r, i);
        for (size_t i = 10 * 16; i < KB; i++)
            cr_assert_eq(back[i], 0, "region %u: byte %zu (token %zu) holds a truncated "
                         "token's byte %#x", r, i, i / 16, back[i]);
        if (forked) {
            cr_assert_eq(kvvm_seq_read(t.kv, a, r, 0, back, KB), 0);
            cr_assert_eq(kvvm_sync(t.kv), 0);
            cr_assert_eq(memcmp(back, page, KB), 0, "region %u: the parent's page changed",
                         r);
        }
    }
    cr_assert_eq(kvvm_step(t.kv), 0);
    tcheck(&t, "scrub tail");
    if (stream)
        tclose_stream(&t, st);
    else
        tclose(&t);
}

/* Bug: KVVM_F_SCRUB: after writes, truncate(10) and grow(1000), tokens 10..255 of the kept
   page read the old bytes. */
Test(regress, scrub_left_truncated_bytes_in_kept_page)
{
    scrub_tail_case(false, false);
    scrub_tail_case(true, false);
    scrub_tail_case(false, true);
    scrub_tail_case(true, true);
}

/* The metadata bytes (kvvm_testing_metadata) of one sequence grown to len tokens in a
   context of max_tokens (8 regions, 16 bytes per token, small pages). */
static uint64_t meta_at(uint64_t max_tokens, uint64_t len, bool reuse)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, 4 * KB, 8, 16, 2, max_tokens, 8 * (max_tokens / 256 + 2));
    topen(&t, &c);
    kvvm_seq s;
    uint64_t b = 0;
    cr_assert_eq(kvvm_seq_create(t.kv, &s), 0);
    if (reuse) {                  /* the slot held a long sequence before */
        cr_assert_eq(kvvm_seq_grow(t.kv, s, max_tokens), 0);
        cr_assert_eq(kvvm_seq_free(t.kv, s), 0);
        cr_assert_eq(kvvm_seq_create(t.kv, &s), 0);
    }
    cr_assert_eq(kvvm_seq_grow(t.kv, s, len), 0);
    cr_assert_eq(kvvm_testing_metadata(t.kv, s, &b, NULL), 0);
    tcheck(&t, "metadata");
    cr_assert_eq(kvvm_seq_free(t.kv, s), 0);
    tclose(&t);
    return b;
}

/* Bug: a sequence's block tables were allocated for max_tokens when its slot was first
   taken (issue 19): a 1k-token sequence held ~3.6 KB of metadata at max_tokens 64k against
   304 B at 1k, for the same data. They follow the length now. */
Test(regress, block_tables_followed_max_tokens_not_the_length)
{
    uint64_t at1k = meta_at(1024, 1024, false), at64k = meta_at(65536, 1024, false);
    cr_expect_eq(at64k, at1k, "a 1k-token sequence holds %lu bytes of metadata at max_tokens "
                 "64k, %lu at 1k", (unsigned long)at64k, (unsigned long)at1k);
    uint64_t reused = meta_at(65536, 1024, true);
    cr_expect_eq(reused, at1k, "a 1k-token sequence in a slot a 64k one held: %lu bytes, %lu "
                 "in a fresh slot", (unsigned long)reused, (unsigned long)at1k);
    /* a long one's grow with it */
    uint64_t long_b = meta_at(65536, 65536, false);
    cr_expect_gt(long_b, at1k, "a 64k-token sequence: %lu bytes, a 1k one %lu",
                 (unsigned long)long_b, (unsigned long)at1k);
}
