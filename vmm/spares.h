/*
 * vmm/spares.h: spare fences, for vmm.c and spares.c only (the layer's contract is vmm.h,
 * vmm_fence_reserve). Events created before a call moves anything (a reclaim's acquire:
 * paging_acquire), which vmm_fence_create hands out before it asks the driver, so that a
 * refused cuEventCreate cannot fail a call after its point of no return. A spare counts
 * as a live fence (n_fences) from its creation; vmm_close destroys those left.
 */
#ifndef KVVM_VMM_SPARES_H
#define KVVM_VMM_SPARES_H

#include <pthread.h>
#include <stdbool.h>
#include "vmm.h"

struct vmm_spares {
    pthread_mutex_t mu;                  /* guards the two below (any thread makes fences) */
    kcu_event ev[VMM_SPARE_FENCES];
    unsigned n;
    bool ready;                          /* vmm_spares_init ran (mu is a mutex) */
};

void vmm_spares_init(struct vmm_spares *s);
void vmm_spares_fini(struct vmm_spares *s);
/* A spare into *f; false when none is left. */
bool vmm_spares_take(struct vmm_spares *s, vmm_fence *f);
/* Destroys every spare (vmm_close_to, before its leak count). */
void vmm_spares_drain(struct vmm *v, struct vmm_spares *s);
/* v's spares (vmm.c). */
struct vmm_spares *vmm_spares_of(struct vmm *v);
/* A fence from the driver (cuEventCreate), never a spare. -ENOMEM, -EIO. */
int vmm_fence_new(struct vmm *v, vmm_fence *f);

#endif
