/*
 * tests/tsan_threads.c: several threads use one context while the background reclaim thread
 * runs (KVVM_F_AUTO_SWAP, device oversubscribed through the host tier). A plain program, so
 * it runs under ThreadSanitizer (Criterion cannot start there): scripts/test.sh builds a
 * -DKVVM_SANITIZE=thread tree and runs it (ctest -R tsan_threads). Exit 0 = every thread's
 * bytes read back as written, the invariant checker holds, the reclaim thread ran.
 *
 * A budget thread changes the device budget (kvvm_set_budget) and trims (kvvm_trim) all
 * along, so the frame pool thread (on by default) creates and releases frames meanwhile.
 *
 * Each worker owns its sequences (so it knows their bytes): it creates, grows and writes
 * cookies, forks, swaps out and in explicitly, reads back and frees, and steps the context;
 * other workers' pressure makes the reclaim thread and direct reclaim move its sequences.
 * KVVMTEST_TSAN_ITERS scales the iterations (default 300 per thread). With --disk the host
 * tier is small and a spill directory under /var/tmp adds the disk tier, so the spill thread
 * and the I/O engine's completion thread run too (and must spill). With --store a file://
 * store under /var/tmp is on and the workers also publish their sequences' blocks, rewrite
 * them at once (a new lineage: the writes copy on write), and attach and check their own
 * chains (issue 31: the store's copies read the entries' pages while other threads free,
 * swap, truncate and rewrite; the store thread runs too).
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "kvvm.h"
#include "testing/kvvm_testing.h"
#include "cookie.h"

#define KB 4096u
#define NR 2
#define BPT 1024u
#define MAXTOK 32u
#define THREADS 4
#define PER 4               /* sequences per thread */

static kvvm *kv;
static int iters = 300;
static bool store;                  /* --store: publish, rewrite, attach */
static int failures;
static pthread_mutex_t fail_mu = PTHREAD_MUTEX_INITIALIZER;

#define FAIL(...) do {                                      \
        pthread_mutex_lock(&fail_mu);                       \
        failures++;                                         \
        fprintf(stderr, "tsan_threads: " __VA_ARGS__);      \
        fputc('\n', stderr);                                \
        pthread_mutex_unlock(&fail_mu);                     \
    } while (0)

struct seqst {
    kvvm_seq h;
    uint64_t len;
    uint32_t lin;
    uint32_t pub, pub_nb;   /* --store: the lineage last published and its blocks (0: none) */
};

/* ENOMEM is a legal outcome under pressure (everything protected at that moment). */
static bool ok_or_nomem(int rc, const char *what, int tid)
{
    if (rc == 0)
        return true;
    if (rc != -ENOMEM)
        FAIL("thread %d: %s: %d (%s)", tid, what, rc, kvvm_strerror(rc));
    return false;
}

/* Writes the cookies of [from, to). A write can meet -ENOMEM when another thread's step
   ended the sequence's protection and reclaim moved it out while everything else is
   protected: retried after a step; if it still fails the sequence is truncated back. */
static void fill(struct seqst *s, uint64_t from, uint64_t to, int tid)
{
    static __thread uint8_t buf[MAXTOK * BPT];
    for (uint32_t r = 0; r < NR; r++) {
        for (uint64_t o = from * BPT; o < to * BPT; o++)
            buf[o - from * BPT] = cookie(s->lin, r, o);
        int rc = -ENOMEM;
        for (int k = 0; k < 100 && rc == -ENOMEM; k++) {
            rc = kvvm_seq_write(kv, s->h, r, from * BPT, buf, (to - from) * BPT);
            if (rc == -ENOMEM)
                kvvm_step(kv);
        }
        if (!ok_or_nomem(rc, "write", tid)) {
            if ((rc = kvvm_seq_truncate(kv, s->h, from)))
                FAIL("thread %d: truncate after a failed write: %d", tid, rc);
            s->len = from;
            return;
        }
    }
}

static void verify(struct seqst *s, int tid)
{
    static __thread uint8_t buf[MAXTOK * BPT];
    for (uint32_t r = 0; r < NR && s->len; r++) {
        int rc = kvvm_seq_read(kv, s->h, r, 0, buf, s->len * BPT);
        if (!ok_or_nomem(rc, "read", tid))
            return;
        for (uint64_t o = 0; o < s->len * BPT; o++)
            if (buf[o] != cookie(s->lin, r, o)) {
                uint64_t n = 0;
                for (uint64_t p = o; p < s->len * BPT; p++)
                    n += buf[p] != cookie(s->lin, r, p);
                FAIL("thread %d: sequence lineage %u region %u byte %lu of %lu differs "
                     "(got %02x want %02x; %lu bytes differ)", tid, s->lin, r,
                     (unsigned long)o, (unsigned long)(s->len * BPT), buf[o],
                     cookie(s->lin, r, o), (unsigned long)n);
                return;
            }
    }
}

/* Keys of the first nb blocks (4 tokens each) of lineage lin's bytes. */
static void chain_keys(uint32_t lin, size_t nb, kvvm_key *k)
{
    int32_t tok[MAXTOK];
    for (size_t i = 0; i < nb * (KB / BPT); i++)
        tok[i] = (int32_t)(lin * 7777u + i);
    (void)kvvm_prefix_keys(tok, nb * (KB / BPT), KB / BPT, NULL, 0, k, nb);
}

/* --store: publishes q's full blocks under keys of its lineage, then rewrites q at once in a
   new lineage (unique: the same residue modulo THREADS * PER * 1000); the entries keep the
   old bytes. */
static void publish_rewrite(struct seqst *q, int tid)
{
    size_t nb = q->len * BPT / KB;
    kvvm_key k[MAXTOK * BPT / KB];
    if (!nb)
        return;
    chain_keys(q->lin, nb, k);
    int rc = kvvm_prefix_publish(kv, q->h, 1, k, nb);
    if (rc < 0) {
        ok_or_nomem(rc, "publish", tid);
        return;
    }
    q->pub = q->lin;
    q->pub_nb = (uint32_t)nb;
    q->lin += THREADS * PER * 1000;
    fill(q, 0, q->len, tid);
}

/* --store: attaches the chain q published last (what is left of it: local entries, or the
   store's) into a new sequence and checks it holds the bytes of that publish, not q's
   rewrite; drops it now and then (later attaches then read the store). */
static void attach_check(struct seqst *q, uint64_t rnd, int tid)
{
    size_t nb = q->pub_nb;
    kvvm_key k[MAXTOK * BPT / KB];
    kvvm_seq d;
    if (!nb || kvvm_seq_create(kv, &d))
        return;
    chain_keys(q->pub, nb, k);
    int got = kvvm_prefix_attach(kv, d, 1, k, nb);
    if (got > 0) {
        struct seqst ds = { d, (uint64_t)got * (KB / BPT), q->pub, 0, 0 };
        verify(&ds, tid);
    } else if (got < 0) {
        ok_or_nomem(got, "attach", tid);
    }
    int rc = kvvm_seq_free(kv, d);
    if (rc)
        FAIL("thread %d: free attached: %d", tid, rc);
    if (rnd % 4 == 0 && (rc = kvvm_prefix_drop(kv, 1, k, nb)) < 0)
        FAIL("thread %d: drop: %d", tid, rc);
}

static void *worker(void *arg)
{
    int tid = (int)(intptr_t)arg;
    struct seqst s[PER];
    uint64_t rnd = 0x1234567ull * (tid + 1);
    memset(s, 0, sizeof s);
    for (int i = 0; i < PER; i++)
        s[i].lin = (uint32_t)(tid * 1000 + i);
    for (int it = 0; it < iters; it++) {
        rnd = rnd * 6364136223846793005ull + 1442695040888963407ull;
        int i = (int)((rnd >> 33) % PER), op = (int)((rnd >> 40) % (store ? 10 : 8));
        struct seqst *q = &s[i];
        if (!q->h) {
            int rc = kvvm_seq_create(kv, &q->h);
            if (rc) {
                FAIL("thread %d: create: %d", tid, rc);
                q->h = 0;
            }
            q->len = 0;
            continue;
        }
        switch (op) {
        case 0: case 1: case 2: {              /* grow and write */
            uint64_t to = q->len + 1 + (rnd >> 50) % 8;
            if (to > MAXTOK)
                to = MAXTOK;
            if (to > q->len && ok_or_nomem(kvvm_seq_grow(kv, q->h, to), "grow", tid)) {
                uint64_t from = q->len;
                q->len = to;
                fill(q, from, to, tid);
            }
            break;
        }
        case 3:                                /* fork, check the child, free it */
        {
            kvvm_seq c;
            int rc = kvvm_seq_fork(kv, q->h, &c);
            if (rc) {
                if (rc != -ENOSPC)
                    FAIL("thread %d: fork: %d", tid, rc);
                break;
            }
            struct seqst cs = { c, q->len, q->lin, 0, 0 };
            verify(&cs, tid);
            if ((rc = kvvm_seq_free(kv, c)))
                FAIL("thread %d: free child: %d", tid, rc);
            break;
        }
        case 4: {
            int rc = kvvm_seq_swap_out(kv, q->h);
            ok_or_nomem(rc, "swap_out", tid);
            break;
        }
        case 5:
            ok_or_nomem(kvvm_seq_swap_in(kv, q->h), "swap_in", tid);
            break;
        case 6:
            verify(q, tid);
            break;
        case 7:
            if ((rnd >> 20) % 4 == 0) {
                int rc = kvvm_seq_free(kv, q->h);
                if (rc)
                    FAIL("thread %d: free: %d", tid, rc);
                q->h = 0;
            } else if (q->len > 2) {
                int rc = kvvm_seq_truncate(kv, q->h, q->len / 2);
                if (rc)
                    FAIL("thread %d: truncate: %d", tid, rc);
                else
                    q->len /= 2;
            }
            break;
        case 8:
            publish_rewrite(q, tid);
            break;
        case 9:
            attach_check(q, rnd >> 24, tid);
            break;
        }
        if (it % 4 == 0)
            kvvm_step(kv);
    }
    for (int i = 0; i < PER; i++)
        if (s[i].h) {
            kvvm_step(kv);
            verify(&s[i], tid);
            kvvm_seq_free(kv, s[i].h);
        }
    return NULL;
}

/* ---- elastic memory (issue 13): a thread changes the budget and trims while the workers,
   the reclaim thread and the frame pool thread run. A shrink may meet -ENOMEM (everything
   protected at that moment); any other error is a failure. */
static int workers_done;            /* __atomic: set by main when the workers are done */
static unsigned long budget_ok, budget_nomem, trims;

static void *budget_thread(void *arg)
{
    (void)arg;
    for (unsigned i = 0; !__atomic_load_n(&workers_done, __ATOMIC_ACQUIRE); i++) {
        size_t b = (i % 2 ? 48 : 32) * (size_t)KB;
        int rc = kvvm_set_budget(kv, b);
        if (rc == 0)
            budget_ok++;
        else if (rc == -ENOMEM)
            budget_nomem++;
        else
            FAIL("budget thread: set_budget(%zu): %d (%s)", b, rc, kvvm_strerror(rc));
        if (i % 3 == 0) {
            if ((rc = kvvm_trim(kv, (i % 4) * (size_t)KB)))
                FAIL("budget thread: trim: %d", rc);
            trims++;
        }
        usleep(1000);
    }
    int rc = kvvm_set_budget(kv, 48 * (size_t)KB);   /* back to the whole device */
    if (rc && rc != -ENOMEM)
        FAIL("budget thread: final set_budget: %d", rc);
    return NULL;
}

int main(int argc, char **argv)
{
    bool disk = argc > 1 && !strcmp(argv[1], "--disk");
    store = argc > 1 && !strcmp(argv[1], "--store");
    char dir[] = "/var/tmp/kvvm_tsan.XXXXXX", url[64];
    if ((disk || store) && !mkdtemp(dir)) {
        perror("tsan_threads: mkdtemp");
        return 1;
    }
    snprintf(url, sizeof url, "file://%s", dir);
    const char *e = getenv("KVVMTEST_TSAN_ITERS");
    if (e && atoi(e) > 0)
        iters = atoi(e);
    kvvm_set_log(NULL, NULL, KVVM_LOG_ERROR);
    struct kvvm_config c;
    kvvm_config_init(&c);
    c.backend = KVVM_BACKEND_EMULATED;
    c.emu_granule = KB;
    c.page_size = KB;
    c.n_regions = NR;
    c.bytes_per_token = BPT;
    c.max_seqs = THREADS * PER * 2;
    c.max_tokens = MAXTOK;
    /* THREADS x PER sequences of up to 16 pages: 256 pages on a 48-page device */
    c.device_budget = 48 * KB;
    c.host_budget = 512 * KB;
    c.flags = KVVM_F_AUTO_SWAP;
    c.device_min = 0.05;
    c.device_low = 0.20;
    c.device_high = 0.40;
    c.emu_opaque = 1;
    if (disk) {
        c.host_budget = 64 * KB;          /* 16 slots: most swapped pages go on to disk */
        c.spill_dir = dir;
        c.spill_budget = 1024 * KB;
    }
    if (store)
        c.store_url = url;
    int rc = kvvm_open(&c, &kv);
    if (rc) {
        fprintf(stderr, "tsan_threads: kvvm_open: %d\n", rc);
        if (disk || store)
            rmdir(dir);
        return 1;
    }
    pthread_t th[THREADS], bt;
    for (int i = 0; i < THREADS; i++)
        pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i);
    pthread_create(&bt, NULL, budget_thread, NULL);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    __atomic_store_n(&workers_done, 1, __ATOMIC_RELEASE);
    pthread_join(bt, NULL);
    kvvm_sync(kv);
    char why[512] = "";
    if (kvvm_debug_check(kv, why, sizeof why))
        FAIL("invariant: %s", why);
    struct kvvm_stats st = { .size = sizeof st };
    kvvm_stats(kv, &st);
    kvvm_close(kv);
    if (store) {
        char cmd[96];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd))
            fprintf(stderr, "tsan_threads: could not remove %s\n", dir);
        printf("tsan_threads --store: %lu store puts, %lu gets, %lu errors\n",
               (unsigned long)st.store_puts, (unsigned long)st.store_gets,
               (unsigned long)st.store_errors);
        if (st.store_puts == 0) {
            fprintf(stderr, "tsan_threads: nothing reached the store: the run did not test\n");
            return 1;
        }
    }
    if (disk && rmdir(dir)) {
        perror("tsan_threads: the spill directory is not empty after close");
        failures++;
    }
    printf("tsan_threads%s: %d threads x %d ops; %lu swap-outs, %lu swap-ins, %lu background "
           "reclaim runs, %lu direct reclaims, %lu spills, %lu unspills; %d failures\n",
           disk ? " --disk" : "", THREADS, iters, (unsigned long)st.swap_outs,
           (unsigned long)st.swap_ins, (unsigned long)st.reclaim_runs,
           (unsigned long)st.direct_reclaims, (unsigned long)st.spills,
           (unsigned long)st.unspills, failures);
    printf("tsan_threads%s: budget changes %lu done, %lu -ENOMEM; %lu trims; %lu frames "
           "released, %lu created on a caller's thread\n", disk ? " --disk" : "", budget_ok,
           budget_nomem, trims, (unsigned long)st.frames_released,
           (unsigned long)st.frames_created_sync);
    if (disk && st.spills == 0) {
        fprintf(stderr, "tsan_threads: nothing was spilled: the disk run did not test\n");
        return 1;
    }
    if (st.swap_outs == 0) {
        fprintf(stderr, "tsan_threads: nothing was swapped: the test did not test\n");
        return 1;
    }
    return failures ? 1 : 0;
}
