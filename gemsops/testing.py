"""References and tolerances shared by the tests and the benchmarks.

Every check compares against a float64 reference computed by torch on the
upcast inputs. Two criteria:

* elementwise: |out - ref| <= atol + rtol * |ref| with the table below.
  rtol is FlagGems' (fp16 1e-3, bf16 1.6e-2, fp32 1.3e-6): one rounding of
  the output to the dtype, plus fp32 arithmetic on the way. atol covers
  values near zero, where rtol alone would demand more than one ulp of the
  output's magnitude (normalized outputs are O(1)); for sums over many rows
  (dW, dB) it is scaled by sqrt(rows), the growth of a random walk's
  rounding error.
* for fp16/bf16: the relative L2 error ||out - ref|| / ||ref|| must be no
  worse than torch's own (computed the same way), with 5% slack: two
  correct implementations that round in different places trade the last
  bit back and forth.
* products: each output is a chain of n multiplications in the
  accumulation type (fp32, or fp64 for fp64), whose rounding errors walk
  like sqrt(n) ulps; `chain_len=n` widens rtol by 4 sqrt(n) ulps of it.
"""

import math

import torch

TOLERANCES = {
    torch.float16: dict(rtol=1e-3, atol=1e-3),
    torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2),
    torch.float32: dict(rtol=1.3e-6, atol=1e-5),
    torch.float64: dict(rtol=1e-12, atol=1e-12),
}

HALF_TYPES = (torch.float16, torch.bfloat16)
TORCH_ERROR_SLACK = 1.05


def rel_error(out, ref):
    ref = ref.double()
    diff = out.double() - ref
    denom = ref.norm().item()
    return diff.norm().item() / (denom if denom > 0 else 1.0)


def assert_close(
    out, ref, dtype, *, reduce_len=1, chain_len=1, torch_out=None, name="out"
):
    """out: gemsops' result; ref: float64 reference; torch_out: torch's own
    result on the same inputs (optional, for the half-type criterion)."""
    assert out.shape == ref.shape, f"{name}: shape {out.shape} != {ref.shape}"
    assert not torch.isnan(out).any() or torch.isnan(ref).any(), (
        f"{name}: NaN in output (unwritten element?)"
    )
    tol = TOLERANCES[dtype]
    atol = tol["atol"] * math.sqrt(max(reduce_len, 1))
    acc_eps = torch.finfo(
        torch.float64 if dtype == torch.float64 else torch.float32
    ).eps
    rtol = tol["rtol"] + (
        4 * math.sqrt(chain_len) * acc_eps if chain_len > 1 else 0.0
    )
    o, r = out.double().cpu(), ref.double().cpu()
    bad = (o - r).abs() > atol + rtol * r.abs()
    bad &= ~(torch.isnan(o) & torch.isnan(r))
    if bad.any():
        i = bad.nonzero()[0].tolist()
        raise AssertionError(
            f"{name}: {int(bad.sum())} of {o.numel()} elements out of "
            f"tolerance (rtol={rtol:.3g}, atol={atol:.3g}); first at {i}: "
            f"got {o[tuple(i)].item()!r}, expected {r[tuple(i)].item()!r}"
        )
    if torch_out is not None and dtype in HALF_TYPES:
        ours, theirs = rel_error(o, r), rel_error(torch_out.cpu(), r)
        assert ours <= theirs * TORCH_ERROR_SLACK + 1e-12, (
            f"{name}: relative error {ours:.3e} is worse than torch's "
            f"{theirs:.3e}"
        )


# one rounding of a matmul's output to its dtype (fp32: and its epilogue)
PRODUCT_RTOL = {
    torch.float16: 1e-3,
    torch.bfloat16: 8e-3,
    torch.float32: 1.3e-6,
}


def product_tolerance(ref, bound, k, dtype):
    """Elementwise tolerance of sums of k products accumulated in fp32
    whose float64 value is ref: one rounding of the output to dtype, plus
    the accumulation's error, 4 sqrt(k) ulps of fp32 times bound (the same
    sums over the products' magnitudes, |A| |B| for a matmul)."""
    return (
        PRODUCT_RTOL[dtype] * ref.abs()
        + 4 * math.sqrt(max(k, 1)) * 2**-24 * bound
        + 1e-30
    )


def assert_mm_close(out, a, b, dtype, name="out"):
    """out ~ torch.matmul(a, b) within product_tolerance, of dtype and the
    product's shape."""
    ref = torch.matmul(a.double(), b.double())
    bound = torch.matmul(a.double().abs(), b.double().abs())
    tol = product_tolerance(ref, bound, a.shape[-1], dtype)
    assert out.shape == ref.shape, f"{name}: {out.shape} != {ref.shape}"
    assert out.dtype == dtype, f"{name}: {out.dtype} != {dtype}"
    err = (out.double() - ref).abs()
    bad = err > tol
    assert not bad.any(), (
        f"{name}: {int(bad.sum())} of {out.numel()} out "
        f"of tolerance; worst {err.max().item():.3g}"
    )


def layer_norm_reference(x, shape, weight=None, bias=None, eps=1e-5):
    """float64 LayerNorm and its statistics, the math spelled out."""
    dims = tuple(range(x.dim() - len(shape), x.dim()))
    xd = x.double()
    mean = xd.mean(dim=dims, keepdim=True)
    var = ((xd - mean) ** 2).mean(dim=dims, keepdim=True)
    rstd = 1.0 / torch.sqrt(var + eps)
    out = (xd - mean) * rstd
    if weight is not None:
        out = out * weight.double()
    if bias is not None:
        out = out + bias.double()
    return out, mean, rstd


def rms_norm_reference(x, shape, weight=None, eps=1e-6):
    """float64 RMSNorm, the math spelled out."""
    dims = tuple(range(x.dim() - len(shape), x.dim()))
    xd = x.double()
    out = xd * torch.rsqrt(xd.pow(2).mean(dims, keepdim=True) + eps)
    return out * weight.double() if weight is not None else out


def poison_(t):
    """Fill with NaN (floats) so an unwritten element fails the check."""
    if t is not None and t.is_floating_point():
        t.fill_(float("nan"))
    return t


def raised_type(fn):
    """The type of the exception fn() raises, None when it returns: what
    torch raises for a call, to hold gemsops' refusal of it to."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - any type is the answer
        return type(e)
    return None
