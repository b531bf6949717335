"""Untraced calls on torch CUDA tensors, repeated from a recording of the same call key.

Most of a small call's host time goes to the Python between the arguments and the driver:
dispatch, the cached checks and plans, buffer wrappers, the launch plan's lookups. None of it
changes while the call's key repeats, so the second call of a key with ``validate=False`` is
recorded (:class:`moe_numba._gpu.RecordedCall`) and every later one replays it: it allocates
the recorded outputs and scratch (``new_empty``) and hands their addresses and the inputs'
to one C launch sequence (:mod:`moe_numba.kernels._replay`). The public functions ask
:data:`moe_numba._api.REPLAYS` first; :mod:`._calls` and the gradient ops record.

The key holds everything that the checks, the plan and the launches read: per tensor its
shape, dtype, strides, device and the low four bits of its address (the copies' word widths
follow alignment); every scalar argument by value and exact type (``True`` is not ``1``
here), the capacities included. Any other call takes the full path, which checks
everything: arrays that are not all CUDA ``torch.Tensor`` objects, a call that
``torch.compile`` traces or autograd records, ``validate=True``, capacities that are not a
list or tuple of ints, a key met for the first time; and so does a replay that finds
another current device.

A training step passes new capacities every call, so a permute's key met for the first time
has a second chance: the same key with the capacities' row count in their place (the
kernels' grids and the outputs' shapes depend on the counts only through it). Such a key's
recording stages its counts (:mod:`moe_numba.kernels._staged`) and so does each of its
replays, after checking them as the full path does (a list or tuple of ``num_experts`` ints
>= 0); not while the stream is being captured into a CUDA graph, which would read the
pinned block at every replay of the graph. A graph may also outlive a replay and the device
copy of its capacities, so a replay that holds one does not run while the stream is being
captured either: the full path keeps a graph's capacities for good
(:func:`moe_numba.kernels._staged.kept_words`).
"""

from __future__ import annotations

import numpy as np
import torch

from .. import _api
from .._cache import BoundedCache
from .._contract import MAX_ROWS
from .._gpu import RecordedCall

try:  # (without the C launcher nothing is recorded)
    from ..kernels._driver_c import padded_rows as _padded_rows
except ImportError:
    _padded_rows = None

_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # (not in CPU builds)
_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
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
        "_staged",
    )

    def __init__(self, call, recorded):
        from ..kernels import _launch, _staged  # (numba: loaded by the recorded call already)

        self._driver = _launch._DRIVER
        self._sequence, self._names, self._outputs = recorded
        to_torch = call.library.to_torch
        self._allocations = tuple(
            (shape, to_torch[np.dtype(dtype)]) for shape, dtype in call.allocations
        )
        self._like = call.like.new_empty((0,))  # (new_empty parses less than torch.empty)
        self._device_index = call.like.device.index
        self._index = call.launcher.device  # the current device the launches were made on
        self._staged = _staged.ReplayStager(self._index) if call.stages else None
        self._kept = tuple(call.kept)  # (the sequence's constant addresses point into these)

    def __call__(self, addresses, counts=None):
        """The outputs of a call whose arrays are at ``addresses`` (0 for None), or None where
        it finds another current device or an allocation not 16-byte aligned. A recording
        that staged its capacities stages ``counts`` (checked ints)."""
        driver = self._driver
        if driver.current_device() != self._index:
            return None
        if self._kept and _capturing():  # (a graph would outlive the kept device copy)
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
        stream = _raw_stream(self._device_index)
        stager = self._staged
        if stager is None:
            failed = sequence.run(stream, addresses + words, 0, sequence.size)
        else:
            block, pool = stager.stage(counts)
            failed = sequence.run(stream, addresses + words + (block.ptr,), 0, sequence.size)
            stager.release(block, pool, stream)
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


_SCALAR_TYPES = frozenset((int, bool))


def _counts(tokens_per_expert, scalars):
    """``(counts, rows)``: the capacities as a tuple and their padded row count, where they
    are what the contract allows (a list or tuple of ``num_experts`` exact ints >= 0 that
    need at most MAX_ROWS rows); else None (the full path checks them, and raises)."""
    if _padded_rows is None or type(tokens_per_expert) not in (list, tuple):
        return None  # (without the C launcher nothing is recorded)
    counts = tuple(tokens_per_expert)
    try:
        rows = _padded_rows(counts, scalars["num_experts"], scalars["padding_alignment"], MAX_ROWS)
    except OverflowError:  # (E or A past int64)
        return None
    return None if rows < 0 else (counts, rows)


class ReplayedOp:
    """The replays of one op on torch CUDA tensors; called as ``replays(arrays, scalars,
    tokens_per_expert)``, the outputs of a call that a replay repeats, else None.

    Parameters
    ----------
    run : callable
        ``run(backend, plan, arrays, call)``: the op's outputs for a checked call with
        ``validate=False`` (``call``: a :class:`~moe_numba._gpu.RecordedCall`, or None).
    differentiable : tuple of int
        The indices of the arrays that autograd records the op for.
    counted : bool
        Whether the op takes ``tokens_per_expert`` (ignored when the scalar
        ``override_buffer_size`` is >= 0), and has keys of their row count (see the
        module docstring).
    """

    def __init__(self, run, differentiable=(), counted=False):
        self._run = run
        self._differentiable = differentiable
        self._counted = counted
        self._replays = BoundedCache(256)
        self._seen = BoundedCache(256)  # keys met once

    def key(self, arrays, scalars, tokens_per_expert=None):
        """``(key, addresses, rows key)`` of a call that a replay may repeat, else None
        (``arrays``, ``scalars`` and ``tokens_per_expert`` as the op's checks take them).
        The rows key is the key with the capacities' row count in their place, or None for
        a call without capacities."""
        if _is_compiling() or scalars["validate"] is not False:
            return None
        values = tuple(scalars.values())
        types = tuple(map(type, values))
        if not _SCALAR_TYPES.issuperset(types):
            return None
        counts = rows = None
        if self._counted and not _overridden(scalars["override_buffer_size"]):
            found = _counts(tokens_per_expert, scalars)
            if found is None:
                return None
            counts, rows = found
        tensors = _tensors(arrays)
        if tensors is None:
            return None
        if self._differentiable and _grad_enabled():
            for i in self._differentiable:
                if arrays[i] is not None and arrays[i].requires_grad:
                    return None
        key = (tensors[0], values, types, counts)
        return key, tensors[1], None if rows is None else (tensors[0], values, types, rows)

    def __call__(self, arrays, scalars, tokens_per_expert=None):
        found = self.key(arrays, scalars, tokens_per_expert)
        if found is None:
            return None
        key, addresses, rows_key = found
        replay = self._replays.get(key)
        if replay is not None:
            return replay(addresses)
        replay = None if rows_key is None else self._replays.get(rows_key)
        if replay is None or _capturing():  # (a graph would read the staged block again)
            return None
        return replay(addresses, key[3])

    def run(self, backend, plan, arrays, scalars, tokens_per_expert=None):
        """The outputs of a checked call with ``validate=False``: recorded, and its replay
        kept, when its key, or else its rows key, is met the second time (never while the
        stream is being captured: its capacities are kept for the graph, not for eager
        calls)."""
        found = self.key(arrays, scalars, tokens_per_expert)
        if found is None or _capturing():
            return self._run(backend, plan, arrays, None)
        key, _, rows_key = found
        stages = False
        if self._seen.get(key) is None:
            self._seen.put(key, True)
            key, stages = rows_key, True
            if key is not None and self._seen.get(key) is None:
                self._seen.put(key, True)
                key = None
        if key is None:
            return self._run(backend, plan, arrays, None)
        call = RecordedCall(arrays, stages=stages)
        outputs = self._run(backend, plan, arrays, call)
        recorded = call.replay(outputs)
        if recorded is not None:
            self._replays.put(key, Replay(call, recorded))
        return outputs


def _overridden(override_buffer_size):
    """Whether ``override_buffer_size`` makes a permute ignore its capacities."""
    return type(override_buffer_size) is int and override_buffer_size >= 0


def _permute(backend, plan, arrays, call):
    return backend.permute(plan, arrays, False, call=call)[0].result()


def _op(name):
    """``run`` of :class:`ReplayedOp` for a backend op whose outputs are a tuple."""
    return lambda backend, plan, arrays, call: tuple(
        getattr(backend, name)(plan, arrays, False, call=call)[0]
    )


# (the differentiable arrays: the rows and the probabilities, as _calls routes them)
PERMUTE = ReplayedOp(_permute, differentiable=(0, 3), counted=True)
UNPERMUTE = ReplayedOp(_op("unpermute"), differentiable=(0, 3))
PERMUTE_BACKWARD = ReplayedOp(_op("permute_backward"))
UNPERMUTE_BACKWARD = ReplayedOp(_op("unpermute_backward"))

_api.REPLAYS.update(
    permute=PERMUTE,
    unpermute=UNPERMUTE,
    permute_backward=PERMUTE_BACKWARD,
    unpermute_backward=UNPERMUTE_BACKWARD,
)
