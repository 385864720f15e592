/*
 * paging/pool.c: the device frame pool, its feed, the budget, and the page descriptors.
 *
 * Frames (physical handles) are created ahead of need. With the frame pool thread
 * (swap/frame_pool.c) attached, it creates them off the caller's thread through the feed
 * (paging.h "the frame pool's feed"); without it, a first chunk at create time and more at
 * each step (pool_refill). On the grow path a caller short of ready frames takes delivered
 * ones, waits for those being created, and creates the rest itself only when none are on
 * their way (frames_created_sync counts those). A frame whose page dies goes back to the
 * ready list (LIFO, O(1)) and is kept for reuse; frames are released when the budget
 * shrinks (paging_set_budget), at kvvm_trim (paging_trim), by the thread above its high
 * mark, and at pool_fini. Frame ids come from a fixed array of cap_frames entries (the
 * device's capacity in pages) with a free list, so the budget can grow up to it; at most
 * max_frames (the budget) are held, counting the feed's frames in transit. Page descriptors
 * come from a fixed array with an O(1) free list; a page id is the descriptor index + 1.
 */
#include "paging_int.h"
#include "frames.h"
#include "ahead.h"
#include "transfers.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "common/assert.h"
#include "common/log.h"

/* ---- the frame source (paging.h struct pg_frame_src): the only places frames are made and
   released; the source is core's (local frames or the pool's), never NULL ---------------- */

static int frame_src_create(struct paging *pg, vmm_handle *h, uint32_t need)
{
    const struct pg_frame_src *src = pg->p.src;
    KVVM_ASSERT(src && src->create);         /* core gives one always (paging.h) */
    return src->create(src->arg, h, need);
}

static int frame_src_release(struct paging *pg, vmm_handle h)
{
    const struct pg_frame_src *src = pg->p.src;
    KVVM_ASSERT(src && src->release);
    return src->release(src->arg, h);
}

/* Frees the frame, page descriptor and feed arrays (pool_fini: nothing left to release). */
static void pool_free_arrays(struct paging *pg)
{
    free(pg->fr.frames);
    free(pg->pd.pages);
    free(pg->fr.feed.in);
    pg->fr.frames = NULL;
    pg->pd.pages = NULL;
    pg->fr.feed.in = NULL;
}

int pool_init(struct paging *pg)
{
    if (pg->p.cap_frames < pg->p.max_frames)
        pg->p.cap_frames = pg->p.max_frames;
    pg->fr.cap_frames = pg->p.cap_frames;
    pg->fr.frames = calloc(pg->fr.cap_frames ? pg->fr.cap_frames : 1, sizeof *pg->fr.frames);
    pg->pd.pages = calloc(pg->p.max_pages, sizeof *pg->pd.pages);
    pg->fr.feed.in = calloc(pg->fr.cap_frames ? pg->fr.cap_frames : 1, sizeof *pg->fr.feed.in);
    if (!pg->fr.frames || !pg->pd.pages || !pg->fr.feed.in)
        goto out_free;
    for (uint32_t i = 0; i < pg->fr.cap_frames; i++)
        pg->fr.frames[i].next = (pg_frame_id){ i + 2 <= pg->fr.cap_frames ? i + 2 : 0 };
    pg->fr.frame_free_head = (pg_frame_id){ pg->fr.cap_frames ? 1 : 0 };
    for (uint32_t i = 0; i < pg->p.max_pages; i++)
        pg->pd.pages[i].next_free = (pg_page_id){ i + 2 <= pg->p.max_pages ? i + 2 : 0 };
    pg->pd.page_free_head = (pg_page_id){ pg->p.max_pages ? 1 : 0 };
    pthread_mutex_init(&pg->fr.feed.mu, NULL);
    pthread_cond_init(&pg->fr.feed.cv, NULL);
    return 0;
out_free:
    pool_free_arrays(pg);
    return -ENOMEM;
}

void pool_fini(struct paging *pg)
{
    if (!pg->fr.frames)
        return;
    for (uint32_t i = 0; i < pg->fr.cap_frames; i++) {
        if (pg->fr.frames[i].state == FR_NONE)
            continue;
        if (pg->fr.frames[i].state != FR_READY)
            klog_error("paging: frame %u still in state %u at close", i + 1,
                       pg->fr.frames[i].state);
        (void)frame_src_release(pg, pg->fr.frames[i].h);    /* refused: logged */
    }
    for (uint32_t i = 0; i < pg->fr.feed.n_in; i++)     /* delivered, never drained */
        (void)frame_src_release(pg, pg->fr.feed.in[i]);
    pthread_cond_destroy(&pg->fr.feed.cv);
    pthread_mutex_destroy(&pg->fr.feed.mu);
    pool_free_arrays(pg);
}

/* Asks the pool thread for a round, once until its next plan (a take below the low mark
   would otherwise take the thread's mutex at every frame). */
static void feed_ask(struct paging *pg)
{
    if (pg->fr.feed.on && pg->fr.feed.wake && !pg->fr.feed.asked) {
        pg->fr.feed.asked = true;
        pg->fr.feed.wake(pg->fr.feed.wake_arg);
    }
}

void pool_feed_ask(struct paging *pg)
{
    feed_ask(pg);
}

/* The frame state machine (enum pg_frame_state), a bit per destination: created onto the
   ready list (NONE -> READY); taken (READY -> USED); mapped ahead and taken back (USED <->
   AHEAD); given back (USED, AHEAD -> READY; READY -> READY: popped for a release the driver
   refused); released (READY -> NONE). frame_move is the one writer of the state. */
static bool frame_edge(uint8_t from, uint8_t to)
{
#define FR_B(s) (1u << (s))
    static const uint8_t next[] = {
        [FR_NONE]  = FR_B(FR_READY),
        [FR_READY] = FR_B(FR_READY) | FR_B(FR_USED) | FR_B(FR_NONE),
        [FR_AHEAD] = FR_B(FR_USED) | FR_B(FR_READY),
        [FR_USED]  = FR_B(FR_AHEAD) | FR_B(FR_READY),
    };
    return from < sizeof next && (next[from] & FR_B(to));
#undef FR_B
}

static void frame_move(struct pg_frame *fr, uint8_t to)
{
    KVVM_ASSERT(frame_edge(fr->state, to));
    fr->state = to;
}

static void ready_push(struct paging *pg, pg_frame_id f)
{
    struct pg_frame *fr = frame_at(pg, f);
    KVVM_ASSERT(!fr->listed);                /* on the ready list once */
    fr->listed = 1;
    frame_move(fr, FR_READY);
    fr->page = PG_PAGE_NONE;
    fr->next = pg->fr.ready_head;
    pg->fr.ready_head = f;
    pg->fr.n_ready++;
    /* the pool just grew above the thread's high mark: it times the surplus' release */
    if (pg->fr.feed.high != UINT32_MAX && pg->fr.n_ready == pg->fr.feed.high + 1)
        feed_ask(pg);
}

/* Takes the ready frame *pp names (pp: the list's head or a ready frame's next) off the
   ready list. */
static pg_frame_id ready_unlink(struct paging *pg, pg_frame_id *pp)
{
    pg_frame_id f = *pp;
    KVVM_ASSERT(!pg_frame_is_none(f) && pg->fr.n_ready > 0);  /* callers pop only what is ready */
    struct pg_frame *fr = frame_at(pg, f);
    KVVM_ASSERT(fr->listed && fr->state == FR_READY && pg_page_is_none(fr->page));
    *pp = fr->next;
    fr->listed = 0;
    pg->fr.n_ready--;
    if (pg->fr.n_ready < pg->fr.feed.ready_min)
        pg->fr.feed.ready_min = pg->fr.n_ready;
    fr->next = PG_FRAME_NONE;
    return f;
}

static pg_frame_id ready_pop(struct paging *pg)
{
    return ready_unlink(pg, &pg->fr.ready_head);
}

/* The next ready frame from *pp on that no pool view slot maps (a release may take it),
   as the link naming it; NULL: none. */
static pg_frame_id *ready_unpinned(struct paging *pg, pg_frame_id *pp)
{
    while (!pg_frame_is_none(*pp) && frame_at(pg, *pp)->vmaps)
        pp = &frame_at(pg, *pp)->next;
    return pg_frame_is_none(*pp) ? NULL : pp;
}

uint32_t pool_ready_pinned(struct paging *pg)
{
    uint32_t n = 0;
    if (!pg->view.n_ids)
        return 0;
    for (pg_frame_id f = pg->fr.ready_head; !pg_frame_is_none(f); f = frame_at(pg, f)->next)
        n += frame_at(pg, f)->vmaps != 0;
    return n;
}

/* A new frame id for handle h, onto the ready list. The caller checked the budget. */
static pg_frame_id frame_add(struct paging *pg, vmm_handle h, uint32_t serial)
{
    pg_frame_id f = pg->fr.frame_free_head;
    struct pg_frame *fr = frame_at(pg, f);
    pg->fr.frame_free_head = fr->next;
    fr->h = h;
    fr->serial = serial;
    pg->fr.n_held++;
    pg->c.frames_created++;
    ready_push(pg, f);
    return f;
}

/* Gives frame id f (off every list, unused) back to the free ids; its handle is the
   caller's to release. */
static void frame_forget(struct paging *pg, pg_frame_id f)
{
    struct pg_frame *fr = frame_at(pg, f);
    KVVM_ASSERT(!fr->listed && pg->fr.n_held > 0);  /* popped off the ready list first */
    KVVM_ASSERT(!fr->vmaps);                        /* no view mapping keeps its memory */
    frame_move(fr, FR_NONE);
    fr->serial = 0;
    fr->ext = 0;
    fr->gen++;                      /* its handle is gone: view slots naming it are stale */
    fr->next = pg->fr.frame_free_head;
    pg->fr.frame_free_head = f;
    pg->fr.n_held--;
}

/* A shared frame (ext) that its page left: released, never reused here (another process
   may read it: the daemon keeps it for them). The caller took it off n_used / n_ahead. */
static void frame_drop_ext(struct paging *pg, pg_frame_id f)
{
    struct pg_frame *fr = frame_at(pg, f);
    KVVM_ASSERT(fr->ext && !fr->listed && !fr->vmaps);
    frame_move(fr, FR_READY);
    fr->page = PG_PAGE_NONE;
    if (frame_src_release(pg, fr->h) && !vmm_dead(pg->v))
        klog_error("paging: a shared frame's release was refused; its handle is lost");
    frame_forget(pg, f);
    pg->c.frames_released++;
}

/* Frames of the budget in the feed's hands (being created, delivered, being released). */
static uint32_t feed_transit(struct paging *pg)
{
    pthread_mutex_lock(&pg->fr.feed.mu);
    uint32_t n = pg->fr.feed.creating + pg->fr.feed.n_in + pg->fr.feed.releasing;
    pthread_mutex_unlock(&pg->fr.feed.mu);
    return n;
}

/* The frames held alone fill the budget on a full device: then no lock is taken (the
   frame pool thread's wake-up test runs at every step, paging_pool_can_create). */
static bool budget_room(struct paging *pg)
{
    return pg->fr.n_held < pg->p.max_frames &&
           pg->fr.n_held + feed_transit(pg) < pg->p.max_frames &&
           !pg_frame_is_none(pg->fr.frame_free_head);
}

/* Creates one frame onto the ready list on the caller's thread; need > 0: a call needs it
   now and need frames in all (a pool client's lease asks for them at once and may wait for
   a take-back; capped here at the budget's room), 0: a refill ahead of need (it takes what
   the pool has). -ENOMEM (budget or device full), -EIO. */
static int pool_create_one(struct paging *pg, uint32_t need)
{
    if (!budget_room(pg))
        return -ENOMEM;
    uint32_t room = pg->p.max_frames - pg->fr.n_held;      /* > 0: budget_room */
    vmm_handle h;
    int rc = frame_src_create(pg, &h, need < room ? need : room);
    if (rc)
        return rc;
    frame_add(pg, h, ++pg->fr.n_created);
    pg->c.frames_created_sync++;
    return 0;
}

void pool_refill(struct paging *pg, uint32_t ready)
{
    if (pg->fr.feed.on || pg->fr.feed.suppress)
        return;
    while (pg->fr.n_ready < ready && pg->fr.n_held < pg->p.max_frames)
        if (pool_create_one(pg, 0))
            return;
}

uint32_t pool_available(const struct paging *pg)
{
    /* ready + ahead + not created (in transit or not yet asked for) */
    return pg->p.max_frames > pg->fr.n_used ? pg->p.max_frames - pg->fr.n_used : 0;
}

/* Releases handle h; false when the driver refused it on a live context (the caller keeps
   the frame: a refused release must not leak a handle the pool forgot). */
static bool release_ok(struct paging *pg, vmm_handle h)
{
    return !frame_src_release(pg, h) || vmm_dead(pg->v);
}

uint32_t pool_release_ready(struct paging *pg, uint32_t keep)
{
    uint32_t n = 0;
    pg_frame_id *pp = &pg->fr.ready_head;
    while (pg->fr.n_ready > keep && (pp = ready_unpinned(pg, pp)) != NULL) {
        if (!release_ok(pg, frame_at(pg, *pp)->h))
            break;                  /* refused: the frame stays ready */
        frame_forget(pg, ready_unlink(pg, pp));
        pg->c.frames_released++;
        n++;
    }
    return n;
}

/* ---- the feed ----------------------------------------------------------------------- */

void paging_feed_drain(struct paging *pg)
{
    struct pg_feed *fd = &pg->fr.feed;
    pthread_mutex_lock(&fd->mu);
    for (uint32_t i = 0; i < fd->n_in; i++) {
        uint32_t after = pg->fr.n_held + 1 + fd->creating + fd->releasing + (fd->n_in - i - 1);
        if (after <= pg->p.max_frames && !pg_frame_is_none(pg->fr.frame_free_head)) {
            frame_add(pg, fd->in[i], 0);
        } else {            /* the budget shrank meanwhile */
            if (!release_ok(pg, fd->in[i]))
                klog_error("paging: a frame above the budget could not be released");
            pg->c.frames_created++;
            pg->c.frames_released++;
        }
    }
    /* releases the driver refused came back above: not released, not created anew */
    pg->c.frames_released -= fd->unreleased;
    pg->c.frames_created -= fd->unreleased;
    fd->unreleased = 0;
    fd->n_in = 0;
    pthread_mutex_unlock(&fd->mu);
}

/* A caller short of ready frames: waits once for frames the thread is creating (or, with
   no budget room, releasing). True when it waited (the caller drains and looks again). */
static bool feed_wait(struct paging *pg)
{
    struct pg_feed *fd = &pg->fr.feed;
    bool waited = false;
    pthread_mutex_lock(&fd->mu);
    if (fd->creating ||
        (fd->releasing && pg->fr.n_held + fd->n_in + fd->releasing >= pg->p.max_frames)) {
        pthread_cond_wait(&fd->cv, &fd->mu);
        waited = true;
    } else if (fd->n_in) {
        waited = true;
    }
    pthread_mutex_unlock(&fd->mu);
    return waited;
}

void paging_feed_quiesce(struct paging *pg)
{
    struct pg_feed *fd = &pg->fr.feed;
    ahead_settle(pg, false);        /* no map-ahead refill in flight either */
    pthread_mutex_lock(&fd->mu);
    while (fd->creating || fd->releasing)
        pthread_cond_wait(&fd->cv, &fd->mu);
    pthread_mutex_unlock(&fd->mu);
    paging_feed_drain(pg);
}

int paging_feed_attach(struct paging *pg, void (*wake)(void *), void *arg, uint32_t low,
                       uint32_t high)
{
    pg->fr.feed.wake = wake;
    pg->fr.feed.wake_arg = arg;
    pg->fr.feed.low = low;
    pg->fr.feed.high = high;
    pg->fr.feed.asked = false;
    pg->fr.feed.on = true;
    return 0;
}

void paging_feed_detach(struct paging *pg)
{
    paging_feed_quiesce(pg);
    pg->fr.feed.on = false;
    pg->fr.feed.wake = NULL;
    pg->fr.feed.wake_arg = NULL;
}

void paging_feed_set_marks(struct paging *pg, uint32_t low, uint32_t high)
{
    pg->fr.feed.low = low;
    pg->fr.feed.high = high;
}

static void feed_wake(struct paging *pg)
{
    if (pg->fr.n_ready < pg->fr.feed.low && !pg->fr.feed.suppress)
        feed_ask(pg);
}

int paging_feed_plan(struct paging *pg, uint32_t fill, uint32_t keep, struct pg_feed_plan *pl)
{
    struct pg_feed *fd = &pg->fr.feed;
    fd->asked = false;            /* this plan sees what any request since the last saw */
    paging_feed_drain(pg);
    pl->create = pl->release = 0;
    pl->rel = NULL;
    if (keep < fill)
        keep = fill;
    pthread_mutex_lock(&fd->mu);
    uint32_t coming = fd->creating + fd->n_in;
    uint32_t transit = coming + fd->releasing;
    if (!fd->suppress && pg->fr.n_ready + coming < fill) {
        uint32_t want = fill - pg->fr.n_ready - coming;
        uint32_t room = pg->p.max_frames > pg->fr.n_held + transit
                            ? pg->p.max_frames - pg->fr.n_held - transit : 0;
        pl->create = want < room ? want : room;
    }
    pthread_mutex_unlock(&fd->mu);
    /* surplus: ready frames above keep that no call needed since the window began (a
       burst of frees right before a burst of takes is not released and created again) */
    uint32_t release = keep == PG_FEED_KEEP_ALL ? 0 : paging_feed_surplus(pg, keep);
    if (release && !(pl->rel = malloc(release * sizeof *pl->rel))) {
        pl->create = 0;
        return -ENOMEM;
    }
    /* frames a pool view slot still maps are not surplus yet: the thread never waits for
       the engine's work, a later round releases them once the step or sync unmapped them */
    pg_frame_id *pp = &pg->fr.ready_head;
    uint32_t got = 0;
    while (got < release && (pp = ready_unpinned(pg, pp)) != NULL) {
        pg_frame_id f = ready_unlink(pg, pp);
        pl->rel[got++] = frame_at(pg, f)->h;
        frame_forget(pg, f);
    }
    release = got;
    if (!release) {                 /* all pinned: nothing for paging_feed_work to free */
        free(pl->rel);
        pl->rel = NULL;
    }
    pl->release = release;
    pg->c.frames_released += release;
    if (keep != PG_FEED_KEEP_ALL)
        pg->fr.feed.ready_min = pg->fr.n_ready;      /* a new window (KEEP_ALL: it goes on) */
    pthread_mutex_lock(&fd->mu);
    fd->creating += pl->create;
    fd->releasing += release;
    pthread_mutex_unlock(&fd->mu);
    return 0;
}

uint32_t paging_feed_surplus(const struct paging *pg, uint32_t keep)
{
    uint32_t idle =
        pg->fr.feed.ready_min < pg->fr.n_ready ? pg->fr.feed.ready_min : pg->fr.n_ready;
    return idle > keep ? idle - keep : 0;
}

uint32_t paging_feed_work(struct paging *pg, struct pg_feed_plan *pl)
{
    struct pg_feed *fd = &pg->fr.feed;
    for (uint32_t i = 0; i < pl->release; i++) {
        bool ok = release_ok(pg, pl->rel[i]);
        pthread_mutex_lock(&fd->mu);
        if (!ok) {                /* refused: back to the pool as a delivered frame */
            fd->in[fd->n_in++] = pl->rel[i];
            fd->unreleased++;
        }
        fd->releasing--;
        pthread_cond_broadcast(&fd->cv);
        pthread_mutex_unlock(&fd->mu);
    }
    free(pl->rel);
    pl->rel = NULL;
    uint32_t made = 0;
    for (uint32_t i = 0; i < pl->create; i++) {
        vmm_handle h;
        int rc = frame_src_create(pg, &h, 0);        /* the frame pool thread */
        pthread_mutex_lock(&fd->mu);
        if (rc) {
            fd->creating -= pl->create - i;      /* the rest of the reservation back */
        } else {
            fd->creating--;
            fd->in[fd->n_in++] = h;
            made++;
        }
        pthread_cond_broadcast(&fd->cv);
        pthread_mutex_unlock(&fd->mu);
        if (rc) {
            klog_debug("paging: the frame pool thread created %u of %u frames (%d)", made,
                       pl->create, rc);
            break;
        }
    }
    return made;
}

uint32_t paging_pool_ready(const struct paging *pg)
{
    return pg->fr.n_ready;
}

bool paging_pool_can_create(struct paging *pg)
{
    return budget_room(pg);
}

bool paging_feed_short(struct paging *pg, uint32_t high)
{
    return paging_pool_ready(pg) < high && paging_pool_can_create(pg);
}

/* ---- the budget --------------------------------------------------------------------- */

void pool_drop_all_ahead(struct paging *pg)
{
    ahead_drop_all(pg);
}

void pool_set_max_frames(struct paging *pg, uint32_t frames)
{
    pg->p.max_frames = frames;
}

void pool_feed_suppress(struct paging *pg)
{
    pthread_mutex_lock(&pg->fr.feed.mu);
    pg->fr.feed.suppress = true;
    pthread_mutex_unlock(&pg->fr.feed.mu);
}

uint32_t paging_budget(const struct paging *pg)
{
    return pg->p.max_frames;
}

uint32_t paging_cap_frames(const struct paging *pg)
{
    return pg->fr.cap_frames;
}

/* ---- taking and giving frames ------------------------------------------------------- */

/* Makes n frames ready: delivered ones, those being created, created here, then stolen
   map-ahead. Frames made ready stay in the pool on failure (invisible: they count as free
   either way). */
int pool_make_ready(struct paging *pg, uint32_t n, bool made)
{
    paging_feed_drain(pg);
    while (pg->fr.n_ready < n) {
        if (pg->fr.feed.on && feed_wait(pg)) {
            paging_feed_drain(pg);
            continue;
        }
        if (!budget_room(pg))
            break;
        int rc = pool_create_one(pg, n - pg->fr.n_ready);     /* > 0: the loop's test */
        if (rc == -ENOMEM && !made)
            break;
        if (rc)
            return rc;
    }
    return 0;
}

static int pool_ensure(struct paging *pg, uint32_t n, struct pg_seq *except)
{
    int rc = pool_make_ready(pg, n, false);
    if (rc)
        return rc;
    while (pg->fr.n_ready < n)
        if (ahead_steal(pg, except))
            return -ENOMEM;
    return 0;
}

int pool_take_except(struct paging *pg, uint32_t n, pg_frame_id *out, struct pg_seq *except)
{
    if (pg->fr.feed.suppress) {          /* a call needs device pages: kvvm_trim's pause ends */
        pthread_mutex_lock(&pg->fr.feed.mu);
        pg->fr.feed.suppress = false;
        pthread_mutex_unlock(&pg->fr.feed.mu);
    }
    int rc = pool_ensure(pg, n, except);
    if (rc)
        return rc;
    for (uint32_t i = 0; i < n; i++) {
        out[i] = ready_pop(pg);
        frame_move(frame_at(pg, out[i]), FR_USED);
        pg->fr.n_used++;
    }
    feed_wake(pg);
    return 0;
}

int pool_take(struct paging *pg, uint32_t n, pg_frame_id *out)
{
    return pool_take_except(pg, n, out, NULL);
}

uint32_t pool_take_ready(struct paging *pg, uint32_t n, pg_frame_id *out)
{
    uint32_t k = n < pg->fr.n_ready ? n : pg->fr.n_ready;
    for (uint32_t i = 0; i < k; i++) {
        out[i] = ready_pop(pg);
        frame_move(frame_at(pg, out[i]), FR_USED);
        pg->fr.n_used++;
    }
    if (k)
        feed_wake(pg);
    return k;
}

bool pool_take_frame(struct paging *pg, pg_frame_id f, uint32_t gen)
{
    struct pg_frame *fr = frame_at(pg, f);
    if (fr->state != FR_READY || !fr->listed || fr->gen != gen)
        return false;
    pg_frame_id *pp = &pg->fr.ready_head;
    while (!pg_frame_is_none(*pp) && !pg_frame_eq(*pp, f))
        pp = &frame_at(pg, *pp)->next;
    if (pg_frame_is_none(*pp))
        return false;
    ready_unlink(pg, pp);
    frame_move(fr, FR_USED);
    pg->fr.n_used++;
    return true;
}

void pool_ready_last(struct paging *pg, pg_frame_id f)
{
    struct pg_frame *fr = frame_at(pg, f);
    if (fr->state != FR_READY || !fr->listed)
        return;
    pg_frame_id *pp = &pg->fr.ready_head;
    while (!pg_frame_is_none(*pp) && !pg_frame_eq(*pp, f))
        pp = &frame_at(pg, *pp)->next;
    if (pg_frame_is_none(*pp) || pg_frame_is_none(fr->next))
        return;                         /* not found, or last already */
    *pp = fr->next;
    while (!pg_frame_is_none(*pp))
        pp = &frame_at(pg, *pp)->next;
    *pp = f;
    fr->next = PG_FRAME_NONE;
}

void pool_give(struct paging *pg, const pg_frame_id *f, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        struct pg_frame *fr = frame_at(pg, f[i]);
        KVVM_ASSERT(pg_page_is_none(fr->page));  /* it holds no page */
        KVVM_ASSERT(fr->state == FR_USED ? pg->fr.n_used > 0
                                         : fr->state != FR_AHEAD || pg->fr.n_ahead);
        if (fr->state == FR_USED)
            pg->fr.n_used--;
        else if (fr->state == FR_AHEAD)
            pg->fr.n_ahead--;
        if (fr->ext)
            frame_drop_ext(pg, f[i]);
        else
            ready_push(pg, f[i]);
    }
}

void frame_set_ahead(struct paging *pg, pg_frame_id f)
{
    struct pg_frame *fr = frame_at(pg, f);
    KVVM_ASSERT(fr->state == FR_USED && pg->fr.n_used > 0);   /* a taken frame, mapped ahead */
    if (fr->state == FR_USED)
        pg->fr.n_used--;
    frame_move(fr, FR_AHEAD);
    pg->fr.n_ahead++;
}

void frame_set_used(struct paging *pg, pg_frame_id f)
{
    struct pg_frame *fr = frame_at(pg, f);
    KVVM_ASSERT(fr->state == FR_USED || fr->state == FR_AHEAD);  /* taken, not ready */
    if (fr->state == FR_USED)
        return;
    KVVM_ASSERT(pg->fr.n_ahead > 0);
    pg->fr.n_ahead--;
    pg->fr.n_used++;
    frame_move(fr, FR_USED);
}

/* ---- page descriptors --------------------------------------------------------------- */

pg_page_id page_new(struct paging *pg, pg_frame_id frame)
{
    pg_page_id id = pg->pd.page_free_head;
    /* max_pages >= cap_frames and every device page holds a frame: never exhausted here */
    KVVM_ASSERT(!pg_page_is_none(id));
    struct pg_page *p = page_at(pg, id);
    KVVM_ASSERT(!p->refs && pg_page_is_none(frame_at(pg, frame)->page));  /* both free */
    pg->pd.page_free_head = p->next_free;
    p->next_free = PG_PAGE_NONE;
    p->refs = 1;
    p->offs = p->jobs = p->ents = 0;
    page_set_tier(p, PG_TIER_DEVICE);
    p->frame = frame;
    page_slots_none(p);
    p->bad = 0;
    p->ext = frame_at(pg, frame)->ext;
    frame_set_used(pg, frame);
    frame_at(pg, frame)->page = id;
    pg->pd.n_pages_live++;
    return id;
}

pg_page_id page_new_off(struct paging *pg, pg_frame_id frame)
{
    pg_page_id id = page_new(pg, frame);
    struct pg_page *p = page_at(pg, id);
    page_count(pg, p, -1);
    p->offs = 1;                        /* a non-resident holder's reference (it maps nothing) */
    page_count(pg, p, 1);
    return id;
}

pg_page_id page_new_host(struct paging *pg, pg_slot slot)
{
    pg_page_id id = pg->pd.page_free_head;
    struct pg_page *p = page_at(pg, id);
    pg->pd.page_free_head = p->next_free;
    KVVM_ASSERT(p->tier == PG_TIER_NONE && !p->refs);   /* a free descriptor */
    *p = (struct pg_page){ .refs = 1, .offs = 1 };
    page_set_tier(p, PG_TIER_HOST);
    page_slots_none(p);
    page_take_slot(pg, p, PG_LOWER_HOST, slot);
    page_count(pg, p, 1);
    pg->pd.n_pages_live++;
    return id;
}

void page_get(struct paging *pg, pg_page_id page)
{
    struct pg_page *p = page_at(pg, page);
    KVVM_ASSERT(p->tier != PG_TIER_NONE);                  /* a live descriptor */
    pg->room_gen++;                     /* a page shared now: no room fact holds */
    page_count(pg, p, -1);
    p->refs++;
    page_count(pg, p, 1);
}

void page_put(struct paging *pg, pg_page_id page)
{
    struct pg_page *p = page_at(pg, page);
    KVVM_ASSERT(p->refs > 0 && p->tier != PG_TIER_NONE);   /* no put without a get */
    page_count(pg, p, -1);
    if (--p->refs) {
        page_count(pg, p, 1);
        return;
    }
    /* the last reference: no holder counted in offs, jobs or ents is left */
    KVVM_ASSERT(!p->offs && !p->jobs && !p->ents);
    if (p->tier == PG_TIER_DEVICE && !pg_frame_is_none(p->frame)) {
        pg_frame_id f = p->frame;
        KVVM_ASSERT(pg->fr.n_used > 0);
        pg->fr.n_used--;
        if (frame_at(pg, f)->ext)
            frame_drop_ext(pg, f);
        else
            ready_push(pg, f);
    } else if (lower_of(p->tier) >= 0) {
        /* resting in a tier below (a page in flight is held by its transfer, never freed
           here) */
        page_release_slot(pg, p, (unsigned)lower_of(p->tier));
    }
    page_set_tier(p, PG_TIER_NONE);
    p->bad = 0;
    p->ext = 0;
    p->frame = PG_FRAME_NONE;
    p->next_free = pg->pd.page_free_head;
    pg->pd.page_free_head = page;
    KVVM_ASSERT(pg->pd.n_pages_live > 0);
    pg->pd.n_pages_live--;
}

void page_get_off(struct paging *pg, pg_page_id id)
{
    struct pg_page *p = page_at(pg, id);
    KVVM_ASSERT(p->tier != PG_TIER_NONE);                  /* a live descriptor */
    pg->room_gen++;                     /* a page shared now: no room fact holds */
    page_count(pg, p, -1);
    p->refs++;
    p->offs++;
    page_count(pg, p, 1);
}

void page_go_off(struct paging *pg, pg_page_id id)
{
    struct pg_page *p = page_at(pg, id);
    KVVM_ASSERT(p->offs < p->refs);     /* the entry was a mapping one */
    page_count(pg, p, -1);
    p->offs++;
    page_count(pg, p, 1);
}

void page_go_on(struct paging *pg, pg_page_id id)
{
    struct pg_page *p = page_at(pg, id);
    KVVM_ASSERT(p->offs > p->ents);     /* the entry was a non-resident sequence's */
    page_count(pg, p, -1);
    p->offs--;
    page_count(pg, p, 1);
}

void page_get_ent(struct paging *pg, pg_page_id id)
{
    struct pg_page *p = page_at(pg, id);
    KVVM_ASSERT(p->tier != PG_TIER_NONE);
    page_count(pg, p, -1);
    p->refs++;
    p->offs++;
    p->ents++;
    page_count(pg, p, 1);
}

void page_put_ent(struct paging *pg, pg_page_id id)
{
    struct pg_page *p = page_at(pg, id);
    KVVM_ASSERT(p->ents > 0 && p->offs > 0);
    page_count(pg, p, -1);
    p->offs--;
    p->ents--;
    page_count(pg, p, 1);
    /* the last reference: no window maps the page (its mapping holders released it
       behind their fences), so its storage is free at once */
    page_put(pg, id);
}

void page_get_job(struct paging *pg, pg_page_id id)
{
    page_get(pg, id);
    page_at(pg, id)->jobs++;
}

void page_job_done(struct paging *pg, pg_page_id id)
{
    struct pg_page *p = page_at(pg, id);
    KVVM_ASSERT(p->jobs > 0 && p->refs >= p->jobs);   /* the job's own reference */
    p->jobs--;
}

void page_put_off(struct paging *pg, pg_page_id id)
{
    struct pg_page *p = page_at(pg, id);
    KVVM_ASSERT(p->offs > 0 && p->offs > p->ents);   /* a non-resident sequence's entry */
    page_count(pg, p, -1);
    p->offs--;
    page_count(pg, p, 1);
    page_put(pg, id);
}

void pool_rollback(struct paging *pg, uint32_t mark)
{
    if (pg->fr.n_created <= mark)
        return;
    /* frames this call created are all ready again (the failed call gave them back) */
    pg_frame_id *pp = &pg->fr.ready_head;
    while (!pg_frame_is_none(*pp)) {
        pg_frame_id f = *pp;
        struct pg_frame *fr = frame_at(pg, f);
        if (fr->serial > mark && (fr->vmaps || !release_ok(pg, fr->h))) {
            /* refused (or a pool view slot maps it: not released before its unmap): it
               stays, as a reserve frame */
            fr->serial = 0;
            pp = &fr->next;
        } else if (fr->serial > mark) {
            *pp = fr->next;
            fr->listed = 0;
            pg->fr.n_ready--;
            frame_forget(pg, f);
            pg->c.frames_created--;         /* as if never created (the call failed) */
            pg->c.frames_created_sync--;
        } else {
            pp = &fr->next;
        }
    }
    for (uint32_t i = 0; i < pg->fr.cap_frames; i++)
        if (pg->fr.frames[i].serial > mark)
            klog_error("paging: frame %u created by a failed call is still in use", i + 1);
    pg->fr.n_created = mark;
}

/* ---- shared frames (ext) ------------------------------------------------------------ */

int pool_adopt_room(struct paging *pg, uint32_t n)
{
    paging_feed_drain(pg);
    uint32_t used = pg->fr.n_held + feed_transit(pg);
    if (used + n > pg->p.max_frames) {      /* ready frames make room, if there are some */
        uint32_t over = used + n - pg->p.max_frames;
        uint32_t keep = pg->fr.n_ready > over ? pg->fr.n_ready - over : 0;
        (void)pool_release_ready(pg, keep);
        used = pg->fr.n_held + feed_transit(pg);
    }
    if (used + n > pg->p.max_frames || pg->fr.cap_frames - pg->fr.n_held < n)
        return pg_why_frames(pg, n);
    return 0;
}

pg_frame_id pool_adopt_ext(struct paging *pg, vmm_handle h)
{
    pg_frame_id f = pg->fr.frame_free_head;
    KVVM_ASSERT(!pg_frame_is_none(f));      /* pool_adopt_room checked */
    struct pg_frame *fr = frame_at(pg, f);
    pg->fr.frame_free_head = fr->next;
    fr->h = h;
    fr->serial = 0;
    fr->next = PG_FRAME_NONE;
    fr->page = PG_PAGE_NONE;
    fr->ext = 1;
    frame_move(fr, FR_READY);
    frame_move(fr, FR_USED);
    pg->fr.n_held++;
    pg->fr.n_used++;
    return f;
}

void pool_share_mark(struct paging *pg, pg_page_id id)
{
    struct pg_page *p = page_at(pg, id);
    KVVM_ASSERT(p->tier == PG_TIER_DEVICE && !pg_frame_is_none(p->frame));
    frame_at(pg, p->frame)->ext = 1;
    p->ext = 1;
}
