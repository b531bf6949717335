"""The simulator's side of the kernels' building blocks: the float conversions, the bench's
stream hold, and the simulator twin of every intrinsic of ``kernels._intrinsics`` (their real
versions are checked in the PTX: tests/test_ptx.py).
"""

import ml_dtypes
import numpy as np
import pytest
from numba import config, cuda

pytestmark = pytest.mark.sim  # calls the kernels with host arrays (conftest skips it elsewhere)

from moe_numba import oracle  # noqa: E402

if config.ENABLE_CUDASIM:
    from moe_numba.kernels import _convert, _intrinsics  # noqa: E402


# ---------------------------------------------------------------------------------------
# conversions


def _conversion_kernel(x, bf16, f16, back16):
    i = cuda.grid(1)
    n = x.shape[0]
    while i < n:
        bf16[i] = _convert.f32_to_bf16(x[i])
        f16[i] = _convert.f32_to_f16(x[i])
        back16[i] = _intrinsics.f16_to_f32(f16[i])
        i += cuda.gridsize(1)


def test_rounding_conversions():
    rng = np.random.default_rng(60)
    x = np.concatenate(
        [
            rng.integers(0, 2**32, 3000, dtype=np.uint64).astype(np.uint32).view(np.float32),
            # around every float16 boundary: subnormal range, ties, overflow
            (np.float32(2.0) ** rng.integers(-27, 17, 1500)).astype(np.float32)
            * rng.choice(np.float32([1, 1.5, 1.0009765625, 1.00048828125, 1.99951171875]), 1500),
            np.float32(
                [
                    0,
                    -0.0,
                    np.inf,
                    -np.inf,
                    np.nan,
                    65504,
                    65519.996,
                    65520,
                    2**-24,
                    2**-25,
                    3 * 2**-26,
                    2**-14,
                    2**-14 - 2**-25,
                    3.4028235e38,
                ]
            ),
        ]
    ).astype(np.float32)
    with np.errstate(invalid="ignore"):  # signalling NaNs among the random bits
        x[::3] *= -1
    bf16 = np.zeros(x.size, np.uint32)
    f16 = np.zeros(x.size, np.uint32)
    back = np.zeros(x.size, np.float32)
    cuda.jit(_conversion_kernel)[2, 32](x, bf16, f16, back)
    with np.errstate(invalid="ignore"):  # (NaN inputs)
        expected_bf16 = oracle.round_to(ml_dtypes.bfloat16, x).view(np.uint16)
        expected_f16 = oracle.round_to(np.float16, x).view(np.uint16)
    np.testing.assert_array_equal(bf16, expected_bf16)
    np.testing.assert_array_equal(f16, expected_f16)
    np.testing.assert_array_equal(
        back.view(np.uint32), expected_f16.view(np.float16).astype(np.float32).view(np.uint32)
    )


@pytest.mark.parametrize("go,spins,timed_out", [(1, 5, 0), (0, 5, 1), (0, 0, 1)])
def test_hold_waits_for_the_host_or_times_out(go, spins, timed_out):
    """The bench's stream hold returns at once when let go, and gives up (saying so) after
    its spins when not."""
    from benchmarks.hold import HOLD
    from moe_numba.kernels._family import NoKey
    from moe_numba.runtime._launch import Launcher

    flag = np.array([go, 0], np.int32)
    Launcher(None)(HOLD.get(NoKey()), 1, 32, HOLD.args({"flag": flag, "spins": spins}))
    assert flag.tolist() == [go, timed_out]


# ---------------------------------------------------------------------------------------
# the simulator twins of kernels._intrinsics (their real versions: tests/test_ptx.py)


def _twin_words():
    def kernel(src, plain, streamed):
        i = cuda.threadIdx.x
        lo, hi = _intrinsics.ld16(src, i)
        _intrinsics.st16(plain, i, lo, hi)
        _intrinsics.st16_streaming(streamed, i, hi, lo)

    src = np.arange(1, 17, dtype=np.uint64) * np.uint64(0x0101010101010101)
    plain, streamed = np.zeros(16, np.uint64), np.zeros(16, np.uint64)
    cuda.jit(kernel)[1, 8](src, plain, streamed)
    np.testing.assert_array_equal(plain, src)
    np.testing.assert_array_equal(streamed, src.reshape(8, 2)[:, ::-1].reshape(-1))


def _twin_loads():
    def kernel(src, flag, out):
        i = cuda.threadIdx.x
        out[i] = _intrinsics.load_cg(src, i)
        out[8 + i] = _intrinsics.read_volatile(flag)

    src, flag, out = np.arange(8, dtype=np.int64) * 3, np.array([7, 9], np.int32), np.zeros(16)
    cuda.jit(kernel)[1, 8](src, flag, out)
    assert out.tolist() == [3 * i for i in range(8)] + [7] * 8


def _twin_atomics():
    def kernel(words, old):
        i = cuda.threadIdx.x
        old[i] = _intrinsics.atomic_add(words, 0, 1)
        _intrinsics.atomic_min(words, 1, 100 - i)
        old[32 + i] = _intrinsics.atomic_min(words, 2, 5)

    words, old = np.array([10, 1000, 7], np.int64), np.zeros(64, np.int64)
    cuda.jit(kernel)[1, 32](words, old)
    assert words.tolist() == [42, 69, 5]
    assert sorted(old[:32]) == list(range(10, 42))  # each thread saw the value before its add
    assert sorted(old[32:]) == [5] * 31 + [7]


def _twin_warp_and_clock():
    def kernel(out):
        box = cuda.shared.array(32, np.int64)
        i = cuda.threadIdx.x
        _intrinsics.griddep_wait()
        _intrinsics.griddep_trigger()
        box[i] = i * i
        _intrinsics.syncwarp()  # every lane's write is seen after it
        _intrinsics.pause()
        out[i] = box[31 - i]

    out = np.zeros(32, np.int64)
    cuda.jit(kernel)[1, 32](out)
    assert out.tolist() == [(31 - i) ** 2 for i in range(32)]
    assert _intrinsics.SYNCWARP_WARPS == 1  # (blocks of kernels calling syncwarp: one warp)


def _twin_bits():
    def kernel(patterns, floats, back, halves):
        i = cuda.grid(1)
        while i < patterns.shape[0]:
            floats[i] = _intrinsics.f32_from_bits(patterns[i])
            back[i] = _intrinsics.bits_from_f32(floats[i])
            halves[i] = _intrinsics.f16_to_f32(patterns[i])  # the low half only
            i += cuda.gridsize(1)

    # the simulator runs each thread in Python, so not all 2**16 halves: every exponent of
    # both signs with the mantissas at its edges and between, and random bits; the high
    # halves random, plus the float32 specials (infinities, NaNs, subnormals, zeros)
    rng = np.random.default_rng(70)
    mantissas = np.array([0, 1, 2, 0x155, 0x200, 0x2AA, 0x3FE, 0x3FF], np.uint32)
    edges = (np.arange(64, dtype=np.uint32)[:, None] << np.uint32(10)) | mantissas
    low = np.concatenate([edges.ravel(), rng.integers(0, 1 << 16, 512, dtype=np.uint32)])
    patterns = low | (rng.integers(0, 1 << 16, low.size, dtype=np.uint32) << np.uint32(16))
    specials = [
        0x7F800000,
        0xFF800000,
        0x7FC00000,
        0xFFC00001,
        0x7F800001,
        0x7FBFFFFF,
        0x00000001,
        0x807FFFFF,
        0x00800000,
        0x80000000,
        0x00000000,
        0x3F800000,
    ]
    patterns = np.concatenate([patterns, np.array(specials, np.uint32)])
    low = patterns & np.uint32(0xFFFF)
    floats, back = np.zeros(patterns.size, np.float32), np.zeros(patterns.size, np.uint32)
    halves = np.zeros(patterns.size, np.float32)
    cuda.jit(kernel)[2, 32](patterns, floats, back, halves)
    np.testing.assert_array_equal(floats.view(np.uint32), patterns)
    np.testing.assert_array_equal(back, patterns)
    expected = low.astype(np.uint16).view(np.float16).astype(np.float32)
    np.testing.assert_array_equal(halves.view(np.uint32), expected.view(np.uint32))


def _twin_scans():
    def kernel(values, out):
        tmp = cuda.shared.array(_intrinsics.TMP_WORDS, np.int64)
        i = cuda.threadIdx.x
        v = values[i]
        out[0, i] = _intrinsics.block_min_i64(v, tmp)
        out[1, i], out[2, i] = _intrinsics.block_exclusive_scan_i64(v, tmp)
        out[3, i], out[4, i] = _intrinsics.warp_exclusive_scan_i64(v, tmp)

    values = np.random.default_rng(71).integers(-50, 50, 64).astype(np.int64)
    out = np.zeros((5, 64), np.int64)
    cuda.jit(kernel)[1, 64](values, out)
    warps = values.reshape(2, 32)
    assert (out[0] == values.min()).all()
    np.testing.assert_array_equal(out[1], np.cumsum(values) - values)
    assert (out[2] == values.sum()).all()
    np.testing.assert_array_equal(out[3], (np.cumsum(warps, axis=1) - warps).reshape(-1))
    np.testing.assert_array_equal(out[4], np.repeat(warps.sum(axis=1), 32))


def _twin_butterfly():
    def kernel(values, out):
        tmp = cuda.shared.array(_intrinsics.TMP_WORDS, np.float32)
        i = cuda.threadIdx.x
        out[i] = _intrinsics.warp_sum_butterfly(values[i], tmp)

    rng = np.random.default_rng(72)
    values = (rng.standard_normal(64) * 10.0 ** rng.integers(-6, 8, 64)).astype(np.float32)
    out = np.zeros(64, np.float32)
    cuda.jit(kernel)[1, 64](values, out)
    lanes = values.reshape(2, 32)
    for off in (16, 8, 4, 2, 1):  # every lane adds lane ^ off, in this order
        lanes = lanes + lanes[:, np.arange(32) ^ off]
    np.testing.assert_array_equal(out.view(np.uint32), lanes.reshape(-1).view(np.uint32))
    in_order = [np.float32(0)] * 2
    for w in range(2):
        for v in values[32 * w : 32 * w + 32]:
            in_order[w] = np.float32(in_order[w] + v)
    assert lanes[:, 0].tolist() != in_order  # (the values tell the orders apart)


def _twin_device():
    @_intrinsics.device
    def affine(x, scale, shift):
        return x * scale + shift

    def kernel(out):
        i = cuda.threadIdx.x
        out[i] = affine(i, shift=1, scale=10)  # keywords, as on a GPU

    out = np.zeros(4, np.int64)
    cuda.jit(kernel)[1, 4](out)
    assert out.tolist() == [1, 11, 21, 31]


# every function of kernels._intrinsics, with the check of its simulator twin
TWIN_CHECKS = {
    "device": _twin_device,
    "ld16": _twin_words,
    "st16": _twin_words,
    "st16_streaming": _twin_words,
    "load_cg": _twin_loads,
    "read_volatile": _twin_loads,
    "atomic_add": _twin_atomics,
    "atomic_min": _twin_atomics,
    "syncwarp": _twin_warp_and_clock,
    "pause": _twin_warp_and_clock,
    "griddep_wait": _twin_warp_and_clock,
    "griddep_trigger": _twin_warp_and_clock,
    "f32_from_bits": _twin_bits,
    "bits_from_f32": _twin_bits,
    "f16_to_f32": _twin_bits,
    "block_min_i64": _twin_scans,
    "block_exclusive_scan_i64": _twin_scans,
    "warp_exclusive_scan_i64": _twin_scans,
    "warp_sum_butterfly": _twin_butterfly,
}


def test_every_intrinsic_has_a_twin_check():
    constants = {"SIM", "TMP_WORDS", "SYNCWARP_WARPS"}
    assert set(TWIN_CHECKS) == set(_intrinsics.__all__) - constants


@pytest.mark.parametrize("check", sorted(set(TWIN_CHECKS.values()), key=lambda f: f.__name__))
def test_simulator_twin(check):
    check()
