"""moe_permute_backward on the GPU, host side: moe_unpermute's kernels, counted slots.

The data gradient is the unweighted, mixed-precision combine of the gradient rows, and the
probability gradient is the combine's slot probabilities under the counted-slot rule (a slot
that repeats an earlier slot's expert gets 0): one combine launch does both
(:data:`.combine.COMBINE_COUNTED`), after init and check with ``validate=True``, exactly as
a ``moe_unpermute`` call (:func:`.unpermute.run`)::

    moe_unpermute          moe_permute_backward
    rows [R, H]            grad_hidden_states_unzipped (None: no row words, nw = 0)
    probs [R]              grad_token_prob_unzipped (None: the combine writes no slots)
    out_hidden [T, H]      grad_hidden_states
    out_probs [T, K]       grad_expert_prob_topk
"""

from __future__ import annotations

from .. import abi
from . import unpermute
from .combine import COMBINE_COUNTED, COUNTED_SLOTS, NO_SLOTS

FAMILIES = (COMBINE_COUNTED,)


def run(plan, buffers, validate, alloc, stream):
    """Enqueue moe_permute_backward's kernels for one call on ``stream``.

    Parameters
    ----------
    plan : moe_numba._contract_backward.BackwardPlan
        The call's plan.
    buffers : moe_numba.kernels.unpermute.UnpermuteBuffers
        The call's arrays and outputs, as in the module docstring's table.
    validate, alloc, stream
        As for :func:`.unpermute.run`.

    Returns
    -------
    StatusWords or None
        With ``validate``: the ``abi.UNPERMUTE_*`` status words, else None.
    """
    combine_plan = plan.combine_plan
    if not plan.grad_hidden:  # no row words (nw = 0): any data type
        combine_plan = combine_plan._replace(data_type=abi.DATA_FLOAT32)
    slots = COUNTED_SLOTS if plan.grad_prob else NO_SLOTS
    return unpermute.run(combine_plan, buffers, validate, alloc, stream, slots=slots)
