/*
 * prefix/prefix.h: the prefix cache keyed by content (docs/design.md "The prefix cache").
 *
 * Contract:
 *  - An *entry* is (namespace, key) -> the pages of one block (page b of every region) of
 *    the sequence that published it. A key is an opaque 32-byte digest naming the block and
 *    everything before it; the index never hashes tokens itself (prefix_chain_keys is the
 *    scheme offered to engines without one) and never compares keys across namespaces.
 *  - Entries hold their pages through paging's holder references (paging_hold): no copy. The
 *    publisher and every sequence attached to an entry share its pages and copy on write as
 *    after a fork; a sequence freed or truncated leaves the entry's pages to the entry; an
 *    entry dropped leaves them to the sequences sharing them. The pages follow their tier
 *    moves (a sharer swapped out takes them down; a swap-in brings them up).
 *  - The index: open addressing (linear probing, deletion by backward shift) over slots of
 *    8 bytes (a hash tag, a record index) at load at most 1/2, and dense records of 48 bytes
 *    (key, namespace, chain links) that never move (a free list reuses them); the LRU ticks
 *    and page ids are parallel arrays. Lookups allocate nothing, read the slots and touch a
 *    record only where the tag matches, and write one tick per hit. Slots are rebuilt and
 *    records grown only in publish, before anything changes (-ENOMEM then).
 *  - Chains: an entry published after its predecessor in the same publish names it as its
 *    parent; a parent with cached successors (children) is reclaimed only after them
 *    (leaves first).
 *  - Reclaim (swap_cache_ops, installed in swap/ by prefix_create): an entry no sequence,
 *    release or transfer holds (its pages only entries hold) is reclaimable; a plan takes
 *    them least recently looked up or attached first, leaves first, counting the frames
 *    each drop frees on paging's plan marks; acting drops them, or, with KVVM_F_CACHE_DEMOTE
 *    and room below (a plan that may swap: swap_cache_ops.demote; the room goes to the
 *    plan's last entries first, so those dropped for want of it are the least recently used
 *    leaves), copies their device pages to the host tier (the entry stays, at
 *    KVVM_TIER_HOST; attach brings it back).
 *  - Below the host tier (swap_cache_ops.spill): the host pages only entries hold are
 *    spillable like a non-resident sequence's; every spill of swap/ (a caller or a plan's
 *    move short of host slots, the host marks, the spill thread) writes them first, least
 *    recently used entries first, leaves first among them, to the disk tier (the entry
 *    stays, at KVVM_TIER_DISK; attach brings it back through the swap-in of its adopter).
 *    Without a disk tier they stay on the host tier until attached or dropped.
 *  - Moves nothing itself but by paging's calls; never includes a header of core/.
 *  - Not thread-safe: the caller (core/) holds the context lock around every call (the
 *    reclaim ops run under it too, from a plan of swap/).
 *
 * Errors: -ENOENT a bad sequence handle; -ESTALE a dropped CACHED sequence; -EINVAL (per
 * docs/api.md); -EOPNOTSUPP page_size is not a multiple of bytes_per_token (blocks are not
 * pages); -ENOMEM no record could be had.
 */
#ifndef KVVM_PREFIX_PREFIX_H
#define KVVM_PREFIX_PREFIX_H

#include <stddef.h>
#include <stdint.h>
#include "paging/paging.h"
#include "swap/swap.h"

#define PREFIX_KEY_BYTES 32

struct prefix_counters {
    uint64_t entries;            /* entries now */
    uint64_t lookups;            /* lookup and attach calls (prefix_lookup with count) */
    uint64_t hit_blocks;         /* blocks they found */
    uint64_t evictions;          /* entries reclaimed (dropped or demoted by a plan) */
    uint64_t spills;             /* pages only entries hold whose spill write started */
    uint64_t bytes;              /* the index's memory: slots, records, ticks, page ids */
};

struct prefix;

/* The index over pg, its entry reclaim installed in sw (NULL: none). -ENOMEM. */
int  prefix_create(struct paging *pg, struct swap *sw, struct prefix **out);
/* Drops every entry (their pages go to the sequences sharing them, or are freed). Context
   lock held, before paging_destroy, once no plan of swap/ can reach the index (after
   swap_destroy, or swap_set_cache(sw, NULL)). NULL is a no-op. */
void prefix_destroy(struct prefix *pc);

/* Enters blocks [0, n) of sequence h under (ns, keys[i]) (keys: n records of 32 bytes, any
   alignment); a key present keeps its entry. Returns the new entries (>= 0). -ENOENT,
   -ESTALE, -EOPNOTSUPP, -EINVAL n past h's full blocks or a block discarded, -ENOMEM. */
int  prefix_publish(struct prefix *pc, uint64_t h, uint64_t ns, const void *keys, size_t n);
/* The number of leading keys of keys[0..n) present in ns. Marks them used (the LRU clock);
   where (NULL allowed) gets each one's PG_WHERE_* (the lowest tier of its pages); ids (NULL
   allowed; n * n_regions) gets their pages as paging_seq_blocks lays them out. count: one
   lookup call in the counters. Moves nothing. */
size_t prefix_lookup(struct prefix *pc, uint64_t ns, const void *keys, size_t n,
                     uint8_t *where, pg_page_id *ids, bool count);
/* Whether (ns, key) is present, touching nothing (no LRU tick, no counter): where (NULL
   allowed; n_regions) gets each region's page's PG_WHERE_*. The tests' view of an entry. */
bool prefix_peek(struct prefix *pc, uint64_t ns, const void *key, uint8_t *where);
/* Counts an attach's hit blocks (after it succeeded). */
void prefix_count_hits(struct prefix *pc, size_t k);
/* Removes the entries of keys[0..n) present in ns (keys NULL: every entry of ns). Returns
   how many. */
size_t prefix_drop(struct prefix *pc, uint64_t ns, const void *keys, size_t n);

void prefix_counters(const struct prefix *pc, struct prefix_counters *out);
/* Tests only (kvvm_testing_prefix_limits): the index holds at most max_records entries (0:
   no cap; a publish past it is -ENOMEM), and the fail_alloc_at-th allocation of the index
   from now on (all are publish's: its page ids, record growth, slot rebuilds) fails (0:
   none). Returns the allocations made since the previous call. */
uint32_t prefix_test_limits(struct prefix *pc, uint32_t max_records, uint32_t fail_alloc_at);
/* The checker (the debug build, after every call): the index's own structure, and that the
   holder references paging counts per page are exactly the entries'. 0 or -EUCLEAN with the
   first violation in why. */
int  prefix_check(struct prefix *pc, char *why, size_t len);

/* kvvm_prefix_keys' scheme (keys.c): key i = XXH3-128(key i-1 (32 bytes) || the tokens of
   block i as little-endian int32 || salt), key -1 empty; a key = the digest's canonical
   (big-endian) 16 bytes, then 16 zero bytes. Returns the keys written. */
size_t prefix_chain_keys(const int32_t *tokens, size_t n_tokens, uint32_t tokens_per_block,
                         const void *salt, size_t salt_len, void *keys, size_t cap);

#endif
