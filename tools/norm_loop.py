"""Where a norm forward's time goes in the benchmark's loop: each provider's
call captured in a CUDA graph, replayed after the flush as the benchmark
times it, under the profiler. For each: the event-timed median (the
benchmark's number), the median of its kernels' own durations in the same
replays, and the median gap from the flush's last kernel to the call's
first. Nsight Compute's one call after a flush (tools/norm_ncu.py) put the
register kernel level with the best peer where the benchmark has it behind
(docs/performance.md, LayerNorm forward, Open questions); this says whether
the loop's extra time is in the kernel or before it. gemsops is timed
first and again last (gemsops2), each in a graph of its own whose pool
puts the output elsewhere.

usage: python -m tools.norm_loop case ...
  case = op,M,N,dtype as tools/norm_launch_shapes' (ln, rms, addln, addrms)
  NORM_LOOP_FLUSH=zero|read (default zero: triton's cache.zero_())"""

import os
import statistics
import sys

from tools.profiler_trace import gpu_events

# the flush's kernels, by a part of their names
FLUSH_KERNELS = {"zero": ("FillFunctor",), "read": ("reduce", "Reduce")}


def replays(fn, args, flush, reps=60):
    """(event-timed median µs, [(start, end, kernel name)], the output's
    offset from the input in MiB)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmark.performance_utils import _graph_replay

    # the benchmark's own capture; the last output kept is the captured one
    outs = []
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    replay = _graph_replay(lambda: outs.append(fn(*args)), stream)
    if replay is None:
        raise SystemExit("norm_loop: the call could not be captured")
    y = outs[-1][0] if isinstance(outs[-1], tuple) else outs[-1]
    del outs[:-1]
    # where the graph's pool put the output, against the input: DRAM
    # channels and banks follow the address
    offset = (y.data_ptr() - args[0].data_ptr()) / 2**20
    for _ in range(5):
        flush()
        replay()
    events = []
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            replay()
            end.record()
            events.append((start, end))
        torch.cuda.synchronize()
    timed = statistics.median(s.elapsed_time(e) * 1e3 for s, e in events)
    return timed, gpu_events(prof), offset


def split(kernels, flush_names):
    """Per replay: (gap from the flush's end, the call's kernel µs)."""
    gaps, spans, flush_end, start, last = [], [], None, None, None
    for ts, te, name in kernels + [(None, None, None)]:
        is_flush = name is not None and any(f in name for f in flush_names)
        if (name is None or is_flush) and start is not None:
            gaps.append(start - flush_end)
            spans.append(last - start)
            start = None
        if is_flush:
            flush_end = te
        elif name is not None and flush_end is not None:
            start = ts if start is None else start
            last = te
    return statistics.median(gaps), statistics.median(spans)


def main(argv):
    if not argv:
        print(__doc__)
        return 2
    import torch

    from tools.norm_launch_shapes import case_args
    from tools.norm_ncu import flush_named, provider_calls

    how = os.environ.get("NORM_LOOP_FLUSH", "zero")
    if how not in FLUSH_KERNELS:
        raise SystemExit(f"norm_loop: NORM_LOOP_FLUSH={how!r}: zero or read")
    flush = flush_named(how)
    for spec in argv:
        op, m, n, dt = spec.split(",")
        args = case_args(op, int(m), int(n), getattr(torch, dt))
        found = list(provider_calls(op))
        # gemsops once more, last: a graph of its own, its output elsewhere
        found.append(("gemsops2", found[0][1]))
        for name, fn in found:
            timed, kernels, offset = replays(fn, args, flush)
            gap, span = split(kernels, FLUSH_KERNELS[how])
            print(
                f"{how} {spec:24s} {name:9s} timed {timed:8.2f} us, kernels "
                f"{span:8.2f}, after the flush {gap:6.2f}; y at x "
                f"{offset:+.0f} MiB",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
