"""The Python layer follows torch's semantics: the same results for the
same calls (neg-bit views, dtype=, zero-size shapes, odd eps), the same
arguments accepted, and the same exception types for the ones refused.
References are torch on the CPU, in float64 where values are compared."""

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import gemsops

aten = torch.ops.aten


def close(got, want, rtol=1e-5, atol=1e-5):
    assert got.shape == want.shape, (got.shape, want.shape)
    torch.testing.assert_close(
        got.double(), want.double(), rtol=rtol, atol=atol, equal_nan=True
    )


def neg(t):
    """t's values behind the negative bit: torch reads t, raw memory -t."""
    v = torch._neg_view(-t.detach())
    assert v.is_neg() and torch.equal(v, t.detach())
    return v.requires_grad_(t.requires_grad)


def ln_args(shape=(6, 10), nd=1, dtype=torch.float64):
    x = torch.randn(shape, dtype=dtype) * 2 + 0.5
    p = shape[len(shape) - nd :]
    return x, p, torch.randn(p, dtype=dtype), torch.randn(p, dtype=dtype)


# ---- 1. negative and conjugate bits ------------------------------------


@pytest.mark.parametrize("which", ["input", "weight", "bias", "all"])
def test_layer_norm_reads_neg_views(which):
    x, p, w, b = ln_args()
    args = {"input": x, "weight": w, "bias": b}
    for k in args:
        if which in (k, "all"):
            args[k] = neg(args[k])
    want = F.layer_norm(x, p, w, b)
    close(
        gemsops.layer_norm(args["input"], p, args["weight"], args["bias"]),
        want,
    )
    out, mean, rstd = gemsops.native_layer_norm(
        args["input"], p, args["weight"], args["bias"], 1e-5
    )
    t_out, t_mean, t_rstd = torch.native_layer_norm(x, p, w, b, 1e-5)
    close(out, t_out)
    close(mean, t_mean)
    close(rstd, t_rstd)


def test_ops_read_conj_imag():
    z = torch.randn(5, 7, dtype=torch.complex128)
    x = z.conj().imag  # a real (strided) tensor with the negative bit
    assert x.is_neg()
    plain = x.resolve_neg()
    w = torch.randn(7, dtype=torch.float64)
    close(gemsops.layer_norm(x, (7,), w), F.layer_norm(plain, (7,), w))
    close(gemsops.prod(x, 1), torch.prod(plain, 1))  # odd lines
    close(gemsops.prod(x), torch.prod(plain))
    a = torch.randn(3, 5, dtype=torch.complex64).conj().imag
    b = torch.randn(7, 4, dtype=torch.complex64).conj().imag
    close(
        gemsops.mm(a, x.float()),
        torch.mm(a.resolve_neg(), plain.float()),
        rtol=1e-4,
        atol=1e-4,
    )
    close(
        gemsops.matmul(x.float(), b),
        torch.matmul(plain.float(), b.resolve_neg()),
        rtol=1e-4,
        atol=1e-4,
    )


def test_layer_norm_autograd_with_neg_views():
    x, p, w, b = ln_args()
    for t in (x, w, b):
        t.requires_grad_()
    g = torch.randn(6, 10, dtype=torch.float64)
    want = torch.autograd.grad(F.layer_norm(x, p, w, b), (x, w, b), g)
    # leaves behind neg-bit views; the grad given has the bit too
    xs, ws, bs = (t.detach().requires_grad_() for t in (x, w, b))
    out = gemsops.layer_norm(
        torch._neg_view(-xs), p, torch._neg_view(-ws), torch._neg_view(-bs)
    )
    got = torch.autograd.grad(out, (xs, ws, bs), neg(g))
    for a, e in zip(got, want):
        close(a, e)


def test_layer_norm_backward_reads_neg_views():
    x, p, w, b = ln_args()
    g = torch.randn_like(x)
    _, mean, rstd = torch.native_layer_norm(x, p, w, b, 1e-5)
    want = aten.native_layer_norm_backward(
        g, x, p, mean, rstd, w, b, [True, True, True]
    )
    got = gemsops.layer_norm_backward(
        neg(g), neg(x), p, neg(mean), neg(rstd), neg(w), neg(b)
    )
    for a, e in zip(got, want):
        close(a, e)


def test_prod_reads_neg_views():
    x = torch.rand(4, 5, dtype=torch.float64) + 0.5  # odd lines: signs differ
    close(gemsops.prod(neg(x)), torch.prod(x))
    close(gemsops.prod(neg(x), 1), torch.prod(x, 1))
    xs = x.clone().requires_grad_()
    g = torch.randn(4, dtype=torch.float64)
    (want,) = torch.autograd.grad(torch.prod(xs, 1), xs, g)
    (got,) = torch.autograd.grad(
        gemsops.prod(torch._neg_view(-xs), 1), xs, neg(g)
    )
    close(got, want)


@pytest.mark.parametrize(
    "op,sa,sb",
    [
        ("mm", (5, 7), (7, 3)),
        ("bmm", (2, 5, 7), (2, 7, 3)),
        ("matmul", (2, 5, 7), (7, 3)),
        ("matmul", (7,), (7,)),
    ],
)
def test_matmul_reads_neg_views(op, sa, sb):
    a, b = torch.randn(sa), torch.randn(sb)
    want = getattr(torch, op)(a.double(), b.double())
    close(getattr(gemsops, op)(neg(a), neg(b)), want)
    close(getattr(gemsops, op)(a, neg(b)), want)
    a_, b_ = a.clone().requires_grad_(), b.clone().requires_grad_()
    g = torch.randn(want.shape)
    want_grads = torch.autograd.grad(getattr(torch, op)(a_, b_), (a_, b_), g)
    out = getattr(gemsops, op)(torch._neg_view(-a_), b_)
    for got, e in zip(torch.autograd.grad(out, (a_, b_), neg(g)), want_grads):
        close(got, e, rtol=1e-4, atol=1e-4)


# ---- 2. prod dtype= -------------------------------------------------------

PROD_DTYPES = [
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
]


def prod_inputs():
    return {
        "threes": torch.full((32,), 3, dtype=torch.int64),
        "neg_ints": torch.randint(-9, 10, (4, 31)),
        "big_ints": torch.tensor([[2**32, 2**32 + 3, 7]] * 3),
        "bools": torch.rand(5, 6) > 0.2,
        "int16": torch.randint(-300, 300, (3, 9), dtype=torch.int16),
        "floats": torch.randn(4, 7, dtype=torch.float64) * 3,
    }


@pytest.mark.parametrize("dtype", PROD_DTYPES + [None])
@pytest.mark.parametrize("name", list(prod_inputs()))
@pytest.mark.parametrize(
    "dim,keepdim", [(None, False), (-1, False), (0, True)]
)
def test_prod_dtype_matches_torch(name, dtype, dim, keepdim):
    x = prod_inputs()[name]
    if dim is None:
        want, got = torch.prod(x, dtype=dtype), gemsops.prod(x, dtype=dtype)
    else:
        want = torch.prod(x, dim, keepdim, dtype=dtype)
        got = gemsops.prod(x, dim, keepdim, dtype=dtype)
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.is_floating_point():
        # torch multiplies half types in their own precision, gemsops in
        # fp32: compare both with the exact product of the cast input
        xd = x.to(want.dtype).double()
        ref = (
            torch.prod(xd) if dim is None else torch.prod(xd, dim, keepdim)
        ).to(want.dtype)
        rtol = 1e-6 if want.dtype == torch.float64 else 1e-2
        close(got, ref, rtol=rtol, atol=0)
    else:
        assert torch.equal(got, want), (got, want)


def test_prod_dtype_wraps_like_torch():
    x = torch.full((32,), 3, dtype=torch.int64)
    assert gemsops.prod(x, dtype=torch.int16).item() == 16001
    assert torch.prod(x, dtype=torch.int16).item() == 16001


def test_prod_dtype_python_types():
    x = torch.tensor([1.5, 2.0, 3.0])
    for t in (float, int, bool):
        want = torch.prod(x, dtype=t)
        got = gemsops.prod(x, dtype=t)
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_prod_dtype_keeps_autograd():
    x = torch.rand(3, 4, requires_grad=True)
    g = torch.randn(3, dtype=torch.float64)
    (want,) = torch.autograd.grad(torch.prod(x, 1, dtype=torch.float64), x, g)
    (got,) = torch.autograd.grad(gemsops.prod(x, 1, dtype=torch.float64), x, g)
    assert got.dtype == torch.float32
    close(got, want)


# ---- 3. arguments accepted and refused as torch does -------------------


class Index:
    def __index__(self):
        return 10


NORMALIZED_SHAPES = [
    (10,),
    [10],
    torch.Size([10]),
    [np.int64(10)],
    [np.int32(10)],
    [torch.tensor(10)],
    [torch.tensor([10])],
    [Index()],
    [4, 10],
    10,
    10.0,
    [10.0],
    np.array([10]),
    np.array(10),
    torch.tensor([10]),
    [True],
    [np.float64(10)],
    [torch.tensor(10.0)],
    "10",
    None,
    [],
    [5],
    [-10],
    [3, 4, 10],
]


@pytest.mark.parametrize("ns", NORMALIZED_SHAPES, ids=repr)
def test_normalized_shape_as_torch(ns):
    x, _, _, _ = ln_args((3, 4, 10))
    same_outcome(
        lambda: F.layer_norm(x, ns), lambda: gemsops.layer_norm(x, ns)
    )
    same_outcome(
        lambda: torch.native_layer_norm(x, ns, None, None, 1e-5),
        lambda: gemsops.native_layer_norm(x, ns, None, None, 1e-5),
    )


@pytest.mark.parametrize("ns", NORMALIZED_SHAPES, ids=repr)
def test_backward_normalized_shape_as_torch_ops(ns):
    x, _, _, _ = ln_args((3, 4, 10))
    g = torch.randn_like(x)
    try:  # statistics of as many rows as ns makes, where torch takes it
        _, mean, rstd = torch.native_layer_norm(x, ns, None, None, 1e-5)
    except Exception:  # noqa: BLE001
        _, mean, rstd = torch.native_layer_norm(x, (10,), None, None, 1e-5)
    mask = [True, False, False]
    same_outcome(
        lambda: aten.native_layer_norm_backward(
            g, x, ns, mean, rstd, None, None, mask
        ),
        lambda: gemsops.layer_norm_backward(
            g, x, ns, mean, rstd, None, None, mask
        ),
    )


def same_outcome(torch_call, gemsops_call):
    """Both return equal results, or both raise exceptions of one type."""
    try:
        want = torch_call()
    except Exception as e:  # noqa: BLE001 - any type torch raises
        with pytest.raises(Exception) as info:
            gemsops_call()
        assert type(info.value) is type(e), (
            f"torch raised {type(e).__name__}: {e}; gemsops raised "
            f"{type(info.value).__name__}: {info.value}"
        )
        return
    got = gemsops_call()
    assert isinstance(got, tuple) == isinstance(want, tuple), (got, want)
    for a, b in zip(
        *(r if isinstance(r, tuple) else (r,) for r in (got, want)),
        strict=True,
    ):
        if b is None:
            assert a is None
        else:
            close(a, b)


DIMS = [
    1,
    -1,
    np.int64(1),
    np.int32(-2),
    torch.tensor(1),
    torch.tensor(1, dtype=torch.int8),
    True,
    1.0,
    np.float64(1),
    torch.tensor([1]),
    torch.tensor(1.0),
    torch.tensor(True),
    Index(),
    "1",
    (1,),
    2,
    -3,
]


@pytest.mark.parametrize("dim", DIMS, ids=repr)
def test_prod_dim_as_torch(dim):
    x = torch.rand(3, 4, dtype=torch.float64)
    same_outcome(lambda: torch.prod(x, dim), lambda: gemsops.prod(x, dim))
    same_outcome(
        lambda: torch.prod(x, dim=dim, keepdim=True),
        lambda: gemsops.prod(x, dim=dim, keepdim=True),
    )


@pytest.mark.parametrize(
    "keepdim",
    [None, 1, 0, 1.0, np.bool_(True), torch.tensor(True), "yes"],
    ids=repr,
)
def test_prod_keepdim_must_be_bool(keepdim):
    x = torch.rand(3, 4)
    same_outcome(
        lambda: torch.prod(x, 1, keepdim), lambda: gemsops.prod(x, 1, keepdim)
    )


@pytest.mark.parametrize("keepdim", [True, False])
def test_prod_keepdim_needs_dim(keepdim):
    x = torch.rand(3, 4)
    same_outcome(
        lambda: torch.prod(x, keepdim=keepdim),
        lambda: gemsops.prod(x, keepdim=keepdim),
    )


@pytest.mark.parametrize(
    "ns",
    [
        10,
        (10,),
        [4, 10],
        np.int64(10),
        np.array([10]),
        torch.tensor([10]),
        np.array([4, 10]),
        10.0,
        torch.tensor(10),
        [10.0],
        [],
    ],
    ids=repr,
)
@pytest.mark.parametrize(
    "kw",
    [{}, {"bias": False}, {"elementwise_affine": False}, {"eps": 0.5}],
    ids=repr,
)
def test_nn_layer_norm_constructor_as_torch(ns, kw):
    x = torch.randn(3, 4, 10, dtype=torch.float64)
    try:
        ref = torch.nn.LayerNorm(ns, dtype=torch.float64, **kw)
    except Exception as e:  # noqa: BLE001 - any type torch raises
        with pytest.raises(type(e)):
            gemsops.nn.LayerNorm(ns, dtype=torch.float64, **kw)
        return
    mod = gemsops.nn.LayerNorm(ns, dtype=torch.float64, **kw)
    if ref.weight is not None:
        torch.nn.init.normal_(ref.weight)
    if ref.bias is not None:
        torch.nn.init.normal_(ref.bias)
    mod.load_state_dict(ref.state_dict())
    same_outcome(lambda: ref(x), lambda: mod(x))


# ---- 4. exception types equal to torch's -------------------------------


def _bad_calls():
    x, _, w, b = ln_args((3, 4), dtype=torch.float32)
    e = torch.randn(0, 4)
    g = torch.randn(3, 4)
    m, r = torch.randn(3, 1), torch.rand(3, 1) + 0.5
    mask = [True, True, True]
    a, c = torch.randn(3, 4), torch.randn(4, 5)
    return (
        [
            # layer_norm / native_layer_norm (checked in Python)
            ("ln_input_list", lambda L: L([[1.0]], [1])),
            ("ln_weight_list", lambda L: L(x, [4], [1.0] * 4)),
            ("ln_bias_str", lambda L: L(x, [4], w, "b")),
            ("ln_shape_empty", lambda L: L(x, [])),
            ("ln_shape_mismatch", lambda L: L(x, [5])),
            ("ln_shape_too_long", lambda L: L(x, [2, 3, 4])),
            ("ln_shape_int", lambda L: L(x, 4)),
            ("ln_shape_float_item", lambda L: L(x, [4.0])),
            ("ln_shape_empty_input", lambda L: L(e, [5])),
            # layer_norm (checked in C)
            ("ln_eps_none", lambda L: L(x, [4], eps=None)),
            ("ln_eps_str", lambda L: L(x, [4], eps="a")),
            ("ln_weight_shape", lambda L: L(x, [4], torch.randn(5))),
            ("ln_weight_2d", lambda L: L(x, [4], w[None])),
            ("ln_bias_shape", lambda L: L(x, [4], w, torch.randn(5))),
            (
                "ln_weight_shape_empty_input",
                lambda L: L(e, [4], torch.randn(5)),
            ),
            ("ln_weight_dtype", lambda L: L(x, [4], w.double())),
            ("ln_bias_dtype", lambda L: L(x, [4], w, b.double())),
            ("ln_weight_dtype_empty_input", lambda L: L(e, [4], w.double())),
            (
                "ln_half_params",
                lambda L: L(x, [4], w.bfloat16(), b.bfloat16()),
            ),
            (
                "ln_params_two_dtypes",
                lambda L: L(x.bfloat16(), [4], w.bfloat16(), b),
            ),
            ("ln_input_int", lambda L: L(x.long(), [4])),
            ("ln_input_int_empty", lambda L: L(e.long(), [4])),
            ("ln_input_complex", lambda L: L(x.cfloat(), [4])),
        ],
        [
            # layer_norm_backward vs torch.ops.aten.native_layer_norm_backward
            ("bw_grad_list", lambda B: B([1.0], x, [4], m, r, w, b, mask)),
            ("bw_input_list", lambda B: B(g, [1.0], [4], m, r, w, b, mask)),
            ("bw_mean_list", lambda B: B(g, x, [4], [1.0], r, w, b, mask)),
            ("bw_rstd_none", lambda B: B(g, x, [4], m, None, w, b, mask)),
            (
                "bw_weight_list",
                lambda B: B(g, x, [4], m, r, [1.0] * 4, b, mask),
            ),
            ("bw_mask_none", lambda B: B(g, x, [4], m, r, w, b, None)),
            ("bw_mask_short", lambda B: B(g, x, [4], m, r, w, b, [True])),
            ("bw_shape_int", lambda B: B(g, x, 4, m, r, w, b, mask)),
            ("bw_shape_empty", lambda B: B(g, x, [], m, r, w, b, mask)),
            ("bw_shape_mismatch", lambda B: B(g, x, [5], m, r, w, b, mask)),
            (
                "bw_grad_weight_without_weight",
                lambda B: B(g, x, [4], m, r, None, b, mask),
            ),
            (
                "bw_grad_bias_without_bias",
                lambda B: B(g, x, [4], m, r, w, None, [True, False, True]),
            ),
            # (checked in C)
            (
                "bw_grad_dtype",
                lambda B: B(g.double(), x, [4], m, r, w, b, mask),
            ),
            (
                "bw_mean_dtype",
                lambda B: B(g, x, [4], m.double(), r, w, b, mask),
            ),
            ("bw_input_int", lambda B: B(g, x.long(), [4], m, r, w, b, mask)),
            # statistics in a half type beside an input of another type
            (
                "bw_half_stats_fp32_input",
                lambda B: B(g, x, [4], m.bfloat16(), r.bfloat16(), w, b, mask),
            ),
            (
                "bw_bf16_stats_fp16_input",
                lambda B: B(
                    g.half(),
                    x.half(),
                    [4],
                    m.bfloat16(),
                    r.bfloat16(),
                    w.half(),
                    b.half(),
                    mask,
                ),
            ),
        ],
        [
            # prod
            ("prod_input_list", lambda P: P([1.0, 2.0])),
            ("prod_dim_float", lambda P: P(x, 1.0)),
            ("prod_dim_bool", lambda P: P(x, True)),
            ("prod_dim_range", lambda P: P(x, 2)),
            ("prod_dim_range_neg", lambda P: P(x, -3)),
            ("prod_dim_range_0d", lambda P: P(torch.tensor(2.0), 1)),
            ("prod_dim_range_empty", lambda P: P(e, 2)),
            ("prod_dim_past_int64", lambda P: P(x, 2**63)),
            ("prod_dim_below_int64", lambda P: P(x, -(2**63) - 1)),
            ("prod_keepdim_none", lambda P: P(x, 1, None)),
            ("prod_keepdim_int", lambda P: P(x, 1, 1)),
            ("prod_keepdim_without_dim", lambda P: P(x, keepdim=True)),
            ("prod_dtype_str", lambda P: P(x, dtype="float32")),
            ("prod_dtype_numpy", lambda P: P(x, dtype=np.float32)),
            ("prod_dtype_str_before_dim", lambda P: P(x, 5, dtype="f")),
            # (checked in C)
            ("prod_float8", lambda P: P(x.to(torch.float8_e4m3fn))),
            ("prod_dtype_float8", lambda P: P(x, 1, dtype=torch.float8_e5m2)),
        ],
        [
            # mm / bmm / matmul (op, call)
            ("mm", "input_list", lambda M: M([1.0], c)),
            ("mm", "other_list", lambda M: M(a, [1.0])),
            ("mm", "dtypes", lambda M: M(a, c.double())),
            ("mm", "dtypes_empty", lambda M: M(a[:0], c.double())),
            ("mm", "shapes", lambda M: M(a, a)),
            ("mm", "not_2d", lambda M: M(a[None], c)),
            ("bmm", "input_list", lambda M: M([1.0], c[None])),
            ("bmm", "dtypes", lambda M: M(a[None], c[None].double())),
            ("bmm", "shapes", lambda M: M(a[None], a[None])),
            ("bmm", "batches", lambda M: M(a[None], torch.randn(2, 4, 5))),
            ("bmm", "not_3d", lambda M: M(a, c)),
            ("matmul", "input_list", lambda M: M([1.0], c)),
            ("matmul", "dtypes", lambda M: M(a, c.double())),
            ("matmul", "shapes", lambda M: M(a, a)),
            ("matmul", "0d", lambda M: M(torch.tensor(2.0), c)),
            ("matmul", "vectors", lambda M: M(torch.randn(3), torch.randn(4))),
            (
                "matmul",
                "batches",
                lambda M: M(torch.randn(2, 3, 4), torch.randn(3, 4, 5)),
            ),
        ],
    )


LN_BAD, BW_BAD, PROD_BAD, MM_BAD = _bad_calls()


def assert_same_exception(torch_call, gemsops_call):
    with pytest.raises(Exception) as want:
        torch_call()
    with pytest.raises(Exception) as got:
        gemsops_call()
    assert type(got.value) is type(want.value), (
        f"torch raised {type(want.value).__name__}: {want.value}\n"
        f"gemsops raised {type(got.value).__name__}: {got.value}"
    )
    return got.value


@pytest.mark.parametrize("name,call", LN_BAD, ids=[c[0] for c in LN_BAD])
def test_layer_norm_raises_as_torch(name, call):
    e = assert_same_exception(
        lambda: call(F.layer_norm), lambda: call(gemsops.layer_norm)
    )
    assert str(e).startswith("layer_norm(")
    assert_same_exception(
        lambda: call(torch_native_layer_norm),
        lambda: call(gemsops.native_layer_norm),
    )


def torch_native_layer_norm(
    input, normalized_shape, weight=None, bias=None, eps=1e-5
):
    # torch's takes no defaults
    return torch.native_layer_norm(input, normalized_shape, weight, bias, eps)


@pytest.mark.parametrize("name,call", BW_BAD, ids=[c[0] for c in BW_BAD])
def test_layer_norm_backward_raises_as_torch_ops(name, call):
    e = assert_same_exception(
        lambda: call(aten.native_layer_norm_backward),
        lambda: call(gemsops.layer_norm_backward),
    )
    assert str(e).startswith("layer_norm_backward(")


@pytest.mark.parametrize("name,call", PROD_BAD, ids=[c[0] for c in PROD_BAD])
def test_prod_raises_as_torch(name, call):
    e = assert_same_exception(
        lambda: call(torch.prod), lambda: call(gemsops.prod)
    )
    assert str(e).startswith("prod(")


@pytest.mark.parametrize(
    "op,name,call", MM_BAD, ids=[f"{c[0]}_{c[1]}" for c in MM_BAD]
)
def test_matmul_raises_as_torch(op, name, call):
    e = assert_same_exception(
        lambda: call(getattr(torch, op)), lambda: call(getattr(gemsops, op))
    )
    assert str(e).startswith(f"{op}(")


@pytest.mark.parametrize(
    "ns,kw",
    [([], {}), (4, {"dtype": torch.float64})],
    ids=["empty_shape", "param_dtype"],
)
def test_nn_layer_norm_raises_as_torch(ns, kw):
    x = torch.randn(3, 4)
    assert_same_exception(
        lambda: torch.nn.LayerNorm(ns, **kw)(x),
        lambda: gemsops.nn.LayerNorm(ns, **kw)(x),
    )


@pytest.mark.cuda
def test_device_mismatch_raises_as_torch():
    x = torch.randn(3, 4, device="cuda")
    w = torch.randn(4)
    assert_same_exception(
        lambda: F.layer_norm(x, [4], w), lambda: gemsops.layer_norm(x, [4], w)
    )
    assert_same_exception(
        lambda: torch.mm(x, w[:, None]), lambda: gemsops.mm(x, w[:, None])
    )
    g = torch.randn(3, 4)
    _, mean, rstd = torch.native_layer_norm(x, [4], None, None, 1e-5)
    assert_same_exception(
        lambda: aten.native_layer_norm_backward(
            g, x, [4], mean, rstd, None, None, [True, False, False]
        ),
        lambda: gemsops.layer_norm_backward(
            g, x, [4], mean, rstd, None, None, [True, False, False]
        ),
    )


# ---- 5. matmul with zero-size dims ---------------------------------------

ZERO_SHAPES = [
    ((0, 4), (4, 5)),
    ((3, 0), (0, 5)),
    ((3, 4), (4, 0)),
    ((0, 0), (0, 0)),
    ((0, 3, 4), (0, 4, 5)),
    ((2, 3, 0), (2, 0, 5)),
    ((2, 0, 4), (2, 4, 5)),
    ((2, 3, 4), (2, 4, 0)),
    ((0,), (0,)),
    ((3, 0), (0,)),
    ((0,), (0, 5)),
    ((2, 1, 3, 0), (4, 0, 5)),
    ((0, 1, 3, 4), (2, 4, 5)),
    ((5, 3, 0), (0, 2)),
    ((0,), (2, 0, 5)),
    ((2, 3, 0), (0,)),
    ((1, 3, 4), (0, 4, 5)),
]


@pytest.mark.parametrize("sa,sb", ZERO_SHAPES, ids=str)
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16]
)
def test_matmul_zero_size(sa, sb, dtype):
    ops = ["matmul"]
    if len(sa) == len(sb) == 2:
        ops.append("mm")
    if len(sa) == len(sb) == 3 and sa[0] == sb[0]:
        ops.append("bmm")
    for op in ops:
        a = torch.randn(sa, dtype=dtype, requires_grad=True)
        b = torch.randn(sb, dtype=dtype, requires_grad=True)
        want = getattr(torch, op)(a, b)
        got = getattr(gemsops, op)(a, b)
        assert got.shape == want.shape and got.dtype == want.dtype, op
        assert torch.equal(got, want), op  # empty, or k = 0: zeros
        g = torch.randn(want.shape, dtype=dtype)
        wants = torch.autograd.grad(want, (a, b), g)
        gots = torch.autograd.grad(got, (a, b), g)
        for x, y in zip(gots, wants):
            assert x.shape == y.shape and x.dtype == y.dtype
            close(x, y, rtol=1e-2, atol=1e-2)


# ---- 6. LayerNorm over rows of no elements, and no rows --------------------

EMPTY_LN = [
    ((3, 0), (0,)),
    ((2, 3, 0), (3, 0)),
    ((0,), (0,)),
    ((0, 4), (4,)),
    ((2, 0, 4), (4,)),
    ((0, 3, 4), (3, 4)),
]


@pytest.mark.parametrize("shape,ns", EMPTY_LN, ids=str)
@pytest.mark.parametrize("affine", [True, False])
def test_native_layer_norm_empty(shape, ns, affine):
    x = torch.randn(shape, dtype=torch.float64)
    w = torch.randn(ns, dtype=torch.float64) if affine else None
    b = torch.randn(ns, dtype=torch.float64) if affine else None
    for dtype in (torch.float64, torch.float32):
        args = [t if t is None else t.to(dtype) for t in (x, w, b)]
        want = torch.native_layer_norm(args[0], ns, args[1], args[2], 1e-5)
        got = gemsops.native_layer_norm(args[0], ns, args[1], args[2], 1e-5)
        for a, e in zip(got, want):
            assert a.dtype == e.dtype
            close(a, e)  # mean 0 and rstd NaN for rows of no elements


@pytest.mark.parametrize("shape,ns", EMPTY_LN, ids=str)
def test_layer_norm_backward_empty(shape, ns):
    x = torch.randn(shape, dtype=torch.float64)
    w = torch.randn(ns, dtype=torch.float64)
    b = torch.randn(ns, dtype=torch.float64)
    g = torch.randn(shape, dtype=torch.float64)
    _, mean, rstd = torch.native_layer_norm(x, ns, w, b, 1e-5)
    want = aten.native_layer_norm_backward(
        g, x, ns, mean, rstd, w, b, [True, True, True]
    )
    got = gemsops.layer_norm_backward(g, x, ns, mean, rstd, w, b)
    for a, e in zip(got, want):
        assert a.shape == e.shape and a.dtype == e.dtype
        assert torch.equal(a, e)
    xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))
    wants = torch.autograd.grad(F.layer_norm(xs, ns, ws, bs), (xs, ws, bs), g)
    gots = torch.autograd.grad(
        gemsops.layer_norm(xs, ns, ws, bs), (xs, ws, bs), g
    )
    for a, e in zip(gots, wants):
        assert a.shape == e.shape and torch.equal(a, e)


# ---- 7. eps < 0 or NaN: computed as torch computes it --------------------


@pytest.mark.parametrize("eps", [-0.5, -1e-5, float("nan"), 0.0, 2.0])
def test_layer_norm_any_eps(eps):
    x = torch.randn(8, 16, dtype=torch.float64)
    x[:4] *= 0.3  # variance under 0.5: rows that eps = -0.5 makes NaN
    w = torch.randn(16, dtype=torch.float64)
    b = torch.randn(16, dtype=torch.float64)
    close(
        gemsops.layer_norm(x, (16,), w, b, eps),
        F.layer_norm(x, (16,), w, b, eps),
    )
    want = torch.native_layer_norm(x, (16,), w, b, eps)
    for a, e in zip(gemsops.native_layer_norm(x, (16,), w, b, eps), want):
        close(a, e)


# ---- 8. more of the same kind --------------------------------------------


@pytest.mark.parametrize("affine", ["weight", "bias", "both", "none"])
@pytest.mark.parametrize("grads", ["x", "w", "b", "xw", "wb", "xwb"])
def test_layer_norm_affine_and_requires_grad_combinations(affine, grads):
    x, p, w, b = ln_args((5, 3, 8), 2)
    w = w if affine in ("weight", "both") else None
    b = b if affine in ("bias", "both") else None
    leaves = {"x": x, "w": w, "b": b}
    wanted = [leaves[k] for k in grads if leaves[k] is not None]
    for t in wanted:
        t.requires_grad_()
    g = torch.randn_like(x)
    want = F.layer_norm(x, p, w, b)
    got = gemsops.layer_norm(x, p, w, b)
    close(got, want)
    assert got.requires_grad == want.requires_grad
    if wanted:
        for a, e in zip(
            torch.autograd.grad(got, wanted, g),
            torch.autograd.grad(want, wanted, g),
        ):
            close(a, e)


@pytest.mark.parametrize("grads", ["x", "w", "xwb"])
def test_native_layer_norm_differentiable_through_out(grads):
    x, p, w, b = ln_args((5, 3, 8), 2)
    leaves = [t for k, t in zip("xwb", (x, w, b)) if k in grads]
    for t in leaves:
        t.requires_grad_()
    want = torch.native_layer_norm(x, p, w, b, 1e-5)
    got = gemsops.native_layer_norm(x, p, w, b, 1e-5)
    assert [t.requires_grad for t in got] == [t.requires_grad for t in want]
    for a, e in zip(got, want):
        close(a, e)
    g = torch.randn_like(x)
    for a, e in zip(
        torch.autograd.grad(got[0], leaves, g),
        torch.autograd.grad(want[0], leaves, g),
    ):
        close(a, e)
    same_outcome(
        lambda: torch.autograd.grad(want[1].sum(), leaves),
        lambda: torch.autograd.grad(got[1].sum(), leaves),
    )


@pytest.mark.parametrize("xdtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("which", ["weight", "bias", "both"])
def test_layer_norm_fp32_params_with_half_input(xdtype, which):
    x = torch.randn(6, 32).to(xdtype)
    w = torch.randn(32) if which != "bias" else None
    b = torch.randn(32) if which != "weight" else None
    want = F.layer_norm(x, (32,), w, b)
    got = gemsops.layer_norm(x, (32,), w, b)
    assert got.dtype == want.dtype == xdtype
    close(got, want, rtol=2e-2, atol=2e-2)
    want = torch.native_layer_norm(x, (32,), w, b, 1e-5)
    for a, e in zip(gemsops.native_layer_norm(x, (32,), w, b), want):
        assert a.dtype == e.dtype and a.shape == e.shape
        close(a, e, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(
    "shape,dim,keepdim",
    [
        ((), None, False),
        ((), 0, False),
        ((), -1, True),
        ((), 0, True),
        ((0,), None, False),
        ((3, 0), None, False),
        ((3, 0), 1, False),
        ((3, 0), 1, True),
        ((3, 0), 0, True),
        ((2, 0, 4), -2, False),
        ((1,), 0, True),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.bool])
def test_prod_edge_shapes(shape, dim, keepdim, dtype):
    x = (torch.rand(shape, dtype=torch.float64) * 3).to(dtype)
    args = () if dim is None else (dim, keepdim)
    want, got = torch.prod(x, *args), gemsops.prod(x, *args)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(got, want)
    if dtype.is_floating_point:
        xs = x.clone().requires_grad_()
        g = torch.randn(want.shape, dtype=dtype)
        (want_g,) = torch.autograd.grad(torch.prod(xs, *args), xs, g)
        (got_g,) = torch.autograd.grad(gemsops.prod(xs, *args), xs, g)
        assert got_g.shape == want_g.shape
        close(got_g, want_g)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
def test_prod_integer_dtype_of_input_requiring_grad(dtype):
    x = torch.rand(3, 4, requires_grad=True) * 3
    same_outcome(
        lambda: torch.prod(x, 1, dtype=dtype),
        lambda: gemsops.prod(x, 1, dtype=dtype),
    )
    with torch.no_grad():
        want, got = torch.prod(x, dtype=dtype), gemsops.prod(x, dtype=dtype)
    assert got.dtype == want.dtype and torch.equal(got, want)


def test_matmul_dot_of_empty_vectors():
    a, b = torch.randn(0), torch.randn(0)
    got = gemsops.matmul(a, b)
    assert got.shape == () and got.item() == 0.0
    assert math.isclose(torch.matmul(a, b).item(), got.item())


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_sparse_input_of_the_norms_as_torch(layout):
    """No norm kernel takes sparse input: torch's functions (and the fused
    adds' unfused expression) compute or refuse it, with torch's
    exception (rms_norm raised RuntimeError where torch's raises
    NotImplementedError)."""
    d = torch.randn(3, 8)
    x = d.to_sparse() if layout == "coo" else d.to_sparse_csr()
    g = torch.randn(8)
    for ours, theirs in (
        (
            lambda: gemsops.layer_norm(x, (8,), g),
            lambda: F.layer_norm(x, (8,), g),
        ),
        (
            lambda: gemsops.rms_norm(x, (8,), g),
            lambda: F.rms_norm(x, (8,), g),
        ),
        (
            lambda: gemsops.fused_add_layer_norm(x, x, (8,), g),
            lambda: (F.layer_norm(x + x, (8,), g), x + x),
        ),
        (
            lambda: gemsops.fused_add_rms_norm(x, x, (8,), g),
            lambda: (F.rms_norm(x + x, (8,), g), x + x),
        ),
    ):
        try:
            want = theirs()
        except Exception as e:  # noqa: BLE001 - torch's own refusal
            with pytest.raises(type(e)):
                ours()
            continue
        got = ours()
        for a, b in (
            zip(got, want) if isinstance(got, tuple) else ((got, want),)
        ):
            close(a.to_dense(), b.to_dense())


@pytest.mark.parametrize("layout", [torch.jagged, torch.strided])
def test_nested_input_computed_as_torch(layout):
    # no kernel of ours takes nested tensors: torch's own functions do
    parts = [torch.randn(2, 8), torch.randn(3, 8)]
    w, b, g = torch.randn(5, 8), torch.randn(5), torch.randn(8)
    calls = [
        (lambda x: gemsops.linear(x, w, b), lambda x: F.linear(x, w, b)),
        (
            lambda x: gemsops.layer_norm(x, (8,), g, g),
            lambda x: F.layer_norm(x, (8,), g, g),
        ),
    ]
    # the fused adds as their unfused expression, y and h
    calls.append(
        (
            lambda x: gemsops.fused_add_layer_norm(x, x, (8,), g, g),
            lambda x: (F.layer_norm(x + x, (8,), g, g), x + x),
        )
    )
    if layout is torch.jagged:  # torch's rms_norm refuses strided nested
        calls.append(
            (
                lambda x: gemsops.rms_norm(x, (8,), g),
                lambda x: F.rms_norm(x, (8,), g),
            )
        )
        calls.append(
            (
                lambda x: gemsops.fused_add_rms_norm(x, x, (8,), g),
                lambda x: (F.rms_norm(x + x, (8,), g), x + x),
            )
        )
    for ours, theirs in calls:
        x = torch.nested.nested_tensor(parts, layout=layout)
        got, want = ours(x), theirs(x)
        if not isinstance(got, tuple):
            got, want = (got,), (want,)
        assert len(got) == len(want)
        for g_nt, w_nt in zip(got, want):
            for a, b_ in zip(g_nt.unbind(), w_nt.unbind(), strict=True):
                close(a, b_)


@pytest.mark.parametrize("layout", [torch.jagged, torch.strided])
def test_nested_operands_of_the_products_refused(layout):
    # as the other non-strided operands (docs/design.md): no kernel reads
    # them, and torch's own products take only some
    nt = torch.nested.nested_tensor(
        [torch.randn(2, 3), torch.randn(4, 3)], layout=layout
    )
    calls = {
        "mm": lambda: gemsops.mm(nt, torch.randn(3, 5)),
        "bmm": lambda: gemsops.bmm(nt, torch.randn(2, 3, 5)),
        "matmul": lambda: gemsops.matmul(torch.randn(5, 2), nt),
        "addmm": lambda: gemsops.addmm(torch.zeros(5), nt, torch.randn(3, 5)),
        "prod": lambda: gemsops.prod(nt, -1),
    }
    for fn, call in calls.items():
        with pytest.raises(NotImplementedError, match=f"{fn}\\(\\).*nested"):
            call()


def test_sparse_input_to_linear_computed_as_torch():
    x, w, b = torch.randn(3, 8), torch.randn(5, 8), torch.randn(5)
    for sparse in (x.to_sparse(), x.to_sparse_csr()):
        close(gemsops.linear(sparse, w, b), F.linear(x, w, b))
        close(gemsops.linear(sparse, w), F.linear(x, w))


@pytest.mark.parametrize("to_sparse", ["to_sparse", "to_sparse_csr"])
def test_sparse_weight_or_bias_of_linear_as_torch(to_sparse):
    # torch computes some of these and refuses others (a COO weight beside
    # a bias: addmm's RuntimeError); gemsops hands them to it
    x, w, b = torch.randn(3, 8), torch.randn(5, 8), torch.randn(5)
    sw, sb = getattr(w, to_sparse)(), b.to_sparse()
    for args in ((x, sw), (x, sw, b), (x, w, sb)):
        try:
            want = F.linear(*args)
        except RuntimeError:
            with pytest.raises(RuntimeError):
                gemsops.linear(*args)
            continue
        got = gemsops.linear(*args)
        assert got.layout == want.layout
        close(got.to_dense(), want.to_dense())


def test_flop_counter_counts_the_products_as_torch():
    from torch.utils.flop_counter import FlopCounterMode

    def flops(module_cls, fn):
        torch.manual_seed(0)
        layer = module_cls(8, 5)
        x = torch.randn(2, 3, 8, requires_grad=True)
        with FlopCounterMode(display=False) as counter:
            fn(layer, x).sum().backward()
        return counter.get_total_flops()

    def mats(layer, x):
        return torch.bmm(x, x.mT) @ x @ layer.weight.t()

    def gems_mats(layer, x):
        return gemsops.matmul(gemsops.bmm(x, x.mT), x) @ layer.weight.t()

    linear = flops(torch.nn.Linear, lambda m, x: m(x))
    assert linear > 0
    assert flops(gemsops.nn.Linear, lambda m, x: m(x)) == linear
    want = flops(torch.nn.Linear, mats)
    assert want > 0
    assert flops(torch.nn.Linear, gems_mats) == want


def test_eps_below_the_statistics_type_as_torch(device):
    # eps is taken in the statistics' type (fp32 for fp32 input), as
    # torch's kernels take it: 1e-300 is 0 there, and a row with no spread
    # normalizes to 0 * inf
    ones, zeros = (
        torch.ones(2, 8, device=device),
        torch.zeros(2, 8, device=device),
    )
    for got, want in (
        (
            gemsops.layer_norm(ones, (8,), eps=1e-300),
            F.layer_norm(ones, (8,), eps=1e-300),
        ),
        (
            gemsops.rms_norm(zeros, (8,), eps=1e-300),
            F.rms_norm(zeros, (8,), eps=1e-300),
        ),
    ):
        assert want.isnan().all()
        assert got.isnan().all()


def test_out_requiring_grad_refused_as_torch():
    a = torch.ones(2, 2)
    w = torch.zeros(2, 2, requires_grad=True)
    for call in (
        lambda o: gemsops.mm(a, a, out=o),
        lambda o: gemsops.addmm(a, a, a, out=o),
        lambda o: gemsops.prod(a, 1, out=o[0]),
    ):
        with pytest.raises(RuntimeError, match="out=.*requires grad"):
            call(w * 1)


@pytest.mark.parametrize("shape", [(3, 5), (0,), (2, 2)])
@pytest.mark.parametrize("op", ["mm", "matmul", "addmm", "prod"])
def test_out_version_bumped_as_torch(op, shape):
    """An out= written, resized first or not, counts one in-place write,
    as torch's (a resize then counted one more)."""
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    call = {
        "mm": lambda lib, o: lib.mm(a, b, out=o),
        "matmul": lambda lib, o: lib.matmul(a, b, out=o),
        "addmm": lambda lib, o: lib.addmm(b[0], a, b, out=o),
        "prod": lambda lib, o: lib.prod(b, 1, out=o),
    }[op]
    bumps = []
    for lib in (torch, gemsops):
        o = torch.empty(shape)
        before = o._version
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the resize's
            got = call(lib, o)
        assert got is o
        bumps.append(o._version - before)
    assert bumps[1] == bumps[0]


@pytest.mark.parametrize("name", ["uint16", "uint32", "uint64"])
def test_prod_wide_unsigned_dtype_refused_as_torch(name):
    dtype = getattr(torch, name)
    x = torch.tensor([[2, 3]])
    with pytest.raises(NotImplementedError):
        torch.prod(x, 1, dtype=dtype)
    for call in (
        lambda: gemsops.prod(x, 1, dtype=dtype),
        lambda: gemsops.prod(x.to(dtype), dtype=dtype),
    ):
        with pytest.raises(NotImplementedError, match="dtype"):
            call()


# ---- more dimensions than C takes (18 and 21) -----------------------------


@pytest.mark.parametrize("lead", [15, 18])
def test_norms_of_more_dims_than_c_takes(lead, device):
    # C's tensors have at most 16 dims: the leading ones fold into rows,
    # forward and backward, and the results come back whole, not as views
    shape = (1,) * lead + (2, 3, 8)
    x, r = (torch.randn(shape, device=device) for _ in range(2))
    w, b = (torch.randn(8, device=device) for _ in range(2))
    ref = {t: t.double() for t in (x, r, w, b)}
    xd, rd, wd, bd = (ref[t] for t in (x, r, w, b))
    cases = {
        "layer_norm": (
            lambda: gemsops.layer_norm(x, (8,), w, b),
            F.layer_norm(xd, (8,), wd, bd),
        ),
        "layer_norm 2-d": (
            lambda: gemsops.layer_norm(x, (3, 8), w.expand(3, 8)),
            F.layer_norm(xd, (3, 8), wd.expand(3, 8)),
        ),
        "rms_norm": (
            lambda: gemsops.rms_norm(x, (8,), w),
            F.rms_norm(xd, (8,), wd),
        ),
        "native_layer_norm": (
            lambda: gemsops.native_layer_norm(x, (8,), w, b, 1e-5),
            aten.native_layer_norm(xd, (8,), wd, bd, 1e-5),
        ),
        "fused_add_layer_norm": (
            lambda: gemsops.fused_add_layer_norm(x, r, (8,), w, b),
            (F.layer_norm(xd + rd, (8,), wd, bd), xd + rd),
        ),
        "fused_add_rms_norm": (
            lambda: gemsops.fused_add_rms_norm(x, r, (8,), w),
            (F.rms_norm(xd + rd, (8,), wd), xd + rd),
        ),
    }
    for name, (ours, want) in cases.items():
        with torch.no_grad():
            got = ours()
        got, want = (
            (got, want) if isinstance(got, tuple) else ((got,), (want,))
        )
        # the output comes back whole; what the backward saves (h, the
        # statistics) as views of it (the next test)
        assert not got[0]._is_view(), name
        for g, t in zip(got, want):
            close(g, t)
    xg = x.clone().requires_grad_()
    wg = w.clone().requires_grad_()
    gemsops.layer_norm(xg, (8,), wg, b).pow(2).sum().backward()
    xr = xd.clone().requires_grad_()
    wr = wd.clone().requires_grad_()
    F.layer_norm(xr, (8,), wr, bd).pow(2).sum().backward()
    close(xg.grad, xr.grad, 1e-4, 1e-4)
    close(wg.grad, wr.grad, 1e-4, 1e-4)
    g = torch.randn(shape, device=device)
    _, mean, rstd = aten.native_layer_norm(x, (8,), w, b, 1e-5)
    got = gemsops.layer_norm_backward(g, x, (8,), mean, rstd, w, b)
    want = aten.native_layer_norm_backward(
        g.double(),
        xd,
        (8,),
        mean.double(),
        rstd.double(),
        wd,
        bd,
        (True, True, True),
    )
    for a, t in zip(got, want):
        close(a, t, 1e-4, 1e-4)


@pytest.mark.parametrize("lead", [15, 18])
def test_saved_outputs_of_folded_norms_see_in_place_writes(lead, device):
    # h (the fused adds) and the statistics (native_layer_norm) are what
    # the backward saves: an in-place write to them before it must raise,
    # as torch's and as gemsops' below 16 dims do
    shape = (1,) * lead + (2, 8)
    x, r = (torch.randn(shape, device=device) for _ in range(2))
    w = torch.randn(8, device=device, requires_grad=True)
    for fused in (gemsops.fused_add_layer_norm, gemsops.fused_add_rms_norm):
        y, h = fused(x, r, (8,), w)
        h.mul_(2)
        with pytest.raises(RuntimeError, match="inplace"):
            y.sum().backward()
    y, mean, rstd = gemsops.native_layer_norm(x, (8,), w, None, 1e-5)
    rstd.mul_(2)
    with pytest.raises(RuntimeError, match="inplace"):
        y.sum().backward()


@pytest.mark.parametrize("lead", [14, 15, 18])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_and_matmul_of_more_dims_than_c_takes(lead, bias, device):
    # the batch dims of linear's input fold into rows past C's 16 dims as
    # below them (they raised there), forward and backward, as torch's
    x = torch.randn((1,) * lead + (3, 8), device=device)
    w = torch.randn(6, 8, device=device)
    b = torch.randn(6, device=device) if bias else None
    xd, wd = x.double(), w.double()
    bd = None if b is None else b.double()
    want = F.linear(xd, wd, bd)
    with torch.no_grad():
        got = gemsops.linear(x, w, b)
    assert got.shape == want.shape and not got._is_view()
    close(got, want)
    close(gemsops.matmul(x, w.mT), torch.matmul(xd, wd.mT))
    ours = [t.clone().requires_grad_() for t in (x, w)]
    theirs = [t.clone().requires_grad_() for t in (xd, wd)]
    g = torch.randn(want.shape, device=device)
    gemsops.linear(ours[0], ours[1], b).backward(g)
    F.linear(theirs[0], theirs[1], bd).backward(g.double())
    for a, t in zip(ours, theirs):
        close(a.grad, t.grad, 1e-4, 1e-4)


@pytest.mark.parametrize("dims", [2, 18])
def test_prod_keepdim_result_is_its_own_tensor(dims, device):
    x = torch.rand((1,) * (dims - 2) + (3, 4), device=device) + 0.5
    with torch.no_grad():
        out = gemsops.prod(x, -1, keepdim=True)
    assert not out._is_view() and out.shape == x.shape[:-1] + (1,)
    p = torch.rand(1, device=device, requires_grad=True)
    out.mul_(p)
    close(out, torch.prod(x.double(), -1, keepdim=True) * p.detach().double())


@pytest.mark.parametrize("dim", [None, 0, 16, -1])
@pytest.mark.parametrize("keepdim", [False, True])
def test_prod_of_more_dims_than_c_takes(dim, keepdim, device):
    x = torch.rand((2,) + (1,) * 15 + (3, 4), device=device) + 0.5
    x.requires_grad_()
    if dim is None:
        got, want = gemsops.prod(x), torch.prod(x.double())
    else:
        got = gemsops.prod(x, dim, keepdim)
        want = torch.prod(x.double(), dim, keepdim)
    assert not got._is_view()
    close(got, want)
    (gx,) = torch.autograd.grad(got.sum(), x)
    (gw,) = torch.autograd.grad(want.sum(), x)
    close(gx, gw, 1e-4, 1e-4)


@pytest.mark.parametrize(
    "x_shape,ns",
    [
        ((97, 33, 0, 1), (33, 0, 1)),
        ((0, 8), (8,)),
        ((5, 0), (0,)),
        ((0,) + (1,) * 16 + (8,), (8,)),
    ],
)
def test_layer_norm_backward_of_no_elements_takes_any_statistics(
    x_shape, ns, device
):
    # no element reads mean or rstd: torch's backward takes them of any
    # size there (callers pass placeholders where torch's CUDA forward
    # refused the input), and so does gemsops, past C's 16 dims too
    x = torch.randn(x_shape, device=device)
    g = torch.randn(x_shape, device=device)
    w, b = (torch.randn(ns, device=device) for _ in range(2))
    stat = torch.zeros(1, device=device)
    mask = (True, True, True)
    want = aten.native_layer_norm_backward(g, x, ns, stat, stat, w, b, mask)
    got = gemsops.layer_norm_backward(g, x, ns, stat, stat, w, b, mask)
    for a, t in zip(got, want):
        assert a.shape == t.shape and torch.equal(a, t)


@pytest.mark.parametrize("grad", [False, True])
def test_native_layer_norm_statistics_are_tensors_of_their_own(grad, device):
    # as torch's: not views (a view refuses detach_()), of the stats' shape
    x = torch.randn(2, 3, 8, device=device, requires_grad=grad)
    out, mean, rstd = gemsops.native_layer_norm(x, (8,), None, None, 1e-5)
    want = aten.native_layer_norm(x.detach().double(), (8,), None, None, 1e-5)
    for got, ref in zip((out, mean, rstd), want):
        assert not got._is_view() and got.shape == ref.shape
        close(got, ref)
    mean.detach_()
    rstd.detach_()


def test_layer_norm_backward_takes_any_sequence_of_three_as_the_mask(device):
    # torch's schema takes a NumPy array or a range for bool[3]
    x, g = (torch.randn(4, 8, device=device) for _ in range(2))
    w, b = (torch.randn(8, device=device) for _ in range(2))
    _, mean, rstd = aten.native_layer_norm(x, (8,), w, b, 1e-5)
    for mask in (np.array([True, False, True]), np.array([1, 0, 1]), range(3)):
        want = aten.native_layer_norm_backward(
            g, x, (8,), mean, rstd, w, b, mask
        )
        got = gemsops.layer_norm_backward(
            g, x, (8,), mean, rstd, w, b, output_mask=mask
        )
        for a, t in zip(got, want):
            assert (a is None) == (t is None)
            if a is not None:
                close(a, t, 1e-4, 1e-4)
    for bad in ("abc", torch.tensor([True, False, True]), (True, False)):
        with pytest.raises(RuntimeError, match="output_mask"):
            gemsops.layer_norm_backward(
                g, x, (8,), mean, rstd, w, b, output_mask=bad
            )
