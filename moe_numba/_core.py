"""The core's entry for every op: prepare, run on the backend, raise for the status words.

Prepare checks a call before any work: every required array given, where its arrays live,
its metadata (shapes, dtypes, scalars) by the contract's rules, contiguity and device; the
result, the backend of that location and the op's plan, is remembered per call key in the
op's :class:`CallCache`. Run hands the plan and the arrays to the backend; with
``validate=True`` the status words the backend returns are turned into the contract's
errors.

The core serves every array kind through :mod:`moe_numba._libraries` and knows no array
library by name: the public functions (:mod:`moe_numba._api`) and the torch integration
(:mod:`moe_numba.torch`) call down into it, and it calls up into neither.
"""

from __future__ import annotations

from ._cache import BoundedCache, on_clear
from ._capacities import forget_capacity_plans, with_capacities
from ._contract import (
    ArrayMeta,
    check_permute_metadata,
    check_unpermute_metadata,
    raise_for_permute_status,
    raise_for_unpermute_status,
)
from ._contract_backward import (
    check_permute_backward_metadata,
    check_unpermute_backward_metadata,
    raise_for_permute_backward_status,
    raise_for_unpermute_backward_status,
)
from ._contract_sort import (
    SortArrays,
    check_sort_metadata,
    host_ints,
    is_device_array,
    raise_for_sort_status,
)
from ._dispatch import call_key, check_arrays, check_given, locate
from ._libraries import array_library

# the names of each op's scalar arguments that its checks read, in the order of its scalars
PERMUTE_SCALARS = (
    "num_experts",
    "padding_alignment",
    "do_gather",
    "using_ue8m0_scale",
    "return_expert_indices",
    "override_buffer_size",
    "validate",
    "return_expert_offsets",
)
UNPERMUTE_SCALARS = (
    "total_zipped_tokens",
    "num_experts",
    "using_mix_precision",
    "using_weighted_combine",
    "validate",
)
PERMUTE_BACKWARD_SCALARS = ("validate",)
UNPERMUTE_BACKWARD_SCALARS = ("using_weighted_combine", "num_rows", "validate")


def metadata(arrays):
    """The shape and dtype of each array (None stays None), as the contract reads them."""
    meta = []
    for x in arrays:
        library = None if x is None else array_library(x)
        meta.append(None if x is None else ArrayMeta(library.shape(x), library.dtype(x)))
    return arrays._make(meta)


def _cpu_backend():
    from . import _cpu

    return _cpu


def _gpu_backend():
    from ._gpu import gpu_backend

    return gpu_backend()


# location (see ``locate``) -> loader of the backend: both offer ``op(plan, arrays, validate)
# -> (outputs, status)`` for every op
_BACKENDS = {"cpu": _cpu_backend, "cuda": _gpu_backend}


class CallCache:
    """One op's memo of prepared calls: call key -> (backend, plan).

    Parameters
    ----------
    check_metadata : callable
        The contract's check of the op: ``check_metadata(metadata, **scalars) -> plan``.
    """

    def __init__(self, check_metadata):
        self._check_metadata = check_metadata
        self._calls = BoundedCache(256)

    def prepare(self, arrays, scalars):
        """(backend, plan) of a call: every required array given, where its arrays live,
        its metadata checked, contiguity and device checked, in that order; remembered by
        :func:`~moe_numba._dispatch.call_key` (errors never are).

        ``arrays`` is the op's arrays NamedTuple (its field names name the arguments in
        errors); ``scalars`` maps the names of the other arguments that the checks read to
        their values.
        """

        def prepare():
            check_given(arrays)
            named = arrays._asdict()
            location = locate(named)
            plan = self._check_metadata(metadata(arrays), **scalars)
            check_arrays(named)
            return _BACKENDS[location](), plan

        return self._calls.get_or_compute(call_key(arrays, scalars.values()), prepare)

    def clear(self):
        """Forget every prepared call."""
        self._calls.clear()


PERMUTE = CallCache(check_permute_metadata)
UNPERMUTE = CallCache(check_unpermute_metadata)
PERMUTE_BACKWARD = CallCache(check_permute_backward_metadata)
UNPERMUTE_BACKWARD = CallCache(check_unpermute_backward_metadata)
SORT_CHUNKS = CallCache(check_sort_metadata)


@on_clear
def clear():
    """Forget every prepared call of every op and the capacities planned for them (one of
    the clears of :func:`moe_numba.clear`)."""
    for calls in (PERMUTE, UNPERMUTE, PERMUTE_BACKWARD, UNPERMUTE_BACKWARD, SORT_CHUNKS):
        calls.clear()
    forget_capacity_plans()


def _allocator(empty):
    """The keyword that hands a caller's output allocator to a backend, if there is one."""
    return {} if empty is None else {"empty": empty}


# ------------------------------------------------------------------------------------------
# permute and unpermute


def permute_scalars(*values):
    """The arguments of ``moe_permute`` that its checks read, by name (``values`` in the
    order of PERMUTE_SCALARS)."""
    return dict(zip(PERMUTE_SCALARS, values, strict=True))


def planned_permute(arrays, scalars, tokens_per_expert):
    """(backend, plan) of a ``moe_permute`` call, its metadata and capacities checked."""
    backend, plan = PERMUTE.prepare(arrays, scalars)
    return backend, with_capacities(plan, tokens_per_expert)


def run_permute(backend, plan, arrays, validate, empty=None):
    """``moe_permute``'s outputs (its returned tuple) for a call that
    :func:`planned_permute` has checked (``empty(shape, dtype)``, if given, allocates the
    outputs instead of the arrays' library)."""
    outputs, status = backend.permute(plan, arrays, validate, **_allocator(empty))
    if validate:
        raise_for_permute_status(status, plan)
    return outputs.result()


def unpermute_scalars(*values):
    """The arguments of ``moe_unpermute`` that its checks read, by name (``values`` in the
    order of UNPERMUTE_SCALARS)."""
    return dict(zip(UNPERMUTE_SCALARS, values, strict=True))


def planned_unpermute(arrays, scalars):
    """(backend, plan) of a ``moe_unpermute`` call, its metadata checked."""
    return UNPERMUTE.prepare(arrays, scalars)


def run_unpermute(backend, plan, arrays, validate, empty=None):
    """``moe_unpermute``'s outputs for a call that :func:`planned_unpermute` has checked
    (``empty`` as for :func:`run_permute`)."""
    outputs, status = backend.unpermute(plan, arrays, validate, **_allocator(empty))
    if validate:
        raise_for_unpermute_status(status, plan)
    return tuple(outputs)


# ------------------------------------------------------------------------------------------
# the gradient ops


def planned_permute_backward(arrays, scalars):
    """(backend, plan) of a ``moe_permute_backward`` call, its metadata checked."""
    return PERMUTE_BACKWARD.prepare(arrays, scalars)


def run_permute_backward(backend, plan, arrays, validate, empty=None):
    """``moe_permute_backward``'s outputs for a checked call: ``(None, None)`` when both
    gradients are None (nothing is read)."""
    return _run_gradient(
        backend.permute_backward, raise_for_permute_backward_status, plan, arrays, validate, empty
    )


def planned_unpermute_backward(arrays, scalars):
    """(backend, plan) of a ``moe_unpermute_backward`` call, its metadata checked."""
    return UNPERMUTE_BACKWARD.prepare(arrays, scalars)


def run_unpermute_backward(backend, plan, arrays, validate, empty=None):
    """``moe_unpermute_backward``'s outputs for a checked call (as
    :func:`run_permute_backward`)."""
    return _run_gradient(
        backend.unpermute_backward,
        raise_for_unpermute_backward_status,
        plan,
        arrays,
        validate,
        empty,
    )


def _run_gradient(op, raise_for_status, plan, arrays, validate, empty):
    """A gradient op's outputs: ``op`` (the backend's) unless there is nothing to compute,
    then its status words raised for when validating."""
    if not plan.computes:
        return None, None
    outputs, status = op(plan, arrays, validate, **_allocator(empty))
    if validate:
        raise_for_status(status, plan)
    return tuple(outputs)


# ------------------------------------------------------------------------------------------
# moe_sort_chunks


def sort_chunks_call(x, split_sizes, order, probs):
    """``(arrays, scalars)`` of a ``moe_sort_chunks`` call, its host ints checked: sizes in
    a CUDA array are one of its arrays, host sizes and the order are scalars."""
    device_sizes = split_sizes if is_device_array(split_sizes) else None
    host_sizes = None if device_sizes is not None else host_ints("split_sizes", split_sizes)
    return SortArrays(x, probs, device_sizes), dict(
        order=host_ints("order", order), host_sizes=host_sizes
    )


def sort_chunks(x, split_sizes, order, probs=None, *, validate=True, empty=None):
    """``moe_sort_chunks`` on arrays of any kind: its
    :class:`~moe_numba._contract_sort.SortOutputs`. ``empty(shape, dtype)``, if given,
    allocates the outputs instead of the arrays' library."""
    arrays, scalars = sort_chunks_call(x, split_sizes, order, probs)
    backend, plan = SORT_CHUNKS.prepare(arrays, {**scalars, "validate": validate})
    outputs, status = backend.sort_chunks(plan, arrays, validate, **_allocator(empty))
    if validate and status is not None:
        raise_for_sort_status(status, plan)
    return outputs
