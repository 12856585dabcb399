"""Stream-K mm / bmm / matmul against float64 references, on the CPU (the
same schedule and fix-up as CUDA, OpenMP threads as CTAs) and on CUDA
(tests taking `device`, marked `cuda` there)."""

import contextlib
import gc
import os
import subprocess
import sys

import pytest
import torch

import gemsops
from gemsops.ops.matmul import WGMMA_TILES, WGMMA_TRANSPOSED_TILES
from gemsops.testing import (
    assert_close,
    assert_mm_close,
    product_tolerance,
    raised_type,
)

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
SCHEDULES = ["auto", "data-parallel", "stream-k", "hybrid", "split-k"]


@contextlib.contextmanager
def schedule(name="auto", **kw):
    old = gemsops.ops.matmul.get_schedule()
    gemsops.set_schedule(name, **kw)
    try:
        yield
    finally:
        gemsops.set_schedule(
            old["schedule"],
            two_tiles=old["two_tiles"],
            ctas=old["ctas"],
            spin_limit=old["spin_limit"],
            mainloop=old["mainloop"],
        )


def assert_epilogue_close(got, want, bound, extra, dtype, k, tf32=False):
    """An epilogue's result alpha A B + beta C against its float64 value
    want: product_tolerance on bound = |alpha| |A| |B| (with TF32's input
    rounding where it ran), and the fp32 epilogue's rounding of the addend
    (extra = |beta C|)."""
    tol = product_tolerance(want, bound, k, dtype) + 2**-22 * (
        extra + want.abs()
    )
    if tf32:
        tol = tol + 2**-9 * bound
    err = (got.double() - want).abs()
    assert (err <= tol).all(), f"worst {err.max().item():.3g}"


def rand(*shape, dtype=torch.float32, device="cpu"):
    return torch.randn(*shape, dtype=torch.float32).to(dtype).to(device)


CPU_SHAPES = [
    (1, 1, 32),
    (15, 160, 1024),
    (495, 533, 71),
    (128, 128, 6400),
    (200, 96, 511),
    (130, 70, 1001),
    (16, 640, 2048),
    (8, 1024, 1024),
]
CUDA_ONLY = [
    (495, 5333, 71),
    (1536, 1792, 6016),
    (512, 1024, 4096),
    (16, 2560, 8192),
    (8, 8192, 8192),
    (2304, 5632, 3328),
]


@pytest.mark.parametrize("m,n,k", CPU_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_shapes(m, n, k, dtype, device):
    a, b = (
        rand(m, k, dtype=dtype, device=device),
        rand(k, n, dtype=dtype, device=device),
    )
    assert_mm_close(gemsops.mm(a, b), a, b, dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("m,n,k", CUDA_ONLY)
@pytest.mark.parametrize("dtype", DTYPES)
def test_large_shapes_cuda(m, n, k, dtype):
    a, b = (
        rand(m, k, dtype=dtype, device="cuda"),
        rand(k, n, dtype=dtype, device="cuda"),
    )
    assert_mm_close(gemsops.mm(a, b), a, b, dtype)


@pytest.mark.parametrize("sched", SCHEDULES)
@pytest.mark.parametrize("two_tiles", [False, True])
@pytest.mark.parametrize("ctas", [0, 3, 7])
@pytest.mark.parametrize(
    "dtype,k,b_t",
    [
        (torch.float32, 257, False),
        (torch.bfloat16, 1024, False),
        (torch.float16, 520, True),
    ],
)
def test_every_schedule_is_correct_and_bitwise_repeatable(
    sched, two_tiles, ctas, dtype, k, b_t, device
):
    a = rand(300, k, dtype=dtype, device=device)
    b = (
        rand(200, k, dtype=dtype, device=device).t()
        if b_t
        else rand(k, 200, dtype=dtype, device=device)
    )
    with schedule(sched, two_tiles=two_tiles, ctas=ctas):
        first = gemsops.mm(a, b)
        second = gemsops.mm(a, b)
    assert_mm_close(first, a, b, dtype)
    assert torch.equal(first, second)


def plan_of(a, b, mainloop="auto"):
    c = torch.empty(1, a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
    return gemsops._C.matmul_plan(
        a[None], b[None], c, 0, 0, 0, gemsops.ops.matmul.MAINLOOPS[mainloop]
    )


def is_sm90():
    return torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tensor_core_path_is_taken_when_aligned(dtype):
    a = rand(256, 512, dtype=dtype, device="cuda")
    b = rand(512, 384, dtype=dtype, device="cuda")
    bt = rand(384, 512, dtype=dtype, device="cuda").t()  # B K-contiguous
    at = rand(512, 256, dtype=dtype, device="cuda").t()  # A M-contiguous
    tc = "wgmma" if is_sm90() else "mma"
    for x, y in [(a, b), (a, bt)]:
        assert plan_of(x, y)["mainloop"].startswith(tc)
        assert plan_of(x, y, "mma")["mainloop"] == "mma"
        assert plan_of(x, y, "ffma")["mainloop"] == "ffma"
    # k % 8 with aligned strides: TMA fills past k with zeros, cp.async
    # cannot
    assert plan_of(a[:, :511], b[:511])["mainloop"].startswith(
        "wgmma" if is_sm90() else "ffma"
    )
    assert plan_of(a[:, :511], b[:511])["staged"] == ""
    # an M-contiguous A: wgmma reads it in place, mma.sync cannot
    assert plan_of(at, b)["mainloop"].startswith(
        "wgmma" if is_sm90() else "ffma"
    )
    assert plan_of(at, b, "mma")["mainloop"] == "ffma"
    if is_sm90():
        assert plan_of(a, b, "wgmma-256")["bn"] == 256
        assert plan_of(a, b, "wgmma-192")["bn"] == 192
        assert plan_of(a, b, "wgmma-128")["bn"] == 128
        assert plan_of(a, b, "wgmma-64")["bn"] == 64
        small = plan_of(a, b, "wgmma-64x64")
        assert (small["mainloop"], small["bm"], small["bn"]) == (
            "wgmma-64x64",
            64,
            64,
        )
        square = plan_of(a, b, "wgmma-192x192")
        assert (square["mainloop"], square["bm"], square["bn"]) == (
            "wgmma-192x192",
            192,
            192,
        )


@pytest.mark.cuda
def test_few_tiles_over_long_k_take_64x64_tiles():
    # the cost model's fifth tile: an output of few 128-row tiles over long
    # k (96 tiles of 64 x 64 on any Hopper part) takes it, a large square
    # does not; the product is right either way
    if not is_sm90():
        pytest.skip("wgmma tiles: sm_90a")
    a, b = (
        cu(768, 2560, dtype=torch.bfloat16),
        cu(2560, 512, dtype=torch.bfloat16),
    )
    plan = plan_of(a, b)
    assert (plan["mainloop"], plan["tiles"], plan["split"]) == (
        "wgmma-64x64",
        96,
        0,
    ), plan
    assert_mm_close(gemsops.mm(a, b), a, b, torch.bfloat16)
    big = cu(4096, 4096, dtype=torch.bfloat16)
    assert plan_of(big, big)["bm"] == 128


@pytest.mark.cuda
def test_one_wave_of_192x192_tiles_is_taken_whole():
    # 5888 x 768 makes 124 tiles of 192 x 192, one wave on a part of at
    # least 124 SMs, against 184 of 128 x 192 (1.4 waves): the planner takes
    # them; a Stream-K schedule asked of them runs them whole (they have no
    # Stream-K kernel); the product is right either way
    if not is_sm90():
        pytest.skip("wgmma tiles: sm_90a")
    a, b = (
        cu(5888, 3072, dtype=torch.bfloat16),
        cu(3072, 768, dtype=torch.bfloat16),
    )
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if sms >= 124:
        plan = plan_of(a, b)
        assert (plan["mainloop"], plan["tiles"], plan["sk_tiles"]) == (
            "wgmma-192x192",
            124,
            0,
        ), plan
    assert_mm_close(gemsops.mm(a, b), a, b, torch.bfloat16)
    c = torch.empty(1, 400, 600, dtype=torch.float16, device="cuda")
    x = cu(400, 1000, dtype=torch.float16)
    y = cu(1000, 600, dtype=torch.float16)
    for sched in ("stream-k", "hybrid"):
        plan = gemsops._C.matmul_plan(
            x[None],
            y[None],
            c,
            gemsops.ops.matmul.SCHEDULES[sched],
            0,
            5,
            gemsops.ops.matmul.MAINLOOPS["wgmma-192x192"],
        )
        assert (plan["bm"], plan["sk_tiles"], plan["ctas"]) == (192, 0, 5)
        with schedule(sched, mainloop="wgmma-192x192", ctas=5):
            out = gemsops.mm(x, y)
        assert_mm_close(out, x, y, torch.float16, name=sched)


@pytest.mark.cuda
def test_auto_runs_64x64_tiles_whole_or_split_k():
    # their Stream-K and hybrid plans lost to their whole-tile and split-k
    # plans on every small shape timed: under auto a 64 x 64 plan has no
    # Stream-K tiles unless it is split-k's
    if not is_sm90():
        pytest.skip("wgmma tiles: sm_90a")
    took = 0
    for m, n, k in [
        (256, 768, 4352),
        (512, 256, 4096),
        (256, 256, 1792),
        (256, 512, 2560),
        (768, 512, 2560),
        (16, 2560, 8192),
    ]:
        a, b = cu(m, k, dtype=torch.bfloat16), cu(k, n, dtype=torch.bfloat16)
        plan = plan_of(a, b)
        if plan["mainloop"] == "wgmma-64x64":
            took += 1
            assert plan["sk_tiles"] == 0 or plan["split"] > 0, (m, n, k, plan)
            assert_mm_close(gemsops.mm(a, b), a, b, torch.bfloat16)
    assert took >= 3


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_at_most_64_rows_take_64x64_tiles(dtype):
    # one row of 64 x 64 tiles reads what a 128-row tile reads of B, without
    # the zero-filled rows: the planner takes them (fp32 above the skinny
    # kernels' 16 rows, as TF32)
    if not is_sm90():
        pytest.skip("the wgmma tiles need sm_90")
    with tf32(dtype == F32):
        for m, n, k in [(17, 4096, 1024), (40, 12288, 4096), (64, 1024, 4096)]:
            a, b = cu(m, k, dtype=dtype), cu(k, n, dtype=dtype)
            plan = plan_of(a, b)
            assert plan["mainloop"] == "wgmma-64x64", (m, n, k, plan)
            out = gemsops.mm(a, b)
            if dtype == F32:
                assert_tf32(out, a, b, name=f"{m}x{n}x{k}")
            else:
                assert_mm_close(out, a, b, dtype, name=f"{m}x{n}x{k}")


# (m, n, k) with ragged edges in every dimension, and a K that is not a
# multiple of the 64-deep k-step
TC_SHAPES = [(128, 256, 64), (200, 136, 520), (1, 8, 8), (264, 392, 1000)]


@pytest.mark.cuda
@pytest.mark.parametrize(
    "mainloop",
    [*WGMMA_TILES, "mma"],
)
@pytest.mark.parametrize(
    "a_major,b_major", [("k", "n"), ("k", "k"), ("m", "n"), ("m", "k")]
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("sched", ["data-parallel", "stream-k"])
def test_tensor_core_mainloops_every_layout(
    mainloop, a_major, b_major, dtype, sched
):
    for m, n, k in TC_SHAPES:
        a, b = laid_out(m, n, k, a_major, b_major, dtype)
        used = plan_of(a, b, mainloop)["mainloop"]
        if is_sm90() and (m % 8 == 0 or a_major == "k"):
            assert used == mainloop or (
                mainloop == "mma" and a_major == "m" and used == "ffma"
            ), used
        with schedule(
            sched, mainloop=mainloop, ctas=5 if sched == "stream-k" else 0
        ):
            first = gemsops.mm(a, b)
            second = gemsops.mm(a, b)
        assert_mm_close(first, a, b, dtype, name=f"{m}x{n}x{k} {used}")
        assert torch.equal(first, second)


def laid_out(m, n, k, a_major, b_major, dtype):
    """a [m, k] and b [k, n] on the GPU, each with unit stride along the
    named dim (a: "k" or "m"; b: "n" or "k")."""
    a = (
        rand(m, k, dtype=dtype, device="cuda")
        if a_major == "k"
        else rand(k, m, dtype=dtype, device="cuda").t()
    )
    b = (
        rand(k, n, dtype=dtype, device="cuda")
        if b_major == "n"
        else rand(n, k, dtype=dtype, device="cuda").t()
    )
    return a, b


def cu(*shape, dtype):
    """Made on the GPU: .cuda() of a strided or broadcast view would copy
    it to a dense layout."""
    return rand(*shape, dtype=dtype, device="cuda")


def odd_view(m, n, dtype):
    """[m, n], row-major, starting 2 bytes past a 16-byte boundary."""
    return cu(m * n + 1, dtype=dtype)[1:].view(m, n)


# operands TMA cannot describe (a row stride or base off 16 bytes, no unit
# stride), each with the operands the launch copies for TMA on sm_90a
STAGED_CASES = {
    "k71": (lambda d: (cu(200, 71, dtype=d), cu(71, 300, dtype=d)), "ab"),
    "k1001": (lambda d: (cu(130, 1001, dtype=d), cu(1001, 72, dtype=d)), "a"),
    "n333": (lambda d: (cu(64, 256, dtype=d), cu(256, 333, dtype=d)), "b"),
    "bt_k71": (
        lambda d: (cu(96, 71, dtype=d), cu(264, 71, dtype=d).t()),
        "ab",
    ),
    "at_m99": (
        lambda d: (cu(520, 99, dtype=d).t(), cu(520, 136, dtype=d)),
        "a",
    ),
    "offset": (
        lambda d: (odd_view(136, 264, d), odd_view(264, 200, d)),
        "ab",
    ),
    "no_unit_stride": (
        lambda d: (cu(130, 144, dtype=d)[:, ::2], cu(72, 80, dtype=d)),
        "a",
    ),
    # nothing staged: aligned strides, n % 8 != 0 (C leaves the tile
    # element by element through shared memory)
    "n100_view": (
        lambda d: (cu(128, 64, dtype=d), cu(64, 104, dtype=d)[:, :100]),
        "",
    ),
    "broadcast_row": (
        lambda d: (cu(1, 72, dtype=d).expand(130, 72), cu(72, 80, dtype=d)),
        "a",
    ),
}


@pytest.mark.cuda
@pytest.mark.parametrize("case", sorted(STAGED_CASES))
@pytest.mark.parametrize("sched", ["auto", "data-parallel", "stream-k"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_unaligned_operands_are_staged_for_wgmma(case, sched, dtype):
    make, staged = STAGED_CASES[case]
    a, b = make(dtype)
    plan = plan_of(a, b)
    if is_sm90():
        assert plan["mainloop"].startswith("wgmma"), plan
        assert plan["staged"] == staged, plan
    else:
        assert plan["staged"] == "", plan
    with schedule(sched, ctas=5 if sched == "stream-k" else 0):
        first = gemsops.mm(a, b)
        second = gemsops.mm(a, b)
    assert_mm_close(first, a, b, dtype, name=f"{case} {plan['mainloop']}")
    assert torch.equal(first, second)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_staged_operands_batched_bias_and_backward(dtype):
    # a batch of A staged per batch, B broadcast over it (stride 0: staged
    # once), the epilogue's bias, and the backward's transposed views
    a = rand(3, 40, 71, dtype=dtype, device="cuda")
    b = rand(71, 99, dtype=dtype, device="cuda").expand(3, 71, 99)
    out = gemsops.bmm(a, b)
    assert_mm_close(out, a, b, dtype)
    x = rand(5, 37, 71, dtype=dtype, device="cuda").requires_grad_()
    w = rand(99, 71, dtype=dtype, device="cuda").requires_grad_()
    bias = rand(99, dtype=dtype, device="cuda").requires_grad_()
    y = gemsops.linear(x, w, bias)
    ref = torch.nn.functional.linear(x.double(), w.double(), bias.double())
    x2, wd = x.detach().reshape(-1, 71).double(), w.detach().double()
    bound = (x2.abs() @ wd.abs().t()).reshape(ref.shape)
    extra = bias.detach().double().abs().expand_as(ref)
    assert_epilogue_close(y, ref, bound, extra, dtype, 71)
    # the epilogue's full [m, n] addend, beside C's odd row length
    inp = cu(40, 99, dtype=dtype)
    m1, m2 = cu(40, 64, dtype=dtype), cu(64, 99, dtype=dtype)
    out = gemsops.addmm(inp, m1, m2, beta=0.5, alpha=2.0)
    m1d, m2d, inpd = m1.double(), m2.double(), inp.double()
    ref = torch.addmm(inpd, m1d, m2d, beta=0.5, alpha=2.0)
    bound = 2.0 * (m1d.abs() @ m2d.abs())
    assert_epilogue_close(out, ref, bound, 0.5 * inpd.abs(), dtype, 64)
    g = rand(5, 37, 99, dtype=dtype, device="cuda")
    y.backward(g)
    g2 = g.reshape(-1, 99)
    assert_mm_close(x.grad.reshape(-1, 71), g2, w.detach(), dtype, name="dx")
    assert_mm_close(
        w.grad, g2.t(), x.detach().reshape(-1, 71), dtype, name="dW"
    )


@pytest.mark.cuda
@pytest.mark.parametrize(
    "mainloop",
    WGMMA_TILES,
)
def test_wgmma_batched_broadcast_and_backward(mainloop):
    a = rand(3, 1, 136, 200, dtype=torch.bfloat16, device="cuda")
    b = rand(2, 200, 72, dtype=torch.bfloat16, device="cuda")
    with schedule("hybrid", mainloop=mainloop):
        out = gemsops.matmul(a, b)
        x = rand(96, 264, dtype=torch.float16, device="cuda").requires_grad_()
        w = rand(264, 40, dtype=torch.float16, device="cuda").requires_grad_()
        y = gemsops.mm(x, w)
        g = rand(96, 40, dtype=torch.float16, device="cuda")
        y.backward(g)
    assert_mm_close(out, a, b, torch.bfloat16)
    # dA = g . W^T (B K-contiguous), dW = X^T . g (A M-contiguous)
    assert_mm_close(x.grad, g, w.detach().t(), torch.float16, name="dA")
    assert_mm_close(w.grad, x.detach().t(), g, torch.float16, name="dW")


# (m, n, k): ragged rows (the tiles' 80, 96 and 160), ragged columns past
# 128, k past one 64-deep step and not a multiple of it, one row, one tile
TRANSPOSED_SHAPES = [
    (200, 136, 520),
    (264, 392, 1000),
    (1, 8, 8),
    (161, 264, 72),
    (480, 128, 64),
    (1000, 1032, 336),
]


def into_poisoned(a, b, c):
    """The kernel's product of a and b straight into c (prefilled with NaN
    by the caller: an element it misses stays NaN)."""
    gemsops.ops.matmul._launch_product(gemsops._C.matmul, a, b, c)


@pytest.mark.cuda
@pytest.mark.parametrize("mainloop", WGMMA_TRANSPOSED_TILES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("sched", ["data-parallel", "stream-k", "hybrid"])
def test_transposed_tiles_write_every_element_of_c(mainloop, dtype, sched):
    # the swapped product C^T = B^T A^T, written back as C: into a poisoned
    # out, the same bits twice, Stream-K's fix-up on a grid of 5 CTAs
    ctas = 5 if sched != "data-parallel" else 0
    for m, n, k in TRANSPOSED_SHAPES:
        a = rand(m, k, dtype=dtype, device="cuda")
        b = rand(k, n, dtype=dtype, device="cuda")
        name = f"{m}x{n}x{k} {mainloop} {sched}"
        plan = plan_with(a, b, mainloop, sched, ctas)
        rows, cols = map(int, mainloop[6:].split("x"))  # of C's tile
        if is_sm90():
            assert plan["mainloop"] == mainloop, name
            assert (plan["bm"], plan["bn"]) == (cols, rows), name
            assert plan["tiles"] == -(-n // cols) * -(-m // rows), name
        outs = [
            torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
            for _ in range(2)
        ]
        with schedule(sched, mainloop=mainloop, ctas=ctas):
            for out in outs:
                into_poisoned(a, b, out)
        assert_mm_close(outs[0], a, b, dtype, name=name)
        assert torch.equal(outs[0], outs[1]), name


@pytest.mark.cuda
@pytest.mark.parametrize("mainloop", WGMMA_TRANSPOSED_TILES)
def test_transposed_tiles_batched_against_a_broadcast_b(mainloop):
    # B's batch stride 0 is the swapped product's A stride; C's batches
    # apart by m x n as ever
    for sched in ["data-parallel", "stream-k"]:
        a = rand(3, 136, 200, dtype=torch.bfloat16, device="cuda")
        b = rand(1, 200, 264, dtype=torch.bfloat16, device="cuda")
        out = torch.full(
            (3, 136, 264), float("nan"), dtype=torch.bfloat16, device="cuda"
        )
        with schedule(sched, mainloop=mainloop, ctas=7):
            into_poisoned(a, b.expand(3, -1, -1), out)
        for i in range(3):
            assert_mm_close(
                out[i], a[i], b[0], torch.bfloat16, name=f"{sched} batch {i}"
            )


@pytest.mark.cuda
@pytest.mark.parametrize("mainloop", WGMMA_TRANSPOSED_TILES)
def test_transposed_tiles_leave_other_products_to_wgmma_128(mainloop):
    # A M-contiguous, B K-contiguous, C's rows not 16-byte aligned: the
    # 128 x 128 tiles; a bias (addmm) on any of them, or on the layout the
    # swapped product takes: the right values
    dt = torch.float16
    cases = [
        (rand(200, 136, dtype=dt, device="cuda").t(), cu(200, 264, dtype=dt)),
        (cu(136, 200, dtype=dt), rand(264, 200, dtype=dt, device="cuda").t()),
        (cu(136, 200, dtype=dt), cu(200, 260, dtype=dt)),
    ]
    for a, b in cases:
        plan = plan_with(a, b, mainloop)
        if is_sm90():
            assert plan["mainloop"] in ("wgmma-128", "mma", "ffma"), plan
        with schedule("auto", mainloop=mainloop):
            got = gemsops.mm(a, b)
            bias = cu(b.shape[1], dtype=dt)
            fused = gemsops.addmm(bias, a, b)
        assert_mm_close(got, a, b, dt)
        want = a.double() @ b.double() + bias.double()
        bound = a.double().abs() @ b.double().abs()
        assert_epilogue_close(
            fused, want, bound, bias.double().abs(), dt, a.shape[1]
        )
    a, b = cu(136, 200, dtype=dt), cu(200, 264, dtype=dt)
    bias = cu(264, dtype=dt)
    with schedule("auto", mainloop=mainloop):
        fused = gemsops.addmm(bias, a, b, alpha=0.5)
    assert_epilogue_close(
        fused,
        0.5 * (a.double() @ b.double()) + bias.double(),
        0.5 * (a.double().abs() @ b.double().abs()),
        bias.double().abs(),
        dt,
        200,
    )


# (m, n, k, pieces a tile): ragged edges in every dimension; the grid
# capped at tiles x pieces, so that each count of bands is taken
SPLIT_CASES = [
    (200, 136, 2000, 8),
    (300, 520, 1000, 3),
    (1, 8, 4096, 7),
    (136, 300, 777, 2),
    (64, 72, 8200, 5),
]


@pytest.mark.cuda
@pytest.mark.parametrize(
    "mainloop",
    WGMMA_TILES,
)
@pytest.mark.parametrize(
    "dtype", [torch.float16, torch.bfloat16, torch.float32]
)
def test_split_k_pieces_sum_their_bands(mainloop, dtype):
    # split-k on wgmma: a tile's pieces are one cluster; each leaves its
    # partial in shared memory and adds one band of columns of all the
    # tile's partials; with the epilogue's row bias and full addend too,
    # the same bits launch after launch, and a CUDA graph's replays; no
    # workspace unless an operand is staged (the C call launches at once)
    f32 = dtype == torch.float32
    tile = mainloop.split("-")[1]
    bm, bn = map(int, tile.split("x")) if "x" in tile else (128, int(tile))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bk = 128 // (4 if f32 else 2)
    for m, n, k, pieces in SPLIT_CASES:
        a, b = cu(m, k, dtype=dtype), cu(k, n, dtype=dtype)
        bias, full = cu(n, dtype=dtype), cu(m, n, dtype=dtype)
        tiles = -(-m // bm) * -(-n // bn)
        ctas = tiles * pieces
        name = f"{m}x{n}x{k} {mainloop} {dtype} pieces={pieces}"
        with tf32(f32), schedule("split-k", mainloop=mainloop, ctas=ctas):
            c = torch.empty(1, m, n, dtype=dtype, device="cuda")
            plan = gemsops._C.matmul_plan(
                a[None],
                b[None],
                c,
                4,
                0,
                ctas,
                gemsops.ops.matmul.MAINLOOPS[mainloop],
            )
            outs = [gemsops.mm(a, b) for _ in range(2)]
            c.fill_(float("nan"))
            need = gemsops._C.matmul(
                a[None],
                b[None],
                c,
                4,
                0,
                ctas,
                gemsops.ops.matmul.MAINLOOPS[mainloop],
                None,
                None,
                0,
                0,
                None,
            )
            row = gemsops.addmm(bias, a, b)
            whole = gemsops.addmm(full, a, b, beta=0.5, alpha=2.0)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=side):
                captured = gemsops.mm(a, b)
        if is_sm90():
            assert plan["mainloop"] == mainloop, name
            # cut until every tile's cluster is resident at once: exact
            # where the clusters surely fit (64 x 64 tiles: more tiles)
            want = min(pieces, -(-k // bk) // 4)
            if tiles * want <= sms // 2:
                assert plan["split"] == want, name
            assert plan["split"] <= want, name
            if plan["split"]:
                assert plan["sk_ctas"] == tiles * plan["split"], name
                assert plan["ctas"] == plan["sk_ctas"], name
            if not plan["staged"]:  # (staged operands live in a workspace)
                assert need is None, name
                assert torch.equal(c[0], outs[0]), name
        else:
            assert plan["split"] == 0, name
        if f32:
            assert_tf32(outs[0], a, b, name=name)
        else:
            assert_mm_close(outs[0], a, b, dtype, name=name)
        assert torch.equal(outs[0], outs[1]), name
        ref = a.double() @ b.double()
        bound = a.double().abs() @ b.double().abs()
        for got, want, alpha, extra in [
            (row, ref + bias.double(), 1, bias.double().abs()),
            (
                whole,
                2 * ref + 0.5 * full.double(),
                2,
                0.5 * full.double().abs(),
            ),
        ]:
            assert_epilogue_close(
                got, want, alpha * bound, extra, dtype, a.shape[1], f32
            )
        for _ in range(2):
            captured.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(captured, outs[0]), name


# (m, n, k, ctas): 64 tiles over 5 CTAs (13 or 12 a CTA: each warpgroup's
# last tile, and a CTA whose second warpgroup has one tile fewer), one
# tile, ragged edges with k of one step, two tiles, and k of 129 steps
# (the second warpgroup's cursor passes many laps of the ring)
PINGPONG_CASES = [
    (1000, 900, 520, 5),
    (1, 8, 8, 0),
    (264, 392, 64, 3),
    (128, 256, 64, 0),
    (300, 520, 8200, 2),
]


def plan_with(a, b, mainloop, sched="auto", ctas=0):
    c = torch.empty(1, a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
    return gemsops._C.matmul_plan(
        a[None],
        b[None],
        c,
        gemsops.ops.matmul.SCHEDULES[sched],
        0,
        ctas,
        gemsops.ops.matmul.MAINLOOPS[mainloop],
    )


@pytest.mark.cuda
@pytest.mark.parametrize(
    "a_major,b_major", [("k", "n"), ("k", "k"), ("m", "n"), ("m", "k")]
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_pingpong_every_layout(a_major, b_major, dtype):
    # each consumer warpgroup on whole 128 x 128 tiles of its own: the same
    # wgmmas in the same order as the cooperative kernel's tile, so the
    # same bits as wgmma-128's whole tiles, launch after launch
    if not is_sm90():
        pytest.skip("wgmma: sm_90a")
    for m, n, k, ctas in PINGPONG_CASES:
        a, b = laid_out(m, n, k, a_major, b_major, dtype)
        name = f"{m}x{n}x{k} {a_major}{b_major} ctas={ctas}"
        plan = plan_with(a, b, "wgmma-pingpong", ctas=ctas)
        assert (plan["mainloop"], plan["bm"], plan["bn"]) == (
            "wgmma-pingpong",
            128,
            128,
        ), (name, plan)
        assert (plan["sk_tiles"], plan["split"]) == (0, 0), (name, plan)
        with schedule("data-parallel", mainloop="wgmma-pingpong", ctas=ctas):
            first = gemsops.mm(a, b)
            second = gemsops.mm(a, b)
        with schedule("data-parallel", mainloop="wgmma-128", ctas=ctas):
            cooperative = gemsops.mm(a, b)
        assert_mm_close(first, a, b, dtype, name=name)
        assert torch.equal(first, second), name
        assert torch.equal(first, cooperative), name


@pytest.mark.cuda
@pytest.mark.parametrize("sched", ["auto", "stream-k", "hybrid", "split-k"])
def test_pingpong_runs_any_schedule_asked_as_whole_tiles(sched):
    # it has no Stream-K or split-k kernel: those schedules run whole tiles
    # (a split-k plan left as such would leave C unwritten)
    if not is_sm90():
        pytest.skip("wgmma: sm_90a")
    a, b = (
        cu(300, 4000, dtype=torch.bfloat16),
        cu(4000, 520, dtype=torch.bfloat16),
    )
    for ctas in (0, 7):
        plan = plan_with(a, b, "wgmma-pingpong", sched, ctas)
        assert (plan["mainloop"], plan["sk_tiles"], plan["split"]) == (
            "wgmma-pingpong",
            0,
            0,
        ), plan
        assert plan["dp_tiles"] == plan["tiles"] == 15, plan
        with schedule(sched, mainloop="wgmma-pingpong", ctas=ctas):
            out = gemsops.mm(a, b)
        assert_mm_close(out, a, b, torch.bfloat16, name=f"{sched} {ctas}")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_pingpong_epilogue_batches_backward_and_graphs(dtype):
    # the row bias staged per warpgroup, a full addend, broadcast batches,
    # the backward's transposed views, and a CUDA graph's replays
    if not is_sm90():
        pytest.skip("wgmma: sm_90a")
    m, n, k = 520, 1000, 264
    a, b = cu(m, k, dtype=dtype), cu(k, n, dtype=dtype)
    bias, full = cu(n, dtype=dtype), cu(m, n, dtype=dtype)
    ref = a.double() @ b.double()
    bound = a.double().abs() @ b.double().abs()
    with schedule("auto", mainloop="wgmma-pingpong", ctas=3):
        row = gemsops.addmm(bias, a, b)
        whole = gemsops.addmm(full, a, b, beta=0.5, alpha=2.0)
        batched_a = cu(3, 1, 136, 200, dtype=dtype)
        batched_b = cu(2, 200, 72, dtype=dtype)
        batched = gemsops.matmul(batched_a, batched_b)
        x = cu(264, 392, dtype=dtype).requires_grad_()
        w = cu(392, 200, dtype=dtype).requires_grad_()
        g = cu(264, 200, dtype=dtype)
        gemsops.mm(x, w).backward(g)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            captured = gemsops.addmm(bias, a, b)
    for got, want, alpha, extra in [
        (row, ref + bias.double(), 1, bias.double().abs()),
        (whole, 2 * ref + 0.5 * full.double(), 2, 0.5 * full.double().abs()),
    ]:
        assert_epilogue_close(got, want, alpha * bound, extra, dtype, k)
    assert_mm_close(batched, batched_a, batched_b, dtype, name="batched")
    assert_mm_close(x.grad, g, w.detach().t(), dtype, name="dA")
    assert_mm_close(w.grad, x.detach().t(), g, dtype, name="dW")
    for _ in range(2):
        captured.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, row)


@pytest.mark.cuda
def test_auto_takes_pingpong_for_many_tiles_over_short_k():
    # 1456 tiles of 128 x 128 over 8 k-steps: under auto the pingpong
    # kernel (each CTA's epilogues under its other warpgroup's mainloops)
    # on a 132-SM part; not for fp32 (no TF32 pingpong kernel), nor under a
    # Stream-K schedule asked for, nor for one wave of tiles
    if not is_sm90():
        pytest.skip("wgmma: sm_90a")
    a, b = (
        cu(3328, 512, dtype=torch.bfloat16),
        cu(512, 7168, dtype=torch.bfloat16),
    )
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if sms == 132:
        plan = plan_with(a, b, "auto")
        assert (plan["mainloop"], plan["sk_tiles"]) == ("wgmma-pingpong", 0)
    assert plan_with(a, b, "auto", "stream-k")["mainloop"] != "wgmma-pingpong"
    assert_mm_close(gemsops.mm(a, b), a, b, torch.bfloat16)
    one_wave = cu(1024, 512, dtype=torch.bfloat16)
    assert plan_with(one_wave, b[:, :1024], "auto")["mainloop"] != (
        "wgmma-pingpong"
    )
    with tf32(True):
        af, bf = a.float(), b.float()
        assert plan_with(af, bf, "auto")["mainloop"] != "wgmma-pingpong"
    # over long k the cooperative tiles (a GPT MLP's 768-wide products)
    long_k = (
        cu(8192, 3072, dtype=torch.bfloat16),
        cu(3072, 768, dtype=torch.bfloat16),
    )
    assert plan_with(*long_k, "auto")["mainloop"] != "wgmma-pingpong"
    assert_mm_close(gemsops.mm(*long_k), *long_k, torch.bfloat16)


@pytest.mark.cuda
def test_pingpong_hands_fp32_and_row_sums_to_the_cooperative_kernel():
    # TF32 and the in-kernel row sums (A M-contiguous, B N-contiguous) have
    # no pingpong kernel: the plan says wgmma-128; A's row sums of other
    # layouts come after a pingpong product
    if not is_sm90():
        pytest.skip("wgmma: sm_90a")
    a, b = cu(300, 520, dtype=F32), cu(520, 200, dtype=F32)
    with tf32(True):
        assert plan_with(a, b, "wgmma-pingpong")["mainloop"] == "wgmma-128"
        with schedule("auto", mainloop="wgmma-pingpong"):
            out = gemsops.mm(a, b)
    assert_tf32(out, a, b)
    for a_major, b_major in [("m", "n"), ("k", "n")]:
        a, b = laid_out(300, 520, 1000, a_major, b_major, torch.bfloat16)
        rs = poisoned(300, torch.bfloat16, "cuda")
        with schedule("auto", mainloop="wgmma-pingpong"):
            out = gemsops.ops.matmul._mm(a, b, row_sums=rs)
        name = f"{a_major}{b_major}"
        assert_mm_close(out, a, b, torch.bfloat16, name=name)
        assert_row_sums(rs, a, torch.bfloat16, name=name)


@pytest.mark.cuda
@pytest.mark.parametrize("sched,ctas", [("data-parallel", 0), ("stream-k", 7)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_back_to_back_launches_read_what_the_last_one_wrote(
    sched, ctas, dtype
):
    # on sm_90 a launch may start while the kernel before it finishes
    # (programmatic dependent launch): each product reads the output of the
    # launch just before it, gemsops' or torch's, with no sync between
    w = (rand(384, 384, device="cuda") / 20).to(dtype)
    bias = rand(384, dtype=dtype, device="cuda")
    steps = []  # (input, bias or None, output)
    x = rand(640, 384, dtype=dtype, device="cuda")
    with schedule(sched, ctas=ctas):
        for i in range(6):
            if i % 3 == 2:
                x = x * 0.5  # a torch kernel in between
            y = gemsops.addmm(bias, x, w) if i % 2 else gemsops.mm(x, w)
            steps.append((x, bias if i % 2 else None, y))
            x = y
    for x, b, y in steps:
        ref = x.double() @ w.double()
        bound = x.double().abs() @ w.double().abs()
        if b is not None:
            ref, bound = ref + b.double(), bound + b.double().abs()
        tol = product_tolerance(ref, bound, 384, dtype)
        assert ((y.double() - ref).abs() <= tol).all()


@pytest.mark.cuda
@pytest.mark.parametrize("sched,ctas", [("data-parallel", 0), ("stream-k", 7)])
def test_back_to_back_launches_overwrite_what_the_last_one_read(sched, ctas):
    # two buffers in turn, no kernel between the products: each writes the
    # buffer the launch just before it reads, so a launch that wrote C
    # before that one had finished would change its input under it. The
    # chain launched back to back must give the bits of the same chain with
    # a sync after each product (a fixed schedule is bitwise repeatable).
    dtype = torch.bfloat16
    q, _ = torch.linalg.qr(rand(512, 512, dtype=torch.float64))
    w = q.to("cuda", dtype)  # orthogonal: the chain's values stay O(1)
    x = rand(768, 512, dtype=dtype, device="cuda")

    def chain(sync):
        bufs = [x.clone(), torch.empty_like(x)]
        with schedule(sched, ctas=ctas):
            for i in range(8):
                gemsops.matmul(bufs[i % 2], w, out=bufs[(i + 1) % 2])
                if sync:
                    torch.cuda.synchronize()
        return bufs[0]

    first = gemsops.matmul(x, w)
    ref = x.double() @ w.double()
    bound = x.double().abs() @ w.double().abs()
    assert (
        (first.double() - ref).abs()
        <= product_tolerance(ref, bound, 512, dtype)
    ).all()
    synced = chain(True)
    assert torch.isfinite(synced).all() and synced.abs().max() > 0.1
    assert torch.equal(chain(False), synced)


def test_stream_k_splits_tiles_and_still_matches_data_parallel(device):
    # one tile, many k-iterations, 5 CTAs: every CTA holds a piece of it
    a, b = rand(60, 2000, device=device), rand(2000, 50, device=device)
    with schedule("stream-k", ctas=5):
        plan = gemsops._C.matmul_plan(
            a[None], b[None], torch.empty(1, 60, 50, device=device), 2, 0, 5, 0
        )
        sk = gemsops.mm(a, b)
    assert plan["sk_tiles"] == plan["tiles"] == 1 and plan["ctas"] == 5
    with schedule("data-parallel"):
        dp = gemsops.mm(a, b)
    assert_mm_close(sk, a, b, torch.float32)
    torch.testing.assert_close(sk, dp, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_transposed_and_sliced_inputs_in_place(dtype, device):
    base_a = rand(90, 130, dtype=dtype, device=device)
    base_b = rand(200, 150, dtype=dtype, device=device)
    a = base_a.t()[3:70]  # [67, 90], column-major, offset
    b = base_b[::2, 1:101].t().t()  # [100, 100] rows strided
    b = b[:90]
    assert_mm_close(gemsops.mm(a, b), a, b, dtype)
    at = rand(77, 41, dtype=dtype, device=device).t()
    bt = rand(33, 77, dtype=dtype, device=device).t()
    assert_mm_close(gemsops.mm(at, bt), at, bt, dtype)


def test_batched_and_broadcast(device):
    a = rand(2, 1, 33, 45, device=device)
    b = rand(3, 45, 29, device=device)
    out = gemsops.matmul(a, b)
    assert out.shape == (2, 3, 33, 29)
    assert_mm_close(out, a, b, torch.float32)
    x, y = rand(4, 20, 30, device=device), rand(4, 30, 10, device=device)
    assert_mm_close(gemsops.bmm(x, y), x, y, torch.float32)


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((7,), (7, 3)),
        ((5, 7), (7,)),
        ((7,), (7,)),
        ((2, 5, 7), (7, 3)),
        ((2, 5, 7), (7,)),
        ((7,), (2, 7, 3)),
        ((5, 7), (2, 7, 3)),
        ((2, 1, 5, 7), (3, 7, 3)),
    ],
)
@pytest.mark.parametrize("grad", [False, True])
def test_matmul_result_is_its_own_tensor(sa, sb, grad, device):
    # torch's folded products are not views (_unsafe_view): a result made
    # under no_grad takes an in-place write that needs grad, and detach_()
    a = rand(*sa, device=device).requires_grad_(grad)
    b = rand(*sb, device=device)
    want = torch.matmul(a.detach(), b)
    with torch.no_grad():
        out = gemsops.matmul(a, b)
    assert not out._is_view() and out.shape == want.shape
    p = torch.rand(want.shape[-1:], device=device, requires_grad=True)
    out.mul_(p)
    assert out.grad_fn is not None
    assert_close(out, want.double() * p.detach().double(), torch.float32)
    out = gemsops.matmul(a, b)
    assert not out._is_view()
    out.detach_()
    assert not out.requires_grad


def test_gradient_of_a_broadcast_matrix_is_one_sum(device):
    # b of batch dims all 1 is one matrix: its gradient sums a^T g over
    # every batch in one product, as torch's folding does. Per-batch fp16
    # products (76800, -76800, 1280) would each round first: inf - inf
    a = torch.ones(3, 32, 32, dtype=torch.float16, device=device)
    a[0] *= 60
    a[1] *= -60
    b = torch.randn(1, 32, 16, dtype=torch.float16, device=device)
    b.requires_grad_()
    g = torch.full((3, 32, 16), 40.0, dtype=torch.float16, device=device)
    (db,) = torch.autograd.grad(gemsops.matmul(a, b), [b], g)
    assert db.shape == b.shape
    assert torch.equal(db, torch.full_like(db, 1280.0))
    # the mirror: a one matrix, b batched; a's gradient likewise, and the
    # output contiguous as torch's
    a1 = torch.randn(32, 32, dtype=torch.float16, device=device)
    a1.requires_grad_()
    b3 = torch.ones(3, 32, 16, dtype=torch.float16, device=device)
    b3[0] *= 120
    b3[1] *= -120
    g3 = torch.full((3, 32, 16), 40.0, dtype=torch.float16, device=device)
    out = gemsops.matmul(a1, b3)
    assert out.is_contiguous()
    (da,) = torch.autograd.grad(out, [a1], g3)
    assert torch.equal(da, torch.full_like(da, 16 * 40.0))


def test_vector_cases(device):
    v, w = rand(40, device=device), rand(40, device=device)
    m = rand(40, 17, device=device)
    for a, b in [
        (v, w),
        (v, m),
        (m.t(), v),
        (rand(3, 5, 40, device=device), v),
        (v, rand(2, 40, 6, device=device)),
    ]:
        assert_mm_close(gemsops.matmul(a, b), a, b, torch.float32)


def test_k_zero_gives_zeros(device):
    a, b = rand(5, 0, device=device), rand(0, 7, device=device)
    with schedule("stream-k"):
        assert torch.equal(gemsops.mm(a, b), torch.zeros(5, 7, device=device))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients_against_torch(dtype, device):
    a = rand(37, 53, dtype=dtype, device=device).requires_grad_()
    b = rand(2, 53, 29, dtype=dtype, device=device).requires_grad_()
    out = gemsops.matmul(a, b)
    g = rand(*out.shape, dtype=dtype, device=device)
    out.backward(g)
    ad, bd = a.detach(), b.detach()
    # a is broadcast over b's batch: its gradient is one product whose
    # k runs over the batch and the columns, g (37, 2 * 29) @ b^T
    g_rows = g.permute(1, 0, 2).reshape(37, 2 * 29)
    bt_rows = bd.transpose(1, 2).reshape(2 * 29, 53)
    assert_mm_close(a.grad, g_rows, bt_rows, dtype, name="a.grad")
    assert_mm_close(b.grad, ad.t().expand(2, 53, 37), g, dtype, name="b.grad")


@contextlib.contextmanager
def tf32(allowed):
    """torch's switch for TF32 in its CUDA matmuls, which gemsops follows."""
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def tf32_tolerance(a, b):
    """TF32 keeps 10 of an fp32 input's 23 mantissa bits, so each product
    is off by less than 2^-9 of |a||b| (either rounding); then the fp32
    accumulation and the output's rounding of assert_mm_close."""
    ref = torch.matmul(a.double(), b.double())
    bound = torch.matmul(a.double().abs(), b.double().abs())
    fp32 = product_tolerance(ref, bound, a.shape[-1], torch.float32)
    return ref, fp32, fp32 + 2**-9 * bound


def assert_tf32(out, a, b, name="out"):
    """Within TF32's bound and, where k is long enough for the truncated
    bits to show, outside fp32's: the tensor cores really ran TF32."""
    ref, fp32, tol = tf32_tolerance(a, b)
    err = (out.double() - ref).abs()
    assert not (err > tol).any(), (
        f"{name}: {int((err > tol).sum())} of {out.numel()} beyond TF32's "
        f"bound; worst {err.max().item():.3g}"
    )
    if a.shape[-1] >= 256:
        assert (err > fp32).any(), f"{name}: exact fp32, not TF32"


def test_fp32_on_the_cpu_is_exact_under_tf32():
    a, b = rand(64, 300), rand(300, 48)
    with tf32(True):
        assert_mm_close(gemsops.mm(a, b), a, b, torch.float32)


# fp32 operand layouts for TF32 (K-major operands only) and what the launch
# stages on sm_90a: an MN-contiguous operand transposed, a row of 71 fp32
# (not 16 bytes) padded
TF32_LAYOUTS = {
    "nt": (lambda m, n, k: (cu(m, k, dtype=F32), cu(n, k, dtype=F32).t()), ""),
    "nn": (lambda m, n, k: (cu(m, k, dtype=F32), cu(k, n, dtype=F32)), "b"),
    "tn": (
        lambda m, n, k: (cu(k, m, dtype=F32).t(), cu(n, k, dtype=F32).t()),
        "a",
    ),
    "tt": (
        lambda m, n, k: (cu(k, m, dtype=F32).t(), cu(k, n, dtype=F32)),
        "ab",
    ),
}
F32 = torch.float32


@pytest.mark.cuda
@pytest.mark.parametrize("layout", sorted(TF32_LAYOUTS))
@pytest.mark.parametrize("sched", ["data-parallel", "stream-k"])
@pytest.mark.parametrize(
    "width",
    [
        "auto",
        "wgmma-64",
        "wgmma-64x64",
        "wgmma-192",
        "wgmma-192x192",
        "wgmma-256",
    ],
)
def test_fp32_runs_tf32_when_torch_allows_it(layout, sched, width):
    make, staged = TF32_LAYOUTS[layout]
    for m, n, k in TC_SHAPES + [(300, 200, 71)]:
        a, b = make(m, n, k)
        name = f"{layout} {m}x{n}x{k} {width}"
        ctas = 5 if sched == "stream-k" else 0
        with schedule(sched, ctas=ctas, mainloop=width):
            with tf32(True):
                first = gemsops.mm(a, b)
                second = gemsops.mm(a, b)
            with tf32(False):
                exact = gemsops.mm(a, b)
        assert torch.equal(first, second), name
        assert_mm_close(exact, a, b, F32, name=f"{name} exact")
        if not is_sm90():  # no TF32 mainloop: exact either way
            assert_mm_close(first, a, b, F32, name=name)
            continue
        plan = plan_of(a, b)  # C's auto: TF32 allowed
        if m <= 16 and layout in ("nn", "tt"):  # exact, on the CUDA cores
            assert plan["mainloop"] == "skinny", (name, plan)
            assert plan["staged"] == "", (name, plan)
            assert_mm_close(gemsops.mm(a, b), a, b, F32, name=name)
            continue
        want = "ab" if k == 71 else staged  # rows of 284 bytes
        assert plan["mainloop"].startswith("wgmma"), (name, plan)
        assert plan["staged"] == want, (name, plan)
        assert plan_of(a, b, "ffma")["mainloop"] == "ffma"
        assert_tf32(first, a, b, name=name)


@pytest.mark.cuda
def test_tf32_follows_float32_matmul_precision():
    a, b = cu(200, 520, dtype=F32), cu(520, 136, dtype=F32)
    old = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        high = gemsops.mm(a, b)
        torch.set_float32_matmul_precision("highest")
        highest = gemsops.mm(a, b)
    finally:
        torch.set_float32_matmul_precision(old)
    assert_mm_close(highest, a, b, F32, name="highest")
    if is_sm90():
        assert_tf32(high, a, b, name="high")
    else:
        assert_mm_close(high, a, b, F32, name="high")


@pytest.mark.cuda
@pytest.mark.skipif(
    not hasattr(torch.backends, "fp32_precision"),
    reason="torch without the fp32_precision settings",
)
def test_tf32_follows_the_fp32_precision_setting():
    """torch's newer switch (torch.backends.cuda.matmul.fp32_precision),
    in a process of its own: once it is used, reading the legacy
    allow_tf32 raises, so gemsops must not read that one."""
    code = (
        "import torch, gemsops\n"
        "torch.backends.cuda.matmul.fp32_precision = 'tf32'\n"
        "a = torch.randn(200, 520, device='cuda')\n"
        "b = torch.randn(520, 136, device='cuda')\n"
        "tf = (gemsops.mm(a, b).double() - a.double() @ b.double())\n"
        "torch.backends.cuda.matmul.fp32_precision = 'ieee'\n"
        "ex = (gemsops.mm(a, b).double() - a.double() @ b.double())\n"
        "print(tf.abs().max().item(), ex.abs().max().item())\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-2000:]
    tf_err, exact_err = map(float, run.stdout.split())
    # k = 520 of N(0, 1): fp32's error stays near 1e-5, TF32's near 1e-2
    assert exact_err < 1e-3, exact_err
    if is_sm90():
        assert tf_err > 10 * exact_err, (tf_err, exact_err)
    else:
        assert tf_err < 1e-3, tf_err


@pytest.mark.cuda
def test_tf32_batches_bias_and_backward():
    """A broadcast B staged once, the bias epilogue, and nn.Linear's
    backward, whose dX and dW read MN-contiguous operands (staged
    transposed)."""
    check = (
        assert_tf32
        if is_sm90()
        else (lambda o, a, b, name: assert_mm_close(o, a, b, F32, name=name))
    )
    a = cu(3, 40, 520, dtype=F32)
    b = cu(520, 99, dtype=F32).expand(3, 520, 99)
    x = cu(5, 60, 264, dtype=F32).requires_grad_()
    w = cu(136, 264, dtype=F32).requires_grad_()
    bias = cu(136, dtype=F32).requires_grad_()
    g = cu(5, 60, 136, dtype=F32)
    with tf32(True):
        out = gemsops.bmm(a, b)
        y = gemsops.linear(x, w, bias)
        y.backward(g)
    check(out, a, b, name="bmm")
    x2 = x.detach().reshape(-1, 264)
    check(
        y.detach().reshape(-1, 136) - bias.detach(),
        x2,
        w.detach().t(),
        name="linear",
    )
    g2 = g.reshape(-1, 136)
    check(x.grad.reshape(-1, 264), g2, w.detach(), name="dx")
    check(w.grad, g2.t(), x2, name="dW")
    torch.testing.assert_close(bias.grad, g2.sum(0), rtol=1e-5, atol=1e-4)


# Products of at most 16 rows against an N-contiguous B have kernels of
# their own (csrc/cuda/matmul_skinny.cu): fp32 takes them whenever the
# schedule is automatic, fp16 and bf16 when B is large, any when asked for
# by name ('skinny'). (m, n, k) across their row counts (fp32: 4, 8, 16),
# ragged strips, k cut into ranges or not
SKINNY_SHAPES = [
    (1, 8, 8),
    (3, 80, 1001),
    (4, 4096, 2048),
    (5, 1000, 3000),
    (8, 304, 64),
    (9, 2560, 8192),
    (16, 64, 100000),
    (16, 136, 511),
]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_skinny_rows_take_their_own_kernel(dtype):
    for m in (1, 4, 5, 8, 9, 16):
        a, b = cu(m, 512, dtype=dtype), cu(512, 384, dtype=dtype)
        plan = plan_of(a, b, "skinny")
        assert plan["mainloop"] == "skinny", (m, plan)
        rows = 4 if m <= 4 else 8 if m <= 8 else 16  # fp32: CUDA cores
        assert plan["bm"] == (rows if dtype == F32 else 16), plan
        assert plan["staged"] == "" and plan["sk_tiles"] == 0, plan
        auto = plan_of(a, b)["mainloop"]
        assert (auto == "skinny") == (dtype == F32), auto  # B of 384 KB
        if dtype == F32:  # exact FFMA: the ffma cap takes it too
            assert plan_of(a, b, "ffma")["mainloop"] == "skinny"
    if dtype != F32:  # a large B: auto takes it, unless narrow
        big = plan_of(cu(4, 4096, dtype=dtype), cu(4096, 4096, dtype=dtype))
        assert big["mainloop"] == "skinny", big
        # above 4 rows the 64 x 64 wgmma tiles where they run
        eight = plan_of(cu(8, 4096, dtype=dtype), cu(4096, 4096, dtype=dtype))
        want = "wgmma-64x64" if is_sm90() else "skinny"
        assert eight["mainloop"] == want, eight
        narrow = plan_of(
            cu(16, 8192, dtype=dtype), cu(8192, 2560, dtype=dtype)
        )
        assert narrow["mainloop"] != "skinny", narrow
    a = cu(17, 512, dtype=dtype)
    b = cu(512, 384, dtype=dtype)
    assert plan_of(a, b, "skinny")["mainloop"] != "skinny"  # the tiles
    a = cu(8, 512, dtype=dtype)
    b_k = cu(384, 512, dtype=dtype).t()  # K-contiguous B: the tiles
    assert plan_of(a, b_k, "skinny")["mainloop"] != "skinny"
    b_off = odd_view(512, 384, dtype)  # off its vectors' alignment
    assert plan_of(a, b_off, "skinny")["mainloop"] != "skinny"
    for forced in ("mma", "wgmma-128"):  # a cap: the tiles
        assert plan_of(a, b, forced)["mainloop"] != "skinny"
    forced = gemsops._C.matmul_plan(  # a forced schedule: the tiles
        a[None], b[None], cu(1, 8, 384, dtype=dtype), 1, 0, 0, 7
    )
    assert forced["mainloop"] != "skinny"
    if dtype != F32:  # rows of 72 bytes: not whole 16-byte vectors
        plan = plan_of(
            cu(4, 64, dtype=dtype), cu(64, 36, dtype=dtype), "skinny"
        )
        assert plan["mainloop"] != "skinny"


@pytest.mark.cuda
@pytest.mark.parametrize("m,n,k", SKINNY_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_skinny_matches_float64_and_repeats(m, n, k, dtype):
    """Against float64, fp32 to fp32's bound with TF32 allowed (the CUDA
    cores never round to TF32), the same bits twice (k ranges added in a
    fixed order), and nothing written beside C."""
    a, b = cu(m, k, dtype=dtype), cu(k, n, dtype=dtype)
    plan = plan_of(a, b, "skinny")
    assert plan["mainloop"] == "skinny"
    with tf32(True), schedule(mainloop="skinny"):
        first = gemsops.mm(a, b)
        second = gemsops.mm(a, b)
    assert_mm_close(first, a, b, dtype, name=f"{m}x{n}x{k}")
    assert torch.equal(first, second)
    buf = torch.full((m + 2, n), float("nan"), dtype=dtype, device="cuda")
    out = buf[1 : m + 1]
    need = gemsops._C.matmul(a, b, out, 0, 0, 0, 7, None, None, 0, 0, None)
    if need is not None:  # k cut into ranges: partials and counts
        nbytes, count, _ = need
        assert plan["split"] > 1, plan
        assert nbytes == plan["split"] * m * n * 4, (need, plan)
        ws = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        flags = torch.empty(count, dtype=torch.int32, device="cuda")
        for epoch in (1, 2):  # fresh flags, zeroed by the launch
            out.fill_(float("nan"))
            gemsops._C.matmul(a, b, out, 0, 0, 0, 7, ws, flags, epoch, 0, None)
            assert torch.equal(out, first)
    else:
        assert plan["split"] == 0
        assert torch.equal(out, first)
    assert buf[0].isnan().all() and buf[m + 1].isnan().all()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_skinny_layouts_batches_and_epilogue(dtype):
    """A in any layout, B a column slice (a ragged last strip), broadcast
    and batched B, addmm's bias and scales, and nn.Linear's backward."""
    a_t = cu(700, 6, dtype=dtype).t()  # M-contiguous A
    a_s = cu(6, 1400, dtype=dtype)[:, ::2]  # no unit stride
    b = cu(700, 136, dtype=dtype)[:, :99]  # the last vector part-filled
    with schedule(mainloop="skinny"):
        for a in (a_t, a_s):
            assert plan_of(a, b, "skinny")["mainloop"] == "skinny"
            assert_mm_close(gemsops.mm(a, b), a, b, dtype)
        a3 = cu(3, 12, 520, dtype=dtype)
        for b3 in (
            cu(520, 264, dtype=dtype).expand(3, 520, 264),
            cu(3, 520, 264, dtype=dtype),
        ):
            assert_mm_close(gemsops.bmm(a3, b3), a3, b3, dtype)
        a, b = cu(7, 2048, dtype=dtype), cu(2048, 304, dtype=dtype)
        assert plan_of(a, b, "skinny")["mainloop"] == "skinny"
        ref = a.double() @ b.double()
        bound = a.double().abs() @ b.double().abs()
        for bias in (cu(304, dtype=dtype), cu(7, 304, dtype=dtype)):
            got = gemsops.addmm(bias, a, b, beta=0.5, alpha=-2.0)
            want = 0.5 * bias.double() - 2.0 * ref
            tol = product_tolerance(want, 2.0 * bound, 2048, dtype)
            err = (got.double() - want).abs()
            assert not (err > tol).any(), err.max().item()
        # nn.Linear's dX for a few rows: g [2, 3, 96] @ W [96, 64] as stored
        lin = gemsops.nn.Linear(64, 96, device="cuda", dtype=dtype)
        x = cu(2, 3, 64, dtype=dtype).requires_grad_()
        g = cu(2, 3, 96, dtype=dtype)
        lin(x).backward(g)
    w = lin.weight.detach()
    assert plan_of(g.reshape(6, 96), w, "skinny")["mainloop"] == "skinny"
    assert_mm_close(x.grad.reshape(6, 64), g.reshape(6, 96), w, dtype)


def test_bounded_spin_mode_runs(device):
    a, b = rand(200, 700, device=device), rand(700, 90, device=device)
    with schedule("stream-k", ctas=6, spin_limit=1 << 40):
        assert_mm_close(gemsops.mm(a, b), a, b, torch.float32)


@pytest.mark.parametrize(
    "fn, ranks",
    [("matmul", r) for r in ((2, 1), (3, 1), (1, 2), (2, 2), (3, 2), (1, 1))]
    + [("matmul", r) for r in ((1, 3), (2, 3), (3, 3))]
    + [("mm", (2, 2)), ("bmm", (3, 3))],
)
@pytest.mark.parametrize(
    "dtypes",
    [
        (torch.int64, torch.float32),
        (torch.int32, torch.float16),
        (torch.bool, torch.bfloat16),
        (torch.uint32, torch.float32),
        (torch.float32, torch.int64),
    ],
)
@pytest.mark.parametrize(
    "layout", ["contiguous", "transposed", "transposed, b needs grad"]
)
def test_mixed_dtype_errors_match_torch(device, fn, ranks, dtypes, layout):
    # torch's bmm (its first operand) and CUDA mv (its matrix) refuse a dtype
    # they have no kernel for (NotImplementedError) before they compare
    # dtypes; its mm and dot compare first (RuntimeError). Which one matmul
    # runs depends on the ranks and, through torch's fold rule, on the
    # strides and on whether the smaller operand needs a gradient.
    def make(shape, dtype):
        t = torch.ones(shape, dtype=dtype, device=device)
        if layout == "transposed" and t.dim() > 1:
            t = t.mT.contiguous().mT  # the same sizes, the last two swapped
        return t

    a = make({1: [4], 2: [3, 4], 3: [2, 3, 4]}[ranks[0]], dtypes[0])
    b = make({1: [4], 2: [4, 3], 3: [2, 4, 3]}[ranks[1]], dtypes[1])
    b.requires_grad_(layout.endswith("grad") and b.is_floating_point())
    with pytest.raises(Exception) as theirs:
        getattr(torch, fn)(a, b)
    with pytest.raises(Exception) as ours:
        getattr(gemsops, fn)(a, b)
    assert type(ours.value) is type(theirs.value), (
        f"torch raised {theirs.value!r}, gemsops {ours.value!r}"
    )
    named = [t.dtype for t in (a, b) if str(t.dtype) in str(ours.value)]
    assert named, ours.value
    if ours.type is NotImplementedError:  # the dtype without a kernel
        assert not named[0].is_floating_point, ours.value


@pytest.mark.parametrize("fn", ["bmm", "matmul"])
def test_cpu_bmm_of_a_float8_operand_is_not_implemented(fn):
    # torch's CPU bmm has no float8 kernel and looks it up before it
    # compares the dtypes
    a = torch.ones(2, 3, 4, dtype=torch.float8_e4m3fn)
    b = torch.ones(2, 4, 3)
    with pytest.raises(NotImplementedError):
        getattr(torch, fn)(a, b)
    with pytest.raises(NotImplementedError, match="float8_e4m3fn"):
        getattr(gemsops, fn)(a, b)


def test_errors(device):
    a = rand(3, 4, device=device)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        gemsops.mm(a, rand(5, 6, device=device))
    with pytest.raises(RuntimeError, match="same dtype"):
        gemsops.mm(a, rand(4, 2, dtype=torch.float16, device=device))
    with pytest.raises(RuntimeError, match="at least 1D"):
        gemsops.matmul(torch.tensor(2.0, device=device), a)
    with pytest.raises(RuntimeError, match="must be matrices"):
        gemsops.mm(rand(2, 3, 4, device=device), a)
    with pytest.raises(RuntimeError, match="must be 3-D"):
        gemsops.bmm(a, a)
    with pytest.raises(
        NotImplementedError, match="takes float16, bfloat16 and float32"
    ):
        gemsops.mm(a.double(), a.double().t())
    with pytest.raises(TypeError, match="must be a Tensor"):
        gemsops.mm(a, [[1.0]])
    with pytest.raises(ValueError, match="schedule must be one of"):
        gemsops.set_schedule("fastest")
    with pytest.raises(ValueError, match="mainloop must be one of"):
        gemsops.set_schedule("auto", mainloop="tensor-cores")
    with pytest.raises(RuntimeError, match="shapes do not chain"):
        gemsops._C.matmul(
            a[None],
            a[None],
            torch.empty(1, 3, 4, device=device),
            0,
            0,
            0,
            0,
            None,
            None,
            1,
            0,
            None,
        )
    bad = max(gemsops.ops.matmul.MAINLOOPS.values()) + 1
    with pytest.raises(ValueError, match=f"'mainloop'={bad} is out of range"):
        gemsops._C.matmul(
            a[None],
            a.t()[None],
            torch.empty(1, 3, 3, device=device),
            0,
            0,
            0,
            bad,
            None,
            None,
            1,
            0,
            None,
        )


@pytest.mark.cuda
def test_device_mismatch_is_an_error():
    with pytest.raises(RuntimeError, match="same device"):
        gemsops.mm(rand(3, 4), rand(4, 5, device="cuda"))


def test_c_level_takes_2d_operands(device):
    # mm's path: 2-D a, b, out reach C without batch views
    a, b = rand(70, 90, device=device), rand(40, 90, device=device).t()
    out = torch.full((70, 40), float("nan"), device=device)
    assert (
        gemsops._C.matmul(a, b, out, 1, 0, 0, 1, None, None, 0, 0, None)
        is None
    )  # data-parallel: no buffers; mainloop 1 (ffma): exact fp32
    assert_mm_close(out, a, b, torch.float32)
    with pytest.raises(RuntimeError, match="shapes do not chain"):
        gemsops._C.matmul(a, b, out[None], 0, 0, 0, 0, None, None, 0, 0, None)
    with pytest.raises(RuntimeError, match="must be 2-D .* or 3-D"):
        gemsops._C.matmul(
            a[None, None], b, out, 0, 0, 0, 0, None, None, 0, 0, None
        )


@pytest.mark.cuda
def test_stream_k_launch_asks_for_its_stream_buffers():
    """Without flags a Stream-K launch does nothing and names what it needs
    and the stream; with the stream's buffers it runs."""
    a, b = rand(60, 2000, device="cuda"), rand(2000, 50, device="cuda")
    out = torch.full((60, 50), float("nan"), device="cuda")
    side = torch.cuda.Stream()
    for stream in (torch.cuda.current_stream(), side):
        with torch.cuda.stream(stream):
            need = gemsops._C.matmul(
                a, b, out, 2, 0, 5, 0, None, None, 0, 0, None
            )
            torch.cuda.synchronize()
            assert out.isnan().all()  # nothing launched
            nbytes, count, handle = need
            assert count == 5 and nbytes >= 5 * 64 * 64 * 4
            assert handle == stream.cuda_stream
            flags = torch.zeros(count, dtype=torch.int32, device="cuda")
            # flags without the workspace: asked again, nothing launched
            again = gemsops._C.matmul(
                a, b, out, 2, 0, 5, 0, None, flags, 1, 0, None
            )
            torch.cuda.synchronize()
            assert again == need and out.isnan().all()
            ws = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            # epoch 0: flags for this launch alone, which it zeroes (they
            # hold the epoch it runs at here) and C does not keep
            flags.fill_(1)
            done = gemsops._C.matmul(
                a, b, out, 2, 0, 5, 0, ws, flags, 0, 0, None
            )
            assert done is None
            # (C's auto takes fp32 as TF32 where wgmma runs: that bound)
            ref, _, tol = tf32_tolerance(a, b)
            assert ((out.double() - ref).abs() <= tol).all()
            out.fill_(float("nan"))
            with pytest.raises(ValueError, match="needs an 'error' tensor"):
                gemsops._C.matmul(
                    a, b, out, 2, 0, 5, 0, None, None, 0, 7, None
                )
            with schedule("stream-k", ctas=5):
                got = gemsops.mm(a, b)
        torch.cuda.synchronize()
        assert_mm_close(got, a, b, torch.float32)
    keys = [
        k
        for k in gemsops._workspace.kept_keys("mm_flags")
        if k[0] == a.get_device()
    ]
    assert (a.get_device(), side.cuda_stream) in keys
    with schedule("data-parallel"):  # no split tile: launched at once
        assert (
            gemsops._C.matmul(a, b, out, 1, 0, 0, 1, None, None, 0, 0, None)
            is None
        )
    assert_mm_close(out, a, b, torch.float32)


@pytest.mark.cuda
def test_captured_stream_k_launch_holds_no_memory_after_its_graph():
    """The flags and workspace a captured Stream-K launch uses are the
    graph's: once the graph and its output are gone, so is every byte the
    capture took (C kept no record of them)."""
    a, b = rand(60, 2000, device="cuda"), rand(2000, 50, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with schedule("stream-k", ctas=5):
        with torch.cuda.stream(side):
            eager = gemsops.mm(a, b)  # the side stream's kept buffers
        # an earlier test's garbage, freed by the collection below, must
        # not count against this test
        gc.collect()
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            captured = gemsops.mm(a, b)
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
    assert torch.cuda.memory_allocated() > before
    del captured, graph
    gc.collect()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before


OUT_CASES = [  # (name, input shapes, extra kwargs)
    ("mm", [(3, 4), (4, 5)], {}),
    ("bmm", [(2, 3, 4), (2, 4, 5)], {}),
    ("matmul", [(2, 3, 4), (4, 5)], {}),
    ("matmul", [(4,), (4, 5)], {}),
    ("addmm", [(5,), (3, 4), (4, 5)], {"beta": 0.5, "alpha": 2.0}),
]


@pytest.mark.parametrize("name,shapes,kw", OUT_CASES)
def test_out_keyword_as_torch(name, shapes, kw, device):
    args = [torch.randn(s, device=device) for s in shapes]
    ref = getattr(torch, name)(*[a.double() for a in args], **kw)
    # out of the right shape, a transposed one, and one to be resized
    for out in (
        torch.empty(ref.shape, device=device),
        torch.empty(ref.shape[::-1], device=device).mT
        if ref.dim() == 2
        else torch.empty(0, device=device),
        torch.empty(0, device=device),
    ):
        got = getattr(gemsops, name)(*args, **kw, out=out)
        assert got is out and out.shape == ref.shape
        assert_close(out, ref, torch.float32, chain_len=8)
    # the start of torch's message, which warning filters match
    with pytest.warns(UserWarning, match="An output with one or more elem"):
        getattr(gemsops, name)(*args, **kw, out=torch.empty(7, device=device))
    # torch's types: a wrong dtype, an input that requires grad
    bad = torch.empty(ref.shape, dtype=torch.float64, device=device)
    want = raised_type(lambda: getattr(torch, name)(*args, **kw, out=bad))
    assert want is RuntimeError
    with pytest.raises(want, match="dtype"):
        getattr(gemsops, name)(*args, **kw, out=bad)
    args[-1].requires_grad_(True)
    out = torch.empty(ref.shape, device=device)
    want = raised_type(lambda: getattr(torch, name)(*args, **kw, out=out))
    assert want is RuntimeError
    with pytest.raises(want, match="automatic differentiation"):
        getattr(gemsops, name)(*args, **kw, out=out)
    with torch.no_grad():
        assert getattr(gemsops, name)(*args, **kw, out=out) is out


@pytest.mark.parametrize("name", ["mm", "bmm", "addmm"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_out_dtype_as_torch(name, dtype, device):
    # torch's .dtype overloads: out_dtype positional after the operands,
    # fp32 or the inputs' own from half inputs; torch has them on CUDA
    # only, and gemsops hands them to torch
    shapes = {
        "mm": [(3, 40), (40, 5)],
        "bmm": [(2, 3, 40), (2, 40, 5)],
        "addmm": [(5,), (3, 40), (40, 5)],
    }[name]
    args = [rand(*s, dtype=dtype, device=device) for s in shapes]
    for out_dtype in (torch.float32, dtype):
        want = raised_type(lambda: getattr(torch, name)(*args, out_dtype))
        if want is not None:
            with pytest.raises(want):
                getattr(gemsops, name)(*args, out_dtype)
            continue
        got = getattr(gemsops, name)(*args, out_dtype)
        assert got.dtype == out_dtype
        a, b = args[-2:]
        ref = torch.matmul(a.double(), b.double())
        bound = torch.matmul(a.double().abs(), b.double().abs())
        if name == "addmm":
            ref, bound = ref + args[0].double(), bound + args[0].double().abs()
        tol = product_tolerance(ref, bound, 40, out_dtype)
        assert ((got.double() - ref).abs() <= tol).all(), name
        out = torch.full_like(got, float("nan"))
        assert getattr(gemsops, name)(*args, out_dtype, out=out) is out
        assert torch.equal(out, got)
        # an out= of another shape is as torch leaves it: these overloads
        # do not all resize (torch 2.11's mm raises, its bmm leaves it empty)
        outs = [torch.empty(0, dtype=out_dtype, device=device) for _ in "ab"]
        calls = [
            lambda m=m, o=o: getattr(m, name)(*args, out_dtype, out=o)
            for m, o in zip((torch, gemsops), outs)
        ]
        raised = [raised_type(call) for call in calls]
        assert raised[0] == raised[1], name
        assert outs[0].shape == outs[1].shape, name
        if raised[0] is None:  # values only where both wrote
            assert torch.equal(outs[0], outs[1]), name


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "name,shapes",
    [
        ("mm", [(37, 70), (70, 29)]),
        ("mm", [(64, 0), (0, 65)]),
        ("bmm", [(3, 37, 70), (3, 70, 29)]),
        ("matmul", [(37, 70), (70, 29)]),
        ("matmul", [(2, 37, 70), (2, 70, 29)]),
    ],
)
def test_out_written_in_place(name, shapes, dtype, device, monkeypatch):
    """An out= of the product's shape, dtype and device, dense and apart
    from the operands, receives the kernel's product itself (no product
    made apart and copied): every element written over a poisoned out
    (k = 0 too), the bits of the call without out=, one version bump as
    torch's out=."""
    import gemsops.ops.matmul as mm_module

    args = [rand(*s, dtype=dtype, device=device) for s in shapes]
    want = getattr(gemsops, name)(*args)

    def copied(*_):
        raise AssertionError("out= took the copy")

    monkeypatch.setattr(mm_module, "_into", copied)
    out = torch.full_like(want, float("nan"))
    version = out._version
    assert getattr(gemsops, name)(*args, out=out) is out
    assert torch.equal(out, want)
    assert out._version == version + 1


def test_out_sharing_an_operands_memory_through_another_storage(device):
    # one buffer behind two storages (DLPack): out inside a's span, on a's
    # elements or in its gaps, is computed apart and copied, as before
    base = torch.randn(1024, device=device)
    for a_view, out_at in ((lambda t: t[:, :4], 16), (lambda t: t, 16)):
        a = a_view(torch.from_dlpack(base[:512]).view(8, 64))
        b = rand(a.shape[1], 4, device=device)
        want = a.clone() @ b
        out = torch.from_dlpack(base[out_at : out_at + 32]).view(8, 4)
        assert gemsops.mm(a, b, out=out) is out
        assert_close(out, want.double(), torch.float32, chain_len=64)


def test_out_under_compile_without_graph_breaks():
    a, b = rand(8, 9), rand(9, 7)
    out = torch.empty(8, 7)
    run = torch.compile(
        lambda a, b, o: gemsops.mm(a, b, out=o),
        backend="eager",
        fullgraph=True,
    )
    assert run(a, b, out) is out
    assert torch.equal(out, gemsops.mm(a, b))


def test_out_an_inference_tensor(device):
    # written inside inference mode; outside it, torch's RuntimeError
    with torch.inference_mode():
        a, b = rand(8, 9, device=device), rand(9, 7, device=device)
        out = torch.empty(8, 7, device=device)
        assert gemsops.mm(a, b, out=out) is out
        assert torch.equal(out, gemsops.mm(a, b))
    a, b = rand(8, 9, device=device), rand(9, 7, device=device)
    for lib in (torch, gemsops):
        with pytest.raises(RuntimeError, match="inference tensor"):
            lib.mm(a, b, out=out)


def test_out_aliasing_an_input(device):
    x = torch.randn(16, 16, device=device)
    ref = x.double() @ x.double()
    assert gemsops.mm(x, x, out=x) is x
    assert_close(x, ref, torch.float32, chain_len=16)


def assert_row_sums(rs, a, dtype, name="row_sums"):
    """rs[i] = sum over k of a[i, k]: one rounding of the result + the fp32
    accumulation's error (as assert_mm_close with b a column of ones)."""
    ref = a.double().sum(-1)
    bound = a.double().abs().sum(-1)
    tol = product_tolerance(ref, bound, a.shape[-1], dtype)
    assert rs.dtype == dtype and rs.shape == ref.shape
    err = (rs.double() - ref).abs()
    assert not (err > tol).any(), (
        f"{name}: {int((err > tol).sum())} of {rs.numel()} out of "
        f"tolerance; worst {err.max().item():.3g}"
    )


def poisoned(n, dtype, device):
    return torch.full((n,), float("nan"), dtype=dtype, device=device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "m,n,k", [(37, 5, 70), (1, 1, 1), (64, 65, 0), (9, 0, 4)]
)
def test_row_sums_beside_the_product(m, n, k, dtype, device):
    # nn.Linear's weight-gradient layout: a = grad^T (M-contiguous), b the
    # input (N-contiguous); row sums of every row, also where C is empty
    a = rand(k, m, dtype=dtype, device=device).t()
    b = rand(k, n, dtype=dtype, device=device)
    rs = poisoned(m, dtype, device)
    out = gemsops.ops.matmul._mm(a, b, row_sums=rs)
    assert_mm_close(out, a, b, dtype)
    assert_row_sums(rs, a, dtype)


@pytest.mark.cuda
@pytest.mark.parametrize(
    "mainloop",
    [*WGMMA_TILES, "mma"],
)
@pytest.mark.parametrize(
    "a_major,b_major", [("m", "n"), ("k", "n"), ("m", "k")]
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("sched", ["data-parallel", "stream-k", "hybrid"])
def test_row_sums_every_kernel(mainloop, a_major, b_major, dtype, sched):
    # (m, n): the ROWS kernels (A M-contiguous, B N-contiguous) sum a share
    # of k in each tile of a row, split by Stream-K too; other layouts and
    # mma.sync take the row-sum kernels after the product
    for m, n, k in [
        (300, 520, 1000),
        (136, 72, 4096),
        (8, 8, 8),
        (264, 392, 64),
    ]:
        a, b = laid_out(m, n, k, a_major, b_major, dtype)
        rs = [poisoned(m, dtype, "cuda") for _ in range(2)]
        with schedule(
            sched, mainloop=mainloop, ctas=7 if sched != "data-parallel" else 0
        ):
            first = gemsops.ops.matmul._mm(a, b, row_sums=rs[0])
            second = gemsops.ops.matmul._mm(a, b, row_sums=rs[1])
        name = f"{m}x{n}x{k} {mainloop} {a_major}{b_major}"
        assert_mm_close(first, a, b, dtype, name=name)
        assert_row_sums(rs[0], a, dtype, name=name)
        assert torch.equal(first, second) and torch.equal(rs[0], rs[1])


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "m,n,k,sched,mainloop,ctas",
    [
        (1000, 4000, 3000, "data-parallel", "wgmma-256", 0),
        (1000, 4000, 3000, "data-parallel", "wgmma-256", 7),
        (136, 2048, 8200, "data-parallel", "wgmma-128", 0),
        (128, 3072, 64, "data-parallel", "wgmma-64", 0),
        (520, 1152, 4000, "stream-k", "wgmma-192", 7),
        (264, 3072, 64, "hybrid", "wgmma-64", 7),
        (2056, 768, 8192, "auto", "auto", 0),
    ],
)
def test_row_sums_across_a_row_of_tiles(m, n, k, sched, mainloop, ctas, dtype):
    # one wave of whole tiles narrower than 256 (ctas=0, few tiles): each
    # tile of a row sums its share of k (one k-step for 48 tiles at 3072
    # columns of 128 x 64) and the row's last tile to arrive adds the shares;
    # otherwise (256 wide, several waves, Stream-K) the first column's tiles
    # sum all of k. Right, the same bits launch after launch
    # (a new epoch on the rows' counters each time), and the same again
    # replayed from a CUDA graph (fresh counters, which the launch zeroes)
    a, b = laid_out(m, n, k, "m", "n", dtype)
    rs = [poisoned(m, dtype, "cuda") for _ in range(4)]
    with schedule(sched, mainloop=mainloop, ctas=ctas):
        outs = [gemsops.ops.matmul._mm(a, b, row_sums=r) for r in rs[:3]]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            captured = gemsops.ops.matmul._mm(a, b, row_sums=rs[3])
    name = f"{m}x{n}x{k} {sched} {mainloop} ctas={ctas}"
    assert_mm_close(outs[0], a, b, dtype, name=name)
    assert_row_sums(rs[0], a, dtype, name=name)
    for out, r in zip(outs[1:], rs[1:3]):
        assert torch.equal(out, outs[0]) and torch.equal(r, rs[0]), name
    for _ in range(2):
        rs[3].fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, outs[0]), name
        assert torch.equal(rs[3], rs[0]), name


def test_row_sums_refused_as_named(device):
    a = rand(6, 4, device=device)
    b = rand(4, 3, device=device)
    mm = gemsops.ops.matmul._mm
    with pytest.raises(RuntimeError, match="row_sums must be a float32"):
        mm(a, b, row_sums=torch.empty(5, device=device))
    with pytest.raises(RuntimeError, match="row_sums must be a float32"):
        mm(a, b, row_sums=torch.empty(6, dtype=torch.float64, device=device))
    with pytest.raises(RuntimeError, match="batch 2"):
        mm(
            torch.stack([a, a]),
            torch.stack([b, b]),
            row_sums=torch.empty(6, device=device),
        )
    with pytest.raises(RuntimeError, match="row_sums"):
        mm(a, b, row_sums=torch.empty(12, device=device)[::2])
    with pytest.raises(RuntimeError, match="overlap"):
        mm(a, b, row_sums=a.view(-1)[:6])


@pytest.mark.parametrize(
    "m,k,n", [(128, 1024, 128), (64, 4096, 64), (16, 16384, 16)]
)
def test_cpu_fp32_long_k_as_accurate_as_torch(m, k, n):
    # each k-step's update summed apart before it joins the accumulator:
    # a single running sum over k drifted 2-4x further from the float64
    # product than torch's CPU BLAS
    a, b = torch.randn(m, k), torch.randn(k, n)
    ref = a.double() @ b.double()
    ours = (gemsops.mm(a, b).double() - ref).abs().max().item()
    theirs = ((a @ b).double() - ref).abs().max().item()
    assert ours <= 1.5 * theirs, (ours, theirs)


@pytest.mark.parametrize(
    "variable,value,ok",
    [
        ("GEMSOPS_MATMUL_SCHEDULE", "stream-k", True),
        ("GEMSOPS_MATMUL_SCHEDULE", "streamk", False),
        ("GEMSOPS_MATMUL_MAINLOOP", "ffma", True),
        ("GEMSOPS_MATMUL_MAINLOOP", "wgmma128", False),
    ],
)
def test_schedule_from_the_environment_checked(variable, value, ok):
    """The environment's schedule and mainloop are set_schedule()'s: a
    name it does not know stops the import with a ValueError naming the
    variable and the value (a process of its own)."""
    code = (
        "from gemsops.ops.matmul import get_schedule\n"
        "c = get_schedule()\n"
        "print(c['schedule'], c['mainloop'])\n"
    )
    env = dict(os.environ, **{variable: value})
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env
    )
    if ok:
        assert run.returncode == 0, run.stderr[-2000:]
        key = 0 if variable.endswith("SCHEDULE") else 1
        assert run.stdout.split()[key] == value
    else:
        assert run.returncode != 0
        last = run.stderr.strip().splitlines()[-1]
        assert last.startswith("ValueError"), last
        assert variable in last and repr(value) in last, last
