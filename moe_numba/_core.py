"""The core: the front of NumPy and CUDA arrays, and what every front runs a call through.

For one op (its declaration, :mod:`.ops`) a call is prepared, then run:

- :func:`prepare` checks the call before any work: every required array given, where its
  arrays live, its metadata (shapes, dtypes, scalars) by the op's check, contiguity and
  device; the result, the backend of that location and the op's plan, is remembered per call
  key (:func:`._dispatch.call_key`) in the op's :class:`CallCache`. A permute's capacities
  are checked and planned apart (:mod:`._capacities`).
- :func:`run` hands the plan and the arrays to the backend's method of the op and, when the
  plan validates, raises what its status words report.

:func:`call` is both, and the front of every array kind that needs nothing else (NumPy
arrays, numba device arrays, CuPy arrays): the public functions call it with their result.
The torch integration (:mod:`moe_numba.torch`) calls :func:`prepare` and :func:`run` itself;
the core calls up into no front and knows no array library by name.
"""

from __future__ import annotations

from ._cache import BoundedCache, on_clear
from ._capacities import forget_capacity_plans, with_capacities
from ._contract import ArrayMeta
from ._dispatch import call_key, check_arrays, check_given, locate
from ._libraries import array_library
from .ops import OPS


def metadata(arrays):
    """The shape and dtype of each array (None stays None), as the contract reads them."""
    meta = []
    for x in arrays:
        library = None if x is None else array_library(x)
        meta.append(None if x is None else ArrayMeta(library.shape(x), library.dtype(x)))
    return arrays._make(meta)


def cpu_backend():
    """The CPU backend: the Cython loops of :mod:`moe_cpu`, for NumPy arrays and views of
    CPU tensors.

    Returns
    -------
    module
        One function per op, named as the op: ``<op.name>(plan, arrays, empty) ->
        (outputs, status)``.
    """
    from . import _cpu

    return _cpu


def gpu_backend():
    """The GPU backend: the numba.cuda kernels, loaded on first use.

    Returns
    -------
    object
        One method per op, named as the op: ``<op.name>(plan, arrays, empty=None) ->
        (outputs, status)``.

    Raises
    ------
    moe_numba.GPUUnavailableError
        Where it cannot load, saying what is missing (numba.cuda, a GPU and its driver, the
        CUDA compiler libraries).
    """
    from ._gpu import gpu_backend

    return gpu_backend()


# location (see ``locate``) -> loader of the backend: both offer one method per op, named
# as the op: ``backend.<op.name>(plan, arrays, empty=...) -> (outputs, status)``
_BACKENDS = {"cpu": cpu_backend, "cuda": gpu_backend}


class CallCache:
    """One op's memo of prepared calls: call key -> (backend, plan).

    Parameters
    ----------
    op : moe_numba.ops.Op
        The op whose calls it prepares.
    """

    def __init__(self, op):
        self._op = op
        self._calls = BoundedCache(256)

    def prepare(self, arrays, scalars):
        """(backend, plan) of a call: every required array given, where its arrays live,
        its metadata checked, contiguity and device checked, in that order; remembered by
        the call key (errors never are). ``arrays`` and ``scalars`` are the op's
        NamedTuples (their field names name the arguments in errors)."""

        def prepare():
            check_given(arrays)
            named = arrays._asdict()
            location = locate(named)
            plan = self._op.check(metadata(arrays), scalars)
            check_arrays(named)
            return _BACKENDS[location](), plan

        return self._calls.get_or_compute(call_key(arrays, scalars), prepare)

    def clear(self):
        """Forget every prepared call."""
        self._calls.clear()

    def __len__(self):
        """The number of prepared calls remembered."""
        return len(self._calls)


CALLS = {op: CallCache(op) for op in OPS}


@on_clear
def clear():
    """Forget every prepared call of every op and the capacities planned for them (one of
    the clears of :func:`moe_numba.clear`)."""
    for calls in CALLS.values():
        calls.clear()
    forget_capacity_plans()


def prepare(op, arrays, scalars, capacities=None):
    """A call of ``op`` checked, and what runs it.

    Parameters
    ----------
    op : moe_numba.ops.Op
        The op.
    arrays, scalars : NamedTuple
        The op's arrays and scalars (``op.arrays``, ``op.scalars``); their field names name
        the arguments in errors.
    capacities : sequence of int, optional
        A permute's ``tokens_per_expert`` (ignored under ``override_buffer_size``).

    Returns
    -------
    backend
        The backend of the arrays' location (:func:`cpu_backend`, :func:`gpu_backend`).
    plan : NamedTuple
        The op's plan (shapes and flags, from metadata alone; a permute's with its
        capacities). Both are remembered per call key (:class:`CallCache`): a second call
        with the same metadata and scalars gets the same objects.

    Raises
    ------
    TypeError, ValueError
        An argument the contract refuses, named.
    """
    backend, plan = CALLS[op].prepare(arrays, scalars)
    if op.capacities:
        plan = with_capacities(plan, capacities)
    return backend, plan


def run(op, backend, plan, arrays, empty=None):
    """Run a call that :func:`prepare` has checked.

    Parameters
    ----------
    op, backend, plan, arrays
        The op, what :func:`prepare` returned for the call, and its arrays.
    empty : callable, optional
        ``empty(shape, dtype)`` allocating the outputs instead of the arrays' library.

    Returns
    -------
    NamedTuple
        The op's outputs (None for an output not asked for; all None when the plan has
        nothing to compute).

    Raises
    ------
    ValueError
        Where the plan validates and the backend's status words report a bad value.
    """
    if not plan.runs:
        return op.outputs(*(None for _ in op.outputs._fields))
    run_op = getattr(backend, op.name)
    outputs, status = run_op(plan, arrays) if empty is None else run_op(plan, arrays, empty)
    if status is not None:
        op.raise_for(status, plan)
    return outputs


def outputs(op, arrays, scalars, capacities=None):
    """Every output of a call of ``op``: :func:`prepare`, then :func:`run`, on arrays the
    core serves as they are (NumPy arrays and CUDA arrays).

    Parameters
    ----------
    op, arrays, scalars, capacities
        As for :func:`prepare`; ``op.host_values`` reads the scalars' host values first
        where the op has them (``moe_sort_chunks``'s sizes).

    Returns
    -------
    NamedTuple
        The op's outputs, as :func:`run` returns them.
    """
    if op.host_values is not None:
        arrays, scalars = op.host_values(arrays, scalars)
    backend, plan = prepare(op, arrays, scalars, capacities)
    return run(op, backend, plan, arrays)


def call(op, arrays, scalars, capacities=None):
    """The public result of a call of ``op`` on arrays the core serves: :func:`outputs` as the
    public function returns them."""
    return outputs(op, arrays, scalars, capacities).result()
