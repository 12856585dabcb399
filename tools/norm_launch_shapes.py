"""The kernels each provider of a norm's forward launches, as the CUDA
profiler records them: grid, block, registers a thread, static and dynamic
shared memory, the profiler's estimate of resident warps an SM, and the
kernel's time (one call after warm-up, L2 not flushed: a shape, not a
timing). For reading a peer's launch shape beside ours (issue 28 asks
why a peer is ahead; docs/performance.md keeps what was found).

usage: python -m tools.norm_launch_shapes case ...
  case = op,M,N,dtype with op one of ln, rms, addln, addrms
  e.g. rms,4096,4096,float32 ln,4096,768,float16
Providers: gemsops, torch, torch.compile of the expression, and FlagGems
and Liger where they import (the benchmark's own peer lists)."""

import json
import os
import sys
import tempfile


def providers(op):
    import torch.nn.functional as F

    from benchmark import test_layer_norm_perf as ln_perf
    from benchmark import test_norms_perf as norms_perf

    if op == "ln":
        import gemsops

        found = {"gemsops": gemsops.layer_norm, "torch": F.layer_norm}
        found.update(ln_perf.peers())
        return found
    if op == "rms":
        found = {"gemsops": norms_perf.rms_gems, "torch": norms_perf.rms_torch}
        found.update(norms_perf.rms_peers())
        return found
    if op == "addln":
        found = {"gemsops": norms_perf.add_ln_gems}
        found["torch"] = norms_perf.add_ln_torch
        found.update(norms_perf.add_peers("layer_norm"))
        return found
    found = {"gemsops": norms_perf.add_rms_gems}
    found["torch"] = norms_perf.add_rms_torch
    found.update(norms_perf.add_peers("rms_norm"))
    return found


def case_args(op, m, n, dtype):
    from benchmark import test_norms_perf as norms_perf

    add = op.startswith("add")
    bias = op in ("ln", "addln")
    return norms_perf.args(dtype, (m, n), residual=add, bias=bias)


def kernels(fn, args):
    """(name, grid, block, registers, shared bytes, warps an SM, µs) of
    each kernel one call of fn launches."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    rows = []
    for e in events:
        if e.get("cat") != "kernel":
            continue
        a = e.get("args", {})
        smem = a.get("shared memory", 0)
        rows.append(
            (
                e["name"][:70],
                a.get("grid"),
                a.get("block"),
                a.get("registers per thread"),
                smem,
                a.get("warps per SM"),
                e.get("dur"),
            )
        )
    return rows


def main(argv):
    if not argv:
        print(__doc__)
        return 2
    import torch

    for spec in argv:
        op, m, n, dt = spec.split(",")
        args = case_args(op, int(m), int(n), getattr(torch, dt))
        for name, fn in providers(op).items():
            ctx = None
            if isinstance(fn, tuple):  # (fn, context), as FlagGems' use_gems
                fn, ctx = fn
            try:
                if ctx is None:
                    rows = kernels(fn, args)
                else:
                    with ctx():
                        rows = kernels(fn, args)
            except Exception as e:
                print(f"{spec} {name}: {type(e).__name__}: {e}")
                continue
            for k, grid, block, regs, smem, warps, us in rows:
                print(
                    f"{spec:24s} {name:9s} grid {grid} block {block} "
                    f"regs {regs} smem {smem} warps/SM {warps} "
                    f"{us} us  {k}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
