#!/bin/bash
# Where the LayerNorm backward's dW/dB tail goes: Nsight Compute durations
# of the fused kernel and of the stripe-sum kernel, with all gradients and
# with dx alone, plus the fused kernel's L2 and DRAM throughput (the
# reductions are L2 atomics). Caches and clocks are left as found.
# Run after a build (tools/device_check.sh none).
# usage: bash tools/ln_bwd_tail.sh [M,N,dtype ...]  (default 16384,4096,bfloat16)
OUT=${OUT:-/tmp/gemsops_out}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
cases=${*:-16384,4096,bfloat16}
for c in $cases; do
    IFS=, read -r m n dt <<< "$c"
    for grads in xwb x; do
        ncu --clock-control none --cache-control none \
            --kernel-name regex:"fused_atomic|sum_partials" \
            --launch-skip 2 --launch-count 2 \
            --section SpeedOfLight --section MemoryWorkloadAnalysis \
            python3 tools/ln_bwd_ncu.py "$m" "$n" "$dt" 4 "$grads" \
            > "$OUT/ncu_tail_${m}x${n}_${dt}_${grads}.txt" 2>&1
        echo "== $c $grads"
        f="$OUT/ncu_tail_${m}x${n}_${dt}_${grads}.txt"
        grep -q Duration "$f" || tail -5 "$f"
        grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|L2 Cache Throughput|Mem Busy" \
            "$f" | head -20
    done
done
