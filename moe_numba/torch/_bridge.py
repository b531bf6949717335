"""torch CPU tensors as NumPy arrays and back, sharing memory (no copy either way).

torch's NumPy bridge knows no bfloat16 or float8: those tensors cross as their bits (int16 or
uint8) and are re-labelled with the ``ml_dtypes`` dtype on the other side.
"""

import functools

import ml_dtypes
import numpy as np
import torch

# torch dtype -> (the integer dtype its bits cross as, the ml_dtypes dtype on the NumPy side)
_BITS = {
    torch.bfloat16: (torch.int16, np.dtype(ml_dtypes.bfloat16)),
    torch.float8_e4m3fn: (torch.uint8, np.dtype(ml_dtypes.float8_e4m3fn)),
    torch.float8_e5m2: (torch.uint8, np.dtype(ml_dtypes.float8_e5m2)),
}
_TORCH_OF_NUMPY = {numpy_dtype: dtype for dtype, (_, numpy_dtype) in _BITS.items()}
FLOAT8 = frozenset((torch.float8_e4m3fn, torch.float8_e5m2))


def to_numpy(tensor):
    """A NumPy view of a CPU tensor (``None`` stays ``None``)."""
    if tensor is None:
        return None
    bits = _BITS.get(tensor.dtype)
    if bits is None:
        return tensor.numpy()
    return tensor.view(bits[0]).numpy().view(bits[1])


def from_numpy(array):
    """A CPU tensor sharing the memory of a NumPy array (``None`` stays ``None``)."""
    if array is None:
        return None
    dtype = _TORCH_OF_NUMPY.get(array.dtype)
    if dtype is None:
        return torch.from_numpy(array)
    return torch.from_numpy(array.view(np.int16 if array.itemsize == 2 else np.uint8)).view(dtype)


@functools.cache
def torch_dtype(numpy_dtype):
    """The torch dtype of a NumPy (or ``ml_dtypes``) dtype."""
    numpy_dtype = np.dtype(numpy_dtype)
    dtype = _TORCH_OF_NUMPY.get(numpy_dtype)
    return dtype if dtype is not None else torch.from_numpy(np.empty(0, numpy_dtype)).dtype


class TorchAllocator:
    """An ``empty(shape, dtype)`` for the CPU backend whose arrays are views of torch tensors.

    The backend writes its outputs into those views; :meth:`tensor` gives back the tensor
    behind each, so the outputs come from torch's allocator and are never copied.
    """

    def __init__(self):
        self._tensors = {}  # id(view) -> (view, tensor); the view is kept so its id stays unique

    def __call__(self, shape, dtype):
        tensor = torch.empty(tuple(shape), dtype=torch_dtype(dtype))
        view = to_numpy(tensor)
        self._tensors[id(view)] = (view, tensor)
        return view

    def tensor(self, array):
        """The tensor behind an array this allocator made; any other array is wrapped."""
        entry = self._tensors.get(id(array))
        if entry is not None and entry[0] is array:
            return entry[1]
        return from_numpy(array)
