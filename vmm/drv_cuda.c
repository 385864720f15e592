/*
 * vmm/drv_cuda.c: the "cuda" driver table, loaded at run time (contract in drv_cuda.h).
 *
 * Why cuGetProcAddress and not dlsym: libcuda exports several ABIs of one entry point
 * (cuMemcpyHtoDAsync, cuMemcpyHtoDAsync_v2, ..._ptsz, and new ABIs keep appearing, e.g.
 * cuCtxSynchronize at 13000 takes a context). Asking for the base name at the version our
 * declaration was written against returns exactly the ABI cudrv.h declares, whatever driver
 * is installed, which dlsym of a guessed suffix cannot promise.
 */
#include "drv_cuda.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/env.h"
#include "common/assert.h"
#include "common/log.h"

#define SYM(field, ver) { #field, ver, offsetof(struct kcu_api, field) }

/* Versions: the first driver version with the ABI cudrv.h declares (cudaTypedefs.h's
   PFN_<name>_v<version>); keep in step with the comments in cudrv.h. */
static const struct drv_cuda_sym cuda_syms[] = {
    SYM(cuInit, 2000),
    SYM(cuDriverGetVersion, 2020),
    SYM(cuDeviceGetCount, 2000),
    SYM(cuDeviceGet, 2000),
    SYM(cuDeviceGetAttribute, 2000),
    SYM(cuDeviceGetName, 2000),
    SYM(cuDeviceTotalMem, 3020),
    SYM(cuMemGetInfo, 3020),
    SYM(cuDevicePrimaryCtxRetain, 7000),
    SYM(cuDevicePrimaryCtxRelease, 11000),
    SYM(cuCtxSetCurrent, 4000),
    SYM(cuCtxGetCurrent, 4000),
    SYM(cuCtxSynchronize, 2000),
    SYM(cuMemGetAllocationGranularity, 10020),
    SYM(cuMemAddressReserve, 10020),
    SYM(cuMemAddressFree, 10020),
    SYM(cuMemCreate, 10020),
    SYM(cuMemRelease, 10020),
    SYM(cuMemMap, 10020),
    SYM(cuMemUnmap, 10020),
    SYM(cuMemSetAccess, 10020),
    SYM(cuMemExportToShareableHandle, 10020),
    SYM(cuMemImportFromShareableHandle, 10020),
    SYM(cuMemcpyHtoDAsync, 3020),
    SYM(cuMemcpyDtoHAsync, 3020),
    SYM(cuMemcpyDtoDAsync, 3020),
    SYM(cuMemsetD8Async, 3020),
    SYM(cuStreamCreate, 2000),
    SYM(cuStreamDestroy, 4000),
    SYM(cuStreamSynchronize, 2000),
    SYM(cuStreamQuery, 2000),
    SYM(cuStreamWaitEvent, 3020),
    SYM(cuStreamIsCapturing, 10000),
    SYM(cuStreamGetCtx, 9020),
    SYM(cuThreadExchangeStreamCaptureMode, 10010),
    SYM(cuEventCreate, 2000),
    SYM(cuEventDestroy, 4000),
    SYM(cuEventRecord, 2000),
    SYM(cuEventQuery, 2000),
    SYM(cuEventSynchronize, 2000),
    SYM(cuMemHostRegister, 6050),
    SYM(cuMemHostUnregister, 4000),
    SYM(cuMemAllocHost, 3020),
    SYM(cuMemFreeHost, 2000),
    SYM(cuPointerGetAttribute, 4000),
    SYM(cuGetErrorString, 6000),
    SYM(cuGetErrorName, 6000),
};
#define N_SYMS (sizeof cuda_syms / sizeof cuda_syms[0])

/* struct kcu_api = name + one pointer per entry: the list above must cover every field. */
_Static_assert(sizeof(struct kcu_api) == sizeof(const char *) + N_SYMS * sizeof(void (*)(void)),
               "drv_cuda.c: cuda_syms[] does not list every field of struct kcu_api");

const struct drv_cuda_sym *drv_cuda_symbols(size_t *n)
{
    *n = N_SYMS;
    return cuda_syms;
}

static pthread_mutex_t cuda_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kcu_api cuda_table;        /* filled once; guarded by cuda_lock until loaded */
static int cuda_loaded;                  /* guarded by cuda_lock */

static void why_set(char *why, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void why_set(char *why, size_t len, const char *fmt, ...)
{
    if (!why || !len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
}

static const char *gpa_status_name(int st)
{
    switch (st) {
    case DRV_CUDA_GPA_SYMBOL_NOT_FOUND:       return "symbol not found";
    case DRV_CUDA_GPA_VERSION_NOT_SUFFICIENT: return "driver version not sufficient";
    default:                                  return "unknown status";
    }
}

/* Resolves every entry into t. 0; -ENOENT the library is the toolkit's stub (no driver);
   -ENODEV an entry is missing. why set on failure. */
static int resolve_all(void *lib, const char *path, struct kcu_api *t, char *why, size_t wlen)
{
    drv_cuda_gpa_v2_fn gpa2 = (drv_cuda_gpa_v2_fn)dlsym(lib, "cuGetProcAddress_v2");
    drv_cuda_gpa_v1_fn gpa1 = (drv_cuda_gpa_v1_fn)dlsym(lib, "cuGetProcAddress");
    if (!gpa2 && !gpa1) {
        why_set(why, wlen, "%s exports no cuGetProcAddress: the driver is older than CUDA "
                "11.3, which libkvvm needs", path);
        return -ENODEV;
    }
    for (size_t i = 0; i < N_SYMS; i++) {
        const struct drv_cuda_sym *s = &cuda_syms[i];
        void *fn = NULL;
        int status = DRV_CUDA_GPA_SUCCESS;
        kcu_result r = gpa2
            ? gpa2(s->name, &fn, s->version, DRV_CUDA_GPA_LEGACY_STREAM, &status)
            : gpa1(s->name, &fn, s->version, DRV_CUDA_GPA_LEGACY_STREAM);
        if (r == KCU_ERROR_STUB_LIBRARY) {
            why_set(why, wlen, "%s is the CUDA toolkit's stub library, not a driver", path);
            return -ENOENT;
        }
        if (r != KCU_SUCCESS || !fn || status != DRV_CUDA_GPA_SUCCESS) {
            why_set(why, wlen, "%s: cuGetProcAddress%s(\"%s\", version %d) failed "
                    "(CUresult %d, %s)", path, gpa2 ? "_v2" : "", s->name, s->version, r,
                    status != DRV_CUDA_GPA_SUCCESS ? gpa_status_name(status)
                                                   : "no function returned");
            return -ENODEV;
        }
        KVVM_ASSERT(s->offset >= sizeof t->name && s->offset + sizeof fn <= sizeof *t);
        memcpy((char *)t + s->offset, &fn, sizeof fn);
    }
    t->name = "cuda";
    return 0;
}

static const char *err_name(const struct kcu_api *t, kcu_result r)
{
    const char *s = NULL;
    if (t->cuGetErrorName(r, &s) != KCU_SUCCESS || !s)
        return "unknown CUresult";
    return s;
}

int drv_cuda_load(const struct kcu_api **api, char *why, size_t why_len)
{
    if (why && why_len)
        why[0] = 0;
    pthread_mutex_lock(&cuda_lock);
    if (cuda_loaded) {
        pthread_mutex_unlock(&cuda_lock);
        *api = &cuda_table;
        return 0;
    }

    int err;
    const char *path = kenv(KVVM_CUDA_LIBRARY);
    if (!path || !*path)
        path = "libcuda.so.1";
    dlerror();
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        why_set(why, why_len, "the CUDA driver library could not be loaded (%s)",
                e ? e : path);
        err = -ENOENT;
        goto out_unlock;
    }

    struct kcu_api t;
    memset(&t, 0, sizeof t);
    err = resolve_all(lib, path, &t, why, why_len);
    if (err)
        goto out_close;

    /* From here the driver may have started threads: the library stays loaded. */
    kcu_result r = t.cuInit(0);
    if (r == KCU_ERROR_NO_DEVICE || r == KCU_ERROR_STUB_LIBRARY) {
        why_set(why, why_len, "%s: cuInit reports no CUDA device (%s)", path,
                err_name(&t, r));
        err = -ENOENT;
        goto out_unlock;
    }
    if (r != KCU_SUCCESS) {
        why_set(why, why_len, "%s: cuInit failed: %s", path, kcu_errstr(&t, r));
        err = -ENODEV;
        goto out_unlock;
    }
    int count = 0;
    r = t.cuDeviceGetCount(&count);
    if (r != KCU_SUCCESS) {
        why_set(why, why_len, "%s: cuDeviceGetCount failed: %s", path, kcu_errstr(&t, r));
        err = -ENODEV;
        goto out_unlock;
    }
    if (count == 0) {
        why_set(why, why_len, "%s: the driver sees no CUDA device", path);
        err = -ENOENT;
        goto out_unlock;
    }
    int version = 0;
    if (t.cuDriverGetVersion(&version) != KCU_SUCCESS)
        version = 0;
    klog_debug("cuda: loaded %s (driver %d.%d, %d device%s, via cuGetProcAddress%s)", path,
               version / 1000, version % 1000 / 10, count, count == 1 ? "" : "s",
               dlsym(lib, "cuGetProcAddress_v2") ? "_v2" : "");
    cuda_table = t;
    cuda_loaded = 1;
    pthread_mutex_unlock(&cuda_lock);
    *api = &cuda_table;
    return 0;

out_close:
    dlclose(lib);
out_unlock:
    pthread_mutex_unlock(&cuda_lock);
    return err;
}
