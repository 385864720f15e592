/*
 * core/core.h: the context (struct kvvm) behind include/kvvm.h.
 *
 * Contract: core owns the configuration (defaults, KVVM_* environment, validation), the
 * context lock, the layout (one reservation: n_regions regions of max_seqs slots, then one
 * scratch page), stats and the public calls. Every public call takes kv->lock and calls the
 * layers below (paging/, vmm/) with it held; those layers never call up.
 *
 * Lock order (outermost first): kvvm.lock -> swap's mutex (swap/swap.c, sw->mu) or the
 * frame pool thread's (swap/frame_pool.c, fr->mu) -> the pool's feed mutex (paging pg->feed.mu)
 * -> host arena mutex or the pool client's mutex (pool/client.c) -> (vmm / driver internal
 * locks) -> log lock. The frame pool thread
 * makes its driver calls without kvvm.lock. The pool client's connection thread (a take-back,
 * core/pool_client.c core_pool_give) takes kvvm.lock and never holds the client's mutex while it
 * does; its ready thread (pool/client_ready.c) takes only the client's mutex, and kvvm_sync
 * waits for it (core_pool_settle) with kvvm.lock NOT held. The background reclaim thread
 * (swap/) takes kvvm.lock for each round of decisions and never holds sw->mu while taking
 * it; kvvm_sync and kvvm_close wait for the thread (swap_wait_idle / swap_destroy) with
 * kvvm.lock NOT held. No library lock is held while calling the user's log callback other
 * than the log lock. The store's locks (store/store.h: one per lane) come BEFORE kvvm.lock:
 * an attach holds the read lane's, its first request in flight (store_get_start to
 * store_get_finish), while it takes kvvm.lock to premap dst's pages (prefix_calls.c); so no
 * store request is ever made with kvvm.lock held (core/ makes each one without it;
 * kvvm_close's store_reap runs after the last call).
 *
 * Pressure (docs/api.md "Scheduling"): a call that may move other sequences (grow,
 * grow_batch, write, read, prepare_write, share, swap-in, prefetch, set_budget) checks its
 * arguments and staleness first, counts the device frames it needs with paging's need
 * functions (swap-ins, new pages, copy-on-write copies, shared partial last pages), then
 * asks swap/ for room (swap_make_room, swap_reclaim_budget: a plan checked whole before
 * anything moves; -ENOMEM and nothing moved when it cannot be had), and only then swaps in
 * (a non-resident sequence named by grow / write / read / prepare_write) and acts; a
 * sequence swapped in is swapped out again if the call then fails. core/ chooses no
 * victims.
 */
#ifndef KVVM_CORE_CORE_H
#define KVVM_CORE_CORE_H

#include <pthread.h>
#include <stdbool.h>
#include <sys/types.h>
#include "kvvm.h"
#include "common/hist.h"
#include "vmm/vmm.h"
#include "paging/paging.h"
#include "swap/swap.h"
#include "swap/frame_pool.h"
#include "core/tiers.h"
#include "prefix/prefix.h"

#define POOL_TIMEOUT_DEFAULT_MS 1000u                 /* kvvm_config.pool_timeout_ms */
#define STORE_QUEUE_DEFAULT_BYTES ((size_t)64 << 20)  /* kvvm_config.store_queue_bytes */

struct store;                     /* store/'s; only core/tier_store.c includes its header */

struct kvvm {
    pthread_mutex_t lock;         /* protects everything below and the layers' state */
    struct kvvm_config cfg;       /* effective configuration (page_size resolved) */
    char *spill_dir;              /* owned copy of cfg.spill_dir */
    struct vmm *v;
    struct paging *pg;
    struct swap *sw;
    struct prefix *pfx;           /* the prefix cache's index (prefix/) */
    struct frames *fr;            /* the frame pool thread (NULL with pool_thread = 0) */
    struct core_tier_at tier[CORE_N_LEVELS]; /* the tiers below the device (core/tiers.h:
                                     the entry that opened each level and its layer; the
                                     last level, CORE_LEVEL_STORE, the prefix cache's store) */
    struct pg_tier_ops tier_ops[PG_N_LOWER]; /* paging's view of the page tiers (alloc NULL:
                                     off) */
    struct store *store;          /* the built-in store tier's store/ handle while it is open
                                     (NULL otherwise): set and cleared by core/tier_store.c
                                     alone, for the tests' hooks (store_test_hang); core
                                     reaches the store through the list's entry */
    char *store_url;              /* owned copy of cfg.store_url */
    char *client_name;            /* owned copy of cfg.client_name */
    char *pool_socket;            /* owned copy of cfg.pool_socket */
    struct pool_cli *pool;        /* kvvmd connection (core/pool_client.c; NULL: local frames) */
    struct pg_frame_src pool_src; /* paging's frame source over it */
    struct pg_frame_src local_src;/* paging's frame source without a pool: this process's
                                     own frames (core/frame_src.c) */
    uint64_t n_exports, n_imports; /* hand-offs (core/handoff_calls.c), under the lock */
    uint64_t pool_hit_blocks;     /* blocks attached from the daemon's shared index
                                     (core/prefix_pool.c), under the lock */
    struct storeq *sq;            /* the prefix cache's store queue and thread (storeq.c;
                                     NULL without an entries tier on) */
    uint64_t base;                /* reservation base */
    uint64_t slot_bytes;
    bool dead;                    /* sticky: every call returns -EIO */
    const int *vdead;             /* vmm_dead_word(v): read by the hot path (call.h hot_enter)
                                     without a call; immutable after open */
    pid_t pid;                    /* the process that opened it (for messages); immutable */
    unsigned fork_gen;            /* kvvm__fork_gen at open: a fork() child sees another
                                     value, and every call there is -EIO (its threads, locks
                                     and device context stayed in the parent); immutable */
    kcu_stream *streams;          /* made by kvvm_stream_create and not destroyed yet: */
    size_t n_streams, cap_streams;/*   kvvm_close destroys them (it leaves nothing) */
    uint64_t attach_swap_ins;     /* kvvm_prefix_attach's swap-ins of store blocks alone (an
                                     attach with local blocks counts paging's one) */
    uint64_t attach_bytes_in;     /* bytes those attaches copied from the store onto the
                                     device (stats swap_ins and bytes_to_device add them) */
    uint64_t store_unused;        /* store values an attach read and did not attach */
    struct khist attach_hist;     /* kvvm_prefix_attach calls past their argument checks, by
                                     duration (khist_add: atomic, recorded without the lock) */
};

/* Counts the fork()s this process came out of as a child (pthread_atfork, registered at
   the first kvvm_open): a context whose fork_gen differs was opened by an ancestor. Read
   on every public call instead of a getpid() system call. (The kvvm__ prefix: internal,
   yet not a bare name in the static library's symbol table.) */
extern unsigned kvvm__fork_gen;

/* debug.c (the debug build only): runs the invariant checker (core/debug.h) at the end of
   public call `call`, lock held; a violation is logged and aborts (KVVM_ASSERT). */
#ifdef KVVM_DEBUG
void core_debug_after_call(kvvm *kv, const char *call);
#endif

/* errors.c */
/* The errno's name, for messages ("-ENOENT"; "error" for one it does not know). */
const char *core_err_name(int err);
/* open.c: 0 when a device budget of b bytes fits in the frames the context holds plus the
   device's free memory; -ENOMEM (the reason in kvvm_last_error), -EIO. */
int core_budget_fits(kvvm *kv, size_t b);
/* The reason of public call `call`'s failure rc when no layer gave one (lock held): the
   numbers behind -ENOENT (the handle), -E2BIG (the length and max_tokens) and -ENOMEM
   (pages needed and free per tier, or the tier that is missing), from paging_why. Kept as
   the last error, not logged: a scheduler meets these under load, and its caller decides.
   Returns rc. */
int core_explain(kvvm *kv, const char *call, int rc);
/* The same numbers as text into b (an -ENOMEM's tiers; else kvvm_strerror's text), for the
   message of a call that goes on past a refusal (an attach leaving the store's blocks). */
void core_explain_text(kvvm *kv, int rc, char *b, size_t n);

/* metrics.c: docs/api.md's metrics table (markdown, one row per series) from the table
   that kvvm_metrics writes; json_put's rule (what fits of len); returns the length.
   tests/metrics_doc.c compares it with docs/api.md. */
size_t core_metrics_doc(char *buf, size_t len);

/* kvvm.c: room for a call that needs `need` device frames naming the sequences excl (its
   pending releases first, then swap/'s plan). 0, -ENOMEM (nothing moved), -EIO. */
int core_make_room(kvvm *kv, uint64_t need, const uint64_t *excl, size_t n_excl);
/* storeq.c: the prefix cache over the shared store (docs/design.md "The shared store").
   Every function takes NULL for q (no store) as "nothing to do". The store is a cache:
   none of these fails a caller's call; a store failure is a miss or an entry not written,
   counted. */
/* core/prefix_pool.c: the prefix cache with the daemon's shared index (each a no-op
   without a pool; the daemon never makes a call fail). Locked: publish enters s's blocks
   [0, n) (after the local publish); attach, when the daemon has more leading blocks than
   the local k, maps them into empty dst and returns their count (0: the local attach goes
   on, dst empty). Without the lock: lookup returns the leading keys present, at least k
   (where[k..] = KVVM_TIER_POOL for the daemon's past k); drop (keys NULL: ns under this
   layout). */
void   core_pool_publish(kvvm *kv, kvvm_seq s, uint64_t ns, const kvvm_key *keys, size_t n);
size_t core_pool_lookup(kvvm *kv, uint64_t ns, const kvvm_key *keys, size_t n, size_t k,
                        uint8_t *where);
int    core_pool_attach(kvvm *kv, kvvm_seq dst, uint64_t ns, const kvvm_key *keys, size_t n,
                        size_t k);
void   core_pool_prefix_drop(kvvm *kv, uint64_t ns, const kvvm_key *keys, size_t n);
/* core/pool_client.c: the context as a client of the pool daemon (cfg.pool_socket). */
struct pool_cli;
struct pool_cli_counters;
/* Before the vmm: connects to kvvmd and fits cfg to its pool (backend, emulated device,
   page size, device_budget = the client's limit). 0 without pool_socket; -ECONNREFUSED,
   -EINVAL, -ENOSPC, -EPROTO, -ENOMEM (logged naming the cause). */
int  core_pool_open(kvvm *kv);
/* After the vmm: the pool's frame source (NULL without a pool); core_frame_source's pick. */
const struct pg_frame_src *core_pool_source(kvvm *kv);
/* frame_src.c: after the vmm and the layout, the frame source paging gets (never NULL): the
   pool's with a pool, else this process's own frames (vmm_phys_create / release). */
const struct pg_frame_src *core_frame_source(kvvm *kv);
/* kvvm_set_budget with a pool: b must fit the pool (-EINVAL naming it, before anything
   moves: core_pool_budget_check); the daemon is told the new limit after the change. */
int  core_pool_budget_check(kvvm *kv, size_t b);
void core_pool_set_limit(kvvm *kv, size_t b);
/* kvvm_trim: the frames leased and not handed to paging yet go back to the daemon; how
   many (0 without a pool). */
uint32_t core_pool_trim(kvvm *kv);
/* Frames paging's budget counts that the daemon's limit for this client (its last reply's
   figures: kvvmctl limit may set it below device_budget) does not grant: a call's room
   must be made for its need plus these, so it drops its own CACHED sequences as a local
   context does at its budget (0 without a pool, the daemon gone, or the limit not below). */
uint32_t core_pool_over_limit(kvvm *kv);
/* After open: the connection thread serving the daemon's asks for frames back (0 without a
   pool; -errno: no thread). Before close tears anything down: stops it (no lock held). */
int  core_pool_listen(kvvm *kv);
void core_pool_unlisten(kvvm *kv);
/* Returns once the pending shares of the calls before it (stream mode publishes and
   exports) are visible to other clients, or dropped (pool/client.h "Pending shares"). No
   lock held: kvvm_sync, before its own synchronization. */
void core_pool_settle(kvvm *kv);
/* After paging released its frames: the stash back, the connection closed. */
void core_pool_close(kvvm *kv);
/* A call that may release many frames at once (kvvm_seq_free, kvvm_seq_truncate,
   kvvm_seq_discard of an imported or attached sequence: each frame mapped from the pool is
   given up at its release) holds their RETURNs (on), so they go in messages of up to
   POOL_BATCH_MAX ids, the last when the hold ends (off, before the call returns). Lock
   held; nothing without a pool. */
void core_pool_returns_hold(kvvm *kv, bool on);
/* The pool's stats (zeros without a pool). */
void core_pool_counters(kvvm *kv, struct pool_cli_counters *out);
/* The calls' waits for the daemon by duration (empty without a pool); no lock. */
void core_pool_wait_hist(kvvm *kv, struct khist *out);
/* "; pool: ..." for a -ENOMEM message (nothing without a pool). */
void core_pool_explain(kvvm *kv, char *b, size_t n, size_t *pos);

struct storeq;
/* The queue, its staging buffer and its thread, for the entries tier that is on
   (core_tiers_entries; none: *out NULL, 0), sized by its policy row (queue_bytes). After
   the tiers, kv->v and paging. -ENOMEM, -errno of pthread_create. */
int  storeq_create(kvvm *kv, struct storeq **out);
/* The staging slots of a store queue of blocks of block_bytes (n_regions pages) bounded by
   queue_bytes (store_queue_bytes: whole blocks, at most 256; 0 = no write queued): as many
   blocks of paging's copy run are reserved at open (paging_params.copy_blocks), so the
   pages pinned for copies in flight are bounded by the same figure. */
uint32_t storeq_stage_slots(size_t block_bytes, size_t queue_bytes);
/* Waits for the queued writes (a store that stops answering gives the rest up), stops the
   thread, has the store give back the fetch buffers it keeps (store_reap: a timed-out
   get's reads still in flight, bounded only by the file system, as store_close), frees
   everything. No lock held; before the paging layer goes. */
void storeq_destroy(struct storeq *q);
/* Waits until no write is queued or in flight (bounded as destroy). No lock held. */
void storeq_wait_idle(struct storeq *q);
/* Context lock held, after prefix_publish: queues the store writes of s's blocks i with
   was[i] == 0 (new entries; keys[i] their keys): copies on the copy stream into staging,
   the store thread writes them once they are done. Never waits for the store: past
   store_queue_bytes it drops the oldest queued writes (counted in dropped). Returns the
   entries queued (the others are counted as given up, or dropped). */
uint32_t storeq_publish(kvvm *kv, kvvm_seq s, uint64_t ns, const kvvm_key *keys, size_t n,
                        const uint8_t *was);
/* No lock held: removes (ns, keys[0..n)) (keys NULL: every entry of ns under this layout)
   from the store, after cancelling their queued writes. */
void storeq_drop(struct storeq *q, uint64_t ns, const kvvm_key *keys, size_t n);
/* No lock held: how many leading keys of keys[0..n) the store holds (one request); where
   (NULL allowed) gets KVVM_TIER_STORE for each. A store failure is 0. */
size_t storeq_lookup(struct storeq *q, uint64_t ns, const kvvm_key *keys, size_t n,
                     uint8_t *where);
/* Blocks read from the store for an attach. */
struct sq_lend;
struct sq_req;
struct storeq_fetch {
    uint8_t *buf;                 /* m blocks (chunk by chunk, region-major in a chunk) */
    size_t m;                     /* blocks asked for */
    size_t chunk;                 /* blocks per request */
    size_t got;                   /* leading blocks read whole, checksums good */
    bool staged;                  /* buf is the context's kept attach staging */
    struct sq_lend *lend;         /* buf as lent to the store (storeq_fetch), or NULL */
    struct sq_req *req;           /* the first request, in flight between storeq_fetch_start
                                     and storeq_fetch_finish; NULL none */
};
/* Context lock held (inside the call's frame: it may wait for a fence, allocate pinned
   memory): f set for a fetch of m blocks, into the context's kept pinned staging when
   `stage` (false while a stream captures a graph: no synchronization then), it is free and
   m blocks fit its cap (grown to them, the last attach's copies from it waited for), else
   f->buf NULL (storeq_fetch allocates). storeq_fetch_free gives it back. */
void storeq_fetch_prepare(struct storeq *q, size_t m, bool stage, struct storeq_fetch *f);
/* No lock held, f prepared for these m blocks: reads keys[0..m) (requests of at most
   64 MiB, stopping at the first miss) into f->buf; f->got the leading blocks read. 0, or
   -ENOMEM (nothing read). storeq_fetch_start / storeq_fetch_finish are the same in two
   halves: start sends the first request (store_get_start: the store's read lane is then
   held, so the caller must not call the store before finish, which it calls exactly once,
   with the same arguments, on the same thread) and returns; meanwhile the caller may take
   the context lock (an attach maps dst's pages ahead: core.h's lock order); finish waits
   for it and reads the rest. start's -ENOMEM: nothing read, nothing to finish. */
int  storeq_fetch(struct storeq *q, uint64_t ns, const kvvm_key *keys, size_t m,
                  struct storeq_fetch *f);
int  storeq_fetch_start(struct storeq *q, uint64_t ns, const kvvm_key *keys, size_t m,
                        struct storeq_fetch *f);
void storeq_fetch_finish(struct storeq *q, uint64_t ns, const kvvm_key *keys, size_t m,
                         struct storeq_fetch *f);
/* Between the two: whether the first block is a hit (store_get_first: waits for it, no
   lock held); false also where that is not known before the finish. */
bool storeq_fetch_first(struct storeq *q, struct storeq_fetch *f);
/* The fetch's buffer given back: freed, or the staging free for the next attach, unless
   the store keeps it (a get that timed out with its reads into it in flight): then when
   the store gives it back. */
void storeq_fetch_free(struct storeq *q, struct storeq_fetch *f);
/* Context lock held: writes blocks [j0, j1) of f into resident dst's blocks first.. (its
   pages there fresh) in every region, on the engine stream. -errno of paging_seq_write. */
int  storeq_fetch_write(kvvm *kv, const struct storeq_fetch *f, kvvm_seq dst, size_t j0,
                        size_t j1, uint64_t first);
/* Adds the queue's figures to its tier's stats (core_tier_stats): errors += entries given up
   (not on the device, the store down, no memory), hit_blocks (blocks kvvm_prefix_lookup
   found in the store), dropped (queued writes the bound dropped), queue_bytes (entries
   published and not yet acknowledged), staging_bytes (attach's kept staging, now). */
void storeq_stats_add(struct storeq *q, struct core_tier_stats *out);
/* The queue's invariants (q->mu taken): every staging slot is free or held by exactly one
   queued or written batch. 0, or -EUCLEAN with why written (and logged). */
int  storeq_check(struct storeq *q, char *why, size_t len);
/* Context lock held, in the call frame (kvvm_trim): frees attach's staging unless an attach
   holds it now or the engine stream captures a graph (or its copies' fence fails). The
   bytes freed. */
size_t storeq_trim(kvvm *kv);
/* Test hook: whether the store thread is writing a batch now. */
bool storeq_test_writing(struct storeq *q);

/* config.c */
/* Validates the fields that do not depend on the device. -EINVAL (logged). */
int  config_check(const struct kvvm_config *cfg);
/* Validates and resolves the fields that do (page_size against the granule, budgets,
   reservation size); fills *slot_bytes and *reserve_bytes. -EINVAL (logged). */
int  config_layout(struct kvvm_config *cfg, size_t granule, uint64_t *slot_bytes,
                   uint64_t *reserve_bytes);
/* Appends the configuration as JSON members (no braces) to buf at *pos. */
void config_json(const struct kvvm_config *cfg, char *buf, size_t len, size_t *pos);
/* snprintf-append helper: *pos advances even past len (so truncation is detectable). */
void json_put(char *buf, size_t len, size_t *pos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* -ESTALE when s is a dropped CACHED sequence, -ENOENT a bad handle, else 0: the check a
   call makes before any room is counted or made (paging_seq_info, PG_INFO_LIVE: O(regions)). */
static inline int core_seq_stale(kvvm *kv, kvvm_seq s)
{
    struct paging_seq_info pi;
    return paging_seq_info(kv->pg, s, PG_INFO_LIVE | PG_INFO_BRIEF, &pi);
}

#endif
