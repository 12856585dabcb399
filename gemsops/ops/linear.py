"""addmm and linear (torch.addmm / torch.nn.functional.linear semantics)
over gemsops' matmul. The bias is added by a separate torch op after the
product (the matmul kernel has no bias epilogue yet), and its gradient is
torch's sum over rows; the products themselves, forward and backward, run
on gemsops' kernels on transposed views without copies."""

import torch

from .matmul import matmul, mm


def addmm(input, mat1, mat2, *, beta=1, alpha=1):
    """torch.addmm: beta * input + alpha * (mat1 @ mat2), input broadcast
    to [m, n]; with beta == 0 input is not read (its NaNs do not spread)."""
    if not isinstance(input, torch.Tensor):
        raise TypeError(
            "addmm(): argument 'input' (position 1) must be Tensor, not "
            f"{type(input).__name__}"
        )
    c = mm(mat1, mat2)
    if input.dtype != c.dtype and not torch.is_autocast_enabled(c.device.type):
        raise RuntimeError(
            f"addmm(): expected input of dtype {c.dtype}, got {input.dtype}"
        )
    try:
        shape = torch.broadcast_shapes(input.shape, c.shape)
    except RuntimeError:
        shape = None
    if shape != c.shape:
        raise RuntimeError(
            f"addmm(): input of shape {list(input.shape)} does not "
            f"broadcast to the product's shape {list(c.shape)}"
        )
    if alpha != 1:
        c = c * alpha
    if beta == 0:
        return _BetaZero.apply(c, input)
    return torch.add(c, input.to(c.dtype), alpha=beta)


class _BetaZero(torch.autograd.Function):
    """beta == 0: the product alone, input not read (its NaNs do not
    spread), and input's gradient zeros, as torch's addmm gives."""

    @staticmethod
    def forward(ctx, c, input):
        ctx.input_meta = (input.shape, input.dtype, input.device)
        return c.view_as(c)

    @staticmethod
    def backward(ctx, g):
        shape, dtype, device = ctx.input_meta
        return g, torch.zeros(shape, dtype=dtype, device=device)


def linear(input, weight, bias=None):
    """torch.nn.functional.linear: input [*, in] @ weight[out, in]^T
    (+ bias[out]). The batch dims fold into one product."""
    if not isinstance(weight, torch.Tensor) or weight.dim() not in (1, 2):
        raise RuntimeError(
            "linear(): weight must be a 1-D or 2-D tensor, got "
            + (
                f"{weight.dim()}-D"
                if isinstance(weight, torch.Tensor)
                else type(weight).__name__
            )
        )
    y = matmul(input, weight.t() if weight.dim() == 2 else weight)
    if bias is None:
        return y
    if bias.dtype != y.dtype:
        # one dtype, as torch's addmm path (its matmul-and-add_ paths,
        # taken for some layouts, cast the bias: README, differences)
        if not torch.is_autocast_enabled(y.device.type):
            raise RuntimeError(
                "linear(): bias and input must have the same dtype, but got "
                f"{bias.dtype} and {y.dtype}"
            )
        bias = bias.to(y.dtype)  # as torch's linear under autocast
    return y + bias
