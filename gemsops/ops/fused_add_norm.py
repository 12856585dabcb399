"""The residual add fused into the norm, as every transformer block has it:

    h = x + residual          (x's dtype, rounded as torch's add)
    y = layer_norm(h) or rms_norm(h)

returns (y, h). A residual of another dtype or shape (or a number) is
added by torch's rules instead (h then of the promoted dtype) and the
norm runs apart, as the unfused expression would. The forward reads x
and residual once and writes y and h once; the backward is the norm's
one fused kernel at h, which adds dh (h's gradient from elsewhere) into
dx: dx = dresidual = dh + the norm's dx. Traced code (compile, export,
modes) runs the same math as torch's add and the gemsops norm op, which
the compiler may fuse itself."""

import torch
from torch.overrides import handle_torch_function

from .. import _C
from .._dispatch import (
    _strided,
    batched,
    eager,
    eager_apply,
    plain,
    tensor_like,
    torch_only,
    unsafe_view,
)
from . import layer_norm as ln
from . import rms_norm as rn
from ._aligned import call_aligned
from ._norm_args import (
    as_rows,
    eps_arg,
    folds_leading_dims,
    needs_grad,
    prepare_layer_norm,
    rows_of,
    stat_view_shape,
    stats_dtype,
)
from ._norm_launch import (
    bias_grad_apart,
    grad_bias,
    grad_outputs,
    launch_backward,
    none_unless,
)


def _forward(x, res, shape, weight, bias, eps, rms, want_stats=True):
    """(y, h, mean, rstd); mean None for RMSNorm; statistics of the norm
    op's shape (x.shape[:-nd] + (1,) * nd: what traced code's path saves,
    for a checkpoint that recomputes on the other path), or None when not
    wanted (no gradient to take: inference skips them)."""
    nd = len(shape)
    x, res = as_rows(x, nd), as_rows(plain(res), nd)
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    h = torch.empty_like(x, memory_format=torch.contiguous_format)
    mean = rstd = None
    if want_stats:
        st = stat_view_shape(x, nd)
        sd = stats_dtype(x.dtype)
        mean = None if rms else x.new_empty(st, dtype=sd)
        rstd = x.new_empty(st, dtype=sd)
    call_aligned(
        lambda *xrwb: _C.add_norm_fwd(*xrwb, nd, eps, rms, y, h, mean, rstd),
        x,
        res,
        weight,
        bias,
    )
    return y, h, mean, rstd


class FusedAddNormFunction(torch.autograd.Function):
    """The eager path where autograd records the call. Under create_graph
    the backward is the norm's differentiable backward op at h plus dh; h
    is this node's own output, so second-order terms reach x and residual
    through it."""

    @staticmethod
    def forward(ctx, x, res, shape, weight, bias, eps, rms):
        y, h, mean, rstd = _forward(x, res, shape, weight, bias, eps, rms)
        ctx.shape, ctx.eps, ctx.rms = shape, eps, rms
        ctx.has_bias = bias is not None
        ctx.save_for_backward(h, weight, mean, rstd, bias)
        ctx.set_materialize_grads(False)
        if not (ctx.needs_input_grad[0] or ctx.needs_input_grad[1]):
            ctx.mark_non_differentiable(h)  # as torch's x + residual
        return y, h

    @staticmethod
    def backward(ctx, gy, gh):
        h, weight, mean, rstd, bias = ctx.saved_tensors
        need = ctx.needs_input_grad
        want_dx = need[0] or need[1]
        want_dw = need[3] and weight is not None
        want_db = need[4] and ctx.has_bias
        if gy is None:  # y unused: dW and dB stay None, as torch's
            if gh is None:
                return (None,) * 7
            return (
                gh if need[0] else None,
                gh if need[1] else None,
                *((None,) * 5),
            )
        vmapped = batched(gy) or (gh is not None and batched(gh))
        if vmapped or torch.is_grad_enabled():
            # a vmap's gradients: torch's ops; create_graph: differentiable
            # ops; dh added after
            mask = (True, want_dw, want_db)
            if vmapped and ctx.rms:
                dx, dw = rn._backward_composite(
                    gy, h, weight, ctx.eps, ctx.shape
                )
                (dw,), db = none_unless((want_dw,), dw), None
            elif vmapped:
                dx, dw, db = ln._backward_torch(
                    gy, h, ctx.shape, mean, rstd, weight, bias, mask
                )
            elif ctx.rms:
                dx, dw = rn._backward_op(
                    gy, h, ctx.shape, rstd, weight, mask[:2], ctx.eps
                )
                db = None
            else:
                dx, dw, db = ln._backward_op(
                    gy, h, ctx.shape, mean, rstd, weight, mask, bias=bias
                )
            if gh is not None:
                dx = dx + gh
        else:
            dx, dw, db = _backward(
                gy,
                gh,
                h,
                ctx.shape,
                weight,
                bias,
                mean,
                rstd,
                ctx.rms,
                (want_dx, want_dw, want_db),
            )
        return (
            dx if need[0] else None,
            dx if need[1] else None,
            None,
            dw,
            db,
            None,
            None,
        )


_fused_add_norm_function = eager_apply(FusedAddNormFunction)


def _backward(gy, gh, h, shape, weight, bias, mean, rstd, rms, wanted):
    """(dx, dW, dB) by the one fused kernel; a bias of its own dtype
    beside no weight has its dB summed apart (layer_norm's rule)."""
    want_dx, want_dw, want_db = wanted
    nd = len(shape)
    if want_db and bias_grad_apart(h, weight, bias):
        dx, dw, _ = _backward(
            gy,
            gh,
            h,
            shape,
            weight,
            None,
            mean,
            rstd,
            rms,
            (want_dx, want_dw, False),
        )
        return dx, dw, grad_bias(gy, nd, bias)
    det = torch.are_deterministic_algorithms_enabled()
    gy = as_rows(plain(gy), nd)
    if gh is not None:
        gh = as_rows(plain(gh), nd)
    dx, dw, db = grad_outputs(h, shape, weight, want_dx, want_dw, want_db)

    # launch_backward's calling convention, gh among the args (which it
    # realigns where C refuses one)
    def c_bwd(gy, h, weight, nd, det, mean, rstd, dx, dw, db, gh, *launch):
        return _C.add_norm_bwd(
            gy, gh, h, weight, nd, det, rms, mean, rstd, dx, dw, db, *launch
        )

    args = (gy, h, weight, nd, det, mean, rstd, dx, dw, db, gh)
    plan = (h, weight, nd, det, want_dx, want_dw, want_db)
    launch_backward(
        c_bwd,
        _C.layer_norm_bwd_workspace,
        args,
        plan,
        want_dx or want_dw or want_db,
    )
    return dx, dw, db


def _traced(x, residual, shape, weight, bias, eps, rms):
    h = x + residual
    if torch_only():  # torch's ops (forward-mode AD, functorch)
        if rms:
            fn = "fused_add_rms_norm"
            return rn._forward_torch(h, shape, weight, eps, fn)[0], h
        fn = "fused_add_layer_norm"
        return ln._forward_torch(h, shape, weight, bias, eps, fn)[0], h
    if rms:
        return rn._rms_norm_op(h, shape, weight, eps)[0], h
    return ln._layer_norm_op(h, shape, weight, bias, eps)[0], h


def _needs_grad(x, res, weight, bias=None):
    """Autograd records the call (the eager path's Function then)."""
    return needs_grad(x, weight, bias) or (
        res.requires_grad and torch.is_grad_enabled()
    )


def _fits(x, residual):
    """residual is what the fused kernels read beside x: a tensor of x's
    shape, dtype and device. Anything else (a broadcast, another dtype, a
    number) is added by torch's rules and normalized apart, as the
    unfused expression would; so are nested and sparse tensors, which the
    unfused norms hand to torch (or refuse as it does)."""
    return (
        isinstance(residual, torch.Tensor)
        and not x.is_nested
        and not residual.is_nested
        and x.layout is _strided
        and residual.layout is _strided
        and residual.shape == x.shape
        and residual.dtype == x.dtype
        and residual.device == x.device
    )


def fused_add_layer_norm(
    input, residual, normalized_shape, weight=None, bias=None, eps=1e-5
):
    """(layer_norm(h), h) with h = input + residual, in one pass each way.
    weight/bias as gemsops.layer_norm's (fp32 beside half input too)."""
    if tensor_like(input, residual, weight, bias):
        return handle_torch_function(
            fused_add_layer_norm,
            (input, residual, weight, bias),
            input,
            residual,
            normalized_shape,
            weight,
            bias,
            eps,
        )
    fn = "fused_add_layer_norm"
    if not (isinstance(input, torch.Tensor) and _fits(input, residual)):
        h = input + residual
        return ln.layer_norm(h, normalized_shape, weight, bias, eps), h
    input, shape, weight, bias = prepare_layer_norm(
        input, normalized_shape, weight, bias, fn
    )
    if folds_leading_dims(input, len(shape)):
        x, res = (rows_of(t, len(shape)) for t in (input, residual))
        y, h = fused_add_layer_norm(x, res, shape, weight, bias, eps)
        # h as a view: the backward saves it
        return unsafe_view(y, input.shape), h.view(input.shape)
    if type(eps) is not float:
        eps = eps_arg(eps, fn)
    if not eager((input, residual, weight, bias)):
        return _traced(input, residual, shape, weight, bias, eps, False)
    if not _needs_grad(input, residual, weight, bias):
        return _forward(
            input, residual, shape, weight, bias, eps, False, False
        )[:2]
    return _fused_add_norm_function(
        input, residual, shape, weight, bias, eps, False
    )


def fused_add_rms_norm(
    input, residual, normalized_shape, weight=None, eps=None
):
    """(rms_norm(h), h) with h = input + residual, in one pass each way;
    eps=None is torch's default, as gemsops.rms_norm's."""
    if tensor_like(input, residual, weight):
        return handle_torch_function(
            fused_add_rms_norm,
            (input, residual, weight),
            input,
            residual,
            normalized_shape,
            weight,
            eps,
        )
    fn = "fused_add_rms_norm"
    if not (
        isinstance(input, torch.Tensor)
        and _fits(input, residual)
        and not input.is_complex()  # rms_norm hands these to torch
        and not (isinstance(weight, torch.Tensor) and weight.is_complex())
    ):
        h = input + residual
        return rn.rms_norm(h, normalized_shape, weight, eps), h
    input, shape, weight = rn._prepare(input, normalized_shape, weight, fn)
    if folds_leading_dims(input, len(shape)):
        x, res = (rows_of(t, len(shape)) for t in (input, residual))
        y, h = fused_add_rms_norm(x, res, shape, weight, eps)
        # h as a view: the backward saves it
        return unsafe_view(y, input.shape), h.view(input.shape)
    eps = rn._eps(eps, input.dtype, fn)
    weight = rn._weight_for(input, weight)
    if not eager((input, residual, weight)):
        return _traced(input, residual, shape, weight, None, eps, True)
    if not _needs_grad(input, residual, weight):
        return _forward(
            input, residual, shape, weight, None, eps, True, False
        )[:2]
    return _fused_add_norm_function(
        input, residual, shape, weight, None, eps, True
    )
