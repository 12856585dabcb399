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
 * than torch (docs/performance.md, CPU backend).
 *
 * Memory: rows longer than GEMSOPS_LN_CPU_WHOLE_ROW are taken a chunk of
 * GEMSOPS_LN_CPU_CHUNK columns at a time, each pass reading x (or h) again, the parameters
 * widened a chunk at a time: a thread holds a few chunks of doubles
 * whatever the row's length (whole-row buffers held 16 bytes an element a
 * thread, and w and b 16 more: a row of 2^30 bf16 elements, which torch
 * normalizes in place, ran the host out of memory). Teams are no larger
 * than the rows. */
#include <math.h>
#include <stdlib.h>

#include "convert.h"
#include "gemsops/layer_norm.h"
#include "parallel.h"
#include "simd.h"

#define GEMSOPS_LN_CPU_WHOLE_ROW 65536
#define GEMSOPS_LN_CPU_CHUNK 8192

/* Elements c0 .. c0 + len of weight/bias as doubles into v; a NULL param
 * gives `fill` everywhere. */
static void
param_chunk(double *v, const void *param, gemsops_dtype dt, int64_t c0,
            int64_t len, double fill)
{
    for (int64_t c = 0; c < len; c++) {
        v[c] = param ? gemsops_load_f64(param, dt, c0 + c) : fill;
    }
}

/* weight/bias as doubles (n of them); NULL param gives `fill` everywhere */
static double *
load_param(const void *param, gemsops_dtype dt, int64_t n, double fill)
{
    double *v = malloc((n ? n : 1) * sizeof *v);
    if (v != NULL) {
        param_chunk(v, param, dt, 0, n, fill);
    }
    return v;
}

/* A team for `rows` rows: no thread without a row (each holds buffers). */
static int
team_for(int64_t rows)
{
    const int t = gemsops_thread_count();
    return rows < (int64_t)t ? (rows > 0 ? (int)rows : 1) : t;
}

/* [c0, c0 + len) of a row of n, len = n - c0 at most one chunk */
static inline int64_t
chunk_len(int64_t n, int64_t c0)
{
    return n - c0 < GEMSOPS_LN_CPU_CHUNK ? n - c0 : GEMSOPS_LN_CPU_CHUNK;
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
/* The squared deviations of v[0..n) from mean0 into *m2, and their sum
 * into *dsum (added to what they hold). */
static inline void
add_deviations(const double *v, int64_t n, double mean0, double *m2,
               double *dsum)
{
    double q = 0, d1 = 0;
#pragma omp simd reduction(+ : q, d1)
    for (int64_t c = 0; c < n; c++) {
        const double d = v[c] - mean0;
        q += d * d;
        d1 += d;
    }
    *m2 += q;
    *dsum += d1;
}

/* A row's statistics from its sum, the squared deviations from sum / n
 * (0 for RMSNorm) and their sum: the corrected two-pass step, as on CUDA,
 * where mean0's rounding comes back as the deviations' mean. Doubles are
 * no wider than float64 input, whose constant row would otherwise
 * normalize to ulps times rstd, not 0 (a row holding inf or NaN keeps the
 * plain values). */
static inline void
row_stats(double mean0, double m2, double dsum, int64_t n, double eps, int rms,
          double *mean_out, double *rstd_out)
{
    const double shift = dsum / (double)n;
    const int fix = !rms && isfinite(shift);
    *mean_out = fix ? mean0 + shift : mean0;
    m2 = fix ? m2 - dsum * shift : m2;
    m2 = m2 < 0 ? 0 : m2; /* NaN stays NaN */
    *rstd_out = 1.0 / sqrt(m2 / (double)n + eps);
}

/* y[0..n) = (v - mean) * rstd * w + b, rounded once */
static inline void
store_normalized(void *y, gemsops_dtype dt, int64_t n, const double *v,
                 double mean, double rstd, const double *w, const double *b)
{
    GEMSOPS_STORE_ROW(y, dt, (v[c] - mean) * rstd * w[c] + b[c]);
}

GEMSOPS_SIMD_CLONES static void
fwd_row(const void *x, const void *res, void *h, void *y, gemsops_dtype dt,
        int64_t n, double *buf, const double *w, const double *b, double eps,
        int rms, double *mean_out, double *rstd_out)
{
    const double sum = res ? add_residual(x, res, h, dt, n, buf, buf + n)
                           : load_sum(x, dt, n, buf);
    const double mean0 = rms ? 0.0 : sum / (double)n;
    double m2 = 0, dsum = 0;
    add_deviations(buf, n, mean0, &m2, &dsum);
    row_stats(mean0, m2, dsum, n, eps, rms, mean_out, rstd_out);
    store_normalized(y, dt, n, buf, *mean_out, *rstd_out, w, b);
}

/* fwd_row for a long row: three passes over memory, a
 * chunk at a time (the residual's pass writes h, which the next two read
 * back). buf holds 3 chunks of doubles; the parameters (param_dt) are
 * read where they lie. */
static void
fwd_row_chunked(const void *x, const void *res, void *h, void *y,
                gemsops_dtype dt, int64_t n, double *buf, const void *weight,
                const void *bias, gemsops_dtype param_dt, double eps, int rms,
                double *mean_out, double *rstd_out)
{
    const size_t es = gemsops_dtype_size(dt);
    double *v = buf, *w = buf + GEMSOPS_LN_CPU_CHUNK;
    double *b = buf + 2 * GEMSOPS_LN_CPU_CHUNK;
    const char *src = res ? (const char *)h : (const char *)x;
    double sum = 0;
    for (int64_t c0 = 0; c0 < n; c0 += GEMSOPS_LN_CPU_CHUNK) {
        const int64_t len = chunk_len(n, c0);
        const size_t at = (size_t)c0 * es;
        sum += res ? add_residual((const char *)x + at, (const char *)res + at,
                                  (char *)h + at, dt, len, v, w)
                   : load_sum((const char *)x + at, dt, len, v);
    }
    const double mean0 = rms ? 0.0 : sum / (double)n;
    double m2 = 0, dsum = 0;
    for (int64_t c0 = 0; c0 < n; c0 += GEMSOPS_LN_CPU_CHUNK) {
        const int64_t len = chunk_len(n, c0);
        load_sum(src + (size_t)c0 * es, dt, len, v);
        add_deviations(v, len, mean0, &m2, &dsum);
    }
    row_stats(mean0, m2, dsum, n, eps, rms, mean_out, rstd_out);
    for (int64_t c0 = 0; c0 < n; c0 += GEMSOPS_LN_CPU_CHUNK) {
        const int64_t len = chunk_len(n, c0);
        load_sum(src + (size_t)c0 * es, dt, len, v);
        param_chunk(w, weight, param_dt, c0, len, 1.0);
        param_chunk(b, bias, param_dt, c0, len, 0.0);
        store_normalized((char *)y + (size_t)c0 * es, dt, len, v, *mean_out,
                         *rstd_out, w, b);
    }
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
    const int chunked = n > GEMSOPS_LN_CPU_WHOLE_ROW;
    double *w = chunked ? NULL : load_param(p->weight, p->param_dtype, n, 1.0);
    double *b = chunked ? NULL : load_param(p->bias, p->param_dtype, n, 0.0);
    int failed = !chunked && (w == NULL || b == NULL);
    const size_t buf_len = chunked ? 3 * GEMSOPS_LN_CPU_CHUNK : 2 * (size_t)n;

#pragma omp parallel num_threads(team_for(p->rows)) reduction(| : failed)
    {
        double *buf = failed ? NULL : malloc(buf_len * sizeof *buf);
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
            const char *x = (const char *)p->x + r * p->x_row_stride * es;
            char *y = (char *)p->y + r * p->y_row_stride * es;
            if (chunked) {
                fwd_row_chunked(x, res, h, y, p->dtype, n, buf, p->weight,
                                p->bias, p->param_dtype, eps, p->rms, &mean,
                                &rstd);
            }
            else {
                fwd_row(x, res, h, y, p->dtype, n, buf, w, b, eps, p->rms,
                        &mean, &rstd);
            }
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

/* Sums the threads' partial dW (which=0) or dB (which=1) in thread order,
 * a chunk at a time through scratch (a chunk of doubles, or n). */
static void
store_param_grad(const double *part, int nthreads, int64_t n, int which,
                 gemsops_dtype dt, void *dst, double *scratch)
{
    const size_t es = gemsops_dtype_size(dt);
    for (int64_t c0 = 0; c0 < n; c0 += GEMSOPS_LN_CPU_CHUNK) {
        const int64_t len = chunk_len(n, c0);
        for (int64_t c = 0; c < len; c++) {
            double s = 0;
            for (int t = 0; t < nthreads; t++) {
                s += part[(size_t)t * 2 * n + (size_t)which * n + c0 + c];
            }
            scratch[c] = s;
        }
        gemsops_store_row(scratch, dt, len, (char *)dst + (size_t)c0 * es);
    }
}

/* Pass 1 of the backward over n elements: x widened into xh as xhat, dy
 * into dyb; the row sums c1 = sum g * xhat and c2 = sum g (g = w * dy)
 * added into *c1_io, *c2_io. */
static inline void
bwd_sums(const void *x, const void *dy, gemsops_dtype dt, int64_t n,
         double *xh, double *dyb, const double *w, double mean, double rstd,
         double *c1_io, double *c2_io)
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
    *c1_io += c1;
    *c2_io += c2;
}

/* n of a row's dW terms into mine[0..n), its dB terms `db` further on */
static inline void
add_param_terms(double *mine, int64_t db, int64_t n, const double *dyb,
                const double *xh)
{
#pragma omp simd
    for (int64_t c = 0; c < n; c++) {
        mine[c] += dyb[c] * xh[c];
        mine[db + c] += dyb[c];
    }
}

/* Pass 2: dx = rstd * (g - (xhat * c1 + c2)) + dh over n elements, c1 and
 * c2 the row's sums over N already, rounded into dx. */
static inline void
store_dx(void *dx, gemsops_dtype dt, int64_t n, const double *dyb,
         const double *w, const double *xh, const double *dhb, double c1,
         double c2, double rstd)
{
    GEMSOPS_STORE_ROW(dx, dt,
                      rstd * (dyb[c] * w[c] - (xh[c] * c1 + c2)) + dhb[c]);
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
    bwd_sums(x, dy, dt, n, xh, dyb, w, mean, rstd, &c1, &c2);
    if (mine) {
        add_param_terms(mine, n, n, dyb, xh);
    }
    if (dx == NULL) {
        return;
    }
    c1 /= (double)n;
    c2 = rms ? 0.0 : c2 / (double)n;
    if (dh != NULL) {
        load_sum(dh, dt, n, dhb);
    }
    store_dx(dx, dt, n, dyb, w, xh, dhb, c1, c2, rstd);
}

/* bwd_row for a long row: pass 1 a chunk at a time, then
 * pass 2 reading x and dy again for each chunk's xhat. buf holds 4 chunks
 * of doubles; the weight (param_dt) is read where it lies. */
static void
bwd_row_chunked(const void *x, const void *dy, const void *dh, void *dx,
                gemsops_dtype dt, int64_t n, double *buf, const void *weight,
                gemsops_dtype param_dt, double mean, double rstd, int rms,
                double *mine)
{
    const size_t es = gemsops_dtype_size(dt);
    double *xh = buf, *dyb = buf + GEMSOPS_LN_CPU_CHUNK;
    double *dhb = buf + 2 * GEMSOPS_LN_CPU_CHUNK;
    double *w = buf + 3 * GEMSOPS_LN_CPU_CHUNK;
    double c1 = 0, c2 = 0;
    for (int64_t c0 = 0; c0 < n; c0 += GEMSOPS_LN_CPU_CHUNK) {
        const int64_t len = chunk_len(n, c0);
        const size_t at = (size_t)c0 * es;
        param_chunk(w, weight, param_dt, c0, len, 1.0);
        bwd_sums((const char *)x + at, (const char *)dy + at, dt, len, xh, dyb,
                 w, mean, rstd, &c1, &c2);
        if (mine) {
            add_param_terms(mine + c0, n, len, dyb, xh);
        }
    }
    if (dx == NULL) {
        return;
    }
    c1 /= (double)n;
    c2 = rms ? 0.0 : c2 / (double)n;
    for (int64_t c0 = 0; c0 < n; c0 += GEMSOPS_LN_CPU_CHUNK) {
        const int64_t len = chunk_len(n, c0);
        const size_t at = (size_t)c0 * es;
        double unused1 = 0, unused2 = 0;
        param_chunk(w, weight, param_dt, c0, len, 1.0);
        bwd_sums((const char *)x + at, (const char *)dy + at, dt, len, xh, dyb,
                 w, mean, rstd, &unused1, &unused2);
        if (dh != NULL) {
            load_sum((const char *)dh + at, dt, len, dhb);
        }
        store_dx((char *)dx + at, dt, len, dyb, w, xh, dhb, c1, c2, rstd);
    }
}

int
gemsops_layer_norm_bwd_cpu(const struct gemsops_layer_norm_bwd_params *p,
                           gemsops_status *st)
{
    const int64_t n = p->cols;
    const size_t es = gemsops_dtype_size(p->dtype);
    const gemsops_dtype sd = gemsops_layer_norm_stats_dtype(p->dtype);
    const int want_dwb = p->dweight != NULL || p->dbias != NULL;
    const int nthreads = team_for(p->rows);
    const int chunked = n > GEMSOPS_LN_CPU_WHOLE_ROW;
    /* the weight as doubles, or (chunked) a chunk of scratch for the
     * parameters' gradients */
    double *w = chunked ? malloc(GEMSOPS_LN_CPU_CHUNK * sizeof *w)
                        : load_param(p->weight, p->param_dtype, n, 1.0);
    double *part =
        want_dwb ? calloc((size_t)nthreads * 2 * (n ? n : 1), sizeof *part)
                 : NULL;
    int failed = w == NULL || (want_dwb && part == NULL);
    const size_t buf_len =
        chunked ? 4 * GEMSOPS_LN_CPU_CHUNK : 3 * (size_t)(n ? n : 1);

#pragma omp parallel num_threads(nthreads) reduction(| : failed)
    {
        /* zeros: dh's widened values where there is none */
        double *buf = failed ? NULL : calloc(buf_len, sizeof *buf);
        failed |= buf == NULL;
        double *mine =
            part ? part + (size_t)gemsops_thread_index() * 2 * n : NULL;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < p->rows; r++) {
            if (buf == NULL) {
                continue;
            }
            const double mean =
                p->rms ? 0.0 : gemsops_load_f64(p->mean, sd, r);
            const double rstd = gemsops_load_f64(p->rstd, sd, r);
            const char *x = (const char *)p->x + r * p->x_row_stride * es;
            const char *dy = (const char *)p->dy + r * p->dy_row_stride * es;
            const char *dh =
                p->dh ? (const char *)p->dh + r * p->dh_row_stride * es : NULL;
            char *dx =
                p->dx ? (char *)p->dx + r * p->dx_row_stride * es : NULL;
            if (chunked) {
                bwd_row_chunked(x, dy, dh, dx, p->dtype, n, buf, p->weight,
                                p->param_dtype, mean, rstd, p->rms, mine);
            }
            else {
                bwd_row(x, dy, dh, dx, p->dtype, n, buf, buf + n, buf + 2 * n,
                        w, mean, rstd, p->rms, mine);
            }
        }
        free(buf);
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
