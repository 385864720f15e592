#!/usr/bin/env python3
"""paging/'s owner graph (issue 24): no cycle between the owners of struct paging's parts.

The owners are declared once, in paging/paging_int.h's header comment, one line each:
    owner <name>: <file>.c [<file>.c ...]
and the calls upward the graph allows, each by name, one line per owner edge:
    allow <owner> -> <owner>: <function> [<function> ...]
(an allowed call makes no edge; an allow line naming a function that no file of the first
owner calls from the second any more fails the check, so the list stays true).
Field writes too: the header names the parts of struct paging (members of pg->) each
owner writes, and the files that may write any (create, destroy):
    part <owner>: <member> [<member> ...]
    writes any: <file>.c [...]
A write in a paging/*.c to another owner's part fails the check: pg->m... followed by an
assignment (=, op=) or ++/--, or the same through a pointer the file takes to the part
(`T *x = &pg->m...;` then x->... written). The descriptor arrays' elements (pd.pages[i])
are not the part's own fields and are not checked. A source scan, not a compiler: a write
through a pointer passed in from elsewhere is not seen.
Every paging/*.c belongs to exactly one owner. The call graph is read from the compiled
objects (nm): an edge file A -> file B for each global symbol A's object uses and B's
object defines; inline functions of the headers are no calls (they are compiled into the
caller). Files of one owner may call each other freely; the owners' graph must be acyclic.

usage: paging-owners.py --header paging/paging_int.h [--graph] OBJECT...
(objects outside paging/ are ignored; a directory is searched for paging/*.o; an
argument may be a CMake list, OBJECT;OBJECT...)
Exit 0: acyclic, no foreign write; 1: a cycle (printed, with the calls that make each
edge), a write to another owner's part (printed with file and line), a file of paging/
with no owner, an owner naming a file that does not exist, or a stale allow.
"""
import argparse
import os
import re
import subprocess
import sys

OWNER_LINE = re.compile(r'^\s*\*?\s*owner\s+([a-z_]+):\s*((?:[a-z_]+\.c\s*)+)$')
ALLOW_LINE = re.compile(r'^\s*\*?\s*allow\s+([a-z_]+)\s*->\s*([a-z_]+):\s*((?:[A-Za-z_0-9]+\s*)+)$')


def read_allows(header, order):
    allows = {}                      # (owner, owner) -> set of function names
    with open(header, encoding='utf-8') as f:
        for line in f:
            m = ALLOW_LINE.match(line)
            if not m:
                continue
            a, b = m.group(1), m.group(2)
            for o in (a, b):
                if o not in order:
                    sys.exit('paging-owners: allow %s -> %s names no owner %s' % (a, b, o))
            allows.setdefault((a, b), set()).update(m.group(3).split())
    return allows


def read_owners(header):
    owners = {}                      # file stem -> owner
    order = []
    with open(header, encoding='utf-8') as f:
        for line in f:
            m = OWNER_LINE.match(line)
            if not m:
                continue
            name = m.group(1)
            if name in order:
                sys.exit('paging-owners: owner %s declared twice' % name)
            order.append(name)
            for fn in m.group(2).split():
                stem = fn[:-2]
                if stem in owners:
                    sys.exit('paging-owners: %s has two owners (%s, %s)'
                             % (fn, owners[stem], name))
                owners[stem] = name
    if not owners:
        sys.exit('paging-owners: no "owner <name>: <files>" lines in %s' % header)
    return owners, order


PART_LINE = re.compile(r'^\s*\*?\s*part\s+([a-z_]+):\s*((?:[a-z_]+\s*)+)$')
ANY_LINE = re.compile(r'^\s*\*?\s*writes\s+any:\s*((?:[a-z_]+\.c\s*)+)$')


def read_parts(header, order):
    parts, anyw = {}, set()          # member -> owner; files writing any part
    with open(header, encoding='utf-8') as f:
        for line in f:
            m = PART_LINE.match(line)
            if m:
                if m.group(1) not in order:
                    sys.exit('paging-owners: part line names no owner %s' % m.group(1))
                for mem in m.group(2).split():
                    if mem in parts:
                        sys.exit('paging-owners: part %s has two owners' % mem)
                    parts[mem] = m.group(1)
            m = ANY_LINE.match(line)
            if m:
                anyw.update(x[:-2] for x in m.group(1).split())
    return parts, anyw


CHAIN = r'(?:\s*(?:\.\s*\w+|->\s*\w+|\[[^\]\n]*\]))*'
ASSIGN = r'\s*(?:\+\+|--|(?:[-+*/%&|^]|<<|>>)?=(?!=))'


def blank_comments(text):
    """Comments and string literals blanked, line numbers kept."""
    def blank(m):
        return re.sub(r'[^\n]', ' ', m.group(0))
    return re.sub(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"', blank, text, flags=re.S)


def part_writes(path, parts):
    """(line, member, text) for each write to a part of struct paging in the file."""
    text = blank_comments(open(path, encoding='utf-8').read())
    mems = '|'.join(sorted(parts))
    out = []

    def add(m, mem):
        chain = m.group(0)
        if re.match(r'\s*pg\s*->\s*pd\s*\.\s*pages\s*\[', chain.split('=')[0]) or \
           re.search(r'\bpd\s*\.\s*pages\s*\[', chain):
            return                   # a descriptor's field, not the part's
        out.append((text.count('\n', 0, m.start()) + 1, mem, ' '.join(chain.split())))
    post = re.compile(r'\bpg\s*->\s*(' + mems + r')\b' + CHAIN + ASSIGN)
    pre = re.compile(r'(?:\+\+|--)\s*pg\s*->\s*(' + mems + r')\b' + CHAIN)
    for m in list(post.finditer(text)) + list(pre.finditer(text)):
        add(m, m.group(1))
    # pointers the file takes to a part: T *x = &pg->m...;  then x->... written
    alias = re.compile(r'(?<!const )\bstruct\s+\w+\s*\*\s*(\w+)\s*=\s*&\s*pg\s*->\s*('
                       + mems + r')\b')
    for x, mem in sorted({(a.group(1), a.group(2)) for a in alias.finditer(text)}):
        for m in re.finditer(r'(?:(?:\+\+|--)\s*)?\b' + x + r'\s*->\s*\w+' + CHAIN + '(?:' +
                             ASSIGN + ')?', text):
            g = m.group(0)
            if re.match(r'\s*(?:\+\+|--)', g) or re.search(ASSIGN + r'$', g):
                add(m, mem)
    return sorted(set(out))


def paging_objects(args):
    objs = []
    for a in (x for arg in args for x in arg.split(';') if x):   # a CMake list: one arg
        if os.path.isdir(a):
            for root, _, files in os.walk(a):
                if os.path.basename(root) == 'paging':
                    objs += [os.path.join(root, x) for x in files if x.endswith('.o')]
        elif os.path.basename(os.path.dirname(a)) == 'paging' and a.endswith('.o'):
            objs.append(a)
    return sorted(objs)


def stem_of(obj):
    b = os.path.basename(obj)
    return b[:-len('.c.o')] if b.endswith('.c.o') else b[:-len('.o')]


def symbols(obj):
    out = subprocess.run(['nm', obj], check=True, capture_output=True, text=True).stdout
    defined, used = set(), set()
    for line in out.splitlines():
        p = line.split()
        if len(p) == 3 and p[1] in 'TDBRCGSV':       # global definitions
            defined.add(p[2])
        elif len(p) == 2 and p[0] == 'U':
            used.add(p[1])
    return defined, used


def find_cycle(nodes, edges):
    """A cycle of the graph as a list of nodes (first == last), or None."""
    color = {n: 0 for n in nodes}
    stack = []

    def dfs(n):
        color[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if color[m] == 1:
                return stack[stack.index(m):] + [m]
            if color[m] == 0:
                c = dfs(m)
                if c:
                    return c
        stack.pop()
        color[n] = 2
        return None

    for n in nodes:
        if color[n] == 0:
            c = dfs(n)
            if c:
                return c
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--header', required=True)
    ap.add_argument('--graph', action='store_true', help='print the owner graph')
    ap.add_argument('objects', nargs='+')
    a = ap.parse_args()
    owners, order = read_owners(a.header)
    allows = read_allows(a.header, order)
    parts, anyw = read_parts(a.header, order)
    src = os.path.dirname(os.path.abspath(a.header))
    bad = False
    for stem in sorted(owners):
        if not os.path.exists(os.path.join(src, stem + '.c')):
            print('paging-owners: owner %s names %s.c, which does not exist'
                  % (owners[stem], stem))
            bad = True
    for fn in sorted(os.listdir(src)):
        if fn.endswith('.c') and fn[:-2] not in owners:
            print('paging-owners: paging/%s has no owner (add it to an "owner" line of %s)'
                  % (fn, os.path.basename(a.header)))
            bad = True
    n_writes = 0
    for stem in sorted(owners):
        path = os.path.join(src, stem + '.c')
        if not parts or stem in anyw or not os.path.exists(path):
            continue
        for line, mem, what in part_writes(path, parts):
            n_writes += 1
            if parts[mem] != owners[stem]:
                print('paging-owners: paging/%s.c:%d writes pg->%s, owner %s\'s part (the file '
                      'is owner %s): %s' % (stem, line, mem, parts[mem], owners[stem], what))
                bad = True
    objs = paging_objects(a.objects)
    if not objs:
        sys.exit('paging-owners: no paging/*.o among the objects given')
    defs, uses = {}, {}
    for o in objs:
        d, u = symbols(o)
        st = stem_of(o)
        uses[st] = u
        for s in d:
            defs[s] = st
    # owner edges, with the calls that make them
    calls, allowed = {}, {}
    for st, u in uses.items():
        for s in u:
            t = defs.get(s)
            if t is None or t == st or st not in owners or t not in owners:
                continue
            oa, ob = owners[st], owners[t]
            if oa == ob:
                continue
            if s in allows.get((oa, ob), ()):
                allowed.setdefault((oa, ob), set()).add(s)
            else:
                calls.setdefault((oa, ob), []).append('%s.c -> %s.c: %s' % (st, t, s))
    for (oa, ob), names in sorted(allows.items()):
        for s in sorted(names - allowed.get((oa, ob), set())):
            print('paging-owners: allow %s -> %s: %s is no such call any more (remove it)'
                  % (oa, ob, s))
            bad = True
    edges = {}
    for (oa, ob) in calls:
        edges.setdefault(oa, set()).add(ob)
    if a.graph:
        for oa in order:
            print('%-10s -> %s' % (oa, ' '.join(o for o in order if o in edges.get(oa, ()))))
        for (oa, ob), names in sorted(allowed.items()):
            print('%-10s -> %s allowed: %s' % (oa, ob, ' '.join(sorted(names))))
    cyc = find_cycle(order, edges)
    if cyc:
        print('paging-owners: the owner graph has a cycle: %s' % ' -> '.join(cyc))
        for x, y in zip(cyc, cyc[1:]):
            print('  %s -> %s:' % (x, y))
            for c in sorted(calls[(x, y)]):
                print('    ' + c)
        bad = True
    if bad:
        return 1
    print('paging-owners: %d owners, %d files, %d owner edges, no cycle (%d allowed calls '
          'upward); %d writes to struct paging\'s parts, each by its owner'
          % (len(order), len(owners), sum(len(v) for v in edges.values()),
             sum(len(v) for v in allowed.values()), n_writes))
    return 0


if __name__ == '__main__':
    sys.exit(main())
