/*
 * paging/pool.c: the device frame pool and the page descriptors.
 *
 * Frames (physical handles) are created ahead of need: a first chunk at create time, more at
 * each step (pool_refill), and on the grow path only the exact shortfall when no ready frame
 * is left. A frame whose page dies goes back to the ready list (LIFO, O(1)) and is kept for
 * reuse; frames are released only by pool_fini. Page descriptors come from a fixed array
 * with an O(1) free list; a page id is the descriptor index + 1.
 */
#include "paging_int.h"

#include <errno.h>
#include <stdlib.h>
#include "common/assert.h"
#include "common/log.h"

int pool_init(struct paging *pg)
{
    pg->frames = calloc(pg->p.max_frames, sizeof *pg->frames);
    pg->pages = calloc(pg->p.max_pages, sizeof *pg->pages);
    if (!pg->frames || !pg->pages)
        goto out_free;
    for (uint32_t i = 0; i < pg->p.max_pages; i++)
        pg->pages[i].next_free = i + 2 <= pg->p.max_pages ? i + 2 : 0;
    pg->page_free_head = pg->p.max_pages ? 1 : 0;
    return 0;
out_free:
    free(pg->frames);
    free(pg->pages);
    pg->frames = NULL;
    pg->pages = NULL;
    return -ENOMEM;
}

void pool_fini(struct paging *pg)
{
    if (!pg->frames)
        return;
    for (uint32_t i = 0; i < pg->n_created; i++) {
        if (pg->frames[i].state != FR_READY)
            klog_error("paging: frame %u still in state %u at close", i + 1,
                       pg->frames[i].state);
        vmm_phys_release(pg->v, pg->frames[i].h);
    }
    free(pg->frames);
    free(pg->pages);
    pg->frames = NULL;
    pg->pages = NULL;
}

static void ready_push(struct paging *pg, uint32_t f)
{
    struct pg_frame *fr = frame_at(pg, f);
    KVVM_ASSERT(fr->state != FR_READY);      /* on the ready list once */
    fr->state = FR_READY;
    fr->page = 0;
    fr->next = pg->ready_head;
    pg->ready_head = f;
    pg->n_ready++;
}

static uint32_t ready_pop(struct paging *pg)
{
    uint32_t f = pg->ready_head;
    KVVM_ASSERT(f != 0 && pg->n_ready > 0);  /* callers pop only what is ready */
    struct pg_frame *fr = frame_at(pg, f);
    pg->ready_head = fr->next;
    pg->n_ready--;
    fr->next = 0;
    return f;
}

/* Creates one frame onto the ready list. -ENOMEM (budget or device full), -EIO. */
static int pool_create_one(struct paging *pg)
{
    if (pg->n_created >= pg->p.max_frames)
        return -ENOMEM;
    vmm_handle h;
    int rc = vmm_phys_create(pg->v, pg->p.page_size, &h);
    if (rc)
        return rc;
    uint32_t f = ++pg->n_created;
    frame_at(pg, f)->h = h;
    pg->c.frames_created++;
    ready_push(pg, f);
    return 0;
}

void pool_refill(struct paging *pg, uint32_t ready)
{
    while (pg->n_ready < ready && pg->n_created < pg->p.max_frames)
        if (pool_create_one(pg))
            return;
}

uint32_t pool_available(const struct paging *pg)
{
    return pg->n_ready + (pg->p.max_frames - pg->n_created) + pg->n_ahead;
}

/* Makes n frames ready: create the shortfall, then steal map-ahead. Frames made ready stay
   in the pool on failure (invisible: they count as free either way). */
static int pool_ensure(struct paging *pg, uint32_t n, struct pg_seq *except)
{
    while (pg->n_ready < n && pg->n_created < pg->p.max_frames) {
        int rc = pool_create_one(pg);
        if (rc == -ENOMEM)
            break;
        if (rc)
            return rc;
    }
    while (pg->n_ready < n)
        if (seq_steal_ahead(pg, except))
            return -ENOMEM;
    return 0;
}

int pool_take_except(struct paging *pg, uint32_t n, uint32_t *out, struct pg_seq *except)
{
    int rc = pool_ensure(pg, n, except);
    if (rc)
        return rc;
    for (uint32_t i = 0; i < n; i++) {
        out[i] = ready_pop(pg);
        frame_at(pg, out[i])->state = FR_USED;
        pg->n_used++;
    }
    return 0;
}

int pool_take(struct paging *pg, uint32_t n, uint32_t *out)
{
    return pool_take_except(pg, n, out, NULL);
}

uint32_t pool_take_ready(struct paging *pg, uint32_t n, uint32_t *out)
{
    uint32_t k = n < pg->n_ready ? n : pg->n_ready;
    for (uint32_t i = 0; i < k; i++) {
        out[i] = ready_pop(pg);
        frame_at(pg, out[i])->state = FR_USED;
        pg->n_used++;
    }
    return k;
}

void pool_give(struct paging *pg, const uint32_t *f, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        struct pg_frame *fr = frame_at(pg, f[i]);
        if (fr->state == FR_USED)
            pg->n_used--;
        else if (fr->state == FR_AHEAD)
            pg->n_ahead--;
        ready_push(pg, f[i]);
    }
}

void frame_set_ahead(struct paging *pg, uint32_t f)
{
    struct pg_frame *fr = frame_at(pg, f);
    KVVM_ASSERT(fr->state == FR_USED);       /* a taken frame, mapped ahead */
    if (fr->state == FR_USED)
        pg->n_used--;
    fr->state = FR_AHEAD;
    pg->n_ahead++;
}

void frame_set_used(struct paging *pg, uint32_t f)
{
    struct pg_frame *fr = frame_at(pg, f);
    KVVM_ASSERT(fr->state == FR_USED || fr->state == FR_AHEAD);  /* taken, not ready */
    if (fr->state == FR_AHEAD)
        pg->n_ahead--;
    if (fr->state != FR_USED)
        pg->n_used++;
    fr->state = FR_USED;
}

uint32_t page_new(struct paging *pg, uint32_t frame)
{
    uint32_t id = pg->page_free_head;
    /* max_pages >= max_frames and every device page holds a frame: never exhausted here */
    KVVM_ASSERT(id != 0);
    struct pg_page *p = page_at(pg, id);
    pg->page_free_head = p->next_free;
    p->next_free = 0;
    p->refs = 1;
    p->offs = p->jobs = 0;
    p->tier = PG_TIER_DEVICE;
    p->frame = frame;
    p->host_slot = p->disk_slot = (pg_slot){ 0 };
    p->bad = 0;
    frame_set_used(pg, frame);
    frame_at(pg, frame)->page = id;
    pg->n_pages_live++;
    return id;
}

void page_get(struct paging *pg, uint32_t page)
{
    struct pg_page *p = page_at(pg, page);
    KVVM_ASSERT(p->tier != PG_TIER_NONE);                  /* a live descriptor */
    page_count(pg, p, -1);
    p->refs++;
    page_count(pg, p, 1);
}

void page_put(struct paging *pg, uint32_t page)
{
    struct pg_page *p = page_at(pg, page);
    KVVM_ASSERT(p->refs > 0 && p->tier != PG_TIER_NONE);   /* no put without a get */
    page_count(pg, p, -1);
    if (--p->refs) {
        page_count(pg, p, 1);
        return;
    }
    if (p->tier == PG_TIER_DEVICE && p->frame) {
        uint32_t f = p->frame;
        pg->n_used--;
        ready_push(pg, f);
    } else if (p->tier == PG_TIER_HOST) {
        /* (in-flight pages are held by their transfer job, never freed here) */
        page_release_slot(pg, p, PG_TIER_HOST);
    } else if (p->tier == PG_TIER_DISK) {
        /* (pages with disk I/O in flight are held by it, never freed here) */
        page_release_slot(pg, p, PG_TIER_DISK);
    }
    p->tier = PG_TIER_NONE;
    p->bad = 0;
    p->frame = 0;
    p->next_free = pg->page_free_head;
    pg->page_free_head = page;
    pg->n_pages_live--;
}

void pool_rollback(struct paging *pg, uint32_t mark)
{
    if (pg->n_created <= mark)
        return;
    /* frames created since mark are all ready again (the failed call gave them back) */
    uint32_t *pp = &pg->ready_head;
    while (*pp) {
        struct pg_frame *fr = frame_at(pg, *pp);
        if (*pp > mark) {
            *pp = fr->next;
            pg->n_ready--;
        } else {
            pp = &fr->next;
        }
    }
    while (pg->n_created > mark) {
        struct pg_frame *fr = frame_at(pg, pg->n_created);
        if (fr->state != FR_READY)
            klog_error("paging: frame %u created by a failed call is still in use",
                       pg->n_created);
        vmm_phys_release(pg->v, fr->h);
        fr->state = FR_NONE;
        pg->n_created--;
    }
}
