/*
 * host/host.h: the pinned host tier's memory — one arena cut into page-sized slots.
 *
 * Contract:
 *  - One arena per context, made once at open: anonymous memory of floor(budget / page_size)
 *    slots (never more than the budget), registered with the driver (vmm_host_register,
 *    i.e. cuMemHostRegister on CUDA; the emulated device pins it with mlock, best effort) in
 *    chunks of at most HOST_CHUNK_MAX bytes, each chunk a whole number of slots. On Linux
 *    the memory is also madvise(MADV_DONTFORK)ed so a fork of the caller does not copy it.
 *    When mlock fails (RLIMIT_MEMLOCK too low) the emulated driver logs one clear warning
 *    naming the limit and the memory works unlocked; registration does not fail for it.
 *  - A slot is named by a typed id (host_slot), never by a bare integer, so host slots
 *    cannot be mixed up with disk slots or page ids. Slot i covers
 *    [base + i * page_size, base + (i + 1) * page_size); page_size-aligned relative to base,
 *    and base is aligned to at least 4096 bytes (suitable for O_DIRECT I/O).
 *  - Allocation and free are O(1) (a free stack) and thread-safe (one mutex per arena, held
 *    only for the push/pop). Allocation never exceeds the arena: -ENOMEM when empty.
 *    A double free or a forged id is refused (-EINVAL) and logged, never corrupts the stack.
 *  - The arena never touches slot contents (no zeroing on free): the layer above scrubs
 *    when KVVM_F_SCRUB says so.
 *  - It knows nothing of pages, sequences, disks or policy (those are paging/ and swap/).
 *    disk/ (engine_uring.c) registers the arena's whole range with io_uring as fixed buffers
 *    (host_arena_base / host_arena_bytes).
 */
#ifndef KVVM_HOST_HOST_H
#define KVVM_HOST_HOST_H

#include <stddef.h>
#include <stdint.h>

struct vmm;
struct host_arena;

/* A host slot id. HOST_SLOT_NONE names no slot. */
typedef struct { uint32_t idx; } host_slot;
#define HOST_SLOT_NONE ((host_slot){ UINT32_MAX })
static inline int host_slot_valid(host_slot s) { return s.idx != UINT32_MAX; }

/* Largest chunk registered with the driver in one call (also io_uring's 1 GiB bound). */
#define HOST_CHUNK_MAX ((size_t)1 << 30)

struct host_params {
    size_t budget;       /* bytes; slots = budget / page_size (0 slots is allowed: no tier) */
    size_t page_size;    /* bytes per slot; a multiple of 4096 */
    size_t chunk_bytes;  /* registration chunk; 0 = HOST_CHUNK_MAX; rounded down to slots */
};

/* Makes the arena and registers it with v's driver (v may be NULL: no registration, used by
   tools measuring the disk tier alone).
   -EINVAL bad params (page_size not a multiple of 4096, slot count over UINT32_MAX - 1),
   -ENOMEM the memory could not be mapped, -EIO the driver's context is lost. A driver that
   refuses the registration, whatever its error, is not a failure: the arena stays pageable
   (host_arena_registered() 0), with one warning. Nothing is left behind on failure. */
int  host_arena_open(struct vmm *v, const struct host_params *p, struct host_arena **out);
/* Unregisters and unmaps. Slots still allocated are logged as leaks (count returned by
   host_slots_used before closing is the caller's check). NULL is a no-op. */
void host_arena_close(struct host_arena *a);

/* O(1). -ENOMEM no free slot. */
int  host_slot_alloc(struct host_arena *a, host_slot *out);
/* O(1). -EINVAL not an allocated slot of this arena (logged). */
int  host_slot_free(struct host_arena *a, host_slot s);
/* The slot's bytes; NULL for an id out of range. Does not check that s is allocated. */
void *host_slot_ptr(const struct host_arena *a, host_slot s);
/* The slot covering p (any byte inside it); HOST_SLOT_NONE when p is outside the arena. */
host_slot host_slot_of(const struct host_arena *a, const void *p);
/* 1 if s is currently allocated, 0 if free or out of range. */
int  host_slot_allocated(const struct host_arena *a, host_slot s);

size_t host_page_size(const struct host_arena *a);
size_t host_slots_total(const struct host_arena *a);
size_t host_slots_free(const struct host_arena *a);
size_t host_slots_used(const struct host_arena *a);   /* total - free */
void  *host_arena_base(const struct host_arena *a);   /* NULL when 0 slots */
size_t host_arena_bytes(const struct host_arena *a);  /* slots * page_size */
/* 1 when every chunk is registered with a driver, 0 when the arena is plain memory. */
int    host_arena_registered(const struct host_arena *a);

#endif
