"""Runs one matmul shape a few times (for ncu / nsys) and prints TFLOP/s of
gemsops and torch from CUDA events: python tools/mm_probe.py M N K
[dtype] [mainloop] [schedule]."""
import sys

import torch

import gemsops

m, n, k = (int(x) for x in sys.argv[1:4])
dtype = getattr(torch, sys.argv[4] if len(sys.argv) > 4 else "float16")
mainloop = sys.argv[5] if len(sys.argv) > 5 else "auto"
sched = sys.argv[6] if len(sys.argv) > 6 else "auto"
gemsops.set_schedule(sched, mainloop=mainloop)
a = torch.randn(m, k, device="cuda", dtype=dtype)
b = torch.randn(k, n, device="cuda", dtype=dtype)
for name, fn in (("gemsops", gemsops.mm), ("torch", torch.mm)):
    fn(a, b)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(True), torch.cuda.Event(True)
    start.record()
    for _ in range(5):
        fn(a, b)
    end.record()
    torch.cuda.synchronize()
    t = start.elapsed_time(end) / 5 * 1e-3
    print(f"{name} {m}x{n}x{k} {dtype} {mainloop}: {2 * m * n * k / t / 1e12:.1f} TFLOP/s")
