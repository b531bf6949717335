"""``tokens_per_expert``: checked, turned into a permute's capacities and row count, and
remembered per value (a training loop repeats the same metadata and often the same counts).

The metadata rules and the plan they fill in are :mod:`moe_numba._contract`'s.
"""

from __future__ import annotations

import operator

import numpy as np

from ._cache import BoundedCache
from ._contract import INT64_MAX, MAX_ROWS, ROWMAP_INT32, is_int
from ._libraries import classify, dlpack_cuda

# (id of a metadata plan, tokens_per_expert) -> (that plan, the plan with rows)
_capacity_plans = BoundedCache(256)


def forget_capacity_plans():
    """Forget every remembered plan with capacities."""
    _capacity_plans.clear()


def capacities_from(tokens_per_expert, num_experts):
    """``tokens_per_expert`` as an int64 NumPy array of ``num_experts`` values >= 0."""
    if tokens_per_expert is None or isinstance(tokens_per_expert, (str, bytes)):
        raise TypeError(
            "tokens_per_expert must be a sequence of num_experts ints (or pass "
            f"override_buffer_size >= 0); got {type(tokens_per_expert).__name__}"
        )
    library = classify(tokens_per_expert)
    if (library is not None and library.location == "cuda") or dlpack_cuda(tokens_per_expert):
        raise TypeError(
            "tokens_per_expert must be a host sequence of ints (list, tuple, NumPy array or "
            f"torch CPU tensor); got a CUDA array ({type(tokens_per_expert).__name__}); use "
            "override_buffer_size to count on the device"
        )
    try:
        values = np.asarray(tokens_per_expert)
    except Exception as error:  # e.g. a ragged nested list
        raise TypeError(
            f"tokens_per_expert must be a sequence of ints; got {tokens_per_expert!r}"
        ) from error
    given_array = isinstance(tokens_per_expert, np.ndarray)
    if values.ndim > 1 and not given_array:
        raise TypeError(
            "tokens_per_expert must be a flat sequence of ints; got a sequence of sequences "
            f"(shape {values.shape})"
        )
    if (
        values.ndim == 1
        and values.dtype.kind in "fO"
        and not given_array
        and all(map(is_int, tokens_per_expert))
    ):
        # ints that no NumPy integer type holds together (past uint64, or 2**63 next to a
        # negative) come out as objects or floats: check them as the ints given
        values = np.array([operator.index(x) for x in tokens_per_expert], dtype=object)
    elif values.dtype == np.bool_ or not (
        np.issubdtype(values.dtype, np.integer) or values.size == 0
    ):
        raise TypeError(
            f"tokens_per_expert must hold ints; got dtype {values.dtype} "
            f"({type(tokens_per_expert).__name__})"
        )
    if values.shape != (num_experts,):
        raise ValueError(
            f"tokens_per_expert must hold num_experts = {num_experts} values; "
            f"got shape {values.shape}"
        )
    if values.size and values.min() < 0:
        e = int(np.argmin(values))
        raise ValueError(
            f"tokens_per_expert must be >= 0; got tokens_per_expert[{e}] = {int(values[e])}"
        )
    if values.size and values.max() > INT64_MAX:  # uint64, or Python ints
        e = int(np.argmax(values))
        raise ValueError(
            f"tokens_per_expert must be at most 2**63 - 1 (int64); got "
            f"tokens_per_expert[{e}] = {int(values[e])}"
        )
    return values.astype(np.int64)


def with_capacities(plan, tokens_per_expert):
    """``plan`` with its capacities and row count (unchanged under ``override_buffer_size``).

    Raises ``TypeError``/``ValueError`` for a bad ``tokens_per_expert``.
    """
    if plan.num_rows >= 0:
        return plan
    key = _capacities_key(plan, tokens_per_expert)
    # (the entry keeps its plan alive, so an entry found by id(plan) is this plan's)
    entry = _capacity_plans.get_or_compute(key, lambda: (plan, _plan_rows(plan, tokens_per_expert)))
    return entry[1]


def _capacities_key(plan, tokens_per_expert):
    """A key for ``plan`` with these capacities (values and their types: ``[2.0]`` must still
    fail as ``[2]`` passes), or None for a type not worth keying. The plan enters by its id
    (plans come from the metadata cache, one object per call key): its entry keeps the plan,
    so the id cannot be reused while the entry lives."""
    if type(tokens_per_expert) in (list, tuple):
        return id(plan), tuple(tokens_per_expert), tuple(map(type, tokens_per_expert))
    if type(tokens_per_expert) is np.ndarray:
        array = tokens_per_expert
        return id(plan), array.dtype, array.shape, array.tobytes()
    return None


def _plan_rows(plan, tokens_per_expert):
    counted = _plain_capacities(tokens_per_expert, plan.num_experts, plan.alignment)
    if counted is None:
        capacities = capacities_from(tokens_per_expert, plan.num_experts)
        num_rows = _rows_needed(capacities, plan.alignment)
    else:
        capacities, num_rows = counted
    if num_rows > MAX_ROWS:
        raise ValueError(
            f"tokens_per_expert padded to multiples of padding_alignment = {plan.alignment} "
            f"need {num_rows} rows; at most 2**31 - 1 are possible ({ROWMAP_INT32})"
        )
    return plan._replace(capacities=capacities, num_rows=num_rows)


def _plain_capacities(tokens_per_expert, num_experts, alignment):
    """``(capacities, rows needed)`` for the common case, a list or tuple of ``num_experts``
    Python ints in [0, 2**63 - 1], computed without NumPy's per-call overhead (a training
    step passes new counts every call); None for anything else, which
    :func:`capacities_from` checks (and refuses with its errors)."""
    if not plain_ints(tokens_per_expert) or len(tokens_per_expert) != num_experts:
        return None
    if min(tokens_per_expert) < 0 or max(tokens_per_expert) > INT64_MAX:
        return None
    return np.array(tokens_per_expert, dtype=np.int64), padded_rows(tokens_per_expert, alignment)


_INT = frozenset((int,))


def plain_ints(values):
    """Whether ``values`` is a list or tuple of Python ints (exactly: no bools, no NumPy
    integers)."""
    return type(values) in (list, tuple) and _INT.issuperset(map(type, values))


def _rows_needed(capacities, alignment):
    """``sum_e ceil(n_e / A) * A`` for int64 capacities ``n_e`` >= 0, exact (a Python int:
    with large capacities or alignments the sum passes what int64 holds)."""
    if capacities.size == 0:
        return 0
    if (int(capacities.max()) + alignment) * capacities.size <= INT64_MAX:  # (the usual case)
        return int((-(-capacities // alignment) * alignment).sum())
    return padded_rows(capacities.tolist(), alignment)


def padded(count, alignment):
    """The contract's padding rule: ``ceil(n / A) * A`` rows for an expert of ``n`` >= 0
    tokens; exact for Python ints (and traced ones, torch.compile's), element-wise for
    NumPy integer arrays."""
    return -(-count // alignment) * alignment


def padded_rows(counts, alignment):
    """``sum_e ceil(n_e / A) * A`` of ints ``n_e`` >= 0 (:func:`padded`, summed), exact."""
    return sum(padded(n, alignment) for n in counts)
