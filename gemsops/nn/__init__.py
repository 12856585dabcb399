"""nn modules: drop-in replacements for their torch.nn counterparts."""

from .layer_norm import LayerNorm
from .linear import Linear
from .rms_norm import RMSNorm

__all__ = ["LayerNorm", "Linear", "RMSNorm"]
