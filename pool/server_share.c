/*
 * pool/server_share.c: frames shared between clients through the daemon: records (exports
 * waiting for their import), mappings by clients that did not lease a frame (each client's
 * maps set: one entry per frame, a hash set), frames sent to a client that holds them
 * already (held: no descriptor, no count), and the one place a frame dies
 * (srv_frame_settle). The counts: pool/server_int.h.
 *
 * A hand-off: the exporter sends its frame ids in EXPORT chunks (ids it leased or maps);
 * the last chunk makes a record holding every frame (nrec) and the daemon answers a token
 * of POOL_TOKEN_BYTES from getrandom. An IMPORT names the token and the importer's layout:
 * another layout is refused (-EINVAL) and the record stays; an unknown, spent or claimed
 * token is -ENOENT. Otherwise the record is claimed by the importer and its frames follow
 * in FRAMES messages (srv_send_frames): one the importer holds already (its own export:
 * leased by it, or a frame it maps) goes held, counted nothing; each other one is counted
 * as the importer's mapping (nmap, its maps set) and goes with a descriptor;
 * IMPORT_END says whether the import took (the record is then spent: dropped, its holds
 * with it) or not (the importer gave its mappings back with RETURN first; the record is
 * importable again). An importer that dies while it claims a record gives it back the
 * same way. A record does not depend on its exporter: the exporter's exit gives back its
 * lease of each frame, the record keeps the frame live.
 *
 * Pending records (protocol.h "PENDING and READY"): an export or a prefix entry sent with
 * a serial joins its publisher's pending list; a pending entry is a miss; an IMPORT of a
 * pending export waits (the request kept in the importer's imp_msg, nothing claimed) for
 * its READY, its drop (-ENOENT) or its wait_ms (-EAGAIN; wait_ms 0: at once). READY of the
 * serial makes them visible (ok) or drops them; the publisher going first drops them all.
 * Every drop of a record unlinks it from that list first (srv_pend_unlink).
 */
#include "server_int.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common/assert.h"


static int send_msg(struct srv_client *c, const void *m, const int *fds, int nfds)
{
    return pool_proto_send(c->fd, m, fds, nfds, MSG_DONTWAIT);
}

void srv_frame_settle(struct pool_srv *s, size_t slot)
{
    struct srv_frame *f = &s->frames[slot];
    if (!f->live || f->owner >= 0 || f->nrec || f->nmap)
        return;
    KVVM_ASSERT(s->leased > 0 && f->xfd >= 0);
    s->leased--;
    srv_reserve_dispose(s, f->h, f->xfd);   /* export closed, then released, off the
                                               take-back (server_reserve.c) */
    f->xfd = -1;
    f->live = 0;
    f->h.h = 0;
    f->gen = (f->gen + 1) & 0x7fffffffu;    /* 31 bits: a client tags ids with bit 63 */
    if (f->gen == 0)
        f->gen = 1;
}

/* The live frame slot id names (any holder), or -1. */
long srv_frame_any(const struct pool_srv *s, uint64_t id)
{
    uint64_t slot1 = id & 0xffffffffu;
    if (slot1 == 0 || slot1 > s->nframes)
        return -1;
    const struct srv_frame *f = &s->frames[slot1 - 1];
    return f->live && f->gen == (uint32_t)(id >> 32) ? (long)(slot1 - 1) : -1;
}

/* ---- a client's maps set (server_int.h struct srv_client.maps; common/ktab.h) ---------- */

/* The entry of frame slot in c's maps (its key: slot + 1), or SIZE_MAX. */
static size_t maps_find(const struct srv_client *c, size_t slot)
{
    return ktab_find(&c->maps, (uint64_t)slot + 1);
}

int srv_maps_reserve(struct srv_client *c, size_t more)
{
    return ktab_reserve(&c->maps, more, 0);
}

bool srv_holds(const struct pool_srv *s, const struct srv_client *c, size_t slot)
{
    return s->frames[slot].owner == c->slot || maps_find(c, slot) != SIZE_MAX;
}

int srv_share_unmap(struct pool_srv *s, struct srv_client *c, uint64_t id)
{
    long slot = srv_frame_any(s, id);
    size_t k = slot < 0 ? SIZE_MAX : maps_find(c, (size_t)slot);
    if (k == SIZE_MAX)
        return -1;
    ktab_del(&c->maps, k);
    KVVM_ASSERT(s->frames[slot].nmap > 0);
    s->frames[slot].nmap--;
    srv_frame_settle(s, (size_t)slot);
    return 0;
}

static void rec_free(struct pool_srv *s, struct srv_rec *r, bool holds)
{
    for (uint32_t i = 0; holds && i < r->n; i++) {
        KVVM_ASSERT(s->frames[r->slots[i]].nrec > 0);
        s->frames[r->slots[i]].nrec--;
        srv_frame_settle(s, r->slots[i]);
    }
    free(r->slots);
    free(r);
}

static void waiters_wake(struct pool_srv *s, const uint8_t *token, bool gone);

/* Record k leaves the table (and a pending list; its holds dropped). */
static void rec_drop(struct pool_srv *s, size_t k)
{
    struct srv_rec *r = s->recs[k];
    if (r->pend)
        waiters_wake(s, r->token, true);    /* never ready: the imports waiting for it */
    srv_pend_unlink(s, r);
    s->recs[k] = s->recs[--s->nrecs];
    rec_free(s, r, true);
}

static int imported(struct srv_client *c, int err, uint32_t total, uint64_t length,
                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* The imports waiting for pending export token: its READY came (gone false: each is
   served as a new IMPORT; the first claims it, the others find it claimed) or it was
   dropped (-ENOENT). A reply that cannot be sent is left to the client's reply timeout. */
static void waiters_wake(struct pool_srv *s, const uint8_t *token, bool gone)
{
    for (size_t i = 0; i < s->nclients; i++) {
        struct srv_client *c = s->clients[i];
        if (!c || !c->imp_wait || memcmp(c->imp_msg.token, token, POOL_TOKEN_BYTES) != 0)
            continue;
        c->imp_wait = false;
        int rc = gone ? imported(c, -ENOENT, 0, 0, "the export was dropped before it was "
                                 "ready (its exporter went, or its device work failed)")
                      : srv_on_import(s, c, &c->imp_msg);
        if (rc)
            srv_say("client %s (pid %d): the answer to its waiting import was not sent (%s)",
                c->name, (int)c->pid, strerror(-rc));
    }
}

uint64_t srv_share_deadlines(struct pool_srv *s, uint64_t now)
{
    uint64_t next = UINT64_MAX;
    for (size_t i = 0; i < s->nclients; i++) {
        struct srv_client *c = s->clients[i];
        if (!c || !c->imp_wait)
            continue;
        if (c->imp_deadline > now) {
            next = c->imp_deadline < next ? c->imp_deadline : next;
            continue;
        }
        c->imp_wait = false;
        if (imported(c, -EAGAIN, 0, 0, "the export is still pending after %u ms: the device "
                     "work its exporter queued before kvvm_seq_export has not completed (the "
                     "exporter's kvvm_sync returns once it is importable)", c->imp_msg.wait_ms))
            srv_say("client %s (pid %d): the answer to its waiting import was not sent",
                c->name, (int)c->pid);
    }
    return next;
}

/* Pending record r is dropped (its READY failed, or its publisher went). */
static void pend_drop(struct pool_srv *s, struct srv_rec *r)
{
    if (r->kind == SRV_REC_PREFIX) {
        srv_prefix_entry_drop(s, r);
        return;
    }
    for (size_t k = 0; k < s->nrecs; k++)
        if (s->recs[k] == r) {
            rec_drop(s, k);
            return;
        }
    KVVM_ASSERT(!"a pending export is in the table");
}

void srv_pend_add(struct srv_client *c, struct srv_rec *r)
{
    KVVM_ASSERT(r->pend > 0);
    r->pend_slot = c->slot;
    r->pnext = c->pending;
    c->pending = r;
}

void srv_pend_unlink(struct pool_srv *s, struct srv_rec *r)
{
    if (!r->pend)
        return;
    struct srv_client *c = r->pend_slot >= 0 && (size_t)r->pend_slot < s->nclients
                           ? s->clients[r->pend_slot] : NULL;
    KVVM_ASSERT(c != NULL);                 /* a client going drops its pending first */
    for (struct srv_rec **p = c ? &c->pending : NULL; p && *p; p = &(*p)->pnext)
        if (*p == r) {
            *p = r->pnext;
            break;
        }
    r->pend = 0;
    r->pnext = NULL;
}

int srv_on_ready(struct pool_srv *s, struct srv_client *c, const struct pool_ready *m)
{
    if (c->role != POOL_ROLE_CLIENT)
        return -EPROTO;
    uint32_t n = 0;
    for (struct srv_rec *r = c->pending, *next; r; r = next) {
        next = r->pnext;
        if (r->pend != m->serial)
            continue;
        n++;
        if (!m->ok) {
            pend_drop(s, r);
            continue;
        }
        srv_pend_unlink(s, r);              /* visible from now */
        if (r->kind == SRV_REC_EXPORT)
            waiters_wake(s, r->token, false);
    }
    if (!m->ok && n)
        srv_say("client %s (pid %d): the device work before %u shared record%s did not "
            "complete (its wait failed): dropped, never shown", c->name, (int)c->pid, n,
            n == 1 ? "" : "s");
    struct pool_result r = { .err = (int32_t)n };
    pool_proto_hdr(&r.h, POOL_MSG_RESULT);
    snprintf(r.text, sizeof r.text, "%u shared record%s %s", n, n == 1 ? "" : "s",
             m->ok ? "visible" : "dropped");
    return send_msg(c, &r, NULL, 0);
}

void srv_share_client_gone(struct pool_srv *s, struct srv_client *c)
{
    uint32_t pend = 0;
    for (; c->pending; pend++)
        pend_drop(s, c->pending);       /* never READY: their bytes never known complete */
    if (pend)
        srv_say("client %s (pid %d) went before %u shared record%s it sent were ready: "
            "dropped, never shown", c->name, (int)c->pid, pend, pend == 1 ? "" : "s");
    for (size_t i = 0; i < c->maps.cap; i++) {
        if (!c->maps.key[i])
            continue;
        size_t slot = c->maps.key[i] - 1;
        KVVM_ASSERT(s->frames[slot].nmap > 0);
        s->frames[slot].nmap--;
        srv_frame_settle(s, slot);
    }
    ktab_free(&c->maps);
    for (size_t i = 0; i < s->nrecs; i++)
        if (s->recs[i]->claimed == c->slot)
            s->recs[i]->claimed = -1;
    if (c->exp)
        rec_free(s, c->exp, false);
    c->exp = NULL;
    srv_prefix_client_gone(s, c);
}

/* Frames dropping record r would free now. */
static size_t rec_frees(const struct pool_srv *s, const struct srv_rec *r)
{
    size_t n = 0;
    for (uint32_t i = 0; i < r->n; i++) {
        const struct srv_frame *f = &s->frames[r->slots[i]];
        n += f->owner < 0 && f->nmap == 0 && f->nrec == 1;
    }
    return n;
}

size_t srv_share_reclaim(struct pool_srv *s, size_t need)
{
    size_t freed = srv_prefix_reclaim(s, need);     /* unmapped shared entries first */
    while (freed < need) {
        long best = -1;
        for (size_t i = 0; i < s->nrecs; i++) {
            const struct srv_rec *r = s->recs[i];
            if (r->kind == SRV_REC_EXPORT && r->claimed < 0 && rec_frees(s, r) &&
                (best < 0 || r->serial < s->recs[best]->serial))
                best = (long)i;
        }
        if (best < 0)
            break;
        size_t before = s->leased;
        srv_say("the pool is short: dropped an unimported export of pid %d (%u frames)",
            (int)s->recs[best]->from, s->recs[best]->n);
        rec_drop(s, (size_t)best);
        freed += before - s->leased;
    }
    return freed;
}

void srv_share_close(struct pool_srv *s)
{
    srv_prefix_close(s);
    while (s->nrecs)
        rec_drop(s, s->nrecs - 1);
    free(s->recs);
    s->recs = NULL;
    s->cap_recs = 0;
}

/* The record of token t (constant-time compare), or -1. */
static long rec_find(const struct pool_srv *s, const uint8_t *t)
{
    long found = -1;
    for (size_t i = 0; i < s->nrecs; i++) {
        uint8_t d = 0;
        for (size_t k = 0; k < POOL_TOKEN_BYTES; k++)
            d |= (uint8_t)(s->recs[i]->token[k] ^ t[k]);
        if (!d && s->recs[i]->kind == SRV_REC_EXPORT)
            found = (long)i;
    }
    return found;
}

static int token_new(uint8_t *t)
{
    size_t got = 0;
    while (got < POOL_TOKEN_BYTES) {
        ssize_t n = getrandom(t + got, POOL_TOKEN_BYTES - got, 0);
        if (n < 0 && errno != EINTR)
            return -errno;
        got += n > 0 ? (size_t)n : 0;
    }
    return 0;
}

static int exported(struct srv_client *c, int err, const uint8_t *token, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int exported(struct srv_client *c, int err, const uint8_t *token, const char *fmt, ...)
{
    struct pool_exported r = { .err = err };
    pool_proto_hdr(&r.h, POOL_MSG_EXPORTED);
    if (token)
        memcpy(r.token, token, POOL_TOKEN_BYTES);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r.text, sizeof r.text, fmt, ap);
    va_end(ap);
    return send_msg(c, &r, NULL, 0);
}

/* The last chunk arrived: e's frames checked; the record enters the table. */
static int export_commit(struct pool_srv *s, struct srv_client *c, struct srv_rec *e)
{
    if (s->nrecs == s->cap_recs) {
        size_t cap = s->cap_recs ? 2 * s->cap_recs : 16;
        struct srv_rec **n = realloc(s->recs, cap * sizeof *n);
        if (!n) {
            rec_free(s, e, false);
            return exported(c, -ENOMEM, NULL, "the daemon is out of memory for a record");
        }
        s->recs = n;
        s->cap_recs = cap;
    }
    int rc = token_new(e->token);
    if (rc) {
        rec_free(s, e, false);
        return exported(c, rc, NULL, "getrandom failed: %s", strerror(-rc));
    }
    for (uint32_t i = 0; i < e->n; i++)
        s->frames[e->slots[i]].nrec++;
    e->serial = ++s->rec_serial;
    s->recs[s->nrecs++] = e;
    if (e->pend)
        srv_pend_add(c, e);                 /* importable once READY */
    srv_say("client %s (pid %d) exported %u frames (%llu tokens)", c->name, (int)c->pid, e->n,
        (unsigned long long)e->length);
    return exported(c, 0, e->token, "exported");
}

int srv_on_export(struct pool_srv *s, struct srv_client *c, const struct pool_export *m)
{
    if (c->role != POOL_ROLE_CLIENT)
        return -EPROTO;
    struct srv_rec *e = c->exp;
    if (!e) {
        if (m->off != 0)
            return -EPROTO;                 /* a chunk of no export */
        e = calloc(1, sizeof *e);
        if (e)
            e->slots = malloc((size_t)m->total * sizeof *e->slots);
        if (!e || !e->slots) {
            free(e);
            return -EPROTO;                 /* cannot follow its chunks: as malformed */
        }
        *e = (struct srv_rec){ .kind = SRV_REC_EXPORT, .lay = m->lay, .length = m->length,
                               .total = m->total, .slots = e->slots, .claimed = -1,
                               .from = c->pid, .pend = m->serial };
        e->lay.pad = 0;
        c->exp = e;
    } else if (m->off != e->n || m->total != e->total || m->serial != e->pend) {
        return -EPROTO;                     /* out of order */
    }
    for (uint32_t i = 0; i < m->n; i++) {
        long slot = srv_frame_any(s, m->ids[i]);
        /* its own: leased by it, or mapped by it (a re-export of an import) */
        if (slot < 0 || !srv_holds(s, c, (size_t)slot))
            return -EPROTO;
        e->slots[e->n++] = (uint32_t)slot;
    }
    if (e->n < m->total)
        return 0;                           /* more chunks come */
    c->exp = NULL;
    return export_commit(s, c, e);
}

static int imported(struct srv_client *c, int err, uint32_t total, uint64_t length,
                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static int imported(struct srv_client *c, int err, uint32_t total, uint64_t length,
                    const char *fmt, ...)
{
    struct pool_imported r = { .err = err, .total = total, .length = length };
    pool_proto_hdr(&r.h, POOL_MSG_IMPORTED);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r.text, sizeof r.text, fmt, ap);
    va_end(ap);
    return send_msg(c, &r, NULL, 0);
}

int srv_send_frames(struct pool_srv *s, struct srv_client *c, const uint32_t *slots,
                    uint32_t total)
{
    KVVM_ASSERT(2 * (c->maps.n + total) <= c->maps.cap);    /* srv_maps_reserve */
    for (uint32_t off = 0; off < total; off += POOL_BATCH_MAX) {
        struct pool_frames f = { 0 };
        int fds[POOL_BATCH_MAX], nfds = 0;
        uint32_t n = total - off < POOL_BATCH_MAX ? total - off : POOL_BATCH_MAX;
        for (uint32_t k = 0; k < n; k++) {
            size_t slot = slots[off + k];
            f.ids[k] = srv_frame_id(s, slot);
            if (srv_holds(s, c, slot)) {
                f.held |= 1ull << k;        /* it has a handle of it: no descriptor */
                continue;
            }
            KVVM_ASSERT(s->frames[slot].xfd >= 0);
            fds[nfds++] = s->frames[slot].xfd;     /* its one export: no export per send */
            ktab_put(&c->maps, (uint64_t)slot + 1);  /* mapped from now (RETURN: not) */
            s->frames[slot].nmap++;
        }
        f.n = n;
        pool_proto_hdr(&f.h, POOL_MSG_FRAMES);
        int rc = send_msg(c, &f, fds, nfds);    /* the descriptors stay the frames' */
        if (rc)
            return rc;                      /* the importer is dropped (its counts with it) */
    }
    return 0;
}

static bool layout_eq(const struct pool_layout *a, const struct pool_layout *b)
{
    return a->n_regions == b->n_regions && a->bytes_per_token == b->bytes_per_token &&
           a->page_size == b->page_size;
}

int srv_on_import(struct pool_srv *s, struct srv_client *c, const struct pool_import *m)
{
    if (c->role != POOL_ROLE_CLIENT)
        return -EPROTO;
    long k = rec_find(s, m->token);
    if (k < 0 || s->recs[k]->claimed >= 0)
        return imported(c, -ENOENT, 0, 0, "no export has this token (never made, already "
                        "imported, dropped, or dropped by the daemon under pressure)");
    struct srv_rec *r = s->recs[k];
    if (r->pend && m->wait_ms) {                /* answered at its READY or the deadline */
        c->imp_msg = *m;
        c->imp_wait = true;
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        c->imp_deadline = (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec +
                          (uint64_t)m->wait_ms * 1000000u;
        return 0;
    }
    if (r->pend)
        return imported(c, -EAGAIN, 0, 0, "the export is pending: the device work its "
                        "exporter queued before kvvm_seq_export has not completed yet (the "
                        "exporter's kvvm_sync returns once it is importable)");
    if (!layout_eq(&r->lay, &m->lay))
        return imported(c, -EINVAL, 0, 0, "the export's layout is n_regions %u, "
                        "bytes_per_token %llu, page_size %llu; this client's is %u, %llu, "
                        "%llu", r->lay.n_regions, (unsigned long long)r->lay.bytes_per_token,
                        (unsigned long long)r->lay.page_size, m->lay.n_regions,
                        (unsigned long long)m->lay.bytes_per_token,
                        (unsigned long long)m->lay.page_size);
    if (srv_maps_reserve(c, r->n))
        return imported(c, -ENOMEM, 0, 0, "the daemon is out of memory");
    r->claimed = c->slot;           /* the frames' mappings counted as they are sent */
    int rc = imported(c, 0, r->n, r->length, "importing");
    return rc ? rc : srv_send_frames(s, c, r->slots, r->n);
}

int srv_on_import_end(struct pool_srv *s, struct srv_client *c,
                      const struct pool_import_end *m)
{
    if (c->role != POOL_ROLE_CLIENT)
        return -EPROTO;
    long k = rec_find(s, m->token);
    if (k < 0 || s->recs[k]->claimed != c->slot)
        return -EPROTO;                     /* it claims no such import */
    if (!m->ok) {
        s->recs[k]->claimed = -1;           /* importable again */
        return 0;
    }
    srv_say("client %s (pid %d) imported an export of pid %d (%u frames)", c->name, (int)c->pid,
        (int)s->recs[k]->from, s->recs[k]->n);
    rec_drop(s, (size_t)k);                 /* spent: the importer's mappings hold them */
    return 0;
}

int srv_on_handoff_drop(struct pool_srv *s, struct srv_client *c,
                        const struct pool_handoff_drop *m)
{
    if (c->role != POOL_ROLE_CLIENT)
        return -EPROTO;
    struct pool_result r = { 0 };
    pool_proto_hdr(&r.h, POOL_MSG_RESULT);
    long k = rec_find(s, m->token);
    if (k < 0 || s->recs[k]->claimed >= 0) {
        r.err = -ENOENT;
        snprintf(r.text, sizeof r.text, "no unimported export has this token");
    } else {
        rec_drop(s, (size_t)k);
        snprintf(r.text, sizeof r.text, "dropped");
    }
    return send_msg(c, &r, NULL, 0);
}
