// LayerNorm backward, fused: dx for every row and dW/dB in ONE kernel.
//
//   xhat = (x - mean) * rstd,  g = w * dy
//   dx = rstd * (g - (xhat * c1 + c2) / N),  c1 = sum g*xhat, c2 = sum g
//   dW[c] = sum_rows dy * xhat,  dB[c] = sum_rows dy
//
// Work split: as in the forward (layer_norm_plan.cuh), TPR threads own a row
// (or a slab of it), E elements each (8; 16 for fp16/bf16 where that pads
// no more columns, see bwd_wide; 4 in fp64). A thread always owns the same
// columns, so while the CTA walks its rows in a grid-stride loop it keeps
// dW/dB partial sums for those columns in fp32 registers. At the end the
// CTA sums its row groups' partials in shared memory and issues one
// atomicAdd per column per CTA (dW and dB) into fp32 accumulators: the
// classic second kernel that re-reads x and dy for dW/dB disappears.
// Same-address atomics serialise, so the accumulators come in stripes (row
// group g adds into stripe g % S, ~16 groups per stripe); a tiny
// column-parallel kernel sums the S stripes and rounds to the parameters'
// dtype (2 * N * S fp32 reads, not a pass over x or dy); on sm_90 it is a
// programmatic dependent launch, so its launch overlaps the atomics.
//
// Feeding the loop: a persistent CTA computes one row while the next rows
// are on their way. Each thread copies ITS OWN x, dy, mean and rstd for the
// rows `stages - 1` steps ahead into a private slice of a shared-memory
// ring with cp.async, and reads them back when their turn comes. No other
// thread touches that slice, so cp.async.wait_group alone orders it: the
// ring costs no barrier and no registers, and keeps (stages - 1) * 2 * E
// elements per thread in flight however long the row reductions take.
// The copies go through L1 (cp.async.ca): with .cg, L2 served each sector
// twice, once per 16-byte copy, and was as busy as DRAM (H100, same-run
// A/B, graph replays: 16384 x 4096 bf16 162.6 -> 154.8 us, 8192 x 8192
// fp16 160.5 -> 152.9, 16384 x 4096 fp32 302.3 -> 288.5).
// (Unaligned or odd-width inputs load directly from global memory.) The
// thread's weights sit in its own shared-memory slice after the ring, read
// from there in both passes.
//
// Deterministic mode: each row group stores its partials to
// workspace[group][2N] instead (no atomics), and the same small kernel sums
// them in a fixed order, so repeated runs are bitwise identical.
//
// Rows longer than one CTA's threads hold (8192 elements; 4096 in fp64)
// are split over co-resident CTAs (slabs of 512 threads, two a SM; see
// launch()) that exchange their (c1, c2) partials through global memory
// (split_publish / split_collect): x and dy are still read once. This
// is the long-row path; there is no re-read. Its kernel (LAG) finishes
// each row one step late: step k publishes row k's partials and then
// finishes row k - 1 from its ring stage, so the other slabs' partials
// arrive while row k's first pass runs instead of stalling the CTA every
// row (H100, same-run A/B/A, graph replays: 256 x 262144 bf16 271 -> 201
// us, fp32 441 -> 367; 1024 x 65536 bf16 286 -> 226; 4096 x 12288 bf16
// 171 -> 151). Warp 0 reads the held row's exchange slots at the top of
// the step and uses them after the first pass, so the collect rarely
// waits for an L2 round trip of its own (256 x 262144 bf16 183.7 ->
// 173.9 us, fp32 360.4 -> 353.9; 1024 x 65536 bf16 201.0 -> 169.9, fp32
// 377.6 -> 352.7, both at 1024-thread slabs then; 4096 x 12288 bf16
// 144.4 -> 135.5, but fp32 229.1 -> 236.0).
//
// Bytes: read x and dy once, write dx once (3 * N * sizeof(T) per row);
// mean/rstd per row; dW/dB: 2 * N atomics per CTA (grid ~ #SMs * occupancy).
#include "layer_norm_plan.cuh"
#include "gemsops/layer_norm.h"

namespace gemsops {
namespace {

// Elements per thread: x, dy and the dW/dB accumulators all live in
// registers. Each CTA adds 2 * cols atomics; owning at least this many rows
// keeps them a small fraction of the 3 * cols * rows elements moved.
constexpr int64_t kMinRowsPerCta = 8;

// Elements a thread owns per row: 8 (4 for fp64), and 16 for the half
// types where that pads no more columns (bwd_wide): the row reductions,
// barriers and ring bookkeeping are per row and thread, so twice the
// elements halve their share (H100, same-run A/B/A, graph replays:
// 16384 x 4096 bf16 167.0 -> 163.2 us, 8192 x 8192 162.6 -> 160.8,
// 2048 x 16384 131.9 -> 122.7, 1024 x 65536 300.9 -> 284.2; at 16 short
// rows were slower: 200000 x 64 42.7 -> 46.9, 4096 x 768 19.2 -> 19.9).
template <typename T> __host__ __device__ constexpr int bwd_base_elems() { return sizeof(T) == 8 ? 4 : 8; }

// Resident threads per SM the registers and the ring are planned for:
// 1024 at 8 elements (64 registers), 512 at 16 (x, dy and the fp32 dW/dB
// accumulators take twice the registers) and for fp64.
template <typename T, int E> __host__ __device__ constexpr int bwd_sm_threads()
{
    return sizeof(T) == 8 || E > 8 ? 512 : 1024;
}

// The ring feeds 16-byte accesses only; one stage holds each thread's x
// and dy vectors, then the rows' mean and rstd.
template <typename T, int VEC> __host__ __device__ constexpr bool bwd_ring() { return VEC * sizeof(T) == 16; }
constexpr int kMaxStages = 4;

// One lane per row and warp copies the row's mean and rstd and hands them
// to the others with a shuffle: 32 lanes copying the same 4 bytes are 32
// requests where one will do (ncu, H100: the kernel made 3x the shared
// wavefronts its data needs). A stage keeps one (mean, rstd) slot per
// such lane, not per thread: at 1024 threads in fp32, 256 bytes instead
// of 8 KB, which L1 keeps (2048 x 16384 fp32 at 1024 threads a slab, two
// stages: 178.9 -> 170.1 us; H100, same-run A/B/A, graph replays).
__host__ __device__ constexpr int bwd_stat_lanes(int tpr) { return tpr < 32 ? tpr : 32; }

// Rounded up to 128 bytes: the next stage and the weights after the ring
// stay aligned for their vector accesses.
template <typename T, int VEC, int E>
__host__ __device__ constexpr int bwd_stage_bytes(int block, int tpr)
{
    return bwd_ring<T, VEC>()
               ? (block * 2 * (E / VEC) * 16 +
                  2 * (block / bwd_stat_lanes(tpr)) * (int)sizeof(acc_t<T>) +
                  127) / 128 * 128
               : 0;
}

template <typename T, typename P> struct bwd_args {
    const T *dy;
    const T *x;
    const P *w;
    const acc_t<T> *mean;
    const acc_t<T> *rstd;
    T *dx;               // NULL: no dx wanted
    P *dw;               // outputs, NULL when not wanted
    P *db;
    acc_t<T> *stripes;   // atomics: [n_stripes][2 * cols] (dW then dB)
    int n_stripes;       // row group g adds into stripe g % n_stripes
    acc_t<T> *partials;  // deterministic: [groups][2 * cols]
    acc_t<T> *exchange;  // split > 1: [rows][split][2], zero at launch
    int64_t rows, cols, dy_stride, x_stride, dx_stride;
    int split;
    int stages;          // ring depth, 1..kMaxStages (ring kernels only)
    bool deterministic;
};

// CTAs per SM the register budget of bwd_sm_threads asks for (1024
// threads: 64 registers, the most the ring's shared memory allows for
// 512-thread CTAs anyway; fp64, not a bandwidth target, gets 512 so that
// it does not spill). The ring is planned for the same count.
__host__ __device__ constexpr int bwd_min_ctas(int tpr, int threads)
{
    const int block = tpr < 128 ? 128 : tpr;
    return block >= threads ? 1 : threads / block;
}

// wait_group takes an immediate: one branch per ring depth.
__device__ __forceinline__ void ring_wait(int pending)
{
    switch (pending) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    default: cp_async_wait<kMaxStages - 1>(); break;
    }
}

template <typename T, typename P, int TPR, int VEC, int E, bool LAG>
__global__ void __launch_bounds__(TPR < 128 ? 128 : TPR, bwd_min_ctas(TPR, bwd_sm_threads<T, E>()))
    layer_norm_bwd_fused_atomic(const bwd_args<T, P> a)
{
    using A = acc_t<T>;
    using V = vec_t<T, VEC>;
    constexpr int ITEMS = E / VEC;
    constexpr int BLOCK = TPR < 128 ? 128 : TPR;
    constexpr int ROWS_PER_CTA = BLOCK / TPR;
    constexpr bool RING = bwd_ring<T, VEC>();
    constexpr int SLAB = TPR * E;
    constexpr int STEP = TPR * VEC;
    // ring stage s: [x items][dy items] as [ITEMS][BLOCK] vectors (a
    // thread uses column threadIdx.x only), then [mean][rstd] as
    // [BLOCK / bwd_stat_lanes] each.
    extern __shared__ uint4 ring_words[];
    __shared__ A red[2 * 32 * 2];
    __shared__ A merged[2 * 2];
    __shared__ A colsum[ROWS_PER_CTA > 1 ? ROWS_PER_CTA * SLAB : 1];
    int parity = 0;

    const int lane = threadIdx.x % TPR;
    const int sub = threadIdx.x / TPR;
    const int slab = blockIdx.x % a.split;
    const int64_t group = blockIdx.x / a.split;
    const int64_t groups = gridDim.x / a.split;
    const int64_t slab0 = (int64_t)slab * SLAB;
    const int64_t col0 = slab0 + lane * VEC;
    const int64_t col_end = min(slab0 + SLAB, a.cols);
    const int lim = (int)(col_end - col0); // item i valid: i * STEP < lim
    const bool want_dwb = a.dw || a.db;
    const A inv_n = A(1) / (A)a.cols;

    // Row of step k for this thread; every thread of the CTA runs the same
    // number of steps (the row reductions have barriers).
    const int64_t step_rows = groups * ROWS_PER_CTA;
    const int64_t first_row = group * ROWS_PER_CTA + sub;
    const int64_t cta_first = group * ROWS_PER_CTA;
    const int64_t steps =
        cta_first < a.rows ? (a.rows - cta_first + step_rows - 1) / step_rows
                           : 0;

    // Ring cursors: the next row to copy and its stage, and the stage to
    // read (stage indices wrap by comparison: a 64-bit modulo per row cost
    // more than the rest of the step).
    constexpr int STAGE_BYTES = bwd_stage_bytes<T, VEC, E>(BLOCK, TPR);
    int64_t fetch_row = first_row;
    // mean and rstd: one copy per row and warp (bwd_stat_lanes), in slot
    // stat_slot of the stage's [STAT_SLOTS] mean then [STAT_SLOTS] rstd
    constexpr int STAT_LANES = bwd_stat_lanes(TPR);
    constexpr int STAT_SLOTS = BLOCK / STAT_LANES;
    const bool stat_owner = threadIdx.x % STAT_LANES == 0;
    const int stat_slot = threadIdx.x / STAT_LANES;
    const int stat_src = (int)(threadIdx.x % 32) / STAT_LANES * STAT_LANES;
    int fetch_stage = 0, read_stage = 0;
    auto next_stage = [&](int st) { return st + 1 == a.stages ? 0 : st + 1; };
    // Copies the next row's x, dy, mean, rstd into its ring stage (RING
    // only); a row past the end commits an empty group, which keeps the
    // group count uniform.
    auto issue = [&]() {
        if (fetch_row < a.rows) {
            const unsigned st = smem_addr(ring_words) +
                                fetch_stage * STAGE_BYTES + threadIdx.x * 16;
#pragma unroll
            for (int i = 0; i < ITEMS; i++) {
                if (i * STEP < lim) {
                    cp_async16_ca(st + i * BLOCK * 16,
                                  a.x + fetch_row * a.x_stride + col0 +
                                      i * STEP);
                    cp_async16_ca(st + (ITEMS + i) * BLOCK * 16,
                                  a.dy + fetch_row * a.dy_stride + col0 +
                                      i * STEP);
                }
            }
            if (stat_owner) {
                const unsigned stats = st - threadIdx.x * 16 +
                                       2 * ITEMS * BLOCK * 16 +
                                       stat_slot * (unsigned)sizeof(A);
                cp_async_small<sizeof(A)>(stats, a.mean + fetch_row);
                cp_async_small<sizeof(A)>(stats + STAT_SLOTS * sizeof(A),
                                          a.rstd + fetch_row);
            }
        }
        cp_async_commit();
        fetch_row += step_rows;
        fetch_stage = next_stage(fetch_stage);
    };

    A dw[ITEMS][VEC], db[ITEMS][VEC];
#pragma unroll
    for (int i = 0; i < ITEMS; i++) {
#pragma unroll
        for (int v = 0; v < VEC; v++) {
            dw[i][v] = 0;
            db[i][v] = 0;
        }
    }
    // A thread's columns never change, so it copies its weights once into
    // its own slice of shared memory after the ring ([ITEMS][BLOCK]
    // vectors): re-reading them from global memory cost a load and its
    // latency twice per row (L1 keeps little beside the ring), and pinning
    // them in registers spills at 64.
    vec_t<P, VEC> *const w_smem = reinterpret_cast<vec_t<P, VEC> *>(
        reinterpret_cast<char *>(ring_words) + a.stages * STAGE_BYTES) +
        threadIdx.x;
#pragma unroll
    for (int i = 0; i < ITEMS; i++) {
        vec_t<P, VEC> wv;
        if (a.w && i * STEP < lim) {
            wv = load_vec<P, VEC>(a.w + col0 + i * STEP);
        }
        else {
#pragma unroll
            for (int v = 0; v < VEC; v++) {
                wv.v[v] = from_acc<P>(A(1));
            }
        }
        w_smem[i * BLOCK] = wv;
    }

    // Split rows wait for the other slabs' partials of every row: one L2
    // round trip at best, the row's slowest slab at worst. LAG defers the
    // wait by a row: step k publishes row k's partials, then finishes row
    // k - 1, whose partials had row k's first pass to arrive. Row k - 1's
    // x and dy wait in its ring stage, so the ring prefetches one row less
    // (the launcher picks LAG for split rows with dx where that pays: see
    // run()). A kernel of its own: as a runtime choice the two loop
    // shapes raised every instantiation's registers (short rows spilled).
    static_assert(!LAG || RING, "LAG re-reads rows from the ring");
    constexpr int lag = LAG ? 1 : 0;
    if constexpr (RING) {
        for (int k = 0; k < a.stages - 1 - lag; k++) {
            issue();
        }
    }
    auto stage_at = [&](int stage) {
        return reinterpret_cast<const char *>(ring_words) + stage * STAGE_BYTES;
    };
    // This thread's x and dy of the row in the ring stage at st.
    auto read_xd = [&](const char *st, V (&xv)[ITEMS], V (&dv)[ITEMS]) {
        const V *xs = reinterpret_cast<const V *>(st) + threadIdx.x;
#pragma unroll
        for (int i = 0; i < ITEMS; i++) {
            xv[i] = xs[i * BLOCK];
            dv[i] = xs[(ITEMS + i) * BLOCK];
        }
    };
    // Items past the row (or of a row past the end) were not loaded:
    // zeros make their terms vanish from c1, c2 and dW/dB.
    auto pad = [&](bool row_ok, V (&xv)[ITEMS], V (&dv)[ITEMS]) {
#pragma unroll
        for (int i = 0; i < ITEMS; i++) {
            if (!row_ok || i * STEP >= lim) {
#pragma unroll
                for (int v = 0; v < VEC; v++) {
                    xv[i].v[v] = from_acc<T>(A(0));
                    dv[i].v[v] = from_acc<T>(A(0));
                }
            }
        }
    };
    // Second pass over a row: dx = rstd * (g - (xhat * c1 + c2) / N), and
    // the row's dW/dB terms. g - g is exactly 0 when N = 1, which a form
    // with rstd folded into the constants loses.
    auto finish = [&](int64_t row, bool row_ok, const V (&xv)[ITEMS],
                      const V (&dv)[ITEMS], A mean, A rstd, A c1, A c2) {
        const A c1n = c1 * inv_n;
        const A c2n = c2 * inv_n;
#pragma unroll
        for (int i = 0; i < ITEMS; i++) {
            if (!row_ok || i * STEP >= lim) {
                continue;
            }
            const vec_t<P, VEC> wv = w_smem[i * BLOCK];
            A out[VEC];
#pragma unroll
            for (int v = 0; v < VEC; v++) {
                const A xh = (widen<A>(xv[i].v[v]) - mean) * rstd;
                const A d = widen<A>(dv[i].v[v]);
                const A g = d * widen<A>(wv.v[v]);
                out[v] = rstd * (g - (xh * c1n + c2n));
                dw[i][v] += d * xh;
                db[i][v] += d;
            }
            if (a.dx) {
                store_rounded<T, VEC>(a.dx + row * a.dx_stride + col0 +
                                          i * STEP,
                                      out);
            }
        }
    };
    // Row `row`'s x, dy (this thread's items), mean and rstd, from the ring
    // (refilling the stage finished lag + 1 steps ago) or from global
    // memory; returns the ring stage it read.
    auto load = [&](int64_t row, bool row_ok, V (&xv)[ITEMS], V (&dv)[ITEMS],
                    A &mean, A &rstd) {
        int stage = 0;
        if constexpr (RING) {
            issue();
            ring_wait(a.stages - 1 - lag);
            const char *st = stage_at(read_stage);
            stage = read_stage;
            read_stage = next_stage(read_stage);
            read_xd(st, xv, dv);
            const A *stats = reinterpret_cast<const A *>(
                reinterpret_cast<const V *>(st) + 2 * ITEMS * BLOCK);
            A m = 0, r = 0;
            if (stat_owner) {
                m = stats[stat_slot];
                r = stats[STAT_SLOTS + stat_slot];
            }
            m = __shfl_sync(0xffffffffu, m, stat_src);
            r = __shfl_sync(0xffffffffu, r, stat_src);
            if (row_ok) {
                mean = m;
                rstd = r;
            }
        }
        else {
#pragma unroll
            for (int i = 0; i < ITEMS; i++) {
                if (row_ok && i * STEP < lim) {
                    xv[i] = load_vec<T, VEC>(a.x + row * a.x_stride + col0 +
                                             i * STEP);
                    dv[i] = load_vec<T, VEC>(a.dy + row * a.dy_stride + col0 +
                                             i * STEP);
                }
            }
            if (row_ok) {
                mean = a.mean[row];
                rstd = a.rstd[row];
            }
        }
        pad(row_ok, xv, dv);
        return stage;
    };
    // First pass: the CTA's partials c1 = sum g * xhat, c2 = sum g.
    auto partials = [&](const V (&xv)[ITEMS], const V (&dv)[ITEMS], A mean,
                        A rstd, A (&c)[2]) {
#pragma unroll
        for (int i = 0; i < ITEMS; i++) {
            const vec_t<P, VEC> wv = w_smem[i * BLOCK];
#pragma unroll
            for (int v = 0; v < VEC; v++) {
                // not x * rstd - mean * rstd: that cancels when x ~ mean
                // and rstd is large (N = 1: xhat must be 0)
                const A xh = (widen<A>(xv[i].v[v]) - mean) * rstd;
                const A g = widen<A>(dv[i].v[v]) * widen<A>(wv.v[v]);
                c[0] += g * xh;
                c[1] += g;
            }
        }
        row_sum<TPR, 2>(c, red, parity);
    };
    if constexpr (!LAG) {
        for (int64_t k = 0, row = first_row; k < steps;
             k++, row += step_rows) {
            const bool row_ok = row < a.rows;
            // x and dy stay in their storage type; xhat and g are
            // recomputed in the second pass instead of being held as fp32.
            V xv[ITEMS], dv[ITEMS];
            A mean = 0, rstd = 0;
            load(row, row_ok, xv, dv, mean, rstd);
            A c[2] = {0, 0};
            if (a.dx) {
                partials(xv, dv, mean, rstd, c);
                if (a.split > 1) {
                    // one row per CTA here (TPR >= 128): row_ok is uniform
                    if (threadIdx.x < 32 && row_ok) {
                        if (threadIdx.x == 0) {
                            split_publish(a.exchange, row, slab, a.split,
                                          c[0], c[1]);
                        }
                        split_collect(a.exchange, row, a.split, c[0], c[1]);
                        if (threadIdx.x == 0) {
                            merged[0] = c[0];
                            merged[1] = c[1];
                        }
                    }
                    __syncthreads();
                    // merged[] is next written after the next row's row_sum
                    // barrier, which every thread reaches after this read
                    c[0] = merged[0];
                    c[1] = merged[1];
                }
            }
            finish(row, row_ok, xv, dv, mean, rstd, c[0], c[1]);
        }
    }
    else {
        // Step k: first pass and publish of row k (k < steps), then the
        // second pass of row k - 1 (k > 0), re-read from its ring stage.
        int held_stage = 0;
        A held_mean = 0, held_rstd = 0;
        for (int64_t k = 0, row = first_row; k <= steps;
             k++, row += step_rows) {
            int stage = 0;
            A mean = 0, rstd = 0;
            // the held row's slabs published during the last step: their
            // slots are read now and used after this step's first pass
            unsigned long long peek0 = 0, peek1 = 0;
            if (k > 0 && threadIdx.x < 32 && row - step_rows < a.rows) {
                split_peek(a.exchange, row - step_rows, a.split, peek0, peek1);
            }
            if (k < steps) {
                const bool row_ok = row < a.rows;
                V xv[ITEMS], dv[ITEMS];
                stage = load(row, row_ok, xv, dv, mean, rstd);
                A c[2] = {0, 0};
                partials(xv, dv, mean, rstd, c);
                if (threadIdx.x == 0 && row_ok) {
                    split_publish(a.exchange, row, slab, a.split, c[0], c[1]);
                }
            }
            if (k > 0) {
                const int64_t held = row - step_rows;
                const bool held_ok = held < a.rows;
                // merged[] alternates between two slots: slot k % 2 is
                // next written at step k + 2, after the barrier below of
                // step k + 1, which each thread reaches after its read here
                A *const m = merged + 2 * (int)(k & 1);
                if (threadIdx.x < 32 && held_ok) {
                    A t0, t1;
                    split_collect(a.exchange, held, a.split, t0, t1, peek0,
                                  peek1);
                    if (threadIdx.x == 0) {
                        m[0] = t0;
                        m[1] = t1;
                    }
                }
                __syncthreads();
                V xv[ITEMS], dv[ITEMS];
                read_xd(stage_at(held_stage), xv, dv);
                pad(held_ok, xv, dv);
                finish(held, held_ok, xv, dv, held_mean, held_rstd, m[0],
                       m[1]);
            }
            held_stage = stage;
            held_mean = mean;
            held_rstd = rstd;
        }
    }
    if constexpr (RING) {
        cp_async_wait<0>(); // no copy may outlive the CTA's shared memory
    }
    if (!want_dwb) {
        return;
    }
    // The partial sums' kernel is this grid's programmatic dependent: it
    // may be scheduled from here on, so its launch overlaps the atomics
    // below; it reads them only after this grid has completed.
    pdl_launch_dependents();

    // One value per column per CTA: sum the CTA's row groups, then emit.
    A *const stripe =
        a.stripes + (int64_t)((int)group % a.n_stripes) * 2 * a.cols;
    auto emit = [&](int64_t col, A vw, A vb) {
        if (a.deterministic) {
            A *part = a.partials + group * 2 * a.cols;
            part[col] = vw;
            part[a.cols + col] = vb;
        }
        else {
            if (a.dw) {
                atomicAdd(stripe + col, vw);
            }
            if (a.db) {
                atomicAdd(stripe + a.cols + col, vb);
            }
        }
    };
    if constexpr (ROWS_PER_CTA == 1) {
#pragma unroll
        for (int i = 0; i < ITEMS; i++) {
            if (i * STEP >= lim) {
                continue;
            }
            const int64_t col = col0 + i * STEP;
            if (RING && !a.deterministic) {
                // whole aligned vectors (the ring's precondition): one
                // vector reduction per 4 columns on sm_90
                if (a.dw) {
                    red_add<VEC>(stripe + col, dw[i]);
                }
                if (a.db) {
                    red_add<VEC>(stripe + a.cols + col, db[i]);
                }
                continue;
            }
#pragma unroll
            for (int v = 0; v < VEC; v++) {
                if (i * STEP + v < lim) {
                    emit(col + v, dw[i][v], db[i][v]);
                }
            }
        }
    }
    else {
        A totals[2][(SLAB + BLOCK - 1) / BLOCK];
#pragma unroll
        for (int which = 0; which < 2; which++) {
#pragma unroll
            for (int i = 0; i < ITEMS; i++) {
#pragma unroll
                for (int v = 0; v < VEC; v++) {
                    colsum[sub * SLAB + (i * TPR + lane) * VEC + v] =
                        which == 0 ? dw[i][v] : db[i][v];
                }
            }
            __syncthreads();
#pragma unroll
            for (int k = 0; k < (SLAB + BLOCK - 1) / BLOCK; k++) {
                const int j = threadIdx.x + k * BLOCK;
                A s = 0;
                if (j < SLAB) {
                    for (int r = 0; r < ROWS_PER_CTA; r++) {
                        s += colsum[r * SLAB + j];
                    }
                }
                totals[which][k] = s;
            }
            __syncthreads();
        }
#pragma unroll
        for (int k = 0; k < (SLAB + BLOCK - 1) / BLOCK; k++) {
            const int j = threadIdx.x + k * BLOCK;
            if (j < SLAB && slab0 + j < col_end) {
                emit(slab0 + j, totals[0][k], totals[1][k]);
            }
        }
    }

}

// Second kernel: the `parts` partial sums of each of the 2 * cols columns
// (stripes, or the deterministic mode's per-group partials), rounded once
// to the parameters' dtype. A CTA takes kSumCols adjacent columns
// (coalesced) with kSumLanes threads each: lane l adds parts l,
// l + kSumLanes, ..., so a column's loads are in flight in one round (17
// stripes at 16384 x 4096: 5 a thread), and the lanes' sums meet in
// shared memory in lane order. The order is fixed: the same result every
// run. (H100, same run, graph replays: 4096 x 768 bf16 18.5 -> 17.4 us
// against one thread walking a column's parts; 16384 x 4096 equal.)
// It then writes zeros back over what it read: the workspace is zero
// again for the next launch on the stream, which saves a memset launch per
// backward where the caller keeps the workspace (kept_zero).
constexpr int kSumCols = 64, kSumLanes = 4;

template <typename A, typename P>
__global__ void __launch_bounds__(kSumCols * kSumLanes)
    layer_norm_bwd_sum_partials(A *partials, int64_t parts, int64_t cols,
                                P *dw, P *db)
{
    __shared__ A lane_sums[kSumLanes][kSumCols];
    const int64_t j = blockIdx.x * (int64_t)kSumCols + threadIdx.x;
    pdl_wait_primary(); // the fused kernel's atomics or partials are done
    A s = 0;
    if (j < 2 * cols) {
#pragma unroll 8
        for (int64_t gi = threadIdx.y; gi < parts; gi += kSumLanes) {
            s += partials[gi * 2 * cols + j];
        }
#pragma unroll 8
        for (int64_t gi = threadIdx.y; gi < parts; gi += kSumLanes) {
            partials[gi * 2 * cols + j] = A(0);
        }
    }
    lane_sums[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && j < 2 * cols) {
#pragma unroll
        for (int l = 1; l < kSumLanes; l++) {
            s += lane_sums[l][threadIdx.x];
        }
        P *out = j < cols ? dw : db;
        if (out) {
            out[j < cols ? j : j - cols] = from_acc<P>(s);
        }
    }
}

// Dynamic shared memory of one launch: the ring, then the weights. The
// ring gets the most stages (up to 4 for half types, 3 for wider ones)
// that leave room for the resident threads the registers are planned for
// (bwd_sm_threads) with ~6 KB a CTA to spare. What the ring takes comes
// out of L1, which its copies pass through (cp.async.ca): counting the
// driver's 1 KB and the static arrays exactly, a third fp32 stage would
// fit at 512 and 1024 threads a row, but with the 28 KB of L1 it leaves
// 8192 x 8192 fp32 went 287 -> 296 us and 2048 x 16384 179 -> 191 (H100,
// same-run A/B/A, graph replays).
struct bwd_ring_plan {
    int stages, smem;
};

template <typename T, typename P, int TPR, int VEC, int E>
bwd_ring_plan plan_ring(const device_facts &f)
{
    const int block = layer_norm_block_threads(TPR);
    const int per = bwd_stage_bytes<T, VEC, E>(block, TPR);
    const int w_bytes = block * E * (int)sizeof(P);
    if (per == 0) {
        return {1, w_bytes};
    }
    const int threads = bwd_sm_threads<T, E>();
    const int ctas = block >= threads ? 1 : threads / block;
    // per CTA: 1 KB the driver reserves, up to ~5 KB of static arrays
    int budget = f.smem_per_sm / ctas - 6 * 1024;
    budget = budget < f.smem_per_block_optin - 6 * 1024
                 ? budget
                 : f.smem_per_block_optin - 6 * 1024;
    int stages = sizeof(T) == 2 ? kMaxStages : kMaxStages - 1;
    const int fit = (budget - w_bytes) / per;
    stages = stages < fit ? stages : fit;
    stages = stages < 1 ? 1 : stages;
    return {stages, stages * per + w_bytes};
}

// CTAs of this instantiation resident per SM with its ring.
template <typename T, typename P, int TPR, int VEC, int E, bool LAG = false>
int ctas_per_sm(int device, const device_facts &f, gemsops_status *st,
                int *out)
{
    const bwd_ring_plan r = plan_ring<T, P, TPR, VEC, E>(f);
    int total = 0;
    if (resident_ctas((const void *)layer_norm_bwd_fused_atomic<T, P, TPR, VEC, E, LAG>,
                      device, layer_norm_block_threads(TPR), r.smem, &total,
                      st)) {
        return st->code;
    }
    *out = total / f.sm_count;
    if (*out < 1) {
        return gemsops_fail(st, GEMSOPS_ERR_RUNTIME,
                            "layer_norm_bwd: kernel cannot be resident on "
                            "device %d",
                            device);
    }
    return GEMSOPS_OK;
}

inline int64_t round16(int64_t n) { return (n + 15) / 16 * 16; }

// Same-address atomics serialise in L2: with G row groups adding into one
// accumulator per column, the tail of the kernel waits ~G atomic latencies.
// Row groups spread over stripes so that at most ~16 share an address.
inline int bwd_stripes(int64_t groups, int64_t cols, size_t acc_size)
{
    int64_t n = (groups + 15) / 16;
    const int64_t cap = ((int64_t)8 << 20) / (2 * cols * (int64_t)acc_size);
    n = n > 32 ? 32 : n;
    n = n > cap ? cap : n;
    return n < 1 ? 1 : (int)n;
}

// Workspace: [stripes][split exchange] must be zero when the kernel
// starts; [deterministic partials] follow and need no zeroing. A kept
// workspace (kept_zero) is zeroed whole by its first launch (known_zero
// unset: csrc/kept.c could not vouch for it) and is all zeros between
// launches: the sum kernel
// re-zeroes the stripes or partials it reads, and a launch that splits
// rows memsets the exchange region after itself as well as before (long
// rows only, where a memset launch is noise). The memset before is not
// redundant: it leaves the exchange slots in L2, where the polls find
// them (cold per-row counters measured ~35% slower on the H100 at
// 4096 x 12288, one DRAM round trip per row step).
struct bwd_layout {
    int n_stripes;
    int64_t exchange, partials, zeroed, total;
};

template <typename T, typename P>
bwd_layout plan_layout(const gemsops_layer_norm_bwd_params *p,
                       layer_norm_shape s, int64_t grid)
{
    using A = acc_t<T>;
    const bool want_dwb = p->dweight || p->dbias;
    const int64_t groups = grid / s.split;
    bwd_layout l;
    l.n_stripes = bwd_stripes(groups, p->cols, sizeof(A));
    int64_t at = 0;
    if (want_dwb && !p->deterministic) {
        at += round16(l.n_stripes * 2 * p->cols * (int64_t)sizeof(A));
    }
    l.exchange = at;
    if (p->dx && s.split > 1) {
        at += round16(p->rows * s.split * 2 * (int64_t)sizeof(A));
    }
    l.zeroed = at;
    l.partials = at;
    if (want_dwb && p->deterministic) {
        at += round16(groups * 2 * p->cols * (int64_t)sizeof(A));
    }
    l.total = at;
    return l;
}

// workspace_bytes != NULL: plan only (the bytes a launch needs). need !=
// NULL: a workspace short of the plan launches nothing and sets *need.
template <typename T, typename P, int TPR, int VEC, int E>
int run(const gemsops_layer_norm_bwd_params *p, layer_norm_shape shape,
        int64_t *workspace_bytes, int64_t *need, gemsops_status *st)
{
    using A = acc_t<T>;
    device_facts f;
    int occ = 0;
    int occ_scalar = 0;
    // Both access widths get the same grid, so the workspace plan does not
    // depend on pointer alignment, and split rows stay co-resident.
    if (get_device_facts(p->device_id, &f, st) ||
        ctas_per_sm<T, P, TPR, 16 / sizeof(T), E>(p->device_id, f, st, &occ) ||
        ctas_per_sm<T, P, TPR, 1, E>(p->device_id, f, st, &occ_scalar)) {
        return st->code;
    }
    occ = occ < occ_scalar ? occ : occ_scalar;
    constexpr int V16 = 16 / sizeof(T);
    // split rows may take the LAG kernel: it must fit as many per SM
    constexpr bool kLag = TPR >= 128 && bwd_ring<T, V16>();
    if constexpr (kLag) {
        int occ_lag = 0;
        if (ctas_per_sm<T, P, TPR, V16, E, true>(p->device_id, f, st, &occ_lag)) {
            return st->code;
        }
        occ = occ < occ_lag ? occ : occ_lag;
    }
    const int64_t grid = layer_norm_grid(p->rows, shape, 1, occ, f.sm_count,
                                         kMinRowsPerCta);
    const bwd_layout l = plan_layout<T, P>(p, shape, grid);
    if (workspace_bytes) {
        *workspace_bytes = l.total;
        return GEMSOPS_OK;
    }
    if (grid < shape.split) {
        return gemsops_fail(st, GEMSOPS_ERR_VALUE,
                            "layer_norm_bwd: a row of %lld elements needs %d "
                            "co-resident CTAs; device %d holds fewer",
                            (long long)p->cols, shape.split, p->device_id);
    }
    if (p->workspace_bytes < l.total && need) {
        *need = l.total;
        return GEMSOPS_OK;
    }
    if (p->workspace_bytes < l.total) {
        return gemsops_fail(st, GEMSOPS_ERR_VALUE,
                            "layer_norm_bwd: workspace has %lld bytes, the "
                            "launch needs %lld",
                            (long long)p->workspace_bytes, (long long)l.total);
    }
    char *ws = static_cast<char *>(p->workspace);
    cudaStream_t stream = (cudaStream_t)p->stream;
    bwd_args<T, P> a;
    a.dy = static_cast<const T *>(p->dy);
    a.x = static_cast<const T *>(p->x);
    a.w = static_cast<const P *>(p->weight);
    a.mean = static_cast<const A *>(p->mean);
    a.rstd = static_cast<const A *>(p->rstd);
    a.dx = static_cast<T *>(p->dx);
    a.dw = static_cast<P *>(p->dweight);
    a.db = static_cast<P *>(p->dbias);
    a.stripes = reinterpret_cast<A *>(ws);
    a.n_stripes = l.n_stripes;
    a.partials = reinterpret_cast<A *>(ws + l.partials);
    a.exchange = reinterpret_cast<A *>(ws + l.exchange);
    a.rows = p->rows;
    a.cols = p->cols;
    a.dy_stride = p->dy_row_stride;
    a.x_stride = p->x_row_stride;
    a.dx_stride = p->dx_row_stride;
    a.split = shape.split;
    const bwd_ring_plan ring = plan_ring<T, P, TPR, VEC, E>(f);
    a.stages = ring.stages;
    a.deterministic = p->deterministic != 0;

    if (p->kept_zero && !p->known_zero) {
        // kept from now on: all of it zero, whatever this launch uses
        GEMSOPS_CUDA_CHECK(st, cudaMemsetAsync(ws, 0, p->workspace_bytes,
                                               stream));
    }
    else {
        const int64_t zero_from = p->known_zero ? l.exchange : 0;
        if (l.zeroed > zero_from) {
            GEMSOPS_CUDA_CHECK(st, cudaMemsetAsync(ws + zero_from, 0,
                                                   l.zeroed - zero_from,
                                                   stream));
        }
    }
    const unsigned block = layer_norm_block_threads(TPR);
    bool lagged = false;
    if constexpr (TPR >= 128 && bwd_ring<T, VEC>()) {
        // LAG holds a row back, so the ring prefetches one row less. At 2
        // slabs the exchange wait is short and the deeper prefetch wins
        // (H100, same-run A/B/A, graph replays, 2048 x 16384 fp32: 182.0
        // us without LAG, 203.2 with it); with 3 or more slabs, or 4
        // stages, LAG won everywhere measured (4096 x 12288 fp32, 3 slabs:
        // equal).
        const bool lag_pays = shape.split > 2 || ring.stages > 3;
        if (shape.split > 1 && a.dx && ring.stages >= 2 && lag_pays) {
            layer_norm_bwd_fused_atomic<T, P, TPR, VEC, E, true>
                <<<(unsigned)grid, block, ring.smem, stream>>>(a);
            lagged = true;
        }
    }
    if (!lagged) {
        layer_norm_bwd_fused_atomic<T, P, TPR, VEC, E, false>
            <<<(unsigned)grid, block, ring.smem, stream>>>(a);
    }
    GEMSOPS_CUDA_CHECK_LAUNCH(st, "layer_norm_bwd_fused_atomic");
    if (a.dw || a.db) {
        // launched as a programmatic dependent on sm_90 (pdl_wait_primary):
        // its launch overlaps the fused kernel's tail instead of following
        // it (H100, same-run A/B/A, graph replays: 4096 x 4096 bf16 53.5 ->
        // 52.2 us, 8192 x 8192 fp16 160.9 -> 159.3; 16384 x 4096 equal)
        const int64_t n = 2 * p->cols;
        A *parts = a.deterministic ? a.partials : a.stripes;
        const int64_t n_parts =
            a.deterministic ? grid / shape.split : l.n_stripes;
        GEMSOPS_CUDA_CHECK(st, launch_dependent(
                                   layer_norm_bwd_sum_partials<A, P>,
                                   dim3((unsigned)((n + kSumCols - 1) / kSumCols)),
                                   dim3(kSumCols, kSumLanes),
                                   stream, f.cc_major >= 9, parts, n_parts,
                                   (int64_t)p->cols, a.dw, a.db));
    }
    if (p->kept_zero && l.zeroed > l.exchange) {
        GEMSOPS_CUDA_CHECK(st, cudaMemsetAsync(ws + l.exchange, 0,
                                               l.zeroed - l.exchange, stream));
    }
    return GEMSOPS_OK;
}

template <typename T, typename P>
bool vector_ok(const gemsops_layer_norm_bwd_params *p)
{
    constexpr int V = 16 / sizeof(T);
    constexpr uintptr_t PA = sizeof(P) * V;
    auto al = [](const void *q, uintptr_t n) {
        return q == nullptr || ((uintptr_t)q % n) == 0;
    };
    return p->cols % V == 0 && p->x_row_stride % V == 0 &&
           p->dy_row_stride % V == 0 && p->dx_row_stride % V == 0 &&
           al(p->x, 16) && al(p->dy, 16) && al(p->dx, 16) &&
           al(p->weight, PA);
}

template <typename T, typename P, int VEC, int E>
int dispatch_tpr(const gemsops_layer_norm_bwd_params *p, layer_norm_shape s,
                 int64_t *ws, int64_t *need, gemsops_status *st)
{
    if constexpr (E > bwd_base_elems<T>()) {
        // 256 or 512 threads a row (slab) only: 16 elements at 1024
        // threads need more than the 64 registers a thread then has
        switch (s.tpr) {
        case 256: return run<T, P, 256, VEC, E>(p, s, ws, need, st);
        case 512: return run<T, P, 512, VEC, E>(p, s, ws, need, st);
        default: break;
        }
    }
    else {
        switch (s.tpr) {
        case 4: return run<T, P, 4, VEC, E>(p, s, ws, need, st);
        case 8: return run<T, P, 8, VEC, E>(p, s, ws, need, st);
        case 16: return run<T, P, 16, VEC, E>(p, s, ws, need, st);
        case 32: return run<T, P, 32, VEC, E>(p, s, ws, need, st);
        case 128: return run<T, P, 128, VEC, E>(p, s, ws, need, st);
        case 256: return run<T, P, 256, VEC, E>(p, s, ws, need, st);
        case 512: return run<T, P, 512, VEC, E>(p, s, ws, need, st);
        case 1024: return run<T, P, 1024, VEC, E>(p, s, ws, need, st);
        default: break;
        }
    }
    return gemsops_fail(st, GEMSOPS_ERR_RUNTIME,
                        "layer_norm_bwd: no kernel for %d threads/row",
                        s.tpr);
}

// 16 elements a thread for the half types where a row (slab) then takes
// 256 or 512 threads and no more padded columns than with 8 (768 columns
// stay at 8, where 16 would leave 5/8 of a 128-thread CTA idle). Depends
// on the dtype and the width only, so the workspace plan does not depend
// on pointer alignment.
constexpr int kWideMaxTpr = 512;

template <typename T> bool bwd_wide(int64_t cols)
{
    if (sizeof(T) != 2) {
        return false;
    }
    const layer_norm_shape s8 = layer_norm_choose_shape(cols, 8, 1024);
    const layer_norm_shape s16 =
        layer_norm_choose_shape(cols, 16, kWideMaxTpr);
    return s16.tpr >= 256 &&
           (int64_t)s16.tpr * 16 * s16.split <= (int64_t)s8.tpr * 8 * s8.split;
}

template <typename T, typename P>
int launch(const gemsops_layer_norm_bwd_params *p, int64_t *ws, int64_t *need,
           gemsops_status *st)
{
    device_guard guard;
    GEMSOPS_CUDA_CHECK(st, guard.enter(p->device_id));
    if (p->rows == 0 || p->cols == 0) {
        // dW and dB over no rows are sums of nothing: zeros, no kernel
        if (ws) {
            *ws = 0;
            return GEMSOPS_OK;
        }
        const size_t bytes = (size_t)p->cols * sizeof(P);
        cudaStream_t stream = (cudaStream_t)p->stream;
        if (p->dweight && bytes) {
            GEMSOPS_CUDA_CHECK(st, cudaMemsetAsync(p->dweight, 0, bytes, stream));
        }
        if (p->dbias && bytes) {
            GEMSOPS_CUDA_CHECK(st, cudaMemsetAsync(p->dbias, 0, bytes, stream));
        }
        return GEMSOPS_OK;
    }
    // A whole row per CTA up to 1024 threads: the ring keeps loads flowing
    // through the barriers, which costs less than exchanging partials
    // between CTAs through global memory for every row.
    constexpr int E = bwd_base_elems<T>();
    constexpr int V = 16 / sizeof(T);
    const bool vec = vector_ok<T, P>(p);
    if constexpr (sizeof(T) == 2) {
        if (bwd_wide<T>(p->cols)) {
            const layer_norm_shape s =
                layer_norm_choose_shape(p->cols, 2 * E, kWideMaxTpr);
            return vec ? dispatch_tpr<T, P, V, 2 * E>(p, s, ws, need, st)
                       : dispatch_tpr<T, P, 1, 2 * E>(p, s, ws, need, st);
        }
    }
    // Split rows take slabs of 512 threads, two CTAs a SM: while one waits
    // on its barriers or the exchange, the other's loads flow. One
    // 1024-thread CTA a SM stalls with nothing beside it (H100, same-run
    // A/B/A, graph replays, fp32: 256 x 262144 354.1 -> 326.6 us, 1024 x
    // 65536 354.0 -> 311.7, 2048 x 16384 172.3 -> 164.4). fp64 keeps 1024:
    // its registers allow one 512-thread CTA a SM, nothing to interleave.
    const int max_tpr =
        sizeof(T) < 8 && p->cols > 1024 * (int64_t)E ? 512 : 1024;
    const layer_norm_shape s = layer_norm_choose_shape(p->cols, E, max_tpr);
    return vec ? dispatch_tpr<T, P, V, E>(p, s, ws, need, st)
               : dispatch_tpr<T, P, 1, E>(p, s, ws, need, st);
}

int dispatch(const gemsops_layer_norm_bwd_params *p, int64_t *ws,
             int64_t *need, gemsops_status *st)
{
    const bool same = p->param_dtype == p->dtype;
    switch (p->dtype) {
    case GEMSOPS_FLOAT32:
        return launch<float, float>(p, ws, need, st);
    case GEMSOPS_FLOAT64:
        return launch<double, double>(p, ws, need, st);
    case GEMSOPS_FLOAT16:
        return same ? launch<__half, __half>(p, ws, need, st)
                    : launch<__half, float>(p, ws, need, st);
    case GEMSOPS_BFLOAT16:
        return same ? launch<__nv_bfloat16, __nv_bfloat16>(p, ws, need, st)
                    : launch<__nv_bfloat16, float>(p, ws, need, st);
    default:
        return gemsops_fail(st, GEMSOPS_ERR_TYPE,
                            "layer_norm_bwd: unsupported dtype %s on CUDA",
                            gemsops_dtype_name(p->dtype));
    }
}

} // namespace
} // namespace gemsops

extern "C" int gemsops_layer_norm_bwd_cuda(
    const struct gemsops_layer_norm_bwd_params *p, int64_t *need,
    gemsops_status *st)
{
    if (need) {
        *need = 0;
    }
    return gemsops::dispatch(p, nullptr, need, st);
}

extern "C" int gemsops_layer_norm_bwd_workspace_cuda(
    const struct gemsops_layer_norm_bwd_params *p, int64_t *bytes,
    gemsops_status *st)
{
    return gemsops::dispatch(p, bytes, nullptr, st);
}
