"""The rules of ``moe_sort_chunks`` (docs/expert_parallel.rst): checks, plan, error wording.

``x[:S]`` (S = the sum of ``split_sizes``) is cut into chunks of ``split_sizes[c]`` rows,
chunk ``c`` starting at row ``sum(split_sizes[:c])``; ``y[:S]`` is those chunks in the order
``order``, ``y[S:]`` is ``x[S:]``. Host sizes (a sequence or NumPy array) and the order are
checked here, before any work. Sizes held in a CUDA array are checked by the kernels: they
report what they find in status words (``abi.SORT_*``) that :func:`raise_for_sort_status`
words exactly like the host check. With ``validate=False`` bad device sizes follow
:data:`BAD_SIZES_RULE`.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np

from . import abi
from ._contract import FLOAT32, ROUTEMAP_DTYPES, check_bool, check_dtype, check_ndim, check_shape
from ._libraries import classify, dlpack_cuda, is_traced_int

BAD_SIZES_RULE = (
    "a negative size counts as 0, and the chunks are cut where the rows of x end: a chunk "
    "that starts past the last row is empty, one that crosses it ends there"
)


class SortArrays(NamedTuple):
    """The array arguments of one ``moe_sort_chunks`` call (``split_sizes`` only when it is a
    CUDA array: host sizes are one of its :class:`SortScalars`)."""

    x: object
    probs: object | None
    split_sizes: object | None


class SortScalars(NamedTuple):
    """The other arguments of one ``moe_sort_chunks`` call: the order and the host sizes,
    tuples of ints once :func:`host_values` has read them. As the public function gives them
    they are what the caller passed (any host sequence; the sizes possibly a CUDA array,
    which :func:`host_values` moves to the call's arrays)."""

    order: tuple[int, ...]
    host_split_sizes: tuple[int, ...] | None
    validate: bool = True


def host_values(arrays, scalars):
    """``(arrays, scalars)`` of a call as the core takes them: sizes in a CUDA array are one
    of its arrays (the kernels read and check them there, with no host round trip), host
    sizes (given as either) and the order are tuples of ints (:func:`host_ints`)."""
    sizes = scalars.host_split_sizes if arrays.split_sizes is None else arrays.split_sizes
    order = host_ints("order", scalars.order)
    if is_device_array(sizes):
        arrays, host_sizes = arrays._replace(split_sizes=sizes), None
    else:
        arrays, host_sizes = arrays._replace(split_sizes=None), host_ints("split_sizes", sizes)
    return arrays, scalars._replace(order=order, host_split_sizes=host_sizes)


class SortPlan(NamedTuple):
    """Shapes of one ``moe_sort_chunks`` call, decided from metadata alone."""

    num_rows: int  # N
    hidden: int
    dtype: np.dtype
    num_chunks: int  # C
    order: np.ndarray  # int64 [C]
    sizes: np.ndarray | None  # int64 [C], checked; None when the sizes are on the device
    sizes_dtype: np.dtype  # int64 for host sizes, the device array's dtype otherwise
    has_probs: bool
    validate: bool

    runs = True  # (every call runs: see BackwardPlan.runs)

    @property
    def checks_sizes(self):
        """Whether the kernels check the sizes: they are on the device and the caller
        validates (host sizes were checked before the call)."""
        return self.validate and self.sizes is None

    @property
    def row_bytes(self):
        """Bytes of one row of ``x``."""
        return self.hidden * self.dtype.itemsize


def is_device_array(x):
    """Whether ``x`` is a CUDA array that an adapter serves (sizes the kernels read there)."""
    library = classify(x)
    return library is not None and library.location == "cuda"


def host_ints(name, values):
    """A host sequence of ints (list, tuple, NumPy or torch CPU array) as a tuple of ints.

    Raises ``TypeError`` for a CUDA array, a non-integer dtype or a value outside int64, and
    ``ValueError`` for a shape other than 1-D.
    """
    if values is None or isinstance(values, (str, bytes)):
        raise TypeError(f"{name} must be a sequence of ints; got {type(values).__name__}")
    if is_device_array(values) or dlpack_cuda(values):
        raise TypeError(
            f"{name} must be a host sequence of ints (list, tuple, NumPy array or torch CPU "
            f"tensor); got a CUDA array ({type(values).__name__})"
        )
    if isinstance(values, (list, tuple)) and all(
        isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) for v in values
    ):
        # checked as the ints given (NumPy turns 2**63 next to a small int into a float)
        for c, v in enumerate(values):
            if not -(2**63) <= int(v) < 2**63:
                raise ValueError(
                    f"{name} must be at most 2**63 - 1 (int64); got {name}[{c}] = {int(v)}"
                )
    try:
        array = np.asarray(values)
    except Exception as error:  # e.g. a ragged nested list
        raise TypeError(f"{name} must be a sequence of ints; got {values!r}") from error
    if array.dtype == np.bool_ or not (np.issubdtype(array.dtype, np.integer) or array.size == 0):
        raise TypeError(
            f"{name} must hold ints (int64 range); got dtype {array.dtype} "
            f"({type(values).__name__})"
        )
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D [num_chunks]; got shape {array.shape}")
    if array.size and array.dtype.kind == "u" and array.max() > np.iinfo(np.int64).max:
        c = int(np.argmax(array))
        raise ValueError(
            f"{name} must be at most 2**63 - 1 (int64); got {name}[{c}] = {int(array[c])}"
        )
    return tuple(array.astype(np.int64).tolist())


def sizes_status(sizes, num_rows):
    """The status words (``abi.SORT_*``) of int64 ``sizes`` for ``num_rows`` rows."""
    status = np.full(abi.SORT_STATUS_LEN, -1, dtype=np.int64)
    negative = np.flatnonzero(sizes < 0)
    if negative.size:
        status[abi.SORT_BAD_SIZE] = negative[0]
        status[abi.SORT_BAD_SIZE_VALUE] = sizes[negative[0]]
    # clamped to N + 1 so that the starts cannot overflow; every start up to the first
    # chunk past the end is still exact
    counted = np.minimum(np.maximum(sizes, 0), num_rows + 1)
    starts = np.cumsum(counted) - counted
    past = np.flatnonzero(np.maximum(sizes, 0) > num_rows - starts)
    if past.size:
        c = past[0]
        status[abi.SORT_PAST_END] = c
        status[abi.SORT_PAST_END_SIZE] = sizes[c]
        status[abi.SORT_PAST_END_START] = starts[c]
    return status


def _check_order(order, num_chunks):
    """``order`` (tuple of ints) must be a permutation of ``range(num_chunks)``."""
    if len(order) != num_chunks:
        raise ValueError(
            f"order must hold num_chunks = {num_chunks} values (one per entry of "
            f"split_sizes); got {len(order)}"
        )
    values = np.asarray(order, dtype=np.int64)
    if np.array_equal(np.sort(values), np.arange(num_chunks)):
        return values
    seen = {}
    for i, c in enumerate(order):
        if not 0 <= c < num_chunks:
            raise ValueError(
                f"order must be a permutation of range(num_chunks = {num_chunks}); order[{i}] "
                f"= {c} is not a chunk index"
            )
        if c in seen:
            raise ValueError(
                f"order must be a permutation of range(num_chunks = {num_chunks}); order[{i}] "
                f"= {c} repeats order[{seen[c]}]"
            )
        seen[c] = i
    raise AssertionError("unreachable: a non-permutation has a bad or repeated entry")


def check_sort_metadata(arrays, scalars: SortScalars):
    """Check a ``moe_sort_chunks`` call and plan it.

    ``arrays`` is a :class:`SortArrays` of :class:`~._contract.ArrayMeta` (``split_sizes``
    None for host sizes); ``scalars`` its :class:`SortScalars` after :func:`host_values`.
    Host sizes are checked here (a negative size, or more rows than ``x`` has:
    ``ValueError``).
    """
    validate = check_bool("validate", scalars.validate)
    order, host_sizes = scalars.order, scalars.host_split_sizes
    x_shape, dtype = arrays.x
    check_ndim("x", x_shape, 2, "[rows, hidden]")
    if dtype is None or dtype.hasobject or dtype.itemsize == 0:
        raise TypeError(f"x must have a fixed-size numeric dtype; got {dtype}")
    num_rows, hidden = x_shape
    if arrays.probs is not None:
        probs_shape, probs_dtype = arrays.probs
        check_dtype("probs", probs_dtype, FLOAT32)
        check_shape("probs", probs_shape, (num_rows,), "[rows] (the rows of x)")
    traced = any(is_traced_int(v) for v in (*order, *(host_sizes or ())))
    if arrays.split_sizes is not None:
        sizes_shape, sizes_dtype = arrays.split_sizes
        check_ndim("split_sizes", sizes_shape, 1, "[num_chunks]")
        check_dtype("split_sizes", sizes_dtype, ROUTEMAP_DTYPES)
        num_chunks, sizes = sizes_shape[0], None
    else:
        num_chunks, sizes_dtype = len(host_sizes), np.dtype(np.int64)
        # (traced sizes are checked when the compiled code runs)
        sizes = None if traced else np.asarray(host_sizes, dtype=np.int64).reshape(-1)
    order = np.asarray(order, dtype=object) if traced else _check_order(order, num_chunks)
    plan = SortPlan(
        num_rows=num_rows,
        hidden=hidden,
        dtype=dtype,
        num_chunks=num_chunks,
        order=order,
        sizes=sizes,
        sizes_dtype=sizes_dtype,
        has_probs=arrays.probs is not None,
        validate=validate,
    )
    if sizes is not None:
        raise_for_sort_status(sizes_status(sizes, num_rows), plan)
    return plan


def raise_for_sort_status(status, plan: SortPlan):
    """Raise the ``ValueError`` that ``status`` (``abi.SORT_*``) reports, if any."""
    if status[abi.SORT_BAD_SIZE] >= 0:
        raise ValueError(
            f"split_sizes must be >= 0; got split_sizes[{int(status[abi.SORT_BAD_SIZE])}] = "
            f"{int(status[abi.SORT_BAD_SIZE_VALUE])}"
        )
    if status[abi.SORT_PAST_END] >= 0:
        raise ValueError(
            f"split_sizes must sum to at most the rows of x ({plan.num_rows}); got "
            f"split_sizes[{int(status[abi.SORT_PAST_END])}] = "
            f"{int(status[abi.SORT_PAST_END_SIZE])} starting at row "
            f"{int(status[abi.SORT_PAST_END_START])}"
        )


def inverse_order(order):
    """The order that undoes ``order`` (``inverse[order[i]] = i``), as a tuple of ints."""
    inverse = [0] * len(order)
    for i, c in enumerate(order):
        inverse[c] = i
    return tuple(inverse)
