/*
 * core/debug.h: test and tool hooks into a context (not installed, not part of the API).
 */
#ifndef KVVM_CORE_DEBUG_H
#define KVVM_CORE_DEBUG_H

#include <stddef.h>
#include "kvvm.h"

/* The invariant checker. Checks the context against the emulated device's own tables (not
   against itself): every window page maps the handle its page descriptor names, with access
   set; no page is mapped where no block-table entry says so (map-ahead pages excepted, which
   are accounted as free); every page's refcount equals the block-table entries holding it;
   free + in use + in flight == capacity per tier; the emulator's live handles and handle
   bytes equal the pool's; no slot or handle leaked. 0 when all hold; -EUCLEAN with the first
   violation described in why (if non-NULL) and logged. On the CUDA backend the checks that
   need the emulator's tables are skipped. */
int kvvm_debug_check(kvvm *kv, char *why, size_t len);

/* The emulated device ordinal of the context (for emu_counters_get, emu_lookup), or -1. */
int kvvm_debug_emu_ordinal(kvvm *kv);

/* The context's copy stream (swap copies: swap-out, swap-in, prefetch), or NULL before its
   first use: for emu_stream_set_paused, to hold the library's copies back. */
void *kvvm_debug_copy_stream(kvvm *kv);

/* Where page i of region r of s is: 0 a hole (discarded), 1 device, 2 host, 3 disk (a page
   in flight counts under the tier it leaves; kvvm_sync first for a settled answer). For the
   model test, which follows every page through the moves of reclaim and set_budget.
   -EINVAL kv or tier NULL, r or i out of range; -ENOENT. */
int kvvm_debug_page_tier(kvvm *kv, kvvm_seq s, uint32_t r, uint32_t i, int *tier);

/* Requests for a frame pool thread round so far (0 without the thread). */
uint64_t kvvm_debug_pool_wakes(kvvm *kv);

/* The context's spill engine (the disk tier), or NULL: for spill_fault_arm and
   spill_test_corrupt (disk/disk.h). */
struct spill;
struct spill *kvvm_debug_spill(kvvm *kv);

#endif
