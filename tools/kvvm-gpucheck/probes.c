/*
 * tools/kvvm-gpucheck/probes.c: driver setup, the loader probe (a), the VMM rules (b), map
 * calls under queued copies (c) and pageable-memory copies (d), each on one driver table
 * (contract in gpucheck.h; what each probe means: docs/kvvm-gpucheck.md).
 */
#include "gpucheck.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

void gc_row(const char *id, const char *result, const char *fmt, ...)
{
    char detail[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    for (char *p = detail; *p; p++)          /* one line, no tabs: the protocol's separators */
        if (*p == '\t' || *p == '\n')
            *p = ' ';
    printf("ROW\t%s\t%s\t%s\n", id, result, detail);
    fflush(stdout);
}

/* Names of results the emulated device does not know (capture), so both columns read alike. */
static const struct { kcu_result r; const char *name; } extra_names[] = {
    { 900, "STREAM_CAPTURE_UNSUPPORTED" }, { 901, "STREAM_CAPTURE_INVALIDATED" },
    { 902, "STREAM_CAPTURE_MERGE" }, { 903, "STREAM_CAPTURE_UNMATCHED" },
    { 904, "STREAM_CAPTURE_UNJOINED" }, { 905, "STREAM_CAPTURE_ISOLATION" },
    { 906, "STREAM_CAPTURE_IMPLICIT" }, { 907, "CAPTURED_EVENT" },
    { 908, "STREAM_CAPTURE_WRONG_THREAD" },
};

const char *gc_err(const struct kcu_api *a, kcu_result r)
{
    static _Thread_local char buf[4][48];
    static _Thread_local unsigned k;
    if (r == KCU_SUCCESS)
        return "ok";
    const char *s = NULL;
    if (a && a->cuGetErrorName(r, &s) == KCU_SUCCESS && s)
        return strncmp(s, "CUDA_ERROR_", 11) ? s : s + 11;
    for (size_t i = 0; i < sizeof extra_names / sizeof extra_names[0]; i++)
        if (extra_names[i].r == r)
            return extra_names[i].name;
    char *b = buf[k++ % 4];
    snprintf(b, sizeof buf[0], "CUresult %d", r);
    return b;
}

double gc_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* ---- the CUDA library, for what libkvvm's table does not hold ------------------------ */

static const char *cuda_path(void)
{
    const char *p = getenv("KVVM_CUDA_LIBRARY");
    return p && *p ? p : "libcuda.so.1";
}

/* cuGetProcAddress of the same library libkvvm loads (dlopen returns the same handle).
   0 and *fn; -ENOENT library or symbol missing (why). */
static int gpa(const char *name, int version, void **fn, int *v2, char *why, size_t len)
{
    void *lib = dlopen(cuda_path(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(why, len, "%s cannot be loaded", cuda_path());
        return -ENOENT;
    }
    kvvm_testing_gpa_v2_fn g2 = (kvvm_testing_gpa_v2_fn)dlsym(lib, "cuGetProcAddress_v2");
    kvvm_testing_gpa_v1_fn g1 = (kvvm_testing_gpa_v1_fn)dlsym(lib, "cuGetProcAddress");
    int st = KVVM_TESTING_GPA_SUCCESS;
    kcu_result r = g2 ? g2(name, fn, version, KVVM_TESTING_GPA_LEGACY_STREAM, &st)
                      : g1 ? g1(name, fn, version, KVVM_TESTING_GPA_LEGACY_STREAM)
                           : KCU_ERROR_NOT_FOUND;
    if (v2)
        *v2 = g2 != NULL;
    /* The library stays loaded (libkvvm's loader keeps it too): drop only our reference. */
    dlclose(lib);
    if (r != KCU_SUCCESS || st != KVVM_TESTING_GPA_SUCCESS || !*fn) {
        snprintf(why, len, "cuGetProcAddress(\"%s\", %d): CUresult %d, status %d", name,
                 version, r, st);
        *fn = NULL;
        return -ENOENT;
    }
    return 0;
}

int gc_gpa_all(const struct gc_sym *want, size_t n, void **fn, char *why, size_t len)
{
    for (size_t i = 0; i < n; i++)
        if (gpa(want[i].name, want[i].version, &fn[i], NULL, why, len))
            return -ENOENT;
    return 0;
}

int gc_extra_load(struct gc_extra *x, char *why, size_t len)
{
    void *f[4];
    static const struct gc_sym want[4] = {
        { "cuStreamBeginCapture", 10010 }, { "cuStreamEndCapture", 10000 },
        { "cuGraphDestroy", 10000 }, { "cuThreadExchangeStreamCaptureMode", 10010 },
    };
    if (gc_gpa_all(want, 4, f, why, len))
        return -ENOENT;
    memcpy(&x->begin_capture, &f[0], sizeof f[0]);
    memcpy(&x->end_capture, &f[1], sizeof f[1]);
    memcpy(&x->graph_destroy, &f[2], sizeof f[2]);
    memcpy(&x->exchange_mode, &f[3], sizeof f[3]);
    return 0;
}

/* ---- opening a driver ------------------------------------------------------------------ */

int gc_dev_open(struct gc_dev *d, int emulated, const struct gc_opts *o, bool reserve,
                char *why, size_t len)
{
    memset(d, 0, sizeof *d);
    d->o = o;
    d->emulated = emulated;
    int err;
    if (emulated) {
        if ((err = kvvm_testing_emu_device(GiB, 2 * MiB, 1, &d->ordinal, &d->a))) {
            snprintf(why, len, "emulated device: %d", err);
            return err;
        }
        d->a->cuInit(0);
    } else if ((err = kvvm_testing_cuda_load(&d->a, why, len))) {
        return err;
    }
    const struct kcu_api *a = d->a;
    kcu_result r;
    const char *step = "cuDeviceGet";
    if ((r = a->cuDeviceGet(&d->dev, emulated ? d->ordinal : o->device)))
        goto out_fail;
    step = "cuDevicePrimaryCtxRetain";
    if ((r = a->cuDevicePrimaryCtxRetain(&d->ctx, d->dev)))
        goto out_fail;
    step = "cuCtxSetCurrent";
    if ((r = a->cuCtxSetCurrent(d->ctx)))
        goto out_fail;
    d->prop.type = KCU_MEM_ALLOCATION_TYPE_PINNED;
    d->prop.location.type = KCU_MEM_LOCATION_TYPE_DEVICE;
    d->prop.location.id = d->dev;
    step = "cuMemGetAllocationGranularity";
    if ((r = a->cuMemGetAllocationGranularity(&d->g, &d->prop,
                                              KCU_MEM_ALLOC_GRANULARITY_MINIMUM)))
        goto out_fail;
    step = "cuStreamCreate";
    if ((r = a->cuStreamCreate(&d->s, KCU_STREAM_NON_BLOCKING)))
        goto out_fail;
    if (reserve) {
        d->resv = GC_RESV_GRANULES * d->g;
        step = "cuMemAddressReserve";
        if ((r = a->cuMemAddressReserve(&d->base, d->resv, 0, 0, 0)))
            goto out_fail;
    }
    return 0;
out_fail:
    snprintf(why, len, "%s: %s", step, gc_err(a, r));
    return -EIO;
}

kcu_result gc_create(struct gc_dev *d, size_t bytes, kcu_mem_handle *h)
{
    return d->a->cuMemCreate(h, bytes, &d->prop, 0);
}

kcu_result gc_map(struct gc_dev *d, kcu_deviceptr va, size_t bytes, kcu_mem_handle h)
{
    return d->a->cuMemMap(va, bytes, 0, h, 0);
}

kcu_result gc_access(struct gc_dev *d, kcu_deviceptr va, size_t bytes)
{
    struct kcu_mem_access_desc desc = { .location = d->prop.location,
                                        .flags = KCU_MEM_ACCESS_FLAGS_PROT_READWRITE };
    return d->a->cuMemSetAccess(va, bytes, &desc, 1);
}

static unsigned char cookie(unsigned seed, size_t off)
{
    uint32_t x = seed * 2654435761u ^ (uint32_t)(off * 40503u) ^ (uint32_t)(off >> 11);
    return (unsigned char)(x ^ x >> 8 ^ x >> 16);
}

int gc_write(struct gc_dev *d, kcu_deviceptr va, size_t n, unsigned seed, kcu_result *r)
{
    unsigned char *b = malloc(n);
    if (!b) {
        *r = KCU_ERROR_OUT_OF_MEMORY;
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        b[i] = cookie(seed, i);
    *r = d->a->cuMemcpyHtoDAsync(va, b, n, d->s);
    if (!*r)
        *r = d->a->cuStreamSynchronize(d->s);
    free(b);
    return *r ? -1 : 0;
}

int gc_check(struct gc_dev *d, kcu_deviceptr va, size_t n, unsigned seed, kcu_result *r)
{
    unsigned char *b = calloc(1, n);
    if (!b) {
        *r = KCU_ERROR_OUT_OF_MEMORY;
        return -1;
    }
    *r = d->a->cuMemcpyDtoHAsync(b, va, n, d->s);
    if (!*r)
        *r = d->a->cuStreamSynchronize(d->s);
    int ret = -1;
    if (!*r) {
        size_t i = 0;
        while (i < n && b[i] == cookie(seed, i))
            i++;
        ret = i < n;
    }
    free(b);
    return ret;
}

/* ---- (a) loader and ABI ------------------------------------------------------------------ */

static void fmt_bytes(char *b, size_t len, unsigned long long n)
{
    if (n >= (1ull << 40))
        snprintf(b, len, "%.1f TiB", n / (double)(1ull << 40));
    else if (n >= GiB)
        snprintf(b, len, "%.1f GiB", n / (double)GiB);
    else
        snprintf(b, len, "%llu MiB", n / MiB);
}

/* The CUDA entry points one by one, as libkvvm's loader asks for them, and which of them
   the installed driver has a newer ABI of (asked at the driver's own version). */
static void loader_symbols(int driver_version)
{
    size_t n;
    const struct kvvm_testing_cuda_sym *syms = kvvm_testing_cuda_symbols(&n);
    char missing[512] = "", newer[512] = "", why[256];
    int lo = 1 << 30, hi = 0, v2 = 0, nmiss = 0;
    for (size_t i = 0; i < n; i++) {
        void *f = NULL, *fnew = NULL;
        lo = syms[i].version < lo ? syms[i].version : lo;
        hi = syms[i].version > hi ? syms[i].version : hi;
        if (gpa(syms[i].name, syms[i].version, &f, &v2, why, sizeof why)) {
            nmiss++;
            snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s",
                     *missing ? "," : "", syms[i].name);
            continue;
        }
        if (driver_version > syms[i].version &&
            !gpa(syms[i].name, driver_version, &fnew, NULL, why, sizeof why) && fnew != f)
            snprintf(newer + strlen(newer), sizeof newer - strlen(newer), "%s%s",
                     *newer ? "," : "", syms[i].name);
    }
    char res[600];
    snprintf(res, sizeof res, nmiss ? "missing: %s" : "all resolved", missing);
    gc_row("loader.entry_points", res, "%zu entry points of libkvvm's table via "
           "cuGetProcAddress%s from %s at ABI versions %d..%d", n, v2 ? "_v2" : "",
           cuda_path(), lo, hi);
    gc_row("loader.newer_abi", *newer ? newer : "none", "entry points whose ABI at driver "
           "version %d differs from the one libkvvm asks for (informational)", driver_version);
}

static void loader_rows(struct gc_dev *d)
{
    const struct kcu_api *a = d->a;
    char b[160], c[64];
    int ver = 0;
    kcu_result r = a->cuDriverGetVersion(&ver);
    snprintf(b, sizeof b, "%d.%d", ver / 1000, ver % 1000 / 10);
    gc_row("loader.driver_version", r ? gc_err(a, r) : b, "cuDriverGetVersion = %d", ver);
    if (!d->emulated)
        loader_symbols(ver);
    else {
        size_t n;
        kvvm_testing_cuda_symbols(&n);
        size_t have = 0;
        for (size_t i = 0; i < n; i++) {
            void *f;
            memcpy(&f, (const char *)a + sizeof(const char *) + i * sizeof f, sizeof f);
            have += f != NULL;
        }
        gc_row("loader.entry_points", have == n ? "all resolved" : "missing", "%zu of %zu "
               "entry points in the emulated table", have, n);
        gc_row("loader.newer_abi", "n/a", "the emulated table has one ABI per entry point");
    }
    char name[128] = "";
    a->cuDeviceGetName(name, sizeof name, d->dev);
    size_t total = 0;
    a->cuDeviceTotalMem(&total, d->dev);
    fmt_bytes(c, sizeof c, total);
    gc_row("loader.device", "ok", "%s, %s", name, c);
    int vmm = -1;
    r = a->cuDeviceGetAttribute(&vmm, KCU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                d->dev);
    snprintf(b, sizeof b, "%d", vmm);
    gc_row("loader.vmm_supported", r ? gc_err(a, r) : b,
           "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED");
    size_t rec = 0;
    a->cuMemGetAllocationGranularity(&rec, &d->prop, KCU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    snprintf(b, sizeof b, "%zu KiB", d->g >> 10);
    gc_row("loader.granularity", b, "minimum %zu KiB, recommended %zu KiB", d->g >> 10,
           rec >> 10);

    /* Largest reservation: doubling from 1 GiB, then bisection to 1/64 of the bound. */
    unsigned long long ok = 0, bad = 0, cap = 1ull << 48, sz = GiB;
    kcu_deviceptr p;
    while (sz <= cap) {
        if (a->cuMemAddressReserve(&p, sz, 0, 0, 0)) {
            bad = sz;
            break;
        }
        a->cuMemAddressFree(p, sz);
        ok = sz;
        sz *= 2;
    }
    while (bad && bad - ok > bad / 64) {
        unsigned long long mid = (ok + (bad - ok) / 2) / d->g * d->g;
        if (mid <= ok)
            break;
        if (a->cuMemAddressReserve(&p, mid, 0, 0, 0)) {
            bad = mid;
        } else {
            a->cuMemAddressFree(p, mid);
            ok = mid;
        }
    }
    fmt_bytes(c, sizeof c, ok);
    gc_row("loader.max_reserve", ok ? c : "none", "largest cuMemAddressReserve that succeeded "
           "(%llu bytes; %s, searched up to 256 TiB)", ok,
           bad ? "the next size failed" : "no size failed");
}

int gc_probe_loader(int emulated, const struct gc_opts *o)
{
    char why[512];
    struct gc_dev d;
    int err = gc_dev_open(&d, emulated, o, false, why, sizeof why);
    if (!emulated) {
        if (err == -ENOENT) {
            printf("GPU\tabsent\t%s\n", why);
            return 0;
        }
        if (err) {
            printf("GPU\tunusable\t%s\n", why);
            if (err == -ENODEV)
                loader_symbols(0);
            return 0;
        }
        printf("GPU\tpresent\t\n");
        gc_row("loader.library", "ok", "%s (libkvvm's loader, vmm/drv_cuda.c)", cuda_path());
    } else {
        if (err) {
            gc_row("loader.library", "error: open", "%s", why);
            return 0;
        }
        gc_row("loader.library", "ok", "the emulated device (vmm/emu/), in process");
    }
    loader_rows(&d);
    return 0;
}

/* ---- (b) VMM rules ------------------------------------------------------------------------- */

#define SETUP(expr) do { kcu_result r_ = (expr); if (r_) { \
        gc_row(id, "error: setup", "%s: %s", #expr, gc_err(d->a, r_)); return; } } while (0)

static void p_map_onto_mapped(struct gc_dev *d)
{
    const char *id = "vmm.map_onto_mapped";
    kcu_mem_handle h1, h2;
    SETUP(gc_create(d, d->g, &h1));
    SETUP(gc_create(d, d->g, &h2));
    SETUP(gc_map(d, d->base, d->g, h1));
    kcu_result r = gc_map(d, d->base, d->g, h2);
    gc_row(id, gc_err(d->a, r), "cuMemMap of a second handle onto the same mapped granule");
}

static void p_map_overlapping(struct gc_dev *d)
{
    const char *id = "vmm.map_overlapping";
    kcu_mem_handle h1, h2;
    SETUP(gc_create(d, 2 * d->g, &h1));
    SETUP(gc_create(d, 2 * d->g, &h2));
    SETUP(gc_map(d, d->base, 2 * d->g, h1));
    kcu_result r = gc_map(d, d->base + d->g, 2 * d->g, h2);
    gc_row(id, gc_err(d->a, r), "cuMemMap of 2 granules whose first overlaps the last "
           "granule of a mapping");
}

static void p_partial_unmap(struct gc_dev *d)
{
    const char *id = "vmm.partial_unmap";
    kcu_mem_handle h;
    SETUP(gc_create(d, 2 * d->g, &h));
    SETUP(gc_map(d, d->base, 2 * d->g, h));
    kcu_result r = d->a->cuMemUnmap(d->base, d->g);
    gc_row(id, gc_err(d->a, r), "cuMemUnmap of the first granule of a 2-granule mapping");
}

static void p_unmap_spanning(struct gc_dev *d)
{
    const char *id = "vmm.unmap_spanning";
    kcu_mem_handle h1, h2, h3;
    SETUP(gc_create(d, d->g, &h1));
    SETUP(gc_create(d, d->g, &h2));
    SETUP(gc_create(d, 2 * d->g, &h3));
    SETUP(gc_map(d, d->base, d->g, h1));
    SETUP(gc_map(d, d->base + d->g, d->g, h2));
    char res[80];
    kcu_result r = d->a->cuMemUnmap(d->base, 2 * d->g);
    if (r) {
        snprintf(res, sizeof res, "unmap:%s", gc_err(d->a, r));
    } else {
        r = gc_map(d, d->base, 2 * d->g, h3);      /* both granules must be free again */
        snprintf(res, sizeof res, r ? "remap:%s" : "ok", gc_err(d->a, r));
    }
    gc_row(id, res, "one cuMemUnmap over two adjacent 1-granule mappings, then a 2-granule "
           "cuMemMap onto the range (libkvvm unmaps runs of pages this way)");
}

static void p_access_spanning(struct gc_dev *d)
{
    const char *id = "vmm.access_spanning";
    kcu_mem_handle h1, h2;
    SETUP(gc_create(d, d->g, &h1));
    SETUP(gc_create(d, d->g, &h2));
    SETUP(gc_map(d, d->base, d->g, h1));
    SETUP(gc_map(d, d->base + d->g, d->g, h2));
    char res[80];
    kcu_result r = gc_access(d, d->base, 2 * d->g);
    if (r) {
        snprintf(res, sizeof res, "access:%s", gc_err(d->a, r));
    } else {
        int w = gc_write(d, d->base, 2 * d->g, 7, &r);
        int c = w ? -1 : gc_check(d, d->base, 2 * d->g, 7, &r);
        snprintf(res, sizeof res, c < 0 ? "copy:%s" : c ? "bytes differ" : "ok",
                 gc_err(d->a, r));
    }
    gc_row(id, res, "one cuMemSetAccess over two adjacent mappings, then a copy across both "
           "(libkvvm sets access once per run)");
}

static void p_alias(struct gc_dev *d)
{
    const char *id = "vmm.alias";
    kcu_mem_handle h;
    kcu_deviceptr v2 = d->base + 4 * d->g;
    SETUP(gc_create(d, d->g, &h));
    SETUP(gc_map(d, d->base, d->g, h));
    SETUP(gc_map(d, v2, d->g, h));
    SETUP(gc_access(d, d->base, d->g));
    SETUP(gc_access(d, v2, d->g));
    kcu_result r;
    char res[80];
    int c = gc_write(d, d->base, d->g, 3, &r) ? -1 : gc_check(d, v2, d->g, 3, &r);
    if (c == 0)
        c = gc_write(d, v2, d->g, 4, &r) ? -1 : gc_check(d, d->base, d->g, 4, &r);
    snprintf(res, sizeof res, c < 0 ? "copy:%s" : c ? "differs" : "ok", gc_err(d->a, r));
    gc_row(id, res, "one handle mapped at two addresses: bytes written through either are "
           "read through the other");
}

static void p_release_while_mapped(struct gc_dev *d)
{
    const char *id = "vmm.release_while_mapped";
    kcu_mem_handle h;
    SETUP(gc_create(d, d->g, &h));
    SETUP(gc_map(d, d->base, d->g, h));
    SETUP(gc_access(d, d->base, d->g));
    kcu_result r;
    if (gc_write(d, d->base, d->g, 5, &r)) {
        gc_row(id, "error: setup", "write: %s", gc_err(d->a, r));
        return;
    }
    char res[80];
    r = d->a->cuMemRelease(h);
    if (r) {
        snprintf(res, sizeof res, "release:%s", gc_err(d->a, r));
    } else {
        int c = gc_check(d, d->base, d->g, 5, &r);
        if (c)
            snprintf(res, sizeof res, c < 0 ? "read:%s" : "bytes lost", gc_err(d->a, r));
        else {
            r = d->a->cuMemUnmap(d->base, d->g);
            snprintf(res, sizeof res, r ? "unmap:%s" : "ok", gc_err(d->a, r));
        }
    }
    gc_row(id, res, "cuMemRelease of a mapped handle; its bytes are read through the mapping, "
           "then the last unmap frees it");
}

static void p_map_offset(struct gc_dev *d)
{
    const char *id = "vmm.map_offset";
    kcu_mem_handle h;
    kcu_deviceptr whole = d->base + 8 * d->g;
    SETUP(gc_create(d, 2 * d->g, &h));
    SETUP(gc_map(d, whole, 2 * d->g, h));
    SETUP(gc_access(d, whole, 2 * d->g));
    kcu_result r;
    if (gc_write(d, whole + d->g, d->g, 6, &r)) {
        gc_row(id, "error: setup", "write: %s", gc_err(d->a, r));
        return;
    }
    char res[80];
    r = d->a->cuMemMap(d->base, d->g, d->g, h, 0);
    if (r) {
        snprintf(res, sizeof res, "%s", gc_err(d->a, r));
    } else {
        kcu_result r2 = gc_access(d, d->base, d->g);
        int c = r2 ? -1 : gc_check(d, d->base, d->g, 6, &r2);
        snprintf(res, sizeof res, c < 0 ? "ok, then %s" : c ? "ok, wrong bytes" :
                 "ok, offset honoured", gc_err(d->a, r2));
    }
    gc_row(id, res, "cuMemMap(offset = 1 granule) of a 2-granule handle");
}

/* A host-to-device copy to va on the non-blocking stream: where the error shows. */
static void copy_to(struct gc_dev *d, const char *id, kcu_deviceptr va, const char *what)
{
    static unsigned char buf[4096];
    char res[80];
    double t0 = gc_now_ms();
    kcu_result r = d->a->cuMemcpyHtoDAsync(va, buf, sizeof buf, d->s);
    if (r) {
        snprintf(res, sizeof res, "call:%s", gc_err(d->a, r));
    } else {
        r = d->a->cuStreamSynchronize(d->s);
        snprintf(res, sizeof res, r ? "sync:%s" : "no error", gc_err(d->a, r));
    }
    gc_row(id, res, "%s (%.1f ms)", what, gc_now_ms() - t0);
}

static void p_copy_unmapped(struct gc_dev *d)
{
    copy_to(d, "vmm.copy_unmapped", d->base + 2 * d->g,
            "cuMemcpyHtoDAsync of 4 KiB to a reserved, unmapped address, then a sync");
}

static void p_copy_no_access(struct gc_dev *d)
{
    const char *id = "vmm.copy_no_access";
    kcu_mem_handle h;
    SETUP(gc_create(d, d->g, &h));
    SETUP(gc_map(d, d->base, d->g, h));
    copy_to(d, id, d->base, "cuMemcpyHtoDAsync of 4 KiB to a mapped address without "
            "cuMemSetAccess, then a sync");
}

/* ---- (c) and (d): calls while copies are queued --------------------------------------- */

struct queue {
    kcu_deviceptr va, vb;       /* two mapped buffers of n bytes each */
    size_t n;
    int copies;                 /* device-to-device copies a->b making queue_ms of work */
    double per_copy_ms;
};

/* Maps the two buffers (64 MiB emulated, 512 MiB on a GPU, at most 1/8 of the device) in a
   reservation of their own and measures one copy. */
static int queue_setup(struct gc_dev *d, const char *id, struct queue *q)
{
    size_t total = 0;
    d->a->cuDeviceTotalMem(&total, d->dev);
    q->n = (d->emulated ? 64 : 512) * MiB;
    if (total && q->n > total / 8)
        q->n = total / 8;
    q->n = q->n / d->g * d->g;
    if (!q->n)
        q->n = d->g;
    kcu_mem_handle ha, hb;
    kcu_deviceptr base;         /* a reservation of its own, beside the probes' one */
    kcu_result r;
    if ((r = d->a->cuMemAddressReserve(&base, 2 * q->n + 16 * d->g, 0, 0, 0)) ||
        (r = gc_create(d, q->n, &ha)) || (r = gc_create(d, q->n, &hb)) ||
        (r = gc_map(d, base, q->n, ha)) || (r = gc_map(d, base + q->n, q->n, hb)) ||
        (r = gc_access(d, base, 2 * q->n)) ||
        (r = d->a->cuMemsetD8Async(base, 0x5a, q->n, d->s)) ||
        (r = d->a->cuStreamSynchronize(d->s))) {
        gc_row(id, "error: setup", "queue buffers: %s", gc_err(d->a, r));
        return -1;
    }
    q->va = base;
    q->vb = base + q->n;
    double t0 = gc_now_ms();
    for (int i = 0; i < 4; i++)
        if ((r = d->a->cuMemcpyDtoDAsync(q->vb, q->va, q->n, d->s)))
            break;
    if (!r)
        r = d->a->cuStreamSynchronize(d->s);
    if (r) {
        gc_row(id, "error: setup", "calibration copy: %s", gc_err(d->a, r));
        return -1;
    }
    q->per_copy_ms = (gc_now_ms() - t0) / 4;
    double want = d->o->queue_ms / (q->per_copy_ms > 1e-3 ? q->per_copy_ms : 1e-3);
    q->copies = want < 8 ? 8 : want > 20000 ? 20000 : (int)want;
    return 0;
}

/* Queues `copies` copies a->b; the time the enqueueing took in *ms. */
static kcu_result enqueue(struct gc_dev *d, struct queue *q, int copies, double *ms)
{
    double t0 = gc_now_ms();
    kcu_result r = KCU_SUCCESS;
    for (int i = 0; i < copies && !r; i++)
        r = d->a->cuMemcpyDtoDAsync(q->vb, q->va, q->n, d->s);
    *ms = gc_now_ms() - t0;
    return r;
}

/* Whether a call of dt ms that saw the stream drain could have waited for it: it lasted at
   least 80 % of what was still queued when it began (the queue's estimate less the time the
   enqueueing took; a call that waits for the queue lasts all of it). A shorter call that saw
   the queue drain only shows that the queue ran out meanwhile (a loaded or sanitized run:
   the fake driver's cuMemMap, descheduled for 173 ms while its copies, faster than
   calibrated, drained ~286 ms of estimated work, was judged blocking at the former 50 %). */
static bool waited(const struct queue *q, double te, double dt)
{
    double left = q->copies * q->per_copy_ms - te;
    return left <= 0 || dt >= 0.8 * left;
}

/* The stream's state just before a timed call. KVVMTEST_GPUCHECK_DRAIN_EMULATED=1 (the tool's
   own test only) drains the emulated column's queue first, so that column is inconclusive
   for sure: what a loaded or sanitized run gives by chance. */
static kcu_result query_before(struct gc_dev *d)
{
    const char *e = getenv("KVVMTEST_GPUCHECK_DRAIN_EMULATED");
    if (d->emulated && e && !strcmp(e, "1"))
        d->a->cuStreamSynchronize(d->s);
    return d->a->cuStreamQuery(d->s);
}

enum qcall { Q_MAP, Q_ACCESS, Q_UNMAP };

/* One map-table call on an unrelated range while the stream has queue_ms of copies. */
static void queued_call(struct gc_dev *d, struct queue *q, enum qcall which,
                        kcu_mem_handle hx, kcu_deviceptr vx)
{
    static const char *ids[] = { "queued.map", "queued.set_access", "queued.unmap" };
    static const char *names[] = { "cuMemMap", "cuMemSetAccess", "cuMemUnmap" };
    const char *id = ids[which];
    double te;
    kcu_result r = d->a->cuStreamSynchronize(d->s);
    if (!r)
        r = enqueue(d, q, q->copies, &te);
    if (r) {
        gc_row(id, "error: setup", "queueing copies: %s", gc_err(d->a, r));
        return;
    }
    kcu_result q0 = query_before(d);
    double t0 = gc_now_ms();
    r = which == Q_MAP ? gc_map(d, vx, d->g, hx)
      : which == Q_ACCESS ? gc_access(d, vx, d->g) : d->a->cuMemUnmap(vx, d->g);
    double dt = gc_now_ms() - t0;
    kcu_result q1 = d->a->cuStreamQuery(d->s);
    char res[80];
    if (r)
        snprintf(res, sizeof res, "call:%s", gc_err(d->a, r));
    else if (q0 == KCU_SUCCESS || (q1 == KCU_SUCCESS && !waited(q, te, dt)))
        snprintf(res, sizeof res, "inconclusive");  /* drained first, or during a short call */
    else
        snprintf(res, sizeof res, q1 == KCU_SUCCESS ? "blocking" : "nonblocking");
    gc_row(id, res, "%s on an unrelated granule took %.2f ms with %d copies (~%.0f ms) queued "
           "(enqueueing took %.0f ms); stream before: %s, after: %s", names[which], dt,
           q->copies, q->copies * q->per_copy_ms, te, gc_err(d->a, q0), gc_err(d->a, q1));
    d->a->cuStreamSynchronize(d->s);
}

static void p_queued(struct gc_dev *d)
{
    struct queue q;
    if (queue_setup(d, "queued.map", &q))
        return;
    kcu_mem_handle hx;
    kcu_result r = gc_create(d, d->g, &hx);
    if (r) {
        gc_row("queued.map", "error: setup", "cuMemCreate: %s", gc_err(d->a, r));
        return;
    }
    queued_call(d, &q, Q_MAP, hx, d->base);
    queued_call(d, &q, Q_ACCESS, hx, d->base);
    queued_call(d, &q, Q_UNMAP, hx, d->base);
}

static void p_unmap_busy(struct gc_dev *d)
{
    const char *id = "queued.unmap_target";
    struct queue q;
    if (queue_setup(d, id, &q))
        return;
    double te;
    kcu_result r = enqueue(d, &q, q.copies, &te);
    if (r) {
        gc_row(id, "error: setup", "queueing copies: %s", gc_err(d->a, r));
        return;
    }
    kcu_result q0 = query_before(d);
    double t0 = gc_now_ms();
    r = d->a->cuMemUnmap(q.vb, q.n);
    double dt = gc_now_ms() - t0;
    kcu_result q1 = d->a->cuStreamQuery(d->s);
    kcu_result rs = d->a->cuStreamSynchronize(d->s);
    char res[96];
    if (q0 == KCU_SUCCESS || (!r && q1 == KCU_SUCCESS && !waited(&q, te, dt)))
        snprintf(res, sizeof res, "inconclusive");
    else
        snprintf(res, sizeof res, "unmap:%s%s sync:%s", gc_err(d->a, r),
                 r ? "" : q1 == KCU_SUCCESS ? "(blocking)" : "(nonblocking)", gc_err(d->a, rs));
    gc_row(id, res, "cuMemUnmap of the destination of %d queued copies (~%.0f ms) took %.2f "
           "ms; stream before: %s, after: %s", q.copies, q.copies * q.per_copy_ms, dt,
           gc_err(d->a, q0), gc_err(d->a, q1));
}

/* Device-to-host copy of 4 MiB behind queue_ms/4 of queued work: filled when it returns? */
static void dtoh_behind_queue(struct gc_dev *d, struct queue *q, const char *id, int pinned)
{
    const size_t n = 4 * MiB;
    unsigned char *b = NULL;
    kcu_result r = pinned ? d->a->cuMemAllocHost((void **)&b, n) : KCU_SUCCESS;
    if (!pinned && !(b = malloc(n)))
        r = KCU_ERROR_OUT_OF_MEMORY;
    if (r) {
        gc_row(id, "error: setup", "host buffer: %s", gc_err(d->a, r));
        return;
    }
    memset(b, 0, n);
    double te;
    r = enqueue(d, q, q->copies / 4 + 1, &te);
    kcu_result q0 = query_before(d);
    double t0 = gc_now_ms();
    if (!r)
        r = d->a->cuMemcpyDtoHAsync(b, q->va, n, d->s);
    double dt = gc_now_ms() - t0;
    size_t filled = 0;
    for (size_t i = 0; i < n; i++)
        filled += ((volatile unsigned char *)b)[i] == 0x5a;
    kcu_result q1 = d->a->cuStreamQuery(d->s);
    kcu_result rs = d->a->cuStreamSynchronize(d->s);
    const char *res = r ? gc_err(d->a, r) : q0 == KCU_SUCCESS ? "inconclusive"
                    : filled == n ? "complete at return" : "not complete at return";
    gc_row(id, res, "%s cuMemcpyDtoHAsync of 4 MiB behind %d queued copies returned after "
           "%.2f ms with %zu of %zu bytes in place; stream before: %s, after: %s; sync: %s",
           pinned ? "pinned" : "pageable", q->copies / 4 + 1, dt, filled, n, gc_err(d->a, q0),
           gc_err(d->a, q1), gc_err(d->a, rs));
    if (pinned)
        d->a->cuMemFreeHost(b);
    else
        free(b);
}

static void p_pageable(struct gc_dev *d)
{
    struct queue q;
    if (queue_setup(d, "pageable.dtoh", &q))
        return;
    dtoh_behind_queue(d, &q, "pageable.dtoh", 0);
    dtoh_behind_queue(d, &q, "pinned.dtoh", 1);

    /* Pageable source: overwritten right after the call returns; which bytes land? */
    const char *id = "pageable.htod";
    const size_t n = 4 * MiB;
    unsigned char *b = malloc(n), *back = malloc(n);
    if (!b || !back) {
        free(b);
        free(back);
        gc_row(id, "error: setup", "out of host memory");
        return;
    }
    memset(b, 0x11, n);
    double te;
    kcu_result r = enqueue(d, &q, q.copies / 4 + 1, &te);
    kcu_result q0 = query_before(d);
    double t0 = gc_now_ms();
    /* The destination is vb's start: the queued copies write vb before this one does. */
    if (!r)
        r = d->a->cuMemcpyHtoDAsync(q.vb, b, n, d->s);
    double dt = gc_now_ms() - t0;
    memset(b, 0x22, n);
    kcu_result rs = d->a->cuStreamSynchronize(d->s);
    if (!r && !rs)
        rs = d->a->cuMemcpyDtoHAsync(back, q.vb, n, d->s);
    if (!r && !rs)
        rs = d->a->cuStreamSynchronize(d->s);
    size_t old = 0, new = 0;
    for (size_t i = 0; i < n && !r && !rs; i++) {
        old += back[i] == 0x11;
        new += back[i] == 0x22;
    }
    const char *res = r ? gc_err(d->a, r) : rs ? "error: read back"
                    : q0 == KCU_SUCCESS ? "inconclusive"
                    : old == n ? "staged at call" : new == n ? "read after return" : "mixed";
    gc_row(id, res, "pageable cuMemcpyHtoDAsync of 4 MiB behind %d queued copies returned "
           "after %.2f ms; source overwritten at return; device got %zu old and %zu new "
           "bytes of %zu; stream before: %s", q.copies / 4 + 1, dt, old, new, n,
           gc_err(d->a, q0));
    free(b);
    free(back);
}

const struct gc_probe gc_probes[] = {
    { "vmm.map_onto_mapped", false, p_map_onto_mapped },
    { "vmm.map_overlapping", false, p_map_overlapping },
    { "vmm.partial_unmap", false, p_partial_unmap },
    { "vmm.unmap_spanning", false, p_unmap_spanning },
    { "vmm.access_spanning", false, p_access_spanning },
    { "vmm.alias", false, p_alias },
    { "vmm.release_while_mapped", false, p_release_while_mapped },
    { "vmm.map_offset", false, p_map_offset },
    { "vmm.copy_unmapped", false, p_copy_unmapped },
    { "vmm.copy_no_access", false, p_copy_no_access },
    { "queued", false, p_queued },
    { "queued.unmap_target", false, p_unmap_busy },
    { "pageable", false, p_pageable },
    { "oom.budget_above_free", false, gc_oom_budget },
    { "view.two_views", false, gc_view_two_views },
    { "share", false, gc_share },
    { "kernel.window_alias", true, gc_kernel_window_alias },
    { "capture.global_event", true, gc_capture_global_event },
    { "capture.relaxed_event", true, gc_capture_relaxed_event },
    { "capture.global_ctxsync", true, gc_capture_global_ctxsync },
    { "capture.relaxed_ctxsync", true, gc_capture_relaxed_ctxsync },
    { "capture.libkvvm_reclaim", true, gc_capture_libkvvm },
};
const size_t gc_n_probes = sizeof gc_probes / sizeof gc_probes[0];
