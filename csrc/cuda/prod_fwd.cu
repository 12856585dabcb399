// prod forward on CUDA: out = prod x over every element, or along one dim.
//
// Math: a product of n values as a tree (per-thread lanes, then shuffles
// across the threads of a row, then shared memory across warps, then the
// CTAs' partials), never one serial chain. Floats multiply in fp32 (fp64
// in fp64); bool and integers in uint64 = torch's wrapping int64 product.
//
// Work split (prod_plan.cuh names the layouts):
//   rows (reduced dim innermost, and every dense full product): G threads
//     per row, G = the power of two that gives each thread about eight
//     16-byte vectors, up to the whole CTA; when there are fewer long rows
//     than resident CTAs, each row splits over several CTAs, each writing
//     a partial. Splits interleave (CTA s takes every splits-th stretch of
//     G vectors): all CTAs stream through one window of memory, which DRAM
//     serves faster than a thousand separate streams (docs/performance.md,
//     prod). On sm_90, rows that take a whole CTA (G = 256) in 16-byte
//     vectors are streamed by the copy engine instead (prod_bulk.cuh),
//     split and interleaved the same way in 16 KB chunks.
//   cols (reduced dim outer or middle, kept columns unit-stride): a CTA
//     covers TX column vectors x 256/TX rows: a warp reads TX vectors of
//     each of 32/TX rows (coalesced), each thread walks down its column
//     vector; the TY partial products meet as a tree in shared memory.
//     Few column blocks: TX shrinks (down to 4) before the reduced dim
//     splits over CTAs (at most ~8 partials per output). An input that
//     fits in L2 is read evict-first (prod_cols_kernel).
//   generic (anything else: kept dims that do not coalesce, the reduced
//     dim strided with no unit-stride column): a thread per output.
//   A CTA per work item; splits are sized to fill one wave of resident
//   CTAs (the occupancy calculator's count). Whole rows load eight vectors
//   a thread at once with a 128-byte L2 fetch hint (prod_reduce.cuh).
//   Partials (fp32/fp64/uint64) are multiplied by one small second launch
//   (a warp per output, or a CTA when the partials are many; for columns
//   32 adjacent outputs per CTA, its warps striding the splits), in a fixed
//   order: the same result every run. On sm_90 it is a programmatic
//   dependent launch, scheduled while the first grid finishes.
//   No host sync.
//
// Bytes: the input once (numel * sizeof(T)) + the output + partials
// (splits * outputs * sizeof(acc), under 1% for the planned splits).
//
// Test: python -m pytest tests/test_prod.py -m cuda. Time: python -m
// pytest benchmark/test_reduction_perf.py -k prod_forward, or one case:
// python tools/prod_time.py 4096,4096:d1:float16; A/B a change with
// tools/ab.sh. Measurements: docs/performance.md.
#include "prod_bulk.cuh"

namespace gemsops {
namespace {

// ---- generic: a thread per line ----------------------------------------
template <typename T>
struct prod_generic_args {
    const T *x;
    int64_t lines, len, step; // outputs, reduced extent and its stride
    int kept_ndim; // the kept dims (coalesced), row-major
    int64_t kept_sizes[GEMSOPS_MAX_DIMS], kept_strides[GEMSOPS_MAX_DIMS];
    prod_out<T> *out; // partial == NULL: out[line]
    prod_acc<T> *partial; // else partial[line] (full, non-dense x)
};

template <typename T>
__global__ void __launch_bounds__(kProdBlock)
    prod_generic_kernel(const prod_generic_args<T> a)
{
    using A = prod_acc<T>;
    pdl_launch_dependents();
    for (int64_t line = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
         line < a.lines; line += (int64_t)gridDim.x * blockDim.x) {
        int64_t off = 0, k = line;
        for (int d = a.kept_ndim - 1; d >= 0; d--) {
            off += k % a.kept_sizes[d] * a.kept_strides[d];
            k /= a.kept_sizes[d];
        }
        A acc[2] = {A(1), A(1)}; // two chains: half the dependency depth
        int64_t r = 0;
        for (; r + 1 < a.len; r += 2) {
            acc[0] *= prod_load<A>(a.x[off + r * a.step]);
            acc[1] *= prod_load<A>(a.x[off + (r + 1) * a.step]);
        }
        if (r < a.len) {
            acc[0] *= prod_load<A>(a.x[off + r * a.step]);
        }
        const A v = acc[0] * acc[1];
        if (a.partial != nullptr) {
            a.partial[line] = v;
        }
        else {
            a.out[line] = prod_store<prod_out<T>>(v);
        }
    }
}

// ---- combine: out[o, i] = prod_s partial[(o * splits + s) * inner + i] --
template <typename T>
struct prod_combine_args {
    const prod_acc<T> *partial;
    int64_t outer, splits, inner;
    int G; // inner == 1: threads per output (32, or the CTA for many splits)
    prod_out<T> *out;
};

// A programmatic dependent of the first launch on sm_90: scheduled while
// that grid finishes, it waits here until the partials are complete and
// visible. Hiding the launch gap measured faster on small and large full
// products and on columns (docs/performance.md, prod).
template <typename T>
__global__ void __launch_bounds__(kProdBlock)
    prod_combine_kernel(const prod_combine_args<T> a)
{
    using A = prod_acc<T>;
    pdl_wait_primary();
    if (a.inner == 1) { // G lanes stride one output's partials
        __shared__ A warp_part[kProdBlock / 32];
        const int per_cta = kProdBlock / a.G, lane = threadIdx.x % a.G;
        for (int64_t b = blockIdx.x; b < ceil_div(a.outer, per_cta);
             b += gridDim.x) {
            const int64_t o = b * per_cta + threadIdx.x / a.G;
            A v[4] = {A(1), A(1), A(1), A(1)}; // four loads in flight
            if (o < a.outer) {
                const A *p = a.partial + o * a.splits;
                int64_t s = lane;
                for (; s + 3 * a.G < a.splits; s += 4 * a.G) {
#pragma unroll
                    for (int u = 0; u < 4; u++) {
                        v[u] *= p[s + u * a.G];
                    }
                }
                for (; s < a.splits; s += a.G) {
                    v[0] *= p[s];
                }
            }
            const A r = prod_group(prod_fold<4>(v), a.G, warp_part);
            if (lane == 0 && o < a.outer) {
                a.out[o] = prod_store<prod_out<T>>(r);
            }
        }
        return;
    }
    // columns: a CTA takes 32 adjacent outputs (coalesced), its 8 warps
    // stride the splits, and the 8 partial products meet in shared memory
    __shared__ A red[kProdBlock];
    const int64_t iblocks = ceil_div(a.inner, 32);
    const int lane = threadIdx.x % 32, sl = threadIdx.x / 32;
    for (int64_t b = blockIdx.x; b < a.outer * iblocks; b += gridDim.x) {
        const int64_t o = b / iblocks, i = b % iblocks * 32 + lane;
        A v = A(1);
        if (i < a.inner) {
            for (int64_t s = sl; s < a.splits; s += kProdBlock / 32) {
                v *= a.partial[(o * a.splits + s) * a.inner + i];
            }
        }
        red[threadIdx.x] = v;
        __syncthreads();
        if (sl == 0 && i < a.inner) {
#pragma unroll
            for (int w = 1; w < kProdBlock / 32; w++) {
                v *= red[w * 32 + lane];
            }
            a.out[o * a.inner + i] = prod_store<prod_out<T>>(v);
        }
        __syncthreads();
    }
}

// ---- the plan ------------------------------------------------------------
struct fwd_plan {
    prod_layout l;
    bool vec; // 16-byte accesses are legal
    prod_rows_shape rows; // kind == rows
    prod_cols_shape cols; // kind == cols
    bool l2_hint; // rows: U = 8 loads, 128-byte L2 fetches
    bool bulk; // rows: prod_bulk_kernel (sm_90)
    bool evict_first; // cols, bulk: evict-first loads or copies
    int64_t partials; // accumulator values in the workspace
    int64_t ctas; // work items of the first launch
    int grid; // its CTAs (at most one resident wave)
    bool pdl; // the combine as a programmatic dependent (sm_90)
};

// The columns kernel for a plan: 16-byte vectors, evict-first where the
// plan asks (prod_cols_kernel says when), or one element at a time.
template <typename T>
void (*cols_kernel(const fwd_plan &pl))(prod_cols_args<T>)
{
    constexpr int V = prod_vec<T>();
    if constexpr (sizeof(T) * V == 16) {
        if (pl.vec && pl.evict_first) {
            return prod_cols_kernel<T, V, true>;
        }
    }
    return pl.vec ? prod_cols_kernel<T, V> : prod_cols_kernel<T, 1>;
}

// Rows the copy engine streams (prod_bulk.cuh): rows long enough to take a
// whole CTA, in 16-byte vectors, of an input larger than L2, on sm_90.
// There it measured faster than the rows kernel on full products in every
// float type and equal or faster on long per-dim rows. Inputs that fit in
// L2 keep the rows kernel: there the bulk kernel was equal in eager timing
// but slower in graph replays (docs/performance.md, prod).
template <typename T>
constexpr bool bulk_type()
{
    return prod_vec<T>() * sizeof(T) == 16; // not the 1-byte types
}

inline bool bulk_rows(const fwd_plan &pl, const device_facts &f, int64_t bytes)
{
#ifdef GEMSOPS_HAVE_SM90A
    const bool sm90 = f.cc_major == 9 && f.cc_minor == 0;
#else
    const bool sm90 = false;
#endif
    return sm90 && pl.vec && pl.rows.G == kProdBlock && bytes > f.l2_bytes;
}

// The bulk kernel's split and grid: rows split over the resident CTAs (a
// split takes at least four chunks), each CTA looping over its items.
// Copies are evict-first where whole rows stream through many CTAs and
// normal where every CTA shares one window of one row: each measured faster
// than the other priority there (docs/performance.md, prod).
template <typename T>
int plan_bulk(fwd_plan &pl, int dev, gemsops_status *st)
{
    int resident = 1;
    if (resident_ctas((const void *)prod_bulk_kernel<T>, dev, kBulkThreads,
                      kBulkSmem, &resident, st) != GEMSOPS_OK) {
        return st->code;
    }
    const prod_layout &l = pl.l;
    const int64_t chunks = ceil_div(l.len * (int64_t)sizeof(T), kBulkChunk);
    int64_t s = resident / l.outer;
    const int64_t most = chunks / 4;
    s = s < most ? s : most;
    s = s < 1 ? 1 : s;
    pl.bulk = true;
    pl.l2_hint = false;
    pl.evict_first = l.outer >= resident;
    pl.rows.splits = s;
    pl.partials = s > 1 ? l.outer * s : 0;
    pl.ctas = l.outer * s;
    pl.grid = (int)(pl.ctas < resident ? pl.ctas : resident);
    return GEMSOPS_OK;
}

template <typename T>
int plan_fwd(const gemsops_prod_params *p, fwd_plan *out, gemsops_status *st)
{
    constexpr int V = prod_vec<T>();
    const int dev = p->x.device_id;
    fwd_plan pl{};
    device_facts f;
    if (get_device_facts(dev, &f, st) != GEMSOPS_OK) {
        return st->code;
    }
    pl.pdl = f.cc_major >= 9;
    pl.l = prod_layout_of(&p->x, p->dim);
    const prod_layout &l = pl.l;
    const bool base_ok = (uintptr_t)p->x.data % 16 == 0;
    int resident = 1;
    if (l.kind == prod_kind::rows) {
        pl.vec = base_ok && l.len % V == 0 && l.outer_stride % V == 0;
        const void *k = pl.vec ? (const void *)prod_rows_kernel<T, V>
                               : (const void *)prod_rows_kernel<T, 1>;
        if (resident_ctas(k, dev, kProdBlock, 0, &resident, st) !=
            GEMSOPS_OK) {
            return st->code;
        }
        const int64_t nvec = pl.vec ? l.len / V : l.len;
        int64_t G = pow2_ceil(ceil_div(nvec, 8)); // 8 vectors a thread
        G = G > kProdBlock ? kProdBlock : G;
        prod_rows_shape &r = pl.rows;
        r.G = (int)G;
        r.splits = 1;
        r.seg = nvec;
        if (G == kProdBlock) { // long rows: split them to fill one wave
            // (splitting long rows in two measured slower than a CTA per
            // row, so rows >= resident CTAs stay whole; docs/performance.md,
            // prod)
            int64_t s = resident / l.outer;
            const int64_t most = nvec / (kProdBlock * 4);
            s = s < most ? s : most;
            s = s < 1 ? 1 : s;
            r.seg = ceil_div(nvec, s);
            r.splits = ceil_div(nvec, r.seg);
        }
        pl.partials = r.splits > 1 ? l.outer * r.splits : 0;
        pl.l2_hint = pl.vec && r.splits == 1;
        pl.ctas = ceil_div(l.outer, kProdBlock / r.G) * r.splits;
        if constexpr (bulk_type<T>()) {
            const int64_t bytes =
                gemsops_tensor_numel(&p->x) * (int64_t)sizeof(T);
            if (bulk_rows(pl, f, bytes) &&
                plan_bulk<T>(pl, dev, st) != GEMSOPS_OK) {
                return st->code;
            }
        }
    }
    else if (l.kind == prod_kind::cols) {
        pl.vec = base_ok && l.inner % V == 0 && l.outer_stride % V == 0 &&
                 l.step % V == 0;
        pl.evict_first =
            pl.vec &&
            gemsops_tensor_numel(&p->x) * (int64_t)sizeof(T) <= f.l2_bytes;
        const void *k = (const void *)cols_kernel<T>(pl);
        if (resident_ctas(k, dev, kProdBlock, 0, &resident, st) !=
            GEMSOPS_OK) {
            return st->code;
        }
        prod_cols_shape &c = pl.cols;
        c = prod_cols_base(l, pl.vec ? V : 1);
        // Few column blocks: narrower CTAs (more of them, each deeper down
        // the reduced dim) before splitting rows across CTAs, so that a
        // split stays at 8 or fewer partials per output.
        while (c.tx > 4 && l.outer * c.iblocks * 8 < resident) {
            c.tx /= 2;
            c.iblocks = ceil_div(c.ivecs, c.tx);
        }
        const int TY = kProdBlock / c.tx;
        const int64_t base = l.outer * c.iblocks;
        int64_t s = resident / base;
        const int64_t most = l.len / (TY * 8); // >= 8 rows per thread
        s = s < most ? s : most;
        s = s < 1 ? 1 : s;
        c.rchunk = ceil_div(l.len, s);
        c.splits = ceil_div(l.len, c.rchunk);
        pl.partials = c.splits > 1 ? l.outer * c.splits * l.inner : 0;
        pl.ctas = base * c.splits;
    }
    else {
        const int64_t lines = prod_generic_lines(l);
        pl.partials = l.full_lines ? lines : 0;
        pl.ctas = ceil_div(lines, kProdBlock); // a CTA per 256 lines
    }
    // a CTA per work item: the hardware keeps every SM fed as CTAs finish
    // (measured faster than a resident wave looping over the items;
    // docs/performance.md, prod)
    pl.grid = pl.bulk ? pl.grid : prod_grid(pl.ctas);
    *out = pl;
    return GEMSOPS_OK;
}

template <typename T>
int64_t workspace_bytes(const fwd_plan &pl)
{
    return pl.partials * (int64_t)sizeof(prod_acc<T>);
}

template <typename T>
int launch(const gemsops_prod_params *p, gemsops_status *st)
{
    using A = prod_acc<T>;
    using O = prod_out<T>;
    constexpr int V = prod_vec<T>();
    device_guard guard;
    GEMSOPS_CUDA_CHECK(st, guard.enter(p->x.device_id));
    fwd_plan pl;
    if (plan_fwd<T>(p, &pl, st) != GEMSOPS_OK) {
        return st->code;
    }
    if (workspace_bytes<T>(pl) > p->workspace_bytes) {
        return gemsops_fail(st, GEMSOPS_ERR_VALUE,
                            "prod(): workspace of %lld bytes is too small; "
                            "the plan needs %lld (ask prod_workspace)",
                            (long long)p->workspace_bytes,
                            (long long)workspace_bytes<T>(pl));
    }
    const prod_layout &l = pl.l;
    cudaStream_t stream = (cudaStream_t)p->stream;
    const T *x = (const T *)p->x.data;
    O *out = (O *)p->out;
    A *part = pl.partials > 0 ? (A *)p->workspace : nullptr;
    const int grid = pl.grid;
    prod_combine_args<T> c{part, 1, 1, 1, 32, out};
    if (l.kind == prod_kind::rows) {
        const prod_rows_args<T> a{x,
                                  l.outer,
                                  l.outer_stride,
                                  pl.vec ? l.len / V : l.len,
                                  pl.rows.G,
                                  pl.rows.splits,
                                  pl.rows.seg,
                                  true,
                                  out,
                                  part};
        if (pl.bulk) {
            if constexpr (bulk_type<T>()) {
                const prod_bulk_args<T> b{x,
                                          l.outer,
                                          l.outer_stride,
                                          l.len * (int64_t)sizeof(T),
                                          pl.rows.splits,
                                          pl.evict_first,
                                          out,
                                          part};
                prod_bulk_kernel<T>
                    <<<grid, kBulkThreads, kBulkSmem, stream>>>(b);
            }
        }
        else if (pl.vec) {
            if (pl.l2_hint) {
                prod_rows_kernel<T, V, true, 8>
                    <<<grid, kProdBlock, 0, stream>>>(a);
            }
            else {
                prod_rows_kernel<T, V><<<grid, kProdBlock, 0, stream>>>(a);
            }
        }
        else {
            prod_rows_kernel<T, 1><<<grid, kProdBlock, 0, stream>>>(a);
        }
        GEMSOPS_CUDA_CHECK_LAUNCH(st, pl.bulk ? "prod_bulk_kernel"
                                              : "prod_rows_kernel");
        c = {part, l.outer, pl.rows.splits, 1, 32, out};
    }
    else if (l.kind == prod_kind::cols) {
        const prod_cols_shape &cs = pl.cols;
        const prod_cols_args<T> a{x,         l.outer,   l.outer_stride,
                                  l.len,     l.step,    l.inner,
                                  cs.tx,     cs.ivecs,  cs.iblocks,
                                  cs.splits, cs.rchunk, true,
                                  out,       part};
        cols_kernel<T>(pl)<<<grid, kProdBlock, 0, stream>>>(a);
        GEMSOPS_CUDA_CHECK_LAUNCH(st, "prod_cols_kernel");
        c = {part, l.outer, cs.splits, l.inner, 32, out};
    }
    else {
        prod_generic_args<T> a{};
        a.x = x;
        a.lines = prod_generic_lines(l);
        a.len = l.len;
        a.step = l.step;
        a.kept_ndim = l.kept_ndim;
        for (int k = 0; k < l.kept_ndim; k++) {
            a.kept_sizes[k] = l.kept_sizes[k];
            a.kept_strides[k] = l.kept_strides[k];
        }
        a.out = out;
        a.partial = part;
        prod_generic_kernel<T><<<grid, kProdBlock, 0, stream>>>(a);
        GEMSOPS_CUDA_CHECK_LAUNCH(st, "prod_generic_kernel");
        c = {part, 1, a.lines, 1, 32, out};
    }
    if (part != nullptr) {
        // a CTA per output when the partials are many (a warp would walk
        // them in splits / 128 dependent rounds)
        c.G = c.inner == 1 && c.splits >= 4 * kProdBlock ? kProdBlock : 32;
        const int64_t ctas = c.inner == 1 ? ceil_div(c.outer * c.G, kProdBlock)
                                          : c.outer * ceil_div(c.inner, 32);
        GEMSOPS_CUDA_CHECK(st,
                           launch_dependent(prod_combine_kernel<T>,
                                            dim3((unsigned)prod_grid(ctas)),
                                            dim3(kProdBlock), stream, pl.pdl,
                                            c));
    }
    return GEMSOPS_OK;
}

template <typename T>
int query(const gemsops_prod_params *p, int64_t *bytes, gemsops_status *st)
{
    device_guard guard;
    GEMSOPS_CUDA_CHECK(st, guard.enter(p->x.device_id));
    fwd_plan pl;
    if (plan_fwd<T>(p, &pl, st) != GEMSOPS_OK) {
        return st->code;
    }
    *bytes = workspace_bytes<T>(pl);
    return GEMSOPS_OK;
}

// The one dtype switch. Bool is stored as one byte 0/1: uint8's product.
template <template <typename> class F, typename... Args>
int dispatch(gemsops_dtype dt, gemsops_status *st, Args... args)
{
    switch (dt) {
    case GEMSOPS_FLOAT32: return F<float>::run(args..., st);
    case GEMSOPS_FLOAT64: return F<double>::run(args..., st);
    case GEMSOPS_FLOAT16: return F<__half>::run(args..., st);
    case GEMSOPS_BFLOAT16: return F<__nv_bfloat16>::run(args..., st);
    case GEMSOPS_BOOL:
    case GEMSOPS_UINT8: return F<uint8_t>::run(args..., st);
    case GEMSOPS_INT8: return F<int8_t>::run(args..., st);
    case GEMSOPS_INT16: return F<int16_t>::run(args..., st);
    case GEMSOPS_INT32: return F<int32_t>::run(args..., st);
    case GEMSOPS_INT64: return F<int64_t>::run(args..., st);
    default:
        return gemsops_fail(st, GEMSOPS_ERR_TYPE,
                            "prod: unsupported dtype %s on CUDA",
                            gemsops_dtype_name(dt));
    }
}

template <typename T>
struct launch_fn {
    static int run(const gemsops_prod_params *p, gemsops_status *st)
    {
        return launch<T>(p, st);
    }
};
template <typename T>
struct query_fn {
    static int run(const gemsops_prod_params *p, int64_t *bytes,
                   gemsops_status *st)
    {
        return query<T>(p, bytes, st);
    }
};

} // namespace
} // namespace gemsops

extern "C" int gemsops_prod_cuda(const struct gemsops_prod_params *p,
                                 gemsops_status *st)
{
    if (gemsops_tensor_numel(&p->x) == 0 && p->dim >= 0 &&
        p->x.sizes[p->dim] != 0) {
        return GEMSOPS_OK; // no outputs
    }
    return gemsops::dispatch<gemsops::launch_fn>(p->x.dtype, st, p);
}

extern "C" int gemsops_prod_workspace_cuda(const struct gemsops_prod_params *p,
                                           int64_t *bytes, gemsops_status *st)
{
    return gemsops::dispatch<gemsops::query_fn>(p->x.dtype, st, p, bytes);
}
