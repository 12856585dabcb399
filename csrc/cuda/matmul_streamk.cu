// Stream-K matmul on CUDA: C[b] = A[b] . B[b], fp32 accumulation.
//
// Schedule: include/gemsops/streamk.h (shared with the CPU executor and the
// C-level schedule test). Grid: ctas persistent CTAs, never more than are
// co-resident (the occupancy calculator's count), so every owner's peers
// run while it waits.
//
// Work split (this kernel, the exact FFMA path): a CTA computes a 64 x 64
// tile with 256 threads, 4 x 4 outputs each, in k-steps of 16: A and B
// panels are widened to fp32 into shared memory (any strides, any
// alignment: each element is one bounds-checked load, mapped so that the
// unit-stride direction is coalesced), then 16 rank-1 updates. A tensor-core
// mainloop (mma.sync + ldmatrix + cp.async) slots in behind the same
// schedule and fix-up; it is not written yet.
//
// Fix-up: a peer writes its 64 x 64 fp32 partial to its slot (element e of
// thread t at e * 256 + t: coalesced), fences, and thread 0 raises the
// CTA's flag to this launch's epoch with a release store. The owner's
// thread 0 waits for each peer's flag in CTA order with acquire loads
// (giving up after spin_limit polls in debug mode: error = 1), and the CTA
// adds the partial read through L2 (ld.cg: L1 is not coherent). Flags are
// never reset: the next launch uses a new epoch.
//
// Bytes: A and B are read once per tile they feed (tiles_n and tiles_m
// times), C written once; Stream-K adds 2 x 16 KB per split tile.
#include "common.cuh"
#include "gemsops/matmul.h"

namespace gemsops {
namespace {

constexpr int kBM = 64, kBN = 64, kBK = 16, kThreads = 256, kGroupM = 8;

struct matmul_args {
    gemsops_sk_schedule s;
    const void *a, *b;
    void *c;
    int64_t a_bs, a_rs, a_cs, b_bs, b_rs, b_cs;
    float *partials;        // [ctas][kBM * kBN] when sk_tiles > 0
    unsigned *flags;        // [ctas]
    unsigned epoch;
    int64_t spin_limit;     // 0: wait as long as it takes
    int *error;
};

template <typename T> __device__ __forceinline__ float widen(T v)
{
    return to_acc<float>(v);
}

template <typename T>
__device__ void tile_mac(const matmul_args &p, int64_t tile, int64_t k0,
                         int64_t k1, float (&acc)[4][4],
                         float (*as)[kBM + 4], float (*bs)[kBN + 4])
{
    int64_t bt, tm, tn;
    gemsops_sk_tile_coords(&p.s, tile, &bt, &tm, &tn);
    const T *A = (const T *)p.a + bt * p.a_bs;
    const T *B = (const T *)p.b + bt * p.b_bs;
    const int64_t r0 = tm * kBM, c0 = tn * kBN;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
    for (int i = 0; i < 4; i++) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            acc[i][j] = 0.f;
        }
    }
    const bool a_k_unit = p.a_cs == 1, b_n_unit = p.b_cs == 1;
    for (int64_t kt = k0; kt < k1; kt++) {
        const int64_t kb = kt * kBK;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int idx = threadIdx.x + e * kThreads;
            // A panel [kBM x kBK]: consecutive threads along its unit stride
            const int ai = a_k_unit ? idx / kBK : idx % kBM;
            const int aq = a_k_unit ? idx % kBK : idx / kBM;
            const int64_t gr = r0 + ai, gk = kb + aq;
            as[aq][ai] = (gr < p.s.m && gk < p.s.k)
                             ? widen(A[gr * p.a_rs + gk * p.a_cs])
                             : 0.f;
            // B panel [kBK x kBN]
            const int bj = b_n_unit ? idx % kBN : idx / kBK;
            const int bq = b_n_unit ? idx / kBN : idx % kBK;
            const int64_t gc = c0 + bj, gk2 = kb + bq;
            bs[bq][bj] = (gc < p.s.n && gk2 < p.s.k)
                             ? widen(B[gk2 * p.b_rs + gc * p.b_cs])
                             : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int q = 0; q < kBK; q++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                a[i] = as[q][ty * 4 + i];
                b[i] = bs[q][tx * 4 + i];
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
                }
            }
        }
        __syncthreads();
    }
}

template <typename T>
__device__ void tile_store(const matmul_args &p, int64_t tile,
                           const float (&acc)[4][4])
{
    int64_t bt, tm, tn;
    gemsops_sk_tile_coords(&p.s, tile, &bt, &tm, &tn);
    T *C = (T *)p.c + bt * p.s.m * p.s.n;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int64_t r = tm * kBM + ty * 4 + i;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int64_t c = tn * kBN + tx * 4 + j;
            if (r < p.s.m && c < p.s.n) {
                C[r * p.s.n + c] = from_acc<T>(acc[i][j]);
            }
        }
    }
}

__device__ __forceinline__ void release_store(unsigned *f, unsigned v)
{
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(f), "r"(v)
                 : "memory");
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    matmul_streamk_kernel(const matmul_args p)
{
    __shared__ float as[kBK][kBM + 4];
    __shared__ float bs[kBK][kBN + 4];
    __shared__ int give_up;
    float acc[4][4];
    const int64_t c = blockIdx.x;
    constexpr int kTile = kBM * kBN;
    int64_t it, end;
    gemsops_sk_range(&p.s, c, &it, &end);
    while (it < end) {
        int64_t tile, k0, k1;
        it = gemsops_sk_piece(&p.s, it, end, &tile, &k0, &k1);
        tile_mac<T>(p, tile, k0, k1, acc, as, bs);
        if (k0 > 0) { // a peer: publish the partial
            float *slot = p.partials + c * kTile;
#pragma unroll
            for (int e = 0; e < 16; e++) {
                slot[e * kThreads + threadIdx.x] = acc[e / 4][e % 4];
            }
            __threadfence();
            __syncthreads();
            if (threadIdx.x == 0) {
                release_store(p.flags + c, p.epoch);
            }
            continue;
        }
        for (int64_t q = gemsops_sk_next_peer(&p.s, tile, c); q >= 0;
             q = gemsops_sk_next_peer(&p.s, tile, q)) {
            if (threadIdx.x == 0) {
                int64_t spins = 0;
                give_up = 0;
                while (acquire_load(p.flags + q) != p.epoch) {
                    if (p.spin_limit > 0 && ++spins > p.spin_limit) {
                        give_up = 1;
                        atomicExch(p.error, 1);
                        break;
                    }
                }
            }
            __syncthreads();
            if (give_up) {
                return; // the host raises: error = 1
            }
            const float *slot = p.partials + q * kTile;
#pragma unroll
            for (int e = 0; e < 16; e++) {
                acc[e / 4][e % 4] += __ldcg(slot + e * kThreads + threadIdx.x);
            }
            __syncthreads(); // give_up is rewritten for the next peer
        }
        tile_store<T>(p, tile, acc);
    }
    for (int64_t t = c; t < p.s.dp_tiles; t += p.s.ctas) {
        tile_mac<T>(p, t, 0, p.s.iters, acc, as, bs);
        tile_store<T>(p, t, acc);
    }
}

const void *kernel_for(gemsops_dtype dt)
{
    switch (dt) {
    case GEMSOPS_FLOAT32: return (const void *)matmul_streamk_kernel<float>;
    case GEMSOPS_FLOAT16: return (const void *)matmul_streamk_kernel<__half>;
    case GEMSOPS_BFLOAT16:
        return (const void *)matmul_streamk_kernel<__nv_bfloat16>;
    default: return nullptr;
    }
}

int plan(const gemsops_matmul_params *p, gemsops_sk_schedule *s,
         gemsops_status *st)
{
    const void *k = kernel_for(p->dtype);
    if (k == nullptr) {
        return gemsops_fail(st, GEMSOPS_ERR_TYPE,
                            "matmul: unsupported dtype %s on CUDA",
                            gemsops_dtype_name(p->dtype));
    }
    int resident = 1;
    if (resident_ctas(k, p->device_id, kThreads, &resident, st) !=
        GEMSOPS_OK) {
        return st->code;
    }
    int64_t ctas = resident;
    if (p->ctas_override > 0 && p->ctas_override < ctas) {
        ctas = p->ctas_override; // never more than fit at once
    }
    gemsops_sk_plan(s, p->m, p->n, p->k, p->batch, kBM, kBN, kBK, kGroupM,
                    ctas, p->mode, p->two_tiles);
    return GEMSOPS_OK;
}

int launch(const gemsops_matmul_params *p, gemsops_status *st)
{
    device_guard guard;
    GEMSOPS_CUDA_CHECK(st, guard.enter(p->device_id));
    matmul_args a{};
    if (plan(p, &a.s, st) != GEMSOPS_OK) {
        return st->code;
    }
    if (a.s.tiles == 0) {
        return GEMSOPS_OK;
    }
    const int64_t need = a.s.sk_tiles > 0 ? a.s.ctas * kBM * kBN * 4 : 0;
    if (p->workspace_bytes < need || p->flag_count < a.s.ctas ||
        p->epoch == 0) {
        return gemsops_fail(st, GEMSOPS_ERR_VALUE,
                            "matmul(): workspace %lld bytes (needs %lld), "
                            "%lld flags (needs %lld), epoch %u (needs > 0)",
                            (long long)p->workspace_bytes, (long long)need,
                            (long long)p->flag_count, (long long)a.s.ctas,
                            p->epoch);
    }
    a.a = p->a;
    a.b = p->b;
    a.c = p->c;
    a.a_bs = p->a_bs;
    a.a_rs = p->a_rs;
    a.a_cs = p->a_cs;
    a.b_bs = p->b_bs;
    a.b_rs = p->b_rs;
    a.b_cs = p->b_cs;
    a.partials = (float *)p->workspace;
    a.flags = p->flags;
    a.epoch = p->epoch;
    a.spin_limit = p->spin_limit;
    a.error = p->error;
    cudaStream_t stream = (cudaStream_t)p->stream;
    const unsigned grid = (unsigned)a.s.ctas;
    switch (p->dtype) {
    case GEMSOPS_FLOAT32:
        matmul_streamk_kernel<float><<<grid, kThreads, 0, stream>>>(a);
        break;
    case GEMSOPS_FLOAT16:
        matmul_streamk_kernel<__half><<<grid, kThreads, 0, stream>>>(a);
        break;
    case GEMSOPS_BFLOAT16:
        matmul_streamk_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(a);
        break;
    default:
        return gemsops_fail(st, GEMSOPS_ERR_TYPE,
                            "matmul: unsupported dtype %s on CUDA",
                            gemsops_dtype_name(p->dtype));
    }
    GEMSOPS_CUDA_CHECK_LAUNCH(st, "matmul_streamk_kernel");
    return GEMSOPS_OK;
}

} // namespace
} // namespace gemsops

extern "C" int gemsops_matmul_plan_cuda(const struct gemsops_matmul_params *p,
                                        struct gemsops_sk_schedule *s,
                                        gemsops_status *st)
{
    gemsops::device_guard guard;
    GEMSOPS_CUDA_CHECK(st, guard.enter(p->device_id));
    return gemsops::plan(p, s, st);
}

extern "C" int gemsops_matmul_cuda(const struct gemsops_matmul_params *p,
                                   gemsops_status *st)
{
    return gemsops::launch(p, st);
}
