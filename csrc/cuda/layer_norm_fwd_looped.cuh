// LayerNorm forward, the looped kernel (layer_norm_fwd_looped): rows
// longer than the register kernel holds, one CTA a row streaming it twice
// (pass 1 the statistics by Chan's merge, pass 2 the output).
#pragma once

#include "device.cuh"
#include "l2_policy.cuh"
#include "layer_norm_fwd_common.cuh"
#include "reduce.cuh"

namespace gemsops {
namespace {

// hi + lo += t, the rounding error of hi + t kept in lo (Knuth's TwoSum);
// an error that is not finite (an infinite or NaN hi or t) is dropped, so
// lo stays finite and hi carries the non-finite value alone.
template <typename A>
__device__ __forceinline__ void two_sum_into(A &hi, A &lo, A t)
{
    const A s = hi + t;
    const A tb = s - hi;
    const A e = (hi - (s - tb)) + (t - tb);
    hi = s;
    lo += isfinite(e) ? e : A(0);
}

// 1 / n of a count n, correctly rounded; times a numerator it is within
// an ulp of the quotient. Unlike the IEEE division it has no slow-path
// call for the inliner to weigh (inlined or not, that call moved the
// looped kernels' registers from build to build).
__device__ __forceinline__ float rcp_rn(float n)
{
    return __frcp_rn(n);
}
__device__ __forceinline__ double rcp_rn(double n)
{
    return __drcp_rn(n);
}

// Chan's parallel-variance merge of (nb, mb + mbc, m2b) into
// (n, m + mc, m2), each mean carried as a compensated pair. Rounding the
// running mean at every merge would cost up to half an ulp of the mean
// per merge, which is large against the deviations of a row whose mean is
// large against its spread (x = 100 + noise: the output's error grew
// tenfold over torch's); the pair keeps it below one ulp in all.
template <typename A>
__device__ __forceinline__ void chan_merge(A &n, A &m, A &mc, A &m2, A nb,
                                           A mb, A mbc, A m2b)
{
    if (nb == A(0)) {
        return;
    }
    if (n == A(0)) {
        n = nb;
        m = mb;
        mc = mbc;
        m2 = m2b;
        return;
    }
    const A nab = n + nb;
    const A d = (mb - m) + (mbc - mc);
    const A f = nb * rcp_rn(nab);
    two_sum_into(m, mc, d * f);
    m2 += m2b + d * d * n * f;
    n = nab;
}

// The triples of WIDTH consecutive lanes merged down to the first of them,
// in a fixed order (deterministic).
template <int WIDTH, typename A>
__device__ __forceinline__ void chan_merge_down(A &n, A &m, A &mc, A &m2)
{
#pragma unroll
    for (int off = WIDTH / 2; off > 0; off /= 2) {
        const A nb = __shfl_down_sync(0xffffffffu, n, off);
        const A mb = __shfl_down_sync(0xffffffffu, m, off);
        const A mbc = __shfl_down_sync(0xffffffffu, mc, off);
        const A m2b = __shfl_down_sync(0xffffffffu, m2, off);
        chan_merge(n, m, mc, m2, nb, mb, mbc, m2b);
    }
}

// Threads per row in the looped kernel: 512 (more bytes per chunk for
// very long rows; two rows a SM in flight, two CTAs: their registers).
// Where those rows overflow L2 and one a SM fits, 1024 threads a row: pass
// 2 then re-reads from L2. Where neither fits, 1024 gains nothing.
template <typename T>
int looped_block_for(int64_t cols, const device_facts &f)
{
    const int64_t one_row_a_sm = (int64_t)f.sm_count * cols * sizeof(T);
    const bool overflows = 2 * one_row_a_sm > f.l2_bytes;
    const bool one_fits = one_row_a_sm <= f.l2_bytes;
    return overflows && one_fits ? 1024 : 512;
}

// The looped kernel's accesses a chunk: four 16-byte accesses for every
// type, 64 B in flight a thread while pass 1 streams from DRAM (two for
// the half types were slower; six for fp32 gained nothing). The fused add
// loads two operands an access: two accesses keep the same bytes in
// flight, and four spilled.
template <bool ADD>
__host__ __device__ constexpr int looped_accesses()
{
    return ADD ? 2 : 4;
}

// Pass 1's loads of one chunk (columns c0 on; this thread's accesses u
// with u * STEP < lim). The fused add reads x and res once and writes h
// here, read back in pass 2 (one tensor waiting in L2 for it, not two).
template <bool ADD, int STEP, int U, typename T, typename P, int VEC>
__device__ __forceinline__ void looped_load_chunk(const fwd_args<T, P> &a,
                                                  int64_t row, int64_t c0,
                                                  int64_t lim,
                                                  vec_t<T, VEC> (&xv)[U])
{
#pragma unroll
    for (int u = 0; u < U; u++) {
        if (u * STEP >= lim) {
            continue;
        }
        const int64_t c = c0 + u * STEP + threadIdx.x * VEC;
        if constexpr (ADD) {
            xv[u] = load_vec_last<T, VEC>(a.x + row * a.x_stride + c);
            add_rounded(xv[u],
                        load_vec_last<T, VEC>(a.res + row * a.res_stride + c));
            store_vec(a.h + row * a.h_stride + c, xv[u]);
        }
        else {
            xv[u] = load_vec<T, VEC>(a.x + row * a.x_stride + c);
        }
    }
}

// Pass 1 of LayerNorm: each chunk's mean and squared deviations (the
// corrected two-pass step, see the register kernel) merged into a running
// (count, mean, M2) with Chan's formula, then the threads' triples merged
// in a fixed order. Returns rstd; the mean as the pair mu + mu_lo.
template <int BLOCK, int VEC, bool ADD, typename T, typename P>
__device__ __forceinline__ acc_t<T> looped_stats_layer(const fwd_args<T, P> &a,
                                                       int64_t row,
                                                       acc_t<T> &mu,
                                                       acc_t<T> &mu_lo)
{
    using A = acc_t<T>;
    constexpr int U = looped_accesses<ADD>();
    constexpr int STEP = BLOCK * VEC; // columns between accesses
    constexpr int CHUNK = STEP * U;
    constexpr int WARPS = BLOCK / 32;
    static_assert(WARPS <= 32 && (WARPS & (WARPS - 1)) == 0,
                  "the warps' merge: a power of two, one warp's lanes");
    __shared__ A part[4][WARPS];
    __shared__ A stats[3];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    A n = 0, mean = 0, mean_lo = 0, m2 = 0;
    for (int64_t c0 = 0; c0 < a.cols; c0 += CHUNK) {
        const int64_t lim = a.cols - c0 - threadIdx.x * VEC;
        if (lim <= 0) {
            continue;
        }
        vec_t<T, VEC> xv[U];
        looped_load_chunk<ADD, STEP>(a, row, c0, lim, xv);
        A s = 0, cnt = 0;
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (u * STEP < lim) {
#pragma unroll
                for (int v = 0; v < VEC; v++) {
                    s += widen<A>(xv[u].v[v]);
                }
                cnt += VEC;
            }
        }
        const A inv_cnt = rcp_rn(cnt);
        const A cm0 = s * inv_cnt;
        A cm2 = 0, cd = 0;
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (u * STEP < lim) {
#pragma unroll
                for (int v = 0; v < VEC; v++) {
                    const A d = widen<A>(xv[u].v[v]) - cm0;
                    cm2 += d * d;
                    cd += d;
                }
            }
        }
        // the chunk's mean kept as the pair cm0 + sh
        const A sh = cd * inv_cnt;
        const bool fix = isfinite(sh);
        A cm = cm0, cm_lo = 0;
        if (fix) {
            two_sum_into(cm, cm_lo, sh);
        }
        cm2 = fix ? cm2 - cd * sh : cm2;
        chan_merge(n, mean, mean_lo, m2, cnt, cm, cm_lo,
                   cm2 < A(0) ? A(0) : cm2);
    }
    chan_merge_down<32>(n, mean, mean_lo, m2);
    if (lane == 0) {
        part[0][warp] = n;
        part[1][warp] = mean;
        part[2][warp] = mean_lo;
        part[3][warp] = m2;
    }
    __syncthreads();
    // warp 0 merges the warps' triples as a tree in a fixed order (lane w
    // holds warp w's): one thread merging them one after another was a
    // chain of 16 or 32 dependent merges, each with a division, while the
    // CTA waited at the barrier
    if (warp == 0) {
        A tn = 0, tm = 0, tmc = 0, tm2 = 0;
        if (lane < WARPS) {
            tn = part[0][lane];
            tm = part[1][lane];
            tmc = part[2][lane];
            tm2 = part[3][lane];
        }
        chan_merge_down<WARPS>(tn, tm, tmc, tm2);
        if (lane == 0) {
            stats[0] = tm;
            stats[1] = tmc;
            stats[2] = A(1) / sqrt(tm2 / (A)a.cols + a.eps);
        }
    }
    __syncthreads();
    mu = stats[0];
    mu_lo = stats[1];
    return stats[2];
}

// Pass 1 of RMSNorm: the sum of squares alone, one running sum a thread
// and one fixed-order reduction. Returns rstd.
template <int BLOCK, int VEC, bool ADD, typename T, typename P>
__device__ __forceinline__ acc_t<T> looped_stats_rms(const fwd_args<T, P> &a,
                                                     int64_t row)
{
    using A = acc_t<T>;
    constexpr int U = looped_accesses<ADD>();
    constexpr int STEP = BLOCK * VEC;
    constexpr int CHUNK = STEP * U;
    __shared__ A red[2 * 32];
    int parity = 0;
    A sum_sq[1] = {0};
    for (int64_t c0 = 0; c0 < a.cols; c0 += CHUNK) {
        const int64_t lim = a.cols - c0 - threadIdx.x * VEC;
        vec_t<T, VEC> xv[U];
        looped_load_chunk<ADD, STEP>(a, row, c0, lim, xv);
        add_item_squares<STEP>(xv, lim, sum_sq[0]);
    }
    row_sum<BLOCK, 1>(sum_sq, red, parity);
    return rms_rstd(a, sum_sq[0]);
}

// Pass 2's accesses loaded together (below): two where parameters share
// x's type and x is not fp64; fp32 parameters beside half x, or fp64,
// spilled hundreds of bytes at two under the 64-register bound (ptxas), and
// keep one.
template <typename T, typename P>
__host__ __device__ constexpr int looped_pass2_batch()
{
    return std::is_same_v<T, P> && sizeof(T) <= 4 ? 2 : 1;
}

// Pass 2 of the looped kernel: y for one row, walking it backwards (where
// the rows in flight overflow L2, pass 1's last chunks are the likeliest
// still there); y is stored evict-first, so that it does not push out the
// x (or h) lines pass 2 has still to read. A batch of accesses' x, w and b
// is loaded before any is stored: the stores are asm that clobbers memory,
// which no load may pass, so loads issued access by access after the
// previous store waited out one L2 round trip each (SASS). w and b present
// or absent at compile time (with_affine), as in the register kernel:
// tested per element, both paths' values stayed live and batching spilled.
template <bool HAS_W, bool HAS_B, bool RMS, bool ADD, int BLOCK, int VEC,
          typename T, typename P, typename A>
__device__ __forceinline__ void looped_pass2(const fwd_args<T, P> &a,
                                             int64_t row, A mu, A mu_lo,
                                             A rstd)
{
    constexpr int U = looped_accesses<ADD>();
    constexpr int STEP = BLOCK * VEC;
    constexpr int CHUNK = STEP * U;
    constexpr int BATCH = looped_pass2_batch<T, P>();
    static_assert(U % BATCH == 0, "pass 2 takes whole batches of a chunk");
    const int64_t col = threadIdx.x * VEC;
    for (int64_t c0 = (a.cols - 1) / CHUNK * CHUNK; c0 >= 0; c0 -= CHUNK) {
        const int64_t lim = a.cols - c0 - col;
#pragma unroll
        for (int u0 = 0; u0 < U; u0 += BATCH) {
            vec_t<T, VEC> xv[BATCH];
            vec_t<P, VEC> wv[BATCH], bv[BATCH];
#pragma unroll
            for (int k = 0; k < BATCH; k++) {
                if ((u0 + k) * STEP >= lim) {
                    continue;
                }
                const int64_t c = c0 + (u0 + k) * STEP + col;
                // x's (or h's) last read, evict-first: it must not displace
                // the rows still waiting for their pass 2. h is this
                // thread's own pass-1 store of the same columns.
                if constexpr (ADD) {
                    xv[k] =
                        load_vec_own_last<T, VEC>(a.h + row * a.h_stride + c);
                }
                else {
                    xv[k] = load_vec_last<T, VEC>(a.x + row * a.x_stride + c);
                }
                if constexpr (HAS_W) {
                    wv[k] = load_vec<P, VEC>(a.w + c);
                }
                if constexpr (HAS_B) {
                    bv[k] = load_vec<P, VEC>(a.b + c);
                }
            }
#pragma unroll
            for (int k = 0; k < BATCH; k++) {
                if ((u0 + k) * STEP >= lim) {
                    continue;
                }
                const int64_t c = c0 + (u0 + k) * STEP + col;
                A xf[VEC], wf[VEC], bf[VEC], out[VEC];
                widen_vec<A>(xv[k], xf);
                if constexpr (!RMS) { // x - mu exact for x near a large mu
#pragma unroll
                    for (int v = 0; v < VEC; v++) {
                        xf[v] -= mu;
                    }
                }
                if constexpr (HAS_W) {
                    widen_vec<A>(wv[k], wf);
                }
                if constexpr (HAS_B) {
                    widen_vec<A>(bv[k], bf);
                }
                affine<HAS_W, HAS_B>(xf, RMS ? A(0) : mu_lo, rstd, wf, bf,
                                     out);
                store_rounded_last<T, VEC>(a.y + row * a.y_stride + c, out);
            }
        }
    }
}

// The looped kernel's resident CTAs an SM: 1024 threads; fp64, 512 in one
// CTA (pass 2 over fp64 spilled at 64 registers, ptxas).
template <typename T>
constexpr int looped_min_ctas(int block)
{
    return sizeof(T) == 8 ? 1 : 1024 / block;
}

// layer_norm_fwd_looped: one CTA a row, pass 1 the statistics, pass 2 the
// output.
template <typename T, typename P, int VEC, int BLOCK, bool RMS, bool ADD>
__global__ void __launch_bounds__(BLOCK, looped_min_ctas<T>(BLOCK))
    layer_norm_fwd_looped(const fwd_args<T, P> a)
{
    using A = acc_t<T>;
    for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
        // x - mu is exact for x near a large mu; the low part follows
        A mu = 0, mu_lo = 0, rstd;
        if constexpr (RMS) {
            rstd = looped_stats_rms<BLOCK, VEC, ADD>(a, row);
        }
        else {
            rstd = looped_stats_layer<BLOCK, VEC, ADD>(a, row, mu, mu_lo);
        }
        with_affine<RMS>(a.w, a.b, [&](auto has_w, auto has_b) {
            constexpr bool W = decltype(has_w)::value;
            constexpr bool B = decltype(has_b)::value;
            looped_pass2<W, B, RMS, ADD, BLOCK, VEC>(a, row, mu, mu_lo, rstd);
        });
        if (threadIdx.x == 0 && a.rstd) {
            if (a.mean) {
                a.mean[row] = mu + mu_lo;
            }
            a.rstd[row] = rstd;
        }
        __syncthreads(); // pass 1's shared scratch serves the next row
    }
}

} // namespace
} // namespace gemsops
