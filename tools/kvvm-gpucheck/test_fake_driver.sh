#!/usr/bin/env bash
# CTest gpucheck_fake_driver (label cpu): kvvm-gpucheck's *cuda* column on a machine without
# a GPU, through libkvvm's real loader over a stand-in driver library (fake_capture.so in
# front of tests/fake_libcuda.so: the emulated device, plus bookkeeping-only capture entry
# points). Asserts that the GPU path runs end to end: a GPU is "present", every probe of
# (a)-(d) gives the emulator's answer on both columns, and the capture probes run without
# a setup error, crash or hang. It cannot say anything about a real driver.
# usage: test_fake_driver.sh kvvm-gpucheck fake_capture.so fake_libcuda.so
set -uo pipefail
tool=$1 front=$2 inner=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
KVVM_CUDA_LIBRARY=$front FAKE_CAPTURE_INNER=$inner \
  "$tool" --queue-ms 300 --capture-ms 300 --tsv "$tmp/rows.tsv" >"$tmp/out" 2>&1
status=$?
cat "$tmp/out"
fail=0
bad() { echo "gpucheck_fake_driver: FAIL: $*"; fail=1; }
# The fake's captures are never invalidated, so the global-mode rows are UNEXPECTED: exit 1.
[ "$status" -eq 1 ] || bad "exit status $status, want 1 (the fake cannot invalidate a capture)"
grep -q 'no GPU present' "$tmp/out" && bad "the fake driver was taken for no GPU"
[ -s "$tmp/rows.tsv" ] || { bad "no table"; exit 1; }
# Every row of (a)-(d): ok or info (the two columns agree where they are compared). The
# queued/pageable/pinned probes are timed (a queue calibrated to ~300 ms) and both columns
# run the same emulator here, so they can differ only by scheduling: on a loaded or
# sanitized run the queue can drain before the probe looks (INCONCLUSIVE), while a call is
# descheduled (queued: "blocking", the stream drained during the call), or while the source
# is being overwritten (pageable/pinned: "mixed"). Those answers are accepted for the timed
# rows; any other disagreement, and every error, fails.
# The pageable rows are checked against the real driver's documented behaviour, which the
# emulator (and so the fake) is stricter than: there the fake must give the emulated
# column's answer. The kernel probe needs module entry points the fake has not: it must say
# "unsupported" (on a GPU that is UNEXPECTED).
awk -F'\t' 'NR > 1 && $1 !~ /^capture\./ && $5 != "ok" && $5 != "info" &&
    !($1 ~ /^(queued|pageable|pinned)\./ && ($5 == "INCONCLUSIVE" ||
      ($5 == "DIFF" && ($4 == "mixed" || ($1 ~ /^queued\./ && $4 == "blocking"))))) &&
    !($1 ~ /^pageable\./ && $5 == "UNEXPECTED" && ($4 == $3 || $4 == "mixed")) &&
    !($1 == "kernel.window_alias" && $4 == "unsupported") {
    print "gpucheck_fake_driver: FAIL: " $1 ": " $5 " (emulated " $3 ", cuda " $4 ")"; bad = 1 }
    END { exit bad }' "$tmp/rows.tsv" || fail=1
awk -F'\t' '$1 == "loader.library" && $4 == "ok" { found = 1 } END { exit !found }' \
  "$tmp/rows.tsv" || bad "loader.library: the cuda column did not load the fake driver"
# The capture rows ran (no setup error, crash or hang).
awk -F'\t' '$1 ~ /^capture\./ && ($4 ~ /^(error|crashed|hung|no result)/ || $5 == "FAIL") {
    print "gpucheck_fake_driver: FAIL: " $1 ": " $4; bad = 1 } END { exit bad }' \
  "$tmp/rows.tsv" || fail=1
for row in capture.global_event capture.relaxed_event; do
  got=$(awk -F'\t' -v id=$row '$1 == id { print $4 }' "$tmp/rows.tsv")
  [ "$got" = "query:ok sync:ok end:ok" ] || bad "$row: '$got'"
done
# The shareable-handle rows (the pool daemon's path): present and ok on both columns.
for row in share.export share.import_here share.second_process; do
  got=$(awk -F'\t' -v id=$row '$1 == id { print $3 " " $4 }' "$tmp/rows.tsv")
  [ "$got" = "ok ok" ] || bad "$row: '$got' (emulated, cuda), want 'ok ok'"
done
got=$(awk -F'\t' '$1 == "capture.libkvvm_reclaim" { print $4 }' "$tmp/rows.tsv")
case $got in valid|inconclusive) ;; *) bad "capture.libkvvm_reclaim: '$got'" ;; esac
[ $fail -eq 0 ] && echo "gpucheck_fake_driver: ok (the cuda path ran end to end on the fake driver)"
exit $fail
