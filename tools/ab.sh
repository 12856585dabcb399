#!/bin/bash
# A/B/.../A timing inside one run on a GPU machine: rebuild one source file with each
# variant's NVCC_APPEND_FLAGS, run the timing command after each build, then
# the first variant again (cross-run times drift; docs/performance.md, Method).
# usage: AB_FILE=csrc/cuda/prod_fwd.cu bash tools/ab.sh "<timing command>" \
#            "" "-DGEMSOPS_AB_X=1" ...      (the first variant is A)
#   timing command: e.g. "python3 -m tools.prod_time 4096,4096:d1:float16"
#   or "python3 -m tools.ln_time 16384,4096:bwd:bfloat16"
# Run after bash tools/device_check.sh has built the tree.
OUT=${OUT:-/tmp/gemsops_out}
export GEMSOPS_CUDA_ARCHS=${GEMSOPS_CUDA_ARCHS:-90a}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
#   A variant "@FILE" builds FILE in place of AB_FILE (say, the committed
#   version saved by `git show HEAD:$AB_FILE > FILE`) with no extra flags.
timer=$1
shift
n=0
cp "$AB_FILE" /tmp/ab_file.orig
for variant in "$@" "$1"; do
    flags=$variant
    cp /tmp/ab_file.orig "$AB_FILE"
    if [ "${variant#@}" != "$variant" ]; then
        cp "${variant#@}" "$AB_FILE"
        flags=
    fi
    touch "$AB_FILE"
    NVCC_APPEND_FLAGS="$flags" python3 setup.py build_ext --inplace \
        > "$OUT/build_ab.log" 2>&1 || tail -20 "$OUT/build_ab.log"
    grep -q "building 'gemsops._C'" "$OUT/build_ab.log" || echo "!! not relinked"
    echo "== variant $n: ${variant:-(as committed)}"
    eval "$timer" | tee "$OUT/ab_$n.txt"
    n=$((n + 1))
done
cp /tmp/ab_file.orig "$AB_FILE"
rm -f "$OUT/build_ab.log"
