#!/usr/bin/env bash
# scripts/test.sh's stage logic (issue 32: one failing stage stopped the command, so the later
# stages and the table of stage times never ran). The script runs in a copy of its own with
# fakes: cmake, ctest, install-deps.sh, fuzz.sh, clang-tidy-quiet.sh and size-audit.py that
# do nothing, except that the main build and the ASan tests fail. Every stage must still run,
# the stages that need the failed build are reported "not run", the table gives each stage's
# result, and the command exits 1. No real build or test runs (a few seconds).
# With --background (CTest regress_background_jobs_starved_beside_load, issue 31): only that
# the background jobs still running when the stages end go on at the command's own priority
# (process group and autogroup), not nice 19: beside two CPU burners at nice 0 they got about
# 1% of the CPU and the command waited hours for them. The fake fuzz.sh reports its priority
# once test.sh has printed the background jobs' heading (the raise comes before it).
# Usage: test_command_stages.sh SOURCE_DIR [--background]
set -euo pipefail
src=$1 mode=${2:-all}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tree=$tmp/tree bin=$tmp/bin
mkdir -p "$tree/scripts" "$bin"
cp "$src/scripts/test.sh" "$tree/scripts/"
for d in common core vmm vmm/emu paging host disk store swap prefix pool testing; do   # clang-tidy's
    mkdir -p "$tree/$d" && touch "$tree/$d/a.c"
done
for f in install-deps.sh fuzz.sh clang-tidy-quiet.sh; do
    printf '#!/bin/sh\necho "fake %s"\n' "$f" >"$tree/scripts/$f"
done
echo 'print("fake size audit")' >"$tree/scripts/size-audit.py"
cat >"$tree/scripts/fuzz.sh" <<'EOF'
#!/bin/sh
until grep -q '^=== background jobs' "$FAKE_TEST_OUT"; do sleep 0.1; done
g=$(sed -n 's/.* nice \(-*[0-9]*\)$/\1/p' /proc/self/autogroup 2>/dev/null)
echo "fake fuzz.sh: nice $(nice), autogroup nice ${g:-none}"
EOF
cat >"$bin/cmake" <<'EOF'
#!/bin/sh
case "$*" in *"--build build -j"*) echo "fake: the main build fails"; exit 2;; esac
exit 0
EOF
cat >"$bin/ctest" <<'EOF'
#!/bin/sh
case "$PWD" in *build-clang-asan) echo "fake: the ASan tests fail"; exit 8;; esac
# the debug tests burn 1.2 s of CPU (counted by CPU, not by time): their row must show it
case "$PWD" in *build-debug) python3 -c 'import time
t = time.process_time()
while time.process_time() - t < 1.2: pass';; esac
echo "fake ctest in $PWD"
EOF
chmod +x "$bin"/* "$tree"/scripts/*
mkdir -p "$tree/build" "$tree/build-debug" "$tree/build-clang-asan" "$tree/build-tsan"
rc=0
(cd "$tree" && FAKE_TEST_OUT="$tmp/out" PATH="$bin:$PATH" bash scripts/test.sh) >"$tmp/out" 2>&1 \
    || rc=$?
cat "$tmp/out"
fail=0
own=$(nice)
if [ "$(id -u)" = 0 ]; then
    grep -x "fake fuzz.sh: nice $own, autogroup nice \($own\|none\)" "$tmp/out" >/dev/null ||
        { echo "FAIL: the background job did not go on at the command's priority ($own)"
          fail=1; }
else
    grep -q '^note: the background jobs stay at the lowest priority' "$tmp/out" ||
        { echo "FAIL: not root, and no note that the background jobs stay low"; fail=1; }
fi
if [ "$mode" = --background ]; then
    [ "$fail" = 0 ] || exit 1
    echo "ok: the background jobs go on at the command's priority once the stages are done"
    exit 0
fi
[ "$rc" = 1 ] || { echo "FAIL: exit status $rc, not 1"; fail=1; }
# row RESULT TITLE: the final table has the stage's row with that result
row() {
    grep -E "^ +([0-9]+ s +[0-9]+ s)? +$1 +$2\$" "$tmp/out" >/dev/null ||
        { echo "FAIL: no table row '$1  $2'"; fail=1; }
}
row FAILED  'build \(RelWithDebInfo, warnings are errors\)'
row 'not run' 'tests'
row 'not run' 'Python package \(python/tests, .*\)'
row 'not run' 'Python package: pip install .*'
row passed  'build \(KVVM_DEBUG: .*\)'
row passed  'tests in the KVVM_DEBUG build'
row passed  'size audit .*'
row passed  'build \(clang, AddressSanitizer \+ UBSan\)'
row FAILED  'tests under clang AddressSanitizer \+ UBSan'
row passed  'build \(ThreadSanitizer: the threads tests only\)'
row passed  'threads under ThreadSanitizer'
row passed  ' *clang-tidy .*'
row passed  ' *fuzzing .*'
# the CPU column counts the stage's processes (it read 0 s for every stage when the count was
# taken in a command substitution's subshell)
grep -E "^ +[0-9]+ s +([1-9][0-9]*) s +passed +tests in the KVVM_DEBUG build\$" "$tmp/out" \
    >/dev/null || { echo "FAIL: the debug tests' 1.2 s of CPU not in their row"; fail=1; }
grep -x '=== 5 failed:' "$tmp/out" >/dev/null || { echo "FAIL: not '=== 5 failed:'"; fail=1; }
! grep -x '=== all tests passed ===' "$tmp/out" >/dev/null ||
    { echo "FAIL: 'all tests passed' with failed stages"; fail=1; }
[ "$fail" = 0 ] || exit 1
echo "ok: every stage ran, each reported, exit 1"
