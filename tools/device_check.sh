#!/bin/bash
# A whole check on a GPU machine: build for Hopper, run the CUDA tests,
# then the benchmarks. Logs land in $OUT.
# usage: GEMSOPS_COMMIT=<sha> bash tools/device_check.sh [tests|bench|all]
#   TEST_K / BENCH_K: pytest -k expressions for the tests / the benchmarks
#   BENCH_FILES: benchmark scripts (default: every benchmark/test_*_perf.py)
#   HOST_COST=1: also time one small call on the host (benchmark/host_cost.py)
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gemsops_out}
mkdir -p "$OUT"
what=${1:-all}
TEST_K=${TEST_K:-}
BENCH_K=${BENCH_K:-}
BENCH_FILES=${BENCH_FILES:-$(cd benchmark && ls test_*_perf.py)}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
# peers (FlagGems, Liger), when present as wheels in .whl/ (ignored by git),
# are installed beside, never as dependencies (docs/performance.md, Method)
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
t0=$(date +%s)
GEMSOPS_CUDA_ARCHS=${GEMSOPS_CUDA_ARCHS:-90a} python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
grep -iE "warning|error" "$OUT/build.log" | grep -v Setuptools | head -20
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if [ "$what" = tests ] || [ "$what" = all ]; then
    python3 -m pytest tests -m cuda -q -x ${TEST_K:+-k "$TEST_K"} 2>&1 | tee "$OUT/pytest_cuda.log" | tail -25
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
    [ -n "$HOST_COST" ] && python3 benchmark/host_cost.py 2>&1 | tee "$OUT/host_cost.log"
    touch /tmp/bench_start
    (cd benchmark && python3 -m pytest $BENCH_FILES ${BENCH_K:+-k "$BENCH_K"} 2>&1) | tee "$OUT/bench.log" | grep -vE "^(platform|rootdir|configfile|plugins|collected)"
    # only this run's results (the tool brings back at most 8 files)
    find benchmark/results -name '*.json' -newer /tmp/bench_start -exec cp {} "$OUT/" \;
fi
