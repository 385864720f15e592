/*
 * testing/kvvm_testing.h: libkvvm's testing interface: what tests and tools need beyond the
 * public API (include/kvvm.h), declared in one place. Not installed, not part of the API: no
 * compatibility promise; the library's own tests and tools only.
 *
 * Every name here begins with kvvm_ (kvvm_debug_*: hooks into a context; kvvm_testing_*:
 * counters and the bench's baselines), so it survives the private namespace of
 * libkvvm_testing.a, where only kvvm_* names are global (docs/design.md "Private namespace").
 * None of it is in the installed libkvvm.a or libkvvm.so, which hold the API only: a program
 * using it links libkvvm_testing.a, never installed (the CMake target kvvm_testing provides
 * this header's directory, include/ and libkvvm_testing.a, and nothing else: kvvm-bench
 * builds against it). Tests that test a layer's internals include its private headers
 * through the target kvvm_internal instead (libkvvm_internal.a holds testing/ too).
 */
#ifndef KVVM_TESTING_H
#define KVVM_TESTING_H

#include <stddef.h>
#include <stdint.h>
#include "kvvm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* --- hooks into a context (implemented in testing/hooks.c) ------------------------------- */

/* The invariant checker. Checks the context against the emulated device's own tables (not
   against itself): every window page maps the handle its page descriptor names, with access
   set; no page is mapped where no block-table entry says so (map-ahead pages excepted, which
   are accounted as free); every page's refcount equals the block-table entries holding it;
   free + in use + in flight == capacity per tier; the emulator's live handles and handle
   bytes equal the pool's (its frames' distinct handles: frames sharing a handle, a pool
   client's frame received held, are both shared-external); no slot or handle leaked. 0
   when all hold; -EUCLEAN with the first violation described in why (if non-NULL) and
   logged. On the CUDA backend the checks that
   need the emulator's tables are skipped. */
int kvvm_debug_check(kvvm *kv, char *why, size_t len);

/* The emulated device ordinal of the context (for emu_counters_get, emu_lookup), or -1. */
int kvvm_debug_emu_ordinal(kvvm *kv);

/* The context's copy stream (swap copies: swap-out, swap-in, prefetch), or NULL before its
   first use: for emu_stream_set_paused, to hold the library's copies back. */
void *kvvm_debug_copy_stream(kvvm *kv);

/* Requests for a frame pool thread round so far (0 without the thread). */
uint64_t kvvm_debug_pool_wakes(kvvm *kv);

/* RETURN messages this context's pool connection sent so far (each gives back up to 64
   frames, leased or mapped; 0 without a pool). */
uint64_t kvvm_debug_pool_return_msgs(kvvm *kv);

/* Where page i of region r of s is: 0 a hole (discarded), 1 device, 2 host, 3 disk (a page
   in flight counts under the tier it leaves; kvvm_sync first for a settled answer). For the
   model test, which follows every page through the moves of reclaim and set_budget.
   -EINVAL kv or tier NULL, r or i out of range; -ENOENT. */
int kvvm_debug_page_tier(kvvm *kv, kvvm_seq s, uint32_t r, uint32_t i, int *tier);

/* Whether the prefix entry (ns, key) is present (1) or not (0), touching nothing (no LRU
   mark, no counter: kvvm_prefix_lookup marks what it finds used); where (NULL allowed;
   n_regions bytes) gets the tier of its page in each region: 1 device, 2 host, 3 disk (in
   flight: the tier it leaves). For the model test's snapshot of the entries before a call.
   -EINVAL kv or key NULL. */
int kvvm_debug_prefix_entry(kvvm *kv, uint64_t ns, const kvvm_key *key, uint8_t *where);

/* The context's spill engine (the disk tier), or NULL: for disk_fault_arm and
   disk_test_corrupt (disk/disk.h). */
struct disk;
struct disk *kvvm_debug_disk(kvvm *kv);

/* --- counters (testing/testing.c) -------------------------------------------------------- */

/* The emulated device's driver calls per entry point (vmm/emu/emu.h, emu_calls_get): one
   name and count per entry point the emulator counts, since its creation. */
#define KVVM_TESTING_EMU_ENTRIES_MAX 64
struct kvvm_testing_emu_calls {
    size_t n;                                           /* entries filled */
    const char *name[KVVM_TESTING_EMU_ENTRIES_MAX];     /* "cuMemMap" ... (static strings) */
    uint64_t count[KVVM_TESTING_EMU_ENTRIES_MAX];
};
/* 0; -EINVAL out NULL; -ENODEV kv is not on the emulated device. */
int kvvm_testing_emu_calls(kvvm *kv, struct kvvm_testing_emu_calls *out);
/* The same for the calling thread's calls only (on any emulated device, since the thread
   began): what a call made on the engine's thread, without the library's threads'. 0;
   -EINVAL out NULL; -ENOMEM the thread's counts could not be allocated. */
int kvvm_testing_emu_thread_calls(struct kvvm_testing_emu_calls *out);
/* The count of the entry point named entry in c (0 when it has none). */
uint64_t kvvm_testing_emu_count(const struct kvvm_testing_emu_calls *c, const char *entry);

/* The bytes of metadata sequence s holds now (its descriptor and the arrays allocated for
   it: block tables, discard marks, block ids, map-ahead frames) into *seq_bytes, and the
   context's metadata per device page (a page descriptor and a frame's) into *page_bytes;
   either pointer may be NULL. 0; -EINVAL kv NULL; -ENOENT s names no live sequence. */
int kvvm_testing_metadata(kvvm *kv, kvvm_seq s, uint64_t *seq_bytes, uint64_t *page_bytes);

/* --- kvvm-bench's baselines: the layers below a context, under its lock ------------------ */

/* A device-to-device copy of bytes through the context's driver, on the default stream,
   then that stream synchronized (a copying fork's cost). 0 or -errno. */
int kvvm_testing_device_copy(kvvm *kv, uint64_t dst, uint64_t src, size_t bytes);
/* Fills the context's page pool to `ready` frames (created now where missing). 0, -EINVAL. */
int kvvm_testing_pool_refill(kvvm *kv, uint32_t ready);
/* iters times: one frame taken from the pool and given back (the pool's own cost, under
   the context lock taken once). 0 or the first failure's -errno. */
int kvvm_testing_pool_take_give(kvvm *kv, long iters);
/* iters times: a physical page of `bytes` created and released through the vmm layer (what
   the pool saves a grow), under the context lock taken once. 0 or -errno. */
int kvvm_testing_page_create_release(kvvm *kv, size_t bytes, long iters);

/* reps times, for each of n_chains chains of `chain` keys at keys + j * chain: the prefix
   index's lookup alone (prefix/prefix.h prefix_lookup, no call frame), under the context
   lock taken once. The number of chains whose hit count was not `chain` (0 when all hit),
   or -EINVAL. */
long kvvm_testing_prefix_index_lookups(kvvm *kv, uint64_t ns, const kvvm_key *keys,
                                       size_t n_chains, size_t chain, long reps);
/* The prefix index's test limits (prefix/prefix.h prefix_test_limits), for the tests of
   "-ENOMEM: no entry record" and the allocation-failure sweeps of publish: at most
   max_records entries (0: no cap; a publish past it fails with -ENOMEM), and the
   fail_alloc_at-th allocation of the index from now on (a publish's page ids, record growth,
   slot rebuilds) fails (0: none). Returns the index's allocations since the previous call
   (>= 0), -EINVAL kv NULL. */
long kvvm_testing_prefix_limits(kvvm *kv, uint32_t max_records, uint32_t fail_alloc_at);
/* The prefix index's entries now and the bytes it holds for them (slots, records, ticks and
   page ids). */
int kvvm_testing_prefix_memory(kvvm *kv, uint64_t *entries, uint64_t *bytes);

/* The disk tier's page checksum (disk/disk.h disk_checksum: XXH3 of the bytes, seeded with
   the page's identity, page id and slot). */
uint64_t kvvm_testing_page_checksum(const void *buf, size_t len, uint64_t page,
                                    uint32_t slot);

/* Parses a size with an optional K/M/G/T suffix (binary units), as the KVVM_* variables are read.
   0 or -EINVAL. */
int kvvm_testing_parse_size(const char *s, size_t *out);

/* --- the vmm layer on a device of its own (testing/vmm_alone.c): kvvm-bench's foundation ------- */

/* vmm/vmm.h's calls under kvvm_testing_vmm_*, same arguments and results (0 or -errno);
   a page is a vmm_handle, a stream the driver's (NULL = the legacy default stream). */
typedef struct kvvm_testing_vmm kvvm_testing_vmm;
typedef struct { unsigned long long h; } kvvm_testing_page;
typedef void *kvvm_testing_stream;
struct kvvm_testing_vmm_params {
    enum kvvm_backend backend;  /* AUTO: docs/api.md "Backend choice" */
    int    device;              /* CUDA ordinal (ignored on the emulated device) */
    size_t emu_capacity;        /* emulated device bytes */
    size_t emu_granule;         /* emulated granule; 0 = 2 MiB */
    int    emu_opaque;          /* emulated windows not CPU-accessible */
};
/* The byte pattern of never-written emulated device memory (vmm/emu/emu.h EMU_POISON). */
#define KVVM_TESTING_EMU_POISON 0xA5

int  kvvm_testing_vmm_open(const struct kvvm_testing_vmm_params *p, kvvm_testing_vmm **out);
void kvvm_testing_vmm_close(kvvm_testing_vmm *v);
const char *kvvm_testing_vmm_backend_name(const kvvm_testing_vmm *v);   /* "cuda", "emulated" */
size_t kvvm_testing_vmm_granule(const kvvm_testing_vmm *v);
int  kvvm_testing_vmm_make_current(kvvm_testing_vmm *v);
int  kvvm_testing_vmm_reserve(kvvm_testing_vmm *v, size_t bytes, uint64_t *base);
void kvvm_testing_vmm_unreserve(kvvm_testing_vmm *v);
int  kvvm_testing_vmm_phys_create(kvvm_testing_vmm *v, size_t bytes, kvvm_testing_page *out);
int  kvvm_testing_vmm_phys_release(kvvm_testing_vmm *v, kvvm_testing_page h);
int  kvvm_testing_vmm_map_run(kvvm_testing_vmm *v, uint64_t va, const kvvm_testing_page *pages,
                              size_t n, size_t page_size);
int  kvvm_testing_vmm_unmap(kvvm_testing_vmm *v, uint64_t va, size_t bytes);
int  kvvm_testing_vmm_stream_create(kvvm_testing_vmm *v, kvvm_testing_stream *out);
int  kvvm_testing_vmm_stream_destroy(kvvm_testing_vmm *v, kvvm_testing_stream s);
int  kvvm_testing_vmm_stream_sync(kvvm_testing_vmm *v, kvvm_testing_stream s);
int  kvvm_testing_vmm_copy_htod(kvvm_testing_vmm *v, uint64_t dst, const void *src, size_t n,
                               kvvm_testing_stream s);
int  kvvm_testing_vmm_copy_dtoh(kvvm_testing_vmm *v, void *dst, uint64_t src, size_t n,
                               kvvm_testing_stream s);
int  kvvm_testing_vmm_copy_dtod(kvvm_testing_vmm *v, uint64_t dst, uint64_t src, size_t n,
                               kvvm_testing_stream s);
int  kvvm_testing_vmm_host_alloc(kvvm_testing_vmm *v, size_t bytes, void **out);
void kvvm_testing_vmm_host_free(kvvm_testing_vmm *v, void *p);

/* The bare driver calls under v (its driver table, no vmm bookkeeping): the raw baseline of
   kvvm-bench's cuda figures. Each is one driver call and returns the driver's result code
   (CUresult, 0 success); kvvm_testing_raw_errstr names one. Pages are created pinned on
   device `dev` (kvvm_testing_raw_device) and made read-write for it. */
int kvvm_testing_raw_device(kvvm_testing_vmm *v, int ordinal, int *dev);
int kvvm_testing_raw_reserve(kvvm_testing_vmm *v, uint64_t *va, size_t bytes, size_t align);
int kvvm_testing_raw_free(kvvm_testing_vmm *v, uint64_t va, size_t bytes);
int kvvm_testing_raw_create(kvvm_testing_vmm *v, int dev, size_t bytes,
                            unsigned long long *handle);
int kvvm_testing_raw_release(kvvm_testing_vmm *v, unsigned long long handle);
int kvvm_testing_raw_map(kvvm_testing_vmm *v, uint64_t va, size_t bytes,
                         unsigned long long handle);
int kvvm_testing_raw_set_access(kvvm_testing_vmm *v, int dev, uint64_t va, size_t bytes);
int kvvm_testing_raw_unmap(kvvm_testing_vmm *v, uint64_t va, size_t bytes);
int kvvm_testing_raw_copy_htod(kvvm_testing_vmm *v, uint64_t dst, const void *src, size_t n,
                               kvvm_testing_stream s);
int kvvm_testing_raw_copy_dtoh(kvvm_testing_vmm *v, void *dst, uint64_t src, size_t n,
                               kvvm_testing_stream s);
int kvvm_testing_raw_copy_dtod(kvvm_testing_vmm *v, uint64_t dst, uint64_t src, size_t n,
                               kvvm_testing_stream s);
int kvvm_testing_raw_stream_sync(kvvm_testing_vmm *v, kvvm_testing_stream s);
const char *kvvm_testing_raw_errstr(kvvm_testing_vmm *v, int result);

/* --- the disk tier's engine alone (testing/disk_alone.c): kvvm-bench's spill figures ---------- */

/* disk/disk.h's disk_* under kvvm_testing_spill_*, same arguments and results; requests and
   completions have disk_req's and disk_cqe's layout (checked in testing/disk_alone.c). */
typedef struct kvvm_testing_spill kvvm_testing_spill;
enum { KVVM_TESTING_SPILL_WRITE = 1, KVVM_TESTING_SPILL_READ = 2 };
enum { KVVM_TESTING_SPILL_AUTO = 0, KVVM_TESTING_SPILL_IO_URING = 1,
       KVVM_TESTING_SPILL_PSYNC = 2 };
struct kvvm_testing_spill_params {
    const char *dir;             /* directory for the file */
    size_t   budget;             /* bytes of disk; slots = budget / page_size */
    size_t   page_size;          /* bytes per slot and per page request */
    void    *buf_base;           /* buffers to register, or NULL */
    size_t   buf_bytes;
    unsigned queue_depth;        /* I/Os in flight; 0 = 32 */
    size_t   io_size;            /* bytes per I/O; 0 = page_size */
    int      engine;             /* KVVM_TESTING_SPILL_AUTO, _IO_URING, _PSYNC */
};
struct kvvm_testing_spill_req {
    int       op;                /* KVVM_TESTING_SPILL_WRITE or _READ */
    uint32_t  slot;              /* an allocated slot */
    void     *buf;               /* page_size bytes, aligned for O_DIRECT */
    uint64_t  page;              /* the page's identity, part of its checksum */
    void     *user;              /* returned in the completion */
};
struct kvvm_testing_spill_cqe {
    void     *user;
    uint64_t  page;
    uint32_t  slot;
    int       op;
    int       status;            /* 0 or -errno */
};
int    kvvm_testing_spill_open(const struct kvvm_testing_spill_params *p,
                               kvvm_testing_spill **out);
void   kvvm_testing_spill_close(kvvm_testing_spill *dk);
/* n slots into out (disk_slot_alloc without a hint). */
int    kvvm_testing_spill_slot_alloc(kvvm_testing_spill *dk, size_t n, uint32_t *out);
int    kvvm_testing_spill_slot_free(kvvm_testing_spill *dk, uint32_t slot);
int    kvvm_testing_spill_submit(kvvm_testing_spill *dk, const struct kvvm_testing_spill_req *r,
                                 size_t n);
size_t kvvm_testing_spill_reap(kvvm_testing_spill *dk, struct kvvm_testing_spill_cqe *out,
                               size_t max);
int    kvvm_testing_spill_wait_all(kvvm_testing_spill *dk);

#ifdef __cplusplus
}
#endif
/* --- the shared store layer alone (testing/store_alone.c): kvvm-bench's store figures ----------- */

/* store/store.h's calls under kvvm_testing_store_*, same arguments and results; items and
   layouts have store_item's and store_layout's layout (checked in testing/store_alone.c). */
typedef struct kvvm_testing_store kvvm_testing_store;
struct iovec;
struct kvvm_testing_store_layout {
    uint32_t n_regions;
    uint64_t bytes_per_token;
    uint64_t page_size;
};
struct kvvm_testing_store_item {
    const kvvm_key *key;
    const struct iovec *iov;
    int iovcnt;
    int status;                  /* out: 0 done / hit, -ENOENT miss, -errno */
};
/* url as the config's store_url; 0, -EINVAL malformed, -EACCES refused credentials. */
int  kvvm_testing_store_open(const char *url, uint32_t timeout_ms, kvvm_testing_store **out);
void kvvm_testing_store_close(kvvm_testing_store *st);
/* The number of items written / found (each item's status set), or -EINVAL. A get lends
   the items' buffers (store_get_lent: a file store reads straight into 4 KiB aligned ones):
   one that timed out may still have them written until kvvm_testing_store_close returns,
   so keep them until then. */
int  kvvm_testing_store_put(kvvm_testing_store *st, const struct kvvm_testing_store_layout *L,
                            uint64_t ns, struct kvvm_testing_store_item *items, size_t n);
int  kvvm_testing_store_get(kvvm_testing_store *st, const struct kvvm_testing_store_layout *L,
                            uint64_t ns, struct kvvm_testing_store_item *items, size_t n);

#endif
