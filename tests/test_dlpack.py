"""The DLPack boundary: what C sees of tensors from torch and NumPy."""

import ctypes

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


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint8),
        ("bits", ctypes.c_uint8),
        ("lanes", ctypes.c_uint16),
    ]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManaged(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", _DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
    ]


class ClaimingProducer:
    """A DLPack producer that describes `base`'s float32 memory (kept
    alive here) with any shape and strides it is given."""

    def __init__(self, base, shape, strides):
        self.base = base
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.strides = (ctypes.c_int64 * len(shape))(*strides)
        m = _DLManaged()
        m.dl_tensor.data = base.ctypes.data
        m.dl_tensor.device = _DLDevice(1, 0)
        m.dl_tensor.ndim = len(shape)
        m.dl_tensor.dtype = _DLDataType(2, 32, 1)
        m.dl_tensor.shape = self.shape
        m.dl_tensor.strides = self.strides
        self.managed = m

    def __dlpack__(self, *args, **kwargs):
        new = ctypes.pythonapi.PyCapsule_New
        new.restype = ctypes.py_object
        new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self.managed), b"dltensor", None)


def test_sizes_whose_count_overflows_refused():
    # 2^62 x 4 stride-0 rows: the element count wraps to 0 in 64 bits,
    # which read as empty (and contiguous) would let the launch through
    one, out = np.ones(1, np.float32), np.zeros(1, np.float32)
    huge = (2**62, 4)
    for call in (
        lambda: _C.layer_norm_fwd(
            ClaimingProducer(one, huge, (0, 0)),
            None,
            None,
            1,
            1e-5,
            ClaimingProducer(out, huge, (0, 0)),
            None,
            None,
        ),
        lambda: _C.tensor_info(ClaimingProducer(one, (2**40, 2**40), (0, 0))),
    ):
        with pytest.raises(ValueError, match="64-bit"):
            call()
    assert out[0] == 0
    # the same producer with a size that fits is read as usual
    assert _C.tensor_info(ClaimingProducer(one, (8, 4), (0, 0)))[3] == (8, 4)


def test_a_producers_buffer_error_is_a_type_error():
    # NumPy refuses to export a big-endian array (BufferError): the
    # refusal reaches the caller as a TypeError, not a SystemError
    with pytest.raises(TypeError, match="DLPack"):
        _C.tensor_info(np.zeros((4, 8), ">f4"))
