"""LayerNorm: torch.nn.functional.layer_norm / torch.native_layer_norm
semantics over gemsops._C's forward and fused backward kernels.

The Python layer allocates every output and workspace with torch (so they
come from torch's caching allocator on the right device) and passes them
down; the C side validates and launches on torch's current stream."""

import math
from typing import Optional, Sequence

import torch
from torch.overrides import handle_torch_function

from .. import _C
from .._dispatch import (
    batched,
    cast_floating,
    define_op,
    eager,
    eager_apply,
    not_tensor,
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
    normalized_shape_arg,
    param,
    prepare,
    prepare_layer_norm,
    rows_of,
    rows_view_ok,
    stat_view_shape,
    stats_dtype,
)
from ._norm_launch import (
    bias_grad_apart,
    grad_bias,
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


def _forward(x, shape, weight, bias, eps, want_stats=True, stats_shape=None):
    """Returns (out, mean, rstd); mean/rstd flat [M] (or of stats_shape,
    M elements), or None when not wanted (inference skips allocating
    them)."""
    nd = len(shape)
    if not x.is_contiguous() and not rows_view_ok(x, nd):
        x = x.contiguous()
    # empty_like: less host time than empty(shape, ...), which parses more
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    mean = rstd = None
    if want_stats:  # two allocations cost less than one plus two views
        if stats_shape is None:
            stats_shape = math.prod(x.shape[: x.dim() - nd])
        sd = stats_dtype(x.dtype)
        # no device argument to parse; C takes any shape of M elements
        mean = x.new_empty(stats_shape, dtype=sd)
        rstd = x.new_empty(stats_shape, dtype=sd)
    # for no elements C checks the arguments and computes nothing
    call_aligned(
        lambda x, w, b: _C.layer_norm_fwd(x, w, b, nd, eps, out, mean, rstd),
        x,
        weight,
        bias,
    )
    if want_stats and x.numel() == 0:
        # as torch: the mean of no values 0, the rstd NaN
        mean.zero_()
        rstd.fill_(float("nan"))
    return out, mean, rstd


def _backward(
    grad_out,
    x,
    shape,
    weight,
    mean,
    rstd,
    want_dx,
    want_dw,
    want_db,
    deterministic=None,
    bias=None,
):
    nd = len(shape)
    if want_db and bias_grad_apart(x, weight, bias):
        db = grad_bias(grad_out, nd, bias)
        dx, dw, _ = _backward(
            grad_out,
            x,
            shape,
            weight,
            mean,
            rstd,
            want_dx,
            want_dw,
            False,
            deterministic,
        )
        return dx, dw, db
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    x = as_rows(x, nd)
    grad_out = as_rows(plain(grad_out), nd)
    dx, dw, db = grad_outputs(x, shape, weight, want_dx, want_dw, want_db)
    args = (grad_out, x, weight, nd, deterministic, mean, rstd, dx, dw, db)
    plan = (x, weight, nd, deterministic, want_dx, want_dw, want_db)
    launch_backward(
        _C.layer_norm_bwd,
        _C.layer_norm_bwd_workspace,
        args,
        plan,
        want_dx or want_dw or want_db,
    )
    return dx, dw, db


class LayerNormFunction(torch.autograd.Function):
    """The eager path: forward through layer_norm_fwd; backward through the
    ONE fused kernel (dx + atomic dW/dB), computing only the gradients
    autograd asks for. Under create_graph the backward is the
    gemsops::layer_norm_backward op, whose own autograd gives second
    order gradients."""

    @staticmethod
    def forward(ctx, x, shape, weight, bias, eps, stats):
        # the statistics shaped as the op's (traced code's): a
        # non-reentrant checkpoint whose recomputation takes the other
        # path (a mode open in the forward alone) unpacks those
        st = stat_view_shape(x, len(shape))
        out, mean, rstd = _forward(x, shape, weight, bias, eps, stats_shape=st)
        ctx.shape = shape
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, weight, mean, rstd, bias)
        if not stats:
            return out
        # as torch.native_layer_norm: differentiable through out only
        ctx.mark_non_differentiable(mean, rstd)
        return out, mean, rstd

    @staticmethod
    def backward(ctx, grad_out, *_):
        x, weight, mean, rstd, bias = ctx.saved_tensors
        want_dx, _, want_dw, want_db, _, _ = ctx.needs_input_grad
        mask = (
            want_dx,
            want_dw and weight is not None,
            want_db and ctx.has_bias,
        )
        if batched(grad_out):  # a vmap's gradients: torch's ops
            dx, dw, db = _backward_torch(
                grad_out, x, ctx.shape, mean, rstd, weight, bias, mask
            )
        elif torch.is_grad_enabled():  # create_graph: differentiable op
            dx, dw, db = _backward_op(
                grad_out, x, ctx.shape, mean, rstd, weight, mask, bias=bias
            )
        else:
            dx, dw, db = _backward(
                grad_out, x, ctx.shape, weight, mean, rstd, *mask, bias=bias
            )
        return dx, None, dw, db, None, None


_layer_norm_function = eager_apply(LayerNormFunction)


# ---- torch.library ops ---------------------------------------------------


@define_op("layer_norm")
def _layer_norm_op(
    input: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """torch.native_layer_norm: (out, mean, rstd), statistics of shape
    input.shape[:-k] + (1,) * k in fp32 (fp64 for fp64 input)."""
    shape = tuple(normalized_shape)
    st = stat_view_shape(input, len(shape))
    return _forward(
        plain(input), shape, param(weight), param(bias), eps, stats_shape=st
    )


@_layer_norm_op.register_fake
def _(input, normalized_shape, weight, bias, eps):
    check_traced(
        input,
        normalized_shape,
        (("weight", weight), ("bias", bias)),
        "layer_norm",
    )
    st = stat_view_shape(input, len(normalized_shape))
    sd = stats_dtype(input.dtype)
    return (
        torch.empty_like(input, memory_format=torch.contiguous_format),
        input.new_empty(st, dtype=sd),
        input.new_empty(st, dtype=sd),
    )


def _layer_norm_setup(ctx, inputs, output):
    input, shape, weight, bias, _ = inputs
    _, mean, rstd = output
    ctx.shape = tuple(shape)
    ctx.has_bias = bias is not None
    ctx.save_for_backward(input, weight, mean, rstd, bias)
    ctx.mark_non_differentiable(mean, rstd)


def _layer_norm_grad(ctx, grad_out, _gmean, _grstd):
    x, weight, mean, rstd, bias = ctx.saved_tensors
    want_dx, _, want_dw, want_db, _ = ctx.needs_input_grad
    mask = (want_dx, want_dw and weight is not None, want_db and ctx.has_bias)
    dx, dw, db = _backward_op(
        grad_out, x, ctx.shape, mean, rstd, weight, mask, bias=bias
    )
    return dx, None, dw, db, None


_layer_norm_op.register_autograd(
    _layer_norm_grad, setup_context=_layer_norm_setup
)


@_layer_norm_op.register_composite
def _(input, normalized_shape, weight, bias, eps):
    return _forward_torch(input, tuple(normalized_shape), weight, bias, eps)


def _backward_op(
    grad_out, x, shape, mean, rstd, weight, mask, deterministic=None, bias=None
):
    dx, dw, db = torch.ops.gemsops.layer_norm_backward(
        grad_out, x, shape, mean, rstd, weight, bias, list(mask), deterministic
    )
    return none_unless(mask, dx, dw, db)


@define_op("layer_norm_backward")
def _layer_norm_backward_op(
    grad_out: torch.Tensor,
    input: torch.Tensor,
    normalized_shape: Sequence[int],
    mean: torch.Tensor,
    rstd: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    output_mask: Sequence[bool],
    deterministic: Optional[bool] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """native_layer_norm_backward: (grad_input, grad_weight, grad_bias);
    an output output_mask leaves out has 0 elements. mean/rstd: fp32
    (fp64 for fp64 input), any shape with one value per row."""
    shape = tuple(normalized_shape)
    weight = param(weight)
    dx, dw, db = _backward(
        grad_out,
        plain(input),
        shape,
        weight,
        plain(mean).reshape(-1),
        plain(rstd).reshape(-1),
        *map(bool, output_mask),
        deterministic,
        bias=bias,
    )
    pdtype = weight.dtype if weight is not None else input.dtype
    bdtype = _grad_bias_dtype(input, weight, bias)
    return (
        dx if dx is not None else unwanted(input, input.dtype),
        dw if dw is not None else unwanted(input, pdtype),
        db if db is not None else unwanted(input, bdtype),
    )


def _grad_bias_dtype(input, weight, bias):
    if weight is not None:
        return weight.dtype
    return bias.dtype if bias is not None else input.dtype


@_layer_norm_backward_op.register_fake
def _(
    grad_out,
    input,
    normalized_shape,
    mean,
    rstd,
    weight,
    bias,
    output_mask,
    deterministic=None,
):
    check_one_device(
        "layer_norm_backward",
        input,
        (
            ("grad_out", grad_out),
            ("mean", mean),
            ("rstd", rstd),
            ("weight", weight),
            ("bias", bias),
        ),
    )
    pdtype = weight.dtype if weight is not None else input.dtype
    bdtype = _grad_bias_dtype(input, weight, bias)
    shape = tuple(normalized_shape)
    return (
        torch.empty_like(input, memory_format=torch.contiguous_format)
        if output_mask[0]
        else unwanted(input, input.dtype),
        input.new_empty(shape, dtype=pdtype)
        if output_mask[1]
        else unwanted(input, pdtype),
        input.new_empty(shape, dtype=bdtype)
        if output_mask[2]
        else unwanted(input, bdtype),
    )


def _eps_of(x, rstd, shape):
    """eps back from the kernel's rstd: 1/rstd^2 - var (a constant: no
    graph, so every derivative order is that of rsqrt(var + eps))."""
    with torch.no_grad():
        cd = stats_dtype(x.dtype)
        xf = x.detach().to(cd)
        cols = tuple(range(x.dim() - len(shape), x.dim()))
        var = xf.var(cols, unbiased=False, keepdim=True)
        return rstd.detach().to(cd).reshape(var.shape).pow(-2) - var


def _backward_composite(g, x, weight, eps, shape):
    """The backward in differentiable torch ops: (dx, dw, db) of
    layer_norm at x, with the row statistics recomputed from x so that
    their dependence on x is differentiated too; eps per row from
    _eps_of, so the values are the kernel's."""
    cols = tuple(range(x.dim() - len(shape), x.dim()))
    xf = x.to(stats_dtype(x.dtype))
    mu = xf.mean(cols, keepdim=True)
    xc = xf - mu
    r = torch.rsqrt((xc * xc).mean(cols, keepdim=True) + eps)
    dx, dw, db = _backward_formula(g, x, len(shape), xc * r, r, weight)
    pdtype = weight.dtype if weight is not None else x.dtype
    return dx, dw.to(pdtype), db.to(pdtype)


def _backward_formula(g, x, nd, xhat, r, weight):
    """aten's LayerNorm backward in torch's ops, given x-hat and rstd in
    the statistics' dtype: (dx in x's dtype, dw and db unrounded)."""
    cols = tuple(range(x.dim() - nd, x.dim()))
    gf = g.to(xhat.dtype)
    gw = gf * weight.to(gf.dtype) if weight is not None else gf
    dx = r * (
        gw
        - gw.mean(cols, keepdim=True)
        - xhat * (gw * xhat).mean(cols, keepdim=True)
    )
    return dx.to(x.dtype), sum_rows(gf * xhat, nd), sum_rows(gf, nd)


def _forward_torch(x, shape, weight, bias, eps, fn="layer_norm"):
    """native_layer_norm in torch's differentiable ops, for torch_only()
    (forward-mode AD, functorch): (out, mean, rstd) as the op returns
    them, the statistics in fp32 (fp64 for fp64 input)."""
    check_traced(x, shape, (("weight", weight), ("bias", bias)), fn)
    if x.is_cuda and torch.is_autocast_enabled("cuda"):
        # the op's CUDA autocast rule (fp32), as torch's layer_norm
        x, weight, bias = cast_floating(
            (x, weight, bias), "cuda", torch.float32
        )
    cols = tuple(range(x.dim() - len(shape), x.dim()))
    xf = x.to(stats_dtype(x.dtype))
    mean = xf.mean(cols, keepdim=True)
    xc = xf - mean
    rstd = torch.rsqrt((xc * xc).mean(cols, keepdim=True) + eps)
    if math.prod(shape) == 0:  # rows of nothing: mean 0, rstd NaN (torch's)
        mean, rstd = mean.nan_to_num(0.0), rstd.nan_to_num(math.nan)
    y = xc * rstd
    if weight is not None:
        y = y * weight.to(y.dtype)
    if bias is not None:
        y = y + bias.to(y.dtype)
    # the statistics are not differentiable, as torch's native_layer_norm's
    return y.to(x.dtype), mean.detach(), rstd.detach()


def _backward_torch(g, x, shape, mean, rstd, weight, bias, mask):
    """layer_norm_backward in torch's differentiable ops at the given
    statistics (aten's formula), for torch_only(). Differentiated as
    torch's derivative of the op, and as this op's own backward: mean and
    rstd are the input's (their values the given ones; their derivatives
    mean's and rsqrt(var + eps)'s, at the given rstd)."""
    check_traced(
        x, shape, (("weight", weight), ("bias", bias)), "layer_norm_backward"
    )
    cd, st = stats_dtype(x.dtype), stat_view_shape(x, len(shape))
    cols = tuple(range(x.dim() - len(shape), x.dim()))
    xf = x.to(cd)
    mu = xf.mean(cols, keepdim=True)
    var = xf.var(cols, unbiased=False, keepdim=True)
    r = rstd.detach().to(cd).reshape(st)
    r = r - 0.5 * r.pow(3) * (var - var.detach())  # exactly r, in value
    xhat = (xf - (mean.detach().to(cd).reshape(st) + (mu - mu.detach()))) * r
    dx, dw, db = _backward_formula(g, x, len(shape), xhat, r, weight)
    pdtype = weight.dtype if weight is not None else x.dtype
    return (
        dx if mask[0] else None,
        dw.to(pdtype) if mask[1] else None,
        db.to(_grad_bias_dtype(x, weight, bias)) if mask[2] else None,
    )


def _layer_norm_backward_setup(ctx, inputs, output):
    grad_out, x, shape, mean, rstd, weight, _, mask, _ = inputs
    ctx.shape = tuple(shape)
    ctx.mask = tuple(map(bool, mask))
    ctx.save_for_backward(grad_out, x, rstd, weight)


def _layer_norm_backward_grad(ctx, gdx, gdw, gdb):
    """Second order: the vector-Jacobian product of the composite backward
    above, with respect to grad_out, input and weight (mean and rstd are
    functions of input, differentiated through it)."""
    g, x, rstd, weight = ctx.saved_tensors
    need = ctx.needs_input_grad
    cots = tuple(
        c if m and c is not None and c.numel() else None
        for c, m in zip((gdx, gdw, gdb), ctx.mask)
    )
    primals = (g, x) if weight is None else (g, x, weight)
    if all(c is None for c in cots):
        grads = second_order_zeros(primals)
    else:
        eps = _eps_of(x, rstd, ctx.shape)
        grads = second_order_vjp(
            lambda g, x, w=None: _composite_masked(g, x, w, eps, ctx, cots),
            primals,
            cots,
        )
    dg, dx = grads[0], grads[1]
    dw = weight_second_order(grads, weight, cots)
    if torch.is_grad_enabled():  # create_graph: a third order may follow
        dg, dx, dw = NoThirdOrder.apply("layer_norm", dg, dx, dw)
    return (
        dg if need[0] else None,
        dx if need[1] else None,
        None,
        None,
        None,
        dw if need[5] else None,
        None,
        None,
        None,
    )


def _composite_masked(g, x, w, eps, ctx, cots):
    outs = _backward_composite(g, x, w, eps, ctx.shape)
    return tuple(o for o, c in zip(outs, cots) if c is not None)


_layer_norm_backward_op.register_autograd(
    _layer_norm_backward_grad,
    setup_context=_layer_norm_backward_setup,
    materialize=False,  # weight_second_order tells an unused weight
)
register_autocast(torch.ops.gemsops.layer_norm.default, "cuda", "fp32")


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Drop-in for torch.nn.functional.layer_norm. weight/bias may be fp32
    with fp16/bf16 input (mixed precision); the output has input's dtype."""
    if tensor_like(input, weight, bias):
        return handle_torch_function(
            layer_norm,
            (input, weight, bias),
            input,
            normalized_shape,
            weight,
            bias,
            eps,
        )
    if isinstance(input, torch.Tensor) and input.is_nested:
        # no kernel for nested tensors: torch's own computes them
        return torch.nn.functional.layer_norm(
            input, normalized_shape, weight, bias, eps
        )
    input, shape, weight, bias = prepare_layer_norm(
        input, normalized_shape, weight, bias
    )
    if folds_leading_dims(input, len(shape)):
        y = layer_norm(rows_of(input, len(shape)), shape, weight, bias, eps)
        return unsafe_view(y, input.shape)
    if type(eps) is not float:
        eps = eps_arg(eps, "layer_norm")
    if not eager((input, weight, bias)):
        if torch_only():
            return _forward_torch(input, shape, weight, bias, eps)[0]
        return _layer_norm_op(input, shape, weight, bias, eps)[0]
    if needs_grad(input, weight, bias):
        return _layer_norm_function(input, shape, weight, bias, eps, False)
    return _forward(input, shape, weight, bias, eps, want_stats=False)[0]


def native_layer_norm(
    input, normalized_shape, weight=None, bias=None, eps=1e-5
):
    """Like torch.native_layer_norm: (out, mean, rstd), statistics in fp32
    (fp64 for fp64 input) of shape input.shape[:-k] + (1,) * k;
    differentiable through out, as torch's."""
    if tensor_like(input, weight, bias):
        return handle_torch_function(
            native_layer_norm,
            (input, weight, bias),
            input,
            normalized_shape,
            weight,
            bias,
            eps,
        )
    fn = "native_layer_norm"
    input, shape, weight, bias = prepare_layer_norm(
        input, normalized_shape, weight, bias, fn
    )
    if folds_leading_dims(input, len(shape)):
        rows = rows_of(input, len(shape))
        out, mean, rstd = native_layer_norm(rows, shape, weight, bias, eps)
        stat_shape = stat_view_shape(input, len(shape))
        # the statistics as views: the backward saves them
        return (
            unsafe_view(out, input.shape),
            mean.view(stat_shape),
            rstd.view(stat_shape),
        )
    if type(eps) is not float:
        eps = eps_arg(eps, fn)
    if not eager((input, weight, bias)):
        if torch_only():
            return _forward_torch(input, shape, weight, bias, eps, fn)
        return _layer_norm_op(input, shape, weight, bias, eps)
    # the statistics made in their shape, tensors of their own as torch's
    # (a view of them refuses detach_())
    try:
        if needs_grad(input, weight, bias):
            return _layer_norm_function(input, shape, weight, bias, eps, True)
        st = stat_view_shape(input, len(shape))
        return _forward(input, shape, weight, bias, eps, stats_shape=st)
    except (RuntimeError, NotImplementedError) as e:
        # the C boundary names its refusals after layer_norm's forward
        if not str(e).startswith("layer_norm("):
            raise
        raise type(e)(f"native_{e}") from None


def layer_norm_backward(
    grad_out,
    input,
    normalized_shape,
    mean,
    rstd,
    weight=None,
    bias=None,
    output_mask=(True, True, True),
    deterministic=None,
):
    """Like torch.ops.aten.native_layer_norm_backward: (grad_input,
    grad_weight, grad_bias), each None where output_mask says so. mean and
    rstd may come in the input's half type, as torch's CPU
    native_layer_norm returns them; they are widened to fp32 first."""
    if tensor_like(grad_out, input, mean, rstd, weight, bias):
        return handle_torch_function(
            layer_norm_backward,
            (grad_out, input, mean, rstd, weight, bias),
            grad_out,
            input,
            normalized_shape,
            mean,
            rstd,
            weight,
            bias,
            output_mask,
            deterministic,
        )
    fn = "layer_norm_backward"
    normalized_shape = _backward_args(
        grad_out,
        input,
        normalized_shape,
        mean,
        rstd,
        weight,
        bias,
        output_mask,
    )
    output_mask = tuple(map(bool, output_mask))  # for the op's bool[]
    input, shape, weight, bias = prepare(
        input, normalized_shape, weight, bias, fn
    )
    nd = len(shape)
    folds = folds_leading_dims(input, nd) and grad_out.shape == input.shape
    if folds or input.numel() == 0:
        rows = math.prod(input.shape[: input.dim() - nd])
    if input.numel() == 0 and (mean.numel() != rows or rstd.numel() != rows):
        # no element reads the statistics, and torch takes them of any
        # size there (its CUDA forward refuses some such inputs, whose
        # callers then pass placeholders): C gets one a row, unread
        mean = rstd = input.new_zeros(rows, dtype=stats_dtype(input.dtype))
    if folds:
        stat = (rows,) + (1,) * nd
        mean, rstd = (
            s.reshape(stat) if s.numel() == rows else s for s in (mean, rstd)
        )
        dx, dw, db = layer_norm_backward(
            rows_of(grad_out, nd),
            rows_of(input, nd),
            shape,
            mean,
            rstd,
            weight,
            bias,
            output_mask,
            deterministic,
        )
        return (None if dx is None else unsafe_view(dx, input.shape)), dw, db
    if bias is not None:
        # C reads no bias here: its rules as the forward's, in Python
        check_traced(input, shape, (("bias", bias),), fn)
        if weight is not None and weight.dtype != bias.dtype:
            raise RuntimeError(
                f"{fn}(): weight ({str(weight.dtype)[6:]}) and bias "
                f"({str(bias.dtype)[6:]}) must have one dtype"
            )
    want_dx, want_dw, want_db = map(bool, output_mask)
    for want, name, p in (
        (want_dw, "weight", weight),
        (want_db, "bias", bias),
    ):
        if want and p is None:  # torch fails here too (RuntimeError)
            raise RuntimeError(
                f"{fn}(): output_mask asks for grad_{name} but {name} is None"
            )
    sd = stats_dtype(input.dtype)
    for name, s in (("mean", mean), ("rstd", rstd)):
        if (
            s.dtype in (torch.float16, torch.bfloat16)
            and s.dtype != input.dtype
        ):
            # torch takes half statistics only as its CPU forward makes
            # them, in the input's own type
            raise RuntimeError(
                f"{fn}(): argument '{name}' has dtype {str(s.dtype)[6:]}; "
                f"expected {str(sd)[6:]} or the input's "
                f"{str(input.dtype)[6:]}"
            )
    mean, rstd = (
        s.to(sd) if s.dtype == input.dtype != sd else plain(s)
        for s in (mean, rstd)
    )
    mask = (want_dx, want_dw, want_db)
    direct = eager((grad_out, input, mean, rstd, weight))
    if not direct and torch_only():
        args = (grad_out, input, shape, mean, rstd, weight)
        return _backward_torch(*args, bias, mask)
    if not direct or (
        torch.is_grad_enabled()
        and any(
            t is not None and t.requires_grad
            for t in (grad_out, input, weight)
        )
    ):
        return _backward_op(
            grad_out,
            input,
            shape,
            mean,
            rstd,
            weight,
            mask,
            deterministic,
            bias=bias,
        )
    return _backward(
        grad_out,
        input,
        shape,
        weight,
        mean.reshape(-1),
        rstd.reshape(-1),
        want_dx,
        want_dw,
        want_db,
        deterministic,
        bias=bias,
    )


def _backward_args(
    grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask
):
    """Arguments torch.ops.aten.native_layer_norm_backward would not match
    to its schema raise RuntimeError, as there; returns normalized_shape as
    a sequence (that schema takes ndarrays and tensors too)."""
    fn = "layer_norm_backward"
    for name, t in (
        ("grad_out", grad_out),
        ("input", input),
        ("mean", mean),
        ("rstd", rstd),
    ):
        if not isinstance(t, torch.Tensor):
            raise not_tensor(fn, name, t, exc=RuntimeError)
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise not_tensor(fn, name, t, " or None", RuntimeError)
    try:  # any sequence of 3 (a NumPy array, a range), as torch's schema
        three = (
            not isinstance(output_mask, (str, bytes, torch.Tensor))
            and len(output_mask) == 3
        )
    except TypeError:  # no len(), or a 0-d array's
        three = False
    if not three:
        raise RuntimeError(
            f"{fn}(): output_mask must be 3 bools, got {output_mask!r}"
        )
    if hasattr(normalized_shape, "tolist"):
        normalized_shape = normalized_shape.tolist()
    try:
        return normalized_shape_arg(normalized_shape, fn)
    except TypeError as e:
        raise RuntimeError(str(e)) from None
