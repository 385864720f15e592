#!/bin/sh
# stress_duration: kvvm-stress --duration is a bound on the run, and the summary counts the
# steps it ran (issue 32: `--duration 5 --prefix-cache keyed --pool-view --store ...` ran 35 s
# at load 20, its first step's prefill burst alone 10 s, and the summary's time left out the
# setup and the final verification). No wall-clock tightness is asserted: a bound so small
# that the setup passes it must run no step at all, a normal bound must stop with its
# summary, and the summary and the JSON must tell the same steps and times.
# Usage: stress_duration.sh KVVM_STRESS
set -u
bin=${1:?usage: stress_duration.sh path/to/kvvm-stress}
dir=$(mktemp -d "${TMPDIR:-/tmp}/stress_duration.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
py=$(command -v python3) || { echo "SKIP: no python3 to read the JSON"; exit 77; }
fail=0
ok()  { echo "stress_duration: PASS    $*"; }
bad() { echo "stress_duration: FAIL    $*"; fail=1; }
small="--quiet --device-budget 32M --prefix-cache keyed --pool-view --store file://$dir/store"
mkdir "$dir/store"

# run NAME DURATION: the run's exit status, its summary (stdout and stderr) and its JSON
run() {
    "$bin" $small --duration "$2" --json "$dir/$1.json" >"$dir/$1.txt" 2>&1
    st=$?
    [ $st -eq 0 ] && ok "$1: --duration $2 exit 0" ||
        bad "$1: --duration $2 exit $st: $(tail -5 "$dir/$1.txt")"
}
# check NAME: the summary's steps are the JSON's, and its times add up
check() {
    sum=$(sed -n 's/^  run  *\([0-9]*\) steps\{0,1\} in .*/\1/p' "$dir/$1.txt")
    "$py" - "$dir/$1.json" "$sum" "$2" <<'EOF' && ok "$1: summary and JSON agree" || bad "$1"
import json, sys
run = json.load(open(sys.argv[1]))["run"]
summary, want = sys.argv[2], sys.argv[3]
assert summary == str(run["steps"]), "summary says %r steps, JSON %d" % (summary, run["steps"])
parts = run["setup_s"] + run["elapsed_s"] + run["drain_s"]
assert abs(parts - run["wall_s"]) < 0.01, "setup + steps + drain %.3f != wall %.3f" % (
    parts, run["wall_s"])
if want == "none":
    assert run["steps"] == 0 and run["tokens_decoded"] == 0, run
else:
    assert run["steps"] >= 1, run
    # generous: a bound of 2 s must stop, however loaded the machine
    assert run["elapsed_s"] + run["setup_s"] < float(want), run
assert not run["aborted"], run
EOF
}

# 1. a bound the setup alone passes (1 microsecond): no step starts, the summary says 0
run tiny 0.000001
check tiny none
grep -q "^  run  *0 steps in" "$dir/tiny.txt" && ok "tiny: the summary says 0 steps" ||
    bad "tiny: $(grep '^  run' "$dir/tiny.txt")"
# 2. a bound of 2 s: it stops, with steps, and says what the time went to
run two 2
check two 120
grep -q "^  time .* of setup, .* of steps, .* of final verification" "$dir/two.txt" &&
    ok "two: the summary's time line" || bad "two: no time line: $(grep '^  time' "$dir/two.txt")"
exit $fail
