"""Where an eager matmul's time goes beyond its kernel: for each shape,
torch.matmul and gemsops.matmul after the benchmark's zero_() flush, from
a profiler trace of the same calls between CUDA events: the gap from the
flush's end to the product's first kernel (launch latency), the kernels'
mean time, and do_bench's eager median. torch's kernel names come with
its line (cuBLAS names its tile: nvjet_sm90_tst_128x160_... is 128 x 160).

usage: python -m tools.mm_gap M,N,K ... (bf16)"""

import json
import os
import sys
import tempfile

import torch

import gemsops
from benchmark.performance_utils import do_bench
from tools.mm_probe import profile_flushed


def trace(fn, reps=30):
    """Median gap (us) from a flush's end to the next kernel, the mean
    time of the non-flush kernels, and their names."""
    prof = profile_flushed(fn, reps, events=True)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    kernels = sorted(
        (e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"]
    )
    gaps, durations, names = [], [], set()
    flush_end = None
    for e in kernels:
        if "FillFunctor" in e["name"]:
            flush_end = e["ts"] + e["dur"]
            continue
        if flush_end is not None:
            gaps.append(e["ts"] - flush_end)
            flush_end = None
        durations.append(e["dur"])
        names.add(e["name"][:60])
    gaps.sort()
    return gaps[len(gaps) // 2], sum(durations) / len(durations), names


def main(cases):
    if not cases:
        print(__doc__)
        return 2
    for case in cases:
        m, n, k = (int(v) for v in case.split(","))
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        out = [f"{case}:"]
        for name, fn in (
            ("torch", lambda: a @ b),
            ("gems", lambda: gemsops.matmul(a, b)),
        ):
            gap, kernel, names = trace(fn)
            eager = do_bench(fn) * 1e3
            line = f"{name} eager {eager:.2f} kernel {kernel:.2f}"
            line += f" gap {gap:.2f}"
            if name == "torch":
                line += f" [{';'.join(sorted(names))}]"
            out.append(line)
        print(" | ".join(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
