"""A real model's decode loop served from libkvvm views, checked against torch.cat caches.

A small transformer (2 layers, grouped-query attention, rotary positions, RMSNorm, random
weights from a fixed seed) serves requests that share a system prompt (Sequence.share),
sample in parallel (fork), run a beam group (the worst beam replaced by a fork of the best)
and truncate-and-replace (speculative rejection), greedy and sampled. Every step's logits
must be torch.equal to those of the same model with a plain torch.cat cache, and every
finished sequence's K/V read back must equal the reference's bytes.

Three memory regimes: everything fits; oversubscribed with explicit preemption (swap_out
when Sequence.need says the step does not fit); oversubscribed with KVVM_F_AUTO_SWAP. Both
oversubscribed runs have a small host tier and a spill directory under /var/tmp, so pages
go device -> host -> disk and back.

Two more runs of the same loop: the prefix cache (request 1 prefills the system prompt and
publishes its full blocks; the others attach them with Context.attach and prefill only the
rest, three of them after the publisher was freed; under pressure the entry is demoted to the
host tier first), and the pool view (at every step of every layer, attention over the pool
tensors gathered through Sequence.block_table() equals the contiguous path bit for bit).

KVVMTEST_PY_BACKEND=cuda runs the same loop on a GPU with CUDA tensors and an engine
stream (skipped, with the reason, where no GPU is usable).
"""
import math
import os

import pytest

torch = pytest.importorskip("torch")
import kvvm  # noqa: E402

N_LAYERS, N_HEADS, N_KV, HEAD_DIM, D_MODEL, VOCAB = 2, 4, 2, 8, 32, 61
GRAN = 4096
BPT = N_KV * HEAD_DIM * 4                       # float32: 64 bytes per token per region
TOK_PER_PAGE = GRAN // BPT                      # 64


class TinyModel:
    def __init__(self, seed, device):
        g = torch.Generator().manual_seed(seed)

        def w(*shape, scale=None):
            t = torch.randn(*shape, generator=g) * (scale or 1.0 / math.sqrt(shape[0]))
            return t.to(device)

        self.device = device
        self.emb = w(VOCAB, D_MODEL, scale=1.0)
        self.layers = []
        for _ in range(N_LAYERS):
            self.layers.append(dict(
                wq=w(D_MODEL, N_HEADS * HEAD_DIM), wk=w(D_MODEL, N_KV * HEAD_DIM),
                wv=w(D_MODEL, N_KV * HEAD_DIM), wo=w(N_HEADS * HEAD_DIM, D_MODEL),
                w1=w(D_MODEL, 4 * D_MODEL), w2=w(4 * D_MODEL, D_MODEL),
                n1=1.0 + 0.1 * w(D_MODEL, scale=1.0), n2=1.0 + 0.1 * w(D_MODEL, scale=1.0)))
        self.norm = 1.0 + 0.1 * w(D_MODEL, scale=1.0)
        self.out = w(D_MODEL, VOCAB)
        inv = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
        self.inv_freq = inv.to(device)

    @staticmethod
    def rms(x, wgt):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * wgt

    def rope(self, x, pos):
        f = torch.outer(pos.float(), self.inv_freq)            # (n, hd/2)
        cos, sin = f.cos()[:, None, :], f.sin()[:, None, :]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2)

    def attend(self, q, K, V, pos):
        n, total = q.shape[0], K.shape[0]
        Kx = K.repeat_interleave(N_HEADS // N_KV, dim=1).transpose(0, 1)   # (H, T, hd)
        Vx = V.repeat_interleave(N_HEADS // N_KV, dim=1).transpose(0, 1)
        s = q.transpose(0, 1) @ Kx.transpose(1, 2) / math.sqrt(HEAD_DIM)   # (H, n, T)
        mask = torch.arange(total, device=self.device)[None, :] > pos[:, None]
        s = s.masked_fill(mask, float("-inf")).softmax(-1)
        return (s @ Vx).transpose(0, 1).reshape(n, N_HEADS * HEAD_DIM)

    def forward(self, tokens, pos0, update, paged=None):
        """tokens (n,) at positions [pos0, pos0 + n); update(layer, k, v) -> (K, V) over
        [0, pos0 + n). Returns the logits (n, VOCAB). paged(layer) -> (K, V), when given, is
        the same cache gathered through the pool view: its attention must equal K, V's."""
        n = tokens.shape[0]
        pos = torch.arange(pos0, pos0 + n, device=self.device)
        x = self.emb[tokens]
        for li, p in enumerate(self.layers):
            h = self.rms(x, p["n1"])
            q = self.rope((h @ p["wq"]).view(n, N_HEADS, HEAD_DIM), pos)
            k = self.rope((h @ p["wk"]).view(n, N_KV, HEAD_DIM), pos)
            v = (h @ p["wv"]).view(n, N_KV, HEAD_DIM)
            K, V = update(li, k, v)
            o = self.attend(q, K, V, pos)
            if paged is not None:
                Kp, Vp = paged(li)
                assert torch.equal(Kp, K) and torch.equal(Vp, V), "layer %d: pool gather" % li
                assert torch.equal(self.attend(q, Kp, Vp, pos), o), \
                    "layer %d: paged attention differs from the contiguous path" % li
            x = x + o @ p["wo"]
            x = x + torch.relu(self.rms(x, p["n2"]) @ p["w1"]) @ p["w2"]
        return self.rms(x, self.norm) @ self.out


class RefCache:
    """Hugging Face DynamicCache style: torch.cat per step."""

    def __init__(self, src=None):
        self.k = list(src.k) if src else [None] * N_LAYERS
        self.v = list(src.v) if src else [None] * N_LAYERS

    def update(self, layer, k, v):
        self.k[layer] = k if self.k[layer] is None else torch.cat([self.k[layer], k])
        self.v[layer] = v if self.v[layer] is None else torch.cat([self.v[layer], v])
        return self.k[layer], self.v[layer]

    def truncate(self, n):
        self.k = [t[:n] for t in self.k]
        self.v = [t[:n] for t in self.v]


class Req:
    _ids = 0

    def __init__(self, seq, ref, tokens, gen, greedy, budget, group=None):
        Req._ids += 1
        self.id = Req._ids
        self.seq, self.ref, self.tokens = seq, ref, list(tokens)
        self.gen, self.greedy, self.budget = gen, greedy, budget
        self.group, self.score, self.done = group, 0.0, False
        self.last_run = -1


class Engine:
    def __init__(self, ctx, model, pressure, max_batch, device, pool_view=False):
        self.ctx, self.model, self.pressure = ctx, model, pressure
        self.cache = kvvm.KVCache(ctx, N_LAYERS, N_KV, HEAD_DIM, torch.float32)
        self.max_batch, self.device = max_batch, device
        self.reqs, self.it = [], 0
        self.counts = dict(iterations=0, forks=0, shares=0, truncates=0, replaced_beams=0,
                           explicit_swap_outs=0, oom_retries=0, steps_checked=0, finished=0,
                           attached=0, attached_late=0, paged_steps=0)
        self.tiers = set()
        self.sysseq = None
        self.waiting, self.pub, self.demote = [], None, False
        self.pool = None
        if pool_view:
            # paged-attention reference: pool tensors (pool_blocks, T, kv heads, head_dim)
            shape = (TOK_PER_PAGE, N_KV, HEAD_DIM)
            self.pool = [(ctx.pool_tensor(2 * li, torch.float32, shape),
                          ctx.pool_tensor(2 * li + 1, torch.float32, shape))
                         for li in range(N_LAYERS)]
        Req._ids = 0                    # ids 1.. per run: the workload below names them

    # -- running the model on both caches ---------------------------------------------------
    def run(self, r, new_tokens):
        """Grown already: feeds new_tokens at r's end on both caches; compares logits."""
        t = torch.tensor(new_tokens, device=self.device)
        pos0 = len(r.tokens)
        paged = None
        if self.pool is not None:
            def paged(li):
                # fresh each time: copy-on-write and a swap-in give blocks new ids
                ids = r.seq.block_table().long()
                n = r.seq.length
                return tuple(p[ids].reshape(-1, N_KV, HEAD_DIM)[:n] for p in self.pool[li])
            self.counts["paged_steps"] += 1
        got = self.model.forward(t, pos0, lambda li, k, v: self.cache.update(li, r.seq, k, v),
                                 paged)
        want = self.model.forward(t, pos0, r.ref.update)
        assert torch.equal(got, want), "request %d step %d: logits differ" % (r.id, self.it)
        self.counts["steps_checked"] += 1
        r.tokens += new_tokens
        return got[-1]

    def sample(self, r, logits):
        if r.greedy:
            tok = int(torch.argmax(logits))
        else:
            p = torch.softmax(logits.float().cpu() / 0.8, -1)
            tok = int(torch.multinomial(p, 1, generator=r.gen))
        r.score += float(torch.log_softmax(logits.float(), -1)[tok])
        return tok

    # -- scheduling -------------------------------------------------------------------------
    def grow(self, batch, extra):
        """Grows each sequence of the batch by its extra tokens, preempting under pressure.
        Returns the requests that got their growth (the batch may shrink)."""
        batch = list(batch)
        while batch:
            lengths = [len(r.tokens) + e for r, e in zip(batch, extra)]
            if self.pressure == "explicit":
                self.make_room(batch, lengths)
            try:
                self.ctx.grow_batch([r.seq for r in batch], lengths)
                return batch, extra
            except kvvm.OutOfMemory:
                self.counts["oom_retries"] += 1
                if self.pressure == "explicit" and self.evict_one(batch):
                    continue
                batch, extra = batch[:-1], extra[:-1]     # the last one waits
        return [], []

    def resident_victims(self, batch):
        inb = {id(r.seq) for r in batch}
        cands = [r for r in self.reqs if not r.done and id(r.seq) not in inb
                 and r.seq.info.resident]
        cands.sort(key=lambda r: r.last_run)
        if self.sysseq is not None and self.sysseq.info.resident:
            cands.insert(0, None)                     # the system prompt goes first
        return cands

    def evict_one(self, batch):
        for r in self.resident_victims(batch):
            (self.sysseq if r is None else r.seq).swap_out()
            self.counts["explicit_swap_outs"] += 1
            return True
        return False

    def make_room(self, batch, lengths):
        while True:
            need = sum(r.seq.need(n)[0] for r, n in zip(batch, lengths))
            if need <= self.ctx.stats()["pages_device_free"] or not self.evict_one(batch):
                return

    # -- the workload -------------------------------------------------------------------------
    def add_requests(self, n_req, sys_len, seed):
        g = torch.Generator().manual_seed(seed)
        sys_tokens = torch.randint(0, VOCAB, (sys_len,), generator=g).tolist()
        self.sysseq = self.ctx.create()
        sysref = RefCache()
        holder = Req(self.sysseq, sysref, [], None, True, 0)
        self.sysseq.grow(sys_len)
        self.run(holder, sys_tokens)
        self.ctx.step()
        for i in range(n_req):
            seq = self.ctx.create()
            seq.share(self.sysseq, sys_len)
            self.counts["shares"] += 1
            r = Req(seq, RefCache(sysref), sys_tokens, torch.Generator().manual_seed(seed + i),
                    greedy=(i % 2 == 0), budget=sys_len + 14 + 5 * i + 40)
            r.pending = torch.randint(0, VOCAB, (6 + 3 * i,), generator=g).tolist()
            self.reqs.append(r)

    def add_requests_prefix(self, n_req, sys_len, seed, late_from):
        """Request 1 prefills the system prompt (one chunk), publishes its full blocks and
        decodes; requests 2..n_req+1 attach them through the prefix cache and prefill the
        rest. Those from late_from on arrive only after request 1 was freed."""
        g = torch.Generator().manual_seed(seed)
        sys_tokens = torch.randint(0, VOCAB, (sys_len,), generator=g).tolist()
        self.sys_tokens = sys_tokens
        self.keys = self.ctx.prefix_keys(sys_tokens)
        assert len(self.keys) == sys_len // TOK_PER_PAGE >= 1
        pub = Req(self.ctx.create(), RefCache(), [], None, True, budget=sys_len + 12)
        pub.seq.grow(sys_len)
        self.run(pub, sys_tokens)
        assert self.ctx.publish(pub.seq, self.keys) == len(self.keys)
        # the reference of the attachers: the same chunk's K/V, cut at the attached blocks
        self.sysref = RefCache(pub.ref)
        pub.pending = torch.randint(0, VOCAB, (4,), generator=g).tolist()
        self.pub = pub
        self.reqs.append(pub)
        self.ctx.step()
        for i in range(n_req):
            r = Req(None, RefCache(self.sysref), [], torch.Generator().manual_seed(seed + i),
                    greedy=(i % 2 == 0), budget=sys_len + 14 + 5 * i + 40)
            r.pending = torch.randint(0, VOCAB, (6 + 3 * i,), generator=g).tolist()
            if i < late_from:
                self.attach_req(r)
            else:
                self.waiting.append(r)

    def attach_req(self, r):
        tiers = self.ctx.lookup(self.keys)
        assert len(tiers) == len(self.keys), tiers
        assert all(t in (kvvm.Tier.DEVICE, kvvm.Tier.HOST) for t in tiers), tiers
        self.tiers.update(t.name for t in tiers)
        seq = self.ctx.create()
        while True:
            try:
                nb = self.ctx.attach(seq, self.keys)
                break
            except kvvm.OutOfMemory:        # bringing host entries up needs device pages
                self.counts["oom_retries"] += 1
                assert seq.length == 0      # all or nothing
                assert self.evict_one([]), "attach: nothing left to swap out"
        assert nb > 0 and seq.length == nb * TOK_PER_PAGE, (nb, seq.length)
        n = seq.length
        r.seq = seq
        r.ref.truncate(n)
        r.tokens = self.sys_tokens[:n]
        r.pending = self.sys_tokens[n:] + r.pending       # prefill only the rest
        self.reqs.append(r)
        self.counts["attached"] += 1
        if self.pub.done:
            self.counts["attached_late"] += 1

    def fork_req(self, r, seed, group=None):
        child = r.seq.fork()
        self.counts["forks"] += 1
        c = Req(child, RefCache(r.ref), r.tokens, torch.Generator().manual_seed(seed),
                greedy=False, budget=r.budget, group=group)
        c.pending, c.score = list(r.pending), r.score
        self.reqs.append(c)
        return c

    def iteration(self):
        active = [r for r in self.reqs if not r.done]
        if self.waiting and not active:
            # the late requests come once every earlier one, the publisher included, was
            # freed: the entries are nobody's pages but their own
            if self.demote:
                # under pressure: a long prompt fills the device while its budget shrinks to
                # that prompt's pages, so the entry is demoted to host (KVVM_F_CACHE_DEMOTE);
                # the budget comes back and the attach brings the entry up
                full = self.ctx.stats()["device_budget"]
                filler = self.ctx.create()
                filler.grow(512)
                self.ctx.set_budget(2 * N_LAYERS * 512 // TOK_PER_PAGE * GRAN)
                filler.free()
                self.ctx.set_budget(full)
                assert self.ctx.stats()["prefix_evictions"] > 0     # demoted, not dropped
                assert set(self.ctx.lookup(self.keys)) == {kvvm.Tier.HOST}
            for r in self.waiting:
                self.attach_req(r)
            self.waiting = []
            active = [r for r in self.reqs if not r.done]
        if not active:
            return False
        active.sort(key=lambda r: r.last_run)
        batch = active[:self.max_batch]
        extra = [len(r.pending) for r in batch]
        batch, extra = self.grow(batch, extra)
        for r in batch:
            r.last_run = self.it
            logits = self.run(r, r.pending)
            r.pending = [self.sample(r, logits)]
            self.after_token(r)
        if self.pool is not None:
            live = [r.seq for r in batch if not r.done]
            indptr, indices, last = self.ctx.batch_block_table(live)
            for i, s in enumerate(live):
                assert indices[indptr[i]:indptr[i + 1]].tolist() == s.block_table().tolist()
                assert last[i] == s.length - (indptr[i + 1] - indptr[i] - 1) * TOK_PER_PAGE
        self.ctx.step()
        self.it += 1
        self.counts["iterations"] += 1
        if self.it % 5 == 0:
            self.beam_prune()
        return True

    def after_token(self, r):
        n = len(r.tokens)
        # parallel sampling: requests 2 and 3 fork two samplers after their prefill
        if r.id in (3, 4) and r.group is None and not getattr(r, "forked", False):
            r.forked = True
            for j in range(2):
                self.fork_req(r, 1000 * r.id + j)
        # a beam group of 3 from request 5
        if r.id == 6 and r.group is None:
            r.group = "beam"
            for j in range(2):
                self.fork_req(r, 2000 + j, group="beam")
        # truncate and replace (speculative rejection) every 7 tokens of request 1 and 2
        cut = getattr(r, "cut", set())
        if r.id in (2, 3) and n % 7 == 0 and n not in cut and n - 3 > self.sys_len:
            r.cut = cut | {n}
            r.seq.truncate(n - 3)
            r.ref.truncate(n - 3)
            r.tokens = r.tokens[:n - 3]
            r.pending = [(r.pending[0] + 1) % VOCAB]
            self.counts["truncates"] += 1
        if n + len(r.pending) > r.budget:
            self.finish(r)

    def beam_prune(self):
        beams = [r for r in self.reqs if r.group == "beam" and not r.done]
        if len(beams) < 3:
            return
        beams.sort(key=lambda r: r.score)
        worst, best = beams[0], beams[-1]
        self.finish(worst)
        self.fork_req(best, 3000 + self.it, group="beam")
        self.counts["replaced_beams"] += 1

    def finish(self, r):
        """Checks the K/V bytes against the reference, then frees the sequence."""
        n = len(r.tokens)
        assert r.seq.length == n
        for li in range(N_LAYERS):
            for reg, want in ((2 * li, r.ref.k[li]), (2 * li + 1, r.ref.v[li])):
                got = r.seq.read(reg, 0, n * BPT)
                assert got == want.contiguous().cpu().numpy().tobytes(), \
                    "request %d region %d: K/V read back differs" % (r.id, reg)
        r.seq.free()
        r.done = True
        self.counts["finished"] += 1


def serve(pressure, spill_dir, device="cpu", backend="emulated", stream=None, prefix=False,
          pool_view=False):
    cfg = dict(backend=backend, n_regions=2 * N_LAYERS, bytes_per_token=BPT, max_seqs=24,
               max_tokens=512, emu_granule=GRAN, emu_opaque=0)
    if pressure == "none":
        cfg.update(device_budget=256 * GRAN)
    else:
        # ~5 sequences of 4 pages per region fit the device; the host tier holds fewer.
        cfg.update(device_budget=80 * GRAN, host_budget=24 * GRAN, spill_dir=spill_dir,
                   spill_budget=4 << 20, host_low=0.3, host_high=0.5)
        if pressure == "auto":
            cfg.update(flags=kvvm.F_AUTO_SWAP, device_low=0.15, device_high=0.3)
        if prefix:              # an entry nobody shares goes to host, not away
            cfg["flags"] = cfg.get("flags", 0) | kvvm.F_CACHE_DEMOTE
    if pool_view:
        cfg["flags"] = cfg.get("flags", 0) | kvvm.F_POOL_VIEW
    if backend == "cuda":
        cfg.pop("emu_granule")
        cfg.pop("emu_opaque")
        cfg["page_size"] = 0
    model = TinyModel(1234, device)
    with kvvm.Context(**cfg) as ctx:
        if stream is not None:
            ctx.set_stream(stream)
        eng = Engine(ctx, model, pressure, max_batch=4 if pressure == "none" else 3,
                     device=device, pool_view=pool_view)
        eng.sys_len = 80
        if prefix:
            if pressure != "none":
                eng.demote = True
            eng.add_requests_prefix(6, eng.sys_len, seed=7, late_from=3)
        else:
            eng.add_requests(6, eng.sys_len, seed=7)
        while eng.iteration():
            assert eng.it < 2000
        ctx.sync()
        st = ctx.stats()
        if eng.sysseq is not None:
            eng.sysseq.free()
        c = eng.counts
        print("\n[%s] decode iterations %d, tokens checked %d, finished %d, shares %d, "
              "forks %d, beam replacements %d, truncates %d, explicit swap-outs %d, "
              "grow retries %d; library: swap_outs %d swap_ins %d spills %d unspills %d "
              "cow_copies %d reclaim_swap_outs %d direct_swap_outs %d" % (
                  pressure, c["iterations"], c["steps_checked"], c["finished"], c["shares"],
                  c["forks"], c["replaced_beams"], c["truncates"], c["explicit_swap_outs"],
                  c["oom_retries"], st["swap_outs"], st["swap_ins"], st["spills"],
                  st["unspills"], st["cow_copies"], st["reclaim_swap_outs"],
                  st["direct_swap_outs"]))
        if prefix:
            print("[%s] prefix: attached %d (%d after the publisher was freed), lookup tiers "
                  "%s, prefix_hit_blocks %d" % (pressure, c["attached"], c["attached_late"],
                                                sorted(eng.tiers), st["prefix_hit_blocks"]))
        if pool_view:
            print("[%s] pool view: %d steps checked through the block table" % (
                pressure, c["paged_steps"]))
        assert c["finished"] == len(eng.reqs) >= 10 and not eng.waiting
        assert c["forks"] >= 6 and c["truncates"] >= 2 and c["replaced_beams"] >= 1
        assert st["cow_copies"] > 0
        if pressure != "none" and not prefix:
            assert st["swap_outs"] > 0 and st["swap_ins"] > 0, st
            assert st["spills"] > 0 and st["unspills"] > 0, st
        if pressure == "explicit" and not prefix:
            assert c["explicit_swap_outs"] > 0
        if pressure == "auto" and not prefix:
            assert st["reclaim_swap_outs"] + st["direct_swap_outs"] > 0, st
        if prefix:
            assert c["attached"] == 6 and c["attached_late"] == 3
            # each attacher: one lookup and one attach, every key a hit (+ the demotion check)
            assert st["prefix_hit_blocks"] == (2 * 6 + eng.demote) * len(eng.keys), st
            assert ("HOST" in eng.tiers) == eng.demote, eng.tiers
        if pool_view:
            assert c["paged_steps"] == c["steps_checked"]
        return c, st


@pytest.mark.parametrize("pressure", ["none", "explicit", "auto"])
def test_model_decode_loop(pressure, spill_dir):
    serve(pressure, spill_dir)


@pytest.mark.parametrize("pressure", ["none", "auto"])
def test_model_prefix_cache(pressure, spill_dir):
    """Later requests attach the system prompt's published blocks (three of them after every
    earlier request, the publisher included, was freed) and prefill only the rest; logits
    equal to the torch.cat cache given the same chunk's K/V. Under "auto" the small budgets
    apply, and before the late requests a budget shrink demotes the entry to host: they find
    it there (lookup says HOST) and attach it back. This workload (fewer sequences at once
    than the others) does not itself oversubscribe the device, so no swap is asserted."""
    serve(pressure, spill_dir, prefix=True)


@pytest.mark.parametrize("pressure", ["explicit", "auto"])
def test_model_paged_attention(pressure, spill_dir):
    """The pool view: at every step of every layer, attention over the pool tensors gathered
    through Sequence.block_table() equals the contiguous path (forks, copy-on-write,
    truncate, swap out and in); Context.batch_block_table agrees with each block table."""
    serve(pressure, spill_dir, pool_view=True)


def test_model_decode_loop_cuda(spill_dir):
    if os.environ.get("KVVMTEST_PY_BACKEND") != "cuda":
        pytest.skip("the CUDA run needs KVVMTEST_PY_BACKEND=cuda (and a GPU)")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for pressure in ("none", "explicit", "auto"):
            serve(pressure, spill_dir, device="cuda", backend="cuda", stream=s)
