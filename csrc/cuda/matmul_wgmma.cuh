// The Hopper mainloop of the Stream-K matmul (fp16/bf16, sm_90a): warpgroup
// MMA (wgmma.mma_async) on operands the tensor memory accelerator (TMA)
// brings into shared memory.
//
// Tile: BM = 128 rows x BN (128 or 256) columns x BK = 64 per k-step; 256
// threads = 2 warpgroups, warpgroup g computes rows 64g..64g+63 with
// BN / 128 wgmma.m64n128k16 per 16 k (fp32 accumulators, BN / 2 registers
// per thread). A k-step is 2 * 128 * BN * 64 FLOP: ~512 tensor-core cycles
// of one SM at BN = 128, while the copies of the next S - 2 steps fly.
//
// Shared memory: an S-stage ring of [A | B] stages, each operand in the
// 128-byte-swizzle canonical layout wgmma reads and TMA writes (16-byte
// chunk c of 128-byte line L at L * 128 + ((c ^ (L % 8)) * 16), 1024-byte
// aligned atoms of 8 lines):
//   K-major operand (unit k stride): one line per row, 64 k = 128 bytes
//     (one TMA box of 64 k x rows); the descriptor steps 16 k by +32
//     bytes, 8-row groups 1024 bytes apart (SBO);
//   MN-major operand (unit m or n stride): atoms of 64 columns x 64 k
//     (one TMA box each), one line per k, atoms 8 KB apart (LBO), 8-k
//     groups 1024 bytes apart (SBO); the instruction transposes
//     (imm-trans = 1). So every layout torch hands us is read in place,
//     the backward's A^T included. TMA zero-fills past M, N and K.
//
// Ordering, per k-step i of the CTA (counted across its pieces: the ring
// and its barriers live for the whole kernel): barrier (every warpgroup
// has waited for its step i - 2 wgmma), thread 0 refills that slot with
// step i + S - 2, which may belong to the CTA's next piece (one expect-tx
// arrive and 2-5 bulk tensor copies on the slot's mbarrier); every thread
// waits on step i's mbarrier phase, issues step i's wgmma, commits, and
// waits until only that group is in flight (accumulators chain across
// in-flight groups; wgmma orders them). So a tile's first loads overlap
// the previous tile's last steps and epilogue: short-K shapes and
// Stream-K pieces do not start cold. A first version
// copied with per-thread cp.async: the address arithmetic of 8 copies a
// step made it issue-bound (docs/performance.md, matmul).
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
template <int N>
__device__ __forceinline__ void wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// One TMA box of a 3-D tensor map at (x, y, z) into shared memory; its bytes
// count toward `bar`'s transaction.
__device__ __forceinline__ void tma_load_3d(unsigned dst,
                                            const CUtensorMap *map, int x,
                                            int y, int z, unsigned bar)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile"
                 ".mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
                 "[%5];" ::"r"(dst),
                 "l"(map), "r"(x), "r"(y), "r"(z), "r"(bar)
                 : "memory");
}

#define GEMSOPS_ACC8(i)                                         \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), \
        "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define GEMSOPS_WGMMA_M64N128K16(TYPE)                                        \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                 \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE \
                 " {"                                                         \
                 "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16," \
                 "%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,"   \
                 "%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,"   \
                 "%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,"   \
                 "%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, %67, %68;\n}\n"    \
                 : GEMSOPS_ACC8(0), GEMSOPS_ACC8(8), GEMSOPS_ACC8(16),        \
                   GEMSOPS_ACC8(24), GEMSOPS_ACC8(32), GEMSOPS_ACC8(40),      \
                   GEMSOPS_ACC8(48), GEMSOPS_ACC8(56)                         \
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
    static constexpr bool kTma = true;
    static constexpr int kThreads = 256, kAcc = BN / 2;
    static constexpr int kABytes = BM * BK * 2,
                         kStageBytes = (BM + BN) * BK * 2;
    static constexpr int kAtom = 64 * 128; // 64 columns x 64 k (MN-major)
    // the ring, its mbarriers, and slack to align the ring to 1024 bytes
    static constexpr int kRingBytes =
        kStages * kStageBytes + kStages * 8 + 1024;
    // Thread 0's side of the ring (it alone touches this): its own walk of
    // the CTA's pieces, kStages - 2 k-steps ahead of the consumers, across
    // pieces: the next piece's first steps load during this one's epilogue.
    struct producer_t {
        gemsops_sk_walk walk;
        int64_t k, k1; // the piece being loaded: next k-step, its end
        int r0, c0, za, zb; // its tile's origin and TMA batch coordinates
        int write; // the ring slot of the next load
    };
    // Epilogue staging, one slice per warp (outside the ring: the next
    // tile's loads land there meanwhile): 16 rows x 64 columns of packed
    // pairs, rows padded to 36 words so the pair writes hit 32 banks.
    static constexpr int kStageRow = 36;
    struct smem_t {
        producer_t prod;
        alignas(16) uint32_t stage[kThreads / 32][16 * kStageRow];
        unsigned char raw[kRingBytes];
    };
    struct ring_t { // the consumers' cursor: slot of the next step, parity
        int read;
        unsigned phase;
    };

    static __device__ __forceinline__ unsigned ring_base(smem_t &sm)
    {
        // the 128-byte swizzle repeats every 1024 bytes: align the ring
        return (smem_addr(sm.raw) + 1023u) & ~1023u;
    }

    // Thread 0: the k-step `step` of the tile at (r0, c0) into ring slot
    // `stage` (its mbarrier `bar`).
    static __device__ __forceinline__ void produce(const tc_operands &o,
                                                   unsigned stage,
                                                   unsigned bar, int r0,
                                                   int c0, int za, int zb,
                                                   int64_t step)
    {
#ifdef GEMSOPS_HAS_WGMMA
        const int kb = (int)(step * BK);
        mbar_expect_tx(bar, kStageBytes);
        if constexpr (AM) { // boxes of 64 m x 64 k
            tma_load_3d(stage, o.ta, r0, kb, za, bar);
            tma_load_3d(stage + kAtom, o.ta, r0 + 64, kb, za, bar);
        }
        else { // one box of 64 k x 128 m
            tma_load_3d(stage, o.ta, kb, r0, za, bar);
        }
        if constexpr (BNM) {
#pragma unroll
            for (int j = 0; j < BN / 64; j++) {
                tma_load_3d(stage + kABytes + j * kAtom, o.tb, c0 + 64 * j, kb,
                            zb, bar);
            }
        }
        else {
            tma_load_3d(stage + kABytes, o.tb, kb, c0, zb, bar);
        }
#else
        (void)o, (void)stage, (void)bar, (void)r0, (void)c0, (void)za,
            (void)zb, (void)step;
#endif
    }

    // Thread 0: the next k-step of its walk, if the CTA has one left.
    static __device__ void issue(const gemsops_sk_schedule &s,
                                 const tc_operands &o, smem_t &sm)
    {
        producer_t &q = sm.prod;
        while (q.k == q.k1) {
            int64_t tile, k0, k1, bt, tm, tn;
            if (!gemsops_sk_walk_next(&s, &q.walk, &tile, &k0, &k1)) {
                return;
            }
            gemsops_sk_tile_coords(&s, tile, &bt, &tm, &tn);
            q.r0 = (int)(tm * BM);
            q.c0 = (int)(tn * BN);
            q.za = o.a_bs == 0 ? 0 : (int)bt;
            q.zb = o.b_bs == 0 ? 0 : (int)bt;
            q.k = k0;
            q.k1 = k1;
        }
        const unsigned base = ring_base(sm);
        produce(o, base + q.write * kStageBytes,
                base + kStages * kStageBytes + q.write * 8, q.r0, q.c0, q.za,
                q.zb, q.k);
        q.k++;
        q.write = q.write + 1 == kStages ? 0 : q.write + 1;
    }

    // Once per CTA: barriers, then the first kStages - 2 loads.
    static __device__ void begin(const gemsops_sk_schedule &s,
                                 const tc_operands &o, int64_t cta,
                                 ring_t &ring, smem_t &sm)
    {
#ifdef GEMSOPS_HAS_WGMMA
        if (threadIdx.x == 0) {
            const unsigned bars = ring_base(sm) + kStages * kStageBytes;
#pragma unroll
            for (int st = 0; st < kStages; st++) {
                mbar_init(bars + st * 8, 1);
            }
            mbar_init_fence();
            producer_t &q = sm.prod;
            gemsops_sk_walk_start(&s, cta, &q.walk);
            q.k = q.k1 = 0;
            q.write = 0;
            for (int st = 0; st < kStages - 2; st++) {
                issue(s, o, sm);
            }
        }
#else
        (void)s, (void)o, (void)cta, (void)sm;
#endif
        ring.read = 0;
        ring.phase = 0;
    }

    // An early exit (debug: a Stream-K wait gave up): thread 0 waits for
    // the loads still in flight (slots read .. write - 1, fewer than
    // kStages) so none lands in shared memory the CTA no longer owns.
    static __device__ void drain(ring_t &ring, smem_t &sm)
    {
#ifdef GEMSOPS_HAS_WGMMA
        if (threadIdx.x == 0) {
            const unsigned bars = ring_base(sm) + kStages * kStageBytes;
            for (int left = (sm.prod.write - ring.read + kStages) % kStages;
                 left > 0; left--) {
                mbar_wait(bars + ring.read * 8, ring.phase);
                if (++ring.read == kStages) {
                    ring.read = 0;
                    ring.phase ^= 1;
                }
            }
        }
#else
        (void)ring, (void)sm;
#endif
    }

    // The piece's k-steps (loaded by thread 0's walk, which names the
    // same pieces in the same order) into acc.
    static __device__ void mac(const gemsops_sk_schedule &s,
                               const tc_operands &o, ring_t &ring,
                               int64_t tile, int64_t k0, int64_t k1,
                               float (&acc)[kAcc], smem_t &sm)
    {
#ifdef GEMSOPS_HAS_WGMMA
        (void)tile;
        const unsigned base = ring_base(sm);
        const unsigned bars = base + kStages * kStageBytes; // 8 B each
        const int64_t steps = k1 - k0;
        const bool producer = threadIdx.x == 0;
#pragma unroll
        for (int e = 0; e < kAcc; e++) {
            acc[e] = 0.f;
        }
        const unsigned g = threadIdx.x / 128; // warpgroup: rows 64g..
        const uint64_t da0 =
            wgmma_desc(base + g * kAtom, AM ? kAtom : 16, 1024);
        const uint64_t db0 =
            wgmma_desc(base + kABytes, BNM ? kAtom : 16, 1024);
        for (int64_t i = 0; i < steps; i++) {
            // (barrier init, for the first step) the wgmma of the step two
            // back are done everywhere: thread 0 may refill that slot
            __syncthreads();
            if (producer) {
                issue(s, o, sm);
            }
            mbar_wait(bars + ring.read * 8, ring.phase);
            // descriptors advance in 16-byte units: +k-step slot, +16 k
            // (2 lines of 8 MN-major, 32 bytes K-major), +128 columns of B
            const uint64_t slot = (unsigned)(ring.read * kStageBytes) >> 4;
            if (++ring.read == kStages) {
                ring.read = 0;
                ring.phase ^= 1;
            }
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
#else
        (void)s, (void)o, (void)ring, (void)tile, (void)k0, (void)k1,
            (void)acc, (void)sm;
        __trap(); // the planner picks this mainloop only for sm_90a code
#endif
    }

    static __device__ __forceinline__ uint32_t pack(float a, float b)
    {
        if constexpr (std::is_same_v<T, __half>) {
            const __half2 h = __floats2half2_rn(a, b);
            return *reinterpret_cast<const uint32_t *>(&h);
        }
        else {
            const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
            return *reinterpret_cast<const uint32_t *>(&h);
        }
    }

    // The tile at (r0, c0) of C (row stride n, 16-byte aligned rows: n %
    // 8 == 0) from acc, through the warp's staging slice: each warp holds
    // 16 rows; per 64 columns its lanes write their pairs (rows of 4 lanes
    // x 2 values), then copy 16-byte chunks out, 8 lanes a 128-byte row
    // piece. 8 full-sector stores a lane instead of 32-64 half-sector ones.
    static __device__ void store_staged(T *C, int64_t m, int64_t n, int64_t r0,
                                        int64_t c0, const float (&acc)[kAcc],
                                        smem_t &sm)
    {
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        uint32_t *st = sm.stage[warp];
        const int64_t rows = r0 + (warp / 4) * 64 + (warp % 4) * 16;
#pragma unroll
        for (int cc = 0; cc < BN / 64; cc++) {
#pragma unroll
            for (int jj = 0; jj < 8; jj++) {
                const int e = (cc / 2) * 64 + ((cc % 2) * 8 + jj) * 4;
#pragma unroll
                for (int h = 0; h < 2; h++) { // rows lane / 4 and + 8
                    st[(lane / 4 + 8 * h) * kStageRow + jj * 4 + lane % 4] =
                        pack(acc[e + 2 * h], acc[e + 2 * h + 1]);
                }
            }
            __syncwarp();
#pragma unroll
            for (int t = 0; t < 4; t++) {
                const int idx = t * 32 + lane, row = idx / 8, ch = idx % 8;
                const int64_t gr = rows + row, gc = c0 + cc * 64 + ch * 8;
                const uint4 v = *reinterpret_cast<const uint4 *>(
                    st + row * kStageRow + ch * 4);
                if (gr < m && gc + 8 <= n) {
                    *reinterpret_cast<uint4 *>(C + gr * n + gc) = v;
                }
                else if (gr < m && gc < n) { // the right edge: element-wise
                    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
                    unsigned short *d =
                        reinterpret_cast<unsigned short *>(C + gr * n + gc);
#pragma unroll
                    for (int i = 0; i < 8; i++) {
                        if (gc + i < n) {
                            d[i] =
                                (unsigned short)(w[i / 2] >> (16 * (i % 2)));
                        }
                    }
                }
            }
            __syncwarp(); // the slice is rewritten by the next 64 columns
        }
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
