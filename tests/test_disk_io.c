/*
 * tests/test_disk_io.c: the disk tier engine (disk/disk.h) on a real file system.
 *
 * Every test spills into its own mkdtemp directory under /var/tmp (a disk file system here)
 * and removes it at the end; the rmdir succeeding also proves no file was left behind.
 * Every page carries a content cookie (derived from its page id and a generation) that is
 * checked after each round trip.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <liburing.h>
#include <linux/capability.h>
#include <linux/magic.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"
#include "disk/disk.h"

#define PAGE ((size_t)64 << 10)
#define NPAGES 32

static char dir[256];
static unsigned char *bufs;          /* NPAGES * PAGE, 4 KiB aligned */

static void setup(void)
{
    alarm(60);  /* hang guard; not Criterion's .timeout, see TH_DEADLINE in tests/harness.h */
    snprintf(dir, sizeof dir, "/var/tmp/kvvm-test-spill-XXXXXX");
    cr_assert_not_null(mkdtemp(dir), "mkdtemp in /var/tmp: %s", strerror(errno));
    cr_assert_eq(posix_memalign((void **)&bufs, 4096, NPAGES * PAGE), 0);
    memset(bufs, 0, NPAGES * PAGE);
    unsetenv("KVVM_IO_ENGINE");
}

static void teardown(void)
{
    free(bufs);
    cr_expect_eq(rmdir(dir), 0, "spill directory not empty or not removable: %s",
                 strerror(errno));
}

TestSuite(disk_io, .init = setup, .fini = teardown);

static unsigned char *buf_of(int k) { return bufs + (size_t)k * PAGE; }

static void fill(void *p, uint64_t page, uint64_t gen)
{
    uint64_t *w = p;
    for (size_t i = 0; i < PAGE / 8; i++)
        w[i] = (page * 0x9E3779B97F4A7C15ULL) ^ (gen << 48) ^ (i * 0x100000001B3ULL);
}

static int check(const void *p, uint64_t page, uint64_t gen)
{
    const uint64_t *w = p;
    for (size_t i = 0; i < PAGE / 8; i++)
        if (w[i] != ((page * 0x9E3779B97F4A7C15ULL) ^ (gen << 48) ^ (i * 0x100000001B3ULL)))
            return 0;
    return 1;
}

static struct disk_params params(enum disk_engine e)
{
    return (struct disk_params){ .dir = dir, .budget = NPAGES * PAGE, .page_size = PAGE,
                                 .buf_base = bufs, .buf_bytes = NPAGES * PAGE,
                                 .engine = e };
}

static int uring_works(void)
{
    struct io_uring r;
    if (io_uring_queue_init(4, &r, 0) != 0)
        return 0;
    io_uring_queue_exit(&r);
    return 1;
}

/* Submits n requests of op on slots[0..n) with buffers 0..n (page ids 1000 + k), waits, and
   stores each page's status in st[k]. */
static void run_batch(struct disk *dk, enum disk_op op, const disk_slot *slots, int n,
                      int *st)
{
    struct disk_req r[NPAGES];
    for (int k = 0; k < n; k++)
        r[k] = (struct disk_req){ op, slots[k], buf_of(k), 1000 + (uint64_t)k,
                                  (void *)(intptr_t)(k + 1) };
    cr_assert_eq(disk_submit(dk, r, (size_t)n), 0);
    cr_assert_eq(disk_wait_all(dk), 0);
    struct disk_cqe c[NPAGES];
    size_t got = disk_reap(dk, c, NPAGES);
    cr_assert_eq(got, (size_t)n, "%zu completions for %d requests", got, n);
    cr_assert_eq(disk_reap(dk, c, NPAGES), 0, "a request completed twice");
    for (int k = 0; k < n; k++)
        st[k] = 1;   /* sentinel: never delivered */
    for (size_t j = 0; j < got; j++) {
        int k = (int)(intptr_t)c[j].user - 1;
        cr_assert(k >= 0 && k < n);
        cr_assert_eq(st[k], 1, "page %d completed twice", k);
        cr_assert_eq(c[j].slot.idx, slots[k].idx);
        cr_assert_eq(c[j].page, 1000 + (uint64_t)k);
        cr_assert_eq(c[j].op, op);
        st[k] = c[j].status;
    }
}

static void roundtrip(struct disk *dk, int n, uint64_t gen)
{
    disk_slot s[NPAGES];
    int st[NPAGES];
    cr_assert_eq(disk_slot_alloc(dk, (size_t)n, DISK_SLOT_NONE, s), 0);
    for (int k = 0; k < n; k++)
        fill(buf_of(k), 1000 + (uint64_t)k, gen);
    run_batch(dk, DISK_WRITE, s, n, st);
    for (int k = 0; k < n; k++)
        cr_assert_eq(st[k], 0, "write of page %d: %d", k, st[k]);
    memset(bufs, 0, NPAGES * PAGE);
    run_batch(dk, DISK_READ, s, n, st);
    for (int k = 0; k < n; k++) {
        cr_assert_eq(st[k], 0, "read of page %d: %d", k, st[k]);
        cr_assert(check(buf_of(k), 1000 + (uint64_t)k, gen), "page %d came back wrong", k);
    }
    for (int k = 0; k < n; k++)
        cr_assert_eq(disk_slot_free(dk, s[k]), 0);
    struct disk_stats ss;
    disk_stats_get(dk, &ss);
    cr_assert_eq(ss.slots_free, ss.slots_total, "slot leaked");
    cr_assert_eq(ss.inflight, 0);
}

Test(disk_io, roundtrip_io_uring)
{
    if (!uring_works())
        cr_skip_test("io_uring_queue_init fails on this machine: the io_uring engine cannot "
                     "be tested here");
    /* io_uring works here, so the engine must be io_uring: AUTO and forced alike. */
    for (int forced = 0; forced < 2; forced++) {
        struct disk_params p = params(forced ? DISK_ENGINE_IO_URING : DISK_ENGINE_AUTO);
        struct disk *dk;
        cr_assert_eq(disk_open(&p, &dk), 0);
        cr_assert_str_eq(disk_engine_name(dk), "io_uring",
                         "io_uring works on this machine but the engine fell back");
        cr_expect(disk_buffers_registered(dk), "fixed buffers were not registered");
        cr_expect(disk_direct(dk), "/var/tmp should take O_DIRECT");
        size_t al = disk_dio_align(dk);
        cr_expect(al >= 512 && al <= 4096 && (al & (al - 1)) == 0,
                  "implausible direct-I/O alignment %zu", al);
        roundtrip(dk, NPAGES, 1);
        roundtrip(dk, 7, 2);
        struct disk_stats ss;
        disk_stats_get(dk, &ss);
        cr_expect_eq(ss.writes, NPAGES + 7);
        cr_expect_eq(ss.reads, NPAGES + 7);
        cr_expect_eq(ss.bytes_written, (NPAGES + 7) * PAGE);
        cr_expect_eq(ss.failed, 0);
        disk_close(dk);
    }
}

Test(disk_io, roundtrip_io_uring_split_ios_small_queue)
{
    if (!uring_works())
        cr_skip_test("io_uring unavailable here");
    struct disk_params p = params(DISK_ENGINE_IO_URING);
    p.io_size = PAGE / 4;
    p.queue_depth = 3;
    struct disk *dk;
    cr_assert_eq(disk_open(&p, &dk), 0);
    roundtrip(dk, NPAGES, 3);
    struct disk_stats ss;
    disk_stats_get(dk, &ss);
    cr_expect_eq(ss.submissions, 2 * 4 * NPAGES, "one I/O per io_size piece");
    disk_close(dk);
}

Test(disk_io, roundtrip_unregistered_buffers)
{
    /* Buffers outside the registered range go through plain reads and writes. */
    struct disk_params p = params(DISK_ENGINE_AUTO);
    p.buf_base = NULL;
    struct disk *dk;
    cr_assert_eq(disk_open(&p, &dk), 0);
    cr_expect_eq(disk_buffers_registered(dk), 0);
    roundtrip(dk, NPAGES, 4);
    disk_close(dk);
}

/* Drops CAP_IPC_LOCK from this (test) process, so RLIMIT_MEMLOCK applies to io_uring. */
static int drop_ipc_lock(void)
{
    struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
    struct __user_cap_data_struct d[2];
    if (syscall(SYS_capget, &h, d) != 0)
        return -errno;
    d[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
    d[CAP_IPC_LOCK / 32].permitted &= ~(1u << (CAP_IPC_LOCK % 32));
    if (syscall(SYS_capset, &h, d) != 0)
        return -errno;
    return 0;
}

Test(disk_io, buffer_registration_refused_falls_back_to_plain_buffers)
{
    if (!uring_works())
        cr_skip_test("io_uring unavailable here");
    /* Below the 2 MiB of buffers, above what the ring itself needs: the kernel charges
       io_uring rings (not only registered buffers) to the user's locked memory, shared by
       every process of the user without CAP_IPC_LOCK, so a 64 KiB limit failed the ring's
       setup when other copies of this test ran at the same time. */
    struct rlimit rl = { 1 << 20, 1 << 20 };
    if (drop_ipc_lock() != 0 || setrlimit(RLIMIT_MEMLOCK, &rl) != 0)
        cr_skip_test("cannot lower the memlock limit here: %s", strerror(errno));
    struct disk_params p = params(DISK_ENGINE_IO_URING);
    struct disk *dk;
    kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);
    /* the ring's own setup is charged to the user's locked memory, which other processes of
       the user (tests beside this one) hold for a while: wait until it fits, as long as
       the hang guard allows; the registration below is what this test checks */
    int rc;
    for (int i = 0; (rc = disk_open(&p, &dk)) != 0 && i < 400; i++)
        usleep(50 * 1000);
    if (rc)
        cr_skip_test("the ring could not be set up in 20 s under a 1 MiB memlock limit (%s): "
                     "other processes of this user hold the locked memory", strerror(-rc));
    cr_assert_str_eq(disk_engine_name(dk), "io_uring");
    cr_assert_eq(disk_buffers_registered(dk), 0,
                 "registration of 2 MiB under a 1 MiB memlock limit cannot have worked");
    roundtrip(dk, NPAGES, 16);
    disk_close(dk);
}

Test(disk_io, roundtrip_psync)
{
    struct disk_params p = params(DISK_ENGINE_PSYNC);
    struct disk *dk;
    cr_assert_eq(disk_open(&p, &dk), 0);
    cr_assert_str_eq(disk_engine_name(dk), "psync");
    roundtrip(dk, NPAGES, 5);
    roundtrip(dk, 3, 6);
    disk_close(dk);
}

Test(disk_io, engine_from_environment)
{
    setenv("KVVM_IO_ENGINE", "psync", 1);
    struct disk_params p = params(DISK_ENGINE_AUTO);
    struct disk *dk;
    cr_assert_eq(disk_open(&p, &dk), 0);
    cr_expect_str_eq(disk_engine_name(dk), "psync");
    roundtrip(dk, 4, 7);
    disk_close(dk);
    if (uring_works()) {
        setenv("KVVM_IO_ENGINE", "io_uring", 1);
        cr_assert_eq(disk_open(&p, &dk), 0);
        cr_expect_str_eq(disk_engine_name(dk), "io_uring");
        disk_close(dk);
    }
    unsetenv("KVVM_IO_ENGINE");
}

Test(disk_io, fallback_when_io_uring_cannot_be_set_up)
{
    struct disk_params p = params(DISK_ENGINE_AUTO);
    p.flags = DISK_F_TEST_NO_URING;
    struct disk *dk;
    kvvm_set_log(NULL, NULL, KVVM_LOG_ERROR);
    cr_assert_eq(disk_open(&p, &dk), 0);
    cr_expect_str_eq(disk_engine_name(dk), "psync", "AUTO must fall back");
    roundtrip(dk, 8, 8);
    disk_close(dk);
    /* Asked for explicitly (argument or environment): fails loudly, leaves nothing. */
    p.engine = DISK_ENGINE_IO_URING;
    cr_expect_eq(disk_open(&p, &dk), -EOPNOTSUPP);
    p.engine = DISK_ENGINE_AUTO;
    setenv("KVVM_IO_ENGINE", "io_uring", 1);
    cr_expect_eq(disk_open(&p, &dk), -EOPNOTSUPP);
    unsetenv("KVVM_IO_ENGINE");
}

/* The fault-injection sweep: a batch of 8 pages in 2 I/Os each = 16 submissions; each index
   in turn fails with -EIO (exactly the page it belongs to fails, the rest are spilled and read
   back intact, a failed write's slot reads as -ENODATA, never as stale bytes), is cut short
   or returns -EAGAIN (both invisible to the caller). No slot leaks. */
static void fault_sweep(enum disk_engine e)
{
    const int n = 8;
    struct disk_params p = params(e);
    p.io_size = PAGE / 2;
    p.queue_depth = 4;
    struct disk *dk;
    kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);
    cr_assert_eq(disk_open(&p, &dk), 0);
    disk_slot s[NPAGES];
    int st[NPAGES];
    uint64_t gen = 100;
    for (int kind = 0; kind < 3; kind++) {
        for (int op = 0; op < 2; op++) {
            for (unsigned long i = 1; i <= 2 * (unsigned)n; i++, gen++) {
                cr_assert_eq(disk_slot_alloc(dk, (size_t)n, DISK_SLOT_NONE, s), 0);
                for (int k = 0; k < n; k++)
                    fill(buf_of(k), 1000 + (uint64_t)k, gen);
                if (op == 0) {
                    if (kind == 0)
                        cr_assert_eq(disk_fault_arm(dk, i, DISK_FAULT_ERROR, -EIO), 0);
                    else if (kind == 1)
                        cr_assert_eq(disk_fault_arm(dk, i, DISK_FAULT_SHORT, 0), 0);
                    else
                        cr_assert_eq(disk_fault_arm(dk, i, DISK_FAULT_ERROR, -EAGAIN), 0);
                }
                run_batch(dk, DISK_WRITE, s, n, st);
                int failed_w = -1;
                for (int k = 0; k < n; k++) {
                    if (st[k] != 0) {
                        cr_assert_eq(kind, 0, "kind %d write %lu failed page %d: %d", kind,
                                     i, k, st[k]);
                        cr_assert_eq(st[k], -EIO);
                        cr_assert_eq(failed_w, -1, "two pages failed for one fault");
                        failed_w = k;
                    }
                }
                if (op == 0 && kind == 0)
                    cr_assert_neq(failed_w, -1, "the injected -EIO at %lu was lost", i);
                memset(bufs, 0, NPAGES * PAGE);
                if (op == 1) {
                    if (kind == 0)
                        cr_assert_eq(disk_fault_arm(dk, i, DISK_FAULT_ERROR, -EIO), 0);
                    else if (kind == 1)
                        cr_assert_eq(disk_fault_arm(dk, i, DISK_FAULT_SHORT, 0), 0);
                    else
                        cr_assert_eq(disk_fault_arm(dk, i, DISK_FAULT_ERROR, -EINTR), 0);
                }
                run_batch(dk, DISK_READ, s, n, st);
                int failed_r = -1;
                for (int k = 0; k < n; k++) {
                    if (k == failed_w) {
                        cr_assert_eq(st[k], -ENODATA, "a failed write's slot read as %d",
                                     st[k]);
                    } else if (st[k] != 0) {
                        cr_assert_eq(kind, 0);
                        cr_assert_eq(st[k], -EIO);
                        cr_assert_eq(failed_r, -1);
                        failed_r = k;
                    } else {
                        cr_assert(check(buf_of(k), 1000 + (uint64_t)k, gen),
                                  "kind %d op %d fault %lu: page %d came back wrong", kind,
                                  op, i, k);
                    }
                }
                if (op == 1 && kind == 0) {
                    cr_assert_neq(failed_r, -1, "the injected read -EIO at %lu was lost", i);
                    /* Nothing lost: the page reads back fine once the fault is gone. */
                    disk_slot one[1] = { s[failed_r] };
                    struct disk_req r = { DISK_READ, one[0], buf_of(failed_r),
                                          1000 + (uint64_t)failed_r, NULL };
                    cr_assert_eq(disk_submit(dk, &r, 1), 0);
                    disk_wait_all(dk);
                    struct disk_cqe c;
                    cr_assert_eq(disk_reap(dk, &c, 1), 1);
                    cr_assert_eq(c.status, 0);
                    cr_assert(check(buf_of(failed_r), 1000 + (uint64_t)failed_r, gen));
                }
                for (int k = 0; k < n; k++)
                    cr_assert_eq(disk_slot_free(dk, s[k]), 0);
                disk_fault_clear(dk);
            }
        }
    }
    struct disk_stats ss;
    disk_stats_get(dk, &ss);
    cr_expect_eq(ss.slots_free, ss.slots_total, "slots leaked");
    cr_expect_eq(ss.io_errors, 4 * (uint64_t)n, "one I/O error per -EIO injection");
    cr_expect_eq(ss.short_transfers, 4 * (uint64_t)n);
    cr_expect_eq(ss.retries, 4 * (uint64_t)n);
    cr_expect_eq(ss.checksum_failures, 0);
    disk_close(dk);
}

Test(disk_io, fault_sweep_io_uring)
{
    if (!uring_works())
        cr_skip_test("io_uring unavailable here");
    fault_sweep(DISK_ENGINE_IO_URING);
}

Test(disk_io, fault_sweep_psync) { fault_sweep(DISK_ENGINE_PSYNC); }

Test(disk_io, eagain_retries_are_bounded)
{
    struct disk_params p = params(DISK_ENGINE_PSYNC);
    struct disk *dk;
    kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);
    cr_assert_eq(disk_open(&p, &dk), 0);
    disk_slot s[1];
    int st[1];
    cr_assert_eq(disk_slot_alloc(dk, 1, DISK_SLOT_NONE, s), 0);
    fill(buf_of(0), 1000, 9);
    /* DISK_MAX_RETRIES -EAGAINs in a row are absorbed ... */
    for (unsigned long i = 1; i <= DISK_MAX_RETRIES; i++)
        cr_assert_eq(disk_fault_arm(dk, i, DISK_FAULT_ERROR, -EAGAIN), 0);
    run_batch(dk, DISK_WRITE, s, 1, st);
    cr_assert_eq(st[0], 0);
    struct disk_stats ss;
    disk_stats_get(dk, &ss);
    cr_assert_eq(ss.retries, DISK_MAX_RETRIES);
    /* ... one more fails the page with -EAGAIN instead of spinning forever. */
    for (unsigned long i = 1; i <= DISK_MAX_RETRIES + 1; i++)
        cr_assert_eq(disk_fault_arm(dk, i, DISK_FAULT_ERROR, -EAGAIN), 0);
    run_batch(dk, DISK_WRITE, s, 1, st);
    cr_assert_eq(st[0], -EAGAIN);
    memset(buf_of(0), 0, PAGE);
    run_batch(dk, DISK_READ, s, 1, st);
    cr_assert_eq(st[0], -ENODATA, "a failed write left the slot readable");
    disk_close(dk);
}

Test(disk_io, checksum_detects_flipped_bytes)
{
    struct disk_params p = params(DISK_ENGINE_AUTO);
    struct disk *dk;
    kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);
    cr_assert_eq(disk_open(&p, &dk), 0);
    const int n = 6;
    disk_slot s[NPAGES];
    int st[NPAGES];
    cr_assert_eq(disk_slot_alloc(dk, (size_t)n, DISK_SLOT_NONE, s), 0);
    for (int k = 0; k < n; k++)
        fill(buf_of(k), 1000 + (uint64_t)k, 11);
    run_batch(dk, DISK_WRITE, s, n, st);
    for (int k = 0; k < n; k++)
        cr_assert_eq(st[k], 0);
    cr_assert_eq(disk_test_corrupt(dk, s[2], 12345, 1), 0);       /* one byte */
    cr_assert_eq(disk_test_corrupt(dk, s[4], PAGE - 3, 3), 0);    /* the last bytes */
    run_batch(dk, DISK_READ, s, n, st);
    for (int k = 0; k < n; k++) {
        if (k == 2 || k == 4)
            cr_assert_eq(st[k], -EBADMSG, "corrupted page %d returned as good (%d)", k,
                         st[k]);
        else
            cr_assert_eq(st[k], 0);
    }
    struct disk_stats ss;
    disk_stats_get(dk, &ss);
    cr_assert_eq(ss.checksum_failures, 2);
    /* Identity is part of the checksum: right bytes, wrong page id. */
    struct disk_req r = { DISK_READ, s[0], buf_of(0), 999, NULL };
    cr_assert_eq(disk_submit(dk, &r, 1), 0);
    disk_wait_all(dk);
    struct disk_cqe c;
    cr_assert_eq(disk_reap(dk, &c, 1), 1);
    cr_assert_eq(c.status, -EBADMSG);
    /* Rewriting the slot makes it good again. */
    fill(buf_of(2), 1002, 12);
    struct disk_req w = { DISK_WRITE, s[2], buf_of(2), 1002, NULL };
    cr_assert_eq(disk_submit(dk, &w, 1), 0);
    disk_wait_all(dk);
    cr_assert_eq(disk_reap(dk, &c, 1), 1);
    cr_assert_eq(c.status, 0);
    memset(buf_of(2), 0, PAGE);
    r = (struct disk_req){ DISK_READ, s[2], buf_of(2), 1002, NULL };
    cr_assert_eq(disk_submit(dk, &r, 1), 0);
    disk_wait_all(dk);
    cr_assert_eq(disk_reap(dk, &c, 1), 1);
    cr_assert_eq(c.status, 0);
    cr_assert(check(buf_of(2), 1002, 12));
    disk_close(dk);
}

/* disk_checksum itself (XXH3 via libxxhash): it covers every byte of the page and its
   identity (page id and slot), and is deterministic. */
Test(disk_io, checksum_covers_bytes_and_identity)
{
    unsigned char *b = buf_of(0);
    fill(b, 77, 3);
    uint64_t sum = disk_checksum(b, PAGE, 77, (disk_slot){ 5 });
    cr_assert_eq(disk_checksum(b, PAGE, 77, (disk_slot){ 5 }), sum, "not deterministic");
    cr_assert_neq(disk_checksum(b, PAGE, 78, (disk_slot){ 5 }), sum, "page id not covered");
    cr_assert_neq(disk_checksum(b, PAGE, 77, (disk_slot){ 6 }), sum, "slot not covered");
    const size_t offs[] = { 0, 1, 63, 64, 4095, PAGE / 2, PAGE - 65, PAGE - 1 };
    for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++)
        for (int bit = 0; bit < 8; bit += 7) {
            b[offs[i]] ^= (unsigned char)(1u << bit);
            cr_assert_neq(disk_checksum(b, PAGE, 77, (disk_slot){ 5 }), sum,
                          "bit %d of byte %zu not covered", bit, offs[i]);
            b[offs[i]] ^= (unsigned char)(1u << bit);
        }
    cr_assert_eq(disk_checksum(b, PAGE, 77, (disk_slot){ 5 }), sum);
}

Test(disk_io, enomem_at_budget)
{
    struct disk_params p = params(DISK_ENGINE_AUTO);
    p.budget = 10 * PAGE + PAGE / 2;          /* 10 slots: never over the budget */
    struct disk *dk;
    cr_assert_eq(disk_open(&p, &dk), 0);
    disk_slot s[NPAGES];
    cr_assert_eq(disk_slot_alloc(dk, 11, DISK_SLOT_NONE, s), -ENOMEM);
    struct disk_stats ss;
    disk_stats_get(dk, &ss);
    cr_assert_eq(ss.slots_total, 10);
    cr_assert_eq(ss.slots_free, 10, "a failed allocation took slots");
    cr_assert_eq(disk_slot_alloc(dk, 4, DISK_SLOT_NONE, s), 0);
    cr_assert_eq(disk_slot_alloc(dk, 6, s[3], s + 4), 0);
    cr_assert_eq(disk_slot_alloc(dk, 1, DISK_SLOT_NONE, s + 10), -ENOMEM);
    int seen[10] = { 0 };
    for (int k = 0; k < 10; k++) {
        cr_assert_lt(s[k].idx, 10);
        cr_assert_eq(seen[s[k].idx]++, 0, "slot handed out twice");
    }
    cr_assert_eq(disk_slot_free(dk, s[5]), 0);
    cr_assert_eq(disk_slot_free(dk, s[5]), -EINVAL, "double free accepted");
    cr_assert_eq(disk_slot_alloc(dk, 1, DISK_SLOT_NONE, s + 5), 0);
    for (int k = 0; k < 10; k++)
        cr_assert_eq(disk_slot_free(dk, s[k]), 0);
    disk_stats_get(dk, &ss);
    cr_assert_eq(ss.slots_free, 10);
    disk_close(dk);
}

Test(disk_io, slots_cluster_by_hint)
{
    struct disk_params p = params(DISK_ENGINE_AUTO);
    p.cluster_pages = 8;                       /* 32 slots = 4 clusters */
    struct disk *dk;
    cr_assert_eq(disk_open(&p, &dk), 0);
    /* Two sequences spilling alternately, each continuing after its own last slot. */
    disk_slot a[8], b[8], ha = DISK_SLOT_NONE, hb = DISK_SLOT_NONE;
    for (int k = 0; k < 8; k++) {
        if (k == 0) {
            cr_assert_eq(disk_slot_alloc(dk, 1, ha, &a[k]), 0);
            cr_assert_eq(disk_slot_alloc(dk, 1, DISK_SLOT_NONE, &b[k]), 0);
            /* b's first slot came from a's cluster; move b to a fresh cluster by hinting at
               the end of a cluster nobody uses */
            cr_assert_eq(disk_slot_free(dk, b[0]), 0);
            cr_assert_eq(disk_slot_alloc(dk, 1, (disk_slot){ 15 }, &b[k]), 0);
        } else {
            cr_assert_eq(disk_slot_alloc(dk, 1, ha, &a[k]), 0);
            cr_assert_eq(disk_slot_alloc(dk, 1, hb, &b[k]), 0);
        }
        ha = a[k];
        hb = b[k];
    }
    for (int k = 1; k < 8; k++) {
        cr_expect_eq(a[k].idx, a[k - 1].idx + 1, "sequence a not contiguous at %d", k);
        cr_expect_eq(b[k].idx, b[k - 1].idx + 1, "sequence b not contiguous at %d", k);
    }
    /* A batch allocation is contiguous in a free cluster. */
    disk_slot c[8];
    cr_assert_eq(disk_slot_alloc(dk, 8, DISK_SLOT_NONE, c), 0);
    for (int k = 1; k < 8; k++)
        cr_expect_eq(c[k].idx, c[k - 1].idx + 1);
    cr_expect_eq(c[0].idx % 8, 0, "a batch should start a free cluster");
    disk_close(dk);
}

Test(disk_io, bad_requests_change_nothing)
{
    struct disk_params p = params(DISK_ENGINE_AUTO);
    struct disk *dk;
    kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);
    cr_assert_eq(disk_open(&p, &dk), 0);
    disk_slot s[2];
    cr_assert_eq(disk_slot_alloc(dk, 2, DISK_SLOT_NONE, s), 0);
    struct disk_req r[2] = { { DISK_WRITE, s[0], buf_of(0), 1, NULL },
                             { DISK_WRITE, s[0], buf_of(1), 2, NULL } };
    cr_assert_eq(disk_submit(dk, r, 2), -EBUSY, "one slot twice in a batch");
    r[1].slot = (disk_slot){ 31 };
    cr_assert_eq(disk_submit(dk, r, 2), -EINVAL, "unallocated slot");
    r[1].slot = s[1];
    r[1].buf = buf_of(1) + 1;
    if (disk_direct(dk))
        cr_assert_eq(disk_submit(dk, r, 2), -EINVAL, "misaligned buffer");
    r[1].buf = buf_of(1);
    r[1].op = 7;
    cr_assert_eq(disk_submit(dk, r, 2), -EINVAL);
    struct disk_stats ss;
    disk_stats_get(dk, &ss);
    cr_assert_eq(ss.inflight, 0, "a refused batch queued requests");
    /* Reading a slot never written: -ENODATA, not stale bytes. */
    r[0].op = DISK_READ;
    cr_assert_eq(disk_submit(dk, r, 1), 0, "slot 0 must not stay busy after a refusal");
    disk_wait_all(dk);
    struct disk_cqe c;
    cr_assert_eq(disk_reap(dk, &c, 1), 1);
    cr_assert_eq(c.status, -ENODATA);
    cr_assert_eq(disk_slot_free(dk, (disk_slot){ 30 }), -EINVAL);
    disk_close(dk);
}

static int cb_count, cb_bad;
static void on_complete(void *arg, const struct disk_cqe *c)
{
    (void)arg;
    __atomic_fetch_add(&cb_count, 1, __ATOMIC_SEQ_CST);
    if (c->status)
        __atomic_fetch_add(&cb_bad, 1, __ATOMIC_SEQ_CST);
}

Test(disk_io, completion_callback_and_close_waits)
{
    struct disk_params p = params(DISK_ENGINE_AUTO);
    p.on_complete = on_complete;
    struct disk *dk;
    cr_assert_eq(disk_open(&p, &dk), 0);
    disk_slot s[NPAGES];
    cr_assert_eq(disk_slot_alloc(dk, NPAGES, DISK_SLOT_NONE, s), 0);
    struct disk_req r[NPAGES];
    for (int k = 0; k < NPAGES; k++) {
        fill(buf_of(k), (uint64_t)k, 13);
        r[k] = (struct disk_req){ DISK_WRITE, s[k], buf_of(k), (uint64_t)k, NULL };
    }
    cr_assert_eq(disk_submit(dk, r, NPAGES), 0);
    disk_close(dk);     /* must wait for all of them, each delivered once */
    cr_assert_eq(cb_count, NPAGES);
    cr_assert_eq(cb_bad, 0);
}

struct worker { struct disk *dk; int base, n; uint64_t gen; int ok; };

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    disk_slot s[8];
    for (int round = 0; round < 20; round++) {
        if (disk_slot_alloc(w->dk, (size_t)w->n, DISK_SLOT_NONE, s) != 0)
            return NULL;
        struct disk_req r[8];
        for (int k = 0; k < w->n; k++) {
            uint64_t id = (uint64_t)(w->base + k);
            fill(buf_of(w->base + k), id, w->gen + (uint64_t)round);
            r[k] = (struct disk_req){ DISK_WRITE, s[k], buf_of(w->base + k), id, w };
        }
        if (disk_submit(w->dk, r, (size_t)w->n) != 0)
            return NULL;
        /* Wait for our own completions: the callback counts them per worker. */
        disk_wait_all(w->dk);
        for (int k = 0; k < w->n; k++) {
            memset(buf_of(w->base + k), 0, PAGE);
            r[k].op = DISK_READ;
        }
        if (disk_submit(w->dk, r, (size_t)w->n) != 0)
            return NULL;
        disk_wait_all(w->dk);
        for (int k = 0; k < w->n; k++)
            if (!check(buf_of(w->base + k), (uint64_t)(w->base + k), w->gen + (uint64_t)round))
                return NULL;
        for (int k = 0; k < w->n; k++)
            if (disk_slot_free(w->dk, s[k]) != 0)
                return NULL;
    }
    w->ok = 1;
    return NULL;
}

Test(disk_io, concurrent_submitters)
{
    struct disk_params p = params(DISK_ENGINE_AUTO);
    p.on_complete = on_complete;
    struct disk *dk;
    cr_assert_eq(disk_open(&p, &dk), 0);
    pthread_t t[4];
    struct worker w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (struct worker){ dk, i * 8, 8, 1000 * (uint64_t)i, 0 };
        cr_assert_eq(pthread_create(&t[i], NULL, worker_main, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        cr_expect(w[i].ok, "worker %d saw wrong bytes or an error", i);
    }
    cr_expect_eq(cb_bad, 0);
    cr_expect_eq(cb_count, 4 * 20 * 8 * 2);
    struct disk_stats ss;
    disk_stats_get(dk, &ss);
    cr_expect_eq(ss.slots_free, ss.slots_total);
    disk_close(dk);
}

Test(disk_io, tmpfs_refused_unless_opted_in)
{
    struct statfs sf;
    if (statfs("/dev/shm", &sf) != 0 || sf.f_type != TMPFS_MAGIC)
        cr_skip_test("/dev/shm is not a tmpfs here; no RAM-backed directory to test with");
    char tdir[64] = "/dev/shm/kvvm-test-spill-XXXXXX";
    if (!mkdtemp(tdir))
        cr_skip_test("cannot make a directory in /dev/shm: %s", strerror(errno));
    struct disk_params p = params(DISK_ENGINE_AUTO);
    p.dir = tdir;
    struct disk *dk = NULL;
    kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);
    int r = disk_open(&p, &dk);
    cr_expect_eq(r, -EINVAL, "a tmpfs spill directory was accepted (%d)", r);
    if (r == 0)
        disk_close(dk);
    p.flags = DISK_F_ALLOW_TMPFS | DISK_F_BUFFERED;
    r = disk_open(&p, &dk);
    cr_expect_eq(r, 0, "opted-in tmpfs refused: %d", r);
    if (r == 0) {
        roundtrip(dk, 4, 14);
        disk_close(dk);
    }
    cr_expect_eq(rmdir(tdir), 0);
}

Test(disk_io, missing_directory)
{
    struct disk_params p = params(DISK_ENGINE_AUTO);
    p.dir = "/var/tmp/kvvm-no-such-dir-for-sure/x";
    struct disk *dk;
    kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);
    cr_expect_eq(disk_open(&p, &dk), -ENOENT);
    p.dir = dir;
    p.io_size = PAGE / 3;
    cr_expect_eq(disk_open(&p, &dk), -EINVAL);
}

static int dir_entries(const char *d)
{
    DIR *dd = opendir(d);
    if (!dd)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dd)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(dd);
    return n;
}

Test(disk_io, without_o_tmpfile_the_file_is_unlinked_at_once)
{
    struct disk_params p = params(DISK_ENGINE_AUTO);
    p.flags = DISK_F_TEST_NO_TMPFILE;
    struct disk *dk;
    cr_assert_eq(disk_open(&p, &dk), 0);
    cr_assert_eq(dir_entries(dir), 0, "the created spill file still has a name");
    roundtrip(dk, 8, 15);
    disk_close(dk);
}

Test(disk_io, sigkill_mid_spill_leaves_no_file)
{
    /* io_uring (O_TMPFILE), psync, and the create-and-unlink path without O_TMPFILE. */
    for (int eng = 0; eng < 3; eng++) {
        int pfd[2];
        cr_assert_eq(pipe(pfd), 0);
        pid_t pid = fork();
        cr_assert_neq(pid, -1);
        if (pid == 0) {
            close(pfd[0]);
            struct disk_params p = params(eng == 1 ? DISK_ENGINE_PSYNC : DISK_ENGINE_AUTO);
            if (eng == 2)
                p.flags = DISK_F_TEST_NO_TMPFILE;
            struct disk *dk;
            if (disk_open(&p, &dk) != 0)
                _exit(2);
            disk_slot s[NPAGES];
            if (disk_slot_alloc(dk, NPAGES, DISK_SLOT_NONE, s) != 0)
                _exit(3);
            struct disk_req r[NPAGES];
            for (int k = 0; k < NPAGES; k++)
                r[k] = (struct disk_req){ DISK_WRITE, s[k], buf_of(k), (uint64_t)k, NULL };
            for (int round = 0;; round++) {
                if (disk_submit(dk, r, NPAGES) != 0)
                    _exit(4);
                if (round == 2 && write(pfd[1], "x", 1) != 1)
                    _exit(5);
                disk_wait_all(dk);
                struct disk_cqe c[NPAGES];
                while (disk_reap(dk, c, NPAGES))
                    ;
            }
        }
        close(pfd[1]);
        char x;
        cr_assert_eq(read(pfd[0], &x, 1), 1, "the child did not start spilling");
        close(pfd[0]);
        usleep(20000);
        kill(pid, SIGKILL);
        int wst;
        cr_assert_eq(waitpid(pid, &wst, 0), pid);
        cr_assert(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL, "child exited on its own");
        cr_assert_eq(dir_entries(dir), 0, "a file was left in the spill directory");
    }
}
