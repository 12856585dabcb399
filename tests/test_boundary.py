"""The C boundary never writes outside an output, never writes read-only
memory, never reads a tensor as other values than it holds, and depends on
no unchecked precondition of the caller's buffers."""

import ast
import math
import pathlib

import numpy as np
import pytest
import torch

import gemsops
from gemsops import _C
from gemsops.testing import assert_mm_close


def _ln_fwd_args(x, out, mean=None, rstd=None):
    return (x, None, None, 1, 1e-5, out, mean, rstd)


def _guarded(shape, dtype=np.float32, reverse_rows=False):
    """A NumPy output view inside a NaN-filled buffer with guard rows around
    it; returns (buffer, view)."""
    rows, cols = shape
    buf = np.full((rows + 4, cols), np.nan, dtype=dtype)
    view = buf[2 : rows + 2]
    if reverse_rows:
        view = view[::-1]
    return buf, view


def test_negative_stride_output_is_refused_and_untouched():
    x = torch.randn(6, 8)
    buf, out = _guarded((6, 8), reverse_rows=True)
    before = buf.copy()
    with pytest.raises(ValueError, match="'out' has a negative stride"):
        _C.layer_norm_fwd(*_ln_fwd_args(x, out))
    np.testing.assert_array_equal(np.isnan(buf), np.isnan(before))


def test_negative_stride_everywhere_is_refused():
    a = np.random.rand(6, 8).astype(np.float32)
    x = torch.randn(6, 8)
    g = torch.randn(6, 8)
    mean, rstd = torch.empty(6), torch.empty(6)
    _C.layer_norm_fwd(x, None, None, 1, 1e-5, torch.empty(6, 8), mean, rstd)
    dx = np.full((6, 8), np.nan, np.float32)[::-1]
    with pytest.raises(ValueError, match="negative stride"):
        _C.layer_norm_bwd(
            g, x, None, 1, False, mean, rstd, dx, None, None, None
        )
    with pytest.raises(ValueError, match="'input' has a negative stride"):
        _C.prod(a[:, ::-1], 1, np.empty(6, np.float32), None)
    with pytest.raises(ValueError, match="'b' has a negative stride"):
        _C.matmul(
            a,
            a.T[::-1],
            np.empty((6, 6), np.float32),
            0,
            0,
            0,
            0,
            None,
            None,
            0,
            0,
            None,
        )
    # a size-1 dim may carry any stride: nothing is ever stepped over it
    one = np.ones((1, 8), np.float32)[::-1]
    _C.prod(one, 1, np.empty(1, np.float32), None)


def _read_only_arrays(tmp_path, n):
    ro = np.full(n, np.nan, np.float32)
    ro.flags.writeable = False
    over_bytes = np.frombuffer(bytes(4 * n), dtype=np.float32)
    path = tmp_path / "map.bin"
    path.write_bytes(bytes(4 * n))
    mapped = np.memmap(path, dtype=np.float32, mode="r", shape=(n,))
    return {"writeable=False": ro, "bytes": over_bytes, "memmap r": mapped}


def test_read_only_outputs_are_refused(tmp_path):
    x = torch.randn(3, 4)
    for name, arr in _read_only_arrays(tmp_path, 12).items():
        before = np.array(arr, copy=True)
        with pytest.raises(ValueError, match="read-only"):
            _C.prod(x, 1, arr[:3], None)
        with pytest.raises(ValueError, match="read-only"):
            _C.prod_bwd(x, 1, torch.ones(3), arr.reshape(3, 4), None)
        with pytest.raises(ValueError, match="read-only"):
            _C.layer_norm_fwd(*_ln_fwd_args(x, arr.reshape(3, 4)))
        with pytest.raises(ValueError, match="read-only"):
            _C.matmul(
                x,
                x.t().contiguous(),
                arr[:9].reshape(3, 3),
                0,
                0,
                0,
                0,
                None,
                None,
                0,
                0,
                None,
            )
        np.testing.assert_array_equal(np.isnan(arr), np.isnan(before), name)
        np.testing.assert_array_equal(
            np.nan_to_num(arr), np.nan_to_num(before), name
        )
    # read-only inputs are fine
    ro = np.random.rand(3, 4).astype(np.float32)
    ro.flags.writeable = False
    out = np.empty(3, np.float32)
    _C.prod(ro, 1, out, None)
    np.testing.assert_allclose(out, ro.prod(1), rtol=1e-6)


def test_lazily_negated_tensors_are_refused_at_C():
    x = torch.randn(4, 8)
    neg = torch._neg_view(x)
    z = torch.randn(4, 8, dtype=torch.complex64)
    conj_imag = z.conj().imag
    assert neg.is_neg() and conj_imag.is_neg()
    for t in (neg, conj_imag):
        with pytest.raises(RuntimeError, match="negative bit"):
            _C.prod(t, 1, torch.empty(4), None)
        with pytest.raises(RuntimeError, match="negative bit"):
            _C.layer_norm_fwd(*_ln_fwd_args(t, torch.empty(4, 8)))
        out = torch._neg_view(torch.empty(4, 8))
        with pytest.raises(RuntimeError, match="'out' has the negative bit"):
            _C.layer_norm_fwd(*_ln_fwd_args(x, out))
    # resolved, the same values go through
    out = torch.empty(4)
    _C.prod(neg.resolve_neg(), 1, out, None)
    torch.testing.assert_close(out, (-x).prod(1))


@pytest.mark.parametrize("eps", [-1.0, -1e-30, float("nan"), 0.0])
def test_any_eps_as_torch(eps):
    x = torch.randn(5, 16, dtype=torch.float64)
    x[2] = 3.0  # a constant row: variance 0, so eps decides
    out = torch.empty_like(x)
    mean, rstd = (
        torch.empty(5, dtype=torch.float64),
        torch.empty(5, dtype=torch.float64),
    )
    _C.layer_norm_fwd(x, None, None, 1, eps, out, mean, rstd)
    ref, rmean, rrstd = torch.native_layer_norm(x, (16,), None, None, eps)
    torch.testing.assert_close(out, ref, equal_nan=True)
    torch.testing.assert_close(rstd, rrstd.view(-1), equal_nan=True)


def _bwd_call(device, rows, cols, ws=None, stream_arg=(), dtype=torch.float32):
    x = torch.randn(rows, cols, device=device, dtype=dtype)
    w = torch.randn(cols, device=device, dtype=dtype)
    g = torch.randn(rows, cols, device=device, dtype=dtype)
    mean = torch.empty(rows, device=device)
    rstd = torch.empty(rows, device=device)
    if rows:
        _C.layer_norm_fwd(x, w, None, 1, 1e-5, torch.empty_like(x), mean, rstd)
    dx = torch.full_like(x, float("nan"))
    dw = torch.full_like(w, float("nan"))
    db = torch.full_like(w, float("nan"))
    r = _C.layer_norm_bwd(
        g, x, w, 1, False, mean, rstd, dx, dw, db, ws, *stream_arg
    )
    return r, (x, w, g, mean, rstd), (dx, dw, db)


def test_backward_over_no_rows_gives_zero_weight_grads(device):
    r, _, (dx, dw, db) = _bwd_call(device, 0, 37)
    assert r is None
    assert dx.shape == (0, 37)
    assert torch.equal(dw.cpu(), torch.zeros(37))
    assert torch.equal(db.cpu(), torch.zeros(37))


def _check_bwd(x, w, g, mean, rstd, dx, dw, db):
    cols = x.shape[1]
    ref = torch.ops.aten.native_layer_norm_backward(
        g.double(),
        x.double(),
        [cols],
        mean.double()[:, None],
        rstd.double()[:, None],
        w.double(),
        w.double(),
        [True, True, True],
    )
    for o, e in zip((dx, dw, db), ref):
        torch.testing.assert_close(o.double(), e, rtol=1e-4, atol=1e-4)


@pytest.mark.cuda
def test_cuda_kept_workspace_with_garbage_is_prepared_by_the_launch():
    """A caller passing its own (non-zero) workspace under the kept
    protocol gets right dW/dB: C vouches only for buffers it prepared."""
    stream = torch.cuda.current_stream().cuda_stream
    rows, cols = 300, 4096
    need, _, _ = _bwd_call("cuda", rows, cols, None, (-1,))
    nbytes = need[0]
    for _trial in range(3):
        ws = torch.randint(1, 255, (nbytes,), dtype=torch.uint8, device="cuda")
        r, (x, w, g, mean, rstd), (dx, dw, db) = _bwd_call(
            "cuda", rows, cols, ws, (stream,)
        )
        assert r is None
        _check_bwd(x, w, g, mean, rstd, dx, dw, db)
        # the same object written through torch is no longer vouched for
        ws.fill_(7)
        r, (x, w, g, mean, rstd), (dx, dw, db) = _bwd_call(
            "cuda", rows, cols, ws, (stream,)
        )
        _check_bwd(x, w, g, mean, rstd, dx, dw, db)


@pytest.mark.cuda
def test_cuda_kept_workspace_used_as_scratch_is_no_longer_vouched_for():
    """A launch given the kept buffer with no stream (a scratch launch)
    leaves the split rows' exchange slots dirty; the next kept launch must
    not take them for zeros (a fuzz case: wrong dB after such a call)."""
    stream = torch.cuda.current_stream().cuda_stream
    rows, cols = 2, 65536  # rows split across CTAs: the exchange is used
    need, _, _ = _bwd_call("cuda", rows, cols, None, (-1,))
    ws = torch.empty(need[0], dtype=torch.uint8, device="cuda")
    for stream_arg in ((stream,), (), (stream,), (stream,)):
        r, inputs, grads = _bwd_call("cuda", rows, cols, ws, stream_arg)
        assert r is None
        _check_bwd(*inputs, *grads)


@pytest.mark.cuda
def test_cuda_streamk_flags_holding_the_epoch_are_reset():
    """Flags full of the epoch value would let an owner read its peers'
    partials before they are written; C zeroes flags it cannot vouch for."""
    a = torch.randn(3 * 128, 40 * 64, device="cuda", dtype=torch.float16)
    b = torch.randn(40 * 64, 2 * 128, device="cuda", dtype=torch.float16)
    out = torch.full(
        (a.shape[0], b.shape[1]),
        float("nan"),
        device="cuda",
        dtype=torch.float16,
    )
    need = _C.matmul(a, b, out, 2, 0, 0, 0, None, None, 0, 0, None)
    assert need is not None, "a Stream-K launch must ask for flags"
    nbytes, nflags, _ = need
    ws = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    outs = []
    for epoch in (5, 6, 5):
        flags = torch.full((nflags,), epoch, dtype=torch.int32, device="cuda")
        out.fill_(float("nan"))
        _C.matmul(a, b, out, 2, 0, 0, 0, ws, flags, epoch, 0, None)
        assert_mm_close(out, a, b, torch.float16)
        outs.append(out.clone())
    # one schedule, one order of the fix-up's sums: the same bits each time
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


@pytest.mark.cuda
def test_cuda_streamk_flags_of_epoch_0_are_the_launchs_alone():
    """epoch 0: flags for this launch alone (a CUDA graph trees warm-up's,
    from the graph's pool): the launch zeroes them whatever they hold and
    C keeps no record of them (a record holds a reference, which pinned
    the graph's memory); every call is right, and the flags object is
    freed once the caller drops it."""
    import gc
    import weakref

    a = torch.randn(3 * 128, 40 * 64, device="cuda", dtype=torch.float16)
    b = torch.randn(40 * 64, 2 * 128, device="cuda", dtype=torch.float16)
    out = torch.empty(a.shape[0], b.shape[1], device="cuda", dtype=a.dtype)
    need = _C.matmul(a, b, out, 2, 0, 0, 0, None, None, 0, 0, None)
    assert need is not None, "a Stream-K launch must ask for flags"
    nbytes, nflags, _ = need
    ws = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    for fill in (1, 0, 2):
        # 1: the epoch the launch runs at, as if every peer had published
        flags = torch.full((nflags,), fill, dtype=torch.int32, device="cuda")
        out.fill_(float("nan"))
        assert _C.matmul(a, b, out, 2, 0, 0, 0, ws, flags, 0, 0, None) is None
        assert_mm_close(out, a, b, torch.float16)
        gone = weakref.ref(flags)
        del flags
        gc.collect()
        assert gone() is None, "C kept a reference to epoch-0 flags"


@pytest.mark.cuda
def test_cuda_streamk_buffers_too_small_are_asked_for_again():
    """A workspace or flags smaller than the launch needs (a caller's kept
    buffers, offered before it knew the plan) launch nothing: C answers
    with what it needs, as when offered none, and the output stays as it
    was; with enough, the launch runs."""
    a = torch.randn(3 * 128, 40 * 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(40 * 64, 2 * 128, device="cuda", dtype=torch.bfloat16)
    out = torch.full(
        (a.shape[0], b.shape[1]), 7.0, device="cuda", dtype=torch.bfloat16
    )
    need = _C.matmul(a, b, out, 2, 0, 0, 0, None, None, 0, 0, None)
    assert need is not None, "a Stream-K launch must ask for flags"
    nbytes, nflags, _ = need
    flags = torch.zeros(nflags, dtype=torch.int32, device="cuda")
    ws = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    small = (
        (ws[: nbytes - 16], flags),
        (ws, flags[: nflags - 1] if nflags > 1 else flags[:0]),
    )
    for epoch, (w, f) in enumerate(small, 1):
        got = _C.matmul(a, b, out, 2, 0, 0, 0, w, f, epoch, 0, None)
        assert got == need
        torch.cuda.synchronize()
        assert bool((out == 7.0).all()), "nothing may launch"
    assert _C.matmul(a, b, out, 2, 0, 0, 0, ws, flags, 3, 0, None) is None
    assert_mm_close(out, a, b, torch.bfloat16)


@pytest.mark.cuda
def test_cuda_matmul_error_tensor_needs_an_element():
    a = torch.randn(64, 64, device="cuda")
    out = torch.full_like(a, float("nan"))
    with pytest.raises(RuntimeError, match="'error' must have at least"):
        _C.matmul(
            a,
            a,
            out,
            0,
            0,
            0,
            0,
            None,
            None,
            0,
            5,
            torch.empty(0, dtype=torch.int32, device="cuda"),
        )
    assert out.isnan().all()


@pytest.mark.parametrize(
    "entry", ["linear", "linear_grad_input", "linear_grad_weight"]
)
def test_linear_products_refuse_what_matmul_refuses(entry, device):
    """nn.Linear's three C products view their tensors before the checks:
    an output over an input, a negative stride, mixed dtypes and a
    read-only output are refused as matmul() refuses them (named as the
    entry calls them), and nothing is written."""
    call = getattr(_C, entry)
    launch = (1, 0, 0, 1, None, None, 0, 0, None)
    first = {"linear": "input", "linear_grad_input": "grad"}.get(entry, "grad")
    second = "input" if entry == "linear_grad_weight" else "weight"
    # the operands as the layer holds them: [*, in] or [*, out], [out, in]
    shapes = {
        "linear": ((2, 3, 8), (4, 8), (2, 3, 4)),
        "linear_grad_input": ((2, 3, 4), (4, 8), (2, 3, 8)),
        "linear_grad_weight": ((2, 3, 4), (2, 3, 8), (4, 8)),
    }[entry]
    buf = torch.randn(256, device=device)
    a = buf[: math.prod(shapes[0])].view(shapes[0])
    b = torch.randn(shapes[1], device=device)
    out = buf[-math.prod(shapes[2]) :].view(shapes[2])
    call(a, b, out, *launch)  # apart: fine
    before = buf.clone()
    over = buf[: math.prod(shapes[2])].view(shapes[2])  # over a
    with pytest.raises(RuntimeError, match=f"'out' overlaps input '{first}'"):
        call(a, b, over, *launch)
    with pytest.raises(RuntimeError, match="same dtype"):
        call(a, b.half(), out, *launch)
    assert torch.equal(buf, before)
    if device == "cpu":  # torch makes no negative strides: NumPy does
        with pytest.raises(ValueError, match=f"'{second}' has a negative"):
            call(a, b.numpy()[::-1], out, *launch)
        arr = np.full(math.prod(shapes[2]), np.nan, np.float32)
        arr.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            call(a, b, arr.reshape(shapes[2]), *launch)


def _stubs():
    """gemsops/_C.pyi's functions and their parameters, and its other
    names (the products typed by a Protocol)."""
    path = pathlib.Path(gemsops.__file__).with_name("_C.pyi")
    tree = ast.parse(path.read_text())
    funcs, others = {}, set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            a = node.args
            funcs[node.name] = (len(a.args) - len(a.defaults), len(a.args))
        elif isinstance(node, ast.AnnAssign):
            others.add(node.target.id)
    return funcs, others


def test_the_stubs_name_every_extension_function():
    funcs, others = _stubs()
    public = {n for n in dir(_C) if not n.startswith("_")}
    public = {n for n in public if callable(getattr(_C, n))}
    assert public == set(funcs) | others


def test_the_stubs_count_each_functions_arguments():
    # every _C function refuses a call without arguments by naming the
    # count it takes: the stub's (required, or required or all)
    for name, (required, total) in _stubs()[0].items():
        if total == 0:
            continue
        with pytest.raises(TypeError) as info:
            getattr(_C, name)()
        if required == total:
            words = "exactly one" if total == 1 else f"takes {total} "
        else:
            words = f"takes {required} or {total} arguments"
        assert words in str(info.value), (name, str(info.value))
