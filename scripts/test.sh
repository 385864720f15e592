#!/usr/bin/env bash
# The test command (README, .ci/run): installs dependencies, builds, runs the whole suite on
# the emulated device, then again under AddressSanitizer+UBSan. Tests labelled `gpu` skip
# themselves with a printed reason when no GPU is present; `soak` is left to scripts/soak.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc)

echo "=== build (RelWithDebInfo, warnings are errors) ==="
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVVM_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
echo "=== tests ==="
(cd build && ctest --output-on-failure -LE soak)

if [ "${KVVM_SKIP_SANITIZERS:-0}" != 1 ]; then
  echo "=== build (AddressSanitizer + UBSan) ==="
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKVVM_SANITIZE=address \
        -DKVVM_BUILD_TOOLS=ON >/dev/null
  cmake --build build-asan -j"$jobs"
  echo "=== tests under AddressSanitizer + UBSan ==="
  # handle_segv=0: the signal-expecting tests must see their SIGSEGV, not ASan's report.
  (cd build-asan && ASAN_OPTIONS=handle_segv=0:detect_leaks=1:abort_on_error=0 \
     UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 KVVM_TEST_SCALE=0.1 \
     ctest --output-on-failure -LE soak)
fi
echo "=== all tests passed ==="
