"""Measurements for the matmul planner's cost model: each shape of a grid
timed with every wgmma tile forced ('wgmma-256', 'wgmma-192',
'wgmma-128', 'wgmma-64', 'wgmma-64x64') under the forced hybrid and
data-parallel schedules, one JSON line per distinct (shape, tile,
schedule): the schedule the planner made (matmul_plan's dict) and the
kernel's median time by the benchmark's do_bench (L2 flushed;
gemsops.matmul's host path is shorter than the flush, so the window holds
the kernel alone).

usage: python tools/mm_calibrate.py [--dtype bfloat16] [--out FILE]
                                   [--loops wgmma-64x64,...] [--small]
--small: a grid of smaller sizes as well (M and N from 256, K from 512:
the outputs of few tiles, where the 64 x 64 tiles compete).
The fit of these lines is tools/mm_cost_fit.py; its constants are the ones
csrc/cuda/matmul_cost.cuh writes down."""

import argparse
import itertools
import json
import sys

import torch

import gemsops
from benchmark.performance_utils import do_bench
from gemsops.ops.matmul import MAINLOOPS, WGMMA_TILES
from gemsops.ops.matmul import SCHEDULES as SCHEDS

MS = (256, 512, 1024, 1536, 2048, 3072, 4096, 8192)
NS = (768, 1024, 1792, 2304, 3072, 4096, 6144)
KS = (256, 768, 2048, 6016)
SMALL_MS = (256, 512, 768, 1280)
SMALL_NS = (256, 512, 1280)
SMALL_KS = (512, 1536, 2560, 4096)
LOOPS = WGMMA_TILES
SCHEDULES = ("hybrid", "data-parallel")


def main():
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--dtype", default="bfloat16")
    cli.add_argument("--out", help="append the JSON lines to this file")
    cli.add_argument("--loops", default=",".join(LOOPS))
    cli.add_argument("--small", action="store_true")
    args = cli.parse_args()
    loops = args.loops.split(",")
    shapes = list(itertools.product(MS, NS, KS))
    if args.small:
        shapes += list(itertools.product(SMALL_MS, SMALL_NS, SMALL_KS))
    dtype = getattr(torch, args.dtype)
    sink = open(args.out, "a") if args.out else sys.stdout
    warm = torch.randn(256, 256, device="cuda", dtype=dtype)
    for schedule in SCHEDULES:  # first launches load modules, make buffers
        gemsops.set_schedule(schedule)
        gemsops.matmul(warm, warm)
    torch.cuda.synchronize()
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=dtype)
        b = torch.randn(k, n, device="cuda", dtype=dtype)
        c = torch.empty(1, m, n, device="cuda", dtype=dtype)
        seen = []
        for loop, schedule in itertools.product(loops, SCHEDULES):
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
