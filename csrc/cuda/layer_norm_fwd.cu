// LayerNorm forward: y = (x - mean) * rstd * w + b, per row of N elements.
//
// Work split: TPR consecutive threads own a row (or one slab of it, see
// layer_norm_plan.cuh); each holds E = ITEMS * VEC elements in registers, so
// x is read from memory exactly once. Statistics are two-pass over the
// registers: the row sum gives the mean, then the sum of squared deviations
// gives the variance (no E[x^2] - mean^2 cancellation). A row split over
// `split` CTAs exchanges (slab sum, slab squared deviations about the slab
// mean) and combines them with the parallel-variance formula in slab order.
// CTAs are persistent and walk row groups in a grid-stride loop, so any M
// works.
//
// Bytes: read x once (N * sizeof(T) per row), write y once, plus 2 stats
// per row; weight and bias (N elements each) come from L2 for all rows.
#include <algorithm>

#include "layer_norm_plan.cuh"
#include "gemsops/layer_norm.h"

namespace gemsops {
namespace {

// Elements per thread in the forward: four 16-byte accesses in flight.
template <typename T> __host__ __device__ constexpr int fwd_elems()
{
    return 4 * 16 / sizeof(T);
}

// One row per loop step: four accesses a thread already keep enough bytes
// in flight, and registers go to occupancy.
__host__ __device__ constexpr int fwd_rows_at_once(int, int) { return 1; }

// Widest thread group per row: 1024-thread CTAs spend too long in
// barriers, and 512 threads holding 32 half elements each need more than
// the 64 registers two such CTAs per SM leave; longer rows are split over
// CTAs instead.
template <typename T> constexpr int fwd_max_tpr() { return sizeof(T) == 2 ? 256 : 512; }

template <typename T, typename P> struct fwd_args {
    const T *x;
    T *y;
    const P *w;
    const P *b;
    acc_t<T> *mean;
    acc_t<T> *rstd;
    acc_t<T> *partials; // split > 1: [rows][split][2]
    unsigned *counters; // split > 1: [rows]
    int64_t rows, cols, x_stride, y_stride;
    int split;
    acc_t<T> eps;
};

// Register budget: 768 resident threads per SM (<= 85 registers), and at
// least two CTAs of 512 (64 registers), so that one CTA's barriers overlap
// another's loads.
constexpr int fwd_min_ctas(int block) { return block >= 512 ? 2 : 768 / block; }

template <typename T, typename P, int TPR, int VEC>
__global__ void __launch_bounds__(TPR < 128 ? 128 : TPR,
                                  fwd_min_ctas(TPR < 128 ? 128 : TPR))
    layer_norm_fwd_registers(const fwd_args<T, P> a)
{
    using A = acc_t<T>;
    constexpr int E = fwd_elems<T>();
    constexpr int ITEMS = E / VEC;
    constexpr int BLOCK = TPR < 128 ? 128 : TPR;
    constexpr int ROWS_PER_CTA = BLOCK / TPR;
    constexpr int R = fwd_rows_at_once(TPR, VEC);
    constexpr int SLAB = TPR * E;
    constexpr int STEP = TPR * VEC; // columns between a thread's items
    __shared__ A red[2 * 32 * R];
    __shared__ A merged[R][2];
    int parity = 0;

    const int lane = threadIdx.x % TPR;
    const int slab = blockIdx.x % a.split;
    const int64_t group = blockIdx.x / a.split;
    const int64_t groups = gridDim.x / a.split;
    const int64_t col0 = (int64_t)slab * SLAB + lane * VEC;
    // item i of this thread is valid when i * STEP < lim
    const int slab_cols = (int)min((int64_t)SLAB, a.cols - (int64_t)slab * SLAB);
    const int lim = slab_cols - lane * VEC;

    // Each step covers R * ROWS_PER_CTA rows: R independent rows per thread
    // keep twice the bytes in flight and share each reduction's barriers.
    for (int64_t base = group * ROWS_PER_CTA * R; base < a.rows;
         base += groups * ROWS_PER_CTA * R) {
        int64_t row[R];
        bool row_ok[R];
        vec_t<T, VEC> xv[R][ITEMS];
        A s[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            row[r] = base + r * ROWS_PER_CTA + threadIdx.x / TPR;
            row_ok[r] = row[r] < a.rows;
            const T *xr = a.x + row[r] * a.x_stride + col0;
#pragma unroll
            for (int i = 0; i < ITEMS; i++) {
                if (row_ok[r] && i * STEP < lim) {
                    xv[r][i] = load_vec<T, VEC>(xr + i * STEP);
                }
                else {
#pragma unroll
                    for (int v = 0; v < VEC; v++) {
                        xv[r][i].v[v] = from_acc<T>(A(0));
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            s[r] = 0;
#pragma unroll
            for (int i = 0; i < ITEMS; i++) {
#pragma unroll
                for (int v = 0; v < VEC; v++) {
                    s[r] += to_acc<A>(xv[r][i].v[v]);
                }
            }
        }
        row_sum<TPR, R>(s, red, parity);
        A slab_mean[R], m2[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            slab_mean[r] = s[r] / (A)slab_cols;
            m2[r] = 0;
#pragma unroll
            for (int i = 0; i < ITEMS; i++) {
#pragma unroll
                for (int v = 0; v < VEC; v++) {
                    const A d = to_acc<A>(xv[r][i].v[v]) - slab_mean[r];
                    m2[r] += (i * STEP + v < lim) ? d * d : A(0);
                }
            }
        }
        row_sum<TPR, R>(m2, red, parity);

        A mean[R], rstd[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            mean[r] = slab_mean[r];
        }
        if (a.split > 1) {
            // (slab sum, slab squared deviations about the slab mean) ->
            // M2 = sum_k m2_k + n_k * (mean_k - mean)^2, in slab order
            if (threadIdx.x == 0) {
                for (int r = 0; r < R; r++) {
                    if (!row_ok[r]) {
                        continue;
                    }
                    const A *all = split_exchange(a.partials, a.counters,
                                                  row[r], slab, a.split, s[r],
                                                  m2[r]);
                    A total = 0;
                    for (int k = 0; k < a.split; k++) {
                        total += __ldcg(all + 2 * k);
                    }
                    const A mu = total / (A)a.cols;
                    A dev = 0;
                    for (int k = 0; k < a.split; k++) {
                        const A n_k =
                            (A)min((int64_t)SLAB, a.cols - (int64_t)k * SLAB);
                        const A d = __ldcg(all + 2 * k) / n_k - mu;
                        dev += __ldcg(all + 2 * k + 1) + n_k * d * d;
                    }
                    merged[r][0] = mu;
                    merged[r][1] = dev;
                }
            }
            __syncthreads();
#pragma unroll
            for (int r = 0; r < R; r++) {
                mean[r] = merged[r][0];
                m2[r] = merged[r][1];
            }
            __syncthreads(); // merged[] is rewritten for the next rows
        }
#pragma unroll
        for (int r = 0; r < R; r++) {
            rstd[r] = A(1) / sqrt(m2[r] / (A)a.cols + a.eps);
        }

#pragma unroll
        for (int i = 0; i < ITEMS; i++) {
            if (i * STEP >= lim) {
                continue;
            }
            vec_t<P, VEC> wv, bv;
            if (a.w) {
                wv = load_vec<P, VEC>(a.w + col0 + i * STEP);
            }
            if (a.b) {
                bv = load_vec<P, VEC>(a.b + col0 + i * STEP);
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (!row_ok[r]) {
                    continue;
                }
                A out[VEC];
#pragma unroll
                for (int v = 0; v < VEC; v++) {
                    A y = (to_acc<A>(xv[r][i].v[v]) - mean[r]) * rstd[r];
                    if (a.w) {
                        y *= to_acc<A>(wv.v[v]);
                    }
                    if (a.b) {
                        y += to_acc<A>(bv.v[v]);
                    }
                    out[v] = y;
                }
                store_rounded<T, VEC>(a.y + row[r] * a.y_stride + col0 +
                                          i * STEP,
                                      out);
            }
        }
        if (slab == 0 && lane == 0 && a.mean) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (row_ok[r]) {
                    a.mean[row[r]] = mean[r];
                    a.rstd[row[r]] = rstd[r];
                }
            }
        }
    }
}

template <typename T, typename P, int TPR, int VEC>
int ctas_per_sm(int device, gemsops_status *st, int *out)
{
    static int cache[64];
    if (device < 64 && cache[device] > 0) {
        *out = cache[device];
        return GEMSOPS_OK;
    }
    GEMSOPS_CUDA_CHECK(st, cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                               out, layer_norm_fwd_registers<T, P, TPR, VEC>,
                               layer_norm_block_threads(TPR), 0));
    if (*out < 1) {
        return gemsops_fail(st, GEMSOPS_ERR_RUNTIME,
                            "layer_norm: kernel cannot be resident on device "
                            "%d",
                            device);
    }
    if (device < 64) {
        cache[device] = *out;
    }
    return GEMSOPS_OK;
}

template <typename T, typename P, int TPR, int VEC>
int run(const gemsops_layer_norm_fwd_params *p, layer_norm_shape shape,
        int64_t *workspace_bytes, gemsops_status *st)
{
    using A = acc_t<T>;
    device_facts f;
    int occ;
    int occ_scalar;
    // Both access widths get the same grid, so the workspace plan does not
    // depend on pointer alignment, and split rows stay co-resident.
    if (get_device_facts(p->device_id, &f, st) ||
        ctas_per_sm<T, P, TPR, 16 / sizeof(T)>(p->device_id, st, &occ) ||
        ctas_per_sm<T, P, TPR, 1>(p->device_id, st, &occ_scalar)) {
        return st->code;
    }
    occ = occ < occ_scalar ? occ : occ_scalar;
    // Rows that fit one CTA: a CTA per row group, not persistent, so the
    // SM overlaps one CTA's reductions with others' loads. Split rows: a
    // persistent grid, since a row's CTAs must be co-resident.
    const int64_t grid =
        shape.split == 1
            ? std::min<int64_t>((p->rows + layer_norm_rows_per_step(
                                               shape, fwd_rows_at_once(TPR, VEC)) -
                                 1) / layer_norm_rows_per_step(
                                          shape, fwd_rows_at_once(TPR, VEC)),
                                (int64_t)1 << 30)
            : layer_norm_grid(p->rows, shape, fwd_rows_at_once(TPR, VEC), occ,
                              f.sm_count);
    const int64_t exchange =
        layer_norm_split_exchange_bytes(p->rows, shape.split, sizeof(A));
    if (workspace_bytes) {
        *workspace_bytes = exchange;
        return GEMSOPS_OK;
    }
    if (grid < shape.split) {
        return gemsops_fail(st, GEMSOPS_ERR_VALUE,
                            "layer_norm: a row of %lld elements needs %d "
                            "co-resident CTAs; device %d holds fewer",
                            (long long)p->cols, shape.split, p->device_id);
    }
    if (p->workspace_bytes < exchange) {
        return gemsops_fail(st, GEMSOPS_ERR_VALUE,
                            "layer_norm_fwd: workspace has %lld bytes, the "
                            "launch needs %lld",
                            (long long)p->workspace_bytes, (long long)exchange);
    }
    fwd_args<T, P> a;
    a.x = static_cast<const T *>(p->x);
    a.y = static_cast<T *>(p->y);
    a.w = static_cast<const P *>(p->weight);
    a.b = static_cast<const P *>(p->bias);
    a.mean = static_cast<A *>(p->mean);
    a.rstd = static_cast<A *>(p->rstd);
    a.partials = static_cast<A *>(p->workspace);
    a.counters = reinterpret_cast<unsigned *>(
        static_cast<char *>(p->workspace) +
        (exchange ? exchange - p->rows * 4 : 0));
    a.rows = p->rows;
    a.cols = p->cols;
    a.x_stride = p->x_row_stride;
    a.y_stride = p->y_row_stride;
    a.split = shape.split;
    a.eps = (A)p->eps;
    layer_norm_fwd_registers<T, P, TPR, VEC>
        <<<(unsigned)grid, layer_norm_block_threads(TPR), 0,
           (cudaStream_t)p->stream>>>(a);
    GEMSOPS_CUDA_CHECK_LAUNCH(st, "layer_norm_fwd_registers");
    return GEMSOPS_OK;
}

// 16-byte accesses need every base pointer and row start 16-byte aligned
// and whole vectors per row.
template <typename T, typename P>
bool vector_ok(const gemsops_layer_norm_fwd_params *p)
{
    constexpr int V = 16 / sizeof(T);
    constexpr uintptr_t PA = sizeof(P) * V; // a vector of V parameters
    auto al = [](const void *q, uintptr_t n) {
        return q == nullptr || ((uintptr_t)q % n) == 0;
    };
    return p->cols % V == 0 && p->x_row_stride % V == 0 &&
           p->y_row_stride % V == 0 && al(p->x, 16) && al(p->y, 16) &&
           al(p->weight, PA) && al(p->bias, PA);
}

template <typename T, typename P, int VEC>
int dispatch_tpr(const gemsops_layer_norm_fwd_params *p, layer_norm_shape s,
                 int64_t *ws, gemsops_status *st)
{
    switch (s.tpr) {
    case 4: return run<T, P, 4, VEC>(p, s, ws, st);
    case 8: return run<T, P, 8, VEC>(p, s, ws, st);
    case 16: return run<T, P, 16, VEC>(p, s, ws, st);
    case 32: return run<T, P, 32, VEC>(p, s, ws, st);
    case 128: return run<T, P, 128, VEC>(p, s, ws, st);
    case 256: return run<T, P, 256, VEC>(p, s, ws, st);
    case 512:
        if constexpr (fwd_max_tpr<T>() >= 512) {
            return run<T, P, 512, VEC>(p, s, ws, st);
        }
        [[fallthrough]];
    default:
        return gemsops_fail(st, GEMSOPS_ERR_RUNTIME,
                            "layer_norm_fwd: no kernel for %d threads/row",
                            s.tpr);
    }
}

template <typename T, typename P>
int launch(const gemsops_layer_norm_fwd_params *p, int64_t *ws,
           gemsops_status *st)
{
    device_guard guard;
    GEMSOPS_CUDA_CHECK(st, guard.enter(p->device_id));
    layer_norm_shape s =
        layer_norm_choose_shape(p->cols, fwd_elems<T>(), fwd_max_tpr<T>());
    if (vector_ok<T, P>(p)) {
        return dispatch_tpr<T, P, 16 / sizeof(T)>(p, s, ws, st);
    }
    return dispatch_tpr<T, P, 1>(p, s, ws, st);
}

// The one dtype switch: (input dtype, parameter dtype) -> launcher.
int dispatch(const gemsops_layer_norm_fwd_params *p, int64_t *ws,
             gemsops_status *st)
{
    const bool same = p->param_dtype == p->dtype;
    switch (p->dtype) {
    case GEMSOPS_FLOAT32:
        return launch<float, float>(p, ws, st);
    case GEMSOPS_FLOAT64:
        return launch<double, double>(p, ws, st);
    case GEMSOPS_FLOAT16:
        return same ? launch<__half, __half>(p, ws, st)
                    : launch<__half, float>(p, ws, st);
    case GEMSOPS_BFLOAT16:
        return same ? launch<__nv_bfloat16, __nv_bfloat16>(p, ws, st)
                    : launch<__nv_bfloat16, float>(p, ws, st);
    default:
        return gemsops_fail(st, GEMSOPS_ERR_TYPE,
                            "layer_norm: unsupported dtype %s on CUDA",
                            gemsops_dtype_name(p->dtype));
    }
}

} // namespace
} // namespace gemsops

extern "C" int gemsops_layer_norm_fwd_cuda(
    const struct gemsops_layer_norm_fwd_params *p, gemsops_status *st)
{
    return gemsops::dispatch(p, nullptr, st);
}

extern "C" int gemsops_layer_norm_fwd_workspace_cuda(
    const struct gemsops_layer_norm_fwd_params *p, int64_t *bytes,
    gemsops_status *st)
{
    return gemsops::dispatch(p, bytes, st);
}
