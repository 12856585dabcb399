"""LayerNorm's host cost by piece, beside torch's, in one process: where
a call whose input requires grad, and its backward through autograd.grad,
spend their wall clock when the kernels take a few microseconds.

    python -m tools.norm_host_cost [--device cuda|cpu] [--calls N]

Rows (µs a call, best of five runs of N calls): torch's and gemsops'
forward with grad and backward; gemsops' `_backward` (Python and C), its
output allocations (`grad_outputs`), the graph-pool check, the C backward
and forward calls alone on the kept workspace, and the backward with the
C call stubbed out (what the Python Function and autograd's engine cost).
On CUDA, a profiler table of ten backwards of each counts the launches."""

import argparse

import torch
import torch.nn.functional as F

import gemsops
from benchmark.host_cost import per_call_us
from gemsops import _C, _workspace
from gemsops.ops import _norm_launch as nl
from gemsops.ops import layer_norm as ln


def main():
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu"
    )
    cli.add_argument("--calls", type=int, default=2000)
    args = cli.parse_args()
    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    kw = dict(
        device=args.device, dtype=torch.bfloat16 if cuda else torch.float32
    )
    shape = (1024,)
    x, w, b = (
        torch.randn(64, 1024, **kw).requires_grad_(),
        torch.randn(1024, **kw).requires_grad_(),
        torch.randn(1024, **kw).requires_grad_(),
    )
    ins = (x, w, b)
    y_torch = F.layer_norm(x, shape, w, b)
    y_ours = gemsops.layer_norm(x, shape, w, b)
    g = torch.randn_like(y_torch)
    xd, wd, bd = x.detach(), w.detach(), b.detach()
    out, mean, rstd = ln._forward(xd, shape, wd, bd, 1e-5)
    dx, dw, db = nl.grad_outputs(xd, shape, wd, True, True, True)
    bwd_args = (g, xd, wd, 1, False, mean, rstd, dx, dw, db)

    def timed(fn):
        return per_call_us(fn, sync, args.calls, repeats=5)

    rows = {
        "torch forward, grad": timed(lambda: F.layer_norm(x, shape, w, b)),
        "gemsops forward, grad": timed(
            lambda: gemsops.layer_norm(x, shape, w, b)
        ),
        "torch backward": timed(
            lambda: torch.autograd.grad(y_torch, ins, g, retain_graph=True)
        ),
        "gemsops backward": timed(
            lambda: torch.autograd.grad(y_ours, ins, g, retain_graph=True)
        ),
        "  _backward": timed(
            lambda: ln._backward(
                g, xd, shape, wd, mean, rstd, True, True, True, bias=bd
            )
        ),
        "  grad_outputs": timed(
            lambda: nl.grad_outputs(xd, shape, wd, True, True, True)
        ),
        "  in_graph_pool": timed(lambda: _workspace.in_graph_pool(xd.device)),
        "  C forward": timed(
            lambda: _C.layer_norm_fwd(xd, wd, bd, 1, 1e-5, out, mean, rstd)
        ),
    }
    if cuda:
        device = xd.get_device()
        stream = nl._bwd_stream.get(device, -1)
        slot = _workspace.lookup("ln_bwd", device, stream)
        if slot is not None:
            rows["  C backward, kept workspace"] = timed(
                lambda: _C.layer_norm_bwd(*bwd_args, slot.buf, stream)
            )
    real = _C.layer_norm_bwd
    _C.layer_norm_bwd = lambda *a: None
    try:
        rows["gemsops backward, C stubbed"] = timed(
            lambda: torch.autograd.grad(y_ours, ins, g, retain_graph=True)
        )
    finally:
        _C.layer_norm_bwd = real
    name = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"LayerNorm 64x1024 {kw['dtype']}, host µs a call, {name}")
    for k, v in rows.items():
        print(f"{k:32s} {v:8.2f}")
    if cuda:
        act = torch.profiler.ProfilerActivity
        with torch.profiler.profile(activities=[act.CPU, act.CUDA]) as prof:
            for y in (y_ours, y_torch):
                for _ in range(10):
                    torch.autograd.grad(y, ins, g, retain_graph=True)
            sync()
        print(
            prof.key_averages().table(
                sort_by="count", row_limit=16, max_name_column_width=60
            )
        )


if __name__ == "__main__":
    main()
