"""Every environment variable the package reads is checked once, with an error that names the
variable, what it accepts and what it got (moe_cpu's ``MOE_CPU_CACHE_BYTES``, moe_numba's
``MOE_NUMBA_C_LAUNCH``, the build switches of setup.py)."""

import os
import subprocess
import sys

import pytest

from moe_cpu._environment import parse_size
from moe_numba._environment import switch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize(
    "text,expected",
    [
        (None, 7),
        ("", 7),
        ("  ", 7),
        ("0", 0),
        ("4294967296", 4 << 30),
        ("4G", 4 << 30),
        ("4g", 4 << 30),
        ("4GiB", 4 << 30),
        ("4GB", 4 << 30),
        ("512M", 512 << 20),
        ("64k", 64 << 10),
        ("1T", 1 << 40),
        ("1.5G", 3 << 29),
        ("1e9", 10**9),
        (" 2 G ", 2 << 30),
        ("9223372036854775807", 2**63 - 1),
    ],
)
def test_sizes_people_write(text, expected):
    assert parse_size("MOE_CPU_CACHE_BYTES", text, 7) == expected


@pytest.mark.parametrize(
    "text", ["lots", "-1", "1.5", "1e30", "9223372036854775808", "4 X", "1.2.3", "G", "0x10"]
)
def test_a_bad_size_names_the_variable(text):
    with pytest.raises(ValueError) as info:
        parse_size("MOE_CPU_CACHE_BYTES", text, 7)
    message = str(info.value)
    assert message.startswith("MOE_CPU_CACHE_BYTES must be a byte count")
    assert "512M, 4G" in message and message.endswith(f"got {text!r}")


def _python(code, **env):
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        timeout=120,
    )


@pytest.mark.parametrize("text,limit", [("4G", 4 << 30), ("1e9", 10**9), ("", 4 << 30)])
def test_the_cache_limit_reads_sizes(text, limit):
    done = _python(
        "import moe_cpu; print(moe_cpu.cache_info()['limit_bytes'])", MOE_CPU_CACHE_BYTES=text
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == limit


def test_a_bad_cache_limit_fails_the_first_cpu_call_with_its_name():
    code = (
        "import numpy as np, moe_numba\n"
        "x = np.zeros((2, 4), np.float32); r = np.zeros((2, 1), np.int32)\n"
        "moe_numba.moe_permute(x, None, r, np.ones((2, 1), np.float32), 1, [2], 1)\n"
    )
    done = _python(code, MOE_CPU_CACHE_BYTES="4 gigs")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError: MOE_CPU_CACHE_BYTES must be a byte count"), done.stderr
    assert last.endswith("got '4 gigs'")


@pytest.mark.parametrize(
    "text,expected",
    [
        (None, True),
        ("", True),
        ("1", True),
        ("On", True),
        (" yes ", True),
        ("0", False),
        ("false", False),
        ("OFF", False),
        ("no", False),
    ],
)
def test_switches(monkeypatch, text, expected):
    if text is None:
        monkeypatch.delenv("MOE_TEST_SWITCH", raising=False)
    else:
        monkeypatch.setenv("MOE_TEST_SWITCH", text)
    assert switch("MOE_TEST_SWITCH", True) is expected


@pytest.mark.parametrize("text", ["2", "maybe", "enabled"])
def test_a_bad_switch_names_the_variable(monkeypatch, text):
    monkeypatch.setenv("MOE_NUMBA_C_LAUNCH", text)
    from moe_numba.runtime import get_runtime

    with (
        pytest.raises(
            ValueError, match=f"^MOE_NUMBA_C_LAUNCH must be one of 1/true/yes/on .* got {text!r}$"
        ),
        get_runtime().use_driver(None),  # (the switch is read where a driver is chosen)
    ):
        pass


def test_a_bad_build_switch_stops_setup_py():
    pytest.importorskip("Cython", reason="setup.py needs Cython")
    done = subprocess.run(
        [sys.executable, "setup.py", "--version"],
        env={**os.environ, "MOE_CYTHON_DEBUG": "maybe"},
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        timeout=120,
    )
    assert done.returncode != 0
    assert "ValueError: MOE_CYTHON_DEBUG must be one of 1/true/yes/on" in done.stderr
