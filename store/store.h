/*
 * store/store.h: the shared store — a cache of KV blocks below the tiers, shared by processes
 * (and machines) through a directory or a Redis server. docs/api.md "Shared store" documents
 * the URL, the key layout and the value format for other tools; docs/design.md the layer.
 *
 * Contract:
 *  - One struct store = one URL: "file:///dir" (one file per entry in dir),
 *    "redis://[[user]:password@]host[:port][/db]" (one Redis connection; port 6379, db 0 by
 *    default) or "redis-cluster://[[user]:password@]host:port[,host:port...]" (seed nodes of
 *    a Redis Cluster: one connection per master, the slot map followed by itself, see
 *    cluster.c; a seed that is not a cluster node is -EINVAL). store_open refuses only a
 *    malformed URL (-EINVAL) and credentials the server refuses (-EACCES: AUTH refused, or
 *    the server demands a password none was given for).
 *    A server that is down, or a directory that is missing or not writable, at open is not an
 *    error: the store is down (logged once), every operation fails fast, and it comes back
 *    by itself (Redis: reconnection with exponential backoff, 50 ms doubling to 2 s, each try
 *    inside an operation's deadline; file: every operation tries the directory again).
 *  - It is a cache, never a dependency: every operation is bounded by timeout_ms (one
 *    deadline per batch: the whole pipelined round trip, a reconnection included, and the
 *    wait for the store's lock), never fails for an unavailable store with anything but a
 *    per-item status and a count. A timed-out Redis connection is dropped (the replies
 *    still owed on it are never matched with later requests). The file backend bounds its
 *    data I/O (io_uring) by the deadline, and a get's opens (on the ring, where it has a
 *    file table: Linux 5.19); a put's open, rename and unlink are plain system calls, as
 *    fast as the file system is.
 *  - The caller's buffers: once a call returns, the store never writes them, and never
 *    reads them for anything that becomes an entry, unless they were lent (store_get_lent,
 *    below): a read the file backend leaves in flight at the deadline cannot be stopped (a
 *    hung disk or mount ignores cancellation), so a get reads with O_DIRECT straight into
 *    the caller's buffers only where they are lent, and keeps them until the kernel is
 *    done with them; otherwise it reads through the store's own staging (one copy). A put
 *    left in flight may still read the caller's buffers (O_DIRECT from them), into a
 *    temporary file that is removed, never renamed: memory the caller freed or reused is
 *    read at worst, never written, and no entry ever holds those bytes.
 *  - Entries: a 32-byte content key (store_key, the same bytes as kvvm_key), under a layout
 *    (n_regions, bytes_per_token, page_size) and a namespace (uint64). Layout and namespace
 *    are part of the name (Redis key, file name): a reader of another layout or namespace
 *    never sees the entry. Every value is a 96-byte header (magic, version, layout, namespace,
 *    key, payload length, XXH3-64 checksum over the header's first 88 bytes and the payload)
 *    followed by the payload. A value whose header or checksum does not match what the reader
 *    asked for is a miss (-EBADMSG, counted in errors), never bytes handed out.
 *  - Batches: put, get, lookup and delete take n keys and make one round trip for all of them
 *    (Redis: pipelined SET/GET/EXISTS, one UNLINK; file: one io_uring submission). Each item
 *    gets its own status; the return value counts the items that succeeded.
 *  - Counters (store_stats_get): puts (entries written), gets (entries read back, checksum
 *    good), hits (entries a lookup found), errors (item requests that failed, timed out, or
 *    returned a value failing its checks — one per item), bytes_out / bytes_in (value bytes,
 *    header included, written / read).
 *  - Thread safety: every call may come from any thread; a store serializes its requests
 *    per lane (one lock each, taken with the operation's deadline: a call waiting behind a
 *    slow one fails with -ETIMEDOUT instead of waiting longer). Two lanes: puts and deletes
 *    go by the front's connection (ring), gets and lookups by a second one of the same URL
 *    (the read lane, opened with the front, connected at its first request), so a read never
 *    waits behind a write, however large the write. store_close must be the last call.
 *  - It knows nothing of sequences, pages or tiers; core/ decides what to store and when.
 */
#ifndef KVVM_STORE_STORE_H
#define KVVM_STORE_STORE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>
#include "common/hist.h"

struct store;

/* A content key: the same 32 bytes as the public kvvm_key. */
typedef struct store_key { uint8_t bytes[32]; } store_key;

/* What a value's bytes mean; part of every entry's name. */
struct store_layout {
    uint32_t n_regions;
    uint64_t bytes_per_token;
    uint64_t page_size;          /* bytes */
};

/* One entry of a batch. */
struct store_item {
    const store_key *key;
    const struct iovec *iov;     /* put: the payload; get: where it goes (the stored payload
                                    must have exactly this many bytes, else -EBADMSG) */
    int iovcnt;
    int status;                  /* out: 0 done / hit; -ENOENT miss (get); -EBADMSG a value
                                    failing its checks; -ETIMEDOUT past the deadline;
                                    -ENOTCONN the store is down (reconnection pending);
                                    -ENOSPC full (Redis maxmemory, file system); -EACCES /
                                    -EROFS refused; -EIO another failure */
};

#define STORE_TIMEOUT_DEFAULT_MS 1000u
#define STORE_F_TEST_NO_DIRECT (1u << 0) /* test hook: behave as if O_DIRECT were refused */

/* Parses url and opens the store; a down store is not an error (see the contract).
   timeout_ms 0 = STORE_TIMEOUT_DEFAULT_MS. -EINVAL url NULL or malformed, or a Redis
   database the server refuses to SELECT (logged with the reason); -EACCES credentials
   refused (logged); -ENOMEM. */
int  store_open(const char *url, uint32_t timeout_ms, unsigned flags, struct store **out);
/* Closes the connection / ring and frees everything; a file store first waits for the I/O
   of a batch that timed out (the kernel may still write its buffers: lent ones are given
   back, their done called). NULL is a no-op. */
void store_close(struct store *st);

/* Writes the n items (their payloads) under (L, ns, key): an existing entry is replaced
   (file: atomically, by rename). Returns the number written (0..n), each item's status set;
   -EINVAL st, L or items NULL (with n > 0), an item's key NULL or iovcnt < 0. */
int store_put(struct store *st, const struct store_layout *L, uint64_t ns,
              struct store_item *items, size_t n);
/* Reads the n items into their iovecs. Returns the number found (status 0), the others'
   status set (a miss is -ENOENT and not an error); an item that did not hit may have had its
   buffers written, before the call returned and never after. -EINVAL as store_put. */
int store_get(struct store *st, const struct store_layout *L, uint64_t ns,
              struct store_item *items, size_t n);

/* A get's buffers lent to the store (store_get_lent). The file backend then reads straight
   into the buffers that O_DIRECT takes (every iovec of an item 4 KiB aligned in address and
   length: no copy); when such a get returns at its deadline with reads into them still in
   flight, it sets kept, and the buffers of the whole batch stay the store's until it calls
   done(arg): the caller neither frees nor reuses them before. */
struct store_lend {
    void (*done)(void *arg);     /* called once, only for a get that set kept, when the last
                                    of its reads completed: from any thread (a later get on
                                    the same lane, with that lane's lock held, store_reap or
                                    store_close), maybe before that get returned; it must
                                    not call the store */
    void *arg;
    int kept;                    /* out: 1 the buffers are the store's until done(arg); 0
                                    the caller's at return (done is never called) */
};
/* store_get with the items' buffers lent (lend NULL: store_get). The store copies done and
   arg; *lend need not outlive the call. Errors as store_get, and -EINVAL lend->done NULL
   (kept 0 after any error). */
int store_get_lent(struct store *st, const struct store_layout *L, uint64_t ns,
                   struct store_item *items, size_t n, struct store_lend *lend);
/* A get in two halves, so that the caller works while the request is in flight (an
   attach maps its destination's pages meanwhile): store_get_start checks, takes the read
   lane's lock (with the request's deadline) and sends the request (the file store submits
   its opens and reads; a backend without a split does nothing yet), and returns at once;
   store_get_finish waits for it (until the same deadline), releases the lock and returns
   what store_get_lent would (items' statuses set, lend->kept as there). Every start is
   followed by exactly one finish on the same thread; in between the caller must not call
   this store (its lane is locked: other readers wait, at most until their deadline) and
   keeps L, items, their keys and iovecs, and lend valid. The buffers are written between
   the two calls (and after, only as store_get_lent says). */
struct store_getreq {            /* filled by store_get_start; the caller only passes it */
    struct store *lane;
    const struct store_layout *L;
    uint64_t ns;
    struct store_item *items;
    size_t n;
    struct store_lend *lend;
    uint64_t deadline;
    int rc;                      /* start's refusal (-EINVAL), returned by finish */
    int locked;                  /* the lane's lock is held */
    int split;                   /* the backend started it (get_start): be is its record */
    void *be;
};
void store_get_start(struct store *st, const struct store_layout *L, uint64_t ns,
                     struct store_item *items, size_t n, struct store_lend *lend,
                     struct store_getreq *rq);
int  store_get_finish(struct store_getreq *rq);
/* Between start and finish: waits (at most until the request's deadline, a timeout left to
   finish) for the first item's outcome. 1: it is a hit (its buffers written, checked); 0: a
   miss, a failure, or not known (a backend without a split, whose request runs at finish).
   So a caller does work meant for the request's hits (an attach's premap) only once it
   knows there is at least one. */
int  store_get_first(struct store_getreq *rq);
/* Waits until no read or write of a timed-out batch is in flight any more, on either lane
   (bounded only by the file system, as store_close), so that every lent buffer has been
   given back (its done called) when it returns. Nothing to wait for: returns at once (a
   Redis store always). NULL is a no-op. */
void store_reap(struct store *st);
/* Which of the n keys exist (present[i] = 1 or 0; NULL allowed). Returns how many, -EINVAL
   (st, L NULL, keys NULL with n > 0), or -ETIMEDOUT / -ENOTCONN / -EIO (the store could not
   answer: present[] all 0, counted). A present key may still miss at get (evicted, corrupt). */
int store_lookup(struct store *st, const struct store_layout *L, uint64_t ns,
                 const store_key *keys, size_t n, uint8_t *present);
/* Removes the n entries; returns how many existed, or -EINVAL / a store error as lookup. */
int store_delete(struct store *st, const struct store_layout *L, uint64_t ns,
                 const store_key *keys, size_t n);
/* Removes every entry of namespace ns under layout L (L NULL: under every layout). Returns
   how many, or -EINVAL (st NULL) / a store error as lookup (-ETIMEDOUT: the entries removed
   so far stay removed). Redis: SCAN + UNLINK rounds, all within one deadline. */
int store_delete_ns(struct store *st, const struct store_layout *L, uint64_t ns);

struct store_stats {
    uint64_t puts, gets, hits, errors, bytes_out, bytes_in;
};
void store_stats_get(struct store *st, struct store_stats *out);
/* The requests of each kind by duration, from the request's start (its deadline's clock
   read) to its end, the wait for the store's lock included (common/hist.h; kvvm_metrics).
   A request is one call of store_put / get / lookup / delete or delete_ns (one batch).
   st NULL: all zero. */
enum store_op { STORE_OP_PUT, STORE_OP_GET, STORE_OP_LOOKUP, STORE_OP_DELETE, STORE_OP_N };
void store_hist_get(struct store *st, enum store_op op, struct khist *out);

const char *store_kind(const struct store *st);   /* "file", "redis" or "redis-cluster" */
/* file: 1 when entries are written and read with O_DIRECT, 0 through the page cache (the
   directory refused O_DIRECT, or not probed yet); Redis: 0. */
int store_direct(const struct store *st);
/* The URL with its password replaced by "***" (for logs and the JSON). Writes at most len
   bytes, always terminated; returns buf. */
char *store_url_redact(const char *url, char *buf, size_t len);

/* Test hook (file backend): on (STORE_HANG_ALL), every data I/O waits on a pipe instead of
   the file system (a hung file system); STORE_HANG_WRITES, only the writes' lane's (puts;
   gets and lookups go on: the read lane); STORE_HANG_TAIL, see above; off (0), the I/Os
   waiting complete (4096 of them at most per lane). -EINVAL not a file store or another
   value, or the errno of pipe2 / write. */
#define STORE_HANG_ALL 1
#define STORE_HANG_WRITES 2
#define STORE_HANG_TAIL 3        /* the read lane's I/O but a batch's first item's (a get's
                                    first entry is read for real, the rest hang); writes go on */
int store_test_hang(struct store *st, int on);

/* --- the key layout (docs/api.md "Key layout"), for tests and tools ------------------- */
#define STORE_HDR_BYTES 96
#define STORE_NAME_MAX 160
/* The Redis key of an entry: kvvm1:{<n_regions>:<bytes_per_token>:<page_size>:<ns, 16 hex
   digits>}:<key, 64 hex digits>. Returns its length. */
size_t store_redis_key(const struct store_layout *L, uint64_t ns, const store_key *k,
                       char out[STORE_NAME_MAX]);
/* The Redis Cluster key of an entry (no hash tag: the whole name is hashed, so entries
   spread over every master): kvvm1:<n_regions>:<bytes_per_token>:<page_size>:<ns, 16 hex
   digits>:<key, 64 hex digits>. Returns its length. */
size_t store_cluster_key(const struct store_layout *L, uint64_t ns, const store_key *k,
                         char out[STORE_NAME_MAX]);
/* The cluster slot of a key name (CRC16 of it, or of its hash tag, mod 16384). */
unsigned store_cluster_slot(const char *key, size_t n);
/* The file name of an entry: kvvm1_<n_regions>_<bytes_per_token>_<page_size>_<ns hex>_<key
   hex>. Returns its length. */
size_t store_file_name(const struct store_layout *L, uint64_t ns, const store_key *k,
                       char out[STORE_NAME_MAX]);

#endif
