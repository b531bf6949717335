"""What the GPU backend sees of a CUDA array: its address and size, never its library."""

from __future__ import annotations

import numpy as np


class DeviceBuffer:
    """A C-contiguous CUDA array reduced to what a kernel launch needs.

    Parameters
    ----------
    ptr : int
        Device address of the first element (may be 0 when ``nbytes == 0``).
    nbytes : int
        Size of the array in bytes.
    sim_array : numpy.ndarray or None
        Under the CUDA simulator only: the host array that backs the simulated device array.
        Simulated kernels index it like device memory.
    """

    __slots__ = ("nbytes", "ptr", "sim_array")

    def __init__(self, ptr: int, nbytes: int, sim_array: np.ndarray | None = None):
        self.ptr = ptr
        self.nbytes = nbytes
        self.sim_array = sim_array

    def kernel_arg(self, dtype):
        """The argument to pass for a 1-D pointer parameter of element type ``dtype``.

        On a GPU this is the raw address (the kernels take ``CPointer`` parameters); in the
        simulator it is a flat view of the backing array with that element type.
        """
        if self.sim_array is None:
            return self.ptr
        return self.sim_array.reshape(-1).view(np.uint8).view(dtype)


def carve(alloc, parts):
    """One scratch allocation split into consecutive arrays; their kernel arguments.

    Parameters
    ----------
    alloc : callable
        ``alloc(nbytes)`` returns a :class:`DeviceBuffer` of at least ``nbytes`` bytes.
    parts : sequence of (int, numpy.dtype)
        Element count and type of each array, in order; order them by falling alignment
        (every part starts where the one before ends).

    Returns
    -------
    list
        Per part, the argument for a pointer parameter of its type (see
        :meth:`DeviceBuffer.kernel_arg`).
    """
    buf = alloc(sum(count * dtype.itemsize for count, dtype in parts))
    sim = None if buf.sim_array is None else buf.sim_array.reshape(-1).view(np.uint8)
    args = []
    offset = 0
    for count, dtype in parts:
        nbytes = count * dtype.itemsize
        args.append(buf.ptr + offset if sim is None else sim[offset : offset + nbytes].view(dtype))
        offset += nbytes
    return args
