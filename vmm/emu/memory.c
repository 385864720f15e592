/*
 * vmm/emu/memory.c: physical memory: the granule allocator over the memfd and the handles
 * (cuMemCreate, cuMemRelease, cuMemGetAllocationGranularity).
 * (Contract of the emulated device: vmm/emu/emu.h; internals: vmm/emu/emu_int.h.)
 */
#include "emu_int.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <time.h>

/* ---- physical memory allocator ------------------------------------------------------ */

static bool bit_get(const uint64_t *bm, size_t i) { return bm[i / 64] >> (i % 64) & 1; }
static void bit_set(uint64_t *bm, size_t i, bool v)
{
    if (v)
        bm[i / 64] |= 1ull << (i % 64);
    else
        bm[i / 64] &= ~(1ull << (i % 64));
}

/* Takes granules [i, i + n) (free). */
static void range_take_locked(struct emu_dev *d, size_t i, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        bit_set(d->bitmap, i + k, true);
        if (bit_get(d->unpunched, i + k)) {
            bit_set(d->unpunched, i + k, false);
            KVVM_ASSERT(d->n_unpunched > 0);
            d->n_unpunched--;
        }
    }
}

/* Finds n free contiguous granules whose memory was not returned yet (first fit), so a
   create reuses memory a release left before it makes the system supply new pages. */
static bool range_reuse_locked(struct emu_dev *d, size_t n, size_t *base)
{
    for (size_t i = 0; d->n_unpunched >= n && i + n <= d->ngran;) {
        if (d->unpunched[i / 64] == 0 && i % 64 == 0) {
            i += 64;
            continue;
        }
        size_t run = 0;
        while (run < n && bit_get(d->unpunched, i + run))
            run++;
        if (run == n) {
            range_take_locked(d, i, n);
            *base = i;
            return true;
        }
        i += run + 1;
    }
    return false;
}

/* Finds n free contiguous granules: not yet returned ones first (range_reuse_locked), else
   next-fit from the cursor. -ENOMEM none. */
static int range_alloc_locked(struct emu_dev *d, size_t n, size_t *base)
{
    if (n > d->ngran)
        return -ENOMEM;
    if (range_reuse_locked(d, n, base))
        return 0;
    for (int pass = 0; pass < 2; pass++) {
        size_t i = pass == 0 ? d->cursor : 0;
        size_t end = pass == 0 ? d->ngran : min_sz(d->cursor + n, d->ngran);
        while (i + n <= end) {
            if (d->bitmap[i / 64] == ~0ull && i % 64 == 0) {
                i += 64;
                continue;
            }
            size_t run = 0;
            while (run < n && !bit_get(d->bitmap, i + run))
                run++;
            if (run == n) {
                range_take_locked(d, i, n);
                *base = i;
                d->cursor = (i + n) % d->ngran;
                return 0;
            }
            i += run + 1;
        }
    }
    return -ENOMEM;
}

/* Gives the memory of every free granule not yet returned back to the system: one hole
   punch per run (KEEP_SIZE keeps the memfd's length, so the view stays valid). */
static void punch_free_locked(struct emu_dev *d)
{
    for (size_t i = 0; i < d->ngran && d->n_unpunched;) {
        if (!bit_get(d->unpunched, i)) {
            i++;
            continue;
        }
        size_t n = 0;
        while (i + n < d->ngran && bit_get(d->unpunched, i + n)) {
            bit_set(d->unpunched, i + n, false);
            n++;
        }
        KVVM_ASSERT(d->n_unpunched >= n);
        d->n_unpunched -= n;
        if (fallocate(d->memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                      (off_t)(i * d->gran), (off_t)(n * d->gran)) != 0)
            klog_warn("emulated device %d: hole punch of %zu bytes failed: %s", d->ordinal,
                      n * d->gran, strerror(errno));
        i += n;
    }
}

/* Frees n granules at base. Their memory goes back to the system in batches: once the
   free granules not yet returned are more than half the device, all of them at
   once. A hole punch per release cost more than the rest of a release and its next create
   together (each one zaps the view's page table entries and flushes every CPU's TLB that
   runs one of our threads, and the create that reuses the granules faults them in again);
   a create that reuses granules not yet returned fills them with poison like any other. */
static void range_free_locked(struct emu_dev *d, size_t base, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        KVVM_ASSERT(bit_get(d->bitmap, base + k));   /* freed once, after its take */
        bit_set(d->bitmap, base + k, false);
        bit_set(d->unpunched, base + k, true);
    }
    d->n_unpunched += n;
    if (d->n_unpunched > d->ngran / 2)
        punch_free_locked(d);
}

kcu_mem_handle emu_handle_value(size_t slot)
{
    return ((kcu_mem_handle)emu.handles[slot].gen << 32) | (kcu_mem_handle)(slot + 1);
}

/* A handle the user may still name (not released); NULL for stale or forged values. */
struct emu_handle *emu_handle_lookup_locked(kcu_mem_handle v, size_t *slot)
{
    uint64_t s1 = v & 0xffffffffu;
    if (s1 == 0 || s1 > emu.handles_cap)
        return NULL;
    struct emu_handle *h = &emu.handles[s1 - 1];
    if (!h->dev || h->gen != (uint32_t)(v >> 32) || h->released)
        return NULL;
    if (slot)
        *slot = s1 - 1;
    return h;
}

int emu_handle_fd(const struct emu_handle *h, off_t *off)
{
    if (h->kind != EMU_H_PLAIN) {
        *off = 0;
        return h->fd;
    }
    *off = (off_t)(h->base * h->dev->gran);
    return h->dev->memfd;
}

void emu_handle_loc(const struct emu_handle *h, size_t byte, struct emu_loc *at)
{
    if (h->kind == EMU_H_PLAIN) {
        *at = (struct emu_loc){ .p = h->dev->view + h->base * h->dev->gran + byte, .fd = -1 };
        return;
    }
    *at = (struct emu_loc){ .fd = h->fd, .off = (off_t)byte };
}

void emu_handle_free_now_locked(size_t slot)
{
    struct emu_handle *h = &emu.handles[slot];
    struct emu_dev *d = h->dev;
    KVVM_ASSERT(h->released && !h->maps);
    if (h->kind != EMU_H_PLAIN)
        emu_share_close(h);
    if (h->kind == EMU_H_IMPORTED) {
        KVVM_ASSERT(d->c.imported > 0 && d->c.imported_bytes >= h->ngran * d->gran);
        d->c.imported--;
        d->c.imported_bytes -= h->ngran * d->gran;
    } else {
        if (h->lingering) {
            KVVM_ASSERT(d->n_lingering > 0 && d->c.lingering > 0);
            d->n_lingering--;
            d->c.lingering--;
        }
        range_free_locked(d, h->base, h->ngran);
        KVVM_ASSERT(d->c.handles > 0 && d->c.handle_bytes >= h->ngran * d->gran);
        d->c.handles--;
        d->c.handle_bytes -= h->ngran * d->gran;
    }
    h->dev = NULL;
    h->lingering = false;
    if (++h->gen == 0)
        h->gen = 1;
}

/* Frees the memory of a handle that is released and no longer mapped, unless an importer
   still holds it (a shareable one then lingers, accounted, until emu_share_reap_locked). */
void emu_handle_maybe_free_locked(size_t slot)
{
    struct emu_handle *h = &emu.handles[slot];
    if (!h->released || h->maps)
        return;
    if (h->kind == EMU_H_SHAREABLE && emu_share_held_elsewhere(h)) {
        if (!h->lingering) {
            h->lingering = true;
            h->dev->n_lingering++;
            h->dev->c.lingering++;
        }
        return;
    }
    emu_handle_free_now_locked(slot);
}

int emu_handle_slot_alloc_locked(size_t *slot)
{
    for (size_t k = 0; k < emu.handles_cap; k++) {
        size_t i = (emu.handle_scan + k) % emu.handles_cap;
        if (!emu.handles[i].dev) {
            *slot = i;
            emu.handle_scan = i + 1;
            return 0;
        }
    }
    size_t cap = emu.handles_cap ? 2 * emu.handles_cap : 256;
    if (cap > UINT32_MAX)
        return -ENOMEM;
    struct emu_handle *n = realloc(emu.handles, cap * sizeof *n);
    if (!n)
        return -ENOMEM;
    for (size_t i = emu.handles_cap; i < cap; i++)
        n[i] = (struct emu_handle){ .gen = 1 };
    emu.handles = n;
    *slot = emu.handles_cap;
    emu.handles_cap = cap;
    return 0;
}

/* Checks a CUmemAllocationProp as cuMemCreate does. */
static kcu_result prop_check_locked(const struct kcu_mem_alloc_prop *prop, struct emu_dev **d)
{
    if (!prop || prop->type != KCU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != KCU_MEM_LOCATION_TYPE_DEVICE)
        return KCU_ERROR_INVALID_VALUE;
    if (!(*d = emu_dev_get_locked(prop->location.id)))
        return KCU_ERROR_INVALID_DEVICE;
    return KCU_SUCCESS;
}

kcu_result emu_cuMemGetAllocationGranularity(size_t *granularity,
                                                    const struct kcu_mem_alloc_prop *prop,
                                                    int option)
{
    BEGIN(cuMemGetAllocationGranularity, F_INIT);
    struct emu_dev *d;
    if (!granularity || (option != KCU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                         option != KCU_MEM_ALLOC_GRANULARITY_RECOMMENDED)) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    if ((r = prop_check_locked(prop, &d)))
        goto out;
    *granularity = d->gran;
out:
    return emu_leave(r);
}

/* ---- the driver's cost of cuMemCreate (KVVM_EMU_CREATE_NS) ----
   A GPU's cuMemCreate of 2 MiB takes ~200 us; the emulator's is a memset. KVVM_EMU_CREATE_NS
   (read at each emu_device_create, process-wide) makes every cuMemCreate first sleep that
   long, outside the emulator's lock (the real driver does not stop other threads' calls
   either): kvvm-bench's frames group measures grows with frames created ahead against
   created on the caller's thread with it. The value: emu.create_ns. */
void emu_create_cost_read(void)
{
    const char *e = getenv("KVVM_EMU_CREATE_NS");
    long v = e && *e ? strtol(e, NULL, 10) : 0;
    __atomic_store_n(&emu.create_ns, v > 0 && v < 1000000000L ? v : 0, __ATOMIC_RELAXED);
}

static void create_cost_spend(void)
{
    long ns = __atomic_load_n(&emu.create_ns, __ATOMIC_RELAXED);
    if (ns > 0) {
        struct timespec ts = { 0, ns };
        while (nanosleep(&ts, &ts) && errno == EINTR)
            ;
    }
}

kcu_result emu_cuMemCreate(kcu_mem_handle *handle, size_t size,
                                  const struct kcu_mem_alloc_prop *prop,
                                  unsigned long long flags)
{
    create_cost_spend();
    BEGIN(cuMemCreate, F_INIT | F_CTX | F_STICKY);
    struct emu_dev *d;
    size_t slot, base;
    if (!handle || flags != 0) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    if ((r = prop_check_locked(prop, &d)))
        goto out;
    int types = prop->requestedHandleTypes;
    if (types != KCU_MEM_HANDLE_TYPE_NONE &&
        types != KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
        /* Other shareable types (win32, fabric) are not emulated. */
        r = KCU_ERROR_NOT_SUPPORTED;
        goto out;
    }
    if (prop->win32HandleMetaData || prop->allocFlags.compressionType ||
        prop->allocFlags.usage || size == 0 || size % d->gran) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    emu_share_reap_locked(d);
    if (d->c.handle_bytes + size + d->held > d->capacity ||      /* others hold the rest */
        emu_handle_slot_alloc_locked(&slot) ||
        range_alloc_locked(d, size / d->gran, &base)) {
        r = KCU_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    int fd = -1, xfd = -1;
    if (types == KCU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR &&
        (r = emu_share_create_locked(d, size, &fd, &xfd))) {
        range_free_locked(d, base, size / d->gran);
        goto out;
    }
    /* Uninitialized GPU memory: fill with poison through the view. Allocating the pages
       first (one fallocate) is much cheaper than faulting them in one by one. A shareable
       allocation's memfd was filled by emu_share_create_locked (written, not faulted). */
    if (fd < 0) {
        (void)fallocate(d->memfd, 0, (off_t)(base * d->gran), (off_t)size);
        memset(d->view + base * d->gran, EMU_POISON, size);
    }
    emu.handles[slot] = (struct emu_handle){ .dev = d, .gen = emu.handles[slot].gen, .base = base,
                                     .ngran = size / d->gran, .fd = fd, .xfd = xfd,
                                     .kind = fd >= 0 ? EMU_H_SHAREABLE : EMU_H_PLAIN };
    d->c.handles++;
    d->c.handle_bytes += size;
    d->c.creates++;
    *handle = emu_handle_value(slot);
out:
    return emu_leave(r);
}

/* Releasing a mapped handle is allowed (the memory is freed after its last unmap, as the
   driver documents). A stale, forged or already released handle: KCU_ERROR_INVALID_VALUE
   (the driver documents only INVALID_VALUE for bad arguments here). */
kcu_result emu_cuMemRelease(kcu_mem_handle handle)
{
    BEGIN(cuMemRelease, F_INIT | F_STICKY);
    size_t slot;
    struct emu_handle *h = emu_handle_lookup_locked(handle, &slot);
    if (!h) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    h->released = true;
    h->dev->c.releases++;
    if (h->kind == EMU_H_SHAREABLE)
        emu_share_unexport(h);       /* before maybe_free's look: exports are over */
    emu_handle_maybe_free_locked(slot);
out:
    return emu_leave(r);
}
