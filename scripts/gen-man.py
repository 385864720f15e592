#!/usr/bin/env python3
"""Generates the section-3 man pages (man kvvm_seq_grow, ...) from docs/api.md.

docs/api.md is the one source: every reference entry there starts with a paragraph
"**`<prototype>`** — <text>" and runs until the next entry or heading. Each entry becomes
docs/man/man3/<function>.3 (NAME, SYNOPSIS, DESCRIPTION with the errors, SEE ALSO).

    python3 scripts/gen-man.py           # (re)writes docs/man/man3/
    python3 scripts/gen-man.py --check   # exit 1 if a page is missing or out of date
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "docs", "api.md")
OUT = os.path.join(ROOT, "docs", "man", "man3")

ENTRY = re.compile(r"^\*\*`([^`]*?\b(kvvm_[a-z_]+)\([^`]*)`\*\*\s*(?:\(planned\))?\s*(?:—\s*)?(.*)$")


def roff_inline(text):
    """Markdown inline markup to roff: `code` and **bold** in bold, links as their text."""
    text = text.replace("\\", "\\e")
    text = re.sub(r"\[([^][]+)\]\([^)]+\)", r"\1", text)
    text = re.sub(r"\*\*`([^`]+)`\*\*", r"\\fB\1\\fR", text)
    text = re.sub(r"\*\*([^*]+)\*\*", r"\\fB\1\\fR", text)
    text = re.sub(r"`([^`]+)`", r"\\fB\1\\fR", text)
    return text


def roff_line(line):
    line = roff_inline(line)
    if line.startswith((".", "'")):
        line = "\\&" + line
    return line


def join_prototypes(lines):
    """A prototype wrapped over several lines ("**`int f(a,", "b)`** — ...") joined into one."""
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        while line.startswith("**`") and "`**" not in line and i + 1 < len(lines) \
                and lines[i + 1].strip():
            i += 1
            line += " " + lines[i].strip()
        out.append(line)
        i += 1
    return out


def entries(lines):
    """Yields (function, prototype, body lines) for every reference entry."""
    lines = join_prototypes(lines)
    i = 0
    while i < len(lines):
        m = ENTRY.match(lines[i])
        if not m:
            i += 1
            continue
        proto, name, first = m.group(1), m.group(2), m.group(3)
        body = [first] if first else []
        if i + 1 < len(lines) and not first:
            lines[i + 1] = re.sub(r"^—\s*", "", lines[i + 1])   # a prototype on its own line
        i += 1
        while i < len(lines) and not ENTRY.match(lines[i]) and not lines[i].startswith("#") \
                and not lines[i].startswith("---"):
            body.append(lines[i])
            i += 1
        yield name, proto, body


def summary(body):
    """The entry's first sentence, without markup, for the NAME line."""
    text = " ".join(l.strip() for l in body).split(". ")[0]
    text = re.sub(r"\[([^][]+)\]\([^)]+\)", r"\1", text).replace("`", "").replace("**", "")
    head, depth = text, 0
    for j, ch in enumerate(text):          # cut at the first ": " or "; " outside parentheses
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and text[j:j + 2] in (": ", "; "):
            head = text[:j]
            break
    text = (head if len(head) >= 20 else text).replace("\\", "\\e")
    return text if len(text) <= 90 else text[:87].rsplit(" ", 1)[0] + " ..."


def render(name, proto, body):
    out = [
        '.TH %s 3 "" "libkvvm" "libkvvm manual"' % name.upper(),
        ".SH NAME",
        "%s \\- %s" % (name, summary(body)),
        ".SH SYNOPSIS",
        ".nf",
        ".B #include <kvvm.h>",
        ".PP",
        roff_line(proto + ";"),
        ".fi",
        ".SH DESCRIPTION",
    ]
    in_code = False
    for k, line in enumerate(body):
        if line.startswith("```"):
            out.append(".fi" if in_code else ".nf")
            in_code = not in_code
            continue
        if in_code:
            out.append(roff_line(line) if line else "")
        elif not line.strip():
            out.append(".PP")
        elif line.startswith("- "):
            out.append(".IP \\(bu 2")
            out.append(roff_line(line[2:]))
        elif line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            nxt = body[k + 1] if k + 1 < len(body) else ""
            if all(re.fullmatch(r":?-+:?", c) for c in cells) or re.match(r"^\|[\s:|-]+\|$", nxt):
                continue                  # the separator row, and the header row above it
            out.append(".IP \\(bu 2")
            out.append(" \\(em ".join(roff_line(c) for c in cells))
        else:
            out.append(roff_line(line.strip()))
    if in_code:
        out.append(".fi")
    if "kvvm *kv" in proto and proto.startswith("int "):
        out += [".PP", "Like every call taking a context, it also returns \\fB-EINVAL\\fR when "
                "\\fIkv\\fR is NULL and \\fB-EIO\\fR once the context is dead."]
    out += [".SH SEE ALSO",
            "docs/api.md (the reference, with the rules an engine follows) and "
            "include/kvvm.h of libkvvm."]
    # no doubled paragraph marks, none right after a heading or at the end
    text = []
    for line in out:
        if line == ".PP" and text and text[-1] in (".PP", ".SH DESCRIPTION", ".SH SEE ALSO"):
            continue
        text.append(line)
    while text and text[-1] == ".PP":
        text.pop()
    return "\n".join(text) + "\n"


def main():
    check = "--check" in sys.argv[1:]
    with open(SRC, encoding="utf-8") as f:
        lines = f.read().split("\n")
    pages = {}
    for name, proto, body in entries(lines):
        pages[name + ".3"] = render(name, proto, body)
    stale = []
    if not check:
        os.makedirs(OUT, exist_ok=True)
    for fname, text in sorted(pages.items()):
        path = os.path.join(OUT, fname)
        old = open(path, encoding="utf-8").read() if os.path.exists(path) else None
        if old == text:
            continue
        stale.append(fname)
        if not check:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
    if os.path.isdir(OUT):
        extra = [f for f in os.listdir(OUT) if f not in pages]
        for f in extra:
            stale.append(f)
            if not check:
                os.remove(os.path.join(OUT, f))
    if check:
        if stale:
            print("out of date (run scripts/gen-man.py): " + ", ".join(stale))
            return 1
        print("%d man pages up to date" % len(pages))
        return 0
    print("%d man pages in %s (%d written)" % (len(pages), os.path.relpath(OUT, ROOT),
                                                len(stale)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
