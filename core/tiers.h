/*
 * core/tiers.h: the tiers below the device as one list (core/tiers.c).
 *
 * A tier is a folder of its own (host/, disk/, store/ ...) plus one entry, a struct
 * core_tier: it opens and closes its layer for a context and answers what core asks of
 * every tier: its stats (kvvm_stats), its policy row, the text of its absence. core/stats.c,
 * debug.c, errors.c and open.c iterate the context's tiers (kv->tier[]) and name none.
 *
 * Two kinds of entry. A PAGES tier is a paging level below the device: it holds a
 * sequence's pages, gives paging its struct pg_tier_ops (paging.h, "the tiers below the
 * device": room, alloc/free, ptr or put/get/reap/wait), and says how many pages it can hold
 * and the count the invariant check compares with paging's. An ENTRIES tier is the prefix
 * cache's shared store: a cache of whole published blocks named (namespace, key), shared
 * between processes, never a sequence's pages; paging never sees it. Its operations
 * (struct core_entry_ops: put a batch, a get in two halves, lookup, delete, reap, the
 * requests' histograms) are called by core/storeq.c, the store queue, which is its
 * completion mechanism (staging, fences, the store thread: core.h "storeq.c").
 *
 * Levels: the list is in level order (PG_LOWER_*: the first tier below the device, then the
 * one below it; then CORE_LEVEL_STORE, the prefix cache's fourth tier); a level is taken by
 * the first of its entries that opens on. Built-in entries: the host tier (level 0), the
 * disk tier (level 1), the shared store of store_url (CORE_LEVEL_STORE, core/tier_store.c:
 * the only core file that includes store/store.h; tests/tool_headers.sh checks it).
 * core_tiers_add puts another entry in front of them (the tests' in-memory tier,
 * tests/tier_mem.c, and in-memory store, tests/store_mem.c).
 *
 * The tiers' calls are not on the hot path: open, close, stats and checks only; paging calls
 * the page tiers' ops of the moves themselves, storeq.c the store's.
 */
#ifndef KVVM_CORE_TIERS_H
#define KVVM_CORE_TIERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>
#include "kvvm.h"
#include "common/hist.h"
#include "paging/paging.h"

/* The kinds of tier (above). */
enum core_tier_kind {
    CORE_TIER_PAGES,             /* a paging level: a sequence's pages (struct pg_tier_ops) */
    CORE_TIER_ENTRIES,           /* the prefix cache's store: blocks named (ns, key) */
};
/* The levels: PG_N_LOWER page tiers, then the store. */
#define CORE_LEVEL_STORE PG_N_LOWER
#define CORE_N_LEVELS (PG_N_LOWER + 1)
/* kvvm_config.store_timeout_ms's default (store/'s own; checked equal in
   core/tier_store.c). */
#define CORE_STORE_TIMEOUT_DEFAULT_MS 1000u

/* What core reads of a tier. A page tier's: its slots (total, free: kvvm_stats'
   pages_host_* for level 0, pages_disk_* for level 1; in use = total - free, which the
   invariant check compares with the pages paging counts on the tier) and its failed
   transfers (summed over the tiers into checksum_failures and io_errors). An entries
   tier's (summed into kvvm_stats' store_*): the entry's own request counters (puts ..
   bytes_in: store/'s counters), and its queue's (core/storeq.c adds them:
   errors += entries given up, the blocks lookups found, the writes the bound dropped, the
   bytes queued and the attach staging's). Zeros where a kind has no such figure. */
struct core_tier_stats {
    uint64_t total, free;
    uint64_t checksum_failures, io_errors;
    uint64_t puts, gets, hits, errors, bytes_out, bytes_in;
    uint64_t hit_blocks, dropped, queue_bytes, staging_bytes;
};

/* A tier's policy row. A page tier's: the free fractions of its slots the background
   threads keep (min <= low <= high: below low the tier's pages move down to the tier below
   until high is free; all 0: the tier keeps none, e.g. the last one). An entries tier's:
   the bytes its queued writes may hold (store_queue_bytes: the staging and the copy run;
   0, nothing written) and each request's bound (store_timeout_ms). */
struct core_tier_policy {
    double min, low, high;
    uint64_t queue_bytes;
    uint32_t timeout_ms;
};

/* ---- an entries tier's operations (the store: store/store.h's contract, per item) ---- */

/* One entry of a batch (store/'s item: the same layout, checked in core/tier_store.c). */
struct core_entry_item {
    const kvvm_key *key;
    const struct iovec *iov;     /* put: the payload; get: where it goes (exactly this many
                                    bytes stored, else -EBADMSG) */
    int iovcnt;
    int status;                  /* out: 0 done / hit; -ENOENT miss; -EBADMSG a value failing
                                    its checks; -ETIMEDOUT; -ENOTCONN down; -ENOSPC; -EIO */
};
/* A get's buffers lent to the tier (store/'s lend: the same layout):
   kept 1, they stay the tier's until done(arg) is called, from any thread. */
struct core_entry_lend {
    void (*done)(void *arg);
    void *arg;
    int kept;
};
/* A get in flight between get_start and get_finish: the tier's own record, kept by the
   caller (not moved) until the finish. */
struct core_entry_get {
    union { max_align_t align; unsigned char b[160]; } be;
};
/* The requests whose durations an entries tier records (kvvm_metrics' op label). */
enum core_entry_op { CORE_ENTRY_PUT, CORE_ENTRY_GET, CORE_ENTRY_LOOKUP, CORE_ENTRY_DELETE,
                     CORE_ENTRY_N };
struct core_entry_ops {
    /* Writes the n items under (its layout, ns, key); the number written, statuses set. */
    int  (*put)(void *layer, uint64_t ns, struct core_entry_item *items, size_t n);
    /* A get of the n items into their iovecs, in two halves (store_get_start /
       store_get_finish): start sends it (lend NULL: not lent), finish waits for it and
       returns the hits, statuses and lend->kept set; first, between them: 1 the first item
       is a hit, else 0. Every start has exactly one finish, on the same thread. */
    void (*get_start)(void *layer, uint64_t ns, struct core_entry_item *items, size_t n,
                      struct core_entry_lend *lend, struct core_entry_get *g);
    int  (*get_first)(struct core_entry_get *g);
    int  (*get_finish)(struct core_entry_get *g);
    /* Which of the n keys it holds (present[i] 1 or 0); how many, or -errno (all 0). */
    int  (*lookup)(void *layer, uint64_t ns, const kvvm_key *keys, size_t n,
                   uint8_t *present);
    /* Removes the n entries (keys NULL: every entry of ns under its layout). */
    int  (*del)(void *layer, uint64_t ns, const kvvm_key *keys, size_t n);
    /* Waits until every lent buffer was given back (its done called). */
    void (*reap)(void *layer);
    /* Optional (NULL: empty): the requests of kind op by duration. */
    void (*hist)(void *layer, enum core_entry_op op, struct khist *out);
    /* Optional (NULL: as given): a URL of its configuration with its secrets hidden (the
       JSON's config); returns buf. */
    char *(*redact)(const char *url, char *buf, size_t len);
};

struct core_tier {
    const char *name;            /* "host", "disk", "store": messages say "the <name> tier" */
    enum core_tier_kind kind;
    unsigned level;              /* a page tier: the PG_LOWER_* place it takes, < PG_N_LOWER;
                                    an entries tier: CORE_LEVEL_STORE */
    /* Opens the tier's layer for kv (a page tier: the tiers above it are open,
       kv->tier[0..level)). *layer: what the other functions get (NULL: nothing opened, the
       tier is off); *ops: a page tier's, paging's view when the tier is on (left zero, alloc
       NULL: off, e.g. its budget unset); an entries tier leaves it zero. 0, or -errno with
       the cause logged or in kvvm_last_error (nothing open). */
    int  (*open)(kvvm *kv, void **layer, struct pg_tier_ops *ops);
    void (*close)(void *layer);
    /* A page tier's (NULL for an entries tier): the pages it can hold (page descriptors are
       made for them); only when on. */
    uint64_t (*slots)(kvvm *kv, void *layer);
    void (*stats)(void *layer, struct core_tier_stats *out);
    /* Optional (NULL: none): its I/O engine's name and whether the I/O bypasses the page
       cache (kvvm_stats_json's io_engine and spill_direct). */
    const char *(*engine)(void *layer, bool *direct);
    /* The text of its absence (json_put at *pos of b): "; no <name> tier (<why it is off>)";
       a -ENOMEM message says it of a page tier. */
    void (*off)(kvvm *kv, char *b, size_t n, size_t *pos);
    /* Optional (NULL: a row of zeros): its policy row from kv's configuration. */
    void (*policy)(kvvm *kv, struct core_tier_policy *out);
    /* Optional, a memory tier (ptr set): the memory its slots are in (the tier below's
       I/O buffers: the disk tier registers them for O_DIRECT / fixed buffers). */
    void (*span)(void *layer, void **base, size_t *bytes);
    /* An entries tier's operations (NULL for a page tier). */
    const struct core_entry_ops *ent;
};

/* A context's tier at one level: the entry that opened (NULL: none did) and its layer. */
struct core_tier_at {
    const struct core_tier *e;
    void *layer;
};

struct kvvm;
/* Puts e in the list in front of the built-in entries (tried first at its level). The
   testing interface's way to add a tier (tests/tier_mem.c, tests/store_mem.c); before any
   kvvm_open of the process, not thread safe. -EINVAL (a kind and level that do not go
   together, a function its kind needs missing: the reason in kvvm_last_error), -ENOSPC
   (the list is full). */
int  core_tiers_add(const struct core_tier *e);
/* kvvm_open: the levels of tiers of one kind (all or nothing; the error explained),
   kv->tier[] and kv->tier_ops; close: every one of that kind opened, in reverse. open.c
   opens the entries tier before the device (a malformed store_url fails first) and closes
   it last; the page tiers inside the layout. */
int  core_tiers_open(struct kvvm *kv, enum core_tier_kind kind);
void core_tiers_close(struct kvvm *kv, enum core_tier_kind kind);
/* The pages the tiers that are on can hold together (page descriptors beyond the
   device's). */
uint64_t core_tiers_slots(struct kvvm *kv);
/* paging's pointers to the tiers that are on. */
void core_tiers_params(struct kvvm *kv, struct paging_params *pp);
/* Whether level t's tier is on; its kind; its stats (zeros when none opened; an entries
   tier's with its queue's: storeq_stats_add); its invariants (an entries tier: its queue's,
   storeq_check; 0 or -EUCLEAN, why written). */
bool core_tier_on(struct kvvm *kv, unsigned t);
enum core_tier_kind core_tier_kind(unsigned t);
void core_tier_stats(struct kvvm *kv, unsigned t, struct core_tier_stats *out);
int  core_tier_check(struct kvvm *kv, unsigned t, char *why, size_t len);
/* The entries tier that is on (NULL: none; *layer its layer). */
const struct core_tier *core_tiers_entries(struct kvvm *kv, void **layer);
/* Blocks of paging's copy run the entries tiers' queues need (open, before the reservation:
   storeq_stage_slots of their policy rows' queue_bytes). */
uint32_t core_tiers_copy_blocks(struct kvvm *kv);
/* The entries tier's histogram of op (empty without one), for kvvm_metrics. */
void core_tiers_hist(struct kvvm *kv, enum core_entry_op op, struct khist *out);
/* url with its secrets hidden by the first entry that knows how (config.c's JSON). */
char *core_tiers_url_redact(const char *url, char *buf, size_t len);
/* The tiers' part of swap/'s parameters: the reclaim thread (a first tier to swap out
   to), its size and policy row (host_slots, host_min/low/high), the spill thread (a second
   tier to move its pages down to: disk). */
struct swap_params;
void core_tiers_swap_params(struct kvvm *kv, struct swap_params *p);
/* The first tier's I/O engine that has one ("none"), for kvvm_stats_json. */
const char *core_tiers_engine(struct kvvm *kv, bool *direct);
/* The entry level t tries first (NULL: none), for what an absent tier's messages say. */
const struct core_tier *core_tiers_first(unsigned t);
/* The built-in entries tier: the shared store of store_url (core/tier_store.c). */
extern const struct core_tier core_tier_store;
/* The disk tier's layer (NULL: the disk tier is not open), for the testing interface. */
struct disk *core_tiers_disk(struct kvvm *kv);

#endif
