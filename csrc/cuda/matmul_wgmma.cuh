// The Hopper mainloop of the Stream-K matmul (fp16/bf16, sm_90a): warpgroup
// MMA (wgmma.mma_async) reading both operands from shared memory.
//
// Tile: BM = 128 rows x BN (128 or 256) columns x BK = 64 per k-step; 256
// threads = 2 warpgroups, warpgroup g computes rows 64g..64g+63 with
// BN / 128 wgmma.m64n128k16 per 16 k (fp32 accumulators, BN / 2 registers
// per thread). Per k-step the SM's tensor cores do 2 * 128 * BN * 64 FLOP
// (~490 cycles at BN = 128) while the copies of step i + S - 2 fly.
//
// Shared memory: an S-stage ring of [A | B] stages, each operand in the
// 128-byte-swizzle canonical layout wgmma reads (16-byte chunk c of a
// 128-byte line L at L * 128 + ((c ^ (L % 8)) * 16), 1024-byte aligned
// atoms of 8 lines):
//   K-major operand (A with unit k stride, B with unit k stride): one
//     line per row, 64 k = 128 bytes; the descriptor steps 16 k by +32
//     bytes, 8-row groups 1024 bytes apart (SBO);
//   MN-major operand (A with unit m stride, B with unit n stride): atoms
//     of 64 columns x 64 k, one line per k, atoms 8 KB apart (LBO), 8-k
//     groups 1024 bytes apart (SBO); the instruction transposes
//     (imm-trans = 1). So every layout torch hands us is read in place,
//     the backward's A^T included.
// Global -> shared: cp.async 16-byte chunks (zero-filled past M, N, K), no
// registers; the planner sends here only whole aligned chunks (k a
// multiple of 8 for K-major operands, m or n for MN-major ones).
//
// Ordering, per k-step i: wait for this thread's copies of step i, fence
// them into the async proxy (wgmma reads through it), barrier; refill the
// slot of step i - 2 (every warpgroup waited for its step i - 2 wgmma
// before the barrier); issue step i's wgmma, commit, wait until only step
// i's group is in flight. The accumulators chain across the in-flight
// groups, which wgmma orders itself.
#pragma once

#include "matmul_mma.cuh" // tc_operands

namespace gemsops {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GEMSOPS_HAS_WGMMA 1
#endif

// 64-bit shared-memory matrix descriptor, 128-byte swizzle.
__device__ __forceinline__ uint64_t wgmma_desc(unsigned addr, unsigned lbo,
                                               unsigned sbo)
{
    return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)(lbo >> 4) << 16 |
           (uint64_t)(sbo >> 4) << 32 | 1ull << 62;
}

#ifdef GEMSOPS_HAS_WGMMA
__device__ __forceinline__ void wgmma_fence()
{
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N> __device__ __forceinline__ void wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Orders this thread's generic-proxy writes to shared memory (cp.async)
// before later async-proxy reads of it (wgmma).
__device__ __forceinline__ void fence_proxy_async()
{
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

#define GEMSOPS_ACC8(i)                                                        \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]),               \
        "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define GEMSOPS_WGMMA_M64N128K16(TYPE)                                         \
    asm volatile(                                                             \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                          \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " {"     \
        "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,"          \
        "%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,"            \
        "%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,"            \
        "%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,"            \
        "%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, %67, %68;\n}\n"             \
        : GEMSOPS_ACC8(0), GEMSOPS_ACC8(8), GEMSOPS_ACC8(16),                  \
          GEMSOPS_ACC8(24), GEMSOPS_ACC8(32), GEMSOPS_ACC8(40),               \
          GEMSOPS_ACC8(48), GEMSOPS_ACC8(56)                                  \
        : "l"(da), "l"(db), "r"(1), "n"(TA), "n"(TB))

// d (64 x 128 per warpgroup, fp32) += A (64 x 16) * B (16 x 128); TA / TB:
// the operand is MN-major in shared memory.
template <typename T, int TA, int TB>
__device__ __forceinline__ void wgmma_m64n128k16(float *d, uint64_t da,
                                                 uint64_t db)
{
    if constexpr (std::is_same_v<T, __half>) {
        GEMSOPS_WGMMA_M64N128K16("f16");
    }
    else {
        GEMSOPS_WGMMA_M64N128K16("bf16");
    }
}
#undef GEMSOPS_WGMMA_M64N128K16
#undef GEMSOPS_ACC8
#endif

// AM: A is M-contiguous (else K-contiguous); BNM: B is N-contiguous (else
// K-contiguous). One kernel per layout: the four in one body cost 248
// registers at BN = 128 and spilled at BN = 256 (one: 162 and 246).
template <typename T, int BN_, int STAGES, bool AM, bool BNM>
struct wgmma_mainloop {
    static_assert(BN_ == 128 || BN_ == 256, "BN: 128 or 256");
    static_assert(STAGES >= 3, "the ring refills the slot of step i - 2");
    static constexpr int BM = 128, BN = BN_, BK = 64, kStages = STAGES;
    static constexpr int kThreads = 256, kAcc = BN / 2;
    static constexpr int kABytes = BM * BK * 2, kStageBytes = (BM + BN) * BK * 2;
    static constexpr int kAtom = 64 * 128; // 64 columns x 64 k (MN-major)
    static constexpr int kSmemBytes = kStages * kStageBytes + 1024; // + align
    struct smem_t {
        unsigned char raw[kSmemBytes];
    };

    // K-major operand: ROWS rows x 64 k, row r at line r.
    template <int ROWS>
    static __device__ __forceinline__ void
    load_k_major(unsigned dst, const T *src, int64_t row0, int64_t rows,
                 int64_t row_stride, int64_t kb, int64_t k)
    {
#pragma unroll
        for (int e = 0; e < ROWS / 32; e++) {
            const int idx = threadIdx.x + e * kThreads, r = idx / 8, c = idx % 8;
            const int64_t gr = row0 + r, gk = kb + c * 8;
            const bool ok = gr < rows && gk < k;
            cp_async16(dst + r * 128 + ((c ^ (r % 8)) << 4),
                       ok ? src + gr * row_stride + gk : src, ok);
        }
    }

    // MN-major operand: 64 k x COLS columns, atoms of 64 columns.
    template <int COLS>
    static __device__ __forceinline__ void
    load_mn_major(unsigned dst, const T *src, int64_t col0, int64_t cols,
                  int64_t k_stride, int64_t kb, int64_t k)
    {
        constexpr int kPerLine = COLS / 8; // chunks per k
#pragma unroll
        for (int e = 0; e < COLS / 32; e++) {
            const int idx = threadIdx.x + e * kThreads;
            const int kr = idx / kPerLine, q = idx % kPerLine;
            const int64_t gc = col0 + q * 8, gk = kb + kr;
            const bool ok = gc < cols && gk < k;
            cp_async16(dst + (q / 8) * kAtom + kr * 128 +
                           (((q % 8) ^ (kr % 8)) << 4),
                       ok ? src + gk * k_stride + gc : src, ok);
        }
    }

    static __device__ __forceinline__ void
    load_stage(const gemsops_sk_schedule &s, const tc_operands &o, const T *A,
               const T *B, int64_t r0, int64_t c0, int64_t kt, unsigned st)
    {
        const int64_t kb = kt * BK;
        if constexpr (AM) {
            load_mn_major<BM>(st, A, r0, s.m, o.a_cs, kb, s.k);
        }
        else {
            load_k_major<BM>(st, A, r0, s.m, o.a_rs, kb, s.k);
        }
        if constexpr (BNM) {
            load_mn_major<BN>(st + kABytes, B, c0, s.n, o.b_rs, kb, s.k);
        }
        else {
            load_k_major<BN>(st + kABytes, B, c0, s.n, o.b_cs, kb, s.k);
        }
    }

    static __device__ void mac(const gemsops_sk_schedule &s,
                               const tc_operands &o, int64_t tile, int64_t k0,
                               int64_t k1, float (&acc)[kAcc], smem_t &sm)
    {
#ifdef GEMSOPS_HAS_WGMMA
        // the 128-byte swizzle repeats every 1024 bytes: align the ring
        const unsigned base = (smem_addr(sm.raw) + 1023u) & ~1023u;
        int64_t bt, tm, tn;
        gemsops_sk_tile_coords(&s, tile, &bt, &tm, &tn);
        const T *A = (const T *)o.a + bt * o.a_bs;
        const T *B = (const T *)o.b + bt * o.b_bs;
        const int64_t r0 = tm * BM, c0 = tn * BN;
#pragma unroll
        for (int e = 0; e < kAcc; e++) {
            acc[e] = 0.f;
        }
        const unsigned g = threadIdx.x / 128; // warpgroup: rows 64g..
        const int64_t steps = k1 - k0;
#pragma unroll
        for (int st = 0; st < kStages - 2; st++) {
            if (st < steps) {
                load_stage(s, o, A, B, r0, c0, k0 + st,
                           base + st * kStageBytes);
            }
            cp_async_commit();
        }
        int read = 0, write = kStages - 2; // ring slots (wrapping cursors)
        for (int64_t i = 0; i < steps; i++) {
            cp_async_wait<kStages - 3>();
            fence_proxy_async();
            __syncthreads();
            if (i + kStages - 2 < steps) {
                load_stage(s, o, A, B, r0, c0, k0 + i + kStages - 2,
                           base + write * kStageBytes);
            }
            cp_async_commit();
            write = write + 1 == kStages ? 0 : write + 1;
            const unsigned sa = base + read * kStageBytes + g * kAtom;
            const unsigned sb = base + read * kStageBytes + kABytes;
            read = read + 1 == kStages ? 0 : read + 1;
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) {
                // 16 k: +2 lines of 8 (MN-major) or +32 bytes (K-major)
                const uint64_t da = AM ? wgmma_desc(sa + kk * 2048, kAtom, 1024)
                                       : wgmma_desc(sa + kk * 32, 16, 1024);
#pragma unroll
                for (int h = 0; h < BN / 128; h++) {
                    const unsigned sbh = sb + h * 128 * 128;
                    const uint64_t db =
                        BNM ? wgmma_desc(sbh + kk * 2048, kAtom, 1024)
                            : wgmma_desc(sbh + kk * 32, 16, 1024);
                    wgmma_m64n128k16<T, AM, BNM>(acc + h * 64, da, db);
                }
            }
            wgmma_commit();
            wgmma_wait<1>();
        }
        wgmma_wait<0>();
        cp_async_wait<0>();
        __syncthreads(); // the ring is reused by the next piece
#else
        (void)s, (void)o, (void)tile, (void)k0, (void)k1, (void)acc, (void)sm;
        __trap(); // the planner picks this mainloop only for sm_90a code
#endif
    }

    // acc element e of this thread -> (row, col) in the tile
    static __device__ __forceinline__ void coords(int e, int &r, int &c)
    {
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        const int h = e / 64, j = (e % 64) / 4, q = e % 4;
        r = (warp / 4) * 64 + (warp % 4) * 16 + lane / 4 + (q / 2) * 8;
        c = h * 128 + j * 8 + (lane % 4) * 2 + q % 2;
    }
};

} // namespace gemsops
