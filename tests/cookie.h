/*
 * tests/cookie.h: the content cookie the threaded test programs write into every byte and
 * check on every read: byte `off` of region `r` written by lineage `lin` (never 0, so an
 * unwritten or zeroed byte never passes).
 */
#ifndef KVVM_TESTS_COOKIE_H
#define KVVM_TESTS_COOKIE_H
#include <stdint.h>

static inline uint8_t cookie(uint32_t lin, uint32_t r, uint64_t off)
{
    uint64_t x = ((uint64_t)lin << 40) ^ ((uint64_t)r << 32) ^ off;
    x ^= x >> 31; x *= 0x9e3779b97f4a7c15ull; x ^= x >> 29;
    return (uint8_t)(x | 1);
}

#endif
