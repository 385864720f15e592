/*
 * tests/fuzz/fuzz_api.c: a libFuzzer target driving the public API (include/kvvm.h) from its
 * input against a reference model of every sequence's length, contents, class, dropped state
 * and discards (issue 18).
 *
 * Input: the first 3 bytes choose the configuration (synchronous or stream mode, the frame
 * pool thread on or off, a host tier, a disk tier under it, the page size as 1, 2 or 4
 * granules of 4 KiB, regions, map-ahead, KVVM_F_AUTO_SWAP / KVVM_F_CACHE_DEMOTE /
 * KVVM_F_SCRUB); every following 4 bytes are one call and its arguments. After each call:
 *   - the invariant checker (kvvm_debug_check) holds;
 *   - the return code is one the call may give, and the one the model predicts where it can
 *     (-EINVAL, -E2BIG, -ESTALE, -ENOENT; an -ENOMEM is never predicted: reclaim may or may
 *     not find room);
 *   - a grow that kvvm_seq_need said fits succeeds;
 *   - a failed call changed no other sequence (tier, residency, class, dropped state, length:
 *     the first rule of docs/api.md); KVVMTEST_FUZZ_FAILED_CALL_RULE=0 turns this one off;
 *   - the model follows what succeeded (drops by reclaim are read from kvvm_seq_info; no
 *     background reclaim: device marks 0 under KVVM_F_AUTO_SWAP, so only calls move), and
 *     the bytes of the call's sequence (every 16 calls: of every resident one) read back as
 *     the model's cookies (tokens written
 *     through kvvm_seq_write; tokens never written, or discarded, are not compared).
 * At the end every sequence is read back (swapped in where there is room), freed, and the
 * context closed: no handle, mapping, reservation, stream or event of the emulated device
 * may be left, nor a file in the spill directory (and LeakSanitizer checks the heap).
 *
 * Any violation aborts with a message (libFuzzer saves the input). Built only with clang and
 * -DKVVM_FUZZ=ON (scripts/fuzz.sh).
 */
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "kvvm.h"
#include "testing/kvvm_testing.h"
#include "vmm/emu/emu.h"
#include "../cookie.h"

#define GRAN 4096u
#define NS 6                    /* sequences (max_seqs) */
#define MAXTOK 48               /* max_tokens */
#define MAXR 3

struct fseq {
    bool live, dropped;
    kvvm_seq h;
    uint64_t len;
    uint32_t cls;
    uint64_t kept[MAXR];
    uint32_t tag[MAXR][MAXTOK];     /* per token: the lineage its bytes were written with;
                                       0: not known (never written, zeroed or discarded) */
};

struct fz {
    kvvm *kv;
    int ord;
    void *stream;
    uint32_t nr;
    uint64_t bpt;
    size_t ps;
    uint64_t budget_pages, max_pages;
    struct fseq s[NS];
    uint32_t next_tag;
    bool rule;                      /* the failed-call rule */
    bool trace;                     /* KVVMTEST_FUZZ_TRACE=1: each call on stderr */
    struct kvvm_seq_info snap[NS];
    bool snap_inflight;             /* copies were in flight at the snapshot: their pages
                                       change tiers when they complete, so only the totals
                                       compare */
    const char *call;
    uint8_t buf[MAXTOK * 2048], want[MAXTOK * 2048];
};

static char spill_dir[64];

#define FAIL(f, ...) do {                                                  \
        fprintf(stderr, "fuzz_api: %s: ", (f)->call);                      \
        fprintf(stderr, __VA_ARGS__);                                      \
        fprintf(stderr, " (last error: %s)\n", kvvm_last_error());         \
        abort();                                                           \
    } while (0)
#define CHECK(f, cond, ...) do { if (!(cond)) FAIL(f, __VA_ARGS__); } while (0)

static void rmdir_spill(void)
{
    if (spill_dir[0])
        rmdir(spill_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    setenv("KVVM_EMU_OPAQUE", "1", 1);
    kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);
    /* the disk tier wants a real file system (O_DIRECT), as the tests: /var/tmp */
    snprintf(spill_dir, sizeof spill_dir, "/var/tmp/kvvm-fuzz-XXXXXX");
    if (!mkdtemp(spill_dir)) {
        perror("fuzz_api: mkdtemp in /var/tmp");
        spill_dir[0] = 0;
    }
    atexit(rmdir_spill);
    return 0;
}

static void info(struct fz *f, kvvm_seq h, struct kvvm_seq_info *in)
{
    memset(in, 0, sizeof *in);
    in->size = sizeof *in;
    int rc = kvvm_seq_info(f->kv, h, in);
    CHECK(f, rc == 0, "kvvm_seq_info: %d", rc);
}

static void check_invariants(struct fz *f)
{
    char why[512] = "";
    int rc = kvvm_debug_check(f->kv, why, sizeof why);
    CHECK(f, rc == 0, "invariant violated: %s", why);
}

static void snap_take(struct fz *f)
{
    struct kvvm_stats st = { .size = sizeof st };
    f->snap_inflight = kvvm_stats(f->kv, &st) || st.pages_inflight;
    for (int i = 0; i < NS; i++)
        if (f->s[i].live)
            info(f, f->s[i].h, &f->snap[i]);
}

/* A failed call changes nothing: every sequence but those it named is as before. */
static void others_unchanged(struct fz *f, int rc, const struct fseq *a, const struct fseq *b)
{
    if (!f->rule)
        return;
    for (int i = 0; i < NS; i++) {
        struct fseq *s = &f->s[i];
        if (!s->live || s == a || s == b)
            continue;
        struct kvvm_seq_info in, *o = &f->snap[i];
        info(f, s->h, &in);
        uint32_t now = in.pages_device + in.pages_host + in.pages_disk;
        uint32_t was = o->pages_device + o->pages_host + o->pages_disk;
        CHECK(f, in.length == o->length && in.resident == o->resident && now == was &&
              (f->snap_inflight || in.pages_device == o->pages_device) &&
              in.cls == o->cls && in.dropped == o->dropped,
              "failed (%d) but moved seq %d: resident %d -> %d, device %u -> %u, class %u -> "
              "%u, dropped %d -> %d", rc, i, o->resident, in.resident, o->pages_device,
              in.pages_device, o->cls, in.cls, o->dropped, in.dropped);
    }
}

/* After a success: reclaim may have dropped CACHED sequences; the model follows. */
static void follow_drops(struct fz *f)
{
    for (int i = 0; i < NS; i++) {
        struct fseq *s = &f->s[i];
        if (!s->live)
            continue;
        struct kvvm_seq_info in;
        info(f, s->h, &in);
        if (in.dropped && !s->dropped) {
            CHECK(f, s->cls == KVVM_SEQ_CACHED, "seq %d of class %u was dropped", i, s->cls);
            s->dropped = true;
            s->len = 0;
            memset(s->kept, 0, sizeof s->kept);
            memset(s->tag, 0, sizeof s->tag);
        }
        CHECK(f, in.dropped == s->dropped && in.length == s->len && in.cls == s->cls,
              "seq %d: length %llu (model %llu), class %u (%u), dropped %d (%d)", i,
              (unsigned long long)in.length, (unsigned long long)s->len, in.cls, s->cls,
              in.dropped, s->dropped);
        uint64_t fk = UINT64_MAX;
        for (uint32_t r = 0; r < f->nr; r++)
            fk = s->kept[r] < fk ? s->kept[r] : fk;
        CHECK(f, in.first_kept == fk, "seq %d: first_kept %llu, model %llu", i,
              (unsigned long long)in.first_kept, (unsigned long long)fk);
    }
}

/* Reads tokens [a, b) of region r and compares the known ones. rc of the read (-ENOMEM:
   a swapped-out sequence that cannot come back). */
static int verify_region(struct fz *f, struct fseq *s, uint32_t r, uint64_t a, uint64_t b)
{
    if (a < s->kept[r])
        a = s->kept[r];
    if (b > s->len)
        b = s->len;
    if (a >= b)
        return 0;
    size_t n = (size_t)((b - a) * f->bpt);
    int rc = kvvm_seq_read(f->kv, s->h, r, a * f->bpt, f->buf, n);
    if (rc)
        return rc;
    for (uint64_t t = a; t < b; t++) {
        uint32_t tag = s->tag[r][t];
        if (!tag)
            continue;
        for (uint64_t i = 0; i < f->bpt; i++) {
            uint64_t off = t * f->bpt + i;
            uint8_t got = f->buf[(t - a) * f->bpt + i];
            CHECK(f, got == cookie(tag, r, off), "seq %ld region %u token %llu byte %llu: "
                  "%#x, expected %#x (lineage %u)", (long)(s - f->s), r,
                  (unsigned long long)t, (unsigned long long)i, got, cookie(tag, r, off), tag);
        }
    }
    return 0;
}

static void verify_seq(struct fz *f, struct fseq *s, bool swap_in)
{
    if (!s->live || s->dropped || !s->len)
        return;
    struct kvvm_seq_info in;
    info(f, s->h, &in);
    if (in.dropped && s->cls == KVVM_SEQ_CACHED && swap_in) {
        s->dropped = 1;             /* at close: bringing an earlier sequence back needed room,
                                       and CACHED sequences are dropped first (docs/api.md) */
        return;
    }
    if (!in.resident && !swap_in)
        return;
    for (uint32_t r = 0; r < f->nr; r++) {
        int rc = verify_region(f, s, r, 0, s->len);
        if (rc == -ENOMEM && !in.resident)
            return;                 /* no room to bring it back */
        CHECK(f, rc == 0, "read back: %d", rc);
    }
}

/* ---- calls ---- */

static struct fseq *seq_at(struct fz *f, uint8_t b)
{
    return &f->s[b % NS];
}

static void do_create(struct fz *f)
{
    f->call = "create";
    struct fseq *s = NULL;
    for (int i = 0; i < NS && !s; i++)
        if (!f->s[i].live)
            s = &f->s[i];
    kvvm_seq h = 0;
    int rc = kvvm_seq_create(f->kv, &h);
    if (!s) {
        CHECK(f, rc == -ENOSPC, "every slot in use: %d", rc);
        return;
    }
    CHECK(f, rc == 0 || rc == -ENOMEM, "%d", rc);
    if (rc)
        return;
    memset(s, 0, sizeof *s);
    s->live = true;
    s->h = h;
}

static void do_free(struct fz *f, struct fseq *s)
{
    f->call = "free";
    int rc = kvvm_seq_free(f->kv, s->h);
    CHECK(f, rc == 0 || rc == -ENOMEM, "%d", rc);
    if (!rc) {
        kvvm_seq h = s->h;
        memset(s, 0, sizeof *s);
        uint32_t slot;
        CHECK(f, kvvm_seq_slot(f->kv, h, &slot) == -ENOENT, "a freed handle answers");
    }
}

static void do_grow(struct fz *f, struct fseq *s, uint8_t a)
{
    f->call = "grow";
    uint64_t nl = a % (MAXTOK + 4);
    int rc = kvvm_seq_grow(f->kv, s->h, nl);
    if (s->dropped)                     /* (an argument error may come first) */
        CHECK(f, rc == -ESTALE || (nl > MAXTOK && rc == -E2BIG), "a dropped sequence: %d", rc);
    else if (nl > MAXTOK)
        CHECK(f, rc == -E2BIG, "past max_tokens: %d", rc);
    else if (nl < s->len)
        CHECK(f, rc == -EINVAL, "shorter: %d", rc);
    else
        CHECK(f, rc == 0 || rc == -ENOMEM, "%d", rc);
    if (rc) {
        others_unchanged(f, rc, s, NULL);
        return;
    }
    for (uint32_t r = 0; r < f->nr; r++)   /* new tokens: not known (a share's zeroed tail,
                                              or whatever the page held) */
        for (uint64_t t = s->len; t < nl; t++)
            s->tag[r][t] = 0;
    s->len = nl;
}

static void do_grow_batch(struct fz *f, uint8_t a, uint8_t b)
{
    f->call = "grow_batch";
    struct fseq *set[3];
    kvvm_seq hs[3];
    uint64_t lens[3];
    int n = 0;
    bool stale = false;
    for (int i = 0; i < 3 && n < 1 + a % 3; i++) {
        struct fseq *s = &f->s[(a / 3 + (unsigned)i * (1 + b % 5)) % NS];
        bool dup = false;
        for (int k = 0; k < n; k++)
            dup |= set[k] == s;
        if (!s->live || dup)
            continue;
        set[n] = s;
        hs[n] = s->h;
        lens[n] = s->len + (b >> (2 * i)) % 4;
        lens[n] = lens[n] > MAXTOK ? MAXTOK : lens[n];
        stale |= s->dropped;
        n++;
    }
    if (!n)
        return;
    int rc = kvvm_seq_grow_batch(f->kv, hs, lens, (size_t)n);
    if (stale)
        CHECK(f, rc == -ESTALE, "a dropped member: %d", rc);
    else
        CHECK(f, rc == 0 || rc == -ENOMEM, "%d", rc);
    if (rc) {
        others_unchanged(f, rc, set[0], n > 1 ? set[1] : NULL);
        return;
    }
    for (int i = 0; i < n; i++) {
        for (uint32_t r = 0; r < f->nr; r++)
            for (uint64_t t = set[i]->len; t < lens[i]; t++)
                set[i]->tag[r][t] = 0;
        set[i]->len = lens[i];
    }
}

static void do_truncate(struct fz *f, struct fseq *s, uint8_t a)
{
    f->call = "truncate";
    uint64_t nl = a % (s->len + 2);
    int rc = kvvm_seq_truncate(f->kv, s->h, nl);
    if (nl > s->len) {
        CHECK(f, rc == -EINVAL, "longer: %d", rc);
        return;
    }
    CHECK(f, rc == 0 || rc == -ENOMEM, "%d", rc);
    if (rc) {
        others_unchanged(f, rc, s, NULL);
        return;
    }
    s->len = nl;
    for (uint32_t r = 0; r < f->nr; r++)
        if (s->kept[r] > nl)
            s->kept[r] = nl;
}

static struct fseq *free_entry(struct fz *f)
{
    for (int i = 0; i < NS; i++)
        if (!f->s[i].live)
            return &f->s[i];
    return NULL;
}

static void do_fork(struct fz *f, struct fseq *p)
{
    f->call = "fork";
    struct fseq *c = free_entry(f);
    kvvm_seq h = 0;
    int rc = kvvm_seq_fork(f->kv, p->h, &h);
    if (p->dropped)
        CHECK(f, rc == -ESTALE, "a dropped parent: %d", rc);
    else if (!c)
        CHECK(f, rc == -ENOSPC, "every slot in use: %d", rc);
    else
        CHECK(f, rc == 0 || rc == -ENOMEM, "%d", rc);
    if (rc)
        return;
    *c = *p;
    c->h = h;
    c->cls = KVVM_SEQ_LIVE;
}

static void do_share(struct fz *f, struct fseq *src, uint8_t a)
{
    f->call = "share";
    struct fseq *dst = NULL;
    for (int i = 0; i < NS && !dst; i++)
        if (f->s[i].live && !f->s[i].len && !f->s[i].dropped && &f->s[i] != src)
            dst = &f->s[i];
    if (!dst)
        return;
    uint64_t n = a % (src->len + 2);
    int rc = kvvm_seq_share(f->kv, dst->h, src->h, n);
    if (src->dropped)
        CHECK(f, rc == -ESTALE || (n > src->len && rc == -EINVAL), "a dropped source: %d", rc);
    else if (n > src->len)
        CHECK(f, rc == -EINVAL, "past the source's length: %d", rc);
    else
        CHECK(f, rc == 0 || rc == -ENOMEM, "%d", rc);
    if (rc) {
        others_unchanged(f, rc, src, dst);
        return;
    }
    for (uint32_t r = 0; r < f->nr; r++) {
        memcpy(dst->tag[r], src->tag[r], sizeof dst->tag[r]);
        for (uint64_t t = n; t < MAXTOK; t++)
            dst->tag[r][t] = 0;
        dst->kept[r] = src->kept[r] < n ? src->kept[r] : n;
    }
    dst->len = n;
}

static uint64_t max_kept(const struct fz *f, const struct fseq *s)
{
    uint64_t k = 0;
    for (uint32_t r = 0; r < f->nr; r++)
        k = s->kept[r] > k ? s->kept[r] : k;
    return k;
}

static void do_write(struct fz *f, struct fseq *s, uint8_t a, uint8_t b)
{
    f->call = "write";
    if (!s->len)
        return;
    uint32_t r = a % f->nr;
    uint64_t t0 = b % s->len, t1 = t0 + 1 + (a >> 4) % 3;
    t1 = t1 > s->len ? s->len : t1;
    uint32_t tag = ++f->next_tag;
    size_t n = (size_t)((t1 - t0) * f->bpt);
    for (size_t i = 0; i < n; i++)
        f->want[i] = cookie(tag, r, t0 * f->bpt + i);
    int rc = kvvm_seq_write(f->kv, s->h, r, t0 * f->bpt, f->want, n);
    if (s->dropped)
        CHECK(f, rc == -ESTALE || rc == -EINVAL, "a dropped sequence: %d", rc);
    else if (t0 < s->kept[r])
        CHECK(f, rc == -EINVAL, "below first_kept: %d", rc);
    else
        CHECK(f, rc == 0 || rc == -ENOMEM, "%d", rc);
    if (rc) {
        others_unchanged(f, rc, s, NULL);
        return;
    }
    for (uint64_t t = t0; t < t1; t++)
        s->tag[r][t] = tag;
}

static void do_prepare_write(struct fz *f, struct fseq *s, uint8_t a)
{
    f->call = "prepare_write";
    if (!s->len || s->dropped)
        return;
    uint64_t t0 = a % s->len, t1 = t0 + 1 + (a >> 5);
    t1 = t1 > s->len ? s->len : t1;
    int rc = kvvm_seq_prepare_write(f->kv, s->h, t0, t1);
    if (t0 < max_kept(f, s))
        CHECK(f, rc == -EINVAL || rc == 0 || rc == -ENOMEM, "below first_kept: %d", rc);
    else
        CHECK(f, rc == 0 || rc == -ENOMEM, "%d", rc);
    if (rc)
        others_unchanged(f, rc, s, NULL);
}

static void do_swap(struct fz *f, struct fseq *s, uint8_t a)
{
    int rc;
    switch (a % 3) {
    case 0:
        f->call = "swap_out";
        rc = kvvm_seq_swap_out(f->kv, s->h);
        CHECK(f, rc == 0 || rc == -ENOMEM || (s->dropped && rc == -ESTALE), "%d", rc);
        break;
    case 1:
        f->call = "swap_in";
        rc = kvvm_seq_swap_in(f->kv, s->h);
        CHECK(f, s->dropped ? rc == -ESTALE : (rc == 0 || rc == -ENOMEM), "%d", rc);
        break;
    default:
        f->call = "prefetch";
        rc = kvvm_seq_prefetch(f->kv, s->h);
        CHECK(f, s->dropped ? rc == -ESTALE : (rc == 0 || rc == -ENOMEM), "%d", rc);
        break;
    }
    if (rc)
        others_unchanged(f, rc, s, NULL);
}

static void do_discard(struct fz *f, struct fseq *s, uint8_t a, uint8_t b)
{
    f->call = "discard";
    uint32_t region = a & 1 ? KVVM_ALL_REGIONS : (a >> 1) % f->nr;
    uint64_t fk = b % (s->len + 2);
    int rc = kvvm_seq_discard(f->kv, s->h, region, fk);
    if (fk > s->len) {
        CHECK(f, rc == -EINVAL, "past the length: %d", rc);
        return;
    }
    CHECK(f, rc == 0 || rc == -ENOMEM, "%d", rc);
    if (rc) {
        others_unchanged(f, rc, s, NULL);
        return;
    }
    /* the tokens of the pages wholly before fk are gone; tokens of a page kept are kept */
    for (uint32_t r = 0; r < f->nr; r++) {
        if (region != KVVM_ALL_REGIONS && r != region)
            continue;
        if (s->kept[r] < fk)
            s->kept[r] = fk;
    }
}

static void do_set_class(struct fz *f, struct fseq *s, uint8_t a)
{
    f->call = "set_class";
    uint32_t cls = a % 3;
    int rc = kvvm_seq_set_class(f->kv, s->h, (enum kvvm_seq_class)cls);
    CHECK(f, rc == 0, "%d", rc);
    s->cls = cls;
    s->dropped = false;
}

static void do_budget(struct fz *f, uint8_t a, uint8_t b)
{
    int rc;
    if (a & 1) {
        f->call = "trim";
        rc = kvvm_trim(f->kv, (size_t)(b % 8) * f->ps);
        CHECK(f, rc == 0, "%d", rc);
        return;
    }
    f->call = "set_budget";
    uint64_t pages = f->nr + b % (f->max_pages - f->nr + 1);   /* a page per region at least */
    rc = kvvm_set_budget(f->kv, (size_t)(pages * f->ps));
    CHECK(f, rc == 0 || rc == -ENOMEM, "%d", rc);
    if (!rc) {
        f->budget_pages = pages;
        return;
    }
    others_unchanged(f, rc, NULL, NULL);
    struct kvvm_stats st = { .size = sizeof st };
    CHECK(f, kvvm_stats(f->kv, &st) == 0 && st.pages_device_total == f->budget_pages,
          "a refused set_budget changed the budget");
}

static void do_misc(struct fz *f, struct fseq *s, uint8_t a)
{
    int rc;
    uint64_t pages;
    int fits;
    switch (a % 4) {
    case 0:
        f->call = "step";
        rc = kvvm_step(f->kv);
        CHECK(f, rc == 0, "%d", rc);
        break;
    case 1:
        f->call = "sync";
        rc = kvvm_sync(f->kv);
        CHECK(f, rc == 0, "%d", rc);
        break;
    case 2: {
        f->call = "need";
        uint64_t nl = s->len + (a >> 2) % 4;
        rc = kvvm_seq_need(f->kv, s->h, nl, &pages, &fits);
        CHECK(f, rc == 0 || (nl > MAXTOK && rc == -E2BIG), "%d", rc);
        if (rc || !fits || s->dropped)
            break;
        /* docs/api.md: "a swap-in or grow that then fails -ENOMEM for lack of room never
           had fits = 1" */
        f->call = "grow after need said it fits";
        rc = kvvm_seq_grow(f->kv, s->h, nl);
        CHECK(f, rc == 0, "kvvm_seq_need: %llu pages, fits; the grow to %llu: %d",
              (unsigned long long)pages, (unsigned long long)nl, rc);
        for (uint32_t r = 0; r < f->nr; r++)
            for (uint64_t t = s->len; t < nl; t++)
                s->tag[r][t] = 0;
        s->len = nl;
        break;
    }
    default:
        f->call = "read";
        if (s->dropped) {
            uint8_t x;
            rc = kvvm_seq_read(f->kv, s->h, 0, 0, &x, 1);
            CHECK(f, rc == -ESTALE || rc == -EINVAL, "a dropped sequence: %d", rc);
        } else {
            verify_seq(f, s, true);
        }
        break;
    }
}

/* ---- one input ---- */

static int open_ctx(struct fz *f, const uint8_t *d)
{
    struct kvvm_config c;
    kvvm_config_init(&c);
    c.backend = KVVM_BACKEND_EMULATED;
    c.emu_granule = GRAN;
    f->ps = GRAN << (d[0] >> 4 & 3) % 3;       /* 4, 8 or 16 KiB: pages above the granule */
    c.page_size = f->ps;
    f->nr = 1 + d[1] % MAXR;
    c.n_regions = f->nr;
    f->bpt = 200 + 37 * (d[1] >> 2 & 15);      /* tokens straddle pages */
    if (f->bpt * MAXTOK > sizeof f->buf)
        f->bpt = sizeof f->buf / MAXTOK;
    c.bytes_per_token = f->bpt;
    c.max_seqs = NS;
    c.max_tokens = MAXTOK;
    uint64_t seq_pages = (MAXTOK * f->bpt + f->ps - 1) / f->ps * f->nr;
    f->max_pages = seq_pages * 2;
    f->budget_pages = seq_pages / 2 + d[2] % seq_pages + f->nr;
    c.device_budget = f->budget_pages * f->ps;
    c.emu_device_bytes = f->max_pages * f->ps;
    bool host = d[0] & 4, disk = host && (d[0] & 8) && spill_dir[0];
    c.host_budget = host ? (seq_pages + (d[2] >> 4)) * f->ps : 0;
    c.spill_dir = disk ? spill_dir : NULL;
    c.spill_budget = disk ? NS * seq_pages * f->ps : 0;
    c.flags = (d[1] & 0x40 ? KVVM_F_AUTO_SWAP : 0) | (d[1] & 0x80 ? KVVM_F_CACHE_DEMOTE : 0) |
              (d[2] & 0x80 ? KVVM_F_SCRUB : 0);
    if (c.flags & KVVM_F_AUTO_SWAP)    /* no background reclaim: a round between two calls
                                          (or during one) would move sequences the model and
                                          the failed-call rule do not expect to move */
        c.device_min = c.device_low = c.device_high = 0;
    c.map_ahead = d[0] >> 6 & 1;
    c.pool_thread = d[0] >> 1 & 1;
    c.pool_decay_ms = 0;
    c.emu_opaque = 1;
    if (kvvm_open(&c, &f->kv))
        return -1;
    struct kvvm_stats st = { .size = sizeof st };
    if (kvvm_stats(f->kv, &st) == 0)
        f->budget_pages = st.pages_device_total;
    f->ord = kvvm_debug_emu_ordinal(f->kv);
    f->call = "open";
    if (d[0] & 1) {                             /* stream mode */
        CHECK(f, kvvm_stream_create(f->kv, &f->stream) == 0, "stream_create");
        CHECK(f, kvvm_set_stream(f->kv, f->stream) == 0, "set_stream");
    }
    return 0;
}

static void close_ctx(struct fz *f)
{
    f->call = "close";
    for (int i = 0; i < NS; i++)
        verify_seq(f, &f->s[i], true);
    for (int i = 0; i < NS; i++)
        if (f->s[i].live)
            CHECK(f, kvvm_seq_free(f->kv, f->s[i].h) == 0, "free at the end");
    CHECK(f, kvvm_sync(f->kv) == 0, "sync at the end");
    check_invariants(f);
    if (f->stream) {
        CHECK(f, kvvm_set_stream(f->kv, NULL) == 0, "set_stream(NULL)");
        CHECK(f, kvvm_stream_destroy(f->kv, f->stream) == 0, "stream_destroy");
    }
    kvvm_close(f->kv);
    struct emu_counters ec;
    if (f->ord >= 0 && emu_counters_get(f->ord, &ec) == 0)
        CHECK(f, !ec.handles && !ec.mappings && !ec.reservations && !ec.streams && !ec.events,
              "kvvm_close left handles %lu mappings %lu reservations %lu streams %lu events "
              "%lu", (unsigned long)ec.handles, (unsigned long)ec.mappings,
              (unsigned long)ec.reservations, (unsigned long)ec.streams,
              (unsigned long)ec.events);
    if (spill_dir[0]) {
        DIR *dd = opendir(spill_dir);
        struct dirent *e;
        int n = 0;
        while (dd && (e = readdir(dd)))
            n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
        if (dd)
            closedir(dd);
        CHECK(f, n == 0, "%d file(s) left in the spill directory", n);
    }
}

static void one_call(struct fz *f, const uint8_t *o)
{
    if (f->trace) {
        fprintf(stderr, "call %02x %02x %02x %02x; lengths", o[0], o[1], o[2], o[3]);
        for (int i = 0; i < NS; i++)
            fprintf(stderr, " %lld%s%s", f->s[i].live ? (long long)f->s[i].len : -1LL,
                    f->s[i].dropped ? "d" : "", f->s[i].cls == 1 ? "C" :
                    f->s[i].cls == 2 ? "P" : "");
        fprintf(stderr, "\n");
    }
    struct fseq *s = seq_at(f, o[1]);
    uint8_t op = o[0] % 16;
    if (op != 0 && !s->live) {
        do_create(f);
        return;
    }
    switch (op) {
    case 0: do_create(f); break;
    case 1: do_free(f, s); break;
    case 2: case 3: do_grow(f, s, o[2]); break;
    case 4: do_grow_batch(f, o[2], o[3]); break;
    case 5: do_truncate(f, s, o[2]); break;
    case 6: do_fork(f, s); break;
    case 7: do_share(f, s, o[2]); break;
    case 8: case 9: do_write(f, s, o[2], o[3]); break;
    case 10: do_prepare_write(f, s, o[2]); break;
    case 11: do_swap(f, s, o[2]); break;
    case 12: do_discard(f, s, o[2], o[3]); break;
    case 13: do_set_class(f, s, o[2]); break;
    case 14: do_budget(f, o[2], o[3]); break;
    default: do_misc(f, s, o[2]); break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct fz f;
    if (size < 3)
        return 0;
    memset(&f, 0, sizeof f);
    const char *rule = getenv("KVVMTEST_FUZZ_FAILED_CALL_RULE");
    f.rule = !rule || strcmp(rule, "0");
    const char *trace = getenv("KVVMTEST_FUZZ_TRACE");
    f.trace = trace && !strcmp(trace, "1");
    if (open_ctx(&f, data))
        return 0;
    size_t ncalls = 0;
    for (size_t i = 3; i + 4 <= size && ncalls < 400; i += 4, ncalls++) {
        snap_take(&f);
        one_call(&f, data + i);
        check_invariants(&f);
        follow_drops(&f);
        /* the bytes of the call's sequence after each call, every resident one's every 16
           calls (a write leaking into a sibling shows there), everything at the end */
        verify_seq(&f, seq_at(&f, data[i + 1]), false);
        for (int k = 0; ncalls % 16 == 15 && k < NS; k++)
            verify_seq(&f, &f.s[k], false);
    }
    close_ctx(&f);
    return 0;
}
