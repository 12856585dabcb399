// Product kernels shared by the prod forward and the backward's first pass
// (tile products). See prod_fwd.cu for the design.
//
// Each thread multiplies VEC lanes independently and folds them as a tree
// at the end; threads meet through shuffles, warps through shared memory.
#pragma once

#include "prod_plan.cuh"

namespace gemsops {

// Element type T -> accumulator A and output type. Floats multiply in fp32
// (fp64 in fp64); bool and integers in uint64, whose wrap-around is the
// int64 two's-complement product torch computes. Bool arrives as uint8.
template <typename T>
struct prod_types {
    using acc = acc_t<T>;
    using out = T;
};
template <>
struct prod_types<uint8_t> {
    using acc = uint64_t;
    using out = int64_t;
};
template <>
struct prod_types<int8_t> {
    using acc = uint64_t;
    using out = int64_t;
};
template <>
struct prod_types<int16_t> {
    using acc = uint64_t;
    using out = int64_t;
};
template <>
struct prod_types<int32_t> {
    using acc = uint64_t;
    using out = int64_t;
};
template <>
struct prod_types<int64_t> {
    using acc = uint64_t;
    using out = int64_t;
};
template <typename T>
using prod_acc = typename prod_types<T>::acc;
template <typename T>
using prod_out = typename prod_types<T>::out;

// Elements per access: 16 bytes, at most 8 lanes (1-byte types move 8).
template <typename T>
constexpr int prod_vec()
{
    return 16 / sizeof(T) < 8 ? 16 / sizeof(T) : 8;
}

template <typename A, typename T>
__device__ __forceinline__ A prod_load(T v)
{
    if constexpr (std::is_integral_v<T>) {
        return (A)(int64_t)v;
    }
    else {
        return to_acc<A>(v);
    }
}

template <typename O, typename A>
__device__ __forceinline__ O prod_store(A v)
{
    if constexpr (std::is_integral_v<O>) {
        return (O)v;
    }
    else {
        return from_acc<O>(v);
    }
}

// VEC elements at p as they are stored: one access when VEC > 1. Loops
// fetch a whole batch before widening any of it.
//
// L2_HINT: a read-only 16-byte load that asks L2 to fetch 128 bytes from
// DRAM on a miss (ld.global.nc.L2::128B): faster where each row is a run
// of its own (per-dim rows). Not used where it measured slower or mixed:
// the interleaved full product, columns. Evict-first (load_vec_last) was
// slower on the rows, or equal without the 128-byte fetch
// (docs/performance.md, prod).
template <typename T, int VEC, bool L2_HINT = false>
__device__ __forceinline__ vec_t<T, VEC> prod_fetch(const T *p)
{
    if constexpr (VEC == 1) {
        vec_t<T, 1> w;
        w.v[0] = *p;
        return w;
    }
    else if constexpr (L2_HINT && sizeof(T) * VEC == 16) {
        vec_t<T, VEC> w;
        uint4 &r = *reinterpret_cast<uint4 *>(&w);
        asm("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4];"
            : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
            : "l"(p));
        return w;
    }
    else {
        return load_vec<T, VEC>(p);
    }
}

// acc[k] *= w[k], widened to A.
template <int VEC, typename A, typename T>
__device__ __forceinline__ void prod_mul_raw(A (&acc)[VEC],
                                             const vec_t<T, VEC> &w)
{
#pragma unroll
    for (int k = 0; k < VEC; k++) {
        acc[k] *= prod_load<A>(w.v[k]);
    }
}

// VEC elements at p, widened to A.
template <typename T, int VEC, typename A>
__device__ __forceinline__ void prod_load_vec(const T *p, A (&v)[VEC])
{
    const vec_t<T, VEC> w = prod_fetch<T, VEC>(p);
#pragma unroll
    for (int k = 0; k < VEC; k++) {
        v[k] = prod_load<A>(w.v[k]);
    }
}

template <int VEC, typename A>
__device__ __forceinline__ void prod_mul(A (&acc)[VEC], const A (&v)[VEC])
{
#pragma unroll
    for (int k = 0; k < VEC; k++) {
        acc[k] *= v[k];
    }
}

// Tree product of the lanes (VEC a power of two): halves fold onto each
// other, one template step per halving so every loop has a constant trip
// count and the lanes stay in registers.
template <int H, int VEC, typename A>
__device__ __forceinline__ void prod_fold_step(A (&v)[VEC])
{
    if constexpr (H > 0) {
#pragma unroll
        for (int k = 0; k < H; k++) {
            v[k] *= v[k + H];
        }
        prod_fold_step<H / 2>(v);
    }
}

template <int VEC, typename A>
__device__ __forceinline__ A prod_fold(A (&v)[VEC])
{
    prod_fold_step<VEC / 2>(v);
    return v[0];
}

// Product over the G consecutive threads of a group (G a power of two up
// to the CTA); the group's first thread gets the result. `warp_part` holds
// one value per warp. Every thread of the CTA calls it (G > 32 syncs).
template <typename A>
__device__ __forceinline__ A prod_group(A v, int G, A *warp_part)
{
    for (int off = (G < 32 ? G : 32) / 2; off > 0; off /= 2) {
        v *= __shfl_xor_sync(0xffffffffu, v, off);
    }
    if (G > 32) {
        const int warp = threadIdx.x / 32;
        if (threadIdx.x % 32 == 0) {
            warp_part[warp] = v;
        }
        __syncthreads();
        if (threadIdx.x % G == 0) {
            for (int w = 1; w < G / 32; w++) {
                v *= warp_part[warp + w];
            }
        }
        __syncthreads(); // warp_part is reused by the next call
    }
    return v;
}

// ---- rows: out[o] = prod_r x[o * row_stride + r] ------------------------
template <typename T>
struct prod_rows_args {
    const T *x;
    int64_t rows, row_stride; // elements between row starts
    int64_t nvec; // vectors of VEC per row (row length / VEC)
    int G; // threads per row: 1..256, a power of two
    int64_t splits, seg; // a row's CTAs, and vectors each one takes
    bool interleaved; // split s takes vectors s*G + lane + k*splits*G
    // (all CTAs stream one window: DRAM locality)
    // instead of the contiguous [s*seg, s*seg+seg)
    prod_out<T> *out; // splits == 1 and partial == NULL: the result
    prod_acc<T> *partial; // else partial[row * splits + split]
};

// Without a bound, ptxas spilled in the fp64 rows and the uint8 columns
// kernels (with 255 registers allowed); a minimum of one CTA stops that. The fp16/bf16/fp32 kernels keep the choices they were
// timed with (a minimum of 1 moves their register counts).
template <typename T>
constexpr int prod_min_ctas_else()
{
    return std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16> ||
                   std::is_same_v<T, float>
               ? 0
               : 1;
}

// CTAs a SM the four-load kernel is compiled for (0: no bound). bf16 and
// fp32 take four (64 registers: 16 KB in flight a CTA). Unbounded, ptxas
// gave bf16 74-80 registers, so three CTAs a SM, and the interleaved full
// product could not keep DRAM busy; fp32 (61-64 unbounded) also measured
// faster bounded (docs/performance.md, prod). fp16 fits in 64 as it is;
// the eight-load and integer kernels keep what they need. (An explicit
// minimum of 1 is not "no bound": it changed ptxas's register choices.)
template <typename T, int U, bool L2_HINT>
constexpr int prod_rows_min_ctas()
{
    constexpr bool four =
        std::is_same_v<T, float> || std::is_same_v<T, __nv_bfloat16>;
    return four && !L2_HINT && U == 4 ? 4 : prod_min_ctas_else<T>();
}

// The rows' tail (fewer than U vectors left): a guarded batch of U loads
// keeps U vectors' registers live; one vector at a time does not. The
// batch spilled in the bounded bf16 kernel (and in the sm_80
// eight-load half kernels) and held bf16's eight-load kernel at 128
// registers; one at a time it takes 64 and is faster. fp16's four-load
// kernel on sm_90 keeps the batch: one at a time measured slower there.
// Its eight-load kernel does not: with the batch it took 80 registers
// (three CTAs a SM) and was slower than four loads; one at a time it
// takes 64 and is the faster (see prod_rows_kernel; docs/performance.md,
// prod).
template <typename T, bool L2_HINT>
__device__ constexpr bool prod_rows_batch_tail()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    return std::is_same_v<T, __half> && !L2_HINT;
#else
    return false;
#endif
}

// Rows: each thread keeps U loads of VEC elements in flight before their
// products. The forward's per-dim rows take U = 8 with the L2 hint
// (measured faster for bf16, and for fp16 with the one-at-a-time tail, on
// short, square and long rows); split rows (full products) and the
// backward keep U = 4. A split row is a grid-stride loop (interleaved),
// so each lane multiplies a long serial chain: near-one products round with
// a downward bias where a partial product crosses 1.0, and short chains
// under a tree cross it far more often (emulated near one, contiguous
// pieces a CTA drift much further than this loop; docs/performance.md,
// prod, "Precision").
template <typename T, int VEC, bool L2_HINT = false, int U = 4>
__global__ void __launch_bounds__(kProdBlock,
                                  prod_rows_min_ctas<T, U, L2_HINT>())
    prod_rows_kernel(const prod_rows_args<T> a)
{
    using A = prod_acc<T>;
    pdl_launch_dependents(); // the combine may launch (prod_combine_kernel)
    __shared__ A warp_part[kProdBlock / 32];
    const int G = a.G;
    const int rows_per_cta = kProdBlock / G;
    const int lane = threadIdx.x % G;
    const int64_t groups = ceil_div(a.rows, rows_per_cta);
    for (int64_t item = blockIdx.x; item < groups * a.splits;
         item += gridDim.x) {
        const int64_t s = item % a.splits;
        const int64_t row = item / a.splits * rows_per_cta + threadIdx.x / G;
        A acc[VEC];
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            acc[k] = A(1);
        }
        if (row < a.rows) {
            const T *p = a.x + row * a.row_stride;
            const int64_t hi =
                a.interleaved ? a.nvec : min((s + 1) * a.seg, a.nvec);
            const int64_t step = a.interleaved ? a.splits * G : G;
            int64_t v = (a.interleaved ? s * G : s * a.seg) + lane;
            // U independent loads in flight before their products
            for (; v + (U - 1) * step < hi; v += U * step) {
                vec_t<T, VEC> w[U];
#pragma unroll
                for (int u = 0; u < U; u++) {
                    w[u] =
                        prod_fetch<T, VEC, L2_HINT>(p + (v + u * step) * VEC);
                }
#pragma unroll
                for (int u = 0; u < U; u++) {
                    prod_mul_raw(acc, w[u]);
                }
            }
            if constexpr (prod_rows_batch_tail<T, L2_HINT>()) {
                if (v < hi) { // fewer than U left: one guarded batch
                    vec_t<T, VEC> w[U];
#pragma unroll
                    for (int u = 0; u < U; u++) {
                        if (v + u * step < hi) {
                            w[u] = prod_fetch<T, VEC, L2_HINT>(
                                p + (v + u * step) * VEC);
                        }
                    }
#pragma unroll
                    for (int u = 0; u < U; u++) {
                        if (v + u * step < hi) {
                            prod_mul_raw(acc, w[u]);
                        }
                    }
                }
            }
            else { // fewer than U left: one at a time, in the same order
                for (; v < hi; v += step) {
                    prod_mul_raw(acc,
                                 prod_fetch<T, VEC, L2_HINT>(p + v * VEC));
                }
            }
        }
        const A r = prod_group(prod_fold<VEC>(acc), G, warp_part);
        if (lane == 0 && row < a.rows) {
            if (a.partial != nullptr) {
                a.partial[row * a.splits + s] = r;
            }
            else {
                a.out[row] = prod_store<prod_out<T>>(r);
            }
        }
    }
}

// ---- cols: out[o, i] = prod_r x[o * outer_stride + r * step + i] --------
template <typename T>
struct prod_cols_args {
    const T *x;
    int64_t outer, outer_stride; // O column groups, elements apart
    int64_t len, step; // R and the stride between its rows
    int64_t inner; // I unit-stride columns
    int tx; // threads across columns (TX), 256/TX down
    int64_t ivecs, iblocks; // column vectors, and blocks of TX of them
    int64_t splits, rchunk; // CTAs down one column block, rows each
    bool interleaved; // split s takes rows s*TY + ty + k*splits*TY
    // instead of [s*rchunk, s*rchunk+rchunk)
    prod_out<T> *out; // partial == NULL: out[o * I + i]
    prod_acc<T> *partial; // else partial[(o * splits + s) * I + i]
};

// EVICT_FIRST: the batched loads are evict-first in L2 (load_vec_last),
// chosen by the planner for 16-byte vectors of an input that fits in L2.
// There a normal read displaces as many bytes of what L2 held, which the
// benchmark's flush leaves dirty; evict-first measured faster on inputs
// that fit. Beyond L2 it measured slower, and the same loads at normal
// priority were slower too: the priority is what helps, not the load path
// (docs/performance.md, prod).
template <typename T, int VEC, bool EVICT_FIRST = false>
__global__ void __launch_bounds__(kProdBlock, prod_min_ctas_else<T>())
    prod_cols_kernel(const prod_cols_args<T> a)
{
    using A = prod_acc<T>;
    pdl_launch_dependents();
    // lane-major so that a warp's accesses fall in distinct banks
    __shared__ A red[VEC * kProdBlock];
    const int TX = a.tx, TY = kProdBlock / a.tx;
    const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;
    const int64_t items = a.outer * a.iblocks * a.splits;
    for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
        const int64_t s = item % a.splits;
        const int64_t ib = item / a.splits % a.iblocks;
        const int64_t o = item / (a.splits * a.iblocks);
        const int64_t iv = ib * TX + tx;
        const bool valid = iv < a.ivecs;
        A acc[VEC];
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            acc[k] = A(1);
        }
        if (valid) {
            const T *p = a.x + o * a.outer_stride + iv * VEC;
            const int64_t hi =
                a.interleaved ? a.len : min((s + 1) * a.rchunk, a.len);
            const int64_t rstep = a.interleaved ? a.splits * TY : TY;
            int64_t r = (a.interleaved ? s * TY : s * a.rchunk) + ty;
            // loads in flight: bf16 takes eight, measured faster; fp16
            // and fp32 measured slower with eight (docs/performance.md,
            // prod)
            constexpr int CU = std::is_same_v<T, __nv_bfloat16> ? 8 : 4;
            for (; r + (CU - 1) * rstep < hi; r += CU * rstep) {
                vec_t<T, VEC> w[CU];
#pragma unroll
                for (int u = 0; u < CU; u++) {
                    const T *q = p + (r + u * rstep) * a.step;
                    if constexpr (EVICT_FIRST) {
                        w[u] = load_vec_last<T, VEC>(q);
                    }
                    else {
                        w[u] = prod_fetch<T, VEC>(q);
                    }
                }
#pragma unroll
                for (int u = 0; u < CU; u++) {
                    prod_mul_raw(acc, w[u]);
                }
            }
            for (; r < hi; r += rstep) {
                A t[VEC];
                prod_load_vec<T, VEC>(p + r * a.step, t);
                prod_mul<VEC>(acc, t);
            }
        }
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            red[k * kProdBlock + threadIdx.x] = acc[k];
        }
        __syncthreads();
        for (int h = TY / 2; h > 0; h /= 2) { // tree down the TY rows
            if (ty < h) {
#pragma unroll
                for (int k = 0; k < VEC; k++) {
                    red[k * kProdBlock + threadIdx.x] *=
                        red[k * kProdBlock + threadIdx.x + h * TX];
                }
            }
            __syncthreads();
        }
        if (ty == 0 && valid) {
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                const int64_t i = iv * VEC + k;
                const A r = red[k * kProdBlock + threadIdx.x];
                if (a.partial != nullptr) {
                    a.partial[(o * a.splits + s) * a.inner + i] = r;
                }
                else {
                    a.out[o * a.inner + i] = prod_store<prod_out<T>>(r);
                }
            }
        }
        __syncthreads(); // red is rewritten by the next item
    }
}

inline int prod_grid(int64_t ctas)
{
    return (int)(ctas < (1LL << 30) ? (ctas > 0 ? ctas : 1) : (1LL << 30));
}

} // namespace gemsops
