// LayerNorm backward for rows longer than the device's co-resident slabs
// hold: a split row's slabs wait for each other's partials
// (layer_norm_bwd_split.cuh), so a row of more slabs than fit at once
// would wait on slabs that cannot start. Such rows (past ~1 M elements on
// 132 SMs) take three launches instead, none of which waits on another
// CTA:
//
//   sums:   CTA (row, slab) adds c1 = rstd * sum g * (x - mean) and
//           c2 = sum g over its kTwoPassCols columns into
//           parts[row][slab][2]   (skipped when no dx is wanted)
//   totals: one warp a row adds its slabs' parts in slab order
//   apply:  CTA `slab` walks every row: dx of its columns from the row's
//           totals (+ dh), and its columns' dW/dB in registers across the
//           rows, written once at the end (no atomics: deterministic)
//
// Bytes: x and dy read twice (sums, apply), dx written once: 5 * N *
// sizeof(T) a row against the fused kernel's 3; the parts are 16 bytes a
// slab. The sums and the dx formula are the fused kernel's
// (layer_norm_bwd_thread.cuh), so both paths agree to rounding.
//
// Test: python -m pytest tests/test_layer_norm.py -m cuda -k two_pass.
#pragma once

#include <stdint.h>

#include "convert.cuh"
#include "layer_norm_bwd_thread.cuh" // mul_rn

namespace gemsops {
namespace {

constexpr int kTwoPassThreads = 256;
constexpr int kTwoPassPerThread = 32;
constexpr int kTwoPassCols = kTwoPassThreads * kTwoPassPerThread;

__host__ __device__ inline int64_t two_pass_slabs(int64_t cols)
{
    return (cols + kTwoPassCols - 1) / kTwoPassCols;
}

// Workspace bytes: the parts [rows][slabs][2], then the totals [rows][2].
template <typename A>
int64_t two_pass_bytes(int64_t rows, int64_t cols)
{
    return rows * (two_pass_slabs(cols) + 1) * 2 * (int64_t)sizeof(A);
}

template <typename T, typename P>
struct two_pass_args {
    using A = acc_t<T>;
    const T *dy, *x, *dh;
    const P *w; // NULL: w = 1
    const A *mean, *rstd;
    T *dx; // NULL: no dx wanted
    P *dw, *db; // NULL when not wanted
    A *parts, *totals;
    int64_t rows, cols, slabs;
    int64_t dy_stride, x_stride, dx_stride, dh_stride;
    bool rms; // mean taken as 0, no c2 term
};

template <typename A, typename P>
__device__ __forceinline__ A weight_at(const P *w, int64_t c)
{
    return w == nullptr ? A(1) : widen<A>(w[c]);
}

template <typename T, typename P>
__global__ void __launch_bounds__(kTwoPassThreads)
    layer_norm_bwd_two_pass_sums(const two_pass_args<T, P> a)
{
    using A = acc_t<T>;
    __shared__ A red[kTwoPassThreads / 32][2];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int64_t b = blockIdx.x; b < a.rows * a.slabs; b += gridDim.x) {
        const int64_t row = b / a.slabs, slab = b % a.slabs;
        const A mean = a.rms ? A(0) : a.mean[row];
        const T *x = a.x + row * a.x_stride;
        const T *dy = a.dy + row * a.dy_stride;
        const int64_t end = min(a.cols, (slab + 1) * kTwoPassCols);
        A s0 = 0, s1 = 0;
        for (int64_t c = slab * kTwoPassCols + threadIdx.x; c < end;
             c += kTwoPassThreads) {
            const A g = mul_rn(widen<A>(dy[c]), weight_at<A>(a.w, c));
            s0 += g * (widen<A>(x[c]) - mean);
            s1 += g;
        }
#pragma unroll
        for (int off = 16; off > 0; off /= 2) {
            s0 += __shfl_xor_sync(0xffffffffu, s0, off);
            s1 += __shfl_xor_sync(0xffffffffu, s1, off);
        }
        if (lane == 0) {
            red[warp][0] = s0;
            red[warp][1] = s1;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            A t0 = 0, t1 = 0;
            for (int w = 0; w < kTwoPassThreads / 32; w++) {
                t0 += red[w][0];
                t1 += red[w][1];
            }
            a.parts[2 * b] = t0 * a.rstd[row];
            a.parts[2 * b + 1] = t1;
        }
        __syncthreads(); // red is written again for the next block
    }
}

template <typename T, typename P>
__global__ void __launch_bounds__(kTwoPassThreads)
    layer_norm_bwd_two_pass_totals(const two_pass_args<T, P> a)
{
    using A = acc_t<T>;
    constexpr int kWarps = kTwoPassThreads / 32;
    const int lane = threadIdx.x % 32;
    for (int64_t row = (int64_t)blockIdx.x * kWarps + threadIdx.x / 32;
         row < a.rows; row += (int64_t)gridDim.x * kWarps) {
        const A *parts = a.parts + row * a.slabs * 2;
        A s0 = 0, s1 = 0;
        for (int64_t j = lane; j < a.slabs; j += 32) {
            s0 += parts[2 * j];
            s1 += parts[2 * j + 1];
        }
#pragma unroll
        for (int off = 16; off > 0; off /= 2) {
            s0 += __shfl_xor_sync(0xffffffffu, s0, off);
            s1 += __shfl_xor_sync(0xffffffffu, s1, off);
        }
        if (lane == 0) {
            a.totals[2 * row] = s0;
            a.totals[2 * row + 1] = s1;
        }
    }
}

template <typename T, typename P>
__global__ void __launch_bounds__(kTwoPassThreads)
    layer_norm_bwd_two_pass_apply(const two_pass_args<T, P> a)
{
    using A = acc_t<T>;
    constexpr int E = kTwoPassPerThread;
    const A inv_n = A(1) / (A)a.cols;
    for (int64_t slab = blockIdx.x; slab < a.slabs; slab += gridDim.x) {
        const int64_t c0 = slab * kTwoPassCols + threadIdx.x;
        A dw[E], db[E];
#pragma unroll
        for (int i = 0; i < E; i++) {
            dw[i] = 0;
            db[i] = 0;
        }
        for (int64_t row = 0; row < a.rows; row++) {
            const A mean = a.rms ? A(0) : a.mean[row];
            const A rstd = a.rstd[row];
            const A c1n = a.dx ? a.totals[2 * row] * inv_n : A(0);
            const A c2n =
                a.dx && !a.rms ? a.totals[2 * row + 1] * inv_n : A(0);
            const T *x = a.x + row * a.x_stride;
            const T *dy = a.dy + row * a.dy_stride;
#pragma unroll
            for (int i = 0; i < E; i++) {
                const int64_t c = c0 + (int64_t)i * kTwoPassThreads;
                if (c >= a.cols) {
                    continue;
                }
                const A xh = (widen<A>(x[c]) - mean) * rstd;
                const A d = widen<A>(dy[c]);
                dw[i] += d * xh;
                db[i] += d;
                if (a.dx) {
                    const A g = mul_rn(d, weight_at<A>(a.w, c));
                    A out = rstd * (g - (xh * c1n + c2n));
                    if (a.dh) {
                        out += widen<A>(a.dh[row * a.dh_stride + c]);
                    }
                    a.dx[row * a.dx_stride + c] = from_acc<T>(out);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < E; i++) {
            const int64_t c = c0 + (int64_t)i * kTwoPassThreads;
            if (c < a.cols) {
                if (a.dw) {
                    a.dw[c] = from_acc<P>(dw[i]);
                }
                if (a.db) {
                    a.db[c] = from_acc<P>(db[i]);
                }
            }
        }
    }
}

// The three launches on p's stream, over a workspace of at least
// two_pass_bytes<A>(rows, cols) bytes; a kept workspace is left zero.
template <typename T, typename P>
int launch_two_pass(const gemsops_layer_norm_bwd_params *p,
                    const device_facts &f, gemsops_status *st)
{
    using A = acc_t<T>;
    two_pass_args<T, P> a;
    a.dy = static_cast<const T *>(p->dy);
    a.x = static_cast<const T *>(p->x);
    a.dh = static_cast<const T *>(p->dh);
    a.w = static_cast<const P *>(p->weight);
    a.mean = static_cast<const A *>(p->mean);
    a.rstd = static_cast<const A *>(p->rstd);
    a.dx = static_cast<T *>(p->dx);
    a.dw = static_cast<P *>(p->dweight);
    a.db = static_cast<P *>(p->dbias);
    a.rows = p->rows;
    a.cols = p->cols;
    a.slabs = two_pass_slabs(p->cols);
    a.parts = static_cast<A *>(p->workspace);
    a.totals = a.parts + a.rows * a.slabs * 2;
    a.dy_stride = p->dy_row_stride;
    a.x_stride = p->x_row_stride;
    a.dx_stride = p->dx_row_stride;
    a.dh_stride = p->dh_row_stride;
    a.rms = p->rms != 0;
    cudaStream_t stream = (cudaStream_t)p->stream;
    const int64_t cap = (int64_t)f.sm_count * 8;
    const auto grid = [cap](int64_t work) {
        return (unsigned)(work < cap ? work : cap);
    };
    if (a.dx) {
        layer_norm_bwd_two_pass_sums<T, P>
            <<<grid(a.rows * a.slabs), kTwoPassThreads, 0, stream>>>(a);
        GEMSOPS_CUDA_CHECK_LAUNCH(st, "layer_norm_bwd_two_pass_sums");
        const int64_t row_blocks = (a.rows + 7) / 8;
        layer_norm_bwd_two_pass_totals<T, P>
            <<<grid(row_blocks), kTwoPassThreads, 0, stream>>>(a);
        GEMSOPS_CUDA_CHECK_LAUNCH(st, "layer_norm_bwd_two_pass_totals");
    }
    layer_norm_bwd_two_pass_apply<T, P>
        <<<grid(a.slabs), kTwoPassThreads, 0, stream>>>(a);
    GEMSOPS_CUDA_CHECK_LAUNCH(st, "layer_norm_bwd_two_pass_apply");
    if (p->kept_zero) {
        // the caller counts on a zero workspace at the next launch: all
        // of it where it was not known zero before this one
        const int64_t used = two_pass_bytes<A>(p->rows, p->cols);
        GEMSOPS_CUDA_CHECK(st,
                           cudaMemsetAsync(p->workspace, 0,
                                           p->known_zero ? used
                                                         : p->workspace_bytes,
                                           stream));
    }
    return GEMSOPS_OK;
}

} // namespace
} // namespace gemsops
