"""The GPU side of the API: outputs in the caller's library, then the numba.cuda kernels.

Imported only when a call receives CUDA arrays, so ``import moe_numba`` stays free of numba.
"""

from __future__ import annotations

import numpy as np

from ._cache import BoundedCache, on_clear
from ._contract import UnpermuteArrays
from ._errors import INSTALL_GPU_EXTRA, GPUUnavailableError, numba_unavailable
from ._libraries import array_library
from ._outputs import (
    permute_backward_outputs,
    permute_outputs,
    sort_outputs,
    unpermute_backward_outputs,
    unpermute_outputs,
)
from .runtime._buffer import DeviceBuffer
from .runtime._recording import Address, RecordingLauncher, replay_sequence

_BACKEND = None


def loaded_backend():
    """The GPU backend if it has been loaded, else None (nothing is imported)."""
    return _BACKEND


def gpu_backend():
    """The GPU backend, loaded on first use, with an explanation if it cannot load."""
    global _BACKEND
    if _BACKEND is None:
        try:
            from numba import config, cuda
        except ImportError as error:
            raise numba_unavailable(error) from error
        if not config.ENABLE_CUDASIM and not cuda.is_available():
            raise GPUUnavailableError(
                "CUDA arrays were passed but numba.cuda finds no usable GPU/driver. Check "
                "`nvidia-smi` and that the NVIDIA driver library (libcuda) is on the library "
                "path; numba.cuda.detect() prints what numba sees. Then, if kernels fail to "
                "compile, " + INSTALL_GPU_EXTRA
            )
        _BACKEND = _GPUBackend()
    return _BACKEND


@on_clear
def _forget_backend():
    """Drop the GPU backend (its device copies of capacities go with it): the next CUDA call
    checks again for a usable GPU and makes a new one (``moe_numba.clear``)."""
    global _BACKEND
    _BACKEND = None


class _Call:
    """One call's allocations: outputs and scratch in the library of ``like``.

    ``empty(shape, dtype)`` replaces the library's allocator when given (tests pass one that
    poisons what it returns).
    """

    staged = False  # set by a permute that staged its capacities (_permute_capacities)

    def __init__(self, like, empty=None):
        self.like = like
        self.library = array_library(like)
        self._kind = type(like)
        self.scratch = []  # kept alive until the call returns (allocators are stream-ordered)
        if empty is not None:
            self.empty = empty

    def empty(self, shape, dtype):
        return self.library.empty(shape, dtype, self.like)

    def alloc(self, nbytes):
        # rounded up so that every scratch buffer can be read as 16-byte words
        scratch = self.empty((max(16, -(-nbytes // 16) * 16),), np.uint8)
        self.scratch.append(scratch)
        return self.buffer(scratch)

    def stream(self, x):
        """The stream the call's kernels go to: the current one of ``x``'s library."""
        return self.library.stream(x)

    def buffer(self, x):
        if x is None:
            return None
        # (arrays of the call's own type are of its library: dispatch has put every array of
        # the call on the GPU; another type may come from another library)
        library = self.library if type(x) is self._kind else array_library(x)
        return library.buffer(x)


class RecordedCall(_Call):
    """A :class:`_Call` that records what a replay of it needs (:mod:`.runtime._recording`).

    ``arrays`` are the op's arrays (its NamedTuple). Every address the kernels get is an
    :class:`~.runtime._recording.Address` of its source: ``arrays[i]`` is source ``i``, the
    ``j``-th allocation source ``len(arrays) + j``. A buffer of anything else (a cached
    device copy of capacities) is a constant of the replay, and :attr:`kept` holds it.
    After the call, :meth:`replay` says what to repeat.

    Where a permute staged its capacities (:attr:`staged`, :mod:`.runtime._staged`), the
    staged block is the value after the allocations: a replay stages the counts of its own
    call there.
    """

    def __init__(self, arrays):
        super().__init__(next(x for x in arrays if x is not None))
        self.arrays = arrays
        self.allocations = []  # (shape, dtype) of each, in order
        self.allocated = []
        self.kept = []
        self.launcher = None
        self._sources = {id(x): i for i, x in enumerate(arrays) if x is not None}

    def empty(self, shape, dtype):
        x = super().empty(shape, dtype)
        self._sources[id(x)] = len(self.arrays) + len(self.allocated)
        self.allocations.append((tuple(shape), dtype))
        self.allocated.append(x)
        return x

    def buffer(self, x):
        buf = super().buffer(x)
        if buf is None:
            return None
        source = self._sources.get(id(x))
        if source is None:
            self.kept.append(x)
            return buf
        return DeviceBuffer(Address(buf.ptr, source), buf.nbytes)

    def stream(self, x):
        self.launcher = RecordingLauncher(super().stream(x))
        return self.launcher

    def replay(self, result):
        """``(sequence, kernel names, outputs)`` of the call, or None where it cannot be
        replayed: ``sequence`` as :func:`.runtime._recording.replay_sequence` gives it, and
        per element of ``result`` (the op's returned arrays, None where it returns none)
        the index of its allocation, or -1 for None.

        Refused: a call whose arrays repeat one object (its sources would be ambiguous),
        an allocation not 16-byte aligned (the kernels' word widths follow alignment), a
        returned array that the call did not allocate.
        """
        given = [x for x in self.arrays if x is not None]
        if self.launcher is None or len(self._sources) != len(given) + len(self.allocated):
            return None
        index = {id(x): j for j, x in enumerate(self.allocated)}
        index[id(None)] = -1
        outputs = tuple(index.get(id(x)) for x in result)
        aligned = all(self.buffer(x).ptr % 16 == 0 for x in self.allocated)
        launches = replay_sequence(self.launcher, len(self.arrays) + len(self.allocated))
        if launches is None or None in outputs or not aligned:
            return None
        return (*launches, outputs)


_MET = object()  # a capacities cache entry: values met once, staged, with no device copy yet


class _GPUBackend:
    """The GPU backend: the ops on CUDA arrays (:func:`gpu_backend` makes the one in use).

    ``capturing(stream)`` and ``kept_words(device, values)`` replace the runtime's
    :func:`~.runtime._staged.capturing` and :func:`~.runtime._staged.kept_words` when given
    (the simulator's tests pretend a stream capture, which the simulator cannot do).
    """

    def __init__(self, capturing=None, kept_words=None):
        from .kernels import permute, permute_backward, sort_chunks, unpermute, unpermute_backward
        from .runtime import _staged

        self._permute = permute
        self._unpermute = unpermute
        self._sort_chunks = sort_chunks
        self._permute_backward = permute_backward
        self._unpermute_backward = unpermute_backward
        self._capturing = _staged.capturing if capturing is None else capturing
        self._kept_words = _staged.kept_words if kept_words is None else kept_words
        # capacities' values -> their device copy, or _MET where met once (and staged)
        self._capacities = BoundedCache(256)

    def _capacities_on_device(self, call, capacities, capturing, key=None):
        """The buffer of an int64 host array the kernels read (``tokens_per_expert``;
        moe_sort_chunks's host sizes and order): a copy on the arrays' device, uploaded
        once per distinct value (``key``: :meth:`_capacities_key`, when the caller has it).

        The kernels only read it, so a copy can serve every later call with the same values
        (fixed capacities are common in serving). A call on a stream being captured
        (``capturing``) gets pinned host words kept for good instead
        (:func:`.runtime._staged.kept_words`): a CUDA graph reads them at every replay,
        after a cached copy may have been dropped and its memory reused.
        """
        if capturing:
            return self._kept_words(call.library.device(call.like), capacities)
        key = self._capacities_key(call, capacities) if key is None else key
        copy = self._capacities.get(key)
        if copy is None or copy is _MET:
            copy = self._capacities.put(key, call.library.upload(capacities, call.like))
        return call.buffer(copy)

    @staticmethod
    def _capacities_key(call, capacities):
        return (call.library.name, call.library.device(call.like), capacities.tobytes())

    def _permute_capacities(self, call, capacities, stream):
        """A permute's ``tokens_per_expert``: ``(device copy, None)`` for values met before,
        or ``(None, capacities)`` for values met for the first time, which the kernels then
        read from pinned host memory (:mod:`.runtime._staged`; ``call.staged`` says so): the
        new counts of a training step cost no upload, and repeated ones (fixed capacities)
        get a device copy from their second call on. A stream being captured is never
        staged: a graph would read the host block again at every replay, after it went back
        to its pool (:meth:`_capacities_on_device`)."""
        key = self._capacities_key(call, capacities)
        capturing = self._capturing(stream)
        if self._capacities.get(key) is None and not capturing:
            self._capacities.put(key, _MET)
            call.staged = True
            return None, capacities
        return self._capacities_on_device(call, capacities, capturing, key), None

    # One method per op (moe_numba.ops), named as the op: ``op(plan, arrays, empty=None,
    # call=None) -> (outputs, status words or None)``; the status words where the plan
    # validates. ``empty(shape, dtype)``, when given, allocates the outputs and scratch
    # instead of the arrays' library; ``call``, when given, is a :class:`RecordedCall` of
    # ``arrays``.

    def permute(self, plan, arrays, empty=None, call=None):
        """Run ``moe_permute`` on CUDA arrays."""
        hidden_states, scale, routemap, probs = arrays
        call = _Call(hidden_states, empty) if call is None else call
        out = permute_outputs(plan, call.empty)
        stream = call.stream(hidden_states)
        capacity = capacity_values = None
        if plan.capacities is not None:
            capacity, capacity_values = self._permute_capacities(call, plan.capacities, stream)
        buffers = self._permute.PermuteBuffers(
            hidden=call.buffer(hidden_states) if plan.do_gather else None,
            scale=call.buffer(scale) if plan.gather_scale else None,
            routemap=call.buffer(routemap),
            probs=call.buffer(probs),
            capacity=capacity,
            capacity_values=capacity_values,
            out_hidden=call.buffer(out.hidden) if plan.do_gather else None,
            out_scale=call.buffer(out.scale) if plan.gather_scale else None,
            out_rowmap=call.buffer(out.rowmap),
            out_probs=call.buffer(out.probs),
            out_indices=call.buffer(out.indices),
            out_offsets=call.buffer(out.offsets),
            routemap_itemsize=array_library(routemap).dtype(routemap).itemsize,
        )
        status = self._permute.run(plan, buffers, call.alloc, stream)
        return out, (status.read() if plan.validate else None)

    def unpermute(self, plan, arrays, empty=None, call=None):
        """Run ``moe_unpermute`` on CUDA arrays."""
        call = _Call(arrays.hidden_states_unzipped, empty) if call is None else call
        outputs = unpermute_outputs(plan, call.empty)
        return self._combine(self._unpermute.run, call, plan, arrays, outputs)

    def _combine(self, run, call, plan, arrays, outputs):
        """A combine's buffers (``arrays``: an UnpermuteArrays; ``outputs``: the combined rows
        and the slot probabilities, either None for the permute backward), and ``run(plan,
        buffers, ...)``'s launches."""
        rows, rowmap, routemap, probs = arrays
        hidden, slot_probs = outputs
        buffers = self._unpermute.UnpermuteBuffers(
            rows=call.buffer(rows),
            rowmap=call.buffer(rowmap),
            routemap=call.buffer(routemap),
            probs=call.buffer(probs),
            out_hidden=call.buffer(hidden),
            out_probs=call.buffer(slot_probs),
            routemap_itemsize=array_library(routemap).dtype(routemap).itemsize,
        )
        status = run(plan, buffers, plan.validate, call.alloc, call.stream(call.like))
        return outputs, (status.read() if plan.validate else None)

    def sort_chunks(self, plan, arrays, empty=None, call=None):
        """Run ``moe_sort_chunks`` on CUDA arrays.

        Host sizes were checked before the call, so only sizes on the device are checked
        here (``plan.checks_sizes``: only they cost the status read).
        """
        call = _Call(arrays.x, empty) if call is None else call
        out = sort_outputs(plan, call.empty)
        stream = call.stream(arrays.x)
        capturing = self._capturing(stream)
        sizes = arrays.split_sizes
        if sizes is None:
            sizes = self._capacities_on_device(call, plan.sizes, capturing)
        else:
            sizes = call.buffer(sizes)
        check = plan.checks_sizes
        buffers = self._sort_chunks.SortBuffers(
            x=call.buffer(arrays.x),
            sizes=sizes,
            order=self._capacities_on_device(call, plan.order, capturing),
            probs=call.buffer(arrays.probs),
            out_y=call.buffer(out.y),
            out_probs=call.buffer(out.probs),
            out_lengths=call.buffer(out.lengths),
        )
        status = self._sort_chunks.run(plan, buffers, check, call.alloc, stream)
        return out, (status.read() if check else None)

    # The gradient ops (docs/gradients.rst), the same interface.

    def permute_backward(self, plan, arrays, empty=None, call=None):
        """Run ``moe_permute_backward`` on CUDA arrays."""
        grad_rows, grad_probs = arrays.grad_hidden_states_unzipped, arrays.grad_token_prob_unzipped
        if call is None:
            call = _Call(grad_rows if grad_rows is not None else grad_probs, empty)
        outputs = permute_backward_outputs(plan, call.empty)
        combine = UnpermuteArrays(  # (the rows and probabilities are the gradients)
            grad_rows, arrays.zipped_expertwise_rowmap, arrays.expert_routemap_topk, grad_probs
        )
        return self._combine(self._permute_backward.run, call, plan, combine, outputs)

    def unpermute_backward(self, plan, arrays, empty=None, call=None):
        """Run ``moe_unpermute_backward`` on CUDA arrays."""
        dy, g, xu, rowmap, routemap, p = arrays
        call = _Call(rowmap, empty) if call is None else call
        outputs = unpermute_backward_outputs(plan, call.empty)
        rows, probs = outputs
        scaled = plan.weighted and plan.grad_hidden
        buffers = self._unpermute_backward.UnpermuteBackwardBuffers(
            grad_hidden=call.buffer(dy),
            grad_probs=call.buffer(g),
            rows=call.buffer(xu) if plan.dot else None,
            rowmap=call.buffer(rowmap),
            routemap=call.buffer(routemap),
            probs=call.buffer(p) if scaled else None,
            out_rows=call.buffer(rows),
            out_probs=call.buffer(probs),
            routemap_itemsize=array_library(routemap).dtype(routemap).itemsize,
        )
        stream = call.stream(rowmap)
        status = self._unpermute_backward.run(plan, buffers, plan.validate, call.alloc, stream)
        return outputs, (status.read() if plan.validate else None)
