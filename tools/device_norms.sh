#!/bin/bash
# One device call for the norms: build, the CUDA tests of LayerNorm,
# RMSNorm and the fused adds, a CUDA fuzz batch of the norms family,
# memcheck over the new tests, then the norms benchmarks beside torch,
# torch.compile and (from .whl/ wheels) FlagGems and Liger. Logs in $OUT.
# usage: bash tools/device_norms.sh   (BENCH=0 skips the benchmarks)
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/gemsops_out}
mkdir -p "$OUT"
if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
GEMSOPS_CUDA_ARCHS=${GEMSOPS_CUDA_ARCHS:-90a} python3 setup.py build_ext \
    --inplace > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
timeout "${TEST_LIMIT:-200}" python3 -m pytest -m cuda -q -p no:cacheprovider \
    tests/test_layer_norm.py tests/test_rms_norm.py \
    tests/test_fused_add_norm.py > "$OUT/pytest_norms.log" 2>&1
echo "pytest norms: exit $?"; tail -2 "$OUT/pytest_norms.log"
timeout 120 python3 -m tests.fuzz --seed "${FUZZ_SEED:-5}" --cases 2000 \
    --ops norms,layer_norm --device cuda --workers 6 -q 2>&1 \
    | grep -E "cases:|\[[0-9]+x\]|replay" | cut -c1-200
OUT=$OUT/san MEMCHECK_LIMIT=150 \
    MEMCHECK_TESTS="tests/test_rms_norm.py tests/test_fused_add_norm.py -m cuda" \
    bash tools/cuda_sanitize.sh memcheck 2>&1 | tail -3
if [ "${BENCH:-1}" = 1 ]; then
    timeout 240 python3 -m pytest benchmark/test_norms_perf.py -q \
        -p no:cacheprovider > "$OUT/bench_norms.log" 2>&1
    echo "bench: exit $?"
fi
