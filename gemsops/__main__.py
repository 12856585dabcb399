"""python -m gemsops: a self-check and demo on whatever device is present.

Runs every op against float64 references on the CPU and, when a GPU and
the CUDA kernels are there, on CUDA: LayerNorm and RMSNorm (forward and
the fused backward), the residual add fused into each (both outputs'
gradients), prod (forward and the zero-safe backward), the Stream-K
matmul and linear (the bias in the epilogue, and its backward); prints
what it checked and exits non-zero on any mismatch."""

import sys
import time

import torch

import gemsops
from gemsops.testing import (
    assert_close,
    assert_mm_close,
    layer_norm_reference,
    product_tolerance,
    rms_norm_reference,
)


def _leaves(*ts):
    return [t.detach().double().requires_grad_() for t in ts]


def _assert_grads(names, ts, leaves, dtype, rows):
    """Each t's gradient against its float64 leaf's; the parameters' are
    sums over the rows."""
    for name, t, leaf in zip(names, ts, leaves, strict=True):
        reduce = rows if name in ("dw", "db") else 1
        assert_close(t.grad, leaf.grad, dtype, name=name, reduce_len=reduce)


def check(device, dtype, m, n):
    x = torch.randn(m, n, dtype=dtype, device=device, requires_grad=True)
    w = torch.randn(n, dtype=dtype, device=device, requires_grad=True)
    b = torch.randn(n, dtype=dtype, device=device, requires_grad=True)
    g = torch.randn(m, n, dtype=dtype, device=device)
    out = gemsops.layer_norm(x, (n,), w, b)
    out.backward(g)
    leaves = _leaves(x, w, b)
    ref = layer_norm_reference(leaves[0], (n,), leaves[1], leaves[2])[0]
    ref.backward(g.double())
    assert_close(out, ref, dtype)
    _assert_grads(("dx", "dw", "db"), (x, w, b), leaves, dtype, m)


def check_rms_norm(device, dtype, m, n):
    x = torch.randn(m, n, dtype=dtype, device=device, requires_grad=True)
    w = torch.randn(n, dtype=dtype, device=device, requires_grad=True)
    g = torch.randn(m, n, dtype=dtype, device=device)
    out = gemsops.rms_norm(x, (n,), w, eps=1e-6)
    out.backward(g)
    leaves = _leaves(x, w)
    ref = rms_norm_reference(leaves[0], (n,), leaves[1], eps=1e-6)
    ref.backward(g.double())
    assert_close(out, ref, dtype)
    _assert_grads(("dx", "dw"), (x, w), leaves, dtype, m)


def check_fused_add(device, dtype, m, n, rms=False):
    x = torch.randn(m, n, dtype=dtype, device=device, requires_grad=True)
    r = torch.randn(m, n, dtype=dtype, device=device, requires_grad=True)
    w = torch.randn(n, dtype=dtype, device=device, requires_grad=True)
    b = torch.randn(n, dtype=dtype, device=device, requires_grad=True)
    gy, gh = (torch.randn(m, n, dtype=dtype, device=device) for _ in "yh")
    if rms:
        y, h = gemsops.fused_add_rms_norm(x, r, (n,), w, eps=1e-6)
        params, names = (w,), ("dw",)
    else:
        y, h = gemsops.fused_add_layer_norm(x, r, (n,), w, b)
        params, names = (w, b), ("dw", "db")
    torch.autograd.backward((y, h), (gy, gh))
    assert torch.equal(h, x + r), "h: not torch's x + residual"
    # float64 at the rounded sum h, as torch's unfused code normalizes it
    hd, *leaves = _leaves(h, *params)
    if rms:
        ref = rms_norm_reference(hd, (n,), leaves[0], eps=1e-6)
    else:
        ref = layer_norm_reference(hd, (n,), *leaves)[0]
    ref.backward(gy.double())
    assert_close(y, ref, dtype)
    assert_close(x.grad, hd.grad + gh.double(), dtype, name="dx")
    assert torch.equal(x.grad, r.grad), "dresidual: not dx"
    _assert_grads(names, params, leaves, dtype, m)


def check_fused_add_rms(device, dtype, m, n):
    check_fused_add(device, dtype, m, n, rms=True)


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
    assert_mm_close(gemsops.mm(a, b), a, b, dtype, name="mm")


def check_linear(device, dtype, m, n):
    # nn.Linear's shapes: the bias in the product's epilogue; x's, the
    # weight's and the bias' gradients through the kernels' transposed reads
    k = n
    x = torch.randn(2, m, k, dtype=dtype, device=device, requires_grad=True)
    w = torch.randn(n, k, dtype=dtype, device=device, requires_grad=True)
    b = torch.randn(n, dtype=dtype, device=device, requires_grad=True)
    g = torch.randn(2, m, n, dtype=dtype, device=device)
    y = gemsops.linear(x, w, b)
    y.backward(g)
    x2, g2 = x.detach().reshape(-1, k), g.reshape(-1, n)
    wd, bd = w.detach(), b.detach().double()
    ref = x2.double() @ wd.double().t() + bd
    bound = x2.double().abs() @ wd.double().abs().t() + bd.abs()
    err = (y.detach().reshape(-1, n).double() - ref).abs()
    tol = product_tolerance(ref, bound, k, dtype)
    assert (err <= tol).all(), f"linear: worst error {err.max().item():.3g}"
    assert_mm_close(x.grad.reshape(-1, k), g2, wd, dtype, name="dx")
    assert_mm_close(w.grad, g2.t(), x2, dtype, name="dw")
    ones = torch.ones(2 * m, 1, dtype=dtype, device=device)
    assert_mm_close(b.grad[:, None], g2.t(), ones, dtype, name="db")


CHECKS = [
    ("layer_norm fwd+bwd", check, ((4096, 768), (37, 40999), (1000, 64))),
    ("rms_norm fwd+bwd", check_rms_norm, ((4096, 768), (37, 40999))),
    ("fused_add_layer_norm fwd+bwd", check_fused_add, ((1000, 768),)),
    ("fused_add_rms_norm fwd+bwd", check_fused_add_rms, ((1000, 768),)),
    ("prod fwd+bwd", check_prod, ((64, 4096), (1000, 300))),
    ("mm", check_matmul, ((300, 200), (1000, 257))),
    ("linear fwd+bwd", check_linear, ((300, 200),)),
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
