"""prod: torch.prod's signatures and dtype rules over gemsops._C.

Result dtypes as torch: bool and integer inputs give int64 (wrapping like
torch's int64 products); float inputs keep their dtype; dtype= casts the
input before multiplying and is the result's dtype. The backward is
zero-safe: exclusive prefix and suffix products, no division by x and no
host sync."""

import math
import sys
from typing import Optional

import torch
from torch.overrides import handle_torch_function

from .. import _C, _workspace
from .._dispatch import (
    MAX_DIMS,
    _strided,
    autocast_enabled,
    batched,
    define_op,
    eager,
    eager_apply,
    layout_refused,
    plain,
    register_autocast,
    tensor_like,
    torch_only,
    unsafe_view,
)
from ._aligned import call_aligned
from ._out import into as _into


def _scratch(kind, query, x, dim):
    """The launch's scratch: its size planned once per layout by C (the
    plan depends on the device's SM count), the buffer fresh."""
    if not x.is_cuda:
        return None
    key = (
        kind,
        x.dtype,
        x.shape,
        x.stride(),
        dim,
        x.device.index,
        x.data_ptr() % 16,
    )
    return _workspace.scratch(_workspace.planned(key, query, x, dim), x.device)


# dtype= may be one of these Python types, as torch takes it
_PY_DTYPES = {
    float: torch.float64,
    int: torch.int64,
    bool: torch.bool,
    complex: torch.complex128,
}


def _out_dtype(dtype):
    return dtype if dtype.is_floating_point else torch.int64


def _dtype(dtype):
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, type) and dtype in _PY_DTYPES:
        return _PY_DTYPES[dtype]
    raise TypeError(
        f"prod(): argument 'dtype' must be torch.dtype, not "
        f"{type(dtype).__name__}"
    )


def _normalize_dim(dim, ndim):
    if type(dim) is not int:
        dim = _index(dim)
    n = max(ndim, 1)
    if not -n <= dim < n:
        if not -(2**63) <= dim < 2**63:  # torch's parser: not an int64
            raise ValueError("prod(): Overflow when unpacking long long")
        raise IndexError(
            f"prod(): Dimension out of range (expected to be in "
            f"range of [{-n}, {n - 1}], but got {dim})"
        )
    return dim % n


def _index(dim):
    """dim as torch's parser takes an int: an int (not a bool), a NumPy
    integer or a 0-d integer tensor; anything else is a TypeError."""
    np = sys.modules.get("numpy")  # a NumPy integer implies NumPy is loaded
    if (
        (isinstance(dim, int) and not isinstance(dim, bool))
        or (np is not None and isinstance(dim, np.integer))
        or (
            isinstance(dim, torch.Tensor)
            and dim.dim() == 0
            and not dim.is_floating_point()
            and not dim.is_complex()
            and dim.dtype != torch.bool
        )
    ):
        return int(dim)
    raise TypeError(
        f"prod(): argument 'dim' must be int, not {type(dim).__name__}"
    )


def _forward(x, dim):
    """x: at least 1-D; dim: None or normalised. Returns the kept-dims
    result (no keepdim)."""
    out = torch.empty(
        _kept_shape(x, dim), dtype=_out_dtype(x.dtype), device=x.device
    )
    ws = _scratch("prod", _C.prod_workspace, x, dim)
    call_aligned(lambda x: _C.prod(x, dim, out, ws), x)
    return out


def _backward(x, dim, grad):
    if x.is_cuda:  # the CUDA backward reads [outer, dim, inner] rows
        x = x.contiguous()
    grad = plain(grad)
    grad_in = torch.empty_like(x, memory_format=torch.contiguous_format)
    ws = _scratch("prod_bwd", _C.prod_bwd_workspace, x, dim)
    call_aligned(
        lambda x, g: _C.prod_bwd(x, dim, g, grad_in, ws), x, grad.contiguous()
    )
    return grad_in


class ProdFunction(torch.autograd.Function):
    """The eager path; under create_graph the backward is the
    gemsops::prod_backward op, which is differentiable."""

    @staticmethod
    def forward(ctx, x, dim):
        ctx.dim = dim
        ctx.save_for_backward(x)
        return _forward(x, dim)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        if batched(grad):  # a vmap's gradients: torch's ops
            return _backward_composite(x, ctx.dim, grad), None
        if torch.is_grad_enabled():
            return _prod_backward_op(x, ctx.dim, grad), None
        return _backward(x, ctx.dim, grad), None


_prod_function = eager_apply(ProdFunction)


# ---- torch.library ops ---------------------------------------------------


def _kept_shape(x, dim):
    return () if dim is None else tuple(x.shape[:dim] + x.shape[dim + 1 :])


@define_op("prod")
def _prod_op(input: torch.Tensor, dim: Optional[int]) -> torch.Tensor:
    """The product of input (at least 1-D) over dim (normalised), or of
    all of it for None, without keepdim: int64 for bool and integer
    input, else input's dtype."""
    input = plain(input)
    return _forward(input, dim)


@_prod_op.register_fake
def _(input, dim):
    return input.new_empty(
        _kept_shape(input, dim), dtype=_out_dtype(input.dtype)
    )


def _prod_setup(ctx, inputs, output):
    ctx.dim = inputs[1]
    ctx.save_for_backward(inputs[0])


def _prod_grad(ctx, grad):
    (x,) = ctx.saved_tensors
    return _prod_backward_op(x, ctx.dim, grad), None


_prod_op.register_autograd(_prod_grad, setup_context=_prod_setup)


@_prod_op.register_composite
def _(input, dim):
    return torch.prod(input) if dim is None else torch.prod(input, dim)


@define_op("prod_backward")
def _prod_backward_op(
    input: torch.Tensor, dim: Optional[int], grad: torch.Tensor
) -> torch.Tensor:
    """d prod(input, dim) / d input times grad (the kept-dims shape):
    zero-safe, from exclusive prefix and suffix products."""
    input = plain(input)
    return _backward(input, dim, grad)


@_prod_backward_op.register_fake
def _(input, dim, grad):
    return torch.empty_like(input, memory_format=torch.contiguous_format)


def _exclusive_cumprod(x, d):
    ones = torch.ones_like(x.narrow(d, 0, 1))
    return torch.cat(
        [ones, torch.cumprod(x.narrow(d, 0, x.shape[d] - 1), d)], d
    )


def _backward_composite(x, dim, grad):
    """_prod_backward_op in differentiable torch ops: grad times the
    product of the other elements (prefix times suffix product)."""
    if x.numel() == 0:
        return torch.zeros_like(x) + grad.sum() * 0
    xf = x.reshape(-1) if dim is None else x
    d = 0 if dim is None else dim
    others = _exclusive_cumprod(xf, d) * _exclusive_cumprod(
        xf.flip(d), d
    ).flip(d)
    if dim is None:
        return (grad * others).reshape(x.shape)
    return grad.unsqueeze(d) * others


def _prod_backward_setup(ctx, inputs, output):
    ctx.dim = inputs[1]
    ctx.save_for_backward(inputs[0], inputs[2])


def _prod_backward_grad(ctx, gg):
    """Second order: the vector-Jacobian product of the composite."""
    x, grad = ctx.saved_tensors
    # torch.func.vjp keeps the result differentiable (third order and up)
    _, vjp = torch.func.vjp(
        lambda x, g: _backward_composite(x, ctx.dim, g), x, grad
    )
    dx, dg = vjp(gg)
    need = ctx.needs_input_grad
    return dx if need[0] else None, None, dg if need[2] else None


_prod_backward_op.register_autograd(
    _prod_backward_grad, setup_context=_prod_backward_setup
)
for _device in ("cpu", "cuda"):  # prod is on torch's fp32 autocast lists
    register_autocast(torch.ops.gemsops.prod.default, _device, "fp32")


# torch's unsigned types past uint8: their product in int64 wraps to the
# same bits (torch's result dtype)
_UNSIGNED_WIDE = tuple(
    getattr(torch, n)
    for n in ("uint16", "uint32", "uint64")
    if hasattr(torch, n)
)


def _prod_not_eager(x, d, dtype_given):
    """The op, or torch.prod where the op cannot serve (torch_only()). A
    dtype= given keeps its dtype under autocast, as torch's policy for
    prod (its fp32 cast is for calls without one)."""
    if torch_only():  # dtype= given: x has it, and it stays (autocast)
        kw = {"dtype": x.dtype} if dtype_given else {}
        return torch.prod(x, **kw) if d is None else torch.prod(x, d, **kw)
    if (
        dtype_given
        and x.device.type in ("cpu", "cuda")
        and autocast_enabled(x.device.type)
    ):
        with torch.autocast(x.device.type, enabled=False):
            return _prod_op(x, d)
    return _prod_op(x, d)


class _Default:
    """A default told apart from the same value given, which torch refuses:
    keepdim without a dim (it has no prod(input, keepdim=...)), dim=None.
    Its repr is the value a signature shows."""

    def __init__(self, shown):
        self.shown = shown

    def __repr__(self):
        return self.shown


_KEEPDIM_DEFAULT = _Default("False")
_NO_DIM = _Default("None")
_NO_ALIAS = object()


def _numpy_names(dim, keepdim, axis, keepdims):
    """dim and keepdim from torch's NumPy-style names (axis=, keepdims=),
    which its argument parser takes for any function: refused as torch
    refuses them, given twice or without a dim."""
    if axis is not _NO_ALIAS:
        if dim is not None or axis is None:
            raise TypeError("prod() got an unexpected keyword argument 'axis'")
        dim = axis
    if keepdims is not _NO_ALIAS:
        if keepdim is not _KEEPDIM_DEFAULT or dim is None:
            raise TypeError(
                "prod() got an unexpected keyword argument 'keepdims'"
            )
        keepdim = keepdims
    return dim, keepdim


def prod(
    input,
    dim=_NO_DIM,
    keepdim=_KEEPDIM_DEFAULT,
    *,
    dtype=None,
    out=None,
    axis=_NO_ALIAS,
    keepdims=_NO_ALIAS,
):
    """gemsops.prod(input, *, dtype=None) -> 0-d tensor;
    gemsops.prod(input, dim, keepdim=False, *, dtype=None, out=None).

    The result has dtype= when given, else int64 for bool and integer
    input (unsigned ones too), else input's dtype. With dtype= the input is
    cast first, as torch does; integer and bool results are computed in
    int64 and truncated, which wraps as torch's narrower products do. out=
    (with a dim, as torch's) sets the dtype the product is computed in.
    NumPy's names axis= and keepdims= are taken for dim and keepdim, as
    torch takes them."""
    if dim is None:
        raise TypeError("prod(): argument 'dim' must be int, not NoneType")
    if dim is _NO_DIM:
        dim = None
    if axis is not _NO_ALIAS or keepdims is not _NO_ALIAS:
        dim, keepdim = _numpy_names(dim, keepdim, axis, keepdims)
    if tensor_like(input, out):
        return handle_torch_function(
            prod,
            (input, out),
            input,
            _NO_DIM if dim is None else dim,
            keepdim,
            dtype=dtype,
            out=out,
        )
    if out is not None:
        if dim is None:
            raise TypeError("prod(): out= needs a dim (torch.prod's rule)")
        if isinstance(out, torch.Tensor):
            # torch computes in out's dtype; a dtype= must be that one
            if dtype is not None and _dtype(dtype) != out.dtype:
                raise RuntimeError(
                    f"prod(): expected out tensor to have dtype "
                    f"{_dtype(dtype)}, but got {out.dtype} instead"
                )
            dtype = out.dtype
        return _into(
            "prod",
            out,
            (input,),
            lambda: prod(input, dim, keepdim, dtype=dtype),
        )
    if not isinstance(input, torch.Tensor):
        raise TypeError(
            "prod(): argument 'input' must be a Tensor, not "
            f"{type(input).__name__}"
        )
    if input.is_nested or input.layout is not _strided:
        raise layout_refused("prod", (("input", input),))
    if keepdim is _KEEPDIM_DEFAULT:
        keepdim = False
    elif dim is None:
        raise TypeError(f"prod(): keepdim={keepdim!r} needs a dim")
    if keepdim is not False and keepdim is not True:
        raise TypeError(
            "prod(): argument 'keepdim' must be bool, not "
            f"{type(keepdim).__name__}"
        )
    if dtype is not None:
        dtype = _dtype(dtype)
        if dtype in _UNSIGNED_WIDE:  # torch has no product of these either
            raise NotImplementedError(
                f"prod(): no kernel for dtype={dtype} (torch has none)"
            )
    d = None if dim is None else _normalize_dim(dim, input.dim())
    cast = None
    if dtype is not None:
        if (
            not dtype.is_floating_point
            and not dtype.is_complex  # no kernel: refused below
            and input.requires_grad
            and torch.is_grad_enabled()
        ):  # as torch refuses
            raise RuntimeError(
                f"prod(): autograd does not support dtype "
                f"{dtype} (input requires grad)"
            )
        input = input.to(dtype)
        if not dtype.is_floating_point and dtype != torch.int64:
            cast = dtype
    if input.dtype in _UNSIGNED_WIDE:  # C has no kernel: the same bits
        input = input.to(torch.int64)
    if input.is_complex():
        raise NotImplementedError(
            f"prod(): gemsops has no kernel for complex input ({input.dtype})"
        )
    input = plain(input)
    x, dx = _folded(input, d)
    if not eager((x,)):
        out = _prod_not_eager(x, dx, dtype is not None)
    elif (
        torch.is_grad_enabled()
        and input.requires_grad
        and input.is_floating_point()
    ):
        # a 0-d input's product is itself, its gradient grad with no graph
        # back to input (a second order raises), as torch's and a copy's
        out = input.clone() if input.dim() == 0 else _prod_function(x, dx)
    else:
        out = _forward(x, dx)
    if cast is not None:
        out = out.to(cast)
    if d is None or not keepdim and x is input:
        return out  # C's result has the shape asked
    if input.dim() == 0:  # a 0-d product stays 0-d, keepdim or not
        shape = ()
    else:
        shape = input.shape[:d] + (1,) * keepdim + input.shape[d + 1 :]
    # torch's result is a tensor of its own, not a view
    return out if out.shape == shape else unsafe_view(out, shape)


def _folded(x, d):
    """(x, d) as C takes them: a 0-d x as one element; one of more
    dimensions than C takes with the dims before d folded into one and
    those after into another (all of them, without a d)."""
    if x.dim() == 0:
        return x.reshape(1), d
    if x.dim() <= MAX_DIMS:
        return x, d
    if d is None:
        return x.reshape(x.numel()), None
    shape = x.shape
    return x.reshape(
        math.prod(shape[:d]), shape[d], math.prod(shape[d + 1 :])
    ), 1
