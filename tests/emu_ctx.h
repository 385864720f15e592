/*
 * tests/emu_ctx.h: shared test helpers for tests that call the emulated driver themselves.
 * kvvm calls leave the caller's current CUDA context as they found it, so a test thread that
 * uses the emulator's entry points directly makes the device's primary context current first
 * (emu_ctx_on) and undoes it after (emu_ctx_off). Criterion assertions: include after
 * criterion.h and vmm/emu/emu.h.
 */
#ifndef KVVM_TESTS_EMU_CTX_H
#define KVVM_TESTS_EMU_CTX_H

static inline void emu_ctx_on(int ord)
{
    const struct kcu_api *a = emu_api();
    kcu_device d;
    kcu_context c;
    cr_assert_eq(a->cuDeviceGet(&d, ord), KCU_SUCCESS);
    cr_assert_eq(a->cuDevicePrimaryCtxRetain(&c, d), KCU_SUCCESS);
    cr_assert_eq(a->cuCtxSetCurrent(c), KCU_SUCCESS);
}

static inline void emu_ctx_off(int ord)
{
    const struct kcu_api *a = emu_api();
    kcu_device d;
    cr_assert_eq(a->cuDeviceGet(&d, ord), KCU_SUCCESS);
    cr_assert_eq(a->cuCtxSetCurrent(NULL), KCU_SUCCESS);
    cr_assert_eq(a->cuDevicePrimaryCtxRelease(d), KCU_SUCCESS);
}

#endif
