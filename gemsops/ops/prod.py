"""prod: torch.prod's signatures and dtype rules over gemsops._C.

Result dtypes as torch: bool and integer inputs give int64 (wrapping like
torch's int64 products); float inputs keep their dtype; dtype= casts the
input before multiplying and is the result's dtype. The backward is
zero-safe: exclusive prefix and suffix products, no division by x and no
host sync."""
import sys

import torch

from .. import _C

# workspace bytes per (dtype, shape, strides, dim, device): planned once by
# C (the plan depends on the device's SM count), then reused
_fwd_ws = {}
_bwd_ws = {}


def _workspace(cache, query, x, dim):
    if not x.is_cuda:
        return None
    key = (x.dtype, x.shape, x.stride(), dim, x.device.index,
           x.data_ptr() % 16)
    nbytes = cache.get(key)
    if nbytes is None:
        nbytes = cache[key] = query(x, dim)
    if not nbytes:
        return None
    return torch.empty(nbytes, dtype=torch.uint8, device=x.device)


# dtype= may be one of these Python types, as torch takes it
_PY_DTYPES = {float: torch.float64, int: torch.int64, bool: torch.bool,
              complex: torch.complex128}


def _out_dtype(dtype):
    return dtype if dtype.is_floating_point else torch.int64


def _dtype(dtype):
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, type) and dtype in _PY_DTYPES:
        return _PY_DTYPES[dtype]
    raise TypeError(f"prod(): argument 'dtype' must be torch.dtype, not "
                    f"{type(dtype).__name__}")


def _normalize_dim(dim, ndim):
    if type(dim) is not int:
        dim = _index(dim)
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"prod(): Dimension out of range (expected to be in "
                         f"range of [{-n}, {n - 1}], but got {dim})")
    return dim % n


def _index(dim):
    """dim as torch's parser takes an int: an int (not a bool), a NumPy
    integer or a 0-d integer tensor; anything else is a TypeError."""
    np = sys.modules.get("numpy")  # a NumPy integer implies NumPy is loaded
    if ((isinstance(dim, int) and not isinstance(dim, bool))
            or (np is not None and isinstance(dim, np.integer))
            or (isinstance(dim, torch.Tensor) and dim.dim() == 0
                and not dim.is_floating_point() and not dim.is_complex()
                and dim.dtype != torch.bool)):
        return int(dim)
    raise TypeError(f"prod(): argument 'dim' must be int, not "
                    f"{type(dim).__name__}")


def _forward(x, dim):
    """x: at least 1-D; dim: None or normalised. Returns the kept-dims
    result (no keepdim)."""
    if dim is None:
        out = torch.empty((), dtype=_out_dtype(x.dtype), device=x.device)
    else:
        kept = x.shape[:dim] + x.shape[dim + 1:]
        out = torch.empty(kept, dtype=_out_dtype(x.dtype), device=x.device)
    _C.prod(x, dim, out, _workspace(_fwd_ws, _C.prod_workspace, x, dim))
    return out


class ProdFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        ctx.dim = dim
        ctx.save_for_backward(x)
        return _forward(x, dim)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        if x.is_cuda:  # the CUDA backward reads [outer, dim, inner] rows
            x = x.contiguous()
        if grad.is_neg():  # C reads raw memory: give it the values
            grad = grad.resolve_neg()
        grad_in = torch.empty_like(x, memory_format=torch.contiguous_format)
        ws = _workspace(_bwd_ws, _C.prod_bwd_workspace, x, ctx.dim)
        _C.prod_bwd(x, ctx.dim, grad.contiguous(), grad_in, ws)
        return grad_in, None


def prod(input, dim=None, keepdim=False, *, dtype=None):
    """gemsops.prod(input, *, dtype=None) -> 0-d tensor;
    gemsops.prod(input, dim, keepdim=False, *, dtype=None).

    The result has dtype= when given, else int64 for bool and integer
    input, else input's dtype. With dtype= the input is cast first, as
    torch does; integer and bool results are computed in int64 and
    truncated, which wraps as torch's narrower products do."""
    if not isinstance(input, torch.Tensor):
        raise TypeError("prod(): argument 'input' must be a Tensor, not "
                        f"{type(input).__name__}")
    if keepdim is not False and keepdim is not True:
        raise TypeError("prod(): argument 'keepdim' must be bool, not "
                        f"{type(keepdim).__name__}")
    if dim is None and keepdim:  # torch has no prod(input, keepdim=...)
        raise TypeError("prod(): keepdim=True needs a dim")
    if dtype is not None:
        dtype = _dtype(dtype)
    d = None if dim is None else _normalize_dim(dim, input.dim())
    cast = None
    if dtype is not None:
        if (not dtype.is_floating_point and input.requires_grad
                and torch.is_grad_enabled()):  # as torch refuses
            raise RuntimeError(f"prod(): autograd does not support dtype "
                               f"{dtype} (input requires grad)")
        input = input.to(dtype)
        if not dtype.is_floating_point and dtype != torch.int64:
            cast = dtype
    if input.is_complex():
        raise NotImplementedError(f"prod(): gemsops has no kernel for "
                                  f"complex input ({input.dtype})")
    if input.is_neg():  # C reads raw memory: give it the values
        input = input.resolve_neg()
    x = input.reshape(1) if input.dim() == 0 else input
    if (torch.is_grad_enabled() and input.requires_grad
            and input.is_floating_point()):
        out = ProdFunction.apply(x, d)
    else:
        out = _forward(x, d)
    if cast is not None:
        out = out.to(cast)
    if d is not None and input.dim() == 0:
        return out.reshape(())
    if d is not None and keepdim:
        out = out.unsqueeze(d)
    return out
