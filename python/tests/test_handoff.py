"""Sequence hand-off between processes through a real kvvmd (Sequence.export,
Context.import_seq): a fresh interpreter exports and exits; this one imports, reads every
byte with nothing copied, and its writes copy on write."""
import os
import subprocess
import sys

import pytest

import kvvm
from conftest import small_config

LEN = 3 * 64 + 5              # 3 full pages of 64 tokens (64 B each, 4 KiB pages) + 5 tokens


def pool_config(path, **over):
    cfg = small_config(pool_socket=path, page_size=0, emu_granule=0, device_budget=0)
    cfg.update(over)
    return cfg


def pattern(region, n):
    return bytes((region * 31 + i * 7 + i // 4096) & 0xff for i in range(n))


EXPORTER = r"""
import sys, kvvm
sys.path.insert(0, sys.argv[2])
from test_handoff import pool_config, pattern, LEN
with kvvm.Context(**pool_config(sys.argv[1])) as ctx:
    s = ctx.create()
    s.grow(LEN)
    for r in range(2):
        s.write(r, 0, pattern(r, LEN * 64))
    tok = s.export()
    assert ctx.stats()["exports"] == 1
    s.free()
print(tok.hex())
"""


def test_export_in_a_fresh_interpreter_import_here(kvvmd):
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(here), here, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", EXPORTER, kvvmd, here], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    tok = bytes.fromhex(out.stdout.strip().splitlines()[-1])
    assert len(tok) == 32
    # pool_thread 0: no lease ahead in the background, held_bytes moves only with our calls
    with kvvm.Context(**pool_config(kvvmd, pool_thread=0)) as ctx:
        before = ctx.stats()["bytes_to_device"]
        held = ctx.pool_info()["held_bytes"]
        s = ctx.import_seq(tok)
        assert s.length == LEN
        for r in range(2):
            assert s.read(r, 0, LEN * 64) == pattern(r, LEN * 64)
        assert ctx.stats()["bytes_to_device"] == before          # no copy
        assert ctx.pool_info()["held_bytes"] == held              # not leased to us
        assert ctx.stats()["imports"] == 1
        with pytest.raises(kvvm.Error) as e:
            ctx.import_seq(tok)                                   # once
        assert e.value.errno == 2
        s.write(0, 0, b"\xee" * 64)                               # copy on write here
        assert s.read(0, 0, 64) == b"\xee" * 64
        t2 = s.export()                                           # a re-export
        s2 = ctx.import_seq(t2)
        assert s2.read(0, 0, 64) == b"\xee" * 64
        assert s2.read(1, 0, LEN * 64) == pattern(1, LEN * 64)
        with pytest.raises(kvvm.Error):
            ctx.import_seq(b"\0" * 31)
        s2.free()
        s.free()


def test_drop_then_import_fails(kvvmd):
    with kvvm.Context(**pool_config(kvvmd)) as ctx:
        s = ctx.create()
        s.grow(10)
        tok = s.export()
        ctx.handoff_drop(tok)
        with pytest.raises(kvvm.Error) as e:
            ctx.import_seq(tok)
        assert e.value.errno == 2
        s.free()
