/*
 * tests/test_store_queue.c: the store's back-pressure (docs/api.md "Shared store", issue 36)
 * against a real directory: at most store_queue_bytes of entries wait to be written; past it
 * a publish drops the oldest queued writes (store_dropped) and never waits; the entries kept
 * are the newest and are written once the store answers; store_queue_bytes (the stat) is the
 * bytes queued now. Reads are never queued behind writes: with the store's writes hung (a
 * test hook on the writes' lane) and a backlog queued, a lookup and an attach of another
 * context's entry are answered while the write is still owed (ordering, not time). A
 * store_queue_bytes of 0 is a read-only client.
 */
#include "harness.h"

#include "core/core.h"
#include "store/store.h"
#include "store_server.h"

#define BPT 256u                 /* bytes per token: 16 tokens per 4 KiB page */
#define T   16u
#define NR  2u
#define BLOCK (NR * KB)          /* one entry's payload */

static void cfg_q(struct kvvm_config *c, const char *url, size_t queue_bytes, uint32_t tmo)
{
    th_config(c, KB, NR, BPT, 32, 16 * T, 64, 0, 0);
    c->pool_thread = 0;
    c->store_url = url;
    c->store_timeout_ms = tmo;
    c->store_queue_bytes = queue_bytes;
}

static uint8_t pat(uint32_t lin, uint32_t r, uint64_t off)
{
    return (uint8_t)(lin * 31u + r * 101u + off * 7u + (off >> 8) + 5u);
}

/* The key of prompt lin's first block. */
static void key_of(uint32_t lin, kvvm_key *k)
{
    int32_t tok[T];
    for (uint32_t i = 0; i < T; i++)
        tok[i] = (int32_t)(lin * 1009u + i);
    cr_assert_eq(kvvm_prefix_keys(tok, T, T, NULL, 0, k, 1), 1);
}

/* A one-block sequence of prompt lin's bytes, published under ns (one new entry). */
static kvvm_seq publish1(struct tctx *t, uint64_t ns, uint32_t lin, kvvm_key *k)
{
    kvvm_seq s;
    cr_assert_eq(kvvm_seq_create(t->kv, &s), 0);
    cr_assert_eq(kvvm_seq_grow(t->kv, s, T), 0);
    uint8_t b[T * BPT];
    for (uint32_t r = 0; r < NR; r++) {
        for (size_t i = 0; i < sizeof b; i++)
            b[i] = pat(lin, r, i);
        cr_assert_eq(kvvm_seq_write(t->kv, s, r, 0, b, sizeof b), 0);
    }
    key_of(lin, k);
    cr_assert_eq(kvvm_prefix_publish(t->kv, s, ns, k, 1), 1, "publish: %s", kvvm_last_error());
    return s;
}

static bool same1(struct tctx *t, kvvm_seq s, uint32_t lin)
{
    uint8_t b[T * BPT];
    for (uint32_t r = 0; r < NR; r++) {
        cr_assert_eq(kvvm_seq_read(t->kv, s, r, 0, b, sizeof b), 0);
        for (size_t i = 0; i < sizeof b; i++)
            if (b[i] != pat(lin, r, i))
                return false;
    }
    return true;
}

static const struct store_layout LAY = { NR, BPT, KB };

/* Whether the store holds prompt lin's entry under ns (a raw lookup of its own). */
static bool stored(const char *url, uint64_t ns, uint32_t lin)
{
    struct store *raw;
    kvvm_key k;
    store_key sk;
    key_of(lin, &k);
    memcpy(sk.bytes, k.bytes, sizeof sk.bytes);
    cr_assert_eq(store_open(url, 5000, 0, &raw), 0);
    int rc = store_lookup(raw, &LAY, ns, &sk, 1, NULL);
    store_close(raw);
    cr_assert_geq(rc, 0, "lookup: %d", rc);
    return rc == 1;
}

/* Prompt lin's entry, written to the store by a context of its own (closed after). */
static void publish_elsewhere(const char *url, uint64_t ns, uint32_t lin)
{
    struct kvvm_config c;
    struct tctx t;
    kvvm_key k;
    cfg_q(&c, url, 64u << 20, 5000);
    topen(&t, &c);
    publish1(&t, ns, lin, &k);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    tclose(&t);
    cr_assert(stored(url, ns, lin));
}

/* Waits until the store thread has taken a batch (and is hung writing it). */
static void wait_writing(struct tctx *t)
{
    while (!storeq_test_writing(t->kv->sq))
        usleep(1000);
}

/* A queue of 4 entries (one being written, hung; three queued) and 9 more publishes: each
   past the bound drops the oldest queued write; publish never waits (the write is hung for
   the store's whole timeout, longer than the test's deadline); the stat says 4 blocks
   queued. Meanwhile a lookup and an attach of an entry another context wrote are answered
   from the store (the read lane) while the write is still owed. Once the store answers, the
   newest three are written, the dropped ones never. */
Test(store_queue, oldest_dropped_publish_never_waits_reads_go_first)
{
    TH_DEADLINE(20);
    char dir[64], url[96];
    file_url(dir, sizeof dir, url, sizeof url);
    publish_elsewhere(url, 9, 100);
    struct kvvm_config c;
    struct tctx t;
    kvvm_key k[11];
    cfg_q(&c, url, 4 * BLOCK + BLOCK / 2, 60000);   /* rounds down to 4 entries */
    topen(&t, &c);
    cr_assert_eq(store_test_hang(t.kv->store, STORE_HANG_WRITES), 0);
    publish1(&t, 9, 1, &k[1]);
    wait_writing(&t);
    for (uint32_t i = 2; i <= 10; i++)
        publish1(&t, 9, i, &k[i]);
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_expect_eq(st.store_dropped, 6, "store_dropped %llu", (unsigned long long)st.store_dropped);
    cr_expect_eq(st.store_queue_bytes, 4 * BLOCK, "store_queue_bytes %llu",
                 (unsigned long long)st.store_queue_bytes);
    cr_expect_eq(st.store_puts, 0);
    /* reads while the write is owed: not behind it */
    kvvm_key k0;
    key_of(100, &k0);
    uint8_t where = 0;
    cr_expect_eq(kvvm_prefix_lookup(t.kv, 9, &k0, 1, &where), 1, "the lookup waited");
    cr_expect_eq(where, KVVM_TIER_STORE);
    kvvm_seq d;
    cr_assert_eq(kvvm_seq_create(t.kv, &d), 0);
    cr_expect_eq(kvvm_prefix_attach(t.kv, d, 9, &k0, 1), 1, "the attach waited: %s",
                 kvvm_last_error());
    cr_expect(same1(&t, d, 100), "attached bytes differ");
    cr_expect(storeq_test_writing(t.kv->sq), "the write was no longer owed");
    tstats(&t, &st);
    cr_expect_eq(st.store_puts, 0, "a write went before the reads");
    cr_expect_eq(st.store_gets, 1);
    /* the store answers: the newest three written, the dropped ones never */
    cr_assert_eq(store_test_hang(t.kv->store, 0), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    tstats(&t, &st);
    cr_expect_eq(st.store_queue_bytes, 0);
    cr_expect_eq(st.store_dropped, 6);
    for (uint32_t i = 2; i <= 10; i++)
        cr_expect_eq(stored(url, 9, i), i >= 8, "entry %u: %s", i,
                     i >= 8 ? "not written" : "written, though dropped");
    tclose(&t);
    rmdir_all(dir);
}

/* Every slot is in the write under way: a publish's own new entries are the ones dropped
   (counted), and the publish does not wait either. */
Test(store_queue, bound_all_in_flight_drops_the_new_entries)
{
    TH_DEADLINE(20);
    char dir[64], url[96];
    file_url(dir, sizeof dir, url, sizeof url);
    struct kvvm_config c;
    struct tctx t;
    kvvm_key k[3];
    cfg_q(&c, url, BLOCK, 60000);
    topen(&t, &c);
    cr_assert_eq(store_test_hang(t.kv->store, STORE_HANG_WRITES), 0);
    publish1(&t, 2, 1, &k[0]);
    wait_writing(&t);
    publish1(&t, 2, 2, &k[1]);
    publish1(&t, 2, 3, &k[2]);
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_expect_eq(st.store_dropped, 2);
    cr_expect_eq(st.store_queue_bytes, BLOCK);
    cr_assert_eq(store_test_hang(t.kv->store, 0), 0);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    cr_expect(!stored(url, 2, 2) && !stored(url, 2, 3));
    tclose(&t);
    rmdir_all(dir);
}

/* store_queue_bytes 0: nothing is written (nothing counted as failed), and the store is
   read as usual: lookup and attach of another context's entry. Below one entry's bytes:
   the same. */
static void read_only(size_t queue_bytes)
{
    char dir[64], url[96];
    file_url(dir, sizeof dir, url, sizeof url);
    publish_elsewhere(url, 4, 50);
    struct kvvm_config c;
    struct tctx t;
    kvvm_key k, k0;
    cfg_q(&c, url, queue_bytes, 5000);
    topen(&t, &c);
    publish1(&t, 4, 1, &k);
    cr_assert_eq(kvvm_sync(t.kv), 0);
    cr_expect(!stored(url, 4, 1), "a read-only client wrote");
    key_of(50, &k0);
    kvvm_seq d;
    cr_assert_eq(kvvm_seq_create(t.kv, &d), 0);
    cr_expect_eq(kvvm_prefix_attach(t.kv, d, 4, &k0, 1), 1, "attach: %s", kvvm_last_error());
    cr_expect(same1(&t, d, 50));
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_expect_eq(st.store_puts, 0);
    cr_expect_eq(st.store_errors, 0);
    cr_expect_eq(st.store_dropped, 0);
    cr_expect_eq(st.store_queue_bytes, 0);
    tclose(&t);
    rmdir_all(dir);
}

Test(store_queue, zero_is_a_read_only_client)
{
    TH_DEADLINE(20);
    read_only(0);
}

Test(store_queue, less_than_one_entry_writes_nothing)
{
    TH_DEADLINE(20);
    kvvm_set_log(NULL, NULL, KVVM_LOG_ERROR);      /* the warning at open is expected */
    read_only(BLOCK - 1);
    kvvm_set_log(NULL, NULL, KVVM_LOG_WARN);
}
