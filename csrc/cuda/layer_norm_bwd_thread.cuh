// LayerNorm backward: one thread of the fused kernel, for the whole
// launch (the loops that drive it: layer_norm_bwd_row.cuh).
//
// A thread always owns the same E columns of its slab, E / VEC accesses of
// VEC elements STEP columns apart, and keeps their dW/dB partial sums in
// fp32 registers while its CTA walks the rows. Each row takes two passes
// over the thread's x and dy, both in registers: partials() gives the
// CTA's share of c1 = sum g * xhat and c2 = sum g, finish() writes dx and
// adds the row's dW/dB terms. x and dy stay in their storage type between
// the passes; xhat and g are recomputed rather than held as fp32.
//
// Feeding the rows (RING: 16-byte accesses): each thread copies ITS OWN x,
// dy, mean and rstd for the rows `stages - 1` steps ahead into a private
// slice of a shared-memory ring with cp.async, and reads them back when
// their turn comes. No other thread touches that slice, so
// cp.async.wait_group alone orders it: the ring costs no barrier and no
// registers, and keeps (stages - 1) * 2 * E elements per thread in flight
// however long the row reductions take. The copies go through L1
// (cp.async.ca; async_copy.cuh says why). Unaligned or odd-width inputs
// load directly from global memory instead. The thread's weights sit in
// its own shared-memory slice after the ring, read from there in both
// passes.
#pragma once

#include "async_copy.cuh"
#include "convert.cuh"
#include "layer_norm_bwd_plan.cuh"
#include "reduce.cuh"

namespace gemsops {
namespace {

// wait_group takes an immediate: one branch per ring depth.
__device__ __forceinline__ void ring_wait(int pending)
{
    switch (pending) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    default: cp_async_wait<kMaxStages - 1>(); break;
    }
}

// One thread's state for the whole launch: its columns, its row cursor
// and its ring slice. Its dW/dB partials (Sums) are the kernel's own
// locals, passed to what adds to them. HELD (the loops' template argument)
// is how many rows a loop keeps in the ring after their step: the ring
// prefetches that many rows less.
// w * dy rounded once, never contracted into a neighbouring add: c2 sums
// the rounded products and dx subtracts their mean from each, so an FMA
// that kept one product exact would leave its rounding error behind (N = 1:
// dx = rstd * (g - g) must be 0, and rstd is up to 1 / sqrt(eps)).
__device__ __forceinline__ float mul_rn(float a, float b)
{
    return __fmul_rn(a, b);
}

__device__ __forceinline__ double mul_rn(double a, double b)
{
    return __dmul_rn(a, b);
}

template <typename T, typename P, int TPR, int VEC, int E>
struct bwd_thread {
    using A = acc_t<T>;
    using V = vec_t<T, VEC>;
    using W = vec_t<P, VEC>;
    static constexpr int ROW_THREADS = TPR;
    static constexpr int VEC_ELEMS = VEC;
    static constexpr int ITEMS = E / VEC;
    static constexpr int BLOCK = TPR < 128 ? 128 : TPR;
    static constexpr int ROWS_PER_CTA = BLOCK / TPR;
    static constexpr bool RING = bwd_ring<T, VEC>();
    static constexpr int SLAB = TPR * E;
    static constexpr int STEP = TPR * VEC;
    // ring stage s: [x items][dy items] as [ITEMS][BLOCK] vectors (a
    // thread uses column threadIdx.x only), then [mean][rstd] as
    // [STAT_SLOTS] each: one copy per row and warp (bwd_stat_lanes), in
    // slot stat_slot
    static constexpr int STAGE_BYTES = bwd_stage_bytes<T, VEC, E>(BLOCK, TPR);
    static constexpr int STAT_LANES = bwd_stat_lanes(TPR);
    static constexpr int STAT_SLOTS = BLOCK / STAT_LANES;
    // dW/dB partials of the thread's columns: registers, once the
    // unrolled loops make every index a constant
    using Sums = A[ITEMS][VEC];

    const bwd_args<T, P> &a;
    uint4 *ring_words; // dynamic shared memory: the ring, then the weights
    A *red; // row_sum's scratch: 2 * 32 * (values reduced at once)
    int parity;
    int lane, sub, slab;
    int64_t group, groups, slab0, col0, col_end;
    int lim; // item i valid: i * STEP < lim
    bool want_dwb;
    A inv_n;
    // Row of step k for this thread; every thread of the CTA runs the
    // same number of steps (the row reductions have barriers).
    int64_t step_rows, first_row, steps;
    // Ring cursors: the next row to copy and its stage, and the stage to
    // read (stage indices wrap by comparison: a 64-bit modulo per row cost
    // more than the rest of the step).
    int64_t fetch_row;
    bool stat_owner;
    int stat_slot, stat_src;
    int fetch_stage, read_stage;
    W *w_smem;

    __device__ __forceinline__ bwd_thread(const bwd_args<T, P> &args,
                                          uint4 *ring, A *scratch)
        : a(args), ring_words(ring), red(scratch)
    {
        parity = 0;
        lane = threadIdx.x % TPR;
        sub = threadIdx.x / TPR;
        slab = blockIdx.x % a.split;
        group = blockIdx.x / a.split;
        groups = gridDim.x / a.split;
        slab0 = (int64_t)slab * SLAB;
        col0 = slab0 + lane * VEC;
        col_end = min(slab0 + SLAB, a.cols);
        lim = (int)(col_end - col0);
        want_dwb = a.dw || a.db;
        inv_n = A(1) / (A)a.cols;
        step_rows = groups * ROWS_PER_CTA;
        first_row = group * ROWS_PER_CTA + sub;
        const int64_t cta_first = group * ROWS_PER_CTA;
        steps = cta_first < a.rows
                    ? (a.rows - cta_first + step_rows - 1) / step_rows
                    : 0;
        fetch_row = first_row;
        stat_owner = threadIdx.x % STAT_LANES == 0;
        stat_slot = threadIdx.x / STAT_LANES;
        stat_src = (int)(threadIdx.x % 32) / STAT_LANES * STAT_LANES;
        fetch_stage = 0;
        read_stage = 0;
    }

    __device__ __forceinline__ int next_stage(int st) const
    {
        return st + 1 == a.stages ? 0 : st + 1;
    }

    // Copies the next row's x, dy, mean, rstd into its ring stage (RING
    // only); a row past the end commits an empty group, which keeps the
    // group count uniform.
    __device__ __forceinline__ void issue()
    {
        if (fetch_row < a.rows) {
            const unsigned st = smem_addr(ring_words) +
                                fetch_stage * STAGE_BYTES + threadIdx.x * 16;
            // the row's addresses once, not per access (a 64-bit multiply
            // chain each)
            const T *fetch_x = a.x + fetch_row * a.x_stride + col0;
            const T *fetch_dy = a.dy + fetch_row * a.dy_stride + col0;
#pragma unroll
            for (int i = 0; i < ITEMS; i++) {
                if (i * STEP < lim) {
                    cp_async16_ca(st + i * BLOCK * 16, fetch_x + i * STEP);
                    cp_async16_ca(st + (ITEMS + i) * BLOCK * 16,
                                  fetch_dy + i * STEP);
                }
            }
            if (stat_owner) {
                const unsigned stats = st - threadIdx.x * 16 +
                                       2 * ITEMS * BLOCK * 16 +
                                       stat_slot * (unsigned)sizeof(A);
                cp_async_small<sizeof(A)>(stats, a.mean + fetch_row);
                cp_async_small<sizeof(A)>(stats + STAT_SLOTS * sizeof(A),
                                          a.rstd + fetch_row);
            }
        }
        cp_async_commit();
        fetch_row += step_rows;
        fetch_stage = next_stage(fetch_stage);
    }

    // Zero dW/dB partials, and the weights into the thread's own slice of
    // shared memory after the ring ([ITEMS][BLOCK] vectors): re-reading
    // them from global memory cost a load and its latency twice per row
    // (L1 keeps little beside the ring), and pinning them in registers
    // spills at 64.
    __device__ __forceinline__ void init_columns(A (&dw)[ITEMS][VEC],
                                                 A (&db)[ITEMS][VEC])
    {
#pragma unroll
        for (int i = 0; i < ITEMS; i++) {
#pragma unroll
            for (int v = 0; v < VEC; v++) {
                dw[i][v] = 0;
                db[i][v] = 0;
            }
        }
        w_smem = reinterpret_cast<W *>(reinterpret_cast<char *>(ring_words) +
                                       a.stages * STAGE_BYTES) +
                 threadIdx.x;
#pragma unroll
        for (int i = 0; i < ITEMS; i++) {
            W wv;
            if (a.w && i * STEP < lim) {
                wv = load_vec<P, VEC>(a.w + col0 + i * STEP);
            }
            else {
#pragma unroll
                for (int v = 0; v < VEC; v++) {
                    wv.v[v] = from_acc<P>(A(1));
                }
            }
            w_smem[i * BLOCK] = wv;
        }
    }

    template <int HELD>
    __device__ __forceinline__ void prime_ring()
    {
        if constexpr (RING) {
            for (int k = 0; k < a.stages - 1 - HELD; k++) {
                issue();
            }
        }
    }

    __device__ __forceinline__ const char *stage_at(int stage) const
    {
        return reinterpret_cast<const char *>(ring_words) +
               stage * STAGE_BYTES;
    }

    // This thread's x and dy of the row in the ring stage at st.
    __device__ __forceinline__ void read_xd(const char *st, V (&xv)[ITEMS],
                                            V (&dv)[ITEMS]) const
    {
        const V *xs = reinterpret_cast<const V *>(st) + threadIdx.x;
#pragma unroll
        for (int i = 0; i < ITEMS; i++) {
            xv[i] = xs[i * BLOCK];
            dv[i] = xs[(ITEMS + i) * BLOCK];
        }
    }

    // Row `row` from the ring, refilling the stage finished HELD + 1 steps
    // ago; returns the stage it read.
    template <int HELD>
    __device__ __forceinline__ int load_from_ring(bool row_ok, V (&xv)[ITEMS],
                                                  V (&dv)[ITEMS], A &mean,
                                                  A &rstd)
    {
        issue();
        ring_wait(a.stages - 1 - HELD);
        const char *st = stage_at(read_stage);
        const int stage = read_stage;
        read_stage = next_stage(read_stage);
        read_xd(st, xv, dv);
        const A *stats = reinterpret_cast<const A *>(
            reinterpret_cast<const V *>(st) + 2 * ITEMS * BLOCK);
        A m = 0, r = 0;
        if (stat_owner) {
            m = stats[stat_slot];
            r = stats[STAT_SLOTS + stat_slot];
        }
        m = __shfl_sync(0xffffffffu, m, stat_src);
        r = __shfl_sync(0xffffffffu, r, stat_src);
        if (row_ok) {
            mean = m;
            rstd = r;
        }
        return stage;
    }

    __device__ __forceinline__ void load_from_global(int64_t row, bool row_ok,
                                                     V (&xv)[ITEMS],
                                                     V (&dv)[ITEMS], A &mean,
                                                     A &rstd) const
    {
#pragma unroll
        for (int i = 0; i < ITEMS; i++) {
            if (row_ok && i * STEP < lim) {
                xv[i] =
                    load_vec<T, VEC>(a.x + row * a.x_stride + col0 + i * STEP);
                dv[i] = load_vec<T, VEC>(a.dy + row * a.dy_stride + col0 +
                                         i * STEP);
            }
        }
        if (row_ok) {
            mean = a.mean[row];
            rstd = a.rstd[row];
        }
    }

    // Row `row`'s x, dy (this thread's items), mean and rstd; returns the
    // ring stage it read (0 without a ring). Items past the row, and every
    // item of a row past the end, hold whatever the registers or the ring
    // stage held: both passes skip them (`item_ok`).
    template <int HELD>
    __device__ __forceinline__ int load(int64_t row, bool row_ok,
                                        V (&xv)[ITEMS], V (&dv)[ITEMS],
                                        A &mean, A &rstd)
    {
        int stage = 0;
        if constexpr (RING) {
            stage = load_from_ring<HELD>(row_ok, xv, dv, mean, rstd);
        }
        else {
            load_from_global(row, row_ok, xv, dv, mean, rstd);
        }
        if (a.rms) {
            mean = A(0);
        }
        return stage;
    }

    // Item i holds data of the row. Skipping the others in the passes,
    // rather than zeroing them once loaded, leaves the loaded words whole:
    // zeroing them under a predicate had every 16-bit element of the half
    // types merged back into its word, an instruction (PRMT) each.
    __device__ __forceinline__ bool item_ok(bool row_ok, int i) const
    {
        return row_ok && i * STEP < lim;
    }

    // First pass, this thread's share: c[0] += sum g * xhat, c[1] += sum g
    // over its items of the row.
    __device__ __forceinline__ void partial_sums(bool row_ok,
                                                 const V (&xv)[ITEMS],
                                                 const V (&dv)[ITEMS], A mean,
                                                 A rstd, A *c) const
    {
        A s0 = 0, s1 = 0;
#pragma unroll
        for (int i = 0; i < ITEMS; i++) {
            if (!item_ok(row_ok, i)) {
                continue;
            }
            const W wv = w_smem[i * BLOCK];
#pragma unroll
            for (int v = 0; v < VEC; v++) {
                // not x * rstd - mean * rstd: that cancels when x ~ mean
                // and rstd is large (N = 1: xhat must be 0)
                const A xc = widen<A>(xv[i].v[v]) - mean;
                const A g = mul_rn(widen<A>(dv[i].v[v]), widen<A>(wv.v[v]));
                s0 += g * xc;
                s1 += g;
            }
        }
        c[0] += s0 * rstd; // rstd * sum g * (x - mean): a multiply a row
        c[1] += s1;
    }

    // First pass: the CTA's partials c1 = sum g * xhat, c2 = sum g.
    __device__ __forceinline__ void partials(bool row_ok, const V (&xv)[ITEMS],
                                             const V (&dv)[ITEMS], A mean,
                                             A rstd, A (&c)[2])
    {
        partial_sums(row_ok, xv, dv, mean, rstd, c);
        row_sum<TPR, 2>(c, red, parity);
    }

    // The partials of two rows, c[0..1] and c[2..3], in one reduction (one
    // barrier for the pair).
    __device__ __forceinline__ void partials_pair(
        bool ok0, const V (&x0)[ITEMS], const V (&d0)[ITEMS], A mean0, A rstd0,
        bool ok1, const V (&x1)[ITEMS], const V (&d1)[ITEMS], A mean1, A rstd1,
        A (&c)[4])
    {
        partial_sums(ok0, x0, d0, mean0, rstd0, c);
        partial_sums(ok1, x1, d1, mean1, rstd1, c + 2);
        row_sum<TPR, 4>(c, red, parity);
    }

    // One vector of dh, on the read-only path: a plain load may not pass
    // the dx store of the item before, so each item would wait for its own
    // L2 round trip. fp64 keeps plain loads (its lagged kernel spilled
    // more).
    static __device__ __forceinline__ V dh_vec(const T *p)
    {
        if constexpr (sizeof(T) == 8) {
            return load_vec<T, VEC>(p);
        }
        else {
            return load_vec_ro<T, VEC>(p);
        }
    }

    // The fused add's gradient dh of row `row` (this thread's items), for
    // finish(): the loops' DH variants load it before the row's reduction
    // (layer_norm_bwd_row.cuh).
    __device__ __forceinline__ void load_dh(int64_t row, bool row_ok,
                                            V (&hv)[ITEMS]) const
    {
        const T *const dhr = a.dh + row * a.dh_stride + col0;
#pragma unroll
        for (int i = 0; i < ITEMS; i++) {
            if (item_ok(row_ok, i)) {
                hv[i] = dh_vec(dhr + i * STEP);
            }
        }
    }

    // Second pass over a row: dx = rstd * (g - (xhat * c1 + c2) / N) (+ dh
    // for the fused add: hv from load_dh, or, hv null, loaded here), and
    // the row's dW/dB terms. g - g is exactly 0 when N = 1, which a form
    // with rstd folded into the constants loses.
    __device__ __forceinline__ void finish(int64_t row, bool row_ok,
                                           const V (&xv)[ITEMS],
                                           const V (&dv)[ITEMS], const V *hv,
                                           A mean, A rstd, A c1, A c2,
                                           A (&dw)[ITEMS][VEC],
                                           A (&db)[ITEMS][VEC]) const
    {
        const A c1n = c1 * inv_n;
        const A c2n = a.rms ? A(0) : c2 * inv_n;
        T *const dxr = a.dx + row * a.dx_stride + col0;
        const T *const dhr = a.dh + row * a.dh_stride + col0;
#pragma unroll
        for (int i = 0; i < ITEMS; i++) {
            if (!item_ok(row_ok, i)) {
                continue;
            }
            const W wv = w_smem[i * BLOCK];
            A out[VEC];
#pragma unroll
            for (int v = 0; v < VEC; v++) {
                const A xh = (widen<A>(xv[i].v[v]) - mean) * rstd;
                const A d = widen<A>(dv[i].v[v]);
                const A g = mul_rn(d, widen<A>(wv.v[v]));
                out[v] = rstd * (g - (xh * c1n + c2n));
                dw[i][v] += d * xh;
                db[i][v] += d;
            }
            if (a.dx) {
                if (a.dh) { // hv: a constant once inlined
                    const V h = hv ? hv[i] : dh_vec(dhr + i * STEP);
#pragma unroll
                    for (int v = 0; v < VEC; v++) {
                        out[v] += widen<A>(h.v[v]);
                    }
                }
                store_rounded<T, VEC>(dxr + i * STEP, out);
            }
        }
    }
};

} // namespace
} // namespace gemsops
