/*
 * tools/kvvm-gpucheck/kernel.c: the GPU kernel probe (docs/kvvm-gpucheck.md, "kernel").
 *
 * Every other probe moves bytes with the driver's copies; this one has a kernel write and
 * read device memory through the addresses libkvvm hands out: a small module loaded with
 * cuModuleLoadData from the PTX below (hand-written, kept here: no nvcc at build time, the
 * driver compiles it for the GPU it runs on), one kernel writing a pattern through a window
 * address, another checking it through a second mapping of the same physical handle (what a
 * shared page, a fork's child or the pool view is). GPU only: the emulated device runs no
 * kernels.
 */
#include "gpucheck.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* PTX ISA 7.0 for sm_52 and later (PTX is compiled forward by the driver's JIT). Word i of
   the pattern of seed s is (i * 0x9E3779B1) ^ s (mod 2^32). */
static const char pattern_ptx[] =
    ".version 7.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    "\n"
    "// pattern_write(dst, n, seed): dst[i] = (i * 0x9E3779B1) ^ seed for i < n, one 32-bit\n"
    "// word per thread, i = blockIdx.x * blockDim.x + threadIdx.x\n"
    ".visible .entry pattern_write(\n"
    "    .param .u64 dst,\n"
    "    .param .u32 n,\n"
    "    .param .u32 seed)\n"
    "{\n"
    "    .reg .pred %p1;\n"
    "    .reg .b32 %r<8>;\n"
    "    .reg .b64 %rd<4>;\n"
    "    ld.param.u64 %rd1, [dst];\n"
    "    ld.param.u32 %r1, [n];\n"
    "    ld.param.u32 %r2, [seed];\n"
    "    mov.u32 %r3, %ctaid.x;\n"
    "    mov.u32 %r4, %ntid.x;\n"
    "    mov.u32 %r5, %tid.x;\n"
    "    mad.lo.u32 %r6, %r3, %r4, %r5;          // i\n"
    "    setp.ge.u32 %p1, %r6, %r1;               // i >= n: nothing to do\n"
    "    @%p1 bra W_DONE;\n"
    "    mul.lo.u32 %r7, %r6, 0x9E3779B1;\n"
    "    xor.b32 %r7, %r7, %r2;                   // the word\n"
    "    cvta.to.global.u64 %rd2, %rd1;\n"
    "    mul.wide.u32 %rd3, %r6, 4;\n"
    "    add.u64 %rd2, %rd2, %rd3;                // &dst[i]\n"
    "    st.global.u32 [%rd2], %r7;\n"
    "W_DONE:\n"
    "    ret;\n"
    "}\n"
    "\n"
    "// pattern_check(src, n, seed, bad): *bad += 1 (atomically) for each i < n whose\n"
    "// src[i] is not the pattern's word\n"
    ".visible .entry pattern_check(\n"
    "    .param .u64 src,\n"
    "    .param .u32 n,\n"
    "    .param .u32 seed,\n"
    "    .param .u64 bad)\n"
    "{\n"
    "    .reg .pred %p<3>;\n"
    "    .reg .b32 %r<10>;\n"
    "    .reg .b64 %rd<6>;\n"
    "    ld.param.u64 %rd1, [src];\n"
    "    ld.param.u32 %r1, [n];\n"
    "    ld.param.u32 %r2, [seed];\n"
    "    ld.param.u64 %rd4, [bad];\n"
    "    mov.u32 %r3, %ctaid.x;\n"
    "    mov.u32 %r4, %ntid.x;\n"
    "    mov.u32 %r5, %tid.x;\n"
    "    mad.lo.u32 %r6, %r3, %r4, %r5;          // i\n"
    "    setp.ge.u32 %p1, %r6, %r1;\n"
    "    @%p1 bra C_DONE;\n"
    "    mul.lo.u32 %r7, %r6, 0x9E3779B1;\n"
    "    xor.b32 %r7, %r7, %r2;                   // the expected word\n"
    "    cvta.to.global.u64 %rd2, %rd1;\n"
    "    mul.wide.u32 %rd3, %r6, 4;\n"
    "    add.u64 %rd2, %rd2, %rd3;\n"
    "    ld.global.u32 %r8, [%rd2];\n"
    "    setp.eq.u32 %p2, %r8, %r7;\n"
    "    @%p2 bra C_DONE;\n"
    "    cvta.to.global.u64 %rd5, %rd4;\n"
    "    atom.global.add.u32 %r9, [%rd5], 1;\n"
    "C_DONE:\n"
    "    ret;\n"
    "}\n";

/* The module entry points (outside libkvvm's table), at the ABI versions of cudaTypedefs.h. */
struct gc_module_api {
    kcu_result (*load_data)(void **mod, const void *image);                       /* 2000 */
    kcu_result (*get_function)(void **fn, void *mod, const char *name);           /* 2000 */
    kcu_result (*launch)(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                         unsigned by, unsigned bz, unsigned shmem, kcu_stream s,
                         void **params, void **extra);                            /* 4000 */
    kcu_result (*unload)(void *mod);                                              /* 2000 */
};

static int module_api(struct gc_module_api *m, char *why, size_t len)
{
    void *f[4];
    static const struct gc_sym want[4] = {
        { "cuModuleLoadData", 2000 }, { "cuModuleGetFunction", 2000 },
        { "cuLaunchKernel", 4000 }, { "cuModuleUnload", 2000 },
    };
    if (gc_gpa_all(want, 4, f, why, len))
        return -1;
    memcpy(&m->load_data, &f[0], sizeof f[0]);
    memcpy(&m->get_function, &f[1], sizeof f[1]);
    memcpy(&m->launch, &f[2], sizeof f[2]);
    memcpy(&m->unload, &f[3], sizeof f[3]);
    return 0;
}

#define STEP(expr, what) do { if (!r && (r = (expr))) step = (what); } while (0)

void gc_kernel_window_alias(struct gc_dev *d)
{
    const char *id = "kernel.window_alias";
    struct gc_module_api m;
    char why[256];
    if (module_api(&m, why, sizeof why)) {
        gc_row(id, "unsupported", "module entry points: %s", why);
        return;
    }
    const struct kcu_api *a = d->a;
    void *mod = NULL, *fw = NULL, *fc = NULL;
    kcu_mem_handle h = 0, hb = 0;
    const char *step = "";
    kcu_result r = KCU_SUCCESS;
    kcu_deviceptr win = d->base, alias = d->base + 2 * d->g, bad = d->base + 4 * d->g;
    STEP(m.load_data(&mod, pattern_ptx), "cuModuleLoadData");
    STEP(m.get_function(&fw, mod, "pattern_write"), "cuModuleGetFunction(pattern_write)");
    STEP(m.get_function(&fc, mod, "pattern_check"), "cuModuleGetFunction(pattern_check)");
    STEP(gc_create(d, d->g, &h), "cuMemCreate");
    STEP(gc_create(d, d->g, &hb), "cuMemCreate(counter)");
    STEP(gc_map(d, win, d->g, h), "cuMemMap(window)");
    STEP(gc_map(d, alias, d->g, h), "cuMemMap(second mapping)");
    STEP(gc_map(d, bad, d->g, hb), "cuMemMap(counter)");
    STEP(gc_access(d, win, d->g), "cuMemSetAccess(window)");
    STEP(gc_access(d, alias, d->g), "cuMemSetAccess(second mapping)");
    STEP(gc_access(d, bad, d->g), "cuMemSetAccess(counter)");
    STEP(a->cuMemsetD8Async(bad, 0, 4, d->s), "cuMemsetD8Async");
    unsigned n = (unsigned)(d->g / 4), seed = 0x6b76766d, threads = 256;
    unsigned blocks = (n + threads - 1) / threads;
    void *pw[] = { &win, &n, &seed };
    void *pc[] = { &alias, &n, &seed, &bad };
    double t0 = gc_now_ms();
    STEP(m.launch(fw, blocks, 1, 1, threads, 1, 1, 0, d->s, pw, NULL), "cuLaunchKernel(write)");
    STEP(m.launch(fc, blocks, 1, 1, threads, 1, 1, 0, d->s, pc, NULL), "cuLaunchKernel(check)");
    STEP(a->cuStreamSynchronize(d->s), "cuStreamSynchronize");
    double ms = gc_now_ms() - t0;
    uint32_t nbad = UINT32_MAX;
    uint32_t *host = malloc(d->g);
    STEP(host ? KCU_SUCCESS : KCU_ERROR_OUT_OF_MEMORY, "malloc");
    STEP(a->cuMemcpyDtoHAsync(&nbad, bad, 4, d->s), "cuMemcpyDtoHAsync(counter)");
    STEP(a->cuMemcpyDtoHAsync(host, alias, d->g, d->s), "cuMemcpyDtoHAsync(second mapping)");
    STEP(a->cuStreamSynchronize(d->s), "cuStreamSynchronize");
    unsigned host_bad = 0;
    for (unsigned i = 0; !r && i < n; i++)
        host_bad += host[i] != ((i * 0x9E3779B1u) ^ seed);
    free(host);
    char res[96];
    if (r)
        snprintf(res, sizeof res, "%s:%s", step, gc_err(a, r));
    else if (nbad || host_bad)
        snprintf(res, sizeof res, "differs: kernel %u, host %u words", nbad, host_bad);
    else
        snprintf(res, sizeof res, "ok");
    gc_row(id, res, "a kernel (cuModuleLoadData of hand-written PTX) wrote %u words through a "
           "window mapping, a second kernel checked them through a second mapping of the "
           "same handle (%u words differed), and a copy read them back (%u differed); the "
           "two launches took %.2f ms", n, nbad == UINT32_MAX ? 0 : nbad, host_bad, ms);
    if (mod)
        m.unload(mod);
}
