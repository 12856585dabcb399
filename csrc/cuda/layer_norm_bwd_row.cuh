// LayerNorm backward: the fused kernel's row loops, one kernel each (a
// runtime choice between loop shapes raised every instantiation's
// registers and slowed the loop it did not take). The thread they drive,
// its ring and its two passes over a row: layer_norm_bwd_thread.cuh.
//
//   bwd_rows_whole: a step finishes its row; split rows wait for the other
//     slabs' partials in the middle of the step (split_exchange);
//   bwd_rows_lagged: for split rows with dx where the wait would stall
//     every row (plan_for in layer_norm_bwd.cu decides): a step publishes
//     row k's partials, then finishes row k - 1 from its ring stage, so
//     the other slabs' partials arrive while row k's first pass runs;
//   bwd_rows_paired: whole rows of the wide half kernels, with dx: two
//     rows a step, one reduction and one barrier for the pair.
//
// Each loop's DH variant serves the fused add's backward with dh given: a
// step loads its row's dh before the row's reduction, whose latency then
// hides dh's (the ring carries x and dy only; a load in the dx loop
// waits behind the store of the item before). Without dh no register is
// held for it, so the plain kernels keep their registers.
#pragma once

#include "layer_norm_bwd_split.cuh"
#include "layer_norm_bwd_thread.cuh"

namespace gemsops {
namespace {

// Each step loads, reduces and finishes one row. Split rows (dx wanted)
// exchange the slabs' partials between the passes.
template <bool DH, typename Th>
__device__ __forceinline__ void bwd_rows_whole(Th &t, typename Th::A *merged,
                                               typename Th::Sums &dw,
                                               typename Th::Sums &db)
{
    using A = typename Th::A;
    using V = typename Th::V;
    t.template prime_ring<0>();
    for (int64_t k = 0, row = t.first_row; k < t.steps;
         k++, row += t.step_rows) {
        const bool row_ok = row < t.a.rows;
        V xv[Th::ITEMS], dv[Th::ITEMS], hv[Th::ITEMS];
        A mean = 0, rstd = 0;
        t.template load<0>(row, row_ok, xv, dv, mean, rstd);
        if constexpr (DH) {
            t.load_dh(row, row_ok, hv);
        }
        A c[2] = {0, 0};
        if (t.a.dx) {
            t.partials(row_ok, xv, dv, mean, rstd, c);
            if (t.a.split > 1) {
                split_exchange(t.a, row, row_ok, t.slab, c, merged);
            }
        }
        t.finish(row, row_ok, xv, dv, DH ? hv : nullptr, mean, rstd, c[0],
                 c[1], dw, db);
    }
}

// Whole rows (split 1) with dx, two a step: both rows' partials meet in
// one reduction, so a step's barrier, ring waits and loop work serve two
// rows. The second row's ring stage is refilled after the first's is
// read, so the ring holds one row back (HELD 1), as the lagged loop's.
template <bool DH, typename Th>
__device__ __forceinline__ void bwd_rows_paired(Th &t, typename Th::Sums &dw,
                                                typename Th::Sums &db)
{
    using A = typename Th::A;
    using V = typename Th::V;
    static_assert(Th::RING, "the paired loop re-reads rows from the ring");
    t.template prime_ring<1>();
    for (int64_t k = 0, row = t.first_row; k < t.steps;
         k += 2, row += 2 * t.step_rows) {
        const int64_t row1 = row + t.step_rows;
        const bool two = k + 1 < t.steps; // the same in every thread
        const bool ok0 = row < t.a.rows;
        const bool ok1 = two && row1 < t.a.rows;
        V x0[Th::ITEMS], d0[Th::ITEMS], x1[Th::ITEMS], d1[Th::ITEMS];
        A mean0 = 0, rstd0 = 0, mean1 = 0, rstd1 = 0;
        t.template load<1>(row, ok0, x0, d0, mean0, rstd0);
        if (two) {
            t.template load<1>(row1, ok1, x1, d1, mean1, rstd1);
        }
        V h0[Th::ITEMS], h1[Th::ITEMS];
        if constexpr (DH) {
            t.load_dh(row, ok0, h0);
            t.load_dh(row1, ok1, h1);
        }
        A c[4] = {0, 0, 0, 0};
        t.partials_pair(ok0, x0, d0, mean0, rstd0, ok1, x1, d1, mean1, rstd1,
                        c);
        t.finish(row, ok0, x0, d0, DH ? h0 : nullptr, mean0, rstd0, c[0], c[1],
                 dw, db);
        if (two) {
            t.finish(row1, ok1, x1, d1, DH ? h1 : nullptr, mean1, rstd1, c[2],
                     c[3], dw, db);
        }
    }
}

// Split rows with dx, one step late: step k runs the first pass of row k
// and publishes its partials (k < steps), then collects row k - 1's
// totals and runs its second pass from its ring stage (k > 0). Row k - 1's
// x and dy wait in the ring, which therefore prefetches one row less. Warp
// 0 reads the held row's exchange slots at the top of the step and uses
// them after the first pass, so the collect rarely waits for an L2 round
// trip of its own.
template <bool DH, typename Th>
__device__ __forceinline__ void bwd_rows_lagged(Th &t, typename Th::A *merged,
                                                typename Th::Sums &dw,
                                                typename Th::Sums &db)
{
    using A = typename Th::A;
    using V = typename Th::V;
    static_assert(Th::RING, "the lagged loop re-reads rows from the ring");
    t.template prime_ring<1>();
    int held_stage = 0;
    A held_mean = 0, held_rstd = 0;
    for (int64_t k = 0, row = t.first_row; k <= t.steps;
         k++, row += t.step_rows) {
        int stage = 0;
        A mean = 0, rstd = 0;
        // the held row's dh, before this step's first pass
        V hv[Th::ITEMS];
        if constexpr (DH) {
            const int64_t held = row - t.step_rows;
            t.load_dh(held, k > 0 && held < t.a.rows, hv);
        }
        // the held row's slabs published during the last step: their
        // slots are read now and used after this step's first pass
        unsigned long long peek0 = 0, peek1 = 0;
        if (k > 0 && threadIdx.x < 32 && row - t.step_rows < t.a.rows) {
            split_peek(t.a.exchange, row - t.step_rows, t.a.split, peek0,
                       peek1);
        }
        if (k < t.steps) {
            const bool row_ok = row < t.a.rows;
            V xv[Th::ITEMS], dv[Th::ITEMS];
            stage = t.template load<1>(row, row_ok, xv, dv, mean, rstd);
            A c[2] = {0, 0};
            t.partials(row_ok, xv, dv, mean, rstd, c);
            if (threadIdx.x == 0 && row_ok) {
                split_publish(t.a.exchange, row, t.slab, t.a.split, c[0],
                              c[1]);
            }
        }
        if (k > 0) {
            const int64_t held = row - t.step_rows;
            const bool held_ok = held < t.a.rows;
            // merged[] alternates between two slots: slot k % 2 is next
            // written at step k + 2, after the barrier below of step
            // k + 1, which each thread reaches after its read here
            A *const m = merged + 2 * (int)(k & 1);
            if (threadIdx.x < 32 && held_ok) {
                A t0, t1;
                split_collect(t.a.exchange, held, t.a.split, t0, t1, peek0,
                              peek1);
                if (threadIdx.x == 0) {
                    m[0] = t0;
                    m[1] = t1;
                }
            }
            __syncthreads();
            V xv[Th::ITEMS], dv[Th::ITEMS];
            t.read_xd(t.stage_at(held_stage), xv, dv);
            t.finish(held, held_ok, xv, dv, DH ? hv : nullptr, held_mean,
                     held_rstd, m[0], m[1], dw, db);
        }
        held_stage = stage;
        held_mean = mean;
        held_rstd = rstd;
    }
}

} // namespace
} // namespace gemsops
