#!/usr/bin/env bash
# The libFuzzer target tests/fuzz/fuzz_api (issue 18): builds it with clang
# (-DKVVM_FUZZ=ON: ASan + UBSan + libFuzzer, build-fuzz/), replays the seed corpus
# tests/fuzz/corpus, then fuzzes new inputs for a bounded time. Fails (exit 1) on any crash,
# leak, sanitizer report or model mismatch; the failing input is left in build-fuzz/artifacts.
#
#   bash scripts/fuzz.sh [SECONDS]        (default 120)
#   bash scripts/fuzz.sh --runs N         (N new inputs, however long they take)
#
# scripts/test.sh uses --runs 10000 (about 120 s of one core, 80 inputs/s, on an idle 2-core
# machine; at load 10, 100 s before the 0.3 calls, 141 s with them, 113 s while the pool view
# was kept to one granule and the store to synchronous mode): a count, not a time, so the
# same inputs are tried (with the fixed seed below) whatever else the machine is doing, and
# the test command can run it beside other stages.
# New inputs go to build-fuzz/corpus (never into the repository's corpus: refresh that by
# hand with -merge=1, see CONTRIBUTING.md). KVVMTEST_FUZZ_FAILED_CALL_RULE=0 turns off the
# "a failed call moved no other sequence" check (to fuzz past a known defect of it).
set -euo pipefail
cd "$(dirname "$0")/.."
limit=(-max_total_time="${1:-120}") what="for ${1:-120}s"
if [ "${1:-}" = --runs ]; then
    limit=(-runs="${2:?usage: fuzz.sh --runs N}") what="$2 new inputs"
fi
CC=clang cmake -S . -B build-fuzz -DKVVM_FUZZ=ON -DKVVM_BUILD_TESTS=OFF -DKVVM_BUILD_TOOLS=OFF \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target fuzz_api fuzz_pool >/dev/null
bin=build-fuzz/tests/fuzz/fuzz_api
mkdir -p build-fuzz/corpus build-fuzz/artifacts
# The target's file:// store directories (one per process) go under TMPDIR: a directory of
# the build tree, removed at the end with what an input that aborted left behind.
export TMPDIR="$PWD/build-fuzz/tmp"
rm -rf "$TMPDIR" && mkdir -p "$TMPDIR"
trap 'rm -rf "$TMPDIR"' EXIT
echo "fuzz: replaying tests/fuzz/corpus ($(ls tests/fuzz/corpus | wc -l) inputs)"
"$bin" -runs=0 -artifact_prefix=build-fuzz/artifacts/ tests/fuzz/corpus
echo "fuzz: fuzzing, $what"
# A fixed seed (KVVMTEST_FUZZ_SEED, default 1): the test command's run is the same inputs every
# time (a red CI names an input, never a draw); a long run by hand sets another seed.
"$bin" -seed="${KVVMTEST_FUZZ_SEED:-1}" "${limit[@]}" -max_len=1024 -len_control=0 -timeout=60 \
       -artifact_prefix=build-fuzz/artifacts/ -print_final_stats=1 \
       build-fuzz/corpus tests/fuzz/corpus
# The pool protocol's parser (tests/fuzz/fuzz_pool: every message kvvmd or a client
# receives): the same bound, its own corpus directory.
mkdir -p build-fuzz/corpus_pool
echo "fuzz: the pool protocol's parser, $what"
build-fuzz/tests/fuzz/fuzz_pool -seed="${KVVMTEST_FUZZ_SEED:-1}" "${limit[@]}" -max_len=1024 \
       -artifact_prefix=build-fuzz/artifacts/ -print_final_stats=1 build-fuzz/corpus_pool \
       tests/fuzz/corpus_pool
