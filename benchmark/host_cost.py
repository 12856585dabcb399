"""Host cost of one eager call (wall clock, µs) on a tiny problem, where the
kernel is negligible: gemsops vs torch. Usage: python benchmark/host_cost.py"""

import time

import torch

import gemsops


def per_call_us(fn, n=20000):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def main():
    x = torch.randn(64, 1024, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(1024, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(1024, dtype=torch.bfloat16, device="cuda")
    rows = [
        (
            "torch.nn.functional.layer_norm",
            lambda: torch.nn.functional.layer_norm(x, (1024,), w, b),
        ),
        ("gemsops.layer_norm", lambda: gemsops.layer_norm(x, (1024,), w, b)),
    ]
    xg = x.clone().requires_grad_()
    rows += [
        (
            "torch layer_norm (input requires grad)",
            lambda: torch.nn.functional.layer_norm(xg, (1024,), w, b),
        ),
        (
            "gemsops layer_norm (input requires grad)",
            lambda: gemsops.layer_norm(xg, (1024,), w, b),
        ),
        (
            "_C.tensor_info(x) (DLPack import)",
            lambda: gemsops._C.tensor_info(x),
        ),
        (
            "_C.tensor_info(xg) (requires grad)",
            lambda: gemsops._C.tensor_info(xg),
        ),
    ]
    wg = w.clone().requires_grad_()
    bg = b.clone().requires_grad_()
    g = torch.randn_like(x)
    for name, fn in (
        ("torch", torch.nn.functional.layer_norm),
        ("gemsops", gemsops.layer_norm),
    ):
        out = fn(xg, (1024,), wg, bg)
        rows.append(
            (
                f"{name} backward (autograd.grad)",
                lambda out=out: torch.autograd.grad(
                    out, (xg, wg, bg), g, retain_graph=True
                ),
            )
        )
    print(f"host cost per call, 64x1024 bf16, {torch.cuda.get_device_name()}")
    for name, fn in rows:
        print(f"{name:45s} {per_call_us(fn):7.2f} us")


if __name__ == "__main__":
    main()
