// How a LayerNorm launch is shaped, shared by the forward and backward
// launchers and by the backward's workspace query (which must agree
// exactly with its launch).
//
// A row is handled by TPR consecutive threads, each holding E elements in
// registers (E/VEC accesses of VEC elements). Short rows: TPR < 128, several
// rows per 128-thread CTA. In the backward, a row longer than max_tpr * E
// is split into `split` slabs, one CTA each; the CTAs of a row group
// exchange partial sums through global memory (they are co-resident: the
// grid never exceeds what fits). The forward streams such rows instead.
#pragma once

#include "common.cuh"

namespace gemsops {

constexpr int kLayerNormTprChoices[] = {4, 8, 16, 32, 128, 256, 512, 1024};

struct layer_norm_shape {
    int tpr;   // threads per row (slab)
    int split; // CTAs per row
};

// Register budget: at least 768 resident threads per SM (<= 85 registers),
// except a lone 512- or 1024-thread CTA, which gets what the SM has.
constexpr int layer_norm_min_ctas(int block)
{
    return block >= 512 ? 1 : 768 / block;
}

inline layer_norm_shape layer_norm_choose_shape(int64_t cols, int e,
                                                int max_tpr = 1024)
{
    layer_norm_shape s = {max_tpr, 1};
    if (cols <= max_tpr * (int64_t)e) {
        for (int tpr : kLayerNormTprChoices) {
            if ((int64_t)tpr * e >= cols) {
                s.tpr = tpr;
                break;
            }
        }
        return s;
    }
    // Split: the fewest padded columns, then the fewest CTAs per row.
    int64_t best_padded = INT64_MAX;
    for (int tpr = max_tpr; tpr >= 128; tpr /= 2) {
        int64_t slab = (int64_t)tpr * e;
        int64_t k = (cols + slab - 1) / slab;
        if (k * slab < best_padded) {
            best_padded = k * slab;
            s.tpr = tpr;
            s.split = (int)k;
        }
    }
    return s;
}

inline int layer_norm_block_threads(int tpr) { return tpr < 128 ? 128 : tpr; }

// Rows one CTA covers per loop step.
inline int64_t layer_norm_rows_per_step(layer_norm_shape s, int rows_at_once)
{
    return (int64_t)(layer_norm_block_threads(s.tpr) / s.tpr) * rows_at_once;
}

// Persistent grid: row groups (of `split` CTAs) up to what is co-resident,
// and no more than one per `min_rows` rows (the backward's atomics cost
// grid * cols, so each CTA must own enough rows to amortise them).
inline int64_t layer_norm_grid(int64_t rows, layer_norm_shape s,
                               int rows_at_once, int ctas_per_sm,
                               int sm_count, int64_t min_rows = 1)
{
    int64_t rows_per_cta = layer_norm_rows_per_step(s, rows_at_once);
    if (rows_per_cta < min_rows) {
        rows_per_cta = min_rows;
    }
    int64_t groups_needed = (rows + rows_per_cta - 1) / rows_per_cta;
    int64_t resident_groups = (int64_t)ctas_per_sm * sm_count / s.split;
    int64_t groups = groups_needed < resident_groups ? groups_needed
                                                     : resident_groups;
    return groups * s.split;
}

// Strong (relaxed, gpu-scope) accesses to the exchange slots: another
// CTA writes what this one polls, so plain loads could sit in L1.
__device__ __forceinline__ void st_relaxed(float *p, float v)
{
    asm volatile("st.relaxed.gpu.global.b32 [%0], %1;" ::"l"(p),
                 "r"(__float_as_uint(v))
                 : "memory");
}
__device__ __forceinline__ void st_relaxed(double *p, double v)
{
    asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p),
                 "l"(__double_as_longlong(v))
                 : "memory");
}
__device__ __forceinline__ unsigned long long ld_relaxed_bits(const float *p)
{
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];"
                 : "=r"(v)
                 : "l"(p)
                 : "memory");
    return v;
}
__device__ __forceinline__ unsigned long long ld_relaxed_bits(const double *p)
{
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];"
                 : "=l"(v)
                 : "l"(p)
                 : "memory");
    return v;
}
__device__ __forceinline__ float from_bits(unsigned long long b, float)
{
    return __uint_as_float((unsigned)b);
}
__device__ __forceinline__ double from_bits(unsigned long long b, double)
{
    return __longlong_as_double((long long)b);
}

// A row's slabs exchange their two partials (v0, v1) through global
// memory: each CTA publishes its own, then collects all of them.
//
// The slots are zero when the launch starts and each is written once, so
// a slot's own bits say whether it has arrived: a partial of +0 is
// written as -0 (it adds the same), and lane j polls slabs j, j + 32, ...
// until theirs are non-zero. No counter, no fence: the wait is the one
// L2 round trip of the poll that sees the data. A butterfly then adds
// the slabs; every CTA of the group adds the same values in the same tree
// and gets the same bits. (One lane summing the slabs after an acquire on
// a counter waited ~split / 4 round trips: ~4 us a row step at 32 slabs
// on the H100.)
template <typename A>
__device__ __forceinline__ void split_publish(A *partials, int64_t row,
                                              int slab, int split, A v0, A v1)
{
    A *all = partials + row * split * 2;
    st_relaxed(all + 2 * slab, v0 == A(0) ? -A(0) : v0);
    st_relaxed(all + 2 * slab + 1, v1 == A(0) ? -A(0) : v1);
}

// The first round of split_collect's polls (lane j: slab j), issued early:
// the loads' latency then overlaps whatever the warp does until the
// collect, which polls again only for slabs that had not yet published.
template <typename A>
__device__ __forceinline__ void split_peek(const A *partials, int64_t row,
                                           int split, unsigned long long &b0,
                                           unsigned long long &b1)
{
    const int lane = threadIdx.x % 32;
    const A *all = partials + row * split * 2;
    b0 = 0;
    b1 = 0;
    if (lane < split) {
        b0 = ld_relaxed_bits(all + 2 * lane);
        b1 = ld_relaxed_bits(all + 2 * lane + 1);
    }
}

// The row's totals once every slab has published; called by the 32 lanes
// of one warp, with the bits split_peek saw (zeros: none seen).
template <typename A>
__device__ void split_collect(const A *partials, int64_t row, int split,
                              A &v0, A &v1, unsigned long long peek0 = 0,
                              unsigned long long peek1 = 0)
{
    const int lane = threadIdx.x % 32;
    const A *all = partials + row * split * 2;
    A s0 = 0, s1 = 0;
    for (int j = lane; j < split; j += 32) {
        unsigned long long b0 = j == lane ? peek0 : 0;
        unsigned long long b1 = j == lane ? peek1 : 0;
        while (b0 == 0 || b1 == 0) {
            b0 = ld_relaxed_bits(all + 2 * j);
            b1 = ld_relaxed_bits(all + 2 * j + 1);
        }
        s0 += from_bits(b0, A());
        s1 += from_bits(b1, A());
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) {
        s0 += __shfl_xor_sync(0xffffffffu, s0, off);
        s1 += __shfl_xor_sync(0xffffffffu, s1, off);
    }
    v0 = s0;
    v1 = s1;
}

} // namespace gemsops
