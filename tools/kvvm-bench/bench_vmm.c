/*
 * tools/kvvm-bench/bench_vmm.c: the vmm layer's per-operation costs beside raw baselines
 * measured in the same run (issue 2, item 7).
 *
 * Figures: medians of samples. A sample times one operation on 64 pages (or one copy) on
 * the vmm side and then the same on the raw side; one untimed warm-up sample comes first.
 * Each of --trials trials takes 16 samples of reserve, map, unmap and alias; 2 MiB / page
 * samples (1 to 16) of create/release, whose cost grows with the page; 4 copies (2 with
 * --quick).
 *   reserve             vmm_reserve of the bench's range (vmm_unreserve untimed), ns/op
 *   create / release    vmm_phys_create / vmm_phys_release of one granule page, ns/op
 *   map+access 1 page   vmm_map_run(n = 1), ns/op
 *   map_run n=1/8/64    vmm_map_run of n pages (one set-access per run), ns/page
 *   unmap 1 page        vmm_unmap of one page, ns/op; unmap run of 64, ns/page
 *   alias map           vmm_map_run(n = 1) of a handle already mapped elsewhere, ns/op
 *   copy htod/dtoh/dtod vmm_copy_* + vmm_stream_sync on a non-blocking stream, MiB/s
 *                       (10^9 bytes/s); again on the NULL stream (on the emulated device
 *                       that runs in the caller: the copy without the worker hand-off)
 *
 * The vmm layer is reached through the testing interface (kvvm_testing_vmm_*,
 * testing/kvvm_testing.h).
 *
 * Raw baselines:
 *   emulated device: the bare system calls the emulator performs, on one memfd of our own
 *     (reserve = mmap PROT_NONE; create = poisoning a hole-punched range, release = punching
 *     it; map+access = mmap MAP_FIXED|MAP_SHARED of the range + mprotect over the run; unmap =
 *     mmap anonymous PROT_NONE MAP_FIXED; copies = memcpy through a view of the memfd).
 *     The ratio is thus the emulator's + vmm layer's bookkeeping over the kernel's own cost.
 *   cuda: the same driver calls made directly through the vmm layer's driver table
 *     (kvvm_testing_raw_*, one driver call each: cuMemAddressReserve,
 *     cuMemCreate, cuMemMap + cuMemSetAccess, cuMemUnmap, cuMemcpy*Async +
 *     cuStreamSynchronize); the ratio is the vmm layer's overhead over the bare driver.
 */
#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kvvm.h"
#include "kvvm_testing.h"

#define GROUP "vmm"
#define MAP_REPS 16             /* samples per trial of reserve, map, unmap and alias (cheap) */

struct vb {
    struct bench_ctx *b;
    kvvm_testing_vmm *v;
    int cuda;                   /* backend is the real driver: raw side = bare driver calls */
    size_t g;                   /* granule = page size */
    size_t k;                   /* pages per sample of the map figures (64) */
    size_t kc;                  /* pages per sample of create/release (<= k) */
    size_t cp;                  /* pages per copy buffer */
    int reps;                   /* samples per trial of create/release: 2 MiB / page, <= 16 */
    int copy_reps;              /* samples (one copy each) per trial of the copy figures */

    /* vmm side: one reservation = region A (k pages), B (k pages, aliases), C (2 cp pages) */
    size_t res_bytes;
    uint64_t base;
    kvvm_testing_page *h;       /* k pages, for the map figures */
    kvvm_testing_page *hc;      /* 2 cp pages, mapped at C for the copies */
    kvvm_testing_stream s;
    void *host;                 /* cp pages of host memory (pinned through the vmm if it can) */
    int host_pinned;

    /* raw side, emulated: one memfd of k + 2 cp pages, a view of it, one PROT_NONE range */
    int fd;
    char *view;
    char *rva;
    /* raw side, cuda */
    int dev;
    uint64_t rbase;
    unsigned long long *rh;     /* k + 2 cp raw handles */
};

static uint64_t va_a(struct vb *s, size_t i) { return s->base + i * s->g; }
static uint64_t va_b(struct vb *s, size_t i) { return s->base + (s->k + i) * s->g; }
static uint64_t va_c(struct vb *s, size_t i) { return s->base + (2 * s->k + i) * s->g; }
static char *raw_a(struct vb *s, size_t i) { return s->rva + i * s->g; }
static char *raw_b(struct vb *s, size_t i) { return s->rva + (s->k + i) * s->g; }
static uint64_t rcu_a(struct vb *s, size_t i) { return s->rbase + i * s->g; }
static uint64_t rcu_b(struct vb *s, size_t i) { return s->rbase + (s->k + i) * s->g; }
static uint64_t rcu_c(struct vb *s, size_t i) { return s->rbase + (2 * s->k + i) * s->g; }

static int cu_err(struct vb *s, const char *what, int r)
{
    fprintf(stderr, "kvvm-bench: %s: %s\n", what, kvvm_testing_raw_errstr(s->v, r));
    return -EIO;
}
#define CU(s, call) do { int r_ = (call); if (r_) return cu_err((s), #call, r_); } while (0)

static int sys_err(const char *what)
{
    int e = errno;
    fprintf(stderr, "kvvm-bench: %s: %s\n", what, strerror(e));
    return -e;
}

/* ---- raw primitives (the emulated side replicates vmm/emu/'s system calls) ----------- */

static int raw_unmap(struct vb *s, char *va, size_t n)
{
    if (mmap(va, n * s->g, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
             -1, 0) == MAP_FAILED)
        return sys_err("mmap anonymous PROT_NONE");
    return 0;
}

/* Maps memfd pages first_page.. at va, one mmap each, then one mprotect over the run.
   All or nothing. */
static int raw_map(struct vb *s, char *va, size_t first_page, size_t n)
{
    size_t i;
    int rc;

    for (i = 0; i < n; i++)
        if (mmap(va + i * s->g, s->g, PROT_NONE, MAP_FIXED | MAP_SHARED, s->fd,
                 (off_t)((first_page + i) * s->g)) == MAP_FAILED) {
            rc = sys_err("mmap MAP_FIXED|MAP_SHARED");
            goto out_unmap;
        }
    if (mprotect(va, n * s->g, PROT_READ | PROT_WRITE)) {
        rc = sys_err("mprotect");
        goto out_unmap;
    }
    return 0;
out_unmap:
    if (i)
        raw_unmap(s, va, i);
    return rc;
}

/* cuMemMap of each handle at va.., then one cuMemSetAccess over the run. All or nothing. */
static int rcu_map(struct vb *s, uint64_t va, const unsigned long long *h, size_t n)
{
    size_t i;
    int r = 0;

    for (i = 0; i < n; i++)
        if ((r = kvvm_testing_raw_map(s->v, va + i * s->g, s->g, h[i])))
            goto out_unmap;
    if (!(r = kvvm_testing_raw_set_access(s->v, s->dev, va, n * s->g)))
        return 0;
out_unmap:
    while (i-- > 0)
        kvvm_testing_raw_unmap(s->v, va + i * s->g, s->g);
    return cu_err(s, i < n ? "cuMemMap" : "cuMemSetAccess", r);
}

static int rcu_unmap(struct vb *s, uint64_t va, size_t n)
{
    CU(s, kvvm_testing_raw_unmap(s->v, va, n * s->g));
    return 0;
}

/* ---- one sample of each figure: raw 0 = the vmm side, 1 = the raw side ------------------ */

typedef int (*trial_fn)(struct vb *s, int raw, size_t arg, double out[2]);

static int t_reserve(struct vb *s, int raw, size_t arg, double out[2])
{
    uint64_t total = 0;
    int rc = 0;
    (void)arg;
    for (size_t i = 0; i < s->k; i++) {
        uint64_t t0 = bench_now_ns(), base;
        if (!raw) {
            rc = kvvm_testing_vmm_reserve(s->v, s->res_bytes, &base);
            total += bench_now_ns() - t0;
            if (rc)
                return rc;
            kvvm_testing_vmm_unreserve(s->v);
        } else if (s->cuda) {
            uint64_t p;
            CU(s, kvvm_testing_raw_reserve(s->v, &p, s->res_bytes, s->g));
            total += bench_now_ns() - t0;
            CU(s, kvvm_testing_raw_free(s->v, p, s->res_bytes));
        } else {
            /* As the emulator: over-reserve by the alignment (the granule), trim both ends. */
            char *p = mmap(NULL, s->res_bytes + s->g, PROT_NONE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (p == MAP_FAILED)
                return sys_err("mmap PROT_NONE");
            uintptr_t a = ((uintptr_t)p + s->g - 1) & ~(uintptr_t)(s->g - 1);
            if (a > (uintptr_t)p)
                munmap(p, a - (uintptr_t)p);
            if ((uintptr_t)p + s->g > a)
                munmap((void *)(a + s->res_bytes), (uintptr_t)p + s->g - a);
            total += bench_now_ns() - t0;
            munmap((void *)a, s->res_bytes);
        }
    }
    out[0] = (double)total / (double)s->k;
    return 0;
}

/* create kc pages, then release them: out[0] create ns/op, out[1] release ns/op. */
static int t_create(struct vb *s, int raw, size_t arg, double out[2])
{
    size_t i = 0;
    int rc = 0;
    uint64_t t0, t1 = 0, t2;
    (void)arg;

    t0 = bench_now_ns();
    if (!raw) {
        for (; i < s->kc; i++)
            if ((rc = kvvm_testing_vmm_phys_create(s->v, s->g, &s->h[i])))
                goto out_release;
    } else if (s->cuda) {
        for (; i < s->kc; i++)
            if ((rc = kvvm_testing_raw_create(s->v, s->dev, s->g, &s->rh[i]))) {
                rc = cu_err(s, "cuMemCreate", rc);
                goto out_release;
            }
    } else {
        /* What the emulator does for a new handle: poison a range of its memfd (the range was
           hole-punched by the last release, so this allocates the memory too). */
        for (; i < s->kc; i++)
            memset(s->view + i * s->g, KVVM_TESTING_EMU_POISON, s->g);
    }
    t1 = bench_now_ns();
out_release:
    while (i-- > 0) {
        if (!raw)
            kvvm_testing_vmm_phys_release(s->v, s->h[i]);
        else if (s->cuda)
            kvvm_testing_raw_release(s->v, s->rh[i]);
        else if (fallocate(s->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                           (off_t)(i * s->g), (off_t)s->g) && !rc)
            rc = sys_err("fallocate PUNCH_HOLE");
    }
    t2 = bench_now_ns();
    if (rc)
        return rc;
    out[0] = (double)(t1 - t0) / (double)s->kc;
    out[1] = (double)(t2 - t1) / (double)s->kc;
    return 0;
}

/* Maps the k pages of region A in runs of arg pages, then unmaps the same runs:
   out[0] map ns/page, out[1] unmap ns/page. */
static int t_map_run(struct vb *s, int raw, size_t n, double out[2])
{
    size_t runs = s->k / n, r = 0;
    int rc = 0;
    uint64_t t0, t1 = 0, t2;

    t0 = bench_now_ns();
    for (; r < runs; r++) {
        size_t p = r * n;
        if (!raw)
            rc = kvvm_testing_vmm_map_run(s->v, va_a(s, p), &s->h[p], n, s->g);
        else if (s->cuda)
            rc = rcu_map(s, rcu_a(s, p), &s->rh[p], n);
        else
            rc = raw_map(s, raw_a(s, p), p, n);
        if (rc)
            goto out_unmap;
    }
    t1 = bench_now_ns();
out_unmap:
    for (size_t q = 0; q < r; q++) {
        size_t p = q * n;
        int e;
        if (!raw)
            e = kvvm_testing_vmm_unmap(s->v, va_a(s, p), n * s->g);
        else if (s->cuda)
            e = rcu_unmap(s, rcu_a(s, p), n);
        else
            e = raw_unmap(s, raw_a(s, p), n);
        if (e && !rc)
            rc = e;
    }
    t2 = bench_now_ns();
    if (rc)
        return rc;
    out[0] = (double)(t1 - t0) / (double)s->k;
    out[1] = (double)(t2 - t1) / (double)s->k;
    return 0;
}

/* With region A mapped (by the caller), maps its pages again one by one at region B:
   out[0] alias map ns/op. */
static int t_alias(struct vb *s, int raw, size_t arg, double out[2])
{
    size_t i = 0;
    int rc = 0;
    uint64_t t0, t1;
    (void)arg;

    t0 = bench_now_ns();
    for (; i < s->k; i++) {
        if (!raw)
            rc = kvvm_testing_vmm_map_run(s->v, va_b(s, i), &s->h[i], 1, s->g);
        else if (s->cuda)
            rc = rcu_map(s, rcu_b(s, i), &s->rh[i], 1);
        else
            rc = raw_map(s, raw_b(s, i), i, 1);
        if (rc)
            break;
    }
    t1 = bench_now_ns();
    /* i pages of region B are mapped; unmap them (one call each, as they were mapped). */
    while (i-- > 0) {
        int e;
        if (!raw)
            e = kvvm_testing_vmm_unmap(s->v, va_b(s, i), s->g);
        else if (s->cuda)
            e = rcu_unmap(s, rcu_b(s, i), 1);
        else
            e = raw_unmap(s, raw_b(s, i), 1);
        if (e && !rc)
            rc = e;
    }
    if (rc)
        return rc;
    out[0] = (double)(t1 - t0) / (double)s->k;
    return 0;
}

/* arg & 3: 0 htod, 1 dtoh, 2 dtod; arg & 4: on the default (NULL) stream instead of the
   bench's stream. Copies cp pages once: out[0] GB/s. */
static int t_copy(struct vb *s, int raw, size_t arg, double out[2])
{
    size_t bytes = s->cp * s->g, dir = arg & 3;
    kvvm_testing_stream st = arg & 4 ? NULL : s->s;
    uint64_t t0 = bench_now_ns();
    int rc = 0;

    if (!raw) {
        if (dir == 0)
            rc = kvvm_testing_vmm_copy_htod(s->v, va_c(s, 0), s->host, bytes, st);
        else if (dir == 1)
            rc = kvvm_testing_vmm_copy_dtoh(s->v, s->host, va_c(s, 0), bytes, st);
        else
            rc = kvvm_testing_vmm_copy_dtod(s->v, va_c(s, s->cp), va_c(s, 0), bytes, st);
        if (!rc)
            rc = kvvm_testing_vmm_stream_sync(s->v, st);
        if (rc)
            return rc;
    } else if (s->cuda) {
        if (dir == 0)
            CU(s, kvvm_testing_raw_copy_htod(s->v, rcu_c(s, 0), s->host, bytes, st));
        else if (dir == 1)
            CU(s, kvvm_testing_raw_copy_dtoh(s->v, s->host, rcu_c(s, 0), bytes, st));
        else
            CU(s, kvvm_testing_raw_copy_dtod(s->v, rcu_c(s, s->cp), rcu_c(s, 0), bytes, st));
        CU(s, kvvm_testing_raw_stream_sync(s->v, st));
    } else {
        /* The emulator copies through its own view of the memfd. */
        char *src = s->view + s->k * s->g, *dst = src + bytes;
        if (dir == 0)
            memcpy(src, s->host, bytes);
        else if (dir == 1)
            memcpy(s->host, src, bytes);
        else
            memcpy(dst, src, bytes);
    }
    out[0] = (double)bytes / (double)(bench_now_ns() - t0);   /* bytes per ns = GB/s */
    return 0;
}

/* Runs one untimed warm-up sample of fn on each side, then n samples alternating between
   the sides, which goes first alternating too (so that drift, other processes' load and
   what the previous sample left in the caches hit both alike); med[side][j] receives
   the median of out[j]. Many short samples make the median robust on a loaded machine. */
static int measure(struct vb *s, trial_fn fn, size_t arg, int n, double med[2][2])
{
    double *vals = calloc((size_t)4 * (size_t)n, sizeof *vals);  /* [side][j][n] */
    int rc = 0;

    if (!vals)
        return -ENOMEM;
    for (int t = -1; t < n && !rc; t++) {
        for (int o = 0; o < 2 && !rc; o++) {
            int side = o ^ (t & 1);     /* which side goes first alternates (caches) */
            double out[2] = { 0, 0 };
            rc = fn(s, side, arg, out);
            if (!rc && t >= 0)
                for (int j = 0; j < 2; j++)
                    vals[(side * 2 + j) * n + t] = out[j];
        }
    }
    if (!rc)
        for (int side = 0; side < 2; side++)
            for (int j = 0; j < 2; j++)
                med[side][j] = bench_median(vals + (side * 2 + j) * n, n);
    free(vals);
    return rc;
}

static void report(struct vb *s, const char *op, double value, double base,
                   const char *emu_base, const char *cuda_base, const char *unit, int lower)
{
    bench_report(s->b, GROUP, op, value, base, s->cuda ? cuda_base : emu_base, unit, lower);
}

/* ---- setup and teardown ------------------------------------------------------------------ */

static int setup_raw(struct vb *s)
{
    size_t pages = s->k + 2 * s->cp;

    if (s->cuda) {
        s->rh = calloc(pages, sizeof *s->rh);
        if (!s->rh)
            return -ENOMEM;
        CU(s, kvvm_testing_raw_device(s->v, 0, &s->dev));
        CU(s, kvvm_testing_raw_reserve(s->v, &s->rbase, s->res_bytes, s->g));
        return 0;
    }
    s->fd = memfd_create("kvvm-bench-raw", MFD_CLOEXEC);
    if (s->fd < 0)
        return sys_err("memfd_create");
    if (ftruncate(s->fd, (off_t)(pages * s->g)))
        return sys_err("ftruncate");
    s->view = mmap(NULL, pages * s->g, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE,
                   s->fd, 0);
    if (s->view == MAP_FAILED) {
        s->view = NULL;
        return sys_err("mmap memfd view");
    }
    s->rva = mmap(NULL, s->res_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                  -1, 0);
    if (s->rva == MAP_FAILED) {
        s->rva = NULL;
        return sys_err("mmap PROT_NONE");
    }
    return 0;
}

static void teardown_raw(struct vb *s)
{
    size_t pages = s->k + 2 * s->cp;

    if (s->cuda) {
        if (s->rbase)
            kvvm_testing_raw_free(s->v, s->rbase, s->res_bytes);
        free(s->rh);
        return;
    }
    if (s->rva)
        munmap(s->rva, s->res_bytes);
    if (s->view)
        munmap(s->view, pages * s->g);
    if (s->fd >= 0)
        close(s->fd);
}

/* Creates n pages (vmm side into hv, raw side into rh/memfd offsets starting at raw_first). */
static int create_pages(struct vb *s, kvvm_testing_page *hv, size_t n, size_t raw_first)
{
    for (size_t i = 0; i < n; i++) {
        int rc = kvvm_testing_vmm_phys_create(s->v, s->g, &hv[i]);
        if (rc) {
            while (i-- > 0)
                kvvm_testing_vmm_phys_release(s->v, hv[i]);
            return rc;
        }
    }
    if (s->cuda) {
        for (size_t i = 0; i < n; i++) {
            int r = kvvm_testing_raw_create(s->v, s->dev, s->g, &s->rh[raw_first + i]);
            if (r) {
                while (i-- > 0)
                    kvvm_testing_raw_release(s->v, s->rh[raw_first + i]);
                for (size_t j = 0; j < n; j++)
                    kvvm_testing_vmm_phys_release(s->v, hv[j]);
                return cu_err(s, "cuMemCreate", r);
            }
        }
    } else {
        memset(s->view + raw_first * s->g, KVVM_TESTING_EMU_POISON, n * s->g);
    }
    return 0;
}

static int run_figures(struct vb *s)
{
    double m[2][2];
    int rc;
    char op[64];
    static const size_t runs[] = { 1, 8, 64 };

    if ((rc = measure(s, t_reserve, 0, s->b->trials * MAP_REPS, m)))
        return rc;
    report(s, "reserve", m[0][0], m[1][0], "mmap PROT_NONE+trim", "cuMemAddressReserve",
           "ns/op", 1);

    if ((rc = kvvm_testing_vmm_reserve(s->v, s->res_bytes, &s->base)))
        return rc;
    if ((rc = setup_raw(s)))
        goto out_unreserve;

    if ((rc = measure(s, t_create, 0, s->b->trials * s->reps, m)))
        goto out_raw;
    report(s, "create page", m[0][0], m[1][0], "memset poison (memfd)", "cuMemCreate",
           "ns/op", 1);
    report(s, "release page", m[0][1], m[1][1], "fallocate PUNCH_HOLE", "cuMemRelease",
           "ns/op", 1);

    /* The map figures map the same k pages, created once. */
    if ((rc = create_pages(s, s->h, s->k, 0)))
        goto out_raw;

    if ((rc = measure(s, t_map_run, 1, s->b->trials * MAP_REPS, m)))
        goto out_pages;
    report(s, "map+access 1 page", m[0][0], m[1][0], "mmap SHARED|FIXED+mprotect",
           "cuMemMap+cuMemSetAccess", "ns/op", 1);
    report(s, "unmap 1 page", m[0][1], m[1][1], "mmap anon PROT_NONE", "cuMemUnmap", "ns/op", 1);
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        if ((rc = measure(s, t_map_run, runs[i], s->b->trials * MAP_REPS, m)))
            goto out_pages;
        snprintf(op, sizeof op, "map_run n=%zu", runs[i]);
        report(s, op, m[0][0], m[1][0], "n*mmap+1 mprotect", "n*cuMemMap+1 SetAccess",
               "ns/page", 1);
        if (runs[i] == 64)
            report(s, "unmap run n=64", m[0][1], m[1][1], "mmap anon PROT_NONE",
                   "cuMemUnmap", "ns/page", 1);
    }

    /* Alias: region A stays mapped while its pages are mapped again at region B. */
    size_t mapped_a = 0;
    for (; mapped_a < s->k; mapped_a += 64) {
        size_t p = mapped_a;
        if ((rc = kvvm_testing_vmm_map_run(s->v, va_a(s, p), &s->h[p], 64, s->g)))
            goto out_unmap_a;
        rc = s->cuda ? rcu_map(s, rcu_a(s, p), &s->rh[p], 64) : raw_map(s, raw_a(s, p), p, 64);
        if (rc) {
            kvvm_testing_vmm_unmap(s->v, va_a(s, p), 64 * s->g);
            goto out_unmap_a;
        }
    }
    rc = measure(s, t_alias, 0, s->b->trials * MAP_REPS, m);
    if (!rc)
        report(s, "alias map 1 page", m[0][0], m[1][0], "mmap SHARED|FIXED+mprotect",
               "cuMemMap+cuMemSetAccess", "ns/op", 1);
out_unmap_a:
    for (size_t p = 0; p < mapped_a; p += 64) {
        kvvm_testing_vmm_unmap(s->v, va_a(s, p), 64 * s->g);
        if (s->cuda)
            kvvm_testing_raw_unmap(s->v, rcu_a(s, p), 64 * s->g);
        else
            raw_unmap(s, raw_a(s, p), 64);
    }
    if (rc)
        goto out_pages;

    /* Copies: 2 cp pages mapped at region C on each side. */
    if ((rc = create_pages(s, s->hc, 2 * s->cp, s->k)))
        goto out_pages;
    if ((rc = kvvm_testing_vmm_map_run(s->v, va_c(s, 0), s->hc, 2 * s->cp, s->g)))
        goto out_copy_pages;
    if (s->cuda && (rc = rcu_map(s, rcu_c(s, 0), &s->rh[s->k], 2 * s->cp)))
        goto out_copy_unmap;
    {
        static const char *const names[] = {
            "copy htod", "copy dtoh", "copy dtod", "",
            "copy htod (NULL stream)", "copy dtoh (NULL stream)", "copy dtod (NULL stream)" };
        static const char *const cu_names[] = {
            "cuMemcpyHtoDAsync+sync", "cuMemcpyDtoHAsync+sync", "cuMemcpyDtoDAsync+sync", "",
            "cuMemcpyHtoDAsync+sync", "cuMemcpyDtoHAsync+sync", "cuMemcpyDtoDAsync+sync" };
        for (size_t d = 0; d < 7; d++) {
            if (d == 3)
                continue;
            if ((rc = measure(s, t_copy, d, s->b->trials * s->copy_reps, m)))
                break;
            /* bytes per ns -> MiB/s, the bandwidth unit of every group */
            report(s, names[d], m[0][0] * 1e9 / 1048576.0, m[1][0] * 1e9 / 1048576.0,
                   "memcpy", cu_names[d], "MiB/s", 0);
        }
    }
    if (s->cuda)
        kvvm_testing_raw_unmap(s->v, rcu_c(s, 0), 2 * s->cp * s->g);
out_copy_unmap:
    kvvm_testing_vmm_unmap(s->v, va_c(s, 0), 2 * s->cp * s->g);
out_copy_pages:
    for (size_t i = 0; i < 2 * s->cp; i++) {
        kvvm_testing_vmm_phys_release(s->v, s->hc[i]);
        if (s->cuda)
            kvvm_testing_raw_release(s->v, s->rh[s->k + i]);
    }
out_pages:
    for (size_t i = 0; i < s->k; i++) {
        kvvm_testing_vmm_phys_release(s->v, s->h[i]);
        if (s->cuda)
            kvvm_testing_raw_release(s->v, s->rh[i]);
    }
out_raw:
    teardown_raw(s);
out_unreserve:
    kvvm_testing_vmm_unreserve(s->v);
    return rc;
}

int bench_vmm(struct bench_ctx *b)
{
    struct vb s = { .b = b, .fd = -1 };
    size_t granule = b->granule ? b->granule : (size_t)2 << 20;
    size_t copy_bytes = (size_t)(b->quick ? 16 : 64) << 20;
    struct kvvm_testing_vmm_params p = { .backend = (enum kvvm_backend)b->backend, .device = 0 };
    int rc;

    /* A sample handles 64 pages (one run of the largest batch). Creating pages below 2 MiB is
       cheap, so create/release take more samples there: 2 MiB / page, at most 16. */
    s.k = 64;
    s.kc = b->quick ? 16 : 64;      /* a 2 MiB page costs milliseconds to create */
    s.cp = copy_bytes / granule;
    if (s.cp > 4096)        /* small granules: stay far below the emulator's mapping bound */
        s.cp = 4096;
    s.copy_reps = b->quick ? 2 : 4;
    p.emu_granule = granule;
    p.emu_capacity = (s.k + 2 * s.cp) * granule;   /* what the vmm side holds at most */

    if ((rc = kvvm_testing_vmm_open(&p, &s.v))) {
        fprintf(stderr, "kvvm-bench: vmm_open: %s\n", strerror(-rc));
        return rc;
    }
    s.cuda = !strcmp(kvvm_testing_vmm_backend_name(s.v), "cuda");
    s.g = kvvm_testing_vmm_granule(s.v);
    if (s.g != granule && !s.cuda) {
        fprintf(stderr, "kvvm-bench: asked for a %zu-byte granule, the device has %zu\n",
                granule, s.g);
        rc = -EINVAL;
        goto out_close;
    }
    if (s.cuda)     /* the real device's granule decides; keep the same byte sizes */
        s.cp = copy_bytes / s.g ? copy_bytes / s.g : 1;
    s.reps = (int)(((size_t)2 << 20) / s.g);
    if (s.reps < 1)
        s.reps = 1;
    if (s.reps > 16)
        s.reps = 16;
    s.res_bytes = (2 * s.k + 2 * s.cp) * s.g;
    if ((rc = kvvm_testing_vmm_make_current(s.v)))
        goto out_close;
    printf("%-8s backend %s, page = granule %zu KiB, reserve %zu MiB; per trial: %d samples "
           "of %zu pages (create: %d of %zu), %d copies of %zu MiB\n", GROUP,
           kvvm_testing_vmm_backend_name(s.v), s.g >> 10, s.res_bytes >> 20, MAP_REPS, s.k,
           s.reps, s.kc,
           s.copy_reps, (s.cp * s.g) >> 20);

    s.h = calloc(s.k, sizeof *s.h);
    s.hc = calloc(2 * s.cp, sizeof *s.hc);
    if (!s.h || !s.hc) {
        rc = -ENOMEM;
        goto out_free;
    }
    if ((rc = kvvm_testing_vmm_stream_create(s.v, &s.s)))
        goto out_free;
    /* Host buffer of the copies: pinned like an engine's would be; plain memory otherwise. */
    if (kvvm_testing_vmm_host_alloc(s.v, s.cp * s.g, &s.host) == 0) {
        s.host_pinned = 1;
    } else {
        s.host = malloc(s.cp * s.g);
        if (!s.host) {
            rc = -ENOMEM;
            goto out_stream;
        }
        fprintf(stderr, "kvvm-bench: pinned host memory refused; copies use pageable memory\n");
    }
    memset(s.host, 0x5a, s.cp * s.g);

    rc = run_figures(&s);

    if (s.host_pinned)
        kvvm_testing_vmm_host_free(s.v, s.host);
    else
        free(s.host);
out_stream:
    kvvm_testing_vmm_stream_destroy(s.v, s.s);
out_free:
    free(s.h);
    free(s.hc);
out_close:
    kvvm_testing_vmm_close(s.v);
    return rc;
}
