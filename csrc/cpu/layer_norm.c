/* LayerNorm forward and backward on the CPU: the math of
 * include/gemsops/layer_norm.h, rows split over OpenMP threads.
 *
 * Every dtype is computed in double (at least as accurate as the GPU's
 * fp32 math) and rounded once on store. Statistics are two-pass. dW/dB:
 * each thread sums its rows (static schedule) into a private buffer; the
 * buffers are added in thread order, so results repeat bit for bit.
 *
 * Speed: a row is widened once into a double buffer (one dtype switch per
 * row), and every loop over it is a SIMD loop; the row sums are `omp simd`
 * reductions, whose lanes add in a fixed order for a given build. As
 * serial sums they were bound by the add latency and several times slower
 * than torch (docs/performance.md, CPU backend). */
#include <math.h>
#include <stdlib.h>

#include "convert.h"
#include "gemsops/layer_norm.h"
#include "parallel.h"
#include "simd.h"

/* weight/bias as doubles; NULL param gives `fill` everywhere */
static double *
load_param(const void *param, gemsops_dtype dt, int64_t n, double fill)
{
    double *v = malloc((n ? n : 1) * sizeof *v);
    if (v == NULL) {
        return NULL;
    }
    for (int64_t c = 0; c < n; c++) {
        v[c] = param ? gemsops_load_f64(param, dt, c) : fill;
    }
    return v;
}

/* A double rounded once to a storage type (half types through float, as
 * the CUDA kernels round). */
static inline float
narrow_f32(double v)
{
    return (float)v;
}
static inline double
narrow_f64(double v)
{
    return v;
}
static inline uint16_t
narrow_bf16(double v)
{
    return gemsops_float_to_bf16((float)v);
}
static inline uint16_t
narrow_f16(double v)
{
    return gemsops_float_to_half((float)v);
}

/* for (c < n) ((CT *)dst)[c] = NARROW(EXPR): the row loops that end in a
 * store, one per float type, with `c` bound in EXPR. */
#define GEMSOPS_STORE_ROW(dst, dt, EXPR)                                      \
    switch (dt) {                                                             \
    case GEMSOPS_FLOAT32: GEMSOPS_STORE_AS(dst, float, narrow_f32, EXPR)      \
    case GEMSOPS_FLOAT64: GEMSOPS_STORE_AS(dst, double, narrow_f64, EXPR)     \
    case GEMSOPS_BFLOAT16: GEMSOPS_STORE_AS(dst, uint16_t, narrow_bf16, EXPR) \
    case GEMSOPS_FLOAT16: GEMSOPS_STORE_AS(dst, uint16_t, narrow_f16, EXPR)   \
    default: break;                                                           \
    }
#define GEMSOPS_STORE_AS(dst, CT, NARROW, EXPR)             \
    {                                                       \
        CT *d_ = (dst);                                     \
        _Pragma("omp simd") for (int64_t c = 0; c < n; c++) \
        {                                                   \
            d_[c] = NARROW(EXPR);                           \
        }                                                   \
    }                                                       \
    break;

/* x's row widened into buf, returning its sum: one fused pass. */
static inline double
load_sum(const void *x, gemsops_dtype dt, int64_t n, double *buf)
{
    double sum = 0;
#define GEMSOPS_LOAD_SUM(CT, WIDEN)                                       \
    {                                                                     \
        const CT *s = x;                                                  \
        _Pragma("omp simd reduction(+ : sum)") for (int64_t c = 0; c < n; \
                                                    c++)                  \
        {                                                                 \
            buf[c] = WIDEN(s[c]);                                         \
            sum += buf[c];                                                \
        }                                                                 \
    }                                                                     \
    break;
    switch (dt) {
    case GEMSOPS_FLOAT32: GEMSOPS_LOAD_SUM(float, (double))
    case GEMSOPS_FLOAT64: GEMSOPS_LOAD_SUM(double, (double))
    case GEMSOPS_BFLOAT16: GEMSOPS_LOAD_SUM(uint16_t, gemsops_bf16_to_float)
    case GEMSOPS_FLOAT16: GEMSOPS_LOAD_SUM(uint16_t, gemsops_half_to_float)
    default: break; /* float types only */
    }
#undef GEMSOPS_LOAD_SUM
    return sum;
}

/* h = x + residual rounded to the dtype, as torch's add: into h and, as
 * doubles, into buf; returns its sum. The double sum of two values of a
 * float type is exact, so one rounding (through float for the half types)
 * gives torch's value. */
static double
add_residual(const void *x, const void *res, void *h, gemsops_dtype dt,
             int64_t n, double *buf, double *tmp)
{
    load_sum(x, dt, n, buf);
    load_sum(res, dt, n, tmp);
    for (int64_t c = 0; c < n; c++) {
        tmp[c] += buf[c];
    }
    gemsops_store_row(tmp, dt, n, h);
    return load_sum(h, dt, n, buf); /* the rounded values back */
}

/* One row of x (or of x + residual, into h) into y; returns its
 * statistics in *mean_out, *rstd_out. Three passes over a double buffer
 * of the row: widen and sum, the squared deviations (from 0 for RMSNorm),
 * normalize and round into y. buf holds 2n doubles. */
GEMSOPS_SIMD_CLONES static void
fwd_row(const void *x, const void *res, void *h, void *y, gemsops_dtype dt,
        int64_t n, double *buf, const double *w, const double *b, double eps,
        int rms, double *mean_out, double *rstd_out)
{
    const double sum = res ? add_residual(x, res, h, dt, n, buf, buf + n)
                           : load_sum(x, dt, n, buf);
    const double mean0 = rms ? 0.0 : sum / (double)n;
    double m2 = 0, dsum = 0;
#pragma omp simd reduction(+ : m2, dsum)
    for (int64_t c = 0; c < n; c++) {
        const double d = buf[c] - mean0;
        m2 += d * d;
        dsum += d;
    }
    /* the corrected two-pass step, as on CUDA: mean0's rounding comes back
     * as the deviations' mean. Doubles are no wider than float64 input,
     * whose constant row would otherwise normalize to ulps times rstd, not
     * 0 (a row holding inf or NaN keeps the plain values) */
    const double shift = dsum / (double)n;
    const int fix = !rms && isfinite(shift);
    const double mean = fix ? mean0 + shift : mean0;
    m2 = fix ? m2 - dsum * shift : m2;
    m2 = m2 < 0 ? 0 : m2; /* NaN stays NaN */
    const double rstd = 1.0 / sqrt(m2 / (double)n + eps);
    GEMSOPS_STORE_ROW(y, dt, (buf[c] - mean) * rstd * w[c] + b[c])
    *mean_out = mean;
    *rstd_out = rstd;
}

int
gemsops_layer_norm_fwd_cpu(const struct gemsops_layer_norm_fwd_params *p,
                           gemsops_status *st)
{
    const int64_t n = p->cols;
    const size_t es = gemsops_dtype_size(p->dtype);
    const gemsops_dtype sd = gemsops_layer_norm_stats_dtype(p->dtype);
    if (n == 0) { /* rows of no elements: mean 0, rstd NaN, as torch */
        for (int64_t r = 0; p->rstd != NULL && r < p->rows; r++) {
            if (p->mean != NULL) {
                gemsops_store_f64(p->mean, sd, r, 0.0);
            }
            gemsops_store_f64(p->rstd, sd, r, NAN);
        }
        return GEMSOPS_OK;
    }
    /* eps in the statistics' type, as torch's kernels and ours on the GPU
     * take it: an eps below fp32's range is 0 there for a constant row */
    const double eps = sd == GEMSOPS_FLOAT64 ? p->eps : (double)(float)p->eps;
    double *w = load_param(p->weight, p->param_dtype, n, 1.0);
    double *b = load_param(p->bias, p->param_dtype, n, 0.0);
    int failed = w == NULL || b == NULL;

#pragma omp parallel reduction(| : failed)
    {
        double *buf = failed ? NULL : malloc(2 * n * sizeof *buf);
        failed |= buf == NULL;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < p->rows; r++) {
            if (buf == NULL) {
                continue;
            }
            double mean, rstd;
            const char *res = p->residual ? (const char *)p->residual +
                                                r * p->residual_row_stride * es
                                          : NULL;
            char *h =
                p->residual ? (char *)p->h + r * p->h_row_stride * es : NULL;
            fwd_row((const char *)p->x + r * p->x_row_stride * es, res, h,
                    (char *)p->y + r * p->y_row_stride * es, p->dtype, n, buf,
                    w, b, eps, p->rms, &mean, &rstd);
            if (p->mean != NULL) {
                gemsops_store_f64(p->mean, sd, r, mean);
            }
            if (p->rstd != NULL) {
                gemsops_store_f64(p->rstd, sd, r, rstd);
            }
        }
        free(buf);
    }
    free(w);
    free(b);
    if (failed) {
        return gemsops_fail(st, GEMSOPS_ERR_RUNTIME,
                            "layer_norm: out of host memory");
    }
    return GEMSOPS_OK;
}

/* Sums the threads' partial dW (which=0) or dB (which=1) in thread order. */
static void
store_param_grad(const double *part, int nthreads, int64_t n, int which,
                 gemsops_dtype dt, void *dst, double *scratch)
{
    for (int64_t c = 0; c < n; c++) {
        double s = 0;
        for (int t = 0; t < nthreads; t++) {
            s += part[(size_t)t * 2 * n + (size_t)which * n + c];
        }
        scratch[c] = s;
    }
    gemsops_store_row(scratch, dt, n, dst);
}

/* One row of the backward in two passes: (1) widen x and dy, xhat into
 * xh, dy into dyb, the row sums c1 = sum g * xhat, c2 = sum g (g = w * dy)
 * and the row's dW/dB terms into mine[0..n), mine[n..2n) (when mine); (2)
 * dx = rstd * (g - (xhat * c1 + c2) / N), rounded into dx (when dx); for
 * RMSNorm (mean 0) without the c2 term; plus dh (widened into dhb, n
 * zeros when there is none). */
GEMSOPS_SIMD_CLONES static void
bwd_row(const void *x, const void *dy, const void *dh, void *dx,
        gemsops_dtype dt, int64_t n, double *xh, double *dyb, double *dhb,
        const double *w, double mean, double rstd, int rms, double *mine)
{
    double c1 = 0, c2 = 0;
#define GEMSOPS_BWD_PASS1(DT)                                                 \
    _Pragma("omp simd reduction(+ : c1, c2)") for (int64_t c = 0; c < n; c++) \
    {                                                                         \
        const double xv = (gemsops_load_f64(x, DT, c) - mean) * rstd;         \
        const double d = gemsops_load_f64(dy, DT, c);                         \
        xh[c] = xv;                                                           \
        dyb[c] = d;                                                           \
        c1 += d * w[c] * xv;                                                  \
        c2 += d * w[c];                                                       \
    }
    switch (dt) {
    case GEMSOPS_FLOAT32: GEMSOPS_BWD_PASS1(GEMSOPS_FLOAT32) break;
    case GEMSOPS_BFLOAT16: GEMSOPS_BWD_PASS1(GEMSOPS_BFLOAT16) break;
    case GEMSOPS_FLOAT16: GEMSOPS_BWD_PASS1(GEMSOPS_FLOAT16) break;
    case GEMSOPS_FLOAT64: GEMSOPS_BWD_PASS1(GEMSOPS_FLOAT64) break;
    default: break; /* float types only */
    }
#undef GEMSOPS_BWD_PASS1
    if (mine) {
#pragma omp simd
        for (int64_t c = 0; c < n; c++) {
            mine[c] += dyb[c] * xh[c];
            mine[n + c] += dyb[c];
        }
    }
    if (dx == NULL) {
        return;
    }
    c1 /= (double)n;
    c2 = rms ? 0.0 : c2 / (double)n;
    if (dh != NULL) {
        load_sum(dh, dt, n, dhb);
    }
    GEMSOPS_STORE_ROW(dx, dt,
                      rstd * (dyb[c] * w[c] - (xh[c] * c1 + c2)) + dhb[c])
}

int
gemsops_layer_norm_bwd_cpu(const struct gemsops_layer_norm_bwd_params *p,
                           gemsops_status *st)
{
    const int64_t n = p->cols;
    const size_t es = gemsops_dtype_size(p->dtype);
    const gemsops_dtype sd = gemsops_layer_norm_stats_dtype(p->dtype);
    const int want_dwb = p->dweight != NULL || p->dbias != NULL;
    const int nthreads = gemsops_thread_count();
    double *w = load_param(p->weight, p->param_dtype, n, 1.0);
    double *part =
        want_dwb ? calloc((size_t)nthreads * 2 * (n ? n : 1), sizeof *part)
                 : NULL;
    int failed = w == NULL || (want_dwb && part == NULL);

#pragma omp parallel num_threads(nthreads) reduction(| : failed)
    {
        double *xh = failed ? NULL : calloc(3 * (n ? n : 1), sizeof *xh);
        failed |= xh == NULL;
        double *dy = xh ? xh + n : NULL;
        double *dhb = xh ? xh + 2 * n : NULL; /* zeros without dh */
        double *mine =
            part ? part + (size_t)gemsops_thread_index() * 2 * n : NULL;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < p->rows; r++) {
            if (xh == NULL) {
                continue;
            }
            const double mean =
                p->rms ? 0.0 : gemsops_load_f64(p->mean, sd, r);
            const double rstd = gemsops_load_f64(p->rstd, sd, r);
            bwd_row((const char *)p->x + r * p->x_row_stride * es,
                    (const char *)p->dy + r * p->dy_row_stride * es,
                    p->dh ? (const char *)p->dh + r * p->dh_row_stride * es
                          : NULL,
                    p->dx ? (char *)p->dx + r * p->dx_row_stride * es : NULL,
                    p->dtype, n, xh, dy, dhb, w, mean, rstd, p->rms, mine);
        }
        free(xh);
    }
    if (!failed && p->dweight) {
        store_param_grad(part, nthreads, n, 0, p->param_dtype, p->dweight, w);
    }
    if (!failed && p->dbias) {
        store_param_grad(part, nthreads, n, 1, p->param_dtype, p->dbias, w);
    }
    free(w);
    free(part);
    if (failed) {
        return gemsops_fail(st, GEMSOPS_ERR_RUNTIME,
                            "layer_norm_backward: out of host memory");
    }
    return GEMSOPS_OK;
}
