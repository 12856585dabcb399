// LayerNorm forward: y = (x - mean) * rstd * w + b, per row of N elements;
// RMSNorm the same with mean = 0 and no bias. Each kernel is compiled apart
// for RMSNorm (template RMS): its statistic is the sum of squares alone
// (rms_rstd), and its output has no centring and no bias.
//
// Three kernels, chosen by N (each in a header of its own:
// layer_norm_fwd_short.cuh, _registers.cuh, _looped.cuh; what they share in
// layer_norm_fwd_common.cuh); this file chooses among them and launches the
// first two, layer_norm_fwd_looped.cu the third (and picks its block):
//
// layer_norm_fwd_short_rows (16-byte accesses, N of 1, 2, 4, 8 or 16 of
// them): G = N / VEC lanes a row, each thread one vector of four rows, so
// that a warp's access covers whole consecutive rows; and rows of 64 (32
// lanes, two vectors of two rows a thread: run_warp_rows). Statistics: the
// corrected two-pass step below.
//
// layer_norm_fwd_registers (N <= TPR_max * E): TPR consecutive threads own
// a row, each holding E elements in registers (four 16-byte accesses;
// eight for fp32 rows past 5120 and for fp32 rows of one warp that fit one
// wave, fwd_fp32_long_tpr and fwd_fp32_one_wave_tpr; one for too few rows
// to fill the GPU at four, fwd_one_access_tpr; two for half rows of 64
// threads that fill one wave, fwd_half_one_wave_tpr, and the fused add's
// long half rows; three for rows of 32 or 64 threads that four would leave
// a quarter empty, fwd_three_access_tpr),
// so x is read from memory exactly once. Rows that fill every item of
// groups of 8 to 32 threads (N = TPR * E), and every row at three
// accesses, have kernels of their own with no per-item bounds
// (items_end).
// Statistics in one pass and one reduction (stats_shifted): the sums of
// d = x - K and of d^2, K the mean of the row's first accesses (row_shift),
// near the row's mean, so that sum(d^2) - sum(d)^2 / N keeps the variance's
// digits; a row whose mean lies far from K against its spread, or whose sums
// are not finite, takes a second pass around the mean found. That second
// pass, and the variant of the fused add and of the scalar kernel
// (stats_two_pass, a row sum first), are the corrected two-pass step: the
// squared deviations from a first mean, summed with the deviations
// themselves, which correct the mean and the variance (the first mean's
// rounding error would otherwise stay in every x - mean, and with a small eps
// a constant row would normalize to +-1 instead of 0). Short rows pack
// several per CTA. One CTA per row group, not persistent: the SM overlaps one
// CTA's reductions with another's loads.
//
// layer_norm_fwd_looped (longer rows): one CTA per row streams it twice.
// Pass 1 takes chunks of 4 accesses per thread, computes each chunk's mean
// and squared deviations in registers and merges them into a running
// (count, mean, M2) with Chan's formula; the CTA merges the threads' triples
// in a fixed order (RMSNorm: a running sum of squares, then one sum).
// Pass 2 re-reads x (mostly from L2: the rows in flight fit in it up to
// ~64K half elements; pass 2's reads are evict-first, so they do not push
// out rows still waiting for theirs) and writes y. The
// fused add reads x and res once and h back in pass 2 (each thread its own
// pass-1 stores).
//
// Bytes: read x once (twice from L2 for long rows), write y once, plus 2
// stats per row; the fused add also reads res once and writes h once (long
// rows read h back from L2, not x); weight and bias (N elements each) come
// from L2.
//
// Test: python -m pytest tests/test_layer_norm.py -m cuda -k "forward or
// row_lengths". Time: python -m pytest benchmark/test_layer_norm_perf.py
// -k forward, or one case: python tools/ln_time.py 8192,8192:fwd:bfloat16;
// A/B a change with tools/ab.sh. Measurements behind the choices below:
// docs/performance.md.
#include <type_traits>
#include <utility>

#include "cuda_check.cuh"
#include "device.cuh"
#include "gemsops/layer_norm.h"
#include "gemsops/tensor.h"
#include "layer_norm_fwd_registers.cuh"
#include "layer_norm_fwd_short.cuh"
#include "layer_norm_plan.cuh"

namespace gemsops {
namespace {

// Whole rows (items_end) have kernels of their own where a row is a warp
// or less at four accesses: groups of 8 to 32 threads (rows of fewer
// whole vectors take the short-rows kernel), whose few elements a row
// weigh least against each item's branches.
constexpr bool fwd_whole_rows_group(int tpr)
{
    return tpr >= 8 && tpr <= 32;
}

// Whether rows of cols elements fill every item of a group of tpr threads
// holding elems each, and the group has a whole-rows kernel.
constexpr bool fwd_takes_whole_rows(int tpr, int elems, int64_t cols)
{
    return fwd_whole_rows_group(tpr) && cols == (int64_t)tpr * elems;
}

template <int TPR, int VEC, int ACC>
constexpr bool fwd_has_whole_rows_kernel()
{
    return VEC > 1 && ACC == 4 && fwd_whole_rows_group(TPR);
}

template <typename T, typename P, bool RMS, int TPR, int VEC, bool ADD,
          int ACC>
void launch_registers(const gemsops_layer_norm_fwd_params *p, unsigned grid,
                      int block)
{
    cudaStream_t stream = (cudaStream_t)p->stream;
    if constexpr (ACC == 3) { // whole rows only (fwd_three_access_tpr)
        layer_norm_fwd_registers<T, P, TPR, VEC, RMS, ADD, ACC, true>
            <<<grid, block, 0, stream>>>(make_args<T, P>(p));
        return;
    }
    if constexpr (fwd_has_whole_rows_kernel<TPR, VEC, ACC>()) {
        if (fwd_takes_whole_rows(TPR, fwd_elems<T, ACC>(), p->cols)) {
            layer_norm_fwd_registers<T, P, TPR, VEC, RMS, ADD, ACC, true>
                <<<grid, block, 0, stream>>>(make_args<T, P>(p));
            return;
        }
    }
    layer_norm_fwd_registers<T, P, TPR, VEC, RMS, ADD, ACC, false>
        <<<grid, block, 0, stream>>>(make_args<T, P>(p));
}

// Whether the fused add of x of type T has three-access kernels: half
// types only (the fp32 fused add was no faster at three than at four;
// fwd_three_access_tpr).
template <typename T>
constexpr bool fwd_add_three_access()
{
    return sizeof(T) == 2;
}

// The groups of the two-access kernels: the fused add's half rows past
// 2048 elements (fwd_add_two_access_tpr), and the plain half rows of one
// wave (fwd_half_one_wave_tpr). Each family is built for its own groups
// alone.
constexpr int kFwdTwoAccessTprChoices[] = {256, 320, 384, 512, 640, 1024};
constexpr int kFwdHalfOneWaveTprChoices[] = {96, 128};

template <const auto &CHOICES>
constexpr bool fwd_group_listed(int tpr)
{
    for (int c : CHOICES) {
        if (c == tpr) {
            return true;
        }
    }
    return false;
}

// The fused add (x's partner res given) is its own instantiation of each
// kernel: it loads twice the bytes a step, and sharing one body with a
// run-time branch spilled the looped kernel under its register bound.
template <typename T, typename P, bool RMS, int TPR, int VEC, int ACC = 4>
int run(const gemsops_layer_norm_fwd_params *p, gemsops_status *st)
{
    const int64_t rows_per_cta = layer_norm_block_threads(TPR) / TPR;
    const unsigned grid =
        fwd_grid((p->rows + rows_per_cta - 1) / rows_per_cta);
    const int block = layer_norm_block_threads(TPR);
    // eight accesses a thread only for the plain norms (fwd_fp32_long_tpr,
    // fwd_fp32_one_wave_tpr), two at each family's own groups
    // (kFwdTwoAccessTprChoices, kFwdHalfOneWaveTprChoices), three for the
    // fused add of half types only (fwd_add_three_access)
    if (p->residual) {
        if constexpr (ACC == 8 || (ACC == 3 && !fwd_add_three_access<T>()) ||
                      (ACC == 2 &&
                       !fwd_group_listed<kFwdTwoAccessTprChoices>(TPR))) {
            return gemsops_fail(st, GEMSOPS_ERR_RUNTIME,
                                "layer_norm_fwd: no %d-access kernel for "
                                "the fused add of %s",
                                ACC, gemsops_dtype_name(p->dtype));
        }
        else {
            launch_registers<T, P, RMS, TPR, VEC, true, ACC>(p, grid, block);
        }
    }
    else {
        if constexpr (ACC == 2 &&
                      !(sizeof(T) == 2 && std::is_same_v<T, P> &&
                        fwd_group_listed<kFwdHalfOneWaveTprChoices>(TPR))) {
            return gemsops_fail(st, GEMSOPS_ERR_RUNTIME,
                                "layer_norm_fwd: no two-access kernel "
                                "without the fused add for %s",
                                gemsops_dtype_name(p->dtype));
        }
        else {
            launch_registers<T, P, RMS, TPR, VEC, false, ACC>(p, grid, block);
        }
    }
    GEMSOPS_CUDA_CHECK_LAUNCH(st, "layer_norm_fwd_registers");
    return GEMSOPS_OK;
}

template <typename T, typename P, bool RMS, int G, int VEC, bool ADD,
          int L = 1>
int run_short(const gemsops_layer_norm_fwd_params *p, gemsops_status *st)
{
    constexpr int64_t cta_rows = 4 * (fwd_elems<T>() / VEC / L) * (32 / G);
    const unsigned grid = fwd_grid((p->rows + cta_rows - 1) / cta_rows);
    layer_norm_fwd_short_rows<T, P, G, L, VEC, RMS, ADD>
        <<<grid, 128, 0, (cudaStream_t)p->stream>>>(make_args<T, P>(p));
    GEMSOPS_CUDA_CHECK_LAUNCH(st, "layer_norm_fwd_short_rows");
    return GEMSOPS_OK;
}

// Rows of 1, 2, 4, 8 or 16 whole vectors go to the short-rows kernel
// (returns false for the others): there a row's lanes are neighbours and
// one warp access covers whole lines of several rows, where the register
// kernel gives a row of 8 vectors two threads of four and a warp access
// touches a sector of each of 16 rows (16 vectors: four threads, two
// sectors of each of 8 rows). Where the register kernel gives a row eight
// or more threads, its instructions already cover whole lines.
// (LayerNorm's rows of 8 ran slower here than in the register kernel on
// an H100, faster on an H200; docs/performance.md.)
template <typename T, typename P, bool RMS, int VEC, bool ADD>
bool run_short_rows(const gemsops_layer_norm_fwd_params *p, int *rc,
                    gemsops_status *st)
{
    switch (p->cols / VEC) {
    case 1: *rc = run_short<T, P, RMS, 1, VEC, ADD>(p, st); return true;
    case 2: *rc = run_short<T, P, RMS, 2, VEC, ADD>(p, st); return true;
    case 4: *rc = run_short<T, P, RMS, 4, VEC, ADD>(p, st); return true;
    case 8: *rc = run_short<T, P, RMS, 8, VEC, ADD>(p, st); return true;
    case 16: *rc = run_short<T, P, RMS, 16, VEC, ADD>(p, st); return true;
    default: return false;
    }
}

// RMSNorm's rows of 64 whole vectors (half 512 elements, fp32 256), and
// LayerNorm's of bf16 x, go to the short-rows kernel at 32 lanes a row,
// two vectors a lane and two rows a thread (returns false for the others),
// where the register kernel gives each thread one row of 16 lanes and
// loads and widens w and b for it alone: here a thread's w and b serve two
// rows, as compiled torch's two rows a warp do. LayerNorm's fp16 rows and
// its fused add ran slower there: its three reduced values a row take a
// fifth round of shuffles at 32 lanes, and its two-pass statistics widen
// fp16 x twice, an instruction an element that bf16's shift does not
// need. Rows of 32 vectors at four rows a thread ran slower in every norm
// (docs/performance.md). Asked only where rows are many enough for four
// accesses (fwd_one_access_tpr). Not fp64.
template <typename T, typename P, bool RMS, int VEC, bool ADD>
bool run_warp_rows(const gemsops_layer_norm_fwd_params *p, int *rc,
                   gemsops_status *st)
{
    constexpr bool TAKEN =
        sizeof(T) < 8 && (RMS || (std::is_same_v<T, __nv_bfloat16> && !ADD));
    if constexpr (TAKEN) {
        if (p->cols == 64 * VEC) {
            *rc = run_short<T, P, RMS, 32, VEC, ADD, 2>(p, st);
            return true;
        }
    }
    return false;
}

template <typename T, typename P>
bool vector_ok(const gemsops_layer_norm_fwd_params *p)
{
    return layer_norm_vectors_fit<T, P>(p->cols,
                                        {p->x_row_stride, p->y_row_stride,
                                         p->residual_row_stride,
                                         p->h_row_stride},
                                        {p->x, p->y, p->residual, p->h},
                                        {p->weight, p->bias});
}

// Launches the kernel of ACC accesses a thread whose group is tpr, one of
// the list CHOICES; a group wider than fwd_max_tpr allows has no kernel
// (fp64 stops at 512). `kind` names the family in the error for a group
// without one.
template <typename T, typename P, bool RMS, int VEC, int ACC,
          const auto &CHOICES, size_t... I>
int run_group(const gemsops_layer_norm_fwd_params *p, int tpr,
              const char *kind, gemsops_status *st, std::index_sequence<I...>)
{
    int rc = GEMSOPS_OK;
    const auto launch_if = [&](auto group) {
        constexpr int TPR = decltype(group)::value;
        if constexpr (TPR <= fwd_max_tpr<T>()) {
            if (tpr == TPR) {
                rc = run<T, P, RMS, TPR, VEC, ACC>(p, st);
                return true;
            }
        }
        return false;
    };
    if ((launch_if(std::integral_constant<int, CHOICES[I]>{}) || ...)) {
        return rc;
    }
    return gemsops_fail(st, GEMSOPS_ERR_RUNTIME,
                        "layer_norm_fwd: no %skernel for %d threads/row", kind,
                        tpr);
}

// BUILT: whether the family has kernels for (T, P) at all (the one-, two-
// and eight-access families are built for a few pairs only); a family
// asked of a pair it lacks is an error, not a launch.
template <typename T, typename P, bool RMS, int VEC, int ACC,
          const auto &CHOICES, bool BUILT = true>
int dispatch_group(const gemsops_layer_norm_fwd_params *p, int tpr,
                   const char *kind, gemsops_status *st)
{
    if constexpr (BUILT) {
        constexpr size_t n = sizeof(CHOICES) / sizeof(CHOICES[0]);
        return run_group<T, P, RMS, VEC, ACC,
                         CHOICES>(p, tpr, kind, st,
                                  std::make_index_sequence<n>{});
    }
    return gemsops_fail(st, GEMSOPS_ERR_RUNTIME,
                        "layer_norm_fwd: no %skernel for %s", kind,
                        gemsops_dtype_name(p->dtype));
}

// fp32 rows past 320 threads of 16 elements (N > 5120) take 32 elements a
// thread, as the half types' rows do: at 16 a thread their groups of 384
// to 1024 threads leave one or two CTAs an SM, each idle through its own
// barriers; eight accesses a thread take half the threads, twice the CTAs
// an SM. The half types at 64 elements a thread and the fused add (x and
// res in flight at once) ran slower (docs/performance.md). Returns the
// group, 0 for the rows that keep four accesses.
constexpr int kFwdEightAccessTprChoices[] = {32, 192, 256, 320, 384, 512};

template <typename T>
int fwd_fp32_long_tpr(int64_t cols, bool add)
{
    if (!std::is_same_v<T, float> || add ||
        cols <= 320 * (int64_t)fwd_elems<T>()) {
        return 0;
    }
    return layer_norm_choose_shape(cols, fwd_elems<T, 8>(), 512,
                                   kFwdEightAccessTprChoices)
        .tpr;
}

// One 16-byte access a thread, for rows too few to give every SM 512
// threads at four accesses (rows x TPR threads in all): four times the
// threads, each with one load to wait for and a quarter of the adds before
// its row's reduction. Only where parameters share x's type and x is not
// fp64 (the other pairs are no transformer's shape; fewer kernels). Returns
// the group, 0 for the rows that keep four accesses, -1 on an error.
constexpr int kFwdOneAccessTprChoices[] = {32, 64, 96, 128, 160, 192, 256};

template <typename T, typename P>
int fwd_one_access_tpr(const gemsops_layer_norm_fwd_params *p, int tpr4,
                       gemsops_status *st)
{
    constexpr int V = 16 / sizeof(T);
    if (!std::is_same_v<T, P> || sizeof(T) == 8 || p->cols > 256 * V) {
        return 0;
    }
    device_facts f;
    if (get_device_facts(p->device_id, &f, st) != GEMSOPS_OK) {
        return -1;
    }
    // up to 512 rather than 256: fp32 1024 x 1000 (496 threads an SM at
    // four) gained in all four norms. Whole rows (items_end) stop at 256:
    // with no per-item branches their four accesses overtook one from 256
    // threads an SM (4096 x 512 half, 8192 x 256 half, 4096 x 256 fp32)
    const bool whole = fwd_takes_whole_rows(tpr4, fwd_elems<T>(), p->cols);
    if (p->rows * tpr4 >= (int64_t)f.sm_count * (whole ? 256 : 512)) {
        return 0;
    }
    return layer_norm_choose_shape(p->cols, V, 256, kFwdOneAccessTprChoices)
        .tpr;
}

// Whether the rows, threads_a_row threads each, fill three quarters to all
// of one wave of threads_an_sm resident threads on every SM: 1 if so, 0 if
// not, -1 on an error.
int fwd_rows_fill_one_wave(const gemsops_layer_norm_fwd_params *p,
                           int64_t threads_an_sm, int64_t threads_a_row,
                           gemsops_status *st)
{
    device_facts f;
    if (get_device_facts(p->device_id, &f, st) != GEMSOPS_OK) {
        return -1;
    }
    const int64_t wave = (int64_t)f.sm_count * threads_an_sm;
    const int64_t threads = p->rows * threads_a_row;
    return threads <= wave && 4 * threads >= 3 * wave ? 1 : 0;
}

// fp32 rows of 513 to 1024 elements, as many as a warp a row at eight
// accesses (32 elements a thread, 1024 resident threads an SM) holds in
// one wave, at least three quarters full: every row's loads in flight at
// once and no barrier, where four accesses give a row two warps, a CTA
// reduction and nearly two waves (4096 x 1024: the whole 16 MB of x in
// flight). More rows, or a wave half empty (2048 x 1024), ran slower than
// four accesses (docs/performance.md). Returns 32, 0 for the rows that
// keep four accesses, -1 on an error.
template <typename T, typename P>
int fwd_fp32_one_wave_tpr(const gemsops_layer_norm_fwd_params *p,
                          gemsops_status *st)
{
    constexpr int E = fwd_elems<T, 8>();
    if (!std::is_same_v<T, float> || !std::is_same_v<T, P> || p->residual ||
        p->cols <= E * 16 || p->cols > E * 32) {
        return 0;
    }
    const int fills = fwd_rows_fill_one_wave(p, 1024, 32, st);
    return fills > 0 ? 32 : fills;
}

// Half rows of 1025 to 2048 elements (64 threads a row at four or three
// accesses), as many as fill three quarters to all of one wave at 64
// threads a row: two accesses a thread, a CTA of 96 or 128 threads a row.
// At four, every row of the launch loads at once and then every row
// reduces and stores, with no other wave's loads to overlap; at two, the
// rows take two waves and more threads an SM share each row's latency.
// More rows, or fewer, ran slower at two, and so did the rows of 1536
// that three accesses fill exactly (fwd_three_access_tpr, asked first;
// docs/performance.md). Returns the group, 0 for the rows that keep
// their accesses, -1 on an error.
template <typename T, typename P>
int fwd_half_one_wave_tpr(const gemsops_layer_norm_fwd_params *p,
                          gemsops_status *st)
{
    constexpr int E = fwd_elems<T, 2>();
    if (sizeof(T) != 2 || !std::is_same_v<T, P> || p->residual ||
        p->cols <= E * 64 || p->cols > E * 128) {
        return 0;
    }
    const int fills = fwd_rows_fill_one_wave(p, 2048, 64, st);
    if (fills <= 0) {
        return fills;
    }
    return layer_norm_choose_shape(p->cols, E, 128, kFwdHalfOneWaveTprChoices)
        .tpr;
}

// Three 16-byte accesses a thread for rows of three times a power of two
// vectors, 32 or 64 threads a row (768 and 1536 half elements, 384 and
// 768 fp32), where four accesses give the row as many threads and leave a
// quarter of their items empty behind per-item bounds: every item full, a
// constant bound (items_end), fewer registers. Not fp64, nor the fused
// add of fp32 (fwd_add_three_access). Returns the group, 0 for the rows
// that keep four accesses.
constexpr int kFwdThreeAccessTprChoices[] = {32, 64};

template <typename T>
int fwd_three_access_tpr(int64_t cols, bool add)
{
    constexpr int E = fwd_elems<T, 3>();
    if constexpr (sizeof(T) == 8) {
        return 0;
    }
    else {
        if ((add && !fwd_add_three_access<T>()) || cols % E != 0) {
            return 0;
        }
        for (int tpr : kFwdThreeAccessTprChoices) {
            if (cols == (int64_t)tpr * E) {
                return tpr;
            }
        }
        return 0;
    }
}

// The fused add's half rows past 2048 elements: two accesses a thread
// rather than four, twice the threads a row, each with x and res of both
// its items in flight at once (four accesses' pass over x and res waits
// out two round trips, load_added_items). Only where the parameters share
// x's type. Rows of 640 to 768 groups keep four accesses: 768 threads fit
// one CTA a SM (two would spill, fwd_two_access_min_ctas), and 1024 leave a
// quarter of their accesses empty; both ran slower than four accesses.
// Returns the group, 0 for the rows that keep four accesses.
template <typename T, typename P>
int fwd_add_two_access_tpr(const gemsops_layer_norm_fwd_params *p)
{
    constexpr int E = fwd_elems<T, 2>();
    if (!std::is_same_v<T, P> || sizeof(T) != 2 || !p->residual ||
        p->cols <= 128 * E || p->cols > 1024 * E ||
        (p->cols > 640 * E && p->cols <= 768 * E)) {
        return 0;
    }
    return layer_norm_choose_shape(p->cols, E, 1024, kFwdTwoAccessTprChoices)
        .tpr;
}

template <typename T, typename P, bool RMS>
int launch(const gemsops_layer_norm_fwd_params *p, gemsops_status *st)
{
    device_guard guard;
    GEMSOPS_CUDA_CHECK(st, guard.enter(p->device_id));
    constexpr int V = 16 / sizeof(T);
    const bool vec = vector_ok<T, P>(p);
    if (p->cols > (int64_t)fwd_max_tpr<T>() * fwd_elems<T>()) {
        return layer_norm_fwd_looped_launch<T, P, RMS>(p, vec, st);
    }
    int rc;
    if (vec &&
        (p->residual ? run_short_rows<T, P, RMS, V, true>(p, &rc, st)
                     : run_short_rows<T, P, RMS, V, false>(p, &rc, st))) {
        return rc;
    }
    const int long_tpr =
        vec ? fwd_fp32_long_tpr<T>(p->cols, p->residual != nullptr) : 0;
    if (long_tpr > 0) {
        return dispatch_group<T, P, RMS, V, 8, kFwdEightAccessTprChoices,
                              std::is_same_v<T, float>>(p, long_tpr,
                                                        "eight-access ", st);
    }
    const int two_tpr = vec ? fwd_add_two_access_tpr<T, P>(p) : 0;
    if (two_tpr > 0) {
        return dispatch_group<T, P, RMS, V, 2, kFwdTwoAccessTprChoices,
                              (std::is_same_v<T, P> &&
                               sizeof(T) == 2)>(p, two_tpr, "two-access ", st);
    }
    const int tpr =
        layer_norm_choose_shape(p->cols, fwd_elems<T>(), fwd_max_tpr<T>(),
                                kLayerNormFwdTprChoices)
            .tpr;
    const int one_tpr = vec ? fwd_one_access_tpr<T, P>(p, tpr, st) : 0;
    if (one_tpr < 0) {
        return st->code;
    }
    if (one_tpr > 0) {
        return dispatch_group<T, P, RMS, V, 1, kFwdOneAccessTprChoices,
                              (std::is_same_v<T, P> &&
                               sizeof(T) < 8)>(p, one_tpr, "one-access ", st);
    }
    if (vec &&
        (p->residual ? run_warp_rows<T, P, RMS, V, true>(p, &rc, st)
                     : run_warp_rows<T, P, RMS, V, false>(p, &rc, st))) {
        return rc;
    }
    const int wave_tpr = vec ? fwd_fp32_one_wave_tpr<T, P>(p, st) : 0;
    if (wave_tpr < 0) {
        return st->code;
    }
    if (wave_tpr > 0) {
        return dispatch_group<T, P, RMS, V, 8, kFwdEightAccessTprChoices,
                              std::is_same_v<T, float>>(p, wave_tpr,
                                                        "eight-access ", st);
    }
    const int three_tpr =
        vec ? fwd_three_access_tpr<T>(p->cols, p->residual != nullptr) : 0;
    if (three_tpr > 0) {
        return dispatch_group<T, P, RMS, V, 3, kFwdThreeAccessTprChoices,
                              (sizeof(T) < 8)>(p, three_tpr, "three-access ",
                                               st);
    }
    const int half_wave_tpr = vec ? fwd_half_one_wave_tpr<T, P>(p, st) : 0;
    if (half_wave_tpr < 0) {
        return st->code;
    }
    if (half_wave_tpr > 0) {
        return dispatch_group<T, P, RMS, V, 2, kFwdHalfOneWaveTprChoices,
                              (std::is_same_v<T, P> &&
                               sizeof(T) == 2)>(p, half_wave_tpr,
                                                "two-access ", st);
    }
    return vec ? dispatch_group<T, P, RMS, V, 4, kLayerNormFwdTprChoices>(p,
                                                                          tpr,
                                                                          "",
                                                                          st)
               : dispatch_group<T, P, RMS, 1, 4, kLayerNormFwdTprChoices>(p,
                                                                          tpr,
                                                                          "",
                                                                          st);
}

// The one dtype switch: (input dtype, parameter dtype) -> launcher.
template <bool RMS>
int dispatch_dtype(const gemsops_layer_norm_fwd_params *p, gemsops_status *st)
{
    const bool same = p->param_dtype == p->dtype;
    switch (p->dtype) {
    case GEMSOPS_FLOAT32: return launch<float, float, RMS>(p, st);
    case GEMSOPS_FLOAT64: return launch<double, double, RMS>(p, st);
    case GEMSOPS_FLOAT16:
        return same ? launch<__half, __half, RMS>(p, st)
                    : launch<__half, float, RMS>(p, st);
    case GEMSOPS_BFLOAT16:
        return same ? launch<__nv_bfloat16, __nv_bfloat16, RMS>(p, st)
                    : launch<__nv_bfloat16, float, RMS>(p, st);
    default:
        return gemsops_fail(st, GEMSOPS_ERR_TYPE,
                            "layer_norm: unsupported dtype %s on CUDA",
                            gemsops_dtype_name(p->dtype));
    }
}

// LayerNorm or RMSNorm, each compiled apart; RMSNorm's kernels have no
// bias to add.
int dispatch(const gemsops_layer_norm_fwd_params *p, gemsops_status *st)
{
    if (!p->rms) {
        return dispatch_dtype<false>(p, st);
    }
    if (p->bias) {
        return gemsops_fail(st, GEMSOPS_ERR_VALUE,
                            "rms_norm: a bias was given; RMSNorm has none");
    }
    return dispatch_dtype<true>(p, st);
}

} // namespace
} // namespace gemsops

extern "C" int gemsops_layer_norm_fwd_cuda(
    const struct gemsops_layer_norm_fwd_params *p, gemsops_status *st)
{
    if (p->cols == 0) {
        // rows of no elements: mean 0 and rstd NaN (all-ones bytes), as
        // torch reports them; there is no output element to write
        if (p->rows == 0 || p->rstd == nullptr) {
            return GEMSOPS_OK;
        }
        gemsops::device_guard guard;
        GEMSOPS_CUDA_CHECK(st, guard.enter(p->device_id));
        const size_t bytes = p->rows * (p->dtype == GEMSOPS_FLOAT64 ? 8 : 4);
        cudaStream_t stream = (cudaStream_t)p->stream;
        if (p->mean != nullptr) {
            GEMSOPS_CUDA_CHECK(st, cudaMemsetAsync(p->mean, 0, bytes, stream));
        }
        GEMSOPS_CUDA_CHECK(st, cudaMemsetAsync(p->rstd, 0xff, bytes, stream));
        return GEMSOPS_OK;
    }
    return gemsops::dispatch(p, st);
}
