"""addmm and linear (torch.addmm / torch.nn.functional.linear semantics)
over gemsops' matmul. In eager code the bias (and alpha, beta) go through
the kernel's epilogue: alpha * A @ B + beta * bias in fp32, rounded once,
as torch's addmm does it; the bias's gradient is the sum of the output's
over rows. Traced code (compile, export, autocast, the JIT tracer, meta
tensors) takes the same epilogue through the gemsops::addmm op; calls it
cannot take (batched mats, a bias that is a tensor-valued alpha's) run the
product, then torch's add. The products, forward and backward, run on
gemsops' kernels on transposed views without copies."""

import functools
import math
import numbers
import warnings

import numpy as _np
import torch
from torch.overrides import handle_torch_function
from torch.utils.flop_counter import register_flop_formula

from .. import _C
from .._dispatch import (
    MAX_DIMS,
    _is_compiling,
    _strided,
    _tracing,
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
from ._out import into as _into
from ._out import refuse_partial_overlap
from .matmul import (
    SUPPORTED,
    _autocast_casts,
    _launch_product,
    _mm,
    _operands,
    matmul_as,
    mm,
    mm_as,
    product_flops,
    product_grads,
    save_operands,
    torch_out_dtype,
    transposed,
    unpack_operands,
)

_Tensor = torch.Tensor
_grad_enabled = torch.is_grad_enabled


def _rows(t):
    """t [*, k] as [rows, k] (a view where the strides allow)."""
    if t.dim() == 2:
        return t
    k = t.shape[-1]
    if k == 0:  # -1 cannot be inferred beside a 0
        return t.reshape(math.prod(t.shape[:-1]), 0)
    return t.reshape(-1, k)


def _unrows(out, shape):
    """out [rows, n] as shape[:-1] + [n] (shape: the rows' source), not a
    view of it (unsafe_view)."""
    if len(shape) == 2:
        return out
    return unsafe_view(out, (*shape[:-1], out.shape[-1]))


def _fused(input, mat1, mat2, alpha, beta):
    """alpha * mat1 @ mat2 + beta * input ([m, k] x [k, n]), one launch,
    no autograd."""
    return _mm(mat1, mat2, input if beta != 0 else None, alpha, beta)


class AddmmFunction(torch.autograd.Function):
    """alpha * mat1 @ mat2 + beta * input through one launch (input
    broadcast to [m, n], not read when beta == 0)."""

    @staticmethod
    def forward(ctx, input, mat1, mat2, alpha, beta):
        save_operands(ctx, mat1, mat2, ctx.needs_input_grad[1:3])
        ctx.alpha, ctx.beta = alpha, beta
        ctx.input_shape = input.shape
        return _fused(input, mat1, mat2, alpha, beta)

    @staticmethod
    def backward(ctx, g):
        mat1, mat2 = unpack_operands(ctx)
        g = plain(g)
        if batched(g):  # a vmap's gradients: torch's ops
            product = torch.matmul
        else:  # the ops under create_graph
            product = mm if torch.is_grad_enabled() else _mm
        need = ctx.needs_input_grad
        di = None
        if _bias_grad_fused(ctx, product, g, mat1):
            di = g.new_empty(g.shape[-1])
        d1, d2 = _scaled(
            product_grads(product, mat1, mat2, g, need[1:], ctx.layouts, di),
            ctx.alpha,
        )
        if need[0] and di is None:
            di = _grad_input(g, ctx.beta, ctx.input_shape)
        return di, d1, d2, None, None


def _scaled(grads, alpha):
    """The mats' gradients times alpha, after their products (as torch's
    addmm backward: alpha on g first would overflow or flush a half g)."""
    if alpha == 1:
        return grads
    return tuple(None if d is None else d * alpha for d in grads)


def _grad_input(g, beta, shape):
    """addmm's input gradient: beta * g summed to the input's shape (at
    beta == 0 zeros where g is finite and NaN where it is not, as torch's
    product by beta gives)."""
    gb = g * beta if beta != 1 else g
    return gb.sum_to_size(shape)


@functools.lru_cache(maxsize=None)
def _has_wgmma(index):
    return torch.cuda.get_device_capability(index)[0] == 9


def _bias_grad_fused(ctx, product, ga, x):
    """nn.Linear's bias gradient (grad summed over rows) made by the weight
    gradient's kernel: a [n] bias, both gradients asked, alpha = beta = 1
    (so it is ga's column sums), the weight transposed (its gradient's
    product then has ga^T for a), eager, and a row-sum kernel for it."""
    need = ctx.needs_input_grad
    return (
        need[0]
        and need[2]
        and product is _mm
        and ctx.alpha == 1
        and ctx.beta == 1
        and len(ctx.input_shape) == 1
        and ctx.input_shape[0] == ga.shape[-1]
        and ctx.layouts[1]
        and _row_sums_fit(ga, x)
    )


def _row_sums_fit(g, x):
    """A wgmma kernel makes g^T x with g's column sums beside it (the
    product's row sums, over k): half types on a Hopper GPU, g and x
    row-major with rows of whole 16-byte chunks. Elsewhere the sums would
    be a kernel of their own, slower than torch's reduction."""
    return (
        g.is_cuda
        and g.dtype in (torch.float16, torch.bfloat16)
        and g.shape[-1] % 8 == 0
        and x.shape[-1] % 8 == 0
        and g.is_contiguous()
        and x.stride(-1) == 1
        and x.stride(0) % 8 == 0
        and _has_wgmma(g.device.index)
    )


_addmm_function = eager_apply(AddmmFunction)


# ---- torch.library op: traced code keeps the epilogue's one rounding ----


@define_op("addmm")
def _addmm_op(
    input: torch.Tensor,
    mat1: torch.Tensor,
    mat2: torch.Tensor,
    beta: float,
    alpha: float,
) -> torch.Tensor:
    """beta * input + alpha * mat1 @ mat2 ([m, k] x [k, n], input broadcast
    to [m, n]), rounded once in the kernel's epilogue."""
    _check_op_mats(mat1, mat2)
    return _fused(plain(input), plain(mat1), plain(mat2), alpha, beta)


@_addmm_op.register_fake
def _(input, mat1, mat2, beta, alpha):
    _check_op_mats(mat1, mat2)
    return mat1.new_empty(mat1.shape[0], mat2.shape[1])


def _check_op_mats(mat1, mat2):
    """The op's mats are 2-D (the kernel would fold mat1's batch dims,
    which the fake kernel's shape does not)."""
    if mat1.dim() != 2 or mat2.dim() != 2:
        raise RuntimeError(
            "gemsops::addmm: mat1 and mat2 must be 2-D, got "
            f"{mat1.dim()}-D and {mat2.dim()}-D"
        )


def _addmm_op_setup(ctx, inputs, output):
    input, mat1, mat2, beta, alpha = inputs
    save_operands(ctx, mat1, mat2, ctx.needs_input_grad[1:3])
    ctx.alpha, ctx.beta, ctx.input_shape = alpha, beta, input.shape


def _addmm_op_grad(ctx, g):
    mat1, mat2 = unpack_operands(ctx)
    need = ctx.needs_input_grad
    d1, d2 = _scaled(
        product_grads(mm, mat1, mat2, g, need[1:3], ctx.layouts), ctx.alpha
    )
    di = _grad_input(g, ctx.beta, ctx.input_shape) if need[0] else None
    return di, d1, d2, None, None


_addmm_op.register_autograd(_addmm_op_grad, setup_context=_addmm_op_setup)


@_addmm_op.register_composite
def _(input, mat1, mat2, beta, alpha):
    return torch.addmm(input, mat1, mat2, beta=beta, alpha=alpha)


for _device in ("cpu", "cuda"):  # the autocast dtype, as torch.addmm
    register_autocast(torch.ops.gemsops.addmm.default, _device, "lower")


@register_flop_formula(torch.ops.gemsops.addmm)
def _addmm_flop_formula(input_shape, a_shape, b_shape, *args, **kw):
    return product_flops(a_shape, b_shape)  # the add uncounted, as aten's


def _traced_addmm_ok(input, mat1, mat2, alpha, beta):
    """Traced code (compile, export, autocast, the JIT tracer, meta) whose
    addmm the op above takes: numbers for alpha and beta, 2-D mats of one
    supported dtype (or autocast's to come) on one device, an input that
    broadcasts to [m, n]."""
    if isinstance(alpha, torch.Tensor) or isinstance(beta, torch.Tensor):
        return False
    if isinstance(alpha, complex) or isinstance(beta, complex):
        return False
    if not (
        isinstance(input, _Tensor)
        and isinstance(mat1, _Tensor)
        and isinstance(mat2, _Tensor)
        and mat1.dim() == 2
        and mat2.dim() == 2
        and mat1.shape[1] == mat2.shape[0]
        and input.dim() <= 2
        and _broadcasts(input.shape, (mat1.shape[0], mat2.shape[1]))
        and input.device == mat1.device
        and mat2.device == mat1.device
    ):
        return False
    dtypes = (input.dtype, mat1.dtype, mat2.dtype)
    if not all(d in SUPPORTED for d in dtypes):
        return False
    same = dtypes[0] == dtypes[1] == dtypes[2]
    return same or autocast_enabled(mat1.device.type)


def _folds(t):
    """C folds t's leading dims into rows of one stride (the views of
    nn.Linear's products in _C), up to the dims it takes."""
    return t.dim() <= 2 or t.is_contiguous() and t.dim() <= MAX_DIMS


def _linear(x, weight, bias):
    """x [*, in] @ weight^T (+ bias), one launch, no autograd: C views x's
    rows and the weight's transpose."""
    if not _folds(x):
        return _unrows(_mm(_rows(x), weight.mT, bias), x.shape)
    c = x.new_empty(*x.shape[:-1], weight.shape[0])  # sizes: see _mm
    return _launch_product(_C.linear, x, weight, c, bias)


class LinearFunction(torch.autograd.Function):
    """nn.Linear's product with the weight as stored ([out, in]), so that
    autograd records one node, not a transpose besides: one launch
    forward (the bias in the epilogue); backward, dx = g W and the
    weight's gradient g^T x made in the weight's layout, the bias's
    gradient (g's column sums) from that kernel where it can."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        # what the gradients read, as torch's: x for the weight's, the
        # weight for x's (as matmul.save_operands), with their layouts; an
        # N-D x's gradient is made in rows, contiguous
        need_x, need_w = ctx.needs_input_grad[:2]
        tx, tw = transposed(x), transposed(weight)
        ctx.save_for_backward(
            x if need_w else None, weight if need_x else None
        )
        ctx.saved_layouts = (need_w and tx, need_x and tw)  # unpack_operands
        ctx.x_shape = x.shape
        ctx.layouts = (need_x and x.dim() == 2 and tx, need_w and tw)
        return _linear(x, weight, bias)

    @staticmethod
    def backward(ctx, g):
        x, weight = unpack_operands(ctx)
        g = plain(g)
        if batched(g):  # a vmap's gradients: torch's ops
            return _linear_graph_grads(ctx, g, x, weight, torch.mm)
        if torch.is_grad_enabled():  # create_graph: the differentiable ops
            return _linear_graph_grads(ctx, g, x, weight, mm)
        need_x, need_w, need_b = ctx.needs_input_grad
        x_t, w_t = ctx.layouts
        if not (_folds(g) and (x is None or _folds(x))):
            # copies where the strides do not fold
            g, x = _rows(g), None if x is None else _rows(x)
        dx = dw = db = None
        if need_x and x_t:  # x's gradient in x's layout
            dx = _mm(weight.mT, g.mT).mT
        elif need_x:
            dx = g.new_empty(*g.shape[:-1], weight.shape[1])
            _launch_product(_C.linear_grad_input, g, weight, dx)
        if need_w and w_t:  # (x^T g)^T, the weight's layout
            dw = x.new_empty(x.shape[-1], g.shape[-1])
            dw = _launch_product(_C.linear_grad_weight, x, g, dw).mT
        elif need_w:
            if need_b and _row_sums_fit(g, x):
                db = g.new_empty(g.shape[-1])
            dw = g.new_empty(g.shape[-1], x.shape[-1])
            _launch_product(_C.linear_grad_weight, g, x, dw, row_sums=db)
        if need_b and db is None:
            db = _rows(g).sum(0)
        if dx is not None and dx.dim() != len(ctx.x_shape):
            dx = dx.view(ctx.x_shape)
        return dx, dw, db


def _linear_graph_grads(ctx, g, x, weight, product):
    """LinearFunction's gradients through differentiable products (gemsops'
    mm under create_graph, so that their graph gives second order ones;
    torch's for a vmap's gradients)."""
    need_x, need_w, need_b = ctx.needs_input_grad
    g2 = _rows(g)
    dx = product(g2, weight) if need_x else None
    if dx is not None and len(ctx.x_shape) != 2:
        dx = dx.view(ctx.x_shape)
    dw = product(g2.mT, _rows(x)) if need_w else None
    db = g2.sum(0) if need_b else None
    return dx, dw, db


_linear_function = eager_apply(LinearFunction)


def _linear_ok(x, weight, bias):
    """Eager, valid tensors that LinearFunction takes as they are: one
    supported dtype, one device, a 2-D weight, a [out] bias or none, no
    negative bit (every other case, errors included, takes the general
    path). Spelled out, each attribute read once: it runs on every call."""
    if not (isinstance(x, _Tensor) and isinstance(weight, _Tensor)):
        return False
    if not eager((x, weight, bias)):  # first: under Dynamo, nothing after
        return False
    dtype, device = x.dtype, x.device
    if bias is not None and not (
        isinstance(bias, _Tensor)
        and bias.dtype is dtype
        and bias.device == device
        and bias.dim() == 1
        and bias.shape == weight.shape[:1]
        and bias.layout is _strided
        and not bias.is_neg()
    ):
        return False
    return (
        weight.dtype is dtype
        and dtype in SUPPORTED
        and weight.device == device
        and weight.dim() == 2
        and weight.layout is _strided
        and x.layout is _strided
        and not x.is_nested
        and x.dim() >= 1
        and x.shape[-1] == weight.shape[1]
        and not x.is_neg()
        and not weight.is_neg()
    )


def _epilogue_ok(bias, a, b):
    """Eager, valid tensors the fused launch takes: one supported dtype,
    one device (the full checks stay on the other path). Spelled out, not
    looped: it runs on every call."""
    Tensor = torch.Tensor
    return (
        isinstance(bias, Tensor)
        and isinstance(a, Tensor)
        and isinstance(b, Tensor)
        and eager((bias, a, b))
        and a.dtype in SUPPORTED
        and bias.dtype == a.dtype
        and b.dtype == a.dtype
        and bias.device == a.device
        and b.device == a.device
    )


def _addmm(bias, mat1, mat2, alpha, beta):
    """The fused launch, through autograd only when it records."""
    if torch.is_grad_enabled() and (
        bias.requires_grad or mat1.requires_grad or mat2.requires_grad
    ):
        return _addmm_function(bias, mat1, mat2, alpha, beta)
    return _fused(bias, mat1, mat2, alpha, beta)


_INT64 = 1 << 63
_FLOAT32_MAX = float(torch.finfo(torch.float32).max)
# half the least subnormal: float32 rounds it (to even) and below to 0
_FLOAT32_ROUNDS_TO_ZERO = 2.0**-150


def _coefficient(name, value, like):
    """addmm's alpha or beta, taken and refused as torch takes them: a
    Python or NumPy number (bool too) or a 0-d tensor that needs no grad
    (read as its number, as torch reads it; inside a compiled function
    passed on as it is); an int outside [-2^63, 2^64) is OverflowError;
    for a real tensor a complex value with an imaginary part, and for a
    half or float32 one a finite value past float32's range (torch
    converts it to the float it computes in), are RuntimeError."""
    if isinstance(value, torch.Tensor) and value.dim() == 0:
        if value.requires_grad:  # torch's argument parser refuses it
            raise TypeError(
                f"addmm(): argument '{name}' must be Number, not a Tensor "
                "that requires grad"
            )
        if _is_compiling():
            # data Dynamo cannot branch on: torch's addmm takes it as it is
            return value
        # torch reads it as a number (a bool scales as 0 or 1), which the
        # checks below then take as any other
        value = value.item()
    if isinstance(value, _np.generic):
        value = value.item()  # a NumPy scalar: its Python number
    if isinstance(value, bool):
        return int(value)
    if not isinstance(
        value, (int, float, complex, torch.SymInt, torch.SymFloat)
    ):
        raise TypeError(
            f"addmm(): argument '{name}' must be Number, not "
            f"{type(value).__name__}"
        )
    if isinstance(value, int) and not -_INT64 <= value < 2 * _INT64:
        raise OverflowError(
            f"addmm(): {name}={value} is outside int64 and uint64"
        )
    real = not (isinstance(like, torch.Tensor) and like.is_complex())
    if isinstance(value, complex) and real and value.imag == 0:
        value = value.real
    if isinstance(value, complex) and real:
        raise RuntimeError(
            f"addmm(): {name}={value!r} cannot be converted to a real "
            "type without overflow"
        )
    narrow = isinstance(like, torch.Tensor) and like.dtype in (
        torch.float16,
        torch.bfloat16,
        torch.float32,
    )
    if narrow and not isinstance(value, complex):
        # comparisons only: Dynamo may hold a symbolic number (a compiled
        # function's argument), which math.isfinite cannot take
        v = abs(float(value))
        if _FLOAT32_MAX < v < math.inf:
            raise RuntimeError(
                f"addmm(): {name}={value!r} cannot be converted to float "
                "without overflow"
            )
        if 0 < v <= _FLOAT32_ROUNDS_TO_ZERO:
            # 0 in the float torch computes in: the input (or the product)
            # is then not read, and its NaNs do not spread
            return 0.0
    return value


def addmm(
    input, mat1, mat2, out_dtype=None, *deprecated, beta=1, alpha=1, out=None
):
    """torch.addmm: beta * input + alpha * (mat1 @ mat2), input broadcast
    to [m, n]; with beta == 0 input is not read, with alpha == 0 the
    product is not used (their NaNs do not spread). torch's deprecated
    positional forms, addmm(beta, input, alpha, mat1, mat2) and
    addmm(beta, input, mat1, mat2), are taken as torch takes them, with
    its warning."""
    if isinstance(input, numbers.Number):
        input, mat1, mat2, beta, alpha = _deprecated_addmm_form(
            (input, mat1, mat2, out_dtype, *deprecated), beta, alpha
        )
        out_dtype = None
    elif deprecated:
        raise TypeError(
            "addmm() takes from 3 to 4 positional arguments but "
            f"{4 + len(deprecated)} were given"
        )
    if tensor_like(input, mat1, mat2, out):
        return handle_torch_function(
            addmm,
            (input, mat1, mat2, out),
            input,
            mat1,
            mat2,
            out_dtype,
            beta=beta,
            alpha=alpha,
            out=out,
        )
    if out_dtype is not None:
        args = (input, mat1, mat2)
        kw = dict(beta=beta, alpha=alpha)
        return torch_out_dtype(torch.addmm, args, out_dtype, out, **kw)
    if out is not None:
        # as torch: input as the product's shape (a broadcast one is not
        # dense there, and not compared)
        try:
            seen = input.expand(mat1.shape[0], mat2.shape[1])
        except (AttributeError, IndexError, RuntimeError, TypeError):
            seen = input  # the call below refuses what does not expand
        refuse_partial_overlap(out, seen)
        return _into(
            "addmm",
            out,
            (input, mat1, mat2),
            lambda: addmm(input, mat1, mat2, beta=beta, alpha=alpha),
        )
    if not (
        isinstance(input, torch.Tensor)
        and isinstance(mat1, torch.Tensor)
        and isinstance(mat2, torch.Tensor)
    ):
        raise _addmm_not_tensor(input, mat1, mat2)
    if (
        input.is_nested
        or mat1.is_nested
        or mat2.is_nested
        or input.layout is not _strided
        or mat1.layout is not _strided
        or mat2.layout is not _strided
    ):
        raise layout_refused(
            "addmm", (("input", input), ("mat1", mat1), ("mat2", mat2))
        )
    alpha = _coefficient("alpha", alpha, mat1)
    beta = _coefficient("beta", beta, mat1)
    if (
        mat1.dim() == 2
        and not mat1.shape[1]
        and not isinstance(alpha, _Tensor)
    ):
        # an empty sum is left out, as torch's: an infinite or NaN alpha
        # does not make 0 * alpha NaN (alpha has no other effect here)
        alpha = 1 if alpha != 0 else alpha
    if (
        isinstance(alpha, _Tensor) or isinstance(beta, _Tensor)
    ) and _is_compiling():
        # a 0-d tensor's value is data Dynamo cannot branch on; torch's
        # addmm takes it into the graph as it is
        return torch.addmm(input, mat1, mat2, beta=beta, alpha=alpha)
    if (
        alpha != 0
        and _epilogue_ok(input, mat1, mat2)
        and mat1.dim() == 2
        and mat2.dim() == 2
        and mat1.shape[1] == mat2.shape[0]
        and input.dim() <= 2
        and _broadcasts(input.shape, (mat1.shape[0], mat2.shape[1]))
    ):
        return _addmm(plain(input), plain(mat1), plain(mat2), alpha, beta)
    if torch_only():  # functorch, forward-mode AD: torch's ops throughout
        _operands("mm", mat1, mat2, "addmm")  # but the dtypes eager takes
        return torch.addmm(input, mat1, mat2, beta=beta, alpha=alpha)
    if alpha != 0 and _traced_addmm_ok(input, mat1, mat2, alpha, beta):
        return _addmm_op(input, mat1, mat2, float(beta), float(alpha))
    if (
        input.dtype != mat1.dtype
        and mat1.dtype == mat2.dtype
        and mat1.dtype not in SUPPORTED
    ):
        # torch refuses the mismatch before it would compute the product
        # (which gemsops does not: float64, integers)
        raise _input_dtype_error(input, mat1)
    c = mm_as("addmm", mat1, mat2)
    if input.dtype != c.dtype and not _autocast_casts(input, c):
        raise _input_dtype_error(input, c)
    try:
        shape = torch.broadcast_shapes(input.shape, c.shape)
    except RuntimeError:
        shape = None
    if shape != c.shape:
        raise RuntimeError(
            f"addmm(): input of shape {list(input.shape)} does not "
            f"broadcast to the product's shape {list(c.shape)}"
        )
    if alpha == 0:
        c = _AlphaZero.apply(c)
    elif alpha != 1:
        c = c * alpha
    if beta == 0:
        if input.requires_grad and torch.is_grad_enabled():
            return _BetaZero.apply(c, input)
        return c
    return torch.add(c, input.to(c.dtype), alpha=beta)


def _input_dtype_error(input, like):
    return RuntimeError(
        f"addmm(): expected input of dtype {like.dtype}, got {input.dtype}"
    )


_DEPRECATED_ADDMM = (
    "This overload of addmm is deprecated: addmm(Number beta, Tensor "
    "input, Number alpha, Tensor mat1, Tensor mat2) and addmm(Number beta, "
    "Tensor input, Tensor mat1, Tensor mat2); use addmm(Tensor input, "
    "Tensor mat1, Tensor mat2, *, Number beta=1, Number alpha=1)"
)


def _deprecated_addmm_form(args, beta, alpha):
    """(input, mat1, mat2, beta, alpha) of torch's deprecated positional
    forms: beta, input, alpha, mat1, mat2 or beta, input, mat1, mat2. As
    torch's, beta and alpha are not also taken as keywords."""
    if len(args) == 5 and isinstance(args[2], numbers.Number):
        form = (args[1], args[3], args[4], args[0], args[2])
    elif len(args) == 4 and isinstance(args[3], torch.Tensor):
        form = (args[1], args[2], args[3], args[0], 1)
    else:
        form = None
    if form is None or beta != 1 or alpha != 1:
        given = ", ".join(type(a).__name__ for a in args if a is not None)
        raise TypeError(
            f"addmm() received an invalid combination of arguments: "
            f"({given}); expected (Tensor input, Tensor mat1, Tensor mat2, "
            "*, Number beta=1, Number alpha=1), or the deprecated "
            "(Number beta, Tensor input, Number alpha, Tensor mat1, Tensor "
            "mat2) or (Number beta, Tensor input, Tensor mat1, Tensor mat2)"
        )
    warnings.warn(_DEPRECATED_ADDMM, UserWarning, stacklevel=3)
    return form


def _addmm_not_tensor(*args):
    for pos, (name, t) in enumerate(zip(("input", "mat1", "mat2"), args), 1):
        if not isinstance(t, torch.Tensor):
            return TypeError(
                f"addmm(): argument '{name}' (position {pos}) must be "
                f"Tensor, not {type(t).__name__}"
            )


class _AlphaZero(torch.autograd.Function):
    """alpha == 0: the product counts as zeros, its NaNs and infinities
    not spread (BLAS's rule, which torch's addmm follows on CUDA)."""

    @staticmethod
    def forward(ctx, c):
        return torch.zeros_like(c)

    @staticmethod
    def backward(ctx, g):
        # torch multiplies the mats' gradients by alpha: NaN where g is not
        # finite
        return g * 0


class _BetaZero(torch.autograd.Function):
    """beta == 0: the product alone, input not read (its NaNs do not
    spread), and input's gradient beta * g summed to its shape, as
    torch's addmm gives (zeros where g is finite)."""

    @staticmethod
    def forward(ctx, c, input):
        ctx.input_meta = (input.shape, input.dtype)
        # a new tensor: an input returned as-is counts as a view of it,
        # which refuses in-place writes to the result
        return c.clone()

    @staticmethod
    def backward(ctx, g):
        shape, dtype = ctx.input_meta
        return g, _grad_input(g, 0, shape).to(dtype)


def linear(input, weight, bias=None, *, out=None):
    """torch.nn.functional.linear: input [*, in] @ weight[out, in]^T
    (+ bias[out]). The batch dims fold into one product. out= as torch's
    (no autograd through it)."""
    if out is None and _linear_ok(input, weight, bias):
        if _grad_enabled() and (
            input.requires_grad
            or weight.requires_grad
            or bias is not None
            and bias.requires_grad
        ):
            if not _folds(input):
                # its rows are a copy, made here, so that the node saves
                # the copy (as torch's reshape) and an in-place write to
                # the input after the call is no error
                rows = _linear_function(_rows(input), weight, bias)
                return _unrows(rows, input.shape)
            return _linear_function(input, weight, bias)
        return _linear(input, weight, bias)
    if tensor_like(input, weight, bias, out):
        return handle_torch_function(
            linear, (input, weight, bias, out), input, weight, bias, out=out
        )
    if out is not None:
        return _into(
            "linear",
            out,
            (input, weight, bias),
            lambda: linear(input, weight, bias),
        )
    if not isinstance(input, torch.Tensor):
        raise TypeError(
            "linear(): argument 'input' (position 1) must be Tensor, not "
            f"{type(input).__name__}"
        )
    for pos, name, t in ((2, "weight", weight), (3, "bias", bias)):
        if not isinstance(t, torch.Tensor) and (t is not None or pos == 2):
            raise TypeError(
                f"linear(): argument '{name}' (position {pos}) must be "
                f"Tensor, not {type(t).__name__}"
            )
    if (
        input.is_nested
        or input.layout is not _strided
        or weight.layout is not _strided
        or bias is not None
        and bias.layout is not _strided
    ):
        # no kernel for nested or sparse operands: torch's own computes
        # (or refuses) them
        return torch.nn.functional.linear(input, weight, bias)
    if weight.dim() not in (1, 2) or (
        weight.dim() == 1 and bias is not None and input.dim() == 2
    ):
        raise RuntimeError(
            "linear(): weight must be a 2-D tensor"
            + (", or 1-D beside an input not 2-D" if bias is not None else "")
            + f", got {weight.dim()}-D of shape {list(weight.shape)}"
        )
    if weight.dim() == 1 and bias is not None:
        # a vector product and a bias: torch takes or refuses it by the
        # input's rank and layout (addmm refuses the 1-D weight, matmul
        # then add takes it); its own function decides, and computes it
        return torch.nn.functional.linear(input, weight, bias)
    if (
        bias is not None
        and isinstance(input, _Tensor)
        and input.dim() >= 1
        and input.dtype in SUPPORTED  # else matmul_as refuses it as linear
        and weight.dim() == 2
        and input.shape[-1] == weight.shape[1]
        and bias.dim() <= 1
        and _broadcasts(bias.shape, weight.shape[:1])
        and (bias.dtype == input.dtype or autocast_enabled(input.device.type))
    ):
        # the bias in the product's epilogue, rounded once, as torch's
        # addmm (traced code: compile, autocast). The JIT tracer records
        # torch's linear, which takes any rank (addmm's node takes 2-D
        # alone, and a fold's leading sizes would be kept as constants)
        if _tracing() is not None:
            return torch.nn.functional.linear(input, weight, bias)
        y = addmm(bias, _rows(input), weight.t())
        return _unrows(y, input.shape)
    if (
        bias is not None
        and bias.dtype != input.dtype
        and input.dtype == weight.dtype
        and input.dtype not in SUPPORTED
    ):
        # refused before the product, as torch's (float64, integers)
        raise _bias_dtype_error(bias, input)
    y = matmul_as("linear", input, weight.t() if weight.dim() == 2 else weight)
    if bias is None:
        return y
    # the bias may not enlarge y; a 1-D input's product is a row, as
    # torch's addmm sees it
    seen = (1,) + tuple(y.shape) if input.dim() == 1 else y.shape
    if not _broadcasts(bias.shape, seen):
        raise RuntimeError(
            f"linear(): bias of shape {list(bias.shape)} does not broadcast "
            f"to the output's shape {list(seen)}"
        )
    if bias.dtype != y.dtype:
        # one dtype, as torch's addmm path (its matmul-and-add_ paths,
        # taken for some layouts, cast the bias: README, differences)
        if not autocast_enabled(y.device.type):
            raise _bias_dtype_error(bias, y)
        bias = bias.to(y.dtype)  # as torch's linear under autocast
    out = y + bias
    return out if out.dim() == y.dim() else unsafe_view(out, y.shape)


def _bias_dtype_error(bias, like):
    return RuntimeError(
        "linear(): bias and input must have the same dtype, but got "
        f"{bias.dtype} and {like.dtype}"
    )


def _broadcasts(shape, to):
    """shape broadcasts to `to` (right-aligned, each size equal or 1); a
    plain loop, far cheaper in host time than torch.broadcast_shapes."""
    return len(shape) <= len(to) and all(
        s == t or s == 1 for s, t in zip(reversed(shape), reversed(to))
    )
