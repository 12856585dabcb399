"""How a public gemsops function reaches its kernel.

Every op is a torch.library custom op (namespace `gemsops`), so
torch.compile, export, fake tensors, autocast and functorch see one op.
Going through the dispatcher costs host time, though, and a plain eager
call on plain tensors needs none of it: `eager()` says when the public
function may call the op's Python implementation directly (what the
dispatcher would end up calling anyway). Anything unusual (tracing, a
dispatch or function mode, a tensor subclass, a functorch transform,
autocast, forward-mode AD, meta tensors) takes the op, or torch's own ops
where the custom op cannot serve (`torch_only()`)."""

import torch
import torch.autograd.forward_ad as _forward_ad

_is_compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack
_any_autocast = torch._C._is_any_autocast_enabled
_has_torch_function = torch._C._has_torch_function
_functorch = torch._C._functorch.peek_interpreter_stack
_tracing = torch._C._get_tracing_state

LIB = torch.library.Library("gemsops", "FRAGMENT")


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
        or _forward_ad._current_level >= 0
        or _tracing() is not None
        or tensors[0].is_meta
    )


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
