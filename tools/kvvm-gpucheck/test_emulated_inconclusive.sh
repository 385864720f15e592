#!/usr/bin/env bash
# CTest gpucheck_emulated_inconclusive_is_not_diff (label cpu), the regression test of a CI
# failure: under clang ASan the emulated column's queue drained before pinned.dtoh looked
# ("inconclusive") while the cuda column answered, and the row was judged DIFF (a surprise)
# where there was nothing to compare. Here the emulated queue is drained on purpose
# (KVVMTEST_GPUCHECK_DRAIN_EMULATED=1, over the fake driver as in gpucheck_fake_driver):
# every compared timed row must be emulated "inconclusive" with verdict INCONCLUSIVE.
# usage: test_emulated_inconclusive.sh kvvm-gpucheck fake_capture.so fake_libcuda.so
set -uo pipefail
tool=$1 front=$2 inner=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
KVVMTEST_GPUCHECK_DRAIN_EMULATED=1 KVVM_CUDA_LIBRARY=$front FAKE_CAPTURE_INNER=$inner \
  "$tool" --queue-ms 300 --capture-ms 50 --tsv "$tmp/rows.tsv" >"$tmp/out" 2>&1
[ -s "$tmp/rows.tsv" ] || { cat "$tmp/out"; echo "FAIL: no table"; exit 1; }
awk -F'\t' '$1 ~ /^(queued\.|pinned\.dtoh$)/ { n++
    if ($3 != "inconclusive" || $5 != "INCONCLUSIVE") {
      print "FAIL: " $1 ": emulated " $3 ", cuda " $4 ", verdict " $5 " (want INCONCLUSIVE)"; bad = 1 } }
    END { if (n != 5) { print "FAIL: " n + 0 " timed compared rows, want 5"; bad = 1 }
          if (!bad) print "ok: the 5 timed compared rows with a drained emulated queue are INCONCLUSIVE"
          exit bad }' "$tmp/rows.tsv"
