// prod backward on CUDA: grad_x[o, r, i] = g[o, i] * P(o, <r, i) * S(o, >r, i)
// where P and S are the exclusive prefix and suffix products along the
// reduced dim r. Exact where x holds zeros (no division by x) and no host
// sync (torch's backward looks for zeros on the host first).
//
// x is contiguous here (the Python layer makes it so): [O, R, I] with O the
// dims before `dim`, I those after; a full product is [1, numel, 1].
//
// Work split: a line (o, i) is cut into tiles a CTA holds in registers.
//   rows (I == 1): a thread owns L = 16 consecutive elements; G threads
//     per row (up to the CTA) scan their products with shuffles (warps
//     through shared memory); the thread then forms every element's
//     exclusive product from its registers: a forward running prefix and
//     a backward running suffix.
//   cols (I > 1): a thread owns C = 8 rows of a 16-byte column vector; the
//     TY threads down a tile meet in shared memory.
// A line longer than one tile (S tiles) takes two more small steps first:
// the tiles' products (the forward's kernels, into a workspace), then each
// line's exclusive scan over its S tile products (one kernel); the tile
// kernel multiplies those in.
//
// Bytes: x read once (S == 1) or twice (S > 1), grad_x written once, g and
// 3 * S * lines accumulators.
//
// Test: python -m pytest tests/test_prod.py -m cuda -k backward. Time:
// python -m pytest benchmark/test_reduction_perf.py -k prod_backward; A/B
// a change with tools/ab.sh. Measurements: docs/performance.md.
#include "prod_reduce.cuh"

namespace gemsops {
namespace {

constexpr int kRowElems = 16; // L: consecutive elements per thread (rows)
constexpr int kColRows = 8; // C: rows per thread (cols)

// ---- exclusive scans of tile products along each line -------------------
template <typename A>
struct prod_scan_args {
    const A *part; // [outer, splits, inner] tile products
    A *pre, *suf; // same layout: exclusive prefix, suffix
    int64_t outer, splits, inner;
};

// (A minimum of one CTA: with none, ptxas held the sm_80 build to 32-40
// registers and spilled.)
template <typename A>
__global__ void __launch_bounds__(kProdBlock, 1)
    prod_scan_kernel(const prod_scan_args<A> a)
{
    __shared__ A chunk_pre[kProdBlock], chunk_suf[kProdBlock];
    if (a.inner > 1) { // a thread per line, coalesced across i
        for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
             j < a.outer * a.inner; j += (int64_t)gridDim.x * blockDim.x) {
            const int64_t base =
                j / a.inner * a.splits * a.inner + j % a.inner;
            A run = A(1);
            for (int64_t s = 0; s < a.splits; s++) {
                a.pre[base + s * a.inner] = run;
                run *= a.part[base + s * a.inner];
            }
            run = A(1);
            for (int64_t s = a.splits - 1; s >= 0; s--) {
                a.suf[base + s * a.inner] = run;
                run *= a.part[base + s * a.inner];
            }
        }
        return;
    }
    // a CTA per line: thread t owns a contiguous chunk of the splits
    const int64_t chunk = ceil_div(a.splits, kProdBlock);
    for (int64_t o = blockIdx.x; o < a.outer; o += gridDim.x) {
        const A *p = a.part + o * a.splits;
        const int64_t lo = min(threadIdx.x * chunk, a.splits);
        const int64_t hi = min(lo + chunk, a.splits);
        A mine = A(1);
        for (int64_t s = lo; s < hi; s++) {
            mine *= p[s];
        }
        chunk_pre[threadIdx.x] = mine;
        chunk_suf[threadIdx.x] = mine;
        __syncthreads();
        // inclusive Hillis-Steele scans, both directions
        for (int d = 1; d < kProdBlock; d *= 2) {
            const int t = threadIdx.x;
            const A l = t >= d ? chunk_pre[t - d] : A(1);
            const A r = t + d < kProdBlock ? chunk_suf[t + d] : A(1);
            __syncthreads();
            chunk_pre[t] *= l;
            chunk_suf[t] *= r;
            __syncthreads();
        }
        A run = threadIdx.x > 0 ? chunk_pre[threadIdx.x - 1] : A(1);
        for (int64_t s = lo; s < hi; s++) {
            a.pre[o * a.splits + s] = run;
            run *= p[s];
        }
        run = threadIdx.x + 1 < kProdBlock ? chunk_suf[threadIdx.x + 1] : A(1);
        for (int64_t s = hi - 1; s >= lo; s--) {
            a.suf[o * a.splits + s] = run;
            run *= p[s];
        }
        __syncthreads(); // chunk_* reused by the next line
    }
}

// Exclusive prefix and suffix products of v over the G threads of a group.
// Every thread of the CTA calls it (G > 32 meets in shared memory).
template <typename A>
__device__ __forceinline__ void group_exclusive(A v, int G, A *warp_tot,
                                                A &pre, A &suf)
{
    const int w = G < 32 ? G : 32;
    const int lane = threadIdx.x % w;
    A incl_p = v, incl_s = v;
    for (int d = 1; d < w; d *= 2) {
        const A up = __shfl_up_sync(0xffffffffu, incl_p, d, w);
        const A dn = __shfl_down_sync(0xffffffffu, incl_s, d, w);
        if (lane >= d) {
            incl_p *= up;
        }
        if (lane + d < w) {
            incl_s *= dn;
        }
    }
    pre = __shfl_up_sync(0xffffffffu, incl_p, 1, w);
    suf = __shfl_down_sync(0xffffffffu, incl_s, 1, w);
    pre = lane == 0 ? A(1) : pre;
    suf = lane == w - 1 ? A(1) : suf;
    if (G > 32) {
        const int warp = threadIdx.x / 32;
        if (lane == 31) {
            warp_tot[warp] = incl_p; // the warp's whole product
        }
        __syncthreads();
        const int first = threadIdx.x / G * (G / 32);
        for (int k = first; k < warp; k++) {
            pre *= warp_tot[k];
        }
        for (int k = warp + 1; k < first + G / 32; k++) {
            suf *= warp_tot[k];
        }
        __syncthreads();
    }
}

// ---- rows: I == 1 ----------------------------------------------------------
template <typename T>
struct prod_bwd_rows_args {
    const T *x, *g;
    T *gx;
    int64_t rows, len;
    int G; // threads per row, power of two
    int64_t splits; // tiles per row (G == 256 when > 1)
    const acc_t<T> *pre, *suf; // [rows, splits] or NULL when splits == 1
};

template <typename T, int VEC>
__global__ void __launch_bounds__(kProdBlock)
    prod_bwd_rows_kernel(const prod_bwd_rows_args<T> a)
{
    using A = acc_t<T>;
    constexpr int L = kRowElems;
    __shared__ A warp_tot[kProdBlock / 32];
    const int G = a.G;
    const int rows_per_cta = kProdBlock / G;
    const int lane = threadIdx.x % G;
    const int64_t groups = ceil_div(a.rows, rows_per_cta);
    for (int64_t item = blockIdx.x; item < groups * a.splits;
         item += gridDim.x) {
        const int64_t s = item % a.splits;
        const int64_t row = item / a.splits * rows_per_cta + threadIdx.x / G;
        const bool row_ok = row < a.rows;
        const int64_t e0 = (s * G + lane) * L;
        const T *xp = a.x + row * a.len + e0;
        A v[L];
#pragma unroll
        for (int j = 0; j < L; j += VEC) {
            A t[VEC];
            if (row_ok && e0 + j < a.len) { // VEC divides len when > 1
                prod_load_vec<T, VEC>(xp + j, t);
            }
            else {
#pragma unroll
                for (int k = 0; k < VEC; k++) {
                    t[k] = A(1);
                }
            }
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                v[j + k] = t[k];
            }
        }
        A own[L];
#pragma unroll
        for (int j = 0; j < L; j++) {
            own[j] = v[j];
        }
        A pre, suf;
        group_exclusive(prod_fold<L>(own), G, warp_tot, pre, suf);
        if (!row_ok) {
            continue; // after the CTA-wide exchange
        }
        A left = pre * to_acc<A>(a.g[row]), right = suf;
        if (a.pre != nullptr) {
            left *= a.pre[row * a.splits + s];
            right *= a.suf[row * a.splits + s];
        }
        A out[L];
#pragma unroll
        for (int j = 0; j < L; j++) { // out[j] = left * v[0..j)
            out[j] = left;
            left *= v[j];
        }
#pragma unroll
        for (int j = L - 1; j >= 0; j--) { // times v(j..L) * right
            out[j] *= right;
            right *= v[j];
        }
        T *gp = a.gx + row * a.len + e0;
#pragma unroll
        for (int j = 0; j < L; j += VEC) {
            if (e0 + j < a.len) {
                A o[VEC];
#pragma unroll
                for (int k = 0; k < VEC; k++) {
                    o[k] = out[j + k];
                }
                store_rounded<T, VEC>(gp + j, o);
            }
        }
    }
}

// ---- cols: I > 1 -----------------------------------------------------------
template <typename T>
struct prod_bwd_cols_args {
    const T *x, *g;
    T *gx;
    int64_t outer, len, inner;
    int tx; // threads across column vectors
    int64_t ivecs, iblocks, splits;
    const acc_t<T> *pre, *suf; // [outer, splits, inner] or NULL
};

template <typename T, int VEC>
__global__ void __launch_bounds__(kProdBlock)
    prod_bwd_cols_kernel(const prod_bwd_cols_args<T> a)
{
    using A = acc_t<T>;
    constexpr int C = kColRows;
    __shared__ A red[VEC * kProdBlock];
    const int TX = a.tx, TY = kProdBlock / a.tx;
    const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;
    const int64_t items = a.outer * a.iblocks * a.splits;
    for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
        const int64_t s = item % a.splits;
        const int64_t ib = item / a.splits % a.iblocks;
        const int64_t o = item / (a.splits * a.iblocks);
        const int64_t iv = ib * TX + tx;
        const bool valid = iv < a.ivecs;
        const int64_t r0 = (s * TY + ty) * C;
        const int64_t col = iv * VEC;
        A v[C][VEC], own[VEC];
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            own[k] = A(1);
        }
#pragma unroll
        for (int c = 0; c < C; c++) {
            if (valid && r0 + c < a.len) {
                prod_load_vec<T, VEC>(a.x + (o * a.len + r0 + c) * a.inner +
                                          col,
                                      v[c]);
            }
            else {
#pragma unroll
                for (int k = 0; k < VEC; k++) {
                    v[c][k] = A(1);
                }
            }
            prod_mul<VEC>(own, v[c]);
        }
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            red[k * kProdBlock + threadIdx.x] = own[k];
        }
        __syncthreads();
        A left[VEC], right[VEC];
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            left[k] = A(1);
            right[k] = A(1);
            for (int t = 0; t < TY; t++) { // the other threads of the tile
                const A w = red[k * kProdBlock + t * TX + tx];
                if (t < ty) {
                    left[k] *= w;
                }
                if (t > ty) {
                    right[k] *= w;
                }
            }
        }
        __syncthreads(); // red is rewritten by the next item
        if (!valid) {
            continue;
        }
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            const int64_t j = o * a.inner + col + k;
            left[k] *= to_acc<A>(a.g[j]);
            if (a.pre != nullptr) {
                const int64_t w = (o * a.splits + s) * a.inner + col + k;
                left[k] *= a.pre[w];
                right[k] *= a.suf[w];
            }
        }
        A out[C][VEC];
#pragma unroll
        for (int c = 0; c < C; c++) {
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                out[c][k] = left[k];
                left[k] *= v[c][k];
            }
        }
#pragma unroll
        for (int c = C - 1; c >= 0; c--) {
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                out[c][k] *= right[k];
                right[k] *= v[c][k];
            }
            if (r0 + c < a.len) {
                store_rounded<T, VEC>(a.gx + (o * a.len + r0 + c) * a.inner +
                                          col,
                                      out[c]);
            }
        }
    }
}

// ---- the plan --------------------------------------------------------------
struct bwd_plan {
    int64_t outer, len, inner;
    bool vec;
    int G; // rows
    prod_cols_shape cols; // cols (rchunk: the tile's rows)
    int64_t splits; // tiles per line
    int64_t tile; // rows: elements per tile
    int64_t lines_acc; // accumulators per array (0: no workspace)
};

template <typename T>
bwd_plan plan_bwd(const gemsops_prod_bwd_params *p)
{
    constexpr int V = 16 / sizeof(T);
    const gemsops_tensor *x = &p->x;
    bwd_plan pl{};
    pl.outer = 1;
    pl.inner = 1;
    if (p->dim < 0) {
        pl.len = gemsops_tensor_numel(x);
    }
    else {
        for (int d = 0; d < x->ndim; d++) {
            if (d < p->dim) {
                pl.outer *= x->sizes[d];
            }
            else if (d > p->dim) {
                pl.inner *= x->sizes[d];
            }
        }
        pl.len = x->sizes[p->dim];
    }
    const bool base_ok =
        (uintptr_t)x->data % 16 == 0 && (uintptr_t)p->grad_in % 16 == 0;
    if (pl.inner == 1) {
        pl.vec = base_ok && pl.len % V == 0;
        int64_t G = pow2_ceil(ceil_div(pl.len, kRowElems));
        pl.G = (int)(G > kProdBlock ? kProdBlock : G);
        pl.tile = (int64_t)pl.G * kRowElems;
        pl.splits = ceil_div(pl.len, pl.tile);
        pl.lines_acc = pl.splits > 1 ? pl.outer * pl.splits : 0;
    }
    else {
        prod_layout l{};
        l.inner = pl.inner;
        pl.vec = base_ok && pl.inner % V == 0;
        pl.cols = prod_cols_base(l, pl.vec ? V : 1);
        pl.cols.rchunk = (int64_t)(kProdBlock / pl.cols.tx) * kColRows;
        pl.splits = ceil_div(pl.len, pl.cols.rchunk);
        pl.cols.splits = pl.splits;
        pl.lines_acc = pl.splits > 1 ? pl.outer * pl.splits * pl.inner : 0;
    }
    return pl;
}

template <typename T>
int64_t workspace_bytes(const bwd_plan &pl)
{
    return 3 * pl.lines_acc * (int64_t)sizeof(acc_t<T>);
}

template <typename T, int VEC>
int run(const gemsops_prod_bwd_params *p, const bwd_plan &pl,
        gemsops_status *st)
{
    using A = acc_t<T>;
    cudaStream_t stream = (cudaStream_t)p->stream;
    const T *x = (const T *)p->x.data;
    A *part = nullptr, *pre = nullptr, *suf = nullptr;
    if (pl.lines_acc > 0) {
        part = (A *)p->workspace;
        pre = part + pl.lines_acc;
        suf = pre + pl.lines_acc;
    }
    if (pl.inner == 1) {
        if (part != nullptr) { // tile products: the forward's rows kernel
            const prod_rows_args<T>
                t{x,         pl.outer,      pl.len, pl.len / VEC, kProdBlock,
                  pl.splits, pl.tile / VEC, false,  nullptr,      part};
            prod_rows_kernel<T, VEC>
                <<<prod_grid(pl.outer * pl.splits), kProdBlock, 0, stream>>>(
                    t);
            GEMSOPS_CUDA_CHECK_LAUNCH(st, "prod_rows_kernel (tiles)");
            const prod_scan_args<A> sc{part, pre, suf, pl.outer, pl.splits, 1};
            prod_scan_kernel<A>
                <<<prod_grid(pl.outer), kProdBlock, 0, stream>>>(sc);
            GEMSOPS_CUDA_CHECK_LAUNCH(st, "prod_scan_kernel");
        }
        const prod_bwd_rows_args<T> a{x,
                                      (const T *)p->grad_out,
                                      (T *)p->grad_in,
                                      pl.outer,
                                      pl.len,
                                      pl.G,
                                      pl.splits,
                                      pre,
                                      suf};
        const int64_t ctas = ceil_div(pl.outer, kProdBlock / pl.G) * pl.splits;
        prod_bwd_rows_kernel<T, VEC>
            <<<prod_grid(ctas), kProdBlock, 0, stream>>>(a);
        GEMSOPS_CUDA_CHECK_LAUNCH(st, "prod_bwd_rows_kernel");
        return GEMSOPS_OK;
    }
    const prod_cols_shape &c = pl.cols;
    const int64_t ctas = pl.outer * c.iblocks * pl.splits;
    if (part != nullptr) {
        const prod_cols_args<T> t{x,        pl.outer, pl.len * pl.inner,
                                  pl.len,   pl.inner, pl.inner,
                                  c.tx,     c.ivecs,  c.iblocks,
                                  c.splits, c.rchunk, false,
                                  nullptr,  part};
        prod_cols_kernel<T, VEC>
            <<<prod_grid(ctas), kProdBlock, 0, stream>>>(t);
        GEMSOPS_CUDA_CHECK_LAUNCH(st, "prod_cols_kernel (tiles)");
        const prod_scan_args<A> sc{part,     pre,       suf,
                                   pl.outer, pl.splits, pl.inner};
        prod_scan_kernel<A>
            <<<prod_grid(ceil_div(pl.outer * pl.inner, kProdBlock)),
               kProdBlock, 0, stream>>>(sc);
        GEMSOPS_CUDA_CHECK_LAUNCH(st, "prod_scan_kernel");
    }
    const prod_bwd_cols_args<T> a{x,
                                  (const T *)p->grad_out,
                                  (T *)p->grad_in,
                                  pl.outer,
                                  pl.len,
                                  pl.inner,
                                  c.tx,
                                  c.ivecs,
                                  c.iblocks,
                                  pl.splits,
                                  pre,
                                  suf};
    prod_bwd_cols_kernel<T, VEC>
        <<<prod_grid(ctas), kProdBlock, 0, stream>>>(a);
    GEMSOPS_CUDA_CHECK_LAUNCH(st, "prod_bwd_cols_kernel");
    return GEMSOPS_OK;
}

template <typename T>
int launch(const gemsops_prod_bwd_params *p, gemsops_status *st)
{
    device_guard guard;
    GEMSOPS_CUDA_CHECK(st, guard.enter(p->x.device_id));
    const bwd_plan pl = plan_bwd<T>(p);
    if (workspace_bytes<T>(pl) > p->workspace_bytes) {
        return gemsops_fail(st, GEMSOPS_ERR_VALUE,
                            "prod_backward(): workspace of %lld bytes is too "
                            "small; the plan needs %lld (ask "
                            "prod_bwd_workspace)",
                            (long long)p->workspace_bytes,
                            (long long)workspace_bytes<T>(pl));
    }
    constexpr int V = 16 / sizeof(T);
    return pl.vec ? run<T, V>(p, pl, st) : run<T, 1>(p, pl, st);
}

template <typename T>
int query(const gemsops_prod_bwd_params *p, int64_t *bytes)
{
    *bytes = workspace_bytes<T>(plan_bwd<T>(p));
    return GEMSOPS_OK;
}

} // namespace
} // namespace gemsops

// The one dtype switch (only float inputs have gradients).
#define GEMSOPS_PROD_BWD_DISPATCH(dt, st, CALL)                            \
    switch (dt) {                                                          \
    case GEMSOPS_FLOAT32: {                                                \
        using T = float;                                                   \
        return CALL;                                                       \
    }                                                                      \
    case GEMSOPS_FLOAT64: {                                                \
        using T = double;                                                  \
        return CALL;                                                       \
    }                                                                      \
    case GEMSOPS_FLOAT16: {                                                \
        using T = __half;                                                  \
        return CALL;                                                       \
    }                                                                      \
    case GEMSOPS_BFLOAT16: {                                               \
        using T = __nv_bfloat16;                                           \
        return CALL;                                                       \
    }                                                                      \
    default:                                                               \
        return gemsops_fail((st), GEMSOPS_ERR_TYPE,                        \
                            "prod_backward: unsupported dtype %s on CUDA", \
                            gemsops_dtype_name(dt));                       \
    }

extern "C" int gemsops_prod_bwd_cuda(const struct gemsops_prod_bwd_params *p,
                                     gemsops_status *st)
{
    if (!gemsops_tensor_is_contiguous(&p->x)) {
        return gemsops_fail(st, GEMSOPS_ERR_VALUE,
                            "prod_backward(): the CUDA backward wants a "
                            "contiguous input (the Python layer copies)");
    }
    if (gemsops_tensor_numel(&p->x) == 0) {
        return GEMSOPS_OK;
    }
    GEMSOPS_PROD_BWD_DISPATCH(p->x.dtype, st, gemsops::launch<T>(p, st))
}

extern "C" int gemsops_prod_bwd_workspace_cuda(
    const struct gemsops_prod_bwd_params *p, int64_t *bytes,
    gemsops_status *st)
{
    *bytes = 0;
    GEMSOPS_PROD_BWD_DISPATCH(p->x.dtype, st, gemsops::query<T>(p, bytes))
}
