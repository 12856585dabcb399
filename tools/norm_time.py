"""gemsops' forward or backward time of the norms, one line a case, each
timed by the
benchmark's own method (Benchmark._timed: do_bench over a CUDA-graph
replay, L2 flushed; GEMSOPS_BENCH_FLUSH=read for the read flush). For A/B
runs of modules built elsewhere (tools/ab_modules.sh); tools/ln_time.py
times LayerNorm beside its peers.

usage: python -m tools.norm_time case ...
  case = op,M,N,dtype[,fp32]; op one of ln, rms, addln, addrms (LayerNorm,
  RMSNorm and their fused residual adds), or one of them with _bwd (the
  backward of y, every input needing a gradient, as the benchmark times
  it), or a fused add with _bwd_dh (the backward of y and h both, as a
  transformer block's: dy and dh given); fp32: fp32 weight and bias
  e.g. ln,16384,4096,bfloat16  addrms,4096,12288,float16,fp32
  ln_bwd,8192,8192,float16  addln_bwd_dh,16384,4096,bfloat16
NORM_TIME_LIGER=1 times Liger's fused add + RMSNorm forward beside ours
(a `liger` line) for the addrms cases, where it imports.
NORM_TIME_COMPILED=1 times torch.compile of F.layer_norm beside ours (a
`compiled` line) for the ln forward cases: the peer furthest ahead on
short rows."""

import os
import sys


def ops():
    import gemsops

    return {
        "ln": lambda x, r, s, w, b: gemsops.layer_norm(x, s, w, b),
        "rms": lambda x, r, s, w, b: gemsops.rms_norm(x, s, w, 1e-6),
        "addln": lambda x, r, s, w, b: gemsops.fused_add_layer_norm(
            x, r, s, w, b, 1e-6
        ),
        "addrms": lambda x, r, s, w, b: gemsops.fused_add_rms_norm(
            x, r, s, w, 1e-6
        ),
    }


def time_case(spec, table):
    import torch

    from benchmark.performance_utils import Benchmark

    op, m, n, dt, *params = spec.split(",")
    both = op.endswith("_bwd_dh") and op.startswith("add")
    op = op.removesuffix("_dh") if both else op
    bwd = op.endswith("_bwd")
    op = op.removesuffix("_bwd")
    if op not in table or params not in ([], ["fp32"]):
        raise SystemExit(f"norm_time: bad case {spec!r}\n{__doc__}")
    m, n, dtype = int(m), int(n), getattr(torch, dt)
    pdtype = torch.float32 if params else dtype
    kw = dict(device="cuda", requires_grad=bwd)
    x, r = (torch.randn(m, n, dtype=dtype, **kw) for _ in "xr")
    w, b = (torch.randn(n, dtype=pdtype, **kw) for _ in "wb")
    op_fn = table[op]
    # the backward differentiates y alone, as the benchmark's, or y and h,
    # each with its own gradient (the harness draws one an output)
    fn = op_fn
    if op.startswith("add") and not both:
        fn = lambda *a: op_fn(*a)[0]  # noqa: E731
    args = (x, r, (n,), w, b)
    if op in ("rms", "addrms"):  # b takes no gradient: no dB to time
        b.requires_grad_(False)
    if op in ("ln", "rms"):
        r.requires_grad_(False)
    bench = Benchmark(
        "norm_time", fn, fn, None, [dtype], [(m, n)], is_backward=bwd
    )
    ms = bench._timed(fn, args)[0]
    print(f"{spec:30s} gems {ms * 1e3:9.2f}us", flush=True)
    if op == "ln" and not bwd and os.environ.get("NORM_TIME_COMPILED"):
        from benchmark.test_layer_norm_perf import compiled

        found = compiled(torch.nn.functional.layer_norm).get("compiled")
        if found is not None:
            ms = bench._timed(found, (x, (n,), w, b))[0]
            print(f"{spec:30s} compiled {ms * 1e3:9.2f}us", flush=True)
    if op == "addrms" and not bwd and os.environ.get("NORM_TIME_LIGER"):
        from benchmark.test_norms_perf import add_peers

        liger = add_peers("rms_norm").get("liger")
        if liger is not None:
            ms = bench._timed(liger, args[:4])[0]
            print(f"{spec:30s} liger {ms * 1e3:9.2f}us", flush=True)


def main(argv):
    if not argv:
        print(__doc__)
        return 2
    # before the harness is imported: it reads the switch at import time
    os.environ.setdefault("GEMSOPS_BENCH_GRAPH", "1")
    table = ops()
    for spec in argv:
        time_case(spec, table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
