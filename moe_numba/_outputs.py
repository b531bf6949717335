"""The outputs of every op: what it computes, allocated as its plan describes, and what a
failed allocation says.

Each op's outputs are one NamedTuple (a field per output, None for an output the call did not
ask for); its ``result()`` is the tuple the public function returns. Both backends allocate
through here with the caller's ``empty(shape, dtype)`` (moe_cpu's caching allocator, or the
CUDA arrays' library): a buffer too large for the machine is a ``MemoryError`` that names the
output, its size and the argument that sized it, whatever the allocator raised.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np


class PermuteOutputs(NamedTuple):
    """The outputs of one ``moe_permute`` call (``indices`` and ``offsets`` None unless asked
    for)."""

    hidden: object
    rowmap: object
    probs: object
    scale: object
    indices: object | None
    offsets: object | None

    def result(self):
        """The tuple ``moe_permute`` returns: ``expert_indices`` then ``expert_offsets``,
        each only when asked for."""
        out = (self.hidden, self.rowmap, self.probs, self.scale)
        if self.indices is not None:
            out += (self.indices,)
        if self.offsets is not None:
            out += (self.offsets,)
        return out


def _every_output(outputs):
    """The tuple the public function returns: every output, in order."""
    return tuple(outputs)


class UnpermuteOutputs(NamedTuple):
    """The outputs of one ``moe_unpermute`` call."""

    hidden: object
    probs: object

    result = _every_output


class PermuteBackwardOutputs(NamedTuple):
    """The outputs of one ``moe_permute_backward`` call (None for a gradient not asked
    for)."""

    grad_hidden: object | None
    grad_probs: object | None

    result = _every_output


class UnpermuteBackwardOutputs(NamedTuple):
    """The outputs of one ``moe_unpermute_backward`` call (None for a gradient not asked
    for)."""

    grad_rows: object | None
    grad_probs: object | None

    result = _every_output


class SortOutputs(NamedTuple):
    """The outputs of one ``moe_sort_chunks`` call.

    ``lengths`` holds, per position of ``y``, the rows its chunk really has (the sizes in
    output order, after the rule for bad device sizes): the sizes of the inverse sort, which
    the torch autograd uses. ``probs`` is None when no probabilities were given.
    """

    y: object
    probs: object | None
    lengths: object

    def result(self):
        """The pair ``moe_sort_chunks`` returns."""
        return self.y, self.probs


def permute_outputs(plan, empty):
    """Allocate the outputs of ``moe_permute`` with ``empty(shape, dtype)``.

    Raises ``MemoryError`` naming the output, its size and the argument that sized it.
    """
    rows = plan.num_rows
    by = "override_buffer_size" if plan.override else _ROWS_FROM_CAPACITIES
    shape = (rows if plan.do_gather else 0, plan.hidden)
    hidden = _allocate(empty, "hidden_states_unzipped", shape, plan.hidden_dtype, by)
    shape = (plan.num_tokens, plan.num_experts)
    rowmap = _allocate(empty, "zipped_expertwise_rowmap", shape, np.int32, "num_experts")
    probs = _allocate(empty, "token_prob_unzipped", (rows,), np.float32, by)
    if plan.gather_scale:
        shape = (rows, plan.scale_width)
        scale = _allocate(empty, "scale_unzipped", shape, plan.scale_dtype, by)
    else:
        scale = empty((0,), np.float32)
    indices = None
    if plan.return_expert_indices:
        indices = _allocate(empty, "expert_indices", (rows,), np.int32, by)
    offsets = None
    if plan.return_expert_offsets:
        offsets = _allocate(empty, "expert_offsets", (plan.num_experts,), np.int32, "num_experts")
    return PermuteOutputs(hidden, rowmap, probs, scale, indices, offsets)


_ROWS_FROM_CAPACITIES = "tokens_per_expert and padding_alignment"


def unpermute_outputs(plan, empty):
    """Allocate the outputs of ``moe_unpermute`` with ``empty(shape, dtype)`` (errors as
    :func:`permute_outputs`)."""
    by = "total_zipped_tokens"
    hidden = _allocate(empty, "hidden_states", (plan.num_tokens, plan.hidden), plan.dtype, by)
    probs = _allocate(empty, "expert_prob_topk", (plan.num_tokens, plan.topk), np.float32, by)
    return UnpermuteOutputs(hidden, probs)


def permute_backward_outputs(plan, empty):
    """Allocate the outputs of ``moe_permute_backward``: the data gradient (None without
    gradient rows) and the probability gradient (None without its input)."""
    T = plan.num_tokens
    hidden = empty((T, plan.hidden), plan.dtype) if plan.grad_hidden else None
    probs = empty((T, plan.topk), np.float32) if plan.grad_prob else None
    return PermuteBackwardOutputs(hidden, probs)


def unpermute_backward_outputs(plan, empty):
    """Allocate the outputs of ``moe_unpermute_backward``: the row gradient (None without
    ``grad_hidden_states``) and the probability gradient (None only when neither gradient is
    given)."""
    rows = empty((plan.num_rows, plan.hidden), plan.dtype) if plan.grad_hidden else None
    probs = empty((plan.num_rows,), np.float32) if plan.runs else None
    return UnpermuteBackwardOutputs(rows, probs)


def sort_outputs(plan, empty):
    """Allocate the outputs of ``moe_sort_chunks`` with ``empty(shape, dtype)``."""
    y = empty((plan.num_rows, plan.hidden), plan.dtype)
    probs = empty((plan.num_rows,), np.float32) if plan.has_probs else None
    return SortOutputs(y, probs, empty((plan.num_chunks,), np.int64))


def _allocate(empty, output, shape, dtype, sized_by):
    """``empty(shape, dtype)``, or a ``MemoryError`` that names the output, its shape and
    bytes, and the argument that sized it. (A size past what the machine can address is a
    ``ValueError`` from NumPy and an ``OverflowError`` from moe_cpu's allocator.)"""
    try:
        return empty(shape, dtype)
    except (MemoryError, OverflowError, ValueError) as error:
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        raise MemoryError(
            f"cannot allocate {output} of shape {shape} ({np.dtype(dtype)}): {nbytes} bytes, "
            f"sized by {sized_by}"
        ) from error
