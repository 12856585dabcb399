"""Is the zero_() flush's cost inside the timed window paid by the kernel's
own evictions, or by L2 cleaning its dirty lines in the background? Times
prod on the innermost-row shapes three ways: after triton's zero_() flush,
after the same flush plus an idle gap (torch.cuda._sleep) before the start
event, and after a read-only flush. usage: python tools/writeback_probe.py"""
import torch

import gemsops

CASES = [((1024, 65536), 1, torch.float16), ((65536, 1024), 1, torch.float16),
         ((1024, 65536), 1, torch.float32), ((1 << 28,), None, torch.float16)]
cache = torch.empty(1 << 26, dtype=torch.int32, device="cuda")
rbuf = torch.empty(2, 1 << 25, dtype=torch.float32, device="cuda").normal_()


def median_us(fn, flush, gap_cycles, reps=60):
    times = []
    for _ in range(reps):
        flush()
        if gap_cycles:
            torch.cuda._sleep(gap_cycles)
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    times.sort()
    return times[len(times) // 2]


flushes = {
    "zero": (lambda: cache.zero_(), 0),
    "zero+gap": (lambda: cache.zero_(), 200000),
    "read": (lambda: torch.sum(rbuf[0], 0, out=rbuf[1][:1].squeeze(0)), 0),
}
src = torch.empty(1 << 28, device="cuda").normal_()
dst = torch.empty_like(src)
for name, (fl, gap) in flushes.items():
    t = median_us(lambda: dst.copy_(src), fl, gap, reps=20)
    gbps = 2 * src.numel() * 4 / t / 1e3
    print(f"copy 1 GiB  {name:9s} {t:8.1f} us {gbps:6.0f} GB/s")
for shape, dim, dt in CASES:
    x = torch.empty(shape, device="cuda").uniform_(0.999, 1.001).to(dt)
    args = () if dim is None else (dim,)
    nb = x.numel() * x.element_size()
    line = f"{str(shape):16s} {str(dt)[6:]:8s}"
    for who, fn in (("gems", lambda: gemsops.prod(x, *args)),
                    ("torch", lambda: torch.prod(x, *args))):
        cells = []
        for name, (fl, gap) in flushes.items():
            t = median_us(fn, fl, gap)
            cells.append(f"{name} {t:6.1f}us {nb / t / 1e3:5.0f}GB/s")
        print(line, who, " | ".join(cells), flush=True)
