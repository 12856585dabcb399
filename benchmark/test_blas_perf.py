"""mm: gemsops (Stream-K, each schedule) vs torch.matmul (cuBLAS).

Cases: FlagGems' core mm shapes (384^3 .. 4096^3, and batched), the shapes
tests/test_matmul.py runs on CUDA, and a corpus (M, N, K log-uniform in
256..8192, rounded to 256, fixed seed; GEMSOPS_BENCH_CORPUS shapes, 200 by
default). TFLOP/s = 2 M N K batch / time. Prints the geomean speedup vs
torch per dtype and schedule, and each schedule against data-parallel.
GEMSOPS_BENCH_SCHEDULES and GEMSOPS_BENCH_MAINLOOPS (comma lists) pick the
configurations: every mainloop with every schedule."""

import math
import os
import random

import pytest
import torch

import gemsops

from .performance_utils import Benchmark, _rows

DTYPES = [torch.float16, torch.bfloat16]
CORE = [
    (1, 384, 384, 384),
    (1, 1024, 1024, 1024),
    (1, 2048, 2048, 2048),
    (1, 4096, 4096, 4096),
    (8, 1024, 1024, 1024),
]
TESTS = [
    (1, 1536, 1792, 6016),
    (1, 512, 1024, 4096),
    (1, 16, 2560, 8192),
    (1, 8, 8192, 8192),
    (1, 2304, 5632, 3328),
    (1, 495, 5333, 71),
]


def corpus(count):
    """`count` distinct shapes of the seeded log-spaced draw."""
    rng = random.Random(20261122)

    def pick():
        return max(256, round(2 ** rng.uniform(8, 13) / 256) * 256)

    shapes = []
    while len(shapes) < count:
        s = (1, pick(), pick(), pick())
        if s not in shapes:
            shapes.append(s)
    return shapes


CASES = CORE + TESTS + corpus(int(os.environ.get("GEMSOPS_BENCH_CORPUS", 200)))
SCHEDULE_NAMES = os.environ.get(
    "GEMSOPS_BENCH_SCHEDULES", "data-parallel,hybrid"
).split(",")
MAINLOOP_NAMES = os.environ.get("GEMSOPS_BENCH_MAINLOOPS", "auto").split(",")
# (label, mainloop, schedule); the label is the schedule for 'auto'
CONFIGS = [
    (s if m == "auto" else f"{m}/{s}", m, s)
    for m in MAINLOOP_NAMES
    for s in SCHEDULE_NAMES
]


def mm_args(dtype, case):
    b, m, n, k = case
    shape_a = (m, k) if b == 1 else (b, m, k)
    shape_b = (k, n) if b == 1 else (b, k, n)
    return (
        torch.randn(shape_a, dtype=dtype, device="cuda"),
        torch.randn(shape_b, dtype=dtype, device="cuda"),
    )


def flops(dtype, case):
    b, m, n, k = case
    return 2 * b * m * n * k


def geomean(xs):
    return (
        math.exp(sum(math.log(x) for x in xs) / len(xs))
        if xs
        else float("nan")
    )


@pytest.mark.matmul
def test_perf_mm_schedules():
    speed = {}
    for label, mainloop, name in CONFIGS:
        gemsops.set_schedule(name, mainloop=mainloop)
        op = "mm_" + label.replace("/", "_")
        Benchmark(
            op,
            torch.matmul,
            gemsops.matmul,
            mm_args,
            DTYPES,
            CASES,
            flops_func=flops,
            result_file=op,
        ).run()
        for r in _rows:
            if r["op"] == op:
                speed[(label, r["dtype"], tuple(r["shape"]))] = r["speedup"]
    gemsops.set_schedule("auto")
    print("\ngeomean speedup vs torch.matmul (cuBLAS):")
    for dtype in DTYPES:
        d = str(dtype).replace("torch.", "")
        for label, _mainloop, _name in CONFIGS:
            xs = [
                v for (s, dt, _), v in speed.items() if s == label and dt == d
            ]
            print(
                f"  {d:>9} {label:>24}: {geomean(xs):.3f} over {len(xs)} cases"
            )
        for label, _mainloop, name in CONFIGS:
            base = label.replace(name, "data-parallel")
            if label == base:
                continue
            ratios = [
                speed[(label, d, c)] / speed[(base, d, c)]
                for (s, dt, c) in speed
                if s == label and dt == d and (base, d, c) in speed
            ]
            print(
                f"  {d:>9} {label:>24} / data-parallel: {geomean(ratios):.3f}"
            )


def mm_args_nt(dtype, case):
    """nn.Linear's layout: B is a [n, k] weight's transpose (K-major)."""
    b, m, n, k = case
    lead = () if b == 1 else (b,)
    return (
        torch.randn(lead + (m, k), dtype=dtype, device="cuda"),
        torch.randn(lead + (n, k), dtype=dtype, device="cuda").mT,
    )


@pytest.mark.matmul
def test_perf_mm_tf32():
    """fp32 with TF32 allowed for both (torch.backends.cuda.matmul
    .allow_tf32): torch.matmul's row-major B (staged transposed by gemsops:
    TF32 wgmma reads K-major operands) and nn.Linear's K-major one. The
    core and test shapes and the first GEMSOPS_BENCH_TF32_CORPUS (40)
    corpus shapes."""
    count = int(os.environ.get("GEMSOPS_BENCH_TF32_CORPUS", 40))
    cases = CORE + TESTS + corpus(200)[:count]
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    speed = {}
    try:
        for op, make in (("mm_tf32", mm_args), ("mm_tf32_nt", mm_args_nt)):
            Benchmark(
                op,
                torch.matmul,
                gemsops.matmul,
                make,
                [torch.float32],
                cases,
                flops_func=flops,
                result_file=op,
            ).run()
            speed[op] = [r["speedup"] for r in _rows if r["op"] == op]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    print("\ngeomean speedup vs torch.matmul, fp32 with TF32 allowed:")
    for op, xs in speed.items():
        print(f"  {op:>12}: {geomean(xs):.3f} over {len(xs)} cases")
