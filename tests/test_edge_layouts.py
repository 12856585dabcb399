"""Layouts and values at the edges, on both backends, against float64
references: normalized size 1 under channels_last, stride-0 (expanded)
inputs and weights, sliced gradients, non-finite values."""

import pytest
import torch
import torch.nn.functional as F

import gemsops
from gemsops.testing import assert_close

DTYPES = [torch.float16, torch.bfloat16, torch.float32]


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_unit_rows_channels_last(device, dtype):
    # normalized size 1: mean = x, var = 0, so y = bias and dx = 0 exactly
    x = torch.randn(3, 5, 4, 1)
    w, b = torch.randn(1), torch.randn(1)
    dy = torch.randn(3, 5, 4, 1)
    xs = x.to(device, dtype).contiguous(memory_format=torch.channels_last)
    xs.requires_grad_(True)
    ws = w.to(device, dtype).requires_grad_(True)
    bs = b.to(device, dtype).requires_grad_(True)
    dys = dy.to(device, dtype).contiguous(memory_format=torch.channels_last)
    y = gemsops.layer_norm(xs, (1,), ws, bs)
    dx, dw, db = torch.autograd.grad(y, (xs, ws, bs), dys)
    ref = [t.to(dtype).double().requires_grad_(True) for t in (x, w, b)]
    ry = F.layer_norm(ref[0], (1,), ref[1], ref[2])
    rdx, rdw, rdb = torch.autograd.grad(ry, ref, dy.to(dtype).double())
    assert_close(y, ry, dtype)
    assert_close(dx, rdx, dtype)
    assert_close(dw, rdw, dtype, reduce_len=x.numel())
    assert_close(db, rdb, dtype, reduce_len=x.numel())


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_expanded_input_with_inf(device, dtype):
    row = torch.randn(1, 64)
    row[0, 5] = float("inf")
    x = row.to(device, dtype).expand(8, 64)  # stride 0 over rows
    ref = F.layer_norm(row.double().expand(8, 64), (64,))
    got = gemsops.layer_norm(x, (64,))
    assert torch.equal(got.isnan().cpu(), ref.isnan())
    finite = ~ref.isnan()
    assert_close(got.cpu()[finite], ref[finite].to(dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_backward_expanded_weight_sliced_dy(device, dtype):
    m, n = 37, 96
    x = torch.randn(m, n)
    w1 = torch.randn(1)
    b = torch.randn(n)
    big = torch.randn(m, 2 * n)
    dy = big[:, 1::2]  # sliced: row stride 2n, column stride 2
    xs = x.to(device, dtype).requires_grad_(True)
    ws = w1.to(device, dtype).expand(n).detach().requires_grad_(True)
    bs = b.to(device, dtype).requires_grad_(True)
    assert ws.stride() == (0,)
    dys = big.to(device, dtype)[:, 1::2]
    y = gemsops.layer_norm(xs, (n,), ws, bs)
    dx, dw, db = torch.autograd.grad(y, (xs, ws, bs), dys)
    ref = [
        t.to(dtype).double().requires_grad_(True)
        for t in (x, w1.expand(n).contiguous(), b)
    ]
    ry = F.layer_norm(ref[0], (n,), ref[1], ref[2])
    rdx, rdw, rdb = torch.autograd.grad(ry, ref, dy.to(dtype).double())
    assert_close(y, ry, dtype)
    assert_close(dx, rdx, dtype)
    assert_close(dw, rdw, dtype, reduce_len=m)
    assert_close(db, rdb, dtype, reduce_len=m)


@pytest.mark.parametrize("dtype", DTYPES)
def test_prod_expanded_input_with_inf(device, dtype):
    row = torch.rand(1, 33) + 0.5
    row[0, 7] = float("inf")
    row[0, 9] = -2.0
    for x in (row.expand(6, 33), row.t().expand(33, 6)):
        xs = x.to(device, dtype)
        for dim in (None, 0, 1):
            xd = x.to(dtype).double()  # the values the kernel reads
            ref = (xd.prod() if dim is None else xd.prod(dim)).to(dtype)
            got = gemsops.prod(xs) if dim is None else gemsops.prod(xs, dim)
            assert torch.equal(got.isinf().cpu(), ref.isinf())
            assert torch.equal(got.isnan().cpu(), ref.isnan())
            n = x.numel() if dim is None else x.shape[dim]  # factors
            assert_close(got.cpu(), ref, dtype, chain_len=n)


@pytest.mark.parametrize("dtype", DTYPES)
def test_prod_backward_non_finite(device, dtype):
    """torch's pattern: a line without zeros takes grad * prod / x (so an
    inf's own gradient is nan); with a zero anywhere, products of the
    others. Compared with torch's float64 CPU gradient, cast."""
    big = 1e4 if dtype == torch.float16 else 1e30
    x = torch.tensor(
        [
            [float("inf"), 2.0, 3.0, 0.5],
            [float("-inf"), 0.0, 3.0, 2.0],
            [big, big, 3.0, 0.25],
            [1.5, float("nan"), 2.0, 1.0],
        ]
    )
    for dim in (None, 0, 1):
        xs = x.to(device, dtype).requires_grad_(True)
        xr = x.to(dtype).double().requires_grad_(True)
        fn = (lambda t: t.prod()) if dim is None else (lambda t: t.prod(dim))
        gfn = (
            (lambda t: gemsops.prod(t))
            if dim is None
            else (lambda t: gemsops.prod(t, dim))
        )
        (got,) = torch.autograd.grad(gfn(xs).sum(), xs)
        (ref,) = torch.autograd.grad(fn(xr).sum(), xr)
        ref = ref.to(dtype)
        got = got.cpu()
        assert torch.equal(got.isnan(), ref.isnan()), (dim, got, ref)
        assert torch.equal(got.isinf(), ref.isinf()), (dim, got, ref)
        fin = torch.isfinite(ref)
        assert_close(got[fin], ref[fin], dtype, reduce_len=4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_expanded_operand_with_inf(device, dtype):
    a_row = torch.randn(1, 40)
    a_row[0, 3] = float("inf")
    a = a_row.expand(24, 40)
    b = torch.randn(40, 16)
    got = gemsops.mm(a.to(device, dtype), b.to(device, dtype)).cpu()
    ref = (a.to(dtype).double() @ b.to(dtype).double()).to(dtype)
    assert torch.equal(got.isnan(), ref.isnan())
    assert torch.equal(got.isinf(), ref.isinf())


def _misaligned(shape, dtype):
    """A CPU tensor of shape whose address is one byte past an element
    boundary (torch.frombuffer of a buffer at an odd offset), filled with
    fresh random values."""
    size = torch.empty((), dtype=dtype).element_size()
    n = max(1, torch.Size(shape).numel())
    # frombuffer holds a reference to the buffer
    raw = bytearray(size * n + 1)
    t = torch.frombuffer(memoryview(raw)[1:], dtype=dtype).view(shape)
    t.copy_(torch.randn(shape).to(dtype))
    assert t.data_ptr() % size != 0
    return t


@pytest.mark.parametrize("dtype", DTYPES)
def test_misaligned_operands_compute_as_torch(dtype):
    # torch computes tensors at an address off their element size; C
    # refuses them, and the ops compute from aligned copies
    a, b = _misaligned((5, 7), dtype), _misaligned((7, 6), dtype)
    bias = _misaligned((6,), dtype)
    ref = a.double() @ b.double()
    assert_close(gemsops.mm(a, b), ref, dtype, reduce_len=7)
    assert_close(
        gemsops.addmm(bias, a, b), ref + bias.double(), dtype, reduce_len=7
    )
    out = _misaligned((5, 6), dtype).fill_(float("nan"))
    gemsops.matmul(a, b, out=out)
    assert_close(out, ref, dtype, reduce_len=7)
    w = _misaligned((6, 7), dtype)
    got = gemsops.linear(a, w, bias)
    assert_close(
        got, a.double() @ w.double().T + bias.double(), dtype, reduce_len=7
    )
    assert_close(gemsops.prod(a, 1), a.double().prod(1), dtype, reduce_len=7)


@pytest.mark.parametrize("dtype", DTYPES)
def test_misaligned_norm_inputs_compute_as_torch(dtype):
    x, res = _misaligned((6, 16), dtype), _misaligned((6, 16), dtype)
    w, b = _misaligned((16,), dtype), _misaligned((16,), dtype)
    dy = _misaligned((6, 16), dtype)
    ref = [t.double().requires_grad_(True) for t in (x, w, b)]
    xs, ws, bs = (t.requires_grad_(True) for t in (x, w, b))
    y = gemsops.layer_norm(xs, (16,), ws, bs)
    grads = torch.autograd.grad(y, (xs, ws, bs), dy)
    ry = F.layer_norm(ref[0], (16,), ref[1], ref[2])
    rgrads = torch.autograd.grad(ry, ref, dy.double())
    assert_close(y, ry, dtype)
    for g, r in zip(grads, rgrads):
        assert_close(g, r, dtype, reduce_len=6)
    y = gemsops.rms_norm(xs, (16,), ws)
    assert_close(y, F.rms_norm(ref[0], (16,), ref[1]), dtype)
    y, h = gemsops.fused_add_layer_norm(xs.detach(), res, (16,), w, b)
    rh = x.double() + res.double()
    assert_close(h, rh, dtype)
    assert_close(y, F.layer_norm(rh, (16,), w.double(), b.double()), dtype)
    # the gradients of y and h as autograd passes them on: misaligned too
    dh = _misaligned((6, 16), dtype)
    for fused, norm in (
        (gemsops.fused_add_layer_norm, F.layer_norm),
        (gemsops.fused_add_rms_norm, F.rms_norm),
    ):
        y, h = fused(xs, res, (16,), ws)
        gx, gw = torch.autograd.grad((y, h), (xs, ws), (dy, dh))
        rh = ref[0] + res.double()
        ry = norm(rh, (16,), ref[1])
        rx, rw = torch.autograd.grad(
            (ry, rh), (ref[0], ref[1]), (dy.double(), dh.double())
        )
        assert_close(gx, rx, dtype, reduce_len=16)
        assert_close(gw, rw, dtype, reduce_len=6)
    g = torch.autograd.grad(gemsops.prod(xs, 1), xs, dy[:, 0])[0]
    rg = torch.autograd.grad(ref[0].prod(1), ref[0], dy[:, 0].double())[0]
    assert_close(g, rg, dtype, reduce_len=16)
