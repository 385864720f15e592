#!/usr/bin/env bash
# scripts/gpu-bundle.sh DIR: a self-contained folder to validate a bare GPU node
# (docs/kvvm-gpucheck.md, "The bundle"): no compiler, no package install, no network there.
#
# Builds libkvvm Release in a build folder of its own (build-bundle/, or --build-dir D;
# --from-build D copies from an existing build instead of building: the CTest test does so)
# and puts into DIR:
#   bin/       kvvm-gpucheck, kvvm-bench, kvvm-stress, test_cuda, kvvmd, kvvmctl (the pool
#              daemon and its control tool): wrappers that set
#              LD_LIBRARY_PATH to DIR/lib and run the real binaries of libexec/
#   libexec/   the binaries
#   lib/       libkvvm.so (and its soname links) and every shared library the binaries need
#              beyond the C runtime (ldd-resolved: liburing, libxxhash, libcriterion and its
#              dependencies, ...)
#   python/    the kvvm package (pure Python; uses lib/libkvvm.so through KVVM_LIBRARY)
#   tools/     torch_probe.py (the PyTorch probe)
#   run-gpu-check.sh   the check itself (scripts/bundle-run-gpu-check.sh)
# The C runtime is left to the node: linux-vdso, ld-linux, libc, libm, libpthread, libdl,
# librt, libresolv, libgcc_s, libstdc++ (glibc's parts must match the node's own loader).
# Exit: 0 done; 1 a build or copy failed, or a binary resolves a library from outside.
set -euo pipefail
usage() { echo "usage: $0 DIR [--build-dir D | --from-build D] [--jobs N]" >&2; exit 2; }
[ $# -ge 1 ] || usage
dest=$1; shift
repo=$(cd "$(dirname "$0")/.." && pwd)
build=$repo/build-bundle from=""
jobs=$(nproc)
while [ $# -gt 0 ]; do
  case $1 in
    --build-dir) build=$2; shift 2 ;;
    --from-build) from=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    *) usage ;;
  esac
done

if [ -z "$from" ]; then
  echo "gpu-bundle: building Release in $build"
  cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVVM_BUILD_TOOLS=ON >/dev/null
  cmake --build "$build" -j"$jobs" --target kvvm kvvm-gpucheck kvvm-bench kvvm-stress \
    test_cuda kvvmd kvvmctl >/dev/null
  from=$build
fi
bins=(tools/kvvm-gpucheck tools/kvvm-bench tools/kvvm-stress tests/test_cuda tools/kvvmd
      tools/kvvmctl)
for b in "${bins[@]}" libkvvm.so; do
  [ -e "$from/$b" ] || { echo "gpu-bundle: $from/$b is missing (build it first)" >&2; exit 1; }
done

rm -rf "$dest"
mkdir -p "$dest"/{bin,libexec,lib,python,tools}
dest=$(cd "$dest" && pwd)
for b in "${bins[@]}"; do
  cp "$from/$b" "$dest/libexec/"
  n=$(basename "$b")
  cat >"$dest/bin/$n" <<EOF
#!/bin/sh
# $n from the libkvvm GPU bundle: the bundle's libraries first.
here=\$(cd "\$(dirname "\$0")/.." && pwd)
LD_LIBRARY_PATH="\$here/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$here/libexec/$n" "\$@"
EOF
  chmod +x "$dest/bin/$n"
done
cp -P "$from"/libkvvm.so* "$dest/lib/"

# The C runtime: never copied (it must be the node's, matching its dynamic loader).
runtime='^(linux-vdso|ld-linux[^ ]*|libc|libm|libpthread|libdl|librt|libresolv|libgcc_s|libstdc\+\+)\.so'
copy_deps() {   # every library ldd resolves for $1 that is not the C runtime, into lib/
  ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | while read -r name path; do
    [[ $name =~ $runtime ]] && continue
    [ -e "$dest/lib/$name" ] || cp -L "$path" "$dest/lib/$name"
  done
}
# (ldd lists the whole closure: the copies' own dependencies are in it)
for f in "$dest"/libexec/* "$dest"/lib/libkvvm.so; do copy_deps "$f"; done

cp -r "$repo/python/kvvm" "$dest/python/"
find "$dest/python" -name __pycache__ -prune -exec rm -rf {} +
cp "$repo/tools/kvvm-gpucheck/torch_probe.py" "$dest/tools/"
cp "$repo/scripts/bundle-run-gpu-check.sh" "$dest/run-gpu-check.sh"
chmod +x "$dest/run-gpu-check.sh" "$dest/tools/torch_probe.py"
{
  echo "libkvvm GPU bundle"
  echo "commit: $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "built: $(date -u +%FT%TZ) on $(uname -srm)"
  (cd "$dest" && find . -type f | sort)
} >"$dest/MANIFEST"

# Every binary must resolve every library from the bundle or the C runtime.
bad=0
for f in "$dest"/libexec/* "$dest"/lib/*.so*; do
  out=$(LD_LIBRARY_PATH="$dest/lib" ldd "$f" 2>&1) || true
  while read -r name arrow path _; do      # "name => path (addr)" or "name (addr)"
    [ -n "$name" ] || continue
    name=${name##*/}
    [[ $name =~ $runtime ]] && continue
    [ "$arrow" = "=>" ] || path=""
    case $path in
      "$dest"/lib/*) ;;
      *) echo "gpu-bundle: $f resolves $name from outside the bundle: ${path:-?}" >&2
         bad=1 ;;
    esac
  done <<<"$out"
done
[ $bad -eq 0 ] || exit 1
echo "gpu-bundle: $dest ($(du -sh "$dest" | cut -f1)); run $dest/run-gpu-check.sh [OUTDIR]"
