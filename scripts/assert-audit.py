#!/usr/bin/env python3
"""Assert audit of the library sources: KVVM_ASSERT per folder against its non-blank lines.

Every layer checks its own state machine edges and counts in the KVVM_DEBUG build (issue 33,
STYLE.md "Asserts where the state lives"), at least one assert per --lines non-blank lines
of each folder. A folder counts its own *.c and *.h only (vmm/emu/ is a folder apart from
vmm/); an assert is a KVVM_ASSERT( outside comments and #define lines. Prints each folder's
figures; with --check, exits 1 when a folder is below the bar. testing/ is counted but not
held to the bar: it is the test-only interface (kvvm_testing_*), one-line wrappers with no
state of their own; the state they reach is asserted in the folders that own it.

usage: scripts/assert-audit.py [--check] [--lines N] [root]
"""
import argparse
import pathlib
import re
import sys

LIB = ["common", "core", "vmm", "vmm/emu", "paging", "host", "disk", "store", "swap",
       "prefix", "pool", "testing"]
SHIMS = {"testing"}              # counted, not held to the bar (see above)
ap = argparse.ArgumentParser()
ap.add_argument("--check", action="store_true")
ap.add_argument("--lines", type=int, default=250)
ap.add_argument("root", nargs="?", default=pathlib.Path(__file__).resolve().parent.parent)
a = ap.parse_args()
root = pathlib.Path(a.root)

comment = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
assert_re = re.compile(r"\bKVVM_ASSERT\s*\(")
findings = 0
total_lines = total_asserts = 0
for d in LIB:
    lines = asserts = 0
    for p in sorted((root / d).glob("*.[ch]")):
        text = p.read_text(errors="replace")
        lines += sum(1 for ln in text.splitlines() if ln.strip())
        code = comment.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        asserts += sum(len(assert_re.findall(ln)) for ln in code.splitlines()
                       if not ln.lstrip().startswith("#"))
    need = -(-lines // a.lines)
    low = asserts < need and d not in SHIMS
    findings += low
    per = f"{lines / asserts:.0f}" if asserts else "-"
    print(f"{d + '/':10} {lines:6} lines {asserts:4} asserts  1 per {per:>5} lines"
          + (f"  BELOW 1 per {a.lines} (needs {need})" if low else "")
          + ("  (wrappers: not held to the bar)" if d in SHIMS else ""))
    total_lines += lines
    total_asserts += asserts
print(f"{'total':10} {total_lines:6} lines {total_asserts:4} asserts")
print(f"assert-audit: {findings} folder(s) below the bar")
sys.exit(1 if a.check and findings else 0)
