"""prod forward and zero-safe backward against float64 references (CPU;
the CUDA kernels are not written yet, see the README)."""
import pytest
import torch

import gemsops
from gemsops.testing import assert_close

FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def near_one(shape, dtype, signed=True):
    """Magnitudes in [0.9, 1.1] so long products stay finite; random signs."""
    x = torch.empty(shape, dtype=torch.float64).uniform_(0.9, 1.1)
    if signed:
        x *= torch.randint(0, 2, shape, dtype=torch.float64) * 2 - 1
    return x.to(dtype)


def ref_prod(x, dim=None, keepdim=False):
    xd = x.double()
    return xd.prod() if dim is None else xd.prod(dim, keepdim=keepdim)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("dim", [0, 1, 2, 3, -1, -4])
@pytest.mark.parametrize("keepdim", [False, True])
def test_every_dim_of_4d(dtype, dim, keepdim):
    x = near_one((5, 6, 7, 8), dtype)
    out = gemsops.prod(x, dim, keepdim)
    assert out.dtype == dtype
    assert out.shape == torch.prod(x, dim, keepdim).shape
    assert_close(out, ref_prod(x, dim, keepdim), dtype,
                 torch_out=torch.prod(x, dim, keepdim))


@pytest.mark.parametrize("shape,dim", [((1, 2), 1), ((4096, 256), 1),
                                       ((4096, 256), 0), ((200, 2560, 3), 1),
                                       ((200, 40999, 3), 1), ((1, 2), None)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shapes(shape, dim, dtype):
    x = near_one(shape, dtype)
    out = gemsops.prod(x) if dim is None else gemsops.prod(x, dim)
    assert_close(out, ref_prod(x, dim), dtype)


def test_full_reduction_2_27_elements():
    x = near_one((1 << 27,), torch.float32, signed=False)
    x /= x.double().log().mean().exp().float()  # keep the product O(1)
    out = gemsops.prod(x)
    assert out.shape == () and out.dtype == torch.float32
    ref = ref_prod(x)
    assert abs(out.item() - ref.item()) <= 1e-4 * abs(ref.item()) + 1e-30


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("zeros", [0, 1, 2])
@pytest.mark.parametrize("dim", [None, 0, 1])
def test_backward_with_zeros(dtype, zeros, dim):
    x = near_one((6, 9), dtype)
    for k in range(zeros):  # zeros in the same line (dim 1 line 2 / dim 0 col 4)
        if dim == 0:
            x[1 + 2 * k, 4] = 0
        else:
            x[2, 1 + 3 * k] = 0
    x.requires_grad_()
    out = gemsops.prod(x) if dim is None else gemsops.prod(x, dim)
    g = torch.randn(out.shape, dtype=dtype)
    out.backward(g)
    xd = x.detach().double().requires_grad_()
    ref = xd.prod() if dim is None else xd.prod(dim)
    ref.backward(g.double())
    assert_close(out.detach(), ref.detach(), dtype, name="out")
    assert_close(x.grad, xd.grad, dtype, name="grad")
    if zeros == 1:  # the zero's own gradient is the product of the others
        assert (x.grad != 0).any()


def test_backward_keepdim_and_noncontiguous():
    base = near_one((7, 10, 5), torch.float32)
    x = base.transpose(0, 2)[:, ::2].requires_grad_()  # strides, no copy
    out = gemsops.prod(x, 1, keepdim=True)
    g = torch.randn(out.shape)
    out.backward(g)
    xd = x.detach().double().requires_grad_()
    xd.prod(1, keepdim=True).backward(g.double())
    assert_close(x.grad, xd.grad, torch.float32)


def test_inf_and_nan_propagate():
    x = torch.tensor([[1.0, float("inf"), 2.0], [1.0, float("nan"), 0.0],
                      [0.0, float("inf"), 1.0], [-1.0, float("inf"), 3.0]])
    torch.testing.assert_close(gemsops.prod(x, 1), torch.prod(x, 1),
                               equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int8,
                                   torch.int16, torch.int32, torch.int64])
def test_integer_inputs_give_int64_with_wraparound(dtype):
    if dtype == torch.bool:
        x = torch.rand(40, 50) > 0.1
    else:
        hi = 4 if dtype == torch.uint8 else 7
        lo = 0 if dtype == torch.uint8 else -7
        x = torch.randint(lo, hi, (40, 50), dtype=dtype)
    for dim in (None, 0, 1):
        ours = gemsops.prod(x) if dim is None else gemsops.prod(x, dim)
        theirs = torch.prod(x) if dim is None else torch.prod(x, dim)
        assert ours.dtype == torch.int64 == theirs.dtype
        assert torch.equal(ours, theirs)  # exact, wrap-around included


def test_dtype_argument_casts_first():
    x = near_one((30, 40), torch.float32)
    out = gemsops.prod(x, 1, dtype=torch.float64)
    assert out.dtype == torch.float64
    assert_close(out, ref_prod(x, 1), torch.float64)
    i = torch.randint(-3, 4, (20, 30), dtype=torch.int32)
    assert torch.equal(gemsops.prod(i, 0, dtype=torch.float32),
                       torch.prod(i, 0, dtype=torch.float32))


def test_empty():
    assert gemsops.prod(torch.empty(0)).item() == 1.0
    assert torch.equal(gemsops.prod(torch.empty(3, 0), 1), torch.ones(3))
    assert gemsops.prod(torch.empty(0, 4), 1).shape == (0,)
    assert gemsops.prod(torch.empty(0, dtype=torch.int32)).item() == 1


def test_zero_dim_input():
    x = torch.tensor(3.5)
    assert gemsops.prod(x).item() == 3.5
    assert gemsops.prod(x, 0).shape == () and gemsops.prod(x, -1).item() == 3.5


def test_errors():
    x = torch.randn(3, 4)
    with pytest.raises(IndexError, match=r"range of \[-2, 1\], but got 2"):
        gemsops.prod(x, 2)
    with pytest.raises(TypeError, match="complex"):
        gemsops.prod(torch.randn(3, dtype=torch.complex64))
    with pytest.raises(TypeError, match="'input' must be a Tensor"):
        gemsops.prod([1.0, 2.0])
    with pytest.raises(TypeError, match="'dim' must be int"):
        gemsops.prod(x, 1.0)
    out = torch.empty(3)
    with pytest.raises(TypeError, match="'out' has dtype float32; expected int64"):
        gemsops._C.prod(torch.ones(3, 4, dtype=torch.int32), 1, out)
    with pytest.raises(ValueError, match="'out' has 4 elements; expected 3"):
        gemsops._C.prod(x, 1, torch.empty(4))
    with pytest.raises(IndexError, match="dim=5"):
        gemsops._C.prod(x, 5, torch.empty(3))
    with pytest.raises(TypeError, match="only floating point inputs"):
        gemsops._C.prod_bwd(torch.ones(3, 4, dtype=torch.int64), 1,
                            torch.ones(3, dtype=torch.int64),
                            torch.empty(3, 4, dtype=torch.int64))
