"""python3 -m kvvm.bench: the per-decode-step cost of a KV cache in PyTorch.

For each context length and batch size, every step appends one token's K and V in every
layer and runs attention over the whole cache, with five caches measured in the same run,
step by step in rotating order (so machine noise hits all alike):
  (a) libkvvm views: one sequence per request, ctx.grow_batch once per step, the new token
      written into the region view, attention reading the region view in place, ctx.step();
  (b) a torch.cat cache (Hugging Face DynamicCache style): torch.cat([K, k]) per layer;
  (c) a statically preallocated max-length cache: the new token written in place;
  (d) libkvvm through kvvm.KVCache: as (a), but each new token is written by
      KVCache.update(layer, seq, k, v) for every sequence and layer, as a model's attention
      code calls it;
  (e) as (d), through bare_update: the same slices of cached rows and copies per sequence
      and layer with nothing of the package ((d)'s append less (e)'s, per call, is the
      package's price per KVCache.update: the `update us` column).
Attention is multi-query (one KV head, n_q_heads query heads) so that every cache's K/V
is consumed in place by torch.bmm, with no copy: the difference between the rows is the
cache, not the kernel. The physical memory each cache holds is reported beside the live
K/V bytes: (a) the device pages its sequences hold (kvvm_stats), (b) its tensors' bytes,
(c) its preallocation.

The update group (--only update): KVCache.update's price against the sequence's length in
one context, tight and inside a decode step (UpdateGroup).

The prefix group (--only prefix): prefill time saved by the prefix cache against the
length P of a shared system prompt. A small transformer (the same layer count, query heads,
one KV head and head size as above, random weights) serves requests of P + suffix tokens
whose first P are a system prompt published once (its full blocks, kvvm_prefix_publish; the
publisher then freed). Each trial times one request both ways, in alternating order: (full)
prefill all P + suffix tokens in chunks; (attach) compute the prompt's keys, attach the
cached blocks (Context.attach) and prefill only the rest. Both write K/V through
kvvm.KVCache and end with the last token's logits, which must agree.

On the emulated device (no GPU) everything runs on the CPU; --backend cuda runs the same on
a GPU (not run in this repository's CI).
"""
import argparse
import json
import math
import statistics
import sys
import time

import kvvm


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python3 -m kvvm.bench", description=__doc__.split("\n")[0])
    p.add_argument("--contexts", default="1024,4096,16384",
                   help="context lengths (comma-separated, default 1024,4096,16384)")
    p.add_argument("--batches", default="1,16", help="batch sizes (default 1,16)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--q-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--steps", type=int, default=0,
                   help="measured steps per point (default: 40, 16 above 64k cached tokens)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--backend", default="emulated", choices=["emulated", "cuda", "auto"])
    p.add_argument("--granule", default="2M",
                   help="emulated device granule = page size (default 2M, like a GPU)")
    p.add_argument("--only", default="decode,update,prefix",
                   help="groups to run: decode, update, prefix (default all three)")
    p.add_argument("--update-steps", type=int, default=200,
                   help="steps per length and mode of the update group (default 200)")
    p.add_argument("--update-batch", type=int, default=1,
                   help="sequences per cache of the update group (default 1)")
    p.add_argument("--prefix-lengths", default="256,1024",
                   help="system prompt lengths P of the prefix group (default 256,1024, "
                   "short; the curve: 256,1024,4096,8192)")
    p.add_argument("--prefix-suffix", type=int, default=64,
                   help="the request's own tokens after the system prompt (default 64)")
    p.add_argument("--prefix-trials", type=int, default=5,
                   help="requests timed each way per length (default 5)")
    p.add_argument("--prefix-granule", default="64K",
                   help="page size of the prefix group on the emulated device (default 64K: "
                   "256 tokens per block at head-dim 64)")
    p.add_argument("--chunk", type=int, default=512, help="prefill chunk, tokens (default 512)")
    p.add_argument("--json", metavar="FILE", help="write the JSON results to FILE "
                   "(default: printed after the table)")
    return p.parse_args(argv)


class Point:
    def __init__(self, torch, a, ctx_len, batch, steps, device):
        self.torch, self.a, self.L, self.B = torch, a, ctx_len, batch
        self.steps, self.device = steps, device
        self.max_len = a.max_len
        self.D, self.H, self.NL = a.head_dim, a.q_heads, a.layers
        self.scale = 1.0 / math.sqrt(self.D)

    # -- setup --------------------------------------------------------------------------
    def setup(self):
        torch, B, L, D, NL = self.torch, self.B, self.L, self.D, self.NL
        g = torch.Generator().manual_seed(1)
        self.init = torch.randn(B, L, D, generator=g).to(self.device)
        self.q = torch.randn(B, self.H, D, generator=g).to(self.device)
        self.newkv = torch.randn(B, 1, D, generator=g).to(self.device)
        # (a) libkvvm
        bpt = D * 4
        pages_per_seq = 2 * NL * math.ceil(self.max_len * bpt / self.a.page_size)
        cfg = dict(backend=self.a.backend, n_regions=2 * NL, bytes_per_token=bpt,
                   max_seqs=3 * max(B, 1), max_tokens=self.max_len,
                   device_budget=(3 * B * pages_per_seq + 2 * NL) * self.a.page_size,
                   emu_opaque=0)
        if self.a.backend != "cuda":
            cfg["emu_granule"] = self.a.page_size
        self.ctx = kvvm.Context(**cfg)
        self.seqs = [self.ctx.create() for _ in range(B)]
        slots = [s.slot for s in self.seqs]
        self.slot0 = slots[0]
        self.contiguous_slots = slots == list(range(slots[0], slots[0] + B))
        self.ctx.grow_batch(self.seqs, [L] * B)
        self.kv_regions = []
        for r in range(2 * NL):
            R = self.ctx.region_tensor(r, torch.float32, (D,))
            self.kv_regions.append(R)
            for i, s in enumerate(self.seqs):
                R[s.slot, :L] = self.init[i]
        # the per-step views of the batch: slots in a row are one strided view per region
        self.batch_views = [R[self.slot0:self.slot0 + B] if self.contiguous_slots else None
                            for R in self.kv_regions]
        self.ctx.step()
        self.len_a = L
        self.lengths = (kvvm._lib.c_u64 * B)()
        self.handles = (kvvm._lib.c_u64 * B)(*[s.handle for s in self.seqs])
        # (d) the same as (a) through KVCache.update, on sequences of its own
        self.seqs_d = [self.ctx.create() for _ in range(B)]
        self.ctx.grow_batch(self.seqs_d, [L] * B)
        self.cache_d = kvvm.KVCache(self.ctx, NL, 1, D, torch.float32)
        for layer in range(NL):
            for i, s in enumerate(self.seqs_d):
                K, V = self.cache_d.keys_values(layer, s)
                K[:, 0] = self.init[i]
                V[:, 0] = self.init[i]
        slots_d = [s.slot for s in self.seqs_d]
        self.contiguous_d = slots_d == list(range(slots_d[0], slots_d[0] + B))
        self.batch_views_d = [R[slots_d[0]:slots_d[0] + B] if self.contiguous_d else None
                              for R in self.kv_regions]
        self.handles_d = (kvvm._lib.c_u64 * B)(*[s.handle for s in self.seqs_d])
        self.newkv_d = [self.newkv[i].unsqueeze(1) for i in range(B)]   # (1, 1, D) each
        # (e) the same as (d) through bare_update, the same work without the package
        self.seqs_e = [self.ctx.create() for _ in range(B)]
        self.ctx.grow_batch(self.seqs_e, [L] * B)
        self.rows_e = [[R[s.slot] for R in self.kv_regions_4d()] for s in self.seqs_e]
        for i, rows in enumerate(self.rows_e):
            for r in range(2 * NL):
                rows[r][:L, 0] = self.init[i]
        self.handles_e = (kvvm._lib.c_u64 * B)(*[s.handle for s in self.seqs_e])
        slots_e = [s.slot for s in self.seqs_e]
        self.contiguous_e = slots_e == list(range(slots_e[0], slots_e[0] + B))
        self.batch_views_e = [R[slots_e[0]:slots_e[0] + B] if self.contiguous_e else None
                              for R in self.kv_regions]
        self.ctx.step()
        self.len_d = self.len_e = L
        # (b) torch.cat
        self.cat = [self.init.clone() for _ in range(2 * NL)]
        self.len_b = L
        # (c) static
        self.static = []
        for _ in range(2 * NL):
            t = torch.zeros(B, self.max_len, D, device=self.device)
            t[:, :L] = self.init
            self.static.append(t)
        self.len_c = L
        self.t = {m: {"append": [], "attn": []} for m in "abcde"}

    def kv_regions_4d(self):
        """The region tensors as (max_seqs, max_tokens, 1, D): KVCache's layout."""
        return [self.ctx.region_tensor(r, self.torch.float32, (1, self.D))
                for r in range(2 * self.NL)]

    def close(self):
        self.ctx.close()
        del self.cat, self.static, self.kv_regions, self.batch_views, self.init, self.rows_e

    # -- one step per cache ---------------------------------------------------------------
    def attention(self, K, V):
        torch = self.torch
        s = torch.bmm(self.q, K.transpose(1, 2)) * self.scale        # (B, H, T)
        return torch.bmm(s.softmax(-1), V)                            # (B, H, D)

    def sync(self):
        if self.device != "cpu":
            self.torch.cuda.synchronize()

    def grow_batch(self, handles, n):
        """One kvvm_seq_grow_batch of the B sequences `handles` to n tokens (the C call
        directly: the engine's per-step price, without the package's argument checks)."""
        for i in range(self.B):
            self.lengths[i] = n
        rc = kvvm._lib.lib.kvvm_seq_grow_batch(self.ctx._kv, handles, self.lengths, self.B)
        if rc < 0:
            raise kvvm.error_class(rc)(rc, function="kvvm_seq_grow_batch")

    def attend_and_step(self, views, n, t0):
        """The rest of a libkvvm step ((a) and (d)) after its append began at t0: attention
        over tokens [0, n) of the region views, then ctx.step(), the iteration boundary,
        counted as cache cost. (append seconds, attention seconds)."""
        self.sync()
        t1 = time.perf_counter()
        for layer in range(self.NL):
            self.attention(views[2 * layer][:, :n], views[2 * layer + 1][:, :n])
        self.sync()
        t2 = time.perf_counter()
        self.ctx.step()
        t3 = time.perf_counter()
        return (t1 - t0) + (t3 - t2), t2 - t1

    def step_a(self):
        n = self.len_a + 1
        t0 = time.perf_counter()
        self.grow_batch(self.handles, n)
        views = []
        for r in range(2 * self.NL):
            R = self.kv_regions[r]
            if self.contiguous_slots:
                v = self.batch_views[r]
                v[:, n - 1:n] = self.newkv
            else:
                v = self.torch.stack([R[s.slot] for s in self.seqs])
                for i, s in enumerate(self.seqs):
                    R[s.slot, n - 1] = self.newkv[i, 0]
            views.append(v)
        self.len_a = n
        return self.attend_and_step(views, n, t0)

    def step_d(self):
        n = self.len_d + 1
        t0 = time.perf_counter()
        self.grow_batch(self.handles_d, n)
        for layer in range(self.NL):
            for i, s in enumerate(self.seqs_d):
                self.cache_d.update(layer, s, self.newkv_d[i], self.newkv_d[i])
        views = []
        for r in range(2 * self.NL):
            v = self.batch_views_d[r]
            if v is None:
                R = self.kv_regions[r]
                v = self.torch.stack([R[s.slot] for s in self.seqs_d])
            views.append(v)
        self.len_d = n
        return self.attend_and_step(views, n, t0)

    def step_e(self):
        n = self.len_e + 1
        t0 = time.perf_counter()
        self.grow_batch(self.handles_e, n)
        for layer in range(self.NL):
            for i in range(self.B):
                bare_update(self.rows_e[i], layer, n, self.newkv_d[i], self.newkv_d[i])
        views = []
        for r in range(2 * self.NL):
            v = self.batch_views_e[r]
            if v is None:
                R = self.kv_regions[r]
                v = self.torch.stack([R[s.slot] for s in self.seqs_e])
            views.append(v)
        self.len_e = n
        return self.attend_and_step(views, n, t0)

    def step_b(self):
        torch, n = self.torch, self.len_b + 1
        t0 = time.perf_counter()
        for r in range(2 * self.NL):
            self.cat[r] = torch.cat([self.cat[r], self.newkv], dim=1)
        self.sync()
        t1 = time.perf_counter()
        for layer in range(self.NL):
            self.attention(self.cat[2 * layer], self.cat[2 * layer + 1])
        self.sync()
        t2 = time.perf_counter()
        self.len_b = n
        return t1 - t0, t2 - t1

    def step_c(self):
        n = self.len_c + 1
        t0 = time.perf_counter()
        for r in range(2 * self.NL):
            self.static[r][:, n - 1:n] = self.newkv
        self.sync()
        t1 = time.perf_counter()
        for layer in range(self.NL):
            self.attention(self.static[2 * layer][:, :n], self.static[2 * layer + 1][:, :n])
        self.sync()
        t2 = time.perf_counter()
        self.len_c = n
        return t1 - t0, t2 - t1

    def run(self, warmup):
        fns = {"a": self.step_a, "b": self.step_b, "c": self.step_c, "d": self.step_d,
               "e": self.step_e}
        order = "abcde"
        for i in range(warmup + self.steps):
            rot = order[i % 5:] + order[:i % 5]
            for m in rot:
                ap, at = fns[m]()
                if i >= warmup:
                    self.t[m]["append"].append(ap)
                    self.t[m]["attn"].append(at)
        self.check()

    def check(self):
        """The three caches hold the same K/V (a sanity check of the benchmark itself)."""
        torch, n = self.torch, self.len_a
        assert self.len_a == self.len_b == self.len_c == self.len_d == self.len_e
        for r in (0, 2 * self.NL - 1):
            R = self.kv_regions[r]
            a = torch.stack([R[s.slot, :n] for s in self.seqs])
            d = torch.stack([R[s.slot, :n] for s in self.seqs_d])
            e = torch.stack([R[s.slot, :n] for s in self.seqs_e])
            if not (torch.equal(a, self.cat[r]) and torch.equal(a, self.static[r][:, :n])
                    and torch.equal(a, d) and torch.equal(a, e)):
                raise AssertionError("bench: the caches disagree in region %d" % r)

    def memory(self):
        st = self.ctx.stats()
        bpt = self.D * 4
        held_a = sum(s.info.pages_device for s in self.seqs) * st["page_size"]
        held_b = sum(t.numel() * 4 for t in self.cat)
        held_c = sum(t.numel() * 4 for t in self.static)
        live = self.B * self.len_a * bpt * 2 * self.NL
        return dict(live=live, a=held_a, b=held_b, c=held_c,
                    a_slack_pages_per_region_seq=(held_a - live) / st["page_size"]
                    / (2 * self.NL * self.B))

    def result(self):
        med = {m: {k: statistics.median(v) for k, v in self.t[m].items()} for m in "abcde"}
        step = {m: med[m]["append"] + med[m]["attn"] for m in "abcde"}
        # (d)'s append over (e)'s (the same work without the package), per KVCache.update
        # call: the per-step differences (steps alternate, so each pair shares the
        # machine's conditions)
        extra = [(d - e) / (self.B * self.NL) for d, e in
                 zip(self.t["d"]["append"], self.t["e"]["append"])]
        mem = self.memory()
        return dict(context=self.L, batch=self.B, steps=self.steps,
                    append_us={m: med[m]["append"] * 1e6 for m in "abcde"},
                    attention_us={m: med[m]["attn"] * 1e6 for m in "abcde"},
                    step_us={m: step[m] * 1e6 for m in "abcde"},
                    update_extra_us=spread_us(extra),
                    ratio_step_d_over_c=step["d"] / step["c"],
                    ratio_step_a_over_c=step["a"] / step["c"],
                    ratio_step_b_over_c=step["b"] / step["c"],
                    ratio_append_b_over_a=med["b"]["append"] / med["a"]["append"],
                    memory_bytes=mem)


def bare_update(rows, layer, n, k, v):
    """(e)'s update: what KVCache.update does for one new token with nothing of the
    package (no state query, no registration): slice the layer's cached K and V rows of
    the sequence to its length n, copy k and v in at token n - 1."""
    K = rows[2 * layer][:n]
    V = rows[2 * layer + 1][:n]
    K[n - 1:n] = k
    V[n - 1:n] = v
    return K, V


def spread_us(xs):
    """Median, quartiles, min and max of xs (seconds) in µs."""
    xs = sorted(xs)
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else xs * 3
    return dict(median=statistics.median(xs) * 1e6, p25=q[0] * 1e6, p75=q[2] * 1e6,
                min=xs[0] * 1e6, max=xs[-1] * 1e6, n=len(xs))


class UpdateGroup:
    """--only update: KVCache.update's price against the sequence's length, in one context.
    B sequences (d) take every new token through KVCache.update, B others (e) through
    bare_update (the same slices and copies, nothing of the package); all 2B grow together
    (one grow_batch per step) and each step ends with ctx.step(). At each length L (a jump
    there by one grow_batch) `steps` steps after `warmup`, (d) and (e) alternating which
    goes first, each step timing the B x layers calls of each, in two modes: tight (the
    calls back to back) and decode (each layer's calls followed by that layer's attention
    over the views they returned, as in a model, so the CPU caches are swept between calls;
    untimed). The price per call: ((d) - (e)) / (B x layers), per step; its median,
    quartiles, min and max per length and mode, and the median's ratio to the first
    length's (flat = 1)."""

    def __init__(self, torch, a, device):
        self.torch, self.a, self.device = torch, a, device
        self.NL, self.D, self.H, self.B = a.layers, a.head_dim, a.q_heads, a.update_batch
        self.lengths = sorted(int(x) for x in a.contexts.split(","))
        self.steps, self.warmup = a.update_steps, a.warmup
        self.max_len = self.lengths[-1] + 2 * (self.steps + self.warmup) + 8

    def setup(self):
        torch, NL, D, B = self.torch, self.NL, self.D, self.B
        ps, bpt = self.a.page_size, D * 4
        pages = 2 * NL * 2 * B * (math.ceil(self.max_len * bpt / ps) + 1)
        cfg = dict(backend=self.a.backend, n_regions=2 * NL, bytes_per_token=bpt,
                   max_seqs=2 * B, max_tokens=self.max_len,
                   device_budget=(pages + 2 * NL) * ps, emu_opaque=0)
        if self.a.backend != "cuda":
            cfg["emu_granule"] = ps
        self.ctx = kvvm.Context(**cfg)
        self.cache = kvvm.KVCache(self.ctx, NL, 1, D, torch.float32)
        self.seqs_d = [self.ctx.create() for _ in range(B)]
        self.seqs_e = [self.ctx.create() for _ in range(B)]
        self.handles = (kvvm._lib.c_u64 * (2 * B))(
            *[s.handle for s in self.seqs_d + self.seqs_e])
        self.lens = (kvvm._lib.c_u64 * (2 * B))()
        regions = [self.ctx.region_tensor(r, torch.float32, (1, D)) for r in range(2 * NL)]
        self.rows_e = [[R[s.slot] for R in regions] for s in self.seqs_e]
        g = torch.Generator().manual_seed(2)
        self.q = torch.randn(self.H, D, generator=g).to(self.device)
        self.kv = [torch.randn(1, 1, D, generator=g).to(self.device) for _ in range(B)]
        self.scale = 1.0 / math.sqrt(D)
        self.n = 0

    def close(self):
        self.ctx.close()
        del self.rows_e

    def grow(self, n):
        for i in range(2 * self.B):
            self.lens[i] = n
        rc = kvvm._lib.lib.kvvm_seq_grow_batch(self.ctx._kv, self.handles, self.lens,
                                               2 * self.B)
        if rc < 0:
            raise kvvm.error_class(rc)(rc, function="kvvm_seq_grow_batch")
        self.n = n

    def attention(self, K, V):
        s = (self.q @ K[:, 0].T) * self.scale                         # (H, n)
        return s.softmax(-1) @ V[:, 0]                                 # (H, D)

    def sync(self):
        if self.device != "cpu":
            self.torch.cuda.synchronize()

    def calls(self, which, attend):
        """Seconds spent in one step's B x layers update calls of (d) or (e)."""
        n, total, clock = self.n, 0.0, time.perf_counter
        for layer in range(self.NL):
            out = []
            t0 = clock()
            if which == "d":
                for i, s in enumerate(self.seqs_d):
                    out.append(self.cache.update(layer, s, self.kv[i], self.kv[i]))
            else:
                for i, rows in enumerate(self.rows_e):
                    out.append(bare_update(rows, layer, n, self.kv[i], self.kv[i]))
            self.sync()
            total += clock() - t0
            if attend:
                for K, V in out:
                    self.attention(K, V)
        return total

    def measure(self, L, attend):
        self.grow(max(L, self.n))
        self.ctx.step()
        per_call = self.B * self.NL
        t = {"d": [], "e": [], "price": []}
        for i in range(self.warmup + self.steps):
            self.grow(self.n + 1)
            got = {}
            for m in ("de" if i % 2 else "ed"):
                got[m] = self.calls(m, attend)
            self.ctx.step()
            if i >= self.warmup:
                t["d"].append(got["d"] / per_call)
                t["e"].append(got["e"] / per_call)
                t["price"].append((got["d"] - got["e"]) / per_call)
        return dict(context=L, length_end=self.n, mode="decode" if attend else "tight",
                    batch=self.B, layers=self.NL, steps=self.steps,
                    update_us=statistics.median(t["d"]) * 1e6,
                    bare_us=statistics.median(t["e"]) * 1e6, price_us=spread_us(t["price"]))

    def check(self):
        """(d) and (e) hold the same K/V (the benchmark's own sanity check)."""
        torch, n = self.torch, self.n
        for layer in range(self.NL):
            for s, rows in zip(self.seqs_d, self.rows_e):
                K, V = self.cache.keys_values(layer, s)
                if not (torch.equal(K, rows[2 * layer][:n])
                        and torch.equal(V, rows[2 * layer + 1][:n])):
                    raise AssertionError("bench: KVCache.update and bare_update disagree")

    def run(self):
        rows = []
        for L in self.lengths:
            for attend in (False, True):
                rows.append(self.measure(L, attend))
        self.check()
        for mode in ("tight", "decode"):
            mine = [r for r in rows if r["mode"] == mode]
            first = mine[0]["price_us"]["median"]
            for r in mine:
                r["price_over_first"] = r["price_us"]["median"] / first if first else None
        return rows


def update_table(rows):
    hdr = ("ctx", "mode", "update us (d)", "bare us (e)",
           "price us (d)-(e) median p25..p75 [min,max]", "price/first")
    lines = ["%6s %6s %13s %11s %42s %11s" % hdr]
    for r in rows:
        ratio = r["price_over_first"]
        lines.append("%6d %6s %13.2f %11.2f %42s %11s" % (
            r["context"], r["mode"], r["update_us"], r["bare_us"], fmt_spread(r["price_us"]),
            "-" if ratio is None else "%.2f" % ratio))
    return "\n".join(lines)


def run_update(torch, a, device, t_start):
    g = UpdateGroup(torch, a, device)
    g.setup()
    try:
        rows = g.run()
    finally:
        g.close()
    print("  update group: done (%.0f s so far)" % (time.perf_counter() - t_start),
          file=sys.stderr)
    return rows


class TinyLM:
    """A small decoder (random weights, fixed seed): embeddings, n_layers of multi-query
    causal attention (q_heads query heads, one KV head of head_dim) and an MLP, RMSNorm; no
    positional encoding (the timing is the point; the causal mask keeps K/V context-
    dependent). forward(tokens, update) runs tokens at the cache's end, update(layer, k, v)
    -> (K, V) over every token so far, and returns the last token's logits."""
    VOCAB = 1024

    def __init__(self, torch, layers, q_heads, head_dim, device):
        g = torch.Generator().manual_seed(3)
        dm = q_heads * head_dim

        def w(*shape):
            return (torch.randn(*shape, generator=g) / math.sqrt(shape[0])).to(device)

        self.torch, self.H, self.D, self.device = torch, q_heads, head_dim, device
        self.emb = torch.randn(self.VOCAB, dm, generator=g).to(device)
        self.layers = [dict(wq=w(dm, dm), wk=w(dm, head_dim), wv=w(dm, head_dim), wo=w(dm, dm),
                            w1=w(dm, 4 * dm), w2=w(4 * dm, dm)) for _ in range(layers)]
        self.out = w(dm, self.VOCAB)

    def rms(self, x):
        return x * self.torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)

    def forward(self, tokens, update):
        torch, n, H, D = self.torch, tokens.shape[0], self.H, self.D
        x = self.emb[tokens]
        for li, p in enumerate(self.layers):
            h = self.rms(x)
            q = (h @ p["wq"]).view(n, H, D).transpose(0, 1)                  # (H, n, D)
            K, V = update(li, (h @ p["wk"]).view(n, 1, D), (h @ p["wv"]).view(n, 1, D))
            total = K.shape[0]
            s = (q @ K[:, 0].T) / math.sqrt(D)                                # (H, n, total)
            pos = torch.arange(total - n, total, device=self.device)
            mask = torch.arange(total, device=self.device)[None, :] > pos[:, None]
            o = s.masked_fill(mask, float("-inf")).softmax(-1) @ V[:, 0]      # (H, n, D)
            x = x + o.transpose(0, 1).reshape(n, H * D) @ p["wo"]
            x = x + torch.relu(self.rms(x) @ p["w1"]) @ p["w2"]
        return self.rms(x[-1]) @ self.out


class PrefixPoint:
    """One system prompt length P of the prefix group (class docstring of the module)."""

    def __init__(self, torch, a, model, P, device):
        self.torch, self.a, self.model, self.P, self.device = torch, a, model, P, device
        self.S, self.NL, self.D = a.prefix_suffix, a.layers, a.head_dim

    def setup(self):
        torch, a = self.torch, self.a
        page = a.prefix_page_size
        bpt = self.D * 4
        n = self.P + self.S
        pages = math.ceil(n * bpt / page)
        # the entries and two requests' pages in every region, and room to spare
        cfg = dict(backend=a.backend, n_regions=2 * self.NL, bytes_per_token=bpt, max_seqs=4,
                   max_tokens=n, device_budget=(3 * pages + 2) * 2 * self.NL * page,
                   emu_opaque=0)
        if a.backend != "cuda":
            cfg["emu_granule"] = page
        self.ctx = kvvm.Context(**cfg)
        self.T = self.ctx.block_tokens
        self.cache = kvvm.KVCache(self.ctx, self.NL, 1, self.D, torch.float32)
        g = torch.Generator().manual_seed(self.P)
        self.tokens = torch.randint(0, TinyLM.VOCAB, (n,), generator=g).to(self.device)
        self.token_list = self.tokens.tolist()
        # the publisher: prefills the system prompt, publishes its full blocks, goes away
        pub = self.ctx.create()
        self.prefill(pub, 0, self.P)
        self.keys = self.ctx.prefix_keys(self.token_list[:self.P])
        if self.ctx.publish(pub, self.keys) != len(self.keys):
            raise AssertionError("bench: publish entered fewer entries than blocks")
        pub.free()
        self.t = {"full": [], "attach": []}
        self.logits = {}
        self.attached = None

    def prefill(self, seq, start, end):
        """Tokens [start, end) into seq (of length start) in chunks; the last logits."""
        logits = None
        for c in range(start, end, self.a.chunk):
            n = min(self.a.chunk, end - c)
            seq.grow(c + n)
            logits = self.model.forward(self.tokens[c:c + n],
                                        lambda li, k, v: self.cache.update(li, seq, k, v))
        return logits

    def sync(self):
        if self.device != "cpu":
            self.torch.cuda.synchronize()

    def request_full(self):
        t0 = time.perf_counter()
        seq = self.ctx.create()
        logits = self.prefill(seq, 0, self.P + self.S)
        self.sync()
        dt = time.perf_counter() - t0
        seq.free()
        return dt, logits

    def request_attach(self):
        t0 = time.perf_counter()
        seq = self.ctx.create()
        nb = self.ctx.attach(seq, self.ctx.prefix_keys(self.token_list))
        logits = self.prefill(seq, nb * self.T, self.P + self.S)
        self.sync()
        dt = time.perf_counter() - t0
        seq.free()
        if nb != len(self.keys):
            raise AssertionError("bench: attached %d blocks of %d" % (nb, len(self.keys)))
        self.attached = nb
        return dt, logits

    def run(self, trials):
        fns = {"full": self.request_full, "attach": self.request_attach}
        for i in range(trials + 1):                     # trial 0 warms up
            for m in (("full", "attach") if i % 2 else ("attach", "full")):
                dt, logits = fns[m]()
                self.logits[m] = logits
                if i:
                    self.t[m].append(dt)
        full, att = self.logits["full"], self.logits["attach"]
        if not self.torch.allclose(full, att, rtol=1e-4, atol=1e-4):
            raise AssertionError("bench: P=%d: the logits after attach differ from a full "
                                 "prefill's (max %.3g)" % (self.P, (full - att).abs().max()))

    def close(self):
        self.ctx.close()

    def result(self):
        full, att = self.t["full"], self.t["attach"]
        ratios = sorted(f / a for f, a in zip(full, att))
        q = (statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1
             else ratios * 3)
        mf, ma = statistics.median(full), statistics.median(att)
        return dict(prefix_tokens=self.P, suffix_tokens=self.S, block_tokens=self.T,
                    attached_blocks=self.attached, trials=len(full),
                    full_ms=mf * 1e3, attach_ms=ma * 1e3, saved_ms=(mf - ma) * 1e3,
                    ratio_full_over_attach=mf / ma,
                    ratio_spread=dict(p25=q[0], p75=q[2], min=ratios[0], max=ratios[-1]))


def prefix_table(rows):
    hdr = ("P", "suffix", "blocks", "full ms", "attach ms", "saved ms", "full/attach",
           "per-trial p25..p75 [min, max]")
    lines = ["%6s %6s %6s %10s %10s %10s %11s %30s" % hdr]
    for r in rows:
        sp = r["ratio_spread"]
        lines.append("%6d %6d %6d %10.2f %10.2f %10.2f %11.2f %30s" % (
            r["prefix_tokens"], r["suffix_tokens"], r["attached_blocks"], r["full_ms"],
            r["attach_ms"], r["saved_ms"], r["ratio_full_over_attach"],
            "%.2f..%.2f [%.2f, %.2f]" % (sp["p25"], sp["p75"], sp["min"], sp["max"])))
    return "\n".join(lines)


def run_prefix(torch, a, device, t_start):
    model = TinyLM(torch, a.layers, a.q_heads, a.head_dim, device)
    rows = []
    for P in [int(x) for x in a.prefix_lengths.split(",")]:
        pt = PrefixPoint(torch, a, model, P, device)
        pt.setup()
        try:
            pt.run(a.prefix_trials)
            rows.append(pt.result())
        finally:
            pt.close()
        print("  prefix %d: done (%.0f s so far)" % (P, time.perf_counter() - t_start),
              file=sys.stderr)
    return rows


def fmt_spread(u):
    return "%.1f %.1f..%.1f [%.1f,%.1f]" % (u["median"], u["p25"], u["p75"], u["min"],
                                             u["max"])


def table(rows, a):
    mib = 1 << 20
    hdr = ("ctx", "batch", "append us a/b/c/d/e", "step ms a/b/c/d/e", "a/c", "b/c", "d/c",
           "update us (d)-(e)", "MiB held a/b/c (live)")
    lines = ["%6s %5s %28s %38s %6s %6s %6s %30s %26s" % hdr]
    for r in rows:
        ap, st, m, u = r["append_us"], r["step_us"], r["memory_bytes"], r["update_extra_us"]
        lines.append("%6d %5d %28s %38s %6.3f %6.2f %6.3f %30s %26s" % (
            r["context"], r["batch"],
            "/".join("%.0f" % ap[x] for x in "abcde"),
            "/".join("%.3f" % (st[x] / 1e3) for x in "abcde"),
            r["ratio_step_a_over_c"], r["ratio_step_b_over_c"], r["ratio_step_d_over_c"],
            fmt_spread(u),
            "%.0f/%.0f/%.0f (%.0f)" % (m["a"] / mib, m["b"] / mib, m["c"] / mib,
                                        m["live"] / mib)))
    return "\n".join(lines)


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        import torch
    except ImportError:
        print("kvvm.bench needs PyTorch (python3-torch)", file=sys.stderr)
        return 2
    torch.set_num_threads(a.threads)
    groups = set(a.only.split(","))
    if not groups <= {"decode", "update", "prefix"}:
        print("kvvm.bench: --only takes decode, update, prefix", file=sys.stderr)
        return 2
    contexts = [int(x) for x in a.contexts.split(",")] if "decode" in groups else []
    batches = [int(x) for x in a.batches.split(",")]
    a.page_size = kvvm._core._parse_size(a.granule)
    base_steps = a.steps
    a.max_len = max(contexts or [0]) + a.warmup + max(a.steps, 40) + 8
    a.prefix_page_size = kvvm._core._parse_size(a.prefix_granule)
    device = "cpu"
    if a.backend == "cuda":
        device = "cuda"
        a.page_size = 2 << 20
        a.prefix_page_size = 2 << 20
    rows = []
    t_start = time.perf_counter()
    for L in contexts:
        for B in batches:
            steps = base_steps or (16 if B * L > 65536 else 40)
            pt = Point(torch, a, L, B, steps, device)
            pt.setup()
            pt.run(a.warmup)
            rows.append(pt.result())
            pt.close()
            print("  ctx %d batch %d: done (%.0f s so far)"
                  % (L, B, time.perf_counter() - t_start), file=sys.stderr)
    update_rows = run_update(torch, a, device, t_start) if "update" in groups else []
    prefix_rows = run_prefix(torch, a, device, t_start) if "prefix" in groups else []
    out = dict(tool="kvvm.bench", library_version=kvvm.library_version,
               backend=a.backend, torch=torch.__version__, threads=a.threads,
               layers=a.layers, q_heads=a.q_heads, kv_heads=1, head_dim=a.head_dim,
               dtype="float32", page_size=a.page_size, max_len=a.max_len,
               wall_s=time.perf_counter() - t_start, rows=rows, update_rows=update_rows,
               update=dict(steps=a.update_steps, batch=a.update_batch),
               prefix_rows=prefix_rows,
               prefix=dict(page_size=a.prefix_page_size, chunk=a.chunk,
                           trials=a.prefix_trials))
    if rows:
        print("kvvm.bench: %d layers, %d query heads / 1 KV head x %d, float32, page %d KiB, "
              "static max length %d, torch %s, %d thread(s); medians per decode step"
              % (a.layers, a.q_heads, a.head_dim, a.page_size >> 10, a.max_len,
                 torch.__version__, a.threads))
        print("(a) libkvvm views  (b) torch.cat cache  (c) static max-length cache  "
              "(d) libkvvm through KVCache.update  (e) as (d) through bare_update (the same "
              "work without the package);\nupdate us: (d)'s append over (e)'s per "
              "KVCache.update call, median p25..p75 [min, max] of the per-step differences")
        print(table(rows, a))
    if update_rows:
        print("\nupdate group: KVCache.update's price per call against the length, in one "
              "context; %d layers, 1 KV head x %d, float32, page %d KiB, batch %d, %d steps "
              "per row (after %d warm-up), (d) and (e) alternated per step; tight: calls back "
              "to back, decode: each layer's attention between them"
              % (a.layers, a.head_dim, a.page_size >> 10, a.update_batch, a.update_steps,
                 a.warmup))
        print(update_table(update_rows))
    if prefix_rows:
        print("\nprefix group: %d layers, %d query heads / 1 KV head x %d, float32, torch %s, "
              "%d thread(s); a request of P + %d tokens whose first P (a system prompt) are "
              "cached;\n(full) prefills all of them, (attach) attaches the cached blocks and "
              "prefills the rest; chunks of %d tokens, page %d KiB (%d tokens per block); "
              "medians of %d alternated trials"
              % (a.layers, a.q_heads, a.head_dim, torch.__version__, a.threads,
                 a.prefix_suffix, a.chunk, a.prefix_page_size >> 10,
                 prefix_rows[0]["block_tokens"], a.prefix_trials))
        print(prefix_table(prefix_rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
        print("JSON: %s" % a.json)
    else:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
