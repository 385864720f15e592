#!/bin/sh
# The tools build on the public header and the testing interface only (issue 24): every
# quoted #include under tools/ names kvvm.h, testing/'s kvvm_testing*.h, a header of the
# tool's own folder, or tools/common/. A private header of the library (vmm/, paging/ ...)
# fails this, printed with its file and line. kvvmd and kvvmctl may include pool/'s headers
# (thin mains over the daemon's server and protocol). Usage: tool_headers.sh SOURCE_ROOT
root=${1:?usage: tool_headers.sh SOURCE_ROOT}
for f in "$root"/tools/*/*.c "$root"/tools/*/*.h; do
    dir=$(dirname "$f")
    grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" |
    while IFS= read -r line; do
        h=$(printf '%s\n' "$line" | sed 's/^[^"]*"\([^"]*\)".*/\1/')
        case $h in
            kvvm.h|kvvm_testing.h|kvvm_testing_driver.h|../common/*) continue ;;
        esac
        # kvvmd and kvvmctl are thin mains over pool/ (the daemon's server and protocol)
        case $dir:$h in */tools/kvvmd:pool/*.h|*/tools/kvvmctl:pool/*.h) continue ;; esac
        case $h in */*) ;; *) [ -f "$dir/$h" ] && continue ;; esac
        echo "${f#"$root"/}:${line%%:*}: includes \"$h\", a private header"
    done
done | { out=$(cat); [ -z "$out" ] && { echo "tools include public and testing headers only"; exit 0; }
         printf '%s\n' "$out"; exit 1; }
