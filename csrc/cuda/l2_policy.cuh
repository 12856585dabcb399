// L2 cache policies (createpolicy) and the last-read load and last-write
// store that use one.
// Where a policy pays is measured per use (docs/performance.md), so each
// caller says why it takes one.
#pragma once

#include <stdint.h>

#include "convert.cuh"

namespace gemsops {

// Evict-first in L2, for data a kernel reads for the last time: its lines
// become the first victims of their sets, so the read displaces little of
// what was in L2 before it. What was there is often a producer's output,
// dirty: a normal-priority read of B bytes writes back up to B bytes of it
// while the kernel runs (the benchmarks' L2 flush leaves dirty lines too,
// so it shows there as well).
__device__ __forceinline__ uint64_t l2_evict_first_policy()
{
    uint64_t policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}

// The default priority, as a policy for instructions that take one.
__device__ __forceinline__ uint64_t l2_evict_normal_policy()
{
    uint64_t policy;
    asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;"
        : "=l"(policy));
    return policy;
}

// load_vec for a last read: 16-byte vectors on the read-only path, not
// allocated in L1, evict-first in L2 (the compiler creates the policy once
// per kernel); other widths as load_vec.
template <typename T, int VEC>
__device__ __forceinline__ vec_t<T, VEC> load_vec_last(const T *p)
{
    if constexpr (sizeof(T) * VEC == 16) {
        vec_t<T, VEC> out;
        uint4 &r = *reinterpret_cast<uint4 *>(&out);
        asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 "
            "{%0,%1,%2,%3}, [%4], %5;"
            : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
            : "l"(p), "l"(l2_evict_first_policy()));
        return out;
    }
    else {
        return load_vec<T, VEC>(p);
    }
}

// load_vec_last for data this thread itself stored earlier in the kernel
// (the read-only path may not see a kernel's own writes): an ordinary
// global load, not allocated in L1, evict-first in L2; other widths as
// load_vec. The caller keeps the store and this load in program order (a
// barrier between them stops the compiler moving the load up).
template <typename T, int VEC>
__device__ __forceinline__ vec_t<T, VEC> load_vec_own_last(const T *p)
{
    if constexpr (sizeof(T) * VEC == 16) {
        vec_t<T, VEC> out;
        uint4 &r = *reinterpret_cast<uint4 *>(&out);
        asm volatile("ld.global.L1::no_allocate.L2::cache_hint.v4.u32 "
                     "{%0,%1,%2,%3}, [%4], %5;"
                     : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                     : "l"(p), "l"(l2_evict_first_policy())
                     : "memory");
        return out;
    }
    else {
        return load_vec<T, VEC>(p);
    }
}

// store_rounded for output the kernel does not read back, written while it
// still needs other lines from L2: 16-byte vectors stored evict-first, so
// that they, not those lines, are the first victims of their sets; other
// widths as store_rounded.
template <typename T, int VEC, typename A>
__device__ __forceinline__ void store_rounded_last(T *p, const A (&o)[VEC])
{
    if constexpr (sizeof(T) * VEC == 16) {
        unsigned w[4];
        if constexpr (rounds_in_pairs<T, VEC>()) {
            round_pairs<T, VEC>(o, w);
        }
        else {
            vec_t<T, VEC> out;
#pragma unroll
            for (int v = 0; v < VEC; v++) {
                out.v[v] = from_acc<T>(o[v]);
            }
            const uint4 r = *reinterpret_cast<const uint4 *>(&out);
            w[0] = r.x;
            w[1] = r.y;
            w[2] = r.z;
            w[3] = r.w;
        }
        asm volatile("st.global.L2::cache_hint.v4.b32 [%0], {%1, %2, %3, %4}, "
                     "%5;" ::"l"(p),
                     "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]),
                     "l"(l2_evict_first_policy())
                     : "memory");
    }
    else {
        store_rounded<T, VEC>(p, o);
    }
}

} // namespace gemsops
