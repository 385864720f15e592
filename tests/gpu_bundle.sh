#!/usr/bin/env bash
# CTest gpu_bundle (label cpu): scripts/gpu-bundle.sh, from this build tree (no second build:
# --from-build), into a temporary folder; then, independently of the script's own check,
# ldd of every binary and library of the bundle (with the bundle's lib/ first, as its
# wrappers run them) must name only the bundle's lib/ or the C runtime; then the bundle's
# run-gpu-check.sh, on a node without a GPU (KVVM_CUDA_LIBRARY pointing nowhere), must say so
# and exit 77, having written its summary into the output folder. Before that, the bundle's
# kvvmd and kvvmctl with two clients (kvvm-stress --pool 2, emulated device).
# usage: gpu_bundle.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=$1 build=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "gpu_bundle: FAIL: $*"; fail=1; }
bash "$src/scripts/gpu-bundle.sh" "$tmp/bundle" --from-build "$build" || bad "gpu-bundle.sh failed"
b=$tmp/bundle
for f in bin/kvvm-gpucheck bin/kvvm-bench bin/kvvm-stress bin/test_cuda bin/kvvmd bin/kvvmctl \
         lib/libkvvm.so \
         python/kvvm/__init__.py tools/torch_probe.py run-gpu-check.sh; do
  [ -e "$b/$f" ] || bad "$f missing from the bundle"
done
runtime='^(linux-vdso|ld-linux[^ ]*|libc|libm|libpthread|libdl|librt|libresolv|libgcc_s|libstdc\+\+)\.so'
for f in "$b"/libexec/* "$b"/lib/*.so*; do
  while read -r name arrow path rest; do    # "name => path (addr)" or "name (addr)"
    [ -n "$name" ] || continue
    lib=${name##*/}
    [[ $lib =~ $runtime ]] && continue
    [ "$arrow" = "=>" ] || path=""
    case $path in
      "$b"/lib/*) ;;
      *) bad "${f##*/}: $name $arrow $path $rest" ;;
    esac
  done < <(LD_LIBRARY_PATH="$b/lib" ldd "$f" 2>&1)
done
# the wrappers run (no GPU needed for --help)
"$b/bin/kvvm-stress" --help >/dev/null 2>&1 || bad "bin/kvvm-stress --help failed"
"$b/bin/kvvmd" --help >/dev/null 2>&1 || bad "bin/kvvmd --help failed"
# the bundle's pool daemon and a client of it, on the emulated device: kvvm-stress --pool 2
# starts the kvvmd of libexec/ beside it, two clients (one killed with SIGKILL half way) and
# checks every byte and the pool through the bundle's kvvmctl
if "$b/bin/kvvm-stress" --pool 2 --backend emulated --preset tiny --device-budget 16M \
     --oversubscribe 2 --steps 60 --duration 120 --seed 3 --quiet --spill-dir "$tmp" \
     >"$tmp/pool.log" 2>&1 && grep -q 'result     PASS' "$tmp/pool.log"; then
  echo "gpu_bundle: the bundle's kvvmd and a client: $(grep 'kill  ' "$tmp/pool.log" | sed 's/^ *//')"
else
  cat "$tmp/pool.log"
  bad "the bundle's kvvm-stress --pool 2 (kvvmd + clients) failed"
fi
KVVM_CUDA_LIBRARY=/nonexistent/libcuda.so.1 "$b/run-gpu-check.sh" "$tmp/out" >"$tmp/log" 2>&1
st=$?
cat "$tmp/log"
[ $st -eq 77 ] || bad "run-gpu-check.sh exited $st without a GPU, want 77"
grep -q 'no GPU present' "$tmp/log" || bad "run-gpu-check.sh does not say that no GPU is present"
grep -q 'no GPU present' "$tmp/out/summary.txt" 2>/dev/null || bad "no summary in the output folder"
[ $fail -eq 0 ] && echo "gpu_bundle: ok ($(du -sh "$b" | cut -f1))"
exit $fail
