/*
 * tools/kvvm-bench/bench_checksum.c: the disk tier's page checksum (disk_checksum in
 * disk/disk.h, through kvvm_testing_page_checksum of testing/kvvm_testing.h: XXH3 64-bit
 * from libxxhash, seeded with the page identity) beside the hand-written XXH64 it replaced,
 * which is kept here, and only here, as the baseline. Both hash the same pages in the same
 * run, alternately, per trial.
 *
 * Page sizes 2 MiB and 64 KiB, two cases each: "hot" hashes one page over and over (it stays
 * in cache: the hash's own speed) and "stream" walks a buffer of 256 MiB (64 MiB with
 * --quick), larger than the last-level cache, page by page (the memory-bound case: a page
 * just copied out of the device is not in cache either). Reported: microseconds per page,
 * the median over trials. One more row per case, beside the same baseline: XXH3 compiled
 * inline here (XXH_INLINE_ALL, the target's baseline SIMD): what disk/checksum.c uses where
 * libxxhash has no run-time dispatch.
 */
#include "bench.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#define XXH_INLINE_ALL  /* XXH3 and XXH64 compiled here: the no-dispatch fallback */
#include <xxhash.h>

#include "kvvm_testing.h"

/* ---- the baseline: the disk tier's hand-written XXH64 before it moved to libxxhash ---- */

#define XP1 0x9E3779B185EBCA87ULL
#define XP2 0xC2B2AE3D27D4EB4FULL
#define XP3 0x165667B19E3779F9ULL
#define XP4 0x85EBCA77C2B2AE63ULL
#define XP5 0x27D4EB2F165667C5ULL

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static inline uint64_t rd64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline uint32_t rd32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t xround(uint64_t acc, uint64_t in)
{
    acc += in * XP2;
    acc = rotl64(acc, 31);
    return acc * XP1;
}
static inline uint64_t xmerge(uint64_t acc, uint64_t v)
{
    acc ^= xround(0, v);
    return acc * XP1 + XP4;
}

static uint64_t old_xxh64(const void *data, size_t len, uint64_t seed)
{
    const unsigned char *p = data, *end = p + len;
    uint64_t h;
    if (len >= 32) {
        uint64_t v1 = seed + XP1 + XP2, v2 = seed + XP2, v3 = seed, v4 = seed - XP1;
        const unsigned char *limit = end - 32;
        do {
            v1 = xround(v1, rd64(p));
            v2 = xround(v2, rd64(p + 8));
            v3 = xround(v3, rd64(p + 16));
            v4 = xround(v4, rd64(p + 24));
            p += 32;
        } while (p <= limit);
        h = rotl64(v1, 1) + rotl64(v2, 7) + rotl64(v3, 12) + rotl64(v4, 18);
        h = xmerge(h, v1);
        h = xmerge(h, v2);
        h = xmerge(h, v3);
        h = xmerge(h, v4);
    } else {
        h = seed + XP5;
    }
    h += (uint64_t)len;
    while (p + 8 <= end) {
        h ^= xround(0, rd64(p));
        h = rotl64(h, 27) * XP1 + XP4;
        p += 8;
    }
    if (p + 4 <= end) {
        h ^= (uint64_t)rd32(p) * XP1;
        h = rotl64(h, 23) * XP2 + XP3;
        p += 4;
    }
    while (p < end) {
        h ^= (*p++) * XP5;
        h = rotl64(h, 11) * XP1;
    }
    h ^= h >> 33;
    h *= XP2;
    h ^= h >> 29;
    h *= XP3;
    h ^= h >> 32;
    return h;
}

static uint64_t old_page_sum(const void *buf, size_t len, uint64_t page, uint32_t slot)
{
    return old_xxh64(buf, len, (page * XP5) ^ ((uint64_t)slot * XP2 + XP3));
}

static uint64_t inline_page_sum(const void *buf, size_t len, uint64_t page, uint32_t slot)
{
    return XXH3_64bits_withSeed(buf, len, (page * XP5) ^ ((uint64_t)slot * XP2 + XP3));
}

/* ---- timing --------------------------------------------------------------------------- */

typedef uint64_t (*sum_fn)(const void *, size_t, uint64_t, uint32_t);

static volatile uint64_t sink;   /* keeps the hashes from being optimized away */

/* Hashes n pages of page bytes; hot: always the first page, else page i of the buffer
   (wrapping at buf_pages). Returns microseconds per page. */
static double time_pages(sum_fn f, const unsigned char *buf, size_t page, size_t buf_pages,
                         size_t n, int hot)
{
    uint64_t acc = 0, t0 = bench_now_ns();
    for (size_t i = 0; i < n; i++) {
        size_t k = hot ? 0 : i % buf_pages;
        acc ^= f(buf + k * page, page, i, (uint32_t)k);
    }
    double us = (double)(bench_now_ns() - t0) / 1e3 / (double)n;
    sink ^= acc;
    return us;
}

int bench_checksum(struct bench_ctx *b)
{
    size_t buf_bytes = b->quick ? ((size_t)64 << 20) : ((size_t)256 << 20);
    int trials = b->trials > 0 ? b->trials : 5;
    unsigned char *buf;
    if (posix_memalign((void **)&buf, 4096, buf_bytes) != 0)
        return -ENOMEM;
    for (size_t i = 0; i < buf_bytes / 8; i++)
        ((uint64_t *)buf)[i] = i * 0x9E3779B97F4A7C15ULL;
    /* The baseline is the real XXH64: check it against libxxhash's once. */
    if (old_xxh64(buf, 4099, 7) != XXH64(buf, 4099, 7))
        fprintf(stderr, "bench checksum: the baseline XXH64 disagrees with libxxhash\n");

    static const size_t pages[] = { (size_t)2 << 20, (size_t)64 << 10 };
    enum { N_FN = 3 };
    double *v[N_FN];
    int err = 0;
    for (int k = 0; k < N_FN; k++)
        if (!(v[k] = calloc((size_t)trials, sizeof(double))))
            err = -ENOMEM;
    for (size_t pi = 0; pi < 2 && !err; pi++) {
        for (int hot = 1; hot >= 0; hot--) {
            size_t page = pages[pi], buf_pages = buf_bytes / page;
            size_t n = buf_bytes / page;                 /* one pass over the buffer */
            sum_fn fns[N_FN] = { old_page_sum, kvvm_testing_page_checksum, inline_page_sum };
            time_pages(fns[1], buf, page, buf_pages, n, hot);   /* warm-up */
            for (int t = 0; t < trials; t++)
                for (int j = 0; j < N_FN; j++) {
                    int which = (t + j) % N_FN;          /* rotate the order every trial */
                    v[which][t] = time_pages(fns[which], buf, page, buf_pages, n, hot);
                }
            char op[96], base[64];
            const char *sz = pi == 0 ? "2M" : "64K", *how = hot ? "hot" : "stream";
            snprintf(base, sizeof base, "hand-written XXH64 (before)");
            snprintf(op, sizeof op, "spill_checksum %s page, %s (XXH3)", sz, how);
            bench_report_trials(b, "checksum", op, v[1], v[0], trials, base, "us/page", 1);
            snprintf(op, sizeof op, "XXH3 inline (no dispatch) %s page, %s", sz, how);
            bench_report_trials(b, "checksum", op, v[2], v[0], trials, base, "us/page", 1);
        }
    }
    for (int k = 0; k < N_FN; k++)
        free(v[k]);
    free(buf);
    return err;
}
