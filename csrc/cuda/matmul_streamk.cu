// Stream-K matmul on CUDA: C[b] = A[b] . B[b], fp32 accumulation.
//
// Schedule: include/gemsops/streamk.h (shared with the CPU executor and the
// C-level schedule test). Grid: ctas persistent CTAs, never more than are
// co-resident (the occupancy calculator's count); an owner waits only for
// lower-numbered CTAs, which start before it.
//
// Work split: one driver (this file) walks the schedule and does the
// fix-up; a mainloop computes a tile's k-iterations into per-thread fp32
// accumulators and stores them. The warp-specialized mainloops have a
// second kernel for plans of whole tiles alone (matmul_tiles_kernel:
// tiles_walk, no Stream-K code) and a third for split-k
// (matmul_splitk_kernel: split_walk, a tile's pieces one cluster, their
// partials added through distributed shared memory). Mainloops:
//   wgmma (matmul_wgmma.cuh, sm_90a): fp16/bf16 with A and B each K- or
//     MN-contiguous, whole aligned 16-byte chunks (fp32 as TF32, both
//     K-contiguous): 128 x 64, x 128, x 192 or x 256 tiles, warpgroup
//     MMA from a TMA-filled ring (tensor maps encoded here, per launch,
//     through the driver entry point cudart hands out);
//   mma (matmul_mma.cuh, sm_80+): fp16/bf16 with A K-contiguous, B either
//     way, whole aligned 16-byte chunks: 128 x 128 tiles on tensor cores
//     (mma.sync + ldmatrix + a 3-stage cp.async ring);
//   skinny (matmul_skinny.cu, kernels of their own): at most 16 rows
//     against an N-contiguous B, where plan_skinny takes them; launch()
//     hands such products over before planning tiles;
//   ffma (below): everything else (fp32 exact, any strides, any
//     alignment): 64 x 64 tiles, 256 threads of 4 x 4 outputs, k-steps of
//     16 widened to fp32 in shared memory (each element one bounds-checked
//     load, mapped so that the unit-stride direction is coalesced).
//
// Fix-up: a peer writes its fp32 partial tile to its slot (elements e .. e
// + 3 of thread t as the 16-byte vector e / 4 * 256 + t: coalesced, a
// quarter of the scalar accesses), meets its other threads at a barrier,
// and thread 0 raises the CTA's flag to this launch's epoch with a release
// store, which releases the whole CTA's stores before it. The owner's
// thread 0 waits for each peer's flag in decreasing CTA order with acquire
// loads (giving up after spin_limit polls in debug mode: error = 1), and
// the CTA adds the partial read through L2 (ld.cg: L1 is not coherent);
// where two partials fit in registers beside the tile's, two peers at a
// time (add_peers_in_pairs, thread 32 polling the second flag beside
// thread 0), in the same order.
// Flags are never reset: the next launch uses a new epoch. (Split-k on the
// warp-specialized mainloops needs neither: its cluster's barrier.)
//
// Row sums (row_sums, batch 1: nn.Linear's bias gradient beside its weight
// gradient): the ROWS wgmma kernels add up A's slots over k-steps
// [tn * row_chunk, (tn + 1) * row_chunk) and carry the sums through the
// fix-up in four more accumulators. Mostly the tiles of C's first column
// sum all of k and store the sums; in a launch of one wave of whole tiles
// each tile of a row sums its share, leaves its part in the workspace and
// counts itself in on its row's counter, and the last to arrive adds the
// parts in column order. Any other launch runs matmul_row_sums_by_warp or
// _by_thread after the product.
//
// Bytes: A and B are read once per tile they feed (tiles_n and tiles_m
// times), C written once; Stream-K adds 2 x 16 KB per split tile.
//
// Test: python -m pytest tests/test_matmul.py -m cuda (the schedule
// itself: tests/test_streamk_schedule.py, no GPU). Time: python -m pytest
// benchmark/test_blas_perf.py, or one shape: python tools/mm_probe.py 8192
// 8192 8192; A/B a change with tools/ab.sh. Measurements:
// docs/performance.md.
#include <algorithm>
#include <atomic>
#include <mutex>

#include "common.cuh"
#include "gemsops/matmul.h"
#include "matmul_cost.cuh"
#include "matmul_epilogue.cuh"
#include "matmul_mma.cuh"
#include "matmul_skinny.cuh"
#include "matmul_stage.cuh"
#include "matmul_wgmma.cuh"
#include "pdl.cuh"

namespace gemsops {
namespace {

constexpr int kGroupM = 8;

struct driver_args {
    CUtensorMap ta, tb; // wgmma: TMA maps of A and B (else unused)
    // wgmma with c_how == c_store::tma: C's map (boxes of 16 rows x 128 bytes)
    CUtensorMap tc;
    gemsops_sk_schedule s;
    const void *a, *b;
    void *c;
    int64_t a_bs, a_rs, a_cs, b_bs, b_rs, b_cs;
    bool a_m_unit, b_k_unit; // tensor-core operand layouts (planner's pick)
    bool c_pairs; // C's rows take 2-element stores (n even, aligned)
    c_store c_how; // how the staged epilogue (wgmma) sends C's slices
    float *partials; // [ctas][BM * BN] when sk_tiles > 0
    unsigned *flags; // [ctas]
    unsigned epoch;
    int64_t spin_limit; // 0: wait as long as it takes
    int *error;
    bool epilogue; // alpha != 1 or a bias: C = alpha * acc + beta * bias
    // NULL, or A's row sums [m] (batch 1): written by a ROWS wgmma kernel,
    // else by matmul_row_sums_by_*
    void *row_sums;
    // ROWS: the k-steps a tile sums from tn * row_chunk: iters (the first
    // column's tiles sum them all), or ceil(iters / tiles_n) with parts
    int64_t row_chunk;
    // ROWS, one wave over more than one column of tiles (else NULL): the
    // tiles' parts [tiles_n][tiles_m * BM] and a counter a row of tiles,
    // (epoch << 32) | tiles arrived
    float *row_parts;
    unsigned long long *row_counts;
    const void *bias;
    int64_t bias_bs, bias_rs, bias_cs;
    float alpha, beta;
};

// The launch's epilogue for the tile's batch bt.
template <typename T>
__device__ __forceinline__ epilogue_op<T> epilogue_of(const driver_args &p,
                                                      int64_t bt)
{
    return epilogue_op<T>(p.bias, p.bias_bs, p.bias_rs, p.bias_cs, p.s.m,
                          p.s.n, p.alpha, p.beta, bt);
}

// A bias broadcast over the rows (nn.Linear's), beta * bias staged for the
// tile in shared memory (row[j]: column c0 + j; 0 past C's edge).
struct row_bias_op {
    const float *row;
    int64_t c0;
    float alpha;

    __device__ __forceinline__ bool same_rows() const
    {
        return true;
    }
    __device__ __forceinline__ float apply(float v, float a) const
    {
        return v * alpha + a;
    }
    // c - c0 is even: the pair is one 8-byte read
    __device__ __forceinline__ void addends(int64_t, int64_t c, float &a0,
                                            float &a1) const
    {
        const float2 a = *reinterpret_cast<const float2 *>(row + (c - c0));
        a0 = a.x;
        a1 = a.y;
    }
};

// The accumulators as they are.
struct no_epilogue {
    __device__ __forceinline__ bool same_rows() const
    {
        return true;
    }
    __device__ __forceinline__ float apply(float v, float) const
    {
        return v;
    }
    __device__ __forceinline__ void addends(int64_t, int64_t, float &a0,
                                            float &a1) const
    {
        a0 = a1 = 0.f;
    }
};

// ---- the exact FFMA mainloop ----------------------------------------------
template <typename T>
struct ffma_mainloop {
    static constexpr int BM = 64, BN = 64, BK = 16, kAcc = 16, kMinCtas = 1;
    static constexpr int kRowAcc = 0;
    static constexpr int kThreads = 256, kConsumers = kThreads;
    static constexpr bool kWarpSpecialized = false, kStreamK = true;
    static constexpr bool kSplitK = false; // no cluster kernel
    struct smem_t {
        float a[BK][BM + 4];
        float b[BK][BN + 4];
    };
    static constexpr int kSmemBytes = sizeof(smem_t);
    struct ring_t {}; // loads are synchronous: nothing runs ahead

    static __device__ void begin(const driver_args &, int64_t, ring_t &,
                                 smem_t &)
    {
    }
    static __device__ void drain(ring_t &, smem_t &)
    {
    }
    template <typename>
    static __device__ bool store(const driver_args &, int64_t,
                                 const float (&)[kAcc], smem_t &)
    {
        return false;
    }

    static __device__ void mac(const driver_args &p, ring_t &, int64_t tile,
                               int64_t k0, int64_t k1, float (&acc)[kAcc],
                               smem_t &sm)
    {
        int64_t bt, tm, tn;
        gemsops_sk_tile_coords(&p.s, tile, &bt, &tm, &tn);
        const T *A = (const T *)p.a + bt * p.a_bs;
        const T *B = (const T *)p.b + bt * p.b_bs;
        const int64_t r0 = tm * BM, c0 = tn * BN;
        const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
        for (int e = 0; e < kAcc; e++) {
            acc[e] = 0.f;
        }
        const bool a_k_unit = p.a_cs == 1, b_n_unit = p.b_cs == 1;
        for (int64_t kt = k0; kt < k1; kt++) {
            const int64_t kb = kt * BK;
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int idx = threadIdx.x + e * kThreads;
                // consecutive threads along each panel's unit stride
                const int ai = a_k_unit ? idx / BK : idx % BM;
                const int aq = a_k_unit ? idx % BK : idx / BM;
                const int64_t gr = r0 + ai, gk = kb + aq;
                sm.a[aq][ai] =
                    (gr < p.s.m && gk < p.s.k)
                        ? to_acc<float>(A[gr * p.a_rs + gk * p.a_cs])
                        : 0.f;
                const int bj = b_n_unit ? idx % BN : idx / BK;
                const int bq = b_n_unit ? idx / BN : idx % BK;
                const int64_t gc = c0 + bj, gk2 = kb + bq;
                sm.b[bq][bj] =
                    (gc < p.s.n && gk2 < p.s.k)
                        ? to_acc<float>(B[gk2 * p.b_rs + gc * p.b_cs])
                        : 0.f;
            }
            __syncthreads();
#pragma unroll
            for (int q = 0; q < BK; q++) {
                float a[4], b[4];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    a[i] = sm.a[q][ty * 4 + i];
                    b[i] = sm.b[q][tx * 4 + i];
                }
#pragma unroll
                for (int i = 0; i < 4; i++) {
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        acc[i * 4 + j] = fmaf(a[i], b[j], acc[i * 4 + j]);
                    }
                }
            }
            __syncthreads();
        }
    }

    static __device__ __forceinline__ void coords(int e, int &r, int &c)
    {
        r = (threadIdx.x / 16) * 4 + e / 4;
        c = (threadIdx.x % 16) * 4 + e % 4;
    }
};

// ---- a tensor-core mainloop (mma.sync or wgmma), adapted to the driver ----
template <typename M, int MIN_CTAS>
struct tc_mainloop {
    static constexpr int BM = M::BM, BN = M::BN, kAcc = M::kAcc;
    static constexpr int kRowAcc = M::kRowAcc;
    static constexpr int kMinCtas = MIN_CTAS, kThreads = M::kThreads;
    // the threads that run the driver (a partial's layout)
    static constexpr int kConsumers = M::kConsumers;
    static constexpr bool kWarpSpecialized = M::kWarpSpecialized;
    static constexpr bool kStreamK = M::kStreamK, kSplitK = M::kSplitK;
    // consumer warpgroups on tiles of their own (pingpong: 2), else 1
    static __host__ __device__ constexpr int teams()
    {
        return M::kTeams;
    }
    using smem_t = typename M::smem_t;
    static constexpr int kSmemBytes = sizeof(smem_t);

    using ring_t = typename M::ring_t;

    static __device__ __forceinline__ tc_operands
    operands(const driver_args &p)
    {
        // only TMA mainloops take the maps' addresses (taking them costs
        // the mma.sync kernel a stack frame)
        const CUtensorMap *ta = nullptr, *tb = nullptr;
        if constexpr (M::kTma) {
            ta = &p.ta;
            tb = &p.tb;
        }
        return tc_operands{p.a,        p.b,        p.a_bs, p.a_rs,
                           p.a_cs,     p.b_bs,     p.b_rs, p.b_cs,
                           p.a_m_unit, p.b_k_unit, ta,     tb};
    }

    static __device__ void begin(const driver_args &p, int64_t cta,
                                 ring_t &ring, smem_t &sm)
    {
        M::begin(p.s, operands(p), cta, ring, sm);
    }

    static __device__ void drain(ring_t &ring, smem_t &sm)
    {
        M::drain(ring, sm);
    }

    // pingpong: past the other warpgroup's k-steps
    template <typename R>
    static __device__ void skip(R &ring, int64_t steps)
    {
        M::skip(ring, steps);
    }

    // warp-specialized mainloops: the producer role (walking the CTA's work
    // as its consumers do, Walk), the consumers' entry
    template <typename Walk>
    static __device__ void produce(const driver_args &p, int64_t cta,
                                   smem_t &sm)
    {
        if constexpr (kWarpSpecialized) {
            M::template produce<Walk>(p.s, operands(p), cta, sm);
        }
    }
    static __device__ void consume()
    {
        if constexpr (kWarpSpecialized) {
            M::consume();
        }
    }

    // true: the tile went out through the mainloop's staged epilogue
    template <typename T>
    static __device__ bool store(const driver_args &p, int64_t tile,
                                 const float (&acc)[kAcc + kRowAcc],
                                 smem_t &sm)
    {
        if constexpr (M::kTma) {
            int64_t bt, tm, tn;
            gemsops_sk_tile_coords(&p.s, tile, &bt, &tm, &tn);
            T *C = (T *)p.c + bt * p.s.m * p.s.n;
            if (p.epilogue && p.bias != nullptr && p.bias_rs == 0) {
                M::stage_bias_row(static_cast<const T *>(p.bias) +
                                      bt * p.bias_bs,
                                  p.bias_cs, tn * BN, p.s.n, p.beta, sm);
                M::store_staged(C, &p.tc, (int)bt, p.s.m, p.s.n, tm * BM,
                                tn * BN, acc, sm,
                                row_bias_op{M::bias_row(sm), tn * BN, p.alpha},
                                p.c_how);
            }
            else if (p.epilogue) {
                M::store_staged(C, &p.tc, (int)bt, p.s.m, p.s.n, tm * BM,
                                tn * BN, acc, sm, epilogue_of<T>(p, bt),
                                p.c_how);
            }
            else {
                M::store_staged(C, &p.tc, (int)bt, p.s.m, p.s.n, tm * BM,
                                tn * BN, acc, sm, no_epilogue(), p.c_how);
            }
            if (kRowAcc > 0 && p.row_sums != nullptr) {
                store_row_sums<T>(p, tm, tn, acc);
            }
            return true;
        }
        return false;
    }

    static __device__ void mac(const driver_args &p, ring_t &ring,
                               int64_t tile, int64_t k0, int64_t k1,
                               float (&acc)[kAcc + kRowAcc], smem_t &sm)
    {
        if constexpr (M::kTma) {
            M::mac(p.s, operands(p), ring, tile, k0, k1,
                   summed_steps(p, tile, k0, k1), acc, sm);
        }
        else {
            M::mac(p.s, operands(p), ring, tile, k0, k1, acc, sm);
        }
    }

    // ROWS: the steps of the piece [k0, k1) of `tile` in its share of k
    static __device__ row_steps summed_steps(const driver_args &p,
                                             int64_t tile, int64_t k0,
                                             int64_t k1)
    {
        if (kRowAcc == 0 || p.row_sums == nullptr) {
            return row_steps{0, 0};
        }
        int64_t bt, tm, tn;
        gemsops_sk_tile_coords(&p.s, tile, &bt, &tm, &tn);
        const int64_t lo = tn * p.row_chunk, hi = lo + p.row_chunk;
        const auto in_piece = [&](int64_t k) {
            return (int)((k < k0 ? k0 : k > k1 ? k1 : k) - k0);
        };
        return row_steps{in_piece(lo), in_piece(hi)};
    }

    // ROWS: the finished tile (tm, tn)'s row sums. Without parts, the tile
    // of C's first column summed all of k and stores them. With parts, the
    // tile's part goes to the workspace, and the row's last tile to arrive
    // (whichever it is: the parts are added in column order, so the sums
    // repeat bit for bit) stores their total.
    template <typename T>
    static __device__ void store_row_sums(const driver_args &p, int64_t tm,
                                          int64_t tn,
                                          const float (&acc)[kAcc + kRowAcc])
    {
        T *rs = static_cast<T *>(p.row_sums);
        if (p.row_parts == nullptr) {
            if (tn == 0) {
                M::store_row_sums(rs, p.s.m, tm * BM, acc);
            }
            return;
        }
        const int64_t width = p.s.tiles_m * BM;
        M::store_row_sums(p.row_parts + tn * width, width, tm * BM, acc);
        __threadfence(); // every thread's part before the count
        consumers_sync<kConsumers>();
        bool last = false;
        if (threadIdx.x == 0) {
            __threadfence();
            last = last_to_arrive(p.row_counts + tm, p.epoch, p.s.tiles_n);
        }
        if (!consumers_sync_or<kConsumers>(last)) {
            return;
        }
        __threadfence(); // the count before the parts it covers
        const int64_t r = tm * BM + threadIdx.x;
        if (threadIdx.x < BM && r < p.s.m) {
            float v = 0.f;
            for (int64_t j = 0; j < p.s.tiles_n; j++) {
                v += __ldcg(p.row_parts + j * width + r);
            }
            rs[r] = from_acc<T>(v);
        }
    }

    // warp-specialized mainloops: where a split-k piece leaves its partial
    static __device__ unsigned partial_base(smem_t &sm)
    {
        return M::partial_base(sm);
    }

    // the consumers, after their walk
    static __device__ void finish()
    {
        if constexpr (M::kTma) {
            M::finish();
        }
    }

    static __device__ __forceinline__ void coords(int e, int &r, int &c)
    {
        M::coords(e, r, c);
    }
};
// mma.sync: 128 registers, two CTAs per SM; wgmma, 128-row tiles: one CTA
// holds the ring of up to 201 KB (8 stages of 128 x 64 x 128 bytes, 6 of
// 128 x 128, 5 of 128 x 192, 4 of 128 x 256; 4 of 192 x 192); 64 x 64
// tiles: 12 stages of 16 KB (a launch of them is one wave over long k:
// bytes in flight, not more CTAs an SM, is what its k-steps wait for).
template <typename T>
using mma_tc = tc_mainloop<mma_mainloop<T>, 2>;
constexpr int wgmma_stages(int bm, int bn)
{
    return bm == 64    ? 12
           : bm == 192 ? 4
           : bn == 64  ? 8
           : bn == 128 ? 6
           : bn == 192 ? 5
                       : 4;
}
template <typename T, int BN, bool AM, bool BNM, bool ROWS = false,
          int BM = 128, int TEAMS = 1>
using wgmma_tc = tc_mainloop<
    wgmma_mainloop<T, BN, wgmma_stages(BM, BN), AM, BNM, ROWS, BM, TEAMS>, 1>;

// ---- the driver: schedule walk, fix-up, epilogue ---------------------------
__device__ __forceinline__ void store_pair(float *d, float a, float b)
{
    *reinterpret_cast<float2 *>(d) = make_float2(a, b);
}
__device__ __forceinline__ void store_pair(__half *d, float a, float b)
{
    *reinterpret_cast<__half2 *>(d) = __floats2half2_rn(a, b);
}
__device__ __forceinline__ void store_pair(__nv_bfloat16 *d, float a, float b)
{
    *reinterpret_cast<__nv_bfloat162 *>(d) = __floats2bfloat162_rn(a, b);
}

// C[gr, gc .. gc + 1] (at dst) from the accumulators v0, v1 of that place,
// through the epilogue; what lies outside C is dropped.
template <typename T>
__device__ __forceinline__ void store_acc_pair(const driver_args &p,
                                               const epilogue_op<T> &epi,
                                               T *dst, int64_t gr, int64_t gc,
                                               float v0, float v1)
{
    if (p.epilogue) {
        float a0, a1;
        epi.addends(gr, gc, a0, a1);
        v0 = epi.apply(v0, a0);
        v1 = epi.apply(v1, a1);
    }
    if (gr < p.s.m && gc + 1 < p.s.n && p.c_pairs) {
        store_pair(dst, v0, v1);
        return;
    }
    if (gr < p.s.m && gc < p.s.n) {
        dst[0] = from_acc<T>(v0);
    }
    if (gr < p.s.m && gc + 1 < p.s.n) {
        dst[1] = from_acc<T>(v1);
    }
}

template <typename T, typename L>
__device__ void store_tile(const driver_args &p, int64_t tile,
                           const float (&acc)[L::kAcc + L::kRowAcc])
{
    int64_t bt, tm, tn;
    gemsops_sk_tile_coords(&p.s, tile, &bt, &tm, &tn);
    T *C = (T *)p.c + bt * p.s.m * p.s.n;
    // every mainloop's accumulators e, e + 1 (e even) are neighbours in a
    // row at an even column: one paired store when C's rows allow it
    const epilogue_op<T> epi = epilogue_of<T>(p, bt);
#pragma unroll
    for (int e = 0; e < L::kAcc; e += 2) {
        int r, c;
        L::coords(e, r, c);
        const int64_t gr = tm * L::BM + r, gc = tn * L::BN + c;
        store_acc_pair(p, epi, C + gr * p.s.n + gc, gr, gc, acc[e],
                       acc[e + 1]);
    }
}

__device__ __forceinline__ void release_store(unsigned *f, unsigned v)
{
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(f), "r"(v)
                 : "memory");
}

// The driver's barriers: the consumer threads alone when a producer
// warpgroup runs beside them.
template <typename L>
__device__ __forceinline__ void driver_sync()
{
    if constexpr (L::kWarpSpecialized) {
        consumers_sync<L::kConsumers>();
    }
    else {
        __syncthreads();
    }
}
template <typename L>
__device__ __forceinline__ bool driver_sync_or(bool v)
{
    if constexpr (L::kWarpSpecialized) {
        return consumers_sync_or<L::kConsumers>(v);
    }
    else {
        return __syncthreads_or(v) != 0;
    }
}

// Each thread waits for the flag of CTA `peer` (none: peer < 0), giving up
// after spin_limit polls in debug mode (error = 1); true, for every thread,
// when all are in. Pollers side by side: when their flags are already up,
// one L2 round trip instead of one each in a row.
template <typename L>
__device__ bool wait_for_flags(const driver_args &p, int64_t peer)
{
    int gave_up = 0;
    if (peer >= 0) {
        int64_t spins = 0;
        while (acquire_load(p.flags + peer) != p.epoch) {
            if (p.spin_limit > 0 && ++spins > p.spin_limit) {
                gave_up = 1;
                atomicExch(p.error, 1);
                break;
            }
        }
    }
    return !driver_sync_or<L>(gave_up);
}

// Thread 0 waits for peer q's flag and thread 32 for q2's (none: q2 < 0).
template <typename L>
__device__ bool wait_for_peers(const driver_args &p, int64_t q, int64_t q2)
{
    return wait_for_flags<L>(p, threadIdx.x == 0    ? q
                                : threadIdx.x == 32 ? q2
                                                    : -1);
}

// A partial in CTA q's slot: this thread's values e .. e + 3 as one
// 16-byte vector, the vectors of the CTA's threads side by side (a warp's
// access is 512 contiguous bytes). Every kernel's N is a multiple of 4 and
// the slots start 16-byte aligned (launch checks).
template <typename L, int N>
__device__ __forceinline__ float4 *partial_vec(const driver_args &p, int64_t q,
                                               int e)
{
    static_assert(N % 4 == 0, "a partial is whole 16-byte vectors");
    return reinterpret_cast<float4 *>(p.partials + q * N * L::kConsumers) +
           (e / 4) * L::kConsumers + threadIdx.x;
}

// acc[e .. e + 3] += v
template <int N>
__device__ __forceinline__ void add_vec(float (&acc)[N], int e, float4 v)
{
    acc[e] += v.x;
    acc[e + 1] += v.y;
    acc[e + 2] += v.z;
    acc[e + 3] += v.w;
}

// acc += peer q's partial (this thread's values), read through L2
template <typename L, int N>
__device__ __forceinline__ void add_partial(const driver_args &p, int64_t q,
                                            float (&acc)[N])
{
#pragma unroll
    for (int e = 0; e < N; e += 4) {
        add_vec(acc, e, __ldcg(partial_vec<L, N>(p, q, e)));
    }
}

// The owner's fix-up of `tile`: its peers' partials into acc in decreasing
// CTA order, each added once it is in while later peers may still run;
// false when a debug wait gave up.
template <typename L, int N>
__device__ bool add_peers(const driver_args &p, int64_t tile, float (&acc)[N])
{
    for (int64_t q = gemsops_sk_next_peer(&p.s, tile, blockIdx.x); q >= 0;
         q = gemsops_sk_next_peer(&p.s, tile, q)) {
        if (!wait_for_peers<L>(p, q, -1)) {
            return false;
        }
        add_partial<L>(p, q, acc);
    }
    return true;
}

// add_peers two peers at a time: both partials' loads in flight together
// (the adds are the fix-up's cost, not the waits), added in the same order,
// so the sums are the same bits.
template <typename L, int N>
__device__ bool add_peers_in_pairs(const driver_args &p, int64_t tile,
                                   float (&acc)[N])
{
    for (int64_t q = gemsops_sk_next_peer(&p.s, tile, blockIdx.x); q >= 0;) {
        const int64_t q2 = gemsops_sk_next_peer(&p.s, tile, q);
        if (!wait_for_peers<L>(p, q, q2)) {
            return false;
        }
        if (q2 < 0) {
            add_partial<L>(p, q, acc);
            break;
        }
        float4 v[N / 4], v2[N / 4];
#pragma unroll
        for (int e = 0; e < N; e += 4) {
            v[e / 4] = __ldcg(partial_vec<L, N>(p, q, e));
            v2[e / 4] = __ldcg(partial_vec<L, N>(p, q2, e));
        }
#pragma unroll
        for (int e = 0; e < N; e += 4) {
            add_vec(acc, e, v[e / 4]);
            add_vec(acc, e, v2[e / 4]);
        }
        q = gemsops_sk_next_peer(&p.s, tile, q2);
    }
    return true;
}

// CTA c's partial into its slot, then its flag raised to the epoch. No fence
// in each thread: the barrier orders every thread's stores before thread
// 0's release store, which releases them all (PTX memory model: causality
// runs through bar.sync into the release); a fence in every thread made
// each publish wait on its own stores' round trip first.
template <typename L, int N>
__device__ __forceinline__ void publish(const driver_args &p, int64_t c,
                                        const float (&acc)[N])
{
#pragma unroll
    for (int e = 0; e < N; e += 4) {
        *partial_vec<L, N>(p, c, e) =
            make_float4(acc[e], acc[e + 1], acc[e + 2], acc[e + 3]);
    }
    driver_sync<L>();
    if (threadIdx.x == 0) {
        release_store(p.flags + c, p.epoch);
    }
}

// A split-k launch (matmul_splitk_kernel, split_walk): the `split` CTAs of
// a cluster are the pieces of one tile. Each leaves its partial in its own
// shared memory (split_partial_at), the cluster meets at its barrier, and
// rank j adds rows [j BM / split, (j + 1) BM / split) of every rank's
// partial through distributed shared memory, in rank order (the same sums
// whichever piece finished last), and stores them: a warp's stores are
// whole rows of C. A second barrier keeps each CTA's shared memory until
// every rank has read it. No workspace, no flags, no waits on CTAs that
// may not be resident: a cluster's CTAs start together.
//
// The partial lies row-major over the ring, BN floats a row, each 32-byte
// group of 8 columns at its place XOR (r % 8) * 32: the accumulators' pair
// writes (a warp's 8 rows x 32 bytes) and the 16-byte reads of 4 columns
// hit every bank once.
template <typename L>
__device__ __forceinline__ unsigned split_partial_at(int r, int c)
{
    static_assert(L::BN * 4 >= 256, "a row spans the swizzle");
    return r * (L::BN * 4) + ((c * 4) ^ ((r % 8) * 32));
}

template <typename T, typename L>
__device__ __forceinline__ void drive(const driver_args &p,
                                      typename L::ring_t &ring,
                                      typename L::smem_t &sm, split_walk)
{
    static_assert(L::kRowAcc == 0, "split-k carries no row sums");
#ifdef GEMSOPS_HAS_WGMMA
    float acc[L::kAcc];
    split_walk w;
    int64_t tile, k0, k1;
    w.start(p.s, blockIdx.x);
    w.next(p.s, &tile, &k0, &k1);
    L::mac(p, ring, tile, k0, k1, acc, sm);
    consumers_sync<L::kConsumers>(); // every warpgroup's wgmmas read the ring
    const unsigned base = L::partial_base(sm);
#pragma unroll
    for (int e = 0; e < L::kAcc; e += 2) {
        int r, c;
        L::coords(e, r, c);
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(
                         base + split_partial_at<L>(r, c)),
                     "f"(acc[e]), "f"(acc[e + 1])
                     : "memory");
    }
    cluster_arrive();
    cluster_wait();
    const int split = (int)p.s.split, j = (int)w.rank;
    unsigned from[GEMSOPS_SK_MAX_SPLIT];
#pragma unroll
    for (int q = 0; q < GEMSOPS_SK_MAX_SPLIT; q++) {
        from[q] = cluster_addr(base, q < split ? q : 0);
    }
    int64_t bt, tm, tn;
    gemsops_sk_tile_coords(&p.s, tile, &bt, &tm, &tn);
    T *C = (T *)p.c + bt * p.s.m * p.s.n;
    const epilogue_op<T> epi = epilogue_of<T>(p, bt);
    constexpr int kQuads = L::BN / 4; // 16-byte groups of a partial's row
    const int r0 = j * L::BM / split, r1 = (j + 1) * L::BM / split;
    for (int i = threadIdx.x; i < (r1 - r0) * kQuads; i += L::kConsumers) {
        const int r = r0 + i / kQuads, c = i % kQuads * 4;
        const unsigned at = split_partial_at<L>(r, c);
        float4 part[GEMSOPS_SK_MAX_SPLIT];
#pragma unroll
        for (int q = 0; q < GEMSOPS_SK_MAX_SPLIT; q++) {
            if (q < split) {
                part[q] = ld_cluster_v4(from[q] + at);
            }
        }
        float v[4] = {part[0].x, part[0].y, part[0].z, part[0].w};
#pragma unroll
        for (int q = 1; q < GEMSOPS_SK_MAX_SPLIT; q++) {
            if (q < split) {
                add_vec(v, 0, part[q]);
            }
        }
        const int64_t gr = tm * L::BM + r, gc = tn * L::BN + c;
        T *dst = C + gr * p.s.n + gc;
        store_acc_pair(p, epi, dst, gr, gc, v[0], v[1]);
        store_acc_pair(p, epi, dst + 2, gr, gc + 2, v[2], v[3]);
    }
    cluster_arrive(); // this CTA has read its rows of every partial
    cluster_wait();
#else
    (void)p, (void)ring, (void)sm;
#endif
}

// The consumers' whole tiles c, c + ctas, ... (tiles_walk): mainloop and
// epilogue. All of a launch without Stream-K tiles; the rest of a walk
// after its Stream-K pieces.
template <typename T, typename L>
__device__ __forceinline__ void drive_tiles(const driver_args &p,
                                            typename L::ring_t &ring,
                                            typename L::smem_t &sm,
                                            float (&acc)[L::kAcc + L::kRowAcc])
{
    for (int64_t t = blockIdx.x; t < p.s.dp_tiles; t += p.s.ctas) {
        L::mac(p, ring, t, 0, p.s.iters, acc, sm);
        if (!L::template store<T>(p, t, acc, sm)) {
            store_tile<T, L>(p, t, acc);
        }
    }
}

// Pingpong: warpgroup g takes the walk's tiles g, g + 2, ... (tile i of
// the walk is c + i * ctas); the producer loads every tile's k-steps in
// walk order, so before each of its tiles a warpgroup's cursor passes over
// the other's. Tile i's mainloop starts once tile i - 1's has waited for
// all of its steps (team_turn): a cursor that ran further ahead of the
// producer than the ring's depth would read a slot's parity from a lap
// before and take a step that has not landed. (Tiles ascend along the
// walk: the other's next tile exists wherever this one's does.)
template <typename T, typename L>
__device__ __forceinline__ void drive_team_tiles(
    const driver_args &p, typename L::ring_t &ring, typename L::smem_t &sm,
    float (&acc)[L::kAcc + L::kRowAcc])
{
    const unsigned g = threadIdx.x / 128;
    if (g == 1) {
        L::skip(ring, p.s.iters);
    }
    for (int64_t t = blockIdx.x + g * p.s.ctas; t < p.s.dp_tiles;
         t += 2 * p.s.ctas) {
        if (t >= p.s.ctas) {
            team_turn_wait(g);
        }
        L::mac(p, ring, t, 0, p.s.iters, acc, sm);
        if (t + p.s.ctas < p.s.dp_tiles) {
            team_turn_pass(g);
        }
        L::skip(ring, p.s.iters);
        L::template store<T>(p, t, acc, sm);
    }
}

template <typename T, typename L>
__device__ __forceinline__ void drive(const driver_args &p,
                                      typename L::ring_t &ring,
                                      typename L::smem_t &sm, tiles_walk)
{
    float acc[L::kAcc + L::kRowAcc];
    if constexpr (L::teams() == 2) {
        drive_team_tiles<T, L>(p, ring, sm, acc);
    }
    else {
        drive_tiles<T, L>(p, ring, sm, acc);
    }
}

// The consumers' walk of CTA c (streamk_walk): mainloop, fix-up, epilogue.
template <typename T, typename L>
__device__ __forceinline__ void drive(const driver_args &p,
                                      typename L::ring_t &ring,
                                      typename L::smem_t &sm, streamk_walk)
{
    constexpr int kAll = L::kAcc + L::kRowAcc; // a partial's values a thread
    float acc[kAll];
    const int64_t c = blockIdx.x;
    // two peers' partials in registers at once where they fit beside acc:
    // the wgmma tiles up to 128 x 128
    constexpr bool kPeerPairs = L::kWarpSpecialized && L::BN <= 128;
    // the order of gemsops_sk_walk (a TMA producer walks it ahead of this
    // loop): Stream-K pieces, then data-parallel tiles (apart: the mma.sync
    // kernel spills when one loop holds both)
    int64_t begin, end;
    gemsops_sk_range(&p.s, c, &begin, &end);
    while (end > begin) {
        int64_t tile, k0, k1;
        end = gemsops_sk_piece(&p.s, begin, end, &tile, &k0, &k1);
        L::mac(p, ring, tile, k0, k1, acc, sm);
        if (gemsops_sk_is_peer(&p.s, k1)) {
            publish<L>(p, c, acc);
            continue;
        }
        bool done;
        if constexpr (kPeerPairs) {
            done = add_peers_in_pairs<L>(p, tile, acc);
        }
        else {
            done = add_peers<L>(p, tile, acc);
        }
        if (!done) {
            L::drain(ring, sm); // no load may land after the CTA exits
            return; // the host raises: error = 1
        }
        if (!L::template store<T>(p, tile, acc, sm)) {
            store_tile<T, L>(p, tile, acc);
        }
    }
    drive_tiles<T, L>(p, ring, sm, acc);
}

// One CTA's roles: Walk (streamk_walk or tiles_walk) is the walk of its
// producer and of its consumers alike.
template <typename T, typename L, typename Walk>
__device__ __forceinline__ void run_cta(const driver_args &p)
{
    extern __shared__ __align__(128) unsigned char dynamic_smem[];
    typename L::smem_t &sm =
        *reinterpret_cast<typename L::smem_t *>(dynamic_smem);
    typename L::ring_t ring;
    // launched as a programmatic dependent (sm_90): the grid before may still
    // be finishing and writing A, B, a bias or the flags. The next launch
    // may be scheduled at once: its CTAs wait in turn, and every CTA of this
    // grid is resident by now, so a Stream-K owner never waits on a peer
    // that a dependent keeps off an SM.
    pdl_wait_primary();
    pdl_launch_dependents();
    L::begin(p, blockIdx.x, ring, sm); // a TMA mainloop starts loading here
    if constexpr (L::kWarpSpecialized) {
        // one branch a role: setmaxnreg applies only so
        if (threadIdx.x >= L::kConsumers) {
            L::template produce<Walk>(p, blockIdx.x, sm);
        }
        else {
            L::consume();
            drive<T, L>(p, ring, sm, Walk{});
            L::finish();
        }
    }
    else {
        drive<T, L>(p, ring, sm, Walk{});
    }
}

// Every schedule.
template <typename T, typename L>
__global__ void __launch_bounds__(L::kThreads, L::kMinCtas)
    matmul_streamk_kernel(const __grid_constant__ driver_args p)
{
    run_cta<T, L, streamk_walk>(p);
}

// Whole tiles alone (sk_tiles = 0, split = 0; warp-specialized mainloops).
template <typename T, typename L>
__global__ void __launch_bounds__(L::kThreads, L::kMinCtas)
    matmul_tiles_kernel(const __grid_constant__ driver_args p)
{
    run_cta<T, L, tiles_walk>(p);
}

// Split-k (split > 0; warp-specialized mainloops without row sums),
// launched in clusters of `split` CTAs, one a tile.
template <typename T, typename L>
__global__ void __launch_bounds__(L::kThreads, L::kMinCtas)
    matmul_splitk_kernel(const __grid_constant__ driver_args p)
{
    run_cta<T, L, split_walk>(p);
}

// ---- A's row sums where the product's kernel does not make them ----------
// row_sums[i] = sum over k of A[i, k] (batch 1), fp32 rounded once; each
// sum in a fixed order (run-to-run identical). Rows with unit k stride: a
// warp a row (its lanes read consecutive elements, then meet in an xor
// tree); otherwise a thread a row, k in order (neighbouring threads read
// neighbouring rows of an M-contiguous A).
constexpr int kRowSumThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kRowSumThreads)
    matmul_row_sums_by_warp(const T *a, int64_t m, int64_t k, int64_t rs,
                            T *out)
{
    const int64_t row =
        blockIdx.x * (int64_t)(kRowSumThreads / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= m) { // a whole warp: the shuffles below see every lane
        return;
    }
    float sum = 0.f;
    for (int64_t j = lane; j < k; j += 32) {
        sum += to_acc<float>(a[row * rs + j]);
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) {
        sum += __shfl_xor_sync(0xffffffffu, sum, off);
    }
    if (lane == 0) {
        out[row] = from_acc<T>(sum);
    }
}

template <typename T>
__global__ void __launch_bounds__(kRowSumThreads)
    matmul_row_sums_by_thread(const T *a, int64_t m, int64_t k, int64_t rs,
                              int64_t cs, T *out)
{
    const int64_t row = blockIdx.x * (int64_t)kRowSumThreads + threadIdx.x;
    if (row >= m) {
        return;
    }
    float sum = 0.f;
    for (int64_t j = 0; j < k; j++) {
        sum += to_acc<float>(a[row * rs + j * cs]);
    }
    out[row] = from_acc<T>(sum);
}

template <typename T>
void launch_row_sums(const gemsops_matmul_params *p, cudaStream_t stream)
{
    const T *a = static_cast<const T *>(p->a);
    T *out = static_cast<T *>(p->row_sums);
    if (p->a_cs == 1) {
        const int64_t rows = kRowSumThreads / 32;
        matmul_row_sums_by_warp<T>
            <<<(unsigned)((p->m + rows - 1) / rows), kRowSumThreads, 0,
               stream>>>(a, p->m, p->k, p->a_rs, out);
    }
    else {
        matmul_row_sums_by_thread<T>
            <<<(unsigned)((p->m + kRowSumThreads - 1) / kRowSumThreads),
               kRowSumThreads, 0, stream>>>(a, p->m, p->k, p->a_rs, p->a_cs,
                                            out);
    }
}

// The one dtype switch of the row sums.
int row_sums(const gemsops_matmul_params *p, gemsops_status *st)
{
    if (p->m == 0) {
        return GEMSOPS_OK;
    }
    cudaStream_t stream = (cudaStream_t)p->stream;
    switch (p->dtype) {
    case GEMSOPS_FLOAT32: launch_row_sums<float>(p, stream); break;
    case GEMSOPS_FLOAT16: launch_row_sums<__half>(p, stream); break;
    case GEMSOPS_BFLOAT16: launch_row_sums<__nv_bfloat16>(p, stream); break;
    default:
        return gemsops_fail(st, GEMSOPS_ERR_TYPE,
                            "matmul: unsupported dtype %s on CUDA",
                            gemsops_dtype_name(p->dtype));
    }
    GEMSOPS_CUDA_CHECK_LAUNCH(st, "matmul_row_sums");
    return GEMSOPS_OK;
}

// ---- planning and launch ---------------------------------------------------
// Tensor-core mainloops take whole aligned 16-byte chunks: every base and
// batch stride 16-byte aligned; a K-contiguous operand needs k (and its row
// stride) a multiple of 8, an MN-contiguous one m or n (and its k stride).
// That is mma.sync's rule (its cp.async chunks may not cross an edge);
// TMA fills past the edges with zeros, so for wgmma only the base and the
// strides count (tma_layout_of); fp32 runs on wgmma as TF32, when allowed,
// with K-contiguous operands only.
struct tc_layout {
    bool a_k, a_m, b_k, b_n;
};

tc_layout layout_of(const gemsops_matmul_params *p)
{
    auto al = [](const void *q) { return (uintptr_t)q % 16 == 0; };
    const bool base =
        (p->dtype == GEMSOPS_FLOAT16 || p->dtype == GEMSOPS_BFLOAT16) &&
        al(p->a) && al(p->b) &&
        ((p->a_bs % 8 == 0 && p->b_bs % 8 == 0) || p->batch == 1) &&
        p->m < INT32_MAX && p->n < INT32_MAX && p->k < INT32_MAX &&
        p->batch < INT32_MAX; // TMA coordinates are int32
    tc_layout l;
    l.a_k = base && p->a_cs == 1 && p->a_rs % 8 == 0 && p->k % 8 == 0;
    l.a_m = base && p->a_rs == 1 && p->a_cs % 8 == 0 && p->m % 8 == 0;
    l.b_k = base && p->b_rs == 1 && p->b_cs % 8 == 0 && p->k % 8 == 0;
    l.b_n = base && p->b_cs == 1 && p->b_rs % 8 == 0 && p->n % 8 == 0;
    return l;
}

// fp32 operands may take the wgmma mainloop (as TF32)
bool tf32_allowed(const gemsops_matmul_params *p)
{
    return p->dtype == GEMSOPS_FLOAT32 && p->allow_tf32;
}

// the dtypes wgmma takes: halves, and fp32 as TF32 when allowed
bool wgmma_dtype(const gemsops_matmul_params *p)
{
    return p->dtype == GEMSOPS_FLOAT16 || p->dtype == GEMSOPS_BFLOAT16 ||
           tf32_allowed(p);
}

tc_layout tma_layout_of(const gemsops_matmul_params *p)
{
    const bool transposes = !tf32_allowed(p); // TF32 has no MN-major form
    const bool ok = wgmma_dtype(p) && p->m < INT32_MAX && p->n < INT32_MAX &&
                    p->k < INT32_MAX &&
                    p->batch < INT32_MAX; // TMA coordinates are int32
    const int64_t unit = 16 / (int64_t)gemsops_dtype_size(p->dtype);
    auto base = [p, ok, unit](const void *q, int64_t bs) {
        return ok && (uintptr_t)q % 16 == 0 &&
               (bs % unit == 0 || p->batch == 1);
    };
    const bool a = base(p->a, p->a_bs), b = base(p->b, p->b_bs);
    tc_layout l;
    l.a_k = a && p->a_cs == 1 && p->a_rs % unit == 0;
    l.a_m = transposes && a && p->a_rs == 1 && p->a_cs % unit == 0;
    l.b_k = b && p->b_rs == 1 && p->b_cs % unit == 0;
    l.b_n = transposes && b && p->b_cs == 1 && p->b_rs % unit == 0;
    return l;
}

// A kernel and its launcher
struct kernel_entry {
    const void *fn;
    cudaError_t (*launch)(unsigned grid, int smem, cudaStream_t s, bool pdl,
                          const driver_args &a);
};

struct kernel_choice {
    CUtensorMap ta, tb; // wgmma only
    // every schedule; whole tiles alone (the warp-specialized mainloops'
    // matmul_tiles_kernel, else streamk's); split-k in clusters (theirs
    // without row sums, else none); what the plan runs (plan())
    kernel_entry streamk, tiles, splitk, run;
    int bm, bn, bk, smem, threads;
    int partial_floats; // a Stream-K partial's size (the row sums' too)
    bool row_sums; // the kernel writes A's row sums (a ROWS wgmma kernel)
    bool stream_k; // its tiles may be split Stream-K (else whole or split-k)
    gemsops_mainloop mainloop;
    gemsops_sk_mode sk_mode; // the schedule: p->mode, or the cost model's
    tc_layout layout;
};

template <typename T, typename L>
cudaError_t launch_streamk(unsigned grid, int smem, cudaStream_t s, bool pdl,
                           const driver_args &a)
{
    return launch_dependent_smem(matmul_streamk_kernel<T, L>, dim3(grid),
                                 dim3(L::kThreads), (size_t)smem, s, pdl, a);
}

template <typename T, typename L>
cudaError_t launch_tiles(unsigned grid, int smem, cudaStream_t s, bool pdl,
                         const driver_args &a)
{
    return launch_dependent_smem(matmul_tiles_kernel<T, L>, dim3(grid),
                                 dim3(L::kThreads), (size_t)smem, s, pdl, a);
}

template <typename T, typename L>
cudaError_t launch_splitk(unsigned grid, int smem, cudaStream_t s, bool pdl,
                          const driver_args &a)
{
    return launch_dependent_cluster(matmul_splitk_kernel<T, L>, dim3(grid),
                                    dim3(L::kThreads), (size_t)smem, s, pdl,
                                    (unsigned)a.s.split, a);
}

template <typename T, typename L>
kernel_choice choice(int bk, gemsops_mainloop m, tc_layout l)
{
    kernel_choice k{};
    if constexpr (L::kStreamK) {
        k.streamk = {(const void *)matmul_streamk_kernel<T, L>,
                     launch_streamk<T, L>};
    }
    if constexpr (L::kWarpSpecialized) {
        k.tiles = {(const void *)matmul_tiles_kernel<T, L>,
                   launch_tiles<T, L>};
    }
    else {
        k.tiles = k.streamk;
    }
    if constexpr (!L::kStreamK) { // plan() keeps its tiles whole
        k.streamk = k.tiles;
    }
    k.stream_k = L::kStreamK;
    k.splitk = {nullptr, nullptr};
    if constexpr (L::kWarpSpecialized && L::kRowAcc == 0 && L::kSplitK) {
        k.splitk = {(const void *)matmul_splitk_kernel<T, L>,
                    launch_splitk<T, L>};
    }
    k.run = k.streamk;
    k.bm = L::BM;
    k.bn = L::BN;
    k.bk = bk;
    k.smem = L::kSmemBytes;
    k.threads = L::kThreads;
    k.partial_floats = (L::kAcc + L::kRowAcc) * L::kConsumers;
    k.row_sums = L::kRowAcc > 0;
    k.mainloop = m;
    k.layout = l;
    return k;
}

// cuTensorMapEncodeTiled through cudart's driver entry point (no -lcuda).
// NULL when the driver has none (older than CUDA 12).
using encode_tiled_fn = CUresult (*)(CUtensorMap *, CUtensorMapDataType,
                                     cuuint32_t, void *, const cuuint64_t *,
                                     const cuuint64_t *, const cuuint32_t *,
                                     const cuuint32_t *, CUtensorMapInterleave,
                                     CUtensorMapSwizzle,
                                     CUtensorMapL2promotion,
                                     CUtensorMapFloatOOBfill);

encode_tiled_fn tensor_map_encoder()
{
    static std::once_flag once;
    static encode_tiled_fn fn = nullptr;
    std::call_once(once, [] {
        void *f = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f,
                                             12000, cudaEnableDefault,
                                             &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess) {
            fn = (encode_tiled_fn)f;
        }
        else {
            cudaGetLastError(); // not sticky; tma_usable says no from now on
        }
    });
    return fn;
}

// An operand seen as [z][y][x] (x contiguous, esize-byte elements). TMA
// can describe it when the base is 16-byte aligned and the y and z strides
// are positive multiples of 16 bytes below 2^40 (cuTensorMapEncodeTiled's
// documented limits). Operands it cannot describe (odd or zero strides,
// misaligned views) take the mma mainloop: a rule on the layout, decided
// before any driver call, not a fallback from a failed one.
struct tma_operand {
    const void *base;
    int64_t x, y, y_stride, batch, z_stride;
    int box_y, esize;
    bool one() const
    {
        return z_stride == 0 || batch == 1;
    }
    int64_t y_bytes() const
    {
        return y_stride * esize;
    }
    int64_t z_bytes() const
    {
        return (one() ? y_stride * y : z_stride) * esize;
    }
    // one box spans 128 bytes of x: a swizzle line
    int box_x() const
    {
        return 128 / esize;
    }
};

bool tma_describes(const tma_operand &o)
{
    constexpr int64_t lim = (int64_t)1 << 40, dim_lim = (int64_t)1 << 32;
    auto stride_ok = [](int64_t b) { return b > 0 && b % 16 == 0 && b < lim; };
    return o.x > 0 && o.y > 0 && o.batch > 0 && o.x < dim_lim &&
           o.y < dim_lim && o.batch < dim_lim && (uintptr_t)o.base % 16 == 0 &&
           stride_ok(o.y_bytes()) && stride_ok(o.z_bytes());
}

// Layouts that pass tma_describes but that the driver still refuses with
// CUDA_ERROR_INVALID_VALUE are counted (gemsops._C.fallback_counts()): a
// refused operand takes the mma mainloop, a refused C the element stores;
// any other failure is an error.
std::atomic<long long> g_tma_refusals{0};

// Boxes of 128 bytes x box_y, 128-byte swizzle, zero fill past the edges. The
// caller checked tma_describes and made the device's context current.
// *refused: the driver refused this layout (counted, not an error).
int encode_operand(CUtensorMap *map, gemsops_dtype dt, const tma_operand &o,
                   bool *refused, gemsops_status *st)
{
    const encode_tiled_fn fn = tensor_map_encoder();
    const cuuint64_t dims[3] = {(cuuint64_t)o.x, (cuuint64_t)o.y,
                                (cuuint64_t)(o.one() ? 1 : o.batch)};
    const cuuint64_t strides[2] = {(cuuint64_t)o.y_bytes(),
                                   (cuuint64_t)o.z_bytes()};
    const cuuint32_t box[3] = {(cuuint32_t)o.box_x(), (cuuint32_t)o.box_y, 1};
    const cuuint32_t elem_strides[3] = {1, 1, 1};
    const CUtensorMapDataType type =
        dt == GEMSOPS_FLOAT16    ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
        : dt == GEMSOPS_BFLOAT16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
    const CUresult r =
        fn(map, type, 3, (void *)o.base, dims, strides, box, elem_strides,
           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
           CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    *refused = r == CUDA_ERROR_INVALID_VALUE;
    if (*refused) {
        g_tma_refusals.fetch_add(1, std::memory_order_relaxed);
        return GEMSOPS_OK;
    }
    if (r != CUDA_SUCCESS) {
        return gemsops_fail(st, GEMSOPS_ERR_RUNTIME,
                            "matmul: cuTensorMapEncodeTiled failed (CUresult "
                            "%d) for an operand of %lld x %lld, strides %lld "
                            "and %lld bytes",
                            (int)r, (long long)o.x, (long long)o.y,
                            (long long)o.y_bytes(), (long long)o.z_bytes());
    }
    return GEMSOPS_OK;
}

// The two operands of a wgmma launch with BM x BN tiles, as TMA sees them.
void tma_operands(const gemsops_matmul_params *p, const tc_layout &l, int bm,
                  int bn, tma_operand *a, tma_operand *b)
{
    const int es = (int)gemsops_dtype_size(p->dtype);
    *a = l.a_k ? tma_operand{p->a,     p->k,    p->m, p->a_rs,
                             p->batch, p->a_bs, bm,   es}
               : tma_operand{p->a,     p->m,    p->k, p->a_cs,
                             p->batch, p->a_bs, 64,   es};
    *b = l.b_k ? tma_operand{p->b,     p->k,    p->n, p->b_cs,
                             p->batch, p->b_bs, bn,   es}
               : tma_operand{p->b,     p->n,    p->k, p->b_rs,
                             p->batch, p->b_bs, 64,   es};
}

bool wgmma_allowed(const gemsops_matmul_params *p, const device_facts &f)
{
    return (p->mainloop == GEMSOPS_MAINLOOP_AUTO ||
            p->mainloop >= GEMSOPS_MAINLOOP_WGMMA_128) &&
           wgmma_dtype(p) && wgmma_runs(f);
}

// The mainloop for these operands on this device: the most capable one the
// request allows (see gemsops_mainloop); for wgmma (operand layouts tl),
// the tile width and schedule the cost model (matmul_cost.cuh) prefers,
// unless forced; for mma.sync, operand layouts l.
gemsops_mainloop pick_mainloop(const gemsops_matmul_params *p,
                               const device_facts &f, const tc_layout &tl,
                               const tc_layout &l, gemsops_sk_mode *mode)
{
    gemsops_mainloop want = p->mainloop;
    *mode = p->mode;
    if (wgmma_allowed(p, f) && (tl.a_k || tl.a_m) && (tl.b_k || tl.b_n)) {
        const wgmma_plan w = wgmma_cheapest(p, want, f.sm_count, kGroupM);
        *mode = w.mode;
        return w.width;
    }
    if (want == GEMSOPS_MAINLOOP_AUTO || want >= GEMSOPS_MAINLOOP_WGMMA_128) {
        want = GEMSOPS_MAINLOOP_MMA;
    }
    if (want == GEMSOPS_MAINLOOP_MMA &&
        !(f.cc_major >= 8 && l.a_k && (l.b_k || l.b_n))) {
        want = GEMSOPS_MAINLOOP_FFMA;
    }
    return want;
}

// TF32 (T = float): both operands K-contiguous (pick_mainloop saw to it).
// rows: the launch asks for A's row sums; the ROWS kernels exist for
// nn.Linear's weight gradient alone (A = grad^T M-contiguous, B = the
// input N-contiguous), at every width of 128-row tiles; the others leave
// them to matmul_row_sums_by_*.
template <typename T, int BN, int BM = 128, int TEAMS = 1>
kernel_choice wgmma_choice(gemsops_mainloop m, const tc_layout &l, bool rows)
{
    constexpr int bk = 128 / sizeof(T);
    if constexpr (std::is_same_v<T, float>) {
        (void)rows;
        return choice<T, wgmma_tc<T, BN, false, false, false, BM, TEAMS>>(bk,
                                                                          m,
                                                                          l);
    }
    else {
        if constexpr (BM == 128 && TEAMS == 1) {
            if (rows && !l.a_k && !l.b_k) {
                return choice<T, wgmma_tc<T, BN, true, true, true>>(bk, m, l);
            }
        }
        if (!l.a_k) { // M-contiguous A
            return l.b_k ? choice<T, wgmma_tc<T, BN, true, false, false, BM,
                                              TEAMS>>(bk, m, l)
                         : choice<T, wgmma_tc<T, BN, true, true, false, BM,
                                              TEAMS>>(bk, m, l);
        }
        return l.b_k
                   ? choice<T, wgmma_tc<T, BN, false, false, false, BM,
                                        TEAMS>>(bk, m, l)
                   : choice<T,
                            wgmma_tc<T, BN, false, true, false, BM, TEAMS>>(bk,
                                                                            m,
                                                                            l);
    }
}

template <typename T>
kernel_choice choose_typed(gemsops_mainloop m, const tc_layout &l, bool rows)
{
    switch (m) {
    case GEMSOPS_MAINLOOP_WGMMA_256: return wgmma_choice<T, 256>(m, l, rows);
    case GEMSOPS_MAINLOOP_WGMMA_192: return wgmma_choice<T, 192>(m, l, rows);
    case GEMSOPS_MAINLOOP_WGMMA_128: return wgmma_choice<T, 128>(m, l, rows);
    case GEMSOPS_MAINLOOP_WGMMA_64: return wgmma_choice<T, 64>(m, l, rows);
    case GEMSOPS_MAINLOOP_WGMMA_64X64:
        return wgmma_choice<T, 64, 64>(m, l, rows);
    case GEMSOPS_MAINLOOP_WGMMA_192X192:
        return wgmma_choice<T, 192, 192>(m, l, rows);
    case GEMSOPS_MAINLOOP_WGMMA_PINGPONG:
        // halves without A's row sums in the kernel; else the same tile on
        // the cooperative kernel, as the plan says
        if constexpr (!std::is_same_v<T, float>) {
            if (!(rows && !l.a_k && !l.b_k)) {
                return wgmma_choice<T, 128, 128, 2>(m, l, false);
            }
        }
        return wgmma_choice<T, 128>(GEMSOPS_MAINLOOP_WGMMA_128, l, rows);
    case GEMSOPS_MAINLOOP_MMA:
        if constexpr (!std::is_same_v<T, float>) {
            return choice<T, mma_tc<T>>(32, m, l);
        }
        [[fallthrough]];
    default: return choice<T, ffma_mainloop<T>>(16, GEMSOPS_MAINLOOP_FFMA, l);
    }
}

// The one dtype switch.
int choose_dtype(gemsops_dtype dtype, gemsops_mainloop m, const tc_layout &l,
                 bool rows, kernel_choice *k, gemsops_status *st)
{
    switch (dtype) {
    case GEMSOPS_FLOAT32:
        *k = choose_typed<float>(m, l, rows);
        return GEMSOPS_OK;
    case GEMSOPS_FLOAT16:
        *k = choose_typed<__half>(m, l, rows);
        return GEMSOPS_OK;
    case GEMSOPS_BFLOAT16:
        *k = choose_typed<__nv_bfloat16>(m, l, rows);
        return GEMSOPS_OK;
    default:
        return gemsops_fail(st, GEMSOPS_ERR_TYPE,
                            "matmul: unsupported dtype %s on CUDA",
                            gemsops_dtype_name(dtype));
    }
}

// encode: build the tensor maps (a launch); without, the choice for these
// layouts alone (a plan, or a launch's first call, before the workspace
// that may hold staged operands exists).
int choose(const gemsops_matmul_params *p, const device_facts &f, bool encode,
           kernel_choice *k, gemsops_status *st)
{
    const tc_layout l = layout_of(p), tl = tma_layout_of(p);
    gemsops_sk_mode mode;
    gemsops_mainloop m = pick_mainloop(p, f, tl, l, &mode);
    gemsops_matmul_params lower = *p;
    lower.mainloop = GEMSOPS_MAINLOOP_MMA;
    tma_operand oa, ob;
    tma_operands(p, tl, wgmma_bm(m), wgmma_bn(m), &oa, &ob);
    if (m >= GEMSOPS_MAINLOOP_WGMMA_128 &&
        (tensor_map_encoder() == nullptr || !tma_describes(oa) ||
         !tma_describes(ob))) {
        m = pick_mainloop(&lower, f, tl, l, &mode);
    }
    CUtensorMap ta, tb;
    if (encode && m >= GEMSOPS_MAINLOOP_WGMMA_128) {
        bool ra = false, rb = false;
        if (encode_operand(&ta, p->dtype, oa, &ra, st) != GEMSOPS_OK ||
            (!ra &&
             encode_operand(&tb, p->dtype, ob, &rb, st) != GEMSOPS_OK)) {
            return st->code;
        }
        if (ra || rb) {
            m = pick_mainloop(&lower, f, tl, l, &mode);
        }
    }
    const bool wgmma = m >= GEMSOPS_MAINLOOP_WGMMA_128;
    if (choose_dtype(p->dtype, m, wgmma ? tl : l, p->row_sums != nullptr, k,
                     st) != GEMSOPS_OK) {
        return st->code;
    }
    k->sk_mode = mode;
    if (wgmma && encode) {
        k->ta = ta;
        k->tb = tb;
    }
    return GEMSOPS_OK;
}

int plan(const gemsops_matmul_params *p, const device_facts &f, bool encode,
         gemsops_sk_schedule *s, kernel_choice *k, gemsops_status *st)
{
    if (choose(p, f, encode, k, st) != GEMSOPS_OK) {
        return st->code;
    }
    int resident = 1;
    if (resident_ctas(k->streamk.fn, p->device_id, k->threads, k->smem,
                      &resident, st) != GEMSOPS_OK) {
        return st->code;
    }
    int64_t ctas = resident;
    if (p->ctas_override > 0 && p->ctas_override < ctas) {
        ctas = p->ctas_override; // never more than fit at once
    }
    // a mainloop without a Stream-K walk runs a Stream-K or hybrid schedule
    // asked for as whole tiles, and split-k too where it has no split-k
    // kernel
    if (!k->stream_k &&
        (k->sk_mode != GEMSOPS_SK_SPLIT_K || k->splitk.fn == nullptr)) {
        k->sk_mode = GEMSOPS_SK_DATA_PARALLEL;
    }
    gemsops_sk_plan(s, p->m, p->n, p->k, p->batch, k->bm, k->bn, k->bk,
                    kGroupM, ctas, k->sk_mode, p->two_tiles);
    // split-k runs in clusters, a tile's pieces in one (the warp-specialized
    // kernels without row sums; elsewhere the split tiles' owners add them
    // up, as Stream-K's do), as many pieces as leave every tile's cluster
    // room at once
    if (s->split > 0 && k->splitk.fn == nullptr) {
        s->split = 0;
    }
    while (s->split >= 2) {
        int fit = 0;
        if (resident_clusters(k->splitk.fn, p->device_id, k->threads, k->smem,
                              (int)s->split, &fit, st) != GEMSOPS_OK) {
            return st->code;
        }
        if (s->tiles <= fit) {
            break;
        }
        s->split--;
    }
    if (s->split == 1) {
        gemsops_sk_plan(s, p->m, p->n, p->k, p->batch, k->bm, k->bn, k->bk,
                        kGroupM, ctas, GEMSOPS_SK_DATA_PARALLEL, 0);
    }
    if (s->split > 0) {
        s->ctas = s->sk_ctas = s->tiles * s->split;
        gemsops_sk_set_range_divisors(s);
        k->run = k->splitk;
        return GEMSOPS_OK;
    }
    // whole tiles alone: the kernel without the Stream-K walk (its own
    // shared-memory opt-in, which resident_ctas sets; the same residency)
    if (s->sk_tiles == 0 && s->split == 0 && k->tiles.fn != k->streamk.fn) {
        int same = 1;
        if (resident_ctas(k->tiles.fn, p->device_id, k->threads, k->smem,
                          &same, st) != GEMSOPS_OK) {
            return st->code;
        }
        k->run = k->tiles;
    }
    return GEMSOPS_OK;
}

// ---- staged operands (matmul_stage.cuh) -------------------------------------
// A wgmma launch stages each operand that has no layout TMA can describe.
struct staging {
    staged_operand a, b;
    bool on_a, on_b;

    bool any() const
    {
        return on_a || on_b;
    }
    int64_t bytes() const
    {
        return (on_a ? a.bytes() : 0) + (on_b ? b.bytes() : 0);
    }
    // The copies at `area` (16-byte aligned), and q: p reading them.
    void place(unsigned char *area, gemsops_matmul_params *q)
    {
        if (on_a) {
            a.dst = area;
            area += a.bytes();
            q->a = a.dst;
            q->a_bs = a.staged_bs();
            q->a_rs = a.staged_rs();
            q->a_cs = a.staged_cs();
        }
        if (on_b) {
            b.dst = area;
            q->b = b.dst;
            q->b_bs = b.staged_bs();
            q->b_rs = b.staged_rs();
            q->b_cs = b.staged_cs();
        }
    }
    int staged_mask() const
    {
        return (on_a ? 1 : 0) | (on_b ? 2 : 0);
    }
};

staging plan_staging(const gemsops_matmul_params *p, const device_facts &f)
{
    staging sg{};
    if (!wgmma_allowed(p, f) || p->m == 0 || p->n == 0 || p->k == 0 ||
        p->m >= INT32_MAX || p->n >= INT32_MAX || p->k >= INT32_MAX ||
        p->batch >= INT32_MAX || tensor_map_encoder() == nullptr) {
        return sg;
    }
    const tc_layout tl = tma_layout_of(p);
    tma_operand oa, ob;
    tma_operands(p, tl, 128, 128, &oa, &ob);
    sg.on_a = !((tl.a_k || tl.a_m) && tma_describes(oa));
    sg.on_b = !((tl.b_k || tl.b_n) && tma_describes(ob));
    const int es = (int)gemsops_dtype_size(p->dtype);
    const bool k_major = tf32_allowed(p); // TF32 reads K-major only
    if (sg.on_a) {
        sg.a = stage_plan(p->a, es, p->batch, p->a_bs, p->m, p->a_rs, p->k,
                          p->a_cs, false, k_major);
    }
    if (sg.on_b) {
        sg.b = stage_plan(p->b, es, p->batch, p->b_bs, p->k, p->b_rs, p->n,
                          p->b_cs, true, k_major);
    }
    return sg;
}

int launch_staging(const staging &sg, const device_facts &f,
                   cudaStream_t stream, gemsops_status *st)
{
    stage_args sa{};
    int n = 0;
    int64_t items = 0;
    for (const staged_operand *o : {&sg.a, &sg.b}) {
        if ((o == &sg.a && sg.on_a) || (o == &sg.b && sg.on_b)) {
            sa.op[n++] = *o;
            items = std::max(items, stage_items(*o));
        }
    }
    const unsigned grid = (unsigned)std::min<int64_t>(items, 8 * f.sm_count);
    const dim3 blocks(grid, (unsigned)n);
    if (sa.op[0].esize == 4) {
        matmul_stage_kernel<uint32_t>
            <<<blocks, kStageThreads, 0, stream>>>(sa);
    }
    else {
        matmul_stage_kernel<uint16_t>
            <<<blocks, kStageThreads, 0, stream>>>(sa);
    }
    GEMSOPS_CUDA_CHECK_LAUNCH(st, "matmul_stage_kernel");
    return GEMSOPS_OK;
}

// Any 16-byte aligned address: where staged copies are planned before the
// workspace exists (tensor maps are not encoded then).
unsigned char *const kPlaceholder = reinterpret_cast<unsigned char *>(256);

int launch(const gemsops_matmul_params *p, gemsops_matmul_need *need,
           gemsops_status *st)
{
    need->workspace_bytes = need->flags = 0;
    device_guard guard;
    GEMSOPS_CUDA_CHECK(st, guard.enter(p->device_id));
    device_facts f;
    if (get_device_facts(p->device_id, &f, st) != GEMSOPS_OK) {
        return st->code;
    }
    skinny_plan sp;
    if (plan_skinny(p, f, &sp, st) != GEMSOPS_OK) {
        return st->code;
    }
    if (sp.ctas > 0) {
        return launch_skinny(p, f, sp, need, st);
    }
    gemsops_matmul_params q = *p;
    if (q.mainloop == GEMSOPS_MAINLOOP_SKINNY) { // not for these operands
        q.mainloop = GEMSOPS_MAINLOOP_AUTO;
        p = &q;
    }
    // The workspace holds the staged operands first, then the partials.
    staging sg = plan_staging(p, f);
    unsigned char *ws = static_cast<unsigned char *>(p->workspace);
    const bool have_ws = ws != nullptr && p->flags != nullptr;
    if (sg.any()) {
        sg.place(have_ws ? ws : kPlaceholder, &q);
    }
    driver_args a{};
    kernel_choice k;
    if (plan(&q, f, !sg.any() || have_ws, &a.s, &k, st) != GEMSOPS_OK) {
        return st->code;
    }
    // flags the boundary cannot vouch for may hold any value, this epoch
    // too: zeroed before use (then every slot holds an older epoch)
    if (p->flags != nullptr && !p->flags_known) {
        GEMSOPS_CUDA_CHECK(st,
                           cudaMemsetAsync(p->flags, 0,
                                           p->flag_count * sizeof(unsigned),
                                           (cudaStream_t)p->stream));
    }
    if (a.s.tiles == 0) { // C is empty; A's rows may not be
        return p->row_sums != nullptr ? row_sums(p, st) : GEMSOPS_OK;
    }
    const int64_t staged = sg.bytes();
    // owners' fix-ups (a split-k cluster adds its pieces in shared memory)
    const bool fixup = a.s.sk_tiles > 0 && a.s.split == 0;
    const int64_t partials =
        fixup ? a.s.ctas * (int64_t)k.partial_floats * 4 : 0;
    // Row sums: the tiles of C's first column sum all of k, unless the
    // launch is one wave of whole tiles, where every tile is on the critical
    // path, and the tiles narrower than 256, whose main loops the sums slow
    // down most: then each tile of a row sums its share, with the tiles'
    // parts after the partials and the rows' 8-byte counters after the
    // CTAs' flags. (At 256 wide, and over several waves, the count's round
    // trip in every tile costs about what spreading saves:
    // docs/performance.md.)
    const bool row_parts = k.row_sums && p->row_sums != nullptr &&
                           a.s.tiles_n > 1 && a.s.sk_tiles == 0 &&
                           a.s.dp_tiles <= a.s.ctas && k.bn < 256;
    const int64_t parts =
        row_parts ? a.s.tiles_n * a.s.tiles_m * (int64_t)k.bm * 4 : 0;
    const int64_t sk_flags = fixup ? a.s.ctas : 1;
    const int64_t counts_at = (sk_flags + 1) / 2 * 2;
    if (staged + partials + parts > 0) { // these touch the workspace, flags
        const int64_t bytes = staged + partials + parts;
        const int64_t flags =
            row_parts ? counts_at + 2 * a.s.tiles_m : sk_flags;
        // none, or too few: the caller offered its stream's kept buffers
        // before it knew the plan, and supplies larger ones on a second call
        if (p->flags == nullptr || p->workspace_bytes < bytes ||
            p->flag_count < flags) {
            need->workspace_bytes = bytes;
            need->flags = flags;
            return GEMSOPS_OK;
        }
        if (p->epoch == 0 || ws == nullptr || (uintptr_t)ws % 16 != 0 ||
            (row_parts && (uintptr_t)p->flags % 8 != 0)) {
            return gemsops_fail(st, GEMSOPS_ERR_VALUE,
                                "matmul(): workspace at %p (needs 16-byte "
                                "alignment), flags at %p (8-byte aligned "
                                "for row sums), epoch %u (needs > 0)",
                                (void *)ws, (void *)p->flags, p->epoch);
        }
    }
    if (sg.any() &&
        launch_staging(sg, f, (cudaStream_t)p->stream, st) != GEMSOPS_OK) {
        return st->code;
    }
    a.ta = k.ta;
    a.tb = k.tb;
    a.a = q.a;
    a.b = q.b;
    a.c = p->c;
    a.a_bs = q.a_bs;
    a.a_rs = q.a_rs;
    a.a_cs = q.a_cs;
    a.b_bs = q.b_bs;
    a.b_rs = q.b_rs;
    a.b_cs = q.b_cs;
    a.a_m_unit = !k.layout.a_k; // wgmma reads an M-contiguous A in place
    a.b_k_unit = k.layout.b_k;
    a.epilogue = p->bias != nullptr || p->alpha != 1.0f;
    a.bias = p->bias;
    a.bias_bs = p->bias_bs;
    a.bias_rs = p->bias_rs;
    a.bias_cs = p->bias_cs;
    a.alpha = p->alpha;
    a.beta = p->beta;
    a.row_sums = k.row_sums ? p->row_sums : nullptr;
    a.row_chunk =
        row_parts ? gemsops_sk_cdiv(a.s.iters, a.s.tiles_n) : a.s.iters;
    a.row_parts = row_parts ? reinterpret_cast<float *>(ws + staged + partials)
                            : nullptr;
    a.row_counts =
        row_parts
            ? reinterpret_cast<unsigned long long *>(p->flags + counts_at)
            : nullptr;
    // 16-byte rows of C: the staged epilogue's TMA stores (with or without
    // a bias); else, or where the driver refuses C's map, element stores
    const int64_t esize = (int64_t)gemsops_dtype_size(p->dtype);
    a.c_how = c_store::elements;
    if (p->n % (16 / esize) == 0 && (uintptr_t)p->c % 16 == 0 &&
        k.mainloop >= GEMSOPS_MAINLOOP_WGMMA_128) {
        const tma_operand oc{p->c,     p->n,        p->m, p->n,
                             p->batch, p->m * p->n, 16,   (int)esize};
        bool refused = true;
        if (tma_describes(oc) &&
            encode_operand(&a.tc, p->dtype, oc, &refused, st) != GEMSOPS_OK) {
            return st->code;
        }
        if (!refused) {
            a.c_how = c_store::tma;
        }
    }
    a.c_pairs = p->n % 2 == 0 &&
                (uintptr_t)p->c % (2 * gemsops_dtype_size(p->dtype)) == 0;
    a.partials =
        reinterpret_cast<float *>(ws == nullptr ? nullptr : ws + staged);
    a.flags = p->flags;
    a.epoch = p->epoch;
    a.spin_limit = p->spin_limit;
    a.error = p->error;
    // sm_90: a programmatic dependent of the kernel before it, whose tail
    // then hides this launch and the CTAs' set-up (the kernel waits for it
    // before touching global memory)
    GEMSOPS_CUDA_CHECK(st, k.run.launch((unsigned)a.s.ctas, k.smem,
                                        (cudaStream_t)p->stream,
                                        f.cc_major >= 9, a));
    if (p->row_sums != nullptr && !k.row_sums) {
        return row_sums(p, st);
    }
    return GEMSOPS_OK;
}

} // namespace
} // namespace gemsops

extern "C" int gemsops_matmul_plan_cuda(const struct gemsops_matmul_params *p,
                                        struct gemsops_sk_schedule *s,
                                        gemsops_mainloop *mainloop,
                                        int *staged, gemsops_status *st)
{
    gemsops::device_guard guard;
    GEMSOPS_CUDA_CHECK(st, guard.enter(p->device_id));
    gemsops::device_facts f;
    if (gemsops::get_device_facts(p->device_id, &f, st) != GEMSOPS_OK) {
        return st->code;
    }
    gemsops::skinny_plan sp;
    if (gemsops::plan_skinny(p, f, &sp, st) != GEMSOPS_OK) {
        return st->code;
    }
    if (sp.ctas > 0) {
        gemsops::skinny_schedule(p, sp, s);
        *mainloop = GEMSOPS_MAINLOOP_SKINNY;
        *staged = 0;
        return GEMSOPS_OK;
    }
    gemsops_matmul_params q = *p;
    if (q.mainloop == GEMSOPS_MAINLOOP_SKINNY) { // not for these operands
        q.mainloop = GEMSOPS_MAINLOOP_AUTO;
        p = &q;
    }
    gemsops::staging sg = gemsops::plan_staging(p, f);
    if (sg.any()) {
        sg.place(gemsops::kPlaceholder, &q);
    }
    gemsops::kernel_choice k;
    if (gemsops::plan(&q, f, !sg.any(), s, &k, st) != GEMSOPS_OK) {
        return st->code;
    }
    *mainloop = k.mainloop;
    *staged = sg.staged_mask();
    return GEMSOPS_OK;
}

extern "C" long long gemsops_tma_refusals(void)
{
    return gemsops::g_tma_refusals.load(std::memory_order_relaxed);
}

extern "C" int gemsops_matmul_cuda(const struct gemsops_matmul_params *p,
                                   struct gemsops_matmul_need *need,
                                   gemsops_status *st)
{
    return gemsops::launch(p, need, st);
}
