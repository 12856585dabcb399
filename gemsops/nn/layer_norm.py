import torch
import torch.nn.functional as F

from ..ops.layer_norm import layer_norm


class LayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm with gemsops kernels: the same arguments,
    defaults, parameter initialisation and state_dict keys (it is a
    subclass), so checkpoints load either way. torch.jit.script compiles
    it to torch's function (a scripted module runs no Python)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():
            return F.layer_norm(
                input, self.normalized_shape, self.weight, self.bias, self.eps
            )
        return layer_norm(
            input, self.normalized_shape, self.weight, self.bias, self.eps
        )
