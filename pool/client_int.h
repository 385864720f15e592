/*
 * pool/client_int.h: the connection's state, shared by pool/client.c (leases, returns, the
 * connection thread, hand-offs), pool/client_frames.c (the handles handed out and their
 * local uses), pool/client_share.c (the shared prefix index) and pool/client_ready.c.
 */
#ifndef KVVM_POOL_CLIENT_INT_H
#define KVVM_POOL_CLIENT_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "client.h"
#include "common/ktab.h"

struct pool_cli {
    pthread_mutex_t mu;             /* the socket and everything below */
    int fd;                         /* -1: the daemon is gone */
    struct vmm *v;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    size_t page;
    /* leased, not handed out yet: the descriptors as received (imported when handed out,
       so every imported handle is paging's and the debug checker's driver count holds) */
    struct { int fd; uint64_t id; } stash[POOL_BATCH_MAX];
    unsigned n_stash;
    /* handed out (client_frames.c): by_h: handle value -> the daemon's frame id (tagged
       POOL_CLI_MAPPED or POOL_CLI_FOREIGN) and its local uses (paging frames holding the
       handle: more than one for a frame received held); by_id: the connected daemon's
       frame id (untagged) -> handle value, for every handle of by_h not FOREIGN */
    struct ktab by_h, by_id;        /* common/ktab.h; values in client_frames.c */
    size_t n_mapped;                /* of by_h.n: frames mapped from imports and attaches
                                       (POOL_CLI_MAPPED) */
    struct pool_figures fig;        /* the last figures a reply carried */
    char name[POOL_NAME_MAX];       /* HELLO's fields, for a reconnection */
    uint64_t p_reserve, p_limit, p_page;
    struct pool_welcome welcome;    /* the first daemon's: a new one must be of its shape */
    unsigned reconnects;
    struct pool_cli_counters k;
    struct khist wait_hist;         /* k.waits by duration (atomic: read without mu) */
    uint32_t wait_ms;               /* a call's lease waits this long for a take-back */
    int last_err;                   /* the last lease that got nothing: its FRAMES err */
    bool waiting;                   /* a lease with wait_ms is in flight */
    bool imp_waiting;               /* an import that may wait wait_ms for a pending export
                                       is in flight (its reply may take that much longer) */
    /* a give's RETURNs (pool_cli_hold_returns): the ids released and not sent yet, sent in
       one RETURN when it is full, at pool_cli_returns_flush and when the hold ends */
    bool hold_returns;
    struct pool_return held_ret;
    /* the daemon's asks (RECLAIM), kept for the connection thread: the latest seq and the
       frames asked since the last run took them */
    uint32_t ask_seq, ask_n;
    /* the connection thread (pool_cli_listen): polls the socket while no request is in
       flight and serves the asks through give(give_arg, n) without mu */
    uint32_t (*give)(void *arg, uint32_t n);
    void *give_arg;
    int evfd;                       /* wakes it: stop, or the socket changed */
    bool stop, thr_on;
    /* read without mu by the connection thread: kicked, the state changed (kick_locked:
       look under mu); req, requesters reading the socket now (pool_cli_req_begin: what
       arrives is theirs, a RECLAIM before a reply kept for the thread); parked, the thread
       waits for the requests' end (their last one writes evfd, not kicked). So a reply
       wakes the thread at most once and never makes it wait for mu (a requester holds mu
       through its imports, one lock per frame: the thread queued on it was woken and
       queued again at each one, twice a frame) */
    atomic_bool kicked, parked;
    atomic_uint req;
    pthread_t thr;
    /* the ready thread (client_ready.c): waits for each pending share's fence, in the
       order queued, without mu, then sends its READY under mu. rd_next: the last serial
       handed out; rd_queued: the last queued; rd_done: the last whose READY was answered
       (or given up: the daemon gone). rd_cv signals the queue and rd_done. */
    struct pool_cli_rd_job *rd_jobs;
    size_t rd_n, rd_cap;
    uint64_t rd_next, rd_queued, rd_done;
    pthread_cond_t rd_cv;
    bool rd_stop, rd_on;
    pthread_t rd_thr;
};

struct pool_cli_rd_job {
    uint64_t serial;
    vmm_fence f;
};

/* A frame held from a daemon that is gone: never returned to its successor. */
#define POOL_CLI_FOREIGN UINT64_MAX
/* Tags a frame id this client maps from an import (not leased: its RETURN gives up the
   mapping, and is not counted as a frame given back). The daemon's ids use 31 bits of
   generation, so bit 63 is free. */
#define POOL_CLI_MAPPED  (1ull << 63)

#define N_FDS(a) ((int)(sizeof(a) / sizeof *(a)))   /* an array's room, for max_fds */

/* client_frames.c, each with c->mu held */
/* Handle value key's frame id (tagged), or 0 when absent. */
uint64_t pool_cli_map_get(const struct pool_cli *c, uint64_t key);
/* Remembers new handle h of frame id (tagged; FOREIGN: a gone daemon's) with one use. 0;
   -ENOMEM (nothing remembered). */
int  pool_cli_handle_add(struct pool_cli *c, vmm_handle h, uint64_t id);
/* Drops one local use of h; its last releases it (vmm_phys_release), forgets it and gives
   its frame back (RETURN: a lease returned, or a mapping given up). 0; -EIO the release
   refused (nothing changed). */
int  pool_cli_handle_put(struct pool_cli *c, vmm_handle h);
/* The daemon went (a reconnection): every handle's frame is FOREIGN, by_id empty. */
void pool_cli_handles_foreign(struct pool_cli *c);
void pool_cli_tab_free(struct ktab *t);
/* A request reads the socket from now on, until its end (mu held; nested): the connection
   thread leaves what arrives to it. */
void pool_cli_req_begin(struct pool_cli *c);
void pool_cli_req_end(struct pool_cli *c);

/* A request: m sent, its reply of type want received (pool_cli_recv_locked), a request
   from the send on (pool_cli_req_begin). 0; -EIO (the daemon is gone). */
int pool_cli_ask_locked(struct pool_cli *c, const void *m, unsigned want, void *buf, int *fds,
                        int max_fds, int *nfds);

/* Receives the n frames of an import or attach (FRAMES messages) into hs, in order: one not
   held is imported (one use, remembered as mapped) and its id put in ids (the daemon
   counted it); a held one (protocol.h "Held frames") is this client's handle of it with one
   more use, its ids entry 0. After the first failure the rest are read, nothing taken (a
   held one: hs and ids 0; another: hs 0, its id in ids). 0; -EIO gone (a held id this
   client does not hold, or more frames than announced: malformed, the connection closed);
   the first failed import's -errno. */
int  pool_cli_frames_locked(struct pool_cli *c, vmm_handle *hs, uint64_t *ids, uint32_t n);
/* Undoes frames received: a use of each hs[i] (h != 0) dropped; for the others, the daemon's
   count of ids[i] (ids NULL or ids[i] 0: none) given back. */
void pool_cli_frames_undo_locked(struct pool_cli *c, const vmm_handle *hs, const uint64_t *ids,
                                 uint32_t n);

/* client.c, each with c->mu held */
/* One reply of type want (see client.c). 0; -EIO (the daemon is gone). */
int  pool_cli_recv_locked(struct pool_cli *c, unsigned want, void *buf, int *fds, int max_fds,
                          int *nfds);
/* The daemon is gone: the connection closed, what is held kept. */
void pool_cli_gone_locked(struct pool_cli *c, const char *why);
/* Tries the socket again (a new daemon of the same shape). 0; -errno. */
int  pool_cli_reconnect_locked(struct pool_cli *c);
/* Gives frame id back at once (RETURN; a mapped one: its mapping given up). */
void pool_cli_give_back_locked(struct pool_cli *c, uint64_t id);

#endif
