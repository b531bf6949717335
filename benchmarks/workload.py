"""The operations the bench times on one case, and their timing against a copy."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from moe_numba import moe_permute, moe_unpermute

from .bytes import permute_bytes, unpermute_bytes
from .cases import make_inputs
from .records import Result


class Operation(NamedTuple):
    """One timed call: its name in the report, the call, the bytes it must move, whether it
    waits for the device itself (``validate=True``)."""

    name: str
    call: Callable[[], object]
    nbytes: int
    synchronizes: bool


def _name(op, validate):
    return op if validate else f"{op} validate=False"


def operations(case, target, validates=(True,)):
    """The permute and (for 16- and 32-bit rows) the weighted unpermute of ``case`` on
    ``target``, once per value in ``validates``.

    The inputs are made once (:func:`.cases.make_inputs`) and uploaded; the unpermute
    combines the rows of one permute call.
    """
    inputs = make_inputs(case)
    hidden, scale, routemap, probs = (
        target.upload(x) for x in (inputs.hidden, inputs.scale, inputs.routemap, inputs.probs)
    )
    permute_args = (hidden, scale, routemap, probs, case.experts, inputs.counts, case.alignment)
    nbytes = permute_bytes(case, inputs.counts)
    ops = [
        Operation(
            _name("permute", validate),
            lambda validate=validate: moe_permute(*permute_args, validate=validate),
            nbytes,
            validate,
        )
        for validate in validates
    ]
    if case.has_unpermute:
        rows, rowmap, row_probs, _ = moe_permute(*permute_args)
        combine_args = (rows, rowmap, routemap, row_probs, case.tokens, case.experts)
        nbytes = unpermute_bytes(case)
        ops += [
            Operation(
                _name("unpermute weighted", validate),
                lambda validate=validate: moe_unpermute(
                    *combine_args, using_weighted_combine=True, validate=validate
                ),
                nbytes,
                validate,
            )
            for validate in validates
        ]
    return ops


def time_operations(case, ops, target, timer, copies=None):
    """A :class:`.records.Result` per operation: ``timer``'s figures of the call and of a
    copy of the same bytes on ``target``, timed once per byte count, right before the first
    operation that moves them.

    ``copies``, when given, is a dict of the copies' figures by byte count that this call
    reads and adds to, so that several calls on one case time each copy once.
    """
    copies = {} if copies is None else copies
    results = []
    for op in ops:
        if op.nbytes not in copies:
            copies[op.nbytes] = timer.time(target.copier(op.nbytes))
        figures = timer.time(op.call, synchronizes=op.synchronizes)
        results.append(Result(case, op.name, op.nbytes, figures, copies[op.nbytes]))
    return results
