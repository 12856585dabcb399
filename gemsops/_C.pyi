"""Typed stubs of the gemsops._C extension. Tensors are any DLPack
producers (torch tensors, NumPy arrays, ...); outputs are written in place."""
from typing import Any, Optional, Tuple

Tensor = Any  # anything with __dlpack__

def cuda_available() -> bool: ...
def built_with_cuda() -> bool: ...
def tensor_info(t: Tensor) -> Tuple[str, int, int, Tuple[int, ...], Tuple[int, ...], int]: ...
def layer_norm_fwd(
    input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
    normalized_ndim: int, eps: float, out: Tensor, mean: Optional[Tensor],
    rstd: Optional[Tensor], workspace: Optional[Tensor]) -> None: ...
def layer_norm_fwd_workspace(
    input: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
    normalized_ndim: int) -> int: ...
def layer_norm_bwd(
    grad_out: Tensor, input: Tensor, weight: Optional[Tensor],
    normalized_ndim: int, deterministic: bool, mean: Tensor, rstd: Tensor,
    grad_input: Optional[Tensor], grad_weight: Optional[Tensor],
    grad_bias: Optional[Tensor], workspace: Optional[Tensor]) -> None: ...
def layer_norm_bwd_workspace(
    input: Tensor, weight: Optional[Tensor], normalized_ndim: int,
    deterministic: bool, want_grad_input: bool, want_grad_weight: bool,
    want_grad_bias: bool) -> int: ...
