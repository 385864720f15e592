/*
 * testing/kvvm_testing_driver.h: the driver part of the testing interface, for kvvm-gpucheck,
 * which compares the CUDA driver with the emulated device through the very driver table
 * libkvvm calls (docs/kvvm-gpucheck.md). Like kvvm_testing.h: not installed, not part of the
 * API, no compatibility promise; provided by the CMake target kvvm_testing.
 *
 * It re-exports the driver ABI, vmm/cudrv.h: struct kcu_api (the table of CUDA driver entry
 * points with cuda.h's exact signatures) and the kcu_* types and KCU_* constants. That header
 * holds no libkvvm state: it declares NVIDIA's documented driver API under a kcu/KCU prefix,
 * checked against cuda.h (vmm/cudrv_check.c) where the toolkit is found. Nothing else of the
 * vmm layer is reachable from here: the loader and the emulated device are opened through the
 * three calls below.
 */
#ifndef KVVM_TESTING_DRIVER_H
#define KVVM_TESTING_DRIVER_H

#include <stddef.h>
#include <stdint.h>
#include "../vmm/cudrv.h"   /* the driver ABI (see above); the one vmm header re-exported */
#include "kvvm_testing.h"

#ifdef __cplusplus
extern "C" {
#endif

/* libkvvm's loader of the real driver (vmm/drv_cuda.c: dlopen of KVVM_CUDA_LIBRARY, default
   libcuda.so.1, every entry resolved through cuGetProcAddress, then cuInit(0)). 0: *api is
   the process-wide table. -ENOENT no CUDA here; -ENODEV CUDA present but unusable; why says
   which (NUL-terminated when why_len > 0). */
int kvvm_testing_cuda_load(const struct kcu_api **api, char *why, size_t why_len);

/* The entries that loader resolves, one per function of struct kcu_api, in the table's
   order: the base name, the cudaVersion it is asked at, and its offset in struct kcu_api.
   *n = the count. */
struct kvvm_testing_cuda_sym {
    const char *name;
    int version;
    size_t offset;
};
const struct kvvm_testing_cuda_sym *kvvm_testing_cuda_symbols(size_t *n);

/* A new emulated device of capacity bytes (rounded down to the granule), granule 4 KiB ..
   2 MiB (power of two; 0 = 2 MiB), opaque: its windows never CPU-accessible. 0: *ordinal is
   what cuDeviceGet takes and *api the emulated driver's table (cuInit not called yet).
   -EINVAL bad arguments (api or ordinal NULL, a bad granule); -ENOMEM. */
int kvvm_testing_emu_device(size_t capacity, size_t granule, int opaque, int *ordinal,
                            const struct kcu_api **api);

/* cuGetProcAddress_v2 (CUDA 12.0+) and cuGetProcAddress (11.3..12.x), for a tool resolving
   entry points libkvvm's table lacks from the library the loader opened; the flag and the
   status values of CUdriverProcAddressQueryResult. */
typedef kcu_result (*kvvm_testing_gpa_v2_fn)(const char *symbol, void **pfn, int cudaVersion,
                                              uint64_t flags, int *symbolStatus);
typedef kcu_result (*kvvm_testing_gpa_v1_fn)(const char *symbol, void **pfn, int cudaVersion,
                                              uint64_t flags);
#define KVVM_TESTING_GPA_LEGACY_STREAM 1   /* CU_GET_PROC_ADDRESS_LEGACY_STREAM */
#define KVVM_TESTING_GPA_SUCCESS       0   /* CU_GET_PROC_ADDRESS_SUCCESS */

#ifdef __cplusplus
}
#endif
#endif
