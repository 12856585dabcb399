/* SIMD clones for the CPU backend's hot row loops: on x86-64 with GCC, a
 * function marked GEMSOPS_SIMD_CLONES is compiled three times, for the
 * baseline (SSE2), x86-64-v3 (AVX2, FMA) and x86-64-v4 (AVX-512), and the
 * loader picks the one the CPU runs (glibc ifunc). The wheel stays
 * portable; double loops run 2, 4 or 8 wide. (v4 measured faster than v3
 * on several LayerNorm cases: docs/performance.md, CPU backend.)
 * Elsewhere: one plain build. */
#pragma once

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && \
    defined(__linux__)
#define GEMSOPS_SIMD_CLONES \
    __attribute__((         \
        target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define GEMSOPS_SIMD_CLONES
#endif
