"""Every call of kvvm.Context and kvvm.Sequence, on an opaque-mode emulated device (the
binding never needs to read device memory for these)."""
import ctypes
import errno

import numpy as np
import pytest

import kvvm
from kvvm import _lib
from conftest import GRANULE, small_config

BPT = 64


def test_config_struct_matches_the_header():
    buf = ctypes.create_string_buffer(_lib.CONFIG_BUF_BYTES)
    _lib.lib.kvvm_config_init(buf)
    cfg = _lib.Config.from_buffer(buf)
    assert cfg.size >= ctypes.sizeof(_lib.Config)
    # kvvm_config_init's documented defaults land on the right fields
    assert (cfg.n_regions, cfg.bytes_per_token, cfg.max_seqs, cfg.max_tokens) == \
        (1, 4096, 64, 4096)
    assert cfg.spill_budget == 1 << 30 and cfg.spill_dir is None
    assert (cfg.device_min, cfg.device_low, cfg.device_high) == (0.05, 0.10, 0.20)


def test_every_config_field_round_trips(spill_dir):
    want = dict(backend="emulated", device=0, n_regions=3, bytes_per_token=96, max_seqs=5,
                max_tokens=700, page_size=2 * GRANULE, device_budget=60 * GRANULE,
                host_budget=20 * GRANULE, spill_dir=spill_dir, spill_budget=64 * GRANULE,
                device_min=0.01, device_low=0.02, device_high=0.03, host_min=0.04,
                host_low=0.05, host_high=0.06, flags=kvvm.F_SCRUB, emu_device_bytes=80 * GRANULE,
                emu_granule=GRANULE, map_ahead=2, emu_opaque=1, pool_thread=1, pool_low=3,
                pool_high=7, pool_decay_ms=250)
    with kvvm.Context(**want) as c:
        eff = c.config
        for k, v in want.items():
            assert eff[k] == pytest.approx(v) if isinstance(v, float) else eff[k] == v, k
        assert c.n_regions == 3 and c.bytes_per_token == 96 and c.page_size == 2 * GRANULE
        assert c.backend == "emulated" and c.opaque


def test_config_sizes_flags_and_unknown_fields():
    with kvvm.Context(**small_config(device_budget="256K", flags="auto_swap,scrub")) as c:
        assert c.config["device_budget"] == 256 << 10
        assert c.config["flags"] == kvvm.F_AUTO_SWAP | kvvm.F_SCRUB
    with pytest.raises(TypeError, match="no_such_field"):
        kvvm.Context(no_such_field=1)
    with pytest.raises(kvvm.InvalidArgument, match="backend"):
        kvvm.Context(backend="tpu")
    with pytest.raises(kvvm.InvalidArgument, match="unknown flag"):
        kvvm.Context(flags="auto_swap,bogus")


def test_store_url_and_timeout(tmp_path):
    url = "file://" + str(tmp_path)
    with kvvm.Context(**small_config(store_url=url, store_timeout_ms=250)) as c:
        assert c.config["store_url"] == url and c.config["store_timeout_ms"] == 250
    with kvvm.Context(**small_config(store_url="redis://:secret@127.0.0.1:1")) as c:
        assert c.config["store_url"] == "redis://:***@127.0.0.1:1"   # down: not an error
    with pytest.raises(kvvm.InvalidArgument):
        kvvm.Context(**small_config(store_url="redis://h:1?x"))
    # a cluster's seeds, all down: not an error; its password hidden; a /db refused
    url = "redis-cluster://:secret@127.0.0.1:1,127.0.0.1:2"
    with kvvm.Context(**small_config(store_url=url, store_timeout_ms=250)) as c:
        assert c.config["store_url"] == "redis-cluster://:***@127.0.0.1:1,127.0.0.1:2"
    with pytest.raises(kvvm.InvalidArgument):
        kvvm.Context(**small_config(store_url="redis-cluster://127.0.0.1:1/0"))


def test_environment_defaults_apply(monkeypatch):
    monkeypatch.setenv("KVVM_MAX_SEQS", "7")
    with kvvm.Context(**{k: v for k, v in small_config().items() if k != "max_seqs"}) as c:
        assert c.max_seqs == 7
    with kvvm.Context(**small_config(max_seqs=3)) as c:        # the keyword wins
        assert c.max_seqs == 3


def test_context_manager_and_close():
    c = kvvm.Context(**small_config())
    s = c.create()
    with c:
        assert not c.closed
    assert c.closed
    c.close()                                   # twice: a no-op
    with pytest.raises(kvvm.InvalidHandle, match="closed"):
        c.create()
    with pytest.raises(kvvm.InvalidHandle, match="closed"):
        c.stats()
    with pytest.raises(kvvm.InvalidHandle):
        s.grow(1)
    assert "closed" in repr(c)


def test_create_free_and_freed_handles(ctx):
    s = ctx.create()
    assert s.length == 0 and 0 <= s.slot < ctx.max_seqs
    assert s in ctx.sequences
    s.free()
    assert s.freed and s not in ctx.sequences
    with pytest.raises(kvvm.InvalidHandle, match="freed"):
        s.free()
    for call in (lambda: s.grow(1), lambda: s.length, lambda: s.info, lambda: s.fork(),
                 lambda: s.read(0, 0, 1), lambda: s.swap_out(), lambda: s.need(1)):
        with pytest.raises(kvvm.InvalidHandle):
            call()
    with ctx.create() as t:
        t.grow(3)
    assert t.freed


def test_no_slot(ctx):
    seqs = [ctx.create() for _ in range(ctx.max_seqs)]
    with pytest.raises(kvvm.NoSlot) as e:
        ctx.create()
    assert e.value.errno == errno.ENOSPC and e.value.function == "kvvm_seq_create"
    seqs[0].free()
    ctx.create()


def test_grow_truncate_length_info(ctx):
    s = ctx.create()
    s.grow(100)
    i = s.info
    assert i.length == 100 == s.length and i.resident and i.slot == s.slot
    assert i.pages_device == 2 * 2                # 100 tokens * 64 B in 4 KiB pages, 2 regions
    with pytest.raises(kvvm.InvalidArgument):
        s.grow(50)                                # shorter
    with pytest.raises(kvvm.TooBig) as e:
        s.grow(ctx.max_tokens + 1)
    assert e.value.errno == errno.E2BIG
    assert s.length == 100                        # a failed call changes nothing
    s.truncate(10)
    assert s.length == 10 and s.info.pages_device == 2
    with pytest.raises(kvvm.InvalidArgument):
        s.truncate(11)


def test_grow_batch_all_or_nothing(ctx):
    a, b = ctx.create(), ctx.create()
    ctx.grow_batch([a, b], [10, 20])
    assert (a.length, b.length) == (10, 20)
    with pytest.raises(kvvm.TooBig):
        ctx.grow_batch([a, b], [30, ctx.max_tokens + 1])
    assert (a.length, b.length) == (10, 20)
    with pytest.raises(kvvm.InvalidArgument):
        ctx.grow_batch([a, a], [30, 40])
    with pytest.raises(kvvm.InvalidArgument):
        ctx.grow_batch([a], [1, 2])
    ctx.grow_batch([], [])


def _fill(seq, region, first, n, value):
    seq.write(region, first * BPT, bytes([value]) * (n * BPT))


def test_write_read_buffers(ctx):
    torch = pytest.importorskip("torch")
    s = ctx.create()
    s.grow(8)
    s.write(0, 0, b"\x01" * BPT)
    s.write(0, BPT, bytearray(b"\x02" * BPT))
    s.write(0, 2 * BPT, memoryview(b"\x03" * BPT))
    s.write(0, 3 * BPT, np.full(BPT // 4, 7, np.float32))
    s.write(1, 0, torch.arange(16, dtype=torch.float32))
    assert s.read(0, 0, BPT) == b"\x01" * BPT
    assert s.read(0, BPT, 2 * BPT) == b"\x02" * BPT + b"\x03" * BPT
    out = np.zeros(BPT // 4, np.float32)
    assert s.read(0, 3 * BPT, BPT, out=out) is out and (out == 7).all()
    t = torch.zeros(16)
    s.read(1, 0, BPT, out=t)
    assert torch.equal(t, torch.arange(16, dtype=torch.float32))
    ba = bytearray(BPT)
    s.read(0, 0, BPT, out=ba)
    assert ba == b"\x01" * BPT
    with pytest.raises(kvvm.InvalidArgument, match="holds"):
        s.read(0, 0, BPT, out=bytearray(8))
    with pytest.raises(kvvm.InvalidArgument, match="read-only"):
        s.read(0, 0, 8, out=b"12345678")
    with pytest.raises(kvvm.InvalidArgument, match="contiguous"):
        s.write(0, 0, np.zeros((8, 8), np.uint8)[:, ::2])
    with pytest.raises(kvvm.InvalidArgument):
        s.read(0, 7 * BPT, 2 * BPT)              # past the length
    with pytest.raises(kvvm.InvalidArgument):
        s.write(2, 0, b"x")                      # region out of range
    with pytest.raises(TypeError):
        s.write(0, 0, 12345)


def test_fork_copy_on_write(ctx):
    p = ctx.create()
    p.grow(100)
    _fill(p, 0, 0, 100, 0xAA)
    c = p.fork()
    assert c.length == 100 and c.info.pages_shared == 4 and p.info.pages_shared == 4
    c.write(0, 5 * BPT, b"\xBB" * BPT)
    assert p.read(0, 5 * BPT, BPT) == b"\xAA" * BPT
    assert c.read(0, 5 * BPT, BPT) == b"\xBB" * BPT
    assert ctx.stats()["cow_copies"] >= 1
    c.prepare_write(0, 1)
    with pytest.raises(kvvm.InvalidArgument):
        c.prepare_write(5, 200)


def test_share_prefix(ctx):
    src = ctx.create()
    src.grow(100)
    _fill(src, 0, 0, 100, 0x11)
    dst = ctx.create()
    dst.share(src, 70)
    assert dst.length == 70
    assert dst.read(0, 0, 70 * BPT) == b"\x11" * (70 * BPT)
    dst.grow(80)
    assert dst.read(0, 70 * BPT, 10 * BPT) == bytes(10 * BPT)     # src's later tokens unseen
    with pytest.raises(kvvm.InvalidArgument):
        dst.share(src, 10)                       # dst not empty
    e = ctx.create()
    with pytest.raises(kvvm.InvalidArgument):
        e.share(src, 101)


def test_swap_need_prefetch_ready(spill_dir):
    with kvvm.Context(**small_config(host_budget=32 * GRANULE, spill_dir=spill_dir,
                                     spill_budget=1 << 20)) as c:
        s = c.create()
        s.grow(200)
        _fill(s, 1, 0, 200, 0x5A)
        c.step()
        free0 = c.stats()["pages_device_free"]
        s.swap_out()
        i = s.info
        assert not i.resident and i.pages_device == 0 and i.pages_host + i.pages_disk == 8
        assert c.stats()["pages_device_free"] == free0 + 8
        assert not s.ready
        pages, fits = s.need(200)
        assert pages == 8 and fits
        assert s.need(300)[0] == 10
        s.swap_out()                             # already out: fine
        s.swap_in()
        assert s.info.resident and s.ready
        assert s.read(1, 0, 200 * BPT) == b"\x5A" * (200 * BPT)
        c.step()
        s.swap_out()
        s.prefetch()
        c.sync()
        assert s.ready
        st = c.stats()
        assert st["swap_outs"] == 2 and st["swap_ins"] == 2
        with pytest.raises(kvvm.TooBig):
            s.need(c.max_tokens + 1)


def test_out_of_memory_changes_nothing():
    with kvvm.Context(**small_config(device_budget=8 * GRANULE)) as c:
        a = c.create()
        a.grow(64 * 4)                              # 4 pages per region: the whole device
        b = c.create()
        with pytest.raises(kvvm.OutOfMemory) as e:
            b.grow(1)
        assert e.value.errno == errno.ENOMEM
        assert b.length == 0 and c.stats()["pages_device_free"] == 0
        with pytest.raises(kvvm.OutOfMemory):
            a.swap_out()                            # no host tier


def test_streams(ctx):
    s = ctx.create()
    s.grow(4)
    h = ctx.stream_create()
    assert isinstance(h, int) and h
    ctx.set_stream(h)
    assert ctx.stream == h
    s.write(0, 0, b"\x09" * BPT)
    s.wait_stream(h)
    ctx.step()
    ctx.sync()
    assert s.read(0, 0, BPT) == b"\x09" * BPT
    with pytest.raises(kvvm.Busy):
        ctx.stream_destroy(h)                        # the engine stream now
    with pytest.raises(kvvm.InvalidArgument):
        s.wait_stream(None)
    ctx.set_stream(None)
    assert ctx.stream == 0
    ctx.stream_destroy(h)
    with pytest.raises(kvvm.InvalidArgument):
        ctx.stream_destroy(h)                        # not ours any more

    class FakeTorchStream:
        cuda_stream = ctx.stream_create()
    ctx.set_stream(FakeTorchStream())
    assert ctx.stream == FakeTorchStream.cuda_stream
    ctx.set_stream(0)
    with pytest.raises(TypeError):
        ctx.set_stream("default")


def test_addresses(ctx):
    a, b = ctx.create(), ctx.create()
    assert ctx.slot_bytes >= ctx.max_tokens * ctx.bytes_per_token
    for r in range(ctx.n_regions):
        base = ctx.region_base(r)
        assert a.addr(r) == base + a.slot * ctx.slot_bytes
        assert b.addr(r) == base + b.slot * ctx.slot_bytes
    assert ctx.region_base(1) - ctx.region_base(0) == ctx.max_seqs * ctx.slot_bytes
    with pytest.raises(kvvm.InvalidArgument):
        ctx.region_base(ctx.n_regions)
    with pytest.raises(kvvm.InvalidArgument):
        a.addr(ctx.n_regions)


def test_stats_and_json(ctx):
    st = ctx.stats()
    assert set(st) == set(_lib.STATS_FIELDS)
    assert st["page_size"] == GRANULE and st["pages_device_total"] == 64
    s = ctx.create()
    s.grow(1)
    j = ctx.stats_json()
    assert j["backend"] == "emulated" and j["version"] == kvvm.library_version
    assert kvvm.__version__ == kvvm.library_version, "the package and the library disagree"
    assert j["stats"]["maps"] == ctx.stats()["maps"] > 0
    assert j["layout"]["slot_bytes"] == ctx.slot_bytes
    assert j["config"]["emu_opaque"] == 1


def test_metrics_text(ctx):
    """Context.metrics() (issue 37): kvvm_metrics' exposition as a str, every family with
    its HELP and TYPE, the stats' values in it."""
    s = ctx.create()
    s.grow(1)
    t = ctx.metrics()
    assert isinstance(t, str) and t.endswith("\n")
    st = ctx.stats()
    assert "kvvm_maps_total %d\n" % st["maps"] in t and st["maps"] > 0
    assert 'kvvm_pages{tier="device",state="total"} %d\n' % st["pages_device_total"] in t
    lines = t.splitlines()
    helps = [l.split()[2] for l in lines if l.startswith("# HELP ")]
    types = [l.split()[2] for l in lines if l.startswith("# TYPE ")]
    assert helps == types and len(helps) == len(set(helps)) >= 30
    samples = [l for l in lines if not l.startswith("#")]
    assert all(l.startswith("kvvm_") for l in samples)
    assert any(l.startswith("kvvm_store_request_duration_seconds_bucket{") for l in samples)
    ctx.close()
    with pytest.raises(kvvm.Error):
        ctx.metrics()


def test_repr_and_strerror(ctx):
    s = ctx.create()
    assert "slot=" in repr(s) and "emulated" in repr(ctx)
    assert "max_tokens" in kvvm.strerror(-errno.E2BIG)
    assert kvvm.strerror(errno.E2BIG) == kvvm.strerror(-errno.E2BIG)
    with pytest.raises(TypeError):
        kvvm.Sequence()
