"""Small matmuls: kernel time (do_bench, L2 flushed; three repeats to show
the spread) of gemsops per schedule beside torch, and the wall time per call
of a back-to-back loop (host cost where the kernel is short).
Usage: python tools/mm_small_probe.py"""
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

import gemsops
from gemsops.ops.matmul import SCHEDULES

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmark"))
from host_cost import per_call_us  # noqa: E402

SHAPES = [(384, 384, 384), (256, 256, 768), (512, 2304, 512),
          (2048, 512, 256), (4096, 4096, 4096)]


def main(dtype=torch.bfloat16):
    for sched in ("data-parallel", "hybrid"):
        gemsops.set_schedule(sched)
        for m, n, k in SHAPES:
            a = torch.randn(m, k, device="cuda", dtype=dtype)
            b = torch.randn(k, n, device="cuda", dtype=dtype)
            c = torch.empty(1, m, n, device="cuda", dtype=dtype)
            plan = gemsops._C.matmul_plan(a[None], b[None], c,
                                          SCHEDULES[sched], 0, 0, 0)
            gems = [do_bench(lambda: gemsops.mm(a, b), warmup=10, rep=50)
                    for _ in range(3)]
            ref = do_bench(lambda: torch.mm(a, b), warmup=10, rep=50)
            print(f"{sched:>13} {m}x{n}x{k} {plan['mainloop']} ctas "
                  f"{plan['ctas']} sk_tiles {plan['sk_tiles']} sk_ctas "
                  f"{plan['sk_ctas']}: gemsops ms "
                  f"{' '.join(f'{t:.4f}' for t in gems)}, torch {ref:.4f}; "
                  f"loop {per_call_us(lambda: gemsops.mm(a, b), 500):.1f} "
                  f"us/call (torch {per_call_us(lambda: torch.mm(a, b), 500):.1f})")


if __name__ == "__main__":
    main()
