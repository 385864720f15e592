#!/usr/bin/env bash
# The main job (README quick start): installs dependencies, builds in Release, and runs the
# oversubscription stress tester with its defaults (emulated device). Extra arguments go to
# kvvm-stress, e.g.  bash scripts/stress.sh --oversubscribe 8 --json out.json, or
# bash scripts/stress.sh --pool 4 (a kvvmd and four client processes: kvvmd and kvvmctl are
# built beside kvvm-stress for it; the default run is unchanged)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DKVVM_BUILD_TESTS=OFF >/dev/null
cmake --build build-release -j"$(nproc)" --target kvvm-stress kvvmd kvvmctl
exec ./build-release/tools/kvvm-stress "$@"
