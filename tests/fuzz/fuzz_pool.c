/* tests/fuzz/fuzz_pool.c: libFuzzer target over the pool protocol's one parser
   (pool/protocol.h pool_proto_check), which every byte a kvvmd receives from a client, and
   every byte a client receives from its daemon, goes through before anything reads a field.
   Input: one byte of descriptor count (0..3), then the message. Checked: the parser never
   reads past the bytes it is given (ASan), never accepts a message whose size is not its
   type's, and accepts descriptors on FRAMES only, exactly one per id not held (no held bit
   past its count), no
   hand-off chunk (EXPORT) or shared entry chunk (PREFIX_PUBLISH) past its total, no more
   keys than a message holds. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "pool/protocol.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int nfds = data[0] % 4;
    size_t n = size - 1;
    /* a copy of exactly n bytes: ASan catches a read past the message */
    unsigned char *buf = malloc(n ? n : 1);
    if (!buf)
        return 0;
    memcpy(buf, data + 1, n);
    unsigned type = 0;
    if (pool_proto_check(buf, n, nfds, &type) == 0) {
        struct pool_hdr h;
        memcpy(&h, buf, sizeof h);
        if (h.type != type || pool_proto_size(type) != n || h.magic != POOL_MAGIC)
            abort();
        if (nfds && type != POOL_MSG_FRAMES)
            abort();
        if (type == POOL_MSG_FRAMES) {      /* a descriptor per id not held, no bit past n */
            const struct pool_frames *m = (const void *)buf;
            uint64_t held = m->held;
            if (m->n > POOL_BATCH_MAX || (m->n < 64 && (held >> m->n)) ||
                m->n - (uint32_t)__builtin_popcountll(held) != (uint32_t)nfds)
                abort();
        }
        if (type == POOL_MSG_EXPORT) {      /* a hand-off's chunk: within its total */
            const struct pool_export *m = (const void *)buf;
            if (!m->n || m->n > POOL_BATCH_MAX || m->off >= m->total ||
                m->n > m->total - m->off || m->total > POOL_HANDOFF_MAX)
                abort();
        }
        if (type == POOL_MSG_PREFIX_PUBLISH) {  /* a shared entry's chunk: within its total */
            const struct pool_prefix_publish *m = (const void *)buf;
            if (!m->n || m->n > POOL_BATCH_MAX || m->off >= m->total ||
                m->n > m->total - m->off || m->total > POOL_REGIONS_MAX ||
                (m->last && m->off + m->n != m->total))
                abort();
        }
        if ((type == POOL_MSG_PREFIX_LOOKUP || type == POOL_MSG_PREFIX_ATTACH) &&
            (!((const struct pool_prefix_keys *)buf)->n ||
             ((const struct pool_prefix_keys *)buf)->n > POOL_PREFIX_KEYS))
            abort();
    }
    free(buf);
    return 0;
}
