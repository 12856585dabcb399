"""What the norms (LayerNorm, RMSNorm and their fused residual adds)
share in their arguments: torch's rules for normalized_shape, eps and the
parameters, with its exceptions and messages; the rows' layout the
kernels read in place; the statistics' dtype and shape."""

import math
import operator

import numpy as _np
import torch

from .._dispatch import MAX_DIMS, not_tensor, plain

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def normalized_shape_arg(normalized_shape, fn="layer_norm"):
    """A list or tuple of ints, as torch's argument parser takes it (an
    int, a float, an ndarray or a Tensor is a TypeError there)."""
    if isinstance(normalized_shape, (tuple, list)):
        shape = tuple(normalized_shape)
        for s in shape:
            if type(s) is not int or not _INT64_MIN <= s <= _INT64_MAX:
                return tuple(
                    _shape_item(v, i, fn) for i, v in enumerate(shape)
                )
        return shape
    raise TypeError(
        f"{fn}(): argument 'normalized_shape' must be tuple of "
        f"ints, not {type(normalized_shape).__name__}"
    )


def _shape_item(s, i, fn):
    # torch takes what has __index__ (NumPy integers, one-element integer
    # tensors), but not bools, nor what overflows int64
    if not isinstance(s, bool):
        try:
            v = operator.index(s)
        except TypeError:
            pass
        else:
            if _INT64_MIN <= v <= _INT64_MAX:
                return v
            raise TypeError(
                f"{fn}(): argument 'normalized_shape' has {v} at pos {i}, "
                "which overflows int64"
            )
    raise TypeError(
        f"{fn}(): argument 'normalized_shape' must be tuple of "
        f"ints, but found element of type {type(s).__name__} at "
        f"pos {i}"
    )


def check_shape(x, shape, fn="layer_norm", few_dims=RuntimeError):
    # RuntimeError, as torch raises for these; few_dims for an input of
    # fewer dims than shape (torch's rms_norm: ValueError)
    if len(shape) == 0:
        raise RuntimeError(
            f"{fn}(): Expected normalized_shape to be at least "
            "1-dimensional, i.e., containing at least one element, but got "
            f"normalized_shape = {list(shape)}"
        )
    few = x.dim() < len(shape)
    if few or x.shape[x.dim() - len(shape) :] != shape:
        raise (few_dims if few else RuntimeError)(
            f"{fn}(): Given normalized_shape={list(shape)}, expected "
            f"input with shape [*, {', '.join(map(str, shape))}], but got "
            f"input of size{list(x.shape)}"
            + (" (fewer dimensions than normalized_shape)" if few else "")
        )


def rows_view_ok(x, nd):
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


def as_rows(x, nd):
    if x.is_contiguous() or rows_view_ok(x, nd):
        return x
    return x.contiguous()


def folds_leading_dims(x, nd):
    """x has more dimensions than C takes and fewer normalized ones, so
    that folding its leading dims into one (rows_of) brings it within C's
    bound. What the folded call returns comes back whole through
    unsafe_view, except a tensor its backward saves (native_layer_norm's
    statistics, the fused adds' h): that one as a view, whose in-place
    writes autograd then sees."""
    return x.dim() > MAX_DIMS and nd < MAX_DIMS


def rows_of(x, nd):
    """x [*, *normalized] as [rows, *normalized] (a view where its layout
    allows): the rows the kernels see, for an input of too many dims."""
    lead = x.dim() - nd
    return x.reshape(math.prod(x.shape[:lead]), *x.shape[lead:])


def param(p):
    if p is None:
        return p
    p = plain(p)
    return p if p.is_contiguous() else p.contiguous()


def stats_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def stat_view_shape(x, nd):
    return tuple(x.shape[: x.dim() - nd]) + (1,) * nd


def prepare(
    input,
    normalized_shape,
    weight,
    bias,
    fn="layer_norm",
    few_dims=RuntimeError,
):
    if not isinstance(input, torch.Tensor):
        raise TypeError(
            f"{fn}(): argument 'input' must be a Tensor, not "
            f"{type(input).__name__}"
        )
    if weight is not None and not isinstance(weight, torch.Tensor):
        raise not_tensor(fn, "weight", weight, " or None")
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise not_tensor(fn, "bias", bias, " or None")
    shape = normalized_shape_arg(normalized_shape, fn)
    check_shape(input, shape, fn, few_dims)
    return plain(input), shape, param(weight), param(bias)


def prepare_layer_norm(input, normalized_shape, weight, bias, fn="layer_norm"):
    """prepare, and torch's CPU LayerNorm's refusal of a non-floating
    input beside a weight or bias of another dtype: RuntimeError, raised
    before it finds no kernel (NotImplementedError, which its CUDA kernel
    raises, as C)."""
    input, shape, weight, bias = prepare(
        input, normalized_shape, weight, bias, fn
    )
    if (
        not input.is_floating_point()
        and input.device.type == "cpu"
        and any(
            p is not None and p.dtype != input.dtype for p in (weight, bias)
        )
    ):
        raise RuntimeError(
            f"{fn}(): mixed dtype (CPU): input is {input.dtype}, weight "
            f"{None if weight is None else weight.dtype}, bias "
            f"{None if bias is None else bias.dtype}; all must be one dtype"
        )
    return input, shape, weight, bias


def eps_arg(eps, fn, alt=""):
    """eps as a float, taken as torch's float arguments take it: a Python
    real or a NumPy scalar (bool too; a complex one through its __float__,
    which warns that the imaginary part is dropped, as under torch) or a 0-d
    tensor that does not require grad (a complex one with no imaginary
    part); anything else is a TypeError naming fn (C would take any object
    with __float__)."""
    if isinstance(eps, (torch.SymFloat, torch.SymInt)):
        return eps  # a compiled function's symbolic argument
    if isinstance(eps, (int, float, _np.generic)):
        return float(eps)
    if (
        isinstance(eps, torch.Tensor)
        and eps.dim() == 0
        and not eps.requires_grad
    ):
        if not eps.is_complex():
            return float(eps)
        value = complex(eps)  # torch's parser: the real part, if exact
        if value.imag != 0:
            raise RuntimeError(
                f"{fn}(): eps {value} cannot be converted to type double "
                "without overflow"
            )
        return value.real
    raise TypeError(
        f"{fn}(): argument 'eps' must be float{alt}, not {type(eps).__name__}"
    )


_FLOATING = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_traced(x, shape, params, fn):
    """The C boundary's rules for the arguments where C does not see them
    (torch's ops under forward-mode AD and functorch, the ops' fake
    kernels under meta and fake tensors), with its exceptions and
    messages: x a floating tensor, each parameter (name, tensor or None)
    of normalized_shape's shape and of x's dtype (or fp32 beside a half
    x) and device."""
    if x.dtype not in _FLOATING:
        raise NotImplementedError(
            f"{fn}(): argument 'input' must be a floating point tensor "
            "(float16, bfloat16, float32 or float64), got "
            + str(x.dtype).removeprefix("torch.")
        )
    half = x.dtype in (torch.float16, torch.bfloat16)
    for name, p in params:
        if p is None:
            continue
        if tuple(p.shape) != tuple(shape):
            raise RuntimeError(
                f"{fn}(): Expected {name} to be of same shape as "
                f"normalized_shape, but got {name} of shape "
                f"{list(p.shape)} and normalized_shape = {list(shape)}"
            )
        if p.dtype != x.dtype and not (half and p.dtype == torch.float32):
            want = str(x.dtype).removeprefix("torch.")
            raise RuntimeError(
                f"{fn}(): argument '{name}' has dtype "
                f"{str(p.dtype).removeprefix('torch.')}; expected "
                + (f"{want} or float32" if half else want)
            )
        if p.device != x.device:
            raise RuntimeError(
                f"{fn}(): Expected all tensors to be on the same device, "
                f"but '{name}' is on {p.device} and 'input' is on {x.device}"
            )


def check_one_device(fn, x, named):
    """Every tensor of named ((name, tensor) pairs, None allowed) on x's
    device, else torch's RuntimeError. The fake kernels' check: a call
    mixing meta and real tensors reaches them with real tensors beside
    the meta ones, and would return unfilled ones."""
    for name, t in named:
        if t is not None and t.device != x.device:
            raise RuntimeError(
                f"{fn}(): Expected all tensors to be on the same device, "
                f"but '{name}' is on {t.device} and 'input' is on {x.device}"
            )


def needs_grad(input, weight, bias):
    return torch.is_grad_enabled() and (
        input.requires_grad
        or (weight is not None and weight.requires_grad)
        or (bias is not None and bias.requires_grad)
    )
