"""Time per product of a chain of products launched back to back, as a
training step launches them: each shape's product called `calls` times in
a row in a CUDA graph (no host time, no flush between: the operands stay
in L2), gemsops.matmul's chain, then torch.matmul's, best of `rounds`. A
flushed single call (mm_time, do_bench) times neither the warm operands
nor a launch that follows its own kind.

usage: python -m tools.mm_chain M,N,K[:dtype[:layout]] ...
  (tools/mm_probe.py's case syntax); prints `case gems Xus` and
  `case torch Yus` (tools/ab_modules.sh's format, AB_TIMER)
"""

import sys

import torch

from tools.mm_probe import product_error, repeatable_products


def graph_us(fn, calls=50, rounds=5):
    """Best mean time (us) of one of `calls` fn() calls replayed from a
    CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    start, end = torch.cuda.Event(True), torch.cuda.Event(True)
    best = float("inf")
    for _ in range(rounds):
        graph.replay()  # warm
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / calls)
    return best


def main(cases):
    if not cases:
        print(__doc__)
        return 2
    for case in cases:
        name, (a, b), gems, ref = repeatable_products(case)
        err = product_error(a, b)
        if not err < 1e-2:
            print(f"{name} gemsops wrong: rel err {err:.2e}")
            return 1
        print(f"{name} gems {graph_us(gems):.2f}us", flush=True)
        print(f"{name} torch {graph_us(ref):.2f}us", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
