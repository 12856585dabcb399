"""How a public gemsops function reaches its kernel.

Every op is a torch.library custom op (namespace `gemsops`), so
torch.compile, export, fake tensors, autocast and functorch see one op.
Going through the dispatcher costs host time, though, and a plain eager
call on plain tensors needs none of it: `eager()` says when the public
function may call the op's Python implementation directly (what the
dispatcher would end up calling anyway). Anything unusual (tracing, a
dispatch or function mode, a tensor subclass, a functorch transform,
autocast, forward-mode AD, meta tensors) takes the op, or torch's own ops
where the custom op cannot serve (`torch_only()`).

The ops are defined by `define_op`, not torch.library.custom_op: the same
schema, kernels and registrations, without the Python custom_op wraps
around every call (an aliasing check after the kernel, a metadata object
and an out-argument test in the autograd kernel), which compiled code
pays on every op it calls."""

import torch
import torch.autograd.forward_ad as _forward_ad

_is_compiling = torch.compiler.is_compiling

# A product or norm computed on a folded view of its operands is handed
# out as torch's matmul hands out its own: through _unsafe_view, a result
# of its own rather than a view of the kernel's output, so that a caller
# may write into it in place (made under no_grad too) or detach_() it.
unsafe_view = torch.ops.aten._unsafe_view.default

# C takes tensors of at most this many dimensions (GEMSOPS_MAX_DIMS in
# include/gemsops/tensor.h); the Python layer folds larger ones.
MAX_DIMS = 16


def plain(t):
    """t without the negative bit (torch._neg_view, z.conj().imag): C
    reads raw memory, so it must be given the values themselves. The conj
    bit exists only on complex tensors, which the kernels refuse. Traced
    code leaves it to the ops, which run on real tensors."""
    return t.resolve_neg() if not _is_compiling() and t.is_neg() else t


_dispatch_modes = torch._C._len_torch_dispatch_stack
_any_autocast = torch._C._is_any_autocast_enabled
_has_torch_function = torch._C._has_torch_function
_functorch = torch._C._functorch.peek_interpreter_stack
_tracing = torch._C._get_tracing_state
_grad_enabled = torch._C.is_grad_enabled
_any_requires_grad = torch._C._any_requires_grad
_below_autograd = torch._C._AutoDispatchBelowAutograd
_after_autograd = torch._C._after_autograd_keyset

_strided = torch.strided

LIB = torch.library.Library("gemsops", "FRAGMENT")


def layout_refused(fn, named):
    """The error for the first tensor of named ((name, tensor) pairs) that
    is nested or of a non-strided layout (sparse, mkldnn), which no kernel
    takes: NotImplementedError, as the C boundary's for what DLPack cannot
    export, but naming fn and the argument. Callers test the layouts
    inline (a per-call host cost) and call this only to raise."""
    name, t = next(
        (n, t) for n, t in named if t.is_nested or t.layout is not _strided
    )
    what = "a nested tensor" if t.is_nested else f"of layout {t.layout}"
    return NotImplementedError(
        f"{fn}(): argument '{name}' is {what}; gemsops takes strided tensors"
    )


def not_tensor(fn, name, value, alt="", exc=TypeError):
    """The error for argument `name` of fn that is not a tensor (alt: what
    else the argument may be, as " or None")."""
    return exc(
        f"{fn}(): argument '{name}' must be a Tensor{alt}, not "
        f"{type(value).__name__}"
    )


_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter


def _subclass(tensors):
    """An entry is neither a torch.Tensor nor an nn.Parameter. A subclass
    may hold no storage of its own even where its __torch_function__ is
    disabled (a __torch_dispatch__ wrapper: DTensor, TwoTensor, a
    FakeTensor): only the op's dispatch unwraps it."""
    for t in tensors:
        if t is not None:
            cls = t.__class__
            if cls is not _Tensor and cls is not _Parameter:
                return True
    return False


_has_torch_function_variadic = torch._C._has_torch_function_variadic


def tensor_like(*args):
    """An argument (of tensors, None allowed) defines __torch_function__ (a
    tensor-like, or a tensor subclass that overrides it), or a torch
    function mode is active: torch's functions hand such a call to it
    (torch.overrides.handle_torch_function), and so do the public
    functions, with themselves as the function, so that a subclass sees
    one call of gemsops.layer_norm where torch's sees one of
    F.layer_norm. Anything else that is not a tensor is refused with
    torch's TypeError."""
    return not _is_compiling() and _has_torch_function_variadic(*args)


def eager(tensors):
    """True when `tensors` (a tuple, its first entry a tensor; None entries
    allowed) may go straight to the kernels: no tracing (the JIT tracer
    would record none of a direct call), no mode, no subclass, no
    autocast, no forward-mode AD, no meta tensor (C has no bytes to read:
    the op's fake kernel answers)."""
    # is_compiling() first: Dynamo folds it to True and never looks past it
    return not (
        _is_compiling()
        or _dispatch_modes()
        or _any_autocast()
        or _functorch() is not None
        or _has_torch_function(tensors)
        or _subclass(tensors)
        or _forward_ad._current_level >= 0
        or _tracing() is not None
        or tensors[0].is_meta
    )


_legacy_batched = torch._C._functorch.is_legacy_batchedtensor
_functorch_batched = torch._C._functorch.is_batchedtensor


def batched(grad):
    """grad is a vmap's batched tensor (torch.autograd.grad's
    is_grads_batched, a torch.func.vmap over a backward): it has no storage
    for C to read, so the eager backward computes with torch's ops."""
    return _legacy_batched(grad) or _functorch_batched(grad)


def torch_only():
    """True where a gemsops custom op cannot give the right answer and the
    caller computes with torch's own ops instead (for the non-eager path):
    forward-mode AD (a dual level, torch.func.jvp, jacfwd), whose tangent
    a custom op with only a backward formula drops (zeros, or None), and
    the other functorch transforms, whose grad, vjp and jacrev refuse the
    autograd Function torch.library makes for a custom op. Not under
    torch.compile, where Dynamo answers the interpreter-stack query for
    every compiled function alike: there the op serves, and a compiled
    torch.func.jvp of it gets a zero tangent, compiled grad raises
    (README)."""
    return not _is_compiling() and (
        _functorch() is not None or _forward_ad._current_level >= 0
    )


def eager_apply(function):
    """function.apply (a torch.autograd.Function of the old style: no
    setup_context) without Function.apply's Python layer, which binds
    default arguments and unwraps functorch's dead wrappers on every call:
    for the eager path, where eager() has ruled functorch out. The C++
    half (graph recording, saved tensors, views) is the same."""
    return super(torch.autograd.Function, function).apply


def autocast_enabled(device_type):
    """torch.is_autocast_enabled(device_type) for any tensor's device type:
    False where autocast has no state (meta tensors, for which torch raises
    RuntimeError), as no autocast applies there."""
    try:
        return torch.is_autocast_enabled(device_type)
    except RuntimeError:  # a device type with no autocast state
        return False


def cast_floating(value, device_type, dtype):
    if (
        isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and value.device.type == device_type
        and value.dtype != torch.float64
    ):
        return value.to(dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(cast_floating(v, device_type, dtype) for v in value)
    return value


def register_autocast(op, device_type, policy):
    """Autocast rule of custom op `op` (an OpOverload) on device_type, as
    torch's own lists: policy 'lower' casts floating inputs to the autocast
    dtype of the region (fp16 or bf16: the matmul family), 'fp32' casts
    them to float32. Like torch.library.register_autocast, whose cast dtype
    is fixed when registered; this one reads the region's dtype per call."""
    key_name = "Autocast" + torch._C._dispatch_key_for_device(device_type)
    key = getattr(torch._C.DispatchKey, key_name)

    def run(*args):
        dtype = (
            torch.float32
            if policy == "fp32"
            else torch.get_autocast_dtype(device_type)
        )
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(key)):
            return op(*cast_floating(args, device_type, dtype))

    if op.has_kernel_for_dispatch_key(key):
        op.py_kernels.pop(key)
    op.py_impl(key)(run)  # what tracing (make_fx, export) calls

    def kernel(_keyset, *args):
        return run(*args)

    LIB.impl(
        op._schema.name.split("::")[1]
        + ("." + op._overloadname if op._overloadname != "default" else ""),
        kernel,
        key_name,
        with_keyset=True,
    )


class Op:
    """A gemsops op made by define_op: calls go to its OpOverload; the
    fake kernel and the autograd formula are registered as on a
    torch.library.custom_op (register_fake, register_autograd)."""

    def __init__(self, name, fn):
        schema = torch.library.infer_schema(fn, mutates_args=())
        LIB.define(name + schema, tags=(torch.Tag.pt2_compliant_tag,))
        for key in ("CPU", "CUDA"):
            LIB.impl(name, fn, key)
        self.overload = getattr(torch.ops.gemsops, name).default
        self.fn = fn
        self.composite = None
        self.__doc__ = fn.__doc__

    def __call__(self, *args):
        return self.overload(*args)

    def register_fake(self, fn):
        torch.library.register_fake(self.overload, fn, lib=LIB)
        return fn

    def register_composite(self, fn):
        """The op in torch's differentiable ops, with its arguments and
        outputs: what its Autograd kernel computes under forward-mode AD
        and the torch.func transforms (torch_only()), where the recorded
        autograd Function would drop the tangent or be refused."""
        self.composite = fn
        return fn

    def register_autograd(self, backward, setup_context, materialize=True):
        """backward(ctx, *grads) and setup_context(ctx, inputs, output), as
        torch.library.register_autograd's; materialize=False hands backward
        None for an output no gradient reached (torch's undefined gradient),
        not zeros, so that it can leave an input unused where torch's own
        formula does."""
        LIB.impl(
            self.overload._schema.name.split("::")[1],
            _autograd_kernel(self, backward, setup_context, materialize),
            "Autograd",
            with_keyset=True,
        )


def define_op(name):
    """Decorator: `gemsops::name` from the function's annotated signature
    (its schema, as torch.library.infer_schema reads it), the function as
    its CPU and CUDA kernel."""
    return lambda fn: Op(name, fn)


# What a plain CPU or CUDA tensor's dispatch holds below autograd: the
# backend and the view tracking (no kernel of ours: a fallthrough). Any
# other key there (a mode's Python key, functionalization, fake tensors,
# the negative bit) takes the dispatcher's way.
_K = torch._C.DispatchKey
_PLAIN_BELOW = {
    (
        torch._C.DispatchKeySet(backend) | torch._C.DispatchKeySet(view)
    ).raw_repr()
    for backend in (_K.CPU, _K.CUDA)
    for view in (_K.ADInplaceOrView, backend)
}


def _autograd_kernel(defined, backward, setup_context, materialize):
    """The Autograd kernel of a defined Op: its composite where torch_only()
    holds; without grad (compiled graphs, no_grad) on to the kernels below
    autograd, straight to the backend kernel where nothing else lies below
    (a second trip through the dispatcher costs more host time than the
    launch); with grad, an autograd Function recording setup_context and
    backward, whose signatures are register_autograd's."""
    op, fn = defined.overload, defined.fn
    arguments = op._schema.arguments

    def full(args):
        # the dispatcher drops trailing arguments equal to their defaults
        return args + tuple(a.default_value for a in arguments[len(args) :])

    class Recorded(torch.autograd.Function):
        @staticmethod
        def forward(ctx, keyset, *args):
            ctx.set_materialize_grads(materialize)
            with _below_autograd():
                out = op.redispatch(keyset & _after_autograd, *args)
            need = ctx.needs_input_grad  # setup_context sees the op's
            ctx.needs_input_grad = need[1:]
            try:
                setup_context(ctx, args, out)
            finally:
                ctx.needs_input_grad = need
            return out

        @staticmethod
        def backward(ctx, *grads):
            need = ctx.needs_input_grad
            ctx.needs_input_grad = need[1:]
            try:
                result = backward(ctx, *grads)
            finally:
                ctx.needs_input_grad = need
            if isinstance(result, tuple):
                return (None, *result)
            return None, result

    Recorded.__name__ = f"GemsopsBackward_{op._opname}"

    def kernel(keyset, *args):
        # torch_only(), its cheapest tests first: every call of a compiled
        # graph passes here
        if (
            defined.composite is not None
            and (_forward_ad._current_level >= 0 or _functorch() is not None)
            and not _is_compiling()
        ):
            return defined.composite(*full(args))
        if _grad_enabled() and _any_requires_grad(*args):
            return Recorded.apply(keyset, *full(args))
        if (keyset & _after_autograd).raw_repr() in _PLAIN_BELOW:
            return fn(*args)
        with _below_autograd():
            return op.redispatch(keyset & _after_autograd, *args)

    return kernel
