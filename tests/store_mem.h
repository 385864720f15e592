/*
 * tests/store_mem.h: the test-only in-memory store (tests/store_mem.c), one entries tier in
 * the list of tiers (core/tiers.h), in the place of the store of store_url.
 */
#ifndef KVVM_TESTS_STORE_MEM_H
#define KVVM_TESTS_STORE_MEM_H

#include <stdbool.h>
#include <stddef.h>

/* Adds the tier to the list (the first call) and turns it on (or off) for the contexts
   opened from now on: it then takes the store's level, whatever store_url says. Before
   kvvm_open, on one thread. 0, or -errno of core_tiers_add. */
int store_mem_use(bool on);
/* The entries it holds now (every context's: it outlives them, as a shared store does). */
size_t store_mem_entries(void);
/* Gets started and not finished, a second start before a finish, layers still open at
   exit of a test: 0 when core used the tier as its contract says. */
unsigned long store_mem_misuses(void);
/* Layers open now (one per context that has it). */
unsigned store_mem_open_layers(void);

#endif
