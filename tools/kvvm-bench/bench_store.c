/*
 * tools/kvvm-bench/bench_store.c: the shared store layer (store/store.h) beside raw loops
 * doing the same transfers by the plainest means, on the same server and the same files.
 *
 *  - Redis: a redis-server this group starts on 127.0.0.1 at a free port (--save '', no
 *    persistence; skipped with the reason where redis-server is missing). store_put and
 *    store_get of a batch of n values (two iovecs each, like a block of two regions) beside a
 *    raw pipelined hiredis loop: n x redisAppendCommand("SET %b %b") then n x redisGetReply
 *    (get: "GET", and each value copied into its destination buffer, which the store does
 *    too). The store adds its 96-byte header, the XXH3 checksum of every value (computed on
 *    put, verified on get) and its deadline-bounded I/O.
 *  - File: the same batches in a directory under --spill-dir (default /var/tmp) beside a raw
 *    io_uring loop over the same files: each value written with O_DIRECT to a temporary file
 *    (one ring submission for the batch) then renamed; read back with O_DIRECT into aligned
 *    buffers. The store adds the header (a 4 KiB block per file) and the checksum; the
 *    bench's buffers are 4 KiB aligned and its gets lend them (kvvm_testing_store_get), so
 *    the store reads straight into them, no copy through its staging buffer.
 *
 * Each trial runs the store and the raw loop alternately (the order swapped every trial);
 * the median payload MiB/s over trials is reported beside the raw median, with the spread
 * of the per-trial ratio (bench_report_trials). Value sizes: 64 KiB (batches of 64) and 1 MiB
 * (batches of 32); --quick: 1 MiB only.
 *
 *  - Redis Cluster: 3 masters this group starts (free ports whose bus ports are free too,
 *    redis-cli --cluster create, waited for until cluster_state:ok; skipped with the reason
 *    without redis-server or redis-cli), the same batches through redis-cluster:// beside a
 *    raw pipelined hiredis loop per master (each key's command on its slot's master, then
 *    each master's replies), and the attach below.
 *
 * The store layer is reached through the testing interface (kvvm_testing_store_*).
 *
 *  - Attach from the store (both backends): a context publishes 2 x (trials + 1) sets of
 *    AB_BLOCKS blocks (2 regions of 64 KiB pages; each set its own keys) with the store
 *    attached and waits until its store thread has written them (kvvm_stats' store_puts);
 *    then another context on the same store (its device frames created at open), kept from
 *    trial to trial as a serving engine's, attaches set 0 (warm-up) and, per trial, times
 *    kvvm_seq_create + kvvm_prefix_attach of the next even set (every block read from the
 *    store, checked, brought to the device and entered locally; the sequence freed after,
 *    and kvvm_step run, outside the timed part, so that no attach pays for the last one's
 *    release; its entries kept and evicted by later attaches as the device fills), beside
 *    store_get of the next odd set (the same bytes under other keys: neither side reads
 *    what the other just read, so neither gets a cache the other warmed) into one buffer
 *    allocated as the attach's staging is (2 MiB aligned, transparent huge pages, touched)
 *    (the store layer's GET alone, through the testing interface, its store kept open
 *    too). The order of the two alternates every trial (AB BA AB ...). MiB/s of payload;
 *    us per block printed under it.
 *    The attach pays what the GET does plus the copy to the device and the entries; it
 *    reads into the context's kept attach staging (no page fault in the steady state). The
 *    attaching context has an engine stream (kvvm_set_stream, as an engine sets one): the
 *    copies from the pinned staging are queued on it, and a second row times the call
 *    plus kvvm_sync (the copies complete).
 */
#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <hiredis.h>
#include <liburing.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <sys/uio.h>
#include <unistd.h>

#include "kvvm.h"
#include "kvvm_testing.h"

#define MIB (1024.0 * 1024.0)

struct bstore {
    kvvm_testing_store *st;
    size_t val, n;               /* payload bytes per value, values per batch */
    unsigned char *src, *dst;    /* n * val each, 4 KiB aligned */
    kvvm_key *keys;
    struct iovec *iov_src, *iov_dst;
    struct kvvm_testing_store_item *items;
};

static const struct kvvm_testing_store_layout BL = { 2, 1024, 0 };   /* page_size set per value size */

static int bs_init(struct bstore *b, size_t val, size_t n)
{
    memset(b, 0, sizeof *b);
    b->val = val;
    b->n = n;
    if (posix_memalign((void **)&b->src, 4096, n * val) ||
        posix_memalign((void **)&b->dst, 4096, n * val))
        return -ENOMEM;
    b->keys = calloc(n, sizeof *b->keys);
    b->iov_src = calloc(2 * n, sizeof *b->iov_src);
    b->iov_dst = calloc(2 * n, sizeof *b->iov_dst);
    b->items = calloc(n, sizeof *b->items);
    if (!b->keys || !b->iov_src || !b->iov_dst || !b->items)
        return -ENOMEM;
    for (size_t i = 0; i < n * val; i++)
        b->src[i] = (unsigned char)(i * 2654435761u >> 11);
    for (size_t i = 0; i < n; i++) {
        memcpy(b->keys[i].bytes, &i, sizeof i);
        b->keys[i].bytes[31] = 0x5a;
        b->iov_src[2 * i] = (struct iovec){ b->src + i * val, val / 2 };
        b->iov_src[2 * i + 1] = (struct iovec){ b->src + i * val + val / 2, val - val / 2 };
        b->iov_dst[2 * i] = (struct iovec){ b->dst + i * val, val / 2 };
        b->iov_dst[2 * i + 1] = (struct iovec){ b->dst + i * val + val / 2, val - val / 2 };
    }
    return 0;
}

static void bs_free(struct bstore *b)
{
    free(b->src);
    free(b->dst);
    free(b->keys);
    free(b->iov_src);
    free(b->iov_dst);
    free(b->items);
}

/* One store batch: put (wr) or get. Seconds, or -1 when an item failed. */
static double bs_store(struct bstore *b, int wr)
{
    struct kvvm_testing_store_layout L = BL;
    L.page_size = b->val / 2;
    for (size_t i = 0; i < b->n; i++)
        b->items[i] = (struct kvvm_testing_store_item){ &b->keys[i], wr ? &b->iov_src[2 * i]
                                                           : &b->iov_dst[2 * i], 2, 0 };
    uint64_t t0 = bench_now_ns();
    int got = wr ? kvvm_testing_store_put(b->st, &L, 1, b->items, b->n)
                 : kvvm_testing_store_get(b->st, &L, 1, b->items, b->n);
    double s = (double)(bench_now_ns() - t0) / 1e9;
    return got == (int)b->n ? s : -1;
}

/* ---- Redis ----------------------------------------------------------------------------- */

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

/* Starts redis-server; returns its pid (the connection in *c), or -1. */
static pid_t redis_start(int port, const char *dir, redisContext **c)
{
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        execlp("redis-server", "redis-server", "--port", p, "--bind", "127.0.0.1", "--save",
               "", "--appendonly", "no", "--dir", dir, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; pid > 0 && i < 500; i++) {
        struct timeval tv = { 1, 0 };
        *c = redisConnectWithTimeout("127.0.0.1", port, tv);
        if (*c && !(*c)->err)
            return pid;
        if (*c)
            redisFree(*c);
        *c = NULL;
        if (waitpid(pid, NULL, WNOHANG) == pid)
            return -1;
        usleep(10000);
    }
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    return -1;
}

/* The raw pipelined loop: n SETs (or GETs, each value copied out). Seconds, or -1. */
static double raw_redis(redisContext *c, struct bstore *b, int wr)
{
    char key[64];
    uint64_t t0 = bench_now_ns();
    for (size_t i = 0; i < b->n; i++) {
        snprintf(key, sizeof key, "raw:%zu:%zu", b->val, i);
        int rc = wr ? redisAppendCommand(c, "SET %s %b", key, b->src + i * b->val, b->val)
                    : redisAppendCommand(c, "GET %s", key);
        if (rc != REDIS_OK)
            return -1;
    }
    int ok = 1;
    for (size_t i = 0; i < b->n; i++) {
        redisReply *r = NULL;
        if (redisGetReply(c, (void **)&r) != REDIS_OK || !r)
            return -1;
        if (!wr && r->type == REDIS_REPLY_STRING && (size_t)r->len == b->val)
            memcpy(b->dst + i * b->val, r->str, b->val);
        else if (!wr || r->type != REDIS_REPLY_STATUS)
            ok = 0;
        freeReplyObject(r);
    }
    double s = (double)(bench_now_ns() - t0) / 1e9;
    return ok ? s : -1;
}

/* ---- files ----------------------------------------------------------------------------- */

/* The raw io_uring loop over n files: O_DIRECT write to a temporary name, rename (or
   O_DIRECT read). Seconds, or -1. */
static double raw_files(struct io_uring *ring, const char *dir, struct bstore *b, int wr)
{
    char tmp[512], name[512];
    int *fd = calloc(b->n, sizeof *fd);
    if (!fd)
        return -1;
    uint64_t t0 = bench_now_ns();
    int ok = 1;
    for (size_t i = 0; i < b->n; i++) {
        snprintf(name, sizeof name, "%s/raw_%zu_%zu", dir, b->val, i);
        snprintf(tmp, sizeof tmp, "%s/.raw_%zu_%zu.tmp", dir, b->val, i);
        fd[i] = open(wr ? tmp : name, wr ? O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT
                                         : O_RDONLY | O_DIRECT, 0644);
        struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
        if (fd[i] < 0 || !sqe) {
            ok = 0;
            break;
        }
        if (wr)
            io_uring_prep_write(sqe, fd[i], b->src + i * b->val, (unsigned)b->val, 0);
        else
            io_uring_prep_read(sqe, fd[i], b->dst + i * b->val, (unsigned)b->val, 0);
    }
    if (ok && io_uring_submit_and_wait(ring, (unsigned)b->n) < 0)
        ok = 0;
    struct io_uring_cqe *cqe;
    for (size_t i = 0; ok && i < b->n; i++) {
        if (io_uring_wait_cqe(ring, &cqe) || cqe->res != (int)b->val)
            ok = 0;
        else
            io_uring_cqe_seen(ring, cqe);
    }
    for (size_t i = 0; i < b->n; i++) {
        if (fd[i] > 0)
            close(fd[i]);
        snprintf(name, sizeof name, "%s/raw_%zu_%zu", dir, b->val, i);
        snprintf(tmp, sizeof tmp, "%s/.raw_%zu_%zu.tmp", dir, b->val, i);
        if (ok && wr && rename(tmp, name))
            ok = 0;
    }
    double s = (double)(bench_now_ns() - t0) / 1e9;
    free(fd);
    return ok ? s : -1;
}

/* ---- the trials ------------------------------------------------------------------------ */

/* A line with the machine's load average before a backend's rows: the store checks and
   copies on the caller's thread where the raw loops leave the bytes to the kernel, so on a
   shared machine its ratios move with the load, which a reader needs beside them. */
static void print_load(const char *group)
{
    double l[3];
    FILE *fp = fopen("/proc/loadavg", "r");
    if (fp && fscanf(fp, "%lf %lf %lf", &l[0], &l[1], &l[2]) == 3)
        printf("%s: load average %.2f %.2f %.2f at its start\n", group, l[0], l[1], l[2]);
    if (fp)
        fclose(fp);
}

typedef double (*raw_fn)(void *arg, struct bstore *b, int wr);
struct raw { raw_fn fn; void *arg; const char *name; };

static double raw_redis_fn(void *arg, struct bstore *b, int wr)
{
    return raw_redis(arg, b, wr);
}

struct rawf { struct io_uring ring; const char *dir; };
static double raw_files_fn(void *arg, struct bstore *b, int wr)
{
    struct rawf *r = arg;
    return raw_files(&r->ring, r->dir, b, wr);
}

/* This thread's CPU time (ns): what a transfer costs the caller, which the machine's load
   changes far less than the wall time. */
static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* This thread's minor page faults so far. */
static long minflt(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_THREAD, &ru) == 0 ? ru.ru_minflt : 0;
}

/* Trials of one direction; reports the median MiB/s beside the raw loop's. */
static int trials(struct bench_ctx *bc, const char *group, struct bstore *b,
                  const struct raw *raw, int wr)
{
    int t = bc->trials;
    double *mine = calloc((size_t)t, sizeof *mine), *base = calloc((size_t)t, sizeof *base);
    double *cm = calloc((size_t)t, sizeof *cm), *cb = calloc((size_t)t, sizeof *cb);
    if (!mine || !base || !cm || !cb) {
        free(mine);
        free(base);
        free(cm);
        free(cb);
        return -ENOMEM;
    }
    double mib = (double)(b->n * b->val) / MIB;
    int rc = 0;
    for (int i = 0; i < t && !rc; i++) {
        double s1 = -1, s2 = -1;
        for (int k = 0; k < 2; k++) {
            uint64_t c0 = cpu_ns();
            if ((k == 0) == (i % 2 == 0)) {
                s1 = bs_store(b, wr);
                cm[i] = (double)(cpu_ns() - c0) / 1e6;
            } else {
                s2 = raw->fn(raw->arg, b, wr);
                cb[i] = (double)(cpu_ns() - c0) / 1e6;
            }
        }
        if (s1 <= 0 || s2 <= 0)
            rc = -EIO;
        mine[i] = mib / s1;
        base[i] = mib / s2;
    }
    if (!rc && !wr && memcmp(b->src, b->dst, b->n * b->val) != 0)
        rc = -EBADMSG;
    if (!rc) {
        char op[64];
        snprintf(op, sizeof op, "%s %zu KiB x%zu", wr ? "put" : "get", b->val >> 10, b->n);
        bench_report_trials(bc, group, op, mine, base, t, raw->name, "MiB/s", 0);
        printf("    this thread's CPU per batch (median): store %.2f ms, %s %.2f ms\n",
               bench_median(cm, t), raw->name, bench_median(cb, t));
    } else {
        fprintf(stderr, "kvvm-bench store: %s %s failed (%s)\n", group, wr ? "put" : "get",
                strerror(-rc));
    }
    free(mine);
    free(base);
    free(cm);
    free(cb);
    return rc;
}

static int run_sizes(struct bench_ctx *bc, const char *group, const char *url,
                     const struct raw *raw)
{
    static const size_t sizes[][2] = { { 64 << 10, 64 }, { 1 << 20, 32 } };
    int rc = 0;
    print_load(group);
    for (size_t k = bc->quick ? 1 : 0; k < 2 && !rc; k++) {
        struct bstore b;
        rc = bs_init(&b, sizes[k][0], sizes[k][1]);
        if (!rc)
            rc = kvvm_testing_store_open(url, 5000, &b.st);
        if (!rc)
            rc = trials(bc, group, &b, raw, 1);
        if (!rc)
            rc = trials(bc, group, &b, raw, 0);
        kvvm_testing_store_close(b.st);
        bs_free(&b);
    }
    return rc;
}

/* ---- attach from the store ------------------------------------------------------------- */

#define AB_BLOCKS 128
#define AB_PAGE (64u << 10)
#define AB_TPB 16
#define AB_ROOM 4                /* sets of AB_BLOCKS the attaching context's device holds */

static int ab_open(struct bench_ctx *bc, const char *url, kvvm **kv)
{
    struct kvvm_config c;
    bench_config(&c, bc->backend, AB_PAGE, AB_PAGE, 2, AB_PAGE / AB_TPB, 8,
                 (uint64_t)AB_BLOCKS * AB_TPB, (size_t)AB_ROOM * AB_BLOCKS * 2 * AB_PAGE);
    c.pool_thread = 0;
    c.create_at_open = 1;        /* the frames exist before the attach, as in a serving engine */
    c.store_url = url;
    c.store_timeout_ms = 10000;
    return kvvm_open(&c, kv);
}

/* The keys of set i: the same tokens under salt i (the sets' bytes are alike, their
   entries distinct). */
static void ab_keys(int i, kvvm_key *keys)
{
    static int32_t tok[AB_BLOCKS * AB_TPB];
    for (int t = 0; t < AB_BLOCKS * AB_TPB; t++)
        tok[t] = 7000000 + t;
    (void)kvvm_prefix_keys(tok, (size_t)AB_BLOCKS * AB_TPB, AB_TPB, &i, sizeof i, keys,
                           AB_BLOCKS);
}

/* The publisher: sets sets of AB_BLOCKS blocks of distinct bytes, each written to the store
   before the next is published (the queue's bound drops nothing). */
static int ab_publish(struct bench_ctx *bc, const char *url, int sets)
{
    kvvm_key keys[AB_BLOCKS];
    kvvm *kv = NULL;
    kvvm_seq s;
    unsigned char *page = malloc(AB_PAGE);
    int rc = page ? ab_open(bc, url, &kv) : -ENOMEM;
    if (!rc)
        rc = kvvm_seq_create(kv, &s);
    if (!rc)
        rc = kvvm_seq_grow(kv, s, (uint64_t)AB_BLOCKS * AB_TPB);
    for (uint32_t r = 0; r < 2 && !rc; r++)
        for (size_t b = 0; b < AB_BLOCKS && !rc; b++) {
            for (size_t i = 0; i < AB_PAGE; i++)
                page[i] = (unsigned char)((b * 2 + r) * 131 + i * 7 + (i >> 9));
            rc = kvvm_seq_write(kv, s, r, b * AB_PAGE, page, AB_PAGE);
        }
    struct kvvm_stats st = { .size = sizeof st };
    for (int set = 0; set < sets && !rc; set++) {
        ab_keys(set, keys);
        rc = kvvm_prefix_publish(kv, s, 1, keys, AB_BLOCKS) == AB_BLOCKS ? 0 : -EIO;
        for (int w = 0; !rc && w < 6000; w++) {       /* at most 60 s for the store thread */
            rc = kvvm_stats(kv, &st);
            if (rc || st.store_puts >= (uint64_t)(set + 1) * AB_BLOCKS)
                break;
            nanosleep(&(struct timespec){ 0, 10000000 }, NULL);
        }
        if (!rc && st.store_puts < (uint64_t)(set + 1) * AB_BLOCKS)
            rc = -ETIMEDOUT;
    }
    kvvm_close(kv);
    free(page);
    return rc;
}

/* What the attach side keeps from trial to trial (the steady state of a serving engine:
   one context, one store connection). */
struct ab_state {
    kvvm *kv;
    kvvm_testing_store *st;
    unsigned char *buf;           /* store_get's destination, 4 KiB aligned */
};

/* Attaches set `set` into a new sequence of a.kv (freed after: its entries stay, as a
   finished request's). Seconds of the call, or -1; *done_s: the call and kvvm_sync (its
   copies to the device complete on the engine stream). */
static double ab_attach(struct ab_state *a, int set, double *cpu_ms, long *flt, double *done_s)
{
    kvvm_key keys[AB_BLOCKS];
    kvvm_seq d;
    ab_keys(set, keys);
    long f0 = minflt();
    uint64_t t0 = bench_now_ns(), c0 = cpu_ns();
    int got = kvvm_seq_create(a->kv, &d) ? -1 : kvvm_prefix_attach(a->kv, d, 1, keys,
                                                                     AB_BLOCKS);
    double s = (double)(bench_now_ns() - t0) / 1e9;
    *cpu_ms = (double)(cpu_ns() - c0) / 1e6;
    *flt = minflt() - f0;
    if (kvvm_sync(a->kv))
        got = -1;
    *done_s = (double)(bench_now_ns() - t0) / 1e9;
    if (got >= 0)
        (void)kvvm_seq_free(a->kv, d);
    (void)kvvm_step(a->kv);       /* the release reaped here, not in the next attach */
    return got == AB_BLOCKS ? s : -1;
}

/* store_get of set `set` into a.buf. Seconds, or -1. */
static double ab_get(struct ab_state *a, int set, double *cpu_ms, long *flt)
{
    struct kvvm_testing_store_layout L = { 2, AB_PAGE / AB_TPB, AB_PAGE };
    struct kvvm_testing_store_item it[AB_BLOCKS];
    struct iovec iov[2 * AB_BLOCKS];
    kvvm_key keys[AB_BLOCKS];
    ab_keys(set, keys);
    for (size_t b = 0; b < AB_BLOCKS; b++) {
        iov[2 * b] = (struct iovec){ a->buf + 2 * b * AB_PAGE, AB_PAGE };
        iov[2 * b + 1] = (struct iovec){ a->buf + (2 * b + 1) * AB_PAGE, AB_PAGE };
        it[b] = (struct kvvm_testing_store_item){ &keys[b], &iov[2 * b], 2, 0 };
    }
    long f0 = minflt();
    uint64_t t0 = bench_now_ns(), c0 = cpu_ns();
    int got = kvvm_testing_store_get(a->st, &L, 1, it, AB_BLOCKS);
    double s = (double)(bench_now_ns() - t0) / 1e9;
    *cpu_ms = (double)(cpu_ns() - c0) / 1e6;
    *flt = minflt() - f0;
    return got == AB_BLOCKS ? s : -1;
}

static int bench_store_attach(struct bench_ctx *bc, const char *group, const char *url)
{
    int t = bc->trials > 0 ? bc->trials : 5;
    struct ab_state a = { 0 };
    double *ta = calloc((size_t)t, sizeof *ta), *tg = calloc((size_t)t, sizeof *tg);
    double *ca = calloc((size_t)t, sizeof *ca), *cg = calloc((size_t)t, sizeof *cg);
    double *td = calloc((size_t)t, sizeof *td);
    long flt[2] = { 0, 0 };       /* the last trial's */
    int rc = ta && tg && ca && cg && td && !posix_memalign((void **)&a.buf, (size_t)2 << 20,
                                                     (size_t)AB_BLOCKS * 2 * AB_PAGE)
             ? ab_publish(bc, url, 2 * (t + 1)) : -ENOMEM;
    if (!rc)                      /* as the attach's staging: huge pages where given, touched */
        (void)madvise(a.buf, (size_t)AB_BLOCKS * 2 * AB_PAGE, MADV_HUGEPAGE);
    for (size_t off = 0; !rc && off < (size_t)AB_BLOCKS * 2 * AB_PAGE; off += 4096)
        a.buf[off] = 0;
    if (!rc)
        rc = ab_open(bc, url, &a.kv);
    void *stream = NULL;          /* an engine stream, as an engine sets one */
    if (!rc && !(rc = kvvm_stream_create(a.kv, &stream)))
        rc = kvvm_set_stream(a.kv, stream);
    if (!rc)
        rc = kvvm_testing_store_open(url, 10000, &a.st);
    double mib = (double)AB_BLOCKS * 2 * AB_PAGE / MIB, c0[2] = { 0, 0 }, s0[2] = { 0, 0 }, dw;
    long f0[2] = { 0, 0 };
    /* warm-up: one attach (set 0) and one get, connections made, buffers touched: the
       context's first attach (its staging allocated) and the store's first get, printed */
    if (!rc && ((s0[0] = ab_attach(&a, 0, &c0[0], &f0[0], &dw)) <= 0 ||
                (s0[1] = ab_get(&a, 1, &c0[1], &f0[1])) <= 0))
        rc = -EIO;
    for (int i = 0; i < t && !rc; i++) {
        double sa = 0, sg = 0, sd = 0;
        for (int k = 0; k < 2; k++) {
            if ((k == 0) == (i % 2 != 0))
                sg = ab_get(&a, 2 * (i + 1) + 1, &cg[i], &flt[1]);
            else
                sa = ab_attach(&a, 2 * (i + 1), &ca[i], &flt[0], &sd);
        }
        if (sa <= 0 || sg <= 0)
            rc = -EIO;
        else
            ta[i] = mib / sa, tg[i] = mib / sg, td[i] = mib / sd;
    }
    if (!rc) {
        /* reported before any median: bench_median sorts, and the spread pairs each
           trial's attach with that trial's get */
        bench_report_trials(bc, group, "attach 128 blocks (2 x 64 KiB) from the store", ta, tg,
                            t, "store_get of the same entries", "MiB/s", 0);
        bench_report_trials(bc, group, "attach 128 blocks, its copies complete (+kvvm_sync)", td,
                            tg, t, "store_get of the same entries", "MiB/s", 0);
        /* the device holds AB_ROOM sets: the warm-up's and the first trials' attaches find
           ready frames (premapped while the store reads), the later ones a device full of
           the earlier sets' entries (room made by dropping them, then premapped, while the
           store reads) */
        double rr[2][BENCH_MAX_TRIALS];
        int nr[2] = { 0, 0 };
        for (int i = 0; i < t && i < BENCH_MAX_TRIALS; i++) {
            int full = i + 1 >= AB_ROOM;
            rr[full][nr[full]++] = ta[i] / tg[i];
        }
        printf("    attach / store_get per trial (median): %.2fx over the %d trials whose device "
               "had room, %.2fx over the %d with a device full of cached entries\n",
               bench_median(rr[0], nr[0]), nr[0], bench_median(rr[1], nr[1]), nr[1]);
        double ma = bench_median(ta, t), mg = bench_median(tg, t);
        printf("    per block: attach %.0f us, store_get %.0f us; this thread's CPU (median): "
               "attach %.1f ms, store_get %.1f ms; its minor page faults (last trial): attach "
               "%ld, store_get %ld\n", mib / ma / AB_BLOCKS * 1e6, mib / mg / AB_BLOCKS * 1e6,
               bench_median(ca, t), bench_median(cg, t), flt[0], flt[1]);
        printf("    the first of each (one sample: a fresh context's first attach, its staging "
               "allocated; the store's first get): attach %.0f us per block, CPU %.1f ms, %ld "
               "minor faults; store_get %.0f us per block, CPU %.1f ms, %ld minor faults\n",
               s0[0] * 1e6 / AB_BLOCKS, c0[0], f0[0], s0[1] * 1e6 / AB_BLOCKS, c0[1], f0[1]);
    } else {
        fprintf(stderr, "kvvm-bench store: %s attach failed (%s)\n", group, strerror(-rc));
    }
    kvvm_testing_store_close(a.st);
    kvvm_close(a.kv);
    free(a.buf);
    free(ta);
    free(tg);
    free(ca);
    free(cg);
    free(td);
    return rc;
}

/* Whether KVVM_BENCH_STORE (a comma-separated list of parts: redis, redis-cluster, file,
   attach) names part; unset or empty: every part runs. A quicker loop for one backend's
   put / get rows while working on it (its attach rows only with "attach" listed). */
static int part_on(const char *part)
{
    const char *l = getenv("KVVM_BENCH_STORE");
    size_t n = strlen(part);
    if (!l || !*l)
        return 1;
    for (const char *p = l; *p; p += strcspn(p, ","), p += *p == ',')
        if (strcspn(p, ",") == n && !strncmp(p, part, n))
            return 1;
    return 0;
}

static int bench_store_redis(struct bench_ctx *bc)
{
    if (system("command -v redis-server >/dev/null 2>&1") != 0) {
        printf("store: redis skipped: redis-server is not installed\n");
        return 0;
    }
    char dir[] = "/tmp/kvvm-bench-redis-XXXXXX", url[64];
    int port = free_port();
    redisContext *c = NULL;
    if (!mkdtemp(dir) || port < 0)
        return -errno;
    pid_t pid = redis_start(port, dir, &c);
    int rc = pid < 0 ? -ECONNREFUSED : 0;
    if (!rc) {
        snprintf(url, sizeof url, "redis://127.0.0.1:%d", port);
        struct raw raw = { raw_redis_fn, c, "hiredis" };
        rc = run_sizes(bc, "store/redis", url, &raw);
        if (!rc && part_on("attach"))
            rc = bench_store_attach(bc, "store/redis", url);
        redisFree(c);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "kvvm-bench store: could not remove %s\n", dir);
    return rc;
}

static int bench_store_file(struct bench_ctx *bc)
{
    char dir[512], url[600];
    snprintf(dir, sizeof dir, "%s/kvvm-bench-store-XXXXXX", bc->spill_dir);
    if (!mkdtemp(dir))
        return -errno;
    snprintf(url, sizeof url, "file://%s", dir);
    struct rawf rf = { .dir = dir };
    int rc = io_uring_queue_init(128, &rf.ring, 0);
    if (!rc) {
        struct raw raw = { raw_files_fn, &rf, "io_uring" };
        rc = run_sizes(bc, "store/file", url, &raw);
        if (!rc && part_on("attach"))
            rc = bench_store_attach(bc, "store/file", url);
        io_uring_queue_exit(&rf.ring);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "kvvm-bench store: could not remove %s\n", dir);
    return rc;
}

/* ---- Redis Cluster ----------------------------------------------------------------------- */

#define CLN 3                    /* masters */

struct rcl {
    redisContext *c[CLN];
    uint16_t slot[16384];        /* master index of each slot */
};

static unsigned crc16_slot(const char *k, size_t n)
{
    uint16_t c = 0;
    for (size_t i = 0; i < n; i++) {
        c ^= (uint16_t)((unsigned char)k[i] << 8);
        for (int b = 0; b < 8; b++)
            c = (uint16_t)(c & 0x8000 ? (c << 1) ^ 0x1021 : c << 1);
    }
    return c & 16383u;
}

/* The raw pipelined loop over the cluster: each key's commands to its slot's master (n
   appends), then each master's replies in order. Seconds, or -1. */
static double raw_cluster(struct rcl *rc, struct bstore *b, int wr)
{
    char key[64];
    size_t cnt[CLN] = { 0 };
    int *at = malloc(b->n * sizeof *at), ok = at != NULL;
    uint64_t t0 = bench_now_ns();
    for (size_t i = 0; ok && i < b->n; i++) {
        int len = snprintf(key, sizeof key, "raw:%zu:%zu", b->val, i);
        redisContext *c = rc->c[at[i] = rc->slot[crc16_slot(key, (size_t)len)]];
        cnt[at[i]]++;
        ok = (wr ? redisAppendCommand(c, "SET %s %b", key, b->src + i * b->val, b->val)
                 : redisAppendCommand(c, "GET %s", key)) == REDIS_OK;
    }
    for (int m = 0; ok && m < CLN; m++)
        for (size_t i = 0; ok && i < b->n; i++) {
            redisReply *r = NULL;
            if (at[i] != m)
                continue;
            if (redisGetReply(rc->c[m], (void **)&r) != REDIS_OK || !r) {
                ok = 0;
                break;
            }
            if (!wr && r->type == REDIS_REPLY_STRING && (size_t)r->len == b->val)
                memcpy(b->dst + i * b->val, r->str, b->val);
            else if (!wr || r->type != REDIS_REPLY_STATUS)
                ok = 0;
            freeReplyObject(r);
        }
    double s = (double)(bench_now_ns() - t0) / 1e9;
    free(at);
    return ok ? s : -1;
}

static double raw_cluster_fn(void *arg, struct bstore *b, int wr)
{
    return raw_cluster(arg, b, wr);
}

/* The slot map (CLUSTER SLOTS of master 0) onto the masters' ports. 0 or -EIO. */
static int rcl_map(struct rcl *rc, const int *port)
{
    redisReply *r = redisCommand(rc->c[0], "CLUSTER SLOTS");
    int ok = r && r->type == REDIS_REPLY_ARRAY && r->elements > 0;
    for (size_t e = 0; ok && e < r->elements; e++) {
        redisReply *x = r->element[e];
        int m = -1;
        for (int k = 0; x->elements >= 3 && k < CLN; k++)
            if (x->element[2]->element[1]->integer == port[k])
                m = k;
        for (long long sl = x->element[0]->integer; m >= 0 && sl <= x->element[1]->integer;
             sl++)
            rc->slot[sl] = (uint16_t)m;
        ok = m >= 0;
    }
    if (r)
        freeReplyObject(r);
    return ok ? 0 : -EIO;
}

/* A free port whose cluster bus port (+10000) is free too. */
static int cl_port(void)
{
    for (int t = 0; t < 100; t++) {
        int p = free_port();
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)(p + 10000)),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        int ok = p > 0 && p + 10000 < 65536 && fd >= 0 &&
                 bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
        if (fd >= 0)
            close(fd);
        if (ok)
            return p;
    }
    return -1;
}

/* Starts CLN cluster nodes (redis-server --cluster-enabled yes), creates the cluster
   (redis-cli --cluster create) and waits until every node says cluster_state:ok. 0 or
   -ECONNREFUSED (what was started is in pid[] for the caller to kill). */
static int cluster_start(const char *dir, int *port, pid_t *pid, struct rcl *rc)
{
    char cmd[512];
    int len = snprintf(cmd, sizeof cmd, "redis-cli --cluster create");
    for (int k = 0; k < CLN; k++) {
        char p[16], conf[300];
        if ((port[k] = cl_port()) < 0)
            return -ECONNREFUSED;
        snprintf(p, sizeof p, "%d", port[k]);
        snprintf(conf, sizeof conf, "%s/nodes-%d.conf", dir, port[k]);
        pid[k] = fork();
        if (pid[k] == 0) {
            int null = open("/dev/null", O_WRONLY);
            dup2(null, 1);
            dup2(null, 2);
            execlp("redis-server", "redis-server", "--port", p, "--bind", "127.0.0.1",
                   "--cluster-enabled", "yes", "--cluster-config-file", conf, "--save", "",
                   "--appendonly", "no", "--dir", dir, (char *)NULL);
            _exit(127);
        }
        if (pid[k] < 0)
            return -ECONNREFUSED;
        len += snprintf(cmd + len, sizeof cmd - (size_t)len, " 127.0.0.1:%d", port[k]);
    }
    for (int k = 0; k < CLN; k++) {
        for (int i = 0; !rc->c[k] && i < 500; i++) {
            struct timeval tv = { 1, 0 };
            rc->c[k] = redisConnectWithTimeout("127.0.0.1", port[k], tv);
            if (rc->c[k] && rc->c[k]->err) {
                redisFree(rc->c[k]);
                rc->c[k] = NULL;
                usleep(10000);
            }
        }
        if (!rc->c[k])
            return -ECONNREFUSED;
    }
    snprintf(cmd + len, sizeof cmd - (size_t)len, " --cluster-yes >/dev/null 2>&1");
    if (system(cmd) != 0)
        return -ECONNREFUSED;
    for (int k = 0; k < CLN; k++)
        for (int i = 0;; i++) {
            redisReply *r = redisCommand(rc->c[k], "CLUSTER INFO");
            int ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok");
            if (r)
                freeReplyObject(r);
            if (ok)
                break;
            if (i == 3000)
                return -ECONNREFUSED;
            usleep(10000);
        }
    return rcl_map(rc, port);
}

static int bench_store_cluster(struct bench_ctx *bc)
{
    if (system("command -v redis-server >/dev/null 2>&1 && "
               "command -v redis-cli >/dev/null 2>&1") != 0) {
        printf("store: redis-cluster skipped: redis-server or redis-cli is not installed\n");
        return 0;
    }
    char dir[] = "/tmp/kvvm-bench-cluster-XXXXXX", url[128];
    int port[CLN] = { 0 };
    pid_t pid[CLN] = { 0 };
    struct rcl *rc = calloc(1, sizeof *rc);
    if (!rc || !mkdtemp(dir)) {
        free(rc);
        return -errno;
    }
    int r = cluster_start(dir, port, pid, rc);
    if (!r) {
        snprintf(url, sizeof url, "redis-cluster://127.0.0.1:%d,127.0.0.1:%d", port[0],
                 port[1]);
        struct raw raw = { raw_cluster_fn, rc, "hiredis/node" };
        r = run_sizes(bc, "store/redis-cluster", url, &raw);
        if (!r && part_on("attach"))
            r = bench_store_attach(bc, "store/redis-cluster", url);
    } else {
        fprintf(stderr, "kvvm-bench store: the cluster did not start\n");
    }
    for (int k = 0; k < CLN; k++) {
        if (rc->c[k])
            redisFree(rc->c[k]);
        if (pid[k] > 0) {
            kill(pid[k], SIGKILL);
            waitpid(pid[k], NULL, 0);
        }
    }
    free(rc);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "kvvm-bench store: could not remove %s\n", dir);
    return r;
}

int bench_store(struct bench_ctx *bc)
{
    int rc = part_on("redis") ? bench_store_redis(bc) : 0;
    int rcl = part_on("redis-cluster") ? bench_store_cluster(bc) : 0;
    int rf = part_on("file") ? bench_store_file(bc) : 0;
    return rc ? rc : rcl ? rcl : rf;
}
