/*
 * vmm/cudrv.h: the CUDA driver entry points libkvvm uses, declared from the documented driver
 * API so that libkvvm builds where no CUDA toolkit is installed, and the *driver table* that
 * both drivers implement.
 *
 * Contract:
 *  - Types, constants and signatures here are ABI-identical to cuda.h's (checked by
 *    vmm/cudrv_check.c with static assertions whenever the toolkit's cuda.h is found).
 *    Names carry a kcu/KCU prefix so both headers can be included in one translation unit.
 *  - struct kcu_api is one table of function pointers with exactly the CUDA signatures. Two
 *    implementations fill it: vmm/drv_cuda.c (libcuda.so.1, dlopen + cuGetProcAddress at the
 *    ABI version noted beside each entry) and vmm/emu/ (the emulated device).
 *  - The table is the only place that knows CUDA exists: every layer above calls through it,
 *    and no layer above it dereferences a device address.
 *  - As in the real driver, per-thread state matters: a thread must make a context current
 *    (cuCtxSetCurrent) before calls that need one, on the emulated device too.
 */
#ifndef KVVM_VMM_CUDRV_H
#define KVVM_VMM_CUDRV_H

#include <stddef.h>
#include <stdint.h>

typedef int kcu_result;                         /* CUresult */
typedef int kcu_device;                         /* CUdevice */
typedef struct kcu_ctx_st *kcu_context;         /* CUcontext */
typedef struct kcu_stream_st *kcu_stream;       /* CUstream; NULL = the legacy default stream */
typedef struct kcu_event_st *kcu_event;         /* CUevent */
typedef unsigned long long kcu_deviceptr;       /* CUdeviceptr (64-bit builds) */
typedef unsigned long long kcu_mem_handle;      /* CUmemGenericAllocationHandle */

/* CUresult values used by libkvvm (cuda.h: enum cudaError_enum). */
#define KCU_SUCCESS                        0
#define KCU_ERROR_INVALID_VALUE            1
#define KCU_ERROR_OUT_OF_MEMORY            2
#define KCU_ERROR_NOT_INITIALIZED          3
#define KCU_ERROR_DEINITIALIZED            4
#define KCU_ERROR_STUB_LIBRARY             34   /* the toolkit's stub libcuda, no driver */
#define KCU_ERROR_NO_DEVICE                100
#define KCU_ERROR_INVALID_DEVICE           101
#define KCU_ERROR_INVALID_CONTEXT          201
#define KCU_ERROR_ALREADY_MAPPED           208
#define KCU_ERROR_NOT_MAPPED               211
#define KCU_ERROR_INVALID_HANDLE           400
#define KCU_ERROR_NOT_FOUND                500
#define KCU_ERROR_NOT_READY                600
#define KCU_ERROR_ILLEGAL_ADDRESS          700
#define KCU_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712
#define KCU_ERROR_HOST_MEMORY_NOT_REGISTERED     713
#define KCU_ERROR_NOT_PERMITTED            800
#define KCU_ERROR_NOT_SUPPORTED            801
#define KCU_ERROR_STREAM_CAPTURE_UNSUPPORTED 900
#define KCU_ERROR_UNKNOWN                  999
/* Sticky device faults (the context is lost; added for vmm.c's dead-context rule). */
#define KCU_ERROR_ECC_UNCORRECTABLE        214
#define KCU_ERROR_LAUNCH_TIMEOUT           702
#define KCU_ERROR_HARDWARE_STACK_ERROR     714
#define KCU_ERROR_ILLEGAL_INSTRUCTION      715
#define KCU_ERROR_MISALIGNED_ADDRESS       716
#define KCU_ERROR_INVALID_ADDRESS_SPACE    717
#define KCU_ERROR_INVALID_PC               718
#define KCU_ERROR_LAUNCH_FAILED            719
#define KCU_ERROR_CONTAINED                226
#define KCU_ERROR_CONTEXT_IS_DESTROYED     709
#define KCU_ERROR_ASSERT                   710
#define KCU_ERROR_TENSOR_MEMORY_LEAK       721
#define KCU_ERROR_MPS_CLIENT_TERMINATED    810
#define KCU_ERROR_STREAM_CAPTURE_ISOLATION 905
#define KCU_ERROR_STREAM_CAPTURE_IMPLICIT  906
#define KCU_ERROR_EXTERNAL_DEVICE          911

/* CUdevice_attribute */
#define KCU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED 102
/* CUmemAllocationType, CUmemLocationType, CUmemAllocationHandleType, CUmemAccess_flags */
#define KCU_MEM_ALLOCATION_TYPE_PINNED     1
#define KCU_MEM_LOCATION_TYPE_DEVICE       1
#define KCU_MEM_HANDLE_TYPE_NONE           0
#define KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 0x1   /* an int file descriptor */
#define KCU_MEM_ACCESS_FLAGS_PROT_NONE     0
#define KCU_MEM_ACCESS_FLAGS_PROT_READ     1
#define KCU_MEM_ACCESS_FLAGS_PROT_READWRITE 3
/* CUmemAllocationGranularity_flags */
#define KCU_MEM_ALLOC_GRANULARITY_MINIMUM  0
#define KCU_MEM_ALLOC_GRANULARITY_RECOMMENDED 1
/* CUstreamCaptureStatus */
#define KCU_STREAM_CAPTURE_STATUS_NONE     0
#define KCU_STREAM_CAPTURE_STATUS_ACTIVE   1
#define KCU_STREAM_CAPTURE_STATUS_INVALIDATED 2
/* CUstreamCaptureMode (cuThreadExchangeStreamCaptureMode) */
#define KCU_STREAM_CAPTURE_MODE_GLOBAL     0
#define KCU_STREAM_CAPTURE_MODE_THREAD_LOCAL 1
#define KCU_STREAM_CAPTURE_MODE_RELAXED    2
/* CUstream_flags, CUevent_flags, cuMemHostRegister / cuMemHostAlloc flags */
#define KCU_STREAM_DEFAULT                 0x0
#define KCU_STREAM_NON_BLOCKING            0x1
#define KCU_EVENT_DEFAULT                  0x0
#define KCU_EVENT_DISABLE_TIMING           0x2
#define KCU_EVENT_BLOCKING_SYNC            0x1
/* Special stream handles (cuda.h CU_STREAM_LEGACY, CU_STREAM_PER_THREAD). */
#define KCU_STREAM_LEGACY                  ((kcu_stream)0x1)
#define KCU_STREAM_PER_THREAD              ((kcu_stream)0x2)
#define KCU_MEMHOSTREGISTER_PORTABLE       0x01
/* CUpointer_attribute, CUmemorytype */
#define KCU_POINTER_ATTRIBUTE_MEMORY_TYPE  2
#define KCU_MEMORYTYPE_HOST                0x01
#define KCU_MEMORYTYPE_DEVICE              0x02

/* CUmemLocation */
struct kcu_mem_location {
    int type;                                   /* KCU_MEM_LOCATION_TYPE_* */
    int id;                                     /* device ordinal */
};

/* CUmemAllocationProp */
struct kcu_mem_alloc_prop {
    int type;                                   /* KCU_MEM_ALLOCATION_TYPE_PINNED */
    int requestedHandleTypes;                   /* KCU_MEM_HANDLE_TYPE_NONE */
    struct kcu_mem_location location;
    void *win32HandleMetaData;                  /* must be NULL */
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
};

/* CUmemAccessDesc */
struct kcu_mem_access_desc {
    struct kcu_mem_location location;
    int flags;                                  /* KCU_MEM_ACCESS_FLAGS_* */
};


/* The driver table. Each field has the signature of the entry point it names; the number
   beside it is the cudaVersion drv_cuda.c passes to cuGetProcAddress (the first driver
   version with that ABI). */
struct kcu_api {
    const char *name;                           /* "cuda" or "emulated" */

    kcu_result (*cuInit)(unsigned int flags);                                       /* 2000 */
    kcu_result (*cuDriverGetVersion)(int *version);                                 /* 2020 */
    kcu_result (*cuDeviceGetCount)(int *count);                                     /* 2000 */
    kcu_result (*cuDeviceGet)(kcu_device *dev, int ordinal);                        /* 2000 */
    kcu_result (*cuDeviceGetAttribute)(int *pi, int attrib, kcu_device dev);        /* 2000 */
    kcu_result (*cuDeviceGetName)(char *name, int len, kcu_device dev);             /* 2000 */
    kcu_result (*cuDeviceTotalMem)(size_t *bytes, kcu_device dev);                  /* 3020 */
    /* Free and total memory of the current context's device (cuMemGetInfo_v2). */
    kcu_result (*cuMemGetInfo)(size_t *free, size_t *total);                        /* 3020 */
    kcu_result (*cuDevicePrimaryCtxRetain)(kcu_context *ctx, kcu_device dev);       /* 7000 */
    kcu_result (*cuDevicePrimaryCtxRelease)(kcu_device dev);                        /* 11000 */
    kcu_result (*cuCtxSetCurrent)(kcu_context ctx);                                 /* 4000 */
    kcu_result (*cuCtxGetCurrent)(kcu_context *ctx);                                /* 4000 */
    kcu_result (*cuCtxSynchronize)(void);                                           /* 2000 */

    kcu_result (*cuMemGetAllocationGranularity)(size_t *granularity,
                const struct kcu_mem_alloc_prop *prop, int option);                 /* 10020 */
    kcu_result (*cuMemAddressReserve)(kcu_deviceptr *ptr, size_t size, size_t alignment,
                                      kcu_deviceptr addr, unsigned long long flags); /* 10020 */
    kcu_result (*cuMemAddressFree)(kcu_deviceptr ptr, size_t size);                 /* 10020 */
    kcu_result (*cuMemCreate)(kcu_mem_handle *handle, size_t size,
                              const struct kcu_mem_alloc_prop *prop,
                              unsigned long long flags);                            /* 10020 */
    kcu_result (*cuMemRelease)(kcu_mem_handle handle);                              /* 10020 */
    kcu_result (*cuMemMap)(kcu_deviceptr ptr, size_t size, size_t offset,
                           kcu_mem_handle handle, unsigned long long flags);        /* 10020 */
    kcu_result (*cuMemUnmap)(kcu_deviceptr ptr, size_t size);                       /* 10020 */
    kcu_result (*cuMemSetAccess)(kcu_deviceptr ptr, size_t size,
                                 const struct kcu_mem_access_desc *desc, size_t count); /* 10020 */
    /* Shareable handles. Export: for KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
       shareableHandle points to an int that receives a new file descriptor (the caller's
       to close), valid only for a handle created with that type in requestedHandleTypes.
       Import: osHandle is the file descriptor itself, cast ((void *)(uintptr_t)fd); the
       caller keeps and closes it; the new handle is released with cuMemRelease. */
    kcu_result (*cuMemExportToShareableHandle)(void *shareableHandle, kcu_mem_handle handle,
                                               int handleType,
                                               unsigned long long flags);     /* 10020 */
    kcu_result (*cuMemImportFromShareableHandle)(kcu_mem_handle *handle, void *osHandle,
                                                 int shHandleType);           /* 10020 */

    kcu_result (*cuMemcpyHtoDAsync)(kcu_deviceptr dst, const void *src, size_t bytes,
                                    kcu_stream stream);                             /* 3020 */
    kcu_result (*cuMemcpyDtoHAsync)(void *dst, kcu_deviceptr src, size_t bytes,
                                    kcu_stream stream);                             /* 3020 */
    kcu_result (*cuMemcpyDtoDAsync)(kcu_deviceptr dst, kcu_deviceptr src, size_t bytes,
                                    kcu_stream stream);                             /* 3020 */
    kcu_result (*cuMemsetD8Async)(kcu_deviceptr dst, unsigned char value, size_t n,
                                  kcu_stream stream);                               /* 3020 */

    kcu_result (*cuStreamCreate)(kcu_stream *stream, unsigned int flags);           /* 2000 */
    kcu_result (*cuStreamDestroy)(kcu_stream stream);                               /* 4000 */
    kcu_result (*cuStreamSynchronize)(kcu_stream stream);                           /* 2000 */
    kcu_result (*cuStreamQuery)(kcu_stream stream);                                 /* 2000 */
    kcu_result (*cuStreamWaitEvent)(kcu_stream stream, kcu_event event,
                                    unsigned int flags);                            /* 3020 */
    kcu_result (*cuStreamIsCapturing)(kcu_stream stream, int *status);              /* 10000 */
    kcu_result (*cuStreamGetCtx)(kcu_stream stream, kcu_context *ctx);              /* 9020 */
    /* Swaps the calling thread's capture interaction mode (KCU_STREAM_CAPTURE_MODE_*) with
       *mode. Per thread; no context needed. */
    kcu_result (*cuThreadExchangeStreamCaptureMode)(int *mode);                     /* 10010 */

    kcu_result (*cuEventCreate)(kcu_event *event, unsigned int flags);              /* 2000 */
    kcu_result (*cuEventDestroy)(kcu_event event);                                  /* 4000 */
    kcu_result (*cuEventRecord)(kcu_event event, kcu_stream stream);                /* 2000 */
    kcu_result (*cuEventQuery)(kcu_event event);                                    /* 2000 */
    kcu_result (*cuEventSynchronize)(kcu_event event);                              /* 2000 */

    kcu_result (*cuMemHostRegister)(void *p, size_t bytes, unsigned int flags);     /* 6050 */
    kcu_result (*cuMemHostUnregister)(void *p);                                     /* 4000 */
    kcu_result (*cuMemAllocHost)(void **pp, size_t bytes);                          /* 3020 */
    kcu_result (*cuMemFreeHost)(void *p);                                           /* 2000 */
    /* attribute KCU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned *)data = KCU_MEMORYTYPE_*;
       CUDA_ERROR_INVALID_VALUE for memory the driver does not know (pageable memory). */
    kcu_result (*cuPointerGetAttribute)(void *data, int attribute, kcu_deviceptr ptr); /* 4000 */

    kcu_result (*cuGetErrorString)(kcu_result error, const char **str);             /* 6000 */
    kcu_result (*cuGetErrorName)(kcu_result error, const char **str);               /* 6000 */
};

/* Optional hooks beside a driver table: what the driver API cannot tell, for invariant
   checkers (vmm_debug_mapping, vmm_debug_objects), and one import the API has not. Not part
   of CUDA: only the emulated device fills them (vmm/drv_emu.h); on CUDA there are none. */
struct kcu_debug {
    /* What is mapped at device address va: 0 and the handle, the offset within the handle
       and the access flags (KCU_MEM_ACCESS_FLAGS_*); -ENOENT unmapped. Outputs may be NULL. */
    int (*mapping)(kcu_deviceptr va, kcu_mem_handle *handle, size_t *offset, int *access);
    /* The driver's live physical handles, their bytes and its mapped bytes on the device
       with this ordinal. 0; -ENODEV no such device. */
    int (*objects)(int ordinal, uint64_t *handles, uint64_t *handle_bytes,
                   uint64_t *mapped_bytes);
    /* cuMemImportFromShareableHandle of POSIX descriptor fd that takes fd over on success:
       the handle keeps it (no dup) and its release closes it; on a failure the caller keeps
       fd. (CUDA's import keeps no descriptor: vmm_handle_import closes fd after it there.) */
    kcu_result (*import_take)(kcu_mem_handle *handle, int fd);
};

/* Returns a readable "NAME: description" for a driver error through the table (never NULL;
   a thread-local buffer, valid until the calling thread's next call). In vmm/cudrv.c, so
   both drivers and vmm.c use it without depending on each other. */
const char *kcu_errstr(const struct kcu_api *api, kcu_result r);

#endif
