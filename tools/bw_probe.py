"""Bandwidth of plain torch element-wise kernels with the benchmark's own
timing (performance_utils.do_bench: L2 flushed, median): the copy (read 1,
write 1) and an add (read 2, write 1, the LayerNorm backward's traffic),
as GB/s and as a fraction of the 1 GiB copy of the same run.
usage: bw_probe.py [M,N:dtype ...]"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmark"))
from performance_utils import copy_bandwidth_gbps, do_bench  # noqa: E402

cases = sys.argv[1:] or ["16384,4096:bfloat16", "8192,8192:float16",
                         "16384,4096:float32", "256,262144:float32"]
copy = copy_bandwidth_gbps()
print(f"copy (1 GiB fp32) {copy:.0f} GB/s")
for case in cases:
    sizes, dt = case.split(":")
    m, n = (int(s) for s in sizes.split(","))
    dtype = getattr(torch, dt)
    a = torch.randn(m, n, device="cuda", dtype=dtype)
    b = torch.randn_like(a)
    c = torch.empty_like(a)
    nbytes = a.numel() * a.element_size()
    ms_copy = do_bench(lambda: c.copy_(a))
    ms_add = do_bench(lambda: torch.add(a, b, out=c))
    for name, ms, k in (("copy", ms_copy, 2), ("add", ms_add, 3)):
        gbps = k * nbytes / ms / 1e6
        print(f"{case:24s} {name:4s} {ms * 1e3:8.1f}us {gbps:6.0f}GB/s "
              f"{gbps / copy:6.1%} of copy")
