/* gemsops_sk_check: the Stream-K schedule verified by brute force, for the
 * C-level unit test (tests/test_streamk_schedule.py runs it over thousands
 * of shapes and CTA counts). */
#include <stdlib.h>

#include "gemsops/matmul.h"

/* The grouped order in 64-bit divisions, what the divisors of a coords32
 * schedule must reproduce exactly. */
static void
coords_by_division(const struct gemsops_sk_schedule *s, int64_t tile,
                   int64_t *b, int64_t *tm, int64_t *tn)
{
    const int64_t per_batch = s->tiles_m * s->tiles_n;
    const int64_t t = tile % per_batch;
    const int64_t in_group = (int64_t)s->group_m * s->tiles_n;
    const int64_t first_m = t / in_group * s->group_m;
    const int64_t left = s->tiles_m - first_m;
    const int64_t rows = left < s->group_m ? left : s->group_m;
    *b = tile / per_batch;
    *tm = first_m + t % in_group % rows;
    *tn = t % in_group / rows;
}

/* Every CTA's Stream-K share, and the tile of each of its last
 * iterations, against 64-bit division (range32's divisors). */
static int
check_range_divisors(const struct gemsops_sk_schedule *s, gemsops_status *st)
{
    const int64_t total = s->sk_tiles * s->iters;
    for (int64_t c = 0; c < s->sk_ctas; c++) {
        int64_t b, e, tile, k0, k1;
        gemsops_sk_range(s, c, &b, &e);
        if (b != total * c / s->sk_ctas || e != total * (c + 1) / s->sk_ctas) {
            return gemsops_fail(st, GEMSOPS_ERR_VALUE,
                                "CTA %lld's share [%lld, %lld), by division "
                                "[%lld, %lld)",
                                (long long)c, (long long)b, (long long)e,
                                (long long)(total * c / s->sk_ctas),
                                (long long)(total * (c + 1) / s->sk_ctas));
        }
        if (e > b) {
            gemsops_sk_piece(s, b, e, &tile, &k0, &k1);
            if (tile != s->dp_tiles + (e - 1) / s->iters) {
                return gemsops_fail(st, GEMSOPS_ERR_VALUE,
                                    "CTA %lld's last piece in tile %lld, by "
                                    "division %lld",
                                    (long long)c, (long long)tile,
                                    (long long)(s->dp_tiles +
                                                (e - 1) / s->iters));
            }
        }
    }
    return GEMSOPS_OK;
}

/* Tiles of the first and the last batch, and a stride through the rest. */
static int
check_divisors(const struct gemsops_sk_schedule *s, gemsops_status *st)
{
    const int64_t per_batch = s->tiles_m * s->tiles_n;
    const int64_t stride = s->tiles / 4096 + 1;
    for (int64_t t = 0; t < s->tiles; t++) {
        if (t >= per_batch && t < s->tiles - per_batch && t % stride != 0) {
            continue;
        }
        int64_t b, tm, tn, b0, tm0, tn0;
        gemsops_sk_tile_coords(s, t, &b, &tm, &tn);
        coords_by_division(s, t, &b0, &tm0, &tn0);
        if (b != b0 || tm != tm0 || tn != tn0) {
            return gemsops_fail(st, GEMSOPS_ERR_VALUE,
                                "tile %lld: (%lld, %lld, %lld), by division "
                                "(%lld, %lld, %lld)",
                                (long long)t, (long long)b, (long long)tm,
                                (long long)tn, (long long)b0, (long long)tm0,
                                (long long)tn0);
        }
    }
    return GEMSOPS_OK;
}

static int
check_order(const struct gemsops_sk_schedule *s, gemsops_status *st)
{
    const int64_t per_batch = s->tiles_m * s->tiles_n;
    unsigned char *seen = calloc(per_batch > 0 ? per_batch : 1, 1);
    if (seen == NULL) {
        return gemsops_fail(st, GEMSOPS_ERR_RUNTIME, "out of host memory");
    }
    int rc = GEMSOPS_OK;
    for (int64_t t = 0; t < per_batch && rc == GEMSOPS_OK; t++) {
        int64_t b, tm, tn;
        gemsops_sk_tile_coords(s, t, &b, &tm, &tn);
        if (b != 0 || tm < 0 || tm >= s->tiles_m || tn < 0 ||
            tn >= s->tiles_n || seen[tm * s->tiles_n + tn]++) {
            rc = gemsops_fail(st, GEMSOPS_ERR_VALUE,
                              "grouped order: tile %lld -> (%lld, %lld, "
                              "%lld) is out of range or repeated",
                              (long long)t, (long long)b, (long long)tm,
                              (long long)tn);
        }
    }
    free(seen);
    return rc;
}

int
gemsops_sk_check(const struct gemsops_sk_schedule *s, gemsops_status *st)
{
    if (s->sk_tiles + s->dp_tiles != s->tiles || s->sk_tiles < 0 ||
        s->ctas < 1) {
        return gemsops_fail(st, GEMSOPS_ERR_VALUE,
                            "regions: %lld + %lld "
                            "tiles of %lld, %lld CTAs",
                            (long long)s->sk_tiles, (long long)s->dp_tiles,
                            (long long)s->tiles, (long long)s->ctas);
    }
    if (s->sk_ctas < 1 || s->sk_ctas > s->ctas) {
        return gemsops_fail(st, GEMSOPS_ERR_VALUE,
                            "sk_ctas %lld outside "
                            "[1, %lld]",
                            (long long)s->sk_ctas, (long long)s->ctas);
    }
    if (s->split != 0 &&
        (s->split < 2 || s->split > GEMSOPS_SK_MAX_SPLIT ||
         s->sk_tiles != s->tiles || s->sk_ctas != s->tiles * s->split)) {
        return gemsops_fail(st, GEMSOPS_ERR_VALUE,
                            "split-k: %lld pieces a tile, %lld of %lld "
                            "tiles split over %lld CTAs",
                            (long long)s->split, (long long)s->sk_tiles,
                            (long long)s->tiles, (long long)s->sk_ctas);
    }
    if (check_order(s, st) != GEMSOPS_OK ||
        check_divisors(s, st) != GEMSOPS_OK ||
        check_range_divisors(s, st) != GEMSOPS_OK) {
        return st->code;
    }
    const int64_t cells = s->tiles * s->iters;
    unsigned char *count = calloc(cells > 0 ? cells : 1, 1);
    int64_t *peer_of = malloc(s->ctas * sizeof *peer_of);
    if (count == NULL || peer_of == NULL) {
        free(count);
        free(peer_of);
        return gemsops_fail(st, GEMSOPS_ERR_RUNTIME, "out of host memory");
    }
    int rc = GEMSOPS_OK;
    for (int64_t c = 0; c < s->ctas && rc == GEMSOPS_OK; c++) {
        peer_of[c] = -1;
        int64_t begin, end, first = 1;
        gemsops_sk_range(s, c, &begin, &end);
        if (end > begin && end - begin < GEMSOPS_SK_MIN_ITERS &&
            s->sk_ctas > 1) {
            rc = gemsops_fail(st, GEMSOPS_ERR_VALUE,
                              "CTA %lld: a Stream-K "
                              "share of %lld iterations (< %d)",
                              (long long)c, (long long)(end - begin),
                              GEMSOPS_SK_MIN_ITERS);
        }
        if (s->split > 0 && end > begin &&
            (end - 1) / s->iters != begin / s->iters) {
            rc = gemsops_fail(st, GEMSOPS_ERR_VALUE,
                              "split-k: CTA %lld's share [%lld, %lld) "
                              "crosses a tile",
                              (long long)c, (long long)begin, (long long)end);
        }
        while (end > begin && rc == GEMSOPS_OK) {
            int64_t tile, k0, k1;
            const int64_t last = end;
            end = gemsops_sk_piece(s, begin, end, &tile, &k0, &k1);
            if (k1 <= k0 || k0 < 0 || k1 > s->iters || last - end != k1 - k0) {
                rc = gemsops_fail(st, GEMSOPS_ERR_VALUE,
                                  "CTA %lld: piece [%lld, %lld) of tile "
                                  "%lld does not match its share",
                                  (long long)c, (long long)k0, (long long)k1,
                                  (long long)tile);
                break;
            }
            if (gemsops_sk_is_peer(s, k1)) {
                if (!first) {
                    rc = gemsops_fail(st, GEMSOPS_ERR_VALUE,
                                      "CTA %lld ends "
                                      "tile %lld short but not first",
                                      (long long)c, (long long)tile);
                }
                peer_of[c] = tile;
            }
            for (int64_t k = k0; k < k1; k++) {
                count[tile * s->iters + k]++;
            }
            first = 0;
        }
        for (int64_t t = c; t < s->dp_tiles; t += s->ctas) {
            for (int64_t k = 0; k < s->iters; k++) {
                count[t * s->iters + k]++;
            }
        }
    }
    for (int64_t i = 0; i < cells && rc == GEMSOPS_OK; i++) {
        if (count[i] != 1) {
            rc = gemsops_fail(st, GEMSOPS_ERR_VALUE,
                              "tile %lld k-iteration "
                              "%lld computed %d times",
                              (long long)(i / s->iters),
                              (long long)(i % s->iters), count[i]);
        }
    }
    /* data-parallel tiles: no CTA waits for a partial of theirs */
    for (int64_t t = 0; t < s->dp_tiles && rc == GEMSOPS_OK; t++) {
        if (gemsops_sk_next_peer(s, t, s->ctas) >= 0) {
            rc = gemsops_fail(st, GEMSOPS_ERR_VALUE,
                              "data-parallel tile %lld has a peer",
                              (long long)t);
        }
    }
    /* owners: the CTA holding the last k-iteration; its peers, lower
     * numbers in decreasing order, hold the rest of the tile contiguously,
     * name this tile as theirs, and never the owner's own number or more */
    for (int64_t t = s->dp_tiles; t < s->tiles && rc == GEMSOPS_OK; t++) {
        const int64_t g0 = (t - s->dp_tiles) * s->iters;
        const int64_t g1 = g0 + s->iters;
        const int64_t owner = gemsops_sk_cta_of(s, g1 - 1);
        int64_t b, e;
        gemsops_sk_range(s, owner, &b, &e);
        if (!(b <= g1 - 1 && g1 - 1 < e) || peer_of[owner] == t) {
            rc = gemsops_fail(st, GEMSOPS_ERR_VALUE,
                              "tile %lld: CTA %lld "
                              "does not own its last iteration",
                              (long long)t, (long long)owner);
            break;
        }
        int64_t covered = b > g0 ? b : g0; /* [covered, g1) is held */
        for (int64_t q = gemsops_sk_next_peer(s, t, owner); q >= 0;
             q = gemsops_sk_next_peer(s, t, q)) {
            gemsops_sk_range(s, q, &b, &e);
            if (q >= owner || e != covered || peer_of[q] != t) {
                rc = gemsops_fail(st, GEMSOPS_ERR_VALUE,
                                  "tile %lld: peer "
                                  "CTA %lld ends at %lld, expected %lld",
                                  (long long)t, (long long)q, (long long)e,
                                  (long long)covered);
                break;
            }
            covered = b > g0 ? b : g0;
        }
        if (rc == GEMSOPS_OK && covered != g0) {
            rc = gemsops_fail(st, GEMSOPS_ERR_VALUE,
                              "tile %lld: owner and "
                              "peers cover from %lld of %lld",
                              (long long)t, (long long)(covered - g0),
                              (long long)s->iters);
        }
    }
    free(count);
    free(peer_of);
    return rc;
}
