"""The torch custom ops ``moe_numba::<op>``: one per declaration of :mod:`moe_numba.ops`,
made in one loop.

An op's schema is its declaration's: its arrays (``Tensor``, or ``Tensor?`` where the field
may be None), its scalars (``SymInt``, ``bool``, ``SymInt[]``, by their annotations), a
permute's ``tokens_per_expert`` (``SymInt[]?``) last; it returns every output of the op, an
empty float32 stand-in for each output the call did not ask for (a schema has a fixed number
of outputs).

- The implementation prepares the call in the core and runs it on the tensors' device
  (:func:`._bridge.run_on_tensors`): CUDA tensors as they are, CPU tensors as NumPy views
  with torch-allocated outputs.
- The fake kernel (also the meta kernel) checks that the tensors are on one device, runs the
  op's check on their metadata and allocates the outputs its plan describes, as meta/fake
  tensors: ``torch.compile`` reports a
  bad call while it traces. Ints that the compiler traces (``SymInt``) pass the checks
  unchecked (the compiled code checks their values when it runs); a permute's row count is
  then ``sum_e ceil(n_e / A) * A`` of the traced counts, or ``override_buffer_size``.
- The gradients are registered by :mod:`._autograd`.
"""

from __future__ import annotations

import types
import typing

import torch

from .. import _core
from .._capacities import capacities_from, padded_rows
from .._dispatch import check_devices
from .._libraries import is_traced_int
from ..ops import OPS
from ._bridge import check_dtypes, metadata, run_on_tensors, stand_ins, torch_dtype

# a scalar's annotation -> its type in a schema (ints as SymInt: the compiler may trace them)
_SCHEMA_TYPES = {int: "SymInt", bool: "bool", tuple[int, ...]: "SymInt[]"}


def _schema_type(hint, what):
    optional = False
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        parts = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(parts) < len(typing.get_args(hint))
        (hint,) = parts
    if what == "array":
        return "Tensor?" if optional else "Tensor"
    return _SCHEMA_TYPES[hint] + ("?" if optional else "")


def schema(op):
    """The custom op's schema of ``op``: its arrays, its scalars, a permute's
    ``tokens_per_expert``; a tensor per output."""
    params = []
    for kind, record in (("array", op.arrays), ("scalar", op.scalars)):
        hints = typing.get_type_hints(record)
        params += [f"{_schema_type(hints[name], kind)} {name}" for name in record._fields]
    if op.capacities:
        params.append("SymInt[]? tokens_per_expert")
    outputs = ", ".join("Tensor" for _ in op.outputs._fields)
    return f"({', '.join(params)}) -> ({outputs})"


def split(op, args):
    """``(arrays, scalars, capacities)`` of the custom op's arguments ``args`` (a sequence in
    the schema's order)."""
    n, m = len(op.arrays._fields), len(op.scalars._fields)
    arrays = op.arrays._make(args[:n])
    scalars = op.scalars._make(args[n : n + m])
    return arrays, scalars, (args[n + m] if op.capacities else None)


def arguments(op, arrays, scalars, capacities=None):
    """The custom op's arguments for a call: :func:`split`'s inverse."""
    return (*arrays, *scalars, *((capacities,) if op.capacities else ()))


def _like(arrays):
    return next(x for x in arrays if x is not None)


def _implementation(op):
    def implementation(*args):
        arrays, scalars, capacities = split(op, args)
        check_dtypes(arrays)  # (first: the core would name the bits' dtype, not torch's)
        if op.host_values is not None:
            arrays, scalars = op.host_values(arrays, scalars)
        backend, plan = _core.prepare(op, arrays, scalars, capacities)
        return stand_ins(run_on_tensors(op, backend, plan, arrays), _like(arrays))

    implementation.__name__ = op.name
    implementation.__doc__ = f"``{op.public}`` on tensors (see moe_numba.{op.public})."
    return implementation


def _traced(values):
    return any(is_traced_int(v) for v in values)


def _fake(op):
    def fake(*args):
        arrays, scalars, capacities = split(op, args)
        # (torch runs the fake kernel for any call with a meta tensor among its inputs: a
        # meta tensor beside tensors that hold data is refused here, as the core would)
        check_devices(arrays._asdict())
        check_dtypes(arrays)
        # (host values are read as the schema passed them: sizes in a tensor keep only their
        # shape here, wherever the tensor is)
        plan = op.check(metadata(arrays), scalars)
        if op.capacities and not plan.override:
            counts = () if capacities is None else tuple(capacities)
            if not _traced(counts):
                capacities_from(capacities, plan.num_experts)  # (raises for bad counts)
            plan = plan._replace(num_rows=padded_rows(counts, plan.alignment))
        like = _like(arrays)

        def empty(shape, dtype):
            return like.new_empty(shape, dtype=torch_dtype(dtype))

        return stand_ins(op.allocate(plan, empty), like)

    return fake


def _define(op):
    custom = torch.library.custom_op(
        f"moe_numba::{op.name}", _implementation(op), mutates_args=(), schema=schema(op)
    )
    custom.register_fake(_fake(op))
    return custom


CUSTOM_OPS = {op: _define(op) for op in OPS}
"""Each op's custom op (``torch.library.CustomOpDef``), called as ``CUSTOM_OPS[op](*args)``
with :func:`arguments`."""
