"""Compile the GPU kernels to PTX with numba's real CUDA target, without a GPU, and check
properties of the code.

The simulator runs kernels as Python and accepts code a GPU rejects; this compiles the
kernels that ``moe_numba.kernels`` launches with their real signatures and checks: 16-byte
vector accesses in the copies (streaming stores in the gather), no local-memory spills, no
multiply-add in the float path except the weighted combine's explicit fma, the dependent
launch instructions on sm_90 only, and the instruction behind each real intrinsic of
``kernels._intrinsics`` (their simulator twins: tests/test_cuda_kernels.py).

By default one variant of each kind is compiled; ``MOE_PTX_ALL=1`` compiles every variant
the host can launch (``tox -e ptx``). The CUDA compiler libraries (NVVM, NVRTC) must be
installed: ``pip install -e '.[test]'`` brings them; without them these tests fail.
"""

import os
import re
import types

import pytest
from numba import config

pytestmark = pytest.mark.ptx  # the real CUDA target (conftest skips it in the simulator)

if config.ENABLE_CUDASIM:
    pytest.skip(
        "compiles PTX with numba's real CUDA target, which NUMBA_ENABLE_CUDASIM=1 replaces",
        allow_module_level=True,
    )

from numba import cuda  # noqa: E402
from numba.cuda import types as nb  # noqa: E402

from benchmarks import hold as _hold  # noqa: E402
from moe_numba import abi, kernels  # noqa: E402
from moe_numba._errors import MISSING_TOOLKIT_ERRORS  # noqa: E402
from moe_numba.kernels import _intrinsics as ix  # noqa: E402
from moe_numba.kernels._family import INT, ptr  # noqa: E402
from moe_numba.kernels.combine import CombineKey  # noqa: E402
from moe_numba.kernels.scatter import ScatterKey  # noqa: E402
from moe_numba.kernels.sort_chunks import CopyKey  # noqa: E402

FAMILIES = (*kernels.families(), _hold.HOLD)
ALL = os.environ.get("MOE_PTX_ALL") == "1"


def _one_of_each_kind():
    """Each family's first variant (16-byte words where there are words), the weighted
    combine and scatter, whose fma the checks tell apart from the plain sum and copy, and a
    sort copy of 4-byte words."""
    chosen = [(family, family.variants()[0]) for family in FAMILIES]
    by_name = {family.name: family for family in FAMILIES}
    chosen.append((by_name["combine"], CombineKey(16, abi.DATA_BFLOAT16, True, True, 64)))
    chosen.append((by_name["scatter"], ScatterKey(16, abi.DATA_BFLOAT16, True, True, 8, 64)))
    chosen.append((by_name["sort_copy"], CopyKey(4)))  # (no 16-byte accesses in narrower copies)
    return chosen


ONE_OF_EACH_KIND = _one_of_each_kind()
VARIANTS = [(f, k) for f in FAMILIES for k in f.variants()] if ALL else ONE_OF_EACH_KIND


def _ids(variants):
    return [family.variant_name(key) for family, key in variants]


@pytest.fixture(autouse=True)
def _no_driver(monkeypatch):
    # device functions and intrinsics ask the (absent) driver for the current device's CC
    import numba.cuda.dispatcher as dispatcher

    monkeypatch.setattr(
        dispatcher, "get_current_device", lambda: types.SimpleNamespace(compute_capability=(9, 0))
    )


def _compile(fn, signature, cc, compile_ptx=cuda.compile_ptx):
    try:
        return compile_ptx(fn, signature, cc=cc)[0]
    except Exception as error:
        if type(error).__name__ not in MISSING_TOOLKIT_ERRORS:
            raise
        pytest.fail(
            f"cannot compile PTX: the CUDA compiler libraries are missing ({error}); "
            "pip install -e '.[test]' in the moe-numba checkout brings them (NVVM, NVRTC)",
            pytrace=False,
        )


_PTX = {}


def _kernel_ptx(family, key, cc=(9, 0)):
    """The PTX of a variant's kernel (from ``.entry`` on), compiled once per session."""
    ptx = _PTX.get((family.name, key, cc))
    if ptx is None:
        ptx = _compile(family.body(key), family.signature(key), cc)
        ptx = _PTX[(family.name, key, cc)] = ptx[ptx.index(".entry") :]
    return ptx


@pytest.mark.parametrize("family,key", VARIANTS, ids=_ids(VARIANTS))
def test_kernel_compiles(family, key):
    ptx = _kernel_ptx(family, key)
    assert ".local" not in ptx, f"{family.variant_name(key)} spills to local memory"
    assert ".func" not in ptx and "call.uni" not in ptx, "a device function was not inlined"
    if family.name == "gather" and key.hidden_word == 16:  # streamed rows
        assert "ld.global.v2.u64" in ptx and "st.global.cs.v2.u64" in ptx
        assert "st.global.v2.u64" not in ptx
    if family.name in ("combine", "combine_counted"):
        if key.word == 16:
            assert "ld.global.v2.u64" in ptx and "st.global.v2.u64" in ptx
        assert ("fma.rn.f32" in ptx) == key.weighted, "multiply-add outside the weighted combine"
        assert not re.search(r"\bmul(\.rn)?\.f32", ptx), "float multiply in the combine"
    if family.name == "sort_copy":
        vector = "ld.global.v2.u64" in ptx and "st.global.v2.u64" in ptx
        assert vector == (key.word == 16), "16-byte words exactly where the key says"
    if family.name == "scatter":
        if key.word == 16:  # dXu rows are streamed
            assert "ld.global.v2.u64" in ptx and "st.global.cs.v2.u64" in ptx
            assert "st.global.v2.u64" not in ptx
        # weighted: one product per element; dot: the dot product's fma, its lanes added by
        # xor shuffles; the copy has no float arithmetic but the g terms' adds
        assert ("fma.rn.f32" in ptx) == key.dot, "multiply-add outside the dot product"
        assert bool(re.search(r"\bmul(\.rn)?\.f32", ptx)) == key.weighted
        assert ("shfl.sync.bfly.b32" in ptx) == key.dot
        assert "ld.global.cg" in ptx  # the owner words, from L2
    if family.name in ("claim", "collide"):
        assert not re.search(r"\.f32\b", ptx), "float arithmetic in the owner stage"
    if family.name == "hold":  # the flag is read again after every pause, not once before the loop
        assert re.search(r"nanosleep[^\n]*\n(.*\n)*?.*ld\.volatile\.global\.u32", ptx)


# every kernel of a call is launched as a programmatic dependent and waits before it needs
# the kernel ahead (the caller's, for the first); kernels followed by one of this package's
# let it start early; the bench's stream hold is neither
_WAITS = {"count", "scan", "count_scan", "gather", "init", "check", "combine"}
_WAITS |= {"sort_plan", "sort_copy", "combine_counted", "claim", "collide", "scatter"}
_TRIGGERS = {"count", "scan", "count_scan", "check", "claim", "collide"}


@pytest.mark.parametrize("family,key", ONE_OF_EACH_KIND, ids=_ids(ONE_OF_EACH_KIND))
def test_dependent_launch_instructions_on_sm90_only(family, key):
    sm90 = _kernel_ptx(family, key)
    assert ("griddepcontrol.wait" in sm90) == (family.name in _WAITS)
    assert ("griddepcontrol.launch_dependents" in sm90) == (family.name in _TRIGGERS)
    assert "griddepcontrol" not in _kernel_ptx(family, key, cc=(8, 0))


def test_a_missing_compiler_fails_and_says_what_to_install():
    class NvvmSupportError(Exception):
        pass

    def compile_ptx(*args, **kwargs):
        raise NvvmSupportError("libNVVM cannot be found")

    with pytest.raises(
        pytest.fail.Exception,
        match=r"CUDA compiler libraries are missing \(libNVVM cannot be found\); "
        r"pip install -e '\.\[test\]' in the moe-numba checkout",
    ):
        _compile(lambda: None, nb.void(), (9, 0), compile_ptx)


# ---------------------------------------------------------------------------------------
# the real versions of kernels._intrinsics: a small kernel each, and the instruction


def _words(src, dst, i):
    lo, hi = ix.ld16(src, i)
    ix.st16(dst, i, lo, hi)
    ix.st16_streaming(dst, i + 1, hi, lo)


def _loads(src, flag, out, i):
    out[i] = ix.load_cg(src, i) + ix.read_volatile(flag)


def _atomics(words, out, i):
    out[0] = ix.atomic_add(words, i, 1) + ix.atomic_min(words, i + 1, 5)


def _warp_and_clock(src, out, i):
    ix.griddep_wait()
    out[i] = src[i]
    ix.syncwarp()
    ix.pause()
    ix.griddep_trigger()


def _from_bits(src, out, i):
    out[i] = ix.f32_from_bits(src[i] + 1) + ix.f16_to_f32(src[i + 1])


def _to_bits(src, out, i):
    out[i] = ix.bits_from_f32(src[i] + 1) + 1


_TMP_WORDS = ix.TMP_WORDS  # (a module attribute is no compile-time constant to numba)


def _scans(src, out, i):
    tmp = cuda.shared.array(_TMP_WORDS, nb.int64)
    a = ix.block_min_i64(src[i], tmp)
    b, c = ix.block_exclusive_scan_i64(src[i + 1], tmp)
    d, e = ix.warp_exclusive_scan_i64(src[i + 2], tmp)
    out[i] = a + b + c + d + e


@ix.device
def _twice(x):
    return 2 * x


def _butterfly(src, out, i):
    out[i] = ix.warp_sum_butterfly(src[i], cuda.shared.array(_TMP_WORDS, nb.float32))


def _device(src, out, i):
    out[i] = _twice(src[i])


_U64, _I64, _I32, _U32 = ptr(nb.uint64), ptr(nb.int64), ptr(nb.int32), ptr(nb.uint32)
_F32 = ptr(nb.float32)
_CONVERSION = r"cvt\.\w+\.f32\.[su]32|cvt\.\w+\.[su]32\.f32"  # (a bit cast is none)

# name -> (probe, its pointer parameters, a pattern of the instruction it must emit)
REAL_INSTRUCTIONS = {
    "device": (_device, (_I64, _I64), r"st\.global\.u64"),  # inlined: no call (checked below)
    "ld16": (_words, (_U64, _U64), r"ld\.global\.v2\.u64"),
    "st16": (_words, (_U64, _U64), r"st\.global\.v2\.u64"),
    "st16_streaming": (_words, (_U64, _U64), r"st\.global\.cs\.v2\.u64"),
    "load_cg": (_loads, (_I64, _I32, _I64), r"ld\.global\.cg\.[bu]64"),
    "read_volatile": (_loads, (_I64, _I32, _I64), r"ld\.volatile\.global\.u32"),
    "atomic_add": (_atomics, (_I64, _I64), r"atom\.global\.add\.u64"),
    "atomic_min": (_atomics, (_I64, _I64), r"atom\.global\.min\.s64"),
    "syncwarp": (_warp_and_clock, (_I64, _I64), r"bar\.warp\.sync\s+-1"),
    "pause": (_warp_and_clock, (_I64, _I64), r"nanosleep\.u32"),
    "griddep_wait": (_warp_and_clock, (_I64, _I64), r"griddepcontrol\.wait"),
    "griddep_trigger": (_warp_and_clock, (_I64, _I64), r"griddepcontrol\.launch_dependents"),
    "f32_from_bits": (_from_bits, (_U32, _F32), r"mov\.b32\s+%f\d+, %r\d+"),
    "bits_from_f32": (_to_bits, (_F32, _U32), r"mov\.b32\s+%r\d+, %f\d+"),
    "f16_to_f32": (_from_bits, (_U32, _F32), r"cvt\.f32\.f16"),
    "block_min_i64": (_scans, (_I64, _I64), r"shfl\.sync\.down\.b32"),
    "block_exclusive_scan_i64": (_scans, (_I64, _I64), r"shfl\.sync\.up\.b32"),
    "warp_exclusive_scan_i64": (_scans, (_I64, _I64), r"shfl\.sync\.idx\.b32"),
    "warp_sum_butterfly": (_butterfly, (_F32, _F32), r"shfl\.sync\.bfly\.b32"),
}


def test_every_intrinsic_is_checked():
    assert set(REAL_INSTRUCTIONS) == set(ix.__all__) - {"SIM", "TMP_WORDS", "SYNCWARP_WARPS"}


@pytest.mark.parametrize("name", sorted(REAL_INSTRUCTIONS))
def test_real_intrinsic(name):
    probe, pointers, pattern = REAL_INSTRUCTIONS[name]
    ptx = _compile(probe, nb.void(*pointers, INT), (9, 0))
    ptx = ptx[ptx.index(".entry") :]
    assert re.search(pattern, ptx), f"{name}: no {pattern} in its probe's PTX"
    assert ".func" not in ptx and "call.uni" not in ptx and ".local" not in ptx
    if name in ("f32_from_bits", "bits_from_f32"):
        assert not re.search(_CONVERSION, ptx), f"{name} converts instead of reinterpreting"
