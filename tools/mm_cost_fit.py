"""Fits the matmul planner's cost model (csrc/cuda/matmul_cost.cuh) to the
lines tools/mm_calibrate.py wrote, and says how well the model's tile
choice does against the best measured one on those shapes.

usage: python tools/mm_cost_fit.py FILE.jsonl [FILE.jsonl ...]
A plan (shape, width, schedule) timed in several files counts once, at its
least time: a slow outlier is a disturbed run, not the plan's cost.

The model, for a wgmma launch of 128 x BN tiles and its Stream-K schedule
(the counts come from the schedule; the constants are fitted):

  t = iter_us[BN] * critical iterations      (the busiest CTA's k-steps)
    + tile_us[BN] * critical tiles           (its epilogues and fills)
    + sk_us_per_mb * Stream-K operand MB     (the split tiles' loads, which
                                              staggered CTAs take from DRAM)

No constant term: it is the same for every candidate and the planner only
compares them.
"""

import json
import math
import sys

import numpy as np

BM, BK = 128, 64


def counts(r):
    """What the model counts for one schedule (matmul_plan's dict)."""
    it, sk, skc = r["iters"], r["sk_tiles"], max(r["sk_ctas"], 1)
    waves = math.ceil(r["dp_tiles"] / r["ctas"])
    share = math.ceil(sk * it / skc) if sk else 0
    crit_iters = waves * it + share
    crit_tiles = waves + (math.ceil(sk / skc) + 1 if sk else 0)
    sk_mb = sk * it * (BM + r["bn"]) * BK * 2 / 1e6
    return crit_iters, crit_tiles, sk_mb


WIDTHS = (256, 192, 128, 64)


def features(r):
    ci, ct, sk_mb = counts(r)
    f = []
    for bn in WIDTHS:
        f += [ci * (r["bn"] == bn), ct * (r["bn"] == bn)]
    return f + [sk_mb]


NAMES = tuple(
    f"{what}_us[{bn}]" for bn in WIDTHS for what in ("iter", "tile")
) + ("sk_us_per_mb",)


def old_rule(m, n, iters, sms):
    """The (bn, sk_tiles) the planner chose before the model: 128 x 256
    tiles when they fill a wave, Stream-K for a last wave at most half
    full."""
    bn = 256 if math.ceil(m / 128) * math.ceil(n / 256) >= sms else 128
    tiles = math.ceil(m / 128) * math.ceil(n / bn)
    rem = tiles % sms
    return bn, rem if 2 * rem <= sms and iters >= 2 else 0


def plan_key(r):
    return (r["m"], r["n"], r["k"], r["bn"], r["sk_tiles"], r["sk_ctas"])


def main(paths):
    least = {}
    for path in paths:
        for line in open(path):
            r = json.loads(line)
            old = least.get(plan_key(r))
            if old is None or r["us"] < old["us"]:
                least[plan_key(r)] = r
    rows = list(least.values())
    x = np.array([features(r) for r in rows])
    y = np.array([r["us"] for r in rows])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    for name, v in zip(NAMES, coef):
        print(f"{name:16s} {v:.4f}")
    pred = x @ coef
    err = np.abs(pred / y - 1)
    print(
        f"prediction error: median {np.median(err):.3f}, max {err.max():.3f}"
    )
    shapes = {}  # (m, n, k) -> {(bn, sk_tiles, sk_ctas): (us, predicted)}
    for r, p in zip(rows, pred):
        key = (r["m"], r["n"], r["k"])
        shapes.setdefault(key, {})[plan_key(r)[3:]] = (r["us"], p)
    picked, rule = [], []
    sms = max(r["ctas"] for r in rows)
    for (m, n, k), d in sorted(shapes.items()):
        best = min(t for t, _ in d.values())
        choice = min(d, key=lambda c: d[c][1])
        picked.append(d[choice][0] / best)
        fixed = old_rule(m, n, math.ceil(k / BK), sms)
        same = [c for c in d if c[:2] == fixed]
        if same:
            rule.append(d[same[0]][0] / best)

    def geo(v):
        return math.exp(sum(map(math.log, v)) / len(v))

    print(
        f"{len(shapes)} shapes; time over the best tile's: model "
        f"{geo(picked):.3f} (worst {max(picked):.2f}), fixed rule "
        f"{geo(rule):.3f} (worst {max(rule):.2f})"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
