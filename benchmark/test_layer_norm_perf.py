"""LayerNorm forward and backward: gemsops vs torch (and FlagGems / Liger
when they import), FlagGems' test_reduction_perf.py style.

Bytes counted (the fewest the op must move): forward reads x and writes y;
backward reads x and dy and writes dx (3 * M * N elements); weights and
statistics are O(N + M) and left out (docs/performance.md, Method)."""

import os

import pytest
import torch

import gemsops

from .performance_utils import Benchmark, optional_peer, row_bytes

FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32]
SHAPES = [
    (4096, 768),
    (4096, 1024),
    (4096, 4096),
    (16384, 4096),
    (8192, 8192),
    (4096, 12288),
    (2048, 16384),
    (1024, 65536),
    (256, 262144),
    (200000, 64),
    (1024, 1000),
]
SWEEP = bool(os.environ.get("GEMSOPS_BENCH_SWEEP"))
SUFFIX = "_sweep" if SWEEP else ""  # the sweep's results: their own file
if SWEEP:  # transformer widths, many rows
    SHAPES = [
        (m, n)
        for m in (4096, 16384, 65536)
        for n in (512, 768, 1024, 1536, 2048, 2560, 3072, 4096, 5120, 8192)
    ]
elif os.environ.get("GEMSOPS_BENCH_QUICK"):
    SHAPES = [
        (16384, 4096),
        (8192, 8192),
        (256, 262144),
        (200000, 64),
        (1024, 1000),
    ]


def compiled(fn):
    """torch.compile of the plain torch expression: the strongest peer on
    norms (Inductor fuses and tunes the reduction per shape)."""
    if os.environ.get("GEMSOPS_BENCH_NO_PEERS"):
        return {}
    # one static graph per shape (as a model of fixed shapes gets), and
    # room for every shape of the run: past the recompile limit dynamo
    # would run the rest eager
    torch._dynamo.config.cache_size_limit = 1024
    torch._dynamo.config.accumulated_cache_size_limit = 4096
    try:
        return {"compiled": torch.compile(fn, dynamic=False)}
    except Exception as e:
        print(f"torch.compile not timed: {type(e).__name__}: {e}")
        return {}


def peers():
    found = compiled(torch.nn.functional.layer_norm)

    def flaggems():
        import flag_gems

        return (torch.nn.functional.layer_norm, flag_gems.use_gems)

    def liger():
        from liger_kernel.transformers.functional import liger_layer_norm

        return lambda x, s, w, b: liger_layer_norm(x, w, b, 1e-5)

    optional_peer(found, "flaggems", flaggems)
    optional_peer(found, "liger", liger)
    return found


def layer_norm_args(dtype, shape, requires_grad=False):
    m, n = shape
    x = torch.randn(
        m, n, dtype=dtype, device="cuda", requires_grad=requires_grad
    )
    w = torch.randn(n, dtype=dtype, device="cuda", requires_grad=requires_grad)
    b = torch.randn(n, dtype=dtype, device="cuda", requires_grad=requires_grad)
    return x, (n,), w, b


@pytest.mark.layer_norm
def test_perf_layer_norm_forward():
    Benchmark(
        "layer_norm",
        torch.nn.functional.layer_norm,
        gemsops.layer_norm,
        layer_norm_args,
        FLOAT_DTYPES,
        SHAPES,
        bytes_func=row_bytes(2),
        peers=peers(),
        result_file="layer_norm_fwd" + SUFFIX,
    ).run()


@pytest.mark.layer_norm
def test_perf_layer_norm_backward():
    Benchmark(
        "layer_norm_backward",
        torch.nn.functional.layer_norm,
        gemsops.layer_norm,
        lambda d, s: layer_norm_args(d, s, requires_grad=True),
        FLOAT_DTYPES,
        SHAPES,
        bytes_func=row_bytes(3),
        is_backward=True,
        peers=peers(),
        result_file="layer_norm_bwd" + SUFFIX,
    ).run()
