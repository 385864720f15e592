/*
 * tests/tier_mem.h: the test-only in-memory tier (tests/tier_mem.c), one entry in the list
 * of tiers below the device (core/tiers.h).
 */
#ifndef KVVM_TESTS_TIER_MEM_H
#define KVVM_TESTS_TIER_MEM_H

#include <stddef.h>

/* Adds the tier to the list (the first call) and gives it `bytes` (0: off) for the contexts
   opened from now on, in the disk tier's place (open them without spill_dir). Before
   kvvm_open, on one thread. 0, or -errno of core_tiers_add. */
int tier_mem_use(size_t bytes);
/* Frees of slots not taken, transfers on them, slots still taken at close: 0 when paging
   used the tier as its contract says. */
unsigned long tier_mem_misuses(void);

#endif
