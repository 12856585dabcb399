import torch

from ..ops.layer_norm import layer_norm


class LayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm with gemsops kernels: the same arguments,
    defaults, parameter initialisation and state_dict keys (it is a
    subclass), so checkpoints load either way."""

    def forward(self, input):
        return layer_norm(
            input, self.normalized_shape, self.weight, self.bias, self.eps
        )
