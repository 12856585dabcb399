// LayerNorm backward, split rows: the CTAs that share a row (its `split`
// slabs, co-resident: the grid never exceeds what fits) exchange their
// partials (c1, c2) through global memory, so x and dy are still read
// once. Each CTA publishes its own, then collects all of them.
//
// The slots are zero when the launch starts and each is written once, so
// a slot's own bits say whether it has arrived: a partial of +0 is
// written as -0 (it adds the same), and lane j polls slabs j, j + 32, ...
// until theirs are non-zero. No counter, no fence: the wait is the one
// L2 round trip of the poll that sees the data. A butterfly then adds
// the slabs; every CTA of the group adds the same values in the same tree
// and gets the same bits. (One lane summing the slabs after an acquire on
// a counter waited ~split / 4 round trips a row step.)
//
// Two ways to wait, one per row loop (layer_norm_bwd_row.cuh):
// split_exchange() waits where the row's first pass ends;
// the lagged loop peeks early and collects one row step later.
#pragma once

#include <stdint.h>

namespace gemsops {

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
__device__ void split_collect(const A *partials, int64_t row, int split, A &v0,
                              A &v1, unsigned long long peek0 = 0,
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

// The whole-row loop's exchange: the CTA's partials c of `row` in, the
// row's totals out, to every thread. Warp 0 publishes and collects (into
// a.exchange, a.split slabs a row); the totals reach the other warps
// through merged[0..2). Every thread of the CTA calls it (a barrier); one
// row per CTA here (TPR >= 128), so row_ok is uniform.
template <typename Args, typename A>
__device__ __forceinline__ void split_exchange(const Args &a, int64_t row,
                                               bool row_ok, int slab,
                                               A (&c)[2], A *merged)
{
    if (threadIdx.x < 32 && row_ok) {
        if (threadIdx.x == 0) {
            split_publish(a.exchange, row, slab, a.split, c[0], c[1]);
        }
        split_collect(a.exchange, row, a.split, c[0], c[1]);
        if (threadIdx.x == 0) {
            merged[0] = c[0];
            merged[1] = c[1];
        }
    }
    __syncthreads();
    // merged[] is next written after the next row's row_sum barrier,
    // which every thread reaches after this read
    c[0] = merged[0];
    c[1] = merged[1];
}

} // namespace gemsops
