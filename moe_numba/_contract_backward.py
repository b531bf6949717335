"""The metadata rules of the two gradient ops (docs/gradients.rst), their plans and the wording
of their value errors.

As in :mod:`moe_numba._contract`, everything here looks at shapes, dtypes and Python scalars
only; the backends report bad values as status words (:mod:`moe_numba.abi`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import abi
from ._contract import (
    COMBINE_DTYPES,
    FLOAT8_DTYPES,
    FLOAT32,
    INT32,
    ROUTEMAP_DTYPES,
    UnpermutePlan,
    check_bool,
    check_dtype,
    check_int,
    check_ndim,
    check_shape,
    raise_for_unpermute_status,
)


class PermuteBackwardArrays(NamedTuple):
    """The array arguments of one ``moe_permute_backward`` call (gradients may be None)."""

    grad_hidden_states_unzipped: object | None
    grad_token_prob_unzipped: object | None
    zipped_expertwise_rowmap: object
    expert_routemap_topk: object


class UnpermuteBackwardArrays(NamedTuple):
    """The array arguments of one ``moe_unpermute_backward`` call (see its docstring for
    which may be None)."""

    grad_hidden_states: object | None
    grad_expert_prob_topk: object | None
    hidden_states_unzipped: object | None
    zipped_expertwise_rowmap: object
    expert_routemap_topk: object
    token_prob_unzipped: object | None


class PermuteBackwardScalars(NamedTuple):
    """The scalar arguments of one ``moe_permute_backward`` call, with the public default."""

    validate: bool = True


class UnpermuteBackwardScalars(NamedTuple):
    """The scalar arguments of one ``moe_unpermute_backward`` call, with the public
    default."""

    using_weighted_combine: bool
    num_rows: int
    validate: bool = True


class BackwardPlan(NamedTuple):
    """Shapes of one call of either gradient op."""

    num_tokens: int
    hidden: int  # 0 without gradient rows
    topk: int
    num_experts: int
    num_rows: int  # R (moe_permute_backward: 0 when neither gradient is given)
    dtype: np.dtype | None  # of the gradient rows
    data_type: int  # abi.DATA_*, -1 without gradient rows
    grad_hidden: bool  # the gradient rows are given (their gradient is computed)
    grad_prob: bool  # the probability gradient input is given
    weighted: bool  # moe_unpermute_backward: the forward combine was weighted
    rows_given: bool  # moe_unpermute_backward: hidden_states_unzipped is given
    validate: bool

    @property
    def runs(self):
        """Whether there is anything to compute (else both outputs are None and nothing is
        read or checked)."""
        return self.grad_hidden or self.grad_prob

    @property
    def dot(self):
        """moe_unpermute_backward: whether the probability gradient has the dot-product term
        (which reads ``hidden_states_unzipped``: without it the caller wants no such
        term, as autograd when the probabilities need no gradient)."""
        return self.weighted and self.grad_hidden and self.rows_given

    @property
    def combine_plan(self):
        """moe_permute_backward: the plan of the ``moe_unpermute`` that is its data gradient
        (unweighted, mixed precision)."""
        return UnpermutePlan(
            num_tokens=self.num_tokens,
            hidden=self.hidden,
            topk=self.topk,
            num_experts=self.num_experts,
            num_rows=self.num_rows,
            dtype=self.dtype,
            data_type=self.data_type,
            weighted=False,
            mix_precision=True,
            validate=self.validate,
        )


def _plan(
    maps, num_rows, hidden, dtype, grad_hidden, grad_prob, validate, weighted=False, rows=None
):
    num_tokens, num_experts, topk = maps
    return BackwardPlan(
        num_tokens=num_tokens,
        hidden=hidden,
        topk=topk,
        num_experts=num_experts,
        num_rows=num_rows,
        dtype=dtype,
        data_type=-1 if dtype is None else COMBINE_DTYPES[dtype],
        grad_hidden=grad_hidden is not None,
        grad_prob=grad_prob is not None,
        weighted=weighted,
        rows_given=rows is not None,
        validate=validate,
    )


def _check_maps(rowmap, routemap):
    """``(T, E, K)`` from the :class:`ArrayMeta` of the row map ``[T, E]`` int32 and of the
    routing map ``[T, K]``."""
    rowmap_shape, rowmap_dtype = rowmap
    check_ndim("zipped_expertwise_rowmap", rowmap_shape, 2, "[num_tokens, num_experts]")
    check_dtype("zipped_expertwise_rowmap", rowmap_dtype, INT32)
    num_tokens, num_experts = rowmap_shape
    if num_experts < 1:
        raise ValueError(
            "zipped_expertwise_rowmap must have num_experts >= 1 columns; "
            f"got shape {tuple(rowmap_shape)}"
        )
    routemap_shape, routemap_dtype = routemap
    check_ndim("expert_routemap_topk", routemap_shape, 2, "[num_tokens, topk]")
    check_dtype("expert_routemap_topk", routemap_dtype, ROUTEMAP_DTYPES)
    topk = routemap_shape[1]
    if routemap_shape[0] != num_tokens or topk < 1:
        raise ValueError(
            "expert_routemap_topk must have shape [num_tokens, topk >= 1] with num_tokens = "
            f"{num_tokens} (the rows of zipped_expertwise_rowmap); got {tuple(routemap_shape)}"
        )
    return num_tokens, num_experts, topk


def _check_gradient_rows(name, meta):
    """``(shape, dtype)`` of 2-D gradient rows of width >= 1: bfloat16, float16 or float32."""
    shape, dtype = tuple(meta.shape), meta.dtype
    check_ndim(name, shape, 2, "[rows, hidden]")
    if dtype in FLOAT8_DTYPES:
        raise TypeError(
            f"{name} has dtype {dtype}: float8 rows have no gradient (gradient rows are "
            "bfloat16, float16 or float32)"
        )
    check_dtype(name, dtype, COMBINE_DTYPES)
    if shape[1] < 1:
        raise ValueError(f"{name} must have at least one column; got shape {shape}")
    return shape, dtype


def check_permute_backward_metadata(arrays, scalars: PermuteBackwardScalars):
    """Check the metadata of a ``moe_permute_backward`` call and plan its outputs.

    ``arrays`` is a :class:`PermuteBackwardArrays` of :class:`ArrayMeta` (or None). T and E
    come from the row map, K from the routing map, R and H from the gradient rows (R from
    ``grad_token_prob_unzipped`` when only it is given). Raises ``TypeError`` /
    ``ValueError`` naming the argument.
    """
    validate = check_bool("validate", scalars.validate)
    maps = _check_maps(arrays.zipped_expertwise_rowmap, arrays.expert_routemap_topk)
    grad_rows, grad_probs = arrays.grad_hidden_states_unzipped, arrays.grad_token_prob_unzipped
    num_rows, hidden, dtype = 0, 0, None
    if grad_rows is not None:
        (num_rows, hidden), dtype = _check_gradient_rows("grad_hidden_states_unzipped", grad_rows)
    if grad_probs is not None:
        name = "grad_token_prob_unzipped"
        check_dtype(name, grad_probs.dtype, FLOAT32)
        shape = tuple(grad_probs.shape)
        if dtype is None:
            check_ndim(name, shape, 1, "[rows]")
            num_rows = shape[0]
        else:
            check_shape(name, shape, (num_rows,), "[rows of grad_hidden_states_unzipped]")
    return _plan(maps, num_rows, hidden, dtype, grad_rows, grad_probs, validate)


def check_unpermute_backward_metadata(arrays, scalars: UnpermuteBackwardScalars):
    """Check the metadata of a ``moe_unpermute_backward`` call and plan its outputs.

    ``arrays`` is an :class:`UnpermuteBackwardArrays` of :class:`ArrayMeta` (or None). T and
    E come from the row map, K from the routing map, H from ``grad_hidden_states``, R is
    ``num_rows``, which every ``[R, ...]`` array given must match. Raises ``TypeError`` /
    ``ValueError`` naming the argument.
    """
    weighted = check_bool("using_weighted_combine", scalars.using_weighted_combine)
    validate = check_bool("validate", scalars.validate)
    num_rows = check_int("num_rows", scalars.num_rows, 0)
    maps = _check_maps(arrays.zipped_expertwise_rowmap, arrays.expert_routemap_topk)
    num_tokens, _, topk = maps
    grad_out, grad_slots = arrays.grad_hidden_states, arrays.grad_expert_prob_topk
    hidden, dtype = 0, None
    if grad_out is not None:
        (rows, hidden), dtype = _check_gradient_rows("grad_hidden_states", grad_out)
        check_shape(
            "grad_hidden_states", (rows, hidden), (num_tokens, hidden), "[num_tokens, hidden]"
        )
    if grad_slots is not None:
        check_dtype("grad_expert_prob_topk", grad_slots.dtype, FLOAT32)
        check_shape(
            "grad_expert_prob_topk", grad_slots.shape, (num_tokens, topk), "[num_tokens, topk]"
        )

    rows_in = arrays.hidden_states_unzipped
    if rows_in is not None:
        name = "hidden_states_unzipped"
        shape, rows_dtype = tuple(rows_in.shape), rows_in.dtype
        check_ndim(name, shape, 2, "[num_rows, hidden]")
        if dtype is None:
            check_dtype(name, rows_dtype, COMBINE_DTYPES)
        elif rows_dtype != dtype:
            raise TypeError(
                f"{name} must have the dtype of grad_hidden_states ({dtype}); got {rows_dtype}"
            )
        check_shape(name, shape, (num_rows, hidden or shape[1]), "[num_rows, hidden]")

    probs = arrays.token_prob_unzipped
    if probs is not None:
        check_dtype("token_prob_unzipped", probs.dtype, FLOAT32)
        prob_shape = tuple(probs.shape)
        if prob_shape not in ((num_rows,), (num_rows, 1)):
            raise ValueError(
                f"token_prob_unzipped must have shape [num_rows] or [num_rows, 1] with "
                f"num_rows = {num_rows}; got {prob_shape}"
            )
    elif weighted:
        raise TypeError(
            "token_prob_unzipped is required when using_weighted_combine=True; got None"
        )

    return _plan(maps, num_rows, hidden, dtype, grad_out, grad_slots, validate, weighted, rows_in)


def raise_for_permute_backward_status(status, plan: BackwardPlan):
    """Raise the ``ValueError`` that ``status`` (the ``abi.UNPERMUTE_*`` slots) reports."""
    raise_for_unpermute_status(status, plan)


def raise_for_unpermute_backward_status(status, plan: BackwardPlan):
    """Raise the ``ValueError`` that ``status`` (``abi.UNPERMUTE_*`` and
    ``abi.UNPERMUTE_BACKWARD_*``) reports, if any."""
    raise_for_unpermute_status(status, plan)
    row = int(status[abi.UNPERMUTE_BACKWARD_DUPLICATE_ROW])
    if row >= 0:
        first = divmod(int(status[abi.UNPERMUTE_BACKWARD_DUPLICATE_FIRST]), plan.num_experts)
        second = divmod(int(status[abi.UNPERMUTE_BACKWARD_DUPLICATE_SECOND]), plan.num_experts)
        raise ValueError(
            f"zipped_expertwise_rowmap[{first[0]}, {first[1]}] and "
            f"zipped_expertwise_rowmap[{second[0]}, {second[1]}] both name row {row}: each "
            "row holds one (token, expert) pair, as moe_permute writes them"
        )
