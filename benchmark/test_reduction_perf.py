"""prod forward and backward: gemsops vs torch.prod (and FlagGems when it
imports), FlagGems' test_reduction_perf.py style.

A case is (*sizes, which): `which` is "all" (the full product) or "dN"
(along dim N). Bytes counted: the forward reads the input once (GB/s =
input bytes / time); the backward must read the input and write its
gradient (2 x input bytes); the kept-dims outputs and gradients are left
out (docs/performance.md, Method)."""

import math
import os

import pytest
import torch

import gemsops

from .performance_utils import Benchmark, optional_peer

FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32]
CASES = [
    (1 << 28, "all"),
    (1 << 20, "all"),
    (1024, 1024, 1024, "all"),
    (4096, 4096, "d1"),
    (1024, 65536, "d1"),
    (65536, 1024, "d1"),
    (64, 4096, 64, "d1"),
    (1024, 1024, 1024, "d1"),
    (4096, 4096, "d0"),
]
if os.environ.get("GEMSOPS_BENCH_QUICK"):
    CASES = [
        (1 << 28, "all"),
        (4096, 4096, "d1"),
        (4096, 4096, "d0"),
        (64, 4096, 64, "d1"),
    ]


def peers():
    found = {}

    def flaggems():
        import flag_gems

        return (torch_prod, flag_gems.use_gems)

    optional_peer(found, "flaggems", flaggems)
    return found


def torch_prod(x, dim):
    return torch.prod(x) if dim is None else torch.prod(x, dim)


def gems_prod(x, dim):
    return gemsops.prod(x) if dim is None else gemsops.prod(x, dim)


def prod_args(dtype, case, requires_grad=False):
    *sizes, which = case
    dim = None if which == "all" else int(which[1:])
    # magnitudes near 1 with a per-line scale so that products stay finite
    x = torch.empty(sizes, dtype=torch.float32, device="cuda")
    x.uniform_(0.999, 1.001)
    x = x.to(dtype).requires_grad_(requires_grad)
    return x, dim


def prod_bytes(passes):
    return lambda dtype, case: passes * math.prod(case[:-1]) * dtype.itemsize


@pytest.mark.prod
def test_perf_prod_forward():
    Benchmark(
        "prod",
        torch_prod,
        gems_prod,
        prod_args,
        FLOAT_DTYPES,
        CASES,
        bytes_func=prod_bytes(1),
        peers=peers(),
        result_file="prod_fwd",
    ).run()


@pytest.mark.prod
def test_perf_prod_backward():
    Benchmark(
        "prod_backward",
        torch_prod,
        gems_prod,
        lambda d, c: prod_args(d, c, requires_grad=True),
        FLOAT_DTYPES,
        CASES,
        bytes_func=prod_bytes(2),
        is_backward=True,
        peers=peers(),
        result_file="prod_bwd",
    ).run()
