// The row shape both LayerNorm directions start from: TPR consecutive
// threads own a row, each holding E elements in registers (E/VEC accesses
// of VEC elements). Short rows: TPR < 128, several rows per 128-thread
// CTA. A row longer than max_tpr * E gets max_tpr-or-fewer threads per
// slab and `split` slabs: the backward gives each slab a CTA
// (layer_norm_bwd_plan.cuh), the forward streams such rows instead and
// never asks for a split.
#pragma once

#include <initializer_list>
#include <stddef.h>
#include <stdint.h>

namespace gemsops {

constexpr int kLayerNormTprChoices[] = {4, 8, 16, 32, 128, 256, 512, 1024};
// The forward's: also whole numbers of warps between the powers of two, so
// that a row leaves fewer threads idle (1536 half elements at 32 a thread
// take 48 threads: 64, not 128), and one or two threads for rows of at
// most 2 * E elements (64 half elements on four threads would leave half
// of each thread's accesses empty).
constexpr int kLayerNormFwdTprChoices[] = {1,   2,   4,   8,   16,  32,
                                           64,  96,  128, 160, 192, 256,
                                           320, 384, 512, 640, 768, 1024};

struct layer_norm_shape {
    int tpr; // threads per row (slab)
    int split; // CTAs per row
};

template <size_t K = sizeof(kLayerNormTprChoices) / sizeof(int)>
inline layer_norm_shape layer_norm_choose_shape(
    int64_t cols, int e, int max_tpr = 1024,
    const int (&choices)[K] = kLayerNormTprChoices)
{
    layer_norm_shape s = {max_tpr, 1};
    if (cols <= max_tpr * (int64_t)e) {
        for (int tpr : choices) {
            if ((int64_t)tpr * e >= cols) {
                s.tpr = tpr;
                break;
            }
        }
        return s;
    }
    // Split: the fewest padded columns, then the fewest CTAs per row.
    int64_t best_padded = INT64_MAX;
    for (int tpr = max_tpr; tpr >= 128; tpr /= 2) {
        int64_t slab = (int64_t)tpr * e;
        int64_t k = (cols + slab - 1) / slab;
        if (k * slab < best_padded) {
            best_padded = k * slab;
            s.tpr = tpr;
            s.split = (int)k;
        }
    }
    return s;
}

// Rows of 4 to 64 threads share a 128-thread CTA; wider ones (a power of
// two or not) have a CTA each.
__host__ __device__ constexpr int layer_norm_block_threads(int tpr)
{
    return tpr < 128 && 128 % tpr == 0 ? 128 : tpr;
}

// 16-byte accesses (V elements of T) need whole vectors per row, every
// row start and row base 16-byte aligned, and each parameter pointer
// aligned to a vector of V of its own type P. Both directions ask this.
template <typename T, typename P>
inline bool layer_norm_vectors_fit(int64_t cols,
                                   std::initializer_list<int64_t> strides,
                                   std::initializer_list<const void *> rows,
                                   std::initializer_list<const void *> params)
{
    constexpr int V = 16 / sizeof(T);
    auto aligned = [](const void *q, uintptr_t n) {
        return q == nullptr || ((uintptr_t)q % n) == 0;
    };
    bool ok = cols % V == 0;
    for (int64_t s : strides) {
        ok = ok && s % V == 0;
    }
    for (const void *q : rows) {
        ok = ok && aligned(q, 16);
    }
    for (const void *q : params) {
        ok = ok && aligned(q, sizeof(P) * V);
    }
    return ok;
}

} // namespace gemsops
