from typing import Tuple

import torch
import torch.nn.functional as F

from ..ops.fused_add_norm import fused_add_layer_norm, fused_add_rms_norm


class FusedAddLayerNorm(torch.nn.LayerNorm):
    """torch.nn.LayerNorm's arguments, parameters and state_dict keys;
    forward(x, residual) returns (layer_norm(x + residual), x + residual)
    in one pass (gemsops.fused_add_layer_norm). torch.jit.script compiles
    it to torch's add and layer_norm."""

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        if torch.jit.is_scripting():
            h = x + residual
            y = F.layer_norm(
                h, self.normalized_shape, self.weight, self.bias, self.eps
            )
            return y, h
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
    one pass (gemsops.fused_add_rms_norm). torch.jit.script compiles it to
    torch's add and rms_norm."""

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        if torch.jit.is_scripting():
            h = x + residual
            return F.rms_norm(
                h, self.normalized_shape, self.weight, self.eps
            ), h
        return fused_add_rms_norm(
            x, residual, self.normalized_shape, self.weight, self.eps
        )
