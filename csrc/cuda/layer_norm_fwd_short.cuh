// LayerNorm forward, the short-rows kernel (layer_norm_fwd_short_rows):
// rows of 1, 2, 4, 8, 16 or 64 16-byte vectors, a vector a lane (two for
// 64), several rows a warp access.
#pragma once

#include "layer_norm_fwd_common.cuh"
#include "reduce.cuh"

namespace gemsops {
namespace {

// The short-rows kernel's bound: fwd_min_ctas, but seven CTAs an SM (<= 72
// registers) for LayerNorm of half x with fp32 parameters, whose w and b
// (16 registers of fp32) beside four rows of x spilled under 64 (ptxas), a
// spill that cost more than the eighth CTA gains (docs/performance.md).
// The fused add's smaller spill there costs less: it keeps eight.
template <typename T, typename P, int VEC, bool RMS, bool ADD>
constexpr int fwd_short_min_ctas()
{
    return !RMS && !ADD && sizeof(P) > sizeof(T) ? 7
                                                 : fwd_min_ctas<T, VEC>(128);
}

// The short-rows kernel's LayerNorm statistics for a row of G lanes, L
// vectors each: the register kernel's corrected two-pass step. Returns
// rstd.
template <int G, typename T, typename P, int VEC, int L>
__device__ __forceinline__ acc_t<T> short_row_stats(
    const fwd_args<T, P> &a, const vec_t<T, VEC> (&x)[L], acc_t<T> &mean)
{
    using A = acc_t<T>;
    A f[VEC];
    A s[1] = {0};
#pragma unroll
    for (int j = 0; j < L; j++) {
        widen_vec<A>(x[j], f);
#pragma unroll
        for (int v = 0; v < VEC; v++) {
            s[0] += f[v];
        }
    }
    warp_sum<G, 1>(s);
    const A mean0 = s[0] * a.inv_cols;
    A dev[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < L; j++) {
        widen_vec<A>(x[j], f);
#pragma unroll
        for (int v = 0; v < VEC; v++) {
            const A d = f[v] - mean0;
            dev[0] += d * d;
            dev[1] += d;
        }
    }
    warp_sum<G, 2>(dev);
    return corrected_stats(a, mean0, dev, mean);
}

// layer_norm_fwd_short_rows: rows of G * L vectors exactly (G = 1, 2, 4,
// 8 or 16 lanes of one 16-byte access each, or 32 lanes of two).
// Each thread holds L vectors of each of R rows, so one warp instruction
// covers 32 / G whole consecutive rows (512 contiguous bytes), and a
// thread's w and b serve its R rows. The register kernel gives a row of up
// to 16 vectors one, two or four threads holding consecutive vectors, so
// each of its instructions touches one or two sectors of each of 8 to 32
// rows' lines; the fused add, with its h stores, fared worst. A row of 64
// it gives 16 threads, each loading and widening w and b for that row
// alone. Rows are normalized one at a time, so one row's statistics are
// live at a time; lanes of a row meet in xor shuffles, never a barrier.
template <typename T, typename P, int G, int L, int VEC, bool RMS, bool ADD>
__global__ void __launch_bounds__(128,
                                  fwd_short_min_ctas<T, P, VEC, RMS, ADD>())
    layer_norm_fwd_short_rows(const fwd_args<T, P> a)
{
    using A = acc_t<T>;
    constexpr int R = fwd_elems<T>() / VEC / L; // rows a thread holds
    constexpr int ROW_STEP = 32 / G; // rows between a thread's items
    constexpr int WARP_ROWS = R * ROW_STEP;
    constexpr int CTA_ROWS = 4 * WARP_ROWS;
    constexpr int LANE_STEP = G * VEC; // columns between a lane's vectors
    const int lane = threadIdx.x % 32;
    const int64_t col = (lane % G) * VEC;
    // warp-uniform loop: the shuffles below need every lane of the warp
    for (int64_t wbase =
             blockIdx.x * (int64_t)CTA_ROWS + threadIdx.x / 32 * WARP_ROWS;
         wbase < a.rows; wbase += (int64_t)gridDim.x * CTA_ROWS) {
        const int64_t row0 = wbase + lane / G;
        vec_t<T, VEC> xv[R][L];
#pragma unroll
        for (int k = 0; k < R; k++) {
            const int64_t row = row0 + k * ROW_STEP;
#pragma unroll
            for (int j = 0; j < L; j++) {
                const int64_t c = col + j * LANE_STEP;
                if (row >= a.rows) {
                    xv[k][j] = zero_vec<T, VEC>();
                }
                else if constexpr (ADD) { // x and res read-only, as above
                    xv[k][j] = load_vec_ro<T, VEC>(a.x + row * a.x_stride + c);
                    add_rounded(xv[k][j], load_vec_ro<T, VEC>(
                                              a.res + row * a.res_stride + c));
                    store_vec(a.h + row * a.h_stride + c, xv[k][j]);
                }
                else {
                    xv[k][j] = load_vec<T, VEC>(a.x + row * a.x_stride + c);
                }
            }
        }
        vec_t<P, VEC> wv[L], bv[L];
#pragma unroll
        for (int j = 0; j < L; j++) {
            if (a.w) {
                wv[j] = load_vec<P, VEC>(a.w + col + j * LANE_STEP);
            }
            if (!RMS && a.b) {
                bv[j] = load_vec<P, VEC>(a.b + col + j * LANE_STEP);
            }
        }
#pragma unroll
        for (int k = 0; k < R; k++) {
            // fp32 parameters beside half x: a fence between rows, without
            // which the compiler hoists every row's statistics above the
            // first row's output and spills x's halves (ptxas)
            if constexpr (!RMS && sizeof(P) > sizeof(T)) {
                __syncwarp();
            }
            A mean = 0, rstd;
            if constexpr (RMS) {
                A sum_sq[1] = {0};
#pragma unroll
                for (int j = 0; j < L; j++) {
                    add_squares(xv[k][j], sum_sq[0]);
                }
                warp_sum<G, 1>(sum_sq);
                rstd = rms_rstd(a, sum_sq[0]);
            }
            else {
                rstd = short_row_stats<G>(a, xv[k], mean);
            }
            const int64_t row = row0 + k * ROW_STEP;
            if (row >= a.rows) {
                continue;
            }
#pragma unroll
            for (int j = 0; j < L; j++) {
                A f[VEC], out[VEC];
                widen_vec<A>(xv[k][j], f);
                with_affine<RMS>(a.w, a.b, [&](auto has_w, auto has_b) {
                    constexpr bool W = decltype(has_w)::value;
                    constexpr bool B = decltype(has_b)::value;
                    A wf[VEC], bf[VEC];
                    if constexpr (W) {
                        widen_vec<A>(wv[j], wf);
                    }
                    if constexpr (B) {
                        widen_vec<A>(bv[j], bf);
                    }
                    affine<W, B>(f, mean, rstd, wf, bf, out);
                });
                store_rounded<T, VEC>(a.y + row * a.y_stride + col +
                                          j * LANE_STEP,
                                      out);
            }
            if (lane % G == 0 && a.rstd) {
                if (a.mean) {
                    a.mean[row] = mean;
                }
                a.rstd[row] = rstd;
            }
        }
    }
}

} // namespace
} // namespace gemsops
