"""Which kernels torch.matmul (cuBLAS) and gemsops.matmul launch for a few
shapes, each kernel's name, launch grid and block, and its mean GPU time
(torch.profiler, L2 flushed by a zero_() before each call, the flush not
counted). cuBLAS's kernel names carry its tile, cluster and split-k
choices: the answer to "what does the peer run where we lose?".

usage: python tools/mm_kernels.py M,N,K[:dtype] [...]
  dtype: bfloat16 (default), float16"""

import json
import sys
import tempfile

import torch

import gemsops


def kernels(fn, reps=20):
    """[(name, mean us a call, launches a call, grid, block)] of the kernels
    fn() launches, from the profiler's trace."""
    cache = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    cuda = torch.profiler.ProfilerActivity.CUDA
    with torch.profiler.profile(activities=[cuda]) as prof:
        for _ in range(reps):
            cache.zero_()
            fn()
        torch.cuda.synchronize()
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
        dims, _, dt = case.partition(":")
        m, n, k = (int(v) for v in dims.split(","))
        dtype = getattr(torch, dt or "bfloat16")
        a = torch.randn(m, k, device="cuda", dtype=dtype)
        b = torch.randn(k, n, device="cuda", dtype=dtype)
        c = torch.empty(1, m, n, device="cuda", dtype=dtype)
        p = gemsops._C.matmul_plan(a[None], b[None], c, 0, 0, 0, 0)
        print(f"{m}x{n}x{k} {dt or 'bfloat16'}", flush=True)
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
