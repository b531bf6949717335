"""The public ``moe_sort_chunks``: its op's arrays and scalars to the front of the arrays'
library (as :mod:`moe_numba._api`)."""

from __future__ import annotations

from collections.abc import Sequence

from ._api import Array
from ._contract_sort import SortArrays, SortScalars
from ._fronts import front_of
from .ops import SORT_CHUNKS


def moe_sort_chunks(
    x: Array,
    split_sizes: Sequence[int] | Array,
    order: Sequence[int],
    probs: Array | None = None,
    *,
    validate: bool = True,
) -> tuple[Array, Array | None]:
    """Reorder chunks of rows: the row exchange of expert parallelism.

    ``x[:S]``, where ``S = sum(split_sizes)``, is cut into consecutive chunks of
    ``split_sizes[c]`` rows; ``y[:S]`` is those chunks concatenated in the order ``order``
    (``y`` starts with chunk ``order[0]``), and ``y[S:]`` is ``x[S:]``. Rows are copied as
    raw bytes, whatever their dtype; ``probs`` travels with them. After an
    ``all_to_all`` that delivers rows grouped by source rank and then by expert, this puts
    them in expert order (Megatron-Core's ``sort_chunks_by_idxs``).

    Parameters
    ----------
    x : array of shape (N, H)
        The rows, any fixed-size dtype (bfloat16, float8, integers, ...).
    split_sizes : sequence of C ints, or CUDA array of shape (C,), int32 or int64
        Rows per chunk. A host sequence is checked before any work; sizes on the GPU are
        checked there (see ``validate``), with no host round trip before the copy.
    order : sequence of C ints
        A permutation of ``range(C)``: the chunk that goes to each position of ``y``.
    probs : array of shape (N,), float32, optional
        Per-row values reordered like the rows (routing probabilities).
    validate : bool, default True
        For sizes on the GPU: check them there and raise like the host check, reading one
        status word block (the call's only device-to-host sync). With False nothing is
        synchronised and bad sizes follow a fixed rule: a negative size counts as 0, and
        the chunks are cut where the rows of ``x`` end (a chunk that starts past the last
        row is empty, one that crosses it ends there); nothing is read or written out of
        bounds.

    Returns
    -------
    y : array of shape (N, H)
        The reordered rows, dtype of ``x``.
    probs_y : array of shape (N,), float32, or None
        ``probs`` reordered like the rows; None when ``probs`` is None.

    Raises
    ------
    TypeError
        Wrong type, dtype or array location (host and device arrays mixed).
    ValueError
        Wrong shape; ``order`` not a permutation of ``range(C)``; a negative size, or sizes
        that sum to more than N.

    Notes
    -----
    The gradient is the inverse sort: ``moe_sort_chunks(dy, [split_sizes[c] for c in
    order], inverse)`` with ``inverse[order[i]] = i``. Called with torch tensors the
    function is a differentiable torch custom op that does exactly that.

    Examples
    --------
    >>> import numpy as np
    >>> from moe_numba import moe_sort_chunks
    >>> x = np.arange(6, dtype=np.float32).reshape(6, 1)
    >>> y, _ = moe_sort_chunks(x, [2, 1, 2], [2, 0, 1])
    >>> y.ravel()
    array([3., 4., 0., 1., 2., 5.], dtype=float32)
    """
    # (sizes in a CUDA array become one of the call's arrays in the front: see
    # moe_numba._contract_sort.host_values)
    arrays = SortArrays(x=x, probs=probs, split_sizes=None)
    scalars = SortScalars(order=order, host_split_sizes=split_sizes, validate=validate)
    return front_of(arrays).call(SORT_CHUNKS, arrays, scalars)
