#!/usr/bin/env bash
# CTest gpucheck_nogpu (label cpu): kvvm-gpucheck on a machine without a GPU. The CUDA
# library is pointed at a path that does not exist, so the result is the same on a GPU
# machine. Asserts the distinct exit status (77), the "no GPU present" message, and the
# emulated device's column of the probes (what vmm/emu/emu.h promises).
# usage: test_nogpu.sh path/to/kvvm-gpucheck
set -uo pipefail
tool=${1:?usage: test_nogpu.sh path/to/kvvm-gpucheck}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
KVVM_CUDA_LIBRARY=/nonexistent/libcuda.so.1 "$tool" --queue-ms 300 --tsv "$tmp/rows.tsv" \
  >"$tmp/out" 2>&1
status=$?
cat "$tmp/out"
fail=0
bad() { echo "gpucheck_nogpu: FAIL: $*"; fail=1; }
[ "$status" -eq 77 ] || bad "exit status $status, want 77 (no GPU present)"
grep -q '^no GPU present (no CUDA driver library or no device): ' "$tmp/out" ||
  bad "no 'no GPU present' line"
grep -q 'no GPU present (.*): the emulated column only; exit 77$' "$tmp/out" ||
  bad "no final 'no GPU present ... exit 77' line"
grep -q '/nonexistent/libcuda.so.1' "$tmp/out" || bad "the reason does not name the library"

# id <tab> emulated result, as vmm/emu/emu.h documents the emulated device.
while IFS='|' read -r id want; do
  got=$(awk -F'\t' -v id="$id" '$1 == id { print $3 }' "$tmp/rows.tsv")
  [ "$got" = "$want" ] || bad "$id: emulated '$got', want '$want'"
done <<'ROWS'
loader.library|ok
loader.entry_points|all resolved
loader.vmm_supported|1
loader.granularity|2048 KiB
vmm.map_onto_mapped|INVALID_VALUE
vmm.map_overlapping|INVALID_VALUE
vmm.partial_unmap|INVALID_VALUE
vmm.unmap_spanning|ok
vmm.access_spanning|ok
vmm.alias|ok
vmm.release_while_mapped|ok
vmm.map_offset|INVALID_VALUE
vmm.copy_unmapped|call:INVALID_VALUE
vmm.copy_no_access|sync:ILLEGAL_ADDRESS
queued.map|nonblocking
queued.set_access|nonblocking
queued.unmap|nonblocking
queued.unmap_target|unmap:ok(nonblocking) sync:ILLEGAL_ADDRESS
pageable.dtoh|not complete at return
pinned.dtoh|not complete at return
pageable.htod|read after return
capture.global_event|n/a
capture.libkvvm_reclaim|n/a
ROWS
# No GPU: no cuda column, no verdict but "-" (a FAIL would mean an emulated probe broke).
awk -F'\t' 'NR > 1 && ($4 != "-" || $5 != "-") { exit 1 }' "$tmp/rows.tsv" ||
  bad "a row has a cuda result or a verdict without a GPU"
[ "$(wc -l <"$tmp/rows.tsv")" -gt 25 ] || bad "too few rows in the table"
[ $fail -eq 0 ] && echo "gpucheck_nogpu: ok (exit 77, no GPU present, emulated column as documented)"
exit $fail
