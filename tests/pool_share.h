/* tests/pool_share.h: what the tests of sharing frames between pool clients (test_handoff.c,
   test_prefix_pool.c) share: their layout (NREG regions of BPT bytes a token over the
   daemon's 64 KiB pages), a client's config, a byte pattern written and checked per region,
   a stat by name, one-byte messages over pipes between processes, and a control connection
   to the daemon, the emulated device's counters and the pool's figures of a context.
   Included after pool_daemon.h. */
#ifndef KVVM_TESTS_POOL_SHARE_H
#define KVVM_TESTS_POOL_SHARE_H

#include <stddef.h>
#include "harness.h"
#include "pool_daemon.h"

#define BPT  4096u                      /* bytes per token: 16 tokens per 64 KiB page */
#define TPP  ((uint64_t)PD_GRAN / BPT)
#define NREG 2u

static inline void cfg(struct kvvm_config *c, const char *path, const char *name, uint64_t bpt)
{
    th_config(c, (size_t)PD_GRAN, NREG, bpt, 4, 1024, 48, 0, 0);
    c->pool_socket = path;
    c->client_name = name;
    c->page_size = 0;                   /* the daemon's */
    c->emu_granule = 0;
}

static inline unsigned char pat_at(unsigned char pat, uint32_t reg, size_t i)
{
    return (unsigned char)(pat + (size_t)reg * 31 + i * 7 + i / PD_GRAN);
}

/* Writes the pattern over tokens [0, len) of every region of s. */
static inline int fill(kvvm *kv, kvvm_seq s, uint64_t len, unsigned char pat)
{
    size_t bytes = (size_t)(len * BPT);
    unsigned char *w = malloc(bytes);
    int rc = w ? 0 : -ENOMEM;
    for (uint32_t r = 0; !rc && r < NREG; r++) {
        for (size_t i = 0; i < bytes; i++)
            w[i] = pat_at(pat, r, i);
        rc = kvvm_seq_write(kv, s, r, 0, w, bytes);
    }
    free(w);
    return rc;
}

/* 0 when every byte of tokens [0, len) of every region is the pattern's. */
static inline int check(kvvm *kv, kvvm_seq s, uint64_t len, unsigned char pat)
{
    size_t bytes = (size_t)(len * BPT);
    unsigned char *b = malloc(bytes);
    int bad = b ? 0 : 1;
    for (uint32_t r = 0; !bad && r < NREG; r++) {
        if (kvvm_seq_read(kv, s, r, 0, b, bytes))
            bad = 2;
        for (size_t i = 0; !bad && i < bytes; i++)
            bad = b[i] != pat_at(pat, r, i) ? 3 : 0;
    }
    free(b);
    return bad;
}

static inline uint64_t stat_of(kvvm *kv, size_t off)
{
    struct kvvm_stats st = { .size = sizeof st };
    if (kvvm_stats(kv, &st))
        return UINT64_MAX;
    uint64_t v;
    memcpy(&v, (const char *)&st + off, sizeof v);
    return v;
}
#define STAT(kv, f) stat_of((kv), offsetof(struct kvvm_stats, f))

static inline void put_byte(int fd, int v)
{
    char x = (char)v;
    if (write(fd, &x, 1) != 1)
        _exit(90);
}

static inline char get_byte(int fd)
{
    char x = 0;
    if (read(fd, &x, 1) != 1)
        x = 0;
    return x;
}

/* The emulated device's counters of kv (imports, imported handles, mappings). */
static inline struct emu_counters emu_of(kvvm *kv)
{
    struct emu_counters e = { 0 };
    cr_assert_eq(emu_counters_get(kvvm_debug_emu_ordinal(kv), &e), 0);
    return e;
}

static inline struct kvvm_pool_info pool_info_of(kvvm *kv)
{
    struct kvvm_pool_info pi = { .size = sizeof pi };
    cr_assert_eq(kvvm_pool_info(kv, &pi), 0);
    return pi;
}

static inline int control(const char *path)
{
    int ctl = pc_connect(path);
    _Alignas(8) unsigned char buf[POOL_MSG_MAX];
    cr_assert_eq(pc_hello(ctl, POOL_ROLE_CONTROL, "test", 0, 0, buf), POOL_MSG_WELCOME);
    return ctl;
}

/* The raw protocol (a client of the tests' own, tests/pool_daemon.h): one layout (one region),
   a one-frame prefix entry published in namespace 3 under a one-byte key, and an export of
   frames it leased (out: the EXPORTED reply, or NULL to leave it unread). */
static const struct pool_layout raw_lay = { .n_regions = 1, .bytes_per_token = BPT,
                                            .page_size = PD_GRAN };

static inline void raw_publish(int fd, uint8_t key, uint64_t id, bool last)
{
    struct pool_prefix_publish m = { .lay = raw_lay, .ns = 3, .total = 1, .n = 1,
                                     .last = last, .ids = { id } };
    pool_proto_hdr(&m.h, POOL_MSG_PREFIX_PUBLISH);
    m.key[0] = key;
    cr_assert_eq(pool_proto_send(fd, &m, NULL, 0, 0), 0);
}

static inline void raw_export(int fd, const uint64_t *ids, uint32_t n, struct pool_exported *out)
{
    struct pool_export m = { .total = n, .off = 0, .n = n, .length = 16 * n,
                             .lay = raw_lay };
    pool_proto_hdr(&m.h, POOL_MSG_EXPORT);
    memcpy(m.ids, ids, n * sizeof *ids);
    cr_assert_eq(pool_proto_send(fd, &m, NULL, 0, 0), 0);
    if (out) {
        _Alignas(8) unsigned char buf[POOL_MSG_MAX];
        cr_assert_eq(pc_recv(fd, buf, NULL, NULL), POOL_MSG_EXPORTED);
        memcpy(out, buf, sizeof *out);
    }
}

#endif
