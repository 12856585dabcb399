import torch

from ..ops.fused_add_norm import fused_add_layer_norm, fused_add_rms_norm


class FusedAddLayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm's arguments, parameters and state_dict keys;
    forward(x, residual) returns (layer_norm(x + residual), x + residual)
    in one pass (gemsops.fused_add_layer_norm)."""

    def forward(self, x, residual):
        return fused_add_layer_norm(
            x,
            residual,
            self.normalized_shape,
            self.weight,
            self.bias,
            self.eps,
        )


class FusedAddRMSNorm(torch.nn.RMSNorm):
    """torch.nn.RMSNorm's arguments, parameters and state_dict keys;
    forward(x, residual) returns (rms_norm(x + residual), x + residual) in
    one pass (gemsops.fused_add_rms_norm)."""

    def forward(self, x, residual):
        return fused_add_rms_norm(
            x, residual, self.normalized_shape, self.weight, self.eps
        )
