/*
 * pool/client_int.h: the connection's state, shared by pool/client.c (leases, returns, the
 * connection thread, hand-offs) and pool/client_share.c (the shared prefix index).
 */
#ifndef KVVM_POOL_CLIENT_INT_H
#define KVVM_POOL_CLIENT_INT_H

#include <pthread.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "client.h"

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
    uint64_t *key, *val;            /* handed out: handle value -> frame id (0 key: empty) */
    size_t cap, n;
    size_t n_mapped;                /* of n: frames mapped from imports (POOL_CLI_MAPPED) */
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
    /* the daemon's asks (RECLAIM), kept for the connection thread: the latest seq and the
       frames asked since the last run took them */
    uint32_t ask_seq, ask_n;
    /* the connection thread (pool_cli_listen): polls the socket while no request is in
       flight and serves the asks through give(give_arg, n) without mu */
    uint32_t (*give)(void *arg, uint32_t n);
    void *give_arg;
    int evfd;                       /* wakes it: stop, or the socket changed */
    bool stop, thr_on;
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

/* client.c, each with c->mu held */
/* key's value (a handle's frame id), or 0 when absent. */
uint64_t pool_cli_map_get(const struct pool_cli *c, uint64_t key);
/* One reply of type want (see client.c). 0; -EIO (the daemon is gone). */
int  pool_cli_recv_locked(struct pool_cli *c, unsigned want, void *buf, int *fds, int max_fds,
                          int *nfds);
/* The daemon is gone: the connection closed, what is held kept. */
void pool_cli_gone_locked(struct pool_cli *c, const char *why);
/* Tries the socket again (a new daemon of the same shape). 0; -errno. */
int  pool_cli_reconnect_locked(struct pool_cli *c);
/* Receives n frames (FRAMES messages) into ids and hs, each imported and remembered as
   mapped until one fails. 0; -EIO gone; the first failed import's -errno. */
int  pool_cli_frames_locked(struct pool_cli *c, vmm_handle *hs, uint64_t *ids, uint32_t n);
/* Gives frame id back at once (RETURN; a mapped one: its mapping given up). */
void pool_cli_give_back_locked(struct pool_cli *c, uint64_t id);

#endif
