// A's row sums where the product's kernel does not make them:
// row_sums[i] = sum over k of A[i, k] (batch 1), fp32 rounded once; each
// sum in a fixed order (run-to-run identical). Rows with unit k stride: a
// warp a row (its lanes read consecutive elements, then meet in an xor
// tree); otherwise a thread a row, k in order (neighbouring threads read
// neighbouring rows of an M-contiguous A).
//
// Bytes: A read once (m * k elements), m written. nn.Linear's bias gradient
// beside its weight gradient, where the wgmma ROWS kernels do not sum the
// rows in their main loop (matmul_driver.cuh).
//
// Test: python -m pytest tests/test_linear.py -m cuda (the bias gradient).
#include "common.cuh"
#include "matmul_row_sums.cuh"

namespace gemsops {
namespace {

constexpr int kRowSumThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kRowSumThreads)
    matmul_row_sums_by_warp(const T *a, int64_t m, int64_t k, int64_t rs,
                            T *out)
{
    const int64_t row =
        blockIdx.x * (int64_t)(kRowSumThreads / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= m) { // a whole warp: the shuffles below see every lane
        return;
    }
    float sum = 0.f;
    for (int64_t j = lane; j < k; j += 32) {
        sum += to_acc<float>(a[row * rs + j]);
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) {
        sum += __shfl_xor_sync(0xffffffffu, sum, off);
    }
    if (lane == 0) {
        out[row] = from_acc<T>(sum);
    }
}

template <typename T>
__global__ void __launch_bounds__(kRowSumThreads)
    matmul_row_sums_by_thread(const T *a, int64_t m, int64_t k, int64_t rs,
                              int64_t cs, T *out)
{
    const int64_t row = blockIdx.x * (int64_t)kRowSumThreads + threadIdx.x;
    if (row >= m) {
        return;
    }
    float sum = 0.f;
    for (int64_t j = 0; j < k; j++) {
        sum += to_acc<float>(a[row * rs + j * cs]);
    }
    out[row] = from_acc<T>(sum);
}

template <typename T>
void launch_row_sums(const gemsops_matmul_params *p, cudaStream_t stream)
{
    const T *a = static_cast<const T *>(p->a);
    T *out = static_cast<T *>(p->row_sums);
    if (p->a_cs == 1) {
        const int64_t rows = kRowSumThreads / 32;
        matmul_row_sums_by_warp<T>
            <<<(unsigned)((p->m + rows - 1) / rows), kRowSumThreads, 0,
               stream>>>(a, p->m, p->k, p->a_rs, out);
    }
    else {
        matmul_row_sums_by_thread<T>
            <<<(unsigned)((p->m + kRowSumThreads - 1) / kRowSumThreads),
               kRowSumThreads, 0, stream>>>(a, p->m, p->k, p->a_rs, p->a_cs,
                                            out);
    }
}

} // namespace

// The one dtype switch of the row sums.
int matmul_row_sums(const gemsops_matmul_params *p, gemsops_status *st)
{
    if (p->m == 0) {
        return GEMSOPS_OK;
    }
    cudaStream_t stream = (cudaStream_t)p->stream;
    switch (p->dtype) {
    case GEMSOPS_FLOAT32: launch_row_sums<float>(p, stream); break;
    case GEMSOPS_FLOAT16: launch_row_sums<__half>(p, stream); break;
    case GEMSOPS_BFLOAT16: launch_row_sums<__nv_bfloat16>(p, stream); break;
    default:
        return gemsops_fail(st, GEMSOPS_ERR_TYPE,
                            "matmul: unsupported dtype %s on CUDA",
                            gemsops_dtype_name(p->dtype));
    }
    GEMSOPS_CUDA_CHECK_LAUNCH(st, "matmul_row_sums");
    return GEMSOPS_OK;
}

} // namespace gemsops
