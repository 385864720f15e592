/*
 * core/debug.c: the whole-context invariant check of core/debug.h (paging's own checker is
 * paging/check.c), and the debug build's check after every public call. The testing
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
    if (!rc && kv->disk) {
        /* disk tier conservation: every allocated disk slot is held by exactly one page */
        struct paging_counters c;
        struct disk_stats d;
        paging_counters(kv->pg, &c);
        disk_stats_get(kv->disk, &d);
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

#ifdef KVVM_DEBUG
void core_debug_after_call(kvvm *kv, const char *call)
{
    if (kv->dead || vmm_dead(kv->v))
        return;                     /* a dead context's tables are not kept any more */
    if (core_check_locked(kv, NULL, 0))  /* the violation is logged by the checker */
        kassert_fail("core_check_locked(kv) == 0 after the call", __FILE__, __LINE__, call);
}
#endif

