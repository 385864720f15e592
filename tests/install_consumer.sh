#!/usr/bin/env bash
# Installs the built library into a temporary prefix, then builds and runs a small consumer
# against the *installed* package twice: with CMake's find_package(kvvm) and with pkg-config.
# Also checks that libkvvm.so does not link the CUDA driver.
# Usage: install_consumer.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
so=$(ls "$tmp"/prefix/lib*/libkvvm.so | head -1)
if ldd "$so" | grep -i cuda; then echo "FAIL: $so links a CUDA library"; exit 1; fi
echo "ok: $(basename "$so") does not link libcuda"

cmake -S "$src/tests/consumer" -B "$tmp/cm" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/cm" >/dev/null
LD_LIBRARY_PATH=$(dirname "$so") "$tmp/cm/consumer"
echo "ok: find_package(kvvm) consumer"

export PKG_CONFIG_PATH=$(dirname "$so")/pkgconfig
cc -o "$tmp/pc" "$src/tests/consumer/main.c" $(pkg-config --cflags --libs kvvm)
LD_LIBRARY_PATH=$(dirname "$so") "$tmp/pc"
echo "ok: pkg-config kvvm consumer"
