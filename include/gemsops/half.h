/* IEEE half and bfloat16 <-> float for the CPU backend, round to nearest
 * even, NaN kept quiet. Stored as raw uint16_t bits. */
#pragma once

#include <stdint.h>
#include <string.h>

static inline float gemsops_bf16_to_float(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t gemsops_float_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    }
    u += 0x7fffu + ((u >> 16) & 1u); /* round half to even */
    return (uint16_t)(u >> 16);
}

static inline float gemsops_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0x1fu) {
        u = sign | 0x7f800000u | (man << 13); /* inf or NaN */
    }
    else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    }
    else if (man == 0) {
        u = sign; /* signed zero */
    }
    else { /* subnormal: value = man * 2^-24 */
        float f = (float)man * 5.9604644775390625e-8f;
        memcpy(&u, &f, sizeof u);
        u |= sign;
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t gemsops_float_to_half(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) {
        return (uint16_t)(sign | 0x7e00u); /* NaN */
    }
    if (abs >= 0x477ff000u) { /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00u);
    }
    if (abs >= 0x38800000u) { /* normal half: rebias, round to even */
        uint32_t mant_round = abs + 0xfffu + ((abs >> 13) & 1u);
        return (uint16_t)(sign | ((mant_round - 0x38000000u) >> 13));
    }
    /* subnormal or zero: scale so the half ulp (2^-24) lands on 1.0, then
     * let the float unit round to nearest even */
    float a;
    memcpy(&a, &abs, sizeof a);
    float scaled = a * 16777216.0f; /* 2^24 */
    uint32_t q = (uint32_t)__builtin_rintf(scaled);
    return (uint16_t)(sign | q);
}
