// Stream-K matmul on CUDA: C[b] = A[b] . B[b], fp32 accumulation. This
// file plans and launches; the kernels are the driver's
// (matmul_driver.cuh) over one of the mainloops (matmul_mainloops.cuh).
//
// Schedule: include/gemsops/streamk.h (shared with the CPU executor and the
// C-level schedule test). Grid: ctas persistent CTAs, never more than are
// co-resident (the occupancy calculator's count); an owner waits only for
// lower-numbered CTAs, which start before it.
//
// Mainloops, the most capable one the operands allow (pick_mainloop):
//   wgmma (matmul_wgmma.cuh, sm_90a): fp16/bf16 with A and B each K- or
//     MN-contiguous, whole aligned 16-byte chunks (fp32 as TF32, both
//     K-contiguous): 128 x 64, x 128, x 192 or x 256 tiles, 64 x 64, 192 x
//     192, the pingpong 128 x 128, and tiles of 80, 96 or 160 rows x 128
//     columns (80 or 96 x 64) of C through the swapped product C^T = B^T
//     A^T (halves, A K-contiguous, B N-contiguous, no epilogue;
//     transposed_product); warpgroup MMA from a TMA-filled ring
//     (tensor maps encoded per launch, matmul_tensor_maps.cu). Operands TMA
//     cannot describe are staged first (matmul_stage.cuh). The tile and
//     the schedule: the cost model (matmul_cost.cuh);
//   mma (matmul_mma.cuh, sm_80+): fp16/bf16 with A K-contiguous, B either
//     way, whole aligned 16-byte chunks: 128 x 128 tiles on tensor cores
//     (mma.sync + ldmatrix + a 3-stage cp.async ring);
//   skinny (matmul_skinny.cu, kernels of their own): at most 16 rows
//     against an N-contiguous B, where plan_skinny takes them; launch()
//     hands such products over before planning tiles;
//   ffma (matmul_mainloops.cuh): everything else (fp32 exact, any strides,
//     any alignment): 128 x 128 tiles, 256 threads of 8 x 8 outputs,
//     k-steps of 8 widened to fp32 in two shared-memory stages (each
//     element one bounds-checked load, mapped so that the unit-stride
//     direction is coalesced).
//
// Workspace (the caller's, sized by a first call that reports `need`):
// staged operands, then the Stream-K partials, then the row sums' parts;
// flags after them (the partials' and the rows' counters).
//
// Test: python -m pytest tests/test_matmul.py -m cuda (the schedule
// itself: tests/test_streamk_schedule.py, no GPU). Time: python -m pytest
// benchmark/test_blas_perf.py, or one shape: python tools/mm_probe.py 8192
// 8192 8192; A/B a change with tools/ab.sh. Measurements:
// docs/performance.md.
#include <algorithm>

#include "common.cuh"
#include "gemsops/matmul.h"
#include "matmul_cost.cuh"
#include "matmul_driver.cuh"
#include "matmul_row_sums.cuh"
#include "matmul_skinny.cuh"
#include "matmul_stage.cuh"
#include "matmul_tensor_maps.cuh"

namespace gemsops {
namespace {

constexpr int kGroupM = 8;

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
    // the kernel computes C^T = B^T A^T (transposed_product's operands) and
    // writes it as C; the schedule is of C^T
    bool transposed;
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
    k.transposed = false;
    k.mainloop = m;
    k.layout = l;
    return k;
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

// The swapped product's tiles (GEMSOPS_MAINLOOP_WGMMA_80X128, ...): halves
// with A K-contiguous and B N-contiguous, so that A' = B^T is M-contiguous
// and B' = A^T K-contiguous (their one kernel layout); C's rows 16-byte
// aligned for its TMA stores; no epilogue and no row sums.
bool transposable(const gemsops_matmul_params *p, const tc_layout &tl)
{
    return (p->dtype == GEMSOPS_FLOAT16 || p->dtype == GEMSOPS_BFLOAT16) &&
           tl.a_k && tl.b_n && p->bias == nullptr && p->alpha == 1.0f &&
           p->row_sums == nullptr && p->n % 8 == 0 &&
           (uintptr_t)p->c % 16 == 0;
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
        const wgmma_plan w =
            wgmma_cheapest(p, want, f.sm_count, kGroupM, transposable(p, tl));
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

// The swapped product's (l: its layouts, A' M-contiguous and B' K-contiguous,
// as transposable() asks of the product)
template <typename T, int BN, int BM = 128>
kernel_choice wgmma_transposed_choice(gemsops_mainloop m, const tc_layout &l)
{
    if constexpr (std::is_same_v<T, float>) { // (halves alone reach here)
        return wgmma_choice<T, 128>(GEMSOPS_MAINLOOP_WGMMA_128, l, false);
    }
    else {
        kernel_choice k =
            choice<T, wgmma_tc_transposed<T, BN, true, BM>>(64, m, l);
        k.transposed = true;
        return k;
    }
}

template <typename T>
kernel_choice choose_typed(gemsops_mainloop m, const tc_layout &l, bool rows)
{
    switch (m) {
    case GEMSOPS_MAINLOOP_WGMMA_80X128:
        return wgmma_transposed_choice<T, 80>(m, l);
    case GEMSOPS_MAINLOOP_WGMMA_96X128:
        return wgmma_transposed_choice<T, 96>(m, l);
    case GEMSOPS_MAINLOOP_WGMMA_160X128:
        return wgmma_transposed_choice<T, 160>(m, l);
    case GEMSOPS_MAINLOOP_WGMMA_80X64:
        return wgmma_transposed_choice<T, 80, 64>(m, l);
    case GEMSOPS_MAINLOOP_WGMMA_96X64:
        return wgmma_transposed_choice<T, 96, 64>(m, l);
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
    default:
        return choice<T, ffma_mainloop<T>>(ffma_mainloop<T>::BK,
                                           GEMSOPS_MAINLOOP_FFMA, l);
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
    // the operands the kernel reads: the swapped product's for its tiles
    const gemsops_matmul_params t =
        wgmma_transposed(m) ? transposed_product(p) : *p;
    const tc_layout ttl = wgmma_transposed(m) ? tma_layout_of(&t) : tl;
    tma_operand oa, ob;
    tma_operands(&t, ttl, wgmma_bm(m), wgmma_bn(m), &oa, &ob);
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
    if (choose_dtype(p->dtype, m, wgmma ? ttl : l, p->row_sums != nullptr, k,
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
    // the product the kernel computes: C^T's for the swapped product's tiles
    const int64_t m = k->transposed ? p->n : p->m,
                  n = k->transposed ? p->m : p->n;
    // a mainloop without a Stream-K walk runs a Stream-K or hybrid schedule
    // asked for as whole tiles, and split-k too where it has no split-k
    // kernel
    if (!k->stream_k &&
        (k->sk_mode != GEMSOPS_SK_SPLIT_K || k->splitk.fn == nullptr)) {
        k->sk_mode = GEMSOPS_SK_DATA_PARALLEL;
    }
    gemsops_sk_plan(s, m, n, p->k, p->batch, k->bm, k->bn, k->bk, kGroupM,
                    ctas, k->sk_mode, p->two_tiles);
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
        gemsops_sk_plan(s, m, n, p->k, p->batch, k->bm, k->bn, k->bk, kGroupM,
                        ctas, GEMSOPS_SK_DATA_PARALLEL, 0);
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
        return p->row_sums != nullptr ? matmul_row_sums(p, st) : GEMSOPS_OK;
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
    // the operands the kernel reads (the swapped product's for its tiles)
    const gemsops_matmul_params e = k.transposed ? transposed_product(&q) : q;
    a.ta = k.ta;
    a.tb = k.tb;
    a.a = e.a;
    a.b = e.b;
    a.c = p->c;
    a.a_bs = e.a_bs;
    a.a_rs = e.a_rs;
    a.a_cs = e.a_cs;
    a.b_bs = e.b_bs;
    a.b_rs = e.b_rs;
    a.b_cs = e.b_cs;
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
    // a bias; the swapped product's in unswizzled boxes of 16 x 16); else,
    // or where the driver refuses C's map, element stores
    const int64_t esize = (int64_t)gemsops_dtype_size(p->dtype);
    a.c_how = c_store::elements;
    if (p->n % (16 / esize) == 0 && (uintptr_t)p->c % 16 == 0 &&
        k.mainloop >= GEMSOPS_MAINLOOP_WGMMA_128) {
        const tma_operand oc{p->c, p->n,       p->m,
                             p->n, p->batch,   p->m * p->n,
                             16,   (int)esize, k.transposed ? 16 : 0};
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
        return matmul_row_sums(p, st);
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

extern "C" int gemsops_matmul_cuda(const struct gemsops_matmul_params *p,
                                   struct gemsops_matmul_need *need,
                                   gemsops_status *st)
{
    return gemsops::launch(p, need, st);
}
