"""The norms' second-order gradients: the vector-Jacobian product of a
backward written in torch's differentiable ops, and a third order that
raises rather than answer wrong."""

import torch


class NoThirdOrder(torch.autograd.Function):
    """Second-order gradients as they are; a third order raises: the
    second-order formulas are not differentiated right once more, and a
    silent wrong value is worse than an error."""

    @staticmethod
    def forward(ctx, op, *ts):
        ctx.op = op
        return tuple(None if t is None else t.clone() for t in ts)

    @staticmethod
    def backward(ctx, *gs):
        raise RuntimeError(
            f"gemsops.{ctx.op}: third and higher-order gradients are not "
            "implemented (first and second order are)"
        )


def second_order_vjp(composite, primals, cots):
    """The vector-Jacobian product of a composite backward (its outputs
    those whose cotangent in cots is not None) at primals. torch.func.vjp:
    the result stays differentiable with respect to the saved tensors' own
    history (third order and up), without counting twice a path from x to
    grad_out."""
    _, vjp = torch.func.vjp(composite, *primals)
    return vjp(tuple(c for c in cots if c is not None))


def weight_second_order(grads, weight, cots):
    """The weight's part of a norm's second order (grads from
    second_order_vjp or second_order_zeros over (grad_out, x, weight),
    cots with dx's first): the weight reaches the backward's outputs only
    through dx (dw and db are free of it), so without a cotangent for dx
    it is unused, and torch.autograd.grad says so (an error, or None with
    allow_unused) as it does for torch's norms, where zeros would be a
    silent difference."""
    if weight is None or cots[0] is None:
        return None
    return grads[2]


def second_order_zeros(primals):
    """Second order where nothing flows back (every gradient asked of the
    backward is empty or unasked): zeros, as torch gives; torch.func.vjp
    refuses a function with no outputs."""
    return tuple(torch.zeros_like(p) for p in primals)
