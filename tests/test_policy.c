/*
 * tests/test_policy.c: the host tier's policy in swap/ (swap/room.c): the direct / staged /
 * -ENOMEM choice of a swap on its room facts (swap_plan), the one LRU order (swap_lru_sort),
 * and, through the public API, that spilling for room takes the least recently used
 * non-resident sequence's host pages first, following the use clock (a sequence brought back
 * and sent out again is the most recent), while the invariant checker (which recounts the
 * incremental HOST-page and orphan counts) holds after each phase.
 *
 * Emulated device in opaque mode, 4 KiB pages, one region, one token = one page; the spill
 * directory is a mkdtemp under /var/tmp (empty at the end: the spill file is unnamed).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "kvvm.h"
#include "testing/kvvm_testing.h"
#include "swap/swap_int.h"
#include "swap/worker.h"

#define KB 4096u

static struct pg_room room(uint64_t need, uint64_t h, uint64_t w, uint64_t s, uint64_t d)
{
    return (struct pg_room){ .need = need,
                             .t[PG_LOWER_HOST] = { .free = h, .freeing = w, .movable = s },
                             .t[PG_LOWER_DISK] = { .free = d } };
}

Test(policy, plan_direct_when_room_can_be_made)
{
    struct pg_room r = room(10, 2, 3, 5, 100);   /* 2 + 3 + min(5, 100) = 10 */
    cr_expect_eq(swap_plan(NULL, false, &r), PG_MOVE_DIRECT);
    cr_expect_eq(swap_plan(NULL, true, &r), PG_MOVE_DIRECT);
    r = room(10, 2, 3, 100, 5);                  /* the disk bounds the spill: 2 + 3 + 5 */
    cr_expect_eq(swap_plan(NULL, false, &r), PG_MOVE_DIRECT);
}

Test(policy, plan_staged_or_enomem_beyond_the_room)
{
    struct pg_room r = room(11, 2, 3, 5, 100);
    cr_expect_eq(swap_plan(NULL, true, &r), PG_MOVE_STAGED);
    cr_expect_eq(swap_plan(NULL, false, &r), PG_MOVE_STAGED);
    r = room(11, 2, 3, 5, 10);                   /* the disk cannot take every page */
    cr_expect_eq(swap_plan(NULL, false, &r), -ENOMEM);
    cr_expect_eq(swap_plan(NULL, true, &r), PG_MOVE_STAGED);
    r = room(11, 0, 0, 0, 100);                  /* no host slot to stage through */
    cr_expect_eq(swap_plan(NULL, false, &r), -ENOMEM);
    r = room(11, 0, 0, 5, 11);                   /* spilling one for a slot needs a disk slot */
    cr_expect_eq(swap_plan(NULL, false, &r), -ENOMEM);
    r = room(11, 0, 0, 5, 12);
    cr_expect_eq(swap_plan(NULL, false, &r), PG_MOVE_STAGED);
}

Test(policy, lru_sort_least_recent_first)
{
    struct pg_cand c[] = { { 1, 30, 0 }, { 2, 10, 0 }, { 3, 20, 0 }, { 4, 5, 0 } };
    swap_lru_sort(c, 4);
    cr_expect(c[0].h == 4 && c[1].h == 2 && c[2].h == 3 && c[3].h == 1,
              "order %llu %llu %llu %llu", (unsigned long long)c[0].h,
              (unsigned long long)c[1].h, (unsigned long long)c[2].h, (unsigned long long)c[3].h);
}

static char dir[64];

static void tcheck(kvvm *kv, const char *where)
{
    char why[512] = "";
    int rc = kvvm_debug_check(kv, why, sizeof why);
    cr_assert_eq(rc, 0, "%s: invariant violated (%d): %s", where, rc, why);
}

static void tinfo(kvvm *kv, kvvm_seq s, struct kvvm_seq_info *in)
{
    memset(in, 0, sizeof *in);
    in->size = sizeof *in;
    cr_assert_eq(kvvm_seq_info(kv, s, in), 0);
}

static kvvm_seq seq_out(kvvm *kv, uint64_t pages)
{
    kvvm_seq s;
    cr_assert_eq(kvvm_seq_create(kv, &s), 0);
    cr_assert_eq(kvvm_seq_grow(kv, s, pages), 0);
    cr_assert_eq(kvvm_step(kv), 0);
    cr_assert_eq(kvvm_seq_swap_out(kv, s), 0);
    return s;
}

Test(policy, spill_takes_the_least_recently_used_first)
{
    snprintf(dir, sizeof dir, "/var/tmp/kvvm_test_policy.XXXXXX");
    cr_assert(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    struct kvvm_config c;
    kvvm_config_init(&c);
    c.backend = KVVM_BACKEND_EMULATED;
    c.emu_granule = KB;
    c.page_size = KB;
    c.n_regions = 1;
    c.bytes_per_token = KB;
    c.max_seqs = 8;
    c.max_tokens = 4;
    c.device_budget = 32 * KB;
    c.host_budget = 8 * KB;                 /* two sequences of four pages */
    c.spill_dir = dir;
    c.spill_budget = 64 * KB;
    c.host_min = c.host_low = c.host_high = 0;   /* no spill thread: only room spills */
    c.emu_opaque = 1;
    kvvm *kv;
    int rc = kvvm_open(&c, &kv);
    cr_assert_eq(rc, 0, "kvvm_open: %d", rc);
    kvvm_seq a = seq_out(kv, 4), b = seq_out(kv, 4);
    struct kvvm_seq_info ia, ib, ic;
    tinfo(kv, a, &ia);
    tinfo(kv, b, &ib);
    cr_assert(ia.pages_host == 4 && ib.pages_host == 4, "the host tier holds a and b");
    /* c's swap-out needs four host slots: a (least recently used) spills */
    kvvm_seq cs = seq_out(kv, 4);
    tcheck(kv, "after c out");
    tinfo(kv, a, &ia);
    tinfo(kv, b, &ib);
    tinfo(kv, cs, &ic);
    cr_expect_eq(ia.pages_disk, 4, "a spilled (host %u disk %u)", ia.pages_host, ia.pages_disk);
    cr_expect_eq(ib.pages_host, 4, "b stays (host %u disk %u)", ib.pages_host, ib.pages_disk);
    cr_expect_eq(ic.pages_host, 4);
    /* b comes back and leaves again: now c is the least recently used with host pages */
    cr_assert_eq(kvvm_seq_swap_in(kv, b), 0);
    cr_assert_eq(kvvm_step(kv), 0);
    cr_assert_eq(kvvm_seq_swap_out(kv, b), 0);
    kvvm_seq d = seq_out(kv, 4);
    tcheck(kv, "after d out");
    tinfo(kv, b, &ib);
    tinfo(kv, cs, &ic);
    cr_expect_eq(ic.pages_disk, 4, "c spilled (host %u disk %u)", ic.pages_host, ic.pages_disk);
    cr_expect_eq(ib.pages_host, 4, "b stays (host %u disk %u)", ib.pages_host, ib.pages_disk);
    (void)d;
    kvvm_close(kv);
    rmdir(dir);
}

/* ---- regression: a wake during a round ---------------------------------------------------- */

/* A round the test holds until it says go, counting its runs; it reports "nothing done". */
struct held_round {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int started, go;
};

static bool held_round(void *arg)
{
    struct held_round *h = arg;
    pthread_mutex_lock(&h->mu);
    h->started++;
    pthread_cond_broadcast(&h->cv);
    while (h->go < h->started)
        pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
    return false;
}

/* Regression (issue 31, "green under load"): a kvvm_step that came while a reclaim round ran
   asked for no new round (swap.c's wake_worker skipped an active worker), and the round,
   planned before the step (every sequence still protected), then ended futile: nothing was
   reclaimed until the next step. test_swap's capture::reclaim_thread_records_nothing_on_
   the_engine_stream failed so, 6 runs in 40 on a loaded machine. Here a round is held while
   the owner clears futile and asks again (what swap_after_step does): a second round must
   follow the first, and the worker must not be futile. */
Test(regress, wake_during_a_round_was_lost_and_the_round_marked_futile)
{
    struct vmm_params p = { .backend = KVVM_BACKEND_EMULATED, .emu_capacity = 1u << 20,
                            .emu_granule = KB, .emu_opaque = 1 };
    struct vmm *v = NULL;
    cr_assert_eq(vmm_open(&p, &v), 0);
    static struct held_round h = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0 };
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    bool stop = false;
    struct swap_worker w = { .name = "test", .v = v, .round = held_round, .arg = &h,
                             .mu = &mu, .cv = &cv, .stop = &stop };
    cr_assert_eq(swap_worker_start(&w), 0);
    swap_worker_wake(&w);                       /* round 1 */
    pthread_mutex_lock(&h.mu);
    while (h.started < 1)
        pthread_cond_wait(&h.cv, &h.mu);
    pthread_mutex_unlock(&h.mu);
    pthread_mutex_lock(&mu);                    /* a step during round 1 */
    w.futile = false;
    pthread_mutex_unlock(&mu);
    swap_worker_wake(&w);
    pthread_mutex_lock(&h.mu);                  /* round 1 ends, having done nothing */
    h.go = 1;
    pthread_cond_broadcast(&h.cv);
    pthread_mutex_unlock(&h.mu);
    for (;;) {                                  /* until a next round, or the worker idle */
        pthread_mutex_lock(&h.mu);
        bool second = h.started >= 2;
        pthread_mutex_unlock(&h.mu);
        pthread_mutex_lock(&mu);
        bool idle = !w.active && !w.wake;
        pthread_mutex_unlock(&mu);
        if (second || idle)
            break;
        usleep(1000);
    }
    pthread_mutex_lock(&h.mu);
    int started = h.started;
    h.go = 1000;                                /* let any further round through */
    pthread_cond_broadcast(&h.cv);
    pthread_mutex_unlock(&h.mu);
    swap_worker_stop(&w);
    vmm_close(v);
    cr_assert_geq(started, 2, "the step's wake during round 1 was lost: %d round(s) ran, and "
                  "the worker would wait for the next step", started);
}
