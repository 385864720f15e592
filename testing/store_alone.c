/*
 * testing/store_alone.c: the shared store layer (store/store.h) alone, for kvvm-bench's store
 * figures (testing/kvvm_testing.h). Items and layouts are passed through as they are: their
 * layouts are checked equal to store_item's and store_layout's below. A get lends the
 * tool's buffers (store_get_lent), as an attach does, until the store is closed.
 */
#include "testing/kvvm_testing.h"

#include <stddef.h>

#include "store/store.h"

#define SAME(a, b, f) (offsetof(struct a, f) == offsetof(struct b, f))
_Static_assert(sizeof(kvvm_key) == sizeof(store_key), "kvvm_key and store_key differ");
_Static_assert(sizeof(struct kvvm_testing_store_item) == sizeof(struct store_item) &&
               SAME(kvvm_testing_store_item, store_item, key) &&
               SAME(kvvm_testing_store_item, store_item, iov) &&
               SAME(kvvm_testing_store_item, store_item, iovcnt) &&
               SAME(kvvm_testing_store_item, store_item, status), "kvvm_testing_store_item");
_Static_assert(sizeof(struct kvvm_testing_store_layout) == sizeof(struct store_layout) &&
               SAME(kvvm_testing_store_layout, store_layout, n_regions) &&
               SAME(kvvm_testing_store_layout, store_layout, bytes_per_token) &&
               SAME(kvvm_testing_store_layout, store_layout, page_size),
               "kvvm_testing_store_layout");

int kvvm_testing_store_open(const char *url, uint32_t timeout_ms, kvvm_testing_store **out)
{
    return store_open(url, timeout_ms, 0, (struct store **)out);
}

void kvvm_testing_store_close(kvvm_testing_store *st)
{
    store_close((struct store *)st);
}

int kvvm_testing_store_put(kvvm_testing_store *st, const struct kvvm_testing_store_layout *L,
                           uint64_t ns, struct kvvm_testing_store_item *items, size_t n)
{
    return store_put((struct store *)st, (const struct store_layout *)L, ns,
                     (struct store_item *)items, n);
}

/* The buffers are the tool's until kvvm_testing_store_close (kvvm_testing.h): nothing to
   give back. */
static void kept_till_close(void *arg)
{
    (void)arg;
}

int kvvm_testing_store_get(kvvm_testing_store *st, const struct kvvm_testing_store_layout *L,
                           uint64_t ns, struct kvvm_testing_store_item *items, size_t n)
{
    struct store_lend lend = { kept_till_close, NULL, 0 };
    return store_get_lent((struct store *)st, (const struct store_layout *)L, ns,
                          (struct store_item *)items, n, &lend);
}
