/* prod on the CPU: full and per-dim products and their zero-safe backward.
 *
 * Work split: the input is seen as lines along the reduced dim (one line
 * of every element for the full product). OpenMP threads take lines; a
 * single line (the full product) is split into per-thread chunks whose
 * partial products are combined in thread order. Floats accumulate in
 * double (rounded once to the output dtype); integers in uint64, which
 * wraps exactly as torch's int64 products do.
 *
 * Unit-stride runs (the reduced dim innermost, or a dense full product)
 * multiply in `omp simd` lanes with one dtype switch per run (run_f64 /
 * run_u64): a serial chain of double multiplies, one element at a time
 * through a dtype switch and an index computation, ran many times slower
 * than torch (docs/performance.md, CPU backend). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "convert.h"
#include "gemsops/prod.h"
#include "parallel.h"
#include "simd.h"

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

/* Product of the `len` unit-stride elements at base + off: floats widened
 * to double, lanes multiplied in a fixed order for a given build. */
GEMSOPS_SIMD_CLONES static double
run_f64(const void *base, gemsops_dtype dt, int64_t off, int64_t len)
{
    double f = 1.0;
#define GEMSOPS_RUN_F64(CT, WIDEN)                                        \
    {                                                                     \
        const CT *s = (const CT *)base + off;                             \
        _Pragma("omp simd reduction(* : f)") for (int64_t r = 0; r < len; \
                                                  r++)                    \
        {                                                                 \
            f *= WIDEN(s[r]);                                             \
        }                                                                 \
    }                                                                     \
    break;
    switch (dt) {
    case GEMSOPS_FLOAT32: GEMSOPS_RUN_F64(float, (double))
    case GEMSOPS_FLOAT64: GEMSOPS_RUN_F64(double, (double))
    case GEMSOPS_BFLOAT16: GEMSOPS_RUN_F64(uint16_t, gemsops_bf16_to_float)
    case GEMSOPS_FLOAT16: GEMSOPS_RUN_F64(uint16_t, gemsops_half_to_float)
    default: break;
    }
#undef GEMSOPS_RUN_F64
    return f;
}

/* The same for bool and integers, in uint64 (exact in any order). */
GEMSOPS_SIMD_CLONES static uint64_t
run_u64(const void *base, gemsops_dtype dt, int64_t off, int64_t len)
{
    uint64_t u = 1;
#define GEMSOPS_RUN_U64(CT, WIDEN)                                        \
    {                                                                     \
        const CT *s = (const CT *)base + off;                             \
        _Pragma("omp simd reduction(* : u)") for (int64_t r = 0; r < len; \
                                                  r++)                    \
        {                                                                 \
            u *= WIDEN(s[r]);                                             \
        }                                                                 \
    }                                                                     \
    break;
#define GEMSOPS_BOOL_U64(v) (uint64_t)((v) != 0)
#define GEMSOPS_SIGNED_U64(v) (uint64_t)(int64_t)(v)
    switch (dt) {
    case GEMSOPS_BOOL: GEMSOPS_RUN_U64(uint8_t, GEMSOPS_BOOL_U64)
    case GEMSOPS_UINT8: GEMSOPS_RUN_U64(uint8_t, (uint64_t))
    case GEMSOPS_INT8: GEMSOPS_RUN_U64(int8_t, GEMSOPS_SIGNED_U64)
    case GEMSOPS_INT16: GEMSOPS_RUN_U64(int16_t, GEMSOPS_SIGNED_U64)
    case GEMSOPS_INT32: GEMSOPS_RUN_U64(int32_t, GEMSOPS_SIGNED_U64)
    case GEMSOPS_INT64: GEMSOPS_RUN_U64(int64_t, (uint64_t))
    default: break;
    }
#undef GEMSOPS_RUN_U64
#undef GEMSOPS_BOOL_U64
#undef GEMSOPS_SIGNED_U64
    return u;
}

/* acc[i] *= x[off + i] for i < nb: one row of a block of unit-stride
 * columns (SIMD across the columns; each column keeps its serial order). */
GEMSOPS_SIMD_CLONES static void
cols_f64(const void *base, gemsops_dtype dt, int64_t off, int nb, double *acc)
{
#define GEMSOPS_COLS_F64(CT, WIDEN)                      \
    {                                                    \
        const CT *s = (const CT *)base + off;            \
        _Pragma("omp simd") for (int i = 0; i < nb; i++) \
        {                                                \
            acc[i] *= WIDEN(s[i]);                       \
        }                                                \
    }                                                    \
    break;
    switch (dt) {
    case GEMSOPS_FLOAT32: GEMSOPS_COLS_F64(float, (double))
    case GEMSOPS_FLOAT64: GEMSOPS_COLS_F64(double, (double))
    case GEMSOPS_BFLOAT16: GEMSOPS_COLS_F64(uint16_t, gemsops_bf16_to_float)
    case GEMSOPS_FLOAT16: GEMSOPS_COLS_F64(uint16_t, gemsops_half_to_float)
    default: break;
    }
#undef GEMSOPS_COLS_F64
}

GEMSOPS_SIMD_CLONES static void
cols_u64(const void *base, gemsops_dtype dt, int64_t off, int nb,
         uint64_t *acc)
{
    for (int i = 0; i < nb; i++) {
        acc[i] *= load_u64(base, dt, off + i);
    }
}

/* The line layout: `lines` lines of `len` elements, element r of line o at
 * base(o) + r * step. For the full product: one line over every element. */
struct lines {
    int64_t count, len, step;
    int kept_ndim;
    int64_t kept_sizes[GEMSOPS_MAX_DIMS], kept_strides[GEMSOPS_MAX_DIMS];
    int full; /* 1: the single line walks x's dims kept_* (all of them) */
};

/* The sort key of a dim in a full product's walk: outermost first. An
 * expanded dim (stride 0) goes outermost: the walk must not multiply the
 * repeats of one value together before it meets the others (their powers
 * overflow long before the product does); the rest by |stride|,
 * descending, so that the walk reads memory in order. */
static int64_t
walk_key(int64_t stride)
{
    return stride == 0 ? INT64_MAX : (stride < 0 ? -stride : stride);
}

/* The full product's walk, reordered by walk_key (a stable insertion
 * sort). The backward keeps the row-major walk: its gradient is written
 * in that order. */
static void
walk_in_memory_order(struct lines *l)
{
    for (int a = 1; a < l->kept_ndim; a++) {
        for (int b = a; b > 0 && walk_key(l->kept_strides[b - 1]) <
                                     walk_key(l->kept_strides[b]);
             b--) {
            const int64_t size = l->kept_sizes[b], stride = l->kept_strides[b];
            l->kept_sizes[b] = l->kept_sizes[b - 1];
            l->kept_strides[b] = l->kept_strides[b - 1];
            l->kept_sizes[b - 1] = size;
            l->kept_strides[b - 1] = stride;
        }
    }
}

static struct lines
lines_of(const struct gemsops_tensor *x, int dim)
{
    struct lines l;
    memset(&l, 0, sizeof l);
    if (dim < 0) {
        l.count = 1;
        l.len = gemsops_tensor_numel(x);
        l.full = 1;
        l.kept_ndim = x->ndim; /* row-major; see walk_in_memory_order */
        for (int d = 0; d < x->ndim; d++) {
            l.kept_sizes[d] = x->sizes[d];
            l.kept_strides[d] = x->strides[d];
        }
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
element(const struct lines *l, int64_t o, int64_t r)
{
    if (l->full) {
        return offset_of(r, l->kept_sizes, l->kept_strides, l->kept_ndim);
    }
    return offset_of(o, l->kept_sizes, l->kept_strides, l->kept_ndim) +
           r * l->step;
}

int
gemsops_prod_cpu(const struct gemsops_prod_params *p, gemsops_status *st)
{
    const struct gemsops_tensor *x = &p->x;
    struct lines l = lines_of(x, p->dim);
    if (l.full) {
        walk_in_memory_order(&l);
    }
    const int integral = is_integral(x->dtype);
    /* dense: element k of the full product sits at offset k */
    const int dense = l.full && gemsops_tensor_is_contiguous(x);
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
            if (dense && integral) {
                u = run_u64(x->data, x->dtype, lo, hi - lo);
            }
            else if (dense) {
                f = run_f64(x->data, x->dtype, lo, hi - lo);
            }
            for (int64_t r = lo; r < hi && !dense; r++) {
                const int64_t off = element(&l, 0, r);
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
    if (l.step != 1 && l.count > 0 && l.kept_ndim > 0 &&
        l.kept_strides[l.kept_ndim - 1] == 1) {
        /* The innermost kept dim is unit-stride: blocks of CPU_COLS
         * adjacent lines walk down the reduced dim together, a row of
         * the block at a time (a line alone strides through memory). */
        enum { CPU_COLS = 256 };
        const int64_t inner = l.kept_sizes[l.kept_ndim - 1];
        const int64_t per = (inner + CPU_COLS - 1) / CPU_COLS;
        const int64_t blocks = l.count / inner * per;
#pragma omp parallel for schedule(static)
        for (int64_t k = 0; k < blocks; k++) {
            const int64_t o0 = k / per * inner + k % per * CPU_COLS;
            const int64_t left = inner - k % per * CPU_COLS;
            const int nb = (int)(left < CPU_COLS ? left : CPU_COLS);
            const int64_t base = element(&l, o0, 0);
            double f[CPU_COLS];
            uint64_t u[CPU_COLS];
            for (int i = 0; i < nb; i++) {
                f[i] = 1.0;
                u[i] = 1;
            }
            for (int64_t r = 0; r < l.len; r++) {
                if (integral) {
                    cols_u64(x->data, x->dtype, base + r * l.step, nb, u);
                }
                else {
                    cols_f64(x->data, x->dtype, base + r * l.step, nb, f);
                }
            }
            for (int i = 0; i < nb; i++) {
                if (integral) {
                    ((int64_t *)p->out)[o0 + i] = (int64_t)u[i];
                }
                else {
                    gemsops_store_f64(p->out, p->out_dtype, o0 + i, f[i]);
                }
            }
        }
        return GEMSOPS_OK;
    }
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < l.count; o++) {
        const int64_t base = element(&l, o, 0);
        if (l.step == 1 && integral) {
            ((int64_t *)p->out)[o] =
                (int64_t)run_u64(x->data, x->dtype, base, l.len);
        }
        else if (l.step == 1) {
            gemsops_store_f64(p->out, p->out_dtype, o,
                              run_f64(x->data, x->dtype, base, l.len));
        }
        else if (integral) {
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
                suffix[r] =
                    suffix[r + 1] *
                    gemsops_load_f64(x->data, x->dtype, element(&l, o, r));
            }
            const int64_t outer = l.full ? 0 : o / inner;
            const int64_t in = l.full ? 0 : o % inner;
            double prefix = 1.0;
            for (int64_t r = 0; r < l.len; r++) {
                const int64_t gi =
                    l.full ? r : (outer * l.len + r) * inner + in;
                gemsops_store_f64(p->grad_in, x->dtype, gi,
                                  g * prefix * suffix[r + 1]);
                prefix *=
                    gemsops_load_f64(x->data, x->dtype, element(&l, o, r));
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
