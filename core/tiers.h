/*
 * core/tiers.h: the tiers below the device as one list (core/tiers.c).
 *
 * A tier is a folder of its own (host/, disk/ ...) plus one entry, a struct core_tier: it
 * opens and closes its layer for a context, gives paging its struct pg_tier_ops (paging.h,
 * "the tiers below the device": room, alloc/free, ptr or put/get/reap/wait), and answers
 * what core asks of every tier: its stats (kvvm_stats), the count the invariant check
 * compares with paging's, the text of a -ENOMEM that names it. core/stats.c, debug.c,
 * errors.c and open.c iterate the context's tiers (kv->tier[]) and name none.
 *
 * The list is in level order (PG_LOWER_*: the first tier below the device, then the one
 * below it); a level is taken by the first of its entries that opens on. Built-in entries:
 * the host tier (level 0) and the disk tier (level 1). core_tiers_add puts another entry in
 * front of them (the tests' in-memory tier, tests/tier_mem.c).
 *
 * The tiers' calls are not on the hot path: open, close, stats and checks only; paging calls
 * the ops of the moves themselves.
 */
#ifndef KVVM_CORE_TIERS_H
#define KVVM_CORE_TIERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "kvvm.h"
#include "paging/paging.h"

/* What core reads of a tier: its slots (total, free: kvvm_stats' pages_host_* for level 0,
   pages_disk_* for level 1; in use = total - free, which the invariant check compares with
   the pages paging counts on the tier) and its failed transfers (summed over the tiers
   into checksum_failures and io_errors). */
struct core_tier_stats {
    uint64_t total, free;
    uint64_t checksum_failures, io_errors;
};

/* A tier's policy row: the free fractions of its slots the background threads keep
   (min <= low <= high: below low the tier's pages move down to the tier below until high
   is free; all 0: the tier keeps none, e.g. the last one). */
struct core_tier_policy {
    double min, low, high;
};

struct core_tier {
    const char *name;            /* "host", "disk": messages say "the <name> tier" */
    unsigned level;              /* the PG_LOWER_* place it takes, < PG_N_LOWER */
    /* Opens the tier's layer for kv (the tiers above it are open: kv->tier[0..level)).
       *layer: what the other functions get (NULL: nothing opened, the tier is off); *ops:
       paging's view when the tier is on (left zero, alloc NULL: off, e.g. its budget
       unset). 0, or -errno with the cause logged or in kvvm_last_error (nothing open). */
    int  (*open)(kvvm *kv, void **layer, struct pg_tier_ops *ops);
    void (*close)(void *layer);
    /* The pages it can hold (page descriptors are made for them); only when on. */
    uint64_t (*slots)(kvvm *kv, void *layer);
    void (*stats)(void *layer, struct core_tier_stats *out);
    /* Optional (NULL: none): its I/O engine's name and whether the I/O bypasses the page
       cache (kvvm_stats_json's io_engine and spill_direct). */
    const char *(*engine)(void *layer, bool *direct);
    /* For a -ENOMEM message when the tier is off (json_put at *pos of b): "; no <name> tier
       (<why it is off>)". */
    void (*off)(kvvm *kv, char *b, size_t n, size_t *pos);
    /* Optional (NULL: a row of zeros): its policy row from kv's configuration. */
    void (*policy)(kvvm *kv, struct core_tier_policy *out);
    /* Optional, a memory tier (ptr set): the memory its slots are in (the tier below's
       I/O buffers: the disk tier registers them for O_DIRECT / fixed buffers). */
    void (*span)(void *layer, void **base, size_t *bytes);
};

/* A context's tier at one level: the entry that opened (NULL: none did) and its layer. */
struct core_tier_at {
    const struct core_tier *e;
    void *layer;
};

struct kvvm;
/* Puts e in the list in front of the built-in entries (tried first at its level). The
   testing interface's way to add a tier (tests/tier_mem.c); before any kvvm_open of the
   process, not thread safe. -EINVAL (level out of range, a function missing), -ENOSPC
   (the list is full). */
int  core_tiers_add(const struct core_tier *e);
/* kvvm_open: each level's tier (all or nothing; the error explained), kv->tier[] and
   kv->tier_ops; close: every one opened, in reverse. */
int  core_tiers_open(struct kvvm *kv);
void core_tiers_close(struct kvvm *kv);
/* The pages the tiers that are on can hold together (page descriptors beyond the
   device's). */
uint64_t core_tiers_slots(struct kvvm *kv);
/* paging's pointers to the tiers that are on. */
void core_tiers_params(struct kvvm *kv, struct paging_params *pp);
/* Whether level t's tier is on; its stats (zeros when none opened). */
bool core_tier_on(struct kvvm *kv, unsigned t);
void core_tier_stats(struct kvvm *kv, unsigned t, struct core_tier_stats *out);
/* The tiers' part of swap/'s parameters: the reclaim thread (a first tier to swap out
   to), its size and policy row (host_slots, host_min/low/high), the spill thread (a second
   tier to move its pages down to: disk). */
struct swap_params;
void core_tiers_swap_params(struct kvvm *kv, struct swap_params *p);
/* The first tier's I/O engine that has one ("none"), for kvvm_stats_json. */
const char *core_tiers_engine(struct kvvm *kv, bool *direct);
/* The entry level t tries first (NULL: none), for what an absent tier's messages say. */
const struct core_tier *core_tiers_first(unsigned t);
/* The disk tier's layer (NULL: the disk tier is not open), for the testing interface. */
struct disk *core_tiers_disk(struct kvvm *kv);

#endif
