"""Every plan of a few shapes, timed: each wgmma tile width forced under
the data-parallel, stream-k, hybrid and split-k schedules, kernels alone
(tools/mm_probe.py's kernel_us: torch.profiler, L2 flushed, the flush not
counted), beside torch.matmul's kernel and the plan the planner picks on
its own. Each forced result is first checked against a float64 product.
Where tools/mm_calibrate.py times a fixed grid for the cost model's fit,
this answers "is there a better plan for this shape than the one taken?".

usage: python tools/mm_plans.py M,N,K[:dtype] [...]
  GEMSOPS_PLANS_WIDTHS=wgmma-64x64,wgmma-64: those tiles alone (any
    mainloop name: wgmma-pingpong,wgmma-128 times the two 128 x 128
    kernels; pingpong runs any schedule as whole tiles)
  GEMSOPS_PLANS_SCHEDULES=data-parallel,stream-k: those schedules alone
  dtype: bfloat16 (default) or float16
One line a shape: torch's time, the planner's own (width, tiles split),
then width/schedule time for each plan."""

import os
import sys

import torch

import gemsops
from gemsops.ops.matmul import WGMMA_TILES
from tools.mm_probe import kernel_us

WIDTHS = WGMMA_TILES
if os.environ.get("GEMSOPS_PLANS_WIDTHS"):  # a comma-separated subset
    WIDTHS = tuple(os.environ["GEMSOPS_PLANS_WIDTHS"].split(","))
SCHEDULES = ("data-parallel", "stream-k", "hybrid", "split-k")
if os.environ.get("GEMSOPS_PLANS_SCHEDULES"):
    SCHEDULES = tuple(os.environ["GEMSOPS_PLANS_SCHEDULES"].split(","))


def plan_of(a, b):
    c = torch.empty(1, a.shape[0], b.shape[1], device="cuda", dtype=a.dtype)
    p = gemsops._C.matmul_plan(a[None], b[None], c, 0, 0, 0, 0)
    split = f" x{p['split']}" if p["split"] else ""
    return f"{p['mainloop']} {p['tiles']}t {p['sk_tiles']}sk{split}"


def main(cases):
    for case in cases:
        dims, _, dt = case.partition(":")
        m, n, k = (int(v) for v in dims.split(","))
        dtype = getattr(torch, dt or "bfloat16")
        a = torch.randn(m, k, device="cuda", dtype=dtype)
        b = torch.randn(k, n, device="cuda", dtype=dtype)
        ref = a.double() @ b.double()
        theirs = kernel_us(lambda: a @ b)
        ours = kernel_us(lambda: gemsops.matmul(a, b))
        out = [
            f"{m}x{n}x{k} {dtype}: torch {theirs:.1f}",
            f"auto ({plan_of(a, b)}) {ours:.1f}",
        ]
        try:
            for width in WIDTHS:
                for schedule in SCHEDULES:
                    gemsops.set_schedule(schedule, mainloop=width)
                    got = gemsops.matmul(a, b).double()
                    err = ((got - ref).norm() / ref.norm()).item()
                    if not err < 1e-2:
                        raise AssertionError(
                            f"{width} {schedule}: relative error {err:.2e}"
                        )
                    us = kernel_us(lambda: gemsops.matmul(a, b))
                    tag = "sp" if schedule == "split-k" else schedule[:2]
                    out.append(f"{width[6:]}/{tag} {us:.1f}")
        finally:
            gemsops.set_schedule()
        print(" ".join(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
