// Element types and vector access: the accumulation type of each storage
// type, conversions to and from it, and VEC elements moved as one memory
// access.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

namespace gemsops {

// Accumulation type: fp32 for every float type but fp64.
template <typename T>
struct acc_of {
    using type = float;
};
template <>
struct acc_of<double> {
    using type = double;
};
template <typename T>
using acc_t = typename acc_of<T>::type;

template <typename A>
__device__ __forceinline__ A to_acc(float v)
{
    return v;
}
template <typename A>
__device__ __forceinline__ A to_acc(double v)
{
    return (A)v;
}
template <typename A>
__device__ __forceinline__ A to_acc(__half v)
{
    return (A)__half2float(v);
}
template <typename A>
__device__ __forceinline__ A to_acc(__nv_bfloat16 v)
{
    return (A)__bfloat162float(v);
}

// to_acc for values read in more than one pass. Widening bf16 is one
// instruction (a shift or mask), so the compiler widens each element once
// and keeps every fp32 copy live across the row reductions between the
// passes, which costs the forward registers and with them a CTA per SM.
// As an opaque move it is redone in each pass, as fp16's conversion
// already is (a tighter register bound instead spilled and was slower;
// docs/performance.md).
template <typename A, typename T>
__device__ __forceinline__ A widen(T v)
{
    return to_acc<A>(v);
}
template <>
__device__ __forceinline__ float widen<float, __nv_bfloat16>(__nv_bfloat16 v)
{
    float f;
    const unsigned short zero = 0;
    asm volatile("mov.b32 %0, {%1, %2};"
                 : "=f"(f)
                 : "h"(zero), "h"(__bfloat16_as_ushort(v)));
    return f;
}

template <typename T>
__device__ __forceinline__ T from_acc(float v);
template <>
__device__ __forceinline__ float from_acc<float>(float v)
{
    return v;
}
template <>
__device__ __forceinline__ __half from_acc<__half>(float v)
{
    return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v)
{
    return __float2bfloat16_rn(v);
}
template <typename T>
__device__ __forceinline__ T from_acc(double v)
{
    return (T)v;
}

// VEC elements moved as one access: 16 bytes when the caller proved the
// alignment, one element otherwise. Copies go through raw words: the half
// types' class assignment would otherwise split a vector into 2-byte
// accesses.
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) vec_t {
    T v[VEC];
};

template <int BYTES>
struct raw_word;
template <>
struct raw_word<16> {
    using type = uint4;
};
template <>
struct raw_word<8> {
    using type = uint2;
};
template <>
struct raw_word<4> {
    using type = unsigned;
};
template <>
struct raw_word<2> {
    using type = unsigned short;
};
template <>
struct raw_word<32> {
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

// load_vec on the read-only (non-coherent) path, for data no thread of
// the kernel writes: unlike a plain load, the compiler may issue it ahead
// of earlier stores. 16-byte vectors; other widths as load_vec.
template <typename T, int VEC>
__device__ __forceinline__ vec_t<T, VEC> load_vec_ro(const T *p)
{
    if constexpr (sizeof(T) * VEC == 16) {
        vec_t<T, VEC> out;
        *reinterpret_cast<uint4 *>(&out) =
            __ldg(reinterpret_cast<const uint4 *>(p));
        return out;
    }
    else {
        return load_vec<T, VEC>(p);
    }
}

// A vector of zeros, written as one raw word (element by element, the
// half types' zeros are merged into their words 16 bits at a time).
template <typename T, int VEC>
__device__ __forceinline__ vec_t<T, VEC> zero_vec()
{
    using W = typename raw_word<sizeof(T) * VEC>::type;
    vec_t<T, VEC> out;
    *reinterpret_cast<W *>(&out) = W{};
    return out;
}

template <typename T, int VEC>
__device__ __forceinline__ void store_vec(T *p, const vec_t<T, VEC> &v)
{
    using W = typename raw_word<sizeof(T) * VEC>::type;
    *reinterpret_cast<W *>(p) = *reinterpret_cast<const W *>(&v);
}

// Half types whose vectors are rounded a pair at a time.
template <typename T, int VEC>
__host__ __device__ constexpr bool rounds_in_pairs()
{
    return (std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>) &&
           VEC % 2 == 0;
}

// VEC accumulator values of a half type rounded in pairs into 32-bit words
// (the paired conversion instructions).
template <typename T, int VEC, typename A>
__device__ __forceinline__ void round_pairs(const A (&o)[VEC],
                                            unsigned (&w)[VEC / 2])
{
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
}

// Rounds VEC accumulator values to T and stores them as one access. Half
// types are packed in pairs into 32-bit words first; element-by-element
// construction would be stored as 2-byte pieces.
template <typename T, int VEC, typename A>
__device__ __forceinline__ void store_rounded(T *p, const A (&o)[VEC])
{
    if constexpr (rounds_in_pairs<T, VEC>()) {
        unsigned w[VEC / 2];
        round_pairs<T, VEC>(o, w);
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

// VEC elements of one access widened at once. bf16 pairs come straight
// from their 32-bit words: the low element shifted up, the high one
// masked, one instruction an element, opaque as widen() is so that each
// pass widens again. Element by element, the compiler first splits each
// word into 16-bit registers and widens those (about seven PRMTs an
// element across the LayerNorm forward's three passes).
template <typename A, typename T, int VEC>
__device__ __forceinline__ void widen_vec(const vec_t<T, VEC> &x, A (&f)[VEC])
{
    if constexpr (std::is_same_v<T, __nv_bfloat16> &&
                  std::is_same_v<A, float> && VEC % 2 == 0) {
        const unsigned *w = reinterpret_cast<const unsigned *>(&x);
#pragma unroll
        for (int k = 0; k < VEC / 2; k++) {
            unsigned lo, hi;
            asm volatile("shl.b32 %0, %2, 16;\n\tand.b32 %1, %2, 0xffff0000;"
                         : "=r"(lo), "=r"(hi)
                         : "r"(w[k]));
            f[2 * k] = __uint_as_float(lo);
            f[2 * k + 1] = __uint_as_float(hi);
        }
    }
    else {
#pragma unroll
        for (int v = 0; v < VEC; v++) {
            f[v] = widen<A>(x.v[v]);
        }
    }
}

} // namespace gemsops
