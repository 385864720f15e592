/*
 * core/prefix_calls.c: the public calls of blocks and of the prefix cache keyed by content
 * (include/kvvm.h; the index is prefix/, its contract in prefix/prefix.h). attach follows
 * the calls that may move other sequences (core.h "Pressure"): check, let dst adopt the
 * entries' pages (a non-resident sequence holding them), count the frames bringing it in
 * takes, make room (swap/'s plan: the entries dst now holds are no victims), swap it in;
 * on any failure dst lets them go again, empty as it was.
 *
 * With a store (storeq.c): publish queues the new entries' blocks for the store thread;
 * lookup asks the store, without the context lock, for the keys past the local hit; attach
 * reads the store's blocks past the local prefix first (without the lock: one request per
 * 64 MiB, stopping at the first miss), then, locked, attaches the local prefix as above and
 * extends dst by the store's blocks (room made, grown, written on the engine stream) and
 * enters them as local entries; a failure there takes dst back to the local prefix and the
 * attach reports that: the store never makes an attach fail.
 *
 * The read overlaps the mapping of dst's pages: the first request is sent
 * (storeq_fetch_start) and, once its first block is known to be a hit (storeq_fetch_first:
 * an attach that misses maps nothing), dst's pages for the store's blocks are mapped ahead
 * of its end from ready frames, locked (paging_seq_premap: no length change, no reclaim,
 * nothing any other call can see but frames that are free for accounting), then the rest
 * of the request is waited for without the lock; the grow then takes the premapped frames
 * (no map, no set-access on the way to the copy). Only an empty dst with no local prefix is
 * premapped (its store blocks start at its end); what it holds past map_ahead at the end is
 * given back. A device short of ready frames for them (full of cached entries) gets its
 * room made there too, before the premap, by the moves that move no data only (the drops
 * of swap/'s plan, in its order: swap_make_room_ahead), bounded by the pages dst needs for
 * the blocks asked: a cache replacement for blocks the store confirmed it has. Those drops
 * stand whatever the read brings (fewer blocks: the call succeeds with them); they are made
 * in a call frame of their own, before the reads end, so no journal of the locked part can
 * take them back: should that part fail (dst freed or grown meanwhile by another thread, a
 * local prefix published meanwhile that cannot come in, no memory), it fails -EIO as a
 * call whose own reclaim dropped an entry no undo takes back does (swap_call_lost).
 */
#include "core.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include "common/assert.h"
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

/* With a store: which keys have an entry in ns before the publish (was[i] = 1), so that
   only the new entries are written. NULL without a store (or memory: nothing written). */
static uint8_t *present_before(kvvm *kv, uint64_t ns, const kvvm_key *keys, size_t n)
{
    uint8_t *was = kv->sq && n ? malloc(n) : NULL;
    for (size_t i = 0; was && i < n; i++)
        was[i] = prefix_lookup(kv->pfx, ns, &keys[i], 1, NULL, NULL, false) == 1;
    return was;
}

static int publish_locked(kvvm *kv, kvvm_seq s, uint64_t ns, const kvvm_key *keys, size_t n)
{
    uint8_t *was = present_before(kv, ns, keys, n);
    int rc = prefix_publish(kv->pfx, s, ns, keys, n);
    if (rc == -EINVAL)
        rc = kerr(rc, "kvvm_prefix_publish: %zu blocks are past the sequence's full blocks, "
                  "or one of them is discarded in a region", n);
    else if (rc == -EOPNOTSUPP)     /* the one cause (prefix.h): as kvvm_prefix_attach says */
        rc = kerr(rc, "kvvm_prefix_publish: page_size %zu is not a multiple of "
                  "bytes_per_token %llu: a block's tokens do not fill its page, so its pages "
                  "cannot be entered in the cache", kv->cfg.page_size,
                  (unsigned long long)kv->cfg.bytes_per_token);
    KVVM_ASSERT(rc < 0 || (size_t)rc <= n);   /* the new entries, at most n */
    if (rc > 0 && was)
        (void)storeq_publish(kv, s, ns, keys, n, was);   /* never waits for the store */
    if (rc >= 0)
        core_pool_publish(kv, s, ns, keys, n);          /* the daemon's shared index */
    free(was);
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
    /* the hot path (call.h hot_enter): a lookup moves nothing, makes no driver call and
       records no refusal, so none of enter()'s arming is needed; a bad argument, a forked
       child, a dead context and the debug build (its checker) take the full path */
    if (__builtin_expect(kv && keys && n <= INT32_MAX, 1) && hot_enter(kv)) {
        size_t k = prefix_lookup(kv->pfx, ns, keys, n, where, NULL, true);
        pthread_mutex_unlock(&kv->lock);
        k = core_pool_lookup(kv, ns, keys, n, k, where);  /* the daemon, without the lock */
        if (k < n && kv->sq)           /* the store, without the lock */
            k += storeq_lookup(kv->sq, ns, keys + k, n - k, where ? where + k : NULL);
        klast_clear();
        return (int)k;
    }
    klast_clear();
    NONNULL(kv);
    KEYS_CHECK(keys, n);
    if (n > INT32_MAX)
        n = INT32_MAX;                  /* the count is returned as an int */
    int rc = enter(kv);
    if (!rc)
        rc = leave(kv, (int)prefix_lookup(kv->pfx, ns, keys, n, where, NULL, true));
    if (rc >= 0)                        /* the daemon, without the lock */
        rc = (int)core_pool_lookup(kv, ns, keys, n, (size_t)rc, where);
    if (rc >= 0 && (size_t)rc < n)      /* past the local hit: the store, without the lock */
        rc += (int)storeq_lookup(kv->sq, ns, keys + rc, n - (size_t)rc, where ? where + rc : NULL);
    return api_done(__func__, rc);
}

/* dst adopts the k entries' pages ids, room is made for bringing them in, dst comes in. */
static int attach_in(kvvm *kv, kvvm_seq dst, const pg_page_id *ids, uint32_t k)
{
    uint64_t need;
    bool was_out;
    int rc = paging_seq_adopt(kv->pg, dst, ids, k, &was_out);
    if (rc)
        return rc;
    rc = paging_need(kv->pg, &(struct pg_need){ .of = PG_NEED_GROW, .h = dst }, &need);
    if (!rc)
        rc = core_make_room(kv, need, &dst, 1);
    if (!rc)
        rc = paging_swap_in(kv->pg, dst, false);
    if (rc)
        paging_seq_unadopt(kv->pg, dst, was_out);  /* empty, resident or not, as it was;
                                                      the entries keep their pages */
    return rc;
}

/* After attach_in of the *k blocks ids failed -EBADMSG (a page's disk copy is lost): the
   damaged blocks' entries are dropped (a miss from now on, as a store value failing its
   checksum) and the blocks before the first of them attach; *k becomes their count.
   attach_in's result for them (0 for none); -EBADMSG when no block is damaged. */
static int attach_undamaged(kvvm *kv, kvvm_seq dst, uint64_t ns, const kvvm_key *keys,
                            const pg_page_id *ids, size_t *k)
{
    uint32_t nr = kv->cfg.n_regions;
    size_t d = *k;
    for (size_t b = *k; b-- > 0;)
        if (paging_held_damaged(kv->pg, &ids[b * nr], nr)) {
            (void)prefix_drop(kv->pfx, ns, &keys[b], 1);
            d = b;
        }
    if (d == *k)
        return -EBADMSG;
    klog_warn("kvvm_prefix_attach: block %zu of the prefix read back damaged from disk: its "
              "entry is dropped, %zu blocks attach", d, d);
    *k = d;
    return d ? attach_in(kv, dst, ids, (uint32_t)d) : 0;
}

/* dst is a live, empty sequence; *n capped at the blocks a sequence holds. */
static int attach_check(kvvm *kv, kvvm_seq dst, size_t *n)
{
    struct paging_seq_info pi;
    int rc = paging_seq_info(kv->pg, dst, PG_INFO_LIVE, &pi);
    if (rc)
        return rc;
    if (pi.length)
        return kerr(-EINVAL, "kvvm_prefix_attach: sequence %llx is not empty (%llu tokens)",
                    (unsigned long long)dst, (unsigned long long)pi.length);
    uint64_t max_blocks = kv->cfg.max_tokens / (kv->cfg.page_size / kv->cfg.bytes_per_token);
    if (*n > max_blocks)
        *n = (size_t)max_blocks;        /* a sequence holds no more */
    return 0;
}

/* Resident dst holding blocks [0, k) grows to t blocks whose bytes are the store's (f's
   blocks k - k0 .. t - k0), which become local entries. On failure dst holds [0, k)
   again (its new pages released). 0 or -errno. */
static int store_in(kvvm *kv, kvvm_seq dst, uint64_t ns, const kvvm_key *keys, size_t k,
                    size_t t, size_t k0, const struct storeq_fetch *f)
{
    KVVM_ASSERT(k0 <= k && k <= t);   /* the store's blocks start at or before k */
    uint64_t tpb = kv->cfg.page_size / kv->cfg.bytes_per_token;
    uint64_t need;
    int rc = stream_check(kv);
    if (!rc)
        rc = paging_need(kv->pg, &(struct pg_need){ .of = PG_NEED_GROW, .h = dst,
                                                    .length = t * tpb }, &need);
    if (!rc)
        rc = core_make_room(kv, need, &dst, 1);
    if (!rc)
        rc = paging_grow(kv->pg, &dst, &(uint64_t){ t * tpb }, 1, 0);
    if (rc)
        return rc;
    rc = storeq_fetch_write(kv, f, dst, k - k0, t - k0, k);
    if (rc) {
        int trc = paging_seq_truncate(kv->pg, dst, k * tpb);
        if (trc)
            klog_error("kvvm_prefix_attach: taking sequence %llx back to its %zu local "
                       "blocks failed (%d)", (unsigned long long)dst, k, trc);
        return rc;
    }
    (void)prefix_publish(kv->pfx, dst, ns, keys, t);   /* -ENOMEM: not entered, no harm */
    /* counted as a swap-in brings blocks in (docs/api.md, stats): one per attach (k local
       blocks already counted theirs), every byte copied onto the device */
    kv->attach_swap_ins += k == 0;
    kv->attach_bytes_in += (uint64_t)(t - k) * kv->cfg.n_regions * kv->cfg.page_size;
    return 0;
}

/* The store's blocks f read for an attach whose dst took t blocks, k of them local (in:
   store_in's result, 1 where it was not tried; rc: the call's failure): the ones not
   attached are counted (store_unused) and why is logged at info level (the call itself
   succeeds with fewer blocks than the lookup found, or fails with its own reason). */
static void store_unused(kvvm *kv, const struct storeq_fetch *f, int rc, size_t k0, size_t k,
                         size_t t, int in)
{
    size_t used = in ? 0 : t - k;
    if (f->got <= used)
        return;
    kv->store_unused += f->got - used;
    char why[700], b[600];
    if (rc)
        snprintf(why, sizeof why, "the call failed (%s)", core_err_name(rc));
    else if (in < 0) {
        core_explain_text(kv, in, b, sizeof b);
        snprintf(why, sizeof why, "bringing them onto the device failed: %s", b);
    } else if (k < k0)
        snprintf(why, sizeof why, "the local prefix ends at block %zu now, before the "
                 "store's blocks (from block %zu)", k, k0);
    else
        snprintf(why, sizeof why, "blocks %zu to %zu are local entries now", k0, k - 1);
    klog_info("kvvm_prefix_attach: %zu of the %zu blocks read from the store not attached: "
              "%s", f->got - used, f->got, why);
}

/* Locked, on the way out of attach_locked: what attach_premap mapped ahead of dst (an
   empty dst with no local prefix, k0 0, f's blocks asked) and no grow took is given back
   past map_ahead, also when the call fails before attaching (dst grown meanwhile by
   another thread: the grow took some). A dst freed meanwhile has none; one that took the
   daemon's prefix has none either (paging_seq_import drops its whole map-ahead). */
static void premap_trim(kvvm *kv, kvvm_seq dst, size_t k0, const struct storeq_fetch *f)
{
    if (!k0 && f->m)
        paging_seq_premap_trim(kv->pg, dst);
}

/* k0 the local prefix and f the store's blocks past it, as seen before the lock was taken
   (f empty without a store). */
static int attach_locked(kvvm *kv, kvvm_seq dst, uint64_t ns, const kvvm_key *keys,
                         size_t n, size_t k0, const struct storeq_fetch *f, uint32_t ahead)
{
    size_t asked = n;
    if (ahead)                      /* attach_room_ahead's drops: a failure cannot undo them */
        swap_call_lost(kv->sw, 1);
    int rc = attach_check(kv, dst, &n);
    pg_page_id *ids = rc ? NULL : malloc((n ? n : 1) * kv->cfg.n_regions * sizeof *ids);
    if (!rc && !ids)
        rc = -ENOMEM;
    if (rc) {
        store_unused(kv, f, rc, k0, 0, 0, 1);
        premap_trim(kv, dst, k0, f);
        return rc;
    }
    if (n < asked)                      /* docs/api.md: the attach is capped there */
        klog_info("kvvm_prefix_attach: %zu keys, but a sequence holds at most %zu blocks "
                  "(max_tokens %llu, %llu tokens per block): at most %zu attach", asked, n,
                  (unsigned long long)kv->cfg.max_tokens,
                  (unsigned long long)(kv->cfg.page_size / kv->cfg.bytes_per_token), n);
    size_t k = prefix_lookup(kv->pfx, ns, keys, n, NULL, ids, false);
    int p = core_pool_attach(kv, dst, ns, keys, n, k);   /* the daemon's, when longer */
    if (p > 0) {
        free(ids);
        store_unused(kv, f, 0, k0, 0, 0, 1);
        prefix_count_hits(kv->pfx, (size_t)p);
        swap_after_call(kv->sw);
        return p;
    }
    rc = k ? stream_check(kv) : 0;
    if (!rc && k)
        rc = attach_in(kv, dst, ids, (uint32_t)k);
    if (rc == -EBADMSG)
        rc = attach_undamaged(kv, dst, ns, keys, ids, &k);
    free(ids);
    size_t t = k;
    int in = 1;
    if (!rc && k >= k0 && k < k0 + f->got && k0 + f->got <= n &&
        !(in = store_in(kv, dst, ns, keys, k, k0 + f->got, k0, f)))
        t = k0 + f->got;                /* the store's blocks follow the local ones */
    store_unused(kv, f, rc, k0, k, t, in);
    premap_trim(kv, dst, k0, f);
    prefix_count_hits(kv->pfx, rc ? 0 : t);
    swap_after_call(kv->sw);
    return rc ? rc : (int)t;
}

/* Locked, the store's first block a hit: the frames live dst needs to grow by m blocks made
   free where the ready ones fall short, by drops only (swap_make_room_ahead: no data moves,
   no LIVE sequence leaves; bounded by m, the blocks asked). Not while the engine stream
   captures a graph (a drop's release is recorded on the copy stream after it), nor for a
   pool client over its daemon's limit (its frames are the daemon's to give). *dropped: the
   frames the drops free (0: none made). Best effort: a refusal leaves it to the locked
   part's own room making; a dst swapped out meanwhile gets none (no premap for it). */
static void attach_room_ahead(kvvm *kv, kvvm_seq dst, size_t m, uint32_t *dropped)
{
    uint64_t tpb = kv->cfg.page_size / kv->cfg.bytes_per_token, need;
    *dropped = 0;
    if (!paging_seq_resident(kv->pg, dst) || stream_check(kv) || core_pool_over_limit(kv) ||
        paging_need(kv->pg, &(struct pg_need){ .of = PG_NEED_GROW, .h = dst,
                                               .length = (uint64_t)m * tpb }, &need) ||
        paging_frames_free(kv->pg) >= need)
        return;
    if (paging_wait_releases(kv->pg) || paging_frames_free(kv->pg) >= need)
        return;                     /* pending releases first, as make_room does */
    (void)swap_make_room_ahead(kv->sw, need > UINT32_MAX ? UINT32_MAX : (uint32_t)need,
                               &dst, 1, dropped);
}

/* While the store reads m blocks for empty dst (no local prefix: they start at its end):
   room made for them where the device is short (attach_room_ahead), then its pages for them
   mapped ahead from ready frames, locked (best effort: a failure, a dst gone or swapped
   out, too few frames map fewer or none, and change nothing visible but the drops).
   Returns the frames the drops freed (0: none made). */
static uint32_t attach_premap(kvvm *kv, kvvm_seq dst, size_t m)
{
    uint32_t dropped = 0;
    if (enter(kv))
        return 0;                   /* the locked part says why */
    uint32_t ps = m > UINT32_MAX ? UINT32_MAX : (uint32_t)m;   /* one page per block */
    if (!core_seq_stale(kv, dst)) {
        attach_room_ahead(kv, dst, m, &dropped);
        (void)paging_seq_premap(kv->pg, dst, ps);
    }
    (void)leave(kv, 0);
    return dropped;
}

/* The store's part of an attach, before the locked one: the local prefix k0 (dst checked
   first: a call that will fail reads nothing), f's buffer prepared inside the call frame,
   and the store's blocks past it read into f without the lock, dst's pages for them
   premapped while the first request is in flight (*ahead: the frames its room made ahead
   freed, 0 none). Nothing is read when the pool's daemon has a longer prefix than the
   local index (its blocks are attached instead). */
static int attach_fetch(kvvm *kv, kvvm_seq dst, uint64_t ns, const kvvm_key *keys, size_t n,
                        size_t *k0, struct storeq_fetch *f, uint32_t *ahead)
{
    int rc = enter(kv);
    if (rc)
        return rc;
    rc = attach_check(kv, dst, &n);
    if (!rc)
        *k0 = prefix_lookup(kv->pfx, ns, keys, n, NULL, NULL, false);
    if (!rc && *k0 < n)
        storeq_fetch_prepare(kv->sq, n - *k0, !stream_check(kv), f);   /* the kept staging */
    rc = leave(kv, core_explain(kv, "kvvm_prefix_attach", rc));
    if (rc || *k0 >= n)
        return rc;
    /* with a pool, the daemon's prefix comes before the store's, as kvvm_prefix_lookup
       orders them: when it is longer than the local one the locked part maps it and a
       store read would go unused, so none is made (one round trip more, a lookup, when the
       daemon has fewer) */
    if (core_pool_lookup(kv, ns, keys, n, *k0, NULL) > *k0)
        return 0;
    if (storeq_fetch_start(kv->sq, ns, keys + *k0, n - *k0, f))
        return 0;                   /* -ENOMEM: nothing read */
    if (*k0 == 0 && storeq_fetch_first(kv->sq, f))   /* a miss maps nothing */
        *ahead = attach_premap(kv, dst, n);
    storeq_fetch_finish(kv->sq, ns, keys + *k0, n - *k0, f);
    return 0;
}

static int attach_call(kvvm *kv, kvvm_seq dst, uint64_t ns, const kvvm_key *keys, size_t n)
{
    struct storeq_fetch f = { 0 };
    size_t k0 = 0;
    uint32_t ahead = 0;
    int rc = kv->sq ? attach_fetch(kv, dst, ns, keys, n, &k0, &f, &ahead) : 0;
    if (!rc)
        rc = enter(kv);
    if (!rc)
        rc = leave(kv, core_explain(kv, "kvvm_prefix_attach",
                                    attach_locked(kv, dst, ns, keys, n, k0, &f, ahead)));
    storeq_fetch_free(kv->sq, &f);
    return rc;
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
    uint64_t t0 = know_ns();
    int rc = attach_call(kv, dst, ns, keys, n);
    khist_add(&kv->attach_hist, know_ns() - t0);
    return api_done(__func__, rc);
}

int kvvm_prefix_drop(kvvm *kv, uint64_t ns, const kvvm_key *keys, size_t n)
{
    klast_clear();
    NONNULL(kv);
    KEYS_CHECK(keys, n);
    int rc = enter(kv);
    if (!rc)
        rc = leave(kv, (int)prefix_drop(kv->pfx, ns, keys, n));
    if (rc >= 0)
        storeq_drop(kv->sq, ns, keys, n);   /* without the lock: bounded by the timeout */
    if (rc >= 0)
        core_pool_prefix_drop(kv, ns, keys, n);   /* without the lock: the connection's */
    return api_done(__func__, rc);
}
