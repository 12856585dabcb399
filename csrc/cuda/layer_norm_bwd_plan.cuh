// LayerNorm backward: how a launch is shaped, before anything runs.
//
// Everything here is arithmetic on the params and the device's facts; the
// same numbers size the workspace query and the launch, which must agree
// exactly (the caller allocates what the query said, then launches with
// the same params). The occupancy query that needs the kernels themselves
// is plan() in layer_norm_bwd.cu.
//
// The choices, in the order the launcher makes them:
//   1. elements per thread E and the row shape (TPR threads per slab,
//      `split` slabs per row): bwd_choose();
//   2. the access width VEC: 16 bytes when every pointer and stride allows,
//      else one element (bwd_vector_ok); the grid does not depend on it;
//   3. the ring depth and dynamic shared memory: plan_ring();
//   4. the persistent grid: bwd_grid(), from the kernels' occupancy;
//   5. the workspace layout: plan_layout().
// with_kernel() maps a bwd_config to its instantiation; the list of
// instantiations that exist is there.
#pragma once

#include <stdint.h>

#include "convert.cuh"
#include "device.cuh"
#include "gemsops/layer_norm.h"
#include "layer_norm_plan.cuh"

namespace gemsops {
namespace {

// Each CTA adds up to 2 * cols atomics; owning at least kMinRowsPerCta rows
// keeps them a small fraction of the 3 * cols * rows elements moved. Where
// that count leaves fewer than kFillCtasPerSm CTAs an SM, a CTA owns fewer
// rows: with few rows, a CTA alone on its SM waits out each row's loads
// and reductions in turn, which costs more than the added atomics until
// about that many CTAs share an SM. Not fewer than kFewestRowsPerCta, nor
// so few that the CTA's rows of x hold fewer bytes than its atomics add
// (LayerNorm's dW and dB in a half type: 4 rows; RMSNorm's dW, or fp32: 2).
// The measured rows-per-CTA sweep: docs/performance.md, LayerNorm backward.
constexpr int64_t kMinRowsPerCta = 8;
constexpr int64_t kFewestRowsPerCta = 2;
constexpr int64_t kFillCtasPerSm = 4;

// Elements a thread owns per row: 8 (4 for fp64), and 16 for the half
// types where that pads no more columns (bwd_wide): the row reductions,
// barriers and ring bookkeeping are per row and thread, so twice the
// elements halve their share. Short rows were slower at 16
// (docs/performance.md).
template <typename T>
__host__ __device__ constexpr int bwd_base_elems()
{
    return sizeof(T) == 8 ? 4 : 8;
}

// Resident threads per SM the registers and the ring are planned for:
// 1024 at 8 elements (64 registers), 512 at 16 (x, dy and the fp32 dW/dB
// accumulators take twice the registers) and for fp64.
template <typename T, int E>
__host__ __device__ constexpr int bwd_sm_threads()
{
    return sizeof(T) == 8 || E > 8 ? 512 : 1024;
}

// The ring feeds 16-byte accesses only; one stage holds each thread's x
// and dy vectors, then the rows' mean and rstd.
template <typename T, int VEC>
__host__ __device__ constexpr bool bwd_ring()
{
    return VEC * sizeof(T) == 16;
}

// Which instantiations have the lagged and paired loops' kernels (both
// re-read rows from the ring; the pair's two rows need the wide half
// kernels' 128 registers: the others' 64 spilled).
template <typename T, int TPR, int VEC>
__host__ __device__ constexpr bool bwd_has_lagged()
{
    return TPR >= 128 && bwd_ring<T, VEC>();
}
template <typename T, int TPR, int VEC, int E>
__host__ __device__ constexpr bool bwd_has_paired()
{
    return bwd_has_lagged<T, TPR, VEC>() && E > bwd_base_elems<T>();
}
// Which have the loops' DH variants (the fused add's dh loaded early):
// 16-byte accesses outside fp64, whose 64-register kernels spilled holding
// dh; misaligned rows (the scalar kernels) load it late, as fp64.
template <typename T, int VEC>
__host__ __device__ constexpr bool bwd_has_dh_early()
{
    return sizeof(T) < 8 && bwd_ring<T, VEC>();
}
constexpr int kMaxStages = 4;

// One lane per row and warp copies the row's mean and rstd and hands them
// to the others with a shuffle: 32 lanes copying the same 4 bytes are 32
// requests where one will do (ncu showed the kernel making several times
// the shared wavefronts its data needs). A stage keeps one (mean, rstd)
// slot per such lane, not per thread, small enough that L1 keeps it.
__host__ __device__ constexpr int bwd_stat_lanes(int tpr)
{
    return tpr < 32 ? tpr : 32;
}

// Rounded up to 128 bytes: the next stage and the weights after the ring
// stay aligned for their vector accesses.
template <typename T, int VEC, int E>
__host__ __device__ constexpr int bwd_stage_bytes(int block, int tpr)
{
    return bwd_ring<T, VEC>()
               ? (block * 2 * (E / VEC) * 16 +
                  2 * (block / bwd_stat_lanes(tpr)) * (int)sizeof(acc_t<T>) +
                  127) /
                     128 * 128
               : 0;
}

// CTAs per SM the register budget of bwd_sm_threads asks for (1024
// threads: 64 registers, the most the ring's shared memory allows for
// 512-thread CTAs anyway; fp64, not a bandwidth target, gets 512 so that
// it does not spill). The ring is planned for the same count.
__host__ __device__ constexpr int bwd_min_ctas(int tpr, int threads)
{
    const int block = tpr < 128 ? 128 : tpr;
    return block >= threads ? 1 : threads / block;
}

// The fused kernel's arguments (layer_norm_bwd_row.cuh reads them).
template <typename T, typename P>
struct bwd_args {
    const T *dy;
    const T *x;
    const P *w;
    const acc_t<T> *mean;
    const acc_t<T> *rstd;
    T *dx; // NULL: no dx wanted
    P *dw; // outputs, NULL when not wanted
    P *db;
    acc_t<T> *stripes; // atomics: [n_stripes][2 * cols] (dW then dB)
    int n_stripes; // row group g adds into stripe g % n_stripes
    acc_t<T> *partials; // deterministic: [groups][2 * cols]
    acc_t<T> *exchange; // split > 1: [rows][split][2], zero at launch
    int64_t rows, cols, dy_stride, x_stride, dx_stride;
    int split;
    int stages; // ring depth, 1..kMaxStages (ring kernels only)
    bool deterministic;
    bool rms; // RMSNorm: mean taken as 0 (whatever `mean` holds), no c2
    const T *dh; // the fused add: NULL, or a gradient added into dx
    int64_t dh_stride;
};

// 16 elements a thread for the half types where a row (slab) then takes
// 256 or 512 threads and no more padded columns than with 8 (768 columns
// stay at 8, where 16 would leave 5/8 of a 128-thread CTA idle). Depends
// on the dtype and the width only, so the workspace plan does not depend
// on pointer alignment.
constexpr int kWideMaxTpr = 512;

template <typename T>
bool bwd_wide(int64_t cols)
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
bool bwd_vector_ok(const gemsops_layer_norm_bwd_params *p)
{
    return layer_norm_vectors_fit<T, P>(p->cols,
                                        {p->x_row_stride, p->dy_row_stride,
                                         p->dx_row_stride, p->dh_row_stride},
                                        {p->x, p->dy, p->dx, p->dh},
                                        {p->weight});
}

// Which fused-kernel instantiation runs: its elements per thread, access
// width and row shape.
struct bwd_config {
    layer_norm_shape shape;
    int elems; // E: bwd_base_elems<T>(), or twice that (bwd_wide)
    int vec; // VEC: 16 / sizeof(T) (bwd_vector_ok), or 1
};

template <typename T, typename P>
bwd_config bwd_choose(const gemsops_layer_norm_bwd_params *p)
{
    // A whole row per CTA up to 1024 threads: the ring keeps loads flowing
    // through the barriers, which costs less than exchanging partials
    // between CTAs through global memory for every row.
    constexpr int E = bwd_base_elems<T>();
    constexpr int V = 16 / sizeof(T);
    bwd_config c;
    c.vec = bwd_vector_ok<T, P>(p) ? V : 1;
    if (sizeof(T) == 2 && bwd_wide<T>(p->cols)) {
        c.elems = 2 * E;
        c.shape = layer_norm_choose_shape(p->cols, 2 * E, kWideMaxTpr);
        return c;
    }
    // Split rows take slabs of 512 threads, two CTAs a SM: while one waits
    // on its barriers or the exchange, the other's loads flow, where one
    // 1024-thread CTA a SM stalls with nothing beside it. fp64 keeps 1024:
    // its registers allow one 512-thread CTA a SM, nothing to interleave.
    const int max_tpr =
        sizeof(T) < 8 && p->cols > 1024 * (int64_t)E ? 512 : 1024;
    c.elems = E;
    c.shape = layer_norm_choose_shape(p->cols, E, max_tpr);
    return c;
}

// Names one instantiation's compile-time shape: plan() and launch()
// (layer_norm_bwd.cu) reach the kernel a bwd_config names through these.
template <int TPR_, int VEC_, int E_>
struct bwd_kernel {
    static constexpr int TPR = TPR_, VEC = VEC_, E = E_;
};

// Calls f(bwd_kernel<TPR, VEC, E>()) for the instantiation that runs
// threads-per-row `tpr`; every (TPR, VEC, E) that has a kernel is listed
// here and nowhere else.
template <typename T, int VEC, int E, typename F>
int with_tpr(int tpr, gemsops_status *st, F &&f)
{
    if constexpr (E > bwd_base_elems<T>()) {
        // 256 or 512 threads a row (slab) only: 16 elements at 1024
        // threads need more than the 64 registers a thread then has
        switch (tpr) {
        case 256: return f(bwd_kernel<256, VEC, E>());
        case 512: return f(bwd_kernel<512, VEC, E>());
        default: break;
        }
    }
    else {
        switch (tpr) {
        case 4: return f(bwd_kernel<4, VEC, E>());
        case 8: return f(bwd_kernel<8, VEC, E>());
        case 16: return f(bwd_kernel<16, VEC, E>());
        case 32: return f(bwd_kernel<32, VEC, E>());
        case 128: return f(bwd_kernel<128, VEC, E>());
        case 256: return f(bwd_kernel<256, VEC, E>());
        default: break;
        }
        // Half types never get here with 512 or 1024 threads: wherever 8
        // elements a thread need a slab of 512 or more threads (4096
        // columns or more), 16 elements at half the threads pad no more
        // columns, so bwd_wide picks them.
        if constexpr (sizeof(T) != 2) {
            switch (tpr) {
            case 512: return f(bwd_kernel<512, VEC, E>());
            case 1024: return f(bwd_kernel<1024, VEC, E>());
            default: break;
            }
        }
    }
    return gemsops_fail(st, GEMSOPS_ERR_RUNTIME,
                        "layer_norm_bwd: no kernel for %d threads/row", tpr);
}

template <typename T, typename F>
int with_kernel(const bwd_config &c, gemsops_status *st, F &&f)
{
    constexpr int E = bwd_base_elems<T>();
    constexpr int V = 16 / sizeof(T);
    if constexpr (sizeof(T) == 2) {
        if (c.elems == 2 * E) {
            return c.vec == V ? with_tpr<T, V, 2 * E>(c.shape.tpr, st, f)
                              : with_tpr<T, 1, 2 * E>(c.shape.tpr, st, f);
        }
    }
    return c.vec == V ? with_tpr<T, V, E>(c.shape.tpr, st, f)
                      : with_tpr<T, 1, E>(c.shape.tpr, st, f);
}

// Dynamic shared memory of one launch: the ring, then the weights. The
// ring gets the most stages (up to 4 for half types, 3 for wider ones)
// that leave room for the resident threads the registers are planned for
// (bwd_sm_threads) with ~6 KB a CTA to spare. What the ring takes comes
// out of L1, which its copies pass through (cp.async.ca): counting the
// driver's 1 KB and the static arrays exactly, a third fp32 stage would
// fit at 512 and 1024 threads a row, but the smaller L1 it leaves was
// slower (docs/performance.md).
struct bwd_ring_plan {
    int stages, smem;
};

template <typename T, typename P, int TPR, int VEC, int E>
bwd_ring_plan plan_ring(const device_facts &f)
{
    constexpr int block = layer_norm_block_threads(TPR);
    constexpr int per = bwd_stage_bytes<T, VEC, E>(block, TPR);
    constexpr int w_bytes = block * E * (int)sizeof(P);
    if constexpr (per == 0) { // no ring (compiled apart: no division by 0)
        return {1, w_bytes};
    }
    else {
        constexpr int threads = bwd_sm_threads<T, E>();
        constexpr int ctas = block >= threads ? 1 : threads / block;
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
}

// The fewest rows a row group owns: kMinRowsPerCta, or fewer where the rows
// spread over kFillCtasPerSm groups an SM would each own fewer, down to
// the larger of kFewestRowsPerCta and the rows whose x (elem_bytes a
// value) holds acc_bytes, the bytes a column's atomics add (0: none).
inline int64_t bwd_min_rows(int64_t rows, int sm_count, int acc_bytes,
                            int elem_bytes)
{
    const int64_t fill = kFillCtasPerSm * sm_count;
    const int64_t spread = (rows + fill - 1) / fill;
    int64_t fewest = (acc_bytes + elem_bytes - 1) / elem_bytes;
    fewest = fewest < kFewestRowsPerCta ? kFewestRowsPerCta : fewest;
    return spread < fewest           ? fewest
           : spread > kMinRowsPerCta ? kMinRowsPerCta
                                     : spread;
}

// Persistent grid: row groups (of `split` CTAs) up to what is co-resident,
// and no more than one per bwd_min_rows rows (the atomics cost grid * cols,
// so each CTA must own enough rows to amortise them).
inline int64_t bwd_grid(int64_t rows, layer_norm_shape s, int ctas_per_sm,
                        int sm_count, int acc_bytes, int elem_bytes)
{
    int64_t rows_per_cta = layer_norm_block_threads(s.tpr) / s.tpr;
    const int64_t min_rows =
        bwd_min_rows(rows, sm_count, acc_bytes, elem_bytes);
    if (rows_per_cta < min_rows) {
        rows_per_cta = min_rows;
    }
    int64_t groups_needed = (rows + rows_per_cta - 1) / rows_per_cta;
    int64_t resident_groups = (int64_t)ctas_per_sm * sm_count / s.split;
    int64_t groups =
        groups_needed < resident_groups ? groups_needed : resident_groups;
    return groups * s.split;
}

inline int64_t round16(int64_t n)
{
    return (n + 15) / 16 * 16;
}

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
// launches: the sum kernel re-zeroes the stripes or partials it reads,
// and a launch that splits rows memsets the exchange region after itself
// as well as before (long rows only, where a memset launch is noise). The
// memset before is not redundant: it leaves the exchange slots in L2,
// where the polls find them (cold slots cost a DRAM round trip per row
// step; docs/performance.md).
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

// The row loop of a launch (layer_norm_bwd_row.cuh), each its own kernel.
enum class bwd_loop {
    whole,
    lagged, // split rows with dx
    paired, // whole rows of the wide half kernels, with dx
};

// Everything a launch needs, decided by plan() before anything is
// launched: the workspace query returns layout.total from the same plan.
struct bwd_plan {
    bwd_config config;
    int64_t grid;
    bwd_ring_plan ring; // for the config's access width
    bwd_layout layout;
    bwd_loop loop;
    bool dh_early; // the loop's DH variant (bwd_has_dh_early)
    bool pdl; // the sum kernel is a programmatic dependent
};

} // namespace
} // namespace gemsops
