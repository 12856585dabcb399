"""LayerNorm: torch.nn.functional.layer_norm / torch.native_layer_norm
semantics over gemsops._C's forward and fused backward kernels.

The Python layer allocates every output and workspace with torch (so they
come from torch's caching allocator on the right device) and passes them
down; the C side validates and launches on torch's current stream."""
import math
import operator

import torch

from .. import _C

# forward: workspace bytes per (dtype, shape, ...), planned once by C
_fwd_ws = {}
# backward: device -> (stream handle, uint8 workspace), the one last used,
# and (device, stream) -> workspace for every stream seen. A workspace is
# zeros when made and each launch leaves its dW/dB accumulators zero again
# (kept_zero in C), so a backward costs no memset and no allocation.
_bwd_last = {}
_bwd_kept = {}


def _normalized_shape(normalized_shape, fn="layer_norm"):
    """A list or tuple of ints, as torch's argument parser takes it (an
    int, a float, an ndarray or a Tensor is a TypeError there)."""
    if isinstance(normalized_shape, (tuple, list)):
        shape = tuple(normalized_shape)
        for s in shape:
            if type(s) is not int:
                return tuple(_shape_item(v, i, fn)
                             for i, v in enumerate(shape))
        return shape
    raise TypeError(f"{fn}(): argument 'normalized_shape' must be tuple of "
                    f"ints, not {type(normalized_shape).__name__}")


def _shape_item(s, i, fn):
    # torch takes what has __index__ (NumPy integers, one-element integer
    # tensors), but not bools
    if not isinstance(s, bool):
        try:
            return operator.index(s)
        except TypeError:
            pass
    raise TypeError(f"{fn}(): argument 'normalized_shape' must be tuple of "
                    f"ints, but found element of type {type(s).__name__} at "
                    f"pos {i}")


def _check_shape(x, shape, fn="layer_norm"):
    # RuntimeError, as torch raises for these
    if len(shape) == 0:
        raise RuntimeError(
            f"{fn}(): Expected normalized_shape to be at least "
            "1-dimensional, i.e., containing at least one element, but got "
            f"normalized_shape = {list(shape)}")
    if x.dim() < len(shape) or x.shape[x.dim() - len(shape):] != shape:
        raise RuntimeError(
            f"{fn}(): Given normalized_shape={list(shape)}, expected "
            f"input with shape [*, {', '.join(map(str, shape))}], but got "
            f"input of size{list(x.shape)}")


def _rows_view_ok(x, nd):
    """True when x is [rows, cols] with contiguous rows of one stride, the
    layout the kernels read in place (mirrors csrc/py_layer_norm.c's
    row_view; a negative stride, which torch never makes, is copied)."""
    shape, strides = x.shape, x.stride()
    expect = 1
    for i in range(x.dim() - 1, x.dim() - nd - 1, -1):
        if shape[i] != 1 and strides[i] != expect:
            return False
        expect *= shape[i]
    row_stride = inner = None
    for i in range(x.dim() - nd - 1, -1, -1):
        if shape[i] == 1:
            continue
        if row_stride is None:
            row_stride, inner = strides[i], shape[i] * strides[i]
        elif strides[i] != inner:
            return False
        else:
            inner *= shape[i]
    return row_stride is None or row_stride >= expect


def _rows(x, nd):
    if x.is_contiguous() or _rows_view_ok(x, nd):
        return x
    return x.contiguous()


def _plain(t):
    """t without the negative bit (torch._neg_view, z.conj().imag): C
    reads raw memory, so it must be given the values themselves. The conj
    bit exists only on complex tensors, which the kernels refuse."""
    return t.resolve_neg() if t.is_neg() else t


def _param(p):
    if p is None:
        return p
    if p.is_neg():
        p = p.resolve_neg()
    return p if p.is_contiguous() else p.contiguous()


def _stats_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _forward(x, shape, weight, bias, eps, want_stats=True):
    """Returns (out, mean, rstd); mean/rstd flat [M], or None when not
    wanted (inference skips allocating them)."""
    nd = len(shape)
    if not x.is_contiguous() and not _rows_view_ok(x, nd):
        x = x.contiguous()
    # empty_like: ~1 µs less host time per call than empty(shape, ...)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    mean = rstd = None
    if want_stats:  # two allocations cost less than one plus two views
        rows = math.prod(x.shape[:x.dim() - nd])
        sd = _stats_dtype(x.dtype)
        mean = torch.empty(rows, dtype=sd, device=x.device)
        rstd = torch.empty(rows, dtype=sd, device=x.device)
    if x.numel() == 0:
        # nothing to compute, but C checks the arguments as for any size
        _C.layer_norm_fwd(x, weight, bias, nd, eps, out, mean, rstd, None)
        if want_stats:  # as torch: the mean of no values 0, the rstd NaN
            mean.zero_()
            rstd.fill_(float("nan"))
        return out, mean, rstd
    ws = None
    if x.is_cuda:
        key = (x.dtype, x.shape, nd, x.device.index)
        nbytes = _fwd_ws.get(key)
        if nbytes is None:
            nbytes = _fwd_ws[key] = _C.layer_norm_fwd_workspace(
                x, weight, bias, nd)
        if nbytes:
            ws = torch.zeros(nbytes, dtype=torch.uint8, device=x.device)
    _C.layer_norm_fwd(x, weight, bias, nd, eps, out, mean, rstd, ws)
    return out, mean, rstd


def _backward(grad_out, x, shape, weight, mean, rstd, want_dx, want_dw,
              want_db, deterministic=None):
    nd = len(shape)
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    x = _rows(x, nd)
    grad_out = _rows(_plain(grad_out), nd)
    pdtype = weight.dtype if weight is not None else x.dtype
    dx = (torch.empty_like(x, memory_format=torch.contiguous_format)
          if want_dx else None)
    if x.numel() == 0:
        # dW/dB sum over no rows: zeros, which a CUDA launch would not
        # write; C still checks the arguments as for any size
        dw = torch.zeros(shape, dtype=pdtype, device=x.device) if want_dw else None
        db = torch.zeros(shape, dtype=pdtype, device=x.device) if want_db else None
        _C.layer_norm_bwd(grad_out, x, weight, nd, deterministic, mean, rstd,
                          dx, dw, db, None)
        return dx, dw, db
    dw = torch.empty(shape, dtype=pdtype, device=x.device) if want_dw else None
    db = torch.empty(shape, dtype=pdtype, device=x.device) if want_db else None
    if not (want_dx or want_dw or want_db):
        return dx, dw, db
    if not x.is_cuda:
        _C.layer_norm_bwd(grad_out, x, weight, nd, deterministic, mean, rstd,
                          dx, dw, db, None)
        return dx, dw, db
    device = x.get_device()
    stream, ws = _bwd_last.get(device, (-1, None))
    try:
        need = _C.layer_norm_bwd(grad_out, x, weight, nd, deterministic, mean,
                                 rstd, dx, dw, db, ws, stream)
        if need is not None:  # first use, larger, or another stream
            stream, ws = _kept_workspace(device, *need)
            _C.layer_norm_bwd(grad_out, x, weight, nd, deterministic, mean,
                              rstd, dx, dw, db, ws, stream)
    except BaseException:
        # a failed launch may leave accumulators non-zero: start afresh
        _bwd_last.pop(device, None)
        for key in [k for k in _bwd_kept if k[0] == device]:
            del _bwd_kept[key]
        raise
    return dx, dw, db


def _kept_workspace(device, nbytes, stream):
    """The kept (all-zero) backward workspace of `stream`, grown to
    nbytes; it becomes the device's last used."""
    ws = _bwd_kept.get((device, stream))
    if ws is None or ws.numel() < nbytes:
        ws = torch.zeros(max(nbytes, 4096), dtype=torch.uint8, device=device)
        _bwd_kept[(device, stream)] = ws
    _bwd_last[device] = (stream, ws)
    return stream, ws


class LayerNormFunction(torch.autograd.Function):
    """Forward through layer_norm_fwd; backward through the ONE fused
    kernel (dx + atomic dW/dB), computing only the gradients autograd
    asks for."""

    @staticmethod
    def forward(ctx, x, shape, weight, bias, eps, stats):
        out, mean, rstd = _forward(x, shape, weight, bias, eps)
        ctx.shape = shape
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, weight, mean, rstd)
        if not stats:
            return out
        # as torch.native_layer_norm: differentiable through out only
        ctx.mark_non_differentiable(mean, rstd)
        return out, mean, rstd

    @staticmethod
    def backward(ctx, grad_out, *_):
        x, weight, mean, rstd = ctx.saved_tensors
        want_dx, _, want_dw, want_db, _, _ = ctx.needs_input_grad
        dx, dw, db = _backward(grad_out, x, ctx.shape, weight, mean, rstd,
                               want_dx, want_dw and weight is not None,
                               want_db and ctx.has_bias)
        return dx, None, dw, db, None, None


def _prepare(input, normalized_shape, weight, bias, fn="layer_norm"):
    if not isinstance(input, torch.Tensor):
        raise TypeError(f"{fn}(): argument 'input' must be a Tensor, not "
                        f"{type(input).__name__}")
    if weight is not None and not isinstance(weight, torch.Tensor):
        raise _not_tensor(TypeError, fn, "weight", weight, " or None")
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise _not_tensor(TypeError, fn, "bias", bias, " or None")
    shape = _normalized_shape(normalized_shape, fn)
    _check_shape(input, shape, fn)
    if input.is_neg():
        input = input.resolve_neg()
    return input, shape, _param(weight), _param(bias)


def _not_tensor(exc, fn, name, value, alt=""):
    return exc(f"{fn}(): argument '{name}' must be a Tensor{alt}, not "
               f"{type(value).__name__}")


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Drop-in for torch.nn.functional.layer_norm. weight/bias may be fp32
    with fp16/bf16 input (mixed precision); the output has input's dtype."""
    input, shape, weight, bias = _prepare(input, normalized_shape, weight,
                                          bias)
    if _needs_grad(input, weight, bias):
        return LayerNormFunction.apply(input, shape, weight, bias, eps,
                                       False)
    return _forward(input, shape, weight, bias, eps, want_stats=False)[0]


def _needs_grad(input, weight, bias):
    return torch.is_grad_enabled() and (
        input.requires_grad
        or (weight is not None and weight.requires_grad)
        or (bias is not None and bias.requires_grad))


def native_layer_norm(input, normalized_shape, weight=None, bias=None,
                      eps=1e-5):
    """Like torch.native_layer_norm: (out, mean, rstd), statistics in fp32
    (fp64 for fp64 input) of shape input.shape[:-k] + (1,) * k;
    differentiable through out, as torch's."""
    input, shape, weight, bias = _prepare(input, normalized_shape, weight,
                                          bias)
    if _needs_grad(input, weight, bias):
        out, mean, rstd = LayerNormFunction.apply(input, shape, weight, bias,
                                                  eps, True)
    else:
        out, mean, rstd = _forward(input, shape, weight, bias, eps)
    stat_shape = tuple(input.shape[:input.dim() - len(shape)]) + (1,) * len(shape)
    return out, mean.view(stat_shape), rstd.view(stat_shape)


def layer_norm_backward(grad_out, input, normalized_shape, mean, rstd,
                        weight=None, bias=None,
                        output_mask=(True, True, True), deterministic=None):
    """Like torch.ops.aten.native_layer_norm_backward: (grad_input,
    grad_weight, grad_bias), each None where output_mask says so. mean and
    rstd may come in the input's half type, as torch's CPU
    native_layer_norm returns them; they are widened to fp32 first."""
    fn = "layer_norm_backward"
    normalized_shape = _backward_args(grad_out, input, normalized_shape, mean,
                                      rstd, weight, bias, output_mask)
    input, shape, weight, bias = _prepare(input, normalized_shape, weight,
                                          bias, fn)
    want_dx, want_dw, want_db = map(bool, output_mask)
    for want, name, p in ((want_dw, "weight", weight),
                          (want_db, "bias", bias)):
        if want and p is None:  # torch fails here too (RuntimeError)
            raise RuntimeError(f"{fn}(): output_mask asks for grad_{name} "
                               f"but {name} is None")
    sd = _stats_dtype(input.dtype)
    mean, rstd = (s.to(sd) if s.dtype in (torch.float16, torch.bfloat16)
                  and sd == torch.float32 else _plain(s) for s in (mean, rstd))
    return _backward(grad_out, input, shape, weight, mean.reshape(-1),
                     rstd.reshape(-1), want_dx, want_dw, want_db,
                     deterministic)


def _backward_args(grad_out, input, normalized_shape, mean, rstd, weight,
                   bias, output_mask):
    """Arguments torch.ops.aten.native_layer_norm_backward would not match
    to its schema raise RuntimeError, as there; returns normalized_shape as
    a sequence (that schema takes ndarrays and tensors too)."""
    fn = "layer_norm_backward"
    for name, t in (("grad_out", grad_out), ("input", input), ("mean", mean),
                    ("rstd", rstd)):
        if not isinstance(t, torch.Tensor):
            raise _not_tensor(RuntimeError, fn, name, t)
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise _not_tensor(RuntimeError, fn, name, t, " or None")
    if not isinstance(output_mask, (list, tuple)) or len(output_mask) != 3:
        raise RuntimeError(f"{fn}(): output_mask must be 3 bools, got "
                           f"{output_mask!r}")
    if hasattr(normalized_shape, "tolist"):
        normalized_shape = normalized_shape.tolist()
    try:
        return _normalized_shape(normalized_shape, fn)
    except TypeError as e:
        raise RuntimeError(str(e)) from None
