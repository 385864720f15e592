#!/bin/sh
# stress_prefix: kvvm-stress with the keyed prefix cache and the pool view (--prefix-cache keyed
# --pool-view) on the emulated device under 4x oversubscription (~10 s). Usage:
# stress_prefix.sh KVVM_STRESS
#
# Run 1 (CPU-readable device, KVVM_EMU_OPAQUE=0, swap): exit 0, a hit rate > 0, zero
# mismatched tokens (attached blocks included), block ids checked and bytes compared through
# the pool view with none bad. Run 2 (KVVM_EMU_OPAQUE=1, --preempt auto): exit 0, a hit rate
# > 0, block ids checked, and the report says the pool view's byte check was skipped. Run 3
# (CPU-readable, KVVM_FLAGS=cache_demote, --preempt auto, 16 shared prompts, a host tier of
# 4 MiB): entries are demoted and spilled to disk (prefix_spills > 0), attaches bring blocks
# back from disk (from_disk > 0), and every attached byte verifies (zero mismatches).
set -u
bin=${1:?usage: stress_prefix.sh path/to/kvvm-stress}
dir=$(mktemp -d "${TMPDIR:-/tmp}/stress_prefix.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT

fail=0
ok()  { echo "stress_prefix: PASS    $*"; }
bad() { echo "stress_prefix: FAIL    $*"; fail=1; }
# get FILE TOPKEY FIELD: FIELD's value inside the report's top-level line for TOPKEY
get() {
    grep -m1 "^  \"$2\": " "$1" | sed -n "s/.*\"$3\": \([^,}]*\).*/\1/p" | tr -d ' "'
}
gt0() { awk -v a="$1" 'BEGIN { exit !(a + 0 > 0) }'; }

run() {   # run NAME OPAQUE ARGS...: one run, its JSON in $dir/NAME.json, summary NAME.txt
    name=$1 opaque=$2
    shift 2
    echo "stress_prefix: KVVM_EMU_OPAQUE=$opaque $bin --preset tiny --oversubscribe 4" \
         "--device-budget 32M --steps 120 --seed 7 --prefix-cache keyed --pool-view $*"
    KVVM_EMU_OPAQUE=$opaque "$bin" --preset tiny --oversubscribe 4 --device-budget 32M \
        --steps 120 --seed 7 --quiet --prefix-cache keyed --pool-view --json "$dir/$name.json" \
        "$@" >"$dir/$name.txt" 2>&1
    status=$?
    grep -E "prefix keys|pool view|result" "$dir/$name.txt"
    j=$dir/$name.json
    if [ ! -s "$j" ]; then
        bad "$name: no JSON report (exit $status)"
        tail -20 "$dir/$name.txt"
        return
    fi
    [ "$status" -eq 0 ] && ok "$name: exit status 0" || bad "$name: exit status $status"
    rate=$(get "$j" prefix_keyed hit_rate)
    gt0 "$rate" && ok "$name: hit rate $rate > 0" || bad "$name: hit rate '$rate'"
    mism=$(get "$j" verification mismatches)
    [ "$mism" = 0 ] && ok "$name: zero mismatched tokens" || bad "$name: mismatches '$mism'"
    unexp=$(get "$j" errors unexpected)
    [ "$unexp" = 0 ] && ok "$name: zero unexpected errors" || bad "$name: errors '$unexp'"
    ids=$(get "$j" pool_view block_ids)
    badids=$(get "$j" pool_view bad_ids)
    gt0 "$ids" && [ "$badids" = 0 ] && ok "$name: $ids pool-view block ids valid" ||
        bad "$name: pool-view block ids '$ids', bad '$badids'"
}

run cpu 0
bytes=$(get "$dir/cpu.json" pool_view bytes)
pvm=$(get "$dir/cpu.json" pool_view mismatches)
[ "$(get "$dir/cpu.json" pool_view bytes_checked)" = true ] && gt0 "$bytes" && [ "$pvm" = 0 ] &&
    ok "cpu: $bytes bytes compared through the pool view, none differ" ||
    bad "cpu: pool-view bytes '$bytes', mismatches '$pvm'"

run opaque 1 --preempt auto
[ "$(get "$dir/opaque.json" pool_view bytes_checked)" = false ] &&
    grep -q "byte check SKIPPED" "$dir/opaque.txt" &&
    ok "opaque: the pool view's byte check reported skipped" ||
    bad "opaque: the skipped byte check is not reported"

export KVVM_FLAGS=cache_demote
run disk 0 --preempt auto --prefix-prompts 16 --host-budget 4M
sp=$(get "$dir/disk.json" prefix_keyed prefix_spills)
fd=$(get "$dir/disk.json" prefix_keyed from_disk)
gt0 "$sp" && ok "disk: $sp entry pages spilled to disk" || bad "disk: prefix_spills '$sp'"
gt0 "$fd" && ok "disk: $fd blocks attached from disk, verified" ||
    bad "disk: blocks attached from disk '$fd'"

exit $fail
