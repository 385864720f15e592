#!/bin/sh
# stress_cli: how kvvm-stress behaves at its edges (issue 11, item 5), in well under 30 s.
# Usage: stress_cli.sh KVVM_STRESS
#
# Checked: '--json -' puts only JSON on stdout (python3 -m json.tool parses it) and the
# summary on stderr; SIGINT and SIGTERM end a run with the summary and the JSON written
# (run.interrupted) and exit 0 when everything verified; bad option values, unwritable output
# paths and a bad --spill-dir are refused before the run (exit 2) with a message naming the
# valid range or the reason; --oversubscribe 1 and 0.5 run and pass.
set -u
bin=${1:?usage: stress_cli.sh path/to/kvvm-stress}
dir=$(mktemp -d "${TMPDIR:-/tmp}/stress_cli.XXXXXX") || exit 1
trap 'rm -rf "$dir"' EXIT
fail=0
ok()  { echo "stress_cli: PASS    $*"; }
bad() { echo "stress_cli: FAIL    $*"; fail=1; }
# Which python parses the JSON: the first python3 on PATH (json.tool is in the standard library).
py=$(command -v python3 || true)
small="--steps 40 --quiet --device-budget 32M --verify-every 4"

# 1. --json -: JSON alone on stdout
"$bin" $small --json - >"$dir/out.json" 2>"$dir/err.txt"
st=$?
[ $st -eq 0 ] && ok "--json - exit 0" || bad "--json - exit $st: $(tail -3 "$dir/err.txt")"
if [ -n "$py" ]; then
    "$py" -m json.tool <"$dir/out.json" >/dev/null 2>&1 && ok "stdout is JSON alone" ||
        bad "stdout is not JSON alone: $(head -c 200 "$dir/out.json")"
else
    echo "stress_cli: SKIPPED JSON parse (no python3 on PATH)"
fi
[ "$(head -c 1 "$dir/out.json")" = "{" ] && ok "stdout starts with the JSON object" ||
    bad "stdout starts with '$(head -c 40 "$dir/out.json")'"
grep -q "kvvm-stress summary" "$dir/err.txt" && ok "summary on stderr" || bad "no summary on stderr"

# 2. SIGINT and SIGTERM: the summary and the JSON are still written
for sig in INT TERM; do
    # removed first: the redirection below truncates it in the child, which may run after
    # the wait loop's first grep; a file left by the SIGINT run would then already hold
    # "backend" and the SIGTERM would come before the handler (exit 143 in CI)
    rm -f "$dir/sig.out"
    "$bin" --duration 20 --quiet --device-budget 32M --json "$dir/sig.json" \
           >"$dir/sig.out" 2>&1 &
    pid=$!
    # until the run has started (not a fixed time: a loaded machine may take longer): its
    # first line ("kvvm-stress: ..., backend ...") is printed once SIGINT/SIGTERM are blocked,
    # just before its handler is installed, so from then on the signal is caught, never the
    # default action (which killed the run when it came sooner)
    until grep -q "backend" "$dir/sig.out" 2>/dev/null; do
        kill -0 $pid 2>/dev/null || break
        sleep 0.05
    done
    kill -$sig $pid
    wait $pid
    st=$?
    [ $st -eq 0 ] && ok "SIG$sig: exit 0" || bad "SIG$sig: exit $st: $(tail -3 "$dir/sig.out")"
    grep -q "interrupted: SIG$sig" "$dir/sig.out" && ok "SIG$sig: summary printed" ||
        bad "SIG$sig: no 'interrupted' summary line"
    grep -q "\"interrupted\": \"SIG$sig\"" "$dir/sig.json" && ok "SIG$sig: JSON written" ||
        bad "SIG$sig: the JSON lacks run.interrupted"
    rm -f "$dir/sig.json"
done

# 3. refused before the run: exit 2 and the message
refuse() {   # refuse 'what' 'expected message part' args...
    what=$1 want=$2
    shift 2
    "$bin" "$@" --steps 5 --quiet >"$dir/r.out" 2>&1
    st=$?
    if [ $st -eq 2 ] && grep -qF -- "$want" "$dir/r.out"; then
        ok "$what: exit 2, '$(head -1 "$dir/r.out")'"
    else
        bad "$what: exit $st, '$(cat "$dir/r.out")' lacks '$want'"
    fi
}
refuse "--duration 0" "valid: seconds > 0" --duration 0
refuse "--max-parallel 1" "valid: an integer from 2 to 64" --max-parallel 1
refuse "--oversubscribe 2000" "valid: a number from 0.1 to 1000" --oversubscribe 2000
refuse "--share 1.5" "valid: a fraction from 0 to 1" --share 1.5
refuse "--backend gpu" "valid: auto, cuda or emulated" --backend gpu
refuse "--json in a missing directory" "directory $dir/nope does not exist" \
       --json "$dir/nope/r.json"
refuse "--trace a directory" "is a directory" --trace "$dir"
refuse "--spill-dir missing" "no such directory" --spill-dir "$dir/nope"
touch "$dir/file"
refuse "--spill-dir a file" "not a directory" --spill-dir "$dir/file"
refuse "--pool 0" "valid: client processes from 1 to 64" --pool 0
refuse "--pool with --trace" "--trace is one process's" --pool 2 --trace "$dir/t.csv"
refuse "--pool-socket with no daemon" "no kvvmd answers on pool_socket" \
       --pool-socket "$dir/no.sock"
refuse "--pool joining no daemon" "gets no answer from the daemon" --pool 2 \
       --pool-socket "$dir/no.sock"
[ ! -e "$dir/nope" ] && ok "nothing created for refused outputs" || bad "$dir/nope created"

# 4. --oversubscribe <= 1 runs
for x in 1 0.5; do
    "$bin" $small --oversubscribe $x >"$dir/x.out" 2>&1
    st=$?
    [ $st -eq 0 ] && grep -q "result: PASS" "$dir/x.out" && ok "--oversubscribe $x passes" ||
        bad "--oversubscribe $x: exit $st: $(tail -5 "$dir/x.out")"
done

[ $fail -eq 0 ] && echo "stress_cli: passed" || echo "stress_cli: FAILED"
exit $fail
