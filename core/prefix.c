/*
 * core/prefix.c: the public calls of blocks and of the prefix cache keyed by content
 * (include/kvvm.h; the index is prefix/, its contract in prefix/prefix.h). attach follows
 * the calls that may move other sequences (core.h "Pressure"): check, let dst adopt the
 * entries' pages (a non-resident sequence holding them), count the frames bringing it in
 * takes, make room (swap/'s plan: the entries dst now holds are no victims), swap it in;
 * on any failure dst lets them go again, empty as it was.
 */
#include "core.h"

#include <errno.h>
#include <stdlib.h>
#include "common/log.h"
#include "core/call.h"

int kvvm_block_tokens(kvvm *kv, uint32_t *tokens_per_block)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(tokens_per_block);
    uint64_t t = kv->cfg.page_size / kv->cfg.bytes_per_token;   /* fixed at open */
    if (!t || t > UINT32_MAX)
        return api_done(__func__, kerr(-EOPNOTSUPP, "kvvm_block_tokens: a page of %zu bytes "
                                       "holds %llu tokens of %llu bytes", kv->cfg.page_size,
                                       (unsigned long long)t,
                                       (unsigned long long)kv->cfg.bytes_per_token));
    *tokens_per_block = (uint32_t)t;
    return api_done(__func__, 0);
}

size_t kvvm_prefix_keys(const int32_t *tokens, size_t n_tokens, uint32_t tokens_per_block,
                        const void *salt, size_t salt_len, kvvm_key *keys, size_t cap)
{
    return prefix_chain_keys(tokens, n_tokens, tokens_per_block, salt, salt_len, keys, cap);
}

/* -EINVAL for keys NULL with n > 0 (kerr: the reason kept). */
#define KEYS_CHECK(keys, n) do { if (!(keys) && (n)) return api_done(__func__, \
    kerr(-EINVAL, "%s: keys is NULL with n = %zu", __func__, (size_t)(n))); } while (0)

static int publish_locked(kvvm *kv, kvvm_seq s, uint64_t ns, const kvvm_key *keys, size_t n)
{
    int rc = prefix_publish(kv->pfx, s, ns, keys, n);
    if (rc == -EINVAL)
        rc = kerr(rc, "kvvm_prefix_publish: %zu blocks are past the sequence's full blocks, "
                  "or one of them is discarded in a region", n);
    return rc;
}

int kvvm_prefix_publish(kvvm *kv, kvvm_seq s, uint64_t ns, const kvvm_key *keys, size_t n)
{
    klast_clear();
    NONNULL(kv);
    KEYS_CHECK(keys, n);
    CALL(kv, publish_locked(kv, s, ns, keys, n));
}

int kvvm_prefix_lookup(kvvm *kv, uint64_t ns, const kvvm_key *keys, size_t n, uint8_t *where)
{
    klast_clear();
    NONNULL(kv);
    KEYS_CHECK(keys, n);
    if (n > INT32_MAX)
        n = INT32_MAX;                  /* the count is returned as an int */
    CALL(kv, (int)prefix_lookup(kv->pfx, ns, keys, n, where, NULL, true));
}

/* dst adopts the k entries' pages ids, room is made for bringing them in, dst comes in. */
static int attach_in(kvvm *kv, kvvm_seq dst, const pg_page_id *ids, uint32_t k)
{
    uint32_t need;
    int rc = paging_seq_adopt(kv->pg, dst, ids, k);
    if (rc)
        return rc;
    rc = paging_need(kv->pg, dst, 0, &need);
    if (!rc)
        rc = core_make_room(kv, need, &dst, 1);
    if (!rc)
        rc = paging_swap_in(kv->pg, dst, false);
    if (rc)
        paging_seq_unadopt(kv->pg, dst);   /* empty again; the entries keep their pages */
    return rc;
}

static int attach_locked(kvvm *kv, kvvm_seq dst, uint64_t ns, const kvvm_key *keys,
                         size_t n)
{
    struct paging_seq_info pi;
    int rc = paging_seq_stale(kv->pg, dst);
    if (!rc)
        rc = paging_seq_info(kv->pg, dst, &pi);
    if (rc)
        return rc;
    if (pi.length)
        return kerr(-EINVAL, "kvvm_prefix_attach: sequence %llx is not empty (%llu tokens)",
                    (unsigned long long)dst, (unsigned long long)pi.length);
    uint64_t max_blocks = kv->cfg.max_tokens / (kv->cfg.page_size / kv->cfg.bytes_per_token);
    if (n > max_blocks)
        n = (size_t)max_blocks;         /* a sequence holds no more */
    pg_page_id *ids = malloc((n ? n : 1) * kv->cfg.n_regions * sizeof *ids);
    if (!ids)
        return -ENOMEM;
    size_t k = prefix_lookup(kv->pfx, ns, keys, n, NULL, ids, false);
    rc = k ? stream_check(kv) : 0;
    if (!rc && k)
        rc = attach_in(kv, dst, ids, (uint32_t)k);
    free(ids);
    prefix_count_hits(kv->pfx, rc ? 0 : k);
    swap_after_call(kv->sw);
    return rc ? rc : (int)k;
}

int kvvm_prefix_attach(kvvm *kv, kvvm_seq dst, uint64_t ns, const kvvm_key *keys, size_t n)
{
    klast_clear();
    NONNULL(kv);
    KEYS_CHECK(keys, n);
    if (kv->cfg.page_size % kv->cfg.bytes_per_token)
        return api_done(__func__, kerr(-EOPNOTSUPP, "kvvm_prefix_attach: page_size %zu is "
                                       "not a multiple of bytes_per_token %llu",
                                       kv->cfg.page_size,
                                       (unsigned long long)kv->cfg.bytes_per_token));
    CALL(kv, attach_locked(kv, dst, ns, keys, n));
}

int kvvm_prefix_drop(kvvm *kv, uint64_t ns, const kvvm_key *keys, size_t n)
{
    klast_clear();
    NONNULL(kv);
    KEYS_CHECK(keys, n);
    CALL(kv, (int)prefix_drop(kv->pfx, ns, keys, n));
}
