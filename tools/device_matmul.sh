#!/bin/bash
# The matmul's check on a GPU machine: build for Hopper, what ptxas and the SASS say
# of the wgmma kernels, the matmul tests, then timings: a probe of named
# shapes, the GPT-style step (benchmark/gpt_step.py), the host cost of
# one call and the corpus
# (benchmark/test_blas_perf.py). Logs and result JSONs land in $OUT.
# usage: bash tools/device_matmul.sh
#   BUILD=0 (the tree's last build kept) / TESTS=0 / PROBE=0 / GPT=0 /
#   HOST=0 (benchmark/host_cost.py) /
#   TEST_PATHS: the test files (default: tests) /
#   BENCH=0 skip a stage; PROBE_SHAPES: the probe's shapes
#   (tools/mm_probe.py); PLANS_SHAPES: shapes for tools/mm_plans.py (its
#   GEMSOPS_PLANS_* settings apply; no plans stage without them);
#   GEMSOPS_BENCH_CORPUS: the corpus's size;
#   CHAIN_SHAPES: shapes for tools/mm_chain.py, timed with out= and
#   without (GEMSOPS_CHAIN_OUT);
#   BENCH_ARGS: pytest's arguments for the benchmark (-k tf32: fp32 only)
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gemsops_out}
mkdir -p "$OUT"
nvidia-smi -L | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$OUT/gpu.txt"
t0=$(date +%s)
if [ "${BUILD:-1}" = 1 ]; then
    GEMSOPS_CUDA_ARCHS=${GEMSOPS_CUDA_ARCHS:-90a} NVCC_APPEND_FLAGS="-Xptxas -v" \
        python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 \
        || { tail -50 "$OUT/build.log"; exit 1; }
fi
echo "build: $(( $(date +%s) - t0 )) s"
python3 -m tools.ptxas_report < "$OUT/build.log" | grep -i "streamk" \
    > "$OUT/ptxas_matmul.txt"
grep -c . "$OUT/ptxas_matmul.txt"
grep -iE "C7508|serializ" "$OUT/build.log" | sort | uniq -c | head -5
so=$(ls gemsops/_C*.so | head -1)
cuobjdump -sass "$so" > /tmp/all.sass 2>/dev/null
python3 - "$OUT" <<'PY'
import re, sys
text = open("/tmp/all.sass").read()
for block in re.split(r"\n\s+Function : ", text)[1:]:
    name = block.split("\n", 1)[0]
    if "wgmma_mainloop" in name:
        n = len(re.findall(r"\bHGMMA\.", block))
        print(f"HGMMA {n:3d} in {name[:140]}")
PY
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if [ "${TESTS:-1}" = 1 ]; then
    t0=$(date +%s)
    timeout "${TEST_LIMIT:-300}" python3 -m pytest ${TEST_PATHS:-tests} -m cuda -q \
        --ignore=tests/fuzz -p no:cacheprovider ${TEST_ARGS:-} \
        > "$OUT/pytest_cuda.log" 2>&1
    echo "pytest -m cuda: exit $? in $(( $(date +%s) - t0 )) s"
    grep -E "^FAILED|^ERROR" "$OUT/pytest_cuda.log" | head -20
    tail -2 "$OUT/pytest_cuda.log"
fi
if [ "${PROBE:-1}" = 1 ]; then
    # shellcheck disable=SC2086
    timeout 200 python3 tools/mm_probe.py ${PROBE_SHAPES:-} 2>&1 | tee "$OUT/probe.txt"
fi
if [ -n "${PLANS_SHAPES:-}" ]; then
    # shellcheck disable=SC2086
    timeout "${PLANS_LIMIT:-300}" python3 tools/mm_plans.py $PLANS_SHAPES \
        > "$OUT/plans.txt" 2>&1
    echo "plans: exit $?, $(grep -c torch "$OUT/plans.txt") shapes"
fi
if [ -n "${CHAIN_SHAPES:-}" ]; then
    # back to back in a CUDA graph, with out= and without
    for o in 1 0; do
        # shellcheck disable=SC2086
        GEMSOPS_CHAIN_OUT=$o timeout 120 python3 -m tools.mm_chain $CHAIN_SHAPES \
            2>&1 | sed "s/^/out=$o /" | tee -a "$OUT/chain.txt"
    done
fi
if [ "${GPT:-1}" = 1 ]; then
    timeout 150 python3 benchmark/gpt_step.py --tokens 8x1024 --d 768 \
        --json "$OUT/gpt_step.jsonl" ${GPT_ARGS:-} 2>&1 | tail -${GPT_TAIL:-2}
    timeout 150 python3 benchmark/gpt_step.py --tokens 4x1024 --d 2048 \
        --json "$OUT/gpt_step.jsonl" ${GPT_ARGS:-} 2>&1 | tail -${GPT_TAIL:-2}
fi
if [ "${HOST:-1}" = 1 ]; then
    timeout 120 python3 benchmark/host_cost.py --device cuda 2>&1 | tee "$OUT/host_cost.txt"
fi
if [ "${BENCH:-1}" = 1 ]; then
    touch /tmp/bench_start
    (cd benchmark && GEMSOPS_BENCH_SCHEDULES=auto timeout "${BENCH_LIMIT:-400}" \
        python3 -m pytest test_blas_perf.py -q -s -p no:cacheprovider \
        ${BENCH_ARGS:-} 2>&1) \
        > "$OUT/bench.log"
    grep -A8 "geomean speedup" "$OUT/bench.log"
    tail -3 "$OUT/bench.log"
    find benchmark/results -name 'mm_*.json' -newer /tmp/bench_start -exec cp {} "$OUT/" \;
fi
