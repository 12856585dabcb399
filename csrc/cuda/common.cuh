// Shared CUDA helpers: error checking, element types, vector access,
// reductions across a row's threads, the device guard and per-device facts.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

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

// to_acc for values read in more than one pass. Widening bf16 is one
// instruction (a shift or mask), so the compiler widens each element once
// and keeps every fp32 copy live across the row reductions between the
// passes (forward: 71 registers, three 256-thread CTAs per SM). As an
// opaque move it is redone in each pass, as fp16's conversion already is
// (forward: 64 registers, four CTAs; 8192 x 8192 bf16 100.5 -> 98.1 us,
// same-run A/B on the H100, where a 64-register bound instead spilled and
// lost 8-10%).
template <typename A, typename T> __device__ __forceinline__ A widen(T v) { return to_acc<A>(v); }
template <> __device__ __forceinline__ float widen<float, __nv_bfloat16>(__nv_bfloat16 v)
{
    float f;
    const unsigned short zero = 0;
    asm volatile("mov.b32 %0, {%1, %2};" : "=f"(f) : "h"(zero), "h"(__bfloat16_as_ushort(v)));
    return f;
}

template <typename T> __device__ __forceinline__ T from_acc(float v);
template <> __device__ __forceinline__ float from_acc<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <typename T> __device__ __forceinline__ T from_acc(double v) { return (T)v; }

// VEC elements moved as one access: 16 bytes when the caller proved the
// alignment, one element otherwise. Copies go through raw words: the half
// types' class assignment would otherwise split a vector into 2-byte
// accesses.
template <typename T, int VEC> struct alignas(sizeof(T) * VEC) vec_t {
    T v[VEC];
};

template <int BYTES> struct raw_word;
template <> struct raw_word<16> { using type = uint4; };
template <> struct raw_word<8> { using type = uint2; };
template <> struct raw_word<4> { using type = unsigned; };
template <> struct raw_word<2> { using type = unsigned short; };
template <> struct raw_word<32> {
    struct alignas(32) type {
        uint4 lo, hi;
    };
};

template <typename T, int VEC>
__device__ __forceinline__ vec_t<T, VEC> load_vec(const T *p)
{
    using W = typename raw_word<sizeof(T) * VEC>::type;
    vec_t<T, VEC> out;
    *reinterpret_cast<W *>(&out) = *reinterpret_cast<const W *>(p);
    return out;
}

// Evict-first in L2, for data a kernel reads for the last time: its lines
// become the first victims of their sets, so the read displaces little of
// what was in L2 before it. What was there is often a producer's output,
// dirty: a normal-priority read of B bytes writes back up to B bytes of it
// while the kernel runs (the benchmarks' L2 flush leaves ~50 MB of dirty
// lines, so it shows there too). Where it pays is measured per use.
__device__ __forceinline__ uint64_t l2_evict_first_policy()
{
    uint64_t policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;"
        : "=l"(policy));
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

template <typename T, int VEC>
__device__ __forceinline__ void store_vec(T *p, const vec_t<T, VEC> &v)
{
    using W = typename raw_word<sizeof(T) * VEC>::type;
    *reinterpret_cast<W *>(p) = *reinterpret_cast<const W *>(&v);
}

// Rounds VEC accumulator values to T and stores them as one access. Half
// types are packed in pairs into 32-bit words first (the paired conversion
// instructions); element-by-element construction would be stored as 2-byte
// pieces.
template <typename T, int VEC, typename A>
__device__ __forceinline__ void store_rounded(T *p, const A (&o)[VEC])
{
    if constexpr ((std::is_same_v<T, __nv_bfloat16> ||
                   std::is_same_v<T, __half>) && VEC % 2 == 0) {
        unsigned w[VEC / 2];
#pragma unroll
        for (int k = 0; k < VEC / 2; k++) {
            if constexpr (std::is_same_v<T, __nv_bfloat16>) {
                __nv_bfloat162 h = __floats2bfloat162_rn(o[2 * k], o[2 * k + 1]);
                w[k] = *reinterpret_cast<unsigned *>(&h);
            }
            else {
                __half2 h = __floats2half2_rn(o[2 * k], o[2 * k + 1]);
                w[k] = *reinterpret_cast<unsigned *>(&h);
            }
        }
        // one explicit 16-byte store: the compiler otherwise splits the
        // packed words into separate 4-byte stores
        if constexpr (VEC == 8) {
            asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p),
                         "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
                         : "memory");
        }
        else if constexpr (VEC == 4) {
            *reinterpret_cast<uint2 *>(p) = make_uint2(w[0], w[1]);
        }
        else {
            *reinterpret_cast<unsigned *>(p) = w[0];
        }
    }
    else {
        vec_t<T, VEC> out;
#pragma unroll
        for (int v = 0; v < VEC; v++) {
            out.v[v] = from_acc<T>(o[v]);
        }
        store_vec<T, VEC>(p, out);
    }
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
        // Lane l reads warp (l % WARPS)'s partials and an xor butterfly
        // over WARPS lanes sums them: one shared load per value instead of
        // WARPS, and, addition being commutative, every lane of every warp
        // ends with the same bits (a fixed tree order).
        const int lane = threadIdx.x % 32;
#pragma unroll
        for (int i = 0; i < N; i++) {
            v[i] = slot[(lane % WARPS) * N + i];
        }
#pragma unroll
        for (int off = WARPS / 2; off > 0; off /= 2) {
#pragma unroll
            for (int i = 0; i < N; i++) {
                v[i] += __shfl_xor_sync(0xffffffffu, v[i], off);
            }
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

// cp.async: global -> shared copies that bypass registers, so a thread can
// keep several rows or tiles in flight while it computes. 16-byte copies
// skip L1 (.cg); `valid` false zero-fills the destination. The "memory"
// clobbers keep ordinary shared-memory reads of a landed stage after the
// wait and before the copy that refills it.
__device__ __forceinline__ void cp_async16(unsigned smem, const void *gmem,
                                           bool valid = true)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem),
                 "l"(gmem), "r"(valid ? 16 : 0)
                 : "memory");
}

// The same 16 bytes through L1 (.ca). Where a warp's 32 copies cover
// 512 contiguous bytes, .cg sent each thread's 16 bytes to L2 on its own:
// L2 served every 32-byte sector twice (ncu, H100, LayerNorm backward at
// 16384 x 4096 bf16: 16.8M L2 read sectors for 8.4M of data, read hit
// rate 50%, L2 as busy as DRAM). Through L1 the copies of a warp are
// coalesced into whole sectors: 8.4M, and the kernel 151 -> 141 us.
__device__ __forceinline__ void cp_async16_ca(unsigned smem, const void *gmem)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(smem),
                 "l"(gmem)
                 : "memory");
}

// 4- or 8-byte copy through L1 (.ca: the only mode for small sizes).
template <int BYTES>
__device__ __forceinline__ void cp_async_small(unsigned smem, const void *gmem)
{
    static_assert(BYTES == 4 || BYTES == 8, "cp.async.ca takes 4 or 8 bytes");
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(smem),
                 "l"(gmem), "n"(BYTES)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}

// Waits until at most N of this thread's committed groups are pending.
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ unsigned smem_addr(const void *p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}

// mbarriers (sm_90): a shared-memory barrier whose phase completes once
// `count` threads have arrived and the bytes a transaction expects have
// landed. Used with the copy engine (TMA, bulk copies), whose writes to
// shared memory are visible to a thread once its wait on the phase returns.
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar),
                 "r"(count)
                 : "memory");
}
// Makes the initialised barriers visible to the async proxy (TMA).
__device__ __forceinline__ void mbar_init_fence()
{
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(
                     bar),
                 "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity)
{
    asm volatile("{\n.reg .pred done;\nWAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra WAIT;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}
// Arrive on `bar` (release: this thread's shared-memory reads before it
// are done before the phase completes, so a producer may then overwrite).
__device__ __forceinline__ void mbar_arrive(unsigned bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar)
                 : "memory");
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global
// to shared memory by the copy engine, counted toward `bar`'s transaction;
// `policy` is an L2 cache policy (createpolicy).
__device__ __forceinline__ void bulk_load(unsigned dst, const void *src,
                                          unsigned bytes, unsigned bar,
                                          uint64_t policy)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx"
                 "::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(policy)
                 : "memory");
}

// Programmatic dependent launch (sm_90). A grid launched after this one
// with programmatic stream serialization may start once every CTA here has
// called pdl_launch_dependents() or exited; it calls pdl_wait_primary()
// before touching what this grid writes, which returns once this grid has
// completed and its memory operations are visible. Both are no-ops before
// sm_90, and the wait returns at once for a grid launched normally.
__device__ __forceinline__ void pdl_launch_dependents()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait_primary()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Launches `kernel` as a programmatic dependent of the grid before it on
// `stream` where `pdl` (sm_90 and later): it may be scheduled once that
// grid's CTAs have called pdl_launch_dependents(), so its launch overlaps
// their tail; it must call pdl_wait_primary() before reading what they
// wrote. Without `pdl`, a plain launch.
template <typename... Params, typename... Args>
cudaError_t launch_dependent(void (*kernel)(Params...), dim3 grid,
                             dim3 block, cudaStream_t stream, bool pdl,
                             Args... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.stream = stream;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}

// Facts about a device, read once and cached (SM count, max threads/SM).
struct device_facts {
    int sm_count;
    int max_threads_per_sm;
    int cc_major, cc_minor;
    int smem_per_block_optin; // bytes of shared memory one CTA may ask for
    int smem_per_sm;          // bytes of shared memory of one SM
    int l2_bytes;             // L2 cache size
};
int get_device_facts(int device, device_facts *out, gemsops_status *st);

// CTAs of `kernel` (launched with `block` threads and `smem` bytes of
// dynamic shared memory) that fit on the whole device at once, from the
// occupancy calculator; cached per (kernel, device, block, smem). It first
// raises the kernel's dynamic shared-memory limit to `smem` (needed once
// static plus dynamic exceed 48 KB). The caller must have made `device`
// current.
int resident_ctas(const void *kernel, int device, int block, int smem,
                  int *out, gemsops_status *st);

// Makes `device` current for the scope and restores the previous one.
// cudaSetDevice runs even when `device` is already the current ordinal: a
// thread that never touched the runtime reports device 0 with no context
// current, and driver-API calls (the TMA encoder) need the primary context
// current, which cudaSetDevice makes it.
struct device_guard {
    int previous = -1;
    cudaError_t enter(int device)
    {
        cudaError_t e = cudaGetDevice(&previous);
        if (e != cudaSuccess) {
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
