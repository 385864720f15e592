/*
 * testing/hooks.c: the testing interface's hooks into a context (kvvm_debug_*,
 * testing/kvvm_testing.h). Each takes the context lock where a public call would; the
 * invariant check itself is core's (core/debug.h).
 */
#include "testing/kvvm_testing.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>

#include "core/core.h"
#include "core/debug.h"
#include "pool/client.h"
#include "prefix/prefix.h"

int kvvm_debug_check(kvvm *kv, char *why, size_t len)
{
    if (!kv) {
        if (why && len)
            snprintf(why, len, "NULL context");
        return -EINVAL;
    }
    pthread_mutex_lock(&kv->lock);
    int rc = core_check_locked(kv, why, len);
    pthread_mutex_unlock(&kv->lock);
    return rc;
}

int kvvm_debug_prefix_entry(kvvm *kv, uint64_t ns, const kvvm_key *key, uint8_t *where)
{
    if (!kv || !key)
        return -EINVAL;
    pthread_mutex_lock(&kv->lock);
    bool there = kv->pfx && prefix_peek(kv->pfx, ns, key->bytes, where);
    pthread_mutex_unlock(&kv->lock);
    return there ? 1 : 0;
}

struct disk *kvvm_debug_disk(kvvm *kv)
{
    return kv ? core_tiers_disk(kv) : NULL;
}

int kvvm_debug_emu_ordinal(kvvm *kv)
{
    return kv ? vmm_emu_ordinal(kv->v) : -1;
}

uint64_t kvvm_debug_pool_wakes(kvvm *kv)
{
    struct frames_counters c;
    pthread_mutex_lock(&kv->lock);
    frames_counters(kv->fr, &c);
    pthread_mutex_unlock(&kv->lock);
    return c.wakes;
}

uint64_t kvvm_debug_pool_return_msgs(kvvm *kv)
{
    struct pool_cli_counters c;
    pthread_mutex_lock(&kv->lock);
    core_pool_counters(kv, &c);
    pthread_mutex_unlock(&kv->lock);
    return c.return_msgs;
}

void *kvvm_debug_copy_stream(kvvm *kv)
{
    if (!kv)
        return NULL;
    pthread_mutex_lock(&kv->lock);
    void *s = paging_copy_stream(kv->pg);
    pthread_mutex_unlock(&kv->lock);
    return s;
}

int kvvm_debug_page_tier(kvvm *kv, kvvm_seq s, uint32_t r, uint32_t i, int *tier)
{
    if (!kv || !tier)
        return -EINVAL;
    enum pg_tier t;
    pthread_mutex_lock(&kv->lock);
    int rc = paging_seq_page_tier(kv->pg, s, r, i, &t);
    pthread_mutex_unlock(&kv->lock);
    if (rc)
        return rc;
    switch (t) {
    case PG_TIER_DEVICE: case PG_TIER_TO_HOST:      *tier = 1; break;
    case PG_TIER_HOST: case PG_TIER_TO_DEVICE:
    case PG_TIER_TO_DISK:                           *tier = 2; break;
    case PG_TIER_DISK: case PG_TIER_FROM_DISK:      *tier = 3; break;
    default:                                        *tier = 0; break;
    }
    return 0;
}
