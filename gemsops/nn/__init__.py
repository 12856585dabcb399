"""nn modules: drop-in replacements for their torch.nn counterparts."""

from .fused_add_norm import FusedAddLayerNorm, FusedAddRMSNorm
from .layer_norm import LayerNorm
from .linear import Linear
from .rms_norm import RMSNorm

__all__ = [
    "FusedAddLayerNorm",
    "FusedAddRMSNorm",
    "LayerNorm",
    "Linear",
    "RMSNorm",
]
