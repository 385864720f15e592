/*
 * tests/test_disk_tier.c: the disk tier (issue 5) at the sequence level, through the public API:
 * pages go device -> host -> disk and back with content cookies read back by kvvm_seq_read,
 * the invariant checker (kvvm_debug_check: disk slots == disk pages) after each phase.
 *
 * Emulated device in opaque mode, 4 KiB granules and pages, two regions, 1000 bytes per token
 * (sequences end in partial pages). The spill directory is a mkdtemp under /var/tmp, removed
 * at the end (it must be empty then: the spill file is unnamed). "Deep" contexts set the host
 * marks to low 0.9 / high 1.0 so the background spill thread pushes every host page to disk
 * (kvvm_sync waits for it). Suites: roundtrip (single, forked family, shared prefix, psync,
 * io_uring), faults (fault sweep over writes and reads, checksum corruption), limits (disk
 * budget -ENOMEM, tmpfs refusal, SIGKILL leaves no file).
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>
#include "disk/disk.h"
#include "harness.h"

#define NR 2
#define BPT 1000u
#define MAXTOK 64u

static char dir[64];

static void mkdir_spill(void)
{
    snprintf(dir, sizeof dir, "/var/tmp/kvvm_test_disk_tier.XXXXXX");
    cr_assert(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
}

static void rm_spill(void)
{
    cr_expect_eq(th_dir_entries(dir), 0, "spill dir %s not empty", dir);
    rmdir(dir);
}

static void tcfg(struct kvvm_config *c, uint32_t dev, uint32_t host, uint32_t disk, bool deep)
{
    th_config(c, KB, NR, BPT, 32, MAXTOK, dev, host, 0);
    c->spill_dir = dir;
    c->spill_budget = (size_t)disk * KB;
    if (deep) {
        c->host_min = 0.5;
        c->host_low = 0.9;
        c->host_high = 1.0;
    }
}

struct sh {
    kvvm_seq h;
    uint64_t len;
    uint8_t exp[NR][MAXTOK * BPT];
};

static struct sh *sh_new(kvvm *kv)
{
    struct sh *s = calloc(1, sizeof *s);
    cr_assert(s);
    cr_assert_eq(kvvm_seq_create(kv, &s->h), 0);
    return s;
}

static void sh_grow_fill(kvvm *kv, struct sh *s, uint64_t len, uint32_t lin)
{
    int rc = kvvm_seq_grow(kv, s->h, len);
    cr_assert_eq(rc, 0, "grow: %d", rc);
    uint64_t a = s->len * BPT, b = len * BPT;
    for (uint32_t r = 0; r < NR; r++) {
        for (uint64_t o = a; o < b; o++)
            s->exp[r][o] = cookie(lin, r, o);
        if (b > a)
            cr_assert_eq(kvvm_seq_write(kv, s->h, r, a, s->exp[r] + a, b - a), 0);
    }
    s->len = len;
}

static struct sh *sh_fork(kvvm *kv, struct sh *p)
{
    struct sh *c = calloc(1, sizeof *c);
    cr_assert(c);
    cr_assert_eq(kvvm_seq_fork(kv, p->h, &c->h), 0);
    c->len = p->len;
    memcpy(c->exp, p->exp, sizeof c->exp);
    return c;
}

static int sh_verify(kvvm *kv, struct sh *s, const char *where)
{
    static uint8_t buf[MAXTOK * BPT];
    for (uint32_t r = 0; r < NR && s->len; r++) {
        int rc = kvvm_seq_read(kv, s->h, r, 0, buf, s->len * BPT);
        if (rc)
            return rc;
        cr_assert(memcmp(buf, s->exp[r], s->len * BPT) == 0, "%s: region %u bytes differ",
                  where, r);
    }
    return 0;
}

static void t_out(kvvm *kv, struct sh *s)
{
    int rc = kvvm_seq_swap_out(kv, s->h);
    cr_assert_eq(rc, 0, "swap_out: %d (%s)", rc, kvvm_strerror(rc));
}

/* Swaps s out and lets the spill thread push it to disk. */
static void t_down(kvvm *kv, struct sh *s)
{
    t_out(kv, s);
    cr_assert_eq(kvvm_sync(kv), 0);
}

/* Frees a and closes kv: no disk or host slot leaked, nothing left in flight. */
static void free_close_no_leak(kvvm *kv, struct sh *a)
{
    kvvm_seq_free(kv, a->h);
    cr_assert_eq(kvvm_sync(kv), 0);
    struct kvvm_stats s;
    th_stats(kv, &s);
    cr_assert_eq(s.pages_disk_free, s.pages_disk_total, "disk slot leaked");
    cr_assert_eq(s.pages_host_free, s.pages_host_total, "host slot leaked");
    cr_assert_eq(s.pages_inflight, 0);
    free(a);
    kvvm_close(kv);
}

static void json(kvvm *kv, char *js, size_t len)
{
    cr_assert_eq(kvvm_stats_json(kv, js, len), 0);
}

/* ================================================================ roundtrip */

static void roundtrip_single(const char *engine)
{
    mkdir_spill();
    struct kvvm_config c;
    tcfg(&c, 64, 24, 64, true);
    kvvm *kv = th_open(&c);
    char js[8192];
    json(kv, js, sizeof js);
    if (engine) {
        char want[64];
        snprintf(want, sizeof want, "\"io_engine\":\"%s\"", engine);
        cr_assert(strstr(js, want), "engine %s not in use: %s", engine, js);
    }
    struct sh *a = sh_new(kv);
    sh_grow_fill(kv, a, 19, 1);                 /* 5 pages per region, last partial */
    kvvm_step(kv);
    t_down(kv, a);
    th_check(kv, "on disk");
    struct kvvm_seq_info in;
    th_info(kv, a->h, &in);
    cr_assert(!in.resident);
    cr_assert_eq(in.pages_disk, 10, "pages on disk: %u (host %u)", in.pages_disk, in.pages_host);
    struct kvvm_stats s1;
    th_stats(kv, &s1);
    cr_assert_eq(s1.spills, 10);
    cr_assert_eq(s1.bytes_to_disk, 10 * KB);
    cr_assert_eq(s1.pages_disk_total, 64);
    cr_assert_eq(s1.pages_disk_free, 54);
    cr_assert_eq(s1.pages_host_free, 24, "host slots freed when the writes completed");
    cr_assert_eq(s1.pages_inflight, 0);
    cr_assert_eq(kvvm_seq_swap_in(kv, a->h), 0);
    th_check(kv, "back");
    th_info(kv, a->h, &in);
    cr_assert(in.resident && in.pages_device == 10 && in.pages_disk == 0);
    struct kvvm_stats s2;
    th_stats(kv, &s2);
    cr_assert_eq(s2.unspills, 10);
    cr_assert_eq(s2.bytes_from_disk, 10 * KB);
    cr_assert_eq(s2.pages_disk_free, 64, "disk slots freed at swap-in");
    cr_assert_eq(s2.pages_host_free, 24, "host slots freed at swap-in");
    cr_assert_eq(s2.checksum_failures + s2.io_errors, 0);
    cr_assert_eq(sh_verify(kv, a, "roundtrip"), 0);
    /* twice more, growing in between: same addresses, new pages */
    for (int i = 0; i < 2; i++) {
        sh_grow_fill(kv, a, 25 + 10 * i, 2 + i);
        kvvm_step(kv);
        t_down(kv, a);
        cr_assert_eq(sh_verify(kv, a, "again"), 0);      /* read swaps it in */
        th_check(kv, "again");
    }
    if (engine && !strcmp(engine, "io_uring")) {
        /* the pages really went through the ring: 10 + 14 + 18 pages down and back */
        struct disk_stats ss;
        disk_stats_get(kvvm_debug_disk(kv), &ss);
        cr_assert(!strcmp(disk_engine_name(kvvm_debug_disk(kv)), "io_uring"));
        cr_assert_geq(ss.submissions, 2 * (10 + 14 + 18), "submissions %lu",
                      (unsigned long)ss.submissions);
        cr_assert_eq(ss.writes, 42);
        cr_assert_eq(ss.reads, 42);
    }
    kvvm_seq_free(kv, a->h);
    free(a);
    th_check(kv, "end");
    kvvm_close(kv);
    rm_spill();
}

Test(roundtrip, single) { roundtrip_single(NULL); }

Test(roundtrip, psync)
{
    setenv("KVVM_IO_ENGINE", "psync", 1);
    roundtrip_single("psync");
}

/* When io_uring works on this machine, the default engine must be io_uring and the pages
   must really have gone through it. */
Test(roundtrip, io_uring)
{
    unsetenv("KVVM_IO_ENGINE");
    mkdir_spill();
    struct disk_params dp = { .dir = dir, .budget = 16 * KB, .page_size = KB,
                              .engine = DISK_ENGINE_IO_URING };
    struct disk *probe;
    int rc = disk_open(&dp, &probe);
    rmdir(dir);
    if (rc) {
        cr_log_warn("io_uring is not available here (%d): the default engine test is the "
                    "psync one", rc);
        return;
    }
    disk_close(probe);
    roundtrip_single("io_uring");
}

Test(roundtrip, forked_family)
{
    mkdir_spill();
    struct kvvm_config c;
    tcfg(&c, 64, 16, 128, true);
    kvvm *kv = th_open(&c);
    struct sh *p = sh_new(kv);
    sh_grow_fill(kv, p, 10, 1);
    struct sh *c1 = sh_fork(kv, p), *c2 = sh_fork(kv, p);
    sh_grow_fill(kv, c1, 21, 2);
    sh_grow_fill(kv, c2, 17, 3);
    kvvm_step(kv);
    t_down(kv, c1);
    t_down(kv, p);
    t_down(kv, c2);
    th_check(kv, "family on disk");
    struct kvvm_stats s;
    th_stats(kv, &s);
    /* shared pages go down once: p's 3 pages per region (the 3rd partial is copied on write
       by each child) + c1's and c2's own */
    cr_assert_eq(s.pages_disk_total - s.pages_disk_free, s.spills - s.unspills);
    cr_assert_eq(s.pages_host_free, 16);
    /* a fork and a truncate while on disk read nothing back */
    struct sh *c3 = sh_fork(kv, c1);
    cr_assert_eq(kvvm_seq_truncate(kv, c3->h, 12), 0);
    c3->len = 12;
    th_stats(kv, &s);
    cr_assert_eq(s.unspills, 0);
    th_check(kv, "fork/truncate on disk");
    struct sh *order[] = { c2, p, c3, c1 };
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(kvvm_seq_swap_in(kv, order[i]->h), 0);
        cr_assert_eq(sh_verify(kv, order[i], "family"), 0);
        th_check(kv, "family back");
    }
    for (int i = 0; i < 4; i++) {
        kvvm_seq_free(kv, order[i]->h);
        free(order[i]);
    }
    th_stats(kv, &s);
    cr_assert_eq(s.pages_disk_free, s.pages_disk_total);
    th_check(kv, "end");
    kvvm_close(kv);
    rm_spill();
}

/* share from a sequence on disk (its partial page comes back through the host); freeing a
   sequence whose pages are on disk frees their slots without reading them. */
Test(roundtrip, shared_prefix)
{
    mkdir_spill();
    struct kvvm_config c;
    tcfg(&c, 64, 16, 128, true);
    kvvm *kv = th_open(&c);
    struct sh *a = sh_new(kv);
    sh_grow_fill(kv, a, 19, 1);
    kvvm_step(kv);
    t_down(kv, a);
    struct sh *b = sh_new(kv);
    cr_assert_eq(kvvm_seq_share(kv, b->h, a->h, 13), 0);
    b->len = 13;
    memcpy(b->exp, a->exp, sizeof b->exp);
    for (uint32_t r = 0; r < NR; r++)
        memset(b->exp[r] + 13 * BPT, 0, sizeof b->exp[r] - 13 * BPT);
    th_check(kv, "shared from disk");
    cr_assert_eq(kvvm_sync(kv), 0);
    cr_assert_eq(sh_verify(kv, b, "b"), 0);
    sh_grow_fill(kv, b, 30, 5);
    kvvm_step(kv);
    t_down(kv, b);
    cr_assert_eq(kvvm_seq_free(kv, a->h), 0);      /* on disk: freed without reading */
    th_check(kv, "a freed");
    cr_assert_eq(sh_verify(kv, b, "b again"), 0);
    kvvm_seq_free(kv, b->h);
    struct kvvm_stats s;
    th_stats(kv, &s);
    cr_assert_eq(s.pages_disk_free, s.pages_disk_total);
    cr_assert_eq(s.pages_host_free, 16);
    th_check(kv, "end");
    free(a);
    free(b);
    kvvm_close(kv);
    rm_spill();
}

/* ================================================================ faults */

/* Fails the nth I/O submission (writes of the spill, then reads of the swap-in) with each
   kind of fault. No data loss: either the bytes come back intact, or (a failed read) the
   sequence is damaged (-EBADMSG) until truncated; no slot leaks either way. */
Test(faults, sweep)
{
    mkdir_spill();
    struct { enum disk_fault_kind k; int err; const char *name; } kinds[] = {
        { DISK_FAULT_ERROR, -EIO, "EIO" }, { DISK_FAULT_SHORT, 0, "short" },
        { DISK_FAULT_ERROR, -EAGAIN, "EAGAIN" },
    };
    unsigned damaged = 0, write_fail = 0;
    for (size_t k = 0; k < 3; k++)
        for (unsigned long nth = 1; nth <= 22; nth++) {
            struct kvvm_config c;
            tcfg(&c, 64, 16, 64, true);
            kvvm *kv = th_open(&c);
            struct disk *dk = kvvm_debug_disk(kv);
            cr_assert(dk);
            struct sh *a = sh_new(kv);
            sh_grow_fill(kv, a, 19, (uint32_t)nth);
            kvvm_step(kv);
            cr_assert_eq(disk_fault_arm(dk, nth, kinds[k].k, kinds[k].err), 0);
            t_down(kv, a);
            th_check(kv, "down");
            int rc = kvvm_seq_swap_in(kv, a->h);
            struct kvvm_stats s;
            th_stats(kv, &s);
            if (rc == 0) {
                cr_assert_eq(sh_verify(kv, a, kinds[k].name), 0);
                write_fail += s.io_errors > 0;
            } else {
                cr_assert_eq(rc, -EBADMSG, "%s at %lu: swap_in %d", kinds[k].name, nth, rc);
                cr_assert_eq(kinds[k].k, DISK_FAULT_ERROR);
                cr_assert_eq(kinds[k].err, -EIO, "only a hard error loses data");
                cr_assert(s.pages_damaged >= 1 && s.io_errors >= 1);
                uint8_t b[BPT];
                cr_assert_eq(kvvm_seq_read(kv, a->h, 0, 0, b, BPT), -EBADMSG);
                cr_assert_eq(kvvm_seq_grow(kv, a->h, 20), -EBADMSG);
                th_check(kv, "damaged");
                cr_assert_eq(kvvm_seq_truncate(kv, a->h, 0), 0);
                a->len = 0;
                sh_grow_fill(kv, a, 7, 99);
                cr_assert_eq(sh_verify(kv, a, "after truncate"), 0);
                damaged++;
            }
            th_check(kv, kinds[k].name);
            free_close_no_leak(kv, a);
        }
    cr_assert(damaged > 0, "no read failure was injected");
    cr_assert(write_fail > 0, "no write failure was injected");
    rm_spill();
}

Test(faults, checksum)
{
    mkdir_spill();
    struct kvvm_config c;
    tcfg(&c, 64, 16, 64, true);
    kvvm *kv = th_open(&c);
    struct sh *a = sh_new(kv), *b = sh_new(kv);
    sh_grow_fill(kv, a, 19, 1);
    kvvm_step(kv);
    t_down(kv, a);
    sh_grow_fill(kv, b, 9, 2);
    kvvm_step(kv);
    t_down(kv, b);
    /* a's pages took the first slots (clustered): flip bytes in slot 0 */
    cr_assert_eq(disk_test_corrupt(kvvm_debug_disk(kv), (disk_slot){ 0 }, 100, 8), 0);
    cr_assert_eq(kvvm_seq_swap_in(kv, a->h), -EBADMSG);
    uint8_t buf[BPT];
    cr_assert_eq(kvvm_seq_read(kv, a->h, 1, 0, buf, BPT), -EBADMSG);
    struct kvvm_stats s;
    th_stats(kv, &s);
    cr_assert_eq(s.checksum_failures, 1);
    cr_assert_eq(s.pages_damaged, 1);
    th_check(kv, "damaged");
    /* b is unaffected */
    cr_assert_eq(sh_verify(kv, b, "b"), 0);
    cr_assert_eq(kvvm_seq_truncate(kv, a->h, 0), 0);
    a->len = 0;
    sh_grow_fill(kv, a, 5, 3);
    cr_assert_eq(sh_verify(kv, a, "a after truncate"), 0);
    th_stats(kv, &s);
    cr_assert_eq(s.checksum_failures, 1);
    th_check(kv, "end");
    kvvm_seq_free(kv, a->h);
    kvvm_seq_free(kv, b->h);
    free(a);
    free(b);
    kvvm_close(kv);
    rm_spill();
}

/* ================================================================ limits */

/* A full disk tier is pressure: swap_out is -ENOMEM and the sequence stays as it was. */
Test(limits, disk_budget)
{
    mkdir_spill();
    struct kvvm_config c;
    tcfg(&c, 64, 16, 16, false);
    kvvm *kv = th_open(&c);
    struct sh *s[4];
    for (int i = 0; i < 4; i++) {
        s[i] = sh_new(kv);
        sh_grow_fill(kv, s[i], 19, (uint32_t)i + 1);
    }
    kvvm_step(kv);
    t_out(kv, s[0]);
    t_out(kv, s[1]);          /* pushes s[0]'s host pages to disk to make room */
    t_out(kv, s[2]);
    cr_assert_eq(kvvm_sync(kv), 0);   /* the spill thread settles */
    struct kvvm_stats s0, s1;
    th_stats(kv, &s0);
    cr_assert(s0.spills > 0);
    int rc = kvvm_seq_swap_out(kv, s[3]->h);
    cr_assert_eq(rc, -ENOMEM, "swap_out past the disk budget: %d", rc);
    struct kvvm_seq_info in;
    th_info(kv, s[3]->h, &in);
    cr_assert(in.resident && in.pages_device == 10);
    th_stats(kv, &s1);
    cr_assert_eq(s1.swap_outs, s0.swap_outs);
    /* checked first: the failed call spilled nothing of the others to make room */
    cr_assert_eq(s1.pages_disk_free, s0.pages_disk_free);
    cr_assert_eq(s1.spills, s0.spills);
    th_check(kv, "full");
    cr_assert_eq(sh_verify(kv, s[3], "s3"), 0);
    for (int i = 2; i >= 0; i--) {
        cr_assert_eq(kvvm_seq_swap_in(kv, s[i]->h), 0);
        cr_assert_eq(sh_verify(kv, s[i], "back"), 0);
    }
    th_check(kv, "end");
    for (int i = 0; i < 4; i++) {
        kvvm_seq_free(kv, s[i]->h);
        free(s[i]);
    }
    kvvm_close(kv);
    rm_spill();
}

Test(limits, tmpfs_refused)
{
    struct statfs fs;
    if (statfs("/dev/shm", &fs) || fs.f_type != 0x01021994 /* TMPFS_MAGIC */) {
        cr_log_warn("/dev/shm is not a tmpfs here: skipped");
        return;
    }
    snprintf(dir, sizeof dir, "/dev/shm");
    struct kvvm_config c;
    tcfg(&c, 16, 16, 16, false);
    kvvm *kv = NULL;
    cr_assert_eq(kvvm_open(&c, &kv), -EINVAL);
    cr_assert_null(kv);
    c.flags = KVVM_F_SPILL_ALLOW_TMPFS;
    cr_assert_eq(kvvm_open(&c, &kv), 0);
    char js[8192];
    json(kv, js, sizeof js);
    cr_assert(!strstr(js, "\"io_engine\":\"none\""), "%s", js);
    kvvm_close(kv);
}

/* A child spilling constantly, killed with SIGKILL, leaves nothing in the spill dir. */
Test(limits, sigkill_leaves_no_file)
{
    mkdir_spill();
    int pfd[2];
    cr_assert_eq(pipe(pfd), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        close(pfd[0]);
        struct kvvm_config c;
        tcfg(&c, 64, 16, 64, true);
        kvvm *kv;
        if (kvvm_open(&c, &kv))
            _exit(2);
        kvvm_seq h;
        if (kvvm_seq_create(kv, &h) || kvvm_seq_grow(kv, h, 40))
            _exit(3);
        for (unsigned long i = 0;; i++) {
            kvvm_step(kv);
            kvvm_seq_swap_out(kv, h);
            kvvm_sync(kv);
            if (i == 3 && write(pfd[1], "x", 1) != 1)
                _exit(4);
            kvvm_seq_swap_in(kv, h);
        }
    }
    close(pfd[1]);
    char ch;
    cr_assert_eq(read(pfd[0], &ch, 1), 1, "the child did not start spilling");
    usleep(20000);
    kill(pid, SIGKILL);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    close(pfd[0]);
    rm_spill();
}

/* ================================================================ staged */
/* Sequences with more pages than the host tier has slots: swap-out stages them through the
   host tier to disk in batches, swap-in brings them back batch by batch (both synchronous).
   Host tier 8 slots; the big sequence has 49 tokens = 12 pages per region, 24 pages (3x). */

#define ST_HOST 8u
#define ST_TOK 49u
#define ST_PAGES 24u

static void staged_roundtrip(bool stream)
{
    mkdir_spill();
    struct kvvm_config c;
    tcfg(&c, 64, ST_HOST, 64, false);
    kvvm *kv = th_open(&c);
    void *st = NULL;
    if (stream) {
        cr_assert_eq(kvvm_stream_create(kv, &st), 0);
        cr_assert_eq(kvvm_set_stream(kv, st), 0);
    }
    struct sh *a = sh_new(kv), *b = sh_new(kv);
    sh_grow_fill(kv, a, ST_TOK, 7);
    sh_grow_fill(kv, b, 9, 8);                  /* 3 pages per region, stays resident */
    kvvm_step(kv);
    for (int round = 0; round < 2; round++) {
        int rc = kvvm_seq_swap_out(kv, a->h);
        cr_assert_eq(rc, 0, "staged swap_out: %d (%s)", rc, kvvm_strerror(rc));
        th_check(kv, "staged out");
        struct kvvm_seq_info in;
        th_info(kv, a->h, &in);
        cr_assert(!in.resident);
        cr_assert_eq(in.pages_disk, ST_PAGES, "disk %u host %u device %u", in.pages_disk,
                     in.pages_host, in.pages_device);
        cr_assert_eq(in.pages_host + in.pages_device, 0);
        struct kvvm_stats s1;
        th_stats(kv, &s1);
        cr_assert_eq(s1.spills, (round + 1) * ST_PAGES);
        cr_assert_eq(s1.pages_disk_free, 64 - ST_PAGES);
        cr_assert_eq(s1.pages_host_free, ST_HOST, "staging slots freed");
        cr_assert_eq(s1.pages_inflight, 0);
        cr_assert_eq(s1.swap_outs, (uint64_t)round + 1);
        rc = kvvm_seq_swap_in(kv, a->h);
        cr_assert_eq(rc, 0, "staged swap_in: %d (%s)", rc, kvvm_strerror(rc));
        th_check(kv, "staged in");
        th_info(kv, a->h, &in);
        cr_assert(in.resident && in.pages_device == ST_PAGES && in.pages_disk == 0 &&
                  in.pages_host == 0);
        struct kvvm_stats s2;
        th_stats(kv, &s2);
        cr_assert_eq(s2.unspills, (round + 1) * ST_PAGES);
        cr_assert_eq(s2.pages_disk_free, 64);
        cr_assert_eq(s2.pages_host_free, ST_HOST);
        cr_assert_eq(s2.checksum_failures + s2.io_errors, 0);
        cr_assert_eq(sh_verify(kv, a, "staged"), 0);
        cr_assert_eq(sh_verify(kv, b, "bystander"), 0);
        kvvm_step(kv);
    }
    /* the same through a read (swap-in on use) */
    cr_assert_eq(kvvm_seq_swap_out(kv, a->h), 0);
    cr_assert_eq(sh_verify(kv, a, "read swaps in"), 0);
    th_check(kv, "end");
    kvvm_seq_free(kv, a->h);
    kvvm_seq_free(kv, b->h);
    free(a);
    free(b);
    if (stream) {
        cr_assert_eq(kvvm_set_stream(kv, NULL), 0);
        cr_assert_eq(kvvm_stream_destroy(kv, st), 0);
    }
    kvvm_close(kv);
    rm_spill();
}

Test(staged, roundtrip_sync) { staged_roundtrip(false); }
Test(staged, roundtrip_stream) { staged_roundtrip(true); }

/* I/O faults on the staged path (every write and read of a staged swap-out / swap-in):
   the call succeeds (retried, resubmitted) or fails with the sequence wholly where it was,
   no slot leaked, every byte readable (a failed read is damage: -EBADMSG, per contract). */
Test(staged, io_faults)
{
    mkdir_spill();
    struct { enum disk_fault_kind k; int err; const char *name; } kinds[] = {
        { DISK_FAULT_ERROR, -EIO, "EIO" }, { DISK_FAULT_SHORT, 0, "short" },
        { DISK_FAULT_ERROR, -EAGAIN, "EAGAIN" },
    };
    unsigned out_failed = 0, in_failed = 0;
    for (size_t k = 0; k < 3; k++)
        for (unsigned long nth = 1; nth <= 2 * ST_PAGES + 2; nth += 3) {
            struct kvvm_config c;
            tcfg(&c, 64, ST_HOST, 64, false);
            kvvm *kv = th_open(&c);
            struct disk *dk = kvvm_debug_disk(kv);
            struct sh *a = sh_new(kv);
            sh_grow_fill(kv, a, ST_TOK, (uint32_t)nth);
            kvvm_step(kv);
            cr_assert_eq(disk_fault_arm(dk, nth, kinds[k].k, kinds[k].err), 0);
            int rc = kvvm_seq_swap_out(kv, a->h);
            th_check(kv, "out");
            struct kvvm_seq_info in;
            th_info(kv, a->h, &in);
            struct kvvm_stats s;
            if (rc) {
                out_failed++;
                cr_assert_eq(kinds[k].err, -EIO, "%s at %lu: swap_out %d", kinds[k].name,
                             nth, rc);
                cr_assert(in.resident && in.pages_device == ST_PAGES && in.pages_disk == 0,
                          "a failed staged swap_out moved the sequence");
                th_stats(kv, &s);
                cr_assert_eq(s.pages_disk_free, s.pages_disk_total, "disk slot leaked");
                cr_assert_eq(s.pages_host_free, s.pages_host_total, "host slot leaked");
                cr_assert_eq(s.swap_outs, 0);
            } else {
                cr_assert(!in.resident && in.pages_disk == ST_PAGES);
                rc = kvvm_seq_swap_in(kv, a->h);
                th_check(kv, "in");
                th_info(kv, a->h, &in);
                if (rc) {
                    in_failed++;
                    cr_assert_eq(rc, -EBADMSG, "%s at %lu: swap_in %d", kinds[k].name, nth,
                                 rc);
                    cr_assert_eq(kinds[k].err, -EIO, "only a hard error loses data");
                    cr_assert(!in.resident && in.pages_disk == ST_PAGES,
                              "a failed staged swap_in moved the sequence");
                    th_stats(kv, &s);
                    cr_assert_eq(s.pages_host_free, s.pages_host_total, "host slot leaked");
                    cr_assert(s.pages_damaged >= 1);
                    cr_assert_eq(kvvm_seq_truncate(kv, a->h, 0), 0);
                    a->len = 0;
                } else {
                    cr_assert(in.resident && in.pages_device == ST_PAGES);
                }
            }
            cr_assert_eq(sh_verify(kv, a, kinds[k].name), 0);
            th_check(kv, kinds[k].name);
            free_close_no_leak(kv, a);
        }
    cr_assert(out_failed > 0, "no write failure was injected");
    cr_assert(in_failed > 0, "no read failure was injected");
    rm_spill();
}

/* Fail-at-call-N over the driver calls of a staged swap-out and a staged swap-in: each
   failing call leaves the sequence wholly where it was and every byte readable. */
enum { ST_OUT, ST_IN };

struct st_state {
    int which;
    kvvm *kv;
    struct sh *a;
    struct kvvm_seq_info i0;        /* a before the armed call */
};

static void st_setup(void *arg)
{
    struct st_state *st = arg;
    struct kvvm_config c;
    tcfg(&c, 64, ST_HOST, 64, false);
    st->kv = th_open(&c);
    st->a = sh_new(st->kv);
    sh_grow_fill(st->kv, st->a, ST_TOK, 5);
    kvvm_step(st->kv);
    if (st->which == ST_IN)
        cr_assert_eq(kvvm_seq_swap_out(st->kv, st->a->h), 0);
}

static int st_call(void *arg)
{
    struct st_state *st = arg;
    return st->which == ST_OUT ? kvvm_seq_swap_out(st->kv, st->a->h)
                               : kvvm_seq_swap_in(st->kv, st->a->h);
}

static void st_teardown(void *arg)
{
    struct st_state *st = arg;
    free(st->a);
    kvvm_close(st->kv);
}

static void st_before(void *arg)
{
    struct st_state *st = arg;
    th_info(st->kv, st->a->h, &st->i0);
}

static enum th_sweep_outcome st_after(void *arg, int rc, const char *w)
{
    struct st_state *st = arg;
    kvvm *kv = st->kv;
    if (rc == -EIO && kvvm_sync(kv) != 0)
        return TH_SWEEP_DEAD;          /* a sticky failure: the context is dead */
    struct kvvm_seq_info i0 = st->i0, i1;
    th_info(kv, st->a->h, &i1);
    if (rc) {
        cr_assert(i1.resident == i0.resident && i1.pages_device == i0.pages_device &&
                  i1.pages_host == i0.pages_host && i1.pages_disk == i0.pages_disk,
                  "%s: state changed: resident %d->%d device %u->%u host %u->%u disk "
                  "%u->%u", w, i0.resident, i1.resident, i0.pages_device, i1.pages_device,
                  i0.pages_host, i1.pages_host, i0.pages_disk, i1.pages_disk);
        struct kvvm_stats s;
        th_stats(kv, &s);
        cr_assert_eq(s.pages_host_free, s.pages_host_total, "host slot leaked");
        cr_assert_eq(s.pages_disk_free, s.pages_disk_total - i1.pages_disk,
                     "disk slot leaked");
    }
    th_check(kv, w);
    cr_assert_eq(sh_verify(kv, st->a, w), 0);
    th_check(kv, w);
    return rc ? TH_SWEEP_FAILED : TH_SWEEP_ABSORBED;
}

static void st_sweep(int which, const char *name)
{
    mkdir_spill();
    static const kcu_result inval[1] = { KCU_ERROR_INVALID_VALUE };
    struct st_state st = { .which = which };
    const struct th_sweep sw = { name, &st, st_setup, st_call, st_teardown, st_before,
                                 st_after, inval, 1 };
    struct th_sweep_count n = th_sweep_run(&sw);
    /* the dead ones are counted among the failed: these are the calls that failed alive */
    cr_assert(n.failed > n.dead, "%s: no injected failure made the call fail", name);
    rm_spill();
}

Test(staged, driver_faults_out) { st_sweep(ST_OUT, "staged out"); }
Test(staged, driver_faults_in) { st_sweep(ST_IN, "staged in"); }

/* A swap_out the disk tier cannot take fails before anything moves: the other sequences'
   pages stay where they were (no spill to make room), the stats do not change. */
Test(staged, disk_full_moves_nothing)
{
    mkdir_spill();
    struct kvvm_config c;
    tcfg(&c, 64, 16, 16, false);
    kvvm *kv = th_open(&c);
    struct sh *a = sh_new(kv), *b = sh_new(kv), *big = sh_new(kv), *mid = sh_new(kv);
    sh_grow_fill(kv, a, 19, 1);                 /* 10 pages */
    sh_grow_fill(kv, b, 19, 2);                 /* 10 pages */
    sh_grow_fill(kv, big, ST_TOK, 3);           /* 24 pages */
    sh_grow_fill(kv, mid, 31, 4);               /* 16 pages */
    kvvm_step(kv);
    t_out(kv, a);
    t_out(kv, b);                               /* spills 4 of a's pages for room */
    cr_assert_eq(kvvm_sync(kv), 0);
    struct kvvm_seq_info ia0, ib0, ia1, ib1, in;
    th_info(kv, a->h, &ia0);
    th_info(kv, b->h, &ib0);
    cr_assert_eq(ia0.pages_host + ia0.pages_disk + ib0.pages_host + ib0.pages_disk, 20);
    cr_assert(ia0.pages_disk + ib0.pages_disk < 16, "the disk tier has room left");
    struct kvvm_stats s0, s1;
    th_stats(kv, &s0);
    /* 24 pages: more than host + disk room; 16 pages: more than the free disk + host room
       (both could be had in part by spilling a's and b's host pages) */
    struct sh *v[2] = { big, mid };
    for (int i = 0; i < 2; i++) {
        int rc = kvvm_seq_swap_out(kv, v[i]->h);
        cr_assert_eq(rc, -ENOMEM, "swap_out past the disk budget: %d", rc);
        cr_assert_eq(kvvm_sync(kv), 0);
        th_info(kv, v[i]->h, &in);
        cr_assert(in.resident && in.pages_disk == 0 && in.pages_host == 0);
        th_info(kv, a->h, &ia1);
        th_info(kv, b->h, &ib1);
        cr_assert(ia1.pages_host == ia0.pages_host && ia1.pages_disk == ia0.pages_disk,
                  "a moved: host %u->%u disk %u->%u", ia0.pages_host, ia1.pages_host,
                  ia0.pages_disk, ia1.pages_disk);
        cr_assert(ib1.pages_host == ib0.pages_host && ib1.pages_disk == ib0.pages_disk,
                  "b moved: host %u->%u disk %u->%u", ib0.pages_host, ib1.pages_host,
                  ib0.pages_disk, ib1.pages_disk);
        th_stats(kv, &s1);
        cr_assert_eq(s1.spills, s0.spills);
        cr_assert_eq(s1.swap_outs, s0.swap_outs);
        cr_assert_eq(s1.pages_disk_free, s0.pages_disk_free);
        cr_assert_eq(s1.pages_host_free, s0.pages_host_free);
        cr_assert_eq(s1.bytes_to_host, s0.bytes_to_host);
        th_check(kv, "full");
    }
    cr_assert_eq(sh_verify(kv, big, "big"), 0);
    cr_assert_eq(sh_verify(kv, mid, "mid"), 0);
    cr_assert_eq(sh_verify(kv, a, "a"), 0);
    cr_assert_eq(sh_verify(kv, b, "b"), 0);
    th_check(kv, "end");
    struct sh *all[4] = { a, b, big, mid };
    for (int i = 0; i < 4; i++) {
        kvvm_seq_free(kv, all[i]->h);
        free(all[i]);
    }
    kvvm_close(kv);
    rm_spill();
}

/* Regression: direct reclaim pushed host pages to disk to make room before its own
   all-or-nothing check, so a grow that then failed with -ENOMEM had moved other sequences'
   pages down. The check now comes first. */
Test(limits, failed_direct_reclaim_moves_nothing)
{
    mkdir_spill();
    struct kvvm_config c;
    tcfg(&c, 40, 16, 16, false);
    c.flags = KVVM_F_AUTO_SWAP;
    kvvm *kv = th_open(&c);
    struct sh *a = sh_new(kv), *b = sh_new(kv), *v = sh_new(kv), *p = sh_new(kv);
    sh_grow_fill(kv, a, 19, 1);                 /* 10 pages */
    sh_grow_fill(kv, b, 19, 2);                 /* 10 pages */
    kvvm_step(kv);
    t_out(kv, a);
    t_out(kv, b);
    sh_grow_fill(kv, v, 31, 3);                 /* 16 pages, reclaimable after two steps */
    cr_assert_eq(kvvm_step(kv), 0);
    cr_assert_eq(kvvm_step(kv), 0);
    sh_grow_fill(kv, p, 19, 4);                 /* 10 pages, protected */
    cr_assert_eq(kvvm_sync(kv), 0);             /* background spilling settles */
    struct kvvm_seq_info ia0, ib0, ia1, ib1;
    th_info(kv, a->h, &ia0);
    th_info(kv, b->h, &ib0);
    struct kvvm_stats s0, s1;
    th_stats(kv, &s0);
    cr_assert_lt(s0.pages_host_free, 18, "the grow below must need host room");
    kvvm_seq w;
    cr_assert_eq(kvvm_seq_create(kv, &w), 0);
    /* 32 pages: more than the free frames plus v's 16 */
    int rc = kvvm_seq_grow(kv, w, 64);
    cr_assert_eq(rc, -ENOMEM, "grow past what reclaim can free: %d", rc);
    th_stats(kv, &s1);
    th_info(kv, a->h, &ia1);
    th_info(kv, b->h, &ib1);
    cr_expect_eq(s1.spills, s0.spills, "a failed grow spilled %lu page(s)",
                 (unsigned long)(s1.spills - s0.spills));
    cr_expect_eq(s1.swap_outs, s0.swap_outs);
    cr_expect(ia1.pages_host == ia0.pages_host && ia1.pages_disk == ia0.pages_disk &&
              ib1.pages_host == ib0.pages_host && ib1.pages_disk == ib0.pages_disk,
              "other sequences moved down");
    th_check(kv, "failed direct reclaim");
    cr_assert_eq(kvvm_seq_free(kv, w), 0);
    /* nothing lost: each comes back (room made by freeing the resident ones first) */
    cr_assert_eq(sh_verify(kv, v, "v"), 0);
    cr_assert_eq(sh_verify(kv, p, "p"), 0);
    cr_assert_eq(kvvm_seq_free(kv, v->h), 0);
    cr_assert_eq(kvvm_seq_free(kv, p->h), 0);
    cr_assert_eq(kvvm_step(kv), 0);
    cr_assert_eq(sh_verify(kv, a, "a"), 0);
    cr_assert_eq(sh_verify(kv, b, "b"), 0);
    cr_assert_eq(kvvm_seq_free(kv, a->h), 0);
    cr_assert_eq(kvvm_seq_free(kv, b->h), 0);
    struct sh *all[4] = { a, b, v, p };
    for (int i = 0; i < 4; i++)
        free(all[i]);
    kvvm_close(kv);
    rm_spill();
}
