/*
 * core/view_calls.c: the public calls of the pool view (include/kvvm.h "Two views of one pool"):
 * kvvm_pool_base, kvvm_pool_blocks, kvvm_seq_block_table, kvvm_batch_block_table.
 *
 * The mechanism is paging/view.c; these calls check their arguments, explain refusals and
 * run it under the context lock. Base and id count are fixed at open (no lock).
 */
#include "core.h"

#include <errno.h>
#include "common/log.h"
#include "core/call.h"

static int no_view(const char *call)
{
    return kerr(-EOPNOTSUPP, "%s: the context has no pool view (open it with "
                "KVVM_F_POOL_VIEW)", call);
}

int kvvm_pool_base(kvvm *kv, uint32_t region, uint64_t *addr)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(addr);
    if (forked(kv))
        return -EIO;
    if (!(kv->cfg.flags & KVVM_F_POOL_VIEW))
        return no_view(__func__);
    if (region >= kv->cfg.n_regions)
        return kerr(-EINVAL, "kvvm_pool_base: region %u is out of range (n_regions %u)",
                    region, kv->cfg.n_regions);
    return paging_pool_view(kv->pg, region, addr, NULL);    /* immutable after open */
}

int kvvm_pool_blocks(kvvm *kv, uint32_t *n_ids)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(n_ids);
    if (forked(kv))
        return -EIO;
    if (!(kv->cfg.flags & KVVM_F_POOL_VIEW))
        return no_view(__func__);
    return paging_pool_view(kv->pg, 0, NULL, n_ids);        /* immutable after open */
}

static int table_locked(kvvm *kv, kvvm_seq s, uint32_t first, uint32_t n, int32_t *ids)
{
    int rc = paging_seq_block_table(kv->pg, s, first, n, ids);
    if (rc == -EINVAL)
        rc = kerr(rc, "kvvm_seq_block_table: blocks [%u, +%u) are past the sequence's "
                  "blocks (or ids is NULL)", first, n);
    else if (rc == -EAGAIN)     /* a documented answer, not misuse: debug level */
        rc = kanswer(rc, "kvvm_seq_block_table: the sequence is not resident: swap it in "
                     "first (kvvm_seq_swap_in)");
    return rc;
}

int kvvm_seq_block_table(kvvm *kv, kvvm_seq s, uint32_t first, uint32_t n, int32_t *ids)
{
    klast_clear();
    NONNULL(kv);
    if (n)
        NONNULL(ids);
    if (!(kv->cfg.flags & KVVM_F_POOL_VIEW))
        return no_view(__func__);
    CALL(kv, table_locked(kv, s, first, n, ids));
}

static int batch_table_locked(kvvm *kv, const kvvm_seq *seqs, size_t n, int32_t *indptr,
                              int32_t *indices, size_t cap, int32_t *last_len)
{
    int rc = paging_batch_block_table(kv->pg, seqs, n, indptr, indices, cap, last_len);
    /* documented answers (the docs size the buffer by -ENOSPC), not misuse: debug level */
    if (rc == -ENOSPC)
        rc = kanswer(rc, "kvvm_batch_block_table: the batch has %d blocks, indices holds "
                     "%zu (indptr[n] says how many are needed)", indptr[n], cap);
    else if (rc == -EAGAIN)
        rc = kanswer(rc, "kvvm_batch_block_table: a sequence of the batch is not resident: "
                     "swap it in first (kvvm_seq_swap_in)");
    return rc;
}

int kvvm_batch_block_table(kvvm *kv, const kvvm_seq *seqs, size_t n, int32_t *indptr,
                           int32_t *indices, size_t cap, int32_t *last_len)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(indptr);
    if (n)
        NONNULL(seqs);
    if (cap)
        NONNULL(indices);
    if (!(kv->cfg.flags & KVVM_F_POOL_VIEW))
        return no_view(__func__);
    CALL(kv, batch_table_locked(kv, seqs, n, indptr, indices, cap, last_len));
}
