#!/usr/bin/env python3
"""paging/'s outward interface (issue 33): what paging.h offers and who outside paging/ uses it.

paging/paging.h is the interface of the paging layer to the library's other folders; each
owner's functions for the rest of paging/ are in its internal header (frames.h, seqs.h,
transfers.h, clock.h, window.h, view.h, ahead.h). This script measures the interface:
  - the functions paging.h declares (prototypes and static inlines, at column 0),
  - for each, the files outside paging/ that use it (name seen in the code, comments and
    strings blanked; a use by an inline of paging.h that an outside file uses counts too:
    the inline is compiled into that file), by folder (core swap prefix testing pool tools
    disk host store vmm common; tests/ is not an outside user: a test may include an
    internal header),
  - paging.h's lines,
  - the crossings of one swap_make_room: the sites in swap/'s code reachable from
    swap_make_room (a source call graph over swap/*.c: a static function resolved in its
    own file first) where a paging.h function is named (called, or passed as a callback).

usage: paging-api.py [--check] [--plant] [--list] [--sites] [--walk FUNCTION] ROOT
--check: exit 1 when a function paging.h declares is used by no file outside paging/ (it
belongs in its owner's internal header, not in paging.h), printing each; 0 otherwise.
--plant: the check's own test: a declaration planted in paging.h's text (in memory, the
file untouched) must be reported; exit 0 when it is, 1 when the check misses it.
--list: one line per function (its outside users by folder). --sites: the walk's sites,
one line per swap/ function and paging.h function it names, with the count.
"""
import argparse
import os
import re
import sys

OUTSIDE = ['core', 'swap', 'prefix', 'testing', 'pool', 'tools', 'disk', 'host', 'store',
           'vmm', 'common']
SRC_EXT = ('.c', '.h')


def blank(text):
    """Comments and string/char literals blanked (line numbers kept)."""
    def sub(m):
        return re.sub(r'[^\n]', ' ', m.group(0))
    return re.sub(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', sub,
                  text, flags=re.S)


def strip_macros(text):
    """#define lines (and their continuations) blanked."""
    out, cont = [], False
    for line in text.split('\n'):
        d = cont or re.match(r'\s*#', line)
        cont = bool(d) and line.rstrip().endswith('\\')
        out.append(' ' * len(line) if d else line)
    return '\n'.join(out)


DECL = re.compile(r'^(?:static\s+inline\s+)?(?:const\s+)?(?:(?:struct|enum)\s+)?\w+[\s*]+'
                  r'(?:__attribute__\s*\(\(.*?\)\)\s*)?(\w+)\s*\(', re.M)
KEYWORDS = {'return', 'if', 'for', 'while', 'switch', 'sizeof', 'typedef', '__attribute__'}


def block_end(text, i):
    """The index just past the } that closes the { at text[i]."""
    depth, j = 0, i
    while True:
        depth += {'{': 1, '}': -1}.get(text[j], 0)
        j += 1
        if depth == 0:
            return j


def declared(header, extra=''):
    """(name, inline, body) for each function the header declares (extra: text added after
    it), in order."""
    text = strip_macros(blank(open(header, encoding='utf-8').read() + extra))
    out = []
    for m in DECL.finditer(text):
        name = m.group(1)
        if name in KEYWORDS or m.group(0).split()[0] == 'typedef':
            continue
        inline = m.group(0).startswith('static')
        body = ''
        if inline:                    # its body: from the first { to the matching }
            i = text.index('{', m.end())
            body = text[i:block_end(text, i)]
        out.append((name, inline, body))
    return out


def files_under(root, folders):
    for f in folders:
        top = os.path.join(root, f)
        for d, _, names in os.walk(top):
            for n in sorted(names):
                if n.endswith(SRC_EXT):
                    yield os.path.relpath(os.path.join(d, n), root)


def words(path):
    return set(re.findall(r'\b[A-Za-z_]\w*\b', blank(open(path, encoding='utf-8').read())))


def outside_users(root, decls):
    """name -> set of files outside paging/ using it (inlines' uses followed)."""
    names = {d[0] for d in decls}
    users = {n: set() for n in names}
    for rel in files_under(root, OUTSIDE):
        for n in words(os.path.join(root, rel)) & names:
            users[n].add(rel)
    # a function an outside-used inline of paging.h names is used there too
    inl = {d[0]: set(re.findall(r'\b\w+\b', d[2])) & names for d in decls if d[1]}
    changed = True
    while changed:
        changed = False
        for n, uses in inl.items():
            for u in uses:
                if u != n and users[n] - users[u]:
                    users[u] |= users[n]
                    changed = True
    return users


FUNC_DEF = re.compile(r'^(static\s+)?(?:inline\s+)?(?:const\s+)?(?:(?:struct|enum)\s+)?\w+'
                      r'[\s*]+(\w+)\s*\(([^;{]*?)\)\s*\{', re.M | re.S)


def functions(path):
    """name -> (static, body) of each function defined in a .c file."""
    text = strip_macros(blank(open(path, encoding='utf-8').read()))
    out = {}
    for m in FUNC_DEF.finditer(text):
        i = m.end() - 1
        out[m.group(2)] = (bool(m.group(1)), text[i:block_end(text, i)])
    return out


def crossings(root, start, api):
    """The reachable swap/ functions from start, and the (function, paging name) sites."""
    files = {}
    for rel in files_under(root, ['swap']):
        if rel.endswith('.c'):
            files[rel] = functions(os.path.join(root, rel))
    glob = {n: rel for rel, fs in files.items() for n, (st, _) in fs.items() if not st}

    def resolve(name, rel):
        if name in files[rel]:
            return rel
        return glob.get(name)
    home = glob.get(start)
    if home is None:
        sys.exit('paging-api: %s is not defined in swap/' % start)
    seen, todo, sites = set(), [(start, home)], []
    while todo:
        fn, rel = todo.pop()
        if (fn, rel) in seen:
            continue
        seen.add((fn, rel))
        body = files[rel][fn][1]
        for w in re.findall(r'\b[A-Za-z_]\w*\b', body):
            if w in api:
                sites.append((fn, w))
                continue
            r = resolve(w, rel)
            if r is not None and w != fn:
                todo.append((w, r))
    return seen, sites


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--check', action='store_true')
    ap.add_argument('--plant', action='store_true')
    ap.add_argument('--list', action='store_true')
    ap.add_argument('--sites', action='store_true')
    ap.add_argument('--walk', default='swap_make_room')
    ap.add_argument('root')
    a = ap.parse_args()
    header = os.path.join(a.root, 'paging', 'paging.h')
    if a.plant:
        planted = ('uint32_t paging_planted_unused(struct paging *pg, uint64_t h);\n'
                   'static inline int pg_planted_inline(int x) { return x; }\n')
        d = declared(header, '\n' + planted)
        u = outside_users(a.root, d)
        found = {n for n, _, _ in d if not u[n]}
        want = {'paging_planted_unused', 'pg_planted_inline'}
        print('paging-api: planted %s: %s' % (' '.join(sorted(want)),
                                              'reported' if want <= found else 'MISSED'))
        return 0 if want <= found else 1
    decls = declared(header)
    users = outside_users(a.root, decls)
    n_lines = sum(1 for _ in open(header, encoding='utf-8'))
    used = [d[0] for d in decls if users[d[0]]]
    unused = [d[0] for d in decls if not users[d[0]]]
    by = {f: 0 for f in OUTSIDE}
    for n in used:
        for f in {u.split(os.sep)[0] for u in users[n]}:
            by[f] += 1
    if a.list:
        for n, inline, _ in decls:
            fs = sorted({u.split(os.sep)[0] for u in users[n]})
            print('%-34s %s %s' % (n, 'inline' if inline else '      ',
                                   ' '.join(fs) if fs else '-- none outside paging/'))
    api = {d[0] for d in decls}
    reach, sites = crossings(a.root, a.walk, api)
    if a.sites:
        count = {}
        for s in sites:
            count[s] = count.get(s, 0) + 1
        for (fn, w), c in sorted(count.items()):
            print('%-24s %-32s %d' % (fn, w, c))
    print('paging-api: paging.h %d lines, %d functions declared (%d static inline), %d used '
          'outside paging/ (%s)' % (n_lines, len(decls), sum(1 for d in decls if d[1]),
                                    len(used), ', '.join('%s %d' % (f, by[f])
                                                         for f in OUTSIDE if by[f])))
    print('paging-api: one %s reaches %d functions of swap/, with %d sites naming %d '
          'distinct paging.h functions' % (a.walk, len(reach), len(sites),
                                           len({s[1] for s in sites})))
    if a.check and unused:
        for n in unused:
            print('paging-api: paging/paging.h declares %s, which no file outside paging/ '
                  'uses: declare it in its owner\'s internal header instead' % n)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
