#!/usr/bin/env python3
"""kvvm-gpucheck's PyTorch probe (docs/kvvm-gpucheck.md, "PyTorch probe").

Runs only where torch with CUDA is importable and a GPU is present; otherwise it says why and
exits 77. Each row is printed as it is measured, "ROW <tab> id <tab> result <tab> detail",
and appended to --tsv FILE (id, expected, result, verdict) at once:

  torch.kernel_writes_kvvm_reads   a torch kernel writes a view; kvvm_seq_read sees the bytes,
                                   kvvm_seq_write's bytes are what torch then reads
  torch.cow_through_views          after fork, the child's write (prepare_write first) is seen
                                   through its view only; the parent's view keeps its bytes
  torch.step_during_capture        ctx.step() while torch.cuda.graph captures on the engine
                                   stream raises Busy and leaves the capture valid (the graph
                                   replays)
  torch.default_stream             torch's default stream (handle 0) is CU_STREAM_LEGACY to
                                   libkvvm, not synchronous mode

usage: torch_probe.py [--device N] [--tsv FILE]
"""
import argparse
import sys
import traceback

EXPECT = {
    "torch.kernel_writes_kvvm_reads": "ok",
    "torch.cow_through_views": "ok",
    "torch.step_during_capture": "busy, graph valid",
    "torch.default_stream": "legacy",
}
failures = 0


def row(tsv, rid, result, detail=""):
    global failures
    verdict = "ok" if result == EXPECT[rid] else "UNEXPECTED"
    failures += verdict != "ok"
    print("ROW\t%s\t%s\t%s" % (rid, result, detail.replace("\t", " ").replace("\n", " ")))
    print("%-34s %-22s %-22s %s" % (rid, EXPECT[rid], result, verdict), file=sys.stderr)
    sys.stdout.flush()
    if tsv:
        tsv.write("%s\t%s\t-\t%s\t%s\n" % (rid, EXPECT[rid], result, verdict))
        tsv.flush()


def probe(tsv, rid, fn):
    try:
        result, detail = fn()
    except Exception as e:                       # a probe that cannot run is a failure
        result, detail = "error: %s" % type(e).__name__, "".join(
            traceback.format_exception_only(type(e), e)).strip()
    row(tsv, rid, result, detail)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--tsv")
    a = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        print("torch_probe: PyTorch is not importable (%s): skipped" % e)
        return 77
    if not torch.cuda.is_available():
        print("torch_probe: torch %s has no usable CUDA device: skipped" % torch.__version__)
        return 77
    import kvvm
    dev = torch.device("cuda", a.device)
    torch.cuda.set_device(dev)
    tsv = open(a.tsv, "a") if a.tsv else None
    H, D = 8, 64                                  # a token: 8 heads x 64 fp16 = 1 KiB
    cfg = dict(backend="cuda", device=a.device, n_regions=2, bytes_per_token=H * D * 2,
               max_seqs=8, max_tokens=4096, device_budget="256M")

    def kernel_writes_kvvm_reads():
        with kvvm.Context(**cfg) as ctx:
            s = ctx.create()
            s.grow(1000)
            t = s.tensor(0, torch.float16, (H, D))
            src = torch.randn(1000, H, D, device=dev, dtype=torch.float16)
            t.copy_(src)                          # a torch kernel writes through the view
            torch.cuda.synchronize()
            got = s.read(0, 0, 1000 * H * D * 2)
            ok1 = got == src.cpu().numpy().tobytes()
            back = torch.randn(1000, H, D, dtype=torch.float16)
            s.write(1, 0, back)                   # kvvm writes, a torch kernel reads
            ctx.sync()
            ok2 = torch.equal(s.tensor(1, torch.float16, (H, D)).cpu(), back)
            return ("ok" if ok1 and ok2 else "differs",
                    "torch wrote, kvvm_seq_read %s; kvvm_seq_write, torch read %s"
                    % ("matched" if ok1 else "DIFFERED", "matched" if ok2 else "DIFFERED"))

    def cow_through_views():
        with kvvm.Context(**cfg) as ctx:
            p = ctx.create()
            p.grow(300)
            p.tensor(0, torch.float16, (H, D)).fill_(1.0)
            c = p.fork()
            c.prepare_write(0, 300)
            c.tensor(0, torch.float16, (H, D))[:10].fill_(5.0)
            torch.cuda.synchronize()
            pv, cv = p.tensor(0, torch.float16, (H, D)), c.tensor(0, torch.float16, (H, D))
            ok = bool((pv == 1.0).all()) and bool((cv[:10] == 5.0).all()) and \
                bool((cv[10:] == 1.0).all())
            return ("ok" if ok else "differs",
                    "parent view all 1: %s; child's first 10 tokens 5, rest 1: %s"
                    % (bool((pv == 1.0).all()), bool((cv[:10] == 5.0).all())))

    def step_during_capture():
        with kvvm.Context(**cfg) as ctx:
            s = ctx.create()
            s.grow(16)
            st = torch.cuda.Stream(device=dev)
            ctx.set_stream(st)
            x = torch.ones(1024, device=dev)
            g = torch.cuda.CUDAGraph()
            busy = False
            with torch.cuda.stream(st):
                x.mul_(1)                         # warm up on the stream
            torch.cuda.synchronize()
            with torch.cuda.graph(g, stream=st):
                y = x * 2
                try:
                    ctx.step()
                except kvvm.Busy:
                    busy = True
            g.replay()
            torch.cuda.synchronize()
            valid = bool((y == 2).all())
            ctx.step()
            ctx.set_stream(None)
            return ("%s, graph %s" % ("busy" if busy else "not refused",
                                      "valid" if valid else "broken"),
                    "ctx.step() inside torch.cuda.graph on the engine stream")

    def default_stream():
        with kvvm.Context(**cfg) as ctx:
            ctx.set_stream(torch.cuda.default_stream(dev))
            h = ctx.stream
            s = ctx.create()
            s.grow(8)
            s.tensor(0, torch.float16, (H, D)).fill_(3.0)
            s.free()
            ctx.set_stream(None)
            return ("legacy" if h == 1 else "handle %#x" % h,
                    "torch.cuda.default_stream().cuda_stream = %d"
                    % torch.cuda.default_stream(dev).cuda_stream)

    probe(tsv, "torch.kernel_writes_kvvm_reads", kernel_writes_kvvm_reads)
    probe(tsv, "torch.cow_through_views", cow_through_views)
    probe(tsv, "torch.step_during_capture", step_during_capture)
    probe(tsv, "torch.default_stream", default_stream)
    if tsv:
        tsv.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
