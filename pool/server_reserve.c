/*
 * pool/server_reserve.c: the daemon's frame reserve (server_int.h "srv_reserve"): fresh
 * frames created and exported ahead, and the release of frames that died, made by the
 * server's loop when it has nothing else to do, off the path of a client that waits for
 * frames. Design: docs/design.md "The pool daemon" ("The reserve").
 *
 * Why: a frame given back is never handed to another client (its old holder may still map
 * it); the asker gets a fresh one. Creating, poisoning and exporting a frame and releasing
 * the old one are the daemon's per-frame work of a take-back; here they run in the loop's
 * idle moments (while the giver is still swapping out and releasing its imports), so the
 * grant mostly sends descriptors that are ready. No thread: the daemon stays one thread,
 * whose unmaps need no other CPU's TLB flushed, and a client's message waits behind at
 * most one unit of this work (one create or one release).
 *
 * Counts: live = the daemon's live frames (s->leased, mirrored here: take adds one, dispose takes
 * one off), ready = fresh frames made ahead (held by no client), dying = dead frames whose handle
 * and export descriptor are still to be released (the close waits with the release: a
 * take-back's RETURNs make no system call per frame here). The device holds live + ready +
 * dying frames, never more than dev: the pool, plus the room the device had past it at open
 * (its free memory then less a margin of 1/20 of its size, the budget's own margin; none
 * when unknown). A frame is made ahead only below dev (made before any release while there
 * is room: the next take-back wants the reserve ready, the releases only make room), and a
 * take that must create with no ready frame first releases dying frames while the sum would
 * pass it. So a pool whose frames are all leased keeps its reserve where the device has room
 * past the pool (issue 34: a take-back then grants ready frames instead of creating them on
 * the asker's path), and the pool's figures never count it (free_bytes is pool_frames -
 * leased: ready frames are no client's and no part of the pool's accounting).
 * During a take-back (a lease waits, a client is asked, or an asker holds a credit) no frame is
 * made past the pool and no dying frame is released: the loop serves the giver's RETURNs and the
 * grants first, and the giver's copies and the asker's imports have the CPU; frames made ahead or
 * released then could only delay them (a release frees the frame's memory: for an emulated frame
 * its pages, as much work as the poison of a new one). The releases wait until the round and its
 * credits end; a take that must create releases what it needs itself (srv_reserve_take).
 *
 * Its size: at least --reserve-frames (base), and up to the largest need a call's lease
 * announced (protocol.h LEASE's need: srv_reserve_need), so that a take-back of that size
 * finds its frames ready the next time; never past dev. A reserve of 0 stays none.
 */
#include "server_int.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/assert.h"

struct srv_ready {
    vmm_handle h;
    int fd;                             /* its export (the caller closes after sending) */
};

/* A dead frame to release: its handle and its export, closed at the release (issue 34: a
   take-back's RETURNs make no system call per frame in the daemon). */
struct srv_dying {
    vmm_handle h;
    int xfd;
};

struct srv_reserve {
    struct vmm *v;
    size_t page, pool, max;             /* max: the most kept ready now (base .. dev) */
    size_t base;                        /* --reserve-frames: max's floor */
    size_t cap_ready;                   /* room in ready[] */
    size_t dev;                         /* frames the device may hold: pool + room past it */
    size_t live;
    struct srv_ready *ready;            /* max of them */
    size_t n_ready;
    struct srv_dying *dying;
    size_t n_dying, cap_dying;
    bool failed;                        /* the last create ahead failed: none until a frame
                                           dies (the device is short) */
    struct srv_reserve_counts k;
};

/* A fresh frame: created (the emulator poisons it), exported. 0; -errno. */
static int frame_make(struct srv_reserve *r, struct srv_ready *out)
{
    int rc = vmm_phys_create(r->v, r->page, &out->h);
    if (rc)
        return rc;
    if ((rc = vmm_handle_export(r->v, out->h, &out->fd))) {
        (void)vmm_phys_release(r->v, out->h);
        return rc;
    }
    return 0;
}

/* Releases a frame; xfd (its export, -1: none) closed first: no export keeps it. */
static void frame_drop(struct srv_reserve *r, vmm_handle h, int xfd)
{
    if (xfd >= 0)
        close(xfd);
    if (vmm_phys_release(r->v, h))
        srv_say("a frame's release failed (the driver refused); it stays allocated");
}

/* Releases the last dying frame. */
static void dying_drop(struct srv_reserve *r)
{
    struct srv_dying d = r->dying[--r->n_dying];
    frame_drop(r, d.h, d.xfd);
}

/* Frames on the device now: never more than dev. */
static size_t on_device(const struct srv_reserve *r)
{
    return r->live + r->n_ready + r->n_dying;
}

int srv_reserve_open(struct pool_srv *s, size_t max)
{
    struct srv_reserve *r = calloc(1, sizeof *r);
    if (!r)
        return -ENOMEM;
    r->v = s->v;
    r->page = s->page;
    r->pool = s->pool_frames;
    r->max = r->base = max;
    r->dev = r->pool;
    size_t fr = 0, tot = 0;
    if (max && !vmm_mem_info(s->v, &fr, &tot)) {
        size_t margin = tot / 20, past = fr > margin ? (fr - margin) / r->page : 0;
        r->dev = past > r->pool ? past : r->pool;
    }
    if (r->max > r->dev)
        r->max = r->base = r->dev;
    r->cap_ready = r->max;
    if (r->max && !(r->ready = calloc(r->max, sizeof *r->ready))) {
        free(r);
        return -ENOMEM;
    }
    s->rsv = r;
    return 0;
}

void srv_reserve_close(struct pool_srv *s)
{
    struct srv_reserve *r = s->rsv;
    if (!r)
        return;
    while (r->n_dying)
        dying_drop(r);
    while (r->n_ready) {
        struct srv_ready *f = &r->ready[--r->n_ready];
        frame_drop(r, f->h, f->fd);
    }
    free(r->dying);
    free(r->ready);
    free(r);
    s->rsv = NULL;
}

int srv_reserve_take(struct pool_srv *s, vmm_handle *h, int *fd)
{
    struct srv_reserve *r = s->rsv;
    KVVM_ASSERT(r->live == s->leased);
    if (r->n_ready) {
        struct srv_ready f = r->ready[--r->n_ready];
        r->live++;
        r->k.taken_ready++;
        *h = f.h;
        *fd = f.fd;
        return 0;
    }
    /* none ready: made here, after releasing what would push the device past the pool */
    while (r->n_dying && on_device(r) + 1 > r->dev)
        dying_drop(r);
    KVVM_ASSERT(on_device(r) + 1 <= r->dev);
    struct srv_ready f;
    int rc = frame_make(r, &f);
    if (rc)
        return rc;
    r->live++;
    r->k.made_inline++;
    *h = f.h;
    *fd = f.fd;
    return 0;
}

/* Room for one more dying handle. 0; -ENOMEM. */
static int dying_grow(struct srv_reserve *r)
{
    if (r->n_dying < r->cap_dying)
        return 0;
    size_t cap = r->cap_dying ? 2 * r->cap_dying : 64;
    struct srv_dying *n = realloc(r->dying, cap * sizeof *n);
    if (!n)
        return -ENOMEM;
    r->dying = n;
    r->cap_dying = cap;
    return 0;
}

void srv_reserve_dispose(struct pool_srv *s, vmm_handle h, int xfd)
{
    struct srv_reserve *r = s->rsv;
    KVVM_ASSERT(r->live > 0 && r->live == s->leased + 1);
    r->live--;
    r->failed = false;                      /* the device has a frame less in use */
    if (r->max && !dying_grow(r))           /* released (export closed) when the loop is
                                               idle */
        r->dying[r->n_dying++] = (struct srv_dying){ .h = h, .xfd = xfd };
    else
        frame_drop(r, h, xfd);              /* no reserve (or no memory for the queue) */
}

/* Room for one more frame made ahead: below dev, and below the pool during a take-back. */
static bool room_ahead(const struct pool_srv *s, const struct srv_reserve *r)
{
    return !r->failed && r->n_ready < r->max &&
           on_device(r) < (srv_takeback_on(s) ? r->pool : r->dev);
}

/* Dying frames to release now: none during a take-back (a release frees the frame's
   memory, the CPU the giver's copies and the asker's imports want; a take that needs the
   room releases them itself). */
static bool release_due(const struct pool_srv *s, const struct srv_reserve *r)
{
    return r->n_dying && !srv_takeback_on(s);
}

bool srv_reserve_busy(const struct pool_srv *s)
{
    const struct srv_reserve *r = s->rsv;
    return release_due(s, r) || room_ahead(s, r);
}

void srv_reserve_work(struct pool_srv *s)
{
    struct srv_reserve *r = s->rsv;
    if (!room_ahead(s, r)) {                /* releases when no frame may be made: they
                                               make room; else after the reserve is made
                                               (the next take-back wants it ready) */
        if (release_due(s, r)) {
            dying_drop(r);
            r->k.released_ahead++;
        }
        return;
    }
    struct srv_ready f;
    if (frame_make(r, &f)) {
        r->failed = true;                   /* the device is short: a lease creates (and
                                               fails) on its own until a frame dies */
        return;
    }
    KVVM_ASSERT(r->n_ready < r->max);
    r->ready[r->n_ready++] = f;
    r->k.made_ahead++;
}

void srv_reserve_need(struct pool_srv *s, size_t need)
{
    struct srv_reserve *r = s->rsv;
    need = need < r->dev ? need : r->dev;
    if (!r->base || need <= r->max)
        return;
    if (need > r->cap_ready) {
        struct srv_ready *n = realloc(r->ready, need * sizeof *n);
        if (!n)
            return;                         /* it stays as it is */
        r->ready = n;
        r->cap_ready = need;
    }
    r->max = need;
}

void srv_reserve_counts(const struct pool_srv *s, struct srv_reserve_counts *out)
{
    const struct srv_reserve *r = s->rsv;
    *out = r->k;
    out->ready = r->n_ready;
    out->dying = r->n_dying;
    out->max = r->max;
    out->dev = r->dev;
}
