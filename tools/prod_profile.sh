#!/bin/bash
# Nsight Compute side by side: the gemsops prod kernels and FlagGems' (when
# its wheel is on PYTHONPATH) on the given cases; clocks left as found.
# Run after a build (bash tools/device_check.sh none).
# usage: bash tools/prod_profile.sh [case ...]   (case as in tools/prod_time.py)
OUT=${OUT:-/tmp/gemsops_out}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
cases=${*:-268435456:all:float16 4096,4096:d1:float16}
for c in $cases; do
    f="$OUT/ncu_prod_${c//[:,]/_}.txt"
    PROD_CALLS=2 ncu --clock-control none --kernel-name regex:prod \
        --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section WarpStateStats --section SchedulerStats \
        --section Occupancy --section LaunchStats \
        --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_srcunit_tex_op_read.sum,smsp__inst_executed.sum \
        python3 -m tools.prod_time "$c" > "$f" 2>&1
    echo "== $c"
    grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|dram__bytes|lts__t_sectors|inst_executed|Grid Size|Registers Per|Achieved Occupancy|Theoretical Occ|Warp Cycles Per Issued|Issue Slots Busy|L2 Hit Rate|Mem Busy|Max Bandwidth" "$f" | head -80
done
