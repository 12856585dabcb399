import torch
import torch.nn.functional as F

from ..ops.linear import linear
from ..ops.matmul import SUPPORTED


class Linear(torch.nn.Linear):
    """torch.nn.Linear with gemsops' matmul: the same arguments, defaults,
    parameter initialisation and state_dict keys (it is a subclass), so
    checkpoints load either way. Input of a dtype gemsops has no kernel for
    (float64, complex, integer: a model in .double() for gradcheck, say)
    takes torch's own product, as the global mode does, where the function
    gemsops.linear refuses it. torch.jit.script compiles it to torch's
    function."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():
            return F.linear(input, self.weight, self.bias)
        if isinstance(input, torch.Tensor) and input.dtype not in SUPPORTED:
            return super().forward(input)
        return linear(input, self.weight, self.bias)
