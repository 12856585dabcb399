/* The Stream-K schedule: which CTA computes which k-iterations of which
 * output tile. Pure functions of a plain struct, shared by the host planner
 * (csrc/matmul_plan.c), the CUDA kernel (csrc/cuda/matmul_streamk.cu) and
 * the CPU executor (csrc/cpu/matmul.c), so CI tests the decomposition.
 *
 * Tiles: C = A.B per batch is cut into BM x BN tiles, tiles_m x tiles_n of
 * them per batch, `tiles` in all; a tile takes `iters` = ceil(K / BK)
 * k-iterations (MAC loops). Tiles are numbered in a grouped (swizzled)
 * order: `group_m` tile rows at a time, column by column, so that a wave of
 * CTAs shares A row panels and B column panels in L2.
 *
 * A grid of `ctas` persistent CTAs runs, per CTA c:
 *   1. its Stream-K share: the last `sk_tiles` tiles' iterations, sk_tiles
 *      * iters of them, split as evenly as integers allow over the first
 *      sk_ctas CTAs (CTA c < sk_ctas takes [c * total / sk_ctas, (c + 1)
 *      * total / sk_ctas); sk_ctas keeps shares >= GEMSOPS_SK_MIN_ITERS);
 *   2. then data-parallel tiles c, c + ctas, ... below `dp_tiles`.
 * Modes: data-parallel (sk_tiles = 0), stream-k (dp_tiles = 0), hybrid
 * (full waves of data-parallel tiles, the remainder tiles Stream-K; with
 * `two_tiles`, one full wave more joins the Stream-K region, the seeds'
 * "two tiles" option, which evens out the remainder wave's imbalance).
 *
 * Fix-up (deterministic): a Stream-K tile is OWNED by the CTA that computes
 * its k-iteration 0; every other CTA touching it (its PEERS, higher CTA
 * numbers, which reach it at the start of their shares) writes its fp32
 * partial tile to its workspace slot and raises its flag (release). The
 * owner, having computed its own part last, waits for each peer's flag in
 * increasing CTA order (acquire) and adds that partial: the same schedule
 * gives the same sums in the same order, every run. A CTA is a peer of at
 * most one tile (the one its share starts inside), so slots and flags are
 * one per CTA. No deadlock: the grid never exceeds the co-resident CTAs
 * (the planner's job), and peers never wait. */
#pragma once

#include <stdint.h>

#ifdef __CUDACC__
#define GEMSOPS_SK_FN __host__ __device__ static inline
#else
#define GEMSOPS_SK_FN static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum gemsops_sk_mode {
    GEMSOPS_SK_AUTO = 0, /* planner: hybrid for a sparse last wave      */
    GEMSOPS_SK_DATA_PARALLEL,
    GEMSOPS_SK_STREAM_K,
    GEMSOPS_SK_HYBRID,
} gemsops_sk_mode;

struct gemsops_sk_schedule {
    int64_t m, n, k; /* problem per batch                        */
    int64_t batch; /* independent products                    */
    int bm, bn, bk; /* tile shape                              */
    int group_m; /* tile rows per swizzle group (>= 1)      */
    int64_t tiles_m, tiles_n; /* tiles per batch along M and N           */
    int64_t tiles; /* batch * tiles_m * tiles_n               */
    int64_t iters; /* k-iterations per tile: ceil(k / bk)     */
    int64_t ctas; /* persistent CTAs in the grid             */
    int64_t sk_ctas; /* CTAs 0..sk_ctas-1 share the Stream-K    */
    /* region (each >= GEMSOPS_SK_MIN_ITERS,   */
    /* tiles cut in at most                    */
    /* gemsops_sk_pieces_per_tile pieces)      */
    int64_t sk_tiles; /* the last sk_tiles tiles are Stream-K    */
    int64_t dp_tiles; /* tiles [0, dp_tiles) are data-parallel   */
};

/* A Stream-K share shorter than this many k-iterations costs more in its
 * partial tile's round trip and its owner's serial wait than it saves: the
 * Stream-K region goes to fewer CTAs instead. */
#define GEMSOPS_SK_MIN_ITERS 4

/* One peer's partial costs its tile's owner about this many k-iterations
 * of the tile: a 4 x BM x BN-byte round trip through L2, read by the
 * owner's SM alone and added in order (wgmma 128 x 128: ~1.8 us a peer
 * against ~0.3 us a k-iteration; docs/performance.md, matmul). */
#define GEMSOPS_SK_PEER_COST_ITERS 6

GEMSOPS_SK_FN int64_t
gemsops_sk_cdiv(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

/* Into how many pieces a Stream-K tile of `iters` k-iterations is best cut:
 * P pieces take about iters / P + (P - 1) * PEER_COST iterations, least at
 * P = sqrt(iters / PEER_COST). More CTAs than tiles x P would only lengthen
 * the owners' serial fix-up. */
GEMSOPS_SK_FN int64_t
gemsops_sk_pieces_per_tile(int64_t iters)
{
    int64_t p = 1;
    while ((p + 1) * (p + 1) * GEMSOPS_SK_PEER_COST_ITERS <= iters) {
        p++;
    }
    return p;
}

/* Fills the derived fields. `ctas_resident`: CTAs that fit on the device at
 * once (SM count x occupancy), the Stream-K grid's ceiling. */
GEMSOPS_SK_FN void
gemsops_sk_plan(struct gemsops_sk_schedule *s, int64_t m, int64_t n, int64_t k,
                int64_t batch, int bm, int bn, int bk, int group_m,
                int64_t ctas_resident, gemsops_sk_mode mode, int two_tiles)
{
    s->m = m;
    s->n = n;
    s->k = k;
    s->batch = batch;
    s->bm = bm;
    s->bn = bn;
    s->bk = bk;
    s->group_m = group_m < 1 ? 1 : group_m;
    s->tiles_m = gemsops_sk_cdiv(m, bm);
    s->tiles_n = gemsops_sk_cdiv(n, bn);
    s->tiles = batch * s->tiles_m * s->tiles_n;
    s->iters = gemsops_sk_cdiv(k, bk);
    const int64_t p = ctas_resident < 1 ? 1 : ctas_resident;
    const int64_t waves = s->tiles / p, rem = s->tiles % p;
    if (s->iters == 0) { /* k == 0: tiles of zeros, nothing to split */
        mode = GEMSOPS_SK_DATA_PARALLEL;
    }
    if (mode == GEMSOPS_SK_AUTO) {
        /* Stream-K only for a last wave at most half full: whole waves need
         * none, a single k-iteration cannot split, and measured (wgmma,
         * one CTA per SM) a fuller last wave lost more to the split tiles'
         * partials and extra pipeline fills than it idled
         * (docs/performance.md, matmul) */
        mode = (rem == 0 || s->iters < 2 || 2 * rem > p)
                   ? GEMSOPS_SK_DATA_PARALLEL
                   : GEMSOPS_SK_HYBRID;
    }
    if (mode == GEMSOPS_SK_DATA_PARALLEL || s->tiles == 0) {
        s->sk_tiles = 0;
    }
    else if (mode == GEMSOPS_SK_STREAM_K) {
        s->sk_tiles = s->tiles;
    }
    else { /* hybrid */
        s->sk_tiles = rem + ((two_tiles && waves >= 1 && rem > 0) ? p : 0);
    }
    s->dp_tiles = s->tiles - s->sk_tiles;
    /* Stream-K needs every CTA resident; data-parallel just loops */
    s->ctas = s->sk_tiles > 0 ? p : (s->tiles < p ? s->tiles : p);
    if (s->ctas < 1) {
        s->ctas = 1;
    }
    s->sk_ctas = s->sk_tiles * s->iters / GEMSOPS_SK_MIN_ITERS;
    const int64_t cut = s->sk_tiles * gemsops_sk_pieces_per_tile(s->iters);
    if (s->sk_ctas > cut) {
        s->sk_ctas = cut;
    }
    if (s->sk_ctas > s->ctas) {
        s->sk_ctas = s->ctas;
    }
    if (s->sk_tiles <= s->ctas && s->sk_ctas > s->sk_tiles) {
        /* a nearly full last wave: shares a little shorter than a tile,
         * but most tiles cut in two or three and an owner waiting for each
         * peer; whole tiles, one a CTA, when that is no slower */
        const int64_t share =
            gemsops_sk_cdiv(s->sk_tiles * s->iters, s->sk_ctas);
        const int64_t pieces =
            gemsops_sk_cdiv(s->sk_ctas + s->sk_tiles - 1, s->sk_tiles);
        if (share + (pieces - 1) * GEMSOPS_SK_PEER_COST_ITERS >= s->iters) {
            s->sk_ctas = s->sk_tiles;
        }
    }
    if (s->sk_ctas < 1) {
        s->sk_ctas = 1;
    }
}

/* Stream-K iterations of CTA c: [*begin, *end) in the global numbering
 * (tile - dp_tiles) * iters + k_iter over the Stream-K tiles. */
GEMSOPS_SK_FN void
gemsops_sk_range(const struct gemsops_sk_schedule *s, int64_t c,
                 int64_t *begin, int64_t *end)
{
    const int64_t total = s->sk_tiles * s->iters;
    if (c >= s->sk_ctas) { /* no Stream-K share: data-parallel tiles only */
        *begin = *end = total;
        return;
    }
    *begin = total * c / s->sk_ctas;
    *end = total * (c + 1) / s->sk_ctas;
}

/* The CTA whose Stream-K share contains global iteration `it`: the
 * largest c with begin(c) <= it (shares may be empty). */
GEMSOPS_SK_FN int64_t
gemsops_sk_cta_of(const struct gemsops_sk_schedule *s, int64_t it)
{
    const int64_t total = s->sk_tiles * s->iters;
    /* begin(c) = floor(total * c / sk_ctas) <= it  <=>  c <= ((it + 1) *
     * sk_ctas - 1) / total; the largest such c */
    int64_t c = ((it + 1) * s->sk_ctas - 1) / total;
    return c < s->sk_ctas - 1 ? c : s->sk_ctas - 1;
}

/* One piece of a CTA's Stream-K share, from global iteration `it` (below
 * the share's `end`): the absolute tile number and its k-iterations
 * [*k0, *k1) the piece covers. Returns the global iteration after it. */
GEMSOPS_SK_FN int64_t
gemsops_sk_piece(const struct gemsops_sk_schedule *s, int64_t it, int64_t end,
                 int64_t *tile, int64_t *k0, int64_t *k1)
{
    *tile = s->dp_tiles + it / s->iters;
    *k0 = it % s->iters;
    const int64_t rest = s->iters - *k0;
    const int64_t len = end - it < rest ? end - it : rest;
    *k1 = *k0 + len;
    return it + len;
}

/* The peers of the Stream-K tile `tile` (absolute number), in the order its
 * owner adds them: the first CTA after `prev` whose non-empty share begins
 * inside the tile, or -1 when there is none. Start with prev = owner. */
GEMSOPS_SK_FN int64_t
gemsops_sk_next_peer(const struct gemsops_sk_schedule *s, int64_t tile,
                     int64_t prev)
{
    const int64_t tile_end = (tile - s->dp_tiles + 1) * s->iters;
    for (int64_t q = prev + 1; q < s->sk_ctas; q++) {
        int64_t b, e;
        gemsops_sk_range(s, q, &b, &e);
        if (b >= tile_end) {
            return -1;
        }
        if (e > b) {
            return q;
        }
    }
    return -1;
}

/* A CTA's work in the order it does it: its Stream-K pieces, then its
 * data-parallel tiles c, c + ctas, ... (whole: k-iterations [0, iters)).
 * The driver walks it, and a mainloop's producer walks a copy of it ahead
 * of the driver to load the next pieces' operands early. */
struct gemsops_sk_walk {
    int64_t it, end; /* the Stream-K share still to do */
    int64_t dp; /* the next data-parallel tile */
};

GEMSOPS_SK_FN void
gemsops_sk_walk_start(const struct gemsops_sk_schedule *s, int64_t c,
                      struct gemsops_sk_walk *w)
{
    gemsops_sk_range(s, c, &w->it, &w->end);
    w->dp = c;
}

/* The next piece: absolute tile and k-iterations [*k0, *k1); 0 when the
 * CTA's work is done. A piece with k0 > 0 is a peer's, else the owner's
 * (data-parallel tiles have no peers). */
GEMSOPS_SK_FN int
gemsops_sk_walk_next(const struct gemsops_sk_schedule *s,
                     struct gemsops_sk_walk *w, int64_t *tile, int64_t *k0,
                     int64_t *k1)
{
    if (w->it < w->end) {
        w->it = gemsops_sk_piece(s, w->it, w->end, tile, k0, k1);
        return 1;
    }
    if (w->dp < s->dp_tiles) {
        *tile = w->dp;
        *k0 = 0;
        *k1 = s->iters;
        w->dp += s->ctas;
        return 1;
    }
    return 0;
}

/* Tile number (in [0, tiles)) -> batch, tile row and tile column, in the
 * grouped order: group_m tile rows at a time, walked column-major inside
 * the group; the last group may hold fewer rows (its width is what is
 * left, not group_m: the corrected formula). */
GEMSOPS_SK_FN void
gemsops_sk_tile_coords(const struct gemsops_sk_schedule *s, int64_t tile,
                       int64_t *b, int64_t *tm, int64_t *tn)
{
    const int64_t per_batch = s->tiles_m * s->tiles_n;
    *b = tile / per_batch;
    const int64_t t = tile % per_batch;
    const int64_t in_group = (int64_t)s->group_m * s->tiles_n;
    const int64_t group = t / in_group;
    const int64_t first_m = group * s->group_m;
    const int64_t left = s->tiles_m - first_m;
    const int64_t rows = left < s->group_m ? left : s->group_m;
    const int64_t r = t % in_group;
    *tm = first_m + r % rows;
    *tn = r / rows;
}

#ifdef __cplusplus
}
#endif
