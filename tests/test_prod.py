"""prod forward and zero-safe backward against float64 references, on the
CPU and (tests taking `device`, marked `cuda` there) on CUDA."""

import math

import pytest
import torch

import gemsops
from gemsops.testing import assert_close, poison_, rel_error

FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def near_one(shape, dtype, signed=True, device="cpu", spread=0.1):
    """Magnitudes in [1 - spread, 1 + spread]; random signs."""
    x = torch.empty(shape, dtype=torch.float64).uniform_(
        1 - spread, 1 + spread
    )
    if signed:
        x *= torch.randint(0, 2, shape, dtype=torch.float64) * 2 - 1
    return x.to(dtype).to(device)


def ref_prod(x, dim=None, keepdim=False):
    xd = x.double()
    return xd.prod() if dim is None else xd.prod(dim, keepdim=keepdim)


def test_numpy_names_axis_and_keepdims(device):
    # torch's argument parser takes axis= for dim and keepdims= for keepdim
    x = near_one((3, 4, 5), torch.float32, device=device)
    for kw in (
        {"axis": 1},
        {"axis": -1, "keepdims": True},
        {"dim": 0, "keepdims": False},
        {"axis": 2, "keepdim": True},
    ):
        want = torch.prod(x, **kw)
        got = gemsops.prod(x, **kw)
        assert got.shape == want.shape, kw
        assert_close(
            got,
            ref_prod(
                x,
                kw.get("dim", kw.get("axis")),
                kw.get("keepdim", kw.get("keepdims", False)),
            ),
            torch.float32,
            chain_len=5,
        )
    assert gemsops.prod(x, 1, keepdims=True).shape == (3, 1, 5)
    # what torch refuses: a name given twice, axis=None (RuntimeError from
    # torch 2.11's named-dimension lookup, TypeError from 2.13's parser),
    # keepdims alone, a dim of None
    for args, kw in (
        ((1,), {"axis": 1}),
        ((), {"dim": 1, "axis": 1}),
        ((1, True), {"keepdims": True}),
        ((), {"axis": None}),
        ((), {"keepdims": True}),
        ((None,), {}),
        ((), {"dim": None}),
        ((None, True), {}),
    ):
        with pytest.raises((TypeError, RuntimeError)):
            torch.prod(x, *args, **kw)
        with pytest.raises(TypeError):
            gemsops.prod(x, *args, **kw)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("dim", [0, 1, 2, 3, -1, -4])
@pytest.mark.parametrize("keepdim", [False, True])
def test_every_dim_of_4d(dtype, dim, keepdim, device):
    x = near_one((5, 6, 7, 8), dtype, device=device)
    out = gemsops.prod(x, dim, keepdim)
    assert out.dtype == dtype
    assert out.shape == torch.prod(x, dim, keepdim).shape
    assert_close(
        out,
        ref_prod(x, dim, keepdim),
        dtype,
        torch_out=torch.prod(x, dim, keepdim),
    )


@pytest.mark.parametrize(
    "shape,dim",
    [
        ((1, 2), 1),
        ((4096, 256), 1),
        ((4096, 256), 0),
        ((200, 2560, 3), 1),
        ((200, 40999, 3), 1),
        ((1, 2), None),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shapes(shape, dim, dtype, device):
    x = near_one(shape, dtype, device=device)
    out = gemsops.prod(x) if dim is None else gemsops.prod(x, dim)
    n = x.numel() if dim is None else shape[dim]
    assert_close(out, ref_prod(x, dim), dtype, chain_len=n)


def test_full_reduction_2_27_elements(device):
    # spread: the log of a partial product walks like sqrt(n) * spread, and
    # must stay inside fp32's range (|log| < 88) for ANY order of products
    x = near_one(
        (1 << 27,),
        torch.float32,
        signed=False,
        device=device,
        spread=8 / (1 << 27) ** 0.5,
    )
    x /= x.double().log().mean().exp().float()  # keep the product O(1)
    out = gemsops.prod(x)
    assert out.shape == () and out.dtype == torch.float32
    # 2^27 fp32 roundings of values this close to 1 drift together: torch's
    # own product is far off (docs/performance.md, prod). The bar: the
    # chain tolerance, or torch's own error on the same input if that is
    # larger.
    ref = ref_prod(x).item()
    ours, theirs = out.item(), torch.prod(x).item()
    bound = max(4 * (1 << 27) ** 0.5 * 2**-23, 1.05 * abs(theirs / ref - 1))
    assert abs(ours / ref - 1) <= bound, (ours, theirs, ref)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.bfloat16]
)
@pytest.mark.parametrize("zeros", [0, 1, 2])
@pytest.mark.parametrize("dim", [None, 0, 1])
def test_backward_with_zeros(dtype, zeros, dim, device):
    x = near_one((6, 9), dtype, device=device)
    for k in range(
        zeros
    ):  # zeros in the same line (dim 1 line 2 / dim 0 col 4)
        if dim == 0:
            x[1 + 2 * k, 4] = 0
        else:
            x[2, 1 + 3 * k] = 0
    x.requires_grad_()
    out = gemsops.prod(x) if dim is None else gemsops.prod(x, dim)
    g = torch.randn(out.shape, dtype=dtype, device=device)
    out.backward(g)
    xd = x.detach().double().requires_grad_()
    ref = xd.prod() if dim is None else xd.prod(dim)
    ref.backward(g.double())
    assert_close(out.detach(), ref.detach(), dtype, name="out")
    assert_close(x.grad, xd.grad, dtype, name="grad")
    if zeros == 1:  # the zero's own gradient is the product of the others
        assert (x.grad != 0).any()


def test_backward_keepdim_and_noncontiguous(device):
    base = near_one((7, 10, 5), torch.float32, device=device)
    x = base.transpose(0, 2)[:, ::2].requires_grad_()  # strides, no copy
    out = gemsops.prod(x, 1, keepdim=True)
    g = torch.randn(out.shape, device=device)
    out.backward(g)
    xd = x.detach().double().requires_grad_()
    xd.prod(1, keepdim=True).backward(g.double())
    assert_close(x.grad, xd.grad, torch.float32)


def test_inf_and_nan_propagate(device):
    x = torch.tensor(
        [
            [1.0, float("inf"), 2.0],
            [1.0, float("nan"), 0.0],
            [0.0, float("inf"), 1.0],
            [-1.0, float("inf"), 3.0],
        ],
        device=device,
    )
    torch.testing.assert_close(
        gemsops.prod(x, 1), torch.prod(x, 1), equal_nan=True
    )


@pytest.mark.parametrize(
    "dtype",
    [
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
    ],
)
def test_integer_inputs_give_int64_with_wraparound(dtype, device):
    if dtype == torch.bool:
        x = torch.rand(40, 50) > 0.1
    else:
        hi = 4 if dtype == torch.uint8 else 7
        lo = 0 if dtype == torch.uint8 else -7
        x = torch.randint(lo, hi, (40, 50), dtype=dtype)
    x = x.to(device)
    for dim in (None, 0, 1):
        ours = gemsops.prod(x) if dim is None else gemsops.prod(x, dim)
        theirs = torch.prod(x) if dim is None else torch.prod(x, dim)
        assert ours.dtype == torch.int64 == theirs.dtype
        assert torch.equal(ours, theirs)  # exact, wrap-around included


def test_dtype_argument_casts_first(device):
    x = near_one((30, 40), torch.float32, device=device)
    out = gemsops.prod(x, 1, dtype=torch.float64)
    assert out.dtype == torch.float64
    assert_close(out, ref_prod(x, 1), torch.float64)
    i = torch.randint(-3, 4, (20, 30), dtype=torch.int32, device=device)
    assert torch.equal(
        gemsops.prod(i, 0, dtype=torch.float32),
        torch.prod(i, 0, dtype=torch.float32),
    )


def test_empty(device):
    d = device
    assert gemsops.prod(torch.empty(0, device=d)).item() == 1.0
    assert torch.equal(
        gemsops.prod(torch.empty(3, 0, device=d), 1), torch.ones(3, device=d)
    )
    assert gemsops.prod(torch.empty(0, 4, device=d), 1).shape == (0,)
    assert (
        gemsops.prod(torch.empty(0, dtype=torch.int32, device=d)).item() == 1
    )


def test_zero_dim_input(device):
    x = torch.tensor(3.5, device=device)
    assert gemsops.prod(x).item() == 3.5
    assert gemsops.prod(x, 0).shape == () and gemsops.prod(x, -1).item() == 3.5


def test_errors():
    x = torch.randn(3, 4)
    with pytest.raises(IndexError, match=r"range of \[-2, 1\], but got 2"):
        gemsops.prod(x, 2)
    with pytest.raises(NotImplementedError, match="complex"):
        gemsops.prod(torch.randn(3, dtype=torch.complex64))
    with pytest.raises(NotImplementedError, match="complex"):  # not autograd's
        gemsops.prod(x.requires_grad_(), dtype=torch.complex64)
    x.requires_grad_(False)
    with pytest.raises(TypeError, match="'input' must be a Tensor"):
        gemsops.prod([1.0, 2.0])
    with pytest.raises(TypeError, match="'dim' must be int"):
        gemsops.prod(x, 1.0)
    out = torch.empty(3)
    with pytest.raises(
        RuntimeError, match="'out' has dtype float32; expected int64"
    ):
        gemsops._C.prod(torch.ones(3, 4, dtype=torch.int32), 1, out, None)
    with pytest.raises(RuntimeError, match="'out' has 4 elements; expected 3"):
        gemsops._C.prod(x, 1, torch.empty(4), None)
    with pytest.raises(IndexError, match="dim=5"):
        gemsops._C.prod(x, 5, torch.empty(3), None)
    with pytest.raises(RuntimeError, match="only floating point inputs"):
        gemsops._C.prod_bwd(
            torch.ones(3, 4, dtype=torch.int64),
            1,
            torch.ones(3, dtype=torch.int64),
            torch.empty(3, 4, dtype=torch.int64),
            None,
        )
    with pytest.raises(RuntimeError, match="'workspace' must be uint8"):
        gemsops._C.prod(x, 1, torch.empty(3), torch.empty(4))
    with pytest.raises(TypeError, match="takes 4 arguments"):
        gemsops._C.prod(x, 1, torch.empty(3))


def unit_lines(shape, dim, dtype, device):
    """Near-one values with random signs, scaled so that the product of
    every line along `dim` (of everything when dim is None) is about +-1,
    and spread so narrowly on long lines that no partial product leaves
    fp32's range whatever the order (|log| walks like sqrt(n) * spread)."""
    n = math.prod(shape) if dim is None else shape[dim]
    x = near_one(shape, torch.float64, spread=min(0.1, 8 / math.sqrt(n)))
    logs = x.abs().log()
    mean = logs.mean() if dim is None else logs.mean(dim, keepdim=True)
    return (x.sign() * (logs - mean).exp()).to(dtype).to(device)


# (shape, dim, view): each row reaches one kernel layout or planning branch
LAYOUTS = [
    ((3000, 64), 1, None),  # rows: several rows per warp
    ((4, 300000), 1, None),  # rows: one row split over CTAs
    ((1 << 22,), None, None),  # full, dense: split row + combine
    ((300, 200), None, "t"),  # full of a permuted dense view
    ((300, 200), None, "step"),  # full, not dense: lines + combine
    ((4096, 64), 0, None),  # cols, dim 0, split down the column
    ((8, 3000, 40), 1, None),  # cols, middle dim
    ((5, 999, 7), 1, None),  # cols, unaligned: scalar accesses
    ((40, 30, 20), 0, "perm"),  # generic: kept dims do not chain
    ((50, 60), 0, "expand"),  # a zero stride
    ((65, 64), 1, "offset"),  # storage offset: misaligned base
]


def make_view(x, view):
    if view == "t":
        return x.t()
    if view == "step":
        return x[:, ::2]
    if view == "perm":
        return x.permute(2, 0, 1)
    if view == "expand":
        return x[:1].expand(x.shape)
    if view == "offset":
        return x[1:]
    return x


@pytest.mark.parametrize("shape,dim,view", LAYOUTS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_layouts(shape, dim, view, dtype, device):
    x = make_view(unit_lines(shape, dim, torch.float64, device), view)
    x = x.to(dtype)
    out = gemsops.prod(x) if dim is None else gemsops.prod(x, dim)
    n = x.numel() if dim is None else x.shape[dim]
    assert_close_or_torch(out, x, dim, dtype, n)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_full_product_of_an_expanded_tensor_stays_in_range(dtype, device):
    """A full product of [rows, k] with stride (1, 0): each value repeats k
    times. The product is finite, but the powers v**k of the large values
    multiplied together overflow fp32: the product may not group the
    repeats of one value before it meets the others."""
    rows, k = 127, 1024
    big = 1 + torch.rand(rows // 2, dtype=torch.float64) * 0.03
    small = 1 / (1 + torch.rand(rows - rows // 2, dtype=torch.float64) * 0.03)
    v = torch.cat([big, small]).to(dtype)
    if v.double().prod() < 1:  # a total of about 1 + 1e-2, not its inverse
        v[-1] = 1 / v[-1]
    x = v.to(device)[:, None].expand(rows, k)
    assert x.stride() == (1, 0)
    ref = v.double().prod() ** k
    assert math.isfinite(ref.item())
    assert ref.item() < 1e30  # far from fp32's overflow
    out = gemsops.prod(x)
    assert torch.isfinite(out).item(), out
    # worst case: the fp32 roundings of a line's product, all raised to the
    # power k, then the output's own rounding
    bound = 1.1 * (rows + 1) * k * 2.0**-24 + (
        0 if dtype == torch.float32 else 2.0**-8
    )
    assert rel_error(out, ref) < bound


def assert_close_or_torch(out, x, dim, dtype, n):
    """The elementwise bound, or else (millions of fp32 roundings of values
    this close to 1 drift together: torch.prod on CUDA drifts too, 0.30%
    at 2^22 fp16 where our tree drifts 0.36%) a relative error within 1.5x
    torch.prod's own on the same input."""
    ref = ref_prod(x, dim)
    try:
        assert_close(out, ref, dtype, chain_len=n)
    except AssertionError:
        theirs = torch.prod(x) if dim is None else torch.prod(x, dim)
        ours_err, their_err = rel_error(out, ref), rel_error(theirs, ref)
        assert ours_err <= 1.5 * their_err, (ours_err, their_err)


@pytest.mark.parametrize("shape,dim,view", LAYOUTS)
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16]
)
def test_layouts_exact_with_powers_of_two(shape, dim, view, dtype, device):
    """Every element counted once: lines of +-1 holding a few 2s and 0.5s
    (products exact in any order), one 2 more than 0.5s in some lines."""
    x = make_view(exact_lines(shape, dim, device), view).to(dtype)
    assert_exact(x, dim)


def exact_lines(shape, dim, device):
    """+-1 with a few 2s and 0.5s: every product exact in any order."""
    x = torch.where(torch.rand(shape) < 0.5, -1.0, 1.0)
    pick = torch.rand(shape)
    line = math.prod(shape) if dim is None else shape[dim]
    rate = min(0.002, 40 / line)  # |log2| of any partial product < 127
    x[pick < rate] = 2.0
    x[(pick >= rate) & (pick < 2 * rate)] = 0.5
    return x.to(device)


def assert_exact(x, dim):
    out = gemsops.prod(x) if dim is None else gemsops.prod(x, dim)
    ref = ref_prod(x, dim)
    assert torch.equal(out.double(), ref.to(out.dtype).double())


@pytest.mark.parametrize(
    "shape,dim",
    [
        ((3, 70000), 1),
        ((1000, 10), 1),
        ((5000, 4), 0),
        ((2, 3000, 64), 1),
        ((100003,), None),
        ((7, 4097), 1),
        ((33, 5, 3), 1),
    ],
)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_backward_layouts_with_zeros(shape, dim, dtype, device):
    x = unit_lines(shape, dim, dtype, device)
    # lines as rows: the first gets one zero, the last two far apart
    d = 0 if dim is None else dim
    lines = x.reshape(-1) if dim is None else x.movedim(d, -1)
    lines = lines.reshape(-1, lines.shape[-1]).clone()
    n_len = lines.shape[1]
    lines[0, n_len // 2] = 0
    if lines.shape[0] > 1:
        lines[-1, 1] = lines[-1, n_len - 2] = 0
    if dim is None:
        x = lines.reshape(shape)
    else:
        moved = list(x.movedim(d, -1).shape)
        x = lines.reshape(moved).movedim(-1, d).contiguous()
    n = x.numel()
    x.requires_grad_()
    out = gemsops.prod(x) if dim is None else gemsops.prod(x, dim)
    g = torch.randn(out.shape, dtype=dtype, device=device)
    out.backward(g)
    xd = x.detach().double().requires_grad_()
    (xd.prod() if dim is None else xd.prod(dim)).backward(g.double())
    chain = n if dim is None else shape[dim]
    assert_close(x.grad, xd.grad, dtype, chain_len=chain, name="grad")


def test_poisoned_out_and_workspace_are_overwritten(device):
    for shape, dim in [((4, 300000), 1), ((4096, 64), 0), ((1 << 20,), None)]:
        x = unit_lines(shape, dim, torch.float32, device)
        kept = () if dim is None else shape[:dim] + shape[dim + 1 :]
        out = poison_(torch.empty(kept, device=device))
        nbytes = gemsops._C.prod_workspace(x, dim)
        assert nbytes >= 0 and (device == "cuda") >= (nbytes > 0)
        ws = torch.full(
            (max(nbytes, 16),), 0xFF, dtype=torch.uint8, device=device
        )  # 0xFFFFFFFF is a NaN in fp32
        gemsops._C.prod(x, dim, out, ws)
        n = x.numel() if dim is None else shape[dim]
        assert_close(out, ref_prod(x, dim), torch.float32, chain_len=n)
        gi = poison_(torch.empty_like(x))
        nbytes = gemsops._C.prod_bwd_workspace(x, dim)
        ws = torch.full(
            (max(nbytes, 16),), 0xFF, dtype=torch.uint8, device=device
        )
        g = torch.randn(kept, device=device)
        gemsops._C.prod_bwd(x, dim, g, gi, ws)
        xd = x.double().requires_grad_()
        (xd.prod() if dim is None else xd.prod(dim)).backward(g.double())
        assert_close(gi, xd.grad, torch.float32, chain_len=n, name="grad")


def test_repeatable_bitwise(device):
    """Partials are combined in a fixed order: no run-to-run change."""
    for shape, dim in [((4, 300000), 1), ((4096, 64), 0), ((1 << 22,), None)]:
        x = unit_lines(shape, dim, torch.float32, device)
        a = gemsops.prod(x) if dim is None else gemsops.prod(x, dim)
        b = gemsops.prod(x) if dim is None else gemsops.prod(x, dim)
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.int32, torch.uint8, torch.bool])
@pytest.mark.parametrize(
    "shape,dim", [((3, 100000), 1), ((100000, 3), 0), ((1 << 20,), None)]
)
def test_long_integer_lines_exact(dtype, shape, dim, device):
    if dtype == torch.bool:
        x = torch.rand(shape) > 1e-6
    elif dtype == torch.uint8:
        x = torch.randint(1, 3, shape, dtype=dtype)  # wraps to 0 mod 2^64
    else:
        x = torch.randint(-1, 2, shape, dtype=dtype)
        x[x == 0] = 3  # products of +-1 and 3: int64 wrap-around
    x = x.to(device)
    ours = gemsops.prod(x) if dim is None else gemsops.prod(x, dim)
    theirs = torch.prod(x) if dim is None else torch.prod(x, dim)
    assert torch.equal(ours, theirs)


@pytest.mark.cuda
@pytest.mark.parametrize("l2_multiple", [0.25, 2.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_columns_on_either_side_of_l2(l2_multiple, dtype):
    # a columns input that fits in L2 takes the evict-first loads, a larger
    # one the normal loads (prod_cols_kernel): both against float64
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    cols = 4096
    rows = max(2, int(l2_multiple * l2 / (cols * dtype.itemsize)))
    x = near_one((rows, cols), dtype, device="cuda")
    assert_close(gemsops.prod(x, 0), ref_prod(x, 0), dtype, chain_len=rows)


def beyond_l2(kind, dtype):
    """(shape, dim, view) of an input just past L2, for the layouts the
    copy-engine rows kernel takes (prod_bulk.cuh; sm_90, inputs beyond L2):
    row lengths a multiple of 8 elements (16-byte vectors in every float
    dtype) plus 8, so the last 16 KB chunk of a row is short."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    elems = int(1.1 * l2) // dtype.itemsize
    if kind == "split":  # three rows, each split over many CTAs
        return (3, elems // 3 // 8192 * 8192 + 8), 1, None
    if kind == "many":  # more rows than CTAs: each CTA loops over rows
        return (700, elems // 700 // 8 * 8 + 8), 1, None
    if kind == "cut":  # rows 8 elements longer than what is reduced
        return (700, elems // 700 // 8 * 8 + 16), 1, "cut"
    return (elems // 8 * 8 + 8,), None, None  # full: one row, every CTA


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["split", "many", "cut", "full"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_cuda_long_rows_beyond_l2(kind, dtype):
    # every element counted once (exact), and near-one values
    shape, dim, view = beyond_l2(kind, dtype)
    cut = (lambda x: x[:, :-8]) if view == "cut" else (lambda x: x)
    assert_exact(cut(exact_lines(shape, dim, "cuda").to(dtype)), dim)
    x = cut(unit_lines(shape, dim, torch.float64, "cuda").to(dtype))
    out = gemsops.prod(x) if dim is None else gemsops.prod(x, dim)
    n = x.numel() if dim is None else x.shape[dim]
    assert_close_or_torch(out, x, dim, dtype, n)


@pytest.mark.cuda
def test_cuda_workspace_too_small_is_an_error():
    x = torch.randn(4, 300000, device="cuda")
    need = gemsops._C.prod_workspace(x, 1)
    assert need > 0
    small = torch.empty(16, dtype=torch.uint8, device="cuda")
    with pytest.raises(ValueError, match="workspace of 16 bytes is too small"):
        gemsops._C.prod(x, 1, torch.empty(4, device="cuda"), small)


@pytest.mark.cuda
def test_cuda_backward_of_noncontiguous_input_is_refused_at_C():
    x = torch.randn(30, 40, device="cuda").t()
    with pytest.raises(RuntimeError, match="contiguous"):
        gemsops._C.prod_bwd(
            x,
            1,
            torch.ones(40, device="cuda"),
            torch.empty(40, 30, device="cuda"),
            None,
        )


def test_workspace_queries_on_empty_inputs(device):
    for shape, dim in [
        ((0, 4), 1),
        ((0, 4), 0),
        ((3, 0), 1),
        ((3, 0), 0),
        ((0,), None),
        ((2, 0, 5), 1),
        ((2, 0, 5), 2),
    ]:
        x = torch.empty(shape, device=device)
        assert gemsops._C.prod_workspace(x, dim) >= 0
        assert gemsops._C.prod_bwd_workspace(x, dim) >= 0
        out = gemsops.prod(x) if dim is None else gemsops.prod(x, dim)
        ref = torch.prod(x) if dim is None else torch.prod(x, dim)
        assert torch.equal(out, ref)


@pytest.mark.parametrize("dtype", ["uint16", "uint32", "uint64"])
def test_wide_unsigned_input_as_torch(dtype, device):
    # torch's result is int64; the product wraps to the same bits
    dtype = getattr(torch, dtype, None)
    if dtype is None:
        pytest.skip("this torch has no such dtype")
    big = (1 << 63) + 5 if dtype == torch.uint64 else 3
    x = torch.tensor([[3, 4, 5], [2**15, 3, 1], [big, 3, 7]], dtype=dtype)
    x = x.to(device)
    for got, want in (
        (gemsops.prod(x), torch.prod(x.cpu())),
        (gemsops.prod(x, 1), torch.prod(x.cpu(), 1)),
        (
            gemsops.prod(x, 0, keepdim=True),
            torch.prod(x.cpu(), 0, keepdim=True),
        ),
    ):
        assert got.dtype == want.dtype == torch.int64
        assert torch.equal(got.cpu(), want)


def test_out_argument_as_torch(device):
    x = torch.rand(3, 5, device=device) + 0.5
    out = torch.empty(3, dtype=torch.float64, device=device)
    got = gemsops.prod(x, 1, out=out)
    assert got is out
    want = torch.prod(x.double(), 1)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=0)
    # computed in out's dtype, as torch's: the input cast first
    f = torch.tensor([[1.5, 2.5, 3.0], [0.5, 4.0, 2.0]], device=device)
    ints = torch.empty(2, dtype=torch.int64, device=device)
    gemsops.prod(f, 1, out=ints)
    assert ints.tolist() == torch.prod(f.cpu(), 1, dtype=torch.int64).tolist()
    big = torch.tensor([[2**40, 2**40, 3]], device=device)
    wide = torch.empty(1, dtype=torch.float64, device=device)
    gemsops.prod(big, 1, out=wide)
    assert wide.item() == float(2**80 * 3)
    with pytest.raises(RuntimeError, match="dtype"):  # dtype= must match
        gemsops.prod(x, 1, dtype=torch.float32, out=out)
    kept = torch.empty(0, device=device)
    gemsops.prod(x, 0, keepdim=True, out=kept)  # resized, no warning: empty
    assert kept.shape == (1, 5)
    with pytest.raises(TypeError, match="out"):  # torch: out= needs a dim
        gemsops.prod(x, out=torch.empty((), device=device))
    with pytest.raises(RuntimeError, match="requires grad"):
        gemsops.prod(x.requires_grad_(), 1, out=out)
