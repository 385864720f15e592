/* tests/test_emu.c: conformance of the emulated device (vmm/emu/emu.h) with the driver's rules:
   strictness and error codes, aliasing, CPU faults, opaque mode, exhaustion, poison, fault
   injection, tracing, stream order, events, sticky faults, counters and leak accounting.
   Each test runs in its own process, so the process-global driver starts fresh. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include "harness.h"

#define KiB (1024ul)
#define MiB (1024ul * 1024ul)
#define G   (64 * KiB)           /* granule of the test devices */

static const struct kcu_api *A;
static int ord;
static kcu_context ctx;

/* A device with the given shape, cuInit done, its primary context current. */
static void dev_up(size_t capacity, size_t granule, int opaque, size_t max_maps)
{
    A = emu_api();
    cr_assert_str_eq(A->name, "emulated");
    struct emu_device_params p = { .capacity = capacity, .granule = granule,
                                   .opaque = opaque, .max_maps = max_maps };
    cr_assert_eq(emu_device_create(&p, &ord), 0);
    cr_assert_eq(A->cuInit(0), KCU_SUCCESS);
    kcu_device dev;
    cr_assert_eq(A->cuDeviceGet(&dev, ord), KCU_SUCCESS);
    cr_assert_eq(A->cuDevicePrimaryCtxRetain(&ctx, dev), KCU_SUCCESS);
    cr_assert_eq(A->cuCtxSetCurrent(ctx), KCU_SUCCESS);
}

static void dev_default(void) { dev_up(16 * MiB, G, 0, 0); }

/* Releases the context and destroys the device; returns the leak count. */
static int dev_down(void)
{
    cr_assert_eq(A->cuDevicePrimaryCtxRelease(ord), KCU_SUCCESS);
    return emu_device_destroy(ord);
}

static struct kcu_mem_alloc_prop prop_of(int id)
{
    struct kcu_mem_alloc_prop p = { 0 };
    p.type = KCU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = KCU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = id;
    return p;
}

static kcu_mem_handle create(size_t bytes)
{
    struct kcu_mem_alloc_prop p = prop_of(ord);
    kcu_mem_handle h = 0;
    cr_assert_eq(A->cuMemCreate(&h, bytes, &p, 0), KCU_SUCCESS);
    cr_assert_neq(h, 0);
    return h;
}

static kcu_deviceptr reserve(size_t bytes)
{
    kcu_deviceptr va = 0;
    cr_assert_eq(A->cuMemAddressReserve(&va, bytes, 0, 0, 0), KCU_SUCCESS);
    cr_assert_eq(va % G, 0);
    return va;
}

static kcu_result set_access(kcu_deviceptr va, size_t bytes, int flags)
{
    struct kcu_mem_access_desc d = { .location = { KCU_MEM_LOCATION_TYPE_DEVICE, ord },
                                     .flags = flags };
    return A->cuMemSetAccess(va, bytes, &d, 1);
}

static void map_rw(kcu_deviceptr va, size_t bytes, kcu_mem_handle h)
{
    cr_assert_eq(A->cuMemMap(va, bytes, 0, h, 0), KCU_SUCCESS);
    cr_assert_eq(set_access(va, bytes, KCU_MEM_ACCESS_FLAGS_PROT_READWRITE), KCU_SUCCESS);
}

static struct emu_counters counters(void)
{
    struct emu_counters c;
    cr_assert_eq(emu_counters_get(ord, &c), 0);
    return c;
}

/* ---- initialization, devices, contexts ------------------------------------------------ */

Test(emu, init_required_first)
{
    A = emu_api();
    struct emu_device_params p = { .capacity = MiB, .granule = G };
    cr_assert_eq(emu_device_create(&p, &ord), 0);
    int n;
    kcu_device dev;
    cr_expect_eq(A->cuDeviceGetCount(&n), KCU_ERROR_NOT_INITIALIZED);
    cr_expect_eq(A->cuDeviceGet(&dev, ord), KCU_ERROR_NOT_INITIALIZED);
    int v;
    cr_expect_eq(A->cuDriverGetVersion(&v), KCU_SUCCESS, "version needs no cuInit");
    cr_expect_eq(A->cuInit(1), KCU_ERROR_INVALID_VALUE);
    cr_assert_eq(A->cuInit(0), KCU_SUCCESS);
    cr_expect_eq(A->cuDeviceGetCount(&n), KCU_SUCCESS);
    cr_expect_eq(n, 1);
    cr_expect_eq(emu_device_destroy(ord), 0);
}

/* The status of a fork() child running fn: its exit code, or 100 + the signal that ended
   it (the child's own alarm: a hang). */
static int in_child(int (*fn)(void))
{
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        alarm(20);
        _exit(fn());
    }
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* In a child of an initialized driver: cuInit and every call that needs it fail
   NOT_INITIALIZED, as CUDA's do; the version and the error strings still answer. */
static int refused_child(void)
{
    int n, v;
    const char *str = NULL;
    struct emu_device_params p = { .capacity = MiB, .granule = G };
    int o;
    if (A->cuInit(0) != KCU_ERROR_NOT_INITIALIZED)
        return 1;
    if (A->cuDeviceGetCount(&n) != KCU_ERROR_NOT_INITIALIZED)
        return 2;
    if (A->cuCtxSetCurrent(ctx) != KCU_ERROR_NOT_INITIALIZED)
        return 3;
    if (A->cuDriverGetVersion(&v) != KCU_SUCCESS)
        return 4;
    if (A->cuGetErrorString(KCU_ERROR_NOT_INITIALIZED, &str) != KCU_SUCCESS || !str)
        return 5;
    /* a device of its own changes nothing: the driver is the parent's */
    if (emu_device_create(&p, &o) != 0 || A->cuInit(0) != KCU_ERROR_NOT_INITIALIZED)
        return 6;
    return 0;
}

Test(emu, fork_child_of_an_initialized_driver_is_refused)
{
    dev_default();
    cr_expect_eq(in_child(refused_child), 0, "the child's failed check (0: none)");
    int n;
    cr_expect_eq(A->cuDeviceGetCount(&n), KCU_SUCCESS, "the parent goes on");
    cr_expect_eq(dev_down(), 0);
}

static int fresh_child(void)
{
    A = emu_api();
    struct emu_device_params p = { .capacity = MiB, .granule = G };
    int n;
    if (emu_device_create(&p, &ord) != 0 || A->cuInit(0) != KCU_SUCCESS ||
        A->cuDeviceGetCount(&n) != KCU_SUCCESS)
        return 1;
    return emu_device_destroy(ord) == 0 ? 0 : 2;
}

Test(emu, fork_child_before_init_uses_the_driver)
{
    cr_expect_eq(in_child(fresh_child), 0, "a child forked before any cuInit initializes");
}

/* The bug: a child forked while a parent's thread held the emulator's lock (a stream's
   worker, a pool thread) hung at its first call, where CUDA's child fails: kvvm-bench's
   helpers hung so on the fake driver until CTest's timeout. */
Test(regress, fork_child_hung_on_the_lock_a_parent_thread_held)
{
    dev_default();
    emu_lock_for_test(1);
    int st = in_child(refused_child);
    emu_lock_for_test(0);
    cr_expect_eq(st, 0, "the child: %d (100 + 14: it hung until its alarm)", st);
    cr_expect_eq(dev_down(), 0);
}

Test(emu, device_queries)
{
    dev_up(10 * MiB + 5, G, 0, 0);
    kcu_device dev;
    cr_expect_eq(A->cuDeviceGet(&dev, ord + 1), KCU_ERROR_INVALID_DEVICE);
    cr_expect_eq(A->cuDeviceGet(&dev, -1), KCU_ERROR_INVALID_DEVICE);
    cr_assert_eq(A->cuDeviceGet(&dev, ord), KCU_SUCCESS);
    int vmm = 0;
    cr_expect_eq(A->cuDeviceGetAttribute(&vmm,
                 KCU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev), KCU_SUCCESS);
    cr_expect_eq(vmm, 1);
    char name[64];
    cr_expect_eq(A->cuDeviceGetName(name, sizeof name, dev), KCU_SUCCESS);
    cr_expect_str_eq(name, "kvvm emulated device");
    size_t total = 0;
    cr_expect_eq(A->cuDeviceTotalMem(&total, dev), KCU_SUCCESS);
    cr_expect_eq(total, 10 * MiB, "capacity is rounded down to the granule");
    int v = 0;
    cr_expect_eq(A->cuDriverGetVersion(&v), KCU_SUCCESS);
    cr_expect_geq(v, 11000);
    struct kcu_mem_alloc_prop p = prop_of(ord);
    size_t g = 0;
    cr_expect_eq(A->cuMemGetAllocationGranularity(&g, &p, KCU_MEM_ALLOC_GRANULARITY_MINIMUM),
                 KCU_SUCCESS);
    cr_expect_eq(g, G);
    p.location.id = 7;
    cr_expect_eq(A->cuMemGetAllocationGranularity(&g, &p, 0), KCU_ERROR_INVALID_DEVICE);
    p = prop_of(ord);
    cr_expect_eq(A->cuMemGetAllocationGranularity(&g, &p, 5), KCU_ERROR_INVALID_VALUE);
    cr_expect_eq(dev_down(), 0);
}

Test(emu, device_params_checked)
{
    int o;
    struct emu_device_params p = { .capacity = MiB, .granule = 3 * KiB };
    cr_expect_eq(emu_device_create(&p, &o), -EINVAL);
    p.granule = 4 * MiB;
    cr_expect_eq(emu_device_create(&p, &o), -EINVAL);
    p.granule = 0;                              /* 2 MiB default: 1 MiB rounds to nothing */
    cr_expect_eq(emu_device_create(&p, &o), -EINVAL);
    p.capacity = 4 * MiB;
    cr_assert_eq(emu_device_create(&p, &o), 0);
    A = emu_api();
    cr_assert_eq(A->cuInit(0), 0);
    struct kcu_mem_alloc_prop pr = prop_of(o);
    size_t g;
    cr_expect_eq(A->cuMemGetAllocationGranularity(&g, &pr, 0), KCU_SUCCESS);
    cr_expect_eq(g, 2 * MiB);
    cr_expect_eq(emu_device_destroy(o), 0);
}

Test(emu, no_context_is_invalid_context)
{
    dev_default();
    kcu_stream s;
    kcu_event e;
    cr_assert_eq(A->cuStreamCreate(&s, 0), KCU_SUCCESS);
    cr_assert_eq(A->cuCtxSetCurrent(NULL), KCU_SUCCESS);
    kcu_context c = ctx;
    cr_expect_eq(A->cuCtxGetCurrent(&c), KCU_SUCCESS);
    cr_expect_null(c);
    struct kcu_mem_alloc_prop p = prop_of(ord);
    kcu_mem_handle h;
    kcu_deviceptr va;
    kcu_stream s2;
    void *hp;
    char buf[16];
    cr_expect_eq(A->cuMemCreate(&h, G, &p, 0), KCU_ERROR_INVALID_CONTEXT);
    cr_expect_eq(A->cuMemAddressReserve(&va, G, 0, 0, 0), KCU_ERROR_INVALID_CONTEXT);
    cr_expect_eq(A->cuMemMap(0x10000, G, 0, 1, 0), KCU_ERROR_INVALID_CONTEXT);
    cr_expect_eq(A->cuStreamCreate(&s2, 0), KCU_ERROR_INVALID_CONTEXT);
    cr_expect_eq(A->cuEventCreate(&e, 0), KCU_ERROR_INVALID_CONTEXT);
    cr_expect_eq(A->cuMemcpyHtoDAsync(0x10000, buf, 16, s), KCU_ERROR_INVALID_CONTEXT);
    cr_expect_eq(A->cuMemcpyDtoHAsync(buf, 0x10000, 16, NULL), KCU_ERROR_INVALID_CONTEXT);
    cr_expect_eq(A->cuMemcpyDtoDAsync(0x10000, 0x20000, 16, NULL), KCU_ERROR_INVALID_CONTEXT);
    cr_expect_eq(A->cuMemsetD8Async(0x10000, 1, 16, NULL), KCU_ERROR_INVALID_CONTEXT);
    cr_expect_eq(A->cuMemAllocHost(&hp, 4096), KCU_ERROR_INVALID_CONTEXT);
    cr_expect_eq(A->cuMemHostRegister(buf, sizeof buf, 0), KCU_ERROR_INVALID_CONTEXT);
    cr_expect_eq(A->cuCtxSynchronize(), KCU_ERROR_INVALID_CONTEXT);
    cr_expect_eq(A->cuCtxSetCurrent((kcu_context)buf), KCU_ERROR_INVALID_CONTEXT);
    cr_assert_eq(A->cuCtxSetCurrent(ctx), KCU_SUCCESS);
    cr_expect_eq(A->cuStreamDestroy(s), KCU_SUCCESS);
    cr_expect_eq(dev_down(), 0);
}

Test(emu, primary_context_refcounted)
{
    dev_default();
    kcu_context c2;
    cr_assert_eq(A->cuDevicePrimaryCtxRetain(&c2, ord), KCU_SUCCESS);
    cr_expect_eq(c2, ctx, "one primary context per device");
    cr_assert_eq(A->cuDevicePrimaryCtxRelease(ord), KCU_SUCCESS);
    cr_assert_eq(A->cuDevicePrimaryCtxRelease(ord), KCU_SUCCESS);
    cr_expect_eq(A->cuDevicePrimaryCtxRelease(ord), KCU_ERROR_INVALID_CONTEXT);
    /* The thread's current context is gone with its last release. */
    kcu_deviceptr va;
    cr_expect_eq(A->cuMemAddressReserve(&va, G, 0, 0, 0), KCU_ERROR_INVALID_CONTEXT);
    cr_expect_eq(emu_device_destroy(ord), 0);
    cr_expect_eq(emu_device_destroy(ord), -ENODEV);
}

/* ---- cuMemCreate / cuMemRelease ----------------------------------------------------- */

Test(emu, create_checks_prop_and_size)
{
    dev_default();
    kcu_mem_handle h;
    struct kcu_mem_alloc_prop p = prop_of(ord);
    cr_expect_eq(A->cuMemCreate(&h, G / 2, &p, 0), KCU_ERROR_INVALID_VALUE, "size %% granule");
    cr_expect_eq(A->cuMemCreate(&h, 0, &p, 0), KCU_ERROR_INVALID_VALUE);
    cr_expect_eq(A->cuMemCreate(&h, G, &p, 1), KCU_ERROR_INVALID_VALUE, "flags");
    cr_expect_eq(A->cuMemCreate(&h, G, NULL, 0), KCU_ERROR_INVALID_VALUE);
    cr_expect_eq(A->cuMemCreate(NULL, G, &p, 0), KCU_ERROR_INVALID_VALUE);
    p.type = 0;
    cr_expect_eq(A->cuMemCreate(&h, G, &p, 0), KCU_ERROR_INVALID_VALUE, "type");
    p = prop_of(ord);
    p.location.type = 2;
    cr_expect_eq(A->cuMemCreate(&h, G, &p, 0), KCU_ERROR_INVALID_VALUE, "location type");
    p = prop_of(ord + 3);
    cr_expect_eq(A->cuMemCreate(&h, G, &p, 0), KCU_ERROR_INVALID_DEVICE, "location id");
    p = prop_of(ord);
    p.requestedHandleTypes = 8;         /* fabric: only POSIX descriptors are emulated */
    cr_expect_eq(A->cuMemCreate(&h, G, &p, 0), KCU_ERROR_NOT_SUPPORTED, "handle types");
    p = prop_of(ord);
    p.win32HandleMetaData = &p;
    cr_expect_eq(A->cuMemCreate(&h, G, &p, 0), KCU_ERROR_INVALID_VALUE, "win32 metadata");
    cr_expect_eq(counters().handles, 0, "a refused create left a handle");
    cr_expect_eq(dev_down(), 0);
}

Test(emu, release_rejects_stale_and_forged)
{
    dev_default();
    kcu_mem_handle h = create(G);
    cr_expect_eq(A->cuMemRelease(0), KCU_ERROR_INVALID_VALUE);
    cr_expect_eq(A->cuMemRelease(h + (1ull << 32)), KCU_ERROR_INVALID_VALUE, "wrong generation");
    cr_expect_eq(A->cuMemRelease(h + 1), KCU_ERROR_INVALID_VALUE, "unused slot");
    cr_expect_eq(A->cuMemRelease(h), KCU_SUCCESS);
    cr_expect_eq(A->cuMemRelease(h), KCU_ERROR_INVALID_VALUE, "double release");
    /* The slot is reused with a new generation: the old value stays dead. */
    kcu_mem_handle h2 = create(G);
    cr_expect_neq(h2, h);
    cr_expect_eq(A->cuMemRelease(h), KCU_ERROR_INVALID_VALUE);
    cr_expect_eq(A->cuMemRelease(h2), KCU_SUCCESS);
    struct emu_counters c = counters();
    cr_expect_eq(c.handles, 0);
    cr_expect_eq(c.creates, 2);
    cr_expect_eq(c.releases, 2);
    cr_expect_eq(dev_down(), 0);
}

Test(emu, poison_in_fresh_handle)
{
    dev_default();
    kcu_deviceptr va = reserve(2 * G);
    kcu_mem_handle h = create(2 * G);
    map_rw(va, 2 * G, h);
    unsigned char *buf = malloc(2 * G);
    cr_assert_eq(A->cuMemcpyDtoHAsync(buf, va, 2 * G, NULL), KCU_SUCCESS);
    cr_assert_eq(A->cuStreamSynchronize(NULL), KCU_SUCCESS);   /* legacy: asynchronous */
    for (size_t i = 0; i < 2 * G; i++)
        cr_assert_eq(buf[i], EMU_POISON, "byte %zu of a fresh handle is %#x", i, buf[i]);
    cr_expect_eq(((volatile unsigned char *)(uintptr_t)va)[G + 7], EMU_POISON);
    /* Written, released, created again: poison again, never the old bytes. */
    cr_assert_eq(A->cuMemsetD8Async(va, 0x11, 2 * G, NULL), KCU_SUCCESS);
    cr_assert_eq(A->cuStreamSynchronize(NULL), KCU_SUCCESS);   /* before the unmap */
    cr_assert_eq(A->cuMemUnmap(va, 2 * G), KCU_SUCCESS);
    cr_assert_eq(A->cuMemRelease(h), KCU_SUCCESS);
    h = create(2 * G);
    map_rw(va, 2 * G, h);
    cr_assert_eq(A->cuMemcpyDtoHAsync(buf, va, 2 * G, NULL), KCU_SUCCESS);
    cr_assert_eq(A->cuStreamSynchronize(NULL), KCU_SUCCESS);   /* legacy: asynchronous */
    for (size_t i = 0; i < 2 * G; i += 997)
        cr_assert_eq(buf[i], EMU_POISON);
    free(buf);
    cr_assert_eq(A->cuMemUnmap(va, 2 * G), KCU_SUCCESS);
    cr_assert_eq(A->cuMemRelease(h), KCU_SUCCESS);
    cr_assert_eq(A->cuMemAddressFree(va, 2 * G), KCU_SUCCESS);
    cr_expect_eq(dev_down(), 0);
}

Test(emu, capacity_exhaustion)
{
    dev_up(16 * G, G, 0, 0);
    kcu_mem_handle h[16];
    for (int i = 0; i < 16; i++)
        h[i] = create(G);
    struct kcu_mem_alloc_prop p = prop_of(ord);
    kcu_mem_handle x;
    cr_expect_eq(A->cuMemCreate(&x, G, &p, 0), KCU_ERROR_OUT_OF_MEMORY);
    cr_expect_eq(counters().handles, 16);
    cr_expect_eq(counters().handle_bytes, 16 * G);
    cr_assert_eq(A->cuMemRelease(h[5]), KCU_SUCCESS);
    cr_expect_eq(A->cuMemCreate(&x, 2 * G, &p, 0), KCU_ERROR_OUT_OF_MEMORY);
    cr_expect_eq(A->cuMemCreate(&x, G, &p, 0), KCU_SUCCESS, "freed capacity is reusable");
    cr_expect_eq(A->cuMemCreate(&x, 17 * G, &p, 0), KCU_ERROR_OUT_OF_MEMORY);
    cr_expect_gt(dev_down(), 0, "16 handles leaked");
}

/* ---- reservations ------------------------------------------------------------------- */

Test(emu, reserve_and_free_rules)
{
    dev_default();
    kcu_deviceptr va;
    cr_expect_eq(A->cuMemAddressReserve(&va, 0, 0, 0, 0), KCU_ERROR_INVALID_VALUE);
    cr_expect_eq(A->cuMemAddressReserve(&va, G + 4096, 0, 0, 0), KCU_ERROR_INVALID_VALUE);
    cr_expect_eq(A->cuMemAddressReserve(&va, G, 3 * G, 0, 0), KCU_ERROR_INVALID_VALUE);
    cr_expect_eq(A->cuMemAddressReserve(&va, G, 0, 0, 1), KCU_ERROR_INVALID_VALUE);
    cr_assert_eq(A->cuMemAddressReserve(&va, 4 * G, 16 * MiB, 0, 0), KCU_SUCCESS);
    cr_expect_eq(va % (16 * MiB), 0, "alignment honoured");
    kcu_deviceptr va2;
    kcu_deviceptr probe;                        /* find free address space, free it */
    cr_assert_eq(A->cuMemAddressReserve(&probe, 64 * MiB, 0, 0, 0), KCU_SUCCESS);
    cr_assert_eq(A->cuMemAddressFree(probe, 64 * MiB), KCU_SUCCESS);
    cr_assert_eq(A->cuMemAddressReserve(&va2, 2 * G, 0, probe + 32 * MiB, 0), KCU_SUCCESS);
    cr_expect_eq(va2, probe + 32 * MiB, "a free hinted address is honoured");
    kcu_deviceptr va3;
    cr_assert_eq(A->cuMemAddressReserve(&va3, 2 * G, 0, va, 0), KCU_SUCCESS);
    cr_expect_neq(va3, va, "a taken hint is not honoured");
    cr_expect_eq(counters().reservations, 3);
    cr_expect_eq(counters().reserved_bytes, 8 * G);
    /* Free must name exactly one reservation without live mappings. */
    cr_expect_eq(A->cuMemAddressFree(va, 2 * G), KCU_ERROR_INVALID_VALUE);
    cr_expect_eq(A->cuMemAddressFree(va + G, 3 * G), KCU_ERROR_INVALID_VALUE);
    kcu_mem_handle h = create(G);
    cr_assert_eq(A->cuMemMap(va + G, G, 0, h, 0), KCU_SUCCESS);
    cr_expect_eq(A->cuMemAddressFree(va, 4 * G), KCU_ERROR_INVALID_VALUE, "live mapping");
    cr_assert_eq(A->cuMemUnmap(va + G, G), KCU_SUCCESS);
    cr_expect_eq(A->cuMemAddressFree(va, 4 * G), KCU_SUCCESS);
    cr_expect_eq(A->cuMemAddressFree(va, 4 * G), KCU_ERROR_INVALID_VALUE, "double free");
    cr_expect_eq(A->cuMemAddressFree(va2, 2 * G), KCU_SUCCESS);
    cr_expect_eq(A->cuMemAddressFree(va3, 2 * G), KCU_SUCCESS);
    cr_expect_eq(A->cuMemRelease(h), KCU_SUCCESS);
    cr_expect_eq(counters().reservations, 0);
    cr_expect_eq(dev_down(), 0);
}

/* ---- cuMemMap / cuMemUnmap / cuMemSetAccess ----------------------------------------- */

Test(emu, map_rules)
{
    dev_default();
    kcu_deviceptr va = reserve(8 * G), other = reserve(2 * G);
    kcu_mem_handle h = create(2 * G), h2 = create(G);
    cr_expect_eq(A->cuMemMap(va, 2 * G, G, h, 0), KCU_ERROR_INVALID_VALUE, "offset != 0");
    cr_expect_eq(A->cuMemMap(va, 2 * G, 0, h, 1), KCU_ERROR_INVALID_VALUE, "flags");
    cr_expect_eq(A->cuMemMap(va + 4096, G, 0, h, 0), KCU_ERROR_INVALID_VALUE, "ptr alignment");
    cr_expect_eq(A->cuMemMap(va, G + 4096, 0, h, 0), KCU_ERROR_INVALID_VALUE, "size alignment");
    cr_expect_eq(A->cuMemMap(va, 0, 0, h, 0), KCU_ERROR_INVALID_VALUE, "size 0");
    cr_expect_eq(A->cuMemMap(va, 3 * G, 0, h, 0), KCU_ERROR_INVALID_VALUE, "beyond handle");
    cr_expect_eq(A->cuMemMap(va + 7 * G, 2 * G, 0, h, 0), KCU_ERROR_INVALID_VALUE,
                 "past the reservation");
    cr_expect_eq(A->cuMemMap(0x10000, G, 0, h, 0), KCU_ERROR_INVALID_VALUE, "not reserved");
    cr_expect_eq(A->cuMemMap(va, G, 0, h + (1ull << 32), 0), KCU_ERROR_INVALID_VALUE,
                 "forged handle");
    cr_assert_eq(A->cuMemMap(va, G, 0, h, 0), KCU_SUCCESS, "a prefix of a handle");
    cr_expect_eq(A->cuMemMap(va, G, 0, h2, 0), KCU_ERROR_INVALID_VALUE, "onto a mapping");
    cr_expect_eq(A->cuMemMap(va + 0, 2 * G, 0, h2, 0), KCU_ERROR_INVALID_VALUE);
    cr_assert_eq(A->cuMemMap(va + G, G, 0, h2, 0), KCU_SUCCESS);
    cr_assert_eq(A->cuMemMap(other, 2 * G, 0, h, 0), KCU_SUCCESS, "a second mapping");
    struct emu_counters c = counters();
    cr_expect_eq(c.mappings, 3);
    cr_expect_eq(c.mapped_bytes, 4 * G);
    cr_expect_eq(c.maps, 3);
    kcu_mem_handle lh;
    size_t off;
    int acc = -1;
    cr_expect_eq(emu_lookup(other + G + 5, &lh, &off, &acc), 0);
    cr_expect_eq(lh, h);
    cr_expect_eq(off, G + 5);
    cr_expect_eq(acc, KCU_MEM_ACCESS_FLAGS_PROT_NONE);
    cr_expect_eq(emu_lookup(va + 2 * G, &lh, &off, &acc), -ENOENT);
    cr_assert_eq(A->cuMemUnmap(va, 2 * G), KCU_SUCCESS, "two whole mappings at once");
    cr_assert_eq(A->cuMemUnmap(other, 2 * G), KCU_SUCCESS);
    cr_expect_eq(A->cuMemRelease(h), KCU_SUCCESS);
    cr_expect_eq(A->cuMemRelease(h2), KCU_SUCCESS);
    cr_expect_eq(A->cuMemAddressFree(va, 8 * G), KCU_SUCCESS);
    cr_expect_eq(A->cuMemAddressFree(other, 2 * G), KCU_SUCCESS);
    cr_expect_eq(dev_down(), 0);
}

Test(emu, map_cannot_span_reservations)
{
    dev_default();
    /* Two adjacent reservations: reserve room for both, free it, then ask for each half by
       address (the range just freed is free, unlike whatever lies below a fresh one). */
    kcu_deviceptr room = 0, a = 0, b = 0;
    cr_assert_eq(A->cuMemAddressReserve(&room, 4 * G, 0, 0, 0), KCU_SUCCESS);
    cr_assert_eq(A->cuMemAddressFree(room, 4 * G), KCU_SUCCESS);
    cr_assert_eq(A->cuMemAddressReserve(&a, 2 * G, 0, room, 0), KCU_SUCCESS);
    cr_assert_eq(A->cuMemAddressReserve(&b, 2 * G, 0, room + 2 * G, 0), KCU_SUCCESS);
    cr_assert_eq(a, room, "address hint honoured");
    cr_assert_eq(b, a + 2 * G, "adjacent reservations for the test");
    kcu_mem_handle h = create(2 * G);
    cr_expect_eq(A->cuMemMap(a + G, 2 * G, 0, h, 0), KCU_ERROR_INVALID_VALUE);
    cr_expect_eq(A->cuMemRelease(h), KCU_SUCCESS);
    cr_expect_eq(A->cuMemAddressFree(a, 2 * G), KCU_SUCCESS);
    cr_expect_eq(A->cuMemAddressFree(b, 2 * G), KCU_SUCCESS);
    cr_expect_eq(dev_down(), 0);
}

Test(emu, unmap_rules)
{
    dev_default();
    kcu_deviceptr va = reserve(8 * G);
    kcu_mem_handle h = create(2 * G), h2 = create(G);
    cr_assert_eq(A->cuMemMap(va, 2 * G, 0, h, 0), KCU_SUCCESS);
    cr_assert_eq(A->cuMemMap(va + 2 * G, G, 0, h2, 0), KCU_SUCCESS);
    cr_expect_eq(A->cuMemUnmap(va, G), KCU_ERROR_INVALID_VALUE, "half a mapping");
    cr_expect_eq(A->cuMemUnmap(va + G, 2 * G), KCU_ERROR_INVALID_VALUE, "a tail and a mapping");
    cr_expect_eq(A->cuMemUnmap(va, 4 * G), KCU_ERROR_INVALID_VALUE, "with an unmapped granule");
    cr_expect_eq(A->cuMemUnmap(va + 3 * G, G), KCU_ERROR_INVALID_VALUE, "nothing mapped");
    cr_expect_eq(A->cuMemUnmap(va + 4096, G), KCU_ERROR_INVALID_VALUE, "misaligned");
    cr_expect_eq(A->cuMemUnmap(0x10000, G), KCU_ERROR_INVALID_VALUE, "not reserved");
    cr_expect_eq(counters().mappings, 2, "a refused unmap changed the table");
    cr_assert_eq(A->cuMemUnmap(va + 2 * G, G), KCU_SUCCESS);
    cr_assert_eq(A->cuMemUnmap(va, 2 * G), KCU_SUCCESS);
    cr_expect_eq(A->cuMemUnmap(va, 2 * G), KCU_ERROR_INVALID_VALUE, "double unmap");
    cr_expect_eq(counters().mappings, 0);
    cr_expect_eq(counters().unmaps, 2);
    cr_expect_eq(A->cuMemRelease(h), KCU_SUCCESS);
    cr_expect_eq(A->cuMemRelease(h2), KCU_SUCCESS);
    cr_expect_eq(A->cuMemAddressFree(va, 8 * G), KCU_SUCCESS);
    cr_expect_eq(dev_down(), 0);
}

Test(emu, set_access_rules)
{
    dev_default();
    kcu_deviceptr va = reserve(4 * G);
    kcu_mem_handle h = create(2 * G);
    cr_assert_eq(A->cuMemMap(va, 2 * G, 0, h, 0), KCU_SUCCESS);
    struct kcu_mem_access_desc d = { .location = { KCU_MEM_LOCATION_TYPE_DEVICE, ord },
                                     .flags = KCU_MEM_ACCESS_FLAGS_PROT_READWRITE };
    cr_expect_eq(A->cuMemSetAccess(va, 3 * G, &d, 1), KCU_ERROR_INVALID_VALUE, "unmapped part");
    cr_expect_eq(A->cuMemSetAccess(va + 2 * G, G, &d, 1), KCU_ERROR_INVALID_VALUE);
    cr_expect_eq(A->cuMemSetAccess(va, 2 * G, &d, 0), KCU_ERROR_INVALID_VALUE, "count 0");
    cr_expect_eq(A->cuMemSetAccess(va, 2 * G, NULL, 1), KCU_ERROR_INVALID_VALUE);
    cr_expect_eq(A->cuMemSetAccess(va + 4096, G, &d, 1), KCU_ERROR_INVALID_VALUE, "misaligned");
    d.flags = 2;
    cr_expect_eq(A->cuMemSetAccess(va, 2 * G, &d, 1), KCU_ERROR_INVALID_VALUE, "flags");
    d.flags = KCU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    d.location.type = 0;
    cr_expect_eq(A->cuMemSetAccess(va, 2 * G, &d, 1), KCU_ERROR_INVALID_VALUE, "location type");
    d.location.type = KCU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = ord + 5;
    cr_expect_eq(A->cuMemSetAccess(va, 2 * G, &d, 1), KCU_ERROR_INVALID_DEVICE);
    int acc = -1;
    cr_expect_eq(emu_lookup(va, NULL, NULL, &acc), 0);
    cr_expect_eq(acc, KCU_MEM_ACCESS_FLAGS_PROT_NONE, "refused calls changed access");
    cr_expect_eq(set_access(va + G, G, KCU_MEM_ACCESS_FLAGS_PROT_READ), KCU_SUCCESS,
                 "part of a mapping");
    cr_expect_eq(emu_lookup(va + G, NULL, NULL, &acc), 0);
    cr_expect_eq(acc, KCU_MEM_ACCESS_FLAGS_PROT_READ);
    cr_expect_eq(counters().set_access, 1);
    cr_expect_eq(A->cuMemUnmap(va, 2 * G), KCU_SUCCESS);
    cr_expect_eq(A->cuMemRelease(h), KCU_SUCCESS);
    cr_expect_eq(A->cuMemAddressFree(va, 4 * G), KCU_SUCCESS);
    cr_expect_eq(dev_down(), 0);
}

Test(emu, release_while_mapped_frees_after_last_unmap)
{
    dev_default();
    kcu_deviceptr a = reserve(G), b = reserve(G);
    kcu_mem_handle h = create(G);
    map_rw(a, G, h);
    map_rw(b, G, h);
    cr_assert_eq(A->cuMemsetD8Async(a, 0x3c, G, NULL), KCU_SUCCESS);
    cr_assert_eq(A->cuMemRelease(h), KCU_SUCCESS);
    cr_expect_eq(A->cuMemMap(a, G, 0, h, 0), KCU_ERROR_INVALID_VALUE, "released handle");
    cr_expect_eq(counters().handles, 1, "memory lives while mapped");
    unsigned char x = 0;
    cr_assert_eq(A->cuMemcpyDtoHAsync(&x, b + 100, 1, NULL), KCU_SUCCESS);
    cr_assert_eq(A->cuStreamSynchronize(NULL), KCU_SUCCESS);   /* legacy: asynchronous */
    cr_expect_eq(x, 0x3c);
    cr_assert_eq(A->cuMemUnmap(a, G), KCU_SUCCESS);
    cr_expect_eq(counters().handles, 1);
    cr_assert_eq(A->cuMemUnmap(b, G), KCU_SUCCESS);
    cr_expect_eq(counters().handles, 0, "freed after the last unmap");
    cr_expect_eq(counters().handle_bytes, 0);
    cr_expect_eq(A->cuMemAddressFree(a, G), KCU_SUCCESS);
    cr_expect_eq(A->cuMemAddressFree(b, G), KCU_SUCCESS);
    cr_expect_eq(dev_down(), 0);
}

/* The pool view's case (libkvvm's KVVM_F_POOL_VIEW): two handles mapped side by side in a
   window and each again at a place of another array of the same reservation. Access is per
   mapping (the window's set-access gives the second mapping none), set-access and unmap
   take exactly whole mapped ranges, and a released handle lives until its last mapping
   (the second) is unmapped, its bytes the same through either address meanwhile. */
Test(emu, second_mapping_of_a_handle_has_its_own_access_and_life)
{
    dev_default();
    kcu_deviceptr va = reserve(8 * G), win = va, view = va + 4 * G;
    kcu_mem_handle h1 = create(G), h2 = create(G);
    map_rw(win, G, h1);
    map_rw(win + G, G, h2);
    cr_assert_eq(A->cuMemMap(view + 2 * G, G, 0, h1, 0), KCU_SUCCESS);   /* id 2 */
    cr_assert_eq(A->cuMemMap(view, G, 0, h2, 0), KCU_SUCCESS);           /* id 0 */
    int acc = -1;
    cr_expect_eq(emu_lookup(view + 2 * G, NULL, NULL, &acc), 0);
    cr_expect_eq(acc, KCU_MEM_ACCESS_FLAGS_PROT_NONE, "the window's access leaked to the view");
    cr_expect_eq(set_access(view + 2 * G, 2 * G, KCU_MEM_ACCESS_FLAGS_PROT_READWRITE),
                 KCU_ERROR_INVALID_VALUE, "set-access past the mapped range");
    cr_expect_eq(set_access(view, 3 * G, KCU_MEM_ACCESS_FLAGS_PROT_READWRITE),
                 KCU_ERROR_INVALID_VALUE, "set-access over an unmapped slot");
    cr_assert_eq(set_access(view + 2 * G, G, KCU_MEM_ACCESS_FLAGS_PROT_READWRITE), KCU_SUCCESS);
    cr_assert_eq(set_access(view, G, KCU_MEM_ACCESS_FLAGS_PROT_READWRITE), KCU_SUCCESS);
    volatile unsigned char *w = (volatile unsigned char *)(uintptr_t)win;
    volatile unsigned char *v = (volatile unsigned char *)(uintptr_t)view;
    w[5] = 0x11;
    w[G + 7] = 0x22;
    cr_expect_eq(v[2 * G + 5], 0x11);
    cr_expect_eq(v[7], 0x22);
    cr_expect_eq(A->cuMemUnmap(win + G / 2, G), KCU_ERROR_INVALID_VALUE, "half of two mappings");
    cr_expect_eq(A->cuMemUnmap(view + G, G), KCU_ERROR_INVALID_VALUE, "nothing mapped there");
    cr_assert_eq(A->cuMemUnmap(win, 2 * G), KCU_SUCCESS);     /* the window, both handles */
    cr_expect_eq(v[2 * G + 5], 0x11, "the second mapping lost its bytes with the first");
    cr_assert_eq(A->cuMemRelease(h1), KCU_SUCCESS);
    cr_assert_eq(A->cuMemRelease(h2), KCU_SUCCESS);
    cr_expect_eq(counters().handles, 2, "released handles freed while still mapped");
    cr_expect_eq(v[7], 0x22);
    cr_assert_eq(A->cuMemUnmap(view + 2 * G, G), KCU_SUCCESS);
    cr_expect_eq(counters().handles, 1, "h1 not freed after its last unmap");
    cr_assert_eq(A->cuMemUnmap(view, G), KCU_SUCCESS);
    cr_expect_eq(counters().handles, 0);
    cr_expect_eq(counters().mappings, 0);
    cr_expect_eq(A->cuMemAddressFree(va, 8 * G), KCU_SUCCESS);
    cr_expect_eq(dev_down(), 0);
}

/* Issue 31, defect 2: a released handle of several granules mapped at two places. Each
   mapping is several granule entries of the table; the unmap of the last mapping freed the
   handle at its first entry and touched the freed handle at the next (SIGSEGV). The driver
   keeps a released handle, its bytes readable through every mapping left, until its last
   mapping is gone, whether mappings go one call each or several in one call. */
Test(regress, released_handle_freed_at_the_first_granule_of_its_last_unmap)
{
    dev_default();
    kcu_deviceptr va = reserve(16 * G), win = va, view = va + 8 * G;
    kcu_mem_handle h = create(4 * G), h2 = create(2 * G);
    map_rw(win, 4 * G, h);
    map_rw(view, 4 * G, h);
    cr_assert_eq(A->cuMemsetD8Async(win + 3 * G, 0x5e, G, NULL), KCU_SUCCESS);
    cr_assert_eq(A->cuStreamSynchronize(NULL), KCU_SUCCESS);   /* legacy: asynchronous */
    cr_assert_eq(A->cuMemRelease(h), KCU_SUCCESS);
    cr_assert_eq(A->cuMemUnmap(win, 4 * G), KCU_SUCCESS);
    cr_expect_eq(counters().handles, 2, "a released handle freed with a mapping left");
    unsigned char x = 0;
    cr_assert_eq(A->cuMemcpyDtoHAsync(&x, view + 3 * G + 9, 1, NULL), KCU_SUCCESS);
    cr_assert_eq(A->cuStreamSynchronize(NULL), KCU_SUCCESS);
    cr_expect_eq(x, 0x5e, "the bytes of the mapping left");
    cr_assert_eq(A->cuMemUnmap(view, 4 * G), KCU_SUCCESS);
    struct emu_counters c = counters();
    cr_expect_eq(c.handles, 1, "not freed after its last unmap");
    cr_expect_eq(c.handle_bytes, 2 * G);
    cr_expect_eq(c.mappings, 0);
    cr_expect_eq(c.mapped_bytes, 0);
    /* two mappings of one released handle, side by side, unmapped by one call; then the
       granules of the freed handle are another handle's */
    map_rw(win, 2 * G, h2);
    map_rw(win + 2 * G, 2 * G, h2);
    cr_assert_eq(A->cuMemRelease(h2), KCU_SUCCESS);
    cr_assert_eq(A->cuMemUnmap(win, 4 * G), KCU_SUCCESS);
    c = counters();
    cr_expect_eq(c.handles, 0);
    cr_expect_eq(c.handle_bytes, 0);
    cr_expect_eq(c.mapped_bytes, 0);
    kcu_mem_handle h3 = create(4 * G);
    map_rw(view, 4 * G, h3);
    cr_assert_eq(A->cuMemUnmap(view, 4 * G), KCU_SUCCESS);
    cr_assert_eq(A->cuMemRelease(h3), KCU_SUCCESS);
    cr_expect_eq(A->cuMemAddressFree(va, 16 * G), KCU_SUCCESS);
    cr_expect_eq(dev_down(), 0);
}

Test(emu, aliasing_through_windows_and_copies)
{
    dev_default();
    kcu_deviceptr a = reserve(2 * G), b = reserve(2 * G);
    kcu_mem_handle h = create(2 * G);
    map_rw(a, 2 * G, h);
    map_rw(b, 2 * G, h);
    /* CPU write through one window, read through the other. */
    volatile unsigned char *wa = (volatile unsigned char *)(uintptr_t)a;
    volatile unsigned char *wb = (volatile unsigned char *)(uintptr_t)b;
    wa[G + 3] = 0x5a;
    cr_expect_eq(wb[G + 3], 0x5a);
    /* Copy in through one address, out through the other. */
    char msg[] = "aliased page contents", out[sizeof msg] = { 0 };
    cr_assert_eq(A->cuMemcpyHtoDAsync(a + 100, msg, sizeof msg, NULL), KCU_SUCCESS);
    cr_assert_eq(A->cuMemcpyDtoHAsync(out, b + 100, sizeof msg, NULL), KCU_SUCCESS);
    cr_assert_eq(A->cuStreamSynchronize(NULL), KCU_SUCCESS);   /* legacy: asynchronous */
    cr_expect_str_eq(out, msg);
    cr_expect_eq(memcmp((const void *)(wb + 100), msg, sizeof msg), 0);
    /* Device-to-device between the aliases. */
    cr_assert_eq(A->cuMemcpyDtoDAsync(b + G, a + 100, sizeof msg, NULL), KCU_SUCCESS);
    cr_assert_eq(A->cuStreamSynchronize(NULL), KCU_SUCCESS);   /* legacy: asynchronous */
    cr_expect_eq(memcmp((const void *)(wa + G), msg, sizeof msg), 0);
    kcu_mem_handle la, lb;
    cr_expect_eq(emu_lookup(a, &la, NULL, NULL), 0);
    cr_expect_eq(emu_lookup(b, &lb, NULL, NULL), 0);
    cr_expect_eq(la, h);
    cr_expect_eq(lb, h);
    cr_expect_eq(A->cuMemUnmap(a, 2 * G), KCU_SUCCESS);
    cr_expect_eq(A->cuMemUnmap(b, 2 * G), KCU_SUCCESS);
    cr_expect_eq(A->cuMemRelease(h), KCU_SUCCESS);
    cr_expect_eq(A->cuMemAddressFree(a, 2 * G), KCU_SUCCESS);
    cr_expect_eq(A->cuMemAddressFree(b, 2 * G), KCU_SUCCESS);
    cr_expect_eq(dev_down(), 0);
}

Test(emu, copies_span_mappings_and_handles)
{
    dev_default();
    kcu_deviceptr va = reserve(4 * G);
    kcu_mem_handle h1 = create(G), h2 = create(2 * G), h3 = create(G);
    map_rw(va, G, h1);
    map_rw(va + G, 2 * G, h2);
    map_rw(va + 3 * G, G, h3);
    size_t n = 4 * G - 200;
    unsigned char *src = malloc(n), *dst = malloc(n);
    for (size_t i = 0; i < n; i++)
        src[i] = (unsigned char)(i * 31 + 7);
    cr_assert_eq(A->cuMemcpyHtoDAsync(va + 100, src, n, NULL), KCU_SUCCESS);
    memset(dst, 0, n);
    cr_assert_eq(A->cuMemcpyDtoHAsync(dst, va + 100, n, NULL), KCU_SUCCESS);
    cr_assert_eq(A->cuStreamSynchronize(NULL), KCU_SUCCESS);   /* legacy: asynchronous */
    cr_expect_eq(memcmp(src, dst, n), 0);
    /* Each handle holds its part: h3's first byte is src[3G - 100]. */
    kcu_deviceptr b = reserve(G);
    map_rw(b, G, h3);
    unsigned char x;
    cr_assert_eq(A->cuMemcpyDtoHAsync(&x, b, 1, NULL), KCU_SUCCESS);
    cr_assert_eq(A->cuStreamSynchronize(NULL), KCU_SUCCESS);   /* legacy: asynchronous */
    cr_expect_eq(x, src[3 * G - 100]);
    free(src);
    free(dst);
    struct emu_counters c = counters();
    cr_expect_eq(c.copied_htod, n);
    cr_expect_eq(c.copied_dtoh, n + 1);
    cr_expect_eq(A->cuMemUnmap(va, 4 * G), KCU_SUCCESS);
    cr_expect_eq(A->cuMemUnmap(b, G), KCU_SUCCESS);
    cr_expect_eq(A->cuMemRelease(h1), KCU_SUCCESS);
    cr_expect_eq(A->cuMemRelease(h2), KCU_SUCCESS);
    cr_expect_eq(A->cuMemRelease(h3), KCU_SUCCESS);
    cr_expect_eq(A->cuMemAddressFree(va, 4 * G), KCU_SUCCESS);
    cr_expect_eq(A->cuMemAddressFree(b, G), KCU_SUCCESS);
    cr_expect_eq(dev_down(), 0);
}

Test(emu, copy_to_unknown_address_is_invalid_value)
{
    dev_default();
    kcu_deviceptr va = reserve(2 * G);
    kcu_mem_handle h = create(G);
    map_rw(va, G, h);
    char buf[64] = { 0 };
    cr_expect_eq(A->cuMemcpyHtoDAsync(va + G - 8, buf, 64, NULL), KCU_ERROR_INVALID_VALUE,
                 "runs into an unmapped granule");
    cr_expect_eq(A->cuMemcpyDtoHAsync(buf, 0x1000, 8, NULL), KCU_ERROR_INVALID_VALUE);
    cr_expect_eq(A->cuMemcpyHtoDAsync(va, NULL, 8, NULL), KCU_ERROR_INVALID_VALUE);
    cr_expect_eq(A->cuMemcpyHtoDAsync(va, buf, 0, NULL), KCU_SUCCESS, "zero bytes");
    cr_expect_eq(A->cuMemcpyHtoDAsync(va, buf, 8, NULL), KCU_SUCCESS, "not sticky");
    /* the copy is queued: unmapping before it ran killed the device (1 full run in ~10) */
    cr_assert_eq(A->cuStreamSynchronize(NULL), KCU_SUCCESS);
    cr_expect_eq(A->cuMemUnmap(va, G), KCU_SUCCESS);
    cr_expect_eq(A->cuMemRelease(h), KCU_SUCCESS);
    cr_expect_eq(A->cuMemAddressFree(va, 2 * G), KCU_SUCCESS);
    cr_expect_eq(dev_down(), 0);
}

/* ---- CPU faults ----------------------------------------------------------------------- */

static kcu_deviceptr mapped_window(int flags_or_minus1)
{
    kcu_deviceptr va = reserve(G);
    kcu_mem_handle h = create(G);
    cr_assert_eq(A->cuMemMap(va, G, 0, h, 0), KCU_SUCCESS);
    if (flags_or_minus1 >= 0)
        cr_assert_eq(set_access(va, G, flags_or_minus1), KCU_SUCCESS);
    return va;
}

Test(emu, cpu_access_before_set_access_faults, .signal = SIGSEGV)
{
    dev_default();
    volatile unsigned char *p = (volatile unsigned char *)(uintptr_t)mapped_window(-1);
    (void)p[0];
}

Test(emu, cpu_access_after_unmap_faults, .signal = SIGSEGV)
{
    dev_default();
    kcu_deviceptr va = mapped_window(KCU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    volatile unsigned char *p = (volatile unsigned char *)(uintptr_t)va;
    p[0] = 1;                                   /* accessible while mapped */
    cr_assert_eq(A->cuMemUnmap(va, G), KCU_SUCCESS);
    (void)p[0];
}

Test(emu, cpu_write_to_read_only_faults, .signal = SIGSEGV)
{
    dev_default();
    volatile unsigned char *p = (volatile unsigned char *)(uintptr_t)
        mapped_window(KCU_MEM_ACCESS_FLAGS_PROT_READ);
    cr_assert_eq(p[0], EMU_POISON);
    p[0] = 1;
}

Test(emu, opaque_cpu_access_faults_after_set_access, .signal = SIGSEGV)
{
    dev_up(16 * MiB, G, 1, 0);
    volatile unsigned char *p = (volatile unsigned char *)(uintptr_t)
        mapped_window(KCU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    (void)p[0];
}

Test(emu, opaque_copies_work)
{
    dev_up(16 * MiB, G, 1, 0);
    kcu_deviceptr va = mapped_window(KCU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    char msg[] = "through the view", out[sizeof msg] = { 0 };
    cr_assert_eq(A->cuMemcpyHtoDAsync(va + 10, msg, sizeof msg, NULL), KCU_SUCCESS);
    cr_assert_eq(A->cuMemcpyDtoDAsync(va + 1000, va + 10, sizeof msg, NULL), KCU_SUCCESS);
    cr_assert_eq(A->cuStreamSynchronize(NULL), KCU_SUCCESS);   /* legacy: asynchronous */
    cr_assert_eq(A->cuMemcpyDtoHAsync(out, va + 1000, sizeof msg, NULL), KCU_SUCCESS);
    cr_assert_eq(A->cuStreamSynchronize(NULL), KCU_SUCCESS);   /* legacy: asynchronous */
    cr_expect_str_eq(out, msg);
    int acc;
    cr_expect_eq(emu_lookup(va, NULL, NULL, &acc), 0);
    cr_expect_eq(acc, KCU_MEM_ACCESS_FLAGS_PROT_READWRITE, "access recorded in opaque mode");
}

/* ---- sticky device faults ------------------------------------------------------------- */

Test(emu, copy_without_access_is_sticky_illegal_address)
{
    dev_default();
    kcu_deviceptr va = mapped_window(-1);
    char buf[8] = { 0 };
    /* the legacy stream is asynchronous: the fault shows at the call or at the sync */
    kcu_result r0 = A->cuMemcpyHtoDAsync(va, buf, 8, NULL);
    cr_expect(r0 == KCU_SUCCESS || r0 == KCU_ERROR_ILLEGAL_ADDRESS, "%d", r0);
    cr_expect_eq(A->cuStreamSynchronize(NULL), KCU_ERROR_ILLEGAL_ADDRESS);
    struct kcu_mem_alloc_prop p = prop_of(ord);
    kcu_mem_handle h;
    cr_expect_eq(A->cuMemCreate(&h, G, &p, 0), KCU_ERROR_ILLEGAL_ADDRESS, "sticky");
    cr_expect_eq(A->cuCtxSynchronize(), KCU_ERROR_ILLEGAL_ADDRESS);
    cr_expect_eq(counters().copied_htod, 0);
}

Test(emu, copy_to_read_only_is_sticky_illegal_address)
{
    dev_default();
    kcu_deviceptr va = mapped_window(KCU_MEM_ACCESS_FLAGS_PROT_READ);
    char buf[8] = { 0 };
    cr_expect_eq(A->cuMemcpyDtoHAsync(buf, va, 8, NULL), KCU_SUCCESS, "reading is allowed");
    cr_expect_eq(A->cuStreamSynchronize(NULL), KCU_SUCCESS, "reading is allowed");
    kcu_result r0 = A->cuMemsetD8Async(va, 0, 8, NULL);   /* faults when it runs */
    cr_expect(r0 == KCU_SUCCESS || r0 == KCU_ERROR_ILLEGAL_ADDRESS, "%d", r0);
    cr_expect_eq(A->cuStreamSynchronize(NULL), KCU_ERROR_ILLEGAL_ADDRESS);
    cr_expect_eq(A->cuMemcpyDtoHAsync(buf, va, 8, NULL), KCU_ERROR_ILLEGAL_ADDRESS);
}

Test(emu, unmap_under_queued_copy_faults)
{
    dev_default();
    kcu_deviceptr va = reserve(4 * G);
    kcu_mem_handle h = create(4 * G);
    map_rw(va, 4 * G, h);
    kcu_stream s;
    cr_assert_eq(A->cuStreamCreate(&s, 0), KCU_SUCCESS);
    cr_assert_eq(emu_stream_set_paused(s, 1), 0);
    /* Pinned destination: a pageable one would make the call wait for the copy (the
       driver's documented behaviour, which the emulator follows). */
    void *buf;
    cr_assert_eq(A->cuMemAllocHost(&buf, 4 * G), KCU_SUCCESS);
    cr_assert_eq(A->cuMemcpyDtoHAsync(buf, va, 4 * G, s), KCU_SUCCESS);
    cr_expect_eq(A->cuStreamQuery(s), KCU_ERROR_NOT_READY);
    /* The bug the emulator exists to catch: unmapping before the copy ran. */
    cr_assert_eq(A->cuMemUnmap(va, 4 * G), KCU_SUCCESS);
    cr_assert_eq(emu_stream_set_paused(s, 0), 0);
    cr_expect_eq(A->cuStreamSynchronize(s), KCU_ERROR_ILLEGAL_ADDRESS);
    cr_expect_eq(A->cuMemRelease(h), KCU_ERROR_ILLEGAL_ADDRESS, "every later call");
    cr_expect_eq(A->cuStreamQuery(s), KCU_ERROR_ILLEGAL_ADDRESS);
    cr_expect_eq(A->cuStreamDestroy(s), KCU_SUCCESS);
    cr_expect_eq(counters().streams, 0);
}

Test(emu, unmap_during_long_copy_faults_or_completes_first)
{
    /* A long copy runs in 1 MiB chunks, translating each: an unmap issued while it runs
       lands between chunks. Either the copy finished before the unmap (possible on a loaded
       machine) or the device faulted; it must never read the unmapped range silently. */
    dev_up(64 * MiB, G, 0, 0);
    size_t n = 48 * MiB;
    kcu_deviceptr va = reserve(n);
    kcu_mem_handle h = create(n);
    map_rw(va, n, h);
    void *buf;
    cr_assert_eq(A->cuMemAllocHost(&buf, n), KCU_SUCCESS);   /* pinned: truly async */
    kcu_stream s;
    cr_assert_eq(A->cuStreamCreate(&s, 0), KCU_SUCCESS);
    cr_assert_eq(A->cuMemcpyDtoHAsync(buf, va, n, s), KCU_SUCCESS);
    while (counters().copied_dtoh == 0)         /* the copy has started */
        sched_yield();
    kcu_result q = A->cuStreamQuery(s);
    cr_assert_eq(A->cuMemUnmap(va, n), KCU_SUCCESS);
    kcu_result r = A->cuStreamSynchronize(s);
    struct emu_counters c = counters();
    cr_log_info("long copy: query %d, sync %d, copied %llu of %zu", q, r,
                (unsigned long long)c.copied_dtoh, n);
    if (q == KCU_ERROR_NOT_READY && r == KCU_ERROR_ILLEGAL_ADDRESS)
        cr_expect(c.copied_dtoh > 0 && c.copied_dtoh < n, "faulted mid-copy");
    else
        cr_expect(r == KCU_SUCCESS && c.copied_dtoh == n, "r=%d copied=%llu", r,
                  (unsigned long long)c.copied_dtoh);
    A->cuMemFreeHost(buf);   /* may report the sticky fault; the process ends here */
}

/* ---- streams and events --------------------------------------------------------------- */

Test(emu, stream_executes_in_order)
{
    dev_default();
    size_t n = 8 * G;
    kcu_deviceptr va = reserve(n);
    kcu_mem_handle h = create(n);
    map_rw(va, n, h);
    kcu_stream s;
    cr_assert_eq(A->cuStreamCreate(&s, 0), KCU_SUCCESS);
    unsigned char *model = malloc(n), *out = malloc(n);
    memset(model, EMU_POISON, n);
    enum { OPS = 300 };
    static unsigned char srcs[OPS][4096];
    unsigned seed = 12345;
    for (int i = 0; i < OPS; i++) {
        seed = seed * 1103515245 + 12345;
        size_t off = (seed >> 8) % (n - 4096), len = 1 + (seed >> 4) % 4096;
        if (i % 3 == 0) {
            unsigned char v = (unsigned char)i;
            cr_assert_eq(A->cuMemsetD8Async(va + off, v, len, s), KCU_SUCCESS);
            memset(model + off, v, len);
        } else if (i % 3 == 1) {
            memset(srcs[i], (int)(i * 7), sizeof srcs[i]);
            srcs[i][0] = (unsigned char)(i >> 1);
            cr_assert_eq(A->cuMemcpyHtoDAsync(va + off, srcs[i], len, s), KCU_SUCCESS);
            memcpy(model + off, srcs[i], len);
        } else {
            size_t from = (seed >> 12) % (n - len);
            cr_assert_eq(A->cuMemcpyDtoDAsync(va + off, va + from, len, s), KCU_SUCCESS);
            memmove(model + off, model + from, len);
        }
    }
    cr_assert_eq(A->cuMemcpyDtoHAsync(out, va, n, s), KCU_SUCCESS);
    cr_assert_eq(A->cuStreamSynchronize(s), KCU_SUCCESS);
    cr_expect_eq(A->cuStreamQuery(s), KCU_SUCCESS);
    cr_expect_eq(memcmp(out, model, n), 0, "stream order was not respected");
    free(model);
    free(out);
    cr_expect_eq(A->cuStreamDestroy(s), KCU_SUCCESS);
    cr_expect_eq(A->cuStreamDestroy(s), KCU_ERROR_INVALID_HANDLE);
    cr_expect_eq(A->cuMemUnmap(va, n), KCU_SUCCESS);
    cr_expect_eq(A->cuMemRelease(h), KCU_SUCCESS);
    cr_expect_eq(A->cuMemAddressFree(va, n), KCU_SUCCESS);
    cr_expect_eq(dev_down(), 0);
}

Test(emu, event_pending_then_complete)
{
    dev_default();
    kcu_deviceptr va = mapped_window(KCU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    kcu_stream s;
    kcu_event e;
    cr_assert_eq(A->cuStreamCreate(&s, 0), KCU_SUCCESS);
    cr_assert_eq(A->cuEventCreate(&e, KCU_EVENT_DISABLE_TIMING), KCU_SUCCESS);
    cr_expect_eq(A->cuEventQuery(e), KCU_SUCCESS, "never recorded");
    cr_assert_eq(emu_stream_set_paused(s, 1), 0);
    static unsigned char big[G];
    cr_assert_eq(A->cuMemcpyHtoDAsync(va, big, G, s), KCU_SUCCESS);
    cr_assert_eq(A->cuEventRecord(e, s), KCU_SUCCESS);
    usleep(20000);
    cr_expect_eq(A->cuEventQuery(e), KCU_ERROR_NOT_READY, "completed before reached");
    cr_expect_eq(A->cuStreamQuery(s), KCU_ERROR_NOT_READY);
    cr_expect_eq(counters().copied_htod, 0);
    cr_assert_eq(emu_stream_set_paused(s, 0), 0);
    cr_expect_eq(A->cuEventSynchronize(e), KCU_SUCCESS);
    cr_expect_eq(A->cuEventQuery(e), KCU_SUCCESS);
    cr_expect_eq(counters().copied_htod, G, "the copy before the event ran");
    /* Re-recording: the query follows the latest record. */
    cr_assert_eq(emu_stream_set_paused(s, 1), 0);
    cr_assert_eq(A->cuEventRecord(e, s), KCU_SUCCESS);
    cr_expect_eq(A->cuEventQuery(e), KCU_ERROR_NOT_READY);
    cr_assert_eq(emu_stream_set_paused(s, 0), 0);
    cr_expect_eq(A->cuStreamSynchronize(s), KCU_SUCCESS);
    cr_expect_eq(A->cuEventQuery(e), KCU_SUCCESS);
    /* Record on the legacy stream completes at once. */
    cr_expect_eq(A->cuEventRecord(e, NULL), KCU_SUCCESS);
    cr_expect_eq(A->cuStreamSynchronize(NULL), KCU_SUCCESS);
    cr_expect_eq(A->cuEventQuery(e), KCU_SUCCESS);
    cr_expect_eq(A->cuEventDestroy(e), KCU_SUCCESS);
    cr_expect_eq(A->cuEventQuery(e), KCU_ERROR_INVALID_HANDLE);
    cr_expect_eq(A->cuStreamDestroy(s), KCU_SUCCESS);
}

Test(emu, event_completes_with_a_large_copy)
{
    /* Without the pause hook: a 32 MiB copy keeps the worker observably busy. */
    dev_up(64 * MiB, G, 0, 0);
    size_t n = 32 * MiB;
    kcu_deviceptr va = reserve(n);
    kcu_mem_handle h = create(n);
    map_rw(va, n, h);
    unsigned char *buf = malloc(n);
    memset(buf, 0x42, n);
    kcu_stream s;
    kcu_event e;
    cr_assert_eq(A->cuStreamCreate(&s, 0), KCU_SUCCESS);
    cr_assert_eq(A->cuEventCreate(&e, 0), KCU_SUCCESS);
    cr_assert_eq(A->cuMemcpyHtoDAsync(va, buf, n, s), KCU_SUCCESS);
    cr_assert_eq(A->cuEventRecord(e, s), KCU_SUCCESS);
    kcu_result q = A->cuEventQuery(e);
    cr_expect(q == KCU_ERROR_NOT_READY || q == KCU_SUCCESS);
    cr_expect_eq(A->cuEventSynchronize(e), KCU_SUCCESS);
    cr_expect_eq(counters().copied_htod, n);
    cr_expect_eq(((volatile unsigned char *)(uintptr_t)va)[n - 1], 0x42);
    free(buf);
    cr_expect_eq(A->cuEventDestroy(e), KCU_SUCCESS);
    cr_expect_eq(A->cuStreamDestroy(s), KCU_SUCCESS);
}

Test(emu, cross_stream_wait_event)
{
    dev_default();
    kcu_deviceptr va = mapped_window(KCU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    kcu_stream s1, s2;
    kcu_event e;
    cr_assert_eq(A->cuStreamCreate(&s1, KCU_STREAM_NON_BLOCKING), KCU_SUCCESS);
    cr_assert_eq(A->cuStreamCreate(&s2, KCU_STREAM_NON_BLOCKING), KCU_SUCCESS);
    cr_assert_eq(A->cuEventCreate(&e, 0), KCU_SUCCESS);
    cr_assert_eq(emu_stream_set_paused(s1, 1), 0);
    static char msg[] = "written on s1";
    char *out;                                   /* pinned: the DtoH copy stays async */
    cr_assert_eq(A->cuMemAllocHost((void **)&out, sizeof msg), KCU_SUCCESS);
    memset(out, 0, sizeof msg);
    cr_assert_eq(A->cuMemcpyHtoDAsync(va, msg, sizeof msg, s1), KCU_SUCCESS);
    cr_assert_eq(A->cuEventRecord(e, s1), KCU_SUCCESS);
    cr_assert_eq(A->cuStreamWaitEvent(s2, e, 1), KCU_ERROR_INVALID_VALUE, "flags");
    cr_assert_eq(A->cuStreamWaitEvent(s2, e, 0), KCU_SUCCESS);
    cr_assert_eq(A->cuMemcpyDtoHAsync(out, va, sizeof msg, s2), KCU_SUCCESS);
    usleep(30000);
    cr_expect_eq(A->cuStreamQuery(s2), KCU_ERROR_NOT_READY, "s2 ran past the wait");
    cr_expect_eq(out[0], 0);
    cr_assert_eq(emu_stream_set_paused(s1, 0), 0);
    cr_expect_eq(A->cuStreamSynchronize(s2), KCU_SUCCESS);
    cr_expect_str_eq(out, msg);
    cr_expect_eq(A->cuMemFreeHost(out), KCU_SUCCESS);
    /* An event never recorded is no dependency. */
    kcu_event e2;
    cr_assert_eq(A->cuEventCreate(&e2, 0), KCU_SUCCESS);
    cr_expect_eq(A->cuStreamWaitEvent(s2, e2, 0), KCU_SUCCESS);
    cr_expect_eq(A->cuStreamSynchronize(s2), KCU_SUCCESS);
    cr_expect_eq(counters().streams, 2);
    cr_expect_eq(counters().events, 2);
    cr_expect_eq(A->cuEventDestroy(e), KCU_SUCCESS);
    cr_expect_eq(A->cuEventDestroy(e2), KCU_SUCCESS);
    cr_expect_eq(A->cuStreamDestroy(s1), KCU_SUCCESS);
    cr_expect_eq(A->cuStreamDestroy(s2), KCU_SUCCESS);
    cr_expect_eq(counters().streams, 0);
    cr_expect_eq(counters().events, 0);
}

Test(emu, legacy_stream_waits_for_blocking_streams)
{
    dev_default();
    kcu_deviceptr va = mapped_window(KCU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    kcu_stream s;
    cr_assert_eq(A->cuStreamCreate(&s, 0), KCU_SUCCESS);
    static unsigned char big[G];
    memset(big, 0x77, sizeof big);
    cr_assert_eq(A->cuMemcpyHtoDAsync(va, big, G, s), KCU_SUCCESS);
    unsigned char x = 0;
    cr_assert_eq(A->cuMemcpyDtoHAsync(&x, va + G - 1, 1, NULL), KCU_SUCCESS);
    cr_assert_eq(A->cuStreamSynchronize(NULL), KCU_SUCCESS);   /* legacy: asynchronous */
    cr_expect_eq(x, 0x77, "the legacy stream ran before earlier blocking-stream work");
    cr_expect_eq(A->cuStreamQuery(s), KCU_SUCCESS);
    cr_expect_eq(A->cuStreamDestroy(s), KCU_SUCCESS);
}

Test(emu, stream_and_event_argument_rules)
{
    dev_default();
    kcu_stream s;
    kcu_event e;
    int st = -1;
    cr_expect_eq(A->cuStreamCreate(&s, 4), KCU_ERROR_INVALID_VALUE);
    cr_expect_eq(A->cuEventCreate(&e, 16), KCU_ERROR_INVALID_VALUE);
    cr_assert_eq(A->cuStreamCreate(&s, 0), KCU_SUCCESS);
    cr_expect_eq(A->cuStreamIsCapturing(s, &st), KCU_SUCCESS);
    cr_expect_eq(st, KCU_STREAM_CAPTURE_STATUS_NONE);
    cr_expect_eq(emu_stream_set_capturing(s, 1), 0);
    cr_expect_eq(A->cuStreamIsCapturing(s, &st), KCU_SUCCESS);
    cr_expect_eq(st, KCU_STREAM_CAPTURE_STATUS_ACTIVE);
    /* cuda.h, cuStreamIsCapturing: the legacy stream while a blocking stream captures */
    cr_expect_eq(A->cuStreamIsCapturing(NULL, &st), KCU_ERROR_STREAM_CAPTURE_IMPLICIT);
    cr_expect_eq(emu_stream_set_capturing(s, 0), 0);
    cr_expect_eq(A->cuStreamIsCapturing(NULL, &st), KCU_SUCCESS);
    cr_expect_eq(st, KCU_STREAM_CAPTURE_STATUS_NONE);
    cr_expect_eq(emu_stream_set_capturing((kcu_stream)&st, 1), -EINVAL);
    cr_expect_eq(A->cuStreamSynchronize((kcu_stream)&st), KCU_ERROR_INVALID_HANDLE);
    cr_expect_eq(A->cuEventQuery((kcu_event)&st), KCU_ERROR_INVALID_HANDLE);
    cr_expect_eq(A->cuStreamDestroy(NULL), KCU_ERROR_INVALID_HANDLE);
    cr_expect_eq(A->cuStreamSynchronize(NULL), KCU_SUCCESS);
    cr_expect_eq(A->cuCtxSynchronize(), KCU_SUCCESS);
    cr_expect_eq(A->cuStreamDestroy(s), KCU_SUCCESS);
    cr_expect_eq(dev_down(), 0);
}

/* The CUDA programming guide (stream capture, "Prohibited and Unhandled Operations"): it is
   invalid to synchronize a context while any of its streams captures, in any capture mode
   (a relaxed thread too), and the capture is invalidated; a non-blocking stream's capture
   leaves the legacy stream usable. */
Test(emu, ctx_synchronize_during_capture_invalidates_it)
{
    dev_default();
    kcu_stream s;
    int st = -1;
    cr_assert_eq(A->cuStreamCreate(&s, KCU_STREAM_NON_BLOCKING), KCU_SUCCESS);
    int mode = KCU_STREAM_CAPTURE_MODE_RELAXED;
    cr_assert_eq(A->cuThreadExchangeStreamCaptureMode(&mode), KCU_SUCCESS);
    for (int relaxed = 1; relaxed >= 0; relaxed--) {
        if (!relaxed) {             /* back to the thread's own mode */
            cr_assert_eq(A->cuThreadExchangeStreamCaptureMode(&mode), KCU_SUCCESS);
        }
        cr_expect_eq(emu_stream_set_capturing(s, 1), 0);
        cr_expect_eq(A->cuStreamIsCapturing(NULL, &st), KCU_SUCCESS, "non-blocking capture");
        cr_expect_eq(A->cuCtxSynchronize(), KCU_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                     "relaxed %d: cuCtxSynchronize during a capture", relaxed);
        cr_expect_eq(A->cuStreamIsCapturing(s, &st), KCU_SUCCESS);
        cr_expect_eq(st, KCU_STREAM_CAPTURE_STATUS_INVALIDATED, "relaxed %d", relaxed);
        cr_expect_eq(emu_stream_set_capturing(s, 0), 0);
        cr_expect_eq(A->cuCtxSynchronize(), KCU_SUCCESS);
    }
    cr_expect_eq(A->cuStreamDestroy(s), KCU_SUCCESS);
    cr_expect_eq(dev_down(), 0);
}

/* ---- host memory ---------------------------------------------------------------------- */

Test(emu, host_memory)
{
    dev_default();
    void *p = NULL;
    cr_expect_eq(A->cuMemAllocHost(&p, 0), KCU_ERROR_INVALID_VALUE);
    cr_assert_eq(A->cuMemAllocHost(&p, 3 * 4096), KCU_SUCCESS);
    memset(p, 1, 3 * 4096);
    cr_expect_eq(A->cuMemHostRegister(p, 4096, 0), KCU_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    size_t n = 16 * 4096;
    unsigned char *buf = aligned_alloc(4096, n);
    cr_assert_eq(A->cuMemHostRegister(buf, n, KCU_MEMHOSTREGISTER_PORTABLE), KCU_SUCCESS);
    cr_expect_eq(A->cuMemHostRegister(buf + 4096, 4096, 0),
                 KCU_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    cr_expect_eq(A->cuMemHostRegister(buf, n, 0x100), KCU_ERROR_INVALID_VALUE);
    struct emu_counters c = counters();
    cr_expect_eq(c.host_allocs, 1);
    cr_expect_eq(c.host_alloc_bytes, 3 * 4096);
    cr_expect_eq(c.host_registered, 1);
    cr_expect_eq(c.host_registered_bytes, n);
    cr_expect_eq(A->cuMemHostUnregister(buf + 4096), KCU_ERROR_HOST_MEMORY_NOT_REGISTERED);
    cr_expect_eq(A->cuMemHostUnregister(p), KCU_ERROR_HOST_MEMORY_NOT_REGISTERED);
    cr_expect_eq(A->cuMemHostUnregister(buf), KCU_SUCCESS);
    cr_expect_eq(A->cuMemHostUnregister(buf), KCU_ERROR_HOST_MEMORY_NOT_REGISTERED);
    cr_expect_eq(A->cuMemFreeHost(buf), KCU_ERROR_INVALID_VALUE);
    cr_expect_eq(A->cuMemFreeHost(p), KCU_SUCCESS);
    c = counters();
    cr_expect_eq(c.host_allocs + c.host_registered + c.host_alloc_bytes +
                 c.host_registered_bytes, 0);
    free(buf);
    cr_expect_eq(dev_down(), 0);
}

static char warned[1024];
static int n_warned;
static void capture_warn(int level, const char *msg, void *arg)
{
    (void)arg;
    if (level == KVVM_LOG_WARN && strstr(msg, "RLIMIT_MEMLOCK")) {
        snprintf(warned, sizeof warned, "%s", msg);
        n_warned++;
    }
}

Test(emu, pinned_memory_warns_once_when_memlock_is_low)
{
    struct rlimit rl = { .rlim_cur = 4096, .rlim_max = 4096 };
    cr_assert_eq(setrlimit(RLIMIT_MEMLOCK, &rl), 0);
    /* As root, CAP_IPC_LOCK bypasses the limit: drop it from the effective set. */
    struct __user_cap_header_struct hdr = { _LINUX_CAPABILITY_VERSION_3, 0 };
    struct __user_cap_data_struct cap[2];
    if (syscall(SYS_capget, &hdr, cap) == 0) {
        cap[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
        syscall(SYS_capset, &hdr, cap);
    }
    static char probe[4 * 4096] __attribute__((aligned(4096)));
    if (mlock(probe, sizeof probe) == 0)
        cr_skip_test("mlock ignores RLIMIT_MEMLOCK here (CAP_IPC_LOCK cannot be dropped)");
    kvvm_set_log(capture_warn, NULL, KVVM_LOG_WARN);
    dev_default();
    void *p, *q;
    cr_assert_eq(A->cuMemAllocHost(&p, 1 * MiB), KCU_SUCCESS, "pinning is best effort");
    cr_assert_eq(A->cuMemAllocHost(&q, 1 * MiB), KCU_SUCCESS);
    cr_expect_eq(n_warned, 1, "warned %d times", n_warned);
    cr_expect(strstr(warned, "4096 bytes") != NULL, "the limit is not named: %s", warned);
    memset(p, 1, MiB);
    cr_expect_eq(A->cuMemFreeHost(p), KCU_SUCCESS);
    cr_expect_eq(A->cuMemFreeHost(q), KCU_SUCCESS);
    cr_expect_eq(dev_down(), 0);
}

/* ---- error strings -------------------------------------------------------------------- */

Test(emu, error_strings)
{
    A = emu_api();
    static const kcu_result codes[] = {
        KCU_SUCCESS, KCU_ERROR_INVALID_VALUE, KCU_ERROR_OUT_OF_MEMORY,
        KCU_ERROR_NOT_INITIALIZED, KCU_ERROR_DEINITIALIZED, KCU_ERROR_NO_DEVICE,
        KCU_ERROR_INVALID_DEVICE, KCU_ERROR_INVALID_CONTEXT, KCU_ERROR_ALREADY_MAPPED,
        KCU_ERROR_NOT_MAPPED, KCU_ERROR_INVALID_HANDLE, KCU_ERROR_NOT_FOUND,
        KCU_ERROR_NOT_READY, KCU_ERROR_ILLEGAL_ADDRESS,
        KCU_ERROR_HOST_MEMORY_ALREADY_REGISTERED, KCU_ERROR_HOST_MEMORY_NOT_REGISTERED,
        KCU_ERROR_NOT_PERMITTED, KCU_ERROR_NOT_SUPPORTED,
        KCU_ERROR_STREAM_CAPTURE_UNSUPPORTED, KCU_ERROR_UNKNOWN,
#ifdef KCU_ERROR_STUB_LIBRARY
        KCU_ERROR_STUB_LIBRARY,
#endif
#ifdef KCU_ERROR_LAUNCH_FAILED
        KCU_ERROR_ECC_UNCORRECTABLE, KCU_ERROR_LAUNCH_TIMEOUT, KCU_ERROR_HARDWARE_STACK_ERROR,
        KCU_ERROR_ILLEGAL_INSTRUCTION, KCU_ERROR_MISALIGNED_ADDRESS,
        KCU_ERROR_INVALID_ADDRESS_SPACE, KCU_ERROR_INVALID_PC, KCU_ERROR_LAUNCH_FAILED,
#endif
    };
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        const char *name = NULL, *str = NULL;
        cr_expect_eq(A->cuGetErrorName(codes[i], &name), KCU_SUCCESS);
        cr_expect_eq(A->cuGetErrorString(codes[i], &str), KCU_SUCCESS);
        cr_expect(name && !strncmp(name, "CUDA_", 5), "code %d", codes[i]);
        cr_expect(str && *str);
    }
    const char *name;
    cr_expect_eq(A->cuGetErrorName(12345, &name), KCU_ERROR_INVALID_VALUE);
    cr_expect_eq(A->cuGetErrorString(12345, &name), KCU_ERROR_INVALID_VALUE);
    cr_expect_eq(A->cuGetErrorName(KCU_ERROR_ILLEGAL_ADDRESS, &name), KCU_SUCCESS);
    cr_expect_str_eq(name, "CUDA_ERROR_ILLEGAL_ADDRESS");
}

/* ---- mapping-count bound --------------------------------------------------------------- */

static char logged[1024];
static void capture(int level, const char *msg, void *arg)
{
    (void)arg;
    if (level == KVVM_LOG_ERROR)
        snprintf(logged, sizeof logged, "%s", msg);
}

Test(emu, mapping_count_exhaustion)
{
    kvvm_set_log(capture, NULL, KVVM_LOG_WARN);
    dev_up(16 * MiB, G, 0, 4);
    kcu_deviceptr va = reserve(8 * G);
    kcu_mem_handle h = create(G);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(A->cuMemMap(va + i * G, G, 0, h, 0), KCU_SUCCESS);
    cr_expect_eq(A->cuMemMap(va + 4 * G, G, 0, h, 0), KCU_ERROR_OUT_OF_MEMORY);
    cr_expect(strstr(logged, "mappings") != NULL, "no clear message: '%s'", logged);
    cr_expect_eq(counters().mappings, 4);
    cr_assert_eq(A->cuMemUnmap(va + 2 * G, G), KCU_SUCCESS);
    cr_expect_eq(A->cuMemMap(va + 4 * G, G, 0, h, 0), KCU_SUCCESS, "a freed slot is reusable");
}

Test(emu, mapping_bound_from_environment)
{
    setenv("KVVM_EMU_MAX_MAPS", "2", 1);
    dev_default();
    kcu_deviceptr va = reserve(4 * G);
    kcu_mem_handle h = create(G);
    cr_assert_eq(A->cuMemMap(va, G, 0, h, 0), KCU_SUCCESS);
    cr_assert_eq(A->cuMemMap(va + G, G, 0, h, 0), KCU_SUCCESS);
    cr_expect_eq(A->cuMemMap(va + 2 * G, G, 0, h, 0), KCU_ERROR_OUT_OF_MEMORY);
}

Test(emu, default_mapping_bound_is_below_max_map_count)
{
    /* Map many single granules; the default bound must hold them without mmap failing.
       4096 mappings of one 4 KiB granule, every other granule, so no two VMAs merge. */
    unsetenv("KVVM_EMU_MAX_MAPS");
    dev_up(64 * MiB, 4096, 0, 0);
    size_t n = 4096;
    kcu_deviceptr va = 0;
    cr_assert_eq(A->cuMemAddressReserve(&va, 2 * n * 4096, 0, 0, 0), KCU_SUCCESS);
    struct kcu_mem_alloc_prop p = prop_of(ord);
    kcu_mem_handle h;
    cr_assert_eq(A->cuMemCreate(&h, 4096, &p, 0), KCU_SUCCESS);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(A->cuMemMap(va + 2 * i * 4096, 4096, 0, h, 0), KCU_SUCCESS, "map %zu", i);
    cr_expect_eq(counters().mappings, n);
    cr_expect_eq((size_t)dev_down(), n + 2, "mappings, handle and reservation reported");
}

/* ---- fault injection and tracing ------------------------------------------------------- */

Test(emu, fault_injection_nth_call)
{
    dev_default();
    kcu_deviceptr va = reserve(4 * G);
    kcu_mem_handle h = create(G);
    cr_expect_eq(emu_fail_arm("cuNoSuchCall", 1, KCU_ERROR_OUT_OF_MEMORY), -EINVAL);
    cr_expect_eq(emu_fail_arm("cuMemMap", 0, KCU_ERROR_OUT_OF_MEMORY), -EINVAL);
    cr_assert_eq(emu_fail_arm("cuMemMap", 2, KCU_ERROR_OUT_OF_MEMORY), 0);
    cr_assert_eq(A->cuMemMap(va, G, 0, h, 0), KCU_SUCCESS);
    struct emu_counters before = counters();
    cr_expect_eq(A->cuMemMap(va + G, G, 0, h, 0), KCU_ERROR_OUT_OF_MEMORY, "2nd call fails");
    struct emu_counters after = counters();
    cr_expect_eq(memcmp(&before, &after, sizeof before), 0, "an injected failure changed state");
    cr_expect_eq(emu_lookup(va + G, NULL, NULL, NULL), -ENOENT);
    cr_expect_eq(A->cuMemMap(va + G, G, 0, h, 0), KCU_SUCCESS, "fires once");
    /* An injected failure even bypasses argument checks, and clear disarms. */
    cr_assert_eq(emu_fail_arm("cuMemCreate", 1, KCU_ERROR_INVALID_DEVICE), 0);
    cr_assert_eq(emu_fail_arm("cuStreamCreate", 1, KCU_ERROR_UNKNOWN), 0);
    struct kcu_mem_alloc_prop p = prop_of(ord);
    kcu_mem_handle x;
    cr_expect_eq(A->cuMemCreate(&x, G, &p, 0), KCU_ERROR_INVALID_DEVICE);
    emu_fail_clear();
    kcu_stream s;
    cr_expect_eq(A->cuStreamCreate(&s, 0), KCU_SUCCESS);
    cr_expect_eq(A->cuStreamDestroy(s), KCU_SUCCESS);
    cr_expect_eq(counters().handles, 1);
}

Test(emu, fault_injection_from_environment)
{
    kvvm_set_log(capture, NULL, KVVM_LOG_WARN);
    setenv("KVVM_EMU_FAIL", "cuMemCreate:2:2,cuBogus:1:1,cuMemMap:x:1,cuMemAddressReserve:1:999",
           1);
    dev_default();
    cr_expect(strstr(logged, "KVVM_EMU_FAIL") != NULL, "malformed items not logged");
    kcu_deviceptr va;
    cr_expect_eq(A->cuMemAddressReserve(&va, G, 0, 0, 0), KCU_ERROR_UNKNOWN);
    struct kcu_mem_alloc_prop p = prop_of(ord);
    kcu_mem_handle h;
    cr_expect_eq(A->cuMemCreate(&h, G, &p, 0), KCU_SUCCESS);
    cr_expect_eq(A->cuMemCreate(&h, G, &p, 0), KCU_ERROR_OUT_OF_MEMORY);
    cr_expect_eq(A->cuMemCreate(&h, G, &p, 0), KCU_SUCCESS);
    cr_expect_eq(counters().handles, 2);
}

Test(emu, tracing_records_calls)
{
    dev_default();
    emu_trace_start();
    kcu_deviceptr va = reserve(2 * G);
    kcu_mem_handle h = create(G);
    map_rw(va, G, h);
    cr_assert_eq(A->cuMemMap(va + G, G, 0, h, 0), KCU_SUCCESS);
    struct emu_trace_entry t[16];
    size_t n = emu_trace_stop(t, 16);
    cr_assert_eq(n, 5);
    const char *want[] = { "cuMemAddressReserve", "cuMemCreate", "cuMemMap", "cuMemSetAccess",
                           "cuMemMap" };
    unsigned long nth[] = { 1, 1, 1, 1, 2 };
    for (size_t i = 0; i < n; i++) {
        cr_expect_str_eq(t[i].entry, want[i]);
        cr_expect_eq(t[i].nth, nth[i], "call %zu", i);
    }
    cr_expect_eq(emu_trace_stop(t, 16), 0, "tracing is off after stop");
    /* The trace drives injection: fail the 2nd cuMemMap of the same sequence. */
    cr_assert_eq(emu_fail_arm(t[4].entry, t[4].nth, KCU_ERROR_OUT_OF_MEMORY), 0);
    kcu_deviceptr vb = reserve(2 * G);
    cr_expect_eq(A->cuMemMap(vb, G, 0, h, 0), KCU_SUCCESS);
    cr_expect_eq(A->cuMemMap(vb + G, G, 0, h, 0), KCU_ERROR_OUT_OF_MEMORY);
}

/* ---- counters and teardown ------------------------------------------------------------- */

Test(emu, counters_track_everything)
{
    dev_default();
    kcu_deviceptr va = reserve(4 * G);
    kcu_mem_handle h = create(2 * G);
    map_rw(va, 2 * G, h);
    kcu_stream s;
    kcu_event e;
    cr_assert_eq(A->cuStreamCreate(&s, 0), KCU_SUCCESS);
    cr_assert_eq(A->cuEventCreate(&e, 0), KCU_SUCCESS);
    static unsigned char buf[2 * G];
    cr_assert_eq(A->cuMemcpyHtoDAsync(va, buf, 1000, s), KCU_SUCCESS);
    cr_assert_eq(A->cuMemcpyDtoHAsync(buf, va, 300, s), KCU_SUCCESS);
    cr_assert_eq(A->cuMemcpyDtoDAsync(va + G, va, 77, s), KCU_SUCCESS);
    cr_assert_eq(A->cuMemsetD8Async(va, 0, 5, s), KCU_SUCCESS);
    cr_assert_eq(A->cuStreamSynchronize(s), KCU_SUCCESS);
    struct emu_counters c = counters();
    cr_expect_eq(c.handles, 1);
    cr_expect_eq(c.handle_bytes, 2 * G);
    cr_expect_eq(c.mappings, 1);
    cr_expect_eq(c.mapped_bytes, 2 * G);
    cr_expect_eq(c.reservations, 1);
    cr_expect_eq(c.reserved_bytes, 4 * G);
    cr_expect_eq(c.streams, 1);
    cr_expect_eq(c.events, 1);
    cr_expect_eq(c.copied_htod, 1000);
    cr_expect_eq(c.copied_dtoh, 300);
    cr_expect_eq(c.copied_dtod, 77);
    cr_expect_eq(c.memset_bytes, 5);
    cr_expect_eq(c.creates, 1);
    cr_expect_eq(c.maps, 1);
    cr_expect_eq(c.set_access, 1);
    cr_expect_eq(A->cuEventDestroy(e), KCU_SUCCESS);
    cr_expect_eq(A->cuStreamDestroy(s), KCU_SUCCESS);
    cr_expect_eq(A->cuMemUnmap(va, 2 * G), KCU_SUCCESS);
    cr_expect_eq(A->cuMemRelease(h), KCU_SUCCESS);
    cr_expect_eq(A->cuMemAddressFree(va, 4 * G), KCU_SUCCESS);
    c = counters();
    cr_expect_eq(c.handles + c.mappings + c.reservations + c.streams + c.events, 0);
    cr_expect_eq(c.handle_bytes + c.mapped_bytes + c.reserved_bytes, 0);
    cr_expect_eq(dev_down(), 0, "clean teardown reports no leak");
}

Test(emu, destroy_reports_and_frees_leaks)
{
    dev_default();
    kcu_deviceptr va = reserve(2 * G);
    kcu_mem_handle h = create(G);
    map_rw(va, G, h);
    (void)create(G);
    kcu_stream s;
    kcu_event e;
    void *hp;
    cr_assert_eq(A->cuStreamCreate(&s, 0), KCU_SUCCESS);
    cr_assert_eq(emu_stream_set_paused(s, 1), 0);
    cr_assert_eq(A->cuEventCreate(&e, 0), KCU_SUCCESS);
    cr_assert_eq(A->cuEventRecord(e, s), KCU_SUCCESS);
    cr_assert_eq(A->cuMemAllocHost(&hp, 4096), KCU_SUCCESS);
    /* stream, event, mapping, reservation, 2 handles, host alloc */
    cr_expect_eq(dev_down(), 7);
    cr_expect_eq(emu_counters_get(ord, &(struct emu_counters){ 0 }), -ENODEV);
    /* A new device (same ordinal slot) starts clean. */
    dev_default();
    cr_expect_eq(counters().handles, 0);
    cr_expect_eq(dev_down(), 0);
}

Test(emu, destroy_with_context_retained_counts_it)
{
    dev_default();
    cr_expect_eq(emu_device_destroy(ord), 1, "the retained primary context is a leak");
    kcu_deviceptr va;
    cr_expect_eq(A->cuMemAddressReserve(&va, G, 0, 0, 0), KCU_ERROR_INVALID_CONTEXT,
                 "the thread's current context died with the device");
    cr_expect_eq(A->cuCtxSetCurrent(ctx), KCU_ERROR_INVALID_CONTEXT);
}

Test(emu, destroy_with_one_leaked_handle)
{
    dev_default();
    (void)create(G);
    cr_expect_eq(dev_down(), 1);
}

/* ---- pageable host memory: no more than the driver documents ------------------------- */
/* CUDA Driver API, "API synchronization behavior" (Async): "For transfers between device
   memory and pageable host memory, the function might be synchronous with respect to
   host": neither staging at the call nor a filled destination at return is promised, so
   the emulator does neither (a caller relying on it is wrong on a GPU). */

Test(emu, pageable_source_is_read_when_the_stream_runs)
{
    dev_default();
    kcu_deviceptr va = mapped_window(KCU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    kcu_stream s;
    cr_assert_eq(A->cuStreamCreate(&s, KCU_STREAM_NON_BLOCKING), KCU_SUCCESS);
    cr_assert_eq(emu_stream_set_paused(s, 1), 0);
    char src[32] = "written before the call";
    cr_assert_eq(A->cuMemcpyHtoDAsync(va, src, sizeof src, s), KCU_SUCCESS);
    strcpy(src, "reused after the call");    /* a caller that did not wait: wrong bytes */
    cr_expect_eq(A->cuStreamQuery(s), KCU_ERROR_NOT_READY, "the copy ran while paused");
    cr_assert_eq(emu_stream_set_paused(s, 0), 0);
    char out[32] = { 0 };
    cr_assert_eq(A->cuMemcpyDtoHAsync(out, va, sizeof out, s), KCU_SUCCESS);
    cr_assert_eq(A->cuStreamSynchronize(s), KCU_SUCCESS);
    cr_expect_str_eq(out, "reused after the call", "a pageable source was staged at the call");
    cr_expect_eq(A->cuStreamDestroy(s), KCU_SUCCESS);
}

Test(emu, pageable_destination_is_filled_when_the_stream_runs)
{
    dev_default();
    kcu_deviceptr va = mapped_window(KCU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    kcu_stream s;
    cr_assert_eq(A->cuStreamCreate(&s, KCU_STREAM_NON_BLOCKING), KCU_SUCCESS);
    static const char msg[] = "filled when the stream runs";
    cr_assert_eq(A->cuMemcpyHtoDAsync(va, msg, sizeof msg, s), KCU_SUCCESS);
    char out[sizeof msg] = { 0 };
    cr_assert_eq(emu_stream_set_paused(s, 1), 0);
    cr_assert_eq(A->cuMemcpyDtoHAsync(out, va, sizeof out, s), KCU_SUCCESS);
    cr_expect_eq(out[0], 0, "a pageable destination was filled at the call");
    cr_assert_eq(emu_stream_set_paused(s, 0), 0);
    cr_assert_eq(A->cuStreamSynchronize(s), KCU_SUCCESS);
    cr_expect_str_eq(out, msg);
    cr_expect_eq(A->cuStreamDestroy(s), KCU_SUCCESS);
}

/* cuPointerGetAttribute(MEMORY_TYPE): pinned HOST, mapped DEVICE, pageable INVALID_VALUE
   (cuda.h: "not allocated by, mapped by, or registered with a CUcontext"). */
Test(emu, pointer_memory_type)
{
    dev_default();
    kcu_deviceptr va = mapped_window(KCU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    char *pin, pageable[16];
    unsigned t = 0;
    cr_assert_eq(A->cuMemAllocHost((void **)&pin, 4096), KCU_SUCCESS);
    cr_expect_eq(A->cuPointerGetAttribute(&t, KCU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                          (kcu_deviceptr)(uintptr_t)(pin + 4095)), KCU_SUCCESS);
    cr_expect_eq(t, KCU_MEMORYTYPE_HOST);
    cr_expect_eq(A->cuPointerGetAttribute(&t, KCU_POINTER_ATTRIBUTE_MEMORY_TYPE, va),
                 KCU_SUCCESS);
    cr_expect_eq(t, KCU_MEMORYTYPE_DEVICE);
    cr_expect_eq(A->cuPointerGetAttribute(&t, KCU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                          (kcu_deviceptr)(uintptr_t)pageable),
                 KCU_ERROR_INVALID_VALUE);
    cr_expect_eq(A->cuMemFreeHost(pin), KCU_SUCCESS);
}

/* Regression (issue 9, item 18): a device address passed as the host side of a copy worked
   on the emulator (its windows are host mappings) and fails on a GPU; now it fails here. */
Test(emu, host_pointer_inside_a_reservation_is_invalid_value)
{
    dev_default();
    kcu_deviceptr va = mapped_window(KCU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    kcu_stream s;
    cr_assert_eq(A->cuStreamCreate(&s, KCU_STREAM_NON_BLOCKING), KCU_SUCCESS);
    void *as_host = (void *)(uintptr_t)(va + 64);
    cr_expect_eq(A->cuMemcpyHtoDAsync(va, as_host, 64, s), KCU_ERROR_INVALID_VALUE);
    cr_expect_eq(A->cuMemcpyDtoHAsync(as_host, va, 64, s), KCU_ERROR_INVALID_VALUE);
    cr_expect_eq(A->cuMemcpyHtoDAsync(va, as_host, 64, NULL), KCU_ERROR_INVALID_VALUE);
    cr_assert_eq(A->cuStreamSynchronize(s), KCU_SUCCESS);
    cr_expect_eq(A->cuStreamDestroy(s), KCU_SUCCESS);
}

/* ---- graph capture (cuda.h, cuThreadExchangeStreamCaptureMode) --------------------------- */

struct cap_arg { kcu_context ctx; kcu_event ev; int mode; kcu_result r; };

static void *cap_query(void *p)
{
    struct cap_arg *a = p;
    A->cuCtxSetCurrent(a->ctx);
    int m = a->mode;
    if (A->cuThreadExchangeStreamCaptureMode(&m) != KCU_SUCCESS)
        a->r = -1;
    else
        a->r = A->cuEventQuery(a->ev);
    return NULL;
}

static kcu_result query_from_thread(kcu_event ev, int mode)
{
    struct cap_arg a = { .ev = ev, .mode = mode };
    cr_assert_eq(A->cuCtxGetCurrent(&a.ctx), KCU_SUCCESS);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, cap_query, &a), 0);
    pthread_join(th, NULL);
    return a.r;
}

/* Global mode: another thread's event query during a capture is prohibited and invalidates
   the capture; relaxed mode: allowed, the capture stays valid. Work submitted to the
   capturing stream is captured, not executed; the legacy stream is unusable while a
   blocking stream captures. */
Test(emu, capture_modes_of_other_threads)
{
    dev_default();
    kcu_stream s;
    kcu_event ev;
    int st = -1;
    cr_assert_eq(A->cuStreamCreate(&s, KCU_STREAM_NON_BLOCKING), KCU_SUCCESS);
    cr_assert_eq(A->cuEventCreate(&ev, KCU_EVENT_DISABLE_TIMING), KCU_SUCCESS);
    cr_assert_eq(emu_stream_set_capturing(s, 1), 0);
    cr_expect_eq(query_from_thread(ev, KCU_STREAM_CAPTURE_MODE_RELAXED), KCU_SUCCESS);
    cr_assert_eq(A->cuStreamIsCapturing(s, &st), KCU_SUCCESS);
    cr_expect_eq(st, KCU_STREAM_CAPTURE_STATUS_ACTIVE, "a relaxed query broke the capture");
    cr_expect_eq(query_from_thread(ev, KCU_STREAM_CAPTURE_MODE_THREAD_LOCAL), KCU_SUCCESS);
    cr_expect_eq(query_from_thread(ev, KCU_STREAM_CAPTURE_MODE_GLOBAL),
                 KCU_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    cr_assert_eq(A->cuStreamIsCapturing(s, &st), KCU_SUCCESS);
    cr_expect_eq(st, KCU_STREAM_CAPTURE_STATUS_INVALIDATED);
    /* captured work: counted, not run; its event cannot be queried */
    cr_assert_eq(emu_stream_set_capturing(s, 1), 0);
    uint64_t sub0, sub1, cap;
    cr_assert_eq(emu_stream_counts(s, &sub0, NULL), 0);
    cr_assert_eq(A->cuEventRecord(ev, s), KCU_SUCCESS);
    cr_assert_eq(emu_stream_counts(s, &sub1, &cap), 0);
    cr_expect_eq(sub1, sub0 + 1);
    cr_expect_eq(cap, 1);
    int m = KCU_STREAM_CAPTURE_MODE_RELAXED;
    cr_assert_eq(A->cuThreadExchangeStreamCaptureMode(&m), KCU_SUCCESS);
    cr_expect_eq(m, KCU_STREAM_CAPTURE_MODE_GLOBAL, "the default mode is global");
    cr_expect_eq(A->cuEventQuery(ev), KCU_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    cr_expect_eq(A->cuStreamSynchronize(s), KCU_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    cr_assert_eq(A->cuThreadExchangeStreamCaptureMode(&m), KCU_SUCCESS);
    cr_assert_eq(emu_stream_set_capturing(s, 0), 0);
    /* a blocking stream captures: the legacy stream is unusable */
    kcu_stream b;
    cr_assert_eq(A->cuStreamCreate(&b, KCU_STREAM_DEFAULT), KCU_SUCCESS);
    cr_assert_eq(emu_stream_set_capturing(b, 1), 0);
    cr_expect_eq(A->cuStreamIsCapturing(NULL, &st), KCU_ERROR_STREAM_CAPTURE_IMPLICIT);
    cr_expect_eq(A->cuEventRecord(ev, NULL), KCU_ERROR_STREAM_CAPTURE_IMPLICIT);
    cr_assert_eq(emu_stream_set_capturing(b, 0), 0);
    cr_expect_eq(A->cuEventRecord(ev, NULL), KCU_SUCCESS);
    cr_expect_eq(A->cuEventSynchronize(ev), KCU_SUCCESS);
    m = 7;
    cr_expect_eq(A->cuThreadExchangeStreamCaptureMode(&m), KCU_ERROR_INVALID_VALUE);
    cr_expect_eq(A->cuEventDestroy(ev), KCU_SUCCESS);
    cr_expect_eq(A->cuStreamDestroy(b), KCU_SUCCESS);
    cr_expect_eq(A->cuStreamDestroy(s), KCU_SUCCESS);
}

/* An event recorded inside a capture is a graph node that never runs: a stream outside the
   capture waiting for it crosses the capture boundary (CUDA_ERROR_STREAM_CAPTURE_ISOLATION),
   where the emulator used to queue a wait that never ended. */
Test(emu, wait_for_a_captured_event_is_isolation)
{
    dev_default();
    kcu_stream s, o;
    kcu_event ev;
    cr_assert_eq(A->cuStreamCreate(&s, KCU_STREAM_NON_BLOCKING), KCU_SUCCESS);
    cr_assert_eq(A->cuStreamCreate(&o, KCU_STREAM_NON_BLOCKING), KCU_SUCCESS);
    cr_assert_eq(A->cuEventCreate(&ev, KCU_EVENT_DISABLE_TIMING), KCU_SUCCESS);
    cr_assert_eq(emu_stream_set_capturing(s, 1), 0);
    cr_assert_eq(A->cuEventRecord(ev, s), KCU_SUCCESS);
    cr_expect_eq(A->cuStreamWaitEvent(o, ev, 0), KCU_ERROR_STREAM_CAPTURE_ISOLATION);
    cr_expect_eq(A->cuStreamWaitEvent(s, ev, 0), KCU_SUCCESS, "inside the capture: a node");
    cr_assert_eq(emu_stream_set_capturing(s, 0), 0);
    cr_assert_eq(A->cuEventRecord(ev, s), KCU_SUCCESS);   /* recorded outside: a real wait */
    cr_expect_eq(A->cuStreamWaitEvent(o, ev, 0), KCU_SUCCESS);
    cr_expect_eq(A->cuStreamSynchronize(o), KCU_SUCCESS);
    cr_expect_eq(A->cuEventDestroy(ev), KCU_SUCCESS);
    cr_expect_eq(A->cuStreamDestroy(o), KCU_SUCCESS);
    cr_expect_eq(A->cuStreamDestroy(s), KCU_SUCCESS);
}

/* CU_STREAM_LEGACY and CU_STREAM_PER_THREAD name the default stream, as on the driver
   (engines pass them, e.g. PyTorch's default stream is the legacy one). */
Test(emu, special_default_stream_handles)
{
    dev_default();
    kcu_deviceptr va = mapped_window(KCU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    static const char msg[] = "legacy handle";
    char out[sizeof msg] = { 0 };
    cr_expect_eq(A->cuMemcpyHtoDAsync(va, msg, sizeof msg, KCU_STREAM_LEGACY), KCU_SUCCESS);
    cr_expect_eq(A->cuMemcpyDtoHAsync(out, va, sizeof out, KCU_STREAM_PER_THREAD), KCU_SUCCESS);
    cr_expect_eq(A->cuStreamSynchronize(KCU_STREAM_PER_THREAD), KCU_SUCCESS);
    cr_expect_str_eq(out, msg);
    cr_expect_eq(A->cuStreamSynchronize(KCU_STREAM_LEGACY), KCU_SUCCESS);
    int st = -1;
    cr_expect_eq(A->cuStreamIsCapturing(KCU_STREAM_PER_THREAD, &st), KCU_SUCCESS);
    cr_expect_eq(st, KCU_STREAM_CAPTURE_STATUS_NONE);
    cr_expect_eq(A->cuStreamDestroy(KCU_STREAM_LEGACY), KCU_ERROR_INVALID_HANDLE);
}

/* Regression (issue 9, item 18): cuStreamDestroy waited for the stream's queued work; the
   driver returns at once and drains afterwards (cuda.h, cuStreamDestroy). Here the stream
   is paused with an event record queued: destroy returns, the event is not reached until
   the (destroyed) stream is resumed, and the device's destroy finds nothing leaked. */
Test(emu, stream_destroy_returns_at_once_and_drains_after)
{
    TH_DEADLINE(30);
    dev_default();
    kcu_stream s;
    kcu_event ev;
    cr_assert_eq(A->cuStreamCreate(&s, KCU_STREAM_NON_BLOCKING), KCU_SUCCESS);
    cr_assert_eq(A->cuEventCreate(&ev, KCU_EVENT_DISABLE_TIMING), KCU_SUCCESS);
    cr_assert_eq(emu_stream_set_paused(s, 1), 0);
    cr_assert_eq(A->cuEventRecord(ev, s), KCU_SUCCESS);
    cr_assert_eq(A->cuStreamDestroy(s), KCU_SUCCESS);
    cr_expect_eq(A->cuEventQuery(ev), KCU_ERROR_NOT_READY,
                 "cuStreamDestroy waited for the stream's work");
    cr_expect_eq(counters().streams, 0, "a destroyed stream still counted");
    cr_expect_eq(A->cuStreamSynchronize(s), KCU_ERROR_INVALID_HANDLE);
    cr_assert_eq(emu_stream_set_paused(s, 0), 0);
    cr_expect_eq(A->cuEventSynchronize(ev), KCU_SUCCESS);
    cr_expect_eq(A->cuEventDestroy(ev), KCU_SUCCESS);
    /* one more, left paused: the device's destroy drains it */
    cr_assert_eq(A->cuStreamCreate(&s, KCU_STREAM_NON_BLOCKING), KCU_SUCCESS);
    cr_assert_eq(emu_stream_set_paused(s, 1), 0);
    cr_assert_eq(A->cuMemsetD8Async(mapped_window(KCU_MEM_ACCESS_FLAGS_PROT_READWRITE), 1, 64,
                                    s), KCU_SUCCESS);
    cr_assert_eq(A->cuStreamDestroy(s), KCU_SUCCESS);
    cr_expect_eq(dev_down(), 3, "only the window (mapping, handle, reservation) is leaked");
}

/* Regression (issue 9, item 18): legacy-stream work ran synchronously in the caller (after
   draining the blocking streams), so a caller that forgot cuStreamSynchronize(NULL) passed
   here and not on a GPU. It runs on a worker now, after the blocking streams' earlier
   work: with a blocking stream paused, the call returns (before: it hung) and nothing has
   run until that stream does. */
Test(emu, legacy_stream_is_asynchronous)
{
    TH_DEADLINE(30);
    dev_default();
    kcu_deviceptr va = mapped_window(KCU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    kcu_stream b;
    kcu_event ev;
    cr_assert_eq(A->cuStreamCreate(&b, KCU_STREAM_DEFAULT), KCU_SUCCESS);
    cr_assert_eq(A->cuEventCreate(&ev, KCU_EVENT_DISABLE_TIMING), KCU_SUCCESS);
    cr_assert_eq(emu_stream_set_paused(b, 1), 0);
    cr_assert_eq(A->cuMemsetD8Async(va, 0x5a, 64, b), KCU_SUCCESS);
    char *pin;
    cr_assert_eq(A->cuMemAllocHost((void **)&pin, 64), KCU_SUCCESS);
    memset(pin, 0, 64);
    cr_assert_eq(A->cuMemcpyDtoHAsync(pin, va, 64, NULL), KCU_SUCCESS);   /* returns */
    cr_assert_eq(A->cuEventRecord(ev, NULL), KCU_SUCCESS);
    cr_expect_eq(A->cuEventQuery(ev), KCU_ERROR_NOT_READY, "legacy work ran before the "
                 "blocking stream's earlier work");
    cr_expect_eq(pin[0], 0);
    cr_assert_eq(emu_stream_set_paused(b, 0), 0);
    cr_assert_eq(A->cuStreamSynchronize(NULL), KCU_SUCCESS);
    cr_expect_eq(A->cuEventQuery(ev), KCU_SUCCESS);
    for (int i = 0; i < 64; i++)
        cr_assert_eq((unsigned char)pin[i], 0x5a, "byte %d", i);
    cr_expect_eq(A->cuMemFreeHost(pin), KCU_SUCCESS);
    cr_expect_eq(A->cuEventDestroy(ev), KCU_SUCCESS);
    cr_expect_eq(A->cuStreamDestroy(b), KCU_SUCCESS);
}

/* ---- driver-call counters (emu_calls_get) --------------------------------------------- */

static struct emu_calls calls(int o)
{
    struct emu_calls c;
    cr_assert_eq(emu_calls_get(o, &c), 0);
    return c;
}

static uint64_t calls_total(const struct emu_calls *c)
{
    uint64_t n = 0;
#define X(e) n += c->e;
    EMU_ENTRIES(X)
#undef X
    return n;
}

/* Every call counts once, on the device current on the calling thread, failed and injected
   failures included; calls with no context current count nowhere; reset zeroes. */
Test(calls, count_each_entry_point_on_the_current_device)
{
    dev_default();
    cr_assert_eq(emu_calls_reset(ord), 0);
    struct emu_calls c = calls(ord);
    cr_expect_eq(calls_total(&c), 0);

    kcu_mem_handle h[3];
    for (int i = 0; i < 3; i++)
        h[i] = create(G);
    kcu_deviceptr va = reserve(4 * G);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(A->cuMemMap(va + i * G, G, 0, h[i], 0), KCU_SUCCESS);
    cr_assert_eq(set_access(va, 3 * G, KCU_MEM_ACCESS_FLAGS_PROT_READWRITE), KCU_SUCCESS);
    cr_expect_eq(A->cuMemMap(va, G, 0, h[0], 0), KCU_ERROR_INVALID_VALUE);  /* mapped */
    cr_assert_eq(emu_fail_arm("cuMemCreate", 1, KCU_ERROR_OUT_OF_MEMORY), 0);
    struct kcu_mem_alloc_prop p = prop_of(ord);
    kcu_mem_handle x;
    cr_expect_eq(A->cuMemCreate(&x, G, &p, 0), KCU_ERROR_OUT_OF_MEMORY);     /* injected */

    char *pin;
    cr_assert_eq(A->cuMemAllocHost((void **)&pin, G), KCU_SUCCESS);
    kcu_event ev;
    cr_assert_eq(A->cuEventCreate(&ev, KCU_EVENT_DISABLE_TIMING), KCU_SUCCESS);
    cr_assert_eq(A->cuMemsetD8Async(va, 1, G, NULL), KCU_SUCCESS);
    cr_assert_eq(A->cuMemcpyDtoDAsync(va + G, va, G, NULL), KCU_SUCCESS);
    cr_assert_eq(A->cuMemcpyDtoHAsync(pin, va + G, G, NULL), KCU_SUCCESS);
    cr_assert_eq(A->cuMemcpyHtoDAsync(va + 2 * G, pin, G, NULL), KCU_SUCCESS);
    cr_assert_eq(A->cuEventRecord(ev, NULL), KCU_SUCCESS);
    cr_assert_eq(A->cuEventSynchronize(ev), KCU_SUCCESS);
    cr_assert_eq(A->cuEventQuery(ev), KCU_SUCCESS);

    c = calls(ord);
    struct emu_counters k = counters();
    cr_expect_eq(c.cuMemCreate, 4, "3 creates + 1 injected failure: %lu",
                 (unsigned long)c.cuMemCreate);
    cr_expect_eq(k.creates, 3, "the success counter counts successes only");
    cr_expect_eq(c.cuMemMap, 4, "3 maps + 1 refused: %lu", (unsigned long)c.cuMemMap);
    cr_expect_eq(c.cuMemSetAccess, 1);
    cr_expect_eq(c.cuMemAddressReserve, 1);
    cr_expect_eq(c.cuMemsetD8Async + c.cuMemcpyDtoDAsync + c.cuMemcpyDtoHAsync +
                 c.cuMemcpyHtoDAsync, 4);
    cr_expect_eq(c.cuMemcpyHtoDAsync, 1);
    cr_expect_eq(c.cuEventCreate + c.cuEventRecord + c.cuEventSynchronize + c.cuEventQuery, 4);
    cr_expect_eq(c.cuMemAllocHost, 1);
    cr_expect_eq(calls_total(&c), 4 + 4 + 1 + 1 + 4 + 4 + 1, "a call counted twice or "
                 "an uncalled entry counted: %lu", (unsigned long)calls_total(&c));

    /* no context current: not this device's call (and no other's) */
    cr_assert_eq(A->cuCtxSetCurrent(NULL), KCU_SUCCESS);       /* ours was current: counted */
    int n;
    cr_assert_eq(A->cuDeviceGetCount(&n), KCU_SUCCESS);
    cr_assert_eq(A->cuCtxSetCurrent(ctx), KCU_SUCCESS);        /* none was current */
    c = calls(ord);
    cr_expect_eq(c.cuCtxSetCurrent, 1);
    cr_expect_eq(c.cuDeviceGetCount, 0);

    /* another device's calls are its own */
    struct emu_device_params p2 = { .capacity = 4 * MiB, .granule = G };
    int ord2;
    cr_assert_eq(emu_device_create(&p2, &ord2), 0);
    kcu_context ctx2;
    cr_assert_eq(A->cuDevicePrimaryCtxRetain(&ctx2, ord2), KCU_SUCCESS);   /* on ord: 1 */
    cr_assert_eq(A->cuCtxSetCurrent(ctx2), KCU_SUCCESS);                    /* on ord: 2 */
    cr_assert_eq(emu_calls_reset(ord2), 0);
    struct kcu_mem_alloc_prop q = prop_of(ord2);
    cr_assert_eq(A->cuMemCreate(&x, G, &q, 0), KCU_SUCCESS);
    cr_expect_eq(calls(ord2).cuMemCreate, 1);
    cr_expect_eq(calls(ord).cuMemCreate, 4);
    cr_assert_eq(A->cuMemRelease(x), KCU_SUCCESS);
    cr_assert_eq(A->cuCtxSetCurrent(ctx), KCU_SUCCESS);
    cr_assert_eq(A->cuDevicePrimaryCtxRelease(ord2), KCU_SUCCESS);
    cr_expect_eq(emu_device_destroy(ord2), 0);

    cr_assert_eq(emu_calls_reset(ord), 0);
    c = calls(ord);
    cr_expect_eq(calls_total(&c), 0);
    cr_expect_eq(emu_calls_get(ord, NULL), -EINVAL);
    cr_expect_eq(emu_calls_get(999, &c), -ENODEV);
    cr_expect_eq(emu_calls_reset(-1), -ENODEV);

    /* one call may remove several whole mappings: calls and mappings removed differ */
    uint64_t unmaps0 = counters().unmaps;
    cr_assert_eq(A->cuMemUnmap(va, G), KCU_SUCCESS);
    cr_assert_eq(A->cuMemUnmap(va + G, 2 * G), KCU_SUCCESS);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(A->cuMemRelease(h[i]), KCU_SUCCESS);
    c = calls(ord);
    cr_expect_eq(c.cuMemUnmap, 2);
    cr_expect_eq(counters().unmaps - unmaps0, 3);
    cr_expect_eq(c.cuMemRelease, 3);
    cr_expect_eq(A->cuMemAddressFree(va, 4 * G), KCU_SUCCESS);
    cr_expect_eq(A->cuEventDestroy(ev), KCU_SUCCESS);
    cr_expect_eq(A->cuMemFreeHost(pin), KCU_SUCCESS);
    cr_expect_eq(dev_down(), 0);
}

/* What the library asks of the driver, as the emulator saw it, against the library's own
   stats: every page it maps is one cuMemMap (stats.maps), every run of them one
   cuMemSetAccess, every mapping it removes is one the emulator removed (stats.unmaps), a
   copy-on-write is one device-to-device copy (stats.cow_copies). Grow of k fresh pages
   (no map-ahead): exactly k maps and one set-access. */
struct lib {
    kvvm *kv;
    int ord;
    struct emu_calls c0;
    struct emu_counters k0;
    struct kvvm_stats s0;
};

static struct kvvm_stats lib_stats(kvvm *kv)
{
    struct kvvm_stats s = { .size = sizeof s };
    cr_assert_eq(kvvm_stats(kv, &s), 0);
    return s;
}

static void lib_mark(struct lib *l)
{
    l->c0 = calls(l->ord);
    cr_assert_eq(emu_counters_get(l->ord, &l->k0), 0);
    l->s0 = lib_stats(l->kv);
}

/* The driver calls since lib_mark agree with the stats; returns them. */
static struct emu_calls lib_check(struct lib *l, const char *what)
{
    struct emu_calls c = calls(l->ord);
    struct emu_counters k;
    cr_assert_eq(emu_counters_get(l->ord, &k), 0);
    struct kvvm_stats s = lib_stats(l->kv);
#define X(e) c.e -= l->c0.e;
    EMU_ENTRIES(X)
#undef X
    cr_expect_eq(c.cuMemMap, s.maps - l->s0.maps, "%s: %lu cuMemMap, stats.maps +%lu", what,
                 (unsigned long)c.cuMemMap, (unsigned long)(s.maps - l->s0.maps));
    cr_expect_eq(k.unmaps - l->k0.unmaps, s.unmaps - l->s0.unmaps,
                 "%s: the emulator removed %lu mappings, stats.unmaps +%lu", what,
                 (unsigned long)(k.unmaps - l->k0.unmaps),
                 (unsigned long)(s.unmaps - l->s0.unmaps));
    cr_expect_leq(c.cuMemUnmap, s.unmaps - l->s0.unmaps, "%s: more unmap calls than pages",
                  what);
    cr_expect_eq(c.cuMemcpyDtoDAsync, s.cow_copies - l->s0.cow_copies,
                 "%s: %lu device copies, stats.cow_copies +%lu", what,
                 (unsigned long)c.cuMemcpyDtoDAsync,
                 (unsigned long)(s.cow_copies - l->s0.cow_copies));
    return c;
}

Test(calls, library_driver_calls_match_its_stats)
{
    struct kvvm_config cfg;
    th_config(&cfg, G, 1, 1024, 4, 64 * 64, 128, 0, 0);   /* 64 tokens per 64 KiB page */
    cfg.emu_device_bytes = 0;
    cfg.map_ahead = 0;
    cfg.pool_thread = 0;          /* the calls of the caller's thread only: the pool thread
                                     refills at its own time, e.g. during the fork (it failed
                                     "a fork creates no memory" 1 run in ~10 under load) */
    struct lib l = { 0 };
    int rc = kvvm_open(&cfg, &l.kv);
    cr_assert_eq(rc, 0, "kvvm_open: %d", rc);
    l.ord = kvvm_debug_emu_ordinal(l.kv);
    cr_assert_geq(l.ord, 0);
    kvvm_seq a, b;
    cr_assert_eq(kvvm_seq_create(l.kv, &a), 0);

    lib_mark(&l);
    cr_assert_eq(kvvm_seq_grow(l.kv, a, 8 * 64), 0);
    struct emu_calls c = lib_check(&l, "grow by 8 pages");
    cr_expect_eq(c.cuMemMap, 8);
    cr_expect_eq(c.cuMemSetAccess, 1, "one set-access per run, got %lu",
                 (unsigned long)c.cuMemSetAccess);
    cr_expect_eq(c.cuMemUnmap, 0);

    lib_mark(&l);
    cr_assert_eq(kvvm_seq_grow(l.kv, a, 9 * 64), 0);
    c = lib_check(&l, "grow by 1 page");
    cr_expect_eq(c.cuMemMap, 1);
    cr_expect_eq(c.cuMemSetAccess, 1);

    lib_mark(&l);
    cr_assert_eq(kvvm_seq_fork(l.kv, a, &b), 0);
    c = lib_check(&l, "fork");
    cr_expect_eq(c.cuMemMap, 9, "the child maps the parent's 9 pages: %lu",
                 (unsigned long)c.cuMemMap);
    cr_expect_eq(c.cuMemCreate, 0, "a fork creates no memory");

    lib_mark(&l);
    cr_assert_eq(kvvm_seq_prepare_write(l.kv, b, 0, 1), 0);
    c = lib_check(&l, "copy-on-write of one page");
    cr_expect_eq(c.cuMemcpyDtoDAsync, 1);

    lib_mark(&l);
    cr_assert_eq(kvvm_seq_free(l.kv, b), 0);
    cr_assert_eq(kvvm_seq_free(l.kv, a), 0);
    cr_assert_eq(kvvm_sync(l.kv), 0);
    c = lib_check(&l, "free both and sync");
    cr_expect_eq(c.cuMemMap, 0);
    struct kvvm_stats s = lib_stats(l.kv);
    cr_expect_eq(s.unmaps - l.s0.unmaps, 18, "18 window pages unmapped: %lu",
                 (unsigned long)(s.unmaps - l.s0.unmaps));
    char why[256];
    cr_expect_eq(kvvm_debug_check(l.kv, why, sizeof why), 0, "%s", why);
    kvvm_close(l.kv);
}

/* The invariant checker reads the emulator's tables through vmm_debug_mapping: a window
   page unmapped behind the library's back is -EUCLEAN, named; mapped back, the check holds
   again. (Were the debug view to answer "unknown" on the emulated device, the checker would
   skip these checks and this test fails.) */
Test(calls, checker_sees_the_emulator_tables_through_the_vmm_debug_call)
{
    struct kvvm_config cfg;
    th_config(&cfg, G, 1, 1024, 2, 64 * 8, 16, 0, 0);
    cfg.emu_device_bytes = 0;
    cfg.map_ahead = 0;
    kvvm *kv;
    cr_assert_eq(kvvm_open(&cfg, &kv), 0);
    kvvm_seq s;
    cr_assert_eq(kvvm_seq_create(kv, &s), 0);
    cr_assert_eq(kvvm_seq_grow(kv, s, 2 * 64), 0);
    uint64_t va;
    cr_assert_eq(kvvm_seq_addr(kv, s, 0, &va), 0);
    va += G;                                     /* its second page */
    char why[256];
    cr_assert_eq(kvvm_debug_check(kv, why, sizeof why), 0, "%s", why);

    A = emu_api();
    ord = kvvm_debug_emu_ordinal(kv);
    kcu_context prev;
    cr_assert_eq(A->cuDevicePrimaryCtxRetain(&ctx, ord), KCU_SUCCESS);
    cr_assert_eq(A->cuCtxGetCurrent(&prev), KCU_SUCCESS);
    cr_assert_eq(A->cuCtxSetCurrent(ctx), KCU_SUCCESS);
    kcu_mem_handle h;
    cr_assert_eq(emu_lookup(va, &h, NULL, NULL), 0);
    cr_assert_eq(A->cuMemUnmap(va, G), KCU_SUCCESS);
    cr_expect_eq(kvvm_debug_check(kv, why, sizeof why), -EUCLEAN);
    cr_expect(strstr(why, "is not mapped"), "the checker says: '%s'", why);
    map_rw(va, G, h);
    cr_expect_eq(kvvm_debug_check(kv, why, sizeof why), 0, "%s", why);
    cr_assert_eq(A->cuCtxSetCurrent(prev), KCU_SUCCESS);
    cr_assert_eq(A->cuDevicePrimaryCtxRelease(ord), KCU_SUCCESS);
    cr_assert_eq(kvvm_seq_free(kv, s), 0);
    kvvm_close(kv);
}
