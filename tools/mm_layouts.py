"""One product in every operand layout under a few forced plans, kernels
alone: where the planner's choice, or a tile it has no kernel for, depends
on how the operands lie. Layouts as tools/mm_probe.py's: nn (A and B
row-major), nt (B given as [N, K]), tn (A as [K, M]: nn.Linear's weight
gradient), tt. Each forced result is checked against a float64 product
(BAD after a time when it is off).

usage: python tools/mm_layouts.py M,N,K [...]   (bf16)"""

import sys

import gemsops
from tools.mm_probe import kernel_us, operands

PLANS = (
    ("auto", "auto"),
    ("data-parallel", "wgmma-192"),
    ("data-parallel", "wgmma-256"),
    ("stream-k", "wgmma-192"),
    ("stream-k", "wgmma-128"),
    ("data-parallel", "wgmma-192x192"),
    ("split-k", "wgmma-192x192"),
    ("split-k", "wgmma-128"),
)


def timed(fn):
    return min(kernel_us(fn) for _ in range(2))


def main(cases):
    for case in cases:
        for layout in ("nn", "nt", "tn", "tt"):
            _, a, b, _ = operands(f"{case}:bfloat16:{layout}")
            ref = a.double() @ b.double()
            row = [f"{case} {layout}: torch {timed(lambda: a @ b):6.1f}"]
            for schedule, mainloop in PLANS:
                gemsops.set_schedule(schedule, mainloop=mainloop)
                try:
                    err = (gemsops.matmul(a, b).double() - ref).norm()
                    bad = "" if err < 1e-2 * ref.norm() else " BAD"
                    t = timed(lambda: gemsops.matmul(a, b))
                    res = f"{t:6.1f}{bad}"
                except (RuntimeError, ValueError) as e:
                    res = f"err {type(e).__name__}"
                finally:
                    gemsops.set_schedule()
                row.append(f"{mainloop[6:]}/{schedule[:2]} {res}")
            print(" | ".join(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["3072,768,8192", "768,3072,8192"])
