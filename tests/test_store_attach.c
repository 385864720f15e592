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

#include <pthread.h>

#include "core/core.h"
#include "store/store.h"
#include "store_server.h"
#include "vmm/emu/emu.h"

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

static uint8_t pat(int set, uint32_t r, uint64_t off)
{
    return (uint8_t)((uint32_t)set * 59u + r * 101u + off * 7u + (off >> 9) + 3u);
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
    for (int i = 0; i < SETS; i++) {    /* each set its own bytes */
        for (uint32_t r = 0; r < NR; r++) {
            for (size_t j = 0; j < (size_t)NB * PS; j++)
                b[j] = pat(i, r, j);
            cr_assert_eq(kvvm_seq_write(t.kv, s, r, 0, b, (size_t)NB * PS), 0);
        }
        keys_of(i, k);
        cr_assert_eq(kvvm_prefix_publish(t.kv, s, 1, k, NB), (int)NB, "%s", kvvm_last_error());
        cr_assert_eq(kvvm_sync(t.kv), 0);       /* written before the next (no drop) */
    }
    free(b);
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

/* Attaches set i (every block from the store) into a new sequence, returned. */
static kvvm_seq attach_only(kvvm *kv, int i)
{
    kvvm_key k[NB];
    kvvm_seq d;
    keys_of(i, k);
    cr_assert_eq(kvvm_seq_create(kv, &d), 0);
    cr_assert_eq(kvvm_prefix_attach(kv, d, 1, k, NB), (int)NB, "set %d: %s", i,
                 kvvm_last_error());
    return d;
}

/* d (set i) holds the set's bytes in its first and last block of each region; freed (its
   entries stay). */
static void check_free(kvvm *kv, kvvm_seq d, int i, uint8_t *b)
{
    for (uint32_t r = 0; r < NR; r++)
        for (uint32_t blk = 0; blk < NB; blk += NB - 1) {
            cr_assert_eq(kvvm_seq_read(kv, d, r, (uint64_t)blk * PS, b, PS), 0);
            for (size_t j = 0; j < PS; j++)
                cr_assert_eq(b[j], pat(i, r, (uint64_t)blk * PS + j), "set %d region %u block "
                             "%u byte %zu", i, r, blk, j);
        }
    cr_assert_eq(kvvm_seq_free(kv, d), 0);
}

static void attach_set(kvvm *kv, int i, uint8_t *b)
{
    check_free(kv, attach_only(kv, i), i, b);
}

/* (steady_state) WARM warm-up attaches (the emulated device's memory is faulted in at its first use:
   the device holds WARM sets), then 10 of distinct entries, each evicting an earlier set's
   entries: the faults of the 10 are fewer than the pages of one attach's payload (before
   the kept staging: at least one per page per attach, 5,120). */
static void steady_state(bool stream)
{
    TH_DEADLINE(240);
    char dir[64], url[96];
    file_url(dir, sizeof dir, url, sizeof url);
    publish_sets(url);
    /* glibc's dynamic mmap threshold would keep a freed buffer on the heap and hide the
       faults of a per-attach allocation; fixed, a large allocation is a fresh mapping. A
       sanitizer's allocator refuses mallopt (0) and maps large allocations afresh anyway. */
    (void)mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    struct kvvm_config c;
    struct tctx t;
    cfg_a(&c, url);
    void *st_engine = NULL;
    if (stream)
        topen_stream(&t, &c, &st_engine);   /* the copies from the staging queued on it */
    else
        topen(&t, &c);
    uint8_t *b = malloc(PS);
    cr_assert(b);
    for (int i = 0; i < WARM; i++)
        attach_set(t.kv, i, b);
    long per[SETS];
    kvvm_seq prev = 0;
    for (int i = WARM; i < SETS; i++) {
        long a = thread_minflt();
        if (stream) {       /* two attaches in a row before the first's bytes are read */
            kvvm_seq d = attach_only(t.kv, i);
            per[i] = thread_minflt() - a;
            if (i > WARM)
                check_free(t.kv, prev, i - 1, b);
            prev = d;
        } else {
            attach_set(t.kv, i, b);
            per[i] = thread_minflt() - a;
        }
    }
    if (stream)
        check_free(t.kv, prev, SETS - 1, b);
    long faults = 0;
    for (int i = WARM; i < SETS; i++)
        faults += per[i];
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
    if (stream)
        tclose_stream(&t, st_engine);
    else
        tclose(&t);
    rmdir_all(dir);
}

/* A file:// store in a fresh directory (dir, url) with every set published, and c the
   attaching context's configuration on it (cfg_a), for the caller to adjust and open. */
static void published_store(char *dir, size_t dlen, char *url, size_t ulen,
                            struct kvvm_config *c)
{
    file_url(dir, dlen, url, ulen);
    publish_sets(url);
    cfg_a(c, url);
}

Test(store_attach, steady_state_attach_faults_no_page)
{
    steady_state(false);
}

/* The same with an engine stream: each attach's copies from the pinned staging run on it,
   the next attach waits for their fence before reading into the staging again (every
   attach's bytes are checked, so one that overwrote copies in flight shows). */
Test(store_attach, steady_state_attach_stream_mode)
{
    steady_state(true);
}

struct attach_arg {
    kvvm *kv;
    int set;
    kvvm_seq d;
};

static void *attach_thread(void *p)
{
    struct attach_arg *a = p;
    a->d = attach_only(a->kv, a->set);
    return NULL;
}

/* Bug guarded: the staging reused under copies still queued. Stream mode, the engine
   stream paused: attach of set 0 returns with its copies from the staging queued; a second
   attach (set 1, another thread) must wait for them (the staging's fence, cuEventSynchronize:
   gated here until the stream runs again) before reading set 1 into the staging, else set
   0's copies would carry set 1's bytes. Both sets' bytes are checked. (Room for both: no
   eviction waits on the paused stream.) */
Test(store_attach, staging_reuse_waits_for_queued_copies)
{
    TH_DEADLINE(120);
    char dir[64], url[96];
    struct kvvm_config c;
    struct tctx t;
    void *st_engine = NULL;
    published_store(dir, sizeof dir, url, sizeof url, &c);
    topen_stream(&t, &c, &st_engine);
    uint8_t *b = malloc(PS);
    cr_assert(b);
    cr_assert_eq(emu_stream_set_paused((kcu_stream)st_engine, 1), 0);
    kvvm_seq d0 = attach_only(t.kv, 0);
    cr_assert_eq(emu_gate_arm("cuEventSynchronize"), 0);
    struct attach_arg a = { t.kv, 1, 0 };
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, attach_thread, &a), 0);
    emu_gate_wait();                    /* the second attach waits for the fence */
    cr_assert_eq(emu_stream_set_paused((kcu_stream)st_engine, 0), 0);
    emu_gate_open();
    cr_assert_eq(pthread_join(th, NULL), 0);
    check_free(t.kv, d0, 0, b);
    check_free(t.kv, a.d, 1, b);
    free(b);
    tclose_stream(&t, st_engine);
    rmdir_all(dir);
}

/* The pinned staging is memory an operator must see and can get back: none at open (an
   attach sizes it from its need: NB blocks, a power of two), counted in kvvm_stats'
   store_staging_bytes and its metric, the driver's pinned allocations grown by exactly that,
   freed by kvvm_trim (the driver's pinned bytes back to what they were), sized again by the
   next attach, whose bytes are right. Bug guarded (the first kept staging): 16 MiB pinned at
   open (a sequence's max_tokens worth, up to 64 MiB) that no figure showed and nothing
   freed. */
static uint64_t pinned_bytes(void)
{
    struct emu_counters ec;
    cr_assert_eq(emu_counters_get(0, &ec), 0);
    return ec.host_alloc_bytes + ec.host_registered_bytes;
}

Test(store_attach, staging_sized_by_need_counted_and_freed_by_trim)
{
    TH_DEADLINE(120);
    char dir[64], url[96];
    struct kvvm_config c;
    struct tctx t;
    published_store(dir, sizeof dir, url, sizeof url, &c);
    c.max_tokens = (uint64_t)8 * NB * TPB;     /* the cap (8 attaches' worth) is not the size */
    topen(&t, &c);
    uint64_t base = pinned_bytes();
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_expect_eq(st.store_staging_bytes, 0, "staging at open: %llu bytes",
                 (unsigned long long)st.store_staging_bytes);
    uint8_t *b = malloc(PS);
    cr_assert(b);
    const uint64_t want = (uint64_t)NB * NR * PS;   /* NB blocks: a power of two */
    attach_set(t.kv, 0, b);
    tstats(&t, &st);
    cr_expect_eq(st.store_staging_bytes, want, "staging after an attach of %u blocks: %llu "
                 "bytes", NB, (unsigned long long)st.store_staging_bytes);
    cr_expect_eq(pinned_bytes() - base, want, "pinned host bytes grew by %llu",
                 (unsigned long long)(pinned_bytes() - base));
    char m[1 << 16], line[96];
    cr_assert_gt(kvvm_metrics(t.kv, m, sizeof m), 0);
    snprintf(line, sizeof line, "\nkvvm_store_staging_bytes %llu\n", (unsigned long long)want);
    cr_expect(strstr(m, line), "no '%s' in the metrics", line + 1);
    cr_assert_eq(kvvm_trim(t.kv, 0), 0);
    tstats(&t, &st);
    cr_expect_eq(st.store_staging_bytes, 0, "staging after kvvm_trim: %llu bytes",
                 (unsigned long long)st.store_staging_bytes);
    cr_expect_eq(pinned_bytes(), base, "pinned host bytes after kvvm_trim: %llu, at open %llu",
                 (unsigned long long)pinned_bytes(), (unsigned long long)base);
    attach_set(t.kv, 1, b);                     /* sized again; its bytes checked */
    tstats(&t, &st);
    cr_expect_eq(st.store_staging_bytes, want);
    free(b);
    tclose(&t);
    rmdir_all(dir);
}

/* Regression: an attach whose store get timed out with its O_DIRECT reads into the kept
   staging still in flight gave the staging back as if they were over: kvvm_trim freed it,
   or the next attach read into it, while the kernel could still write there (the late
   read's bytes landing in freed memory or in the next attach's blocks). The store now keeps
   it until those reads completed: trim leaves it; once a later get reaped them, attaches
   read right and trim frees it. */
Test(store_attach, timed_out_attach_keeps_staging_until_reads_reaped)
{
    TH_DEADLINE(120);
    char dir[64], url[96];
    struct kvvm_config c;
    struct tctx t;
    published_store(dir, sizeof dir, url, sizeof url, &c);
    c.store_timeout_ms = 200;
    topen(&t, &c);
    if (!store_direct(t.kv->store)) {
        tclose(&t);
        rmdir_all(dir);
        cr_skip_test("/var/tmp refuses O_DIRECT: attaches read through the store's staging");
    }
    kvvm_key k[NB];
    keys_of(0, k);
    kvvm_seq d;
    cr_assert_eq(kvvm_seq_create(t.kv, &d), 0);
    cr_assert_eq(store_test_hang(t.kv->store, STORE_HANG_ALL), 0);
    cr_expect_eq(kvvm_prefix_attach(t.kv, d, 1, k, NB), 0, "a hung store is a miss");
    struct kvvm_stats st;
    tstats(&t, &st);
    uint64_t kept = st.store_staging_bytes;
    cr_expect_gt(kept, 0, "the attach read into no kept staging");
    cr_assert_eq(kvvm_trim(t.kv, 0), 0);
    tstats(&t, &st);
    cr_expect_eq(st.store_staging_bytes, kept, "kvvm_trim freed the staging that reads in "
                 "flight still write: %llu bytes left of %llu",
                 (unsigned long long)st.store_staging_bytes, (unsigned long long)kept);
    cr_assert_eq(store_test_hang(t.kv->store, 0), 0);   /* the hung reads complete now */
    uint8_t *b = malloc(PS);
    cr_assert(b);
    int got = 0;
    for (int i = 0; i < 100 && got != (int)NB; i++) {   /* the hung batch is reaped first */
        kvvm_seq e;
        cr_assert_eq(kvvm_seq_create(t.kv, &e), 0);
        got = kvvm_prefix_attach(t.kv, e, 1, k, NB);
        if (got == (int)NB) {
            check_free(t.kv, e, 0, b);
        } else {
            cr_assert_eq(kvvm_seq_free(t.kv, e), 0);
            usleep(20000);
        }
    }
    cr_expect_eq(got, (int)NB, "the store did not come back after the reads completed");
    cr_assert_eq(kvvm_trim(t.kv, 0), 0);
    tstats(&t, &st);
    cr_expect_eq(st.store_staging_bytes, 0, "the staging given back was not freed by trim");
    cr_assert_eq(kvvm_seq_free(t.kv, d), 0);
    free(b);
    tclose(&t);
    rmdir_all(dir);
}

/* The attach's premap (issue 36, "attach at the store's speed"): once the store's first
   block is known to be a hit and while the rest of its reads are in flight, dst's pages
   for the store's blocks are mapped ahead of its end from ready frames (paging_seq_premap),
   so that the grow after the reads maps nothing. Counted, never timed: with the store's
   reads hung but each batch's first (the test hook's STORE_HANG_TAIL), the emulator's live
   mappings grow by every block's pages while dst shows nothing (length 0, device pages free
   as before: map-ahead is free for accounting); the reads released (each completes short:
   a miss), the attach returns its one block and gives the other premapped pages back (live
   mappings and free pages: one block's more than before). */
struct hung_attach {
    kvvm *kv;
    kvvm_seq d;
    kvvm_key k[NB];
    int rc;
};

static void *hung_attach_run(void *p)
{
    struct hung_attach *h = p;
    h->rc = kvvm_prefix_attach(h->kv, h->d, 1, h->k, NB);
    return NULL;
}

static uint64_t live_maps(void)
{
    struct emu_counters c;
    cr_assert_eq(emu_counters_get(0, &c), 0);
    return c.maps - c.unmaps;
}

static uint64_t all_maps(void)
{
    struct emu_counters c;
    cr_assert_eq(emu_counters_get(0, &c), 0);
    return c.maps;
}

/* A context on a published store (full_device_start), and for an attach hung on its store
   reads, the attach into new empty h.d started on th with the reads hung
   (premap_hung_start, hung_attach_start). */
struct store_run {
    char dir[64], url[96];
    struct tctx t;
    struct hung_attach h;
    pthread_t th;
    uint64_t free0, maps0;          /* the free pages and the live (premap_hung_start) or all
                                       (hung_attach_start) mappings before */
    uint8_t *b;                     /* a page's buffer (full_device_start) */
    struct kvvm_stats s0, s1;       /* s0 once the device is full (full_device_start) */
};

/* A context (frames created at open) on a published store, and set 0's attach, returned
   once dst's pages are premapped for it. */
static void premap_hung_start(struct store_run *r)
{
    struct kvvm_config c;
    struct kvvm_stats st;
    published_store(r->dir, sizeof r->dir, r->url, sizeof r->url, &c);
    c.create_at_open = 1;         /* ready frames for the premap */
    topen(&r->t, &c);
    r->h.kv = r->t.kv;
    keys_of(0, r->h.k);
    cr_assert_eq(kvvm_seq_create(r->t.kv, &r->h.d), 0);
    tstats(&r->t, &st);
    r->free0 = st.pages_device_free;
    r->maps0 = live_maps();
    cr_assert_eq(store_test_hang(r->t.kv->store, STORE_HANG_TAIL), 0);
    cr_assert_eq(pthread_create(&r->th, NULL, hung_attach_run, &r->h), 0);
    while (live_maps() < r->maps0 + (uint64_t)NB * NR)   /* the premap, reads still hung */
        usleep(1000);
}

Test(store_attach, premap_while_reads_in_flight_then_given_back)
{
    TH_DEADLINE(60);              /* without the premap: no mapping while hung, this ends it */
    static struct store_run r;
    premap_hung_start(&r);
    struct kvvm_stats st;
    struct kvvm_seq_info in = { .size = sizeof in };
    cr_assert_eq(kvvm_seq_info(r.t.kv, r.h.d, &in), 0);
    cr_expect_eq(in.length, 0, "dst's length changed before its bytes were read");
    tstats(&r.t, &st);
    cr_expect_eq(st.pages_device_free, r.free0, "premapped pages are not free for accounting "
                 "(%llu free, %llu before)", (unsigned long long)st.pages_device_free,
                 (unsigned long long)r.free0);
    cr_assert_eq(store_test_hang(r.t.kv->store, 0), 0);   /* each hung read completes short */
    cr_assert_eq(pthread_join(r.th, NULL), 0);
    cr_expect_eq(r.h.rc, 1, "the first block read, the others short (misses): %d", r.h.rc);
    cr_assert_eq(kvvm_seq_info(r.t.kv, r.h.d, &in), 0);
    cr_expect_eq(in.length, TPB);
    cr_expect_eq(live_maps(), r.maps0 + NR, "the premapped pages not used were not given back: "
                 "%llu live mappings, %llu before", (unsigned long long)live_maps(),
                 (unsigned long long)r.maps0);
    tstats(&r.t, &st);
    cr_expect_eq(st.pages_device_free, r.free0 - NR);
    cr_assert_eq(kvvm_seq_free(r.t.kv, r.h.d), 0);
    uint8_t *b = malloc(PS);
    cr_assert(b);
    attach_set(r.t.kv, 1, b);                   /* the store's bytes, right */
    free(b);
    tclose(&r.t);
    rmdir_all(r.dir);
}

/* Regression: an attach whose locked part fails before attaching (dst found not empty,
   grown meanwhile by another thread; no memory for the ids) returned before attach_locked's
   paging_seq_premap_trim, so the pages attach_premap mapped ahead of dst and the other
   thread's grow did not take stayed mapped ahead past map_ahead (0 here) until dst grew or
   was freed: NB - 1 blocks' frames still mapped (free for accounting, as map-ahead is, so
   only the live mappings show them) once the call returned. */
Test(regress, failed_attach_kept_its_premapped_frames_mapped_ahead)
{
    TH_DEADLINE(60);              /* without the premap: no mapping while hung, this ends it */
    static struct store_run r;
    premap_hung_start(&r);
    struct kvvm_stats st;
    cr_assert_eq(kvvm_seq_grow(r.t.kv, r.h.d, TPB), 0, "%s", kvvm_last_error());
    cr_expect_eq(live_maps(), r.maps0 + (uint64_t)NB * NR, "the grow took a premapped page");
    cr_assert_eq(store_test_hang(r.t.kv->store, 0), 0);
    cr_assert_eq(pthread_join(r.th, NULL), 0);
    cr_expect_eq(r.h.rc, -EINVAL, "dst not empty any more: %d", r.h.rc);
    cr_expect_eq(live_maps(), r.maps0 + NR, "the premapped pages the grow did not take were not "
                 "given back: %llu live mappings, %llu before", (unsigned long long)live_maps(),
                 (unsigned long long)r.maps0);
    tstats(&r.t, &st);
    cr_expect_eq(st.pages_device_free, r.free0 - NR);
    tcheck(&r.t, "after the failed attach");
    cr_assert_eq(kvvm_seq_free(r.t.kv, r.h.d), 0);
    tclose(&r.t);
    rmdir_all(r.dir);
}

/* An attach whose first block misses in the store maps nothing ahead (a miss costs no map
   and unmap of the pages a hit would have needed): the emulator counts no map during it. */
Test(store_attach, attach_that_misses_premaps_nothing)
{
    TH_DEADLINE(60);
    char dir[64], url[96];
    struct kvvm_config c;
    struct tctx t;
    published_store(dir, sizeof dir, url, sizeof url, &c);
    c.create_at_open = 1;         /* ready frames: a premap would find them */
    topen(&t, &c);
    kvvm_key k[NB];
    keys_of(SETS + 7, k);         /* never published */
    kvvm_seq d;
    cr_assert_eq(kvvm_seq_create(t.kv, &d), 0);
    uint64_t m0 = all_maps();
    cr_expect_eq(kvvm_prefix_attach(t.kv, d, 1, k, NB), 0);
    cr_expect_eq(all_maps(), m0, "an attach that found nothing mapped %llu pages",
                 (unsigned long long)(all_maps() - m0));
    cr_assert_eq(kvvm_seq_free(t.kv, d), 0);
    tclose(&t);
    rmdir_all(dir);
}

static int cap_errors, cap_warnings;

static void count_log(int level, const char *msg, void *arg)
{
    (void)arg;
    cap_errors += level == KVVM_LOG_ERROR;
    cap_warnings += level == KVVM_LOG_WARN;
    if (level <= KVVM_LOG_WARN)
        cr_log_info("log %d: %s", level, msg);
}

/* While the engine stream captures a graph, neither kvvm_trim nor an attach synchronizes
   on the staging's fence (cuEventSynchronize: refused during a capture, which it would
   break on CUDA) or registers/unregisters it: trim leaves the staging (its last copies
   queued on that stream), an attach reads into its own buffer; nothing logged as an error
   or a warning; the trim after the capture frees it. Bugs guarded: both waited on the fence
   during the capture (the driver's refusal logged as an error). */
Test(store_attach, staging_not_synchronized_during_graph_capture)
{
    TH_DEADLINE(120);
    char dir[64], url[96];
    struct kvvm_config c;
    struct tctx t;
    void *st_engine = NULL;
    published_store(dir, sizeof dir, url, sizeof url, &c);
    topen_stream(&t, &c, &st_engine);
    uint8_t *b = malloc(PS);
    cr_assert(b);
    cr_assert_eq(emu_stream_set_paused((kcu_stream)st_engine, 1), 0);
    kvvm_seq d = attach_only(t.kv, 0);          /* its copies queued, not run */
    struct emu_counters e0, e1;
    cr_assert_eq(emu_counters_get(0, &e0), 0);
    cr_assert_eq(emu_stream_set_capturing((kcu_stream)st_engine, 1), 0);
    kvvm_set_log(count_log, NULL, KVVM_LOG_WARN);
    cr_assert_eq(kvvm_trim(t.kv, 0), 0, "%s", kvvm_last_error());
    cr_expect_eq(cap_errors + cap_warnings, 0, "kvvm_trim during a capture logged %d errors, "
                 "%d warnings (a driver call the capture refuses)", cap_errors, cap_warnings);
    /* an attach during the capture: neither waits for the staging's fence nor grows it */
    kvvm_key k1[NB];
    kvvm_seq d1;
    keys_of(1, k1);
    cr_assert_eq(kvvm_seq_create(t.kv, &d1), 0);
    int got = kvvm_prefix_attach(t.kv, d1, 1, k1, NB);
    cr_log_info("attach during a capture: %d (%s)", got, got < 0 ? kvvm_last_error() : "");
    cr_expect_eq(cap_errors + cap_warnings, 0, "an attach during a capture logged %d errors, "
                 "%d warnings (a driver call the capture refuses)", cap_errors, cap_warnings);
    kvvm_set_log(NULL, NULL, KVVM_LOG_WARN);
    struct kvvm_stats st;
    tstats(&t, &st);
    cr_expect_eq(st.store_staging_bytes, (uint64_t)NB * NR * PS, "staging trimmed during a "
                 "capture: %llu bytes left", (unsigned long long)st.store_staging_bytes);
    cr_assert_eq(emu_counters_get(0, &e1), 0);
    cr_expect_eq(e1.host_registered_bytes, e0.host_registered_bytes, "unregistered during a "
                 "capture");
    cr_assert_eq(emu_stream_set_capturing((kcu_stream)st_engine, 0), 0);
    cr_assert_eq(emu_stream_set_paused((kcu_stream)st_engine, 0), 0);
    check_free(t.kv, d, 0, b);                  /* the queued copies carried set 0 */
    cr_assert_eq(kvvm_seq_free(t.kv, d1), 0);
    cr_assert_eq(kvvm_trim(t.kv, 0), 0, "%s", kvvm_last_error());
    tstats(&t, &st);
    cr_expect_eq(st.store_staging_bytes, 0, "after the capture: %llu bytes",
                 (unsigned long long)st.store_staging_bytes);
    free(b);
    tclose_stream(&t, st_engine);
    rmdir_all(dir);
}

/* ---------------------------------------------------------------- below the host tier */

#define T1   16u                 /* tokens per 4 KiB page of 256-byte tokens, one region */

static uint8_t pat1(uint32_t lin, uint64_t off)
{
    return (uint8_t)(lin * 37u + off * 11u + (off >> 8) + 1u);
}

static void keys1(uint32_t lin, size_t nb, kvvm_key *k)
{
    int32_t tok[4 * T1];
    for (uint32_t i = 0; i < nb * T1; i++)
        tok[i] = (int32_t)(lin * 1000u + i);
    cr_assert_eq(kvvm_prefix_keys(tok, nb * T1, T1, NULL, 0, k, nb), nb);
}

static void fill1(kvvm *kv, kvvm_seq s, uint64_t blocks, uint32_t lin)
{
    uint8_t b[4 * T1 * 256];
    cr_assert_eq(kvvm_seq_grow(kv, s, blocks * T1), 0, "grow: %s", kvvm_last_error());
    for (size_t i = 0; i < blocks * KB; i++)
        b[i] = pat1(lin, i);
    cr_assert_eq(kvvm_seq_write(kv, s, 0, 0, b, blocks * KB), 0);
}

static bool same1(kvvm *kv, kvvm_seq s, uint64_t blocks, uint32_t lin)
{
    uint8_t b[4 * T1 * 256];
    cr_assert_eq(kvvm_seq_read(kv, s, 0, 0, b, blocks * KB), 0, "read: %s", kvvm_last_error());
    for (size_t i = 0; i < blocks * KB; i++)
        if (b[i] != pat1(lin, i))
            return false;
    return true;
}

/* One region of 4 KiB pages, 8 device pages, `host` host slots, a disk tier of 16 pages in
   spill (NULL: none), the store at url; AUTO_SWAP | CACHE_DEMOTE, watermarks 0 (only the
   calls move pages). */
static kvvm *open_below(const char *url, const char *spill, uint64_t host)
{
    struct kvvm_config c;
    th_config(&c, KB, 1, 256, 8, 8 * T1, 8, host, KVVM_F_AUTO_SWAP | KVVM_F_CACHE_DEMOTE);
    c.pool_thread = 0;
    c.store_url = url;
    c.store_timeout_ms = 20000;
    c.spill_dir = spill;
    c.spill_budget = spill ? 16 * KB : 0;
    c.device_min = c.device_low = c.device_high = 0;
    c.host_min = c.host_low = c.host_high = 0;
    return th_open(&c);
}

/* The lookup of k[0..n) finds all n, in tiers want[0..n). */
static void tiers1(kvvm *kv, const kvvm_key *k, int n, const uint8_t *want, const char *what)
{
    uint8_t w[4] = { 0 };
    cr_assert_eq(kvvm_prefix_lookup(kv, 1, k, (size_t)n, w), n, "%s: not all found", what);
    for (int i = 0; i < n; i++)
        cr_assert_eq(w[i], want[i], "%s: block %d in tier %u, not %u", what, i, w[i], want[i]);
}

/* Entries of the store are like any other: x's two entries, attached from the store
   (from_store: published by another context) or published here and written through to the
   store, are demoted to the host tier when the device is needed, then spilled to disk when
   a swap-out needs their host slots (prefix_spills), and attached back from disk with every
   byte intact. */
static void store_entries_spill(bool from_store)
{
    TH_DEADLINE(120);
    char sdir[64], url[96], spill[64];
    kvvm_key x[2];
    file_url(sdir, sizeof sdir, url, sizeof url);
    snprintf(spill, sizeof spill, "/var/tmp/kvvm-test-spill-XXXXXX");
    cr_assert(mkdtemp(spill));
    keys1(1, 2, x);
    kvvm *pub = from_store ? open_below(url, NULL, 0) : open_below(url, spill, 2);
    kvvm_seq p;
    cr_assert_eq(kvvm_seq_create(pub, &p), 0);
    fill1(pub, p, 2, 1);
    cr_assert_eq(kvvm_prefix_publish(pub, p, 1, x, 2), 2, "%s", kvvm_last_error());
    cr_assert_eq(kvvm_sync(pub), 0);            /* written to the store */
    struct kvvm_stats st;
    th_stats(pub, &st);
    cr_assert_eq(st.store_puts, 2);
    kvvm *kv = pub;
    kvvm_seq g, s, b;
    if (from_store) {
        th_close(pub, 0);
        kv = open_below(url, spill, 2);
        kvvm_seq a;
        cr_assert_eq(kvvm_seq_create(kv, &a), 0);
        cr_assert_eq(kvvm_prefix_attach(kv, a, 1, x, 2), 2, "attach: %s", kvvm_last_error());
        th_stats(kv, &st);
        cr_assert_eq(st.store_gets, 2, "the blocks did not come from the store");
        cr_assert_eq(kvvm_seq_free(kv, a), 0);
    } else {
        cr_assert_eq(kvvm_seq_free(kv, p), 0);
    }
    tiers1(kv, x, 2, (uint8_t[]){ KVVM_TIER_DEVICE, KVVM_TIER_DEVICE }, "entries");
    cr_assert_eq(kvvm_seq_create(kv, &g), 0);   /* the whole device: x demoted to the host */
    cr_assert_eq(kvvm_seq_grow(kv, g, 8 * T1), 0, "grow: %s", kvvm_last_error());
    tiers1(kv, x, 2, (uint8_t[]){ KVVM_TIER_HOST, KVVM_TIER_HOST }, "demoted");
    cr_assert_eq(kvvm_seq_truncate(kv, g, 0), 0);
    cr_assert_eq(kvvm_seq_create(kv, &s), 0);
    fill1(kv, s, 2, 3);
    cr_assert_eq(kvvm_seq_swap_out(kv, s), 0, "swap_out: %s", kvvm_last_error());
    th_stats(kv, &st);
    cr_assert_eq(st.prefix_spills, 2, "the store's entries' host pages were not spilled");
    tiers1(kv, x, 2, (uint8_t[]){ KVVM_TIER_DISK, KVVM_TIER_DISK }, "spilled");
    cr_assert_eq(kvvm_seq_swap_in(kv, s), 0, "swap_in: %s", kvvm_last_error());
    cr_assert(same1(kv, s, 2, 3));
    cr_assert_eq(kvvm_seq_create(kv, &b), 0);
    cr_assert_eq(kvvm_prefix_attach(kv, b, 1, x, 2), 2, "attach: %s", kvvm_last_error());
    cr_assert(same1(kv, b, 2, 1), "bytes back from disk differ");
    th_check(kv, "store entries spilled");
    th_close(kv, 0);
    rmdir_all(spill);
    rmdir_all(sdir);
}

Test(store_attach, store_entries_host_pages_spill_to_disk)
{
    store_entries_spill(true);
}

Test(store_attach, written_through_entries_host_pages_spill_to_disk)
{
    store_entries_spill(false);
}

/* ---- room made ahead (issue 36): a device full of cached entries ----------------------
   The attaching context's device holds three sets; sets 0, 1 and 2 attached and freed
   fill it with prefix entries no sequence holds. An attach of another set from the store
   then finds no ready frame for its premap: once the store's first block is a hit, and
   while the rest is read, the premap drops entries (the plan's order: set 0's, the least
   recently used, first) for dst's pages and maps them ahead. */

/* Fills t's device with sets 0..2 (attached, every byte checked, freed): their entries
   stay, no sequence holds them. */
static void fill_with_entries(struct tctx *t, uint8_t *b)
{
    for (int i = 0; i < 3; i++)
        attach_set(t->kv, i, b);
    struct kvvm_stats st;
    tstats(t, &st);
    cr_assert_eq(st.prefix_entries, 3u * NB, "%llu entries",
                 (unsigned long long)st.prefix_entries);
    cr_assert_lt(st.pages_device_free, (uint64_t)NR, "the device is not full of entries: %llu "
                 "pages free", (unsigned long long)st.pages_device_free);
}

/* d holds blocks [0, nb) of set i, every byte of every region. */
static void check_all(kvvm *kv, kvvm_seq d, int i, uint32_t nb)
{
    uint8_t *b = malloc((size_t)nb * PS);
    cr_assert(b);
    for (uint32_t r = 0; r < NR; r++) {
        cr_assert_eq(kvvm_seq_read(kv, d, r, 0, b, (size_t)nb * PS), 0);
        for (size_t j = 0; j < (size_t)nb * PS; j++)
            cr_assert_eq(b[j], pat(i, r, j), "set %d region %u byte %zu", i, r, j);
    }
    free(b);
}

/* Which of set i's blocks are local entries now (kvvm_prefix_lookup's where: 0 the
   device, else a tier below or the store): the count on the device. */
static size_t on_device(kvvm *kv, int i)
{
    kvvm_key k[NB];
    uint8_t where[NB];
    keys_of(i, k);
    memset(where, 0xff, sizeof where);
    cr_assert_geq(kvvm_prefix_lookup(kv, 1, k, NB, where), 0);
    size_t n = 0;
    for (size_t j = 0; j < NB; j++)
        n += where[j] == KVVM_TIER_DEVICE;
    return n;
}

/* A context on a published store with its device full of entries (fill_with_entries: sets
   0-2), r->s0 its stats then. */
static void full_device_start(struct store_run *r)
{
    struct kvvm_config c;
    published_store(r->dir, sizeof r->dir, r->url, sizeof r->url, &c);
    topen(&r->t, &c);
    r->b = malloc(PS);
    cr_assert(r->b);
    fill_with_entries(&r->t, r->b);
    tstats(&r->t, &r->s0);
}

Test(store_attach, full_device_attach_drops_entries_every_byte_right)
{
    TH_DEADLINE(120);
    static struct store_run r;
    full_device_start(&r);
    struct kvvm_stats s1;
    kvvm_seq d = attach_only(r.t.kv, 3);
    check_all(r.t.kv, d, 3, NB);
    tstats(&r.t, &s1);
    /* set 3's NB * NR pages came from set 0's entries (the least recently used), NB of
       them, each NR pages: dropped as counted, the new ones entered */
    cr_expect_eq(s1.prefix_evictions - r.s0.prefix_evictions, NB, "%llu entries dropped",
                 (unsigned long long)(s1.prefix_evictions - r.s0.prefix_evictions));
    cr_expect_eq(s1.prefix_entries, 3u * NB, "%llu entries",
                 (unsigned long long)s1.prefix_entries);
    cr_expect_eq(on_device(r.t.kv, 0), 0, "set 0's entries were not the ones dropped");
    cr_expect_eq(on_device(r.t.kv, 1), NB);
    cr_expect_eq(on_device(r.t.kv, 2), NB);
    cr_assert_eq(kvvm_seq_free(r.t.kv, d), 0);
    check_free(r.t.kv, attach_only(r.t.kv, 0), 0, r.b);   /* set 0 from the store again, right */
    free(r.b);
    tclose(&r.t);
    rmdir_all(r.dir);
}

/* An attach whose first block misses in the store drops nothing for room, device full or
   not (the room is made only for blocks the store confirmed): no entry evicted, none gone
   from the device, nothing mapped. */
Test(store_attach, full_device_attach_that_misses_drops_nothing)
{
    TH_DEADLINE(60);
    static struct store_run r;
    full_device_start(&r);
    struct kvvm_stats s1;
    kvvm_key k[NB];
    keys_of(SETS + 7, k);         /* never published */
    kvvm_seq d;
    cr_assert_eq(kvvm_seq_create(r.t.kv, &d), 0);
    uint64_t m0 = all_maps();
    cr_expect_eq(kvvm_prefix_attach(r.t.kv, d, 1, k, NB), 0);
    tstats(&r.t, &s1);
    cr_expect_eq(s1.prefix_evictions, r.s0.prefix_evictions, "a miss dropped %llu entries",
                 (unsigned long long)(s1.prefix_evictions - r.s0.prefix_evictions));
    cr_expect_eq(s1.prefix_entries, 3u * NB);
    cr_expect_eq(all_maps(), m0, "a miss mapped %llu pages",
                 (unsigned long long)(all_maps() - m0));
    for (int i = 0; i < 3; i++)
        cr_expect_eq(on_device(r.t.kv, i), NB, "set %d", i);
    cr_assert_eq(kvvm_seq_free(r.t.kv, d), 0);
    free(r.b);
    tclose(&r.t);
    rmdir_all(r.dir);
}

/* The start of both tests below: a device full of entries (sets 0-2), the store's reads
   hung but each batch's first (STORE_HANG_TAIL), and an attach of set 3 on its own thread
   (run) into h->d, waited for until set 0's entries are dropped: the drops and the premap
   are one locked section, so once the drops are seen the premap is done. r->maps0: the
   mappings before the attach; s0 and s1 the stats before it and once the drops are seen. */
static void hung_attach_start(struct store_run *r, void *(*run)(void *))
{
    full_device_start(r);
    r->h.kv = r->t.kv;
    keys_of(3, r->h.k);
    cr_assert_eq(kvvm_seq_create(r->t.kv, &r->h.d), 0);
    r->maps0 = all_maps();
    cr_assert_eq(store_test_hang(r->t.kv->store, STORE_HANG_TAIL), 0);
    cr_assert_eq(pthread_create(&r->th, NULL, run, &r->h), 0);
    do {
        usleep(1000);
        tstats(&r->t, &r->s1);
    } while (r->s1.prefix_evictions - r->s0.prefix_evictions < NB);
}

/* The same attach with the store's reads hung but each batch's first (STORE_HANG_TAIL):
   the room is made and dst's pages premapped while the reads are in flight (the live
   mappings grow by every block's pages, set 0's entries are gone, dst still empty); the
   reads released complete short (a miss after the first block): the call succeeds with
   that one block and the drops stand (docs/api.md: the room is made from the cache for
   blocks the store confirmed, a cache replacement). The stats agree (entries: 2 sets and
   the one block; evictions: set 0's NB), the premapped pages not used are given back, and
   the debug build's checker runs after every call. Before the room made ahead, a full
   device dropped nothing before the reads ended: the wait below ran into the deadline. */
Test(store_attach, full_device_room_made_while_reads_in_flight_short_read_keeps_drops)
{
    TH_DEADLINE(60);
    static struct store_run r;
    hung_attach_start(&r, hung_attach_run);
    cr_expect_eq(all_maps() - r.maps0, (uint64_t)NB * NR, "dst's pages not premapped from the "
                 "frames the drops freed: %llu maps", (unsigned long long)(all_maps() - r.maps0));
    struct kvvm_seq_info in = { .size = sizeof in };
    cr_assert_eq(kvvm_seq_info(r.t.kv, r.h.d, &in), 0);
    cr_expect_eq(in.length, 0, "dst's length changed before its bytes were read");
    cr_expect_eq(r.s1.prefix_entries, 2u * NB, "%llu entries while the reads are in flight",
                 (unsigned long long)r.s1.prefix_entries);
    cr_assert_eq(store_test_hang(r.t.kv->store, 0), 0);   /* each hung read completes short */
    cr_assert_eq(pthread_join(r.th, NULL), 0);
    cr_expect_eq(r.h.rc, 1, "the first block read, the others short (misses): %d", r.h.rc);
    cr_assert_eq(kvvm_seq_info(r.t.kv, r.h.d, &in), 0);
    cr_expect_eq(in.length, TPB);
    check_all(r.t.kv, r.h.d, 3, 1);
    tstats(&r.t, &r.s1);
    cr_expect_eq(r.s1.prefix_evictions - r.s0.prefix_evictions, NB, "the drops were not counted "
                 "once each: %llu", (unsigned long long)(r.s1.prefix_evictions -
                                                         r.s0.prefix_evictions));
    cr_expect_eq(r.s1.prefix_entries, 2u * NB + 1, "%llu entries",
                 (unsigned long long)r.s1.prefix_entries);
    cr_expect_eq(r.s1.pages_device_free, (uint64_t)(NB - 1) * NR, "the premapped pages not used "
                 "were not given back: %llu free", (unsigned long long)r.s1.pages_device_free);
    cr_expect_eq(on_device(r.t.kv, 0), 0);
    cr_expect_eq(on_device(r.t.kv, 1), NB);
    cr_expect_eq(on_device(r.t.kv, 2), NB);
    cr_assert_eq(kvvm_seq_free(r.t.kv, r.h.d), 0);
    check_free(r.t.kv, attach_only(r.t.kv, 0), 0, r.b);
    free(r.b);
    tclose(&r.t);
    rmdir_all(r.dir);
}

/* The failed-call rule for the room made ahead: the drops are made in a call frame of
   their own while the reads are in flight, so the locked part's journal cannot take them
   back. Here the locked part fails after them (another thread grows dst meanwhile: not
   empty, -EINVAL): the call fails -EIO, with the error log and last error a failed call
   whose reclaim dropped an entry no undo takes back gives today (swap_call_end), not
   silently; the context stays usable and consistent (checker), dst keeps what the other
   thread grew, nothing of the store's bytes entered, the entries 1 and 2 on the device. */
static void *failing_attach_run(void *p)
{
    struct hung_attach *h = p;
    h->rc = kvvm_prefix_attach(h->kv, h->d, 1, h->k, NB);
    static char why[512];
    snprintf(why, sizeof why, "%s", kvvm_last_error());
    return why;
}

Test(store_attach, full_device_room_made_ahead_then_locked_part_fails)
{
    TH_DEADLINE(60);
    static struct store_run r;
    hung_attach_start(&r, failing_attach_run);
    cr_expect_eq(all_maps() - r.maps0, (uint64_t)NB * NR);
    cr_assert_eq(kvvm_seq_grow(r.t.kv, r.h.d, TPB), 0, "%s", kvvm_last_error());
    cr_assert_eq(store_test_hang(r.t.kv->store, 0), 0);
    void *why;
    cr_assert_eq(pthread_join(r.th, &why), 0);
    cr_expect_eq(r.h.rc, -EIO, "the attach failed after drops no undo takes back: %d (%s)",
                 r.h.rc, (char *)why);
    cr_expect(strstr(why, "could not be undone"), "last error: %s", (char *)why);
    struct kvvm_seq_info in = { .size = sizeof in };
    cr_assert_eq(kvvm_seq_info(r.t.kv, r.h.d, &in), 0);
    cr_expect_eq(in.length, TPB, "dst lost the other thread's grow");
    tstats(&r.t, &r.s1);
    cr_expect_eq(r.s1.prefix_entries, 2u * NB, "%llu entries",
                 (unsigned long long)r.s1.prefix_entries);
    cr_expect_eq(on_device(r.t.kv, 1), NB);
    cr_expect_eq(on_device(r.t.kv, 2), NB);
    cr_assert_eq(kvvm_seq_free(r.t.kv, r.h.d), 0);
    check_free(r.t.kv, attach_only(r.t.kv, 3), 3, r.b);   /* the context goes on: set 3, right */
    free(r.b);
    tclose(&r.t);
    rmdir_all(r.dir);
}

/* The room made ahead moves no data: with KVVM_F_AUTO_SWAP, a host tier and a device full
   of unprotected LIVE sequences (all but one block's pages), the attach's premap maps the
   one block's frames it finds ready and swaps nothing out while the reads are in flight
   (the LIVE sequences leave, if at all, in the locked part's own reclaim, journalled). */
Test(store_attach, room_made_ahead_swaps_no_live_sequence_out)
{
    TH_DEADLINE(60);
    char dir[64], url[96];
    struct kvvm_config c;
    struct tctx t;
    published_store(dir, sizeof dir, url, sizeof url, &c);
    c.flags |= KVVM_F_AUTO_SWAP;
    c.host_budget = (size_t)4 * NB * NR * PS;
    c.map_ahead = 0;              /* the one free block's frames stay ready */
    c.device_min = c.device_low = c.device_high = 0;   /* no watermark reclaim */
    c.create_at_open = 1;
    topen(&t, &c);
    kvvm_seq live[3];
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(kvvm_seq_create(t.kv, &live[i]), 0);
        cr_assert_eq(kvvm_seq_grow(t.kv, live[i], (uint64_t)(i < 2 ? NB : NB - 1) * TPB), 0,
                     "%s", kvvm_last_error());
    }
    cr_assert_eq(kvvm_step(t.kv), 0);           /* unprotected: reclaim could swap them */
    struct kvvm_stats s0, s1;
    tstats(&t, &s0);
    cr_assert_eq(s0.pages_device_free, NR, "%llu free", (unsigned long long)s0.pages_device_free);
    static struct hung_attach h;
    h.kv = t.kv;
    keys_of(3, h.k);
    cr_assert_eq(kvvm_seq_create(t.kv, &h.d), 0);
    uint64_t maps0 = all_maps();
    cr_assert_eq(store_test_hang(t.kv->store, STORE_HANG_TAIL), 0);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, hung_attach_run, &h), 0);
    while (all_maps() < maps0 + NR)             /* the premap's one block, reads hung */
        usleep(1000);
    tstats(&t, &s1);
    cr_expect_eq(s1.swap_outs, s0.swap_outs, "the room made ahead swapped %llu sequences out",
                 (unsigned long long)(s1.swap_outs - s0.swap_outs));
    cr_expect_eq(all_maps(), maps0 + NR, "more than the ready frames premapped");
    cr_assert_eq(store_test_hang(t.kv->store, 0), 0);
    cr_assert_eq(pthread_join(th, NULL), 0);
    cr_expect_eq(h.rc, 1, "%d", h.rc);
    check_all(t.kv, h.d, 3, 1);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(kvvm_seq_free(t.kv, live[i]), 0);
    cr_assert_eq(kvvm_seq_free(t.kv, h.d), 0);
    tclose(&t);
    rmdir_all(dir);
}

/* The fail-at-call-N sweep over a full-device attach from the store: every driver call of
   the traced attach (the room made ahead and the premap's maps, the grow, the copies, the
   releases) failed in turn. At every point: the context dead (a sticky failure), or the
   call returned what dst holds (its bytes the store's), the entries counted as dropped
   and attached (entries = the fill's - evictions + blocks attached), the checker clean;
   a failure other than -EIO changed nothing (no entry dropped, the free pages as before);
   a -EIO of a live context left dst empty (the room made ahead not undoable: the failed
   reclaim's -EIO, docs/api.md). */
struct fs_arg {
    char dir[64], url[96];
    struct kvvm_config c;
    struct tctx t;
    kvvm_key k[NB];
    kvvm_seq dst;
    struct kvvm_stats s0;
};

static void fs_setup(void *p)
{
    struct fs_arg *a = p;
    uint8_t *b = malloc(PS);
    cr_assert(b);
    topen(&a->t, &a->c);
    fill_with_entries(&a->t, b);
    free(b);
    cr_assert_eq(kvvm_seq_create(a->t.kv, &a->dst), 0);
    cr_assert_eq(kvvm_sync(a->t.kv), 0);
    tstats(&a->t, &a->s0);
}

/* 0: all NB blocks; 1 + m: m blocks reported. */
static int fs_call(void *p)
{
    struct fs_arg *a = p;
    int rc = kvvm_prefix_attach(a->t.kv, a->dst, 1, a->k, NB);
    return rc == (int)NB ? 0 : rc < 0 ? rc : 1 + rc;
}

static void fs_teardown(void *p)
{
    struct fs_arg *a = p;
    if (a->t.kv)
        tclose(&a->t);
}

static enum th_sweep_outcome fs_after(void *p, int rc, const char *where)
{
    struct fs_arg *a = p;
    kvvm *kv = a->t.kv;
    if (kvvm_sync(kv) == -EIO)
        return TH_SWEEP_DEAD;
    uint64_t m = rc == 0 ? NB : rc > 0 ? (uint64_t)rc - 1 : 0;
    struct kvvm_seq_info in = { .size = sizeof in };
    UCHK(kvvm_seq_info(kv, a->dst, &in) == 0, "%s: dst", where);
    UCHK(in.length == m * TPB, "%s: dst holds %llu tokens, %llu blocks reported", where,
         (unsigned long long)in.length, (unsigned long long)m);
    uint8_t *b = malloc(PS);
    cr_assert(b);
    bool same = true;
    for (uint32_t r = 0; r < NR && same; r++)
        for (uint64_t blk = 0; blk < m && same; blk++) {
            UCHK(kvvm_seq_read(kv, a->dst, r, blk * PS, b, PS) == 0, "%s: read", where);
            for (size_t j = 0; j < PS && same; j++)
                same = b[j] == pat(3, r, blk * PS + j);
        }
    free(b);
    UCHK(same, "%s: attached bytes", where);
    struct kvvm_stats st;
    tstats(&a->t, &st);
    uint64_t ev = st.prefix_evictions - a->s0.prefix_evictions;
    UCHK(st.prefix_entries == 3u * NB - ev + m, "%s: %llu entries, %llu evicted, %llu "
         "attached", where, (unsigned long long)st.prefix_entries, (unsigned long long)ev,
         (unsigned long long)m);
    if (rc < 0 && rc != -EIO) {
        UCHK(ev == 0, "%s: a failed call dropped %llu entries", where, (unsigned long long)ev);
        UCHK(st.pages_device_free == a->s0.pages_device_free, "%s: %llu pages free, %llu "
             "before", where, (unsigned long long)st.pages_device_free,
             (unsigned long long)a->s0.pages_device_free);
    }
    th_check(kv, where);
    return rc == 0 ? TH_SWEEP_ABSORBED : TH_SWEEP_FAILED;
}

Test(store_attach, sweep_full_device_attach_room_made_ahead)
{
    TH_DEADLINE(600);
    static struct fs_arg a;
    published_store(a.dir, sizeof a.dir, a.url, sizeof a.url, &a.c);
    keys_of(3, a.k);
    struct th_sweep s = { .name = "full-device attach from the store", .arg = &a,
                          .setup = fs_setup, .call = fs_call, .teardown = fs_teardown,
                          .after = fs_after };
    th_sweep_run(&s);
    rmdir_all(a.dir);
}
