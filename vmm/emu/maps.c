/*
 * vmm/emu/maps.c: virtual memory: reservations and the mapping table
 * (cuMemAddressReserve/Free, cuMemMap, cuMemUnmap, cuMemSetAccess, emu_lookup).
 * (Contract of the emulated device: vmm/emu/emu.h; internals: vmm/emu/emu_int.h.)
 */
#include "emu_int.h"

#include <sys/mman.h>

/* ---- reservations and the mapping table --------------------------------------------- */

struct emu_resv *emu_resv_find_locked(uintptr_t va)
{
    for (size_t i = 0; i < emu.nresv; i++) {
        struct emu_resv *rv = emu.resvs[i];
        if (va >= rv->base && va - rv->base < rv->size)
            return rv;
    }
    return NULL;
}

/* The reservation holding all of [va, va + n), or NULL. */
static struct emu_resv *resv_find_range_locked(uintptr_t va, size_t n)
{
    struct emu_resv *rv = emu_resv_find_locked(va);
    if (!rv || n > rv->size - (va - rv->base))
        return NULL;
    return rv;
}

struct emu_ent *emu_ent_get(struct emu_resv *rv, size_t i)
{
    struct emu_ent *b = rv->blk[i / ENT_BLOCK];
    return b ? &b[i % ENT_BLOCK] : NULL;
}

bool emu_ent_mapped(struct emu_resv *rv, size_t i)
{
    struct emu_ent *e = emu_ent_get(rv, i);
    return e && e->h1;
}

uint64_t emu_ent_map_id(struct emu_resv *rv, size_t i)
{
    struct emu_ent *e = emu_ent_get(rv, i);
    return e && e->h1 ? e->map_id : 0;
}

static int resv_add_locked(struct emu_resv *rv)
{
    if (emu.nresv == emu.resv_cap) {
        size_t cap = emu.resv_cap ? 2 * emu.resv_cap : 16;
        struct emu_resv **n = realloc(emu.resvs, cap * sizeof *n);
        if (!n)
            return -ENOMEM;
        emu.resvs = n;
        emu.resv_cap = cap;
    }
    emu.resvs[emu.nresv++] = rv;
    return 0;
}

void emu_resv_remove_locked(struct emu_resv *rv)
{
    for (size_t i = 0; i < emu.nresv; i++) {
        if (emu.resvs[i] == rv) {
            emu.resvs[i] = emu.resvs[--emu.nresv];
            return;
        }
    }
}

void emu_resv_free_mem(struct emu_resv *rv)
{
    for (size_t b = 0; b < rv->nblk; b++)
        free(rv->blk[b]);
    free(rv->blk);
    free(rv->blk_used);
    free(rv);
}

/* Reservations are aligned to at least the granule (mmap gives pages only), so the address
   space is over-reserved and trimmed. A nonzero addr is a hint, honoured when that exact
   range is free. Errors: size 0 or not a granule multiple, alignment not 0 or a power of
   two, flags != 0 -> KCU_ERROR_INVALID_VALUE; no address space -> KCU_ERROR_OUT_OF_MEMORY. */
kcu_result emu_cuMemAddressReserve(kcu_deviceptr *ptr, size_t size, size_t alignment,
                                          kcu_deviceptr addr, unsigned long long flags)
{
    BEGIN(cuMemAddressReserve, F_INIT | F_CTX | F_STICKY);
    struct emu_resv *rv = NULL;
    void *base = MAP_FAILED;
    size_t align;
    if (!ptr || size == 0 || size % cur->gran || flags != 0 ||
        (alignment && !is_pow2(alignment))) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    align = alignment > cur->gran ? alignment : cur->gran;
    const int mflags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    if (addr && addr % align == 0) {
        base = mmap((void *)(uintptr_t)addr, size, PROT_NONE, mflags | MAP_FIXED_NOREPLACE,
                    -1, 0);
        if (base != MAP_FAILED && base != (void *)(uintptr_t)addr) {
            munmap(base, size);    /* a kernel without MAP_FIXED_NOREPLACE: not honoured */
            base = MAP_FAILED;
        }
    }
    if (base == MAP_FAILED) {
        if (size > SIZE_MAX - align) {
            r = KCU_ERROR_OUT_OF_MEMORY;
            goto out;
        }
        unsigned char *raw = mmap(NULL, size + align, PROT_NONE, mflags, -1, 0);
        if (raw == MAP_FAILED) {
            r = KCU_ERROR_OUT_OF_MEMORY;
            goto out;
        }
        uintptr_t a = ((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1);
        if (a > (uintptr_t)raw)
            munmap(raw, a - (uintptr_t)raw);
        size_t tail = (uintptr_t)raw + size + align - (a + size);
        if (tail)
            munmap((void *)(a + size), tail);
        base = (void *)a;
    }
    rv = calloc(1, sizeof *rv);
    if (!rv)
        goto out_unmap;
    rv->owner = cur;
    rv->base = (uintptr_t)base;
    rv->size = size;
    rv->gran = cur->gran;
    rv->ngran = size / cur->gran;
    rv->nblk = (rv->ngran + ENT_BLOCK - 1) / ENT_BLOCK;
    rv->blk = calloc(rv->nblk, sizeof *rv->blk);
    rv->blk_used = calloc(rv->nblk, sizeof *rv->blk_used);
    if (!rv->blk || !rv->blk_used || resv_add_locked(rv))
        goto out_free;
    cur->c.reservations++;
    cur->c.reserved_bytes += size;
    *ptr = (kcu_deviceptr)(uintptr_t)base;
    goto out;
out_free:
    free(rv->blk);
    free(rv->blk_used);
    free(rv);
out_unmap:
    munmap(base, size);
    r = KCU_ERROR_OUT_OF_MEMORY;
out:
    return emu_leave(r);
}

/* (ptr, size) must name exactly one reservation with no live mapping; anything else is
   KCU_ERROR_INVALID_VALUE (the driver documents only INVALID_VALUE for bad ranges). */
kcu_result emu_cuMemAddressFree(kcu_deviceptr ptr, size_t size)
{
    BEGIN(cuMemAddressFree, F_INIT | F_STICKY);
    struct emu_resv *rv = emu_resv_find_locked((uintptr_t)ptr);
    if (!rv || rv->base != (uintptr_t)ptr || rv->size != size || rv->live_maps) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    emu_resv_remove_locked(rv);
    munmap((void *)rv->base, rv->size);
    KVVM_ASSERT(rv->owner->c.reservations > 0 && rv->owner->c.reserved_bytes >= rv->size);
    rv->owner->c.reservations--;
    rv->owner->c.reserved_bytes -= rv->size;
    emu_resv_free_mem(rv);
out:
    return emu_leave(r);
}

/* Errors (driver reference for cuMemMap lists INVALID_VALUE, INVALID_DEVICE, OUT_OF_MEMORY,
   NOT_PERMITTED, NOT_SUPPORTED; it does not list ALREADY_MAPPED):
   - stale/forged handle, offset != 0, flags != 0, size 0, ptr or size not granule aligned,
     size > handle size, range not inside one reservation, any granule already mapped, the
     reservation's granule differs from the handle's device's (emulator limit):
     KCU_ERROR_INVALID_VALUE;
   - live mappings at max_maps, or the kernel refusing the mmap: KCU_ERROR_OUT_OF_MEMORY. */
kcu_result emu_cuMemMap(kcu_deviceptr ptr, size_t size, size_t offset,
                               kcu_mem_handle handle, unsigned long long flags)
{
    BEGIN(cuMemMap, F_INIT | F_CTX | F_STICKY);
    size_t slot;
    struct emu_handle *h = emu_handle_lookup_locked(handle, &slot);
    if (!h || offset != 0 || flags != 0 || size == 0) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    struct emu_dev *d = h->dev;
    struct emu_resv *rv = resv_find_range_locked((uintptr_t)ptr, size);
    if (ptr % d->gran || size % d->gran || size > h->ngran * d->gran || !rv ||
        rv->gran != d->gran) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    size_t first = ((uintptr_t)ptr - rv->base) / rv->gran, n = size / rv->gran;
    for (size_t i = 0; i < n; i++) {
        if (emu_ent_mapped(rv, first + i)) {
            r = KCU_ERROR_INVALID_VALUE;
            goto out;
        }
    }
    if (d->c.mappings >= d->max_maps) {
        klog_error("emulated device %d: %" PRIu64 " live mappings reached the bound of %zu "
                   "(below vm.max_map_count; set KVVM_EMU_MAX_MAPS or raise "
                   "vm.max_map_count): cuMemMap fails with out of memory",
                   d->ordinal, d->c.mappings, d->max_maps);
        r = KCU_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    for (size_t b = first / ENT_BLOCK; b <= (first + n - 1) / ENT_BLOCK; b++) {
        if (!rv->blk[b] && !(rv->blk[b] = calloc(ENT_BLOCK, sizeof(struct emu_ent)))) {
            r = KCU_ERROR_OUT_OF_MEMORY;
            goto out;
        }
    }
    off_t hoff;
    int hfd = emu_handle_fd(h, &hoff);
    void *m = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, hfd, hoff);
    if (m == MAP_FAILED) {
        klog_error("emulated device %d: mmap of a %zu-byte mapping failed: %s", d->ordinal,
                   size, strerror(errno));
        r = KCU_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    uint64_t id = ++emu.map_id;
    for (size_t i = 0; i < n; i++) {
        struct emu_ent *e = emu_ent_get(rv, first + i);
        *e = (struct emu_ent){ .h1 = (uint32_t)(slot + 1), .access =
                               KCU_MEM_ACCESS_FLAGS_PROT_NONE, .off = i, .map_id = id };
        KVVM_ASSERT(rv->blk_used[(first + i) / ENT_BLOCK] < ENT_BLOCK);
        rv->blk_used[(first + i) / ENT_BLOCK]++;
    }
    h->maps++;
    rv->live_maps++;
    d->c.mappings++;
    d->c.mapped_bytes += size;
    d->c.maps++;
out:
    return emu_leave(r);
}

/* Removes every mapping in granules [first, first + n) of rv (validated by the caller):
   table entries cleared, handles' map counts dropped (freeing released ones). A mapping is
   one entry per granule: its handle's count drops at its first entry, and a released
   handle is freed only after its last (the entries between still name it). */
void emu_unmap_entries_locked(struct emu_resv *rv, size_t first, size_t n)
{
    uint64_t last_id = 0;
    for (size_t i = first; i < first + n; i++) {
        struct emu_ent *e = emu_ent_get(rv, i);
        if (!e || !e->h1)
            continue;
        size_t slot = e->h1 - 1;
        struct emu_handle *h = &emu.handles[slot];
        struct emu_dev *d = h->dev;
        if (e->map_id != last_id) {
            last_id = e->map_id;
            KVVM_ASSERT(h->maps > 0 && rv->live_maps > 0 && d->c.mappings > 0);
            h->maps--;
            rv->live_maps--;
            d->c.mappings--;
            d->c.unmaps++;
        }
        KVVM_ASSERT(d->c.mapped_bytes >= rv->gran);
        d->c.mapped_bytes -= rv->gran;
        *e = (struct emu_ent){ 0 };
        size_t b = i / ENT_BLOCK;
        KVVM_ASSERT(rv->blk_used[b] > 0 && rv->blk[b]);  /* counts this block's mapped entries */
        if (--rv->blk_used[b] == 0) {
            free(rv->blk[b]);
            rv->blk[b] = NULL;
        }
        bool mapping_ends = i + 1 == first + n || emu_ent_map_id(rv, i + 1) != last_id;
        if (mapping_ends && !h->maps)
            emu_handle_maybe_free_locked(slot);
    }
}

/* [ptr, ptr + size) as whole granules inside one reservation, every granule mapped: *rvp,
   the first granule and their count; else KCU_ERROR_INVALID_VALUE (cuMemUnmap and
   cuMemSetAccess). */
static kcu_result mapped_range_locked(kcu_deviceptr ptr, size_t size, struct emu_resv **rvp,
                                      size_t *first, size_t *n)
{
    struct emu_resv *rv = resv_find_range_locked((uintptr_t)ptr, size);
    if (!rv || size == 0 || ptr % rv->gran || size % rv->gran)
        return KCU_ERROR_INVALID_VALUE;
    size_t f = ((uintptr_t)ptr - rv->base) / rv->gran, k = size / rv->gran;
    for (size_t i = f; i < f + k; i++)
        if (!emu_ent_mapped(rv, i))
            return KCU_ERROR_INVALID_VALUE;
    *rvp = rv;
    *first = f;
    *n = k;
    return KCU_SUCCESS;
}

/* KVVM_EMU_UNMAP_SPAN=0: one cuMemUnmap must not cover several mappings (a driver reading
   "the entire contiguous address range that was mapped" as one cuMemMap's range), so tests
   can run libkvvm's one-unmap-per-mapping fallback. Read at each call (tests set it before
   opening). */
static bool unmap_span_refused(void)
{
    const char *e = getenv("KVVM_EMU_UNMAP_SPAN");
    return e && !strcmp(e, "0");
}

/* The range must consist of whole mappings only (driver: "must be the entire contiguous
   address range that was mapped"); violations, misalignment, unmapped granules or a range
   outside one reservation: KCU_ERROR_INVALID_VALUE (the one documented argument error).
   Several adjacent whole mappings in one call are allowed, unless KVVM_EMU_UNMAP_SPAN=0. */
kcu_result emu_cuMemUnmap(kcu_deviceptr ptr, size_t size)
{
    BEGIN(cuMemUnmap, F_INIT | F_STICKY);
    struct emu_resv *rv;
    size_t first, n;
    if ((r = mapped_range_locked(ptr, size, &rv, &first, &n)))
        goto out;
    if ((first > 0 && emu_ent_map_id(rv, first - 1) == emu_ent_map_id(rv, first)) ||
        (first + n < rv->ngran &&
         emu_ent_map_id(rv, first + n) == emu_ent_map_id(rv, first + n - 1)) ||
        (n > 1 && emu_ent_map_id(rv, first) != emu_ent_map_id(rv, first + n - 1) &&
         unmap_span_refused())) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    void *m = mmap((void *)(uintptr_t)ptr, size, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    if (m == MAP_FAILED) {
        klog_error("emulated: replacing %zu mapped bytes at 0x%llx failed: %s", size, ptr,
                   strerror(errno));
        r = KCU_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    emu_unmap_entries_locked(rv, first, n);
out:
    return emu_leave(r);
}

static int prot_of(int access)
{
    switch (access) {
    case KCU_MEM_ACCESS_FLAGS_PROT_READ: return PROT_READ;
    case KCU_MEM_ACCESS_FLAGS_PROT_READWRITE: return PROT_READ | PROT_WRITE;
    default: return PROT_NONE;
    }
}

/* The access mapped granule i of rv has after cuMemSetAccess(desc, count): the last entry
   naming its memory's device, else the access it has now; *dev that device. */
static int access_after(struct emu_resv *rv, size_t i, const struct kcu_mem_access_desc *desc,
                        size_t count, struct emu_dev **dev)
{
    struct emu_ent *e = emu_ent_get(rv, i);
    struct emu_dev *d = emu.handles[e->h1 - 1].dev;
    int acc = (int)e->access;
    for (size_t k = 0; k < count; k++)
        if (desc[k].location.id == d->ordinal)
            acc = desc[k].flags;
    *dev = d;
    return acc;
}

/* Errors: desc NULL, count 0, a location that is not a device, flags not PROT_NONE / READ /
   READWRITE, misaligned range, a range not fully mapped inside one reservation:
   KCU_ERROR_INVALID_VALUE; a location id that names no device: KCU_ERROR_INVALID_DEVICE.
   Only the entry naming the memory's own device is recorded: peer access is not emulated,
   so a copy on another device's stream faults. mprotect refused: KCU_ERROR_OUT_OF_MEMORY. */
kcu_result emu_cuMemSetAccess(kcu_deviceptr ptr, size_t size,
                                     const struct kcu_mem_access_desc *desc, size_t count)
{
    BEGIN(cuMemSetAccess, F_INIT | F_STICKY);
    if (!desc || count == 0) {
        r = KCU_ERROR_INVALID_VALUE;
        goto out;
    }
    for (size_t k = 0; k < count; k++) {
        int f = desc[k].flags;
        if (desc[k].location.type != KCU_MEM_LOCATION_TYPE_DEVICE ||
            (f != KCU_MEM_ACCESS_FLAGS_PROT_NONE && f != KCU_MEM_ACCESS_FLAGS_PROT_READ &&
             f != KCU_MEM_ACCESS_FLAGS_PROT_READWRITE)) {
            r = KCU_ERROR_INVALID_VALUE;
            goto out;
        }
        if (!emu_dev_get_locked(desc[k].location.id)) {
            r = KCU_ERROR_INVALID_DEVICE;
            goto out;
        }
    }
    struct emu_resv *rv;
    size_t first, n;
    if ((r = mapped_range_locked(ptr, size, &rv, &first, &n)))
        goto out;
    /* Apply run by run (granules of one device and one resulting access). */
    size_t i = first;
    while (i < first + n) {
        struct emu_dev *d, *fd;
        int acc = access_after(rv, i, desc, count, &d);
        size_t j = i + 1;
        while (j < first + n && access_after(rv, j, desc, count, &fd) == acc && fd == d)
            j++;
        if (!d->opaque && mprotect((void *)(rv->base + i * rv->gran), (j - i) * rv->gran,
                                   prot_of(acc)) != 0) {
            klog_error("emulated device %d: mprotect failed: %s", d->ordinal,
                       strerror(errno));
            r = KCU_ERROR_OUT_OF_MEMORY;
            goto out;
        }
        for (size_t k = i; k < j; k++)
            emu_ent_get(rv, k)->access = (uint32_t)acc;
        d->c.set_access++;
        i = j;
    }
out:
    return emu_leave(r);
}

int emu_lookup(kcu_deviceptr va, kcu_mem_handle *handle, size_t *offset, int *access)
{
    int ret = -ENOENT;
    pthread_mutex_lock(&emu.lock);
    struct emu_resv *rv = emu_resv_find_locked((uintptr_t)va);
    if (rv) {
        size_t idx = ((uintptr_t)va - rv->base) / rv->gran;
        struct emu_ent *e = emu_ent_get(rv, idx);
        if (e && e->h1) {
            if (handle)
                *handle = emu_handle_value(e->h1 - 1);
            if (offset)
                *offset = e->off * rv->gran + ((uintptr_t)va - rv->base) % rv->gran;
            if (access)
                *access = (int)e->access;
            ret = 0;
        }
    }
    pthread_mutex_unlock(&emu.lock);
    return ret;
}
