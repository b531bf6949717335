"""The public ``moe_permute_backward`` and ``moe_unpermute_backward``: each builds its op's
arrays and scalars and hands them to the front of the arrays' library (as
:mod:`moe_numba._api`)."""

from __future__ import annotations

from ._api import Array
from ._contract_backward import (
    PermuteBackwardArrays,
    PermuteBackwardScalars,
    UnpermuteBackwardArrays,
    UnpermuteBackwardScalars,
)
from ._fronts import front_of
from .ops import PERMUTE_BACKWARD, UNPERMUTE_BACKWARD


def moe_permute_backward(
    grad_hidden_states_unzipped: Array | None,
    grad_token_prob_unzipped: Array | None,
    zipped_expertwise_rowmap: Array,
    expert_routemap_topk: Array,
    *,
    validate: bool = True,
) -> tuple[Array | None, Array | None]:
    """Gradients of ``moe_permute`` with respect to ``hidden_states`` and ``expert_prob_topk``.

    Token t's data gradient sums the gradient rows of its experts, ``e`` ascending over
    ``zipped_expertwise_rowmap[t, e] >= 0``, in a float32 accumulator from +0.0, rounded once
    to the rows' dtype: exactly the unweighted ``moe_unpermute`` with
    ``using_mix_precision=True``. Padding rows are never read. A slot's probability
    gradient is the gradient of the row its probability went to, for the counted slot of
    each (token, expert) pair (the lowest k naming the expert); every other slot, a repeated
    expert's later slots included, gets +0.0. See :doc:`gradients`.

    Parameters
    ----------
    grad_hidden_states_unzipped : array of shape (R, H), or None
        Gradient of ``hidden_states_unzipped``: bfloat16, float16 or float32 (float8 rows have
        no gradient). None: no data gradient.
    grad_token_prob_unzipped : array of shape (R,), float32, or None
        Gradient of ``token_prob_unzipped``. None: no probability gradient.
    zipped_expertwise_rowmap : array of shape (T, E), int32
        The row map ``moe_permute`` returned.
    expert_routemap_topk : array of shape (T, K), int32 or int64
        The routing map given to ``moe_permute``.
    validate : bool, default True
        Raise ``ValueError`` for row-map entries outside [-1, R) and routing ids outside
        [-1, E); with False they are treated as -1 and nothing is synchronised. Nothing is
        checked when both gradients are None (nothing is read).

    Returns
    -------
    grad_hidden_states : array of shape (T, H), or None
        Dtype of ``grad_hidden_states_unzipped``; +0.0 for tokens with no rows. None when
        ``grad_hidden_states_unzipped`` is None.
    grad_expert_prob_topk : array of shape (T, K), float32, or None
        None when ``grad_token_prob_unzipped`` is None.

    Raises
    ------
    TypeError
        Wrong type, dtype or array location.
    ValueError
        Wrong shape or value (two gradients of different R included).

    Examples
    --------
    >>> import numpy as np
    >>> from moe_numba import moe_permute_backward
    >>> rowmap = np.array([[0, 2], [1, -1]], dtype=np.int32)  # 2 tokens, 2 experts, R = 4
    >>> routes = np.array([[0, 1], [0, -1]], dtype=np.int32)
    >>> grad_rows = np.array([[1, 2], [3, 4], [5, 6], [0, 0]], dtype=np.float32)
    >>> grad_row_probs = np.array([0.5, 0.25, 2.0, 9.0], dtype=np.float32)
    >>> dx, dprob = moe_permute_backward(grad_rows, grad_row_probs, rowmap, routes)
    >>> dx
    array([[6., 8.],
           [3., 4.]], dtype=float32)
    >>> dprob
    array([[0.5 , 2.  ],
           [0.25, 0.  ]], dtype=float32)
    """
    arrays = PermuteBackwardArrays(
        grad_hidden_states_unzipped,
        grad_token_prob_unzipped,
        zipped_expertwise_rowmap,
        expert_routemap_topk,
    )
    scalars = PermuteBackwardScalars(validate)
    return front_of(arrays).call(PERMUTE_BACKWARD, arrays, scalars)


def moe_unpermute_backward(
    grad_hidden_states: Array | None,
    grad_expert_prob_topk: Array | None,
    hidden_states_unzipped: Array | None,
    zipped_expertwise_rowmap: Array,
    expert_routemap_topk: Array,
    token_prob_unzipped: Array | None,
    *,
    using_weighted_combine: bool,
    num_rows: int,
    validate: bool = True,
) -> tuple[Array | None, Array | None]:
    """Gradients of ``moe_unpermute`` with respect to ``hidden_states_unzipped`` and
    ``token_prob_unzipped``.

    Row ``r = zipped_expertwise_rowmap[t, e] >= 0`` gets token t's gradient: a bit copy, or,
    weighted, ``rnd(float32(grad_hidden_states[t, h]) * token_prob_unzipped[r])`` (one
    product rounded to the rows' dtype). Its probability gradient is (weighted only) the
    float32 dot product of ``grad_hidden_states[t]`` and ``hidden_states_unzipped[r]`` in the
    fixed order of :doc:`gradients`, plus ``grad_expert_prob_topk[t, k]`` for every slot k
    naming e, k ascending. Every other row is +0.0. The same for either
    ``using_mix_precision`` of the forward. NaN results are the canonical quiet NaN.

    Parameters
    ----------
    grad_hidden_states : array of shape (T, H), or None
        Gradient of the combined ``hidden_states``: bfloat16, float16 or float32. None: no
        row gradient and no dot-product term.
    grad_expert_prob_topk : array of shape (T, K), float32, or None
        Gradient of the forward's ``expert_prob_topk`` output. None: that term is absent.
    hidden_states_unzipped : array of shape (R, H), or None
        The forward's input rows, of the dtype of ``grad_hidden_states``. Read for the
        dot-product term of the probability gradient (weighted, with ``grad_hidden_states``);
        None leaves that term out. Else unused.
    zipped_expertwise_rowmap : array of shape (T, E), int32
        The row map of the forward.
    expert_routemap_topk : array of shape (T, K), int32 or int64
        The routing map of the forward.
    token_prob_unzipped : array of shape (R,) or (R, 1), float32, or None
        The forward's row probabilities. Required when ``using_weighted_combine``.
    using_weighted_combine : bool
        Whether the forward combine was weighted.
    num_rows : int
        R, the rows of the forward's ``hidden_states_unzipped``; every (R, ...) array given
        must have R rows.
    validate : bool, default True
        Raise ``ValueError`` for row-map entries outside [-1, R), routing ids outside
        [-1, E) and a row named by two row-map entries (the smallest such row). With False
        the first two are treated as -1, such a row gets +0.0 gradients, and nothing is
        synchronised. Nothing is checked when both gradients are None (nothing is read).

    Returns
    -------
    grad_hidden_states_unzipped : array of shape (R, H), or None
        Dtype of ``grad_hidden_states``; None when it is None.
    grad_token_prob_unzipped : array of shape (R,), float32, or None
        None only when both ``grad_hidden_states`` and ``grad_expert_prob_topk`` are None.

    Raises
    ------
    TypeError
        Wrong type, dtype or array location, or a required input is None.
    ValueError
        Wrong shape or value.

    Examples
    --------
    >>> import numpy as np
    >>> from moe_numba import moe_unpermute_backward
    >>> rowmap = np.array([[0, 1]], dtype=np.int32)  # 1 token, 2 experts, R = 2
    >>> routes = np.array([[1, 0]], dtype=np.int32)
    >>> rows = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    >>> probs = np.array([0.25, 0.75], dtype=np.float32)
    >>> grad_out = np.array([[1.0, 10.0]], dtype=np.float32)
    >>> grad_slot_probs = np.array([[100.0, 1000.0]], dtype=np.float32)
    >>> drows, dprobs = moe_unpermute_backward(
    ...     grad_out, grad_slot_probs, rows, rowmap, routes, probs,
    ...     using_weighted_combine=True, num_rows=2)
    >>> drows
    array([[0.25, 2.5 ],
           [0.75, 7.5 ]], dtype=float32)
    >>> dprobs
    array([1021.,  143.], dtype=float32)
    """
    arrays = UnpermuteBackwardArrays(
        grad_hidden_states,
        grad_expert_prob_topk,
        hidden_states_unzipped,
        zipped_expertwise_rowmap,
        expert_routemap_topk,
        token_prob_unzipped,
    )
    scalars = UnpermuteBackwardScalars(using_weighted_combine, num_rows, validate)
    return front_of(arrays).call(UNPERMUTE_BACKWARD, arrays, scalars)
