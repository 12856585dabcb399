"""mm, bmm, matmul: torch's rules over gemsops._C's Stream-K matmul.

Every product reaches C as [m, k] x [k, n] or [batch, m, k] x [batch, k, n]
views of the inputs (transposes, slices, storage offsets and broadcast
batches are strides, not copies); C comes back [m, n] or [batch, m, n] and
is viewed into torch.matmul's result shape. The host path is kept short:
small products are host-bound (one _C call per launch; the workspace and
flags exist only for Stream-K launches and are kept per stream). The backward runs the same kernel on
transposed views: dA = dC . B^T, dB = A^T . dC.

Schedules: 'auto' (hybrid where Stream-K can help), 'data-parallel',
'stream-k', 'hybrid'; set_schedule() or GEMSOPS_MATMUL_SCHEDULE picks one
for tests and benchmarks. Mainloops (CUDA): 'auto' (the fastest the GPU and
operands allow), or a cap: 'wgmma-256', 'wgmma-128' (sm_90a), 'mma'
(sm_80+), 'ffma' (exact fp32); GEMSOPS_MATMUL_MAINLOOP sets it too.
"""
import math
import os

import torch

from .. import _C

SCHEDULES = {"auto": 0, "data-parallel": 1, "stream-k": 2, "hybrid": 3}
MAINLOOPS = {"auto": 0, "ffma": 1, "mma": 2, "wgmma-128": 3, "wgmma-256": 4}
SUPPORTED = (torch.float16, torch.bfloat16, torch.float32)

_config = dict(schedule=os.environ.get("GEMSOPS_MATMUL_SCHEDULE", "auto"),
               two_tiles=False, ctas=0, spin_limit=0,
               mainloop=os.environ.get("GEMSOPS_MATMUL_MAINLOOP", "auto"))
_launch = ()   # _C.matmul's (schedule, two_tiles, ctas, mainloop, spin_limit)
_streams = {}  # (device, stream handle) -> [int32 flags, epoch, workspace]
_errors = {}   # device -> int32 [1]


def _set_launch():
    global _launch
    _launch = (SCHEDULES[_config["schedule"]], _config["two_tiles"],
               _config["ctas"], MAINLOOPS[_config["mainloop"]],
               _config["spin_limit"])


def set_schedule(schedule="auto", *, two_tiles=False, ctas=0, spin_limit=0,
                 mainloop="auto"):
    """Force the Stream-K schedule for later calls: schedule in SCHEDULES;
    two_tiles: hybrid moves one full wave more into Stream-K; ctas: >0 caps
    the persistent grid (never above what fits on the device); spin_limit:
    >0 turns a Stream-K wait longer than that many polls into a
    RuntimeError (debug: a would-be hang becomes an error; it syncs);
    mainloop in MAINLOOPS: the most capable CUDA mainloop allowed."""
    if schedule not in SCHEDULES:
        raise ValueError(f"set_schedule(): schedule must be one of "
                         f"{sorted(SCHEDULES)}, got {schedule!r}")
    if mainloop not in MAINLOOPS:
        raise ValueError(f"set_schedule(): mainloop must be one of "
                         f"{sorted(MAINLOOPS)}, got {mainloop!r}")
    _config.update(schedule=schedule, two_tiles=bool(two_tiles),
                   ctas=int(ctas), spin_limit=int(spin_limit),
                   mainloop=mainloop)
    _set_launch()


def get_schedule():
    return dict(_config)


def _stream_buffers(device, need):
    """The flags (with a fresh epoch) and workspace of the stream a
    Stream-K launch runs on: kept per stream, since launches on one stream
    are ordered and may share them, launches on two may not. need is
    _C.matmul's (workspace bytes, flag count, stream handle)."""
    nbytes, count, stream = need
    entry = _streams.get((device, stream))
    if entry is None or entry[0].numel() < count or entry[1] >= 0xFFFFFFFF:
        flags = torch.zeros(max(count, 1024), dtype=torch.int32, device=device)
        entry = _streams[(device, stream)] = [flags, 0, None]
    if entry[2] is None or entry[2].numel() < nbytes:
        entry[2] = torch.empty(nbytes, dtype=torch.uint8, device=device)
    entry[1] += 1  # a new epoch: no flag needs resetting
    return entry


def _error_buffer(device):
    err = _errors.get(device)
    if err is None:
        err = _errors[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return err


def _mm(a, b):
    """[m, k] x [k, n] -> [m, n], or [B, m, k] x [B, k, n] -> [B, m, n]: a
    new contiguous C (no autograd). One _C call; a Stream-K launch asks for
    its stream's workspace and flags and takes a second."""
    c = torch.empty(a.shape[:-1] + b.shape[-1:], dtype=a.dtype, device=a.device)
    mode, two, ctas, loop, spin = _launch
    err = _error_buffer(a.device) if spin and a.is_cuda else None
    need = _C.matmul(a, b, c, mode, two, ctas, loop, None, None, 0, spin, err)
    if need is not None:
        flags, epoch, ws = _stream_buffers(a.get_device(), need)
        _C.matmul(a, b, c, mode, two, ctas, loop, ws, flags, epoch, spin, err)
    if err is not None and err.item():
        err.zero_()
        raise RuntimeError("matmul(): a Stream-K owner waited more than "
                           f"spin_limit={spin} polls for a peer's partial")
    return c


class MatmulFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return _mm(a, b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        if grad.is_neg():  # C reads raw memory: give it the values
            grad = grad.resolve_neg()
        da = db = None
        if ctx.needs_input_grad[0]:
            da = _mm(grad, b.mT)
        if ctx.needs_input_grad[1]:
            db = _mm(a.mT, grad)
        return da, db


def _operands(fn, a, b):
    """a and b checked as torch checks them (types, then dtypes, then
    devices), without the negative bit (C reads raw memory)."""
    if not isinstance(a, torch.Tensor):
        raise _not_tensor(fn, "input", a)
    if not isinstance(b, torch.Tensor):
        raise _not_tensor(fn, "other", b)
    if a.dtype != b.dtype:
        raise RuntimeError(f"{fn}(): expected both arguments to have the same "
                           f"dtype, but got {a.dtype} and {b.dtype}")
    if a.get_device() != b.get_device():
        raise RuntimeError(f"{fn}(): expected both arguments on the same "
                           f"device, but got {a.device} and {b.device}")
    if a.dtype not in SUPPORTED:  # torch's type for a dtype without kernel
        raise NotImplementedError(
            f"{fn}(): gemsops matmul takes float16, bfloat16 and float32, "
            f"got {a.dtype}")
    if a.is_neg():
        a = a.resolve_neg()
    if b.is_neg():
        b = b.resolve_neg()
    return a, b


def _not_tensor(fn, name, value):
    return TypeError(f"{fn}(): argument '{name}' must be a Tensor, not "
                     f"{type(value).__name__}")


def _product(a, b):
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return MatmulFunction.apply(a, b)
    return _mm(a, b)


def _shapes_error(fn, a, b):
    sa = "x".join(map(str, a.shape))
    sb = "x".join(map(str, b.shape))
    return RuntimeError(f"{fn}(): shapes cannot be multiplied ({sa} and {sb})")


def mm(input, mat2):
    """torch.mm: [m, k] x [k, n] -> [m, n]."""
    input, mat2 = _operands("mm", input, mat2)
    if input.dim() != 2 or mat2.dim() != 2:
        raise RuntimeError(f"mm(): both arguments must be matrices, got "
                           f"{input.dim()}-D and {mat2.dim()}-D")
    if input.shape[1] != mat2.shape[0]:
        raise _shapes_error("mm", input, mat2)
    return _product(input, mat2)


def bmm(input, mat2):
    """torch.bmm: [B, m, k] x [B, k, n] -> [B, m, n]."""
    input, mat2 = _operands("bmm", input, mat2)
    if input.dim() != 3 or mat2.dim() != 3:
        raise RuntimeError(f"bmm(): both arguments must be 3-D, got "
                           f"{input.dim()}-D and {mat2.dim()}-D")
    if input.shape[0] != mat2.shape[0] or input.shape[2] != mat2.shape[1]:
        raise _shapes_error("bmm", input, mat2)
    return _product(input, mat2)


def matmul(input, other):
    """torch.matmul's rules: 1-D (dot / vector), 2-D, batched with
    broadcasting of the batch dims."""
    input, other = _operands("matmul", input, other)
    da, db = input.dim(), other.dim()
    if da == 0 or db == 0:
        raise RuntimeError("matmul(): both arguments to matmul need to be at "
                           f"least 1D, but they are {da}D and {db}D")
    if da == db and (da == 2 or da == 3 and input.shape[0] == other.shape[0]):
        if input.shape[-1] != other.shape[-2]:
            raise _shapes_error("matmul", input, other)
        return _product(input, other)   # mm / bmm: no views needed
    a = input.unsqueeze(0) if da == 1 else input    # [.., m, k]
    b = other.unsqueeze(-1) if db == 1 else other   # [.., k, n]
    if a.shape[-1] != b.shape[-2]:
        raise _shapes_error("matmul", input, other)
    try:
        batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except RuntimeError:
        raise RuntimeError(
            f"matmul(): batch dimensions {list(a.shape[:-2])} and "
            f"{list(b.shape[:-2])} do not broadcast (shapes "
            f"{list(input.shape)} and {list(other.shape)})") from None
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    nb = math.prod(batch)  # not -1: ambiguous when m * k or k * n is 0
    a3 = a.expand(batch + (m, k)).reshape(nb, m, k)
    b3 = b.expand(batch + (k, n)).reshape(nb, k, n)
    out = _product(a3, b3).reshape(batch + (m, n))
    if da == 1:
        out = out.squeeze(-2)
    if db == 1:
        out = out.squeeze(-1)
    return out


_set_launch()
