"""Measurements for the matmul planner's cost model: each shape of a grid
timed with every wgmma tile width forced ('wgmma-256', 'wgmma-192',
'wgmma-128', 'wgmma-64') under the forced hybrid and data-parallel
schedules, one JSON line per distinct (shape, width, schedule): the
schedule the planner made (matmul_plan's dict) and the kernel's median
time by the benchmark's do_bench (L2 flushed; gemsops.matmul's host path
is shorter than the flush, so the window holds the kernel alone).

usage: python tools/mm_calibrate.py [--dtype bfloat16] [--out FILE]
The fit of these lines is tools/mm_cost_fit.py; its constants are the ones
csrc/cuda/matmul_cost.cuh writes down."""

import argparse
import itertools
import json
import sys

import torch

import gemsops
from benchmark.performance_utils import do_bench
from gemsops.ops.matmul import MAINLOOPS
from gemsops.ops.matmul import SCHEDULES as SCHEDS

MS = (256, 512, 1024, 1536, 2048, 3072, 4096, 8192)
NS = (768, 1024, 1792, 2304, 3072, 4096, 6144)
KS = (256, 768, 2048, 6016)
LOOPS = ("wgmma-256", "wgmma-192", "wgmma-128", "wgmma-64")
SCHEDULES = ("hybrid", "data-parallel")


def main():
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--dtype", default="bfloat16")
    cli.add_argument("--out", help="append the JSON lines to this file")
    args = cli.parse_args()
    dtype = getattr(torch, args.dtype)
    sink = open(args.out, "a") if args.out else sys.stdout
    warm = torch.randn(256, 256, device="cuda", dtype=dtype)
    for schedule in SCHEDULES:  # first launches load modules, make buffers
        gemsops.set_schedule(schedule)
        gemsops.matmul(warm, warm)
    torch.cuda.synchronize()
    for m, n, k in itertools.product(MS, NS, KS):
        a = torch.randn(m, k, device="cuda", dtype=dtype)
        b = torch.randn(k, n, device="cuda", dtype=dtype)
        c = torch.empty(1, m, n, device="cuda", dtype=dtype)
        seen = []
        for loop, schedule in itertools.product(LOOPS, SCHEDULES):
            plan = gemsops._C.matmul_plan(
                a[None], b[None], c, SCHEDS[schedule], 0, 0, MAINLOOPS[loop]
            )
            if plan in seen:  # a full last wave: hybrid is data-parallel
                continue
            seen.append(plan)
            gemsops.set_schedule(schedule, mainloop=loop)
            ms = do_bench(lambda: gemsops.matmul(a, b), rep_ms=40)
            row = dict(m=m, n=n, k=k, dtype=args.dtype, us=ms * 1e3, **plan)
            print(json.dumps(row), file=sink, flush=True)
    gemsops.set_schedule()


if __name__ == "__main__":
    main()
