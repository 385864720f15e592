/*
 * pool/server_int.h: the pool daemon's state, shared by server.c (connections, leases,
 * take-back) and server_share.c (frames held by records and mapped by several clients:
 * hand-offs). Design: docs/design.md "The pool daemon", "Sharing frames between clients".
 *
 * Who holds a frame (struct srv_frame): the client that leased it (owner, at most one;
 * counted in its held), the records that hold it (nrec: an export waiting for its import,
 * a shared prefix entry; SRV_REC_*), and the clients that map it without having leased it
 * (nmap: importers and attachers; each client's maps set holds the slots it maps, once
 * each). A client holds a frame once at most, however many of its sequences use it: an
 * import or attach of a frame it holds already (srv_holds: its lease or its mapping) sends
 * it held (protocol.h "Held frames") and counts nothing, and its one RETURN comes when its
 * last local use goes. A frame is live from its lease until none of the three holds it;
 * then its handle is released and the slot is free (srv_frame_settle, the one place a live
 * frame dies). s->leased counts live frames: the pool's free frames are pool_frames -
 * leased.
 */
#ifndef KVVM_POOL_SERVER_INT_H
#define KVVM_POOL_SERVER_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

#include "common/ktab.h"
#include "protocol.h"
#include "server_figures.h"
#include "vmm/vmm.h"

struct srv_frame {
    vmm_handle h;
    int xfd;                    /* its export (made once, with the frame: server_reserve.c),
                                   sent with every grant and import of it and closed when the
                                   frame dies (srv_frame_settle); -1 in a free slot */
    uint32_t gen;               /* bumped when the slot is freed; ids carry it (31 bits) */
    int owner;                  /* the client slot that leased it; -1 = none */
    uint8_t live;               /* allocated (0: a free slot) */
    uint32_t nrec;              /* records holding it */
    uint32_t nmap;              /* clients that map it without a lease (imports, attaches):
                                   one each, whatever their own uses of it */
};

/* A record: frames the daemon holds for no client. Kinds: an export (a hand-off waiting
   for its one import); a shared prefix entry would be another kind with a key instead of
   a token, using the same frame counts (nrec) and the same settle. */
enum { SRV_REC_EXPORT = 1, SRV_REC_PREFIX = 2 };

struct srv_rec {
    uint8_t kind;
    uint8_t token[POOL_TOKEN_BYTES];
    struct pool_layout lay;
    uint64_t length;            /* tokens */
    uint32_t n;                 /* frames */
    uint32_t total;             /* an export's frames while its chunks arrive (n of them so
                                   far); then n */
    uint32_t *slots;            /* n frame slots, region-major, each holding one nrec */
    uint64_t serial;            /* age: oldest first under pressure */
    int claimed;                /* the client slot importing it now; -1 none */
    pid_t from;                 /* the exporter's pid (logs) */
    /* SRV_REC_PREFIX (server_prefix.c): keyed by (lay, ns, token = the key), in the index's
       hash chain and its LRU list (older toward head) */
    uint64_t ns;
    struct srv_rec *hnext, *lprev, *lnext;
    /* PENDING (protocol.h "PENDING and READY"): the publisher's serial until its READY (0:
       visible), the publisher's client slot, and its list of pending records */
    uint64_t pend;
    int pend_slot;
    struct srv_rec *pnext;
};

struct srv_client {
    int fd;
    int slot;                   /* in s->clients */
    unsigned role;              /* 0 until HELLO, then enum pool_role */
    pid_t pid;                  /* SO_PEERCRED */
    char name[POOL_NAME_MAX];
    uint64_t reserve, limit;    /* bytes; limit 0 = the whole pool */
    uint64_t held;              /* frames it holds */
    uint64_t active_ns;         /* its last LEASE (CLOCK_MONOTONIC): "least recently active" */
    /* take-back, as a victim: frames asked of it and not answered yet (RECLAIMED with
       ask_seq clears it), and the asker's round that asked it (one ask per round) */
    uint32_t asked, ask_seq;
    uint64_t asked_round;
    /* take-back, as an asker: a LEASE waiting for frames others give back */
    uint32_t pend_n;            /* frames it asked for; 0: no lease waits */
    uint64_t pend_round;        /* its round (victims it asked carry it) */
    uint64_t pend_t0, pend_deadline;  /* CLOCK_MONOTONIC ns */
    /* its credit (protocol.h LEASE's need): frames its call still needs past the lease
       answered, held against other clients' leases until owed_deadline (CLOCK_MONOTONIC
       ns) or its next waiting lease; 0: none */
    uint32_t owed;
    uint64_t owed_deadline;
    struct pool_fig_counts k;   /* its figures for kvvmd --metrics (server_figures.h) */
    uint64_t conn;              /* its number, in accept order (the metrics' conn label) */
    /* sharing (server_share.c) */
    struct ktab maps;           /* the frame slots it maps without a lease, a set of
                                   slot + 1 (common/ktab.h; srv_maps_reserve) */
    struct srv_rec *exp;        /* an export whose chunks are arriving; NULL none */
    struct srv_rec *pub;        /* a prefix entry whose chunks are arriving; NULL none */
    uint32_t pub_new;           /* entries its publish call made so far */
    uint8_t pub_prev[POOL_KEY_BYTES];   /* the call's previous entry's key (its parent) */
    bool pub_has_prev;
    struct srv_rec *pending;    /* its records not READY yet (pnext), newest first */
    /* an IMPORT of a pending export waiting for its READY (server_share.c): the request,
       answered at the READY, the export's drop, or imp_deadline (CLOCK_MONOTONIC ns) */
    bool imp_wait;
    uint64_t imp_deadline;
    struct pool_import imp_msg;
};

struct pool_srv {
    struct vmm *v;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    int lfd, efd, stopfd;       /* listening socket, epoll, stop eventfd */
    size_t page, granule, pool_frames, emu_bytes;
    bool emulated;
    struct srv_frame *frames;   /* frames[0 .. nframes) of cap_frames */
    size_t nframes, cap_frames, leased;
    size_t free_hint;           /* a slot to try first */
    struct srv_client **clients;/* clients[0 .. nclients), NULL = free slot */
    size_t nclients;
    uint64_t rounds;            /* take-back rounds started (each asker's lease is one) */
    struct pool_fig *fig;       /* the figures' snapshot, published when due once
                                   pool_srv_figures made it (NULL: no one reads them) */
    struct pool_fig_daemon figd;/* the daemon's counters (server_figures.h) */
    struct srv_rec **recs;      /* records (server_share.c), recs[0 .. nrecs) */
    size_t nrecs, cap_recs;
    uint64_t rec_serial;
    /* the shared prefix index (server_prefix.c) */
    struct srv_rec **pbuck;     /* hash chains; nbuck a power of two (0: none yet) */
    size_t nbuck, npfx, pfx_frames;
    struct srv_rec *lru_old, *lru_new;  /* the LRU list's ends */
    struct srv_reserve *rsv;    /* fresh frames made ahead, releases (server_reserve.c) */
};

static inline uint64_t srv_frame_id(const struct pool_srv *s, size_t slot)
{
    return (uint64_t)s->frames[slot].gen << 32 | (uint64_t)(slot + 1);
}

/* server.c: a line on stderr, "kvvmd: " first. */
/* Whether a take-back is under way: a lease waits, a client is asked, or an asker holds a
   credit (protocol.h LEASE's need). */
bool srv_takeback_on(const struct pool_srv *s);
void srv_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* server_share.c */
/* Frame slot dies when nothing holds it: its handle released, the slot free. */
void srv_frame_settle(struct pool_srv *s, size_t slot);
/* RETURN of id by c for a frame c maps without a lease: its mapping given up. 0; -1 c does
   not map it (the caller's -EPROTO). */
int  srv_share_unmap(struct pool_srv *s, struct srv_client *c, uint64_t id);
/* c is going: its mappings given up, the records it was importing importable again, its
   export in construction dropped, its pending records (never READY) dropped. */
void srv_share_client_gone(struct pool_srv *s, struct srv_client *c);
/* The pool is short of need frames for a call: unimported exports are dropped, oldest
   first, while that frees frames; returns the frames freed. */
size_t srv_share_reclaim(struct pool_srv *s, size_t need);
/* Drops every record (pool_srv_close). */
void srv_share_close(struct pool_srv *s);
/* The live frame slot id names (any holder), or -1. */
long srv_frame_any(const struct pool_srv *s, uint64_t id);
/* Whether c holds live frame slot: it leased it, or maps it. */
bool srv_holds(const struct pool_srv *s, const struct srv_client *c, size_t slot);
/* Room in c's maps set for more mappings (a reply's frames, before they are counted). 0;
   -ENOMEM. */
int  srv_maps_reserve(struct srv_client *c, size_t more);
/* The frames slots[0..n) to c, POOL_BATCH_MAX per FRAMES message, in order: each one c
   holds already (a frame seen earlier in the same reply included) goes held, without a
   descriptor; each other one is counted as c's mapping (nmap, its maps set: room for n
   reserved first) and goes with a descriptor. 0; -errno (drop c). */
int  srv_send_frames(struct pool_srv *s, struct srv_client *c, const uint32_t *slots,
                     uint32_t n);
/* The messages (the caller drops c on a -errno). */
int  srv_on_export(struct pool_srv *s, struct srv_client *c, const struct pool_export *m);
int  srv_on_import(struct pool_srv *s, struct srv_client *c, const struct pool_import *m);
int  srv_on_import_end(struct pool_srv *s, struct srv_client *c,
                       const struct pool_import_end *m);
int  srv_on_handoff_drop(struct pool_srv *s, struct srv_client *c,
                         const struct pool_handoff_drop *m);
/* Pending records (protocol.h "PENDING and READY"): r (pend > 0) joins c's list; r leaves
   its publisher's list (no-op when r is visible: pend 0), as every drop of a record does. */
void srv_pend_add(struct srv_client *c, struct srv_rec *r);
void srv_pend_unlink(struct pool_srv *s, struct srv_rec *r);
/* READY: c's records of serial become visible (ok) or are dropped. */
int  srv_on_ready(struct pool_srv *s, struct srv_client *c, const struct pool_ready *m);
/* The imports waiting for a pending export past their deadline are answered -EAGAIN (now:
   CLOCK_MONOTONIC ns); the nearest deadline of those still waiting (UINT64_MAX: none). */
uint64_t srv_share_deadlines(struct pool_srv *s, uint64_t now);

/* server_reserve.c: the reserve. Fresh frames created and exported ahead and the release
   of dead frames, made by the loop when no event waits; the device never holds more frames
   than the pool and the room the device had past it at open (live + ready + releasing <=
   dev), and none is made past the pool during a take-back (srv_takeback_on). */
struct srv_reserve_counts {
    uint64_t made_ahead;        /* frames made ahead */
    uint64_t taken_ready;       /* leased frames that were ready */
    uint64_t made_inline;       /* leased frames made on the lease's path (none was ready) */
    uint64_t released_ahead;    /* dead frames released when the loop was idle */
    uint64_t ready, dying, max; /* now: frames ready, dead frames not released yet; the most
                                   kept ready (0: none, every release made at once) */
    uint64_t dev;               /* frames the device may hold (the pool and room past it) */
};
/* Starts the reserve of at most max frames (0: none). 0; -ENOMEM. */
int  srv_reserve_open(struct pool_srv *s, size_t max);
/* A call's lease announced it needs need frames (LEASE's need): the reserve keeps up to
   that many ready from now on, within the device's room (no-op without a reserve, or when
   its memory cannot grow). */
void srv_reserve_need(struct pool_srv *s, size_t need);
/* Releases every ready and dying frame (before vmm_close). */
void srv_reserve_close(struct pool_srv *s);
/* A frame for a lease (s->leased is to grow by one): a ready one, else one made now. Its
   handle and its exported descriptor (the frame's for its life: srv_frame.xfd). 0; -errno
   (the device short). */
int  srv_reserve_take(struct pool_srv *s, vmm_handle *h, int *fd);
/* A dead frame's handle h and its export xfd (s->leased just dropped by one), both the
   reserve's now: xfd closed, then h released, when the loop is idle and no take-back is on
   (at once with no reserve), so that a take-back's RETURNs make no system call per frame. */
void srv_reserve_dispose(struct pool_srv *s, vmm_handle h, int xfd);
/* The reserve has work (a release, or a frame to make ahead): the loop polls without
   waiting and calls srv_reserve_work when no event came. */
bool srv_reserve_busy(const struct pool_srv *s);
/* One unit of that work: one release, else one frame made ahead. */
void srv_reserve_work(struct pool_srv *s);
void srv_reserve_counts(const struct pool_srv *s, struct srv_reserve_counts *out);

/* server_prefix.c: the shared prefix index */
/* Drops entries no client maps, least recently used first (leaves first), while that frees
   frames and fewer than need were freed; returns the frames freed. */
size_t srv_prefix_reclaim(struct pool_srv *s, size_t need);
/* c is going: its entry in construction dropped (the entries it made stay). */
void srv_prefix_client_gone(struct pool_srv *s, struct srv_client *c);
/* Entry r leaves the index (and a pending list); its holds go. */
void srv_prefix_entry_drop(struct pool_srv *s, struct srv_rec *r);
/* Drops every entry and the index (pool_srv_close). */
void srv_prefix_close(struct pool_srv *s);
int  srv_on_prefix_publish(struct pool_srv *s, struct srv_client *c,
                           const struct pool_prefix_publish *m);
int  srv_on_prefix_keys(struct pool_srv *s, struct srv_client *c,
                        const struct pool_prefix_keys *m, bool attach);
int  srv_on_prefix_drop(struct pool_srv *s, struct srv_client *c,
                        const struct pool_prefix_drop *m);

#endif
