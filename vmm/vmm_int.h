/*
 * vmm/vmm_int.h: the vmm's state and the helpers its files share (vmm.c, share.c); the
 * layer's contract is vmm.h. Not included outside vmm/.
 */
#ifndef KVVM_VMM_VMM_INT_H
#define KVVM_VMM_VMM_INT_H

#include "spares.h"
#include "vmm.h"

struct vmm {
    const struct kcu_api *api;
    kcu_device dev;
    kcu_context ctx;            /* retained primary context */
    int emu_ordinal;            /* emulated device we created, or -1 */
    const struct kcu_debug *dbg; /* the driver's debug hooks (emulated only), or NULL */
    size_t granule;             /* minimum allocation granularity, bytes */
    size_t device_bytes;
    char dev_name[128];
    int dead;                   /* atomic: a sticky driver error was seen */

    uint64_t base;              /* the reservation; 0 = none. Owned by the opener's thread */
    size_t reserved;            /* bytes */

    /* Live objects, for leak reports at close (atomics: calls come from any thread). */
    int64_t n_handles, n_mapped_bytes, n_streams, n_fences, n_host_allocs, n_host_regs;
    uint64_t n_create_oom;      /* atomic: cuMemCreate out-of-memory failures */
    int unmap_each;             /* the driver refused one cuMemUnmap over several mappings
                                   (probe_unmap_span at open): vmm_unmap unmaps each */
    size_t map_unit;            /* atomic: bytes of one mapping (vmm_map_run's page_size) */
    struct vmm_spares spares;   /* fences made ahead (spares.c) */
    bool shareable;             /* frames created exportable (vmm_params.shareable) */
};


/* Makes v's context current on the calling thread (saving the caller's for vmm_call_end).
   0; -EIO dead or refused. */
int vmm_enter(struct vmm *v);
/* Logs a failed driver call as an error and returns its errno (vmm.c's mapping). */
int vmm_drv_fail(struct vmm *v, const char *entry, kcu_result r);
/* Adds d to a live-object count (atomic). */
void vmm_count(int64_t *c, int64_t d);

#endif
