"""Second-order gradients (create_graph=True): gradgradcheck in float64 on
the CPU and on CUDA, through the eager path and through the ops; matmul,
which has no float64 kernel, against torch's own second-order gradients in
float32."""

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

import gemsops

ops = torch.ops.gemsops


def f64(*shape, zeros=(), device="cpu"):
    t = torch.randn(*shape, dtype=torch.float64)
    for idx in zeros:
        t[idx] = 0
    return t.to(device).requires_grad_()


@pytest.mark.parametrize(
    "shape, ns",
    [
        ((4, 7), (7,)),
        ((2, 3, 5), (5,)),
        ((2, 3, 4), (3, 4)),
        ((5,), (5,)),  # no leading dims: dW and dB sum over no rows
        ((5, 1), (5, 1)),
    ],
)
@pytest.mark.parametrize("affine", ["wb", "w", "none"])
def test_layer_norm_gradgrad(shape, ns, affine, device):
    torch.manual_seed(0)
    x = f64(*shape, device=device)
    w = f64(*ns, device=device) if affine in ("wb", "w") else None
    b = f64(*ns, device=device) if affine == "wb" else None
    args = tuple(t for t in (x, w, b) if t is not None)

    def f(*a):
        it = iter(a[1:])
        wa = next(it) if w is not None else None
        ba = next(it) if b is not None else None
        return gemsops.layer_norm(a[0], ns, wa, ba, 1e-3)

    assert gradcheck(f, args)
    assert gradgradcheck(f, args)


def test_layer_norm_op_gradgrad_with_grad_out_depending_on_x(device):
    torch.manual_seed(1)
    x, w, b = (
        f64(3, 6, device=device),
        f64(6, device=device),
        f64(6, device=device),
    )
    f = lambda x, w, b: ops.layer_norm(x, [6], w, b, 1e-5)[0]  # noqa: E731
    assert gradgradcheck(f, (x, w, b))
    # grad_out a function of x too (no path counted twice), against torch
    got = []
    for fn in (
        f,
        lambda x, w, b: gemsops.layer_norm(x, (6,), w, b, 1e-5),
        lambda x, w, b: torch.nn.functional.layer_norm(x, (6,), w, b, 1e-5),
    ):
        y = fn(x, w, b)
        (g,) = torch.autograd.grad(y.sin().sum(), x, create_graph=True)
        gg = torch.autograd.grad(g.square().sum(), (x, w))
        got.append((g,) + gg)
    for mine in got[:2]:
        for a, r in zip(mine, got[2]):
            torch.testing.assert_close(a, r)


def test_layer_norm_backward_function_gradgrad():
    torch.manual_seed(2)
    x, w, g = f64(3, 5), f64(5), f64(3, 5)
    _, mean, rstd = torch.native_layer_norm(
        x.detach(), (5,), w.detach(), None, 1e-5
    )

    def f(g, x, w):
        return gemsops.layer_norm_backward(
            g, x, (5,), mean, rstd, w, None, (True, True, False)
        )[:2]

    # mean/rstd are functions of x: the composite recomputes them, so the
    # derivative is that of torch's native_layer_norm_backward chain
    want = torch.autograd.grad(
        torch.ops.aten.native_layer_norm_backward(
            g,
            x,
            (5,),
            *torch.native_layer_norm(x, (5,), w, None, 1e-5)[1:],
            w,
            None,
            (True, True, False),
        )[0].sum(),
        (g, w),
    )
    got = torch.autograd.grad(f(g, x, w)[0].sum(), (g, w))
    for a, r in zip(got, want):
        torch.testing.assert_close(a, r)


@pytest.mark.parametrize("dim", [None, 0, 1, -1])
@pytest.mark.parametrize(
    "zeros", [(), ((0, 1),), ((0, 1), (2, 2)), ((0, 1), (0, 2))]
)
def test_prod_gradgrad(dim, zeros, device):
    torch.manual_seed(3)
    x = f64(3, 4, zeros=zeros, device=device)
    f = (
        (lambda x: gemsops.prod(x))
        if dim is None
        else (lambda x: gemsops.prod(x, dim, keepdim=True))
    )
    assert gradcheck(f, (x,))
    assert gradgradcheck(f, (x,))


@pytest.mark.parametrize("dim", [(), (0,), (-1,)])
def test_prod_of_0d_input_second_order_as_torch(dim, device):
    # torch's gradient of a 0-d product is grad itself, with no graph back
    # to the input: a second order raises there, and so here
    x = torch.randn((), dtype=torch.float64, device=device) + 2
    for fn in (torch.prod, gemsops.prod):
        x_ = x.clone().requires_grad_()
        y = fn(x_, *dim)
        assert y.dim() == 0 and y.item() == x.item()
        (g,) = torch.autograd.grad(y * 3, x_, create_graph=True)
        assert g.item() == 3 and not g.requires_grad
        with pytest.raises(RuntimeError, match="does not require grad"):
            torch.autograd.grad(g, x_)


def test_prod_op_gradgrad(device):
    x = f64(2, 3, 4, zeros=((0, 1, 2),), device=device)
    assert gradgradcheck(lambda x: ops.prod(x, 1), (x,))
    assert gradgradcheck(lambda x: ops.prod(x, None), (x,))


def _second_order(fn, a, b):
    y = fn(a, b)
    ga, gb = torch.autograd.grad(y.square().sum(), (a, b), create_graph=True)
    return torch.autograd.grad((ga.sin().sum() + gb.cos().sum()), (a, b))


@pytest.mark.parametrize(
    "sa, sb",
    [
        ((4, 5), (5, 3)),
        ((2, 4, 5), (2, 5, 3)),
        ((3, 4, 5), (5,)),
        ((5,), (2, 5, 3)),
    ],
)
def test_matmul_second_order_matches_torch(sa, sb, device):
    """gemsops has no float64 matmul: compare with torch's second order
    gradients in float32 instead (and gradgradcheck with float32 steps;
    a bilinear map's finite differences are exact up to rounding)."""
    torch.manual_seed(4)
    a = torch.randn(*sa, device=device, requires_grad=True)
    b = torch.randn(*sb, device=device, requires_grad=True)
    got = _second_order(gemsops.matmul, a, b)
    want = _second_order(torch.matmul, a, b)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    assert gradgradcheck(
        gemsops.matmul, (a, b), eps=1e-2, atol=5e-2, rtol=5e-2
    )


def _second_order_linear(fn, x, w, b):
    y = fn(x, w, b)
    gx, gw, gb = torch.autograd.grad(
        (y.square() * y.detach().sign()).sum(), (x, w, b), create_graph=True
    )
    s = gx.sin().sum() + gw.cos().sum() + gb.square().sum()
    return torch.autograd.grad(s, (x, w, b))


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("sx", [(4, 5), (2, 3, 5)])
def test_linear_second_order_matches_torch(sx, bias, device):
    """gemsops.linear (its own Function, LinearFunction): the second order
    gradients of input, weight and bias as torch's, and gradgradcheck in
    float32 (see above)."""
    torch.manual_seed(5)
    x = torch.randn(*sx, device=device, requires_grad=True)
    w = torch.randn(3, 5, device=device, requires_grad=True)
    b = torch.randn(3, device=device, requires_grad=True)
    if not bias:
        b = torch.zeros(3, device=device, requires_grad=True)

        def fn(x, w, b):  # b stays out of the product; its grads are 0
            return gemsops.linear(x, w) + 0 * b

        def ref_fn(x, w, b):
            return torch.nn.functional.linear(x, w) + 0 * b
    else:
        fn, ref_fn = gemsops.linear, torch.nn.functional.linear
    got = _second_order_linear(fn, x, w, b)
    want = _second_order_linear(ref_fn, x, w, b)
    for g, ref in zip(got, want):
        torch.testing.assert_close(g, ref, rtol=1e-4, atol=1e-4)
    assert gradgradcheck(fn, (x, w, b), eps=1e-2, atol=5e-2, rtol=5e-2)


def test_mm_bmm_ops_gradgrad_float32():
    a = torch.randn(3, 4, requires_grad=True)
    b = torch.randn(4, 2, requires_grad=True)
    assert gradgradcheck(ops.mm, (a, b), eps=1e-2, atol=5e-2, rtol=5e-2)
    a3 = torch.randn(2, 3, 4, requires_grad=True)
    b3 = torch.randn(2, 4, 2, requires_grad=True)
    assert gradgradcheck(ops.bmm, (a3, b3), eps=1e-2, atol=5e-2, rtol=5e-2)


def test_mm_float64_refuses_loudly():
    a = torch.randn(2, 2, dtype=torch.float64, requires_grad=True)
    with pytest.raises(NotImplementedError):
        gemsops.mm(a, a)


@pytest.mark.parametrize("affine", [False, True])
def test_layer_norm_third_order_raises(affine, device):
    # second order through the composite vjp is right; a third would not
    # be, so it must raise rather than return a value
    x = torch.randn(
        3, 5, dtype=torch.float64, device=device, requires_grad=True
    )
    w = (
        torch.randn(5, dtype=torch.float64, device=device, requires_grad=True)
        if affine
        else None
    )
    y = gemsops.layer_norm(x, (5,), w)
    (g1,) = torch.autograd.grad((y**3).sum(), x, create_graph=True)
    (g2,) = torch.autograd.grad((g1**2).sum(), x, create_graph=True)
    yt = torch.nn.functional.layer_norm(x, (5,), w)
    (t1,) = torch.autograd.grad((yt**3).sum(), x, create_graph=True)
    (t2,) = torch.autograd.grad((t1**2).sum(), x, create_graph=True)
    torch.testing.assert_close(g2, t2, rtol=1e-9, atol=1e-9)
    with pytest.raises(RuntimeError, match="layer_norm: third"):
        torch.autograd.grad((g2**2).sum(), x)


def test_rms_norm_third_order_raises_naming_it(device):
    x = torch.randn(
        3, 5, dtype=torch.float64, device=device, requires_grad=True
    )
    y = gemsops.rms_norm(x, (5,))
    (g1,) = torch.autograd.grad((y**3).sum(), x, create_graph=True)
    (g2,) = torch.autograd.grad((g1**2).sum(), x, create_graph=True)
    yt = torch.nn.functional.rms_norm(x, (5,))
    (t1,) = torch.autograd.grad((yt**3).sum(), x, create_graph=True)
    (t2,) = torch.autograd.grad((t1**2).sum(), x, create_graph=True)
    torch.testing.assert_close(g2, t2, rtol=1e-9, atol=1e-9)
    with pytest.raises(RuntimeError, match="rms_norm: third"):
        torch.autograd.grad((g2**2).sum(), x)


@pytest.mark.parametrize("op", ["rms", "add_ln", "add_rms"])
def test_norms_gradgrad_without_leading_dims(op, device):
    torch.manual_seed(10)
    x, r, w = (f64(6, device=device) for _ in range(3))

    def f(x, r, w):
        if op == "rms":
            return gemsops.rms_norm(x + r, (6,), w, 1e-3)
        fn = gemsops.fused_add_rms_norm if op == "add_rms" else None
        if fn is None:
            return gemsops.fused_add_layer_norm(x, r, (6,), w, None, 1e-3)
        return fn(x, r, (6,), w, 1e-3)

    assert gradgradcheck(f, (x, r, w))


def test_layer_norm_backward_under_jvp_without_leading_dims():
    """dW and dB of a row with no leading dims keep the row's shape under
    forward-mode AD (the torch-ops backward)."""
    torch.manual_seed(11)
    x, w, b, g = (torch.randn(5, dtype=torch.float64) for _ in range(4))
    _, mean, rstd = torch.native_layer_norm(x, (5,), w, b, 1e-5)

    def bwd(g):
        return gemsops.layer_norm_backward(g, x, (5,), mean, rstd, w, b)

    primal, tangent = torch.func.jvp(bwd, (g,), (g,))
    want = torch.ops.aten.native_layer_norm_backward(
        g, x, (5,), mean, rstd, w, b, (True, True, True)
    )
    for got, ref in zip(primal, want):
        assert got.shape == ref.shape
        torch.testing.assert_close(got, ref)
    assert tangent[1].shape == (5,) and tangent[2].shape == (5,)
    # linear in g: the tangent at g is the value at g
    torch.testing.assert_close(tangent[2], want[2])


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm", "add_ln", "add_rms"])
@pytest.mark.parametrize("shape, ns", [((3, 0), (0,)), ((2, 0, 4), (0, 4))])
def test_norm_second_order_over_empty_rows_as_torch(op, shape, ns, device):
    # rows of no elements: the first-order gradient is empty, and so is the
    # second (torch's), not a refusal from the vjp of nothing
    x = f64(*shape, device=device)
    w = f64(*ns, device=device)
    ours = {
        "layer_norm": lambda x, w: gemsops.layer_norm(x, ns, w),
        "rms_norm": lambda x, w: gemsops.rms_norm(x, ns, w),
        "add_ln": lambda x, w: gemsops.fused_add_layer_norm(x, x, ns, w)[0],
        "add_rms": lambda x, w: gemsops.fused_add_rms_norm(x, x, ns, w)[0],
    }[op]
    gx, gw = torch.autograd.grad(ours(x, w).sum(), (x, w), create_graph=True)
    assert gx.shape == x.shape and gw.shape == w.shape
    second = torch.autograd.grad(
        gx.sum() + gw.sum(), (x, w), allow_unused=True
    )
    for s, t in zip(second, (x, w)):
        assert s is None or (s.shape == t.shape and s.numel() == 0)


NORMS_WITH_TORCH = {
    "layer_norm": (
        lambda x, ns, w: gemsops.layer_norm(x, ns, w),
        lambda x, ns, w: torch.nn.functional.layer_norm(x, ns, w),
    ),
    "rms_norm": (
        lambda x, ns, w: gemsops.rms_norm(x, ns, w),
        lambda x, ns, w: torch.nn.functional.rms_norm(x, ns, w),
    ),
    "add_ln": (
        lambda x, ns, w: gemsops.fused_add_layer_norm(x, x, ns, w)[0],
        lambda x, ns, w: torch.nn.functional.layer_norm(x + x, ns, w),
    ),
    "add_rms": (
        lambda x, ns, w: gemsops.fused_add_rms_norm(x, x, ns, w)[0],
        lambda x, ns, w: torch.nn.functional.rms_norm(x + x, ns, w),
    ),
}


@pytest.mark.parametrize("op", list(NORMS_WITH_TORCH))
def test_norm_weight_unused_in_second_order_as_torch(op, device):
    # dW is free of W: the second order of dW alone leaves W unused, which
    # torch.autograd.grad reports (an error, or None with allow_unused),
    # where x is used and gets a gradient
    torch.manual_seed(0)
    x = f64(3, 5, device=device)
    w = f64(5, device=device)
    cot = torch.randn(3, 5, dtype=torch.float64, device=device)
    results = []
    for fn in NORMS_WITH_TORCH[op]:
        _, gw = torch.autograd.grad(
            (fn(x, (5,), w) * cot).sum(), (x, w), create_graph=True
        )
        with pytest.raises(RuntimeError, match="not have been used"):
            torch.autograd.grad(gw.sum(), w, retain_graph=True)
        results.append(
            torch.autograd.grad(gw.sum(), (x, w), allow_unused=True)
        )
    (ours_x, ours_w), (ref_x, ref_w) = results
    assert ours_w is None and ref_w is None
    torch.testing.assert_close(ours_x, ref_x)
