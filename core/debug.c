/*
 * core/debug.c: the test hooks of core/debug.h (the checker itself is paging/check.c).
 */
#include "core.h"
#include "core/debug.h"

#include <errno.h>
#include <stdio.h>
#include "common/assert.h"
#include "common/log.h"

/* kvvm_debug_check with kv->lock held. */
static int check_locked(kvvm *kv, char *why, size_t len)
{
    int rc = paging_check(kv->pg, why, len);
    if (!rc)
        rc = prefix_check(kv->pfx, why, len);   /* the entries' page references */
    if (!rc) {
        /* host tier conservation: every allocated slot is held by exactly one page */
        struct paging_counters c;
        paging_counters(kv->pg, &c);
        size_t used = host_slots_used(kv->host);
        if (c.pages_host != used) {
            klog_error("invariant violated: %llu pages hold host slots, the arena has %zu "
                       "allocated", (unsigned long long)c.pages_host, used);
            if (why && len)
                snprintf(why, len, "%llu pages hold host slots, the arena has %zu allocated",
                         (unsigned long long)c.pages_host, used);
            rc = -EUCLEAN;
        }
    }
    if (!rc && kv->spill) {
        /* disk tier conservation: every allocated disk slot is held by exactly one page */
        struct paging_counters c;
        struct spill_stats d;
        paging_counters(kv->pg, &c);
        spill_stats_get(kv->spill, &d);
        if (c.pages_disk != d.slots_total - d.slots_free) {
            klog_error("invariant violated: %llu pages hold disk slots, the spill file has "
                       "%llu allocated", (unsigned long long)c.pages_disk,
                       (unsigned long long)(d.slots_total - d.slots_free));
            if (why && len)
                snprintf(why, len, "%llu pages hold disk slots, the spill file has %llu "
                         "allocated", (unsigned long long)c.pages_disk,
                         (unsigned long long)(d.slots_total - d.slots_free));
            rc = -EUCLEAN;
        }
    }
    return rc;
}

int kvvm_debug_check(kvvm *kv, char *why, size_t len)
{
    if (!kv) {
        if (why && len)
            snprintf(why, len, "NULL context");
        return -EINVAL;
    }
    pthread_mutex_lock(&kv->lock);
    int rc = check_locked(kv, why, len);
    pthread_mutex_unlock(&kv->lock);
    return rc;
}

#ifdef KVVM_DEBUG
void core_debug_after_call(kvvm *kv, const char *call)
{
    if (kv->dead || vmm_dead(kv->v))
        return;                     /* a dead context's tables are not kept any more */
    if (check_locked(kv, NULL, 0))  /* the violation is logged by the checker */
        kassert_fail("kvvm_debug_check(kv) == 0 after the call", __FILE__, __LINE__, call);
}
#endif

struct spill *kvvm_debug_spill(kvvm *kv)
{
    return kv ? kv->spill : NULL;
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
