/*
 * host/arena.c: the host arena (contract in host.h).
 *
 * Design: one anonymous mapping, registered in chunks, and a free stack of slot indices
 * (next[] + top) under one mutex: alloc pops, free pushes, both O(1). A byte per slot says
 * whether it is allocated, so a double free is refused instead of corrupting the stack.
 * Freed slots are pushed on top and reused first (they are likely still in cache and, for a
 * driver that pins lazily, already pinned).
 */
#include "host.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/assert.h"
#include "common/log.h"
#include "vmm/vmm.h"

struct host_chunk {
    void  *p;
    size_t bytes;
};

struct host_arena {
    struct vmm *v;               /* driver the chunks are registered with, or NULL */
    unsigned char *base;         /* mapping; NULL when 0 slots */
    size_t   page_size;
    size_t   map_bytes;          /* bytes mapped (slots * page_size) */
    uint32_t n_slots;
    struct host_chunk *chunks;   /* registered chunks */
    size_t   n_chunks;           /* chunks registered so far */

    pthread_mutex_t lock;        /* protects everything below */
    uint32_t *next;              /* free stack: next[i] = slot under i, UINT32_MAX = bottom */
    uint32_t  top;               /* top of the free stack, UINT32_MAX = empty */
    uint32_t  n_free;
    unsigned char *used;         /* used[i] = 1 while slot i is allocated */
};

int host_arena_open(struct vmm *v, const struct host_params *p, struct host_arena **out)
{
    int err;
    if (!p || !out || p->page_size == 0 || p->page_size % 4096 != 0)
        return -EINVAL;
    size_t n = p->budget / p->page_size;
    if (n >= UINT32_MAX)
        return -EINVAL;

    struct host_arena *a = calloc(1, sizeof(*a));
    if (!a)
        return -ENOMEM;
    a->v = v;
    a->page_size = p->page_size;
    a->n_slots = (uint32_t)n;
    a->map_bytes = n * p->page_size;
    a->top = UINT32_MAX;
    err = pthread_mutex_init(&a->lock, NULL);
    if (err) {
        err = -err;
        goto out_free;
    }
    if (n == 0) {
        *out = a;
        return 0;
    }

    a->next = malloc(n * sizeof(*a->next));
    a->used = calloc(n, 1);
    if (!a->next || !a->used) {
        err = -ENOMEM;
        goto out_tables;
    }
    /* Slot 0 on top, so a fresh arena hands out ascending addresses. */
    for (uint32_t i = 0; i < n; i++)
        a->next[i] = i + 1 < n ? i + 1 : UINT32_MAX;
    a->top = 0;
    a->n_free = (uint32_t)n;

    void *m = mmap(NULL, a->map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (m == MAP_FAILED) {
        klog_error("host arena: mmap of %zu bytes failed: %s", a->map_bytes, strerror(errno));
        err = -ENOMEM;
        goto out_tables;
    }
    a->base = m;
    (void)madvise(a->base, a->map_bytes, MADV_DONTFORK);

    if (v) {
        size_t chunk = p->chunk_bytes ? p->chunk_bytes : HOST_CHUNK_MAX;
        if (chunk > HOST_CHUNK_MAX)
            chunk = HOST_CHUNK_MAX;
        chunk -= chunk % p->page_size;
        if (chunk == 0)
            chunk = p->page_size;
        size_t nc = (a->map_bytes + chunk - 1) / chunk;
        a->chunks = calloc(nc, sizeof(*a->chunks));
        if (!a->chunks) {
            err = -ENOMEM;
            goto out_unmap;
        }
        for (size_t off = 0; off < a->map_bytes; off += chunk) {
            size_t len = a->map_bytes - off < chunk ? a->map_bytes - off : chunk;
            err = vmm_host_register(v, a->base + off, len);
            if (err && vmm_dead(v))
                goto out_unregister;        /* the context is lost: nothing to fall back on */
            if (err) {
                /* Any refusal — NOT_SUPPORTED / NOT_PERMITTED (confidential computing),
                   INVALID_VALUE (a driver that will not pin this mapping), OUT_OF_MEMORY
                   (a pinning limit) — leaves the arena pageable: the driver stages copies
                   from and to it, so they stay correct, only slower and never asynchronous
                   to the CPU. Registration is all or nothing: chunks already pinned go. */
                klog_warn("host arena: the driver refused to pin %zu bytes of host memory at "
                          "offset %zu (%s); the host tier uses pageable memory (swap copies "
                          "are staged, slower)", len, off, strerror(-err));
                while (a->n_chunks > 0)
                    vmm_host_unregister(v, a->chunks[--a->n_chunks].p);
                break;
            }
            a->chunks[a->n_chunks++] = (struct host_chunk){ a->base + off, len };
        }
    }
    klog_debug("host arena: %u slots of %zu bytes (%zu bytes), %zu chunk(s) registered",
               a->n_slots, a->page_size, a->map_bytes, a->n_chunks);
    *out = a;
    return 0;

out_unregister:
    while (a->n_chunks > 0)
        vmm_host_unregister(v, a->chunks[--a->n_chunks].p);
    free(a->chunks);
out_unmap:
    munmap(a->base, a->map_bytes);
out_tables:
    free(a->next);
    free(a->used);
    pthread_mutex_destroy(&a->lock);
out_free:
    free(a);
    return err;
}

void host_arena_close(struct host_arena *a)
{
    if (!a)
        return;
    KVVM_ASSERT(a->n_free <= a->n_slots);
    uint32_t used = a->n_slots - a->n_free;
    if (used)
        klog_warn("host arena: closing with %u slot(s) still allocated", used);
    while (a->n_chunks > 0)
        vmm_host_unregister(a->v, a->chunks[--a->n_chunks].p);
    free(a->chunks);
    if (a->base)
        munmap(a->base, a->map_bytes);
    free(a->next);
    free(a->used);
    pthread_mutex_destroy(&a->lock);
    free(a);
}

int host_slot_alloc(struct host_arena *a, host_slot *out)
{
    if (!a || !out)
        return -EINVAL;
    pthread_mutex_lock(&a->lock);
    uint32_t i = a->top;
    if (i == UINT32_MAX) {
        pthread_mutex_unlock(&a->lock);
        return -ENOMEM;
    }
    KVVM_ASSERT(i < a->n_slots && !a->used[i] && a->n_free > 0);   /* the list head is free */
    a->top = a->next[i];
    a->used[i] = 1;
    a->n_free--;
    pthread_mutex_unlock(&a->lock);
    out->idx = i;
    return 0;
}

int host_slot_free(struct host_arena *a, host_slot s)
{
    if (!a)
        return -EINVAL;
    pthread_mutex_lock(&a->lock);
    if (s.idx >= a->n_slots || !a->used[s.idx]) {
        pthread_mutex_unlock(&a->lock);
        klog_error("host arena: free of slot %u that is not allocated (of %u)", s.idx,
                   a->n_slots);
        return -EINVAL;
    }
    a->used[s.idx] = 0;
    a->next[s.idx] = a->top;
    a->top = s.idx;
    KVVM_ASSERT(a->n_free < a->n_slots);
    a->n_free++;
    pthread_mutex_unlock(&a->lock);
    return 0;
}

void *host_slot_ptr(const struct host_arena *a, host_slot s)
{
    if (!a || s.idx >= a->n_slots)
        return NULL;
    return a->base + (size_t)s.idx * a->page_size;
}

host_slot host_slot_of(const struct host_arena *a, const void *p)
{
    const unsigned char *c = p;
    if (!a || !a->base || c < a->base || c >= a->base + a->map_bytes)
        return HOST_SLOT_NONE;
    return (host_slot){ (uint32_t)((size_t)(c - a->base) / a->page_size) };
}

int host_slot_allocated(const struct host_arena *a, host_slot s)
{
    if (!a || s.idx >= a->n_slots)
        return 0;
    pthread_mutex_lock((pthread_mutex_t *)&a->lock);
    int u = a->used[s.idx];
    pthread_mutex_unlock((pthread_mutex_t *)&a->lock);
    return u;
}

size_t host_page_size(const struct host_arena *a) { return a->page_size; }
size_t host_slots_total(const struct host_arena *a) { return a->n_slots; }
size_t host_arena_bytes(const struct host_arena *a) { return a->map_bytes; }
void *host_arena_base(const struct host_arena *a) { return a->base; }
int host_arena_registered(const struct host_arena *a) { return a->n_chunks > 0; }

size_t host_slots_free(const struct host_arena *a)
{
    pthread_mutex_lock((pthread_mutex_t *)&a->lock);
    size_t f = a->n_free;
    pthread_mutex_unlock((pthread_mutex_t *)&a->lock);
    return f;
}

size_t host_slots_used(const struct host_arena *a)
{
    return a->n_slots - host_slots_free(a);
}
