"""The array libraries moe-numba accepts: one adapter class per library, one protocol.

Everything that depends on the library an array comes from lives here: reading its shape and
dtype, handing the kernels its address, allocating outputs with the library's own allocator
on its current stream, copying to and from the host. :func:`classify` is the one place that
decides which adapter serves an object; dispatch (:mod:`moe_numba._dispatch`) and every
adapter lookup go through it, so no object can be accepted that no adapter serves.

One module per library: ``_numpy``, ``_torch``, ``_paddle``, ``_cupy``, ``_numba`` (numba's
device arrays and any other ``__cuda_array_interface__`` producer, and the CUDA simulator's
arrays); the protocol is in ``_protocol``. torch, Paddle and CuPy are never imported unless the
caller's array already comes from them (then they are in ``sys.modules``), or a caller asks
for torch or CuPy by name (:func:`library_named`, ``usable()``).
"""

from __future__ import annotations

import numpy as np

from ._cupy import CupyLibrary
from ._numba import NumbaLibrary, SimulatorLibrary, fake_cuda_array_type
from ._numpy import NumpyLibrary
from ._paddle import PaddleCpuLibrary, PaddleLibrary, paddle_tensor_type
from ._protocol import ML_DTYPE_BITS, ArrayLibrary, DeviceLibrary, dlpack_cuda, loaded_type
from ._torch import TorchCpuLibrary, TorchLibrary, TorchMetaLibrary

__all__ = [
    "GPU_LIBRARIES",
    "ML_DTYPE_BITS",
    "ArrayLibrary",
    "CupyLibrary",
    "DeviceLibrary",
    "NumbaLibrary",
    "NumpyLibrary",
    "PaddleCpuLibrary",
    "PaddleLibrary",
    "SimulatorLibrary",
    "TorchCpuLibrary",
    "TorchLibrary",
    "TorchMetaLibrary",
    "array_library",
    "classify",
    "dlpack_cuda",
    "is_traced_int",
    "library_named",
    "refusal_hint",
    "served_type",
]

# the GPU libraries in the order a caller that has no preference should try them
GPU_LIBRARIES = (TorchLibrary, CupyLibrary, NumbaLibrary, SimulatorLibrary)
_NAMED = {cls.name: cls for cls in (NumpyLibrary, TorchCpuLibrary, *GPU_LIBRARIES)}
_BY_MODULE = {"torch": TorchLibrary, "cupy": CupyLibrary}
# a tensor type of one library whose adapter depends on the device: (CUDA, CPU) adapters
_BY_DEVICE = {
    TorchLibrary: (TorchLibrary, TorchCpuLibrary, TorchMetaLibrary),
    PaddleLibrary: (PaddleLibrary, PaddleCpuLibrary),
}

# Plain dicts, not bounded caches: a process meets a handful of array types and libraries,
# and an entry is never wrong (classify still asks the adapter whether it serves each object).
_ADAPTERS: dict[type, ArrayLibrary] = {}  # adapter class -> its one instance
_SERVED: dict[type, ArrayLibrary] = {}  # array type -> the adapter that served one of its kind


def _adapter(cls):
    adapter = _ADAPTERS.get(cls)
    if adapter is None:
        adapter = _ADAPTERS[cls] = cls()
    return adapter


def _candidate(kind):
    """The one adapter class that could serve objects of type ``kind``."""
    if issubclass(kind, np.ndarray):
        return NumpyLibrary
    if issubclass(kind, fake_cuda_array_type() or ()):
        return SimulatorLibrary
    if issubclass(kind, paddle_tensor_type() or ()):  # (parameters are a subclass)
        return PaddleLibrary
    return _BY_MODULE.get(kind.__module__.partition(".")[0], NumbaLibrary)


def _candidates(kind):
    """The adapter classes that could serve objects of type ``kind`` (a torch or Paddle
    tensor's adapter depends on its device), in the order to ask them."""
    cls = _candidate(kind)
    return _BY_DEVICE.get(cls, (cls,))


def classify(x):
    """The adapter that serves ``x``, or None when no supported library does.

    Parameters
    ----------
    x : object
        Any object; nothing is imported to look at it.

    Returns
    -------
    ArrayLibrary or None
        A NumPy array gets the NumPy adapter; a torch CUDA tensor, a Paddle GPU tensor, a
        CuPy array, a simulated device array, or any other object with
        ``__cuda_array_interface__`` (numba device arrays among them) gets its library's
        adapter, and so does a torch or Paddle CPU tensor (a host array, which the torch
        custom ops and the Paddle front hand to the CPU backend as a NumPy view). Everything
        else (an object known only through DLPack, a list, a Paddle tensor on another place)
        gets None.
    """
    adapter = _SERVED.get(type(x))
    if adapter is not None and adapter.serves(x):
        return adapter
    for cls in _candidates(type(x)):
        if cls.serves(x):
            adapter = _SERVED[type(x)] = _adapter(cls)
            return adapter
    return None


def array_library(x):
    """The adapter of an array that :func:`classify` accepts, looked up by its type.

    For arrays that dispatch has already classified (every argument of a call that got this
    far): the lookup by type costs a dict access and the adapter's cheap ``serves`` check.

    Raises
    ------
    TypeError
        If no adapter serves ``x``.
    """
    adapter = _SERVED.get(type(x))
    if adapter is None or not adapter.serves(x):  # (torch tensors: one type, two adapters)
        adapter = classify(x)
    if adapter is None:
        raise TypeError(
            f"no array library of moe-numba serves {type(x).__module__}.{type(x).__name__}"
        )
    return adapter


def refusal_hint(name, x):
    """What to pass instead of ``x``, an object :func:`classify` refuses ("" when there is
    nothing to suggest); ``name`` is the argument's name."""
    if dlpack_cuda(x):
        return (
            " (a CUDA array known only through DLPack: pass it as a torch tensor or a CuPy "
            f"array, e.g. torch.from_dlpack({name}) or cupy.from_dlpack({name}))"
        )
    return ""


# served_type(kind): the adapter that has served an object of type ``kind``, or None. The
# per-call key's lookup (a bound dict.get, called for every array of every call): it answers
# only for types classify has accepted before.
served_type = _SERVED.get


def library_named(name):
    """The adapter of the library called ``name``.

    Parameters
    ----------
    name : str
        ``"numpy"``, ``"torch"``, ``"cupy"``, ``"numba"`` or ``"cudasim"``. With the CUDA
        simulator on, numba's device arrays are the simulator's, so ``"numba"`` names those.

    Raises
    ------
    ValueError
        For another name.
    """
    if name == "numba":
        from numba import config

        if config.ENABLE_CUDASIM:
            name = "cudasim"
    try:
        return _adapter(_NAMED[name])
    except KeyError:
        raise ValueError(
            f"library must be one of {', '.join(sorted(_NAMED))}; got {name!r}"
        ) from None


def is_traced_int(x):
    """Whether ``x`` is an int that a compiler traces (torch.compile's ``torch.SymInt``): its
    value is unknown while tracing, so the contract's checks let it through then (the
    compiled code runs them on the value it gets)."""
    kind = loaded_type("torch", "SymInt")
    return kind is not None and isinstance(x, kind)
