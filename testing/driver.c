/*
 * testing/driver.c: the driver part of the testing interface (testing/kvvm_testing_driver.h):
 * libkvvm's loader and the emulated device, each one call of the vmm layer's own.
 */
#include "testing/kvvm_testing_driver.h"

#include <errno.h>
#include <stddef.h>

#include "vmm/drv_cuda.h"
#include "vmm/emu/emu.h"

/* The symbol list is handed out as it is: the two structs are one layout. */
_Static_assert(sizeof(struct kvvm_testing_cuda_sym) == sizeof(struct drv_cuda_sym), "sym");
_Static_assert(offsetof(struct kvvm_testing_cuda_sym, name) ==
               offsetof(struct drv_cuda_sym, name), "sym.name");
_Static_assert(offsetof(struct kvvm_testing_cuda_sym, version) ==
               offsetof(struct drv_cuda_sym, version), "sym.version");
_Static_assert(offsetof(struct kvvm_testing_cuda_sym, offset) ==
               offsetof(struct drv_cuda_sym, offset), "sym.offset");
_Static_assert(KVVM_TESTING_GPA_LEGACY_STREAM == DRV_CUDA_GPA_LEGACY_STREAM, "gpa flag");
_Static_assert(KVVM_TESTING_GPA_SUCCESS == DRV_CUDA_GPA_SUCCESS, "gpa status");

int kvvm_testing_cuda_load(const struct kcu_api **api, char *why, size_t why_len)
{
    if (!api)
        return -EINVAL;
    return drv_cuda_load(api, why, why_len);
}

const struct kvvm_testing_cuda_sym *kvvm_testing_cuda_symbols(size_t *n)
{
    return (const struct kvvm_testing_cuda_sym *)(const void *)drv_cuda_symbols(n);
}

int kvvm_testing_emu_device(size_t capacity, size_t granule, int opaque, int *ordinal,
                            const struct kcu_api **api)
{
    if (!ordinal || !api)
        return -EINVAL;
    struct emu_device_params p = { .capacity = capacity, .granule = granule,
                                   .opaque = opaque };
    int err = emu_device_create(&p, ordinal);
    if (err)
        return err;
    *api = emu_api();
    return 0;
}
