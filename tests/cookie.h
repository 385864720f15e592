/*
 * tests/cookie.h: the content cookie the tests write into every byte and check on every
 * read: byte `off` of region `r` written by lineage `lin` (never 0, so an unwritten or
 * zeroed byte never passes). Free of Criterion, so the plain threaded programs
 * (tsan_threads.c, stream_random.c) use it too; the Criterion tests get it through
 * tests/harness.h.
 */
#ifndef KVVM_TESTS_COOKIE_H
#define KVVM_TESTS_COOKIE_H
#include <stdint.h>

/* The splitmix64 finalizer: every input bit reaches every output bit. */
static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27; x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static inline uint8_t cookie(uint32_t lin, uint32_t r, uint64_t off)
{
    return (uint8_t)(mix64(((uint64_t)lin << 40) ^ ((uint64_t)r << 32) ^ off) | 1);
}

#endif
