// The Hopper mainloop of the Stream-K matmul (sm_90a): warpgroup MMA
// (wgmma.mma_async) on operands the tensor memory accelerator (TMA) brings
// into shared memory, warp-specialized. fp16 and bf16; fp32 as TF32 (the
// tensor cores read the top 19 bits of each fp32 element) when torch
// allows it.
//
// Roles: BM / 64 consumer warpgroups and one producer. The consumers run
// the driver (the mainloop, the Stream-K fix-up, the epilogue); warpgroup
// BM / 64 produces: one thread (four, taking turns, for BM = 64) walks
// the CTA's pieces (the consumers' walk, streamk_walk or tiles_walk) and
// issues the loads. No consumer instruction goes to copies, and inside the
// mainloop the consumers never meet at a CTA barrier: each waits for its
// step alone.
// The consumers grow to kConsumerRegs registers (setmaxnreg) and the
// producer shrinks to kProducerRegs; one CTA an SM. BM = 128: 384
// threads. BM = 64 (64 x 64 tiles, for outputs of few 128-row tiles: twice
// the CTAs, each loading half the bytes a k-step, a deeper ring): 256.
// BM = 192 (192 x 192 tiles, three consumer warpgroups): 512, for outputs
// whose 128-row tiles leave a last wave mostly empty where 192 x 192 tiles
// fill one (5888 x 768: 124 tiles against 184 of 128 x 192 on 132 SMs).
//
// Tile: BM (128, 64 or 192) rows x BN (64, 128, 192 or 256) columns x BK
// per k-step, BK the k of 128 bytes (64 half elements, 32 fp32); consumer g
// computes rows 64g..64g+63 with one wgmma per 32 bytes of k (m64nBNk16 for
// halves, m64nBNk8 for TF32; fp32 accumulators, BN / 2 registers per thread). A
// half k-step is 2 * 128 * BN * 64 FLOP: ~512 tensor-core cycles of one SM
// at BN = 128, ~1024 at BN = 256, while the copies of the next steps fly;
// a TF32 k-step is half the FLOP at half the rate, so the same cycles on
// the same bytes. BN = 64 (~256 cycles for 24 KB a k-step) runs short of
// load bandwidth; it is for outputs too small to give every SM a wider
// tile.
//
// Shared memory: an S-stage ring of [A | B] stages, each operand in the
// 128-byte-swizzle canonical layout wgmma reads and TMA writes (16-byte
// chunk c of 128-byte line L at L * 128 + ((c ^ (L % 8)) * 16), 1024-byte
// aligned atoms of 8 lines):
//   K-major operand (unit k stride): one line per row, BK k = 128 bytes
//     (one TMA box of BK k x rows); the descriptor steps one instruction's
//     k by +32 bytes, 8-row groups 1024 bytes apart (SBO);
//   MN-major operand (unit m or n stride): atoms of 64 columns x 64 k
//     (one TMA box each), one line per k, atoms 8 KB apart (LBO), 8-k
//     groups 1024 bytes apart (SBO); the instruction transposes
//     (imm-trans = 1). So every layout torch hands us is read in place,
//     the backward's A^T included. TMA zero-fills past M, N and K. TF32
//     has no transposing form: fp32 operands come K-major (an MN-major
//     one is staged transposed first, matmul_stage.cuh).
//
// Ordering: two mbarriers a slot. full[s] completes when the producer's
// expect-tx arrive and the slot's 2-5 bulk tensor copies have landed;
// empty[s] when each of the 8 consumer warps has seen the wgmma reading
// the slot retire. A consumer keeps one wgmma group in flight: it issues
// step i, waits for step i - 1 and releases that slot. The ring and its
// phases live for the CTA's whole walk, so a tile's first loads overlap
// the previous tile's last steps and its epilogue: short-K shapes and
// Stream-K pieces do not start cold. Earlier designs (per-thread cp.async;
// thread 0 loading between CTA barriers): docs/performance.md, matmul.
//
// Epilogue: each consumer warp rounds its 16 rows x 128 bytes of C at a
// time into a slice of shared memory (after the ring), and one lane hands
// the slice to TMA (a bulk tensor store through C's map); the warp goes on
// to the next columns and the next tile while the copy engine writes C.
// C's rows that are not 16-byte aligned leave the slice element by element.
//
// Pingpong (TEAMS = 2; 128 x 128 tiles of halves, whole tiles alone): each
// consumer warpgroup computes whole tiles of its own, two m64n128 wgmmas a
// 32 bytes of k (128 accumulators a thread), warpgroup g taking the CTA's
// tiles g, g + 2, ... of its walk. The producer loads the walk in order, so
// the ring holds one warpgroup's k-steps, then the other's: each consumer's
// cursor passes over the other's steps (skip), and a slot is released by
// its owner's four warps alone. While one warpgroup rounds and stores a
// tile, the other's wgmmas keep the tensor cores busy: the epilogue, a
// good part of a short-k tile's time under the cooperative kernels
// (docs/performance.md), runs beside the mainloop instead of after it.
#pragma once

#include "matmul_mma.cuh" // tc_operands
#include "matmul_wgmma_ptx.cuh"

namespace gemsops {

// How the staged epilogue sends C's slices to global memory
// (wgmma_mainloop::store_staged).
enum class c_store { tma, elements };

// How a CTA walks its work, producer and consumers alike. A Stream-K
// launch walks gemsops_sk_walk: its Stream-K pieces, then its whole tiles.
// A launch of whole tiles alone (no Stream-K share, no split) walks tiles
// c, c + ctas, ... straight: its kernel (matmul_tiles_kernel) then holds no
// piece arithmetic, no fix-up and no banded sums, and reaches its first
// load and its first epilogue sooner.
struct streamk_walk {
    gemsops_sk_walk w;

    __device__ void start(const gemsops_sk_schedule &s, int64_t cta)
    {
        gemsops_sk_walk_start(&s, cta, &w);
    }
    __device__ bool next(const gemsops_sk_schedule &s, int64_t *tile,
                         int64_t *k0, int64_t *k1)
    {
        return gemsops_sk_walk_next(&s, &w, tile, k0, k1) != 0;
    }
};

struct tiles_walk {
    int64_t tile;

    __device__ void start(const gemsops_sk_schedule &, int64_t cta)
    {
        tile = cta;
    }
    __device__ bool next(const gemsops_sk_schedule &s, int64_t *t, int64_t *k0,
                         int64_t *k1)
    {
        if (tile >= s.dp_tiles) {
            return false;
        }
        *t = tile;
        *k0 = 0;
        *k1 = s.iters;
        tile += s.ctas;
        return true;
    }
};

// A split-k launch (matmul_splitk_kernel, one cluster of `split` CTAs a
// tile): the CTA of rank j computes piece j of its cluster's tile, k-steps
// [j * iters / split, (j + 1) * iters / split) (gemsops_sk_range's cut of
// sk_ctas = tiles * split shares), and nothing else. iters < 2^28 (k is an
// int32 TMA coordinate): the cut in 32 bits.
struct split_walk {
    int64_t tile, k0, k1;
    unsigned rank;
    bool left;

    __device__ void start(const gemsops_sk_schedule &s, int64_t)
    {
#ifdef GEMSOPS_HAS_WGMMA
        rank = cluster_rank();
        tile = cluster_index();
#else
        rank = 0;
        tile = 0;
#endif
        const unsigned iters = (unsigned)s.iters, split = (unsigned)s.split;
        k0 = rank * iters / split;
        k1 = (rank + 1) * iters / split;
        left = true;
    }
    __device__ bool next(const gemsops_sk_schedule &, int64_t *t, int64_t *kb,
                         int64_t *ke)
    {
        if (!left) {
            return false;
        }
        *t = tile;
        *kb = k0;
        *ke = k1;
        left = false;
        return true;
    }
};

// The k-steps of a piece (counted from its first) whose A slots a ROWS
// mainloop adds into the row sums: from <= i < to.
struct row_steps {
    int from, to;
};

// AM: A is M-contiguous (else K-contiguous); BNM: B is N-contiguous (else
// K-contiguous). One kernel per layout: one body for the four costs
// registers (it spilled at BN = 256). T = float: TF32, both K-contiguous.
// ROWS (halves, A M-contiguous): the tiles also sum A's rows over the
// k-steps the driver names (row_steps: all of k in the tiles of C's first
// column, or in a launch of one wave a share of it in each tile of a row;
// nn.Linear's bias gradient beside its weight gradient, A = grad^T). The
// consumers add up a k-step's A slot on their CUDA cores while its wgmmas
// run; at the piece's end the sums land in kRowAcc more accumulators, laid
// out as an m64n8 wgmma's, so the Stream-K fix-up carries them as it
// carries the tile's. (A wgmma against a
// tile of ones would do it: the same wgmma may not sit behind a branch, or
// ptxas serializes them all, so it would read A again in every k-step.)
//
// CT (C transposed): the launch computes the swapped product C^T = B^T A^T,
// whose tiles are BM columns x BN rows of C: the wgmma's N, any multiple of
// 8, runs over C's rows, so tiles 80, 96 or 160 rows tall fit the SM count
// where the 64-column swizzle atoms of an N-contiguous B allow only widths
// of 64 (docs/performance.md, matmul): 128 columns of C (BM = 128), or 64
// (BM = 64, 80 or 96 rows) for C of few columns. A' = B^T, B' = A^T
// (K-major: A K-contiguous); the epilogue writes each warp's block
// transposed (store_transposed).
template <typename T, int BN_, int STAGES, bool AM, bool BNM,
          bool ROWS = false, int BM_ = 128, int TEAMS = 1, bool CT = false>
struct wgmma_mainloop {
    static_assert(BN_ == 64 || BN_ == 128 || BN_ == 192 || BN_ == 256 ||
                      (CT && (BN_ == 80 || BN_ == 96 || BN_ == 160)),
                  "BN: 64, 128, 192 or 256; 80, 96 or 160 transposed");
    static_assert(!CT || (sizeof(T) == 2 && !BNM && !ROWS && TEAMS == 1),
                  "C transposed: halves, B' K-major");
    static_assert(BM_ == 128 || (BM_ == 64 && BN_ <= 96) ||
                      (BM_ == 192 && BN_ == 192),
                  "BM x BN");
    static_assert(sizeof(T) == 2 || !(AM || BNM), "TF32 operands: K-major");
    static_assert(TEAMS == 1 || (TEAMS == 2 && BM_ == 128 && BN_ == 128 &&
                                 sizeof(T) == 2 && !ROWS),
                  "pingpong: 128 x 128 tiles of halves, no row sums");
    static constexpr int kElem = sizeof(T); // bytes
    static constexpr int BM = BM_, BN = BN_, BK = 128 / kElem;
    static constexpr int kStages = STAGES;
    static constexpr bool kTma = true, kWarpSpecialized = true;
    // 192 x 192 tiles run whole or split-k: under 152 registers their
    // Stream-K walk and fix-up spilled (~300 bytes, stores in the main loop
    // among them)
    static constexpr bool kStreamK = BM != 192 && TEAMS == 1;
    // pingpong: whole tiles alone (a Stream-K or split-k piece's fix-up
    // meets every consumer of the CTA, which its warpgroups are not)
    static constexpr bool kSplitK = TEAMS == 1 && !CT;
    static constexpr bool kTransposedC = CT;
    static constexpr int kTeams = TEAMS;
    static_assert(!ROWS || (sizeof(T) == 2 && AM && BM == 128),
                  "row sums: half types, A M-contiguous, 128-row tiles");
    static constexpr int kConsumers = BM * 2, kThreads = kConsumers + 128,
                         kAcc = BN / 2 * TEAMS;
    // the row sums as an m64n8 accumulator (4 a thread; every column holds
    // them), gathered through a row of BM floats in shared memory
    static constexpr int kRowAcc = ROWS ? 4 : 0;
    static constexpr int kRowSumBytes = ROWS ? BM * 4 : 0;
    // the producer's walk fits in 40; the consumers take the rest of the
    // SM's 65536 (BM = 128: 128 x 40 + 256 x 232; BM = 192: 128 x 40 +
    // 384 x 152), BM = 64 no more than its launch holds (128 x 216)
    static constexpr int kProducerRegs = 40;
    static constexpr int kConsumerRegs = BM == 64    ? 216
                                         : BM == 128 ? 232
                                                     : 152;
    static constexpr int kABytes = BM * BK * kElem,
                         kStageBytes = (BM + BN) * BK * kElem;
    static constexpr int kAtom = 64 * 128; // 64 columns x 64 k (MN-major)
    // Epilogue staging, after the ring: per consumer warp, kBuffers slices
    // of 16 rows x 128 bytes of C (kCols columns: 64 halves or 32 fp32) in
    // the 128-byte swizzle (byte b of row r at slice_at(r, b)): a warp's
    // pair writes spread over the 32 banks, and a slice is one box of C's
    // tensor map. With two, a slice's TMA store reads one while the warp
    // fills the other (slice cc % 2 for columns cc, so a tile uses them an
    // even number of times); one where two do not fit beside the ring
    // (BN = 192), a tile has one slice of columns (BN = 64, halves), or the
    // ring takes the room (BM = 64).
    static constexpr int kCols = 128 / kElem;
    // CT: a slice holds kCtRows rows of C x a warp's 16 columns (32 bytes a
    // row, unswizzled), two slices a tile (BN 80: 64 + 16 rows, 96: 64 + 32,
    // 160: 80 + 80)
    static constexpr int kCtRows = BN == 160 ? 80 : 64;
    static constexpr int kSliceBytes = CT ? kCtRows * 32 : 16 * 128;
    static constexpr int kSmemLimit = 232448; // a CTA's opt-in on sm_90
    static constexpr int kBuffers =
        BM >= 128 && (CT || (BN / kCols) % 2 == 0) &&
                kStages * kStageBytes + 1024 + TEAMS * BN * 4 + 256 +
                        kRowSumBytes + 2 * (kConsumers / 32) * kSliceBytes <=
                    kSmemLimit
            ? 2
            : 1;
    static_assert(kStageBytes % 1024 == 0, "slices start 1024-aligned");
    struct smem_t {
        uint64_t full[kStages], empty[kStages]; // mbarriers
        int abort; // the consumers gave up (debug wait): stop loading
        // beta * a row bias, the tile's (a warpgroup's own, pingpong)
        alignas(16) float bias_row[TEAMS * BN];
        alignas(16) float row_sums[ROWS ? BM : 1]; // a piece's, for acc
        // the ring, the slices, and slack to align both to 1024 bytes (the
        // swizzle's period)
        unsigned char raw[kStages * kStageBytes +
                          kBuffers * (kConsumers / 32) * kSliceBytes + 1024];
    };
    static_assert(sizeof(smem_t) <= kSmemLimit, "shared memory");
    struct ring_t { // a consumer's cursor: slot of the next step, parity
        int read;
        unsigned phase;
    };

    // Pingpong: past the other warpgroup's `steps` k-steps of the ring.
    static __device__ __forceinline__ void skip(ring_t &ring, int64_t steps)
    {
        const int64_t to = ring.read + steps;
        ring.phase ^= (unsigned)(to / kStages) & 1u;
        ring.read = (int)(to % kStages);
    }

    static __device__ __forceinline__ unsigned ring_base(smem_t &sm)
    {
        return (smem_addr(sm.raw) + 1023u) & ~1023u;
    }
    // slice `buf` of consumer warp `warp` (a shared-memory address)
    static __device__ __forceinline__ unsigned slice(smem_t &sm, int warp,
                                                     int buf)
    {
        return ring_base(sm) + kStages * kStageBytes +
               (warp * kBuffers + buf) * kSliceBytes;
    }
    // A split-k piece's partial tile (kAcc floats a consumer thread) over
    // the ring, which is free once both consumer warpgroups are past their
    // piece's last wgmma (the producer loads nothing more).
    static_assert(kAcc * kConsumers * 4 <= kStages * kStageBytes,
                  "a partial fits in the ring");
    static __device__ __forceinline__ unsigned partial_base(smem_t &sm)
    {
        return ring_base(sm);
    }
    // byte b (0..127) of row r of a slice
    static __device__ __forceinline__ int slice_at(int r, int b)
    {
        return r * 128 + ((((b >> 4) ^ r) & 7) << 4) + (b & 15);
    }

    // The k-step `step` of the tile at (r0, c0) into ring slot `stage`,
    // counted on the mbarrier `bar`.
    static __device__ __forceinline__ void load(const tc_operands &o,
                                                unsigned stage, unsigned bar,
                                                int r0, int c0, int za, int zb,
                                                int64_t step)
    {
#ifdef GEMSOPS_HAS_WGMMA
        const int kb = (int)(step * BK);
        mbar_expect_tx(bar, kStageBytes);
        if constexpr (AM) { // boxes of 64 m x 64 k
#pragma unroll
            for (int j = 0; j < BM / 64; j++) {
                tma_load_3d(stage + j * kAtom, o.ta, r0 + 64 * j, kb, za, bar);
            }
        }
        else { // one box of 64 k x BM m
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

    // Every thread, once: the barriers, then the roles may start.
    static __device__ void begin(const gemsops_sk_schedule &,
                                 const tc_operands &, int64_t, ring_t &ring,
                                 smem_t &sm)
    {
#ifdef GEMSOPS_HAS_WGMMA
        if (threadIdx.x == 0) {
            for (int st = 0; st < kStages; st++) {
                mbar_init(smem_addr(&sm.full[st]), 1);
                // once by each warp that reads the slot: every consumer
                // warp, or the owning warpgroup's four (pingpong)
                mbar_init(smem_addr(&sm.empty[st]), kConsumers / 32 / TEAMS);
            }
            sm.abort = 0;
            mbar_init_fence();
        }
        __syncthreads();
#else
        (void)sm;
#endif
        ring.read = 0;
        ring.phase = 0;
    }

    // Threads that issue loads, each the first lane of its own producer
    // warp, taking the k-steps in turn (issuer i those in slots i, i +
    // kIssuers, ...). One thread's turn of the loop (wait for a free slot,
    // arm the full barrier, issue the copies) is a chain of ~300 cycles of
    // latency, longer than the 64 x 64 tile's k-step on the tensor cores
    // (the 128 x 64 tile's gained nothing from four).
    static constexpr int kIssuers = BM == 64 ? 4 : 1;
    static_assert(kStages % kIssuers == 0, "an issuer keeps its own slots");

    // The producer warpgroup: its issuers walk the CTA's pieces
    // (streamk_walk or tiles_walk, the consumers' own), each loading its
    // k-steps as their slots free, then waiting until those loads have
    // landed (none may land after the CTA exits). They stop loading when
    // the consumers abort.
    template <typename Walk>
    static __device__ void produce(const gemsops_sk_schedule &s,
                                   const tc_operands &o, int64_t cta,
                                   smem_t &sm)
    {
#ifdef GEMSOPS_HAS_WGMMA
        regs_shrink<kProducerRegs>();
        const int issuer =
            kIssuers == 1 ? 0 : (int)(threadIdx.x - kConsumers) / 32;
        if (kIssuers == 1 ? threadIdx.x != kConsumers
                          : threadIdx.x % 32 != 0 || issuer >= kIssuers) {
            return;
        }
        const unsigned base = ring_base(sm);
        Walk walk;
        walk.start(s, cta);
        int slot = 0;
        unsigned phase = 0;
        int64_t loads = 0;
        int64_t tile, k0, k1;
        bool aborted = false;
        while (!aborted && walk.next(s, &tile, &k0, &k1)) {
            int64_t bt, tm, tn;
            gemsops_sk_tile_coords(&s, tile, &bt, &tm, &tn);
            const int za = o.a_bs == 0 ? 0 : (int)bt;
            const int zb = o.b_bs == 0 ? 0 : (int)bt;
            for (int64_t k = k0; k < k1; k++) {
                if (slot % kIssuers == issuer) {
                    // a fresh barrier's preceding phase (parity 1) counts as
                    // complete: the first pass over the ring does not wait
                    const unsigned empty = smem_addr(&sm.empty[slot]);
                    while (!mbar_try_wait(empty, phase ^ 1)) {
                        if (*(volatile int *)&sm.abort) {
                            aborted = true;
                            break;
                        }
                    }
                    if (aborted) {
                        break;
                    }
                    load(o, base + slot * kStageBytes,
                         smem_addr(&sm.full[slot]), (int)(tm * BM),
                         (int)(tn * BN), za, zb, k);
                }
                loads++;
                if (++slot == kStages) {
                    slot = 0;
                    phase ^= 1;
                }
            }
        }
        // slot st last held load j (the largest j < loads with j % S = st),
        // whose full phase has parity (j / S) % 2; this issuer's slots
        for (int st = issuer; st < kStages && st < loads; st += kIssuers) {
            const int64_t j = (loads - 1 - st) / kStages * kStages + st;
            mbar_wait(smem_addr(&sm.full[st]), (unsigned)(j / kStages) & 1);
        }
#else
        (void)s, (void)o, (void)cta, (void)sm;
#endif
    }

    // The consumers, once: registers for the accumulators.
    static __device__ __forceinline__ void consume()
    {
#ifdef GEMSOPS_HAS_WGMMA
        regs_grow<kConsumerRegs>();
#endif
    }

    // An early exit (debug: a Stream-K wait gave up): the producer stops
    // loading and waits for the loads in flight.
    static __device__ void drain(ring_t &, smem_t &sm)
    {
        if (threadIdx.x == 0) {
            *(volatile int *)&sm.abort = 1;
        }
    }

    // The piece's k-steps (loaded by the producer's walk, which names the
    // same pieces in the same order) into acc; ROWS: A's rows summed over
    // the piece's steps `rows` (none: the row accumulators are zeros).
    static __device__ void mac(const gemsops_sk_schedule &,
                               const tc_operands &, ring_t &ring, int64_t,
                               int64_t k0, int64_t k1, row_steps rows,
                               float (&acc)[kAcc + kRowAcc], smem_t &sm)
    {
#ifdef GEMSOPS_HAS_WGMMA
        const unsigned base = ring_base(sm);
        const int64_t steps = k1 - k0;
        const bool arrives = threadIdx.x % 32 == 0; // once a warp
#pragma unroll
        for (int e = 0; e < kAcc; e++) {
            acc[e] = 0.f;
        }
        const bool sums = ROWS && rows.to > rows.from;
        float rs[4] = {0.f, 0.f, 0.f, 0.f};
        // warpgroup g: rows 64g.. (pingpong: all rows, 64 at a time)
        const unsigned g = TEAMS == 1 ? threadIdx.x / 128 : 0;
        const uint64_t da0 =
            wgmma_desc(base + g * kAtom, AM ? kAtom : 16, 1024);
        const uint64_t db0 =
            wgmma_desc(base + kABytes, BNM ? kAtom : 16, 1024);
        int prev = 0;
        for (int64_t i = 0; i < steps; i++) {
            mbar_wait(smem_addr(&sm.full[ring.read]), ring.phase);
            // descriptors advance in 16-byte units: +k-step slot, +one
            // instruction's k (2 lines of 8 MN-major, 32 bytes K-major)
            const uint64_t slot = (unsigned)(ring.read * kStageBytes) >> 4;
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) { // 4 x 32 bytes of k
                const int step = AM ? kk * 128 : kk * 2;
                const int bstep = BNM ? kk * 128 : kk * 2;
#pragma unroll
                for (int h = 0; h < TEAMS; h++) { // 64 rows: one atom on
                    wgmma_m64k32bytes<T, BN, AM, BNM>(acc + h * (BN / 2),
                                                      da0 + slot + step +
                                                          h * (kAtom >> 4),
                                                      db0 + slot + bstep);
                }
            }
            wgmma_commit();
            wgmma_wait<1>(); // step i - 1 has read its slot: release it
            if (i > 0 && arrives) {
                mbar_arrive(smem_addr(&sm.empty[prev]));
            }
            // while the wgmmas read the same slot, which the next step
            // releases: the release of step i - 1's does not wait for this
            if (sums && i >= rows.from && i < rows.to) {
                add_rows(rs, base + ring.read * kStageBytes +
                                 row_share(threadIdx.x));
            }
            prev = ring.read;
            if (++ring.read == kStages) {
                ring.read = 0;
                ring.phase ^= 1;
            }
        }
        wgmma_wait<0>();
        if (steps > 0 && arrives) {
            mbar_arrive(smem_addr(&sm.empty[prev]));
        }
        if (sums) {
            gather_rows(rs, acc, sm);
        }
        else {
#pragma unroll
            for (int e = kAcc; e < kAcc + kRowAcc; e++) {
                acc[e] = 0.f;
            }
        }
#else
        (void)ring, (void)k0, (void)k1, (void)rows, (void)acc, (void)sm;
        __trap(); // the planner picks this mainloop only for sm_90a code
#endif
    }

    // ROWS: consumer thread t's share of a k-step's A slot, whose two atoms
    // hold 64 k-rows x 128 bytes (64 m each) in the 128-byte swizzle (chunk
    // j of row r at chunk j ^ (r % 8)): 4 m (8 bytes) in rows q, q + 8, ...,
    // q + 56, so the 8 threads of 4 m are neighbouring lanes and the row
    // sums come out of 3 shuffles. The 8 lanes of an m-quad read 8 distinct
    // chunks of 8 rows: every bank once.
    static __device__ __forceinline__ unsigned row_share(int t)
    {
        const int quad = (t % kConsumers) / 8, q = t % 8; // m = 4 * quad ..
        const int atom = quad / 16, j = (quad % 16) / 2;
        return atom * kAtom + q * 128 + ((j ^ q) << 4) + (quad % 2) * 8;
    }

    static __device__ __forceinline__ void add_rows(float (&rs)[4],
                                                    unsigned at)
    {
#pragma unroll
        for (int i = 0; i < BK / 8; i++) {
            vec_t<T, 4> x;
            unsigned *w = reinterpret_cast<unsigned *>(&x);
            asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];"
                         : "=r"(w[0]), "=r"(w[1])
                         : "r"(at + i * 8 * 128));
            float f[4];
            widen_vec<float, T, 4>(x, f);
#pragma unroll
            for (int v = 0; v < 4; v++) {
                rs[v] += f[v];
            }
        }
    }

    // ROWS, at a piece's end: the 8 threads of each m-quad add their sums
    // (a fixed tree: the sums repeat bit for bit), the first puts them in
    // sm.row_sums, and every thread takes its accumulator rows' (coords).
    static __device__ void gather_rows(float (&rs)[4],
                                       float (&acc)[kAcc + kRowAcc],
                                       smem_t &sm)
    {
        if constexpr (ROWS) {
#pragma unroll
            for (int d = 1; d < 8; d *= 2) {
#pragma unroll
                for (int v = 0; v < 4; v++) {
                    rs[v] += __shfl_xor_sync(0xffffffffu, rs[v], d);
                }
            }
            consumers_sync<
                kConsumers>(); // the last piece's sums have been taken
            if (threadIdx.x % 8 == 0) {
                *reinterpret_cast<float4 *>(&sm.row_sums[threadIdx.x / 2]) =
                    make_float4(rs[0], rs[1], rs[2], rs[3]);
            }
            consumers_sync<kConsumers>();
#pragma unroll
            for (int e = 0; e < kRowAcc; e++) {
                int r, c;
                coords(kAcc + e, r, c);
                acc[kAcc + e] = sm.row_sums[r];
            }
        }
        else {
            (void)rs, (void)acc, (void)sm;
        }
    }

    // The pair (a, b) of columns 2 * q, 2 * q + 1 into row r of a slice
    static __device__ __forceinline__ void stage_pair(unsigned sl, int r,
                                                      int q, float a, float b)
    {
        const unsigned d = sl + slice_at(r, q * 2 * kElem);
        if constexpr (std::is_same_v<T, float>) {
            asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(d), "f"(a),
                         "f"(b)
                         : "memory");
        }
        else {
            uint32_t w;
            if constexpr (std::is_same_v<T, __half>) {
                const __half2 h = __floats2half2_rn(a, b);
                w = *reinterpret_cast<const uint32_t *>(&h);
            }
            else {
                const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
                w = *reinterpret_cast<const uint32_t *>(&h);
            }
            asm volatile("st.shared.b32 [%0], %1;" ::"r"(d), "r"(w)
                         : "memory");
        }
    }

    // The tile at (r0, c0) of C[bt] (row stride n) from epi.apply(acc,
    // epi.addends(row, col)), through the warp's slices: each warp holds 16
    // rows; per kCols columns (128 bytes) its lanes write their pairs (rows
    // of 4 lanes x 2 values), and the slice goes out `how`:
    //   tma (C's rows 16-byte aligned): one TMA store of the slice, which C's
    //     map clips at the edges; the warp goes on while the copy engine
    //     reads it;
    //   elements (any n): element by element, a warp's store 32 neighbours
    //     of one row.
    // (C's direct stores from the fragments would write 8 rows a store, 4 or
    // 8 bytes of each sector they touch.)
    template <typename E>
    static __device__ void store_staged(T *C, const CUtensorMap *map, int bt,
                                        int64_t m, int64_t n, int64_t r0,
                                        int64_t c0,
                                        const float (&acc)[kAcc + kRowAcc],
                                        smem_t &sm, E epi, c_store how)
    {
        // C's elements as raw bits (the copy-out moves them unchanged)
        using bits_t = std::conditional_t<kElem == 2, uint16_t, uint32_t>;
        bits_t *d = reinterpret_cast<bits_t *>(C);
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        // the warp's bands of 16 rows: one, or two 64 rows apart (pingpong)
#pragma unroll
        for (int h = 0; h < TEAMS; h++) {
            const int64_t rows =
                r0 + (TEAMS == 1 ? (warp / 4) * 64 : h * 64) + (warp % 4) * 16;
#pragma unroll
            for (int cc = 0; cc < BN / kCols; cc++) {
                // the values first (an epilogue's loads all in flight
                // together), then the stores
                float v[kCols / 8][4];
#pragma unroll
                for (int jj = 0; jj < kCols / 8; jj++) {
                    const int e = h * (BN / 2) + (cc * (kCols / 8) + jj) * 4;
                    const int64_t gc =
                        c0 + cc * kCols + jj * 8 + (lane % 4) * 2;
                    const int64_t gr = rows + lane / 4; // and gr + 8
                    float a[4];
                    epi.addends(gr, gc, a[0], a[1]);
                    if (epi.same_rows()) {
                        a[2] = a[0];
                        a[3] = a[1];
                    }
                    else {
                        epi.addends(gr + 8, gc, a[2], a[3]);
                    }
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        v[jj][q] = epi.apply(acc[e + q], a[q]);
                    }
                }
                const bool tma = how == c_store::tma;
                const int use = h * (BN / kCols) + cc; // the warp's slice uses
                const unsigned sl = slice(sm, warp, tma ? use % kBuffers : 0);
#ifdef GEMSOPS_HAS_WGMMA
                if (tma) { // the store that last read this slice is done
                    if (lane == 0) {
                        bulk_wait_read<kBuffers - 1>();
                    }
                    __syncwarp();
                }
#endif
#pragma unroll
                for (int jj = 0; jj < kCols / 8; jj++) {
#pragma unroll
                    for (int r8 = 0; r8 < 2; r8++) {
                        stage_pair(sl, lane / 4 + 8 * r8, jj * 4 + lane % 4,
                                   v[jj][2 * r8], v[jj][2 * r8 + 1]);
                    }
                }
                if (tma) {
#ifdef GEMSOPS_HAS_WGMMA
                    fence_proxy_async_shared();
                    __syncwarp();
                    if (lane == 0) {
                        tma_store_3d(map, sl, (int)(c0 + cc * kCols),
                                     (int)rows, bt);
                        bulk_commit();
                    }
#else
                    (void)map, (void)bt;
#endif
                    continue;
                }
                __syncwarp();
#pragma unroll // a row's swizzle is then a constant: an element costs an XOR
                for (int row = 0; row < 16; row++) {
#pragma unroll
                    for (int part = 0; part < kCols / 32; part++) {
                        const int col = part * 32 + lane;
                        const int64_t gr = rows + row;
                        const int64_t gc = c0 + cc * kCols + col;
                        if (gr < m && gc < n) {
                            d[gr * n + gc] = ld_shared_bits<bits_t>(
                                sl + slice_at(row, col * kElem));
                        }
                    }
                }
                __syncwarp(); // the slice is rewritten by the next columns
            }
        }
    }

    // CT: the tile at (r0, c0) of C^T[bt] (C is `rows` x `cols`, row
    // stride cols; a tile's rows r0.. are C's columns) as it is, no
    // epilogue. Warp w holds C^T's rows r0 + 16w .. + 15 (C's columns), all
    // BN of its columns; per slice of kCtRows of them its lanes write their
    // values transposed (C's row of kCtRows, 16 columns: 32 bytes), and the
    // slice goes out `how`:
    //   tma: boxes of 16 x 16 through C's map (unswizzled; the map clips at
    //     C's edges), the warp going on while the copy engine reads them;
    //   elements: half a warp a row of 16, bounds-checked.
    static __device__ void store_transposed(T *C, const CUtensorMap *map,
                                            int bt, int64_t cols, int64_t rows,
                                            int64_t r0, int64_t c0,
                                            const float (&acc)[kAcc + kRowAcc],
                                            smem_t &sm, c_store how)
    {
        store_transposed_slice<0>(C, map, bt, cols, rows, r0, c0, acc, sm,
                                  how);
        store_transposed_slice<1>(C, map, bt, cols, rows, r0, c0, acc, sm,
                                  how);
    }

    // Slice CC of store_transposed, tile columns CC * kCtRows on. Its
    // accumulators' indices are constants: an index the compiler cannot
    // resolve puts acc on the stack, and the copy there reads the
    // accumulators while wgmmas are in flight, which makes ptxas serialize
    // every wgmma of the kernel (C7514).
    template <int CC>
    static __device__ void store_transposed_slice(
        T *C, const CUtensorMap *map, int bt, int64_t cols, int64_t rows,
        int64_t r0, int64_t c0, const float (&acc)[kAcc + kRowAcc], smem_t &sm,
        c_store how)
    {
        if constexpr (CT) {
            constexpr int first = CC * kCtRows; // the slice's first column
            constexpr int height = CC == 0 ? kCtRows : BN - kCtRows;
            uint16_t *d = reinterpret_cast<uint16_t *>(C);
            const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
            // C's first column of the warp
            const int64_t col0 = r0 + warp * 16;
            const bool tma = how == c_store::tma;
            const unsigned sl = slice(sm, warp, tma ? CC % kBuffers : 0);
#ifdef GEMSOPS_HAS_WGMMA
            if (tma) { // the store that last read this slice is done
                if (lane == 0) {
                    bulk_wait_read<kBuffers - 1>();
                }
                __syncwarp();
            }
#endif
#pragma unroll
            for (int e = first / 2; e < (first + height) / 2; e++) {
                int r, c;
                coords(e, r, c); // in the tile: r a column of C
                const unsigned at = sl + (c - first) * 32 + (r % 16) * 2;
                asm volatile("st.shared.u16 [%0], %1;" ::"r"(at),
                             "h"(half_bits(acc[e]))
                             : "memory");
            }
            if (tma) {
#ifdef GEMSOPS_HAS_WGMMA
                fence_proxy_async_shared();
                __syncwarp();
                if (lane == 0) {
                    for (int b = 0; b < height / 16; b++) {
                        tma_store_3d(map, sl + b * 512, (int)col0,
                                     (int)(c0 + first + 16 * b), bt);
                    }
                    bulk_commit();
                }
#else
                (void)map, (void)bt;
#endif
                return;
            }
            __syncwarp();
            for (int i = lane; i < height * 16; i += 32) {
                const int64_t gr = c0 + first + i / 16, gc = col0 + i % 16;
                if (gr < rows && gc < cols) {
                    d[gr * cols + gc] = ld_shared_bits<uint16_t>(sl + i * 2);
                }
            }
            __syncwarp(); // the slice is rewritten by the next rows
        }
        else {
            (void)C, (void)map, (void)bt, (void)cols, (void)rows, (void)r0,
                (void)c0, (void)acc, (void)sm, (void)how;
        }
    }

    // An accumulator rounded to T, as raw bits (halves)
    static __device__ __forceinline__ unsigned short half_bits(float v)
    {
        if constexpr (std::is_same_v<T, __half>) {
            return __half_as_ushort(__float2half_rn(v));
        }
        else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
            return __bfloat16_as_ushort(__float2bfloat16_rn(v));
        }
        else {
            return 0;
        }
    }

    // ROWS: the tile's row sums (rows r0.. of A, m in all) into rs (C's
    // type: rounded once; float: a part, as summed): column 0 of the m64n8
    // accumulator, a thread's values 0 and 2.
    template <typename D>
    static __device__ void store_row_sums(D *rs, int64_t m, int64_t r0,
                                          const float (&acc)[kAcc + kRowAcc])
    {
        if constexpr (ROWS) {
#pragma unroll
            for (int e = 0; e < kRowAcc; e += 2) {
                int r, c;
                coords(kAcc + e, r, c);
                if (c % 8 == 0 && r0 + r < m) {
                    rs[r0 + r] = from_acc<D>(acc[kAcc + e]);
                }
            }
        }
        else {
            (void)rs, (void)m, (void)r0, (void)acc;
        }
    }

    // The consumers, at the end of the walk: every TMA store of C has read
    // its slice before the CTA exits and frees them (the writes themselves
    // complete with the grid, as any store's).
    static __device__ void finish()
    {
#ifdef GEMSOPS_HAS_WGMMA
        if (threadIdx.x % 32 == 0) {
            bulk_wait_read<0>();
        }
#endif
    }

    // The consumers: beta * bias[c0 + j] (0 past n) into sm.bias_row for
    // a tile's epilogue, which then reads it from shared memory: one global
    // load per column a tile, where each thread would otherwise load its
    // columns for each of its row groups.
    static __device__ void stage_bias_row(const T *bias, int64_t cs,
                                          int64_t c0, int64_t n, float beta,
                                          smem_t &sm)
    {
        constexpr int kTeamThreads = kConsumers / TEAMS;
        float *row = bias_row(sm);
        tile_sync(); // the previous tile's epilogue read it
        const int first = TEAMS == 1 ? threadIdx.x : threadIdx.x % 128;
        for (int j = first; j < BN; j += kTeamThreads) {
            row[j] =
                c0 + j < n ? beta * widen<float>(bias[(c0 + j) * cs]) : 0.f;
        }
        tile_sync();
    }

    // The staged bias row this thread's tile reads.
    static __device__ __forceinline__ float *bias_row(smem_t &sm)
    {
        return sm.bias_row + (TEAMS == 1 ? 0 : threadIdx.x / 128 * BN);
    }

    // The threads of one tile's epilogue: every consumer (named barrier 1),
    // or the warpgroup's own (pingpong: named barrier 2 + g).
    static __device__ __forceinline__ void tile_sync()
    {
        if constexpr (TEAMS == 1) {
            consumers_sync<kConsumers>();
        }
        else {
            asm volatile("bar.sync %0, 128;" ::"r"(2 + threadIdx.x / 128)
                         : "memory");
        }
    }

    // acc element e of this thread -> (row, col) in the tile
    static __device__ __forceinline__ void coords(int e, int &r, int &c)
    {
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        const int band = TEAMS == 1 ? warp / 4 : e / (BN / 2);
        const int j = (TEAMS == 1 ? e : e % (BN / 2)) / 4, q = e % 4;
        r = band * 64 + (warp % 4) * 16 + lane / 4 + (q / 2) * 8;
        c = j * 8 + (lane % 4) * 2 + q % 2;
    }
};

} // namespace gemsops
