/*
 * tests/test_room.c: room is checked before anything moves, and kvvm_seq_need agrees with
 * what the calls then do (issue 9, defects 6-10). Each test builds a state, snapshots the
 * stats and every sequence's kvvm_seq_info, makes the call, and asserts: it succeeds where
 * need() said it fits, and a call failing with -ENOMEM changed nothing.
 *
 * Emulated device in opaque mode, 4 KiB granules and pages, two regions, 1000 bytes per token
 * (7 tokens = 2 pages per region, 15 = 4, 19 = 5, 23 = 6, 31 = 8). Host marks are all 0 so
 * no background spilling moves pages behind the tests' back. Disk cases use a mkdtemp spill
 * directory under /var/tmp, removed at the end. Suites are named after the defects:
 * failed_swap_in (6; with write/prepare_write, whose copy-on-write after the swap-in is the
 * same rule), need_agrees (7), stream_enomem (8), last_sharer (9), grow_batch (10).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "harness.h"

#define NR 2
#define BPT 1000u
#define MAXTOK 64u
#define MAXS 8

static char dir[64];

static void cfg(struct kvvm_config *c, uint32_t dev, uint32_t host, uint32_t disk)
{
    th_config(c, KB, NR, BPT, 16, MAXTOK, dev, host, 0);
    c->spill_budget = 0;
    c->host_min = c->host_low = c->host_high = 0;
    if (disk) {
        snprintf(dir, sizeof dir, "/var/tmp/kvvm_test_room.XXXXXX");
        cr_assert(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
        c->spill_dir = dir;
        c->spill_budget = (size_t)disk * KB;
    }
}

struct sh {
    kvvm_seq h;
    uint64_t len;
    uint8_t exp[NR][MAXTOK * BPT];
};

struct t {
    kvvm *kv;
    struct sh *s[MAXS];
    int n;
    void *stream;
};

static void t_open(struct t *t, const struct kvvm_config *c)
{
    memset(t, 0, sizeof *t);
    int rc = kvvm_open(c, &t->kv);
    cr_assert_eq(rc, 0, "kvvm_open: %d", rc);
}

static void t_stream(struct t *t)
{
    cr_assert_eq(kvvm_stream_create(t->kv, &t->stream), 0);
    cr_assert_eq(kvvm_set_stream(t->kv, t->stream), 0);
}

static void t_close(struct t *t)
{
    char why[512] = "";
    cr_expect_eq(kvvm_debug_check(t->kv, why, sizeof why), 0, "at close: %s", why);
    for (int i = 0; i < t->n; i++) {
        cr_expect_eq(kvvm_seq_free(t->kv, t->s[i]->h), 0);
        free(t->s[i]);
    }
    if (t->stream)
        cr_assert_eq(kvvm_set_stream(t->kv, NULL), 0);
    kvvm_close(t->kv);
    if (dir[0]) {
        rmdir(dir);
        dir[0] = 0;
    }
}

static void check(struct t *t, const char *where)
{
    char why[512] = "";
    int rc = kvvm_debug_check(t->kv, why, sizeof why);
    cr_assert_eq(rc, 0, "%s: invariant violated (%d): %s", where, rc, why);
}

static struct sh *sh_new(struct t *t)
{
    struct sh *s = calloc(1, sizeof *s);
    cr_assert(s && t->n < MAXS);
    cr_assert_eq(kvvm_seq_create(t->kv, &s->h), 0);
    t->s[t->n++] = s;
    return s;
}

static void sh_grow_fill(struct t *t, struct sh *s, uint64_t len, uint32_t lin)
{
    int rc = kvvm_seq_grow(t->kv, s->h, len);
    cr_assert_eq(rc, 0, "grow to %llu: %d", (unsigned long long)len, rc);
    uint64_t a = s->len * BPT, b = len * BPT;
    for (uint32_t r = 0; r < NR; r++) {
        for (uint64_t o = a; o < b; o++)
            s->exp[r][o] = cookie(lin, r, o);
        cr_assert_eq(kvvm_seq_write(t->kv, s->h, r, a, s->exp[r] + a, b - a), 0);
    }
    s->len = len;
}

static struct sh *sh_fork(struct t *t, struct sh *p)
{
    struct sh *c = calloc(1, sizeof *c);
    cr_assert(c && t->n < MAXS);
    cr_assert_eq(kvvm_seq_fork(t->kv, p->h, &c->h), 0);
    c->len = p->len;
    memcpy(c->exp, p->exp, sizeof c->exp);
    t->s[t->n++] = c;
    return c;
}

static void sh_verify(struct t *t, struct sh *s, const char *where)
{
    static uint8_t buf[MAXTOK * BPT];
    for (uint32_t r = 0; r < NR && s->len; r++) {
        int rc = kvvm_seq_read(t->kv, s->h, r, 0, buf, s->len * BPT);
        cr_assert_eq(rc, 0, "%s: read: %d", where, rc);
        cr_assert(memcmp(buf, s->exp[r], s->len * BPT) == 0, "%s: region %u bytes differ",
                  where, r);
    }
}

static void t_out(struct t *t, struct sh *s)
{
    int rc = kvvm_seq_swap_out(t->kv, s->h);
    cr_assert_eq(rc, 0, "swap_out: %d (%s)", rc, kvvm_strerror(rc));
}

/* ---- "nothing changed" -------------------------------------------------------------- */

struct snap {
    struct kvvm_stats st;
    struct kvvm_seq_info in[MAXS];
};

static void snap(struct t *t, struct snap *sn)
{
    memset(sn, 0, sizeof *sn);
    sn->st.size = sizeof sn->st;
    cr_assert_eq(kvvm_stats(t->kv, &sn->st), 0);
    for (int i = 0; i < t->n; i++) {
        sn->in[i].size = sizeof sn->in[i];
        cr_assert_eq(kvvm_seq_info(t->kv, t->s[i]->h, &sn->in[i]), 0);
    }
}

#define SAME(f) cr_expect_eq(b.st.f, a->st.f, "%s: stats." #f " %llu -> %llu", where, \
                             (unsigned long long)a->st.f, (unsigned long long)b.st.f)
#define SAME_IN(f) cr_expect_eq(b.in[i].f, a->in[i].f, "%s: seq %d ." #f " %llu -> %llu", \
                                where, i, (unsigned long long)a->in[i].f,                \
                                (unsigned long long)b.in[i].f)

/* The state equals the snapshot a (tiers, counters, every sequence). */
static void unchanged(struct t *t, const struct snap *a, const char *where)
{
    struct snap b;
    snap(t, &b);
    SAME(pages_device_free); SAME(pages_host_free); SAME(pages_disk_free);
    SAME(pages_inflight); SAME(swap_outs); SAME(swap_ins); SAME(spills); SAME(unspills);
    SAME(bytes_to_host); SAME(bytes_to_device); SAME(bytes_to_disk); SAME(bytes_from_disk);
    SAME(pages_orphan); SAME(seqs_nonresident);
    for (int i = 0; i < t->n; i++) {
        SAME_IN(length); SAME_IN(pages_device); SAME_IN(pages_host); SAME_IN(pages_disk);
        SAME_IN(pages_shared); SAME_IN(resident);
    }
    check(t, where);
}

static void need(struct t *t, struct sh *s, uint64_t len, uint64_t *pages, int *fits)
{
    int rc = kvvm_seq_need(t->kv, s->h, len, pages, fits);
    cr_assert_eq(rc, 0, "need: %d", rc);
}

/* ================================================================ defect 6 */

/* A swap-in (and prefetch, read, write, which swap in first) that ends -ENOMEM had read the
   sequence's disk pages into the host tier, spilling another sequence's host pages for room,
   before finding no device frame for them. */
Test(failed_swap_in, moves_nothing)
{
    struct kvvm_config c;
    cfg(&c, 16, 8, 32);
    struct t t;
    t_open(&t, &c);
    struct sh *a = sh_new(&t), *b = sh_new(&t), *d = sh_new(&t);
    sh_grow_fill(&t, a, 7, 1);                  /* 4 pages */
    sh_grow_fill(&t, b, 15, 2);                 /* 8 pages */
    cr_assert_eq(kvvm_step(t.kv), 0);
    t_out(&t, a);                               /* a: host 4 */
    t_out(&t, b);                               /* spills a's 4 pages: a disk 4, b host 8 */
    cr_assert_eq(kvvm_sync(t.kv), 0);
    sh_grow_fill(&t, d, 31, 3);                 /* the device is full (16) */
    struct snap s0;
    snap(&t, &s0);
    cr_assert_eq(s0.in[0].pages_disk, 4, "a is on disk");
    cr_assert_eq(s0.in[1].pages_host, 8, "b fills the host tier");
    cr_assert_eq(s0.st.pages_device_free, 0);
    uint64_t pages;
    int fits;
    need(&t, a, 0, &pages, &fits);
    cr_assert_eq(fits, 0);
    static uint8_t buf[7 * BPT];
    const char *what[4] = { "swap_in", "prefetch", "read", "write" };
    for (int k = 0; k < 4; k++) {
        int rc = k == 0 ? kvvm_seq_swap_in(t.kv, a->h)
               : k == 1 ? kvvm_seq_prefetch(t.kv, a->h)
               : k == 2 ? kvvm_seq_read(t.kv, a->h, 0, 0, buf, sizeof buf)
                        : kvvm_seq_write(t.kv, a->h, 0, 0, a->exp[0], 1000);
        cr_assert_eq(rc, -ENOMEM, "%s onto a full device: %d", what[k], rc);
        unchanged(&t, &s0, what[k]);
    }
    /* nothing lost: with d gone everything comes back */
    cr_assert_eq(kvvm_seq_truncate(t.kv, d->h, 0), 0);
    d->len = 0;
    cr_assert_eq(kvvm_step(t.kv), 0);
    sh_verify(&t, a, "a");
    sh_verify(&t, b, "b");
    t_close(&t);
}

/* ================================================================ defect 7 */

/* (a) need() subtracted the sequence's own map-ahead frames from the pages a grow needs,
   while pages_device_free counts them as free already: fits = 1 for a grow that then failed
   -ENOMEM. */
Test(need_agrees, map_ahead_counted_once)
{
    struct kvvm_config c;
    cfg(&c, 16, 0, 0);
    c.map_ahead = 2;
    struct t t;
    t_open(&t, &c);
    struct sh *a = sh_new(&t), *b = sh_new(&t);
    sh_grow_fill(&t, a, 7, 1);                  /* 4 pages + 2 x 2 mapped ahead */
    sh_grow_fill(&t, b, 15, 2);                 /* 8 pages: only a's map-ahead is free */
    struct snap s0;
    snap(&t, &s0);
    cr_assert_eq(s0.st.pages_device_free, 4);
    uint64_t pages;
    int fits;
    need(&t, a, 23, &pages, &fits);             /* 2 -> 6 pages per region: 8 frames */
    cr_expect_eq(pages, 8, "need: %llu pages", (unsigned long long)pages);
    int rc = kvvm_seq_grow(t.kv, a->h, 23);
    cr_assert(rc == 0 || rc == -ENOMEM, "grow: %d", rc);
    cr_assert_eq(fits, rc == 0, "need says fits = %d, grow returns %d", fits, rc);
    unchanged(&t, &s0, "failed grow");
    /* a grow that fits by its map-ahead alone */
    need(&t, a, 15, &pages, &fits);
    cr_assert(fits && pages == 4, "need(15): %llu pages, fits %d", (unsigned long long)pages,
              fits);
    sh_grow_fill(&t, a, 15, 1);
    sh_verify(&t, a, "a");
    t_close(&t);
}

/* (b) Host tier and disk full, a sequence on disk, the device free: swap-in needs a host slot
   to stage through and could get none, so it failed -ENOMEM while need() said it fits. It
   now borrows a host slot (its page parked in a spare device frame meanwhile); need() counts
   that frame, and where the device has no spare frame need() says it does not fit and the
   call changes nothing. */
static void full_below(uint32_t dev)
{
    struct kvvm_config c;
    cfg(&c, dev, 4, 8);
    struct t t;
    t_open(&t, &c);
    struct sh *a = sh_new(&t), *b = sh_new(&t);
    sh_grow_fill(&t, a, 15, 1);                 /* 8 pages */
    cr_assert_eq(kvvm_step(t.kv), 0);
    t_out(&t, a);                               /* staged: disk 8 (full) */
    sh_grow_fill(&t, b, 7, 2);                  /* 4 pages */
    cr_assert_eq(kvvm_step(t.kv), 0);
    t_out(&t, b);                               /* host 4 (full) */
    cr_assert_eq(kvvm_sync(t.kv), 0);
    struct snap s0;
    snap(&t, &s0);
    cr_assert(s0.st.pages_host_free == 0 && s0.st.pages_disk_free == 0 &&
              s0.st.pages_device_free == dev, "host %llu disk %llu device %llu free",
              (unsigned long long)s0.st.pages_host_free,
              (unsigned long long)s0.st.pages_disk_free,
              (unsigned long long)s0.st.pages_device_free);
    cr_assert_eq(s0.in[0].pages_disk, 8);
    uint64_t pages;
    int fits;
    need(&t, a, 0, &pages, &fits);
    int rc = kvvm_seq_swap_in(t.kv, a->h);
    cr_assert(rc == 0 || rc == -ENOMEM, "swap_in: %d", rc);
    cr_assert_eq(fits, rc == 0, "need says %llu pages, fits = %d; swap_in returns %d",
                 (unsigned long long)pages, fits, rc);
    if (rc) {
        unchanged(&t, &s0, "failed swap-in");
    } else {
        struct kvvm_seq_info in;
        in.size = sizeof in;
        cr_assert_eq(kvvm_seq_info(t.kv, b->h, &in), 0);
        cr_assert(!in.resident && in.pages_host == 4, "b was moved: host %u", in.pages_host);
        check(&t, "staged through a borrowed slot");
        sh_verify(&t, a, "a");
    }
    cr_assert_eq(kvvm_step(t.kv), 0);
    cr_assert_eq(kvvm_seq_truncate(t.kv, a->h, 0), 0);
    a->len = 0;
    cr_assert_eq(kvvm_step(t.kv), 0);
    sh_verify(&t, b, "b");
    t_close(&t);
}

Test(need_agrees, disk_seq_into_free_device) { full_below(32); }
Test(need_agrees, disk_seq_device_exactly_its_size) { full_below(8); }

/* ================================================================ defect 8 */

/* Stream mode: the host tier is held only by transfers already started (a swap-out's copies
   still to be reaped; a swap-in's, whose host slots come free at completion). swap_out
   returned -ENOMEM although the room would be there once they complete; it now waits for
   them (include/kvvm.h, kvvm_seq_swap_out). */
Test(stream_enomem, swap_out_behind_inflight_swap_out)
{
    struct kvvm_config c;
    cfg(&c, 32, 8, 32);
    struct t t;
    t_open(&t, &c);
    t_stream(&t);
    struct sh *a = sh_new(&t), *b = sh_new(&t);
    sh_grow_fill(&t, a, 15, 1);                 /* 8 pages */
    sh_grow_fill(&t, b, 7, 2);                  /* 4 pages */
    cr_assert_eq(kvvm_step(t.kv), 0);
    t_out(&t, a);                               /* host 8, copies in flight */
    int rc = kvvm_seq_swap_out(t.kv, b->h);     /* a's host pages can spill once copied */
    cr_assert_eq(rc, 0, "swap_out with the host tier in flight: %d", rc);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    check(&t, "after");
    sh_verify(&t, a, "a");
    sh_verify(&t, b, "b");
    t_close(&t);
}

Test(stream_enomem, swap_out_behind_inflight_swap_in)
{
    struct kvvm_config c;
    cfg(&c, 32, 8, 0);
    struct t t;
    t_open(&t, &c);
    t_stream(&t);
    struct sh *a = sh_new(&t), *b = sh_new(&t);
    sh_grow_fill(&t, a, 15, 1);                 /* 8 pages */
    sh_grow_fill(&t, b, 7, 2);                  /* 4 pages */
    cr_assert_eq(kvvm_step(t.kv), 0);
    t_out(&t, a);
    cr_assert_eq(kvvm_sync(t.kv), 0);           /* host 8 (full) */
    cr_assert_eq(kvvm_seq_swap_in(t.kv, a->h), 0);   /* slots free when the copies are done */
    cr_assert_eq(kvvm_step(t.kv), 0);
    cr_assert_eq(kvvm_step(t.kv), 0);
    int rc = kvvm_seq_swap_out(t.kv, b->h);
    cr_assert_eq(rc, 0, "swap_out with the host tier in flight: %d", rc);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    check(&t, "after");
    sh_verify(&t, a, "a");
    sh_verify(&t, b, "b");
    t_close(&t);
}

/* ================================================================ defect 9 */

/* Stream mode: fork a -> b, swap out a (its job pending, holding a reference on the shared
   pages), then b: the pages b's swap-out must move down were counted with the job's
   reference as a holder, so they stayed on the device for good (orphans; a later grow
   without auto-swap failed). */
static void last_sharer(bool stream)
{
    struct kvvm_config c;
    cfg(&c, 8, 16, 0);
    struct t t;
    t_open(&t, &c);
    if (stream)
        t_stream(&t);
    struct sh *a = sh_new(&t);
    sh_grow_fill(&t, a, 7, 1);                  /* 4 pages */
    struct sh *b = sh_fork(&t, a);
    cr_assert_eq(kvvm_step(t.kv), 0);
    t_out(&t, a);
    t_out(&t, b);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    struct snap s;
    snap(&t, &s);
    cr_expect_eq(s.st.pages_device_free, 8, "device free %llu of 8",
                 (unsigned long long)s.st.pages_device_free);
    cr_expect_eq(s.st.pages_orphan, 0);
    cr_expect(s.in[1].pages_host == 4 && s.in[1].pages_device == 0,
              "b: host %u device %u", s.in[1].pages_host, s.in[1].pages_device);
    struct sh *d = sh_new(&t);
    sh_grow_fill(&t, d, 15, 3);                 /* the whole device, no auto-swap */
    check(&t, "after");
    cr_assert_eq(kvvm_seq_truncate(t.kv, d->h, 0), 0);
    d->len = 0;
    cr_assert_eq(kvvm_step(t.kv), 0);
    sh_verify(&t, a, "a");
    sh_verify(&t, b, "b");
    t_close(&t);
}

Test(last_sharer, swap_out_moves_shared_sync) { last_sharer(false); }
Test(last_sharer, swap_out_moves_shared_stream) { last_sharer(true); }

/* ================================================================ defect 10 */

/* A grow_batch that fails -ENOMEM swapped its swapped-out sequences in before checking the
   room (single grow checks first), then had to swap them out again: state changed by a
   failed call. */
Test(grow_batch, failed_leaves_swapped_out)
{
    struct kvvm_config c;
    cfg(&c, 16, 16, 0);
    struct t t;
    t_open(&t, &c);
    struct sh *a = sh_new(&t), *b = sh_new(&t), *e = sh_new(&t);
    sh_grow_fill(&t, a, 7, 1);                  /* 4 pages */
    cr_assert_eq(kvvm_step(t.kv), 0);
    t_out(&t, a);
    sh_grow_fill(&t, b, 15, 2);                 /* 8 pages */
    sh_grow_fill(&t, e, 7, 3);                  /* 4 pages: 4 free */
    cr_assert_eq(kvvm_step(t.kv), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    struct snap s0;
    snap(&t, &s0);
    cr_assert_eq(s0.st.pages_device_free, 4);
    kvvm_seq hs[2] = { a->h, b->h };
    uint64_t lens[2] = { 7, 23 };               /* a back (4), b + 4: 8 > 4 */
    int rc = kvvm_seq_grow_batch(t.kv, hs, lens, 2);
    cr_assert_eq(rc, -ENOMEM, "grow_batch: %d", rc);
    unchanged(&t, &s0, "failed grow_batch");
    /* a batch that fits still swaps in */
    lens[1] = 15;
    cr_assert_eq(kvvm_seq_grow_batch(t.kv, hs, lens, 2), 0);
    sh_verify(&t, a, "a");
    sh_verify(&t, b, "b");
    t_close(&t);
}

/* The same rule in write and prepare_write (defect 6's family): they swapped a sequence in,
   then found no frame for the copy-on-write of a shared page they write, and swapped it out
   again (counters changed, and pages that were on disk came back to the host tier). */
static void cow_after_swap_in(bool prepare)
{
    struct kvvm_config c;
    cfg(&c, 12, 16, 0);
    struct t t;
    t_open(&t, &c);
    struct sh *a = sh_new(&t);
    sh_grow_fill(&t, a, 7, 1);                  /* 2 pages per region */
    struct sh *b = sh_fork(&t, a);
    sh_grow_fill(&t, a, 15, 2);                 /* a: page 0 shared, pages 1-3 its own */
    cr_assert_eq(kvvm_step(t.kv), 0);
    t_out(&t, a);                               /* its 6 pages to the host */
    struct sh *e = sh_new(&t);
    sh_grow_fill(&t, e, 3, 3);                  /* 4 + 2 used: 6 free, a's swap-in */
    cr_assert_eq(kvvm_step(t.kv), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    struct snap s0;
    snap(&t, &s0);
    cr_assert_eq(s0.st.pages_device_free, 6);
    cr_assert_eq(s0.in[0].pages_host, 6);
    /* token 0 lies in the shared page 0: the write must copy it, no frame is left */
    int rc = prepare ? kvvm_seq_prepare_write(t.kv, a->h, 0, 1)
                     : kvvm_seq_write(t.kv, a->h, 0, 0, a->exp[0], 100);
    cr_assert_eq(rc, -ENOMEM, "%s: %d", prepare ? "prepare_write" : "write", rc);
    unchanged(&t, &s0, prepare ? "prepare_write" : "write");
    cr_assert_eq(kvvm_seq_truncate(t.kv, e->h, 0), 0);
    e->len = 0;
    cr_assert_eq(kvvm_step(t.kv), 0);
    sh_verify(&t, a, "a");
    sh_verify(&t, b, "b");
    t_close(&t);
}

Test(failed_swap_in, write_cow_moves_nothing) { cow_after_swap_in(false); }
Test(failed_swap_in, prepare_write_cow_moves_nothing) { cow_after_swap_in(true); }

/* ================================================================ issue 18, lead 1 */

/* Bug: kvvm_seq_need counted a grow within the partial last page (its copy-on-write copies)
   against pages_device_free, which includes the sequence's own map-ahead frames, but the
   grow took its frames from the pool without them: need said fits = 1 and the grow failed
   -ENOMEM (issue 18, the first unreduced lead: map-ahead 1, a shared partial page; the
   discard, truncate, stream mode and page size of the report only set the numbers).
   kvvm_seq_write and kvvm_seq_prepare_write failed the same way. A grow or a copy now takes
   the sequence's own surplus map-ahead back when the rest of the pool cannot supply it. */

/* a: 2 pages a region (the last partial, shared with its fork *f) and a page mapped ahead;
   the budget shrunk so that only a's map-ahead is free. */
static void own_ahead_setup(struct t *t, struct sh **a, struct sh **f)
{
    struct kvvm_config c;
    cfg(&c, 48, 0, 0);
    c.map_ahead = 1;
    c.pool_thread = 0;
    t_open(t, &c);
    struct sh *d = sh_new(t);
    *a = sh_new(t);
    sh_grow_fill(t, d, MAXTOK, 1);              /* the slot full: no map-ahead */
    cr_assert_eq(kvvm_step(t->kv), 0);          /* (the pool refills: frames to map ahead) */
    sh_grow_fill(t, *a, 6, 2);
    *f = sh_fork(t, *a);
    struct kvvm_stats st;
    st.size = sizeof st;
    cr_assert_eq(kvvm_stats(t->kv, &st), 0);
    uint64_t addr;
    cr_assert_eq(kvvm_seq_addr(t->kv, (*a)->h, 0, &addr), 0);
    cr_assert_eq(emu_lookup(addr + 2 * KB, NULL, NULL, NULL), 0, "a maps a page ahead");
    int rc = kvvm_set_budget(t->kv, (size_t)(st.pages_device_total - st.pages_device_free +
                                             NR) * KB);
    cr_assert_eq(rc, 0, "set_budget: %d (%s)", rc, kvvm_last_error());
    cr_assert_eq(emu_lookup(addr + 2 * KB, NULL, NULL, NULL), 0, "a still maps it");
    struct snap s0;
    snap(t, &s0);
    cr_assert_eq(s0.st.pages_device_free, NR, "only a's map-ahead is free: %llu",
                 (unsigned long long)s0.st.pages_device_free);
}

Test(regress, need_fits_but_grow_copy_lacked_own_map_ahead)
{
    struct t t;
    struct sh *a, *f;
    own_ahead_setup(&t, &a, &f);
    uint64_t pages;
    int fits;
    need(&t, a, 7, &pages, &fits);              /* the two copies of the shared last page */
    int rc = kvvm_seq_grow(t.kv, a->h, 7);
    cr_assert_eq(fits, rc == 0, "need says %llu pages, fits = %d; grow returns %d",
                 (unsigned long long)pages, fits, rc);
    cr_assert_eq(rc, 0, "grow: %d", rc);
    sh_verify(&t, a, "a");
    sh_verify(&t, f, "f");
    check(&t, "after the grow");
    t_close(&t);
}

Test(regress, prepare_write_copy_lacked_own_map_ahead)
{
    struct t t;
    struct sh *a, *f;
    own_ahead_setup(&t, &a, &f);
    cr_assert_eq(kvvm_seq_prepare_write(t.kv, a->h, 5, 6), 0, "%s", kvvm_last_error());
    sh_verify(&t, a, "a");
    sh_verify(&t, f, "f");
    check(&t, "after the copies");
    t_close(&t);
}

/* ================================================================ issue 18, the plan's room */

/* A context for a reclaim plan's test: no watermark (nothing moves behind the test's back),
   no pool thread. */
static void t_open_plan(struct t *t, uint32_t dev, uint32_t host, uint32_t disk, unsigned flags)
{
    struct kvvm_config c;
    cfg(&c, dev, host, disk);
    c.flags = flags;
    c.device_min = c.device_low = c.device_high = 0;
    c.pool_thread = 0;
    t_open(t, &c);
}

/* f pinned (never a victim), the others unprotected and idle; *s0 the state, the device
   full. */
static void pin_settle(struct t *t, struct sh *f, struct snap *s0)
{
    cr_assert_eq(kvvm_seq_set_class(t->kv, f->h, KVVM_SEQ_PINNED), 0);
    cr_assert_eq(kvvm_step(t->kv), 0);
    cr_assert_eq(kvvm_sync(t->kv), 0);
    snap(t, s0);
    cr_assert_eq(s0->st.pages_device_free, 0, "the device is full");
}

/* Bug: the reclaim plan counted a victim's move as staged to disk (the host tier too small
   for it, the disk large enough), but acting on it first spilled other host pages to make
   host room for every move at once: that took the disk slots the staged move was counted
   on, the swap-out was refused, and the call failed -ENOMEM with another sequence's pages
   moved to disk. Each move now makes its own room, as the plan chose for it. */
Test(regress, plan_spilled_ahead_then_staged_victim_refused)
{
    struct t t;
    t_open_plan(&t, 24, 8, 14, KVVM_F_AUTO_SWAP);
    struct sh *x = sh_new(&t), *v = sh_new(&t), *f = sh_new(&t), *y = sh_new(&t);
    sh_grow_fill(&t, x, 7, 1);                  /* 2 pages a region: 4 */
    cr_assert_eq(kvvm_step(t.kv), 0);
    t_out(&t, x);                               /* host 4 of 8 */
    sh_grow_fill(&t, v, 23, 2);                 /* 6 pages a region: 12, the victim */
    sh_grow_fill(&t, f, 23, 3);                 /* 12: the device is full */
    struct snap s0;
    pin_settle(&t, f, &s0);
    cr_assert_eq(s0.st.pages_host_free, 4);
    int rc = kvvm_seq_grow(t.kv, y->h, 23);     /* 12: v must go, staged (12 > 8 host) */
    cr_assert_eq(rc, 0, "grow: %d (%s)", rc, kvvm_last_error());
    struct kvvm_seq_info in;
    in.size = sizeof in;
    cr_assert_eq(kvvm_seq_info(t.kv, v->h, &in), 0);
    cr_assert(!in.resident && in.pages_disk == 12, "v staged to disk: disk %u host %u",
              in.pages_disk, in.pages_host);
    cr_assert_eq(kvvm_seq_info(t.kv, x->h, &in), 0);
    cr_assert_eq(in.pages_host, 4, "x stays in the host tier");
    check(&t, "after the grow");
    cr_assert_eq(kvvm_seq_truncate(t.kv, y->h, 0), 0);
    y->len = 0;
    cr_assert_eq(kvvm_step(t.kv), 0);
    sh_verify(&t, x, "x");
    t_close(&t);
}

/* Bug: the reclaim plan for a swap-in counted no frame freed for a page the caller (swapped
   out) shares with a victim, since the caller maps it again: but that victim's swap-out was
   the page's last resident holder and took it down, so the caller then needed one more
   frame than counted; acting on the plan made only the frames counted free (the siblings'
   pages left behind as orphans were moved only up to that), and the swap-in failed -ENOMEM
   after the victims had moved. The frames made free now include the caller's pages that
   went down. */
Test(regress, plan_took_callers_shared_page_down_then_swap_in_short)
{
    struct t t;
    t_open_plan(&t, 16, 32, 0, KVVM_F_AUTO_SWAP);
    struct sh *v = sh_new(&t);
    sh_grow_fill(&t, v, 7, 1);                  /* 2 pages a region: 4 */
    struct sh *cs = sh_fork(&t, v);
    sh_grow_fill(&t, cs, 15, 2);                /* shares page 0 of each region with v: 6 own */
    cr_assert_eq(kvvm_step(t.kv), 0);
    t_out(&t, cs);                              /* its 6 own pages to the host; 2 stay (v) */
    struct sh *x = sh_new(&t);
    sh_grow_fill(&t, x, 15, 3);                 /* 8 */
    struct sh *y = sh_fork(&t, x);              /* x's sibling: shares all 8 */
    struct sh *f = sh_new(&t);
    sh_grow_fill(&t, f, 7, 4);                  /* 4: the device is full */
    struct snap s0;
    pin_settle(&t, f, &s0);
    cr_assert_eq(s0.in[1].pages_host, 6, "cs: 6 pages in the host tier");
    cr_assert_eq(s0.in[1].pages_device, 2, "cs: 2 pages shared with v on the device");
    /* need 6: v (least recently used) goes first and takes cs's 2 shared pages down with
       it (2 frames counted), x frees none (y maps its pages), y's pages stay behind x's
       copies and are moved as orphans */
    int rc = kvvm_seq_swap_in(t.kv, cs->h);
    cr_assert_eq(rc, 0, "swap_in: %d (%s)", rc, kvvm_last_error());
    struct kvvm_seq_info in;
    in.size = sizeof in;
    cr_assert_eq(kvvm_seq_info(t.kv, v->h, &in), 0);
    cr_assert(!in.resident, "v was the least recently used victim");
    check(&t, "after the swap-in");
    sh_verify(&t, cs, "cs");
    cr_assert_eq(kvvm_step(t.kv), 0);           /* cs unprotected: v and y come back */
    sh_verify(&t, v, "v");
    cr_assert_eq(kvvm_step(t.kv), 0);
    sh_verify(&t, y, "y");
    t_close(&t);
}

/* Bug: the reclaim plan counted the pages an earlier victim's swap-out put in the host tier
   as spillable at once (room for a later victim, direct after spilling them), but acting on
   it starts each swap-out's copies without waiting, and paging spills a host page only once
   its copy has completed: the later victim's swap-out was refused, and kvvm_set_budget
   failed -ENOMEM after the earlier victims had moved. A swap-out the host tier cannot take
   as it is now waits for the copies started. */
Test(regress, plan_spilled_victims_pages_still_copying)
{
    struct t t;
    t_open_plan(&t, 16, 8, 32, 0);              /* host: 8 slots */
    struct sh *a = sh_new(&t), *b = sh_new(&t), *v = sh_new(&t), *f = sh_new(&t);
    sh_grow_fill(&t, a, 7, 1);                  /* 2 pages a region: 4, least recently used */
    sh_grow_fill(&t, b, 7, 2);                  /* 4 */
    sh_grow_fill(&t, v, 3, 3);                  /* 1 page a region: 2 */
    sh_grow_fill(&t, f, 11, 4);                 /* 6: the device is full */
    struct snap s0;
    pin_settle(&t, f, &s0);
    cr_assert_eq(s0.st.pages_host_free, 8);
    /* 10 frames to free: a and b fill the host tier, v goes after spilling 2 of theirs */
    int rc = kvvm_set_budget(t.kv, 6 * KB);
    cr_assert_eq(rc, 0, "set_budget: %d (%s)", rc, kvvm_last_error());
    struct kvvm_seq_info in;
    in.size = sizeof in;
    cr_assert_eq(kvvm_seq_info(t.kv, v->h, &in), 0);
    cr_assert(!in.resident, "v moved");
    check(&t, "after the shrink");
    cr_assert_eq(kvvm_set_budget(t.kv, 16 * KB), 0);
    struct sh *all[3] = { a, b, v };
    for (int i = 0; i < 3; i++) {
        sh_verify(&t, all[i], "after the shrink");
        cr_assert_eq(kvvm_step(t.kv), 0);
    }
    t_close(&t);
}

/* Bug: acting on a reclaim plan, the CACHED demotions went first, but the plan's room model
   gives them only the room the swap-outs leave: the demotion filled the host tier, its pages
   still being copied (not spillable), and the LIVE victim's swap-out, counted on the free
   host slots, was refused (the disk too small to stage it): kvvm_set_budget failed -ENOMEM
   after the demotion. The moves now go in the model's order (drops, orphans, swap-outs,
   demotions), each waiting for the copies started when the host tier cannot take it. */
Test(regress, plan_demotion_took_the_swap_outs_room)
{
    struct t t;
    t_open_plan(&t, 16, 8, 3, KVVM_F_CACHE_DEMOTE);   /* host 8 slots, disk 3 */
    struct sh *cs = sh_new(&t), *v = sh_new(&t), *f = sh_new(&t);
    sh_grow_fill(&t, cs, 11, 1);                /* 3 pages a region: 6 */
    sh_grow_fill(&t, v, 7, 2);                  /* 4 */
    sh_grow_fill(&t, f, 11, 3);                 /* 6: the device is full */
    cr_assert_eq(kvvm_seq_set_class(t.kv, cs->h, KVVM_SEQ_CACHED), 0);
    struct snap s0;
    pin_settle(&t, f, &s0);
    /* 10 to free: cs's 6 as a drop, then v's 4 into the host tier; cs demoted in the room
       left (4 slots and 2 of v's pages spilled to disk) */
    int rc = kvvm_set_budget(t.kv, 6 * KB);
    cr_assert_eq(rc, 0, "set_budget: %d (%s)", rc, kvvm_last_error());
    struct kvvm_seq_info in;
    in.size = sizeof in;
    cr_assert_eq(kvvm_seq_info(t.kv, cs->h, &in), 0);
    cr_assert(!in.resident && !in.dropped, "cs demoted: resident %d dropped %d", in.resident,
              in.dropped);
    check(&t, "after the shrink");
    cr_assert_eq(kvvm_set_budget(t.kv, 16 * KB), 0);
    sh_verify(&t, v, "v");
    cr_assert_eq(kvvm_step(t.kv), 0);
    sh_verify(&t, cs, "cs");
    t_close(&t);
}

/* ================================================================ issue 31, defect 6 */

/* "A failed call changes nothing" when the driver refuses what the call needs created: a
   frame (cuMemCreate: on a GPU shared with other processes an ordinary event), an event
   for a fence, the copy stream. The calls below need room that only moving others makes:
   a CACHED sequence dropped and a LIVE one swapped out (KVVM_F_AUTO_SWAP), and frames the
   pool has not created yet (trimmed: the call creates them). Bug: the reclaim acted first
   and the frames, fences and stream were made after it, so a refusal failed the call
   -ENOMEM with the others moved. Each creation of the call is refused in turn
   (th_refusals_run); a failed call must leave every sequence as it was. */
enum refused_call { RC_GROW, RC_GROW_BATCH, RC_SHARE };

struct refused {
    struct t t;
    enum refused_call call;
    bool stream;
    struct sh *l, *c, *g, *o;          /* LIVE victim, CACHED victim, the caller, a 2nd */
    struct th_snap before;
};

static void refused_setup(void *p)
{
    struct refused *a = p;
    t_open_plan(&a->t, 16, 16, 0, KVVM_F_AUTO_SWAP);
    if (a->stream)
        t_stream(&a->t);
    a->l = sh_new(&a->t);
    a->c = sh_new(&a->t);
    a->g = sh_new(&a->t);
    a->o = sh_new(&a->t);
    sh_grow_fill(&a->t, a->l, 7, 1);               /* 4 pages */
    sh_grow_fill(&a->t, a->c, 7, 2);               /* 4 */
    if (a->call == RC_SHARE)
        sh_grow_fill(&a->t, a->g, 13, 3);          /* 8, 13 tokens: a partial last page */
    else if (a->call == RC_GROW_BATCH) {
        sh_grow_fill(&a->t, a->o, 3, 4);           /* 2, swapped out below */
        t_out(&a->t, a->o);
    }
    cr_assert_eq(kvvm_seq_set_class(a->t.kv, a->c->h, KVVM_SEQ_CACHED), 0);
    cr_assert_eq(kvvm_step(a->t.kv), 0);
    cr_assert_eq(kvvm_step(a->t.kv), 0);           /* l and c unprotected */
    cr_assert_eq(kvvm_sync(a->t.kv), 0);
    cr_assert_eq(kvvm_trim(a->t.kv, 0), 0);        /* the free frames are not created */
    kvvm_seq all[4] = { a->l->h, a->c->h, a->g->h, a->o->h };
    th_snap_take(a->t.kv, &a->before, all, 4, 0, NULL, 0);
}

static int refused_call(void *p)
{
    struct refused *a = p;
    switch (a->call) {
    case RC_GROW:                       /* 8 free, 16 needed: c dropped, l swapped out */
        return kvvm_seq_grow(a->t.kv, a->g->h, 31);
    case RC_GROW_BATCH: {               /* o back in (2) + g 12 = 14, 6 free */
        kvvm_seq s[2] = { a->o->h, a->g->h };
        uint64_t len[2] = { 3, 23 };
        return kvvm_seq_grow_batch(a->t.kv, s, len, 2);
    }
    case RC_SHARE:                      /* 0 free, the partial page's copy: c dropped */
        return kvvm_seq_share(a->t.kv, a->o->h, a->g->h, 13);
    }
    return -EINVAL;
}

static void refused_teardown(void *p)
{
    struct refused *a = p;
    if (a->t.kv)
        t_close(&a->t);
    a->t.kv = NULL;
}

static enum th_sweep_outcome refused_after(void *p, int rc, const char *where)
{
    struct refused *a = p;
    if (rc == -EIO)
        return TH_SWEEP_DEAD;
    if (rc) {
        UCHK(rc == -ENOMEM, "%s: returned %d", where, rc);
        th_snap_same(a->t.kv, &a->before, where);
        th_check(a->t.kv, where);
        sh_verify(&a->t, a->l, where);         /* the victims' bytes, as written */
        sh_verify(&a->t, a->c, where);
    }
    th_check(a->t.kv, where);
    return rc ? TH_SWEEP_FAILED : TH_SWEEP_ABSORBED;
}

static void refused_sweep_on(const char *name, enum refused_call call, bool stream, bool use)
{
    TH_DEADLINE(300);
    kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);        /* the refusals are logged */
    struct refused a = { .call = call, .stream = stream };
    struct th_sweep s = { .name = name, .arg = &a, .setup = refused_setup,
                          .call = refused_call, .teardown = refused_teardown,
                          .after = refused_after };
    if (use)
        th_refusals_run_use(&s);
    else
        th_refusals_run(&s);
}

static void refused_sweep(const char *name, enum refused_call call, bool stream)
{
    refused_sweep_on(name, call, stream, false);
}

Test(regress, grow_refused_by_the_driver_moved_others)
{
    refused_sweep("grow", RC_GROW, false);
    refused_sweep("grow (stream)", RC_GROW, true);
}

Test(regress, grow_batch_refused_by_the_driver_moved_others)
{
    refused_sweep("grow_batch", RC_GROW_BATCH, false);
    refused_sweep("grow_batch (stream)", RC_GROW_BATCH, true);
}

Test(regress, share_refused_by_the_driver_moved_others)
{
    refused_sweep("share", RC_SHARE, false);
    refused_sweep("share (stream)", RC_SHARE, true);
}

/* The same calls with the driver refusing a map, set-access, unmap, copy or synchronization
   (th_use_entries, each at every call of the call in turn): those come after the call's
   reclaim dropped c and swapped l out, and the call fails -ENOMEM. Bug: those moves stayed
   made (c dropped, l swapped out). Now the call takes them back (swap/undo.c): l is swapped
   in again, c's drop was stashed or parked and is undone, every sequence as it was, its
   bytes too. */
static void refused_use_sweep(const char *name, enum refused_call call)
{
    char n[64];
    refused_sweep_on(name, call, false, true);
    snprintf(n, sizeof n, "%s (stream)", name);
    refused_sweep_on(n, call, true, true);
}

Test(regress, grow_map_refused_after_reclaim_moved_others)
{
    refused_use_sweep("grow, maps and copies refused", RC_GROW);
}

Test(regress, grow_batch_map_refused_after_reclaim_moved_others)
{
    refused_use_sweep("grow_batch, maps and copies refused", RC_GROW_BATCH);
}

Test(regress, share_map_refused_after_reclaim_moved_others)
{
    refused_use_sweep("share, maps and copies refused", RC_SHARE);
}
