// L2 cache policies (createpolicy) and the last-read load that uses one.
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

} // namespace gemsops
