/*
 * swap/plan.c: plan-then-act reclaim (contract in swap.h, "reclaim plans"). Every reclaim
 * goes through here: a call short of frames (swap_make_room), kvvm_set_budget's shrink
 * (swap_reclaim_budget), the min watermark and the background thread. The plan is computed
 * whole and checked before anything moves; paging counts each victim's frees and slots
 * exactly (paging_plan_add), swap/ chooses which victims and how (the policy), paging moves
 * them when the plan is acted on.
 *
 * Order (one LRU order, swap_lru_sort): droppable CACHED sequences first (least recently used
 * first; a drop moves no data and needs no room below), then the prefix cache's entries no
 * sequence holds that have a page on the device (its own order: swap_cache_ops), then
 * orphan pages, then LIVE
 * sequences; PINNED ones never. Room below (host and disk slots) is counted per victim, with
 * all the pages its move copies down, not per shortfall: a LIVE victim whose move would not
 * fit in the room left is skipped and the next one tried; when the victims taken fill the
 * room before the shortfall is covered, the plan is made again without the least recently
 * used of them (a bigger victim may cover it alone). The call's own swap-in follows the
 * moves, in the room they leave: no move may leave it to borrow a staging slot its need did
 * not count (struct room, guard), and no move spills its host pages (paging_disk_keep).
 * Where no disk room takes spills, the host pages only the prefix cache's entries hold count
 * as host room: the moves' host room drops those entries (least recently used first, leaves
 * first), as many as the moves need, when they are acted on. Demotions (KVVM_F_CACHE_DEMOTE)
 * use only
 * the room the swap-outs leave: a demotion keeps a CACHED sequence's bytes, a swap-out is
 * what the call needs.
 */
#include "swap_int.h"
#include "common/assert.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define PLAN_PASSES 16      /* plans made again without an LRU victim, at most */

/* The room below as a plan uses it up, victim by victim: the facts paging reports
   (struct pg_room: free host slots, spill writes in flight and spillable host pages, the
   host tier's free, freeing and movable; free disk slots, the disk tier's free; the
   caller's own host pages are not spillable: paging_disk_keep) and the same choice paging
   makes for each swap-out (room.c's swap_plan: directly, spilling others, or
   staged through the host tier to disk).
   The caller's own swap-in comes after the victims' moves, in the room they leave: a
   non-resident caller with pages on disk (or getting some: a staged victim carrying a page
   it shares) reads them back through a host slot, free or made free by a spill, else it
   borrows one and parks that slot's page in a frame of its own. Its need counted that
   frame only if it had to borrow when planned (paging_seq_stage_facts); otherwise
   (`guard`) no move may leave the room where it would have to. */
struct room {
    struct pg_room f;
    bool disk;                     /* a disk tier that takes spills */
    bool guard;                    /* a non-resident caller whose need counted no borrow */
    bool kept_disk;                /* ... that has (or will have) pages on disk */
};

/* The caller's stage facts as its need counted them (no keep set yet), then the room facts
   with the keep set in place (paging_plan_begin gives both): the plan and the act set it
   (paging_disk_keep), so no move of theirs spills the caller's own host pages. Where no
   disk room takes spills, the host pages of the prefix cache's entries that no sequence
   holds count as free host slots: a move's host room (swap_host_room) drops those entries
   (swap_cache_ops.host_drop). */
static void room_init(struct room *m, struct swap *sw, const struct pg_plan_start *st)
{
    m->guard = st->keep_out && !st->keep_borrow;   /* a borrow: counted (paging_need ...) */
    m->kept_disk = st->keep_out && st->keep_disk;
    m->f = st->room;
    const struct pg_tier_room *h = &m->f.t[PG_LOWER_HOST], *d = &m->f.t[PG_LOWER_DISK];
    m->disk = st->disk && d->free + h->movable + h->freeing > 0;
    if (!m->disk && sw->cache.host_drop)
        m->f.t[PG_LOWER_HOST].free += sw->cache.host_drop(sw->cache.arg, UINT32_MAX, false);
}

/* The caller's staged swap-in would have to borrow a host slot in room f. */
static bool room_must_borrow(const struct pg_room *f)
{
    const struct pg_tier_room *h = &f->t[PG_LOWER_HOST], *d = &f->t[PG_LOWER_DISK];
    return !h->free && !h->freeing && (!d->free || !h->movable);
}

static uint64_t room_total(const struct room *m)
{
    return pg_room_total(&m->f, 0);
}

/* The room after a move copying k pages down (kk of them pages a kept sequence holds:
   those stay below for it, not spillable), as paging makes it (*staged: through the host
   tier to disk); false when paging would refuse the move. */
static bool room_move(const struct room *m, uint32_t k, uint32_t kk, struct pg_room *f,
                      bool *staged)
{
    uint32_t n_spillable = m->disk ? k - kk : 0;  /* the moved pages that become spillable */
    *f = m->f;
    *staged = false;
    struct pg_tier_room *h = &f->t[PG_LOWER_HOST], *d = &f->t[PG_LOWER_DISK];
    if (k <= h->free) {                /* the host tier takes it as it is */
        h->free -= k;
        h->movable += n_spillable;
        return true;
    }
    if (!m->disk)
        return false;
    struct pg_room r = *f;
    r.need = k;
    int mv = swap_plan(NULL, false, &r);
    if (mv < 0)
        return false;
    if (mv == PG_MOVE_DIRECT) {        /* host slots, then the writes, then spills */
        uint64_t rest = k - h->free;
        uint64_t w = rest < h->freeing ? rest : h->freeing;
        KVVM_ASSERT(rest - w <= h->movable && rest - w <= d->free);   /* what DIRECT means */
        h->freeing -= w;
        h->movable -= rest - w;
        d->free -= rest - w;
        h->free = 0;
        h->movable += n_spillable;
        return true;
    }
    if (!h->free && !h->freeing) {     /* staged: one slot made free to stage through */
        KVVM_ASSERT(h->movable > 0 && d->free > k);   /* swap_plan: a slot to stage through */
        h->movable--;
        d->free--;
        h->free++;
    }
    KVVM_ASSERT(d->free >= k);         /* swap_plan: the disk takes all k */
    d->free -= k;
    *staged = true;
    return true;
}

/* Takes the slots of a move copying k pages down (kk of them kept pages); false (nothing
   taken) when paging would refuse it, or when it would leave the caller's swap-in to borrow
   a slot its need did not count a frame for (guard). */
static bool room_take(struct room *m, uint32_t k, uint32_t kk)
{
    struct pg_room f;
    bool staged;
    if (!room_move(m, k, kk, &f, &staged))
        return false;
    /* a staged move carrying kept pages puts them on disk */
    bool kept_disk = m->kept_disk || (staged && kk);
    if (m->guard && kept_disk && room_must_borrow(&f))
        return false;
    m->f = f;
    m->kept_disk = kept_disk;
    return true;
}

/* paging's candidates of `of` not in excl (LIVE ones only when live; quiet ones only when
   quiet), LRU sorted; *out malloc'ed. */
static size_t collect(struct paging *pg, enum pg_cand_of of, bool live, bool quiet,
                      const uint64_t *excl, size_t n_excl, struct pg_cand **out)
{
    struct pg_cand *c;
    size_t k = paging_candidates(pg, &(struct pg_cand_q){ .of = of, .excl = excl,
                                                          .n_excl = n_excl, .live = live,
                                                          .quiet = quiet }, &c);
    swap_lru_sort(c, k);
    *out = c;
    return k;
}

/* Room for k more steps: taken before paging counts them (paging_plan_add), so a step
   counted is never one that could not be pushed. */
static int reserve(struct swap_rplan *p, size_t k)
{
    if (p->n + k <= p->cap)
        return 0;
    struct swap_step *s = realloc(p->steps, (p->n + k) * sizeof *s);
    if (!s)
        return -ENOMEM;
    p->steps = s;
    p->cap = p->n + k;
    return 0;
}

static void push(struct swap_rplan *p, uint64_t h, uint8_t kind, uint32_t frees, uint32_t slots)
{
    KVVM_ASSERT(p->n < p->cap);        /* reserve */
    p->steps[p->n++] = (struct swap_step){ h, kind, frees, slots };
    p->frees += frees;
    p->slots += slots;
}

static void pop(struct swap_rplan *p, struct paging *pg)
{
    KVVM_ASSERT(p->n > 0);
    struct swap_step *s = &p->steps[--p->n];
    KVVM_ASSERT(p->frees >= s->frees && p->slots >= s->slots);   /* push added them */
    paging_plan_remove(pg, s->h, s->kind == SWAP_DROP);
    p->frees -= s->frees;
    p->slots -= s->slots;
}

/* The LIVE victims from c[0..n), skipping banned ones and those that do not fit in *room,
   until p covers want. Returns the index of the first one taken (n: none). */
static size_t take_live(struct swap_rplan *p, struct paging *pg, const struct pg_cand *c,
                        size_t n, const bool *banned, struct room *room, int *rc)
{
    size_t first = n;
    *rc = reserve(p, n);
    for (size_t i = 0; i < n && p->have + p->frees < p->want && !*rc; i++) {
        uint32_t f, sl, ks;
        if (banned[i] || paging_plan_add(pg, c[i].h, false, &f, &sl, &ks))
            continue;
        if (!room_take(room, sl, ks)) {    /* its pages do not fit below: try the next */
            paging_plan_remove(pg, c[i].h, false);
            continue;
        }
        push(p, c[i].h, SWAP_OUT, f, sl);
        if (first == n)
            first = i;
    }
    return first;
}

static int plan_live(struct swap_rplan *p, struct paging *pg, struct room *room)
{
    struct pg_cand *c;
    size_t n = collect(pg, PG_CAND_RESIDENT, true, p->flags & SWAP_PLAN_QUIET, p->keep,
                       p->n_keep, &c);
    bool *banned = calloc(n ? n : 1, sizeof *banned);
    int rc = c && banned ? 0 : -ENOMEM;
    size_t base = p->n;
    for (int pass = 0; !rc && pass < PLAN_PASSES; pass++) {
        struct room left = *room;
        size_t first = take_live(p, pg, c, n, banned, &left, &rc);
        if (rc || p->have + p->frees >= p->want || first == n || (p->flags & SWAP_PLAN_PARTIAL)) {
            *room = left;
            break;
        }
        /* the room filled up before the shortfall was covered: again, without the least
           recently used victim taken */
        while (p->n > base)
            pop(p, pg);
        banned[first] = true;
    }
    free(banned);
    free(c);
    return rc;
}

/* CACHED victims as drops, least recently used first, until p covers want. */
static int plan_drops(struct swap_rplan *p, struct paging *pg)
{
    struct pg_cand *c;
    size_t n = collect(pg, PG_CAND_CACHED, false, p->flags & SWAP_PLAN_QUIET,
                       p->keep, p->n_keep, &c);
    int rc = reserve(p, n);
    for (size_t i = 0; i < n && p->have + p->frees < p->want && !rc; i++) {
        uint32_t f, sl, ks;
        if (!paging_plan_add(pg, c[i].h, true, &f, &sl, &ks))
            push(p, c[i].h, SWAP_DROP, f, 0);
    }
    free(c);
    return rc;
}

/* Drops become demotions while the room the swap-outs left holds all their pages. */
static void plan_demotions(struct swap_rplan *p, struct paging *pg, struct room *room)
{
    for (size_t i = 0; i < p->n; i++) {
        struct swap_step *s = &p->steps[i];
        if (s->kind != SWAP_DROP)
            continue;
        /* (every page counted as one a kept sequence may hold: none counted spillable) */
        uint32_t ub = paging_seq_device_pages(pg, s->h);
        if (!room_take(room, ub, ub))
            continue;
        KVVM_ASSERT(s->slots == 0);    /* a drop takes no slot below */
        s->kind = SWAP_DEMOTE;
        s->slots = ub;
        p->slots += ub;
    }
}

/* The cache's demotions take room as the CACHED ones do (swap_cache_ops.demote). */
static bool cache_room_take(void *ctx, uint32_t k)
{
    return room_take(ctx, k, 0);          /* entries carry none of the caller's pages */
}

int swap_reclaim_plan(struct swap *sw, uint32_t want, const uint64_t *excl, size_t n_excl,
                      unsigned flags, struct swap_rplan *p)
{
    struct paging *pg = sw->pg;
    memset(p, 0, sizeof *p);
    int rc = paging_plan_have(pg, excl, n_excl, &p->have);   /* excl not stale; free, coming */
    if (rc)
        return rc;
    p->want = want;
    p->flags = flags;
    if (p->have >= want)
        return 0;
    if (n_excl) {
        if (!(p->keep = malloc(n_excl * sizeof *p->keep)))
            return -ENOMEM;
        memcpy(p->keep, excl, n_excl * sizeof *p->keep);
        p->n_keep = n_excl;
    }
    bool swap = flags & SWAP_PLAN_SWAP;
    struct pg_plan_start st;           /* the keep set's facts, the room, the marks begun */
    paging_plan_begin(pg, p->keep, p->n_keep, &st);
    p->keep_dev = st.keep_dev;
    struct room room;
    room_init(&room, sw, &st);
    uint32_t orphans = st.orphans;
    rc = plan_drops(p, pg);
    if (!rc && sw->cache.plan && p->have + p->frees < p->want) {
        /* the prefix cache's entries no sequence holds: dropped like CACHED sequences */
        p->cache_ops = &sw->cache;
        p->cache = sw->cache.plan(sw->cache.arg, p->want - p->have - p->frees);
        p->frees += p->cache;
    }
    if (!rc && swap && p->have + p->frees < p->want) {
        /* orphans one by one, as paging moves them */
        while (p->orphans < orphans && p->have + p->frees < p->want &&
               room_take(&room, 1, 0)) {
            p->orphans++;
            p->frees++;
            p->slots++;
        }
        rc = plan_live(p, pg, &room);
    }
    if (!rc && swap && sw->p.cache_demote) {
        plan_demotions(p, pg, &room);
        if (p->cache && sw->cache.demote) {
            p->cache_slots = sw->cache.demote(sw->cache.arg, cache_room_take, &room);
            p->slots += p->cache_slots;
        }
    }
    p->room = swap ? room_total(&room) : 0;
    paging_disk_keep(pg, NULL, 0);
    if (!rc && p->have + p->frees < want && !(flags & SWAP_PLAN_PARTIAL))
        rc = -ENOMEM;                  /* checked: not enough can move, nothing moved */
    if (rc)
        swap_rplan_free(p);
    return rc;
}

void swap_rplan_free(struct swap_rplan *p)
{
    if (p->cache_ops && p->cache_ops->forget)
        p->cache_ops->forget(p->cache_ops->arg);
    free(p->steps);
    free(p->keep);
    memset(p, 0, sizeof *p);
}

/* ---- acting on a plan ---------------------------------------------------------------- */

/* Before a move of k pages: the room model counts an earlier move's pages as spillable once
   moved, but paging spills a host page only when its copy has completed: when the host tier
   cannot take the k pages as it is, wait for the copies started (*copying). */
static int act_settle(struct swap *sw, bool wait, uint32_t k, bool *copying)
{
    if (!wait || !*copying || paging_host_free(sw->pg) >= k)
        return 0;
    *copying = false;
    return swap_wait_copies(sw);
}

/* The moves of kind `kind` in plan order: swap-outs, or demotions (a demotion the tiers
   refuse falls back to a drop: that frees at least as much, and needs no room). */
static int act_moves(struct swap *sw, const struct swap_rplan *p, uint8_t kind, bool wait,
                     bool *copying, uint32_t *moved)
{
    int rc = 0;
    KVVM_ASSERT(kind == SWAP_OUT || kind == SWAP_DEMOTE);
    for (size_t i = 0; i < p->n && !rc; i++) {
        const struct swap_step *s = &p->steps[i];
        if (s->kind != kind || (rc = act_settle(sw, wait, s->slots, copying)))
            continue;
        struct pg_use use;             /* (a swap-out's copies: waited for below) */
        rc = paging_reclaim_move(sw->pg, s->h, kind == SWAP_OUT ? PG_RECLAIM_OUT
                                                                : PG_RECLAIM_DEMOTE, NULL, &use);
        *copying |= !rc;
        if (!rc)
            swap_undo_note(sw, s->h, &use);
        if (rc && rc != -EIO && kind == SWAP_DEMOTE) {
            struct pg_drop_done d;
            rc = paging_reclaim_drop(sw->pg, s->h, false, wait, NULL, &d);
            sw->undo.lost += sw->undo.on && !rc;
        }
        *moved += !rc;
    }
    return rc;
}

/* The drops: no data moves, no room below. A call's reclaim (the journal on) stashes each
   instead where the host tier's free slots take it as they are (a stash, paging_reclaim_move):
   the drop is made when the call succeeds, and taken back (a swap-in) when it fails (undo.c).
   Those run after the other moves, in the room they left; a drop no room takes is made at once
   and parked (paging_reclaim_drop does either): its undo maps its frames back where nothing
   wrote them since. */
static int act_drops(struct swap *sw, const struct swap_rplan *p, bool wait, uint64_t room,
                     uint32_t *moved)
{
    int rc = 0;
    for (size_t i = 0; i < p->n && !rc; i++) {
        const struct swap_step *s = &p->steps[i];
        if (s->kind != SWAP_DROP || (sw->undo.on && swap_undo_stashed(sw, s->h)))
            continue;                  /* (stashed before the moves: act_drops_free) */
        struct pg_drop_done d;         /* stashed, parked, or dropped at once */
        rc = paging_reclaim_drop(sw->pg, s->h, sw->undo.on, wait, &room, &d);
        if (!rc && d.how == PG_STASHED)
            swap_undo_stash(sw, s->h, &d.use);
        else if (!rc && d.how == PG_PARKED)
            swap_undo_park(sw, d.park);
        *moved += !rc;
    }
    return rc;
}

/* A call's reclaim: the drops whose stash takes no host slot (each of their device pages
   is shared with a resident sequence: a LIVE victim later in the plan, typically a fork)
   are stashed before the moves, where the plan counted them. Acted after the moves they
   would find those victims non-resident: their shared pages, which the plan counted as
   the victims' frees and slots, would stay on the device until the drop left them orphans
   (parked: an undo that cannot map them back once they move down), and a stash of the
   prefix cache's entries would take the host slots the plan counted for those pages in
   between; the call would fail short of frames. */
static int act_drops_free(struct swap *sw, const struct swap_rplan *p, uint32_t *moved)
{
    int rc = 0;
    for (size_t i = 0; i < p->n && !rc; i++) {
        const struct swap_step *s = &p->steps[i];
        uint64_t none = 0;             /* only a stash that takes no host slot */
        struct pg_use use;
        if (s->kind != SWAP_DROP ||
            (rc = paging_reclaim_move(sw->pg, s->h, PG_RECLAIM_STASH, &none, &use)) == 1) {
            rc = 0;
            continue;
        }
        if (!rc)
            swap_undo_stash(sw, s->h, &use);
        *moved += !rc;
    }
    return rc;
}

static int act(struct swap *sw, const struct swap_rplan *p, bool wait, uint32_t *moved)
{
    struct paging *pg = sw->pg;
    uint32_t orphans = 0;
    /* In the order the plan's room model used the room below: drops (none), orphans,
       swap-outs, then demotions (in the room the swap-outs left). Each move makes its own
       room below (spilling others, or staged), as the model chose for it: no spill ahead
       for all of them, which takes the disk slots a staged move was counted on. */
    /* a call's stashes take the room the plan left (p->room), not the host slots free now:
       pages a victim left on the device for a drop that still held them (its fork, or a
       sibling whose job was in flight) go down only after the wait, as orphans, in slots
       the plan counted for them */
    uint64_t room = p->slots ? p->room : UINT64_MAX;
    int rc = sw->undo.on ? act_drops_free(sw, p, moved) : act_drops(sw, p, wait, room, moved);
    if (!rc && p->cache && !sw->undo.on)
        p->cache_ops->act(p->cache_ops->arg, false);  /* frames free at once: unmapped */
    if (!rc && p->orphans) {
        rc = paging_reclaim_orphans(pg, p->orphans, p->keep, p->n_keep, &orphans);
        *moved += orphans ? 1 : 0;
    }
    bool copying = false;
    if (!rc)
        rc = act_moves(sw, p, SWAP_OUT, wait, &copying, moved);
    if (!rc)
        rc = act_moves(sw, p, SWAP_DEMOTE, wait, &copying, moved);
    if (!rc && p->cache_slots && !(rc = act_settle(sw, wait, p->cache_slots, &copying)))
        p->cache_ops->act(p->cache_ops->arg, true);   /* synchronous copies */
    if (!rc && p->cache && sw->undo.on)                /* stashed where room is left */
        sw->undo.lost += swap_undo_cache_stash(sw, p->cache_ops, &room);
    if (!rc && sw->undo.on)
        rc = act_drops(sw, p, wait, room, moved);      /* in the room left */
    if (!wait)
        return rc;
    /* the frames come back when the copies completed: wait for them (a drop's release
       behind a fence, and a sibling whose pages all stay behind, have jobs to reap too) */
    int wrc = (*moved || paging_frames_pending(pg)) ? swap_wait_copies(sw) : paging_reap(pg);
    if (wrc)
        return rc ? rc : wrc;
    /* A kept (non-resident) sequence's page whose last resident holder was a victim went
       down with it: its frame came free, and the caller maps it again (the plan counted
       no frame freed for it, and the caller's need none for it): the frames to make free
       are want plus those. Pages shared by siblings that all moved stay behind while the
       siblings' jobs are in flight; once reaped they are orphans: they move too (the plan
       counted them). */
    wrc = paging_reclaim_cover(pg, p->want, p->keep, p->n_keep, p->keep_dev);
    if (rc || (wrc == -ENOMEM && (p->flags & SWAP_PLAN_PARTIAL)))
        return rc;
    return wrc;                        /* -ENOMEM: a plan is exact, never, but never silently */
}

struct act_args {
    struct swap *sw;
    const struct swap_rplan *p;
    bool wait;
    uint32_t *moved;
};

static int act_kept(void *arg)
{
    struct act_args *a = arg;
    return act(a->sw, a->p, a->wait, a->moved);
}

int swap_reclaim_act(struct swap *sw, const struct swap_rplan *p, bool wait, uint32_t *moved)
{
    *moved = 0;
    if (!p->n && !p->orphans && !p->cache)
        return 0;
    /* the caller's own host pages stay where the plan counted them (room_init) */
    return paging_with_keep(sw->pg, p->keep, p->n_keep, act_kept,
                            &(struct act_args){ sw, p, wait, moved });
}
