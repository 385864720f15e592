/*
 * common/env.h: every KVVM_* environment variable that is not a configuration field, as one
 * list.
 *
 * Contract: KVVM_ENV_VARS(X) names each such variable read by the library, its Python
 * package, its tests or scripts: X(NAME, reader, doc). The configuration fields are the
 * other half (KVVM_<FIELD>: core/config.c's option table). kvvm_config_init warns about a
 * KVVM_* variable in neither; the library reads its variables through kenv(NAME), which
 * does not compile for a name not in the list; docs/api.md's "Other environment variables"
 * table lists those the library reads (scripts/check-env.py checks every use in the tree
 * and that table against this list).
 */
#ifndef KVVM_COMMON_ENV_H
#define KVVM_COMMON_ENV_H

#include <stdlib.h>

#define KVVM_ENV_VARS(X)                                                                    \
    X(KVVM_LOG, "common/log.c", "log level: debug, info, warn (default), error, off")       \
    X(KVVM_SPILL_ALLOW_TMPFS, "core/config.c",                                              \
      "1 (any value but 0): adds KVVM_F_SPILL_ALLOW_TMPFS to flags")                        \
    X(KVVM_CUDA_LIBRARY, "vmm/drv_cuda.c",                                                  \
      "path of the CUDA driver library (default libcuda.so.1)")                             \
    X(KVVM_EMU_FAIL, "vmm/emu/entry.c",                                                     \
      "emulated device fault injection: entry:nth:error,... (tests)")                       \
    X(KVVM_EMU_MAX_MAPS, "vmm/emu/device.c",                                                \
      "bound on live emulated mappings (default below vm.max_map_count)")                   \
    X(KVVM_EMU_CREATE_NS, "vmm/emu/memory.c",                                             \
      "emulated cost of cuMemCreate in ns (kvvm-bench frames; default 0)")                 \
    X(KVVM_EMU_UNMAP_SPAN, "vmm/emu/maps.c",                                               \
      "0: the emulated cuMemUnmap refuses a range of several mappings (tests)")            \
    X(KVVM_EMU_HELD, "vmm/emu/device.c",                                                    \
      "emulated device memory held by others, bytes (K/M/G): less free than the capacity") \
    X(KVVM_IO_ENGINE, "disk/disk.c", "disk I/O engine: io_uring, psync or auto (default)")  \
    X(KVVM_LIBRARY, "python/kvvm/_lib.py", "the Python package: path of libkvvm.so")        \
    X(KVVM_KVVMD, "python/tests/conftest.py",                                               \
      "the Python tests: the kvvmd they start (default tools/kvvmd beside libkvvm.so)")     \
    X(KVVM_TEST_DEVICE, "tests/test_cuda.c, scripts/gpu-check.sh",                          \
      "the GPU tests' CUDA device ordinal (default 0)")                                     \
    X(KVVM_SKIP_SANITIZERS, "scripts/test.sh", "1: skip the sanitizer builds and runs")     \
    X(KVVM_BENCH_POOL_GIVE, "tools/kvvm-bench/bench_pool.c",                                \
      "set: kvvm-bench's pool group runs its giving-back row alone (a trace of it)")       \
    X(KVVM_BENCH_STORE, "tools/kvvm-bench/bench_store.c",                                   \
      "kvvm-bench's store group: the parts to run (redis,redis-cluster,file,attach)")

enum kenv_id {
#define X(name, reader, doc) KENV_##name,
    KVVM_ENV_VARS(X)
#undef X
    KENV_COUNT
};

/* getenv of a listed variable; a name not in KVVM_ENV_VARS does not compile. */
#define kenv(name) ((void)KENV_##name, getenv(#name))

#endif
