"""nn modules: drop-in replacements for their torch.nn counterparts."""

from .layer_norm import LayerNorm
from .linear import Linear

__all__ = ["LayerNorm", "Linear"]
