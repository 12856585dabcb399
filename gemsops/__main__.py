"""python -m gemsops: a self-check and demo on whatever device is present.

Runs LayerNorm (forward and backward), prod (forward and the zero-safe
backward) and the Stream-K matmul against float64 references on the CPU
and, when a GPU and the CUDA kernels are there, on CUDA; prints what it
checked and exits non-zero on any mismatch."""

import sys
import time

import torch

import gemsops
from gemsops.testing import assert_close, layer_norm_reference


def check(device, dtype, m, n):
    x = torch.randn(m, n, dtype=dtype, device=device, requires_grad=True)
    w = torch.randn(n, dtype=dtype, device=device, requires_grad=True)
    b = torch.randn(n, dtype=dtype, device=device, requires_grad=True)
    g = torch.randn(m, n, dtype=dtype, device=device)
    out = gemsops.layer_norm(x, (n,), w, b)
    out.backward(g)
    leaves = [t.detach().double().requires_grad_() for t in (x, w, b)]
    ref = layer_norm_reference(leaves[0], (n,), leaves[1], leaves[2])[0]
    ref.backward(g.double())
    assert_close(out, ref, dtype)
    for name, t, leaf in zip(("dx", "dw", "db"), (x, w, b), leaves):
        assert_close(
            t.grad,
            leaf.grad,
            dtype,
            name=name,
            reduce_len=m if name != "dx" else 1,
        )


def check_prod(device, dtype, m, n):
    x = torch.empty(m, n, dtype=torch.float64).uniform_(0.9, 1.1)
    x[m // 2, n // 3] = 0  # a zero: its gradient is the product of the rest
    x = x.to(dtype).to(device).requires_grad_()
    out = gemsops.prod(x, 1)
    g = torch.randn(m, dtype=dtype, device=device)
    out.backward(g)
    xd = x.detach().double().requires_grad_()
    ref = xd.prod(1)
    ref.backward(g.double())
    assert_close(out, ref, dtype, chain_len=n)
    assert_close(x.grad, xd.grad, dtype, chain_len=n, name="grad")


def check_matmul(device, dtype, m, n):
    k = n
    a = torch.randn(m, k, dtype=dtype, device=device)
    b = torch.randn(k, n, dtype=dtype, device=device)
    out = gemsops.mm(a, b)
    ref = a.double() @ b.double()
    bound = a.double().abs() @ b.double().abs()
    tol = {torch.float32: 1.3e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}
    err = (out.double() - ref).abs()
    lim = tol[dtype] * ref.abs() + 4 * k**0.5 * 2**-24 * bound
    assert (err <= lim).all(), f"mm: worst error {err.max().item():.3g}"


CHECKS = [
    ("layer_norm fwd+bwd", check, ((4096, 768), (37, 40999), (1000, 64))),
    ("prod fwd+bwd", check_prod, ((64, 4096), (1000, 300))),
    ("mm", check_matmul, ((300, 200), (1000, 257))),
]


def main():
    print(
        f"gemsops {gemsops.__version__}: backends {gemsops.backends()}, "
        f"torch {torch.__version__}"
    )
    devices = ["cpu"]
    if torch.cuda.is_available() and gemsops.cuda_available():
        devices.append("cuda")
        print(f"GPU: {torch.cuda.get_device_name()}")
    elif "cuda" in gemsops.backends():
        print("CUDA kernels built, but no GPU is visible: checking the CPU")
    torch.manual_seed(0)
    failures = 0
    for device in devices:
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for label, fn, shapes in CHECKS:
                for m, n in shapes:
                    t0 = time.perf_counter()
                    try:
                        fn(device, dtype, m, n)
                        status = "ok"
                    except AssertionError as e:
                        failures += 1
                        status = f"FAILED: {e}"
                    ms = (time.perf_counter() - t0) * 1e3
                    print(
                        f"  {label} {device:4s} {str(dtype)[6:]:8s} "
                        f"{m}x{n}: {status} ({ms:.0f} ms)"
                    )
    print("self-check passed" if not failures else f"{failures} checks FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
