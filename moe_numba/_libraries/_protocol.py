"""The protocol every array-library adapter implements, and what the adapters share."""

from __future__ import annotations

import sys
from collections.abc import Hashable
from typing import Any, ClassVar, Protocol

import ml_dtypes
import numpy as np

from ..runtime._buffer import DeviceBuffer

# ml_dtypes types that numba and torch's NumPy bridge cannot handle: they travel as these bits
ML_DTYPE_BITS = {
    np.dtype(ml_dtypes.bfloat16): np.dtype(np.uint16),
    np.dtype(ml_dtypes.float8_e4m3fn): np.dtype(np.uint8),
    np.dtype(ml_dtypes.float8_e5m2): np.dtype(np.uint8),
}

_KDL_CUDA_DEVICES = (2, 3, 13)  # DLPack device types kDLCUDA, kDLCUDAHost, kDLCUDAManaged


class ArrayLibrary(Protocol):
    """What moe-numba needs of an array library; one adapter class per library implements it.

    ``serves`` and ``usable`` are class methods: ``serves`` imports nothing the caller has
    not, ``usable`` imports the library when it is installed. The other methods belong to the
    one adapter instance per library, made when it first serves an array.
    """

    name: ClassVar[str]  # what :func:`library_named` and ``to_device`` call the library
    location: ClassVar[str]  # the backend that runs its arrays: "cpu" or "cuda"

    @classmethod
    def serves(cls, x: Any) -> bool:
        """Whether ``x``, an object of this library, is an array this adapter handles."""

    @classmethod
    def usable(cls) -> bool:
        """Whether the library is installed and can make arrays here (sees a GPU)."""

    def shape(self, x: Any) -> tuple[int, ...]:
        """The shape of ``x``."""

    def dtype(self, x: Any) -> np.dtype | None:
        """The NumPy dtype of ``x`` (ml_dtypes for bfloat16/float8), None if it has none."""

    def is_contiguous(self, x: Any) -> bool:
        """Whether ``x`` is C-contiguous."""

    def key(self, x: Any) -> Hashable | None:
        """What the metadata checks depend on (type, shape, dtype, strides, device), or None
        where that cannot be read cheaply and reliably."""

    def device(self, x: Any) -> Hashable:
        """Where ``x`` lives: arrays of one call must agree."""

    def empty(self, shape: tuple[int, ...], dtype: Any, like: Any) -> Any:
        """An uninitialised array of this library, on the device (and stream) of ``like``."""

    def from_numpy(self, array: np.ndarray, like_or_device: Any = None) -> Any:
        """A copy of the NumPy ``array`` in this library: on the device of ``like_or_device``
        (an array of this library, or a device index; None: the current device)."""

    def to_host(self, x: Any) -> np.ndarray:
        """A NumPy array with the contents of ``x`` (the same dtype, bfloat16 and float8 too)."""

    def copy(self, dst: Any, src: Any) -> None:
        """Copy ``src`` into ``dst``, both of this library, of one size, on one device."""


class DeviceLibrary(ArrayLibrary, Protocol):
    """An :class:`ArrayLibrary` of CUDA arrays: what the GPU backend needs besides."""

    def buffer(self, x: Any) -> DeviceBuffer:
        """The address and size of the C-contiguous array ``x``, for a kernel launch."""

    def upload(self, values: np.ndarray, like: Any) -> Any:
        """``values`` on the device of ``like``, ordered on its stream, without a host sync."""

    def stream(self, like: Any) -> int:
        """The handle of the stream the caller's work on ``like`` goes to (0: the default)."""


def loaded_type(module, name):
    """The class ``name`` of ``module`` if that module is imported already, else None (an
    object of it cannot exist before)."""
    return getattr(sys.modules.get(module), name, None)


def has_cuda_array_interface(x):
    """Whether ``x`` exposes a ``__cuda_array_interface__`` (read without raising)."""
    try:
        return getattr(x, "__cuda_array_interface__", None) is not None
    except Exception:  # some producers raise other errors than AttributeError for CPU data
        return False


def dlpack_cuda(x):
    """Whether ``x`` says through DLPack that it lives on a CUDA device."""
    dlpack_device = getattr(x, "__dlpack_device__", None)
    if dlpack_device is None:
        return False
    try:
        return int(dlpack_device()[0]) in _KDL_CUDA_DEVICES
    except Exception:  # a producer that cannot answer is not one we can use either
        return False
