"""gemsops.addmm, gemsops.linear and gemsops.nn.Linear against torch's,
forward and backward, with float64 references."""

import fractions
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import gemsops
from gemsops.testing import assert_close, raised_type

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _ref_linear(x, w, b):
    y = x.double() @ w.double().t()
    return y + b.double() if b is not None else y


@pytest.mark.parametrize("shape", [(5,), (3, 5), (2, 3, 5), (0, 5)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_forward_backward(shape, bias, dtype, device):
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=dtype, device=device, requires_grad=True)
    w = torch.randn(7, 5, dtype=dtype, device=device, requires_grad=True)
    b = (
        torch.randn(7, dtype=dtype, device=device, requires_grad=True)
        if bias
        else None
    )
    y = gemsops.linear(x, w, b)
    ref = _ref_linear(x, w, b)
    assert y.dtype == dtype and y.shape == ref.shape
    assert_close(y, ref, dtype, chain_len=5)
    g = torch.randn_like(y)
    y.backward(g)
    xd, wd = x.detach().double(), w.detach().double()
    gd = g.double().reshape(-1, 7)
    assert_close(x.grad, (g.double() @ wd), dtype, chain_len=7)
    assert_close(
        w.grad,
        gd.t() @ xd.reshape(-1, 5),
        dtype,
        chain_len=max(1, gd.shape[0]),
    )
    if bias:
        assert_close(b.grad, gd.sum(0), dtype, chain_len=max(1, gd.shape[0]))


def test_nn_linear_is_a_drop_in(device):
    torch.manual_seed(3)
    t = torch.nn.Linear(16, 8, device=device)
    torch.manual_seed(3)
    g = gemsops.nn.Linear(16, 8, device=device)
    assert isinstance(g, torch.nn.Linear)
    assert g.state_dict().keys() == t.state_dict().keys()
    for k in t.state_dict():  # same init from the same seed
        assert torch.equal(g.state_dict()[k], t.state_dict()[k])
    nb = gemsops.nn.Linear(16, 8, bias=False, device=device)
    assert nb.bias is None
    x = torch.randn(4, 16, device=device)
    torch.testing.assert_close(g(x), t(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nb(x), x @ nb.weight.t(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex64], ids=str)
def test_nn_linear_of_dtypes_without_a_kernel_is_torchs(dtype, device):
    # a model in .double() (gradcheck) runs: the module hands what gemsops
    # has no kernel for to torch's product; the function still refuses it
    torch.manual_seed(4)
    t = torch.nn.Linear(16, 8, device=device)
    g = gemsops.nn.Linear(16, 8, device=device)
    g.load_state_dict(t.state_dict())
    t, g = t.to(dtype), g.to(dtype)
    x = torch.randn(4, 16, device=device).to(dtype)
    assert torch.equal(g(x), t(x))
    with pytest.raises(NotImplementedError, match="gemsops matmul takes"):
        gemsops.linear(x, g.weight, g.bias)
    if dtype == torch.float64:
        x.requires_grad_()
        assert torch.autograd.gradcheck(g, (x,))


@pytest.mark.parametrize("bias", [True, False])
def test_weight_gradient_comes_in_the_weights_layout(bias, device):
    """The product's gradient for weight.t() is made as (g^T x)^T, so the
    weight's .grad has the weight's strides (no copy by AccumulateGrad)
    and the values of the float64 reference."""
    torch.manual_seed(5)
    lin = gemsops.nn.Linear(24, 40, bias=bias, device=device)
    arrived = []  # the gradient as the backward made it, before AccumulateGrad
    lin.weight.register_hook(lambda t: arrived.append(t.stride()))
    x = torch.randn(3, 7, 24, device=device, requires_grad=True)
    g = torch.randn(3, 7, 40, device=device)
    lin(x).backward(g)
    assert arrived == [lin.weight.stride()]
    gd, xd = g.double().reshape(-1, 40), x.detach().double().reshape(-1, 24)
    assert_close(lin.weight.grad, gd.t() @ xd, torch.float32, chain_len=21)
    assert_close(
        x.grad,
        g.double() @ lin.weight.detach().double(),
        torch.float32,
        chain_len=40,
    )


@pytest.mark.parametrize("bias", [True, False])
def test_transposed_operands_get_gradients_in_their_layout(bias, device):
    """A weight stored transposed and an input that is a transpose: each
    gradient arrives with its tensor's strides and the float64 values."""
    torch.manual_seed(6)
    w = torch.randn(24, 40, device=device).t().requires_grad_()  # [40, 24]
    x = torch.randn(24, 9, device=device).t().requires_grad_()  # [9, 24]
    b = torch.randn(40, device=device, requires_grad=True) if bias else None
    arrived = {}

    def seen(name):
        def hook(t):
            arrived[name] = t.stride()  # as the backward made it

        return hook

    w.register_hook(seen("w"))
    x.register_hook(seen("x"))
    y = gemsops.linear(x, w, b)
    assert_close(y, _ref_linear(x, w, b), torch.float32, chain_len=24)
    g = torch.randn_like(y)
    y.backward(g)
    assert arrived == {"w": w.stride(), "x": x.stride()}
    gd = g.double()
    assert_close(
        w.grad, gd.t() @ x.detach().double(), torch.float32, chain_len=9
    )
    assert_close(x.grad, gd @ w.detach().double(), torch.float32, chain_len=40)
    if bias:
        assert_close(b.grad, gd.sum(0), torch.float32, chain_len=9)


def _layout(name, device):
    """An input [*, 24] in one of the layouts linear meets."""
    if name == "4-D with a size-1 dim":
        return torch.randn(2, 1, 3, 24, device=device)
    if name == "rows of a wider tensor":  # folds, row stride 40
        return torch.randn(2, 5, 40, device=device)[:, :, 8:32]
    if name == "batch and rows swapped":  # does not fold: copied
        return torch.randn(5, 2, 24, device=device).transpose(0, 1)
    return torch.randn(3, 4, 48, device=device)[..., ::2]  # column stride 2


@pytest.mark.parametrize(
    "layout",
    [
        "4-D with a size-1 dim",
        "rows of a wider tensor",
        "batch and rows swapped",
        "strided columns",
    ],
)
@pytest.mark.parametrize("bias", [True, False])
def test_linear_input_layouts(layout, bias, device):
    """Inputs whose rows C folds, and ones it cannot, give torch's values
    and gradients (float64 references) and an x.grad of x's shape."""
    x = _layout(layout, device).requires_grad_()
    w = torch.randn(40, 24, device=device, requires_grad=True)
    b = torch.randn(40, device=device, requires_grad=True) if bias else None
    y = gemsops.linear(x, w, b)
    assert y.shape == (*x.shape[:-1], 40) and y.is_contiguous()
    assert_close(y, _ref_linear(x, w, b), torch.float32, chain_len=24)
    g = torch.randn_like(y)
    y.backward(g)
    gd = g.double().reshape(-1, 40)
    xd = x.detach().double().reshape(-1, 24)
    assert x.grad.shape == x.shape
    wd = w.detach().double()
    assert_close(x.grad, g.double() @ wd, torch.float32, chain_len=40)
    assert_close(w.grad, gd.t() @ xd, torch.float32, chain_len=gd.shape[0])
    if bias:
        assert_close(b.grad, gd.sum(0), torch.float32, chain_len=gd.shape[0])


def _data_parallel(dtype):
    """_C's launch arguments: data-parallel (no workspace asked), fp32
    exact (the ffma mainloop), others the most capable."""
    return (
        1,
        0,
        0,
        1 if dtype is torch.float32 else 0,
        None,
        None,
        0,
        0,
        None,
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_products_view_the_layers_tensors_in_c(dtype, device):
    """_C's three nn.Linear products fold an input's leading dims into rows
    of one stride (here a slice: row stride 40) and read the weight or the
    gradient transposed; every element of the poisoned outputs is
    written, with the float64 reference's values."""
    x = torch.randn(2, 5, 40, dtype=dtype, device=device)[:, :, 8:32]
    w = torch.randn(16, 24, dtype=dtype, device=device)
    g = torch.randn(2, 5, 16, dtype=dtype, device=device)
    bias = torch.randn(16, dtype=dtype, device=device)
    xd, wd, gd = x.double(), w.double(), g.double()
    y = torch.full((2, 5, 16), float("nan"), dtype=dtype, device=device)
    launch = _data_parallel(dtype)
    gemsops._C.linear(x, w, y, *launch, bias, 1.0, 1.0)
    assert_close(y, xd @ wd.t() + bias.double(), dtype, chain_len=24)
    dx = torch.full((2, 5, 24), float("nan"), dtype=dtype, device=device)
    gemsops._C.linear_grad_input(g, w, dx, *launch)
    assert_close(dx, gd @ wd, dtype, chain_len=16)
    dw = torch.full((16, 24), float("nan"), dtype=dtype, device=device)
    gemsops._C.linear_grad_weight(g, x, dw, *launch)
    ref = gd.reshape(10, 16).t() @ xd.reshape(10, 24)
    assert_close(dw, ref, dtype, chain_len=10)


def test_linear_products_refuse_what_does_not_fold(device):
    """An input whose leading dims need two strides, or a product whose
    sizes do not chain, is a RuntimeError naming the argument; the output
    keeps its poison."""
    x = torch.randn(5, 2, 24, device=device).transpose(0, 1)
    w = torch.randn(16, 24, device=device)
    y = torch.full((2, 5, 16), float("nan"), device=device)
    launch = _data_parallel(torch.float32)
    with pytest.raises(RuntimeError, match="'input' of shape .2, 5, 24.*fold"):
        gemsops._C.linear(x, w, y, *launch)
    with pytest.raises(RuntimeError, match="linear_grad_input.*do not chain"):
        gemsops._C.linear_grad_input(
            torch.randn(2, 5, 24, device=device), w, y, *launch
        )
    assert y.isnan().all()


@pytest.mark.parametrize("bias_shape", [(7,), (1, 7), (3, 7), ()])
@pytest.mark.parametrize("beta,alpha", [(1, 1), (0.5, 2.0), (0, 1), (2, 0)])
def test_addmm_matches_torch(bias_shape, beta, alpha, device):
    torch.manual_seed(1)
    inp = torch.randn(bias_shape, device=device)
    a, b = torch.randn(3, 5, device=device), torch.randn(5, 7, device=device)
    if beta == 0:
        inp = inp.fill_(math.nan)  # not read
    out = gemsops.addmm(inp, a, b, beta=beta, alpha=alpha)
    ref = torch.addmm(
        inp.double(), a.double(), b.double(), beta=beta, alpha=alpha
    )
    assert out.shape == ref.shape and out.dtype == torch.float32
    assert_close(out, ref, torch.float32, chain_len=5)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("x_kind", ["1-D", "3-D", "3-D transposed"])
def test_linear_result_is_its_own_tensor(x_kind, bias, device):
    # rows folded from x come back as the result, not as a view of the
    # product: written in place after no_grad, detach_()'d
    x = {
        "1-D": lambda: torch.randn(5, device=device),
        "3-D": lambda: torch.randn(2, 3, 5, device=device),
        "3-D transposed": lambda: torch.randn(3, 2, 5, device=device).mT,
    }[x_kind]()
    w = torch.randn(4, x.shape[-1], device=device)
    b = torch.randn(4, device=device) if bias else None
    with torch.no_grad():
        out = gemsops.linear(x, w, b)
    assert not out._is_view()
    p = torch.rand(4, device=device, requires_grad=True)
    out.mul_(p)
    assert_close(
        out, _ref_linear(x, w, b) * p.detach().double(), torch.float32
    )
    out = gemsops.linear(x, w.requires_grad_(), b)
    assert out.grad_fn is not None
    out.detach_()
    assert out.grad_fn is None and not out.requires_grad


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64])
def test_bias_of_another_dtype_refused_before_the_product(dtype, device):
    # torch refuses the dtype mismatch (RuntimeError) before it would
    # compute a float64 or integer product, which gemsops has no kernel for
    a = torch.ones(3, 5, dtype=dtype, device=device)
    b = torch.ones(5, 4, dtype=dtype, device=device)
    bias = torch.ones(4, device=device)
    calls = {
        "addmm": (torch.addmm, gemsops.addmm, (bias, a, b)),
        "linear": (
            torch.nn.functional.linear,
            gemsops.linear,
            (a, b.t(), bias),
        ),
    }
    for name, (theirs, ours, args) in calls.items():
        assert raised_type(lambda: theirs(*args)) is RuntimeError
        # the type itself: NotImplementedError is a RuntimeError too
        assert raised_type(lambda: ours(*args)) is RuntimeError, name


def test_addmm_and_linear_refuse_as_torch(device):
    a, b = torch.randn(3, 5, device=device), torch.randn(5, 7, device=device)
    with pytest.raises(RuntimeError):
        gemsops.addmm(torch.randn(4, 7, device=device), a, b)
    with pytest.raises(RuntimeError):
        gemsops.addmm(torch.randn(7, device=device, dtype=torch.float64), a, b)
    with pytest.raises(TypeError):
        gemsops.addmm(1.0, a, b)
    with pytest.raises(RuntimeError):
        gemsops.linear(a, torch.randn(7, 4, device=device))
    with pytest.raises(RuntimeError):
        gemsops.linear(a, torch.randn(2, 7, 5, device=device))


@pytest.mark.parametrize("form", ["beta, input, alpha", "beta, input"])
def test_addmm_deprecated_positional_forms_as_torch(form, device):
    """torch's deprecated addmm(beta, input, alpha, mat1, mat2) and
    addmm(beta, input, mat1, mat2): the same sum, torch's warning, and
    out= kept; beta or alpha also given as a keyword, or a form torch has
    not, is torch's TypeError."""
    torch.manual_seed(2)
    inp = torch.randn(3, 7, device=device)
    a, b = torch.randn(3, 5, device=device), torch.randn(5, 7, device=device)
    beta, alpha = 0.5, -2.0
    args = (beta, inp, alpha, a, b) if form.endswith("alpha") else None
    if args is None:
        args, alpha = (beta, inp, a, b), 1
    ref = torch.addmm(
        inp.double(), a.double(), b.double(), beta=beta, alpha=alpha
    )
    with pytest.warns(UserWarning, match="addmm is deprecated"):
        out = gemsops.addmm(*args)
    assert_close(out, ref, torch.float32, chain_len=5)
    into = torch.full((3, 7), math.nan, device=device)
    with pytest.warns(UserWarning, match="addmm is deprecated"):
        assert gemsops.addmm(*args, out=into) is into
    assert_close(into, ref, torch.float32, chain_len=5)
    for bad_kw in ({"beta": 2.0}, {"alpha": 3.0}):
        with pytest.raises(TypeError):
            torch.addmm(*args, **bad_kw)
        with pytest.raises(TypeError, match="invalid combination"):
            gemsops.addmm(*args, **bad_kw)
    for bad in ((beta, inp, a), (beta, inp, a, b, b), (inp, a, b, None, b)):
        with pytest.raises(TypeError):
            torch.addmm(*bad)
        with pytest.raises(TypeError):
            gemsops.addmm(*bad)


@pytest.mark.parametrize(
    "value", [1j, 1e39, -1e300, 2**70, "2", None, math.inf, 100.0, True, 3]
)
@pytest.mark.parametrize("name", ["alpha", "beta"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_addmm_coefficients_as_torch(value, name, dtype, device):
    _coefficient_as_torch(value, name, dtype, device)


def _coefficient_as_torch(value, name, dtype, device):
    """torch's exception type for a refused coefficient; an accepted one
    against a float64 reference."""
    inp = torch.randn(7, dtype=dtype, device=device)
    a = torch.randn(3, 5, dtype=dtype, device=device)
    b = torch.randn(5, 7, dtype=dtype, device=device)
    kw = {name: value}
    expected = raised_type(lambda: torch.addmm(inp, a, b, **kw))
    if expected is not None:
        with pytest.raises(expected, match=name):
            gemsops.addmm(inp, a, b, **kw)
        return
    out = gemsops.addmm(inp, a, b, **kw)
    ref = torch.addmm(inp.double(), a.double(), b.double(), **kw)
    assert out.dtype == dtype
    assert_close(out, ref, dtype, chain_len=5)


@pytest.mark.parametrize("value", [1e-46, -(2.0**-150), 2.0**-149])
@pytest.mark.parametrize("name", ["alpha", "beta"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_addmm_coefficient_below_float32_unreads_its_term(
    value, name, dtype, device
):
    # half and fp32 products take a float coefficient (torch's): one that
    # rounds to 0 there leaves its term unread, NaNs and all, and the
    # least subnormal does not
    inp = torch.randn(7, dtype=dtype, device=device)
    a = torch.randn(3, 5, dtype=dtype, device=device)
    b = torch.randn(5, 7, dtype=dtype, device=device)
    (inp if name == "beta" else a)[0] = math.nan
    kw = {name: value}
    got = gemsops.addmm(inp, a, b, **kw)
    nan = torch.zeros(3, 7, dtype=torch.bool, device=device)
    if abs(value) >= 2.0**-149:  # input's column 0, or a's row 0
        if name == "beta":
            nan[:, 0] = True
        else:
            nan[0, :] = True
    assert torch.equal(got.isnan(), nan)
    if name == "beta":  # torch's rule too, on every device and dtype
        assert torch.equal(torch.addmm(inp, a, b, **kw).isnan(), nan)
    # (not torch's for alpha: its CPU half products spread the product's
    # NaN even at alpha = 0, and its CUDA fp32 product at alpha = 1e-46,
    # a double it does not skip and a float that is 0; gemsops follows
    # addmm's docstring)
    # float64 keeps the coefficient: its NaNs are where the float one is 0
    ref = torch.addmm(inp.double(), a.double(), b.double(), **kw)
    finite = ~nan & ~ref.isnan()
    assert_close(got[finite], ref[finite], dtype, chain_len=5)


@pytest.mark.parametrize("name", ["alpha", "beta"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_addmm_tensor_coefficient_below_float32_as_torch(name, dtype, device):
    # a 0-d float64 tensor is read as the number it holds: one that rounds
    # to 0 in the product's float leaves its term unread, as the number
    inp = torch.randn(7, dtype=dtype, device=device)
    a = torch.randn(3, 5, dtype=dtype, device=device)
    b = torch.randn(5, 7, dtype=dtype, device=device)
    (inp if name == "beta" else a)[0] = math.nan
    kw = {name: torch.tensor(1e-46, dtype=torch.float64, device=device)}
    got = gemsops.addmm(inp, a, b, **kw)
    assert not got.isnan().any()
    if name == "beta":
        assert not torch.addmm(inp, a, b, **kw).isnan().any()
    ref = torch.addmm(inp.double(), a.double(), b.double(), **{name: 0.0})
    assert_close(got, ref, dtype, chain_len=5)


@pytest.mark.parametrize("beta,alpha", [(0, 1), (1, 0), (0, 0)])
@pytest.mark.parametrize("bias_shape", [(4,), (3, 4)])
def test_addmm_zero_coefficient_times_nonfinite_grad_as_torch(
    beta, alpha, bias_shape, device
):
    # torch multiplies the gradients by beta and alpha: where the incoming
    # gradient is infinite or NaN a zero coefficient gives NaN, not 0
    def grads(fn):
        torch.manual_seed(3)
        inp = torch.randn(bias_shape, device=device, requires_grad=True)
        a = torch.randn(3, 5, device=device, requires_grad=True)
        b = torch.randn(5, 4, device=device, requires_grad=True)
        g = torch.randn(3, 4, device=device)
        g[0, 1], g[2, 3] = math.inf, math.nan
        fn(inp, a, b, beta=beta, alpha=alpha).backward(g)
        return inp.grad, a.grad, b.grad

    for ours, theirs in zip(grads(gemsops.addmm), grads(torch.addmm)):
        assert torch.equal(ours.isnan(), theirs.isnan())
        finite = ~theirs.isnan()
        torch.testing.assert_close(ours[finite], theirs[finite])


def test_addmm_out_partly_over_input_refused_as_torch(device):
    # torch refuses an out= that shares some of input's memory without
    # being input itself, element for element; out is input is fine
    a = torch.randn(4, 4, device=device)
    b = torch.randn(4, 4, device=device)
    for rows, cols in (
        (slice(0, 4), slice(2, 6)),  # overlapping rows
        (slice(0, 4), None),  # the same bytes, transposed
    ):
        for fn in (torch.addmm, gemsops.addmm):
            buf = torch.randn(10, 4, device=device)
            inp = buf[rows]
            out = buf[cols] if cols is not None else buf[rows].t()
            before = buf.clone()
            with pytest.raises(RuntimeError, match="single memory location"):
                fn(inp, a, b, out=out)
            assert torch.equal(buf, before)
    buf = torch.randn(4, 4, device=device)
    inp = buf.clone()
    got = gemsops.addmm(buf, a, b, out=buf)
    assert got is buf
    ref = torch.addmm(inp.double(), a.double(), b.double())
    assert_close(buf, ref, torch.float32, chain_len=4)


@pytest.mark.parametrize(
    "value",
    [
        1 + 0j,
        np.complex128(1 + 0j),
        np.bool_(True),
        np.float32(0.5),
        fractions.Fraction(1, 3),
        torch.tensor(2.0, requires_grad=True),
        2**63,
        2**64 - 1,
        2**64,
    ],
    ids=repr,
)
@pytest.mark.parametrize("name", ["alpha", "beta"])
def test_addmm_coefficient_kinds_as_torch(value, name, device):
    # the kinds of number torch's argument parser takes or refuses (fp32:
    # the largest ints overflow the half types in torch's result too)
    _coefficient_as_torch(value, name, torch.float32, device)


def test_addmm_alpha_scales_the_grads_after_the_products(device):
    # alpha on a half gradient first would overflow (alpha 1e5) or flush
    # to zero (alpha 1e-8) where torch's gradients are finite, nonzero
    for alpha, v in ((1e5, 1e-3), (1e-8, 100.0)):
        kw = dict(dtype=torch.float16, device=device)
        ours = [
            torch.full(s, v, **kw, requires_grad=True)
            for s in ((2, 3), (3, 2))
        ]
        theirs = [t.detach().clone().requires_grad_() for t in ours]
        zero = torch.zeros(2, 2, **kw)
        gemsops.addmm(zero, *ours, alpha=alpha).float().sum().backward()
        torch.addmm(zero, *theirs, alpha=alpha).float().sum().backward()
        for o, t in zip(ours, theirs):
            assert torch.isfinite(o.grad).all() and (o.grad != 0).all()
            torch.testing.assert_close(o.grad, t.grad, rtol=2e-3, atol=0)


def test_argument_names_in_type_errors_as_torch():
    a, b = torch.randn(3, 5), torch.randn(5, 7)
    cases = [
        (lambda: gemsops.mm(a, [1]), "'mat2'"),
        (lambda: gemsops.bmm(a[None], None), "'mat2'"),
        (lambda: gemsops.matmul(a, "x"), "'other'"),
        (
            lambda: gemsops.addmm(torch.randn(7), "x", b),
            "addmm(): argument 'mat1'",
        ),
        (
            lambda: gemsops.addmm(torch.randn(7), a, 2),
            "addmm(): argument 'mat2'",
        ),
        (lambda: gemsops.linear(None, b), "linear(): argument 'input'"),
    ]
    for call, words in cases:
        with pytest.raises(TypeError) as info:
            call()
        assert words in str(info.value)


def test_linear_0d_weight_refused_as_torch(device):
    x = torch.randn(3, 4, device=device)
    w, b = torch.tensor(1.0, device=device), torch.randn(5, device=device)
    with pytest.raises(RuntimeError):
        torch.nn.functional.linear(x, w, b)
    with pytest.raises(RuntimeError, match="weight"):
        gemsops.linear(x, w, b)


@pytest.mark.parametrize("beta", [0, 1, 0.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_addmm_alpha_zero_leaves_the_product_out(beta, dtype, device):
    # BLAS's rule, torch's addmm on CUDA: NaN and inf in mat1 or mat2 do
    # not reach the result when alpha == 0
    a = torch.randn(3, 5, dtype=dtype, device=device)
    a[1, 2], a[0, 0] = math.nan, math.inf
    b = torch.randn(5, 4, dtype=dtype, device=device)
    inp = torch.randn(4, dtype=dtype, device=device, requires_grad=True)
    out = gemsops.addmm(inp, a, b, beta=beta, alpha=0)
    ref = (beta * inp.detach().double()).expand(3, 4)
    assert out.shape == (3, 4) and out.dtype == dtype
    assert_close(out, ref, dtype)
    (gi,) = torch.autograd.grad(out.sum(), inp)
    want = torch.full((4,), 3.0 * beta, dtype=torch.float64, device=device)
    assert_close(gi, want, dtype)


@pytest.mark.parametrize("alpha", [0, 1, 0.5])
@pytest.mark.parametrize("grad", [True, False])
def test_addmm_beta_zero_result_takes_in_place_writes(alpha, grad, device):
    # the result is a tensor of its own, as torch's: written in place
    # before the backward, with or without autograd; input, not read, still
    # gets its gradient beta * g
    a = torch.randn(3, 5, device=device, requires_grad=grad)
    b = torch.randn(5, 4, device=device)
    inp = torch.full((3, 4), math.nan, device=device, requires_grad=grad)
    out = gemsops.addmm(inp, a, b, beta=0, alpha=alpha)
    out.mul_(2)
    ref = 2 * alpha * (a.detach().double() @ b.double())
    assert_close(out, ref, torch.float32)
    if grad:
        out.sum().backward()
        assert torch.equal(inp.grad, torch.zeros_like(inp))
        ones = torch.ones(3, 4, dtype=torch.float64, device=device)
        assert_close(a.grad, 2 * alpha * ones @ b.double().t(), torch.float32)


@pytest.mark.parametrize(
    "x_shape,w_shape,b_shape",
    [
        ((5,), (3, 5), (4, 3)),  # the bias would enlarge the output
        ((2, 5), (3, 5), (4, 2, 3)),
        ((5,), (3, 5), (2, 1, 3)),
        ((2, 5), (5,), (2,)),  # 2-D input: a 1-D weight takes no bias
        ((2, 5), (5,), ()),
    ],
)
def test_linear_bias_that_torch_refuses(x_shape, w_shape, b_shape, device):
    x, w, b = (
        torch.randn(s, device=device) for s in (x_shape, w_shape, b_shape)
    )
    F = torch.nn.functional
    expected = raised_type(lambda: F.linear(x, w, b))
    assert expected is RuntimeError  # the premise
    with pytest.raises(expected, match="linear"):
        gemsops.linear(x, w, b)


@pytest.mark.parametrize("b_shape", [(), (1,), (4,)])
@pytest.mark.parametrize("x_shape", [(5,), (2, 4, 5), (4, 2, 5)])
@pytest.mark.parametrize("contiguous", [True, False])
def test_linear_one_dim_weight_with_a_bias(x_shape, b_shape, contiguous):
    """A 1-D weight beside a bias: torch takes or refuses it by the input's
    rank and layout; gemsops does the same, with the same values."""
    torch.manual_seed(15)
    x = torch.randn(x_shape, dtype=torch.float64)
    if not contiguous and x.dim() == 3:
        x = x.transpose(0, 1)
    w, b = torch.randn(5, dtype=torch.float64), torch.randn(b_shape)
    F = torch.nn.functional
    try:
        want = F.linear(x, w, b.double())
    except RuntimeError:
        with pytest.raises(RuntimeError):
            gemsops.linear(x.float(), w.float(), b)
        return
    out = gemsops.linear(x.float(), w.float(), b)
    assert out.shape == want.shape
    assert_close(out, want, torch.float32, chain_len=5)


def test_linear_backward_of_operands_that_are_not_dense(device):
    """A weight or input with padded columns (a slice, transposed) gets
    its gradient through contiguous buffers, as torch's."""
    torch.manual_seed(6)
    padded_w = torch.randn(5, 4, device=device)[:, :3].t().requires_grad_()
    padded_x = torch.randn(5, 4, device=device)[:, :2].t().requires_grad_()
    x = torch.randn(2, 5, device=device, requires_grad=True)
    w = torch.randn(3, 5, device=device, requires_grad=True)
    for xi, wi in ((x, padded_w), (padded_x, w)):
        g = torch.randn(xi.shape[0], wi.shape[0], device=device)
        gemsops.linear(xi, wi).backward(g)
        want_x = g.double() @ wi.detach().double()
        want_w = g.double().t() @ xi.detach().double()
        assert_close(xi.grad, want_x, torch.float32, chain_len=3)
        assert_close(wi.grad, want_w, torch.float32, chain_len=2)


@pytest.mark.parametrize("x_shape", [(0,), (3, 0), (2, 3, 0)])
def test_linear_of_no_in_features_is_the_bias(x_shape):
    """k = 0 on the general path (here autocast): the product is zeros,
    the output the bias broadcast."""
    x, w, b = torch.randn(x_shape), torch.randn(4, 0), torch.randn(4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = (
            gemsops.linear(x, w, b),
            torch.nn.functional.linear(x, w, b),
        )
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(got, want)


def test_linear_bias_rounds_once_under_autocast_cpu():
    """The general path (autocast, traced code) adds the bias in the
    product's epilogue: eager's bits, one rounding."""
    torch.manual_seed(7)
    g = gemsops.nn.Linear(256, 64).bfloat16()
    x = torch.randn(3, 64, 256).bfloat16()
    want = g(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = g(x)
    assert torch.equal(got, want)


@pytest.mark.parametrize("b_shape", [(1, 3), (3,), (1,), ()])
def test_linear_bias_that_broadcasts(b_shape, device):
    x = torch.randn(5, dtype=torch.float64, device=device)
    w = torch.randn(3, 5, dtype=torch.float64, device=device)
    b = torch.randn(b_shape, dtype=torch.float64, device=device)
    ref = torch.nn.functional.linear(x, w, b)
    out = gemsops.linear(x.float(), w.float(), b.float())
    assert out.shape == ref.shape
    assert_close(out, ref, torch.float32, chain_len=5)


def test_linear_arguments_not_tensors_are_type_errors(device):
    x, w = torch.randn(2, 5, device=device), torch.randn(3, 5, device=device)
    F = torch.nn.functional
    for args in ((x, [[1.0] * 5] * 3), (x, None), (x, w, [1.0, 2.0, 3.0])):
        assert raised_type(lambda: F.linear(*args)) is TypeError
        with pytest.raises(TypeError, match="weight|bias"):
            gemsops.linear(*args)


def test_linear_under_autocast_cpu():
    x, lin = torch.randn(4, 16), torch.nn.Linear(16, 8)
    g = gemsops.nn.Linear(16, 8)
    g.load_state_dict(lin.state_dict())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        yt, yg = lin(x), g(x)
    assert yg.dtype == yt.dtype == torch.bfloat16
    assert_close(
        yg, _ref_linear(x, lin.weight, lin.bias), torch.bfloat16, chain_len=16
    )


@pytest.mark.parametrize("op", ["linear", "addmm"])
def test_half_product_past_the_max_that_the_bias_brings_back(op, device):
    # 256 * 128 + 255.875 * 128 = 65520 rounds to fp16's inf on its own;
    # with the bias (-80) the exact 65440 is an fp16 value: the bias must
    # be added before the product is rounded, as torch's addmm does
    x = torch.tensor([[256.0, 255.875]], dtype=torch.float16, device=device)
    w = torch.full((1, 2), 128.0, dtype=torch.float16, device=device)
    b = torch.tensor([-80.0], dtype=torch.float16, device=device)
    if op == "linear":
        out = gemsops.linear(x, w, b)
    else:
        out = gemsops.addmm(b, x, w.t())
    assert (x.double() @ w.double().t() + b.double()).item() == 65440.0
    assert out.item() == 65440.0


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "tokens,fan_in,fan_out", [(4096, 256, 768), (37, 200, 300), (1, 8, 8)]
)
def test_bias_gradient_beside_the_weight_gradient(
    tokens, fan_in, fan_out, dtype
):
    # nn.Linear on CUDA half types: the bias gradient comes from the weight
    # gradient's kernel (its column sums of grad); float64 references
    torch.manual_seed(1)
    lin = gemsops.nn.Linear(fan_in, fan_out, device="cuda", dtype=dtype)
    x = torch.randn(2, tokens, fan_in, device="cuda", dtype=dtype)
    x.requires_grad_(True)
    y = lin(x)
    g = torch.randn_like(y)
    y.backward(g)
    gd = g.double().reshape(-1, fan_out)
    n = gd.shape[0]
    assert_close(lin.bias.grad, gd.sum(0), dtype, chain_len=n)
    assert_close(
        lin.weight.grad,
        gd.t() @ x.detach().double().reshape(-1, fan_in),
        dtype,
        chain_len=n,
    )
    assert_close(
        x.grad, g.double() @ lin.weight.double(), dtype, chain_len=fan_out
    )
    # the same bits from a second backward
    first = [t.grad.clone() for t in (lin.bias, lin.weight, x)]
    for t in (lin.bias, lin.weight, x):
        t.grad = None
    lin(x).backward(g)
    for f, t in zip(first, (lin.bias, lin.weight, x)):
        assert torch.equal(f, t.grad)


@pytest.mark.cuda
def test_weight_gradient_is_offered_the_kept_buffers():
    """nn.Linear's weight gradient with its row sums (Stream-K, forced here)
    is offered its stream's kept workspace on the first _C call: once a
    backward has made them, it launches in one call, with the bits of the
    first backward's launch."""
    from gemsops.ops import linear as lin_module
    from gemsops.ops import matmul as mm_module
    from gemsops.ops.matmul import get_schedule

    torch.manual_seed(2)
    lin = gemsops.nn.Linear(256, 512, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(4, 1024, 256, device="cuda", dtype=torch.bfloat16)
    x.requires_grad_(True)
    g = torch.randn(4, 1024, 512, device="cuda", dtype=torch.bfloat16)
    before = get_schedule()
    gemsops.set_schedule("stream-k")
    real = lin_module._C
    calls = []

    class Counting:
        def __getattr__(self, name):
            return getattr(real, name)

        def linear_grad_weight(self, *args):
            need = real.linear_grad_weight(*args)
            if len(args) == 16:  # the products with row sums
                calls.append(need is None)
            return need

    try:
        mm_module._workspace.forget("mm_flags", x.get_device())
        mm_module._workspace.forget("mm_ws", x.get_device())
        lin_module._C = Counting()
        grads, per_backward = [], []
        for _ in range(2):
            for t in (x, lin.weight, lin.bias):
                t.grad = None
            calls.clear()
            lin(x).backward(g)
            grads.append([t.grad.clone() for t in (x, lin.weight, lin.bias)])
            per_backward.append(list(calls))
    finally:
        lin_module._C = real
        gemsops.set_schedule(**before)
    # the first may ask (no buffers kept, or dx's too small); then launch
    assert per_backward[0][-1] is True, per_backward
    assert per_backward[1] == [True], per_backward
    for first, second in zip(*grads):
        assert torch.equal(first, second)
    gd = g.double().reshape(-1, 512)
    assert_close(lin.bias.grad, gd.sum(0), torch.bfloat16, chain_len=4096)
    assert_close(
        lin.weight.grad,
        gd.t() @ x.detach().double().reshape(-1, 256),
        torch.bfloat16,
        chain_len=4096,
    )


@pytest.mark.cuda
def test_weight_gradient_captured_on_a_stream_with_kept_buffers():
    """Eager backwards on a stream keep its Stream-K buffers; a graph
    captured on that stream must not be offered them (each replay would
    reuse the captured epoch): its row-sum launch asks for fresh ones, and
    replays give the eager backward's bits."""
    from gemsops.ops import linear as lin_module
    from gemsops.ops.matmul import get_schedule

    torch.manual_seed(3)
    lin = gemsops.nn.Linear(256, 512, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(2048, 256, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(2048, 512, device="cuda", dtype=torch.bfloat16)
    before = get_schedule()
    gemsops.set_schedule("stream-k")
    real = lin_module._C
    offered = []  # the row-sum calls in the capture: workspace passed?

    class Recording:
        def __getattr__(self, name):
            return getattr(real, name)

        def linear_grad_weight(self, *args):
            if len(args) == 16:
                offered.append(args[7] is not None)
            return real.linear_grad_weight(*args)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side):
            for _ in range(2):  # eager, on the stream: buffers kept there
                lin.weight.grad = lin.bias.grad = None
                lin(x).backward(g)
        torch.cuda.synchronize()
        eager = (lin.weight.grad.clone(), lin.bias.grad.clone())
        lin.weight.grad = lin.bias.grad = None
        lin_module._C = Recording()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            lin(x).backward(g)
    finally:
        lin_module._C = real
        gemsops.set_schedule(**before)
    assert offered[:1] == [False], offered
    for _ in range(3):
        lin.weight.grad.fill_(float("nan"))
        lin.bias.grad.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(lin.weight.grad, eager[0])
        assert torch.equal(lin.bias.grad, eager[1])


@pytest.mark.parametrize(
    "alpha,beta",
    [(0, True), (False, 1), (True, False), ("t0", "tTrue"), ("tTrue", 0.5)],
)
def test_addmm_bool_coefficients_scale_as_0_or_1(alpha, beta, device):
    # torch.add refuses a bool alpha; addmm takes True and False as 1 and 0
    def value(v):
        if isinstance(v, str):
            return (
                torch.tensor(v == "tTrue") if v != "t0" else torch.tensor(0.0)
            )
        return v

    a = torch.randn(3, 5, device=device)
    b = torch.randn(5, 4, device=device)
    inp = torch.randn(3, 4, device=device)
    al, be = value(alpha), value(beta)
    out = gemsops.addmm(inp, a, b, alpha=al, beta=be)
    fa = float(al) if not isinstance(al, torch.Tensor) else float(al.item())
    fb = float(be) if not isinstance(be, torch.Tensor) else float(be.item())
    ref = fb * inp.double() + fa * (a.double() @ b.double())
    assert_close(out, ref, torch.float32, chain_len=5)


@pytest.mark.parametrize("alpha,beta", [(0, 1), (1, 0), (2.0, 0.5)])
def test_addmm_under_functorch_transforms(alpha, beta):
    """grad and vmap of addmm (alpha or beta 0 included) are torch's."""
    torch.manual_seed(16)
    c, a, b = torch.randn(3), torch.randn(4, 5), torch.randn(5, 3)

    def ours(a):
        return gemsops.addmm(c, a, b, alpha=alpha, beta=beta)

    def theirs(a):
        return torch.addmm(c, a, b, alpha=alpha, beta=beta)

    got = torch.func.grad(lambda a: ours(a).square().sum())(a)
    want = torch.func.grad(lambda a: theirs(a).square().sum())(a)
    torch.testing.assert_close(got, want)
    got = torch.func.vmap(ours)(a.expand(2, 4, 5))
    torch.testing.assert_close(got, theirs(a).expand(2, 4, 3))


def test_addmm_compiled_with_alpha_an_argument():
    """A compiled function's alpha (a symbolic number under dynamic=True)
    passes addmm's coefficient check."""
    torch.manual_seed(17)
    c, a, b = torch.randn(3), torch.randn(4, 5), torch.randn(5, 3)
    torch._dynamo.reset()
    f = torch.compile(
        lambda c, a, b, alpha: gemsops.addmm(c, a, b, alpha=alpha),
        fullgraph=True,
        dynamic=True,
    )
    for alpha in (2.0, 3.0):
        want = torch.addmm(c.double(), a.double(), b.double(), alpha=alpha)
        assert_close(f(c, a, b, alpha), want, torch.float32, chain_len=5)


def _saved_storages(fn, *args):
    """The storages autograd keeps for fn's backward."""
    kept = []

    def pack(t):
        kept.append(t.untyped_storage().data_ptr())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return sorted(kept)


@pytest.mark.parametrize("need", range(1, 8))
def test_products_save_what_torch_saves(need):
    # a frozen weight keeps no activation alive, as in torch
    wants = [bool(need & 1), bool(need & 2), bool(need & 4)]
    x2 = torch.randn(4, 8, requires_grad=wants[0])
    x3 = torch.randn(2, 4, 8, requires_grad=wants[0])
    w = torch.randn(5, 8, requires_grad=wants[1])
    m2 = torch.randn(8, 5, requires_grad=wants[1])
    b = torch.randn(5, requires_grad=wants[2])
    pairs = [
        (gemsops.linear, torch.nn.functional.linear, (x2, w, b)),
        (gemsops.linear, torch.nn.functional.linear, (x3, w, b)),
        (gemsops.addmm, torch.addmm, (b, x2, m2)),
        (gemsops.mm, torch.mm, (x2, m2)),
        (gemsops.matmul, torch.matmul, (x3, m2)),
    ]
    for ours, theirs, args in pairs:
        assert _saved_storages(ours, *args) == _saved_storages(theirs, *args)


def test_unsaved_operands_may_change_or_be_inference_tensors():
    with torch.inference_mode():
        x, w = torch.randn(3, 4), torch.randn(5, 4)
    b = torch.zeros(5, requires_grad=True)
    for fn in (gemsops.linear, lambda x, w, b: gemsops.addmm(b, x, w.t())):
        fn(x, w, b).sum().backward()
        assert torch.equal(b.grad, torch.full((5,), 3.0))
        b.grad = None
    a = torch.randn(3, 4, requires_grad=True)
    m = torch.randn(4, 5)
    h = a * 1
    y = gemsops.mm(h, m)
    with torch.no_grad():
        h.add_(1)  # not read by a's gradient
    y.sum().backward()
    torch.testing.assert_close(a.grad, m.sum(1).expand(3, 4))


def test_frozen_weight_with_transposed_batched_input():
    # x's gradient without x saved: an N-D x folds into rows, whatever
    # its layout
    x = torch.randn(2, 5, 3).transpose(1, 2).requires_grad_()
    w, b = torch.randn(4, 5), torch.randn(4, requires_grad=True)
    g = torch.randn(2, 3, 4)  # folds into rows as it is
    for bias in (None, b):
        got = torch.autograd.grad(gemsops.linear(x, w, bias), x, g)[0]
        want = torch.autograd.grad(
            torch.nn.functional.linear(x, w, bias), x, g
        )[0]
        torch.testing.assert_close(got, want)


def test_refusals_name_the_function_called():
    # the product inside is gemsops' matmul; a refusal names what was called
    x, w = (torch.randn(*s, dtype=torch.float64) for s in ((3, 4), (5, 4)))
    with pytest.raises(NotImplementedError, match=r"^linear\(\).*float64"):
        gemsops.linear(x, w)
    i, j, c = (
        torch.ones(*s, dtype=torch.int64) for s in ((3, 4), (4, 5), (3, 5))
    )
    with pytest.raises(NotImplementedError, match=r"^addmm\(\).*int64"):
        gemsops.addmm(c, i, j)
    with pytest.raises(RuntimeError, match=r"^linear\(\).*same dtype"):
        gemsops.linear(x.float(), w)


def test_addmm_out_holding_a_broadcast_input(device):
    # torch compares out with the input as the product's shape: a row or
    # an element of out broadcast as the input is not dense there, and
    # not refused (it was: "refer to a single memory location")
    a = torch.randn(3, 5, device=device)
    b = torch.randn(5, 4, device=device)
    for pick in (lambda o: o[0], lambda o: o.view(-1)[5], lambda o: o[:, :1]):
        outs = []
        for fn in (torch.addmm, gemsops.addmm):
            o = torch.arange(12.0, device=device).view(3, 4)
            assert fn(pick(o), a, b, out=o) is o
            outs.append(o)
        assert_close(outs[1], outs[0], torch.float32, chain_len=5)


def test_linear_of_a_non_folding_input_changed_in_place_after(device):
    # its rows are a copy (torch's reshape): an in-place write to the input
    # after the call is no error for the backward, and the gradients are
    # torch's
    grads = []
    for fn in (torch.nn.functional.linear, gemsops.linear):
        torch.manual_seed(6)
        x = torch.randn(3, 2, 5, device=device, requires_grad=True)
        w = torch.randn(4, 5, device=device, requires_grad=True)
        xx = x * 1
        y = fn(xx.transpose(0, 1), w)
        xx.add_(1)
        y.pow(2).sum().backward()
        grads.append((x.grad, w.grad))
    for g, t in zip(*grads):
        assert_close(g, t, torch.float32, chain_len=8)


@pytest.mark.parametrize("alpha", [float("inf"), float("nan"), 2.0])
def test_addmm_of_an_empty_sum_leaves_alpha_out(alpha, device):
    # k = 0: torch skips the empty product, so an infinite or NaN alpha
    # makes no NaN (0 * alpha did)
    i = torch.randn(2, 3, device=device)
    a, b = torch.randn(2, 0, device=device), torch.randn(0, 3, device=device)
    want = torch.addmm(i, a, b, alpha=alpha, beta=0.5)
    got = gemsops.addmm(i, a, b, alpha=alpha, beta=0.5)
    assert torch.equal(got, want)
    # and torch.addmm under the global mode (its own kernel took 0 * alpha)
    with gemsops.use_gemsops(devices=("cpu", "cuda")):
        got = torch.addmm(i, a, b, alpha=alpha, beta=0.5)
    assert torch.equal(got, want)


@pytest.mark.parametrize("bias", [True, False])
def test_linear_out_as_torch(bias, device):
    # F.linear takes out= (aten's linear.out): written in place, resized
    # from another shape, refused under autograd and for another dtype
    x = torch.randn(2, 3, 8, device=device)
    w = torch.randn(5, 8, device=device)
    b = torch.randn(5, device=device) if bias else None
    want = F.linear(x, w, b)
    out = torch.full((2, 3, 5), float("nan"), device=device)
    assert gemsops.linear(x, w, b, out=out) is out
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    empty = torch.empty(0, device=device)
    gemsops.linear(x, w, b, out=empty)
    assert empty.shape == want.shape
    torch.testing.assert_close(empty, want, rtol=1e-5, atol=1e-5)
    with pytest.warns(UserWarning, match="An output with one or more"):
        gemsops.linear(x, w, b, out=torch.empty(3, device=device))
    assert gemsops.linear(x, w, b, out=None).shape == want.shape
    wrong = torch.empty(2, 3, 5, dtype=torch.float64, device=device)
    for args in ((x.requires_grad_(), w, b, out), (x.detach(), w, b, wrong)):
        with pytest.raises(RuntimeError):
            F.linear(*args[:3], out=args[3])
        with pytest.raises(RuntimeError):
            gemsops.linear(*args[:3], out=args[3])
