"""Paddle tensors as the core reads them: every array checked to be a Paddle tensor the
library serves, CPU tensors as NumPy views and outputs as Paddle tensors behind NumPy views
(no copy either way).

CPU tensors cross through DLPack (``numpy.from_dlpack``): Paddle tensors have no
``__array_interface__``, and ``Tensor.numpy()`` copies. DLPack carries no bfloat16 or float8
to NumPy, so those tensors cross as their bits (``Tensor.view(paddle.int16)`` or
``paddle.uint8``, a view of the same memory) and are re-labelled with the ``ml_dtypes``
dtype on the NumPy side.
"""

import paddle

from .._libraries import PaddleCpuLibrary

TENSOR = paddle.Tensor
_VALUE = paddle.pir.Value  # a tensor of a static graph (paddle.jit.to_static, paddle.static)
# the adapter of Paddle's CPU tensors: the dtype table and the NumPy views
HOST = PaddleCpuLibrary()


def _name_of(x):
    return f"{type(x).__module__}.{type(x).__name__}"


def check_eager(arrays):
    """No array of ``arrays`` (an op's arrays NamedTuple) a static graph's tensor:
    ``TypeError`` naming the first that is."""
    for name, x in arrays._asdict().items():
        if isinstance(x, _VALUE):
            raise TypeError(
                f"{name} is a tensor of a static graph ({_name_of(x)}), as "
                "paddle.jit.to_static(full_graph=True) and paddle.static make: moe-numba runs "
                "on eager tensors only. Call it outside the static graph, or use to_static's "
                "default (full_graph=False), which runs this call eagerly"
            )


def check_tensors(arrays):
    """Every array of ``arrays`` (an op's arrays NamedTuple; None entries skipped) an eager
    Paddle tensor on the CPU or a GPU: ``TypeError`` naming the first that is not."""
    check_eager(arrays)
    named = {name: x for name, x in arrays._asdict().items() if x is not None}
    # (the public functions send a call here for a Paddle tensor among its arrays)
    first = next(name for name, x in named.items() if isinstance(x, TENSOR))
    for name, x in named.items():
        if not isinstance(x, TENSOR):
            raise TypeError(
                f"{first} is a paddle.Tensor but {name} is a {_name_of(x)}: pass every array "
                "as a Paddle tensor (on one place), or none"
            )
        place = x.place
        if not (place.is_cpu_place() or place.is_gpu_place()):
            raise TypeError(
                f"{name} is on {place}: moe-numba serves Paddle tensors on the CPU place or a "
                "GPU place"
            )


def as_numpy(tensor):
    """A NumPy array sharing the memory of a CPU Paddle tensor: the view moe-numba's CPU
    backend runs on.

    Parameters
    ----------
    tensor : paddle.Tensor
        On the CPU place, of any dtype (all of Paddle's have a NumPy or ``ml_dtypes`` type);
        strided views too.

    Returns
    -------
    numpy.ndarray
        The tensor's memory (no copy: writes go to the tensor), with its shape, strides and
        dtype; bfloat16 and float8 as ``ml_dtypes`` dtypes (``Tensor.numpy()`` copies, and
        gives their bits as integers).

    Raises
    ------
    TypeError
        ``tensor`` is no Paddle tensor, or not on the CPU.

    Examples
    --------
    >>> import paddle
    >>> from moe_numba.paddle import as_numpy
    >>> x = paddle.to_tensor([1.5, -2.0]).astype("bfloat16")
    >>> view = as_numpy(x)
    >>> view.dtype.name, view.astype("float32").tolist()
    ('bfloat16', [1.5, -2.0])
    >>> view.ctypes.data == x.data_ptr()
    True
    """
    if not isinstance(tensor, TENSOR):
        raise TypeError(f"tensor must be a paddle.Tensor; got {_name_of(tensor)}")
    if not tensor.place.is_cpu_place():
        raise TypeError(
            f"tensor must be on the CPU place; got one on {tensor.place} (tensor.cpu() copies "
            "it to the host)"
        )
    return HOST.host_view(tensor)


def on_host(arrays):
    """Whether every tensor of ``arrays`` is on the CPU (the call then runs on NumPy views)."""
    return all(x is None or x.place.is_cpu_place() for x in arrays)


def host_views(arrays):
    """``arrays`` with a NumPy view of each CPU tensor (None stays None)."""
    return arrays._make(None if x is None else HOST.host_view(x) for x in arrays)


class PaddleAllocator:
    """An ``empty(shape, dtype)`` for the CPU backend whose arrays are views of Paddle tensors.

    The backend writes its outputs into those views; :meth:`tensor` gives back the Paddle
    tensor behind each, so the outputs come from Paddle's allocator and are never copied.
    """

    def __init__(self):
        self._made = {}  # id(view) -> (view, tensor); the view is kept so its id stays unique

    def __call__(self, shape, dtype):
        tensor = paddle.empty(list(shape), dtype=HOST.paddle_dtype(dtype), device="cpu")
        view = HOST.host_view(tensor)
        self._made[id(view)] = (view, tensor)
        return view

    def tensor(self, array):
        """The Paddle tensor behind ``array``, a view this allocator made."""
        return self._made[id(array)][1]
