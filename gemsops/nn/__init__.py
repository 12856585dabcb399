"""nn modules: drop-in replacements for their torch.nn counterparts."""

from .layer_norm import LayerNorm

__all__ = ["LayerNorm"]
