#!/usr/bin/env bash
# Two-GPU checks: tests/test_multi_gpu.py (every op on cuda:1) and a DDP
# step over gemsops layers (tools/ddp_step.py, one process per GPU, NCCL).
# Builds nothing: gemsops must already be built in this tree. Logs go to
# ${OUT:-/tmp}/two_gpu/. PYTHON picks the interpreter (default: python).
# Exit status: 0 when both passed.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
LOG=${OUT:-/tmp}/two_gpu
mkdir -p "$LOG"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

nvidia-smi -L 2>&1 | tee "$LOG/gpus.txt"
$PY -c 'import torch, gemsops; print("torch", torch.__version__, "| GPUs",
torch.cuda.device_count(), "| gemsops", gemsops.backends(),
"| cuda_available", gemsops.cuda_available())' 2>&1 | tee "$LOG/env.txt"
# without 2 GPUs and a CUDA build the tests would only skip: refuse instead
if ! $PY -c 'import sys, torch, gemsops
sys.exit(not (torch.cuda.device_count() >= 2 and gemsops.cuda_available()))'
then
    echo "== needs 2 visible GPUs and gemsops built with CUDA in this tree"
    exit 2
fi

# step NAME LIMIT_S CMD...: runs CMD under a time limit (a hang becomes
# exit 124), logging to $LOG/NAME.log
status=0
summary=()
step() {
    local name=$1 limit=$2
    shift 2
    echo "== $name: $*"
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$LOG/$name.log"
    local rc=${PIPESTATUS[0]}
    [ "$rc" -eq 124 ] && echo "== $name: TIMED OUT after ${limit}s"
    summary+=("$name: $([ "$rc" -eq 0 ] && echo PASS || echo "FAIL (exit $rc)")")
    [ "$rc" -eq 0 ] || status=1
}

step pytest 240 $PY -m pytest tests/test_multi_gpu.py -q -m cuda
step ddp_step 240 $PY -m torch.distributed.run --standalone \
    --nproc_per_node=2 tools/ddp_step.py

echo "== summary (logs in $LOG)"
printf '%s\n' "${summary[@]}" | tee "$LOG/summary.txt"
exit $status
