"""Whether a norm provider's time depends on when in a case it is timed:
every provider of a case timed by the benchmark's own method
(Benchmark._timed: a CUDA-graph replay under do_bench, L2 flushed) in
three rounds, the benchmark's order (torch, gemsops, then the peers), the
reverse, and the benchmark's order again. Rounds 1 and 3 put each provider
at the same place in the order, round 3 later in the case. Prints each
provider's three medians (µs) and the best peer over gemsops per round.

usage: python -m tools.norm_order case ...
  case = op,M,N,dtype as tools/norm_launch_shapes' (ln, rms, addln, addrms)
  GEMSOPS_BENCH_FLUSH as the benchmark's; a graph is always captured"""

import os
import sys


def main(argv):
    if not argv:
        print(__doc__)
        return 2
    # before the harness is imported: it reads the switch at import time
    os.environ["GEMSOPS_BENCH_GRAPH"] = "1"
    import torch

    from benchmark.performance_utils import FLUSH, Benchmark
    from tools.norm_launch_shapes import case_args, providers

    bench = Benchmark("norm_order", None, None, None, [], [])
    for spec in argv:
        op, m, n, dt = spec.split(",")
        args = case_args(op, int(m), int(n), getattr(torch, dt))
        found = providers(op)
        names = ["torch", "gemsops"]
        names += [k for k in found if k not in names]
        times = {k: [] for k in names}
        for order in (names, names[::-1], names):
            for k in order:
                try:
                    times[k].append(bench._timed(found[k], args)[0] * 1e3)
                except Exception:  # a peer refusing a case
                    times[k].append(float("nan"))
        peers = [v for k, v in times.items() if k != "gemsops"]
        ratios = [
            min(v[i] for v in peers) / times["gemsops"][i] for i in range(3)
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
