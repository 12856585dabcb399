#!/bin/bash
# The torch-integration measurements on a GPU machine, after
# tools/device_verify.sh has built the tree: host cost per call (each op,
# gemsops' eager path, its dispatcher op and torch), then the example GPT
# trained four ways (torch and gemsops, eager and compiled). Logs in $OUT.
# usage: bash tools/device_measure.sh   (GPT_ARGS overrides the model size)
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/gemsops_out}
mkdir -p "$OUT"
timeout "${HOST_LIMIT:-120}" python3 benchmark/host_cost.py \
    | tee "$OUT/host_cost.txt"
# fp32, then bf16 autocast
GPT=${GPT_ARGS:---steps 200 --d 512 --layers 4 --heads 8 --ctx 256 --batch 16}
for amp in "" --amp; do
    # shellcheck disable=SC2086
    timeout "${GPT_LIMIT:-200}" python3 examples/train_gpt.py --device cuda \
        --compile both $GPT $amp 2>&1 | tee "$OUT/train_gpt$amp.txt" | tail -5
done
