"""Maintainer tools, run from the repository root as `python -m tools.NAME`
(the shell scripts as `bash tools/NAME.sh`). Not part of the wheel. Each
file's docstring or header says what it does and how to run it; logs of
the GPU scripts go to $OUT (default /tmp/gemsops_out).

On a GPU machine, whole runs:
  device_verify.sh   build, CUDA tests, a CUDA fuzz batch, compute-sanitizer
  device_check.sh    build, CUDA tests, the benchmarks
  device_norms.sh    the norms: tests, fuzz, benchmarks beside the peers
  device_matmul.sh   the matmul: ptxas and SASS, tests, probe, GPT step,
                     the corpus
  device_measure.sh  host cost of each op, the example GPT four ways
  two_gpu_check.sh   every op on cuda:1, a DDP step over two GPUs
  cuda_sanitize.sh   compute-sanitizer's four tools over the CUDA tests

Same-run comparisons (docs/performance.md, Method):
  ab.sh, ab_modules.sh          variants of a source, or prebuilt modules
  ln_time, norm_time, prod_time, mm_time
                                the timers they run
  mm_probe, mm_plans, mm_gap, mm_kernels
                                the matmul against cuBLAS: named shapes,
                                every plan, launch gaps, kernel names

Profiles: ln_bwd_profile.sh, prod_profile.sh, mm_profile.sh, ln_bwd_ncu,
ncu_sass_stalls, norm_launch_shapes, norm_host_cost.

The matmul planner's model: mm_calibrate (timings), mm_cost_fit and
mm_split_fit (the constants of csrc/cuda/matmul_cost.cuh).

With no GPU: cubin_check.sh and cubin_diff (whether a change moves any
kernel's machine code), ptxas_report, cpu_time, sanitize_cpu.sh (the CPU
tests under ASan and UBSan), format.sh, results_table (the README's and
docs/performance.md's tables from benchmark/results/)."""
