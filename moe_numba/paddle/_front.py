"""The Paddle front: Paddle tensors -> the core -> Paddle tensors.

:func:`call` is the one way from Paddle tensors into the core. CPU tensors cross to the CPU
backend as NumPy views and its outputs are Paddle tensors that it wrote through NumPy views
(:mod:`._bridge`): no copy in or out. GPU tensors go to the GPU backend as they are: the
Paddle adapter (:mod:`moe_numba._libraries._paddle`) gives the kernels their addresses,
allocates the outputs with Paddle's allocator and names Paddle's current stream.

``_CORE`` holds the core's entry for each op, one small function each; every other module of
this package reaches the core through :func:`call` only.
"""

from .. import _core
from .._contract_sort import SortArrays
from ._bridge import HOST, TENSOR, PaddleAllocator, check_tensors, host_views, on_host

# Each entry: ``entry(tensors, arrays, scalars, capacities, empty) -> outputs``. The core's
# checks (metadata, contiguity, location, device) read ``tensors``, the call's Paddle tensors
# (through the Paddle adapters); the backend runs on ``arrays``, the same tensors or their
# NumPy views; ``empty`` allocates the outputs (None: the arrays' library).


def _permute(tensors, arrays, scalars, capacities, empty):
    backend, plan = _core.planned_permute(tensors, scalars, capacities)
    return _core.run_permute(backend, plan, arrays, scalars["validate"], empty)


def _unpermute(tensors, arrays, scalars, capacities, empty):
    backend, plan = _core.planned_unpermute(tensors, scalars)
    return _core.run_unpermute(backend, plan, arrays, scalars["validate"], empty)


def _permute_backward(tensors, arrays, scalars, capacities, empty):
    backend, plan = _core.planned_permute_backward(tensors, scalars)
    return _core.run_permute_backward(backend, plan, arrays, scalars["validate"], empty)


def _unpermute_backward(tensors, arrays, scalars, capacities, empty):
    backend, plan = _core.planned_unpermute_backward(tensors, scalars)
    return _core.run_unpermute_backward(backend, plan, arrays, scalars["validate"], empty)


def _sort_chunks(tensors, arrays, scalars, capacities, empty):
    # (the core checks a sort on the arrays it runs on; sizes in an array are device sizes)
    x, probs, device_sizes = arrays
    sizes = scalars["split_sizes"] if device_sizes is None else device_sizes
    validate = scalars["validate"]
    return _core.sort_chunks(x, sizes, scalars["order"], probs, validate=validate, empty=empty)


_CORE = {
    "permute": _permute,
    "unpermute": _unpermute,
    "permute_backward": _permute_backward,
    "unpermute_backward": _unpermute_backward,
    "sort_chunks": _sort_chunks,
}


def call(op, arrays, scalars, capacities=None):
    """``op``'s outputs on Paddle tensors, as Paddle tensors on the arrays' place.

    Parameters
    ----------
    op : str
        ``"permute"``, ``"unpermute"``, ``"permute_backward"``, ``"unpermute_backward"`` or
        ``"sort_chunks"``.
    arrays : NamedTuple
        The op's arrays (``PermuteArrays``, ...; ``SortArrays`` for a sort, whose
        ``split_sizes`` is a tensor of sizes on the GPU or None).
    scalars : dict
        The op's other arguments by name, as the core takes them (a sort's: ``split_sizes``
        on the host, ``order``, ``validate``).
    capacities : sequence of int, optional
        A permute's ``tokens_per_expert``.

    Returns
    -------
    tuple
        The op's returned tuple (the gradient ops' absent gradients None); for a sort
        ``(y, probs_y or None, lengths)``, ``lengths`` the rows each position of ``y`` got.

    Raises
    ------
    TypeError
        An array that is no Paddle tensor moe-numba serves (:func:`._bridge.check_tensors`),
        or the core's errors.
    ValueError
        The core's errors.
    """
    check_tensors(arrays)
    entry = _CORE[op]
    if not on_host(arrays):  # (GPU tensors, or a mixture that the core refuses by name)
        return tuple(entry(arrays, arrays, scalars, capacities, None))
    allocate = PaddleAllocator()
    outputs = entry(arrays, host_views(arrays), scalars, capacities, allocate)
    return tuple(None if x is None else allocate.tensor(x) for x in outputs)


def sort_arrays(x, split_sizes, probs):
    """``(arrays, host sizes)`` of a sort: sizes in a Paddle tensor on a GPU stay there (one
    of the arrays, read on the device); sizes in a CPU tensor are a host sequence, as a
    list is (their NumPy view)."""
    if not isinstance(split_sizes, TENSOR):
        return SortArrays(x, probs, None), split_sizes
    if split_sizes.place.is_cpu_place():
        return SortArrays(x, probs, None), HOST.host_view(split_sizes)
    return SortArrays(x, probs, split_sizes), None
