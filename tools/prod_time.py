"""Forward prod kernel times for A/B runs: gemsops, torch and (when it
imports) FlagGems, each through the benchmark's do_bench (same flush), one
line per case.

usage: python -m tools.prod_time [case ...]
  case = d0,d1,...:which:dtype with which = all or dN, e.g.
  4096,4096:d1:float16  268435456:all:bfloat16
  PROD_CALLS=N: only call each provider N times, untimed (for ncu)
  PROD_KERNELS=1: also print gemsops' kernel times from torch.profiler"""

import os
import sys

DEFAULT = [
    "268435456:all:float16",
    "1048576:all:float16",
    "1048576:all:float32",
    "4096,4096:d1:float16",
    "1024,65536:d1:float16",
    "65536,1024:d1:float16",
    "4096,4096:d1:float32",
    "65536,1024:d1:float32",
    "64,4096,64:d1:float32",
    "4096,4096:d0:float16",
]


def kernel_times(fn):
    """Mean device time per kernel name over 10 calls of fn (µs)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    ev = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            name = e.name.split("(")[0][-40:]
            ev.setdefault(name, []).append(e.device_time)
    return {k: round(sum(v) / len(v), 1) for k, v in ev.items()}


def time_case(case, flag_gems):
    import torch

    import gemsops
    from benchmark.performance_utils import do_bench

    sizes, which, dt = case.split(":")
    shape = [int(s) for s in sizes.split(",")]
    dim = None if which == "all" else int(which[1:])
    x = torch.empty(shape, device="cuda").uniform_(0.999, 1.001)
    x = x.to(getattr(torch, dt))
    args = () if dim is None else (dim,)
    ref = torch.prod(x.double(), *args)
    got = gemsops.prod(x, *args)
    ok = torch.allclose(got.double(), ref, rtol=1e-2)
    calls = int(os.environ.get("PROD_CALLS", "0"))
    if calls:
        for _ in range(calls):
            gemsops.prod(x, *args)
        if flag_gems is not None:
            with flag_gems.use_gems():
                for _ in range(calls):
                    torch.prod(x, *args)
        torch.cuda.synchronize()
        return
    t = {
        "gems": do_bench(lambda: gemsops.prod(x, *args)),
        "torch": do_bench(lambda: torch.prod(x, *args)),
    }
    if flag_gems is not None:
        with flag_gems.use_gems():
            t["flaggems"] = do_bench(lambda: torch.prod(x, *args))
    if os.environ.get("PROD_KERNELS"):
        print("   kernels:", kernel_times(lambda: gemsops.prod(x, *args)))
    gb = x.numel() * x.element_size() / 1e9
    print(
        f"{case:28s} "
        + "  ".join(
            f"{k} {v * 1e3:7.1f} us {gb / v * 1e3:6.0f} GB/s"
            for k, v in t.items()
        )
        + ("" if ok else "  WRONG"),
        flush=True,
    )


def main(argv):
    try:
        import flag_gems
    except Exception:  # absent, or present without a usable GPU stack
        flag_gems = None
    for case in argv or DEFAULT:
        time_case(case, flag_gems)


if __name__ == "__main__":
    main(sys.argv[1:])
