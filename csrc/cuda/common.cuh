// Every shared CUDA helper, for files that use many of them (prod, matmul).
// Each topic has its own header; include those directly where a file needs
// only a few.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "gemsops/status.h"
#include "gemsops/tensor.h"

#include "async_copy.cuh" // cp.async, mbarriers, bulk copies
#include "atomics.cuh" // red_add, acquire_load
#include "convert.cuh" // acc_t, conversions, vec_t, vector loads/stores
#include "cuda_check.cuh" // GEMSOPS_CUDA_CHECK*, device_guard
#include "device.cuh" // device_facts, resident_ctas
#include "l2_policy.cuh" // L2 eviction policies, load_vec_last
#include "pdl.cuh" // programmatic dependent launch
#include "reduce.cuh" // warp_sum, row_sum
