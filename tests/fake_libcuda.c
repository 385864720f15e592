/*
 * tests/fake_libcuda.c: a stand-in for libcuda.so.1 so the CUDA loader (vmm/drv_cuda.c) is
 * tested on machines without a GPU. It exports only cuGetProcAddress_v2 (CUDA 12+) and
 * cuGetProcAddress (11.3+; the only one with -DFAKE_V1_ONLY), and hands out the emulated
 * device's entry points (its own copy of the emulator, linked in statically).
 *
 * Like the real driver it answers by (base name, requested cudaVersion): each name has the
 * version its current ABI appeared in and, where a newer ABI exists (cuCtxSynchronize took a
 * context at 13000), the version that replaced it. Those numbers are written here from
 * cudaTypedefs.h independently of drv_cuda.c. A request below the ABI's version is refused
 * (CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT); a request at or past the replacing version
 * gets a function that fails with CUDA_ERROR_UNKNOWN (a wrong ABI would crash a real
 * process); both are counted as violations for the test to read.
 *
 * FAKE_CUDA_MODE (read at cuInit): "nodevice" cuInit -> CUDA_ERROR_NO_DEVICE; "zero" no
 * devices; "initfail" cuInit -> CUDA_ERROR_NOT_PERMITTED; "novmm" the VMM attribute is 0.
 * The emulated device behind it: 64 KiB granule, 64 MiB, opaque; FAKE_CUDA_GIB and
 * FAKE_CUDA_GRANULE_KIB give it a GPU's size and granule (kvvm-bench --backend cuda on it).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vmm/cudrv.h"
#include "vmm/emu/emu.h"

#define EXPORT __attribute__((visibility("default")))

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int device = -1;                /* emulated ordinal, created at the first cuInit */
static const char *mode = "";

static kcu_result fake_cuInit(unsigned int flags)
{
    pthread_mutex_lock(&lock);
    const char *m = getenv("FAKE_CUDA_MODE");
    mode = m ? m : "";
    kcu_result r = KCU_SUCCESS;
    if (!strcmp(mode, "nodevice"))
        r = KCU_ERROR_NO_DEVICE;
    else if (!strcmp(mode, "initfail"))
        r = KCU_ERROR_NOT_PERMITTED;
    else if (device < 0) {
        /* a GPU's shape, for a bench: FAKE_CUDA_GIB GiB, granule FAKE_CUDA_GRANULE_KIB */
        const char *gib = getenv("FAKE_CUDA_GIB"), *kib = getenv("FAKE_CUDA_GRANULE_KIB");
        size_t cap = gib && atoi(gib) > 0 ? (size_t)atoi(gib) << 30 : (size_t)64 << 20;
        size_t gran = kib && atoi(kib) > 0 ? (size_t)atoi(kib) << 10 : (size_t)64 << 10;
        struct emu_device_params p = { .capacity = cap, .granule = gran, .opaque = 1 };
        if (emu_device_create(&p, &device))
            r = KCU_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&lock);
    return r ? r : emu_api()->cuInit(flags);
}

static kcu_result fake_cuDeviceGetCount(int *count)
{
    if (!strcmp(mode, "zero")) {
        *count = 0;
        return KCU_SUCCESS;
    }
    return emu_api()->cuDeviceGetCount(count);
}

static kcu_result fake_cuDeviceGetAttribute(int *pi, int attrib, kcu_device dev)
{
    if (!strcmp(mode, "novmm") &&
        attrib == KCU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) {
        *pi = 0;
        return KCU_SUCCESS;
    }
    return emu_api()->cuDeviceGetAttribute(pi, attrib, dev);
}

static kcu_result wrong_abi(void)
{
    return KCU_ERROR_UNKNOWN;
}

/* name, first version of the ABI cudrv.h declares, version of the next ABI (0 = none). */
static const struct { const char *name; int since, until; } abis[] = {
    { "cuInit", 2000, 0 },              { "cuDriverGetVersion", 2020, 0 },
    { "cuDeviceGetCount", 2000, 0 },    { "cuDeviceGet", 2000, 0 },
    { "cuDeviceGetAttribute", 2000, 0 }, { "cuDeviceGetName", 2000, 0 },
    { "cuDeviceTotalMem", 3020, 0 },    { "cuDevicePrimaryCtxRetain", 7000, 0 },
    { "cuMemGetInfo", 3020, 0 },
    { "cuDevicePrimaryCtxRelease", 11000, 0 }, { "cuCtxSetCurrent", 4000, 0 },
    { "cuCtxGetCurrent", 4000, 0 },     { "cuCtxSynchronize", 2000, 13000 },
    { "cuMemGetAllocationGranularity", 10020, 0 }, { "cuMemAddressReserve", 10020, 0 },
    { "cuMemAddressFree", 10020, 0 },   { "cuMemCreate", 10020, 0 },
    { "cuMemRelease", 10020, 0 },       { "cuMemMap", 10020, 0 },
    { "cuMemUnmap", 10020, 0 },         { "cuMemSetAccess", 10020, 0 },
    { "cuMemExportToShareableHandle", 10020, 0 },
    { "cuMemImportFromShareableHandle", 10020, 0 },
    { "cuMemcpyHtoDAsync", 3020, 0 },   { "cuMemcpyDtoHAsync", 3020, 0 },
    { "cuMemcpyDtoDAsync", 3020, 0 },   { "cuMemsetD8Async", 3020, 0 },
    { "cuStreamCreate", 2000, 0 },      { "cuStreamDestroy", 4000, 0 },
    { "cuStreamSynchronize", 2000, 0 }, { "cuStreamQuery", 2000, 0 },
    { "cuStreamWaitEvent", 3020, 0 },   { "cuStreamIsCapturing", 10000, 0 },
    { "cuStreamGetCtx", 9020, 12050 },
    { "cuThreadExchangeStreamCaptureMode", 10010, 0 },
    { "cuEventCreate", 2000, 0 },       { "cuEventDestroy", 4000, 0 },
    { "cuEventRecord", 2000, 0 },       { "cuEventQuery", 2000, 0 },
    { "cuEventSynchronize", 2000, 0 },  { "cuMemHostRegister", 6050, 0 },
    { "cuMemHostUnregister", 4000, 0 }, { "cuMemAllocHost", 3020, 0 },
    { "cuMemFreeHost", 2000, 0 },       { "cuPointerGetAttribute", 4000, 0 },
    { "cuGetErrorString", 6000, 0 },
    { "cuGetErrorName", 6000, 0 },
};
#define N_ABIS (sizeof abis / sizeof abis[0])

static int requested[N_ABIS];          /* the last version asked for each name; 0 = never */
static uint64_t requested_flags[N_ABIS];
static int violations;
static char last_violation[128];

/* The emulator's function for a name: its table is laid out as in cudrv.h, so look the
   name up in a list of (name, pointer) built from the table. */
static void *emu_fn(const char *name)
{
    const struct kcu_api *a = emu_api();
#define F(n) if (!strcmp(name, #n)) return (void *)a->n;
    F(cuDriverGetVersion) F(cuDeviceGet) F(cuDeviceGetName) F(cuDeviceTotalMem) F(cuMemGetInfo)
    F(cuDevicePrimaryCtxRetain) F(cuDevicePrimaryCtxRelease) F(cuCtxSetCurrent)
    F(cuCtxGetCurrent) F(cuCtxSynchronize) F(cuMemGetAllocationGranularity)
    F(cuMemAddressReserve) F(cuMemAddressFree) F(cuMemCreate) F(cuMemRelease) F(cuMemMap)
    F(cuMemUnmap) F(cuMemSetAccess) F(cuMemExportToShareableHandle)
    F(cuMemImportFromShareableHandle) F(cuMemcpyHtoDAsync) F(cuMemcpyDtoHAsync)
    F(cuMemcpyDtoDAsync) F(cuMemsetD8Async) F(cuStreamCreate) F(cuStreamDestroy)
    F(cuStreamSynchronize) F(cuStreamQuery) F(cuStreamWaitEvent) F(cuStreamIsCapturing) F(cuStreamGetCtx)
    F(cuThreadExchangeStreamCaptureMode)
    F(cuEventCreate) F(cuEventDestroy) F(cuEventRecord) F(cuEventQuery)
    F(cuEventSynchronize) F(cuMemHostRegister) F(cuMemHostUnregister) F(cuMemAllocHost)
    F(cuMemFreeHost) F(cuPointerGetAttribute) F(cuGetErrorString) F(cuGetErrorName)
#undef F
    if (!strcmp(name, "cuInit"))
        return (void *)fake_cuInit;
    if (!strcmp(name, "cuDeviceGetCount"))
        return (void *)fake_cuDeviceGetCount;
    if (!strcmp(name, "cuDeviceGetAttribute"))
        return (void *)fake_cuDeviceGetAttribute;
    return NULL;
}

static kcu_result lookup(const char *symbol, void **pfn, int version, uint64_t flags,
                         int *status)
{
    *pfn = NULL;
    int st = 1;                                  /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
    kcu_result r = KCU_ERROR_NOT_FOUND;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < N_ABIS; i++) {
        if (strcmp(abis[i].name, symbol))
            continue;
        requested[i] = version;
        requested_flags[i] = flags;
        if (version < abis[i].since) {
            st = 2;                              /* VERSION_NOT_SUFFICIENT */
            violations++;
            snprintf(last_violation, sizeof last_violation, "%s at %d < %d", symbol, version,
                     abis[i].since);
        } else if (abis[i].until && version >= abis[i].until) {
            *pfn = (void *)wrong_abi;            /* the newer ABI: not what cudrv.h says */
            st = 0;
            r = KCU_SUCCESS;
            violations++;
            snprintf(last_violation, sizeof last_violation, "%s at %d >= %d", symbol, version,
                     abis[i].until);
        } else {
            *pfn = emu_fn(symbol);
            st = 0;
            r = KCU_SUCCESS;
        }
        break;
    }
    pthread_mutex_unlock(&lock);
    if (status)
        *status = st;
    return r;
}

EXPORT kcu_result cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                   uint64_t flags)
{
    return lookup(symbol, pfn, cudaVersion, flags, NULL);
}

#ifndef FAKE_V1_ONLY
EXPORT kcu_result cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                      uint64_t flags, int *symbolStatus)
{
    return lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}
#endif

/* Test hooks (not part of any real driver). */
EXPORT int fake_cuda_requested(const char *name, uint64_t *flags)
{
    for (size_t i = 0; i < N_ABIS; i++)
        if (!strcmp(abis[i].name, name)) {
            if (flags)
                *flags = requested_flags[i];
            return requested[i];
        }
    return -1;
}

EXPORT int fake_cuda_violations(const char **last)
{
    *last = last_violation;
    return violations;
}

EXPORT int fake_cuda_counters(struct emu_counters *c)
{
    return device < 0 ? -ENODEV : emu_counters_get(device, c);
}
