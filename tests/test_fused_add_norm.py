"""The residual add fused into LayerNorm and RMSNorm: h = x + residual
exactly as torch's add, y against float64 references, gradients of x,
residual and the parameters with both outputs used downstream, on the CPU
and on CUDA (tests taking `device`)."""

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import gradcheck, gradgradcheck

import gemsops
from gemsops.testing import assert_close

FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
KINDS = ["layer", "rms"]

# the LayerNorm suite's kernel paths: registers (several widths), looped
# (fp16 past 16384, bf16 past 32768, fp32 past 16384), odd widths
SHAPES = [
    ((200, 36), 1),
    ((8, 128, 768), 1),
    ((2, 3, 4, 5), 2),
    ((37, 1), 1),
    ((6, 12288), 1),
    ((5, 20001), 1),
    ((3, 40000), 1),
    ((4, 65536), 1),
    ((2, 73733), 1),  # CPU: in chunks of columns
]


def run(kind, x, res, shape, w, b, eps=1e-5):
    if kind == "rms":
        return gemsops.fused_add_rms_norm(x, res, shape, w, eps)
    return gemsops.fused_add_layer_norm(x, res, shape, w, b, eps)


def reference(kind, h, shape, w, b, eps=1e-5):
    """float64 norm of h."""
    hd = h.double()
    wd = None if w is None else w.double()
    if kind == "rms":
        return F.rms_norm(hd, shape, wd, eps)
    return F.layer_norm(hd, shape, wd, None if b is None else b.double(), eps)


def make(kind, shape, nd, dtype, device, requires_grad=False):
    x = torch.randn(shape, dtype=dtype, device=device)
    res = torch.randn(shape, dtype=dtype, device=device) * 3 + 1
    pshape = shape[len(shape) - nd :]
    w = torch.randn(pshape, dtype=dtype, device=device)
    b = (
        None
        if kind == "rms"
        else torch.randn(pshape, dtype=dtype, device=device)
    )
    for t in (x, res, w, b):
        if t is not None:
            t.requires_grad_(requires_grad)
    return x, res, pshape, w, b


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape,nd", SHAPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_forward(kind, shape, nd, dtype, device):
    x, res, pshape, w, b = make(kind, shape, nd, dtype, device)
    y, h = run(kind, x, res, pshape, w, b)
    assert torch.equal(h, x + res)  # torch's add, bit for bit
    assert y.dtype == dtype and h.dtype == dtype
    assert_close(y, reference(kind, x + res, pshape, w, b), dtype)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape,nd", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_with_both_outputs_used(kind, shape, nd, dtype, device):
    check_backward_both(kind, shape, nd, dtype, device)


# Rows of 4096 and 8192 half elements: on CUDA the wide kernels' paired
# loop (two rows a step, h's gradient loaded before the reduction), with
# enough rows that a CTA walks several steps and, for some, an odd number
# (the last step's second row absent).
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", [(1001, 4096), (531, 8192)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_backward_with_both_outputs_used_wide_rows(kind, shape, dtype, device):
    check_backward_both(kind, shape, 1, dtype, device)


def check_backward_both(kind, shape, nd, dtype, device):
    """x's, residual's and the parameters' gradients with y and h both
    used downstream, each with its own gradient, against float64."""
    x, res, pshape, w, b = make(kind, shape, nd, dtype, device, True)
    gy = torch.randn(shape, dtype=dtype, device=device)
    gh = torch.randn(shape, dtype=dtype, device=device)
    y, h = run(kind, x, res, pshape, w, b)
    torch.autograd.backward((y, h), (gy, gh))
    # float64 reference at the same h (the rounded sum)
    hd = (x + res).detach().double().requires_grad_()
    wd = w.detach().double().requires_grad_()
    bd = None if b is None else b.detach().double().requires_grad_()
    reference(kind, hd, pshape, wd, bd).backward(gy.double())
    want_dx = hd.grad + gh.double()
    rows = x.numel() // w.numel()
    assert_close(x.grad, want_dx, dtype, name="dx")
    assert torch.equal(x.grad, res.grad)
    assert_close(w.grad, wd.grad, dtype, name="dw", reduce_len=rows)
    if b is not None:
        assert_close(b.grad, bd.grad, dtype, name="db", reduce_len=rows)


@pytest.mark.parametrize("kind", KINDS)
def test_only_h_used_leaves_the_parameters_without_grad(kind, device):
    """y unused: torch's (h = x + r; norm(h)) never reaches the weight or
    bias, whose .grad stays None (optimizers skip them)."""
    x, res, pshape, w, b = make(kind, (16, 32), 1, torch.float32, device, True)
    _, h = run(kind, x, res, pshape, w, b)
    h.square().sum().backward()
    assert w.grad is None and (b is None or b.grad is None)
    want = 2 * (x.detach() + res.detach())
    torch.testing.assert_close(x.grad, want)
    torch.testing.assert_close(res.grad, want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp32_bias_without_weight_beside_half_input(dtype, device):
    """dB is summed in fp32 and given in the bias' dtype, as layer_norm's,
    not rounded to (or overflowing) the input's half type."""
    torch.manual_seed(12)
    x = torch.randn(256, 8, dtype=dtype, device=device)
    g = (torch.randn(256, 8, device=device) * 300).to(dtype)
    b = torch.zeros(8, device=device, requires_grad=True)
    y, _ = gemsops.fused_add_layer_norm(x, torch.zeros_like(x), (8,), None, b)
    y.backward(g)
    assert b.grad.dtype == torch.float32
    want = g.double().sum(0)
    torch.testing.assert_close(b.grad.double(), want, rtol=1e-5, atol=5e-2)


@pytest.mark.parametrize("kind", KINDS)
def test_only_y_used(kind, device):
    x, res, pshape, w, b = make(kind, (64, 96), 1, torch.float32, device, True)
    y, _ = run(kind, x, res, pshape, w, b)
    y.square().sum().backward()
    xt, rt = x.detach().clone().requires_grad_(), res.detach().clone()
    rt.requires_grad_()
    wt = w.detach().clone().requires_grad_()
    bt = None if b is None else b.detach().clone().requires_grad_()
    ht = xt + rt
    yt = (
        F.rms_norm(ht, pshape, wt, 1e-5)
        if kind == "rms"
        else F.layer_norm(ht, pshape, wt, bt, 1e-5)
    )
    yt.square().sum().backward()
    for ours, theirs in ((x, xt), (res, rt), (w, wt)):
        torch.testing.assert_close(
            ours.grad, theirs.grad, rtol=1e-4, atol=1e-4
        )


@pytest.mark.parametrize("kind", KINDS)
def test_gradcheck_and_second_order(kind, device):
    torch.manual_seed(5)
    kw = dict(dtype=torch.float64, device=device, requires_grad=True)
    x, res, w, b = (
        torch.randn(3, 7, **kw),
        torch.randn(3, 7, **kw),
        torch.randn(7, **kw),
        torch.randn(7, **kw),
    )
    if kind == "rms":

        def f(x, res, w):
            return gemsops.fused_add_rms_norm(x, res, (7,), w, 1e-3)

        args = (x, res, w)
    else:

        def f(x, res, w, b):
            return gemsops.fused_add_layer_norm(x, res, (7,), w, b, 1e-3)

        args = (x, res, w, b)
    assert gradcheck(f, args)
    assert gradgradcheck(f, args)


@pytest.mark.parametrize("kind", KINDS)
def test_modules_drop_in(kind, device):
    base = torch.nn.RMSNorm if kind == "rms" else torch.nn.LayerNorm
    ours_cls = (
        gemsops.nn.FusedAddRMSNorm
        if kind == "rms"
        else gemsops.nn.FusedAddLayerNorm
    )
    theirs = base(48, eps=1e-5, device=device)
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_()
    ours = ours_cls(48, eps=1e-5, device=device)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(4, 48, device=device)
    res = torch.randn(4, 48, device=device)
    y, h = ours(x, res)
    torch.testing.assert_close(h, x + res)
    torch.testing.assert_close(y, theirs(x + res), rtol=1e-5, atol=1e-5)


def test_gpt_step_fused_add_stack_is_the_blocks(device):
    """benchmark/gpt_step.py --fused-add: its FusedAddStack, each residual
    add fused into the LayerNorm that reads its sum, gives the outputs and
    parameter gradients of the blocks run in turn."""
    from benchmark import gpt_step

    torch.manual_seed(0)
    blocks = [gpt_step.Block(32, 2) for _ in range(3)]
    ref = torch.nn.Sequential(*blocks).to(device)
    with torch.no_grad():  # parameters away from their 1 / 0 init
        for m in ref.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.normal_()
                m.bias.normal_()
    ours = gpt_step.gemsops_copy(ref, fused_add=True)
    norms = [m for m in ours.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert len(norms) == 6
    assert all(type(m) is gemsops.nn.FusedAddLayerNorm for m in norms)
    x = torch.randn(2, 8, 32, device=device)
    y_ref, y = ref(x), ours(x)
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-4)
    g = torch.randn_like(y_ref)
    params_ref, params = list(ref.parameters()), list(ours.parameters())
    assert len(params) == len(params_ref)
    grads_ref = torch.autograd.grad(y_ref, params_ref, g)
    grads = torch.autograd.grad(y, params, g)
    for got, want in zip(grads, grads_ref):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_compiled_matches_eager():
    torch._dynamo.reset()
    x, res = torch.randn(4, 32), torch.randn(4, 32)
    w = torch.randn(32)
    f = torch.compile(
        lambda x, r: gemsops.fused_add_rms_norm(x, r, (32,), w),
        fullgraph=True,
        backend="aot_eager",
    )
    for a, b in zip(f(x, res), gemsops.fused_add_rms_norm(x, res, (32,), w)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("rms", [False, True])
def test_residual_the_kernel_cannot_read_is_added_as_torch(rms):
    # broadcast, promoted or a number: torch's x + residual, then the norm
    torch.manual_seed(5)
    x = torch.randn(4, 8)
    w = torch.randn(8, dtype=torch.float64)
    fused = gemsops.fused_add_rms_norm if rms else gemsops.fused_add_layer_norm
    norm = F.rms_norm if rms else F.layer_norm
    for res in (torch.randn(8), torch.randn(1, 8), x.double(), 1.5):
        y, h = fused(x, res, (8,))
        want_h = x + res
        torch.testing.assert_close(h, want_h, rtol=0, atol=0)
        torch.testing.assert_close(y, norm(want_h, (8,)))
    y, _ = fused(x.double(), x.double() * 0.5, (8,), w.double())
    torch.testing.assert_close(y, norm(x.double() * 1.5, (8,), w.double()))
    with pytest.raises(RuntimeError, match="size of tensor"):
        x + torch.randn(4, 9)
    with pytest.raises(RuntimeError, match="size of tensor"):
        fused(x, torch.randn(4, 9), (8,))


def test_complex_rms_as_torch():
    # rms_norm hands complex input to torch; so does the fused add
    torch.manual_seed(6)
    x, r = (torch.randn(3, 8, dtype=torch.complex64) for _ in range(2))
    y, h = gemsops.fused_add_rms_norm(x, r, (8,))
    torch.testing.assert_close(h, x + r, rtol=0, atol=0)
    torch.testing.assert_close(y, F.rms_norm(x + r, (8,)))


def test_errors():
    x = torch.randn(4, 8)
    with pytest.raises(RuntimeError, match="bias"):
        gemsops._C.add_norm_fwd(
            x,
            x,
            None,
            torch.randn(8),
            1,
            1e-5,
            True,
            torch.empty_like(x),
            torch.empty_like(x),
            None,
            torch.empty(4),
        )


# Rows of 1, 2, 4, 8 or 16 whole 16-byte vectors (CUDA: the short-rows
# kernel, a vector of four rows a thread): every op and dtype, parameters
# in fp32 beside half input, a row count that leaves the last CTA
# part-full, and rows spaced apart in memory (a row stride past the row's
# end).
@pytest.mark.parametrize("vectors", [1, 2, 4, 8, 16])
@pytest.mark.parametrize(
    "dtype,pdtype",
    [
        (torch.float32, torch.float32),
        (torch.float16, torch.float16),
        (torch.bfloat16, torch.bfloat16),
        (torch.bfloat16, torch.float32),
        (torch.float16, torch.float32),
        (torch.float64, torch.float64),
    ],
)
def test_short_rows_every_op(vectors, dtype, pdtype, device):
    cols = vectors * 16 // dtype.itemsize
    rows = 1003
    pad = 16 // dtype.itemsize  # keeps each row 16-byte aligned
    padded = torch.randn(rows, cols + pad, dtype=dtype, device=device) * 2
    x = padded[:, :cols]  # rows cols + pad elements apart
    res = torch.randn(rows, cols, dtype=dtype, device=device)
    w = torch.randn(cols, dtype=pdtype, device=device)
    b = torch.randn(cols, dtype=pdtype, device=device)
    shape = (cols,)

    y, mean, rstd = gemsops.native_layer_norm(x, shape, w, b)
    ref = F.layer_norm(x.double(), shape, w.double(), b.double())
    assert_close(y, ref, dtype, name="layer_norm")
    xd = x.double()
    assert_close(mean.view(-1), xd.mean(-1), torch.float32, name="mean")
    rstd_ref = (xd.var(-1, unbiased=False) + 1e-5).rsqrt()
    assert_close(rstd.view(-1), rstd_ref, torch.float32, name="rstd")

    y = gemsops.rms_norm(x, shape, w, 1e-6)
    assert_close(y, F.rms_norm(xd, shape, w.double(), 1e-6), dtype, name="rms")

    for kind in KINDS:
        y, h = run(kind, x, res, shape, w, b)
        assert torch.equal(h, x + res), kind
        assert_close(y, reference(kind, h, shape, w, b), dtype, name=kind)


@pytest.mark.parametrize("rms", [False, True])
def test_h_requires_grad_only_through_its_addends(rms, device):
    # torch's h = x + residual records no graph for the norm's weight
    x, r = (torch.randn(4, 8, device=device) for _ in "xr")
    w = torch.randn(8, device=device, requires_grad=True)
    if rms:
        y, h = gemsops.fused_add_rms_norm(x, r, (8,), w)
    else:
        y, h = gemsops.fused_add_layer_norm(x, r, (8,), w)
    assert y.requires_grad and not h.requires_grad
    (gw,) = torch.autograd.grad(y.sum(), w)
    assert gw.shape == (8,)
    xg = x.clone().requires_grad_()
    y, h = (
        gemsops.fused_add_rms_norm(xg, r, (8,), w)
        if rms
        else gemsops.fused_add_layer_norm(xg, r, (8,), w)
    )
    assert h.requires_grad


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "case", ["no_grad", "inference_mode", "plain", "weight_only", "empty"]
)
def test_without_autograd_as_the_function(kind, case, device):
    """A call autograd does not record (grad off, or no input requiring
    grad) skips the Function and the statistics: its outputs are the
    Function path's, bit for bit, and neither requires grad."""
    from gemsops.ops import fused_add_norm as fa

    shape = (0, 24) if case == "empty" else (5, 3, 24)
    x, res, pshape, w, b = make(kind, shape, 1, torch.bfloat16, device)
    x = x[:, ::2] if case != "empty" else x  # rows not contiguous
    res = torch._neg_view(res[:, ::2] if case != "empty" else res)
    w = w.float()  # fp32 parameters beside bf16 rows
    b = None if b is None or case == "weight_only" else b.float()
    need = case in ("no_grad", "inference_mode")
    x.requires_grad_(need)
    mode = {
        "no_grad": torch.no_grad,
        "inference_mode": torch.inference_mode,
    }.get(case, torch.enable_grad)
    with mode():
        y, h = run(kind, x, res, pshape, w, b)
    with torch.enable_grad():
        want_y, want_h = fa._fused_add_norm_function(
            x.detach(),
            res.resolve_neg(),
            pshape,
            w,
            None if kind == "rms" else b,
            1e-5,
            kind == "rms",
        )
    for got, want in ((y, want_y), (h, want_h)):
        assert not got.requires_grad and got.grad_fn is None
        assert got.is_inference() == (case == "inference_mode")
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want)
