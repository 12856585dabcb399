"""Tensors that start at an address that is not a multiple of their
element size (torch.frombuffer at an odd offset, a view of a NumPy array
at one) are refused by C with ValueError, where torch computes them. Each
C call site retries on aligned copies, and only after C has refused, so
the check is off the fast path."""

import torch


def _off(t):
    return isinstance(t, torch.Tensor) and t.data_ptr() % t.element_size() != 0


def misaligned(*ts):
    """Whether any of ts (tensors or other arguments) is misaligned."""
    return any(_off(t) for t in ts)


def aligned(*ts):
    """ts with each misaligned tensor replaced by an aligned copy (a new
    allocation; a copy of an expanded tensor is dense)."""
    return tuple(t.clone() if _off(t) else t for t in ts)


def call_aligned(call, *inputs):
    """call(*inputs); where C refuses it and one of inputs is misaligned,
    call(*aligned(*inputs)). Outputs stay out of inputs: a copy of one
    would take the result."""
    try:
        return call(*inputs)
    except ValueError:
        if not misaligned(*inputs):
            raise
    return call(*aligned(*inputs))
