/*
 * swap/undo.c: a failed call's reclaim taken back (contract in swap.h, swap_call_end).
 *
 * A call short of frames makes room first (swap_make_room, kvvm_set_budget's shrink) and
 * acts after: a map, set-access, copy or synchronization the driver refuses then fails the
 * call after its reclaim moved others. The moves are journaled while the call's reclaims act
 * (the journal reserved before the first move, so that noting one never fails) and taken
 * back in reverse order when the call fails: each victim is swapped in again (its pages are
 * whole below: host slots, disk, or still on the device where a sibling kept them) and gets
 * the use stamp it had, so the next call finds it as unprotected and as old as before.
 */
#include "swap_int.h"

#include <errno.h>
#include <stdlib.h>
#include "common/assert.h"
#include "common/log.h"

int swap_undo_reserve(struct swap *sw, size_t more, uint32_t pages)
{
    struct swap_undo *u = &sw->undo;
    if (u->n + more > u->cap) {
        size_t cap = u->n + more < 16 ? 16 : u->n + more;
        struct swap_undo_ent *e = realloc(u->e, cap * sizeof *e);
        if (!e)
            return -ENOMEM;
        u->e = e;
        struct pg_park **k = realloc(u->parks, cap * sizeof *k);
        if (!k)
            return -ENOMEM;
        u->parks = k;
        uint32_t *po = realloc(u->park_orph, cap * sizeof *po);
        if (!po)
            return -ENOMEM;
        u->park_orph = po;
        u->cap = cap;
    }
    if ((uint64_t)u->n_orph + pages > u->orph_cap) {
        uint64_t cap = (uint64_t)u->n_orph + pages;
        if (cap > UINT32_MAX)
            return -ENOMEM;
        uint32_t *o = realloc(u->orph, (size_t)cap * sizeof *o);
        if (!o)
            return -ENOMEM;
        u->orph = o;
        u->orph_cap = (uint32_t)cap;
    }
    return 0;
}

void swap_undo_on(struct swap *sw, bool on)
{
    struct swap_undo *u = &sw->undo;
    u->on = on;
    paging_orphan_log(sw->pg, on ? u->orph : NULL, u->orph_cap, &u->n_orph);
}

static void note(struct swap *sw, uint64_t h, const struct pg_use *before, bool stash)
{
    struct swap_undo *u = &sw->undo;
    if (!u->on)
        return;
    KVVM_ASSERT(u->n < u->cap);        /* reserved before the plan acted */
    u->e[u->n++] = (struct swap_undo_ent){ h, *before, stash };
}

void swap_undo_park(struct swap *sw, struct pg_park *k)
{
    struct swap_undo *u = &sw->undo;
    KVVM_ASSERT(u->on && u->n_parks < u->cap);      /* reserved: one per planned step */
    if (k) {
        u->park_orph[u->n_parks] = u->n_orph;
        u->parks[u->n_parks++] = k;
    }
}

uint32_t swap_undo_cache_stash(struct swap *sw, const struct swap_cache_ops *ops,
                               uint64_t *room)
{
    if (!ops->stash) {
        ops->act(ops->arg, false);
        return 1;
    }
    sw->undo.cache = ops;
    return ops->stash(ops->arg, room);
}

/* The parked drops' records freed and their frames no longer watched (the call ends). */
static void parks_end(struct swap *sw)
{
    struct swap_undo *u = &sw->undo;
    paging_park_end(sw->pg, u->parks, u->n_parks);
    u->n_parks = 0;
}

void swap_undo_note(struct swap *sw, uint64_t h, const struct pg_use *before)
{
    note(sw, h, before, false);
}

void swap_undo_stash(struct swap *sw, uint64_t h, const struct pg_use *before)
{
    note(sw, h, before, true);
}

bool swap_undo_stashed(const struct swap *sw, uint64_t h)
{
    const struct swap_undo *u = &sw->undo;
    for (size_t i = 0; i < u->n; i++)
        if (u->e[i].stash && u->e[i].h == h)
            return true;
    return false;
}

/* The call succeeded: its stashed drops are made (the sequences were swapped out whole;
   dropping them now releases host slots only). A drop refused here leaves the sequence
   swapped out, CACHED and whole (logged): never a wrong byte. */
static void commit_stashes(struct swap *sw)
{
    struct swap_undo *u = &sw->undo;
    for (size_t i = 0; i < u->n; i++)
        if (u->e[i].stash) {
            int r = paging_seq_stash_drop(sw->pg, u->e[i].h, &u->e[i].use);
            if (r)
                klog_warn("kvvm: a reclaim's drop of sequence %llx could not be made (%d): "
                          "it stays swapped out", (unsigned long long)u->e[i].h, r);
        }
}

/* Brings the orphans logged from index `to` on back, the last moved first: [to, *n_orph)
   (*n_orph becomes to). Each one back is rebased in the parks made before it moved down
   (parks [0, n_parks) whose mark is at most its index). */
static void orphans_back(struct swap *sw, uint32_t to, uint32_t *n_orph, size_t n_parks,
                         uint32_t *failed, int *first)
{
    struct swap_undo *u = &sw->undo;
    for (uint32_t i = *n_orph; i-- > to;) {
        size_t before = 0;             /* the parks made before it moved down */
        while (before < n_parks && u->park_orph[before] <= i)
            before++;
        int r = paging_undo_orphan(sw->pg, u->orph[i], u->parks, before);
        if (r) {
            (*failed)++;
            *first = *first ? *first : r;
        }
    }
    *n_orph = to;
}

/* Takes the journal's moves back in reverse order: the parked drops (acted last), each
   after the orphans that moved down after it (a page the drop shared with a victim gone
   before it was left an orphan, and went down once the victim's job was reaped: it comes
   back first, in a frame the park maps it from), then the stashed entries, then the other
   orphans (a page a victim's move left behind went down as an orphan after it, and comes
   back an orphan before the victim maps it again), then the sequences, the last moved
   first. *failed: those that could not; returns the first error. */
static int undo_moves(struct swap *sw, uint32_t *failed)
{
    struct swap_undo *u = &sw->undo;
    int first = 0;
    uint32_t n_orph = u->n_orph;
    *failed = 0;
    if (u->n_parks)
        paging_park_frames_last(sw->pg);
    /* the parked drops first (acted last): before any swap-in takes or writes a frame (the
       orphans back before one take the others first: its frames are last on the ready
       list) */
    for (size_t i = u->n_parks; i-- > 0;) {
        orphans_back(sw, u->park_orph[i], &n_orph, i + 1, failed, &first);
        int r = paging_park_undo(sw->pg, u->parks[i]);
        if (r) {
            (*failed)++;
            first = first ? first : r;
        }
    }
    /* then the stashed entries (acted before the drops) */
    if (u->cache) {
        uint32_t f = u->cache->stash_end(u->cache->arg, false);
        *failed += f;
        first = first ? first : f ? -ESTALE : 0;
        u->cache = NULL;
    }
    orphans_back(sw, 0, &n_orph, 0, failed, &first);
    for (size_t i = u->n; i-- > 0;) {
        int r = paging_reclaim_back(sw->pg, u->e[i].h, &u->e[i].use);
        if (r) {
            (*failed)++;
            first = first ? first : r;
        }
    }
    /* stream mode: the swap-ins' copies complete now, so the victims hold their pages on
       the device again when the call returns, as before it (not in flight) */
    if (u->n) {
        int r = swap_wait_copies(sw);
        if (r) {
            (*failed)++;
            first = first ? first : r;
        }
    }
    return first;
}

void swap_call_begin(struct swap *sw)
{
    sw->undo.in_call = true;
}

void swap_call_lost(struct swap *sw, uint32_t n)
{
    KVVM_ASSERT(sw->undo.in_call && !sw->undo.on);
    sw->undo.lost += n;
}

bool swap_journal_on(const struct swap *sw)
{
    return sw->undo.on;
}

int swap_call_end(struct swap *sw, int rc)
{
    struct swap_undo *u = &sw->undo;
    KVVM_ASSERT(!u->on);               /* no reclaim acts outside its call */
    u->in_call = false;
    if (rc >= 0 || (!u->n && !u->n_orph && !u->n_parks && !u->lost && !u->cache)) {
        if (rc >= 0)
            commit_stashes(sw);         /* commit: the drops are made */
        if (u->cache)
            u->cache->stash_end(u->cache->arg, rc >= 0);
        u->cache = NULL;
        parks_end(sw);
        u->n = 0;
        u->n_orph = 0;
        u->lost = 0;
        return rc;
    }
    uint32_t failed;
    int first = undo_moves(sw, &failed);
    uint32_t lost = u->lost;
    size_t n = u->n + u->n_orph + u->n_parks;
    parks_end(sw);
    u->n = 0;
    u->n_orph = 0;
    u->lost = 0;
    if (!failed && !lost)
        return rc;
    /* an error-level log is the thread's last error too (kvvm_last_error) */
    klog_error("kvvm: a failed call's reclaim could not be undone: %u of %zu moves not taken "
               "back (first error %d), %u not undoable (a drop or a prefix entry); they stay "
               "as the reclaim left them, each complete; the call returns -EIO (it failed %d)",
               failed, n, first, lost, rc);
    return -EIO;
}
