"""Whether back-to-back products overlap on the GPU: each shape's product
called `calls` times in a row, eagerly and replayed from a CUDA graph,
under torch.profiler; per library, the kernels' median duration, the
median gap from one kernel's end to the next one's start (negative: the
next kernel's first CTA started before the last one's last CTA ended, a
programmatic dependent launch), and the span over the calls.

usage: python -m tools.mm_overlap M,N,K[:dtype[:layout]] ...
  (tools/mm_probe.py's case syntax)
"""

import statistics
import sys

import torch

from tools.mm_probe import repeatable_products
from tools.profiler_trace import gpu_events


def kernel_times(run, calls):
    """(start, end, name) in µs of the last GPU kernels, memsets and copies
    launches, in order: 2 * calls of them (a product may launch two)."""
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CUDA]
    ) as prof:
        run()
        torch.cuda.synchronize()
    kernels = gpu_events(prof, ("kernel", "gpu_memset", "gpu_memcpy"))
    return kernels[-2 * calls :]


def summary(events):
    """The products' kernels: their median duration, the median gap before
    each from the GPU work before it (a kernel, memset or copy), the span a
    product; the count of other kernels, memsets and copies among them."""
    busy = {}
    for s, e, n in events:
        busy[n] = busy.get(n, 0.0) + e - s
    product = max(busy, key=busy.get)  # the name that took the most time
    kernels = [(s, e) for s, e, n in events if n == product]
    others = len(events) - len(kernels)
    starts = {s for s, _ in kernels}
    durs = [e - s for s, e in kernels]
    gaps = [b[0] - a[1] for a, b in zip(events, events[1:]) if b[0] in starts]
    span = (kernels[-1][1] - kernels[0][0]) / len(kernels)
    return (
        f"{len(kernels)} products, {others} other kernels, memsets or copies, "
        f"duration {statistics.median(durs):.2f}, "
        f"gap {statistics.median(gaps):+.2f} (min {min(gaps):+.2f}), "
        f"span a call {span:.2f} µs"
    )


def chains(fn, calls):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()

    def eager():
        for _ in range(calls):
            fn()

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        eager()
    graph.replay()
    torch.cuda.synchronize()
    return {
        "eager": kernel_times(eager, calls),
        "graph": kernel_times(graph.replay, calls),
    }


def main(cases, calls=20):
    if not cases:
        print(__doc__)
        return 2
    for case in cases:
        name, _, gems, ref = repeatable_products(case)
        for lib, fn in (("gems", gems), ("torch", ref)):
            for how, kernels in chains(fn, calls).items():
                print(f"{name} {lib} {how}: {summary(kernels)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
