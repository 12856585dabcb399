"""Fits the matmul planner's cost model (csrc/cuda/matmul_cost.cuh) to the
lines tools/mm_calibrate.py wrote, and says how well the model's tile
choice does against the best measured one on those shapes.

usage: python tools/mm_cost_fit.py [--tile BMxBN] FILE.jsonl [...]
--tile: fit that tile's two constants alone, to its data-parallel lines
(the other tiles' constants as written down; no Stream-K term).
A plan (shape, width, schedule) timed in several files counts once, at its
least time: a slow outlier is a disturbed run, not the plan's cost.

The model, for a wgmma launch of BM x BN tiles and its Stream-K schedule
(the counts come from the schedule; the constants are fitted):

  t = iter_us[tile] * critical iterations    (the busiest CTA's k-steps)
    + tile_us[tile] * critical tiles         (its epilogues and fills)
    + sk_us_per_mb * Stream-K operand MB     (the split tiles' loads, which
                                              staggered CTAs take from DRAM)

No constant term: it is the same for every candidate and the planner only
compares them.
"""

import json
import math
import sys

import numpy as np

BK = 64


def counts(r):
    """What the model counts for one schedule (matmul_plan's dict)."""
    it, sk, skc = r["iters"], r["sk_tiles"], max(r["sk_ctas"], 1)
    waves = math.ceil(r["dp_tiles"] / r["ctas"])
    share = math.ceil(sk * it / skc) if sk else 0
    crit_iters = waves * it + share
    crit_tiles = waves + (math.ceil(sk / skc) + 1 if sk else 0)
    sk_mb = sk * it * (tile_of(r)[0] + r["bn"]) * BK * 2 / 1e6
    return crit_iters, crit_tiles, sk_mb


TILES = ((128, 256), (128, 192), (128, 128), (128, 64), (64, 64))


def tile_of(r):
    return r.get("bm", 128), r["bn"]


def features(r):
    ci, ct, sk_mb = counts(r)
    f = []
    for t in TILES:
        f += [ci * (tile_of(r) == t), ct * (tile_of(r) == t)]
    return f + [sk_mb]


NAMES = tuple(
    f"{what}_us[{bm}x{bn}]" for bm, bn in TILES for what in ("iter", "tile")
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
    return (r["m"], r["n"], r["k"], tile_of(r), r["sk_tiles"], r["sk_ctas"])


def fit_one_tile(rows, tile):
    """iter_us and tile_us of one tile, least squares over its
    data-parallel lines."""
    rows = [r for r in rows if tile_of(r) == tile and r["sk_tiles"] == 0]
    x = np.array([counts(r)[:2] for r in rows], dtype=float)
    y = np.array([r["us"] for r in rows])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    err = np.abs(x @ coef / y - 1)
    print(
        f"{tile[0]}x{tile[1]} over {len(rows)} lines: iter_us {coef[0]:.4f}"
        f", tile_us {coef[1]:.4f}; prediction error: median "
        f"{np.median(err):.3f}, max {err.max():.3f}"
    )


def main(args):
    tile = None
    if args[:1] == ["--tile"]:
        tile = tuple(int(v) for v in args[1].split("x"))
        args = args[2:]
    paths = args
    least = {}
    for path in paths:
        for line in open(path):
            r = json.loads(line)
            old = least.get(plan_key(r))
            if old is None or r["us"] < old["us"]:
                least[plan_key(r)] = r
    rows = list(least.values())
    if tile is not None:
        fit_one_tile(rows, tile)
        return
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
        same = [c for c in d if (c[0][1], c[1]) == fixed and c[0][0] == 128]
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
