// How fast the wgmma mainloop's k-step can go once its operands sit in
// shared memory: no loads, no barriers, the same instructions as
// matmul_wgmma.cuh's mac() (four m64nNk16 a k-step of 64, one commit, a
// wait for the group before), issued by WG warpgroups of one CTA an SM,
// into NACC accumulator sets taken in turn (NACC = 1: every wgmma of a
// step waits on the one before it, as mac() issues them).
//
// A k-step of 64 is 64 * WG x N x 64 MACs; an H100 SXM's tensor cores
// take ~2048 bf16 MACs a clock an SM (docs/performance.md, Floors), so
// the 64 x 64 step's floor is 128 clocks, 128 x 256's 1024. A step well
// above its floor is latency-bound: the chain of dependent wgmmas or the
// commit and wait, not the tensor cores.
//
// build: nvcc -std=c++17 -O3 -arch=sm_90a -I csrc/cuda \
//            tools/wgmma_chain.cu -o wgmma_chain
// run:   ./wgmma_chain  (one line a variant: clocks a k-step, MAC a clock
//        an SM, the floor's share)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <vector>

#include "matmul_wgmma_ptx.cuh"

using namespace gemsops;

#define CHECK(call)                                                       \
    do {                                                                  \
        cudaError_t e_ = (call);                                          \
        if (e_ != cudaSuccess) {                                          \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__,            \
                    cudaGetErrorString(e_));                              \
            exit(1);                                                      \
        }                                                                 \
    } while (0)

template <int N, int NACC, int WG>
__global__ void __launch_bounds__(128 * WG, 1)
    wgmma_chain_kernel(int steps, long long *clocks, float *sink)
{
#ifdef GEMSOPS_HAS_WGMMA // the device pass for sm_90a
    constexpr int kAtomBytes = 64 * 128; // 64 rows x 64 halves, swizzled
    extern __shared__ __align__(1024) unsigned char smem[];
    const int bytes = WG * kAtomBytes + N * 128;
    for (int i = threadIdx.x; i < bytes / 2; i += blockDim.x) {
        reinterpret_cast<__nv_bfloat16 *>(smem)[i] =
            __float2bfloat16((float)(i % 13) * 0.01f);
    }
    fence_proxy_async_shared(); // the stores above, visible to wgmma
    __syncthreads();
    const unsigned base = (unsigned)__cvta_generic_to_shared(smem);
    const unsigned g = threadIdx.x / 128;
    const uint64_t da = wgmma_desc(base + g * kAtomBytes, 16, 1024);
    const uint64_t db = wgmma_desc(base + WG * kAtomBytes, 16, 1024);
    float acc[NACC][N / 2];
#pragma unroll
    for (int s = 0; s < NACC; s++) {
#pragma unroll
        for (int e = 0; e < N / 2; e++) {
            acc[s][e] = 0.f;
        }
    }
    long long t0 = 0;
    for (int i = -8; i < steps; i++) { // 8 steps of warm-up
        if (i == 0) {
            wgmma_wait<0>();
            __syncthreads();
            t0 = clock64();
        }
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            wgmma_m64k32bytes<__nv_bfloat16, N, 0, 0>(acc[kk % NACC],
                                                       da + kk * 2,
                                                       db + kk * 2);
        }
        wgmma_commit();
        wgmma_wait<1>();
    }
    wgmma_wait<0>();
    __syncthreads();
    const long long t1 = clock64();
    float s = 0.f;
#pragma unroll
    for (int a = 0; a < NACC; a++) {
#pragma unroll
        for (int e = 0; e < N / 2; e++) {
            s += acc[a][e];
        }
    }
    sink[blockIdx.x * blockDim.x + threadIdx.x] = s;
    if (threadIdx.x == 0) {
        clocks[blockIdx.x] = t1 - t0;
    }
#else
    (void)steps, (void)clocks, (void)sink;
#endif
}

template <int N, int NACC, int WG>
void run(int sms, int steps)
{
    auto kernel = wgmma_chain_kernel<N, NACC, WG>;
    const int smem = 200 * 1024; // one CTA an SM
    CHECK(cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    long long *clocks;
    float *sink;
    CHECK(cudaMalloc(&clocks, sms * sizeof(long long)));
    CHECK(cudaMalloc(&sink, (size_t)sms * 128 * WG * sizeof(float)));
    for (int rep = 0; rep < 2; rep++) { // the first launch warms up
        kernel<<<sms, 128 * WG, smem>>>(steps, clocks, sink);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
    }
    std::vector<long long> h(sms);
    CHECK(cudaMemcpy(h.data(), clocks, sms * sizeof(long long),
                     cudaMemcpyDeviceToHost));
    std::sort(h.begin(), h.end());
    const double step = (double)h[sms / 2] / steps;
    const double macs = 64.0 * WG * N * 64;
    printf("%3d x %3d (%d warpgroup%s), %d accumulator set%s: %7.1f clocks "
           "a k-step, %6.0f MAC/clock/SM (floor %5.1f%%)\n",
           64 * WG, N, WG, WG > 1 ? "s" : "", NACC, NACC > 1 ? "s" : "",
           step, macs / step, 100.0 * macs / step / 2048.0);
    CHECK(cudaFree(clocks));
    CHECK(cudaFree(sink));
}

int main()
{
    int sms;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int steps = 4096;
    run<64, 1, 1>(sms, steps);
    run<64, 2, 1>(sms, steps);
    run<64, 4, 1>(sms, steps);
    run<64, 1, 2>(sms, steps);
    run<64, 2, 2>(sms, steps);
    run<80, 1, 2>(sms, steps);
    run<80, 2, 2>(sms, steps);
    run<96, 1, 2>(sms, steps);
    run<96, 2, 2>(sms, steps);
    run<128, 1, 1>(sms, steps);
    run<128, 2, 1>(sms, steps);
    run<128, 1, 2>(sms, steps);
    run<128, 2, 2>(sms, steps);
    run<160, 1, 2>(sms, steps);
    run<192, 1, 2>(sms, steps);
    run<256, 1, 1>(sms, steps);
    run<256, 1, 2>(sms, steps);
    return 0;
}
