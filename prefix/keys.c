/*
 * prefix/keys.c: the chained key scheme offered to engines without their own (contract in
 * prefix.h, prefix_chain_keys; docs/api.md "Prefix cache"): XXH3-128 over the previous key,
 * the block's token ids as little-endian int32 and the salt, so a key names its block and
 * everything before it, and two salts (models, adapters, tenants) never share a key.
 */
#include "prefix.h"

#include <string.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

/* Feeds n token ids as little-endian int32 (on a big-endian host, swapped in chunks). */
static void feed_tokens(XXH3_state_t *st, const int32_t *t, size_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    uint32_t buf[256];
    while (n) {
        size_t k = n < 256 ? n : 256;
        for (size_t i = 0; i < k; i++)
            buf[i] = __builtin_bswap32((uint32_t)t[i]);
        XXH3_128bits_update(st, buf, k * sizeof *buf);
        t += k;
        n -= k;
    }
#else
    XXH3_128bits_update(st, t, n * sizeof *t);
#endif
}

size_t prefix_chain_keys(const int32_t *tokens, size_t n_tokens, uint32_t tokens_per_block,
                         const void *salt, size_t salt_len, void *keys, size_t cap)
{
    if (!tokens || !keys || !tokens_per_block || (!salt && salt_len))
        return 0;
    size_t n = n_tokens / tokens_per_block;
    if (n > cap)
        n = cap;
    uint8_t *out = keys;
    XXH3_state_t st;
    for (size_t i = 0; i < n; i++) {
        XXH3_128bits_reset(&st);
        if (i)                           /* key -1 is the empty string */
            XXH3_128bits_update(&st, out + (i - 1) * PREFIX_KEY_BYTES, PREFIX_KEY_BYTES);
        feed_tokens(&st, tokens + i * tokens_per_block, tokens_per_block);
        if (salt_len)
            XXH3_128bits_update(&st, salt, salt_len);
        XXH128_canonical_t c;
        XXH128_canonicalFromHash(&c, XXH3_128bits_digest(&st));
        memcpy(out + i * PREFIX_KEY_BYTES, c.digest, sizeof c.digest);
        memset(out + i * PREFIX_KEY_BYTES + sizeof c.digest, 0,
               PREFIX_KEY_BYTES - sizeof c.digest);
    }
    return n;
}
