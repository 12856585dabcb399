"""Host cost of the pieces of one small gemsops.matmul call (µs per call,
timeit on the device's host), to see where the Python layer spends it.
Usage: python tools/host_pieces.py"""
import timeit

import torch

import gemsops
from gemsops.ops import matmul as mmod


def us(stmt, n=2000):
    stmt()
    return min(timeit.repeat(stmt, number=n, repeat=3)) / n * 1e6


def main():
    a = torch.randn(384, 384, device="cuda", dtype=torch.float16)
    b = torch.randn(384, 384, device="cuda", dtype=torch.float16)
    c = torch.empty(384, 384, device="cuda", dtype=a.dtype)
    dev = a.device
    rows = [
        ("torch.matmul", lambda: torch.matmul(a, b)),
        ("gemsops.matmul", lambda: gemsops.matmul(a, b)),
        ("gemsops.mm", lambda: gemsops.mm(a, b)),
        ("_mm", lambda: mmod._mm(a, b)),
        ("_C.matmul (data-parallel)",
         lambda: gemsops._C.matmul(a, b, c, 1, False, 0, 0, None, None, 0, 0,
                                   None)),
        ("_C.matmul_plan", lambda: gemsops._C.matmul_plan(a[None], b[None],
                                                          c[None], 1, False,
                                                          0, 0)),
        ("torch.empty(c)", lambda: torch.empty((384, 384), dtype=a.dtype,
                                               device=dev)),
        ("a.shape[:-1] + b.shape[-1:]", lambda: a.shape[:-1] + b.shape[-1:]),
        ("torch.cuda.current_stream(dev)", lambda: torch.cuda.current_stream(dev)),
        ("torch.cuda.current_stream()", lambda: torch.cuda.current_stream()),
        ("torch.broadcast_shapes", lambda: torch.broadcast_shapes(a.shape[:-2],
                                                                  b.shape[:-2])),
        ("_stream_buffers", lambda: mmod._stream_buffers(0, (1 << 20, 132, 0))),
        ("a.unsqueeze(0)", lambda: a.unsqueeze(0)),
        ("expand+reshape", lambda: a.expand((384, 384)).reshape(-1, 384, 384)),
        ("torch.is_grad_enabled", lambda: torch.is_grad_enabled()),
    ]
    for name, fn in rows:
        print(f"{name:>32}: {us(fn):7.2f} us", flush=True)
    for sched in ("data-parallel", "hybrid"):
        gemsops.set_schedule(sched)
        print(f"{'gemsops.mm ' + sched:>32}: "
              f"{us(lambda: gemsops.mm(a, b)):7.2f} us", flush=True)
    gemsops.set_schedule("auto")
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
