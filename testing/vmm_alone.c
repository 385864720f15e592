/*
 * testing/vmm_alone.c: the vmm layer and the bare driver calls under it, for kvvm-bench's
 * foundation figures (testing/kvvm_testing.h). Each function is one call of the layer below,
 * its arguments converted to the layer's types (checked equal in size below).
 */
#include "testing/kvvm_testing.h"

#include <errno.h>

#include "vmm/emu/emu.h"
#include "vmm/vmm.h"

_Static_assert(sizeof(kvvm_testing_page) == sizeof(vmm_handle), "kvvm_testing_page");
_Static_assert(sizeof(kvvm_testing_stream) == sizeof(kcu_stream), "kvvm_testing_stream");
_Static_assert(sizeof(unsigned long long) == sizeof(kcu_mem_handle), "raw handle");
_Static_assert(sizeof(uint64_t) == sizeof(kcu_deviceptr), "raw device pointer");
_Static_assert(KVVM_TESTING_EMU_POISON == EMU_POISON, "KVVM_TESTING_EMU_POISON");

#define V(v) ((struct vmm *)(v))
#define VC(v) ((const struct vmm *)(v))
#define S(s) ((kcu_stream)(s))
#define PG(h) ((vmm_handle){ (h).h })

int kvvm_testing_vmm_open(const struct kvvm_testing_vmm_params *p, kvvm_testing_vmm **out)
{
    if (!p || !out)
        return -EINVAL;
    struct vmm_params vp = { .backend = p->backend, .device = p->device,
                             .emu_capacity = p->emu_capacity, .emu_granule = p->emu_granule,
                             .emu_opaque = p->emu_opaque };
    struct vmm *v = NULL;
    int rc = vmm_open(&vp, &v);
    *out = (kvvm_testing_vmm *)v;
    return rc;
}

void kvvm_testing_vmm_close(kvvm_testing_vmm *v) { vmm_close(V(v)); }
const char *kvvm_testing_vmm_backend_name(const kvvm_testing_vmm *v)
{
    return vmm_backend_name(VC(v));
}
size_t kvvm_testing_vmm_granule(const kvvm_testing_vmm *v) { return vmm_granule(VC(v)); }
int kvvm_testing_vmm_make_current(kvvm_testing_vmm *v) { return vmm_make_current(V(v)); }
int kvvm_testing_vmm_reserve(kvvm_testing_vmm *v, size_t bytes, uint64_t *base)
{
    return vmm_reserve(V(v), bytes, base);
}
void kvvm_testing_vmm_unreserve(kvvm_testing_vmm *v) { vmm_unreserve(V(v)); }

int kvvm_testing_vmm_phys_create(kvvm_testing_vmm *v, size_t bytes, kvvm_testing_page *out)
{
    vmm_handle h = { 0 };
    int rc = vmm_phys_create(V(v), bytes, &h);
    if (!rc)
        out->h = h.h;
    return rc;
}

int kvvm_testing_vmm_phys_release(kvvm_testing_vmm *v, kvvm_testing_page h)
{
    return vmm_phys_release(V(v), PG(h));
}

int kvvm_testing_vmm_map_run(kvvm_testing_vmm *v, uint64_t va, const kvvm_testing_page *pages,
                             size_t n, size_t page_size)
{
    /* same size and layout (a struct of one unsigned long long each) */
    return vmm_map_run(V(v), va, (const vmm_handle *)(const void *)pages, n, page_size);
}

int kvvm_testing_vmm_unmap(kvvm_testing_vmm *v, uint64_t va, size_t bytes)
{
    return vmm_unmap(V(v), va, bytes);
}

int kvvm_testing_vmm_stream_create(kvvm_testing_vmm *v, kvvm_testing_stream *out)
{
    kcu_stream s = NULL;
    int rc = vmm_stream_create(V(v), &s);
    *out = s;
    return rc;
}

int kvvm_testing_vmm_stream_destroy(kvvm_testing_vmm *v, kvvm_testing_stream s)
{
    return vmm_stream_destroy(V(v), S(s));
}

int kvvm_testing_vmm_stream_sync(kvvm_testing_vmm *v, kvvm_testing_stream s)
{
    return vmm_stream_sync(V(v), S(s));
}

int kvvm_testing_vmm_copy_htod(kvvm_testing_vmm *v, uint64_t dst, const void *src, size_t n,
                               kvvm_testing_stream s)
{
    return vmm_copy_htod(V(v), dst, src, n, S(s));
}

int kvvm_testing_vmm_copy_dtoh(kvvm_testing_vmm *v, void *dst, uint64_t src, size_t n,
                               kvvm_testing_stream s)
{
    return vmm_copy_dtoh(V(v), dst, src, n, S(s));
}

int kvvm_testing_vmm_copy_dtod(kvvm_testing_vmm *v, uint64_t dst, uint64_t src, size_t n,
                               kvvm_testing_stream s)
{
    return vmm_copy_dtod(V(v), dst, src, n, S(s));
}

int kvvm_testing_vmm_host_alloc(kvvm_testing_vmm *v, size_t bytes, void **out)
{
    return vmm_host_alloc(V(v), bytes, out);
}

void kvvm_testing_vmm_host_free(kvvm_testing_vmm *v, void *p) { vmm_host_free(V(v), p); }

/* --- the bare driver calls --------------------------------------------------------------- */

#define API(v) vmm_api(VC(v))

int kvvm_testing_raw_device(kvvm_testing_vmm *v, int ordinal, int *dev)
{
    kcu_device d = 0;
    kcu_result r = API(v)->cuDeviceGet(&d, ordinal);
    *dev = (int)d;
    return r;
}

int kvvm_testing_raw_reserve(kvvm_testing_vmm *v, uint64_t *va, size_t bytes, size_t align)
{
    kcu_deviceptr p = 0;
    kcu_result r = API(v)->cuMemAddressReserve(&p, bytes, align, 0, 0);
    *va = p;
    return r;
}

int kvvm_testing_raw_free(kvvm_testing_vmm *v, uint64_t va, size_t bytes)
{
    return API(v)->cuMemAddressFree(va, bytes);
}

int kvvm_testing_raw_create(kvvm_testing_vmm *v, int dev, size_t bytes,
                            unsigned long long *handle)
{
    struct kcu_mem_alloc_prop prop = { .type = KCU_MEM_ALLOCATION_TYPE_PINNED,
        .location = { .type = KCU_MEM_LOCATION_TYPE_DEVICE, .id = dev } };
    kcu_mem_handle h = 0;
    kcu_result r = API(v)->cuMemCreate(&h, bytes, &prop, 0);
    *handle = h;
    return r;
}

int kvvm_testing_raw_release(kvvm_testing_vmm *v, unsigned long long handle)
{
    return API(v)->cuMemRelease(handle);
}

int kvvm_testing_raw_map(kvvm_testing_vmm *v, uint64_t va, size_t bytes,
                         unsigned long long handle)
{
    return API(v)->cuMemMap(va, bytes, 0, handle, 0);
}

int kvvm_testing_raw_set_access(kvvm_testing_vmm *v, int dev, uint64_t va, size_t bytes)
{
    struct kcu_mem_access_desc acc = {
        .location = { .type = KCU_MEM_LOCATION_TYPE_DEVICE, .id = dev },
        .flags = KCU_MEM_ACCESS_FLAGS_PROT_READWRITE };
    return API(v)->cuMemSetAccess(va, bytes, &acc, 1);
}

int kvvm_testing_raw_unmap(kvvm_testing_vmm *v, uint64_t va, size_t bytes)
{
    return API(v)->cuMemUnmap(va, bytes);
}

int kvvm_testing_raw_copy_htod(kvvm_testing_vmm *v, uint64_t dst, const void *src, size_t n,
                               kvvm_testing_stream s)
{
    return API(v)->cuMemcpyHtoDAsync(dst, src, n, S(s));
}

int kvvm_testing_raw_copy_dtoh(kvvm_testing_vmm *v, void *dst, uint64_t src, size_t n,
                               kvvm_testing_stream s)
{
    return API(v)->cuMemcpyDtoHAsync(dst, src, n, S(s));
}

int kvvm_testing_raw_copy_dtod(kvvm_testing_vmm *v, uint64_t dst, uint64_t src, size_t n,
                               kvvm_testing_stream s)
{
    return API(v)->cuMemcpyDtoDAsync(dst, src, n, S(s));
}

int kvvm_testing_raw_stream_sync(kvvm_testing_vmm *v, kvvm_testing_stream s)
{
    return API(v)->cuStreamSynchronize(S(s));
}

const char *kvvm_testing_raw_errstr(kvvm_testing_vmm *v, int result)
{
    return kcu_errstr(API(v), result);
}
