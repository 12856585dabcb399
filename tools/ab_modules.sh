#!/bin/bash
# A/B/A/B of modules built beforehand, in one run on a GPU machine: each
# variant is a gzipped gemsops/_C*.so (built here, `setup.py build_ext`
# for sm_90a, ~11 MB gzipped), copied into the tree in turn; the cases are
# timed after each, twice over (cross-run times drift; docs/performance.md,
# Method), and each case's best time a variant is printed against the
# first. Building the modules on another machine keeps the GPU machine's
# time for timing (tools/ab.sh rebuilds there instead).
# usage: bash tools/ab_modules.sh "A.so.gz B.so.gz ..." "case ..."
#   cases: tools/norm_time.py's (op,M,N,dtype[,fp32]), or the timer's
#   AB_TIMER: the timing command (default python3 -m tools.norm_time;
#     python3 -m tools.mm_time for the matmul), printing `case gems Xus`
#   the .so.gz files go with the tree to the GPU machine (keep them in a
#   folder git ignores)
set -o pipefail
export PYTHONUNBUFFERED=1 GEMSOPS_BENCH_GRAPH=1
export GEMSOPS_BENCH_FLUSH=${GEMSOPS_BENCH_FLUSH:-read}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/gemsops_out}
mkdir -p "$OUT"
read -r -a modules <<< "$1"
target=$(ls gemsops/_C*.so 2> /dev/null | head -1)
target=${target:-gemsops/_C.abi3.so}
for rep in 1 2; do
    for i in "${!modules[@]}"; do
        gunzip -c "${modules[$i]}" > "$target" || exit 1
        echo "== ${modules[$i]} (run $rep)"
        # shellcheck disable=SC2086  # the cases are words
        ${AB_TIMER:-python3 -m tools.norm_time} $2 | tee -a "$OUT/ab_modules_$i.txt"
    done
done
python3 - "${#modules[@]}" "$OUT" "${modules[@]}" << 'EOF'
import sys

n, out, names = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
best = {}
for i in range(n):
    for line in open(f"{out}/ab_modules_{i}.txt"):
        p = line.split()
        if len(p) == 3 and p[1] == "gems":
            t = float(p[2].removesuffix("us"))
            best.setdefault(p[0], [None] * n)
            if best[p[0]][i] is None or t < best[p[0]][i]:
                best[p[0]][i] = t
print("case, then each module's best µs (its speed over the first's)")
print("modules: " + " ".join(f"[{i}] {m}" for i, m in enumerate(names)))
for case, ts in best.items():
    cells = [
        f"[{i}] {t:8.2f} ({ts[0] / t:.3f})" if t and ts[0] else f"[{i}] -"
        for i, t in enumerate(ts)
    ]
    print(f"{case:30s} " + " ".join(cells))
EOF
