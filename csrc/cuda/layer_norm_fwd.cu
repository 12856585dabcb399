// LayerNorm forward: y = (x - mean) * rstd * w + b, per row of N elements;
// RMSNorm the same with mean = 0 and no bias. Each kernel is compiled apart
// for RMSNorm (template RMS): its statistic is the sum of squares alone
// (rms_rstd), and its output has no centring and no bias.
//
// Three kernels, chosen by N:
//
// layer_norm_fwd_short_rows (16-byte accesses, N of 1, 2, 4, 8 or 16 of
// them): G = N / VEC lanes a row, each thread one vector of four rows, so
// that a warp's access covers whole consecutive rows. Statistics: the
// corrected two-pass step below.
//
// layer_norm_fwd_registers (N <= TPR_max * E): TPR consecutive threads own
// a row, each holding E elements in registers (four 16-byte accesses;
// eight for fp32 rows past 5120 and for fp32 rows of one warp that fit one
// wave, fwd_fp32_long_tpr and fwd_fp32_one_wave_tpr; one for too few rows
// to fill the GPU at four, fwd_one_access_tpr), so x is read from memory
// exactly once. Rows that fill every item of groups of 8 to 32 threads
// (N = TPR * E) have kernels of their own with no per-item bounds
// (items_end).
// Statistics in one pass and one reduction (stats_shifted): the sums of
// d = x - K and of d^2, K the mean of the row's first accesses (row_shift),
// near the row's mean, so that sum(d^2) - sum(d)^2 / N keeps the variance's
// digits; a row whose mean lies far from K against its spread, or whose sums
// are not finite, takes a second pass around the mean found. That second
// pass, and the variant of the fused add and of the scalar kernel
// (stats_two_pass, a row sum first), are the corrected two-pass step: the
// squared deviations from a first mean, summed with the deviations
// themselves, which correct the mean and the variance (the first mean's
// rounding error would otherwise stay in every x - mean, and with a small eps
// a constant row would normalize to +-1 instead of 0). Short rows pack
// several per CTA. One CTA per row group, not persistent: the SM overlaps one
// CTA's reductions with another's loads.
//
// layer_norm_fwd_looped (longer rows): one CTA per row streams it twice.
// Pass 1 takes chunks of 4 accesses per thread, computes each chunk's mean
// and squared deviations in registers and merges them into a running
// (count, mean, M2) with Chan's formula; the CTA merges the threads' triples
// in a fixed order (RMSNorm: a running sum of squares, then one sum).
// Pass 2 re-reads x (mostly from L2: the rows in flight fit in it up to
// ~64K half elements; pass 2's reads are evict-first, so they do not push
// out rows still waiting for theirs) and writes y. The
// fused add reads x and res once and h back in pass 2 (each thread its own
// pass-1 stores).
//
// Bytes: read x once (twice from L2 for long rows), write y once, plus 2
// stats per row; the fused add also reads res once and writes h once (long
// rows read h back from L2, not x); weight and bias (N elements each) come
// from L2.
//
// Test: python -m pytest tests/test_layer_norm.py -m cuda -k "forward or
// row_lengths". Time: python -m pytest benchmark/test_layer_norm_perf.py
// -k forward, or one case: python tools/ln_time.py 8192,8192:fwd:bfloat16;
// A/B a change with tools/ab.sh. Measurements behind the choices below:
// docs/performance.md.
#include <algorithm>
#include <type_traits>
#include <utility>

#include "convert.cuh"
#include "cuda_check.cuh"
#include "device.cuh"
#include "gemsops/layer_norm.h"
#include "gemsops/tensor.h"
#include "l2_policy.cuh"
#include "layer_norm_plan.cuh"
#include "reduce.cuh"

namespace gemsops {
namespace {

// Elements per thread in the forward: ACC 16-byte accesses in flight,
// four, or eight for the register kernel's long fp32 rows
// (fwd_fp32_long_tpr).
template <typename T, int ACC = 4>
__host__ __device__ constexpr int fwd_elems()
{
    return ACC * 16 / sizeof(T);
}

// Widest thread group per row. Half types and fp32: 1024 threads hold
// rows up to 32768 half or 16384 fp32 elements in registers, read once;
// that beat 256/512 threads and the looped kernel. A lone 1024-thread CTA
// per SM idles in its barriers, but the looped kernel's second pass over
// L2 cost more. fp64 at 512 (its registers double). Longer rows go to the
// looped kernel.
template <typename T>
constexpr int fwd_max_tpr()
{
    return sizeof(T) == 8 ? 512 : 1024;
}

template <typename T, typename P>
struct fwd_args {
    const T *x;
    T *y;
    const P *w;
    const P *b;
    acc_t<T> *mean;
    acc_t<T> *rstd;
    int64_t rows, cols, x_stride, y_stride;
    acc_t<T> eps;
    // 1 / cols, rounded once on the host: the register and short-row
    // kernels, near issue-bound on an H200, multiply by it where each row
    // took IEEE divisions, and take rstd by rsqrt, as torch's kernels do
    acc_t<T> inv_cols;
    const T *res; // the fused add: NULL, or x's partner (h = x + res)
    T *h; // with res: h written, in the dtype (torch's add rounds so)
    int64_t res_stride, h_stride;
};

// x = x + r rounded to T, as torch's add (in the accumulator type, which
// is exact for two half values and torch's own type for fp32/fp64).
template <typename T, int VEC>
__device__ __forceinline__ void add_rounded(vec_t<T, VEC> &x,
                                            const vec_t<T, VEC> &r)
{
    using A = acc_t<T>;
#pragma unroll
    for (int v = 0; v < VEC; v++) {
        x.v[v] = from_acc<T>(widen<A>(x.v[v]) + widen<A>(r.v[v]));
    }
}

// Register budget for CTAs of up to 512: 1024 resident threads per SM
// (<= 64 registers) for 16-byte accesses of 2- and 4-byte types, so that
// one CTA's barriers overlap another's loads (eight CTAs of 128 rather
// than six or seven: their 64 bytes in flight a thread are what keeps DRAM
// busy); 768 (<= 85) for fp64 and the scalar fallback, which spilled under
// 64. A lone CTA of 640 to 1024 takes 64 to 85 registers.
template <typename T, int VEC>
constexpr int fwd_min_ctas(int block)
{
    const int resident = sizeof(T) <= 4 && VEC > 1 ? 1024 : 768;
    return block > 512 ? 1 : block == 512 ? 2 : resident / block;
}

// The short-rows kernel's bound: fwd_min_ctas, but seven CTAs an SM (<= 72
// registers) for LayerNorm of half x with fp32 parameters, whose w and b
// (16 registers of fp32) beside four rows of x spilled 24-34 bytes under 64
// (ptxas), a spill that cost more than the eighth CTA gains
// (docs/performance.md). The fused add's 20-byte spill there costs less:
// it keeps eight.
template <typename T, typename P, int VEC, bool RMS, bool ADD>
constexpr int fwd_short_min_ctas()
{
    return !RMS && !ADD && sizeof(P) > sizeof(T) ? 7
                                                 : fwd_min_ctas<T, VEC>(128);
}

// The register kernel's bound: fwd_min_ctas, but three 384-thread CTAs an
// SM (1152 threads, <= 56 registers) rather than two (768) for the half
// types, where 56 registers hold the kernel without spilling (ptxas). The
// plain fp16 kernel with fp32 parameters spilled 32 bytes there, so it
// keeps two.
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

// The register kernel's bound for ACC accesses a thread.
template <typename T, typename P, int VEC, bool ADD, int ACC>
constexpr int fwd_register_bound(int block)
{
    return ACC == 4   ? fwd_register_min_ctas<T, P, VEC, ADD>(block)
           : ACC == 8 ? fwd_eight_access_min_ctas(block)
           : ACC == 2 ? fwd_two_access_min_ctas(block)
                      : fwd_one_access_min_ctas(block);
}

// The corrected two-pass step of a row held in registers: from the first
// mean mean0 and the row's sums of squared deviations from it (dev[0]) and
// of the deviations themselves (dev[1]), the mean and rstd. mean0's
// rounding error comes back as the deviations' mean; a row holding inf or
// NaN, or overflowing, keeps the plain two-pass values.
template <typename T, typename P, typename A>
__device__ __forceinline__ A corrected_stats(const fwd_args<T, P> &a, A mean0,
                                             const A (&dev)[2], A &mean)
{
    const A shift = dev[1] * a.inv_cols;
    const bool fix = isfinite(shift);
    mean = fix ? mean0 + shift : mean0;
    A m2 = fix ? dev[0] - dev[1] * shift : dev[0];
    m2 = m2 < A(0) ? A(0) : m2; // NaN stays NaN
    return rsqrt(m2 * a.inv_cols + a.eps);
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

// RMSNorm's statistic from a row's sum of squares: 1 / sqrt(mean(x^2) +
// eps), with no mean to find and no cancellation to guard against.
template <typename T, typename P, typename A>
__device__ __forceinline__ A rms_rstd(const fwd_args<T, P> &a, A sum_sq)
{
    return rsqrt(sum_sq * a.inv_cols + a.eps);
}

// x's squares summed into acc, VEC elements of one access.
template <typename A, typename T, int VEC>
__device__ __forceinline__ void add_squares(const vec_t<T, VEC> &x, A &acc)
{
    A f[VEC];
    widen_vec<A>(x, f);
#pragma unroll
    for (int v = 0; v < VEC; v++) {
        acc = fma(f[v], f[v], acc);
    }
}

// The squares of a thread's items i with i * STEP < lim summed into acc.
template <int STEP, typename A, typename T, int VEC, int ITEMS, typename L>
__device__ __forceinline__ void add_item_squares(
    const vec_t<T, VEC> (&xv)[ITEMS], L lim, A &acc)
{
#pragma unroll
    for (int i = 0; i < ITEMS; i++) {
        if (i * STEP < lim) {
            add_squares(xv[i], acc);
        }
    }
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

// y = (x - mean) * (rstd * w) + b for one vector: one multiply and one fma
// after the exact difference, with w and b present or absent at compile
// time. Tested in the element loop, their presence had each element's
// arithmetic issued both ways under predicates (a quarter of the register
// kernel's instructions: docs/performance.md).
template <bool HAS_W, bool HAS_B, typename A, int VEC>
__device__ __forceinline__ void affine(const A (&x)[VEC], A mean, A rstd,
                                       const A (&w)[VEC], const A (&b)[VEC],
                                       A (&out)[VEC])
{
#pragma unroll
    for (int v = 0; v < VEC; v++) {
        const A scale = HAS_W ? rstd * w[v] : rstd;
        const A d = x[v] - mean;
        out[v] = HAS_B ? fma(d, scale, b[v]) : d * scale;
    }
}

// Calls f(has_w, has_b), each a std::bool_constant: the presence of w and
// b tested once, outside the element loops that affine() unrolls. RMSNorm
// has no bias (dispatch() refuses one).
template <bool RMS, typename F>
__device__ __forceinline__ void with_affine(const void *w, const void *b,
                                            F &&f)
{
    if constexpr (RMS) {
        if (w) {
            f(std::true_type{}, std::false_type{});
        }
        else {
            f(std::false_type{}, std::false_type{});
        }
    }
    else if (w && b) {
        f(std::true_type{}, std::true_type{});
    }
    else if (w) {
        f(std::true_type{}, std::false_type{});
    }
    else if (b) {
        f(std::false_type{}, std::true_type{});
    }
    else {
        f(std::false_type{}, std::false_type{});
    }
}

// The register kernel's output for one row's items, w and b widened from
// their words.
template <bool HAS_W, bool HAS_B, int STEP, typename T, typename P, int VEC,
          int ITEMS, typename L, typename A>
__device__ __forceinline__ void normalize_items(
    const fwd_args<T, P> &a, const vec_t<T, VEC> (&xv)[ITEMS], L lim,
    int64_t col0, T *yr, A mean, A rstd)
{
#pragma unroll
    for (int i = 0; i < ITEMS; i++) {
        if (i * STEP >= lim) {
            continue;
        }
        A wf[VEC], bf[VEC], xf[VEC], out[VEC];
        if constexpr (HAS_W) {
            widen_vec<A>(load_vec<P, VEC>(a.w + col0 + i * STEP), wf);
        }
        if constexpr (HAS_B) {
            widen_vec<A>(load_vec<P, VEC>(a.b + col0 + i * STEP), bf);
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
// by 3-8% there (docs/performance.md).
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
    // 16-byte accesses, one for the scalar fallback (spilled at two)
    constexpr int kAddBatch = VEC > 1 && ITEMS >= 2 ? 2 : 1;
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
        // shifted pass's extra values cost registers (spills, then 56 -> 63)
        // and time (docs/performance.md), so it keeps the two passes. So
        // does the scalar kernel: its shift, a lone element, may lie
        // spreads from the mean, and the shifted sum's rounding, which
        // grows with N |mean - K|, left the mean several times further
        // off than torch's (fuzz seed 55 case 1757)
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

// The short-rows kernel's LayerNorm statistics for a row of G lanes, one
// vector each: the register kernel's corrected two-pass step. Returns rstd.
template <int G, typename T, typename P, int VEC>
__device__ __forceinline__ acc_t<T> short_row_stats(const fwd_args<T, P> &a,
                                                    const vec_t<T, VEC> &x,
                                                    acc_t<T> &mean)
{
    using A = acc_t<T>;
    A f[VEC];
    A s[1] = {0};
    widen_vec<A>(x, f);
#pragma unroll
    for (int v = 0; v < VEC; v++) {
        s[0] += f[v];
    }
    warp_sum<G, 1>(s);
    const A mean0 = s[0] * a.inv_cols;
    A dev[2] = {0, 0};
    widen_vec<A>(x, f);
#pragma unroll
    for (int v = 0; v < VEC; v++) {
        const A d = f[v] - mean0;
        dev[0] += d * d;
        dev[1] += d;
    }
    warp_sum<G, 2>(dev);
    return corrected_stats(a, mean0, dev, mean);
}

// layer_norm_fwd_short_rows: rows of G vectors exactly (G = 1, 2, 4, 8 or 16
// lanes of one 16-byte access each). Each thread holds one vector of R
// rows, so one warp instruction covers 32 / G whole consecutive rows (512
// contiguous bytes). The register kernel gives such a row one, two or four
// threads holding consecutive vectors, so each of its instructions touches
// one or two sectors of each of 8 to 32 rows' lines; the fused add, with
// its h stores, fared worst. Rows are normalized one at a time, so one row's
// statistics are live at a time; lanes of a row meet in xor shuffles,
// never a barrier.
template <typename T, typename P, int G, int VEC, bool RMS, bool ADD>
__global__ void __launch_bounds__(128,
                                  fwd_short_min_ctas<T, P, VEC, RMS, ADD>())
    layer_norm_fwd_short_rows(const fwd_args<T, P> a)
{
    using A = acc_t<T>;
    constexpr int R = fwd_elems<T>() / VEC; // rows a thread holds
    constexpr int ROW_STEP = 32 / G; // rows between a thread's items
    constexpr int WARP_ROWS = R * ROW_STEP;
    constexpr int CTA_ROWS = 4 * WARP_ROWS;
    const int lane = threadIdx.x % 32;
    const int64_t col = (lane % G) * VEC;
    // warp-uniform loop: the shuffles below need every lane of the warp
    for (int64_t wbase =
             blockIdx.x * (int64_t)CTA_ROWS + threadIdx.x / 32 * WARP_ROWS;
         wbase < a.rows; wbase += (int64_t)gridDim.x * CTA_ROWS) {
        const int64_t row0 = wbase + lane / G;
        vec_t<T, VEC> xv[R];
#pragma unroll
        for (int k = 0; k < R; k++) {
            const int64_t row = row0 + k * ROW_STEP;
            if (row >= a.rows) {
                xv[k] = zero_vec<T, VEC>();
            }
            else if constexpr (ADD) { // x and res read-only, as above
                xv[k] = load_vec_ro<T, VEC>(a.x + row * a.x_stride + col);
                add_rounded(xv[k], load_vec_ro<T, VEC>(
                                       a.res + row * a.res_stride + col));
                store_vec(a.h + row * a.h_stride + col, xv[k]);
            }
            else {
                xv[k] = load_vec<T, VEC>(a.x + row * a.x_stride + col);
            }
        }
        vec_t<P, VEC> wv, bv;
        if (a.w) {
            wv = load_vec<P, VEC>(a.w + col);
        }
        if (!RMS && a.b) {
            bv = load_vec<P, VEC>(a.b + col);
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
                add_squares(xv[k], sum_sq[0]);
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
            A f[VEC], out[VEC];
            widen_vec<A>(xv[k], f);
            with_affine<RMS>(a.w, a.b, [&](auto has_w, auto has_b) {
                constexpr bool W = decltype(has_w)::value;
                constexpr bool B = decltype(has_b)::value;
                A wf[VEC], bf[VEC];
                if constexpr (W) {
                    widen_vec<A>(wv, wf);
                }
                if constexpr (B) {
                    widen_vec<A>(bv, bf);
                }
                affine<W, B>(f, mean, rstd, wf, bf, out);
            });
            store_rounded<T, VEC>(a.y + row * a.y_stride + col, out);
            if (lane % G == 0 && a.rstd) {
                if (a.mean) {
                    a.mean[row] = mean;
                }
                a.rstd[row] = rstd;
            }
        }
    }
}

// hi + lo += t, the rounding error of hi + t kept in lo (Knuth's TwoSum);
// an error that is not finite (an infinite or NaN hi or t) is dropped, so
// lo stays finite and hi carries the non-finite value alone.
template <typename A>
__device__ __forceinline__ void two_sum_into(A &hi, A &lo, A t)
{
    const A s = hi + t;
    const A tb = s - hi;
    const A e = (hi - (s - tb)) + (t - tb);
    hi = s;
    lo += isfinite(e) ? e : A(0);
}

// 1 / n of a count n, correctly rounded; times a numerator it is within
// an ulp of the quotient. Unlike the IEEE division it has no slow-path
// call for the inliner to weigh (inlined or not, that call moved the
// looped kernels' registers from build to build).
__device__ __forceinline__ float rcp_rn(float n)
{
    return __frcp_rn(n);
}
__device__ __forceinline__ double rcp_rn(double n)
{
    return __drcp_rn(n);
}

// Chan's parallel-variance merge of (nb, mb + mbc, m2b) into
// (n, m + mc, m2), each mean carried as a compensated pair. Rounding the
// running mean at every merge would cost up to half an ulp of the mean
// per merge, which is large against the deviations of a row whose mean is
// large against its spread (x = 100 + noise: the output's error grew
// tenfold over torch's); the pair keeps it below one ulp in all.
template <typename A>
__device__ __forceinline__ void chan_merge(A &n, A &m, A &mc, A &m2, A nb,
                                           A mb, A mbc, A m2b)
{
    if (nb == A(0)) {
        return;
    }
    if (n == A(0)) {
        n = nb;
        m = mb;
        mc = mbc;
        m2 = m2b;
        return;
    }
    const A nab = n + nb;
    const A d = (mb - m) + (mbc - mc);
    const A f = nb * rcp_rn(nab);
    two_sum_into(m, mc, d * f);
    m2 += m2b + d * d * n * f;
    n = nab;
}

// The triples of WIDTH consecutive lanes merged down to the first of them,
// in a fixed order (deterministic).
template <int WIDTH, typename A>
__device__ __forceinline__ void chan_merge_down(A &n, A &m, A &mc, A &m2)
{
#pragma unroll
    for (int off = WIDTH / 2; off > 0; off /= 2) {
        const A nb = __shfl_down_sync(0xffffffffu, n, off);
        const A mb = __shfl_down_sync(0xffffffffu, m, off);
        const A mbc = __shfl_down_sync(0xffffffffu, mc, off);
        const A m2b = __shfl_down_sync(0xffffffffu, m2, off);
        chan_merge(n, m, mc, m2, nb, mb, mbc, m2b);
    }
}

// Threads per row in the looped kernel: 512 (more bytes per chunk for
// very long rows; two rows a SM in flight, two CTAs: their registers).
// Where those rows overflow L2 and one a SM fits, 1024 threads a row: pass
// 2 then re-reads from L2. Where neither fits, 1024 gains nothing.
template <typename T>
int looped_block_for(int64_t cols, const device_facts &f)
{
    const int64_t one_row_a_sm = (int64_t)f.sm_count * cols * sizeof(T);
    const bool overflows = 2 * one_row_a_sm > f.l2_bytes;
    const bool one_fits = one_row_a_sm <= f.l2_bytes;
    return overflows && one_fits ? 1024 : 512;
}

// The looped kernel's accesses a chunk: four 16-byte accesses for every
// type, 64 B in flight a thread while pass 1 streams from DRAM (two for
// the half types were slower; six for fp32 gained nothing). The fused add
// loads two operands an access: two accesses keep the same bytes in
// flight, and four spilled.
template <bool ADD>
__host__ __device__ constexpr int looped_accesses()
{
    return ADD ? 2 : 4;
}

// Pass 1's loads of one chunk (columns c0 on; this thread's accesses u
// with u * STEP < lim). The fused add reads x and res once and writes h
// here, read back in pass 2 (one tensor waiting in L2 for it, not two).
template <bool ADD, int STEP, int U, typename T, typename P, int VEC>
__device__ __forceinline__ void looped_load_chunk(const fwd_args<T, P> &a,
                                                  int64_t row, int64_t c0,
                                                  int64_t lim,
                                                  vec_t<T, VEC> (&xv)[U])
{
#pragma unroll
    for (int u = 0; u < U; u++) {
        if (u * STEP >= lim) {
            continue;
        }
        const int64_t c = c0 + u * STEP + threadIdx.x * VEC;
        if constexpr (ADD) {
            xv[u] = load_vec_last<T, VEC>(a.x + row * a.x_stride + c);
            add_rounded(xv[u],
                        load_vec_last<T, VEC>(a.res + row * a.res_stride + c));
            store_vec(a.h + row * a.h_stride + c, xv[u]);
        }
        else {
            xv[u] = load_vec<T, VEC>(a.x + row * a.x_stride + c);
        }
    }
}

// Pass 1 of LayerNorm: each chunk's mean and squared deviations (the
// corrected two-pass step, see the register kernel) merged into a running
// (count, mean, M2) with Chan's formula, then the threads' triples merged
// in a fixed order. Returns rstd; the mean as the pair mu + mu_lo.
template <int BLOCK, int VEC, bool ADD, typename T, typename P>
__device__ __forceinline__ acc_t<T> looped_stats_layer(const fwd_args<T, P> &a,
                                                       int64_t row,
                                                       acc_t<T> &mu,
                                                       acc_t<T> &mu_lo)
{
    using A = acc_t<T>;
    constexpr int U = looped_accesses<ADD>();
    constexpr int STEP = BLOCK * VEC; // columns between accesses
    constexpr int CHUNK = STEP * U;
    constexpr int WARPS = BLOCK / 32;
    static_assert(WARPS <= 32 && (WARPS & (WARPS - 1)) == 0,
                  "the warps' merge: a power of two, one warp's lanes");
    __shared__ A part[4][WARPS];
    __shared__ A stats[3];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    A n = 0, mean = 0, mean_lo = 0, m2 = 0;
    for (int64_t c0 = 0; c0 < a.cols; c0 += CHUNK) {
        const int64_t lim = a.cols - c0 - threadIdx.x * VEC;
        if (lim <= 0) {
            continue;
        }
        vec_t<T, VEC> xv[U];
        looped_load_chunk<ADD, STEP>(a, row, c0, lim, xv);
        A s = 0, cnt = 0;
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (u * STEP < lim) {
#pragma unroll
                for (int v = 0; v < VEC; v++) {
                    s += widen<A>(xv[u].v[v]);
                }
                cnt += VEC;
            }
        }
        const A inv_cnt = rcp_rn(cnt);
        const A cm0 = s * inv_cnt;
        A cm2 = 0, cd = 0;
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (u * STEP < lim) {
#pragma unroll
                for (int v = 0; v < VEC; v++) {
                    const A d = widen<A>(xv[u].v[v]) - cm0;
                    cm2 += d * d;
                    cd += d;
                }
            }
        }
        // the chunk's mean kept as the pair cm0 + sh
        const A sh = cd * inv_cnt;
        const bool fix = isfinite(sh);
        A cm = cm0, cm_lo = 0;
        if (fix) {
            two_sum_into(cm, cm_lo, sh);
        }
        cm2 = fix ? cm2 - cd * sh : cm2;
        chan_merge(n, mean, mean_lo, m2, cnt, cm, cm_lo,
                   cm2 < A(0) ? A(0) : cm2);
    }
    chan_merge_down<32>(n, mean, mean_lo, m2);
    if (lane == 0) {
        part[0][warp] = n;
        part[1][warp] = mean;
        part[2][warp] = mean_lo;
        part[3][warp] = m2;
    }
    __syncthreads();
    // warp 0 merges the warps' triples as a tree in a fixed order (lane w
    // holds warp w's): one thread merging them one after another was a
    // chain of 16 or 32 dependent merges, each with a division, while the
    // CTA waited at the barrier
    if (warp == 0) {
        A tn = 0, tm = 0, tmc = 0, tm2 = 0;
        if (lane < WARPS) {
            tn = part[0][lane];
            tm = part[1][lane];
            tmc = part[2][lane];
            tm2 = part[3][lane];
        }
        chan_merge_down<WARPS>(tn, tm, tmc, tm2);
        if (lane == 0) {
            stats[0] = tm;
            stats[1] = tmc;
            stats[2] = A(1) / sqrt(tm2 / (A)a.cols + a.eps);
        }
    }
    __syncthreads();
    mu = stats[0];
    mu_lo = stats[1];
    return stats[2];
}

// Pass 1 of RMSNorm: the sum of squares alone, one running sum a thread
// and one fixed-order reduction. Returns rstd.
template <int BLOCK, int VEC, bool ADD, typename T, typename P>
__device__ __forceinline__ acc_t<T> looped_stats_rms(const fwd_args<T, P> &a,
                                                     int64_t row)
{
    using A = acc_t<T>;
    constexpr int U = looped_accesses<ADD>();
    constexpr int STEP = BLOCK * VEC;
    constexpr int CHUNK = STEP * U;
    __shared__ A red[2 * 32];
    int parity = 0;
    A sum_sq[1] = {0};
    for (int64_t c0 = 0; c0 < a.cols; c0 += CHUNK) {
        const int64_t lim = a.cols - c0 - threadIdx.x * VEC;
        vec_t<T, VEC> xv[U];
        looped_load_chunk<ADD, STEP>(a, row, c0, lim, xv);
        add_item_squares<STEP>(xv, lim, sum_sq[0]);
    }
    row_sum<BLOCK, 1>(sum_sq, red, parity);
    return rms_rstd(a, sum_sq[0]);
}

// Pass 2's accesses loaded together (below): two where parameters share
// x's type and x is not fp64; fp32 parameters beside half x, or fp64,
// spilled hundreds of bytes at two under the 64-register bound (ptxas), and
// keep one.
template <typename T, typename P>
__host__ __device__ constexpr int looped_pass2_batch()
{
    return std::is_same_v<T, P> && sizeof(T) <= 4 ? 2 : 1;
}

// Pass 2 of the looped kernel: y for one row, walking it backwards (where
// the rows in flight overflow L2, pass 1's last chunks are the likeliest
// still there); y is stored evict-first, so that it does not push out the
// x (or h) lines pass 2 has still to read. A batch of accesses' x, w and b
// is loaded before any is stored: the stores are asm that clobbers memory,
// which no load may pass, so loads issued access by access after the
// previous store waited out one L2 round trip each (SASS). w and b present
// or absent at compile time (with_affine), as in the register kernel:
// tested per element, both paths' values stayed live and batching spilled.
template <bool HAS_W, bool HAS_B, bool RMS, bool ADD, int BLOCK, int VEC,
          typename T, typename P, typename A>
__device__ __forceinline__ void looped_pass2(const fwd_args<T, P> &a,
                                             int64_t row, A mu, A mu_lo,
                                             A rstd)
{
    constexpr int U = looped_accesses<ADD>();
    constexpr int STEP = BLOCK * VEC;
    constexpr int CHUNK = STEP * U;
    constexpr int BATCH = looped_pass2_batch<T, P>();
    static_assert(U % BATCH == 0, "pass 2 takes whole batches of a chunk");
    const int64_t col = threadIdx.x * VEC;
    for (int64_t c0 = (a.cols - 1) / CHUNK * CHUNK; c0 >= 0; c0 -= CHUNK) {
        const int64_t lim = a.cols - c0 - col;
#pragma unroll
        for (int u0 = 0; u0 < U; u0 += BATCH) {
            vec_t<T, VEC> xv[BATCH];
            vec_t<P, VEC> wv[BATCH], bv[BATCH];
#pragma unroll
            for (int k = 0; k < BATCH; k++) {
                if ((u0 + k) * STEP >= lim) {
                    continue;
                }
                const int64_t c = c0 + (u0 + k) * STEP + col;
                // x's (or h's) last read, evict-first: it must not displace
                // the rows still waiting for their pass 2. h is this
                // thread's own pass-1 store of the same columns.
                if constexpr (ADD) {
                    xv[k] =
                        load_vec_own_last<T, VEC>(a.h + row * a.h_stride + c);
                }
                else {
                    xv[k] = load_vec_last<T, VEC>(a.x + row * a.x_stride + c);
                }
                if constexpr (HAS_W) {
                    wv[k] = load_vec<P, VEC>(a.w + c);
                }
                if constexpr (HAS_B) {
                    bv[k] = load_vec<P, VEC>(a.b + c);
                }
            }
#pragma unroll
            for (int k = 0; k < BATCH; k++) {
                if ((u0 + k) * STEP >= lim) {
                    continue;
                }
                const int64_t c = c0 + (u0 + k) * STEP + col;
                A xf[VEC], wf[VEC], bf[VEC], out[VEC];
                widen_vec<A>(xv[k], xf);
                if constexpr (!RMS) { // x - mu exact for x near a large mu
#pragma unroll
                    for (int v = 0; v < VEC; v++) {
                        xf[v] -= mu;
                    }
                }
                if constexpr (HAS_W) {
                    widen_vec<A>(wv[k], wf);
                }
                if constexpr (HAS_B) {
                    widen_vec<A>(bv[k], bf);
                }
                affine<HAS_W, HAS_B>(xf, RMS ? A(0) : mu_lo, rstd, wf, bf,
                                     out);
                store_rounded_last<T, VEC>(a.y + row * a.y_stride + c, out);
            }
        }
    }
}

// The looped kernel's resident CTAs an SM: 1024 threads; fp64, 512 in one
// CTA (pass 2 over fp64 spilled 76-80 bytes at 64 registers, ptxas).
template <typename T>
constexpr int looped_min_ctas(int block)
{
    return sizeof(T) == 8 ? 1 : 1024 / block;
}

// layer_norm_fwd_looped: one CTA a row, pass 1 the statistics, pass 2 the
// output.
template <typename T, typename P, int VEC, int BLOCK, bool RMS, bool ADD>
__global__ void __launch_bounds__(BLOCK, looped_min_ctas<T>(BLOCK))
    layer_norm_fwd_looped(const fwd_args<T, P> a)
{
    using A = acc_t<T>;
    for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
        // x - mu is exact for x near a large mu; the low part follows
        A mu = 0, mu_lo = 0, rstd;
        if constexpr (RMS) {
            rstd = looped_stats_rms<BLOCK, VEC, ADD>(a, row);
        }
        else {
            rstd = looped_stats_layer<BLOCK, VEC, ADD>(a, row, mu, mu_lo);
        }
        with_affine<RMS>(a.w, a.b, [&](auto has_w, auto has_b) {
            constexpr bool W = decltype(has_w)::value;
            constexpr bool B = decltype(has_b)::value;
            looped_pass2<W, B, RMS, ADD, BLOCK, VEC>(a, row, mu, mu_lo, rstd);
        });
        if (threadIdx.x == 0 && a.rstd) {
            if (a.mean) {
                a.mean[row] = mu + mu_lo;
            }
            a.rstd[row] = rstd;
        }
        __syncthreads(); // pass 1's shared scratch serves the next row
    }
}

template <typename T, typename P>
fwd_args<T, P> make_args(const gemsops_layer_norm_fwd_params *p)
{
    using A = acc_t<T>;
    fwd_args<T, P> a;
    a.x = static_cast<const T *>(p->x);
    a.y = static_cast<T *>(p->y);
    a.w = static_cast<const P *>(p->weight);
    a.b = static_cast<const P *>(p->bias);
    a.mean = static_cast<A *>(p->mean);
    a.rstd = static_cast<A *>(p->rstd);
    a.res = static_cast<const T *>(p->residual);
    a.h = static_cast<T *>(p->h);
    a.res_stride = p->residual_row_stride;
    a.h_stride = p->h_row_stride;
    a.rows = p->rows;
    a.cols = p->cols;
    a.x_stride = p->x_row_stride;
    a.y_stride = p->y_row_stride;
    a.eps = (A)p->eps;
    a.inv_cols = (A)(1.0 / (double)p->cols);
    return a;
}

// A CTA per row group (registers) or per row (looped); not persistent.
inline unsigned fwd_grid(int64_t row_groups)
{
    return (unsigned)std::min<int64_t>(row_groups, (int64_t)1 << 30);
}

// Whole rows (items_end) have kernels of their own where a row is a warp
// or less at four accesses: groups of 8 to 32 threads (rows of fewer
// whole vectors take the short-rows kernel), whose few elements a row
// weigh least against each item's branches.
constexpr bool fwd_whole_rows_group(int tpr)
{
    return tpr >= 8 && tpr <= 32;
}

// Whether rows of cols elements fill every item of a group of tpr threads
// holding elems each, and the group has a whole-rows kernel.
constexpr bool fwd_takes_whole_rows(int tpr, int elems, int64_t cols)
{
    return fwd_whole_rows_group(tpr) && cols == (int64_t)tpr * elems;
}

template <int TPR, int VEC, int ACC>
constexpr bool fwd_has_whole_rows_kernel()
{
    return VEC > 1 && ACC == 4 && fwd_whole_rows_group(TPR);
}

template <typename T, typename P, bool RMS, int TPR, int VEC, bool ADD,
          int ACC>
void launch_registers(const gemsops_layer_norm_fwd_params *p, unsigned grid,
                      int block)
{
    cudaStream_t stream = (cudaStream_t)p->stream;
    if constexpr (fwd_has_whole_rows_kernel<TPR, VEC, ACC>()) {
        if (fwd_takes_whole_rows(TPR, fwd_elems<T, ACC>(), p->cols)) {
            layer_norm_fwd_registers<T, P, TPR, VEC, RMS, ADD, ACC, true>
                <<<grid, block, 0, stream>>>(make_args<T, P>(p));
            return;
        }
    }
    layer_norm_fwd_registers<T, P, TPR, VEC, RMS, ADD, ACC, false>
        <<<grid, block, 0, stream>>>(make_args<T, P>(p));
}

// The fused add (x's partner res given) is its own instantiation of each
// kernel: it loads twice the bytes a step, and sharing one body with a
// run-time branch spilled the looped kernel under its register bound.
template <typename T, typename P, bool RMS, int TPR, int VEC, int ACC = 4>
int run(const gemsops_layer_norm_fwd_params *p, gemsops_status *st)
{
    const int64_t rows_per_cta = layer_norm_block_threads(TPR) / TPR;
    const unsigned grid =
        fwd_grid((p->rows + rows_per_cta - 1) / rows_per_cta);
    const int block = layer_norm_block_threads(TPR);
    // eight accesses a thread only for the plain norms (fwd_fp32_long_tpr,
    // fwd_fp32_one_wave_tpr),
    // two only for the fused add (fwd_add_two_access_tpr)
    if (p->residual) {
        if constexpr (ACC == 8) {
            return gemsops_fail(st, GEMSOPS_ERR_RUNTIME,
                                "layer_norm_fwd: no eight-access kernel for "
                                "the fused add");
        }
        else {
            launch_registers<T, P, RMS, TPR, VEC, true, ACC>(p, grid, block);
        }
    }
    else {
        if constexpr (ACC == 2) {
            return gemsops_fail(st, GEMSOPS_ERR_RUNTIME,
                                "layer_norm_fwd: no two-access kernel "
                                "without the fused add");
        }
        else {
            launch_registers<T, P, RMS, TPR, VEC, false, ACC>(p, grid, block);
        }
    }
    GEMSOPS_CUDA_CHECK_LAUNCH(st, "layer_norm_fwd_registers");
    return GEMSOPS_OK;
}

template <typename T, typename P, bool RMS, int G, int VEC, bool ADD>
int run_short(const gemsops_layer_norm_fwd_params *p, gemsops_status *st)
{
    constexpr int64_t cta_rows = 4 * (fwd_elems<T>() / VEC) * (32 / G);
    const unsigned grid = fwd_grid((p->rows + cta_rows - 1) / cta_rows);
    layer_norm_fwd_short_rows<T, P, G, VEC, RMS, ADD>
        <<<grid, 128, 0, (cudaStream_t)p->stream>>>(make_args<T, P>(p));
    GEMSOPS_CUDA_CHECK_LAUNCH(st, "layer_norm_fwd_short_rows");
    return GEMSOPS_OK;
}

// Rows of 1, 2, 4, 8 or 16 whole vectors go to the short-rows kernel
// (returns false for the others): there a row's lanes are neighbours and
// one warp access covers whole lines of several rows, where the register
// kernel gives a row of 8 vectors two threads of four and a warp access
// touches a sector of each of 16 rows (16 vectors: four threads, two
// sectors of each of 8 rows). Where the register kernel gives a row eight
// or more threads, its instructions already cover whole lines.
// (LayerNorm's rows of 8 ran slower here than in the register kernel on
// an H100, faster on an H200; docs/performance.md.)
template <typename T, typename P, bool RMS, int VEC, bool ADD>
bool run_short_rows(const gemsops_layer_norm_fwd_params *p, int *rc,
                    gemsops_status *st)
{
    switch (p->cols / VEC) {
    case 1: *rc = run_short<T, P, RMS, 1, VEC, ADD>(p, st); return true;
    case 2: *rc = run_short<T, P, RMS, 2, VEC, ADD>(p, st); return true;
    case 4: *rc = run_short<T, P, RMS, 4, VEC, ADD>(p, st); return true;
    case 8: *rc = run_short<T, P, RMS, 8, VEC, ADD>(p, st); return true;
    case 16: *rc = run_short<T, P, RMS, 16, VEC, ADD>(p, st); return true;
    default: return false;
    }
}

template <typename T, typename P, bool RMS, int VEC, int BLOCK>
void launch_looped(const gemsops_layer_norm_fwd_params *p)
{
    cudaStream_t stream = (cudaStream_t)p->stream;
    if (p->residual) {
        layer_norm_fwd_looped<T, P, VEC, BLOCK, RMS, true>
            <<<fwd_grid(p->rows), BLOCK, 0, stream>>>(make_args<T, P>(p));
    }
    else {
        layer_norm_fwd_looped<T, P, VEC, BLOCK, RMS, false>
            <<<fwd_grid(p->rows), BLOCK, 0, stream>>>(make_args<T, P>(p));
    }
}

template <typename T, typename P, bool RMS, int VEC>
int run_looped(const gemsops_layer_norm_fwd_params *p, gemsops_status *st)
{
    device_facts f;
    if (get_device_facts(p->device_id, &f, st) != GEMSOPS_OK) {
        return st->code;
    }
    if constexpr (sizeof(T) < 8) { // fp64: 512 (looped_min_ctas)
        if (looped_block_for<T>(p->cols, f) == 1024) {
            launch_looped<T, P, RMS, VEC, 1024>(p);
            GEMSOPS_CUDA_CHECK_LAUNCH(st, "layer_norm_fwd_looped");
            return GEMSOPS_OK;
        }
    }
    launch_looped<T, P, RMS, VEC, 512>(p);
    GEMSOPS_CUDA_CHECK_LAUNCH(st, "layer_norm_fwd_looped");
    return GEMSOPS_OK;
}

template <typename T, typename P>
bool vector_ok(const gemsops_layer_norm_fwd_params *p)
{
    return layer_norm_vectors_fit<T, P>(p->cols,
                                        {p->x_row_stride, p->y_row_stride,
                                         p->residual_row_stride,
                                         p->h_row_stride},
                                        {p->x, p->y, p->residual, p->h},
                                        {p->weight, p->bias});
}

// Launches the kernel of ACC accesses a thread whose group is tpr, one of
// the list CHOICES; a group wider than fwd_max_tpr allows has no kernel
// (fp64 stops at 512). `kind` names the family in the error for a group
// without one.
template <typename T, typename P, bool RMS, int VEC, int ACC,
          const auto &CHOICES, size_t... I>
int run_group(const gemsops_layer_norm_fwd_params *p, int tpr,
              const char *kind, gemsops_status *st, std::index_sequence<I...>)
{
    int rc = GEMSOPS_OK;
    const auto launch_if = [&](auto group) {
        constexpr int TPR = decltype(group)::value;
        if constexpr (TPR <= fwd_max_tpr<T>()) {
            if (tpr == TPR) {
                rc = run<T, P, RMS, TPR, VEC, ACC>(p, st);
                return true;
            }
        }
        return false;
    };
    if ((launch_if(std::integral_constant<int, CHOICES[I]>{}) || ...)) {
        return rc;
    }
    return gemsops_fail(st, GEMSOPS_ERR_RUNTIME,
                        "layer_norm_fwd: no %skernel for %d threads/row", kind,
                        tpr);
}

// BUILT: whether the family has kernels for (T, P) at all (the one-, two-
// and eight-access families are built for a few pairs only); a family
// asked of a pair it lacks is an error, not a launch.
template <typename T, typename P, bool RMS, int VEC, int ACC,
          const auto &CHOICES, bool BUILT = true>
int dispatch_group(const gemsops_layer_norm_fwd_params *p, int tpr,
                   const char *kind, gemsops_status *st)
{
    if constexpr (BUILT) {
        constexpr size_t n = sizeof(CHOICES) / sizeof(CHOICES[0]);
        return run_group<T, P, RMS, VEC, ACC,
                         CHOICES>(p, tpr, kind, st,
                                  std::make_index_sequence<n>{});
    }
    return gemsops_fail(st, GEMSOPS_ERR_RUNTIME,
                        "layer_norm_fwd: no %skernel for %s", kind,
                        gemsops_dtype_name(p->dtype));
}

// fp32 rows past 320 threads of 16 elements (N > 5120) take 32 elements a
// thread, as the half types' rows do: at 16 a thread their groups of 384
// to 1024 threads leave one or two CTAs an SM, each idle through its own
// barriers; eight accesses a thread take half the threads, twice the CTAs
// an SM. The half types at 64 elements a thread and the fused add (x and
// res in flight at once) ran slower (docs/performance.md). Returns the
// group, 0 for the rows that keep four accesses.
constexpr int kFwdEightAccessTprChoices[] = {32, 192, 256, 320, 384, 512};

template <typename T>
int fwd_fp32_long_tpr(int64_t cols, bool add)
{
    if (!std::is_same_v<T, float> || add ||
        cols <= 320 * (int64_t)fwd_elems<T>()) {
        return 0;
    }
    return layer_norm_choose_shape(cols, fwd_elems<T, 8>(), 512,
                                   kFwdEightAccessTprChoices)
        .tpr;
}

// One 16-byte access a thread, for rows too few to give every SM 512
// threads at four accesses (rows x TPR threads in all): four times the
// threads, each with one load to wait for and a quarter of the adds before
// its row's reduction. Only where parameters share x's type and x is not
// fp64 (the other pairs are no transformer's shape; fewer kernels). Returns
// the group, 0 for the rows that keep four accesses, -1 on an error.
constexpr int kFwdOneAccessTprChoices[] = {32, 64, 96, 128, 160, 192, 256};

template <typename T, typename P>
int fwd_one_access_tpr(const gemsops_layer_norm_fwd_params *p, int tpr4,
                       gemsops_status *st)
{
    constexpr int V = 16 / sizeof(T);
    if (!std::is_same_v<T, P> || sizeof(T) == 8 || p->cols > 256 * V) {
        return 0;
    }
    device_facts f;
    if (get_device_facts(p->device_id, &f, st) != GEMSOPS_OK) {
        return -1;
    }
    // up to 512 rather than 256: fp32 1024 x 1000 (496 threads an SM at
    // four) gained in all four norms. Whole rows (items_end) stop at 256:
    // with no per-item branches their four accesses overtook one from 256
    // threads an SM (4096 x 512 half, 8192 x 256 half, 4096 x 256 fp32)
    const bool whole = fwd_takes_whole_rows(tpr4, fwd_elems<T>(), p->cols);
    if (p->rows * tpr4 >= (int64_t)f.sm_count * (whole ? 256 : 512)) {
        return 0;
    }
    return layer_norm_choose_shape(p->cols, V, 256, kFwdOneAccessTprChoices)
        .tpr;
}

// fp32 rows of 513 to 1024 elements, as many as a warp a row at eight
// accesses (32 elements a thread, 1024 resident threads an SM) holds in
// one wave, at least three quarters full: every row's loads in flight at
// once and no barrier, where four accesses give a row two warps, a CTA
// reduction and nearly two waves (4096 x 1024: the whole 16 MB of x in
// flight). More rows, or a wave half empty (2048 x 1024), ran slower than
// four accesses (docs/performance.md). Returns 32, 0 for the rows that
// keep four accesses, -1 on an error.
template <typename T, typename P>
int fwd_fp32_one_wave_tpr(const gemsops_layer_norm_fwd_params *p,
                          gemsops_status *st)
{
    constexpr int E = fwd_elems<T, 8>();
    if (!std::is_same_v<T, float> || !std::is_same_v<T, P> || p->residual ||
        p->cols <= E * 16 || p->cols > E * 32) {
        return 0;
    }
    device_facts f;
    if (get_device_facts(p->device_id, &f, st) != GEMSOPS_OK) {
        return -1;
    }
    const int64_t wave = (int64_t)f.sm_count * 1024, threads = p->rows * 32;
    return threads <= wave && 4 * threads >= 3 * wave ? 32 : 0;
}

// The fused add's half rows past 2048 elements: two accesses a thread
// rather than four, twice the threads a row, each with x and res of both
// its items in flight at once (four accesses' pass over x and res waits
// out two round trips, load_added_items). Only where the parameters share
// x's type. Rows of 640 to 768 groups keep four accesses: 768 threads fit
// one CTA a SM (two would spill, fwd_two_access_min_ctas), and 1024 leave a
// quarter of their accesses empty; both ran slower than four accesses.
// Returns the group, 0 for the rows that keep four accesses.
constexpr int kFwdTwoAccessTprChoices[] = {256, 320, 384, 512, 640, 1024};

template <typename T, typename P>
int fwd_add_two_access_tpr(const gemsops_layer_norm_fwd_params *p)
{
    constexpr int E = fwd_elems<T, 2>();
    if (!std::is_same_v<T, P> || sizeof(T) != 2 || !p->residual ||
        p->cols <= 128 * E || p->cols > 1024 * E ||
        (p->cols > 640 * E && p->cols <= 768 * E)) {
        return 0;
    }
    return layer_norm_choose_shape(p->cols, E, 1024, kFwdTwoAccessTprChoices)
        .tpr;
}

template <typename T, typename P, bool RMS>
int launch(const gemsops_layer_norm_fwd_params *p, gemsops_status *st)
{
    device_guard guard;
    GEMSOPS_CUDA_CHECK(st, guard.enter(p->device_id));
    constexpr int V = 16 / sizeof(T);
    const bool vec = vector_ok<T, P>(p);
    if (p->cols > (int64_t)fwd_max_tpr<T>() * fwd_elems<T>()) {
        return vec ? run_looped<T, P, RMS, V>(p, st)
                   : run_looped<T, P, RMS, 1>(p, st);
    }
    int rc;
    if (vec &&
        (p->residual ? run_short_rows<T, P, RMS, V, true>(p, &rc, st)
                     : run_short_rows<T, P, RMS, V, false>(p, &rc, st))) {
        return rc;
    }
    const int long_tpr =
        vec ? fwd_fp32_long_tpr<T>(p->cols, p->residual != nullptr) : 0;
    if (long_tpr > 0) {
        return dispatch_group<T, P, RMS, V, 8, kFwdEightAccessTprChoices,
                              std::is_same_v<T, float>>(p, long_tpr,
                                                        "eight-access ", st);
    }
    const int two_tpr = vec ? fwd_add_two_access_tpr<T, P>(p) : 0;
    if (two_tpr > 0) {
        return dispatch_group<T, P, RMS, V, 2, kFwdTwoAccessTprChoices,
                              (std::is_same_v<T, P> &&
                               sizeof(T) == 2)>(p, two_tpr, "two-access ", st);
    }
    const int tpr =
        layer_norm_choose_shape(p->cols, fwd_elems<T>(), fwd_max_tpr<T>(),
                                kLayerNormFwdTprChoices)
            .tpr;
    const int one_tpr = vec ? fwd_one_access_tpr<T, P>(p, tpr, st) : 0;
    if (one_tpr < 0) {
        return st->code;
    }
    if (one_tpr > 0) {
        return dispatch_group<T, P, RMS, V, 1, kFwdOneAccessTprChoices,
                              (std::is_same_v<T, P> &&
                               sizeof(T) < 8)>(p, one_tpr, "one-access ", st);
    }
    const int wave_tpr = vec ? fwd_fp32_one_wave_tpr<T, P>(p, st) : 0;
    if (wave_tpr < 0) {
        return st->code;
    }
    if (wave_tpr > 0) {
        return dispatch_group<T, P, RMS, V, 8, kFwdEightAccessTprChoices,
                              std::is_same_v<T, float>>(p, wave_tpr,
                                                        "eight-access ", st);
    }
    return vec ? dispatch_group<T, P, RMS, V, 4, kLayerNormFwdTprChoices>(p,
                                                                          tpr,
                                                                          "",
                                                                          st)
               : dispatch_group<T, P, RMS, 1, 4, kLayerNormFwdTprChoices>(p,
                                                                          tpr,
                                                                          "",
                                                                          st);
}

// The one dtype switch: (input dtype, parameter dtype) -> launcher.
template <bool RMS>
int dispatch_dtype(const gemsops_layer_norm_fwd_params *p, gemsops_status *st)
{
    const bool same = p->param_dtype == p->dtype;
    switch (p->dtype) {
    case GEMSOPS_FLOAT32: return launch<float, float, RMS>(p, st);
    case GEMSOPS_FLOAT64: return launch<double, double, RMS>(p, st);
    case GEMSOPS_FLOAT16:
        return same ? launch<__half, __half, RMS>(p, st)
                    : launch<__half, float, RMS>(p, st);
    case GEMSOPS_BFLOAT16:
        return same ? launch<__nv_bfloat16, __nv_bfloat16, RMS>(p, st)
                    : launch<__nv_bfloat16, float, RMS>(p, st);
    default:
        return gemsops_fail(st, GEMSOPS_ERR_TYPE,
                            "layer_norm: unsupported dtype %s on CUDA",
                            gemsops_dtype_name(p->dtype));
    }
}

// LayerNorm or RMSNorm, each compiled apart; RMSNorm's kernels have no
// bias to add.
int dispatch(const gemsops_layer_norm_fwd_params *p, gemsops_status *st)
{
    if (!p->rms) {
        return dispatch_dtype<false>(p, st);
    }
    if (p->bias) {
        return gemsops_fail(st, GEMSOPS_ERR_VALUE,
                            "rms_norm: a bias was given; RMSNorm has none");
    }
    return dispatch_dtype<true>(p, st);
}

} // namespace
} // namespace gemsops

extern "C" int gemsops_layer_norm_fwd_cuda(
    const struct gemsops_layer_norm_fwd_params *p, gemsops_status *st)
{
    if (p->cols == 0) {
        // rows of no elements: mean 0 and rstd NaN (all-ones bytes), as
        // torch reports them; there is no output element to write
        if (p->rows == 0 || p->rstd == nullptr) {
            return GEMSOPS_OK;
        }
        gemsops::device_guard guard;
        GEMSOPS_CUDA_CHECK(st, guard.enter(p->device_id));
        const size_t bytes = p->rows * (p->dtype == GEMSOPS_FLOAT64 ? 8 : 4);
        cudaStream_t stream = (cudaStream_t)p->stream;
        if (p->mean != nullptr) {
            GEMSOPS_CUDA_CHECK(st, cudaMemsetAsync(p->mean, 0, bytes, stream));
        }
        GEMSOPS_CUDA_CHECK(st, cudaMemsetAsync(p->rstd, 0xff, bytes, stream));
        return GEMSOPS_OK;
    }
    return gemsops::dispatch(p, st);
}

// No forward variant needs a workspace today (long rows stream twice
// instead of exchanging partials between CTAs); the query stays so the
// Python layer need not know which kernel runs.
extern "C" int gemsops_layer_norm_fwd_workspace_cuda(
    const struct gemsops_layer_norm_fwd_params *p, int64_t *bytes,
    gemsops_status *st)
{
    (void)p;
    (void)st;
    *bytes = 0;
    return GEMSOPS_OK;
}
