"""A second process reuses the first's system-prompt KV from the shared store (Redis).

The first process (a fresh interpreter: this file run as a script) prefills a system prompt
of 3 full blocks and a partial one with the tiny model of test_model.py into a libkvvm
context opened with store_url, publishes the full blocks (Context.publish: the library
writes them through to Redis) and closes (which waits for the writes). This process then
opens its own context on the same store: lookup says the blocks are in the store, attach
brings them to the device, and only the rest of the prompt and a user turn are prefilled.
Its logits must be torch.equal to those of the same model computing everything itself with
a torch.cat cache (the same chunking: the system prompt in one chunk, cut at the attached
blocks, then the rest). Skipped, with the reason, where redis-server is not installed
(scripts/install-deps.sh installs it).
"""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import kvvm  # noqa: E402
from test_model import (BPT, GRAN, HEAD_DIM, N_KV, N_LAYERS, TOK_PER_PAGE, VOCAB,  # noqa: E402
                        RefCache, TinyModel)

from conftest import redis_server  # noqa: E402

PASS = "kvvm-py-pw"
SYS_LEN = 3 * TOK_PER_PAGE + 20                 # 3 full blocks and a partial one
CFG = dict(backend="emulated", n_regions=2 * N_LAYERS, bytes_per_token=BPT, max_seqs=8,
           max_tokens=512, emu_granule=GRAN, emu_opaque=0, device_budget=128 * GRAN,
           store_timeout_ms=5000)


def sys_tokens():
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, VOCAB, (SYS_LEN,), generator=g).tolist()


def publish(url):
    """The first process: prefill the system prompt in one chunk, publish its full blocks."""
    model = TinyModel(1234, "cpu")
    toks = sys_tokens()
    with kvvm.Context(store_url=url, **CFG) as ctx:
        cache = kvvm.KVCache(ctx, N_LAYERS, N_KV, HEAD_DIM, torch.float32)
        seq = ctx.create()
        seq.grow(SYS_LEN)
        model.forward(torch.tensor(toks), 0, lambda li, k, v: cache.update(li, seq, k, v))
        keys = ctx.prefix_keys(toks)
        assert ctx.publish(seq, keys) == len(keys) == 3
        ctx.sync()                              # the store writes are done
        st = ctx.stats()
        assert st["store_puts"] == 3 and st["store_errors"] == 0, st


@pytest.fixture
def redis_url(tmp_path):
    with redis_server(tmp_path, PASS) as port:
        yield "redis://:%s@127.0.0.1:%d" % (PASS, port)


def test_second_process_reuses_system_prompt_from_redis(redis_url):
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(kvvm.__file__)), here,
         os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, os.path.abspath(__file__), redis_url], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, "the publishing process failed:\n" + r.stdout + r.stderr

    model = TinyModel(1234, "cpu")
    toks = sys_tokens()
    user = torch.randint(0, VOCAB, (30,), generator=torch.Generator().manual_seed(8)).tolist()
    n = 3 * TOK_PER_PAGE
    rest = toks[n:] + user
    # the reference computes everything itself: the system prompt in one chunk, cut at the
    # attached blocks, then the rest
    ref = RefCache()
    model.forward(torch.tensor(toks), 0, ref.update)
    ref.truncate(n)
    want = model.forward(torch.tensor(rest), n, ref.update)

    with kvvm.Context(store_url=redis_url, **CFG) as ctx:
        keys = ctx.prefix_keys(toks)
        assert list(ctx.lookup(keys)) == [kvvm.Tier.STORE] * 3
        cache = kvvm.KVCache(ctx, N_LAYERS, N_KV, HEAD_DIM, torch.float32)
        seq = ctx.create()
        assert ctx.attach(seq, keys) == 3 and seq.length == n
        seq.grow(n + len(rest))
        got = model.forward(torch.tensor(rest), n, lambda li, k, v: cache.update(li, seq, k, v))
        assert torch.equal(got, want), "logits after the store's KV differ from computing it"
        for li in range(N_LAYERS):
            K, V = cache.keys_values(li, seq)
            assert torch.equal(K, ref.k[li]) and torch.equal(V, ref.v[li]), "layer %d" % li
        st = ctx.stats()
        assert st["store_gets"] == 3 and st["store_errors"] == 0, st
        assert list(ctx.lookup(keys)) == [kvvm.Tier.DEVICE] * 3   # now local entries


if __name__ == "__main__":
    publish(sys.argv[1])
