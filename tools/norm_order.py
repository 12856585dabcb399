"""Whether a norm provider's time depends on when in a case it is timed:
every provider of a case timed by the benchmark's own method
(Benchmark._timed: a CUDA-graph replay under do_bench, L2 flushed) in
three rounds, the benchmark's order (torch, gemsops, then the peers), the
reverse, and the benchmark's order again. Rounds 1 and 3 put each provider
at the same place in the order, round 3 later in the case. Prints each
provider's three medians (µs) and the best peer over gemsops per round.

usage: python -m tools.norm_order case ...
  case = op,M,N,dtype as tools/norm_launch_shapes' (ln, rms, addln, addrms)
  GEMSOPS_BENCH_FLUSH as the benchmark's; a graph is always captured
  NORM_ORDER_SETTLE=sleep|busy: before a case's first round, 1 s idle
  (sleep) or 1 s of back-to-back flushes (busy): whether the first
  round's slowness follows the case's new tensors or the GPU's state
  NORM_ORDER_CLOCKS=1: the median SM clock (nvidia-smi every 50 ms, as
  tools/mm_clocks) over each timing, printed at the end"""

import os
import statistics
import sys
import time


def settle(how):
    import torch

    if how == "sleep":
        torch.cuda.synchronize()
        time.sleep(1.0)
    elif how == "busy":
        from benchmark.performance_utils import FLUSH
        from tools.norm_ncu import flush_named

        flush = flush_named(FLUSH)
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            for _ in range(20):
                flush()
            torch.cuda.synchronize()
    elif how:
        raise SystemExit(
            f"norm_order: NORM_ORDER_SETTLE={how!r}: sleep or busy"
        )


def main(argv):
    if not argv:
        print(__doc__)
        return 2
    # before the harness is imported: it reads the switch at import time
    os.environ["GEMSOPS_BENCH_GRAPH"] = "1"
    import torch

    from benchmark.performance_utils import FLUSH, Benchmark
    from tools.norm_launch_shapes import case_args, providers

    how = os.environ.get("NORM_ORDER_SETTLE", "")
    clocks = os.environ.get("NORM_ORDER_CLOCKS") == "1"
    bench = Benchmark("norm_order", None, None, None, [], [])
    windows = []
    if clocks:
        from tools.mm_clocks import parse_samples, sampler

        smi = sampler()
    for spec in argv:
        op, m, n, dt = spec.split(",")
        args = case_args(op, int(m), int(n), getattr(torch, dt))
        found = providers(op)
        names = ["torch", "gemsops"]
        names += [k for k in found if k not in names]
        times = {k: [] for k in names}
        settle(how)
        for r, order in enumerate((names, names[::-1], names)):
            for k in order:
                t0 = time.time()
                try:
                    times[k].append(bench._timed(found[k], args)[0] * 1e3)
                except Exception:  # a peer refusing a case
                    times[k].append(float("nan"))
                windows.append((spec, r + 1, k, t0, time.time()))
        # a refusing peer's NaN left out of the best
        peers = [v for k, v in times.items() if k != "gemsops"]
        ratios = [
            min(v[i] for v in peers if v[i] == v[i]) / times["gemsops"][i]
            for i in range(3)
        ]
        line = " ".join(
            f"{k} " + "/".join(f"{t:.2f}" for t in v) for k, v in times.items()
        )
        print(
            f"{FLUSH} {spec:24s} {line} | best/gems per round "
            + " ".join(f"{r:.3f}" for r in ratios),
            flush=True,
        )
        del args
        torch.cuda.empty_cache()
    if clocks:
        time.sleep(0.2)
        smi.terminate()
        samples = parse_samples(smi)
        for spec, r, k, t0, t1 in windows:
            mhz = [m for t, m, _, _ in samples if t0 <= t <= t1]
            mid = f"{statistics.median(mhz):6.0f} MHz" if mhz else "no samples"
            print(f"clocks {spec:24s} round {r} {k:9s} {mid} ({len(mhz)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
