"""Diagnostics for the full product: gemsops vs torch (fp32) vs float64 on
long near-one inputs, and per-layout kernel times (torch.profiler)."""
import sys

import torch

import gemsops

torch.manual_seed(0)
for n in (1 << 20, 1 << 22, 1 << 25, 1 << 27):
    spread = 8 / n ** 0.5
    x = torch.empty(n, dtype=torch.float64, device="cuda").uniform_(1 - spread, 1 + spread)
    x = (x / x.log().mean().exp()).float()
    ref = x.double().prod().item()
    ours = gemsops.prod(x).item()
    theirs = torch.prod(x).item()
    # our split structure, emulated with torch: products of interleaved pieces
    print(f"n=2^{n.bit_length()-1}: ref {ref:.6f} gemsops {ours:.6f} "
          f"({ours/ref-1:+.2e}) torch {theirs:.6f} ({theirs/ref-1:+.2e})")
    ones = torch.ones(n, device="cuda")
    print("   prod(ones) =", gemsops.prod(ones).item(),
          " prod(2 at one place) =", gemsops.prod(torch.where(
              torch.arange(n, device='cuda') == n // 3, 2.0, ones)).item())
if len(sys.argv) > 1:
    from torch.profiler import profile, ProfilerActivity
    cases = [((1 << 28,), None), ((4096, 4096), 1), ((4096, 4096), 0),
             ((64, 4096, 64), 1), ((1024, 65536), 1), ((65536, 1024), 1)]
    for dt in (torch.bfloat16, torch.float32):
        for shape, dim in cases:
            x = torch.ones(shape, dtype=dt, device="cuda")
            f = (lambda: gemsops.prod(x)) if dim is None else (lambda: gemsops.prod(x, dim))
            for _ in range(3):
                f()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    f()
                torch.cuda.synchronize()
            ev = {}
            for e in prof.events():
                if e.device_type.name == "CUDA":
                    ev.setdefault(e.name[:40], []).append(e.device_time)
            print(dt, shape, dim, {k: round(sum(v) / len(v), 1) for k, v in ev.items()})
