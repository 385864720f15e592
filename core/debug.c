/*
 * core/debug.c: the whole-context invariant check of core/debug.h (paging's own checker is
 * paging/check.c; then every tier of the list: a page tier's slots against paging's count,
 * and each tier's own check, core_tier_check), and the debug build's check after every
 * public call. The testing
 * interface's hooks (kvvm_debug_*) are testing/hooks.c.
 */
#include "core.h"
#include "core/debug.h"

#include <errno.h>
#include <stdio.h>
#include "common/assert.h"
#include "common/log.h"

int core_check_locked(kvvm *kv, char *why, size_t len)
{
    int rc = paging_check(kv->pg, why, len);
    if (!rc)
        rc = prefix_check(kv->pfx, why, len);   /* the entries' page references */
    struct paging_counters c;
    paging_counters(kv->pg, &c);
    for (unsigned t = 0; !rc && t < CORE_N_LEVELS; t++) {
        rc = core_tier_check(kv, t, why, len);    /* its own (the store: its queue's) */
        if (rc || core_tier_kind(t) != CORE_TIER_PAGES)
            continue;
        /* each page tier's conservation: every slot in use is held by exactly one page */
        struct core_tier_stats ts;
        core_tier_stats(kv, t, &ts);
        uint64_t used = ts.total - ts.free;
        if (c.pages_lower[t] == used)
            continue;
        const char *name = kv->tier[t].e ? kv->tier[t].e->name : "absent";
        klog_error("invariant violated: %llu pages hold %s slots, the %s tier has %llu "
                   "allocated", (unsigned long long)c.pages_lower[t], name, name,
                   (unsigned long long)used);
        if (why && len)
            snprintf(why, len, "%llu pages hold %s slots, the %s tier has %llu allocated",
                     (unsigned long long)c.pages_lower[t], name, name,
                     (unsigned long long)used);
        rc = -EUCLEAN;
    }
    return rc;
}

#ifdef KVVM_DEBUG
void core_debug_after_call(kvvm *kv, const char *call)
{
    if (kv->dead || vmm_dead(kv->v))
        return;                     /* a dead context's tables are not kept any more */
    if (core_check_locked(kv, NULL, 0))  /* the violation is logged by the checker */
        kassert_fail("core_check_locked(kv) == 0 after the call", __FILE__, __LINE__, call);
}
#endif

