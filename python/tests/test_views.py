"""Zero-copy views: they alias the bytes read/write move, follow the sequence's slot, are
refused in opaque mode and for a swapped-out sequence, and keep their context alive."""
import gc

import numpy as np
import pytest

import kvvm
from conftest import GRANULE, small_config

torch = pytest.importorskip("torch")
BPT = 64


def test_tensor_aliases_read_and_write(vctx):
    s = vctx.create()
    s.grow(10)
    t = s.tensor(0, torch.float32, (2, 8))
    assert t.shape == (10, 2, 8) and t.is_contiguous() and t.device.type == "cpu"
    assert t.data_ptr() == s.addr(0)
    t[:] = torch.arange(160, dtype=torch.float32).view(10, 2, 8)
    assert s.read(0, 0, 10 * BPT) == t.numpy().tobytes()
    s.write(1, 3 * BPT, np.full(16, 2.5, np.float32))
    v = s.tensor(1, torch.float32, (16,))
    assert (v[3] == 2.5).all() and v.shape == (10, 16)
    a = s.array(0, np.float32, (2, 8))
    assert isinstance(a, np.ndarray) and a.shape == (10, 2, 8)
    assert np.array_equal(a, t.numpy())
    a[9, 1, 7] = -1
    assert t[9, 1, 7] == -1                          # the same memory


def test_dtypes_and_shape_checks(vctx):
    s = vctx.create()
    s.grow(3)
    assert s.tensor(0, torch.bfloat16, (4, 8)).dtype == torch.bfloat16
    assert s.tensor(0, torch.float16, 32).shape == (3, 32)
    assert s.tensor(0, np.int8, (64,)).dtype == torch.int8
    assert s.array(0, "u1", (8, 8)).dtype == np.uint8
    with pytest.raises(kvvm.InvalidArgument, match="bytes_per_token"):
        s.tensor(0, torch.float32, (2, 4))
    with pytest.raises(kvvm.InvalidArgument, match="region"):
        s.tensor(2, torch.float32, (16,))


def test_view_follows_length(vctx):
    s = vctx.create()
    assert s.tensor(0, torch.float32, (16,)).shape == (0, 16)
    s.grow(70)
    assert s.tensor(0, torch.float32, (16,)).shape == (70, 16)
    s.truncate(5)
    assert s.tensor(0, torch.float32, (16,)).shape == (5, 16)


def test_region_tensor_indexed_by_slot(vctx):
    a, b = vctx.create(), vctx.create()
    a.grow(5)
    b.grow(7)
    R = vctx.region_tensor(1, torch.float32, (16,))
    assert R.shape == (vctx.max_seqs, vctx.max_tokens, 16)
    assert R.stride()[0] * 4 == vctx.slot_bytes
    assert R.data_ptr() == vctx.region_base(1)
    R[b.slot, :7] = 3.0
    assert torch.equal(b.tensor(1, torch.float32, (16,)), R[b.slot, :7])
    assert (b.tensor(1, torch.float32, (16,)) == 3.0).all()
    assert vctx.region_tensor(1, torch.float32, (16,)) is R            # cached
    A = vctx.region_array(0, np.float32, (16,))
    assert A.shape == (vctx.max_seqs, vctx.max_tokens, 16)
    assert A.ctypes.data == vctx.region_base(0)


def test_fork_view_writes_copy_on_write(vctx):
    p = vctx.create()
    p.grow(10)
    p.tensor(0, torch.float32, (16,))[:] = 1.0
    c = p.fork()
    c.grow(11)                                   # the new token's page is copied first
    ct = c.tensor(0, torch.float32, (16,))
    ct[10] = 9.0
    c.prepare_write(0, 1)                        # before rewriting an old, shared token
    ct[0] = 5.0
    pt = p.tensor(0, torch.float32, (16,))
    assert (pt == 1.0).all()
    assert (c.tensor(0, torch.float32, (16,))[0] == 5.0).all()


def test_opaque_mode_refuses_views(ctx):
    s = ctx.create()
    s.grow(4)
    for f in (lambda: s.tensor(0, torch.float32, (16,)), lambda: s.array(0, "f4", (16,)),
              lambda: ctx.region_tensor(0, torch.float32, (16,)),
              lambda: ctx.region_array(0, "f4", (16,))):
        with pytest.raises(kvvm.NotSupported, match="opaque"):
            f()
    s.write(0, 0, b"\x01" * BPT)                  # copies still work
    assert s.read(0, 0, BPT) == b"\x01" * BPT


def test_swapped_out_view_is_refused(spill_dir):
    with kvvm.Context(**small_config(emu_opaque=0, host_budget=16 * GRANULE)) as c:
        s = c.create()
        s.grow(20)
        s.tensor(0, torch.float32, (16,))[:] = 4.0
        c.step()
        s.swap_out()
        for f in (lambda: s.tensor(0, torch.float32, (16,)), lambda: s.array(1, "f4", (16,))):
            with pytest.raises(kvvm.NotResident, match="swapped out"):
                f()
        cache = kvvm.KVCache(c, 1, 2, 8, torch.float32)
        with pytest.raises(kvvm.NotResident):
            cache.update(0, s, torch.zeros(1, 2, 8), torch.zeros(1, 2, 8))
        s.swap_in()
        assert (s.tensor(0, torch.float32, (16,)) == 4.0).all()


def test_view_keeps_context_alive():
    c = kvvm.Context(**small_config(emu_opaque=0))
    s = c.create()
    s.grow(3)
    t = s.tensor(0, torch.float32, (16,))
    t[:] = 7.0
    del c, s
    gc.collect()
    assert (t == 7.0).all()                      # no SIGSEGV: the context is still open
    del t
    gc.collect()


def test_kvcache_update(vctx):
    cache = kvvm.KVCache(vctx, 1, 2, 8, torch.float32)
    s = vctx.create()
    s.grow(3)
    k = torch.randn(3, 2, 8)
    v = torch.randn(3, 2, 8)
    K, V = cache.update(0, s, k, v)
    assert torch.equal(K, k) and torch.equal(V, v)
    s.grow(4)
    k1, v1 = torch.randn(1, 2, 8), torch.randn(1, 2, 8)
    K, V = cache.update(0, s, k1, v1)
    assert torch.equal(K, torch.cat([k, k1])) and torch.equal(V, torch.cat([v, v1]))
    assert s.read(0, 0, 4 * BPT) == torch.cat([k, k1]).numpy().tobytes()
    assert cache.get_seq_length(s) == 4
    Kk, Vv = cache.keys_values(0, s)
    assert torch.equal(Kk, K)
    with pytest.raises(kvvm.InvalidArgument, match="must both be"):
        cache.update(0, s, torch.zeros(1, 2, 4), torch.zeros(1, 2, 4))
    with pytest.raises(kvvm.InvalidArgument, match="grow it first"):
        cache.update(0, s, torch.zeros(5, 2, 8), torch.zeros(5, 2, 8))
    with pytest.raises(kvvm.InvalidArgument, match="layer"):
        cache.update(1, s, k1, v1)
    np_cache = kvvm.KVCache(vctx, 1, 2, 8, np.float32)
    Kn, _ = np_cache.update(0, s, np.ones((1, 2, 8), np.float32), np.ones((1, 2, 8), np.float32))
    assert isinstance(Kn, np.ndarray) and (Kn[3] == 1).all()


def test_regress_kvcache_view_after_discard_started_at_token_0(vctx):
    """Bug: after seq.discard, KVCache.update returned views over [0, length) whose first
    pages were unmapped: touching K[0] killed the process (SIGSEGV). The views now start
    at first_kept."""
    cache = kvvm.KVCache(vctx, 1, 2, 8, torch.float32)
    s = vctx.create()
    s.grow(200)                                   # 64 tokens a page: pages 0..3
    k, v = torch.randn(200, 2, 8), torch.randn(200, 2, 8)
    cache.update(0, s, k, v)
    vctx.step()
    s.discard(130)                                # pages 0 and 1 go, tokens 128, 129 too
    vctx.step()
    s.grow(201)
    k1, v1 = torch.randn(1, 2, 8), torch.randn(1, 2, 8)
    K, V = cache.update(0, s, k1, v1)
    assert K.shape == (71, 2, 8) and V.shape == (71, 2, 8)
    assert torch.equal(K[0], k[130]) and torch.equal(V[0], v[130])      # K[0] is token 130
    assert torch.equal(K, torch.cat([k[130:], k1])) and torch.equal(V, torch.cat([v[130:], v1]))
    Kk, Vv = cache.keys_values(0, s)
    assert torch.equal(Kk, K) and torch.equal(Vv, V)
    with pytest.raises(kvvm.InvalidArgument, match="first_kept 130"):
        cache.update(0, s, torch.zeros(72, 2, 8), torch.zeros(72, 2, 8))


def test_kvcache_refuses_other_layouts(vctx):
    with pytest.raises(kvvm.InvalidArgument, match="n_regions"):
        kvvm.KVCache(vctx, 2, 2, 8, torch.float32)
    with pytest.raises(kvvm.InvalidArgument, match="bytes_per_token"):
        kvvm.KVCache(vctx, 1, 4, 8, torch.float32)


def test_cuda_view_hands_torch_the_array_interface(monkeypatch):
    """The CUDA path without a GPU: what torch.as_tensor receives (address, shape, strides,
    typestr, version 3, the engine stream) and the device it is asked for."""
    from kvvm import _views
    seen = {}

    def fake_as_tensor(obj, device=None):
        seen["cai"] = dict(obj.__cuda_array_interface__)
        seen["device"] = device
        seen["has_array_interface"] = hasattr(obj, "__array_interface__")
        return torch.zeros(obj.__cuda_array_interface__["shape"], dtype=torch.int16)

    monkeypatch.setattr(torch, "as_tensor", fake_as_tensor)
    t = _views.torch_cuda_view("owner", 0x7f0000000000, (4, 10, 2, 8), (40960, 32, 16, 2),
                               _views.element_info(torch.bfloat16)[1], torch.bfloat16, True,
                               1, 0x1234)
    cai = seen["cai"]
    assert cai["data"] == (0x7f0000000000, False) and cai["version"] == 3
    assert cai["shape"] == (4, 10, 2, 8) and cai["strides"] == (40960, 32, 16, 2)
    assert cai["typestr"] == "<i2" and cai["stream"] == 0x1234
    assert seen["device"] == torch.device("cuda", 1) and not seen["has_array_interface"]
    assert t.dtype == torch.bfloat16                      # reinterpreted after the view
    _views.torch_cuda_view("o", 4096, (1, 16), (64, 4), _views.element_info(torch.float32)[1],
                           torch.float32, False, 0, None)
    assert seen["cai"]["stream"] is None and seen["cai"]["typestr"] == "<f4"
