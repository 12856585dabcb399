// Shared CUDA helpers: error checking, element types, vector access,
// reductions across a row's threads, the device guard and per-device facts.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "gemsops/status.h"
#include "gemsops/tensor.h"

// Every CUDA runtime call goes through this: on failure it records the call
// text, file, line and the CUDA error name, and returns from the caller.
#define GEMSOPS_CUDA_CHECK(st, call)                                          \
    do {                                                                      \
        cudaError_t gemsops_err_ = (call);                                    \
        if (gemsops_err_ != cudaSuccess) {                                    \
            return gemsops_fail((st), GEMSOPS_ERR_RUNTIME,                    \
                                "%s failed at %s:%d: %s (%s)", #call,         \
                                __FILE__, __LINE__,                           \
                                cudaGetErrorName(gemsops_err_),               \
                                cudaGetErrorString(gemsops_err_));            \
        }                                                                     \
    } while (0)

// After each launch: configuration errors surface here, not at a later call.
#define GEMSOPS_CUDA_CHECK_LAUNCH(st, kernel_name)                            \
    do {                                                                      \
        cudaError_t gemsops_err_ = cudaGetLastError();                        \
        if (gemsops_err_ != cudaSuccess) {                                    \
            return gemsops_fail((st), GEMSOPS_ERR_RUNTIME,                    \
                                "launch of %s failed at %s:%d: %s (%s)",      \
                                kernel_name, __FILE__, __LINE__,              \
                                cudaGetErrorName(gemsops_err_),               \
                                cudaGetErrorString(gemsops_err_));            \
        }                                                                     \
    } while (0)

namespace gemsops {

// Accumulation type: fp32 for every float type but fp64.
template <typename T> struct acc_of { using type = float; };
template <> struct acc_of<double> { using type = double; };
template <typename T> using acc_t = typename acc_of<T>::type;

template <typename A> __device__ __forceinline__ A to_acc(float v) { return v; }
template <typename A> __device__ __forceinline__ A to_acc(double v) { return (A)v; }
template <typename A> __device__ __forceinline__ A to_acc(__half v) { return (A)__half2float(v); }
template <typename A> __device__ __forceinline__ A to_acc(__nv_bfloat16 v) { return (A)__bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_acc(float v);
template <> __device__ __forceinline__ float from_acc<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <typename T> __device__ __forceinline__ T from_acc(double v) { return (T)v; }

// VEC elements moved as one access: 16 bytes when the caller proved the
// alignment, one element otherwise.
template <typename T, int VEC> struct alignas(sizeof(T) * VEC) vec_t {
    T v[VEC];
};

template <typename T, int VEC>
__device__ __forceinline__ vec_t<T, VEC> load_vec(const T *p)
{
    return *reinterpret_cast<const vec_t<T, VEC> *>(p);
}

template <typename T, int VEC>
__device__ __forceinline__ void store_vec(T *p, const vec_t<T, VEC> &v)
{
    *reinterpret_cast<vec_t<T, VEC> *>(p) = v;
}

// Sum over the TPR consecutive threads that share a row. TPR <= 32: xor
// shuffles stay inside the aligned group. TPR > 32: one row per CTA, warp
// sums meet in shared memory. `red` alternates between two slots so that a
// following call cannot overwrite a slot another warp is still reading.
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
        if (threadIdx.x % 32 == 0) {
#pragma unroll
            for (int i = 0; i < N; i++) {
                slot[warp * N + i] = v[i];
            }
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < N; i++) {
            A s = 0;
#pragma unroll
            for (int w = 0; w < WARPS; w++) {
                s += slot[w * N + i];
            }
            v[i] = s;
        }
        parity ^= 1;
    }
}

template <int TPR, typename A>
__device__ __forceinline__ A row_sum1(A v, A *red, int &parity)
{
    A a[1] = {v};
    row_sum<TPR, 1>(a, red, parity);
    return a[0];
}

// Cross-CTA handshake for rows split over several CTAs: release makes this
// CTA's partial visible before the count; acquire makes peers' partials
// visible after it.
__device__ __forceinline__ void release_add(unsigned *p, unsigned v)
{
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v)
                 : "memory");
}

__device__ __forceinline__ unsigned acquire_load(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                 : "=r"(v)
                 : "l"(p)
                 : "memory");
    return v;
}

// Facts about a device, read once and cached (SM count, max threads/SM).
struct device_facts {
    int sm_count;
    int max_threads_per_sm;
    int cc_major;
};
int get_device_facts(int device, device_facts *out, gemsops_status *st);

// Makes `device` current for the scope and restores the previous one.
struct device_guard {
    int previous = -1;
    cudaError_t enter(int device)
    {
        cudaError_t e = cudaGetDevice(&previous);
        if (e != cudaSuccess || previous == device) {
            return e;
        }
        return cudaSetDevice(device);
    }
    ~device_guard()
    {
        int now;
        if (previous >= 0 && cudaGetDevice(&now) == cudaSuccess &&
            now != previous) {
            cudaSetDevice(previous);
        }
    }
};

} // namespace gemsops
