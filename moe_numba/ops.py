"""Every op of moe-numba, declared once (public: the seam that a front of another array
library builds on).

An op is what its :class:`Op` declaration says: its array arguments (a NamedTuple whose
fields annotated ``... | None`` may be None), its other arguments (a NamedTuple of scalars
with the public defaults: one object from the public function down to the launch key), the
contract's check that turns their metadata into a plan, the outputs it allocates, the errors
its status words report, and the arrays autograd records it for. Everything else is driven
by these declarations:

- the public functions (:mod:`._api`, :mod:`._api_backward`, :mod:`._api_sort`) build the
  arrays and scalars and hand them to the front of the arrays' library
  (:func:`._libraries.front_of`): the core (:mod:`._core`) for NumPy and CUDA arrays, the torch
  integration (:mod:`.torch`) for torch tensors;
- the core prepares a call by ``op.check`` (cached per call key), runs ``op.name`` on the
  backend of the arrays' location (:mod:`._cpu`, :mod:`._gpu`: one method per op, same name)
  and raises ``op.raise_for`` the status words;
- the torch integration makes one custom op per declaration, with its schema, fake kernel,
  replay and direct route generated from it; only the gradient formulas are written per op
  (:mod:`.torch._autograd`).

A new op is one declaration here, its contract (arrays, scalars, check, plan, status
wording), its outputs (:mod:`._outputs`), its kernels with their planner
(:mod:`.kernels`), its Cython stage (``moe_cpu``), one method in each backend, its oracle
(:mod:`.oracle`) and, if it is differentiable, its gradient formula.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import _outputs
from ._contract import (
    ArrayMeta,
    PermuteArrays,
    PermuteScalars,
    UnpermuteArrays,
    UnpermuteScalars,
    check_permute_metadata,
    check_unpermute_metadata,
    raise_for_permute_status,
    raise_for_unpermute_status,
)
from ._contract_backward import (
    PermuteBackwardArrays,
    PermuteBackwardScalars,
    UnpermuteBackwardArrays,
    UnpermuteBackwardScalars,
    check_permute_backward_metadata,
    check_unpermute_backward_metadata,
    raise_for_permute_backward_status,
    raise_for_unpermute_backward_status,
)
from ._contract_sort import (
    SortArrays,
    SortScalars,
    check_sort_metadata,
    host_values,
    raise_for_sort_status,
)


@dataclass(frozen=True, eq=False)  # (hashed by identity: ops key dicts on every call)
class Op:
    """The declaration of one op.

    Attributes
    ----------
    name : str
        The op's name: the backends' method that runs it and the torch custom op
        ``moe_numba::<name>``.
    public : str
        The public function (named in errors).
    arrays : type
        NamedTuple of the array arguments, in the public order; a field annotated
        ``... | None`` may be None.
    scalars : type
        NamedTuple of the other arguments, with the public defaults; ``validate`` among
        them.
    outputs : type
        NamedTuple of what the op computes (None for an output not asked for); its
        ``result()`` is the public function's tuple.
    check : callable
        ``check(metadata, scalars) -> plan``: the contract's check of the arrays' metadata
        (a NamedTuple of :class:`~._contract.ArrayMeta`) and the scalars. Every plan has
        ``validate`` and ``runs`` (False: there is nothing to compute and nothing is read).
    allocate : callable
        ``allocate(plan, empty) -> outputs`` with ``empty(shape, dtype)``.
    raise_for : callable
        ``raise_for(status, plan)``: the ``ValueError`` the backend's status words report.
    asked : callable
        ``asked(arrays, scalars) -> tuple of bool``: which outputs the call computes (the
        torch custom ops return every output, an empty stand-in for the others).
    differentiable : tuple of str
        The arrays autograd records the op for (their gradients are the op's backward).
    capacities : bool
        Whether the op takes ``tokens_per_expert`` besides its scalars (the permute): host
        values that set its row count, checked apart (:mod:`._capacities`) so that new
        counts in every call do not miss the call cache.
    host_values : callable or None
        ``host_values(arrays, scalars) -> (arrays, scalars)``: host sequences among the
        scalars turned into tuples of ints before the call is keyed, a CUDA array among them
        moved to the arrays (``moe_sort_chunks``'s order and sizes).
    """

    name: str
    public: str
    arrays: type
    scalars: type
    outputs: type
    check: Callable
    allocate: Callable
    raise_for: Callable
    asked: Callable
    differentiable: tuple[str, ...]
    capacities: bool = False
    host_values: Callable | None = None
    differentiable_indices: tuple[int, ...] = ()  # (derived: the positions of differentiable)

    def __post_init__(self):
        indices = tuple(self.arrays._fields.index(name) for name in self.differentiable)
        object.__setattr__(self, "differentiable_indices", indices)

    def __repr__(self):
        return f"Op({self.name!r})"


def _every_output(arrays, scalars):
    return (True, True)


PERMUTE = Op(
    name="permute",
    public="moe_permute",
    arrays=PermuteArrays,
    scalars=PermuteScalars,
    outputs=_outputs.PermuteOutputs,
    check=check_permute_metadata,
    allocate=_outputs.permute_outputs,
    raise_for=raise_for_permute_status,
    asked=lambda arrays, s: (
        True,
        True,
        True,
        True,
        bool(s.return_expert_indices),
        bool(s.return_expert_offsets),
    ),
    differentiable=("hidden_states", "expert_prob_topk"),
    capacities=True,
)

UNPERMUTE = Op(
    name="unpermute",
    public="moe_unpermute",
    arrays=UnpermuteArrays,
    scalars=UnpermuteScalars,
    outputs=_outputs.UnpermuteOutputs,
    check=check_unpermute_metadata,
    allocate=_outputs.unpermute_outputs,
    raise_for=raise_for_unpermute_status,
    asked=_every_output,
    differentiable=("hidden_states_unzipped", "token_prob_unzipped"),
)

PERMUTE_BACKWARD = Op(
    name="permute_backward",
    public="moe_permute_backward",
    arrays=PermuteBackwardArrays,
    scalars=PermuteBackwardScalars,
    outputs=_outputs.PermuteBackwardOutputs,
    check=check_permute_backward_metadata,
    allocate=_outputs.permute_backward_outputs,
    raise_for=raise_for_permute_backward_status,
    asked=lambda a, s: (
        a.grad_hidden_states_unzipped is not None,
        a.grad_token_prob_unzipped is not None,
    ),
    differentiable=("grad_hidden_states_unzipped", "grad_token_prob_unzipped"),
)

UNPERMUTE_BACKWARD = Op(
    name="unpermute_backward",
    public="moe_unpermute_backward",
    arrays=UnpermuteBackwardArrays,
    scalars=UnpermuteBackwardScalars,
    outputs=_outputs.UnpermuteBackwardOutputs,
    check=check_unpermute_backward_metadata,
    allocate=_outputs.unpermute_backward_outputs,
    raise_for=raise_for_unpermute_backward_status,
    asked=lambda a, s: (
        a.grad_hidden_states is not None,
        a.grad_hidden_states is not None or a.grad_expert_prob_topk is not None,
    ),
    differentiable=(
        "grad_hidden_states",
        "grad_expert_prob_topk",
        "hidden_states_unzipped",
        "token_prob_unzipped",
    ),
)

SORT_CHUNKS = Op(
    name="sort_chunks",
    public="moe_sort_chunks",
    arrays=SortArrays,
    scalars=SortScalars,
    outputs=_outputs.SortOutputs,
    check=check_sort_metadata,
    allocate=_outputs.sort_outputs,
    raise_for=raise_for_sort_status,
    asked=lambda a, s: (True, a.probs is not None, True),
    differentiable=("x", "probs"),
    host_values=host_values,
)

OPS = (PERMUTE, UNPERMUTE, PERMUTE_BACKWARD, UNPERMUTE_BACKWARD, SORT_CHUNKS)

__all__ = [
    "OPS",
    "PERMUTE",
    "PERMUTE_BACKWARD",
    "SORT_CHUNKS",
    "UNPERMUTE",
    "UNPERMUTE_BACKWARD",
    "Op",
    # what an op's check reads of each array (check(metadata, scalars) -> plan)
    "ArrayMeta",
    # each op's arrays and scalars (the declarations' NamedTuples)
    "PermuteArrays",
    "PermuteBackwardArrays",
    "PermuteBackwardScalars",
    "PermuteScalars",
    "SortArrays",
    "SortScalars",
    "UnpermuteArrays",
    "UnpermuteBackwardArrays",
    "UnpermuteBackwardScalars",
    "UnpermuteScalars",
]
