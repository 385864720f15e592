#!/usr/bin/env python3
"""paging_owners_plant: scripts/paging-owners.py fails on a write to another owner's part.

Copies paging/'s sources and header to a temporary tree, runs the check on the copy as it
is (must pass), then plants writes to parts of struct paging that the file's owner does not
own, one kind at a time: a direct assignment, a compound assignment, a pre-increment and
a write through a pointer the file takes to the part. Each planted tree must fail with the
planted line named. The objects are the real ones (the call graph is unchanged).

usage: paging_owners_plant.py SOURCE_DIR OBJECT...
"""
import os
import shutil
import subprocess
import sys
import tempfile

# (file, text planted as the first statement of its first function, the part, the owner)
PLANTS = [
    ('check.c', 'pg->fr.n_ready = 0;', 'fr'),                 # context writes frames'
    ('seq.c', 'pg->ck.n_syncs += 1;', 'ck'),                  # seqs writes clock's
    ('host_tier.c', '++pg->sq.n_out;', 'sq'),                      # transfers writes seqs'
    ('window.c', 'struct pg_seqs *q = &pg->sq; q->n_live--;', 'sq'),  # through a pointer
]


def run(src, header, objs):
    p = subprocess.run([sys.executable, os.path.join(src, 'scripts', 'paging-owners.py'),
                        '--header', header] + objs, capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def plant(path, stmt):
    with open(path, encoding='utf-8') as f:
        lines = f.read().split('\n')
    for i, line in enumerate(lines):
        if line == '{':                                  # a function's opening brace
            lines.insert(i + 1, '    ' + stmt)
            with open(path, 'w', encoding='utf-8') as f:
                f.write('\n'.join(lines))
            return i + 2                                 # its line number
    sys.exit('paging_owners_plant: no function body in %s' % path)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    src, objs = sys.argv[1], sys.argv[2:]
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        pdir = os.path.join(tmp, 'paging')

        def fresh():
            shutil.rmtree(pdir, ignore_errors=True)
            shutil.copytree(os.path.join(src, 'paging'), pdir)
        fresh()
        header = os.path.join(pdir, 'paging_int.h')
        rc, out = run(src, header, objs)
        if rc != 0:
            print('FAIL: the unplanted copy fails the check:\n' + out)
            return 1
        for fn, stmt, part in PLANTS:
            fresh()
            line = plant(os.path.join(pdir, fn), stmt)
            rc, out = run(src, header, objs)
            want = 'paging/%s:%d writes pg->%s' % (fn, line, part)
            if rc != 1 or want not in out:
                print('FAIL: planted "%s" in %s:%d not reported (rc %d, wanted "%s"):\n%s'
                      % (stmt, fn, line, rc, want, out))
                failed += 1
            else:
                print('ok: %s' % want)
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
