"""The Stream-K schedule (include/gemsops/streamk.h), checked by brute force
in C (gemsops_sk_check): every (tile, k-iteration) computed exactly once,
the grouped tile order a bijection (partial last group included), one
owner per Stream-K tile (its last k-iteration's CTA) with its peers
preceding it in CTA order."""

import random

import pytest

import gemsops

MODES = {
    "auto": 0,
    "data-parallel": 1,
    "stream-k": 2,
    "hybrid": 3,
    "split-k": 4,
}


def check(
    m,
    n,
    k,
    batch=1,
    bm=128,
    bn=128,
    bk=32,
    group_m=8,
    ctas=132,
    mode="hybrid",
    two_tiles=0,
):
    return gemsops._C.streamk_check(
        m, n, k, batch, bm, bn, bk, group_m, ctas, MODES[mode], two_tiles
    )


def test_thousands_of_random_shapes_and_cta_counts():
    rng = random.Random(1234)
    for _ in range(3000):
        m, n, k = (
            rng.choice([1, 7, 64, 127, 128, 129, 1000, 4096, 5333])
            for _ in range(3)
        )
        s = check(
            m,
            n,
            k,
            batch=rng.choice([1, 1, 3]),
            bm=rng.choice([64, 128, 256]),
            bn=rng.choice([64, 128]),
            bk=rng.choice([16, 32, 64]),
            group_m=rng.choice([1, 4, 8]),
            ctas=rng.choice([1, 2, 7, 66, 108, 132, 264]),
            mode=rng.choice(list(MODES)),
            two_tiles=rng.choice([0, 1]),
        )
        assert s["sk_tiles"] + s["dp_tiles"] == s["tiles"]
        if s["split"]:
            assert s["sk_ctas"] == s["tiles"] * s["split"]


@pytest.mark.parametrize("ctas", [1, 3, 132])
def test_modes_split_the_tiles_as_named(ctas):
    m, n, k = 3000, 2000, 4096  # 24 x 16 tiles of 128, 128 k-iterations
    tiles = 24 * 16
    assert check(m, n, k, ctas=ctas, mode="data-parallel")["sk_tiles"] == 0
    assert check(m, n, k, ctas=ctas, mode="stream-k")["dp_tiles"] == 0
    hy = check(m, n, k, ctas=ctas, mode="hybrid")
    assert hy["sk_tiles"] == tiles % ctas  # the remainder wave only
    assert hy["dp_tiles"] % hy["ctas"] == 0  # whole waves
    two = check(m, n, k, ctas=ctas, mode="hybrid", two_tiles=1)
    if tiles % ctas and tiles >= ctas:
        assert two["sk_tiles"] == tiles % ctas + ctas
    auto = check(m, n, k, ctas=ctas, mode="auto")
    rem = tiles % ctas  # auto: Stream-K for a last wave at most half full
    assert auto["sk_tiles"] == (rem if 2 * rem <= ctas else 0)


def test_auto_splits_a_sparse_last_wave_only():
    # 11 x 12 + 1 = 133 tiles on 132 CTAs: one tile left over -> Stream-K
    sparse = check(11 * 128, 12 * 128 + 1, 4096, ctas=132, mode="auto")
    assert sparse["tiles"] == 11 * 13 and sparse["sk_tiles"] == 143 - 132
    # 120 left over of 132: the last wave is nearly full -> data-parallel
    assert check(3000, 2000, 4096, ctas=132, mode="auto")["sk_tiles"] == 0


def test_stream_k_grid_never_exceeds_the_resident_ctas():
    for ctas in (1, 5, 132, 1000):
        s = check(8192, 8192, 8192, ctas=ctas, mode="stream-k")
        assert s["ctas"] == ctas
        s = check(100, 100, 64, ctas=ctas, mode="data-parallel")
        assert s["ctas"] == min(ctas, s["tiles"])


def test_partial_last_swizzle_group():
    # 13 tile rows in groups of 8: the last group holds 5 rows
    s = check(13 * 128, 5 * 128, 256, group_m=8, ctas=4, mode="stream-k")
    assert s["tiles_m"] == 13 and s["tiles"] == 65


@pytest.mark.parametrize("group_m", [1, 3, 5, 8, 16])
@pytest.mark.parametrize(
    "m, n, batch",
    [(13 * 128, 5 * 128, 1), (7 * 64, 3 * 64, 5), (1, 1, 9), (3 * 128, 1, 1)],
)
def test_tile_coordinates_by_reciprocal_match_division(m, n, batch, group_m):
    # gemsops_sk_check compares every tile's coordinates (the divisors'
    # multiply-and-shift) with the same order computed by division; whole
    # and partial last groups, groups taller than the grid, batches
    s = check(m, n, 256, batch=batch, bm=64, bn=64, group_m=group_m, ctas=7)
    assert s["tiles"] == batch * -(-m // 64) * -(-n // 64)


def test_tile_coordinates_of_a_million_tiles():
    # tile numbers up to 2^20 through the reciprocals: the first and last
    # batch whole, a stride through the others
    s = check(1024, 1024, 64, batch=1 << 14, bm=128, bn=128, group_m=3)
    assert s["tiles"] == (1 << 14) * 64


def test_more_ctas_than_iterations():
    s = check(64, 64, 64, bm=64, bn=64, bk=32, ctas=132, mode="stream-k")
    assert s["tiles"] == 1 and s["iters"] == 2  # 130 CTAs have nothing


def test_bad_arguments_are_errors():
    with pytest.raises(ValueError, match="'ctas'=0 is out of range"):
        check(10, 10, 10, ctas=0)
    with pytest.raises(TypeError):
        gemsops._C.streamk_check(1, 2, 3)


def test_short_stream_k_regions_go_to_fewer_ctas():
    # 4 tiles x 28 k-iterations on 132 CTAs: a tile in P pieces costs
    # 28 / P + 6 (P - 1) iterations, least at P = 2: 8 CTAs share the
    # Stream-K region and the rest sit it out
    s = check(256, 256, 1792, bk=64, ctas=132, mode="stream-k")
    assert s["sk_tiles"] == 4 and s["iters"] == 28
    assert s["sk_ctas"] == 4 * 2
    # 4 x 100: P = 4 (shares of 25 >= 4 iterations)
    assert (
        check(256, 256, 6400, bk=64, ctas=132, mode="stream-k")["sk_ctas"]
        == 4 * 4
    )
    # 112 tiles x 24 on 132 CTAs: shares of 21 would cut most tiles for
    # 3 iterations saved: whole tiles, one a CTA, and no partials
    s = check(1024, 1792, 1536, bk=64, ctas=132, mode="stream-k")
    assert s["sk_tiles"] == 112 and s["sk_ctas"] == 112
    # 1 tile x 4000 iterations: P = 25, and no more CTAs than that
    assert (
        check(64, 64, 4000 * 16, bk=16, ctas=1000, mode="stream-k")["sk_ctas"]
        == 25
    )
    # a long region keeps every CTA busy
    big = check(4096, 4096, 4096, bk=64, ctas=132, mode="stream-k")
    assert big["sk_ctas"] == 132
    # fewer iterations than one share: a single CTA
    assert check(64, 64, 96, bk=64, ctas=132, mode="stream-k")["sk_ctas"] == 1


def test_split_k_cuts_every_tile_into_equal_pieces():
    # 8 tiles x 28 k-iterations on 132 CTAs: 16 CTAs a tile would fit, 7
    # keep shares of 4 iterations; each CTA's share stays inside one tile
    # (the C check refuses a split share that crosses one)
    s = check(256, 512, 1792, bk=64, ctas=132, mode="split-k")
    assert (s["tiles"], s["iters"], s["split"]) == (8, 28, 7)
    assert s["sk_tiles"] == 8 and s["dp_tiles"] == 0 and s["sk_ctas"] == 56
    # capped at 8 pieces (a tile of 4096 iterations, 132 CTAs)
    assert check(128, 128, 4096 * 64, bk=64, mode="split-k")["split"] == 8
    # 2 pieces a tile when only twice the tiles fit, for iterations not a
    # multiple of the pieces
    s = check(1024, 1024, 1200, bk=64, ctas=130, mode="split-k")
    assert (s["tiles"], s["iters"], s["split"]) == (64, 19, 2)
    assert s["sk_ctas"] == 128
    # fewer than two pieces: whole tiles, no partials
    for m, n, k, ctas in [(2048, 2048, 4096, 132), (256, 256, 448, 132)]:
        s = check(m, n, k, bk=64, ctas=ctas, mode="split-k")
        assert s["split"] == 0 and s["sk_tiles"] == 0, (m, n, k)


def test_check_refuses_more_cells_than_it_can_count():
    # tiles x k-steps past 2^28 (2^64 here, wrapping in 64 bits) refused
    # before any table is made
    for args in (
        (1, 1, 2**40, 2**30, 1, 1, 1, 1, 1, 0, 0),
        (2**40, 2**24, 1, 1, 1, 1, 1, 1, 1, 2, 0),
    ):
        with pytest.raises(ValueError, match="cells"):
            gemsops._C.streamk_check(*args)
