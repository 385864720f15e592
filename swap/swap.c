/*
 * swap/swap.c: device victim choice, direct reclaim, watermarks and the background reclaim
 * and spill threads (contract in swap.h); the host tier's choices are in room.c.
 */
#include "swap_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "common/log.h"

struct swap {
    struct paging *pg;
    struct vmm *v;
    pthread_mutex_t *lock;         /* the context lock */
    struct swap_params p;
    uint32_t min_free, low_free, high_free;   /* in frames */
    struct swap_counters c;
    vmm_fence direct_fence;        /* used under the context lock only */
    vmm_fence thread_fence;        /* used by the thread only */
    bool direct_fence_ok, thread_fence_ok;
    uint32_t host_min_free, host_low_free, host_high_free;   /* in host slots */
    /* below: under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;             /* wake / idle changes */
    bool stop;
    struct swap_worker reclaim;    /* the reclaim thread (its flags under mu) */
    struct swap_worker spill;      /* the spill thread (its flags under mu) */
};

static uint32_t frames_free(struct swap *sw)
{
    return paging_frames_free(sw->pg);
}

static bool excluded(uint64_t h, const uint64_t *excl, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (excl[i] == h)
            return true;
    return false;
}

/* Victims in LRU order, excl removed. *out is malloc'ed. What they free is asked for along
   that order, as far as a caller needs (paging_frees_upto). */
static size_t victims(struct swap *sw, const uint64_t *excl, size_t n_excl, struct pg_cand **out)
{
    struct pg_cand *c;
    size_t n = swap_collect(sw->pg, paging_candidates, &c);
    if (!c) {
        *out = NULL;
        return 0;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)      /* LIVE only: CACHED go first (cached_step), PINNED never */
        if (!excluded(c[i].h, excl, n_excl) && paging_seq_class(sw->pg, c[i].h) == PG_SEQ_LIVE)
            c[k++] = c[i];
    swap_lru_sort(c, k);
    *out = c;
    return k;
}

/* ---- classes: CACHED sequences go first (dropped, or demoted), PINNED never move ---- */

static int wait_fence(struct swap *sw, vmm_fence *f, bool *ok);

/* Droppable CACHED sequences not in excl, least recently used first; *frees the frames
   dropping all of them frees. *out is malloc'ed (NULL when none). */
static size_t cached_victims(struct swap *sw, const uint64_t *excl, size_t n_excl,
                             struct pg_cand **out, uint32_t *frees)
{
    struct pg_cand *c;
    size_t n = swap_collect(sw->pg, paging_cached_candidates, &c);
    *out = NULL;
    *frees = 0;
    if (!c)
        return 0;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!excluded(c[i].h, excl, n_excl))
            c[k++] = c[i];
    *frees = paging_drop_frees(sw->pg, c, k);
    swap_lru_sort(c, k);
    *out = c;
    return k;
}

uint32_t swap_cached_frees(struct swap *sw, const uint64_t *excl, size_t n_excl)
{
    struct pg_cand *c;
    uint32_t frees;
    cached_victims(sw, excl, n_excl, &c, &frees);
    free(c);
    return frees;
}

/* Drops CACHED victims, least recently used first, until `target` frames are free or on
   their way back (frees of drops whose release waits for a fence included); with
   KVVM_F_CACHE_DEMOTE, may_swap and room below, demotes (swaps out) instead. wait: block
   until dropped pages are released (direct reclaim). Returns the frames free or coming;
   *acted the sequences dropped or demoted. Context lock held. */
static uint32_t cached_step(struct swap *sw, uint32_t target, const uint64_t *excl,
                            size_t n_excl, bool may_swap, bool wait, uint32_t *acted)
{
    uint32_t have = frames_free(sw) + paging_frames_pending(sw->pg), frees;
    *acted = 0;
    if (have >= target)
        return have;
    struct pg_cand *c;
    size_t n = cached_victims(sw, excl, n_excl, &c, &frees);
    for (size_t i = 0; i < n && have < target; i++) {
        uint32_t before = frames_free(sw) + paging_frames_pending(sw->pg);
        bool demote = may_swap && sw->p.cache_demote &&
                      paging_room_below(sw->pg) >= c[i].frees;
        int rc = demote ? paging_seq_demote(sw->pg, c[i].h) : -ENOMEM;
        if (rc)                      /* no demotion (or no room for it): drop, copy nothing */
            rc = paging_seq_drop(sw->pg, c[i].h, wait);
        if (rc)
            continue;
        (*acted)++;
        uint32_t now = frames_free(sw) + paging_frames_pending(sw->pg);
        /* a release behind a fence returns its frames later: count them as coming */
        have += now > before ? now - before : c[i].frees;
    }
    free(c);
    return have;
}

int swap_drop_cached(struct swap *sw, uint32_t want, const uint64_t *excl, size_t n_excl,
                     bool may_swap)
{
    uint32_t have = frames_free(sw) + paging_frames_pending(sw->pg), acted;
    if (have >= want)
        return 0;
    if (have + swap_cached_frees(sw, excl, n_excl) < want)
        return -ENOMEM;              /* all or nothing: nothing dropped */
    cached_step(sw, want, excl, n_excl, may_swap, true, &acted);
    int rc = paging_frames_pending(sw->pg) ? wait_fence(sw, &sw->direct_fence,
                                                        &sw->direct_fence_ok) : 0;
    if (!rc)
        rc = paging_reap(sw->pg);
    if (!rc && frames_free(sw) < want)
        rc = -ENOMEM;
    return rc;
}

/* Starts moves until `target` frames are free or on their way back. Returns the number of
   sequences moved; *rc the first error. Context lock held. */
static uint32_t move_until(struct swap *sw, uint32_t target, const uint64_t *excl,
                           size_t n_excl, bool all_or_nothing, int *rc)
{
    uint32_t moved_seqs = 0, orphans = 0;
    *rc = 0;
    uint32_t have = frames_free(sw) + paging_frames_pending(sw->pg);
    if (have >= target)
        return 0;
    struct pg_cand *c;
    size_t n = victims(sw, excl, n_excl, &c);
    uint32_t n_orphans = paging_orphans(sw->pg);
    /* classes: CACHED sequences are dropped (or demoted) before any LIVE one moves; a
       drop needs no room below */
    uint32_t cfrees = swap_cached_frees(sw, excl, n_excl), acted = 0;
    /* all or nothing, checked before anything moves (other sequences' host pages
       included): the victims' frames must cover the shortfall and the tiers below must
       take them (one host or disk slot per frame). The victims' frees are counted along the
       LRU order until they cover it (exact: the whole set covers it just when a prefix does) */
    uint64_t got = (uint64_t)have + cfrees + n_orphans;
    uint32_t short_by = got < target ? (uint32_t)(target - got) : 0;
    if (all_or_nothing && ((short_by && paging_frees_upto(sw->pg, c, n, short_by) < short_by) ||
                           paging_room_below(sw->pg) + cfrees < target - have)) {
        free(c);
        *rc = -ENOMEM;
        return 0;
    }
    if (cfrees) {
        have = cached_step(sw, target, excl, n_excl, true, all_or_nothing, &acted);
        moved_seqs += acted;
        if (have >= target) {
            free(c);
            return moved_seqs;
        }
    }
    /* the host tier makes room on disk first (a caller waiting here needs the frames) */
    if (paging_has_disk(sw->pg) && paging_host_free(sw->pg) < target - have)
        (void)swap_host_room(sw->pg, target - have, 0);
    if (n_orphans) {
        *rc = paging_reclaim_orphans(sw->pg, target - have, &orphans);
        have += orphans;
        if (*rc == -ENOMEM)
            *rc = 0;            /* host tier full: sequences below will say so */
    }
    for (size_t i = 0; i < n && have < target && !*rc; i++) {
        *rc = paging_swap_out(sw->pg, c[i].h, true);   /* copies waited for below */
        if (!*rc) {
            moved_seqs++;
            /* exact: a sibling's shared pages move with the last resident holder */
            have = frames_free(sw) + paging_frames_pending(sw->pg);
        }
    }
    free(c);
    if (!*rc && have < target && !moved_seqs && !orphans)
        *rc = -ENOMEM;
    return moved_seqs + (orphans ? 1 : 0);
}

static int wait_fence(struct swap *sw, vmm_fence *f, bool *ok)
{
    if (!*ok) {
        int rc = vmm_fence_create(sw->v, f);
        if (rc)
            return rc;
        *ok = true;
    }
    int rc = paging_copy_fence_record(sw->pg, f);
    return rc ? rc : vmm_fence_wait(sw->v, f);
}

static int reclaim_now(struct swap *sw, uint32_t want, const uint64_t *excl, size_t n_excl);

int swap_reclaim_direct(struct swap *sw, uint32_t want, const uint64_t *excl, size_t n_excl)
{
    if (!sw->p.auto_swap)
        return -ENOMEM;
    return reclaim_now(sw, want, excl, n_excl);
}

/* Direct reclaim itself (KVVM_F_AUTO_SWAP checked by the callers that need it). */
static int reclaim_now(struct swap *sw, uint32_t want, const uint64_t *excl, size_t n_excl)
{
    uint64_t t0 = know_ns();
    int rc;
    uint32_t moved = move_until(sw, want, excl, n_excl, true, &rc);
    if (!rc || moved) {
        /* the frames come back when the copies completed: wait for them (direct reclaim) */
        /* (a sibling whose pages all stay behind still has a job to reap: wait for it) */
        int wrc = (moved || paging_frames_pending(sw->pg))
                      ? wait_fence(sw, &sw->direct_fence, &sw->direct_fence_ok) : 0;
        if (!wrc)
            wrc = paging_reap(sw->pg);
        /* Pages shared by siblings that all moved stay behind while the siblings' jobs are
           in flight; once reaped they are orphans: move them too. */
        uint32_t fr = frames_free(sw), o = 0;
        if (!wrc && fr < want && paging_orphans(sw->pg)) {
            wrc = paging_reclaim_orphans(sw->pg, want - fr, &o);
            if (wrc == -ENOMEM)
                wrc = 0;                   /* host tier full: the check below says so */
        }
        if (!rc)
            rc = wrc;
    }
    if (moved) {
        sw->c.direct_reclaims++;
        sw->c.direct_swap_outs += moved;
        sw->c.direct_ns += know_ns() - t0;
    }
    if (!rc && frames_free(sw) < want)
        rc = -ENOMEM;
    return rc;
}

/* ---- budget changes (kvvm_set_budget) ----------------------------------------------- */

int swap_reclaim_budget(struct swap *sw, uint32_t want)
{
    /* the same victims, order and all-or-nothing check as direct reclaim (move_until), with
       or without KVVM_F_AUTO_SWAP (API: a budget shrink swaps out regardless) */
    return reclaim_now(sw, want, NULL, 0);
}

void swap_set_frames(struct swap *sw, uint32_t frames)
{
    sw->p.frames = frames;
    sw->min_free = (uint32_t)(sw->p.min * frames);
    sw->low_free = (uint32_t)(sw->p.low * frames);
    sw->high_free = (uint32_t)(sw->p.high * frames);
    if (sw->high_free > frames)
        sw->high_free = frames;
}

/* Asks w for a round unless one runs or the last one found nothing to do (until the next
   step clears futile). */
static void wake_worker(struct swap *sw, struct swap_worker *w)
{
    pthread_mutex_lock(&sw->mu);
    if (!w->futile && !w->active) {
        w->wake = true;
        pthread_cond_broadcast(&sw->cv);
    }
    pthread_mutex_unlock(&sw->mu);
}

static void spill_wake(struct swap *sw)
{
    if (!sw->spill.running)
        return;
    size_t f = paging_host_free(sw->pg);
    if (f >= sw->host_low_free)
        return;
    if (f < sw->host_min_free) {
        /* below min the caller starts writes itself (it does not wait for them), so the
           response to pressure does not depend on the thread being scheduled */
        uint32_t started;
        swap_spill(sw->pg, (uint32_t)(sw->host_low_free - f), 0, &started);
    }
    wake_worker(sw, &sw->spill);
}

void swap_after_call(struct swap *sw)
{
    paging_disk_reap(sw->pg);
    spill_wake(sw);
    if (!sw->p.auto_swap)
        return;
    uint32_t f = frames_free(sw);
    if (f >= sw->low_free)
        return;
    if (f < sw->min_free) {
        uint32_t dummy = sw->low_free;
        (void)swap_reclaim_direct(sw, dummy, NULL, 0);   /* best effort: the call succeeded */
        if (frames_free(sw) >= sw->low_free)
            return;
    }
    if (!sw->reclaim.running)
        return;
    wake_worker(sw, &sw->reclaim);
}

void swap_after_step(struct swap *sw)
{
    pthread_mutex_lock(&sw->mu);
    sw->reclaim.futile = false;
    sw->spill.futile = false;
    pthread_mutex_unlock(&sw->mu);
    swap_after_call(sw);
}

/* One round of the reclaim thread (its worker: context current, relaxed capture mode). */
static bool reclaim_round(void *arg)
{
    struct swap *sw = arg;
    int rc = 0;
    uint32_t moved = 0;
    pthread_mutex_lock(sw->lock);
    /* Nothing here records on or enqueues onto the engine stream, so a round may run
       while the engine captures a graph: swapping out the unprotected victims orders
       the copy stream after the last step's fence (paging's copies_after_engine), and
       orphan pages have no engine work left (paging_reclaim_orphans). */
    moved = move_until(sw, sw->high_free, NULL, 0, false, &rc);
    /* (moved: a drop's release may wait for a fence on the copy stream too) */
    int wrc = (paging_frames_pending(sw->pg) || moved)
                  ? paging_copy_fence_record(sw->pg, &sw->thread_fence) : 1;
    if (moved) {
        sw->c.reclaim_runs++;
        sw->c.reclaim_swap_outs += moved;
    }
    pthread_mutex_unlock(sw->lock);
    if (wrc == 0) {
        /* the copies complete without the lock held; then the frames are pooled */
        vmm_fence_wait(sw->v, &sw->thread_fence);
        pthread_mutex_lock(sw->lock);
        paging_reap(sw->pg);
        pthread_mutex_unlock(sw->lock);
    }

    pthread_mutex_lock(sw->lock);
    spill_wake(sw);           /* the host tier just filled up */
    pthread_mutex_unlock(sw->lock);
    return moved != 0;        /* nothing moved: nothing movable until the next step */
}

/* One round of the spill thread (its worker: relaxed capture mode). */
static bool spill_round(void *arg)
{
    struct swap *sw = arg;
    bool any = false;
    for (;;) {
        uint32_t started = 0;
        pthread_mutex_lock(sw->lock);
        paging_disk_reap(sw->pg);
        size_t f = paging_host_free(sw->pg);
        if (f < sw->host_high_free)
            swap_spill(sw->pg, (uint32_t)(sw->host_high_free - f), 0, &started);
        if (started)
            sw->c.spill_runs++;
        pthread_mutex_unlock(sw->lock);
        if (!started)
            break;
        any = true;
        paging_disk_wait_io(sw->pg);     /* the writes complete without the lock */
    }
    pthread_mutex_lock(sw->lock);
    paging_disk_reap(sw->pg);
    pthread_mutex_unlock(sw->lock);
    return any;               /* nothing started: nothing spillable until the next step */
}

int swap_create(struct paging *pg, struct vmm *v, pthread_mutex_t *lock,
                const struct swap_params *p, struct swap **out)
{
    struct swap *sw = calloc(1, sizeof *sw);
    if (!sw)
        return -ENOMEM;
    sw->pg = pg;
    sw->v = v;
    sw->lock = lock;
    sw->p = *p;
    sw->min_free = (uint32_t)(p->min * p->frames);
    sw->low_free = (uint32_t)(p->low * p->frames);
    sw->high_free = (uint32_t)(p->high * p->frames);
    if (sw->high_free > p->frames)
        sw->high_free = p->frames;
    sw->host_min_free = (uint32_t)(p->host_min * p->host_slots);
    sw->host_low_free = (uint32_t)(p->host_low * p->host_slots);
    sw->host_high_free = (uint32_t)(p->host_high * p->host_slots);
    if (sw->host_high_free > p->host_slots)
        sw->host_high_free = p->host_slots;
    pthread_mutex_init(&sw->mu, NULL);
    pthread_cond_init(&sw->cv, NULL);
    sw->reclaim = (struct swap_worker){ .name = "reclaim", .v = v, .make_current = true,
                                        .round = reclaim_round, .arg = sw, .mu = &sw->mu,
                                        .cv = &sw->cv, .stop = &sw->stop };
    sw->spill = (struct swap_worker){ .name = "spill", .v = v, .round = spill_round,
                                      .arg = sw, .mu = &sw->mu, .cv = &sw->cv,
                                      .stop = &sw->stop };
    int rc = 0;
    if (p->disk && p->host_slots) {
        rc = swap_worker_start(&sw->spill);
        if (rc)
            goto out_free;
    }
    if (p->auto_swap && p->thread) {
        rc = vmm_fence_create(v, &sw->thread_fence);
        if (rc)
            goto out_spill;
        sw->thread_fence_ok = true;
        rc = swap_worker_start(&sw->reclaim);
        if (rc)
            goto out_fence;
    }
    /* paging asks the host tier's choices of room.c from now on */
    paging_set_policy(pg, &(struct pg_policy_ops){ .arg = pg, .host_room = swap_host_room,
                                                    .plan = swap_plan });
    *out = sw;
    return 0;
out_fence:
    vmm_fence_destroy(v, &sw->thread_fence);
out_spill:
    swap_worker_stop(&sw->spill);
out_free:
    pthread_cond_destroy(&sw->cv);
    pthread_mutex_destroy(&sw->mu);
    free(sw);
    return rc;
}

void swap_destroy(struct swap *sw)
{
    if (!sw)
        return;
    swap_worker_stop(&sw->reclaim);       /* (the one stop flag ends both threads) */
    swap_worker_stop(&sw->spill);
    paging_set_policy(sw->pg, NULL);
    if (sw->thread_fence_ok)
        vmm_fence_destroy(sw->v, &sw->thread_fence);
    if (sw->direct_fence_ok)
        vmm_fence_destroy(sw->v, &sw->direct_fence);
    pthread_cond_destroy(&sw->cv);
    pthread_mutex_destroy(&sw->mu);
    free(sw);
}

void swap_wait_idle(struct swap *sw)
{
    if (!sw || (!sw->reclaim.running && !sw->spill.running))
        return;
    pthread_mutex_lock(&sw->mu);
    while (sw->reclaim.wake || sw->reclaim.active || sw->spill.wake || sw->spill.active)
        pthread_cond_wait(&sw->cv, &sw->mu);
    pthread_mutex_unlock(&sw->mu);
}

void swap_counters(struct swap *sw, struct swap_counters *out)
{
    *out = sw->c;
}
