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

    // One operand's copies for one tile, planned once per tile: a thread's
    // N chunks of a stage differ only by fixed strides (same swizzle
    // phase), so a k-step costs one pointer step, N adds and N compares.
    // (Recomputing each chunk's address per step made the kernel issue-
    // bound: ncu showed 1.9 IPC, 36% ALU, at 0.47x cuBLAS.)
    template <int N> struct copy_plan {
        const T *src;     // chunk 0 at the piece's first k-step
        const T *dummy;   // any valid address (zero-filled chunks)
        int64_t e_stride; // elements from chunk e to e + 1
        int64_t k_step;   // elements from one k-step to the next
        unsigned dst;     // chunk 0's byte offset in the operand's stage
        unsigned dst_e;   // bytes from chunk e to e + 1
        unsigned valid;   // bit e: chunk e's row (column) is in range
        int k_first, k_e; // k of chunk e within the step: k_first + e k_e

        __device__ __forceinline__ void issue(unsigned stage, int64_t step,
                                              int64_t kb, int64_t k) const
        {
            const T *p = src + step * k_step;
#pragma unroll
            for (int e = 0; e < N; e++) {
                const bool ok = ((valid >> e) & 1) && kb + k_first + e * k_e < k;
                cp_async16(stage + dst + e * dst_e, ok ? p + e * e_stride : dummy,
                           ok);
            }
        }
    };

    // K-major operand, ROWS rows x 64 k: row r at line r; thread t copies
    // chunk t % 8 of rows t / 8 + 32 e.
    template <int ROWS>
    static __device__ __forceinline__ copy_plan<ROWS / 32>
    plan_k_major(const T *base, int64_t row0, int64_t rows, int64_t row_stride,
                 int64_t k0)
    {
        const int r = threadIdx.x / 8, c = threadIdx.x % 8;
        copy_plan<ROWS / 32> cp;
        cp.src = base + (row0 + r) * row_stride + k0 * BK + c * 8;
        cp.dummy = base;
        cp.e_stride = 32 * row_stride;
        cp.k_step = BK;
        cp.dst = r * 128 + ((c ^ (r % 8)) << 4);
        cp.dst_e = 32 * 128;
        cp.valid = 0;
#pragma unroll
        for (int e = 0; e < ROWS / 32; e++) {
            cp.valid |= (unsigned)(row0 + r + 32 * e < rows) << e;
        }
        cp.k_first = c * 8;
        cp.k_e = 0;
        return cp;
    }

    // MN-major operand, 64 k x COLS columns in atoms of 64 columns: thread t
    // copies column chunk t % (COLS / 8) of k-lines t / (COLS / 8) + L e,
    // L = 2048 / COLS lines per pass (a multiple of 8: same swizzle phase).
    template <int COLS>
    static __device__ __forceinline__ copy_plan<COLS / 32>
    plan_mn_major(const T *base, int64_t col0, int64_t cols, int64_t k_stride,
                  int64_t k0)
    {
        constexpr int kPerLine = COLS / 8, kLines = kThreads / kPerLine;
        const int kr = threadIdx.x / kPerLine, q = threadIdx.x % kPerLine;
        copy_plan<COLS / 32> cp;
        cp.src = base + (k0 * BK + kr) * k_stride + col0 + q * 8;
        cp.dummy = base;
        cp.e_stride = kLines * k_stride;
        cp.k_step = BK * k_stride;
        cp.dst = (q / 8) * kAtom + kr * 128 + (((q % 8) ^ (kr % 8)) << 4);
        cp.dst_e = kLines * 128;
        cp.valid = col0 + q * 8 < cols ? (1u << (COLS / 32)) - 1 : 0;
        cp.k_first = kr;
        cp.k_e = kLines;
        return cp;
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
        const auto pa = AM ? plan_mn_major<BM>(A, r0, s.m, o.a_cs, k0)
                           : plan_k_major<BM>(A, r0, s.m, o.a_rs, k0);
        const auto pb = BNM ? plan_mn_major<BN>(B, c0, s.n, o.b_rs, k0)
                            : plan_k_major<BN>(B, c0, s.n, o.b_cs, k0);
        auto load = [&](int64_t step, unsigned stage) {
            const int64_t kb = (k0 + step) * BK;
            pa.issue(stage, step, kb, s.k);
            pb.issue(stage + kABytes, step, kb, s.k);
        };
#pragma unroll
        for (int e = 0; e < kAcc; e++) {
            acc[e] = 0.f;
        }
        const unsigned g = threadIdx.x / 128; // warpgroup: rows 64g..
        const uint64_t da0 = wgmma_desc(base + g * kAtom, AM ? kAtom : 16, 1024);
        const uint64_t db0 = wgmma_desc(base + kABytes, BNM ? kAtom : 16, 1024);
        const int64_t steps = k1 - k0;
#pragma unroll
        for (int st = 0; st < kStages - 2; st++) {
            if (st < steps) {
                load(st, base + st * kStageBytes);
            }
            cp_async_commit();
        }
        int read = 0, write = kStages - 2; // ring slots (wrapping cursors)
        for (int64_t i = 0; i < steps; i++) {
            cp_async_wait<kStages - 3>();
            fence_proxy_async();
            __syncthreads();
            if (i + kStages - 2 < steps) {
                load(i + kStages - 2, base + write * kStageBytes);
            }
            cp_async_commit();
            write = write + 1 == kStages ? 0 : write + 1;
            // descriptors advance in 16-byte units: +k-step slot, +16 k
            // (2 lines of 8 MN-major, 32 bytes K-major), +128 columns of B
            const uint64_t slot = (unsigned)(read * kStageBytes) >> 4;
            read = read + 1 == kStages ? 0 : read + 1;
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) {
                const uint64_t da = da0 + slot + (AM ? kk * 128 : kk * 2);
#pragma unroll
                for (int h = 0; h < BN / 128; h++) {
                    const uint64_t db =
                        db0 + slot + h * 1024 + (BNM ? kk * 128 : kk * 2);
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
