"""The outputs of an op, allocated as its plan describes, and what a failed allocation says.

Both backends allocate through here with the caller's ``empty(shape, dtype)`` (moe_cpu's
caching allocator, or the CUDA arrays' library): a buffer too large for the machine is a
``MemoryError`` that names the output, its size and the argument that sized it, whatever the
allocator raised.
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


def permute_outputs(plan, empty):
    """Allocate the outputs of ``moe_permute`` with ``empty(shape, dtype)``.

    Raises ``MemoryError`` naming the output, its size and the argument that sized it.
    """
    rows = plan.num_rows
    by = "override_buffer_size" if plan.capacities is None else _ROWS_FROM_CAPACITIES
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
    return hidden, probs


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
