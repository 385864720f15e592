/*
 * core/handoff_calls.c: kvvm_seq_export, kvvm_seq_import, kvvm_handoff_drop: a sequence handed to
 * another client of the same kvvmd without a copy. docs/api.md "Hand-off"; the daemon's
 * side: pool/server_share.c; the pages' sharing rules: paging/handoff.c.
 *
 * Export: the frames go to the daemon at once, and only once the daemon holds them are the
 * pages marked shared (copy on write from then). Sync mode: paging waited for the device
 * work before the call, the export is importable at once. Stream mode: nothing waits on the
 * engine's thread: the export is PENDING (an import of it is -EAGAIN) until the
 * connection's ready thread saw the fence recorded after that work complete (pool/client.h
 * "Pending shares"; kvvm_sync waits for that). Import: the daemon's frames are mapped here as shared frames of a
 * new sequence, which is swapped in (device pages: mapped as they are, nothing copied);
 * the daemon spends the token only once all of that succeeded (IMPORT_END), so a failed
 * call leaves the export importable.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "call.h"
#include "common/assert.h"
#include "pool/client.h"

_Static_assert(sizeof(kvvm_handoff) == POOL_TOKEN_BYTES, "a token is the daemon's");

static struct pool_layout layout_of(const kvvm *kv)
{
    return (struct pool_layout){ .n_regions = kv->cfg.n_regions,
                                 .bytes_per_token = kv->cfg.bytes_per_token,
                                 .page_size = kv->cfg.page_size };
}

static int no_pool(const char *call)
{
    return kerr(-EOPNOTSUPP, "%s: this context has no pool (opened without pool_socket): "
                "hand-offs go through a kvvmd", call);
}

static int export_locked(kvvm *kv, kvvm_seq s, kvvm_handoff *token)
{
    static const char *call = "kvvm_seq_export";
    if (!kv->pool)
        return no_pool(call);
    struct pg_share_out o;             /* the frames, then their fence */
    int rc = paging_seq_share_frames(kv->pg, s, PG_SHARE_ALL, &o);
    if (rc && o.fenced < 0)
        return rc;                      /* the fence: -ENOMEM, -EIO: core_explain */
    if (rc && rc != -EAGAIN && rc != -EINVAL && rc != -ENODATA && rc != -EOPNOTSUPP)
        return rc;                      /* -ENOENT, -ESTALE, -ENOMEM, -EIO: core_explain */
    switch (rc) {
    case 0: break;
    case -EAGAIN:
        return kerr(rc, "%s: sequence %llx is not resident (swapped out, or a page of it is "
                    "still moving): swap it in first", call, (unsigned long long)s);
    case -EINVAL:
        return kerr(rc, "%s: sequence %llx has discarded pages (holes): a hand-off carries "
                    "every page", call, (unsigned long long)s);
    case -ENODATA:
        return kerr(-EINVAL, "%s: sequence %llx is empty: nothing to hand off", call,
                    (unsigned long long)s);
    default:                            /* -EOPNOTSUPP */
        return kerr(rc, "%s: the pool view (KVVM_F_POOL_VIEW) does not map shared frames "
                    "yet", call);
    }
    vmm_handle *hs = o.hs;
    vmm_fence f = o.f;
    int fenced = o.fenced;
    struct pool_layout lay = layout_of(kv);
    uint64_t serial = fenced ? pool_cli_ready_serial(kv->pool) : 0;
    char why[256];
    rc = pool_cli_export(kv->pool, hs, o.n, &lay, o.length, serial, token->bytes, why,
                         sizeof why);
    free(hs);
    if (rc && fenced)
        vmm_fence_destroy(kv->v, &f);
    if (rc == -ENOENT)
        return kerr(-EAGAIN, "%s: %s", call, why);
    if (rc)
        return kerr(rc == -EIO ? -EIO : rc, "%s: %s", call, why);
    paging_seq_share_mark(kv->pg, s, PG_SHARE_ALL);
    if (fenced)
        pool_cli_ready_after(kv->pool, serial, f);  /* importable once the fence completed */
    kv->n_exports++;
    return 0;
}

int kvvm_seq_export(kvvm *kv, kvvm_seq s, kvvm_handoff *token)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(token);
    CALL_ENGINE(kv, export_locked(kv, s, token));
}

/* New sequence *out adopts the n imported frames hs and comes in (mapped, no copy). On an
   error nothing is left: the handles are the caller's again, or released through the
   frame source (*released). */
static int import_in(kvvm *kv, vmm_handle *hs, uint32_t n, uint64_t length, kvvm_seq *out,
                     bool *released)
{
    kvvm_seq s;
    bool was_out;
    uint64_t need = 0;
    *released = false;
    int rc = paging_seq_create(kv->pg, &s);
    if (rc)
        return rc == -ENOSPC ? kerr(-ENOMEM, "kvvm_seq_import: no free sequence slot "
                                    "(max_seqs %u)", kv->cfg.max_seqs) : rc;
    rc = paging_seq_import(kv->pg, s, hs, n, length, &was_out);
    if (rc) {
        (void)paging_seq_free(kv->pg, s);
        if (rc == -E2BIG)
            return kerr(rc, "kvvm_seq_import: the export's %llu tokens are more than "
                        "max_tokens (%llu)", (unsigned long long)length,
                        (unsigned long long)kv->cfg.max_tokens);
        return rc;
    }
    rc = paging_need(kv->pg, &(struct pg_need){ .of = PG_NEED_GROW, .h = s }, &need);
    if (!rc)
        rc = core_make_room(kv, need, &s, 1);
    if (!rc)
        rc = paging_swap_in(kv->pg, s, false);
    if (rc) {
        paging_seq_unadopt(kv->pg, s, was_out);    /* the frames go back through the source */
        (void)paging_seq_free(kv->pg, s);
        *released = true;
        return rc;
    }
    *out = s;
    return 0;
}

static int import_locked(kvvm *kv, const kvvm_handoff *token, kvvm_seq *out)
{
    static const char *call = "kvvm_seq_import";
    if (!kv->pool)
        return no_pool(call);
    int rc = stream_check(kv);
    if (rc)
        return rc;
    struct pool_layout lay = layout_of(kv);
    vmm_handle *hs = NULL;
    uint32_t n = 0;
    uint64_t length = 0;
    char why[256];
    rc = pool_cli_import(kv->pool, token->bytes, &lay, &hs, &n, &length, why, sizeof why);
    if (rc == -ENOENT || rc == -EINVAL || rc == -EAGAIN)
        return kerr(rc, "%s: %s", call, why);     /* -EAGAIN: pending, nothing spent */
    if (rc)
        return kerr(rc == -EIO ? -EIO : -ENOMEM, "%s: %s", call, why);
    bool released;
    kvvm_seq s = 0;
    rc = import_in(kv, hs, n, length, &s, &released);
    pool_cli_import_end(kv->pool, token->bytes, hs, released ? 0 : n, rc == 0);
    free(hs);
    if (rc)
        return rc;
    kv->n_imports++;
    *out = s;
    return 0;
}

int kvvm_seq_import(kvvm *kv, const kvvm_handoff *token, kvvm_seq *out)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(token);
    NONNULL(out);
    CALL(kv, import_locked(kv, token, out));
}

int kvvm_handoff_drop(kvvm *kv, const kvvm_handoff *token)
{
    klast_clear();
    NONNULL(kv);
    NONNULL(token);
    if (forked(kv))
        return api_done(__func__, -EIO);
    if (!kv->pool)
        return api_done(__func__, no_pool(__func__));
    /* no context lock: the connection has its own */
    char why[256];
    int rc = pool_cli_handoff_drop(kv->pool, token->bytes, why, sizeof why);
    if (rc == -ENOENT)
        rc = kerr(rc, "kvvm_handoff_drop: no unimported export has this token (spent, "
                  "dropped, never made, or being imported)");
    else if (rc)
        rc = kerr(rc, "kvvm_handoff_drop: %s", why);
    return api_done(__func__, rc);
}
