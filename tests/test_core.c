/*
 * tests/test_core.c: the context itself through the public API (include/kvvm.h,
 * docs/api.md): the calls' frame in core/ (arguments, errors, a dead or forked context,
 * the caller's current device context, the engine stream's checks) and the context's
 * configuration, layout and options, checked against the emulated device's own tables
 * (kvvm_debug_check) and with content cookies read back through kvvm_seq_read (the shadow
 * harness of tests/harness.h, shared with tests/test_paging.c).
 *
 * Suites: errors (every error of docs/api.md these calls can return, each followed by a
 * check that nothing changed), config, layout, options (map-ahead, scrub, stream mode and
 * which streams it takes), per_thread_stream, current_context and fork_child (a caller's
 * context and a fork() child), regress (one test per fixed defect, named after it), tiers
 * (the list of tiers below the device, core/tiers.h: a tier added to it, the tests'
 * in-memory one of tests/tier_mem.c, is opened, counted, checked and explained as the
 * built-in ones are).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#define KVVM_HARNESS_SHADOW
#include "harness.h"
#include "tier_mem.h"
#include "core/tiers.h"

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
/* kvvm_step's -ENOMEM (include/kvvm.h and docs/api.md list it): the step fence, made at
   the first step in stream mode, cannot be had; nothing changed, the next step makes it. */
Test(errors, step_enomem_when_the_step_fence_cannot_be_made)
{
    struct kvvm_config c;
    struct tctx t;
    void *st;
    tcfg(&c, KB, 2, 64, 4, 64, 16);
    topen_stream(&t, &c, &st);
    kvvm_seq a;
    cr_assert_eq(kvvm_seq_create(t.kv, &a), 0);
    cr_assert_eq(kvvm_seq_grow(t.kv, a, 10), 0);
    cr_assert_eq(emu_fail_arm("cuEventCreate", 1, KCU_ERROR_OUT_OF_MEMORY), 0);
    int rc = kvvm_step(t.kv);
    emu_fail_clear();
    cr_expect_eq(rc, -ENOMEM, "kvvm_step without memory for its fence: %d (%s)", rc,
                 kvvm_last_error());
    cr_expect(strstr(kvvm_last_error(), "kvvm_step") || strstr(kvvm_last_error(),
              "cuEventCreate"), "%s", kvvm_last_error());
    cr_assert_eq(kvvm_step(t.kv), 0, "%s", kvvm_last_error());
    tcheck(&t, "after a failed step");
    cr_assert_eq(kvvm_seq_free(t.kv, a), 0);
    tclose_stream(&t, st);
}

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

/* The 0.4 fields: their defaults and KVVM_* variables, the defaults for a struct from
   before them (its size ends at store_timeout_ms), and a pool_socket where no daemon
   answers refused -ECONNREFUSED with a reason. */
Test(config, fields_of_0_4)
{
    struct kvvm_config c;
    kvvm_config_init(&c);
    cr_expect_null(c.pool_socket);
    cr_expect_null(c.client_name);
    cr_expect_eq(c.pool_reserve, 0);
    cr_expect_eq(c.pool_timeout_ms, 1000);
    cr_expect_eq(c.store_queue_bytes, 64u << 20);
    setenv("KVVM_CLIENT_NAME", "decode-1", 1);
    setenv("KVVM_POOL_RESERVE", "8M", 1);
    setenv("KVVM_POOL_TIMEOUT_MS", "250", 1);
    setenv("KVVM_STORE_QUEUE_BYTES", "1G", 1);
    kvvm_config_init(&c);
    unsetenv("KVVM_CLIENT_NAME");
    unsetenv("KVVM_POOL_RESERVE");
    unsetenv("KVVM_POOL_TIMEOUT_MS");
    unsetenv("KVVM_STORE_QUEUE_BYTES");
    cr_expect_str_eq(c.client_name ? c.client_name : "(null)", "decode-1");
    cr_expect_eq(c.pool_reserve, 8u << 20);
    cr_expect_eq(c.pool_timeout_ms, 250);
    cr_expect_eq(c.store_queue_bytes, 1ull << 30);

    /* a struct from 0.3 (it ends at store_timeout_ms): the 0.4 defaults, the JSON says so */
    tcfg(&c, 64 * 1024, 1, 256, 2, 256, 4);
    memset(&c.pool_socket, 0xff, sizeof c - offsetof(struct kvvm_config, pool_socket));
    c.size = offsetof(struct kvvm_config, store_timeout_ms) + sizeof c.store_timeout_ms;
    struct tctx t;
    topen(&t, &c);
    char js[16384];
    cr_assert_eq(kvvm_stats_json(t.kv, js, sizeof js), 0);
    cr_expect(strstr(js, "\"pool_timeout_ms\":1000"), "%s", js);
    cr_expect(strstr(js, "\"store_queue_bytes\":67108864"), "%s", js);
    cr_expect(strstr(js, "\"pool_socket\":null"), "%s", js);
    tclose(&t);

    /* a pool_socket where no daemon answers (a missing path): refused, named, nothing
       opened (test_pool.c runs a real kvvmd for the rest) */
    kvvm_config_init(&c);
    c.backend = KVVM_BACKEND_EMULATED;
    c.pool_socket = "/nonexistent/kvvmd.sock";
    kvvm *kv = NULL;
    cr_expect_eq(kvvm_open(&c, &kv), -ECONNREFUSED);
    cr_expect_null(kv);
    cr_expect(strstr(kvvm_last_error(), "no kvvmd answers on pool_socket "
                     "'/nonexistent/kvvmd.sock'"), "%s", kvvm_last_error());
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

/* ================================================================ regressions */

/* While the engine stream captures a CUDA graph, every call that would enqueue onto, record
   on or synchronize it returns -EBUSY and changes nothing; all works once capture ends.
   Regression: only swap_in/swap_out/prefetch/wait_stream/set_stream(new) refused. */
/* Bug: only swap/prefetch/wait_stream/set_stream refused a capturing engine stream. */
Test(regress, calls_enqueued_on_capturing_engine_stream)
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

/* Bug: in synchronous mode, while a stream made by kvvm_stream_create captured a graph,
   kvvm_sync returned -EIO ("the context is dead") for a live context: its cuCtxSynchronize
   was refused and invalidated the capture. -EBUSY now, the capture intact. */
Test(regress, sync_during_capture_of_library_stream_was_eio)
{
    struct kvvm_config c;
    struct tctx t;
    void *st;
    tcfg(&c, KB, 2, 1024, 8, 64, 64);
    topen(&t, &c);
    struct sh a;
    sh_create(&t, &a);
    sh_grow_fill(&t, &a, 9, 1);
    cr_assert_eq(kvvm_step(t.kv), 0);
    cr_assert_eq(kvvm_stream_create(t.kv, &st), 0);
    cr_assert_eq(emu_stream_set_capturing((kcu_stream)st, 1), 0);
    uint8_t buf[64];
    cr_expect_eq(kvvm_sync(t.kv), -EBUSY, "kvvm_sync while a library stream captures");
    cr_expect_eq(kvvm_seq_read(t.kv, a.h, 0, 0, buf, sizeof buf), -EBUSY,
                 "a read that synchronizes the device while a library stream captures");
    cr_expect_eq(kvvm_seq_swap_out(t.kv, a.h), -EBUSY);
    emu_ctx_on(t.ord);
    int cs = -1;
    cr_expect_eq(emu_api()->cuStreamIsCapturing((kcu_stream)st, &cs), KCU_SUCCESS);
    emu_ctx_off(t.ord);
    cr_expect_eq(cs, KCU_STREAM_CAPTURE_STATUS_ACTIVE, "the capture was invalidated");
    cr_assert_eq(emu_stream_set_capturing((kcu_stream)st, 0), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0, "the context is alive");
    sh_grow_fill(&t, &a, 20, 2);
    sh_verify(&t, &a, "after the capture");
    sh_free(&t, &a);
    cr_assert_eq(kvvm_stream_destroy(t.kv, st), 0);
    tcheck(&t, "end");
    tclose(&t);
}

/* Every call leaves the caller's current context as it found it (here: none), so the
   engine's thread never finds libkvvm's context current afterwards. */
/* Bug: public calls left libkvvm's device context current in the caller's thread. */
Test(regress, calls_left_their_context_current)
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

/* The decode step's grow: tokens added inside the last page a sequence holds make no driver
   call at all (no capture query, no context call), in synchronous and in stream mode; a
   grow onto a new page, and one into a page shared since a fork, still do their work. */
static void grow_in_place_calls(bool stream)
{
    struct kvvm_config c;
    struct tctx t;
    void *st = NULL;
    tcfg(&c, KB, 2, 1024, 4, 64, 32);             /* 4 tokens per page */
    c.pool_thread = 0;          /* its refills would count among this thread's driver calls */
    if (stream)
        topen_stream(&t, &c, &st);
    else
        topen(&t, &c);
    struct sh a, b;
    sh_create(&t, &a);
    sh_grow_fill(&t, &a, 1, 1);
    emu_ctx_on(t.ord);              /* our context current: every driver call is counted */
    cr_assert_eq(emu_calls_reset(t.ord), 0);
    for (uint64_t n = 2; n <= 4; n++)
        cr_assert_eq(kvvm_seq_grow(t.kv, a.h, n), 0);
    cr_assert_eq(kvvm_seq_grow(t.kv, a.h, 4), 0);  /* the same length */
    struct emu_calls k;
    uint64_t total = th_driver_calls(t.ord, &k);
    cr_expect_eq(total, 0, "%s: %lu driver calls for 4 grows inside the last page "
                 "(cuStreamIsCapturing %lu, cuCtxGetCurrent %lu)", stream ? "stream" : "sync",
                 (unsigned long)total, (unsigned long)k.cuStreamIsCapturing,
                 (unsigned long)k.cuCtxGetCurrent);
    emu_ctx_off(t.ord);
    a.len = 4;
    sh_fill(&t, &a, 1, 4, 2);
    sh_verify(&t, &a, "after the grows in place");
    /* a new page, then a page shared by a fork: work is done, bytes stay right */
    sh_grow_fill(&t, &a, 6, 3);
    sh_fork(&t, &a, &b);
    sh_grow_fill(&t, &b, 7, 4);
    sh_verify(&t, &a, "parent after the child's grow into the shared page");
    sh_verify(&t, &b, "child");
    tcheck(&t, "end");
    sh_free(&t, &b);
    sh_free(&t, &a);
    if (stream)
        tclose_stream(&t, st);
    else
        tclose(&t);
}

/* The same for a batch: a decode step's grow_batch inside the last pages makes no driver
   call; a batch naming a sequence twice is still refused (-EINVAL, nothing changed), and a
   batch where one member needs a new page does the work for all. */
Test(hotpath, grow_batch_inside_the_last_pages_makes_no_driver_call)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 2, 1024, 4, 64, 32);             /* 4 tokens per page */
    c.pool_thread = 0;          /* its refills would count among this thread's driver calls */
    topen(&t, &c);
    struct sh a, b;
    sh_create(&t, &a);
    sh_create(&t, &b);
    sh_grow_fill(&t, &a, 1, 1);
    sh_grow_fill(&t, &b, 5, 2);
    kvvm_seq hs[2] = { a.h, b.h };
    uint64_t lens[2] = { 3, 7 };
    emu_ctx_on(t.ord);
    cr_assert_eq(emu_calls_reset(t.ord), 0);
    cr_assert_eq(kvvm_seq_grow_batch(t.kv, hs, lens, 2), 0);
    struct emu_calls k;
    uint64_t total = th_driver_calls(t.ord, &k);
    cr_expect_eq(total, 0, "%lu driver calls for a batch inside the last pages",
                 (unsigned long)total);
    emu_ctx_off(t.ord);
    a.len = 3;
    b.len = 7;
    kvvm_seq twice[2] = { a.h, a.h };
    uint64_t tl[2] = { 4, 4 };
    cr_expect_eq(kvvm_seq_grow_batch(t.kv, twice, tl, 2), -EINVAL);
    struct kvvm_seq_info in;
    tinfo(&t, a.h, &in);
    cr_expect_eq(in.length, 3, "a refused batch changed a length");
    lens[0] = 4;
    lens[1] = 9;                                  /* b needs a new page */
    cr_assert_eq(kvvm_seq_grow_batch(t.kv, hs, lens, 2), 0);
    a.len = 4;
    b.len = 9;
    sh_fill(&t, &a, 1, 4, 3);
    sh_fill(&t, &b, 5, 9, 4);
    sh_verify(&t, &a, "a");
    sh_verify(&t, &b, "b");
    tcheck(&t, "end");
    sh_free(&t, &b);
    sh_free(&t, &a);
    tclose(&t);
}

/* The hot path's room fact (a grow inside the last page in O(1): paging_seq_grow_fast) must
   give way to every change that makes a grow do work again: a fork sharing the last page
   (the next grow copies it), a swap-out (the next grow swaps in), a truncate (fewer pages).
   The sequence has grown in place twice before each change, so its fact is set when the
   change comes. */
static void grow_twice_in_place(struct tctx *t, struct sh *a)
{
    sh_grow_fill(t, a, a->len + 1, 1);
    sh_grow_fill(t, a, a->len + 1, 2);
}

Test(hotpath, room_fact_gives_way_to_fork_swap_truncate)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 2, 128, 4, 64, 32);              /* 8 tokens per page */
    c.host_budget = 16 * KB;
    c.pool_thread = 0;
    topen(&t, &c);
    struct sh a, b;
    struct emu_calls k;
    struct kvvm_seq_info in;
    sh_create(&t, &a);
    sh_grow_fill(&t, &a, 1, 1);
    grow_twice_in_place(&t, &a);                  /* 3 tokens, fact set */
    /* fork: a's next grow copies the shared last page, in both regions */
    sh_fork(&t, &a, &b);
    cr_assert_eq(emu_calls_reset(t.ord), 0);
    cr_assert_eq(kvvm_seq_grow(t.kv, a.h, 4), 0);
    th_driver_calls(t.ord, &k);
    cr_expect_geq(k.cuMemcpyDtoDAsync, 2, "a grow into a last page shared by a fork copied "
                  "%lu pages (2 regions)", (unsigned long)k.cuMemcpyDtoDAsync);
    a.len = 4;
    sh_fill(&t, &a, 3, 4, 3);
    sh_verify(&t, &a, "after the fork");
    sh_verify(&t, &b, "child");
    sh_free(&t, &b);
    grow_twice_in_place(&t, &a);                  /* 6 tokens, fact set again */
    /* swap-out: the next grow brings it back */
    cr_assert_eq(kvvm_seq_swap_out(t.kv, a.h), 0);
    cr_assert_eq(kvvm_seq_grow(t.kv, a.h, 7), 0);
    tinfo(&t, a.h, &in);
    cr_expect(in.resident, "a grow after a swap-out left the sequence out");
    a.len = 7;
    sh_fill(&t, &a, 6, 7, 4);
    sh_verify(&t, &a, "after the swap-out");
    grow_twice_in_place(&t, &a);                  /* 9 tokens: 2 pages, fact set */
    /* truncate to one page: the next grow past it holds two pages again */
    cr_assert_eq(kvvm_seq_truncate(t.kv, a.h, 5), 0);
    a.len = 5;
    cr_assert_eq(kvvm_seq_grow(t.kv, a.h, 10), 0);
    tinfo(&t, a.h, &in);
    cr_expect_eq(in.length, 10);
    a.len = 10;
    sh_fill(&t, &a, 5, 10, 5);
    sh_verify(&t, &a, "after the truncate");
    tcheck(&t, "end");
    sh_free(&t, &a);
    tclose(&t);
}

Test(hotpath, grow_inside_the_last_page_makes_no_driver_call_sync)
{
    grow_in_place_calls(false);
}

Test(hotpath, grow_inside_the_last_page_makes_no_driver_call_stream)
{
    grow_in_place_calls(true);
}

/* Bug: every public call asked the driver for the caller's current context at its entry
   and again at its exit (cuCtxGetCurrent twice, issue 19), even a call that makes no other
   driver call. The caller's context is saved by the first entry point that replaces it. */
Test(regress, calls_without_device_work_made_context_driver_calls)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 2, 1024, 4, 64, 32);
    topen(&t, &c);
    kvvm_seq s;
    uint32_t slot;
    uint64_t addr;
    struct kvvm_seq_info si = { .size = sizeof si };
    uint64_t need;
    int fits;
    cr_assert_eq(kvvm_seq_create(t.kv, &s), 0);
    cr_assert_eq(kvvm_seq_grow(t.kv, s, 3), 0);
    emu_ctx_on(t.ord);              /* our context current: every driver call is counted */
    cr_assert_eq(emu_calls_reset(t.ord), 0);
    cr_assert_eq(kvvm_seq_info(t.kv, s, &si), 0);
    cr_assert_eq(kvvm_seq_need(t.kv, s, 40, &need, &fits), 0);  /* (kvvm_stats asks the
                                                                    driver for free memory) */
    cr_assert_eq(kvvm_seq_slot(t.kv, s, &slot), 0);
    cr_assert_eq(kvvm_seq_addr(t.kv, s, 1, &addr), 0);
    struct emu_calls n;
    cr_assert_eq(emu_calls_get(t.ord, &n), 0);
    cr_expect_eq(n.cuCtxGetCurrent + n.cuCtxSetCurrent, 0,
                 "%lu cuCtxGetCurrent and %lu cuCtxSetCurrent calls for 4 calls that need "
                 "no device work", (unsigned long)n.cuCtxGetCurrent,
                 (unsigned long)n.cuCtxSetCurrent);
    emu_ctx_off(t.ord);
    cr_assert_eq(kvvm_seq_free(t.kv, s), 0);
    tclose(&t);
}

/* getpid() of this executable, which the statically linked library's calls resolve to: it
   counts while getpid_counting is set. */
static volatile int getpid_counting, getpid_calls;
pid_t getpid(void)
{
    if (getpid_counting)
        getpid_calls++;
    return (pid_t)syscall(SYS_getpid);
}

/* Bug: every public call made a getpid() system call to detect a fork() child (issue 19);
   the child is detected by a pthread_atfork handler now (fork_child/gets_eio_parent_unharmed
   still passes). */
Test(regress, every_call_made_a_getpid_system_call)
{
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 2, 1024, 4, 64, 32);
    topen(&t, &c);
    kvvm_seq s;
    uint8_t buf[16] = { 3 };
    struct kvvm_stats st = { .size = sizeof st };
    cr_assert_eq(kvvm_seq_create(t.kv, &s), 0);
    getpid_counting = 1;
    for (uint64_t n = 1; n <= 64; n++)
        cr_assert_eq(kvvm_seq_grow(t.kv, s, n), 0);
    cr_assert_eq(kvvm_seq_write(t.kv, s, 0, 0, buf, sizeof buf), 0);
    cr_assert_eq(kvvm_seq_read(t.kv, s, 0, 0, buf, sizeof buf), 0);
    cr_assert_eq(kvvm_step(t.kv), 0);
    cr_assert_eq(kvvm_stats(t.kv, &st), 0);
    getpid_counting = 0;
    cr_expect_eq(getpid_calls, 0, "%d getpid() calls in 69 public calls", getpid_calls);
    cr_assert_eq(kvvm_seq_free(t.kv, s), 0);
    tclose(&t);
}

/* kvvm_stream_destroy destroys only streams kvvm_stream_create made on this context, never
   the engine stream set now. Regression: it destroyed any stream, the engine's own too. */
/* Bug: kvvm_stream_destroy destroyed any stream, the engine's own too. */
Test(regress, stream_destroy_destroyed_foreign_streams)
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
/* Bug: kvvm_open said nothing when max_seqs sequences cannot all fit at length 1. */
Test(regress, open_silent_when_max_seqs_exceed_budget)
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
Test(fork_child, gets_eio_parent_unharmed)
{
    TH_DEADLINE(30);
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

/* A child of a process that used the driver cannot open a context either (the CUDA driver
   refuses it, and so does the emulated device): -ENODEV, with the reason and what to do;
   the parent's context goes on. */
Test(fork_child, cannot_open_a_context_once_the_parent_used_the_driver)
{
    TH_DEADLINE(30);
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, KB, 2, 1000, 4, 40, 40);
    topen(&t, &c);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);
        kvvm *k2 = NULL;
        int r = kvvm_open(&c, &k2);
        _exit(r == -ENODEV && !k2 && strstr(kvvm_last_error(), "fork()") ? 0 : 1);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "the child's kvvm_open: -ENODEV naming fork() expected (status %d)", status);
    struct sh s;
    sh_create(&t, &s);
    sh_grow_fill(&t, &s, 9, 1);
    sh_verify(&t, &s, "the parent after the child");
    sh_free(&t, &s);
    tclose(&t);
}

/* ================================================================ tiers */

#define TPS (64 * 1024)

/* A tier added to the list takes its level's place: opened, in the stats (the second
   tier's pages_disk_*), in the invariant check, its slots all free again at close. */
Test(tiers, added_tier_opened_counted_checked)
{
    struct kvvm_config c;
    tcfg(&c, TPS, 2, 512, 4, 1024, 16);
    c.host_budget = 8 * TPS;
    cr_assert_eq(tier_mem_use(32 * TPS), 0);
    kvvm *kv = NULL;
    cr_assert_eq(kvvm_open(&c, &kv), 0, "kvvm_open: %s", kvvm_last_error());
    struct kvvm_stats st = { .size = sizeof st };
    cr_assert_eq(kvvm_stats(kv, &st), 0);
    cr_expect_eq(st.pages_host_total, 8, "host slots %lu", (unsigned long)st.pages_host_total);
    cr_expect(st.pages_disk_total == 32 && st.pages_disk_free == 32,
              "the added tier's slots: %lu total, %lu free", (unsigned long)st.pages_disk_total,
              (unsigned long)st.pages_disk_free);
    char why[256] = "";
    cr_expect_eq(kvvm_debug_check(kv, why, sizeof why), 0, "check: %s", why);
    char js[16384];
    cr_assert_eq(kvvm_stats_json(kv, js, sizeof js), 0);
    cr_expect(strstr(js, "\"io_engine\":\"none\",\"spill_direct\":false"),
              "a tier without an engine: %.200s", js);
    kvvm_close(kv);
    cr_expect_eq(tier_mem_misuses(), 0);
}

/* A tier on below a level that is off is refused at open, naming both and why the one above
   is off; nothing stays open. */
Test(tiers, added_tier_needs_the_tier_above)
{
    struct kvvm_config c;
    tcfg(&c, TPS, 2, 512, 4, 1024, 16);
    c.host_budget = 0;
    cr_assert_eq(tier_mem_use(32 * TPS), 0);
    kvvm *kv = NULL;
    int rc = kvvm_open(&c, &kv);
    cr_assert_eq(rc, -EINVAL, "kvvm_open: %d", rc);
    const char *e = kvvm_last_error();
    cr_expect(strstr(e, "the mem tier needs the host tier above it") &&
              strstr(e, "host_budget 0"), "the reason: %s", e);
    cr_expect_eq(tier_mem_misuses(), 0);
    cr_assert_eq(tier_mem_use(0), 0);               /* off again: the same config opens */
    rc = kvvm_open(&c, &kv);
    cr_assert_eq(rc, 0, "kvvm_open without the added tier: %s", kvvm_last_error());
    kvvm_close(kv);
}

static int off_open(kvvm *kv, void **layer, struct pg_tier_ops *ops)
{
    (void)kv, (void)layer, (void)ops;
    return 0;                                       /* never on */
}
static void off_close(void *layer) { (void)layer; }
static uint64_t off_slots(kvvm *kv, void *layer) { (void)kv, (void)layer; return 0; }
static void off_stats(void *layer, struct core_tier_stats *out)
{
    (void)layer;
    *out = (struct core_tier_stats){ 0 };
}
static void off_off(kvvm *kv, char *b, size_t n, size_t *pos)
{
    (void)kv, (void)b, (void)n, (void)pos;
}

/* core_tiers_add refuses an entry missing a part or at no level, and a full list. */
Test(tiers, add_refuses_bad_entries)
{
    struct core_tier t = { .name = "off", .level = 1, .open = off_open, .close = off_close,
                           .slots = off_slots, .stats = off_stats, .off = off_off };
    struct core_tier bad = t;
    cr_expect_eq(core_tiers_add(NULL), -EINVAL);
    bad.level = PG_N_LOWER;
    cr_expect_eq(core_tiers_add(&bad), -EINVAL, "a level past the list");
    bad = t;
    bad.stats = NULL;
    cr_expect_eq(core_tiers_add(&bad), -EINVAL, "no stats");
    int rc = 0, added = 0;
    while (added < 64 && !(rc = core_tiers_add(&t)))
        added++;
    cr_expect(rc == -ENOSPC && added > 0, "a full list: %d after %d", rc, added);
    struct kvvm_config c;                           /* tiers that stay off change nothing */
    tcfg(&c, TPS, 2, 512, 4, 1024, 16);
    kvvm *kv = NULL;
    cr_assert_eq(kvvm_open(&c, &kv), 0, "kvvm_open: %s", kvvm_last_error());
    kvvm_close(kv);
}
