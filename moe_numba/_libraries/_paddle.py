"""The adapters of Paddle tensors: GPU tensors (:class:`PaddleLibrary`, CUDA arrays of the GPU
backend) and CPU tensors (:class:`PaddleCpuLibrary`, host arrays).

A Paddle tensor's place decides its adapter: a GPU place is a CUDA array (its address is
``data_ptr()``, its outputs come from Paddle's allocator, its kernels go to Paddle's current
stream of its device); the CPU place is a host array, which the Paddle front
(:mod:`moe_numba.paddle`) hands the CPU backend as NumPy views. Other places (XPU, custom
devices, pinned host memory) are served by neither: the front refuses them by name.

Paddle is never imported here: both adapters are made only for tensors that exist already.
"""

from __future__ import annotations

import importlib.util
import math

import ml_dtypes
import numpy as np

from ..runtime._buffer import DeviceBuffer
from ._protocol import loaded_type

# NumPy dtype -> the integer dtype (by name) whose bits a Paddle tensor of it crosses as: the
# ml_dtypes types cannot cross DLPack
_BITS = {
    np.dtype(ml_dtypes.bfloat16): "int16",
    np.dtype(ml_dtypes.float8_e4m3fn): "uint8",
    np.dtype(ml_dtypes.float8_e5m2): "uint8",
}


def paddle_tensor_type():
    """``paddle.Tensor`` when paddle is imported, else None (no Paddle tensor exists yet)."""
    return loaded_type("paddle", "Tensor")


def _place(x):
    """The place of ``x`` if it is a Paddle tensor, else None."""
    tensor = paddle_tensor_type()
    return x.place if tensor is not None and isinstance(x, tensor) else None


class _PaddleTensors:
    """What both adapters share: dtypes, metadata and copies of Paddle tensors."""

    _place_kind: str  # the method of a place that says the adapter serves it

    @classmethod
    def serves(cls, x):
        place = _place(x)
        return place is not None and getattr(place, cls._place_kind)()

    def __init__(self):
        import paddle

        self.paddle = paddle
        # (Paddle's uint16, uint32 and uint64 make no tensors: paddle.uint16 is bfloat16's
        # old name, the others are refused)
        self.to_numpy = {}
        for name, numpy_type in (
            ("bfloat16", ml_dtypes.bfloat16),
            ("float8_e4m3fn", ml_dtypes.float8_e4m3fn),
            ("float8_e5m2", ml_dtypes.float8_e5m2),
            ("float16", np.float16),
            ("float32", np.float32),
            ("float64", np.float64),
            ("int8", np.int8),
            ("int16", np.int16),
            ("int32", np.int32),
            ("int64", np.int64),
            ("uint8", np.uint8),
            ("bool", np.bool_),
            ("complex64", np.complex64),
            ("complex128", np.complex128),
        ):
            self.to_numpy[getattr(paddle, name)] = np.dtype(numpy_type)
        self.to_paddle = {v: k for k, v in self.to_numpy.items()}
        self.bits = {dtype: getattr(paddle, name) for dtype, name in _BITS.items()}

    def paddle_dtype(self, dtype):
        """The Paddle dtype of a NumPy (or ml_dtypes) dtype."""
        return self.to_paddle[np.dtype(dtype)]

    def shape(self, x):
        return tuple(x.shape)

    def dtype(self, x):
        return self.to_numpy.get(x.dtype)

    def is_contiguous(self, x):
        return x.is_contiguous()

    def key(self, x):
        return type(x), tuple(x.shape), x.dtype, tuple(x.strides), self.device(x)

    def empty(self, shape, dtype, like):
        return self.paddle.empty(list(shape), dtype=self.paddle_dtype(dtype), device=like.place)

    def host_view(self, x):
        """A NumPy array sharing the memory of the CPU tensor ``x`` (through DLPack, which
        refuses a tensor that requires a gradient: the memory is the same detached)."""
        x = x.detach()
        dtype = self.to_numpy[x.dtype]
        bits = self.bits.get(dtype)
        if bits is None:
            return np.from_dlpack(x)
        return np.from_dlpack(x.view(bits)).view(dtype)

    def _from_numpy(self, array, place):
        array = np.ascontiguousarray(array)
        bits = self.bits.get(array.dtype)
        if bits is None:
            return self.paddle.to_tensor(array, place=place)
        raw = self.paddle.to_tensor(array.view(np.dtype(_BITS[array.dtype])), place=place)
        return raw.view(self.to_paddle[array.dtype])

    def to_host(self, x):
        return self.host_view(x.cpu()).copy()

    def copy(self, dst, src):
        dst.copy_(src, True)


class PaddleLibrary(_PaddleTensors):
    """Paddle tensors on a GPU place: Paddle's allocator, Paddle's current stream of their
    device."""

    name = "paddle"
    location = "cuda"
    _place_kind = "is_gpu_place"

    @classmethod
    def usable(cls):
        if importlib.util.find_spec("paddle") is None:
            return False
        import paddle

        return paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0

    def device(self, x):
        return ("cuda", x.place.gpu_device_id())

    def buffer(self, x):
        # data_ptr() is the address of the first element (a view's offset included); DLPack
        # would say the same through a capsule made per call
        return DeviceBuffer(x.data_ptr(), math.prod(x.shape) * x.element_size())

    def stream(self, like):
        # the stream Paddle's own kernels on that device go to (what paddle.utils.dlpack
        # hands a producer); 0 is the legacy default stream
        return int(self.paddle.device.cuda.current_stream(like.place.gpu_device_id()).cuda_stream)

    def upload(self, values, like):
        # a synchronous copy from pageable memory: the values are on the device when it
        # returns (an asynchronous one would need the pinned source kept alive until the
        # copy ran); the GPU backend uploads a value once and keeps the copy
        return self._from_numpy(values, like.place)

    def from_numpy(self, array, like_or_device=None):
        if like_or_device is None:
            place = self.paddle.device.get_device()  # (Paddle's current device: "gpu:N")
        elif isinstance(like_or_device, int):
            place = f"gpu:{like_or_device}"
        else:
            place = like_or_device.place
        return self._from_numpy(array, place)


class PaddleCpuLibrary(_PaddleTensors):
    """Paddle tensors on the CPU place: host arrays of the Paddle front.

    The front hands the CPU backend NumPy views of them (:meth:`host_view`); dispatch and the
    metadata checks read the tensors themselves through this adapter, so a Paddle CPU call is
    refused or accepted exactly like a NumPy call.
    """

    name = "paddle-cpu"
    location = "cpu"
    _place_kind = "is_cpu_place"

    @classmethod
    def usable(cls):
        return importlib.util.find_spec("paddle") is not None

    def device(self, x):
        return "cpu"

    def from_numpy(self, array, like_or_device=None):
        return self._from_numpy(array, self.paddle.CPUPlace())
