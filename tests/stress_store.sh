#!/usr/bin/env bash
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
# --save ''): the same with a2 then b2 (seed 11). Redis Cluster (when redis-cli is installed
# too: 3 masters at free ports, created with redis-cli --cluster create, waited for until
# cluster_state:ok): the same with a3 then b3 (seed 13) through redis-cluster://.
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
cpids=()
cleanup() {
    [ -n "$rpid" ] && kill -9 "$rpid" 2>/dev/null
    for p in "${cpids[@]}"; do kill -9 "$p" 2>/dev/null; done
    rm -rf "$dir"
}
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
    disown $!
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

# A Redis Cluster of 3 masters (redis-cluster://): the same two runs through it.
freeport() {   # a free port whose cluster bus port (+10000) is free too
    python3 -c 'import socket
while True:
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]
    if p + 10000 < 65536:
        t = socket.socket()
        try:
            t.bind(("127.0.0.1", p + 10000)); print(p); break
        except OSError:
            pass'
}
if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
    mkdir "$dir/cluster"
    nodes=() ports=()
    for i in 1 2 3; do
        p=$(freeport)
        redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes \
            --cluster-config-file "$dir/cluster/nodes-$p.conf" --dir "$dir/cluster" \
            --save '' --appendonly no --requirepass stress-pw --masterauth stress-pw \
            >/dev/null 2>&1 &
        cpids+=($!)
        disown $!
        ports+=("$p")
        nodes+=("127.0.0.1:$p")
    done
    for i in 0 1 2; do
        until redis-cli -p "${ports[$i]}" -a stress-pw --no-auth-warning ping 2>/dev/null |
              grep -q PONG; do
            kill -0 "${cpids[$i]}" 2>/dev/null || { bad "a cluster node exited"; break 2; }
            sleep 0.05
        done
    done
    redis-cli -a stress-pw --no-auth-warning --cluster create "${nodes[@]}" --cluster-yes \
        >/dev/null 2>&1 || bad "redis-cli --cluster create failed"
    for p in "${ports[@]}"; do
        until redis-cli -p "$p" -a stress-pw --no-auth-warning cluster info 2>/dev/null |
              grep -q cluster_state:ok; do
            sleep 0.05
        done
    done
    url="redis-cluster://:stress-pw@${nodes[0]},${nodes[1]}"
    run a3 13 "$url"
    run b3 13 "$url"
    reader b3 a3
else
    echo "stress_store: SKIP    redis-cluster: redis-server or redis-cli is not installed" \
         "(scripts/install-deps.sh)"
fi
exit $fail
