"""Where an array lives and how to make outputs of its kind.

A call's arrays are either all NumPy arrays (CPU backend) or all CUDA arrays of one library
(GPU backend). Each supported library gets a small adapter: read shape and dtype, give the
kernels a :class:`~moe_numba.kernels._buffer.DeviceBuffer`, allocate outputs with the library's
own allocator, name the current stream. torch and CuPy are never imported unless the
caller's array already comes from them (then they are in ``sys.modules``).
"""

from __future__ import annotations

import sys

import ml_dtypes
import numpy as np

from .kernels._buffer import DeviceBuffer

_KDL_CUDA_DEVICES = (2, 3, 13)  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged

# ml_dtypes types that numba and torch's NumPy bridge cannot handle: they travel as these bits
ML_DTYPE_BITS = {
    np.dtype(ml_dtypes.bfloat16): np.dtype(np.uint16),
    np.dtype(ml_dtypes.float8_e4m3fn): np.dtype(np.uint8),
    np.dtype(ml_dtypes.float8_e5m2): np.dtype(np.uint8),
}


def _module_root(x):
    return type(x).__module__.partition(".")[0]


def _is_sim_array(x):
    sim = sys.modules.get("numba.cuda.simulator.cudadrv.devicearray")
    return sim is not None and isinstance(x, sim.FakeCUDAArray)


def is_cuda_array(x):
    """True for CUDA arrays of any supported kind, without importing their libraries."""
    root = _module_root(x)
    if root == "torch":
        return getattr(getattr(x, "device", None), "type", None) == "cuda"
    if _is_sim_array(x):
        return True
    try:
        if getattr(x, "__cuda_array_interface__", None) is not None:
            return True
    except Exception:  # some producers raise other errors for CPU data
        return False
    dlpack_device = getattr(x, "__dlpack_device__", None)
    if dlpack_device is not None:
        try:
            return int(dlpack_device()[0]) in _KDL_CUDA_DEVICES
        except Exception:
            return False
    return False


def _is_torch_cpu_tensor(x):
    # host arrays of the torch path (moe_numba.torch runs them through NumPy views)
    return _module_root(x) == "torch" and getattr(getattr(x, "device", None), "type", None) == "cpu"


def _describe(x):
    kind = "CUDA array" if is_cuda_array(x) else "host array"
    return f"{type(x).__module__}.{type(x).__name__} ({kind})"


def locate(arrays):
    """Decide the backend for a call from its named arrays.

    Parameters
    ----------
    arrays : dict of str to array or None
        The call's array arguments by name; ``None`` entries are skipped.

    Returns
    -------
    str
        ``"cpu"`` when every array is a NumPy array, ``"cuda"`` when every array is a CUDA
        array.

    Raises
    ------
    TypeError
        For an unsupported object, or host and device arrays mixed in one call.
    """
    first_cpu = first_cuda = None
    for name, x in arrays.items():
        if x is None:
            continue
        if isinstance(x, np.ndarray) or _is_torch_cpu_tensor(x):
            first_cpu = first_cpu or name
        elif is_cuda_array(x):
            first_cuda = first_cuda or name
        else:
            raise TypeError(
                f"{name} must be a NumPy array or a CUDA array (numba device array, CuPy "
                "array, torch CUDA tensor), or a torch CPU tensor; got "
                f"{type(x).__module__}.{type(x).__name__}"
            )
        if first_cpu and first_cuda:
            raise TypeError(
                f"{first_cpu} is a {_describe(arrays[first_cpu])} but {first_cuda} is a "
                f"{_describe(arrays[first_cuda])}: pass all arrays on the host or all on "
                "one GPU; nothing is copied between host and device"
            )
    return "cuda" if first_cuda else "cpu"


def check_arrays(arrays):
    """Every array C-contiguous (kernels index rows linearly) and all on one device.

    Raises ``ValueError`` for a strided array, ``TypeError`` for arrays on two devices.
    """
    devices = {}
    for name, x in arrays.items():
        if x is None:
            continue
        library = array_library(x)
        if not library.is_contiguous(x):
            raise ValueError(
                f"{name} must be C-contiguous; got a strided view of shape "
                f"{tuple(library.shape(x))} (make a contiguous copy first)"
            )
        devices.setdefault(library.device(x), name)
    if len(devices) > 1:
        (device_a, name_a), (device_b, name_b) = list(devices.items())[:2]
        raise TypeError(
            f"{name_a} is on {device_a} but {name_b} is on {device_b}: "
            "pass all arrays on one device"
        )


def call_key(arrays, scalars):
    """A hashable key for what a call's checks depend on, or None when there is none.

    Per array its type, shape, dtype, strides and device (so location, metadata and
    contiguity checks can be remembered), per scalar its type and value. Only arrays of a
    type an earlier call has seen get a key: the first call always runs every check.
    """
    key = []
    for x in arrays:
        if x is None:
            key.append(None)
            continue
        library = _LIBRARY_OF_TYPE.get(type(x))
        k = None if library is None else library.key(x)
        if k is None:
            return None
        key.append(k)
    key.extend((type(v), v) for v in scalars)
    key = tuple(key)
    try:
        hash(key)
    except TypeError:  # an unhashable scalar
        return None
    return key


# ---------------------------------------------------------------------------------------------
# Adapters. Each has: shape(x), dtype(x) (a NumPy dtype; ml_dtypes for bf16/fp8),
# is_contiguous(x), key(x) -> hashable or None, buffer(x) -> DeviceBuffer,
# empty(shape, dtype, like), upload(np, like), to_host(x) -> np.ndarray, stream(like) -> int,
# device(x) -> hashable.


class NumpyLibrary:
    """NumPy arrays (CPU backend); only the metadata readers are used."""

    name = "numpy"

    @staticmethod
    def shape(x):
        return tuple(x.shape)

    @staticmethod
    def dtype(x):
        return x.dtype

    @staticmethod
    def is_contiguous(x):
        return x.flags.c_contiguous

    @staticmethod
    def key(x):
        return type(x), x.shape, x.dtype, x.strides

    @staticmethod
    def to_host(x):
        return x

    @staticmethod
    def device(x):
        return "cpu"


class TorchLibrary:
    """PyTorch CUDA tensors: caching allocator, current stream of the tensor's device (CPU
    tensors: metadata only, for the checks of the torch path)."""

    name = "torch"

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
        }
        for name, np_type in (
            ("float8_e4m3fn", ml_dtypes.float8_e4m3fn),
            ("float8_e5m2", ml_dtypes.float8_e5m2),
        ):
            if hasattr(torch, name):
                self.to_numpy[getattr(torch, name)] = np.dtype(np_type)
        self.to_torch = {v: k for k, v in self.to_numpy.items()}
        self._raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)

    @staticmethod
    def shape(x):
        return tuple(x.shape)

    def dtype(self, x):
        try:
            return self.to_numpy[x.dtype]
        except KeyError:
            return np.dtype(f"V{x.element_size()}") if x.dtype.is_floating_point else None

    @staticmethod
    def is_contiguous(x):
        return x.is_contiguous()

    @staticmethod
    def key(x):
        return type(x), x.shape, x.dtype, x.stride(), x.device

    @staticmethod
    def buffer(x):
        return DeviceBuffer(x.data_ptr(), x.nbytes)

    def empty(self, shape, dtype, like):
        return self.torch.empty(shape, dtype=self.to_torch[np.dtype(dtype)], device=like.device)

    def upload(self, values, like):
        host = self.torch.from_numpy(values)
        if like.device.type == "cuda":
            host = host.pin_memory()  # so the copy is asynchronous: no host-device sync
        return host.to(like.device, non_blocking=True)

    def to_host(self, x):
        dtype = self.dtype(x)
        if dtype in ML_DTYPE_BITS:  # torch's .numpy() knows no bfloat16 or float8
            bits = self.torch.int16 if dtype.itemsize == 2 else self.torch.uint8
            return x.view(bits).cpu().numpy().view(dtype)
        return x.cpu().numpy()

    def stream(self, like):
        index = like.device.index
        if self._raw_stream is not None:
            return int(self._raw_stream(index))
        return int(self.torch.cuda.current_stream(like.device).cuda_stream)

    @staticmethod
    def device(x):
        return "cpu" if x.device.type == "cpu" else ("cuda", x.device.index)


class CupyLibrary(NumpyLibrary):
    """CuPy arrays (NumPy's metadata API): CuPy's memory pool, CuPy's current stream."""

    name = "cupy"

    def __init__(self):
        import cupy

        self.cupy = cupy

    @staticmethod
    def key(x):
        return type(x), x.shape, x.dtype, x.strides, x.device.id

    @staticmethod
    def buffer(x):
        return DeviceBuffer(x.data.ptr, x.nbytes)

    def empty(self, shape, dtype, like):
        with like.device:
            return self.cupy.empty(shape, dtype=dtype)

    def upload(self, values, like):
        with like.device:
            return self.cupy.asarray(values)

    @staticmethod
    def to_host(x):
        return x.get()

    def stream(self, like):
        return int(self.cupy.cuda.get_current_stream().ptr)

    @staticmethod
    def device(x):
        return ("cuda", x.device.id)


class NumbaLibrary:
    """numba device arrays, and any other ``__cuda_array_interface__`` producer.

    Outputs are numba device arrays (allocated with numba's allocator).
    """

    name = "numba"

    def __init__(self):
        from numba import config, cuda

        self.cuda = cuda
        self._device_array = None
        if not config.ENABLE_CUDASIM:  # (the simulator has no DeviceNDArray)
            from numba.cuda.cudadrv.devicearray import DeviceNDArray

            self._device_array = DeviceNDArray

    def _as_numba(self, x):
        return x if isinstance(x, self._device_array) else self.cuda.as_cuda_array(x)

    def shape(self, x):
        return tuple(x.shape)

    def dtype(self, x):
        return np.dtype(x.dtype)

    def is_contiguous(self, x):
        return self._as_numba(x).is_c_contiguous()

    def key(self, x):
        if type(x) is not self._device_array:  # other producers: no cheap, trustworthy key
            return None
        return type(x), x.shape, x.dtype, x.strides

    def buffer(self, x):
        x = self._as_numba(x)
        ptr = x.device_ctypes_pointer.value if x.size else 0
        return DeviceBuffer(ptr or 0, x.nbytes)

    def empty(self, shape, dtype, like):
        dtype = np.dtype(dtype)
        stream = self._stream_of(like)
        bits = ML_DTYPE_BITS.get(dtype)
        if bits is not None:  # numba cannot allocate ml_dtypes types, but can view them
            return self.cuda.device_array(shape, bits, stream=stream).view(dtype)
        return self.cuda.device_array(shape, dtype, stream=stream)

    def upload(self, values, like):
        return self.cuda.to_device(values, stream=self._stream_of(like))

    def to_host(self, x):
        dtype = np.dtype(x.dtype)
        bits = ML_DTYPE_BITS.get(dtype)
        if bits is not None:
            return x.view(bits).copy_to_host().view(dtype)
        return x.copy_to_host()

    def _stream_of(self, like):
        stream = getattr(like, "stream", 0)
        return stream if stream else 0

    def stream(self, like):
        stream = self._stream_of(like)
        if not stream:
            return 0
        handle = stream.handle
        return int(getattr(handle, "value", handle) or 0)

    def device(self, x):
        return ("cuda", "numba")


class SimulatorLibrary(NumbaLibrary):
    """Device arrays of numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``)."""

    name = "cudasim"

    def shape(self, x):
        return tuple(x.shape)

    def is_contiguous(self, x):
        return x._ary.flags.c_contiguous

    def key(self, x):
        return type(x), x.shape, x.dtype, x._ary.strides

    def buffer(self, x):
        return DeviceBuffer(0, x.nbytes, sim_array=x._ary)

    def empty(self, shape, dtype, like):
        return self.cuda.device_array(shape, np.dtype(dtype))

    def upload(self, values, like):
        return self.cuda.to_device(values)

    def to_host(self, x):
        return x.copy_to_host()

    def stream(self, like):
        return 0


_ADAPTERS = {
    "numpy": NumpyLibrary,
    "cudasim": SimulatorLibrary,
    "torch": TorchLibrary,
    "cupy": CupyLibrary,
    "numba": NumbaLibrary,
}
_LIBRARIES = {}  # adapter name -> adapter
_LIBRARY_OF_TYPE = {}  # array type -> adapter (every call asks this several times)


def array_library(x):
    """The adapter for ``x``'s library (cached by type)."""
    library = _LIBRARY_OF_TYPE.get(type(x))
    if library is not None:
        return library
    if isinstance(x, np.ndarray):
        name = "numpy"
    elif _is_sim_array(x):
        name = "cudasim"
    else:
        name = _module_root(x)
        if name not in ("torch", "cupy"):
            name = "numba"
    library = _LIBRARIES.get(name)
    if library is None:
        library = _LIBRARIES[name] = _ADAPTERS[name]()
    _LIBRARY_OF_TYPE[type(x)] = library
    return library
