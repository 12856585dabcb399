// The matmul epilogue, shared by the Stream-K driver and the skinny-rows
// kernel: C = alpha * acc + beta * bias in fp32 before the one rounding
// (addmm's, as cuBLAS does it).
#pragma once

#include "convert.cuh" // widen

namespace gemsops {

// The launch's parameters are read once a tile into this value. Per pair
// of columns (c, c + 1) of row r: the two addends (0 outside C: nothing is
// loaded there, and the store drops those values). A bias broadcast over
// the rows (nn.Linear's) gives the same addends to every row: one lookup
// serves the thread's two rows. The unrolled epilogue runs once a tile as
// straight code, so its length is kept down.
template <typename T>
struct epilogue_op {
    const T *bias; // at the tile's batch; nullptr: alpha alone
    int64_t rs, cs, m, n;
    float alpha, beta;

    // bias: NULL, or the addend over [batch, m, n] with strides (bs, rs,
    // cs); bt: the batch of the values this epilogue finishes
    __device__ __forceinline__ epilogue_op(const void *b, int64_t bs,
                                           int64_t rs_, int64_t cs_,
                                           int64_t m_, int64_t n_,
                                           float alpha_, float beta_,
                                           int64_t bt)
        : bias(b == nullptr ? nullptr : static_cast<const T *>(b) + bt * bs),
          rs(rs_),
          cs(cs_),
          m(m_),
          n(n_),
          alpha(alpha_),
          beta(beta_)
    {
    }
    __device__ __forceinline__ bool same_rows() const
    {
        return rs == 0 || bias == nullptr;
    }
    // v (an accumulator) with the addend a of its place
    __device__ __forceinline__ float apply(float v, float a) const
    {
        return bias == nullptr ? v * alpha : v * alpha + a;
    }
    // the addend of (r, c), inside C
    __device__ __forceinline__ float addend(int64_t r, int64_t c) const
    {
        return bias == nullptr
                   ? 0.f
                   : beta * widen<float>(__ldg(bias + r * rs + c * cs));
    }
    __device__ __forceinline__ void addends(int64_t r, int64_t c, float &a0,
                                            float &a1) const
    {
        a0 = a1 = 0.f;
        if (bias == nullptr || r >= m) {
            return;
        }
        const T *b = bias + r * rs + c * cs;
        if (c < n) {
            a0 = beta * widen<float>(__ldg(b));
        }
        if (c + 1 < n) {
            a1 = beta * widen<float>(__ldg(b + cs));
        }
    }
};

} // namespace gemsops
