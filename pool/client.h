/*
 * pool/client.h: a context's connection to the pool daemon (kvvmd): the frame source of a
 * context opened with pool_socket (paging.h struct pg_frame_src). Design: docs/design.md
 * "The pool daemon"; the protocol: pool/protocol.h.
 *
 * Contract:
 *  - One connection per context, opened before its vmm (the daemon's shape decides the
 *    emulated device's and the page size), attached to the vmm once it is open.
 *  - pool_cli_create hands out one frame: from a small stash of frames leased in batches
 *    (POOL_CLI_BATCH per LEASE; each imported as it is handed out), so most creates make
 *    no request; the frame pool thread's creates fill the stash off the engine's thread.
 *    pool_cli_release unmapped frames go back to the daemon at once (RETURN).
 *  - One handle per frame: a frame this client holds already that an import or an attach
 *    hands it again comes held (protocol.h "Held frames"): the same handle, one more local
 *    use (paging adopts it as one more frame); pool_cli_release drops one use, and only the
 *    last releases the handle and sends RETURN. The daemon counts the frame once.
 *  - Thread-safe: one mutex serializes the socket's requests and replies and guards the
 *    state. The daemon speaks unasked only to ask frames back (RECLAIM): a requester that
 *    reads one before its reply keeps it; the connection thread (pool_cli_listen) polls
 *    the socket while no request is in flight, and serves each ask off the engine's thread
 *    through the give function it was given (the context's reclaim), then answers it.
 *  - A call's lease (create with need > 0) carries wait_ms: when the pool is dry the daemon
 *    takes frames back from other clients and answers within it; the frame pool thread's
 *    leases never wait (they take what is free), so no background lease starts a take-back.
 *  - When the daemon goes (its socket closes, or a reply takes longer than
 *    POOL_CLI_REPLY_MS), the context keeps the frames it holds; creates fail -ENOMEM saying
 *    the daemon is gone. Each later lease or info request first tries the socket again: a
 *    new kvvmd of the same shape (page size, backend, granule) there is joined, and the
 *    frames held from the old one stay the context's, never returned to the new one.
 */
#ifndef KVVM_POOL_CLIENT_H
#define KVVM_POOL_CLIENT_H

#include <stdbool.h>
#include <stdint.h>
#include "common/hist.h"
#include "protocol.h"
#include "vmm/vmm.h"

#define POOL_CLI_BATCH    16u        /* frames per lease */
#define POOL_CLI_REPLY_MS 10000u     /* the longest a reply may take: past it, gone */

struct pool_cli;

struct pool_cli_params {
    const char *path;
    const char *name;               /* shown by kvvmctl */
    uint64_t reserve, limit;        /* bytes; limit 0 = the whole pool */
    uint64_t page_size;             /* 0: the daemon's */
    uint32_t wait_ms;               /* pool_timeout_ms: a call's lease waits this long for a
                                       take-back (0: it takes what is free) */
};

struct pool_cli_counters {
    uint64_t leases;                /* frames received */
    uint64_t returns;               /* frames given back */
    uint64_t return_msgs;           /* RETURN messages sent (up to POOL_BATCH_MAX ids each;
                                       mapped frames given up included) */
    uint64_t waits;                 /* leases the engine's thread waited for (a call) */
    uint64_t wait_ns;               /* their time */
    uint64_t takebacks;             /* the daemon's asks served (RECLAIM) */
    uint64_t taken_back;            /* frames given back for them */
    uint64_t listen_looks;          /* the connection thread's wake-ups that took mu (a
                                       kick, or an unasked message: never a reply) */
};

/* Connects and greets: *w is the daemon's welcome. -ECONNREFUSED no daemon answers (a
   missing path included); -EINVAL (page size) or -ENOSPC (reserve) refused by the daemon;
   -EPROTO another protocol version or no kvvmd; -ENOMEM. Each logged as an error naming
   the cause. */
int  pool_cli_open(const struct pool_cli_params *p, struct pool_cli **out,
                   struct pool_welcome *w);
void pool_cli_attach(struct pool_cli *c, struct vmm *v);
/* struct pg_frame_src's two functions (arg: the struct pool_cli). A create with need > 0
   and an empty stash leases need frames at once (at least POOL_CLI_BATCH, at most
   POOL_BATCH_MAX): a take-back round asks other clients for the call's shortfall. A
   release drops one local use of h (a held frame's handle has several: one per paging
   frame); the last releases it and gives its frame back. -EIO the driver refused the
   release (nothing changed). */
int  pool_cli_create(void *arg, vmm_handle *out, uint32_t need);
int  pool_cli_release(void *arg, vmm_handle h);
/* The pool's figures now (one request); *connected 0 when the daemon is gone (the figures
   are then the last known, held_bytes this context's). 0; -EIO. */
int  pool_cli_info(struct pool_cli *c, struct pool_figures *f, int *connected);
/* The last figures a reply carried (no request), for an error message; *err (NULL: not
   asked) the FRAMES err of the last lease if it got no frame (-ENOMEM the pool dry or the
   limit reached, -ETIMEDOUT a take-back that did not end within wait_ms), else 0. */
void pool_cli_last(struct pool_cli *c, struct pool_figures *f, int *connected, int *err);
/* Starts the connection thread: it serves the daemon's asks with give(arg, n), called
   without any lock of this connection (it may take the context lock, then release frames
   through pool_cli_release), which gives back up to n frames and returns how many it gave.
   The thread makes the vmm's context current first. 0; -errno (no thread: asks are then
   read and dropped by requesters, and the daemon's rounds wait for their deadline). */
int  pool_cli_listen(struct pool_cli *c, uint32_t (*give)(void *arg, uint32_t n), void *arg);
/* Stops and joins the connection thread (no lock held; NULL or none: no-op). */
void pool_cli_unlisten(struct pool_cli *c);
void pool_cli_counters(struct pool_cli *c, struct pool_cli_counters *out);
/* The waits of pool_cli_counters' waits / wait_ns by duration (kvvm_metrics'
   kvvm_pool_wait_duration_seconds): recorded with relaxed atomics where wait_ns is, read
   without the connection's lock. NULL c: an empty histogram. */
void pool_cli_wait_hist(struct pool_cli *c, struct khist *out);
/* This client's limit changed (kvvm_set_budget): tells the daemon (and a reconnection).
   0; the daemon gone is no error (the limit goes with the next HELLO). */
int  pool_cli_set_limit(struct pool_cli *c, uint64_t bytes);
/* A give (the connection thread's, for a RECLAIM) or a call that may release many frames
   at once (a free of an imported sequence: core/pool_client.c core_pool_returns_hold) holds
   its releases' RETURNs (on) and sends them in messages of up to POOL_BATCH_MAX ids: when
   one is full, at pool_cli_returns_flush (a chunk's end: the daemon may grant those frames
   while the give goes on) and when the hold ends (off, before the answer or the call's
   return). The ids not sent when the daemon goes are dropped with it; a client killed
   meanwhile gives them all back by its death. Holds do not nest: each is taken and ended
   under the context lock. */
void pool_cli_hold_returns(struct pool_cli *c, bool on);
void pool_cli_returns_flush(struct pool_cli *c);
/* Gives the stash back to the daemon (kvvm_trim); returns how many frames. */
unsigned pool_cli_trim(struct pool_cli *c);
/* Hand-offs (docs/design.md "Sharing frames between clients"). Frames imported from an
   export are mapped, not leased: pool_cli_release gives up the mapping (RETURN, not counted
   in returns) with its last use. */
/* Exports the frames of handles hs[0..n) (each handed out by pool_cli_create or imported),
   region-major, as one hand-off of length tokens and layout lay: the token (POOL_TOKEN_BYTES)
   into token. serial 0: importable now; else pending until its READY (pool_cli_ready_after).
   0; -ENOENT a handle that is not this daemon's; -EIO gone; the daemon's refusal (-ENOMEM).
   why says the cause on an error. */
int  pool_cli_export(struct pool_cli *c, const vmm_handle *hs, uint32_t n,
                     const struct pool_layout *lay, uint64_t length, uint64_t serial,
                     uint8_t *token, char *why, size_t wl);
/* Imports the frames of token for a client of layout lay: *out (n_out handles, the
   caller's array to free, region-major: each imported and remembered as mapped, or, for a
   frame this client holds already, its handle with one more use) and the length. The
   import is pending until pool_cli_import_end. An export still pending (its exporter's
   READY not come) is waited for up to wait_ms (not while this client's own READYs are
   queued), then -EAGAIN (nothing spent). -ENOENT unknown or spent (or dropped
   while pending), -EINVAL another layout (nothing spent), -EIO gone, -ENOMEM (nothing
   spent). */
int  pool_cli_import(struct pool_cli *c, const uint8_t *token, const struct pool_layout *lay,
                     vmm_handle **out, uint32_t *n_out, uint64_t *length, char *why,
                     size_t wl);
/* ok: the import took (token spent; the handles are paging's now). !ok: a use of each of
   the handles hs[0..n) is dropped here (the last one releases it and gives its frame back)
   and the export is importable again. */
void pool_cli_import_end(struct pool_cli *c, const uint8_t *token, vmm_handle *hs, uint32_t n,
                         bool ok);
/* Drops an unimported export. 0; -ENOENT unknown, spent or being imported; -EIO gone. */
int  pool_cli_handoff_drop(struct pool_cli *c, const uint8_t *token, char *why, size_t wl);
/* The daemon's shared prefix index (docs/design.md "Sharing frames between clients"): keys
   are POOL_KEY_BYTES each, entries are keyed by (lay, ns, key) and hold one frame per
   region; one request per POOL_PREFIX_KEYS keys. */
/* Enters n entries: keys[0..n), their frames hs key-major (n * n_regions; each handed out
   by pool_cli_create or imported); serial as pool_cli_export's. The new entries (>= 0; a
   key present keeps its entry); -ENOENT a handle that is not this daemon's, -ENOTCONN the
   daemon gone (nothing sent either); -EIO it went during the request, its answer lost:
   it may have made entries of those frames, visible to other clients (serial 0), so the
   caller treats them as shared. */
int  pool_cli_prefix_publish(struct pool_cli *c, const struct pool_layout *lay, uint64_t ns,
                             const uint8_t *keys, uint32_t n, const vmm_handle *hs,
                             uint64_t serial);
/* How many leading keys of keys[0..n) the index has (0 when the daemon is gone). */
size_t pool_cli_prefix_lookup(struct pool_cli *c, const struct pool_layout *lay, uint64_t ns,
                              const uint8_t *keys, size_t n);
/* Maps the leading entries present: *found of them, their frames in *out (key-major,
   *found * n_regions handles, the caller's array to free; each imported and remembered as
   mapped, or one this client holds already with one more use: pool_cli_release drops one).
   0 (*found may be 0); -EIO gone; -ENOMEM (nothing mapped). */
int  pool_cli_prefix_attach(struct pool_cli *c, const struct pool_layout *lay, uint64_t ns,
                            const uint8_t *keys, size_t n, vmm_handle **out, size_t *found);
/* Drops the entries of keys[0..n) (keys NULL: every entry of ns under lay). The entries
   dropped (>= 0); -EIO gone. */
int  pool_cli_prefix_drop(struct pool_cli *c, const struct pool_layout *lay, uint64_t ns,
                          const uint8_t *keys, size_t n);
/* Pending shares (protocol.h "PENDING and READY"; docs/design.md "Sharing frames
   between clients", ordering). The engine's thread sends a share at its call under a
   serial of pool_cli_ready_serial, then hands its fence (recorded on the engine stream after the
   share's device work) to pool_cli_ready_after: the connection's ready thread waits for the
   fence, without any lock of this connection or the context, and then sends READY (ok:
   visible; the wait failed: dropped, logged) under the connection's mutex, as a request
   like any other. Lock order: the ready thread takes only c->mu, never the context lock. */
/* A serial for the next pending share (> 0, increasing). */
uint64_t pool_cli_ready_serial(struct pool_cli *c);
/* The fence f (taken: destroyed here) ends the shares sent under serial, which the caller
   sent before (serials queued in increasing order). Without a ready thread (it could not
   start, or no memory for the queue) the fence is waited for here and READY sent now. */
void pool_cli_ready_after(struct pool_cli *c, uint64_t serial, vmm_fence f);
/* Returns once every READY queued before it was answered by the daemon (the shares are
   visible to other clients then) or given up (the daemon gone: the shares went with it).
   No lock held. */
void pool_cli_ready_wait(struct pool_cli *c);
/* Waits as pool_cli_ready_wait, then stops and joins the ready thread (pool_cli_close). */
void pool_cli_ready_stop(struct pool_cli *c);
/* Gives back the stash and closes the connection (the context released its frames). */
void pool_cli_close(struct pool_cli *c);

#endif
