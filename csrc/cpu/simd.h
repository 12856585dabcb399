/* SIMD clones for the CPU backend's hot row loops: on x86-64 with GCC, a
 * function marked GEMSOPS_SIMD_CLONES is compiled twice, for the baseline
 * (SSE2) and for x86-64-v3 (AVX2, FMA), and the loader picks the one the
 * CPU runs (glibc ifunc). The wheel stays portable; an AVX2 machine gets
 * 4-wide double loops instead of 2-wide. Elsewhere: one plain build. */
#pragma once

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && \
    defined(__linux__)
#define GEMSOPS_SIMD_CLONES \
    __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define GEMSOPS_SIMD_CLONES
#endif
