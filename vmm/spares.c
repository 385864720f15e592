/*
 * vmm/spares.c: spare fences (vmm/spares.h; the contract: vmm.h, vmm_fence_reserve).
 */
#include "spares.h"
#include "common/assert.h"

void vmm_spares_init(struct vmm_spares *s)
{
    pthread_mutex_init(&s->mu, NULL);
    s->n = 0;
    s->ready = true;
}

void vmm_spares_fini(struct vmm_spares *s)
{
    KVVM_ASSERT(s->ready);
    s->ready = false;
    pthread_mutex_destroy(&s->mu);
}

bool vmm_spares_take(struct vmm_spares *s, vmm_fence *f)
{
    KVVM_ASSERT(s->ready);
    pthread_mutex_lock(&s->mu);
    KVVM_ASSERT(s->n <= VMM_SPARE_FENCES);
    bool got = s->n > 0;
    if (got)
        f->ev = s->ev[--s->n];
    pthread_mutex_unlock(&s->mu);
    return got;
}

/* Keeps f as a spare; false when they are full (another thread filled them). */
static bool spares_put(struct vmm_spares *s, const vmm_fence *f)
{
    pthread_mutex_lock(&s->mu);
    KVVM_ASSERT(f->ev && s->n <= VMM_SPARE_FENCES);   /* a made fence, kept once */
    bool kept = s->n < VMM_SPARE_FENCES;
    if (kept)
        s->ev[s->n++] = f->ev;
    pthread_mutex_unlock(&s->mu);
    return kept;
}

static unsigned spares_count(struct vmm_spares *s)
{
    pthread_mutex_lock(&s->mu);
    unsigned n = s->n;
    pthread_mutex_unlock(&s->mu);
    return n;
}

int vmm_fence_reserve(struct vmm *v, unsigned n)
{
    struct vmm_spares *s = vmm_spares_of(v);
    if (n > VMM_SPARE_FENCES)
        n = VMM_SPARE_FENCES;
    while (spares_count(s) < n) {
        vmm_fence f;
        int rc = vmm_fence_new(v, &f);
        if (rc)
            return rc;                  /* the spares made stay: later calls use them */
        if (!spares_put(s, &f))
            vmm_fence_destroy(v, &f);
    }
    return 0;
}

void vmm_spares_drain(struct vmm *v, struct vmm_spares *s)
{
    vmm_fence f;
    while (vmm_spares_take(s, &f))
        vmm_fence_destroy(v, &f);
}
