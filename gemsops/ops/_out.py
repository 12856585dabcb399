"""out= for the ops that take one, by torch's rules."""

import warnings

import torch

from .._dispatch import autocast_enabled


def into(fn, out, inputs, compute):
    """torch's out= rules for compute()'s result: out must be a tensor of
    the result's dtype and device; a shape that differs is resized
    (with torch's warning when out held elements); no autograd records
    through it; out itself is returned. The result is computed first, so
    out may alias an input, as torch allows."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(
            f"{fn}(): argument 'out' must be Tensor, not {type(out).__name__}"
        )
    if torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in (*inputs, out)
    ):
        raise RuntimeError(
            f"{fn}(): functions with out=... arguments don't support "
            "automatic differentiation, but one of the arguments requires "
            "grad."
        )
    # torch's out= variants are on no autocast list: they compute in
    # their inputs' dtypes, autocast or not
    device = next(
        (t.device.type for t in inputs if isinstance(t, torch.Tensor)),
        out.device.type,
    )
    if autocast_enabled(device):
        with torch.autocast(device, enabled=False):
            r = compute()
    else:
        r = compute()
    if out.dtype != r.dtype:
        raise RuntimeError(
            f"{fn}(): expected out tensor to have dtype {r.dtype}, but got "
            f"{out.dtype} instead"
        )
    if out.device != r.device:
        raise RuntimeError(
            f"{fn}(): expected out on {r.device}, but got {out.device}"
        )
    if out.shape != r.shape:
        if out.numel():
            # torch's first words, which warning filters match from the start
            warnings.warn(
                "An output with one or more elements was resized since it "
                f"had shape {list(out.shape)}, which does not match the "
                f"required output shape {list(r.shape)} ({fn}(), out=)",
                UserWarning,
                stacklevel=3,
            )
        # one version bump for the call, as torch's out= (the copy's)
        with torch.autograd._unsafe_preserve_version_counter(out):
            out.resize_(r.shape)
    return out.copy_(r)


def byte_span(t):
    """[first, last + 1) of the bytes a non-empty strided tensor's elements
    lie in (strides are never negative in torch)."""
    lo = t.data_ptr()
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return lo, lo + (last + 1) * t.element_size()


def refuse_partial_overlap(out, input):
    """torch's check of an out= against an input it reads elementwise
    (addmm's input): RuntimeError where the two share some memory but are
    not the same elements in the same order. As torch, tensors that are
    not dense and free of self-overlap are not compared (too hard to
    tell)."""
    if not (isinstance(out, torch.Tensor) and isinstance(input, torch.Tensor)):
        return
    if out is input or not out.numel() or not input.numel():
        return
    if not (_dense(out) and _dense(input)):
        return
    if out.untyped_storage().data_ptr() != input.untyped_storage().data_ptr():
        return
    (a0, a1), (b0, b1) = byte_span(out), byte_span(input)
    if a0 == b0 and a1 == b1:
        partial = out.stride() != input.stride()
    else:
        partial = a0 < b1 and b0 < a1
    if partial:
        raise RuntimeError(
            "unsupported operation: some elements of the input tensor and "
            "the written-to tensor refer to a single memory location. "
            "Please clone() the tensor before performing the operation."
        )


def _dense(t):
    """Non-overlapping and dense: its elements fill a block of memory
    exactly once, in some order of its dims."""
    expected = 1
    for size, stride in sorted(
        (d for d in zip(t.shape, t.stride()) if d[0] != 1),
        key=lambda d: d[1],
    ):
        if stride != expected:
            return False
        expected *= size
    return True
