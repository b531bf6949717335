"""The core remembers each op's prepared calls in one cache per op; ``moe_numba.clear`` forgets
them, and every other cache of the library, at once."""

import subprocess
import sys

import numpy as np
import pytest

import moe_numba
from moe_numba import backends, moe_permute
from moe_numba.ops import PERMUTE, PermuteArrays, PermuteScalars


def test_clear_forgets_every_prepared_call():
    x = np.zeros((4, 2), np.float32)
    routes = np.array([[0], [1], [0], [1]], np.int32)
    probs = np.ones((4, 1), np.float32)
    moe_permute(x, None, routes, probs, 2, [2, 2], 1)
    arrays = PermuteArrays(x, None, routes, probs)
    scalars = PermuteScalars(num_experts=2, padding_alignment=1)
    _, first = backends.prepare(PERMUTE, arrays, scalars, [2, 2])
    assert backends.prepare(PERMUTE, arrays, scalars, [2, 2])[1] is first  # remembered
    moe_numba.clear()
    _, again = backends.prepare(PERMUTE, arrays, scalars, [2, 2])
    assert again is not first  # prepared anew, the same plan:
    assert again._replace(capacities=None) == first._replace(capacities=None)
    assert list(again.capacities) == list(first.capacities) == [2, 2]


@pytest.mark.sim
def test_clear_forgets_the_gpu_backends_plans_and_copies():
    """Where the GPU backend is loaded, ``moe_numba.clear`` also forgets its launch plans and
    the backend with its device copies of capacities (met twice: copied), and the next calls
    make them again."""
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
    moe_numba.clear()
    assert len(PM.LAUNCH_PLANS) == 0 and _gpu.loaded_backend() is None
    rows = moe_permute(x, None, routes, probs, 2, [2, 2], 1)[0]
    assert rows.shape == (4, 2) and len(PM.LAUNCH_PLANS) == 1
    assert len(_gpu.loaded_backend()._capacities) == 1  # (met again: staged, not copied)


def test_clear_imports_nothing_it_would_clear():
    """``moe_numba.clear`` clears what is loaded only: it imports neither numba nor torch."""
    code = "import sys, moe_numba; moe_numba.clear(); print(sorted(sys.modules))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert "'numba'" not in loaded and "'torch'" not in loaded


def test_clear_frees_the_runtimes_pinned_blocks_and_calls_go_on(backend):
    """On a GPU, a call with validate=True waits for status words in a pinned block, and
    capacities met for the first time are staged in another; both go back to the runtime's
    pools, which ``moe_numba.clear`` frees. Later calls make new blocks, and give the same
    outputs."""
    if not backend.needs_gpu:
        pytest.skip("pinned blocks are made for a real GPU's calls")
    from moe_numba.runtime import get_runtime

    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 8)).astype(np.float32)
    routes = np.stack([rng.permutation(4)[:2] for _ in range(64)]).astype(np.int32)
    probs = rng.random((64, 2)).astype(np.float32)
    counts = np.bincount(routes.ravel(), minlength=4).tolist()
    expected = moe_permute(x, None, routes, probs, 4, counts, 8)
    args = [backend.to_device(x), None, backend.to_device(routes), backend.to_device(probs)]
    runtime = get_runtime()
    moe_numba.clear()
    for _ in range(2):  # (new capacities after the clear: staged again)
        outputs = moe_permute(*args, 4, counts, 8)
        assert any(runtime.status_pools.values()) and any(runtime.staged_pools.values())
        for actual, wanted in zip(outputs, expected, strict=True):
            np.testing.assert_array_equal(backend.to_host(actual), wanted)
        moe_numba.clear()
        assert not runtime.status_pools and not runtime.staged_pools
