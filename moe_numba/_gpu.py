"""The GPU side of the API: outputs in the caller's library, then the numba.cuda kernels.

Imported only when a call receives CUDA arrays, so ``import moe_numba`` stays free of numba.
"""

from __future__ import annotations

import numpy as np

from ._arrays import array_library
from ._cache import BoundedCache
from ._contract import permute_outputs, unpermute_outputs
from ._errors import INSTALL_GPU_EXTRA, GPUUnavailableError

_BACKEND = None


def gpu_backend():
    """The GPU backend, loaded on first use, with an explanation if it cannot load."""
    global _BACKEND
    if _BACKEND is None:
        try:
            from numba import config, cuda
        except ImportError as error:
            raise GPUUnavailableError(
                f"CUDA arrays were passed but numba.cuda cannot be imported ({error}); "
                + INSTALL_GPU_EXTRA
            ) from error
        if not config.ENABLE_CUDASIM and not cuda.is_available():
            raise GPUUnavailableError(
                "CUDA arrays were passed but numba.cuda finds no usable GPU/driver. Check "
                "`nvidia-smi` and that the NVIDIA driver library (libcuda) is on the library "
                "path; numba.cuda.detect() prints what numba sees. Then, if kernels fail to "
                "compile, " + INSTALL_GPU_EXTRA
            )
        _BACKEND = _GPUBackend()
    return _BACKEND


class _Call:
    """One call's allocations: outputs and scratch in the library of ``like``."""

    def __init__(self, like):
        self.like = like
        self.library = array_library(like)
        self.scratch = []  # kept alive until the call returns (allocators are stream-ordered)

    def empty(self, shape, dtype):
        return self.library.empty(shape, dtype, self.like)

    def alloc(self, nbytes):
        # rounded up so that every scratch buffer can be read as 16-byte words
        scratch = self.empty((max(16, -(-nbytes // 16) * 16),), np.uint8)
        self.scratch.append(scratch)
        return self.library.buffer(scratch)

    @staticmethod
    def buffer(x):
        return None if x is None else array_library(x).buffer(x)


class _GPUBackend:
    def __init__(self):
        from .kernels import permute, unpermute

        self._permute = permute.permute
        self._unpermute = unpermute.unpermute
        self._capacities = BoundedCache(64)

    def _capacities_on_device(self, call, capacities):
        """``tokens_per_expert`` on the arrays' device, uploaded once per distinct value.

        The kernels only read it, so a copy can serve every later call with the same values
        (fixed capacities are common in serving); a training step with new counts uploads.
        """
        key = (call.library.name, call.library.device(call.like), capacities.tobytes())
        return self._capacities.get_or_compute(
            key, lambda: call.library.upload(capacities, call.like)
        )

    def permute(self, plan, arrays, validate):
        """Run ``moe_permute`` on CUDA arrays: ``(outputs, status words or None)``."""
        hidden_states, scale, routemap, probs = arrays
        call = _Call(hidden_states)
        out = permute_outputs(plan, call.empty)
        capacity = None
        if plan.capacities is not None:
            capacity = call.buffer(self._capacities_on_device(call, plan.capacities))
        status = self._permute(
            call.buffer(hidden_states) if plan.do_gather else None,
            call.buffer(scale) if plan.gather_scale else None,
            call.buffer(routemap),
            call.buffer(probs),
            capacity,
            num_tokens=plan.num_tokens,
            topk=plan.topk,
            num_experts=plan.num_experts,
            alignment=plan.alignment,
            num_rows=plan.num_rows,
            hidden_row_bytes=plan.hidden_row_bytes,
            scale_row_bytes=plan.scale_row_bytes,
            routemap_itemsize=array_library(routemap).dtype(routemap).itemsize,
            out_hidden=call.buffer(out.hidden) if plan.do_gather else None,
            out_scale=call.buffer(out.scale) if plan.gather_scale else None,
            out_rowmap=call.buffer(out.rowmap),
            out_probs=call.buffer(out.probs),
            out_indices=call.buffer(out.indices),
            validate=validate,
            alloc=call.alloc,
            stream=call.library.stream(hidden_states),
        )
        return out, (status.read() if validate else None)

    def unpermute(self, plan, arrays, validate):
        """Run ``moe_unpermute`` on CUDA arrays: ``(outputs, status words or None)``."""
        rows, rowmap, routemap, probs = arrays
        call = _Call(rows)
        hidden, slot_probs = unpermute_outputs(plan, call.empty)
        status = self._unpermute(
            call.buffer(rows),
            call.buffer(rowmap),
            call.buffer(routemap),
            call.buffer(probs),
            num_tokens=plan.num_tokens,
            num_rows=plan.num_rows,
            hidden=plan.hidden,
            num_experts=plan.num_experts,
            topk=plan.topk,
            data_type=plan.data_type,
            routemap_itemsize=array_library(routemap).dtype(routemap).itemsize,
            weighted=plan.weighted,
            mix_precision=plan.mix_precision,
            out_hidden=call.buffer(hidden),
            out_probs=call.buffer(slot_probs),
            validate=validate,
            alloc=call.alloc,
            stream=call.library.stream(rows),
        )
        return (hidden, slot_probs), (status.read() if validate else None)


def _sort_chunks(self, plan, arrays, validate):
    """Run ``moe_sort_chunks`` on CUDA arrays: ``(outputs, status words or None)``.

    Host sizes were checked before the call, so only sizes on the device are checked here
    (and only they cost the status read).
    """
    from ._contract_sort import sort_outputs
    from .kernels.sort_chunks import sort_chunks

    call = _Call(arrays.x)
    out = sort_outputs(plan, call.empty)
    sizes = arrays.split_sizes
    if sizes is None:
        sizes = self._capacities_on_device(call, plan.sizes)
    check = validate and arrays.split_sizes is not None
    status = sort_chunks(
        call.buffer(arrays.x),
        call.buffer(sizes),
        call.buffer(self._capacities_on_device(call, plan.order)),
        call.buffer(arrays.probs),
        num_rows=plan.num_rows,
        row_bytes=plan.row_bytes,
        num_chunks=plan.num_chunks,
        sizes_itemsize=plan.sizes_dtype.itemsize,
        out_y=call.buffer(out.y),
        out_probs=call.buffer(out.probs),
        out_lengths=call.buffer(out.lengths),
        validate=check,
        alloc=call.alloc,
        stream=call.library.stream(arrays.x),
    )
    return out, (status.read() if check else None)


_GPUBackend.sort_chunks = _sort_chunks
