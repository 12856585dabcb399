"""Global mode: torch's own aten ops served by gemsops, then given back."""

import pytest
import torch

import gemsops
from gemsops import _global
from gemsops.testing import assert_close, layer_norm_reference


def _train_step(layer, x):
    layer.zero_grad()
    xg = x.clone().requires_grad_()
    out = layer(xg)
    out.square().mean().backward()
    return out.detach(), xg.grad, [p.grad.clone() for p in layer.parameters()]


# what a training step of an encoder layer reaches gemsops for
_ENCODER_OPS = (
    "native_layer_norm",
    "native_layer_norm_backward",
    "mm",
    "addmm",
)


def test_transformer_encoder_layer_cpu():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(
        32, 4, 64, dropout=0.0, batch_first=True
    )
    x = torch.randn(3, 7, 32)
    want = _train_step(layer, x)
    _global.counts.clear()
    with gemsops.use_gemsops(devices=("cpu",)) as counts:
        got = _train_step(layer, x)
        served = dict(counts)
    for op in _ENCODER_OPS:
        assert served.get(op, 0) > 0, (op, served)
    torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got[1], want[1], rtol=1e-4, atol=1e-4)
    for g, w in zip(got[2], want[2]):
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-4)
    # left: torch's kernels again
    assert gemsops._global.enabled() is None
    before = dict(_global.counts)
    _train_step(layer, x)
    assert dict(_global.counts) == before


def test_profiler_shows_gemsops_kernel():
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    with gemsops.use_gemsops(devices=("cpu",)):
        with torch.profiler.profile() as prof:
            torch.mm(a, b)
    names = " ".join(e.name for e in prof.events())
    assert "aten::mm" in names
    assert _global.counts["mm"] > 0


def test_fallbacks_never_fail():
    _global.counts.clear()
    d = torch.randn(3, 3, dtype=torch.float64)
    i = torch.randn(5, 4, dtype=torch.float16)
    xl, wl, bl = torch.randn(2, 3, 4), torch.randn(5, 4), torch.randn(5)
    with gemsops.use_gemsops(devices=("cpu",)):
        dd = torch.mm(d, d)
        z = torch.tensor([1 + 1j, 2 - 1j])
        assert torch.prod(z) == (1 + 1j) * (2 - 1j)
        with pytest.raises(RuntimeError):
            torch.mm(torch.randn(2, 3), torch.randn(2, 3))
        assert torch.prod(torch.arange(1, 6)) == 120
        p = torch.prod(torch.tensor([[1.0, 2], [3, 4]]), 1, keepdim=True)
        assert p.shape == (2, 1) and p[1, 0] == 12
        ln = torch.nn.functional.layer_norm(i, (4,))
        lin = torch.nn.functional.linear(xl, wl, bl)
    # float64 references made outside the mode
    torch.testing.assert_close(
        dd, torch.from_numpy(d.numpy() @ d.numpy()), rtol=1e-12, atol=1e-12
    )
    assert ln.dtype == torch.float16
    assert_close(ln, layer_norm_reference(i, (4,))[0], torch.float16)
    assert lin.shape == (2, 3, 5)
    want = xl.double() @ wl.double().T + bl.double()
    assert_close(lin, want, torch.float32, chain_len=4)
    assert _global.counts["mm:fallback"] > 0
    assert _global.counts["prod:fallback"] > 0


def test_matches_torch_dtypes_and_values():
    torch.manual_seed(1)
    a, b, c = torch.randn(5, 7), torch.randn(7, 3), torch.randn(3)
    want = (
        torch.addmm(c, a, b, beta=0.5, alpha=2.0),
        torch.bmm(a[None], b[None]),
        torch.prod(a, 0),
        torch.native_layer_norm(a.bfloat16(), (7,), None, None, 1e-5),
    )
    _global.counts.clear()
    with gemsops.use_gemsops(devices=("cpu",)):
        got = (
            torch.addmm(c, a, b, beta=0.5, alpha=2.0),
            torch.bmm(a[None], b[None]),
            torch.prod(a, 0),
            torch.native_layer_norm(a.bfloat16(), (7,), None, None, 1e-5),
        )
    for op in ("addmm", "bmm", "prod.dim_int", "native_layer_norm"):
        assert _global.counts[op] == 1, (op, dict(_global.counts))
    for g, w in zip(got[:3], want[:3]):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)
    for g, w in zip(got[3], want[3], strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g.float(), w.float(), rtol=2e-2, atol=2e-2)
    ref = layer_norm_reference(a.bfloat16(), (7,))[0]
    assert_close(got[3][0], ref, torch.bfloat16, torch_out=want[3][0])


def test_include_exclude_and_nesting():
    a = torch.randn(4, 4)
    _global.counts.clear()
    with gemsops.use_gemsops(
        devices=("cpu",), include=("mm", "bmm"), exclude=("bmm",)
    ):
        assert _global.enabled() == (("cpu",), ("mm",))
        torch.prod(a)
        torch.mm(a, a)
        with gemsops.use_gemsops(devices=("cpu",), include=("prod",)):
            torch.prod(a)
            torch.mm(a, a)
        assert _global.enabled() == (("cpu",), ("mm",))
    assert _global.enabled() is None
    assert _global.counts["mm"] == 1 and _global.counts["prod"] == 1
    with pytest.raises(ValueError):
        gemsops.enable(include=("softmax",))
    with pytest.raises(ValueError):
        gemsops.enable(devices=("tpu",))


def test_default_devices_cuda_only_leave_cpu_alone():
    _global.counts.clear()
    gemsops.enable()
    try:
        torch.mm(torch.randn(2, 2), torch.randn(2, 2))
    finally:
        gemsops.disable()
    assert _global.counts["mm"] == 0


@pytest.mark.cuda
def test_transformer_encoder_layer_cuda():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(
        64, 4, 128, dropout=0.0, batch_first=True
    ).cuda()
    x = torch.randn(3, 7, 64, device="cuda")
    want = _train_step(layer, x)
    _global.counts.clear()
    with gemsops.use_gemsops() as counts:
        got = _train_step(layer, x)
        served = dict(counts)
    for op in _ENCODER_OPS:
        assert served.get(op, 0) > 0, (op, served)
    torch.testing.assert_close(got[0], want[0], rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(got[1], want[1], rtol=1e-3, atol=1e-3)
    for g, w in zip(got[2], want[2], strict=True):
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-3)


def test_addmm_alpha_zero_keeps_nan_out():
    # the product is skipped at alpha == 0 (its NaNs do not reach out)
    a, b, c = torch.randn(4, 5), torch.randn(5, 3), torch.randn(4, 3)
    a[1, 2] = float("nan")
    want = torch.addmm(c, a, b, alpha=0, beta=0.5)
    _global.counts.clear()
    with gemsops.use_gemsops(devices=("cpu",)):
        got = torch.addmm(c, a, b, alpha=0, beta=0.5)
    # served by torch's own kernel (the mode's fallback), not the product
    assert _global.counts["addmm:fallback"] == 1, dict(_global.counts)
    assert not got.isnan().any()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got, 0.5 * c, rtol=0, atol=0)


@pytest.mark.parametrize(
    "params", ["none", "half", "fp32", "fp32 weight", "fp32 bias"]
)
def test_native_layer_norm_statistics_dtype_as_torch_cpu(params):
    # torch's CPU kernel: statistics in the input's half type, but fp32
    # when a parameter is fp32
    x = torch.randn(4, 8).bfloat16()
    w, b = torch.randn(8), torch.randn(8)
    weight, bias = {
        "none": (None, None),
        "half": (w.bfloat16(), b.bfloat16()),
        "fp32": (w, b),
        "fp32 weight": (w, None),
        "fp32 bias": (None, b),
    }[params]
    want = torch.native_layer_norm(x, (8,), weight, bias, 1e-5)
    _global.counts.clear()
    with gemsops.use_gemsops(devices=("cpu",)):
        got = torch.native_layer_norm(x, (8,), weight, bias, 1e-5)
    assert _global.counts["native_layer_norm"] == 1, dict(_global.counts)
    for g, w_ in zip(got, want, strict=True):
        assert g.dtype == w_.dtype and g.shape == w_.shape
        torch.testing.assert_close(g.float(), w_.float(), rtol=2e-2, atol=2e-2)


def _outcome(fn):
    """fn's result, or the type of what it raised."""
    try:
        return fn()
    except Exception as e:  # the type is the outcome compared
        return type(e)


@pytest.mark.parametrize("name", ["alpha", "beta"])
@pytest.mark.parametrize("value", [1e39, -1e300])
def test_addmm_coefficient_past_float32_raises_as_torch(name, value):
    c, a, b = torch.randn(3), torch.randn(4, 5), torch.randn(5, 3)
    want = _outcome(lambda: torch.addmm(c, a, b, **{name: value}))
    assert want is RuntimeError  # the premise
    with gemsops.use_gemsops(devices=("cpu",)):
        with pytest.raises(RuntimeError, match="overflow"):
            torch.addmm(c, a, b, **{name: value})


def test_addmm_int_coefficient_past_int64_as_torch():
    c, a, b = torch.randn(3), torch.randn(4, 5), torch.randn(5, 3)
    want = torch.addmm(c, a, b, alpha=2**63)
    _global.counts.clear()
    with gemsops.use_gemsops(devices=("cpu",)):
        got = torch.addmm(c, a, b, alpha=2**63)
    assert _global.counts["addmm"] == 1, dict(_global.counts)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("affine", [False, True])
def test_layer_norm_shape_not_trailing_raises_as_torch(affine):
    """normalized_shape must be the input's trailing sizes, with or
    without parameters (whose sizes C checks)."""
    torch.manual_seed(8)
    x = torch.randn(3, 5, 8, requires_grad=True)
    w, b = (torch.randn(5), torch.randn(5)) if affine else (None, None)
    F = torch.nn.functional
    assert _outcome(lambda: F.layer_norm(x, (5,), w, b)) is RuntimeError
    with gemsops.use_gemsops(devices=("cpu",)):
        with pytest.raises(RuntimeError, match="normalized_shape"):
            F.layer_norm(x, (5,), w, b)
        with pytest.raises(RuntimeError):
            torch.native_layer_norm(x, [2], None, None, 1e-5)
    y, mean, rstd = torch.native_layer_norm(x.detach(), [8], None, None, 1e-5)
    g = torch.randn_like(y)
    args = (g, x.detach(), [4], mean, rstd, None, None, [True, False, False])
    bwd = torch.ops.aten.native_layer_norm_backward
    assert _outcome(lambda: bwd(*args)) is RuntimeError
    with gemsops.use_gemsops(devices=("cpu",)):
        with pytest.raises(RuntimeError):
            bwd(*args)


def test_layer_norm_backward_as_torch_where_torch_refuses():
    """A bias of its own dtype beside no weight, and statistics of another
    dtype, are torch's kernel's to serve or refuse."""
    torch.manual_seed(9)
    F = torch.nn.functional
    x = torch.randn(4, 8, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(8, requires_grad=True)

    def bias_only():
        F.layer_norm(x, (8,), None, b).sum().backward()
        return x.grad.clone(), b.grad.clone()

    want = _outcome(bias_only)
    x.grad = b.grad = None
    with gemsops.use_gemsops(devices=("cpu",)):
        got = _outcome(bias_only)
    if isinstance(want, type):
        assert got is want
    else:
        torch.testing.assert_close(got, want)
    bwd = torch.ops.aten.native_layer_norm_backward
    for dtype, stats in (
        (torch.float32, torch.float64),
        (torch.bfloat16, torch.float32),
    ):
        xf = torch.randn(4, 8, dtype=dtype)
        y, mean, rstd = torch.native_layer_norm(xf, [8], None, None, 1e-5)
        args = (torch.randn_like(y), xf, [8], mean.to(stats), rstd.to(stats))
        args += (None, None, [True, False, False])
        want = _outcome(lambda: bwd(*args))
        with gemsops.use_gemsops(devices=("cpu",)):
            got = _outcome(lambda: bwd(*args))
        if isinstance(want, type):
            assert got is want
        else:
            torch.testing.assert_close(got[0], want[0])


def test_include_and_exclude_take_one_name():
    a, b = torch.randn(4, 5), torch.randn(5, 3)
    _global.counts.clear()
    with gemsops.use_gemsops(devices="cpu", include="mm"):
        torch.mm(a, b)
        torch.prod(a)
    assert _global.counts["mm"] == 1 and _global.counts["prod"] == 0
    with gemsops.use_gemsops(devices="cpu", exclude="mm"):
        torch.mm(a, b)
        torch.prod(a)
    assert _global.counts["mm"] == 1 and _global.counts["prod"] == 1


def test_blocks_closed_out_of_order_restore_what_came_before():
    # two threads' blocks, the older closed first: the newer's routing
    # holds until it closes, then nothing is routed (it restored the
    # older's routing, a leak past both blocks, and the older's exit had
    # dropped the newer's while it was open)
    import threading

    assert gemsops.enabled() is None
    entered, older_closed, done = (threading.Event() for _ in range(3))
    seen = {}

    def newer():
        entered.wait()
        with gemsops.use_gemsops(devices=("cpu",), include=("mm",)):
            seen["inside"] = gemsops.enabled()
            done.set()
            older_closed.wait()
            seen["after older"] = gemsops.enabled()

    t = threading.Thread(target=newer)
    t.start()
    with gemsops.use_gemsops(devices=("cpu",), include=("prod",)):
        entered.set()
        done.wait()
    older_closed.set()
    t.join()
    assert seen["inside"] == (("cpu",), ("mm",))
    assert seen["after older"] == (("cpu",), ("mm",))
    assert gemsops.enabled() is None


def test_enable_arguments_as_torch_names_devices():
    try:
        gemsops.enable(devices=torch.device("cpu"), include=["mm", "mm"])
        assert gemsops.enabled() == (("cpu",), ("mm",))
        gemsops.enable(devices=("cpu", "cpu:0"), exclude="mm")
        assert gemsops.enabled()[0] == ("cpu",)
        assert "mm" not in gemsops.enabled()[1]
    finally:
        gemsops.disable()
    for bad, exc in (
        (dict(devices=()), ValueError),
        (dict(devices=("tpu",)), ValueError),
        (dict(devices=(1,)), TypeError),
        (dict(include=(None,)), TypeError),
        (dict(include=("aten.mm",)), ValueError),
    ):
        with pytest.raises(exc, match="enable"):
            gemsops.enable(**bad)
        assert gemsops.enabled() is None
