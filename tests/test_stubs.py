"""The type stubs of the compiled modules (moe_cpu's, moe_numba's C launcher and replays) match the
modules: ``mypy.stubtest`` imports each extension and compares every name, parameter (name,
kind, default) and constant with its stub."""

import os
import site
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import moe_cpu
import moe_numba

# Module attributes that Cython generates and that no stub declares: the doctest table of every
# module, and the table of C functions that other extensions cimport.
CYTHON_INTERNALS = [
    r"moe_cpu\._\w+\.__test__",
    r"moe_cpu\._\w+\.__pyx_capi__",
]
# and of a module with a cdef class: its pickling helpers
C_LAUNCHER_INTERNALS = [
    r"moe_numba\.runtime\._driver_c\.__test__",
    r"moe_numba\.runtime\._driver_c\.__reduce_cython__",
    r"moe_numba\.runtime\._driver_c\.__setstate_cython__",
]


def _stubtest(tmp_path, *modules, allow=CYTHON_INTERNALS):
    allowlist = tmp_path / "allowlist.txt"
    allowlist.write_text("\n".join(allow) + "\n")
    # mypy finds an installed package in site-packages (PEP 561: py.typed), but cannot follow
    # the import hook of an editable install: point it, and stubtest's own import of the
    # modules, at the moe_cpu that this process imported
    root = Path(moe_cpu.__file__).resolve().parent.parent
    installed = root in {Path(p).resolve() for p in site.getsitepackages()}
    env = dict(os.environ)
    if not installed:
        env.update(MYPYPATH=str(root), PYTHONPATH=str(root))
    return subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "--allowlist", str(allowlist), *modules],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_stubs_match_the_extensions(tmp_path):
    done = _stubtest(tmp_path, "moe_cpu")
    assert done.returncode == 0, done.stdout + done.stderr
    # a stub for every extension, and stubtest saw them all
    package = Path(moe_cpu.__file__).parent
    extensions = {
        p.name.split(".")[0] for suffix in EXTENSION_SUFFIXES for p in package.glob(f"_*{suffix}")
    }
    stubs = {p.stem for p in package.glob("_*.pyi")}
    assert extensions and extensions == stubs
    sources = {p.stem for p in package.glob("_*.py")} - {"__init__"}  # pure Python
    assert f"in {len(stubs) + len(sources) + 1} modules" in done.stdout, done.stdout


def test_the_c_launcher_stub_matches_it(tmp_path):
    done = _stubtest(tmp_path, "moe_numba.runtime._driver_c", allow=C_LAUNCHER_INTERNALS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "in 1 module" in done.stdout, done.stdout


def test_the_replays_stub_matches_them(tmp_path):
    allow = [
        r"moe_numba\.torch\._replay_c\.__test__",
        r"moe_numba\.torch\._replay_c\.\w+\.__reduce_cython__",
        r"moe_numba\.torch\._replay_c\.\w+\.__setstate_cython__",
    ]
    done = _stubtest(tmp_path, "moe_numba.torch._replay_c", allow=allow)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "in 1 module" in done.stdout, done.stdout


def test_packages_are_typed():
    for package in (moe_numba, moe_cpu):
        assert (Path(package.__file__).parent / "py.typed").is_file(), package.__name__
