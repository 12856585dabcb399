// The driver of the Stream-K matmul: it walks a CTA's share of the
// schedule (include/gemsops/streamk.h) over a mainloop
// (matmul_mainloops.cuh), adds split tiles up and sends C out through the
// epilogue. Three kernels: matmul_streamk_kernel walks any schedule;
// matmul_tiles_kernel whole tiles alone (tiles_walk: no Stream-K code),
// for the warp-specialized mainloops; matmul_splitk_kernel split-k, a
// tile's pieces one cluster whose partials meet in distributed shared
// memory (split_walk).
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
// thread 0), in the same order. An owner waits only for lower-numbered
// CTAs, which start before it, and the grid never holds more CTAs than
// are co-resident: no wait is on a CTA that cannot run.
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
// _by_thread after the product (matmul_row_sums.cu).
//
// Bytes: A and B are read once per tile they feed (tiles_n and tiles_m
// times), C written once; Stream-K adds 2 x 16 KB per split tile.
//
// Included by matmul_streamk.cu alone.
#pragma once

#include "matmul_mainloops.cuh"
#include "pdl.cuh"

namespace gemsops {
namespace {

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

} // namespace
} // namespace gemsops
