// LayerNorm backward, fused: dx for every row and dW/dB in ONE kernel.
//
//   xhat = (x - mean) * rstd,  g = w * dy
//   dx = rstd * (g - (xhat * c1 + c2) / N),  c1 = sum g*xhat, c2 = sum g
//   dW[c] = sum_rows dy * xhat,  dB[c] = sum_rows dy
//
// Work split: TPR threads own a row (or a slab of it), E elements each (8;
// 16 for fp16/bf16 where that pads no more columns; 4 in fp64); short rows
// share a 128-thread CTA. The grid is persistent: a CTA walks its rows in
// a grid-stride loop, and as a thread always owns the same columns, it
// keeps their dW/dB partial sums in fp32 registers across the rows, fed by
// a per-thread cp.async ring (layer_norm_bwd_row.cuh). At the end each CTA
// adds one value per column into striped fp32 accumulators and a small
// kernel sums the stripes (layer_norm_bwd_sum.cuh): the classic second
// kernel that re-reads x and dy for dW/dB disappears. Deterministic mode
// stores per-group partials instead and sums them in a fixed order, so
// repeated runs are bitwise identical.
//
// Rows longer than one CTA's threads hold (8192 elements; 4096 in fp64)
// are split over co-resident CTAs (slabs of 512 threads, two a SM) that
// exchange their (c1, c2) partials through global memory
// (layer_norm_bwd_split.cuh): x and dy are still read once. Where the
// exchange wait would stall every row, the lagged loop finishes each row
// one step late (plan_for says when). Rows of more slabs than the device
// holds at once take three launches that wait on no other CTA
// (layer_norm_bwd_two_pass.cuh).
//
// Bytes: read x and dy once, write dx once (3 * N * sizeof(T) per row);
// mean/rstd per row; dW/dB: 2 * N atomics per CTA (grid ~ #SMs *
// occupancy), then 2 * N * stripes fp32 read by the sum kernel.
//
// Files: layer_norm_bwd_plan.cuh (shapes, ring, grid, workspace),
// layer_norm_bwd_row.cuh (a thread's rows), layer_norm_bwd_split.cuh (the
// slabs' exchange), layer_norm_bwd_sum.cuh (dW/dB); here the kernel,
// plan(), launch() and the entry points.
//
// Test: python -m pytest tests/test_layer_norm.py -m cuda (split rows:
// -k "split or row_lengths or long_rows"; determinism: -k deterministic).
// Time: python -m pytest benchmark/test_layer_norm_perf.py -k backward, or
// one case: python tools/ln_time.py 16384,4096:bwd:bfloat16; A/B a change
// with tools/ab.sh. Measurements behind the choices: docs/performance.md.
#include <atomic>
#include <climits>
#include <type_traits>

#include "cuda_check.cuh"
#include "device.cuh"
#include "gemsops/layer_norm.h"
#include "gemsops/tensor.h"
#include "layer_norm_bwd_plan.cuh"
#include "layer_norm_bwd_row.cuh"
#include "layer_norm_bwd_sum.cuh"
#include "layer_norm_bwd_two_pass.cuh"
#include "pdl.cuh"

namespace gemsops {
namespace {

// L: the row loop; DH: its variant loading the fused add's dh early.
template <typename T, typename P, int TPR, int VEC, int E, bwd_loop L, bool DH>
__global__ void __launch_bounds__(TPR < 128 ? 128 : TPR,
                                  bwd_min_ctas(TPR, bwd_sm_threads<T, E>()))
    layer_norm_bwd_fused_atomic(const bwd_args<T, P> a)
{
    using Th = bwd_thread<T, P, TPR, VEC, E>;
    using A = acc_t<T>;
    extern __shared__ uint4 ring_words[];
    // row_sum's scratch: the paired loop reduces four values at once
    __shared__ A red[2 * 32 * (L == bwd_loop::paired ? 4 : 2)];
    __shared__ A merged[2 * 2];
    __shared__ A
        colsum[Th::ROWS_PER_CTA > 1 ? Th::ROWS_PER_CTA * Th::SLAB : 1];
    Th t(a, ring_words, red);
    typename Th::Sums dw, db;
    t.init_columns(dw, db);
    if constexpr (L == bwd_loop::lagged) {
        bwd_rows_lagged<DH>(t, merged, dw, db);
    }
    else if constexpr (L == bwd_loop::paired) {
        bwd_rows_paired<DH>(t, dw, db);
    }
    else {
        bwd_rows_whole<DH>(t, merged, dw, db);
    }
    if constexpr (Th::RING) {
        cp_async_wait<0>(); // no copy may outlive the CTA's shared memory
    }
    if (!t.want_dwb) {
        return;
    }
    bwd_emit(t, colsum, dw, db);
}

// CTAs of this instantiation resident per SM with its ring.
template <typename T, typename P, int TPR, int VEC, int E,
          bwd_loop L = bwd_loop::whole, bool DH = false>
int ctas_per_sm(int device, const device_facts &f, gemsops_status *st,
                int *out)
{
    const bwd_ring_plan r = plan_ring<T, P, TPR, VEC, E>(f);
    int total = 0;
    const void *kernel =
        (const void *)layer_norm_bwd_fused_atomic<T, P, TPR, VEC, E, L, DH>;
    if (resident_ctas(kernel, device, layer_norm_block_threads(TPR), r.smem,
                      &total, st)) {
        return st->code;
    }
    *out = total / f.sm_count;
    if (*out < 1) {
        return gemsops_fail(st, GEMSOPS_ERR_RUNTIME,
                            "layer_norm_bwd: kernel cannot be resident on "
                            "device %d",
                            device);
    }
    return GEMSOPS_OK;
}

// The fewest CTAs an SM among the kernels one plan may launch (both access
// widths, every loop and dh variant), so that the grid and the workspace
// do not depend on which of them runs and split rows stay co-resident.
// Asked of the occupancy calculator once per device, then read from a
// per-instantiation cache: the calculator's shared cache takes a lock and
// a search for each of the seven kernels, on every call.
template <typename T, typename P, int TPR, int E>
int plan_ctas_per_sm(int device, const device_facts &f, gemsops_status *st,
                     int *out)
{
    static std::atomic<int> known[kMaxDevices]; // 0: not asked yet
    *out = known[device].load(std::memory_order_relaxed);
    if (*out > 0) {
        return GEMSOPS_OK;
    }
    constexpr int V16 = 16 / sizeof(T);
    int occ = INT_MAX;
    const auto fit = [&](auto vec, auto loop, auto dh) -> int {
        int n = 0;
        if (ctas_per_sm<T, P, TPR, decltype(vec)::value, E,
                        decltype(loop)::value, decltype(dh)::value>(device, f,
                                                                    st, &n)) {
            return st->code;
        }
        occ = occ < n ? occ : n;
        return GEMSOPS_OK;
    };
    using v16 = std::integral_constant<int, V16>;
    using whole = std::integral_constant<bwd_loop, bwd_loop::whole>;
    using lagged = std::integral_constant<bwd_loop, bwd_loop::lagged>;
    using paired = std::integral_constant<bwd_loop, bwd_loop::paired>;
    using no_dh = std::false_type;
    using dh = std::bool_constant<bwd_has_dh_early<T, V16>()>;
    if (fit(v16{}, whole{}, no_dh{}) ||
        fit(std::integral_constant<int, 1>{}, whole{}, no_dh{})) {
        return st->code;
    }
    if constexpr (dh::value) {
        if (fit(v16{}, whole{}, dh{})) {
            return st->code;
        }
    }
    if constexpr (bwd_has_lagged<T, TPR, V16>()) {
        if (fit(v16{}, lagged{}, no_dh{}) || fit(v16{}, lagged{}, dh{})) {
            return st->code;
        }
    }
    if constexpr (bwd_has_paired<T, TPR, V16, E>()) {
        if (fit(v16{}, paired{}, no_dh{}) || fit(v16{}, paired{}, dh{})) {
            return st->code;
        }
    }
    known[device].store(occ, std::memory_order_relaxed);
    *out = occ;
    return GEMSOPS_OK;
}

// The plan of one instantiation (bwd_config names it).
template <typename T, typename P, int TPR, int VEC, int E>
int plan_for(const gemsops_layer_norm_bwd_params *p, const bwd_config &c,
             bwd_plan *out, gemsops_status *st)
{
    device_facts f;
    int occ = 0;
    if (get_device_facts(p->device_id, &f, st) ||
        plan_ctas_per_sm<T, P, TPR, E>(p->device_id, f, st, &occ)) {
        return st->code;
    }
    out->config = c;
    // dW and dB each add an accumulator a column (deterministic: a partial)
    const int acc_bytes = ((p->dweight != nullptr) + (p->dbias != nullptr)) *
                          (int)sizeof(acc_t<T>);
    out->grid =
        bwd_grid(p->rows, c.shape, occ, f.sm_count, acc_bytes, (int)sizeof(T));
    out->layout = plan_layout<T, P>(p, c.shape, out->grid);
    out->ring = plan_ring<T, P, TPR, VEC, E>(f);
    out->loop = bwd_loop::whole;
    if constexpr (bwd_has_lagged<T, TPR, VEC>()) {
        // The lagged loop holds a row back, so the ring prefetches one row
        // less. At 2 slabs the exchange wait is short and the deeper
        // prefetch wins; with 3 or more slabs, or 4 stages, the lagged loop
        // won or tied everywhere measured (docs/performance.md).
        const bool lag_pays = c.shape.split > 2 || out->ring.stages > 3;
        if (c.shape.split > 1 && p->dx && out->ring.stages >= 2 && lag_pays) {
            out->loop = bwd_loop::lagged;
        }
    }
    if constexpr (bwd_has_paired<T, TPR, VEC, E>()) {
        // the paired loop also holds a row back: a ring of 3 or more
        if (c.shape.split == 1 && p->dx && out->ring.stages >= 3) {
            out->loop = bwd_loop::paired;
        }
    }
    out->dh_early = bwd_has_dh_early<T, VEC>() && p->dh && p->dx;
    out->pdl = f.cc_major >= 9;
    return GEMSOPS_OK;
}

// Launches what plan_for planned, on a workspace of at least
// plan.layout.total bytes.
template <typename T, typename P, int TPR, int VEC, int E>
int launch_for(const gemsops_layer_norm_bwd_params *p, const bwd_plan &pl,
               gemsops_status *st)
{
    using A = acc_t<T>;
    const bwd_layout &l = pl.layout;
    char *ws = static_cast<char *>(p->workspace);
    cudaStream_t stream = (cudaStream_t)p->stream;
    bwd_args<T, P> a;
    a.dy = static_cast<const T *>(p->dy);
    a.x = static_cast<const T *>(p->x);
    a.w = static_cast<const P *>(p->weight);
    a.mean = static_cast<const A *>(p->mean);
    a.rstd = static_cast<const A *>(p->rstd);
    a.rms = p->rms != 0;
    a.dh = static_cast<const T *>(p->dh);
    a.dh_stride = p->dh_row_stride;
    a.dx = static_cast<T *>(p->dx);
    a.dw = static_cast<P *>(p->dweight);
    a.db = static_cast<P *>(p->dbias);
    a.stripes = reinterpret_cast<A *>(ws);
    a.n_stripes = l.n_stripes;
    a.partials = reinterpret_cast<A *>(ws + l.partials);
    a.exchange = reinterpret_cast<A *>(ws + l.exchange);
    a.rows = p->rows;
    a.cols = p->cols;
    a.dy_stride = p->dy_row_stride;
    a.x_stride = p->x_row_stride;
    a.dx_stride = p->dx_row_stride;
    a.split = pl.config.shape.split;
    a.stages = pl.ring.stages;
    a.deterministic = p->deterministic != 0;

    if (p->kept_zero && !p->known_zero) {
        // kept from now on: all of it zero, whatever this launch uses
        GEMSOPS_CUDA_CHECK(st,
                           cudaMemsetAsync(ws, 0, p->workspace_bytes, stream));
    }
    else {
        const int64_t zero_from = p->known_zero ? l.exchange : 0;
        if (l.zeroed > zero_from) {
            GEMSOPS_CUDA_CHECK(st,
                               cudaMemsetAsync(ws + zero_from, 0,
                                               l.zeroed - zero_from, stream));
        }
    }
    const unsigned block = layer_norm_block_threads(TPR);
    const auto launch = [&](auto loop) {
        constexpr bwd_loop L = decltype(loop)::value;
        auto kernel = layer_norm_bwd_fused_atomic<T, P, TPR, VEC, E, L, false>;
        if constexpr (bwd_has_dh_early<T, VEC>()) {
            if (pl.dh_early) {
                kernel =
                    layer_norm_bwd_fused_atomic<T, P, TPR, VEC, E, L, true>;
            }
        }
        kernel<<<(unsigned)pl.grid, block, pl.ring.smem, stream>>>(a);
    };
    bool launched = false;
    if constexpr (bwd_has_lagged<T, TPR, VEC>()) {
        if (pl.loop == bwd_loop::lagged) {
            launch(std::integral_constant<bwd_loop, bwd_loop::lagged>{});
            launched = true;
        }
    }
    if constexpr (bwd_has_paired<T, TPR, VEC, E>()) {
        if (pl.loop == bwd_loop::paired) {
            launch(std::integral_constant<bwd_loop, bwd_loop::paired>{});
            launched = true;
        }
    }
    if (!launched) {
        launch(std::integral_constant<bwd_loop, bwd_loop::whole>{});
    }
    GEMSOPS_CUDA_CHECK_LAUNCH(st, "layer_norm_bwd_fused_atomic");
    if (a.dw || a.db) {
        const int64_t n = 2 * p->cols;
        A *parts = a.deterministic ? a.partials : a.stripes;
        const int64_t n_parts =
            a.deterministic ? pl.grid / pl.config.shape.split : l.n_stripes;
        const unsigned sum_grid = (unsigned)((n + kSumCols - 1) / kSumCols);
        GEMSOPS_CUDA_CHECK(st,
                           launch_dependent(layer_norm_bwd_sum_partials<A, P>,
                                            dim3(sum_grid),
                                            dim3(kSumCols, kSumLanes), stream,
                                            pl.pdl, parts, n_parts,
                                            (int64_t)p->cols, a.dw, a.db));
    }
    if (p->kept_zero && l.zeroed > l.exchange) {
        GEMSOPS_CUDA_CHECK(st, cudaMemsetAsync(ws + l.exchange, 0,
                                               l.zeroed - l.exchange, stream));
    }
    return GEMSOPS_OK;
}

// Planning: the shape, the instantiation, its grid and ring, the
// workspace. Launches nothing; the same plan serves the workspace query.
template <typename T, typename P>
int plan(const gemsops_layer_norm_bwd_params *p, bwd_plan *out,
         gemsops_status *st)
{
    const bwd_config c = bwd_choose<T, P>(p);
    return with_kernel<T>(c, st, [&](auto k) {
        using K = decltype(k);
        return plan_for<T, P, K::TPR, K::VEC, K::E>(p, c, out, st);
    });
}

template <typename T, typename P>
int launch(const gemsops_layer_norm_bwd_params *p, const bwd_plan &pl,
           gemsops_status *st)
{
    return with_kernel<T>(pl.config, st, [&](auto k) {
        using K = decltype(k);
        return launch_for<T, P, K::TPR, K::VEC, K::E>(p, pl, st);
    });
}

template <typename T, typename P>
int query_workspace(const gemsops_layer_norm_bwd_params *p, int64_t *bytes,
                    gemsops_status *st)
{
    device_guard guard;
    GEMSOPS_CUDA_CHECK(st, guard.enter(p->device_id));
    if (p->rows == 0 || p->cols == 0) {
        *bytes = 0;
        return GEMSOPS_OK;
    }
    bwd_plan pl;
    if (plan<T, P>(p, &pl, st)) {
        return st->code;
    }
    *bytes = pl.grid < pl.config.shape.split
                 ? two_pass_bytes<acc_t<T>>(p->rows, p->cols)
                 : pl.layout.total;
    return GEMSOPS_OK;
}

// need NULL: a workspace short of the plan is an error; else nothing
// launches and *need gets the bytes the launch needs.
template <typename T, typename P>
int backward(const gemsops_layer_norm_bwd_params *p, int64_t *need,
             gemsops_status *st)
{
    device_guard guard;
    GEMSOPS_CUDA_CHECK(st, guard.enter(p->device_id));
    if (p->rows == 0 || p->cols == 0) {
        // dW and dB over no rows are sums of nothing: zeros, no kernel
        const size_t bytes = (size_t)p->cols * sizeof(P);
        cudaStream_t stream = (cudaStream_t)p->stream;
        if (p->dweight && bytes) {
            GEMSOPS_CUDA_CHECK(st,
                               cudaMemsetAsync(p->dweight, 0, bytes, stream));
        }
        if (p->dbias && bytes) {
            GEMSOPS_CUDA_CHECK(st,
                               cudaMemsetAsync(p->dbias, 0, bytes, stream));
        }
        return GEMSOPS_OK;
    }
    bwd_plan pl;
    if (plan<T, P>(p, &pl, st)) {
        return st->code;
    }
    // a row of more slabs than are co-resident: the launches that wait on
    // no other CTA (layer_norm_bwd_two_pass.cuh)
    const bool two_pass = pl.grid < pl.config.shape.split;
    const int64_t bytes = two_pass ? two_pass_bytes<acc_t<T>>(p->rows, p->cols)
                                   : pl.layout.total;
    if (p->workspace_bytes < bytes && need) {
        *need = bytes;
        return GEMSOPS_OK;
    }
    if (p->workspace_bytes < bytes) {
        return gemsops_fail(st, GEMSOPS_ERR_VALUE,
                            "layer_norm_bwd: workspace has %lld bytes, the "
                            "launch needs %lld",
                            (long long)p->workspace_bytes, (long long)bytes);
    }
    if (two_pass) {
        device_facts f;
        if (get_device_facts(p->device_id, &f, st)) {
            return st->code;
        }
        return launch_two_pass<T, P>(p, f, st);
    }
    return launch<T, P>(p, pl, st);
}

template <typename T>
struct type_tag {
    using type = T;
};

// The one dtype switch: (input dtype, parameter dtype) -> f(type_tag<T>(),
// type_tag<P>()).
template <typename F>
int with_dtypes(const gemsops_layer_norm_bwd_params *p, gemsops_status *st,
                F &&f)
{
    const bool same = p->param_dtype == p->dtype;
    switch (p->dtype) {
    case GEMSOPS_FLOAT32: return f(type_tag<float>(), type_tag<float>());
    case GEMSOPS_FLOAT64: return f(type_tag<double>(), type_tag<double>());
    case GEMSOPS_FLOAT16:
        return same ? f(type_tag<__half>(), type_tag<__half>())
                    : f(type_tag<__half>(), type_tag<float>());
    case GEMSOPS_BFLOAT16:
        return same ? f(type_tag<__nv_bfloat16>(), type_tag<__nv_bfloat16>())
                    : f(type_tag<__nv_bfloat16>(), type_tag<float>());
    default:
        return gemsops_fail(st, GEMSOPS_ERR_TYPE,
                            "layer_norm_bwd: unsupported dtype %s on CUDA",
                            gemsops_dtype_name(p->dtype));
    }
}

} // namespace
} // namespace gemsops

extern "C" int gemsops_layer_norm_bwd_cuda(
    const struct gemsops_layer_norm_bwd_params *p, int64_t *need,
    gemsops_status *st)
{
    if (need) {
        *need = 0;
    }
    return gemsops::with_dtypes(p, st, [&](auto t, auto w) {
        using T = typename decltype(t)::type;
        using P = typename decltype(w)::type;
        return gemsops::backward<T, P>(p, need, st);
    });
}

extern "C" int gemsops_layer_norm_bwd_workspace_cuda(
    const struct gemsops_layer_norm_bwd_params *p, int64_t *bytes,
    gemsops_status *st)
{
    return gemsops::with_dtypes(p, st, [&](auto t, auto w) {
        using T = typename decltype(t)::type;
        using P = typename decltype(w)::type;
        return gemsops::query_workspace<T, P>(p, bytes, st);
    });
}
