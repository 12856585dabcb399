// Global-memory operations that other CTAs observe: reductions into global
// accumulators (LayerNorm backward's dW/dB stripes), the acquire load
// that pairs with a writer's release (Stream-K's tile flags), and the
// count of arrivals whose last does a group's final step.
#pragma once

#include <stdint.h>
#include <type_traits>

namespace gemsops {

// p[0..N) += v[0..N) in global memory with no return value: 16-byte
// vector reductions on sm_90 (a quarter of the L2 atomic operations),
// element by element before. p must be 16-byte aligned when N % 4 == 0.
template <int N, typename A>
__device__ __forceinline__ void red_add(A *p, const A (&v)[N])
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr bool vector = std::is_same_v<A, float> && N % 4 == 0;
#else
    constexpr bool vector = false;
#endif
    if constexpr (vector) {
#pragma unroll
        for (int k = 0; k < N; k += 4) {
            asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(
                             p + k),
                         "f"(v[k]), "f"(v[k + 1]), "f"(v[k + 2]), "f"(v[k + 3])
                         : "memory");
        }
    }
    else {
#pragma unroll
        for (int k = 0; k < N; k++) {
            atomicAdd(p + k, v[k]);
        }
    }
}

// Acquire load: what the writer stored before its release is visible
// after it (the Stream-K flags).
__device__ __forceinline__ unsigned acquire_load(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                 : "=r"(v)
                 : "l"(p)
                 : "memory");
    return v;
}

// One more of `of` arrivals at counter c, whose high word is the epoch of
// its count (a count of an older launch counts as 0, so counters are never
// reset): true for the last. The caller fences its own writes before.
__device__ __forceinline__ bool last_to_arrive(unsigned long long *c,
                                               unsigned epoch, int64_t of)
{
    const unsigned long long tag = (unsigned long long)epoch << 32;
    unsigned long long seen = *(volatile unsigned long long *)c;
    for (;;) {
        const unsigned long long n =
            (seen >> 32) == epoch ? seen & 0xffffffffull : 0;
        const unsigned long long was = atomicCAS(c, seen, tag | (n + 1));
        if (was == seen) {
            return (int64_t)(n + 1) == of;
        }
        seen = was;
    }
}

} // namespace gemsops
