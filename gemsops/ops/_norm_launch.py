"""What the norms share in their launches: the backward's outputs and
its one launch through C's kept-workspace protocol (the LayerNorm and
RMSNorm kernels share the kept buffer), and the outputs a mask leaves
out."""

import torch

from .. import _workspace
from ._aligned import aligned, misaligned

# backward: device -> stream handle of the kept workspace last used there
# (C answers "another stream" with the handle to ask _workspace for). A
# kept workspace is zeros when made and each launch leaves its dW/dB
# accumulators zero again (kept_zero in C): no memset, no allocation.
_bwd_stream = {}


def grad_outputs(x, shape, weight, want_dx, want_dw, want_db=False):
    """(dx, dW, dB) as the norm backwards fill them (None where not
    wanted): dx contiguous in x's dtype, dW/dB in the weight's."""
    contiguous = torch.contiguous_format
    dx = torch.empty_like(x, memory_format=contiguous) if want_dx else None
    if weight is not None and x.numel():
        # like the weight: empty(shape, dtype=..., device=...) takes longer
        # to parse
        like = torch.empty_like
        dw = like(weight, memory_format=contiguous) if want_dw else None
        db = like(weight, memory_format=contiguous) if want_db else None
        return dx, dw, db
    pdtype = weight.dtype if weight is not None else x.dtype
    # dW/dB over no rows are zeros, which a CUDA launch would not write
    empty = torch.zeros if x.numel() == 0 else torch.empty
    dw = empty(shape, dtype=pdtype, device=x.device) if want_dw else None
    db = empty(shape, dtype=pdtype, device=x.device) if want_db else None
    return dx, dw, db


def launch_backward(c_bwd, c_workspace, args, plan, wanted):
    """One backward launch through C's kept-workspace protocol (the
    LayerNorm and RMSNorm entry points share it and the kept buffer):
    c_bwd(*args, workspace[, stream]); c_workspace(*plan) sizes a
    workspace of its own. x is args[1]. A misaligned input (C refuses it)
    is launched again from an aligned copy."""
    x = args[1]
    try:
        if x.numel() == 0 or not x.is_cuda or not wanted:
            # C checks the arguments as for any call (and computes on the
            # CPU)
            c_bwd(*args, None)
            return
        device = x.get_device()
        if _workspace.in_graph_pool(x.device):
            # a captured launch gets its own workspace and zeroes it itself
            c_bwd(*args, _workspace.scratch(c_workspace(*plan), x.device))
            return
        stream = _bwd_stream.get(device, -1)
        slot = _workspace.lookup("ln_bwd", device, stream)
        try:
            need = c_bwd(*args, slot and slot.buf, stream)
            if need is not None:  # first use, larger, or another stream
                nbytes, stream = need
                slot = _workspace.kept(
                    "ln_bwd", device, stream, nbytes, minimum=4096
                )
                _bwd_stream[device] = stream
                c_bwd(*args, slot.buf, stream)
        except BaseException:
            # a failed launch may leave accumulators non-zero: start afresh
            _bwd_stream.pop(device, None)
            _workspace.forget("ln_bwd", device)
            raise
        return
    except ValueError:
        if not misaligned(*args):
            raise
    args, plan = aligned(*args), aligned(*plan)
    launch_backward(c_bwd, c_workspace, args, plan, wanted)


def bias_grad_apart(x, weight, bias):
    """No weight and a bias of its own dtype (fp32 beside half input): the
    kernels write dW/dB in the weight's dtype only, so dB is summed apart
    (grad_bias), in the bias' dtype as torch's."""
    return weight is None and bias is not None and bias.dtype != x.dtype


def grad_bias(grad_out, nd, bias):
    """dB, the rows' sum of dy, in fp32 and then the bias' dtype (summed
    over the leading dims, not a reshape to (-1, N): N may be 0)."""
    lead = tuple(range(grad_out.dim() - nd))
    if lead:
        return grad_out.sum(lead, dtype=torch.float32).to(bias.dtype)
    return grad_out.to(torch.float32, copy=True).to(bias.dtype)


def sum_rows(t, nd):
    """t summed over its leading dims (all but the last nd): a copy of t
    where there are none, since sum(()) would sum every dim."""
    rows = tuple(range(t.dim() - nd))
    return t.sum(rows) if rows else t.clone()


def none_unless(mask, *ts):
    return tuple(t if m else None for m, t in zip(mask, ts))


def unwanted(like, dtype):
    # an output output_mask leaves out: 0 elements (a custom op cannot
    # return None); the Python wrappers turn it into None
    return like.new_empty((0,), dtype=dtype)
