"""The core remembers each op's prepared calls in one cache per op, and forgets them all at
once (``_core.clear``)."""

import numpy as np

from moe_numba import _core, moe_permute
from moe_numba._contract import PermuteArrays


def test_clear_forgets_every_prepared_call():
    x = np.zeros((4, 2), np.float32)
    routes = np.array([[0], [1], [0], [1]], np.int32)
    probs = np.ones((4, 1), np.float32)
    moe_permute(x, None, routes, probs, 2, [2, 2], 1)
    arrays = PermuteArrays(x, None, routes, probs)
    scalars = _core.permute_scalars(2, 1, True, False, False, -1, True, False)
    first = _core.PERMUTE.prepare(arrays, scalars)
    assert _core.PERMUTE.prepare(arrays, scalars) is first  # remembered
    _core.clear()
    again = _core.PERMUTE.prepare(arrays, scalars)
    assert again is not first and again[1] == first[1]  # prepared anew, the same plan
