"""The layer under every front: a call of an op prepared, then run on a backend.

Each public function hands its arrays to a front (NumPy and CUDA arrays, torch tensors,
Paddle tensors), and every front runs a call the same way, in two steps that this module
names for a front of another array library, for tests and for anyone who wants to see what
a call does:

:func:`prepare`
    checks the call before any work (every array given, where the arrays live, the op's
    check of their metadata and scalars, contiguity, device) and picks the backend of
    that location with the op's plan: shapes and flags, decided from metadata alone.
:func:`run`
    hands the plan and the arrays to the backend's method of the op, and raises what its
    status words report where the plan validates.

:func:`outputs` is both. The ops, their arrays, scalars and outputs are declared in
:mod:`moe_numba.ops`; the status words' slots are :mod:`moe_numba.abi`'s.

A backend (:func:`cpu_backend`, :func:`gpu_backend`) offers one method per op, named as the
op: ``backend.<op.name>(plan, arrays, empty) -> (outputs, status)``. ``empty(shape,
dtype)`` allocates every output and scratch array of the call (give it an allocator that
fills them with garbage, and every element the contract defines must still come out
right); ``status`` is the status words, or None where the plan does not validate. The
backend's method raises nothing for bad values: reading the words is the caller's part
(``op.raise_for(status, plan)``, as :func:`run` does).

Examples
--------
>>> import numpy as np
>>> from moe_numba import backends
>>> from moe_numba.ops import PERMUTE, PermuteArrays, PermuteScalars
>>> x = np.arange(6, dtype=np.float32).reshape(3, 2)
>>> routes = np.array([[1], [0], [1]], np.int32)
>>> arrays = PermuteArrays(x, None, routes, np.ones((3, 1), np.float32))
>>> scalars = PermuteScalars(num_experts=2, padding_alignment=2)
>>> backend, plan = backends.prepare(PERMUTE, arrays, scalars, [1, 2])
>>> plan.num_rows
4
>>> outputs, status = backend.permute(plan, arrays, np.empty)
>>> outputs.hidden[:, 0].tolist(), PERMUTE.raise_for(status, plan)
([2.0, 0.0, 0.0, 4.0], None)
"""

from ._core import cpu_backend, gpu_backend, outputs, prepare, run

__all__ = ["cpu_backend", "gpu_backend", "outputs", "prepare", "run"]
