#!/bin/sh
# The library's exposition passes Prometheus's own checker (issue 37): `promtool check
# metrics` (the format's grammar and the naming lint: counters _total, units, no reserved
# names) on what tests/metrics_print prints. Skipped (77, with the reason) without promtool
# (Debian: apt-get install prometheus; scripts/install-deps.sh installs it).
# Usage: metrics_promtool.sh METRICS_PRINT
set -u
print=${1:?usage: metrics_promtool.sh METRICS_PRINT}
if ! command -v promtool >/dev/null 2>&1; then
    echo "skipped: promtool not found (Debian: apt-get install prometheus)"
    exit 77
fi
out=$(mktemp) || exit 1
trap 'rm -f "$out"' EXIT
"$print" >"$out" || { echo "FAIL: $print exited $?"; exit 1; }
families=$(grep -c '^# TYPE kvvm_' "$out")
[ "$families" -gt 0 ] || { echo "FAIL: no kvvm_ family in the text"; exit 1; }
# promtool prints its findings and exits non-zero on any (a lint finding: 3)
if ! lint=$(promtool check metrics <"$out" 2>&1); then
    echo "FAIL: promtool check metrics:"
    printf '%s\n' "$lint"
    exit 1
fi
[ -z "$lint" ] || { echo "FAIL: promtool check metrics said:"; printf '%s\n' "$lint"; exit 1; }
echo "ok: promtool check metrics passes on $families families ($(wc -l <"$out") lines)"
