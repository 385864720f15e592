"""The pool view (KVVM_F_POOL_VIEW): Context.pool_tensor, Sequence.block_table,
Context.batch_block_table, and a paged-attention reference in plain torch (a gather through
the block table) equal to the contiguous path through forks, copy-on-write, swap and
discard."""
import numpy as np
import pytest

import kvvm
from conftest import GRANULE, small_config

torch = pytest.importorskip("torch")
BPT = 64                    # bytes per token: 16 float32
T = GRANULE // BPT          # tokens per block


def pctx(**over):
    cfg = small_config(emu_opaque=0, flags="pool_view", host_budget=64 * GRANULE)
    cfg.update(over)
    return kvvm.Context(**cfg)


def fill(s, first, end, seed):
    """Writes tokens [first, end) of both regions with values that name (seed, region,
    token)."""
    for r in range(2):
        x = np.arange(first * 16, end * 16, dtype=np.float32) + 1e5 * seed + 1e4 * r
        s.write(r, first * BPT, x)


def paged(ctx, s, r):
    """Region r of s gathered through its block table from the pool tensor: (length, 16)."""
    pool = ctx.pool_tensor(r, torch.float32, (T, 16))
    ids = s.block_table().long()
    return pool[ids].reshape(-1, 16)[:s.length]


def contiguous(s, r):
    return s.tensor(r, torch.float32, (16,))


def attention(q, k, v):
    w = torch.softmax(q @ k.T / 4.0, dim=-1)
    return w @ v


def same_attention(ctx, s, where):
    q = torch.linspace(-1, 1, 16).reshape(1, 16) / 1e5
    a = attention(q, contiguous(s, 0), contiguous(s, 1))
    b = attention(q, paged(ctx, s, 0), paged(ctx, s, 1))
    assert torch.equal(a, b), where
    assert torch.equal(contiguous(s, 0), paged(ctx, s, 0)), where


def test_flag_and_shapes():
    with kvvm.Context(**small_config(emu_opaque=0)) as c:
        with pytest.raises(kvvm.NotSupported):
            c.pool_tensor(0, torch.float32, (T, 16))
        s = c.create()
        s.grow(3)
        with pytest.raises(kvvm.NotSupported):
            s.block_table()
    with pctx() as c:
        assert c.tokens_per_block == T
        t = c.pool_tensor(1, torch.float32, (T, 16))
        assert t.shape == (c.pool_blocks, T, 16) and t.dtype == torch.float32
        with pytest.raises(kvvm.InvalidArgument, match="page_size"):
            c.pool_tensor(0, torch.float32, (T, 8))
        with pytest.raises(kvvm.InvalidArgument, match="region"):
            c.pool_tensor(2, torch.float32, (T, 16))


def test_block_table_and_bytes_through_both_views():
    with pctx() as c:
        s = c.create()
        s.grow(2 * T + 3)
        fill(s, 0, s.length, 1)
        ids = s.block_table()
        assert ids.dtype == torch.int32 and ids.shape == (3,)
        assert len(set(ids.tolist())) == 3 and all(0 <= i < c.pool_blocks for i in ids)
        for r in range(2):
            pool = c.pool_tensor(r, torch.float32, (T, 16))
            pool[ids[1], 2, 5] = -7.0               # through the pool view
            assert contiguous(s, r)[T + 2, 5] == -7.0
        assert s.block_table(1, 2).tolist() == ids[1:].tolist()
        same_attention(c, s, "written")


def test_batch_block_table_csr():
    with pctx() as c:
        a, b, e = c.create(), c.create(), c.create()
        a.grow(2 * T + 1)
        b.grow(T)
        indptr, indices, last = c.batch_block_table([a, b, e])
        assert indptr.tolist() == [0, 3, 4, 4]
        assert indices.tolist() == a.block_table().tolist() + b.block_table().tolist()
        assert last.tolist() == [1, T, 0]
        assert indptr.dtype == indices.dtype == last.dtype == torch.int32


def test_paged_reference_equals_contiguous_through_fork_cow_swap_discard():
    with pctx() as c:
        s = c.create()
        for n in range(1, 3 * T + 2, 5):
            s.grow(n)
            fill(s, max(0, n - 5), n, 1)
            same_attention(c, s, "grow %d" % n)
        k = s.fork()
        assert k.block_table().tolist() == s.block_table().tolist()
        fill(k, 2, 3, 2)                            # copy-on-write of block 0
        assert k.block_table()[0] != s.block_table()[0]
        same_attention(c, k, "fork after its write")
        same_attention(c, s, "parent after the fork's write")
        k.grow(k.length + 3)                        # into a shared partial block
        fill(k, k.length - 3, k.length, 3)
        same_attention(c, k, "fork after its grow")
        s.swap_out()
        with pytest.raises(kvvm.NotResident):
            s.block_table()
        with pytest.raises(kvvm.NotResident):
            c.batch_block_table([k, s])
        s.swap_in()
        c.sync()
        same_attention(c, s, "after the swap-in")
        s.discard(2 * T)
        ids = s.block_table()
        assert ids[0] == -1 and ids[1] == -1 and ids[2] >= 0
        q = torch.ones(1, 16) / 1e5
        kept = slice(2 * T, s.length)
        a = attention(q, contiguous(s, 0)[kept], contiguous(s, 1)[kept])
        pool0 = c.pool_tensor(0, torch.float32, (T, 16))
        pool1 = c.pool_tensor(1, torch.float32, (T, 16))
        live = ids[2:].long()
        kk = pool0[live].reshape(-1, 16)[:s.length - 2 * T]
        vv = pool1[live].reshape(-1, 16)[:s.length - 2 * T]
        b = attention(q, kk, vv)
        assert torch.equal(a, b)
