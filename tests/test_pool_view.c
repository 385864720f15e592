/*
 * tests/test_pool_view.c: the pool view (KVVM_F_POOL_VIEW, docs/api.md "Two views of one
 * pool"): block ids the same in every region, the bytes of both views, copy-on-write ids,
 * -EAGAIN for a swapped-out sequence, -1 for blocks discarded in every region, the CSR
 * form and -ENOSPC, -EOPNOTSUPP without the flag, the driver calls of a grow with and
 * without the view, fault sweeps over the mapping paths, and no mapping left at close.
 *
 * Emulated device, 4 KiB pages, two regions of 1024-byte tokens (4 tokens per block). Tests
 * that read through the views with the CPU open the device without opaque mode.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define KVVM_HARNESS_SHADOW
#include "harness.h"

#define NR  2u
#define BPT 1024u
#define TPB 4u          /* tokens per block: KB / BPT */

static void vcfg(struct kvvm_config *c, bool view, bool cpu)
{
    tcfg(c, KB, NR, BPT, 4, 64, 48);
    c->pool_thread = 0;     /* its refills would count among a test's driver calls */
    if (view)
        c->flags |= KVVM_F_POOL_VIEW;
    if (cpu)
        c->emu_opaque = 0;  /* windows and views CPU-readable */
}

static void table(struct tctx *t, kvvm_seq s, uint32_t n, int32_t *ids)
{
    int rc = kvvm_seq_block_table(t->kv, s, 0, n, ids);
    cr_assert_eq(rc, 0, "kvvm_seq_block_table(0, %u): %d (%s)", n, rc, kvvm_last_error());
}

/* The bytes of block b of region r through the pool view (CPU-readable device). */
static const uint8_t *view_bytes(struct tctx *t, uint32_t r, int32_t id)
{
    uint64_t base;
    cr_assert_eq(kvvm_pool_base(t->kv, r, &base), 0);
    cr_assert_geq(id, 0);
    return (const uint8_t *)(uintptr_t)(base + (uint64_t)id * KB);
}

/* Every block of s reads through the pool view, at its id in every region, what the
   shadow says the window holds. */
static void verify_view_from(struct tctx *t, struct sh *s, uint64_t kept, const char *where)
{
    uint32_t nb = (uint32_t)((s->len + TPB - 1) / TPB);
    int32_t ids[64];
    table(t, s->h, nb, ids);
    for (uint32_t b = 0; b < nb; b++) {
        uint64_t end = (b + 1) * TPB < s->len ? (b + 1) * TPB : s->len;
        uint64_t from = b * TPB > kept ? b * TPB : kept;
        if ((b + 1) * TPB <= kept)              /* discarded in every region */
            cr_expect_eq(ids[b], -1, "%s: discarded block %u has id %d", where, b, ids[b]);
        if (from >= end)                        /* no token of it is kept */
            continue;
        size_t off = (size_t)(from - b * TPB) * BPT, n = (size_t)(end - from) * BPT;
        for (uint32_t r = 0; r < NR; r++)
            cr_expect_eq(memcmp(view_bytes(t, r, ids[b]) + off,
                                s->exp[r] + (size_t)b * KB + off, n), 0,
                         "%s: block %u (id %d) of region %u differs through the pool view",
                         where, b, ids[b], r);
    }
}

static void verify_view(struct tctx *t, struct sh *s, const char *where)
{
    verify_view_from(t, s, 0, where);
}

static uint32_t n_ids(struct tctx *t)
{
    uint32_t n = 0;
    cr_assert_eq(kvvm_pool_blocks(t->kv, &n), 0);
    return n;
}

/* ---- the API's sentences ------------------------------------------------------------ */

/* "-EOPNOTSUPP without KVVM_F_POOL_VIEW" (every call of the view). */
Test(view, eopnotsupp_without_the_flag)
{
    TH_DEADLINE(60);
    struct kvvm_config c;
    struct tctx t;
    vcfg(&c, false, false);
    topen(&t, &c);
    struct sh s;
    sh_create(&t, &s);
    sh_grow(&t, &s, 5);
    uint64_t a;
    uint32_t n;
    int32_t ids[2], indptr[2], idx[4];
    cr_expect_eq(kvvm_pool_base(t.kv, 0, &a), -EOPNOTSUPP);
    cr_expect_eq(kvvm_pool_blocks(t.kv, &n), -EOPNOTSUPP);
    cr_expect_eq(kvvm_seq_block_table(t.kv, s.h, 0, 2, ids), -EOPNOTSUPP);
    cr_expect_eq(kvvm_batch_block_table(t.kv, &s.h, 1, indptr, idx, 4, NULL), -EOPNOTSUPP);
    cr_expect_neq(strstr(kvvm_last_error(), "KVVM_F_POOL_VIEW"), NULL, "%s",
                  kvvm_last_error());
    sh_free(&t, &s);
    tclose(&t);
}

/* "block id i of region r is at kvvm_pool_base(r) + i * page_size and holds the same
   physical page as the contiguous window ... bytes written through either view are the
   bytes read through the other", "A block has ONE id, the same in every region", "every
   id is < *n_ids (fixed at open)". */
Test(view, one_id_per_block_in_every_region_and_bytes_through_both_views)
{
    TH_DEADLINE(60);
    struct kvvm_config c;
    struct tctx t;
    vcfg(&c, true, true);
    topen(&t, &c);
    uint32_t n = n_ids(&t);
    cr_expect_geq(n, 4u * 16u, "fewer ids (%u) than blocks the slots can hold", n);
    uint64_t b0, b1;
    cr_assert_eq(kvvm_pool_base(t.kv, 0, &b0), 0);
    cr_assert_eq(kvvm_pool_base(t.kv, 1, &b1), 0);
    cr_expect_eq(b1 - b0, (uint64_t)n * KB, "region 1's view does not follow region 0's");
    cr_expect_eq(kvvm_pool_base(t.kv, NR, &b0), -EINVAL);
    struct sh s, u;
    sh_create(&t, &s);
    sh_create(&t, &u);
    sh_grow_fill(&t, &s, 10, 1);            /* 3 blocks, the last partial */
    sh_grow_fill(&t, &u, 4, 2);
    int32_t ids[3], uid[1];
    table(&t, s.h, 3, ids);
    table(&t, u.h, 1, uid);
    for (int i = 0; i < 3; i++) {
        cr_expect(ids[i] >= 0 && (uint32_t)ids[i] < n, "id %d out of [0, %u)", ids[i], n);
        cr_expect_neq(ids[i], uid[0], "two sequences' blocks share an id");
        for (int j = 0; j < i; j++)
            cr_expect_neq(ids[i], ids[j], "blocks %d and %d have the same id", i, j);
    }
    verify_view(&t, &s, "after the writes");    /* the same id in region 0 and region 1 */
    verify_view(&t, &u, "the other sequence");
    /* through the pool view, read through the window (and kvvm_seq_read) */
    for (uint32_t r = 0; r < NR; r++) {
        uint8_t *p = (uint8_t *)view_bytes(&t, r, ids[1]);
        memset(p + 5, 0x40 + (int)r, 100);
        memset(s.exp[r] + KB + 5, 0x40 + (int)r, 100);
        uint64_t a;
        cr_assert_eq(kvvm_seq_addr(t.kv, s.h, r, &a), 0);
        cr_expect_eq(((const uint8_t *)(uintptr_t)a)[KB + 5], 0x40 + r);
    }
    sh_verify(&t, &s, "written through the pool view");
    /* the ids stay while the sequence is unchanged; a grow onto a new block adds one */
    int32_t again[4];
    table(&t, s.h, 3, again);
    cr_expect_eq(memcmp(ids, again, sizeof ids), 0, "ids changed with the sequence unchanged");
    sh_grow_fill(&t, &s, 12, 3);            /* fills block 2 in place */
    sh_grow_fill(&t, &s, 13, 3);            /* onto block 3 */
    table(&t, s.h, 4, again);
    cr_expect_eq(memcmp(ids, again, sizeof ids), 0, "a grow changed the old blocks' ids");
    cr_expect(again[3] >= 0 && again[3] != ids[0] && again[3] != ids[1] && again[3] != ids[2]);
    verify_view(&t, &s, "after the grow");
    /* range checks */
    cr_expect_eq(kvvm_seq_block_table(t.kv, s.h, 2, 3, again), -EINVAL, "past the blocks");
    cr_expect_eq(kvvm_seq_block_table(t.kv, s.h, 0, 1, NULL), -EINVAL);
    cr_expect_eq(kvvm_seq_block_table(t.kv, s.h, 4, 0, NULL), 0, "an empty range");
    cr_expect_eq(kvvm_seq_block_table(t.kv, s.h + (1ull << 32), 0, 1, again), -ENOENT);
    tcheck(&t, "end");
    sh_free(&t, &u);
    sh_free(&t, &s);
    tclose(&t);
}

/* "copy-on-write (write, prepare_write, grow into a shared partial block) gives that block
   a new id"; a fork shares the ids of the blocks it shares. */
Test(view, copy_on_write_gives_a_new_id)
{
    TH_DEADLINE(60);
    struct kvvm_config c;
    struct tctx t;
    vcfg(&c, true, true);
    topen(&t, &c);
    struct sh p, k;
    sh_create(&t, &p);
    sh_grow_fill(&t, &p, 10, 1);            /* blocks 0, 1 full, 2 partial */
    int32_t pa[3], ka[3], pb[3], kb[3];
    table(&t, p.h, 3, pa);
    sh_fork(&t, &p, &k);
    table(&t, k.h, 3, ka);
    cr_expect_eq(memcmp(pa, ka, sizeof pa), 0, "a fork's shared blocks have other ids");
    /* write: the child's block 0 is copied */
    sh_write(&t, &k, 1, 100, 50, 9);
    table(&t, k.h, 3, kb);
    table(&t, p.h, 3, pb);
    cr_expect_neq(kb[0], ka[0], "a write's copy-on-write kept the block's id");
    cr_expect_eq(kb[1], ka[1]);
    cr_expect_eq(memcmp(pa, pb, sizeof pa), 0, "the parent's ids changed");
    verify_view(&t, &k, "child after its write");
    verify_view(&t, &p, "parent after the child's write");
    /* prepare_write: the parent's block 1 */
    cr_assert_eq(kvvm_seq_prepare_write(t.kv, p.h, TPB, TPB + 1), 0);
    table(&t, p.h, 3, pb);
    cr_expect_neq(pb[1], pa[1], "prepare_write's copy kept the block's id");
    cr_expect_eq(pb[0], pa[0]);
    /* share: the whole blocks keep their ids, the copied partial block has its own */
    struct sh d;
    sh_create(&t, &d);
    sh_share(&t, &d, &p, 10);
    int32_t da[3];
    table(&t, d.h, 3, da);
    table(&t, p.h, 3, pb);
    cr_expect(da[0] == pb[0] && da[1] == pb[1], "a share's whole blocks have other ids");
    cr_expect_neq(da[2], pb[2], "a share's copied partial block has the source's id");
    verify_view(&t, &d, "shared");
    sh_free(&t, &d);
    /* a grow into the shared partial block 2 */
    sh_grow_fill(&t, &k, 11, 4);
    table(&t, k.h, 3, kb);
    cr_expect_neq(kb[2], ka[2], "a grow into a shared partial block kept its id");
    table(&t, p.h, 3, pb);
    cr_expect_eq(pb[2], pa[2], "the parent's partial block changed id");
    verify_view(&t, &k, "child after its grow");
    verify_view(&t, &p, "parent at the end");
    sh_verify(&t, &k, "child");
    sh_verify(&t, &p, "parent");
    tcheck(&t, "end");
    sh_free(&t, &k);
    sh_free(&t, &p);
    tclose(&t);
}

/* "-EAGAIN s is not resident (swap it in first)"; "swap-out ... end them". */
Test(view, eagain_for_a_swapped_out_sequence)
{
    TH_DEADLINE(60);
    struct kvvm_config c;
    struct tctx t;
    vcfg(&c, true, true);
    c.host_budget = 32 * KB;
    topen(&t, &c);
    struct sh s, u;
    sh_create(&t, &s);
    sh_create(&t, &u);
    sh_grow_fill(&t, &s, 9, 1);
    sh_grow_fill(&t, &u, 3, 2);
    int32_t ids[3], indptr[3], idx[8];
    table(&t, s.h, 3, ids);
    cr_assert_eq(kvvm_seq_swap_out(t.kv, s.h), 0);
    cr_expect_eq(kvvm_seq_block_table(t.kv, s.h, 0, 3, ids), -EAGAIN);
    kvvm_seq b[2] = { u.h, s.h };
    cr_expect_eq(kvvm_batch_block_table(t.kv, b, 2, indptr, idx, 8, NULL), -EAGAIN);
    cr_expect_eq(kvvm_seq_block_table(t.kv, s.h, 0, 0, NULL), -EAGAIN);
    cr_assert_eq(kvvm_seq_swap_in(t.kv, s.h), 0);
    table(&t, s.h, 3, ids);
    verify_view(&t, &s, "after the swap-in");
    verify_view(&t, &u, "the other sequence");
    tcheck(&t, "end");
    sh_free(&t, &u);
    sh_free(&t, &s);
    tclose(&t);
}

/* "-1 for a block discarded in every region (one discarded in some regions keeps its id;
   its bytes in those regions are gone)"; discarding one region unmaps that region's slot
   once no device work may use it. */
Test(view, minus_one_for_blocks_discarded_in_every_region)
{
    TH_DEADLINE(60);
    struct kvvm_config c;
    struct tctx t;
    vcfg(&c, true, true);
    topen(&t, &c);
    struct sh s;
    sh_create(&t, &s);
    sh_grow_fill(&t, &s, 17, 1);            /* 5 blocks */
    int32_t a[5], b[5];
    table(&t, s.h, 5, a);
    cr_assert_eq(kvvm_seq_discard(t.kv, s.h, KVVM_ALL_REGIONS, 2 * TPB), 0);
    cr_assert_eq(kvvm_seq_discard(t.kv, s.h, 0, 3 * TPB), 0);   /* block 2: region 0 only */
    table(&t, s.h, 5, b);
    cr_expect_eq(b[0], -1);
    cr_expect_eq(b[1], -1);
    cr_expect_eq(b[2], a[2], "a block discarded in one region changed its id");
    cr_expect_eq(b[3], a[3]);
    cr_expect_eq(b[4], a[4]);
    /* region 1 of block 2 is still there; region 0's slot goes once the device is quiet */
    cr_expect_eq(memcmp(view_bytes(&t, 1, b[2]), s.exp[1] + 2 * KB, KB), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    uint64_t base;
    cr_assert_eq(kvvm_pool_base(t.kv, 0, &base), 0);
    cr_expect_neq(emu_lookup(base + (uint64_t)b[2] * KB, NULL, NULL, NULL), 0,
                  "the discarded region's slot is still mapped after a sync");
    cr_assert_eq(kvvm_pool_base(t.kv, 1, &base), 0);
    cr_expect_eq(emu_lookup(base + (uint64_t)b[2] * KB, NULL, NULL, NULL), 0,
                 "the kept region's slot was unmapped");
    cr_expect_eq(emu_lookup(base + (uint64_t)a[0] * KB, NULL, NULL, NULL), -ENOENT,
                 "a block discarded everywhere is still mapped after a sync");
    table(&t, s.h, 5, b);
    cr_expect_eq(b[2], a[2]);
    tcheck(&t, "end");
    sh_free(&t, &s);
    tclose(&t);
}

/* FlashInfer's CSR form: indptr, indices, last_len; "-ENOSPC cap too small (indptr is then
   filled, and indptr[n] says how many are needed)". */
Test(view, csr_form_and_enospc)
{
    TH_DEADLINE(60);
    struct kvvm_config c;
    struct tctx t;
    vcfg(&c, true, false);
    topen(&t, &c);
    struct sh s[3];
    uint64_t len[3] = { 9, 4, 1 };
    for (int i = 0; i < 3; i++) {
        sh_create(&t, &s[i]);
        sh_grow(&t, &s[i], len[i]);
    }
    kvvm_seq hs[3] = { s[0].h, s[1].h, s[2].h };
    int32_t indptr[4] = { -5, -5, -5, -5 }, idx[8], last[3], one[3];
    cr_expect_eq(kvvm_batch_block_table(t.kv, hs, 3, indptr, idx, 4, last), -ENOSPC);
    cr_expect_eq(indptr[0], 0);
    cr_expect_eq(indptr[1], 3);
    cr_expect_eq(indptr[2], 4);
    cr_expect_eq(indptr[3], 5, "indptr[n] is not the blocks needed");
    cr_expect_neq(strstr(kvvm_last_error(), "indptr"), NULL, "%s", kvvm_last_error());
    memset(indptr, 0xff, sizeof indptr);
    cr_assert_eq(kvvm_batch_block_table(t.kv, hs, 3, indptr, idx, 8, last), 0);
    cr_expect(indptr[0] == 0 && indptr[1] == 3 && indptr[2] == 4 && indptr[3] == 5);
    cr_expect(last[0] == 1 && last[1] == 4 && last[2] == 1, "last_len %d %d %d", last[0],
              last[1], last[2]);
    for (int i = 0; i < 3; i++) {
        uint32_t nb = (uint32_t)(indptr[i + 1] - indptr[i]);
        table(&t, hs[i], nb, one);
        cr_expect_eq(memcmp(one, idx + indptr[i], nb * sizeof *one), 0,
                     "sequence %d's CSR ids differ from its block table", i);
    }
    cr_expect_eq(kvvm_batch_block_table(t.kv, hs, 3, indptr, idx, 8, NULL), 0, "no last_len");
    cr_expect_eq(kvvm_batch_block_table(t.kv, NULL, 0, indptr, NULL, 0, NULL), 0);
    cr_expect_eq(indptr[0], 0);
    cr_expect_eq(kvvm_batch_block_table(t.kv, hs, 3, NULL, idx, 8, NULL), -EINVAL);
    kvvm_seq bad[2] = { hs[0], hs[0] + 7 };
    cr_expect_eq(kvvm_batch_block_table(t.kv, bad, 2, indptr, idx, 8, NULL), -ENOENT);
    tcheck(&t, "end");
    for (int i = 0; i < 3; i++)
        sh_free(&t, &s[i]);
    tclose(&t);
}

/* "swap-out, discard, truncate and free end them": a truncate and a free let the ids go;
   they are unmapped once no device work may use them; nothing is mapped at close. */
Test(view, truncate_and_free_end_ids_and_close_leaves_no_mapping)
{
    TH_DEADLINE(60);
    struct kvvm_config c;
    struct tctx t;
    vcfg(&c, true, false);
    topen(&t, &c);
    struct sh s, u;
    sh_create(&t, &s);
    sh_create(&t, &u);
    sh_grow_fill(&t, &s, 16, 1);
    sh_grow_fill(&t, &u, 8, 2);
    int32_t a[4], b[4];
    table(&t, s.h, 4, a);
    table(&t, u.h, 2, b);
    uint64_t base[NR];
    for (uint32_t r = 0; r < NR; r++) {
        cr_assert_eq(kvvm_pool_base(t.kv, r, &base[r]), 0);
        for (int i = 0; i < 4; i++)
            cr_expect_eq(emu_lookup(base[r] + (uint64_t)a[i] * KB, NULL, NULL, NULL), 0);
    }
    cr_assert_eq(kvvm_seq_truncate(t.kv, s.h, 5), 0);
    s.len = 5;
    int32_t c2[2];
    table(&t, s.h, 2, c2);
    cr_expect(c2[0] == a[0] && c2[1] == a[1], "a truncate changed the kept blocks' ids");
    cr_assert_eq(kvvm_seq_free(t.kv, u.h), 0);
    sh_release(&u);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    for (uint32_t r = 0; r < NR; r++) {
        int32_t gone[4] = { a[2], a[3], b[0], b[1] };
        for (int i = 0; i < 4; i++)
            cr_expect_eq(emu_lookup(base[r] + (uint64_t)gone[i] * KB, NULL, NULL, NULL),
                         -ENOENT, "id %d of a truncated or freed block is still mapped in "
                         "region %u after a sync", gone[i], r);
        for (int i = 0; i < 2; i++)
            cr_expect_eq(emu_lookup(base[r] + (uint64_t)a[i] * KB, NULL, NULL, NULL), 0);
    }
    sh_verify(&t, &s, "kept");
    tcheck(&t, "end");
    sh_release(&s);     /* (the shadow only: the close below frees the sequence) */
    tclose(&t);     /* th_close: no handle, mapping or reservation left behind */
}

/* With the frame pool thread, which prepares the groups ahead: the ids, the bytes through
   both views, forks and copy-on-write, many grows taking groups and frames (the checker
   after each step). */
Test(view, with_the_frame_pool_thread)
{
    TH_DEADLINE(120);
    struct kvvm_config c;
    struct tctx t;
    vcfg(&c, true, true);
    c.pool_thread = 1;
    topen(&t, &c);
    struct sh s[3];
    for (int i = 0; i < 3; i++)
        sh_create(&t, &s[i]);
    for (uint64_t len = 1; len <= 16; len += 3) {
        for (int i = 0; i < 3; i++)
            sh_grow_fill(&t, &s[i], len + (uint64_t)i, (uint32_t)(i + 1));
        cr_assert_eq(kvvm_step(t.kv), 0);
        tcheck(&t, "a step");
        for (int i = 0; i < 3; i++)
            verify_view(&t, &s[i], "growing");
    }
    struct sh k;
    sh_fork(&t, &s[0], &k);
    sh_write(&t, &k, 1, 3 * BPT, BPT, 9);
    sh_grow_fill(&t, &k, 24, 10);
    verify_view(&t, &k, "the fork");
    verify_view(&t, &s[0], "its parent");
    tcheck(&t, "end");
    sh_free(&t, &k);
    for (int i = 0; i < 3; i++)
        sh_free(&t, &s[i]);
    tclose(&t);
}

/* kvvm_trim gives back the frames of the prepared groups too, unmapped at once: the driver
   holds nothing afterwards (no handle kept alive by a view mapping). */
Test(view, trim_releases_prepared_groups)
{
    TH_DEADLINE(60);
    struct kvvm_config c;
    struct tctx t;
    vcfg(&c, true, false);
    topen(&t, &c);
    struct sh s;
    sh_create(&t, &s);
    sh_grow_fill(&t, &s, 9, 1);
    int32_t ids[3];
    table(&t, s.h, 3, ids);
    sh_free(&t, &s);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    cr_assert_eq(kvvm_step(t.kv), 0);           /* groups prepared again */
    cr_assert_eq(kvvm_trim(t.kv, 0), 0);
    struct emu_counters e;
    cr_assert_eq(emu_counters_get(t.ord, &e), 0);
    cr_expect_eq(e.handles, 0, "%lu handles left after a trim", (unsigned long)e.handles);
    cr_expect_eq(e.mappings, 0, "%lu mappings left after a trim", (unsigned long)e.mappings);
    tcheck(&t, "after the trim");
    struct sh u;                                /* and it works again */
    sh_create(&t, &u);
    sh_grow_fill(&t, &u, 6, 2);
    table(&t, u.h, 2, ids);
    sh_verify(&t, &u, "after the trim");
    tcheck(&t, "end");
    sh_free(&t, &u);
    tclose(&t);
}

/* Random operations on a few sequences (grow, fork, write, truncate, swap-out and in,
   free, step, sync) with the pool view, the frame pool thread off or on: after each, every
   sequence's bytes through the pool view (at its block table's ids) are its window's, and
   the checker passes (in a KVVM_DEBUG build it also runs after every call). */
static uint32_t rnd(uint64_t *x)
{
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*x >> 33);
}

static void random_ops(bool thread, uint64_t seed)
{
    struct kvvm_config c;
    struct tctx t;
    const char *env = getenv("KVVMTEST_VIEW_SEED");     /* another seed, by hand */
    if (env)
        seed = strtoull(env, NULL, 0);
    vcfg(&c, true, true);
    c.pool_thread = thread;
    c.host_budget = 64 * KB;
    topen(&t, &c);
    struct sh s[4];
    bool live[4] = { false };
    uint64_t kept[4] = { 0 };   /* first_kept (every region): blocks below read nothing */
    uint32_t lin = 1;
    for (int op = 0; op < 300; op++) {
        int i = (int)(rnd(&seed) % 4), k = (int)(rnd(&seed) % 9);
        if (!live[i]) {
            sh_create(&t, &s[i]);
            live[i] = true;
            kept[i] = 0;
            continue;
        }
        uint64_t len = s[i].len;
        if (k <= 1 && len < 60) {                           /* grow */
            uint64_t to = len + 1 + rnd(&seed) % 6;
            int rc = kvvm_seq_grow(t.kv, s[i].h, to);
            cr_assert(rc == 0 || rc == -ENOMEM, "grow: %d", rc);
            if (!rc) {
                s[i].len = to;
                sh_fill(&t, &s[i], len, to, lin++);
            }
        } else if (k == 2) {                                /* fork into a free place */
            int j = 0;
            while (j < 4 && live[j])
                j++;
            if (j < 4) {
                sh_fork(&t, &s[i], &s[j]);
                live[j] = true;
                kept[j] = kept[i];
            }
        } else if (k == 3 && len > kept[i]) {               /* write (copy-on-write) */
            uint64_t tok = kept[i] + rnd(&seed) % (len - kept[i]);
            sh_write(&t, &s[i], rnd(&seed) % NR, tok * BPT, BPT, lin++);
        } else if (k == 4 && len) {                         /* truncate */
            uint64_t to = rnd(&seed) % len;
            cr_assert_eq(kvvm_seq_truncate(t.kv, s[i].h, to), 0);
            for (uint32_t r = 0; r < NR; r++)
                memset(s[i].exp[r] + to * BPT, 0, (len - to) * BPT);
            s[i].len = to;
            if (kept[i] > to)
                kept[i] = to;
        } else if (k == 7 && len > kept[i]) {               /* discard (every region) */
            uint64_t fk = kept[i] + rnd(&seed) % (len - kept[i] + 1);
            cr_assert_eq(kvvm_seq_discard(t.kv, s[i].h, KVVM_ALL_REGIONS, fk), 0);
            kept[i] = fk;
        } else if (k == 5) {                                /* swap out and in */
            int rc = kvvm_seq_swap_out(t.kv, s[i].h);
            cr_assert(rc == 0 || rc == -ENOMEM, "swap_out: %d", rc);
            if (!rc) {
                int32_t x[1];
                cr_assert_eq(kvvm_seq_block_table(t.kv, s[i].h, 0, 0, x), -EAGAIN);
                rc = kvvm_seq_swap_in(t.kv, s[i].h);
                cr_assert_eq(rc, 0, "swap_in: %d", rc);
            }
        } else if (k == 6) {                                /* free */
            sh_free(&t, &s[i]);
            live[i] = false;
        } else {
            cr_assert_eq(rnd(&seed) % 2 ? kvvm_step(t.kv) : kvvm_sync(t.kv), 0);
        }
        for (int j = 0; j < 4; j++)
            if (live[j])
                verify_view_from(&t, &s[j], kept[j], "random op");
        if (op % 10 == 0)
            tcheck(&t, "random op");
    }
    for (int j = 0; j < 4; j++)
        if (live[j])
            sh_free(&t, &s[j]);
    tcheck(&t, "end");
    tclose(&t);
}

Test(random, ops_without_the_pool_thread)
{
    TH_DEADLINE(120);
    random_ops(false, 22);
}

Test(random, ops_with_the_pool_thread)
{
    TH_DEADLINE(120);
    random_ops(true, 23);
}

/* ---- the engine's hot path ---------------------------------------------------------- */

/* The driver calls counted on device ord since its counters' reset. */
static uint64_t calls_total(int ord)
{
    struct emu_calls k;
    uint64_t total = 0;
    cr_assert_eq(emu_calls_get(ord, &k), 0);
#define X(e) total += k.e;
    EMU_ENTRIES(X)
#undef X
    return total;
}

/* Driver calls of 3 grows onto a new block each (ready frames) and of grows inside the
   last block, on this thread, with or without the view; with it, *table_calls gets those of
   the block table naming the new blocks (their ids were mapped ahead: none). */
static uint64_t grow_calls(bool view, bool stream, uint64_t *in_place, uint64_t *table_calls)
{
    struct kvvm_config c;
    struct tctx t;
    void *st = NULL;
    vcfg(&c, view, false);
    if (stream)
        topen_stream(&t, &c, &st);
    else
        topen(&t, &c);
    struct sh s;
    sh_create(&t, &s);
    sh_grow(&t, &s, 1);
    int32_t ids[4];
    if (view)
        table(&t, s.h, 1, ids);                 /* the view in use */
    cr_assert_eq(kvvm_step(t.kv), 0);           /* ahead of need: frames (and groups) */
    struct kvvm_stats sb, sa;
    tstats(&t, &sb);
    emu_ctx_on(t.ord);
    cr_assert_eq(emu_calls_reset(t.ord), 0);
    for (uint64_t len = 2; len <= 4; len++)
        cr_assert_eq(kvvm_seq_grow(t.kv, s.h, len), 0);
    *in_place = calls_total(t.ord);
    cr_assert_eq(emu_calls_reset(t.ord), 0);
    for (uint64_t len = 5; len <= 13; len += TPB)   /* blocks 1, 2, 3 */
        cr_assert_eq(kvvm_seq_grow(t.kv, s.h, len), 0);
    uint64_t total = calls_total(t.ord);
    *table_calls = 0;
    if (view) {
        cr_assert_eq(emu_calls_reset(t.ord), 0);
        table(&t, s.h, 4, ids);
        *table_calls = calls_total(t.ord);
    }
    emu_ctx_off(t.ord);
    tstats(&t, &sa);
    cr_expect_eq(sa.frames_created_sync, sb.frames_created_sync,
                 "the grows created frames: not ready ones");
    tcheck(&t, "end");
    sh_free(&t, &s);
    if (stream)
        tclose_stream(&t, st);
    else
        tclose(&t);
    return total;
}

/* "a grow that takes a ready frame makes no more driver calls on the engine's thread with
   the view than without it" (and a grow inside the last block none, as ever). */
static void grow_calls_compare(bool stream)
{
    uint64_t in0, in1, t0, t1;
    uint64_t without = grow_calls(false, stream, &in0, &t0);
    uint64_t with = grow_calls(true, stream, &in1, &t1);
    printf("driver calls of 3 grows onto a new block (%s mode): %llu without the pool view, "
           "%llu with it; of 3 grows inside the last block: %llu, %llu; of the block table "
           "naming the new blocks: %llu\n", stream ? "stream" : "sync",
           (unsigned long long)without, (unsigned long long)with, (unsigned long long)in0,
           (unsigned long long)in1, (unsigned long long)t1);
    fflush(stdout);
    cr_expect_eq(with, without, "%s: %llu driver calls with the view, %llu without",
                 stream ? "stream" : "sync", (unsigned long long)with,
                 (unsigned long long)without);
    cr_expect_eq(in0, 0);
    cr_expect_eq(in1, 0);
    cr_expect_eq(t1, 0, "the block table mapped ids of fresh blocks on the engine's thread");
    cr_expect_gt(without, 0, "the grows onto new blocks made no driver call at all");
}

Test(hotpath, grow_makes_no_more_driver_calls_with_the_view_sync)
{
    TH_DEADLINE(60);
    grow_calls_compare(false);
}

Test(hotpath, grow_makes_no_more_driver_calls_with_the_view_stream)
{
    TH_DEADLINE(60);
    grow_calls_compare(true);
}

/* ---- ordering ----------------------------------------------------------------------- */

/* Device work may use an id under the protection rule of addresses: in stream mode an id
   a free let go stays mapped until the step fence after it completed. */
Test(order, a_let_go_id_stays_mapped_until_the_step_fence)
{
    TH_DEADLINE(60);
    struct kvvm_config c;
    struct tctx t;
    void *st = NULL;
    vcfg(&c, true, false);
    topen_stream(&t, &c, &st);
    struct sh s;
    sh_create(&t, &s);
    sh_grow_fill(&t, &s, 4, 1);
    int32_t id[1];
    table(&t, s.h, 1, id);
    uint64_t base;
    cr_assert_eq(kvvm_pool_base(t.kv, 0, &base), 0);
    uint64_t va = base + (uint64_t)id[0] * KB;
    cr_assert_eq(emu_stream_set_paused((kcu_stream)st, 1), 0);      /* the engine's work is still queued */
    cr_assert_eq(kvvm_seq_free(t.kv, s.h), 0);
    sh_release(&s);
    cr_assert_eq(kvvm_step(t.kv), 0);
    cr_assert_eq(kvvm_step(t.kv), 0);
    cr_expect_eq(emu_lookup(va, NULL, NULL, NULL), 0, "unmapped under the engine's work");
    cr_assert_eq(emu_stream_set_paused((kcu_stream)st, 0), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    cr_expect_eq(emu_lookup(va, NULL, NULL, NULL), -ENOENT, "still mapped after a sync");
    tcheck(&t, "end");
    tclose_stream(&t, st);
}

/* ---- fault sweeps --------------------------------------------------------------------- */

/* Every driver call of a block table that maps new ids (fresh blocks, a copy-on-write
   block), failed in turn: the call fails with nothing changed (the ids of blocks it had
   named are the same, the checker passes, the bytes are right), and the same call then
   succeeds. */
struct vsweep {
    struct tctx t;
    struct sh p, k;
    int32_t before[4];
};

static void vsweep_setup(void *arg)
{
    struct vsweep *w = arg;
    struct kvvm_config c;
    vcfg(&c, true, false);
    topen(&w->t, &c);
    sh_create(&w->t, &w->p);
    sh_grow_fill(&w->t, &w->p, 8, 1);          /* two full blocks */
    table(&w->t, w->p.h, 2, w->before);
    sh_fork(&w->t, &w->p, &w->k);
    sh_write(&w->t, &w->k, 0, 10, 20, 5);       /* block 0 copied: its id is stale */
    sh_grow_fill(&w->t, &w->k, 13, 6);          /* blocks 2, 3 new (prepared groups) */
}

static int vsweep_call(void *arg)
{
    struct vsweep *w = arg;
    int32_t ids[4];
    return kvvm_seq_block_table(w->t.kv, w->k.h, 0, 4, ids);
}

static enum th_sweep_outcome vsweep_after(void *arg, int rc, const char *where)
{
    struct vsweep *w = arg;
    int32_t ids[4], pids[2];
    if (rc)
        UCHK(rc != -EIO, "%s killed the context", where);
    tcheck(&w->t, where);
    cr_assert_eq(kvvm_seq_block_table(w->t.kv, w->p.h, 0, 2, pids), 0, "%s", where);
    UCHK(!memcmp(pids, w->before, sizeof pids), "%s: the parent's ids changed", where);
    int rc2 = kvvm_seq_block_table(w->t.kv, w->k.h, 0, 4, ids);
    UCHK(rc2 == 0, "%s: the retry failed: %d", where, rc2);
    UCHK(ids[0] != w->before[0], "%s: the child's copied block kept its id", where);
    UCHK(ids[1] == w->before[1], "%s: the shared block changed id", where);
    sh_verify(&w->t, &w->k, where);
    sh_verify(&w->t, &w->p, where);
    cr_assert_eq(kvvm_sync(w->t.kv), 0);
    tcheck(&w->t, where);
    return rc ? TH_SWEEP_FAILED : TH_SWEEP_ABSORBED;
}

static void vsweep_teardown(void *arg)
{
    struct vsweep *w = arg;
    sh_free(&w->t, &w->k);
    sh_free(&w->t, &w->p);
    tclose(&w->t);
}

Test(sweep, block_table_mappings)
{
    TH_DEADLINE(300);
    struct vsweep w;
    memset(&w, 0, sizeof w);
    const struct th_sweep sw = { "block table", &w, vsweep_setup, vsweep_call,
                                 vsweep_teardown, NULL, vsweep_after };
    th_sweep_run(&sw);
}

/* The step that prepares groups ahead (maps ready frames at free ids, without a pool
   thread), failed at each driver call: best effort, nothing left half done (the checker:
   every group whole, every id's mappings as recorded), and the block tables right. */
static void psweep_setup(void *arg)
{
    struct vsweep *w = arg;
    struct kvvm_config c;
    vcfg(&c, true, false);
    topen(&w->t, &c);
    sh_create(&w->t, &w->p);
    sh_grow_fill(&w->t, &w->p, 16, 1);          /* every prepared group taken */
    table(&w->t, w->p.h, 4, w->before);
}

static int psweep_call(void *arg)
{
    struct vsweep *w = arg;
    return kvvm_step(w->t.kv);
}

static enum th_sweep_outcome psweep_after(void *arg, int rc, const char *where)
{
    struct vsweep *w = arg;
    int32_t ids[4];
    tcheck(&w->t, where);
    cr_assert_eq(kvvm_seq_block_table(w->t.kv, w->p.h, 0, 4, ids), 0, "%s", where);
    UCHK(!memcmp(ids, w->before, sizeof ids), "%s: ids changed", where);
    sh_grow_fill(&w->t, &w->p, 21, 2);          /* a new block: a group, or mapped later */
    int32_t more[6];
    cr_assert_eq(kvvm_seq_block_table(w->t.kv, w->p.h, 0, 6, more), 0, "%s", where);
    sh_verify(&w->t, &w->p, where);
    tcheck(&w->t, where);
    return rc ? TH_SWEEP_FAILED : TH_SWEEP_ABSORBED;
}

static void psweep_teardown(void *arg)
{
    struct vsweep *w = arg;
    sh_free(&w->t, &w->p);
    tclose(&w->t);
}

Test(sweep, step_prepares_groups)
{
    TH_DEADLINE(300);
    struct vsweep w;
    memset(&w, 0, sizeof w);
    const struct th_sweep sw = { "prepare groups", &w, psweep_setup, psweep_call,
                                 psweep_teardown, NULL, psweep_after };
    th_sweep_run(&sw);
}

/* The release paths with ids to let go and reap (free, truncate, discard, swap-out, then
   sync), failed at each driver call: a failed call changes nothing, and at the end nothing
   is left mapped (th_close). */
static void rsweep_setup(void *arg)
{
    struct vsweep *w = arg;
    struct kvvm_config c;
    vcfg(&c, true, false);
    c.host_budget = 32 * KB;
    topen(&w->t, &c);
    sh_create(&w->t, &w->p);
    sh_grow_fill(&w->t, &w->p, 13, 1);
    sh_fork(&w->t, &w->p, &w->k);
    table(&w->t, w->p.h, 4, w->before);
    int32_t ids[4];
    table(&w->t, w->k.h, 4, ids);
}

static int rsweep_call(void *arg)
{
    struct vsweep *w = arg;
    int rc = kvvm_seq_discard(w->t.kv, w->p.h, 0, TPB);
    if (!rc)
        rc = kvvm_seq_truncate(w->t.kv, w->k.h, 6);
    if (!rc)
        rc = kvvm_seq_swap_out(w->t.kv, w->p.h);
    if (!rc)
        rc = kvvm_sync(w->t.kv);
    return rc;
}

static enum th_sweep_outcome rsweep_after(void *arg, int rc, const char *where)
{
    struct vsweep *w = arg;
    UCHK(rc != -EIO, "%s killed the context", where);
    tcheck(&w->t, where);
    return rc ? TH_SWEEP_FAILED : TH_SWEEP_ABSORBED;
}

static void rsweep_teardown(void *arg)
{
    struct vsweep *w = arg;
    cr_assert_eq(kvvm_sync(w->t.kv), 0);
    tcheck(&w->t, "teardown");
    sh_free(&w->t, &w->k);
    sh_free(&w->t, &w->p);
    tclose(&w->t);
}

Test(sweep, release_paths)
{
    TH_DEADLINE(300);
    struct vsweep w;
    memset(&w, 0, sizeof w);
    const struct th_sweep sw = { "release paths", &w, rsweep_setup, rsweep_call,
                                 rsweep_teardown, NULL, rsweep_after };
    th_sweep_run(&sw);
}

/* ---- regressions (issue 31) ----------------------------------------------------------- */

/* A context of 1 region, 1 KiB tokens, the view on, no pool thread, `pages` device pages
   of ps bytes on a device of that size, granule `gran`. */
static void rcfg(struct kvvm_config *c, size_t ps, size_t gran, uint64_t max_tokens,
                 uint64_t pages)
{
    tcfg(c, ps, 1, BPT, 4, max_tokens, pages);
    c->emu_granule = gran;
    c->pool_thread = 0;
    c->flags |= KVVM_F_POOL_VIEW;
}

/* The driver holds exactly the handles the context counts as held (no released handle
   kept alive by a pool view mapping). */
static void expect_driver_holds_what_is_held(struct tctx *t, const char *where)
{
    struct emu_counters e;
    struct kvvm_stats st;
    cr_assert_eq(emu_counters_get(t->ord, &e), 0);
    tstats(t, &st);
    cr_expect_eq(e.handle_bytes, st.device_bytes_held,
                 "%s: the driver holds %llu bytes of handles, the context counts %llu held",
                 where, (unsigned long long)e.handle_bytes,
                 (unsigned long long)st.device_bytes_held);
}

/* Issue 31, defect 2: page_size 16 KiB over a 4 KiB granule; a trim released the frames a
   dead pool view id still mapped, and the emulator freed such a handle at the first
   granule of its mapping's unmap and touched it at the next: SIGSEGV in kvvm_sync. */
Test(regress, view_page_above_granule_trim_segv)
{
    TH_DEADLINE(60);
    struct kvvm_config c;
    struct tctx t;
    rcfg(&c, 4 * KB, KB, 64, 8);
    topen(&t, &c);
    kvvm_seq s;
    int32_t ids[3];
    cr_assert_eq(kvvm_seq_create(t.kv, &s), 0);
    cr_assert_eq(kvvm_seq_grow(t.kv, s, 32), 0);            /* 2 blocks of 16 tokens */
    cr_assert_eq(kvvm_seq_block_table(t.kv, s, 0, 2, ids), 0, "%s", kvvm_last_error());
    cr_assert_eq(kvvm_seq_free(t.kv, s), 0);
    cr_assert_eq(kvvm_trim(t.kv, 0), 0);
    expect_driver_holds_what_is_held(&t, "after the trim");
    cr_assert_eq(kvvm_step(t.kv), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    tcheck(&t, "after the sync");
    expect_driver_holds_what_is_held(&t, "after the sync");
    struct sh u;                                /* and the view works on */
    sh_create(&t, &u);
    sh_grow_fill(&t, &u, 40, 1);
    cr_assert_eq(kvvm_seq_block_table(t.kv, u.h, 0, 3, ids), 0, "%s", kvvm_last_error());
    sh_verify(&t, &u, "after the trim");
    tcheck(&t, "end");
    sh_free(&t, &u);
    tclose(&t);
}

/* Issue 31, defect 3, set up: budget = device = 8 pages of 4 KiB, no host tier, sync mode;
   s of 6 pages named by a block table, c CACHED of 2 pages; s freed, a step, a trim. The
   trim counted as returned the 6 frames s's dead ids still mapped (the driver kept them):
   then kvvm_seq_need said a grow of t fit and the grow failed -ENOMEM. */
static void dead_id_trim_setup(struct tctx *t, kvvm_seq *cached, kvvm_seq *fresh)
{
    struct kvvm_config c;
    rcfg(&c, KB, KB, 32, 8);
    topen(t, &c);
    kvvm_seq s;
    int32_t ids[6];
    cr_assert_eq(kvvm_seq_create(t->kv, &s), 0);
    cr_assert_eq(kvvm_seq_grow(t->kv, s, 24), 0);
    cr_assert_eq(kvvm_seq_block_table(t->kv, s, 0, 6, ids), 0, "%s", kvvm_last_error());
    cr_assert_eq(kvvm_seq_create(t->kv, cached), 0);
    cr_assert_eq(kvvm_seq_grow(t->kv, *cached, 8), 0);
    cr_assert_eq(kvvm_seq_set_class(t->kv, *cached, KVVM_SEQ_CACHED), 0);
    cr_assert_eq(kvvm_seq_free(t->kv, s), 0);
    cr_assert_eq(kvvm_step(t->kv), 0);
    cr_assert_eq(kvvm_trim(t->kv, 0), 0);
    expect_driver_holds_what_is_held(t, "after the trim");
    cr_assert_eq(kvvm_seq_create(t->kv, fresh), 0);
}

Test(regress, view_trim_counted_frames_a_dead_id_maps_need_fits_grow_enomem)
{
    TH_DEADLINE(60);
    struct tctx t;
    kvvm_seq c, u;
    dead_id_trim_setup(&t, &c, &u);
    uint64_t pages = 0;
    int fits = 0;
    cr_assert_eq(kvvm_seq_need(t.kv, u, 24, &pages, &fits), 0);
    cr_expect_eq(pages, 6);
    int rc = kvvm_seq_grow(t.kv, u, 24);
    cr_expect(!fits || rc == 0, "kvvm_seq_need said fits, then the grow failed %d (%s)", rc,
              kvvm_last_error());
    cr_expect_eq(rc, 0, "grow of 6 pages beside a CACHED 2 of 8: %d (%s)", rc,
                 kvvm_last_error());
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_expect_eq(st.create_oom, 0, "%llu cuMemCreate out-of-memory failures",
                 (unsigned long long)st.create_oom);
    struct kvvm_seq_info in;
    tinfo(&t, c, &in);
    cr_expect_eq(in.dropped, 0, "the CACHED sequence was dropped for room that was there");
    tcheck(&t, "end");
    expect_driver_holds_what_is_held(&t, "end");
    cr_assert_eq(kvvm_seq_free(t.kv, u), 0);
    cr_assert_eq(kvvm_seq_free(t.kv, c), 0);
    tclose(&t);
}

Test(regress, view_trim_counted_frames_a_dead_id_maps_grow_drops_cached_then_enomem)
{
    TH_DEADLINE(60);
    struct tctx t;
    kvvm_seq c, u;
    dead_id_trim_setup(&t, &c, &u);
    int rc = kvvm_seq_grow(t.kv, u, 32);                     /* the whole device */
    cr_expect_eq(rc, 0, "grow of 8 pages, a CACHED sequence to drop: %d (%s)", rc,
                 kvvm_last_error());
    struct kvvm_seq_info in;
    tinfo(&t, c, &in);
    cr_expect_eq(in.dropped, 1, "the CACHED sequence was not dropped");
    tcheck(&t, "end");
    expect_driver_holds_what_is_held(&t, "end");
    cr_assert_eq(kvvm_seq_free(t.kv, u), 0);
    cr_assert_eq(kvvm_seq_free(t.kv, c), 0);
    tclose(&t);
}

/* Issue 31, defect 3, a budget shrink: it released the frames dead ids still mapped, the
   memory stayed with the driver, and growing the budget back failed for lack of it. */
Test(regress, view_budget_shrink_counted_frames_a_dead_id_maps)
{
    TH_DEADLINE(60);
    struct kvvm_config c;
    struct tctx t;
    rcfg(&c, KB, KB, 32, 8);
    topen(&t, &c);
    kvvm_seq s;
    int32_t ids[6];
    cr_assert_eq(kvvm_seq_create(t.kv, &s), 0);
    cr_assert_eq(kvvm_seq_grow(t.kv, s, 24), 0);
    cr_assert_eq(kvvm_seq_block_table(t.kv, s, 0, 6, ids), 0, "%s", kvvm_last_error());
    cr_assert_eq(kvvm_seq_free(t.kv, s), 0);
    cr_assert_eq(kvvm_step(t.kv), 0);
    int rc = kvvm_set_budget(t.kv, 2 * KB);
    cr_assert_eq(rc, 0, "shrink: %d (%s)", rc, kvvm_last_error());
    expect_driver_holds_what_is_held(&t, "after the shrink");
    rc = kvvm_set_budget(t.kv, 8 * KB);
    cr_expect_eq(rc, 0, "growing the budget back: %d (%s)", rc, kvvm_last_error());
    struct sh u;
    sh_create(&t, &u);
    rc = kvvm_seq_grow(t.kv, u.h, 32);
    cr_expect_eq(rc, 0, "grow of the whole device: %d (%s)", rc, kvvm_last_error());
    tcheck(&t, "end");
    expect_driver_holds_what_is_held(&t, "end");
    sh_free(&t, &u);
    tclose(&t);
}

/* A block copied on write keeps its id until its holder's next block table: after a fork,
   the child's write copied block 0 and the id both still named mapped the parent's frame;
   the parent's free gave that frame back to the pool, mapped by the child's stale id, which
   no reap unmaps (the id is live). kvvm_set_budget could not release it and returned -EIO,
   a dead context, for a live one (test_model page8k_2regions_view, seed 109). */
Test(regress, view_budget_shrink_eio_a_stale_live_id_maps_a_freed_frame)
{
    TH_DEADLINE(60);
    struct kvvm_config c;
    struct tctx t;
    rcfg(&c, KB, KB, 32, 8);
    topen(&t, &c);
    struct sh p, k;
    int32_t ids[2];
    sh_create(&t, &p);
    sh_grow_fill(&t, &p, 2 * TPB, 1);
    table(&t, p.h, 2, ids);
    sh_fork(&t, &p, &k);
    sh_write(&t, &k, 0, 0, BPT, 9);         /* the child's block 0 is copied */
    sh_free(&t, &p);                        /* the parent's block 0 frame: unused */
    cr_assert_eq(kvvm_step(t.kv), 0);
    int rc = kvvm_set_budget(t.kv, 2 * KB);
    cr_assert_eq(rc, 0, "shrink to the 2 pages in use: %d (%s)", rc, kvvm_last_error());
    expect_driver_holds_what_is_held(&t, "after the shrink");
    table(&t, k.h, 2, ids);                 /* block 0: a new id, mapping its copy */
    sh_verify(&t, &k, "the child");
    tcheck(&t, "end");
    expect_driver_holds_what_is_held(&t, "end");
    sh_free(&t, &k);
    tclose(&t);
}

/* Issue 31, defect 5: with page_size not a multiple of bytes_per_token a block's tokens
   do not fill its page, so block b of the window does not start at its page: the pool view
   served other tokens' bytes. kvvm_open refuses it, naming both numbers. */
Test(regress, view_page_not_a_multiple_of_bytes_per_token_served_wrong_bytes)
{
    TH_DEADLINE(60);
    struct kvvm_config c;
    kvvm *kv = NULL;
    tcfg(&c, 16 * KB, 2, 300, 4, 1000, 16);     /* 64 KiB pages: 218 tokens and 136 bytes */
    c.emu_granule = 16 * KB;
    c.flags |= KVVM_F_POOL_VIEW;
    int rc = kvvm_open(&c, &kv);
    if (!rc)
        kvvm_close(kv);
    cr_assert_eq(rc, -EINVAL, "kvvm_open: %d", rc);
    const char *e = kvvm_last_error();
    cr_expect(strstr(e, "65536") && strstr(e, "300") && strstr(e, "KVVM_F_POOL_VIEW"),
              "the refusal does not name page_size, bytes_per_token and the view: %s", e);
    c.flags &= ~KVVM_F_POOL_VIEW;               /* without the view: opens */
    cr_assert_eq(kvvm_open(&c, &kv), 0);
    kvvm_close(kv);
}

/* Issue 31, defect 5: kvvm_prefix_publish refused such a layout -EOPNOTSUPP with no word
   of why (kvvm_prefix_attach named it). */
Test(regress, publish_eopnotsupp_did_not_say_why)
{
    TH_DEADLINE(60);
    struct kvvm_config c;
    struct tctx t;
    tcfg(&c, 16 * KB, 1, 300, 4, 1000, 16);
    c.emu_granule = 16 * KB;
    topen(&t, &c);
    kvvm_seq s;
    cr_assert_eq(kvvm_seq_create(t.kv, &s), 0);
    cr_assert_eq(kvvm_seq_grow(t.kv, s, 500), 0);
    kvvm_key k[2];
    memset(k, 0x5a, sizeof k);
    k[1].bytes[0] = 1;
    int rc = kvvm_prefix_publish(t.kv, s, 0, k, 2);
    cr_assert_eq(rc, -EOPNOTSUPP, "kvvm_prefix_publish: %d", rc);
    const char *e = kvvm_last_error();
    cr_expect(strstr(e, "kvvm_prefix_publish") && strstr(e, "65536") && strstr(e, "300"),
              "the refusal does not say why: %s", e);
    cr_assert_eq(kvvm_seq_free(t.kv, s), 0);
    tclose(&t);
}
