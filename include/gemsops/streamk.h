/* The Stream-K schedule: which CTA computes which k-iterations of which
 * output tile. Pure functions of a plain struct, shared by the host planner
 * (csrc/py_matmul.c, csrc/cuda/matmul_streamk.cu), the CUDA kernels
 * (csrc/cuda/matmul_driver.cuh) and the CPU executor (csrc/cpu/matmul.c),
 * so CI tests the decomposition.
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
 *      * total / sk_ctas); sk_ctas keeps shares >= GEMSOPS_SK_MIN_ITERS),
 *      walked from its end: piece by piece, each piece's k-iterations in
 *      increasing order;
 *   2. then data-parallel tiles c, c + ctas, ... below `dp_tiles`.
 * Modes: data-parallel (sk_tiles = 0), stream-k (dp_tiles = 0), hybrid
 * (full waves of data-parallel tiles, the remainder tiles Stream-K; with
 * `two_tiles`, one full wave more joins the Stream-K region, the seeds'
 * "two tiles" option, which evens out the remainder wave's imbalance),
 * split-k (every tile cut into `split` pieces, one a CTA: Stream-K with
 * sk_ctas = tiles * split, whose shares then never cross a tile).
 *
 * Fix-up (deterministic): a Stream-K tile is OWNED by the CTA that computes
 * its last k-iteration; every other CTA touching it (its PEERS, lower CTA
 * numbers, whose shares end inside it, so that the tile is the first piece
 * of their backward walks) writes its fp32 partial tile to its workspace
 * slot and raises its flag (release). The owner, having computed its own
 * part last, waits for each peer's flag in decreasing CTA order (acquire)
 * and adds that partial: the same schedule gives the same sums in the same
 * order, every run. A CTA is a peer of at most one tile (the one its share
 * ends inside), so slots and flags are one per CTA. No deadlock: peers
 * never wait, and an owner waits only for lower-numbered CTAs, which the
 * GPU starts before it (it dispatches a grid's blocks in increasing index
 * order; CUDA does not promise that order, so the grid also stays within
 * the co-resident CTAs, the planner's job): a resident owner never waits
 * on a CTA still queued behind it, whatever else holds the GPU's SMs.
 *
 * A split-k schedule may be fixed up the other way (`split` > 0; the CUDA
 * wgmma kernels do, each tile's pieces one thread block cluster): every
 * piece, the owner's too, leaves its partial in its CTA's shared memory,
 * the cluster meets at a barrier, and piece j adds all `split` partials
 * of the tile's j-th band of rows, in piece order, and stores that band.
 * Nobody adds a whole tile alone, and nothing goes through global
 * memory. The same sums every run; a cluster's CTAs run at once, so the
 * barrier is always met. */
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

/* n / d for a divisor fixed by the plan, by a multiply and a shift
 * (Granlund and Montgomery, "Division by invariant integers using
 * multiplication", 1994): with l = ceil(log2 d) and
 * mul = floor(2^32 (2^l - d) / d) + 1, n / d = (mulhi(n, mul) + n) >> l
 * for every n < 2^31 (the sum then fits 32 bits). On the GPU an integer
 * division is a chain of about twenty dependent instructions: the TMA
 * producer took three in series before its first load. */
struct gemsops_sk_divisor {
    uint32_t d, mul, shift;
};

typedef enum gemsops_sk_mode {
    GEMSOPS_SK_AUTO = 0, /* planner: hybrid for a sparse last wave      */
    GEMSOPS_SK_DATA_PARALLEL,
    GEMSOPS_SK_STREAM_K,
    GEMSOPS_SK_HYBRID,
    GEMSOPS_SK_SPLIT_K,
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
    int64_t split; /* split-k: pieces a tile (sk_ctas = tiles  */
    /* * split), else 0                        */
    /* gemsops_sk_tile_coords' divisors, set when every tile number and
     * group size is below 2^31 (coords32): the tiles of a batch, of a
     * group, and the tile rows of a whole and of the last group */
    int coords32;
    struct gemsops_sk_divisor per_batch, in_group, group_rows, last_rows;
    /* gemsops_sk_range's and gemsops_sk_piece's divisors (sk_ctas, iters),
     * set when sk_tiles * iters * sk_ctas is below 2^31 (range32): every
     * CTA computes its share, and an owner each of its peers' */
    int range32;
    struct gemsops_sk_divisor by_sk_ctas, by_iters;
};

/* A Stream-K share shorter than this many k-iterations costs more in its
 * partial tile's round trip and its owner's serial wait than it saves: the
 * Stream-K region goes to fewer CTAs instead. */
#define GEMSOPS_SK_MIN_ITERS 4

/* split-k cuts a tile into at most this many pieces */
#define GEMSOPS_SK_MAX_SPLIT 8

/* One peer's partial costs its tile's owner about this many k-iterations
 * of the tile: a 4 x BM x BN-byte round trip through L2, read by the
 * owner's SM alone and added in order (the ratio measured:
 * docs/performance.md, matmul). */
#define GEMSOPS_SK_PEER_COST_ITERS 6

GEMSOPS_SK_FN int64_t
gemsops_sk_cdiv(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

/* 1 <= d < 2^31 */
GEMSOPS_SK_FN struct gemsops_sk_divisor
gemsops_sk_divisor_of(uint32_t d)
{
    struct gemsops_sk_divisor v;
    uint32_t l = 0;
    while (((uint64_t)1 << l) < d) {
        l++;
    }
    v.d = d;
    v.shift = l;
    /* < 2^32: 2^l - d < d */
    v.mul =
        (uint32_t)((((uint64_t)1 << 32) * (((uint64_t)1 << l) - d)) / d + 1);
    return v;
}

/* n / v.d, n < 2^31 */
GEMSOPS_SK_FN uint32_t
gemsops_sk_div(struct gemsops_sk_divisor v, uint32_t n)
{
#ifdef __CUDA_ARCH__
    const uint32_t t = __umulhi(n, v.mul);
#else
    const uint32_t t = (uint32_t)(((uint64_t)n * v.mul) >> 32);
#endif
    return (t + n) >> v.shift;
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

/* Into how many pieces split-k cuts each of `tiles` tiles of `iters`
 * k-iterations on `ctas` CTAs: as many equal pieces a tile as the grid
 * holds, each at least MIN_ITERS long, at most MAX_SPLIT; fewer than two
 * leave the tiles whole. */
GEMSOPS_SK_FN int64_t
gemsops_sk_split_pieces(int64_t tiles, int64_t iters, int64_t ctas)
{
    int64_t pieces = tiles > 0 ? ctas / tiles : 0;
    if (pieces > iters / GEMSOPS_SK_MIN_ITERS) {
        pieces = iters / GEMSOPS_SK_MIN_ITERS;
    }
    return pieces > GEMSOPS_SK_MAX_SPLIT ? GEMSOPS_SK_MAX_SPLIT : pieces;
}

GEMSOPS_SK_FN void
gemsops_sk_set_range_divisors(struct gemsops_sk_schedule *s)
{
    const int64_t lim = (int64_t)1 << 31;
    const int64_t total = s->sk_tiles * s->iters;
    s->range32 = s->iters >= 1 && s->iters < lim && s->sk_ctas >= 1 &&
                 s->sk_ctas < lim && s->sk_tiles < lim && total < lim &&
                 total * s->sk_ctas < lim;
    if (s->range32) {
        s->by_sk_ctas = gemsops_sk_divisor_of((uint32_t)s->sk_ctas);
        s->by_iters = gemsops_sk_divisor_of((uint32_t)s->iters);
    }
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
    const int64_t in_group = (int64_t)s->group_m * s->tiles_n;
    s->coords32 = s->tiles > 0 && s->tiles < ((int64_t)1 << 31) &&
                  in_group < ((int64_t)1 << 31);
    if (s->coords32) {
        const int64_t last = s->tiles_m % s->group_m;
        s->per_batch =
            gemsops_sk_divisor_of((uint32_t)(s->tiles_m * s->tiles_n));
        s->in_group = gemsops_sk_divisor_of((uint32_t)in_group);
        s->group_rows = gemsops_sk_divisor_of((uint32_t)s->group_m);
        s->last_rows =
            gemsops_sk_divisor_of((uint32_t)(last > 0 ? last : s->group_m));
    }
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
    s->split = 0;
    if (mode == GEMSOPS_SK_SPLIT_K) {
        const int64_t pieces = gemsops_sk_split_pieces(s->tiles, s->iters, p);
        if (pieces >= 2) {
            s->split = pieces;
            s->sk_tiles = s->tiles;
            s->dp_tiles = 0;
            s->ctas = p;
            s->sk_ctas = s->tiles * pieces;
            gemsops_sk_set_range_divisors(s);
            return;
        }
        mode = GEMSOPS_SK_DATA_PARALLEL;
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
    gemsops_sk_set_range_divisors(s);
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
    if (s->range32) { /* multiply-shifts, not two 64-bit divisions */
        const uint32_t t32 = (uint32_t)total, c32 = (uint32_t)c;
        *begin = gemsops_sk_div(s->by_sk_ctas, t32 * c32);
        *end = gemsops_sk_div(s->by_sk_ctas, t32 * (c32 + 1));
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

/* The last piece of the Stream-K iterations [begin, end) (end > begin, a
 * CTA's share or what is left of it): the absolute tile number and the
 * k-iterations [*k0, *k1) the piece covers. Returns the piece's first
 * global iteration, the end of what is left. */
GEMSOPS_SK_FN int64_t
gemsops_sk_piece(const struct gemsops_sk_schedule *s, int64_t begin,
                 int64_t end, int64_t *tile, int64_t *k0, int64_t *k1)
{
    const int64_t t =
        s->range32 ? (int64_t)gemsops_sk_div(s->by_iters, (uint32_t)(end - 1))
                   : (end - 1) / s->iters;
    const int64_t tile_begin = t * s->iters;
    const int64_t first = begin > tile_begin ? begin : tile_begin;
    *tile = s->dp_tiles + t;
    *k0 = first - tile_begin;
    *k1 = end - tile_begin;
    return first;
}

/* A piece that stops short of its tile's last k-iteration is a peer's: its
 * CTA hands the partial to the tile's owner. Every other piece (an owner's,
 * or a whole tile) ends with the tile's epilogue. */
GEMSOPS_SK_FN int
gemsops_sk_is_peer(const struct gemsops_sk_schedule *s, int64_t k1)
{
    return k1 < s->iters;
}

/* The peers of the tile `tile` (absolute number), in the order its owner
 * adds them: the first CTA below `prev` whose non-empty share ends inside
 * the tile, or -1 when there is none (always for a data-parallel tile).
 * Start with prev = owner. */
GEMSOPS_SK_FN int64_t
gemsops_sk_next_peer(const struct gemsops_sk_schedule *s, int64_t tile,
                     int64_t prev)
{
    if (tile < s->dp_tiles) {
        return -1;
    }
    const int64_t tile_begin = (tile - s->dp_tiles) * s->iters;
    for (int64_t q = prev - 1; q >= 0; q--) {
        int64_t b, e;
        gemsops_sk_range(s, q, &b, &e);
        if (e <= tile_begin) {
            return -1;
        }
        if (e > b) {
            return q;
        }
    }
    return -1;
}

/* A CTA's work in the order it does it: its Stream-K pieces from the
 * share's end, then its data-parallel tiles c, c + ctas, ... (whole:
 * k-iterations [0, iters)). The driver walks it, and a mainloop's producer
 * walks a copy of it ahead of the driver to load the next pieces' operands
 * early. */
struct gemsops_sk_walk {
    int64_t begin, end; /* the Stream-K share still to do */
    int64_t dp; /* the next data-parallel tile */
};

GEMSOPS_SK_FN void
gemsops_sk_walk_start(const struct gemsops_sk_schedule *s, int64_t c,
                      struct gemsops_sk_walk *w)
{
    gemsops_sk_range(s, c, &w->begin, &w->end);
    w->dp = c;
}

/* The next piece: absolute tile and k-iterations [*k0, *k1); 0 when the
 * CTA's work is done (gemsops_sk_is_peer: whose piece it is; data-parallel
 * tiles have no peers). */
GEMSOPS_SK_FN int
gemsops_sk_walk_next(const struct gemsops_sk_schedule *s,
                     struct gemsops_sk_walk *w, int64_t *tile, int64_t *k0,
                     int64_t *k1)
{
    if (w->end > w->begin) {
        w->end = gemsops_sk_piece(s, w->begin, w->end, tile, k0, k1);
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
    if (s->coords32) {
        const uint32_t gm = (uint32_t)s->group_m;
        const uint32_t t32 = (uint32_t)tile;
        const uint32_t bt = gemsops_sk_div(s->per_batch, t32);
        const uint32_t t = t32 - bt * s->per_batch.d;
        const uint32_t group = gemsops_sk_div(s->in_group, t);
        const uint32_t r = t - group * s->in_group.d;
        const uint32_t first_m = group * gm;
        const struct gemsops_sk_divisor rows =
            first_m + gm <= (uint32_t)s->tiles_m ? s->group_rows
                                                 : s->last_rows;
        const uint32_t col = gemsops_sk_div(rows, r);
        *b = bt;
        *tm = first_m + (r - col * rows.d);
        *tn = col;
        return;
    }
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
