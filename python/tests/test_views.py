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
    assert s.tensor(0, np.bool_, (64,)).dtype == torch.bool
    assert s.tensor(0, torch.bool, (64,)).dtype == torch.bool
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


def test_kvcache_update_stales_every_tensor_it_handed_out(spill_dir):
    """KVCache.update registers each view it returns (a list of weak references pruned as
    it doubles): after many updates, a swap_out empties every one still alive, the ones kept
    since the first call included, and the dead ones do not pile up."""
    with kvvm.Context(**small_config(emu_opaque=0, host_budget=16 * GRANULE)) as c:
        cache = kvvm.KVCache(c, 1, 2, 8, torch.float32)
        s = c.create()
        kept = []
        for n in range(1, 301):
            s.grow(n)
            K, V = cache.update(0, s, torch.full((1, 2, 8), float(n)),
                                torch.full((1, 2, 8), -float(n)))
            if n % 50 == 1:
                kept += [K, V]
        assert len(s._handed) < 300                      # pruned: 600 were handed out
        assert [t.shape[0] for t in kept[::2]] == [1, 51, 101, 151, 201, 251]
        assert torch.equal(K[:, 0, 0], torch.arange(1, 301, dtype=torch.float32))
        c.step()
        s.swap_out()
        assert all(t.numel() == 0 for t in kept) and K.numel() == 0 and V.numel() == 0
        with pytest.raises(kvvm.NotResident):
            cache.update(0, s, torch.zeros(1, 2, 8), torch.zeros(1, 2, 8))
        s.swap_in()
        K, V = cache.keys_values(0, s)                   # the rows are made again
        assert torch.equal(V[:, 0, 0], -torch.arange(1, 301, dtype=torch.float32))


def test_kvcache_update_reads_state_changed_by_c_calls(spill_dir):
    """update asks the library for the length and residency at every call (no state is
    cached in Python): a grow or swap_out made through the C API directly shows at once."""
    with kvvm.Context(**small_config(emu_opaque=0, host_budget=16 * GRANULE)) as c:
        cache = kvvm.KVCache(c, 1, 2, 8, torch.float32)
        s = c.create()
        s.grow(4)
        cache.update(0, s, torch.ones(4, 2, 8), torch.ones(4, 2, 8))
        assert kvvm._lib.lib.kvvm_seq_grow(c._kv, s.handle, 9) == 0
        K, V = cache.update(0, s, torch.full((5, 2, 8), 2.0), torch.full((5, 2, 8), 3.0))
        assert K.shape == (9, 2, 8) and torch.equal(K[4:], torch.full((5, 2, 8), 2.0))
        c.step()
        assert kvvm._lib.lib.kvvm_seq_swap_out(c._kv, s.handle) == 0
        with pytest.raises(kvvm.NotResident):
            cache.keys_values(0, s)
        assert kvvm._lib.lib.kvvm_seq_free(c._kv, s.handle) == 0
        with pytest.raises(kvvm.InvalidHandle):
            cache.keys_values(0, s)


def test_kvcache_update_gpu_fast_path(spill_dir):
    """On a GPU the fast path asks kvvm_seq_info (no readiness: the stream orders the
    copies); run here by marking an emulated context as CUDA for that path alone."""
    with kvvm.Context(**small_config(emu_opaque=0, host_budget=16 * GRANULE)) as c:
        c._cuda = True
        cache = kvvm.KVCache(c, 1, 2, 8, torch.float32)
        s = c.create()
        s.grow(5)
        k = torch.randn(5, 2, 8)
        K, V = cache.update(0, s, k, -k)
        assert torch.equal(K, k) and torch.equal(V, -k)
        assert kvvm._lib.lib.kvvm_seq_grow(c._kv, s.handle, 6) == 0
        K, V = cache.update(0, s, torch.ones(1, 2, 8), torch.ones(1, 2, 8))
        assert K.shape == (6, 2, 8) and (K[5] == 1).all()
        c.step()
        assert kvvm._lib.lib.kvvm_seq_swap_out(c._kv, s.handle) == 0
        with pytest.raises(kvvm.NotResident):
            cache.update(0, s, torch.ones(1, 2, 8), torch.ones(1, 2, 8))


def test_kvcache_update_of_a_fork_writes_its_own_copy(vctx):
    """Parent and child each have their own cached rows at their own addresses: a token
    the child appends through update does not show in the parent, and the shared tokens
    read the same through both."""
    cache = kvvm.KVCache(vctx, 1, 2, 8, torch.float32)
    p = vctx.create()
    p.grow(70)                                           # 64 tokens a page: 2 pages
    k = torch.randn(70, 2, 8)
    cache.update(0, p, k, -k)
    ch = p.fork()
    ch.grow(71)
    p.grow(71)
    Kc, Vc = cache.update(0, ch, torch.ones(1, 2, 8), torch.ones(1, 2, 8))
    Kp, Vp = cache.update(0, p, torch.zeros(1, 2, 8), torch.zeros(1, 2, 8))
    assert torch.equal(Kc[:70], k) and torch.equal(Kp[:70], k) and torch.equal(Vc[:70], -k)
    assert (Kc[70] == 1).all() and (Kp[70] == 0).all() and (Vp[70] == 0).all()


def test_kvcache_refuses_other_layouts(vctx):
    with pytest.raises(kvvm.InvalidArgument, match="n_regions"):
        kvvm.KVCache(vctx, 2, 2, 8, torch.float32)
    with pytest.raises(kvvm.InvalidArgument, match="bytes_per_token"):
        kvvm.KVCache(vctx, 1, 4, 8, torch.float32)


def test_cuda_view_producer_without_a_gpu():
    """The CUDA path without a GPU: the View hands consumers the CUDA array interface
    (address, shape, strides, typestr, version 3, the engine stream), no array interface,
    and a DLPack capsule on kDLCUDA of its device, with strides in elements and bfloat16 as
    kDLBfloat; a consumer on another stream is made to wait, one on the engine stream not."""
    from kvvm import _views
    waited = []
    v = _views.View("owner", 0x7f0000000000, (4, 10, 2, 8), (40960, 32, 16, 2),
                    _views.element_info(torch.bfloat16)[1], torch.bfloat16, cuda=True,
                    device=1, stream=0x1234, on_consume=waited.append)
    cai = v.__cuda_array_interface__
    assert cai["data"] == (0x7f0000000000, False) and cai["version"] == 3
    assert cai["shape"] == (4, 10, 2, 8) and cai["strides"] == (40960, 32, 16, 2)
    assert cai["typestr"] == "<i2" and cai["stream"] == 0x1234
    assert not hasattr(v, "__array_interface__")
    assert v.__dlpack_device__() == (_views.KDL_CUDA, 1)
    live = len(_views._LIVE)
    cap = v.__dlpack__(stream=0x1234)
    assert waited == []                                   # the engine stream itself
    m = _views.capsule_tensor(cap)
    t = m.dl_tensor
    assert t.data == 0x7f0000000000 and t.ndim == 4 and t.byte_offset == 0
    assert (t.device.device_type, t.device.device_id) == (_views.KDL_CUDA, 1)
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (4, 16, 1)
    assert [t.shape[i] for i in range(4)] == [4, 10, 2, 8]
    assert [t.strides[i] for i in range(4)] == [20480, 16, 8, 1]
    assert len(_views._LIVE) == live + 1
    del cap, m, t                       # never consumed: the capsule's destructor frees it
    gc.collect()
    assert len(_views._LIVE) == live
    v.__dlpack__(stream=1)              # the legacy stream: ordered after our copies
    v.__dlpack__(stream=-1)             # -1: the consumer wants no ordering
    assert waited == [1]
    gc.collect()
    assert len(_views._LIVE) == live


def test_emulated_view_is_dlpack_on_cpu(vctx):
    """Sequence.view: a DLPack producer on kDLCPU that torch and numpy import without a copy,
    over tokens [0, length)."""
    from kvvm import _views
    s = vctx.create()
    s.grow(6)
    v = s.view(1, torch.float32, (16,))
    assert v.__dlpack_device__() == (_views.KDL_CPU, 0)
    assert v.shape == (6, 16) and v.addr == s.addr(1)
    t = torch.from_dlpack(v)
    assert t.device.type == "cpu" and t.shape == (6, 16) and t.data_ptr() == s.addr(1)
    t[:] = 1.5
    assert s.read(1, 0, 6 * BPT) == np.full((6, 16), 1.5, np.float32).tobytes()
    if hasattr(np, "from_dlpack"):
        a = np.from_dlpack(s.view(1, np.float32, (16,)))
        assert a.ctypes.data == s.addr(1) and (a == 1.5).all()
    assert (np.asarray(v) == 1.5).all()                  # the array interface as well
    b = torch.from_dlpack(s.view(0, torch.bfloat16, (32,)))
    assert b.dtype == torch.bfloat16 and b.shape == (6, 32)
    live = len(_views._LIVE)
    del t, b
    gc.collect()
    assert len(_views._LIVE) < live, "the consumer's deleter must release the capsule"


def test_view_is_based_on_the_sequence_address(vctx):
    """Bug: views were slices of a view over the region base (slot 0), so the memory torch
    was handed started at slot 0 — PyTorch versions that infer the device with
    cudaPointerGetAttributes fail when slot 0 is unmapped. Each view's memory now starts at
    the sequence's own address."""
    seqs = [vctx.create() for _ in range(3)]
    s = seqs[2]
    for x in seqs[:2]:
        x.free()                                          # slots 0 and 1: nothing mapped
    s.grow(4)
    assert s.slot == 2
    for r in range(2):
        t = s.tensor(r, torch.float32, (16,))
        assert t.data_ptr() == s.addr(r)
        assert t.storage().data_ptr() == s.addr(r), "the view's memory starts elsewhere"
        assert s.view(r, torch.float32, (16,)).addr == s.addr(r)


class _TorchLikeStream:
    def __init__(self, h):
        self.cuda_stream = h


def test_default_stream_is_the_legacy_stream(vctx, monkeypatch):
    """Bug: PyTorch's default stream (handle 0) was passed as NULL, i.e. synchronous mode
    (a cuCtxSynchronize at every free of a used sequence); it is CU_STREAM_LEGACY (0x1)."""
    from kvvm import _core
    seen = []
    real = _core.L.kvvm_set_stream

    def spy(kv, stream):
        seen.append(stream.value)
        return real(kv, stream)
    spy.__name__ = "kvvm_set_stream"
    monkeypatch.setattr(_core.L, "kvvm_set_stream", spy)
    vctx.set_stream(_TorchLikeStream(0))
    assert seen[-1] == 1 and vctx.stream == 1
    vctx.set_stream(None)
    assert seen[-1] is None and vctx.stream == 0
    vctx.set_stream(0)
    assert seen[-1] == 1
    s = vctx.create()                    # stream mode on the legacy stream works
    s.grow(3)
    s.write(0, 0, b"\x07" * BPT)
    vctx.sync()
    assert s.read(0, 0, BPT) == b"\x07" * BPT
    s.wait_stream(_TorchLikeStream(0))
    vctx.set_stream(None)


def test_stale_views_are_refused(spill_dir):
    """Bug: a view made before a swap-out, free or close still aliased the old addresses
    (SIGSEGV on the emulated device, an illegal address that kills the CUDA context on a
    GPU). Tensors handed out are emptied in place, View objects refuse, new views of a
    swapped-out sequence are refused."""
    with kvvm.Context(**small_config(emu_opaque=0, host_budget=16 * GRANULE)) as c:
        s = c.create()
        s.grow(20)
        t = s.tensor(0, torch.float32, (16,))
        t[:] = 4.0
        v = s.view(0, torch.float32, (16,))
        cache = kvvm.KVCache(c, 1, 2, 8, torch.float32)
        K, V = cache.keys_values(0, s)
        c.step()
        s.swap_out()
        assert t.numel() == 0 and K.numel() == 0 and V.numel() == 0
        with pytest.raises(kvvm.InvalidHandle, match="stale"):
            torch.from_dlpack(v)
        with pytest.raises(kvvm.InvalidHandle, match="stale"):
            np.asarray(v)
        with pytest.raises(kvvm.NotResident):
            s.view(0, torch.float32, (16,))
        s.swap_in()
        t2 = s.tensor(0, torch.float32, (16,))
        assert (t2 == 4.0).all()                          # a new view after swap_in
        s.truncate(5)
        assert t2.numel() == 0
        t3 = s.tensor(1, torch.float32, (16,))
        v3 = s.view(1, torch.float32, (16,))
        s.free()
        assert t3.numel() == 0
        with pytest.raises(kvvm.InvalidHandle, match="freed"):
            v3.__dlpack__()
        s2 = c.create()
        s2.grow(2)
        t4 = s2.tensor(0, torch.float32, (16,))
        R = c.region_tensor(0, torch.float32, (16,))
        v4 = s2.view(0, torch.float32, (16,))
    assert t4.numel() == 0 and R.numel() == 0             # close empties everything
    with pytest.raises(kvvm.InvalidHandle, match="closed"):
        v4.__dlpack__()


def test_step_under_auto_swap_makes_views_stale():
    """Under auto_swap, reclaim may move any unpinned sequence after a step: their views are
    stale then (a pinned sequence's stay); a shrink by set_budget stales what it moved."""
    cfg = small_config(emu_opaque=0, host_budget=32 * GRANULE, flags="auto_swap")
    with kvvm.Context(**cfg) as c:
        a, p = c.create(), c.create()
        a.grow(8)
        p.grow(8)
        p.set_class("pinned")
        ta, tp = a.tensor(0, torch.float32, (16,)), p.tensor(0, torch.float32, (16,))
        c.step()
        assert ta.numel() == 0 and tp.numel() == 8 * 16
    with kvvm.Context(**small_config(emu_opaque=0, host_budget=32 * GRANULE)) as c:
        a, b = c.create(), c.create()
        a.grow(1024)                                      # 32 pages
        b.grow(900)                                       # 30 pages
        ta, tb = a.tensor(0, torch.float32, (16,)), b.tensor(0, torch.float32, (16,))
        c.step()
        c.step()
        b.grow(960)                                       # b used since: protected
        c.set_budget(40 * GRANULE)
        assert not a.info.resident and b.info.resident
        assert ta.numel() == 0 and tb.numel() == 900 * 16
