/* IEEE half and bfloat16 <-> float for the CPU backend, round to nearest
 * even, NaN kept quiet. Stored as raw uint16_t bits. */
#pragma once

#include <stdint.h>

/* Bit casts through a union (C11 6.5.2.3): GCC vectorizes loops over
 * these, where memcpy into a local left a temporary array in the loop. */
static inline float
gemsops_bits_to_float(uint32_t u)
{
    union {
        uint32_t u;
        float f;
    } v = {.u = u};
    return v.f;
}

static inline uint32_t
gemsops_float_to_bits(float f)
{
    union {
        float f;
        uint32_t u;
    } v = {.f = f};
    return v.u;
}

/* c ? a : b as bit masks. A ?: whose arm holds a float operation is not
 * if-converted under the default -ftrapping-math, which left the half
 * conversions' loops scalar. */
static inline uint32_t
gemsops_select_u32(int c, uint32_t a, uint32_t b)
{
    const uint32_t m = 0u - (uint32_t)(c != 0);
    return (a & m) | (b & ~m);
}

static inline float
gemsops_bf16_to_float(uint16_t h)
{
    return gemsops_bits_to_float((uint32_t)h << 16);
}

static inline uint16_t
gemsops_float_to_bf16(float f)
{
    const uint32_t u = gemsops_float_to_bits(f);
    const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u); /* to even */
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u
                          ? (u >> 16) | 0x40u /* quiet NaN */
                          : rounded >> 16);
}

/* Branch-free (masks), so that row loops vectorize: the exponent and mantissa
 * bits moved into float position read as value * 2^-112 for normal and
 * subnormal halves alike (a subnormal lands on a float subnormal), and one
 * exact multiply by 2^112 restores it; inf/NaN (exponent 31) take the
 * float's all-ones exponent by a select. Equal, bit for bit, to the
 * case-by-case conversion on all 65536 inputs (checked when written). */
static inline float
gemsops_half_to_float(uint16_t h)
{
    const uint32_t t = (uint32_t)(h & 0x7fffu) << 13;
    uint32_t u = gemsops_float_to_bits(gemsops_bits_to_float(t) * 0x1p112f);
    u = gemsops_select_u32((h & 0x7c00u) == 0x7c00u, t | 0x70000000u, u);
    return gemsops_bits_to_float(u | (uint32_t)(h & 0x8000u) << 16);
}

/* Branch-free (masks), so that row loops vectorize. Normal halves:
 * rebias and round the mantissa to nearest even in integer arithmetic;
 * subnormals and zero: a * 2^24 + 2^23 rounds a to a multiple of the half
 * ulp (2^-24) in the float adder (nearest even), whose low bits are then
 * the half's; >= 65520 overflows to inf; NaN stays a quiet NaN. Equal,
 * bit for bit, to the case-by-case conversion on all 2^32 floats
 * (checked when written). */
static inline uint16_t
gemsops_float_to_half(float f)
{
    const uint32_t u = gemsops_float_to_bits(f);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t abs = u & 0x7fffffffu;
    const uint32_t normal =
        (abs + 0xfffu + ((abs >> 13) & 1u) - 0x38000000u) >> 13;
    const uint32_t sub =
        gemsops_float_to_bits(gemsops_bits_to_float(abs) * 0x1p24f + 0x1p23f) -
        0x4b000000u;
    uint32_t h = gemsops_select_u32(abs >= 0x38800000u, normal, sub);
    h = gemsops_select_u32(abs >= 0x477ff000u, 0x7c00u, h); /* >= 65520: inf */
    h = gemsops_select_u32(abs > 0x7f800000u, 0x7e00u, h); /* NaN */
    return (uint16_t)(sign | h);
}
