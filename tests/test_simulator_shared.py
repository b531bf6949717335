"""The test process's fix of the simulator's shared arrays (tests/_simulator.py): every thread
of a block gets the same array, however the threads interleave."""

import time

import numpy as np
import pytest
from numba import cuda, int32

pytestmark = pytest.mark.sim

THREADS = 32


@cuda.jit
def _sum_of_shared_marks(out):
    # each thread marks its word; every thread then sums the block's marks
    marks = cuda.shared.array(THREADS, int32)
    tid = cuda.threadIdx.x
    marks[tid] = 1
    cuda.syncthreads()
    total = 0
    for i in range(THREADS):
        total += marks[i]
    out[tid] = total


def test_every_thread_of_a_block_shares_its_array(monkeypatch):
    out = cuda.to_device(np.zeros(THREADS, np.int32))
    empty = np.empty

    def slow_empty(*args, **kwargs):
        # the first thread to make the block's array is slow about it: the other threads
        # call cuda.shared.array meanwhile (a GPU thread switch at the worst moment)
        time.sleep(0.002)
        return empty(*args, **kwargs)

    monkeypatch.setattr(np, "empty", slow_empty)
    _sum_of_shared_marks[1, THREADS](out)
    monkeypatch.undo()
    np.testing.assert_array_equal(out.copy_to_host(), THREADS)
