"""Time gemsops.matmul against torch.matmul (cuBLAS) on a few shapes, each
by the benchmark's do_bench (L2 flushed), one line a shape: the mainloop
the planner picks, both times, TFLOP/s and torch's time over ours; then
the GPU time of the kernels alone (torch.profiler, L2 flushed, the flush's
own kernel left out), which host time cannot inflate.

usage: python tools/mm_probe.py [M,N,K[:dtype[:layout[:bias]]] ...]
  layout: nn (default), nt (B given as [N, K] transposed), tn (A as
  [K, M] transposed); dtype: bfloat16 (default), float16, float32,
  tf32 (float32 with TF32 allowed, for torch and gemsops alike);
  bias: addmm with an [N] bias (gemsops.addmm against torch.addmm)
  e.g. python tools/mm_probe.py 8192,8192,8192 3072,3072,3072:float16
With no shapes: a list covering large squares, wave-quantized and small
ones, and K not a multiple of 8."""

import os
import sys

import torch

import gemsops
from benchmark.performance_utils import do_bench

DEFAULT = [
    "8192,8192,8192",
    "4096,4096,4096",
    "3072,3072,3072",
    "1536,1792,6016",
    "1536,3584,6016",
    "2048,2048,2048",
    "1024,1024,1024",
    "512,1024,4096",
    "8192,768,768",
    "8192,2304,768",
    "8192,768,3072",
    "495,5333,71",
]


def operands(case):
    fields = case.split(":")
    dims, dt, layout, bias = fields + ["bfloat16", "nn", ""][len(fields) - 1 :]
    m, n, k = (int(v) for v in dims.split(","))
    dtype = getattr(torch, "float32" if dt == "tf32" else dt)
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    if layout[0] == "t":
        a = torch.randn(k, m, device="cuda", dtype=dtype).t()
    if layout[1] == "t":
        b = torch.randn(n, k, device="cuda", dtype=dtype).t()
    c = torch.randn(n, device="cuda", dtype=dtype) if bias else None
    return (m, n, k, dt, layout + (" +bias" if bias else "")), a, b, c


def repeatable_products(case):
    """A case's name, operands and two calls to repeat: gemsops' and
    torch's product of them, each into an output of its own (out=), TF32
    set as the case asks. GEMSOPS_CHAIN_OUT=0: without out= (each call's
    output new, from the caching allocator or a graph's pool, as a
    training step's)."""
    (m, n, k, dt, _), a, b, _ = operands(case)
    torch.backends.cuda.matmul.allow_tf32 = dt == "tf32"
    name = f"{m},{n},{k}:{dt}"
    if os.environ.get("GEMSOPS_CHAIN_OUT", "1") == "0":
        return (
            name,
            (a, b),
            lambda: gemsops.matmul(a, b),
            lambda: torch.matmul(a, b),
        )
    out_g = torch.empty(m, n, device="cuda", dtype=a.dtype)
    out_t = torch.empty_like(out_g)
    return (
        name,
        (a, b),
        lambda: gemsops.matmul(a, b, out=out_g),
        lambda: torch.matmul(a, b, out=out_t),
    )


def product_error(a, b):
    """gemsops.matmul(a, b)'s error relative to a float64 product (norms)."""
    got = gemsops.matmul(a, b).double()
    ref = a.double() @ b.double()
    return ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def profile_flushed(fn, reps, events=False):
    """torch.profiler over reps calls of fn(), L2 flushed by a zero_()
    before each call as do_bench does (the flush is a FillFunctor kernel);
    events: each call between CUDA events too, as do_bench times it."""
    cache = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    start, end = torch.cuda.Event(True), torch.cuda.Event(True)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    cuda = torch.profiler.ProfilerActivity.CUDA
    with torch.profiler.profile(activities=[cuda]) as prof:
        for _ in range(reps):
            cache.zero_()
            if events:
                start.record()
            fn()
            if events:
                end.record()
        torch.cuda.synchronize()
    return prof


def kernel_us(fn, reps=20):
    """Mean GPU time (us) of the kernels one fn() launches, L2 flushed by
    a zero_() before each call as do_bench does; the flush not counted."""
    prof = profile_flushed(fn, reps)
    total = 0.0
    for e in prof.key_averages():
        if "FillFunctor" in e.key:
            continue
        total += getattr(e, "self_device_time_total", 0.0)
    return total / reps


def main(cases):
    for case in cases or DEFAULT:
        (m, n, k, dt, layout), a, b, c = operands(case)
        torch.backends.cuda.matmul.allow_tf32 = dt == "tf32"
        if c is None:
            ours, theirs = gemsops.matmul, torch.matmul
        else:
            ours = lambda a, b: gemsops.addmm(c, a, b)  # noqa: E731
            theirs = lambda a, b: torch.addmm(c, a, b)  # noqa: E731
        ref = (
            theirs(a.double(), b.double())
            if c is None
            else (torch.addmm(c.double(), a.double(), b.double()))
        )
        got = ours(a, b).double()
        err = ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()
        t_ours = do_bench(lambda: ours(a, b))
        t_torch = do_bench(lambda: theirs(a, b))
        k_ours = kernel_us(lambda: ours(a, b))
        k_torch = kernel_us(lambda: theirs(a, b))
        c = torch.empty(1, m, n, device="cuda", dtype=a.dtype)
        loop = 1 if dt == "float32" else 0  # _C's auto is TF32 for fp32
        plan = gemsops._C.matmul_plan(a[None], b[None], c, 0, 0, 0, loop)
        plan = (
            f"{plan.get('mainloop')} {plan.get('tiles')} tiles "
            f"{plan.get('sk_tiles')} split, k in {plan.get('split')}, "
            f"staged '{plan.get('staged')}'"
        )
        tf = 2 * m * n * k / 1e9
        print(
            f"{m}x{n}x{k} {dt} {layout}: gemsops {t_ours * 1e3:8.1f} us "
            f"({tf / t_ours:6.1f} TFLOP/s), torch {t_torch * 1e3:8.1f} us "
            f"({tf / t_torch:6.1f}), torch/gemsops {t_torch / t_ours:.3f}, "
            f"rel err {err:.1e} {plan}; kernels alone: gemsops "
            f"{k_ours:.1f} us, torch {k_torch:.1f} us, torch/gemsops "
            f"{k_torch / k_ours:.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
