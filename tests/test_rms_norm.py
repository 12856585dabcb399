"""RMSNorm forward and fused backward against float64 references, on the
CPU and on CUDA (tests taking `device`); the op registrations, second
order and the nn module."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import gradcheck, gradgradcheck

import gemsops
from gemsops.testing import assert_close, rms_norm_reference

FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# (input shape, normalized dims): the LayerNorm suite's kernel paths
SHAPES = [
    ((200, 36), 1),
    ((4096, 100), 1),
    ((1, 40999), 1),
    ((8, 128, 768), 1),
    ((2, 3, 4, 5), 2),
    ((37, 1), 1),
    ((6, 12288), 1),
    ((5, 20001), 1),
    ((70000, 16), 1),
    ((4, 65536), 1),
    ((2, 73733), 1),  # CPU: in chunks of columns
    ((3, 65533), 1),
]


def make(shape, nd, dtype, device, weight="same", requires_grad=False):
    x = torch.randn(shape, dtype=dtype, device=device) * 2 + 0.5
    pshape = shape[len(shape) - nd :]
    w = None
    if weight != "none":
        wd = torch.float32 if weight == "fp32" else dtype
        w = torch.randn(pshape, dtype=wd, device=device)
    for t in (x, w):
        if t is not None:
            t.requires_grad_(requires_grad)
    return x, pshape, w


def torch_rms_norm(x, pshape, w, eps=1e-6):
    if w is not None and w.dtype != x.dtype:
        return None  # torch refuses mixed dtypes
    return F.rms_norm(x, pshape, w, eps)


def rows_of(x, nd):
    return x.numel() // max(1, x.shape[x.dim() - nd :].numel())


@pytest.mark.parametrize("shape,nd", SHAPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_forward(shape, nd, dtype, device):
    x, pshape, w = make(shape, nd, dtype, device)
    out = gemsops.rms_norm(x, pshape, w, 1e-6)
    assert out.dtype == dtype and out.shape == x.shape
    assert_close(
        out,
        rms_norm_reference(x, pshape, w),
        dtype,
        torch_out=torch_rms_norm(x, pshape, w),
    )


@pytest.mark.parametrize("shape,nd", SHAPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_backward(shape, nd, dtype, device):
    x, pshape, w = make(shape, nd, dtype, device, requires_grad=True)
    g = torch.randn(shape, dtype=dtype, device=device)
    gemsops.rms_norm(x, pshape, w, 1e-6).backward(g)
    leaves = [t.detach().double().requires_grad_() for t in (x, w)]
    rms_norm_reference(leaves[0], pshape, leaves[1]).backward(g.double())
    tl = [t.detach().clone().requires_grad_() for t in (x, w)]
    F.rms_norm(tl[0], pshape, tl[1], 1e-6).backward(g)
    rows = rows_of(x, nd)
    # Over one element dx = g w eps / (x^2 + eps)^1.5 is the difference of
    # two terms of size |g w| rstd that agree to eps / x^2: any float32
    # evaluation keeps about an ulp of those terms, and which of two such
    # evaluations lands nearer the reference is chance (in a float32
    # simulation of both orders over 300 seeds, ours lost to torch's by
    # more than the slack on a quarter of them). The elementwise
    # tolerance still holds there; torch's error is the bar elsewhere.
    one = x.shape[x.dim() - nd :].numel() == 1
    for name, t, leaf, theirs in zip(("dx", "dw"), (x, w), leaves, tl):
        assert t.grad is not None and t.grad.dtype == dtype, name
        assert_close(
            t.grad,
            leaf.grad,
            dtype,
            torch_out=None if one and name == "dx" else theirs.grad,
            name=name,
            reduce_len=rows if name == "dw" else 1,
        )


@pytest.mark.parametrize("weight", ["none", "same", "fp32"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weight_variants(weight, dtype, device):
    if weight == "fp32" and dtype != torch.bfloat16:
        pytest.skip("fp32 weights are the mixed-precision case")
    x, pshape, w = make((513, 768), 1, dtype, device, weight, True)
    g = torch.randn_like(x)
    out = gemsops.rms_norm(x, pshape, w, 1e-6)
    assert out.dtype == dtype
    assert_close(out, rms_norm_reference(x, pshape, w), dtype)
    out.backward(g)
    leaves = [
        None if t is None else t.detach().double().requires_grad_()
        for t in (x, w)
    ]
    rms_norm_reference(leaves[0], pshape, leaves[1]).backward(g.double())
    assert_close(x.grad, leaves[0].grad, dtype, name="dx")
    if w is not None:
        assert w.grad.dtype == w.dtype
        assert_close(
            w.grad, leaves[1].grad, w.dtype, name="dw", reduce_len=513
        )


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + [torch.float64])
def test_default_eps_is_torchs(dtype, device):
    # rows small enough that eps shows: torch takes the eps of the type it
    # computes in (float32 for the half types), not the input's; torch's
    # own output against the same reference says which eps it used
    x = torch.randn(16, 64, dtype=dtype, device=device) * 1e-3
    half = dtype in (torch.float16, torch.bfloat16)
    eps = torch.finfo(torch.float32 if half else dtype).eps
    ref = rms_norm_reference(x, (64,), eps=eps)
    assert_close(F.rms_norm(x, (64,)), ref, dtype, name="torch")
    assert_close(gemsops.rms_norm(x, (64,)), ref, dtype)
    m = gemsops.nn.RMSNorm(64, device=device, dtype=dtype)
    assert m.eps is None
    assert_close(m(x), rms_norm_reference(x, (64,), m.weight, eps=eps), dtype)


@pytest.mark.parametrize("cols", [16, 40999])  # registers, looped
def test_non_finite_rows_follow_the_formula(cols, device):
    """A row holding inf is x / inf: NaN at the inf, 0 elsewhere (torch's
    CPU composite and its aligned CUDA kernel; another of its CUDA kernels
    gives NaN across the row); a NaN spreads over its row."""
    x = torch.randn(3, cols, dtype=torch.float16, device=device)
    x[0, 5] = float("inf")
    x[1, 7] = float("nan")
    w = torch.randn(cols, dtype=torch.float16, device=device)
    ours = gemsops.rms_norm(x, (cols,), w, 1e-3).cpu()
    ref = F.rms_norm(x.cpu().double(), (cols,), w.cpu().double(), 1e-3)
    assert torch.equal(ours.isnan(), ref.isnan())
    assert ours.isnan()[1].all() and ours.isnan()[0].sum() == 1
    assert torch.equal(ours[0].nan_to_num(), torch.zeros_like(ours[0]))
    assert torch.isfinite(ours[2]).all()


def test_gradcheck_and_second_order(device):
    torch.manual_seed(2)
    kw = dict(dtype=torch.float64, device=device, requires_grad=True)
    x, w = torch.randn(3, 4, 6, **kw), torch.randn(4, 6, **kw)

    def f(x, w):
        return gemsops.rms_norm(x, (4, 6), w, 1e-3)

    assert gradcheck(f, (x, w))
    assert gradgradcheck(f, (x, w))
    assert gradgradcheck(lambda x: gemsops.rms_norm(x, (6,), None, 1e-3), (x,))
    op = torch.ops.gemsops.rms_norm
    assert gradgradcheck(lambda x, w: op(x, [4, 6], w, 1e-3)[0], (x, w))
    (g1,) = torch.autograd.grad((f(x, w) ** 3).sum(), x, create_graph=True)
    (g2,) = torch.autograd.grad((g1**2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="third"):
        torch.autograd.grad((g2**2).sum(), x)


def test_module_drops_in(device):
    torch.manual_seed(3)
    theirs = torch.nn.RMSNorm((4, 32), eps=1e-5, device=device)
    ours = gemsops.nn.RMSNorm((4, 32), eps=1e-5, device=device)
    assert isinstance(ours, torch.nn.RMSNorm)
    with torch.no_grad():
        theirs.weight.normal_()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(5, 4, 32, device=device)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)
    plain = gemsops.nn.RMSNorm(32, elementwise_affine=False, device=device)
    assert plain.weight is None
    assert_close(
        plain(x),
        rms_norm_reference(x, (32,), eps=torch.finfo().eps),
        torch.float32,
    )


def test_deterministic_dw_repeats(device):
    x, pshape, w = make((4096, 256), 1, torch.float32, device, "same", True)
    g = torch.randn_like(x)
    grads = []
    torch.use_deterministic_algorithms(True)
    try:
        for _ in range(2):
            w.grad = None
            gemsops.rms_norm(x, pshape, w).backward(g)
            grads.append(w.grad.clone())
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.equal(grads[0], grads[1])


def test_empty(device):
    x = torch.randn(0, 8, device=device, requires_grad=True)
    w = torch.randn(8, device=device, requires_grad=True)
    out = gemsops.rms_norm(x, (8,), w)
    assert out.shape == (0, 8)
    out.sum().backward()
    assert torch.equal(w.grad, torch.zeros_like(w))


def test_opcheck_and_compile(device):
    torch.manual_seed(4)
    x = torch.randn(6, 10, device=device, requires_grad=True)
    w = torch.randn(10, device=device, requires_grad=True)
    torch.library.opcheck(
        torch.ops.gemsops.rms_norm.default, (x, [10], w, 1e-5)
    )
    torch.library.opcheck(
        torch.ops.gemsops.rms_norm.default,
        (x.detach().bfloat16(), [10], None, 1e-5),
    )
    torch._dynamo.reset()
    f = torch.compile(
        lambda x, w: gemsops.rms_norm(x, (10,), w).square().sum(),
        fullgraph=True,
        backend="aot_eager",
    )
    got = torch.autograd.grad(f(x, w), (x, w))
    want = torch.autograd.grad(
        F.rms_norm(x, (10,), w, torch.finfo().eps).square().sum(), (x, w)
    )
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "eps", [True, 0, torch.tensor(1e-3), torch.tensor(2, dtype=torch.int64)]
)
def test_eps_takes_what_torch_takes(eps, device):
    x = torch.randn(4, 8, dtype=torch.float64, device=device)
    ref = torch.nn.functional.rms_norm(x, (8,), None, eps)
    assert_close(gemsops.rms_norm(x, (8,), None, eps), ref, torch.float64)


def test_errors():
    x = torch.randn(4, 8)
    # torch's types: a 0-d input is a ValueError, a tensor eps of one
    # dimension a TypeError (not a float argument)
    with pytest.raises(ValueError, match="dimension"):
        gemsops.rms_norm(torch.tensor(1.0), (1,))
    with pytest.raises(RuntimeError, match="normalized_shape"):  # first
        gemsops.rms_norm(torch.tensor(1.0), [])
    with pytest.raises(TypeError, match="eps"):
        gemsops.rms_norm(x, (8,), None, torch.tensor([1e-5]))
    with pytest.raises(RuntimeError, match="normalized_shape"):
        gemsops.rms_norm(x, (7,))
    with pytest.raises(TypeError, match="eps"):
        gemsops.rms_norm(x, (8,), None, "1e-5")
    with pytest.raises(TypeError, match="input"):
        gemsops.rms_norm(x.numpy(), (8,))
    with pytest.raises(RuntimeError, match="weight"):
        gemsops.rms_norm(x, (8,), torch.randn(7))
    # torch's type for a dtype it has no kernel for
    with pytest.raises(NotImplementedError, match="floating point"):
        gemsops.rms_norm(x.long(), (8,))


def test_inference_input_with_a_weight_that_wants_grad(device):
    """x made under inference_mode, the weight trained: torch's composite
    saves no inference tensor, and neither does gemsops."""
    torch.manual_seed(13)
    with torch.inference_mode():
        x = torch.randn(4, 8, device=device)
    w = torch.randn(8, device=device, requires_grad=True)
    xd = x.clone().double()
    wd = w.detach().double().requires_grad_()
    F.rms_norm(xd, (8,), wd).square().sum().backward()
    gemsops.rms_norm(x, (8,), w).square().sum().backward()
    torch.testing.assert_close(w.grad.double(), wd.grad, rtol=1e-5, atol=1e-5)
    w.grad = None  # the op's path (autocast) saves no inference tensor too
    with torch.autocast(device, dtype=torch.bfloat16):
        y = gemsops.rms_norm(x, (8,), w)
    y.float().square().sum().backward()
    torch.testing.assert_close(w.grad.double(), wd.grad, rtol=0.05, atol=0.05)


@pytest.mark.parametrize("path", ["eager", "op"])
def test_weight_gradient_alone_saves_no_weight(path, device):
    """Only the weight's gradient asked: torch's composite saves no weight,
    so a weight made under inference_mode, or written in place between
    the forward and the backward, is no error; nor in gemsops (the weight
    was saved, and refused)."""
    torch.manual_seed(14)
    x = torch.randn(4, 8, device=device)
    xd = x.double().cpu()  # torch's CUDA kernel saves its weight: the CPU's

    def norm(x, w):
        if path == "op":  # the custom op's autograd (autocast takes it)
            with torch.autocast(device, dtype=torch.float32):
                return gemsops.rms_norm(x, (8,), w)
        return gemsops.rms_norm(x, (8,), w)

    with torch.inference_mode():
        m = gemsops.nn.RMSNorm(8, device=device)
    assert m(x).shape == (4, 8)  # an inference parameter, no grad asked
    w = torch.randn(8, device=device, requires_grad=True)
    wd = w.detach().double().cpu().requires_grad_()
    y, yd = norm(x, w), F.rms_norm(xd, (8,), wd)
    with torch.no_grad():
        w.mul_(2)
        wd.mul_(2)
    y.square().sum().backward()
    yd.square().sum().backward()
    torch.testing.assert_close(
        w.grad.double().cpu(), wd.grad, rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("fn", ["rms_norm", "fused_add_rms_norm"])
@pytest.mark.parametrize("wdtype", [torch.float8_e5m2, torch.float8_e4m3fn])
def test_float8_weight_refused_as_torch(fn, wdtype):
    """torch promotes no float8 type: its rms_norm refuses a float8 weight
    (RuntimeError); gemsops cast it to fp32 and computed."""
    x = torch.randn(2, 4)
    w = torch.ones(4).to(wdtype)
    with pytest.raises(RuntimeError, match="Float8"):
        F.rms_norm(x, (4,), w)
    call = {
        "rms_norm": lambda: gemsops.rms_norm(x, (4,), w),
        "fused_add_rms_norm": lambda: gemsops.fused_add_rms_norm(
            x, x, (4,), w
        ),
    }[fn]
    with pytest.raises(RuntimeError, match="Float8.*'weight'"):
        call()


@pytest.mark.parametrize("wdtype", [torch.int64, torch.bool])
def test_integer_weight_as_torch(wdtype, device):
    x = torch.randn(3, 4, device=device)
    w = torch.tensor([1, 0, 3, 4], device=device).to(wdtype)
    want = F.rms_norm(x.double(), (4,), w)
    got = gemsops.rms_norm(x, (4,), w)
    assert got.dtype == F.rms_norm(x, (4,), w).dtype
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_complex_input_is_torchs(device):
    """No kernel of ours: complex input takes torch's composite, as
    torch.nn.RMSNorm's does."""
    torch.manual_seed(14)
    x = torch.randn(3, 8, dtype=torch.complex64, device=device)
    want = torch.nn.RMSNorm(8, device=device)(x)
    got = gemsops.nn.RMSNorm(8, device=device)(x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want)
    # a complex weight beside real input: torch's composite too
    x = torch.randn(3, 8, device=device)
    w = torch.randn(8, dtype=torch.complex64, device=device)
    for ours, theirs in (
        (lambda: gemsops.rms_norm(x, (8,), w), lambda: F.rms_norm(x, (8,), w)),
        (
            lambda: gemsops.fused_add_rms_norm(x, x.clone(), (8,), w)[0],
            lambda: F.rms_norm(x + x, (8,), w),
        ),
    ):
        with warnings.catch_warnings():  # torch's, once a process
            warnings.simplefilter("ignore", UserWarning)
            want, got = theirs(), ours()
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)
