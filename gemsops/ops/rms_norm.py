"""RMSNorm: torch.nn.functional.rms_norm's semantics over the LayerNorm
kernels run with the RMS statistic (gemsops._C.rms_norm_*):

    y = x * rstd * weight,   rstd = 1 / sqrt(mean(x^2) + eps) per row

eps=None is torch's default: the machine epsilon of the type the math
runs in (torch.finfo(torch.float32).eps for fp16 and bf16 input, which
torch computes in float32; the input's own otherwise). The backward
is the LayerNorm's one fused kernel without its centring term: dx and an
atomic dW in one launch, sharing the LayerNorm backward's kept workspace.
"""

import math
from typing import Optional, Sequence

import torch
from torch.overrides import handle_torch_function

from .. import _C
from .._dispatch import (
    _strided,
    batched,
    cast_floating,
    define_op,
    eager,
    eager_apply,
    plain,
    register_autocast,
    tensor_like,
    torch_only,
    unsafe_view,
)
from ._aligned import call_aligned
from ._norm_args import (
    as_rows,
    check_one_device,
    check_traced,
    eps_arg,
    folds_leading_dims,
    needs_grad,
    param,
    prepare,
    rows_of,
    stat_view_shape,
    stats_dtype,
)
from ._norm_launch import (
    grad_outputs,
    launch_backward,
    none_unless,
    sum_rows,
    unwanted,
)
from ._second_order import (
    NoThirdOrder,
    second_order_vjp,
    second_order_zeros,
    weight_second_order,
)

_COMPLEX = (torch.complex32, torch.complex64, torch.complex128)


def _eps(eps, dtype, fn="rms_norm"):
    if eps is None:
        # an integer input gets no eps: C refuses its dtype next
        if not dtype.is_floating_point:
            return 0.0
        half = dtype in (torch.float16, torch.bfloat16)
        return torch.finfo(torch.float32 if half else dtype).eps
    return eps_arg(eps, fn, " or None")


def _prepare(input, normalized_shape, weight, fn):
    """prepare with torch's rms_norm refusal of an input with fewer
    dims than normalized_shape (a 0-d one too): ValueError."""
    input, shape, weight, _ = prepare(
        input, normalized_shape, weight, None, fn, ValueError
    )
    return input, shape, weight


def _c10_name(dtype):
    """torch's C++ name of a dtype, as its promotion errors give it
    (float32: Float, float8_e5m2: Float8_e5m2)."""
    names = {
        torch.float32: "Float",
        torch.float64: "Double",
        torch.float16: "Half",
        torch.bfloat16: "BFloat16",
    }
    return names.get(dtype, str(dtype)[6:].capitalize())


def _weight_for(x, w):
    """torch's rms_norm takes a weight of any float dtype (the product is
    promoted, then cast to x's dtype); the kernels take x's dtype, or fp32
    beside half x, where that promotion is exact. Any other weight is cast
    there first (fp64 beside fp32 x: within an ulp of torch's)."""
    if w is None or w.dtype == x.dtype or w.is_complex():
        return w
    if not w.is_floating_point():  # an integer or bool weight: x's dtype
        return w.to(x.dtype) if x.is_floating_point() else w
    if w.dtype.itemsize == 1:  # the float8 types: torch promotes none
        raise RuntimeError(
            "rms_norm(): Promotion for Float8 Types is not supported, "
            f"attempted to promote {_c10_name(x.dtype)} and "
            f"{_c10_name(w.dtype)} (argument 'weight')"
        )
    half = x.dtype in (torch.float16, torch.bfloat16)
    if half and w.dtype == torch.float32:
        return w
    return w.to(torch.float32 if half else x.dtype)


def _forward(x, shape, weight, eps, want_rstd=True, rstd_shape=None):
    """(out, rstd): rstd flat [M] (or of rstd_shape, M elements; fp32,
    fp64 for fp64 input) or None."""
    nd = len(shape)
    x = as_rows(x, nd)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    rstd = None
    if want_rstd:
        if rstd_shape is None:
            rstd_shape = math.prod(x.shape[: x.dim() - nd])
        rstd = x.new_empty(rstd_shape, dtype=stats_dtype(x.dtype))
    call_aligned(
        lambda x, w: _C.rms_norm_fwd(x, w, nd, eps, out, rstd), x, weight
    )
    return out, rstd


def _backward(grad_out, x, shape, weight, rstd, want_dx, want_dw, det=None):
    nd = len(shape)
    if det is None:
        det = torch.are_deterministic_algorithms_enabled()
    x = as_rows(x, nd)
    grad_out = as_rows(plain(grad_out), nd)
    dx, dw, _ = grad_outputs(x, shape, weight, want_dx, want_dw)
    args = (grad_out, x, weight, nd, det, rstd, dx, dw)
    plan = (x, weight, nd, det, want_dx, want_dw)
    launch_backward(
        _C.rms_norm_bwd,
        _C.rms_norm_bwd_workspace,
        args,
        plan,
        want_dx or want_dw,
    )
    return dx, dw


def _savable(x):
    """x as the backward may keep it: an inference tensor (a weight trained
    on inference-mode input) cannot be saved, and torch's composite saves
    none, so a copy is."""
    return x.clone() if x.is_inference() else x


def _save(ctx, x, weight, rstd):
    """Saves x, rstd and the weight where dx will read it: the weight's
    own gradient does not (torch's composite saves no weight then, so a
    weight made under inference mode or written in place after the forward
    is no error there)."""
    ctx.weight_like = None
    if weight is not None and not ctx.needs_input_grad[0]:
        ctx.weight_like = (weight.shape, weight.dtype, weight.device)
        weight = None
    ctx.save_for_backward(_savable(x), weight, rstd)


def _saved(ctx):
    """(x, weight, rstd) as _save kept them; a weight not kept is zeros of
    its shape and dtype, for the gradients' shapes (dx, which would read
    it, is not asked)."""
    x, weight, rstd = ctx.saved_tensors
    if ctx.weight_like is not None:
        shape, dtype, device = ctx.weight_like
        weight = torch.zeros(shape, dtype=dtype, device=device)
    return x, weight, rstd


class RMSNormFunction(torch.autograd.Function):
    """The eager path; under create_graph the backward is the
    gemsops::rms_norm_backward op, whose own autograd gives second order
    gradients."""

    @staticmethod
    def forward(ctx, x, shape, weight, eps):
        # rstd shaped as the op's: see LayerNormFunction
        st = stat_view_shape(x, len(shape))
        out, rstd = _forward(x, shape, weight, eps, rstd_shape=st)
        ctx.shape, ctx.eps = shape, eps
        _save(ctx, x, weight, rstd)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, rstd = _saved(ctx)
        want_dx, _, want_dw, _ = ctx.needs_input_grad
        mask = (want_dx, want_dw and weight is not None)
        if batched(grad_out):  # a vmap's gradients: torch's ops
            dx, dw = _backward_composite(
                grad_out, x, weight, ctx.eps, ctx.shape
            )
            dx, dw = none_unless(mask, dx, dw)
        elif torch.is_grad_enabled():  # create_graph: differentiable op
            dx, dw = _backward_op(
                grad_out, x, ctx.shape, rstd, weight, mask, ctx.eps
            )
        else:
            dx, dw = _backward(grad_out, x, ctx.shape, weight, rstd, *mask)
        return dx, None, dw, None


_rms_norm_function = eager_apply(RMSNormFunction)


# ---- torch.library ops ---------------------------------------------------


@define_op("rms_norm")
def _rms_norm_op(
    input: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: Optional[torch.Tensor],
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, rstd), rstd of shape input.shape[:-k] + (1,) * k in fp32
    (fp64 for fp64 input)."""
    shape = tuple(normalized_shape)
    st = stat_view_shape(input, len(shape))
    return _forward(plain(input), shape, param(weight), eps, rstd_shape=st)


@_rms_norm_op.register_fake
def _(input, normalized_shape, weight, eps):
    check_traced(input, normalized_shape, (("weight", weight),), "rms_norm")
    st = stat_view_shape(input, len(normalized_shape))
    return (
        torch.empty_like(input, memory_format=torch.contiguous_format),
        input.new_empty(st, dtype=stats_dtype(input.dtype)),
    )


def _rms_norm_setup(ctx, inputs, output):
    input, shape, weight, eps = inputs
    ctx.shape, ctx.eps = tuple(shape), eps
    _save(ctx, input, weight, output[1])
    ctx.mark_non_differentiable(output[1])


def _rms_norm_grad(ctx, grad_out, _grstd):
    x, weight, rstd = _saved(ctx)
    want_dx, _, want_dw, _ = ctx.needs_input_grad
    mask = (want_dx, want_dw and weight is not None)
    dx, dw = _backward_op(grad_out, x, ctx.shape, rstd, weight, mask, ctx.eps)
    return dx, None, dw, None


_rms_norm_op.register_autograd(_rms_norm_grad, setup_context=_rms_norm_setup)
# The installed torch's CUDA autocast rule: rms_norm is on its fp32 list in
# some releases (2.13: as layer_norm) and on none in others (2.11 keeps the
# input's dtype). Neither has a CPU rule.
_CUDA_AUTOCAST_FP32 = torch._C._dispatch_has_kernel_for_dispatch_key(
    "aten::rms_norm", "AutocastCUDA"
)
if _CUDA_AUTOCAST_FP32:
    register_autocast(torch.ops.gemsops.rms_norm.default, "cuda", "fp32")


@_rms_norm_op.register_composite
def _(input, normalized_shape, weight, eps):
    return _forward_torch(input, tuple(normalized_shape), weight, eps)


def _backward_op(grad_out, x, shape, rstd, weight, mask, eps):
    dx, dw = torch.ops.gemsops.rms_norm_backward(
        grad_out, x, shape, rstd, weight, list(mask), eps
    )
    return none_unless(mask, dx, dw)


@define_op("rms_norm_backward")
def _rms_norm_backward_op(
    grad_out: torch.Tensor,
    input: torch.Tensor,
    normalized_shape: Sequence[int],
    rstd: torch.Tensor,
    weight: Optional[torch.Tensor],
    output_mask: Sequence[bool],
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_input, grad_weight); an output output_mask leaves out has 0
    elements. eps is the forward's: only the second order uses it."""
    weight = param(weight)
    dx, dw = _backward(
        grad_out,
        plain(input),
        tuple(normalized_shape),
        weight,
        plain(rstd).reshape(-1),
        *map(bool, output_mask),
    )
    pdtype = weight.dtype if weight is not None else input.dtype
    return (
        dx if dx is not None else unwanted(input, input.dtype),
        dw if dw is not None else unwanted(input, pdtype),
    )


@_rms_norm_backward_op.register_fake
def _(grad_out, input, normalized_shape, rstd, weight, output_mask, eps):
    named = (("grad_out", grad_out), ("rstd", rstd), ("weight", weight))
    check_one_device("rms_norm_backward", input, named)
    pdtype = weight.dtype if weight is not None else input.dtype
    return (
        torch.empty_like(input, memory_format=torch.contiguous_format)
        if output_mask[0]
        else unwanted(input, input.dtype),
        input.new_empty(tuple(normalized_shape), dtype=pdtype)
        if output_mask[1]
        else unwanted(input, pdtype),
    )


def _backward_composite(g, x, weight, eps, shape):
    """(dx, dw) of rms_norm at x in differentiable torch ops, rstd
    recomputed from x so that its dependence on x is differentiated."""
    nd = len(shape)
    cols = tuple(range(x.dim() - nd, x.dim()))
    cd = stats_dtype(x.dtype)
    xf, gf = x.to(cd), g.to(cd)
    r = torch.rsqrt((xf * xf).mean(cols, keepdim=True) + eps)
    xhat = xf * r
    gw = gf * weight.to(cd) if weight is not None else gf
    dx = r * (gw - xhat * (gw * xhat).mean(cols, keepdim=True))
    pdtype = weight.dtype if weight is not None else x.dtype
    return dx.to(x.dtype), sum_rows(gf * xhat, nd).to(pdtype)


def _forward_torch(x, shape, weight, eps, fn="rms_norm"):
    """rms_norm in torch's differentiable ops, for torch_only(): (out,
    rstd) as the op returns them, rstd not differentiable."""
    check_traced(x, shape, (("weight", weight),), fn)
    if _CUDA_AUTOCAST_FP32 and x.is_cuda and torch.is_autocast_enabled("cuda"):
        x, weight = cast_floating((x, weight), "cuda", torch.float32)
    cols = tuple(range(x.dim() - len(shape), x.dim()))
    xf = x.to(stats_dtype(x.dtype))
    rstd = torch.rsqrt((xf * xf).mean(cols, keepdim=True) + eps)
    y = xf * rstd
    if weight is not None:
        y = y * weight.to(y.dtype)
    return y.to(x.dtype), rstd.detach()


def _rms_norm_backward_setup(ctx, inputs, output):
    grad_out, x, shape, _, weight, mask, eps = inputs
    ctx.shape, ctx.eps = tuple(shape), eps
    ctx.mask = tuple(map(bool, mask))
    ctx.save_for_backward(grad_out, x, weight)


def _rms_norm_backward_grad(ctx, gdx, gdw):
    """Second order: the vector-Jacobian product of the composite above
    with respect to grad_out, input and weight."""
    g, x, weight = ctx.saved_tensors
    need = ctx.needs_input_grad
    cots = tuple(
        c if m and c is not None and c.numel() else None
        for c, m in zip((gdx, gdw), ctx.mask)
    )

    def composite(g, x, w=None):
        outs = _backward_composite(g, x, w, ctx.eps, ctx.shape)
        return tuple(o for o, c in zip(outs, cots) if c is not None)

    primals = (g, x) if weight is None else (g, x, weight)
    if all(c is None for c in cots):
        grads = second_order_zeros(primals)
    else:
        grads = second_order_vjp(composite, primals, cots)
    dg, dx = grads[0], grads[1]
    dw = weight_second_order(grads, weight, cots)
    if torch.is_grad_enabled():  # create_graph: a third order may follow
        dg, dx, dw = NoThirdOrder.apply("rms_norm", dg, dx, dw)
    return (
        dg if need[0] else None,
        dx if need[1] else None,
        None,
        None,
        dw if need[4] else None,
        None,
        None,
    )


_rms_norm_backward_op.register_autograd(
    _rms_norm_backward_grad,
    setup_context=_rms_norm_backward_setup,
    materialize=False,  # weight_second_order tells an unused weight
)


# ---- public --------------------------------------------------------------


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """Drop-in for torch.nn.functional.rms_norm. weight may be fp32 with
    fp16/bf16 input (mixed precision); the output has input's dtype."""
    if tensor_like(input, weight):
        return handle_torch_function(
            rms_norm, (input, weight), input, normalized_shape, weight, eps
        )
    if isinstance(input, torch.Tensor) and (
        input.is_nested or input.layout is not _strided
    ):
        # no kernel for nested or sparse tensors: torch's own computes
        # them (or refuses them with its exception)
        return torch.nn.functional.rms_norm(
            input, normalized_shape, weight, eps
        )
    input, shape, weight = _prepare(
        input, normalized_shape, weight, "rms_norm"
    )
    if input.dtype in _COMPLEX or weight is not None and weight.is_complex():
        # no kernel of ours: torch's composite (which, for a complex
        # weight beside real input, drops the imaginary part and warns)
        return torch.nn.functional.rms_norm(input, shape, weight, eps)
    if folds_leading_dims(input, len(shape)):
        y = rms_norm(rows_of(input, len(shape)), shape, weight, eps)
        return unsafe_view(y, input.shape)
    eps = _eps(eps, input.dtype)
    weight = _weight_for(input, weight)
    if not eager((input, weight)):
        if torch_only():
            return _forward_torch(input, shape, weight, eps)[0]
        return _rms_norm_op(input, shape, weight, eps)[0]
    if needs_grad(input, weight, None):
        return _rms_norm_function(input, shape, weight, eps)
    return _forward(input, shape, weight, eps, want_rstd=False)[0]
