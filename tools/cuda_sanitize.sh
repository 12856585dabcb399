#!/bin/bash
# NVIDIA compute-sanitizer's four tools over the CUDA tests, then one line
# per tool: errors in gemsops' kernels (counted) and in torch's (filtered).
#
# usage: bash tools/cuda_sanitize.sh [TOOL ...]     (default: all four)
#   TOOL: memcheck racecheck synccheck initcheck, or `count` to summarize
#   the logs already in $OUT without running anything
#   OUT                logs: $OUT/TOOL.cs.<pid>.log, TOOL.rc, TOOL.pytest.log
#                      (default /tmp/cuda_sanitize)
#   COMPUTE_SANITIZER  the binary (default: PATH, then $CUDA_HOME/bin,
#                      /usr/local/cuda/bin)
#   MEMCHECK_TESTS, RACECHECK_TESTS, SYNCCHECK_TESTS, INITCHECK_TESTS:
#                      pytest arguments replacing a tool's default selection
#                      (node ids or `-m cuda -k EXPR`)
#   MEMCHECK_LIMIT ... INITCHECK_LIMIT: seconds before a tool's run is
#                      killed (and counted as incomplete)
# Exit status: nonzero when any tool found an error in a gemsops kernel or
# did not finish. Budget: the four tools in about 8 minutes on an H100, the
# build (done here only when the module has no CUDA) not included.
#
# What each tool runs, and why:
#   memcheck  the kernel tests (KERNEL_TESTS): out-of-bounds and
#             misaligned accesses in any launch configuration the tests
#             reach. torch's caching allocator is off
#             (PYTORCH_NO_CUDA_MEMORY_CACHING=1) so that every tensor is
#             its own allocation and an access past one is out of bounds
#             rather than inside a cached block (and initcheck sees fresh
#             memory rather than a previous tensor's); CUDA graph capture
#             needs the caching allocator, so that test is left out there.
#   racecheck, synccheck, initcheck: far slower per shared-memory access
#             (racecheck) or per global access (initcheck), so SUBSET
#             below: every kernel family at least once, each on a shape
#             that reaches a distinct code path.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/cuda_sanitize}
PY=${PYTHON:-python3}
ERROR_EXIT=86  # tools/cuda_sanitize_count.py knows this value
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

tools=("$@")
[ ${#tools[@]} -eq 0 ] && tools=(memcheck racecheck synccheck initcheck)
if [ "${tools[0]}" = count ]; then
    exec "$PY" -m tools.cuda_sanitize_count "$OUT"
fi
for t in "${tools[@]}"; do
    case $t in
        memcheck|racecheck|synccheck|initcheck) ;;
        *) echo "cuda_sanitize: unknown tool '$t'" >&2; exit 2 ;;
    esac
done

CS=${COMPUTE_SANITIZER:-}
if [ -z "$CS" ]; then
    for c in "$(command -v compute-sanitizer)" \
             "${CUDA_HOME:-/nonexistent}/bin/compute-sanitizer" \
             /usr/local/cuda/bin/compute-sanitizer; do
        if [ -n "$c" ] && [ -x "$c" ]; then CS=$c; break; fi
    done
fi
if [ -z "$CS" ]; then
    echo "cuda_sanitize: compute-sanitizer not found (set COMPUTE_SANITIZER)" >&2
    exit 2
fi
"$CS" --version | tail -1

if ! "$PY" -c 'import sys, gemsops; sys.exit(0 if gemsops.cuda_available() else 1)' \
        2>/dev/null; then
    t0=$(date +%s)
    echo "cuda_sanitize: no CUDA build of gemsops._C here: building (sm_90a)"
    GEMSOPS_LINEINFO=1 GEMSOPS_CUDA_ARCHS=${GEMSOPS_CUDA_ARCHS:-90a} \
        "$PY" setup.py build_ext \
        --inplace > "$OUT/build.log" 2>&1 || {
        tail -30 "$OUT/build.log"; echo "cuda_sanitize: build failed" >&2; exit 2; }
    echo "cuda_sanitize: built in $(( $(date +%s) - t0 )) s"
    "$PY" -c 'import sys, gemsops; sys.exit(0 if gemsops.cuda_available() else 1)' || {
        echo "cuda_sanitize: gemsops sees no GPU" >&2; exit 2; }
fi

# Every kernel family, at least once: (in the order of csrc/cuda)
LN=tests/test_layer_norm.py
PR=tests/test_prod.py
MM=tests/test_matmul.py
SUBSET=(
    # layer_norm_fwd_registers: small bf16 rows, fp32 4096 x 256
    "$LN::test_forward[cuda-dtype2-shape0-1]"
    "$LN::test_forward[cuda-dtype0-shape4-1]"
    # layer_norm_fwd_looped: fp16 odd width, fp32 1024 threads odd width
    "$LN::test_forward[cuda-dtype1-shape12-1]"
    "$LN::test_forward[cuda-dtype0-shape15-1]"
    # layer_norm_bwd_fused_atomic + layer_norm_bwd_sum_partials: short
    # fp32 rows, many bf16 rows of 16, fp16 odd width, bf16 with fp32
    # parameters
    "$LN::test_backward[cuda-dtype0-shape0-1]"
    "$LN::test_backward[cuda-dtype2-shape13-1]"
    "$LN::test_backward[cuda-dtype1-shape12-1]"
    "$LN::test_backward_affine_variants[cuda-dtype1-fp32]"
    # split rows: partials exchanged between CTAs (zero partials), and 64
    # slabs per row collected in two rounds through the lagged ring
    "$LN::test_backward_long_rows_with_zero_partials[cuda-dtype0]"
    "$LN::test_cuda_split_rows_many_slabs[shape0-dtype0]"
    # RMSNorm and the fused add: registers and looped rows, both ways
    "tests/test_rms_norm.py::test_backward[cuda-dtype2-shape7-1]"
    "tests/test_fused_add_norm.py::test_backward_with_both_outputs_used[cuda-dtype1-shape6-1-rms]"
    # prod forward, fp32, every layout: prod_rows_kernel (several rows per
    # warp; one row split over CTAs + prod_combine_kernel), full products,
    # prod_cols_kernel (split down the column, middle dim, unaligned),
    # prod_generic_kernel (permuted, zero stride), misaligned base
    "$PR::test_layouts[cuda-dtype0-shape0-1-None]"
    "$PR::test_layouts[cuda-dtype0-shape1-1-None]"
    "$PR::test_layouts[cuda-dtype0-shape2-None-None]"
    "$PR::test_layouts[cuda-dtype0-shape4-None-step]"
    "$PR::test_layouts[cuda-dtype0-shape5-0-None]"
    "$PR::test_layouts[cuda-dtype0-shape6-1-None]"
    "$PR::test_layouts[cuda-dtype0-shape7-1-None]"
    "$PR::test_layouts[cuda-dtype0-shape8-0-perm]"
    "$PR::test_layouts[cuda-dtype0-shape9-0-expand]"
    "$PR::test_layouts[cuda-dtype0-shape10-1-offset]"
    # prod_bulk_kernel (copy-engine rows past L2): split rows with a short
    # last chunk, and rows cut from longer ones
    "$PR::test_cuda_long_rows_beyond_l2[dtype0-split]"
    "$PR::test_cuda_long_rows_beyond_l2[dtype2-cut]"
    # prod backward: prod_bwd_rows_kernel, prod_bwd_cols_kernel,
    # prod_scan_kernel, with zeros in the lines
    "$PR::test_backward_layouts_with_zeros[cuda-dtype0-shape0-1]"
    "$PR::test_backward_layouts_with_zeros[cuda-dtype0-shape2-0]"
    "$PR::test_backward_layouts_with_zeros[cuda-dtype0-shape4-None]"
    "$PR::test_backward_with_zeros[cuda-None-1-dtype0]"
    "$PR::test_backward_with_zeros[cuda-0-2-dtype0]"
    "$PR::test_backward_with_zeros[cuda-1-1-dtype0]"
    # matmul_streamk_kernel: each tensor-core mainloop (wgmma 256/128, mma)
    # under stream-k, a transposed layout data-parallel, the fp32 path with
    # two tiles per CTA, and batched wgmma with its backward
    "$MM::test_tensor_core_mainloops_every_layout[stream-k-dtype0-k-n-wgmma-256]"
    "$MM::test_tensor_core_mainloops_every_layout[stream-k-dtype0-k-n-wgmma-128]"
    "$MM::test_tensor_core_mainloops_every_layout[stream-k-dtype0-k-n-mma]"
    "$MM::test_tensor_core_mainloops_every_layout[data-parallel-dtype1-m-k-wgmma-128]"
    "$MM::test_every_schedule_is_correct_and_bitwise_repeatable[cuda-dtype0-257-False-3-True-stream-k]"
    "$MM::test_every_schedule_is_correct_and_bitwise_repeatable[cuda-dtype1-1024-False-7-False-hybrid]"
    "$MM::test_wgmma_batched_broadcast_and_backward[wgmma-128]"
    # workspaces kept across calls and streams
    "tests/test_errors.py::test_cuda_kept_workspace_protocol"
)
# memcheck: every CUDA test of the files that launch gemsops' kernels
# directly. The torch-integration files (test_library, test_autocast,
# test_double_backward, test_global_mode) reach the same kernels through
# torch.compile and the dispatcher, and Inductor's compiles under memcheck
# outlast any limit here.
KERNEL_TESTS=(tests/test_prod.py tests/test_layer_norm.py tests/test_rms_norm.py
              tests/test_fused_add_norm.py tests/test_matmul.py
              tests/test_linear.py tests/test_errors.py tests/test_boundary.py
              tests/test_edge_layouts.py tests/test_semantics.py
              tests/test_dlpack.py tests/test_streamk_schedule.py -m cuda
              --deselect tests/test_layer_norm.py::test_cuda_more_than_2_31_elements
              --deselect tests/test_layer_norm.py::test_cuda_graph_capture)

# options and time limit per tool
declare -A OPTS LIMIT
# --padding: a guard after every allocation, so that an access just past
# one tensor cannot land in the next and pass
OPTS[memcheck]="--padding 32"
OPTS[racecheck]="--racecheck-report analysis"
OPTS[synccheck]=""
# (--track-unused-memory stays off, its default: torch allocates more than
# it touches, and that is no bug; it is a bare switch in 2025.x, "yes|no"
# in older releases, so it is not spelled out)
OPTS[initcheck]=""
# The limits, together 500 s, keep the whole script inside the 8 minutes
# it is given; each is about twice what its tool took on an H100
# (docs/performance.md, Method).
LIMIT[memcheck]=${MEMCHECK_LIMIT:-220}
LIMIT[racecheck]=${RACECHECK_LIMIT:-140}
LIMIT[synccheck]=${SYNCCHECK_LIMIT:-50}
LIMIT[initcheck]=${INITCHECK_LIMIT:-90}

for tool in "${tools[@]}"; do
    rm -f "$OUT/$tool".cs.*.log "$OUT/$tool.rc" "$OUT/$tool.pytest.log"
    override_var=${tool^^}_TESTS
    if [ -n "${!override_var:-}" ]; then
        # node ids hold [ ]: no globbing while splitting
        set -f; read -ra args <<< "${!override_var}"; set +f
    elif [ "$tool" = memcheck ]; then
        args=("${KERNEL_TESTS[@]}")
    else
        args=("${SUBSET[@]}")
    fi
    read -ra opts <<< "${OPTS[$tool]}"
    # torch reads only whether the variable is set, not its value
    envs=(-u PYTORCH_NO_CUDA_MEMORY_CACHING)
    if [ "$tool" = memcheck ] || [ "$tool" = initcheck ]; then
        envs=(PYTORCH_NO_CUDA_MEMORY_CACHING=1)
    fi
    echo "cuda_sanitize: $tool over ${#args[@]} pytest arguments" \
         "(limit ${LIMIT[$tool]} s)"
    t0=$(date +%s)
    # --target-processes all: pytest itself is the application here, but
    # a test that starts a helper process must be checked too
    # --print-limit: past it reports are only counted, with no kernel name
    # (the count step then charges them to gemsops, to be safe)
    # --require-cuda-init no: such a helper need not use CUDA
    env "${envs[@]}" timeout -k 10 "${LIMIT[$tool]}" \
        "$CS" --tool "$tool" --target-processes all --print-limit 100000 \
        --require-cuda-init no \
        --error-exitcode "$ERROR_EXIT" --log-file "$OUT/$tool.cs.%p.log" \
        "${opts[@]}" \
        "$PY" -m pytest -q -p no:cacheprovider --tb=short "${args[@]}" \
        > "$OUT/$tool.pytest.log" 2>&1
    rc=$?
    echo "$rc" > "$OUT/$tool.rc"
    echo "cuda_sanitize: $tool exit $rc in $(( $(date +%s) - t0 )) s:" \
         "$(grep -E '[0-9]+ (passed|failed|error)' "$OUT/$tool.pytest.log" | tail -1)"
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        echo "cuda_sanitize: $tool ran past ${LIMIT[$tool]} s and was killed" >&2
    fi
done

"$PY" -m tools.cuda_sanitize_count "$OUT" "${tools[@]}"
