// prod forward, long rows on sm_90: the copy engine streams each row
// through a ring of shared-memory stages; the threads only multiply.
//
// Math: as prod_rows_kernel (prod_reduce.cuh): per-thread lanes, shuffles,
// the warps through shared memory, the CTAs' partials in the combine.
//
// Work split: a row of `len` elements is cut into chunks of kBulkChunk
// bytes (the last one shorter). Work items are (row, split) pairs; item i
// belongs to CTA i % grid, and split s of a row takes its chunks s,
// s + splits, s + 2 * splits, ...: when one row (a full product) is split
// over every CTA, all CTAs stream through one window of memory, as the
// interleaved rows kernel does. One producer thread (warp 8, lane 0) walks
// the CTA's chunks and issues one bulk copy per chunk into the next free
// stage; 256 consumer threads wait for the stage, multiply it (thread t
// takes the stage's 16-byte vectors t, t + 256, ...), and each frees the
// stage with an arrive. A consumer lane's chain runs over every chunk
// of its item: long chains, as the interleaved loop's (prod_rows_kernel
// says why that matters for products near one).
//
// Why: with loads, bytes in flight are bounded by registers (U loads of 16
// bytes a thread, issued in batches); here by the ring (kBulkStages x
// kBulkChunk a CTA), and the issuing takes one thread.
//
// Bytes: the input once; outputs or partials (one accumulator per item).
#pragma once

#include "prod_reduce.cuh"

namespace gemsops {

// 16 KB stages, eight of them: 128 KB in flight a SM (one CTA). Larger or
// smaller stages and fewer or more of them measured the same or slower
// (docs/performance.md, prod).
constexpr int kBulkChunk = 16384;
constexpr int kBulkStages = 8;
constexpr int kBulkThreads = kProdBlock + 32; // consumers + producer
constexpr int kBulkSmem = kBulkChunk * kBulkStages;

template <typename T>
struct prod_bulk_args {
    const T *x;
    int64_t rows, row_stride; // elements between row starts (16-byte multiple)
    int64_t row_bytes; // len * sizeof(T), a multiple of 16
    int64_t splits; // CTAs per row
    bool evict_first; // the copies' L2 priority (plan_bulk says when)
    prod_out<T> *out; // splits == 1: out[row]
    prod_acc<T> *partial; // else partial[row * splits + split]
};

// A stage's position in the ring: index and the parity of its phase.
struct bulk_ring {
    int stage = 0;
    unsigned phase = 0;
    __device__ __forceinline__ void next()
    {
        if (++stage == kBulkStages) {
            stage = 0;
            phase ^= 1;
        }
    }
};

// Bytes of chunk c of a row: what the producer copies and the consumers
// then multiply (the last chunk of a row may be short).
__device__ __forceinline__ unsigned bulk_chunk_bytes(int64_t row_bytes,
                                                     int64_t c)
{
    const int64_t left = row_bytes - c * kBulkChunk;
    return (unsigned)(left < kBulkChunk ? left : kBulkChunk);
}

template <typename T>
__global__ void __launch_bounds__(kBulkThreads, 1)
    prod_bulk_kernel(const prod_bulk_args<T> a)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    using A = prod_acc<T>;
    constexpr int V = 16 / sizeof(T);
    extern __shared__ __align__(128) unsigned char ring_mem[];
    __shared__ __align__(8) uint64_t full[kBulkStages], empty[kBulkStages];
    __shared__ A warp_part[2][kProdBlock / 32];
    pdl_launch_dependents();
    const unsigned ring0 = smem_addr(ring_mem);
    const unsigned full0 = smem_addr(full), empty0 = smem_addr(empty);
    if (threadIdx.x == 0) {
        for (int st = 0; st < kBulkStages; st++) {
            mbar_init(full0 + 8 * st, 1); // the producer's arrive
            mbar_init(empty0 + 8 * st, kProdBlock); // every consumer
        }
        mbar_init_fence();
    }
    __syncthreads();
    const int64_t items = a.rows * a.splits;
    const int64_t chunks = ceil_div(a.row_bytes, kBulkChunk);
    bulk_ring ring;
    if (threadIdx.x >= kProdBlock) { // the producer warp: one thread issues
        if (threadIdx.x == kProdBlock) {
            const uint64_t policy = a.evict_first ? l2_evict_first_policy()
                                                  : l2_evict_normal_policy();
            for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
                const char *row =
                    (const char *)(a.x + item / a.splits * a.row_stride);
                for (int64_t c = item % a.splits; c < chunks; c += a.splits) {
                    const unsigned bytes = bulk_chunk_bytes(a.row_bytes, c);
                    // the previous use of the stage has been read by all
                    mbar_wait(empty0 + 8 * ring.stage, ring.phase ^ 1);
                    mbar_expect_tx(full0 + 8 * ring.stage, bytes);
                    bulk_load(ring0 + ring.stage * kBulkChunk,
                              row + c * kBulkChunk, bytes,
                              full0 + 8 * ring.stage, policy);
                    ring.next();
                }
            }
        }
        return;
    }
    const int warp = threadIdx.x / 32;
    int parity = 0;
    for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
        A acc[V];
#pragma unroll
        for (int k = 0; k < V; k++) {
            acc[k] = A(1);
        }
        for (int64_t c = item % a.splits; c < chunks; c += a.splits) {
            const int nvec = (int)(bulk_chunk_bytes(a.row_bytes, c) / 16);
            const vec_t<T, V> *st = reinterpret_cast<const vec_t<T, V> *>(
                ring_mem + ring.stage * kBulkChunk);
            mbar_wait(full0 + 8 * ring.stage, ring.phase);
            if (nvec == kBulkChunk / 16) {
                vec_t<T, V> w[kBulkChunk / 16 / kProdBlock];
#pragma unroll
                for (int u = 0; u < kBulkChunk / 16 / kProdBlock; u++) {
                    w[u] = st[threadIdx.x + u * kProdBlock];
                }
#pragma unroll
                for (int u = 0; u < kBulkChunk / 16 / kProdBlock; u++) {
                    prod_mul_raw(acc, w[u]);
                }
            }
            else {
                for (int v = threadIdx.x; v < nvec; v += kProdBlock) {
                    prod_mul_raw(acc, st[v]);
                }
            }
            // every consumer arrives for its own reads of the stage, so the
            // barrier itself orders each read before the next copy into it
            // (one arrive per warp after __syncwarp is an ordering that
            // compute-sanitizer's racecheck does not follow: it reported
            // a hazard)
            mbar_arrive(empty0 + 8 * ring.stage);
            ring.next();
        }
        // the item's product: lanes, the warp, then the eight warps (a
        // named barrier of the consumers, not prod_group's __syncthreads:
        // the producer warp has left; warp_part alternates between items
        // so one barrier an item suffices)
        A v = prod_fold<V>(acc);
        for (int off = 16; off > 0; off /= 2) {
            v *= __shfl_xor_sync(0xffffffffu, v, off);
        }
        if (threadIdx.x % 32 == 0) {
            warp_part[parity][warp] = v;
        }
        asm volatile("bar.sync 1, %0;" ::"n"(kProdBlock) : "memory");
        if (threadIdx.x == 0) {
#pragma unroll
            for (int w = 1; w < kProdBlock / 32; w++) {
                v *= warp_part[parity][w];
            }
            const int64_t row = item / a.splits;
            if (a.partial != nullptr) {
                a.partial[item] = v;
            }
            else {
                a.out[row] = prod_store<prod_out<T>>(v);
            }
        }
        parity ^= 1;
    }
#else
    (void)a;
    __trap(); // the host launches it on sm_90 only
#endif
}

} // namespace gemsops
