/*
 * pool/server_figures.c: the pool daemon's figures for operators (contract in
 * pool/server_figures.h).
 *
 * Two snapshots: `pub`, the published one (under mu), and `stage`, the one the server's
 * thread builds (its own, no lock); pool_fig_end swaps them. A reader copies `pub` under mu
 * into its own buffer and renders from that copy. The families are the two tables below
 * (the daemon's and a client's): the text is expanded from them, and docs/api.md lists each
 * name (test_pool_metrics checks that every family the daemon serves is documented there).
 */
#include "server_figures.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/assert.h"

struct snap {
    struct pool_fig_pool p;
    struct pool_fig_row *rows;      /* rows[0 .. n) of cap */
    size_t n, cap;
    bool failed;                    /* a row could not be added: not published */
};

struct pool_fig {
    pthread_mutex_t mu;             /* guards pub and published */
    struct snap *pub, *stage;       /* stage: the server's thread's only */
    struct snap a, b;
    bool published;                 /* pub holds a snapshot */
    /* the server's thread's only: when the next snapshot may be built, and whether a
       round changed something since the last one (CLOCK_MONOTONIC ns) */
    uint64_t next_ns;
    bool dirty;
};

static uint64_t mono_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

bool pool_fig_due(struct pool_fig *f)
{
    if (!f)
        return false;
    f->dirty = true;
    return mono_ns() >= f->next_ns;
}

int pool_fig_timeout(const struct pool_fig *f, int wait_ms)
{
    if (!f || !f->dirty)
        return wait_ms;
    uint64_t now = mono_ns();
    int due = now >= f->next_ns ? 0 : (int)((f->next_ns - now + 999999u) / 1000000u);
    return wait_ms < 0 || due < wait_ms ? due : wait_ms;
}

int pool_fig_create(struct pool_fig **out)
{
    struct pool_fig *f = calloc(1, sizeof *f);
    if (!f)
        return -ENOMEM;
    pthread_mutex_init(&f->mu, NULL);
    f->pub = &f->a;
    f->stage = &f->b;
    *out = f;
    return 0;
}

void pool_fig_destroy(struct pool_fig *f)
{
    if (!f)
        return;
    pthread_mutex_destroy(&f->mu);
    free(f->a.rows);
    free(f->b.rows);
    free(f);
}

static void counts_add(struct pool_fig_counts *to, const struct pool_fig_counts *k)
{
    to->frames_leased += k->frames_leased;
    to->frames_returned += k->frames_returned;
    to->frames_at_exit += k->frames_at_exit;
    to->leases_short += k->leases_short;
    to->lease_waits += k->lease_waits;
    to->asks += k->asks;
    to->frames_asked += k->frames_asked;
    to->frames_given += k->frames_given;
}

void pool_fig_gone(struct pool_fig_daemon *d, struct pool_fig_counts *k, int dropped,
                   uint64_t frames)
{
    k->frames_at_exit += frames;
    counts_add(&d->gone, k);
    if (dropped)
        d->dropped++;
    else
        d->closed++;
}

void pool_fig_begin(struct pool_fig *f)
{
    f->stage->n = 0;
    f->stage->failed = false;
}

void pool_fig_row(struct pool_fig *f, const char *name, const struct pool_fig_row *r)
{
    struct snap *s = f->stage;
    if (s->failed)
        return;
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 16;
        struct pool_fig_row *n = realloc(s->rows, cap * sizeof *n);
        if (!n) {
            s->failed = true;               /* the last snapshot stays */
            return;
        }
        s->rows = n;
        s->cap = cap;
    }
    s->rows[s->n] = *r;
    snprintf(s->rows[s->n++].name, sizeof r->name, "%s", name);
}

void pool_fig_end(struct pool_fig *f, const struct pool_fig_pool *p)
{
    struct snap *s = f->stage;
    if (s->failed)
        return;
    s->p = *p;
    f->dirty = false;
    f->next_ns = mono_ns() + POOL_FIG_EVERY_MS * 1000000ull;
    pthread_mutex_lock(&f->mu);
    f->stage = f->pub;
    f->pub = s;
    f->published = true;
    pthread_mutex_unlock(&f->mu);
}

/* A copy of the published snapshot (rows malloc'ed). false: none, or out of memory. */
static bool snap_copy(struct pool_fig *f, struct snap *out)
{
    memset(out, 0, sizeof *out);
    for (;;) {
        pthread_mutex_lock(&f->mu);
        size_t n = f->pub->n;
        bool fits = n <= out->cap, any = f->published;
        if (any && fits) {
            out->p = f->pub->p;
            out->n = n;
            if (n)
                memcpy(out->rows, f->pub->rows, n * sizeof *out->rows);
        }
        pthread_mutex_unlock(&f->mu);
        if (any && fits)
            return true;
        if (!any) {
            free(out->rows);
            out->rows = NULL;
            return false;
        }
        struct pool_fig_row *r = realloc(out->rows, (n + 16) * sizeof *r);  /* outside mu */
        if (!r) {
            free(out->rows);
            out->rows = NULL;
            return false;
        }
        out->rows = r;
        out->cap = n + 16;
    }
}

/* ---- the families --------------------------------------------------------------------- */

/* What a family's sample reads: of a client's row, or of the daemon (pool). */
enum fv { V_HELD, V_RESERVE, V_LIMIT, V_WAITING, V_LEASED, V_RETURNED, V_AT_EXIT, V_SHORT,
          V_WAITS, V_ASKS, V_ASKED, V_GIVEN,
          V_POOL, V_FREE, V_POOL_HELD, V_RESERVED, V_PAGE, V_CLIENTS, V_CONTROLS, V_ENTRIES,
          V_SHARED, V_ROUNDS, V_CONNS, V_CLOSED, V_DROPPED, V_READY, V_RELEASING,
          V_MADE_AHEAD, V_MADE_LEASE };

struct fam {
    const char *name, *type, *labels, *help;
    enum fv v;
};

#define H_TB_FRAMES "Frames the daemon asked back (state=\"asked\": take-backs, a limit below " \
    "what was held) and frames given back for those asks (state=\"given\")."
#define H_MADE "Frames created: ahead, by the daemon's reserve (when=\"ahead\"), or " \
    "on a lease's path because none was ready (when=\"at_lease\")."
#define H_DISC "Client connections that ended: closed by the client (exit, crash, kill: its " \
    "frames come back) or dropped by the daemon (malformed message, not reading its replies)."

/* The daemon's families (one sample each; a family of several rows is adjacent). */
static const struct fam pool_fams[] = {
    { "kvvm_pool_size_bytes", "gauge", "", "Bytes of the pool (its frames).", V_POOL },
    { "kvvm_pool_free_bytes", "gauge", "", "Bytes of frames held by no client.", V_FREE },
    { "kvvm_pool_held_bytes", "gauge", "", "Bytes of frames leased to clients.", V_POOL_HELD },
    { "kvvm_pool_reserved_bytes", "gauge", "",
      "Sum of the clients' reserves (bytes never asked back).", V_RESERVED },
    { "kvvm_pool_page_size_bytes", "gauge", "", "Bytes of one frame.", V_PAGE },
    { "kvvm_pool_clients", "gauge", "",
      "Clients connected (contexts; kvvmctl's connections are not clients).", V_CLIENTS },
    { "kvvm_pool_control_connections", "gauge", "", "kvvmctl connections open now.",
      V_CONTROLS },
    { "kvvm_pool_shared_entries", "gauge", "",
      "Entries of the daemon's shared prefix index.", V_ENTRIES },
    { "kvvm_pool_shared_bytes", "gauge", "",
      "Bytes of frames the shared prefix index holds.", V_SHARED },
    { "kvvm_pool_ready_frames", "gauge", "",
      "Frames created ahead (fresh, in no client's hands; past the pool where the device "
      "has room).",
      V_READY },
    { "kvvm_pool_releasing_frames", "gauge", "",
      "Frames no one holds any more whose release the daemon has not made yet.",
      V_RELEASING },
    { "kvvm_pool_frames_created_total", "counter", "when=\"ahead\"", H_MADE, V_MADE_AHEAD },
    { "kvvm_pool_frames_created_total", "counter", "when=\"at_lease\"", H_MADE,
      V_MADE_LEASE },
    { "kvvm_pool_frames_leased_total", "counter", "", "Frames leased to clients.", V_LEASED },
    { "kvvm_pool_frames_returned_total", "counter", "",
      "Frames clients gave back (returns, trims, take-backs).", V_RETURNED },
    { "kvvm_pool_frames_released_at_exit_total", "counter", "",
      "Frames clients held when their connection closed (exit, crash), released by the "
      "daemon.", V_AT_EXIT },
    { "kvvm_pool_leases_short_total", "counter", "",
      "Leases answered with fewer frames than asked (pool dry, a limit, a take-back short "
      "or late).", V_SHORT },
    { "kvvm_pool_takeback_rounds_total", "counter", "",
      "Take-back rounds: leases that found the pool dry and waited for frames from other "
      "clients.", V_ROUNDS },
    { "kvvm_pool_takeback_asks_total", "counter", "",
      "Asks to give frames back (RECLAIM) sent to clients.", V_ASKS },
    { "kvvm_pool_takeback_frames_total", "counter", "state=\"asked\"", H_TB_FRAMES,
      V_ASKED },
    { "kvvm_pool_takeback_frames_total", "counter", "state=\"given\"", H_TB_FRAMES,
      V_GIVEN },
    { "kvvm_pool_connections_total", "counter", "",
      "Connections accepted (clients and kvvmctl).", V_CONNS },
    { "kvvm_pool_disconnects_total", "counter", "how=\"closed\"", H_DISC, V_CLOSED },
    { "kvvm_pool_disconnects_total", "counter", "how=\"dropped\"", H_DISC, V_DROPPED },
};

/* A client's families: one sample per client, labelled client="NAME",pid="PID",conn="N". */
static const struct fam client_fams[] = {
    { "kvvm_pool_client_held_bytes", "gauge", "", "Bytes of frames leased to the client.",
      V_HELD },
    { "kvvm_pool_client_reserve_bytes", "gauge", "",
      "The client's reserve (bytes never asked back).", V_RESERVE },
    { "kvvm_pool_client_limit_bytes", "gauge", "",
      "The most the client may hold (the pool's size when it has no limit).", V_LIMIT },
    { "kvvm_pool_client_waiting_frames", "gauge", "",
      "Frames the client's waiting lease asks for (0: none waits).", V_WAITING },
    { "kvvm_pool_client_frames_leased_total", "counter", "",
      "Frames leased to the client since it connected.", V_LEASED },
    { "kvvm_pool_client_frames_returned_total", "counter", "",
      "Frames the client gave back since it connected.", V_RETURNED },
    { "kvvm_pool_client_leases_short_total", "counter", "",
      "The client's leases answered with fewer frames than asked.", V_SHORT },
    { "kvvm_pool_client_lease_waits_total", "counter", "",
      "The client's leases that found the pool dry and waited for a take-back.", V_WAITS },
    { "kvvm_pool_client_takeback_asks_total", "counter", "",
      "Asks to give frames back sent to the client.", V_ASKS },
    { "kvvm_pool_client_takeback_frames_total", "counter", "state=\"asked\"", H_TB_FRAMES,
      V_ASKED },
    { "kvvm_pool_client_takeback_frames_total", "counter", "state=\"given\"", H_TB_FRAMES,
      V_GIVEN },
};

#define TB_HIST "kvvm_pool_takeback_duration_seconds"
#define TB_HELP "Leases that waited for a take-back, by time from their arrival to their " \
    "answer (at most the client's pool_timeout_ms)."

static uint64_t counts_value(const struct pool_fig_counts *k, enum fv v)
{
    switch (v) {
    case V_LEASED:   return k->frames_leased;
    case V_RETURNED: return k->frames_returned;
    case V_AT_EXIT:  return k->frames_at_exit;
    case V_SHORT:    return k->leases_short;
    case V_WAITS:    return k->lease_waits;
    case V_ASKS:     return k->asks;
    case V_ASKED:    return k->frames_asked;
    case V_GIVEN:    return k->frames_given;
    default:         KVVM_ASSERT(!"a counter"); return 0;
    }
}

static uint64_t row_value(const struct pool_fig_row *r, enum fv v)
{
    switch (v) {
    case V_HELD:    return r->held;
    case V_RESERVE: return r->reserve;
    case V_LIMIT:   return r->limit;
    case V_WAITING: return r->waiting;
    default:        return counts_value(&r->k, v);
    }
}

/* all: the daemon's counters (the gone clients' and the connected ones'). */
static uint64_t pool_value(const struct snap *s, const struct pool_fig_counts *all, enum fv v)
{
    const struct pool_fig_pool *p = &s->p;
    uint64_t reserved = 0;
    switch (v) {
    case V_POOL:      return p->pool_bytes;
    case V_FREE:      return p->free_bytes;
    case V_POOL_HELD: return p->pool_bytes - p->free_bytes;
    case V_RESERVED:
        for (size_t i = 0; i < s->n; i++)
            reserved += s->rows[i].reserve;
        return reserved;
    case V_PAGE:      return p->page_size;
    case V_CLIENTS:   return s->n;
    case V_CONTROLS:  return p->n_controls;
    case V_ENTRIES:   return p->shared_entries;
    case V_SHARED:    return p->shared_bytes;
    case V_ROUNDS:    return p->rounds;
    case V_CONNS:     return p->d.connections;
    case V_CLOSED:    return p->d.closed;
    case V_DROPPED:   return p->d.dropped;
    case V_READY:     return p->ready_frames;
    case V_RELEASING: return p->releasing_frames;
    case V_MADE_AHEAD: return p->made_ahead;
    case V_MADE_LEASE: return p->made_at_lease;
    case V_AT_EXIT:   return all->frames_at_exit;
    default:          return counts_value(all, v);
    }
}

/* ---- the text ------------------------------------------------------------------------- */

/* A label value as the format wants it: \\, \" and \n escaped, a byte that does not start
   or continue a valid UTF-8 sequence written as U+FFFD. */
static void put_label_value(FILE *o, const char *v)
{
    const unsigned char *p = (const unsigned char *)v;
    while (*p) {
        unsigned c = *p, len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0
                                 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
        bool ok = len > 0 && !(len == 2 && c < 0xc2) && !(len == 4 && c > 0xf4);
        for (unsigned i = 1; ok && i < len; i++)
            ok = (p[i] & 0xc0) == 0x80;
        if (ok && len == 3)     /* no overlong form, no surrogate */
            ok = !(c == 0xe0 && p[1] < 0xa0) && !(c == 0xed && p[1] >= 0xa0);
        if (ok && len == 4)
            ok = !(c == 0xf0 && p[1] < 0x90) && !(c == 0xf4 && p[1] >= 0x90);
        if (!ok) {
            fputs("\xef\xbf\xbd", o);
            p++;
            continue;
        }
        if (c == '\\' || c == '"')
            fprintf(o, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", o);
        else
            fwrite(p, 1, len, o);
        p += len;
    }
}

static void put_head(FILE *o, const struct fam *f)
{
    KVVM_ASSERT(!strpbrk(f->help, "\\\n"));   /* nothing the format would escape */
    fprintf(o, "# HELP %s %s\n# TYPE %s %s\n", f->name, f->help, f->name, f->type);
}

static bool first_of_family(const struct fam *tab, size_t i)
{
    return i == 0 || strcmp(tab[i - 1].name, tab[i].name) != 0;
}

static void put_pool(FILE *o, const struct snap *s, const struct pool_fig_counts *all)
{
    for (size_t i = 0; i < sizeof pool_fams / sizeof *pool_fams; i++) {
        const struct fam *f = &pool_fams[i];
        if (first_of_family(pool_fams, i))
            put_head(o, f);
        fprintf(o, "%s%s%s%s %llu\n", f->name, *f->labels ? "{" : "", f->labels,
                *f->labels ? "}" : "", (unsigned long long)pool_value(s, all, f->v));
    }
    const struct khist *h = &s->p.d.takeback_wait;
    static const char *const le[KHIST_FINITE] = {
#define X(ns, str) str,
        KHIST_BOUNDS(X)
#undef X
    };
    fprintf(o, "# HELP %s %s\n# TYPE %s histogram\n", TB_HIST, TB_HELP, TB_HIST);
    uint64_t cum = 0;
    for (unsigned b = 0; b < KHIST_N; b++) {
        cum += h->n[b];
        fprintf(o, "%s_bucket{le=\"%s\"} %llu\n", TB_HIST, b < KHIST_FINITE ? le[b] : "+Inf",
                (unsigned long long)cum);
    }
    fprintf(o, "%s_sum %llu.%09llu\n%s_count %llu\n", TB_HIST,
            (unsigned long long)(h->sum_ns / 1000000000u),
            (unsigned long long)(h->sum_ns % 1000000000u), TB_HIST, (unsigned long long)cum);
}

static void put_clients(FILE *o, const struct snap *s)
{
    for (size_t i = 0; i < sizeof client_fams / sizeof *client_fams; i++) {
        const struct fam *f = &client_fams[i];
        if (first_of_family(client_fams, i))
            put_head(o, f);
        for (size_t k = 0; k < s->n; k++) {
            const struct pool_fig_row *r = &s->rows[k];
            fprintf(o, "%s{client=\"", f->name);
            put_label_value(o, r->name);
            fprintf(o, "\",pid=\"%u\",conn=\"%llu\"%s%s} %llu\n", r->pid,
                    (unsigned long long)r->conn, *f->labels ? "," : "", f->labels,
                    (unsigned long long)row_value(r, f->v));
        }
    }
}

char *pool_fig_text(struct pool_fig *f, size_t *len)
{
    struct snap s;
    if (!snap_copy(f, &s))
        return NULL;
    struct pool_fig_counts all = s.p.d.gone;
    for (size_t i = 0; i < s.n; i++)
        counts_add(&all, &s.rows[i].k);
    char *buf = NULL;
    size_t n = 0;
    FILE *o = open_memstream(&buf, &n);
    if (o) {
        put_pool(o, &s, &all);
        put_clients(o, &s);
        bool bad = ferror(o) != 0;
        if (fclose(o) != 0 || bad) {
            free(buf);
            buf = NULL;
        }
    }
    free(s.rows);
    *len = buf ? n : 0;
    return buf;
}
