"""The small transformer of test_model.py across processes through a real kvvmd: KV that one
process computed is used by another without a copy.

Shared system prompt: a fresh interpreter (this file run as a script) prefills a system prompt
of 3 full blocks and a partial one into a context on the pool, publishes the full blocks and
exits (or is killed with SIGKILL once they are visible). This process then finds them in the
pool (Tier.POOL), attaches them (nothing copied onto the device: bytes_to_device unchanged,
pool_hit_blocks counted), prefills only the rest of the prompt and a user turn, and decodes.
Every step's logits must be torch.equal to those of the same model computing everything itself
with a torch.cat cache (the same chunking: the system prompt in one chunk, cut at the attached
blocks, then the rest, then one token per step).

Prefill/decode hand-off: a fresh interpreter prefills a whole prompt (its last block partial)
in one chunk, exports the sequence (Sequence.export) and exits; this process imports it
(Context.import_seq: the exported length, nothing copied) and decodes, writing into the
imported partial block (copy on write); logits torch.equal to the reference's at every step,
and the K/V read back equal to the reference's bytes.

The kvvmd is real (conftest's fixture: started by the test, waited for by its ready line);
skipped, saying why, without a kvvmd binary or torch.
"""
import os
import signal
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
import kvvm  # noqa: E402
from test_model import (BPT, GRAN, HEAD_DIM, N_KV, N_LAYERS, TOK_PER_PAGE, VOCAB,  # noqa: E402
                        RefCache, TinyModel)

SYS_LEN = 3 * TOK_PER_PAGE + 20                 # 3 full blocks and a partial one
PROMPT_LEN = 2 * TOK_PER_PAGE + 37              # the hand-off's prompt: last block partial
DECODE_STEPS = 12
SEED = 1234
NS = 3


def pool_cfg(path):
    # views need CPU-readable windows (emu_opaque 0, the client's own choice); the page size,
    # granule and device are the daemon's; device_budget 0: the whole pool is our limit
    return dict(backend="emulated", n_regions=2 * N_LAYERS, bytes_per_token=BPT, max_seqs=8,
                max_tokens=512, emu_opaque=0, pool_socket=path, page_size=0, emu_granule=0,
                device_budget=0)


def tokens(seed, n):
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def prefill(ctx, model, toks):
    """A sequence of len(toks) tokens prefilled in one chunk into the context's KVCache."""
    cache = kvvm.KVCache(ctx, N_LAYERS, N_KV, HEAD_DIM, torch.float32)
    seq = ctx.create()
    seq.grow(len(toks))
    model.forward(torch.tensor(toks), 0, lambda li, k, v: cache.update(li, seq, k, v))
    return seq


def child_publish(path, then):
    """The first process: prefill the system prompt, publish its full blocks, make them
    visible (sync), say so; then exit normally, or wait to be killed with SIGKILL."""
    model = TinyModel(SEED, "cpu")
    toks = tokens(7, SYS_LEN)
    ctx = kvvm.Context(**pool_cfg(path))
    seq = prefill(ctx, model, toks)
    keys = ctx.prefix_keys(toks, salt="sys")
    assert ctx.publish(seq, keys, ns=NS) == len(keys) == 3
    ctx.sync()                                  # visible to other clients from here
    assert ctx.pool_info()["shared_entries"] == 3
    print("published", flush=True)
    if then == "kill":
        sys.stdin.read()                        # the test kills us before this returns
        raise SystemExit("not killed")
    seq.free()
    ctx.close()


def child_export(path):
    """The prefill process: prefill the prompt in one chunk, export, print the token, exit."""
    model = TinyModel(SEED, "cpu")
    with kvvm.Context(**pool_cfg(path)) as ctx:
        seq = prefill(ctx, model, tokens(11, PROMPT_LEN))
        tok = seq.export()
        assert ctx.stats()["exports"] == 1
        seq.free()                              # the daemon holds the pages, not we
    print(tok.hex(), flush=True)


def run_child(args):
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(kvvm.__file__)), here,
         os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, os.path.abspath(__file__)] + args, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def decode(model, ctx, seq, ref, last_logits, pos):
    """DECODE_STEPS greedy steps on both caches from pos; logits torch.equal at each."""
    cache = kvvm.KVCache(ctx, N_LAYERS, N_KV, HEAD_DIM, torch.float32)
    logits = last_logits
    for step in range(DECODE_STEPS):
        tok = int(torch.argmax(logits))
        seq.grow(pos + 1)
        got = model.forward(torch.tensor([tok]), pos,
                            lambda li, k, v: cache.update(li, seq, k, v))
        want = model.forward(torch.tensor([tok]), pos, ref.update)
        assert torch.equal(got, want), "decode step %d (position %d): logits differ" % (step,
                                                                                       pos)
        logits = got[-1]
        pos += 1
    for li in range(N_LAYERS):                  # every byte of the cache, the shared ones too
        K, V = cache.keys_values(li, seq)
        assert torch.equal(K, ref.k[li]) and torch.equal(V, ref.v[li]), "layer %d" % li
    return pos


@pytest.mark.parametrize("publisher", ["exits", "kill"])
def test_system_prompt_prefilled_by_another_process_attached_from_the_pool(kvvmd, publisher):
    p = run_child(["publish", kvvmd, publisher])
    try:
        line = p.stdout.readline().strip()
        assert line == "published", "the publishing process failed: %r\n%s" % (
            line, p.stderr.read() if p.poll() is not None or publisher == "exits" else "")
        if publisher == "kill":
            p.send_signal(signal.SIGKILL)
        p.stdin.close()
        rc = p.wait(timeout=120)
        want_rc = -signal.SIGKILL if publisher == "kill" else 0
        assert rc == want_rc, "publisher: rc %s\n%s" % (rc, p.stderr.read())
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdout.close()
        p.stderr.close()

    model = TinyModel(SEED, "cpu")
    toks = tokens(7, SYS_LEN)
    user = tokens(8, 30)
    n = 3 * TOK_PER_PAGE
    rest = toks[n:] + user
    ref = RefCache()                            # computes everything itself, same chunking
    model.forward(torch.tensor(toks), 0, ref.update)
    ref.truncate(n)
    want = model.forward(torch.tensor(rest), n, ref.update)

    with kvvm.Context(**pool_cfg(kvvmd)) as ctx:
        keys = ctx.prefix_keys(toks, salt="sys")
        assert ctx.lookup(keys, ns=NS) == [kvvm.Tier.POOL] * 3
        assert ctx.lookup(keys, ns=NS + 1) == []                  # namespaces isolate
        assert ctx.lookup(ctx.prefix_keys(toks, salt="other"), ns=NS) == []
        before = ctx.stats()
        seq = ctx.create()
        assert ctx.attach(seq, keys, ns=NS) == 3 and seq.length == n
        after = ctx.stats()
        assert after["bytes_to_device"] == before["bytes_to_device"], "the attach copied"
        assert after["pool_hit_blocks"] - before["pool_hit_blocks"] == 3
        seq.grow(n + len(rest))
        cache = kvvm.KVCache(ctx, N_LAYERS, N_KV, HEAD_DIM, torch.float32)
        got = model.forward(torch.tensor(rest), n, lambda li, k, v: cache.update(li, seq, k, v))
        assert torch.equal(got, want), "logits after the pool's KV differ from computing it"
        decode(model, ctx, seq, ref, got[-1], n + len(rest))
        seq.free()
        # the shared entry was never written through: a second attach reads the publisher's
        s2 = ctx.create()
        assert ctx.attach(s2, keys, ns=NS) == 3
        for li in range(N_LAYERS):
            K, V = cache.keys_values(li, s2)
            assert torch.equal(K, ref.k[li][:n]) and torch.equal(V, ref.v[li][:n])
        s2.free()
        assert ctx.drop(keys, ns=NS) == 3


def test_prefill_exports_decode_process_imports(kvvmd):
    p = run_child(["export", kvvmd])
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, "the prefill process failed:\n" + out + err
    token = bytes.fromhex(out.strip().splitlines()[-1])
    assert len(token) == 32

    model = TinyModel(SEED, "cpu")
    prompt = tokens(11, PROMPT_LEN)
    ref = RefCache()
    want = model.forward(torch.tensor(prompt), 0, ref.update)

    with kvvm.Context(**pool_cfg(kvvmd)) as ctx:
        before = ctx.stats()["bytes_to_device"]
        seq = ctx.import_seq(token)
        assert seq.length == PROMPT_LEN
        assert ctx.stats()["bytes_to_device"] == before, "the import copied"
        assert ctx.stats()["imports"] == 1
        with pytest.raises(kvvm.Error) as e:
            ctx.import_seq(token)                                 # spent
        assert e.value.errno == 2
        cache = kvvm.KVCache(ctx, N_LAYERS, N_KV, HEAD_DIM, torch.float32)
        for li in range(N_LAYERS):
            K, V = cache.keys_values(li, seq)
            assert torch.equal(K, ref.k[li]) and torch.equal(V, ref.v[li]), "layer %d" % li
        # decoding writes into the imported partial block first (copy on write)
        decode(model, ctx, seq, ref, want[-1], PROMPT_LEN)
        seq.free()


if __name__ == "__main__":
    torch.set_num_threads(1)
    if sys.argv[1] == "publish":
        child_publish(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "export":
        child_export(sys.argv[2])
    else:
        raise SystemExit("usage: test_pool_model.py publish SOCKET exits|kill | "
                         "export SOCKET")
