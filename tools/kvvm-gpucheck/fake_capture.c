/*
 * tools/kvvm-gpucheck/fake_capture.c: a test stand-in for libcuda.so.1 that runs
 * kvvm-gpucheck's *cuda* code path on a machine without a GPU (CTest gpucheck_fake_driver).
 * It forwards cuGetProcAddress[_v2] to tests/fake_libcuda.so (the emulated device behind
 * libkvvm's real loader; its path in FAKE_CAPTURE_INNER) and adds the four capture entry
 * points the tool resolves itself. They only keep the bookkeeping: nothing is captured (work
 * on a "capturing" stream still runs) and no call invalidates a capture, so the capture rows
 * are exercised for crashes and hangs, not for their results.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvvm_testing_driver.h"   /* the driver ABI types */

#define EXPORT __attribute__((visibility("default")))

typedef kcu_result (*gpa2_fn)(const char *, void **, int, uint64_t, int *);
typedef kcu_result (*gpa1_fn)(const char *, void **, int, uint64_t);

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static kcu_stream capturing;             /* the one stream "capturing" now, or NULL */
static _Thread_local int thread_mode;    /* CUstreamCaptureMode of this thread */
static int graph_token;

static kcu_result begin(kcu_stream s, int mode)
{
    kcu_result r = KCU_SUCCESS;
    pthread_mutex_lock(&lock);
    if (!s || capturing || mode < 0 || mode > 2)
        r = KCU_ERROR_INVALID_VALUE;
    else
        capturing = s;
    pthread_mutex_unlock(&lock);
    return r;
}

static kcu_result end(kcu_stream s, void **graph)
{
    kcu_result r = KCU_SUCCESS;
    pthread_mutex_lock(&lock);
    if (!graph || s != capturing)
        r = KCU_ERROR_INVALID_VALUE;
    else {
        capturing = NULL;
        *graph = &graph_token;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

static kcu_result graph_destroy(void *g)
{
    return g == &graph_token ? KCU_SUCCESS : KCU_ERROR_INVALID_VALUE;
}

static kcu_result exchange(int *mode)
{
    if (!mode || *mode < 0 || *mode > 2)
        return KCU_ERROR_INVALID_VALUE;
    int old = thread_mode;
    thread_mode = *mode;
    *mode = old;
    return KCU_SUCCESS;
}

static void *inner(const char *sym)
{
    static void *lib;
    pthread_mutex_lock(&lock);
    if (!lib) {
        const char *p = getenv("FAKE_CAPTURE_INNER");
        lib = p ? dlopen(p, RTLD_NOW | RTLD_LOCAL) : NULL;
    }
    pthread_mutex_unlock(&lock);
    return lib ? dlsym(lib, sym) : NULL;
}

/* Our own entry points, or NULL for the ones the inner library answers. */
static void *own(const char *symbol)
{
    if (!strcmp(symbol, "cuStreamBeginCapture"))
        return (void *)begin;
    if (!strcmp(symbol, "cuStreamEndCapture"))
        return (void *)end;
    if (!strcmp(symbol, "cuGraphDestroy"))
        return (void *)graph_destroy;
    if (!strcmp(symbol, "cuThreadExchangeStreamCaptureMode"))
        return (void *)exchange;
    return NULL;
}

EXPORT kcu_result cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                      uint64_t flags, int *status)
{
    void *f = own(symbol);
    if (f) {
        *pfn = f;
        if (status)
            *status = 0;
        return KCU_SUCCESS;
    }
    gpa2_fn g = (gpa2_fn)inner("cuGetProcAddress_v2");
    return g ? g(symbol, pfn, cudaVersion, flags, status) : KCU_ERROR_NOT_FOUND;
}

EXPORT kcu_result cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                   uint64_t flags)
{
    void *f = own(symbol);
    if (f) {
        *pfn = f;
        return KCU_SUCCESS;
    }
    gpa1_fn g = (gpa1_fn)inner("cuGetProcAddress");
    return g ? g(symbol, pfn, cudaVersion, flags) : KCU_ERROR_NOT_FOUND;
}
