"""Untraced calls on torch CUDA tensors, repeated from a recording of the same call key.

Most of a small call's host time goes to the Python between the arguments and the driver:
dispatch, the cached checks and plans, buffer wrappers, the launch plan's lookups. None of it
changes while the call's key repeats, so the second call of a key with ``validate=False`` is
recorded (:class:`moe_numba._gpu.RecordedCall`) and every later one replays it: it allocates
the recorded outputs and scratch with ``torch.empty`` and hands their addresses and the
inputs' to one C launch sequence (:mod:`moe_numba.kernels._replay`).

The key holds everything that the checks, the plan and the launches read: per tensor its
shape, dtype, strides, device and the low four bits of its address (the copies' word widths
follow alignment); every scalar argument by value and exact type (``True`` is not ``1``
here), the capacities included. Any other call takes the full path, which checks
everything: arrays that are not all CUDA ``torch.Tensor`` objects, a call that
``torch.compile`` traces or autograd records, ``validate=True``, capacities that are not a
list or tuple of ints, a key met for the first time (a training step's new capacities);
and so does a replay that finds another current device.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import _api
from .._cache import BoundedCache
from .._gpu import RecordedCall

_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # (not in CPU builds)
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled


class Replay:
    """What a later call of a recorded key repeats: its allocations and its launches.

    Parameters
    ----------
    call : moe_numba._gpu.RecordedCall
        The recorded call, after its op ran.
    recorded : tuple
        ``call.replay(result)``: the C sequence, its kernels' names, the outputs.
    """

    __slots__ = (
        "_allocations",
        "_device_index",
        "_driver",
        "_index",
        "_kept",
        "_like",
        "_names",
        "_outputs",
        "_sequence",
    )

    def __init__(self, call, recorded):
        from ..kernels import _launch  # (numba: loaded by the recorded call already)

        self._driver = _launch._DRIVER
        self._sequence, self._names, self._outputs = recorded
        to_torch = call.library.to_torch
        self._allocations = tuple(
            (shape, to_torch[np.dtype(dtype)]) for shape, dtype in call.allocations
        )
        self._like = call.like.new_empty((0,))  # (new_empty parses less than torch.empty)
        self._device_index = call.like.device.index
        self._index = call.launcher.device  # the current device the launches were made on
        self._kept = tuple(call.kept)  # (the sequence's constant addresses point into these)

    def __call__(self, addresses):
        """The outputs of a call whose arrays are at ``addresses`` (0 for None), or None where
        it finds another current device or an allocation not 16-byte aligned."""
        driver = self._driver
        if driver.current_device() != self._index:
            return None
        like = self._like
        allocated = [like.new_empty(shape, dtype=dtype) for shape, dtype in self._allocations]
        words = tuple([x.data_ptr() for x in allocated])
        bits = 0
        for word in words:
            bits |= word
        if bits & 15:
            return None
        sequence = self._sequence
        failed = sequence.run(_raw_stream(self._device_index), addresses + words, 0, sequence.size)
        if failed is not None:
            step, err = failed
            raise driver.error(err, self._names[step])
        return tuple([None if j < 0 else allocated[j] for j in self._outputs])


def _tensors(arrays):
    """``(key, addresses)`` of a call's arrays: per tensor its shape, dtype, strides, device
    and low address bits, and its address; per None, None and 0. None unless every array
    is a ``torch.Tensor`` or None (only keys of CUDA tensors are ever recorded)."""
    key, addresses = [], []
    for x in arrays:
        if x is None:
            key.append(None)
            addresses.append(0)
            continue
        if type(x) is not torch.Tensor:
            return None
        address = x.data_ptr()
        key.append((x.shape, x.dtype, x.stride(), x.device, address & 15))
        addresses.append(address)
    return tuple(key), tuple(addresses)


_INT = frozenset((int,))
_SCALAR_TYPES = frozenset((int, bool))


def _counts(tokens_per_expert):
    """The capacities as part of a key: the ints of a list or tuple as a tuple, None for
    None, else False (a kind that no key holds)."""
    if tokens_per_expert is None:
        return None
    if type(tokens_per_expert) not in (list, tuple):
        return False
    counts = tuple(tokens_per_expert)
    return counts if _INT.issuperset(map(type, counts)) else False


class ReplayedOp:
    """The replays of one op on torch CUDA tensors.

    Parameters
    ----------
    run : callable
        ``run(backend, plan, arrays, call)``: the op's outputs for a checked call with
        ``validate=False`` (``call``: a :class:`~moe_numba._gpu.RecordedCall`, or None).
    """

    def __init__(self, run):
        self._run = run
        self._replays = BoundedCache(256)
        self._seen = BoundedCache(256)  # keys met once

    @staticmethod
    def key(arrays, scalars, counts=None, differentiable=()):
        """``(key, addresses)`` of a call that a replay may repeat, else None.

        ``scalars`` are the call's other arguments but the capacities, ``counts``
        ``tokens_per_expert`` (None where ignored), ``differentiable`` the arrays that
        autograd would record the call for.
        """
        if _is_compiling() or scalars[-1] is not False:  # (the last one is validate)
            return None
        counts = _counts(counts)
        types = tuple(map(type, scalars))
        if counts is False or not _SCALAR_TYPES.issuperset(types):
            return None
        tensors = _tensors(arrays)
        if tensors is None:
            return None
        if differentiable and _grad_enabled():
            for x in differentiable:
                if x is not None and x.requires_grad:
                    return None
        return (tensors[0], scalars, types, counts), tensors[1]

    def repeat(self, found):
        """The outputs of the call that ``found`` (:meth:`key`'s answer) describes, if a
        replay repeats it; else None."""
        if found is None:
            return None
        replay = self._replays.get(found[0])
        return None if replay is None else replay(found[1])

    def run(self, found, backend, plan, arrays):
        """The outputs of a checked call with ``validate=False`` (``found``: its
        :meth:`key`, or None): recorded, and its replay kept, when its key is met the second
        time."""
        key = None if found is None else found[0]
        if key is None or self._seen.get(key) is None:
            if key is not None:
                self._seen.put(key, True)
            return self._run(backend, plan, arrays, None)
        call = RecordedCall(arrays)
        outputs = self._run(backend, plan, arrays, call)
        recorded = call.replay(outputs)
        if recorded is not None:
            self._replays.put(key, Replay(call, recorded))
        return outputs


def _permute(backend, plan, arrays, call):
    return backend.permute(plan, arrays, False, call=call)[0].result()


def _op(name):
    """``run`` of :class:`ReplayedOp` for a backend op whose outputs are a tuple."""
    return lambda backend, plan, arrays, call: tuple(
        getattr(backend, name)(plan, arrays, False, call=call)[0]
    )


PERMUTE = ReplayedOp(_permute)
UNPERMUTE = ReplayedOp(_op("unpermute"))
PERMUTE_BACKWARD = ReplayedOp(_op("permute_backward"))
UNPERMUTE_BACKWARD = ReplayedOp(_op("unpermute_backward"))


def permute_counts(tokens_per_expert, override_buffer_size):
    """The capacities of a permute's key: None where ``override_buffer_size`` ignores them."""
    override = type(override_buffer_size) is int and override_buffer_size >= 0
    return None if override else tokens_per_expert


# The public functions' first step (moe_numba._api.REPLAYS): each takes the op's arguments
# in order and returns the outputs of a replayed call, or None.


def _permute_replayed(
    x, scale, routemap, probs, E, counts, A, gather, ue8m0, indices, override, validate
):
    found = PERMUTE.key(
        (x, scale, routemap, probs),
        (E, A, gather, ue8m0, indices, override, validate),
        permute_counts(counts, override),
        (x, probs),
    )
    return PERMUTE.repeat(found)


def _unpermute_replayed(rows, rowmap, routemap, probs, T, E, mix, weighted, validate):
    found = UNPERMUTE.key(
        (rows, rowmap, routemap, probs), (T, E, mix, weighted, validate), None, (rows, probs)
    )
    return UNPERMUTE.repeat(found)


def _permute_backward_replayed(arrays, validate):
    return PERMUTE_BACKWARD.repeat(PERMUTE_BACKWARD.key(arrays, (validate,)))


def _unpermute_backward_replayed(arrays, weighted, num_rows, validate):
    return UNPERMUTE_BACKWARD.repeat(UNPERMUTE_BACKWARD.key(arrays, (weighted, num_rows, validate)))


_api.REPLAYS.update(
    permute=_permute_replayed,
    unpermute=_unpermute_replayed,
    permute_backward=_permute_backward_replayed,
    unpermute_backward=_unpermute_backward_replayed,
)
