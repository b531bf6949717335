"""Compile every GPU kernel for sm_90 with its real signature, without a GPU.

The simulator runs kernels as Python and accepts code a GPU rejects; this compiles the
kernels that ``moe_numba.kernels`` launches (every word width, data type, flag and routing
index type) with numba's real CUDA target to PTX, and checks a few properties of the code:
16-byte vector accesses in the copies, no local-memory spills of the accumulators, no
multiply-add in the float path except the weighted combine's explicit fma.
Needs libNVVM + NVRTC (``pip install 'numba-cuda[cu13]'``) and NUMBA_ENABLE_CUDASIM unset/0.
"""

import os
import re
import subprocess
import sys
import types

import pytest
from numba import config

pytestmark = pytest.mark.ptx  # the real CUDA target (conftest skips it in the simulator)

real_target = pytest.mark.skipif(
    bool(config.ENABLE_CUDASIM), reason="the PTX check needs the real numba.cuda target"
)


@pytest.fixture(autouse=True)
def _no_driver(monkeypatch):
    if config.ENABLE_CUDASIM:
        return
    # device functions and intrinsics ask the (absent) driver for the current device's CC
    import numba.cuda.dispatcher as dispatcher

    monkeypatch.setattr(
        dispatcher, "get_current_device", lambda: types.SimpleNamespace(compute_capability=(9, 0))
    )


def _kernels():
    if config.ENABLE_CUDASIM:
        return []
    from moe_numba.kernels import _hold, permute, unpermute

    return permute.all_kernels() + unpermute.all_kernels() + _hold.kernels()


_ALL = _kernels()


def _compile(fn, sig, cc=(9, 0)):
    from numba import cuda

    try:
        return cuda.compile_ptx(fn, sig, cc=cc)[0]
    except Exception as error:  # no NVVM/NVRTC here
        if type(error).__name__ in ("DynamicLibNotFoundError", "NvvmSupportError"):
            pytest.skip(f"CUDA compiler libraries not installed: {error}")
        raise


def _body(ptx):
    return ptx[ptx.index(".entry") :]


@pytest.mark.skipif(not config.ENABLE_CUDASIM, reason="runs the checks below directly")
def test_in_a_process_without_the_simulator():
    """This session runs the simulator (tests/conftest.py turns it on where no GPU exists):
    run this file again in a child process with the real target."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]


@real_target
@pytest.mark.parametrize("name,fn,sig", _ALL, ids=[k[0] for k in _ALL])
def test_kernel_compiles(name, fn, sig):
    ptx = _body(_compile(fn, sig))
    assert ".local" not in ptx, f"{name} spills to local memory"
    if name.startswith("gather_h16"):  # output rows are streamed (written once)
        assert "ld.global.v2.u64" in ptx and "st.global.cs.v2.u64" in ptx
        assert "st.global.v2.u64" not in ptx
    if name.startswith("combine_w16"):
        assert "ld.global.v2.u64" in ptx and "st.global.v2.u64" in ptx
    if name.startswith("combine"):
        weighted = re.search(r"_d\d_(\d)", name).group(1) == "1"
        assert ("fma.rn.f32" in ptx) == weighted, "multiply-add outside the weighted combine"
        assert not re.search(r"\bmul(\.rn)?\.f32", ptx), "float multiply in the combine"
    if name == "hold":  # the flag is read again after every pause, not once before the loop
        assert re.search(r"nanosleep[^\n]*\n(.*\n)*?.*ld\.volatile\.global\.u32", ptx)


# every kernel of a call is launched as a programmatic dependent and waits before it needs
# the kernel ahead (the caller's, for the first); kernels followed by one of this package's
# let it start early; the bench's stream hold is neither
_WAITS = ("count", "scan", "count_scan", "gather", "init", "check", "combine")
_TRIGGERS = ("count", "scan", "count_scan", "check")


def _kind(name):
    """A kernel's name without its variant suffixes (``count_scan_i32`` -> ``count_scan``)."""
    if name.startswith(("count", "scan", "check")):
        return name.rsplit("_i", 1)[0]
    return name.split("_")[0]


_ONE_OF_EACH_KIND = list({_kind(k[0]): k for k in reversed(_ALL)}.values())


@real_target
@pytest.mark.parametrize("name,fn,sig", _ONE_OF_EACH_KIND, ids=[k[0] for k in _ONE_OF_EACH_KIND])
def test_dependent_launch_instructions_on_sm90_only(name, fn, sig):
    kind = _kind(name)
    sm90 = _body(_compile(fn, sig))
    assert ("griddepcontrol.wait" in sm90) == (kind in _WAITS)
    assert ("griddepcontrol.launch_dependents" in sm90) == (kind in _TRIGGERS)
    assert "griddepcontrol" not in _body(_compile(fn, sig, cc=(8, 0)))


@real_target
def test_every_launch_variant_is_listed():
    names = {k[0] for k in _ALL}
    assert len(names) == len(_ALL)
    assert "init" in names
    for ri in (32, 64):
        assert {f"count_i{ri}", f"scan_i{ri}", f"count_scan_i{ri}", f"check_i{ri}"} <= names
        assert sum(n.startswith("gather") and n.endswith(f"_i{ri}") for n in names) == 24
        assert sum(n.startswith("combine") and n.endswith(f"_i{ri}") for n in names) == 44
