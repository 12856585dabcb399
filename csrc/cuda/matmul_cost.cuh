// The matmul planner's cost model: which wgmma tile (128 x 256, 128 x 192,
// 128 x 128, 128 x 64, 64 x 64 or 192 x 192, BK = 128 bytes of k; 128 x
// 128 also on the pingpong kernel; 128 x 80, 96 or 160 of the swapped
// product C^T = B^T A^T) a problem runs, and whether its last
// partial wave is split Stream-K or run as whole tiles, from the time each
// is predicted to take.
//
// For one tile and its schedule (gemsops_sk_plan), in microseconds:
//
//   t = iter_us  * the busiest CTA's k-iterations
//     + tile_us  * the busiest CTA's tiles
//     + sk_us_per_mb * the Stream-K tiles' operand megabytes
//
// (no constant term: the planner only compares candidates).
// The busiest CTA is CTA 0: its Stream-K share, ceil(sk_tiles * iters /
// sk_ctas) iterations over at most ceil(sk_tiles / sk_ctas) + 1 pieces,
// then ceil(dp_tiles / ctas) whole tiles. A tile costs its epilogue and a
// pipeline fill besides its iterations. The Stream-K term is traffic: the
// CTAs sharing split tiles run at staggered k, so their A and B loads do
// not meet in L2 as a data-parallel wave's do, and once the operands
// outgrow L2 each split tile's (BM + BN) x K panel comes from DRAM.
//
// Where the constants come from (the fits and replays, their data and
// their quality: docs/performance.md, matmul, the planner):
// - the 128-row tiles': a least-squares fit (tools/mm_cost_fit.py) to
//   kernel times of every width under the Stream-K and the data-parallel
//   schedule over a shape grid (tools/mm_calibrate.py; the timings in
//   benchmark/results/mm_calibration_*.jsonl), each plan at its least time;
// - the 64 x 64 and 192 x 192 tiles', the others held: the pair whose
//   choices, made by this planner compiled for the host and replayed over
//   timed plans (tools/mm_split_fit.py --small-tile, --square-tile;
//   benchmark/results/mm_plans_*.txt), come nearest the best plan. A
//   least-squares fit there gave a negative tile cost: eager times carry a
//   host window the model has no term for. The 192 x 192 tile's k-iteration
//   is the 128 x 256 tile's scaled by the FLOP (36864 outputs against
//   32768).
// They are per SM (every tile runs one CTA an SM), so the SM count carries
// them to other Hopper parts.
#pragma once

#include <stdint.h>

#include "gemsops/matmul.h"
#include "gemsops/streamk.h"

namespace gemsops {

struct wgmma_tile_cost {
    int bm, bn;
    int ctas_per_sm; // resident CTAs an SM (shared memory, threads)
    // one BM x BN x BK k-iteration of one CTA (the same for TF32: its
    // half-rate k8 takes the cycles of a half type's k16)
    double iter_us;
    double tile_us; // a tile's epilogue and pipeline fill
};

constexpr wgmma_tile_cost kWgmmaWide = {128, 256, 1, 0.742, 2.69};
constexpr wgmma_tile_cost kWgmmaThreeQuarter = {128, 192, 1, 0.618, 1.75};
constexpr wgmma_tile_cost kWgmmaNarrow = {128, 128, 1, 0.450, 1.12};
constexpr wgmma_tile_cost kWgmmaSlim = {128, 64, 1, 0.375, 0.213};
constexpr wgmma_tile_cost kWgmmaSmall = {64, 64, 1, 0.19, 0.5};
constexpr wgmma_tile_cost kWgmmaSquare = {192, 192, 1, 0.835, 3.0};
// The pingpong kernel's 128 x 128 tiles (whole, halves): the cooperative
// kernel's constants scaled by the two kernels' times on a long-k and a
// short-k shape (their k-steps over tiles a CTA give the split between a
// k-step and a tile), the k-step then lowered where the model
// overpredicted pingpong against the wide tiles over short k
// (docs/performance.md, matmul, the planner). A tile's epilogue runs under
// the other warpgroup's mainloop, so it costs less than the cooperative
// kernel's.
constexpr wgmma_tile_cost kWgmmaPingpong = {128, 128, 1, 0.42, 0.717};
constexpr int64_t kPingpongMaxK = 1536;
// The swapped product's tiles (C^T = B^T A^T, matmul_wgmma.cuh, CT): 128
// or 64 columns x 80, 96 or 160 rows of C, costed as the BM-row tile of
// that width on the swapped problem (n x m). 160 x 128: set on the line
// through the 128-row tiles' constants in the width, then scaled (x 1.05)
// so that over 17 shapes timed under every tile
// (benchmark/results/mm_plans_transposed_*.txt, tools/mm_plans.py, H100)
// its predictions stand to its times as the 128-row tiles' do. The narrow
// ones (80 and 96 rows): the pair whose choices, made by this planner
// replayed over timed plans (tools/mm_split_fit.py --t80x128, ..., one
// tile at a time, the others held, two rounds), come nearest the best plan
// timed, over those 17 shapes and the benchmark corpus's 210 (every tile
// data-parallel and Stream-K, bf16: mm_plans_corpus_*.txt). Fitted on the
// 17 alone they took long-k shapes from 128 x 64 tiles and lost there.
constexpr wgmma_tile_cost kWgmmaT80 = {128, 80, 1, 0.375, 0.5};
constexpr wgmma_tile_cost kWgmmaT96 = {128, 96, 1, 0.375, 0.75};
constexpr wgmma_tile_cost kWgmmaT160 = {128, 160, 1, 0.561, 1.51};
constexpr wgmma_tile_cost kWgmmaT80x64 = {64, 80, 1, 0.2, 0.5};
constexpr wgmma_tile_cost kWgmmaT96x64 = {64, 96, 1, 0.325, 1.75};
constexpr double kStreamKUsPerMb = 0.0615;
// A Stream-K split is taken only when predicted to take at most this
// fraction of the best data-parallel plan's time: the terms above miss
// part of a split's cost (an owner reads its peers' partials one after
// another), and on the benchmark corpus (every shape timed under both
// schedules in one run) splits predicted less than ~1.4x faster lost more
// often than they won.
constexpr double kStreamKMargin = 0.7;
// A split-k launch (every tile in `split` pieces, one cluster of CTAs a
// tile, each piece's CTA summing a band of its tile) is predicted as
// kSplitKScale times its pieces' k-iterations and one tile's fill and
// epilogue, plus kSplitKUs for the fix-up: every piece's partial into its
// shared memory, the cluster's barrier, the band's partials in through
// distributed shared memory. The two are not split-k's own costs (the
// terms above overestimate launches of few tiles over long k, which
// split-k competes with) but what makes the planner's choice right:
// replayed by tools/mm_split_fit.py over shapes of few tiles, each timed
// under every width and schedule (benchmark/results/mm_plans_split_*.txt,
// bf16, H100), they bring the chosen plan nearest the best measured one.
constexpr double kSplitKUs = 6.0;
constexpr double kSplitKScale = 1.5;

inline double wgmma_predicted_us(const gemsops_matmul_params *p, int64_t ctas,
                                 int group_m, const wgmma_tile_cost &c,
                                 gemsops_sk_mode mode)
{
    gemsops_sk_schedule s;
    const int bk = 128 / (int)gemsops_dtype_size(p->dtype);
    gemsops_sk_plan(&s, p->m, p->n, p->k, p->batch, c.bm, c.bn, bk, group_m,
                    ctas, mode, p->two_tiles);
    if (s.split > 0) {
        return kSplitKScale *
                   (c.iter_us * (double)gemsops_sk_cdiv(s.iters, s.split) +
                    c.tile_us) +
               kSplitKUs;
    }
    const int64_t waves = gemsops_sk_cdiv(s.dp_tiles, s.ctas);
    int64_t share = 0, pieces = 0;
    if (s.sk_tiles > 0) {
        share = gemsops_sk_cdiv(s.sk_tiles * s.iters, s.sk_ctas);
        pieces = gemsops_sk_cdiv(s.sk_tiles, s.sk_ctas) + 1;
    }
    const double sk_mb =
        (double)s.sk_tiles * s.iters * (c.bm + c.bn) * 128 / 1e6;
    return c.iter_us * (double)(waves * s.iters + share) +
           c.tile_us * (double)(waves + pieces) + kStreamKUsPerMb * sk_mb;
}

// A wgmma mainloop value and its tile, both ways
constexpr bool wgmma_transposed(gemsops_mainloop m)
{
    return m >= GEMSOPS_MAINLOOP_WGMMA_80X128 &&
           m <= GEMSOPS_MAINLOOP_WGMMA_96X64;
}
// (the swapped product's: bn over C's rows)
constexpr int wgmma_bn(gemsops_mainloop m)
{
    return m == GEMSOPS_MAINLOOP_WGMMA_80X128 ||
                   m == GEMSOPS_MAINLOOP_WGMMA_80X64
               ? 80
           : m == GEMSOPS_MAINLOOP_WGMMA_96X128 ||
                   m == GEMSOPS_MAINLOOP_WGMMA_96X64
               ? 96
           : m == GEMSOPS_MAINLOOP_WGMMA_160X128 ? 160
           : m == GEMSOPS_MAINLOOP_WGMMA_256     ? 256
           : m == GEMSOPS_MAINLOOP_WGMMA_192 ||
                   m == GEMSOPS_MAINLOOP_WGMMA_192X192
               ? 192
           : m == GEMSOPS_MAINLOOP_WGMMA_64 ||
                   m == GEMSOPS_MAINLOOP_WGMMA_64X64
               ? 64
               : 128;
}
constexpr int wgmma_bm(gemsops_mainloop m)
{
    return m == GEMSOPS_MAINLOOP_WGMMA_64X64 ||
                   m == GEMSOPS_MAINLOOP_WGMMA_80X64 ||
                   m == GEMSOPS_MAINLOOP_WGMMA_96X64
               ? 64
           : m == GEMSOPS_MAINLOOP_WGMMA_192X192 ? 192
                                                 : 128;
}
constexpr gemsops_mainloop wgmma_transposed_width(int bm, int bn)
{
    return bm == 64   ? (bn == 80 ? GEMSOPS_MAINLOOP_WGMMA_80X64
                                  : GEMSOPS_MAINLOOP_WGMMA_96X64)
           : bn == 80 ? GEMSOPS_MAINLOOP_WGMMA_80X128
           : bn == 96 ? GEMSOPS_MAINLOOP_WGMMA_96X128
                      : GEMSOPS_MAINLOOP_WGMMA_160X128;
}
constexpr gemsops_mainloop wgmma_width(int bm, int bn)
{
    return bm == 64    ? GEMSOPS_MAINLOOP_WGMMA_64X64
           : bm == 192 ? GEMSOPS_MAINLOOP_WGMMA_192X192
           : bn == 256 ? GEMSOPS_MAINLOOP_WGMMA_256
           : bn == 192 ? GEMSOPS_MAINLOOP_WGMMA_192
           : bn == 128 ? GEMSOPS_MAINLOOP_WGMMA_128
                       : GEMSOPS_MAINLOOP_WGMMA_64;
}

struct wgmma_plan {
    gemsops_mainloop width; // GEMSOPS_MAINLOOP_WGMMA_256, _192, _128, _64,
    // _64X64, _192X192, _PINGPONG
    gemsops_sk_mode mode;
};

// A launch's CTAs: `ctas` (an SM count times the tile's CTAs an SM) unless
// the caller asked for fewer.
inline int64_t capped_ctas(const gemsops_matmul_params *p, int64_t ctas)
{
    return p->ctas_override > 0 && p->ctas_override < ctas ? p->ctas_override
                                                           : ctas;
}

// Whether auto may give the product the pingpong kernel: halves (no TF32
// kernel), no row sums (the cooperative kernel makes them), more than 64
// rows (as every 128-row tile), a schedule of whole tiles asked or left
// to the model, and at least two tiles on the busiest CTA (with one, no
// other tile's mainloop runs under its epilogue).
inline bool pingpong_fits(const gemsops_matmul_params *p, int64_t ctas)
{
    const int64_t tiles =
        p->batch * gemsops_sk_cdiv(p->m, 128) * gemsops_sk_cdiv(p->n, 128);
    return p->dtype != GEMSOPS_FLOAT32 && p->row_sums == nullptr &&
           p->m > 64 &&
           (p->mode == GEMSOPS_SK_AUTO ||
            p->mode == GEMSOPS_SK_DATA_PARALLEL) &&
           tiles > ctas;
}

// The problem of the swapped product C^T = B^T A^T (operands as views:
// A' = B^T, B' = A^T; C' = C^T, which the CT kernels write as C).
inline gemsops_matmul_params transposed_product(const gemsops_matmul_params *p)
{
    gemsops_matmul_params q = *p;
    q.a = p->b;
    q.b = p->a;
    q.m = p->n;
    q.n = p->m;
    q.a_bs = p->b_bs;
    q.a_rs = p->b_cs;
    q.a_cs = p->b_rs;
    q.b_bs = p->a_bs;
    q.b_rs = p->a_cs;
    q.b_cs = p->a_rs;
    return q;
}

// The swapped product's tiles, tried where `transposable` (the caller's
// test of the operands: see GEMSOPS_MAINLOOP_WGMMA_80X128) and the
// schedule is left to the model or whole tiles or Stream-K (they have no
// split-k kernel); under auto none for at most 64 rows and the 128-column
// ones not for at most 64 columns, where they pay for rows or columns TMA
// fills with zeros (as the 128-row tiles and rows), the 64-column ones
// whole under auto (as the 64 x 64 tiles).
inline void wgmma_cheapest_transposed(const gemsops_matmul_params *p,
                                      gemsops_mainloop width, int64_t sms,
                                      int group_m, wgmma_plan *best,
                                      double *best_us)
{
    const wgmma_tile_cost *costs[5] = {&kWgmmaT80, &kWgmmaT96, &kWgmmaT160,
                                       &kWgmmaT80x64, &kWgmmaT96x64};
    if (p->mode == GEMSOPS_SK_SPLIT_K) {
        return;
    }
    // none under auto for at most 64 rows of C: their 80 to 160 rows would
    // be mostly TMA's zero fill, which the model does not see (the 64 x 64
    // tiles read the same B without it, as wgmma_cheapest says)
    if (width == GEMSOPS_MAINLOOP_AUTO && p->m <= 64) {
        return;
    }
    const gemsops_matmul_params t = transposed_product(p);
    const gemsops_sk_mode modes[2] = {p->mode, GEMSOPS_SK_DATA_PARALLEL};
    const int n_modes = p->mode == GEMSOPS_SK_AUTO ? 2 : 1;
    const int64_t ctas = capped_ctas(p, sms);
    for (const wgmma_tile_cost *c : costs) {
        const gemsops_mainloop w = wgmma_transposed_width(c->bm, c->bn);
        if (width != GEMSOPS_MAINLOOP_AUTO && w != width) {
            continue;
        }
        if (width == GEMSOPS_MAINLOOP_AUTO && c->bm == 128 && p->n <= 64) {
            continue;
        }
        for (int i = 0; i < n_modes; i++) {
            if (i == 0 && n_modes > 1 && c->bm != 128) {
                continue;
            }
            double us = wgmma_predicted_us(&t, ctas, group_m, *c, modes[i]);
            if (i == 0 && n_modes > 1) {
                us /= kStreamKMargin;
            }
            if (*best_us < 0 || us < *best_us) {
                *best_us = us;
                *best = {w, modes[i]};
            }
        }
    }
}

// The tile (when `width` is GEMSOPS_MAINLOOP_AUTO) and, under the auto
// schedule, whether the planner's Stream-K split, whole data-parallel waves
// or split-k: whichever the model predicts fastest (the Stream-K split by
// kStreamKMargin). sms: the SMs the launch may fill (a CTA count asked
// for caps every tile's CTAs). Only 128-row tiles have row-sum kernels,
// so a launch that asks for row sums takes the others only when forced.
// transposable: the swapped product's tiles may run it (else a width of
// theirs asked for means GEMSOPS_MAINLOOP_WGMMA_128).
inline wgmma_plan wgmma_cheapest(const gemsops_matmul_params *p,
                                 gemsops_mainloop width, int64_t sms,
                                 int group_m, bool transposable)
{
    if (wgmma_transposed(width)) {
        if (transposable) {
            wgmma_plan best = {width, p->mode};
            double best_us = -1.0;
            wgmma_cheapest_transposed(p, width, sms, group_m, &best, &best_us);
            return best;
        }
        width = GEMSOPS_MAINLOOP_WGMMA_128;
    }
    const wgmma_tile_cost *costs[6] = {&kWgmmaWide,   &kWgmmaThreeQuarter,
                                       &kWgmmaNarrow, &kWgmmaSlim,
                                       &kWgmmaSmall,  &kWgmmaSquare};
    const gemsops_sk_mode modes[3] = {p->mode, GEMSOPS_SK_DATA_PARALLEL,
                                      GEMSOPS_SK_SPLIT_K};
    // (split-k's banded fix-up does not carry row sums)
    const int n_modes = p->mode != GEMSOPS_SK_AUTO ? 1
                        : p->row_sums != nullptr   ? 2
                                                   : 3;
    // pingpong, asked for: its 128 x 128 tiles whole
    if (width == GEMSOPS_MAINLOOP_WGMMA_PINGPONG) {
        return {width, GEMSOPS_SK_DATA_PARALLEL};
    }
    const int bk = 128 / (int)gemsops_dtype_size(p->dtype);
    wgmma_plan best = {width, p->mode};
    double best_us = -1.0;
    for (const wgmma_tile_cost *c : costs) {
        const gemsops_mainloop w = wgmma_width(c->bm, c->bn);
        if (width != GEMSOPS_MAINLOOP_AUTO && w != width) {
            continue;
        }
        if (width == GEMSOPS_MAINLOOP_AUTO && c->bm != 128 &&
            p->row_sums != nullptr) {
            continue;
        }
        // at most 64 rows (without row sums): the 64 x 64 tiles. A 128-row
        // tile reads the same B and pays for rows TMA fills with zeros,
        // which the model's per-tile costs do not see (docs/performance.md,
        // matmul: the 64 x 64 tiles beat the planner's 128-row pick there)
        if (width == GEMSOPS_MAINLOOP_AUTO && c->bm == 128 && p->m <= 64 &&
            p->row_sums == nullptr) {
            continue;
        }
        const int64_t ctas = capped_ctas(p, sms * c->ctas_per_sm);
        for (int i = 0; i < n_modes; i++) {
            // the 64 x 64 tiles whole or split-k, not Stream-K: over the
            // small plans timed (benchmark/results/mm_plans_small_*.txt)
            // their Stream-K and hybrid plans were slower than their best
            // whole-tile or split-k plan on every shape; the
            // 192 x 192 tiles have no Stream-K kernel (matmul_wgmma.cuh)
            if (i == 0 && n_modes > 1 && c->bm != 128) {
                continue;
            }
            // split-k at most 128 wide: a piece of a wider tile publishes
            // and reads back 96-128 KB, more than kSplitKUs covers (the
            // 128 x 192 and 128 x 256 splits the planner took lost to the
            // same shapes' 128 x 128 Stream-K or 128 x 64 tiles)
            if (modes[i] == GEMSOPS_SK_SPLIT_K && c->bn > 128) {
                continue;
            }
            // nor where it would leave the tiles whole: the data-parallel
            // candidate again
            if (modes[i] == GEMSOPS_SK_SPLIT_K &&
                gemsops_sk_split_pieces(p->batch *
                                            gemsops_sk_cdiv(p->m, c->bm) *
                                            gemsops_sk_cdiv(p->n, c->bn),
                                        gemsops_sk_cdiv(p->k, bk), ctas) < 2) {
                continue;
            }
            double us = wgmma_predicted_us(p, ctas, group_m, *c, modes[i]);
            if (i == 0 && n_modes > 1) { // the auto schedule's split
                us /= kStreamKMargin;
            }
            if (best_us < 0 || us < best_us) {
                best_us = us;
                best = {w, modes[i]};
            }
        }
    }
    // pingpong over short k alone (at most kPingpongMaxK): over longer k
    // the model's two-way tie with the cooperative tiles went to pingpong
    // where those ran faster (the 128 x 192 tiles at 8192 x 768 x 3072:
    // 53.1 us against 61.4); replayed over the corpus's timed plans the
    // bound moves nothing else of note (docs/performance.md, the planner)
    const int64_t ctas = capped_ctas(p, sms);
    if (width == GEMSOPS_MAINLOOP_AUTO && pingpong_fits(p, ctas) &&
        p->k <= kPingpongMaxK) {
        const double us = wgmma_predicted_us(p, ctas, group_m, kWgmmaPingpong,
                                             GEMSOPS_SK_DATA_PARALLEL);
        if (best_us < 0 || us < best_us) {
            best = {GEMSOPS_MAINLOOP_WGMMA_PINGPONG, GEMSOPS_SK_DATA_PARALLEL};
            best_us = us;
        }
    }
    if (width == GEMSOPS_MAINLOOP_AUTO && transposable) {
        wgmma_cheapest_transposed(p, width, sms, group_m, &best, &best_us);
    }
    return best;
}

} // namespace gemsops
