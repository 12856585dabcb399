"""Where a kernel's warps wait, instruction by instruction, from Nsight
Compute's source page: for each kernel of the report, its warp-state
samples by stall reason, the instructions holding the most samples, and
the samples grouped by how many times an instruction ran (the k-step
loop's instructions run once a step a warp, the prologue's once a warp,
the fix-up's once a piece a warp: the groups split a kernel's time
between them without a line table).

usage: python -m tools.ncu_sass_stalls SOURCE.csv [top]
  SOURCE.csv: ncu -i REPORT --page source --csv --print-source sass
  (the report needs --section SourceCounters, and WarpStateStats for the
  reasons); top: instructions listed a kernel (default 12)
e.g. ncu -k regex:matmul_ --section WarpStateStats --section SourceCounters
         -o sk python3 script.py; then the two commands above."""

import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def kernels(path):
    """(kernel name, rows as dicts) for each kernel block of the CSV."""
    name, lines = None, []
    with open(path, newline="") as f:
        for line in f:
            if line.startswith('"Kernel Name"'):
                if name is not None:
                    yield name, list(csv.DictReader(lines))
                name = next(csv.reader([line]))[1]
                lines = []
            elif name is not None:
                lines.append(line)
    if name is not None:
        yield name, list(csv.DictReader(lines))


def count(row, key):
    try:
        return int(row.get(key) or 0)
    except ValueError:
        return 0


def report(name, rows, top):
    rows = [r for r in rows if r.get("Source")]
    total = sum(count(r, SAMPLES) for r in rows)
    print(f"== {name[:150]}")
    if total == 0:
        print("   no samples (was SourceCounters collected?)")
        return
    executed = sum(count(r, EXECUTED) for r in rows)
    print(
        f"   {len(rows)} instructions, {executed} warp instructions run, "
        f"{total} samples"
    )
    reasons = collections.Counter()
    for key in rows[0]:
        if key.startswith("stall_") and "Not Issued" not in key:
            reasons[key[6:]] = sum(count(r, key) for r in rows)
    print(
        "   reasons: "
        + ", ".join(
            f"{k} {v / total:.1%}" for k, v in reasons.most_common(8) if v
        )
    )
    ranked = sorted(enumerate(rows), key=lambda ir: -count(ir[1], SAMPLES))
    for i, r in ranked[:top]:
        print(
            f"   {count(r, SAMPLES) / total:6.1%}  #{i:<5d} "
            f"x{count(r, EXECUTED):<7d} {r['Source'].strip()[:80]}"
        )
    groups = collections.Counter()
    for r in rows:
        groups[count(r, EXECUTED)] += count(r, SAMPLES)
    print(
        "   samples by times run: "
        + ", ".join(f"x{k} {v}" for k, v in sorted(groups.items()) if v)
    )


def main(argv):
    if not argv:
        print(__doc__)
        return 2
    top = int(argv[1]) if len(argv) > 1 else 12
    seen = set()
    for name, rows in kernels(argv[0]):
        # ncu lists a kernel once a profiled launch; the same counts again
        key = (name, len(rows), sum(count(r, SAMPLES) for r in rows))
        if key not in seen:
            seen.add(key)
            report(name, rows, top)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
