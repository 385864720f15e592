/*
 * tests/test_store_tier.c: the store as an entry of the list of tiers (core/tiers.h,
 * CORE_TIER_ENTRIES; issue 33). A test-only store in plain memory (tests/store_mem.c), added
 * with one core_tiers_add call, takes the store's level: a prefix published by one context
 * is written to it by the store queue (core/storeq.c, through the entry's operations only),
 * the local entries go with that context, and a second context finds the blocks in it
 * (lookup: KVVM_TIER_STORE), attaches them with every byte of every region as written,
 * counts them in kvvm_stats' store_* (through the list), passes the invariant check (the
 * queue's, through the list), and drops them from it. The list refuses an entry that is
 * not a store entry, or one missing an operation, and never opens it.
 */
#include "harness.h"

#include "core/core.h"
#include "store_mem.h"

#define BPT 256u                 /* 16 tokens per 4 KiB block */
#define T   16u
#define NR  2u
#define NB  4u

static void cfg_of(struct kvvm_config *c)
{
    th_config(c, KB, NR, BPT, 16, 64 * T, 64, 0, 0);
    c->pool_thread = 0;
}

static uint8_t pat(uint32_t r, uint64_t off)
{
    return (uint8_t)(r * 101u + off * 13u + (off >> 9) + 7u);
}

static void keys_of(size_t n, kvvm_key *k)
{
    int32_t tok[NB * T];
    for (size_t i = 0; i < n * T; i++)
        tok[i] = (int32_t)(4242 + i);
    cr_assert_eq(kvvm_prefix_keys(tok, n * T, T, NULL, 0, k, n), n);
}

/* Published by a context that closes (its local entries go with it), attached by a second
   one from the in-memory store: every byte. Bug guarded: the store outside the list (its
   own path in open and storeq.c): an entry added to the list was never opened, nothing was
   written to it, and the attach found nothing. */
Test(store_tier, publish_close_attach_every_byte_from_the_added_store)
{
    TH_DEADLINE(60);
    cr_assert_eq(store_mem_use(true), 0, "%s", kvvm_last_error());
    struct kvvm_config c;
    cfg_of(&c);
    c.store_url = "file:///nonexistent/kvvm-store-tier";   /* the added entry comes first */
    kvvm_key k[NB];
    keys_of(NB, k);
    size_t len = NB * T * BPT;
    uint8_t *b = malloc(len);
    cr_assert(b);
    struct tctx t;
    topen(&t, &c);
    cr_expect_null(t.kv->store, "the built-in store opened in the added one's place");
    kvvm_seq s;
    cr_assert_eq(kvvm_seq_create(t.kv, &s), 0);
    cr_assert_eq(kvvm_seq_grow(t.kv, s, NB * T), 0);
    for (uint32_t r = 0; r < NR; r++) {
        for (size_t i = 0; i < len; i++)
            b[i] = pat(r, i);
        cr_assert_eq(kvvm_seq_write(t.kv, s, r, 0, b, len), 0);
    }
    cr_assert_eq(kvvm_prefix_publish(t.kv, s, 9, k, NB), (int)NB, "%s", kvvm_last_error());
    cr_assert_eq(kvvm_sync(t.kv), 0);               /* the queued writes are done */
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_expect_eq(st.store_puts, NB, "store_puts %lu", (unsigned long)st.store_puts);
    cr_expect_eq(st.store_bytes_out, (uint64_t)NB * NR * KB);
    cr_expect_eq(st.store_errors, 0);
    cr_expect_eq(store_mem_entries(), NB, "the added store holds %zu", store_mem_entries());
    tcheck(&t, "after the publish");
    tclose(&t);                                      /* the local entries go */

    topen(&t, &c);
    uint8_t where[NB] = { 0 };
    cr_assert_eq(kvvm_prefix_lookup(t.kv, 9, k, NB, where), (int)NB);
    for (unsigned i = 0; i < NB; i++)
        cr_expect_eq(where[i], KVVM_TIER_STORE, "block %u: tier %u", i, where[i]);
    kvvm_seq d;
    cr_assert_eq(kvvm_seq_create(t.kv, &d), 0);
    cr_assert_eq(kvvm_prefix_attach(t.kv, d, 9, k, NB), (int)NB, "attach: %s",
                 kvvm_last_error());
    for (uint32_t r = 0; r < NR; r++) {
        memset(b, 0, len);
        cr_assert_eq(kvvm_seq_read(t.kv, d, r, 0, b, len), 0);
        for (size_t i = 0; i < len; i++)
            if (b[i] != pat(r, i))
                cr_assert_fail("region %u byte %zu: %u, written %u", r, i, b[i], pat(r, i));
    }
    tstats(&t, &st);
    cr_expect_eq(st.store_hits, NB);
    cr_expect_eq(st.store_gets, NB, "store_gets %lu", (unsigned long)st.store_gets);
    cr_expect_eq(st.store_bytes_in, (uint64_t)NB * NR * KB);
    cr_expect_eq(st.prefix_entries, NB, "the attached blocks are not local entries");
    cr_expect_eq(st.store_puts, 0, "entries from the store were written back");
    tcheck(&t, "after the attach");
    cr_assert_eq(kvvm_prefix_drop(t.kv, 9, k, NB), (int)NB);   /* here, and in the store */
    cr_expect_eq(store_mem_entries(), 0, "the drop left %zu in the store", store_mem_entries());
    tclose(&t);
    free(b);
    cr_expect_eq(store_mem_open_layers(), 0);
    cr_expect_eq(store_mem_misuses(), 0);
}

static int opened;

static int bad_open(kvvm *kv, void **layer, struct pg_tier_ops *ops)
{
    (void)kv;
    (void)ops;
    opened++;
    *layer = &opened;
    return 0;
}
static void bad_close(void *layer) { (void)layer; }
static uint64_t bad_slots(kvvm *kv, void *layer) { (void)kv; (void)layer; return 1; }
static void bad_stats(void *layer, struct core_tier_stats *out)
{
    (void)layer;
    *out = (struct core_tier_stats){ .puts = 999 };
}
static void bad_off(kvvm *kv, char *b, size_t n, size_t *pos)
{
    (void)kv;
    json_put(b, n, pos, "; no bad tier");
}
static int b_put(void *l, uint64_t ns, struct core_entry_item *it, size_t n)
{
    (void)l, (void)ns, (void)it, (void)n;
    return 0;
}
static void b_start(void *l, uint64_t ns, struct core_entry_item *it, size_t n,
                    struct core_entry_lend *lend, struct core_entry_get *g)
{
    (void)l, (void)ns, (void)it, (void)n, (void)lend, (void)g;
}
static int b_first(struct core_entry_get *g) { (void)g; return 0; }
static int b_finish(struct core_entry_get *g) { (void)g; return 0; }
static int b_lookup(void *l, uint64_t ns, const kvvm_key *k, size_t n, uint8_t *p)
{
    (void)l, (void)ns, (void)k, (void)n, (void)p;
    return 0;
}
static int b_del(void *l, uint64_t ns, const kvvm_key *k, size_t n)
{
    (void)l, (void)ns, (void)k, (void)n;
    return 0;
}
static void b_reap(void *l) { (void)l; }

static const struct core_entry_ops ops_whole = {
    .put = b_put, .get_start = b_start, .get_first = b_first, .get_finish = b_finish,
    .lookup = b_lookup, .del = b_del, .reap = b_reap,
};
static const struct core_entry_ops ops_no_finish = {
    .put = b_put, .get_start = b_start, .get_first = b_first,
    .lookup = b_lookup, .del = b_del, .reap = b_reap,
};

/* Each is refused with -EINVAL and the reason; none is ever opened. */
static void refused(const struct core_tier *e, const char *why)
{
    int rc = core_tiers_add(e);
    cr_expect_eq(rc, -EINVAL, "%s: core_tiers_add %d", why, rc);
    cr_expect(strstr(kvvm_last_error(), why), "the reason: '%s', not '%s'", kvvm_last_error(),
              why);
}

/* Bug guarded: a list that takes any entry (only a page tier's level was checked): a store
   entry at a page level, or one missing get_finish, went in, and open or the first attach
   called through it. */
Test(store_tier, list_refuses_a_bad_store_entry)
{
    struct core_tier e = { .name = "bad", .kind = CORE_TIER_ENTRIES, .level = 0,
                           .open = bad_open, .close = bad_close, .stats = bad_stats,
                           .off = bad_off, .ent = &ops_whole };
    refused(&e, "an entries tier's level is CORE_LEVEL_STORE");
    e.level = CORE_LEVEL_STORE;
    e.ent = &ops_no_finish;
    refused(&e, "an entries tier needs put, get_start, get_first, get_finish");
    e.ent = NULL;
    refused(&e, "an entries tier needs put");
    e.ent = &ops_whole;
    e.slots = bad_slots;
    refused(&e, "an entries tier holds no pages");
    e.slots = NULL;
    e.stats = NULL;
    refused(&e, "every tier needs a name and open, close, stats and off");
    struct core_tier p = { .name = "badpages", .kind = CORE_TIER_PAGES, .level = 0,
                           .open = bad_open, .close = bad_close, .slots = bad_slots,
                           .stats = bad_stats, .off = bad_off, .ent = &ops_whole };
    refused(&p, "a page tier has no entry operations");
    p.ent = NULL;
    p.level = CORE_LEVEL_STORE;
    refused(&p, "a page tier's level is below PG_N_LOWER");
    p.kind = (enum core_tier_kind)7;
    refused(&p, "its kind is neither pages nor entries");
    cr_expect_eq(core_tiers_add(NULL), -EINVAL);
    struct kvvm_config c;
    cfg_of(&c);
    kvvm *kv = th_open(&c);
    struct kvvm_stats st = { .size = sizeof st };
    cr_assert_eq(kvvm_stats(kv, &st), 0);
    cr_expect_eq(st.store_puts, 0, "a refused entry's stats were read");
    cr_expect_eq(opened, 0, "a refused entry was opened");
    kvvm_close(kv);
}
