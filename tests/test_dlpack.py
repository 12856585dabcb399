"""The DLPack boundary: what C sees of tensors from torch and NumPy."""

import numpy as np
import pytest
import torch

from gemsops import _C


def test_torch_view_shape_strides_offset():
    base = torch.arange(60, dtype=torch.float32).view(3, 20)
    v = base[1:, 3::2]
    dtype, dev, idx, shape, strides, addr = _C.tensor_info(v)
    assert (dtype, dev, idx) == ("float32", 1, 0)
    assert shape == (2, 9) and strides == (20, 2)
    assert addr == v.data_ptr()  # storage offset honoured


def test_tensor_that_requires_grad():
    x = torch.randn(4, 5, requires_grad=True)
    assert _C.tensor_info(x)[3] == (4, 5)
    assert _C.tensor_info(x)[5] == x.data_ptr()


@pytest.mark.parametrize(
    "dtype,name",
    [
        (torch.float16, "float16"),
        (torch.bfloat16, "bfloat16"),
        (torch.float64, "float64"),
        (torch.int64, "int64"),
        (torch.bool, "bool"),
        (torch.uint8, "uint8"),
        (torch.int32, "int32"),
    ],
)
def test_dtypes(dtype, name):
    assert _C.tensor_info(torch.zeros(3, dtype=dtype))[0] == name


def test_numpy_producer():
    a = np.arange(24, dtype=np.float64).reshape(2, 3, 4)[:, ::2, 1:]
    dtype, dev, _, shape, strides, addr = _C.tensor_info(a)
    assert (dtype, dev, shape, strides) == (
        "float64",
        1,
        (2, 2, 3),
        (12, 8, 1),
    )
    assert addr == a.__array_interface__["data"][0]


def test_scalar_and_empty():
    assert _C.tensor_info(torch.tensor(3.0))[3] == ()
    assert _C.tensor_info(torch.empty(0, 5))[3] == (0, 5)


def test_not_a_tensor():
    with pytest.raises(TypeError, match="'t' must be a tensor"):
        _C.tensor_info(object())


class OldProducer:
    """A producer whose __dlpack__ takes no max_version (pre-2023 API)."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, stream=None):
        return torch.utils.dlpack.to_dlpack(self.t)


def test_legacy_capsule_producer():
    t = torch.arange(6.0).view(2, 3)
    assert _C.tensor_info(OldProducer(t))[3] == (2, 3)


@pytest.mark.cuda
def test_cuda_tensor_info():
    x = torch.randn(4, 4, device="cuda")
    dtype, dev, idx, *_ = _C.tensor_info(x)
    assert dev == 2 and idx == x.device.index
