/* prod on the CPU: full and per-dim products and their zero-safe backward.
 *
 * Work split: the input is seen as lines along the reduced dim (one line
 * of every element for the full product). OpenMP threads take lines; a
 * single line (the full product) is split into per-thread chunks whose
 * partial products are combined in thread order. Floats accumulate in
 * double (rounded once to the output dtype); integers in uint64, which
 * wraps exactly as torch's int64 products do. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "convert.h"
#include "gemsops/prod.h"
#include "parallel.h"

/* Element offset of the `k`-th element (row-major over `sizes`). */
static int64_t
offset_of(int64_t k, const int64_t *sizes, const int64_t *strides, int ndim)
{
    int64_t off = 0;
    for (int d = ndim - 1; d >= 0; d--) {
        off += (k % sizes[d]) * strides[d];
        k /= sizes[d];
    }
    return off;
}

static int
is_integral(gemsops_dtype d)
{
    return d == GEMSOPS_BOOL || d == GEMSOPS_UINT8 || d == GEMSOPS_INT8 ||
           d == GEMSOPS_INT16 || d == GEMSOPS_INT32 || d == GEMSOPS_INT64;
}

static uint64_t
load_u64(const void *base, gemsops_dtype dt, int64_t i)
{
    switch (dt) {
    case GEMSOPS_BOOL: return ((const uint8_t *)base)[i] != 0;
    case GEMSOPS_UINT8: return ((const uint8_t *)base)[i];
    case GEMSOPS_INT8: return (uint64_t)(int64_t)((const int8_t *)base)[i];
    case GEMSOPS_INT16: return (uint64_t)(int64_t)((const int16_t *)base)[i];
    case GEMSOPS_INT32: return (uint64_t)(int64_t)((const int32_t *)base)[i];
    case GEMSOPS_INT64: return (uint64_t)((const int64_t *)base)[i];
    default: return 0;
    }
}

/* The line layout: `lines` lines of `len` elements, element r of line o at
 * base(o) + r * step. For the full product: one line over every element. */
struct lines {
    int64_t count, len, step;
    int kept_ndim;
    int64_t kept_sizes[GEMSOPS_MAX_DIMS], kept_strides[GEMSOPS_MAX_DIMS];
    int full; /* 1: the single line walks x in row-major order */
};

static struct lines
lines_of(const struct gemsops_tensor *x, int dim)
{
    struct lines l;
    memset(&l, 0, sizeof l);
    if (dim < 0) {
        l.count = 1;
        l.len = gemsops_tensor_numel(x);
        l.full = 1;
        return l;
    }
    l.len = x->sizes[dim];
    l.step = x->strides[dim];
    l.count = 1;
    for (int d = 0; d < x->ndim; d++) {
        if (d == dim) {
            continue;
        }
        l.kept_sizes[l.kept_ndim] = x->sizes[d];
        l.kept_strides[l.kept_ndim] = x->strides[d];
        l.kept_ndim++;
        l.count *= x->sizes[d];
    }
    return l;
}

/* Offset of element r of line o. */
static int64_t
element(const struct lines *l, const struct gemsops_tensor *x, int64_t o,
        int64_t r)
{
    if (l->full) {
        return offset_of(r, x->sizes, x->strides, x->ndim);
    }
    return offset_of(o, l->kept_sizes, l->kept_strides, l->kept_ndim) +
           r * l->step;
}

int
gemsops_prod_cpu(const struct gemsops_prod_params *p, gemsops_status *st)
{
    const struct gemsops_tensor *x = &p->x;
    const struct lines l = lines_of(x, p->dim);
    const int integral = is_integral(x->dtype);
    if (l.count == 1) { /* one long line: chunks per thread, in order */
        const int nt = gemsops_thread_count();
        double *pf = malloc(nt * sizeof *pf);
        uint64_t *pi = malloc(nt * sizeof *pi);
        if (pf == NULL || pi == NULL) {
            free(pf);
            free(pi);
            return gemsops_fail(st, GEMSOPS_ERR_RUNTIME,
                                "prod: out of host memory");
        }
#pragma omp parallel num_threads(nt)
        {
            const int t = gemsops_thread_index();
            const int n = gemsops_team_size();
            const int64_t lo = l.len * t / n, hi = l.len * (t + 1) / n;
            double f = 1.0;
            uint64_t u = 1;
            for (int64_t r = lo; r < hi; r++) {
                const int64_t off = element(&l, x, 0, r);
                if (integral) {
                    u *= load_u64(x->data, x->dtype, off);
                }
                else {
                    f *= gemsops_load_f64(x->data, x->dtype, off);
                }
            }
            pf[t] = f;
            pi[t] = u;
            for (int s = n; s < nt; s++) { /* a smaller team than asked */
                if (t == 0) {
                    pf[s] = 1.0;
                    pi[s] = 1;
                }
            }
        }
        double f = 1.0;
        uint64_t u = 1;
        for (int t = 0; t < nt; t++) {
            f *= pf[t];
            u *= pi[t];
        }
        free(pf);
        free(pi);
        if (integral) {
            ((int64_t *)p->out)[0] = (int64_t)u;
        }
        else {
            gemsops_store_f64(p->out, p->out_dtype, 0, f);
        }
        return GEMSOPS_OK;
    }
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < l.count; o++) {
        const int64_t base = element(&l, x, o, 0);
        if (integral) {
            uint64_t u = 1;
            for (int64_t r = 0; r < l.len; r++) {
                u *= load_u64(x->data, x->dtype, base + r * l.step);
            }
            ((int64_t *)p->out)[o] = (int64_t)u;
        }
        else {
            double f = 1.0;
            for (int64_t r = 0; r < l.len; r++) {
                f *= gemsops_load_f64(x->data, x->dtype, base + r * l.step);
            }
            gemsops_store_f64(p->out, p->out_dtype, o, f);
        }
    }
    return GEMSOPS_OK;
}

int
gemsops_prod_bwd_cpu(const struct gemsops_prod_bwd_params *p,
                     gemsops_status *st)
{
    const struct gemsops_tensor *x = &p->x;
    const struct lines l = lines_of(x, p->dim);
    int failed = 0;
    /* grad_in is contiguous in x's shape: element r of line o sits at the
     * row-major index of (o, r) with r at position `dim`. */
    int64_t inner = 1;
    for (int d = p->dim + 1; p->dim >= 0 && d < x->ndim; d++) {
        inner *= x->sizes[d];
    }
#pragma omp parallel reduction(| : failed)
    {
        double *suffix = malloc((l.len + 1) * sizeof *suffix);
        failed |= suffix == NULL;
#pragma omp for schedule(static)
        for (int64_t o = 0; o < l.count; o++) {
            if (suffix == NULL) {
                continue;
            }
            const double g = gemsops_load_f64(p->grad_out, x->dtype, o);
            /* suffix[r] = prod_{j >= r} x_j, then a running prefix */
            suffix[l.len] = 1.0;
            for (int64_t r = l.len - 1; r >= 0; r--) {
                suffix[r] = suffix[r + 1] *
                            gemsops_load_f64(x->data, x->dtype,
                                             element(&l, x, o, r));
            }
            const int64_t outer = l.full ? 0 : o / inner;
            const int64_t in = l.full ? 0 : o % inner;
            double prefix = 1.0;
            for (int64_t r = 0; r < l.len; r++) {
                const int64_t gi =
                    l.full ? r : (outer * l.len + r) * inner + in;
                gemsops_store_f64(p->grad_in, x->dtype, gi,
                                  g * prefix * suffix[r + 1]);
                prefix *= gemsops_load_f64(x->data, x->dtype,
                                           element(&l, x, o, r));
            }
        }
        free(suffix);
    }
    if (failed) {
        return gemsops_fail(st, GEMSOPS_ERR_RUNTIME,
                            "prod backward: out of host memory");
    }
    return GEMSOPS_OK;
}
