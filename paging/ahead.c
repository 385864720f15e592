/*
 * paging/ahead.c: map-ahead (owner frames): the frames mapped past a sequence's end, given
 * back to the pool (drops, steals) and topped up on the caller's thread, or refilled by the
 * frame pool thread (swap/frame_pool.c), so that a grow that does not outrun its map-ahead
 * makes no map or set-access call on the engine's thread (docs/design.md "Map-ahead").
 *
 * Without a pool thread (or map_ahead 0) a grow tops its sequence up itself at its end
 * (ahead_top_up, below), as before; so does a grow that outran its map-ahead (it mapped
 * its own pages already: the thread was late, or the grow jumped). Otherwise the grow only
 * queues the sequence (slot and generation) and asks for a round; the thread then, in
 * three steps:
 *  - plan (context lock): for each queued sequence still live, resident and below its low
 *    mark, takes the ready frames of its refill (FR_AHEAD at once: free for accounting, as
 *    map-ahead is) into a job naming the window range [at, at + k) per region, at =
 *    n_pages + n_ahead then; the handles are copied into the job;
 *  - work (no context lock): maps each job's runs (one map per frame, one set-access per
 *    run); a failed run is undone by vmm, the job records how many regions it mapped;
 *  - commit (context lock): a job whose sequence is the same one (live, same generation,
 *    resident, not dropped), still ends at `at` (n_pages + n_ahead: a grow inside the
 *    map-ahead keeps the sum) and has room in its array gets the frames as map-ahead;
 *    any other job is undone (its mapped runs unmapped, its frames ready again).
 * Between plan and commit the jobs' ranges belong to the thread: no other path maps or
 * unmaps a window page at or past n_pages + n_ahead but through map_run (window.c), which
 * cancels the jobs first when its range meets one of theirs (ahead_settle: waits for the
 * work, bounded by one round's maps of at most AHEAD_JOBS_MAX jobs, then undoes them all).
 * A grow of a sequence with a job that outruns its map-ahead waits and commits instead
 * (the frames become its pages), a pool short of frames cancels (ahead_steal), and
 * paging_feed_quiesce (budget, trim, detach) cancels too. The debug checker sees jobs in
 * flight: their frames are FR_AHEAD, their ranges may be mapped or not (ahead_covers).
 *
 * A premap (paging_seq_premap) is map-ahead on request, past map_ahead: a caller that knows
 * its sequence will grow soon (an attach whose store reads are in flight) has ready frames
 * mapped past its end now, the sequence's array widened (ahead_cap) where needed; it is
 * map-ahead like any other (stolen, dropped, taken by the grow), and premap_trim gives back
 * what is left past map_ahead.
 */
#include "paging_int.h"
#include "frames.h"
#include "ahead.h"
#include "view.h"
#include "window.h"

#include <stdlib.h>
#include <string.h>
#include "common/log.h"

/* ---- map-ahead on the caller's thread: drops, steals, top-ups ----------------------- */

/* Unmaps map-ahead frames beyond the first `keep` (per region); they become ready. Nothing
   reaches them (they are past the end), so no fence is needed. */
void ahead_drop(struct paging *pg, struct pg_seq *s, uint32_t keep)
{
    if (s->n_ahead <= keep)
        return;
    uint32_t n = s->n_ahead - keep, slot = pg_slot_of(pg, s);
    for (uint32_t r = 0; r < pg->p.n_regions; r++) {
        pg_frame_id *a = pg_ahead(pg, s, r) + keep;
        win_unmap_must(pg, pg_va(pg, r, slot, s->n_pages + keep), n);
        pool_give(pg, a, n);
    }
    s->n_ahead = keep;
}

void ahead_yield(struct paging *pg, struct pg_seq *s, uint32_t keep, uint32_t n)
{
    if (s->n_ahead > keep && pool_available(pg) - s->n_ahead * pg->p.n_regions < n)
        ahead_drop(pg, s, keep);
}

int ahead_steal(struct paging *pg, struct pg_seq *except)
{
    if (!pg->fr.n_ahead)
        return -ENOMEM;
    for (uint32_t i = 0; i < pg->p.max_seqs; i++) {
        struct pg_seq *s = &pg->seqs[i];
        if (s != except && s->n_ahead) {
            ahead_drop(pg, s, s->n_ahead - 1);
            return 0;
        }
    }
    if (pg->ahq.busy) {             /* the frame pool thread's refills in flight */
        ahead_settle(pg, false);
        return 0;
    }
    return view_break_group(pg);    /* the pool view's prepared groups are ahead too */
}

void ahead_drop_all(struct paging *pg)
{
    view_break_all(pg);
    for (uint32_t i = 0; i < pg->p.max_seqs && pg->fr.n_ahead; i++)
        if (pg->seqs[i].n_ahead)
            ahead_drop(pg, &pg->seqs[i], 0);
}

/* Best effort: maps ready frames ahead of s's end, in batches between two marks per region
   (ahead_deficit, ahead.c) in one run per region (one map per frame, one set-access
   per run), so a sequence that crosses a page per step refills every (map_ahead / 2 +
   1)-th crossing instead of at each. With the frame pool thread its refills run there
   (ahead_refill). */
/* Maps k ready frames per region (k <= n_ready / n_regions, within s's array) at s's
   map-ahead's end; all or none. */
static void ahead_map(struct paging *pg, struct pg_seq *s, uint32_t k)
{
    uint32_t nr = pg->p.n_regions, slot = pg_slot_of(pg, s);
    KVVM_ASSERT(k <= pg->fr.n_ready / nr && s->n_ahead + k <= s->ahead_cap);
    for (uint32_t r = 0; r < nr; r++) {
        pg_frame_id *a = pg_ahead(pg, s, r) + s->n_ahead;
        (void)pool_take_ready(pg, k, a);    /* k <= n_ready / nr: always k */
        uint64_t va = pg_va(pg, r, slot, s->n_pages + s->n_ahead);
        /* not scrubbed here: a map-ahead frame is unmapped at once when dropped, so no
           device work may target it; grow_region scrubs it when it becomes a page */
        if (win_map_frames(pg, va, a, k)) {
            pool_give(pg, a, k);
            goto out_undo;
        }
        for (uint32_t i = 0; i < k; i++)
            frame_set_ahead(pg, a[i]);
        continue;
out_undo:
        while (r-- > 0) {
            pg_frame_id *b = pg_ahead(pg, s, r) + s->n_ahead;
            win_unmap_must(pg, pg_va(pg, r, slot, s->n_pages + s->n_ahead), k);
            pool_give(pg, b, k);
        }
        return;
    }
    s->n_ahead += k;
}

void ahead_top_up(struct paging *pg, struct pg_seq *s)
{
    uint32_t k = ahead_deficit(pg, s);
    if (k > pg->fr.n_ready / pg->p.n_regions)
        k = pg->fr.n_ready / pg->p.n_regions;
    if (k)
        ahead_map(pg, s, k);
}

/* s's array made to hold cap frames per region (its map-ahead kept). false: no memory. */
static bool ahead_widen(struct paging *pg, struct pg_seq *s, uint32_t cap)
{
    uint32_t nr = pg->p.n_regions;
    pg_frame_id *a = calloc((size_t)nr * cap, sizeof *a);
    if (!a)
        return false;
    for (uint32_t r = 0; r < nr && s->n_ahead; r++)
        memcpy(a + (size_t)r * cap, pg_ahead(pg, s, r), s->n_ahead * sizeof *a);
    free(s->ahead);
    s->ahead = a;
    s->ahead_cap = cap;
    return true;
}

uint32_t paging_seq_premap(struct paging *pg, uint64_t h, uint32_t pages)
{
    struct pg_seq *s;
    if (seq_lookup(pg, h, &s) || s->out || s->dropped)
        return 0;
    ahead_settle_slot(pg, s);       /* a refill of s's in flight: settled first */
    uint32_t nr = pg->p.n_regions, room = pg->pages_per_slot - s->n_pages;
    if (pages > room)
        pages = room;
    uint32_t k = pages > s->n_ahead ? pages - s->n_ahead : 0;
    if (k > pg->fr.n_ready / nr)
        k = pg->fr.n_ready / nr;    /* ready frames only: no reclaim, no create */
    if (k && (s->n_ahead + k <= s->ahead_cap || ahead_widen(pg, s, s->n_ahead + k)))
        ahead_map(pg, s, k);
    return s->n_ahead;
}

void paging_seq_premap_trim(struct paging *pg, uint64_t h)
{
    struct pg_seq *s;
    if (!seq_lookup(pg, h, &s) && s->n_ahead > pg->p.map_ahead)
        ahead_drop(pg, s, pg->p.map_ahead);
}

/* ---- map-ahead refilled by the frame pool thread ----------------------------------- */

/* Jobs one round plans at most: bounds what a caller that must settle waits for. */
#define AHEAD_JOBS_MAX 16

/* Frames per region s's refill would bring it up to its high mark now (0: at or above its
   low mark), ready frames not counted: nothing while at least half of map_ahead (rounded
   up) is left, then back up to map_ahead; both marks shrink with the room left in its
   slot. */
uint32_t ahead_deficit(const struct paging *pg, const struct pg_seq *s)
{
    uint32_t room = pg->pages_per_slot - s->n_pages;
    uint32_t want = pg->p.map_ahead < room ? pg->p.map_ahead : room;
    uint32_t low = (pg->p.map_ahead + 1) / 2;
    if (low > want)
        low = want;
    return s->n_ahead >= low ? 0 : want - s->n_ahead;
}

static bool ahead_threaded(const struct paging *pg)
{
    return pg->fr.feed.on && pg->p.map_ahead;
}

/* Allocates the queue on first use. False: no memory (the caller tops up itself). */
static bool queue_ready(struct paging *pg)
{
    struct pg_ahq *q = &pg->ahq;
    if (q->slot)
        return true;
    uint32_t n = pg->p.max_seqs;
    q->slot = calloc(n, sizeof *q->slot);
    q->gen = calloc(n, sizeof *q->gen);
    q->queued = calloc(n, 1);
    q->jobs = calloc(AHEAD_JOBS_MAX, sizeof *q->jobs);
    if (q->slot && q->gen && q->queued && q->jobs)
        return true;
    ahead_fini(pg);
    return false;
}

void ahead_fini(struct paging *pg)
{
    struct pg_ahq *q = &pg->ahq;
    KVVM_ASSERT(!q->busy);
    free(q->slot);
    free(q->gen);
    free(q->queued);
    free(q->jobs);
    free(q->f);
    free(q->h);
    q->slot = q->gen = NULL;
    q->queued = NULL;
    q->jobs = NULL;
    q->f = NULL;
    q->h = NULL;
    q->n_q = 0;
}

void ahead_refill(struct paging *pg, struct pg_seq *s, bool outran)
{
    /* a grow that outran its map-ahead (the thread late, or a jump) batches here, as
       without the thread, rather than map page by page at each crossing until it catches
       up (it had no job in flight: the grow settled it first) */
    if (outran || !ahead_threaded(pg) || !queue_ready(pg)) {
        ahead_top_up(pg, s);
        return;
    }
    struct pg_ahq *q = &pg->ahq;
    uint32_t slot = pg_slot_of(pg, s);
    if (q->queued[slot] || !ahead_deficit(pg, s))
        return;
    q->queued[slot] = 1;
    q->slot[q->n_q] = slot;
    q->gen[q->n_q++] = s->gen;
    pool_feed_ask(pg);
}

/* ---- the thread's round --------------------------------------------------------------- */

/* Whether s is still the sequence of generation gen, and one map-ahead can be given to
   (live, resident, not dropped, with a map-ahead array). */
static bool ahead_takes(const struct pg_seq *s, uint32_t gen)
{
    return s->live && s->gen == gen && !s->out && !s->dropped && s->ahead;
}

/* The next queued sequence that still wants frames, with k of them per region (0 when the
   queue is empty). */
static struct pg_seq *queue_pop(struct paging *pg, uint32_t *k)
{
    struct pg_ahq *q = &pg->ahq;
    while (q->n_q) {
        uint32_t slot = q->slot[--q->n_q], gen = q->gen[q->n_q];
        q->queued[slot] = 0;
        struct pg_seq *s = &pg->seqs[slot];
        if (!ahead_takes(s, gen))
            continue;
        if ((*k = ahead_deficit(pg, s)) != 0)
            return s;
    }
    return NULL;
}

bool paging_ahead_plan(struct paging *pg)
{
    struct pg_ahq *q = &pg->ahq;
    uint32_t nr = pg->p.n_regions, k, total = 0;
    if (q->busy || !q->n_q || vmm_dead(pg->v))
        return false;
    /* one buffer for the round's frames and handles: the most it can take */
    size_t cap = (size_t)AHEAD_JOBS_MAX * pg->p.map_ahead * nr;
    if (!q->f && (!(q->f = malloc(cap * sizeof *q->f)) || !(q->h = malloc(cap * sizeof *q->h)))) {
        free(q->f);
        q->f = NULL;
        return false;
    }
    struct pg_seq *s;
    q->n_jobs = 0;
    while (q->n_jobs < AHEAD_JOBS_MAX && pg->fr.n_ready >= nr && (s = queue_pop(pg, &k))) {
        if (k > pg->fr.n_ready / nr)
            k = pg->fr.n_ready / nr;
        struct pg_ahead_job *j = &q->jobs[q->n_jobs++];
        *j = (struct pg_ahead_job){ .slot = pg_slot_of(pg, s), .gen = s->gen,
                                    .at = s->n_pages + s->n_ahead, .k = k, .first = total };
        (void)pool_take_ready(pg, k * nr, q->f + total);   /* k * nr <= n_ready */
        for (uint32_t i = 0; i < k * nr; i++) {
            frame_set_ahead(pg, q->f[total + i]);
            q->h[total + i] = frame_at(pg, q->f[total + i])->h;
        }
        total += k * nr;
    }
    if (!q->n_jobs)
        return false;
    q->pages = total;
    q->busy = true;
    pthread_mutex_lock(&pg->fr.feed.mu);
    q->done = false;
    pthread_mutex_unlock(&pg->fr.feed.mu);
    return true;
}

void paging_ahead_work(struct paging *pg)
{
    struct pg_ahq *q = &pg->ahq;
    uint32_t nr = pg->p.n_regions;
    for (uint32_t i = 0; i < q->n_jobs; i++) {
        struct pg_ahead_job *j = &q->jobs[i];
        for (j->mapped = 0; j->mapped < nr; j->mapped++) {
            uint64_t va = pg_va(pg, j->mapped, j->slot, j->at);
            if (vmm_map_run(pg->v, va, q->h + j->first + (size_t)j->mapped * j->k, j->k,
                            pg->p.page_size))
                break;
        }
    }
    pthread_mutex_lock(&pg->fr.feed.mu);
    q->done = true;
    pthread_cond_broadcast(&pg->fr.feed.cv);
    pthread_mutex_unlock(&pg->fr.feed.mu);
}

/* Whether job j may become its sequence's map-ahead now. */
static bool job_fits(struct paging *pg, const struct pg_ahead_job *j)
{
    const struct pg_seq *s = &pg->seqs[j->slot];
    return j->mapped == pg->p.n_regions && ahead_takes(s, j->gen) &&
           s->n_pages + s->n_ahead == j->at && s->n_ahead + j->k <= pg->p.map_ahead;
}

/* Commits (keep) or undoes every job; the jobs are done. Asks for another round when
   sequences are still queued. */
static void jobs_end(struct paging *pg, bool keep)
{
    struct pg_ahq *q = &pg->ahq;
    uint32_t nr = pg->p.n_regions;
    for (uint32_t i = 0; i < q->n_jobs; i++) {
        struct pg_ahead_job *j = &q->jobs[i];
        pg_frame_id *f = q->f + j->first;
        pg->c.maps += (uint64_t)j->mapped * j->k;
        if (keep && job_fits(pg, j)) {
            struct pg_seq *s = &pg->seqs[j->slot];
            for (uint32_t r = 0; r < nr; r++)
                memcpy(pg_ahead(pg, s, r) + s->n_ahead, f + (size_t)r * j->k,
                       j->k * sizeof *f);
            s->n_ahead += j->k;
            continue;
        }
        for (uint32_t r = 0; r < j->mapped; r++)
            win_unmap_must(pg, pg_va(pg, r, j->slot, j->at), j->k);
        pool_give(pg, f, j->k * nr);
    }
    q->n_jobs = 0;
    q->pages = 0;
    q->busy = false;
    if (q->n_q)
        pool_feed_ask(pg);     /* what this round left queued: another */
}

void paging_ahead_commit(struct paging *pg)
{
    if (pg->ahq.busy)
        jobs_end(pg, true);
}

/* ---- callers meeting the jobs --------------------------------------------------------- */

void ahead_settle(struct paging *pg, bool keep)
{
    struct pg_ahq *q = &pg->ahq;
    if (!q->busy)
        return;
    pthread_mutex_lock(&pg->fr.feed.mu);
    while (!q->done)
        pthread_cond_wait(&pg->fr.feed.cv, &pg->fr.feed.mu);
    pthread_mutex_unlock(&pg->fr.feed.mu);
    jobs_end(pg, keep);
}

void ahead_settle_slot(struct paging *pg, const struct pg_seq *s)
{
    struct pg_ahq *q = &pg->ahq;
    for (uint32_t i = 0; q->busy && i < q->n_jobs; i++)
        if (q->jobs[i].slot == pg_slot_of(pg, s))
            ahead_settle(pg, true);
}

void ahead_meet_va(struct paging *pg, uint64_t va, uint32_t n)
{
    struct pg_ahq *q = &pg->ahq;
    uint64_t end = va + (uint64_t)n * pg->p.page_size;
    for (uint32_t i = 0; q->busy && i < q->n_jobs; i++)
        for (uint32_t r = 0; r < pg->p.n_regions; r++) {
            uint64_t a = pg_va(pg, r, q->jobs[i].slot, q->jobs[i].at);
            if (va < a + (uint64_t)q->jobs[i].k * pg->p.page_size && a < end) {
                ahead_settle(pg, false);
                return;
            }
        }
}

bool ahead_covers(const struct paging *pg, uint32_t slot, uint32_t i)
{
    const struct pg_ahq *q = &pg->ahq;
    for (uint32_t n = 0; q->busy && n < q->n_jobs; n++)
        if (q->jobs[n].slot == slot && i >= q->jobs[n].at && i < q->jobs[n].at + q->jobs[n].k)
            return true;
    return false;
}
