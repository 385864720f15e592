/*
 * tests/test_ahead.c: map-ahead refilled by the frame pool thread (paging/ahead.c,
 * docs/design.md "Map-ahead"): grows that stay within their map-ahead make no map or
 * set-access call on the engine's thread (the emulator's per-thread call counters); a
 * refill the driver refuses on the thread leaves the sequence and the pool as they were;
 * refills racing grow, free, truncate, swap-out, fork and discard of the same sequences
 * (random operations, the invariant checker after each, every byte checked).
 *
 * Emulated device, 4 KiB pages, two regions of 1024-byte tokens (4 tokens per page).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define KVVM_HARNESS_SHADOW
#include "harness.h"
#include "testing/kvvm_testing.h"

#define NR  2u
#define BPT 1024u
#define TPP 4u          /* tokens per page: KB / BPT */
#define AHEAD 4u

static void acfg(struct kvvm_config *c, int thread)
{
    tcfg(c, KB, NR, BPT, 4, 256, 160);
    c->map_ahead = AHEAD;
    c->pool_thread = thread;
}

/* cuMemMap + cuMemSetAccess made on the calling thread so far. */
static uint64_t my_maps(void)
{
    struct kvvm_testing_emu_calls c;
    cr_assert_eq(kvvm_testing_emu_thread_calls(&c), 0);
    return kvvm_testing_emu_count(&c, "cuMemMap") + kvvm_testing_emu_count(&c, "cuMemSetAccess");
}

/* cuMemMap calls on t's device, every thread's. */
static uint64_t dev_maps(struct tctx *t)
{
    struct kvvm_testing_emu_calls c;
    cr_assert_eq(kvvm_testing_emu_calls(t->kv, &c), 0);
    return kvvm_testing_emu_count(&c, "cuMemMap");
}

/* A sequence of one page, its map-ahead refilled (kvvm_sync waits for the pool thread). */
static void one_page(struct tctx *t, struct sh *a)
{
    sh_create(t, a);
    sh_grow_fill(t, a, TPP, 1);
    cr_assert_eq(kvvm_sync(t->kv), 0);
}

/* Grows a crossing one page each, within its map-ahead (the thread refills it between, at
   kvvm_sync): the engine's thread makes no map or set-access call in them. Fails where the
   grow topped its map-ahead up itself. */
Test(engine_thread, grows_within_map_ahead_map_nothing)
{
    TH_DEADLINE(60);
    struct kvvm_config c;
    struct tctx t;
    struct sh a;
    acfg(&c, 1);
    topen(&t, &c);
    one_page(&t, &a);
    uint64_t mine = 0, dev0 = dev_maps(&t);
    for (uint32_t p = 2; p <= 24; p++) {
        uint64_t m0 = my_maps();
        sh_grow(&t, &a, (uint64_t)p * TPP);
        mine += my_maps() - m0;
        sh_fill(&t, &a, (uint64_t)(p - 1) * TPP, (uint64_t)p * TPP, p);
        cr_assert_eq(kvvm_sync(t.kv), 0);
        tcheck(&t, "grow");
    }
    cr_expect_eq(mine, 0, "23 grows within map-ahead made %lu map/set-access calls on the "
                 "engine's thread", (unsigned long)mine);
    /* the grows took 23 pages per region, the first AHEAD of them mapped before dev0 */
    cr_expect_geq(dev_maps(&t) - dev0, (23 - AHEAD) * NR, "the pool thread mapped %lu "
                  "pages, fewer than the grows took", (unsigned long)(dev_maps(&t) - dev0));
    sh_verify(&t, &a, "end");
    sh_free(&t, &a);
    tclose(&t);
}

/* Without the pool thread the grow refills itself, as before (the control of the above). */
Test(engine_thread, without_the_pool_thread_the_grow_refills)
{
    TH_DEADLINE(60);
    struct kvvm_config c;
    struct tctx t;
    struct sh a;
    acfg(&c, 0);
    topen(&t, &c);
    one_page(&t, &a);
    uint64_t mine = 0;
    for (uint32_t p = 2; p <= 8; p++) {
        uint64_t m0 = my_maps();
        sh_grow_fill(&t, &a, (uint64_t)p * TPP, p);
        mine += my_maps() - m0;
    }
    cr_expect_gt(mine, 0, "no refill on the engine's thread without the pool thread");
    sh_verify(&t, &a, "end");
    sh_free(&t, &a);
    tclose(&t);
}

/* The thread's refill refused by the driver at the given call (entry, nth from the grow on):
   the failed refill leaves nothing mapped and no frame lost; the sequence reads back; the
   next refill works. */
static void refill_fault(const char *entry, unsigned long nth)
{
    struct kvvm_config c;
    struct tctx t;
    struct sh a;
    struct snap s0, s1;
    struct sh *ss[1] = { &a };
    acfg(&c, 1);
    topen(&t, &c);
    one_page(&t, &a);
    /* AHEAD 4, low mark 2: the third crossing leaves 1 and queues the refill */
    sh_grow_fill(&t, &a, 3 * TPP, 2);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    snap_take(&t, &s0, ss, 1);
    uint64_t d0 = dev_maps(&t);
    cr_assert_eq(emu_fail_arm(entry, nth, KCU_ERROR_OUT_OF_MEMORY), 0);
    sh_grow_fill(&t, &a, 4 * TPP, 3);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    emu_fail_clear();
    cr_expect_gt(dev_maps(&t), d0, "%s:%lu: the thread tried no refill", entry, nth);
    snap_take(&t, &s1, ss, 1);
    tcheck(&t, "after the failed refill");
    cr_expect_eq(s1.ec.mappings, s0.ec.mappings, "%s:%lu: emulator mappings %lu -> %lu",
                 entry, nth, (unsigned long)s0.ec.mappings, (unsigned long)s1.ec.mappings);
    cr_expect_eq(s1.st.maps - s1.st.unmaps, s0.st.maps - s0.st.unmaps,
                 "%s:%lu: window mappings %lu -> %lu", entry, nth,
                 (unsigned long)(s0.st.maps - s0.st.unmaps),
                 (unsigned long)(s1.st.maps - s1.st.unmaps));
    cr_expect_eq(s1.st.pages_device_free, s0.st.pages_device_free - NR,
                 "%s:%lu: free pages %lu -> %lu (the grow took one page per region)", entry,
                 nth, (unsigned long)s0.st.pages_device_free,
                 (unsigned long)s1.st.pages_device_free);
    sh_verify(&t, &a, "after the failed refill");
    /* the next crossing queues the refill again; it works */
    sh_grow_fill(&t, &a, 5 * TPP, 4);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    snap_take(&t, &s1, ss, 1);
    cr_expect_gt(s1.ec.mappings, s0.ec.mappings, "%s:%lu: no refill after the failed one",
                 entry, nth);
    tcheck(&t, "after the next refill");
    sh_verify(&t, &a, "end");
    sh_free(&t, &a);
    tclose(&t);
}

Test(fault, refill_map_fails) { TH_DEADLINE(60); refill_fault("cuMemMap", 1); }
Test(fault, refill_map_of_the_second_region_fails)
{
    TH_DEADLINE(60);
    refill_fault("cuMemMap", AHEAD);  /* the 3 frames of region 0 mapped, then region 1's */
}
Test(fault, refill_set_access_fails) { TH_DEADLINE(60); refill_fault("cuMemSetAccess", 1); }
Test(fault, refill_set_access_of_the_second_region_fails)
{
    TH_DEADLINE(60);
    refill_fault("cuMemSetAccess", 2);
}

/* A refill planned at page 0 and still in flight when its sequence is freed: the thread has
   mapped page 0 of the free slot; its commit undoes it. A batch grow that is not in place
   queues a refill for each member, an empty one included (at page 0). The checker said
   "free slot's first page ... is mapped but nothing holds it" (the fuzzer, CI of stop 30):
   it allowed for refills in flight on live slots only. The gate holds the thread between
   its cuMemMap and its cuMemSetAccess. */
Test(regress, free_slot_first_page_mapped_by_a_refill_in_flight)
{
    TH_DEADLINE(60);
    struct kvvm_config c;
    struct tctx t;
    struct sh a;
    acfg(&c, 1);
    topen(&t, &c);
    one_page(&t, &a);                 /* 1 page and its full map-ahead: a queues no refill */
    kvvm_seq b;
    cr_assert_eq(kvvm_seq_create(t.kv, &b), 0);
    cr_assert_eq(emu_gate_arm("cuMemSetAccess"), 0);
    kvvm_seq both[2] = { a.h, b };
    uint64_t len[2] = { 2 * TPP, 0 };  /* a takes a page: not in place */
    cr_assert_eq(kvvm_seq_grow_batch(t.kv, both, len, 2), 0);
    a.len = 2 * TPP;
    emu_gate_wait();                  /* the thread mapped b's page 0 of region 0 */
    cr_assert_eq(kvvm_seq_free(t.kv, b), 0);
    char why[256];
    int rc = kvvm_debug_check(t.kv, why, sizeof why);
    emu_gate_open();
    cr_expect_eq(rc, 0, "with the refill in flight: %s", why);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    tcheck(&t, "after the refill's commit undid it");   /* nothing left mapped */
    sh_free(&t, &a);
    tclose(&t);
}

/* Tokens [first, s->len) of every region read back as expected (first: a discard's
   first_kept, the tokens before it gone). */
static void verify_from(struct tctx *t, struct sh *s, uint64_t first, const char *where)
{
    size_t n = (size_t)(s->len - first) * BPT;
    uint8_t *buf = malloc(n);
    cr_assert(buf);
    for (uint32_t r = 0; r < NR; r++) {
        cr_assert_eq(kvvm_seq_read(t->kv, s->h, r, first * BPT, buf, n), 0, "%s", where);
        cr_expect(!memcmp(buf, s->exp[r] + first * BPT, n), "%s: region %u differs", where,
                  r);
    }
    free(buf);
}

/* A refill in flight in a freed slot, that slot then taken by the fork of a non-resident
   sequence: the child holds pages there but maps none (or holes: discard), and the thread
   has mapped its pages 0..3 of region 0 (the job, planned at page 0 of the empty sequence
   freed, is undone at its commit; the child's swap-in settles it first where it maps into
   the job's range, as any map does, and leaves it where the range is all holes). The
   checker said "non-resident sequence's page ... is mapped but nothing holds it" (test_ahead
   -j2 under load, random_ops_with_refills_in_flight_and_the_pool_view; "discarded page"
   with holes): it allowed for refills in flight past a sequence's end and in free slots,
   not under pages that map nothing. The gate holds the thread between its cuMemMap and its
   cuMemSetAccess. */
static void fork_over_refill(bool holes)
{
    struct kvvm_config c;
    struct tctx t;
    struct sh a, p, ch;
    uint64_t kept = holes ? AHEAD * TPP : 0;     /* the job's pages 0..3: holes */
    acfg(&c, 1);
    c.host_budget = 64 * KB;
    topen(&t, &c);
    one_page(&t, &a);                 /* 1 page and its full map-ahead: a queues no refill */
    sh_create(&t, &p);
    sh_grow_fill(&t, &p, (AHEAD + 2) * TPP, 2);
    if (holes) {
        cr_assert_eq(kvvm_seq_discard(t.kv, p.h, KVVM_ALL_REGIONS, kept), 0);
        for (uint32_t r = 0; r < NR; r++)
            memset(p.exp[r], 0, kept * BPT);
    }
    cr_assert_eq(kvvm_sync(t.kv), 0);
    cr_assert_eq(kvvm_seq_swap_out(t.kv, p.h), 0);
    kvvm_seq b;
    struct kvvm_seq_info bi = { .size = sizeof bi }, ci = { .size = sizeof ci };
    cr_assert_eq(kvvm_seq_create(t.kv, &b), 0);
    cr_assert_eq(kvvm_seq_info(t.kv, b, &bi), 0);
    cr_assert_eq(emu_gate_arm("cuMemSetAccess"), 0);
    kvvm_seq both[2] = { a.h, b };
    uint64_t len[2] = { 2 * TPP, 0 };  /* a takes a page: not in place; b's refill at page 0 */
    cr_assert_eq(kvvm_seq_grow_batch(t.kv, both, len, 2), 0);
    a.len = 2 * TPP;
    emu_gate_wait();                  /* the thread mapped b's pages 0..3 of region 0 */
    cr_assert_eq(kvvm_seq_free(t.kv, b), 0);
    sh_fork(&t, &p, &ch);             /* non-resident, in b's slot (the last one freed) */
    cr_assert_eq(kvvm_seq_info(t.kv, ch.h, &ci), 0);
    cr_assert(ci.slot == bi.slot && !ci.resident, "the child: slot %u (b's %u), resident %d",
              ci.slot, bi.slot, ci.resident);
    char why[256];
    int rc = kvvm_debug_check(t.kv, why, sizeof why);
    if (holes && !rc) {
        /* resident with its holes under the job, which its swap-in's maps did not meet */
        cr_assert_eq(kvvm_seq_swap_in(t.kv, ch.h), 0);
        rc = kvvm_debug_check(t.kv, why, sizeof why);
    }
    emu_gate_open();
    cr_expect_eq(rc, 0, "with the refill in flight: %s", why);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    tcheck(&t, "after the refill's commit undid it");
    sh_fill(&t, &a, TPP, 2 * TPP, 3);
    cr_assert_eq(kvvm_seq_swap_in(t.kv, ch.h), 0);
    tcheck(&t, "after the child's swap-in");
    verify_from(&t, &ch, kept, "child");
    verify_from(&t, &p, kept, "parent");
    sh_verify(&t, &a, "a");
    sh_free(&t, &ch);
    sh_free(&t, &p);
    sh_free(&t, &a);
    tclose(&t);
}

Test(regress, non_resident_fork_over_a_refill_in_flight)
{
    TH_DEADLINE(60);
    fork_over_refill(false);
}

Test(regress, holes_of_a_fork_over_a_refill_in_flight)
{
    TH_DEADLINE(60);
    fork_over_refill(true);
}

/* ---- refills racing the other operations ----------------------------------------------- */

static uint32_t rnd(uint64_t *x)
{
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*x >> 33);
}

/* Random operations on 4 sequences crossing pages often, kvvm_sync rarely, so the thread's
   refills are in flight at the operations; the checker after every one (it sees the jobs
   in flight), every sequence's bytes every 8. */
static void random_ops(uint64_t seed, int ops, bool view)
{
    struct kvvm_config c;
    struct tctx t;
    const char *env = getenv("KVVMTEST_AHEAD_SEED");    /* another seed, by hand */
    if (env)
        seed = strtoull(env, NULL, 0);
    acfg(&c, 1);
    c.host_budget = 64 * KB;
    c.map_ahead = 3;
    if (view)
        c.flags |= KVVM_F_POOL_VIEW;
    topen(&t, &c);
    struct sh s[4];
    bool live[4] = { false };
    uint32_t lin = 1;
    for (int op = 0; op < ops; op++) {
        int i = (int)(rnd(&seed) % 4), k = (int)(rnd(&seed) % 12);
        if (!live[i]) {
            sh_create(&t, &s[i]);
            live[i] = true;
            continue;
        }
        uint64_t len = s[i].len;
        if (k <= 4 && len < 200) {                          /* grow: a page or two */
            uint64_t to = len + 1 + rnd(&seed) % (2 * TPP);
            int rc = kvvm_seq_grow(t.kv, s[i].h, to);
            cr_assert(rc == 0 || rc == -ENOMEM, "grow: %d", rc);
            if (!rc) {
                s[i].len = to;
                sh_fill(&t, &s[i], len, to, lin++);
            }
        } else if (k == 5) {                                /* fork into a free place */
            int j = 0;
            while (j < 4 && live[j])
                j++;
            if (j < 4) {
                sh_init(&t, &s[j]);
                int rc = kvvm_seq_fork(t.kv, s[i].h, &s[j].h);
                cr_assert(rc == 0 || rc == -ENOMEM, "fork: %d", rc);
                if (!rc) {
                    s[j].len = len;
                    for (uint32_t r = 0; r < NR; r++)
                        memcpy(s[j].exp[r], s[i].exp[r], t.cap);
                    live[j] = true;
                } else {
                    sh_release(&s[j]);
                }
            }
        } else if (k == 6 && len) {                         /* truncate */
            uint64_t to = rnd(&seed) % len;
            cr_assert_eq(kvvm_seq_truncate(t.kv, s[i].h, to), 0);
            for (uint32_t r = 0; r < NR; r++)
                memset(s[i].exp[r] + to * BPT, 0, (len - to) * BPT);
            s[i].len = to;
        } else if (k == 7) {                                /* swap out, in later */
            int rc = kvvm_seq_swap_out(t.kv, s[i].h);
            cr_assert(rc == 0 || rc == -ENOMEM, "swap_out: %d", rc);
            if (!rc && rnd(&seed) % 2)
                cr_assert_eq(kvvm_seq_swap_in(t.kv, s[i].h), 0);
        } else if (k == 8) {                                /* free */
            sh_free(&t, &s[i]);
            live[i] = false;
        } else if (k == 9 && len) {                         /* write (copy-on-write) */
            sh_write(&t, &s[i], rnd(&seed) % NR, (rnd(&seed) % len) * BPT, BPT, lin++);
        } else {
            cr_assert_eq(rnd(&seed) % 4 ? kvvm_step(t.kv) : kvvm_sync(t.kv), 0);
        }
        tcheck(&t, "random op");
        if (op % 8 == 0)
            for (int j = 0; j < 4; j++)
                if (live[j])
                    sh_verify(&t, &s[j], "random op");
    }
    cr_assert_eq(kvvm_sync(t.kv), 0);
    for (int j = 0; j < 4; j++)
        if (live[j]) {
            sh_verify(&t, &s[j], "end");
            sh_free(&t, &s[j]);
        }
    tcheck(&t, "end");
    tclose(&t);
}

Test(race, random_ops_with_refills_in_flight)
{
    TH_DEADLINE(240);
    random_ops(19, 1500, false);
}

Test(race, random_ops_with_refills_in_flight_and_the_pool_view)
{
    TH_DEADLINE(240);
    random_ops(20, 1000, true);
}
