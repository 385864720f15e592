/*
 * core/errors.c: what an errno means, kvvm_strerror, the names used in messages, and the
 * numbers behind a refused call (core_explain).
 */
#include "core.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "common/log.h"

/* The errno's name, for messages ("-ENOENT"). */
const char *core_err_name(int err)
{
    switch (err < 0 ? -err : err) {
#define N(e) case e: return "-" #e;
    N(EINVAL) N(ENOENT) N(E2BIG) N(ENOSPC) N(ENOMEM) N(EBADMSG) N(EIO) N(ENODEV) N(EBUSY)
    N(EOPNOTSUPP) N(EUCLEAN) N(ENOTDIR) N(EACCES) N(EPERM) N(EROFS) N(ENAMETOOLONG)
    N(ELOOP) N(EDQUOT) N(EFBIG) N(EMFILE) N(ENFILE) N(EAGAIN) N(ENOSYS) N(ESTALE)
#undef N
    }
    return "error";
}

/* Describes the errno itself, for every call that can return it (docs/api.md lists which
   call returns which); kvvm_last_error() has the reason of the last failure. */
const char *kvvm_strerror(int err)
{
    switch (err < 0 ? -err : err) {
    case 0: return "success";
    case EINVAL: return "invalid argument: a NULL pointer, a region, length or byte range "
                        "outside the sequence, a share target that is not empty, a sequence "
                        "named twice, a stream not of this context, or a bad config field "
                        "(kvvm_last_error() says which)";
    case ENOENT: return "not found: an unknown or freed sequence handle, or a missing file "
                        "or directory (spill_dir)";
    case E2BIG: return "too long: a length past max_tokens";
    case ENOSPC: return "no space: no free sequence slot (max_seqs live sequences), a full "
                        "spill device (spill_budget cannot be reserved), a JSON buffer too "
                        "small (kvvm_stats_json), or a block-table buffer too small "
                        "(kvvm_batch_block_table: indptr[n] says how many ids are needed)";
    case ENOMEM: return "out of memory: no device page can be had (nothing reclaimable), no "
                        "room in the host or disk tier, no host tier to swap out to, or host "
                        "memory or the address reservation could not be had "
                        "(kvvm_last_error() gives the pages needed and free per tier)";
    case EBADMSG: return "data lost: this sequence's disk copy failed its checksum or could "
                         "not be read";
    case EIO: return "I/O error: the context is dead (a sticky driver error or an "
                     "unrecoverable fault; every later call fails, close it), or a disk "
                     "write or read of the spill file failed";
    case ENODEV: return "no usable CUDA device (no driver, no GPU, or a device ordinal out "
                        "of range)";
    case EBUSY: return "busy: the engine stream is capturing a CUDA graph (calls that "
                       "would enqueue on it are refused until the capture ends), or the "
                       "stream to destroy is the engine stream now";
    case EOPNOTSUPP: return "not supported: the I/O engine asked for (KVVM_IO_ENGINE) or a "
                            "file system feature the spill file needs is unavailable, a pool "
                            "view call on a context opened without KVVM_F_POOL_VIEW, or a "
                            "prefix call where a block does not fill its page (page_size not "
                            "a multiple of bytes_per_token)";
    case EUCLEAN: return "an internal invariant does not hold (a libkvvm bug: please report "
                         "it)";
    case ENOTDIR: return "not a directory: spill_dir, or a component of its path, is not a "
                         "directory";
    case EACCES: return "permission denied: this process may not create the spill file in "
                        "spill_dir, or the store of store_url refused its credentials (the "
                        "password or user)";
    case EPERM: return "operation not permitted: this process may not create or reserve "
                       "the spill file in spill_dir";
    case EROFS: return "read-only file system: spill_dir is on a read-only mount";
    case ENAMETOOLONG: return "file name too long: spill_dir's path";
    case EDQUOT: return "disk quota exceeded: spill_budget cannot be reserved in spill_dir";
    case EFBIG: return "file too large: spill_budget exceeds what spill_dir's file system "
                       "allows in one file";
    case EAGAIN: return "try again: a library thread could not be started (kvvm_open), or a "
                        "block table was asked of a sequence that is not resident (swap it "
                        "in first)";
    case ESTALE: return "stale: the sequence is a dropped CACHED sequence (reclaim released "
                        "its pages); free it, or kvvm_seq_set_class it to use it again as an "
                        "empty sequence";
    }
    return strerror(err < 0 ? -err : err);
}

/* ---- the numbers behind a refusal (core_explain) ------------------------------------- */

/* The tiers, as a -ENOMEM message states them: free and total per tier, or the first tier
   that is missing (then nothing can be moved to it or below to make room). w->host counts
   slots of the first tier below the device (the one swap-outs go to). */
static void explain_tiers(kvvm *kv, const struct paging_why *w, char *b, size_t n)
{
    struct paging_counters c;
    paging_counters(kv->pg, &c);
    size_t pos = 0;
    if (w->what & PG_WHY_FRAMES)
        json_put(b, n, &pos, "%llu device page%s needed, %llu free of %llu (device_budget "
                 "%zu)", (unsigned long long)w->frames, w->frames == 1 ? "" : "s",
                 (unsigned long long)c.pages_free,
                 (unsigned long long)c.pages_total, kv->cfg.device_budget);
    else
        json_put(b, n, &pos, "device: %llu of %llu pages free (device_budget %zu)",
                 (unsigned long long)c.pages_free, (unsigned long long)c.pages_total,
                 kv->cfg.device_budget);
    for (unsigned t = 0; t < CORE_N_LEVELS; t++) {
        const struct core_tier *e = kv->tier[t].e;
        struct core_tier_stats ts;
        if (core_tier_kind(t) != CORE_TIER_PAGES)
            continue;                   /* an entries tier holds no room for pages */
        core_tier_stats(kv, t, &ts);
        if (!core_tier_on(kv, t)) {
            const struct core_tier *off = e ? e : core_tiers_first(t);
            if (off)
                off->off(kv, b, n, &pos);
            break;                      /* the tiers below it need it */
        }
        if (t == 0 && (w->what & PG_WHY_HOST))
            json_put(b, n, &pos, "; %s tier: %llu slot%s needed, %llu free of %llu", e->name,
                     (unsigned long long)w->host, w->host == 1 ? "" : "s",
                     (unsigned long long)ts.free, (unsigned long long)ts.total);
        else
            json_put(b, n, &pos, "; %s tier: %llu of %llu slots free", e->name,
                     (unsigned long long)ts.free, (unsigned long long)ts.total);
    }
    core_pool_explain(kv, b, n, &pos);          /* with a pool: the daemon's numbers */
    if ((w->what & PG_WHY_FRAMES) && !(kv->cfg.flags & KVVM_F_AUTO_SWAP))
        json_put(b, n, &pos, "; KVVM_F_AUTO_SWAP is off: the engine makes room itself "
                 "(kvvm_seq_swap_out, kvvm_seq_free)");
}

void core_explain_text(kvvm *kv, int rc, char *b, size_t n)
{
    const struct paging_why *w = paging_why(kv->pg, PG_WHY_GET, 0);
    if (rc == -ENOMEM && (w->what & (PG_WHY_FRAMES | PG_WHY_HOST | PG_WHY_NO_HOST)))
        explain_tiers(kv, w, b, n);
    else
        snprintf(b, n, "%s: %s", core_err_name(rc), kvvm_strerror(rc));
}

int core_explain(kvvm *kv, const char *call, int rc)
{
    if ((rc != -ENOENT && rc != -E2BIG && rc != -ENOMEM) || *kvvm_last_error())
        return rc;
    const struct paging_why *w = paging_why(kv->pg, PG_WHY_GET, 0);
    char b[900];
    if (rc == -ENOENT && (w->what & PG_WHY_HANDLE))
        klast_set("%s: -ENOENT: sequence handle %#llx is not a live sequence of this context "
                  "(freed, or not made by its kvvm_seq_create or kvvm_seq_fork)", call,
                  (unsigned long long)w->handle);
    else if (rc == -E2BIG && (w->what & PG_WHY_LENGTH))
        klast_set("%s: -E2BIG: length %llu is past max_tokens %llu", call,
                  (unsigned long long)w->length, (unsigned long long)kv->cfg.max_tokens);
    else if (rc == -ENOMEM && (w->what & PG_WHY_NO_HOST) && !(w->what & PG_WHY_FRAMES))
        klast_set("%s: -ENOMEM: no host tier configured (host_budget %zu is below one page "
                  "of %zu bytes; KVVM_HOST_BUDGET): a sequence has nowhere to be swapped out "
                  "to", call, kv->cfg.host_budget, kv->cfg.page_size);
    else if (rc == -ENOMEM && ((w->what & (PG_WHY_FRAMES | PG_WHY_HOST | PG_WHY_NO_HOST)) ||
                               kv->pool)) {   /* a pool client: the daemon had no frame */
        explain_tiers(kv, w, b, sizeof b);
        klast_set("%s: -ENOMEM: %s", call, b);
    }
    return rc;
}
