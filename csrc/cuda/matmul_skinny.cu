// Skinny products on CUDA: C[b] = A[b] . B[b] for m <= 16 rows, B's
// columns unit-stride (torch's row-major B), fp32 accumulation.
//
// Why kernels of their own: a tensor-core tile of 128 rows computes at
// least 112 rows of zeros here, and TF32 cannot read an N-contiguous B
// without a transposed copy of it. The product is B's bytes: k n es read
// once against 2 m k n FLOP. Each element of B is copied once and
// multiplies every row of A:
//   fp16, bf16 (matmul_skinny_mma_kernel, sm_80+): mma.sync.m16n8k16 with
//     A's rows padded to 16, B through a per-warp cp.async ring and
//     ldmatrix.trans; a strip of 64 columns a CTA;
//   fp32 (matmul_skinny_ffma_kernel): FMAs on the CUDA cores, exact (never
//     TF32), each lane V adjacent columns of B through its own slots of a
//     cp.async ring, A's rows read back as 16-byte broadcasts; 4, 8 or 16
//     rows, a strip of 32 V columns a CTA. (Halves this way cost 16 FMA
//     instructions a row of A for 8 bytes of B, and ran at a third of
//     DRAM speed, instruction-bound: docs/performance.md.)
//
// Work: a CTA of 8 warps takes one strip of C over one of `splits` ranges
// of k, its warps taking turns over k. A's rows over the range are staged
// in shared memory in chunks (zeros past m and past the range). At the end
// the 8 warps' sums meet in shared memory and are added in warp order.
// With splits > 1 each CTA writes its partial strip to the workspace and
// the last of the strip's CTAs to arrive (an epoch-tagged count,
// atomics.cuh) adds the partials in split order: C does not depend on the
// order of arrival. Splits fill one wave of the device with the strips.
//
// Bytes: B once (k n es); A once a strip (strips m k es); C once (m n es);
// with splits, the partials written and read once (2 splits m n 4).
//
// Test: python -m pytest tests/test_matmul.py -m cuda -k skinny. Time:
// python tools/mm_probe.py 8,8192,8192 16,2560,8192:tf32 (kernel time
// beside torch's).
#include <algorithm>

#include "common.cuh"
#include "matmul_epilogue.cuh"
#include "matmul_mma.cuh" // mma_op, ldmatrix
#include "matmul_skinny.cuh"

namespace gemsops {
namespace {

constexpr int kWarps = 8, kThreads = 32 * kWarps;
// A CTA's range of k is at least this many rows when k is split: shorter,
// its partial's round trip costs more than the rows it reads.
constexpr int64_t kMinSplitRows = 128;
// fp16 and bf16 take the mma kernel on their own only where it measured
// faster than the wgmma tiles (docs/performance.md, matmul): a B of at
// least 32 MB over at least 4096 columns, whose streaming outweighs the
// tiles' split-k; with less of B the split-k's fixed cost is the smaller.
// fp32 always: its tiles first copy B transposed for TF32. Where the wgmma
// tiles run, their 64 x 64 tiles beat it above 4 rows.
constexpr int64_t kMmaMinBBytes = int64_t(32) << 20;
constexpr int64_t kMmaMinCols = 4096;
constexpr int64_t kMmaMaxRowsBesideWgmma = 4;

// One launch's arguments.
struct skinny_args {
    const void *a, *b;
    void *c; // [batch, m, n], contiguous
    int64_t m, n, k;
    int64_t a_bs, a_rs, a_cs; // A: any strides
    bool a_vec; // A's rows unit-stride in aligned 16-byte chunks
    int64_t b_bs, b_rs; // B: columns unit-stride
    const void *bias; // NULL, or the addend over [batch, m, n]
    int64_t bias_bs, bias_rs, bias_cs;
    float alpha, beta;
    // CTA x: range x % splits of k, strip x / splits % strips, batch
    // x / (splits strips)
    int64_t strips, splits;
    float *partials; // splits > 1: [batch][splits][m][n]
    unsigned long long *counts; // splits > 1: [batch][strips], epoch-tagged
    unsigned epoch;
};

template <typename T, int ROWS>
struct skinny_shape {
    static constexpr int kElem = sizeof(T);
    // columns a lane: a 16-byte load, fewer where ROWS x V would pass 32
    static constexpr int V = 16 / kElem < 32 / ROWS ? 16 / kElem : 32 / ROWS;
    static constexpr int kVecBytes = V * kElem;
    static constexpr int U = 64 / kVecBytes; // k rows a lane copies a step
    static constexpr int kStep = kWarps * U; // k rows a CTA's step
    static constexpr int kCols = 32 * V;
    static constexpr int kChunk = 6144 / ROWS; // 24 KB of fp32 A
    static constexpr int kSteps = kChunk / kStep; // steps a chunk
    // the ring: kDepth steps of U rows a thread, each thread's own slots
    static constexpr int kDepth = 4;
    static constexpr int kStageBytes = U * kThreads * kVecBytes; // 16 KB
    static constexpr int kABytes = ROWS * kChunk * 4;
    static constexpr int kSmemBytes = kDepth * kStageBytes + 2 * kABytes;
    static_assert(kWarps * ROWS * kCols * 4 <= kSmemBytes,
                  "the warps' sums fit over the ring");
    static_assert(kChunk % kStep == 0, "a chunk is whole steps");
    static_assert(kDepth < kSteps, "a chunk's copies land within a chunk");
    static_assert(U % 4 == 0, "A's values read as 16-byte vectors");
};

// A's rows 0 .. ROWS - 1 over k = kc .. kc + CHUNK - 1 into dst[r * PITCH
// + k - kc]: zeros past m and at or past k1. With p.a_vec, cp.async copies
// that join the thread's next commit group; else element by element. The
// chunk may be read once those copies have landed and a CTA barrier has
// passed (the kernels copy a chunk ahead of the one they read).
template <typename T, int ROWS, int CHUNK, int PITCH>
__device__ __forceinline__ void copy_a_chunk(const skinny_args &p, const T *A,
                                             int64_t kc, int64_t k1, T *dst)
{
    if (p.a_vec) {
        constexpr int kVec = 16 / sizeof(T), kPerRow = CHUNK / kVec;
        static_assert(ROWS * kPerRow % kThreads == 0, "whole copies a thread");
#pragma unroll 1 // nothing waits on a copy: no registers for a batch
        for (int j = 0; j < ROWS * kPerRow / kThreads; j++) {
            const int i = threadIdx.x + j * kThreads;
            const int r = i / kPerRow, c = i % kPerRow;
            const int64_t k = kc + c * kVec;
            const int64_t left = r < p.m ? (k1 - k) * (int64_t)sizeof(T) : 0;
            const unsigned bytes =
                left <= 0 ? 0u : (left >= 16 ? 16u : (unsigned)left);
            cp_async_zfill<16>(smem_addr(dst + r * PITCH + c * kVec),
                               bytes > 0 ? A + r * p.a_rs + k : A, bytes);
        }
        return;
    }
#pragma unroll 4
    for (int j = 0; j < ROWS * CHUNK / kThreads; j++) {
        const int i = threadIdx.x + j * kThreads;
        const int r = i / CHUNK, kk = i % CHUNK;
        dst[r * PITCH + kk] = r < p.m && kc + kk < k1
                                  ? A[r * p.a_rs + (kc + kk) * p.a_cs]
                                  : from_acc<T>(0.f);
    }
}

// acc[r][v] += sum over the U rows u of A[r][u] B[u][v], A's rows from
// at[r * kChunk + u] (16-byte broadcasts, four rows of B at a time).
template <typename T, int ROWS>
__device__ __forceinline__ void multiply(
    const vec_t<T, skinny_shape<T, ROWS>::V> (&raw)[skinny_shape<T, ROWS>::U],
    const float *at, float (&acc)[ROWS][skinny_shape<T, ROWS>::V])
{
    using S = skinny_shape<T, ROWS>;
    constexpr int V = S::V;
#pragma unroll
    for (int u0 = 0; u0 < S::U; u0 += 4) {
        float bw[4][V];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            widen_vec<float, T, V>(raw[u0 + u], bw[u]);
        }
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            const float4 a =
                *reinterpret_cast<const float4 *>(at + r * S::kChunk + u0);
#pragma unroll
            for (int v = 0; v < V; v++) {
                float s = acc[r][v];
                s = fmaf(a.x, bw[0][v], s);
                s = fmaf(a.y, bw[1][v], s);
                s = fmaf(a.z, bw[2][v], s);
                acc[r][v] = fmaf(a.w, bw[3][v], s);
            }
        }
    }
}

// The CTA's range [k0, k1) of k into acc, in steps of kStep rows (warp w
// takes rows w U .. w U + U - 1 of each), A staged a chunk of steps at a
// time. B comes through a ring of kDepth steps in shared memory in which
// each thread has its own slots: its cp.async copies of step s + kDepth - 1
// fly while it multiplies step s, and the thread reads back only what it
// copied, so no barrier orders the ring (cp.async.wait_group does). B: the
// lane's first column, `bytes` of it inside C (0: none).
template <typename T, int ROWS>
__device__ __forceinline__ void sweep(
    const skinny_args &p, const T *A, const T *B, int64_t k0, int64_t k1,
    unsigned bytes, unsigned char *smem,
    float (&acc)[ROWS][skinny_shape<T, ROWS>::V])
{
    using S = skinny_shape<T, ROWS>;
    using W = typename raw_word<S::kVecBytes>::type;
    constexpr int V = S::V, U = S::U, kRow = kThreads * S::kVecBytes;
    static_assert(std::is_same_v<T, float>, "A staged as fp32 as it is");
    // A's chunks c alternate between two buffers: chunk c + 1 is copied
    // while chunk c is read
    float *As = reinterpret_cast<float *>(smem + S::kDepth * S::kStageBytes);
    auto a_buffer = [As](int64_t c) {
        return As + (c % 2) * (S::kABytes / 4);
    };
    unsigned char *mine = smem + threadIdx.x * S::kVecBytes;
    const int warp = threadIdx.x / 32;
    const int64_t steps = (k1 - k0 + S::kStep - 1) / S::kStep;
    // step s: rows k0 + s kStep + w U + u into slot s % kDepth (an empty
    // group past the last step keeps the count of groups in flight even)
    auto copy_step = [&](int64_t s) {
        if (s < steps) {
            const int64_t k = k0 + s * S::kStep + warp * U;
            const unsigned slot =
                smem_addr(mine + (int)(s % S::kDepth) * S::kStageBytes);
            const T *row = B + k * p.b_rs;
#pragma unroll
            for (int u = 0; u < U; u++, row += p.b_rs) {
                const bool in = k + u < k1;
                cp_async_zfill<S::kVecBytes>(slot + u * kRow, in ? row : B,
                                             in ? bytes : 0u);
            }
        }
        cp_async_commit();
    };
    // chunk 0 with step 0's copies; chunk c + 1 with step c kSteps + 1's,
    // which have landed by step (c + 1) kSteps (kDepth < kSteps)
    copy_a_chunk<T, ROWS, S::kChunk, S::kChunk>(p, A, k0, k1, a_buffer(0));
#pragma unroll
    for (int d = 0; d < S::kDepth - 1; d++) {
        copy_step(d);
    }
    for (int64_t st = 0; st < steps; st++) {
        const int in_chunk = (int)(st % S::kSteps);
        const int64_t c = st / S::kSteps;
        copy_step(st + S::kDepth - 1);
        cp_async_wait<S::kDepth - 1>(); // step st has landed
        if (in_chunk == 0) {
            // chunk c has landed for every thread; chunk c - 1 is read
            __syncthreads();
            if ((c + 1) * S::kChunk < k1 - k0) {
                copy_a_chunk<T, ROWS, S::kChunk, S::kChunk>(p, A,
                                                            k0 + (c + 1) *
                                                                     S::kChunk,
                                                            k1,
                                                            a_buffer(c + 1));
            }
        }
        const unsigned char *slot =
            mine + (int)(st % S::kDepth) * S::kStageBytes;
        vec_t<T, V> cur[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            *reinterpret_cast<W *>(&cur[u]) =
                *reinterpret_cast<const W *>(slot + u * kRow);
        }
        multiply<T, ROWS>(cur, a_buffer(c) + in_chunk * S::kStep + warp * U,
                          acc);
    }
    cp_async_wait<0>();
}

// The 8 warps' sums of a strip, red[warp][row][column] (ROWS x COLS each),
// added in warp order into C, or into the CTA's partial and, for the last
// of the strip's CTAs to arrive, the partials added in split order into C.
template <typename T, int ROWS, int COLS>
__device__ __forceinline__ void finish_strip(const skinny_args &p,
                                             const float *red, int64_t bt,
                                             int64_t strip, int64_t split,
                                             int *last)
{
    constexpr int kOut = ROWS * COLS / kThreads; // sums a thread ends
    static_assert(kOut * kThreads == ROWS * COLS, "whole sums a thread");
    const int64_t c0 = strip * COLS;
    float sum[kOut];
#pragma unroll
    for (int q = 0; q < kOut; q++) {
        const int o = threadIdx.x + q * kThreads;
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; w++) {
            s += red[w * ROWS * COLS + o];
        }
        sum[q] = s;
    }
    // output q of this thread: row o / COLS, column c0 + o % COLS
    auto row = [](int q) { return (threadIdx.x + q * kThreads) / COLS; };
    auto col = [c0](int q) {
        return c0 + (threadIdx.x + q * kThreads) % COLS;
    };
    T *C = static_cast<T *>(p.c) + bt * p.m * p.n;
    const epilogue_op<T> epi(p.bias, p.bias_bs, p.bias_rs, p.bias_cs, p.m, p.n,
                             p.alpha, p.beta, bt);
    if (p.splits == 1) {
#pragma unroll
        for (int q = 0; q < kOut; q++) {
            if (row(q) < p.m && col(q) < p.n) {
                C[row(q) * p.n + col(q)] =
                    from_acc<T>(epi.apply(sum[q], epi.addend(row(q), col(q))));
            }
        }
        return;
    }
    const int64_t plane = p.m * p.n;
    const float *parts = p.partials + bt * p.splits * plane;
    float *mine = p.partials + (bt * p.splits + split) * plane;
#pragma unroll
    for (int q = 0; q < kOut; q++) {
        if (row(q) < p.m && col(q) < p.n) {
            mine[row(q) * p.n + col(q)] = sum[q];
        }
    }
    __threadfence(); // the partial before the count
    __syncthreads();
    if (threadIdx.x == 0) {
        *last = last_to_arrive(p.counts + bt * p.strips + strip, p.epoch,
                               p.splits);
    }
    __syncthreads();
    if (!*last) {
        return;
    }
    __threadfence(); // the count before the partials it covers
#pragma unroll
    for (int q = 0; q < kOut; q++) {
        if (row(q) < p.m && col(q) < p.n) {
            const int64_t at = row(q) * p.n + col(q);
            float s = 0.f;
            for (int64_t j = 0; j < p.splits; j++) {
                s += __ldcg(parts + j * plane + at);
            }
            C[at] = from_acc<T>(epi.apply(s, epi.addend(row(q), col(q))));
        }
    }
}

// CTA x's place: its range of k [k0, k1), strip and batch.
struct skinny_cta {
    int64_t split, strip, bt, k0, k1;

    __device__ __forceinline__ explicit skinny_cta(const skinny_args &p)
    {
        const int64_t x = blockIdx.x;
        split = x % p.splits;
        strip = x / p.splits % p.strips;
        bt = x / p.splits / p.strips;
        k0 = bound(p, split);
        k1 = bound(p, split + 1);
    }
    // where range j starts: a multiple of 16 rows (A's chunks start on
    // 16-byte boundaries), range `splits` at k (each range keeps at least
    // kMinSplitRows - 15 rows)
    static __device__ __forceinline__ int64_t bound(const skinny_args &p,
                                                    int64_t j)
    {
        return j == p.splits ? p.k : j * p.k / p.splits / 16 * 16;
    }
};

// fp32: the CUDA cores (exact).
template <typename T, int ROWS>
__global__ void __launch_bounds__(kThreads, 2)
    matmul_skinny_ffma_kernel(const __grid_constant__ skinny_args p)
{
    using S = skinny_shape<T, ROWS>;
    constexpr int V = S::V;
    extern __shared__ float4 dynamic_smem[];
    unsigned char *smem = reinterpret_cast<unsigned char *>(dynamic_smem);
    float *red = reinterpret_cast<float *>(dynamic_smem);
    __shared__ int last;
    const skinny_cta x(p);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int64_t col = x.strip * S::kCols + lane * V;
    const int valid = (int)(p.n - col < V ? (p.n > col ? p.n - col : 0) : V);
    const T *A = static_cast<const T *>(p.a) + x.bt * p.a_bs;
    const T *B =
        static_cast<const T *>(p.b) + x.bt * p.b_bs + (valid > 0 ? col : 0);
    float acc[ROWS][V];
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
#pragma unroll
        for (int v = 0; v < V; v++) {
            acc[r][v] = 0.f;
        }
    }
    pdl_wait_primary();
    sweep<T, ROWS>(p, A, B, x.k0, x.k1, (unsigned)(valid * S::kElem), smem,
                   acc);
    __syncthreads(); // the ring and A's chunk are free: the warps' sums
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        float *to = red + (warp * ROWS + r) * S::kCols + lane * V;
#pragma unroll
        for (int v = 0; v < V; v += 2) {
            *reinterpret_cast<float2 *>(to + v) =
                make_float2(acc[r][v], acc[r][v + 1]);
        }
    }
    __syncthreads();
    finish_strip<T, ROWS, S::kCols>(p, red, x.bt, x.strip, x.split, &last);
}

// ---- fp16 and bf16: mma.sync on 16 rows ----------------------------------
// A strip of 64 columns (8 n8 tiles) a CTA; each warp takes k-steps of 16
// rows in turn (step j of round r: r kWarps + warp), copies its steps of B
// (16 rows x 128 bytes, 16-byte chunks XOR-swizzled by row) into its own
// ring of kDepth steps, and for each step feeds one ldmatrix.x4 of A (m
// padded to 16 with zeros) and four ldmatrix.x4.trans of B to eight
// mma.sync.m16n8k16 (fp32 accumulators). An FMA a B element on the CUDA
// cores would cost 16 instructions a row of A; this costs 1/64 of an mma.
struct skinny_mma_shape {
    static constexpr int kRows = 16, kCols = 64, kStepRows = 16;
    static constexpr int kDepth = 4; // B steps in a warp's ring
    static constexpr int kStageBytes = kStepRows * kCols * 2; // 2 KB
    static constexpr int kRingBytes = kWarps * kDepth * kStageBytes;
    static constexpr int kChunk = 640; // k of A a chunk (two buffers)
    // A's row pitch (elements): rows 16 bytes apart in the banks, so the 8
    // rows one ldmatrix reads hit distinct banks
    static constexpr int kAPitch = kChunk + 8;
    static constexpr int kABytes = kRows * kAPitch * 2;
    static constexpr int kSmemBytes = kRingBytes + 2 * kABytes;
    static constexpr int kRounds = kChunk / (kWarps * kStepRows); // a chunk
    static_assert(kDepth < kRounds, "a chunk's copies land within a chunk");
    static_assert(kWarps * kRows * kCols * 4 <= kSmemBytes,
                  "the warps' sums fit over the ring");
};

template <typename T>
__global__ void __launch_bounds__(kThreads, 2)
    matmul_skinny_mma_kernel(const __grid_constant__ skinny_args p)
{
    using S = skinny_mma_shape;
    extern __shared__ float4 dynamic_smem[];
    unsigned char *smem = reinterpret_cast<unsigned char *>(dynamic_smem);
    float *red = reinterpret_cast<float *>(dynamic_smem);
    // A's chunks c alternate between two buffers: chunk c + 1 is copied
    // while chunk c is read
    T *As = reinterpret_cast<T *>(smem + S::kRingBytes);
    auto a_buffer = [As](int64_t c) {
        return As + (c % 2) * (S::kABytes / 2);
    };
    __shared__ int last;
    const skinny_cta x(p);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int64_t c0 = x.strip * S::kCols;
    const T *A = static_cast<const T *>(p.a) + x.bt * p.a_bs;
    const T *B = static_cast<const T *>(p.b) + x.bt * p.b_bs + c0;
    // this lane's chunks of a step: rows lane / 8 + 4 j, chunk lane % 8,
    // `bytes` of it inside C
    const int ch = lane % 8;
    const int64_t left = (p.n - c0 - 8 * ch) * 2;
    const unsigned bytes = (unsigned)(left < 0 ? 0 : (left > 16 ? 16 : left));
    const unsigned ring = smem_addr(smem + warp * S::kDepth * S::kStageBytes);
    const int a_lane = ((lane % 16) * S::kAPitch + (lane / 16) * 8) * 2;
    const int64_t rounds =
        (x.k1 - x.k0 + kWarps * S::kStepRows - 1) / (kWarps * S::kStepRows);
    // round r's step into slot r % kDepth (an empty group past the last
    // keeps the count of groups in flight even)
    auto copy_round = [&](int64_t r) {
        if (r < rounds) {
            const int64_t k = x.k0 + (r * kWarps + warp) * S::kStepRows;
            const unsigned slot = ring + (int)(r % S::kDepth) * S::kStageBytes;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int row = lane / 8 + 4 * j;
                const bool in = k + row < x.k1;
                cp_async_zfill<16>(slot + row * 128 + ((ch ^ (row % 8)) << 4),
                                   in ? B + (k + row) * p.b_rs + 8 * ch : B,
                                   in ? bytes : 0u);
            }
        }
        cp_async_commit();
    };
    float acc[8][4];
#pragma unroll
    for (int t = 0; t < 8; t++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            acc[t][e] = 0.f;
        }
    }
    pdl_wait_primary();
    // chunk 0 with round 0's copies; chunk c + 1 with round c kRounds +
    // 1's, which have landed by round (c + 1) kRounds (kDepth < kRounds)
    copy_a_chunk<T, S::kRows, S::kChunk, S::kAPitch>(p, A, x.k0, x.k1,
                                                     a_buffer(0));
#pragma unroll
    for (int d = 0; d < S::kDepth - 1; d++) {
        copy_round(d);
    }
    for (int64_t r = 0; r < rounds; r++) {
        const int in_chunk = (int)(r % S::kRounds);
        const int64_t c = r / S::kRounds;
        __syncwarp(); // the warp has read the slot it refills now
        copy_round(r + S::kDepth - 1);
        cp_async_wait<S::kDepth - 1>();
        __syncwarp(); // every lane's copies of this step have landed
        if (in_chunk == 0) {
            // chunk c has landed for every thread; chunk c - 1 is read
            __syncthreads();
            if ((c + 1) * S::kChunk < x.k1 - x.k0) {
                copy_a_chunk<T, S::kRows, S::kChunk,
                             S::kAPitch>(p, A, x.k0 + (c + 1) * S::kChunk,
                                         x.k1, a_buffer(c + 1));
            }
        }
        const unsigned slot = ring + (int)(r % S::kDepth) * S::kStageBytes;
        unsigned af[4];
        ldmatrix_x4(af, smem_addr(a_buffer(c)) + a_lane +
                            (in_chunk * kWarps + warp) * S::kStepRows * 2);
#pragma unroll
        for (int t = 0; t < 4; t++) { // n8 tiles 2t and 2t + 1
            const int kr = lane % 8 + ((lane / 8) % 2) * 8;
            const int c = 2 * t + lane / 16;
            unsigned q[4];
            ldmatrix_x4_trans(q, slot + kr * 128 + ((c ^ (kr % 8)) << 4));
            mma_op<T>::run(acc[2 * t], af, q[0], q[1]);
            mma_op<T>::run(acc[2 * t + 1], af, q[2], q[3]);
        }
    }
    cp_async_wait<0>();
    __syncthreads(); // the ring and A's chunk are free: the warps' sums
    // accumulator e of tile t: row lane / 4 + 8 (e / 2), column
    // 8 t + 2 (lane % 4) + e % 2
    float *mine = red + warp * S::kRows * S::kCols;
#pragma unroll
    for (int t = 0; t < 8; t++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            *reinterpret_cast<float2 *>(mine + (lane / 4 + 8 * h) * S::kCols +
                                        8 * t + 2 * (lane % 4)) =
                make_float2(acc[t][2 * h], acc[t][2 * h + 1]);
        }
    }
    __syncthreads();
    finish_strip<T, S::kRows, S::kCols>(p, red, x.bt, x.strip, x.split, &last);
}

// A kernel of the family and what planning needs of it: rows of C it
// holds, columns a strip, k of A a chunk, B's elements a vector (its
// alignment), dynamic shared memory.
struct skinny_kernel {
    const void *fn;
    int rows, cols, chunk, vec, smem;
    cudaError_t (*launch)(unsigned grid, cudaStream_t s, bool pdl,
                          const skinny_args &a);
};

template <typename K, int SMEM>
cudaError_t launch_with(K kernel, unsigned grid, cudaStream_t s, bool pdl,
                        const skinny_args &a)
{
    return launch_dependent_smem(kernel, dim3(grid), dim3(kThreads),
                                 (size_t)SMEM, s, pdl, a);
}

template <int ROWS>
skinny_kernel ffma_kernel()
{
    using S = skinny_shape<float, ROWS>;
    return {(const void *)matmul_skinny_ffma_kernel<float, ROWS>,
            ROWS,
            S::kCols,
            S::kChunk,
            S::V,
            S::kSmemBytes,
            [](unsigned grid, cudaStream_t s, bool pdl, const skinny_args &a) {
                return launch_with<
                    decltype(&matmul_skinny_ffma_kernel<float, ROWS>),
                    S::kSmemBytes>(matmul_skinny_ffma_kernel<float, ROWS>,
                                   grid, s, pdl, a);
            }};
}

template <typename T>
skinny_kernel mma_kernel()
{
    using S = skinny_mma_shape;
    return {(const void *)matmul_skinny_mma_kernel<T>,
            S::kRows,
            S::kCols,
            S::kChunk,
            8,
            S::kSmemBytes,
            [](unsigned grid, cudaStream_t s, bool pdl, const skinny_args &a) {
                return launch_with<decltype(&matmul_skinny_mma_kernel<T>),
                                   S::kSmemBytes>(matmul_skinny_mma_kernel<T>,
                                                  grid, s, pdl, a);
            }};
}

// The one dtype switch; false: no skinny kernel for this dtype or device
// (mma.sync: sm_80 and later).
bool kernel_for(gemsops_dtype dtype, int64_t m, const device_facts &f,
                skinny_kernel *k)
{
    switch (dtype) {
    case GEMSOPS_FLOAT32:
        *k = m <= 4 ? ffma_kernel<4>()
                    : (m <= 8 ? ffma_kernel<8>() : ffma_kernel<16>());
        return true;
    case GEMSOPS_FLOAT16: *k = mma_kernel<__half>(); return f.cc_major >= 8;
    case GEMSOPS_BFLOAT16:
        *k = mma_kernel<__nv_bfloat16>();
        return f.cc_major >= 8;
    default: return false;
    }
}

// B's rows, columns and batches in whole aligned vectors of `vec` elements
bool b_in_vectors(const gemsops_matmul_params *p, int vec)
{
    const int64_t es = (int64_t)gemsops_dtype_size(p->dtype);
    return p->b_cs == 1 && (uintptr_t)p->b % (uintptr_t)(vec * es) == 0 &&
           (p->k == 1 || p->b_rs % vec == 0) &&
           (p->batch == 1 || p->b_bs % vec == 0);
}

// A's rows unit-stride in aligned 16-byte chunks (copy_a_chunk's cp.async)
bool a_in_vectors(const gemsops_matmul_params *p)
{
    const int64_t vec = 16 / (int64_t)gemsops_dtype_size(p->dtype);
    return p->a_cs == 1 && (uintptr_t)p->a % 16 == 0 &&
           (p->m == 1 || p->a_rs % vec == 0) &&
           (p->batch == 1 || p->a_bs % vec == 0);
}

} // namespace

int plan_skinny(const gemsops_matmul_params *p, const device_facts &f,
                skinny_plan *sp, gemsops_status *st)
{
    *sp = skinny_plan{};
    skinny_kernel k;
    const bool asked = p->mainloop == GEMSOPS_MAINLOOP_SKINNY;
    const bool exact = p->dtype == GEMSOPS_FLOAT32; // the FFMA kernel
    // fp32 under auto or the ffma cap (the kernel is exact FFMA), any
    // type when asked for by name; the grid and schedule left automatic
    if (!(asked || p->mainloop == GEMSOPS_MAINLOOP_AUTO ||
          (exact && p->mainloop == GEMSOPS_MAINLOOP_FFMA)) ||
        p->mode != GEMSOPS_SK_AUTO || p->ctas_override > 0 ||
        p->row_sums != nullptr || p->m < 1 || p->m > 16 || p->n < 1 ||
        p->k < 1 || p->batch < 1 || !kernel_for(p->dtype, p->m, f, &k) ||
        !b_in_vectors(p, k.vec)) {
        return GEMSOPS_OK;
    }
    const int64_t b_bytes =
        p->k * p->n * (int64_t)gemsops_dtype_size(p->dtype);
    if (!exact && !asked &&
        (b_bytes < kMmaMinBBytes || p->n < kMmaMinCols ||
         (p->m > kMmaMaxRowsBesideWgmma && wgmma_runs(f)))) {
        return GEMSOPS_OK;
    }
    int resident = 1;
    // (which also raises the kernel's shared-memory limit for its launch)
    if (resident_ctas(k.fn, p->device_id, kThreads, k.smem, &resident, st) !=
        GEMSOPS_OK) {
        return st->code;
    }
    const int64_t strips = gemsops_sk_cdiv(p->n, k.cols);
    const int64_t units = p->batch * strips;
    // one wave: k cut so that the strips fill the device, each range at
    // least kMinSplitRows long
    int64_t splits = 1;
    if (units < resident) {
        splits = std::max<int64_t>(1, std::min<int64_t>(resident / units,
                                                        p->k / kMinSplitRows));
    }
    if (units > INT32_MAX / splits) {
        return GEMSOPS_OK;
    }
    sp->rows = k.rows;
    sp->cols = k.cols;
    sp->k_chunk = k.chunk;
    sp->strips = strips;
    sp->splits = splits;
    sp->ctas = units * splits;
    if (splits > 1) {
        sp->workspace_bytes = p->batch * splits * p->m * p->n * 4;
        sp->flags = 2 * units;
    }
    return GEMSOPS_OK;
}

int launch_skinny(const gemsops_matmul_params *p, const device_facts &f,
                  const skinny_plan &sp, gemsops_matmul_need *need,
                  gemsops_status *st)
{
    need->workspace_bytes = need->flags = 0;
    skinny_kernel k;
    if (!kernel_for(p->dtype, p->m, f, &k)) {
        return gemsops_fail(st, GEMSOPS_ERR_TYPE,
                            "matmul: unsupported dtype %s on CUDA",
                            gemsops_dtype_name(p->dtype));
    }
    skinny_args a{};
    if (sp.splits > 1) {
        if (p->flags == nullptr || p->workspace_bytes < sp.workspace_bytes ||
            p->flag_count < sp.flags) {
            need->workspace_bytes = sp.workspace_bytes;
            need->flags = sp.flags;
            return GEMSOPS_OK;
        }
        if (p->epoch == 0 || p->workspace == nullptr ||
            (uintptr_t)p->workspace % 16 != 0 ||
            (uintptr_t)p->flags % 8 != 0) {
            return gemsops_fail(st, GEMSOPS_ERR_VALUE,
                                "matmul(): workspace at %p (needs 16-byte "
                                "alignment), flags at %p (needs 8-byte "
                                "alignment), epoch %u (needs > 0)",
                                p->workspace, (void *)p->flags, p->epoch);
        }
        // flags the boundary cannot vouch for may hold this epoch already
        if (!p->flags_known) {
            GEMSOPS_CUDA_CHECK(st, cudaMemsetAsync(p->flags, 0,
                                                   p->flag_count *
                                                       sizeof(unsigned),
                                                   (cudaStream_t)p->stream));
        }
        a.partials = static_cast<float *>(p->workspace);
        a.counts = reinterpret_cast<unsigned long long *>(p->flags);
        a.epoch = p->epoch;
    }
    a.a = p->a;
    a.b = p->b;
    a.c = p->c;
    a.m = p->m;
    a.n = p->n;
    a.k = p->k;
    a.a_bs = p->a_bs;
    a.a_rs = p->a_rs;
    a.a_cs = p->a_cs;
    a.a_vec = a_in_vectors(p);
    a.b_bs = p->b_bs;
    a.b_rs = p->b_rs;
    a.bias = p->bias;
    a.bias_bs = p->bias_bs;
    a.bias_rs = p->bias_rs;
    a.bias_cs = p->bias_cs;
    a.alpha = p->alpha;
    a.beta = p->beta;
    a.strips = sp.strips;
    a.splits = sp.splits;
    GEMSOPS_CUDA_CHECK(st, k.launch((unsigned)sp.ctas, (cudaStream_t)p->stream,
                                    f.cc_major >= 9, a));
    return GEMSOPS_OK;
}

void skinny_schedule(const gemsops_matmul_params *p, const skinny_plan &sp,
                     gemsops_sk_schedule *s)
{
    *s = gemsops_sk_schedule{};
    s->m = p->m;
    s->n = p->n;
    s->k = p->k;
    s->batch = p->batch;
    s->bm = sp.rows;
    s->bn = sp.cols;
    s->bk = sp.k_chunk;
    s->group_m = 1;
    s->tiles_m = 1;
    s->tiles_n = sp.strips;
    s->tiles = p->batch * sp.strips;
    s->iters = gemsops_sk_cdiv(p->k, sp.k_chunk);
    s->ctas = sp.ctas;
    s->split = sp.splits > 1 ? sp.splits : 0;
    s->sk_ctas = sp.splits > 1 ? sp.ctas : 0;
    s->dp_tiles = sp.splits > 1 ? 0 : s->tiles;
}

} // namespace gemsops
