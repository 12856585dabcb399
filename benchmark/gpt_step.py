"""A GPT-style training step (bf16) with torch.nn.Linear, then the same
model with gemsops.nn.Linear in its place, timed in one run.

    python benchmark/gpt_step.py [--tokens 8x1024 --d 768 --layers 4]
                                 [--layernorm | --fused-add] [--compile]
                                 [--phases] [--json FILE]

The block: LayerNorm, a fused qkv Linear, causal scaled-dot-product
attention (torch's), the output projection, LayerNorm, a 4d MLP with GELU;
residual adds. A step is zero_grad, forward, a mean-square loss, backward
and an SGD update. Only the Linear layers differ between the two models
(same weights: the gemsops model is a copy whose Linear modules are
gemsops.nn.Linear, a subclass); with --layernorm its LayerNorm modules
are gemsops.nn.LayerNorm as well; with --fused-add each residual add and
the LayerNorm that reads its sum are one gemsops.nn.FusedAddLayerNorm
(the copy runs as a FusedAddStack: the same sums and norms); with
--compile both models run through torch.compile (torch's Linear as
Inductor lowers it, gemsops' as its gemsops::addmm op). Rounds alternate
the two models; the figure is the median step time of each, and torch's
over gemsops' (above 1: gemsops' step is faster). --json FILE appends the
result (with GEMSOPS_COMMIT, if set, as its commit)."""

import argparse
import copy
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

import gemsops


class Block(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, 4 * d)
        self.fc2 = torch.nn.Linear(4 * d, d)

    def attend(self, h):
        """The attention sublayer's output, before its residual add."""
        b, t, d = h.shape
        q, k, v = self.qkv(h).split(d, -1)
        q, k, v = (
            z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))

    def mlp(self, h):
        return self.fc2(F.gelu(self.fc1(h)))

    def forward(self, x):
        x = x + self.attend(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class FusedAddStack(torch.nn.Module):
    """A Sequential of Blocks run with each residual add fused into the
    LayerNorm that reads its sum (gemsops.nn.FusedAddLayerNorm returns
    (layer_norm(a + x), a + x)): the same sums and norms as the blocks run
    in turn, one pass over the activations fewer per add. The first
    block's ln1 has no add before it; the last block's add stands alone."""

    def __init__(self, blocks):
        super().__init__()
        self.blocks = blocks

    def forward(self, x):
        out = None  # the last sublayer's output, not yet added to x
        for blk in self.blocks:
            if out is None:
                ln = blk.ln1
                h = gemsops.layer_norm(
                    x, ln.normalized_shape, ln.weight, ln.bias, ln.eps
                )
            else:
                h, x = blk.ln1(out, x)
            h, x = blk.ln2(blk.attend(h), x)
            out = blk.mlp(h)
        return x + out


def gemsops_copy(model, layer_norm=False, fused_add=False):
    """A copy of model whose Linear modules (and, with layer_norm, its
    LayerNorm modules) are gemsops' subclasses; with fused_add, its
    LayerNorm modules are gemsops.nn.FusedAddLayerNorm and the copy runs
    as a FusedAddStack."""
    swap = {torch.nn.Linear: gemsops.nn.Linear}
    if fused_add:
        swap[torch.nn.LayerNorm] = gemsops.nn.FusedAddLayerNorm
    elif layer_norm:
        swap[torch.nn.LayerNorm] = gemsops.nn.LayerNorm
    m = copy.deepcopy(model)
    for mod in m.modules():
        if type(mod) in swap:
            mod.__class__ = swap[type(mod)]
    return FusedAddStack(m) if fused_add else m


def step_time(model, x, opt, steps):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = model(x).float().square().mean()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def phase_times(model, x, opt, steps):
    """Median host time of each phase of a step (zero_grad + forward +
    loss, backward, SGD), no wait for the GPU inside a phase, and of the
    whole step with the wait: where a host-bound step spends its time."""
    rows = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(x).float().square().mean()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        torch.cuda.synchronize()
        rows.append((t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t0))
    return [statistics.median(r[i] for r in rows) for i in range(4)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="8x1024", help="batch x sequence")
    ap.add_argument("--d", type=int, default=768)
    ap.add_argument("--heads", type=int, default=0, help="0: d / 64")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10, help="per round")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", default="")
    ap.add_argument(
        "--profile", action="store_true", help="kernel table of one step each"
    )
    norms = ap.add_mutually_exclusive_group()
    norms.add_argument(
        "--layernorm",
        action="store_true",
        help="gemsops.nn.LayerNorm in place of torch's too",
    )
    norms.add_argument(
        "--fused-add",
        action="store_true",
        help="gemsops.nn.FusedAddLayerNorm in place of each residual add "
        "and the LayerNorm after it (its LayerNorms are gemsops' too)",
    )
    ap.add_argument(
        "--compile",
        action="store_true",
        help="both models through torch.compile",
    )
    ap.add_argument(
        "--phases",
        action="store_true",
        help="host time of each phase of a step, each model",
    )
    a = ap.parse_args()
    b, t = (int(v) for v in a.tokens.split("x"))
    heads = a.heads or a.d // 64
    torch.manual_seed(0)
    dev = "cuda"
    ref = torch.nn.Sequential(*(Block(a.d, heads) for _ in range(a.layers)))
    ref = ref.to(dev, torch.bfloat16)
    ours = gemsops_copy(ref, a.layernorm, a.fused_add)
    x = torch.randn(b, t, a.d, device=dev, dtype=torch.bfloat16)
    models = {"torch": ref, "gemsops": ours}
    if a.compile:
        models = {k: torch.compile(m) for k, m in models.items()}
    opts = {
        k: torch.optim.SGD(m.parameters(), lr=1e-4) for k, m in models.items()
    }
    with torch.no_grad():  # the two agree before timing
        y0, y1 = (m(x).float() for m in models.values())
        err = ((y0 - y1).norm() / y0.norm()).item()
    for k, m in models.items():
        step_time(m, x, opts[k], 3)  # warm-up: plans, workspaces, autotune
    times = {k: [] for k in models}
    for _ in range(a.rounds):
        for k, m in models.items():
            times[k].append(step_time(m, x, opts[k], a.steps))
    if a.profile:
        for k, m in models.items():
            with torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CUDA]
            ) as prof:
                step_time(m, x, opts[k], 1)
            print(f"--- {k}")
            print(
                prof.key_averages().table(
                    sort_by="cuda_time_total",
                    row_limit=30 if a.compile else 14,
                    max_name_column_width=230,
                )
            )
    if a.phases:
        for k, m in models.items():
            fwd, bwd, sgd, step = phase_times(m, x, opts[k], 3 * a.steps)
            print(
                f"{k:8s} host ms a step: forward {fwd * 1e3:.3f}, backward "
                f"{bwd * 1e3:.3f}, SGD {sgd * 1e3:.3f}; step with the "
                f"GPU's wait {step * 1e3:.3f}"
            )
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["torch"] / med["gemsops"]
    name = torch.cuda.get_device_name()
    swapped = (
        "Linear, fused add + LayerNorm"
        if a.fused_add
        else "Linear, LayerNorm"
        if a.layernorm
        else "Linear"
    )
    if a.compile:
        swapped += "; both compiled"
    print(
        f"GPT step, bf16, {b}x{t} tokens, d={a.d}, {a.layers} layers, "
        f"{heads} heads on {name}: torch {med['torch'] * 1e3:.3f} ms, "
        f"gemsops ({swapped}) {med['gemsops'] * 1e3:.3f} ms, "
        f"ratio {ratio:.3f} (relative output difference {err:.1e})"
    )
    if a.json:
        rec = {
            "tokens": [b, t],
            "d": a.d,
            "layers": a.layers,
            "heads": heads,
            "gemsops_modules": swapped,
            "compiled": a.compile,
            "gpu": name,
            "torch": torch.__version__,
            "torch_ms": med["torch"] * 1e3,
            "gemsops_ms": med["gemsops"] * 1e3,
            "ratio": ratio,
            "rel_diff": err,
        }
        if os.environ.get("GEMSOPS_COMMIT"):
            rec["commit"] = os.environ["GEMSOPS_COMMIT"]
        with open(a.json, "a") as f:
            f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
