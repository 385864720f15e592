#!/usr/bin/env bash
# Builds the Debian packages (cpack -G DEB), checks their contents and dependencies, extracts
# them into a temporary root with dpkg-deb -x, and builds and runs the consumer
# (install_consumer.sh) and the example engine (example_engine.sh) against that root.
# Exit 77 (skipped, with the reason) where dpkg-deb or dpkg-shlibdeps is missing.
# Usage: package_deb.sh BUILD_DIR SOURCE_DIR VERSION
set -euo pipefail
# Under pipefail a `cmd | grep -q` fails at random: grep exits at its first match and cmd dies
# of SIGPIPE (141) if it writes after that. The checks below read their input to the end
# (grep >/dev/null), as dpkg-deb -f | grep -q failed package_deb now and then.
build=$1 src=$2 version=$3
for t in dpkg-deb dpkg-shlibdeps cpack; do
    command -v "$t" >/dev/null || { echo "SKIP: $t not found (not a Debian system)"; exit 77; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cpack -G DEB --config "$build/CPackConfig.cmake" -B "$tmp/pkg" >"$tmp/cpack.log" 2>&1 ||
    { cat "$tmp/cpack.log"; echo "FAIL: cpack -G DEB"; exit 1; }
arch=$(dpkg --print-architecture)
rt=$tmp/pkg/libkvvm0_${version}_$arch.deb
dev=$tmp/pkg/libkvvm-dev_${version}_$arch.deb
tools=$tmp/pkg/kvvm-tools_${version}_$arch.deb
for d in "$rt" "$dev" "$tools"; do
    [ -f "$d" ] || { ls "$tmp/pkg"; echo "FAIL: $(basename "$d") not built"; exit 1; }
done

fail=0
L='usr/lib(/[a-z0-9_-]+)?'     # the library directory: usr/lib, or multiarch usr/lib/<triplet>
# has DEB PATH-REGEX / lacks DEB PATH-REGEX: a file of the package's data (dpkg-deb -c).
has()   { dpkg-deb -c "$1" | awk '{ print $6 }' | grep -E "^\./$2\$" >/dev/null ||
          { echo "FAIL: $(basename "$1") lacks $2"; fail=1; }; }
lacks() { ! dpkg-deb -c "$1" | awk '{ print $6 }' | grep -E "^\./$2\$" >/dev/null ||
          { echo "FAIL: $(basename "$1") holds $2"; fail=1; }; }
# depends DEB REGEX: its Depends field (dpkg-deb -f) matches.
depends() { dpkg-deb -f "$1" Depends | grep -E "$2" >/dev/null ||
            { echo "FAIL: $(basename "$1") Depends '$(dpkg-deb -f "$1" Depends)' lacks $2"; fail=1; }; }

has   "$rt" "$L/libkvvm\.so\.0"
has   "$rt" "$L/libkvvm\.so\.$version"
lacks "$rt" "$L/libkvvm\.so"
lacks "$rt" "usr/include/kvvm\.h"
dpkg-deb -I "$rt" shlibs | grep "^libkvvm 0 libkvvm0" >/dev/null ||
    { echo "FAIL: libkvvm0 shlibs"; fail=1; }
depends "$rt" "(^|, )liburing2( |,|$)"
depends "$rt" "(^|, )libc6( |,|$)"

has   "$dev" "usr/include/kvvm\.h"
has   "$dev" "usr/share/man/man3/kvvm_seq_grow\.3(\.gz)?"
has   "$dev" "$L/libkvvm\.so"
has   "$dev" "$L/libkvvm\.a"
has   "$dev" "$L/cmake/kvvm/kvvmConfig\.cmake"
has   "$dev" "$L/cmake/kvvm/kvvmTargets\.cmake"
has   "$dev" "$L/cmake/kvvm/kvvmStaticTargets\.cmake"
has   "$dev" "$L/pkgconfig/kvvm\.pc"
lacks "$dev" "$L/libkvvm\.so\.$version"
depends "$dev" "(^|, )libkvvm0 \(= $version\)"

has   "$tools" "usr/bin/kvvm-stress"
has   "$tools" "usr/bin/kvvm-bench"
has   "$tools" "usr/bin/kvvm-gpucheck"
has   "$tools" "usr/bin/kvvmd"
has   "$tools" "usr/bin/kvvmctl"
dpkg-deb -f "$tools" Description | grep kvvm-gpucheck >/dev/null ||
    { echo "FAIL: kvvm-tools' Description does not name kvvm-gpucheck"; fail=1; }
for d in "$rt" "$dev" "$tools"; do
    ! dpkg-deb -f "$d" Maintainer | grep -E '@localhost|example\.(com|org)' >/dev/null ||
        { echo "FAIL: $(basename "$d") Maintainer is a placeholder: $(dpkg-deb -f "$d" Maintainer)"; fail=1; }
done
depends "$tools" "(^|, )libkvvm0 \(= $version\)"
[ "$fail" = 0 ] || exit 1
for d in "$rt" "$dev" "$tools"; do
    echo "ok: $(dpkg-deb -f "$d" Package) $(dpkg-deb -f "$d" Version): Depends: $(dpkg-deb -f "$d" Depends)"
done

root=$tmp/root
for d in "$rt" "$dev" "$tools"; do dpkg-deb -x "$d" "$root"; done
"$src/tests/install_consumer.sh" "$build" "$src" "$root/usr"
"$src/tests/example_engine.sh" "$build" "$src" "$root/usr"
echo "ok: consumer and example built and run against the packages' files"
