"""Autocast: gemsops follows torch's own lists. Under CPU autocast (bf16)
the matmul family runs in bf16, the norms keep their input's dtype, prod
runs in float32; on CUDA layer_norm runs in float32 too, and rms_norm as
the installed torch's rule has it (float32 in torch 2.13, its input's dtype
in 2.11)."""

import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import gemsops


def _pairs(device, modules=True):
    """(name, gemsops' call, torch's call) under one autocast region;
    modules=False leaves out the nn modules (their parameters)."""
    x = torch.randn(4, 8, device=device)
    w, b = torch.randn(8, device=device), torch.randn(8, device=device)
    m = torch.randn(8, 3, device=device)
    c = torch.randn(3, device=device)
    r = torch.randn(4, 8, device=device)
    lw = torch.randn(3, 8, device=device)
    # made, not views: a view of a fake tensor on a device torch was built
    # without raises (test_cuda_autocast_dtypes_on_fake_tensors)
    x3, m3 = (
        torch.randn(1, 4, 8, device=device),
        torch.randn(1, 8, 3, device=device),
    )
    v = torch.randn(8, device=device)
    yield "mm", lambda: gemsops.mm(x, m), lambda: torch.mm(x, m)
    yield (
        "addmm",
        lambda: gemsops.addmm(c, x, m, beta=0.5),
        lambda: torch.addmm(c, x, m, beta=0.5),
    )
    yield (
        "mm mixed",
        lambda: gemsops.mm(x, m.bfloat16()),
        lambda: torch.mm(x, m.bfloat16()),
    )
    yield (
        "bmm",
        lambda: gemsops.bmm(x3, m3),
        lambda: torch.bmm(x3, m3),
    )
    yield "matmul", lambda: gemsops.matmul(x, m), lambda: torch.matmul(x, m)
    yield (
        "matmul 3d x 1d",
        lambda: gemsops.matmul(x3, v),
        lambda: torch.matmul(x3, v),
    )
    yield (
        "layer_norm",
        lambda: gemsops.layer_norm(x, (8,), w, b),
        lambda: F.layer_norm(x, (8,), w, b),
    )
    yield (
        "layer_norm bf16 in",
        lambda: gemsops.layer_norm(x.bfloat16(), (8,), w, b),
        lambda: F.layer_norm(x.bfloat16(), (8,), w, b),
    )
    yield (
        "linear",
        lambda: gemsops.linear(x, lw, c),
        lambda: F.linear(x, lw, c),
    )
    yield (
        "rms_norm",
        lambda: gemsops.rms_norm(x, (8,), w),
        lambda: F.rms_norm(x, (8,), w),
    )
    yield (
        "rms_norm bf16 in",
        lambda: gemsops.rms_norm(x.bfloat16(), (8,)),
        lambda: F.rms_norm(x.bfloat16(), (8,)),
    )
    for i, part in enumerate(("y", "h")):
        yield (
            f"fused_add_layer_norm {part}",
            lambda i=i: gemsops.fused_add_layer_norm(x, r, (8,), w, b)[i],
            lambda i=i: (F.layer_norm(x + r, (8,), w, b), x + r)[i],
        )
        yield (
            f"fused_add_rms_norm {part}",
            lambda i=i: gemsops.fused_add_rms_norm(x, r, (8,), w)[i],
            lambda i=i: (F.rms_norm(x + r, (8,), w), x + r)[i],
        )
    yield "prod", lambda: gemsops.prod(x), lambda: torch.prod(x)
    yield (
        "prod bf16",
        lambda: gemsops.prod(x.bfloat16(), 1),
        lambda: torch.prod(x.bfloat16(), 1),
    )
    yield (
        "prod int",
        lambda: gemsops.prod(x.long(), 1),
        lambda: torch.prod(x.long(), 1),
    )
    if modules:
        yield from _module_pairs(device, x)


def _module_pairs(device, x):
    for name, make in (
        ("LayerNorm", lambda nn: nn.LayerNorm(8)),
        ("RMSNorm", lambda nn: nn.RMSNorm(8)),
        ("Linear", lambda nn: nn.Linear(8, 3)),
    ):
        theirs = make(torch.nn).to(device)
        mine = make(gemsops.nn).to(device)
        mine.load_state_dict(theirs.state_dict())
        yield f"nn.{name}", lambda mine=mine: mine(x), lambda t=theirs: t(x)


def _check(device, dtype):
    torch.manual_seed(0)
    for name, mine, theirs in _pairs(device):
        with torch.autocast(device, dtype=dtype):
            got, want = mine(), theirs()
        assert got.dtype == want.dtype, name
        assert got.shape == want.shape, name
        # atol no larger than the values: a product of 32 draws is ~1e-9
        scale = min(1.0, float(want.abs().max()))
        torch.testing.assert_close(
            got.float(), want.float(), rtol=2e-2, atol=2e-2 * scale, msg=name
        )


def test_cpu_autocast_bf16_dtypes_as_torch():
    _check("cpu", torch.bfloat16)


def test_cpu_autocast_backward():
    a = torch.randn(4, 8, requires_grad=True)
    m = torch.randn(8, 3, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = gemsops.matmul(gemsops.layer_norm(a, (8,)), m)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert a.grad.dtype == torch.float32 and m.grad.dtype == torch.float32
    # the same region in torch's ops: the gradients agree to bf16 rounding
    a2, m2 = (t.detach().clone().requires_grad_() for t in (a, m))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y2 = torch.matmul(F.layer_norm(a2, (8,)), m2)
    y2.float().sum().backward()
    torch.testing.assert_close(y.float(), y2.float(), rtol=2e-2, atol=2e-2)
    for g, w in ((a.grad, a2.grad), (m.grad, m2.grad)):
        assert g.abs().max() > 0
        torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
)
def test_addmm_float64_input_refused_as_torch(device):
    # autocast leaves float64 alone: the input no longer matches the mats
    c = torch.randn(4, 3, dtype=torch.float64, device=device)
    x, m = torch.randn(4, 8, device=device), torch.randn(8, 3, device=device)
    with torch.autocast(device, dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match="dtype"):
            torch.addmm(c, x, m)
        with pytest.raises(RuntimeError, match="float64"):
            gemsops.addmm(c, x, m)


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
)
def test_out_variants_compute_in_their_inputs_dtype(device):
    # out= is on no autocast list: fp32 in, an fp32 out, a bf16 out refused
    torch.manual_seed(7)
    a, b = torch.randn(3, 4, device=device), torch.randn(4, 5, device=device)
    c = torch.randn(5, device=device)
    calls = {
        "mm": (
            lambda o: torch.mm(a, b, out=o),
            lambda o: gemsops.mm(a, b, out=o),
        ),
        "matmul": (
            lambda o: torch.matmul(a, b, out=o),
            lambda o: gemsops.matmul(a, b, out=o),
        ),
        "addmm": (
            lambda o: torch.addmm(c, a, b, out=o),
            lambda o: gemsops.addmm(c, a, b, out=o),
        ),
    }
    for name, (theirs, mine) in calls.items():
        with torch.autocast(device, dtype=torch.bfloat16):
            want = theirs(torch.empty(3, 5, device=device))
            got = mine(torch.empty(3, 5, device=device))
            assert got.dtype == want.dtype == torch.float32, name
            torch.testing.assert_close(got, want, msg=name)
            half = torch.empty(3, 5, device=device, dtype=torch.bfloat16)
            with pytest.raises(RuntimeError):
                theirs(half)
            with pytest.raises(RuntimeError, match="dtype"):
                mine(half)


def test_autocast_off_inside_region():
    x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.autocast("cpu", enabled=False):
            assert gemsops.mm(x, x.t()).dtype == torch.float32


def test_autocast_compiled():
    x, m = torch.randn(4, 8), torch.randn(8, 3)

    def f(x, m):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return gemsops.mm(x, m), gemsops.prod(x.bfloat16(), 1)

    torch._dynamo.reset()
    got = torch.compile(f, backend="aot_eager", fullgraph=True)(x, m)
    assert [t.dtype for t in got] == [torch.bfloat16, torch.float32]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_autocast_dtypes_as_torch(dtype):
    _check("cuda", dtype)


# CUDA autocast's dispatch on fake CUDA tensors (shapes and dtypes, no
# values), which needs no GPU: torch.autocast("cuda") turns itself off
# without one, so the region's state is set directly. In a process of its
# own: a fake parameter on a device torch was built without aborts it
# (hence no modules).
_FAKE_CUDA_AUTOCAST = """
import importlib.util, json, sys
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
spec = importlib.util.spec_from_file_location("cases", sys.argv[1])
cases = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cases)
rows = []
with FakeTensorMode(allow_non_fake_inputs=True):
    torch.set_autocast_dtype("cuda", getattr(torch, sys.argv[2]))
    torch.set_autocast_enabled("cuda", True)
    torch.autocast_increment_nesting()
    for name, mine, theirs in cases._pairs("cuda", modules=False):
        got, want = mine(), theirs()
        rows.append([name, str(got.dtype), str(want.dtype),
                     list(got.shape), list(want.shape)])
print(json.dumps(rows))
"""


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cuda_autocast_dtypes_on_fake_tensors(dtype):
    run = subprocess.run(
        [sys.executable, "-c", _FAKE_CUDA_AUTOCAST, __file__, dtype],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads(run.stdout.splitlines()[-1])
    assert len(rows) == len(list(_pairs("cpu", modules=False)))
    # the region did cast: torch's mm gave the autocast dtype
    assert dict((r[0], r[2]) for r in rows)["mm"] == f"torch.{dtype}"
    for name, got, want, got_shape, want_shape in rows:
        assert (got, got_shape) == (want, want_shape), name


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
)
@pytest.mark.parametrize(
    "dtype", [torch.float16, torch.bfloat16, torch.float64]
)
def test_prod_dtype_argument_wins_over_autocast(device, dtype):
    # torch's policy for prod: fp32 under autocast unless dtype= is given
    x = torch.rand(4, 6, device=device) + 0.5
    with torch.autocast(device, dtype=torch.bfloat16):
        got = (gemsops.prod(x, 1, dtype=dtype), gemsops.prod(x, dtype=dtype))
        want = (torch.prod(x, 1, dtype=dtype), torch.prod(x, dtype=dtype))
    xd = x.to(dtype).double()  # dtype= casts the input first
    exact = torch.prod(xd, 1), torch.prod(xd)
    for g, w, r in zip(got, want, exact, strict=True):
        assert g.dtype == w.dtype == dtype
        # computed in `dtype` (fp32 accumulation for halves), not in bf16
        # and then cast: from the exact product of the cast input, four
        # unit roundoffs of `dtype` and one of the accumulation a factor
        acc = torch.float64 if dtype == torch.float64 else torch.float32
        n = x.numel()
        rtol = (4 * torch.finfo(dtype).eps + n * torch.finfo(acc).eps) / 2
        torch.testing.assert_close(g.double(), r, rtol=rtol, atol=0)
        torch.testing.assert_close(g, w, rtol=2 * rtol, atol=0)
