"""The daemon's shared prefix index from Python, across processes through a real kvvmd:
a fresh interpreter publishes a prompt's blocks and exits; this one finds them in the pool
(Tier.POOL), attaches them with nothing copied (bytes_to_device unchanged, pool_hit_blocks
counted) and its writes copy on write."""
import os
import subprocess
import sys

import kvvm
from conftest import small_config

T = 64                        # tokens per 4 KiB block (64 B each)
NB = 3


def pool_config(path, **over):
    cfg = small_config(pool_socket=path, page_size=0, emu_granule=0, device_budget=0)
    cfg.update(over)
    return cfg


def pattern(region, n):
    return bytes((region * 31 + i * 7 + i // 4096 + 5) & 0xff for i in range(n))


PUBLISHER = r"""
import sys, kvvm
sys.path.insert(0, sys.argv[2])
from test_prefix_pool import pool_config, pattern, T, NB
with kvvm.Context(**pool_config(sys.argv[1])) as ctx:
    s = ctx.create()
    s.grow(NB * T)
    for r in range(2):
        s.write(r, 0, pattern(r, NB * T * 64))
    keys = ctx.prefix_keys(list(range(NB * T)), salt="sys")
    assert ctx.publish(s, keys, ns=4) == NB
    s.free()
print("published")
"""


def test_publish_in_a_fresh_interpreter_attach_here(kvvmd):
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(here), here, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", PUBLISHER, kvvmd, here], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    with kvvm.Context(**pool_config(kvvmd)) as ctx:
        keys = ctx.prefix_keys(list(range(NB * T)), salt="sys")
        assert ctx.lookup(keys, ns=4) == [kvvm.Tier.POOL] * NB
        assert ctx.lookup(keys, ns=5) == []                       # namespaces isolate
        before = ctx.stats()["bytes_to_device"]
        s = ctx.create()
        assert ctx.attach(s, keys, ns=4) == NB
        assert ctx.stats()["bytes_to_device"] == before           # no copy
        assert ctx.stats()["pool_hit_blocks"] == NB
        for r in range(2):
            assert s.read(r, 0, NB * T * 64) == pattern(r, NB * T * 64)
        s.write(0, 0, b"\xee" * 64)                               # copy on write here
        assert s.read(0, 0, 64) == b"\xee" * 64
        s.free()
        info = ctx.pool_info()
        assert info["shared_entries"] == NB
        assert ctx.drop(keys, ns=4) == NB                         # local and the daemon's
        assert ctx.pool_info()["shared_entries"] == 0
