"""The front of torch tensors: every op's call (:mod:`moe_numba.ops`) takes one of three
routes.

================  ===========================================  ==================================
route             taken when                                   what it is
================  ===========================================  ==================================
replay            plain eager execution                        the recorded launches of the
                  (:func:`._route.eager`), the call key        call key, with the new addresses
                  recorded (plain CUDA tensors,                (:mod:`._replay`)
                  ``validate=False``), autograd not recording
direct            torch would do nothing else with the call    the op's implementation on its
                  (:func:`._route.eager`, ``plain_tensors``)   checked plan (:mod:`._direct`);
                                                               autograd records it through the
                                                               op's ``Function`` made of its
                                                               own autograd functions
custom op         anything else: ``jit.trace``, ``make_fx``,   ``torch.ops.moe_numba.*``: torch
                  ``torch.export``, ``torch.compile``,         sees the op; its fake kernel gives
                  ``torch.func``, forward AD, dispatch and     shapes, its registered autograd
                  function modes, tensor subclasses, meta      the gradients
                  tensors
================  ===========================================  ==================================

Every route gives the same bits and the same errors: the direct route and the custom op's
implementation check a call's metadata in the core, as for every other array kind; the fake
kernels run the same checks on traced tensors. :data:`ROUTES` counts the calls of each route.
"""

from collections import Counter

import torch

from .. import _core
from .._capacities import capacities_from
from ._autograd import DIRECT
from ._bridge import asked_outputs
from ._custom_ops import CUSTOM_OPS, arguments
from ._direct import check_all_tensors, prepare, run
from ._replay import REPLAYS
from ._route import eager, plain_tensors, refuse_unsupported

_grad_enabled = torch.is_grad_enabled
_Tensor = torch.Tensor
_compiling = torch.compiler.is_compiling


class RouteCounts:
    """How many calls of each op took each route since the last :meth:`reset`:
    ``routes[name, route]`` with ``name`` an op's name (``"permute"``, ``"unpermute"``,
    ``"permute_backward"``, ``"unpermute_backward"``, ``"sort_chunks"``) and ``route`` one
    of ``"replay"``, ``"direct"``, ``"custom op"`` (the table above; calls that dynamo
    traces are not counted, the compiled code's calls of the op are). A direct call that
    autograd records replays inside its autograd function where it can, and then counts on
    both routes; the backward's calls count as calls of the backward ops."""

    ROUTES = ("replay", "direct", "custom op")

    def __init__(self):
        self._counts = Counter()
        self._replays_before = {}

    def add(self, op, route):
        self._counts[op.name, route] += 1

    def __getitem__(self, key):
        name, route = key
        if route not in self.ROUTES:
            raise KeyError(f"route must be one of {', '.join(self.ROUTES)}; got {route!r}")
        op = next((op for op in REPLAYS if op.name == name), None)
        if op is None:
            names = ", ".join(op.name for op in REPLAYS)
            raise KeyError(f"op must be one of {names}; got {name!r}")
        if route == "replay":  # (counted by the compiled replays themselves)
            return REPLAYS[op].runs - self._replays_before.get(op, 0)
        return self._counts[key]

    def reset(self):
        """Start every count again from 0."""
        self._counts.clear()
        self._replays_before = {op: replays.runs for op, replays in REPLAYS.items()}


ROUTES = RouteCounts()


def _recorded(op, arrays):
    """Whether autograd records a call: grad mode on and an array the op is differentiable
    in requires a gradient."""
    if not _grad_enabled():
        return False
    for i in op.differentiable_indices:
        x = arrays[i]
        if type(x) is _Tensor and x.requires_grad:  # (the direct route's tensors are plain)
            return True
    return False


def call(op, arrays, scalars, capacities=None):
    """The public result of a call of ``op`` on torch tensors (``arrays`` and ``scalars``: the
    op's NamedTuples; ``capacities``: a permute's ``tokens_per_expert``)."""
    fast = eager()  # (then the replay, else the direct route, may skip the dispatcher)
    if fast:
        result = REPLAYS[op](arrays, scalars, capacities)  # (None if autograd records it)
        if result is not None:
            return result
    if fast and plain_tensors(arrays):
        ROUTES.add(op, "direct")
        if op.host_values is not None:
            arrays, scalars = op.host_values(arrays, scalars)
        backend, plan = prepare(op, arrays, scalars, capacities)
        if not _recorded(op, arrays):
            if plan.validate and arrays[0] is not None and arrays[0].is_cuda:
                # (the core reads CUDA tensors as they are, and validating, nothing records)
                return _core.run(op, backend, plan, arrays).result()
            return run(op, backend, plan, arrays, scalars, capacities).result()
        counts = _counts_argument(op, scalars, plan.capacities) if op.capacities else None
        tensors = DIRECT[op].apply(backend, plan, *arguments(op, arrays, scalars, counts))
    else:
        if not _compiling():  # (a count dynamo traced would be a guard on its value)
            ROUTES.add(op, "custom op")
        refuse_unsupported(op.public, arrays)
        arrays, scalars = _traced_values(op, arrays, scalars)
        check_all_tensors(arrays)
        counts = None
        if op.capacities and scalars.override_buffer_size < 0:
            # (the schema takes a list of ints; dynamo's may be traced)
            counts = (
                capacities
                if _compiling()
                else _counts_argument(op, scalars, capacities_from(capacities, scalars.num_experts))
            )
        tensors = CUSTOM_OPS[op](*arguments(op, arrays, scalars, counts))
    return asked_outputs(op, tensors, arrays, scalars).result()


def _counts_argument(op, scalars, capacities):
    """A permute's ``tokens_per_expert`` as the custom op takes it: checked ints, a list
    (None under ``override_buffer_size``, which the contract ignores them for)."""
    if not op.capacities or scalars.override_buffer_size >= 0 or capacities is None:
        return None
    return list(capacities) if isinstance(capacities, (list, tuple)) else capacities.tolist()


def _traced_values(op, arrays, scalars):
    """``op.host_values`` of a call that takes the custom op. While dynamo traces, host
    sequences cannot be read as NumPy arrays: a tensor of sizes on the device goes to the
    arrays, other sequences go to the schema as lists (the fake kernel checks what is
    concrete)."""
    if op.host_values is None:
        return arrays, scalars
    if not _compiling():
        return op.host_values(arrays, scalars)
    sizes = scalars.host_split_sizes
    if isinstance(sizes, _Tensor) and sizes.device.type != "cpu":
        return arrays._replace(split_sizes=sizes), scalars._replace(
            order=list(scalars.order), host_split_sizes=None
        )
    sizes = sizes.tolist() if isinstance(sizes, _Tensor) else list(sizes)
    return arrays, scalars._replace(order=list(scalars.order), host_split_sizes=sizes)
