"""Paddle tensors -> the core -> Paddle tensors.

:func:`outputs` is the one way from Paddle tensors into the core, for every op (its
declaration, :mod:`moe_numba.ops`). The core's checks (metadata, location, contiguity,
device) read the Paddle tensors themselves, through the Paddle adapters. CPU tensors then
cross to the CPU backend as NumPy views and its outputs are Paddle tensors that it wrote
through NumPy views (:mod:`._bridge`): no copy in or out. GPU tensors go to the GPU backend as
they are: the Paddle adapter (:mod:`moe_numba._libraries._paddle`) gives the kernels their
addresses, allocates the outputs with Paddle's allocator and names Paddle's current stream.
"""

from .. import _core
from ._bridge import PaddleAllocator, check_tensors, host_views, on_host


def outputs(op, arrays, scalars, capacities=None):
    """``op``'s outputs NamedTuple (None where not asked for) of a call on Paddle tensors, as
    Paddle tensors on the arrays' place.

    Parameters
    ----------
    op : moe_numba.ops.Op
        The op.
    arrays, scalars : NamedTuple
        The op's arrays and scalars, after ``op.host_values`` where it has one.
    capacities : sequence of int, optional
        A permute's ``tokens_per_expert``.

    Raises
    ------
    TypeError
        An array that is no Paddle tensor moe-numba serves (:func:`._bridge.check_tensors`),
        or the core's errors.
    ValueError
        The core's errors.
    """
    check_tensors(arrays)
    backend, plan = _core.prepare(op, arrays, scalars, capacities)
    if not on_host(arrays):  # (GPU tensors: the kernels read them as they are)
        return _core.run(op, backend, plan, arrays)
    allocate = PaddleAllocator()
    out = _core.run(op, backend, plan, host_views(arrays), allocate)
    return out._make(None if x is None else allocate.tensor(x) for x in out)
