/*
 * core/frame_src.c: where paging's device frames come from (paging.h struct pg_frame_src),
 * picked in one place for kvvm_open: the pool daemon's leases when the context is a pool
 * client (core/pool_client.c, core_pool_source), else this process's own frames, the local
 * source below (vmm_phys_create / vmm_phys_release of page_size bytes through the vmm:
 * cuMemCreate / cuMemRelease, or the emulated device's). paging always gets a source and
 * never special-cases one: a new source (0.4's shared pages, a test's) is one more struct
 * pg_frame_src here, not a branch in paging.
 *
 * The local source's arg is the context: it reads kv->v and kv->cfg.page_size, immutable
 * after open, so the frame pool thread and the callers may call it at once (the vmm's
 * calls are thread-safe).
 */
#include "core.h"

#include "common/assert.h"

static int local_create(void *arg, vmm_handle *out, uint32_t need)
{
    kvvm *kv = arg;
    (void)need;                     /* a local frame is made when asked: no lease to size */
    return vmm_phys_create(kv->v, kv->cfg.page_size, out);
}

static int local_release(void *arg, vmm_handle h)
{
    kvvm *kv = arg;
    return vmm_phys_release(kv->v, h);
}

const struct pg_frame_src *core_frame_source(kvvm *kv)
{
    const struct pg_frame_src *pool = core_pool_source(kv);   /* NULL without a pool */
    if (pool)
        return pool;
    KVVM_ASSERT(kv->v && kv->cfg.page_size);   /* after the vmm and the layout */
    kv->local_src = (struct pg_frame_src){ .create = local_create, .release = local_release,
                                           .arg = kv };
    return &kv->local_src;
}
