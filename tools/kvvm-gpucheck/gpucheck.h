/*
 * tools/kvvm-gpucheck/gpucheck.h: the probes of kvvm-gpucheck (docs/kvvm-gpucheck.md).
 *
 * Contract:
 *  - A probe runs in a child process of its own (main.c re-executes the tool with --child),
 *    against one driver: "cuda" (libkvvm's loader, vmm/drv_cuda.c, the same table the
 *    library uses) or "emulated" (the emulated device, in the child's own process), both
 *    opened through the testing interface (testing/kvvm_testing_driver.h): the tool
 *    includes no private header. A probe
 *    that kills its context (an illegal address) or hangs therefore spoils nothing else.
 *  - A probe reports by printing rows on stdout, one line each:
 *        ROW <tab> id <tab> result <tab> detail
 *    `result` is a short token compared across drivers and against the documented
 *    expectation (main.c's table); `detail` carries figures and is never compared. A probe
 *    that cannot set itself up reports the result "error: <what>".
 *  - The cuda loader probe also prints one line "GPU <tab> present|absent|unusable <tab> why".
 *  - Entry points libkvvm's table lacks (stream capture, graphs, capture modes) are resolved
 *    here only, for the GPU-only probes (gc_extra_load), with the same dlopen +
 *    cuGetProcAddress the library uses; the library is not changed for them.
 */
#ifndef KVVM_GPUCHECK_H
#define KVVM_GPUCHECK_H

#include <stdbool.h>
#include <stddef.h>
#include "kvvm_testing_driver.h"   /* the driver table and its ABI types */

struct gc_opts {
    int device;                 /* CUDA ordinal */
    int queue_ms;               /* how much queued copy work (c) and (d) build, in ms */
    int capture_ms;             /* how long the capture probes keep a capture open */
};

struct gc_dev {
    const struct kcu_api *a;
    int emulated;
    int ordinal;                /* emulated device ordinal (emulated only) */
    kcu_device dev;
    kcu_context ctx;            /* the primary context, retained and current */
    size_t g;                   /* minimum granularity, bytes */
    struct kcu_mem_alloc_prop prop;
    kcu_deviceptr base;         /* a reservation of resv bytes (0 when none asked) */
    size_t resv;
    kcu_stream s;               /* a non-blocking stream */
    const struct gc_opts *o;
};

#define GC_RESV_GRANULES 64

/* Opens the driver (emulated: a new emulated device of 1 GiB, 2 MiB granules, opaque),
   retains and sets the primary context, makes a stream and, when reserve, a reservation.
   0; -ENOENT no CUDA here (why says so); other -errno with why set. */
int gc_dev_open(struct gc_dev *d, int emulated, const struct gc_opts *o, bool reserve,
                char *why, size_t len);

void gc_row(const char *id, const char *result, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* "ok" for success, else the error's name without CUDA_ERROR_ (a static string). */
const char *gc_err(const struct kcu_api *a, kcu_result r);
double gc_now_ms(void);

/* Helpers on d's reservation and stream; each returns the driver's result. */
kcu_result gc_create(struct gc_dev *d, size_t bytes, kcu_mem_handle *h);
kcu_result gc_map(struct gc_dev *d, kcu_deviceptr va, size_t bytes, kcu_mem_handle h);
kcu_result gc_access(struct gc_dev *d, kcu_deviceptr va, size_t bytes);
/* Writes the cookie of seed over [va, va + n) / checks it there: 0 same, 1 differs, else
   -1 with the failing driver result in *r. */
int gc_write(struct gc_dev *d, kcu_deviceptr va, size_t n, unsigned seed, kcu_result *r);
int gc_check(struct gc_dev *d, kcu_deviceptr va, size_t n, unsigned seed, kcu_result *r);

/* Entry points outside libkvvm's table (GPU-only probes). CUstreamCaptureMode values. */
#define GC_CAPTURE_MODE_GLOBAL  0
#define GC_CAPTURE_MODE_RELAXED 2
struct gc_extra {
    kcu_result (*begin_capture)(kcu_stream s, int mode);            /* v2, 10010 */
    kcu_result (*end_capture)(kcu_stream s, void **graph);          /* 10000 */
    kcu_result (*graph_destroy)(void *graph);                       /* 10000 */
    kcu_result (*exchange_mode)(int *mode);                         /* 10010 */
};
int gc_extra_load(struct gc_extra *x, char *why, size_t len);
/* cuGetProcAddress (LEGACY_STREAM flag) of the library libkvvm loads, for each of want[0..n)
   at its ABI version: 0 and fn[i]; -ENOENT at the first missing one (why says so). */
struct gc_sym { const char *name; int version; };
int gc_gpa_all(const struct gc_sym *want, size_t n, void **fn, char *why, size_t len);

struct gc_probe {
    const char *name;
    bool cuda_only;             /* needs the real driver (capture): no emulated column */
    void (*run)(struct gc_dev *d);
};
extern const struct gc_probe gc_probes[];
extern const size_t gc_n_probes;
/* The loader probe (a): rows loader.*, and for cuda the GPU line. */
int gc_probe_loader(int emulated, const struct gc_opts *o);

/* capture.c */
void gc_capture_global_event(struct gc_dev *d);
void gc_capture_relaxed_event(struct gc_dev *d);
void gc_capture_global_ctxsync(struct gc_dev *d);
void gc_capture_relaxed_ctxsync(struct gc_dev *d);
void gc_capture_libkvvm(struct gc_dev *d);
/* kernel.c: a kernel writes through a window, another reads through a second mapping. */
void gc_kernel_window_alias(struct gc_dev *d);
/* oom.c: a budget above the device's free memory through libkvvm (both drivers). */
void gc_oom_budget(struct gc_dev *d);
/* view.c: bytes through the window and a KVVM_F_POOL_VIEW pool view agree (both drivers). */
void gc_view_two_views(struct gc_dev *d);
/* share.c: export and import of a shareable handle, here and in a second process (both
   drivers); gc_share_peer is that second process (--child share.peer): its exit code. */
void gc_share(struct gc_dev *d);
int gc_share_peer(int emulated, const struct gc_opts *o);

#endif
