/*
 * testing/kvvm_testing.h: libkvvm's testing interface: what tests and tools need beyond the
 * public API (include/kvvm.h), declared in one place. Not installed, not part of the API: no
 * compatibility promise; the library's own tests and tools only.
 *
 * Every name here begins with kvvm_ (kvvm_debug_*: hooks into a context; kvvm_testing_*:
 * counters and the bench's baselines), so it survives libkvvm.a's private namespace (its
 * non-kvvm globals are local: docs/design.md "Private namespace"). They are hidden in
 * libkvvm.so: a program using them links libkvvm.a (the CMake target kvvm_testing provides
 * this header's directory, include/ and libkvvm.a, and nothing else: kvvm-bench builds
 * against it). Tests that test a layer's internals include its private headers through the
 * target kvvm_internal instead.
 */
#ifndef KVVM_TESTING_H
#define KVVM_TESTING_H

#include <stddef.h>
#include <stdint.h>
#include "kvvm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* --- hooks into a context (implemented in core/debug.c) ---------------------------------- */

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

/* Requests for a frame pool thread round so far (0 without the thread). */
uint64_t kvvm_debug_pool_wakes(kvvm *kv);

/* Where page i of region r of s is: 0 a hole (discarded), 1 device, 2 host, 3 disk (a page
   in flight counts under the tier it leaves; kvvm_sync first for a settled answer). For the
   model test, which follows every page through the moves of reclaim and set_budget.
   -EINVAL kv or tier NULL, r or i out of range; -ENOENT. */
int kvvm_debug_page_tier(kvvm *kv, kvvm_seq s, uint32_t r, uint32_t i, int *tier);

/* The context's spill engine (the disk tier), or NULL: for spill_fault_arm and
   spill_test_corrupt (disk/disk.h). */
struct spill;
struct spill *kvvm_debug_spill(kvvm *kv);

/* --- counters (testing/testing.c) -------------------------------------------------------- */

/* The emulated device's driver calls per entry point (vmm/emu/emu.h, emu_calls_get): one
   name and count per entry point the emulator counts, since its creation. */
#define KVVM_TESTING_EMU_ENTRIES_MAX 64
struct kvvm_testing_emu_calls {
    size_t n;                                           /* entries filled */
    const char *name[KVVM_TESTING_EMU_ENTRIES_MAX];     /* "cuMemMap" ... (static strings) */
    uint64_t count[KVVM_TESTING_EMU_ENTRIES_MAX];
};
/* 0; -EINVAL out NULL; -ENODEV kv is not on the emulated device. */
int kvvm_testing_emu_calls(kvvm *kv, struct kvvm_testing_emu_calls *out);
/* The count of the entry point named entry in c (0 when it has none). */
uint64_t kvvm_testing_emu_count(const struct kvvm_testing_emu_calls *c, const char *entry);

/* --- kvvm-bench's baselines: the layers below a context, under its lock ------------------ */

/* A device-to-device copy of bytes through the context's driver, on the default stream,
   then that stream synchronized (a copying fork's cost). 0 or -errno. */
int kvvm_testing_device_copy(kvvm *kv, uint64_t dst, uint64_t src, size_t bytes);
/* Fills the context's page pool to `ready` frames (created now where missing). 0, -EINVAL. */
int kvvm_testing_pool_refill(kvvm *kv, uint32_t ready);
/* iters times: one frame taken from the pool and given back (the pool's own cost, under
   the context lock taken once). 0 or the first failure's -errno. */
int kvvm_testing_pool_take_give(kvvm *kv, long iters);
/* iters times: a physical page of `bytes` created and released through the vmm layer (what
   the pool saves a grow), under the context lock taken once. 0 or -errno. */
int kvvm_testing_page_create_release(kvvm *kv, size_t bytes, long iters);

/* The disk tier's page checksum (disk/disk.h spill_checksum: XXH3 of the bytes, seeded with
   the page's identity, page id and slot). */
uint64_t kvvm_testing_page_checksum(const void *buf, size_t len, uint64_t page,
                                    uint32_t slot);

/* Parses a size with an optional K/M/G/T suffix (binary units), as the KVVM_* variables are read.
   0 or -EINVAL. */
int kvvm_testing_parse_size(const char *s, size_t *out);

#ifdef __cplusplus
}
#endif
#endif
