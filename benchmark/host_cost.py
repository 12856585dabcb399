"""Host cost of one eager call (wall clock, µs) on tiny problems, where the
kernel is negligible: gemsops' public function (the lean eager path), the
same op through torch's dispatcher (`torch.ops.gemsops`, the path compiled
code and modes take) and torch's own op, in one process.

For each op: a forward on tensors that need no grad, a forward whose input
requires grad (autograd records it), and the backward of that forward
through `torch.autograd.grad`.

usage: python benchmark/host_cost.py [--device cuda|cpu] [--calls N]
       [--json PATH]   (the rows as JSON, e.g. for benchmark/results/)"""

import argparse
import datetime
import json
import subprocess
import time

import torch

import gemsops

ops = torch.ops.gemsops


def per_call_us(fn, sync, n, repeats=3):
    """The best of `repeats` timed runs of n calls (a background hiccup
    lengthens one run; it does not shorten any)."""
    for _ in range(max(50, n // 100)):
        fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def cases(device, dtype):
    """(op, {provider: callable(*tensors)}, tensors): tensors the calls
    take; the ones that require grad are what the backward asks for."""
    kw = dict(device=device, dtype=dtype)
    x, w, b = (
        torch.randn(64, 1024, **kw),
        torch.randn(1024, **kw),
        torch.randn(1024, **kw),
    )
    yield (
        "layer_norm 64x1024",
        {
            "torch": lambda x, w, b: torch.nn.functional.layer_norm(
                x, (1024,), w, b
            ),
            "gemsops": lambda x, w, b: gemsops.layer_norm(x, (1024,), w, b),
            "gemsops op": lambda x, w, b: ops.layer_norm(
                x, [1024], w, b, 1e-5
            )[0],
        },
        (x, w, b),
    )
    p = torch.rand(64, 256, **kw) + 0.5
    yield (
        "prod dim=1 64x256",
        {
            "torch": lambda x: torch.prod(x, 1),
            "gemsops": lambda x: gemsops.prod(x, 1),
            "gemsops op": lambda x: ops.prod(x, 1),
        },
        (p,),
    )
    a, m = torch.randn(64, 64, **kw), torch.randn(64, 64, **kw)
    yield (
        "mm 64x64x64",
        {
            "torch": torch.mm,
            "gemsops": gemsops.mm,
            "gemsops op": ops.mm,
        },
        (a, m),
    )
    lx, lw, lb = (
        torch.randn(64, 64, **kw),
        torch.randn(64, 64, **kw),
        torch.randn(64, **kw),
    )
    yield (
        "linear 64x64 +bias",
        {
            "torch": torch.nn.functional.linear,
            "gemsops": gemsops.linear,
        },
        (lx, lw, lb),
    )
    yield (
        "addmm 64x64x64",
        {
            "torch": lambda b, x, w: torch.addmm(b, x, w),
            "gemsops": lambda b, x, w: gemsops.addmm(b, x, w),
            "gemsops op": lambda b, x, w: ops.addmm(b, x, w, 1.0, 1.0),
        },
        (lb, lx, lw),
    )


def main():
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu"
    )
    cli.add_argument("--calls", type=int, default=3000)
    cli.add_argument("--json", help="also write the rows to this file")
    args = cli.parse_args()
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    print(
        f"host cost per call (µs), {dtype}, {name}, torch {torch.__version__}"
    )
    print(
        f"{'op':20s} {'provider':11s} {'forward':>8s} {'fwd+grad':>9s}"
        f" {'backward':>9s}"
    )
    rows = []
    for op, providers, tensors in cases(dev, dtype):
        grads = tuple(t.clone().requires_grad_() for t in tensors)
        for provider, fn in providers.items():
            plain = per_call_us(lambda: fn(*tensors), sync, args.calls)
            tracked = per_call_us(lambda: fn(*grads), sync, args.calls)
            out = fn(*grads)
            g = torch.randn_like(out)
            back = per_call_us(
                lambda out=out, g=g: torch.autograd.grad(
                    out, grads, g, retain_graph=True
                ),
                sync,
                args.calls,
            )
            print(
                f"{op:20s} {provider:11s} {plain:8.2f} {tracked:9.2f}"
                f" {back:9.2f}"
            )
            rows.append(
                dict(
                    call=op,
                    provider=provider,
                    forward_us=plain,
                    forward_grad_us=tracked,
                    backward_us=back,
                )
            )
    if args.json:
        doc = dict(
            kind="host_cost",
            device=name,
            dtype=str(dtype).removeprefix("torch."),
            torch=torch.__version__,
            commit=_commit(),
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
            rows=rows,
        )
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)


def _commit():
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    main()
