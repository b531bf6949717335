"""The core remembers each op's prepared calls in one cache per op, and forgets them all at
once (``_core.clear``)."""

import numpy as np
import pytest

from moe_numba import _core, moe_permute
from moe_numba._contract import PermuteArrays, PermuteScalars
from moe_numba._ops import PERMUTE


def test_clear_forgets_every_prepared_call():
    x = np.zeros((4, 2), np.float32)
    routes = np.array([[0], [1], [0], [1]], np.int32)
    probs = np.ones((4, 1), np.float32)
    moe_permute(x, None, routes, probs, 2, [2, 2], 1)
    arrays = PermuteArrays(x, None, routes, probs)
    scalars = PermuteScalars(num_experts=2, padding_alignment=1)
    first = _core.CALLS[PERMUTE].prepare(arrays, scalars)
    assert _core.CALLS[PERMUTE].prepare(arrays, scalars) is first  # remembered
    _core.clear()
    again = _core.CALLS[PERMUTE].prepare(arrays, scalars)
    assert again is not first and again[1] == first[1]  # prepared anew, the same plan


@pytest.mark.sim
def test_clear_forgets_the_gpu_backends_plans_and_copies():
    """Where the GPU backend is loaded, ``_core.clear`` also forgets its launch plans and its
    device copies of capacities (met twice: copied), and the next calls make them again."""
    from numba import cuda

    from moe_numba import _gpu
    from moe_numba.kernels import permute as PM

    x = cuda.to_device(np.zeros((4, 2), np.float32))
    routes = cuda.to_device(np.array([[0], [1], [0], [1]], np.int32))
    probs = cuda.to_device(np.ones((4, 1), np.float32))
    for _ in range(2):  # (capacities met a second time get a device copy)
        moe_permute(x, None, routes, probs, 2, [2, 2], 1)
    backend = _gpu.loaded_backend()
    assert len(PM.LAUNCH_PLANS) > 0 and len(backend._capacities) == 1
    _core.clear()
    assert len(PM.LAUNCH_PLANS) == 0 and len(backend._capacities) == 0
    rows = moe_permute(x, None, routes, probs, 2, [2, 2], 1)[0]
    assert rows.shape == (4, 2) and len(PM.LAUNCH_PLANS) == 1
