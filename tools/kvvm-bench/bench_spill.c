/*
 * tools/kvvm-bench/bench_spill.c: the disk tier engine (disk/disk.h, through
 * kvvm_testing_spill_* of testing/kvvm_testing.h) against a raw io_uring
 * O_DIRECT loop, both in the same directory with the same preallocated file size, queue
 * depth, buffer count (registered as fixed buffers in both) and I/O size. Each trial runs the
 * three variants in a rotated order (raw, spill io_uring, spill psync), each writing the
 * whole file then reading it back; the median over trials is reported as MiB/s. The spill
 * figures include what the engine adds over the raw loop: checksums (computed on write,
 * verified on read), the request queue and completion delivery.
 * fio's figure is added when fio is on PATH (same size, block size, depth, engine, O_DIRECT).
 *
 * Sequence level (the same file size, page = I/O size, emulated device): sequences of 4 pages
 * are swapped out through a host tier of 16 pages, so every page goes on to disk (swap_out
 * making host room, the spill thread at host marks 0.5/1.0); the figure is the library's
 * bytes_to_disk over the wall time from the first swap_out to kvvm_sync's return (device ->
 * host copies included). Then every sequence is swapped in (disk -> host -> device):
 * bytes_from_disk over the wall time. It runs in the same rotation as the three variants, and
 * its baseline is the same trial's raw loop plus the copies the library adds on the way (a
 * memcpy of the same bytes, io bytes at a time: the emulated device's copy), times added. fio
 * (a reference for the raw loop, not the library) runs once, after the trials.
 */
#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvvm.h"
#include "kvvm_testing.h"

struct bcfg {
    const char *dir;
    size_t file_bytes;   /* preallocated file size (= spill budget) */
    size_t io;           /* I/O size = page size */
    unsigned qd;
    size_t nbuf;         /* buffers of io bytes */
    unsigned char *bufs;
};

/* ---- the raw loop -------------------------------------------------------------------- */

/* One pass over the file (write or read) keeping qd I/Os in flight. Returns seconds, or a
   negative errno. */
static double raw_pass(struct io_uring *ring, const struct bcfg *c, int wr)
{
    size_t n = c->file_bytes / c->io, issued = 0, done = 0;
    uint64_t t0 = bench_now_ns();
    while (done < n) {
        while (issued < n && issued - done < c->qd) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
            if (!sqe)
                break;
            size_t b = issued % c->nbuf;
            void *p = c->bufs + b * c->io;
            if (wr)
                io_uring_prep_write_fixed(sqe, 0, p, (unsigned)c->io, issued * c->io, (int)b);
            else
                io_uring_prep_read_fixed(sqe, 0, p, (unsigned)c->io, issued * c->io, (int)b);
            sqe->flags |= IOSQE_FIXED_FILE;
            issued++;
        }
        int r = io_uring_submit_and_wait(ring, 1);
        if (r < 0 && r != -EINTR)
            return r;
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        io_uring_for_each_cqe(ring, head, cqe) {
            if (cqe->res != (int)c->io) {
                fprintf(stderr, "bench spill: raw %s returned %d\n", wr ? "write" : "read",
                        cqe->res);
                io_uring_cq_advance(ring, seen + 1);
                return cqe->res < 0 ? cqe->res : -EIO;
            }
            seen++;
        }
        io_uring_cq_advance(ring, seen);
        done += seen;
    }
    return (double)(bench_now_ns() - t0) / 1e9;
}

static int raw_trial(const struct bcfg *c, double *w_s, double *r_s)
{
    int err;
    int fd = open(c->dir, O_TMPFILE | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    if (fallocate(fd, 0, 0, (off_t)c->file_bytes) != 0) {
        err = -errno;
        goto out_close;
    }
    struct io_uring ring;
    err = io_uring_queue_init(c->qd * 2, &ring, 0);
    if (err)
        goto out_close;
    struct iovec *iov = calloc(c->nbuf, sizeof(*iov));
    if (!iov) {
        err = -ENOMEM;
        goto out_ring;
    }
    for (size_t k = 0; k < c->nbuf; k++)
        iov[k] = (struct iovec){ c->bufs + k * c->io, c->io };
    err = io_uring_register_buffers(&ring, iov, (unsigned)c->nbuf);
    free(iov);
    if (err)
        goto out_ring;
    err = io_uring_register_files(&ring, &fd, 1);
    if (err)
        goto out_ring;
    double w = raw_pass(&ring, c, 1);
    double r = w >= 0 ? raw_pass(&ring, c, 0) : w;
    if (w < 0 || r < 0) {
        err = (int)(w < 0 ? w : r);
        goto out_ring;
    }
    *w_s = w;
    *r_s = r;
out_ring:
    io_uring_queue_exit(&ring);
out_close:
    close(fd);
    return err;
}

/* ---- the spill engine ---------------------------------------------------------------- */

static int spill_trial(const struct bcfg *c, int e, double *w_s, double *r_s)
{
    struct kvvm_testing_spill_params p = {
        .dir = c->dir, .budget = c->file_bytes, .page_size = c->io, .buf_base = c->bufs,
        .buf_bytes = c->nbuf * c->io, .queue_depth = c->qd, .io_size = c->io, .engine = e };
    kvvm_testing_spill *dk;
    int err = kvvm_testing_spill_open(&p, &dk), have_slots = 0;
    if (err)
        return err;
    size_t n = c->file_bytes / c->io;
    uint32_t *slots = calloc(n, sizeof(*slots));
    struct kvvm_testing_spill_req *reqs = calloc(n, sizeof(*reqs));
    struct kvvm_testing_spill_cqe *cqes = calloc(n, sizeof(*cqes));
    if (!slots || !reqs || !cqes) {
        err = -ENOMEM;
        goto out;
    }
    err = kvvm_testing_spill_slot_alloc(dk, n, slots);
    if (err)
        goto out;
    have_slots = 1;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t k = 0; k < n; k++)
            reqs[k] = (struct kvvm_testing_spill_req){
                pass ? KVVM_TESTING_SPILL_READ : KVVM_TESTING_SPILL_WRITE, slots[k],
                c->bufs + (k % c->nbuf) * c->io, k, NULL };
        uint64_t t0 = bench_now_ns();
        err = kvvm_testing_spill_submit(dk, reqs, n);
        if (err)
            goto out;
        kvvm_testing_spill_wait_all(dk);
        double s = (double)(bench_now_ns() - t0) / 1e9;
        size_t got = kvvm_testing_spill_reap(dk, cqes, n), bad = 0;
        for (size_t k = 0; k < got; k++)
            bad += cqes[k].status != 0;
        if (got != n || bad) {
            fprintf(stderr, "bench spill: %s pass: %zu of %zu completions, %zu failed\n",
                    pass ? "read" : "write", got, n, bad);
            err = -EIO;
            goto out;
        }
        if (pass)
            *r_s = s;
        else
            *w_s = s;
    }
out:
    for (size_t k = 0; have_slots && k < n; k++)
        kvvm_testing_spill_slot_free(dk, slots[k]);
    free(slots);
    free(reqs);
    free(cqes);
    kvvm_testing_spill_close(dk);
    return err;
}

/* ---- fio ----------------------------------------------------------------------------- */

static int have_fio(void)
{
    const char *path = getenv("PATH");
    if (!path)
        return 0;
    char *dup = strdup(path), *save = NULL;
    int found = 0;
    for (char *d = strtok_r(dup, ":", &save); d && !found; d = strtok_r(NULL, ":", &save)) {
        char f[4096];
        snprintf(f, sizeof f, "%s/fio", d);
        found = access(f, X_OK) == 0;
    }
    free(dup);
    return found;
}

/* fio's bandwidth in MiB/s for rw=write or rw=read (terse v3: field 7 read KiB/s, field 48
   write KiB/s), or a negative number on failure. */
static double fio_run(const struct bcfg *c, int wr)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "fio --name=kvvm --directory=%s --size=%zu --bs=%zu --iodepth=%u "
             "--ioengine=io_uring --direct=1 --fixedbufs=1 --rw=%s --output-format=terse "
             "--terse-version=3 --unlink=1 2>/dev/null",
             c->dir, c->file_bytes, c->io, c->qd, wr ? "write" : "read");
    FILE *f = popen(cmd, "r");
    if (!f)
        return -1;
    char line[8192];
    double bw = -1;
    if (fgets(line, sizeof line, f)) {
        int field = 1;
        char *save = NULL;
        for (char *t = strtok_r(line, ";", &save); t; t = strtok_r(NULL, ";", &save), field++)
            if (field == (wr ? 48 : 7))
                bw = atof(t) / 1024.0;
    }
    pclose(f);
    return bw;
}

/* ---- the group ----------------------------------------------------------------------- */

/* The sequence-level trial (see the header). Seconds of each direction per the library's
   byte counters: *w_mib / *r_mib get MiB/s. */
static int seq_trial(const struct bcfg *c, double *w_mib, double *r_mib)
{
    const uint32_t per = 4;          /* pages per sequence */
    size_t n = c->file_bytes / c->io / per;
    struct kvvm_config k;
    bench_config(&k, KVVM_BACKEND_EMULATED, c->io, c->io, 1, c->io, (uint32_t)n, per,
                 n * per * c->io);
    k.host_budget = 4 * per * c->io;
    k.spill_dir = c->dir;
    k.spill_budget = c->file_bytes + 4 * per * c->io;
    k.host_min = 0.25;
    k.host_low = 0.5;
    k.host_high = 1.0;
    kvvm *kv;
    int err = kvvm_open(&k, &kv);
    if (err)
        return err;
    kvvm_seq *s = calloc(n, sizeof *s);
    struct kvvm_stats a = { .size = sizeof a }, z = { .size = sizeof z };
    if (!s) {
        err = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n && !err; i++)
        if (!(err = kvvm_seq_create(kv, &s[i])))
            err = kvvm_seq_grow(kv, s[i], per);
    if (!err)
        err = kvvm_step(kv);
    if (!err)
        err = kvvm_stats(kv, &a);
    uint64_t t0 = bench_now_ns();
    for (size_t i = 0; i < n && !err; i++)
        err = kvvm_seq_swap_out(kv, s[i]);
    if (!err)
        err = kvvm_sync(kv);
    double ws = (double)(bench_now_ns() - t0) / 1e9;
    if (!err)
        err = kvvm_stats(kv, &z);
    if (!err)
        *w_mib = (double)(z.bytes_to_disk - a.bytes_to_disk) / (1 << 20) / ws;
    a = z;
    t0 = bench_now_ns();
    for (size_t i = 0; i < n && !err; i++)
        err = kvvm_seq_swap_in(kv, s[i]);
    if (!err)
        err = kvvm_sync(kv);
    double rs = (double)(bench_now_ns() - t0) / 1e9;
    if (!err)
        err = kvvm_stats(kv, &z);
    if (!err)
        *r_mib = (double)(z.bytes_from_disk - a.bytes_from_disk) / (1 << 20) / rs;
    if (!err && (z.spills < n * per / 2 || z.io_errors || z.checksum_failures))
        err = -EIO;      /* most pages must have gone to disk and back, cleanly */
out:
    free(s);
    kvvm_close(kv);
    return err;
}

/* Seconds to memcpy file_bytes from the registered buffers into a scratch buffer, io bytes
   at a time: what the device<->host copies of a sequence-level trial add over the raw loop
   on the emulated device (its copies are memcpy). Warmed once. */
static double copy_seconds(const struct bcfg *c)
{
    char *dst = malloc(c->io);
    if (!dst)
        return 0;
    memcpy(dst, c->bufs, c->io);
    uint64_t t0 = bench_now_ns();
    for (size_t off = 0; off < c->file_bytes; off += c->io)
        memcpy(dst, c->bufs + (off % (c->nbuf * c->io)), c->io);
    double s = (double)(bench_now_ns() - t0) / 1e9;
    volatile char keep = dst[c->io - 1];
    (void)keep;
    free(dst);
    return s;
}

int bench_spill(struct bench_ctx *b)
{
    struct bcfg c = { .dir = b->spill_dir ? b->spill_dir : "/var/tmp",
                      .file_bytes = b->quick ? ((size_t)128 << 20) : ((size_t)1 << 30),
                      .io = (size_t)2 << 20, .qd = 32, .nbuf = 64 };
    int trials = b->trials > 0 ? b->trials : 5;
    if (c.nbuf * c.io > c.file_bytes)
        c.nbuf = c.file_bytes / c.io;
    if (posix_memalign((void **)&c.bufs, 4096, c.nbuf * c.io) != 0)
        return -ENOMEM;
    for (size_t i = 0; i < c.nbuf * c.io / 8; i++)
        ((uint64_t *)c.bufs)[i] = i * 0x9E3779B97F4A7C15ULL;

    double *v[8];   /* raw w, raw r, uring w, uring r, psync w, psync r, seq w, seq r (MiB/s) */
    double *cp = calloc((size_t)trials, sizeof(double));   /* the copies' seconds */
    int err = cp ? 0 : -ENOMEM;
    for (int k = 0; k < 8; k++)
        if (!(v[k] = calloc((size_t)trials, sizeof(double))))
            err = -ENOMEM;
    double mib = (double)c.file_bytes / (1 << 20);
    for (int t = 0; t < trials && !err; t++) {
        for (int j = 0; j < 4 && !err; j++) {
            int which = (t + j) % 4;   /* rotate the order every trial */
            double ws = 0, rs = 0;
            if (which == 0)
                err = raw_trial(&c, &ws, &rs);
            else if (which == 3)
                err = seq_trial(&c, &ws, &rs);       /* MiB/s already */
            else
                err = spill_trial(&c, which == 1 ? KVVM_TESTING_SPILL_IO_URING
                                                 : KVVM_TESTING_SPILL_PSYNC, &ws, &rs);
            if (err) {
                fprintf(stderr, "bench spill: %s trial failed: %s\n",
                        which == 0 ? "raw" : which == 1 ? "io_uring" : which == 2 ? "psync"
                        : "sequence-level", strerror(-err));
                break;
            }
            v[2 * which][t] = which == 3 ? ws : mib / ws;
            v[2 * which + 1][t] = which == 3 ? rs : mib / rs;
        }
        if (!err)
            cp[t] = copy_seconds(&c);
    }
    if (!err) {
        struct bench_pair p[6] = { 0 };
        for (int t = 0; t < trials; t++) {
            bench_pair_add(&p[0], v[2][t], v[0][t]);
            bench_pair_add(&p[1], v[3][t], v[1][t]);
            bench_pair_add(&p[2], v[4][t], 0);
            bench_pair_add(&p[3], v[5][t], 0);
            /* the sequence rows' baseline: the raw loop plus the device<->host copies of
               the same bytes (the emulator's copy is a memcpy), seconds added */
            bench_pair_add(&p[4], v[6][t], mib / (mib / v[0][t] + cp[t]));
            bench_pair_add(&p[5], v[7][t], mib / (mib / v[1][t] + cp[t]));
        }
        double m[2] = { bench_median(v[0], trials), bench_median(v[1], trials) };
        char op[96];
        const char *base = "raw io_uring O_DIRECT loop";
        snprintf(op, sizeof op, "write io_uring (%zuM io, qd %u)", c.io >> 20, c.qd);
        bench_report_pair(b, "spill", op, &p[0], base, "MiB/s", 0);
        snprintf(op, sizeof op, "read io_uring (%zuM io, qd %u)", c.io >> 20, c.qd);
        bench_report_pair(b, "spill", op, &p[1], base, "MiB/s", 0);
        /* the psync engine has no raw counterpart measured here (a raw io_uring loop is a
           different mechanism): no ratio */
        bench_report_pair(b, "spill", "write psync (fallback engine)", &p[2], NULL, "MiB/s", 0);
        bench_report_pair(b, "spill", "read psync (fallback engine)", &p[3], NULL, "MiB/s", 0);
        /* end to end against the raw loop plus the copies a sequence's bytes make */
        bench_report_pair(b, "spill", "seq swap_out -> host -> disk (kvvm, 4-page seqs)",
                          &p[4], "raw write + the same memcpy", "MiB/s", 0);
        bench_report_pair(b, "spill", "seq swap_in disk -> host -> device (kvvm)", &p[5],
                          "raw read + the same memcpy", "MiB/s", 0);
        if (have_fio()) {
            double fw = fio_run(&c, 1), fr = fio_run(&c, 0);
            if (fw > 0)
                bench_report(b, "spill", "fio write (io_uring, direct)", fw, m[0], base,
                             "MiB/s", 0);
            if (fr > 0)
                bench_report(b, "spill", "fio read (io_uring, direct)", fr, m[1], base,
                             "MiB/s", 0);
        } else {
            printf("spill: fio is not installed: no fio figure (file %zu MiB in %s)\n",
                   c.file_bytes >> 20, c.dir);
        }
    }
    for (int k = 0; k < 8; k++)
        free(v[k]);
    free(cp);
    free(c.bufs);
    return err;
}
