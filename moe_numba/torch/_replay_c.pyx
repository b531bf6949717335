# cython: language_level=3
"""The replays of :mod:`moe_numba.torch._replay`, compiled: their key, lookup and launches.

A replayed call's host time is torch's (its tensors' attributes, the outputs' allocations)
and the driver's (the launches) plus the Python between them; here that Python runs as C.
The module docstring of :mod:`moe_numba.torch._replay` says what a key holds and when a
call is replayed; this module is built with the package, beside the C launcher it needs.
"""

from cpython.long cimport PyLong_CheckExact
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE, PyTuple_New, PyTuple_SET_ITEM
from libc.stdint cimport uintptr_t

import numpy as np
import torch

from .._cache import BoundedCache
from .._contract import MAX_ROWS as _MAX_ROWS
from .._gpu import RecordedCall
from ..runtime._driver_c import padded_rows

ctypedef int (*DeviceFn)(int *) noexcept nogil

cdef object _Tensor = torch.Tensor
cdef object _raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # (CUDA builds)
cdef object _capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
# scratch comes from torch's caching allocator as an address: no tensor made and dropped
cdef object _raw_alloc = getattr(torch._C, "_cuda_cudaCachingAllocator_raw_alloc", None)
cdef object _raw_delete = getattr(torch._C, "_cuda_cudaCachingAllocator_raw_delete", None)
cdef object _grad_enabled = torch.is_grad_enabled

cdef tuple _tensors(tuple arrays):
    """``(key, addresses)`` of a call's arrays: per tensor its shape, dtype, device and low
    address bits (contiguous: its strides follow from its shape), and its address; per None,
    None and 0. None unless every array is a contiguous ``torch.Tensor`` or None (a
    strided view takes the full path, which raises)."""
    cdef Py_ssize_t i, n = PyTuple_GET_SIZE(arrays)
    cdef tuple key = PyTuple_New(n)
    cdef tuple addresses = PyTuple_New(n)
    cdef object x, address, entry
    for i in range(n):
        x = <object>PyTuple_GET_ITEM(arrays, i)
        if x is None:
            entry = None
            address = 0
        else:
            if type(x) is not _Tensor or not x.is_contiguous():
                return None
            address = x.data_ptr()
            entry = (x.shape, x.dtype, x.device, address & 15)
        Py_INCREF(entry)
        PyTuple_SET_ITEM(key, i, entry)
        Py_INCREF(address)
        PyTuple_SET_ITEM(addresses, i, address)
    return key, addresses


cdef object _scalar_types(tuple values):
    """Which of ``values`` are bools, as bits (``True`` is not ``1`` in a key), or None
    unless every value is an exact int or a bool."""
    cdef Py_ssize_t i
    cdef object v
    cdef unsigned long long bools = 0
    for i in range(PyTuple_GET_SIZE(values)):
        v = <object>PyTuple_GET_ITEM(values, i)
        if v is True or v is False:
            bools |= 1ULL << i
        elif not PyLong_CheckExact(v):
            return None
    return bools


cdef class Replay:
    """What a later call of a recorded key repeats: its allocations and its launches.

    Parameters
    ----------
    call : moe_numba._gpu.RecordedCall
        The recorded call, after its op ran.
    recorded : tuple
        ``call.replay(outputs)``: the C sequence, its kernels' names, the index of each
        output's allocation (-1 for None).
    result : tuple of int
        Per element of the public result, the position of its output.
    counts : tuple or None
        The capacities of the recorded call, where it staged them.
    """

    cdef object _driver, _sequence, _names, _staged, _last
    cdef tuple _outputs, _allocations, _kept
    cdef readonly tuple result
    cdef int _index, _device_index, _size
    cdef uintptr_t _get_device

    def __init__(self, call, recorded, result, counts=None):
        from ..runtime import _staged, get_runtime  # (numba: loaded by the recorded call)

        driver = get_runtime().driver
        self._driver = driver
        self._get_device = driver.get_device_address
        self._sequence, self._names, outputs = recorded
        self.result = tuple(result)
        self._size = self._sequence.size
        self._outputs = tuple(outputs)
        to_torch = call.library.to_torch
        allocations = []
        for j, (shape, dtype) in enumerate(call.allocations):
            dtype = np.dtype(dtype)
            if j in outputs or _raw_alloc is None:  # a tensor (of that dtype: no dtype argument)
                allocations.append((call.like.new_empty((0,), dtype=to_torch[dtype]), shape))
            else:  # scratch: an address
                allocations.append((None, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize))
        self._allocations = tuple(allocations)
        self._device_index = call.like.device.index
        self._index = call.launcher.device  # the current device the launches were made on
        self._staged = _staged if call.staged else None  # (its stage and release)
        self._last = counts  # the capacities staged last
        self._kept = tuple(call.kept)  # (the sequence's constant addresses point into these)

    cdef object run(self, tuple addresses, object counts):
        """The outputs of a call whose arrays are at ``addresses`` (0 for None), every one of
        the op's (None where not asked for), or None where it finds another current device or
        an allocation not 16-byte aligned. A recording
        that staged its capacities stages ``counts`` (checked ints), or returns None for
        the capacities it staged last: repeated capacities take the full path, which gives
        them a device copy and a replay of their own."""
        cdef int device = -1
        if counts is not None and counts == self._last:
            return None
        if (<DeviceFn>self._get_device)(&device) != 0 or device != self._index:
            return None
        if self._kept and _capturing():  # (a graph would outlive the kept device copy)
            return None
        stream = _raw_stream(self._device_index)
        cdef Py_ssize_t j, n = PyTuple_GET_SIZE(self._allocations)
        cdef list tensors = [None] * n
        cdef list scratch = []
        cdef tuple words = PyTuple_New(n)
        cdef uintptr_t bits = 0
        cdef object word, like, size
        try:
            for j in range(n):
                like, size = <tuple>PyTuple_GET_ITEM(self._allocations, j)
                if like is None:
                    word = _raw_alloc(size, stream) if size else 0
                    if word:
                        scratch.append(word)
                else:
                    x = like.new_empty(size)
                    tensors[j] = x
                    word = x.data_ptr()
                bits |= <uintptr_t>word
                Py_INCREF(word)
                PyTuple_SET_ITEM(words, j, word)
            if bits & 15:
                return None
            if self._staged is None:
                failed = self._sequence.run(stream, addresses + words, 0, self._size)
            else:
                block, pool = self._staged.stage(self._index, counts)
                failed = self._sequence.run(
                    stream, addresses + words + (block.ptr,), 0, self._size
                )
                self._staged.release(block, pool, stream)
                self._last = counts
        finally:  # (stream-ordered: reused only by later work on this stream)
            for word in scratch:
                _raw_delete(word)
        if failed is not None:
            step, err = failed
            raise self._driver.error(err, self._names[step])
        cdef Py_ssize_t m = PyTuple_GET_SIZE(self._outputs)
        cdef tuple result = PyTuple_New(m)
        cdef object out
        for j in range(m):
            k = <object>PyTuple_GET_ITEM(self._outputs, j)
            out = None if k < 0 else tensors[k]
            Py_INCREF(out)
            PyTuple_SET_ITEM(result, j, out)
        return result


cdef object _counts(object tokens_per_expert, long long experts, long long alignment):
    """``(counts, rows)``: the capacities as a tuple and their padded row count, where they
    are what the contract allows (a list or tuple of ``num_experts`` exact ints >= 0 that
    need at most MAX_ROWS rows); else None (the full path checks them, and raises)."""
    if type(tokens_per_expert) is not list and type(tokens_per_expert) is not tuple:
        return None
    counts = tuple(tokens_per_expert)
    rows = padded_rows(counts, experts, alignment, _MAX_ROWS)
    return None if rows < 0 else (counts, rows)


cdef tuple _picked(tuple outputs, tuple positions):
    """The elements of ``outputs`` at ``positions``."""
    cdef Py_ssize_t j, k, m = PyTuple_GET_SIZE(positions)
    cdef tuple picked = PyTuple_New(m)
    cdef object x
    for j in range(m):
        k = <object>PyTuple_GET_ITEM(positions, j)
        x = <object>PyTuple_GET_ITEM(outputs, k)
        Py_INCREF(x)
        PyTuple_SET_ITEM(picked, j, x)
    return picked


cdef class ReplayedOp:
    """The replays of one op (:mod:`moe_numba.ops`) on torch CUDA tensors. Called as
    ``replays(arrays, scalars, capacities)`` (the op's NamedTuples, and a permute's
    ``tokens_per_expert``), the public result of a call that a replay repeats, else None;
    :meth:`outputs` gives every output instead.

    Parameters
    ----------
    op : moe_numba.ops.Op
        The op: its scalars' ``validate`` decides whether a call may be replayed; an op
        with capacities (the permute) has keys of their row count (see
        :mod:`moe_numba.torch._replay`), ignored where ``override_buffer_size >= 0``.
    run : callable
        ``run(backend, plan, arrays, call)``: the op's outputs NamedTuple for a checked call
        with ``validate=False`` (``call``: a :class:`~moe_numba._gpu.RecordedCall`, or None).
    """

    cdef object _run
    cdef tuple _differentiable
    cdef bint _counted
    cdef public unsigned long long runs  # calls that a replay repeated
    cdef object _replays  # BoundedCache: keys -> replays
    cdef dict _found  # the replays' entries (looked up here, put through the cache)

    def __init__(self, op, run):
        self._run = run
        self._differentiable = op.differentiable_indices
        self._counted = op.capacities
        self._replays = BoundedCache(256)
        self._found = self._replays.entries

    cdef object _key(self, tuple arrays, object scalars, object tokens_per_expert):
        if scalars.validate is not False:  # (only direct calls get here: _route)
            return None
        bools = _scalar_types(<tuple>scalars)
        if bools is None:
            return None
        counts = rows = None
        if self._counted:
            override = scalars.override_buffer_size
            if not (type(override) is int and override >= 0):
                try:
                    found = _counts(
                        tokens_per_expert, scalars.num_experts, scalars.padding_alignment
                    )
                except OverflowError:  # (E or A past int64)
                    return None
                if found is None:
                    return None
                counts, rows = found
        tensors = _tensors(arrays)
        if tensors is None:
            return None
        if self._differentiable and _grad_enabled():
            for i in self._differentiable:
                x = arrays[i]
                if x is not None and x.requires_grad:
                    return None
        key, addresses = tensors
        # (the scalars NamedTuple is a tuple: it hashes and compares by its values)
        return (
            (key, scalars, bools, counts),
            addresses,
            None if rows is None else (key, scalars, bools, rows),
        )

    def clear(self):
        """Forget every replay: the next calls take the full path and record anew (a tool
        that changes the kernels' module settings between calls needs this, since a replay
        keeps the launches it recorded)."""
        self._replays.clear()

    def key(self, arrays, scalars, tokens_per_expert=None):
        """``(key, addresses, rows key)`` of a call that a replay may repeat, else None. The
        rows key is the key with the capacities' row count in their place, or None for a
        call without capacities."""
        return self._key(<tuple>arrays, scalars, tokens_per_expert)

    cdef object _replayed(self, tuple arrays, object scalars, object tokens_per_expert):
        """``(replay, its outputs)`` of a call that a replay repeats, else None."""
        found = self._key(arrays, scalars, tokens_per_expert)
        if found is None:
            return None
        key, addresses, rows_key = <tuple>found
        replay = self._found.get(key)
        if replay is not None:
            outputs = (<Replay>replay).run(addresses, None)
        else:
            if rows_key is None:
                return None
            replay = self._found.get(rows_key)
            if replay is None or _capturing():  # (a graph would read the staged block again)
                return None
            outputs = (<Replay>replay).run(addresses, (<tuple>key)[3])
        if outputs is None:
            return None
        self.runs += 1
        return replay, outputs

    def __call__(self, arrays, scalars, tokens_per_expert=None):
        # (``arrays``: the op's NamedTuple, a tuple subclass, read as a tuple)
        found = self._replayed(<tuple>arrays, scalars, tokens_per_expert)
        if found is None:
            return None
        replay, outputs = <tuple>found
        return _picked(<tuple>outputs, (<Replay>replay).result)

    def outputs(self, arrays, scalars, tokens_per_expert=None):
        """Every output of a call that a replay repeats (a tuple in the order of the op's
        outputs, None where not asked for), else None."""
        found = self._replayed(<tuple>arrays, scalars, tokens_per_expert)
        return None if found is None else (<tuple>found)[1]

    def run(self, backend, plan, arrays, scalars, tokens_per_expert=None):
        """The outputs NamedTuple of a checked call with ``validate=False``, recorded, and
        its replay kept for later calls (never while the stream is being captured: its
        capacities are kept for the graph, not for eager calls). A recording whose
        capacities the backend staged (met for the first time) is kept under the rows key,
        so that new capacities of the same row count replay it; any other under the call's
        key."""
        found = self._key(tuple(arrays), scalars, tokens_per_expert)
        if found is None or _capturing():
            return self._run(backend, plan, arrays, None)
        key, _, rows_key = found
        call = RecordedCall(arrays)
        outputs = self._run(backend, plan, arrays, call)
        recorded = call.replay(outputs)
        if recorded is not None:
            positions = {id(x): j for j, x in enumerate(outputs)}
            result = tuple(positions[id(x)] for x in outputs.result())
            if call.staged:
                self._replays.put(rows_key, Replay(call, recorded, result, key[3]))
            else:
                self._replays.put(key, Replay(call, recorded, result))
        return outputs
