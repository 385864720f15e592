/*
 * common/ktab.c: the small hash table of common/ktab.h (contract there).
 *
 * An entry's home is the key's Fibonacci hash (the product with 2^64 / phi, bits 32 and up);
 * its entry is the first empty one from there on, wrapping. A delete keeps every key
 * findable without tombstones: after emptying entry i it walks the run that follows, and
 * moves back into the hole each entry whose home is not in (i, j] (cyclically), that is an
 * entry whose probe passed over i.
 */
#include "common/ktab.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/assert.h"

static size_t home(const struct ktab *t, uint64_t key)
{
    return (size_t)(key * 0x9e3779b97f4a7c15ull >> 32) & (t->cap - 1);
}

static size_t next(const struct ktab *t, size_t i)
{
    return (i + 1) & (t->cap - 1);
}

size_t ktab_find(const struct ktab *t, uint64_t key)
{
    if (!t->cap || !key)
        return SIZE_MAX;
    size_t i = home(t, key);
    while (t->key[i] && t->key[i] != key)
        i = next(t, i);
    return t->key[i] ? i : SIZE_MAX;
}

size_t ktab_put(struct ktab *t, uint64_t key)
{
    KVVM_ASSERT(key != 0 && 2 * (t->n + 1) <= t->cap && ktab_find(t, key) == SIZE_MAX);
    size_t i = home(t, key);
    while (t->key[i])
        i = next(t, i);
    t->key[i] = key;
    if (t->vsize)
        memset(ktab_val(t, i), 0, t->vsize);
    t->n++;
    return i;
}

int ktab_reserve(struct ktab *t, size_t more, size_t vsize)
{
    KVVM_ASSERT(vsize % 8 == 0 && (!t->cap || t->vsize == vsize));
    if (more > SIZE_MAX / 8 - t->n)
        return -ENOMEM;                     /* 2 * (n + more) would not fit a size_t */
    if (2 * (t->n + more) <= t->cap)
        return 0;
    struct ktab g = { .cap = t->cap ? t->cap : KTAB_FIRST_CAP, .vsize = vsize };
    while (g.cap < 2 * (t->n + more))
        g.cap *= 2;
    g.key = calloc(g.cap, sizeof *g.key);
    g.val = vsize ? calloc(g.cap, vsize) : NULL;
    if (!g.key || (vsize && !g.val)) {
        free(g.key);
        free(g.val);
        return -ENOMEM;
    }
    /* commit: nothing below fails */
    for (size_t i = 0; i < t->cap; i++) {
        if (!t->key[i])
            continue;
        size_t j = ktab_put(&g, t->key[i]);
        if (vsize)
            memcpy(ktab_val(&g, j), ktab_val(t, i), vsize);
    }
    KVVM_ASSERT(g.n == t->n);
    ktab_free(t);
    *t = g;
    return 0;
}

void ktab_del(struct ktab *t, size_t i)
{
    KVVM_ASSERT(i < t->cap && t->key[i] && t->n > 0);
    t->key[i] = 0;
    t->n--;
    for (size_t j = next(t, i); t->key[j]; j = next(t, j)) {
        size_t h = home(t, t->key[j]);
        bool past = i <= j ? (h <= i || h > j) : (h <= i && h > j);
        if (!past)
            continue;
        t->key[i] = t->key[j];
        if (t->vsize)
            memcpy(ktab_val(t, i), ktab_val(t, j), t->vsize);
        t->key[j] = 0;
        i = j;
    }
}

void ktab_free(struct ktab *t)
{
    free(t->key);
    free(t->val);
    *t = (struct ktab){ .vsize = t->vsize };
}
