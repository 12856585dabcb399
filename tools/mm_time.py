"""Kernel time of gemsops.matmul and torch.matmul on a few shapes, in the
line format tools/ab_modules.sh compares across modules: `case gems Xus`
and `case torch Yus`, each the mean GPU time of the kernels one call
launches (tools/mm_probe.py's kernel_us: torch.profiler, L2 flushed by a
zero_(), the flush not counted). Each result is first checked against a
float64 product.

usage: python -m tools.mm_time M,N,K[:dtype[:layout]] ...
  (tools/mm_probe.py's case syntax)
  e.g. AB_TIMER="python3 -m tools.mm_time" bash tools/ab_modules.sh \\
           "a.so.gz b.so.gz" "5888,6656,512 8192,2304,768:float16"
"""

import sys

import torch

import gemsops
from tools.mm_probe import kernel_us, operands, product_error


def main(cases):
    if not cases:
        print(__doc__)
        return 2
    for case in cases:
        (m, n, k, dt, layout), a, b, c = operands(case)
        torch.backends.cuda.matmul.allow_tf32 = dt == "tf32"
        err = product_error(a, b)
        if not err < 1e-2:
            print(f"{case:30s} WRONG: relative error {err:.1e}", flush=True)
            continue
        us = kernel_us(lambda: gemsops.matmul(a, b))
        print(f"{case:30s} gems {us:9.2f}us", flush=True)
        us = kernel_us(lambda: torch.matmul(a, b))
        print(f"{case:30s} torch {us:9.2f}us", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
