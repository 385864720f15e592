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
 * The 0.3 calls (a call whose first byte is 0xe0 or more: an eighth of them): prefix
 * publish / lookup / attach / drop, under namespaces 0, 1, 2 and UINT64_MAX, with keys derived
 * from the content the model knows (through kvvm_prefix_keys, salted or not, or a raw
 * 256- or 128-bit chain of our own), so one key always names the same bytes; block tables
 * (kvvm_seq_block_table, kvvm_batch_block_table). A configuration whose first byte has bit 7
 * set is a 0.3 one: bytes_per_token divides the page (2 to 64 tokens a block), and the pool
 * view (KVVM_F_POOL_VIEW, CPU-readable) and a file:// store (a directory per process, emptied
 * for each input, removed at exit; request bound 600 s: no timing in the verdicts) are on
 * by bits of the third byte. Checked: a lookup or an attach never reports more leading keys
 * than the model published in that namespace (nothing crosses namespaces), a publish's keys
 * are all found right after it and a dropped key is found nowhere (nor in the store);
 * attached bytes are the published ones (read back, from the device, the host, the disk or
 * the store after reclaim evicted the local entry); block ids are in range, distinct, -1
 * exactly for a block discarded in every region, the same through both table calls, and
 * hold through the pool view the bytes the model knows; the CSR's indptr and last_len.
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

/* A prefix-cache entry of the model: what kvvm_prefix_publish entered under (ns, key), the
   lineage of each token of its block per region (0: not known). Keys are derived from the
   content (the model's lineages of every block up to theirs), so one key always names the
   same known bytes, whichever sequence publishes it and whether the library evicted it in
   between (the model cannot see evictions: it knows an upper bound of what is present). */
#define NE 256                  /* model entries */
#define TMAX 32                 /* tokens per block at most (8 KiB / 256 B, 16 KiB / 512 B) */
struct fentry {
    bool used;
    uint64_t ns;
    kvvm_key key;
    uint16_t tag[MAXR][TMAX];
};

struct fz {
    kvvm *kv;
    int ord;
    void *stream;
    uint32_t nr;
    uint64_t bpt;
    size_t ps;
    uint32_t tpb;                   /* tokens per block when page_size is a multiple of
                                       bytes_per_token (the prefix cache works), else 0 */
    bool view;                      /* KVVM_F_POOL_VIEW, CPU-readable (emu_opaque 0) */
    bool store;                     /* a file:// store (store_dir) */
    uint64_t view_base[MAXR];
    uint32_t view_ids;
    struct fentry e[NE];
    kvvm_key last[MAXTOK];          /* the keys of the last publish (its namespace, count):
                                       an attach may ask for them after their publisher
                                       changed or went, from what reclaim left, or the store */
    uint64_t last_ns;
    uint32_t n_last;
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
static char store_dir[64];             /* the file:// store's directory, wiped per input */

#define FAIL(f, ...) do {                                                  \
        fprintf(stderr, "fuzz_api: %s: ", (f)->call);                      \
        fprintf(stderr, __VA_ARGS__);                                      \
        fprintf(stderr, " (last error: %s)\n", kvvm_last_error());         \
        abort();                                                           \
    } while (0)
#define CHECK(f, cond, ...) do { if (!(cond)) FAIL(f, __VA_ARGS__); } while (0)

/* Removes the files of the store's directory (it holds no subdirectory). */
static void store_wipe(void)
{
    DIR *dd = store_dir[0] ? opendir(store_dir) : NULL;
    struct dirent *e;
    while (dd && (e = readdir(dd)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            unlinkat(dirfd(dd), e->d_name, 0);
    if (dd)
        closedir(dd);
}

static void rmdir_spill(void)
{
    if (spill_dir[0])
        rmdir(spill_dir);
    store_wipe();
    if (store_dir[0])
        rmdir(store_dir);
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
    /* the store's directory: one per process, emptied at each input's start (an input's
       entries are its own: a replayed input behaves the same alone) and removed at exit */
    snprintf(store_dir, sizeof store_dir, "%s/kvvm-fuzz-store-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (strlen(store_dir) >= sizeof store_dir - 1 || !mkdtemp(store_dir)) {
        perror("fuzz_api: mkdtemp for the store");
        store_dir[0] = 0;
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

/* ---- 0.3: the prefix cache, block tables, the store ---- */

/* The key of each of s's first n blocks (n <= its full blocks), content-derived: token t's
   id packs the lineages the model knows of it in every region (10 bits each: an input makes
   at most 400 writes; 0 for a token not known, below first_kept included). Through
   kvvm_prefix_keys (salted by the scheme byte) or, raw, a 256-bit chain of our own (half of
   them zero-padded: a 128-bit digest). */
static uint32_t tok_id(const struct fz *f, const struct fseq *s, uint64_t t)
{
    uint32_t id = 0;
    for (uint32_t r = 0; r < f->nr; r++)
        id |= (t < s->kept[r] ? 0u : (s->tag[r][t] & 1023u)) << (10 * r);
    return id;
}

static void seq_keys(const struct fz *f, const struct fseq *s, uint32_t n, uint8_t scheme,
                     kvvm_key *keys)
{
    uint32_t T = f->tpb;
    if (scheme & 1) {
        int32_t tok[MAXTOK];
        for (uint64_t t = 0; t < (uint64_t)n * T; t++)
            tok[t] = (int32_t)tok_id(f, s, t);
        uint8_t salt = scheme >> 1 & 3;
        size_t got = kvvm_prefix_keys(tok, (size_t)n * T, T, salt ? &salt : NULL, salt ? 1 : 0,
                                      keys, n);
        if (got != n)
            FAIL(f, "kvvm_prefix_keys: %zu keys of %u full blocks", got, n);
        return;
    }
    uint64_t h[4] = { 0x6b767666757a7aull, 1, 2, 3 };
    for (uint32_t b = 0; b < n; b++) {
        for (uint32_t i = 0; i < T; i++)
            for (int w = 0; w < 4; w++)
                h[w] = mix64(h[w] ^ (tok_id(f, s, (uint64_t)b * T + i) + 0x9e3779b97f4a7c15ull *
                                                                            (uint64_t)(w + 1)));
        memcpy(keys[b].bytes, h, sizeof keys[b].bytes);
        if (scheme & 2)
            memset(keys[b].bytes + 16, 0, 16);
    }
}

static struct fentry *entry_find(struct fz *f, uint64_t ns, const kvvm_key *k)
{
    for (int i = 0; i < NE; i++)
        if (f->e[i].used && f->e[i].ns == ns && !memcmp(f->e[i].key.bytes, k->bytes, 32))
            return &f->e[i];
    return NULL;
}

/* How many of keys[0..n) lead in ns in the model: an upper bound of any lookup's answer
   (reclaim may have evicted some; the store holds only what this input published). */
static uint32_t model_leading(struct fz *f, uint64_t ns, const kvvm_key *keys, uint32_t n)
{
    uint32_t k = 0;
    while (k < n && entry_find(f, ns, &keys[k]))
        k++;
    return k;
}

static uint64_t pick_ns(uint8_t a)
{
    return (a & 3) == 3 ? UINT64_MAX : (uint64_t)(a & 3);
}

/* A block of s is discarded in region r when its whole page is below first_kept (the
   model's first_kept: the discard's, lowered by truncates and shares). */
static bool block_discarded(const struct fz *f, const struct fseq *s, uint32_t r, uint64_t b)
{
    return (b + 1) * f->tpb <= s->kept[r];
}

/* No token of the block (up to the length: the last block may be partial) is kept: it may
   be discarded (a discard up to the length takes a partial last page; a truncate after a
   discard leaves the page the discard kept). */
static bool block_unkept(const struct fz *f, const struct fseq *s, uint32_t r, uint64_t b)
{
    uint64_t end = (b + 1) * f->tpb < s->len ? (b + 1) * f->tpb : s->len;
    return end <= s->kept[r];
}

static void do_publish(struct fz *f, struct fseq *s, uint8_t a, uint8_t b)
{
    f->call = "prefix_publish";
    if (!f->tpb)                       /* blocks are not whole tokens: attach refuses */
        return;
    uint32_t full = (uint32_t)(s->len / f->tpb), n = a % (full + 2);
    uint64_t ns = pick_ns(b);
    kvvm_key keys[MAXTOK];
    seq_keys(f, s, n <= full ? n : full, b >> 2, keys);
    if (n > full)                      /* past the full blocks: junk keys */
        memset(&keys[full], 0x5a, (n - full) * sizeof *keys);
    bool disc = false;
    for (uint32_t r = 0; r < f->nr; r++)
        for (uint32_t k = 0; k < n && k < full; k++)
            disc |= block_discarded(f, s, r, k);
    int rc = kvvm_prefix_publish(f->kv, s->h, ns, keys, n);
    if (s->dropped)
        CHECK(f, rc == -ESTALE || (n > full && rc == -EINVAL), "a dropped sequence: %d", rc);
    else if (n > full || disc)
        CHECK(f, rc == -EINVAL, "%u blocks of %u full, one discarded %d: %d", n, full, disc, rc);
    else
        CHECK(f, rc >= 0 || rc == -ENOMEM, "%d", rc);
    if (rc < 0) {
        others_unchanged(f, rc, s, NULL);
        return;
    }
    uint32_t absent = 0;
    for (uint32_t k = 0; k < n; k++)
        absent += !entry_find(f, ns, &keys[k]);
    /* new entries: at least those the model lacks (evicted ones are new again) */
    CHECK(f, (uint32_t)rc >= absent && (uint32_t)rc <= n, "%d new entries of %u keys, %u "
          "absent from the model", rc, n, absent);
    for (uint32_t k = 0; k < n; k++) {
        if (entry_find(f, ns, &keys[k]))
            continue;
        struct fentry *e = NULL;
        for (int i = 0; i < NE && !e; i++)
            if (!f->e[i].used)
                e = &f->e[i];
        CHECK(f, e, "the model's entry table is full");
        e->used = true;
        e->ns = ns;
        e->key = keys[k];
        for (uint32_t r = 0; r < f->nr; r++)
            for (uint32_t i = 0; i < f->tpb; i++) {
                uint64_t t = (uint64_t)k * f->tpb + i;
                e->tag[r][i] = t < s->kept[r] ? 0 : (uint16_t)s->tag[r][t];
            }
    }
    memcpy(f->last, keys, n * sizeof *keys);
    f->last_ns = ns;
    f->n_last = n;
    /* every key is present now (a present one kept its entry) */
    f->call = "prefix_lookup after publish";
    rc = kvvm_prefix_lookup(f->kv, ns, keys, n, NULL);
    CHECK(f, rc == (int)n, "%d of the %u keys just published", rc, n);
}

static void do_lookup(struct fz *f, struct fseq *s, uint8_t a, uint8_t b)
{
    f->call = "prefix_lookup";
    if (!f->tpb)
        return;
    uint32_t full = (uint32_t)(s->len / f->tpb), n = a % (full + 1);
    uint64_t ns = pick_ns(b);
    kvvm_key keys[MAXTOK];
    uint8_t where[MAXTOK];
    seq_keys(f, s, n, b >> 2, keys);
    if (a & 0x80 && n)                 /* a key nobody published: the chain stops there */
        keys[n - 1].bytes[31] ^= 0xa5;
    int rc = kvvm_prefix_lookup(f->kv, ns, keys, n, b & 0x80 ? where : NULL);
    uint32_t up = model_leading(f, ns, keys, n);
    /* never more than the model has in ns: nothing crosses namespaces */
    CHECK(f, rc >= 0 && (uint32_t)rc <= up, "%d of %u keys in namespace %llu, the model has "
          "%u leading", rc, n, (unsigned long long)ns, up);
    for (int i = 0; b & 0x80 && i < rc; i++)
        CHECK(f, where[i] >= KVVM_TIER_DEVICE && where[i] <= KVVM_TIER_STORE &&
              (f->store || where[i] != KVVM_TIER_STORE), "key %d: tier %u", i, where[i]);
}

static void do_attach(struct fz *f, struct fseq *src, uint8_t a, uint8_t b)
{
    f->call = "prefix_attach";
    struct fseq *dst = NULL;
    for (int i = 0; i < NS && !dst; i++)
        if (f->s[i].live && !f->s[i].len && !f->s[i].dropped && &f->s[i] != src)
            dst = &f->s[i];
    if (!dst)
        return;
    uint64_t ns = pick_ns(b);
    kvvm_key keys[MAXTOK];
    uint32_t n = 0;
    if (f->tpb && a & 0x80) {          /* the last publish's keys */
        ns = f->last_ns;
        n = f->n_last;
        memcpy(keys, f->last, n * sizeof *keys);
    } else if (f->tpb) {
        n = a % ((uint32_t)(src->len / f->tpb) + 1);
        seq_keys(f, src, n, b >> 2, keys);
    } else {
        memset(keys, 1, sizeof keys[0]);
        n = 1;
    }
    int rc = kvvm_prefix_attach(f->kv, dst->h, ns, keys, n);
    if (f->trace) {
        struct kvvm_stats st = { .size = sizeof st };
        kvvm_stats(f->kv, &st);
        fprintf(stderr, "  attach of %u keys: %d (store: %llu gets, %llu B in; %llu "
                "evictions)\n", n, rc, (unsigned long long)st.store_gets,
                (unsigned long long)st.store_bytes_in, (unsigned long long)st.prefix_evictions);
    }
    if (!f->tpb || f->ps % f->bpt) {
        CHECK(f, rc == -EOPNOTSUPP, "page_size %zu, bytes_per_token %llu: %d", f->ps,
              (unsigned long long)f->bpt, rc);
        return;
    }
    CHECK(f, rc >= 0 || rc == -ENOMEM, "%d", rc);
    uint32_t up = model_leading(f, ns, keys, n);
    if (rc < 0) {
        /* all or nothing: dst still empty and where it was (issue 31 item 4: a swapped-out
           one was left resident), nothing else moved */
        struct kvvm_seq_info in;
        info(f, dst->h, &in);
        CHECK(f, in.length == 0 && in.resident == f->snap[dst - f->s].resident,
              "a failed attach left dst %llu tokens long, resident %d (was %d)",
              (unsigned long long)in.length, in.resident, f->snap[dst - f->s].resident);
        others_unchanged(f, rc, dst, NULL);
        return;
    }
    CHECK(f, (uint32_t)rc <= up, "%d blocks attached of %u keys in namespace %llu, the model "
          "has %u leading", rc, n, (unsigned long long)ns, up);
    /* its bytes are the published ones (read back after the call: verify_seq) */
    for (uint32_t k = 0; k < (uint32_t)rc; k++) {
        const struct fentry *e = entry_find(f, ns, &keys[k]);
        for (uint32_t r = 0; r < f->nr; r++)
            for (uint32_t i = 0; i < f->tpb; i++)
                dst->tag[r][k * f->tpb + i] = e->tag[r][i];
    }
    memset(dst->kept, 0, sizeof dst->kept);
    dst->len = (uint64_t)rc * f->tpb;
    verify_seq(f, dst, false);
}

static void do_drop(struct fz *f, struct fseq *s, uint8_t a, uint8_t b)
{
    f->call = "prefix_drop";
    uint64_t ns = pick_ns(b);
    if (a & 0x80 || !f->tpb) {         /* every entry of ns */
        int rc = kvvm_prefix_drop(f->kv, ns, NULL, 0);
        uint32_t had = 0;
        for (int i = 0; i < NE; i++)
            had += f->e[i].used && f->e[i].ns == ns;
        CHECK(f, rc >= 0 && (uint32_t)rc <= had, "%d removed, the model had %u in ns %llu",
              rc, had, (unsigned long long)ns);
        for (int i = 0; i < NE; i++)
            if (f->e[i].used && f->e[i].ns == ns) {
                f->call = "prefix_lookup after drop";
                CHECK(f, kvvm_prefix_lookup(f->kv, ns, &f->e[i].key, 1, NULL) == 0,
                      "an entry of the dropped namespace %llu answers", (unsigned long long)ns);
                f->e[i].used = false;
            }
        return;
    }
    uint32_t n = a % ((uint32_t)(s->len / f->tpb) + 1);
    kvvm_key keys[MAXTOK];
    seq_keys(f, s, n, b >> 2, keys);
    int rc = kvvm_prefix_drop(f->kv, ns, keys, n);
    uint32_t had = 0;
    for (uint32_t k = 0; k < n; k++)
        had += entry_find(f, ns, &keys[k]) != NULL;
    CHECK(f, rc >= 0 && (uint32_t)rc <= had, "%d removed of %u keys, the model had %u", rc, n,
          had);
    for (uint32_t k = 0; k < n; k++) {
        struct fentry *e = entry_find(f, ns, &keys[k]);
        if (e)
            e->used = false;
        f->call = "prefix_lookup after drop";
        CHECK(f, kvvm_prefix_lookup(f->kv, ns, &keys[k], 1, NULL) == 0,
              "dropped key %u answers (store %d)", k, f->store);
    }
}

static uint32_t blocks_of(const struct fz *f, const struct fseq *s)
{
    return (uint32_t)((s->len + f->tpb - 1) / f->tpb);
}

/* ids[0..n) of s's blocks [first, first + n): in range, -1 where the model knows the block's
   page discarded in every region and only where no token of it is kept, distinct; through
   the pool view (after a kvvm_sync: every copy done) the bytes the model knows. */
static void check_ids(struct fz *f, struct fseq *s, uint32_t first, uint32_t n,
                      const int32_t *ids)
{
    for (uint32_t i = 0; i < n; i++) {
        uint64_t b = first + i;
        bool gone = true, unkept = true;
        for (uint32_t r = 0; r < f->nr; r++) {
            gone &= block_discarded(f, s, r, b);
            unkept &= block_unkept(f, s, r, b);
        }
        CHECK(f, gone ? ids[i] == -1 : unkept ? ids[i] >= -1 && ids[i] < (int32_t)f->view_ids
                                              : ids[i] >= 0 && ids[i] < (int32_t)f->view_ids,
              "block %llu: id %d (discarded in every region: %d, no token kept: %d; %u ids)",
              (unsigned long long)b, ids[i], gone, unkept, f->view_ids);
        for (uint32_t j = 0; j < i; j++)
            CHECK(f, ids[i] < 0 || ids[i] != ids[j], "blocks %u and %u share id %d", first + j,
                  first + i, ids[i]);
    }
    if (!n)
        return;
    f->call = "sync before reading the pool view";
    CHECK(f, kvvm_sync(f->kv) == 0, "sync");
    for (uint32_t i = 0; i < n; i++) {
        uint64_t b = first + i;
        if (ids[i] < 0)
            continue;
        for (uint32_t r = 0; r < f->nr; r++) {
            const uint8_t *p = (const uint8_t *)(uintptr_t)(f->view_base[r] +
                                                           (uint64_t)ids[i] * f->ps);
            for (uint64_t t = b * f->tpb; t < (b + 1) * f->tpb && t < s->len; t++) {
                uint32_t tag = s->tag[r][t];
                if (!tag || t < s->kept[r])
                    continue;
                /* the first, middle and last byte of each token: a wrong page or offset
                   shows there (every byte of the tokens is read back through the window) */
                const uint64_t at[3] = { 0, f->bpt / 2, f->bpt - 1 };
                for (int j = 0; j < 3; j++) {
                    uint64_t k = at[j];
                    uint8_t got = p[(t - b * f->tpb) * f->bpt + k];
                    CHECK(f, got == cookie(tag, r, t * f->bpt + k), "seq %ld block %llu (id "
                          "%d) region %u token %llu byte %llu through the pool view: %#x, "
                          "expected %#x", (long)(s - f->s), (unsigned long long)b, ids[i], r,
                          (unsigned long long)t, (unsigned long long)k, got,
                          cookie(tag, r, t * f->bpt + k));
                }
            }
        }
    }
}

static void do_block_table(struct fz *f, struct fseq *s, uint8_t a, uint8_t b)
{
    f->call = "seq_block_table";
    int32_t ids[MAXTOK + 2];
    if (!f->tpb) {
        int rc = kvvm_seq_block_table(f->kv, s->h, 0, 0, ids);
        CHECK(f, rc == -EOPNOTSUPP || rc == 0 || rc == -ESTALE, "%d", rc);
        return;
    }
    uint32_t nb = blocks_of(f, s), first = a % (nb + 2), n = b % (nb + 2);
    struct kvvm_seq_info in;
    info(f, s->h, &in);
    int rc = kvvm_seq_block_table(f->kv, s->h, first, n, ids);
    bool range = (uint64_t)first + n > nb;
    if (!f->view)
        CHECK(f, rc == -EOPNOTSUPP || (range && rc == -EINVAL) || (s->dropped && rc == -ESTALE),
              "no pool view: %d", rc);
    else if (s->dropped)
        CHECK(f, rc == -ESTALE || (range && rc == -EINVAL), "a dropped sequence: %d", rc);
    else if (range)                    /* (the two checks in either order) */
        CHECK(f, rc == -EINVAL || (!in.resident && rc == -EAGAIN), "blocks [%u, %u) of %u, "
              "resident %d: %d", first, first + n, nb, in.resident, rc);
    else if (!in.resident)
        CHECK(f, rc == -EAGAIN, "not resident: %d", rc);
    else
        CHECK(f, rc == 0 || rc == -ENOMEM, "%d", rc);
    if (rc) {
        others_unchanged(f, rc, s, NULL);
        return;
    }
    check_ids(f, s, first, n, ids);
}

static void do_batch_table(struct fz *f, uint8_t a, uint8_t b)
{
    f->call = "batch_block_table";
    if (!f->tpb)
        return;
    struct fseq *set[3];
    kvvm_seq hs[3];
    int n = 0;
    bool stale = false, out = false;
    uint32_t total = 0;
    for (int i = 0; i < 3 && n < 1 + a % 3; i++) {
        struct fseq *s = &f->s[(a / 3 + (unsigned)i * (1 + b % 5)) % NS];
        bool dup = false;
        for (int k = 0; k < n; k++)
            dup |= set[k] == s;
        if (!s->live || dup)
            continue;
        struct kvvm_seq_info in;
        info(f, s->h, &in);
        set[n] = s;
        hs[n] = s->h;
        stale |= s->dropped;
        out |= !in.resident;
        total += blocks_of(f, s);
        n++;
    }
    if (!n)
        return;
    int32_t indptr[4], indices[3 * (MAXTOK + 1)], last[3];
    size_t cap = b & 0x80 ? total : b % (total + 2);
    int rc = kvvm_batch_block_table(f->kv, hs, (size_t)n, indptr, indices, cap,
                                    a & 0x80 ? NULL : last);
    if (!f->view)
        CHECK(f, rc == -EOPNOTSUPP || (stale && rc == -ESTALE), "no pool view: %d", rc);
    else if (stale || out)
        CHECK(f, (stale && rc == -ESTALE) || (out && rc == -EAGAIN) || rc == -ENOSPC,
              "dropped %d, not resident %d: %d", stale, out, rc);
    else if (cap < total)
        CHECK(f, rc == -ENOSPC, "cap %zu for %u blocks: %d", cap, total, rc);
    else
        CHECK(f, rc == 0 || rc == -ENOMEM, "%d", rc);
    if (rc == -ENOSPC && !stale && !out)
        CHECK(f, indptr[n] == (int32_t)total, "-ENOSPC: indptr[%d] = %d, %u blocks", n,
              indptr[n], total);
    if (rc) {
        others_unchanged(f, rc, set[0], n > 1 ? set[1] : NULL);
        return;
    }
    for (int i = 0; i < n; i++) {
        uint32_t nb = blocks_of(f, set[i]);
        CHECK(f, indptr[0] == 0 && indptr[i + 1] - indptr[i] == (int32_t)nb,
              "member %d: indptr %d..%d for %u blocks", i, indptr[i], indptr[i + 1], nb);
        uint64_t ll = set[i]->len ? set[i]->len - (uint64_t)(nb - 1) * f->tpb : 0;
        CHECK(f, a & 0x80 || last[i] == (int32_t)ll, "member %d: last_len %d, model %llu", i,
              last[i], (unsigned long long)ll);
        /* the same ids as kvvm_seq_block_table's */
        int32_t ids[MAXTOK + 2];
        f->call = "seq_block_table after batch_block_table";
        CHECK(f, kvvm_seq_block_table(f->kv, set[i]->h, 0, nb, ids) == 0, "member %d", i);
        CHECK(f, !memcmp(ids, &indices[indptr[i]], nb * sizeof *ids),
              "member %d: the batch's ids differ from kvvm_seq_block_table's", i);
        check_ids(f, set[i], 0, nb, ids);
        f->call = "batch_block_table";
    }
}

static void do_v03(struct fz *f, struct fseq *s, const uint8_t *o)
{
    switch (o[0] & 15) {
    case 0: case 1: case 2: do_publish(f, s, o[2], o[3]); break;
    case 3: case 4: do_lookup(f, s, o[2], o[3]); break;
    case 5: case 6: case 7: do_attach(f, s, o[2], o[3]); break;
    case 8: do_drop(f, s, o[2], o[3]); break;
    case 9: case 10: case 11: do_block_table(f, s, o[2], o[3]); break;
    case 12: case 13: do_batch_table(f, o[2], o[3]); break;
    default: do_lookup(f, s, o[2] | 0x80, o[3]); break;
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
    bool v03 = d[0] & 0x80;
    if (v03)                                   /* 0.3: blocks of whole tokens (8..32);
                                                  small tokens: the fuzzer's CPU */
        f->bpt = (f->ps == 4 * GRAN ? 512u : 256u) << (d[1] >> 2 & 1);
    if (f->bpt * MAXTOK > sizeof f->buf)
        f->bpt = sizeof f->buf / MAXTOK;
    f->tpb = f->ps % f->bpt ? 0 : (uint32_t)(f->ps / f->bpt);
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
    /* the pool view CPU-readable, to read blocks through it */
    f->view = v03 && (d[2] & 0x40);
    if (f->view) {
        c.flags |= KVVM_F_POOL_VIEW;
        c.emu_opaque = 0;
    }
    char url[80];
    f->store = v03 && (d[2] & 0x20) && store_dir[0];
    if (f->store) {
        store_wipe();
        snprintf(url, sizeof url, "file://%s", store_dir);
        c.store_url = url;
        c.store_timeout_ms = 600000;           /* a bound on the store's latency is not what
                                                  this checks: no timing in the verdicts */
    }
    if (kvvm_open(&c, &f->kv))
        return -1;
    for (uint32_t r = 0; f->view && r < f->nr; r++)
        if (kvvm_pool_base(f->kv, r, &f->view_base[r]))
            abort();
    if (f->view && kvvm_pool_blocks(f->kv, &f->view_ids))
        abort();
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
    if (o[0] >= 0xe0) {                /* an eighth of the calls: the 0.3 ones */
        if (s->live)
            do_v03(f, s, o);
        else
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
