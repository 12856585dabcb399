#!/bin/bash
# The norms on a GPU machine: build, the CUDA tests of LayerNorm,
# RMSNorm and the fused adds, a CUDA fuzz batch of the norms family, then
# the norms benchmarks beside torch, torch.compile and (from wheels in
# .whl/) FlagGems and Liger, each call timed as a CUDA-graph replay. Logs
# and result JSONs (one tarball) in $OUT.
# FlagGems 5.0.2 imports sqlalchemy (and it greenlet): put their cp312
# wheels beside it, or the benchmarks print "FlagGems not timed".
# usage: bash tools/device_norms.sh
#   TESTS=0 skips tests and fuzz; BENCH=fwd|bwd|all|0 (default all)
#   FLUSH=zero|read (GEMSOPS_BENCH_FLUSH; the bars read under read)
#   SWEEP=1: the N x M transformer sweep instead of the 11 cases
#   MEMCHECK=1: memcheck over the RMSNorm and fused-add tests (slow)
#   MODULE=path.so.gz: a module built on another machine instead of the
#     build; name its commit in GEMSOPS_COMMIT
#   RESUME=1: carry on this commit's result files (GEMSOPS_BENCH_RESUME),
#     for tables longer than one call: the files a call wrote come back
#     in results.tgz, so unpack them into benchmark/results here before
#     the next call, or it starts over; BENCH_K: a -k expression narrowing
#     each benchmark (e.g. "rms_norm_backward")
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/gemsops_out}
mkdir -p "$OUT"
if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile \
        --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
if [ -n "${MODULE:-}" ]; then
    gunzip -c "$MODULE" > gemsops/_C.abi3.so || exit 1
else
    GEMSOPS_CUDA_ARCHS=${GEMSOPS_CUDA_ARCHS:-90a} python3 setup.py build_ext \
        --inplace > "$OUT/build.log" 2>&1 || {
        tail -40 "$OUT/build.log"
        exit 1
    }
fi
if [ "${TESTS:-1}" = 1 ]; then
    timeout "${TEST_LIMIT:-200}" python3 -m pytest -m cuda -q \
        -p no:cacheprovider tests/test_layer_norm.py tests/test_rms_norm.py \
        tests/test_fused_add_norm.py > "$OUT/pytest_norms.log" 2>&1
    echo "pytest norms: exit $?"
    tail -2 "$OUT/pytest_norms.log"
    timeout 120 python3 -m tests.fuzz --seed "${FUZZ_SEED:-5}" --cases 2000 \
        --ops norms,layer_norm --device cuda --workers 6 -q 2>&1 |
        grep -E "cases:|\[[0-9]+x\]|replay" | cut -c1-200
fi
if [ "${MEMCHECK:-0}" = 1 ]; then
    OUT=$OUT/san MEMCHECK_LIMIT=${MEMCHECK_LIMIT:-300} \
        MEMCHECK_TESTS="tests/test_rms_norm.py tests/test_fused_add_norm.py -m cuda" \
        bash tools/cuda_sanitize.sh memcheck 2>&1 | tail -3
fi
export GEMSOPS_BENCH_FLUSH=${FLUSH:-zero}
[ "${RESUME:-0}" = 1 ] && export GEMSOPS_BENCH_RESUME=1
[ "${SWEEP:-0}" = 1 ] && export GEMSOPS_BENCH_SWEEP=1
bench() { # name, pytest -k expression, extra environment
    env "${@:3}" timeout "${BENCH_LIMIT:-240}" python3 -m pytest \
        benchmark/test_layer_norm_perf.py benchmark/test_norms_perf.py \
        -k "$2${BENCH_K:+ and ($BENCH_K)}" -q -s -p no:cacheprovider \
        > "$OUT/bench_$1.log" 2>&1
    echo "bench $1: exit $?"
}
case ${BENCH:-all} in
fwd | all) bench fwd "forward" GEMSOPS_BENCH_GRAPH=1 ;;&
bwd | all) bench bwd "backward" GEMSOPS_BENCH_GRAPH=1 ;;
esac
tar czf "$OUT/results.tgz" benchmark/results
