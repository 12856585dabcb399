"""A tiny GPT language model trained on generated text, twice: with torch's
layers and with gemsops' (LayerNorm, matmul). Prints both loss curves and
the time per step.

    python examples/train_gpt.py --steps 300 --device cpu [--compile]

--compile trains torch.compile(model, fullgraph=True) in place of the
eager model; --compile both trains the four (torch and gemsops, eager and
compiled) in one run. --amp trains under bf16 autocast."""

import argparse
import math
import time

import torch
import torch.nn.functional as F

import gemsops


def make_text(n, seed=0):
    """Sentences from a small grammar: structure a model can learn."""
    g = torch.Generator().manual_seed(seed)
    words = ["the cat", "a dog", "my bird", "one fox"]
    verbs = ["sees", "likes", "chases", "hears"]
    out = []
    while sum(map(len, out)) < n:
        w = lambda xs: xs[torch.randint(len(xs), (1,), generator=g).item()]  # noqa: E731
        out.append(f"{w(words)} {w(verbs)} {w(words)}. ")
    return "".join(out)[:n]


class Block(torch.nn.Module):
    def __init__(self, d, heads, lib):
        super().__init__()
        LN = gemsops.nn.LayerNorm if lib == "gemsops" else torch.nn.LayerNorm
        self.mm = gemsops.matmul if lib == "gemsops" else torch.matmul
        self.ln1, self.ln2 = LN(d), LN(d)
        self.qkv = torch.nn.Parameter(torch.randn(d, 3 * d) / math.sqrt(d))
        self.proj = torch.nn.Parameter(torch.randn(d, d) / math.sqrt(d))
        self.fc1 = torch.nn.Parameter(torch.randn(d, 4 * d) / math.sqrt(d))
        self.fc2 = torch.nn.Parameter(torch.randn(4 * d, d) / math.sqrt(4 * d))
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.mm(self.ln1(x), self.qkv).split(d, -1)
        q, k, v = (
            z.reshape(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v)
        )
        att = self.mm(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = self.mm(att, v).transpose(1, 2).reshape(b, t, d)
        x = x + self.mm(y, self.proj)
        return x + self.mm(F.gelu(self.mm(self.ln2(x), self.fc1)), self.fc2)


class GPT(torch.nn.Module):
    def __init__(self, vocab, d, layers, heads, ctx, lib):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Parameter(torch.zeros(ctx, d))
        self.blocks = torch.nn.ModuleList(
            Block(d, heads, lib) for _ in range(layers)
        )
        LN = gemsops.nn.LayerNorm if lib == "gemsops" else torch.nn.LayerNorm
        self.ln = LN(d)
        self.mm = gemsops.matmul if lib == "gemsops" else torch.matmul

    def forward(self, idx):
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        return self.mm(self.ln(x), self.tok.weight.t())


def train(lib, compiled, data, vocab, args):
    torch.manual_seed(0)
    model = GPT(vocab, args.d, args.layers, args.heads, args.ctx, lib).to(
        args.device
    )
    step_fn = model
    if compiled:
        torch._dynamo.reset()
        step_fn = torch.compile(model, fullgraph=True)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    losses, times = [], []
    for _ in range(args.steps):
        i = torch.randint(len(data) - args.ctx - 1, (args.batch,), generator=g)
        xb = torch.stack([data[j : j + args.ctx] for j in i]).to(args.device)
        yb = torch.stack([data[j + 1 : j + args.ctx + 1] for j in i]).to(
            args.device
        )
        t0 = time.perf_counter()
        with torch.autocast(
            torch.device(args.device).type, torch.bfloat16, enabled=args.amp
        ):
            loss = F.cross_entropy(step_fn(xb).flatten(0, 1), yb.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    return losses, times


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--compile",
        nargs="?",
        const="on",
        default="off",
        choices=["off", "on", "both"],
    )
    p.add_argument(
        "--amp", action="store_true", help="bf16 autocast (mixed precision)"
    )
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ctx", type=int, default=32)
    p.add_argument("--batch", type=int, default=16)
    args = p.parse_args()
    text = make_text(20000)
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text])
    modes = {"off": [False], "on": [True], "both": [False, True]}
    results = {}
    for compiled in modes[args.compile]:
        for lib in ("torch", "gemsops"):
            name = f"{lib} {'compiled' if compiled else 'eager'}"
            results[name] = train(lib, compiled, data, len(chars), args)
    every = max(1, args.steps // 10)
    print(f"{'step':>6} " + " ".join(f"{n:>16}" for n in results))
    for s in list(range(0, args.steps, every)) + [args.steps - 1]:
        print(
            f"{s:6d} " + " ".join(f"{r[0][s]:16.4f}" for r in results.values())
        )
    for name, (_, times) in results.items():
        warm = times[len(times) // 5 :] or times
        print(
            f"{name:17s} median step "
            f"{sorted(warm)[len(warm) // 2] * 1e3:.2f} ms"
        )


if __name__ == "__main__":
    main()
