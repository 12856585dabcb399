// LayerNorm forward, the pieces its three kernels share (layer_norm_fwd.cu
// says which kernel takes which rows): elements per thread and the
// register budget, the kernels' arguments and grid, the corrected two-pass
// statistics, RMSNorm's statistic, and the affine output with w and b
// present or absent at compile time. Each kernel's own launch bounds sit
// beside it.
#pragma once

#include <algorithm>
#include <type_traits>

#include "convert.cuh"
#include "gemsops/layer_norm.h"

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

// A CTA per row group (register and short-rows kernels) or per row
// (looped); not persistent: the SM overlaps one CTA's reductions with
// another's loads.
inline unsigned fwd_grid(int64_t row_groups)
{
    return (unsigned)std::min<int64_t>(row_groups, (int64_t)1 << 30);
}

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

} // namespace

// The looped kernel's launch for rows past the register kernel's (vec:
// 16-byte accesses fit), defined and instantiated, for each (input,
// parameter) dtype pair of layer_norm_fwd.cu's dtype switch, in
// layer_norm_fwd_looped.cu.
template <typename T, typename P, bool RMS>
int layer_norm_fwd_looped_launch(const gemsops_layer_norm_fwd_params *p,
                                 bool vec, gemsops_status *st);

} // namespace gemsops
