// Global-memory operations that other CTAs observe: reductions into global
// accumulators (LayerNorm backward's dW/dB stripes) and the acquire load
// that pairs with a writer's release (Stream-K's tile flags).
#pragma once

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

} // namespace gemsops
