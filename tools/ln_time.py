"""LayerNorm times for A/B runs: gemsops, torch and (when they import)
FlagGems and Liger, each timed by the benchmark's own method (its
Benchmark._timed: do_bench over a CUDA-graph replay, L2 flushed), one line
per case.

usage: python -m tools.ln_time [case ...]
  case = M,N:fwd|bwd:dtype[:grads]; grads (backward only) are the inputs
  that need a gradient, some of x, w, b (default xwb), e.g.
  8192,8192:fwd:bfloat16  256,262144:bwd:float32  16384,4096:bwd:bfloat16:x
  LN_NO_PEERS=1 leaves FlagGems and Liger out."""

import os
import sys

DEFAULT = [
    "8192,8192:fwd:bfloat16",
    "4096,4096:fwd:bfloat16",
    "16384,4096:fwd:bfloat16",
    "4096,12288:fwd:bfloat16",
    "2048,16384:fwd:float32",
    "4096,12288:fwd:float32",
    "1024,65536:fwd:float32",
]


def time_case(case, peers):
    import torch

    import gemsops
    from benchmark.performance_utils import Benchmark
    from benchmark.test_layer_norm_perf import layer_norm_args

    F = torch.nn.functional.layer_norm
    sizes, which, dt, *grads = case.split(":")
    m, n = (int(s) for s in sizes.split(","))
    dtype = getattr(torch, dt)
    bwd = which == "bwd"
    args = layer_norm_args(dtype, (m, n), requires_grad=bwd)
    x, shape, w, b = args
    for name, t in zip("xwb", (x, w, b)):
        t.requires_grad_(bwd and name in (grads[0] if grads else "xwb"))
    # no autograd graph may outlive the check: its AccumulateGrad nodes,
    # made on this stream, would break the timed backward's capture
    with torch.no_grad():
        ref = F(x.double(), shape, w.double(), b.double())
        err = (gemsops.layer_norm(*args).double() - ref).abs().max().item()
    bench = Benchmark(
        "ln_time",
        F,
        gemsops.layer_norm,
        None,
        [dtype],
        [(m, n)],
        is_backward=bwd,
    )
    ops = {"gems": gemsops.layer_norm, "torch": F}
    for k, op in peers.items():
        if k == "liger" and n > 65536:
            continue
        ops[k] = op
    t = {k: bench._timed(op, args)[0] for k, op in ops.items()}
    gb = (3 if bwd else 2) * m * n * dtype.itemsize / 1e9
    line = " ".join(
        f"{k} {v * 1e3:7.1f}us {gb / (v * 1e-3):5.0f}GB/s"
        for k, v in t.items()
    )
    print(
        f"{case:26s} {line} | vs torch {t['torch'] / t['gems']:.3f}"
        f" err {err:.1e}",
        flush=True,
    )


def main(argv):
    # before the harness is imported: it reads the switch at import time
    os.environ.setdefault("GEMSOPS_BENCH_GRAPH", "1")
    from benchmark.test_layer_norm_perf import peers

    found = {} if os.environ.get("LN_NO_PEERS") else peers()
    for case in argv or DEFAULT:
        time_case(case, found)


if __name__ == "__main__":
    main(sys.argv[1:])
