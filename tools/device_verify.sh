#!/bin/bash
# Verifies a commit on a GPU machine: build for Hopper, the CUDA tests, a
# CUDA fuzz batch, then compute-sanitizer tools on their subsets. Each
# stage has its own time limit, so that the whole returns within about
# ten minutes; logs land in $OUT.
# usage: bash tools/device_verify.sh
#   FUZZ_CASES (3000), FUZZ_SEED (7), FUZZ_LIMIT (s), TEST_LIMIT (s)
#   SANITIZE: compute-sanitizer tools to run after (default: none)
#   SANITIZE_LIMIT: seconds for all of them together
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gemsops_out}
mkdir -p "$OUT"
nvidia-smi -L | tee "$OUT/gpu.txt"
git rev-parse HEAD 2>/dev/null | tee -a "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__)" | tee -a "$OUT/gpu.txt"
t0=$(date +%s)
GEMSOPS_CUDA_ARCHS=${GEMSOPS_CUDA_ARCHS:-90a} python3 setup.py build_ext \
    --inplace > "$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
t0=$(date +%s)
timeout "${TEST_LIMIT:-240}" python3 -m pytest tests -m cuda -q \
    --ignore=tests/fuzz -p no:cacheprovider ${TEST_ARGS:-} \
    > "$OUT/pytest_cuda.log" 2>&1
echo "pytest -m cuda: exit $? in $(( $(date +%s) - t0 )) s"
tail -3 "$OUT/pytest_cuda.log"
if [ "${FUZZ_CASES:-3000}" -gt 0 ]; then
    t0=$(date +%s)
    timeout "${FUZZ_LIMIT:-150}" python3 -m tests.fuzz --seed "${FUZZ_SEED:-7}" \
        --cases "${FUZZ_CASES:-3000}" --device cuda --workers 6 \
        --json "$OUT/fuzz_cuda.json" -q > "$OUT/fuzz_cuda.log" 2>&1
    echo "fuzz: exit $? in $(( $(date +%s) - t0 )) s"
    grep -E "cases:|^\s+\[[0-9]+x\]" "$OUT/fuzz_cuda.log" | cut -c1-220
fi
if [ -n "${SANITIZE:-}" ]; then
    # shellcheck disable=SC2086
    OUT=$OUT/sanitize timeout "${SANITIZE_LIMIT:-200}" \
        bash tools/cuda_sanitize.sh $SANITIZE > "$OUT/sanitize.log" 2>&1
    echo "sanitize: exit $?"
    OUT=$OUT/sanitize bash tools/cuda_sanitize.sh count 2>&1 | tail -8
fi
