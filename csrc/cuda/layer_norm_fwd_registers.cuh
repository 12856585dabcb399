// LayerNorm forward, the register kernel (layer_norm_fwd_registers): TPR
// threads a row, its E elements a thread in registers; the statistics in
// one pass around a shift (stats_shifted), or two (stats_two_pass: the
// fused add and the scalar kernel), or RMSNorm's sum of squares
// (stats_rms); whole rows (items_end) with no per-item bounds.
#pragma once

#include "layer_norm_fwd_common.cuh"
#include "layer_norm_plan.cuh"
#include "reduce.cuh"

namespace gemsops {
namespace {

// The register kernel's bound: fwd_min_ctas, but three 384-thread CTAs an
// SM (1152 threads, <= 56 registers) rather than two (768) for the half
// types, where 56 registers hold the kernel without spilling (ptxas). The
// plain fp16 kernel with fp32 parameters spilled there, so it keeps two.
template <typename T, typename P, int VEC, bool ADD>
constexpr int fwd_register_min_ctas(int block)
{
    constexpr bool three =
        sizeof(T) == 2 && VEC > 1 &&
        (ADD || !(std::is_same_v<T, __half> && std::is_same_v<P, float>));
    return block == 384 && three ? 3 : fwd_min_ctas<T, VEC>(block);
}

// Eight accesses a thread (32 registers of x): 768 resident threads
// (<= 85 registers), a lone CTA at 512; 1024 (<= 64) for the one-warp
// rows of fwd_fp32_one_wave_tpr, whose reduction is shuffles alone.
constexpr int fwd_eight_access_min_ctas(int block)
{
    return block >= 512 ? 1 : block < 192 ? 1024 / block : 768 / block;
}

// One access a thread (four registers of x): 2048 resident threads (<= 32
// registers), so that the rows' threads of a small grid spread over every
// SM's schedulers rather than a few threads each waiting out four loads.
constexpr int fwd_one_access_min_ctas(int block)
{
    return 2048 / block;
}

// Two accesses a thread (the fused add's half rows, x and res of both in
// flight: 16 registers of loads): as many CTAs as fit in 1536 resident
// threads (<= 40 registers), but three of 384 threads and a lone CTA of
// 1024, where the RMSNorm kernels spilled at 40 (ptxas).
constexpr int fwd_two_access_min_ctas(int block)
{
    return block >= 768 ? 1 : block == 384 ? 3 : 1536 / block;
}

// Two accesses a thread without the fused add (the plain half rows of
// one wave, groups of 96 and 128): 48 registers, where 40 spilled the
// LayerNorm kernel at 96 threads (4 bytes). A scheduler's quarter of the
// register file holds ten warps at 48: 13 CTAs of 96, 10 of 128.
constexpr int fwd_plain_two_access_min_ctas(int block)
{
    return 1280 / block;
}

// The register kernel's bound for ACC accesses a thread.
template <typename T, typename P, int VEC, bool ADD, int ACC>
constexpr int fwd_register_bound(int block)
{
    return ACC == 4 || ACC == 3 ? fwd_register_min_ctas<T, P, VEC, ADD>(block)
           : ACC == 8           ? fwd_eight_access_min_ctas(block)
           : ACC == 2 && ADD    ? fwd_two_access_min_ctas(block)
           : ACC == 2           ? fwd_plain_two_access_min_ctas(block)
                                : fwd_one_access_min_ctas(block);
}

// The share of the shifted sum of squares that m2 = sum((x - mean)^2) must
// keep for the one pass to stand: with N (var + (mean - K)^2) in the sum,
// a share s allows |mean - K| up to sqrt(1 / s - 1) spreads. Past that the
// difference cancels the variance's digits, and the sum of x - K, whose
// rounding grows with N |mean - K|, the mean's. Half x rounds its output
// above either error up to sqrt(3) spreads; fp32 and fp64 output keeps the
// mean's digits, which stay near torch's within half a spread
// (test_forward_first_access_far_from_mean).
template <typename T>
__host__ __device__ constexpr float shift_kept_share()
{
    return sizeof(T) >= 4 ? 0.8f : 0.25f;
}

// The register kernel's shift: the mean of the row's first accesses, a
// value near the row's mean, so that the sums of x - K and (x - K)^2 keep
// the variance's digits. fp32 and fp64 rows, held to half a spread
// (shift_kept_share), average four accesses: K's distance from the mean,
// a spread over sqrt(4 VEC), passes half a spread on one fp32 row in
// twenty rather than one in three, and a row past it pays a second
// reduction.
template <typename T>
__host__ __device__ constexpr int shift_accesses()
{
    return shift_kept_share<T>() > 0.25f ? 4 : 1;
}

// The row's first accesses that its shift averages: shift_accesses, or
// as many as a shorter row holds.
template <typename T, int VEC, typename P>
__device__ __forceinline__ int shift_count(const fwd_args<T, P> &a)
{
    constexpr int ACCESSES = shift_accesses<T>();
    return ACCESSES == 1 || a.cols >= ACCESSES * VEC ? ACCESSES
                                                     : (int)(a.cols / VEC);
}

// K from the row's first vectors, loaded again.
template <typename T, int VEC, typename P>
__device__ __forceinline__ acc_t<T> row_shift(const fwd_args<T, P> &a,
                                              int64_t row)
{
    using A = acc_t<T>;
    constexpr int ACCESSES = shift_accesses<T>();
    const int n = shift_count<T, VEC>(a);
    A k = 0;
#pragma unroll
    for (int j = 0; j < ACCESSES; j++) {
        if (j < n) {
            const vec_t<T, VEC> v =
                load_vec<T, VEC>(a.x + row * a.x_stride + j * VEC);
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                k += widen<A>(v.v[i]);
            }
        }
    }
    return k / (A)(n * VEC);
}

// row_shift from registers, where a warp holds the row (TPR <= 32) and the
// accesses averaged are item 0 of the row's first lanes (TPR >=
// shift_accesses): shuffles rather than a load of the row's first vectors
// behind a branch. The lanes past a shorter row hold zeros there (the
// zero fill), so the sum is that of the row's first vectors alone.
template <int TPR, typename T, int VEC, typename P>
__device__ __forceinline__ acc_t<T> row_shift_from_lanes(
    const fwd_args<T, P> &a, const vec_t<T, VEC> &first)
{
    using A = acc_t<T>;
    A k = 0;
#pragma unroll
    for (int i = 0; i < VEC; i++) {
        k += widen<A>(first.v[i]);
    }
#pragma unroll
    for (int off = 1; off < shift_accesses<T>(); off *= 2) {
        k += __shfl_xor_sync(0xffffffffu, k, off);
    }
    k = __shfl_sync(0xffffffffu, k, (threadIdx.x % 32) & ~(TPR - 1));
    return k / (A)(shift_count<T, VEC>(a) * VEC);
}

// The register kernel's statistics, two passes: the row sum gives a first
// mean, then the corrected two-pass step (corrected_stats). Returns rstd.
template <int TPR, int STEP, typename T, typename P, int VEC, int ITEMS,
          typename L>
__device__ __forceinline__ acc_t<T> stats_two_pass(
    const fwd_args<T, P> &a, const vec_t<T, VEC> (&xv)[ITEMS], L lim,
    acc_t<T> *red, int &parity, acc_t<T> &mean)
{
    using A = acc_t<T>;
    A s[1] = {0};
#pragma unroll
    for (int i = 0; i < ITEMS; i++) {
        if (i * STEP < lim) {
#pragma unroll
            for (int v = 0; v < VEC; v++) {
                s[0] += widen<A>(xv[i].v[v]);
            }
        }
    }
    row_sum<TPR, 1>(s, red, parity);
    // dev[0] sums the squared deviations, dev[1] the deviations themselves
    const A mean0 = s[0] * a.inv_cols;
    A dev[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < ITEMS; i++) {
        // an item is whole or absent: cols and every row start are
        // multiples of VEC
        if (i * STEP < lim) {
#pragma unroll
            for (int v = 0; v < VEC; v++) {
                const A d = widen<A>(xv[i].v[v]) - mean0;
                dev[0] += d * d;
                dev[1] += d;
            }
        }
    }
    row_sum<TPR, 2>(dev, red, parity);
    return corrected_stats(a, mean0, dev, mean);
}

// The register kernel's statistics in one pass and one reduction: the sums
// of d = x - center and of d^2, center first the row's shift K (row_shift).
// Where the mean lies far from K against the spread (m2 under
// shift_kept_share of the sum of squares), or a sum is not finite, the pass
// runs once more around the mean found: the corrected two-pass step.
// Returns rstd.
template <int TPR, int ROWS_PER_CTA, int STEP, typename T, typename P, int VEC,
          int ITEMS, typename L>
__device__ __forceinline__ acc_t<T> stats_shifted(
    const fwd_args<T, P> &a, const vec_t<T, VEC> (&xv)[ITEMS], L lim,
    bool row_ok, int64_t row, acc_t<T> *red, int &parity, acc_t<T> &mean)
{
    using A = acc_t<T>;
    A center;
    if constexpr (TPR <= 32 && TPR >= shift_accesses<T>()) {
        center = row_shift_from_lanes<TPR>(a, xv[0]);
    }
    else {
        center = row_ok ? row_shift<T, VEC>(a, row) : A(0);
    }
    A sums[2], off, m2;
#pragma unroll 1
    for (int pass = 0;; pass++) {
        sums[0] = sums[1] = A(0);
#pragma unroll
        for (int i = 0; i < ITEMS; i++) {
            if (i * STEP < lim) {
#pragma unroll
                for (int v = 0; v < VEC; v++) {
                    const A d = widen<A>(xv[i].v[v]) - center;
                    sums[0] += d;
                    sums[1] += d * d;
                }
            }
        }
        row_sum<TPR, 2>(sums, red, parity);
        off = sums[0] * a.inv_cols;
        m2 = sums[1] - sums[0] * off;
        bool again = pass == 0 && !(m2 >= A(shift_kept_share<T>()) * sums[1] &&
                                    isfinite(sums[1]));
        // the same choice across the threads that meet in the next pass's
        // shuffles (a warp of rows) or barrier (two rows a CTA)
        if constexpr (TPR <= 32) {
            again = __any_sync(0xffffffffu, again);
        }
        else if constexpr (ROWS_PER_CTA > 1) {
            again = __syncthreads_or(again);
        }
        if (!again) {
            break;
        }
        center += off;
    }
    // a row holding inf or NaN, or overflowing, keeps the plain values
    const bool fix = isfinite(off);
    mean = fix ? center + off : center;
    m2 = fix ? m2 : sums[1];
    m2 = m2 < A(0) ? A(0) : m2; // NaN stays NaN
    return rsqrt(m2 * a.inv_cols + a.eps);
}

// The register kernel's RMSNorm statistic: one pass, one reduction.
template <int TPR, int STEP, typename T, typename P, int VEC, int ITEMS,
          typename L>
__device__ __forceinline__ acc_t<T> stats_rms(const fwd_args<T, P> &a,
                                              const vec_t<T, VEC> (&xv)[ITEMS],
                                              L lim, acc_t<T> *red,
                                              int &parity)
{
    acc_t<T> sum_sq[1] = {0};
    add_item_squares<STEP>(xv, lim, sum_sq[0]);
    row_sum<TPR, 1>(sum_sq, red, parity);
    return rms_rstd(a, sum_sq[0]);
}

// The register kernel's output for one row's items. Half rows with half
// parameters of up to three items load every item's w and b first, on the
// read-only path (the C boundary refuses outputs overlapping inputs) and
// from a valid address whether or not the item is in the row (w and b
// themselves), so that no branch holds them: one round trip for the
// parameters, not one an item behind the item before's store. Rows of four
// or more items load an item's w and b after the item before's store:
// holding them all spilled, and long half rows ran slower that way.
template <bool HAS_W, bool HAS_B, int STEP, typename T, typename P, int VEC,
          int ITEMS, typename L, typename A>
__device__ __forceinline__ void normalize_items(
    const fwd_args<T, P> &a, const vec_t<T, VEC> (&xv)[ITEMS], L lim,
    int64_t col0, T *yr, A mean, A rstd)
{
    constexpr bool params_first = rounds_in_pairs<T, VEC>() && VEC == 8 &&
                                  sizeof(P) == sizeof(T) && ITEMS <= 3;
    vec_t<P, VEC> wv[ITEMS], bv[ITEMS];
    if constexpr (params_first) {
#pragma unroll
        for (int i = 0; i < ITEMS; i++) {
            const int64_t c = i * STEP < lim ? col0 + i * STEP : 0;
            if constexpr (HAS_W) {
                wv[i] = load_vec_ro<P, VEC>(a.w + c);
            }
            if constexpr (HAS_B) {
                bv[i] = load_vec_ro<P, VEC>(a.b + c);
            }
        }
    }
    // item i's parameter: held, or loaded now
    auto param = [&](const P *p, const vec_t<P, VEC> &held, int i) {
        if constexpr (params_first) {
            return held;
        }
        else {
            return load_vec<P, VEC>(p + col0 + i * STEP);
        }
    };
#pragma unroll
    for (int i = 0; i < ITEMS; i++) {
        if (i * STEP >= lim) {
            continue;
        }
        A wf[VEC], bf[VEC], xf[VEC], out[VEC];
        if constexpr (HAS_W) {
            widen_vec<A>(param(a.w, wv[i], i), wf);
        }
        if constexpr (HAS_B) {
            widen_vec<A>(param(a.b, bv[i], i), bf);
        }
        widen_vec<A>(xv[i], xf);
        affine<HAS_W, HAS_B>(xf, mean, rstd, wf, bf, out);
        store_rounded<T, VEC>(yr + i * STEP, out);
    }
}

// v(), a vector loaded, where ok; zeros elsewhere, chosen as raw words: a
// choice between two vectors of half types is made 16 bits at a time, and
// their words re-assembled from the halves (PRMTs a thread per access).
template <typename T, int VEC, typename Load>
__device__ __forceinline__ vec_t<T, VEC> vec_or_zero(bool ok, Load v)
{
    using W = typename raw_word<sizeof(T) * VEC>::type;
    W w{};
    if (ok) {
        const vec_t<T, VEC> loaded = v();
        w = *reinterpret_cast<const W *>(&loaded);
    }
    vec_t<T, VEC> out;
    *reinterpret_cast<W *>(&out) = w;
    return out;
}

template <typename T, int VEC>
__device__ __forceinline__ vec_t<T, VEC> load_vec_or_zero(const T *p, bool ok)
{
    return vec_or_zero<T, VEC>(ok, [p] { return load_vec<T, VEC>(p); });
}

template <typename T, int VEC>
__device__ __forceinline__ vec_t<T, VEC> load_vec_ro_or_zero(const T *p,
                                                             bool ok)
{
    return vec_or_zero<T, VEC>(ok, [p] { return load_vec_ro<T, VEC>(p); });
}

// Where a thread's items end: item i lies in its row when i * STEP < the
// limit. Whole rows (cols == TPR * E, every item of every thread inside
// the row) take a constant the compiler folds, so that no item's loads,
// sums and stores sit behind a branch of their own; other rows the
// thread's columns left from its first.
template <int END>
struct whole_row_end {
    __host__ __device__ constexpr operator int() const
    {
        return END;
    }
};

template <bool WHOLE, int END>
__device__ __forceinline__ auto items_end(int cols_left)
{
    if constexpr (WHOLE) {
        return whole_row_end<END>{};
    }
    else {
        return cols_left;
    }
}

// The fused add's pass over a row's items: x and res of two items loaded
// before their h = x + res is stored (each item's loads behind its own
// bounds test and the previous item's store waited out a DRAM round trip
// each, SASS; all four at once spilled, ptxas). Items past the row are
// zeros: whole rows (a constant bound, ok the row's alone) fill them as
// whole words; ragged rows keep the select, which the word fill slowed
// there (docs/performance.md).
template <int STEP, int BATCH, typename T, typename P, int VEC, int ITEMS,
          typename L>
__device__ __forceinline__ void load_added_items(const fwd_args<T, P> &a,
                                                 vec_t<T, VEC> (&xv)[ITEMS],
                                                 int64_t row, bool row_ok,
                                                 L lim, int64_t col0)
{
    const T *xr = a.x + row * a.x_stride + col0;
    const T *rr = a.res + row * a.res_stride + col0;
    T *hr = a.h + row * a.h_stride + col0;
#pragma unroll
    for (int i0 = 0; i0 < ITEMS; i0 += BATCH) {
        vec_t<T, VEC> rv[BATCH];
#pragma unroll
        for (int k = 0; k < BATCH; k++) {
            const bool ok = row_ok && (i0 + k) * STEP < lim;
            if constexpr (std::is_integral_v<L>) {
                xv[i0 + k] = ok ? load_vec_ro<T, VEC>(xr + (i0 + k) * STEP)
                                : zero_vec<T, VEC>();
                rv[k] = ok ? load_vec_ro<T, VEC>(rr + (i0 + k) * STEP)
                           : zero_vec<T, VEC>();
            }
            else {
                xv[i0 + k] =
                    load_vec_ro_or_zero<T, VEC>(xr + (i0 + k) * STEP, ok);
                rv[k] = load_vec_ro_or_zero<T, VEC>(rr + (i0 + k) * STEP, ok);
            }
        }
#pragma unroll
        for (int k = 0; k < BATCH; k++) {
            if (row_ok && (i0 + k) * STEP < lim) {
                add_rounded(xv[i0 + k], rv[k]);
                store_vec(hr + (i0 + k) * STEP, xv[i0 + k]);
            }
        }
    }
}

template <typename T, typename P, int TPR, int VEC, bool RMS, bool ADD,
          int ACC, bool WHOLE>
__global__ void __launch_bounds__(
    layer_norm_block_threads(TPR),
    fwd_register_bound<T, P, VEC, ADD, ACC>(layer_norm_block_threads(TPR)))
    layer_norm_fwd_registers(const fwd_args<T, P> a)
{
    using A = acc_t<T>;
    constexpr int E = fwd_elems<T, ACC>();
    constexpr int ITEMS = E / VEC;
    constexpr int BLOCK = layer_norm_block_threads(TPR);
    constexpr int ROWS_PER_CTA = BLOCK / TPR;
    constexpr int STEP = TPR * VEC; // columns between a thread's items
    // the fused add's items loaded together (load_added_items): two for
    // 16-byte accesses, all three of a three-access thread (two, then one,
    // ran slower), one for the scalar fallback (spilled at two)
    constexpr int kAddBatch = VEC == 1     ? 1
                              : ITEMS == 3 ? 3
                              : ITEMS >= 2 ? 2
                                           : 1;
    static_assert(ITEMS % kAddBatch == 0, "whole batches of items");
    __shared__ A red[2 * 32 * 2]; // row_sum of up to 2 values
    int parity = 0;

    const int lane = threadIdx.x % TPR;
    const int64_t group = blockIdx.x;
    const int64_t groups = gridDim.x;
    const int64_t col0 = lane * VEC;
    const int slab_cols = (int)a.cols; // <= TPR * E
    const auto lim = items_end<WHOLE, ITEMS * STEP>(slab_cols - lane * VEC);

    // One row per thread and step: four accesses a thread already keep
    // enough bytes in flight, and registers go to occupancy.
    for (int64_t base = group * ROWS_PER_CTA; base < a.rows;
         base += groups * ROWS_PER_CTA) {
        const int64_t row = base + threadIdx.x / TPR;
        const bool row_ok = row < a.rows;
        vec_t<T, VEC> xv[ITEMS];
        if constexpr (ADD) { // the fused add: normalize h, write it
            load_added_items<STEP, kAddBatch>(a, xv, row, row_ok, lim, col0);
        }
        else {
            const T *xr = a.x + row * a.x_stride + col0;
#pragma unroll
            for (int i = 0; i < ITEMS; i++) {
                xv[i] = load_vec_or_zero<T, VEC>(xr + i * STEP,
                                                 row_ok && i * STEP < lim);
            }
        }
        // the fused add's kernel holds x and res in flight: there the
        // shifted pass's extra values cost registers (a spill, or more
        // registers a thread) and time (docs/performance.md), so it keeps
        // the two passes. So does the scalar kernel: its shift, a lone
        // element, may lie spreads from the mean, and the shifted sum's
        // rounding, which grows with N |mean - K|, left the mean several
        // times further off than torch's (a case the fuzzer found)
        A mean = 0, rstd;
        if constexpr (RMS) {
            rstd = stats_rms<TPR, STEP>(a, xv, lim, red, parity);
        }
        else if constexpr (ADD || VEC == 1) {
            rstd = stats_two_pass<TPR, STEP>(a, xv, lim, red, parity, mean);
        }
        else {
            rstd =
                stats_shifted<TPR, ROWS_PER_CTA, STEP>(a, xv, lim, row_ok, row,
                                                       red, parity, mean);
        }

        if (row_ok) {
            T *yr = a.y + row * a.y_stride + col0;
            with_affine<RMS>(a.w, a.b, [&](auto has_w, auto has_b) {
                constexpr bool W = decltype(has_w)::value;
                constexpr bool B = decltype(has_b)::value;
                normalize_items<W, B, STEP>(a, xv, lim, col0, yr, mean, rstd);
            });
        }
        if (lane == 0 && row_ok && a.rstd) {
            if (a.mean) {
                a.mean[row] = mean;
            }
            a.rstd[row] = rstd;
        }
    }
}

} // namespace
} // namespace gemsops
