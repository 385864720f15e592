#!/usr/bin/env bash
# run-gpu-check.sh [OUTDIR]: validates this GPU node with the libkvvm bundle it sits in
# (made by scripts/gpu-bundle.sh; docs/kvvm-gpucheck.md, "The bundle"). No compiler, no
# package install, no network: only what the bundle holds, the node's C runtime, its CUDA
# driver and (for the PyTorch probe) a python3 with torch if there is one.
#
# Steps, each bounded by a timeout, all within 8 minutes:
#   detect   kvvm-gpucheck --detect: no GPU present -> says so, exits 77
#   probes   kvvm-gpucheck: the driver beside the emulated device (table + TSV)
#   tests    test_cuda: libkvvm's GPU tests on the driver
#   bench    kvvm-bench --backend cuda --only vmm,frames,swap (driver-call costs, map-run
#            amortization, pinned copy bandwidth against raw cuMemcpyAsync loops)
#   stress   kvvm-stress --backend cuda, synchronous mode, then stream mode (no disk tier)
#   torch    tools/torch_probe.py, where torch with CUDA is importable
#   handoff  kvvm-bench --backend cuda --only handoff: the bundle's kvvmd on the GPU and
#            clients of it (hand-off, attach of 64 blocks from the pool against a local
#            attach: the driver's import and map costs), with the time left (60 s or more;
#            else said and skipped: the checks above come first)
# Output folder: OUTDIR, else $OUT, else ./gpu-check-out. Written as the run goes:
# summary.txt (one line per step), gpucheck.tsv (the probes' rows, then one row per step),
# one log per step, bench.json, handoff.json.
# Exit: 0 every step as expected; 1 a step failed, timed out or printed a leak; 77 no GPU.
# Environment: DEVICE (CUDA ordinal, 0), STRESS_S (30), BUDGET_S (470: the whole run).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-${OUT:-$PWD/gpu-check-out}}
mkdir -p "$out"
out=$(cd "$out" && pwd)
device=${DEVICE:-0}
stress_s=${STRESS_S:-30}
budget=${BUDGET_S:-470}
export KVVM_TEST_DEVICE=$device
export KVVM_LIBRARY=$here/lib/libkvvm.so
export PYTHONPATH=$here/python${PYTHONPATH:+:$PYTHONPATH}
t0=$(date +%s)
summary=$out/summary.txt
tsv=$out/gpucheck.tsv
failed=0
printf '%-10s %-8s %-6s %-6s %s\n' step exit secs leaks verdict >"$summary"

# step NAME TIMEOUT CMD...: runs CMD with its output in NAME.log (and on stdout), records
# its line in summary.txt and the TSV at once. Skipped when the time left is too short.
step() {
  local name=$1 limit=$2; shift 2
  local left=$(( budget - ($(date +%s) - t0) ))
  if [ "$left" -lt 15 ]; then
    printf '%-10s %-8s %-6s %-6s %s\n' "$name" - - - "not run: out of time" | tee -a "$summary"
    failed=1
    return
  fi
  [ "$limit" -le "$left" ] || limit=$left
  echo "=== $name (at most $limit s): $*"
  local ts=$(date +%s)
  timeout -k 5 "$limit" "$@" >"$out/$name.log" 2>&1
  local st=$?
  cat "$out/$name.log"
  local secs=$(( $(date +%s) - ts )) leaks
  leaks=$(grep -ci 'leak' "$out/$name.log")
  local verdict=ok
  case $st in
    0) [ "$leaks" -eq 0 ] || verdict=FAIL ;;
    77) verdict=skipped ;;
    124|137) verdict="FAIL (timed out)" ;;
    *) verdict=FAIL ;;
  esac
  [ "$name" = torch ] && [ $st -eq 77 ] && verdict="skipped (no torch with CUDA)"
  [[ $verdict == FAIL* ]] && failed=1
  printf '%-10s %-8s %-6s %-6s %s\n' "$name" "$st" "$secs" "$leaks" "$verdict" | tee -a "$summary"
  [ -f "$tsv" ] && printf 'step.%s\texit 0, no leak line\t-\texit %s, %s leak lines\t%s\n' \
    "$name" "$st" "$leaks" "$verdict" >>"$tsv"
  return 0
}

echo "libkvvm GPU check: $(head -2 "$here/MANIFEST" 2>/dev/null | tail -1); output in $out"
"$here/bin/kvvm-gpucheck" --detect --device "$device" >"$out/detect.log" 2>&1
st=$?
cat "$out/detect.log"
if [ $st -eq 77 ]; then
  echo "no GPU present on this node: nothing to check (exit 77)" | tee -a "$summary"
  exit 77
fi
if [ $st -ne 0 ]; then
  echo "the CUDA driver is present but unusable (see $out/detect.log): exit 1" | tee -a "$summary"
  exit 1
fi

step probes 150 "$here/bin/kvvm-gpucheck" --device "$device" --queue-ms 500 \
  --capture-ms 300 --tsv "$tsv"
step tests 110 "$here/bin/test_cuda" -j1
step bench 80 "$here/bin/kvvm-bench" --backend cuda --quick --only vmm,frames,swap \
  --json "$out/bench.json"
step stress $(( 25 + stress_s )) "$here/bin/kvvm-stress" --backend cuda --no-disk \
  --duration "$stress_s"
step stress_stream $(( 25 + stress_s )) "$here/bin/kvvm-stress" --backend cuda --no-disk \
  --duration "$stress_s" --stream
if command -v python3 >/dev/null; then
  step torch 90 python3 "$here/tools/torch_probe.py" --device "$device" --tsv "$tsv"
else
  printf '%-10s %-8s %-6s %-6s %s\n' torch - - - "skipped (no python3)" | tee -a "$summary"
fi

if [ $(( budget - ($(date +%s) - t0) )) -ge 60 ]; then
  step handoff 90 "$here/bin/kvvm-bench" --backend cuda --only handoff --trials 7 \
    --json "$out/handoff.json"
else
  printf '%-10s %-8s %-6s %-6s %s\n' handoff - - - "skipped (less than 60 s left)" |
    tee -a "$summary"
fi

echo
echo "=== summary ($(( $(date +%s) - t0 )) s; $out)"
cat "$summary"
if [ -s "$tsv" ]; then
  awk -F'\t' 'NR > 1 && $1 !~ /^step\./ { n[$5]++ }
      END { printf "probe rows:"; for (v in n) printf " %d %s", n[v], v; print "" }' "$tsv"
  awk -F'\t' 'NR > 1 && $1 !~ /^step\./ && $5 != "ok" && $5 != "info" && $5 != "-" {
      printf "  %-30s %-12s cuda: %s | emulated: %s\n", $1, $5, $4, $3 }' "$tsv"
fi
exit $failed
