/*
 * tools/kvvm-gpucheck/oom.c: the out-of-memory probe (docs/kvvm-gpucheck.md, "oom").
 *
 * A libkvvm context whose device budget is larger than the device's free memory, as when
 * PyTorch or another process holds part of the GPU: kvvm_open clamps the budget to the free
 * memory (and the clamped budget can be used), and with create_at_open refuses with -ENOMEM.
 * On the emulated device the memory "held by others" is KVVM_EMU_HELD (16 of 64 MiB); on a
 * GPU (where the probe itself holds a granule besides what others hold) the budget is the
 * free memory plus 1 GiB (at most the device's total).
 */
#include "gpucheck.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvvm.h"

#define MiB ((size_t)1 << 20)

static const char *errname(int rc)
{
    return rc == 0 ? "ok" : rc == -ENOMEM ? "ENOMEM" : rc == -EINVAL ? "EINVAL"
         : rc == -ENODEV ? "ENODEV" : rc == -EIO ? "EIO" : "error";
}

void gc_oom_budget(struct gc_dev *d)
{
    const char *id = "oom.budget_above_free";
    struct kvvm_config c;
    size_t fr = 0, tot = 0;
    kcu_mem_handle held = 0;
    if (d->emulated) {
        setenv("KVVM_EMU_HELD", "16M", 1);
        kvvm_config_init(&c);
        c.backend = KVVM_BACKEND_EMULATED;
        c.emu_device_bytes = 64 * MiB;
        c.emu_granule = 2 * MiB;
        c.device_budget = 64 * MiB;
        fr = 48 * MiB;
        tot = 64 * MiB;
    } else {
        /* this process holds a granule itself, so that some memory is held by another
           user even on a device nothing else uses */
        kcu_result r = gc_create(d, d->g, &held);
        if (!r)
            r = d->a->cuMemGetInfo(&fr, &tot);
        if (r) {
            gc_row(id, "error: setup", "cuMemGetInfo: %s", gc_err(d->a, r));
            return;
        }
        kvvm_config_init(&c);
        c.backend = KVVM_BACKEND_CUDA;
        c.device = d->o->device;
        size_t b = fr + 1024 * MiB;
        c.device_budget = (b < tot ? b : tot) / d->g * d->g;
        if (c.device_budget <= fr) {
            gc_row(id, "inconclusive", "nothing else holds device memory: %zu of %zu MiB "
                   "free", fr >> 20, tot >> 20);
            return;
        }
    }
    c.n_regions = 2;
    c.bytes_per_token = 4096;
    c.max_seqs = 4;
    c.max_tokens = 1024;                 /* 4 MiB per region: a sequence fits the budget */
    c.host_budget = 0;
    c.pool_thread = 0;
    kvvm *kv = NULL;
    int rc = kvvm_open(&c, &kv);
    char res[96];
    struct kvvm_stats st = { .size = sizeof st };
    int grow = -1;
    if (!rc) {
        kvvm_seq s;
        grow = kvvm_seq_create(kv, &s);
        if (!grow)
            grow = kvvm_seq_grow(kv, s, c.max_tokens);
        kvvm_stats(kv, &st);
        kvvm_close(kv);
    }
    bool clamped = !rc && st.device_budget < c.device_budget &&
                   st.device_budget <= st.device_mem_free + st.device_bytes_held;
    c.create_at_open = 1;
    kv = NULL;
    int rc2 = kvvm_open(&c, &kv);
    if (!rc2)
        kvvm_close(kv);
    if (held)
        d->a->cuMemRelease(held);
    if (rc)
        snprintf(res, sizeof res, "open:%s", errname(rc));
    else
        snprintf(res, sizeof res, "%s create_at_open:%s", clamped ? "clamped" : "not clamped",
                 errname(rc2));
    gc_row(id, res, "budget %zu MiB with %zu of %zu MiB free: the context's budget %llu MiB, "
           "free at its stats %llu MiB, a grow within it: %s; with create_at_open: %s",
           c.device_budget >> 20, fr >> 20, tot >> 20,
           (unsigned long long)(st.device_budget >> 20),
           (unsigned long long)(st.device_mem_free >> 20), errname(grow), errname(rc2));
}
