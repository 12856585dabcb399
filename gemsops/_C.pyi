"""Typed stubs of the gemsops._C extension. Tensors are any DLPack
producers (torch tensors, NumPy arrays, ...); outputs are written in place."""

from typing import Any, Dict, Optional, Protocol, Tuple

Tensor = Any  # anything with __dlpack__

def cuda_available() -> bool: ...
def built_with_cuda() -> bool: ...
def tensor_info(
    t: Tensor,
) -> Tuple[str, int, int, Tuple[int, ...], Tuple[int, ...], int]: ...
def fallback_counts() -> Dict[str, int]: ...
def layer_norm_fwd(
    input: Tensor,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    normalized_ndim: int,
    eps: float,
    out: Tensor,
    mean: Optional[Tensor],
    rstd: Optional[Tensor],
) -> None: ...
def layer_norm_bwd(
    grad_out: Tensor,
    input: Tensor,
    weight: Optional[Tensor],
    normalized_ndim: int,
    deterministic: bool,
    mean: Tensor,
    rstd: Tensor,
    grad_input: Optional[Tensor],
    grad_weight: Optional[Tensor],
    grad_bias: Optional[Tensor],
    workspace: Optional[Tensor],
    workspace_stream: Optional[int] = None,
) -> Optional[Tuple[int, int]]: ...
def layer_norm_bwd_workspace(
    input: Tensor,
    weight: Optional[Tensor],
    normalized_ndim: int,
    deterministic: bool,
    want_grad_input: bool,
    want_grad_weight: bool,
    want_grad_bias: bool,
) -> int: ...
def rms_norm_fwd(
    input: Tensor,
    weight: Optional[Tensor],
    normalized_ndim: int,
    eps: float,
    out: Tensor,
    rstd: Optional[Tensor],
) -> None: ...
def rms_norm_bwd(
    grad_out: Tensor,
    input: Tensor,
    weight: Optional[Tensor],
    normalized_ndim: int,
    deterministic: bool,
    rstd: Tensor,
    grad_input: Optional[Tensor],
    grad_weight: Optional[Tensor],
    workspace: Optional[Tensor],
    workspace_stream: Optional[int] = None,
) -> Optional[Tuple[int, int]]: ...
def rms_norm_bwd_workspace(
    input: Tensor,
    weight: Optional[Tensor],
    normalized_ndim: int,
    deterministic: bool,
    want_grad_input: bool,
    want_grad_weight: bool,
) -> int: ...
def add_norm_fwd(
    input: Tensor,
    residual: Tensor,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    normalized_ndim: int,
    eps: float,
    rms: bool,
    out: Tensor,
    h: Tensor,
    mean: Optional[Tensor],
    rstd: Optional[Tensor],
) -> None: ...
def add_norm_bwd(
    grad_out: Tensor,
    grad_h: Optional[Tensor],
    h: Tensor,
    weight: Optional[Tensor],
    normalized_ndim: int,
    deterministic: bool,
    rms: bool,
    mean: Optional[Tensor],
    rstd: Tensor,
    grad_input: Optional[Tensor],
    grad_weight: Optional[Tensor],
    grad_bias: Optional[Tensor],
    workspace: Optional[Tensor],
    workspace_stream: Optional[int] = None,
) -> Optional[Tuple[int, int]]: ...
def prod(
    input: Tensor, dim: Optional[int], out: Tensor, workspace: Optional[Tensor]
) -> None: ...
def prod_bwd(
    input: Tensor,
    dim: Optional[int],
    grad_out: Tensor,
    grad_in: Tensor,
    workspace: Optional[Tensor],
) -> None: ...
def prod_workspace(input: Tensor, dim: Optional[int]) -> int: ...
def prod_bwd_workspace(input: Tensor, dim: Optional[int]) -> int: ...

class _Product(Protocol):
    """matmul(a, b, out, ...) and nn.Linear's three products over the
    layer's tensors as held: linear(input, weight, out, ...),
    linear_grad_input(grad, weight, out, ...), linear_grad_weight(grad,
    input, out, ...). The epilogue: (bias, alpha, beta[, row_sums])."""

    def __call__(
        self,
        a: Tensor,
        b: Tensor,
        out: Tensor,
        schedule: int,
        two_tiles: bool,
        ctas: int,
        mainloop: int,
        workspace: Optional[Tensor],
        flags: Optional[Tensor],
        epoch: int,
        spin_limit: int,
        error: Optional[Tensor],
        *epilogue: Any,
    ) -> Optional[Tuple[int, int, int]]: ...

matmul: _Product
linear: _Product
linear_grad_input: _Product
linear_grad_weight: _Product

def matmul_plan(
    a: Tensor,
    b: Tensor,
    out: Tensor,
    schedule: int,
    two_tiles: bool,
    ctas: int,
    mainloop: int,
) -> Dict[str, Any]: ...
def streamk_check(
    m: int,
    n: int,
    k: int,
    batch: int,
    bm: int,
    bn: int,
    bk: int,
    group_m: int,
    ctas: int,
    schedule: int,
    two_tiles: bool,
) -> Dict[str, int]: ...
