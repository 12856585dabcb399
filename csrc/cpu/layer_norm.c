/* LayerNorm forward and backward on the CPU: the math of
 * include/gemsops/layer_norm.h, rows split over OpenMP threads.
 *
 * Every dtype is computed in double (at least as accurate as the GPU's
 * fp32 math) and rounded once on store. Statistics are two-pass. dW/dB:
 * each thread sums its rows (static schedule) into a private buffer; the
 * buffers are added in thread order, so results repeat bit for bit. */
#include <math.h>
#include <stdlib.h>

#include "convert.h"
#include "gemsops/layer_norm.h"
#include "parallel.h"

static gemsops_dtype
stats_dtype(gemsops_dtype d)
{
    return d == GEMSOPS_FLOAT64 ? GEMSOPS_FLOAT64 : GEMSOPS_FLOAT32;
}

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

int
gemsops_layer_norm_fwd_cpu(const struct gemsops_layer_norm_fwd_params *p,
                           gemsops_status *st)
{
    const int64_t n = p->cols;
    const size_t es = gemsops_dtype_size(p->dtype);
    double *w = load_param(p->weight, p->param_dtype, n, 1.0);
    double *b = load_param(p->bias, p->param_dtype, n, 0.0);
    int failed = w == NULL || b == NULL;

#pragma omp parallel reduction(| : failed)
    {
        double *buf = failed ? NULL : malloc(n * sizeof *buf);
        failed |= buf == NULL;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < p->rows; r++) {
            if (buf == NULL) {
                continue;
            }
            gemsops_load_row((const char *)p->x + r * p->x_row_stride * es,
                             p->dtype, n, buf);
            double sum = 0;
            for (int64_t c = 0; c < n; c++) {
                sum += buf[c];
            }
            const double mean = sum / (double)n;
            double m2 = 0;
            for (int64_t c = 0; c < n; c++) {
                m2 += (buf[c] - mean) * (buf[c] - mean);
            }
            const double rstd = 1.0 / sqrt(m2 / (double)n + p->eps);
            for (int64_t c = 0; c < n; c++) {
                buf[c] = (buf[c] - mean) * rstd * w[c] + b[c];
            }
            gemsops_store_row(buf, p->dtype, n,
                              (char *)p->y + r * p->y_row_stride * es);
            if (p->mean != NULL) {
                gemsops_store_f64(p->mean, stats_dtype(p->dtype), r, mean);
                gemsops_store_f64(p->rstd, stats_dtype(p->dtype), r, rstd);
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

int
gemsops_layer_norm_bwd_cpu(const struct gemsops_layer_norm_bwd_params *p,
                           gemsops_status *st)
{
    const int64_t n = p->cols;
    const size_t es = gemsops_dtype_size(p->dtype);
    const gemsops_dtype sd = stats_dtype(p->dtype);
    const int want_dwb = p->dweight != NULL || p->dbias != NULL;
    const int nthreads = gemsops_thread_count();
    double *w = load_param(p->weight, p->param_dtype, n, 1.0);
    double *part = want_dwb ? calloc((size_t)nthreads * 2 * (n ? n : 1),
                                     sizeof *part)
                            : NULL;
    int failed = w == NULL || (want_dwb && part == NULL);

#pragma omp parallel num_threads(nthreads) reduction(| : failed)
    {
        double *xh = failed ? NULL : malloc(2 * (n ? n : 1) * sizeof *xh);
        failed |= xh == NULL;
        double *dy = xh ? xh + n : NULL;
        double *mine =
            part ? part + (size_t)gemsops_thread_index() * 2 * n : NULL;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < p->rows; r++) {
            if (xh == NULL) {
                continue;
            }
            gemsops_load_row((const char *)p->x + r * p->x_row_stride * es,
                             p->dtype, n, xh);
            gemsops_load_row((const char *)p->dy + r * p->dy_row_stride * es,
                             p->dtype, n, dy);
            const double mean = gemsops_load_f64(p->mean, sd, r);
            const double rstd = gemsops_load_f64(p->rstd, sd, r);
            double c1 = 0, c2 = 0;
            for (int64_t c = 0; c < n; c++) {
                xh[c] = (xh[c] - mean) * rstd;
                c1 += dy[c] * w[c] * xh[c];
                c2 += dy[c] * w[c];
                if (mine) {
                    mine[c] += dy[c] * xh[c];
                    mine[n + c] += dy[c];
                }
            }
            if (p->dx == NULL) {
                continue;
            }
            c1 /= (double)n;
            c2 /= (double)n;
            for (int64_t c = 0; c < n; c++) {
                xh[c] = rstd * (dy[c] * w[c] - (xh[c] * c1 + c2));
            }
            gemsops_store_row(xh, p->dtype, n,
                              (char *)p->dx + r * p->dx_row_stride * es);
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
