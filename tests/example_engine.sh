#!/usr/bin/env bash
# Installs the built library into a temporary prefix, builds examples/engine against the
# *installed* package with find_package(kvvm), and runs it: stream mode with the disk tier,
# then synchronous mode. The example checks every byte it reads back and exits non-zero on
# a mismatch or an unexpected error.
# Usage: example_engine.sh BUILD_DIR SOURCE_DIR [PREFIX]
#   PREFIX: an installed tree to use instead (e.g. Debian packages extracted with dpkg-deb -x)
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

cmake -S "$src/examples/engine" -B "$tmp/engine" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_C_FLAGS="-Wall -Wextra -Werror" >/dev/null
cmake --build "$tmp/engine" >/dev/null
echo "ok: examples/engine built against $prefix with find_package(kvvm)"

# The spill file wants a disk file system that takes O_DIRECT (the example's default is
# /var/tmp); without one the run goes without a disk tier, and says so.
spill=(--spill-dir /var/tmp)
if [ "$(stat -f -c %T /var/tmp)" = tmpfs ]; then
    echo "note: /var/tmp is tmpfs: running the example without a disk tier (--no-spill)"
    spill=(--no-spill)
fi
# Each run must also close clean: kvvm_close logs any fence, event or handle left behind.
run() {
  LD_LIBRARY_PATH=$lib "$tmp/engine/engine" "${spill[@]}" "$@" 2>"$tmp/err" || { cat "$tmp/err"; exit 1; }
  cat "$tmp/err" >&2
  if grep -qi leak "$tmp/err"; then echo "FAIL: the library logged a leak at close"; exit 1; fi
}
run
echo "ok: example engine, stream mode"
run --sync --requests 16 --seed 2
echo "ok: example engine, synchronous mode"
