#!/bin/bash
# A/B timing of the LayerNorm backward: the working tree's kernel, then the
# same file rebuilt with NVCC_APPEND_FLAGS="$AB_FLAGS" (the B side, e.g.
# -DGEMSOPS_AB_...). Run after tools/device_check.sh has built the tree.
# usage: AB_FLAGS=-D... bash tools/ln_bwd_ab.sh [cases...]  (case M,N,dtype)
OUT=${OUT:-/tmp/gemsops_out}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
cases=${*:-16384,4096,float16 16384,4096,bfloat16 8192,8192,bfloat16 8192,8192,float16 16384,4096,float32 4096,12288,bfloat16 256,262144,bfloat16 200000,64,float16}
time_all() {
    for c in $cases; do
        IFS=, read -r m n dt <<< "$c"
        python3 tools/ln_bwd_ncu.py "$m" "$n" "$dt" 30
    done
}
echo "== A (tree)"; time_all | tee "$OUT/ab_a.txt"
touch csrc/cuda/layer_norm_bwd.cu
NVCC_APPEND_FLAGS="$AB_FLAGS" python3 setup.py build_ext --inplace > "$OUT/build_b.log" 2>&1 || tail -20 "$OUT/build_b.log"
echo "== B ($AB_FLAGS)"; time_all | tee "$OUT/ab_b.txt"
echo "== A again"; touch csrc/cuda/layer_norm_bwd.cu
python3 setup.py build_ext --inplace > "$OUT/build_a.log" 2>&1 || tail -20 "$OUT/build_a.log"
time_all | tee "$OUT/ab_a2.txt"
rm -f "$OUT"/build_*.log
