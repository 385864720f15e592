/*
 * common/ktab.h: a small hash table of 64-bit keys, each with a fixed-size value (or none: a
 * set), for the pool's client (pool/client_frames.c: its handles and the daemon's ids) and
 * daemon (pool/server_share.c: the frames each client maps).
 *
 * Contract: open addressing with linear probing, at most half full, capacity a power of two;
 * a delete shifts back the entries after it that probed past it (no tombstones), so a find
 * ends at the first empty entry. Key 0 is never a key (it marks an empty entry). An entry is
 * named by its index, valid until the next ktab_reserve that grows the table or ktab_del
 * (either may move entries). ktab_reserve is the only call that allocates, and the only one
 * that fails: ktab_put never fails (room reserved first), so a caller can reserve before its
 * point of no return. A zeroed struct ktab is an empty table; ktab_free makes it one again.
 * No lock: the caller's (the client's mutex, the daemon's one thread). Asserts (KVVM_DEBUG)
 * the preconditions written at each function.
 */
#ifndef KVVM_COMMON_KTAB_H
#define KVVM_COMMON_KTAB_H

#include <stddef.h>
#include <stdint.h>
#include "common/log.h"

struct ktab {
    uint64_t *key;                  /* cap entries; 0: empty */
    unsigned char *val;             /* cap values of vsize bytes (NULL when vsize is 0) */
    size_t cap;                     /* a power of two, or 0 (nothing allocated yet) */
    size_t n;                       /* keys entered; 2 * n <= cap */
    size_t vsize;                   /* bytes of a value, fixed by the first ktab_reserve;
                                       a multiple of 8 (values are 8-byte aligned) */
};

#define KTAB_FIRST_CAP 64           /* the capacity of a table's first allocation */

/* Room for `more` puts without another allocation; the first call fixes vsize (every call
   passes the same). 0; -ENOMEM (the table unchanged). */
KVVM_INTERNAL int ktab_reserve(struct ktab *t, size_t more, size_t vsize);
/* key's entry, or SIZE_MAX (absent; key 0 is never present). */
KVVM_INTERNAL size_t ktab_find(const struct ktab *t, uint64_t key);
/* Enters key (not 0, absent; room reserved) with a zeroed value: its entry. */
KVVM_INTERNAL size_t ktab_put(struct ktab *t, uint64_t key);
/* Empties entry i (holding a key), moving back the entries after it that probed past it. */
KVVM_INTERNAL void ktab_del(struct ktab *t, size_t i);
/* Frees the arrays: an empty table (vsize kept). */
KVVM_INTERNAL void ktab_free(struct ktab *t);

/* Entry i's value (vsize bytes). */
static inline void *ktab_val(const struct ktab *t, size_t i)
{
    return t->val + i * t->vsize;
}

#endif
