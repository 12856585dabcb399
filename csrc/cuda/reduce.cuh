// Sums over the threads that share a row: xor shuffles inside a warp, then
// the warps' sums through shared memory. Every thread ends with the same
// bits (a fixed tree), which the callers rely on where threads of one row
// must agree (the LayerNorm statistics, the backward's c1 and c2).
#pragma once

namespace gemsops {

// Sum over the TPR consecutive threads that share a row. TPR <= 32: xor
// shuffles stay inside the aligned group. TPR > 32 (a whole number of
// warps; a CTA holds one row, or two of 64 threads): warp sums meet in
// shared memory. `red` alternates between two slots so that a following
// call cannot overwrite a slot another warp is still reading.
template <int TPR, int N, typename A>
__device__ __forceinline__ void warp_sum(A (&v)[N])
{
#pragma unroll
    for (int off = (TPR < 32 ? TPR : 32) / 2; off > 0; off /= 2) {
#pragma unroll
        for (int i = 0; i < N; i++) {
            v[i] += __shfl_xor_sync(0xffffffffu, v[i], off);
        }
    }
}

// red: shared scratch of 2 * 32 * N elements; parity flips every call.
// Every thread of the CTA must call it when TPR > 32.
template <int TPR, int N, typename A>
__device__ __forceinline__ void row_sum(A (&v)[N], A *red, int &parity)
{
    warp_sum<TPR, N>(v);
    if constexpr (TPR > 32) {
        constexpr int WARPS = TPR / 32;
        A *slot = red + parity * 32 * N;
        const int warp = threadIdx.x / 32;
        const int first = warp - warp % WARPS; // the row's first warp
        if (threadIdx.x % 32 == 0) {
#pragma unroll
            for (int i = 0; i < N; i++) {
                slot[warp * N + i] = v[i];
            }
        }
        __syncthreads();
        const int lane = threadIdx.x % 32;
        if constexpr ((WARPS & (WARPS - 1)) == 0) {
            // Lane l reads warp (l % WARPS)'s partials and an xor butterfly
            // over WARPS lanes sums them: one shared load per value instead
            // of WARPS, and, addition being commutative, every lane of
            // every warp ends with the same bits (a fixed tree order).
#pragma unroll
            for (int i = 0; i < N; i++) {
                v[i] = slot[(first + lane % WARPS) * N + i];
            }
#pragma unroll
            for (int off = WARPS / 2; off > 0; off /= 2) {
#pragma unroll
                for (int i = 0; i < N; i++) {
                    v[i] += __shfl_xor_sync(0xffffffffu, v[i], off);
                }
            }
        }
        else { // 3, 5, 6, ... warps: every lane sums them in warp order
#pragma unroll
            for (int i = 0; i < N; i++) {
                v[i] = slot[first * N + i];
            }
#pragma unroll
            for (int w = 1; w < WARPS; w++) {
#pragma unroll
                for (int i = 0; i < N; i++) {
                    v[i] += slot[(first + w) * N + i];
                }
            }
        }
        parity ^= 1;
    }
}

} // namespace gemsops
