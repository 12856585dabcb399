"""gemsops: fast LayerNorm and RMSNorm (forward + fused atomic backward),
prod and Stream-K matmul for PyTorch tensors, on CUDA and on the CPU."""

from . import _C, nn
from ._global import disable, enable, enabled, use_gemsops
from ._version import __version__ as __version__
from .ops.fused_add_norm import fused_add_layer_norm, fused_add_rms_norm
from .ops.layer_norm import layer_norm, layer_norm_backward, native_layer_norm
from .ops.linear import addmm, linear
from .ops.matmul import bmm, matmul, mm, set_schedule
from .ops.prod import prod
from .ops.rms_norm import rms_norm


def cuda_available():
    """True when the extension has CUDA kernels and a GPU is visible."""
    return _C.cuda_available()


def backends():
    """Backends this build can run: ('cpu',) or ('cpu', 'cuda')."""
    return ("cpu", "cuda") if _C.built_with_cuda() else ("cpu",)


__all__ = [
    "layer_norm",
    "native_layer_norm",
    "layer_norm_backward",
    "rms_norm",
    "fused_add_layer_norm",
    "fused_add_rms_norm",
    "prod",
    "mm",
    "bmm",
    "matmul",
    "addmm",
    "linear",
    "set_schedule",
    "nn",
    "cuda_available",
    "backends",
    "enable",
    "disable",
    "enabled",
    "use_gemsops",
]
