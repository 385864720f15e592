/*
 * core/storeq.c: the prefix cache's side of the shared store (docs/design.md "The shared
 * store"): the queue, staging and thread of the list's entries tier (core/tiers.h,
 * CORE_TIER_ENTRIES; the built-in one is store/, through core/tier_store.c). Contract in
 * core.h ("storeq.c"). It calls the tier's operations (struct core_entry_ops: put,
 * get_start / get_first / get_finish, lookup, del, reap) through the entry, never a store/
 * function or header (tests/tool_headers.sh checks that only core/tier_store.c does).
 *
 * Why this is not paging's transfers. paging moves a sequence's pages between levels
 * (struct pg_tier_ops: a slot per page, its page descriptor's state, completions reaped
 * under the context lock, one page at a time). The store holds entries: whole published
 * blocks (n_regions pages) named (namespace, key), shared with other processes, never a
 * sequence's pages; a page is copied out of the device into a staging slot and stays
 * where it was. So its staging (a slot per entry, not per page), its fences (the copies'
 * on the copy stream, not a page transfer's), and its thread (batches written without the
 * context lock, bounded by store_timeout_ms) are this tier's completion mechanism, kept
 * here, behind the entry.
 *
 * Write-through. kvvm_prefix_publish (the engine's thread, context lock held) takes one
 * staging slot per new entry from a pinned host buffer allocated at open (one block =
 * n_regions pages per slot), enqueues on paging's copy stream — ordered after the engine's
 * work on the sequence — the copies of the block's device pages into it, records a fence
 * behind them and queues the batch; it never waits for the store. The copies read the
 * entry's pages, mapped at a block of paging's copy run (one per staging slot, reserved at
 * open) and held until the copy completed, never the publisher's window: a copy-on-write,
 * free, discard or swap of the publisher, on this thread or another, cannot change or
 * unmap what they read (paging_blocks_copy_out; issue 31). The store thread (a
 * swap_worker with the device context current) takes the batches in order, waits for each
 * one's fence (the bytes are then final and in host memory), writes its entries with one
 * pipelined put, and gives the slots back. A sequence not resident, a block not
 * wholly on the device or a capturing engine stream: those entries are not written
 * (counted in errors: the store misses them, nothing else changes).
 *
 * Back-pressure. The slots are store_queue_bytes in whole blocks (0: a read-only client,
 * nothing queued). A publish that finds too few free takes the oldest queued writes' slots
 * (take_back_locked; counted in dropped), never the batch being written; with every slot
 * in that batch its own new entries are the ones dropped. It never waits.
 *
 * A store that fails every item of a put with -ETIMEDOUT or -ENOTCONN (stopped, down)
 * makes the thread give up the batches queued behind it (counted): so kvvm_sync,
 * kvvm_prefix_drop and kvvm_close, which wait for the queue, wait for one failing request
 * at most, not one per batch. A put that failed only some items (a cluster's master down,
 * the others answering) gives up nothing: the next batches' items for the healthy masters
 * are written, those for the one down fail fast (its connection's backoff).
 *
 * A drop cancels the queued puts of what it removes and waits for the batch being written,
 * so a dropped entry is never written back after the store delete.
 *
 * Reads (lookup, attach's fetch) run on the caller's thread WITHOUT the context lock: the
 * store bounds each request by store_timeout_ms, and the context stays usable by other
 * threads meanwhile.
 *
 * A fetch LENDS its buffer to the store (a get with a lend, struct sq_lend), so that the file
 * store reads straight into it (O_DIRECT, no copy): a get that times out may leave reads
 * into it in flight, which no one can stop, so the store then keeps the buffer until they
 * completed, and neither the attach (storeq_fetch_free: a buffer of its own is freed by the
 * lend's last holder) nor the next attach (the kept staging: fstage_lent) nor kvvm_trim
 * frees or reuses it before; kvvm_close waits for them (the entry's reap), as the store's own
 * close did. The blocks the attach uses are the ones whose reads completed: disjoint from
 * those still in flight. A put needs no lend: a late write only reads the slots.
 *
 * A fetch runs in two halves (storeq_fetch_start / storeq_fetch_finish): the first request
 * is sent (the entry's get_start) and the caller premaps dst's pages under the context lock while
 * it is in flight (prefix_calls.c), then waits for it; later chunks run whole.
 *
 * Lock order: kvvm.lock -> q->mu (the store's own lock is taken without q->mu, by the
 * store thread and the callers alike).
 */
#include "core.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "common/assert.h"
#include "common/log.h"
#include "core/call.h"
#include "swap/worker.h"

/* Staging: store_queue_bytes rounded down to whole blocks, at most SQ_SLOTS_MAX slots. An
   attach's fetch reads by chunks of at most SQ_STAGE_BYTES. */
#define SQ_STAGE_BYTES ((size_t)64 << 20)
#define SQ_SLOTS_MAX 256u
#define SQ_HUGE_BYTES ((size_t)2 << 20)   /* attach's staging: its alignment, huge pages */
#define SQ_NO_SLOT UINT32_MAX         /* an entry whose slot a later publish took */

/* One publish's entries on their way to the store. */
struct sq_batch {
    struct sq_batch *next;        /* queue order (under q->mu) */
    uint64_t ns;
    vmm_fence fence;              /* recorded on the copy stream after the copies */
    uint32_t n;                   /* entries */
    uint32_t *slot;               /* n staging slots (SQ_NO_SLOT: taken back by a later
                                     publish, the entry cancelled; under q->mu) */
    uint8_t *cancel;              /* n flags: 1 dropped before written (under q->mu while
                                     queued; the thread's once taken) */
    kvvm_key *keys;               /* n keys */
};

struct storeq {
    struct vmm *v;
    const struct core_entry_ops *ops; /* the entries tier's (core_tiers_entries) */
    void *layer;                  /* its layer (not owned) */
    uint32_t n_regions;           /* the layout: a value is n_regions pages of page_size */
    size_t page_size;
    size_t block_bytes;           /* n_regions * page_size: one value's payload */
    uint8_t *stage;               /* n_slots * block_bytes, pinned when the driver allows */
    bool stage_pinned;
    uint32_t n_slots;
    pthread_mutex_t mu;           /* guards everything below and w's flags */
    pthread_cond_t cv;            /* a batch done (the worker's end of round, and ours) */
    bool stop;
    uint32_t *free_slots, n_free;
    struct sq_batch *head, *tail; /* queued, not taken */
    struct sq_batch *cur;         /* the batch the thread writes now */
    struct swap_worker w;
    /* counters (atomic) */
    uint64_t gave_up;             /* entries not written: not on device, store down, no memory */
    uint64_t dropped;             /* entries the queue's bound dropped (store_dropped) */
    uint64_t hit_blocks;          /* blocks lookups found in the store */
    /* attach's staging (see "Attach's staging" below): kept from attach to attach */
    uint8_t *fstage;              /* fstage_bytes, pinned when the driver allows, touched;
                                     NULL until an attach needs it, and after kvvm_trim */
    size_t fstage_bytes;          /* its size (atomic: read by storeq_counters) */
    size_t fstage_cap;            /* the most it grows to (0: never used, no fence) */
    bool fstage_pinned;
    bool fstage_busy;             /* an attach reads into it or writes from it (under q->mu) */
    bool fstage_fenced;           /* fstage_fence follows its last copies to the device */
    vmm_fence fstage_fence;
    bool fstage_lent;             /* lent to the store (struct sq_lend), which may still read
                                     into it: no taker, no trim until false (atomic: cleared
                                     by the lend's release, on any thread) */
    uint32_t lent;                /* sq_lend records not released (atomic): storeq_destroy
                                     has the store give theirs back (reap) first */
};

/* A fetch's buffer lent to the store (a get with a lend), so that the file store reads into it
   with O_DIRECT, no copy. A get that times out with such reads in flight returns with the
   buffer kept: the kernel may write it until they complete, which a hung disk or mount
   makes as late as it likes, so the buffer has two holders, the fetch (until
   storeq_fetch_free) and the store (until its done; a fetch whose get did not keep it drops
   that hold itself). The last one releases it: the fetch's own buffer freed, or the kept
   staging free for the next taker again. Atomics and free only: done runs on the thread
   that reaps (another attach's get, or storeq_destroy's store_reap). */
struct sq_lend {
    struct storeq *q;
    uint8_t *buf;                 /* the fetch's own buffer, or NULL: the kept staging */
    int refs;                     /* holders (atomic): 2 at first */
};

#define SQ_ADD(q, f, n) __atomic_fetch_add(&(q)->f, (n), __ATOMIC_RELAXED)

static void batch_free(struct storeq *q, struct sq_batch *b)
{
    vmm_fence_destroy(q->v, &b->fence);
    free(b);
}

/* Back to the free list (q->mu held). */
static void slots_give_locked(struct storeq *q, const uint32_t *slot, uint32_t n)
{
    KVVM_ASSERT(q->n_free + n <= q->n_slots);   /* slots taken, given back once */
    for (uint32_t i = 0; i < n; i++)
        if (slot[i] != SQ_NO_SLOT)
            q->free_slots[q->n_free++] = slot[i];
}

/* Marks every batch queued (not taken) given up: the store stopped answering. */
static void give_up_queued_locked(struct storeq *q)
{
    for (struct sq_batch *b = q->head; b; b = b->next)
        for (uint32_t i = 0; i < b->n; i++)
            if (!b->cancel[i]) {
                b->cancel[i] = 1;
                SQ_ADD(q, gave_up, 1);
            }
}

/* Writes batch b (taken: no one else touches it) once its bytes are final. */
static void batch_put(struct storeq *q, struct sq_batch *b)
{
    if (vmm_fence_wait(q->v, &b->fence)) {
        for (uint32_t i = 0; i < b->n; i++)  /* the copies failed: the bytes are not known */
            SQ_ADD(q, gave_up, !b->cancel[i]);
        return;
    }
    struct core_entry_item *it = calloc(b->n, sizeof *it);
    struct iovec *iov = calloc(b->n, sizeof *iov);
    size_t k = 0;
    for (uint32_t i = 0; it && iov && i < b->n; i++) {
        if (b->cancel[i])
            continue;
        KVVM_ASSERT(b->slot[i] < q->n_slots);   /* a slot taken back cancels its entry */
        iov[k] = (struct iovec){ q->stage + (size_t)b->slot[i] * q->block_bytes, q->block_bytes };
        it[k] = (struct core_entry_item){ .key = &b->keys[i], .iov = &iov[k], .iovcnt = 1 };
        k++;
    }
    if (!it || !iov)
        SQ_ADD(q, gave_up, b->n);
    else if (k)
        (void)q->ops->put(q->layer, b->ns, it, k);
    bool down = it && iov && k;     /* every item: the store, not one node, is down */
    for (size_t i = 0; down && i < k; i++)
        down = it[i].status == -ETIMEDOUT || it[i].status == -ENOTCONN;
    free(it);
    free(iov);
    if (down) {
        pthread_mutex_lock(&q->mu);
        give_up_queued_locked(q);
        pthread_mutex_unlock(&q->mu);
    }
}

/* The store thread's round: every queued batch, in order. */
static bool sq_round(void *arg)
{
    struct storeq *q = arg;
    bool did = false;
    pthread_mutex_lock(&q->mu);
    while (q->head) {
        struct sq_batch *b = q->head;
        q->head = b->next;
        if (!q->head)
            q->tail = NULL;
        KVVM_ASSERT(!q->cur);           /* one batch written at a time */
        q->cur = b;
        pthread_mutex_unlock(&q->mu);
        batch_put(q, b);
        pthread_mutex_lock(&q->mu);
        q->cur = NULL;
        slots_give_locked(q, b->slot, b->n);
        pthread_cond_broadcast(&q->cv);
        pthread_mutex_unlock(&q->mu);
        batch_free(q, b);
        pthread_mutex_lock(&q->mu);
        did = true;
    }
    pthread_mutex_unlock(&q->mu);
    return did;
}

uint32_t storeq_stage_slots(size_t block_bytes, size_t queue_bytes)
{
    size_t n = queue_bytes / block_bytes;
    return (uint32_t)(n > SQ_SLOTS_MAX ? SQ_SLOTS_MAX : n);
}

static int stage_alloc(struct storeq *q)
{
    size_t bytes = (size_t)q->n_slots * q->block_bytes;
    void *p = NULL;
    if (!bytes)
        return 0;                   /* no write queued: a read-only client */
    if (!vmm_host_alloc(q->v, bytes, &p)) {
        q->stage_pinned = true;
    } else {
        klog_info("kvvm: the store's staging buffer (%zu bytes) is not pinned: the driver "
                  "refused it; write-through copies are synchronous", bytes);
        p = malloc(bytes);
    }
    q->stage = p;
    q->free_slots = malloc(q->n_slots * sizeof *q->free_slots);
    if (!q->stage || !q->free_slots)
        return -ENOMEM;
    for (uint32_t i = 0; i < q->n_slots; i++)
        q->free_slots[i] = q->n_slots - 1 - i;
    q->n_free = q->n_slots;
    return 0;
}

/* Attach's staging (see "Attach's staging" below): nothing at open, only its cap (the
   blocks a sequence holds, max_blocks, at most SQ_STAGE_BYTES) and its fence; without the
   fence (refused) attaches allocate per call, as before: logged, never a failed open. */
static void fstage_init(struct storeq *q, uint64_t max_blocks)
{
    uint64_t want = max_blocks * q->block_bytes;
    q->fstage_cap = want < SQ_STAGE_BYTES ? (size_t)want : SQ_STAGE_BYTES / q->block_bytes *
                    q->block_bytes;
    if (q->fstage_cap && vmm_fence_create(q->v, &q->fstage_fence)) {
        klog_info("kvvm: no fence for the store's attach staging: each attach allocates "
                  "its own buffer");
        q->fstage_cap = 0;
    }
}

/* Frees the staging's memory (its taker's, or at close): its copies waited for first. */
static void fstage_release(struct storeq *q)
{
    if (!q->fstage)
        return;
    if (q->fstage_fenced)
        (void)vmm_fence_wait(q->v, &q->fstage_fence);   /* never free under a copy */
    q->fstage_fenced = false;
    if (q->fstage_pinned)
        vmm_host_unregister(q->v, q->fstage);
    free(q->fstage);
    q->fstage = NULL;
    q->fstage_pinned = false;
    __atomic_store_n(&q->fstage_bytes, 0, __ATOMIC_RELAXED);
}

/* The taker's staging made at least `bytes` long (a whole number of blocks, at most the
   cap): a power of two of blocks, so that growing attaches reallocate a few times only.
   2 MiB aligned and advised for transparent huge pages (a 16 MiB staging is 8 pages to
   fault in and to map, not 4,096), touched, then pinned (registered) where the driver
   allows (else pageable: the copies to the device are then synchronous), so that no attach
   pays a page fault for it. false: no memory (the attach allocates its own). */
static bool fstage_grow(struct storeq *q, size_t bytes)
{
    if (q->fstage && q->fstage_bytes >= bytes)
        return true;
    size_t blocks = 1, need = (bytes + q->block_bytes - 1) / q->block_bytes;
    while (blocks < need)
        blocks *= 2;
    size_t size = blocks * q->block_bytes < q->fstage_cap ? blocks * q->block_bytes
                                                          : q->fstage_cap;
    KVVM_ASSERT(size >= bytes);     /* bytes <= the cap, checked by the taker */
    fstage_release(q);
    void *p = NULL;
    if (posix_memalign(&p, SQ_HUGE_BYTES, size)) {
        klog_info("kvvm: no memory for the store's attach staging (%zu bytes): this attach "
                  "allocates its own", size);
        return false;
    }
    if (size >= SQ_HUGE_BYTES)
        (void)madvise(p, size, MADV_HUGEPAGE);   /* advice: refused, 4 KiB pages */
    for (size_t off = 0; off < size; off += 4096)
        ((volatile uint8_t *)p)[off] = 0;   /* faulted in now, not by the attach's reads */
    q->fstage_pinned = !vmm_host_register(q->v, p, size);   /* a refusal: logged */
    q->fstage = p;
    __atomic_store_n(&q->fstage_bytes, size, __ATOMIC_RELAXED);
    return true;
}

static void stage_free(struct storeq *q)
{
    fstage_release(q);
    if (q->fstage_cap)
        vmm_fence_destroy(q->v, &q->fstage_fence);
    if (q->stage_pinned)
        vmm_host_free(q->v, q->stage);
    else
        free(q->stage);
    free(q->free_slots);
}

int storeq_create(kvvm *kv, struct storeq **out)
{
    *out = NULL;
    void *layer;
    const struct core_tier *e = core_tiers_entries(kv, &layer);
    if (!e)
        return 0;
    struct core_tier_policy row = { 0 };  /* no policy: nothing queued, a read-only client */
    if (e->policy)
        e->policy(kv, &row);
    struct storeq *q = calloc(1, sizeof *q);
    if (!q)
        return -ENOMEM;
    q->v = kv->v;
    q->ops = e->ent;
    q->layer = layer;
    q->n_regions = kv->cfg.n_regions;
    q->page_size = kv->cfg.page_size;
    q->block_bytes = (size_t)kv->cfg.n_regions * kv->cfg.page_size;
    q->n_slots = storeq_stage_slots(q->block_bytes, (size_t)row.queue_bytes);
    if (!q->n_slots && row.queue_bytes)
        klog_warn("kvvm: store_queue_bytes %zu is less than one entry (%zu bytes): nothing "
                  "is written to the store", (size_t)row.queue_bytes, q->block_bytes);
    int rc = stage_alloc(q);
    if (rc)
        goto out_stage;
    uint64_t tpb = kv->cfg.page_size / kv->cfg.bytes_per_token;
    fstage_init(q, tpb ? kv->cfg.max_tokens / tpb : 0);
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->w = (struct swap_worker){ .name = "store", .v = kv->v, .make_current = true,
                                 .round = sq_round, .arg = q, .mu = &q->mu, .cv = &q->cv,
                                 .stop = &q->stop };
    if ((rc = swap_worker_start(&q->w)))
        goto out_lock;
    /* one empty round: the thread's own driver calls (context, capture mode) are made
       before open returns, not during a later call of the engine's */
    pthread_mutex_lock(&q->mu);
    q->w.wake = true;
    pthread_cond_broadcast(&q->cv);
    while (q->w.wake || q->w.active)
        pthread_cond_wait(&q->cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
    *out = q;
    return 0;
out_lock:
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
out_stage:
    stage_free(q);
    free(q);
    return rc;
}

void storeq_wait_idle(struct storeq *q)
{
    if (!q)
        return;
    pthread_mutex_lock(&q->mu);
    while (q->head || q->cur)
        pthread_cond_wait(&q->cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
}

void storeq_destroy(struct storeq *q)
{
    if (!q)
        return;
    storeq_wait_idle(q);                /* bounded: see "A store that fails a put" */
    swap_worker_stop(&q->w);
    if (__atomic_load_n(&q->lent, __ATOMIC_ACQUIRE))
        q->ops->reap(q->layer);         /* a timed-out get's reads into a fetch buffer: as
                                           the tier's close would wait for them, later */
    KVVM_ASSERT(!__atomic_load_n(&q->lent, __ATOMIC_ACQUIRE));   /* every lent buffer back */
    KVVM_ASSERT(q->n_free == q->n_slots);   /* idle: every batch gave its slots back */
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
    stage_free(q);
    free(q);
}

/* The queue's bound: frees up to want slots by dropping the oldest queued writes (never
   the batch being written: the store reads its slots), counted; a slot whose entry was
   cancelled already is taken first, uncounted. The dropped entries' copies may still be
   on the copy stream: the new copies into their slots are queued behind them on the same
   stream, so the bytes a batch writes are its own. */
static void take_back_locked(struct storeq *q, uint32_t want)
{
    for (int pass = 0; pass < 2 && want; pass++)
        for (struct sq_batch *b = q->head; b && want; b = b->next)
            for (uint32_t i = 0; i < b->n && want; i++) {
                if (b->slot[i] == SQ_NO_SLOT || (pass == 0 && !b->cancel[i]))
                    continue;
                if (!b->cancel[i])
                    SQ_ADD(q, dropped, 1);
                b->cancel[i] = 1;
                KVVM_ASSERT(q->n_free < q->n_slots);  /* a slot held by a queued batch */
                q->free_slots[q->n_free++] = b->slot[i];
                b->slot[i] = SQ_NO_SLOT;
                want--;
            }
}

/* A batch of at most n entries, its slots taken (q->mu), the oldest queued writes dropped
   for them: NULL when no slot can be had (all in the write under way) or no memory. */
static struct sq_batch *batch_new(struct storeq *q, uint64_t ns, uint32_t n)
{
    struct sq_batch *b = calloc(1, sizeof *b + n * (sizeof *b->slot + sizeof *b->cancel +
                                                    sizeof *b->keys));
    if (!b) {
        SQ_ADD(q, gave_up, n);
        return NULL;
    }
    b->keys = (kvvm_key *)(b + 1);
    b->slot = (uint32_t *)(b->keys + n);
    b->cancel = (uint8_t *)(b->slot + n);
    b->ns = ns;
    if (vmm_fence_create(q->v, &b->fence)) {
        free(b);
        SQ_ADD(q, gave_up, n);
        return NULL;
    }
    pthread_mutex_lock(&q->mu);
    if (n > q->n_free)
        take_back_locked(q, n - q->n_free);
    b->n = n < q->n_free ? n : q->n_free;
    for (uint32_t i = 0; i < b->n; i++)
        b->slot[i] = q->free_slots[--q->n_free];
    SQ_ADD(q, dropped, n - b->n);   /* the bound is all in the write under way: ours */
    pthread_mutex_unlock(&q->mu);
    if (!b->n) {
        batch_free(q, b);
        return NULL;
    }
    return b;
}

/* Gives back batch b before it was queued (its copies done or never queued). */
static void batch_drop(struct storeq *q, struct sq_batch *b)
{
    pthread_mutex_lock(&q->mu);
    slots_give_locked(q, b->slot, b->n);
    pthread_mutex_unlock(&q->mu);
    batch_free(q, b);
}

uint32_t storeq_publish(kvvm *kv, kvvm_seq s, uint64_t ns, const kvvm_key *keys, size_t n,
                        const uint8_t *was)
{
    struct storeq *q = kv->sq;
    uint32_t m = 0;
    for (size_t i = 0; q && q->n_slots && i < n; i++)
        m += !was[i];
    if (!m)
        return 0;                   /* nothing new, or a read-only client */
    struct sq_batch *b = NULL;
    uint32_t *blk = NULL;
    void **dst = NULL;
    int *status = NULL;
    if (stream_check(kv) || !paging_seq_resident(kv->pg, s))
        goto out_gave_up;
    if (!(b = batch_new(q, ns, m)))
        return 0;                   /* counted: dropped (the bound) or given up (memory) */
    blk = malloc(b->n * sizeof *blk);
    dst = malloc(b->n * sizeof *dst);
    status = malloc(b->n * sizeof *status);
    if (!blk || !dst || !status)
        goto out_drop;
    for (uint32_t i = 0, j = 0; j < b->n; i++)
        if (!was[i]) {
            blk[j] = i;
            memcpy(b->keys[j].bytes, keys[i].bytes, sizeof b->keys[j].bytes);
            dst[j] = q->stage + (size_t)b->slot[j] * q->block_bytes;
            j++;
        }
    int rc = paging_blocks_copy_out(kv->pg, s, blk, b->n, dst, status);
    if (!rc)
        rc = paging_copy_fence_record(kv->pg, &b->fence);
    if (rc) {
        (void)vmm_stream_sync(kv->v, paging_copy_stream(kv->pg));   /* never free under them */
        goto out_drop;
    }
    uint32_t k = 0;
    for (uint32_t i = 0; i < b->n; i++)
        b->cancel[i] = status[i] != 0;  /* not on the device: not written */
    for (uint32_t i = 0; i < b->n; i++)
        k += !b->cancel[i];
    SQ_ADD(q, gave_up, m - k);
    pthread_mutex_lock(&q->mu);
    KVVM_ASSERT(!b->next && !q->head == !q->tail);
    if (q->tail)
        q->tail->next = b;
    else
        q->head = b;
    q->tail = b;
    q->w.wake = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    free(blk);
    free(dst);
    free(status);
    return k;
out_drop:
    batch_drop(q, b);
out_gave_up:
    SQ_ADD(q, gave_up, m);
    free(blk);
    free(dst);
    free(status);
    return 0;
}

/* Cancels the queued puts of (ns, keys[0..n)) (keys NULL: all of ns) and waits for the
   batch being written when it is of ns. */
static void forget(struct storeq *q, uint64_t ns, const kvvm_key *keys, size_t n)
{
    pthread_mutex_lock(&q->mu);
    for (struct sq_batch *b = q->head; b; b = b->next) {
        if (b->ns != ns)
            continue;
        for (uint32_t i = 0; i < b->n; i++)
            for (size_t j = 0; !b->cancel[i] && j < (keys ? n : 1); j++)
                if (!keys || !memcmp(b->keys[i].bytes, keys[j].bytes, sizeof keys[j].bytes))
                    b->cancel[i] = 1;
    }
    while (q->cur && q->cur->ns == ns)
        pthread_cond_wait(&q->cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
}

void storeq_drop(struct storeq *q, uint64_t ns, const kvvm_key *keys, size_t n)
{
    if (!q || (keys && !n))
        return;
    forget(q, ns, keys, n);
    (void)q->ops->del(q->layer, ns, keys, keys ? n : 0);   /* keys NULL: all of ns */
}

size_t storeq_lookup(struct storeq *q, uint64_t ns, const kvvm_key *keys, size_t n,
                     uint8_t *where)
{
    if (!q || !n)
        return 0;
    uint8_t *present = calloc(n, 1);
    size_t j = 0;
    if (present && q->ops->lookup(q->layer, ns, keys, n, present) > 0)
        while (j < n && present[j])
            j++;
    for (size_t i = 0; where && i < j; i++)
        where[i] = KVVM_TIER_STORE;
    SQ_ADD(q, hit_blocks, j);
    free(present);
    return j;
}

/* ---- attach's fetch ------------------------------------------------------------------- */

/* f's buffer as lent to the store (both holds taken), or NULL without memory (the gets
   then read through the store's own staging: a copy, nothing left in flight). */
static struct sq_lend *lend_new(struct storeq *q, const struct storeq_fetch *f)
{
    struct sq_lend *l = malloc(sizeof *l);
    if (!l)
        return NULL;
    *l = (struct sq_lend){ q, f->staged ? NULL : f->buf, 2 };
    __atomic_fetch_add(&q->lent, 1, __ATOMIC_RELAXED);
    if (f->staged)                  /* the fetch holds it (fstage_busy): no one else looks */
        __atomic_store_n(&q->fstage_lent, true, __ATOMIC_RELAXED);
    return l;
}

/* Drops one hold of the lent buffer (the store's done, or the fetch's own); the last one
   releases it. */
static void lend_put(void *arg)
{
    struct sq_lend *l = arg;
    int left = __atomic_sub_fetch(&l->refs, 1, __ATOMIC_ACQ_REL);
    KVVM_ASSERT(left >= 0);         /* two holds, each dropped once */
    if (left)
        return;
    struct storeq *q = l->q;
    if (l->buf)
        free(l->buf);
    else                            /* the reads into it are over: takers may have it */
        __atomic_store_n(&q->fstage_lent, false, __ATOMIC_RELEASE);
    free(l);
    __atomic_fetch_sub(&q->lent, 1, __ATOMIC_RELEASE);   /* last: destroy may free q */
}

/* Blocks per get request: a chunk of at most SQ_STAGE_BYTES (one block at least), each its
   own request and deadline. */
static size_t fetch_chunk(const struct storeq *q)
{
    size_t c = SQ_STAGE_BYTES / q->block_bytes;
    return c ? c : 1;
}

/* Where block j's page of region r lies in f's buffer: chunk by chunk, region-major within
   a chunk (so that one region's blocks of a chunk are contiguous). */
static uint8_t *fetch_at(const struct storeq *q, const struct storeq_fetch *f, size_t j,
                         uint32_t r)
{
    size_t c0 = j / f->chunk * f->chunk;
    size_t mc = f->m - c0 < f->chunk ? f->m - c0 : f->chunk;
    return f->buf + c0 * q->block_bytes + ((size_t)r * mc + (j - c0)) * q->page_size;
}

/* One chunk's request (blocks [c0, c0 + mc) of f), from its start to its finish: what the
   tier reads while it is in flight (core_entry_ops get_start's contract). */
struct sq_req {
    struct core_entry_get g;      /* the tier's record of the get in flight */
    struct core_entry_lend sl;    /* the buffer lent (the get points here), or unused */
    size_t c0, mc;
    struct core_entry_item *it;   /* mc items */
    struct iovec *iov;            /* mc * n_regions */
    kvvm_key *k;                  /* mc keys */
};

static void req_free(struct sq_req *r)
{
    if (!r)
        return;
    free(r->it);
    free(r->iov);
    free(r->k);
    free(r);
}

/* Starts chunk [c0, c0 + mc)'s request, its buffer lent as l (NULL: not lent). NULL: no
   memory (nothing sent). */
static struct sq_req *req_start(struct storeq *q, struct storeq_fetch *f, uint64_t ns,
                                const kvvm_key *keys, size_t c0, size_t mc, struct sq_lend *l)
{
    uint32_t nr = q->n_regions;
    struct sq_req *r = calloc(1, sizeof *r);
    if (!r || !(r->it = calloc(mc, sizeof *r->it)) ||
        !(r->iov = calloc(mc * nr, sizeof *r->iov)) || !(r->k = malloc(mc * sizeof *r->k))) {
        req_free(r);
        return NULL;
    }
    r->c0 = c0;
    r->mc = mc;
    for (size_t i = 0; i < mc; i++) {
        memcpy(r->k[i].bytes, keys[c0 + i].bytes, sizeof r->k[i].bytes);
        for (uint32_t g = 0; g < nr; g++)
            r->iov[i * nr + g] = (struct iovec){ fetch_at(q, f, c0 + i, g), q->page_size };
        r->it[i] = (struct core_entry_item){ .key = &r->k[i], .iov = &r->iov[i * nr],
                                             .iovcnt = (int)nr };
    }
    r->sl = (struct core_entry_lend){ lend_put, l, 0 };
    q->ops->get_start(q->layer, ns, r->it, mc, l ? &r->sl : NULL, &r->g);
    return r;
}

/* Finishes r's request and frees r. Returns the leading hits; *kept: the store kept the
   lend (its done drops the store's hold). */
static size_t req_finish(struct storeq *q, struct sq_req *r, bool *kept)
{
    size_t j = 0;
    (void)q->ops->get_finish(&r->g);
    *kept = r->sl.kept;
    while (j < r->mc && r->it[j].status == 0)
        j++;
    KVVM_ASSERT(!*kept || j < r->mc);   /* kept: a read timed out, the fetch stops */
    req_free(r);
    return j;
}

/* Attach's staging. One attach at a time reads into the kept staging (taken under q->mu
   while it is not busy and its m blocks fit), waiting first for the fence behind the last
   attach's copies from it (stream mode: the engine stream may not have read it yet; a
   driver call, so storeq_fetch_prepare is called inside the attach's call frame, with the
   context lock); any other attach (a concurrent one, a larger one) allocates its own 4 KiB
   aligned buffer. The buffers are 4 KiB aligned, so the file backend reads straight into
   them (O_DIRECT; lent: struct sq_lend, a staging the store keeps is not taken), and the
   staging is pinned, so the copies to the device read it directly
   (asynchronous in stream mode). storeq_fetch_write records the fence after its copies;
   storeq_fetch_free gives the staging back. */
static void fstage_give(struct storeq *q)
{
    pthread_mutex_lock(&q->mu);
    KVVM_ASSERT(q->fstage_busy);    /* taken by this attach */
    q->fstage_busy = false;
    pthread_mutex_unlock(&q->mu);
}

/* Takes the staging for an attach of `bytes` (context lock held, in the call frame): free,
   bytes within the cap, the last copies from it done, grown to bytes. */
static bool fstage_take(struct storeq *q, size_t bytes)
{
    pthread_mutex_lock(&q->mu);
    bool take = q->fstage_cap && !q->fstage_busy && bytes <= q->fstage_cap &&
                !__atomic_load_n(&q->fstage_lent, __ATOMIC_ACQUIRE);
    if (take)
        q->fstage_busy = true;
    pthread_mutex_unlock(&q->mu);
    if (!take)
        return false;
    if ((q->fstage_fenced && vmm_fence_wait(q->v, &q->fstage_fence)) ||
        !fstage_grow(q, bytes)) {
        fstage_give(q);             /* copies in an unknown state (left alone), or no memory */
        return false;
    }
    return true;
}

size_t storeq_trim(kvvm *kv)
{
    struct storeq *q = kv->sq;
    if (!q || !q->fstage_cap)
        return 0;
    pthread_mutex_lock(&q->mu);
    bool take = q->fstage && !q->fstage_busy &&   /* an attach reading into it keeps it, */
                !__atomic_load_n(&q->fstage_lent, __ATOMIC_ACQUIRE);   /* as the store */
    if (take)
        q->fstage_busy = true;
    pthread_mutex_unlock(&q->mu);
    if (!take)
        return 0;
    /* its last copies waited for, then freed; not while the engine stream captures a graph
       (no synchronization, no unregistration then: it stays, for a later trim) */
    kcu_stream es = paging_stream(kv->pg);
    bool done = !(es && vmm_stream_check_capture(q->v, es)) &&
                (!q->fstage_fenced || !vmm_fence_wait(q->v, &q->fstage_fence));
    size_t n = 0;
    if (done) {
        n = q->fstage_bytes;
        fstage_release(q);
    }
    fstage_give(q);
    return n;
}

void storeq_fetch_prepare(struct storeq *q, size_t m, bool stage, struct storeq_fetch *f)
{
    memset(f, 0, sizeof *f);
    if (!q || !m)
        return;
    f->m = m;
    f->chunk = fetch_chunk(q);
    if (stage && fstage_take(q, m * q->block_bytes)) {
        f->buf = q->fstage;
        f->staged = true;
    }
}

int storeq_fetch_start(struct storeq *q, uint64_t ns, const kvvm_key *keys, size_t m,
                       struct storeq_fetch *f)
{
    if (!q || !m)
        return 0;
    KVVM_ASSERT(f->m == m && f->chunk && !f->req && !f->lend);   /* prepared for these m */
    if (!f->buf && posix_memalign((void **)&f->buf, 4096, m * q->block_bytes)) {
        f->buf = NULL;
        return -ENOMEM;
    }
    f->lend = lend_new(q, f);
    f->req = req_start(q, f, ns, keys, 0, m < f->chunk ? m : f->chunk, f->lend);
    return 0;                       /* no memory for the request: finish reads (or not) */
}

bool storeq_fetch_first(struct storeq *q, struct storeq_fetch *f)
{
    return q && f->req && q->ops->get_first(&f->req->g) == 1;
}

void storeq_fetch_finish(struct storeq *q, uint64_t ns, const kvvm_key *keys, size_t m,
                         struct storeq_fetch *f)
{
    if (!q || !m || !f->buf)
        return;                     /* nothing started */
    struct sq_lend *l = f->lend;
    bool kept = false;
    for (size_t c0 = 0; c0 < m && !kept; c0 += f->chunk) {
        size_t mc = m - c0 < f->chunk ? m - c0 : f->chunk;
        struct sq_req *r = c0 ? req_start(q, f, ns, keys, c0, mc, l) : f->req;
        f->req = NULL;
        size_t j = r ? req_finish(q, r, &kept) : 0;   /* no memory: a miss from here */
        f->got += j;
        if (j < mc)
            break;
    }
    if (l && !kept)
        lend_put(l);                /* the store's hold: never taken */
}

int storeq_fetch(struct storeq *q, uint64_t ns, const kvvm_key *keys, size_t m,
                 struct storeq_fetch *f)
{
    int rc = storeq_fetch_start(q, ns, keys, m, f);
    if (!rc)
        storeq_fetch_finish(q, ns, keys, m, f);
    return rc;
}

void storeq_fetch_free(struct storeq *q, struct storeq_fetch *f)
{
    if (f->lend)
        lend_put(f->lend);          /* the fetch's hold: the store may keep the buffer */
    else if (!f->staged)
        free(f->buf);
    if (f->staged)
        fstage_give(q);
    memset(f, 0, sizeof *f);
}

int storeq_fetch_write(kvvm *kv, const struct storeq_fetch *f, kvvm_seq dst, size_t j0,
                       size_t j1, uint64_t first)
{
    struct storeq *q = kv->sq;
    uint64_t ps = q->page_size;
    int rc = 0;
    for (uint32_t r = 0; r < q->n_regions && !rc; r++)
        for (size_t j = j0; j < j1 && !rc;) {
            size_t cend = (j / f->chunk + 1) * f->chunk;   /* contiguous to its chunk's end */
            size_t e = cend < j1 ? cend : j1;
            rc = paging_seq_write(kv->pg, dst, r, (first + j - j0) * ps, fetch_at(q, f, j, r),
                                  (e - j) * ps);
            j = e;
        }
    if (f->staged && paging_stream(kv->pg)) {
        /* the copies (those queued before a failure too) read the pinned staging when the
           engine stream reaches them: the next attach that takes it waits for this fence
           (or, where the fence is refused, the stream is waited for now) */
        q->fstage_fenced = !vmm_fence_record(q->v, &q->fstage_fence, paging_stream(kv->pg));
        if (!q->fstage_fenced)
            (void)vmm_stream_sync(q->v, paging_stream(kv->pg));
    }
    return rc;
}

void storeq_stats_add(struct storeq *q, struct core_tier_stats *out)
{
    if (!q)
        return;
    out->errors += __atomic_load_n(&q->gave_up, __ATOMIC_RELAXED);
    out->hit_blocks += __atomic_load_n(&q->hit_blocks, __ATOMIC_RELAXED);
    out->dropped += __atomic_load_n(&q->dropped, __ATOMIC_RELAXED);
    pthread_mutex_lock(&q->mu);
    out->queue_bytes += (uint64_t)(q->n_slots - q->n_free) * q->block_bytes;
    pthread_mutex_unlock(&q->mu);
    out->staging_bytes += __atomic_load_n(&q->fstage_bytes, __ATOMIC_RELAXED);
}

/* The staging slots batch b holds (NULL: none). */
static uint32_t batch_slots(const struct sq_batch *b)
{
    uint32_t n = 0;
    for (uint32_t i = 0; b && i < b->n; i++)
        n += b->slot[i] != SQ_NO_SLOT;
    return n;
}

int storeq_check(struct storeq *q, char *why, size_t len)
{
    if (!q)
        return 0;
    uint32_t held = 0, free_n;
    bool ok = true;
    pthread_mutex_lock(&q->mu);
    free_n = q->n_free;
    held = batch_slots(q->cur);
    for (struct sq_batch *b = q->head; b; b = b->next)
        held += batch_slots(b);
    for (uint32_t i = 0; ok && i < free_n; i++)
        ok = q->free_slots[i] < q->n_slots;
    pthread_mutex_unlock(&q->mu);
    if (ok && held + free_n == q->n_slots)
        return 0;
    klog_error("invariant violated: the store queue's %u staging slots: %u free, %u held by "
               "batches%s", q->n_slots, free_n, held, ok ? "" : ", a free one out of range");
    if (why && len)
        snprintf(why, len, "the store queue's %u staging slots: %u free, %u held by batches%s",
                 q->n_slots, free_n, held, ok ? "" : ", a free one out of range");
    return -EUCLEAN;
}

bool storeq_test_writing(struct storeq *q)
{
    pthread_mutex_lock(&q->mu);
    bool busy = q->cur != NULL;
    pthread_mutex_unlock(&q->mu);
    return busy;
}
