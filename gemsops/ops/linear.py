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
        return c
    return torch.add(c, input.to(c.dtype), alpha=beta)


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
    if bias.dtype != y.dtype and torch.is_autocast_enabled(y.device.type):
        bias = bias.to(y.dtype)  # as torch's linear under autocast
    return y + bias
