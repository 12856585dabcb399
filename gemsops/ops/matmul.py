"""mm, bmm, matmul: torch's rules over gemsops._C's Stream-K matmul.

Every product reaches C as [batch, m, k] x [batch, k, n] views of the
inputs (transposes, slices, storage offsets and broadcast batches are
strides, not copies); C comes back [batch, m, n] and is viewed into
torch.matmul's result shape. The backward runs the same kernel on
transposed views: dA = dC . B^T, dB = A^T . dC.

Schedules: 'auto' (hybrid where Stream-K can help), 'data-parallel',
'stream-k', 'hybrid'; set_schedule() or GEMSOPS_MATMUL_SCHEDULE picks one
for tests and benchmarks. Mainloops (CUDA): 'auto' (the fastest the GPU and
operands allow), or a cap: 'wgmma-256', 'wgmma-128' (sm_90a), 'mma'
(sm_80+), 'ffma' (exact fp32); GEMSOPS_MATMUL_MAINLOOP sets it too.
"""
import os

import torch

from .. import _C

SCHEDULES = {"auto": 0, "data-parallel": 1, "stream-k": 2, "hybrid": 3}
MAINLOOPS = {"auto": 0, "ffma": 1, "mma": 2, "wgmma-128": 3, "wgmma-256": 4}
SUPPORTED = (torch.float16, torch.bfloat16, torch.float32)

_config = dict(schedule=os.environ.get("GEMSOPS_MATMUL_SCHEDULE", "auto"),
               two_tiles=False, ctas=0, spin_limit=0,
               mainloop=os.environ.get("GEMSOPS_MATMUL_MAINLOOP", "auto"))
_plans = {}
_flags = {}   # (device, stream) -> [int32 flags, last epoch]
_errors = {}  # device -> int32 [1]


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


def get_schedule():
    return dict(_config)


def _flag_buffer(device, ctas):
    key = (device, torch.cuda.current_stream(device).cuda_stream)
    entry = _flags.get(key)
    if entry is None or entry[0].numel() < ctas or entry[1] >= 0xFFFFFFFF:
        entry = _flags[key] = [torch.zeros(max(ctas, 1024), dtype=torch.int32,
                                           device=device), 0]
    entry[1] += 1  # a new epoch: no flag needs resetting
    return entry[0], entry[1]


def _error_buffer(device):
    err = _errors.get(device)
    if err is None:
        err = _errors[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return err


def _mm3(a, b):
    """[B, m, k] x [B, k, n] -> new contiguous [B, m, n] (no autograd)."""
    c = torch.empty((a.shape[0], a.shape[1], b.shape[2]), dtype=a.dtype,
                    device=a.device)
    mode = SCHEDULES[_config["schedule"]]
    loop = MAINLOOPS[_config["mainloop"]]
    two, ctas, spin = _config["two_tiles"], _config["ctas"], _config["spin_limit"]
    if not a.is_cuda:
        _C.matmul(a, b, c, mode, two, ctas, loop, None, None, 1, spin, None)
        return c
    # the kernel (tensor cores or FFMA) depends on layout and alignment
    key = (a.shape, b.shape, a.stride(), b.stride(), a.data_ptr() % 16,
           b.data_ptr() % 16, a.dtype, a.device.index, mode, two, ctas, loop)
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = _C.matmul_plan(a, b, c, mode, two, ctas, loop)
    ws = None
    if plan["sk_tiles"]:
        ws = torch.empty(plan["ctas"] * plan["bm"] * plan["bn"] * 4,
                         dtype=torch.uint8, device=a.device)
    flags, epoch = _flag_buffer(a.device, plan["ctas"])
    err = _error_buffer(a.device)
    _C.matmul(a, b, c, mode, two, ctas, loop, ws, flags, epoch, spin, err)
    if spin and err.item():
        err.zero_()
        raise RuntimeError("matmul(): a Stream-K owner waited more than "
                           f"spin_limit={spin} polls for a peer's partial")
    return c


class MatmulFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return _mm3(a, b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        da = db = None
        if ctx.needs_input_grad[0]:
            da = _mm3(grad, b.transpose(1, 2))
        if ctx.needs_input_grad[1]:
            db = _mm3(a.transpose(1, 2), grad)
        return da, db


def _check_pair(fn, a, b):
    for name, t in (("input", a), ("other", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}(): argument '{name}' must be a Tensor, "
                            f"not {type(t).__name__}")
    if a.dtype != b.dtype:
        raise RuntimeError(f"{fn}(): expected both arguments to have the same "
                           f"dtype, but got {a.dtype} and {b.dtype}")
    if a.device != b.device:
        raise RuntimeError(f"{fn}(): expected both arguments on the same "
                           f"device, but got {a.device} and {b.device}")
    if a.dtype not in SUPPORTED:
        raise TypeError(f"{fn}(): gemsops matmul takes float16, bfloat16 and "
                        f"float32, got {a.dtype}")


def _product(a3, b3):
    if torch.is_grad_enabled() and (a3.requires_grad or b3.requires_grad):
        return MatmulFunction.apply(a3, b3)
    return _mm3(a3.detach(), b3.detach())


def _shapes_error(fn, a, b):
    sa = "x".join(map(str, a.shape))
    sb = "x".join(map(str, b.shape))
    return RuntimeError(f"{fn}(): shapes cannot be multiplied ({sa} and {sb})")


def mm(input, mat2):
    """torch.mm: [m, k] x [k, n] -> [m, n]."""
    _check_pair("mm", input, mat2)
    if input.dim() != 2 or mat2.dim() != 2:
        raise RuntimeError(f"mm(): both arguments must be matrices, got "
                           f"{input.dim()}-D and {mat2.dim()}-D")
    if input.shape[1] != mat2.shape[0]:
        raise _shapes_error("mm", input, mat2)
    return _product(input.unsqueeze(0), mat2.unsqueeze(0))[0]


def bmm(input, mat2):
    """torch.bmm: [B, m, k] x [B, k, n] -> [B, m, n]."""
    _check_pair("bmm", input, mat2)
    if input.dim() != 3 or mat2.dim() != 3:
        raise RuntimeError(f"bmm(): both arguments must be 3-D, got "
                           f"{input.dim()}-D and {mat2.dim()}-D")
    if input.shape[0] != mat2.shape[0] or input.shape[2] != mat2.shape[1]:
        raise _shapes_error("bmm", input, mat2)
    return _product(input, mat2)


def matmul(input, other):
    """torch.matmul's rules: 1-D (dot / vector), 2-D, batched with
    broadcasting of the batch dims."""
    _check_pair("matmul", input, other)
    da, db = input.dim(), other.dim()
    if da == 0 or db == 0:
        raise RuntimeError("matmul(): both arguments to matmul need to be at "
                           f"least 1D, but they are {da}D and {db}D")
    a = input.unsqueeze(0) if da == 1 else input    # [.., m, k]
    b = other.unsqueeze(-1) if db == 1 else other   # [.., k, n]
    if a.shape[-1] != b.shape[-2]:
        raise _shapes_error("matmul", input, other)
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    a3 = a.expand(batch + (m, k)).reshape(-1, m, k)
    b3 = b.expand(batch + (k, n)).reshape(-1, k, n)
    out = _product(a3, b3).reshape(batch + (m, n))
    if da == 1:
        out = out.squeeze(-2)
    if db == 1:
        out = out.squeeze(-1)
    return out
