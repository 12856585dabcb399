#!/bin/bash
# A/B/.../A timing inside one device call: rebuild one source file with each
# variant's NVCC_APPEND_FLAGS, run the timing command after each build, then
# the first variant again (cross-run times drift; METHOD.md).
# usage: AB_FILE=csrc/cuda/prod_fwd.cu bash tools/ab.sh "<timing command>" \
#            "" "-DGEMSOPS_AB_X=1" ...      (the first variant is A)
# Run after tools/device_check.sh has built the tree.
OUT=${OUT:-/tmp/gemsops_out}
export GEMSOPS_CUDA_ARCHS=${GEMSOPS_CUDA_ARCHS:-90a}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
timer=$1
shift
n=0
for flags in "$@" "$1"; do
    touch "$AB_FILE"
    NVCC_APPEND_FLAGS="$flags" python3 setup.py build_ext --inplace \
        > "$OUT/build_ab.log" 2>&1 || tail -20 "$OUT/build_ab.log"
    grep -q "building 'gemsops._C'" "$OUT/build_ab.log" || echo "!! not relinked"
    echo "== variant $n: ${flags:-(as committed)}"
    eval "$timer" | tee "$OUT/ab_$n.txt"
    n=$((n + 1))
done
rm -f "$OUT/build_ab.log"
