"""Where the GPT step's host time goes (benchmark/gpt_step.py's model,
bf16, 8x1024 tokens, 4 layers), torch's Linear layers against gemsops':
the forward's host time from an idle GPU (with and without grad, the two
models alternately, three rounds), then torch.profiler's self CPU time by
op over three steps of each, then cProfile of five of gemsops' steps.

usage: python tools/gpt_step_host.py [d]   (default 768; heads d / 64)"""

import cProfile
import io
import pstats
import statistics
import sys
import time

import torch

from benchmark.gpt_step import Block, gemsops_copy


def forward_host_ms(model, x, n=10, grad=True):
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.set_grad_enabled(grad):
            y = model(x)
        times.append(time.perf_counter() - t0)
        if grad:
            y.float().square().mean().backward()
        torch.cuda.synchronize()
        for p in model.parameters():
            p.grad = None
    return statistics.median(times) * 1e3


def steps(model, x, n):
    for _ in range(n):
        model(x).float().square().mean().backward()
        for p in model.parameters():
            p.grad = None
    torch.cuda.synchronize()


def main(d):
    torch.manual_seed(0)
    blocks = (Block(d, d // 64) for _ in range(4))
    ref = torch.nn.Sequential(*blocks).to("cuda", torch.bfloat16)
    models = {"torch": ref, "gemsops": gemsops_copy(ref)}
    x = torch.randn(8, 1024, d, device="cuda", dtype=torch.bfloat16)
    for m in models.values():
        forward_host_ms(m, x, 3)
    for _ in range(3):
        print(
            " ".join(
                f"{k} forward {forward_host_ms(m, x):.3f} ms, no grad "
                f"{forward_host_ms(m, x, grad=False):.3f};"
                for k, m in models.items()
            ),
            flush=True,
        )
    cpu = torch.profiler.ProfilerActivity.CPU
    for k, m in models.items():
        with torch.profiler.profile(activities=[cpu]) as prof:
            steps(m, x, 3)
        print(f"--- {k}, three steps")
        print(
            prof.key_averages().table(
                sort_by="self_cpu_time_total",
                row_limit=18,
                max_name_column_width=60,
            )
        )
    prof = cProfile.Profile()
    prof.enable()
    steps(models["gemsops"], x, 5)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
    print(out.getvalue())


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 768)
