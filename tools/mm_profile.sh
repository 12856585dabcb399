#!/bin/bash
# Nsight Compute side by side: gemsops' matmul kernel and cuBLAS's on the
# given shapes (tools/mm_probe.py's cases), one launch each after a few
# warm-up calls, clocks and caches left as found: where a k-step's time
# goes (L2 hit rate and throughput, DRAM bytes, warp stalls, issue slots).
# Run after a build.
# usage: bash tools/mm_profile.sh [case ...]   (default 768,512,2560)
OUT=${OUT:-/tmp/gemsops_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
cases=${*:-768,512,2560}
for c in $cases; do
    for who in gemsops torch; do
        f="$OUT/ncu_mm_${who}_${c//[:,]/_}.txt"
        ncu --clock-control none --cache-control none \
            --kernel-name regex:"matmul_|nvjet|gemm" --launch-skip 3 \
            --launch-count 1 \
            --section SpeedOfLight --section MemoryWorkloadAnalysis \
            --section WarpStateStats --section SchedulerStats \
            --section LaunchStats \
            --metrics dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sector_hit_rate.pct,smsp__inst_executed.sum \
            python3 - "$c" "$who" > "$f" 2>&1 <<'PY'
import sys

import torch

import gemsops
from tools.mm_probe import operands

_, a, b, _ = operands(sys.argv[1])
fn = gemsops.matmul if sys.argv[2] == "gemsops" else torch.matmul
for _ in range(4):
    fn(a, b)
torch.cuda.synchronize()
PY
        echo "== $c $who"
        grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|dram__bytes|lts__t_sector|inst_executed|Grid Size|Block Size|Registers Per|Warp Cycles Per Issued|Issue Slots Busy|L2 Hit Rate|L1/TEX Hit|Mem Busy|Max Bandwidth|Stall" "$f" | head -60
    done
done
