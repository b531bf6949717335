"""The adapter of PyTorch CUDA tensors."""

from __future__ import annotations

import importlib.util

import ml_dtypes
import numpy as np

from ..runtime._buffer import DeviceBuffer
from ._protocol import ML_DTYPE_BITS


class TorchLibrary:
    """PyTorch CUDA tensors: torch's caching allocator, the current stream of their device."""

    name = "torch"
    location = "cuda"

    @classmethod
    def serves(cls, x):
        return getattr(getattr(x, "device", None), "type", None) == "cuda"

    @classmethod
    def usable(cls):
        if importlib.util.find_spec("torch") is None:
            return False
        import torch

        return bool(torch.cuda.is_available())

    def __init__(self):
        import torch

        self.torch = torch
        self.to_numpy = {
            torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
            torch.float16: np.dtype(np.float16),
            torch.float32: np.dtype(np.float32),
            torch.float64: np.dtype(np.float64),
            torch.int32: np.dtype(np.int32),
            torch.int64: np.dtype(np.int64),
            torch.int16: np.dtype(np.int16),
            torch.uint8: np.dtype(np.uint8),
            torch.int8: np.dtype(np.int8),
            torch.bool: np.dtype(np.bool_),
            torch.complex64: np.dtype(np.complex64),
            torch.complex128: np.dtype(np.complex128),
        }
        for name, np_type in (  # dtypes that older torch releases lack
            ("float8_e4m3fn", ml_dtypes.float8_e4m3fn),
            ("float8_e5m2", ml_dtypes.float8_e5m2),
            ("uint16", np.uint16),
            ("uint32", np.uint32),
            ("uint64", np.uint64),
        ):
            if hasattr(torch, name):
                self.to_numpy[getattr(torch, name)] = np.dtype(np_type)
        self.to_torch = {v: k for k, v in self.to_numpy.items()}
        self._empty_dtypes = {}
        # torch's NumPy bridge knows no bfloat16 or float8: their bits travel as these
        self.bits = {2: torch.int16, 1: torch.uint8}
        self._raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)

    def shape(self, x):
        return tuple(x.shape)

    def dtype(self, x):
        try:
            return self.to_numpy[x.dtype]
        except KeyError:
            return np.dtype(f"V{x.element_size()}") if x.dtype.is_floating_point else None

    def is_contiguous(self, x):
        return x.is_contiguous()

    def key(self, x):
        return type(x), x.shape, x.dtype, x.stride(), x.device

    def device(self, x):
        return ("cuda", x.device.index)

    def buffer(self, x):
        return DeviceBuffer(x.data_ptr(), x.nbytes)

    def empty(self, shape, dtype, like):
        torch_dtype = self._empty_dtypes.get(dtype)
        if torch_dtype is None:  # (keyed by what callers pass: NumPy types and dtypes)
            torch_dtype = self._empty_dtypes[dtype] = self.to_torch[np.dtype(dtype)]
        return self.torch.empty(shape, dtype=torch_dtype, device=like.device)

    def upload(self, values, like):
        host = self.torch.from_numpy(values)
        if like.device.type == "cuda":
            host = host.pin_memory()  # so the copy is asynchronous: no host-device sync
        return host.to(like.device, non_blocking=True)

    def from_numpy(self, array, like_or_device=None):
        if like_or_device is None:
            device = self.torch.device("cuda")
        elif isinstance(like_or_device, int):
            device = self.torch.device("cuda", like_or_device)
        else:
            device = like_or_device.device
        array = np.ascontiguousarray(array)
        if array.dtype in ML_DTYPE_BITS:
            bits = array.view(np.int16 if array.dtype.itemsize == 2 else np.uint8)
            return self.torch.from_numpy(bits).to(device).view(self.to_torch[array.dtype])
        return self.torch.from_numpy(array).to(device)

    def to_host(self, x):
        dtype = self.dtype(x)
        if dtype in ML_DTYPE_BITS:
            return x.view(self.bits[dtype.itemsize]).cpu().numpy().view(dtype)
        return x.cpu().numpy()

    def copy(self, dst, src):
        dst.copy_(src)

    def stream(self, like):
        index = like.device.index
        if self._raw_stream is not None:
            return int(self._raw_stream(index))
        return int(self.torch.cuda.current_stream(like.device).cuda_stream)


class _TorchHostSide:
    """What the adapters of torch tensors that the GPU backend does not run share: the
    metadata reads and the copies, through the one dtype table of :class:`TorchLibrary`."""

    @classmethod
    def serves(cls, x):
        return getattr(getattr(x, "device", None), "type", None) == cls.location

    @classmethod
    def usable(cls):
        return importlib.util.find_spec("torch") is not None

    def __init__(self):
        self._tensors = TorchLibrary()  # the dtype table and the copies work on any device

    def shape(self, x):
        return tuple(x.shape)

    def dtype(self, x):
        return self._tensors.dtype(x)

    def is_contiguous(self, x):
        return x.is_contiguous()

    def key(self, x):
        return self._tensors.key(x)

    def device(self, x):
        return self.location

    def empty(self, shape, dtype, like):
        return self._tensors.empty(shape, dtype, like)

    def from_numpy(self, array, like_or_device=None):
        return self._tensors.from_numpy(array, self._tensors.torch.device(self.location))

    def copy(self, dst, src):
        dst.copy_(src)


class TorchCpuLibrary(_TorchHostSide):
    """PyTorch CPU tensors: host arrays of the torch path.

    The public functions send every call with torch tensors to the torch custom ops
    (:mod:`moe_numba.torch`), whose CPU implementations hand the CPU backend NumPy views of
    the tensors. This adapter serves what comes before that: dispatch and the metadata checks
    read the tensors' shapes, dtypes, contiguity and device through it, so a torch CPU call is
    refused or accepted exactly like a NumPy call.
    """

    name = "torch-cpu"
    location = "cpu"

    def to_host(self, x):
        return self._tensors.to_host(x)


class TorchMetaLibrary(_TorchHostSide):
    """PyTorch meta tensors: shapes and dtypes without data.

    No backend runs them: torch sends a call with a meta tensor to the custom ops' fake
    kernels, which give meta outputs when every tensor is a meta tensor. This adapter lets
    dispatch and the device checks name the device of a meta tensor that comes with tensors
    holding data (a CPU or CUDA tensor beside it), which is refused: the outputs would be
    allocated and never written.
    """

    name = "torch-meta"
    location = "meta"

    def to_host(self, x):
        raise TypeError("a meta tensor holds no data: it has no host copy")
