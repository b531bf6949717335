"""The adapters of numba's device arrays (and other ``__cuda_array_interface__`` producers)
and of the CUDA simulator's arrays."""

from __future__ import annotations

import importlib.util

import numpy as np

from .._errors import numba_unavailable
from ..runtime._buffer import DeviceBuffer
from ._protocol import ML_DTYPE_BITS, has_cuda_array_interface, loaded_type


def fake_cuda_array_type():
    """The simulator's device array type, or None when the simulator is not loaded."""
    return loaded_type("numba.cuda.simulator.cudadrv.devicearray", "FakeCUDAArray")


def _numba_stream(like):
    """The numba stream an array was made on (its ``stream`` attribute), or 0."""
    stream = getattr(like, "stream", 0)
    return stream if stream else 0


class NumbaLibrary:
    """numba device arrays, and any other ``__cuda_array_interface__`` producer.

    Outputs are numba device arrays (allocated with numba's allocator).
    """

    name = "numba"
    location = "cuda"

    @classmethod
    def serves(cls, x):
        # (the simulator's module of that name has no DeviceNDArray)
        device_array = loaded_type("numba.cuda.cudadrv.devicearray", "DeviceNDArray")
        if device_array is not None and isinstance(x, device_array):
            return True  # without building its interface dict
        return has_cuda_array_interface(x)

    @classmethod
    def usable(cls):
        if importlib.util.find_spec("numba") is None:
            return False
        from numba import config, cuda

        return not config.ENABLE_CUDASIM and cuda.is_available()

    def __init__(self):
        # the first CUDA array of a call meets this adapter before the GPU backend loads, so
        # an install without numba is told here what to install
        try:
            from numba import config, cuda
        except ImportError as error:
            raise numba_unavailable(error) from error

        self.cuda = cuda
        self.device_array_type = None
        if not config.ENABLE_CUDASIM:  # (the simulator has no DeviceNDArray)
            from numba.cuda.cudadrv.devicearray import DeviceNDArray

            self.device_array_type = DeviceNDArray

    def _as_numba(self, x):
        if self.device_array_type is not None and isinstance(x, self.device_array_type):
            return x
        return self.cuda.as_cuda_array(x)

    def shape(self, x):
        return tuple(x.shape)

    def dtype(self, x):
        return np.dtype(x.dtype)

    def is_contiguous(self, x):
        return self._as_numba(x).is_c_contiguous()

    def key(self, x):
        if type(x) is not self.device_array_type:  # other producers: no cheap, trustworthy key
            return None
        return type(x), x.shape, x.dtype, x.strides

    def device(self, x):
        return ("cuda", "numba")

    def buffer(self, x):
        x = self._as_numba(x)
        ptr = x.device_ctypes_pointer.value if x.size else 0
        return DeviceBuffer(ptr or 0, x.nbytes)

    def empty(self, shape, dtype, like):
        dtype = np.dtype(dtype)
        stream = _numba_stream(like)
        bits = ML_DTYPE_BITS.get(dtype)
        if bits is not None:  # numba cannot allocate ml_dtypes types, but can view them
            return self.cuda.device_array(shape, bits, stream=stream).view(dtype)
        return self.cuda.device_array(shape, dtype, stream=stream)

    def upload(self, values, like):
        return self.cuda.to_device(values, stream=_numba_stream(like))

    def from_numpy(self, array, like_or_device=None):
        if isinstance(like_or_device, int):
            with self.cuda.gpus[like_or_device]:
                return self.from_numpy(array)
        array = np.ascontiguousarray(array)
        stream = _numba_stream(like_or_device)
        bits = ML_DTYPE_BITS.get(array.dtype)
        if bits is not None:  # cuda.to_device rejects ml_dtypes arrays: copy their bits
            return self.cuda.to_device(array.view(bits), stream=stream).view(array.dtype)
        return self.cuda.to_device(array, stream=stream)

    def to_host(self, x):
        dtype = np.dtype(x.dtype)
        bits = ML_DTYPE_BITS.get(dtype)
        if bits is not None:
            return x.view(bits).copy_to_host().view(dtype)
        return x.copy_to_host()

    def copy(self, dst, src):
        dst.copy_to_device(src)

    def stream(self, like):
        stream = _numba_stream(like)
        if not stream:
            return 0
        handle = stream.handle
        return int(getattr(handle, "value", handle) or 0)


class SimulatorLibrary:
    """Device arrays of numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``).

    They have no ``__cuda_array_interface__`` and no address; kernels index the host array
    behind each one (``DeviceBuffer.sim_array``).
    """

    name = "cudasim"
    location = "cuda"

    @classmethod
    def serves(cls, x):
        return isinstance(x, fake_cuda_array_type() or ())

    @classmethod
    def usable(cls):
        if importlib.util.find_spec("numba") is None:
            return False
        from numba import config

        return bool(config.ENABLE_CUDASIM)

    def __init__(self):
        from numba import cuda

        self.cuda = cuda

    def shape(self, x):
        return tuple(x.shape)

    def dtype(self, x):
        return np.dtype(x.dtype)

    def is_contiguous(self, x):
        return x._ary.flags.c_contiguous

    def key(self, x):
        return type(x), x.shape, x.dtype, x._ary.strides

    def device(self, x):
        return ("cuda", "numba")

    def buffer(self, x):
        return DeviceBuffer(0, x.nbytes, sim_array=x._ary)

    def empty(self, shape, dtype, like):
        return self.cuda.device_array(shape, np.dtype(dtype))

    def upload(self, values, like):
        return self.cuda.to_device(values)

    def from_numpy(self, array, like_or_device=None):
        return self.cuda.to_device(np.ascontiguousarray(array))  # takes ml_dtypes arrays

    def to_host(self, x):
        return x.copy_to_host()

    def copy(self, dst, src):
        # on the host arrays behind both: the simulator's copy_to_device cannot copy the
        # ml_dtypes types
        np.copyto(dst._ary, src._ary)

    def stream(self, like):
        return 0
