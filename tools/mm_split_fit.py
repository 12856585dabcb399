"""The split-k constants of the matmul cost model (kSplitKUs, kSplitKScale in
csrc/cuda/matmul_cost.cuh), chosen by replaying the planner: for each pair
on a grid, the header is copied with that pair, wgmma_cheapest is compiled
for the host (g++) and asked for each shape's plan, and the plan's time is
looked up in tools/mm_plans.py output, which times every width under every
schedule. Printed: the geomean of the chosen plan's time over the best
measured plan's, per file, best pairs first, and the header's own pair.

usage: python -m tools.mm_split_fit PLANS.txt [PLANS.txt ...]
       python -m tools.mm_split_fit --small-tile CAL.jsonl PLANS.txt [...]
       python -m tools.mm_split_fit --square-tile PLANS.txt [...]
       python -m tools.mm_split_fit --t96x64 PLANS.txt [...]
(bf16 lines; the planner for 132 SMs, one wgmma CTA an SM)

--t80x128, --t96x128, --t80x64, --t96x64: the same for one of the swapped
product's narrow tiles (kWgmmaT80 ...). Every mode replays the planner as
it runs on the timed products (torch.matmul's row-major operands), the
swapped product's tiles among its choices.

--small-tile: the 64 x 64 tile's iter_us and tile_us (kWgmmaSmall) on a
grid instead, the split-k pair held, each pair scored on the calibration
lines (tools/mm_calibrate.py: the whole-tile and hybrid plans) and on the
plans files (every schedule, split-k included); shapes whose chosen plan
was not timed are left out of a score and counted. --square-tile: the
same for the 192 x 192 tile (kWgmmaSquare), on plans files alone (lines
of one shape in several files are merged)."""

import collections
import itertools
import json
import math
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEADER = ROOT / "csrc" / "cuda" / "matmul_cost.cuh"
LINE = re.compile(r"(\d+)x(\d+)x(\d+) torch\.bfloat16: torch [\d.]+ auto")
PLAN = re.compile(r"(\d+(?:x\d+)?)/(da|st|hy|sp) ([\d.]+)")

HARNESS = r"""
#include <cstdio>
#include <cstdlib>
#include "gemsops/matmul.h"
extern "C" size_t gemsops_dtype_size(gemsops_dtype d)
{
    return d == GEMSOPS_FLOAT32 ? 4 : 2;
}
#include "matmul_cost.cuh"
using namespace gemsops;
int main(int argc, char **argv)
{
    for (int i = 1; i + 2 < argc; i += 3) {
        gemsops_matmul_params p{};
        p.m = atoll(argv[i]);
        p.n = atoll(argv[i + 1]);
        p.k = atoll(argv[i + 2]);
        p.batch = 1;
        p.dtype = GEMSOPS_BFLOAT16;
        p.mode = GEMSOPS_SK_AUTO;
        // the timed products are torch.matmul's on row-major operands,
        // which the swapped product's tiles may take
        const wgmma_plan w =
            wgmma_cheapest(&p, GEMSOPS_MAINLOOP_AUTO, 132, 8, true);
        const bool t = wgmma_transposed(w.width);
        gemsops_sk_schedule s;
        gemsops_sk_plan(&s, t ? p.n : p.m, t ? p.m : p.n, p.k, 1,
                        wgmma_bm(w.width), wgmma_bn(w.width), 64, 8, 132,
                        w.mode, 0);
        const char *sched = s.split ? "sp" : s.sk_tiles ? "hy" : "da";
        if (wgmma_bm(w.width) == 128 && !t) {
            printf("%d/%s\n", wgmma_bn(w.width), sched);
        }
        else {
            printf("%dx%d/%s\n", wgmma_bn(w.width), wgmma_bm(w.width), sched);
        }
    }
}
"""


def read_plans(path):
    """{(m, n, k): {"128/sp": us, ...}} of one mm_plans output (a shape's
    lines merged)"""
    shapes = {}
    for line in Path(path).read_text().splitlines():
        m = LINE.match(line)
        if m:
            key = tuple(int(v) for v in m.groups())
            shapes.setdefault(key, {}).update(
                {f"{w}/{s}": float(t) for w, s, t in PLAN.findall(line)}
            )
    return shapes


def constant(text, name):
    return float(re.search(rf"constexpr double {name} = ([\d.]+);", text)[1])


def choices(text, shapes, tmp):
    (tmp / "matmul_cost.cuh").write_text(text)
    exe = tmp / "choose"
    subprocess.run(
        [
            "g++",
            "-std=c++17",
            f"-I{tmp}",
            f"-I{ROOT / 'include'}",
            f"-I{ROOT / 'csrc' / 'cuda'}",
            "-x",
            "c++",
            str(tmp / "h.cpp"),
            "-o",
            str(exe),
        ],
        check=True,
    )
    args = [str(v) for key in shapes for v in key]
    out = subprocess.run(
        [str(exe), *args], check=True, capture_output=True, text=True
    ).stdout.split()
    return dict(zip(shapes, out))


def score(picks, shapes):
    logs = [math.log(t[picks[k]] / min(t.values())) for k, t in shapes.items()]
    return math.exp(sum(logs) / len(logs))


def read_calibration(path):
    """{(m, n, k): {"128/da": us, "64x64/hy": us, ...}}, each plan at its
    least time"""
    shapes = collections.defaultdict(dict)
    for line in Path(path).read_text().splitlines():
        r = json.loads(line)
        bm = r.get("bm", 128)
        tile = f"{r['bn']}{'' if bm == 128 else f'x{bm}'}"
        key = f"{tile}/{'hy' if r['sk_tiles'] else 'da'}"
        t = shapes[(r["m"], r["n"], r["k"])]
        t[key] = min(t.get(key, math.inf), r["us"])
    return dict(shapes)


def score_timed(picks, shapes):
    """score() over the shapes whose pick was timed, and how many were
    not"""
    timed = {k: t for k, t in shapes.items() if picks[k] in t}
    return score(picks, timed), len(shapes) - len(timed)


# the tiles whose two constants are fitted alone: header name, bm, bn, the
# grids of iter_us and tile_us
SWAPPED_ITERS = [round(0.15 + 0.025 * i, 3) for i in range(21)]
SWAPPED_TILES = [0.25 * i for i in range(0, 9)]
TILE_FITS = {
    "--t80x128": ("kWgmmaT80", 128, 80, SWAPPED_ITERS, SWAPPED_TILES),
    "--t96x128": ("kWgmmaT96", 128, 96, SWAPPED_ITERS, SWAPPED_TILES),
    "--t80x64": ("kWgmmaT80x64", 64, 80, SWAPPED_ITERS, SWAPPED_TILES),
    "--t96x64": ("kWgmmaT96x64", 64, 96, SWAPPED_ITERS, SWAPPED_TILES),
    "--small-tile": (
        "kWgmmaSmall",
        64,
        64,
        [round(0.07 + 0.02 * i, 2) for i in range(12)],
        [0.5 * i for i in range(1, 13)],
    ),
    "--square-tile": (
        "kWgmmaSquare",
        192,
        192,
        [round(0.70 + 0.025 * i, 3) for i in range(13)],
        [0.5 * i for i in range(0, 13)],
    ),
}


def fit_tile(flag, cal_path, plan_paths):
    name, bm, bn, its, tls = TILE_FITS[flag]
    sets = [read_calibration(cal_path)] if cal_path else []
    sets += [read_plans(p) for p in plan_paths]
    if not cal_path:  # one file's shapes, however many files hold them
        merged = {}
        for f in sets:
            for k, v in f.items():
                merged.setdefault(k, {}).update(v)
        sets = [merged]
    shapes = {k: v for f in sets for k, v in f.items()}
    text = HEADER.read_text()
    pat = re.compile(rf"({name} = \{{{bm}, {bn}, 1, )[\d.e+]+, [\d.e+]+\}}")
    label = f"{bn}x{bm}"
    results = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "h.cpp").write_text(HARNESS)
        for it, tl in list(itertools.product(its, tls)) + [(1e9, 0.0)]:
            t = pat.sub(rf"\g<1>{it}, {tl}}}", text)
            picks = choices(t, shapes, tmp)
            per = [score_timed(picks, f) for f in sets]
            total = math.prod(g for g, _ in per)
            n = sum(v.startswith(label) for v in picks.values())
            results.append((total, it, tl, per, n))
    results.sort()
    none = [r for r in results if r[1] == 1e9]
    for _total, it, tl, per, n in results[:8] + none:
        what = "without it" if it == 1e9 else f"{it:.3f} {tl:.1f}"
        print(
            f"{bm} x {bn} {what}: chosen/best "
            + " ".join(f"{g:.4f} ({miss} untimed)" for g, miss in per)
            + f"; {n} of {len(shapes)} shapes take it"
        )


def main(paths):
    if paths[:1] == ["--small-tile"]:
        fit_tile(paths[0], paths[1], paths[2:])
        return
    if paths[:1] and paths[0] in TILE_FITS and paths[0] != "--small-tile":
        fit_tile(paths[0], None, paths[1:])
        return
    files = [read_plans(p) for p in paths]
    shapes = {k: v for f in files for k, v in f.items()}
    text = HEADER.read_text()
    own = (constant(text, "kSplitKUs"), constant(text, "kSplitKScale"))
    results = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        (tmp / "h.cpp").write_text(HARNESS)
        for us in (1, 2, 3, 4, 5, 6, 7, 8, 9, 9.5, 10, 11, 12, own[0]):
            for scale in (1.0, 1.1, 1.25, 1.5, 1.75, 2.0, own[1]):
                t = re.sub(r"(kSplitKUs = )[\d.]+;", rf"\g<1>{us};", text)
                t = re.sub(r"(kSplitKScale = )[\d.]+;", rf"\g<1>{scale};", t)
                picks = choices(t, shapes, tmp)
                results.append(
                    ((us, scale), [score_timed(picks, f)[0] for f in files])
                )
    results = sorted(
        set((k, tuple(v)) for k, v in results), key=lambda r: r[1]
    )
    for (us, scale), per_file in results[:10]:
        print(
            f"kSplitKUs {us:5}  kSplitKScale {scale:4}  chosen/best "
            + " ".join(f"{g:.4f}" for g in per_file)
        )
    mine = [r for r in results if r[0] == own][0]
    print(
        f"the header's ({own[0]}, {own[1]}): "
        + " ".join(f"{g:.4f}" for g in mine[1])
    )


if __name__ == "__main__":
    main(sys.argv[1:])
