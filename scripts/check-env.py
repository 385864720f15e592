#!/usr/bin/env python3
"""Checks the KVVM_* environment variables against their one list (common/env.h).

Every KVVM_* variable that the library, its tests, tools, scripts or Python package reads or
sets must be a configuration field (KVVM_<FIELD>, the OPT(...) table of core/config.c) or
be listed in KVVM_ENV_VARS (common/env.h); kvvm_config_init warns about any other. The
table under "### Other environment variables" in docs/api.md must name exactly the listed
variables that the library reads (reader in a library folder); the others (the Python
package's, the tests' and scripts') are documented by the list itself and their own docs.
Exit 0 when all hold, 1 with each difference printed.

usage: scripts/check-env.py [source-root]
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent)
entries = re.findall(r'\bX\((KVVM_[A-Z0-9_]+), "([^"]*)"', (root / "common/env.h").read_text())
listed = [n for n, _ in entries]
library = ("common/", "core/", "vmm/", "paging/", "host/", "disk/", "store/", "swap/")
in_library = {n for n, reader in entries if reader.startswith(library)}
# Set by a test on purpose, to see the unknown-variable warning.
deliberate = {"KVVM_NOT_A_SETTING"}
fields = {"KVVM_" + n.upper() for n in
          re.findall(r"\bOPT\((\w+), OPT_", (root / "core/config.c").read_text())}
problems = []
if not listed or not fields:
    problems.append("common/env.h or core/config.c: no variables or options found")
for name, reader in entries:
    for r in (x.strip() for x in reader.split(",")):
        if not (root / r).is_file() or name not in (root / r).read_text(errors="replace"):
            problems.append(f"common/env.h: {name}'s reader {r} does not read it (moved?)")
    if name in fields:
        problems.append(f"common/env.h: {name} is a configuration field (core/config.c)")

# Reads and writes of a variable, in C, Python and shell.
use = re.compile(r"""(?:getenv|setenv|unsetenv|kenv|environ\.get|environ\[|putenv)\(?\s*["']?"""
                 r"""(KVVM_[A-Z0-9_]+)|\$\{?(KVVM_[A-Z0-9_]+)""")
known = set(listed) | fields | deliberate
dirs = ["common", "core", "vmm", "paging", "host", "disk", "swap", "tests", "tools",
        "python", "scripts", "examples"]
for d in dirs:
    for p in sorted((root / d).rglob("*")):
        if p.suffix not in (".c", ".h", ".py", ".sh") or not p.is_file():
            continue
        for ln, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            for m in use.finditer(line):
                name = m.group(1) or m.group(2)
                if name not in known:
                    problems.append(f"{p.relative_to(root)}:{ln}: {name} is neither a "
                                    "configuration field nor in common/env.h")

api = (root / "docs/api.md").read_text()
sec = re.search(r"^### Other environment variables\n(.*?)(?=^#)", api, re.M | re.S)
documented = re.findall(r"^\| `(KVVM_[A-Z0-9_]+)`", sec.group(1), re.M) if sec else []
if not sec:
    problems.append('docs/api.md: no "### Other environment variables" section')
for name in sorted(in_library - set(documented)):
    problems.append(f"docs/api.md: {name} (common/env.h) is not in the table")
for name in sorted(set(documented) - set(listed)):
    problems.append(f"docs/api.md: {name} is in the table but not in common/env.h "
                    "(or not read by the library)")

for p in problems:
    print(p)
print(f"check-env: {len(listed)} listed variables, {len(fields)} configuration fields, "
      f"{len(problems)} problems")
sys.exit(1 if problems else 0)
