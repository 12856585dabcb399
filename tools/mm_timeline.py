"""Where the time of a small matmul goes: the GPU timeline of do_bench's
pattern (a 256 MB L2 flush, then one product) under torch.profiler. For each
provider and shape, medians over 30 repeats of: the product's kernel time
(all kernels between two flushes), the idle gap between the flush's end and
the first kernel of the product, and do_bench's own median for comparison.
Usage: python tools/mm_timeline.py [schedule]"""
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

import gemsops

SHAPES = [(384, 384, 384), (512, 512, 512), (768, 512, 512), (256, 1024, 256),
          (768, 768, 768), (512, 2304, 512), (2048, 512, 256), (4096, 4096, 4096)]


def timeline(fn, flush, reps=30):
    for _ in range(3):
        flush.zero_()
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush.zero_()
            fn()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events()
                      if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    # split at the flush kernels (the ones writing 256 MB: longest, 'fill')
    groups, cur, names = [], None, set()
    for e in kernels:
        big = e.time_range.elapsed_us() > 20
        if big and ("fill" in e.name.lower() or "zero" in e.name.lower()):
            if cur:
                groups.append(cur)
            cur = [e, []]
        elif cur is not None:
            cur[1].append(e)
            names.add(e.name[:60])
    if cur:
        groups.append(cur)
    busy, gap = [], []
    for f, ks in groups:
        if not ks:
            continue
        busy.append(ks[-1].time_range.end - ks[0].time_range.start)
        gap.append(ks[0].time_range.start - f.time_range.end)
    return statistics.median(busy), statistics.median(gap), len(groups), names


def main(schedule="data-parallel", dtype=torch.float16):
    gemsops.set_schedule(schedule)
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    for m, n, k in SHAPES:
        a = torch.randn(m, k, device="cuda", dtype=dtype)
        b = torch.randn(k, n, device="cuda", dtype=dtype)
        for name, fn in (("torch", lambda: torch.matmul(a, b)),
                         ("gemsops", lambda: gemsops.matmul(a, b))):
            busy, gap, n_groups, names = timeline(fn, flush)
            ms = do_bench(fn, warmup=10, rep=50)
            print(f"{schedule} {m}x{n}x{k} {name:>8}: kernels {busy:7.1f} us, "
                  f"gap after flush {gap:6.1f} us, do_bench {ms * 1e3:7.1f} us "
                  f"({n_groups} reps; {sorted(names)})", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:2])
