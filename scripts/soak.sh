#!/usr/bin/env bash
# The soak (issue 18): kvvm-stress at 4x oversubscription with all three tiers (device, a
# host tier and a disk tier in a fresh directory under /var/tmp) for a long run, sampling the
# process's resident memory and open file descriptors every few seconds into a TSV.
#
#   bash scripts/soak.sh [SECONDS] [KVVM_STRESS] [OUT_DIR]
#
# SECONDS: run length (default 600). KVVM_STRESS: the binary (default build/tools/kvvm-stress;
# built there if missing). OUT_DIR: where soak.tsv (t_s, rss_kib, fds), report.json and
# stress.log go (default: a fresh directory under /tmp, kept and printed).
#
# Passes (exit 0) when: kvvm-stress exits 0 with 0 mismatched tokens and 0 unexpected errors,
# nothing verified was skipped, the library logged no leak at close ("leaked"), the spill
# directory is empty afterwards, and after warm-up (the first third of the run, at least
# 20 s) the resident memory and the descriptor count stay within 5 % of their mean. The
# figures are printed either way.
set -uo pipefail
cd "$(dirname "$0")/.."
secs=${1:-600}
bin=${2:-build/tools/kvvm-stress}
out=${3:-$(mktemp -d /tmp/kvvm-soak.XXXXXX)}
interval=${KVVMTEST_SOAK_INTERVAL:-5}
if [ ! -x "$bin" ]; then
    cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null &&
        cmake --build build -j2 --target kvvm-stress >/dev/null || exit 1
    bin=build/tools/kvvm-stress
fi
mkdir -p "$out" || exit 1
spill=$(mktemp -d /var/tmp/kvvm-soak-spill.XXXXXX) || exit 1
trap 'rmdir "$spill" 2>/dev/null' EXIT
tsv=$out/soak.tsv
echo "soak: $bin --preset tiny --oversubscribe 4 --duration $secs (host + disk in $spill)," \
     "samples every ${interval}s into $tsv"
"$bin" --preset tiny --oversubscribe 4 --duration "$secs" --seed 1 --quiet \
       --spill-dir "$spill" --json "$out/report.json" >"$out/stress.log" 2>&1 &
pid=$!
printf 't_s\trss_kib\tfds\n' >"$tsv"
t0=$(date +%s)
while kill -0 "$pid" 2>/dev/null; do
    rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status" 2>/dev/null)
    fds=$(ls "/proc/$pid/fd" 2>/dev/null | wc -l)
    [ -n "$rss" ] && printf '%s\t%s\t%s\n' "$(( $(date +%s) - t0 ))" "$rss" "$fds" >>"$tsv"
    sleep "$interval"
done
wait "$pid"
status=$?

fail=0
ok()  { echo "soak: PASS    $*"; }
bad() { echo "soak: FAIL    $*"; fail=1; }
get() {   # kvvm-stress's JSON: FIELD inside the top-level line of TOPKEY
    grep -m1 "^  \"$1\": " "$out/report.json" 2>/dev/null |
        sed -n "s/.*\"$2\": \([^,}]*\).*/\1/p" | tr -d ' "'
}
[ "$status" -eq 0 ] && ok "kvvm-stress exit status 0" || bad "kvvm-stress exit status $status"
mism=$(get verification mismatches)
[ "$mism" = 0 ] && ok "0 mismatched tokens" || bad "mismatched tokens: ${mism:-no report}"
skipped=$(get verification skipped_no_room)
[ "$skipped" = 0 ] && ok "no verification skipped" || bad "verifications skipped: ${skipped:-?}"
unexp=$(get errors unexpected)
[ "${unexp:-0}" = 0 ] && ok "0 unexpected errors" || bad "unexpected errors: $unexp"
if grep -q "leaked" "$out/stress.log"; then
    bad "the library logged a leak: $(grep -m1 leaked "$out/stress.log")"
else
    ok "no leak logged at close"
fi
left=$(ls -A "$spill" | wc -l)
[ "$left" -eq 0 ] && ok "spill directory empty" || bad "$left file(s) left in $spill"

# flat after warm-up: every sample after it, up to the run's end (then the tool verifies and
# frees everything: the memory falls), within 5 % of the samples' mean
warm=$(( secs / 3 > 20 ? secs / 3 : 20 ))
flat() {   # column name: prints "min max mean n" of the samples after warm-up
    awk -F'\t' -v w="$warm" -v d="$secs" -v c="$1" 'NR == 1 { for (i = 1; i <= NF; i++) k[$i] = i; next }
        $1 >= w && $1 <= d { v = $k[c]; s += v; n++; if (n == 1 || v < lo) lo = v; if (v > hi) hi = v }
        END { if (n) printf "%d %d %.1f %d\n", lo, hi, s / n, n; else print "0 0 0 0" }' "$tsv"
}
for col in rss_kib fds; do
    read -r lo hi mean n <<<"$(flat "$col")"
    if [ "$n" -lt 2 ]; then
        bad "$col: $n sample(s) after the ${warm}s warm-up"
        continue
    fi
    spread=$(awk -v lo="$lo" -v hi="$hi" -v m="$mean" 'BEGIN {
        d = (hi - m > m - lo ? hi - m : m - lo); printf "%.2f", m ? 100 * d / m : 0 }')
    msg="$col after ${warm}s: min $lo max $hi mean $mean over $n samples (${spread} % from the mean)"
    awk -v s="$spread" 'BEGIN { exit !(s <= 5) }' && ok "$msg" || bad "$msg"
done
echo "soak: samples in $tsv, report $out/report.json, log $out/stress.log"
exit $fail
