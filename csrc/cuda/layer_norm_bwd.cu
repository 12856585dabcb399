// LayerNorm backward, fused: dx for every row and dW/dB in ONE kernel.
//
//   xhat = (x - mean) * rstd,  g = w * dy
//   dx = rstd * (g - (xhat * c1 + c2) / N),  c1 = sum g*xhat, c2 = sum g
//   dW[c] = sum_rows dy * xhat,  dB[c] = sum_rows dy
//
// Work split: as in the forward (layer_norm_plan.cuh), TPR threads own a row
// (or a slab of it), E elements each in registers. A thread always owns the
// same columns, so while the CTA walks its rows in a grid-stride loop it
// keeps dW/dB partial sums for those columns in fp32 registers. At the end
// the CTA sums its row groups' partials in shared memory and issues one
// atomicAdd per column per CTA (dW and dB) into fp32 accumulators: the
// classic second kernel that re-reads x and dy for dW/dB disappears.
// Same-address atomics serialise, so the accumulators come in stripes (row
// group g adds into stripe g % S, ~16 groups per stripe); a tiny
// column-parallel kernel sums the S stripes and rounds to the parameters'
// dtype (2 * N * S fp32 reads, not a pass over x or dy).
//
// Deterministic mode: each row group stores its partials to
// workspace[group][2N] instead (no atomics), and the same small kernel sums
// them in group order, so repeated runs are bitwise identical.
//
// Rows longer than 1024 * E are split over co-resident CTAs that exchange
// their (c1, c2) partials through global memory (split_exchange): x and dy
// are still read once. This is the long-row path; there is no re-read.
//
// Bytes: read x and dy once, write dx once (3 * N * sizeof(T) per row);
// mean/rstd per row; dW/dB: 2 * N atomics per CTA (grid ~ #SMs * occupancy).
#include "layer_norm_plan.cuh"
#include "gemsops/layer_norm.h"

namespace gemsops {
namespace {

// Elements per thread: x, dy and the dW/dB accumulators all live in
// registers, so fewer than in the forward (1024-thread CTAs get 64 regs).
// Each CTA adds 2 * cols atomics; owning at least this many rows keeps
// them a small fraction of the 3 * cols * rows elements moved.
constexpr int64_t kMinRowsPerCta = 8;

// Two rows per step (loads in flight, barriers shared), except where
// registers are short: scalar variants, fp64, 1024-thread CTAs.
__host__ __device__ constexpr int bwd_rows_at_once(int vec, int block)
{
    return (vec > 2 && block < 1024) ? 2 : 1;
}

template <typename T> __host__ __device__ constexpr int bwd_elems() { return sizeof(T) == 8 ? 4 : 8; }

template <typename T, typename P> struct bwd_args {
    const T *dy;
    const T *x;
    const P *w;
    const acc_t<T> *mean;
    const acc_t<T> *rstd;
    T *dx;               // NULL: no dx wanted
    P *dw;               // outputs, NULL when not wanted
    P *db;
    acc_t<T> *stripes;   // atomics: [n_stripes][2 * cols] (dW then dB)
    int n_stripes;       // row group g adds into stripe g % n_stripes
    acc_t<T> *partials;  // deterministic: [groups][2 * cols]
    acc_t<T> *exchange;  // split > 1: [rows][split][2]
    unsigned *counters;  // split > 1: [rows]
    int64_t rows, cols, dy_stride, x_stride, dx_stride;
    int split;
    bool deterministic;
};

// Registers: as layer_norm_min_ctas, but a 128-thread CTA holding several
// short rows (and their shared-memory column sums) gets 640 threads' worth.
constexpr int bwd_min_ctas(int tpr)
{
    return tpr < 128 ? 5 : layer_norm_min_ctas(tpr);
}

template <typename T, typename P, int TPR, int VEC>
__global__ void __launch_bounds__(TPR < 128 ? 128 : TPR, bwd_min_ctas(TPR))
    layer_norm_bwd_fused_atomic(const bwd_args<T, P> a)
{
    using A = acc_t<T>;
    constexpr int E = bwd_elems<T>();
    constexpr int ITEMS = E / VEC;
    constexpr int BLOCK = TPR < 128 ? 128 : TPR;
    constexpr int ROWS_PER_CTA = BLOCK / TPR;
    constexpr int R = bwd_rows_at_once(VEC, BLOCK);
    constexpr int SLAB = TPR * E;
    constexpr int STEP = TPR * VEC;
    __shared__ A red[2 * 32 * 2 * R];
    __shared__ A merged[R][2];
    __shared__ A colsum[ROWS_PER_CTA > 1 ? ROWS_PER_CTA * SLAB : 1];
    int parity = 0;

    const int lane = threadIdx.x % TPR;
    const int slab = blockIdx.x % a.split;
    const int64_t group = blockIdx.x / a.split;
    const int64_t groups = gridDim.x / a.split;
    const int64_t slab0 = (int64_t)slab * SLAB;
    const int64_t col0 = slab0 + lane * VEC;
    const int64_t col_end = min(slab0 + SLAB, a.cols);
    const int lim = (int)(col_end - col0); // item i valid: i * STEP < lim
    const bool want_dwb = a.dw || a.db;
    const A inv_n = A(1) / (A)a.cols;

    A dw[ITEMS][VEC], db[ITEMS][VEC];
#pragma unroll
    for (int i = 0; i < ITEMS; i++) {
#pragma unroll
        for (int v = 0; v < VEC; v++) {
            dw[i][v] = 0;
            db[i][v] = 0;
        }
    }
    // Weights are re-read (from L1) in each pass rather than pinned in
    // registers: the registers go to the dW/dB accumulators.
    auto load_w = [&](int i) {
        vec_t<P, VEC> wv;
        if (a.w) {
            wv = load_vec<P, VEC>(a.w + col0 + i * STEP);
        }
        else {
#pragma unroll
            for (int v = 0; v < VEC; v++) {
                wv.v[v] = from_acc<P>(A(1));
            }
        }
        return wv;
    };

    const int64_t step_rows = groups * ROWS_PER_CTA * R;
    vec_t<T, VEC> xn[R][ITEMS], dn[R][ITEMS];
    A mean_n[R], rstd_n[R];
    auto load_rows = [&](int64_t first) {
#pragma unroll
        for (int r = 0; r < R; r++) {
            const int64_t rr = first + r * ROWS_PER_CTA + threadIdx.x / TPR;
            const bool ok = rr < a.rows;
            mean_n[r] = ok ? a.mean[rr] : A(0);
            rstd_n[r] = ok ? a.rstd[rr] : A(0);
#pragma unroll
            for (int i = 0; i < ITEMS; i++) {
                if (ok && i * STEP < lim) {
                    xn[r][i] = load_vec<T, VEC>(a.x + rr * a.x_stride + col0 +
                                                i * STEP);
                    dn[r][i] = load_vec<T, VEC>(a.dy + rr * a.dy_stride +
                                                col0 + i * STEP);
                }
                else {
#pragma unroll
                    for (int v = 0; v < VEC; v++) {
                        xn[r][i].v[v] = from_acc<T>(A(0));
                        dn[r][i].v[v] = from_acc<T>(A(0));
                    }
                }
            }
        }
    };
    for (int64_t base = group * ROWS_PER_CTA * R; base < a.rows;
         base += step_rows) {
        int64_t row[R];
        bool row_ok[R];
        A mean[R], rstd[R], c[2 * R];
        // x and dy stay in their storage type; xhat and g are recomputed
        // in the second pass instead of being held as fp32.
        vec_t<T, VEC> xv[R][ITEMS], dv[R][ITEMS];
        load_rows(base);
#pragma unroll
        for (int r = 0; r < R; r++) {
            row[r] = base + r * ROWS_PER_CTA + threadIdx.x / TPR;
            row_ok[r] = row[r] < a.rows;
            mean[r] = mean_n[r];
            rstd[r] = rstd_n[r];
#pragma unroll
            for (int i = 0; i < ITEMS; i++) {
                xv[r][i] = xn[r][i];
                dv[r][i] = dn[r][i];
            }
        }
        if (a.dx) {
#pragma unroll
            for (int r = 0; r < 2 * R; r++) {
                c[r] = 0;
            }
#pragma unroll
            for (int i = 0; i < ITEMS; i++) {
                const vec_t<P, VEC> wv =
                    i * STEP < lim ? load_w(i) : vec_t<P, VEC>{};
#pragma unroll
                for (int r = 0; r < R; r++) {
#pragma unroll
                    for (int v = 0; v < VEC; v++) {
                        const A xh = (to_acc<A>(xv[r][i].v[v]) - mean[r]) * rstd[r];
                        const A g = to_acc<A>(dv[r][i].v[v]) * to_acc<A>(wv.v[v]);
                        c[2 * r] += g * xh;
                        c[2 * r + 1] += g;
                    }
                }
            }
            row_sum<TPR, 2 * R>(c, red, parity);
            if (a.split > 1) {
                if (threadIdx.x == 0) {
                    for (int r = 0; r < R; r++) {
                        if (!row_ok[r]) {
                            continue;
                        }
                        const A *all = split_exchange(a.exchange, a.counters,
                                                      row[r], slab, a.split,
                                                      c[2 * r], c[2 * r + 1]);
                        A s0 = 0, s1 = 0;
                        for (int k = 0; k < a.split; k++) {
                            s0 += __ldcg(all + 2 * k);
                            s1 += __ldcg(all + 2 * k + 1);
                        }
                        merged[r][0] = s0;
                        merged[r][1] = s1;
                    }
                }
                __syncthreads();
#pragma unroll
                for (int r = 0; r < R; r++) {
                    c[2 * r] = merged[r][0];
                    c[2 * r + 1] = merged[r][1];
                }
                __syncthreads(); // merged[] is rewritten for the next rows
            }
        }
#pragma unroll
        for (int i = 0; i < ITEMS; i++) {
            if (i * STEP >= lim) {
                continue;
            }
            const vec_t<P, VEC> wv = load_w(i);
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (!row_ok[r]) {
                    continue; // (masked loads make its dW/dB terms zero)
                }
                A out[VEC];
#pragma unroll
                for (int v = 0; v < VEC; v++) {
                    const A xh = (to_acc<A>(xv[r][i].v[v]) - mean[r]) * rstd[r];
                    const A d = to_acc<A>(dv[r][i].v[v]);
                    const A g = d * to_acc<A>(wv.v[v]);
                    out[v] = rstd[r] * (g - (xh * c[2 * r] + c[2 * r + 1]) * inv_n);
                    dw[i][v] += d * xh;
                    db[i][v] += d;
                }
                if (a.dx) {
                    store_rounded<T, VEC>(a.dx + row[r] * a.dx_stride + col0 +
                                              i * STEP,
                                          out);
                }
            }
        }
    }
    if (!want_dwb) {
        return;
    }

    // One value per column per CTA: sum the CTA's row groups, then emit.
    A *const stripe =
        a.stripes + (int64_t)((int)group % a.n_stripes) * 2 * a.cols;
    auto emit = [&](int64_t col, A vw, A vb) {
        if (a.deterministic) {
            A *part = a.partials + group * 2 * a.cols;
            part[col] = vw;
            part[a.cols + col] = vb;
        }
        else {
            if (a.dw) {
                atomicAdd(stripe + col, vw);
            }
            if (a.db) {
                atomicAdd(stripe + a.cols + col, vb);
            }
        }
    };
    if constexpr (ROWS_PER_CTA == 1) {
#pragma unroll
        for (int i = 0; i < ITEMS; i++) {
#pragma unroll
            for (int v = 0; v < VEC; v++) {
                if (i * STEP + v < lim) {
                    emit(col0 + i * STEP + v, dw[i][v], db[i][v]);
                }
            }
        }
    }
    else {
        const int sub = threadIdx.x / TPR;
        A totals[2][(SLAB + BLOCK - 1) / BLOCK];
#pragma unroll
        for (int which = 0; which < 2; which++) {
#pragma unroll
            for (int i = 0; i < ITEMS; i++) {
#pragma unroll
                for (int v = 0; v < VEC; v++) {
                    colsum[sub * SLAB + (i * TPR + lane) * VEC + v] =
                        which == 0 ? dw[i][v] : db[i][v];
                }
            }
            __syncthreads();
#pragma unroll
            for (int k = 0; k < (SLAB + BLOCK - 1) / BLOCK; k++) {
                const int j = threadIdx.x + k * BLOCK;
                A s = 0;
                if (j < SLAB) {
                    for (int r = 0; r < ROWS_PER_CTA; r++) {
                        s += colsum[r * SLAB + j];
                    }
                }
                totals[which][k] = s;
            }
            __syncthreads();
        }
#pragma unroll
        for (int k = 0; k < (SLAB + BLOCK - 1) / BLOCK; k++) {
            const int j = threadIdx.x + k * BLOCK;
            if (j < SLAB && slab0 + j < col_end) {
                emit(slab0 + j, totals[0][k], totals[1][k]);
            }
        }
    }

}

// Second kernel: column j sums its `parts` partial sums (stripes, or the
// deterministic mode's per-group partials) in order and rounds once to the
// parameters' dtype. Coalesced across threads; independent loads unrolled.
template <typename A, typename P>
__global__ void layer_norm_bwd_sum_partials(const A *partials, int64_t parts,
                                            int64_t cols, P *dw, P *db)
{
    const int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (j >= 2 * cols) {
        return;
    }
    A s = 0;
#pragma unroll 8
    for (int64_t gi = 0; gi < parts; gi++) {
        s += partials[gi * 2 * cols + j];
    }
    P *out = j < cols ? dw : db;
    if (out) {
        out[j < cols ? j : j - cols] = from_acc<P>(s);
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
                               out, layer_norm_bwd_fused_atomic<T, P, TPR, VEC>,
                               layer_norm_block_threads(TPR), 0));
    if (*out < 1) {
        return gemsops_fail(st, GEMSOPS_ERR_RUNTIME,
                            "layer_norm_bwd: kernel cannot be resident on "
                            "device %d",
                            device);
    }
    if (device < 64) {
        cache[device] = *out;
    }
    return GEMSOPS_OK;
}

inline int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }

// Same-address atomics serialise in L2: with G row groups adding into one
// accumulator per column, the tail of the kernel waits ~G atomic latencies.
// Row groups spread over stripes so that at most ~16 share an address.
inline int bwd_stripes(int64_t groups, int64_t cols, size_t acc_size)
{
    int64_t n = (groups + 15) / 16;
    const int64_t cap = ((int64_t)8 << 20) / (2 * cols * (int64_t)acc_size);
    n = n > 32 ? 32 : n;
    n = n > cap ? cap : n;
    return n < 1 ? 1 : (int)n;
}

// Workspace: [stripes][split exchange + counters] are zeroed by one memset;
// [deterministic partials] follow and need no zeroing.
struct bwd_layout {
    int n_stripes;
    int64_t exchange, counters, partials, zeroed, total;
};

template <typename T, typename P>
bwd_layout plan_layout(const gemsops_layer_norm_bwd_params *p,
                       layer_norm_shape s, int64_t grid)
{
    using A = acc_t<T>;
    const bool want_dwb = p->dweight || p->dbias;
    const int64_t groups = grid / s.split;
    bwd_layout l;
    l.n_stripes = bwd_stripes(groups, p->cols, sizeof(A));
    int64_t at = 0;
    if (want_dwb && !p->deterministic) {
        at += round16(l.n_stripes * 2 * p->cols * (int64_t)sizeof(A));
    }
    l.exchange = at;
    if (p->dx && s.split > 1) {
        at += round16(p->rows * s.split * 2 * (int64_t)sizeof(A));
        l.counters = at;
        at += round16(p->rows * 4);
    }
    else {
        l.counters = at;
    }
    l.zeroed = at;
    l.partials = at;
    if (want_dwb && p->deterministic) {
        at += round16(groups * 2 * p->cols * (int64_t)sizeof(A));
    }
    l.total = at;
    return l;
}

template <typename T, typename P, int TPR, int VEC>
int run(const gemsops_layer_norm_bwd_params *p, layer_norm_shape shape,
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
    const int64_t grid =
        layer_norm_grid(p->rows, shape,
                        bwd_rows_at_once(16 / sizeof(T),
                                         layer_norm_block_threads(TPR)),
                        occ, f.sm_count, kMinRowsPerCta);
    const bwd_layout l = plan_layout<T, P>(p, shape, grid);
    if (workspace_bytes) {
        *workspace_bytes = l.total;
        return GEMSOPS_OK;
    }
    if (grid < shape.split) {
        return gemsops_fail(st, GEMSOPS_ERR_VALUE,
                            "layer_norm_bwd: a row of %lld elements needs %d "
                            "co-resident CTAs; device %d holds fewer",
                            (long long)p->cols, shape.split, p->device_id);
    }
    if (p->workspace_bytes < l.total) {
        return gemsops_fail(st, GEMSOPS_ERR_VALUE,
                            "layer_norm_bwd: workspace has %lld bytes, the "
                            "launch needs %lld",
                            (long long)p->workspace_bytes, (long long)l.total);
    }
    char *ws = static_cast<char *>(p->workspace);
    cudaStream_t stream = (cudaStream_t)p->stream;
    bwd_args<T, P> a;
    a.dy = static_cast<const T *>(p->dy);
    a.x = static_cast<const T *>(p->x);
    a.w = static_cast<const P *>(p->weight);
    a.mean = static_cast<const A *>(p->mean);
    a.rstd = static_cast<const A *>(p->rstd);
    a.dx = static_cast<T *>(p->dx);
    a.dw = static_cast<P *>(p->dweight);
    a.db = static_cast<P *>(p->dbias);
    a.stripes = reinterpret_cast<A *>(ws);
    a.n_stripes = l.n_stripes;
    a.partials = reinterpret_cast<A *>(ws + l.partials);
    a.exchange = reinterpret_cast<A *>(ws + l.exchange);
    a.counters = reinterpret_cast<unsigned *>(ws + l.counters);
    a.rows = p->rows;
    a.cols = p->cols;
    a.dy_stride = p->dy_row_stride;
    a.x_stride = p->x_row_stride;
    a.dx_stride = p->dx_row_stride;
    a.split = shape.split;
    a.deterministic = p->deterministic != 0;

    if (l.zeroed > 0) {
        GEMSOPS_CUDA_CHECK(st, cudaMemsetAsync(ws, 0, l.zeroed, stream));
    }
    layer_norm_bwd_fused_atomic<T, P, TPR, VEC>
        <<<(unsigned)grid, layer_norm_block_threads(TPR), 0, stream>>>(a);
    GEMSOPS_CUDA_CHECK_LAUNCH(st, "layer_norm_bwd_fused_atomic");
    if (a.dw || a.db) {
        const int64_t n = 2 * p->cols;
        layer_norm_bwd_sum_partials<A, P>
            <<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(
                a.deterministic ? a.partials : a.stripes,
                a.deterministic ? grid / shape.split : l.n_stripes, p->cols,
                a.dw, a.db);
        GEMSOPS_CUDA_CHECK_LAUNCH(st, "layer_norm_bwd_sum_partials");
    }
    return GEMSOPS_OK;
}

template <typename T, typename P>
bool vector_ok(const gemsops_layer_norm_bwd_params *p)
{
    constexpr int V = 16 / sizeof(T);
    constexpr uintptr_t PA = sizeof(P) * V;
    auto al = [](const void *q, uintptr_t n) {
        return q == nullptr || ((uintptr_t)q % n) == 0;
    };
    return p->cols % V == 0 && p->x_row_stride % V == 0 &&
           p->dy_row_stride % V == 0 && p->dx_row_stride % V == 0 &&
           al(p->x, 16) && al(p->dy, 16) && al(p->dx, 16) &&
           al(p->weight, PA);
}

template <typename T, typename P, int VEC>
int dispatch_tpr(const gemsops_layer_norm_bwd_params *p, layer_norm_shape s,
                 int64_t *ws, gemsops_status *st)
{
    switch (s.tpr) {
    case 4: return run<T, P, 4, VEC>(p, s, ws, st);
    case 8: return run<T, P, 8, VEC>(p, s, ws, st);
    case 16: return run<T, P, 16, VEC>(p, s, ws, st);
    case 32: return run<T, P, 32, VEC>(p, s, ws, st);
    case 128: return run<T, P, 128, VEC>(p, s, ws, st);
    case 256: return run<T, P, 256, VEC>(p, s, ws, st);
    case 512: return run<T, P, 512, VEC>(p, s, ws, st);
    case 1024: return run<T, P, 1024, VEC>(p, s, ws, st);
    default:
        return gemsops_fail(st, GEMSOPS_ERR_RUNTIME,
                            "layer_norm_bwd: no kernel for %d threads/row",
                            s.tpr);
    }
}

template <typename T, typename P>
int launch(const gemsops_layer_norm_bwd_params *p, int64_t *ws,
           gemsops_status *st)
{
    device_guard guard;
    GEMSOPS_CUDA_CHECK(st, guard.enter(p->device_id));
    // 512 threads at most: a 1024-thread CTA has 64 registers a thread and
    // so takes one row per step. Only rows so long that 512-thread slabs
    // would need more CTAs than the SMs hold use 1024.
    layer_norm_shape s = layer_norm_choose_shape(p->cols, bwd_elems<T>(), 512);
    device_facts f;
    if (get_device_facts(p->device_id, &f, st)) {
        return st->code;
    }
    if (s.split > f.sm_count) {
        s = layer_norm_choose_shape(p->cols, bwd_elems<T>(), 1024);
    }
    if (vector_ok<T, P>(p)) {
        return dispatch_tpr<T, P, 16 / sizeof(T)>(p, s, ws, st);
    }
    return dispatch_tpr<T, P, 1>(p, s, ws, st);
}

int dispatch(const gemsops_layer_norm_bwd_params *p, int64_t *ws,
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
                            "layer_norm_bwd: unsupported dtype %s on CUDA",
                            gemsops_dtype_name(p->dtype));
    }
}

} // namespace
} // namespace gemsops

extern "C" int gemsops_layer_norm_bwd_cuda(
    const struct gemsops_layer_norm_bwd_params *p, gemsops_status *st)
{
    return gemsops::dispatch(p, nullptr, st);
}

extern "C" int gemsops_layer_norm_bwd_workspace_cuda(
    const struct gemsops_layer_norm_bwd_params *p, int64_t *bytes,
    gemsops_status *st)
{
    return gemsops::dispatch(p, bytes, st);
}
