/*
 * vmm/emu/host.c: pinned host memory (cuMemAllocHost, cuMemHostRegister) and pointer
 * attributes.
 * (Contract of the emulated device: vmm/emu/emu.h; internals: vmm/emu/emu_int.h.)
 */
#include "emu_int.h"

#include <stdio.h>
#include <sys/mman.h>
#include <sys/resource.h>

/* ---- host memory -------------------------------------------------------------------- */

static void memlock_warn_locked(size_t bytes, int err)
{
    if (emu.memlock_warned)
        return;
    emu.memlock_warned = true;
    struct rlimit rl;
    char lim[32] = "unknown";
    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
        if (rl.rlim_cur == RLIM_INFINITY)
            snprintf(lim, sizeof lim, "unlimited");
        else
            snprintf(lim, sizeof lim, "%llu bytes", (unsigned long long)rl.rlim_cur);
    }
    klog_warn("emulated device: mlock of %zu bytes of pinned host memory failed (%s); "
              "RLIMIT_MEMLOCK is %s: pinned memory stays pageable (raise it with ulimit -l or "
              "limits.conf). Warned once.", bytes, strerror(err), lim);
}

static struct emu_host *host_overlap_locked(const unsigned char *p, size_t n)
{
    for (struct emu_host *h = emu.hosts; h; h = h->next)
        if (p < h->p + h->n && h->p < p + n)
            return h;
    return NULL;
}

void emu_host_remove_locked(struct emu_host *x)
{
    for (struct emu_host **pp = &emu.hosts; *pp; pp = &(*pp)->next) {
        if (*pp == x) {
            *pp = x->next;
            return;
        }
    }
}

void emu_host_release_locked(struct emu_host *h)
{
    if (h->alloc) {
        munmap(h->p, h->n);        /* also unlocks */
        KVVM_ASSERT(h->dev->c.host_allocs > 0 && h->dev->c.host_alloc_bytes >= h->n);
        h->dev->c.host_allocs--;
        h->dev->c.host_alloc_bytes -= h->n;
    } else {
        if (h->locked)
            munlock(h->p, h->n);
        KVVM_ASSERT(h->dev->c.host_registered > 0 && h->dev->c.host_registered_bytes >= h->n);
        h->dev->c.host_registered--;
        h->dev->c.host_registered_bytes -= h->n;
    }
    free(h);
}

/* Pins a new host range (mlock, best effort: a warning when RLIMIT_MEMLOCK refuses) and
   tracks it, counted as an allocation or a registration. */
static void host_pin_locked(struct emu_host *h)
{
    if (mlock(h->p, h->n) == 0)
        h->locked = true;
    else
        memlock_warn_locked(h->n, errno);
    h->next = emu.hosts;
    emu.hosts = h;
    if (h->alloc) {
        h->dev->c.host_allocs++;
        h->dev->c.host_alloc_bytes += h->n;
    } else {
        h->dev->c.host_registered++;
        h->dev->c.host_registered_bytes += h->n;
    }
}

/* The pinned range starting at p made by cuMemAllocHost (alloc) or cuMemHostRegister
   (!alloc), or NULL; the last one listed if several match. */
static struct emu_host *host_find_locked(const void *p, bool alloc)
{
    struct emu_host *h = NULL;
    for (struct emu_host *x = emu.hosts; x; x = x->next)
        if (x->alloc == alloc && x->p == p)
            h = x;
    return h;
}

kcu_result emu_cuMemAllocHost(void **pp, size_t bytes)
{
    BEGIN(cuMemAllocHost, F_INIT | F_CTX | F_STICKY);
    if (!pp || bytes == 0) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    struct emu_host *h = calloc(1, sizeof *h);
    if (!h) {
        r = KCU_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        free(h);
        r = KCU_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    *h = (struct emu_host){ .dev = cur, .p = p, .n = bytes, .alloc = true };
    host_pin_locked(h);
    *pp = p;
out:
    return emu_leave(r);
}

/* Like the driver, freeing pinned memory first waits for the device's work. A pointer that
   cuMemAllocHost did not return: KCU_ERROR_INVALID_VALUE. */
kcu_result emu_cuMemFreeHost(void *p)
{
    BEGIN(cuMemFreeHost, F_INIT);
    struct emu_host *h = host_find_locked(p, true);
    if (!h) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    emu_drain_locked(h->dev, false);
    emu_host_remove_locked(h);
    emu_host_release_locked(h);
out:
    return emu_leave(r);
}

/* Flags: PORTABLE, DEVICEMAP, IOMEMORY, READ_ONLY (1, 2, 4, 8); others, NULL or 0 bytes:
   KCU_ERROR_INVALID_VALUE. Overlap with a registered or cuMemAllocHost range:
   KCU_ERROR_HOST_MEMORY_ALREADY_REGISTERED. */
kcu_result emu_cuMemHostRegister(void *p, size_t bytes, unsigned int flags)
{
    BEGIN(cuMemHostRegister, F_INIT | F_CTX | F_STICKY);
    if (!p || bytes == 0 || (flags & ~15u)) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    if (host_overlap_locked(p, bytes)) {
        r = KCU_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
        goto out;
    }
    struct emu_host *h = calloc(1, sizeof *h);
    if (!h) {
        r = KCU_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    *h = (struct emu_host){ .dev = cur, .p = p, .n = bytes };
    host_pin_locked(h);
out:
    return emu_leave(r);
}

/* p must be the start of a registration: else KCU_ERROR_HOST_MEMORY_NOT_REGISTERED. */
kcu_result emu_cuMemHostUnregister(void *p)
{
    BEGIN(cuMemHostUnregister, F_INIT);
    struct emu_host *h = host_find_locked(p, false);
    if (!h) {
        r = KCU_ERROR_HOST_MEMORY_NOT_REGISTERED;
        goto out;
    }
    emu_host_remove_locked(h);
    emu_host_release_locked(h);
out:
    return emu_leave(r);
}

/* CU_POINTER_ATTRIBUTE_MEMORY_TYPE only (others: KCU_ERROR_INVALID_VALUE, undocumented):
   HOST inside a pinned host range (cuMemAllocHost, cuMemHostRegister), DEVICE at a mapped
   device address, else KCU_ERROR_INVALID_VALUE ("not allocated by, mapped by, or
   registered with a CUcontext": pageable memory, as the driver says). */
kcu_result emu_cuPointerGetAttribute(void *data, int attribute, kcu_deviceptr ptr)
{
    BEGIN(cuPointerGetAttribute, F_INIT | F_CTX);
    if (!data || attribute != KCU_POINTER_ATTRIBUTE_MEMORY_TYPE) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    const unsigned char *b = (const unsigned char *)(uintptr_t)ptr;
    unsigned type = 0;
    for (struct emu_host *h = emu.hosts; h && !type; h = h->next)
        if (b >= h->p && (size_t)(b - h->p) < h->n)
            type = KCU_MEMORYTYPE_HOST;
    if (!type && emu_range_known_locked(ptr, 1))
        type = KCU_MEMORYTYPE_DEVICE;
    if (!type)
        r = KCU_ERROR_INVALID_VALUE;
    else
        *(unsigned *)data = type;
out:
    return emu_leave(r);
}
