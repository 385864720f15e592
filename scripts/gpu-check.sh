#!/usr/bin/env bash
# The first run on a GPU machine, as one short prepared command (docs/kvvm-gpucheck.md):
# installs dependencies (when it can), builds, runs kvvm-gpucheck --all (its probes on the
# real driver beside the emulated device, then `ctest -L gpu`, `kvvm-bench --backend cuda
# --quick` and `kvvm-stress --backend cuda` for STRESS_S seconds without and with --stream),
# and prints a short table last. Everything is kept under $GPUCHECK_OUT (default
# build/gpucheck-out): the full log and the table as TSV.
# Exit status: kvvm-gpucheck's (0 as expected, 1 a surprise, 77 no GPU present: no CUDA
# driver library or no device); 1 also when the build fails.
# Environment: STRESS_S (30), QUEUE_MS (1000), KVVM_TEST_DEVICE / DEVICE (0), JOBS (nproc),
# GPUCHECK_TIMEOUT (420 s, the bound on kvvm-gpucheck --all; with the build this stays under
# a 10-minute command limit). Where $OUT is set (the device runner's folder that comes back),
# the log and the TSV are copied there too.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${GPUCHECK_OUT:-build/gpucheck-out}
stress_s=${STRESS_S:-30}
device=${DEVICE:-${KVVM_TEST_DEVICE:-0}}
jobs=${JOBS:-$(nproc)}
mkdir -p "$out"
log=$out/gpu-check.log
: >"$log"
t0=$(date +%s)
declare -a steps=()
note() { steps+=("$(printf '%-22s %s' "$1" "$2")"); }
say() { echo "=== $*" | tee -a "$log"; }

say "dependencies"
if bash scripts/install-deps.sh >>"$log" 2>&1; then note deps ok
else note deps "install-deps.sh failed (offline?): building with what is here"; fi

say "build (RelWithDebInfo)"
tb=$(date +%s)
if cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >>"$log" 2>&1; then
  note configure ok
else
  # No Criterion here (and no network to install it): the tools still build.
  if cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVVM_BUILD_TESTS=OFF \
       >>"$log" 2>&1; then note configure "ok without tests (Criterion missing?)"
  else note configure FAILED; fi
fi
if cmake --build build -j"$jobs" >>"$log" 2>&1; then
  note build "ok ($(( $(date +%s) - tb )) s)"
else
  note build "FAILED (see $log)"
  tail -30 "$log"
  printf '\n%s\n' "${steps[@]}"
  exit 1
fi

limit=${GPUCHECK_TIMEOUT:-420}
say "kvvm-gpucheck --all (device $device, stress ${stress_s} s, at most ${limit} s)"
# The bound on the whole check (probes, ctest -L gpu, bench, two stress runs).
timeout "$limit" build/tools/kvvm-gpucheck --all --device "$device" --stress-s "$stress_s" \
  --queue-ms "${QUEUE_MS:-1000}" --tsv "$out/gpucheck.tsv" 2>&1 | tee -a "$log"
status=${PIPESTATUS[0]}
case $status in
  0) note kvvm-gpucheck "exit 0: no surprise" ;;
  1) note kvvm-gpucheck "exit 1: surprises (table below)" ;;
  77) note kvvm-gpucheck "exit 77: no GPU present (no CUDA driver library or no device)" ;;
  124) note kvvm-gpucheck "exit 124: timed out after $limit s" ;;
  *) note kvvm-gpucheck "exit $status" ;;
esac

echo
echo "=== gpu-check summary ($(( $(date +%s) - t0 )) s; log: $log)"
printf '%s\n' "${steps[@]}"
if [ -s "$out/gpucheck.tsv" ]; then
  echo
  awk -F'\t' 'NR > 1 { n[$5]++ } END { printf "rows:"; for (v in n) printf " %d %s", n[v], v; print "" }' \
    "$out/gpucheck.tsv"
  # Every row that is not plainly fine, then the suite steps.
  awk -F'\t' 'NR > 1 && ($5 != "ok" && $5 != "info" && $5 != "-" || $1 ~ /^suite\./) {
      printf "  %-26s %-12s cuda: %s | emulated: %s\n", $1, $5, $4, $3 }' "$out/gpucheck.tsv"
fi
[ "$status" = 77 ] && echo "no GPU present: only the emulated column ran (exit 77)"
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
  cp "$log" "$OUT/" && [ -f "$out/gpucheck.tsv" ] && cp "$out/gpucheck.tsv" "$OUT/"
fi
exit "$status"
