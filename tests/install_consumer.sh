#!/usr/bin/env bash
# Installs the built library into a temporary prefix, then builds and runs a small consumer
# against the *installed* package: with CMake's find_package(kvvm) (with pkg-config hidden:
# the shared library's package needs neither pkg-config nor liburing), with the static
# component, and with pkg-config. Also checks that libkvvm.so does not link the CUDA driver,
# that the installed libraries export the API only, and that the installed tools find the
# library through their relative RPATH.
# Usage: install_consumer.sh BUILD_DIR SOURCE_DIR [PREFIX]
#   PREFIX: an installed tree to test instead (e.g. Debian packages extracted with dpkg-deb -x)
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ $# -ge 3 ]; then
    prefix=$3
else
    prefix=$tmp/prefix
    cmake --install "$build" --prefix "$prefix" >/dev/null
fi
so=$(find "$prefix" -name libkvvm.so -print -quit)
[ -n "$so" ] || { echo "FAIL: no libkvvm.so under $prefix"; exit 1; }
lib=$(dirname "$so")
if ldd "$so" | grep -i cuda; then echo "FAIL: $so links a CUDA library"; exit 1; fi
echo "ok: $(basename "$so") does not link libcuda"
# The installed libraries define the installed header's API functions as globals, nothing
# else; the test-only archives are not installed (issue 33).
"$src/tests/namespace_check.sh" "$(find "$prefix" -name kvvm.h -print -quit)" \
    "$lib/libkvvm.a" "$so"
extra=$(find "$prefix" -name 'libkvvm_testing*' -o -name 'libkvvm_internal*')
[ -z "$extra" ] || { echo "FAIL: test-only archives installed: $extra"; exit 1; }

# find_package(kvvm) for the shared library, where pkg-config cannot be had: a pkg-config on
# PATH that fails, PKG_CONFIG and PKG_CONFIG_EXECUTABLE pointing to /bin/false.
mkdir -p "$tmp/nopc"
printf '#!/bin/sh\necho "pkg-config is hidden in this test" >&2\nexit 1\n' > "$tmp/nopc/pkg-config"
chmod +x "$tmp/nopc/pkg-config"
PATH=$tmp/nopc:$PATH PKG_CONFIG=/bin/false \
    cmake -S "$src/tests/consumer" -B "$tmp/cm" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$tmp/cm" >/dev/null
if grep -i "liburing\|-luring\|PKG_CONFIG\|PkgConfig" "$tmp/cm/CMakeCache.txt" \
        "$tmp/cm"/CMakeFiles/consumer.dir/link.txt; then
    echo "FAIL: the shared library's consumer looked for liburing or pkg-config"; exit 1
fi
LD_LIBRARY_PATH=$lib "$tmp/cm/consumer"
echo "ok: find_package(kvvm) consumer, without pkg-config or liburing"

cmake -S "$src/tests/consumer" -B "$tmp/cms" -DCMAKE_PREFIX_PATH="$prefix" \
      -DKVVM_CONSUMER_STATIC=ON >/dev/null
cmake --build "$tmp/cms" >/dev/null
if ldd "$tmp/cms/consumer" | grep libkvvm >/dev/null; then
    echo "FAIL: the static consumer links libkvvm.so"; exit 1
fi
"$tmp/cms/consumer"
echo "ok: find_package(kvvm COMPONENTS static) consumer"

export PKG_CONFIG_PATH=$lib/pkgconfig
cc -o "$tmp/pc" "$src/tests/consumer/main.c" $(pkg-config --cflags --libs kvvm)
LD_LIBRARY_PATH=$lib "$tmp/pc"
cc -static-libgcc -o "$tmp/pcs" "$src/tests/consumer/main.c" $(pkg-config --cflags kvvm) \
   "$lib/libkvvm.a" $(pkg-config --libs-only-other --static kvvm | sed 's/-lkvvm//') \
   $(pkg-config --static --libs-only-l kvvm | sed 's/-lkvvm//')
"$tmp/pcs"
echo "ok: pkg-config kvvm consumer (shared and static)"
# A static consumer whose own globals are names the library uses inside (issue 24): links and
# runs against the installed libkvvm.a (its non-kvvm names are local).
cc -static-libgcc -o "$tmp/collide" "$src/tests/consumer/main.c" \
   "$src/tests/consumer/collide.c" $(pkg-config --cflags kvvm) \
   "$lib/libkvvm.a" $(pkg-config --static --libs-only-l kvvm | sed 's/-lkvvm//')
KVVM_EMU_OPAQUE=1 "$tmp/collide"
echo "ok: a static consumer of its own pool_take, seq_lookup ... links the installed libkvvm.a"

# The installed tools run from this prefix without LD_LIBRARY_PATH (RPATH $ORIGIN/../lib).
for tool in "$prefix"/bin/kvvm-*; do
    [ -x "$tool" ] || continue
    if ldd "$tool" | grep "libkvvm.*not found" >/dev/null; then
        echo "FAIL: $tool does not find libkvvm"; ldd "$tool"; exit 1
    fi
    used=$(ldd "$tool" | awk '/libkvvm/ { print $3 }')
    if [ -n "$used" ] && [ "$(readlink -f "$(dirname "$used")")" != "$(readlink -f "$lib")" ]; then
        echo "FAIL: $tool uses a libkvvm outside $prefix"; ldd "$tool"; exit 1
    fi
    "$tool" --help >/dev/null 2>&1 || { echo "FAIL: $tool --help"; exit 1; }
    echo "ok: $(basename "$tool") runs from $prefix"
done
