"""torch tensors as the core reads them: CPU tensors as NumPy arrays and back, sharing memory
(no copy either way), the contract's metadata of any tensor (fake and meta ones too), and an
op run on tensors.

torch's NumPy bridge knows no bfloat16 or float8: those tensors cross as their bits (int16 or
uint8) and are re-labelled with the ``ml_dtypes`` dtype on the other side. A tensor that
autograd records crosses detached: the core only reads its memory, and autograd records the
call around it.
"""

import functools

import ml_dtypes
import numpy as np
import torch

from .. import _core
from .._contract import ArrayMeta
from .._libraries._torch import TorchLibrary

# torch dtype -> (the integer dtype its bits cross as, the ml_dtypes dtype on the NumPy side)
_BITS = {
    torch.bfloat16: (torch.int16, np.dtype(ml_dtypes.bfloat16)),
    torch.float8_e4m3fn: (torch.uint8, np.dtype(ml_dtypes.float8_e4m3fn)),
    torch.float8_e5m2: (torch.uint8, np.dtype(ml_dtypes.float8_e5m2)),
}
_TORCH_OF_NUMPY = {numpy_dtype: dtype for dtype, (_, numpy_dtype) in _BITS.items()}
FLOAT8 = frozenset((torch.float8_e4m3fn, torch.float8_e5m2))
# every torch dtype that moe-numba serves, with the NumPy dtype the contract reads (the torch
# adapter's table: the one place that knows it)
NUMPY_OF_TORCH = TorchLibrary().to_numpy


def check_dtypes(arrays):
    """Every tensor of ``arrays`` (an op's arrays NamedTuple) of a dtype moe-numba serves:
    ``TypeError`` naming the argument and its dtype otherwise (torch has dtypes that NumPy and
    the kernels know nothing of, e.g. ``float8_e4m3fnuz``)."""
    for name, x in zip(arrays._fields, arrays, strict=True):
        if isinstance(x, torch.Tensor) and x.dtype not in NUMPY_OF_TORCH:
            served = ", ".join(sorted(str(d) for d in NUMPY_OF_TORCH))
            raise TypeError(
                f"{name} has dtype {x.dtype}, which moe-numba does not serve (served: {served})"
            )


def metadata(arrays):
    """The contract's :class:`~moe_numba._contract.ArrayMeta` of each tensor of ``arrays``
    (None stays None), read from the tensors alone: it serves fake, meta and traced tensors,
    whose memory nobody may read."""
    return arrays._make(
        None if x is None else ArrayMeta(tuple(x.shape), NUMPY_OF_TORCH.get(x.dtype))
        for x in arrays
    )


def to_numpy(tensor):
    """A NumPy view of a CPU tensor (``None`` stays ``None``)."""
    if tensor is None:
        return None
    tensor = tensor.detach()
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
        # (on the CPU whatever torch.set_default_device says: these are CPU outputs)
        tensor = torch.empty(tuple(shape), dtype=torch_dtype(dtype), device="cpu")
        view = to_numpy(tensor)
        self._tensors[id(view)] = (view, tensor)
        return view

    def tensor(self, array):
        """The tensor behind an array this allocator made; any other array is wrapped."""
        entry = self._tensors.get(id(array))
        if entry is not None and entry[0] is array:
            return entry[1]
        return from_numpy(array)


def run_on_tensors(op, backend, plan, arrays):
    """``op``'s outputs (its NamedTuple, None where not asked for) of a call that
    :func:`moe_numba._core.prepare` has checked, on tensors: CUDA tensors as they are; CPU
    tensors as NumPy views, the outputs allocated by torch. The first tensor decides the
    device."""
    like = next(x for x in arrays if x is not None)
    if like.device.type != "cpu":
        return _core.run(op, backend, plan, arrays)
    allocate = TorchAllocator()
    outputs = _core.run(op, backend, plan, arrays._make(map(to_numpy, arrays)), allocate)
    return outputs._make(None if x is None else allocate.tensor(x) for x in outputs)


def stand_ins(outputs, like):
    """``outputs`` (an op's NamedTuple) with an empty float32 tensor on ``like``'s device for
    each output that is None: a custom op returns a fixed number of tensors (one stand-in
    each: an op's outputs may not alias each other)."""
    return tuple(like.new_empty((0,), dtype=torch.float32) if x is None else x for x in outputs)


def asked_outputs(op, tensors, arrays, scalars):
    """``op``'s outputs NamedTuple from the tensors its custom op returned: None for each
    output the call did not ask for (its stand-in)."""
    asked = op.asked(arrays, scalars)
    return op.outputs._make(x if want else None for x, want in zip(tensors, asked, strict=True))
