"""Bisects LayerNorm kernel time: the backward with each output alone, in
deterministic mode, and the forward with and without affine parameters.
Kernel time only (do_bench on direct calls, no autograd).
usage: python benchmark/layer_norm_probe.py"""
import torch
import triton.testing

import gemsops


def ms(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def main():
    print(f"{'case':44s} {'ms':>8} {'GB/s':>7}")
    for dtype in (torch.bfloat16, torch.float32):
        for m, n in ((16384, 4096), (8192, 8192), (4096, 768)):
            x = torch.randn(m, n, dtype=dtype, device="cuda")
            w = torch.randn(n, dtype=dtype, device="cuda")
            b = torch.randn(n, dtype=dtype, device="cuda")
            g = torch.randn_like(x)
            _, mean, rstd = gemsops.native_layer_norm(x, (n,), w, b)
            e = x.element_size()
            cases = [
                ("fwd affine", 2, lambda: gemsops.layer_norm(x, (n,), w, b)),
                ("fwd plain", 2, lambda: gemsops.layer_norm(x, (n,))),
                ("bwd full", 3, lambda: gemsops.layer_norm_backward(
                    g, x, (n,), mean, rstd, w, b)),
                ("bwd dx only", 3, lambda: gemsops.layer_norm_backward(
                    g, x, (n,), mean, rstd, w, b, (True, False, False))),
                ("bwd dW/dB only", 2, lambda: gemsops.layer_norm_backward(
                    g, x, (n,), mean, rstd, w, b, (False, True, True))),
                ("bwd full deterministic", 3, lambda: gemsops.layer_norm_backward(
                    g, x, (n,), mean, rstd, w, b, deterministic=True)),
                ("torch copy x->y (reference)", 2, lambda: g.copy_(x)),
            ]
            for name, passes, fn in cases:
                t = ms(fn)
                print(f"{str(dtype)[6:]:9s} {m}x{n:<6} {name:26s} {t:8.4f} "
                      f"{passes * m * n * e / t / 1e6:7.0f}", flush=True)


if __name__ == "__main__":
    main()
