/*
 * tests/test_prefix.c: the prefix cache keyed by content (docs/api.md "Prefix cache"):
 * blocks, the key scheme, publish / lookup / attach / drop, namespaces, dedup, entries that
 * outlive their publisher, drop keeping sharers' pages, reclaim (leaves first, least
 * recently used first, before any LIVE sequence), entries below the host tier (spilled to
 * disk least recently used and leaves first, lookup saying so, attach bringing them back),
 * host and disk entries brought back all or nothing (driver-call and I/O fault sweeps), and
 * the stats. Every test runs the invariant checker (which counts the
 * entries' page references) and closes the context checking nothing is left behind.
 */
#include "disk/disk.h"
#include "harness.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#define BPT 256u                 /* bytes per token: 16 tokens per 4 KiB block */
#define T   16u

static void cfg_small(struct kvvm_config *c, uint32_t nr, uint64_t dev, uint64_t host,
                      unsigned flags)
{
    th_config(c, KB, nr, BPT, 16, 64 * T, dev, host, flags);
    c->pool_thread = 0;
}

/* Opens t (cfg_small) with a 60 s hang guard. */
static void open_t(struct tctx *t, uint32_t nr, uint64_t dev, uint64_t host, unsigned flags)
{
    struct kvvm_config c;
    TH_DEADLINE(60);
    cfg_small(&c, nr, dev, host, flags);
    topen(t, &c);
}

static uint8_t pat(uint32_t lin, uint32_t r, uint64_t off)
{
    return (uint8_t)(lin * 131u + r * 17u + off * 7u + (off >> 8) + 1u);
}

/* Grows s to n tokens and writes lineage lin's bytes over all of them. */
static void fill(struct tctx *t, kvvm_seq s, uint64_t n, uint32_t lin)
{
    cr_assert_eq(kvvm_seq_grow(t->kv, s, n), 0, "grow: %s", kvvm_last_error());
    size_t len = (size_t)(n * BPT);
    uint8_t *b = malloc(len);
    for (uint32_t r = 0; r < t->cfg.n_regions; r++) {
        for (size_t i = 0; i < len; i++)
            b[i] = pat(lin, r, i);
        cr_assert_eq(kvvm_seq_write(t->kv, s, r, 0, b, len), 0);
    }
    free(b);
}

/* s's first n tokens hold lineage lin's bytes in every region. */
static bool same(struct tctx *t, kvvm_seq s, uint64_t n, uint32_t lin)
{
    size_t len = (size_t)(n * BPT);
    uint8_t *b = malloc(len);
    bool ok = true;
    for (uint32_t r = 0; ok && r < t->cfg.n_regions; r++) {
        cr_assert_eq(kvvm_seq_read(t->kv, s, r, 0, b, len), 0, "read: %s", kvvm_last_error());
        for (size_t i = 0; ok && i < len; i++)
            ok = b[i] == pat(lin, r, i);
    }
    free(b);
    return ok;
}

/* Keys of n blocks of a prompt of lineage lin (tokens lin * 1000 + i). */
static void keys_of(uint32_t lin, size_t n, kvvm_key *k)
{
    int32_t tok[64 * T];
    for (size_t i = 0; i < n * T; i++)
        tok[i] = (int32_t)(lin * 1000 + i);
    cr_assert_eq(kvvm_prefix_keys(tok, n * T, T, NULL, 0, k, n), n);
}

static kvvm_seq mk(struct tctx *t)
{
    kvvm_seq s;
    cr_assert_eq(kvvm_seq_create(t->kv, &s), 0);
    return s;
}

/* A sequence of lineage lin, nb full blocks (+ extra tokens), published under ns. */
static kvvm_seq published(struct tctx *t, uint64_t ns, uint32_t lin, size_t nb, uint64_t extra,
                          kvvm_key *k)
{
    kvvm_seq s = mk(t);
    fill(t, s, nb * T + extra, lin);
    keys_of(lin, nb, k);
    cr_assert_eq(kvvm_prefix_publish(t->kv, s, ns, k, nb), (int)nb, "publish: %s",
                 kvvm_last_error());
    return s;
}

/* Entries of lineage lin that no sequence holds (their publisher freed). */
static void entries_only(struct tctx *t, uint64_t ns, uint32_t lin, size_t nb, kvvm_key *k)
{
    kvvm_seq s = published(t, ns, lin, nb, 0, k);
    cr_assert_eq(kvvm_seq_free(t->kv, s), 0);
}

static uint64_t seq_len(struct tctx *t, kvvm_seq s)
{
    struct kvvm_seq_info in;
    tinfo(t, s, &in);
    return in.length;
}

/* ---------------------------------------------------------------- blocks and keys */

Test(keys, block_tokens_is_page_over_bytes_per_token)
{
    struct tctx t;
    open_t(&t, 2, 16, 0, 0);
    uint32_t bt = 0;
    cr_assert_eq(kvvm_block_tokens(t.kv, &bt), 0);
    cr_assert_eq(bt, T);
    cr_assert_eq(kvvm_block_tokens(t.kv, NULL), -EINVAL);
    cr_assert_eq(kvvm_block_tokens(NULL, &bt), -EINVAL);
    tclose(&t);
}

Test(keys, chained_xxh3_128_as_documented)
{
    TH_DEADLINE(60);
    int32_t tok[3 * T + 5];
    for (size_t i = 0; i < sizeof tok / sizeof *tok; i++)
        tok[i] = (int32_t)(i * 7919u + 3);
    const char salt[] = "model-a";
    kvvm_key k[4];
    memset(k, 0xEE, sizeof k);
    /* full blocks only */
    cr_assert_eq(kvvm_prefix_keys(tok, 3 * T + 5, T, salt, 7, k, 4), 3);
    cr_assert(k[3].bytes[0] == 0xEE, "a key past the full blocks was written");
    /* the definition, computed here: key i = XXH3-128(key i-1 || tokens LE int32 || salt),
       key -1 empty, canonical big-endian digest, then 16 zero bytes */
    uint8_t buf[32 + T * 4 + 7];
    for (size_t i = 0; i < 3; i++) {
        size_t n = 0;
        if (i) {
            memcpy(buf, k[i - 1].bytes, 32);
            n = 32;
        }
        memcpy(buf + n, tok + i * T, T * 4);        /* a little-endian host */
        memcpy(buf + n + T * 4, salt, 7);
        XXH128_canonical_t cn;
        XXH128_canonicalFromHash(&cn, XXH3_128bits(buf, n + T * 4 + 7));
        cr_assert_arr_eq(k[i].bytes, cn.digest, 16, "key %zu differs from its definition", i);
        for (int b = 16; b < 32; b++)
            cr_assert_eq(k[i].bytes[b], 0, "key %zu: byte %d is not zero", i, b);
    }
    /* cap, chaining, salt */
    kvvm_key a[3], b[3];
    cr_assert_eq(kvvm_prefix_keys(tok, 3 * T, T, salt, 7, a, 2), 2);
    cr_assert_arr_eq(a, k, 2 * sizeof *a);
    cr_assert_eq(kvvm_prefix_keys(tok, 3 * T, T, "model-b", 7, b, 3), 3);
    cr_assert(memcmp(b[0].bytes, k[0].bytes, 16), "the salt changes the keys");
    tok[0]++;                            /* block 0 changes: every later key changes */
    cr_assert_eq(kvvm_prefix_keys(tok, 3 * T, T, salt, 7, b, 3), 3);
    for (int i = 0; i < 3; i++)
        cr_assert(memcmp(b[i].bytes, k[i].bytes, 16), "key %d does not chain", i);
    cr_assert_eq(kvvm_prefix_keys(NULL, 3 * T, T, NULL, 0, b, 3), 0);
    cr_assert_eq(kvvm_prefix_keys(tok, 3 * T, 0, NULL, 0, b, 3), 0);
    cr_assert_eq(kvvm_prefix_keys(tok, 3 * T, T, NULL, 0, NULL, 3), 0);
    cr_assert_eq(kvvm_prefix_keys(tok, T - 1, T, NULL, 0, b, 3), 0);
}

/* ---------------------------------------------------------------- publish, lookup, attach */

Test(prefix, publish_lookup_attach_shares_pages_without_copy)
{
    struct tctx t;
    kvvm_key k[4];
    open_t(&t, 2, 32, 0, 0);
    kvvm_seq a = published(&t, 7, 1, 3, 8, k);      /* 3.5 blocks: 3 published */
    uint8_t where[4] = { 0 };
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 7, k, 3, where), 3);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(where[i], KVVM_TIER_DEVICE);
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 7, k, 3, NULL), 3, "where may be NULL");
    struct kvvm_stats s0, s1;
    tstats(&t, &s0);
    kvvm_seq b = mk(&t);
    cr_assert_eq(kvvm_prefix_attach(t.kv, b, 7, k, 3), 3, "attach: %s", kvvm_last_error());
    tstats(&t, &s1);
    cr_assert_eq(seq_len(&t, b), 3 * T);
    cr_assert_eq(s1.pages_device_free, s0.pages_device_free, "attach took a page");
    cr_assert_eq(s1.cow_copies, s0.cow_copies);
    struct kvvm_seq_info in;
    tinfo(&t, b, &in);
    cr_assert(in.resident);
    cr_assert_eq(in.pages_shared, 6);
    cr_assert(same(&t, b, 3 * T, 1), "attached bytes differ");
    /* b writes block 0: copied on write, a and the entry keep theirs */
    uint8_t x[BPT];
    memset(x, 0x5A, sizeof x);
    cr_assert_eq(kvvm_seq_write(t.kv, b, 0, 0, x, sizeof x), 0);
    cr_assert(same(&t, a, 3 * T + 8, 1), "a sharer's write reached the publisher");
    kvvm_seq d = mk(&t);
    cr_assert_eq(kvvm_prefix_attach(t.kv, d, 7, k, 3), 3);
    cr_assert(same(&t, d, 3 * T, 1), "a sharer's write reached the entry");
    /* a's own write after publish: copied on write too */
    cr_assert_eq(kvvm_seq_write(t.kv, a, 1, 0, x, sizeof x), 0);
    cr_assert(same(&t, d, 3 * T, 1), "the publisher's write reached the entry");
    tcheck(&t, "attach");
    tclose(&t);
}

Test(prefix, attach_longest_present_prefix_and_miss)
{
    struct tctx t;
    kvvm_key k[4], q[4];
    open_t(&t, 1, 32, 0, 0);
    published(&t, 1, 2, 2, 0, k);
    keys_of(2, 4, q);                   /* the same prompt, 4 blocks: 2 are cached */
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, q, 4, NULL), 2);
    kvvm_seq b = mk(&t);
    cr_assert_eq(kvvm_prefix_attach(t.kv, b, 1, q, 4), 2);
    cr_assert_eq(seq_len(&t, b), 2 * T);
    cr_assert(same(&t, b, 2 * T, 2));
    /* a miss: 0, not an error, dst still empty and usable */
    kvvm_key m[2];
    keys_of(9, 2, m);
    kvvm_seq e = mk(&t);
    cr_assert_eq(kvvm_prefix_attach(t.kv, e, 1, m, 2), 0);
    cr_assert_eq(seq_len(&t, e), 0);
    cr_assert_eq(kvvm_prefix_attach(t.kv, e, 1, q, 0), 0);
    cr_assert_eq(kvvm_seq_grow(t.kv, e, 5), 0);
    /* a gap: a present key after a missing one does not count */
    kvvm_key g[3] = { q[0], m[0], q[1] };
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, g, 3, NULL), 1);
    tcheck(&t, "miss");
    tclose(&t);
}

Test(prefix, errors)
{
    struct tctx t;
    kvvm_key k[4];
    open_t(&t, 2, 32, 0, 0);
    kvvm_seq a = published(&t, 1, 1, 2, 3, k);
    keys_of(1, 4, k);
    kvvm_seq b = mk(&t);
    /* publish */
    cr_assert_eq(kvvm_prefix_publish(t.kv, a, 1, NULL, 1), -EINVAL);
    cr_assert_eq(kvvm_prefix_publish(t.kv, a, 1, k, 3), -EINVAL, "past the full blocks");
    cr_assert_eq(kvvm_prefix_publish(t.kv, a + (1ull << 32), 1, k, 1), -ENOENT);
    cr_assert_eq(kvvm_prefix_publish(t.kv, a, 1, NULL, 0), 0);
    cr_assert_eq(kvvm_prefix_publish(t.kv, b, 1, k, 0), 0);
    cr_assert_eq(kvvm_prefix_publish(NULL, a, 1, k, 1), -EINVAL);
    /* a block discarded in one region */
    kvvm_seq w = mk(&t);
    fill(&t, w, 3 * T, 3);
    cr_assert_eq(kvvm_seq_discard(t.kv, w, 1, T), 0);
    kvvm_key kw[3];
    keys_of(3, 3, kw);
    cr_assert_eq(kvvm_prefix_publish(t.kv, w, 1, kw, 2), -EINVAL, "a discarded block");
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, kw, 1, NULL), 0, "a refused publish entered");
    /* lookup, drop */
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, NULL, 1, NULL), -EINVAL);
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, NULL, 0, NULL), 0);
    cr_assert_eq(kvvm_prefix_drop(t.kv, 1, NULL, 2), -EINVAL);
    /* attach */
    cr_assert_eq(kvvm_prefix_attach(t.kv, a, 1, k, 2), -EINVAL, "dst not empty");
    cr_assert_eq(kvvm_prefix_attach(t.kv, b, 1, NULL, 2), -EINVAL);
    cr_assert_eq(kvvm_prefix_attach(t.kv, b + (1ull << 32), 1, k, 2), -ENOENT);
    kvvm_seq f = mk(&t);
    cr_assert_eq(kvvm_seq_free(t.kv, f), 0);
    cr_assert_eq(kvvm_prefix_attach(t.kv, f, 1, k, 2), -ENOENT, "a freed handle");
    cr_assert_eq(seq_len(&t, b), 0);
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, k, 4, NULL), 2, "errors changed the index");
    tcheck(&t, "errors");
    tclose(&t);
}

Test(prefix, a_present_key_keeps_its_entry)
{
    struct tctx t;
    kvvm_key k[3];
    open_t(&t, 2, 32, 0, 0);
    published(&t, 1, 1, 2, 0, k);
    /* another sequence, other bytes, the same keys (+ one more): one new entry only */
    kvvm_seq o = mk(&t);
    fill(&t, o, 3 * T, 5);
    keys_of(1, 3, k);
    cr_assert_eq(kvvm_prefix_publish(t.kv, o, 1, k, 3), 1);
    cr_assert_eq(kvvm_prefix_publish(t.kv, o, 1, k, 3), 0, "publish again: nothing new");
    /* keys naming the same block twice in one call: one entry */
    kvvm_key twice[2] = { k[0], k[0] };
    cr_assert_eq(kvvm_prefix_publish(t.kv, o, 2, twice, 2), 1);
    kvvm_seq b = mk(&t);
    cr_assert_eq(kvvm_prefix_attach(t.kv, b, 1, k, 2), 2);
    cr_assert(same(&t, b, 2 * T, 1), "the first publisher's entry was replaced");
    cr_assert(same(&t, o, 3 * T, 5), "the second publisher lost its pages");
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_assert_eq(st.prefix_entries, 4);
    tcheck(&t, "dedup");
    tclose(&t);
}

Test(prefix, namespaces_isolate_entries)
{
    struct tctx t;
    kvvm_key k[2];
    open_t(&t, 1, 32, 0, 0);
    kvvm_seq a = published(&t, 100, 1, 2, 0, k);
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 101, k, 2, NULL), 0, "seen in another namespace");
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 0, k, 2, NULL), 0);
    kvvm_seq b = mk(&t);
    cr_assert_eq(kvvm_prefix_attach(t.kv, b, 101, k, 2), 0);
    /* the same keys under another namespace: entries of their own */
    kvvm_seq o = mk(&t);
    fill(&t, o, 2 * T, 4);
    cr_assert_eq(kvvm_prefix_publish(t.kv, o, 101, k, 2), 2);
    cr_assert_eq(kvvm_prefix_attach(t.kv, b, 101, k, 2), 2);
    cr_assert(same(&t, b, 2 * T, 4));
    /* dropping one namespace leaves the other */
    cr_assert_eq(kvvm_prefix_drop(t.kv, 100, NULL, 0), 2);
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 100, k, 2, NULL), 0);
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 101, k, 2, NULL), 2);
    cr_assert(same(&t, a, 2 * T, 1));
    tcheck(&t, "namespaces");
    tclose(&t);
}

Test(prefix, entries_outlive_their_publisher)
{
    struct tctx t;
    kvvm_key k[3];
    open_t(&t, 2, 32, 0, 0);
    kvvm_seq a = published(&t, 1, 6, 3, 0, k);
    struct kvvm_stats s0, s1;
    tstats(&t, &s0);
    cr_assert_eq(kvvm_seq_free(t.kv, a), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    tstats(&t, &s1);
    cr_assert_eq(s1.pages_device_free, s0.pages_device_free, "the entries' pages were freed");
    uint8_t where[3];
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, k, 3, where), 3);
    cr_assert_eq(where[2], KVVM_TIER_DEVICE);
    kvvm_seq b = mk(&t);
    cr_assert_eq(kvvm_prefix_attach(t.kv, b, 1, k, 3), 3);
    cr_assert(same(&t, b, 3 * T, 6), "bytes changed after the publisher was freed");
    /* truncating the attached sequence leaves the entries whole */
    cr_assert_eq(kvvm_seq_truncate(t.kv, b, 0), 0);
    kvvm_seq d = mk(&t);
    cr_assert_eq(kvvm_prefix_attach(t.kv, d, 1, k, 3), 3);
    cr_assert(same(&t, d, 3 * T, 6));
    tcheck(&t, "outlive");
    tclose(&t);                          /* nothing left behind with entries alive */
}

Test(prefix, drop_keeps_sharers_pages)
{
    struct tctx t;
    kvvm_key k[3];
    open_t(&t, 2, 32, 0, 0);
    kvvm_seq a = published(&t, 1, 7, 3, 0, k);
    kvvm_seq b = mk(&t);
    cr_assert_eq(kvvm_prefix_attach(t.kv, b, 1, k, 3), 3);
    cr_assert_eq(kvvm_prefix_drop(t.kv, 1, k + 1, 1), 1, "drop one entry");
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, k, 3, NULL), 1, "the chain ends at the gap");
    cr_assert_eq(kvvm_prefix_drop(t.kv, 1, k, 3), 2, "the entries left");
    cr_assert_eq(kvvm_prefix_drop(t.kv, 1, k, 3), 0, "none left");
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, k, 3, NULL), 0);
    cr_assert(same(&t, a, 3 * T, 7));
    cr_assert(same(&t, b, 3 * T, 7));
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_assert_eq(st.prefix_entries, 0);
    cr_assert_eq(st.prefix_evictions, 0, "an explicit drop is no eviction");
    /* the pages are the sequences' own again: freeing them frees every page */
    cr_assert_eq(kvvm_seq_free(t.kv, a), 0);
    cr_assert_eq(kvvm_seq_free(t.kv, b), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    tstats(&t, &st);
    cr_assert_eq(st.pages_device_free, st.pages_device_total);
    tcheck(&t, "drop");
    tclose(&t);
}

Test(prefix, stats_count_lookups_hits_entries)
{
    struct tctx t;
    kvvm_key k[3];
    open_t(&t, 1, 32, 0, 0);
    published(&t, 1, 1, 3, 0, k);
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_assert_eq(st.prefix_entries, 3);
    cr_assert_eq(st.prefix_lookups, 0);
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, k, 3, NULL), 3);
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 2, k, 3, NULL), 0);
    kvvm_seq b = mk(&t);
    cr_assert_eq(kvvm_prefix_attach(t.kv, b, 1, k, 2), 2);
    tstats(&t, &st);
    cr_assert_eq(st.prefix_lookups, 3);
    cr_assert_eq(st.prefix_hit_blocks, 5);
    cr_assert_eq(st.prefix_evictions, 0);
    char js[8192];
    cr_assert_eq(kvvm_stats_json(t.kv, js, sizeof js), 0);
    cr_assert(strstr(js, "\"prefix_hit_blocks\":5") || strstr(js, "\"prefix_hit_blocks\": 5"),
              "json: %s", js);
    tclose(&t);
}

/* ---------------------------------------------------------------- reclaim */

/* Device of 8 pages, one region: entries of chains x (older) and y (newer), their
   publishers freed; a grow that needs 2 frames more than are free. */
Test(reclaim, leaves_first_least_recently_used_first)
{
    struct tctx t;
    kvvm_key x[3], y[3];
    open_t(&t, 1, 8, 0, 0);
    kvvm_seq a = published(&t, 1, 1, 3, 0, x);
    kvvm_seq b = published(&t, 1, 2, 3, 0, y);
    cr_assert_eq(kvvm_seq_free(t.kv, a), 0);
    cr_assert_eq(kvvm_seq_free(t.kv, b), 0);
    /* x looked up after y: y is now the least recently used chain */
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, y, 3, NULL), 3);
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, x, 3, NULL), 3);
    kvvm_seq g = mk(&t);
    cr_assert_eq(kvvm_seq_grow(t.kv, g, 4 * T), 0, "grow: %s", kvvm_last_error());
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_assert_eq(st.prefix_evictions, 2);
    cr_assert_eq(st.prefix_entries, 4);
    /* y lost its two last blocks (leaves first), x nothing (these lookups leave x the most
       recently used again) */
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, y, 3, NULL), 1);
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, x, 3, NULL), 3);
    /* 3 more frames: y's head, then x from its leaf */
    kvvm_seq h = mk(&t);
    cr_assert_eq(kvvm_seq_grow(t.kv, h, 3 * T), 0);
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, y, 3, NULL), 0);
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, x, 3, NULL), 1);
    tstats(&t, &st);
    cr_assert_eq(st.prefix_evictions, 5);
    tcheck(&t, "reclaim");
    tclose(&t);
}

Test(reclaim, entries_go_before_any_live_sequence_is_swapped)
{
    struct tctx t;
    kvvm_key k[3];
    open_t(&t, 1, 8, 16, KVVM_F_AUTO_SWAP);
    entries_only(&t, 1, 1, 3, k);
    kvvm_seq live = mk(&t);
    fill(&t, live, 3 * T, 2);
    cr_assert_eq(kvvm_step(t.kv), 0);    /* live unprotected: a swap victim */
    cr_assert_eq(kvvm_step(t.kv), 0);
    kvvm_seq g = mk(&t);
    cr_assert_eq(kvvm_seq_grow(t.kv, g, 4 * T), 0, "grow: %s", kvvm_last_error());
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_assert_eq(st.swap_outs, 0, "a LIVE sequence was swapped while entries could go");
    cr_assert_eq(st.prefix_evictions, 2);
    struct kvvm_seq_info in;
    tinfo(&t, live, &in);
    cr_assert(in.resident);
    tcheck(&t, "before live");
    tclose(&t);
}

Test(reclaim, entries_a_sequence_holds_are_not_reclaimed)
{
    struct tctx t;
    kvvm_key k[3];
    open_t(&t, 1, 6, 0, 0);
    kvvm_seq a = published(&t, 1, 1, 3, 0, k);
    (void)a;                             /* the publisher holds them */
    kvvm_seq g = mk(&t);
    cr_assert_eq(kvvm_seq_grow(t.kv, g, 4 * T), -ENOMEM);
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, k, 3, NULL), 3);
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_assert_eq(st.prefix_evictions, 0);
    /* a failed call drops nothing: free the publisher, still not enough (3 + 3 < 7) */
    cr_assert_eq(kvvm_seq_free(t.kv, a), 0);
    cr_assert_eq(kvvm_seq_grow(t.kv, g, 7 * T), -ENOMEM);
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, k, 3, NULL), 3, "a failed call dropped entries");
    tcheck(&t, "held");
    tclose(&t);
}

/* KVVM_F_CACHE_DEMOTE with a swap allowed: entries no sequence holds go to the host tier
   (leaves first), stay attachable, and come back with their bytes. */
Test(reclaim, demote_keeps_entries_below)
{
    struct tctx t;
    kvvm_key k[3];
    open_t(&t, 1, 8, 16, KVVM_F_AUTO_SWAP | KVVM_F_CACHE_DEMOTE);
    entries_only(&t, 1, 4, 3, k);
    kvvm_seq g = mk(&t);
    cr_assert_eq(kvvm_seq_grow(t.kv, g, 7 * T), 0, "grow: %s", kvvm_last_error());
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_assert_eq(st.prefix_evictions, 2);
    cr_assert_eq(st.prefix_entries, 3, "a demoted entry was dropped");
    cr_assert_eq(st.swap_outs, 0);
    uint8_t where[3];
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, k, 3, where), 3);
    cr_assert_eq(where[0], KVVM_TIER_DEVICE);
    cr_assert_eq(where[1], KVVM_TIER_HOST, "not leaves first");
    cr_assert_eq(where[2], KVVM_TIER_HOST);
    cr_assert_eq(kvvm_seq_truncate(t.kv, g, 0), 0);
    kvvm_seq b = mk(&t);
    cr_assert_eq(kvvm_prefix_attach(t.kv, b, 1, k, 3), 3, "attach: %s", kvvm_last_error());
    cr_assert(same(&t, b, 3 * T, 4), "demoted bytes differ");
    tcheck(&t, "demote");
    tclose(&t);
}

/* A demotion is a swap: without KVVM_F_AUTO_SWAP entries are dropped. */
Test(reclaim, demote_needs_a_swap_allowed)
{
    struct tctx t;
    kvvm_key k[3];
    open_t(&t, 1, 8, 16, KVVM_F_CACHE_DEMOTE);
    entries_only(&t, 1, 4, 3, k);
    kvvm_seq g = mk(&t);
    cr_assert_eq(kvvm_seq_grow(t.kv, g, 7 * T), 0, "grow: %s", kvvm_last_error());
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_assert_eq(st.prefix_evictions, 2);
    cr_assert_eq(st.prefix_entries, 1);
    cr_assert_eq(st.pages_host_free, st.pages_host_total);
    tcheck(&t, "no demote");
    tclose(&t);
}

/* ---------------------------------------------------------------- with the pool view */

static void table(struct tctx *t, kvvm_seq s, uint32_t n, int32_t *ids)
{
    cr_assert_eq(kvvm_seq_block_table(t->kv, s, 0, n, ids), 0, "block table: %s",
                 kvvm_last_error());
    for (uint32_t i = 0; i < n; i++)
        cr_assert_geq(ids[i], 0, "block %u has no id", i);
}

/* The two 0.3 features together (KVVM_F_POOL_VIEW): blocks attached from entries have ids,
   a write into one copies it on write (a new id, the publisher's unchanged), an entry demoted
   to host and attached back gets an id again; the checker (the debug build) checks ids and
   entries' references after every call. */
Test(view, attached_blocks_have_ids_through_cow_demotion_and_attach)
{
    struct tctx t;
    kvvm_key k[3];
    int32_t i0[4], i1[3], i2[3], i3[4];
    open_t(&t, 2, 24, 16, KVVM_F_POOL_VIEW | KVVM_F_AUTO_SWAP | KVVM_F_CACHE_DEMOTE);
    kvvm_seq s0 = published(&t, 1, 1, 3, 5, k);
    table(&t, s0, 4, i0);
    kvvm_seq d = mk(&t);
    cr_assert_eq(kvvm_prefix_attach(t.kv, d, 1, k, 3), 3, "attach: %s", kvvm_last_error());
    table(&t, d, 3, i1);
    cr_assert(same(&t, d, 3 * T, 1));
    uint8_t x = 0xee;
    for (uint32_t r = 0; r < 2; r++)
        cr_assert_eq(kvvm_seq_write(t.kv, d, r, 2 * T * BPT, &x, 1), 0, "write: %s",
                     kvvm_last_error());
    table(&t, d, 3, i2);
    cr_assert_neq(i2[2], i1[2], "a block copied on write kept its id");
    cr_assert_eq(i2[0], i1[0], "a block not written changed id");
    table(&t, s0, 4, i3);
    cr_assert_eq(i3[2], i0[2], "the publisher's block changed id by another's write");
    cr_assert_eq(kvvm_seq_free(t.kv, s0), 0);
    /* 8 of 24 frames used (d's 6, entry 2's 2, held by no sequence now, a leaf): 9 blocks
       more demote entry 2 */
    kvvm_seq g = mk(&t);
    cr_assert_eq(kvvm_seq_grow(t.kv, g, 9 * T), 0, "grow: %s", kvvm_last_error());
    uint8_t where[3];
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, k, 3, where), 3);
    cr_assert_eq(where[2], KVVM_TIER_HOST, "entry 2 was not demoted");
    int32_t ig[9];
    table(&t, g, 9, ig);
    cr_assert_eq(kvvm_seq_truncate(t.kv, g, 0), 0);
    kvvm_seq e = mk(&t);
    cr_assert_eq(kvvm_prefix_attach(t.kv, e, 1, k, 3), 3, "attach: %s", kvvm_last_error());
    table(&t, e, 3, i1);
    cr_assert(same(&t, e, 3 * T, 1), "attached bytes differ");
    tcheck(&t, "pool view + prefix");
    tclose(&t);
}

/* ---------------------------------------------------------------- host entries */

/* An entry whose pages went to the host tier with its publisher's swap-out. */
static kvvm_seq host_entries(struct tctx *t, kvvm_key *k, uint32_t nb)
{
    kvvm_seq a = published(t, 1, 8, nb, 0, k);
    cr_assert_eq(kvvm_seq_swap_out(t->kv, a), 0);
    cr_assert_eq(kvvm_seq_free(t->kv, a), 0);
    uint8_t where[8];
    cr_assert_leq(nb, 8u);
    cr_assert_eq(kvvm_prefix_lookup(t->kv, 1, k, nb, where), (int)nb);
    for (uint32_t i = 0; i < nb; i++)
        cr_assert_eq(where[i], KVVM_TIER_HOST);
    return a;
}

Test(host, attach_brings_host_entries_back)
{
    struct tctx t;
    kvvm_key k[3];
    open_t(&t, 2, 16, 16, 0);
    host_entries(&t, k, 3);
    struct kvvm_stats s0, s1;
    tstats(&t, &s0);
    kvvm_seq b = mk(&t);
    cr_assert_eq(kvvm_prefix_attach(t.kv, b, 1, k, 3), 3, "attach: %s", kvvm_last_error());
    tstats(&t, &s1);
    cr_assert_eq(s1.bytes_to_device - s0.bytes_to_device, 6 * KB);
    cr_assert(same(&t, b, 3 * T, 8));
    uint8_t where[3];
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, k, 3, where), 3);
    cr_assert_eq(where[0], KVVM_TIER_DEVICE, "the entry did not follow its page up");
    tcheck(&t, "host attach");
    tclose(&t);
}

/* An attach of k[0..3) into a fresh sequence (returned) is -ENOMEM, leaves it empty and the
   device and host tiers' free pages as they were; *s0 and *s1 get the stats before and
   after. */
static kvvm_seq attach_refused(struct tctx *t, const kvvm_key *k, struct kvvm_stats *s0,
                               struct kvvm_stats *s1)
{
    tstats(t, s0);
    kvvm_seq b = mk(t);
    cr_assert_eq(kvvm_prefix_attach(t->kv, b, 1, k, 3), -ENOMEM);
    tstats(t, s1);
    cr_assert_eq(seq_len(t, b), 0);
    cr_assert_eq(s1->pages_device_free, s0->pages_device_free);
    cr_assert_eq(s1->pages_host_free, s0->pages_host_free);
    return b;
}

Test(host, attach_without_device_room_is_enomem_and_changes_nothing)
{
    struct tctx t;
    kvvm_key k[3];
    open_t(&t, 1, 8, 16, 0);
    host_entries(&t, k, 3);
    kvvm_seq full = mk(&t);
    fill(&t, full, 6 * T, 3);            /* 2 frames left, 3 needed */
    struct kvvm_stats s0, s1;
    kvvm_seq b = attach_refused(&t, k, &s0, &s1);
    cr_assert_eq(s1.bytes_to_device, s0.bytes_to_device);
    uint8_t where[3];
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, k, 3, where), 3);
    cr_assert_eq(where[2], KVVM_TIER_HOST);
    cr_assert_eq(kvvm_seq_grow(t.kv, b, 1), 0, "dst is not usable after a failed attach");
    tcheck(&t, "enomem");
    tclose(&t);
}

/* Issue 31, defect 4: an attach into an empty destination that had been swapped out (grown,
   swapped out, truncated to nothing), refused for device room, left it resident: undoing
   the adoption assumed dst had been resident. In both modes it must stay swapped out. */
static void attach_failed_into_swapped_out_dst(bool stream_mode)
{
    struct tctx t;
    struct kvvm_config c;
    void *stream = NULL;
    kvvm_key k[3];
    TH_DEADLINE(60);
    cfg_small(&c, 1, 8, 16, 0);
    topen(&t, &c);
    host_entries(&t, k, 3);              /* (synchronous: on the host tier on return) */
    if (stream_mode) {
        cr_assert_eq(kvvm_stream_create(t.kv, &stream), 0);
        cr_assert_eq(kvvm_set_stream(t.kv, stream), 0);
    }
    kvvm_seq b = mk(&t);
    fill(&t, b, 2 * T, 5);
    cr_assert_eq(kvvm_seq_swap_out(t.kv, b), 0);
    cr_assert_eq(kvvm_seq_truncate(t.kv, b, 0), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    kvvm_seq full = mk(&t);
    fill(&t, full, 6 * T, 3);            /* 2 frames left, 3 needed */
    struct kvvm_seq_info in;
    tinfo(&t, b, &in);
    cr_assert_eq(in.resident, 0, "the setup: dst is swapped out");
    struct kvvm_stats s0, s1;
    tstats(&t, &s0);
    cr_assert_eq(kvvm_prefix_attach(t.kv, b, 1, k, 3), -ENOMEM);
    tstats(&t, &s1);
    tinfo(&t, b, &in);
    cr_assert_eq(in.length, 0);
    cr_assert_eq(in.resident, 0, "the failed attach left dst resident");
    cr_assert_eq(s1.pages_device_free, s0.pages_device_free);
    cr_assert_eq(s1.pages_host_free, s0.pages_host_free);
    tcheck(&t, "failed attach, swapped-out dst");
    cr_assert_eq(kvvm_seq_grow(t.kv, b, 1), 0, "dst is not usable after a failed attach");
    tcheck(&t, "grown after");
    if (stream_mode)
        tclose_stream(&t, stream);
    else
        tclose(&t);
}

Test(regress, attach_failed_into_swapped_out_dst_left_resident)
{
    attach_failed_into_swapped_out_dst(true);
    attach_failed_into_swapped_out_dst(false);
}

/* Issue 31, defect 6: an attach of host entries that needs room only reclaim makes (a
   CACHED sequence dropped, then the device entries no sequence holds dropped) and frames
   the pool has not created (trimmed), with a creation the call needs refused by the driver
   (cuMemCreate, cuEventCreate, cuStreamCreate, each call in turn): the reclaim acted before
   them, so the attach failed -ENOMEM with the CACHED sequence and the entries dropped. A
   failed attach must leave every sequence and every entry as it was. */
struct att_refused {
    struct tctx t;
    bool stream;
    void *st;
    kvvm_key k[6], e[2];                 /* host entries attached; device entries */
    kvvm_seq c, l, dst;
    struct th_snap seqs, host;
};

static void att_setup(void *p)
{
    struct att_refused *a = p;
    struct kvvm_config c;
    cfg_small(&c, 1, 10, 16, 0);
    topen(&a->t, &c);
    host_entries(&a->t, a->k, 6);                  /* (synchronous: on the host tier) */
    entries_only(&a->t, 1, 9, 2, a->e);            /* 2 device pages */
    a->c = mk(&a->t);
    fill(&a->t, a->c, 2 * T, 3);                   /* 2 */
    a->l = mk(&a->t);
    fill(&a->t, a->l, 4 * T, 4);                   /* 4: 2 free */
    cr_assert_eq(kvvm_seq_set_class(a->t.kv, a->c, KVVM_SEQ_CACHED), 0);
    if (a->stream) {
        cr_assert_eq(kvvm_stream_create(a->t.kv, &a->st), 0);
        cr_assert_eq(kvvm_set_stream(a->t.kv, a->st), 0);
    }
    a->dst = mk(&a->t);
    cr_assert_eq(kvvm_step(a->t.kv), 0);
    cr_assert_eq(kvvm_step(a->t.kv), 0);           /* c unprotected */
    cr_assert_eq(kvvm_sync(a->t.kv), 0);
    cr_assert_eq(kvvm_trim(a->t.kv, 0), 0);        /* the 2 free frames are not created */
    kvvm_seq all[3] = { a->c, a->l, a->dst };
    th_snap_take(a->t.kv, &a->seqs, all, 3, 1, a->e, 2);
    th_snap_take(a->t.kv, &a->host, NULL, 0, 1, a->k, 6);
}

static int att_call(void *p)
{
    struct att_refused *a = p;          /* 6 frames: 2 free, c's 2, the entries' 2 */
    int rc = kvvm_prefix_attach(a->t.kv, a->dst, 1, a->k, 6);
    return rc == 6 ? 0 : rc;
}

static void att_teardown(void *p)
{
    struct att_refused *a = p;
    if (a->stream)
        tclose_stream(&a->t, a->st);
    else
        tclose(&a->t);
}

static enum th_sweep_outcome att_after(void *p, int rc, const char *where)
{
    struct att_refused *a = p;
    if (rc == -EIO)
        return TH_SWEEP_DEAD;
    if (rc) {
        UCHK(rc == -ENOMEM, "%s: returned %d", where, rc);
        th_snap_same(a->t.kv, &a->seqs, where);
        th_snap_same(a->t.kv, &a->host, where);
    } else {
        UCHK(same(&a->t, a->dst, 6 * T, 8), "%s: attached bytes", where);
    }
    th_check(a->t.kv, where);
    return rc ? TH_SWEEP_FAILED : TH_SWEEP_ABSORBED;
}

Test(regress, attach_refused_by_the_driver_dropped_others)
{
    TH_DEADLINE(300);
    kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);        /* the refusals are logged */
    for (int stream = 0; stream < 2; stream++) {
        struct att_refused a = { .stream = stream };
        struct th_sweep s = { .name = stream ? "attach (stream)" : "attach", .arg = &a,
                              .setup = att_setup, .call = att_call,
                              .teardown = att_teardown, .after = att_after };
        th_refusals_run(&s);
    }
}

/* The same attach with the driver refusing a map, set-access, copy or synchronization
   (th_use_entries, each call in turn) after the reclaim dropped c and the device entries.
   Bug: the call failed -ENOMEM with c and the entries dropped. Now the failed call takes
   its moves back (swap/undo.c): the drops were stashed on the host tier (it has room), so
   c and the entries are as they were (tiers, bytes). */
static enum th_sweep_outcome att_use_after(void *p, int rc, const char *where)
{
    struct att_refused *a = p;
    UCHK(rc != -EIO, "%s: -EIO: %s", where, kvvm_last_error());
    enum th_sweep_outcome o = att_after(p, rc, where);
    if (rc)
        UCHK(same(&a->t, a->c, 2 * T, 3) && same(&a->t, a->l, 4 * T, 4), "%s: bytes", where);
    return o;
}

Test(regress, attach_map_refused_after_reclaim_dropped_others)
{
    TH_DEADLINE(300);
    kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);        /* the refusals are logged */
    for (int stream = 0; stream < 2; stream++) {
        struct att_refused a = { .stream = stream };
        struct th_sweep s = { .name = stream ? "attach, maps and copies refused (stream)"
                                             : "attach, maps and copies refused",
                              .arg = &a, .setup = att_setup, .call = att_call,
                              .teardown = att_teardown, .after = att_use_after };
        th_refusals_run_use(&s);
    }
}

/* Entries whose pages went to disk (a staged swap-out of their publisher: more pages than
   the host tier holds) come back by attach with their bytes. */
Test(host, attach_brings_disk_entries_back)
{
    char dir[64];
    snprintf(dir, sizeof dir, "/var/tmp/kvvm-test-prefix-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    struct kvvm_config c;
    struct tctx t;
    kvvm_key k[4];
    TH_DEADLINE(60);
    cfg_small(&c, 1, 16, 2, 0);
    c.spill_dir = dir;
    c.spill_budget = 16 * KB;
    topen(&t, &c);
    kvvm_seq a = published(&t, 1, 9, 4, 0, k);
    cr_assert_eq(kvvm_seq_swap_out(t.kv, a), 0, "swap_out: %s", kvvm_last_error());
    cr_assert_eq(kvvm_seq_free(t.kv, a), 0);
    uint8_t where[4];
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, k, 4, where), 4);
    int on_disk = 0;
    for (int i = 0; i < 4; i++)
        on_disk += where[i] == KVVM_TIER_DISK;
    cr_assert_gt(on_disk, 0, "no entry on disk");
    kvvm_seq b = mk(&t);
    cr_assert_eq(kvvm_prefix_attach(t.kv, b, 1, k, 4), 4, "attach: %s", kvvm_last_error());
    cr_assert(same(&t, b, 4 * T, 9), "bytes back from disk differ");
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, k, 4, where), 4);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(where[i], KVVM_TIER_DEVICE);
    tcheck(&t, "disk attach");
    tclose(&t);
    cr_expect_eq(rmdir(dir), 0);
}

/* ---------------------------------------------------------------- entries below the host */

/* A context of one region with a host tier of `host` slots and (disk > 0) a disk tier of
   `disk` pages in a fresh directory dir (64 bytes), KVVM_F_AUTO_SWAP | KVVM_F_CACHE_DEMOTE,
   every watermark 0: only the calls reclaim and spill (no thread does), so what moves is
   exactly what they need. */
static void open_tiers(struct tctx *t, char *dir, uint64_t host, uint64_t disk)
{
    struct kvvm_config c;
    TH_DEADLINE(60);
    snprintf(dir, 64, "/var/tmp/kvvm-test-prefix-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    cfg_small(&c, 1, 8, host, KVVM_F_AUTO_SWAP | KVVM_F_CACHE_DEMOTE);
    c.spill_dir = disk ? dir : NULL;
    c.spill_budget = disk * KB;
    c.device_min = c.device_low = c.device_high = 0;
    c.host_min = c.host_low = c.host_high = 0;
    topen(t, &c);
}

static void close_tiers(struct tctx *t, const char *dir)
{
    tclose(t);
    cr_expect_eq(rmdir(dir), 0);
}

/* Chains x (lineage 1) and y (lineage 2) of 3 entries each that no sequence holds, y the
   least recently used; then a grow of 6 blocks on the device of 8 reclaims 4 of them, in
   the plan's order y2, y1, y0, x2 (least recently used first, leaves first). Returns the
   grown sequence. (two_chains_grown: nx and ny entries, a grow of `blocks`.) */
static kvvm_seq two_chains_grown(struct tctx *t, kvvm_key *x, int nx, kvvm_key *y, int ny,
                                 uint64_t blocks)
{
    entries_only(t, 1, 1, (size_t)nx, x);
    entries_only(t, 1, 2, (size_t)ny, y);
    cr_assert_eq(kvvm_prefix_lookup(t->kv, 1, y, (size_t)ny, NULL), ny);
    cr_assert_eq(kvvm_prefix_lookup(t->kv, 1, x, (size_t)nx, NULL), nx);
    kvvm_seq g = mk(t);
    cr_assert_eq(kvvm_seq_grow(t->kv, g, blocks * T), 0, "grow: %s", kvvm_last_error());
    return g;
}

static kvvm_seq two_chains_reclaimed(struct tctx *t, kvvm_key *x, kvvm_key *y)
{
    return two_chains_grown(t, x, 3, y, 3, 6);
}

/* The lookup of k[0..n) in namespace 1 finds all n, in tiers want[0..n) (it makes them the
   most recently used). */
static void tiers_are(struct tctx *t, const kvvm_key *k, int n, const uint8_t *want,
                      const char *what)
{
    uint8_t w[4] = { 0 };
    cr_assert_eq(kvvm_prefix_lookup(t->kv, 1, k, (size_t)n, w), n, "%s: not all found", what);
    for (int i = 0; i < n; i++)
        cr_assert_eq(w[i], want[i], "%s: block %d in tier %u, not %u", what, i, w[i], want[i]);
}

enum { DEV = KVVM_TIER_DEVICE, HOST = KVVM_TIER_HOST, DISK = KVVM_TIER_DISK };

/* Host room for demoted entries is made by spilling entries to disk, through the same
   plan: the host tier (2 slots) takes y2 and y1, then each further demotion spills the
   least recently used leaf on the host tier first (y2, then y1); lookup says DISK for
   them and moves nothing; attach brings them back, bytes intact. */
Test(below, demoted_entries_spill_to_disk_lru_leaves_first)
{
    struct tctx t;
    char dir[64];
    kvvm_key x[3], y[3];
    open_tiers(&t, dir, 2, 16);
    kvvm_seq g = two_chains_reclaimed(&t, x, y);
    struct kvvm_stats s0, s1;
    tstats(&t, &s0);
    cr_assert_eq(s0.prefix_evictions, 4);
    cr_assert_eq(s0.prefix_entries, 6, "an entry was dropped, not demoted");
    cr_assert_eq(s0.prefix_spills, 2);
    cr_assert_eq(s0.spills, 2);
    cr_assert_eq(s0.swap_outs, 0);
    tiers_are(&t, y, 3, (uint8_t[]){ HOST, DISK, DISK }, "y");
    tiers_are(&t, x, 3, (uint8_t[]){ DEV, DEV, HOST }, "x");
    tiers_are(&t, y, 3, (uint8_t[]){ HOST, DISK, DISK }, "y again (lookup moves nothing)");
    tstats(&t, &s1);
    cr_assert_eq(s1.bytes_from_disk, s0.bytes_from_disk, "a lookup read the disk");
    cr_assert_eq(s1.bytes_to_device, s0.bytes_to_device, "a lookup moved a page");
    tcheck(&t, "spilled");
    cr_assert_eq(kvvm_seq_truncate(t.kv, g, 0), 0);
    kvvm_seq b = mk(&t);
    cr_assert_eq(kvvm_prefix_attach(t.kv, b, 1, y, 3), 3, "attach: %s", kvvm_last_error());
    cr_assert(same(&t, b, 3 * T, 2), "bytes back from disk differ");
    tstats(&t, &s1);
    cr_assert_eq(s1.bytes_from_disk - s0.bytes_from_disk, 2 * KB);
    tiers_are(&t, y, 3, (uint8_t[]){ DEV, DEV, DEV }, "y attached");
    kvvm_seq c = mk(&t);
    cr_assert_eq(kvvm_prefix_attach(t.kv, c, 1, x, 3), 3, "attach: %s", kvvm_last_error());
    cr_assert(same(&t, c, 3 * T, 1), "bytes back from host differ");
    tcheck(&t, "attached");
    close_tiers(&t, dir);
}

/* open_tiers(host, disk), then entries x[0..nb) (lineage 1) that no sequence holds, demoted
   by a grow of 8 blocks (truncated to 0 again) into tiers want[0..nb). */
static void entries_demoted(struct tctx *t, char *dir, uint64_t host, uint64_t disk,
                            kvvm_key *x, int nb, const uint8_t *want)
{
    open_tiers(t, dir, host, disk);
    entries_only(t, 1, 1, (size_t)nb, x);
    kvvm_seq g = mk(t);
    cr_assert_eq(kvvm_seq_grow(t->kv, g, 8 * T), 0, "grow: %s", kvvm_last_error());
    tiers_are(t, x, nb, want, "x demoted");
    cr_assert_eq(kvvm_seq_truncate(t->kv, g, 0), 0);
}

/* A swap-out short of host slots makes its room by spilling the entries that fill the host
   tier (before, they were no spill candidate's: the swap-out was -ENOMEM). */
Test(below, a_swap_out_spills_host_entries_for_room)
{
    struct tctx t;
    char dir[64];
    kvvm_key x[2];
    entries_demoted(&t, dir, 2, 16, x, 2, (uint8_t[]){ HOST, HOST });
    kvvm_seq s = mk(&t);
    fill(&t, s, 2 * T, 3);
    cr_assert_eq(kvvm_seq_swap_out(t.kv, s), 0, "swap_out: %s", kvvm_last_error());
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_assert_eq(st.prefix_spills, 2);
    tiers_are(&t, x, 2, (uint8_t[]){ DISK, DISK }, "x spilled");
    cr_assert_eq(kvvm_seq_swap_in(t.kv, s), 0, "swap_in: %s", kvvm_last_error());
    cr_assert(same(&t, s, 2 * T, 3));
    kvvm_seq b = mk(&t);
    cr_assert_eq(kvvm_prefix_attach(t.kv, b, 1, x, 2), 2, "attach: %s", kvvm_last_error());
    cr_assert(same(&t, b, 2 * T, 1));
    tcheck(&t, "swap-out room");
    close_tiers(&t, dir);
}

/* A context of open_tiers with a host tier of 3 slots and no disk tier, full of entries no
   sequence holds: x0, x1 (lineage 1) and y0 (lineage 2), demoted by a grow of g (returned,
   truncated to 0 again), y the least recently used chain. */
static kvvm_seq host_full_of_entries(struct tctx *t, char *dir, kvvm_key *x, kvvm_key *y)
{
    open_tiers(t, dir, 3, 0);
    kvvm_seq g = two_chains_grown(t, x, 2, y, 1, 8);
    cr_assert_eq(kvvm_seq_truncate(t->kv, g, 0), 0);
    struct kvvm_stats st;
    tstats(t, &st);
    cr_assert_eq(st.pages_host_free, 0, "the host tier is not full of entries");
    cr_assert_eq(st.prefix_entries, 3, "an entry was dropped, not demoted");
    return g;
}

/* After host_full_of_entries and a move that needed 2 host slots: y0 (least recently used)
   and x1 (x's leaf) were dropped, x0 is kept on the host tier. */
static void y0_and_x1_dropped(struct tctx *t, const kvvm_key *x, const kvvm_key *y)
{
    cr_assert_eq(kvvm_prefix_lookup(t->kv, 1, y, 1, NULL), 0, "y0 (least recently used) kept");
    tiers_are(t, x, 1, (uint8_t[]){ HOST }, "x0");
    cr_assert_eq(kvvm_prefix_lookup(t->kv, 1, x, 2, NULL), 1, "x1 (x's leaf) kept");
}

/* Bug: without a disk tier, entries that no sequence holds and that fill the host tier were
   never dropped for host room: a swap-out of a LIVE sequence was -ENOMEM while the host tier
   held only those entries (docs/api.md: entries never block a call that needs room). The
   host tier (3 slots) holds x0, x1 and y0 (demoted), y the least recently used chain; a
   swap-out of 2 pages drops y0 (least recently used), then x1 (x's leaf), and keeps x0; one
   that x0 cannot cover is -ENOMEM and drops nothing. */
Test(regress, host_entries_blocked_a_swap_out_without_a_disk_tier)
{
    struct tctx t;
    char dir[64];
    kvvm_key x[2], y[1];
    host_full_of_entries(&t, dir, x, y);
    struct kvvm_stats s0, s1;
    tstats(&t, &s0);
    kvvm_seq s = mk(&t);
    fill(&t, s, 2 * T, 3);
    cr_assert_eq(kvvm_seq_swap_out(t.kv, s), 0, "swap_out: %s", kvvm_last_error());
    tstats(&t, &s1);
    cr_assert_eq(s1.prefix_entries, 1);
    cr_assert_eq(s1.prefix_evictions - s0.prefix_evictions, 2);
    y0_and_x1_dropped(&t, x, y);
    /* two more pages: x0 covers one of them only: -ENOMEM, and x0 is kept */
    kvvm_seq u = mk(&t);
    fill(&t, u, 2 * T, 4);
    cr_assert_eq(kvvm_seq_swap_out(t.kv, u), -ENOMEM);
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, x, 2, NULL), 1, "a failed call dropped x0");
    cr_assert_eq(kvvm_seq_free(t.kv, u), 0);
    cr_assert_eq(kvvm_seq_swap_in(t.kv, s), 0, "swap_in: %s", kvvm_last_error());
    cr_assert(same(&t, s, 2 * T, 3));
    kvvm_seq b = mk(&t);
    cr_assert_eq(kvvm_prefix_attach(t.kv, b, 1, x, 2), 1, "attach: %s", kvvm_last_error());
    cr_assert(same(&t, b, T, 1));
    tcheck(&t, "host entries dropped");
    close_tiers(&t, dir);
}

/* Bug: the same through a reclaim plan: with the host tier full of entries no sequence
   holds and no disk tier, the plan counted no host room for a LIVE victim, so a grow that
   needed it swapped out was -ENOMEM. The plan counts those entries' host pages as room and
   the swap-out drops them (least recently used first, leaves first); a grow that even
   that cannot cover is -ENOMEM and drops nothing. */
Test(regress, host_entries_blocked_an_auto_swap_without_a_disk_tier)
{
    struct tctx t;
    char dir[64];
    kvvm_key x[2], y[1];
    kvvm_seq g = host_full_of_entries(&t, dir, x, y);
    kvvm_seq live = mk(&t);
    fill(&t, live, 2 * T, 3);
    cr_assert_eq(kvvm_step(t.kv), 0);    /* live unprotected: a swap victim */
    cr_assert_eq(kvvm_step(t.kv), 0);
    struct kvvm_stats s0, s1;
    tstats(&t, &s0);
    /* 9 frames of 8: no victim can cover it; nothing is dropped */
    cr_assert_eq(kvvm_seq_grow(t.kv, g, 9 * T), -ENOMEM);
    tstats(&t, &s1);
    cr_assert_eq(s1.prefix_entries, 3, "a failed call dropped entries");
    cr_assert_eq(s1.swap_outs, s0.swap_outs);
    cr_assert_eq(kvvm_seq_grow(t.kv, g, 8 * T), 0, "grow: %s", kvvm_last_error());
    tstats(&t, &s1);
    cr_assert_eq(s1.swap_outs - s0.swap_outs, 1);
    cr_assert_eq(s1.prefix_entries, 1);
    y0_and_x1_dropped(&t, x, y);
    cr_assert_eq(kvvm_seq_truncate(t.kv, g, 0), 0);
    cr_assert_eq(kvvm_seq_swap_in(t.kv, live), 0, "swap_in: %s", kvvm_last_error());
    cr_assert(same(&t, live, 2 * T, 3));
    tcheck(&t, "host entries dropped by a plan");
    close_tiers(&t, dir);
}

/* With the disk tier full, entries no sequence holds on the host tier are dropped for a
   swap-out's host room too, leaves first: x's leaves on disk go before x1 on the host tier
   (a chain keeps its head x0). */
Test(below, a_swap_out_drops_host_entries_when_the_disk_is_full)
{
    struct tctx t;
    char dir[64];
    kvvm_key x[4];
    entries_demoted(&t, dir, 2, 2, x, 4, (uint8_t[]){ HOST, HOST, DISK, DISK });
    struct kvvm_stats s0, s1;
    tstats(&t, &s0);
    cr_assert_eq(s0.pages_host_free, 0);
    cr_assert_eq(s0.pages_disk_free, 0);
    kvvm_seq s = mk(&t);
    fill(&t, s, T, 3);
    cr_assert_eq(kvvm_seq_swap_out(t.kv, s), 0, "swap_out: %s", kvvm_last_error());
    tstats(&t, &s1);
    cr_assert_eq(s1.prefix_entries, 1);
    cr_assert_eq(s1.prefix_evictions - s0.prefix_evictions, 3);
    tiers_are(&t, x, 1, (uint8_t[]){ HOST }, "x0");
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, x, 4, NULL), 1);
    cr_assert_eq(kvvm_seq_swap_in(t.kv, s), 0, "swap_in: %s", kvvm_last_error());
    cr_assert(same(&t, s, T, 3));
    tcheck(&t, "disk full");
    close_tiers(&t, dir);
}

/* An attach of disk entries without device room for them is -ENOMEM and moves nothing:
   no entry's tier changes, no page is read or written. */
Test(below, attach_from_disk_without_device_room_changes_nothing)
{
    struct tctx t;
    char dir[64];
    kvvm_key x[3], y[3];
    open_tiers(&t, dir, 2, 16);
    two_chains_reclaimed(&t, x, y);      /* 8 of 8 frames used; x0 and x1 may go: 2 < 3 */
    struct kvvm_stats s0, s1;
    attach_refused(&t, y, &s0, &s1);
    cr_assert_eq(s1.pages_disk_free, s0.pages_disk_free);
    cr_assert_eq(s1.bytes_from_disk, s0.bytes_from_disk);
    cr_assert_eq(s1.bytes_to_disk, s0.bytes_to_disk);
    cr_assert_eq(s1.prefix_evictions, s0.prefix_evictions);
    cr_assert_eq(s1.prefix_spills, s0.prefix_spills);
    tiers_are(&t, x, 3, (uint8_t[]){ DEV, DEV, HOST }, "x");
    tiers_are(&t, y, 3, (uint8_t[]){ HOST, DISK, DISK }, "y");
    tcheck(&t, "enomem");
    close_tiers(&t, dir);
}

/* Each chain's present prefix attaches with its bytes (x lineage 1, y lineage 2). The device
   must have room. */
static void chains_intact(struct tctx *t, const kvvm_key *x, const kvvm_key *y,
                          const char *where)
{
    const kvvm_key *k[2] = { x, y };
    for (uint32_t c = 0; c < 2; c++) {
        int n = kvvm_prefix_lookup(t->kv, 1, k[c], 3, NULL);
        kvvm_seq s = mk(t);
        int rc = kvvm_prefix_attach(t->kv, s, 1, k[c], 3);
        cr_assert_eq(rc, n, "%s: chain %u: attach %d (%s), lookup %d", where, c, rc,
                     kvvm_last_error(), n);
        cr_assert(!n || same(t, s, (uint64_t)n * T, c + 1), "%s: chain %u's bytes", where, c);
        cr_assert_eq(kvvm_seq_free(t->kv, s), 0);
    }
}

/* The I/O fault sweep over the paths below the host tier (the testing interface fails the
   nth I/O of the spill engine with -EIO, n = 1, 2, ... until an operation runs past its
   last I/O):
   - a reclaim that spills entries (the grow of two_chains_reclaimed: two writes): the grow
     succeeds anyway (an entry whose page cannot go down is dropped instead, which frees as
     much), and every entry left attaches with its bytes;
   - an attach of disk entries (a write that makes host room, two reads): it succeeds; or,
     a read failing, the block read is damaged (its disk copy lost): its entry is dropped
     and the attach brings the blocks before it, with their bytes (never wrong bytes); or,
     the write failing (spilling is then off), it fails -ENOMEM with dst empty, the device
     frames and the entries as they were. The spill that made room before a failed read
     stays (the bytes intact on disk): an I/O error is no plan's. */
Test(sweep, io_faults_below_the_host_tier)
{
    TH_DEADLINE(300);
    unsigned failed[2] = { 0, 0 }, points[2] = { 0, 0 }, shorter = 0;
    for (int op = 0; op < 2; op++) {
        for (unsigned long nth = 1;; nth++) {
            struct tctx t;
            char dir[64], where[64];
            kvvm_key x[3], y[3];
            struct kvvm_stats s0, s1;
            snprintf(where, sizeof where, "%s, I/O %lu failed", op ? "attach" : "reclaim", nth);
            kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);   /* the injected errors are logged */
            open_tiers(&t, dir, 2, 16);
            struct disk *dk = kvvm_debug_disk(t.kv);
            if (!op)
                cr_assert_eq(disk_fault_arm(dk, nth, DISK_FAULT_ERROR, -EIO), 0);
            kvvm_seq g = two_chains_reclaimed(&t, x, y);
            cr_assert_eq(kvvm_seq_truncate(t.kv, g, 0), 0);
            tstats(&t, &s0);
            kvvm_seq b = mk(&t);
            int rc = 3;
            if (op) {
                cr_assert_eq(disk_fault_arm(dk, nth, DISK_FAULT_ERROR, -EIO), 0);
                rc = kvvm_prefix_attach(t.kv, b, 1, y, 3);
            }
            disk_fault_clear(dk);
            tstats(&t, &s1);
            bool hit = s1.io_errors > 0;
            if (op && rc >= 0) {
                cr_assert(!rc || same(&t, b, (uint64_t)rc * T, 2), "%s: bytes", where);
                cr_assert_eq(seq_len(&t, b), (uint64_t)rc * T, "%s: dst's length", where);
                cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, y, 3, NULL), rc,
                             "%s: the damaged entry is still found", where);
                cr_assert(rc == 3 || s1.pages_damaged, "%s: attached %d undamaged", where, rc);
                shorter += rc < 3;
            } else if (op) {
                cr_assert_eq(rc, -ENOMEM, "%s: attach %d", where, rc);
                cr_assert_eq(seq_len(&t, b), 0, "%s: dst holds tokens", where);
                cr_assert_eq(s1.pages_device_free, s0.pages_device_free, "%s: frames", where);
                cr_assert_eq(s1.prefix_entries, s0.prefix_entries, "%s: entries", where);
                cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, y, 1, (uint8_t[1]){ 0 }), 1);
            }
            cr_assert_eq(kvvm_seq_free(t.kv, b), 0);
            tcheck(&t, where);
            chains_intact(&t, x, y, where);
            tcheck(&t, where);
            close_tiers(&t, dir);
            if (!hit)
                break;                  /* past the operation's last I/O */
            failed[op] += rc < 0;
            points[op]++;
            cr_assert_lt(nth, 16, "%s: the sweep does not end", where);
        }
    }
    printf("sweep below the host tier: reclaim %u I/O failed in turn, attach %u; %u and %u "
           "of the calls failed, %u attaches brought a shorter prefix, each as documented\n",
           points[0], points[1], failed[0], failed[1], shorter);
    cr_assert_geq(points[0], 2u, "the reclaim wrote no entry's page");
    cr_assert_eq(failed[0], 0u, "a reclaim failed on a spill write");
    cr_assert_geq(shorter, 2u, "no attach met a failed read");
}

/* A block read back damaged from disk is a miss: its entry goes, the blocks before it
   attach, now and at every later attach. */
Test(regress, a_damaged_disk_entry_failed_every_attach_of_its_chain)
{
    /* Bug: a block whose disk read failed stayed an entry that every lookup found, and
       every attach of its chain failed -EBADMSG, until the engine dropped a key it could
       not tell. */
    struct tctx t;
    char dir[64];
    kvvm_key x[3], y[3];
    kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);     /* the injected error is logged */
    open_tiers(&t, dir, 2, 16);
    cr_assert_eq(kvvm_seq_truncate(t.kv, two_chains_reclaimed(&t, x, y), 0), 0);
    kvvm_seq b = mk(&t);
    /* the attach writes x2 out for host room (I/O 1), then reads y's disk blocks */
    cr_assert_eq(disk_fault_arm(kvvm_debug_disk(t.kv), 2, DISK_FAULT_ERROR, -EIO), 0);
    int rc = kvvm_prefix_attach(t.kv, b, 1, y, 3);
    disk_fault_clear(kvvm_debug_disk(t.kv));
    cr_assert(rc >= 1 && rc < 3, "attach: %d (%s)", rc, kvvm_last_error());
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_assert_eq(st.pages_damaged, 1);
    cr_assert(same(&t, b, (uint64_t)rc * T, 2));
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, y, 3, NULL), rc, "the damaged entry is found");
    kvvm_seq c = mk(&t);
    cr_assert_eq(kvvm_prefix_attach(t.kv, c, 1, y, 3), rc, "attach: %s", kvvm_last_error());
    cr_assert(same(&t, c, (uint64_t)rc * T, 2));
    tcheck(&t, "damaged");
    close_tiers(&t, dir);
}

/* Without a disk tier the host tier's room goes to the plan's last entries (the most
   recently used, the heads of chains), the rest are dropped: a chain keeps a usable head. */
Test(regress, demotion_room_went_to_a_chain_tail_its_head_dropped)
{
    /* Bug: demotions took the host room in plan order (leaves first), so the chain y kept
       its tail y2, y1 on the host tier and lost its head y0 (and x its leaf x2): y's
       lookup found nothing while its tail held both host slots. */
    struct tctx t;
    char dir[64];
    kvvm_key x[3], y[3];
    open_tiers(&t, dir, 2, 0);
    two_chains_reclaimed(&t, x, y);
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_assert_eq(st.prefix_evictions, 4);
    cr_assert_eq(st.prefix_entries, 4, "demoted: x2 and y0 only");
    cr_assert_eq(st.prefix_spills, 0);
    cr_assert_eq(st.pages_host_free, 0);
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, y, 3, NULL), 1, "y lost its head");
    tiers_are(&t, y, 1, (uint8_t[]){ HOST }, "y");
    tiers_are(&t, x, 3, (uint8_t[]){ DEV, DEV, HOST }, "x");
    tcheck(&t, "no disk");
    close_tiers(&t, dir);
}

/* A dropped CACHED sequence is -ESTALE as attach's dst (and as publish's source). */
Test(prefix, dropped_cached_dst_is_estale)
{
    struct tctx t;
    kvvm_key k[2];
    open_t(&t, 1, 4, 0, 0);
    kvvm_seq a = published(&t, 1, 1, 2, 0, k);
    kvvm_seq d = mk(&t);
    fill(&t, d, 2 * T, 2);
    cr_assert_eq(kvvm_seq_set_class(t.kv, d, KVVM_SEQ_CACHED), 0);
    cr_assert_eq(kvvm_step(t.kv), 0);
    cr_assert_eq(kvvm_step(t.kv), 0);
    kvvm_seq g = mk(&t);
    cr_assert_eq(kvvm_seq_grow(t.kv, g, 2 * T), 0, "grow: %s", kvvm_last_error());
    struct kvvm_seq_info in;
    tinfo(&t, d, &in);
    cr_assert(in.dropped, "the CACHED sequence was not dropped");
    cr_assert_eq(kvvm_prefix_attach(t.kv, d, 1, k, 2), -ESTALE);
    cr_assert_eq(kvvm_prefix_publish(t.kv, d, 1, k, 0), -ESTALE);
    cr_assert(same(&t, a, 2 * T, 1));
    tcheck(&t, "estale");
    tclose(&t);
}

/* While the engine stream captures a CUDA graph, attach (which maps and may copy) is -EBUSY
   and changes nothing; publish, lookup and drop touch no stream and work. */
Test(prefix, attach_while_capturing_is_ebusy)
{
    struct kvvm_config c;
    struct tctx t;
    void *st;
    kvvm_key k[2];
    TH_DEADLINE(60);
    cfg_small(&c, 1, 16, 0, 0);
    topen_stream(&t, &c, &st);
    kvvm_seq a = published(&t, 1, 3, 2, 0, k);
    kvvm_seq b = mk(&t);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    cr_assert_eq(emu_stream_set_capturing((kcu_stream)st, 1), 0);
    cr_assert_eq(kvvm_prefix_attach(t.kv, b, 1, k, 2), -EBUSY);
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 1, k, 2, NULL), 2);
    cr_assert_eq(kvvm_prefix_drop(t.kv, 1, k + 1, 1), 1);
    cr_assert_eq(kvvm_prefix_publish(t.kv, a, 1, k, 2), 1);
    cr_assert_eq(emu_stream_set_capturing((kcu_stream)st, 0), 0);
    cr_assert_eq(seq_len(&t, b), 0);
    cr_assert_eq(kvvm_prefix_attach(t.kv, b, 1, k, 2), 2);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    cr_assert(same(&t, b, 2 * T, 3));
    tcheck(&t, "capture");
    tclose_stream(&t, st);
}

/* ---------------------------------------------------------------- the index */

/* A small xorshift for the model test (its seed fixed: a failure reproduces). */
static uint64_t rnd(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

#define MD_NS 4
#define MD_LIN 4
#define MD_NB 64

/* The leading blocks of (ns, lin) the model holds. */
static int md_lead(const bool (*m)[MD_LIN][MD_NB], int ns, int lin)
{
    int b = 0;
    while (b < MD_NB && m[ns][lin][b])
        b++;
    return b;
}

/* Every chain's leading count as the model says, the checker passing. */
static void md_verify(struct tctx *t, const bool (*m)[MD_LIN][MD_NB],
                      kvvm_key (*k)[MD_NB], const char *where, int op)
{
    for (int ns = 0; ns < MD_NS; ns++)
        for (int lin = 0; lin < MD_LIN; lin++)
            cr_assert_eq(kvvm_prefix_lookup(t->kv, (uint64_t)ns + 1, k[lin], MD_NB, NULL),
                         md_lead(m, ns, lin), "%s (op %d): ns %d lineage %d", where, op, ns,
                         lin);
    tcheck(t, where);
}

/* The index against a model through random publishes and drops (of single keys, ranges and
   whole namespaces): growth of the records and slots (up to 1024 entries), deletion by
   backward shift in probe runs, reuse of freed records. The same blocks published under
   other keys and namespaces share their pages, so 256 pages hold them all. */
Test(index, random_publish_and_drop_against_a_model)
{
    struct tctx t;
    static bool m[MD_NS][MD_LIN][MD_NB];
    static kvvm_key k[MD_LIN][MD_NB];
    kvvm_seq s[MD_LIN];
    uint64_t x = 0x9E3779B97F4A7C15ULL;
    open_t(&t, 1, MD_LIN * MD_NB + 8, 0, 0);
    for (int lin = 0; lin < MD_LIN; lin++) {
        s[lin] = mk(&t);
        fill(&t, s[lin], (uint64_t)MD_NB * T, (uint32_t)lin + 1);
        keys_of((uint32_t)lin + 1, MD_NB, k[lin]);
    }
    for (int op = 0; op < 1500; op++) {
        int ns = (int)(rnd(&x) % MD_NS), lin = (int)(rnd(&x) % MD_LIN), want = 0;
        uint32_t kind = (uint32_t)(rnd(&x) % 16);
        if (kind < 9) {                                 /* publish a chain's first nb */
            int nb = 1 + (int)(rnd(&x) % MD_NB);
            for (int b = 0; b < nb; b++) {
                want += !m[ns][lin][b];
                m[ns][lin][b] = true;
            }
            cr_assert_eq(kvvm_prefix_publish(t.kv, s[lin], (uint64_t)ns + 1, k[lin],
                                             (size_t)nb), want, "publish (op %d): %s", op,
                         kvvm_last_error());
        } else if (kind < 15) {                         /* drop a range of keys */
            int a = (int)(rnd(&x) % MD_NB), n = 1 + (int)(rnd(&x) % 8);
            if (a + n > MD_NB)
                n = MD_NB - a;
            for (int b = a; b < a + n; b++) {
                want += m[ns][lin][b];
                m[ns][lin][b] = false;
            }
            cr_assert_eq(kvvm_prefix_drop(t.kv, (uint64_t)ns + 1, &k[lin][a], (size_t)n), want,
                         "drop (op %d)", op);
        } else {                                        /* drop a whole namespace */
            for (int l = 0; l < MD_LIN; l++)
                for (int b = 0; b < MD_NB; b++) {
                    want += m[ns][l][b];
                    m[ns][l][b] = false;
                }
            cr_assert_eq(kvvm_prefix_drop(t.kv, (uint64_t)ns + 1, NULL, 0), want,
                         "drop ns (op %d)", op);
        }
        cr_assert_eq(kvvm_prefix_lookup(t.kv, (uint64_t)ns + 1, k[lin], MD_NB, NULL),
                     md_lead(m, ns, lin), "lookup after op %d", op);
        if (op % 100 == 99)
            md_verify(&t, m, k, "model", op);
    }
    for (int ns = 0; ns < MD_NS; ns++)                  /* fill up: 1024 entries */
        for (int lin = 0; lin < MD_LIN; lin++) {
            cr_assert_geq(kvvm_prefix_publish(t.kv, s[lin], (uint64_t)ns + 1, k[lin], MD_NB),
                          0);
            memset(m[ns][lin], 1, sizeof m[ns][lin]);
        }
    md_verify(&t, m, k, "full", 1500);
    /* lookups past one run of 64 probes, with where: all the keys of a namespace at once */
    uint8_t w[MD_LIN * MD_NB];
    const kvvm_key *all = &k[0][0];
    memset(w, 0, sizeof w);
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 2, all, MD_LIN * MD_NB, w), MD_LIN * MD_NB);
    for (int b = 0; b < MD_LIN * MD_NB; b++)
        cr_assert_eq(w[b], KVVM_TIER_DEVICE, "where[%d]", b);
    cr_assert_eq(kvvm_prefix_drop(t.kv, 2, &k[2][3], 1), 1);      /* key 131 */
    memset(w, 0, sizeof w);
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 2, all, MD_LIN * MD_NB, w), 2 * MD_NB + 3);
    cr_assert(w[2 * MD_NB + 2] == KVVM_TIER_DEVICE && w[2 * MD_NB + 3] == 0);
    m[1][2][3] = false;
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_assert_eq(st.prefix_entries, MD_NS * MD_LIN * MD_NB - 1);
    for (int lin = 0; lin < MD_LIN; lin++)
        cr_assert(same(&t, s[lin], (uint64_t)MD_NB * T, (uint32_t)lin + 1));
    tclose(&t);
}

/* What a failed publish must leave as it was: the stats, where the publisher is and its
   bytes, and no entry of the keys it was given beyond those present before. */
struct pub_snap {
    struct kvvm_stats st;
    struct th_place pl;
};

static void pub_snap(struct tctx *t, kvvm_seq s, struct pub_snap *p)
{
    memset(p, 0, sizeof *p);
    tstats(t, &p->st);
    th_places(t->kv, &s, 1, &p->pl);
}

/* After a publish of keys k[0..n) by s (lineage lin, nb blocks) failed: nothing changed, the
   entries present before (the `present` leading keys of k) still there, no other. */
static void pub_unchanged(struct tctx *t, kvvm_seq s, uint32_t lin, uint64_t nb,
                          const struct pub_snap *before, const kvvm_key *k, size_t n,
                          int present, const char *where)
{
    struct pub_snap now;
    pub_snap(t, s, &now);
    UCHK(!memcmp(&now.st, &before->st, sizeof now.st), "%s: the stats changed (entries %lu "
         "-> %lu, device pages free %lu -> %lu)", where,
         (unsigned long)before->st.prefix_entries, (unsigned long)now.st.prefix_entries,
         (unsigned long)before->st.pages_device_free, (unsigned long)now.st.pages_device_free);
    th_places_same(t->kv, &s, 1, &before->pl, where);
    UCHK(kvvm_prefix_lookup(t->kv, 1, k, n, NULL) == present, "%s: entries after a failed "
         "publish", where);
    for (size_t b = (size_t)present; b < n; b++)
        UCHK(kvvm_prefix_lookup(t->kv, 1, &k[b], 1, NULL) == 0, "%s: key %zu entered", where,
             b);
    UCHK(same(t, s, nb * T, lin), "%s: the publisher's bytes", where);
    th_check(t->kv, where);
}

/* docs/api.md: -ENOMEM "no entry record could be had" (the index capped by the testing
   door): the failed publish changes nothing; keys already present need no record (a
   publish of those alone succeeds at the cap), and a publish within it succeeds. */
Test(prefix, publish_without_a_record_is_enomem_and_changes_nothing)
{
    struct tctx t;
    kvvm_key k[4];
    struct pub_snap before;
    open_t(&t, 2, 32, 0, 0);
    kvvm_seq s = mk(&t);
    fill(&t, s, 4 * T, 3);
    keys_of(3, 4, k);
    cr_assert_geq(kvvm_testing_prefix_limits(t.kv, 3, 0), 0);
    pub_snap(&t, s, &before);
    cr_assert_eq(kvvm_prefix_publish(t.kv, s, 1, k, 4), -ENOMEM, "4 entries past a cap of 3");
    pub_unchanged(&t, s, 3, 4, &before, k, 4, 0, "empty index");
    cr_assert_eq(kvvm_prefix_publish(t.kv, s, 1, k, 2), 2);
    pub_snap(&t, s, &before);
    cr_assert_eq(kvvm_prefix_publish(t.kv, s, 1, k, 4), -ENOMEM, "2 present + 2 past the cap");
    pub_unchanged(&t, s, 3, 4, &before, k, 4, 2, "two entries");
    cr_assert_eq(kvvm_prefix_publish(t.kv, s, 1, k, 2), 0, "present keys need no record");
    cr_assert_eq(kvvm_prefix_publish(t.kv, s, 1, k, 3), 1, "the third record");
    cr_assert_eq(kvvm_prefix_publish(t.kv, s, 1, k, 4), -ENOMEM, "a fourth");
    cr_assert_geq(kvvm_testing_prefix_limits(t.kv, 0, 0), 0);
    cr_assert_eq(kvvm_prefix_publish(t.kv, s, 1, k, 4), 1, "no cap: the fourth");
    tcheck(&t, "after");
    tclose(&t);
}

/* ---------------------------------------------------------------- fault sweeps */

struct sw_arg {
    struct tctx t;
    kvvm_key k[3];
    kvvm_seq dst;
    bool host;                           /* entries on the host tier (else device) */
    bool disk;                           /* entries on host and disk: chain y of
                                            two_chains_reclaimed (its head on the host
                                            tier, the rest spilled) */
    uint64_t free0;
    uint8_t where[3];                    /* the entries' tiers before the call */
    char dir[64];
};

static void sw_setup(void *p)
{
    struct sw_arg *a = p;
    struct kvvm_config c;
    if (a->disk) {
        kvvm_key x[3];
        open_tiers(&a->t, a->dir, 2, 16);
        cr_assert_eq(kvvm_seq_truncate(a->t.kv, two_chains_reclaimed(&a->t, x, a->k), 0), 0);
    } else {
        cfg_small(&c, 2, 16, 16, 0);
        topen(&a->t, &c);
        if (a->host)
            host_entries(&a->t, a->k, 3);
        else
            entries_only(&a->t, 1, 8, 3, a->k);
    }
    a->dst = mk(&a->t);
    cr_assert_eq(kvvm_sync(a->t.kv), 0);
    struct kvvm_stats st;
    tstats(&a->t, &st);
    a->free0 = st.pages_device_free;
    cr_assert_eq(kvvm_prefix_lookup(a->t.kv, 1, a->k, 3, a->where), 3);
}

static int sw_call(void *p)
{
    struct sw_arg *a = p;
    int rc = kvvm_prefix_attach(a->t.kv, a->dst, 1, a->k, 3);
    return rc == 3 ? 0 : rc;
}

static void sw_teardown(void *p)
{
    struct sw_arg *a = p;
    if (a->t.kv && a->disk)
        close_tiers(&a->t, a->dir);
    else if (a->t.kv)
        tclose(&a->t);
}

static enum th_sweep_outcome sw_after(void *p, int rc, const char *where)
{
    struct sw_arg *a = p;
    if (rc == -EIO)
        return TH_SWEEP_DEAD;
    struct kvvm_seq_info in;
    tinfo(&a->t, a->dst, &in);
    uint8_t w[3] = { 0 };
    int k = kvvm_prefix_lookup(a->t.kv, 1, a->k, 3, w);
    UCHK(k == 3, "%s: the entries are gone (%d)", where, k);
    if (rc) {
        UCHK(in.length == 0, "%s: dst holds %lu tokens after a failed attach", where,
             (unsigned long)in.length);
        for (int i = 0; i < 3; i++)
            UCHK(w[i] == a->where[i], "%s: entry %d moved (%u, was %u)", where, i, w[i],
                 a->where[i]);
        struct kvvm_stats st;
        tstats(&a->t, &st);
        UCHK(st.pages_device_free == a->free0, "%s: device pages free %lu, were %lu", where,
             (unsigned long)st.pages_device_free, (unsigned long)a->free0);
    } else {
        UCHK(in.length == 3 * T && same(&a->t, a->dst, 3 * T, a->disk ? 2 : 8),
             "%s: attached bytes", where);
    }
    th_check(a->t.kv, where);
    return rc ? TH_SWEEP_FAILED : TH_SWEEP_ABSORBED;
}

Test(sweep, attach_host_entries_all_or_nothing)
{
    TH_DEADLINE(300);
    struct sw_arg a = { .host = true };
    struct th_sweep s = { .name = "attach host", .arg = &a, .setup = sw_setup,
                          .call = sw_call, .teardown = sw_teardown, .after = sw_after };
    th_sweep_run(&s);
}

/* The attach of entries on disk (and host): the driver calls of the read back and the copies
   up, each failed in turn. */
Test(sweep, attach_disk_entries_all_or_nothing)
{
    TH_DEADLINE(300);
    kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);     /* the injected errors are logged */
    struct sw_arg a = { .disk = true };
    struct th_sweep s = { .name = "attach disk", .arg = &a, .setup = sw_setup,
                          .call = sw_call, .teardown = sw_teardown, .after = sw_after };
    th_sweep_run(&s);
}

Test(sweep, attach_device_entries_all_or_nothing)
{
    TH_DEADLINE(300);
    struct sw_arg a = { .host = false };
    struct th_sweep s = { .name = "attach device", .arg = &a, .setup = sw_setup,
                          .call = sw_call, .teardown = sw_teardown, .after = sw_after };
    th_sweep_run(&s);
}

/* The allocation-failure sweep of publish (it makes no driver call: the driver sweep has
   nothing to fail): each allocation of the index a publish makes (its page ids, record
   growth, the slots' rebuild) failed in turn, each failing publish -ENOMEM and changing
   nothing; the sweep ends at the first point past the publish's last allocation. Two
   starting states: an empty index (its first records and slots), and one of 62 entries
   whose publish of 2 present + 3 new keys grows the records (64 -> 128) and rebuilds the
   slots (128 -> 256) with the entries in them. */
static void publish_sweep(uint32_t have)
{
    unsigned failed = 0;
    for (uint32_t at = 1;; at++) {
        struct tctx t;
        kvvm_key old[64], k[5];
        struct pub_snap before;
        char where[64];
        snprintf(where, sizeof where, "%u entries, allocation %u failed", have, at);
        open_t(&t, 1, 80, 0, 0);
        kvvm_seq s = mk(&t);
        fill(&t, s, 64 * T, 4);
        keys_of(5, 64, old);
        if (have)
            cr_assert_eq(kvvm_prefix_publish(t.kv, s, 1, old, have), (int)have);
        keys_of(4, 5, k);
        if (have) {                     /* two present keys */
            k[0] = old[0];
            k[1] = old[1];
        }
        int want = have ? 3 : 5, present = have ? 2 : 0;
        pub_snap(&t, s, &before);
        cr_assert_geq(kvvm_testing_prefix_limits(t.kv, 0, at), 0);
        int rc = kvvm_prefix_publish(t.kv, s, 1, k, 5);
        long made = kvvm_testing_prefix_limits(t.kv, 0, 0);
        if (rc == want) {
            cr_assert_lt(made, (long)at, "%s: the publish succeeded through it", where);
            tcheck(&t, where);
            tclose(&t);
            break;
        }
        cr_assert_eq(rc, -ENOMEM, "%s: publish returned %d", where, rc);
        pub_unchanged(&t, s, 4, 64, &before, k, 5, present, where);
        failed++;
        tclose(&t);
    }
    printf("sweep publish (%u entries): %u allocations failed in turn, each publish -ENOMEM "
           "and nothing changed\n", have, failed);
    cr_assert_geq(failed, 5u, "the sweep reached every allocation of the index");
}

Test(sweep, publish_allocation_failures_change_nothing)
{
    TH_DEADLINE(300);
    publish_sweep(0);
    publish_sweep(62);
}

/* ---------------------------------------------------------------- entries a call's moves dropped */

/* Issue 31 (the model test with prefix calls, 4k/4+auto+prefix): a call's reclaim plan
   drops entries no sequence holds, leaves first (x1 on the host tier, y0 on the host tier,
   then x1's parent x0 on the device), and swaps a LIVE sequence out into a host tier those
   entries fill (no disk tier: their host pages count as room). The swap-out's host room
   dropped x1 and y0 at once, then the plan's entry step, after the moves, acted on their
   freed records: x1 taken again and removed a second time when the call ended (a crash in
   the release build, an assertion in the debug one). The state before the grow of g: device
   8 pages (x0 1, live 2, 5 free), host 3 slots (x1, y0, 1 free... none: x0's slot went with
   its attach, live's swap-out takes 2). */
struct hd {
    struct tctx t;
    kvvm_key x[2], y[1];
    kvvm_seq live, g;
    struct th_snap seqs, xs, ys;
};

static void hd_setup(void *p)
{
    struct hd *h = p;
    struct kvvm_config c;
    cfg_small(&c, 1, 8, 3, KVVM_F_AUTO_SWAP);
    c.device_min = c.device_low = c.device_high = 0;   /* only the calls reclaim */
    c.host_min = c.host_low = c.host_high = 0;
    topen(&h->t, &c);
    kvvm_seq s = published(&h->t, 1, 1, 2, 0, h->x);
    cr_assert_eq(kvvm_seq_swap_out(h->t.kv, s), 0);
    cr_assert_eq(kvvm_seq_free(h->t.kv, s), 0);
    kvvm_seq u = published(&h->t, 1, 2, 1, 0, h->y);
    cr_assert_eq(kvvm_seq_swap_out(h->t.kv, u), 0);
    cr_assert_eq(kvvm_seq_free(h->t.kv, u), 0);
    kvvm_seq b = mk(&h->t);
    cr_assert_eq(kvvm_prefix_attach(h->t.kv, b, 1, h->x, 1), 1, "attach: %s",
                 kvvm_last_error());
    cr_assert_eq(kvvm_seq_free(h->t.kv, b), 0);       /* x0 on the device, x1 y0 below */
    h->live = mk(&h->t);
    fill(&h->t, h->live, 2 * T, 3);
    h->g = mk(&h->t);
    cr_assert_eq(kvvm_step(h->t.kv), 0);               /* live unprotected: a victim */
    cr_assert_eq(kvvm_step(h->t.kv), 0);
    cr_assert_eq(kvvm_sync(h->t.kv), 0);
    kvvm_seq all[2] = { h->live, h->g };
    th_snap_take(h->t.kv, &h->seqs, all, 2, 1, NULL, 0);
    th_snap_take(h->t.kv, &h->xs, NULL, 0, 1, h->x, 2);
    th_snap_take(h->t.kv, &h->ys, NULL, 0, 1, h->y, 1);
    cr_assert_eq(h->xs.found, 2, "the setup: x0 x1 present");
    cr_assert(h->xs.where[0] == KVVM_TIER_DEVICE && h->xs.where[1] == KVVM_TIER_HOST &&
              h->ys.where[0] == KVVM_TIER_HOST, "the setup: tiers %u %u %u", h->xs.where[0],
              h->xs.where[1], h->ys.where[0]);
}

static int hd_call(void *p)
{
    struct hd *h = p;
    return kvvm_seq_grow(h->t.kv, h->g, 8 * T);
}

static void hd_teardown(void *p)
{
    tclose(&((struct hd *)p)->t);
}

/* A success took x0 (its frame) and the host entries live's host room needed, and swapped
   live out; a failure changed nothing, or reports that what its moves dropped could not be
   undone. */
static enum th_sweep_outcome hd_after(void *p, int rc, const char *where)
{
    struct hd *h = p;
    if (rc == -EIO) {
        UCHK(strstr(kvvm_last_error(), "could not be undone") != NULL, "%s: -EIO: %s", where,
             kvvm_last_error());
    } else if (rc) {
        UCHK(rc == -ENOMEM, "%s: returned %d", where, rc);
        th_snap_same(h->t.kv, &h->seqs, where);
        th_snap_same(h->t.kv, &h->xs, where);
        th_snap_same(h->t.kv, &h->ys, where);
    } else {
        struct kvvm_stats st;
        tstats(&h->t, &st);
        uint8_t w[1] = { 0 };
        /* x0 went for its frame, the host entries as far as live's host room needed them
           (an entry with no page on the device frees no frame: not planned) */
        UCHK(st.prefix_entries <= 1, "%s: %lu entries left", where,
             (unsigned long)st.prefix_entries);
        UCHK(kvvm_prefix_lookup(h->t.kv, 1, h->x, 1, NULL) == 0, "%s: x0 left", where);
        UCHK(kvvm_prefix_lookup(h->t.kv, 1, h->y, 1, w) == 0 || w[0] == KVVM_TIER_HOST,
             "%s: y0 left in tier %u", where, w[0]);
    }
    th_check(h->t.kv, where);
    if (!rc || rc == -EIO) {
        UCHK(kvvm_seq_truncate(h->t.kv, h->g, 0) == 0, "%s: truncate", where);
        UCHK(kvvm_seq_swap_in(h->t.kv, h->live) == 0, "%s: swap_in: %s", where,
             kvvm_last_error());
    }
    UCHK(same(&h->t, h->live, 2 * T, 3), "%s: live's bytes", where);
    return rc ? TH_SWEEP_FAILED : TH_SWEEP_ABSORBED;
}

Test(regress, reclaim_took_entries_its_swap_out_had_dropped)
{
    TH_DEADLINE(300);
    struct hd h;
    memset(&h, 0, sizeof h);
    hd_setup(&h);
    int rc = hd_call(&h);
    cr_assert_eq(rc, 0, "grow: %d (%s)", rc, kvvm_last_error());
    cr_assert_eq(hd_after(&h, rc, "grow"), TH_SWEEP_ABSORBED);
    tcheck(&h.t, "after");
    hd_teardown(&h);
    /* the same grow with the driver refusing a map, copy or synchronization in turn: the
       entries the swap-out's host room dropped are no move an undo takes back */
    kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);            /* the refusals are logged */
    struct th_sweep s = { .name = "grow taking host entries", .arg = &h, .setup = hd_setup,
                          .call = hd_call, .teardown = hd_teardown, .after = hd_after };
    th_refusals_run_use(&s);
}

/* Issue 31 (the model test with prefix calls, 4k/2+disk+auto+prefix): a call's reclaim
   demoted entries no sequence holds (KVVM_F_CACHE_DEMOTE, room on the host tier) and the
   driver then refused a map, copy or synchronization: the call failed -ENOMEM with the
   entries left on the host tier (the journal took back swap-outs and drops, not the cache's
   demotions). A failed call brings them back up (or, where a demotion's own copy was
   refused and it fell back to a drop, says -EIO "could not be undone"). Device 8 pages:
   x0 x1 (no holder) and 6 free; a grow of g to 8 blocks demotes both. */
struct dm {
    struct tctx t;
    char dir[64];
    kvvm_key x[2];
    kvvm_seq g;
    struct th_snap seqs, xs;
};

static void dm_setup(void *p)
{
    struct dm *d = p;
    open_tiers(&d->t, d->dir, 8, 0);
    entries_only(&d->t, 1, 1, 2, d->x);
    d->g = mk(&d->t);
    cr_assert_eq(kvvm_sync(d->t.kv), 0);
    th_snap_take(d->t.kv, &d->seqs, &d->g, 1, 1, NULL, 0);
    th_snap_take(d->t.kv, &d->xs, NULL, 0, 1, d->x, 2);
    cr_assert(d->xs.found == 2 && d->xs.where[0] == KVVM_TIER_DEVICE &&
              d->xs.where[1] == KVVM_TIER_DEVICE, "the setup: x on the device");
}

static int dm_call(void *p)
{
    struct dm *d = p;
    return kvvm_seq_grow(d->t.kv, d->g, 8 * T);
}

static void dm_teardown(void *p)
{
    struct dm *d = p;
    close_tiers(&d->t, d->dir);
}

static enum th_sweep_outcome dm_after(void *p, int rc, const char *where)
{
    struct dm *d = p;
    if (rc == -EIO) {
        UCHK(strstr(kvvm_last_error(), "could not be undone") != NULL, "%s: -EIO: %s", where,
             kvvm_last_error());
    } else if (rc) {
        UCHK(rc == -ENOMEM, "%s: returned %d", where, rc);
        th_snap_same(d->t.kv, &d->seqs, where);
        th_snap_same(d->t.kv, &d->xs, where);
    }
    /* what is left of x (all of it after a failure; after a success, on the host tier but
       where a refused demotion copy fell back to a drop) attaches with its bytes */
    uint8_t w[2] = { 0 };
    int found = kvvm_prefix_lookup(d->t.kv, 1, d->x, 2, w);
    for (int i = 0; !rc && i < found; i++)
        UCHK(w[i] == KVVM_TIER_HOST, "%s: x%d not demoted (tier %u)", where, i, w[i]);
    UCHK(rc == -EIO || !rc || found == 2, "%s: %d of x left", where, found);
    th_check(d->t.kv, where);
    UCHK(kvvm_seq_truncate(d->t.kv, d->g, 0) == 0, "%s: truncate", where);
    kvvm_seq b = mk(&d->t);
    int n = kvvm_prefix_attach(d->t.kv, b, 1, d->x, 2);
    UCHK(n == found && (n == 0 || same(&d->t, b, (uint64_t)n * T, 1)), "%s: attach %d of "
         "%d, bytes", where, n, found);
    return rc ? TH_SWEEP_FAILED : TH_SWEEP_ABSORBED;
}

Test(regress, failed_call_left_entries_its_reclaim_demoted)
{
    TH_DEADLINE(300);
    struct dm d;
    memset(&d, 0, sizeof d);
    dm_setup(&d);
    cr_assert_eq(dm_call(&d), 0, "grow: %s", kvvm_last_error());
    cr_assert_eq(dm_after(&d, 0, "grow"), TH_SWEEP_ABSORBED);
    dm_teardown(&d);
    kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);            /* the refusals are logged */
    struct th_sweep s = { .name = "grow demoting entries", .arg = &d, .setup = dm_setup,
                          .call = dm_call, .teardown = dm_teardown, .after = dm_after };
    th_refusals_run_use(&s);
}

/* Victims that share pages (a parent p of 3 blocks and its fork f, sharing blocks 0 and 1)
   swapped out by a grow's reclaim into a host tier full of entries no sequence holds, with
   no disk tier: the plan counts those entries' host pages as room, and every move of the
   act (each victim's own pages, the shared pages the last of them takes down) gets its
   slots by dropping them (docs/api.md "Below the host tier"). In both modes. */
static void shared_victims_room(bool stream_mode)
{
    struct tctx t;
    struct kvvm_config c;
    kvvm_key x[4];
    void *stream = NULL;
    cfg_small(&c, 1, 8, 4, KVVM_F_AUTO_SWAP);
    c.device_min = c.device_low = c.device_high = 0;   /* only the calls reclaim */
    c.host_min = c.host_low = c.host_high = 0;
    if (stream_mode)
        topen_stream(&t, &c, &stream);
    else
        topen(&t, &c);
    kvvm_seq s = published(&t, 1, 1, 4, 0, x);
    cr_assert_eq(kvvm_seq_swap_out(t.kv, s), 0);
    cr_assert_eq(kvvm_seq_free(t.kv, s), 0);        /* x0..x3: the host tier, full */
    kvvm_seq p = mk(&t), f;
    fill(&t, p, 3 * T, 3);
    cr_assert_eq(kvvm_seq_fork(t.kv, p, &f), 0);
    uint8_t b[BPT];
    memset(b, 0x77, sizeof b);
    cr_assert_eq(kvvm_seq_write(t.kv, f, 0, 2 * T * BPT, b, sizeof b), 0);  /* f's own */
    kvvm_seq g = mk(&t);
    cr_assert_eq(kvvm_step(t.kv), 0);                /* p and f unprotected: victims */
    cr_assert_eq(kvvm_step(t.kv), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_assert(st.pages_host_free == 0 && st.pages_device_free == 4, "the setup: host %lu "
              "free, device %lu", (unsigned long)st.pages_host_free,
              (unsigned long)st.pages_device_free);
    int rc = kvvm_seq_grow(t.kv, g, 8 * T);          /* 8 frames: p's and f's 4 too */
    cr_assert_eq(rc, 0, "grow: %d (%s)", rc, kvvm_last_error());
    tstats(&t, &st);
    cr_assert_eq(st.prefix_entries, 0, "the entries were not dropped for the host room");
    tcheck(&t, "grown");
    cr_assert_eq(kvvm_seq_truncate(t.kv, g, 0), 0);
    cr_assert_eq(kvvm_seq_swap_in(t.kv, p), 0, "swap_in: %s", kvvm_last_error());
    cr_assert_eq(kvvm_seq_swap_in(t.kv, f), 0, "swap_in: %s", kvvm_last_error());
    cr_assert(same(&t, p, 3 * T, 3) && same(&t, f, 2 * T, 3), "bytes");
    tcheck(&t, "swapped in");
    if (stream_mode)
        tclose_stream(&t, stream);
    else
        tclose(&t);
}

Test(below, shared_victims_take_room_from_host_entries)
{
    TH_DEADLINE(60);
    shared_victims_room(true);
    shared_victims_room(false);
}

/* Issue 31 (the model test with prefix calls, 4k/4+auto+prefix, seed 102 op 312404 at
   KVVMTEST_SCALE=2): a call's reclaim planned the drop of a CACHED fork (f, no page of its
   own: it frees nothing) and then the swap-out of its LIVE parent p (the last resident
   holder of their pages once f is gone: p's frees and host slots), the host room for p's
   pages from entries no sequence holds (no disk tier). The call's reclaim acted its drops
   last: p went out while f still held the pages on the device (nothing freed), the prefix
   cache's planned entries (all on the host tier) were stashed, and f's drop left the pages
   orphans whose host room the stashed entries no longer gave: the call failed -ENOMEM
   after its moves (the model: an undo that could not map f's pages back, -EIO). A drop
   whose stash takes no host slot is now stashed before the moves, where the plan counted
   it. */
static void cached_fork_drop(bool stream_mode, bool entry_on_device)
{
    struct tctx t;
    struct kvvm_config c;
    kvvm_key x[4];
    void *stream = NULL;
    cfg_small(&c, 1, 8, 4, KVVM_F_AUTO_SWAP);
    c.device_min = c.device_low = c.device_high = 0;   /* only the calls reclaim */
    c.host_min = c.host_low = c.host_high = 0;
    if (stream_mode)
        topen_stream(&t, &c, &stream);
    else
        topen(&t, &c);
    kvvm_seq s = published(&t, 1, 1, 4, 0, x);
    cr_assert_eq(kvvm_seq_swap_out(t.kv, s), 0);
    cr_assert_eq(kvvm_seq_free(t.kv, s), 0);        /* x0..x3: the host tier, full */
    if (entry_on_device) {
        kvvm_key z[1];
        kvvm_seq q = published(&t, 2, 2, 1, 0, z);
        cr_assert_eq(kvvm_seq_free(t.kv, q), 0);    /* z0: a device page, no holder */
    }
    kvvm_seq p = mk(&t), f;
    fill(&t, p, 3 * T, 3);
    cr_assert_eq(kvvm_seq_fork(t.kv, p, &f), 0);    /* f: p's 3 pages, none of its own */
    cr_assert_eq(kvvm_seq_set_class(t.kv, f, KVVM_SEQ_CACHED), 0);
    kvvm_seq g = mk(&t);
    cr_assert_eq(kvvm_step(t.kv), 0);                /* p and f unprotected: victims */
    cr_assert_eq(kvvm_step(t.kv), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_assert(st.pages_host_free == 0 && st.pages_device_free == (entry_on_device ? 4 : 5),
              "the setup: host %lu free, device %lu", (unsigned long)st.pages_host_free,
              (unsigned long)st.pages_device_free);
    /* 8 frames: those free, z0's (the cache's plan: x0..x3 too, least recently used, all
       on the host tier: they free no frame), p's 3 (its pages orphans once f's stash job
       is reaped, moved down into the host room of entries x0..x3) */
    int rc = kvvm_seq_grow(t.kv, g, 8 * T);
    cr_assert_eq(rc, 0, "grow: %d (%s)", rc, kvvm_last_error());
    struct kvvm_seq_info in = { .size = sizeof in };
    cr_assert_eq(kvvm_seq_info(t.kv, f, &in), 0);
    cr_assert(in.dropped, "f was not dropped");
    cr_assert_eq(kvvm_seq_info(t.kv, p, &in), 0);
    cr_assert(!in.resident && in.pages_host == 3, "p: resident %d, %u host pages",
              in.resident, in.pages_host);
    tcheck(&t, "grown");
    cr_assert_eq(kvvm_seq_truncate(t.kv, g, 0), 0);
    cr_assert_eq(kvvm_seq_swap_in(t.kv, p), 0, "swap_in: %s", kvvm_last_error());
    cr_assert(same(&t, p, 3 * T, 3), "p's bytes");
    tcheck(&t, "swapped in");
    if (stream_mode)
        tclose_stream(&t, stream);
    else
        tclose(&t);
}

Test(regress, reclaim_short_when_a_cached_fork_dropped_after_its_parent)
{
    TH_DEADLINE(60);
    cached_fork_drop(false, true);
    cached_fork_drop(true, true);
}

/* Issue 31 (the model test, 4k/4+auto+prefix, seed 202 op 101718 at KVVMTEST_SCALE=2): a
   call's reclaim planned the drop of CACHED f (a fork of p with a page of its own) and the
   swap-out of p, whose pages f shares (p's frees and host slots once f is gone). p went out
   first, leaving the shared pages on the device (its job held them); f's stash then took
   the host slots free as they were, the ones the plan had counted for those pages, which
   went down as orphans only after the wait: no slot was left, and the call failed after its
   moves. A stash now takes only the room the plan left (none here: f is parked). The host
   tier: 4 slots, u's page in one. */
static void stash_room(bool stream_mode)
{
    struct tctx t;
    struct kvvm_config c;
    void *stream = NULL;
    cfg_small(&c, 1, 8, 4, KVVM_F_AUTO_SWAP);
    c.device_min = c.device_low = c.device_high = 0;   /* only the calls reclaim */
    c.host_min = c.host_low = c.host_high = 0;
    if (stream_mode)
        topen_stream(&t, &c, &stream);
    else
        topen(&t, &c);
    kvvm_seq u = mk(&t);
    fill(&t, u, T, 5);
    cr_assert_eq(kvvm_seq_swap_out(t.kv, u), 0);
    kvvm_seq p = mk(&t), f;
    fill(&t, p, 3 * T, 3);
    cr_assert_eq(kvvm_seq_fork(t.kv, p, &f), 0);
    uint8_t b[BPT];
    memset(b, 0x77, sizeof b);
    cr_assert_eq(kvvm_seq_write(t.kv, f, 0, 2 * T * BPT, b, sizeof b), 0);  /* f's own */
    cr_assert_eq(kvvm_seq_set_class(t.kv, f, KVVM_SEQ_CACHED), 0);
    kvvm_seq g = mk(&t);
    cr_assert_eq(kvvm_step(t.kv), 0);                /* p and f unprotected: victims */
    cr_assert_eq(kvvm_step(t.kv), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_assert(st.pages_host_free == 3 && st.pages_device_free == 4, "the setup: host %lu "
              "free, device %lu", (unsigned long)st.pages_host_free,
              (unsigned long)st.pages_device_free);
    int rc = kvvm_seq_grow(t.kv, g, 8 * T);          /* 8 frames: 4 free, f's 1, p's 3 */
    cr_assert_eq(rc, 0, "grow: %d (%s)", rc, kvvm_last_error());
    struct kvvm_seq_info in = { .size = sizeof in };
    cr_assert_eq(kvvm_seq_info(t.kv, f, &in), 0);
    cr_assert(in.dropped, "f was not dropped");
    tcheck(&t, "grown");
    cr_assert_eq(kvvm_seq_truncate(t.kv, g, 0), 0);
    cr_assert_eq(kvvm_seq_swap_in(t.kv, p), 0, "swap_in: %s", kvvm_last_error());
    cr_assert_eq(kvvm_seq_swap_in(t.kv, u), 0, "swap_in: %s", kvvm_last_error());
    cr_assert(same(&t, p, 3 * T, 3) && same(&t, u, T, 5), "bytes");
    tcheck(&t, "swapped in");
    if (stream_mode)
        tclose_stream(&t, stream);
    else
        tclose(&t);
}

Test(regress, stash_took_the_host_room_of_a_victims_left_pages)
{
    TH_DEADLINE(60);
    stash_room(false);
    stash_room(true);
}

/* Issue 31 (the model test, 4k/4+auto+prefix, seeds 302 and 402 at KVVMTEST_SCALE=2: "1 of
   N moves not taken back (first error -116)"): the stash_room grow with the driver refusing
   a map, set-access, copy or synchronization after its reclaim (each call in turn). f was
   parked (dropped at once), which left p's pages it shared orphans on the device; the act
   moved them down after the wait (the frames the plan counted). The undo took the park
   back first, found f's shared pages no longer on the device and gave up: the failed call
   returned -EIO with f dropped. The orphans moved down after a park now come back before
   it (the journal's reverse order), and the park maps them in their new frames. */
struct park_orph {
    struct tctx t;
    bool stream;
    void *st;
    kvvm_seq u, p, f, g;
    struct th_snap seqs;
};

static void park_orph_setup(void *arg)
{
    struct park_orph *a = arg;
    struct kvvm_config c;
    cfg_small(&c, 1, 8, 4, KVVM_F_AUTO_SWAP);
    c.device_min = c.device_low = c.device_high = 0;   /* only the calls reclaim */
    c.host_min = c.host_low = c.host_high = 0;
    if (a->stream)
        topen_stream(&a->t, &c, &a->st);
    else
        topen(&a->t, &c);
    a->u = mk(&a->t);
    fill(&a->t, a->u, T, 5);
    cr_assert_eq(kvvm_seq_swap_out(a->t.kv, a->u), 0);
    a->p = mk(&a->t);
    fill(&a->t, a->p, 3 * T, 3);
    cr_assert_eq(kvvm_seq_fork(a->t.kv, a->p, &a->f), 0);
    uint8_t b[BPT];
    memset(b, 0x77, sizeof b);
    cr_assert_eq(kvvm_seq_write(a->t.kv, a->f, 0, 2 * T * BPT, b, sizeof b), 0);
    cr_assert_eq(kvvm_seq_set_class(a->t.kv, a->f, KVVM_SEQ_CACHED), 0);
    a->g = mk(&a->t);
    cr_assert_eq(kvvm_step(a->t.kv), 0);             /* p and f unprotected: victims */
    cr_assert_eq(kvvm_step(a->t.kv), 0);
    cr_assert_eq(kvvm_sync(a->t.kv), 0);
    kvvm_seq all[4] = { a->u, a->p, a->f, a->g };
    th_snap_take(a->t.kv, &a->seqs, all, 4, 0, NULL, 0);
}

static int park_orph_call(void *arg)
{
    struct park_orph *a = arg;                       /* 8 frames: 4 free, f's 1, p's 3 */
    return kvvm_seq_grow(a->t.kv, a->g, 8 * T);
}

static void park_orph_teardown(void *arg)
{
    struct park_orph *a = arg;
    if (a->stream)
        tclose_stream(&a->t, a->st);
    else
        tclose(&a->t);
}

/* f's own page (its token 2 * T: 0x77, then p's bytes) read back whole */
static bool park_orph_f_same(struct park_orph *a)
{
    uint8_t b[T * BPT];
    cr_assert_eq(kvvm_seq_read(a->t.kv, a->f, 0, 2 * T * BPT, b, sizeof b), 0, "read: %s",
                 kvvm_last_error());
    for (size_t i = 0; i < sizeof b; i++)
        if (b[i] != (i < BPT ? 0x77 : pat(3, 0, 2 * T * BPT + i)))
            return false;
    return same(&a->t, a->f, 2 * T, 3);
}

static enum th_sweep_outcome park_orph_after(void *arg, int rc, const char *where)
{
    struct park_orph *a = arg;
    UCHK(rc != -EIO, "%s: -EIO: %s", where, kvvm_last_error());
    if (rc == -EIO)
        return TH_SWEEP_DEAD;
    if (rc) {
        UCHK(rc == -ENOMEM, "%s: returned %d", where, rc);
        th_snap_same(a->t.kv, &a->seqs, where);
        UCHK(park_orph_f_same(a), "%s: f's bytes", where);
    }
    th_check(a->t.kv, where);
    UCHK(kvvm_seq_truncate(a->t.kv, a->g, 0) == 0, "%s: truncate", where);
    UCHK(kvvm_seq_swap_in(a->t.kv, a->p) == 0 && kvvm_seq_swap_in(a->t.kv, a->u) == 0,
         "%s: swap_in: %s", where, kvvm_last_error());
    UCHK(same(&a->t, a->p, 3 * T, 3) && same(&a->t, a->u, T, 5), "%s: bytes", where);
    return rc ? TH_SWEEP_FAILED : TH_SWEEP_ABSORBED;
}

Test(regress, park_undo_found_its_shared_pages_moved_down_as_orphans)
{
    TH_DEADLINE(300);
    kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);        /* the refusals are logged */
    for (int stream = 0; stream < 2; stream++) {
        struct park_orph a = { .stream = stream };
        struct th_sweep s = { .name = stream ? "parked drop, orphans (stream)"
                                             : "parked drop, orphans",
                              .arg = &a, .setup = park_orph_setup, .call = park_orph_call,
                              .teardown = park_orph_teardown, .after = park_orph_after };
        th_refusals_run_use(&s);
    }
}

/* The same for the prefix cache's stash (seed 402 op 220417): p and its fork f both LIVE
   victims (the first to go frees nothing), z0 an entry with a device page no sequence
   holds, planned as a drop; its stash took a host slot the plan counted for the pages the
   siblings left behind. It is dropped now (the room the plan left: none). */
static void entry_stash_room(bool stream_mode)
{
    struct tctx t;
    struct kvvm_config c;
    void *stream = NULL;
    cfg_small(&c, 1, 8, 4, KVVM_F_AUTO_SWAP);
    c.device_min = c.device_low = c.device_high = 0;   /* only the calls reclaim */
    c.host_min = c.host_low = c.host_high = 0;
    if (stream_mode)
        topen_stream(&t, &c, &stream);
    else
        topen(&t, &c);
    kvvm_seq u = mk(&t);
    fill(&t, u, T, 5);
    cr_assert_eq(kvvm_seq_swap_out(t.kv, u), 0);
    kvvm_key z[1];
    kvvm_seq q = published(&t, 2, 2, 1, 0, z);
    cr_assert_eq(kvvm_seq_free(t.kv, q), 0);        /* z0: a device page, no holder */
    kvvm_seq p = mk(&t), f;
    fill(&t, p, 3 * T, 3);
    cr_assert_eq(kvvm_seq_fork(t.kv, p, &f), 0);
    kvvm_seq g = mk(&t);
    cr_assert_eq(kvvm_step(t.kv), 0);                /* p and f unprotected: victims */
    cr_assert_eq(kvvm_step(t.kv), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_assert(st.pages_host_free == 3 && st.pages_device_free == 4, "the setup: host %lu "
              "free, device %lu", (unsigned long)st.pages_host_free,
              (unsigned long)st.pages_device_free);
    int rc = kvvm_seq_grow(t.kv, g, 8 * T);          /* 8 frames: 4 free, z0's, p's 3 */
    cr_assert_eq(rc, 0, "grow: %d (%s)", rc, kvvm_last_error());
    tcheck(&t, "grown");
    cr_assert_eq(kvvm_seq_truncate(t.kv, g, 0), 0);
    cr_assert_eq(kvvm_seq_swap_in(t.kv, p), 0, "swap_in: %s", kvvm_last_error());
    cr_assert_eq(kvvm_seq_swap_in(t.kv, f), 0, "swap_in: %s", kvvm_last_error());
    cr_assert(same(&t, p, 3 * T, 3) && same(&t, f, 3 * T, 3), "bytes");
    tcheck(&t, "swapped in");
    if (stream_mode)
        tclose_stream(&t, stream);
    else
        tclose(&t);
}

Test(regress, entry_stash_took_the_host_room_of_a_victims_left_pages)
{
    TH_DEADLINE(60);
    entry_stash_room(false);
    entry_stash_room(true);
}

/* Issue 31 (the model test with prefix calls, 64k/1+demote+prefix, seed 103 op 180102 at
   KVVMTEST_SCALE=1): an orphan's move down (paging/orphan.c, tier_page_down) asked the
   policy for host room only with a disk tier, so without one an orphan found the host tier
   full of entries no sequence holds, whose drop the plan had counted as its room: the act
   came short of frames and the call failed after its moves. Here p's pages are such
   orphans (p went out while f's stash job held them), the host tier full of x0..x3. */
Test(regress, orphan_move_asked_no_host_room_without_a_disk_tier)
{
    TH_DEADLINE(60);
    cached_fork_drop(false, false);
    cached_fork_drop(true, false);
}

/* Issue 31 (the model test with prefix calls, 4k/4+auto+prefix, seed 102 op 118513 at
   KVVMTEST_SCALE=1): an explicit swap-out into a host tier full of entries no sequence
   holds (no disk tier) drops some of them for its host room, then the driver refused a
   call of its own (cuCtxGetCurrent, a copy, ...): -ENOMEM with the entries gone, which no
   undo can bring back (their slots were the room). Such drops are now counted within every
   public call, not only within its reclaim: the call says -EIO "could not be undone"; a
   refusal before them changes nothing. */
struct so {
    struct tctx t;
    char dir[64];
    kvvm_key x[2], y[1];
    kvvm_seq s;
    struct th_snap seqs, xs, ys;
};

static void so_setup(void *p)
{
    struct so *o = p;
    kvvm_seq g = host_full_of_entries(&o->t, o->dir, o->x, o->y);
    (void)g;
    o->s = mk(&o->t);
    fill(&o->t, o->s, 2 * T, 3);
    cr_assert_eq(kvvm_sync(o->t.kv), 0);
    th_snap_take(o->t.kv, &o->seqs, &o->s, 1, 1, NULL, 0);
    th_snap_take(o->t.kv, &o->xs, NULL, 0, 1, o->x, 2);
    th_snap_take(o->t.kv, &o->ys, NULL, 0, 1, o->y, 1);
}

static int so_call(void *p)
{
    struct so *o = p;
    return kvvm_seq_swap_out(o->t.kv, o->s);
}

static void so_teardown(void *p)
{
    struct so *o = p;
    close_tiers(&o->t, o->dir);
}

static enum th_sweep_outcome so_after(void *p, int rc, const char *where)
{
    struct so *o = p;
    if (rc == -EIO) {
        UCHK(strstr(kvvm_last_error(), "could not be undone") != NULL, "%s: -EIO: %s", where,
             kvvm_last_error());
    } else if (rc) {
        UCHK(rc == -ENOMEM, "%s: returned %d", where, rc);
        th_snap_same(o->t.kv, &o->seqs, where);
        th_snap_same(o->t.kv, &o->xs, where);
        th_snap_same(o->t.kv, &o->ys, where);
    }
    th_check(o->t.kv, where);
    if (rc != -ENOMEM)
        (void)kvvm_seq_swap_in(o->t.kv, o->s);
    UCHK(same(&o->t, o->s, 2 * T, 3), "%s: s's bytes", where);
    return rc ? TH_SWEEP_FAILED : TH_SWEEP_ABSORBED;
}

Test(regress, failed_swap_out_dropped_host_entries)
{
    TH_DEADLINE(300);
    kvvm_set_log(NULL, NULL, KVVM_LOG_OFF);            /* the refusals are logged */
    struct so o;
    memset(&o, 0, sizeof o);
    struct th_sweep s = { .name = "swap_out dropping host entries", .arg = &o,
                          .setup = so_setup, .call = so_call, .teardown = so_teardown,
                          .after = so_after };
    th_refusals_run_use(&s);
    const char *const ctx[] = { "cuCtxGetCurrent", "cuCtxSetCurrent" };
    th_refusals_run_on(&s, ctx, 2);
}
