/*
 * verify.c: the byte pattern every token carries.
 *
 * Token `token` of region `region` written by lineage `lineage` holds 64-bit words
 * w[i] = mix(lineage, token, region) + i * golden, little-endian, truncated to the token's
 * length. Every (lineage, token, region) triple gives different bytes, so a page mapped at the
 * wrong place, a copy-on-write that leaked into a sibling, a stale swap slot or a block read
 * from the wrong file offset all show up as a mismatch naming the token and region.
 */
#include <string.h>
#include "stress.h"

static uint64_t mix(uint64_t lineage, uint64_t token, uint32_t region)
{
    uint64_t s = lineage * 0xD6E8FEB86659FD93ull ^ token * 0x9E3779B97F4A7C15ull ^
                 ((uint64_t)region + 1) * 0xC2B2AE3D27D4EB4Full;
    return rng_next(&s);
}

void pattern_fill(uint64_t lineage, uint64_t token, uint32_t region, void *buf, size_t len)
{
    uint64_t h = mix(lineage, token, region);
    unsigned char *p = buf;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w = h + (i / 8) * 0x9E3779B97F4A7C15ull;
        memcpy(p + i, &w, 8);
    }
    if (i < len) {
        uint64_t w = h + (i / 8) * 0x9E3779B97F4A7C15ull;
        memcpy(p + i, &w, len - i);
    }
}

long pattern_check(uint64_t lineage, uint64_t token, uint32_t region, const void *buf,
                   size_t len, uint64_t *expect_word, uint64_t *got_word)
{
    uint64_t h = mix(lineage, token, region);
    const unsigned char *p = buf;
    for (size_t i = 0; i < len; i += 8) {
        uint64_t w = h + (i / 8) * 0x9E3779B97F4A7C15ull, g = 0;
        size_t n = len - i < 8 ? len - i : 8;
        memcpy(&g, p + i, n);
        if (n < 8)
            w &= (~0ull) >> (8 * (8 - n));
        if (g != w) {
            if (expect_word)
                *expect_word = w;
            if (got_word)
                *got_word = g;
            for (size_t b = 0; b < n; b++)
                if (((g >> (8 * b)) & 0xff) != ((w >> (8 * b)) & 0xff))
                    return (long)(i + b);
            return (long)i;
        }
    }
    return -1;
}
