#!/usr/bin/env bash
# The test command (README, .ci/run): installs dependencies, builds, runs the whole suite on
# the emulated device, then again under AddressSanitizer+UBSan (clang's, whose UBSan checks
# more than gcc's, e.g. arithmetic on NULL; one sanitizer build, not two), then the
# multi-threaded tests (tests/tsan_threads.c, the reclaim thread running; again with the disk
# tier; tests/stream_random.c) under ThreadSanitizer. The Python package's tests
# (python/tests) run after the first suite, the model test once more from a fresh virtual
# environment after `pip install ./python`. Then the suite in the KVVM_DEBUG build (asserts
# and the invariant checker after every call) and the size audit (a report).
# Beside all that, at the lowest priority (background jobs, below): clang-tidy over the
# library (zero findings) and the libFuzzer target (scripts/fuzz.sh: the seed corpus, then
# 10 000 new inputs against the reference model).
# Each ctest runs its entries side by side (-j, one per core); the entries that must run alone
# say so (RUN_SERIAL, RESOURCE_LOCK in tests/CMakeLists.txt). At the end: each stage's wall and
# CPU time. About 630 s of CPU in all, 5.5 minutes on an idle 2-core machine (README: 319 and
# 339 s measured; 13.8 minutes, ~1 600 s of CPU, on the slower idle 2-core machine of the
# earlier timings; 19.4 before -j).
# Tests labelled `gpu` skip themselves with a printed reason when no GPU is present; the long
# `soak` label is run by hand: (cd build && ctest -L soak); its 60 s version (label
# `longrun`) runs in the first suite only (under ASan the allocator's quarantine grows RSS).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc)

# The time each stage takes, wall and CPU (user + sys of the processes it ran, from `times`
# in this shell), printed at the end: where the test command's time goes.
timesf=$(mktemp /tmp/kvvm-test-times.XXXXXX)
stage_name="" stage_log="" stage_t0=$SECONDS stage_cpu0=0 test_t0=$SECONDS
stage() {   # stage TITLE: ends the stage running (noting its times), starts TITLE
    local now=$SECONDS cpu
    times >"$timesf"
    # times: this shell's user and sys, then its children's ("1m2.345s 0m6.789s")
    cpu=$(awk 'NR == 2 { n = split($0, f, /[ms ]+/)
                         for (i = 1; i < n; i += 2) t += f[i] * 60 + f[i + 1]
                         printf "%d", t }' "$timesf")
    if [ -n "$stage_name" ]; then
        echo "--- $((now - stage_t0)) s wall, $((cpu - stage_cpu0)) s CPU"
        stage_log+=$(printf '%5d s %6d s  %s' $((now - stage_t0)) $((cpu - stage_cpu0)) \
                            "$stage_name")$'\n'
    fi
    stage_name=$1 stage_t0=$now stage_cpu0=$cpu
    [ -z "$1" ] || echo "=== $1 ==="
}

# Background jobs: work of a fixed size that needs no other stage's output runs beside the
# stages at the lowest priority (nice 19), so it takes the cycles they leave idle (a test
# waiting on its disk, the soak's minute, ctest's last long test, a link) rather than a time
# of its own. Each one's output goes to a log, printed at the end; a failure fails the command
# there. Each runs in a session of its own (setsid), so an early exit stops it whole; a new
# session is a new scheduler autogroup (Linux's default), which competes with the stages'
# group as an equal whatever its tasks' nice values, so the group's own nice is set too.
bgdir=$(mktemp -d /tmp/kvvm-test-bg.XXXXXX) bg_names=() bg_pids=()
trap 'for p in ${bg_pids[@]+"${bg_pids[@]}"}; do kill -- -"$p" 2>/dev/null; done
      rm -rf "$timesf" "$bgdir"' EXIT
bg_start() {   # bg_start NAME COMMAND...
    local name=$1; shift
    setsid bash -c '{ echo 19 >/proc/self/autogroup; } 2>/dev/null; exec nice -n 19 "$@"' \
           bg "$@" >"$bgdir/${#bg_pids[@]}.log" 2>&1 &
    bg_names+=("$name") bg_pids+=($!)
}
tidy_all() {   # clang-tidy (.clang-tidy) on the library, zero findings
    CC=clang cmake -S . -B build-tidy -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
          -DKVVM_BUILD_TESTS=OFF -DKVVM_BUILD_TOOLS=OFF >/dev/null
    # one file per process: clang-tidy 14 crashes on a long file list in one run
    ls common/*.c core/*.c vmm/*.c vmm/emu/*.c paging/*.c host/*.c disk/*.c store/*.c \
       swap/*.c prefix/*.c testing/*.c | grep -v cudrv_check |
      xargs -P"$jobs" -n1 scripts/clang-tidy-quiet.sh -p build-tidy --quiet
}
export -f tidy_all
export jobs
bg_start "clang-tidy (.clang-tidy) on the library, zero findings" \
         bash -c 'set -euo pipefail; tidy_all'
if [ "${KVVM_SKIP_SANITIZERS:-0}" != 1 ]; then
  # the libFuzzer target (ASan + UBSan): the corpus replayed, then 10 000 new inputs (about
  # 120 s of one core) from seed 1: a count, so the same inputs however busy the machine is
  bg_start "fuzzing (tests/fuzz/fuzz_api: the corpus, then 10 000 new inputs)" \
           bash scripts/fuzz.sh --runs 10000
fi

stage "build (RelWithDebInfo, warnings are errors)"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVVM_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
stage "tests"
(cd build && ctest -j"$jobs" --output-on-failure -LE soak)
stage "Python package (python/tests, /usr/bin/python3, build/libkvvm.so)"
# The system interpreter: Debian's python3-torch/numpy/pytest belong to it (another python3
# may come first on PATH). KVVM_EMU_OPAQUE=1 as for the C tests: each test says what it needs.
KVVM_LIBRARY="$PWD/build/libkvvm.so" KVVM_EMU_OPAQUE=1 \
  /usr/bin/python3 -m pytest -q -rs -p no:cacheprovider python/tests
stage "Python package: pip install ./python into a fresh venv, then the model test"
root=$PWD venv=$(mktemp -d /tmp/kvvm-venv.XXXXXX)
/usr/bin/python3 -m venv --system-site-packages "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check ./python
# from outside the tree, so the installed package is the one imported (checked)
(cd "$venv" && export KVVM_LIBRARY="$root/build/libkvvm.so" &&
   "$venv/bin/python" -c 'import kvvm, sys; assert kvvm.__file__.startswith(sys.prefix), kvvm.__file__' &&
   "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider "$root/python/tests/test_model.py")
rm -rf "$venv"

stage "build (KVVM_DEBUG: internal asserts, the invariant checker after every call)"
# Labels: cpu without soak/stress (stress_short's thresholds are throughput over a fixed
# time, which the checker's per-call walk lowers) and without the packaging tests (they
# test the installed files, not the library's state); the model test at KVVMTEST_SCALE=0.1
# as under the sanitizers. A broken invariant aborts the test at the call that broke it.
# -O2 without -g (CMAKE_C_FLAGS_RELWITHDEBINFO): a broken invariant names its file and line
# itself, so the debug information (a fifth of this build's compile time) serves nothing here.
cmake -S . -B build-debug -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVVM_WERROR=ON -DKVVM_DEBUG=ON \
      -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG" -DKVVM_BUILD_TOOLS=OFF >/dev/null
cmake --build build-debug -j"$jobs"
(cd build-debug && KVVMTEST_SCALE=0.1 ctest -j"$jobs" --output-on-failure -L cpu \
   -LE 'soak|stress' -E 'install_consumer|example_engine|package_deb')

stage "size audit (files > 1000 lines, functions > 120; report only)"
python3 scripts/size-audit.py

if [ "${KVVM_SKIP_SANITIZERS:-0}" != 1 ]; then
  stage "build (clang, AddressSanitizer + UBSan)"
  # The library and the tools at -O1 (KVVM_CODE_OPT, as ASan's documentation recommends), the
  # tests' own sources at -O0 (Debug): at -O1 they cost more to compile than they save.
  CC=clang cmake -S . -B build-clang-asan -DCMAKE_BUILD_TYPE=Debug -DKVVM_SANITIZE=address \
        -DKVVM_CODE_OPT=-O1 -DKVVM_BUILD_TOOLS=ON >/dev/null
  cmake --build build-clang-asan -j"$jobs"
  stage "tests under clang AddressSanitizer + UBSan"
  # handle_segv=0: the signal-expecting tests must see their SIGSEGV, not ASan's report.
  (cd build-clang-asan && ASAN_OPTIONS=handle_segv=0:detect_leaks=1:abort_on_error=0 \
     UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 KVVMTEST_SCALE=0.1 \
     ctest -j"$jobs" --output-on-failure -LE 'soak|longrun')
  stage "build (ThreadSanitizer: the threads tests only)"
  cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DKVVM_SANITIZE=thread \
        -DKVVM_BUILD_TOOLS=OFF >/dev/null
  cmake --build build-tsan -j"$jobs" --target tsan_threads stream_random
  stage "threads under ThreadSanitizer"
  # Criterion cannot start under TSan, so these are plain programs; any report fails them.
  (cd build-tsan && TSAN_OPTIONS=halt_on_error=1:exitcode=66 KVVMTEST_TSAN_ITERS=1000 \
     ctest -j"$jobs" --output-on-failure -R 'tsan_threads|stream_random')
fi
stage "background jobs: waiting for the rest of them"
bg_failed=""
for i in "${!bg_pids[@]}"; do
    if wait "${bg_pids[$i]}"; then
        echo "--- ${bg_names[$i]}: passed; the end of its log:"
        tail -n 12 "$bgdir/$i.log"
    else
        echo "--- ${bg_names[$i]}: FAILED; its log:"
        cat "$bgdir/$i.log"
        bg_failed+=" '${bg_names[$i]}'"
    fi
done
bg_pids=()
[ -z "$bg_failed" ] || { echo "=== failed:$bg_failed ==="; exit 1; }
stage ""
# (a background job's CPU counts in the stage during which it ended: bash collects it then)
echo "=== time per stage (wall, CPU = user + sys of its processes; $jobs cores) ==="
printf '%s' "$stage_log"
echo "total: $((SECONDS - test_t0)) s wall"
echo "=== all tests passed ==="
