/*
 * core/debug.c: the test hooks of core/debug.h (the checker itself is paging/check.c).
 */
#include "core.h"
#include "core/debug.h"

#include <errno.h>
#include <stdio.h>

int kvvm_debug_check(kvvm *kv, char *why, size_t len)
{
    if (!kv) {
        if (why && len)
            snprintf(why, len, "NULL context");
        return -EINVAL;
    }
    pthread_mutex_lock(&kv->lock);
    int rc = paging_check(kv->pg, why, len);
    pthread_mutex_unlock(&kv->lock);
    return rc;
}

int kvvm_debug_emu_ordinal(kvvm *kv)
{
    return kv ? vmm_emu_ordinal(kv->v) : -1;
}
