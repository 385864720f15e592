/*
 * vmm/drv_cuda.h: the real CUDA driver behind struct kcu_api (vmm/cudrv.h).
 *
 * Contract:
 *  - libcuda is never linked: drv_cuda_load() dlopen()s KVVM_CUDA_LIBRARY (default
 *    "libcuda.so.1") and resolves every table entry through cuGetProcAddress_v2 (CUDA 12+),
 *    else cuGetProcAddress (11.3+), at the ABI version written beside the entry in cudrv.h,
 *    with legacy default-stream semantics (the NULL stream is the legacy stream).
 *  - It tells "no CUDA here" (the library cannot be loaded, cuInit reports no device, or
 *    there are zero devices: docs/api.md's AUTO fallback) apart from "CUDA is here but unusable"
 *    (anything else), which must never silently become an emulated device. The toolkit's
    stub libcuda (CUDA_ERROR_STUB_LIBRARY) counts as "no CUDA here": it is not a driver.
 *  - The table is process-wide, like the driver: the first successful load is kept for the
 *    life of the process (KVVM_CUDA_LIBRARY is read until a load succeeds) and never
 *    unloaded. Failed loads are not cached. Thread-safe.
 */
#ifndef KVVM_VMM_DRV_CUDA_H
#define KVVM_VMM_DRV_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include "cudrv.h"

/* cuGetProcAddress_v2 (CUDA 12.0+) and cuGetProcAddress (11.3..12.x; 4 arguments). The
   status out-value is a CUdriverProcAddressQueryResult (int-sized enum). Checked against
   cuda.h in vmm/cudrv_check.c. */
typedef kcu_result (*drv_cuda_gpa_v2_fn)(const char *symbol, void **pfn, int cudaVersion,
                                         uint64_t flags, int *symbolStatus);
typedef kcu_result (*drv_cuda_gpa_v1_fn)(const char *symbol, void **pfn, int cudaVersion,
                                         uint64_t flags);
#define DRV_CUDA_GPA_LEGACY_STREAM    1   /* CU_GET_PROC_ADDRESS_LEGACY_STREAM */
#define DRV_CUDA_GPA_SUCCESS          0   /* CU_GET_PROC_ADDRESS_SUCCESS */
#define DRV_CUDA_GPA_SYMBOL_NOT_FOUND 1   /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
#define DRV_CUDA_GPA_VERSION_NOT_SUFFICIENT 2 /* CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT */

/* One table entry: its base name (cuGetProcAddress adds the _v2... suffix for the version),
   the cudaVersion it is requested at, and where it goes in struct kcu_api. */
struct drv_cuda_sym {
    const char *name;
    int version;
    size_t offset;
};
/* The entries drv_cuda_load resolves (every function field of struct kcu_api); *n = count.
   Exposed so tests can check a fake driver library against the same list. */
const struct drv_cuda_sym *drv_cuda_symbols(size_t *n);

/* Loads the driver and calls cuInit(0).
   0: *api is the filled table, named "cuda".
   -ENOENT: no CUDA here (library not loadable, the toolkit's stub library in its place
            (CUDA_ERROR_STUB_LIBRARY), cuInit: CUDA_ERROR_NO_DEVICE, or zero devices);
            why says which. The AUTO backend may fall back to the emulated device.
   -ENODEV: the driver is present but unusable (no cuGetProcAddress, an entry point missing
            at its version, another cuInit failure); why says which.
   why/why_len: a buffer for the reason (always NUL-terminated when why_len > 0). */
int drv_cuda_load(const struct kcu_api **api, char *why, size_t why_len);

#endif
