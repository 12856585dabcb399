"""mm, bmm, matmul: torch's rules over gemsops._C's Stream-K matmul.

Every product reaches C as [m, k] x [k, n] or [batch, m, k] x [batch, k, n]
views of the inputs (transposes, slices, storage offsets and broadcast
batches are strides, not copies); C comes back [m, n] or [batch, m, n] and
is viewed into torch.matmul's result shape. The host path is kept short:
small products are host-bound (one _C call per launch; the workspace and
flags exist only for Stream-K launches and are kept per stream). The
backward runs the same kernel on transposed views: dA = dC . B^T,
dB = A^T . dC.

Schedules: 'auto' (the cost model's pick), 'data-parallel', 'stream-k',
'hybrid', 'split-k' (every tile in equal pieces, one a CTA; on wgmma each
piece sums a band of its tile); set_schedule() or GEMSOPS_MATMUL_SCHEDULE
picks one for tests and benchmarks. Mainloops (CUDA): 'auto' (the fastest
the GPU and operands allow), or a cap: 'wgmma-256', 'wgmma-192',
'wgmma-128', 'wgmma-64' (sm_90a, a forced width of 128-row tiles),
'wgmma-64x64', 'wgmma-192x192' (sm_90a, 64 x 64 and 192 x 192 tiles),
'wgmma-pingpong' (sm_90a, halves: 128 x 128 tiles run whole, each consumer
warpgroup on tiles of its own; fp32 and in-kernel row sums take
'wgmma-128'), 'wgmma-80x128', 'wgmma-96x128', 'wgmma-160x128',
'wgmma-80x64', 'wgmma-96x64' (sm_90a, halves: tiles of 80, 96 or 160 rows
x 128 or 64 columns through the swapped product C^T = B^T A^T, for A
K-contiguous, B N-contiguous, C's rows 16-byte aligned, no bias; other
products take 'wgmma-128'), 'mma' (sm_80+),
'ffma' (exact fp32), or 'skinny' (products of at most 16 rows against a
row-major B on their own kernels whatever their size; auto takes them
for fp32 and for a large B); GEMSOPS_MATMUL_MAINLOOP sets it too. fp32 runs on
wgmma as TF32 when torch allows TF32 for its own CUDA matmuls
(torch.backends.cuda.matmul.fp32_precision or allow_tf32,
torch.set_float32_matmul_precision) and exactly otherwise. Products of
at most 16 rows against a row-major B take kernels of their own (C's plan
names them 'skinny'; fp32 always, fp16 and bf16 when B is large): B read
once, fp32 exactly on the CUDA cores.
"""

import math
import os

import torch
from torch.overrides import handle_torch_function
from torch.utils.flop_counter import register_flop_formula

from .. import _C, _workspace
from .._dispatch import (
    _strided,
    _tracing,
    autocast_enabled,
    batched,
    define_op,
    eager,
    eager_apply,
    layout_refused,
    not_tensor,
    plain,
    register_autocast,
    tensor_like,
    torch_only,
    unsafe_view,
)
from ._aligned import aligned, misaligned
from ._out import byte_span
from ._out import into as _into

SCHEDULES = {
    "auto": 0,
    "data-parallel": 1,
    "stream-k": 2,
    "hybrid": 3,
    "split-k": 4,
}
MAINLOOPS = {
    "auto": 0,
    "ffma": 1,
    "mma": 2,
    "wgmma-128": 3,
    "wgmma-256": 4,
    "wgmma-64": 5,
    "wgmma-192": 6,
    "skinny": 7,
    "wgmma-64x64": 8,
    "wgmma-192x192": 9,
    "wgmma-pingpong": 10,
    "wgmma-80x128": 11,
    "wgmma-96x128": 12,
    "wgmma-160x128": 13,
    "wgmma-80x64": 14,
    "wgmma-96x64": 15,
}
# the swapped product's tiles (sm_90a; one operand layout, no epilogue)
WGMMA_TRANSPOSED_TILES = (
    "wgmma-80x128",
    "wgmma-96x128",
    "wgmma-160x128",
    "wgmma-80x64",
    "wgmma-96x64",
)
# the wgmma tiles a mainloop cap can force for any operands (sm_90a): tests,
# tools (pingpong is a kernel for 128 x 128 tiles, not a tile of its own)
WGMMA_TILES = tuple(
    name
    for name in MAINLOOPS
    if name.startswith("wgmma-")
    and name != "wgmma-pingpong"
    and name not in WGMMA_TRANSPOSED_TILES
)
SUPPORTED = (torch.float16, torch.bfloat16, torch.float32)

_config = dict(
    schedule="auto", two_tiles=False, ctas=0, spin_limit=0, mainloop="auto"
)
_launch = ()  # _C.matmul's (schedule, two_tiles, ctas, mainloop, spin_limit)
_FFMA = MAINLOOPS["ffma"]
_FLOAT32 = torch.float32
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_capturing = torch.cuda.is_current_stream_capturing
_HAS_FP32_PRECISION = hasattr(torch.backends, "fp32_precision")


def _tf32_allowed(a):
    """fp32 products on a's device may round their inputs to TF32: torch's
    setting for its own CUDA matmuls, read through the API that every way
    of setting it reports to (torch.backends.cuda.matmul.fp32_precision:
    'tf32' after allow_tf32 = True, set_float32_matmul_precision('high'),
    or the fp32_precision settings themselves; reading the legacy
    allow_tf32 raises once the newer API was used). The CPU computes fp32
    exactly, as torch's CPU matmul does."""
    if not a.is_cuda:
        return False
    settings = torch.backends.cuda.matmul
    if _HAS_FP32_PRECISION:
        return settings.fp32_precision == "tf32"
    return settings.allow_tf32


def _set_launch():
    global _launch
    _launch = (
        SCHEDULES[_config["schedule"]],
        _config["two_tiles"],
        _config["ctas"],
        MAINLOOPS[_config["mainloop"]],
        _config["spin_limit"],
    )


def _check_choice(what, value, choices):
    if value not in choices:
        raise ValueError(
            f"{what} must be one of {sorted(choices)}, got {value!r}"
        )


def set_schedule(
    schedule="auto", *, two_tiles=False, ctas=0, spin_limit=0, mainloop="auto"
):
    """Force the Stream-K schedule for later calls: schedule in SCHEDULES;
    two_tiles: hybrid moves one full wave more into Stream-K; ctas: >0 caps
    the persistent grid (never above what fits on the device); spin_limit:
    >0 turns a Stream-K wait longer than that many polls into a
    RuntimeError (debug: a would-be hang becomes an error; it syncs);
    mainloop in MAINLOOPS: the most capable CUDA mainloop allowed."""
    _check_choice("set_schedule(): schedule", schedule, SCHEDULES)
    _check_choice("set_schedule(): mainloop", mainloop, MAINLOOPS)
    _config.update(
        schedule=schedule,
        two_tiles=bool(two_tiles),
        ctas=int(ctas),
        spin_limit=int(spin_limit),
        mainloop=mainloop,
    )
    _set_launch()


def get_schedule():
    return dict(_config)


def _stream_buffers(device, need):
    """The flags (with a fresh epoch) and workspace of the stream a
    Stream-K launch runs on: kept per stream in gemsops._workspace, since
    launches on one stream are ordered and may share them, launches on two
    may not. need is _C.matmul's (workspace bytes, flag count, stream
    handle). Where allocations go to a CUDA graph's pool (a capture, or
    the graph trees' warm-up): fresh flags at epoch 0, which the launch
    zeroes and C does not keep (its record would pin the graph's memory),
    nothing kept here."""
    nbytes, count, stream = need
    if _workspace.in_graph_pool(torch.device("cuda", device)):
        dev = torch.device("cuda", device)
        return (
            torch.empty(max(count, 1), dtype=torch.int32, device=dev),
            0,
            _workspace.scratch(nbytes, dev),
        )
    flags = _workspace.kept(
        "mm_flags", device, stream, count, dtype=torch.int32, minimum=1024
    )
    if flags.epoch >= 0xFFFFFFFF:  # epochs used up: start afresh
        _workspace.forget("mm_flags", device)
        flags = _workspace.kept(
            "mm_flags", device, stream, count, dtype=torch.int32, minimum=1024
        )
    ws = _workspace.kept("mm_ws", device, stream, nbytes, zero=False)
    epoch = flags.epoch = flags.epoch + 1  # a new epoch: no flag to reset
    return flags.buf, epoch, ws.buf


def _offered_buffers(a):
    """(workspace, flags, a new epoch) kept for a's current stream, when
    it has both and no graph is being captured; else None. Offered to the
    first _C call of launches that usually need them (nn.Linear's weight
    gradient with its row sums runs Stream-K), so those take one call, not
    two; C asks for more, as when offered none, if they are too small."""
    device = a.get_device()
    stream = _raw_stream(device)
    flags = _workspace.lookup("mm_flags", device, stream)
    ws = _workspace.lookup("mm_ws", device, stream)
    if flags is None or ws is None or flags.epoch >= 0xFFFFFFFF:
        return None
    if _capturing():  # a captured launch gets fresh buffers
        return None
    epoch = flags.epoch = flags.epoch + 1
    return ws.buf, flags.buf, epoch


def _error_buffer(device):
    return _workspace.kept(
        "mm_error", device.index, -1, 1, dtype=torch.int32
    ).buf


def _mm(a, b, bias=None, alpha=1, beta=1, row_sums=None):
    """[m, k] x [k, n] -> [m, n], or [B, m, k] x [B, k, n] -> [B, m, n]: a
    new contiguous C (no autograd). With a bias (any tensor of C's dtype
    broadcasting to C) or alpha != 1, the kernel's epilogue gives alpha *
    a @ b + beta * bias, rounded once. row_sums (C's dtype, [m], 2-D a)
    receives the sums of a's rows over k, made beside the product where the
    kernel can (nn.Linear's bias gradient)."""
    # sizes as arguments: a tuple or a torch.Size takes longer to parse
    c = a.new_empty(*a.shape[:-1], b.shape[-1])
    return _launch_product(_C.matmul, a, b, c, bias, alpha, beta, row_sums)


def _launch_product(call, a, b, c, bias=None, alpha=1, beta=1, row_sums=None):
    """c <- call's product of a and b (_C.matmul, or one of nn.Linear's
    products, which view the layer's tensors in C), through one _C call;
    a Stream-K launch asks for its stream's workspace and flags and takes
    a second, except a row-sum launch offered the stream's kept ones."""
    # one tuple, made when the schedule is set: reading _config's entries
    # here would cost host time on every call
    mode, two, ctas, loop, spin = _launch
    if loop != _FFMA and a.dtype is _FLOAT32 and not _tf32_allowed(a):
        loop = _FFMA  # exact fp32 unless torch allows TF32, as cuBLAS
    err = _error_buffer(a.device) if spin and a.is_cuda else None
    if row_sums is not None:
        epi = (bias, alpha, beta, row_sums)
    elif bias is not None or alpha != 1:
        epi = (bias, alpha, beta)
    else:
        epi = ()
    offer = None
    if row_sums is not None and a.is_cuda:
        offer = _offered_buffers(a)
    ws, flags, epoch = (None, None, 0) if offer is None else offer
    try:
        need = call(
            a, b, c, mode, two, ctas, loop, ws, flags, epoch, spin, err, *epi
        )
    except ValueError:
        # c and row_sums are the caller's allocations or an out= that
        # _writes_into found aligned: only the operands can be misaligned
        if not misaligned(a, b, bias):
            raise
        a, b, bias = aligned(a, b, bias)
        return _launch_product(call, a, b, c, bias, alpha, beta, row_sums)
    if need is not None:
        flags, epoch, ws = _stream_buffers(a.get_device(), need)
        call(a, b, c, mode, two, ctas, loop, ws, flags, epoch, spin, err, *epi)
    if err is not None and err.item():
        err.zero_()
        raise RuntimeError(
            "matmul(): a Stream-K owner waited more than "
            f"spin_limit={spin} polls for a peer's partial"
        )
    return c


class MatmulFunction(torch.autograd.Function):
    """The eager path; under create_graph the backward runs the gemsops
    mm/bmm ops, whose own autograd gives second order gradients."""

    @staticmethod
    def forward(ctx, a, b):
        save_operands(ctx, a, b, ctx.needs_input_grad)
        return _mm(a, b)

    @staticmethod
    def backward(ctx, grad):
        a, b = unpack_operands(ctx)
        # the ops (differentiable) when a graph of the backward is asked for
        return _grads(ctx, a, b, grad, not torch.is_grad_enabled())


_matmul_function = eager_apply(MatmulFunction)


def transposed(t):
    """t is the transpose of a contiguous tensor (a weight's .t(), say)."""
    return t.dim() >= 2 and not t.is_contiguous() and t.mT.is_contiguous()


def save_operands(ctx, a, b, need):
    """Saves what the gradients of a @ b that `need` asks for read, as
    torch's mm: b for a's, a for b's (a frozen weight keeps no activation
    alive, and an operand changed in place or made under inference_mode
    breaks no gradient that does not read it), and the layout of each
    operand whose gradient is asked (ctx.layouts, for product_grads)."""
    ta, tb = transposed(a), transposed(b)
    ctx.save_for_backward(a if need[1] else None, b if need[0] else None)
    ctx.layouts = (need[0] and ta, need[1] and tb)
    ctx.saved_layouts = (need[1] and ta, need[0] and tb)  # unpack_operands


def saved_layouts(a, b):
    """Which of two saved tensors (None allowed) are transposes: a node's
    ctx.saved_layouts, which unpack_operands checks."""
    return (a is not None and transposed(a), b is not None and transposed(b))


def unpack_operands(ctx):
    """ctx.saved_tensors, refused where one comes back in another layout
    than it was saved in: a non-reentrant checkpoint whose recomputation
    ran the other path (a dispatch mode or forward-mode AD open in the
    forward alone sends one through the eager Function, the other through
    the op) hands this node the other path's tensors, of the same shapes
    where the weight is square (a weight for its transpose) but not the
    same meaning: a wrong gradient, not an error, without this check."""
    saved = ctx.saved_tensors
    if saved_layouts(*saved) != ctx.saved_layouts:
        raise RuntimeError(
            "gemsops: a tensor saved for a product's backward came back "
            "transposed (torch.utils.checkpoint recomputed the forward "
            "under other modes than it first ran: keep dispatch modes and "
            "forward-mode AD open over both, or use_reentrant=True)"
        )
    return saved


def product_grads(mm, a, b, grad, need, layouts, col_sums=None):
    """The gradients of a @ b given grad, each made in its operand's layout
    (layouts: whether a, b are transposed): a transposed operand's as
    (other^T @ grad^T)^T, so that its AccumulateGrad keeps the tensor
    instead of copying it to the parameter's strides (torch's mm backward
    does the same). a is read only for b's gradient, b for a's. col_sums
    (_mm only, b transposed: nn.Linear's weight): grad's column sums into
    it, from b's gradient's product, whose a is grad^T."""
    da = db = None
    if need[0]:
        da = mm(b, grad.mT).mT if layouts[0] else mm(grad, b.mT)
    if col_sums is not None:
        db = _mm(grad.mT, a, row_sums=col_sums).mT
    elif need[1]:
        db = mm(grad.mT, a).mT if layouts[1] else mm(a.mT, grad)
    return da, db


def _grads(ctx, a, b, grad, direct):
    grad = plain(grad)
    if batched(grad):  # a vmap's gradients: torch's ops
        mm = torch.matmul
    else:
        mm = _mm if direct else _OPS[grad.dim()]
    return product_grads(mm, a, b, grad, ctx.needs_input_grad, ctx.layouts)


# ---- torch.library ops ---------------------------------------------------


def _op_impl(a, b):
    a, b = plain(a), plain(b)
    return _mm(a, b)


def _op_fake(a, b):
    return a.new_empty(a.shape[:-1] + b.shape[-1:])


def _op_setup(ctx, inputs, output):
    save_operands(ctx, *inputs, ctx.needs_input_grad)


def _op_grad(ctx, grad):
    a, b = unpack_operands(ctx)
    return _grads(ctx, a, b, grad, False)


@define_op("mm")
def _mm_op(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[m, k] x [k, n] -> [m, n] (contiguous), Stream-K."""
    return _op_impl(a, b)


@define_op("bmm")
def _bmm_op(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[B, m, k] x [B, k, n] -> [B, m, n] (contiguous), Stream-K."""
    return _op_impl(a, b)


_OPS = {2: _mm_op, 3: _bmm_op}
_mm_op.register_composite(torch.mm)
_bmm_op.register_composite(torch.bmm)
for _op in (_mm_op, _bmm_op):
    _op.register_fake(_op_fake)
    _op.register_autograd(_op_grad, setup_context=_op_setup)
for _device in ("cpu", "cuda"):  # the autocast dtype, as torch.mm / bmm
    register_autocast(torch.ops.gemsops.mm.default, _device, "lower")
    register_autocast(torch.ops.gemsops.bmm.default, _device, "lower")


def product_flops(a_shape, b_shape):
    """FlopCounterMode's count of a product [*, m, k] x [*, k, n], as for
    aten's mm and bmm: 2mnk a matrix."""
    return 2 * math.prod(a_shape[:-1]) * a_shape[-1] * b_shape[-1]


@register_flop_formula([torch.ops.gemsops.mm, torch.ops.gemsops.bmm])
def _product_flop_formula(a_shape, b_shape, *args, out_shape=None, **kw):
    return product_flops(a_shape, b_shape)


def _operands(fn, a, b, name=None):
    """a and b checked as torch checks fn's (types, then dtypes, then
    devices), without the negative bit (C reads raw memory); the errors
    name `name`, the function called (linear, addmm), where it is not fn."""
    kernel_fn, fn = fn, name or fn
    if not isinstance(a, torch.Tensor):
        raise not_tensor(fn, "input", a)
    if not isinstance(b, torch.Tensor):
        # torch's names: mm(input, mat2), bmm(input, mat2), matmul(input,
        # other); addmm's mats come through mm
        raise not_tensor(fn, "other" if kernel_fn == "matmul" else "mat2", b)
    if (
        a.is_nested
        or b.is_nested
        or a.layout is not _strided
        or b.layout is not _strided
    ):
        name_b = "other" if kernel_fn == "matmul" else "mat2"
        raise layout_refused(fn, (("input", a), (name_b, b)))
    if a.dtype != b.dtype:
        refused = _kernel_refused(kernel_fn, a, b)
        if refused is not None:
            raise _unsupported(fn, refused.dtype)
        if not _autocast_casts(a, b):
            raise RuntimeError(
                f"{fn}(): expected both arguments to have the same "
                f"dtype, but got {a.dtype} and {b.dtype}"
            )
    # get_device() is -1 for the CPU and for meta alike
    if a.get_device() != b.get_device() or a.is_meta != b.is_meta:
        raise RuntimeError(
            f"{fn}(): expected both arguments on the same "
            f"device, but got {a.device} and {b.device}"
        )
    if a.dtype not in SUPPORTED:  # torch's type for a dtype without kernel
        raise _unsupported(fn, a.dtype)
    a, b = plain(a), plain(b)  # traced: the ops resolve it
    return a, b


def _unsupported(fn, dtype):
    return NotImplementedError(
        f"{fn}(): gemsops matmul takes float16, bfloat16 and float32, "
        f"got {dtype}"
    )


def _kernel_refused(fn, a, b):
    """The operand whose dtype torch looks up a kernel for before it
    compares the two dtypes, where that lookup finds none (torch raises
    NotImplementedError); None where torch compares first (RuntimeError).
    Its bmm looks up its first operand (no integer or bool kernels on CUDA;
    on the CPU none for bool, the wide unsigned and float8), its CUDA mv
    its matrix (no integer or bool); its mm and dot compare first."""
    kernel = _torch_kernel(fn, a, b)
    if kernel is None:
        return None
    name, t = kernel
    if t.device.type == "cpu":
        return t if name == "bmm" and t.dtype in _CPU_NO_BMM else None
    if t.is_floating_point() or t.is_complex():
        return None
    return t if t.device.type == "cuda" else None


# dtypes torch's CPU bmm has no kernel for (torch 2.11 to 2.13)
_CPU_NO_BMM = frozenset(
    getattr(torch, name)
    for name in (
        "bool",
        "uint16",
        "uint32",
        "uint64",
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
    )
)


def _torch_kernel(fn, a, b):
    """The kernel torch runs for fn(a, b) when it is bmm or mv, with the
    operand that kernel looks up: ("bmm", first) or ("mv", matrix); None for
    mm and dot. matmul picks by the ranks and, for a 3-D or wider operand
    against a 1- or 2-D one, by torch's fold rule."""
    if fn != "matmul":
        return ("bmm", a) if fn == "bmm" else None
    da, db = a.dim(), b.dim()
    if da == 0 or db == 0 or da <= 2 and db <= 2:
        return ("mv", a) if da == 2 and db == 1 else None
    if not _torch_folds(a, b):
        return ("bmm", a)
    if da > db:  # a folded against b
        return ("mv", a) if db == 1 else None
    return ("mv", b) if da == 1 else None  # b transposed, folded against a


def _torch_folds(a, b):
    """torch.matmul's choice to run a 3-D or wider operand against a 1- or
    2-D one as one mm or mv rather than a bmm (its should_fold, no out=):
    when the smaller requires grad, or the larger (b transposed when it is
    the larger) views as a matrix without a copy, a 2-D a never."""
    larger_first = a.dim() >= b.dim()
    t1 = a if larger_first else b.mT
    small = b if larger_first else a
    if t1.dim() < 3 or small.dim() > 2:
        return False
    if small.requires_grad:
        return True
    if a.dim() == 2:
        return False
    if t1.numel() == 0:
        return True
    size, stride = t1.shape, t1.stride()
    return all(
        stride[i] == stride[i + 1] * size[i + 1] for i in range(t1.dim() - 2)
    )


def _autocast_casts(a, b):
    """Autocast will cast both to one dtype (the op's autocast rule)."""
    return (
        autocast_enabled(a.device.type)
        and a.device.type == b.device.type
        and all(
            t.is_floating_point() and t.dtype != torch.float64 for t in (a, b)
        )
    )


def _product(a, b, traced_as=None):
    """mm or bmm of a and b; traced_as: the torch function the JIT tracer
    records instead (matmul's, whose node takes any rank)."""
    if not eager((a, b)):
        if torch_only():  # forward-mode AD, functorch: torch's own
            return torch.mm(a, b) if a.dim() == 2 else torch.bmm(a, b)
        if traced_as is not None and _tracing() is not None:
            return traced_as(a, b)
        return _OPS[a.dim()](a, b)
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return _matmul_function(a, b)
    return _mm(a, b)


def _shapes_error(fn, a, b):
    sa = "x".join(map(str, a.shape))
    sb = "x".join(map(str, b.shape))
    return RuntimeError(f"{fn}(): shapes cannot be multiplied ({sa} and {sb})")


def torch_out_dtype(fn, args, out_dtype, out, **kw):
    """A product asked for an out_dtype (torch's .dtype overloads: fp32
    from half inputs, on CUDA; torch 2.13 has no CPU kernel for them) runs
    torch's own: the gemsops kernels write their inputs' dtype."""
    if out is not None:
        kw["out"] = out
    return fn(*args, out_dtype, **kw)


def _writes_into(out, a, b, ranks):
    """The product of a and b (both of a rank in ranks: 2, or 3 of one batch
    size) may be written straight into out, as torch's out= writes it,
    sparing the copy of a product made apart (ops/_out.py): nothing that
    takes the call elsewhere (tracing, compiling, transforms, a subclass,
    autocast, grad), out a dense tensor of the product's shape, dtype and
    device, aligned as torch's allocators align a new tensor (256 bytes on
    CUDA, 64 on the CPU), its bytes apart from the operands' (which torch
    lets out alias). Anything else takes the copy, with its checks and
    torch's errors."""
    return (
        isinstance(out, torch.Tensor)
        and isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        # first: what follows reads data pointers, which fake, functional
        # and transformed tensors lack and Dynamo does not trace
        and eager((a, b, out))
        and not (
            torch.is_grad_enabled()
            and (a.requires_grad or b.requires_grad or out.requires_grad)
        )
        and a.dim() in ranks
        and a.dtype in SUPPORTED
        and a.dtype == b.dtype == out.dtype
        and a.dim() == b.dim() == out.dim()
        and (a.dim() == 2 or a.shape[0] == b.shape[0])
        and a.shape[-1] == b.shape[-2]
        and out.shape[:-1] == a.shape[:-1]
        and out.shape[-1] == b.shape[-1]
        and a.device == b.device == out.device
        and out.is_contiguous()
        and not out.is_neg()
        # written outside inference mode, an inference tensor raises (copy_)
        and (not out.is_inference() or torch.is_inference_mode_enabled())
        and out.data_ptr() % (256 if out.is_cuda else 64) == 0
        and _apart(out, a)
        and _apart(out, b)
    )


def _apart(out, t):
    """out's bytes (dense) lie outside the span of t's, wherever the two
    tensors' storages came from (one buffer may back two storages)."""
    if not out.numel() or not t.numel():
        return True
    (out_lo, out_hi), (lo, hi) = byte_span(out), byte_span(t)
    return hi <= out_lo or out_hi <= lo


def _product_into(fn, out, a, b):
    """out <- a @ b through the kernels (_writes_into said yes): the checks
    of fn's operands, one launch, and torch's version bump of out."""
    a, b = _operands(fn, a, b)
    _launch_product(_C.matmul, a, b, out)
    torch.autograd.graph.increment_version(out)
    return out


def mm(input, mat2, out_dtype=None, *, out=None):
    """torch.mm: [m, k] x [k, n] -> [m, n]."""
    if tensor_like(input, mat2, out):
        return handle_torch_function(
            mm, (input, mat2, out), input, mat2, out_dtype, out=out
        )
    if out_dtype is not None:
        return torch_out_dtype(torch.mm, (input, mat2), out_dtype, out)
    if out is not None:
        if _writes_into(out, input, mat2, (2,)):
            return _product_into("mm", out, input, mat2)
        return _into("mm", out, (input, mat2), lambda: mm(input, mat2))
    return mm_as("mm", input, mat2)


def mm_as(name, input, mat2):
    """mm, its errors naming `name`: the function that called it (addmm)."""
    input, mat2 = _operands("mm", input, mat2, name)
    if input.dim() != 2 or mat2.dim() != 2:
        raise RuntimeError(
            f"{name}(): both arguments must be matrices, got "
            f"{input.dim()}-D and {mat2.dim()}-D"
        )
    if input.shape[1] != mat2.shape[0]:
        raise _shapes_error(name, input, mat2)
    return _product(input, mat2)


def bmm(input, mat2, out_dtype=None, *, out=None):
    """torch.bmm: [B, m, k] x [B, k, n] -> [B, m, n]."""
    if tensor_like(input, mat2, out):
        return handle_torch_function(
            bmm, (input, mat2, out), input, mat2, out_dtype, out=out
        )
    if out_dtype is not None:
        return torch_out_dtype(torch.bmm, (input, mat2), out_dtype, out)
    if out is not None:
        if _writes_into(out, input, mat2, (3,)):
            return _product_into("bmm", out, input, mat2)
        return _into("bmm", out, (input, mat2), lambda: bmm(input, mat2))
    input, mat2 = _operands("bmm", input, mat2)
    if input.dim() != 3 or mat2.dim() != 3:
        raise RuntimeError(
            f"bmm(): both arguments must be 3-D, got "
            f"{input.dim()}-D and {mat2.dim()}-D"
        )
    if input.shape[0] != mat2.shape[0] or input.shape[2] != mat2.shape[1]:
        raise _shapes_error("bmm", input, mat2)
    return _product(input, mat2)


def matmul(input, other, *, out=None):
    """torch.matmul's rules: 1-D (dot / vector), 2-D, batched with
    broadcasting of the batch dims."""
    if tensor_like(input, other, out):
        return handle_torch_function(
            matmul, (input, other, out), input, other, out=out
        )
    if out is not None:
        if _writes_into(out, input, other, (2, 3)):
            return _product_into("matmul", out, input, other)
        return _into(
            "matmul", out, (input, other), lambda: matmul(input, other)
        )
    return matmul_as("matmul", input, other)


def matmul_as(name, input, other):
    """matmul, its errors naming `name`: the function that called it
    (linear)."""
    input, other = _operands("matmul", input, other, name)
    da, db = input.dim(), other.dim()
    if da == 0 or db == 0:
        raise RuntimeError(
            f"{name}(): both arguments to matmul need to be at "
            f"least 1D, but they are {da}D and {db}D"
        )
    if da == db and (da == 2 or da == 3 and input.shape[0] == other.shape[0]):
        if input.shape[-1] != other.shape[-2]:
            raise _shapes_error(name, input, other)
        # mm / bmm: no views needed. Traced, torch's matmul: its node takes
        # any ranks, mm's and bmm's their own alone
        return _product(input, other, torch.matmul)
    if _tracing() is not None:
        # the folds below take the shapes as numbers, which the JIT tracer
        # would keep as constants (a trace run at other leading sizes came
        # out in the traced call's shape)
        return torch.matmul(input, other)
    a = input.unsqueeze(0) if da == 1 else input  # [.., m, k]
    b = other.unsqueeze(-1) if db == 1 else other  # [.., k, n]
    if a.shape[-1] != b.shape[-2]:
        raise _shapes_error(name, input, other)
    try:
        batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except RuntimeError:
        raise RuntimeError(
            f"{name}(): batch dimensions {list(a.shape[:-2])} and "
            f"{list(b.shape[:-2])} do not broadcast (shapes "
            f"{list(input.shape)} and {list(other.shape)})"
        ) from None
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    shape = batch + (m,) * (da != 1) + (n,) * (db != 1)  # of the result
    if all(s == 1 for s in b.shape[:-2]):
        # torch's folding (b one matrix, its batch dims all 1): the batch
        # joins m and one mm runs; b's gradient is then one product over
        # all batch * m rows, not a sum of per-batch products each rounded
        # to the dtype (fp16: inf - inf where the sum is finite)
        rows = math.prod(a.shape[:-1])  # not -1: ambiguous when k is 0
        out = _product(a.reshape(rows, k), b.reshape(k, n))
    elif all(s == 1 for s in a.shape[:-2]):
        # the mirror (a one matrix): out^T = b^T a^T with the batch joined
        # to n, so a's gradient is again one product over every batch
        nb = math.prod(batch)
        bt = b.expand(batch + (k, n)).mT.reshape(nb * n, k)
        out = _product(bt, a.reshape(m, k).mT)  # [nb * n, m]
        # contiguous, as torch's result
        out = out.reshape(batch + (n, m)).mT.contiguous()
    else:
        nb = math.prod(batch)  # not -1: ambiguous when m * k or k * n is 0
        a3 = a.expand(batch + (m, k)).reshape(nb, m, k)
        b3 = b.expand(batch + (k, n)).reshape(nb, k, n)
        out = _product(a3, b3)
    return unsafe_view(out, shape)


def _schedule_from_environment():
    """The schedule and mainloop GEMSOPS_MATMUL_SCHEDULE and
    GEMSOPS_MATMUL_MAINLOOP name (debugging and benchmarks), checked as
    set_schedule's arguments: a misspelt value is an error at import, not
    a silent 'auto'."""
    schedule = os.environ.get("GEMSOPS_MATMUL_SCHEDULE", "auto")
    mainloop = os.environ.get("GEMSOPS_MATMUL_MAINLOOP", "auto")
    _check_choice("GEMSOPS_MATMUL_SCHEDULE", schedule, SCHEDULES)
    _check_choice("GEMSOPS_MATMUL_MAINLOOP", mainloop, MAINLOOPS)
    set_schedule(schedule, mainloop=mainloop)


_schedule_from_environment()
