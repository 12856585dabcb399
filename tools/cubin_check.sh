#!/bin/bash
# Whether the working tree's CUDA sources compile to other machine code
# than a base revision's, with no GPU: each source compiled to a cubin per
# target (the default build's device flags), at BASE and in the working
# tree, then each target's kernels compared by tools/cubin_diff, every
# source of a side taken together (code moved between sources compares as
# the same). A refactor whose every target reads "0 differ, 0 only in A, 0
# only in B" changes no kernel: what runs is the code that already ran on
# the GPU. Host code is not compared; build the module and import it.
# usage: bash tools/cubin_check.sh BASE [SOURCE.cu ...]
#   SOURCE: names in csrc/cuda (default: every .cu of either side; the
#     matmul's and the LayerNorm forward's take minutes each a target)
#   CUBIN_ARCHS: targets (default "90a 80", the default build's)
#   CUBIN_JOBS: nvcc processes at once (default: the CPU count)
set -euo pipefail
base=${1:?usage: bash tools/cubin_check.sh BASE [SOURCE.cu ...]}
shift
root=$(git rev-parse --show-toplevel)
archs=${CUBIN_ARCHS:-"90a 80"}
jobs=${CUBIN_JOBS:-$(nproc)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/base" "$work/head"
git -C "$root" archive "$base" csrc include | tar -x -C "$work/base"
(cd "$root" && tar -c csrc include) | tar -x -C "$work/head"
if [ $# -gt 0 ]; then
    sources=("$@")
else
    mapfile -t sources < <(cd "$work" && ls base/csrc/cuda/*.cu \
        head/csrc/cuda/*.cu | xargs -n1 basename | sort -u)
fi
# the default build defines both for every target (setup.py, gencode_flags)
defines="-DGEMSOPS_HAVE_SM90A=1 -DGEMSOPS_HAVE_PDL=1"
for side in base head; do
    for arch in $archs; do
        mkdir -p "$work/out/$side/$arch"
        for src in "${sources[@]}"; do
            [ -f "$work/$side/csrc/cuda/$src" ] || continue
            echo "$side $arch $src"
        done
    done
done | xargs -P "$jobs" -L 1 bash -c '
    side=$0 arch=$1 src=$2 work='"$work"'
    nvcc -cubin -gencode=arch=compute_$arch,code=sm_$arch -O3 -std=c++17 \
        -I"$work/$side/include" -I"$work/$side/csrc" '"$defines"' \
        -o "$work/out/$side/$arch/${src%.cu}.cubin" \
        "$work/$side/csrc/cuda/$src" 2> "$work/out/$side/$arch/${src%.cu}.log" ||
        { cat "$work/out/$side/$arch/${src%.cu}.log" >&2; exit 255; }'
for arch in $archs; do
    a=$(ls "$work/out/base/$arch"/*.cubin | paste -sd,)
    b=$(ls "$work/out/head/$arch"/*.cubin | paste -sd,)
    echo "sm_$arch ($base -> working tree):"
    (cd "$root" && python3 -m tools.cubin_diff "$a" "$b")
done
