/*
 * tests/tier_mem.c: a test-only tier below the device, pages in plain memory, added to the
 * list of tiers with one entry (core/tiers.h, core_tiers_add): the proof that a tier is a
 * folder of its own and one entry, nothing else in the library.
 *
 * It is an I/O tier (paging.h, "the tiers below the device"): put copies a page from the
 * tier above's buffer into one of its slots, get copies it back, and each completion comes
 * back once through reap. It takes level 1 (the disk tier's place: a context opened with it
 * has no spill_dir) once tier_mem_use gave it a budget. A slot remembers the page id its
 * put carried: a get under another id completes -EBADMSG (a page's identity lost in a
 * move), and a free of a slot not taken or with a transfer pending counts a misuse; the
 * model test (tests/test_model.c, its +mem configuration) checks every byte it reads back
 * and that tier_mem_misuses() stays 0.
 */
#include "tier_mem.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"

struct tier_mem {
    pthread_mutex_t mu;           /* the completions: put/get and reap under the context
                                     lock, wait without it */
    size_t page_size;
    uint32_t n;                   /* slots */
    unsigned char *bytes;         /* n pages */
    uint32_t *page;               /* the page id each slot's last put carried */
    bool *taken;
    uint32_t *free_stack, n_free;
    struct pg_tier_done *done;    /* completions not reaped yet */
    size_t n_done, cap_done;
};

static size_t mem_budget;         /* tier_mem_use's: 0, the tier is off */
static unsigned long misuses;

unsigned long tier_mem_misuses(void)
{
    return __atomic_load_n(&misuses, __ATOMIC_RELAXED);
}

static void misuse(void)
{
    __atomic_add_fetch(&misuses, 1, __ATOMIC_RELAXED);
}

static size_t m_room(void *a)
{
    struct tier_mem *m = a;
    return m->n_free;
}

static int m_alloc(void *a, pg_slot hint, pg_slot *slot)
{
    struct tier_mem *m = a;
    (void)hint;                           /* memory has no seek */
    if (!m->n_free)
        return -ENOMEM;
    uint32_t s = m->free_stack[--m->n_free];
    m->taken[s] = true;
    *slot = (pg_slot){ s };
    return 0;
}

static void m_free(void *a, pg_slot slot)
{
    struct tier_mem *m = a;
    if (slot.v >= m->n || !m->taken[slot.v]) {
        misuse();                         /* freed twice, or never taken */
        return;
    }
    m->taken[slot.v] = false;
    m->free_stack[m->n_free++] = slot.v;
}

/* Queues one completion (0), or -ENOMEM with nothing queued. */
static int m_done(struct tier_mem *m, pg_page_id page, int status, bool write)
{
    pthread_mutex_lock(&m->mu);
    int rc = 0;
    if (m->n_done == m->cap_done) {
        size_t cap = m->cap_done ? m->cap_done * 2 : 64;
        struct pg_tier_done *d = realloc(m->done, cap * sizeof *d);
        if (d) {
            m->done = d;
            m->cap_done = cap;
        } else {
            rc = -ENOMEM;
        }
    }
    if (!rc)
        m->done[m->n_done++] = (struct pg_tier_done){ page, status, write };
    pthread_mutex_unlock(&m->mu);
    return rc;
}

static int m_put(void *a, pg_slot slot, void *buf, pg_page_id page)
{
    struct tier_mem *m = a;
    if (slot.v >= m->n || !m->taken[slot.v]) {
        misuse();
        return -EINVAL;
    }
    int rc = m_done(m, page, 0, true);
    if (!rc) {
        memcpy(m->bytes + (size_t)slot.v * m->page_size, buf, m->page_size);
        m->page[slot.v] = page.v;
    }
    return rc;
}

static int m_get(void *a, pg_slot slot, void *buf, pg_page_id page)
{
    struct tier_mem *m = a;
    if (slot.v >= m->n || !m->taken[slot.v]) {
        misuse();
        return -EINVAL;
    }
    bool same = m->page[slot.v] == page.v;
    int rc = m_done(m, page, same ? 0 : -EBADMSG, false);
    if (!rc && same)
        memcpy(buf, m->bytes + (size_t)slot.v * m->page_size, m->page_size);
    return rc;
}

static size_t m_reap(void *a, struct pg_tier_done *out, size_t max)
{
    struct tier_mem *m = a;
    pthread_mutex_lock(&m->mu);
    size_t n = m->n_done < max ? m->n_done : max;
    if (n) {                              /* (done is NULL before the first transfer) */
        memcpy(out, m->done, n * sizeof *out);
        memmove(m->done, m->done + n, (m->n_done - n) * sizeof *out);
        m->n_done -= n;
    }
    pthread_mutex_unlock(&m->mu);
    return n;
}

static void m_wait(void *a)
{
    (void)a;                              /* every transfer is done when it is queued */
}

static void close_mem(void *layer)
{
    struct tier_mem *m = layer;
    if (!m)
        return;
    for (uint32_t s = 0; m->taken && s < m->n; s++)
        if (m->taken[s])
            misuse();                     /* paging frees every slot before close */
    pthread_mutex_destroy(&m->mu);
    free(m->bytes);
    free(m->page);
    free(m->taken);
    free(m->free_stack);
    free(m->done);
    free(m);
}

static int open_mem(kvvm *kv, void **layer, struct pg_tier_ops *ops)
{
    size_t ps = kv->cfg.page_size;
    if (!mem_budget || mem_budget < ps)
        return 0;                         /* off */
    struct tier_mem *m = calloc(1, sizeof *m);
    if (!m)
        return -ENOMEM;
    pthread_mutex_init(&m->mu, NULL);
    m->page_size = ps;
    m->n = (uint32_t)(mem_budget / ps);
    m->bytes = malloc((size_t)m->n * ps);
    m->page = calloc(m->n, sizeof *m->page);
    m->taken = calloc(m->n, sizeof *m->taken);
    m->free_stack = calloc(m->n, sizeof *m->free_stack);
    if (!m->bytes || !m->page || !m->taken || !m->free_stack) {
        close_mem(m);
        return -ENOMEM;
    }
    for (uint32_t s = 0; s < m->n; s++)
        m->free_stack[m->n_free++] = m->n - 1 - s;   /* slot 0 first */
    *layer = m;
    *ops = (struct pg_tier_ops){ .arg = m, .room = m_room, .alloc = m_alloc, .free = m_free,
                                 .put = m_put, .get = m_get, .reap = m_reap, .wait = m_wait };
    return 0;
}

static uint64_t slots_mem(kvvm *kv, void *layer)
{
    (void)kv;
    return ((struct tier_mem *)layer)->n;
}

static void stats_mem(void *layer, struct core_tier_stats *out)
{
    struct tier_mem *m = layer;
    *out = (struct core_tier_stats){ .total = m->n, .free = m->n_free };
}

static void off_mem(kvvm *kv, char *b, size_t n, size_t *pos)
{
    (void)kv;
    json_put(b, n, pos, "; no mem tier (tier_mem_use not called)");
}

static const struct core_tier mem_tier = {
    .name = "mem", .level = 1, .open = open_mem, .close = close_mem, .slots = slots_mem,
    .stats = stats_mem, .off = off_mem,
};

int tier_mem_use(size_t bytes)
{
    static bool added;
    if (!added) {
        int rc = core_tiers_add(&mem_tier);     /* the one list entry */
        if (rc)
            return rc;
        added = true;
    }
    mem_budget = bytes;
    return 0;
}
