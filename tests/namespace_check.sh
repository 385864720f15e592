#!/usr/bin/env bash
# What the libraries export (issues 24 and 33).
# - The shipped libraries, libkvvm.a and libkvvm.so, define as global names exactly the API's
#   functions: the KVVM_API prototypes of kvvm.h, no more (not the testing interface's
#   kvvm_testing_*/kvvm_debug_*, not an internal kvvm__* or a layer's pool_take) and no fewer.
#   libkvvm.a is one relocatable object whose other globals are made local (CMakeLists.txt),
#   so a program linking it statically never meets pool_take, seq_lookup or json_put.
# - With --testing, the test-only archive libkvvm_testing.a: kvvm_* names only (the API's and
#   the testing interface's), none of them internal (kvvm__*).
# Names the toolchain adds on its own and that cannot be avoided would be listed in $allowed
# with the reason; none is needed with gcc 12 or clang 14 (plain, ASan+UBSan, TSan and
# libFuzzer-instrumented builds). install_consumer.sh runs this on the installed files.
# Usage: namespace_check.sh KVVM_H LIB... [--testing LIB...]
set -euo pipefail
allowed='^$'   # a regex of the toolchain's unavoidable names (none)
header=${1:?usage: namespace_check.sh KVVM_H LIB... [--testing LIB...]}
shift
[ -f "$header" ] || { echo "FAIL: $header does not exist"; exit 1; }
api=$(grep '^KVVM_API' "$header" | grep -o 'kvvm_[a-z0-9_]*[[:space:]]*(' | tr -d ' \t(' |
      sort -u)
n_api=$(printf '%s\n' "$api" | grep -c . || true)
[ "$n_api" -gt 0 ] || { echo "FAIL: no KVVM_API function found in $header"; exit 1; }
# list LIB: the global names it defines (of a shared library, its dynamic symbols; a local
# one there, a lower-case type such as libFuzzer's __start___sancov_pcs 'd', binds nothing)
list() {
    local opt=-g
    case $(basename "$1") in *.so|*.so.*) opt=-D ;; esac
    nm "$opt" --defined-only "$1" | awk 'NF == 3 && $2 ~ /^[A-Zui]$/ { print $3 }' |
        grep -Ev "$allowed" | sort -u
}
# report LIB WHAT NAMES: FAIL with up to 50 of NAMES (bad=1), when there are any
report() {
    [ -n "$3" ] || return 0
    echo "FAIL: $(basename "$1") $2 ($(printf '%s\n' "$3" | wc -l)):"
    printf '%s\n' "$3" | head -50 | sed 's/^/  /'
    bad=1
}
fail=0 testing=0
for lib in "$@"; do
    [ "$lib" = --testing ] && { testing=1; continue; }
    [ -e "$lib" ] || { echo "FAIL: $lib does not exist"; exit 1; }
    names=$(list "$lib")
    n=$(printf '%s\n' "$names" | grep -c . || true)
    bad=0
    if [ "$testing" = 1 ]; then
        report "$lib" "defines global names outside kvvm_*" \
               "$(printf '%s\n' "$names" | grep -v '^kvvm_' | grep . || true)"
        report "$lib" "defines global internal names" \
               "$(printf '%s\n' "$names" | grep '^kvvm__' || true)"
    else
        report "$lib" "defines global names that are not API functions of $(basename "$header")" \
               "$(comm -23 <(printf '%s\n' "$names") <(printf '%s\n' "$api") | grep . || true)"
    fi
    report "$lib" "lacks API functions of $(basename "$header")" \
           "$(comm -13 <(printf '%s\n' "$names") <(printf '%s\n' "$api") | grep . || true)"
    if [ "$bad" = 1 ]; then
        fail=1
    elif [ "$testing" = 1 ]; then
        echo "ok: $(basename "$lib"): $n global names, all kvvm_*, none internal"
    else
        echo "ok: $(basename "$lib"): $n global names, the API's $n_api functions"
    fi
done
exit $fail
