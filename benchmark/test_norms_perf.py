"""RMSNorm and the residual add fused into LayerNorm / RMSNorm: gemsops vs
torch's plain expression, torch.compile of that expression (the strongest
peer on norms) and, when they import, FlagGems and Liger.

Bytes counted (the fewest the op must move): RMSNorm forward reads x and
writes y, backward reads x and dy and writes dx; the fused add's forward
reads x and residual and writes y and h (4 * M * N elements), its
backward reads h and dy and writes dx (the gradient of x and residual
alike; h's own gradient not used), or, where h is used as well (as a
transformer block's next residual: the `_dh` benchmark), reads h, dy and
dh and writes dx. Weights and statistics are O(N + M) and left out."""

import pytest
import torch
import torch.nn.functional as F

import gemsops

from .performance_utils import Benchmark, optional_peer, row_bytes
from .test_layer_norm_perf import FLOAT_DTYPES, SHAPES, compiled

EPS = 1e-6


def rms_torch(x, s, w):
    return F.rms_norm(x, s, w, EPS)


def rms_gems(x, s, w):
    return gemsops.rms_norm(x, s, w, EPS)


def add_ln_torch(x, r, s, w, b):
    h = x + r
    return F.layer_norm(h, s, w, b, EPS), h


def add_ln_gems(x, r, s, w, b):
    return gemsops.fused_add_layer_norm(x, r, s, w, b, EPS)


def add_rms_torch(x, r, s, w):
    h = x + r
    return F.rms_norm(h, s, w, EPS), h


def add_rms_gems(x, r, s, w):
    return gemsops.fused_add_rms_norm(x, r, s, w, EPS)


def first(fn):
    """fn's y alone (the backward benchmark differentiates one output)."""
    return lambda *a: fn(*a)[0]


def rms_peers():
    found = compiled(rms_torch)

    def flaggems():
        import flag_gems

        return (rms_torch, flag_gems.use_gems)

    def liger():
        from liger_kernel.transformers.functional import liger_rms_norm

        return lambda x, s, w: liger_rms_norm(x, w, EPS)

    optional_peer(found, "flaggems", flaggems)
    optional_peer(found, "liger", liger)
    return found


def add_peers(kind, wrap=None):
    """Peers of the fused add (`wrap` applied to each, None: the forward):
    torch.compile of the plain expression, and for RMSNorm Liger's fused
    add (out of place: y and h written, as ours; its backward takes h's
    gradient too) and, forward only, FlagGems' (in place: y over x and h
    over the residual, the same bytes; it has no backward). FlagGems'
    skip_layer_norm writes y alone, not h: not the fused add + LayerNorm."""
    forward = wrap is None
    wrap = wrap or (lambda fn: fn)
    torch_fn = add_ln_torch if kind == "layer_norm" else add_rms_torch
    found = compiled(wrap(torch_fn))
    if kind != "rms_norm":
        return found

    def liger():
        from liger_kernel.transformers.functional import (
            liger_fused_add_rms_norm,
        )

        def fused(x, r, s, w):
            return liger_fused_add_rms_norm(x, r, w, EPS, in_place=False)

        return wrap(fused)

    def flaggems():
        import flag_gems

        return lambda x, r, s, w: flag_gems.fused_add_rms_norm(x, r, s, w, EPS)

    optional_peer(found, "liger", liger)
    if forward:
        optional_peer(found, "flaggems", flaggems)
    return found


def args(dtype, shape, residual=False, bias=False, requires_grad=False):
    m, n = shape
    kw = dict(dtype=dtype, device="cuda", requires_grad=requires_grad)
    x = torch.randn(m, n, **kw)
    out = [x]
    if residual:
        out.append(torch.randn(m, n, **kw))
    out += [(n,), torch.randn(n, **kw)]
    if bias:
        out.append(torch.randn(n, **kw))
    return tuple(out)


@pytest.mark.layer_norm
def test_perf_rms_norm_forward():
    Benchmark(
        "rms_norm",
        rms_torch,
        rms_gems,
        args,
        FLOAT_DTYPES,
        SHAPES,
        bytes_func=row_bytes(2),
        peers=rms_peers(),
        result_file="rms_norm_fwd",
    ).run()


@pytest.mark.layer_norm
def test_perf_rms_norm_backward():
    Benchmark(
        "rms_norm_backward",
        rms_torch,
        rms_gems,
        lambda d, s: args(d, s, requires_grad=True),
        FLOAT_DTYPES,
        SHAPES,
        bytes_func=row_bytes(3),
        is_backward=True,
        peers=rms_peers(),
        result_file="rms_norm_bwd",
    ).run()


@pytest.mark.layer_norm
@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm"])
def test_perf_fused_add_forward(kind):
    torch_fn, gems_fn = (
        (add_ln_torch, add_ln_gems)
        if kind == "layer_norm"
        else (add_rms_torch, add_rms_gems)
    )
    Benchmark(
        f"fused_add_{kind}",
        torch_fn,
        gems_fn,
        lambda d, s: args(d, s, True, kind == "layer_norm"),
        FLOAT_DTYPES,
        SHAPES,
        bytes_func=row_bytes(4),
        peers=add_peers(kind),
        result_file=f"fused_add_{kind}_fwd",
    ).run()


def fused_add_backward(kind, wrap, suffix, passes):
    """The fused add's backward through `wrap` (first: y's gradient alone;
    no wrap: y's and h's, each its own), beside torch and its compiled
    form."""
    torch_fn, gems_fn = (
        (add_ln_torch, add_ln_gems)
        if kind == "layer_norm"
        else (add_rms_torch, add_rms_gems)
    )
    Benchmark(
        f"fused_add_{kind}_backward{suffix}",
        wrap(torch_fn),
        wrap(gems_fn),
        lambda d, s: args(d, s, True, kind == "layer_norm", True),
        FLOAT_DTYPES,
        SHAPES,
        bytes_func=row_bytes(passes),
        is_backward=True,
        peers=add_peers(kind, wrap),
        result_file=f"fused_add_{kind}_bwd{suffix}",
    ).run()


@pytest.mark.layer_norm
@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm"])
def test_perf_fused_add_backward(kind):
    fused_add_backward(kind, first, "", 3)


@pytest.mark.layer_norm
@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm"])
def test_perf_fused_add_backward_dh(kind):
    fused_add_backward(kind, lambda fn: fn, "_dh", 4)
