/* LayerNorm over the last `cols` elements of each of `rows` rows.
 *
 *   mean_r = (1/N) sum_c x[r,c]          rstd_r = 1/sqrt(var_r + eps)
 *   var_r  = (1/N) sum_c (x[r,c] - mean_r)^2   (two-pass or Welford, never
 *            E[x^2] - mean^2, which cancels catastrophically)
 *   y[r,c] = (x[r,c] - mean_r) * rstd_r * w[c] + b[c]
 *
 * Backward, with xhat = (x - mean) * rstd and g = w * dy:
 *   dx[r,c] = rstd_r * (g[r,c] - (xhat[r,c] * c1_r + c2_r) / N)
 *   c1_r = sum_c g * xhat,   c2_r = sum_c g
 *   dW[c] = sum_r dy * xhat, dB[c] = sum_r dy
 *
 * RMSNorm (rms = 1) is the same with no centring: mean_r = 0 (written as
 * such), var_r = (1/N) sum_c x[r,c]^2, no bias, and c2 drops out of dx:
 *   dx[r,c] = rstd_r * (g[r,c] - xhat[r,c] * c1_r / N)
 *
 * With a residual, the forward first forms h = x + residual (rounded to
 * the dtype, written to `h`) and normalizes h; the backward then reads h
 * as its input and adds the gradient dh reaching h from elsewhere into
 * dx (which is also the residual's gradient).
 *
 * Tensors are validated at the Python boundary (csrc/py_layer_norm.c);
 * backends may assume every pointer, size and stride here is consistent,
 * and that no output overlaps an input (the CUDA kernels read x, residual,
 * weight and bias through the read-only cache). Rows are `row_stride`
 * elements apart; columns are contiguous. */
#pragma once

#include "gemsops/status.h"
#include "gemsops/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The statistics' dtype (mean, rstd): fp64 for fp64 input, else fp32 (the
 * one rule; gemsops/ops/layer_norm.py's _stats_dtype mirrors it and
 * tests/test_layer_norm.py checks that they agree). */
static inline gemsops_dtype
gemsops_layer_norm_stats_dtype(gemsops_dtype d)
{
    return d == GEMSOPS_FLOAT64 ? GEMSOPS_FLOAT64 : GEMSOPS_FLOAT32;
}

struct gemsops_layer_norm_fwd_params {
    const void *x; /* [rows, cols] input, dtype `dtype`             */
    void *y; /* [rows, cols] output, dtype `dtype`            */
    const void *weight; /* [cols] contiguous, `param_dtype`, or NULL     */
    const void *bias; /* [cols] contiguous, `param_dtype`, or NULL     */
    void *mean; /* [rows] fp64 for fp64 x, else fp32; or NULL    */
    void *rstd; /* [rows] 1/sqrt(var + eps); NULL with mean      */
    int64_t rows; /* M: product of the leading dimensions          */
    int64_t cols; /* N: product of the normalized dimensions       */
    int64_t x_row_stride; /* elements between rows of x                    */
    int64_t y_row_stride; /* elements between rows of y                    */
    const void *residual; /* [rows, cols] `dtype`, or NULL: no fused add  */
    void *h; /* [rows, cols] x + residual; with residual only    */
    int64_t residual_row_stride, h_row_stride;
    gemsops_dtype dtype; /* x and y                                   */
    gemsops_dtype param_dtype; /* weight and bias: dtype, or fp32 if half  */
    double eps;
    int rms; /* 1: RMSNorm's statistic (see above), bias NULL    */
    int device_id; /* CUDA ordinal of every tensor                  */
    void *stream; /* cudaStream_t to launch on                     */
};

struct gemsops_layer_norm_bwd_params {
    const void *dy; /* [rows, cols] upstream gradient, dtype `dtype` */
    const void *x; /* [rows, cols] forward input                    */
    const void *weight; /* [cols] or NULL (then w = 1)                   */
    const void *mean; /* [rows] from the forward                       */
    const void *rstd; /* [rows] from the forward                       */
    void *dx; /* [rows, cols] or NULL: input needs no grad     */
    void *dweight; /* [cols] param_dtype, or NULL: no grad wanted   */
    void *dbias; /* [cols] param_dtype, or NULL                   */
    void *workspace; /* >= the planned size (see kept_zero)           */
    int64_t workspace_bytes;
    int kept_zero; /* the caller keeps this workspace across launches
                             on one stream: the launch leaves its dW/dB
                             accumulators zero                             */
    int known_zero; /* the accumulators are zero on entry (the
                             boundary vouches: csrc/kept.c), so nothing is
                             memset first. 0: the launch zeroes them       */
    int64_t rows, cols;
    int64_t dy_row_stride, x_row_stride, dx_row_stride;
    const void *dh; /* [rows, cols] added into dx, or NULL           */
    int64_t dh_row_stride;
    gemsops_dtype dtype;
    gemsops_dtype param_dtype;
    int deterministic; /* dW/dB summed in a fixed order, no atomics     */
    int rms; /* 1: RMSNorm's backward (mean all 0, no c2 term) */
    int device_id;
    void *stream;
};

/* Bytes of zeroed workspace the backward's launch will need (0: pass
 * NULL). The CUDA plan depends on the device's SM count and occupancy, so
 * ask, then allocate, then launch with the same params. The forward needs
 * none: its long rows stream twice instead of exchanging partials. */
int gemsops_layer_norm_bwd_workspace_cuda(
    const struct gemsops_layer_norm_bwd_params *p, int64_t *bytes,
    gemsops_status *st);

int gemsops_layer_norm_fwd_cuda(const struct gemsops_layer_norm_fwd_params *p,
                                gemsops_status *st);
/* need NULL: a workspace smaller than the plan is an error. Else, when it
 * is smaller (or absent), nothing launches and *need gets the bytes the
 * launch needs; *need = 0 when it launched. */
int gemsops_layer_norm_bwd_cuda(const struct gemsops_layer_norm_bwd_params *p,
                                int64_t *need, gemsops_status *st);
int gemsops_layer_norm_fwd_cpu(const struct gemsops_layer_norm_fwd_params *p,
                               gemsops_status *st);
int gemsops_layer_norm_bwd_cpu(const struct gemsops_layer_norm_bwd_params *p,
                               gemsops_status *st);

#ifdef __cplusplus
}
#endif
