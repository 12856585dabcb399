// The tensor-core mainloop of the Stream-K matmul (fp16/bf16, sm_80+):
// a 128 x 128 tile per CTA, k-steps of 32, 8 warps as 2 (M) x 4 (N), each
// warp 64 x 32 of the tile as 4 x 4 mma.sync.m16n8k16 (fp32 accumulate).
// Larger warp and CTA tiles were measured and did not help, so neither
// shared-memory nor L2 bandwidth is what holds it (docs/performance.md,
// matmul).
//
// Global -> shared: cp.async 16-byte chunks into a 3-stage ring (the loads
// of step k+2 fly while step k computes). Shared -> registers: ldmatrix.x4.
// A is taken K-contiguous, stored [128 m][32 k]; B is stored as it comes:
// K-contiguous ([128 n][32 k], ldmatrix) or N-contiguous ([32 k][128 n],
// ldmatrix.trans). Rows of 16-byte chunks are XOR-swizzled so that the 8
// rows one ldmatrix reads fall in distinct banks. Edges: chunks past M, N or
// K are zero-filled (cp.async src-size 0); the planner sends only problems
// whose chunks are whole and aligned (k and the contiguous extent of B
// multiples of 8, pointers and strides 16-byte aligned) here, the rest to
// the FFMA mainloop.
#pragma once

#include <cuda.h> // CUtensorMap (a type: nothing links the driver)

#include "common.cuh"
#include "gemsops/streamk.h"

namespace gemsops {

// d += a * b for one m16n8k16 tile (fp32 accumulators); the two element
// types differ only in the instruction's type suffix.
#define GEMSOPS_MMA_M16N8K16(TYPE)                                      \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE \
                 ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "         \
                 "{%0,%1,%2,%3};"                                       \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])       \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), \
                   "r"(b1))

template <typename T>
struct mma_op {
    static __device__ __forceinline__ void run(float (&d)[4],
                                               const unsigned (&a)[4],
                                               unsigned b0, unsigned b1)
    {
        static_assert(std::is_same_v<T, __half> ||
                          std::is_same_v<T, __nv_bfloat16>,
                      "mma_op: fp16 or bf16");
        if constexpr (std::is_same_v<T, __half>) {
            GEMSOPS_MMA_M16N8K16("f16");
        }
        else {
            GEMSOPS_MMA_M16N8K16("bf16");
        }
    }
};
#undef GEMSOPS_MMA_M16N8K16

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, "
                 "[%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4],
                                                  unsigned addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 "
                 "{%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// Operands of a tensor-core mainloop: A [m][k] and B [k][n] with strides.
struct tc_operands {
    const void *a, *b;
    int64_t a_bs, a_rs, a_cs, b_bs, b_rs, b_cs;
    bool a_m_unit; // A M-contiguous (wgmma only; mma.sync takes K-contiguous)
    bool b_k_unit; // B K-contiguous (else N-contiguous)
    const CUtensorMap *ta, *tb; // wgmma: TMA maps of A and B
};

template <typename T>
struct mma_mainloop {
    static constexpr int BM = 128, BN = 128, BK = 32, kStages = 3;
    static constexpr bool kTma = false, kWarpSpecialized = false;
    static constexpr bool kStreamK = true; // runs every schedule
    static constexpr bool kSplitK = false; // no cluster kernel
    static constexpr int kTeams = 1;
    static constexpr int kThreads = 256, kAcc = 64; // 4 x 4 mma x 4 floats
    static constexpr int kConsumers = kThreads; // every thread drives
    static constexpr int kRowAcc = 0; // no row sums (matmul_row_sums_by_*)
    // bytes per stage: A [128][32] + B (either way) 128 x 32 halves
    static constexpr int kStageBytes = 2 * BM * BK * 2;
    struct smem_t {
        alignas(128) unsigned char ring[kStages * kStageBytes];
    };

    // A chunk (row r, 16-byte chunk c of 4) -> byte offset in the stage
    static __device__ __forceinline__ int a_off(int r, int c)
    {
        return r * 64 + ((c ^ ((r >> 1) & 3)) << 4);
    }
    // B as [n][k]: same shape as A
    static __device__ __forceinline__ int bk_off(int n, int c)
    {
        return BM * BK * 2 + n * 64 + ((c ^ ((n >> 1) & 3)) << 4);
    }
    // B as [k][n]: 32 rows of 16 chunks
    static __device__ __forceinline__ int bn_off(int k, int c)
    {
        return BM * BK * 2 + k * 256 + ((c ^ (k & 7)) << 4);
    }

    static __device__ void load_stage(const gemsops_sk_schedule &s,
                                      const tc_operands &o, const T *A,
                                      const T *B, int64_t r0, int64_t c0,
                                      int64_t kt, unsigned stage_base)
    {
        const int t = threadIdx.x;
        const int64_t kb = kt * BK;
        // A: 128 rows x 4 chunks = 512 chunks, 2 per thread
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int idx = t + e * kThreads, r = idx / 4, c = idx % 4;
            const int64_t gr = r0 + r, gk = kb + c * 8;
            const bool ok = gr < s.m && gk < s.k;
            const T *src = ok ? A + gr * o.a_rs + gk : A;
            cp_async16(stage_base + a_off(r, c), src, ok);
        }
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int idx = t + e * kThreads;
            if (o.b_k_unit) { // B[k][n] at k * b_rs(=1) + n * b_cs
                const int n = idx / 4, c = idx % 4;
                const int64_t gn = c0 + n, gk = kb + c * 8;
                const bool ok = gn < s.n && gk < s.k;
                const T *src = ok ? B + gn * o.b_cs + gk : B;
                cp_async16(stage_base + bk_off(n, c), src, ok);
            }
            else {
                const int k = idx / 16, c = idx % 16;
                const int64_t gk = kb + k, gn = c0 + c * 8;
                const bool ok = gk < s.k && gn < s.n;
                const T *src = ok ? B + gk * o.b_rs + gn : B;
                cp_async16(stage_base + bn_off(k, c), src, ok);
            }
        }
    }

    struct ring_t {}; // each piece fills and drains its own ring

    static __device__ void begin(const gemsops_sk_schedule &,
                                 const tc_operands &, int64_t, ring_t &,
                                 smem_t &)
    {
    }
    static __device__ void drain(ring_t &, smem_t &)
    {
    }

    static __device__ void mac(const gemsops_sk_schedule &s,
                               const tc_operands &o, ring_t &, int64_t tile,
                               int64_t k0, int64_t k1, float (&acc)[kAcc],
                               smem_t &sm)
    {
        int64_t bt, tm, tn;
        gemsops_sk_tile_coords(&s, tile, &bt, &tm, &tn);
        const T *A = (const T *)o.a + bt * o.a_bs;
        const T *B = (const T *)o.b + bt * o.b_bs;
        const int64_t r0 = tm * BM, c0 = tn * BN;
#pragma unroll
        for (int e = 0; e < kAcc; e++) {
            acc[e] = 0.f;
        }
        const unsigned base = (unsigned)__cvta_generic_to_shared(sm.ring);
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        const int wm = warp / 4, wn = warp % 4; // warp tile 64 x 32
        const int64_t steps = k1 - k0;
#pragma unroll
        for (int st = 0; st < kStages - 1; st++) {
            if (st < steps) {
                load_stage(s, o, A, B, r0, c0, k0 + st,
                           base + st * kStageBytes);
            }
            cp_async_commit();
        }
        for (int64_t i = 0; i < steps; i++) {
            cp_async_wait<kStages - 2>();
            __syncthreads();
            // issue step i + 2 into the slot step i - 1 used
            const int64_t nxt = i + kStages - 1;
            if (nxt < steps) {
                load_stage(s, o, A, B, r0, c0, k0 + nxt,
                           base + (nxt % kStages) * kStageBytes);
            }
            cp_async_commit();
            const unsigned sb = base + (i % kStages) * kStageBytes;
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) {
                unsigned af[4][4], bf[4][2];
#pragma unroll
                for (int mi = 0; mi < 4; mi++) {
                    const int r = wm * 64 + mi * 16 + lane % 16;
                    ldmatrix_x4(af[mi], sb + a_off(r, kk * 2 + lane / 16));
                }
#pragma unroll
                for (int nj = 0; nj < 2; nj++) { // two n8 blocks per x4
                    unsigned q[4];
                    if (o.b_k_unit) {
                        const int n =
                            wn * 32 + nj * 16 + (lane % 8) + (lane / 16) * 8;
                        ldmatrix_x4(q,
                                    sb + bk_off(n, kk * 2 + (lane / 8) % 2));
                    }
                    else {
                        const int k =
                            kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8;
                        const int c = (wn * 32 + nj * 16) / 8 + lane / 16;
                        ldmatrix_x4_trans(q, sb + bn_off(k, c));
                    }
                    bf[nj * 2][0] = q[0];
                    bf[nj * 2][1] = q[1];
                    bf[nj * 2 + 1][0] = q[2];
                    bf[nj * 2 + 1][1] = q[3];
                }
#pragma unroll
                for (int mi = 0; mi < 4; mi++) {
#pragma unroll
                    for (int ni = 0; ni < 4; ni++) {
                        float (&d)[4] = *reinterpret_cast<float (*)[4]>(
                            acc + (mi * 4 + ni) * 4);
                        mma_op<T>::run(d, af[mi], bf[ni][0], bf[ni][1]);
                    }
                }
            }
        }
        cp_async_wait<0>();
        __syncthreads(); // the ring is reused by the next piece
    }

    // acc element e of this thread -> (row, col) in the tile
    static __device__ __forceinline__ void coords(int e, int &r, int &c)
    {
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        const int mi = e / 16, ni = (e / 4) % 4, q = e % 4;
        r = (warp / 4) * 64 + mi * 16 + lane / 4 + (q / 2) * 8;
        c = (warp % 4) * 32 + ni * 8 + (lane % 4) * 2 + q % 2;
    }
};

} // namespace gemsops
