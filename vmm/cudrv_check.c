/*
 * vmm/cudrv_check.c: compile-time proof that vmm/cudrv.h (and drv_cuda.h's cuGetProcAddress
 * types) are ABI-identical to the toolkit's cuda.h. Built only where cuda.h is found; it
 * produces no code. A mismatch is a compile error naming the item.
 *
 * Method for function types. kcu types and CUDA types are distinct C types (kcu_stream is a
 * pointer to a different struct than CUstream; CUresult is an enum), so a direct
 * compatibility check cannot succeed. Instead each entry point's parameter list is written
 * ONCE below (ENTRY_LIST) in abstract type tokens (T_STREAM, T_DPTR, ...), then:
 *   pass 1 (before cuda.h is included, so no cuda.h renaming macro interferes) instantiates
 *          the tokens with kcu types and checks each against the struct kcu_api field;
 *   pass 2 (after cuda.h) instantiates them with CUDA types and checks each against cuda.h's
 *          prototype of that name (cuda.h maps a base name to its newest ABI, e.g.
 *          cuMemcpyHtoDAsync -> cuMemcpyHtoDAsync_v2; for names whose newest ABI is newer than
 *          the version we request, the CUDA type is taken from cudaTypedefs.h's
 *          PFN_<name>_v<version> instead);
 *   and every token's two instantiations are checked to have the same size and kind
 *   (integer or enum / pointer), pointee structs field by field.
 * Transcription errors in ENTRY_LIST therefore fail one of the two passes.
 */
#include <stddef.h>
#include <stdint.h>
#include "vmm/cudrv.h"
#include "vmm/drv_cuda.h"

#define SAME_TYPE(a, b) __builtin_types_compatible_p(a, b)

/* Every function field of struct kcu_api: name, parameter list in tokens. */
#define ENTRY_LIST(X)                                                                    \
    X(cuInit, (T_UINT))                                                                  \
    X(cuDriverGetVersion, (T_INT *))                                                     \
    X(cuDeviceGetCount, (T_INT *))                                                       \
    X(cuDeviceGet, (T_DEVICE *, T_INT))                                                  \
    X(cuDeviceGetAttribute, (T_INT *, T_ATTR, T_DEVICE))                                 \
    X(cuDeviceGetName, (char *, T_INT, T_DEVICE))                                        \
    X(cuDeviceTotalMem, (size_t *, T_DEVICE))                                            \
    X(cuMemGetInfo, (size_t *, size_t *))                                                \
    X(cuDevicePrimaryCtxRetain, (T_CTX *, T_DEVICE))                                     \
    X(cuDevicePrimaryCtxRelease, (T_DEVICE))                                             \
    X(cuCtxSetCurrent, (T_CTX))                                                          \
    X(cuCtxGetCurrent, (T_CTX *))                                                        \
    X(cuCtxSynchronize, (void))                                                          \
    X(cuMemGetAllocationGranularity, (size_t *, const T_PROP *, T_GRAN))                 \
    X(cuMemAddressReserve, (T_DPTR *, size_t, size_t, T_DPTR, T_ULL))                    \
    X(cuMemAddressFree, (T_DPTR, size_t))                                                \
    X(cuMemCreate, (T_HANDLE *, size_t, const T_PROP *, T_ULL))                          \
    X(cuMemRelease, (T_HANDLE))                                                          \
    X(cuMemMap, (T_DPTR, size_t, size_t, T_HANDLE, T_ULL))                               \
    X(cuMemUnmap, (T_DPTR, size_t))                                                      \
    X(cuMemSetAccess, (T_DPTR, size_t, const T_ACCESS *, size_t))                        \
    X(cuMemExportToShareableHandle, (void *, T_HANDLE, T_HTYPE, T_ULL))                  \
    X(cuMemImportFromShareableHandle, (T_HANDLE *, void *, T_HTYPE))                     \
    X(cuMemcpyHtoDAsync, (T_DPTR, const void *, size_t, T_STREAM))                       \
    X(cuMemcpyDtoHAsync, (void *, T_DPTR, size_t, T_STREAM))                             \
    X(cuMemcpyDtoDAsync, (T_DPTR, T_DPTR, size_t, T_STREAM))                             \
    X(cuMemsetD8Async, (T_DPTR, unsigned char, size_t, T_STREAM))                        \
    X(cuStreamCreate, (T_STREAM *, T_UINT))                                              \
    X(cuStreamDestroy, (T_STREAM))                                                       \
    X(cuStreamSynchronize, (T_STREAM))                                                   \
    X(cuStreamQuery, (T_STREAM))                                                         \
    X(cuStreamWaitEvent, (T_STREAM, T_EVENT, T_UINT))                                    \
    X(cuStreamIsCapturing, (T_STREAM, T_CAPTURE *))                                      \
    X(cuStreamGetCtx, (T_STREAM, T_CTX *))                                               \
    X(cuThreadExchangeStreamCaptureMode, (T_CAPMODE *))                                  \
    X(cuEventCreate, (T_EVENT *, T_UINT))                                                \
    X(cuEventDestroy, (T_EVENT))                                                         \
    X(cuEventRecord, (T_EVENT, T_STREAM))                                                \
    X(cuEventQuery, (T_EVENT))                                                           \
    X(cuEventSynchronize, (T_EVENT))                                                     \
    X(cuMemHostRegister, (void *, size_t, T_UINT))                                       \
    X(cuMemHostUnregister, (void *))                                                     \
    X(cuMemAllocHost, (void **, size_t))                                                 \
    X(cuMemFreeHost, (void *))                                                           \
    X(cuPointerGetAttribute, (void *, T_PTRATTR, T_DPTR))                                \
    X(cuGetErrorString, (T_RESULT, const char **))                                       \
    X(cuGetErrorName, (T_RESULT, const char **))

/* ---- pass 1: the list in kcu types equals struct kcu_api ------------------------------- */
#define T_RESULT  kcu_result
#define T_UINT    unsigned int
#define T_INT     int
#define T_ULL     unsigned long long
#define T_DEVICE  kcu_device
#define T_ATTR    int
#define T_GRAN    int
#define T_CAPTURE int
#define T_CAPMODE int
#define T_HTYPE   int
#define T_PTRATTR int
#define T_CTX     kcu_context
#define T_STREAM  kcu_stream
#define T_EVENT   kcu_event
#define T_DPTR    kcu_deviceptr
#define T_HANDLE  kcu_mem_handle
#define T_PROP    struct kcu_mem_alloc_prop
#define T_ACCESS  struct kcu_mem_access_desc

#define KCU_FIELD_T(name) __typeof__(((struct kcu_api *)0)->name)
#define CHECK_KCU(name, args)                                                             \
    typedef kcu_result (*kcu_t_##name) args;                                              \
    _Static_assert(SAME_TYPE(kcu_t_##name, KCU_FIELD_T(name)),                            \
                   "struct kcu_api." #name " differs from cudrv_check.c's ENTRY_LIST");
ENTRY_LIST(CHECK_KCU)

/* Every function field is in the list (name + one pointer per entry). */
#define COUNT_ONE(name, args) +1
_Static_assert(sizeof(struct kcu_api) ==
               sizeof(const char *) + (0 ENTRY_LIST(COUNT_ONE)) * sizeof(void (*)(void)),
               "struct kcu_api has a field cudrv_check.c does not check");

/* Token instantiations of pass 1, kept for the token comparison below. */
typedef kcu_result k_T_RESULT;  typedef kcu_device k_T_DEVICE;  typedef int k_T_ATTR;
typedef int k_T_GRAN;           typedef int k_T_CAPTURE;        typedef kcu_context k_T_CTX;
typedef kcu_stream k_T_STREAM;  typedef kcu_event k_T_EVENT;    typedef kcu_deviceptr k_T_DPTR;
typedef kcu_mem_handle k_T_HANDLE; typedef int k_T_CAPMODE; typedef int k_T_PTRATTR;
typedef int k_T_HTYPE;

#undef T_RESULT
#undef T_UINT
#undef T_INT
#undef T_ULL
#undef T_DEVICE
#undef T_ATTR
#undef T_GRAN
#undef T_CAPTURE
#undef T_CAPMODE
#undef T_HTYPE
#undef T_PTRATTR
#undef T_CTX
#undef T_STREAM
#undef T_EVENT
#undef T_DPTR
#undef T_HANDLE
#undef T_PROP
#undef T_ACCESS

/* ---- pass 2: the list in CUDA types equals cuda.h ---------------------------------------- */
#include <cuda.h>
#include <cudaTypedefs.h>

#define T_RESULT  CUresult
#define T_UINT    unsigned int
#define T_INT     int
#define T_ULL     unsigned long long
#define T_DEVICE  CUdevice
#define T_ATTR    CUdevice_attribute
#define T_GRAN    CUmemAllocationGranularity_flags
#define T_CAPTURE CUstreamCaptureStatus
#define T_CAPMODE CUstreamCaptureMode
#define T_HTYPE   CUmemAllocationHandleType
#define T_PTRATTR CUpointer_attribute
#define T_CTX     CUcontext
#define T_STREAM  CUstream
#define T_EVENT   CUevent
#define T_DPTR    CUdeviceptr
#define T_HANDLE  CUmemGenericAllocationHandle
#define T_PROP    CUmemAllocationProp
#define T_ACCESS  CUmemAccessDesc

/* The ABI we request per name (drv_cuda.c's versions). Where cuda.h's plain name is that ABI
   the prototype is compared; where the toolkit has a newer ABI under the plain name
   (cuCtxSynchronize gained a context parameter at 13000), the versioned PFN is compared. */
#define CU_T(name) __typeof__(&name)
#define CHECK_CU(name, args)                                                              \
    typedef CUresult (*cu_t_##name) args;                                                 \
    _Static_assert(SAME_TYPE(cu_t_##name, CU_PROTO_##name),                               \
                   "cuda.h's " #name " differs from cudrv_check.c's ENTRY_LIST");

/* Versioned typedefs make the "version" column checkable too: cudaTypedefs.h's
   PFN_<name>_v<version> must be the prototype of the version drv_cuda.c requests. */
#define CU_PROTO_cuInit                        PFN_cuInit_v2000
#define CU_PROTO_cuDriverGetVersion            PFN_cuDriverGetVersion_v2020
#define CU_PROTO_cuDeviceGetCount              PFN_cuDeviceGetCount_v2000
#define CU_PROTO_cuDeviceGet                   PFN_cuDeviceGet_v2000
#define CU_PROTO_cuDeviceGetAttribute          PFN_cuDeviceGetAttribute_v2000
#define CU_PROTO_cuDeviceGetName               PFN_cuDeviceGetName_v2000
#define CU_PROTO_cuDeviceTotalMem              PFN_cuDeviceTotalMem_v3020
#define CU_PROTO_cuMemGetInfo                  PFN_cuMemGetInfo_v3020
#define CU_PROTO_cuDevicePrimaryCtxRetain      PFN_cuDevicePrimaryCtxRetain_v7000
#define CU_PROTO_cuDevicePrimaryCtxRelease     PFN_cuDevicePrimaryCtxRelease_v11000
#define CU_PROTO_cuCtxSetCurrent               PFN_cuCtxSetCurrent_v4000
#define CU_PROTO_cuCtxGetCurrent               PFN_cuCtxGetCurrent_v4000
#define CU_PROTO_cuCtxSynchronize              PFN_cuCtxSynchronize_v2000
#define CU_PROTO_cuMemGetAllocationGranularity PFN_cuMemGetAllocationGranularity_v10020
#define CU_PROTO_cuMemAddressReserve           PFN_cuMemAddressReserve_v10020
#define CU_PROTO_cuMemAddressFree              PFN_cuMemAddressFree_v10020
#define CU_PROTO_cuMemCreate                   PFN_cuMemCreate_v10020
#define CU_PROTO_cuMemRelease                  PFN_cuMemRelease_v10020
#define CU_PROTO_cuMemMap                      PFN_cuMemMap_v10020
#define CU_PROTO_cuMemUnmap                    PFN_cuMemUnmap_v10020
#define CU_PROTO_cuMemSetAccess                PFN_cuMemSetAccess_v10020
#define CU_PROTO_cuMemExportToShareableHandle  PFN_cuMemExportToShareableHandle_v10020
#define CU_PROTO_cuMemImportFromShareableHandle PFN_cuMemImportFromShareableHandle_v10020
#define CU_PROTO_cuMemcpyHtoDAsync             PFN_cuMemcpyHtoDAsync_v3020
#define CU_PROTO_cuMemcpyDtoHAsync             PFN_cuMemcpyDtoHAsync_v3020
#define CU_PROTO_cuMemcpyDtoDAsync             PFN_cuMemcpyDtoDAsync_v3020
#define CU_PROTO_cuMemsetD8Async               PFN_cuMemsetD8Async_v3020
#define CU_PROTO_cuStreamCreate                PFN_cuStreamCreate_v2000
#define CU_PROTO_cuStreamDestroy               PFN_cuStreamDestroy_v4000
#define CU_PROTO_cuStreamSynchronize           PFN_cuStreamSynchronize_v2000
#define CU_PROTO_cuStreamQuery                 PFN_cuStreamQuery_v2000
#define CU_PROTO_cuStreamWaitEvent             PFN_cuStreamWaitEvent_v3020
#define CU_PROTO_cuStreamIsCapturing           PFN_cuStreamIsCapturing_v10000
#define CU_PROTO_cuStreamGetCtx                PFN_cuStreamGetCtx_v9020
#define CU_PROTO_cuThreadExchangeStreamCaptureMode PFN_cuThreadExchangeStreamCaptureMode_v10010
#define CU_PROTO_cuEventCreate                 PFN_cuEventCreate_v2000
#define CU_PROTO_cuEventDestroy                PFN_cuEventDestroy_v4000
#define CU_PROTO_cuEventRecord                 PFN_cuEventRecord_v2000
#define CU_PROTO_cuEventQuery                  PFN_cuEventQuery_v2000
#define CU_PROTO_cuEventSynchronize            PFN_cuEventSynchronize_v2000
#define CU_PROTO_cuMemHostRegister             PFN_cuMemHostRegister_v6050
#define CU_PROTO_cuMemHostUnregister           PFN_cuMemHostUnregister_v4000
#define CU_PROTO_cuMemAllocHost                PFN_cuMemAllocHost_v3020
#define CU_PROTO_cuMemFreeHost                 PFN_cuMemFreeHost_v2000
#define CU_PROTO_cuPointerGetAttribute         PFN_cuPointerGetAttribute_v4000
#define CU_PROTO_cuGetErrorString              PFN_cuGetErrorString_v6000
#define CU_PROTO_cuGetErrorName                PFN_cuGetErrorName_v6000
ENTRY_LIST(CHECK_CU)

/* The plain cuda.h prototypes agree with the versioned ones we compared (except where the
   toolkit's plain name is a newer ABI than the one requested). */
#define CHECK_PLAIN(name)                                                                 \
    _Static_assert(SAME_TYPE(CU_T(name), CU_PROTO_##name), "cuda.h: " #name);
CHECK_PLAIN(cuMemcpyHtoDAsync)
CHECK_PLAIN(cuMemcpyDtoHAsync)
CHECK_PLAIN(cuMemcpyDtoDAsync)
CHECK_PLAIN(cuMemsetD8Async)
CHECK_PLAIN(cuMemMap)
CHECK_PLAIN(cuMemSetAccess)
CHECK_PLAIN(cuMemCreate)
CHECK_PLAIN(cuMemAddressReserve)
CHECK_PLAIN(cuDeviceTotalMem)
CHECK_PLAIN(cuMemGetInfo)
CHECK_PLAIN(cuDevicePrimaryCtxRelease)
CHECK_PLAIN(cuStreamDestroy)
CHECK_PLAIN(cuEventDestroy)
CHECK_PLAIN(cuMemHostRegister)
CHECK_PLAIN(cuMemAllocHost)
CHECK_PLAIN(cuStreamIsCapturing)
CHECK_PLAIN(cuThreadExchangeStreamCaptureMode)
CHECK_PLAIN(cuPointerGetAttribute)

/* cuGetProcAddress as drv_cuda.c calls it. */
_Static_assert(SAME_TYPE(drv_cuda_gpa_v2_fn,
                         kcu_result (*)(const char *, void **, int, uint64_t, int *)), "gpa2");
_Static_assert(SAME_TYPE(drv_cuda_gpa_v1_fn,
                         kcu_result (*)(const char *, void **, int, uint64_t)), "gpa1");
_Static_assert(SAME_TYPE(PFN_cuGetProcAddress_v12000,
                         CUresult (*)(const char *, void **, int, cuuint64_t,
                                      CUdriverProcAddressQueryResult *)), "PFN gpa v12000");
_Static_assert(SAME_TYPE(PFN_cuGetProcAddress_v11030,
                         CUresult (*)(const char *, void **, int, cuuint64_t)), "PFN v11030");
_Static_assert(SAME_TYPE(cuuint64_t, uint64_t), "cuuint64_t");
_Static_assert(sizeof(CUdriverProcAddressQueryResult) == sizeof(int), "status size");
_Static_assert(DRV_CUDA_GPA_LEGACY_STREAM == CU_GET_PROC_ADDRESS_LEGACY_STREAM, "flag");
_Static_assert(DRV_CUDA_GPA_SUCCESS == CU_GET_PROC_ADDRESS_SUCCESS, "status");
_Static_assert(DRV_CUDA_GPA_SYMBOL_NOT_FOUND == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, "status");
_Static_assert(DRV_CUDA_GPA_VERSION_NOT_SUFFICIENT ==
               CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT, "status");

/* ---- tokens: each kcu instantiation has the size and kind of its CUDA one ---------------- */
/* __builtin_classify_type: 1 integer, 3 enumeral, 5 pointer. Enums and ints are both passed
   as ints of their size; pointers to distinct structs are passed alike. */
#define KIND(T) (__builtin_classify_type(*(T *)0) == 3 ? 1 : __builtin_classify_type(*(T *)0))
#define SAME_ABI(kT, cT)                                                                  \
    _Static_assert(sizeof(kT) == sizeof(cT) && _Alignof(kT) == _Alignof(cT) &&            \
                   KIND(kT) == KIND(cT), "token " #cT ": size or kind differs");
SAME_ABI(k_T_RESULT, CUresult)
SAME_ABI(k_T_DEVICE, CUdevice)
SAME_ABI(k_T_ATTR, CUdevice_attribute)
SAME_ABI(k_T_GRAN, CUmemAllocationGranularity_flags)
SAME_ABI(k_T_CAPTURE, CUstreamCaptureStatus)
SAME_ABI(k_T_CAPMODE, CUstreamCaptureMode)
SAME_ABI(k_T_HTYPE, CUmemAllocationHandleType)
SAME_ABI(k_T_PTRATTR, CUpointer_attribute)
SAME_ABI(k_T_CTX, CUcontext)
SAME_ABI(k_T_STREAM, CUstream)
SAME_ABI(k_T_EVENT, CUevent)
_Static_assert(SAME_TYPE(k_T_DPTR, CUdeviceptr), "kcu_deviceptr");
_Static_assert(SAME_TYPE(k_T_HANDLE, CUmemGenericAllocationHandle), "kcu_mem_handle");
_Static_assert(SAME_TYPE(k_T_DEVICE, CUdevice), "kcu_device");
_Static_assert(KIND(k_T_CTX) == 5 && KIND(k_T_STREAM) == 5 && KIND(k_T_EVENT) == 5, "ptrs");
_Static_assert(KIND(k_T_RESULT) == 1 && KIND(CUresult) == 1, "CUresult is integral");

/* ---- structs: size, alignment and every field's offset and size -------------------------- */
#define FIELD(kS, cS, f)                                                                  \
    _Static_assert(offsetof(kS, f) == offsetof(cS, f) &&                                  \
                   sizeof(((kS *)0)->f) == sizeof(((cS *)0)->f), #cS "." #f);
#define STRUCT(kS, cS)                                                                    \
    _Static_assert(sizeof(kS) == sizeof(cS) && _Alignof(kS) == _Alignof(cS), #cS);

STRUCT(struct kcu_mem_location, CUmemLocation)
FIELD(struct kcu_mem_location, CUmemLocation, type)
FIELD(struct kcu_mem_location, CUmemLocation, id)

STRUCT(struct kcu_mem_alloc_prop, CUmemAllocationProp)
FIELD(struct kcu_mem_alloc_prop, CUmemAllocationProp, type)
FIELD(struct kcu_mem_alloc_prop, CUmemAllocationProp, requestedHandleTypes)
FIELD(struct kcu_mem_alloc_prop, CUmemAllocationProp, location)
FIELD(struct kcu_mem_alloc_prop, CUmemAllocationProp, location.type)
FIELD(struct kcu_mem_alloc_prop, CUmemAllocationProp, location.id)
FIELD(struct kcu_mem_alloc_prop, CUmemAllocationProp, win32HandleMetaData)
FIELD(struct kcu_mem_alloc_prop, CUmemAllocationProp, allocFlags)
FIELD(struct kcu_mem_alloc_prop, CUmemAllocationProp, allocFlags.compressionType)
FIELD(struct kcu_mem_alloc_prop, CUmemAllocationProp, allocFlags.gpuDirectRDMACapable)
FIELD(struct kcu_mem_alloc_prop, CUmemAllocationProp, allocFlags.usage)
FIELD(struct kcu_mem_alloc_prop, CUmemAllocationProp, allocFlags.reserved)

STRUCT(struct kcu_mem_access_desc, CUmemAccessDesc)
FIELD(struct kcu_mem_access_desc, CUmemAccessDesc, location)
FIELD(struct kcu_mem_access_desc, CUmemAccessDesc, location.type)
FIELD(struct kcu_mem_access_desc, CUmemAccessDesc, location.id)
FIELD(struct kcu_mem_access_desc, CUmemAccessDesc, flags)

_Static_assert(sizeof(kcu_deviceptr) == sizeof(CUdeviceptr), "CUdeviceptr");
_Static_assert(sizeof(kcu_mem_handle) == sizeof(CUmemGenericAllocationHandle), "handle");

/* ---- constants ---------------------------------------------------------------------------- */
#define SAME(k, c) _Static_assert((long long)(k) == (long long)(c), #k " != " #c);
SAME(KCU_SUCCESS, CUDA_SUCCESS)
SAME(KCU_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_VALUE)
SAME(KCU_ERROR_OUT_OF_MEMORY, CUDA_ERROR_OUT_OF_MEMORY)
SAME(KCU_ERROR_NOT_INITIALIZED, CUDA_ERROR_NOT_INITIALIZED)
SAME(KCU_ERROR_DEINITIALIZED, CUDA_ERROR_DEINITIALIZED)
SAME(KCU_ERROR_NO_DEVICE, CUDA_ERROR_NO_DEVICE)
SAME(KCU_ERROR_STUB_LIBRARY, CUDA_ERROR_STUB_LIBRARY)
SAME(KCU_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_DEVICE)
SAME(KCU_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_CONTEXT)
SAME(KCU_ERROR_ALREADY_MAPPED, CUDA_ERROR_ALREADY_MAPPED)
SAME(KCU_ERROR_NOT_MAPPED, CUDA_ERROR_NOT_MAPPED)
SAME(KCU_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_HANDLE)
SAME(KCU_ERROR_NOT_FOUND, CUDA_ERROR_NOT_FOUND)
SAME(KCU_ERROR_NOT_READY, CUDA_ERROR_NOT_READY)
SAME(KCU_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_ILLEGAL_ADDRESS)
SAME(KCU_ERROR_HOST_MEMORY_ALREADY_REGISTERED, CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
SAME(KCU_ERROR_HOST_MEMORY_NOT_REGISTERED, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)
SAME(KCU_ERROR_NOT_PERMITTED, CUDA_ERROR_NOT_PERMITTED)
SAME(KCU_ERROR_NOT_SUPPORTED, CUDA_ERROR_NOT_SUPPORTED)
SAME(KCU_ERROR_STREAM_CAPTURE_UNSUPPORTED, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
SAME(KCU_ERROR_UNKNOWN, CUDA_ERROR_UNKNOWN)
SAME(KCU_ERROR_ECC_UNCORRECTABLE, CUDA_ERROR_ECC_UNCORRECTABLE)
SAME(KCU_ERROR_LAUNCH_TIMEOUT, CUDA_ERROR_LAUNCH_TIMEOUT)
SAME(KCU_ERROR_HARDWARE_STACK_ERROR, CUDA_ERROR_HARDWARE_STACK_ERROR)
SAME(KCU_ERROR_ILLEGAL_INSTRUCTION, CUDA_ERROR_ILLEGAL_INSTRUCTION)
SAME(KCU_ERROR_MISALIGNED_ADDRESS, CUDA_ERROR_MISALIGNED_ADDRESS)
SAME(KCU_ERROR_INVALID_ADDRESS_SPACE, CUDA_ERROR_INVALID_ADDRESS_SPACE)
SAME(KCU_ERROR_INVALID_PC, CUDA_ERROR_INVALID_PC)
SAME(KCU_ERROR_LAUNCH_FAILED, CUDA_ERROR_LAUNCH_FAILED)
SAME(KCU_ERROR_CONTAINED, CUDA_ERROR_CONTAINED)
SAME(KCU_ERROR_CONTEXT_IS_DESTROYED, CUDA_ERROR_CONTEXT_IS_DESTROYED)
SAME(KCU_ERROR_ASSERT, CUDA_ERROR_ASSERT)
SAME(KCU_ERROR_TENSOR_MEMORY_LEAK, CUDA_ERROR_TENSOR_MEMORY_LEAK)
SAME(KCU_ERROR_MPS_CLIENT_TERMINATED, CUDA_ERROR_MPS_CLIENT_TERMINATED)
SAME(KCU_ERROR_STREAM_CAPTURE_ISOLATION, CUDA_ERROR_STREAM_CAPTURE_ISOLATION)
SAME(KCU_ERROR_STREAM_CAPTURE_IMPLICIT, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
SAME(KCU_ERROR_EXTERNAL_DEVICE, CUDA_ERROR_EXTERNAL_DEVICE)
SAME(KCU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
     CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)
SAME(KCU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_ALLOCATION_TYPE_PINNED)
SAME(KCU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_LOCATION_TYPE_DEVICE)
SAME(KCU_MEM_HANDLE_TYPE_NONE, CU_MEM_HANDLE_TYPE_NONE)
SAME(KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
SAME(KCU_MEM_ACCESS_FLAGS_PROT_NONE, CU_MEM_ACCESS_FLAGS_PROT_NONE)
SAME(KCU_MEM_ACCESS_FLAGS_PROT_READ, CU_MEM_ACCESS_FLAGS_PROT_READ)
SAME(KCU_MEM_ACCESS_FLAGS_PROT_READWRITE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
SAME(KCU_MEM_ALLOC_GRANULARITY_MINIMUM, CU_MEM_ALLOC_GRANULARITY_MINIMUM)
SAME(KCU_MEM_ALLOC_GRANULARITY_RECOMMENDED, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
SAME(KCU_STREAM_CAPTURE_STATUS_NONE, CU_STREAM_CAPTURE_STATUS_NONE)
SAME(KCU_STREAM_CAPTURE_STATUS_ACTIVE, CU_STREAM_CAPTURE_STATUS_ACTIVE)
SAME(KCU_STREAM_CAPTURE_STATUS_INVALIDATED, CU_STREAM_CAPTURE_STATUS_INVALIDATED)
SAME(KCU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_GLOBAL)
SAME(KCU_STREAM_CAPTURE_MODE_THREAD_LOCAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
SAME(KCU_STREAM_CAPTURE_MODE_RELAXED, CU_STREAM_CAPTURE_MODE_RELAXED)
SAME(KCU_STREAM_DEFAULT, CU_STREAM_DEFAULT)
SAME(KCU_STREAM_NON_BLOCKING, CU_STREAM_NON_BLOCKING)
SAME(KCU_EVENT_DEFAULT, CU_EVENT_DEFAULT)
SAME(KCU_EVENT_DISABLE_TIMING, CU_EVENT_DISABLE_TIMING)
SAME(KCU_EVENT_BLOCKING_SYNC, CU_EVENT_BLOCKING_SYNC)
/* The special stream handles are pointer constants: gcc folds the casts in _Static_assert,
   clang does not accept them there (not an integer constant expression) but folds them as
   an array bound (a GNU extension it warns about), where a mismatch is a negative size. */
#ifdef __clang__
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wgnu-folding-constant"
typedef char check_stream_legacy[(uintptr_t)KCU_STREAM_LEGACY == (uintptr_t)CU_STREAM_LEGACY
                                 ? 1 : -1];
typedef char check_stream_per_thread[(uintptr_t)KCU_STREAM_PER_THREAD ==
                                     (uintptr_t)CU_STREAM_PER_THREAD ? 1 : -1];
#pragma clang diagnostic pop
#else
_Static_assert((uintptr_t)KCU_STREAM_LEGACY == (uintptr_t)CU_STREAM_LEGACY, "CU_STREAM_LEGACY");
_Static_assert((uintptr_t)KCU_STREAM_PER_THREAD == (uintptr_t)CU_STREAM_PER_THREAD,
               "CU_STREAM_PER_THREAD");
#endif
SAME(KCU_MEMHOSTREGISTER_PORTABLE, CU_MEMHOSTREGISTER_PORTABLE)
SAME(KCU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_MEMORY_TYPE)
SAME(KCU_MEMORYTYPE_HOST, CU_MEMORYTYPE_HOST)
SAME(KCU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_DEVICE)

/* An object file must not be empty (ISO C). */
typedef int cudrv_check_nonempty;
