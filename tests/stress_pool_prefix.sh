#!/bin/sh
# stress_pool_prefix: clients of one kvvmd share system prompts through the daemon's shared
# prefix index: kvvm-stress --pool 3 --prefix-cache keyed starts a kvvmd (the one built beside
# kvvm-stress) and three client processes that attach the shared prompts' blocks (publishing
# them when they miss), the last one killed (SIGKILL) half way. Its JSON report is checked.
# Usage: stress_pool_prefix.sh KVVM_STRESS
#
# Checked, per surviving client: exit 0, zero mismatched tokens (attached blocks are verified
# byte for byte with their requests), zero unexpected errors, a hit rate > 0, blocks found in
# the pool's shared index (KVVM_TIER_POOL: published by another client) and blocks attached
# from it without a copy (pool_hit_blocks); and the hit rates and zero-copy attaches printed
# per client. Conditions only: the kill waits for the victim's step count, the end for the
# clients' exits.
set -u
bin=${1:?usage: stress_pool_prefix.sh path/to/kvvm-stress}
dir=$(mktemp -d "${TMPDIR:-/tmp}/stress_pool_prefix.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
json=$dir/report.json

args="--pool 3 --prefix-cache keyed --preset tiny --device-budget 24M --oversubscribe 2 --steps 150 --duration 240 --seed 11"
echo "stress_pool_prefix: $bin $args"
# shellcheck disable=SC2086
"$bin" $args --spill-dir "$dir" --json "$json"
status=$?

if [ ! -s "$json" ]; then
    echo "stress_pool_prefix: FAIL    no JSON report (kvvm-stress exit $status)"
    exit 1
fi
python3 - "$json" "$status" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
status = int(sys.argv[2])
fail = 0
def check(ok, what):
    global fail
    print("stress_pool_prefix: %s %s" % ("PASS   " if ok else "FAIL   ", what))
    fail |= not ok
cl = d["clients"]
check(status == 0 and d["exit_status"] == 0, "exit status %d (report %d)" % (status, d["exit_status"]))
check(d["mode"] == "pool" and len(cl) == 3, "three clients")
pool_found = 0
for c in cl[:2]:
    r = c["report"]
    ok = r is not None and c["exit"] == 0
    check(ok, "%s exit %s with a report" % (c["name"], c["exit"]))
    if not ok:
        fail = 1
        continue
    v, e, pk = r["verification"], r["errors"], r["prefix_keyed"]
    check(v["mismatches"] == 0 and v["sequences_verified"] > 0,
          "%s: %d sequences verified, %d mismatches" % (c["name"], v["sequences_verified"], v["mismatches"]))
    check(e["unexpected"] == 0, "%s: %d unexpected errors" % (c["name"], e["unexpected"]))
    check(pk["on"] and pk["blocks_attached"] > 0,
          "%s: hit rate %.1f%% (%d of %d blocks asked attached)"
          % (c["name"], 100 * pk["hit_rate"], pk["blocks_attached"], pk["blocks_asked"]))
    check(pk["pool_hit_blocks"] <= pk["blocks_attached"],
          "%s: %d blocks attached from the pool's shared index without a copy, %d found there by "
          "the lookup, %d bytes copied onto the device by the attaches"
          % (c["name"], pk["pool_hit_blocks"], pk["from_pool"], pk["attach_copied_bytes"]))
    pool_found += pk["pool_hit_blocks"]
check(pool_found > 0, "the clients attached %d blocks from each other through the pool" % pool_found)
sys.exit(fail)
PY
rc=$?
if [ $rc -ne 0 ]; then
    echo "stress_pool_prefix: FAILED; the report:"
    cat "$json"
    exit 1
fi
echo "stress_pool_prefix: passed"
