/*
 * store/store_int.h: what the store layer's own files share (the layer's contract is store.h).
 *
 * Contract:
 *  - Included only by the files of store/. store.c parses the URL, checks arguments, takes
 *    the lock with the deadline, calls the backend, counts; it also owns the key names and
 *    the value header (format and checksum). file.c, redis.c and cluster.c are the backends
 *    behind struct store_ops (cluster.c over redis.c's connections); hiredis.h is included
 *    by redis.c and cluster.c alone, liburing.h (for this layer) by file.c alone.
 *  - A backend call runs with st->lock held and gets an absolute deadline (know_ns clock):
 *    it returns by then, sets every item's status (put/get) and adds to the byte counters;
 *    store.c counts puts, gets, hits and errors from the statuses. A get leaves the kernel
 *    writing into the caller's buffers after it returns only where they were lent (and
 *    then sets kept: store.h "The caller's buffers"); Redis and the cluster never do.
 */
#ifndef KVVM_STORE_STORE_INT_H
#define KVVM_STORE_STORE_INT_H

#include <pthread.h>
#include "store.h"

struct store_ops {
    const char *kind;
    int  (*put)(struct store *st, const struct store_layout *L, uint64_t ns,
                struct store_item *items, size_t n, uint64_t deadline);
    /* lend: the items' buffers lent (store_get_lent; kept 0 on entry), or NULL */
    int  (*get)(struct store *st, const struct store_layout *L, uint64_t ns,
                struct store_item *items, size_t n, struct store_lend *lend,
                uint64_t deadline);
    /* count present, or -errno (the whole request failed) */
    int  (*lookup)(struct store *st, const struct store_layout *L, uint64_t ns,
                   const store_key *keys, size_t n, uint8_t *present, uint64_t deadline);
    int  (*del)(struct store *st, const struct store_layout *L, uint64_t ns,
                const store_key *keys, size_t n, uint64_t deadline);
    int  (*del_ns)(struct store *st, const struct store_layout *L, uint64_t ns,
                   uint64_t deadline);
    void (*close)(struct store *st);
    /* store_reap on this lane (its lock held), or NULL: nothing is ever left in flight */
    void (*reap)(struct store *st);
    /* A get in two halves (store_get_start / finish; the lock held from one to the other),
       or NULL: finish runs get. get_start sends the request and sets *be to its record, or
       to NULL when nothing is in flight (every item's status set already); get_finish
       (be not NULL) waits for it until the deadline given to get_start, as get would,
       and frees be. */
    void (*get_start)(struct store *st, const struct store_layout *L, uint64_t ns,
                      struct store_item *items, size_t n, struct store_lend *lend,
                      uint64_t deadline, void **be);
    void (*get_finish)(struct store *st, void *be);
    /* store_get_first on be (not NULL): 1 the first item is a hit, 0 not (or not known at
       the deadline: finish times the request out) */
    int  (*get_first)(struct store *st, void *be);
};

struct store {
    const struct store_ops *ops;
    void *be;                    /* the backend's state */
    uint64_t timeout_ns;         /* per request (batch); fixed after open */
    unsigned flags;              /* STORE_F_*; fixed after open */
    pthread_mutex_t lock;        /* serializes requests: guards be */
    struct store *reads;         /* the read lane: the same URL opened again (its own
                                    connection, ring and lock), which get and lookup use, so
                                    that a read never waits behind a write; NULL on the lane
                                    itself */
    /* counters (atomic; STORE_ADD) */
    uint64_t st_puts, st_gets, st_hits, st_errors, st_bytes_out, st_bytes_in;
    struct khist st_hist[STORE_OP_N];   /* requests by duration (khist_add: atomic) */
};

/* Internal open flag: the read lane (store.c opens it after the front): a network backend
   connects at its first request, not at open (the front checked the credentials). */
#define STORE_F_LANE (1u << 31)

#define STORE_ADD(st, f, n) __atomic_fetch_add(&(st)->f, (n), __ATOMIC_RELAXED)

/* --- store.c: values ------------------------------------------------------------------ */
size_t store_iov_len(const struct iovec *iov, int n);
/* Copies len bytes from src into the iovecs (in order). */
void   store_iov_scatter(const struct iovec *iov, int n, const void *src, size_t len);
/* Fills the 96-byte header of a value holding the payload iov[0..n). */
void   store_hdr_make(uint8_t hdr[STORE_HDR_BYTES], const struct store_layout *L, uint64_t ns,
                      const store_key *k, const struct iovec *iov, int n);
/* 0 when the value at v (vlen bytes; a file's may be longer: padding) is an entry of (L,
   ns, k) with a payload of exactly want bytes and a good checksum; else -EBADMSG. */
int    store_value_check(const uint8_t *v, size_t vlen, const struct store_layout *L,
                         uint64_t ns, const store_key *k, size_t want);
/* The same for a header at hdr whose payload is iov[0..n) (read apart from it). */
int    store_value_check_iov(const uint8_t *hdr, const struct store_layout *L, uint64_t ns,
                             const store_key *k, const struct iovec *iov, int n);
/* Nanoseconds left until deadline (0 when past). */
uint64_t store_left_ns(uint64_t deadline);

/* --- file.c / redis.c: open (with st->timeout_ns and st->flags set) ----------------------- */
/* path: the absolute directory. 0 or -ENOMEM (a missing directory is a down store). */
int store_file_open(struct store *st, const char *path);
struct store_redis_url {
    char *host, *user, *pass;    /* user, pass NULL when none */
    int port, db;
};
/* 0, -EACCES (credentials refused), -ENOMEM; takes nothing from u (copies). */
int store_redis_open(struct store *st, const struct store_redis_url *u);
/* --- redis.c: one connection to one Redis server, for redis.c's backend and cluster.c's
   (one per master). A connection is made at the first request (or store_rconn_open), kept,
   dropped on any failure of its own (never reused with replies owed) and made again after
   the backoff; every call is bounded by deadline. */
struct rstore;
struct redisReply;
typedef size_t (*store_key_fn)(const struct store_layout *L, uint64_t ns, const store_key *k,
                               char out[STORE_NAME_MAX]);
/* Statuses of a cluster's redirections (an item's, a key's): internal to store/, never
   handed to store.c (the backends map them to a status of store.h). */
#define STORE_MOVED (-10001)     /* MOVED: the slot is another master's (map stale) */
#define STORE_ASK   (-10002)     /* ASK: this key is on the slot's importing node now */
/* A connection to u (copied) naming entries with key; not connected yet. 0, -ENOMEM. */
int  store_rconn_new(const struct store_redis_url *u, store_key_fn key, struct rstore **out);
void store_rconn_free(struct rstore *r);
/* Connects now (AUTH, SELECT, PING). 0, -EACCES, -EINVAL (refused), or the connection's
   failure (then down: logged, the backoff started). */
int  store_rconn_open(struct rstore *r, uint64_t deadline);
/* The backends' batches on r (contracts as store_ops put / get): items' statuses may be
   STORE_MOVED / STORE_ASK. */
int  store_rconn_put(struct store *st, struct rstore *r, const struct store_layout *L,
                     uint64_t ns, struct store_item *items, size_t n, uint64_t deadline);
int  store_rconn_get(struct store *st, struct rstore *r, const struct store_layout *L,
                     uint64_t ns, struct store_item *items, size_t n, uint64_t deadline);
/* One verb (EXISTS, UNLINK) per key, pipelined: present[i] 1 when the reply was an integer
   > 0. Returns the count, or -errno (the connection failed); an error reply is kst[i]
   (kst NULL: the first one is returned instead of the count). */
int  store_rconn_keys(struct store *st, struct rstore *r, const char *verb,
                      const struct store_layout *L, uint64_t ns, const store_key *keys,
                      size_t n, uint8_t *present, int *kst, uint64_t deadline);
/* SCAN MATCH pat rounds, each round's keys UNLINKed (each: one command per key). The count
   removed, or -errno. */
int  store_rconn_del_ns(struct rstore *r, const char *pat, int each, uint64_t deadline);
/* One command of short arguments; its reply in *out (freeReplyObject). 0 or -errno. */
int  store_rconn_call(struct rstore *r, const char *const *argv, int argc, uint64_t deadline,
                      struct redisReply **out);
/* ASKING before each command of the batches that follow (on) or not; returns the former. */
int  store_rconn_set_asking(struct rstore *r, int on);
/* The target ("host:port") of the last MOVED / ASK reply read on r, or "". */
const char *store_rconn_redir(const struct rstore *r);

/* redis-cluster://: u is the first seed (its user and password serve every node); seeds
   the "host:port,..." list (all of them, the first included). 0, -EACCES, -EINVAL, -ENOMEM. */
int store_cluster_open(struct store *st, const struct store_redis_url *u, const char *seeds);

/* store_test_hang on one lane (file backend; -EINVAL for another): on 0 off, 1 every I/O,
   2 every I/O but each batch's first item's. */
int store_file_test_hang(struct store *st, int on);

#endif
