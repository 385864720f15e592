/*
 * vmm/emu/emu_errors.c: error names and descriptions (cuGetErrorName, cuGetErrorString).
 * (Contract of the emulated device: vmm/emu/emu.h; internals: vmm/emu/emu_int.h.)
 */
#include "emu_int.h"

/* ---- error strings ------------------------------------------------------------------ */

static const struct { kcu_result code; const char *name, *desc; } err_table[] = {
    { KCU_SUCCESS, "CUDA_SUCCESS", "no error" },
    { KCU_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument" },
    { KCU_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory" },
    { KCU_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error" },
    { KCU_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down" },
    { KCU_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY",
      "CUDA driver is a stub library" },
    { KCU_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected" },
    { KCU_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal" },
    { KCU_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context" },
    { KCU_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped" },
    { KCU_ERROR_NOT_MAPPED, "CUDA_ERROR_NOT_MAPPED", "resource not mapped" },
    { KCU_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle" },
    { KCU_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found" },
    { KCU_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready" },
    { KCU_ERROR_ECC_UNCORRECTABLE, "CUDA_ERROR_ECC_UNCORRECTABLE",
      "uncorrectable ECC error encountered" },
    { KCU_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
      "an illegal memory access was encountered" },
    { KCU_ERROR_LAUNCH_TIMEOUT, "CUDA_ERROR_LAUNCH_TIMEOUT",
      "the launch timed out and was terminated" },
    { KCU_ERROR_HARDWARE_STACK_ERROR, "CUDA_ERROR_HARDWARE_STACK_ERROR",
      "hardware stack error" },
    { KCU_ERROR_ILLEGAL_INSTRUCTION, "CUDA_ERROR_ILLEGAL_INSTRUCTION",
      "an illegal instruction was encountered" },
    { KCU_ERROR_MISALIGNED_ADDRESS, "CUDA_ERROR_MISALIGNED_ADDRESS",
      "misaligned address" },
    { KCU_ERROR_INVALID_ADDRESS_SPACE, "CUDA_ERROR_INVALID_ADDRESS_SPACE",
      "operation not supported on global/shared address space" },
    { KCU_ERROR_INVALID_PC, "CUDA_ERROR_INVALID_PC", "invalid program counter" },
    { KCU_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure" },
    { KCU_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
      "part or all of the requested memory range is already mapped" },
    { KCU_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
      "pointer does not correspond to a registered memory region" },
    { KCU_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted" },
    { KCU_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported" },
    { KCU_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
      "operation not permitted when stream is capturing" },
    { KCU_ERROR_STREAM_CAPTURE_ISOLATION, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
      "dependency created on uncaptured work in another stream" },
    { KCU_ERROR_STREAM_CAPTURE_IMPLICIT, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
      "operation would make the legacy stream depend on a capturing blocking stream" },
    { KCU_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error" },
};

static int err_index(kcu_result e)
{
    for (size_t i = 0; i < sizeof err_table / sizeof err_table[0]; i++)
        if (err_table[i].code == e)
            return (int)i;
    return -1;
}

/* *str = the table's name or description of error. NULL str: KCU_ERROR_INVALID_VALUE; an
   unknown error: *str = NULL and KCU_ERROR_INVALID_VALUE, as the driver documents. */
static kcu_result err_str(kcu_result error, const char **str, bool name)
{
    if (!str)
        return KCU_ERROR_INVALID_VALUE;
    int i = err_index(error);
    *str = i < 0 ? NULL : name ? err_table[i].name : err_table[i].desc;
    return i < 0 ? KCU_ERROR_INVALID_VALUE : KCU_SUCCESS;
}

kcu_result emu_cuGetErrorString(kcu_result error, const char **str)
{
    BEGIN(cuGetErrorString, 0);
    r = err_str(error, str, false);
out:
    return emu_leave(r);
}

kcu_result emu_cuGetErrorName(kcu_result error, const char **str)
{
    BEGIN(cuGetErrorName, 0);
    r = err_str(error, str, true);
out:
    return emu_leave(r);
}
