#!/usr/bin/env bash
# The test command (README, .ci/run): installs dependencies, builds, runs the whole suite on
# the emulated device, then again under AddressSanitizer+UBSan (clang's, whose UBSan checks
# more than gcc's, e.g. arithmetic on NULL; one sanitizer build, not two), then the multi-threaded test
# (tests/tsan_threads.c, the reclaim thread running; again with the disk tier) under
# ThreadSanitizer, after the libFuzzer target (scripts/fuzz.sh: the seed corpus, then 120 s
# of new inputs against the reference model). The Python package's tests (python/tests) run after the first suite, the
# model test once more from a fresh virtual environment after `pip install ./python`. Then
# the suite in the KVVM_DEBUG build (asserts and the invariant checker after every call),
# clang-tidy over the library (zero findings) and the size audit (a report).
# Tests labelled `gpu` skip themselves with a printed reason when no GPU is present; the long
# `soak` label is run by hand: (cd build && ctest -L soak); its 60 s version (label
# `longrun`) runs in the first suite only (under ASan the allocator's quarantine grows RSS).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc)

echo "=== build (RelWithDebInfo, warnings are errors) ==="
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVVM_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
echo "=== tests ==="
(cd build && ctest --output-on-failure -LE soak)
echo "=== Python package (python/tests, /usr/bin/python3, build/libkvvm.so) ==="
# The system interpreter: Debian's python3-torch/numpy/pytest belong to it (another python3
# may come first on PATH). KVVM_EMU_OPAQUE=1 as for the C tests: each test says what it needs.
KVVM_LIBRARY="$PWD/build/libkvvm.so" KVVM_EMU_OPAQUE=1 \
  /usr/bin/python3 -m pytest -q -rs -p no:cacheprovider python/tests
echo "=== Python package: pip install ./python into a fresh venv, then the model test ==="
root=$PWD venv=$(mktemp -d /tmp/kvvm-venv.XXXXXX)
/usr/bin/python3 -m venv --system-site-packages "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check ./python
# from outside the tree, so the installed package is the one imported (checked)
(cd "$venv" && export KVVM_LIBRARY="$root/build/libkvvm.so" &&
   "$venv/bin/python" -c 'import kvvm, sys; assert kvvm.__file__.startswith(sys.prefix), kvvm.__file__' &&
   "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider "$root/python/tests/test_model.py")
rm -rf "$venv"

echo "=== build (KVVM_DEBUG: internal asserts, the invariant checker after every call) ==="
# Labels: cpu without soak/stress (stress_short's thresholds are throughput over a fixed
# time, which the checker's per-call walk lowers) and without the packaging tests (they
# test the installed files, not the library's state); the model test at KVVMTEST_SCALE=0.1
# as under the sanitizers. A broken invariant aborts the test at the call that broke it.
cmake -S . -B build-debug -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVVM_WERROR=ON -DKVVM_DEBUG=ON \
      -DKVVM_BUILD_TOOLS=OFF >/dev/null
cmake --build build-debug -j"$jobs"
(cd build-debug && KVVMTEST_SCALE=0.1 ctest --output-on-failure -L cpu -LE 'soak|stress' \
   -E 'install_consumer|example_engine|package_deb')

echo "=== clang-tidy (.clang-tidy) on the library, zero findings ==="
CC=clang cmake -S . -B build-tidy -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DKVVM_BUILD_TESTS=OFF \
      -DKVVM_BUILD_TOOLS=OFF >/dev/null
# one file per process: clang-tidy 14 crashes on a long file list in one run
ls common/*.c core/*.c vmm/*.c vmm/emu/*.c paging/*.c host/*.c disk/*.c store/*.c swap/*.c \
  prefix/*.c testing/*.c | grep -v cudrv_check |
  xargs -P"$jobs" -n1 scripts/clang-tidy-quiet.sh -p build-tidy --quiet
echo "=== size audit (files > 1000 lines, functions > 120; report only) ==="
python3 scripts/size-audit.py

if [ "${KVVM_SKIP_SANITIZERS:-0}" != 1 ]; then
  echo "=== build (clang, AddressSanitizer + UBSan) ==="
  CC=clang cmake -S . -B build-clang-asan -DCMAKE_BUILD_TYPE=Debug -DKVVM_SANITIZE=address \
        -DKVVM_BUILD_TOOLS=ON >/dev/null
  cmake --build build-clang-asan -j"$jobs"
  echo "=== tests under clang AddressSanitizer + UBSan ==="
  # handle_segv=0: the signal-expecting tests must see their SIGSEGV, not ASan's report.
  (cd build-clang-asan && ASAN_OPTIONS=handle_segv=0:detect_leaks=1:abort_on_error=0 \
     UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 KVVMTEST_SCALE=0.1 \
     ctest --output-on-failure -LE 'soak|longrun')
  echo "=== fuzzing (tests/fuzz/fuzz_api: the corpus replayed, then 120 s of new inputs) ==="
  bash scripts/fuzz.sh 120
  echo "=== build (ThreadSanitizer: the threads tests only) ==="
  cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DKVVM_SANITIZE=thread \
        -DKVVM_BUILD_TOOLS=OFF >/dev/null
  cmake --build build-tsan -j"$jobs" --target tsan_threads stream_random
  echo "=== threads under ThreadSanitizer ==="
  # Criterion cannot start under TSan, so these are plain programs; any report fails them.
  (cd build-tsan && TSAN_OPTIONS=halt_on_error=1:exitcode=66 KVVMTEST_TSAN_ITERS=1000 \
     ctest --output-on-failure -R 'tsan_threads|stream_random')
fi
echo "=== all tests passed ==="
