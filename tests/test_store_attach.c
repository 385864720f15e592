/*
 * tests/test_store_attach.c: kvvm_prefix_attach from the shared store in the steady state
 * (issue 36, "attach at the store's speed"): a context reads the store's blocks into its
 * kept attach staging, so repeated attaches make no page fault for their buffers. A count,
 * never a time: the minor page faults of the attaching thread (getrusage RUSAGE_THREAD: the
 * attach reads, checks and copies on the caller's thread without an engine stream) over
 * many attaches of distinct entries must not grow with the number of attaches. Before the
 * staging, each attach allocated its buffer (malloc) and touched every page of it: with
 * glibc's mmap threshold fixed (mallopt, as a process whose allocator returns freed memory
 * to the kernel), every attach faulted in its whole buffer, one fault per 4 KiB page.
 * A real directory (file://, O_DIRECT where /var/tmp takes it).
 */
#include "harness.h"

#include <malloc.h>
#include <sys/resource.h>

#include "store_server.h"

#define PS   (16u * KB)          /* 64 KiB pages */
#define NR   2u
#define BPT  (PS / 16u)          /* 16 tokens per block */
#define TPB  16u
#define NB   16u                 /* blocks per attach: 2 MiB of payload, 512 pages of 4 KiB */
#define WARM 3                   /* warm-up attaches: the device's frames all touched once */
#define SETS (WARM + 10)         /* sets of NB blocks published: 10 attaches counted */

static void cfg_a(struct kvvm_config *c, const char *url)
{
    /* the device holds three sets: later attaches evict earlier entries (steady state) */
    th_config(c, PS, NR, BPT, 4, (uint64_t)NB * TPB, 3u * NB * NR, 0, 0);
    c->pool_thread = 0;
    c->store_url = url;
    c->store_timeout_ms = 20000;
    c->store_queue_bytes = (size_t)NB * NR * PS * 2;
}

static uint8_t pat(uint32_t r, uint64_t off)
{
    return (uint8_t)(r * 101u + off * 7u + (off >> 9) + 3u);
}

/* Set i's keys: the same tokens under salt i. */
static void keys_of(int i, kvvm_key *k)
{
    int32_t tok[NB * TPB];
    for (uint32_t t = 0; t < NB * TPB; t++)
        tok[t] = (int32_t)(5000 + t);
    cr_assert_eq(kvvm_prefix_keys(tok, NB * TPB, TPB, &i, sizeof i, k, NB), NB);
}

static void publish_sets(const char *url)
{
    struct kvvm_config c;
    struct tctx t;
    kvvm_key k[NB];
    kvvm_seq s;
    cfg_a(&c, url);
    topen(&t, &c);
    cr_assert_eq(kvvm_seq_create(t.kv, &s), 0);
    cr_assert_eq(kvvm_seq_grow(t.kv, s, NB * TPB), 0);
    uint8_t *b = malloc((size_t)NB * PS);
    cr_assert(b);
    for (uint32_t r = 0; r < NR; r++) {
        for (size_t i = 0; i < (size_t)NB * PS; i++)
            b[i] = pat(r, i);
        cr_assert_eq(kvvm_seq_write(t.kv, s, r, 0, b, (size_t)NB * PS), 0);
    }
    free(b);
    for (int i = 0; i < SETS; i++) {
        keys_of(i, k);
        cr_assert_eq(kvvm_prefix_publish(t.kv, s, 1, k, NB), (int)NB, "%s", kvvm_last_error());
        cr_assert_eq(kvvm_sync(t.kv), 0);       /* written before the next (no drop) */
    }
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_assert_eq(st.store_puts, (uint64_t)SETS * NB, "puts %llu",
                 (unsigned long long)st.store_puts);
    tclose(&t);
}

static long thread_minflt(void)
{
    struct rusage ru;
    cr_assert_eq(getrusage(RUSAGE_THREAD, &ru), 0);
    return ru.ru_minflt;
}

/* Attaches set i (every block from the store), checks its first and last block's bytes,
   frees the sequence (its entries stay). */
static void attach_set(kvvm *kv, int i, uint8_t *b)
{
    kvvm_key k[NB];
    kvvm_seq d;
    keys_of(i, k);
    cr_assert_eq(kvvm_seq_create(kv, &d), 0);
    cr_assert_eq(kvvm_prefix_attach(kv, d, 1, k, NB), (int)NB, "set %d: %s", i,
                 kvvm_last_error());
    for (uint32_t r = 0; r < NR; r++)
        for (uint32_t blk = 0; blk < NB; blk += NB - 1) {
            cr_assert_eq(kvvm_seq_read(kv, d, r, (uint64_t)blk * PS, b, PS), 0);
            for (size_t j = 0; j < PS; j++)
                cr_assert_eq(b[j], pat(r, (uint64_t)blk * PS + j), "set %d region %u block "
                             "%u byte %zu", i, r, blk, j);
        }
    cr_assert_eq(kvvm_seq_free(kv, d), 0);
}

/* WARM warm-up attaches (the emulated device's memory is faulted in at its first use:
   the device holds WARM sets), then 10 of distinct entries, each evicting an earlier set's
   entries: the faults of the 10 are fewer than the pages of one attach's payload (before
   the kept staging: at least one per page per attach, 5,120). */
Test(store_attach, steady_state_attach_faults_no_page)
{
    TH_DEADLINE(240);
    char dir[64], url[96];
    file_url(dir, sizeof dir, url, sizeof url);
    publish_sets(url);
    /* glibc's dynamic mmap threshold would keep a freed buffer on the heap and hide the
       faults of a per-attach allocation; fixed, a large allocation is a fresh mapping */
    cr_assert_eq(mallopt(M_MMAP_THRESHOLD, 128 * 1024), 1);
    struct kvvm_config c;
    struct tctx t;
    cfg_a(&c, url);
    topen(&t, &c);
    uint8_t *b = malloc(PS);
    cr_assert(b);
    for (int i = 0; i < WARM; i++)
        attach_set(t.kv, i, b);
    long f0 = thread_minflt(), per[SETS];
    for (int i = WARM; i < SETS; i++) {
        long a = thread_minflt();
        attach_set(t.kv, i, b);
        per[i] = thread_minflt() - a;
    }
    long faults = thread_minflt() - f0;
    long pages = (long)NB * NR * PS / 4096;
    for (int i = WARM; i < SETS; i++)
        cr_log_info("attach %d: %ld minor faults", i, per[i]);
    cr_expect_lt(faults, pages, "%d attaches of %ld pages each faulted %ld times: the attach "
                 "buffers are not kept (per attach: %ld, %ld, ..., %ld)", SETS - WARM, pages,
                 faults, per[WARM], per[WARM + 1], per[SETS - 1]);
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_expect_geq(st.store_gets, (uint64_t)SETS * NB, "every attach read the store: %llu gets",
                  (unsigned long long)st.store_gets);
    free(b);
    tclose(&t);
    rmdir_all(dir);
}
