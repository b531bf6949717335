"""The CPU output cache: large outputs reuse memory that earlier outputs released."""

import gc
import os
import subprocess
import sys

import numpy as np
import pytest

moe_cpu = pytest.importorskip("moe_cpu")


def address(a):
    return a.__array_interface__["data"][0]


def test_released_block_is_reused():
    moe_cpu.empty_cache()
    a = moe_cpu.empty((1024, 1024), np.float32)
    first = address(a)
    del a
    gc.collect()
    assert moe_cpu.cache_info()["cached_bytes"] == 4 << 20
    b = moe_cpu.empty((2048, 512), np.float32)  # same size, other shape
    assert address(b) == first and b.shape == (2048, 512) and b.flags.writeable
    assert moe_cpu.cache_info()["cached_bytes"] == 0


def test_views_keep_the_block_alive():
    a = moe_cpu.empty((1 << 20,), np.uint16)
    a[:] = 7
    view = a[10:20]
    del a
    gc.collect()
    other = moe_cpu.empty((1 << 20,), np.uint16)  # must not get the block the view still uses
    other[:] = 0
    assert (view == 7).all()


def test_small_arrays_are_plain_numpy():
    a = moe_cpu.empty((3, 4), np.int32)
    assert a.base is None and a.shape == (3, 4)


def test_empty_cache_returns_the_bytes():
    a = moe_cpu.empty((3 << 20,), np.uint8)
    del a
    gc.collect()
    assert moe_cpu.empty_cache() >= 3 << 20
    assert moe_cpu.cache_info()["cached_bytes"] == 0


def test_limit_zero_turns_the_cache_off():
    code = (
        "import gc, numpy as np, moe_cpu; a = moe_cpu.empty((4 << 20,), np.uint8); "
        "del a; gc.collect(); print(moe_cpu.cache_info())"
    )
    env = dict(os.environ, MOE_CPU_CACHE_BYTES="0")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "{'cached_bytes': 0, 'limit_bytes': 0}"
