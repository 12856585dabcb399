"""Every check at the C boundary raises the right exception type with a
message that names the function and the argument."""

import numpy as np
import pytest
import torch

import gemsops
from gemsops import _C
from gemsops.testing import assert_close, layer_norm_reference, raised_type


def fwd_args(device="cpu", rows=8, cols=16, dtype=torch.float32):
    x = torch.randn(rows, cols, dtype=dtype, device=device)
    w = torch.randn(cols, dtype=dtype, device=device)
    b = torch.randn(cols, dtype=dtype, device=device)
    sd = torch.float64 if dtype == torch.float64 else torch.float32
    out = torch.empty_like(x)
    mean = torch.empty(rows, dtype=sd, device=device)
    rstd = torch.empty(rows, dtype=sd, device=device)
    return dict(x=x, w=w, b=b, nd=1, eps=1e-5, out=out, mean=mean, rstd=rstd)


def call_fwd(a):
    return _C.layer_norm_fwd(
        a["x"],
        a["w"],
        a["b"],
        a["nd"],
        a["eps"],
        a["out"],
        a["mean"],
        a["rstd"],
    )


def test_valid_call_passes():
    a = fwd_args()
    for k in ("out", "mean", "rstd"):
        a[k].fill_(float("nan"))
    call_fwd(a)
    out, mean, rstd = layer_norm_reference(a["x"], (16,), a["w"], a["b"])
    assert_close(a["out"], out, torch.float32)
    assert_close(a["mean"], mean.reshape(-1), torch.float32)
    assert_close(a["rstd"], rstd.reshape(-1), torch.float32)


@pytest.mark.parametrize(
    "field,value,exc,words",
    [
        ("x", [1.0, 2.0], TypeError, "'input' must be a tensor"),
        (
            "x",
            torch.ones(8, 16, dtype=torch.int64),
            RuntimeError,
            "floating point",
        ),
        (
            "x",
            torch.ones(8, 16, dtype=torch.complex64),
            NotImplementedError,
            "'input' must be a floating point tensor (float16, bfloat16, "
            "float32 or float64), got complex64",
        ),
        ("w", torch.ones(15), RuntimeError, "weight of shape [15]"),
        (
            "w",
            torch.ones(16, dtype=torch.float64),
            RuntimeError,
            "'weight' has dtype float64",
        ),
        ("w", "weight", TypeError, "'weight' must be a tensor"),
        ("b", torch.ones(2, 16)[:, 0], RuntimeError, "bias"),
        ("b", torch.ones(32)[::2], RuntimeError, "'bias' must be contiguous"),
        ("nd", 0, RuntimeError, "normalized_ndim=0"),
        ("nd", 3, RuntimeError, "normalized_ndim=3"),
        ("out", torch.empty(8, 15), RuntimeError, "'out' has shape [8, 15]"),
        (
            "out",
            torch.empty(8, 16, dtype=torch.float64),
            RuntimeError,
            "'out' has dtype float64",
        ),
        ("mean", torch.empty(7), RuntimeError, "'mean' has 7 elements"),
        (
            "mean",
            torch.empty(8, dtype=torch.float16),
            RuntimeError,
            "'mean' has dtype float16",
        ),
        (
            "rstd",
            torch.empty(16)[::2],
            RuntimeError,
            "'rstd' must be contiguous",
        ),
    ],
)
def test_forward_argument_checks(field, value, exc, words):
    a = fwd_args()
    a[field] = value
    with pytest.raises(exc) as info:
        call_fwd(a)
    assert words in str(info.value)
    assert str(info.value).startswith("layer_norm(")


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
@pytest.mark.parametrize(
    "fn",
    ["layer_norm", "native_layer_norm", "fused_add_layer_norm"],
)
def test_norm_names_an_unsupported_dtype(fn, dtype):
    x = torch.randn(4, 8, dtype=dtype)
    args = (x, x.clone()) if fn.startswith("fused") else (x,)
    name = str(dtype).removeprefix("torch.")
    with pytest.raises(NotImplementedError, match=f"got {name}$"):
        getattr(gemsops, fn)(*args, (8,))


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize(
    "bad, exc",
    [
        ({"weight": torch.ones(7)}, RuntimeError),
        ({"weight": torch.ones(8, dtype=torch.float64)}, RuntimeError),
        ({"bias": torch.ones(8, dtype=torch.float16)}, RuntimeError),
        ({"input": torch.ones(4, 8, dtype=torch.int32)}, NotImplementedError),
    ],
)
def test_native_layer_norm_names_itself_refusing(bad, exc, grad):
    # refusals the C boundary raises under layer_norm's name
    args = {"input": torch.randn(4, 8), "weight": None, "bias": None}
    args.update(bad)
    if grad and args["input"].is_floating_point():
        args["input"].requires_grad_(True)
    with pytest.raises(exc, match=r"^native_layer_norm\(\): "):
        gemsops.native_layer_norm(
            args["input"], (8,), args["weight"], args["bias"]
        )


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.int64])
def test_linear_names_itself_refusing_a_dtype(dtype, bias):
    # the bias' addmm path included: the error names the function called
    lin = torch.nn.Linear(3, 2, bias=bias)
    args = [torch.ones(4, 3, dtype=dtype), lin.weight.detach().to(dtype)]
    if bias:
        args.append(lin.bias.detach().to(dtype))
    name = str(dtype).removeprefix("torch.")
    with pytest.raises(NotImplementedError, match=f"^linear\\(.*{name}$"):
        gemsops.linear(*args)


def test_python_folds_past_the_dims_c_takes():
    # the Python layer folds inputs of more than _dispatch.MAX_DIMS dims:
    # that bound must be C's own (GEMSOPS_MAX_DIMS)
    from gemsops._dispatch import MAX_DIMS

    for dims in (MAX_DIMS, MAX_DIMS + 1):
        x = torch.randn((1,) * (dims - 1) + (8,))
        out = torch.empty_like(x)
        mean, rstd = torch.empty(1), torch.empty(1)
        args = (x, None, None, 1, 1e-5, out, mean, rstd)
        if dims == MAX_DIMS:
            _C.layer_norm_fwd(*args)
        else:
            with pytest.raises(ValueError, match=f"at most {MAX_DIMS}"):
                _C.layer_norm_fwd(*args)


def test_output_overlapping_input_is_refused():
    a = fwd_args()
    a["out"] = a["x"]
    with pytest.raises(RuntimeError, match="'out' overlaps input 'input'"):
        call_fwd(a)
    a = fwd_args()
    a["rstd"] = a["mean"]
    with pytest.raises(RuntimeError, match="overlap"):
        call_fwd(a)


def test_rows_that_overlap_are_refused():
    a = fwd_args()
    a["x"] = torch.randn(16).expand(8, 16)  # every row is the same memory
    with pytest.raises(RuntimeError, match="overlap"):
        call_fwd(a)


def test_misaligned_tensor_is_refused():
    buf = np.zeros(4 * 16 * 8 + 1, dtype=np.uint8)
    x = np.frombuffer(buf.data, dtype=np.float32, count=128, offset=1)
    a = fwd_args()
    a["x"] = x.reshape(8, 16)
    with pytest.raises((ValueError, TypeError), match="input"):
        call_fwd(a)


def test_wrong_argument_count():
    with pytest.raises(TypeError, match="takes 8 arguments"):
        _C.layer_norm_fwd(1, 2)


def test_functional_checks():
    x = torch.randn(4, 8)
    with pytest.raises(RuntimeError, match="at least 1-dimensional"):
        gemsops.layer_norm(x, [])
    with pytest.raises(
        RuntimeError, match=r"expected input with shape \[\*, 7\]"
    ):
        gemsops.layer_norm(x, [7])
    with pytest.raises(TypeError, match="'input' must be a Tensor"):
        gemsops.layer_norm([[1.0]], [1])
    with pytest.raises(TypeError, match="'weight' must be a Tensor"):
        gemsops.layer_norm(x, [8], weight=[1.0] * 8)
    with pytest.raises(RuntimeError, match="weight .* and bias .* one dtype"):
        gemsops.layer_norm(
            x.bfloat16(),
            [8],
            torch.ones(8),
            torch.ones(8, dtype=torch.bfloat16),
        )


@pytest.mark.parametrize(
    "bias,words",
    [
        (torch.randn(4, dtype=torch.float64), "same shape as normalized"),
        (torch.randn(8, dtype=torch.float32), "'bias' has dtype float32"),
    ],
)
@pytest.mark.parametrize("with_weight", [True, False])
def test_layer_norm_backward_checks_the_bias_as_torch(
    bias, words, with_weight
):
    # C reads no bias in the backward: the Python layer applies the
    # forward's rules, where torch's backward raises RuntimeError too
    x = torch.randn(4, 8, dtype=torch.float64)
    w = torch.randn(8, dtype=torch.float64) if with_weight else None
    _, mean, rstd = torch.native_layer_norm(x, [8], w, None, 1e-5)
    g = torch.randn_like(x)
    mask = [True, with_weight, True]
    with pytest.raises(RuntimeError):
        torch.ops.aten.native_layer_norm_backward(
            g, x, [8], mean, rstd, w, bias, mask
        )
    with pytest.raises(RuntimeError, match=words):
        gemsops.layer_norm_backward(g, x, [8], mean, rstd, w, bias, mask)


def test_backward_argument_checks():
    a = fwd_args()
    call_fwd(a)
    g = torch.randn_like(a["x"])
    dx = torch.empty_like(a["x"])
    dw = torch.empty(16)
    db = torch.empty(16)

    def bwd(**over):
        kw = dict(
            g=g,
            x=a["x"],
            w=a["w"],
            nd=1,
            det=False,
            mean=a["mean"],
            rstd=a["rstd"],
            dx=dx,
            dw=dw,
            db=db,
            ws=None,
        )
        kw.update(over)
        return _C.layer_norm_bwd(*kw.values())

    bwd()
    with pytest.raises(
        RuntimeError, match="grad_weight was given but weight is None"
    ):
        bwd(w=None)
    with pytest.raises(RuntimeError, match="'grad_out' has shape"):
        bwd(g=torch.randn(8, 15))
    with pytest.raises(RuntimeError, match="'grad_weight' has dtype float64"):
        bwd(dw=torch.empty(16, dtype=torch.float64))
    with pytest.raises(
        RuntimeError, match="'grad_input' overlaps input 'grad_out'"
    ):
        bwd(dx=g)
    with pytest.raises(RuntimeError, match="'workspace' must be uint8"):
        bwd(ws=torch.empty(16))
    with pytest.raises(TypeError, match="takes 11 or 12 arguments"):
        _C.layer_norm_bwd(g)
    with pytest.raises(TypeError, match="workspace_stream must be a stream"):
        _C.layer_norm_bwd(
            *[
                g,
                a["x"],
                a["w"],
                1,
                False,
                a["mean"],
                a["rstd"],
                dx,
                dw,
                db,
                None,
                "s",
            ]
        )


@pytest.mark.cuda
def test_cuda_device_mismatch():
    a = fwd_args("cuda")
    a["w"] = a["w"].cpu()
    with pytest.raises(RuntimeError, match="same device.*'weight' is on cpu"):
        call_fwd(a)
    a = fwd_args("cuda")
    a["out"] = a["out"].cpu()
    with pytest.raises(RuntimeError, match="'out' is on cpu"):
        call_fwd(a)
    with pytest.raises(RuntimeError, match="same device"):
        gemsops.layer_norm(
            torch.randn(4, 8, device="cuda"), [8], torch.ones(8)
        )


@pytest.mark.cuda
def test_cuda_workspace_too_small():
    # the backward's dW/dB stripes live in the workspace
    a = fwd_args("cuda", rows=64, cols=4096)
    call_fwd(a)
    need = _C.layer_norm_bwd_workspace(
        a["x"], a["w"], 1, False, True, True, True
    )
    assert need > 0
    g = torch.randn_like(a["x"])
    ws = torch.empty(need - 16, dtype=torch.uint8, device="cuda")
    with pytest.raises(ValueError, match="workspace has"):
        _C.layer_norm_bwd(
            g,
            a["x"],
            a["w"],
            1,
            False,
            a["mean"],
            a["rstd"],
            torch.empty_like(g),
            torch.empty_like(a["w"]),
            torch.empty_like(a["b"]),
            ws,
        )


@pytest.mark.cuda
def test_cuda_kept_workspace_protocol():
    # a kept workspace: asked for (bytes, stream) when absent or for another
    # stream; after every launch (atomic, deterministic, split rows) it is
    # all zeros again, so the next launch may use it without a memset
    stream = torch.cuda.current_stream().cuda_stream
    cases = [
        (300, 4096, False),
        (300, 4096, True),
        (40, 40000, False),
        (40, 40000, True),
        (300, 4096, False),
    ]
    need = {}
    for rows, cols, det in cases:
        a = fwd_args("cuda", rows=rows, cols=cols)
        n = _C.layer_norm_bwd_workspace(
            a["x"], a["w"], 1, det, True, True, True
        )
        assert n > 0
        need[(rows, cols, det)] = n
    ws = torch.zeros(max(need.values()), dtype=torch.uint8, device="cuda")
    for rows, cols, det in cases:
        a = fwd_args("cuda", rows=rows, cols=cols)
        call_fwd(a)
        g = torch.randn_like(a["x"])
        outs = [
            torch.full_like(g, float("nan")),
            torch.full_like(a["w"], float("nan")),
            torch.full_like(a["b"], float("nan")),
        ]
        args = [g, a["x"], a["w"], 1, det, a["mean"], a["rstd"], *outs]
        assert _C.layer_norm_bwd(*args, None, -1) == (
            need[(rows, cols, det)],
            stream,
        )
        assert _C.layer_norm_bwd(*args, ws, stream + 1) == (
            need[(rows, cols, det)],
            stream,
        )  # kept for another stream
        assert _C.layer_norm_bwd(*args, ws, stream) is None
        assert int(torch.count_nonzero(ws)) == 0, (rows, cols, det)
        ref = torch.ops.aten.native_layer_norm_backward(
            g.double(),
            a["x"].double(),
            [cols],
            a["mean"].double()[:, None],
            a["rstd"].double()[:, None],
            a["w"].double(),
            a["b"].double(),
            [True, True, True],
        )
        for o, r in zip(outs, ref):
            torch.testing.assert_close(o.double(), r, rtol=1e-4, atol=1e-4)


NORMS = [
    "layer_norm",
    "native_layer_norm",
    "rms_norm",
    "fused_add_layer_norm",
    "fused_add_rms_norm",
]


def _norm_call(fn, x, shape, weight=None, eps=None):
    f = getattr(gemsops, fn)
    kw = {} if eps is None else {"eps": eps}
    if fn.startswith("fused"):
        return f(x, x.clone(), shape, weight, **kw)[0]
    out = f(x, shape, weight, **kw)
    return out[0] if fn == "native_layer_norm" else out


@pytest.mark.parametrize("fn", NORMS)
def test_norm_checks_hold_where_c_does_not_see(fn):
    # torch's ops under vmap and forward-mode AD, the fake kernel under
    # meta tensors: the eager call's refusals, not a broadcast weight or
    # an integer normalized
    x, bad = torch.randn(2, 8), torch.randn(3, 8)
    ints = torch.arange(16).reshape(2, 8)
    same = "Expected weight to be of same shape as normalized_shape"
    calls = {
        "eager": lambda w, t=x: _norm_call(fn, t, (8,), w),
        "vmap": lambda w, t=x: torch.func.vmap(
            lambda r: _norm_call(fn, r, (8,), w)
        )(t),
        "jvp": lambda w, t=x: torch.func.jvp(
            lambda r: _norm_call(fn, r, (8,), w), (t,), (t,)
        ),
        "meta": lambda w, t=x: _norm_call(
            fn, t.to("meta"), (8,), None if w is None else w.to("meta")
        ),
    }
    for name, call in calls.items():
        with pytest.raises(RuntimeError, match=same):
            call(bad)
        if name == "jvp":
            continue  # torch.func.jvp refuses an integer primal itself
        with pytest.raises(NotImplementedError, match="got int64"):
            call(None, ints)


@pytest.mark.parametrize("fn", NORMS)
def test_norm_eps_taken_as_torch_takes_a_float(fn):
    from fractions import Fraction

    x = torch.randn(3, 8)
    want = _norm_call(fn, x, (8,), eps=0.5)
    for eps in (np.float32(0.5), torch.tensor(0.5), Fraction(1, 2) * 1.0):
        torch.testing.assert_close(_norm_call(fn, x, (8,), eps=eps), want)
    # a NumPy complex scalar: its real part, with NumPy's warning, as torch
    with pytest.warns(np.exceptions.ComplexWarning):
        got = _norm_call(fn, x, (8,), eps=np.complex128(0.5 + 2j))
    torch.testing.assert_close(got, want)
    # a complex 0-d tensor: its real part where exact, else torch's error
    got = _norm_call(fn, x, (8,), eps=torch.tensor(0.5 + 0j))
    torch.testing.assert_close(got, want)
    with pytest.raises(RuntimeError, match="eps .* without overflow"):
        _norm_call(fn, x, (8,), eps=torch.tensor(0.5 + 1j))
    refused = (
        np.array(0.5),
        Fraction(1, 2),
        "0.5",
        torch.tensor([0.5]),
        torch.tensor(0.5, requires_grad=True),
    )
    for eps in refused:
        with pytest.raises(TypeError, match=f"{fn}\\(\\): argument 'eps'"):
            _norm_call(fn, x, (8,), eps=eps)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64])
@pytest.mark.parametrize("with_weight", [True, False])
def test_layer_norm_of_non_floating_input_refused_as_torch(
    dtype, with_weight, device
):
    # with a float weight torch's CPU kernel refuses the mixed dtypes
    # (RuntimeError) before it finds no kernel (NotImplementedError, which
    # its CUDA kernel raises); gemsops raises what torch raises there
    x = torch.ones(2, 4, dtype=dtype, device=device)
    w = torch.ones(4, device=device) if with_weight else None
    F = torch.nn.functional
    for theirs, ours in (
        (
            lambda: F.layer_norm(x, (4,), w),
            lambda: gemsops.layer_norm(x, (4,), w),
        ),
        (
            lambda: F.layer_norm(x + x, (4,), w),
            lambda: gemsops.fused_add_layer_norm(x, x, (4,), w),
        ),
    ):
        want = raised_type(theirs)
        assert want in (RuntimeError, NotImplementedError)
        assert raised_type(ours) is want


@pytest.mark.parametrize("fn", NORMS)
def test_normalized_shape_past_int64_is_a_type_error(fn):
    # torch's argument parser cannot unpack it into int64: TypeError
    x = torch.randn(2, 4)
    for s in (2**70, -(2**70), 2**63):
        with pytest.raises(TypeError, match="normalized_shape"):
            _norm_call(fn, x, (s,))


@pytest.mark.parametrize("fn", ["rms_norm", "fused_add_rms_norm"])
def test_rms_input_with_too_few_dims_is_a_value_error(fn):
    for x, shape in (
        (torch.randn(2, 3, 4), (1, 2, 3, 4)),
        (torch.tensor(1.0), (1,)),
    ):
        with pytest.raises(ValueError):
            torch.nn.functional.rms_norm(x, shape)
        with pytest.raises(
            ValueError, match=f"{fn}\\(\\): Given normalized_shape"
        ):
            _norm_call(fn, x, shape)


def test_row_sums_may_not_alias_the_bias():
    # the sums are stored before the epilogue reads the bias
    a, b = np.ones((4, 3), np.float32), np.ones((3, 4), np.float32)
    out, shared = np.zeros((4, 4), np.float32), np.full(4, 100, np.float32)
    args = (a, b, out, 0, 0, 0, 0, None, None, 0, 0, None)
    with pytest.raises(RuntimeError, match="'row_sums' overlaps input 'bias'"):
        _C.matmul(*args, shared, 1.0, 1.0, shared)
    sums = np.zeros(4, np.float32)
    _C.matmul(*args, shared, 1.0, 1.0, sums)
    np.testing.assert_array_equal(out, np.full((4, 4), 103, np.float32))
    np.testing.assert_array_equal(sums, np.full(4, 3, np.float32))
