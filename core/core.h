/*
 * core/core.h: the context (struct kvvm) behind include/kvvm.h.
 *
 * Contract: core owns the configuration (defaults, KVVM_* environment, validation), the
 * context lock, the layout (one reservation: n_regions regions of max_seqs slots, then one
 * scratch page), stats and the public calls. Every public call takes kv->lock and calls the
 * layers below (paging/, vmm/) with it held; those layers never call up.
 *
 * Lock order (outermost first): kvvm.lock -> swap's mutex (swap/swap.c, sw->mu) or the
 * frame pool thread's (swap/frames.c, fr->mu) -> the pool's feed mutex (paging pg->feed.mu)
 * -> host arena mutex -> (vmm / driver internal locks) -> log lock. The frame pool thread
 * makes its driver calls without kvvm.lock. The background reclaim thread
 * (swap/) takes kvvm.lock for each round of decisions and never holds sw->mu while taking
 * it; kvvm_sync and kvvm_close wait for the thread (swap_wait_idle / swap_destroy) with
 * kvvm.lock NOT held. No library lock is held while calling the user's log callback other
 * than the log lock.
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
#include "vmm/vmm.h"
#include "paging/paging.h"
#include "host/host.h"
#include "swap/swap.h"
#include "swap/frames.h"
#include "disk/disk.h"
#include "prefix/prefix.h"
#include "store/store.h"

struct kvvm {
    pthread_mutex_t lock;         /* protects everything below and the layers' state */
    struct kvvm_config cfg;       /* effective configuration (page_size resolved) */
    char *spill_dir;              /* owned copy of cfg.spill_dir */
    struct vmm *v;
    struct paging *pg;
    struct host_arena *host;      /* the host tier (0 slots when host_budget < page_size) */
    struct pg_host_ops host_ops;  /* paging's view of it */
    struct swap *sw;
    struct prefix *pfx;           /* the prefix cache's index (prefix/) */
    struct frames *fr;            /* the frame pool thread (NULL with pool_thread = 0) */
    struct spill *spill;          /* the disk tier (NULL without spill_dir) */
    struct pg_disk_ops disk_ops;  /* paging's view of it */
    struct store *store;          /* the shared store (NULL without store_url); it has its
                                     own lock and may be called without kvvm.lock */
    char *store_url;              /* owned copy of cfg.store_url */
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

/* kvvm.c: room for a call that needs `need` device frames naming the sequences excl (its
   pending releases first, then swap/'s plan). 0, -ENOMEM (nothing moved), -EIO. */
int core_make_room(kvvm *kv, uint64_t need, const uint64_t *excl, size_t n_excl);
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

#endif
