#!/usr/bin/env python3
"""Size audit of the library sources: files over 1000 lines, functions over 120 lines.

A file over the limit should say why at its top (a line starting "Size:" in its first
comment); a function over the limit should be split. Functions are found by the tree's
style: a definition starts at column 0 with its name and '(' and its body ends at the first
'}' in column 0. Prints each finding; with --check, exits 1 when there is one (files that
give a reason excepted).

usage: scripts/size-audit.py [--check] [--file-lines N] [--func-lines N] [root]
"""
import argparse
import pathlib
import re
import sys

LIB = ["common", "core", "vmm", "paging", "host", "disk", "store", "swap", "prefix", "testing"]
ap = argparse.ArgumentParser()
ap.add_argument("--check", action="store_true")
ap.add_argument("--file-lines", type=int, default=1000)
ap.add_argument("--func-lines", type=int, default=120)
ap.add_argument("root", nargs="?", default=pathlib.Path(__file__).resolve().parent.parent)
a = ap.parse_args()
root = pathlib.Path(a.root)

start = re.compile(r"^(?:static\s+|inline\s+)*[A-Za-z_][\w\s\*]*?\b(\w+)\s*\([^;]*$")
findings = 0
for d in LIB:
    for p in sorted((root / d).rglob("*.[ch]")):
        lines = p.read_text(errors="replace").splitlines()
        rel = p.relative_to(root)
        if len(lines) > a.file_lines:
            head = "\n".join(lines[:40])
            why = re.search(r"^\s*\*?\s*Size:", head, re.M)
            print(f"{rel}: {len(lines)} lines (> {a.file_lines})"
                  + (" - reason given at its top" if why else ""))
            findings += 0 if why else 1
        i = 0
        while i < len(lines):
            m = start.match(lines[i])
            if m and not lines[i].startswith(("#", " ", "\t", "/", "}", "typedef")):
                j = i
                while j < len(lines) and lines[j] != "{" and not lines[j].rstrip().endswith(
                        ("{", ";")) and j - i < 8:
                    j += 1
                if j < len(lines) and (lines[j] == "{" or lines[j].rstrip().endswith("{")) \
                        and "=" not in lines[i].split("(")[0]:
                    k = j + 1
                    while k < len(lines) and not lines[k].startswith("}"):
                        k += 1
                    n = k - i + 1
                    if n > a.func_lines:
                        print(f"{rel}:{i + 1}: {m.group(1)}() is {n} lines (> {a.func_lines})")
                        findings += 1
                    i = k
            i += 1
print(f"size-audit: {findings} finding(s)")
sys.exit(1 if a.check and findings else 0)
