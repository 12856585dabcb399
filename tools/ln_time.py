"""LayerNorm times for A/B runs: gemsops, torch and (when they import)
FlagGems and Liger, each timed by the benchmark's own method (its
Benchmark._timed: do_bench over a CUDA-graph replay, L2 flushed), one line
per case.  usage: ln_time.py [case ...]
case = M,N:fwd|bwd:dtype[:grads], grads (backward only) = the inputs that
need a gradient, some of x, w, b (default xwb), e.g. 8192,8192:fwd:bfloat16
256,262144:bwd:float32  16384,4096:bwd:bfloat16:x (dx alone)"""
import os
import sys

os.environ.setdefault("GEMSOPS_BENCH_GRAPH", "1")
import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmark"))
import gemsops  # noqa: E402
from performance_utils import Benchmark  # noqa: E402
from test_layer_norm_perf import layer_norm_args, peers  # noqa: E402

DEFAULT = ["8192,8192:fwd:bfloat16", "4096,4096:fwd:bfloat16",
           "16384,4096:fwd:bfloat16", "4096,12288:fwd:bfloat16",
           "2048,16384:fwd:float32", "4096,12288:fwd:float32",
           "1024,65536:fwd:float32"]
PEERS = {} if os.environ.get("LN_NO_PEERS") else peers()
F = torch.nn.functional.layer_norm

for case in sys.argv[1:] or DEFAULT:
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
    bench = Benchmark("ln_time", F, gemsops.layer_norm, None, [dtype],
                      [(m, n)], is_backward=bwd)
    ops = {"gems": gemsops.layer_norm, "torch": F}
    for k, op in PEERS.items():
        if k == "liger" and n > 65536:
            continue
        ops[k] = op
    t = {k: bench._timed(op, args)[0] for k, op in ops.items()}
    gb = (3 if bwd else 2) * m * n * dtype.itemsize / 1e9
    line = " ".join(f"{k} {v * 1e3:7.1f}us {gb / (v * 1e-3):5.0f}GB/s"
                    for k, v in t.items())
    print(f"{case:26s} {line} | vs torch {t['torch'] / t['gems']:.3f}"
          f" err {err:.1e}", flush=True)
