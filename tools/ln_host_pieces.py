"""Host cost of the pieces of a small LayerNorm backward (64 x 1024 bf16,
µs per call, timeit on the device's host): where the Python layer and the
autograd engine spend it. Usage: python tools/ln_host_pieces.py"""
import timeit

import torch

import gemsops
from gemsops.ops import layer_norm as ln


def us(stmt, n=2000):
    stmt()
    torch.cuda.synchronize()
    t = min(timeit.repeat(stmt, number=n, repeat=3)) / n * 1e6
    torch.cuda.synchronize()
    return t


def main():
    m, n = 64, 1024
    x = torch.randn(m, n, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    g = torch.randn(m, n, dtype=torch.bfloat16, device="cuda")
    out, mean, rstd = ln._forward(x, (n,), w, b, 1e-5)
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
    y_t = torch.nn.functional.layer_norm(xg, (n,), wg, bg)
    y_g = gemsops.layer_norm(xg, (n,), wg, bg)
    dx = torch.empty_like(x)
    dw, db = torch.empty_like(w), torch.empty_like(b)
    nbytes = ln._C.layer_norm_bwd_workspace(x, w, 1, False, True, True, True)
    ws = torch.empty(max(nbytes, 1), dtype=torch.uint8, device="cuda")
    rows = [
        ("torch autograd.grad", lambda: torch.autograd.grad(
            y_t, (xg, wg, bg), g, retain_graph=True)),
        ("gemsops autograd.grad", lambda: torch.autograd.grad(
            y_g, (xg, wg, bg), g, retain_graph=True)),
        ("gemsops layer_norm_backward", lambda: gemsops.layer_norm_backward(
            g, x, (n,), mean, rstd, w, b)),
        ("ln._backward", lambda: ln._backward(g, x, (n,), w, mean, rstd,
                                              True, True, True)),
        ("_C.layer_norm_bwd (buffers given)", lambda: ln._C.layer_norm_bwd(
            g, x, w, 1, False, mean, rstd, dx, dw, db, ws)),
        ("_C.layer_norm_bwd_workspace", lambda: ln._C.layer_norm_bwd_workspace(
            x, w, 1, False, True, True, True)),
        ("torch.empty x3", lambda: (torch.empty(x.shape, dtype=x.dtype,
                                                device=x.device),
                                    torch.empty((n,), dtype=x.dtype,
                                                device=x.device),
                                    torch.empty((n,), dtype=x.dtype,
                                                device=x.device))),
        ("are_deterministic_algorithms_enabled",
         torch.are_deterministic_algorithms_enabled),
        ("torch layer_norm fwd (grad)", lambda: torch.nn.functional.layer_norm(
            xg, (n,), wg, bg)),
        ("gemsops layer_norm fwd (grad)", lambda: gemsops.layer_norm(
            xg, (n,), wg, bg)),
        ("ln._forward (stats)", lambda: ln._forward(x, (n,), w, b, 1e-5)),
        ("torch layer_norm fwd", lambda: torch.nn.functional.layer_norm(
            x, (n,), w, b)),
        ("gemsops layer_norm fwd", lambda: gemsops.layer_norm(x, (n,), w, b)),
        ("_C.layer_norm_fwd", lambda: ln._C.layer_norm_fwd(
            x, w, b, 1, 1e-5, out, None, None, None)),
    ]
    for name, fn in rows:
        print(f"{name:>38}: {us(fn, 500):7.2f} us", flush=True)


if __name__ == "__main__":
    main()
