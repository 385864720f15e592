#!/usr/bin/env bash
# clang-tidy without its "N warnings generated." lines: runs `clang-tidy "$@"` and passes on
# its output and exit status, less the lines that only count the diagnostics it suppressed.
# Why they appear: clang-tidy 14 counts every finding of the enabled checks in the system
# headers a file includes (~2,300 bugprone-reserved-identifier hits in glibc's headers per
# file) and prints the count even with --quiet, which hides only the "Suppressed N warnings"
# summary; no option of clang-tidy 14 turns the count off. A file with a finding still
# prints the finding and its "N warnings and M errors generated." line (kept), and the exit
# status is clang-tidy's own.
# Usage: scripts/clang-tidy-quiet.sh -p BUILD_DIR --quiet FILE   (any clang-tidy arguments)
set -u
out=$(clang-tidy "$@" 2>&1)
rc=$?
if [ -n "$out" ]; then
    printf '%s\n' "$out" | grep -Ev '^[0-9]+ warnings? generated\.$'
fi
exit "$rc"
