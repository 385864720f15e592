/*
 * vmm/cudrv.c: helpers over the driver table (cudrv.h) that every user of a table needs,
 * whichever driver fills it. Depends on nothing but the table, so the drivers (drv_cuda.c,
 * vmm/emu/) and vmm.c can all use it without depending on each other.
 */
#include "cudrv.h"

#include <stdio.h>

const char *kcu_errstr(const struct kcu_api *api, kcu_result r)
{
    static __thread char buf[256];
    const char *name = NULL, *desc = NULL;
    if (api && api->cuGetErrorName && api->cuGetErrorName(r, &name) != KCU_SUCCESS)
        name = NULL;
    if (api && api->cuGetErrorString && api->cuGetErrorString(r, &desc) != KCU_SUCCESS)
        desc = NULL;
    if (name && desc)
        snprintf(buf, sizeof buf, "%s: %s", name, desc);
    else if (name)
        snprintf(buf, sizeof buf, "%s", name);
    else
        snprintf(buf, sizeof buf, "CUDA error %d", r);
    return buf;
}
