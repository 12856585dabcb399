// The driver's arguments, and the mainloops as the driver sees them
// (matmul_driver.cuh walks the schedule over one of them): the exact FFMA
// mainloop, written here, and the tensor-core ones (mma.sync,
// matmul_mma.cuh; wgmma, matmul_wgmma.cuh) behind one adapter.
//
// What the driver asks of a mainloop L: its tile (BM x BN, k-steps of BK),
// kAcc accumulators a thread (kRowAcc more for A's row sums) and their
// places (coords), begin / mac / drain over its ring, and a store of its
// own (true) where it stages C through shared memory. A warp-specialized
// one also runs a producer (produce) beside the kConsumers threads that
// run the driver.
//
// Included by matmul_streamk.cu alone (one translation unit holds every
// matmul kernel and its launcher).
#pragma once

#include "common.cuh"
#include "gemsops/streamk.h"
#include "matmul_epilogue.cuh"
#include "matmul_mma.cuh"
#include "matmul_wgmma.cuh"

namespace gemsops {
namespace {

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
// 128 x 128 tiles, k-steps of 8, 256 threads of 8 x 8 outputs: thread (ty,
// tx) of a 16 x 16 grid owns rows ty*4..+3 and 64+ty*4..+3 and the same
// columns of tx, so each k reads two float4 of A and two of B from shared
// memory for 64 FMAs (a warp's B reads are 16 neighbouring float4, its A
// reads two broadcasts). A k-step is 512 FMAs a thread against 8 global
// loads, 8 shared stores and 32 16-byte shared loads. Operands take any
// strides and any alignment: each element one bounds-checked load,
// consecutive threads along the operand's unit stride; the next step's
// loads are in flight (registers) while this step computes, and the two
// shared-memory stages need one barrier a step.
template <typename T>
struct ffma_mainloop {
    // one CTA an SM: at two (128 registers) the Stream-K walk spilled,
    // and the planner's schedules are those of one persistent CTA an SM
    static constexpr int BM = 128, BN = 128, BK = 8, kAcc = 64, kMinCtas = 1;
    static constexpr int kRowAcc = 0;
    static constexpr int kThreads = 256, kConsumers = kThreads;
    static constexpr bool kWarpSpecialized = false, kStreamK = true;
    static constexpr bool kSplitK = false; // no cluster kernel
    // a thread's loads of each operand a k-step
    static constexpr int kLoads = BM * BK / kThreads;
    static_assert(BM == BN && BM * BK % kThreads == 0, "the load map");
    struct smem_t {
        // [stage][k][m or n]; rows of 132 floats keep the float4 reads
        // aligned and a K-contiguous operand's stores on distinct banks
        alignas(16) float a[2][BK][BM + 4];
        alignas(16) float b[2][BK][BN + 4];
    };
    static constexpr int kSmemBytes = sizeof(smem_t);
    struct ring_t {}; // the stages live within mac()

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

    // (row or column, k) of load e of this thread in a step's panel:
    // consecutive threads along the unit stride, k-major or not
    static __device__ __forceinline__ void load_place(bool k_unit, int e,
                                                      int &i, int &q)
    {
        const int idx = (int)threadIdx.x + e * kThreads;
        i = k_unit ? idx / BK : idx % BM;
        q = k_unit ? idx % BK : idx / BM;
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
        const bool a_k_unit = p.a_cs == 1, b_k_unit = p.b_cs != 1;
        float ra[kLoads], rb[kLoads];
        const auto fetch = [&](int64_t kt) {
            const int64_t kb = kt * BK;
#pragma unroll
            for (int e = 0; e < kLoads; e++) {
                int i, q;
                load_place(a_k_unit, e, i, q);
                const int64_t gr = r0 + i, gk = kb + q;
                ra[e] = gr < p.s.m && gk < p.s.k
                            ? to_acc<float>(A[gr * p.a_rs + gk * p.a_cs])
                            : 0.f;
                load_place(b_k_unit, e, i, q);
                const int64_t gc = c0 + i, gk2 = kb + q;
                rb[e] = gc < p.s.n && gk2 < p.s.k
                            ? to_acc<float>(B[gk2 * p.b_rs + gc * p.b_cs])
                            : 0.f;
            }
        };
        const auto stash = [&](int st) {
#pragma unroll
            for (int e = 0; e < kLoads; e++) {
                int i, q;
                load_place(a_k_unit, e, i, q);
                sm.a[st][q][i] = ra[e];
                load_place(b_k_unit, e, i, q);
                sm.b[st][q][i] = rb[e];
            }
        };
        if (k0 >= k1) {
            return;
        }
        fetch(k0);
        stash(0);
        __syncthreads();
        int st = 0;
        for (int64_t kt = k0; kt < k1; kt++) {
            const bool more = kt + 1 < k1;
            if (more) {
                fetch(kt + 1); // in flight while this step computes
            }
#pragma unroll
            for (int q = 0; q < BK; q++) {
                const float4 a0 =
                    *reinterpret_cast<const float4 *>(&sm.a[st][q][ty * 4]);
                const float4 a1 = *reinterpret_cast<const float4 *>(
                    &sm.a[st][q][64 + ty * 4]);
                const float4 b0 =
                    *reinterpret_cast<const float4 *>(&sm.b[st][q][tx * 4]);
                const float4 b1 = *reinterpret_cast<const float4 *>(
                    &sm.b[st][q][64 + tx * 4]);
                const float a[8] = {a0.x, a0.y, a0.z, a0.w,
                                    a1.x, a1.y, a1.z, a1.w};
                const float b[8] = {b0.x, b0.y, b0.z, b0.w,
                                    b1.x, b1.y, b1.z, b1.w};
#pragma unroll
                for (int i = 0; i < 8; i++) {
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        acc[i * 8 + j] = fmaf(a[i], b[j], acc[i * 8 + j]);
                    }
                }
            }
            if (more) {
                // the other stage: every thread read it before the last
                // barrier
                stash(st ^ 1);
            }
            __syncthreads();
            st ^= 1;
        }
    }

    // acc[i * 8 + j]: row i (0..3: ty*4 + i; 4..7: 64 + ty*4 + i - 4),
    // column j likewise of tx
    static __device__ __forceinline__ void coords(int e, int &r, int &c)
    {
        const int i = e / 8, j = e % 8;
        r = (i / 4) * 64 + (threadIdx.x / 16) * 4 + i % 4;
        c = (j / 4) * 64 + (threadIdx.x % 16) * 4 + j % 4;
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
            if constexpr (M::kTransposedC) { // (the planner: no epilogue)
                M::store_transposed(C, &p.tc, (int)bt, p.s.m, p.s.n, tm * BM,
                                    tn * BN, acc, sm, p.c_how);
            }
            else if (p.epilogue && p.bias != nullptr && p.bias_rs == 0) {
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
    return bm == 64    ? (bn == 64 ? 12 : 8)
           : bm == 192 ? 4
           : bn == 64  ? 8
           : bn == 80  ? 7
           : bn <= 128 ? 6
           : bn <= 192 ? 5
                       : 4;
}
template <typename T, int BN, bool AM, bool BNM, bool ROWS = false,
          int BM = 128, int TEAMS = 1>
using wgmma_tc = tc_mainloop<
    wgmma_mainloop<T, BN, wgmma_stages(BM, BN), AM, BNM, ROWS, BM, TEAMS>, 1>;
// The swapped product's (C transposed): BM columns x BN rows of C, B' = A^T
// K-major
template <typename T, int BN, bool AM, int BM = 128>
using wgmma_tc_transposed = tc_mainloop<
    wgmma_mainloop<T, BN, wgmma_stages(BM, BN), AM, false, false, BM, 1, true>,
    1>;

} // namespace
} // namespace gemsops
