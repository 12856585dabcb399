"""Global mode: torch's own aten ops run on gemsops kernels.

enable() registers, per dispatch key (CPU, CUDA), kernels for aten's
native_layer_norm, native_layer_norm_backward, prod, prod.dim_int, mm, bmm
and addmm (what F.linear, nn.Linear, nn.LayerNorm, attention's projections
and their backwards reach). They sit below autograd and autocast, so
torch's own derivative formulas and autocast lists still apply. A call
gemsops cannot serve (a dtype it lacks, mixed dtypes, an error) goes to the
kernel torch had registered before (torch.library.get_kernel), so nothing
fails that would not fail anyway. disable() drops the registrations, which
restores torch's kernels."""

import contextlib
import threading
import warnings
from collections import Counter

import torch

from ._dispatch import plain
from .ops import _norm_args as _norm
from .ops import layer_norm as _ln
from .ops import linear as _linear
from .ops import matmul as _mm
from .ops import prod as _prod

OPS = (
    "native_layer_norm",
    "native_layer_norm_backward",
    "prod",
    "prod.dim_int",
    "mm",
    "bmm",
    "addmm",
)

_KEYS = {"cpu": "CPU", "cuda": "CUDA"}
_MM_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_LN_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

_lib = None
_state = None  # the arguments enable() was called with
counts = Counter()  # "op" (served by gemsops) and "op:fallback"


class _Fallback(Exception):
    pass


def _need(cond):
    if not cond:
        raise _Fallback


def _shape_ok(x, shape):
    """normalized_shape is x's trailing sizes (else torch raises)."""
    nd = len(shape)
    return 0 < nd <= x.dim() and tuple(x.shape[x.dim() - nd :]) == shape


def _native_layer_norm(x, normalized_shape, weight, bias, eps):
    _need(x.dtype in _LN_DTYPES and x.numel() > 0)
    # torch's CPU kernel refuses parameters of two dtypes
    _need(weight is None or bias is None or weight.dtype == bias.dtype)
    shape = tuple(normalized_shape)
    _need(_shape_ok(x, shape))
    out, mean, rstd = _ln._forward(
        plain(x), shape, _norm.param(weight), _norm.param(bias), eps
    )
    st = _norm.stat_view_shape(x, len(shape))
    sd = _torch_stats_dtype(x, weight, bias)
    return out, mean.view(st).to(sd), rstd.view(st).to(sd)


def _torch_stats_dtype(x, weight, bias):
    """The statistics' dtype of torch's native_layer_norm: fp32 for half
    input (fp64 for fp64), but on the CPU the input's own unless a
    parameter is fp32."""
    mixed = any(p is not None and p.dtype != x.dtype for p in (weight, bias))
    if x.device.type == "cpu" and not mixed:
        return x.dtype
    return _norm.stats_dtype(x.dtype)


def _native_layer_norm_backward(
    grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask
):
    _need(
        x.dtype in _LN_DTYPES and x.numel() > 0 and grad_out.dtype == x.dtype
    )
    want_dx, want_dw, want_db = map(bool, output_mask)
    _need(not (want_dw and weight is None) and not (want_db and bias is None))
    shape = tuple(normalized_shape)
    _need(_shape_ok(x, shape))
    # statistics of another dtype than torch's forward gives, and a bias of
    # its own dtype beside no weight, are torch's to refuse or serve
    want = _torch_stats_dtype(x, weight, bias)
    _need(mean.dtype == want and rstd.dtype == want)
    _need(weight is not None or bias is None or bias.dtype == x.dtype)
    sd = _norm.stats_dtype(x.dtype)
    mean, rstd = (plain(s).to(sd).reshape(-1) for s in (mean, rstd))
    return _ln._backward(
        grad_out,
        plain(x),
        shape,
        _norm.param(weight),
        mean,
        rstd,
        want_dx,
        want_dw,
        want_db,
    )


def _prod_any(x, dim, keepdim, dtype):
    if dtype is not None:
        x = x.to(dtype)
    _need(not x.is_complex())
    x = plain(x)
    x1 = x.reshape(1) if x.dim() == 0 else x
    d = None if dim is None else _prod._normalize_dim(dim, x.dim())
    out = _prod._forward(x1, d)
    target = dtype if dtype is not None else _prod._out_dtype(x.dtype)
    if out.dtype != target:
        out = out.to(target)
    if d is not None and x.dim() == 0:
        return out.reshape(())
    if d is not None and keepdim:
        out = out.unsqueeze(d)
    return out


def _prod_full(x, *, dtype=None):
    return _prod_any(x, None, False, dtype)


def _prod_dim(x, dim, keepdim=False, *, dtype=None):
    return _prod_any(x, dim, keepdim, dtype)


def _mm_ok(a, b):
    _need(
        a.dtype in _MM_DTYPES and a.dtype == b.dtype and a.device == b.device
    )


def _mm2(a, b):
    _mm_ok(a, b)
    _need(a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0])
    return _mm._mm(plain(a), plain(b))


def _bmm3(a, b):
    _mm_ok(a, b)
    _need(
        a.dim() == 3
        and b.dim() == 3
        and a.shape[0] == b.shape[0]
        and a.shape[2] == b.shape[1]
    )
    return _mm._mm(plain(a), plain(b))


def _addmm(bias, a, b, *, beta=1, alpha=1):
    _mm_ok(a, b)
    # what gemsops.addmm refuses (past float32's range, say) raises, and
    # torch's kernel gets the call and raises its own error
    alpha = _linear._coefficient("alpha", alpha, a)
    beta = _linear._coefficient("beta", beta, a)
    # alpha 0: the product's NaNs must not spread; torch's kernel skips it
    _need(alpha != 0)
    _need(
        bias.dtype == a.dtype
        and bias.device == a.device
        and bias.dim() <= 2
        and a.dim() == 2
        and b.dim() == 2
        and a.shape[1] == b.shape[0]
    )
    shape = (a.shape[0], b.shape[1])
    _need(torch.broadcast_shapes(bias.shape, shape) == shape)
    if not a.shape[1] and not isinstance(alpha, torch.Tensor):
        # an empty sum is left out, as torch's: a NaN or infinite alpha
        # does not make 0 * alpha NaN (alpha != 0 has no other effect)
        alpha = 1
    # the kernel's epilogue: alpha * a @ b + beta * bias before the one
    # rounding (beta 0: bias is not read, its NaNs do not spread)
    return _mm._mm(
        plain(a), plain(b), plain(bias) if beta != 0 else None, alpha, beta
    )


_IMPLS = {
    "native_layer_norm": _native_layer_norm,
    "native_layer_norm_backward": _native_layer_norm_backward,
    "prod": _prod_full,
    "prod.dim_int": _prod_dim,
    "mm": _mm2,
    "bmm": _bmm3,
    "addmm": _addmm,
}


def _kernel(name, impl, original):
    def kernel(keyset, *args, **kwargs):
        try:
            out = impl(*args, **kwargs)
        except _Fallback:
            pass
        except (
            TypeError,
            ValueError,
            RuntimeError,
            NotImplementedError,
            IndexError,
            OverflowError,
        ):
            pass  # torch's kernel decides (and raises what torch raises)
        else:
            counts[name] += 1
            return out
        counts[name + ":fallback"] += 1
        return original.call_boxed(keyset, *args, **kwargs)

    return kernel


def _names(arg, what):
    """include= or exclude= as a tuple of op names (a string for one)."""
    if arg is None:
        return None
    names = (arg,) if isinstance(arg, str) else tuple(arg)
    for n in names:
        if not isinstance(n, str):
            raise TypeError(
                f"enable(): {what} names aten ops as strings, got "
                f"{type(n).__name__}"
            )
        if n not in _IMPLS:
            raise ValueError(
                f"enable(): no gemsops kernel for aten.{n}; "
                f"known: {', '.join(OPS)}"
            )
    return names


def _devices(devices):
    """devices= as a tuple of device types: 'cpu', 'cuda', or a
    torch.device or 'cuda:0' (the mode routes every device of a type)."""
    if isinstance(devices, (str, torch.device)):
        devices = (devices,)
    out = []
    for d in devices:
        if not isinstance(d, (str, torch.device)):
            raise TypeError(
                "enable(): devices are 'cpu', 'cuda' or torch.device, got "
                f"{type(d).__name__}"
            )
        try:
            kind = torch.device(d).type
        except RuntimeError:
            kind = d
        if kind not in _KEYS:
            raise ValueError(
                f"enable(): devices must be among {sorted(_KEYS)}, got {d!r}"
            )
        if kind not in out:
            out.append(kind)
    if not out:
        raise ValueError("enable(): devices names no device")
    return tuple(out)


def _register(state):
    """Routes state's (devices, ops), or nothing for None, in place of
    what is routed now. Caller holds _lock."""
    global _lib, _state
    if _lib is not None:
        _lib._destroy()
        _lib = None
        _state = None
    if state is None:
        return
    devices, names = state
    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            # overriding torch's kernel is the point
            warnings.simplefilter("ignore")
            for d in devices:
                key = _KEYS[d]
                for n in names:
                    try:
                        original = torch.library.get_kernel(f"aten::{n}", key)
                    except RuntimeError:  # torch has none here (no CUDA)
                        continue
                    lib.impl(
                        n,
                        _kernel(n, _IMPLS[n], original),
                        key,
                        with_keyset=True,
                    )
    except BaseException:
        lib._destroy()
        raise
    _lib = lib
    _state = state


def enable(devices=("cuda",), include=None, exclude=None):
    """Route torch's aten ops in OPS (or `include`, less `exclude`) to
    gemsops on `devices` ('cuda', 'cpu'). Replaces an earlier enable().

    The mode is the process's, not a thread's: torch's dispatcher, where
    it registers, is one for all threads. Switch it while no other thread
    runs torch ops (torch.library's registrations race with concurrent
    dispatch)."""
    devices = _devices(devices)
    include, exclude = _names(include, "include"), _names(exclude, "exclude")
    names = tuple(
        dict.fromkeys(
            n
            for n in (OPS if include is None else include)
            if n not in set(exclude or ())
        )
    )
    with _lock:
        _register((devices, names))


def disable():
    """Give torch its kernels back."""
    with _lock:
        _register(None)


def enabled():
    """(devices, ops) routed to gemsops now, or None."""
    return _state


class _Context:
    """One use_gemsops() block: the state to route again when it ends."""

    def __init__(self, before):
        self.before = before


_contexts = []  # the open use_gemsops() blocks, oldest first
_lock = threading.RLock()


@contextlib.contextmanager
def use_gemsops(devices=("cuda",), include=None, exclude=None):
    """with gemsops.use_gemsops(): torch's ops run on gemsops inside, and
    whatever was routed before is routed again after. Blocks may close out
    of order (threads): the newest open block's routing holds until it
    closes, and the last to close restores what was routed before the
    first (the mode is the process's: see enable())."""
    with _lock:
        ctx = _Context(_state)
        enable(devices, include, exclude)
        _contexts.append(ctx)
    try:
        yield counts
    finally:
        with _lock:
            i = _contexts.index(ctx)
            del _contexts[i]
            if i < len(_contexts):
                # a newer block is open: its routing stays, and it now
                # restores what this one would have
                _contexts[i].before = ctx.before
            else:
                _register(ctx.before)
