#!/bin/bash
# Nsight Compute report (throughput, warp stalls, top stall sites) of the
# LayerNorm backward kernel on the bar shapes, and its SASS. Run after a
# build (bash tools/device_check.sh none). Clocks are left as found
# (--clock-control none). usage: bash tools/ln_bwd_profile.sh [cases...]
#   a case is M,N,dtype (default: 16384,4096,float16 16384,4096,float32)
OUT=${OUT:-/tmp/gemsops_out}
cases=${*:-16384,4096,float16 16384,4096,float32}
for c in $cases; do
    IFS=, read -r m n dt <<< "$c"
    ncu --clock-control none --kernel-name regex:fused_atomic \
        --launch-skip 1 --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section WarpStateStats --section SchedulerStats \
        --section Occupancy --section LaunchStats \
        --section InstructionStats --section SourceCounters \
        python3 -m tools.ln_bwd_ncu "$m" "$n" "$dt" 3 \
        > "$OUT/ncu_${m}x${n}_${dt}.txt" 2>&1
    grep -E "us, |Duration|DRAM Throughput|Memory Throughput|Issue Slots Busy|Warp Cycles Per Issued|Stall|Achieved Occupancy|Registers Per|No Eligible|Executed Ipc A" \
        "$OUT/ncu_${m}x${n}_${dt}.txt" | head -40
done
python3 -m tools.ln_bwd_ncu 16384 4096 float16 5
so=$(ls gemsops/_C*.so | head -1)
cuobjdump -sass "$so" > /tmp/all.sass 2>/dev/null
python3 - "$OUT" <<'PY'
import re, sys
text = open("/tmp/all.sass").read()
blocks = re.split(r"\n(?=\s*Function : )", text)
for want, tag in (("I6__halfS", "fp16"), ("IffLi512ELi4E", "fp32")):
    for b in blocks:
        head = b.strip().splitlines()[0] if b.strip() else ""
        if "fused_atomic" in head and want in head and ("Li512ELi8E" in head or tag == "fp32"):
            open(f"{sys.argv[1]}/sass_bwd_{tag}.txt", "w").write(b)
            n = len(re.findall(r"/\*[0-9a-f]{4}\*/", b))
            print(tag, head[:140], "instructions:", n)
            break
PY
