/*
 * tools/kvvm-bench/bench_share.c: the handoff group's rows for the daemon's shared prefix
 * index (issue 35), run by bench_handoff.c on its kvvmd after the hand-off row.
 *
 *  - attach of 64 blocks from the pool: client B's kvvm_seq_create + kvvm_prefix_attach +
 *    kvvm_seq_free of 64 blocks (2 regions: 128 frames) that only the daemon's index has
 *    (published by client A), against B attaching the same 64 blocks again from its own
 *    index (the previous set B attached from the pool: the same frames, now local entries),
 *    alternated within each trial;
 *  - the same attach from the pool, its work complete (+ kvvm_sync), against the same
 *    blocks attached from a file:// store by a context with the store and no pool (every
 *    block read, checked and copied to the device, + kvvm_sync): the factor the pool saves;
 *  - a lookup that misses locally and asks the daemon (64 keys per call, one round trip),
 *    per key, against a lookup that hits B's own index, per key;
 *  - the system calls of the attaching thread in one attach of 64 blocks from the pool
 *    (bench_syscalls: a helper process with a client of its own), against the same attach
 *    again from its own index: the per-frame work an import adds, counted, not timed.
 *
 * Every trial attaches a set of keys not attached before (sets: the same tokens under keys
 * of distinct salts, each set published by A from a sequence of its own, so each set's
 * frames are distinct; one set per trial plus a warm-up set each side), so each pool
 * attach really imports and maps frames new to B, and each store attach really reads.
 */
#include "bench.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvvm.h"

#define G "handoff"
#define SB 64                           /* blocks per attach */
#define LOOKUPS 200                     /* lookup calls per sample */

struct side {
    kvvm *kv;
    int next;                           /* the next set to attach (not attached before) */
    int last;                           /* the last set attached (local entries now) */
    int sync;                           /* + kvvm_sync in the timed region */
    uint32_t tpb;
};

/* The keys of set i: the same tokens under salt i (same blocks, distinct entries). */
static void set_keys(uint32_t tpb, int i, kvvm_key *keys)
{
    static int32_t tok[SB * 1024];
    size_t n = (size_t)SB * tpb;
    for (size_t t = 0; t < n && t < sizeof tok / sizeof *tok; t++)
        tok[t] = 7000000 + (int32_t)t;
    (void)kvvm_prefix_keys(tok, n, tpb, &i, sizeof i, keys, SB);
}

/* create + attach of set (all SB blocks or -EIO) + free (+ kvvm_sync), us. */
static int attach_set(struct side *sd, int set, double *out)
{
    kvvm_key keys[SB];
    kvvm_seq d;
    set_keys(sd->tpb, set, keys);
    uint64_t t0 = bench_now_ns();
    int rc = kvvm_seq_create(sd->kv, &d);
    if (rc)
        return rc;
    int got = kvvm_prefix_attach(sd->kv, d, 1, keys, SB);
    rc = kvvm_seq_free(sd->kv, d);
    if (!rc && sd->sync)
        rc = kvvm_sync(sd->kv);
    *out = (double)(bench_now_ns() - t0) / 1e3;
    return got < 0 ? got : got != SB ? -EIO : rc;
}

/* a set not attached before: from the pool (or the store) */
static int sample_fresh(void *arg, double *out)
{
    struct side *sd = arg;
    int rc = attach_set(sd, sd->next, out);
    sd->last = sd->next++;
    return rc;
}

/* the set attached last: from the context's own index */
static int sample_again(void *arg, double *out)
{
    struct side *sd = arg;
    return attach_set(sd, sd->last, out);
}

struct look { kvvm *kv; int set; uint32_t tpb; };

static int sample_lookup(void *arg, double *out)
{
    struct look *l = arg;
    kvvm_key keys[SB];
    set_keys(l->tpb, l->set, keys);
    uint64_t t0 = bench_now_ns();
    for (int i = 0; i < LOOKUPS; i++) {
        int got = kvvm_prefix_lookup(l->kv, 1, keys, SB, NULL);
        if (got != SB)
            return got < 0 ? got : -EIO;
    }
    *out = (double)(bench_now_ns() - t0) / ((double)LOOKUPS * SB);
    return 0;
}

static int open_ctx(struct bench_ctx *b, const struct kvvm_config *base, const char *sock,
                    const char *url, uint32_t tpb, kvvm **kv)
{
    struct kvvm_config c = *base;
    c.pool_socket = sock;
    c.store_url = url;
    if (!sock) {                        /* a local context: a device of its own, */
        size_t page = (size_t)tpb * base->bytes_per_token;  /* in the daemon's pages */
        c.device_budget = 4096 * page;
        c.emu_device_bytes = 8192 * page;
        c.store_timeout_ms = 10000;
        c.emu_granule = page;
        c.page_size = page;
        /* a publisher's set queued whole (SB blocks of every region), whatever the page:
           the default bound drops writes of sets past it (2 MiB pages: 256 MiB a set) */
        size_t set = (size_t)SB * base->n_regions * page;
        if (c.store_queue_bytes < 2 * set)
            c.store_queue_bytes = 2 * set;
    }
    (void)b;
    return kvvm_open(&c, kv);
}

/* The file store's publisher: its own sequence of SB blocks published under sets
   [0, sets), each written to the store before the next (the queue's bound drops none). */
static int file_publish(struct bench_ctx *b, const struct kvvm_config *base, const char *url,
                        uint32_t tpb, int sets)
{
    kvvm *kv;
    kvvm_seq s;
    kvvm_key keys[SB];
    int rc = open_ctx(b, base, NULL, url, tpb, &kv);
    if (rc)
        return rc;
    if (!(rc = kvvm_seq_create(kv, &s)))
        rc = kvvm_seq_grow(kv, s, (uint64_t)SB * tpb);
    struct kvvm_stats st = { .size = sizeof st };
    for (int set = 0; set < sets && !rc; set++) {
        set_keys(tpb, set, keys);
        rc = kvvm_prefix_publish(kv, s, 1, keys, SB) == SB ? 0 : -EIO;
        for (int w = 0; !rc && w < 6000; w++) {       /* at most 60 s for the store thread */
            if ((rc = kvvm_stats(kv, &st)) || st.store_puts >= (uint64_t)(set + 1) * SB)
                break;
            nanosleep(&(struct timespec){ 0, 10000000 }, NULL);
        }
        if (!rc && st.store_puts < (uint64_t)(set + 1) * SB)
            rc = -ETIMEDOUT;
    }
    kvvm_close(kv);
    return rc;
}

/* A (a pool client) publishes sets [0, sets) into the daemon's index, each from a sequence
   of its own (distinct frames: an attach maps frames the attaching client never mapped),
   freed after (its entries keep the pages, the daemon's records the frames). */
static int pool_publish(kvvm *a, uint32_t tpb, int sets)
{
    kvvm_key keys[SB];
    for (int set = 0; set < sets; set++) {
        kvvm_seq s;
        set_keys(tpb, set, keys);
        int rc = kvvm_seq_create(a, &s);
        if (rc)
            return rc;
        if (!(rc = kvvm_seq_grow(a, s, (uint64_t)SB * tpb)))
            rc = kvvm_prefix_publish(a, s, 1, keys, SB);
        int fr = kvvm_seq_free(a, s);
        if (rc != SB)
            return rc < 0 ? rc : -EIO;
        if (fr)
            return fr;
    }
    return 0;
}

static int rows_attach(struct bench_ctx *b, struct side *p, struct side *f)
{
    struct bench_pair pr;
    double w;
    int rc = sample_fresh(p, &w);       /* warm-up: B's first attach from the pool */
    if (!rc)
        rc = bench_pairs(b, sample_fresh, p, sample_again, p, &pr);
    if (!rc)
        bench_report_pair(b, G, "attach 64 blocks (128 frames) from the pool", &pr,
                          "the same blocks from B's own index", "us/op", 1);
    if (rc || !f->kv)
        return rc;
    p->sync = f->sync = 1;
    if (!(rc = sample_fresh(f, &w)))    /* warm-up: the store's first attach */
        rc = bench_pairs(b, sample_fresh, p, sample_fresh, f, &pr);
    if (!rc)
        bench_report_pair(b, G, "attach 64 blocks from the pool, +kvvm_sync", &pr,
                          "the same from a file:// store", "us/op", 1);
    return rc;
}

/* System calls of the attaching thread (bench_syscalls: in a helper with a client of its
   own, a client of the daemon on base's pool_socket): one attach of set `set` from the pool
   (segment 0), then the same set again from its own index (segment 1), after an uncounted
   warm-up attach of set `warm`. */
struct sys_arg {
    struct bench_wire base;
    uint32_t tpb;
    int warm, set;
};

int bench_share_sys(void *arg, const int *fds, int n_fds)
{
    const struct sys_arg *a = arg;
    struct side sd = { .tpb = a->tpb };
    struct kvvm_config base;
    double w;
    (void)fds;
    (void)n_fds;
    bench_wire_get(&a->base, &base);
    int rc = open_ctx(NULL, &base, base.pool_socket, NULL, a->tpb, &sd.kv);
    if (rc)
        return rc;
    rc = attach_set(&sd, a->warm, &w);
    bench_syscall_mark(0);
    if (!rc)
        rc = attach_set(&sd, a->set, &w);
    bench_syscall_mark(1);
    if (!rc)
        rc = attach_set(&sd, a->set, &w);
    bench_syscall_mark(-1);
    kvvm_close(sd.kv);
    return rc;
}

static int row_syscalls(struct bench_ctx *b, const struct kvvm_config *base, const char *sock,
                        uint32_t tpb)
{
    uint64_t n[2] = { 0, 0 };
    struct bench_shm arg;
    int rc = bench_shm_new(&arg, sizeof(struct sys_arg));
    if (rc)
        return rc;
    struct sys_arg *a = arg.p;
    struct kvvm_config c = *base;
    c.pool_socket = sock;
    *a = (struct sys_arg){ .tpb = tpb, .warm = 0, .set = 1 };
    if (!(rc = bench_wire_put(&a->base, &c)))
        rc = bench_syscalls("share-sys", &arg, n, 2);
    bench_shm_free(&arg);
    if (rc == -EPERM || rc == -ECHILD) {
        printf("%-8s system calls per attach: not counted (tracing refused here)\n", G);
        return 0;
    }
    if (!rc)
        bench_report(b, G, "system calls per attach of 64 blocks from the pool", (double)n[0],
                     (double)n[1], "the same from its own index", "calls", 1);
    return rc;
}

int bench_share_rows(struct bench_ctx *b, const struct kvvm_config *base, const char *sock,
                     kvvm *a, kvvm_seq s)
{
    int t = b->trials > 0 ? b->trials : 5;
    int sets = 2 * t + 3;           /* the pool side's two rows, their warm-up, a lookup set */
    uint32_t tpb = 0;
    if (kvvm_block_tokens(a, &tpb) || !tpb || tpb > 1024 ||
        (uint64_t)SB * tpb > base->max_tokens)
        return -EINVAL;
    char dir[512], url[600];
    snprintf(dir, sizeof dir, "%s/kvvm-bench-share-XXXXXX",
             b->spill_dir ? b->spill_dir : "/var/tmp");
    struct side p = { .tpb = tpb }, f = { .tpb = tpb };
    struct look lp = { .tpb = tpb, .set = sets - 1 }, ll = { .tpb = tpb, .set = 0 };
    int rc = pool_publish(a, tpb, sets);
    (void)s;
    if (!rc)
        rc = open_ctx(b, base, sock, NULL, tpb, &p.kv);
    bool have_dir = !rc && mkdtemp(dir);
    if (have_dir) {
        snprintf(url, sizeof url, "file://%s", dir);
        if (file_publish(b, base, url, tpb, t + 1) ||
            open_ctx(b, base, NULL, url, tpb, &f.kv)) {
            printf("%-8s the file:// comparison left out: its store failed (%s)\n", G,
                   kvvm_last_error());
            f.kv = NULL;
        }
    } else if (!rc) {
        printf("%-8s the file:// comparison left out: no directory in %s\n", G, dir);
    }
    if (!rc)
        rc = rows_attach(b, &p, &f);
    struct bench_pair pr;
    lp.kv = ll.kv = p.kv;           /* set 0: B's own entries since its warm-up attach */
    if (!rc && !(rc = bench_pairs(b, sample_lookup, &lp, sample_lookup, &ll, &pr)))
        bench_report_pair(b, G, "lookup missing locally, asking the daemon, per key", &pr,
                          "a lookup hitting B's own index", "ns/key", 1);
    if (!rc)
        rc = row_syscalls(b, base, sock, tpb);
    if (f.kv)
        kvvm_close(f.kv);
    if (p.kv)
        kvvm_close(p.kv);
    if (have_dir) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "kvvm-bench: handoff: could not remove %s\n", dir);
    }
    return rc;
}
