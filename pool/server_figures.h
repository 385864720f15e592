/*
 * pool/server_figures.h: the pool daemon's figures for operators (kvvmd --metrics): the
 * counters the server keeps, a snapshot its thread publishes, and the snapshot's Prometheus
 * text (format 0.0.4). Design: docs/design.md "The pool daemon"; the names and what an
 * operator does when each moves: docs/api.md "kvvmd --metrics".
 *
 * Contract:
 *  - The server's thread owns the counters (struct pool_fig_counts: one per client, one for
 *    the daemon; plain increments, that thread only) and publishes after a round of its
 *    loop when pool_fig_due says so (at most every POOL_FIG_EVERY_MS, and within that
 *    time of the last change: pool_fig_timeout bounds the loop's wait while a change is
 *    unpublished), so a busy daemon walks its clients for the figures at most 20 times a
 *    second: pool_fig_begin, pool_fig_row per client, pool_fig_end. Building fills a
 *    staging copy no other thread reads; pool_fig_end swaps it in under the snapshot's mutex,
 *    held for two pointer writes. A round that runs out of memory keeps the last snapshot.
 *  - pool_fig_text (any thread: kvvmd's HTTP thread) copies the published snapshot under the
 *    mutex (a memcpy of its rows) and renders the text outside it: no rendering and no socket
 *    I/O under the lock, and the server's thread never waits for a reader longer than that
 *    copy; the server's own state is never read from another thread.
 *  - The text: every family with # HELP and # TYPE; counters end in _total, byte figures in
 *    _bytes, no gauge ends in _total; a client's series carry client="NAME", pid="PID" and
 *    conn="N" (the connection's number: two contexts of one process may share name and
 *    pid), the name escaped as the format says (\\, \", \n) and any byte that is not
 *    UTF-8 written as U+FFFD.
 */
#ifndef KVVM_POOL_SERVER_FIGURES_H
#define KVVM_POOL_SERVER_FIGURES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "common/hist.h"
#include "protocol.h"

/* A client's counters since its HELLO, or the daemon's since start (every client's, the
   gone ones' included). Frames are counted in frames, not bytes. */
struct pool_fig_counts {
    uint64_t frames_leased;     /* frames granted (FRAMES) */
    uint64_t frames_returned;   /* frames given back (RETURN) */
    uint64_t frames_at_exit;    /* frames it held when its connection closed (exit, crash) */
    uint64_t leases_short;      /* leases answered with fewer frames than asked */
    uint64_t lease_waits;       /* leases that waited for a take-back (a round each) */
    uint64_t asks;              /* RECLAIMs sent to it (take-backs, a limit below held) */
    uint64_t frames_asked;      /* frames those asked for */
    uint64_t frames_given;      /* frames it said it gave back for them (RECLAIMED) */
};

/* The daemon's own counters (the server's thread writes them). */
struct pool_fig_daemon {
    struct pool_fig_counts gone;    /* the counters of clients no longer connected */
    uint64_t connections;           /* connections accepted (clients and kvvmctl) */
    uint64_t closed, dropped;       /* client connections that closed / the daemon dropped
                                       (malformed, or not reading its messages) */
    struct khist takeback_wait;     /* waiting leases, from arrival to their answer */
};

/* One client in a snapshot. */
struct pool_fig_row {
    char name[POOL_NAME_MAX];       /* pool_fig_row copies it in */
    uint64_t conn;                  /* the connection's number (1, 2, ... in accept order) */
    uint32_t pid;
    uint32_t waiting;               /* frames its waiting lease asks for (0: none) */
    uint64_t held, reserve, limit;  /* bytes; limit: the pool's size when it has none */
    struct pool_fig_counts k;
};

/* The pool's figures in a snapshot. */
struct pool_fig_pool {
    uint64_t pool_bytes, free_bytes, page_size;
    uint64_t shared_entries, shared_bytes;  /* the daemon's shared index, as INFO says */
    uint64_t rounds;                /* take-back rounds started */
    uint32_t n_controls;            /* kvvmctl connections (not clients) now */
    uint64_t ready_frames;          /* free frames created ahead (the reserve) */
    uint64_t releasing_frames;      /* dead frames whose release is queued */
    uint64_t made_ahead, made_at_lease;     /* frames created ahead / on a lease's path */
    struct pool_fig_daemon d;
};

struct pool_fig;

/* 0; -ENOMEM. */
int  pool_fig_create(struct pool_fig **out);
void pool_fig_destroy(struct pool_fig *f);     /* NULL: nothing */

/* The server's thread: a client gone adds its counters to the daemon's (d->gone) and
   counts how it went (dropped: the daemon dropped it; frames: what it held then). */
void pool_fig_gone(struct pool_fig_daemon *d, struct pool_fig_counts *k, int dropped,
                   uint64_t frames);
#define POOL_FIG_EVERY_MS 50     /* the most a snapshot lags the server's state */

/* The server's thread, after a round that may have changed something: true when a
   snapshot is due now (then build it); false: later (the change is remembered). NULL f:
   false (nobody reads the figures). */
bool pool_fig_due(struct pool_fig *f);
/* The server's thread: its loop's wait (ms, -1 none) shortened to when an unpublished
   change is due. */
int  pool_fig_timeout(const struct pool_fig *f, int wait_ms);
/* The server's thread: a snapshot, built then published. */
void pool_fig_begin(struct pool_fig *f);
void pool_fig_row(struct pool_fig *f, const char *name, const struct pool_fig_row *r);
void pool_fig_end(struct pool_fig *f, const struct pool_fig_pool *p);

/* Any thread: the published snapshot as Prometheus text, a malloc'ed buffer of *len bytes
   (NUL-terminated, not counted), or NULL (out of memory; none published yet). */
char *pool_fig_text(struct pool_fig *f, size_t *len);

#endif
