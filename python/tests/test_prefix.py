"""The prefix cache from Python: Context.block_tokens, prefix_keys, publish, lookup, attach,
drop and kvvm.Tier (docs/api.md "Prefix cache keyed by content")."""
import hashlib

import pytest

import kvvm
from conftest import GRANULE, small_config

T = GRANULE // 64                       # small_config: bytes_per_token 64, page = granule


def _prompt(lin, n):
    return [lin * 1000 + i for i in range(n)]


def _fill(s, n, lin):
    s.grow(n)
    for r in range(2):
        s.write(r, 0, bytes((lin * 31 + r * 7 + i) % 251 for i in range(n * 64)))


def _same(s, n, lin):
    return all(s.read(r, 0, n * 64) == bytes((lin * 31 + r * 7 + i) % 251
                                              for i in range(n * 64)) for r in range(2))


def test_keys_chain_and_salt():
    with kvvm.Context(**small_config()) as c:
        assert c.block_tokens == T
        k = c.prefix_keys(_prompt(1, 3 * T + 5))
        assert len(k) == 3 and all(len(x) == 32 and x[16:] == bytes(16) for x in k)
        assert c.prefix_keys(_prompt(1, 2 * T)) == k[:2]
        assert c.prefix_keys(_prompt(1, 3 * T), salt="m2")[0] != k[0]
        assert c.prefix_keys(_prompt(1, T - 1)) == []


def test_publish_lookup_attach_drop():
    with kvvm.Context(**small_config()) as c:
        a = c.create()
        _fill(a, 3 * T, 5)
        keys = c.prefix_keys(_prompt(5, 3 * T))
        assert c.publish(a, keys, ns=7) == 3
        assert c.publish(a, keys, ns=7) == 0            # present keys keep their entries
        assert c.lookup(keys, ns=7) == [kvvm.Tier.DEVICE] * 3
        assert c.lookup(keys, ns=8) == []               # namespaces isolate
        a.free()                                        # the entries outlive it
        b = c.create()
        assert c.attach(b, keys + c.prefix_keys(_prompt(6, T)), ns=7) == 3
        assert b.length == 3 * T and _same(b, 3 * T, 5)
        e = c.create()
        e.grow(1)
        with pytest.raises(kvvm.InvalidArgument):
            c.attach(e, keys, ns=7)                     # not empty
        assert c.drop(keys[1:2], ns=7) == 1
        assert len(c.lookup(keys, ns=7)) == 1
        assert c.drop(ns=7) == 2                        # keys[0] and keys[2]
        assert _same(b, 3 * T, 5)                       # sharers keep their pages
        st = c.stats()
        assert st["prefix_entries"] == 0
        assert st["prefix_lookups"] == 4 and st["prefix_hit_blocks"] == 7


def test_engine_keys_are_zero_padded_digests():
    with kvvm.Context(**small_config()) as c:
        a = c.create()
        _fill(a, 2 * T, 3)
        sha = [hashlib.sha256(b"block%d" % i).digest() for i in range(2)]   # vLLM-like
        xx = [(0x1234 + i).to_bytes(8, "little") for i in range(2)]          # nano-vllm-like
        assert c.publish(a, sha, ns=1) == 2
        assert c.publish(a, xx, ns=1) == 2
        assert len(c.lookup(sha, ns=1)) == 2
        assert len(c.lookup([x + bytes(24) for x in xx], ns=1)) == 2
        with pytest.raises(kvvm.InvalidArgument):
            c.lookup([bytes(33)])


def test_host_entries_come_back():
    with kvvm.Context(**small_config(host_budget=16 * GRANULE)) as c:
        a = c.create()
        _fill(a, 2 * T, 9)
        keys = c.prefix_keys(_prompt(9, 2 * T))
        c.publish(a, keys)
        a.swap_out()
        a.free()
        assert c.lookup(keys) == [kvvm.Tier.HOST] * 2
        b = c.create()
        assert c.attach(b, keys) == 2 and _same(b, 2 * T, 9)
        assert c.lookup(keys) == [kvvm.Tier.DEVICE] * 2
