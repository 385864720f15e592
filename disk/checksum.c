/*
 * disk/checksum.c: the page checksum of the disk tier (contract in disk.h): XXH3 (64-bit)
 * from libxxhash over the page's bytes, seeded with the page's identity (page id, slot).
 *
 * XXH3 replaced a hand-written XXH64 here: the checksum runs on the submitting thread for
 * every page written and on the engine thread for every page read, and XXH3 is several times
 * faster on the same bytes (kvvm-bench --only checksum measures both, the old XXH64 kept
 * there as the baseline). Where the library exports the run-time dispatched variant (x86:
 * SSE2 / AVX2 / AVX-512 picked at run time; KVVM_XXH_DISPATCH, found by CMake) it is used.
 * Otherwise XXH3 is compiled here from the library's header (XXH_INLINE_ALL: the target's
 * baseline SIMD, SSE2 / NEON), not called in the library: Debian's non-dispatched
 * XXH3_64bits_withSeed measured about twice as slow as the old XXH64 per page.
 * Every variant computes the same hash values.
 */
#include "disk_int.h"

#ifdef KVVM_XXH_DISPATCH
#include <xxh_x86dispatch.h>   /* XXH3_64bits_withSeed -> XXH3_64bits_withSeed_dispatch */
#else
#define XXH_INLINE_ALL
#include <xxhash.h>
#endif

/* Mixing constants for the seed (the XXH64 primes): a page id and a slot index spread over
   all 64 bits, so no two small (page, slot) pairs share a seed by construction. */
#define SEED_P2 0xC2B2AE3D27D4EB4FULL
#define SEED_P3 0x165667B19E3779F9ULL
#define SEED_P5 0x27D4EB2F165667C5ULL

uint64_t disk_checksum(const void *buf, size_t len, uint64_t page, disk_slot s)
{
    uint64_t seed = (page * SEED_P5) ^ ((uint64_t)s.idx * SEED_P2 + SEED_P3);
    return XXH3_64bits_withSeed(buf, len, seed);
}
