"""The public ``moe_permute`` and ``moe_unpermute``: each builds its op's arrays and scalars
(:mod:`.ops`) and hands them to the front of the arrays' library (:mod:`._fronts`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

from ._contract import PermuteArrays, PermuteScalars, UnpermuteArrays, UnpermuteScalars
from ._fronts import front_of
from .ops import PERMUTE, UNPERMUTE

Array: TypeAlias = Any
"""A NumPy array, or a CUDA array: numba device array, CuPy array, PyTorch CUDA tensor or any
object with ``__cuda_array_interface__``; or a PyTorch CPU tensor. Outputs are of the
caller's kind."""


def moe_permute(
    hidden_states: Array,
    scale: Array | None,
    expert_routemap_topk: Array,
    expert_prob_topk: Array,
    num_experts: int,
    tokens_per_expert: Sequence[int] | None,
    padding_alignment: int,
    do_gather: bool = True,
    using_ue8m0_scale: bool = False,
    return_expert_indices: bool = False,
    override_buffer_size: int = -1,
    name: str | None = None,
    *,
    validate: bool = True,
    return_expert_offsets: bool = False,
) -> tuple[Array, ...]:
    """Copy every (token, expert) pair into an expert-major, padded buffer ("unzip").

    Expert ``e`` owns rows ``offset_e .. offset_e + padded_e - 1`` of the output, where
    ``padded_e = ceil(n_e / padding_alignment) * padding_alignment`` and ``n_e`` is
    ``tokens_per_expert[e]`` (or, under ``override_buffer_size``, the number of tokens the
    routing map sends to ``e``). Its tokens fill those rows in ascending token index; the
    remaining rows are padding, set to zero.

    Parameters
    ----------
    hidden_states : array of shape (T, H)
        Token rows: bfloat16, float16, float32, float8_e4m3fn or float8_e5m2. Rows are
        copied as raw bytes.
    scale : array of shape (T, S) or None
        Per-token scales gathered like the rows: float32, or int32 holding four packed UE8M0
        bytes when ``using_ue8m0_scale=True``. Required for float8 rows with
        ``do_gather=True``.
    expert_routemap_topk : array of shape (T, K), int32 or int64
        Expert id of each top-k slot; -1 marks an empty slot.
    expert_prob_topk : array of shape (T, K), float32
        Routing probability of each slot.
    num_experts : int
        E >= 1.
    tokens_per_expert : sequence of E ints
        Rows reserved for each expert (a capacity). Ignored when
        ``override_buffer_size >= 0``.
    padding_alignment : int
        Each expert's block of rows is padded to a multiple of this many rows (>= 1).
    do_gather : bool, default True
        False skips copying rows: ``hidden_states_unzipped`` is an empty (0, H) array and
        ``scale_unzipped`` an empty (0,) array; the maps are still computed.
    using_ue8m0_scale : bool, default False
        The scale holds packed UE8M0 exponents (int32) instead of float32 values.
    return_expert_indices : bool, default False
        Also return the owning expert of every row.
    override_buffer_size : int, default -1
        If >= 0, allocate exactly this many rows R and count each expert's tokens from the
        routing map on the device (no host round trip). Rows past the needed ones are padding.
    name : str, optional
        Accepted and ignored (PaddlePaddle compatibility).
    validate : bool, default True
        Raise ``ValueError`` for bad values (ids outside [-1, E), an expert named twice by
        one token, counts that differ from ``tokens_per_expert``, ``override_buffer_size``
        too small). On a GPU the host waits for the kernel that checks the routing (not for
        the row copies, which go on after the call returns): the call's only sync. With
        False nothing is checked or synchronised, and bad values follow the documented rules.
    return_expert_offsets : bool, default False
        Also return ``expert_offsets``: where each expert's block ends, computed where the
        rows are (on the device for CUDA arrays, with no host round trip).

    Returns
    -------
    hidden_states_unzipped : array of shape (R, H)
        Expert-major rows, dtype of ``hidden_states``.
    zipped_expertwise_rowmap : array of shape (T, E), int32
        Row holding token t for expert e, or -1.
    token_prob_unzipped : array of shape (R,), float32
        Probability of the slot that filled each row; 0.0 on padding rows.
    scale_unzipped : array of shape (R, S), or empty (0,) float32
        The scale rows, gathered like ``hidden_states_unzipped``.
    expert_indices : array of shape (R,), int32
        Only with ``return_expert_indices=True``: owning expert of each filled row, -1 on
        padding rows.
    expert_offsets : array of shape (E,), int32
        Only with ``return_expert_offsets=True``: ``min(offset_e + padded_e, R)``, the end
        row of expert e's block (its padding included), cut at R; the ``offs`` of a grouped
        GEMM such as ``torch._grouped_mm``. Rows from ``expert_offsets[-1]`` on belong to
        no expert (zero, like padding).

    Raises
    ------
    TypeError
        Wrong type, dtype or array location (host and device arrays mixed).
    ValueError
        Wrong shape or value.

    Examples
    --------
    >>> import numpy as np, ml_dtypes
    >>> from moe_numba import moe_permute
    >>> x = np.arange(6, dtype=np.float32).reshape(3, 2).astype(ml_dtypes.bfloat16)
    >>> routes = np.array([[0, 2], [1, -1], [1, 0]], dtype=np.int32)
    >>> probs = np.full((3, 2), 0.5, dtype=np.float32)
    >>> rows, rowmap, row_probs, _ = moe_permute(x, None, routes, probs, 3, [2, 2, 1], 2)
    >>> rowmap
    array([[ 0, -1,  4],
           [-1,  2, -1],
           [ 1,  3, -1]], dtype=int32)
    """
    arrays = PermuteArrays(hidden_states, scale, expert_routemap_topk, expert_prob_topk)
    # (by position, in the order of its fields: a fraction of the host time of keywords)
    scalars = PermuteScalars(
        num_experts,
        padding_alignment,
        do_gather,
        using_ue8m0_scale,
        return_expert_indices,
        override_buffer_size,
        validate,
        return_expert_offsets,
    )
    return front_of(arrays).call(PERMUTE, arrays, scalars, tokens_per_expert)


def moe_unpermute(
    hidden_states_unzipped: Array,
    zipped_expertwise_rowmap: Array,
    expert_routemap_topk: Array,
    token_prob_unzipped: Array,
    total_zipped_tokens: int,
    num_experts: int,
    using_mix_precision: bool = True,
    using_weighted_combine: bool = False,
    name: str | None = None,
    *,
    validate: bool = True,
) -> tuple[Array, Array]:
    """Sum each token's expert rows back into one row ("zip"); the inverse of moe_permute.

    For token t the rows ``zipped_expertwise_rowmap[t, e] >= 0`` are combined in ascending
    expert id e, in a float32 accumulator that starts at +0.0: ``acc + x`` or, weighted,
    ``fma(x, p, acc)`` with ``p = token_prob_unzipped[row]``. The sum is rounded once to the
    rows' dtype (round to nearest even); NaN results are written as the canonical quiet NaN.

    Parameters
    ----------
    hidden_states_unzipped : array of shape (R, H)
        Expert rows: bfloat16, float16 or float32.
    zipped_expertwise_rowmap : array of shape (T, E), int32
        Row of token t for expert e, or -1 (as returned by ``moe_permute``).
    expert_routemap_topk : array of shape (T, K), int32 or int64
        The routing map given to ``moe_permute``.
    token_prob_unzipped : array of shape (R,) or (R, 1), float32
        Probability of each row.
    total_zipped_tokens : int
        T, the number of tokens to produce.
    num_experts : int
        E.
    using_mix_precision : bool, default True
        True: accumulate in float32 and round once. False: round the accumulator to the
        rows' dtype after every row (what the flag means in PaddlePaddle's docs).
    using_weighted_combine : bool, default False
        Weight each row by its probability (fused multiply-add).
    name : str, optional
        Accepted and ignored (PaddlePaddle compatibility).
    validate : bool, default True
        Raise ``ValueError`` for rowmap entries outside [-1, R) and routing ids outside
        [-1, E); with False they are treated as -1 and nothing is synchronised.

    Returns
    -------
    hidden_states : array of shape (T, H)
        The combined rows, dtype of ``hidden_states_unzipped``; +0.0 for tokens with no rows.
    expert_prob_topk : array of shape (T, K), float32
        For each slot naming expert i with a row: ``token_prob_unzipped[rowmap[t, i]]``;
        otherwise 0.0.

    Raises
    ------
    TypeError
        Wrong type, dtype or array location.
    ValueError
        Wrong shape or value.

    Examples
    --------
    >>> import numpy as np
    >>> from moe_numba import moe_unpermute
    >>> rows = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    >>> rowmap = np.array([[0, 1]], dtype=np.int32)
    >>> routes = np.array([[1, 0]], dtype=np.int32)
    >>> probs = np.array([0.25, 0.75], dtype=np.float32)
    >>> out, slot_probs = moe_unpermute(rows, rowmap, routes, probs, 1, 2,
    ...                                 using_weighted_combine=True)
    >>> out
    array([[2.5, 3.5]], dtype=float32)
    >>> slot_probs
    array([[0.75, 0.25]], dtype=float32)
    """
    arrays = UnpermuteArrays(
        hidden_states_unzipped,
        zipped_expertwise_rowmap,
        expert_routemap_topk,
        token_prob_unzipped,
    )
    scalars = UnpermuteScalars(  # (by position, in the order of its fields)
        total_zipped_tokens, num_experts, using_mix_precision, using_weighted_combine, validate
    )
    return front_of(arrays).call(UNPERMUTE, arrays, scalars)
