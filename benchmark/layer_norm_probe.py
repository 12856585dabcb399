"""Bisects LayerNorm kernel time: each kernel of one call, from
torch.profiler with L2 warm and no host gaps (the benchmark's do_bench
adds the L2 flush's write-back and any host-bound gaps). Cases: the
backward with all outputs, each output alone, deterministic mode; torch's
own backward; a copy of the same bytes as the ceiling.
usage: python benchmark/layer_norm_probe.py [MxN ...]"""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import gemsops

SHAPES = [(16384, 4096), (8192, 8192), (4096, 768), (2048, 16384),
          (256, 262144), (200000, 64)]


def kernel_us(fn, reps=10):
    """Mean GPU time per call, summed over the call's kernels, and the
    per-kernel split (name prefix -> us)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    split = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            key = e.name.split("<")[0].split("(")[0][-40:]
            split[key] = split.get(key, 0.0) + e.device_time / reps
    return sum(split.values()), split


def main():
    shapes = SHAPES
    if len(sys.argv) > 1:
        shapes = [tuple(int(v) for v in a.split("x")) for a in sys.argv[1:]]
    print(f"{'case':40s} {'us':>8} {'GB/s':>7} {'/copy':>6}  kernels (us)")
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for m, n in shapes:
            x = torch.randn(m, n, dtype=dtype, device="cuda")
            w = torch.randn(n, dtype=dtype, device="cuda")
            b = torch.randn(n, dtype=dtype, device="cuda")
            g = torch.randn_like(x)
            y = torch.empty_like(x)
            _, mean, rstd = gemsops.native_layer_norm(x, (n,), w, b)
            tm = mean.view(m, 1)
            tr = rstd.view(m, 1)
            nbytes = 3 * m * n * x.element_size()
            big = torch.empty(nbytes // 8, dtype=torch.float32, device="cuda")
            big2 = torch.empty_like(big)
            copy_t, _ = kernel_us(lambda: big2.copy_(big))
            copy_gbs = 2 * big.numel() * 4 / copy_t / 1e3
            cases = [
                ("bwd full", lambda: gemsops.layer_norm_backward(
                    g, x, (n,), mean, rstd, w, b)),
                ("bwd dx only", lambda: gemsops.layer_norm_backward(
                    g, x, (n,), mean, rstd, w, b, (True, False, False))),
                ("bwd deterministic", lambda: gemsops.layer_norm_backward(
                    g, x, (n,), mean, rstd, w, b, deterministic=True)),
                ("torch native_layer_norm_backward", lambda: torch.ops.aten.
                 native_layer_norm_backward(g, x, (n,), tm, tr, w, b,
                                            (True, True, True))),
                ("fwd", lambda: gemsops.layer_norm(x, (n,), w, b)),
            ]
            print(f"-- {str(dtype)[6:]} {m}x{n}: copy {copy_gbs:.0f} GB/s")
            for name, fn in cases:
                t, split = kernel_us(fn)
                moved = nbytes if name != "fwd" else nbytes * 2 // 3
                gbs = moved / t / 1e3
                kern = ", ".join(f"{k} {v:.1f}" for k, v in split.items())
                print(f"{name:40s} {t:8.1f} {gbs:7.0f} {gbs / copy_gbs:6.1%}  "
                      f"{kern}", flush=True)
            del x, g, y, big, big2


if __name__ == "__main__":
    main()
