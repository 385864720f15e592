#!/bin/sh
# stress_pool: the main job over the pool daemon, short: kvvm-stress --pool 3 starts a kvvmd
# (the one built beside kvvm-stress) and three client processes whose limits add up to twice
# the pool, kills the last one (SIGKILL) once it has run half its steps, and reports. Its JSON
# report is checked. Usage: stress_pool.sh KVVM_STRESS
#
# Checked: exit status 0; three clients; the victim killed by SIGKILL mid-run and the daemon
# dropping it (its frames back); each survivor exit 0 with zero mismatched tokens, zero
# unexpected errors, something verified and its frames leased from the daemon; the pool ran
# dry (calls waited for the daemon, or its figures saw every frame held) so the arbitration was
# exercised; at the end every frame back in the pool and no client left. Conditions only: the
# kill waits for the victim's step count, the end for the clients' exits.
set -u
bin=${1:?usage: stress_pool.sh path/to/kvvm-stress}
dir=$(mktemp -d "${TMPDIR:-/tmp}/stress_pool.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
json=$dir/report.json

args="--pool 3 --preset tiny --device-budget 24M --oversubscribe 3 --steps 200 --duration 240 --seed 7"
echo "stress_pool: $bin $args"
# shellcheck disable=SC2086
"$bin" $args --spill-dir "$dir" --json "$json"
status=$?

if [ ! -s "$json" ]; then
    echo "stress_pool: FAIL    no JSON report (kvvm-stress exit $status)"
    exit 1
fi
python3 - "$json" "$status" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
status = int(sys.argv[2])
fail = 0
def check(ok, what):
    global fail
    print("stress_pool: %s %s" % ("PASS   " if ok else "FAIL   ", what))
    fail |= not ok
p, k, cl = d["pool"], d["kill"], d["clients"]
check(status == 0 and d["exit_status"] == 0, "exit status %d (report %d)" % (status, d["exit_status"]))
check(d["mode"] == "pool" and p["clients"] == 3 and len(cl) == 3, "three clients")
check(p["limits_over_pool"] > 1.5, "limits add up to %.2fx the pool" % p["limits_over_pool"])
check(k is not None and k["client"] == 2 and cl[2]["killed"] and cl[2]["exit"] == 128 + 9,
      "client 2 killed by SIGKILL (exit %s)" % cl[2]["exit"])
check(k is not None and 0 < k["at_step"] < 200, "killed mid-run (step %s of 200)" % (k and k["at_step"]))
check(k is not None and k["frames_back"], "the daemon dropped it: frames back after %s ms" % (k and k["back_ms"]))
waits = 0
for c in cl[:2]:
    r = c["report"]
    ok = r is not None and c["exit"] == 0
    check(ok, "%s exit %s with a report" % (c["name"], c["exit"]))
    if not ok:
        continue
    v, e, pl = r["verification"], r["errors"], r["pool"]
    check(v["mismatches"] == 0 and v["sequences_verified"] > 0,
          "%s: %d sequences verified, %d mismatches" % (c["name"], v["sequences_verified"], v["mismatches"]))
    check(e["unexpected"] == 0, "%s: %d unexpected errors" % (c["name"], e["unexpected"]))
    check(pl["on"] and pl["leases"] > 0, "%s: %d frames leased from the daemon" % (c["name"], pl["leases"]))
    waits += pl["waits"]
check(waits > 0 or p["peak_held_bytes"] == p["pool_bytes"],
      "the pool ran dry: %d calls waited, peak held %d of %d bytes" % (waits, p["peak_held_bytes"], p["pool_bytes"]))
check(p["all_frames_back"] and p["free_bytes_end"] == p["pool_bytes"] and p["clients_end"] == 0,
      "every frame back at the end (%d of %d bytes free, %d clients)" % (p["free_bytes_end"], p["pool_bytes"], p["clients_end"]))
sys.exit(fail)
PY
rc=$?
if [ $rc -ne 0 ]; then
    echo "stress_pool: FAILED; the report:"
    cat "$json"
    exit 1
fi
echo "stress_pool: passed"
