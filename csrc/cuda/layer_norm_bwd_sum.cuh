// LayerNorm backward: dW[c] = sum_rows dy * xhat, dB[c] = sum_rows dy, in
// two steps.
//
// 1. The fused kernel's tail (bwd_emit): each CTA sums its threads'
//    register partials for a column (its row groups meet in shared memory
//    first when several rows share the CTA) and issues one atomic add per
//    column into fp32 accumulators. Same-address atomics serialise, so the
//    accumulators come in stripes: row group g adds into stripe
//    g % n_stripes (bwd_stripes: ~16 groups a stripe). Deterministic mode
//    stores each group's partials to its own row instead, no atomics.
// 2. layer_norm_bwd_sum_partials: a column-parallel kernel sums the stripes
//    (or the groups' partials in a fixed order) and rounds once to the
//    parameters' dtype: 2 * N * parts fp32 reads, not a pass over x or dy.
//    On sm_90 it is a programmatic dependent launch (pdl.cuh), so its
//    launch overlaps the fused kernel's atomics.
#pragma once

#include "atomics.cuh"
#include "convert.cuh"
#include "layer_norm_bwd_thread.cuh"
#include "pdl.cuh"

namespace gemsops {
namespace {

// One value per column: into the CTA's stripe, or (deterministic) into its
// row group's row of partials.
template <typename Th>
__device__ __forceinline__ void bwd_emit_one(const Th &t,
                                             typename Th::A *stripe,
                                             int64_t col, typename Th::A vw,
                                             typename Th::A vb)
{
    if (t.a.deterministic) {
        typename Th::A *part = t.a.partials + t.group * 2 * t.a.cols;
        part[col] = vw;
        part[t.a.cols + col] = vb;
    }
    else {
        if (t.a.dw) {
            atomicAdd(stripe + col, vw);
        }
        if (t.a.db) {
            atomicAdd(stripe + t.a.cols + col, vb);
        }
    }
}

// One row per CTA: a thread's columns are its own, nothing to combine.
template <typename Th>
__device__ __forceinline__ void bwd_emit_own_columns(const Th &t,
                                                     typename Th::A *stripe,
                                                     typename Th::Sums &dw,
                                                     typename Th::Sums &db)
{
#pragma unroll
    for (int i = 0; i < Th::ITEMS; i++) {
        if (i * Th::STEP >= t.lim) {
            continue;
        }
        const int64_t col = t.col0 + i * Th::STEP;
        if (Th::RING && !t.a.deterministic) {
            // whole aligned vectors (the ring's precondition): one
            // vector reduction per 4 columns on sm_90
            if (t.a.dw) {
                red_add<Th::VEC_ELEMS>(stripe + col, dw[i]);
            }
            if (t.a.db) {
                red_add<Th::VEC_ELEMS>(stripe + t.a.cols + col, db[i]);
            }
            continue;
        }
#pragma unroll
        for (int v = 0; v < Th::VEC_ELEMS; v++) {
            if (i * Th::STEP + v < t.lim) {
                bwd_emit_one(t, stripe, col + v, dw[i][v], db[i][v]);
            }
        }
    }
}

// Several rows per CTA: the row groups' partials for a column meet in
// colsum[ROWS_PER_CTA][SLAB] and one thread emits their sum.
template <typename Th>
__device__ __forceinline__ void bwd_emit_row_groups(const Th &t,
                                                    typename Th::A *stripe,
                                                    typename Th::A *colsum,
                                                    typename Th::Sums &dw,
                                                    typename Th::Sums &db)
{
    using A = typename Th::A;
    constexpr int SLAB = Th::SLAB, BLOCK = Th::BLOCK;
    constexpr int TPR = Th::ROW_THREADS, VEC = Th::VEC_ELEMS;
    A totals[2][(SLAB + BLOCK - 1) / BLOCK];
#pragma unroll
    for (int which = 0; which < 2; which++) {
#pragma unroll
        for (int i = 0; i < Th::ITEMS; i++) {
#pragma unroll
            for (int v = 0; v < VEC; v++) {
                colsum[t.sub * SLAB + (i * TPR + t.lane) * VEC + v] =
                    which == 0 ? dw[i][v] : db[i][v];
            }
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < (SLAB + BLOCK - 1) / BLOCK; k++) {
            const int j = threadIdx.x + k * BLOCK;
            A s = 0;
            if (j < SLAB) {
                for (int r = 0; r < Th::ROWS_PER_CTA; r++) {
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
        if (j < SLAB && t.slab0 + j < t.col_end) {
            bwd_emit_one(t, stripe, t.slab0 + j, totals[0][k], totals[1][k]);
        }
    }
}

// The fused kernel's dW/dB tail; every thread of the CTA calls it.
template <typename Th>
__device__ __forceinline__ void bwd_emit(const Th &t, typename Th::A *colsum,
                                         typename Th::Sums &dw,
                                         typename Th::Sums &db)
{
    // The partial sums' kernel is this grid's programmatic dependent: it
    // may be scheduled from here on, so its launch overlaps the atomics
    // below; it reads them only after this grid has completed.
    pdl_launch_dependents();
    typename Th::A *const stripe =
        t.a.stripes + (int64_t)((int)t.group % t.a.n_stripes) * 2 * t.a.cols;
    if constexpr (Th::ROWS_PER_CTA == 1) {
        bwd_emit_own_columns(t, stripe, dw, db);
    }
    else {
        bwd_emit_row_groups(t, stripe, colsum, dw, db);
    }
}

// The `parts` partial sums of each of the 2 * cols columns (stripes, or
// the deterministic mode's per-group partials), rounded once to the
// parameters' dtype. A CTA takes kSumCols adjacent columns (coalesced)
// with kSumLanes threads each: lane l adds parts l, l + kSumLanes, ..., so
// a column's loads are in flight in one round, and the lanes' sums meet in
// shared memory in lane order. The order is fixed: the same result every
// run. It then writes zeros back over what it read: the workspace is zero
// again for the next launch on the stream, which saves a memset launch per
// backward where the caller keeps the workspace (kept_zero).
constexpr int kSumCols = 64, kSumLanes = 4;

template <typename A, typename P>
__global__ void __launch_bounds__(kSumCols *kSumLanes)
    layer_norm_bwd_sum_partials(A *partials, int64_t parts, int64_t cols,
                                P *dw, P *db)
{
    __shared__ A lane_sums[kSumLanes][kSumCols];
    const int64_t j = blockIdx.x * (int64_t)kSumCols + threadIdx.x;
    pdl_wait_primary(); // the fused kernel's atomics or partials are done
    A s = 0;
    if (j < 2 * cols) {
#pragma unroll 8
        for (int64_t gi = threadIdx.y; gi < parts; gi += kSumLanes) {
            s += partials[gi * 2 * cols + j];
        }
#pragma unroll 8
        for (int64_t gi = threadIdx.y; gi < parts; gi += kSumLanes) {
            partials[gi * 2 * cols + j] = A(0);
        }
    }
    lane_sums[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && j < 2 * cols) {
#pragma unroll
        for (int l = 1; l < kSumLanes; l++) {
            s += lane_sums[l][threadIdx.x];
        }
        P *out = j < cols ? dw : db;
        if (out) {
            out[j < cols ? j : j - cols] = from_acc<P>(s);
        }
    }
}

} // namespace
} // namespace gemsops
