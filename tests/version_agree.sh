#!/usr/bin/env bash
# Every place that states libkvvm's version says the CMake project's (CMakeLists.txt
# project(VERSION), the one source): the header's KVVM_VERSION_*, kvvm_version() of the
# built library, its soname file, kvvm.pc, the CMake package's version file (and that
# find_package(kvvm MAJOR.MINOR) accepts it), the Python package (pyproject.toml and
# __version__), docs/api.md (its title, kvvm_version's line, the kvvm_stats_json example),
# the generated man page, and the CHANGELOG's newest released version (dated).
# Usage: version_agree.sh SOURCE_DIR BUILD_DIR LIBKVVM_SO VERSION VERSION_PRINT (a program
# linked to LIBKVVM_SO that prints its kvvm_version())
set -euo pipefail
src=$1 build=$2 lib=$3 version=$4 print=$5
fail=0
# check WHAT GOT: GOT must be $version
check() {
    if [ "$2" = "$version" ]; then echo "ok: $1: $2"
    else echo "FAIL: $1 says '$2', the project $version"; fail=1; fi
}
hdr() { sed -n "s/^#define KVVM_VERSION_$1 \([0-9]*\)$/\1/p" "$src/include/kvvm.h"; }
check "include/kvvm.h KVVM_VERSION_*" "$(hdr MAJOR).$(hdr MINOR).$(hdr PATCH)"
check "kvvm_version() of $(basename "$lib") (tests/version_print.c)" "$("$print")"
real=$(basename "$(readlink -f "$lib")")
check "the shared library's file ($real)" "${real#libkvvm.so.}"
check "kvvm.pc Version" "$(sed -n 's/^Version: *//p' "$build/kvvm.pc")"
check "kvvmConfigVersion.cmake" \
      "$(sed -n 's/^set(PACKAGE_VERSION "\([^"]*\)")$/\1/p' "$build/kvvmConfigVersion.cmake")"
# find_package(kvvm MAJOR.MINOR REQUIRED) runs the version file with PACKAGE_FIND_VERSION set
want=${version%.*}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/find.cmake" <<EOF
set(PACKAGE_FIND_VERSION "$want")
string(REPLACE "." ";" v "$want")
list(GET v 0 PACKAGE_FIND_VERSION_MAJOR)
list(GET v 1 PACKAGE_FIND_VERSION_MINOR)
set(PACKAGE_FIND_VERSION_PATCH 0)
set(PACKAGE_FIND_VERSION_COUNT 2)
set(CMAKE_SIZEOF_VOID_P 8)
include("$build/kvvmConfigVersion.cmake")
if(NOT PACKAGE_VERSION_COMPATIBLE)
  message(FATAL_ERROR "find_package(kvvm $want) refuses \${PACKAGE_VERSION}")
endif()
EOF
if cmake -P "$tmp/find.cmake"; then echo "ok: find_package(kvvm $want) accepts it"
else echo "FAIL: find_package(kvvm $want) refuses the package"; fail=1; fi
check "python/pyproject.toml" \
      "$(sed -n 's/^version = "\([^"]*\)"$/\1/p' "$src/python/pyproject.toml")"
check "python/kvvm/__init__.py __version__" \
      "$(sed -n 's/^__version__ = "\([^"]*\)"$/\1/p' "$src/python/kvvm/__init__.py")"
check "docs/api.md title" \
      "$(sed -n '1s/^# libkvvm API reference (version \([^)]*\))$/\1/p' "$src/docs/api.md")"
api_ver='s/^\*\*`const char \*kvvm_version(void)`\*\* — the library.s version, `"\([^"]*\)"`.*/\1/p'
check "docs/api.md kvvm_version" "$(sed -n "$api_ver" "$src/docs/api.md")"
check "docs/api.md kvvm_stats_json example" \
      "$(sed -n 's/^{"version":"\([^"]*\)".*/\1/p' "$src/docs/api.md")"
man_ver='s/^the library.s version, \\fB"\([^"]*\)"\\fR$/\1/p'
check "docs/man/man3/kvvm_version.3" "$(sed -n "$man_ver" "$src/docs/man/man3/kvvm_version.3")"
# the CHANGELOG's first heading with a date (an undated one above it is work to come)
top=$(sed -n 's/^## \([0-9][0-9.]*\) — [0-9]\{4\}-[0-9]\{2\}-[0-9]\{2\}$/\1/p' "$src/CHANGELOG.md" |
      head -n1)
check "CHANGELOG.md's newest dated release" "$top"
if [ "$fail" != 0 ]; then
    echo "FAIL: the version differs between places (set CMakeLists.txt's project(VERSION)" \
         "and these)"
    exit 1
fi
echo "ok: every place says $version"
