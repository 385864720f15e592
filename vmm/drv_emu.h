/*
 * vmm/drv_emu.h: the emulated driver behind struct kcu_api (vmm/cudrv.h), as vmm.c chooses
 * it: the backend face of vmm/emu/, beside drv_cuda.h. The emulated device's full contract
 * and its test API are in vmm/emu/emu.h, which only the emulator itself, tests and tools
 * include; the library reaches the emulator through this header alone.
 *
 * Contract:
 *  - drv_emu_open creates a fresh emulated device (process-wide, like a GPU: cuDeviceGet
 *    takes the returned ordinal) and hands out the emulated table and its debug hooks
 *    (struct kcu_debug: the emulator's own tables, which the CUDA driver cannot show, and
 *    its import that takes the descriptor over).
 *  - drv_emu_close destroys it once its primary context is released; what it still held is
 *    freed and logged as leaks.
 */
#ifndef KVVM_VMM_DRV_EMU_H
#define KVVM_VMM_DRV_EMU_H

#include <stddef.h>
#include "cudrv.h"

struct drv_emu_params {
    size_t capacity;            /* bytes of device memory; rounded down to the granule */
    size_t granule;             /* 4 KiB .. 2 MiB, power of two; 0 = 2 MiB */
    int    opaque;              /* windows never CPU-accessible */
};

/* 0: *api is the emulated table, *dbg its debug hooks, *ordinal the new device's ordinal.
   -EINVAL bad params, -ENOMEM the device could not be made. */
int drv_emu_open(const struct drv_emu_params *p, const struct kcu_api **api,
                 const struct kcu_debug **dbg, int *ordinal);
/* Destroys the device. Returns the number of objects it still held (0 is clean), -ENODEV
   no such device. */
int drv_emu_close(int ordinal);

#endif
