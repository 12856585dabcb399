import torch
import torch.nn.functional as F

from ..ops.rms_norm import rms_norm


class RMSNorm(torch.nn.RMSNorm):
    """torch.nn.RMSNorm with gemsops kernels: the same arguments, defaults,
    parameter initialisation and state_dict keys (it is a subclass).
    torch.jit.script compiles it to torch's function."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():
            return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)
        return rms_norm(x, self.normalized_shape, self.weight, self.eps)
