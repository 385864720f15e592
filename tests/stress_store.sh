#!/bin/sh
# stress_store: kvvm-stress processes sharing prefixes through one store (--prefix-cache keyed
# --store URL) on the emulated device under 4x oversubscription (~20 s). Usage:
# stress_store.sh KVVM_STRESS
#
# File store (a temporary directory): run a (seed 7) writes its prompt blocks through; then b
# (seed 7: the same prompts) and c (seed 9) run at the same time on the same store. Every run
# exits 0 with zero mismatched tokens (attached blocks from the store included: their bytes
# are verified with their requests) and no store error; a writes entries; b reads a's
# entries from the store (gets > 0, a hit rate of 100%: every block a published is found).
# Redis (when redis-server is installed: a server on 127.0.0.1 at a free port, a password,
# --save ''): the same with a2 then b2 (seed 11).
#
# The runs bound a store request by 120 s (KVVM_STORE_TIMEOUT_MS), not the default 1 s: the
# checks are about the store's bytes and what it holds, not its latency. On a loaded machine
# (load 10, 1 run in 20) a put of a's went past 1 s: -ETIMEDOUT, the batches queued behind it
# given up ("store errors 19" in a, and b's hit rate 95.9%: the entries a never wrote). A
# request of 120 s is a hung store, which the verdicts then report.
set -u
bin=${1:?usage: stress_store.sh path/to/kvvm-stress}
dir=$(mktemp -d "${TMPDIR:-/tmp}/stress_store.XXXXXX") || exit 1
rpid=
cleanup() { [ -n "$rpid" ] && kill -9 "$rpid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT

fail=0
ok()  { echo "stress_store: PASS    $*"; }
bad() { echo "stress_store: FAIL    $*"; fail=1; }
get() {
    grep -m1 "^  \"$2\": " "$1" | sed -n "s/.*\"$3\": \([^,}]*\).*/\1/p" | tr -d ' "'
}
gt0() { awk -v a="$1" 'BEGIN { exit !(a + 0 > 0) }'; }

start() {   # start NAME SEED URL: one run in the background, its JSON in $dir/NAME.json
    echo "stress_store: KVVM_EMU_OPAQUE=0 KVVM_STORE_TIMEOUT_MS=120000 $bin --preset tiny --oversubscribe 4" \
         "--device-budget 32M --steps 120 --seed $2 --prefix-cache keyed --store <$1's store>"
    KVVM_EMU_OPAQUE=0 KVVM_STORE_TIMEOUT_MS=120000 "$bin" --preset tiny --oversubscribe 4 --device-budget 32M --steps 120 \
        --seed "$2" --quiet --prefix-cache keyed --store "$3" --json "$dir/$1.json" \
        >"$dir/$1.txt" 2>&1 &
}
check() {   # check NAME STATUS: the run's verdicts
    name=$1 status=$2 j=$dir/$1.json
    grep -E "store  |prefix keys|result" "$dir/$name.txt"
    if [ ! -s "$j" ]; then
        bad "$name: no JSON report (exit $status)"
        tail -20 "$dir/$name.txt"
        return
    fi
    [ "$status" -eq 0 ] && ok "$name: exit status 0" || bad "$name: exit status $status"
    mism=$(get "$j" verification mismatches)
    [ "$mism" = 0 ] && ok "$name: zero mismatched tokens" || bad "$name: mismatches '$mism'"
    unexp=$(get "$j" errors unexpected)
    [ "$unexp" = 0 ] && ok "$name: zero unexpected errors" || bad "$name: errors '$unexp'"
    serr=$(get "$j" store errors)
    [ "$serr" = 0 ] && ok "$name: zero store errors" || bad "$name: store errors '$serr'"
}
run() { start "$@"; wait $!; check "$1" $?; }
reader() {   # reader NAME WRITER: NAME read WRITER's entries: gets > 0, every block found
    gets=$(get "$dir/$1.json" store gets)
    rate=$(get "$dir/$1.json" prefix_keyed hit_rate)
    gt0 "$(get "$dir/$2.json" store puts)" && gt0 "$gets" &&
        awk -v r="$rate" 'BEGIN { exit !(r + 0 == 1) }' &&
        ok "$1: $gets entries of $2 read from the store, hit rate $rate" ||
        bad "$1: store gets '$gets', hit rate '$rate' after $2"
}

mkdir "$dir/files"
run a 7 "file://$dir/files"
start b 7 "file://$dir/files"; pb=$!
start c 9 "file://$dir/files"; pc=$!
wait $pb; sb=$?
wait $pc; sc=$?
check b $sb
check c $sc
reader b a

if command -v redis-server >/dev/null 2>&1; then
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    mkdir "$dir/redis"
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
        --requirepass stress-pw --dir "$dir/redis" >/dev/null 2>&1 &
    rpid=$!
    # until it answers (however long a loaded machine takes to start it), or it exited
    until redis-cli -p "$port" -a stress-pw --no-auth-warning ping 2>/dev/null | grep -q PONG; do
        kill -0 "$rpid" 2>/dev/null || { bad "redis-server exited before answering"; break; }
        sleep 0.05
    done
    run a2 11 "redis://:stress-pw@127.0.0.1:$port"
    run b2 11 "redis://:stress-pw@127.0.0.1:$port"
    reader b2 a2
else
    echo "stress_store: SKIP    redis: redis-server is not installed (scripts/install-deps.sh)"
fi
exit $fail
