#!/bin/sh
# The tools build on the public header and the testing interface only (issue 24): every
# quoted #include under tools/ names kvvm.h, testing/'s kvvm_testing*.h, a header of the
# tool's own folder, or tools/common/. A private header of the library (vmm/, paging/ ...)
# fails this, printed with its file and line. kvvmd and kvvmctl may include pool/'s headers
# (thin mains over the daemon's server and protocol).
# And core/ reaches the shared store through its entry in the list of tiers only (issue
# 33): of core/'s files, core/tier_store.c alone includes a store/ header or names a
# function, type or macro that store/store.h declares (core/tiers.h, the entries tier).
# Usage: tool_headers.sh SOURCE_ROOT
root=${1:?usage: tool_headers.sh SOURCE_ROOT}
sh_=$root/store/store.h
fns=$(grep -oE 'store_[a-z_]+\(' "$sh_" | tr -d '(' | sort -u | paste -sd'|' -)
macs=$(grep -oE '#define[[:space:]]+STORE_[A-Z0-9_]+|STORE_OP_[A-Z]+' "$sh_" |
       sed 's/^#define[[:space:]]*//' | sort -u | paste -sd'|' -)
pat="\"store/|\\b($fns)[[:space:]]*\\(|\\bstore_key\\b|\\bstruct store_[a-z]+"
pat="$pat|\\benum store_op|\\b($macs)\\b"
core_out=$(for f in "$root"/core/*.c "$root"/core/*.h; do
    [ "$f" = "$root/core/tier_store.c" ] && continue
    grep -nE "$pat" "$f" | sed "s|^|${f#"$root"/}:|; s|\$| (store/ outside its tier entry)|"
done)
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
done | { out=$(cat); [ -n "$core_out" ] && out=$(printf '%s\n%s' "$out" "$core_out")
         [ -z "$out" ] && { echo "tools include public and testing headers only; core/ names"\
                                 "store/ in core/tier_store.c only"; exit 0; }
         printf '%s\n' "$out"; exit 1; }
