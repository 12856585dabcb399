"""Kernel time of LayerNorm backward (gemsops vs torch) and prod on the
shapes that carry the bars, as a fraction of the copy bandwidth, under
both L2 flushes of benchmark/performance_utils.do_bench: triton's zero_()
flush (dirty lines written back inside the timed window) and a read-only
flush. usage: python tools/flush_probe.py [ln|prod|all]"""
import sys

import torch

sys.path.insert(0, "benchmark")
import performance_utils as pu  # noqa: E402

import gemsops  # noqa: E402

LN = [(16384, 4096), (8192, 8192), (4096, 12288), (2048, 16384),
      (1024, 65536), (256, 262144), (4096, 768), (200000, 64)]
PROD = [((1 << 28,), None), ((1024, 65536), 1), ((65536, 1024), 1),
        ((4096, 4096), 1), ((4096, 4096), 0), ((64, 4096, 64), 1)]


def timed(fn):
    out = {}
    for flush in ("zero", "read"):
        pu.FLUSH = flush
        out[flush] = pu.do_bench(fn)
    return out


def copy_gbps():
    src = torch.empty(1 << 28, dtype=torch.float32, device="cuda").normal_()
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src))
    return {k: 2 * src.numel() * 4 / v / 1e6 for k, v in t.items()}


def row(name, nbytes, times, copy):
    cells = []
    for who, t in times.items():
        cells.append(f"{who} {t['zero'] * 1e3:8.1f}/{t['read'] * 1e3:8.1f} us "
                     f"{nbytes / t['zero'] / 1e6 / copy['zero']:6.1%}/"
                     f"{nbytes / t['read'] / 1e6 / copy['read']:6.1%}")
    print(f"{name:28s} " + "  ".join(cells), flush=True)


def ln_cases(copy):
    for dtype in (torch.float16, torch.bfloat16):
        for m, n in LN:
            x = torch.randn(m, n, dtype=dtype, device="cuda",
                            requires_grad=True)
            w = torch.randn(n, dtype=dtype, device="cuda", requires_grad=True)
            b = torch.randn(n, dtype=dtype, device="cuda", requires_grad=True)
            g = torch.randn(m, n, dtype=dtype, device="cuda")
            times = {}
            for who, f in (("torch", torch.nn.functional.layer_norm),
                           ("gems", gemsops.layer_norm)):
                y = f(x, (n,), w, b)
                times[who] = timed(lambda: torch.autograd.grad(
                    y, (x, w, b), g, retain_graph=True))
            row(f"ln bwd {dtype_s(dtype)} {m}x{n}", 3 * x.numel() * 2, times,
                copy)


def prod_cases(copy):
    for dtype in (torch.float16, torch.float32):
        for shape, dim in PROD:
            x = 1 + 1e-3 * torch.randn(shape, dtype=dtype, device="cuda")
            times = {}
            for who, f in (("torch", torch.prod), ("gems", gemsops.prod)):
                times[who] = timed((lambda: f(x)) if dim is None
                                   else (lambda: f(x, dim)))
            row(f"prod {dtype_s(dtype)} {shape} d{dim}",
                x.numel() * x.element_size(), times, copy)


def dtype_s(d):
    return str(d).replace("torch.", "")


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    copy = copy_gbps()
    print(f"copy GB/s: zero-flush {copy['zero']:.0f}, read-flush "
          f"{copy['read']:.0f}; cells: zero/read flush")
    if what in ("ln", "all"):
        ln_cases(copy)
    if what in ("prod", "all"):
        prod_cases(copy)


if __name__ == "__main__":
    main()
