/*
 * pool/server.h: the pool daemon's server (kvvmd is a thin main over it). Design:
 * docs/design.md "The pool daemon"; the protocol: pool/protocol.h.
 *
 * Contract:
 *  - One server = one device's pool: a vmm opened with shareable frames, a listening Unix
 *    SOCK_SEQPACKET socket (mode 0600) and one thread (pool_srv_run: epoll over the socket,
 *    the clients and a stop event). Frames are created on a lease (cuMemCreate, exportable),
 *    sent as descriptors (SCM_RIGHTS), and released when the client gives them back or its
 *    connection closes (exit, crash, SIGKILL: the connection is the lease); a frame is never
 *    handed to two clients (a returned one is released, the next lease creates a new one).
 *  - Clients are processes of the daemon's own user (SO_PEERCRED); anything malformed, out
 *    of order or naming a frame the client does not hold drops that client, never the
 *    server. A client that does not read its replies (its socket full) is dropped too.
 *  - Limits: a client holds at most its limit (0: the whole pool); frames others reserved
 *    and do not hold are not leased to it; the sum of the reserves is at most the pool
 *    (HELLO is refused -ENOSPC otherwise).
 *  - Everything it says goes to stderr (kvvmd prints its one stdout line itself).
 */
#ifndef KVVM_POOL_SERVER_H
#define KVVM_POOL_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include "kvvm.h"

struct pool_srv;

struct pool_srv_params {
    const char *socket_path;
    enum kvvm_backend backend;  /* AUTO, CUDA or EMULATED */
    int device;                 /* CUDA ordinal */
    size_t budget;              /* the pool's bytes; 0: free at start minus a margin */
    size_t page_size;           /* bytes of a frame; 0: the granule */
    size_t emu_device_bytes;    /* emulated capacity; 0: POOL_SRV_EMU_BYTES */
    size_t emu_granule;         /* emulated granule; 0: 2 MiB */
    size_t reserve_frames;      /* fresh frames created ahead when the server is idle
                                   (within the pool's free frames); 0: the default,
                                   POOL_SRV_RESERVE_FRAMES */
    bool no_reserve;            /* none: frames created on the lease's path, released at
                                   once */
};
#define POOL_SRV_RESERVE_FRAMES 64
#define POOL_SRV_EMU_BYTES (1ull << 30)

/* Opens the device and the socket. PATH: refused when a daemon answers there (-EADDRINUSE)
   or when it exists and is no socket (-EEXIST); a stale socket file is replaced. 0;
   -EINVAL bad parameters (a page size that is no multiple of the granule, a budget below
   one frame, a path too long), -ENODEV, -ENOMEM, -errno of the socket calls; why says it
   (NUL-terminated). */
int  pool_srv_open(const struct pool_srv_params *p, struct pool_srv **out, char *why,
                   size_t why_len);
/* Serves until pool_srv_stop. 0; -errno when epoll itself fails. */
int  pool_srv_run(struct pool_srv *s);
/* Makes pool_srv_run return (async-signal-safe: one write to an eventfd). */
void pool_srv_stop(struct pool_srv *s);
/* Drops every client, releases every frame, closes the device, removes the socket. */
void pool_srv_close(struct pool_srv *s);

/* The pool's shape, for the ready message. */
size_t pool_srv_pool_bytes(const struct pool_srv *s);
size_t pool_srv_page_size(const struct pool_srv *s);
const char *pool_srv_backend(const struct pool_srv *s);
/* The figures for operators (pool/server_figures.h: pool_fig_text from any thread), valid
   until pool_srv_close; the first call (before pool_srv_run, on its thread) starts them:
   from then on the server publishes them (at most every POOL_FIG_EVERY_MS, within that of
   a change). NULL: out of memory. */
struct pool_fig *pool_srv_figures(struct pool_srv *s);

#endif
