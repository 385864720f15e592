#!/usr/bin/env bash
# The library's private namespace (issue 24): every global symbol defined in libkvvm.a and in
# libkvvm.so begins with "kvvm" (the static archive is one relocatable object whose other
# globals are made local: CMakeLists.txt), so a program linking libkvvm statically never meets
# pool_take, seq_lookup or json_put. Names the toolchain adds on its own and that cannot be
# avoided would be listed in $allowed with the reason; none is needed with gcc 12 or clang 14
# (plain, ASan+UBSan, TSan and libFuzzer-instrumented builds).
# Usage: namespace_check.sh LIBKVVM_A LIBKVVM_SO
set -euo pipefail
allowed='^$'   # a regex of the toolchain's unavoidable names (none)
fail=0
for lib in "$@"; do
    [ -e "$lib" ] || { echo "FAIL: $lib does not exist"; exit 1; }
    names=$(nm -g --defined-only "$lib" | awk 'NF == 3 { print $3 }' | sort -u)
    n=$(printf '%s\n' "$names" | grep -c . || true)
    bad=$(printf '%s\n' "$names" | grep -v '^kvvm' | grep -Ev "$allowed" | grep . || true)
    if [ -n "$bad" ]; then
        echo "FAIL: $(basename "$lib") defines $(printf '%s\n' "$bad" | wc -l) global names" \
             "outside kvvm*:"
        printf '%s\n' "$bad" | head -50 | sed 's/^/  /'
        fail=1
    elif [ "$n" -eq 0 ]; then
        echo "FAIL: $(basename "$lib"): nm found no global names (not a library?)"
        fail=1
    else
        echo "ok: $(basename "$lib"): $n global names, all kvvm*"
    fi
done
exit $fail
