"""Every op on cuda:1, also while cuda:0 is the current device.

The C boundary switches to the tensors' device and launches on that
device's current stream, then restores the caller's device. Each test runs
an op on cuda:1 with a new stream `s` current there and (by default) cuda:0
current, and checks:

* results (and gradients) against a float64 CPU reference, and the same
  computation on cuda:0 against it too;
* outputs on cuda:1; the current device and both devices' current streams
  unchanged after every call;
* the launch went to `s`: the inputs are NaN until written on `s` behind a
  ~0.1 s GPU sleep, so a kernel launched on any other stream reads NaN and
  the comparison fails with "NaN in output". Results are read only after
  s.synchronize().
"""

import contextlib
import math

import pytest
import torch

import gemsops
from gemsops.testing import (
    PRODUCT_RTOL,
    assert_close,
    layer_norm_reference,
    product_tolerance,
)

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs"),
]

SLEEP_CYCLES = 200_000_000  # ~0.1 s of GPU clock: longer than any launch
CURRENT = [0, 1]  # the current device while the op runs on cuda:1


@pytest.fixture(autouse=True)
def _device0():
    torch.cuda.set_device(0)
    yield
    assert torch.cuda.current_device() == 0


class OnCuda1:
    """Copies of CPU tensors on cuda:1, NaN until scope() writes them on a
    new stream of cuda:1, behind a GPU sleep."""

    def __init__(self, *tensors, current=0):
        self.current = current
        self.src = [t.to("cuda:1") for t in tensors]
        self.inputs = [torch.full_like(t, float("nan")) for t in self.src]
        torch.cuda.synchronize(1)
        self.stream = torch.cuda.Stream(device=1)

    @contextlib.contextmanager
    def scope(self):
        with torch.cuda.device(1), torch.cuda.stream(self.stream):
            torch.cuda._sleep(SLEEP_CYCLES)
            with torch.no_grad():
                for dst, src in zip(self.inputs, self.src):
                    dst.copy_(src)
            with torch.cuda.device(self.current):
                yield self.inputs
        self.stream.synchronize()

    def check(self, *outputs):
        """After each gemsops call inside scope()."""
        assert torch.cuda.current_device() == self.current
        assert torch.cuda.current_stream(1) == self.stream
        assert torch.cuda.current_stream(0) == torch.cuda.default_stream(0)
        for t in outputs:
            assert t.device == torch.device("cuda", 1), t.device


def on(device, tensors, grad=()):
    """Copies on `device`; those whose index is in grad require grad."""
    return [
        t.to(device).requires_grad_(i in grad) for i, t in enumerate(tensors)
    ]


def double_leaves(tensors, grad=()):
    return [
        t.double().requires_grad_(i in grad) for i, t in enumerate(tensors)
    ]


# --------------------------------------------------------------- LayerNorm


@pytest.mark.parametrize("current", CURRENT)
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16]
)
@pytest.mark.parametrize("shape", [(300, 768), (4, 7, 1000)])
def test_layer_norm_forward_backward(shape, dtype, current):
    n = shape[-1]
    cpu = [
        torch.randn(shape).mul(2).add(0.5).to(dtype),
        torch.randn(n).to(dtype),
        torch.randn(n).to(dtype),
        torch.randn(shape).to(dtype),
    ]  # x, weight, bias, grad of out
    ref = double_leaves(cpu, grad=(0, 1, 2))
    ref_out = layer_norm_reference(ref[0], (n,), ref[1], ref[2])[0]
    ref_out.backward(ref[3])
    ref_out = ref_out.detach()
    rows = math.prod(shape[:-1])

    def compare(out, x, w, b):
        assert_close(out.detach(), ref_out, dtype, name="out")
        for name, t, r in (
            ("dx", x, ref[0]),
            ("dw", w, ref[1]),
            ("db", b, ref[2]),
        ):
            assert_close(
                t.grad,
                r.grad,
                dtype,
                name=name,
                reduce_len=1 if name == "dx" else rows,
            )

    x0, w0, b0, g0 = on("cuda:0", cpu, grad=(0, 1, 2))
    out0 = gemsops.layer_norm(x0, (n,), w0, b0)
    out0.backward(g0)
    compare(out0, x0, w0, b0)

    run = OnCuda1(*cpu, current=current)
    x1, w1, b1, g1 = run.inputs
    for t in (x1, w1, b1):
        t.requires_grad_()
    with run.scope():
        out1 = gemsops.layer_norm(x1, (n,), w1, b1)
        run.check(out1)
        out1.backward(g1)
        run.check(x1.grad, w1.grad, b1.grad)
    compare(out1, x1, w1, b1)


@pytest.mark.parametrize("current", CURRENT)
def test_native_layer_norm_and_module(current):
    shape, n = (64, 3, 520), 520
    cpu = [torch.randn(shape), torch.randn(n), torch.randn(n)]
    ref_out, ref_mean, ref_rstd = layer_norm_reference(cpu[0], (n,), *cpu[1:])
    stat_shape = shape[:-1] + (1,)
    for device in ("cuda:0", "cuda:1"):
        run = OnCuda1(*cpu, current=current) if device == "cuda:1" else None
        ctx = run.scope() if run else contextlib.nullcontext(on(device, cpu))
        with ctx as (x, w, b):
            out, mean, rstd = gemsops.native_layer_norm(x, (n,), w, b)
            if run:
                run.check(out, mean, rstd)
            module = gemsops.nn.LayerNorm(n, device=x.device)
            with torch.no_grad():
                module.weight.copy_(w)
                module.bias.copy_(b)
            mod_out = module(x)
            if run:
                run.check(mod_out)
        assert_close(out, ref_out, torch.float32, name=f"{device} out")
        assert_close(
            mod_out.detach(),
            ref_out,
            torch.float32,
            name=f"{device} module out",
        )
        assert_close(
            mean, ref_mean.view(stat_shape), torch.float32, name="mean"
        )
        assert_close(
            rstd, ref_rstd.view(stat_shape), torch.float32, name="rstd"
        )


# --------------------------------------------------------------------- prod


@pytest.mark.parametrize("current", CURRENT)
@pytest.mark.parametrize("dim", [None, 0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(33, 257), (1024, 1024)])
def test_prod_forward_backward(shape, dtype, dim, current):
    # magnitudes near one (random signs) keep a million-element product finite
    spread = 1e-3 if math.prod(shape) > 100_000 else 0.1
    x = torch.empty(shape, dtype=torch.float64).uniform_(
        1 - spread, 1 + spread
    )
    x = (x * (torch.randint(0, 2, shape) * 2 - 1)).to(dtype)
    out_shape = () if dim is None else shape[:dim] + shape[dim + 1 :]
    g = torch.randn(out_shape).to(dtype)
    xd = x.double().requires_grad_()
    ref = xd.prod() if dim is None else xd.prod(dim)
    ref.backward(g.double())
    chain = math.prod(shape) if dim is None else shape[dim]

    def call(t):
        return gemsops.prod(t) if dim is None else gemsops.prod(t, dim)

    def compare(out, t):
        assert_close(out.detach(), ref.detach(), dtype, chain_len=chain)
        assert_close(t.grad, xd.grad, dtype, chain_len=chain, name="grad")

    x0, g0 = on("cuda:0", [x, g], grad=(0,))
    out0 = call(x0)
    out0.backward(g0)
    compare(out0, x0)

    run = OnCuda1(x, g, current=current)
    x1, g1 = run.inputs
    x1.requires_grad_()
    with run.scope():
        out1 = call(x1)
        run.check(out1)
        out1.backward(g1)
        run.check(x1.grad)
    compare(out1, x1)


# ------------------------------------------------------------------- matmul


def assert_product_close(
    out, f, operands, k, dtype, name, rounded_partials=False
):
    """out ~ f(operands) in float64: one rounding of the output plus the
    fp32 accumulation error, 4 sqrt(k) ulps of fp32 times f(|operands|)
    (plus one rounding to dtype of that bound where partial products were
    rounded to dtype before being summed)."""
    ref = f(*[t.double().cpu() for t in operands])
    bound = f(*[t.double().cpu().abs() for t in operands])
    tol = product_tolerance(ref, bound, k, dtype)
    if rounded_partials:
        tol = tol + PRODUCT_RTOL[dtype] * bound
    got = out.detach().double().cpu()
    assert got.shape == ref.shape, f"{name}: {got.shape} != {ref.shape}"
    assert not got.isnan().any(), f"{name}: NaN (unwritten or read too early)"
    bad = (got - ref).abs() > tol
    assert not bad.any(), (
        f"{name}: {int(bad.sum())} of {got.numel()} out of "
        f"tolerance; worst {(got - ref).abs().max():.3g}"
    )


# (op, shape of a, shape of b): mm, bmm, and matmul's broadcast path (a 3-D
# input times a 2-D weight, as nn.Linear)
MM_CASES = [
    ("mm", (300, 520), (520, 200)),
    ("bmm", (3, 130, 257), (3, 257, 90)),
    ("matmul", (4, 70, 96), (96, 50)),
]


@pytest.mark.parametrize("current", CURRENT)
@pytest.mark.parametrize("schedule", ["auto", "stream-k"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("op,sa,sb", MM_CASES)
def test_matmul_forward_backward(op, sa, sb, dtype, schedule, current):
    fn = getattr(gemsops, op)
    a, b = torch.randn(sa).to(dtype), torch.randn(sb).to(dtype)
    m, k, n = sa[-2], sa[-1], sb[-1]
    g = torch.randn(sa[:-2] + (m, n)).to(dtype)
    broadcast = len(sb) < len(sa)  # b's gradient sums over a's batch too

    def compare(out, ta, tb):
        assert_product_close(out, torch.matmul, (a, b), k, dtype, "out")
        assert_product_close(
            ta.grad, lambda gg, bb: gg @ bb.mT, (g, b), n, dtype, "grad a"
        )
        if broadcast:  # per-batch products rounded to dtype, then summed
            assert_product_close(
                tb.grad,
                lambda aa, gg: (aa.mT @ gg).sum(0),
                (a, g),
                m * sa[0],
                dtype,
                "grad b",
                rounded_partials=True,
            )
        else:
            assert_product_close(
                tb.grad, lambda aa, gg: aa.mT @ gg, (a, g), m, dtype, "grad b"
            )

    old = gemsops.ops.matmul.get_schedule()
    gemsops.set_schedule(schedule, ctas=7 if schedule == "stream-k" else 0)
    try:
        a0, b0, g0 = on("cuda:0", [a, b, g], grad=(0, 1))
        out0 = fn(a0, b0)
        out0.backward(g0)
        compare(out0, a0, b0)

        run = OnCuda1(a, b, g, current=current)
        a1, b1, g1 = run.inputs
        a1.requires_grad_()
        b1.requires_grad_()
        with run.scope():
            out1 = fn(a1, b1)
            run.check(out1)
            out1.backward(g1)
            run.check(a1.grad, b1.grad)
        compare(out1, a1, b1)
    finally:
        gemsops.set_schedule(
            old["schedule"],
            two_tiles=old["two_tiles"],
            ctas=old["ctas"],
            spin_limit=old["spin_limit"],
            mainloop=old["mainloop"],
        )


# ------------------------------------------------- both devices, in turns


def test_devices_in_turn_keep_their_workspaces_apart():
    """LayerNorm backward and Stream-K matmul keep buffers per (device,
    stream): alternating devices must neither share nor corrupt them."""
    n = 768
    cpu = [
        torch.randn(256, n),
        torch.randn(n),
        torch.randn(n),
        torch.randn(256, n),
    ]
    ref = double_leaves(cpu, grad=(0, 1, 2))
    layer_norm_reference(ref[0], (n,), ref[1], ref[2])[0].backward(ref[3])
    a, b = torch.randn(200, 2000), torch.randn(2000, 60)
    old = gemsops.ops.matmul.get_schedule()
    gemsops.set_schedule("stream-k", ctas=5)
    try:
        for device in ("cuda:1", "cuda:0", "cuda:1", "cuda:0", "cuda:1"):
            x, w, bias, g = on(device, cpu, grad=(0, 1, 2))
            gemsops.layer_norm(x, (n,), w, bias).backward(g)
            c = gemsops.mm(a.to(device), b.to(device))
            assert torch.cuda.current_device() == 0
            for name, t, r in (
                ("dx", x, ref[0]),
                ("dw", w, ref[1]),
                ("db", bias, ref[2]),
            ):
                assert_close(
                    t.grad,
                    r.grad,
                    torch.float32,
                    name=f"{device} {name}",
                    reduce_len=256,
                )
            assert_product_close(
                c, torch.matmul, (a, b), 2000, torch.float32, f"{device} mm"
            )
    finally:
        gemsops.set_schedule(
            old["schedule"],
            two_tiles=old["two_tiles"],
            ctas=old["ctas"],
            spin_limit=old["spin_limit"],
            mainloop=old["mainloop"],
        )


def test_mixed_devices_are_refused_and_device_restored():
    for dx, dw in (("cuda:1", "cuda:0"), ("cuda:0", "cuda:1")):
        x = torch.randn(8, 16, device=dx)
        with pytest.raises(RuntimeError, match="same device"):
            gemsops.layer_norm(x, (16,), torch.randn(16, device=dw), None)
        assert torch.cuda.current_device() == 0
        with pytest.raises(RuntimeError, match="same device"):
            gemsops.mm(x, torch.randn(16, 4, device=dw))
        assert torch.cuda.current_device() == 0
