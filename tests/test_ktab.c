/*
 * tests/test_ktab.c: common/ktab.h, the small hash table of the pool's client and daemon:
 * random puts and deletes against a model (every key found with its value, every other
 * absent, at most half full), a delete in a run that wraps past the end of the array (the
 * backward shift), a set (no values), an empty and a freed table, a reservation too large.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/ktab.h"

struct val {
    uint64_t a;
    uint32_t b;
};

/* The home of key in a table of cap entries: its entry when it is alone there. */
static size_t home_of(uint64_t key, size_t cap)
{
    struct ktab t = { 0 };
    cr_assert_eq(ktab_reserve(&t, cap / 2, 0), 0);
    cr_assert_eq(t.cap, cap);
    size_t i = ktab_put(&t, key);
    ktab_free(&t);
    return i;
}

/* n keys (from *next on) whose home is h in a table of cap entries. */
static void keys_at(size_t h, size_t cap, uint64_t *next, uint64_t *out, int n)
{
    for (int got = 0; got < n; (*next)++)
        if (home_of(*next, cap) == h)
            out[got++] = *next;
}

Test(ktab, random_puts_and_deletes_against_a_model)
{
    enum { KEYS = 3000, OPS = 60000 };
    static bool in[KEYS + 1];
    static struct val want[KEYS + 1];
    struct ktab t = { 0 };
    size_t n = 0;
    srand(7);
    for (int op = 0; op < OPS; op++) {
        uint64_t k = 1 + (uint64_t)rand() % KEYS;   /* 1..KEYS: many collisions */
        size_t i = ktab_find(&t, k);
        cr_assert_eq(i != SIZE_MAX, in[k], "op %d key %llu", op, (unsigned long long)k);
        if (in[k]) {
            const struct val *v = ktab_val(&t, i);
            cr_assert(v->a == want[k].a && v->b == want[k].b, "key %llu's value",
                      (unsigned long long)k);
            if (rand() % 2) {
                ktab_del(&t, i);
                in[k] = false;
                n--;
            }
            continue;
        }
        cr_assert_eq(ktab_reserve(&t, 1, sizeof(struct val)), 0);
        i = ktab_put(&t, k);
        const struct val zero = { 0 };
        cr_assert_eq(memcmp(ktab_val(&t, i), &zero, sizeof zero), 0, "a new value is zeroed");
        want[k] = (struct val){ k * 977 + (uint64_t)op, (uint32_t)op };
        memcpy(ktab_val(&t, i), &want[k], sizeof want[k]);
        in[k] = true;
        n++;
        cr_assert_eq(t.n, n);
        cr_assert_leq(2 * t.n, t.cap, "more than half full");
    }
    for (uint64_t k = 1; k <= KEYS; k++) {
        size_t i = ktab_find(&t, k);
        cr_assert_eq(i != SIZE_MAX, in[k]);
        if (in[k])
            cr_assert_eq(((const struct val *)ktab_val(&t, i))->a, want[k].a);
    }
    size_t used = 0;
    for (size_t i = 0; i < t.cap; i++)
        used += t.key[i] != 0;
    cr_assert_eq(used, n);
    ktab_free(&t);
    cr_assert(t.cap == 0 && t.n == 0 && !t.key && !t.val);
}

/* A run that wraps: three keys at home cap-1 (in cap-1, 0 and 1) and one at home 0 (in 2).
   Deleting the first moves each of the others back by one; every key stays findable. */
Test(ktab, delete_shifts_back_a_run_that_wraps)
{
    const size_t cap = KTAB_FIRST_CAP;
    uint64_t next = 1, last[3], first[1];
    keys_at(cap - 1, cap, &next, last, 3);
    keys_at(0, cap, &next, first, 1);
    struct ktab t = { 0 };
    cr_assert_eq(ktab_reserve(&t, 4, 8), 0);
    cr_assert_eq(t.cap, cap);
    uint64_t keys[4] = { last[0], last[1], last[2], first[0] };
    size_t at[4] = { cap - 1, 0, 1, 2 };
    for (int j = 0; j < 4; j++) {
        cr_assert_eq(ktab_put(&t, keys[j]), at[j]);
        *(uint64_t *)ktab_val(&t, at[j]) = keys[j] * 3;
    }
    ktab_del(&t, cap - 1);
    cr_assert_eq(ktab_find(&t, keys[0]), SIZE_MAX);
    for (int j = 1; j < 4; j++) {
        size_t i = ktab_find(&t, keys[j]);
        cr_assert_eq(i, at[j - 1], "key %d moved back to %zu, not %zu", j, at[j - 1], i);
        cr_assert_eq(*(uint64_t *)ktab_val(&t, i), keys[j] * 3);
    }
    cr_assert_eq(t.key[2], 0, "the run's last entry emptied");
    ktab_del(&t, ktab_find(&t, keys[3]));      /* at 1 now: the run ends after it */
    cr_assert_eq(ktab_find(&t, keys[1]), cap - 1);
    cr_assert_eq(ktab_find(&t, keys[2]), 0);
    cr_assert_eq(t.n, 2);
    ktab_free(&t);
}

Test(ktab, a_set_has_no_values_and_grows_keeping_its_keys)
{
    struct ktab t = { 0 };
    cr_assert_eq(ktab_find(&t, 5), SIZE_MAX, "an empty table finds nothing");
    for (uint64_t k = 1; k <= 1000; k++) {
        cr_assert_eq(ktab_reserve(&t, 1, 0), 0);
        ktab_put(&t, k << 32);             /* keys differing in high bits only */
    }
    cr_assert_null(t.val);
    cr_assert_eq(t.n, 1000);
    cr_assert_geq(t.cap, 2000);
    for (uint64_t k = 1; k <= 1000; k++)
        cr_assert_neq(ktab_find(&t, k << 32), SIZE_MAX);
    cr_assert_eq(ktab_find(&t, 1001ull << 32), SIZE_MAX);
    ktab_free(&t);
    cr_assert_eq(ktab_find(&t, 1ull << 32), SIZE_MAX, "a freed table is empty");
    cr_assert_eq(ktab_reserve(&t, 1, 0), 0);
    ktab_put(&t, 3);
    cr_assert_neq(ktab_find(&t, 3), SIZE_MAX, "and usable again");
    ktab_free(&t);
}

Test(ktab, a_reservation_too_large_is_enomem_and_changes_nothing)
{
    struct ktab t = { 0 };
    cr_assert_eq(ktab_reserve(&t, 10, 8), 0);
    size_t i = ktab_put(&t, 42);
    *(uint64_t *)ktab_val(&t, i) = 4242;
    uint64_t *key = t.key;
    size_t cap = t.cap;
    cr_assert_eq(ktab_reserve(&t, SIZE_MAX / 2, 8), -ENOMEM);
    cr_assert(t.key == key && t.cap == cap && t.n == 1);
    cr_assert_eq(*(uint64_t *)ktab_val(&t, ktab_find(&t, 42)), 4242);
    ktab_free(&t);
}
