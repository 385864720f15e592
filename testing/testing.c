/*
 * testing/testing.c: the testing interface's counters and baselines (testing/kvvm_testing.h),
 * for the library's tests and tools. Each function is a thin door to one layer, taking the
 * context lock where a public call would.
 */
#include "testing/kvvm_testing.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "common/log.h"
#include "core/core.h"
#include "disk/disk.h"
#include "paging/paging_int.h"
#include "paging/frames.h"
#include "prefix/prefix.h"
#include "vmm/emu/emu.h"
#include "vmm/vmm.h"

_Static_assert(sizeof(struct emu_calls) / sizeof(uint64_t) <= KVVM_TESTING_EMU_ENTRIES_MAX,
               "KVVM_TESTING_EMU_ENTRIES_MAX below the emulator's entry points");

/* c's counts into out, one name and count per entry point. */
static void put_calls(struct kvvm_testing_emu_calls *out, const struct emu_calls *c)
{
    out->n = 0;
#define X_PUT(e) out->name[out->n] = #e; out->count[out->n++] = c->e;
    EMU_ENTRIES(X_PUT)
#undef X_PUT
}

int kvvm_testing_emu_calls(kvvm *kv, struct kvvm_testing_emu_calls *out)
{
    if (!kv || !out)
        return -EINVAL;
    int ord = kvvm_debug_emu_ordinal(kv);
    if (ord < 0)
        return -ENODEV;
    struct emu_calls c;
    int rc = emu_calls_get(ord, &c);
    if (rc)
        return rc;
    put_calls(out, &c);
    return 0;
}

int kvvm_testing_emu_thread_calls(struct kvvm_testing_emu_calls *out)
{
    if (!out)
        return -EINVAL;
    struct emu_calls c;
    int err = emu_thread_calls_get(&c);
    if (err)
        return err;
    put_calls(out, &c);
    return 0;
}

uint64_t kvvm_testing_emu_count(const struct kvvm_testing_emu_calls *c, const char *entry)
{
    for (size_t i = 0; c && entry && i < c->n; i++)
        if (!strcmp(c->name[i], entry))
            return c->count[i];
    return 0;
}

int kvvm_testing_metadata(kvvm *kv, kvvm_seq s, uint64_t *seq_bytes, uint64_t *page_bytes)
{
    if (!kv)
        return -EINVAL;
    uint64_t b = 0, pb = 0;
    pthread_mutex_lock(&kv->lock);
    int rc = paging_meta_bytes(kv->pg, s, &b, &pb);
    pthread_mutex_unlock(&kv->lock);
    if (rc)
        return rc;
    if (seq_bytes)
        *seq_bytes = b;
    if (page_bytes)
        *page_bytes = pb;
    return 0;
}

int kvvm_testing_device_copy(kvvm *kv, uint64_t dst, uint64_t src, size_t bytes)
{
    if (!kv)
        return -EINVAL;
    int rc = vmm_copy_dtod(kv->v, dst, src, bytes, NULL);
    return rc ? rc : vmm_stream_sync(kv->v, NULL);
}

int kvvm_testing_pool_refill(kvvm *kv, uint32_t ready)
{
    if (!kv)
        return -EINVAL;
    pthread_mutex_lock(&kv->lock);
    pool_refill(kv->pg, ready);
    pthread_mutex_unlock(&kv->lock);
    return 0;
}

int kvvm_testing_pool_take_give(kvvm *kv, long iters)
{
    if (!kv)
        return -EINVAL;
    int rc = 0;
    pg_frame_id f;
    pthread_mutex_lock(&kv->lock);
    for (long i = 0; i < iters && !rc; i++) {
        rc = pool_take(kv->pg, 1, &f);
        if (!rc)
            pool_give(kv->pg, &f, 1);
    }
    pthread_mutex_unlock(&kv->lock);
    return rc;
}

int kvvm_testing_page_create_release(kvvm *kv, size_t bytes, long iters)
{
    if (!kv)
        return -EINVAL;
    int rc = 0;
    vmm_handle h;
    pthread_mutex_lock(&kv->lock);
    for (long i = 0; i < iters && !rc; i++) {
        rc = vmm_phys_create(kv->v, bytes, &h);
        if (!rc)
            vmm_phys_release(kv->v, h);
    }
    pthread_mutex_unlock(&kv->lock);
    return rc;
}

uint64_t kvvm_testing_page_checksum(const void *buf, size_t len, uint64_t page, uint32_t slot)
{
    return disk_checksum(buf, len, page, (disk_slot){ slot });
}

int kvvm_testing_parse_size(const char *s, size_t *out)
{
    return kparse_size(s, out);
}

long kvvm_testing_prefix_index_lookups(kvvm *kv, uint64_t ns, const kvvm_key *keys,
                                       size_t n_chains, size_t chain, long reps)
{
    if (!kv || !keys || !kv->pfx)
        return -EINVAL;
    long bad = 0;
    pthread_mutex_lock(&kv->lock);
    for (long r = 0; r < reps; r++)
        for (size_t j = 0; j < n_chains; j++)
            bad += prefix_lookup(kv->pfx, ns, keys + j * chain, chain, NULL, NULL, true) !=
                   chain;
    pthread_mutex_unlock(&kv->lock);
    return bad;
}

int kvvm_testing_prefix_memory(kvvm *kv, uint64_t *entries, uint64_t *bytes)
{
    if (!kv || !entries || !bytes || !kv->pfx)
        return -EINVAL;
    struct prefix_counters pc;
    pthread_mutex_lock(&kv->lock);
    prefix_counters(kv->pfx, &pc);
    pthread_mutex_unlock(&kv->lock);
    *entries = pc.entries;
    *bytes = pc.bytes;
    return 0;
}

long kvvm_testing_prefix_limits(kvvm *kv, uint32_t max_records, uint32_t fail_alloc_at)
{
    if (!kv || !kv->pfx)
        return -EINVAL;
    pthread_mutex_lock(&kv->lock);
    long made = prefix_test_limits(kv->pfx, max_records, fail_alloc_at);
    pthread_mutex_unlock(&kv->lock);
    return made;
}
