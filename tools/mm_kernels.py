"""Which kernels torch.matmul (cuBLAS) and gemsops.matmul launch for a few
shapes, each kernel's name, launch grid and block, and its mean GPU time
(torch.profiler, L2 flushed by a zero_() before each call, the flush not
counted). cuBLAS's kernel names carry its tile, cluster and split-k
choices: the answer to "what does the peer run where we lose?".

usage: python -m tools.mm_kernels M,N,K[:dtype[:layout]] [...]
  (tools/mm_probe.py's cases: dtype bfloat16 by default, layout nn)"""

import json
import sys
import tempfile

import torch

import gemsops
from tools.mm_probe import operands, profile_flushed


def kernels(fn, reps=20):
    """[(name, mean us a call, launches a call, grid, block)] of the kernels
    fn() launches, from the profiler's trace."""
    prof = profile_flushed(fn, reps)
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.load(open(f.name))
    seen = {}
    for e in trace.get("traceEvents", []):
        if e.get("cat") != "kernel" or "FillFunctor" in e.get("name", ""):
            continue
        args = e.get("args", {})
        key = (e["name"], str(args.get("grid")), str(args.get("block")))
        us, n = seen.get(key, (0.0, 0))
        seen[key] = (us + e.get("dur", 0.0), n + 1)
    return [
        (name, us / reps, n // reps, grid, block)
        for (name, grid, block), (us, n) in seen.items()
    ]


def main(cases):
    for case in cases:
        (m, n, k, dt, _), a, b, _ = operands(case)
        torch.backends.cuda.matmul.allow_tf32 = dt == "tf32"
        c = torch.empty(1, m, n, device="cuda", dtype=a.dtype)
        p = gemsops._C.matmul_plan(a[None], b[None], c, 0, 0, 0, 0)
        print(f"{m}x{n}x{k} {dt}", flush=True)
        sides = (
            ("torch", lambda: a @ b),
            ("gemsops", lambda: gemsops.matmul(a, b)),
        )
        for who, fn in sides:
            for name, us, calls, grid, block in kernels(fn):
                print(
                    f"  {who:7s} {us:7.2f} us x{calls} grid {grid} block "
                    f"{block} {name[:150]}",
                    flush=True,
                )
        print(
            f"  plan: {p['mainloop']} bm {p.get('bm')} bn {p.get('bn')} "
            f"tiles {p['tiles']} sk {p['sk_tiles']} split {p['split']} "
            f"ctas {p.get('ctas')}",
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
